#!/usr/bin/env python3
"""TensorFlow 1 programs as their users wrote them (tf.compat.v1: a cluster of ps and worker
tasks, replica_device_setter, MonitoredTrainingSession, StopAtStepHook, a checkpoint_dir),
run unchanged on stock TensorFlow servers or against a cluster whose tasks may be tessera's.

Usage:
  tensorflow_v1.py PROGRAM --alone [--workers N] [--steps N] [options]
      Starts one ps and N worker tasks (stock tf.distribute.Server, in this process, on
      127.0.0.1 ports the OS picks) and runs worker 0 .. N-1 of PROGRAM against them, one
      thread each. Prints one JSON line: worker 0's results, the others' under "others".
  tensorflow_v1.py PROGRAM --master grpc://HOST:PORT --ps ADDR,... --worker ADDR,...
                   --index I [--no-cluster-def] [options]
      Runs worker I of PROGRAM (worker 0 is the chief: it initialises, restores and saves
      checkpoints) through the master at HOST:PORT, the cluster's tasks named by --ps and
      --worker. The session's ConfigProto carries the cluster (cluster_def) unless
      --no-cluster-def (a TensorFlow server refuses one naming itself) and device filters
      (/job:ps and this worker). The chief prints "ready" once the model is initialised
      (start the other workers then). Prints one JSON line: this worker's results.
  tensorflow_v1.py server JOB INDEX --ps ADDR,... --worker ADDR,...
      Serves task INDEX of JOB (tf.distribute.Server) in that cluster. Prints
      "tensorflow: serving grpc://HOST:PORT", then serves until stdin closes.

PROGRAM:
  classic  A 64-128-10 ReLU MLP on scikit-learn's digits (pixels / 16; 1437 training and 360
           held-out images, split by a fixed permutation), batch 32, Adagrad 0.1, a global
           step; variables on the ps.
  sync     The same MLP and optimizer wrapped in SyncReplicasOptimizer (the gradients of every
           worker aggregated per update; the chief's queue runner applies them).
  rnn      The digits read row by row (8 steps of 8 features) by tf.compat.v1.nn.dynamic_rnn
           with an LSTM cell (32 units; --cell gru for a GRU), a dense softmax on the last
           state, Adam 0.01; variables on the ps.
  cnn      The digits as 8x8 images: two 3x3 SAME convolutions (16 and 32 filters) each with
           ReLU and 2x2 max pooling, a dense softmax, Momentum 0.05 (0.9); variables over two
           ps tasks.
  embedding
           Each image as 64 ids (pixel position x 17 + its value 0..16) looked up in a
           1088 x 16 table partitioned over the ps tasks (fixed_size_partitioner, --partitions
           shards, embedding_lookup's --partition-strategy) and summed, then a dense softmax;
           Adagrad 0.1, whose gradient for the table is sparse (the looked-up rows only).
  pipeline The classic MLP fed by a tf.data pipeline in the graph instead of feed_dict: the
           training digits as uint8 pixels with int64 labels (from_tensor_slices), a map that
           scales the pixels, shuffle seeded per worker, repeat, batch 32, prefetch; a
           one-shot iterator (--iterator initializable: one initialised by the scaffold's
           local_init_op); accuracy by tf.compat.v1.nn.in_top_k. With --epochs N the data
           ends after N passes and the monitored session stops at the OutOfRangeError; with
           --save-iterator the chief's checkpoints hold the iterator's position
           (make_saveable_from_iterator), so a restart resumes the input where it stopped;
           with --source tfrecord the images come as tf.train.Examples from a TFRecord file
           the program writes, shuffled, batched and parsed by tf.io.parse_example.
  wide_deep
           A wide-and-deep recommender from tf.compat.v1.feature_column on synthetic clicks
           (4000 training and 1000 held-out rows, a seeded logistic model of a user, an item,
           a country, a device and an age): string ids hashed into buckets, the country from a
           vocabulary list and the device from a vocabulary file (lookup tables), the age
           bucketized, a crossed item x country column; linear_model over the sparse columns
           (Ftrl 0.2) and input_layer over sqrtn embeddings, an indicator and the numeric age
           into a 32-16 ReLU tower (Adagrad 0.1); every table partitioned over the ps tasks
           (fixed_size_partitioner(2)); input from tf.data (slices of the columns, shuffle,
           repeat, batch 32, a one-shot iterator). Sigmoid cross entropy; eval_loss is the
           held-out log loss.

Options:
  --v2-behavior off        tf.compat.v1.disable_v2_behavior(): reference variables (VariableV2,
                           Assign, Apply*) and v1 control flow (Switch/Merge/Enter/Exit/
                           NextIteration; dynamic_rnn's TensorArray, Stacks in its gradient).
                           The default, and the only choice for sync.
  --v2-behavior eager-only only tf.compat.v1.disable_eager_execution(): resource variables and
                           TensorFlow 2 control flow (functional While over TensorLists).
  --steps N                StopAtStepHook(last_step=N) (classic, sync, cnn and embedding 200,
                           rnn 100). A chief whose checkpoint_dir holds a checkpoint restores
                           it.
  --evaluate-only          Open the session (the chief restores its checkpoint), train no step,
                           evaluate.
  --ps-tasks N             (--alone) How many ps tasks (cnn and embedding 2, the others 1).
  --partitions N           (embedding) The table's shards, 2 by default (with --partitioner
                           min_max: at most N).
  --partitioner P          (embedding) fixed (fixed_size_partitioner(N), the default) or
                           min_max (min_max_variable_partitioner(N, min_slice_size=16 KiB):
                           3 shards of the 68 KiB table for N >= 3).
  --partition-strategy S   (embedding) embedding_lookup's "mod" (the default: id i in shard
                           i mod N) or "div" (ids in contiguous ranges, as the shards slice the
                           whole table, so that a checkpoint restores under another --partitions
                           to the same model; under "mod" an id's row moves with N).
  --checkpoint-dir DIR     The chief's checkpoint_dir (default: a new temporary directory,
                           removed at exit).
  --operation-timeout-ms N (sync) The sessions' operation timeout, 4000 by default: once the
                           chief stops, its queue runner waits for gradients no worker sends
                           (TensorFlow's own behaviour), until this timeout.

Results (JSON): program, v2_behavior, worker, first_loss (this worker's first step), last_loss,
local_steps, global_step (read after training), train_seconds (from this worker's first step
to its last, the evaluation left out), accuracy and eval_loss (on the held-out images),
variable_devices, variable_ops (the op types of the variables), control_flow_ops (the control
flow, TensorArray, Stack and TensorList op types in the graph and its functions), checkpoint (the chief's last
checkpoint's basename and the global step in it).

Every run is seeded: with one worker the first loss, the global step and the checkpoint are
the same on every run and every runtime (the losses after the first depend on float rounding
of the runtime). Exits 2 when TensorFlow cannot be imported.
"""

import argparse
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# tf.compat.v1.nn.rnn_cell lives in tf-keras (Keras 2) under TensorFlow 2.16 and later.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

try:
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits
except ImportError as e:  # pragma: no cover - depends on the host
    print(f"tensorflow_v1: {e}; pip install tensorflow-cpu tf-keras scikit-learn", file=sys.stderr)
    sys.exit(2)

BATCH = 32
CONTROL_FLOW = re.compile(r"Switch|Merge|Enter|Exit|NextIteration|LoopCond|While|If$|TensorArray|Stack|TensorList|PartitionedCall")
DEFAULT_STEPS = {"classic": 200, "sync": 200, "rnn": 100, "cnn": 200, "embedding": 200, "pipeline": 200,
                 "wide_deep": 300}
DEFAULT_PS_TASKS = {"cnn": 2, "embedding": 2, "wide_deep": 2}
# The embedding program's ids: pixel position x 17 + the pixel's value (0..16).
LEVELS = 17
VOCABULARY = 64 * LEVELS


# ---------------------------------------------------------------------------------------------
# The cluster


def cluster_spec(ps, workers):
    jobs = {"worker": list(workers)}
    if ps:
        jobs["ps"] = list(ps)
    return tf.train.ClusterSpec(jobs)


def split(addresses):
    return [a for a in addresses.split(",") if a]


def serve(args):
    spec = cluster_spec(split(args.ps), split(args.worker))
    server = tf.distribute.Server(spec, job_name=args.job, task_index=args.index, start=True)
    print(f"tensorflow: serving {server.target}", flush=True)
    sys.stdin.read()  # until the caller closes our stdin (or dies)


def free_port():
    """A port on 127.0.0.1 the OS has just handed out (a TensorFlow task of a cluster must know
    its peers' ports before it starts, so it cannot bind port 0 itself)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# Data


def digits():
    """scikit-learn's 1797 digits, pixels scaled to [0, 1]: (train_x, train_y, test_x, test_y)
    split 1437/360 by a fixed permutation."""
    data = load_digits()
    xs = (data.data / 16.0).astype(np.float32)
    ys = data.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(xs))
    train, test = order[:1437], order[1437:]
    return xs[train], ys[train], xs[test], ys[test]


COUNTRIES = ["DE", "FR", "JP", "US"]
DEVICES = ["desktop", "phone", "tablet"]


def clicks():
    """Synthetic clicks for the wide_deep program: columns (dicts of numpy arrays) and 0/1
    labels drawn from a seeded logistic model, (train_x, train_y, test_x, test_y) 4000/1000.
    A click's odds are a user's and an item's own, an item's taste per country (what the
    crossed column learns), a device's and an age band's."""
    rng = np.random.default_rng(7)
    rows = 5000
    users, items = 100, 40
    user = rng.integers(0, users, rows)
    item = rng.integers(0, items, rows)
    country = rng.integers(0, len(COUNTRIES), rows)
    device = rng.integers(0, len(DEVICES), rows)
    age = rng.uniform(18, 70, rows).astype(np.float32)
    user_bias = rng.normal(0, 1.0, users)
    item_bias = rng.normal(0, 0.5, items)
    taste = rng.normal(0, 1.0, (items, len(COUNTRIES)))
    device_bias = np.array([0.3, -0.2, 0.1])
    band = np.digitize(age, [25, 35, 45, 55])
    band_bias = np.array([0.6, 0.2, -0.1, -0.3, -0.6])
    logit = (user_bias[user] + item_bias[item] + taste[item, country] + device_bias[device]
             + band_bias[band])
    label = (rng.uniform(size=rows) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    columns = {
        "user": np.array([b"user_%d" % u for u in user]),
        "item": np.array([b"item_%d" % i for i in item]),
        "country": np.array([COUNTRIES[c].encode() for c in country]),
        "device": np.array([DEVICES[d].encode() for d in device]),
        "age": age,
    }
    train = {k: v[:4000] for k, v in columns.items()}
    test = {k: v[4000:] for k, v in columns.items()}
    return train, label[:4000], test, label[4000:]


class Batches:
    """Worker `index`'s batches: its own permutation of the training set, 32 at a time."""

    def __init__(self, xs, ys, index):
        self.xs, self.ys = xs, ys
        self.rng = np.random.default_rng(100 + index)
        self.order, self.at = self.rng.permutation(len(xs)), 0

    def next(self):
        if self.at + BATCH > len(self.order):
            self.order, self.at = self.rng.permutation(len(self.xs)), 0
        chosen = self.order[self.at : self.at + BATCH]
        self.at += BATCH
        return self.xs[chosen], self.ys[chosen]


# ---------------------------------------------------------------------------------------------
# Models


def dense(x, n_in, n_out, name, seed):
    w = tf.compat.v1.get_variable(
        name + "/w", [n_in, n_out], initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed)
    )
    b = tf.compat.v1.get_variable(name + "/b", [n_out], initializer=tf.compat.v1.zeros_initializer())
    return tf.nn.bias_add(tf.matmul(x, w), b)


def mlp(x):
    hidden = tf.nn.relu(dense(x, 64, 128, "hidden", seed=1))
    return dense(hidden, 128, 10, "logits", seed=2)


def rnn(x, cell_kind):
    """Reads each image row by row: 8 steps of 8 features."""
    rows = tf.reshape(x, [-1, 8, 8])
    init = tf.compat.v1.glorot_uniform_initializer(seed=3)
    with tf.compat.v1.variable_scope("rnn", initializer=init):
        if cell_kind == "gru":
            cell = tf.compat.v1.nn.rnn_cell.GRUCell(32, kernel_initializer=init)
        else:
            cell = tf.compat.v1.nn.rnn_cell.LSTMCell(32, initializer=init)
        outputs, _ = tf.compat.v1.nn.dynamic_rnn(cell, rows, dtype=tf.float32)
    return dense(outputs[:, -1, :], 32, 10, "logits", seed=4)


def conv_pool(x, n_in, n_out, name, seed):
    """A 3x3 SAME convolution with ReLU, then 2x2 max pooling (stride 2)."""
    w = tf.compat.v1.get_variable(
        name + "/w", [3, 3, n_in, n_out],
        initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed),
    )
    b = tf.compat.v1.get_variable(name + "/b", [n_out], initializer=tf.compat.v1.zeros_initializer())
    y = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w, strides=1, padding="SAME"), b))
    return tf.nn.max_pool2d(y, ksize=2, strides=2, padding="SAME")


def cnn(x):
    images = tf.reshape(x, [-1, 8, 8, 1])
    y = conv_pool(images, 1, 16, "conv1", seed=5)
    y = conv_pool(y, 16, 32, "conv2", seed=6)
    return dense(tf.reshape(y, [-1, 2 * 2 * 32]), 2 * 2 * 32, 10, "logits", seed=7)


def embedding(x, partitions, strategy, kind):
    """Bag of ids: each pixel's position and value picks a row; the rows are summed."""
    if kind == "min_max":
        partitioner = tf.compat.v1.min_max_variable_partitioner(partitions, min_slice_size=16 << 10)
    else:
        partitioner = tf.compat.v1.fixed_size_partitioner(partitions)
    levels = tf.cast(tf.round(x * (LEVELS - 1)), tf.int64)
    ids = levels + tf.range(64, dtype=tf.int64) * LEVELS
    table = tf.compat.v1.get_variable(
        "embedding", [VOCABULARY, 16],
        initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=8),
        partitioner=partitioner,
    )
    rows = tf.compat.v1.nn.embedding_lookup(table, ids, partition_strategy=strategy)
    return dense(tf.reduce_sum(rows, axis=1), 16, 10, "logits", seed=9)


def wide_deep(args, data, index):
    """The wide_deep program's input, model and training op; returns `(features, label,
    logits, train_op)` (the optimizers' updates, the global step's with Adagrad's)."""
    fc = tf.compat.v1.feature_column
    train_x, train_y = data[0], data[1]
    vocabulary = os.path.join(args.data_dir, "devices.txt")
    with open(vocabulary, "w") as f:
        f.write("\n".join(DEVICES) + "\n")
    dataset = (
        tf.data.Dataset.from_tensor_slices((train_x, train_y))
        .shuffle(len(train_y), seed=100 + index)
        .repeat()
        .batch(BATCH)
    )
    features, label = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    user = fc.categorical_column_with_hash_bucket("user", 500)
    item = fc.categorical_column_with_hash_bucket("item", 100)
    country = fc.categorical_column_with_vocabulary_list("country", COUNTRIES)
    device = fc.categorical_column_with_vocabulary_file("device", vocabulary, len(DEVICES))
    age = fc.numeric_column("age")
    age_bands = fc.bucketized_column(age, [25.0, 35.0, 45.0, 55.0])
    item_by_country = fc.crossed_column(["item", country], 400)
    wide = [user, item, country, device, age_bands, item_by_country]
    deep = [
        fc.embedding_column(user, 8, combiner="sqrtn"),
        fc.embedding_column(item, 8, combiner="sqrtn"),
        fc.indicator_column(country),
        fc.indicator_column(device),
        fc.numeric_column("age", normalizer_fn=lambda a: (a - 44.0) / 15.0),
    ]
    partitioner = tf.compat.v1.fixed_size_partitioner(2)
    with tf.compat.v1.variable_scope("wide", partitioner=partitioner):
        wide_logits = fc.linear_model(features, wide)
    with tf.compat.v1.variable_scope("deep", partitioner=partitioner):
        net = fc.input_layer(features, deep)
        init = tf.compat.v1.glorot_uniform_initializer(seed=11)
        net = tf.compat.v1.layers.dense(net, 32, tf.nn.relu, kernel_initializer=init)
        net = tf.compat.v1.layers.dense(net, 16, tf.nn.relu, kernel_initializer=init)
        deep_logits = tf.compat.v1.layers.dense(net, 1, kernel_initializer=init)
    logits = tf.squeeze(wide_logits + deep_logits, axis=1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))
    trainable = tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES
    train_wide = tf.compat.v1.train.FtrlOptimizer(0.2).minimize(
        loss, var_list=tf.compat.v1.get_collection(trainable, "wide"))
    train_deep = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(
        loss, var_list=tf.compat.v1.get_collection(trainable, "deep"),
        global_step=tf.compat.v1.train.get_or_create_global_step())
    return features, label, logits, loss, tf.group(train_wide, train_deep)


def pipeline(args, data, index):
    """The pipeline program's input: the training digits as uint8 pixels (0..16) and int64
    labels from a tf.data pipeline (from_tensor_slices, a map that scales the pixels in the
    graph, shuffle seeded per worker, repeat, batch, prefetch), walked by a one-shot or an
    initializable iterator; `(x, y, initializer)`."""
    train_x, train_y = data[0], data[1]
    pixels = np.round(train_x * 16).astype(np.uint8)
    if args.source == "tfrecord":
        # The same images as tf.train.Examples in a TFRecord file, parsed a batch at a time
        # (ParseExampleV2).
        path = os.path.join(args.data_dir, f"digits-{index}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for p, label in zip(pixels, train_y):
                writer.write(tf.train.Example(features=tf.train.Features(feature={
                    "pixels": tf.train.Feature(int64_list=tf.train.Int64List(value=p.tolist())),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                })).SerializeToString())
        spec = {"pixels": tf.io.FixedLenFeature([64], tf.int64),
                "label": tf.io.FixedLenFeature([], tf.int64)}

        def parse(records):
            parsed = tf.io.parse_example(records, spec)
            return tf.cast(parsed["pixels"], tf.float32) / 16.0, parsed["label"]

        dataset = (
            tf.data.TFRecordDataset(path)
            .shuffle(len(pixels), seed=100 + index)
            .repeat(args.epochs)
            .batch(BATCH)
            .map(parse)
            .prefetch(1)
        )
    else:
        dataset = (
            tf.data.Dataset.from_tensor_slices((pixels, train_y))
            .map(lambda p, label: (tf.cast(p, tf.float32) / 16.0, label))
            .shuffle(len(pixels), seed=100 + index)
            .repeat(args.epochs)
            .batch(BATCH)
            .prefetch(1)
        )
    if args.iterator == "one-shot":
        iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)
        initializer = None
    else:
        iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
        initializer = iterator.initializer
    if args.save_iterator:
        # The chief's checkpoints hold the iterator's position: a restarted job resumes its
        # input where it stopped.
        saveable = tf.data.experimental.make_saveable_from_iterator(iterator)
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, saveable)
    x, y = iterator.get_next()
    return x, y, initializer


def build(args, ps, workers, index, data=None):
    """The program's graph for worker `index` of `workers`, variables on the ps tasks (round
    robin; unplaced without ps)."""
    me = f"/job:worker/task:{index}"
    setter = None
    if ps:
        setter = tf.compat.v1.train.replica_device_setter(
            cluster=cluster_spec(ps, workers), worker_device=me
        )
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.device(setter):
        tf.compat.v1.set_random_seed(0)
        step = tf.compat.v1.train.get_or_create_global_step()
        initializer = None
        if args.program == "pipeline":
            x, y, initializer = pipeline(args, data, index)
        elif args.program == "wide_deep":
            x, y, logits, loss, train_op = wide_deep(args, data, index)
        else:
            x = tf.compat.v1.placeholder(tf.float32, [None, 64], name="x")
            y = tf.compat.v1.placeholder(tf.int64, [None], name="y")
        if args.program == "wide_deep":
            pass
        elif args.program == "rnn":
            logits = rnn(x, args.cell)
        elif args.program == "cnn":
            logits = cnn(x)
        elif args.program == "embedding":
            logits = embedding(x, args.partitions, args.partition_strategy, args.partitioner)
        else:
            logits = mlp(x)
        if args.program != "wide_deep":
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        if args.program == "wide_deep":
            correct = tf.equal(tf.cast(logits > 0, tf.float32), y)
        elif args.program == "pipeline":
            correct = tf.compat.v1.nn.in_top_k(logits, y, 1)
        else:
            correct = tf.equal(tf.argmax(logits, 1), y)
        accuracy = tf.reduce_mean(tf.cast(correct, tf.float32), name="accuracy")
        hooks = []
        if args.program == "rnn":
            optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
        elif args.program == "cnn":
            optimizer = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9)
        else:
            optimizer = tf.compat.v1.train.AdagradOptimizer(0.1)
        if args.program == "sync":
            optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
                optimizer, replicas_to_aggregate=len(workers), total_num_replicas=len(workers)
            )
            hooks.append(optimizer.make_session_run_hook(index == 0))
        if args.program != "wide_deep":
            train_op = optimizer.minimize(loss, global_step=step)
        variables = tf.compat.v1.global_variables()
        table_parts = [v for v in variables if re.fullmatch(r"embedding/part_\d+", v.op.name)]
        graph_def = graph.as_graph_def()
        ops = {n.op for n in graph_def.node}
        ops.update(n.op for f in graph_def.library.function for n in f.node_def)
        info = dict(
            control_flow_ops=sorted(op for op in ops if CONTROL_FLOW.search(op)),
            variable_devices=sorted({v.device for v in variables}),
            variable_ops=sorted({v.op.type for v in variables}),
            table_parts={v.op.name: [v.device, v.shape.as_list()] for v in table_parts},
            sparse_update_ops=sorted(op for op in ops if op.startswith(("SparseApply", "ResourceSparseApply"))),
        )
    return graph, dict(step=step, x=x, y=y, loss=loss, accuracy=accuracy, train_op=train_op,
                       hooks=hooks, initializer=initializer, **info)


# ---------------------------------------------------------------------------------------------
# One worker's training


class EvaluateAtEnd(tf.compat.v1.train.SessionRunHook):
    """Reads the held-out accuracy and the global step once training has stopped (`end` runs
    on the session's own tf.Session, before it closes)."""

    def __init__(self, fetches, feed):
        self.fetches, self.feed, self.values = fetches, feed, None

    def end(self, session):
        self.values = session.run(self.fetches, self.feed)


def train(args, master, ps, workers, index, data, cluster_def=None, on_ready=None):
    """Trains as worker `index` through `master`; returns this worker's results. `on_ready`
    is called once the session is open (the chief's: the model is initialised)."""
    train_x, train_y, test_x, test_y = data
    graph, m = build(args, ps, workers, index, data)
    chief = index == 0
    me = f"/job:worker/task:{index}"
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", me])
    if cluster_def is not None:
        config.cluster_def.CopyFrom(cluster_def)
    if args.program == "sync":
        # Once the chief stops, its queue runner stays blocked taking gradients that no
        # worker sends any more (and a worker whose last gradient came after the last update
        # waits for a token that never comes): a bounded operation ends those waits.
        config.operation_timeout_in_ms = args.operation_timeout_ms
    batches = Batches(train_x, train_y, index)
    losses = []
    with graph.as_default():
        if isinstance(m["x"], dict):
            # The held-out rows fed in place of the iterator's columns.
            held_out = {m["x"][k]: v for k, v in test_x.items()}
        else:
            held_out = {m["x"]: test_x}
        held_out[m["y"]] = test_y
        evaluate = EvaluateAtEnd([m["accuracy"], m["step"], m["loss"]], held_out)
        stop = tf.compat.v1.train.StopAtStepHook(last_step=args.steps)
        hooks = m["hooks"] + [stop, evaluate]
        scaffold = None
        if m["initializer"] is not None:
            scaffold = tf.compat.v1.train.Scaffold(
                local_init_op=tf.group(
                    tf.compat.v1.local_variables_initializer(), m["initializer"]
                )
            )
        started = time.perf_counter()
        # A finite dataset ends the loop with OutOfRangeError, which the monitored session
        # takes as the end of training (its hooks' `end` still run).
        with tf.compat.v1.train.MonitoredTrainingSession(
            scaffold=scaffold,
            master=master,
            is_chief=chief,
            checkpoint_dir=args.checkpoint_dir if chief else None,
            hooks=hooks,
            config=config,
            save_checkpoint_steps=max(1, args.steps // 2) if chief else None,
            save_checkpoint_secs=None,
            save_summaries_steps=None,
            save_summaries_secs=None,
            log_step_count_steps=None,
        ) as session:
            if on_ready:
                on_ready()
            while not args.evaluate_only and not session.should_stop():
                if args.program in ("pipeline", "wide_deep"):
                    loss, _ = session.run([m["loss"], m["train_op"]])
                else:
                    xs, ys = batches.next()
                    loss, _ = session.run([m["loss"], m["train_op"]], {m["x"]: xs, m["y"]: ys})
                losses.append(float(loss))
    train_seconds = time.perf_counter() - started
    accuracy, global_step = float(evaluate.values[0]), int(evaluate.values[1])
    eval_loss = float(evaluate.values[2])
    result = dict(
        program=args.program,
        v2_behavior=args.v2_behavior,
        worker=index,
        first_loss=losses[0] if losses else None,
        last_loss=losses[-1] if losses else None,
        local_steps=len(losses),
        global_step=global_step,
        train_seconds=train_seconds,
        accuracy=accuracy,
        eval_loss=eval_loss,
        variable_devices=m["variable_devices"],
        variable_ops=m["variable_ops"],
        control_flow_ops=m["control_flow_ops"],
        table_parts=m["table_parts"],
        sparse_update_ops=m["sparse_update_ops"],
    )
    if chief:
        checkpoint = tf.train.latest_checkpoint(args.checkpoint_dir)
        result["checkpoint"] = checkpoint and dict(
            name=os.path.basename(checkpoint),
            global_step=int(tf.train.load_checkpoint(checkpoint).get_tensor("global_step")),
        )
    return result


def alone(args):
    """The program on a cluster of stock TensorFlow servers in this process."""
    ps = [f"127.0.0.1:{free_port()}" for _ in range(args.ps_tasks)]
    workers = [f"127.0.0.1:{free_port()}" for _ in range(args.workers)]
    spec = cluster_spec(ps, workers)
    servers = [
        tf.distribute.Server(spec, job_name="ps", task_index=i, start=True)
        for i in range(args.ps_tasks)
    ]
    servers += [
        tf.distribute.Server(spec, job_name="worker", task_index=i, start=True)
        for i in range(args.workers)
    ]
    data = clicks() if args.program == "wide_deep" else digits()
    results, errors = [None] * args.workers, []
    # The other workers open their sessions once the chief has initialised the model (a
    # worker finding it uninitialised would wait 30 s before looking again).
    chief_ready = threading.Event()

    def worker(i):
        try:
            if i > 0 and not chief_ready.wait(timeout=120):
                raise TimeoutError("the chief did not open its session within 120 s")
            ready = chief_ready.set if i == 0 else None
            results[i] = train(args, "grpc://" + workers[i], ps, workers, i, data, None, ready)
        except Exception as e:  # reported below, with the worker's index
            errors.append(f"worker {i}: {type(e).__name__}: {e}")
            chief_ready.set()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        print("\n".join(errors), file=sys.stderr)
        sys.exit(1)
    result = dict(results[0], cluster=dict(ps=ps, worker=workers))
    if len(results) > 1:
        result["others"] = results[1:]
    return result


def client(args):
    """Worker `args.index` of the program in the cluster the flags name."""
    workers = split(args.worker)
    if not 0 <= args.index < len(workers):
        sys.exit(f"tensorflow_v1: --index {args.index} is not a task of --worker {args.worker}")
    ps = split(args.ps)
    cluster_def = None if args.no_cluster_def else cluster_spec(ps, workers).as_cluster_def()
    master = args.master if args.master.startswith("grpc://") else "grpc://" + args.master
    # The chief says when the model is initialised: the other workers may start.
    ready = (lambda: print("ready", flush=True)) if args.index == 0 else None
    data = clicks() if args.program == "wide_deep" else digits()
    return train(args, master, ps, workers, args.index, data, cluster_def, ready)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    server = commands.add_parser("server", help="serve one TensorFlow task")
    server.add_argument("job", choices=["ps", "worker"])
    server.add_argument("index", type=int)
    server.add_argument("--ps", default="")
    server.add_argument("--worker", required=True)
    for name in DEFAULT_STEPS:
        program = commands.add_parser(name, help=f"the {name} trainer")
        where = program.add_mutually_exclusive_group(required=True)
        where.add_argument("--alone", action="store_true", help="on stock TensorFlow servers")
        where.add_argument("--master", help="grpc://HOST:PORT of the master to train through")
        program.add_argument("--workers", type=int, default=1, help="with --alone")
        program.add_argument(
            "--ps-tasks", type=int, default=DEFAULT_PS_TASKS.get(name, 1), help="with --alone"
        )
        program.add_argument("--ps", default="")
        program.add_argument("--worker", default="")
        program.add_argument("--index", type=int, default=0)
        program.add_argument("--no-cluster-def", action="store_true")
        program.add_argument("--steps", type=int, default=DEFAULT_STEPS[name])
        program.add_argument("--checkpoint-dir")
        program.add_argument("--evaluate-only", action="store_true")
        if name == "sync":
            program.add_argument("--operation-timeout-ms", type=int, default=4000)
        program.add_argument(
            "--v2-behavior", choices=["off", "eager-only"], default="off",
            help="off: disable_v2_behavior(); eager-only: only disable_eager_execution()",
        )
        if name == "rnn":
            program.add_argument("--cell", choices=["lstm", "gru"], default="lstm")
        if name == "pipeline":
            program.add_argument("--iterator", choices=["one-shot", "initializable"],
                                 default="one-shot")
            program.add_argument("--epochs", type=int, default=-1,
                                 help="passes over the data (-1: until --steps)")
            program.add_argument("--save-iterator", action="store_true",
                                 help="checkpoints hold the iterator's position")
            program.add_argument("--source", choices=["tensors", "tfrecord"], default="tensors",
                                 help="tfrecord: the images as tf.train.Examples in a file")
        if name == "embedding":
            program.add_argument("--partitions", type=int, default=2)
            program.add_argument("--partition-strategy", choices=["mod", "div"], default="mod")
            program.add_argument("--partitioner", choices=["fixed", "min_max"], default="fixed")
    args = parser.parse_args()
    if args.command == "server":
        serve(args)
        return
    args.program = args.command
    args.cell = getattr(args, "cell", "lstm")
    args.iterator = getattr(args, "iterator", "one-shot")
    args.epochs = getattr(args, "epochs", -1)
    args.save_iterator = getattr(args, "save_iterator", False)
    args.source = getattr(args, "source", "tensors")
    # The pipeline's TFRecord files (--source tfrecord), written by each worker's program.
    args.data_dir = tempfile.mkdtemp(prefix="tensorflow_v1-data-")
    args.partitions = getattr(args, "partitions", 2)
    args.partition_strategy = getattr(args, "partition_strategy", "mod")
    args.partitioner = getattr(args, "partitioner", "fixed")
    if args.program == "rnn":
        try:
            tf.compat.v1.nn.rnn_cell.LSTMCell
        except (ImportError, AttributeError) as e:  # pragma: no cover - depends on the host
            print(f"tensorflow_v1: tf.compat.v1.nn.rnn_cell: {e}; pip install tf-keras",
                  file=sys.stderr)
            sys.exit(2)
    if args.program == "sync" and args.v2_behavior != "off":
        parser.error("sync runs with --v2-behavior off (SyncReplicasOptimizer is TensorFlow 1's)")
    if args.master and not args.worker:
        parser.error("--master needs --worker (and --ps) naming the cluster's tasks")
    if args.v2_behavior == "off":
        tf.compat.v1.disable_v2_behavior()
    else:
        tf.compat.v1.disable_eager_execution()
    temporary = args.checkpoint_dir is None
    if temporary:
        args.checkpoint_dir = tempfile.mkdtemp(prefix="tensorflow_v1-")
    try:
        result = alone(args) if args.alone else client(args)
    finally:
        if temporary:
            shutil.rmtree(args.checkpoint_dir, ignore_errors=True)
        shutil.rmtree(args.data_dir, ignore_errors=True)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
