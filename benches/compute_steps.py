#!/usr/bin/env python3
"""A stock TensorFlow client training one of the compute bench's models through a task
(TensorFlow's or tessera's): the steps per second it makes and the loss it reaches.

Usage:
  compute_steps.py MODEL --target grpc://HOST:PORT [--steps N] [--warm_up N] [--trace N]
  compute_steps.py server --listen 127.0.0.1:PORT
      Serves a one-task TensorFlow cluster (job worker) at that address; prints
      "tensorflow: serving grpc://HOST:PORT", then serves until stdin closes.

MODEL is one of:
  mlp         784-1024-10, batch 256
  wide_mlp    1024-4096-4096-10, batch 512
  cnn         32x32x3: conv 3x3 32 + relu + maxpool, conv 3x3 64 + relu + maxpool, dense 10;
              batch 128
  wide_deep   4 id columns (100000 ids each) into a 100000 x 32 embedding table and a wide
              weight per id, 8 dense features; deep part dense 256-128-1; batch 512
  rnn         tf.compat.v1.nn.dynamic_rnn of an LSTMCell(128) over 16 steps of 64 features,
              then dense 10; batch 128 (TF1 rnn_cell: tf_keras with TF_USE_LEGACY_KERAS=1)

Every model trains with Momentum 0.9 (learning rate 0.01) from seeded initial weights, fed
fixed seeded numpy batches; the variables and the step run on the target's one task. After
the warm-up steps, N steps are timed; prints one JSON line: {"model": ..., "steps_per_sec":
..., "loss": ..., "first_loss": ...}. With --trace N, N more steps run with FULL_TRACE and the
line also holds "ops": each op's milliseconds per step summed over its nodes, largest first
(where a step's time goes, on either runtime). Exits 2 when TensorFlow cannot be imported.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

try:
    import numpy as np
    import tensorflow as tf
except ImportError as e:  # pragma: no cover - depends on the host
    print(f"compute_steps: {e}; pip install tensorflow-cpu tf-keras", file=sys.stderr)
    sys.exit(2)

BATCHES = 8


def serve(listen):
    spec = tf.train.ClusterSpec({"worker": [listen]})
    server = tf.distribute.Server(spec, job_name="worker", task_index=0, start=True)
    print(f"tensorflow: serving {server.target}", flush=True)
    sys.stdin.read()


def variable(name, shape, seed):
    return tf.compat.v1.get_variable(
        name, shape, initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed)
    )


def dense(x, n_in, n_out, name, seed):
    w = variable(name + "/w", [n_in, n_out], seed)
    b = tf.compat.v1.get_variable(name + "/b", [n_out], initializer=tf.compat.v1.zeros_initializer())
    return tf.nn.bias_add(tf.matmul(x, w), b)


def classifier(rng, features, classes, batch):
    """Placeholders and seeded batches for a softmax classifier."""
    x = tf.compat.v1.placeholder(tf.float32, [None] + list(features), name="x")
    y = tf.compat.v1.placeholder(tf.int64, [None], name="y")
    feeds = [
        {x: rng.standard_normal([batch] + list(features)).astype(np.float32),
         y: rng.integers(0, classes, batch).astype(np.int64)}
        for _ in range(BATCHES)
    ]
    return x, y, feeds


def softmax_loss(y, logits):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))


def mlp(rng, widths, batch):
    x, y, feeds = classifier(rng, [widths[0]], widths[-1], batch)
    h = x
    for i, (n_in, n_out) in enumerate(zip(widths, widths[1:])):
        h = dense(h, n_in, n_out, f"layer{i}", seed=i + 1)
        if i + 2 < len(widths):
            h = tf.nn.relu(h)
    return softmax_loss(y, h), feeds


def mlp_data(rng, widths, batch, images=8192):
    """The MLP with its input from a tf.data pipeline in the graph instead of feeds: uint8
    pixels and int64 labels (from_tensor_slices), a map that scales the pixels, shuffle,
    repeat, batch, prefetch, a one-shot iterator."""
    pixels = rng.integers(0, 256, [images, widths[0]]).astype(np.uint8)
    labels = rng.integers(0, widths[-1], images).astype(np.int64)
    dataset = (
        tf.data.Dataset.from_tensor_slices((pixels, labels))
        .map(lambda p, label: (tf.cast(p, tf.float32) / 255.0, label))
        .shuffle(1024, seed=1)
        .repeat()
        .batch(batch)
        .prefetch(tf.data.AUTOTUNE)
    )
    x, y = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    h = x
    for i, (n_in, n_out) in enumerate(zip(widths, widths[1:])):
        h = dense(h, n_in, n_out, f"layer{i}", seed=i + 1)
        if i + 2 < len(widths):
            h = tf.nn.relu(h)
    return softmax_loss(y, h), [{}]


def cnn(rng, batch):
    x, y, feeds = classifier(rng, [32, 32, 3], 10, batch)
    h = x
    for i, (n_in, n_out) in enumerate([(3, 32), (32, 64)]):
        w = variable(f"conv{i}/w", [3, 3, n_in, n_out], seed=i + 1)
        b = tf.compat.v1.get_variable(f"conv{i}/b", [n_out], initializer=tf.compat.v1.zeros_initializer())
        h = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(h, w, strides=1, padding="SAME"), b))
        h = tf.nn.max_pool2d(h, ksize=2, strides=2, padding="SAME")
    h = tf.reshape(h, [-1, 8 * 8 * 64])
    return softmax_loss(y, dense(h, 8 * 8 * 64, 10, "logits", seed=3)), feeds


def wide_deep(rng, batch, ids=100_000, columns=4, dim=32, numeric=8):
    id_in = tf.compat.v1.placeholder(tf.int64, [None, columns], name="ids")
    dense_in = tf.compat.v1.placeholder(tf.float32, [None, numeric], name="dense")
    label = tf.compat.v1.placeholder(tf.float32, [None], name="label")
    table = variable("embedding", [ids, dim], seed=1)
    wide = tf.compat.v1.get_variable("wide", [ids, 1], initializer=tf.compat.v1.zeros_initializer())
    looked_up = tf.reshape(tf.nn.embedding_lookup(table, id_in), [-1, columns * dim])
    deep = tf.concat([looked_up, dense_in], 1)
    h = tf.nn.relu(dense(deep, columns * dim + numeric, 256, "deep0", seed=2))
    h = tf.nn.relu(dense(h, 256, 128, "deep1", seed=3))
    logit = dense(h, 128, 1, "deep2", seed=4)
    logit = logit + tf.reduce_sum(tf.nn.embedding_lookup(wide, id_in), 1)
    loss = tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=tf.reshape(logit, [-1]))
    )
    feeds = [
        {id_in: rng.integers(0, ids, [batch, columns]).astype(np.int64),
         dense_in: rng.standard_normal([batch, numeric]).astype(np.float32),
         label: rng.integers(0, 2, batch).astype(np.float32)}
        for _ in range(BATCHES)
    ]
    return loss, feeds


def rnn(rng, batch, steps=16, features=64, units=128):
    x, y, feeds = classifier(rng, [steps, features], 10, batch)
    init = tf.compat.v1.glorot_uniform_initializer(seed=1)
    with tf.compat.v1.variable_scope("rnn", initializer=init):
        cell = tf.compat.v1.nn.rnn_cell.LSTMCell(units, initializer=init)
        outputs, _ = tf.compat.v1.nn.dynamic_rnn(cell, x, dtype=tf.float32)
    return softmax_loss(y, dense(outputs[:, -1, :], units, 10, "logits", seed=2)), feeds


MODELS = {
    "mlp": lambda rng: mlp(rng, [784, 1024, 10], 256),
    "mlp_data": lambda rng: mlp_data(rng, [784, 1024, 10], 256),
    "wide_mlp": lambda rng: mlp(rng, [1024, 4096, 4096, 10], 512),
    "cnn": lambda rng: cnn(rng, 128),
    "wide_deep": lambda rng: wide_deep(rng, 512),
    "rnn": lambda rng: rnn(rng, 128),
}


def steps(model, target, count, warm_up, trace=0):
    tf.compat.v1.disable_eager_execution()
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(1)
        loss, feeds = MODELS[model](np.random.default_rng(0))
        train = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9).minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(target, graph=graph) as session:
        session.run(init)
        first = None
        for i in range(warm_up):
            value, _ = session.run([loss, train], feeds[i % len(feeds)])
            first = value if first is None else first
        started = time.perf_counter()
        for i in range(count):
            value, _ = session.run([loss, train], feeds[(warm_up + i) % len(feeds)])
        seconds = time.perf_counter() - started
        ops = {}
        for i in range(trace):
            metadata = tf.compat.v1.RunMetadata()
            options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
            session.run([loss, train], feeds[i % len(feeds)], options=options,
                        run_metadata=metadata)
            for device in metadata.step_stats.dev_stats:
                for node in device.node_stats:
                    label = node.timeline_label.split("=")[-1].split("(")[0].strip()
                    op = label or node.node_name
                    ops[op] = ops.get(op, 0.0) + node.all_end_rel_micros / 1000.0 / trace
    result = dict(model=model, steps_per_sec=count / seconds, loss=float(value),
                  first_loss=float(first) if first is not None else None)
    if trace:
        result["ops"] = dict(sorted(((k, round(v, 3)) for k, v in ops.items()),
                                    key=lambda kv: -kv[1]))
    return result


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "server":
        parser = argparse.ArgumentParser()
        parser.add_argument("server")
        parser.add_argument("--listen", required=True)
        serve(parser.parse_args().listen)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("--target", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warm_up", type=int, default=3)
    parser.add_argument("--trace", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(steps(args.model, args.target, args.steps, args.warm_up, args.trace)),
          flush=True)


if __name__ == "__main__":
    main()
