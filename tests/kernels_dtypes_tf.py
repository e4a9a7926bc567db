"""TensorFlow's side of tests/kernels_dtypes.rs: what stock TensorFlow 2.21 makes of the dtypes
tessera added for issue #33 (uint8, int8, int16, uint16, uint32, uint64, float16, bfloat16,
complex64), printed as one JSON line.

    python3 tests/kernels_dtypes_tf.py            # the reference values
    python3 tests/kernels_dtypes_tf.py wire HOST:PORT
        # a TensorFlow 1 client session on grpc://HOST:PORT feeds a uint8 and a bfloat16
        # tensor, fetches casts of them, and prints them beside a local session's

Tensors are {"dtype", "shape", "hex"}: the dtype as TensorFlow's Python names it and the
elements' little-endian bytes, so every bit (NaN payloads aside) crosses exactly.
Casts run on tensors of at most 4 elements: TensorFlow's vectorized loop converts
out-of-range floats to narrow integers differently from its element-by-element loop, and
tensors this small take the latter.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.framework import tensor_pb2  # noqa: E402

rng = np.random.default_rng(20260433)

NEW = ["uint8", "int8", "int16", "uint16", "uint32", "uint64", "float16", "bfloat16",
       "complex64"]
ALL = NEW + ["float32", "float64", "int32", "int64", "bool"]


def np_dtype(name):
    return tf.as_dtype(name).as_numpy_dtype


def enc(a, name=None):
    a = np.asarray(a)
    name = name or tf.as_dtype(a.dtype).name
    return dict(dtype=name, shape=list(a.shape), hex=a.tobytes().hex())


FLOATS = [np.nan, np.inf, -np.inf, -0.0, 0.5, -1.5, 2.5, 300.0, -1.0, -129.0, 255.9, 65504.0,
          65519.0, 65520.0, 1e10, -3e9, 5e9, 1e19, 2e19, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8,
          3.3e38, 1e-8]
INTS = [0, 1, -1, 127, -128, 255, 256, 300, 65535, 65520, 2 ** 31 - 1, -2 ** 31, 2 ** 40 + 1,
        2 ** 63 - 1, -2 ** 63, 16777217]


def source_values(name):
    """Edge values of dtype `name`, wrapped or rounded into it as numpy does."""
    if name == "bool":
        return np.array([True, False, True], dtype=bool)
    if name == "complex64":
        return np.array([1 + 2j, -3.5 + 0.5j, 1j, complex(np.nan, 0), 300.7 - 1j, -0.0],
                        dtype=np.complex64)
    if name in ("float16", "bfloat16", "float32", "float64"):
        with np.errstate(over="ignore"):
            return np.array(FLOATS, dtype=np.float64).astype(np_dtype(name))
    values = INTS + ([2 ** 64 - 1, 2 ** 63] if name == "uint64" else [])
    as_int = [v if v < 2 ** 63 else v - 2 ** 64 for v in values]
    return np.array(as_int, dtype=np.int64).astype(np_dtype(name))


def casts():
    out = []
    for src in ALL:
        x = source_values(src)
        for dst in ALL:
            if dst == src:
                continue
            for i in range(0, len(x), 4):
                chunk = x[i:i + 4]
                try:
                    y = tf.cast(tf.constant(chunk, dtype=src), dst).numpy()
                except (tf.errors.OpError, TypeError, ValueError):
                    continue
                out.append(dict(x=enc(chunk, src), y=enc(y, dst)))
    # bfloat16 by truncation.
    x = np.array([1.0 + 3 * 2.0 ** -8, -1.0 - 2.0 ** -8 - 2.0 ** -12, 3.0e38, np.nan],
                 dtype=np.float32)
    y = tf.raw_ops.Cast(x=x, DstT=tf.bfloat16, Truncate=True).numpy()
    out.append(dict(x=enc(x), y=enc(y, "bfloat16"), truncate=True))
    return out


def protos():
    """Each new dtype's values as make_tensor_proto writes them (tensor_content) and in the
    typed field TensorFlow reads for the dtype, checked by TensorFlow's own reader."""
    out = []
    for name in NEW:
        if name == "complex64":
            a = np.array([[1 + 2j, -3.5 + 0.25j, 0j]], dtype=np.complex64)
        elif name in ("float16", "bfloat16"):
            a = np.array([[1.0, -2.5, 65504.0 if name == "float16" else 3e38],
                          [-0.0, np.inf, 1e-3]]).astype(np_dtype(name))
        else:
            info = np.iinfo(np_dtype(name))
            a = np.array([[info.min, info.max, 7], [0, 1, info.max // 3]],
                         dtype=np_dtype(name))
        content = tf.make_tensor_proto(a)
        typed = tensor_pb2.TensorProto(dtype=tf.as_dtype(name).as_datatype_enum)
        typed.tensor_shape.CopyFrom(content.tensor_shape)
        flat = a.ravel()
        if name in ("float16", "bfloat16"):
            typed.half_val.extend(int(v) for v in flat.view(np.uint16))
        elif name == "uint32":
            typed.uint32_val.extend(int(v) for v in flat)
        elif name == "uint64":
            typed.uint64_val.extend(int(v) for v in flat)
        elif name == "complex64":
            for v in flat:
                typed.scomplex_val.extend([float(v.real), float(v.imag)])
        else:
            typed.int_val.extend(int(v) for v in flat)
        # What tessera writes: every element in tensor_content (make_tensor_proto itself
        # writes uint16 in int_val).
        raw = tensor_pb2.TensorProto(dtype=typed.dtype, tensor_content=a.tobytes())
        raw.tensor_shape.CopyFrom(content.tensor_shape)
        for proto in (content, typed, raw):
            back = tf.make_ndarray(proto)
            assert back.dtype == a.dtype and back.tobytes() == a.tobytes(), name
        out.append(dict(values=enc(a, name), content=content.SerializeToString().hex(),
                        typed=typed.SerializeToString().hex(),
                        raw=raw.SerializeToString().hex()))
    return out


def values_of(name, shape, positive=False):
    if name in ("float16", "bfloat16"):
        v = rng.normal(0, 4, size=shape)
        if positive:
            v = np.abs(v) + 0.5
        return v.astype(np_dtype(name))
    info = np.iinfo(np_dtype(name))
    lo, hi = (1, min(info.max, 100)) if positive else (max(info.min, -100), min(info.max, 100))
    return rng.integers(lo, hi, size=shape, endpoint=True).astype(np_dtype(name))


BINARY = ["AddV2", "Sub", "Mul", "Maximum", "Minimum", "FloorDiv", "FloorMod", "RealDiv",
          "Less", "LessEqual", "Greater", "GreaterEqual", "Equal", "NotEqual"]
UNARY = ["Neg", "Abs", "Square", "Sign"]
FLOAT_UNARY = ["Sqrt", "Exp", "Tanh", "Sigmoid", "Relu", "Softmax", "Floor", "Reciprocal"]
REDUCE = ["Sum", "Mean", "Max", "Min", "Prod"]


def run(op, inputs, **attrs):
    fn = getattr(tf.raw_ops, op)
    names = dict(Sqrt=["x"], Exp=["x"], Tanh=["x"], Sigmoid=["x"], Relu=["features"],
                 Softmax=["logits"], Floor=["x"], Reciprocal=["x"], BiasAdd=["value", "bias"],
                 MatMul=["a", "b"])
    keys = names.get(op, ["x", "y"])
    if op in REDUCE:
        keys = ["input", "axis"]
    if op == "ArgMax":
        keys = ["input", "dimension"]
    return fn(**dict(zip(keys, inputs)), **attrs).numpy()


def ops():
    out = []
    for name in ["uint8", "int8", "int16", "uint16", "uint32", "float16", "bfloat16"]:
        cases = []
        for op in BINARY:
            divides = op in ("FloorDiv", "FloorMod", "RealDiv")
            x = values_of(name, [2, 3])
            y = values_of(name, [3], positive=divides)
            cases.append((op, [x, y], {}))
        for op in UNARY:
            cases.append((op, [values_of(name, [2, 3])], {}))
        if name in ("float16", "bfloat16"):
            for op in FLOAT_UNARY:
                cases.append((op, [values_of(name, [2, 3], positive=op == "Sqrt")], {}))
            cases.append(("BiasAdd", [values_of(name, [2, 3]), values_of(name, [3])], {}))
        for op in REDUCE:
            x = values_of(name, [2, 5], positive=op == "Prod")
            cases.append((op, [x, np.array([1], np.int32)], dict(keep_dims=False)))
        cases.append(("ArgMax", [values_of(name, [2, 5]), np.array(1, np.int32)],
                      dict(output_type=tf.int64)))
        for op, inputs, attrs in cases:
            case = dict(op=op, dtype=name, inputs=[enc(i) for i in inputs],
                        attrs={k: (v.name if isinstance(v, tf.DType) else v)
                               for k, v in attrs.items()})
            try:
                case["out"] = enc(run(op, inputs, **attrs))
            except tf.errors.OpError as e:
                case["error"] = type(e).__name__
            out.append(case)
    return out


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "wire":
        return wire(sys.argv[2])
    image = rng.integers(0, 255, size=[2, 4, 4, 3], endpoint=True).astype(np.uint8)
    scaled = (tf.cast(image, tf.float32) / 255.0).numpy()
    a = rng.normal(0, 1, size=[3, 5]).astype(np.float16)
    b = rng.normal(0, 1, size=[5, 4]).astype(np.float16)
    product = tf.linalg.matmul(a, b).numpy()
    print(json.dumps(dict(
        tensorflow=tf.__version__,
        protos=protos(),
        casts=casts(),
        ops=ops(),
        image=dict(x=enc(image), y=enc(scaled)),
        matmul=dict(a=enc(a), b=enc(b), y=enc(product)),
    )))


def wire(target):
    """A TensorFlow 1 client feeds uint8 pixels and bfloat16 values to a tessera task and
    fetches casts of them (and the bfloat16 tensor itself); the same graph on TensorFlow's own
    session gives the reference."""
    tf.compat.v1.disable_eager_execution()
    graph = tf.Graph()
    with graph.as_default():
        pixels = tf.compat.v1.placeholder(tf.uint8, [None, 3], name="pixels")
        halves = tf.compat.v1.placeholder(tf.bfloat16, [None], name="halves")
        # A product, not a quotient: TensorFlow's own session would rewrite x / 255 into
        # x * (1 / 255) (grappler), one ulp away from the quotient tessera computes.
        scaled = tf.cast(pixels, tf.float32) * (1.0 / 255.0)
        widened = tf.cast(halves, tf.float32)
        rounded = tf.cast(widened * 3.0, tf.bfloat16)
        back = tf.cast(scaled * 255.0, tf.uint8)
    feeds = {
        pixels: np.array([[0, 1, 255], [128, 7, 200]], dtype=np.uint8),
        halves: np.array([1.0, -2.5, 1.0 + 2.0 ** -7, 3e38, np.inf],
                         dtype=tf.bfloat16.as_numpy_dtype),
    }
    fetches = [scaled, widened, rounded, back, halves]
    results = {}
    for where, session_target in [("tessera", "grpc://" + target), ("tensorflow", "")]:
        with tf.compat.v1.Session(session_target, graph=graph) as session:
            got = session.run(fetches, feed_dict=feeds)
        results[where] = [enc(g) for g in got]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
