"""Stock TensorFlow's values, errors and gradients for tests/kernels_sparse_columns.rs.

Runs SparseCross, SparseCrossHashed, SparseCrossV2, SparseFillEmptyRows(Grad) and SparseReshape
on seeded inputs, drives hash tables through sequences of lookup ops (vocabulary files written
under a temporary directory), takes tf.GradientTape's gradient of SparseFillEmptyRows, and
builds a tf.compat.v1 feature-column graph (vocabulary list and file columns, a crossed
column, indicator and embedding columns into input_layer). Prints one JSON line.
"""

import json
import os
import tempfile

import numpy as np
import tensorflow as tf

rng = np.random.default_rng(33)
raw = tf.raw_ops
fc = tf.compat.v1.feature_column
TMP = tempfile.mkdtemp(prefix="tessera_sparse_columns_")


def encode(x):
    x = np.asarray(x)
    if x.dtype.kind in "OSU":
        values = [(v if isinstance(v, bytes) else str(v).encode()).hex() for v in x.ravel()]
        dtype = "string"
    elif x.dtype == np.float32 or x.dtype == np.float64:
        values = [float(v).hex() for v in x.astype(np.float64).ravel()]
        dtype = "float32" if x.dtype == np.float32 else "float64"
    elif x.dtype == np.bool_:
        values = [bool(v) for v in x.ravel()]
        dtype = "bool"
    else:
        values = [int(v) for v in x.ravel()]
        dtype = str(x.dtype)
    return dict(dtype=dtype, shape=list(x.shape), values=values)


def encode_attr(v):
    if isinstance(v, bool):
        return {"b": v}
    if isinstance(v, int):
        return {"i": v}
    if isinstance(v, str):
        return {"s": v}
    if isinstance(v, tf.DType):
        return {"type": v.name}
    if isinstance(v, list):
        return {"list_type": [t.name for t in v]}
    raise TypeError(v)


def error(e):
    message = str(e).split(" [Op:")[0]
    if "}} " in message:
        message = message.split("}} ", 1)[1]
    return dict(code=type(e).__name__.replace("Error", "").upper(), message=message.strip())


CODES = {"INVALIDARGUMENT": "INVALID_ARGUMENT", "FAILEDPRECONDITION": "FAILED_PRECONDITION",
         "NOTFOUND": "NOT_FOUND", "OUTOFRANGE": "OUT_OF_RANGE"}


def run(f):
    try:
        out = f()
        outs = out if isinstance(out, (list, tuple)) else [out]
        return dict(outputs=[encode(o.numpy()) for o in outs if o is not None])
    except tf.errors.OpError as e:
        err = error(e)
        err["code"] = CODES.get(err["code"], err["code"])
        return dict(error=err)


def case(name, op, inputs, **attrs):
    """Runs raw op `op`; `inputs` is a list of (arg name, value or list of values)."""
    flat = []
    kwargs = {}
    for arg, v in inputs:
        if isinstance(v, list):
            kwargs[arg] = [tf.constant(x) for x in v]
            flat.extend(v)
        else:
            kwargs[arg] = tf.constant(v)
            flat.append(v)
    result = run(lambda: getattr(raw, op)(**kwargs, **attrs))
    node_attrs = dict(attrs)
    if op.startswith("SparseCross"):
        sparse = inputs[1][1]
        dense = inputs[3][1]
        node_attrs.update(N=len(sparse), sparse_types=[tf.as_dtype(np.asarray(x).dtype) if np.asarray(x).dtype.kind != "O" else tf.string for x in sparse],
                          dense_types=[tf.as_dtype(np.asarray(x).dtype) if np.asarray(x).dtype.kind != "O" else tf.string for x in dense])
    elif op in ("SparseFillEmptyRows", "SparseFillEmptyRowsGrad"):
        node_attrs["T"] = tf.as_dtype(np.asarray(flat[1]).dtype) if np.asarray(flat[1]).dtype.kind != "O" else tf.string
    return dict(name=name, op=op, inputs=[encode(x) for x in flat],
                attrs={k: encode_attr(v) for k, v in node_attrs.items()}, **result)


def i64(*rows):
    return np.array(rows, np.int64)


def strs(*v):
    return np.array([s.encode() for s in v], dtype=object)


def sparse_column(batch, width, values):
    """A [batch, width] sparse column of 0 to `width` sorted entries per row."""
    idx = []
    for b in range(batch):
        k = int(rng.integers(0, width + 1))
        for j in sorted(rng.choice(width, k, replace=False)):
            idx.append([b, j])
    idx = np.array(idx, np.int64).reshape(-1, 2)
    return idx, values(len(idx)), np.array([batch, width], np.int64)


def words(n):
    pool = ["apple", "kiwi", "", "a_X_b", "longer-word-of-bytes", "\u00e9t\u00e9", "x" * 40]
    return np.array([pool[i].encode() for i in rng.integers(0, len(pool), n)], dtype=object)


def ints(n):
    return rng.integers(-(1 << 40), 1 << 40, n).astype(np.int64)


def cross_cases():
    out = []
    s1 = sparse_column(6, 3, words)
    s2 = sparse_column(6, 4, ints)
    d1 = words(12).reshape(6, 2)
    d2 = ints(6).reshape(6, 1)

    def cross_inputs(sparse, dense):
        return [("indices", [s[0] for s in sparse]), ("values", [s[1] for s in sparse]),
                ("shapes", [s[2] for s in sparse]), ("dense_inputs", dense)]

    combos = [("strings and ints", [s1, s2], [d1, d2]), ("sparse only", [s1, s2], []),
              ("dense only", [], [d1, d2]), ("one string column", [s1], []),
              ("ints only", [s2], [d2])]
    for label, sparse, dense in combos:
        ins = cross_inputs(sparse, dense)
        internal = tf.string if label == "one string column" else tf.int64
        out.append(case(f"joined, {label}", "SparseCross", ins, hashed_output=False,
                        num_buckets=0, hash_key=0, out_type=tf.string, internal_type=internal))
        for buckets, key in [(0, 0), (1000, 956888297470), (7, -5)]:
            out.append(case(f"hashed, {label}, {buckets} buckets", "SparseCross", ins,
                            hashed_output=True, num_buckets=buckets, hash_key=key,
                            out_type=tf.int64, internal_type=internal))
        for buckets, strong in [(0, False), (100, False), (50, True), (0, True)]:
            if strong and any(np.asarray(d).dtype == np.int64 for d in dense):
                continue  # TensorFlow 2.21 crashes on a strong hash of a dense int64 column
            out.append(case(f"cross_hashed, {label}, {buckets} buckets, strong {strong}",
                            "SparseCrossHashed", ins + [("num_buckets", np.int64(buckets)),
                                                        ("strong_hash", strong),
                                                        ("salt", i64(17, -3))]))
        out.append(case(f"v2, {label}", "SparseCrossV2", ins + [("sep", np.bytes_(b"--"))]))
    ind, sh = i64([0, 0], [1, 0], [1, 1]), i64(2, 2)
    one = lambda v, d=(), extra=(): [("indices", [ind]), ("values", [v]), ("shapes", [sh]),  # noqa: E731
                                     ("dense_inputs", list(d))] + list(extra)
    sep = [("sep", np.bytes_(b"_"))]
    out += [
        case("no columns", "SparseCrossV2", [("indices", []), ("values", []), ("shapes", []),
                                             ("dense_inputs", [])] + sep),
        case("rows out of order", "SparseCrossV2",
             [("indices", [i64([1, 0], [0, 0])]), ("values", [i64(1, 2)]), ("shapes", [sh]),
              ("dense_inputs", [strs("x", "y").reshape(2, 1)])] + sep),
        case("row past the batch", "SparseCrossV2",
             [("indices", [i64([0, 0], [5, 0])]), ("values", [i64(1, 2)]), ("shapes", [sh]),
              ("dense_inputs", [strs("x", "y").reshape(2, 1)])] + sep),
        case("int values under a string internal type", "SparseCross", one(i64(1, 2, 3)),
             hashed_output=False, num_buckets=0, hash_key=0, out_type=tf.string,
             internal_type=tf.string),
        case("batch sizes differ", "SparseCrossV2", one(i64(1, 2, 3), [strs("x").reshape(1, 1)], sep)),
        case("separator not a scalar", "SparseCrossV2", one(i64(1, 2, 3), (), [("sep", strs("a"))])),
        case("values of another length", "SparseCrossV2", one(i64(1, 2), (), sep)),
        case("shape of three", "SparseCrossV2",
             [("indices", [ind]), ("values", [i64(1, 2, 3)]), ("shapes", [i64(2, 2, 2)]),
              ("dense_inputs", [])] + sep),
        case("dense vector", "SparseCrossV2", [("indices", []), ("values", []), ("shapes", []),
                                               ("dense_inputs", [strs("x")])] + sep),
        case("indices of three columns", "SparseCrossV2",
             [("indices", [i64([0, 0, 0])]), ("values", [i64(1)]), ("shapes", [sh]),
              ("dense_inputs", [])] + sep),
        case("values matrix", "SparseCrossV2", one(i64([1, 2, 3]), (), sep)),
        case("salt of three", "SparseCrossHashed",
             one(i64(1, 2, 3), (), [("num_buckets", np.int64(0)), ("strong_hash", False),
                                    ("salt", i64(1, 2, 3))])),
    ]
    return out


def fill_cases():
    f32 = lambda *v: np.array(v, np.float32)  # noqa: E731
    out = []
    for label, rows, width, dtype in [("float32", 8, 3, np.float32), ("int64", 10, 2, np.int64),
                                      ("float64", 5, 4, np.float64)]:
        idx, vals, shape = sparse_column(rows, width, lambda n: rng.integers(-9, 9, n).astype(dtype))
        out.append(case(f"random {label}", "SparseFillEmptyRows",
                        [("indices", idx), ("values", vals), ("dense_shape", shape),
                         ("default_value", dtype(-1))]))
    ins = lambda i, v, s, d: [("indices", i), ("values", v), ("dense_shape", s), ("default_value", d)]  # noqa: E731
    out += [
        case("unsorted rows", "SparseFillEmptyRows", ins(i64([2, 1], [0, 0]), f32(1, 2), i64(4, 3), np.float32(9))),
        case("repeated and unsorted within a row", "SparseFillEmptyRows",
             ins(i64([1, 1], [1, 1], [1, 0]), np.array([1, 2, 3], np.int32), i64(3, 3), np.int32(0))),
        case("strings", "SparseFillEmptyRows", ins(i64([1, 1]), strs("a"), i64(3, 3), np.bytes_(b"z"))),
        case("bools, rank 3", "SparseFillEmptyRows",
             ins(i64([0, 1, 1], [2, 0, 1]), np.array([True, True]), i64(4, 2, 2), np.bool_(False))),
        case("all rows full", "SparseFillEmptyRows", ins(i64([0, 1], [1, 0]), f32(1, 2), i64(2, 2), np.float32(0))),
        case("no rows", "SparseFillEmptyRows",
             ins(np.zeros([0, 2], np.int64), np.zeros([0], np.float32), i64(0, 3), np.float32(9))),
        case("no entries", "SparseFillEmptyRows",
             ins(np.zeros([0, 2], np.int64), np.zeros([0], np.float32), i64(3, 3), np.float32(9))),
        case("row past the shape", "SparseFillEmptyRows", ins(i64([5, 1], [0, 0]), f32(1, 2), i64(4, 3), np.float32(9))),
        case("negative row", "SparseFillEmptyRows", ins(i64([-1, 1], [0, 0]), f32(1, 2), i64(4, 3), np.float32(9))),
        case("default not a scalar", "SparseFillEmptyRows", ins(i64([0, 1]), f32(1), i64(4, 3), f32(9))),
        case("values of another length", "SparseFillEmptyRows", ins(i64([0, 1]), f32(1, 2), i64(4, 3), np.float32(9))),
        case("indices a vector", "SparseFillEmptyRows", ins(i64(0, 1), f32(1, 2), i64(4, 3), np.float32(9))),
        case("dense shape a matrix", "SparseFillEmptyRows", ins(i64([0, 1]), f32(1), i64([4, 3]), np.float32(9))),
        case("empty dense shape", "SparseFillEmptyRows",
             ins(np.zeros([1, 0], np.int64), f32(1), np.zeros([0], np.int64), np.float32(9))),
        case("entries in no rows", "SparseFillEmptyRows", ins(i64([0, 1]), f32(1), i64(0, 3), np.float32(9))),
    ]
    g = lambda m, v: [("reverse_index_map", m), ("grad_values", v)]  # noqa: E731
    out += [
        case("grad", "SparseFillEmptyRowsGrad", g(i64(0, 3, 1), f32(1, 2, 3, 4, 5))),
        case("grad float64", "SparseFillEmptyRowsGrad", g(i64(2, 0), np.array([0.5, 1.5, 2.5], np.float64))),
        case("grad, index past the end", "SparseFillEmptyRowsGrad", g(i64(0, 7, 1), f32(1, 2, 3, 4, 5))),
        case("grad, negative index", "SparseFillEmptyRowsGrad", g(i64(0, -1, 1), f32(1, 2, 3, 4, 5))),
        case("grad, map a matrix", "SparseFillEmptyRowsGrad", g(i64([0]), f32(1))),
        case("grad, values a matrix", "SparseFillEmptyRowsGrad", g(i64(0), np.ones([1, 1], np.float32))),
    ]
    return out


def reshape_cases():
    r = lambda i, s, n: [("input_indices", i), ("input_shape", s), ("new_shape", n)]  # noqa: E731
    idx, _, shape = sparse_column(6, 4, ints)
    out = [
        case("random to [3, -1, 2]", "SparseReshape", r(idx, shape, i64(3, -1, 2))),
        case("random to a vector", "SparseReshape", r(idx, shape, i64(-1))),
        case("to [3, -1]", "SparseReshape", r(i64([0, 1], [1, 2]), i64(2, 3), i64(3, -1))),
        case("same shape", "SparseReshape", r(i64([0, 1], [1, 2]), i64(2, 3), i64(2, 3))),
        case("rank 3 to rank 1", "SparseReshape", r(i64([0, 1, 1], [1, 0, 2]), i64(2, 2, 3), i64(12))),
        case("scalar to [1, 1]", "SparseReshape", r(np.zeros([1, 0], np.int64), np.zeros([0], np.int64), i64(1, 1))),
        case("index past the shape", "SparseReshape", r(i64([0, 7]), i64(2, 3), i64(6))),
        case("empty to [0, 5]", "SparseReshape", r(np.zeros([0, 2], np.int64), i64(0, 3), i64(0, 5))),
        case("two -1", "SparseReshape", r(i64([0, 1], [1, 2]), i64(2, 3), i64(-1, -1))),
        case("-2", "SparseReshape", r(i64([0, 1], [1, 2]), i64(2, 3), i64(-2, 3))),
        case("sizes differ", "SparseReshape", r(i64([0, 1], [1, 2]), i64(2, 3), i64(4, 2))),
        case("not a multiple", "SparseReshape", r(i64([0, 1], [1, 2]), i64(2, 3), i64(4, -1))),
        case("rank mismatch", "SparseReshape", r(i64([0, 1], [1, 2]), i64(2, 3, 1), i64(6))),
        case("cannot infer from empty", "SparseReshape", r(np.zeros([0, 2], np.int64), i64(0, 3), i64(0, -1))),
        case("indices a vector", "SparseReshape", r(i64(0, 1), i64(2, 3), i64(6))),
        case("shape a matrix", "SparseReshape", r(i64([0, 1]), i64([2, 3]), i64(6))),
        case("new shape a matrix", "SparseReshape", r(i64([0, 1]), i64(2, 3), i64([6]))),
    ]
    return out


def write(name, text):
    path = os.path.join(TMP, name)
    with open(path, "wb") as f:
        f.write(text)
    return path


def tables():
    """Sequences of lookup ops, each on a table its first step creates."""
    vocab = write("vocab.txt", b"apple\t3\nbanana\t5\ncherry\tx\n")
    empty_line = write("empty_line.txt", b"a b\n\nc d\n")
    crlf = write("crlf.txt", b"one\r\ntwo\r\n")
    empty = write("empty.txt", b"")
    S, I, F, D, I32 = tf.string, tf.int64, tf.float32, tf.float64, tf.int32
    counter = [0]

    def table(name, k, v, steps, mutable=False):
        counter[0] += 1
        op = "MutableHashTableV2" if mutable else "HashTableV2"
        attrs = dict(key_dtype=k, value_dtype=v, shared_name=f"table_{counter[0]}")
        h = getattr(raw, op)(**attrs)
        done = [dict(op=op, attrs={a: encode_attr(x) for a, x in attrs.items()}, inputs=[])]
        for step in steps:
            sop, ins, sattrs = step[0], step[1], (step[2] if len(step) > 2 else {})
            kwargs = {a: (x if isinstance(x, str) and a == "filename" else tf.constant(x)) for a, x in ins}
            res = run(lambda: getattr(raw, sop)(table_handle=h, **kwargs, **sattrs))
            node_attrs = dict(sattrs)
            dts = [tf.as_dtype(np.asarray(x).dtype) if np.asarray(x).dtype.kind not in "OSU" else tf.string
                   for _, x in ins]
            if sop in ("LookupTableFindV2", "LookupTableInsertV2", "LookupTableImportV2"):
                node_attrs.update(Tin=dts[0], Tout=dts[1])
            elif sop == "InitializeTableV2":
                node_attrs.update(Tkey=dts[0], Tval=dts[1])
            done.append(dict(op=sop, attrs={a: encode_attr(x) for a, x in node_attrs.items()},
                             inputs=[encode(np.array(x.encode()) if isinstance(x, str) else x) for _, x in ins],
                             **res))
        return dict(name=name, steps=done)

    find = lambda keys, d: ("LookupTableFindV2", [("keys", keys), ("default_value", d)])  # noqa: E731
    init = lambda k, v: ("InitializeTableV2", [("keys", k), ("values", v)])  # noqa: E731
    imp = lambda k, v: ("LookupTableImportV2", [("keys", k), ("values", v)])  # noqa: E731
    ins = lambda k, v: ("LookupTableInsertV2", [("keys", k), ("values", v)])  # noqa: E731
    size = ("LookupTableSizeV2", [])
    export = lambda k, v: ("LookupTableExportV2", [], dict(Tkeys=k, Tvalues=v))  # noqa: E731
    text = lambda path, **a: ("InitializeTableFromTextFileV2", [("filename", path)], a)  # noqa: E731
    vocab_words = strs(*[f"w{i}" for i in range(50)])
    ids = np.arange(50, dtype=np.int64) * 3
    out = [
        table("string to int64, initialized", S, I, [
            find(strs("a"), np.int64(-1)), size, export(S, I),
            init(strs("a", "b", "a"), i64(1, 2, 1)),
            init(strs("x", "y", "z"), i64(7, 8, 9)),
            init(strs("x"), i64(7)),
            imp(strs("x"), i64(7)),
            find(strs("a", "q", "b", "a").reshape(2, 2), np.int64(-1)),
            find(np.array(b"b", dtype=object), np.int64(-1)),
            find(strs("a", "z"), i64(-1, -2)),
            find(strs("a", "z"), i64(-1, -2, -3)),
            find(i64(1), np.int64(-1)),
            find(strs("a"), np.int32(-1)),
            ins(strs("a"), i64(1)),
            size, export(S, I)]),
        table("failed initializers", S, I, [
            init(i64(1), i64(1)),
            ("InitializeTableV2", [("keys", strs("a").reshape(1, 1)), ("values", i64(1))]),
            ("InitializeTableV2", [("keys", strs("a")), ("values", i64([1]))]),
            init(strs("a", "b"), i64(1)),
            init(strs("a", "a"), i64(1, 2)),
            size]),
        table("string to int64, imported vocabulary", S, I, [
            imp(vocab_words, ids), find(words(30), np.int64(-7)),
            find(strs("w3", "w49", "w50"), np.int64(-7)), size, export(S, I)]),
        table("int64 to int64", I, I, [imp(ids, ids + 1), find(rng.integers(0, 160, 40).astype(np.int64), np.int64(0)), size]),
        table("int64 to string", I, S, [init(i64(3, 5, 7), strs("three", "five", "seven")),
                                         find(i64(5, 4, 3), np.bytes_(b"?"))]),
        table("string to string", S, S, [init(strs("a", "b"), strs("A", "B")), find(strs("b", "c"), np.bytes_(b""))]),
        table("string to float", S, F, [init(strs("a", "b"), np.array([0.5, -2.25], np.float32)),
                                        find(strs("b", "c", "a"), np.float32(np.nan))]),
        table("int32 to double", I32, D, [init(np.array([1, 2], np.int32), np.array([0.1, 0.2])),
                                          find(np.array([2, 3], np.int32), np.float64(-1))]),
        table("mutable int64 to string", I, S, [
            find(i64(1, 2), np.bytes_(b"d")),
            ins(i64(1, 2, 1), strs("a", "b", "c")),
            find(i64(1, 2, 3), np.bytes_(b"d")),
            find(i64(1, 5, 3), strs("x", "y", "z")),
            ins(i64(1, 2), strs("a")),
            ins(i64([1, 2]), strs("a", "b").reshape(1, 2)),
            size,
            imp(i64(9), strs("n")), size, export(I, S),
            init(i64(9), strs("n")),
            text(vocab, key_index=-1, value_index=-2)], mutable=True),
    ]
    for name, k, v, path, a in [
        ("words to line numbers", S, I, vocab, dict(key_index=0, value_index=-1)),
        ("line numbers with offset", S, I, vocab, dict(key_index=0, value_index=-1, offset=10)),
        ("a bad int64 column", S, I, vocab, dict(key_index=0, value_index=1)),
        ("line numbers to lines", I, S, vocab, dict(key_index=-1, value_index=-2)),
        ("lines to words, two of them", S, S, vocab, dict(key_index=-2, value_index=0, vocab_size=2)),
        ("vocab_size past the end", S, I, vocab, dict(key_index=0, value_index=-1, vocab_size=5)),
        ("a column past the line", S, I, vocab, dict(key_index=3, value_index=-1)),
        ("line-number keys of strings", S, S, vocab, dict(key_index=-1, value_index=0)),
        ("line-number values of floats", S, F, vocab, dict(key_index=0, value_index=-1)),
        ("an empty line", S, I, empty_line, dict(key_index=0, value_index=-1, delimiter=" ")),
        ("CRLF lines", S, I, crlf, dict(key_index=-2, value_index=-1)),
        ("an empty file", S, I, empty, dict(key_index=-2, value_index=-1)),
        ("an empty file, vocab_size 2", S, I, empty, dict(key_index=-2, value_index=-1, vocab_size=2)),
        ("a missing file", S, I, os.path.join(TMP, "missing.txt"), dict(key_index=-2, value_index=-1)),
        ("float values", S, F, vocab, dict(key_index=0, value_index=1, vocab_size=2)),
        ("int32 values take the offset", S, I32, vocab, dict(key_index=0, value_index=1, vocab_size=2, offset=100)),
    ]:
        out.append(table(f"text file: {name}", k, v, [text(path, **a), size, export(k, v)]))
    out.append(table("text file twice", S, I, [
        text(vocab, key_index=0, value_index=-1), text(crlf, key_index=-2, value_index=-1), size]))
    return out


def gradients():
    out = []
    for indices, shape in [(i64([0, 1], [2, 0], [2, 2]), i64(4, 3)), (i64([1, 0], [0, 1], [1, 1]), i64(3, 2))]:
        values = tf.constant(rng.uniform(-1, 1, len(indices)))
        default = tf.constant(np.float64(0.25))
        with tf.GradientTape() as tape:
            tape.watch([values, default])
            y = raw.SparseFillEmptyRows(indices=indices, values=values, dense_shape=shape,
                                        default_value=default)
            w = tf.constant(rng.uniform(-1, 1, y.output_values.shape))
            loss = tf.reduce_sum(y.output_values * w)
        dv, dd = tape.gradient(loss, [values, default])
        out.append(dict(indices=encode(indices), shape=encode(shape), values=encode(values.numpy()),
                        default=encode(default.numpy()), weights=encode(w.numpy()),
                        grads=[encode(dv.numpy()), encode(dd.numpy())]))
    return out


def graph():
    """A tf.compat.v1 feature-column graph: vocabulary list and file columns, a crossed
    column, indicator and embedding columns into input_layer."""
    vocab = write("colors.txt", b"red\ngreen\nblue\n")
    g = tf.Graph()
    with g.as_default():
        feats = {"word": tf.compat.v1.placeholder(tf.string, [None, 2], name="word"),
                 "color": tf.compat.v1.placeholder(tf.string, [None, 1], name="color"),
                 "size": tf.compat.v1.placeholder(tf.int64, [None, 1], name="size")}
        word = fc.categorical_column_with_vocabulary_list("word", ["x", "y", "z"], num_oov_buckets=2)
        color = fc.categorical_column_with_vocabulary_file("color", vocab, vocabulary_size=3,
                                                           default_value=0)
        size = fc.categorical_column_with_vocabulary_list("size", [3, 5, 7], default_value=0)
        crossed = fc.crossed_column([word, "size"], 20)
        crossed2 = fc.crossed_column(["color", "word"], 11)
        table = np.linspace(-1, 1, 12).reshape(4, 3)
        emb = fc.embedding_column(size, 3, initializer=tf.compat.v1.constant_initializer(table[:3]))
        emb2 = fc.embedding_column(crossed2, 2, combiner="sqrtn",
                                   initializer=tf.compat.v1.constant_initializer(np.linspace(0, 1, 22)))
        out = fc.input_layer(feats, [fc.indicator_column(word), fc.indicator_column(color),
                                     fc.indicator_column(crossed), emb, emb2])
        init = tf.group(tf.compat.v1.tables_initializer(), tf.compat.v1.global_variables_initializer(),
                        name="init")
    feeds = {"word:0": np.array([[b"x", b"q"], [b"", b"z"], [b"y", b"y"], [b"", b""]], dtype=object),
             "color:0": np.array([[b"blue"], [b"red"], [b""], [b"pink"]], dtype=object),
             "size:0": np.array([[5], [-1], [7], [4]], np.int64)}
    with tf.compat.v1.Session(graph=g) as s:
        s.run(init)
        got = s.run(out, {g.get_tensor_by_name(k): v for k, v in feeds.items()})
    return dict(graph_def=g.as_graph_def().SerializeToString().hex(), init=init.name,
                feeds={k: encode(v) for k, v in feeds.items()}, fetch=out.name,
                value=encode(got))


def main():
    cases = cross_cases() + fill_cases() + reshape_cases()
    print(json.dumps(dict(cases=cases, tables=tables(), gradients=gradients(), graph=graph())))


if __name__ == "__main__":
    main()
