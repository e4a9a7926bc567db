#!/usr/bin/env python3
"""A stock TensorFlow client's read-and-sum step: a float32 variable on /job:ps/task:0 and,
on /job:worker/task:0, tf.reduce_sum of it; each step fetches only the scalar. Times the step
through a cluster (TensorFlow's or tessera's), or serves one task of a TensorFlow cluster.

Usage:
  read_and_sum_tf.py --target grpc://HOST:PORT --mib M [--warm-up W] [--steps N]
      Builds the graph (tf.compat.v1, graph mode) with a variable `v<M>` of M MiB (M * 2**18
      floats), element i = 0.25 * (i % 3), initialises it, runs W warm-up steps then N timed
      steps, checks every fetched sum against the exact one, then runs 3 traced steps.
      Prints one JSON line: {"step_ms": [...], "sum": ..., "expected": ..., "trace": [...]},
      a trace being {"wall_ms": the traced step's time in the client, "devices": per device,
      each node's [start, duration] in ms}.
      The sum is exact in float32 whatever the order of the additions (every partial sum is
      a multiple of 0.25 below 2**22), so the check is equality.
  read_and_sum_tf.py server --cluster JSON --job J --index I
      Serves task I of job J of the cluster (a tf.distribute.Server); prints
      "tensorflow: serving grpc://HOST:PORT", then serves until stdin closes.

Exits 2 when TensorFlow cannot be imported, 3 when a fetched sum is wrong.
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
    print(f"read_and_sum_tf: {e}; pip install tensorflow-cpu", file=sys.stderr)
    sys.exit(2)

PS = "/job:ps/replica:0/task:0"
WORKER = "/job:worker/replica:0/task:0"


def serve(cluster, job, index):
    spec = tf.train.ClusterSpec(json.loads(cluster))
    server = tf.distribute.Server(spec, job_name=job, task_index=index, start=True)
    print(f"tensorflow: serving {server.target}", flush=True)
    sys.stdin.read()


def expected_sum(n):
    # 0.25 * sum(i % 3 for i < n), exactly.
    full, rest = divmod(n, 3)
    return 0.25 * (3 * full + (1 if rest == 2 else 0))


def trace_of(metadata):
    """Per device, each node's start (from the step's first node) and duration, in ms, in one
    traced step."""
    nodes = [
        (device.device, node)
        for device in metadata.step_stats.dev_stats
        for node in device.node_stats
        if node.node_name not in ("_SOURCE", "_SINK")
    ]
    if not nodes:
        return {}
    first = min(node.all_start_micros for _, node in nodes)
    out = {}
    for device, node in nodes:
        start = (node.all_start_micros - first) / 1000.0
        took = node.all_end_rel_micros / 1000.0
        out.setdefault(device, {})[node.node_name] = [round(start, 3), round(took, 3)]
    return out


def steps(target, mib, warm_up, count):
    tf.compat.v1.disable_eager_execution()
    n = mib * (1 << 18)
    graph = tf.Graph()
    with graph.as_default():
        with tf.device(PS):
            initial = tf.cast(tf.math.floormod(tf.range(n, dtype=tf.int32), 3), tf.float32) * 0.25
            v = tf.compat.v1.get_variable(f"v{mib}", initializer=initial)
        with tf.device(WORKER):
            total = tf.reduce_sum(v)
        init = v.initializer
    expected = expected_sum(n)
    step_ms = []
    with tf.compat.v1.Session(target, graph=graph) as session:
        session.run(init)
        for _ in range(warm_up):
            value = session.run(total)
            if value != expected:
                print(f"read_and_sum_tf: the sum is {value!r}, not {expected!r}", file=sys.stderr)
                sys.exit(3)
        for _ in range(count):
            started = time.perf_counter()
            value = session.run(total)
            step_ms.append((time.perf_counter() - started) * 1000.0)
            if value != expected:
                print(f"read_and_sum_tf: the sum is {value!r}, not {expected!r}", file=sys.stderr)
                sys.exit(3)
        traces = []
        try:
            options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
            for _ in range(3):
                metadata = tf.compat.v1.RunMetadata()
                started = time.perf_counter()
                session.run(total, options=options, run_metadata=metadata)
                wall_ms = (time.perf_counter() - started) * 1000.0
                traces.append(dict(wall_ms=round(wall_ms, 3), devices=trace_of(metadata)))
        except Exception as e:  # a runtime without traces still gets timed
            traces = [dict(error=str(e).splitlines()[0])]
    return dict(step_ms=step_ms, sum=float(value), expected=expected, trace=traces)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "server":
        parser = argparse.ArgumentParser()
        parser.add_argument("server")
        parser.add_argument("--cluster", required=True)
        parser.add_argument("--job", required=True)
        parser.add_argument("--index", type=int, default=0)
        args = parser.parse_args()
        serve(args.cluster, args.job, args.index)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--mib", type=int, required=True)
    parser.add_argument("--warm-up", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    print(json.dumps(steps(args.target, args.mib, args.warm_up, args.steps)), flush=True)


if __name__ == "__main__":
    main()
