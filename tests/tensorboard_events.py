#!/usr/bin/env python3
"""TensorBoard's side of tessera's event-file tests: TensorBoard's own reader over a log
directory, and two TensorFlow programs that write summaries, run against a tessera task or on
stock TensorFlow.

Usage:
  tensorboard_events.py read LOGDIR
      Reads LOGDIR with TensorBoard's EventAccumulator and prints one JSON line: "scalars"
      (tag -> [[step, value], ...], the simple_value summaries), "tensors" (tag -> [[step,
      value], ...], TensorFlow 2's scalar summaries, stored as tensors), "histograms" (tag ->
      [[step, count of values], ...]) and "files" (the event files' names).
  tensorboard_events.py v1 --logdir DIR (--master grpc://HOST:PORT --ps ADDR --worker ADDR | --alone)
      A TensorFlow 1 program: linear regression (4 features, full-batch gradient descent, a
      global step), its variables on the ps by replica_device_setter, with
      tf.compat.v1.summary.scalar("loss") and tf.compat.v1.summary.histogram("w") merged by the
      Scaffold's merge_all, trained by MonitoredTrainingSession(summary_dir=DIR,
      save_summaries_steps=5) to step 30. The summary ops run on the cluster's tasks, the
      chief's hook writes their output to DIR. --alone: on stock TensorFlow servers (a ps and a
      worker) in this process. Prints what `read DIR` prints and "curve", the loss of every
      step. (Which steps the hook writes depends on timing: it reads the global step again
      after a step that wrote a summary.)
  tensorboard_events.py v2 --logdir DIR (--master grpc://HOST:PORT | --alone)
      A graph with TensorFlow 2's tf.summary.create_file_writer(DIR) and
      tf.summary.scalar("value", v, step=s) for s in 0..9 (v = 0.5 * s - 1), the writer and its
      ops placed on /job:worker/task:0 (the task behind --master writes the files); init,
      writes, flush and close each run as a step. --alone: in a local TensorFlow session.
      Prints what `read DIR` prints.

Exits 2 when TensorFlow or TensorBoard cannot be imported.
"""

import argparse
import json
import os
import socket
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

try:
    import numpy as np
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:  # pragma: no cover - depends on the host
    print(f"tensorboard_events: {e}; pip install tensorflow-cpu tensorboard", file=sys.stderr)
    sys.exit(2)

V1_STEPS = 30
V1_EVERY = 5
V2_STEPS = 10


def read(logdir):
    """Everything TensorBoard's reader finds in `logdir`."""
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    return dict(
        files=sorted(f for f in os.listdir(logdir) if "tfevents" in f),
        scalars={t: [[e.step, e.value] for e in acc.Scalars(t)] for t in tags["scalars"]},
        tensors={
            t: [[e.step, float(tf.make_ndarray(e.tensor_proto))] for e in acc.Tensors(t)]
            for t in tags["tensors"]
        },
        histograms={
            t: [[e.step, e.histogram_value.num] for e in acc.Histograms(t)]
            for t in tags["histograms"]
        },
    )


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def v1(args):
    if args.alone:
        ps, worker = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    else:
        ps, worker = args.ps, args.worker
    spec = tf.train.ClusterSpec({"ps": [ps], "worker": [worker]})
    servers = []
    if args.alone:
        servers = [
            tf.distribute.Server(spec, job_name=job, task_index=0, start=True)
            for job in ("ps", "worker")
        ]
    master = "grpc://" + worker if args.alone else args.master
    curve = []
    rng = np.random.RandomState(0)
    xs = rng.uniform(-1, 1, size=(64, 4)).astype(np.float32)
    ys = (xs @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32) + 0.25).astype(np.float32)
    graph = tf.Graph()
    setter = tf.compat.v1.train.replica_device_setter(cluster=spec, worker_device="/job:worker/task:0")
    with graph.as_default(), tf.compat.v1.device(setter):
        step = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
        w = tf.compat.v1.get_variable("w", initializer=tf.constant([[0.1], [0.2], [-0.3], [0.4]]))
        b = tf.compat.v1.get_variable("b", initializer=tf.constant([0.0]))
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
        tf.compat.v1.summary.scalar("loss", loss)
        tf.compat.v1.summary.histogram("w", w)
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(loss, global_step=step)
        config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", "/job:worker/task:0"])
        if not args.alone:
            config.cluster_def.CopyFrom(spec.as_cluster_def())
        with tf.compat.v1.train.MonitoredTrainingSession(
            master=master,
            is_chief=True,
            summary_dir=args.logdir,
            save_summaries_steps=V1_EVERY,
            save_checkpoint_secs=None,
            log_step_count_steps=None,
            hooks=[tf.compat.v1.train.StopAtStepHook(last_step=V1_STEPS)],
            config=config,
        ) as session:
            while not session.should_stop():
                value, _ = session.run([loss, train_op], {x: xs, y: ys})
                curve.append(float(value))
    tf.compat.v1.summary.FileWriterCache.clear()
    del servers
    return dict(read(args.logdir), curve=curve)


def v2(args):
    graph = tf.Graph()
    device = None if args.alone else "/job:worker/task:0"
    with graph.as_default(), tf.compat.v1.device(device):
        writer = tf.summary.create_file_writer(args.logdir)
        step = tf.compat.v1.placeholder(tf.int64, [], name="step")
        value = tf.compat.v1.placeholder(tf.float32, [], name="value")
        with writer.as_default():
            write = tf.summary.scalar("value", value, step=step)
        init, flush, close = writer.init(), writer.flush(), writer.close()
    master = "" if args.alone else args.master
    with tf.compat.v1.Session(master, graph=graph) as session:
        session.run(init)
        for s in range(V2_STEPS):
            session.run(write, {step: s, value: 0.5 * s - 1})
        session.run(flush)
        session.run(close)
    return read(args.logdir)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    reader = commands.add_parser("read")
    reader.add_argument("logdir")
    for name in ("v1", "v2"):
        program = commands.add_parser(name)
        program.add_argument("--logdir", required=True)
        where = program.add_mutually_exclusive_group(required=True)
        where.add_argument("--alone", action="store_true")
        where.add_argument("--master")
        if name == "v1":
            program.add_argument("--ps", default="")
            program.add_argument("--worker", default="")
    args = parser.parse_args()
    if args.command == "read":
        result = read(args.logdir)
    elif args.command == "v1":
        result = v1(args)
    else:
        result = v2(args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
