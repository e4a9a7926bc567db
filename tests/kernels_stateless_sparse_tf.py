"""TensorFlow's side of tests/kernels_stateless_sparse.rs: what stock TensorFlow computes for
StatelessRandomGetKeyCounter, StatelessRandomUniformV2, SerializeSparse and DeserializeSparse,
printed as one JSON line.

    python3 tests/kernels_stateless_sparse_tf.py

Keys and counters are uint64s; samples are the bits of each value (float32 and float64 as
the bits of their own type, float16 and bfloat16 as uint16 bits); serialized strings are
hex. Each error case carries TensorFlow's code and the end of its message.
"""
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

SEEDS = [("int64", [1, 2]), ("int32", [-1, -2]), ("int64", [0, 0]),
         ("int64", [2**62 + 12345, -(2**40) - 7]), ("int32", [2**31 - 1, 7])]
SHAPES = [[5], [3, 4], [2, 3, 5], [0], []]
DTYPES = {"float32": (tf.float32, np.uint32), "float64": (tf.float64, np.uint64),
          "float16": (tf.float16, np.uint16), "bfloat16": (tf.bfloat16, np.uint16)}
CODES = {tf.errors.InvalidArgumentError: "INVALID_ARGUMENT",
         tf.errors.UnimplementedError: "UNIMPLEMENTED"}


def key_counters():
    out = []
    for dtype, seed in SEEDS:
        key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(
            seed=tf.constant(seed, getattr(tf, dtype)))
        out.append(dict(dtype=dtype, seed=seed, key=key.numpy().tolist(),
                        counter=counter.numpy().tolist()))
    return out


def uniforms():
    out = []
    for (_, seed), alg in zip(SEEDS, [1, 3, 1, 3, 1]):
        key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=tf.constant(seed, tf.int64))
        for shape in SHAPES:
            for name, (dtype, bits) in DTYPES.items():
                x = tf.raw_ops.StatelessRandomUniformV2(
                    shape=shape, key=key, counter=counter, alg=alg, dtype=dtype)
                out.append(dict(seed=seed, alg=alg, shape=shape, dtype=name,
                                bits=x.numpy().view(bits).ravel().tolist()))
    # The public API: a seed straight to samples.
    for name in ["float32", "float64"]:
        x = tf.random.stateless_uniform([7, 3], seed=[3, 4], dtype=getattr(tf, name))
        key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=[3, 4])
        out.append(dict(seed=[3, 4], alg=1, shape=[7, 3], dtype=name,
                        bits=x.numpy().view(DTYPES[name][1]).ravel().tolist()))
    return out


def sparse(indices, values, shape, dtype):
    return dict(indices=np.array(indices, np.int64).reshape(-1, len(shape)), values=values,
                shape=shape, dtype=dtype)


SPARSE = [
    sparse([[0, 1], [2, 0]], [1.5, -2.25], [3, 4], "float32"),
    sparse([[3], [1]], [10, 20], [5], "int64"),
    sparse([[0], [1], [4]], [b"a", b"bc", b""], [6], "string"),
    sparse([], [], [2, 2], "float64"),
    sparse([[0, 0, 1]], [7], [1, 2, 3], "int32"),
]


def serialized(s):
    return tf.raw_ops.SerializeSparse(
        sparse_indices=s["indices"], sparse_values=tf.constant(s["values"], getattr(tf, s["dtype"])
                                                              if s["dtype"] != "string" else tf.string),
        sparse_shape=tf.constant(s["shape"], tf.int64))


def encode_values(values, dtype):
    if dtype == "string":
        return [bytes(v).hex() for v in values]
    if dtype.startswith("float"):
        return np.asarray(values, np.float64).view(np.uint64).tolist()
    return [int(v) for v in values]


def serializations():
    out = []
    for s in SPARSE:
        out.append(dict(indices=s["indices"].tolist(), rank=len(s["shape"]),
                        values=encode_values(s["values"], s["dtype"]), shape=s["shape"],
                        dtype=s["dtype"], serialized=[v.hex() for v in serialized(s).numpy()]))
    return out


def deserializations():
    out = []
    groups = [([0], None), ([1], [1]), ([1, 1, 1], [3]), ([4, 4], [2]), ([4, 4, 4, 4], [2, 2])]
    for picks, lead in groups:
        rows = tf.stack([serialized(SPARSE[i]) for i in picks])
        rows = rows[0] if lead is None else tf.reshape(rows, lead + [3])
        dtype = SPARSE[picks[0]]["dtype"]
        i, v, s = tf.raw_ops.DeserializeSparse(
            serialized_sparse=rows, dtype=getattr(tf, dtype) if dtype != "string" else tf.string)
        out.append(dict(serialized=[x.hex() for x in rows.numpy().ravel()],
                        serialized_shape=list(rows.shape), dtype=dtype,
                        indices=i.numpy().tolist(), index_shape=list(i.shape),
                        values=encode_values(v.numpy(), dtype), shape=s.numpy().tolist()))
    return out


def error(f):
    try:
        f()
    except tf.errors.OpError as e:
        return dict(code=CODES[type(e)], message=e.message.split(" [Op:")[0].split("}} ")[-1])
    raise AssertionError("TensorFlow accepted a bad input")


def errors():
    key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=[1, 2])
    uniform = tf.raw_ops.StatelessRandomUniformV2
    s = serialized(SPARSE[0])
    return {
        "seed_shape": error(lambda: tf.raw_ops.StatelessRandomGetKeyCounter(seed=[1, 2, 3])),
        "threefry": error(lambda: uniform(shape=[3], key=key, counter=counter, alg=2)),
        "key_shape": error(lambda: uniform(shape=[3], key=tf.constant([1, 2], tf.uint64),
                                           counter=counter, alg=1)),
        "indices_vector": error(lambda: tf.raw_ops.SerializeSparse(
            sparse_indices=tf.constant([0], tf.int64), sparse_values=[1.0],
            sparse_shape=tf.constant([3], tf.int64))),
        "last_dim": error(lambda: tf.raw_ops.DeserializeSparse(
            serialized_sparse=tf.constant(["a", "b"]), dtype=tf.float32)),
        "no_tensors": error(lambda: tf.raw_ops.DeserializeSparse(
            serialized_sparse=tf.zeros([0, 3], tf.string), dtype=tf.float32)),
        "wrong_dtype": error(lambda: tf.raw_ops.DeserializeSparse(
            serialized_sparse=s, dtype=tf.int32)),
        "wrong_dtype_batch": error(lambda: tf.raw_ops.DeserializeSparse(
            serialized_sparse=tf.stack([s, s]), dtype=tf.int32)),
    }


def main():
    print(json.dumps(dict(key_counters=key_counters(), uniforms=uniforms(),
                          serializations=serializations(),
                          deserializations=deserializations(), errors=errors())))


if __name__ == "__main__":
    main()
