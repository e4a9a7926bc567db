"""TensorFlow's side of tests/kernels_linalg.rs: what stock TensorFlow 2.21 computes for
Einsum, MatrixInverse and HistogramFixedWidth on seeded inputs, their gradients, and a
graph calling tf.switch_case (a Case op), printed as one JSON line.

    python3 tests/kernels_linalg_tf.py

Inputs are printed with the outputs, so the Rust side runs its kernels on exactly these.
Tensors are {"dtype", "shape", "values"} with floats as the bits of their float64 value. A
case that TensorFlow refuses carries its error's code and message instead of an output; the
gradient cases carry tf.GradientTape's gradients of sum(weights * op(inputs)).
"""
import json
import os
import re
import struct

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

rng = np.random.default_rng(20261128)
CODES = {
    tf.errors.InvalidArgumentError: "INVALID_ARGUMENT",
    tf.errors.UnimplementedError: "UNIMPLEMENTED",
    tf.errors.NotFoundError: "NOT_FOUND",
}


def bits(x):
    return struct.unpack("<Q", struct.pack("<d", float(x)))[0]


def encode(a):
    a = np.asarray(a)
    if a.dtype.kind == "f":
        values = [bits(v) for v in a.astype(np.float64).ravel()]
    else:
        values = a.ravel().tolist()
    return dict(dtype=a.dtype.name, shape=list(a.shape), values=values)


def tf_message(e):
    m = e.message
    m = re.sub(r"^\{\{function_node [^}]*\}\} ", "", m)
    m = re.sub(r" \[Op:\w+\]( name: .*)?$", "", m, flags=re.S)
    return m.split("\n\t; NodeDef:")[0]


def run(name, op, inputs, call, attrs):
    out = dict(name=name, op=op, inputs=[encode(x) for x in inputs], attrs=attrs)
    try:
        out["output"] = encode(call().numpy())
    except tf.errors.OpError as e:
        out["error"] = dict(code=CODES[type(e)], message=tf_message(e))
    return out


def einsum(name, equation, *inputs):
    inputs = [np.asarray(x) for x in inputs]
    attrs = dict(equation=dict(s=equation), N=dict(i=len(inputs)),
                 T=dict(type=inputs[0].dtype.name))
    return run(name, "Einsum", inputs,
               lambda: tf.raw_ops.Einsum(inputs=[tf.constant(x) for x in inputs],
                                         equation=equation), attrs)


def inverse(name, x, adjoint=False):
    x = np.asarray(x)
    attrs = dict(adjoint=dict(b=adjoint), T=dict(type=x.dtype.name))
    return run(name, "MatrixInverse", [x],
               lambda: tf.raw_ops.MatrixInverse(input=x, adjoint=adjoint), attrs)


def histogram(name, values, value_range, nbins, dtype=np.int32):
    values, value_range, nbins = (np.asarray(values), np.asarray(value_range),
                                  np.asarray(nbins, np.int32))
    attrs = dict(T=dict(type=values.dtype.name), dtype=dict(type=np.dtype(dtype).name))
    return run(name, "HistogramFixedWidth", [values, value_range, nbins],
               lambda: tf.raw_ops.HistogramFixedWidth(
                   values=values, value_range=value_range, nbins=nbins,
                   dtype=tf.as_dtype(dtype)), attrs)


def u(*shape, dtype=np.float32):
    if np.dtype(dtype).kind == "f":
        return rng.uniform(-1, 1, shape).astype(dtype)
    return rng.integers(-20, 20, shape).astype(dtype)


def einsum_cases():
    f64 = np.float64
    return [
        einsum("matmul", "ij,jk->ik", u(3, 4), u(4, 5)),
        einsum("batched matmul", "bij,bjk->bik", u(2, 3, 4, dtype=f64), u(2, 4, 5, dtype=f64)),
        einsum("ellipsis broadcast", "...ij,...jk->...ik", u(2, 1, 3, 4), u(5, 4, 2)),
        einsum("ellipsis of different ranks", "...i,...i->...", u(3, 4, 5), u(4, 5)),
        einsum("ellipsis in the middle", "a...b,b->...a", u(2, 3, 4, 5), u(5)),
        einsum("unary ellipsis moved", "i...->...i", u(2, 3, 4)),
        einsum("transpose int32", "ij->ji", u(3, 5, dtype=np.int32)),
        einsum("int64 product", "ij,jk->ik", u(3, 4, dtype=np.int64), u(4, 2, dtype=np.int64)),
        einsum("trace", "ii->", u(4, 4)),
        einsum("diagonal", "ii->i", u(5, 5, dtype=f64)),
        einsum("batch diagonal", "bii->bi", u(3, 4, 4)),
        einsum("diagonal into a matrix", "i->ii", u(4)),
        einsum("sum over two axes", "ijk->j", u(3, 4, 5)),
        einsum("outer product", "i,j->ij", u(3), u(4)),
        einsum("dot product", "i,i->", u(7, dtype=f64), u(7, dtype=f64)),
        einsum("multi-axis contraction", "abcd,dcbe->ae", u(2, 3, 4, 5), u(5, 4, 3, 6)),
        einsum("label summed in one input", "abc,cd->ad", u(2, 3, 4), u(4, 5)),
        einsum("diagonal of one input", "iij,jk->ik", u(3, 3, 4), u(4, 2)),
        einsum("batch and diagonal", "bii,bi->b", u(2, 3, 3), u(2, 3)),
        einsum("output order", "ij,jk->ki", u(3, 4), u(4, 5)),
        einsum("uppercase labels", "iJ->Ji", u(2, 3)),
        einsum("empty rows", "ij,jk->ik", u(0, 3), u(3, 2)),
        einsum("empty contraction", "ij,jk->ik", u(2, 0), u(0, 3)),
        einsum("large, over the pool", "ij,jk->ik", u(64, 128), u(128, 96)),
        einsum("scalar output of scalars", "->", np.float32(3.0)),
        einsum("no arrow", "ij,jk", u(2, 3), u(3, 2)),
        einsum("three subscripts", "ij,jk,kl->il", u(2, 3), u(3, 2)),
        einsum("inputs fewer than subscripts", "ij,jk->ik", u(2, 3)),
        einsum("rank mismatch", "ijk->ij", u(2, 3)),
        einsum("rank below the ellipsis' labels", "ijk...->ij", u(2, 3)),
        einsum("dimension mismatch", "ij,jk->ik", u(2, 3), u(2, 3)),
        einsum("diagonal of a non-square", "ii->i", u(2, 3)),
        einsum("ellipsis not broadcastable", "...ij,...jk->...ik", u(2, 1, 3), u(4, 3, 5)),
        einsum("output without the ellipsis", "...ij->ij", u(2, 3, 4)),
    ]


def well_conditioned(*shape, dtype=np.float32):
    n = shape[-1]
    return (rng.uniform(-1, 1, shape) + n * np.eye(n)).astype(dtype)


def inverse_cases():
    f64 = np.float64
    return [
        inverse("float32 4x4", well_conditioned(4, 4)),
        inverse("float64 batch", well_conditioned(3, 5, 5, dtype=f64)),
        inverse("adjoint", well_conditioned(2, 4, 4, dtype=f64), adjoint=True),
        inverse("pivoting needed", np.array([[0, 1, 2], [1, 0, 3], [4, -3, 8]], np.float64)),
        inverse("random, not dominant", rng.uniform(-1, 1, (6, 6))),
        inverse("1x1", np.array([[4.0]], np.float32)),
        inverse("empty", np.zeros((0, 0), np.float32)),
        inverse("empty batch", np.zeros((2, 0, 0), np.float64)),
        inverse("large", well_conditioned(48, 48, dtype=f64)),
        inverse("singular", np.array([[1, 2], [2, 4]], np.float32)),
        inverse("zeros", np.zeros((3, 3), np.float64)),
        inverse("one singular in a batch", np.stack([np.eye(2), np.zeros((2, 2))])),
        inverse("not square", u(2, 3)),
        inverse("a vector", u(3)),
    ]


def histogram_cases():
    v = np.array([-1.0, 0.0, 0.9, 1.0, 1.5, 2.0, 4.999, 5.0, 7.0, np.inf, -np.inf], np.float32)
    r = np.array([0.0, 5.0], np.float32)
    return [
        histogram("float32 with outliers", v, r, 5),
        histogram("float64 random", rng.normal(0, 2, 1000), np.array([-3.0, 3.0]), 12),
        histogram("int32", np.array([3, 7, 100, -5, 0, 9, 10], np.int32),
                  np.array([0, 10], np.int32), 3),
        histogram("int64 counted as int64", rng.integers(-50, 150, 200),
                  np.array([0, 100], np.int64), 7, np.int64),
        histogram("one bin", v[:8], r, 1),
        histogram("2-D values", rng.uniform(0, 1, (20, 30)).astype(np.float32),
                  np.array([0.0, 1.0], np.float32), 10),
        histogram("no values", np.zeros([0], np.float32), r, 4),
        histogram("many values", rng.uniform(-1, 11, 100000), np.array([0.0, 10.0]), 100),
        histogram("no bins", v, r, 0),
        histogram("negative bins", v, r, -3),
        histogram("empty range", v, np.array([5.0, 5.0], np.float32), 3),
        histogram("reversed range", v, np.array([5.0, 1.0], np.float32), 3),
        histogram("range of three", v, np.array([0.0, 5.0, 6.0], np.float32), 3),
        histogram("range a matrix", v, np.array([[0.0, 5.0]], np.float32), 3),
        histogram("nbins a vector", v, r, [3]),
        histogram("NaN", np.array([1.0, np.nan], np.float32), r, 3),
    ]


def gradient(name, op, inputs, wrt, **attrs):
    tensors = [tf.constant(x) for x in inputs]
    with tf.GradientTape() as tape:
        for i in wrt:
            tape.watch(tensors[i])
        if op == "Einsum":
            y = tf.raw_ops.Einsum(inputs=tensors, equation=attrs["equation"])
        else:
            y = tf.raw_ops.MatrixInverse(input=tensors[0], adjoint=attrs["adjoint"])
        w = tf.constant(rng.uniform(-1, 1, y.shape).astype(y.dtype.as_numpy_dtype))
        loss = tf.reduce_sum(y * w)
    grads = tape.gradient(loss, [tensors[i] for i in wrt])
    return dict(name=name, op=op, inputs=[encode(x) for x in inputs], wrt=wrt,
                attrs={k: v for k, v in attrs.items()}, weights=encode(w.numpy()),
                grads=[encode(tf.convert_to_tensor(g).numpy()) for g in grads])


def gradients():
    f64 = np.float64
    e = lambda eq, *x: gradient(eq, "Einsum", [np.asarray(v) for v in x],  # noqa: E731
                                list(range(len(x))), equation=eq)
    return [
        e("ij,jk->ik", u(3, 4, dtype=f64), u(4, 5, dtype=f64)),
        e("bij,bjk->bik", u(2, 3, 4, dtype=f64), u(2, 4, 5, dtype=f64)),
        e("...ij,...jk->...ik", u(2, 1, 3, 4, dtype=f64), u(5, 4, 2, dtype=f64)),
        e("...i,...i->...", u(3, 4, 5, dtype=f64), u(4, 5, dtype=f64)),
        e("abc,cd->ad", u(2, 3, 4, dtype=f64), u(4, 5, dtype=f64)),
        e("iij,jk->ik", u(3, 3, 4, dtype=f64), u(4, 2, dtype=f64)),
        e("i,j->ij", u(3), u(4)),
        e("ij->ji", u(3, 4, dtype=f64)),
        e("ijk->j", u(3, 4, 5, dtype=f64)),
        e("ijk->kj", u(3, 4, 5, dtype=f64)),
        e("ii->i", u(4, 4, dtype=f64)),
        e("ii->", u(4, 4, dtype=f64)),
        gradient("inverse", "MatrixInverse", [well_conditioned(4, 4, dtype=f64)], [0],
                 adjoint=False),
        gradient("inverse, adjoint, batched", "MatrixInverse",
                 [well_conditioned(2, 3, 3, dtype=f64)], [0], adjoint=True),
        gradient("inverse float32", "MatrixInverse", [well_conditioned(3, 3)], [0],
                 adjoint=False),
    ]


def case_graph():
    """A v1 graph whose output is tf.switch_case over three branches (a Case op and its
    branches in the library), with TensorFlow's outputs for indices in and out of range."""
    g = tf.Graph()
    with g.as_default():
        index = tf.compat.v1.placeholder(tf.int32, [], name="index")
        x = tf.compat.v1.placeholder(tf.float32, [3], name="x")
        out = tf.switch_case(index, [lambda: x * 2.0, lambda: x + 10.0,
                                     lambda: tf.reduce_sum(x) - x])
        out = tf.identity(out, name="out")
    ops = sorted({n.op for n in g.as_graph_def().node})
    xs = np.array([1.0, -2.0, 0.5], np.float32)
    runs = []
    with tf.compat.v1.Session(graph=g) as s:
        for i in [0, 1, 2, 3, 7, -1]:
            runs.append(dict(index=i, out=encode(s.run(out, {index: i, x: xs}))))
    return dict(graph=g.as_graph_def().SerializeToString().hex(),
                ops=ops, x=encode(xs), runs=runs)


def main():
    cases = einsum_cases() + inverse_cases() + histogram_cases()
    print(json.dumps(dict(cases=cases, gradients=gradients(), case=case_graph())))


if __name__ == "__main__":
    main()
