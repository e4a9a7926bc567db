"""TensorFlow's side of tests/kernels_feature_columns.rs: what stock TensorFlow computes for the
ops of feature columns (StringToHashBucketFast, StringToHashBucketStrong, Bucketize,
SparseToDense) and for GatherNd and ScatterNd, on seeded inputs, printed as one JSON line.

    python3 tests/kernels_feature_columns_tf.py

Inputs are printed with the outputs, so the Rust side runs its kernels on exactly these.
Tensors are {"dtype", "shape", "values"} with floats as the bits of their float64 value (so
that NaN, infinities and every last bit cross JSON exactly) and strings as hex. A case that
TensorFlow refuses carries its error's code and message instead of an output; the gradient
cases carry tf.GradientTape's gradients of sum(weights * op(inputs)).
"""
import json
import os
import re
import struct

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

rng = np.random.default_rng(20261201)

# Each op's input names, and which type attr each input sets.
SIGNATURES = {
    "StringToHashBucketFast": (["input"], [None]),
    "StringToHashBucketStrong": (["input"], [None]),
    "Bucketize": (["input"], ["T"]),
    "GatherNd": (["params", "indices"], ["Tparams", "Tindices"]),
    "ScatterNd": (["indices", "updates", "shape"], ["Tindices", "T", None]),
    "SparseToDense": (["sparse_indices", "output_shape", "sparse_values", "default_value"],
                      ["Tindices", None, "T", None]),
}
CODES = {
    tf.errors.InvalidArgumentError: "INVALID_ARGUMENT",
    tf.errors.ResourceExhaustedError: "RESOURCE_EXHAUSTED",
    tf.errors.UnimplementedError: "UNIMPLEMENTED",
    tf.errors.NotFoundError: "NOT_FOUND",
}


def bits(x):
    return struct.unpack("<Q", struct.pack("<d", float(x)))[0]


def dtype_name(a):
    return "string" if a.dtype.kind in "SO" else a.dtype.name


def encode(a):
    a = np.asarray(a)
    if a.dtype.kind in "SO":
        values = [bytes(v).hex() for v in a.ravel()]
    elif a.dtype.kind == "f":
        values = [bits(v) for v in a.astype(np.float64).ravel()]
    else:
        values = a.ravel().tolist()
    return dict(dtype=dtype_name(a), shape=list(a.shape), values=values)


def encode_attr(v):
    if isinstance(v, bool):
        return dict(b=v)
    if isinstance(v, int):
        return dict(i=v)
    if isinstance(v, str):
        return dict(s=v)
    if isinstance(v, list) and all(isinstance(x, int) for x in v):
        return dict(list_i=v)
    return dict(list_f=[bits(np.float32(x)) for x in v])


def tf_message(e):
    """The kernel's own words: without the function prefix, the `[Op:...]` suffix and the
    node name TensorFlow's GatherNd appends (tessera names the node in front)."""
    m = e.message
    m = re.sub(r"^\{\{function_node [^}]*\}\} ", "", m)
    m = re.sub(r" \[Op:\w+\]( name: .*)?$", "", m, flags=re.S)
    m = re.sub(r", node name: \w+$", "", m)
    return m.split("\n\t; NodeDef:")[0]


def case(name, op, inputs, **attrs):
    names, types = SIGNATURES[op]
    inputs = [np.asarray(x) for x in inputs]
    out = dict(name=name, op=op, inputs=[encode(x) for x in inputs],
               attrs={k: encode_attr(v) for k, v in attrs.items()})
    for t, x in zip(types, inputs):
        if t is not None:
            out["attrs"][t] = dict(type=dtype_name(x))
    try:
        args = {n: tf.constant(x) for n, x in zip(names, inputs)}
        y = getattr(tf.raw_ops, op)(**args, **attrs)
        out["output"] = encode(y.numpy())
    except tf.errors.OpError as e:
        out["error"] = dict(code=CODES[type(e)], message=tf_message(e))
    return out


def strings():
    """About 190 strings of every length class farmhash treats apart (0, 1-3, 4-7, 8-16,
    17-32, 33-64, over 64 and its 64-byte block edges), random bytes and UTF-8 text."""
    out = [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in range(0, 130)]
    for n in [127, 128, 129, 191, 192, 193, 255, 256, 257, 300, 511, 1000, 4099]:
        out.append(bytes(rng.integers(0, 256, n, dtype=np.uint8)))
    for n in list(range(1, 70, 3)) + [100, 150, 200]:
        out.append(bytes(rng.integers(32, 127, n, dtype=np.uint8)))
    words = ["", "a", "b", "ab", "user_123", "country=DE", "naïve", "café au lait",
             "日本語のテキスト", "Ünïcödé strings 🙂", "emoji 🙂🙃😀 and more emoji 🎉🎊",
             "Ελληνικά κείμενα για δοκιμή", "русский текст для проверки хеша",
             "مرحبا بالعالم", "한국어 문자열", "x" * 65, "ü" * 40, "😀" * 33]
    out += [w.encode("utf-8") for w in words]
    out += [b"\x00", b"\x00" * 17, b"\xff" * 64, b"\xff" * 65]
    return out


def hashes():
    s = strings()
    t = tf.constant(s)
    fast = [dict(num_buckets=n, buckets=tf.strings.to_hash_bucket_fast(t, n).numpy().tolist())
            for n in [1, 2, 10, 1000, 2**31 - 1, 2**62, 2**63 - 1]]
    strong = []
    for key in [[0, 0], [1, 2], [-1, 2**63 - 1], [0x0706050403020100, 0x0F0E0D0C0B0A0908]]:
        for n in [1000, 2**62, 2**63 - 1]:
            b = tf.raw_ops.StringToHashBucketStrong(input=t, num_buckets=n, key=key)
            strong.append(dict(num_buckets=n, key=key, buckets=b.numpy().tolist()))
    return dict(strings=[x.hex() for x in s], fast=fast, strong=strong)


def around(values, dtype):
    """Each value and its float neighbours in `dtype`."""
    out = []
    for v in values:
        v = dtype(v)
        out += [np.nextafter(v, dtype(-np.inf)), v, np.nextafter(v, dtype(np.inf))]
    return np.array(out, dtype)


def bucketize_cases():
    b = [-1e6, -3.5, -1.0, 0.0, 0.1, 0.5, 1.0, 2.5, 100.0, 1e6]
    b32 = [float(np.float32(x)) for x in b]
    special = [np.nan, np.inf, -np.inf, -0.0, 0.1, 1e-40, -1e30, 1e30]
    x32 = np.concatenate([around(b32, np.float32), np.array(special, np.float32),
                          rng.uniform(-5, 5, 40).astype(np.float32)])
    x64 = np.concatenate([around(b32, np.float64), np.array(special, np.float64),
                          rng.uniform(-5, 5, 40)])
    ib = [-1e6, -3.0, 0.0, 100.0, 16777216.0, 2147483647.0]
    i32 = np.array([-1000001, -1000000, -999999, -4, -3, -2, -1, 0, 1, 99, 100, 101,
                    16777215, 16777216, 16777217, 16777219, 2**31 - 1, -2**31], np.int32)
    i64b = ib + [9.007199254740992e15, 9.223372036854775807e18]
    i64 = np.array(list(i32) + [2**53 - 1, 2**53, 2**53 + 1, 2**62, 2**63 - 1, -2**63,
                                9007199254740993, 2**31], np.int64)
    return [
        case("float32 around the boundaries", "Bucketize", [x32], boundaries=b32),
        case("float64 around the boundaries", "Bucketize", [x64], boundaries=b32),
        case("int32 around the boundaries", "Bucketize", [i32], boundaries=ib),
        case("int64 around the boundaries", "Bucketize", [i64], boundaries=i64b),
        case("2-D input", "Bucketize", [x32[:24].reshape(4, 6)], boundaries=b32),
        case("no boundaries", "Bucketize", [x32[:5]], boundaries=[]),
        case("repeated boundaries", "Bucketize", [np.array([0, 1, 2], np.float32)],
             boundaries=[1.0, 1.0, 1.0]),
        case("unsorted boundaries", "Bucketize", [np.array([0.5], np.float32)],
             boundaries=[2.0, 1.0]),
    ]


def uniform(shape, dtype):
    if np.dtype(dtype).kind == "f":
        return rng.uniform(-1, 1, shape).astype(dtype)
    return rng.integers(-1000, 1000, shape).astype(dtype)


def rows(count, dims, dtype, bad=None):
    """`count` index rows into the leading `dims` (each in range), row `bad[0]` set to
    `bad[1]` when given."""
    r = np.stack([rng.integers(0, d, count) for d in dims], axis=-1).astype(dtype)
    if bad is not None:
        r[bad[0]] = bad[1]
    return r


def gather_nd_cases():
    i32, i64 = np.int32, np.int64
    p = uniform([5, 4, 3], np.float32)
    return [
        case("float32 rows of depth 2", "GatherNd", [p, rows(6, [5, 4], i32)]),
        case("float64 elements", "GatherNd", [uniform([4, 3], np.float64),
                                              rows(6, [4, 3], i64).reshape(2, 3, 2)]),
        case("int32 slices of depth 1, repeated", "GatherNd",
             [uniform([3, 4, 5], np.int32), np.array([[2], [0], [2], [1]], i32)]),
        case("int64 vector", "GatherNd", [uniform([6], np.int64), rows(5, [6], i64)]),
        case("depth 0 takes all", "GatherNd", [uniform([2, 3], np.float32),
                                               np.zeros([3, 0], i32)]),
        case("depth 4", "GatherNd", [uniform([2, 2, 2, 3], np.float32),
                                     rows(2, [2, 2, 2, 3], i32)]),
        case("vector indices", "GatherNd", [uniform([3, 4], np.float32), np.array([1, 2], i32)]),
        case("strings", "GatherNd", [np.array([[b"a", b"bb"], [b"ccc", b""]]),
                                      np.array([[1, 0], [0, 1]], i32)]),
        case("bool", "GatherNd", [np.array([[True, False], [False, True]]),
                                   np.array([[1], [0]], i64)]),
        case("large, split over the pool", "GatherNd",
             [uniform([100, 32], np.float32), rows(2000, [100], i32)]),
        case("no rows", "GatherNd", [p, np.zeros([0, 2], i32)]),
        case("empty params, no rows", "GatherNd", [np.zeros([0, 4], np.float32),
                                                   np.zeros([0, 1], i32)]),
        case("IGNORE reads zeros", "GatherNd", [uniform([2, 2], np.float32),
                                                 np.array([[1, 0], [5, 0]], i32)],
             bad_indices_policy="IGNORE"),
        case("index out of range", "GatherNd", [p, rows(4, [5, 4], i32, bad=(2, [5, 0]))]),
        case("negative index in 3-D indices", "GatherNd",
             [p, rows(4, [5, 4], i64, bad=(3, [1, -1])).reshape(2, 2, 2)]),
        case("two bad indices name the last", "GatherNd",
             [uniform([3, 4], np.float32), np.array([[9, 0], [0, 1], [7, 0]], i32)]),
        case("bad vector index", "GatherNd", [uniform([3, 4], np.float32),
                                              np.array([0, 7], i32)]),
        case("scalar params", "GatherNd", [np.float32(1), np.zeros([2, 0], i32)]),
        case("scalar indices", "GatherNd", [np.ones([2], np.float32), np.int32(0)]),
        case("indices deeper than params", "GatherNd", [uniform([3, 4], np.float32),
                                                        np.zeros([1, 3], i32)]),
        case("rows from empty params", "GatherNd", [np.zeros([0, 4], np.float32),
                                                    np.zeros([1, 1], i32)]),
        case("depth 8", "GatherNd", [np.zeros([1] * 8, np.float32), np.zeros([1, 8], i32)]),
    ]


def scatter_nd_cases():
    i32, i64 = np.int32, np.int64
    v = lambda *s: np.array(s, i32)  # noqa: E731
    return [
        case("float32 rows, repeated", "ScatterNd",
             [np.array([[1], [3], [1], [0], [3], [1]], i32), uniform([6, 4], np.float32),
              v(5, 4)]),
        case("float64 elements", "ScatterNd", [rows(4, [3, 3], i64), uniform([4], np.float64),
                                               np.array([3, 3], i64)]),
        case("int32 blocks", "ScatterNd", [rows(5, [4], i32), uniform([5, 2, 2], np.int32),
                                           v(4, 2, 2)]),
        case("int64 elements, repeated", "ScatterNd",
             [np.array([[0, 1], [0, 1], [2, 2]], i64), uniform([3], np.int64),
              np.array([3, 4], i64)]),
        case("3-D indices", "ScatterNd", [rows(6, [4, 4], i32).reshape(2, 3, 2),
                                          uniform([2, 3, 5], np.float32), v(4, 4, 5)]),
        case("depth 6", "ScatterNd", [rows(3, [2] * 6, i32), uniform([3, 2], np.float32),
                                      v(2, 2, 2, 2, 2, 2, 2)]),
        case("no updates", "ScatterNd", [np.zeros([0, 1], i32), np.zeros([0], np.float32),
                                         v(5)]),
        case("large", "ScatterNd", [rows(1000, [200], i32), uniform([1000, 16], np.float32),
                                    v(200, 16)]),
        case("IGNORE drops updates", "ScatterNd", [np.array([[1], [9], [-1]], i32),
                                                   np.array([1, 2, 3], np.float32), v(3)],
             bad_indices_policy="IGNORE"),
        case("index out of range", "ScatterNd", [np.array([[1], [7]], i32),
                                                 np.array([1, 2], np.float32), v(5)]),
        case("two bad indices name the last", "ScatterNd",
             [np.array([[[1], [7]], [[0], [-1]]], i32), uniform([2, 2], np.float32), v(5)]),
        case("outer dims mismatched", "ScatterNd", [np.array([[1], [3]], i32),
                                                    np.array([1, 2, 3], np.float32), v(5)]),
        case("inner dims mismatched", "ScatterNd", [np.array([[1], [3]], i32),
                                                    np.zeros([2, 3], np.float32), v(5, 4)]),
        case("rank mismatched", "ScatterNd", [np.array([[1], [3]], i32),
                                              np.zeros([2, 3, 1], np.float32), v(5, 3)]),
        case("indices deeper than the shape", "ScatterNd",
             [np.zeros([2, 3], i32), np.ones([2], np.float32), v(3, 3)]),
        case("scalar updates", "ScatterNd", [np.array([[1]], i32), np.float32(1), v(3)]),
        case("scalar indices", "ScatterNd", [np.int32(1), np.ones([1], np.float32), v(5)]),
        case("negative dimension", "ScatterNd", [np.array([[1]], i32),
                                                 np.ones([1], np.float32), v(-1)]),
        case("scalar shape", "ScatterNd", [np.array([[1]], i32), np.ones([1], np.float32),
                                           np.int32(5)]),
        case("empty shape input", "ScatterNd", [np.array([[1]], i32),
                                                np.ones([1], np.float32), v()]),
        case("empty output", "ScatterNd", [np.array([[1]], i32), np.ones([1], np.float32),
                                           v(0)]),
        case("rank-0 output", "ScatterNd", [np.zeros([0, 0], i32), np.zeros([0], np.float32),
                                            v()]),
        case("depth 0", "ScatterNd", [np.zeros([0, 0], i32), np.zeros([0, 5], np.float32),
                                      v(5)]),
        case("vector indices", "ScatterNd", [np.array([2], i32), np.ones([1], np.float32),
                                             v(5, 1)]),
        case("vector indices, more updates", "ScatterNd",
             [np.array([2], i32), np.ones([3], np.float32), v(5, 3)]),
        case("depth 8", "ScatterNd", [np.zeros([1, 8], i32), np.ones([1], np.float32),
                                      v(*[1] * 8)]),
    ]


def sparse_to_dense_cases():
    i32, i64 = np.int32, np.int64
    f = lambda *x: np.array(x, np.float32)  # noqa: E731
    m = lambda *r: np.array(r, i32)  # noqa: E731
    return [
        case("matrix indices", "SparseToDense", [m([0, 1], [2, 0], [3, 2]), m(4, 3), f(5, 6, 7),
                                                 np.float32(-1)]),
        case("vector indices, int64", "SparseToDense",
             [np.array([1, 3, 4], i64), np.array([6], i64), np.array([7, 8, 9], i64),
              np.int64(0)]),
        case("scalar index and value", "SparseToDense", [np.int32(2), m(5), np.float64(5.5),
                                                         np.float64(-2)]),
        case("scalar value broadcast", "SparseToDense", [m([0, 1], [2, 0]), m(3, 2),
                                                         np.float32(7), np.float32(-1)]),
        case("3-D output", "SparseToDense", [m([0, 1, 2], [1, 0, 0]), m(2, 2, 3), f(4, 5),
                                             np.float32(3)]),
        case("strings", "SparseToDense", [m([0], [2]), m(3), np.array([b"a", b"b"]),
                                          np.bytes_(b"z")]),
        case("bool", "SparseToDense", [m([1], [2]), m(4), np.array([True, True]),
                                       np.bool_(False)]),
        case("no indices", "SparseToDense", [np.zeros([0, 2], i32), m(2, 2),
                                             np.zeros([0], np.float32), np.float32(3)]),
        case("depth 0", "SparseToDense", [np.zeros([1, 0], i32), np.zeros([0], i32), f(4),
                                          np.float32(3)]),
        case("unsorted, not validated", "SparseToDense", [m([2, 0], [0, 1]), m(3, 2), f(5, 6),
                                                          np.float32(-1)],
             validate_indices=False),
        case("repeated, not validated, last wins", "SparseToDense",
             [m([0, 1], [0, 1]), m(3, 2), f(5, 6), np.float32(-1)], validate_indices=False),
        case("unsorted", "SparseToDense", [m([2, 0], [0, 1]), m(3, 2), f(5, 6),
                                           np.float32(-1)]),
        case("unsorted in the last dimension", "SparseToDense",
             [m([0, 2], [0, 1]), m(2, 3), f(4, 5), np.float32(3)]),
        case("unsorted vector", "SparseToDense", [m(3, 1), m(5), f(5, 6), np.float32(0)]),
        case("repeated", "SparseToDense", [m([0, 1], [0, 1]), m(3, 2), f(5, 6),
                                           np.float32(-1)]),
        case("repeated at depth 0", "SparseToDense", [np.zeros([2, 0], i32),
                                                      np.zeros([0], i32), f(4, 5),
                                                      np.float32(3)]),
        case("out of bounds", "SparseToDense", [m([0, 1], [3, 1]), m(3, 2), f(5, 6),
                                                np.float32(-1)]),
        case("out of bounds and unsorted", "SparseToDense", [m([1, 2], [0, 9]), m(2, 3),
                                                             f(4, 5), np.float32(3)]),
        case("negative", "SparseToDense", [m([0, -1]), m(3, 2), f(5), np.float32(-1)]),
        case("out of bounds, not validated", "SparseToDense", [m([0, 1], [3, 1]), m(3, 2),
                                                               f(5, 6), np.float32(-1)],
             validate_indices=False),
        case("values of the wrong length", "SparseToDense", [m([0, 1], [2, 0]), m(3, 2),
                                                             f(7, 1, 2), np.float32(-1)]),
        case("values of rank 2", "SparseToDense", [m([0, 1]), m(2, 3), np.ones([1, 1],
                                                                                np.float32),
                                                   np.float32(3)]),
        case("shape of the wrong length", "SparseToDense", [m([0, 1], [2, 0]), m(3, 2, 1),
                                                            f(7, 1), np.float32(-1)]),
        case("default not a scalar", "SparseToDense", [m([0, 1], [2, 0]), m(3, 2), f(7, 1),
                                                       f(-1)]),
        case("indices of rank 3", "SparseToDense", [np.zeros([1, 1, 1], i32), m(3), f(7),
                                                    np.float32(-1)]),
        case("shape of rank 2", "SparseToDense", [m([0, 1]), np.array([[3, 2]], i32), f(7),
                                                  np.float32(-1)]),
        case("negative dimension", "SparseToDense", [m([0, 1]), m(-3, 2), f(7),
                                                     np.float32(-1)]),
    ]


def hash_error_cases():
    s = np.array([b"a", b"b"])
    return [
        case("a key of three", "StringToHashBucketStrong", [s], num_buckets=10, key=[1, 2, 3]),
        case("a key of one", "StringToHashBucketStrong", [s], num_buckets=10, key=[1]),
        case("no buckets", "StringToHashBucketFast", [s], num_buckets=0),
        case("strong, no buckets", "StringToHashBucketStrong", [s], num_buckets=0, key=[1, 2]),
        case("2-D fast", "StringToHashBucketFast", [s.reshape(2, 1)], num_buckets=7),
    ]


def gradient(name, op, inputs, wrt, **attrs):
    """tf.GradientTape's gradient of sum(weights * op(inputs)) for the inputs `wrt`."""
    names, _ = SIGNATURES[op]
    tensors = [tf.constant(x) for x in inputs]
    with tf.GradientTape() as tape:
        for i in wrt:
            tape.watch(tensors[i])
        y = getattr(tf.raw_ops, op)(**dict(zip(names, tensors)), **attrs)
        w = tf.constant(rng.uniform(-1, 1, y.shape).astype(y.dtype.as_numpy_dtype))
        loss = tf.reduce_sum(y * w)
    grads = tape.gradient(loss, [tensors[i] for i in wrt])
    return dict(name=name, op=op, inputs=[encode(x) for x in inputs], wrt=wrt,
                attrs={k: encode_attr(v) for k, v in attrs.items()}, weights=encode(w.numpy()),
                grads=[encode(tf.convert_to_tensor(g).numpy()) for g in grads])


def gradients():
    i32, i64 = np.int32, np.int64
    return [
        gradient("GatherNd depth 2, repeated rows", "GatherNd",
                 [uniform([4, 3, 2], np.float64), np.array([[1, 2], [0, 0], [1, 2], [3, 1],
                                                            [1, 2]], i32)], [0]),
        gradient("GatherNd [n, 1] indices (IndexedSlices in TensorFlow)", "GatherNd",
                 [uniform([5, 3], np.float32), np.array([[4], [0], [4]], i64)], [0]),
        gradient("GatherNd 3-D indices", "GatherNd",
                 [uniform([3, 4], np.float64), rows(6, [3, 4], i64).reshape(2, 3, 2)], [0]),
        gradient("ScatterNd rows, repeated", "ScatterNd",
                 [np.array([[1], [3], [1], [0]], i32), uniform([4, 2], np.float64),
                  np.array([5, 2], i32)], [1]),
        gradient("ScatterNd elements", "ScatterNd",
                 [rows(5, [3, 4], i64), uniform([5], np.float32), np.array([3, 4], i64)], [1]),
        gradient("SparseToDense values and default", "SparseToDense",
                 [np.array([[0, 1], [1, 0], [2, 2]], i32), np.array([3, 3], i32),
                  uniform([3], np.float64), np.float64(0.5)], [2, 3]),
    ]


def main():
    cases = (bucketize_cases() + gather_nd_cases() + scatter_nd_cases()
             + sparse_to_dense_cases() + hash_error_cases())
    print(json.dumps(dict(hash=hashes(), cases=cases, gradients=gradients())))


if __name__ == "__main__":
    main()
