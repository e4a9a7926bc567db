#!/usr/bin/env python3
"""The dense 16 MiB regression model on TensorFlow's runtime, as a TensorFlow 1 job trains it:
x @ W + b with W 1024 x 4096 float32 on the ps (replica_device_setter), batch 64, squared
error, Adagrad 0.1, real-valued targets from a fixed rank-8 teacher, a global step and
StopAtStepHook, asynchronous or SyncReplicasOptimizer over every worker. The same model as
`tessera train --model regression` (the teacher's numbers differ; the sizes and the work do).

Usage:
  tf_regression.py server JOB INDEX --ps ADDR,... --worker ADDR,...
      Serves task INDEX of JOB; prints "tensorflow: serving grpc://HOST:PORT", then serves
      until stdin closes.
  tf_regression.py --master grpc://HOST:PORT --ps ADDR --worker ADDR,... --index I
                   [--steps N] [--sync]
      Trains as worker I (worker 0 is the chief: it prints "ready" once the model is
      initialised). Prints one JSON line: global_step (the last this worker read), train_seconds (its first step
      to its last), last_loss.

Exits 2 when TensorFlow cannot be imported.
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
    print(f"tf_regression: {e}; pip install tensorflow-cpu", file=sys.stderr)
    sys.exit(2)

INPUTS, OUTPUTS, RANK, BATCH, EXAMPLES = 1024, 4096, 8, 64, 2048


def cluster(ps, workers):
    return tf.train.ClusterSpec({"ps": ps.split(","), "worker": workers.split(",")})


def teacher(seed):
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((INPUTS, RANK)).astype(np.float32) / np.sqrt(INPUTS)
    v = rng.standard_normal((RANK, OUTPUTS)).astype(np.float32) / np.sqrt(RANK)
    x = rng.standard_normal((EXAMPLES, INPUTS)).astype(np.float32)
    y = (x @ u) @ v + 0.01 * rng.standard_normal((EXAMPLES, OUTPUTS)).astype(np.float32)
    return x, y


def train(args):
    tf.compat.v1.disable_v2_behavior()
    workers = args.worker.split(",")
    me = f"/job:worker/task:{args.index}"
    chief = args.index == 0
    setter = tf.compat.v1.train.replica_device_setter(
        cluster=cluster(args.ps, args.worker), worker_device=me
    )
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.device(setter):
        step = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, INPUTS], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [None, OUTPUTS], name="y")
        w = tf.compat.v1.get_variable(
            "w", [INPUTS, OUTPUTS], initializer=tf.compat.v1.glorot_uniform_initializer(seed=0)
        )
        b = tf.compat.v1.get_variable("b", [OUTPUTS], initializer=tf.zeros_initializer())
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
        optimizer = tf.compat.v1.train.AdagradOptimizer(0.1)
        hooks = []
        if args.sync:
            optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
                optimizer, replicas_to_aggregate=len(workers), total_num_replicas=len(workers)
            )
            hooks.append(optimizer.make_session_run_hook(chief))
        train_op = optimizer.minimize(loss, global_step=step)
    xs, ys = teacher(args.index)
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", me])
    if args.sync:
        config.operation_timeout_in_ms = 4000
    hooks.append(tf.compat.v1.train.StopAtStepHook(last_step=args.steps))
    value, global_step = None, 0
    with graph.as_default():
        with tf.compat.v1.train.MonitoredTrainingSession(
            master=args.master,
            is_chief=chief,
            hooks=hooks,
            config=config,
            save_checkpoint_secs=None,
            save_checkpoint_steps=None,
            save_summaries_steps=None,
            save_summaries_secs=None,
            log_step_count_steps=None,
        ) as session:
            if chief:
                print("ready", flush=True)
            started = time.perf_counter()
            i = 0
            while not session.should_stop():
                rows = slice((i * BATCH) % EXAMPLES, (i * BATCH) % EXAMPLES + BATCH)
                value, global_step, _ = session.run(
                    [loss, step, train_op], {x: xs[rows], y: ys[rows]}
                )
                i += 1
            seconds = time.perf_counter() - started
    print(json.dumps(dict(global_step=int(global_step), train_seconds=seconds,
                          last_loss=None if value is None else float(value))), flush=True)


def serve(args):
    spec = cluster(args.ps, args.worker)
    server = tf.distribute.Server(spec, job_name=args.job, task_index=args.index, start=True)
    print(f"tensorflow: serving {server.target}", flush=True)
    sys.stdin.read()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "server":
        parser = argparse.ArgumentParser()
        parser.add_argument("server")
        parser.add_argument("job", choices=["ps", "worker"])
        parser.add_argument("index", type=int)
        parser.add_argument("--ps", required=True)
        parser.add_argument("--worker", required=True)
        serve(parser.parse_args())
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", required=True)
    parser.add_argument("--ps", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--sync", action="store_true")
    train(parser.parse_args())


if __name__ == "__main__":
    main()
