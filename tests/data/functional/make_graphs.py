"""Writes the functional control-flow graphs of tests/functional_control_flow.rs.

Each graph is what TensorFlow 2 writes in graph mode (eager execution disabled, so
`tf.while_loop`, `tf.cond` and calls of `tf.function`s become While/StatelessWhile,
If/StatelessIf and (Stateful)PartitionedCall nodes over the graph's function library).
Every `<name>.pb` is `as_graph_def()` of its graph; `<name>.json` holds the runs the test
repeats, in order, with the values TensorFlow computed:
  {"runs": [{"feeds": {tensor: value}, "fetches": [tensor...], "targets": [node...],
             "values": [value...]}]}

Run with TensorFlow 2.21: /work/tf-venv/bin/python tests/data/functional/make_graphs.py
"""

import json
import os

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()
HERE = os.path.dirname(os.path.abspath(__file__))


def plain(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (np.generic,)):
        return v.item()
    return v


def write(name, graph, runs):
    """Runs `runs` ((feeds, fetches, targets) triples) in one session and writes the files."""
    out = []
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
        for feeds, fetches, targets in runs:
            feed_dict = {graph.get_tensor_by_name(k): v for k, v in feeds.items()}
            values = sess.run(list(fetches) + [graph.get_operation_by_name(t) for t in targets],
                              feed_dict=feed_dict)[: len(fetches)]
            out.append({
                "feeds": {k: plain(v) for k, v in feeds.items()},
                "fetches": list(fetches),
                "targets": list(targets),
                "values": [plain(v) for v in values],
            })
    with open(os.path.join(HERE, name + ".pb"), "wb") as f:
        f.write(graph.as_graph_def().SerializeToString())
    with open(os.path.join(HERE, name + ".json"), "w") as f:
        json.dump({"runs": out}, f, indent=1)
    ops = sorted({n.op for n in graph.as_graph_def().node}
                 | {n.op for fn in graph.as_graph_def().library.function for n in fn.node_def})
    print(name, ops)


def fib():
    """Fibonacci: (i, a, b) -> (i + 1, b, a + b) while i < n; StatelessWhile."""
    g = tf.Graph()
    with g.as_default():
        n = tf.compat.v1.placeholder(tf.int32, [], name="n")
        i, a, b = tf.while_loop(lambda i, a, b: i < n,
                                lambda i, a, b: (i + 1, b, a + b),
                                [tf.constant(0), tf.constant(0), tf.constant(1)], name="fib")
        tf.identity(a, name="fib_n")
    outs = ["fib_n:0", b.name, i.name]
    write("while_fib", g, [({"n:0": k}, outs, []) for k in [0, 1, 2, 10, 30]])


def sum_squares():
    """Sum of squares with maximum_iterations: the cond also checks the loop counter."""
    g = tf.Graph()
    with g.as_default():
        n = tf.compat.v1.placeholder(tf.float32, [], name="n")
        x = tf.compat.v1.placeholder(tf.float32, [3], name="x")
        _, total, vec = tf.while_loop(
            lambda k, s, v: k <= n,
            lambda k, s, v: (k + 1.0, s + k * k, v * 2.0),
            [tf.constant(1.0), tf.constant(0.0), x],
            maximum_iterations=7, name="squares")
        tf.identity(total, name="total")
        tf.identity(vec, name="vec")
    outs = ["total:0", "vec:0"]
    runs = [({"n:0": k, "x:0": [1.0, -2.0, 0.5]}, outs, []) for k in [0.0, 3.0, 5.0, 100.0]]
    write("while_squares", g, runs)


def collatz():
    """Collatz steps: a tf.cond inside the loop body (StatelessIf in the body function)."""
    g = tf.Graph()
    with g.as_default():
        x0 = tf.compat.v1.placeholder(tf.int64, [], name="x")

        def body(x, steps):
            x = tf.cond(tf.equal(x % 2, 0), lambda: x // 2, lambda: 3 * x + 1)
            return x, steps + 1

        x, steps = tf.while_loop(lambda x, steps: tf.not_equal(x, 1), body,
                                 [x0, tf.constant(0)], name="collatz")
        tf.identity(steps, name="steps")
        tf.identity(x, name="last")
    runs = [({"x:0": k}, ["steps:0", "last:0"], []) for k in [1, 6, 27, 97]]
    write("while_cond", g, runs)


def call_two_outputs():
    """A tf.function with two outputs called in a graph (PartitionedCall), and one holding a
    while loop of its own (a functional op inside a function body)."""
    g = tf.Graph()
    with g.as_default():
        @tf.function
        def sum_and_product(x, y):
            return x + y, x * y

        @tf.function
        def triangle(n):
            # 1 + 2 + ... + n by a loop inside the function.
            _, t = tf.while_loop(lambda k, t: k <= n, lambda k, t: (k + 1, t + k),
                                 [tf.constant(1), tf.constant(0)])
            return t

        x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [2], name="y")
        s, p = sum_and_product(x, y)
        tf.identity(s, name="sum")
        tf.identity(p, name="product")
        n = tf.compat.v1.placeholder(tf.int32, [], name="n")
        tf.identity(triangle(n), name="triangle")
    runs = [
        ({"x:0": [1.0, 2.5], "y:0": [3.0, -4.0]}, ["sum:0", "product:0"], []),
        ({"n:0": 10}, ["triangle:0"], []),
        ({"n:0": 0}, ["triangle:0"], []),
    ]
    write("call_two_outputs", g, runs)


def while_variable():
    """A While whose body updates a resource variable (ReadVariableOp, AssignVariableOp) and
    reads it back: a stateful While with the variable's handle as a loop input. A
    tf.function updating the same variable runs as a StatefulPartitionedCall."""
    g = tf.Graph()
    with g.as_default():
        v = tf.Variable(1.0, name="v")
        n = tf.compat.v1.placeholder(tf.int32, [], name="n")

        def body(i, seen):
            # The assign's value is read after it (a ReadVariableOp with a control input on
            # the AssignVariableOp).
            doubled = v.assign(v.read_value() * 2.0)
            return i + 1, seen + doubled

        # One iteration at a time: nothing orders one iteration's assignment before the next
        # one's read but the iterations themselves (TensorFlow writes no control edge
        # between them; lowered, parallel iterations would race, in TensorFlow as well).
        _, seen = tf.while_loop(lambda i, seen: i < n, body,
                                [tf.constant(0), tf.constant(0.0)], parallel_iterations=1,
                                name="doubling")
        tf.identity(seen, name="seen")

        @tf.function
        def add_to_v(x):
            v.assign_add(x)
            return v.read_value(), x * 10.0

        after, tens = add_to_v(tf.constant(0.5))
        tf.identity(after, name="after_add")
        tf.identity(tens, name="tens")
        tf.identity(v.read_value(), name="read_v")
    init = v.initializer.name
    runs = [
        ({}, [], [init]),
        ({"n:0": 3}, ["seen:0"], []),
        ({}, ["read_v:0"], []),
        ({"n:0": 2}, ["seen:0"], []),
        ({}, ["after_add:0", "tens:0"], []),
        ({}, ["read_v:0"], []),
    ]
    write("while_variable", g, runs)


def endless():
    """A loop whose condition never becomes false."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [], name="x")
        (r,) = tf.while_loop(lambda k: k > -1.0, lambda k: k + 1.0, [x], name="forever")
        tf.identity(r, name="never")
    with open(os.path.join(HERE, "while_endless.pb"), "wb") as f:
        f.write(g.as_graph_def().SerializeToString())
    print("while_endless", sorted({n.op for n in g.as_graph_def().node}))


fib()
sum_squares()
collatz()
call_two_outputs()
while_variable()
endless()
