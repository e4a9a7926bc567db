"""TensorFlow's side of tests/kernels_sparse.rs: what stock TensorFlow computes for the gather,
scatter, segment, unique, partition and stitch kernels on seeded inputs, and the errors it
raises for bad indices and shapes, printed as one JSON line.

    python3 tests/kernels_sparse_tf.py          # the kernel cases
    python3 tests/kernels_sparse_tf.py graph    # a TensorFlow 1 graph using them, with values

Each case is {"op", "attrs", "inputs", "var"?, "outputs" | "error"}. Tensors are
{"dtype", "shape", "values"}; attrs are {"name": [kind, value]} with kind int, bool or type.
A case with "var" runs on a resource variable holding that tensor (input 0 is its handle);
for the scatters, "outputs" holds the variable's value afterwards. An error is TensorFlow's
exception class and message, without the `{{function_node ...}}` prefix and `[Op:...]` suffix.

`graph` prints {"graph_def": hex, "init", "train", "feeds", "fetches", "values", "after"}: a
graph built as a TensorFlow 1 program builds it (embedding lookups, segment reductions,
partition and stitch, their gradients from tf.gradients, a GradientDescent step whose sparse
update is a ResourceScatterAdd), what a session computes for the fetches before the step, and
the table after it.
"""
import json
import os
import re
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

R = tf.raw_ops
rng = np.random.default_rng(20261126)
cases = []


def enc(x):
    a = np.asarray(x)
    if a.dtype == np.bool_:
        values = a.ravel().tolist()
    elif a.dtype.kind == "f":
        values = a.astype(np.float64).ravel().tolist()
    else:
        values = [int(v) for v in a.ravel()]
    return {"dtype": a.dtype.name, "shape": list(a.shape), "values": values}


def message(e):
    text = str(e).split("\n")[0]
    text = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", text)
    return re.sub(r"\s*\[Op:[A-Za-z0-9]*\].*$", "", text)


def attrs_of(attrs):
    out = {}
    for k, v in attrs.items():
        if isinstance(v, bool):
            out[k] = ["bool", v]
        elif isinstance(v, int):
            out[k] = ["int", v]
        else:
            out[k] = ["type", tf.as_dtype(v).name]
    return out


def case(op, inputs, attrs=None, var=None, kwargs_names=None):
    """Runs tf.raw_ops.<op> on `inputs` (named by `kwargs_names`), with a variable first
    when `var` is given, and records the outputs or the error."""
    attrs = attrs or {}
    c = {"op": op, "attrs": attrs_of(attrs), "inputs": [enc(x) if not isinstance(x, list)
                                                        or not x or not isinstance(x[0], np.ndarray)
                                                        else [enc(y) for y in x] for x in inputs]}
    kwargs = dict(zip(kwargs_names, inputs))
    try:
        if var is not None:
            c["var"] = enc(var)
            v = tf.Variable(var)
            out = getattr(R, op)(resource=v.handle, **kwargs, **attrs)
            out = [v.numpy()] if out is None else [out]
        else:
            out = getattr(R, op)(**kwargs, **attrs)
            if not isinstance(out, (list, tuple)):
                out = [out]
        c["outputs"] = [enc(np.asarray(t)) for t in out]
    except tf.errors.OpError as e:
        c["error"] = {"code": type(e).__name__, "message": message(e)}
    cases.append(c)


def uniform(shape, dtype):
    if np.dtype(dtype).kind == "f":
        return rng.uniform(-2, 2, shape).astype(dtype)
    return rng.integers(-9, 10, shape).astype(dtype)


DTYPES = [np.float32, np.float64, np.int32, np.int64]


def gathers():
    names = ["params", "indices", "axis"]
    for dtype in DTYPES:
        p = uniform((5, 4, 3), dtype)
        for axis in [0, 1, 2, -1, -3]:
            n = p.shape[axis]
            idx = rng.integers(0, n, (2, 3)).astype(np.int32 if axis % 2 else np.int64)
            case("GatherV2", [p, idx, np.int32(axis)], {"batch_dims": 0}, kwargs_names=names)
        # batch_dims: the first dims of params and indices are shared.
        for axis, batch_dims, ishape in [(1, 1, (5, 2)), (2, 1, (5, 3, 2)), (2, 2, (5, 4, 2)),
                                         (2, -1, (5, 4)), (-1, 1, (5,)), (1, -1, (5, 2))]:
            n = p.shape[axis]
            idx = rng.integers(0, n, ishape).astype(np.int32)
            case("GatherV2", [p, idx, np.int32(axis)], {"batch_dims": batch_dims},
                 kwargs_names=names)
    p = uniform((3, 4), np.float32)
    for idx, axis, bd in [([[0, 5]], 1, 0), ([[0, -1]], 1, 0), ([7], 0, 0),
                          ([[0, 1]], 1, 3), ([[0, 1]], 1, -3),
                          ([[0, 1], [1, 1], [0, 0]], 0, 1), ([[0, 1], [1, 1]], 1, 1)]:
        case("GatherV2", [p, np.array(idx, np.int32), np.int32(axis)], {"batch_dims": bd},
             kwargs_names=names)
    case("GatherV2", [np.float32(1), np.array([0], np.int32), np.int32(0)], {"batch_dims": 0},
         kwargs_names=names)


def resource_rows():
    table = uniform((6, 3), np.float32)
    for dtype in [np.int32, np.int64]:
        idx = np.array([[4, 0], [4, 5]], dtype)
        case("ResourceGather", [idx], {"dtype": tf.float32}, var=table, kwargs_names=["indices"])
    batched = uniform((3, 5, 2), np.float64)
    case("ResourceGather", [rng.integers(0, 5, (3, 4)).astype(np.int32)],
         {"dtype": tf.float64, "batch_dims": 1}, var=batched, kwargs_names=["indices"])
    case("ResourceGather", [np.array([0, 7], np.int32)], {"dtype": tf.float32}, var=table,
         kwargs_names=["indices"])
    case("ResourceGather", [np.array([[0]], np.int32)], {"dtype": tf.float32, "batch_dims": 3},
         var=table, kwargs_names=["indices"])
    case("ResourceGather", [np.array([[0]], np.int32)], {"dtype": tf.float32, "batch_dims": -1},
         var=table, kwargs_names=["indices"])
    names = ["indices", "updates"]
    for op in ["Update", "Add", "Sub", "Mul", "Div", "Min", "Max"]:
        op = "ResourceScatter" + op
        for dtype in [np.float32, np.float64, np.int32, np.int64]:
            var = uniform((5, 3), dtype)
            if np.dtype(dtype).kind != "f":
                var = rng.integers(1, 50, (5, 3)).astype(dtype)
            idx = np.array([3, 0, 3, 1], np.int64 if dtype == np.int64 else np.int32)
            updates = uniform((4, 3), dtype)
            if op.endswith("Div"):
                updates = np.where(updates == 0, 3, updates).astype(dtype)
            case(op, [idx, updates], var=var, kwargs_names=names)
        var = uniform((4, 2), np.float32)
        case(op, [np.array([[2], [0]], np.int32), np.array(1.5, np.float32)], var=var,
             kwargs_names=names)
    var = uniform((4, 2), np.float32)
    case("ResourceScatterAdd", [np.array([0, 7], np.int32), np.ones((2, 2), np.float32)],
         var=var, kwargs_names=names)
    case("ResourceScatterAdd", [np.array([[0], [9]], np.int32), np.ones((2, 1, 2), np.float32)],
         var=var, kwargs_names=names)
    case("ResourceScatterAdd", [np.array([0], np.int32), np.ones((1, 2), np.float64)],
         var=var, kwargs_names=names)
    case("ResourceScatterDiv", [np.array([0], np.int32), np.array([[2, 0]], np.int32)],
         var=np.array([[4, 6], [1, 1]], np.int32), kwargs_names=names)


def uniques():
    for dtype, values in [(np.int32, [3, 1, 3, 2, 1, 7]), (np.int64, [9, 9, -4, 0]),
                          (np.float32, [0.5, -0.0, 0.0, 0.5, 2.0]), (np.float64, [1, 2, 1])]:
        for out_idx in [tf.int32, tf.int64]:
            case("Unique", [np.array(values, dtype)], {"out_idx": out_idx}, kwargs_names=["x"])
    case("Unique", [np.array([True, False, True])], kwargs_names=["x"])
    case("Unique", [np.array([[3, 1]], np.int32)], kwargs_names=["x"])
    x = np.array([[1, 2, 1], [3, 4, 3], [1, 2, 1]], np.int32)
    for axis in [[0], [1], [-1], [2]]:
        case("UniqueV2", [x, np.array(axis, np.int64)], kwargs_names=["x", "axis"])
    case("UniqueV2", [np.array([5, 5, 1], np.int64), np.array([], np.int64)],
         {"out_idx": tf.int64}, kwargs_names=["x", "axis"])


def segments():
    names = ["data", "segment_ids", "num_segments"]
    for op in ["Sum", "Max", "Min", "Prod"]:
        op = "UnsortedSegment" + op
        for dtype in DTYPES:
            data = uniform((6, 3), dtype)
            ids = np.array([2, 0, -1, 2, 4, 0], np.int32 if dtype != np.int64 else np.int64)
            case(op, [data, ids, np.int32(5)], kwargs_names=names)
        data = uniform((2, 3, 2), np.float32)
        case(op, [data, np.array([[1, 0, 1], [-1, 3, 1]], np.int64), np.int64(4)],
             kwargs_names=names)
    p = uniform((3, 4), np.float32)
    for ids, num in [([0, 5, 1], 3), ([0, 1], 3), ([0, 1, 1], -1)]:
        case("UnsortedSegmentSum", [p, np.array(ids, np.int32), np.int32(num)],
             kwargs_names=names)
    case("UnsortedSegmentSum", [p, np.array([0, 1, 1], np.int32), np.array([2], np.int32)],
         kwargs_names=names)
    names = ["data", "segment_ids"]
    for op in ["Sum", "Mean", "Max", "Min", "Prod"]:
        op = "Segment" + op
        for dtype in DTYPES:
            data = uniform((7, 2), dtype)
            ids = np.array([0, 0, 2, 2, 2, 3, 5], np.int32 if dtype != np.int64 else np.int64)
            case(op, [data, ids], kwargs_names=names)
    for ids in [[1, 0, 1], [0, 1], [-1, 0, 1], [[0, 1, 1]]]:
        case("SegmentSum", [p, np.array(ids, np.int32)], kwargs_names=names)
    names = ["data", "indices", "segment_ids"]
    for op in ["Sum", "Mean", "SqrtN"]:
        for dtype in ([np.float32, np.float64, np.int32, np.int64] if op == "Sum"
                      else [np.float32, np.float64]):
            data = uniform((6, 3), dtype)
            indices = np.array([5, 0, 5, 2, 1], np.int64 if dtype == np.float64 else np.int32)
            ids = np.array([0, 0, 2, 2, 3], np.int32)
            case("SparseSegment" + op, [data, indices, ids], kwargs_names=names)
            case("SparseSegment" + op + "WithNumSegments",
                 [data, indices, ids.astype(np.int64), np.int32(7)],
                 kwargs_names=names + ["num_segments"])
    for indices, ids in [([0, 5], [0, 1]), ([0, 1], [1, 0]), ([0, 1], [0]), ([0, 1], [-1, 0]),
                         ([[0, 1]], [0, 1])]:
        case("SparseSegmentSum", [p, np.array(indices, np.int32), np.array(ids, np.int32)],
             kwargs_names=names)
    case("SparseSegmentSumWithNumSegments",
         [p, np.array([0, 1], np.int32), np.array([0, 4], np.int32), np.int32(3)],
         kwargs_names=names + ["num_segments"])
    for op in ["Sum", "Mean", "SqrtN"]:
        for v2 in ["", "V2"]:
            dim0 = "dense_output_dim0" if v2 else "output_dim0"
            names = ["grad", "indices", "segment_ids", dim0]
            for dtype in [np.float32, np.float64]:
                grad = uniform((4, 3), dtype)
                indices = np.array([4, 0, 4, 2, 0, 1], np.int32 if dtype == np.float32 else np.int64)
                ids = np.array([0, 0, 1, 3, 3, 3], np.int32)
                case(f"SparseSegment{op}Grad{v2}", [grad, indices, ids, np.int32(5)],
                     kwargs_names=names)
            grad = uniform((2, 3), np.float32)
            case(f"SparseSegment{op}Grad{v2}",
                 [grad, np.array([0, 5], np.int32), np.array([0, 1], np.int32), np.int32(3)],
                 kwargs_names=names)
    case("SparseSegmentSumGrad", [uniform((2, 3), np.float32), np.array([0, 1, 0], np.int32),
                                  np.array([0, 1, 2], np.int32), np.int32(3)],
         kwargs_names=["grad", "indices", "segment_ids", "output_dim0"])


def partitions():
    names = ["data", "partitions"]
    for dtype in [np.float32, np.int64, np.bool_]:
        data = uniform((6, 2), np.float32 if dtype == np.bool_ else dtype)
        if dtype == np.bool_:
            data = data > 0
        case("DynamicPartition", [data, np.array([2, 0, 2, 1, 0, 2], np.int32)],
             {"num_partitions": 3}, kwargs_names=names)
    data = uniform((2, 3, 2), np.float64)
    case("DynamicPartition", [data, np.array([[1, 0, 1], [1, 1, 0]], np.int32)],
         {"num_partitions": 3}, kwargs_names=names)
    case("DynamicPartition", [data[0], np.array([0, 3, 1], np.int32)], {"num_partitions": 2},
         kwargs_names=names)
    case("DynamicPartition", [data[0], np.array([0, 1], np.int32)], {"num_partitions": 2},
         kwargs_names=names)
    for op in ["DynamicStitch", "ParallelDynamicStitch"]:
        for dtype in [np.float32, np.int32]:
            indices = [np.array([0, 4], np.int32), np.array([[1, 6], [5, 2]], np.int32)]
            data = [uniform((2, 3), dtype), uniform((2, 2, 3), dtype)]
            case(op, [indices, data], kwargs_names=["indices", "data"])
        # Repeated indices: the later input wins.
        case(op, [[np.array([0, 1], np.int32), np.array([1], np.int32)],
                  [np.array([[1, 1], [2, 2]], np.float32), np.array([[3, 3]], np.float32)]],
             kwargs_names=["indices", "data"])
    case("DynamicStitch", [[np.array([0, 1], np.int32), np.array([2], np.int32)],
                           [np.ones((2, 2), np.float32), np.ones((2, 2), np.float32)]],
         kwargs_names=["indices", "data"])
    case("DynamicStitch", [[np.array([0, 1], np.int32), np.array([-1], np.int32)],
                           [np.ones((2, 2), np.float32), np.ones((1, 2), np.float32)]],
         kwargs_names=["indices", "data"])


def graph():
    g = tf.Graph()
    with g.as_default():
        table = tf.compat.v1.get_variable(
            "table", initializer=np.arange(24, dtype=np.float32).reshape(8, 3) / 10.0,
            use_resource=True)
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        x = tf.compat.v1.placeholder(tf.float32, [4, 5, 2], name="x")
        emb = tf.nn.embedding_lookup(table, ids)
        pooled = tf.math.unsorted_segment_sum(emb, tf.constant([0, 2, 0, 1], tf.int32), 3)
        by_row = tf.gather(x, tf.constant([[1, 4], [0, 0], [3, 2], [4, 1]]), axis=1,
                           batch_dims=1)
        means = tf.sparse.segment_mean(tf.reshape(x, [20, 2]),
                                            tf.constant([3, 7, 7, 19]),
                                            tf.constant([0, 0, 1, 1]))
        sums = tf.math.segment_sum(tf.reshape(x, [4, 10]), tf.constant([0, 0, 1, 1]))
        parts = tf.dynamic_partition(tf.reshape(x, [8, 5]), tf.constant([1, 0, 1, 1, 0, 0, 1, 0]), 2)
        stitched = tf.dynamic_stitch([tf.constant([0, 2, 4, 6]), tf.constant([1, 3, 5, 7])],
                                     [parts[0] * 2.0, parts[1]])
        unique, positions = tf.unique(ids)
        loss = tf.identity(
            tf.reduce_sum(pooled * pooled) + tf.reduce_sum(by_row * by_row)
            + tf.reduce_sum(means * 3.0) + tf.reduce_sum(sums * sums)
            + tf.reduce_sum(stitched * stitched) + tf.reduce_sum(tf.cast(positions, tf.float32)),
            name="loss")
        dtable, dx = tf.gradients(loss, [table, x])
        dtable = tf.identity(tf.convert_to_tensor(dtable), name="dtable")
        dx = tf.identity(dx, name="dx")
        unique = tf.identity(unique, name="unique_ids")
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            loss, var_list=[table], name="train")
        init = tf.compat.v1.global_variables_initializer()
        table_now = tf.identity(table.value(), name="table_now")
        feeds = {"ids:0": np.array([5, 1, 5, 0], np.int64),
                 "x:0": rng.uniform(-1, 1, (4, 5, 2)).astype(np.float32)}
        fetches = ["loss:0", "dtable:0", "dx:0", "unique_ids:0"]
        with tf.compat.v1.Session(graph=g) as s:
            s.run(init)
            values = s.run(fetches, feeds)
            s.run(train, feeds)
            after = s.run(table_now)
        json.dump({
            "graph_def": g.as_graph_def().SerializeToString().hex(),
            "init": init.name, "train": train.name,
            "feeds": {k: enc(v) for k, v in feeds.items()},
            "fetches": fetches, "values": [enc(v) for v in values], "after": enc(after),
            "table": table_now.name,
        }, sys.stdout)
        print()


if sys.argv[1:] == ["graph"]:
    graph()
else:
    gathers()
    resource_rows()
    uniques()
    segments()
    partitions()
    json.dump({"cases": cases}, sys.stdout)
    print()
