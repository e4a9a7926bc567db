"""TensorFlow's side of tests/sparse_accumulator.rs: TensorFlow's SparseConditionalAccumulator
(SparseAccumulatorApplyGradient, SparseAccumulatorTakeGradient, and the AccumulatorSetGlobalStep
/ AccumulatorNumAccumulated it shares with the dense kind) run by stock TensorFlow on scripted
sequences of operations, printed with their inputs and every result as one JSON line.

    python3 tests/sparse_accumulator_tf.py

The sequences repeat indices within and across gradients, send some out of order, send stale
gradients, take with MEAN and SUM in float32 and float64, with a declared, a partly known and an
unknown shape, and send gradients TensorFlow refuses (their error message is recorded). Values are
printed as their bit patterns, so the Rust side runs on the very inputs TensorFlow ran on and
must agree to the bit. Last, it records that the op itself refuses int32 indices (only
the Python wrapper casts them).
"""
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()
rng = np.random.default_rng(20261204)


def apply(step, indices, rows, shape="declared", dims=None):
    """An apply of len(indices) random rows of `rows` values each; `shape` is the dense shape
    sent ("declared": the case's, None: has_known_shape false, else a list)."""
    return dict(op="apply", local_step=step, indices=indices, rows=rows, shape=shape, dims=dims)


def bits(values):
    """The values' bit patterns (uint32 for float32, uint64 for float64), so that JSON carries
    them exactly."""
    values = np.ascontiguousarray(values)
    return values.view(np.uint32 if values.dtype == np.float32 else np.uint64).ravel().tolist()


def take(n):
    return dict(op="take", num_required=n)


# Row-wise sequences used with both reductions.
ROUNDS = [
    dict(op="set_global_step", step=1),
    apply(0, [2], [2]),  # stale: dropped
    apply(1, [1, 3, 5], [2]),
    apply(2, [0, 3, 5, 7], [2]),  # repeats across gradients
    dict(op="num_accumulated"),
    take(2),
    apply(2, [6, 2, 6], [2]),  # out of order, a repeat within the gradient
    apply(2, [2, 4, 6], [2]),
    apply(3, [2, 2], [2]),
    take(3),
    dict(op="num_accumulated"),
    apply(1, [0], [2]),  # stale after two takes
    apply(3, [], [2]),  # no rows
    apply(3, [4], [2]),
    take(2),
]

CASES = [
    dict(name="mean float32, declared shape [8, 2]", dtype="float32", shape=[8, 2],
         reduction="MEAN", ops=ROUNDS),
    dict(name="sum float32, declared shape [8, 2]", dtype="float32", shape=[8, 2],
         reduction="SUM", ops=ROUNDS),
    dict(name="mean float64, unknown shape, rows [2, 3], no dense shape sent", dtype="float64",
         shape=None, reduction="MEAN", ops=[
             apply(0, [0, 9], [2, 3], shape=None),
             apply(0, [9, 12], [2, 3], shape=None),
             apply(0, [3, 9], [2, 3], shape=None),
             take(3),
             apply(1, [5], [2, 3], shape=None),
             take(1),
         ]),
    dict(name="mean float32, shape [?, 3]", dtype="float32", shape=[None, 3],
         reduction="MEAN", ops=[
             apply(0, [4, 1], [3], shape=[10, 3]),
             apply(0, [1], [3], shape=[10, 3]),
             take(2),
         ]),
    dict(name="sum float64, 1-D variable of 5", dtype="float64", shape=[5],
         reduction="SUM", ops=[
             apply(0, [0, 4], [], shape=[5]),
             apply(0, [4], [], shape=[5]),
             take(2),
         ]),
    dict(name="refused gradients, shape [4, 2]", dtype="float32", shape=[4, 2],
         reduction="MEAN", ops=[
             apply(0, [4], [2]),  # past the first dimension
             apply(0, [1], [3]),  # rows of 3 values, not 2
             apply(0, [1], [2], shape=[5, 2]),  # another dense shape
             apply(0, [1], [], shape=[4, 2]),  # values of rank 1 below the declared rank 2
             apply(0, [0], [2]),  # accepted
             apply(0, [1], [2, 1]),  # rank 3 after rank 2 was accumulated
             apply(0, [[0]], [2]),  # indices not a vector
             apply(0, [0, 1], [2], dims=[1, 2]),  # two indices, one row
             apply(0, [3], [2]),  # accepted
             take(2),
         ]),
]


def run_case(case):
    dtype = tf.as_dtype(case["dtype"])
    np_dtype = np.float32 if case["dtype"] == "float32" else np.float64
    out = []
    with tf.Graph().as_default(), tf1.Session() as session:
        shape = None if case["shape"] is None else tf.TensorShape(case["shape"])
        accum = tf1.SparseConditionalAccumulator(
            dtype, shape=shape, shared_name="accum", reduction_type=case["reduction"])
        for op in case["ops"]:
            op = dict(op)
            if op["op"] == "apply":
                n = len(op["indices"])
                dims = op.pop("dims") or [n] + op["rows"]
                values = rng.standard_normal(dims).astype(np_dtype)
                op["values"] = bits(values)
                op["values_shape"] = list(dims)
                sent = op["shape"]
                if sent == "declared":
                    sent = case["shape"]
                    op["shape"] = sent
                indices = np.asarray(op["indices"], dtype=np.int64)
                apply_op = accum.apply_grad(
                    grad_indices=indices, grad_values=values,
                    grad_shape=None if sent is None else np.asarray(sent, dtype=np.int64),
                    local_step=op["local_step"])
                try:
                    session.run(apply_op)
                except tf.errors.InvalidArgumentError as e:
                    # The message proper: the line above the `[[{{node ...}}]]` one.
                    lines = e.message.splitlines()
                    at = next(i for i, l in enumerate(lines) if l.lstrip().startswith("[["))
                    op["error"] = lines[at - 1]
            elif op["op"] == "take":
                indices, values, shape = session.run(accum.take_grad(op["num_required"]))
                op["indices"] = indices.tolist()
                op["values"] = bits(values)
                op["values_shape"] = list(values.shape)
                op["shape"] = shape.tolist()
            elif op["op"] == "set_global_step":
                session.run(accum.set_global_step(op["step"]))
            elif op["op"] == "num_accumulated":
                op["value"] = int(session.run(accum.num_accumulated()))
            out.append(op)
    return dict(case, ops=out)


def int32_indices():
    """Whether the op itself takes int32 indices, and what TensorFlow says when not."""
    from tensorflow.python.ops import gen_data_flow_ops
    with tf.Graph().as_default():
        accum = tf1.SparseConditionalAccumulator(tf.float32, shape=tf.TensorShape([4, 2]))
        try:
            gen_data_flow_ops.sparse_accumulator_apply_gradient(
                accum.accumulator_ref, local_step=tf.constant(0, tf.int64),
                gradient_indices=tf.constant([1], tf.int32),
                gradient_values=tf.zeros([1, 2]), gradient_shape=tf.constant([4, 2], tf.int64),
                has_known_shape=True)
            return dict(accepted=True, message="")
        except (TypeError, ValueError) as e:
            return dict(accepted=False, message=str(e).splitlines()[0])


def main():
    cases = [run_case(c) for c in CASES]
    print(json.dumps(dict(tensorflow=tf.__version__, cases=cases, int32_indices=int32_indices())))


if __name__ == "__main__":
    main()
