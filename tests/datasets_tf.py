"""TensorFlow's side of tests/datasets.rs: tf.data pipelines as TensorFlow 1 programs write
them (graph mode, one-shot and initializable iterators), each built in its own graph, walked
to its end by TensorFlow's own session, and printed with its GraphDef as one JSON line.

    python3 tests/datasets_tf.py DIR

DIR is where the file sources' files are written (TFRecord, GZIP TFRecord, text lines, fixed
length records); the graphs name them by their path there. Each case carries the GraphDef
(base64), the fetches of its get_next, the initializer to run first (if any), and either every
element TensorFlow produced, in order, or the error it gave (code and message). Tensors are
{"dtype", "shape", "values"}, strings as hex.
"""
import gzip
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()
DIR = sys.argv[1]
MAX_ELEMENTS = 400


def encode(value):
    a = np.asarray(value)
    if a.dtype.kind in "SO":
        values = [bytes(v).hex() for v in a.reshape(-1)]
        dtype = "string"
    else:
        values = a.reshape(-1).tolist()
        dtype = str(a.dtype)
    return {"dtype": dtype, "shape": list(a.shape), "values": values}


CODES = {
    tf.errors.InvalidArgumentError: "INVALID_ARGUMENT",
    tf.errors.NotFoundError: "NOT_FOUND",
    tf.errors.DataLossError: "DATA_LOSS",
    tf.errors.FailedPreconditionError: "FAILED_PRECONDITION",
    tf.errors.PermissionDeniedError: "PERMISSION_DENIED",
    tf.errors.UnimplementedError: "UNIMPLEMENTED",
}


def code_of(e):
    for cls, code in CODES.items():
        if isinstance(e, cls):
            return code
    return type(e).__name__


cases = []


def case(name, build, initializable=False, runs=1):
    """Builds `build()`'s dataset in a fresh graph and walks it `runs` times (an
    initializable iterator is initialized before each walk)."""
    graph = tf.Graph()
    with graph.as_default():
        dataset = build()
        if initializable:
            iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
            init = iterator.initializer.name
        else:
            iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)
            init = None
        nxt = tf.nest.flatten(iterator.get_next())
        fetches = [t.name for t in nxt]
    walks = []
    error = None
    with tf.compat.v1.Session(graph=graph) as sess:
        for _ in range(runs):
            if init:
                sess.run(init)
            elements = []
            try:
                while len(elements) < MAX_ELEMENTS:
                    elements.append([encode(v) for v in sess.run(nxt)])
            except tf.errors.OutOfRangeError:
                pass
            except tf.errors.OpError as e:
                error = {"code": code_of(e), "message": e.message.split("\n")[0]}
            walks.append(elements)
            if error:
                break
    cases.append(
        {
            "name": name,
            "graph": graph.as_graph_def().SerializeToString().hex(),
            "fetches": fetches,
            "init": init,
            "walks": walks,
            "error": error,
        }
    )


rng = np.random.default_rng(20261128)
features = rng.normal(size=(20, 3)).astype(np.float32)
labels = np.arange(20, dtype=np.int64)
D = tf.data.Dataset

case(
    "slices_map_shuffle_repeat_batch_prefetch",
    lambda: D.from_tensor_slices((features, labels))
    .map(lambda a, b: (a * 2.0, b + 1))
    .shuffle(7, seed=5)
    .repeat(2)
    .batch(4)
    .prefetch(2),
)
case(
    "range_filter_batch_drop_remainder",
    lambda: D.range(10).filter(lambda x: x % 3 != 0).batch(3, drop_remainder=True),
    initializable=True,
    runs=2,
)
case(
    "shuffle_reshuffles_each_epoch",
    lambda: D.range(12).shuffle(5, seed=1).repeat(3),
)
case(
    "shuffle_same_order_each_epoch",
    lambda: D.range(12).shuffle(5, seed=1, reshuffle_each_iteration=False).repeat(2),
)
case(
    "shuffle_buffer_larger_than_data",
    lambda: D.range(6).shuffle(100, seed=42).repeat(2),
)
case(
    "shuffle_reinitialized_walks_differ",
    lambda: D.range(8).shuffle(8, seed=3),
    initializable=True,
    runs=2,
)
case(
    "interleave_cycle_and_block",
    lambda: D.range(1, 5).interleave(
        lambda x: D.range(x * 10, x * 10 + x), cycle_length=2, block_length=2
    ),
)
case(
    "parallel_interleave_deterministic",
    lambda: D.range(1, 6).interleave(
        lambda x: D.from_tensors(x).repeat(x),
        cycle_length=3,
        block_length=1,
        num_parallel_calls=2,
    ),
)
case("flat_map", lambda: D.range(4).flat_map(lambda x: D.range(x)))
case(
    "padded_batch",
    lambda: D.range(1, 6)
    .map(lambda x: tf.fill([x], x))
    .padded_batch(2, padded_shapes=[None], padding_values=tf.constant(-1, tf.int64)),
)
case(
    "padded_batch_fixed_shape",
    lambda: D.range(1, 4)
    .map(lambda x: (tf.fill([x, 2], tf.cast(x, tf.float32)), tf.strings.as_string(x)))
    .padded_batch(2, padded_shapes=([4, 2], []), padding_values=(0.5, b"pad")),
)
case(
    "zip_concatenate_take_skip",
    lambda: D.zip((D.range(5), D.range(10, 20)))
    .concatenate(D.zip((D.range(100, 103), D.range(200, 203))))
    .skip(1)
    .take(6),
)
case("shard", lambda: D.range(11).shard(3, 1))
case("unbatch", lambda: D.from_tensor_slices(np.arange(12).reshape(3, 2, 2)).unbatch())
case(
    "parallel_map_prefetch_autotune",
    lambda: D.range(40)
    .map(lambda x: tf.cast(x, tf.float32) * 0.5, num_parallel_calls=tf.data.AUTOTUNE)
    .batch(6)
    .prefetch(tf.data.AUTOTUNE),
)
case(
    "cache_repeat",
    lambda: D.range(5).map(lambda x: x * x).cache().repeat(3),
)
case("map_with_captured_tensor", lambda: D.range(5).map(lambda x: x + tf.constant(7, tf.int64)))
case(
    "tensor_dataset_repeat_take",
    lambda: D.from_tensors((tf.constant([1.0, 2.0]), tf.constant("a"))).repeat().take(3),
)
case(
    "parallel_map_fails_after_good_elements",
    lambda: D.range(6).map(
        lambda x: tf.reshape(tf.fill([1 + tf.cast(x >= 2, tf.int32)], x), [1]),
        num_parallel_calls=3,
        deterministic=True,
    ),
)
case(
    "map_function_fails",
    lambda: D.range(3).map(lambda x: tf.reshape(tf.fill([x + 1], x), [2])),
)

# The file sources, over files written here.
records = [b"record-%d" % i * (i + 1) for i in range(7)]
tfrecord = os.path.join(DIR, "plain.tfrecord")
with tf.io.TFRecordWriter(tfrecord) as w:
    for r in records:
        w.write(r)
gzipped = os.path.join(DIR, "packed.tfrecord.gz")
with tf.io.TFRecordWriter(gzipped, options="GZIP") as w:
    for r in records[:4]:
        w.write(r)
zlibbed = os.path.join(DIR, "packed.tfrecord.z")
with tf.io.TFRecordWriter(zlibbed, options="ZLIB") as w:
    for r in records[2:]:
        w.write(r)
text = os.path.join(DIR, "lines.txt")
with open(text, "wb") as f:
    f.write(b"first line\nsecond, with a comma\r\n\nlast without newline")
fixed = os.path.join(DIR, "fixed.bin")
with open(fixed, "wb") as f:
    f.write(b"HEADER" + bytes(range(40)) + b"FOOT")
corrupt = os.path.join(DIR, "corrupt.tfrecord")
with open(tfrecord, "rb") as f:
    good = bytearray(f.read())
good[30] ^= 0xFF
with open(corrupt, "wb") as f:
    f.write(bytes(good))

case("tfrecord", lambda: tf.data.TFRecordDataset([tfrecord, gzipped], compression_type=""))
case("tfrecord_gzip", lambda: tf.data.TFRecordDataset(gzipped, compression_type="GZIP"))
case("tfrecord_zlib", lambda: tf.data.TFRecordDataset(zlibbed, compression_type="ZLIB"))
case("text_lines", lambda: tf.data.TextLineDataset(text))
case(
    "fixed_length_records",
    lambda: tf.data.FixedLengthRecordDataset(fixed, 8, header_bytes=6, footer_bytes=4),
)
case("tfrecord_corrupt", lambda: tf.data.TFRecordDataset(corrupt))
case("tfrecord_missing_file", lambda: tf.data.TFRecordDataset(os.path.join(DIR, "absent")))

print(json.dumps({"cases": cases, "dir": DIR}))
