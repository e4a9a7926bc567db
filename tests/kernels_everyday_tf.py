"""TensorFlow's side of tests/kernels_everyday.rs: what stock TensorFlow computes for the
everyday ops tessera added (Pad, PadV2, MirrorPad, MirrorPadGrad, Cumsum, Cumprod, TopKV2,
InTopKV2, DivNoNan, CheckNumerics, CheckNumericsV2) on seeded inputs, printed as one JSON line:

- `kernels`: each op on inputs of every dtype its CPU kernel takes, with its outputs;
- `grads`: the tf.GradientTape gradient of each differentiable op (float32 and float64) for
  a seeded output gradient;
- `errors`: TensorFlow's status code and message for bad inputs, by case name (the Rust side
  holds the same cases and the messages it expects);
- `graph`: a TensorFlow 1 graph (tf.pad in every mode, cumsum, cumprod, top_k, in_top_k,
  divide_no_nan, check_numerics, and tf.gradients through them) as GraphDef bytes, with its
  feeds and the values of its fetches.

    python3 tests/kernels_everyday_tf.py

Only plain CPU kernels are used (no oneDNN-only behaviour). Non-finite floats are written as
the strings "nan", "inf" and "-inf" (JSON has no such numbers).
"""
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

rng = np.random.default_rng(20261201)
FLOATS = [np.float32, np.float64]
NUMBERS = [np.float32, np.float64, np.int32, np.int64]


def value(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, float) and not np.isfinite(v):
        return "nan" if np.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def tensor(a):
    a = np.asarray(a)
    return dict(dtype=a.dtype.name if a.dtype.kind != "O" else "string", shape=list(a.shape),
                values=[value(v) for v in a.ravel().tolist()])


def sample(shape, dtype, low=-3, high=3):
    """Values with ties for the integer dtypes and a few for the float ones."""
    if np.dtype(dtype).kind == "i":
        return rng.integers(low, high + 1, shape).astype(dtype)
    a = rng.uniform(low, high, shape)
    a.ravel()[::5] = np.round(a.ravel()[::5])  # repeated values
    return a.astype(dtype)


def run(op, inputs, attrs):
    out = getattr(tf.raw_ops, op)(**dict(inputs), **attrs)
    return [np.asarray(o) for o in (out if isinstance(out, (tuple, list)) else [out])]


def attrs_json(attrs):
    return {k: (v.name if isinstance(v, tf.DType) else v) for k, v in attrs.items()}


def kernel(op, inputs, **attrs):
    return dict(op=op, attrs=attrs_json(attrs), inputs=[tensor(v) for _, v in inputs],
                outputs=[tensor(o) for o in run(op, inputs, attrs)])


def kernels():
    cases = []
    for dtype in NUMBERS + [np.bool_]:
        x = sample([2, 3], dtype) if dtype != np.bool_ else rng.integers(0, 2, [2, 3]) == 1
        for pt in [np.int32, np.int64]:
            cases.append(kernel("Pad", [("input", x),
                                        ("paddings", np.array([[1, 2], [0, 3]], pt))]))
        for mode, p in [("REFLECT", [[1, 1], [2, 2]]), ("SYMMETRIC", [[2, 0], [3, 1]])]:
            cases.append(kernel("MirrorPad", [("input", x), ("paddings", np.array(p, np.int32))],
                                mode=mode))
    strings = np.array([[b"a", b"bc"], [b"", b"d"]], dtype=object)
    cases.append(kernel("Pad", [("input", strings), ("paddings", np.array([[0, 1], [1, 0]]))]))
    cases.append(kernel("MirrorPad", [("input", strings), ("paddings", np.array([[1, 1], [0, 1]]))],
                        mode="REFLECT"))
    for dtype in NUMBERS:
        x3 = sample([2, 3, 4], dtype)
        cases.append(kernel("Pad", [("input", x3), ("paddings", np.array([[0, 1], [2, 0], [1, 1]]))]))
        cases.append(kernel("PadV2", [("input", x3), ("paddings", np.array([[1, 0], [0, 0], [2, 3]])),
                                      ("constant_values", np.array(7, dtype))]))
        cases.append(kernel("Pad", [("input", np.array(5, dtype)),
                                    ("paddings", np.zeros([0, 2], np.int32))]))
        cases.append(kernel("Pad", [("input", np.zeros([0, 3], dtype)),
                                    ("paddings", np.array([[1, 0], [1, 1]]))]))
        for mode, p in [("REFLECT", [[1, 0], [2, 1], [3, 3]]), ("SYMMETRIC", [[2, 2], [0, 3], [4, 1]])]:
            cases.append(kernel("MirrorPad", [("input", x3), ("paddings", np.array(p, np.int64))],
                                mode=mode))
            grad_in = sample([2 + sum(p[0]), 3 + sum(p[1]), 4 + sum(p[2])], dtype)
            cases.append(kernel("MirrorPadGrad", [("input", grad_in),
                                                  ("paddings", np.array(p, np.int32))], mode=mode))
        x4 = sample([2, 1, 3, 2], dtype)
        cases.append(kernel("MirrorPad", [("input", x4),
                                          ("paddings", np.array([[1, 1], [0, 0], [2, 2], [1, 0]]))],
                            mode="REFLECT"))
        for op in ["Cumsum", "Cumprod"]:
            x = sample([3, 4, 5], dtype, -2, 2)
            for exclusive in [False, True]:
                for reverse in [False, True]:
                    for axis, at in [(0, np.int32), (-1, np.int64), (1, np.int32)]:
                        cases.append(kernel(op, [("x", x), ("axis", np.array(axis, at))],
                                            exclusive=exclusive, reverse=reverse))
        x = sample([4, 9], dtype, -3, 3)
        for k in [0, 1, 3, 5, 9]:
            for sorted_ in [True, False]:
                cases.append(kernel("TopKV2", [("input", x), ("k", np.array(k, np.int32))],
                                    sorted=sorted_))
        cases.append(kernel("TopKV2", [("input", sample([2, 3, 7], dtype)),
                                       ("k", np.array(4, np.int64))],
                            sorted=False, index_type=tf.int64))
    for dtype in FLOATS:
        x, y = sample([3, 4], dtype), sample([4], dtype)
        y[1] = 0
        cases.append(kernel("DivNoNan", [("x", x), ("y", y)]))
        x = np.array([1, np.nan, np.inf, -np.inf, 0, 2], dtype)
        y = np.array([0, 0, 0, 0, 0, np.nan], dtype)
        cases.append(kernel("DivNoNan", [("x", x), ("y", y)]))
        for op in ["CheckNumerics", "CheckNumericsV2"]:
            cases.append(kernel(op, [("tensor", sample([2, 3], dtype))], message="fine"))
    predictions = np.array([[1, 2, 2, 3], [0.5, 0.5, 0.5, 0.5], [1, np.nan, 2, 3],
                            [1, 2, np.inf, 3], [4, 3, 2, 1]], np.float32)
    for tt in [np.int32, np.int64]:
        for k in [-1, 0, 1, 2, 4, 5]:
            targets = np.array([1, 3, 0, 3, 7], tt)
            cases.append(kernel("InTopKV2", [("predictions", predictions), ("targets", targets),
                                             ("k", np.array(k, tt))]))
        targets = np.array([2, 2, 1, 0, -1], tt)
        cases.append(kernel("InTopKV2", [("predictions", predictions), ("targets", targets),
                                         ("k", np.array(2, tt))]))
    return cases


def grad(op, xs, consts, output=0, **attrs):
    """The gradients of `op` with respect to the inputs named in `xs` for a seeded dy."""
    with tf.GradientTape() as tape:
        watched = {k: tf.constant(v) for k, v in xs}
        for w in watched.values():
            tape.watch(w)
        args = {**watched, **{k: tf.constant(v) for k, v in consts}}
        out = getattr(tf.raw_ops, op)(**args, **attrs)
        y = out[output] if isinstance(out, (tuple, list)) else out
    dy = sample(y.shape, y.dtype.as_numpy_dtype)
    grads = tape.gradient(y, list(watched.values()), output_gradients=tf.constant(dy))
    inputs = [(k, v) for k, v in xs] + list(consts)
    order = list(dict(inputs))
    return dict(op=op, attrs=attrs_json(attrs), output=output,
                inputs=[dict(name=k, differentiable=k in dict(xs), **tensor(v))
                        for k, v in sorted(inputs, key=lambda kv: order.index(kv[0]))],
                dy=tensor(dy), grads=[tensor(g) for g in grads])


def grads():
    cases = []
    for dtype in FLOATS:
        x = sample([3, 4], dtype)
        cases.append(grad("Pad", [("input", x)], [("paddings", np.array([[1, 2], [0, 3]], np.int32))]))
        cases.append(grad("Pad", [("input", sample([2, 3, 2], dtype))],
                          [("paddings", np.array([[0, 1], [2, 0], [1, 1]], np.int64))]))
        cases.append(grad("PadV2", [("input", x)],
                          [("paddings", np.array([[2, 0], [1, 1]], np.int32)),
                           ("constant_values", np.array(-1, dtype))]))
        for mode, p in [("REFLECT", [[2, 1], [3, 3]]), ("SYMMETRIC", [[3, 1], [0, 4]])]:
            cases.append(grad("MirrorPad", [("input", x)], [("paddings", np.array(p, np.int32))],
                              mode=mode))
            padded = sample([3 + sum(p[0]), 4 + sum(p[1])], dtype)
            cases.append(grad("MirrorPadGrad", [("input", padded)],
                              [("paddings", np.array(p, np.int64))], mode=mode))
        for op in ["Cumsum", "Cumprod"]:
            x = rng.uniform(0.5, 1.5, [3, 4]).astype(dtype) * rng.choice([-1, 1], [3, 4])
            for exclusive in [False, True]:
                for reverse in [False, True]:
                    cases.append(grad(op, [("x", x)], [("axis", np.array(1, np.int32))],
                                      exclusive=exclusive, reverse=reverse))
            cases.append(grad(op, [("x", x)], [("axis", np.array(-2, np.int64))],
                              exclusive=True, reverse=False))
        for sorted_ in [True, False]:
            cases.append(grad("TopKV2", [("input", rng.permutation(24).reshape(2, 3, 4).astype(dtype))],
                              [("k", np.array(3, np.int32))], sorted=sorted_))
        y = sample([4], dtype)
        y[2] = 0
        cases.append(grad("DivNoNan", [("x", sample([3, 4], dtype)), ("y", y)], []))
        cases.append(grad("DivNoNan", [("x", sample([4], dtype)), ("y", sample([3, 1], dtype))], []))
        for op in ["CheckNumerics", "CheckNumericsV2"]:
            cases.append(grad(op, [("tensor", sample([2, 3], dtype))], [], message="x"))
    return cases


ERRORS = {
    # Each case: op, inputs, attrs; tests/kernels_everyday.rs holds the same ones by name.
    "pad_paddings_rows": ("Pad", [("input", np.zeros([2, 3], np.float32)),
                                  ("paddings", np.array([[1, 1]], np.int32))], {}),
    "pad_paddings_columns": ("Pad", [("input", np.zeros([2, 3], np.float32)),
                                     ("paddings", np.ones([2, 3], np.int32))], {}),
    "pad_negative": ("Pad", [("input", np.zeros([2, 3], np.float32)),
                             ("paddings", np.array([[1, -1], [0, 0]], np.int32))], {}),
    "pad_v2_constant_not_scalar": ("PadV2", [("input", np.zeros([2, 3], np.float32)),
                                             ("paddings", np.array([[1, 1], [0, 0]], np.int32)),
                                             ("constant_values", np.zeros([2], np.float32))], {}),
    "pad_rank_9": ("Pad", [("input", np.zeros([1] * 9, np.float32)),
                           ("paddings", np.zeros([9, 2], np.int32))], {}),
    "mirror_pad_reflect_too_large": ("MirrorPad", [("input", np.zeros([2, 3], np.float32)),
                                                   ("paddings", np.array([[2, 0], [0, 0]], np.int32))],
                                     {"mode": "REFLECT"}),
    "mirror_pad_symmetric_too_large": ("MirrorPad", [("input", np.zeros([2, 3], np.float32)),
                                                     ("paddings", np.array([[3, 0], [0, 0]], np.int32))],
                                       {"mode": "SYMMETRIC"}),
    "mirror_pad_negative": ("MirrorPad", [("input", np.zeros([2, 3], np.float32)),
                                          ("paddings", np.array([[-1, 0], [0, 0]], np.int32))],
                            {"mode": "SYMMETRIC"}),
    "mirror_pad_rows": ("MirrorPad", [("input", np.zeros([2, 3], np.float32)),
                                      ("paddings", np.array([[1, 0]], np.int32))],
                        {"mode": "SYMMETRIC"}),
    "mirror_pad_rank_6": ("MirrorPad", [("input", np.zeros([1] * 6, np.float32)),
                                        ("paddings", np.zeros([6, 2], np.int32))],
                          {"mode": "REFLECT"}),
    "mirror_pad_grad_total": ("MirrorPadGrad", [("input", np.zeros([2, 3], np.float32)),
                                                ("paddings", np.array([[2, 0], [0, 0]], np.int32))],
                              {"mode": "REFLECT"}),
    "mirror_pad_grad_reflect": ("MirrorPadGrad", [("input", np.zeros([2, 3], np.float32)),
                                                  ("paddings", np.array([[1, 0], [0, 0]], np.int32))],
                                {"mode": "REFLECT"}),
    "mirror_pad_grad_symmetric": ("MirrorPadGrad", [("input", np.zeros([4, 3], np.float32)),
                                                    ("paddings", np.array([[2, 1], [0, 0]], np.int32))],
                                  {"mode": "SYMMETRIC"}),
    "cumsum_axis_not_scalar": ("Cumsum", [("x", np.zeros([2, 3], np.float32)),
                                          ("axis", np.array([0], np.int32))], {}),
    "cumsum_axis_out_of_range": ("Cumsum", [("x", np.zeros([2, 3], np.float32)),
                                            ("axis", np.array(2, np.int32))], {}),
    "cumprod_negative_axis": ("Cumprod", [("x", np.zeros([2, 3], np.float32)),
                                          ("axis", np.array(-3, np.int64))], {}),
    "top_k_too_few_columns": ("TopKV2", [("input", np.zeros([2, 3], np.float32)),
                                         ("k", np.array(4, np.int32))], {}),
    "top_k_negative_k": ("TopKV2", [("input", np.zeros([2, 3], np.float32)),
                                    ("k", np.array(-1, np.int32))], {}),
    "top_k_k_not_scalar": ("TopKV2", [("input", np.zeros([2, 3], np.float32)),
                                      ("k", np.array([1], np.int32))], {}),
    "top_k_scalar_input": ("TopKV2", [("input", np.array(1, np.float32)),
                                      ("k", np.array(1, np.int32))], {}),
    "in_top_k_k_not_scalar": ("InTopKV2", [("predictions", np.zeros([2, 3], np.float32)),
                                           ("targets", np.array([0, 1], np.int32)),
                                           ("k", np.array([1], np.int32))], {}),
    "in_top_k_batch": ("InTopKV2", [("predictions", np.zeros([2, 3], np.float32)),
                                    ("targets", np.array([0, 1, 2], np.int32)),
                                    ("k", np.array(1, np.int32))], {}),
    "in_top_k_predictions_rank": ("InTopKV2", [("predictions", np.zeros([2], np.float32)),
                                               ("targets", np.array([0, 1], np.int32)),
                                               ("k", np.array(1, np.int32))], {}),
    "in_top_k_targets_rank": ("InTopKV2", [("predictions", np.zeros([2, 3], np.float32)),
                                           ("targets", np.array([[0, 1]], np.int32)),
                                           ("k", np.array(1, np.int32))], {}),
    "div_no_nan_shapes": ("DivNoNan", [("x", np.zeros([2, 3], np.float32)),
                                       ("y", np.ones([2], np.float32))], {}),
}
for version in ["", "V2"]:
    for name, values in [("nan", [np.nan]), ("inf", [np.inf]), ("neg_inf", [-np.inf]),
                         ("nan_inf", [np.nan, np.inf]), ("nan_neg_inf", [np.nan, -np.inf]),
                         ("infs", [np.inf, -np.inf]), ("all", [np.nan, np.inf, -np.inf])]:
        ERRORS[f"check_numerics{version.lower()}_{name}"] = (
            "CheckNumerics" + version,
            [("tensor", np.array([1.0] + values, np.float64))], {"message": "x went bad"})


def errors():
    out = {}
    for name, (op, inputs, attrs) in ERRORS.items():
        try:
            run(op, inputs, attrs)
            out[name] = dict(code="OK", message="")
        except tf.errors.OpError as e:
            message = e.message.split("\n")[0]
            if message.startswith("{{function_node"):
                message = message.split("}} ", 1)[1]
            message = message.split(" [Op:")[0]
            code = type(e).__name__.removesuffix("Error")
            out[name] = dict(code=code, message=message)
    return out


def graph():
    """A TensorFlow 1 graph using the ops, and tf.gradients through them (TopKV2's gradient
    uses ScatterNd, which tessera does not run, so the loss takes top_k's values no further)."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [3, 5], name="x")
        d = tf.compat.v1.placeholder(tf.float32, [5], name="d")
        labels = tf.compat.v1.placeholder(tf.int64, [3], name="labels")
        outs = dict(
            pad=tf.pad(x, [[1, 0], [2, 1]]),
            pad_v2=tf.pad(x, [[0, 1], [1, 1]], constant_values=0.5),
            reflect=tf.pad(x, [[1, 1], [2, 2]], mode="REFLECT"),
            symmetric=tf.pad(x, [[2, 0], [0, 3]], mode="SYMMETRIC"),
            cumsum=tf.math.cumsum(x, axis=1, exclusive=True),
            cumprod=tf.math.cumprod(x, axis=0, reverse=True),
            div_no_nan=tf.math.divide_no_nan(x, d),
            checked=tf.debugging.check_numerics(x, "x is bad"),
            checked_v2=tf.raw_ops.CheckNumericsV2(tensor=x * 2.0, message="2x is bad"),
        )
        values, indices = tf.math.top_k(x, k=2)
        hits = tf.math.in_top_k(labels, x, 2)
        loss = tf.add_n([tf.reduce_sum(o * rng.uniform(-1, 1, o.shape).astype(np.float32))
                         for o in outs.values()])
        gx, gd = tf.gradients(loss, [x, d])
        fetches = dict(outs, top_k_values=values, top_k_indices=indices, in_top_k=hits,
                       loss=loss, grad_x=gx, grad_d=gd)
    xv = sample([3, 5], np.float32)
    xv[1, 2] = 0.0
    dv = sample([5], np.float32)
    dv[3] = 0.0
    feeds = {"x:0": xv, "d:0": dv, "labels:0": np.array([0, 4, 2], np.int64)}
    with tf.compat.v1.Session(graph=g) as s:
        got = s.run(fetches, {g.get_tensor_by_name(k): v for k, v in feeds.items()})
    return dict(graph_def=g.as_graph_def().SerializeToString().hex(),
                feeds={k: tensor(v) for k, v in feeds.items()},
                fetches={k: t.name for k, t in fetches.items()},
                values={k: tensor(v) for k, v in got.items()})


def main():
    print(json.dumps(dict(kernels=kernels(), grads=grads(), errors=errors(), graph=graph())))


if __name__ == "__main__":
    main()
