"""Gradients TensorFlow computes for the graphs of tests/builder_control_flow.rs.

Run with stock TensorFlow (2.21 gave the numbers pasted in the test):
    /work/tf-venv/bin/python tests/builder_control_flow_tf.py
Every graph is built with tf.compat.v1 control flow (v2 behaviour disabled, so cond and
while_loop build Switch/Merge and Enter/Exit frames) and fed the same values as the Rust test.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_v2_behavior()


def values(n, seed):
    """The test's deterministic inputs: ((k * 37 + seed) % 23) / 23 - 0.5."""
    return np.array([((k * 37 + seed) % 23) / 23.0 - 0.5 for k in range(n)], np.float64)


def show(name, arrays):
    for i, a in enumerate(arrays):
        flat = ", ".join(repr(float(v)) for v in np.ravel(a))
        print(f"{name}[{i}] = [{flat}]")


def cond_case():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float64, [3], name="x")
        y = tf.compat.v1.placeholder(tf.float64, [3], name="y")
        p = tf.compat.v1.placeholder(tf.bool, [], name="p")
        half = tf.constant(0.5, tf.float64)
        out = tf.compat.v1.cond(
            p, lambda: tf.tanh(x * y) + half * x, lambda: x * x * y
        )
        w = tf.constant([1.0, 2.0, 3.0], tf.float64)
        loss = tf.reduce_sum(out * w)
        grads = tf.gradients(loss, [x, y])
        with tf.compat.v1.Session() as s:
            for pv in [True, False]:
                r = s.run([loss] + grads, {x: values(3, 1), y: values(3, 2), p: pv})
                show(f"cond p={pv}", r)


def rnn(xs, h0, w, u, b, steps):
    def body(i, h, acc):
        x_t = tf.gather(xs, i)
        h2 = tf.tanh(tf.matmul(x_t, w) + tf.matmul(h, u) + b)
        return i + 1, h2, acc + h2 * h2

    zero = tf.zeros([2, 2], tf.float64)
    return tf.compat.v1.while_loop(
        lambda i, h, acc: i < steps, body, [tf.constant(0), h0, zero]
    )


def while_case():
    g = tf.Graph()
    with g.as_default():
        xs = tf.compat.v1.placeholder(tf.float64, [4, 2, 3], name="xs")
        h0 = tf.compat.v1.placeholder(tf.float64, [2, 2], name="h0")
        w = tf.compat.v1.placeholder(tf.float64, [3, 2], name="w")
        u = tf.compat.v1.placeholder(tf.float64, [2, 2], name="u")
        b = tf.compat.v1.placeholder(tf.float64, [2], name="b")
        _, h, acc = rnn(xs, h0, w, u, b, 4)
        v = tf.constant([[1.0, -1.0], [0.5, 2.0]], tf.float64)
        loss = tf.reduce_sum(acc) + tf.reduce_sum(h * v)
        # The gradient of the sequence is IndexedSlices (from tf.gather): made dense here.
        grads = [tf.convert_to_tensor(t) for t in tf.gradients(loss, [xs, h0, w, u, b])]
        feed = {
            xs: values(24, 3).reshape(4, 2, 3),
            h0: values(4, 4).reshape(2, 2),
            w: values(6, 5).reshape(3, 2),
            u: values(4, 6).reshape(2, 2),
            b: values(2, 7),
        }
        with tf.compat.v1.Session() as s:
            show("rnn", s.run([loss] + grads, feed))


def nested_case():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float64, [2], name="x")
        p = tf.compat.v1.placeholder(tf.bool, [], name="p")

        def body(i, h):
            even = tf.equal(i % 2, 0)
            return i + 1, tf.compat.v1.cond(even, lambda: h * x, lambda: tf.square(h))

        out = tf.compat.v1.while_loop(lambda i, h: i < 4, body, [tf.constant(0), x])
        loss = tf.reduce_sum(out[1])
        grads = tf.gradients(loss, [x])

        def taken():
            return tf.compat.v1.while_loop(
                lambda i, h: i < 3, lambda i, h: (i + 1, h * x), [tf.constant(0), x]
            )[1]

        out2 = tf.compat.v1.cond(p, taken, lambda: tf.square(x))
        loss2 = tf.reduce_sum(out2)
        grads2 = tf.gradients(loss2, [x])
        with tf.compat.v1.Session() as s:
            show("cond in while", s.run([loss] + grads, {x: values(2, 8)}))
            for pv in [True, False]:
                show(f"while in cond p={pv}", s.run([loss2] + grads2, {x: values(2, 8), p: pv}))


def unread_case():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float64, [2], name="x")
        y = tf.compat.v1.placeholder(tf.float64, [2], name="y")
        # `a` is not read after the loop, and `c`'s next value ignores its previous one.
        _, _, c = tf.compat.v1.while_loop(
            lambda i, a, c: i < 3,
            lambda i, a, c: (i + 1, a * x, tf.tanh(a)),
            [tf.constant(0), x, y],
        )
        loss = tf.reduce_sum(c)
        grads = tf.gradients(loss, [x, y])
        with tf.compat.v1.Session() as s:
            show("unread", s.run([loss] + grads, {x: values(2, 9), y: values(2, 10)}))


if __name__ == "__main__":
    cond_case()
    while_case()
    nested_case()
    unread_case()
