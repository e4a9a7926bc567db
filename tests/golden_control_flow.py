#!/usr/bin/env python3
"""Writes the golden control-flow graphs of tests/golden_control_flow.rs: small graphs built
with tf.compat.v1 as TensorFlow 1 programs build them, with the values TensorFlow's own session
computes for them.

Usage:
  golden_control_flow.py write [--out DIR] [--flavor v1|v2|both]
      Builds every case and writes, for each, DIR/<name>.pb (the GraphDef, binary, with its
      function library) and DIR/<name>.json (what to feed, fetch and run, and what TensorFlow
      returned). DIR defaults to tests/data/control_flow next to this script.
        v1: under tf.compat.v1.disable_v2_behavior(): v1 control flow written into the graph
            (Switch, Merge, Enter with is_constant, Exit, NextIteration, LoopCond; TensorArrayV3;
            StackV2 push/pop in gradients of loops) and reference variables (VariableV2,
            Assign).
        v2: TensorFlow 2's graph mode (only tf.compat.v1.disable_eager_execution()): functional
            If/StatelessIf, While/StatelessWhile, PartitionedCall/StatefulPartitionedCall over
            the graph's function library, TensorLists in gradients of loops, resource
            variables.
      Each flavor runs in its own process (the switch is process-wide). After writing, every
      case is imported back from its .pb into a fresh graph and run again; the values must be
      the same.
  golden_control_flow.py list
      Prints the cases' names and what each checks.

The JSON of a case:
  name, description, tensorflow (version), control_flow ("v1" or "v2"),
  init: the op to run once before the runs (the variables' initializer) or null,
  ops: the op types of the graph's nodes; function_ops: those inside its function library,
  runs: in order, in one session: {feeds: {tensor name: TENSOR}, fetches: [tensor names],
        targets: [op names], then results: {tensor name: TENSOR} or error: {code (TensorFlow's
        status code name), node (the failing node's name), message (the kernel's message)}}
  TENSOR: {dtype: "float32" | "float64" | "int32" | "int64" | "bool", shape: [dims],
           values: [row-major values]}

Exits 2 when TensorFlow cannot be imported.
"""

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# tf.compat.v1.nn.rnn_cell lives in tf-keras (Keras 2) under TensorFlow 2.16 and later.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

try:
    import numpy as np
    import tensorflow as tf
except ImportError as e:  # pragma: no cover - depends on the host
    print(f"golden_control_flow: {e}; pip install tensorflow-cpu tf-keras", file=sys.stderr)
    sys.exit(2)

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "data", "control_flow")

CODES = {getattr(tf.errors, n): n for n in dir(tf.errors) if n.isupper() and n != "OK"}


class Run:
    """One session.run: feeds {tensor: value}, fetches [tensors], targets [ops]."""

    def __init__(self, feeds=None, fetches=(), targets=()):
        self.feeds = feeds or {}
        self.fetches = list(fetches)
        self.targets = list(targets)


class Case:
    def __init__(self, name, flavor, description, build):
        self.name, self.flavor, self.description, self.build = name, flavor, description, build


CASES = []


def case(flavor, description):
    def register(build):
        CASES.append(Case(build.__name__, flavor, description, build))
        return build

    return register


def f32(values):
    return np.array(values, dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# v1 control flow, reference variables (disable_v2_behavior)


@case("v1", "tf.cond with a Merge fetched: the predicate fed true, then false")
def cond_merge():
    pred = tf.compat.v1.placeholder(tf.bool, [], name="pred")
    x = tf.compat.v1.placeholder(tf.float32, [3], name="x")
    out = tf.cond(pred, lambda: x * 2.0, lambda: x - 1.0, name="cond")
    xs = f32([1.0, 2.0, 3.0])
    return None, [
        Run({pred: True, x: xs}, [out]),
        Run({pred: False, x: xs}, [out]),
    ]


@case("v1", "tf.cond whose untaken branch fails when it runs (a gather past the end, an "
            "integer division by zero): the dead branch must not run; unguarded, the same ops fail")
def cond_untaken_fails():
    params = tf.constant([10.0, 20.0, 30.0], name="params")
    i = tf.compat.v1.placeholder(tf.int32, [], name="i")
    d = tf.compat.v1.placeholder(tf.int32, [], name="d")
    guarded = tf.cond(
        tf.less(i, 3), lambda: tf.gather(params, i), lambda: tf.constant(-1.0), name="guarded"
    )
    quotient = tf.cond(
        tf.not_equal(d, 0), lambda: tf.math.floordiv(100, d), lambda: tf.constant(0),
        name="safe_div",
    )
    unguarded = tf.gather(params, i, name="unguarded")
    division = tf.math.floordiv(tf.constant(100, name="hundred"), d, name="division")
    return None, [
        Run({i: 1, d: 4}, [guarded, quotient]),
        Run({i: 10, d: 0}, [guarded, quotient]),
        Run({i: 10}, [unguarded]),
        Run({d: 0}, [division]),
    ]


@case("v1", "a tf.cond inside a branch of another: all four predicate pairs")
def cond_nested():
    p = tf.compat.v1.placeholder(tf.bool, [], name="p")
    q = tf.compat.v1.placeholder(tf.bool, [], name="q")
    x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
    out = tf.cond(
        p,
        lambda: tf.cond(q, lambda: x * x, lambda: x + 10.0, name="inner"),
        lambda: -x,
        name="outer",
    )
    xs = f32([1.5, -2.0])
    return None, [
        Run({p: a, q: b, x: xs}, [out]) for a, b in [(True, True), (True, False), (False, True),
                                                      (False, False)]
    ]


@case("v1", "tf.while_loop summing i for i < n: a counter loop, run 10, 0 and 1 times")
def while_counter():
    n = tf.compat.v1.placeholder(tf.int32, [], name="n")
    i, total = tf.while_loop(
        lambda i, s: i < n, lambda i, s: (i + 1, s + i),
        [tf.constant(0), tf.constant(0)], name="sum",
    )
    return None, [Run({n: k}, [i, total]) for k in (10, 0, 1)]


@case("v1", "tf.while_loop with a loop invariant (w enters the frame with is_constant) and a "
            "MatMul in the body: x <- tanh(x w), 5 times")
def while_invariant_matmul():
    w = tf.compat.v1.placeholder(tf.float32, [3, 3], name="w")
    x0 = tf.compat.v1.placeholder(tf.float32, [1, 3], name="x0")
    k, x = tf.while_loop(
        lambda k, x: k < 5, lambda k, x: (k + 1, tf.tanh(tf.matmul(x, w))),
        [tf.constant(0), x0], name="loop",
    )
    ws = f32([[0.5, -0.2, 0.1], [0.3, 0.8, -0.5], [-0.7, 0.4, 0.9]])
    return None, [Run({w: ws, x0: f32([[1.0, -1.0, 0.5]])}, [k, x])]


@case("v1", "nested tf.while_loops, the inner one running i times in outer iteration i: "
            "sum over i < n of sum over j < i of i*j")
def while_nested():
    n = tf.compat.v1.placeholder(tf.int32, [], name="n")

    def outer(i, total):
        _, acc = tf.while_loop(
            lambda j, acc: j < i, lambda j, acc: (j + 1, acc + i * j),
            [tf.constant(0), tf.constant(0)], name="inner",
        )
        return i + 1, total + acc

    i, total = tf.while_loop(
        lambda i, total: i < n, outer, [tf.constant(0), tf.constant(0)], name="outer"
    )
    return None, [Run({n: k}, [i, total]) for k in (5, 1, 0)]


@case("v1", "tf.while_loop with parallel_iterations=10 writing independent rows into a "
            "TensorArray (12 and 3 iterations), stacked after the loop")
def while_parallel_tensorarray():
    n = tf.compat.v1.placeholder(tf.int32, [], name="n")
    x = tf.compat.v1.placeholder(tf.float32, [4], name="x")
    ta = tf.TensorArray(tf.float32, size=n, name="rows")

    def body(i, ta):
        fi = tf.cast(i, tf.float32)
        return i + 1, ta.write(i, tf.sin(fi) * x + tf.reduce_sum(x * fi))

    _, ta = tf.while_loop(lambda i, ta: i < n, body, [tf.constant(0), ta],
                          parallel_iterations=10, name="loop")
    out = ta.stack(name="stacked")
    xs = f32([0.5, -1.0, 2.0, 0.25])
    return None, [Run({n: 12, x: xs}, [out]), Run({n: 3, x: xs}, [out])]


@case("v1", "a tf.while_loop inside the branch of a tf.cond: when the branch is not taken the "
            "loop's frame is dead")
def while_in_untaken_cond():
    pred = tf.compat.v1.placeholder(tf.bool, [], name="pred")
    n = tf.compat.v1.placeholder(tf.int32, [], name="n")

    def doubling():
        _, s = tf.while_loop(
            lambda i, s: i < n, lambda i, s: (i + 1, s * 2.0),
            [tf.constant(0), tf.constant(1.0)], name="doubling",
        )
        return s

    out = tf.cond(pred, doubling, lambda: tf.constant(-1.0), name="maybe")
    return None, [
        Run({pred: False, n: 50}, [out]),
        Run({pred: True, n: 4}, [out]),
        Run({pred: False, n: 4}, [out]),
    ]


@case("v1", "tf.gradients through a tf.while_loop (y <- y x + sin y, 3 times): the gradient "
            "loop pops the forward values the forward loop pushed on Stacks")
def while_gradient():
    x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
    _, y = tf.while_loop(
        lambda i, y: i < 3, lambda i, y: (i + 1, y * x + tf.sin(y)),
        [tf.constant(0), tf.ones([2])], name="loop",
    )
    loss = tf.reduce_sum(y, name="loss")
    (grad,) = tf.gradients(loss, [x])
    return None, [
        Run({x: f32([0.5, -1.5])}, [y, grad]),
        Run({x: f32([1.0, 0.0])}, [loss, grad]),
    ]


@case("v1", "tf.gradients through a tf.cond (x*x or sin x): the gradient's Switch and Merge")
def cond_gradient():
    pred = tf.compat.v1.placeholder(tf.bool, [], name="pred")
    x = tf.compat.v1.placeholder(tf.float32, [3], name="x")
    y = tf.cond(pred, lambda: x * x, lambda: tf.sin(x), name="cond")
    (grad,) = tf.gradients(tf.reduce_sum(y), [x])
    xs = f32([0.5, -1.0, 2.0])
    return None, [Run({pred: True, x: xs}, [y, grad]), Run({pred: False, x: xs}, [y, grad])]


def tiny_rnn():
    """dynamic_rnn over a 3-unit BasicRNNCell (fixed weights, no random ops) on a batch of 2
    sequences of 4 steps of 2 features, lengths 4 and 2; half the sum of squared outputs plus
    the final states as the loss, one gradient-descent step."""
    x = tf.compat.v1.placeholder(tf.float32, [2, 4, 2], name="x")
    lengths = tf.compat.v1.placeholder(tf.int32, [2], name="lengths")
    kernel = np.linspace(-0.6, 0.7, 15, dtype=np.float32).reshape(5, 3)
    with tf.compat.v1.variable_scope("rnn", initializer=tf.compat.v1.constant_initializer(kernel)):
        cell = tf.compat.v1.nn.rnn_cell.BasicRNNCell(3)
        outputs, state = tf.compat.v1.nn.dynamic_rnn(
            cell, x, sequence_length=lengths, dtype=tf.float32
        )
    loss = tf.add(0.5 * tf.reduce_sum(tf.square(outputs)), tf.reduce_sum(state), name="loss")
    variables = tf.compat.v1.trainable_variables()
    grads = tf.gradients(loss, variables)
    train = tf.compat.v1.train.GradientDescentOptimizer(0.1).apply_gradients(
        list(zip(grads, variables)), name="train"
    )
    init = tf.compat.v1.global_variables_initializer()
    xs = np.linspace(-1.0, 1.0, 16, dtype=np.float32).reshape(2, 4, 2)
    feeds = {x: xs, lengths: np.array([4, 2], dtype=np.int32)}
    values = [v.value() for v in variables]
    return init, [
        Run(feeds, [outputs, state, loss] + grads),
        Run(feeds, [loss], [train]),
        Run(feeds, [loss] + values),
    ]


@case("v1", "dynamic_rnn (BasicRNNCell, sequence lengths) forward and gradient on reference "
            "variables (VariableV2, Assign initializers), then a gradient-descent step "
            "(ApplyGradientDescent) and the loss after it")
def dynamic_rnn_ref():
    return tiny_rnn()


# ---------------------------------------------------------------------------------------------
# TensorFlow 2 graph mode: functional control flow, resource variables


@case("v2", "tf.cond in TensorFlow 2's graph mode: StatelessIf for pure branches, If for "
            "branches that update a resource variable")
def v2_cond():
    pred = tf.compat.v1.placeholder(tf.bool, [], name="pred")
    x = tf.compat.v1.placeholder(tf.float32, [3], name="x")
    out = tf.cond(pred, lambda: x * 2.0, lambda: x - 1.0, name="cond")
    v = tf.Variable(1.0, name="v")
    bumped = tf.cond(pred, lambda: v.assign_add(1.0).read_value() * 1.0,
                     lambda: v.read_value() * 10.0, name="bump")
    init = tf.compat.v1.global_variables_initializer()
    xs = f32([1.0, 2.0, 3.0])
    return init, [
        Run({pred: True, x: xs}, [out, bumped]),
        Run({pred: False, x: xs}, [out, bumped]),
        Run({pred: True, x: xs}, [bumped]),
    ]


@case("v2", "tf.while_loop in TensorFlow 2's graph mode (While/StatelessWhile): a counter "
            "and x <- tanh(x w) with w captured from outside")
def v2_while():
    n = tf.compat.v1.placeholder(tf.int32, [], name="n")
    w = tf.compat.v1.placeholder(tf.float32, [3, 3], name="w")
    x0 = tf.compat.v1.placeholder(tf.float32, [1, 3], name="x0")
    k, total, x = tf.while_loop(
        lambda k, s, x: k < n, lambda k, s, x: (k + 1, s + k, tf.tanh(tf.matmul(x, w))),
        [tf.constant(0), tf.constant(0), x0], name="loop",
    )
    ws = f32([[0.5, -0.2, 0.1], [0.3, 0.8, -0.5], [-0.7, 0.4, 0.9]])
    feeds = {w: ws, x0: f32([[1.0, -1.0, 0.5]])}
    return None, [Run({**feeds, n: count}, [k, total, x]) for count in (5, 0)]


@case("v2", "tf.functions called in a graph: a pure one (PartitionedCall) and one updating a "
            "resource variable (StatefulPartitionedCall), from the graph's function library")
def v2_function():
    x = tf.compat.v1.placeholder(tf.float32, [2, 2], name="x")
    y = tf.compat.v1.placeholder(tf.float32, [2], name="y")
    v = tf.Variable([1.0, 2.0], name="v")

    @tf.function
    def affine(a, b):
        return tf.matmul(a, a) + b

    @tf.function
    def accumulate(b):
        v.assign_add(b)
        return v.read_value() * 2.0

    pure = tf.identity(affine(x, y), name="pure")
    stateful = tf.identity(accumulate(y), name="stateful")
    init = tf.compat.v1.global_variables_initializer()
    feeds = {x: f32([[1.0, 2.0], [3.0, 4.0]]), y: f32([0.5, -0.5])}
    return init, [Run(feeds, [pure, stateful]), Run(feeds, [stateful])]


@case("v2", "tf.gradients through a TensorFlow 2 tf.while_loop (y <- y x + sin y, 3 times): the "
            "forward loop accumulates in TensorLists the gradient While pops")
def v2_while_gradient():
    x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
    _, y = tf.while_loop(
        lambda i, y: i < 3, lambda i, y: (i + 1, y * x + tf.sin(y)),
        [tf.constant(0), tf.ones([2])], name="loop",
    )
    loss = tf.reduce_sum(y, name="loss")
    (grad,) = tf.gradients(loss, [x])
    return None, [
        Run({x: f32([0.5, -1.5])}, [y, grad]),
        Run({x: f32([1.0, 0.0])}, [loss, grad]),
    ]


@case("v2", "the dynamic_rnn of dynamic_rnn_ref in TensorFlow 2's graph mode: a While over "
            "TensorLists, resource variables, ResourceApplyGradientDescent")
def v2_dynamic_rnn():
    return tiny_rnn()


# ---------------------------------------------------------------------------------------------
# Writing


def tensor_json(value):
    a = np.asarray(value)
    dtype = {np.dtype(t): t for t in ("float32", "float64", "int32", "int64", "bool")}.get(a.dtype)
    if dtype is None:
        raise TypeError(f"no JSON encoding for {a.dtype}")
    return {"dtype": dtype, "shape": list(a.shape), "values": a.reshape(-1).tolist()}


def tensor_value(t):
    return np.array(t["values"], dtype=t["dtype"]).reshape(t["shape"])


def name_of(x):
    return x if isinstance(x, str) else x.name


def run_all(session, init, runs):
    """Runs `runs` (name-keyed dicts) in `session`; returns each with results or error."""
    if init:
        session.run(init)
    out = []
    for r in runs:
        feeds = {k: tensor_value(v) for k, v in r["feeds"].items()}
        record = dict(r)
        try:
            values = session.run(r["fetches"] + r["targets"], feeds)[: len(r["fetches"])]
            record["results"] = {k: tensor_json(v) for k, v in zip(r["fetches"], values)}
        except tf.errors.OpError as e:
            record["error"] = {
                "code": CODES[e.error_code],
                "node": e.node_def.name if e.node_def else None,
                "message": error_line(e.message),
            }
        out.append(record)
    return out


def error_line(message):
    """The kernel's own message out of a session's error (which adds where the node was
    defined and a `[[{{node ...}}]]` line)."""
    lines = [l for l in message.splitlines() if l.strip()]
    for i, line in enumerate(lines):
        if line.startswith("Node: ") and i + 1 < len(lines):
            return lines[i + 1].strip()
    return lines[-1].strip() if lines else ""


def ops_of(graph_def):
    nodes = sorted({n.op for n in graph_def.node})
    functions = sorted({n.op for f in graph_def.library.function for n in f.node_def})
    return nodes, functions


def write_case(c, out_dir):
    graph = tf.Graph()
    with graph.as_default():
        init, runs = c.build()
    runs = [
        {
            # A feed has its placeholder's dtype (TensorFlow converts Python numbers to it).
            "feeds": {
                name_of(k): tensor_json(np.asarray(v, dtype=k.dtype.as_numpy_dtype))
                for k, v in r.feeds.items()
            },
            "fetches": [name_of(t) for t in r.fetches],
            "targets": [name_of(t) for t in r.targets],
        }
        for r in runs
    ]
    init = init.name if init is not None else None
    with tf.compat.v1.Session(graph=graph) as session:
        runs = run_all(session, init, runs)
    graph_def = graph.as_graph_def()
    ops, function_ops = ops_of(graph_def)
    record = {
        "name": c.name,
        "description": c.description,
        "tensorflow": tf.__version__,
        "control_flow": c.flavor,
        "init": init,
        "ops": ops,
        "function_ops": function_ops,
        "functions": sorted(f.signature.name for f in graph_def.library.function),
        "runs": runs,
    }
    with open(os.path.join(out_dir, c.name + ".pb"), "wb") as f:
        f.write(graph_def.SerializeToString(deterministic=True))
    with open(os.path.join(out_dir, c.name + ".json"), "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    return record


def check_case(name, out_dir):
    """Imports the written .pb into a fresh graph and runs the case again: same values."""
    with open(os.path.join(out_dir, name + ".json")) as f:
        record = json.load(f)
    graph_def = tf.compat.v1.GraphDef()
    with open(os.path.join(out_dir, name + ".pb"), "rb") as f:
        graph_def.ParseFromString(f.read())
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    bare = [{k: r[k] for k in ("feeds", "fetches", "targets")} for r in record["runs"]]
    with tf.compat.v1.Session(graph=graph) as session:
        again = run_all(session, record["init"], bare)
    for i, (a, b) in enumerate(zip(record["runs"], again)):
        if "error" in a or "error" in b:
            assert a.get("error", {}).get("code") == b.get("error", {}).get("code"), (name, i, a, b)
            continue
        for k in a["fetches"]:
            x, y = tensor_value(a["results"][k]), tensor_value(b["results"][k])
            assert x.shape == y.shape and np.allclose(x, y, rtol=1e-6, atol=0), (name, i, k, x, y)


def write(args):
    if args.flavor == "both":
        for flavor in ("v1", "v2"):
            subprocess.run(
                [sys.executable, os.path.abspath(__file__), "write", "--out", args.out,
                 "--flavor", flavor],
                check=True,
            )
        return
    if args.flavor == "v1":
        tf.compat.v1.disable_v2_behavior()
    else:
        tf.compat.v1.disable_eager_execution()
    os.makedirs(args.out, exist_ok=True)
    for c in CASES:
        if c.flavor != args.flavor:
            continue
        record = write_case(c, args.out)
        check_case(c.name, args.out)
        outcomes = ["error " + r["error"]["code"] if "error" in r else "ok" for r in record["runs"]]
        print(f"{c.name}: {len(record['ops'])} op types, runs: {', '.join(outcomes)}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    writer = commands.add_parser("write")
    writer.add_argument("--out", default=DEFAULT_OUT)
    writer.add_argument("--flavor", choices=["v1", "v2", "both"], default="both")
    commands.add_parser("list")
    args = parser.parse_args()
    if args.command == "list":
        for c in CASES:
            print(f"{c.name} ({c.flavor}): {c.description}")
    else:
        write(args)


if __name__ == "__main__":
    main()
