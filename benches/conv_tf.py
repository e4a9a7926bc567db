"""TensorFlow's side of benches/conv.rs: times its own CPU Conv2D kernels on request.

Reads lines `CASE N` on stdin (CASE one of the bench's case names, N a repetition count) and
answers each with `CASE SECONDS`, the best of three timings of N calls, per call. The inputs
are built once per case from the shapes on the command line (`name:n,h,w,c:kh,kw,ci,co ...`),
so only the kernels are timed: the forward convolution and both backprops, each a
`tf.function` compiled once (TensorFlow's oneDNN kernels on this build).
"""

import sys
import time

import numpy as np
import tensorflow as tf


def parse(arg):
    name, x, f = arg.split(":")
    return name, [int(v) for v in x.split(",")], [int(v) for v in f.split(",")]


def main():
    cases = {}
    for arg in sys.argv[1:]:
        name, xs, fs = parse(arg)
        rng = np.random.default_rng(7)
        x = tf.constant(rng.standard_normal(xs, dtype=np.float32))
        f = tf.constant(rng.standard_normal(fs, dtype=np.float32))
        y = tf.nn.conv2d(x, f, strides=1, padding="SAME")
        dy = tf.constant(rng.standard_normal(y.shape, dtype=np.float32))
        fwd = tf.function(lambda x=x, f=f: tf.nn.conv2d(x, f, strides=1, padding="SAME"))
        bin_ = tf.function(
            lambda f=f, dy=dy: tf.raw_ops.Conv2DBackpropInput(
                input_sizes=xs, filter=f, out_backprop=dy, strides=[1, 1, 1, 1], padding="SAME"
            )
        )
        bfl = tf.function(
            lambda x=x, dy=dy: tf.raw_ops.Conv2DBackpropFilter(
                input=x, filter_sizes=fs, out_backprop=dy, strides=[1, 1, 1, 1], padding="SAME"
            )
        )
        for fn in (fwd, bin_, bfl):
            fn().numpy()
        cases[name + "/forward"] = fwd
        cases[name + "/backprop_input"] = bin_
        cases[name + "/backprop_filter"] = bfl
    print("ready", flush=True)
    for line in sys.stdin:
        case, n = line.split()
        fn = cases[case]
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(int(n)):
                out = fn()
            out.numpy()
            best = min(best, (time.perf_counter() - start) / int(n))
        print(case, best, flush=True)


if __name__ == "__main__":
    main()
