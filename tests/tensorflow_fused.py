#!/usr/bin/env python3
"""A small CNN as a TensorFlow 1 program writes it (tf.compat.v1, reference variables,
Momentum), trained through a stock TensorFlow master whose worker task may be tessera's: the
master's graph optimizer (grappler's remapper) fuses Conv2D + BiasAdd + Relu into
`_FusedConv2D`, MatMul + BiasAdd (+ Relu) into `_FusedMatMul` and, with batch normalization,
FusedBatchNormV3 + Relu into `_FusedBatchNormEx`, and registers those on the worker.

Usage:
  tensorflow_fused.py server --worker ADDR
      Serves task 0 of job "chief" (tf.distribute.Server) in the cluster {chief: [itself],
      worker: [ADDR]}. Prints "tensorflow: serving grpc://HOST:PORT", then serves until stdin
      closes.
  tensorflow_fused.py train --master grpc://HOST:PORT [--batch-norm] [--steps N]
      Trains the CNN through that master, every op on /job:worker/task:0. Prints one JSON line.
  tensorflow_fused.py train --alone [--batch-norm] [--steps N]
      The same in a local session of this process (TensorFlow alone).

Model: 16 seeded 8x8x1 images per step (labels from a fixed random linear teacher), a 3x3x8
SAME convolution with a bias (or batch normalization in training mode) and a ReLU, 2x2 max
pooling, a 128-32 ReLU dense layer, a 32-10 dense layer, sparse softmax cross-entropy,
Momentum 0.05/0.9. Weights start from seeded NumPy constants, so every runtime starts alike.

Results (JSON): losses (every step's), fused (the fused nodes in the partition graphs the
worker reported for the last step, as "op [fused_ops]" or "op activation_mode", sorted, unique).
Exits 2 when TensorFlow cannot be imported.
"""

import argparse
import json
import os
import socket
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# tf.compat.v1.layers lives in tf-keras (Keras 2) under TensorFlow 2.16 and later.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

try:
    import numpy as np
    import tensorflow as tf
except ImportError as e:  # pragma: no cover - depends on the host
    print(f"tensorflow_fused: {e}; pip install tensorflow-cpu", file=sys.stderr)
    sys.exit(2)

v1 = tf.compat.v1
BATCH = 16


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(args):
    spec = tf.train.ClusterSpec({"chief": [f"127.0.0.1:{free_port()}"], "worker": [args.worker]})
    server = tf.distribute.Server(spec, job_name="chief", task_index=0, start=True)
    print(f"tensorflow: serving {server.target}", flush=True)
    sys.stdin.read()


def data(steps):
    rng = np.random.default_rng(7)
    teacher = rng.normal(size=(64, 10))
    batches = []
    for _ in range(steps):
        x = rng.uniform(0, 1, (BATCH, 8, 8, 1)).astype(np.float32)
        y = np.argmax(x.reshape(BATCH, 64) @ teacher, axis=1).astype(np.int64)
        batches.append((x, y))
    return batches


def build(batch_norm, device):
    rng = np.random.default_rng(11)

    def weight(name, shape, scale):
        init = tf.constant(rng.normal(0, scale, shape).astype(np.float32))
        return v1.get_variable(name, initializer=init)

    g = tf.Graph()
    with g.as_default(), g.device(device):
        x = v1.placeholder(tf.float32, [BATCH, 8, 8, 1], name="x")
        y = v1.placeholder(tf.int64, [BATCH], name="y")
        h = tf.nn.conv2d(x, weight("conv", [3, 3, 1, 8], 0.3), 1, "SAME")
        if batch_norm:
            h = v1.layers.batch_normalization(h, training=True)
        else:
            h = tf.nn.bias_add(h, weight("conv_bias", [8], 0.1))
        h = tf.nn.relu(h)
        h = tf.nn.max_pool2d(h, 2, 2, "VALID")
        h = tf.reshape(h, [BATCH, 128])
        dense, dense_bias = weight("dense", [128, 32], 0.1), weight("dense_bias", [32], 0.1)
        h = tf.nn.relu(tf.matmul(h, dense) + dense_bias)
        out, out_bias = weight("out", [32, 10], 0.2), weight("out_bias", [10], 0.1)
        logits = tf.nn.bias_add(tf.matmul(h, out), out_bias)
        xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        loss = tf.reduce_mean(xent)
        with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
            train = v1.train.MomentumOptimizer(0.05, 0.9).minimize(loss)
        init = v1.global_variables_initializer()
    return g, x, y, loss, train, init


def describe(node):
    if "fused_ops" in node.attr:
        return f"{node.op} [{', '.join(s.decode() for s in node.attr['fused_ops'].list.s)}]"
    if "activation_mode" in node.attr:
        return f"{node.op} {node.attr['activation_mode'].s.decode()}"
    return node.op


def train(args):
    v1.disable_v2_behavior()
    device = None if args.alone else "/job:worker/task:0"
    g, x, y, loss, step, init = build(args.batch_norm, device)
    target = "" if args.alone else args.master
    losses, fused = [], set()
    with v1.Session(target, graph=g) as sess:
        sess.run(init)
        batches = data(args.steps)
        for i, (bx, by) in enumerate(batches):
            last = i == len(batches) - 1
            options = v1.RunOptions(output_partition_graphs=True) if last else None
            metadata = v1.RunMetadata()
            value, _ = sess.run([loss, step], {x: bx, y: by}, options=options,
                                run_metadata=metadata)
            losses.append(float(value))
            for graph in metadata.partition_graphs:
                fused.update(describe(n) for n in graph.node
                             if n.op.startswith("_") and "Fused" in n.op)
    print(json.dumps({"losses": losses, "fused": sorted(fused)}), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["server", "train"])
    parser.add_argument("--worker")
    parser.add_argument("--master")
    parser.add_argument("--alone", action="store_true")
    parser.add_argument("--batch-norm", action="store_true")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    if args.command == "server":
        serve(args)
    else:
        train(args)


if __name__ == "__main__":
    main()
