"""Writes dynamic_rnn_v1.pb and dynamic_rnn_v2.pb: the GraphDef of a
tf.compat.v1.nn.dynamic_rnn (a tanh cell of 6 units over x [4, 5, 3]) trained by
GradientDescentOptimizer(0.1).minimize(sum(out * out)), built by TensorFlow 2.21 in graph mode
with TensorFlow 1 control flow (Enter/Exit/Merge/Switch, TensorArrays, stacks) and with
TensorFlow 2 control flow (StatelessWhile over TensorLists).

Run: python make_dynamic_rnn.py [output directory]
"""
import sys

import tensorflow as tf

tf.compat.v1.disable_eager_execution()


class Cell:
    """A tanh RNN cell (Keras 3 has no BasicRNNCell)."""

    def __init__(self, n):
        self.n = n

    @property
    def state_size(self):
        return self.n

    @property
    def output_size(self):
        return self.n

    def zero_state(self, batch, dtype):
        return tf.zeros([batch, self.n], dtype)

    def get_initial_state(self, inputs=None, batch_size=None, dtype=None):
        return self.zero_state(batch_size, dtype)

    def __call__(self, inputs, state, scope=None):
        with tf.compat.v1.variable_scope("cell", reuse=tf.compat.v1.AUTO_REUSE):
            w = tf.compat.v1.get_variable("w", [int(inputs.shape[-1]) + self.n, self.n])
            b = tf.compat.v1.get_variable(
                "b", [self.n], initializer=tf.compat.v1.zeros_initializer())
        h = tf.tanh(tf.matmul(tf.concat([inputs, state], 1), w) + b)
        return h, h


def build(v2):
    if v2:
        tf.compat.v1.enable_control_flow_v2()
    else:
        tf.compat.v1.disable_control_flow_v2()
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 5, 3], name="x")
        out, _ = tf.compat.v1.nn.dynamic_rnn(Cell(6), x, dtype=tf.float32)
        loss = tf.reduce_sum(out * out)
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
    return g


out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
for v2 in (False, True):
    name = "dynamic_rnn_%s.pb" % ("v2" if v2 else "v1")
    with open("%s/%s" % (out_dir, name), "wb") as f:
        f.write(build(v2).as_graph_def().SerializeToString())
