#!/usr/bin/env python3
"""Stock TensorFlow's side of tests/tensorflow_interop.rs: a TensorFlow task, or a
TensorFlow client training between-graph style, in a cluster with tessera tasks.

Usage:
  tensorflow_interop.py server JOB [--ps ADDR] --worker ADDR
      Starts TensorFlow's own gRPC server (tf.distribute.Server) as task 0 of JOB; its own
      address may end in :0 (the OS picks the port). Prints
      "tensorflow: serving grpc://HOST:PORT", then serves until stdin closes.
  tensorflow_interop.py train --ps ADDR --worker ADDR [--no-cluster-def]
      Trains a small MLP (4-16-3, ReLU, sparse softmax cross-entropy, Adam, a global step)
      through tf.compat.v1.Session("grpc://WORKER") with the variables on the ps
      (replica_device_setter) for 150 steps on a seeded data set, and the same in this
      process on TensorFlow alone, and prints one JSON line: the devices the session lists,
      the variables' devices, the first and last loss of both runs, the cluster's global step
      and training accuracy. --no-cluster-def leaves the cluster out of the
      session's ConfigProto (a TensorFlow server refuses one naming itself).

  tensorflow_interop.py sync --ps ADDR --worker ADDR,ADDR --index I
      Worker I of two training synchronously with tf.compat.v1.train.SyncReplicasOptimizer
      (gradients of both workers averaged per update, worker 0 the chief) in a
      MonitoredTrainingSession to global step 20. The chief prints "ready" once the model is
      initialised; each prints one JSON line at the end: the worker, its local steps and the
      last global step it saw.
  tensorflow_interop.py trace --ps ADDR --worker ADDR [--no-cluster-def]
      Builds the MLP as `train` does (variables on the ps, compute on the worker), initialises
      it and runs one training step with RunOptions(trace_level=FULL_TRACE) through
      tf.compat.v1.Session("grpc://WORKER"); draws the step's RunMetadata.step_stats with
      TensorFlow's own timeline.Timeline(...).generate_chrome_trace_format(), checks that the
      trace has op events on a device of each task, and prints one JSON line: the devices in
      the step stats, the trace's processes with their op events, the node count and the
      _Recv nodes with their output bytes.
  tensorflow_interop.py monitored --ps ADDR --worker ADDR --checkpoint-dir DIR --last-step N
      Trains a softmax regression (momentum, a global step) as TensorFlow 1 programs do, with
      tf.compat.v1.train.MonitoredTrainingSession as chief: it initialises or restores from
      DIR, stops at step N and saves checkpoints there. Prints one JSON line: the global step
      when the session opened, the checkpoint TensorFlow finds in DIR afterwards, the global
      step and variable names in it.

Exits 2 when TensorFlow cannot be imported.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

try:
    import numpy as np
    import tensorflow as tf
except ImportError as e:  # pragma: no cover - depends on the host
    print(f"tensorflow_interop: {e}; pip install tensorflow-cpu", file=sys.stderr)
    sys.exit(2)

STEPS = 150


def cluster(args):
    jobs = {"worker": args.worker.split(",")}
    if args.ps:
        jobs["ps"] = [args.ps]
    return tf.train.ClusterSpec(jobs)


def serve(args):
    server = tf.distribute.Server(cluster(args), job_name=args.job, task_index=0, start=True)
    print(f"tensorflow: serving {server.target}", flush=True)
    sys.stdin.read()  # until the test closes our stdin (or dies)


def dense(x, n_in, n_out, name):
    w = tf.compat.v1.get_variable(
        name + "/w", [n_in, n_out], initializer=tf.compat.v1.glorot_uniform_initializer(seed=1)
    )
    b = tf.compat.v1.get_variable(name + "/b", [n_out], initializer=tf.compat.v1.zeros_initializer())
    return tf.nn.bias_add(tf.matmul(x, w), b)


def build(device_setter):
    """The MLP, its training op and initializer, placed by `device_setter` (None: unplaced)."""
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.device(device_setter):
        step = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        y = tf.compat.v1.placeholder(tf.int64, [None], name="y")
        hidden = tf.nn.relu(dense(x, 4, 16, "layer0"))
        logits = dense(hidden, 16, 3, "layer1")
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        train_op = tf.compat.v1.train.AdamOptimizer(0.05).minimize(loss, global_step=step)
        init = tf.compat.v1.global_variables_initializer()
        variable_devices = sorted({v.device for v in tf.compat.v1.global_variables()})
    return graph, dict(step=step, x=x, y=y, logits=logits, loss=loss, train_op=train_op,
                       init=init, variable_devices=variable_devices)


def run(session, ops):
    """Initialises and trains; returns the losses, the global step and the accuracy."""
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(96, 4)).astype(np.float32)
    ys = (xs[:, 0] > 0).astype(np.int64) + (xs[:, 1] > 0.5).astype(np.int64)
    feed = {ops["x"]: xs, ops["y"]: ys}
    session.run(ops["init"])
    losses = [float(session.run([ops["loss"], ops["train_op"]], feed)[0]) for _ in range(STEPS)]
    predicted = np.argmax(session.run(ops["logits"], feed), axis=1)
    return losses, int(session.run(ops["step"])), float(np.mean(predicted == ys))


def train(args):
    tf.compat.v1.disable_eager_execution()
    spec = cluster(args)
    # The same training in this process, on TensorFlow alone: the reference.
    graph, ops = build(None)
    with tf.compat.v1.Session(graph=graph) as session:
        reference, _, _ = run(session, ops)

    setter = tf.compat.v1.train.replica_device_setter(cluster=spec, worker_device="/job:worker/task:0")
    graph, ops = build(setter)
    config = None if args.no_cluster_def else tf.compat.v1.ConfigProto(
        cluster_def=spec.as_cluster_def()
    )
    worker = args.worker.split(",")[0]
    with tf.compat.v1.Session("grpc://" + worker, graph=graph, config=config) as session:
        devices = [d.name for d in session.list_devices()]
        losses, step, accuracy = run(session, ops)
    print(
        json.dumps(
            {
                "devices": devices,
                "variable_devices": ops["variable_devices"],
                "first_loss": losses[0],
                "last_loss": losses[-1],
                "reference_first_loss": reference[0],
                "reference_last_loss": reference[-1],
                "global_step": step,
                "accuracy": accuracy,
            }
        ),
        flush=True,
    )


def trace(args):
    from tensorflow.python.client import timeline

    tf.compat.v1.disable_eager_execution()
    spec = cluster(args)
    setter = tf.compat.v1.train.replica_device_setter(cluster=spec, worker_device="/job:worker/task:0")
    graph, ops = build(setter)
    config = None if args.no_cluster_def else tf.compat.v1.ConfigProto(
        cluster_def=spec.as_cluster_def()
    )
    xs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    feed = {ops["x"]: xs, ops["y"]: (xs[:, 0] > 0).astype(np.int64)}
    with tf.compat.v1.Session("grpc://" + args.worker.split(",")[0], graph=graph, config=config) as session:
        session.run(ops["init"])
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        metadata = tf.compat.v1.RunMetadata()
        session.run([ops["loss"], ops["train_op"]], feed, options=options, run_metadata=metadata)
        # Untraced, a step returns no step stats.
        untraced = tf.compat.v1.RunMetadata()
        session.run(ops["loss"], feed, run_metadata=untraced)
    stats = metadata.step_stats
    chrome = json.loads(timeline.Timeline(stats).generate_chrome_trace_format())
    names = {e["pid"]: e["args"]["name"] for e in chrome["traceEvents"] if e.get("name") == "process_name"}
    ops_per_process = {}
    for event in chrome["traceEvents"]:
        if event.get("ph") == "X":
            process = names[event["pid"]]
            ops_per_process[process] = ops_per_process.get(process, 0) + 1
    for task in ("/job:ps/", "/job:worker/"):
        assert any(task in p and n > 0 for p, n in ops_per_process.items()), (task, ops_per_process)
    assert not untraced.step_stats.dev_stats, untraced
    recvs = [
        {
            "device": d.device,
            "node": n.node_name,
            "bytes": [o.tensor_description.allocation_description.requested_bytes for o in n.output],
        }
        for d in stats.dev_stats
        for n in d.node_stats
        if " = _Recv(" in n.timeline_label
    ]
    print(
        json.dumps(
            {
                "devices": [d.device for d in stats.dev_stats],
                "processes": ops_per_process,
                "nodes": sum(len(d.node_stats) for d in stats.dev_stats),
                "recvs": recvs,
            }
        ),
        flush=True,
    )


def softmax_regression():
    """A 4-to-3 softmax regression with a global step, in the current graph and device scope:
    returns (step, x, y, loss)."""
    step = tf.compat.v1.train.get_or_create_global_step()
    x = tf.compat.v1.placeholder(tf.float32, [None, 4])
    y = tf.compat.v1.placeholder(tf.int64, [None])
    logits = dense(x, 4, 3, "softmax")
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    return step, x, y, loss


def batch(seed):
    """32 examples of 4 features, labelled by the sign of the first."""
    xs = np.random.default_rng(seed).normal(size=(32, 4)).astype(np.float32)
    return xs, (xs[:, 0] > 0).astype(np.int64)


def monitored(args):
    tf.compat.v1.disable_eager_execution()
    spec = cluster(args)
    setter = tf.compat.v1.train.replica_device_setter(cluster=spec, worker_device="/job:worker/task:0")
    with tf.Graph().as_default(), tf.compat.v1.device(setter):
        step, x, y, loss = softmax_regression()
        train_op = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, global_step=step)
        xs, ys = batch(0)
        hooks = [tf.compat.v1.train.StopAtStepHook(last_step=args.last_step)]
        config = tf.compat.v1.ConfigProto(cluster_def=spec.as_cluster_def())
        with tf.compat.v1.train.MonitoredTrainingSession(
            master="grpc://" + args.worker.split(",")[0],
            is_chief=True,
            checkpoint_dir=args.checkpoint_dir,
            hooks=hooks,
            config=config,
            save_checkpoint_steps=10,
            log_step_count_steps=None,
            save_summaries_steps=None,
        ) as session:
            start = int(session.run(step))
            while not session.should_stop():
                session.run(train_op, {x: xs, y: ys})
    checkpoint = tf.train.latest_checkpoint(args.checkpoint_dir)
    reader = tf.train.load_checkpoint(checkpoint)
    print(
        json.dumps(
            {
                "start_step": start,
                "checkpoint": os.path.basename(checkpoint),
                "checkpoint_step": int(reader.get_tensor("global_step")),
                "variables": sorted(reader.get_variable_to_shape_map()),
            }
        ),
        flush=True,
    )


def sync(args):
    tf.compat.v1.disable_eager_execution()
    spec = cluster(args)
    workers = args.worker.split(",")
    me = f"/job:worker/task:{args.index}"
    setter = tf.compat.v1.train.replica_device_setter(cluster=spec, worker_device=me)
    with tf.Graph().as_default(), tf.compat.v1.device(setter):
        step, x, y, loss = softmax_regression()
        optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.5),
            replicas_to_aggregate=len(workers),
            total_num_replicas=len(workers),
        )
        train_op = optimizer.minimize(loss, global_step=step)
        chief = args.index == 0
        hooks = [
            optimizer.make_session_run_hook(chief),
            tf.compat.v1.train.StopAtStepHook(last_step=20),
        ]
        xs, ys = batch(args.index)
        # The chief's aggregation loop ends blocked in its accumulators' take: a bounded step
        # ends it when the chief closes its session.
        config = tf.compat.v1.ConfigProto(
            cluster_def=spec.as_cluster_def(),
            device_filters=["/job:ps", me],
            operation_timeout_in_ms=10000,
        )
        local_steps, last_step = 0, None
        with tf.compat.v1.train.MonitoredTrainingSession(
            master="grpc://" + workers[args.index],
            is_chief=chief,
            hooks=hooks,
            config=config,
            log_step_count_steps=None,
            save_summaries_steps=None,
        ) as session:
            if chief:
                print("ready", flush=True)  # initialised: the other worker may start
            while not session.should_stop():
                _, last_step = session.run([train_op, step], {x: xs, y: ys})
                local_steps += 1
    print(
        json.dumps({"worker": args.index, "local_steps": local_steps, "last_step": int(last_step)}),
        flush=True,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    server = commands.add_parser("server")
    server.add_argument("job", choices=["ps", "worker"])
    trainer = commands.add_parser("train")
    trainer.add_argument("--no-cluster-def", action="store_true")
    chief = commands.add_parser("monitored")
    chief.add_argument("--checkpoint-dir", required=True)
    chief.add_argument("--last-step", type=int, required=True)
    replica = commands.add_parser("sync")
    replica.add_argument("--index", type=int, required=True)
    tracer = commands.add_parser("trace")
    tracer.add_argument("--no-cluster-def", action="store_true")
    for command in (server, trainer, chief, replica, tracer):
        command.add_argument("--ps", default="", help="none: a cluster of workers alone")
        command.add_argument("--worker", required=True)
    args = parser.parse_args()
    handlers = {"server": serve, "train": train, "monitored": monitored, "sync": sync, "trace": trace}
    handlers[args.command](args)


if __name__ == "__main__":
    main()
