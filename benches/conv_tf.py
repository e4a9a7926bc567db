"""TensorFlow's side of benches/conv.rs: times its own CPU convolution kernels on request.

Reads lines `CASE N` on stdin (CASE one of the bench's case names, N a repetition count) and
answers each with `CASE SECONDS`, the best of three timings of N calls, per call. The inputs
are built once per case from the op and shapes on the command line
(`name:op:n,h,w,c:kh,kw,ci,co ...`, op `Conv2D` or `DepthwiseConv2dNative`), so only the kernels
are timed: the forward convolution and both backprops, each a `tf.function` compiled once
(TensorFlow's oneDNN kernels on this build).
"""

import sys
import time

import numpy as np
import tensorflow as tf


def parse(arg):
    name, op, x, f = arg.split(":")
    return name, op, [int(v) for v in x.split(",")], [int(v) for v in f.split(",")]


def main():
    cases = {}
    for arg in sys.argv[1:]:
        name, op, xs, fs = parse(arg)
        rng = np.random.default_rng(7)
        x = tf.constant(rng.standard_normal(xs, dtype=np.float32))
        f = tf.constant(rng.standard_normal(fs, dtype=np.float32))
        forward = getattr(tf.raw_ops, op)
        backprop_input = getattr(tf.raw_ops, op + "BackpropInput")
        backprop_filter = getattr(tf.raw_ops, op + "BackpropFilter")
        same = dict(strides=[1, 1, 1, 1], padding="SAME")
        y = forward(input=x, filter=f, **same)
        dy = tf.constant(rng.standard_normal(y.shape, dtype=np.float32))
        fwd = tf.function(lambda x=x, f=f, forward=forward: forward(input=x, filter=f, **same))
        bin_ = tf.function(
            lambda f=f, dy=dy, xs=xs, backprop_input=backprop_input: backprop_input(
                input_sizes=xs, filter=f, out_backprop=dy, **same
            )
        )
        bfl = tf.function(
            lambda x=x, dy=dy, fs=fs, backprop_filter=backprop_filter: backprop_filter(
                input=x, filter_sizes=fs, out_backprop=dy, **same
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
