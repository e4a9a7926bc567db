#!/usr/bin/env python3
"""A stock TensorFlow client stepping a softmax regression: the training steps per second it
makes through a task (TensorFlow's or tessera's), or in its own local session (its floor).

Usage:
  tf_client_steps.py --target grpc://HOST:PORT [--steps N]
  tf_client_steps.py --local [--steps N]
  tf_client_steps.py server --listen 127.0.0.1:PORT
      Serves a one-task TensorFlow cluster (job worker) at that address; prints
      "tensorflow: serving grpc://HOST:PORT", then serves until stdin closes.

The model: softmax regression on 64 features and 10 classes (the digits' shape), batch 32,
gradient descent 0.1, fed fixed seeded batches. After 100 warm-up steps, N steps (2000 by
default) are timed; prints one JSON line: {"steps_per_sec": ..., "loss": ...}. Exits 2 when
TensorFlow cannot be imported.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

try:
    import numpy as np
    import tensorflow as tf
except ImportError as e:  # pragma: no cover - depends on the host
    print(f"tf_client_steps: {e}; pip install tensorflow-cpu", file=sys.stderr)
    sys.exit(2)

FEATURES, CLASSES, BATCH, WARM_UP = 64, 10, 32, 100


def serve(listen):
    spec = tf.train.ClusterSpec({"worker": [listen]})
    server = tf.distribute.Server(spec, job_name="worker", task_index=0, start=True)
    print(f"tensorflow: serving {server.target}", flush=True)
    sys.stdin.read()


def steps(target, count):
    tf.compat.v1.disable_eager_execution()
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, FEATURES], name="x")
        y = tf.compat.v1.placeholder(tf.int64, [None], name="y")
        w = tf.compat.v1.get_variable("w", [FEATURES, CLASSES], initializer=tf.zeros_initializer())
        b = tf.compat.v1.get_variable("b", [CLASSES], initializer=tf.zeros_initializer())
        logits = tf.matmul(x, w) + b
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        )
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
    rng = np.random.default_rng(0)
    batches = [
        (rng.standard_normal((BATCH, FEATURES)).astype(np.float32),
         rng.integers(0, CLASSES, BATCH).astype(np.int64))
        for _ in range(16)
    ]
    with tf.compat.v1.Session(target, graph=graph) as session:
        session.run(init)
        for i in range(WARM_UP):
            xs, ys = batches[i % len(batches)]
            session.run(train, {x: xs, y: ys})
        started = time.perf_counter()
        for i in range(count):
            xs, ys = batches[i % len(batches)]
            value, _ = session.run([loss, train], {x: xs, y: ys})
        seconds = time.perf_counter() - started
    return dict(steps_per_sec=count / seconds, loss=float(value))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "server":
        parser = argparse.ArgumentParser()
        parser.add_argument("server")
        parser.add_argument("--listen", required=True)
        serve(parser.parse_args().listen)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--target")
    where.add_argument("--local", action="store_true")
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    print(json.dumps(steps("" if args.local else args.target, args.steps)), flush=True)


if __name__ == "__main__":
    main()
