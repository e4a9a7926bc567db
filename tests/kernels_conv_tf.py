"""TensorFlow's side of tests/kernels_conv.rs and tests/cnn.rs: the numbers stock TensorFlow
computes for convolutions, pooling and a small CNN's gradients, on seeded inputs, printed as one
JSON line.

    python3 tests/kernels_conv_tf.py kernels   # Conv2D, its backprops and pooling over a grid
    python3 tests/kernels_conv_tf.py cnn       # a small CNN's loss and tf.GradientTape gradients

Every value is float32. Inputs are printed with the outputs, so the Rust side runs its kernels on
exactly these. A case TensorFlow's CPU kernels refuse in one layout (the NCHW pooling gradients,
NCHW anything without oneDNN) is computed in NHWC between transposes, and says so (`via`).
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

rng = np.random.default_rng(20261127)
TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def flat(t):
    return np.asarray(t, dtype=np.float32).astype(np.float64).ravel().tolist()


def in_format(fmt, nhwc):
    """A per-dimension list given in NHWC order, laid out in `fmt`."""
    return nhwc if fmt == "NHWC" else [nhwc[0], nhwc[3], nhwc[1], nhwc[2]]


def either_layout(fmt, direct, nhwc):
    """`direct()` in `fmt`; if TensorFlow refuses, `nhwc()` between transposes."""
    try:
        return [np.asarray(t) for t in direct()], "direct"
    except (tf.errors.UnimplementedError, tf.errors.InvalidArgumentError):
        if fmt == "NHWC":
            raise
        return [np.asarray(t) for t in nhwc()], "transpose"


def conv_case(fmt, padding, strides, dilations, n=2, h=7, w=6, cin=3, kh=3, kw=2,
              depth=None, cout=4, explicit=((1, 2), (0, 1))):
    depth = depth or cin
    x_nhwc = rng.uniform(-1, 1, (n, h, w, cin)).astype(np.float32)
    f = rng.uniform(-1, 1, (kh, kw, depth, cout)).astype(np.float32)
    x = x_nhwc if fmt == "NHWC" else x_nhwc.transpose(TO_NCHW)
    ep = []
    if padding == "EXPLICIT":
        ep = sum(in_format(fmt, [(0, 0), explicit[0], explicit[1], (0, 0)]), ())
        ep = list(ep)
    attrs = dict(strides=in_format(fmt, [1, strides[0], strides[1], 1]), padding=padding,
                 explicit_paddings=ep, dilations=in_format(fmt, [1, dilations[0], dilations[1], 1]))
    nhwc_attrs = dict(attrs, strides=[1, strides[0], strides[1], 1],
                      dilations=[1, dilations[0], dilations[1], 1],
                      explicit_paddings=list(sum([(0, 0), explicit[0], explicit[1], (0, 0)], ()))
                      if padding == "EXPLICIT" else [])

    (y,), via = either_layout(
        fmt, lambda: [tf.raw_ops.Conv2D(input=x, filter=f, data_format=fmt, **attrs)],
        lambda: [tf.transpose(tf.raw_ops.Conv2D(input=x_nhwc, filter=f, **nhwc_attrs), TO_NCHW)])
    dy = rng.uniform(-1, 1, y.shape).astype(np.float32)
    dy_nhwc = dy if fmt == "NHWC" else dy.transpose(TO_NHWC)
    def backprops(fmt, x, f, dy, attrs):
        try:
            return [tf.raw_ops.Conv2DBackpropInput(input_sizes=list(x.shape), filter=f,
                                                   out_backprop=dy, data_format=fmt, **attrs),
                    tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=list(f.shape),
                                                    out_backprop=dy, data_format=fmt, **attrs)]
        except tf.errors.InvalidArgumentError:
            # TensorFlow's CPU backprops refuse grouped filters where it runs without oneDNN
            # (a CPU without AVX-512, say). A grouped convolution is its groups' ungrouped
            # convolutions side by side, each on its own input and output channels.
            axis = 3 if fmt == "NHWC" else 1
            groups = np.asarray(x).shape[axis] // f.shape[2]
            if groups <= 1:
                raise
            parts = [backprops(fmt, xg, fg, dyg, attrs) for xg, fg, dyg in zip(
                np.split(np.asarray(x), groups, axis), np.split(f, groups, 3),
                np.split(np.asarray(dy), groups, axis))]
            return [np.concatenate([np.asarray(p[0]) for p in parts], axis),
                    np.concatenate([np.asarray(p[1]) for p in parts], 3)]

    def undilated_backprops(fmt, x, f, dy, attrs):
        # TensorFlow's CPU backprops refuse dilations > 1. A dilated convolution is the
        # undilated convolution with the filter's taps spread apart by zeros, so the input
        # gradient is that convolution's, and the filter gradient its every d-th tap.
        dh, dw = dilations
        spread = np.zeros(((kh - 1) * dh + 1, (kw - 1) * dw + 1, depth, cout), np.float32)
        spread[::dh, ::dw] = f
        plain = dict(attrs, dilations=[1, 1, 1, 1])
        dx, dspread = backprops(fmt, x, spread, dy, plain)
        return [dx, np.asarray(dspread)[::dh, ::dw]]

    bp = backprops if dilations == (1, 1) else undilated_backprops
    (dx, df), via2 = either_layout(
        fmt,
        lambda: bp(fmt, x, f, dy, attrs),
        lambda: (lambda r: [tf.transpose(r[0], TO_NCHW), r[1]])(
            bp("NHWC", x_nhwc, f, dy_nhwc, nhwc_attrs)))
    if dilations != (1, 1):
        via2 = "spread filter" if via2 == "direct" else via2 + ", spread filter"
    return dict(data_format=fmt, via=via, via_backprops=via2,
                x_shape=list(x.shape), x=flat(x), f_shape=list(f.shape), f=flat(f),
                y_shape=list(y.shape), y=flat(y), dy=flat(dy), dx=flat(dx), df=flat(df),
                **attrs)


def pool_case(op, fmt, padding, ksize, strides, n=2, h=7, w=6, c=3, explicit=((1, 0), (1, 1))):
    # Quarter steps in [-1, 1]: many ties inside windows, to check which maximum gets the
    # gradient.
    x_nhwc = (rng.integers(-4, 5, (n, h, w, c)) / 4).astype(np.float32)
    x = x_nhwc if fmt == "NHWC" else x_nhwc.transpose(TO_NCHW)
    ep = []
    if padding == "EXPLICIT":
        ep = list(sum(in_format(fmt, [(0, 0), explicit[0], explicit[1], (0, 0)]), ()))
    k4, s4 = in_format(fmt, [1, *ksize, 1]), in_format(fmt, [1, *strides, 1])
    k4n, s4n = [1, *ksize, 1], [1, *strides, 1]
    epn = list(sum([(0, 0), explicit[0], explicit[1], (0, 0)], ())) if ep else []
    extra = dict(explicit_paddings=ep) if op == "MaxPool" else {}
    extran = dict(explicit_paddings=epn) if op == "MaxPool" else {}
    t = lambda v: tf.transpose(v, TO_NCHW)  # noqa: E731

    def forward_direct():
        if op == "MaxPool":
            return [tf.raw_ops.MaxPool(input=x, ksize=k4, strides=s4, padding=padding,
                                       data_format=fmt, **extra)]
        if op == "MaxPoolV2":
            return [tf.raw_ops.MaxPoolV2(input=x, ksize=k4, strides=s4, padding=padding,
                                         data_format=fmt)]
        return [tf.raw_ops.AvgPool(value=x, ksize=k4, strides=s4, padding=padding,
                                   data_format=fmt)]

    def forward_nhwc():
        if op.startswith("MaxPool"):
            return [t(tf.raw_ops.MaxPool(input=x_nhwc, ksize=k4n, strides=s4n, padding=padding,
                                         **extran))]
        return [t(tf.raw_ops.AvgPool(value=x_nhwc, ksize=k4n, strides=s4n, padding=padding))]

    (y,), via = either_layout(fmt, forward_direct, forward_nhwc)
    dy = rng.uniform(-1, 1, y.shape).astype(np.float32)
    y_nhwc = y if fmt == "NHWC" else y.transpose(TO_NHWC)
    dy_nhwc = dy if fmt == "NHWC" else dy.transpose(TO_NHWC)

    def grad_direct():
        if op == "MaxPool":
            return [tf.raw_ops.MaxPoolGrad(orig_input=x, orig_output=y, grad=dy, ksize=k4,
                                           strides=s4, padding=padding, data_format=fmt,
                                           **extra)]
        if op == "MaxPoolV2":
            return [tf.raw_ops.MaxPoolGradV2(orig_input=x, orig_output=y, grad=dy, ksize=k4,
                                             strides=s4, padding=padding, data_format=fmt)]
        return [tf.raw_ops.AvgPoolGrad(orig_input_shape=list(x.shape), grad=dy, ksize=k4,
                                       strides=s4, padding=padding, data_format=fmt)]

    def grad_nhwc():
        if op.startswith("MaxPool"):
            return [t(tf.raw_ops.MaxPoolGrad(orig_input=x_nhwc, orig_output=y_nhwc,
                                             grad=dy_nhwc, ksize=k4n, strides=s4n,
                                             padding=padding, **extran))]
        return [t(tf.raw_ops.AvgPoolGrad(orig_input_shape=list(x_nhwc.shape), grad=dy_nhwc,
                                         ksize=k4n, strides=s4n, padding=padding))]

    (dx,), via2 = either_layout(fmt, grad_direct, grad_nhwc)
    return dict(op=op, data_format=fmt, padding=padding, ksize=k4, strides=s4,
                explicit_paddings=ep, via=via if via == via2 else "mixed",
                x_shape=list(x.shape), x=flat(x), y_shape=list(y.shape), y=flat(y),
                dy=flat(dy), dx=flat(dx))


def kernels():
    conv = []
    for fmt in ["NHWC", "NCHW"]:
        for padding in ["SAME", "VALID", "EXPLICIT"]:
            for strides, dilations in [((1, 1), (1, 1)), ((2, 2), (1, 1)), ((1, 2), (1, 1)),
                                       ((1, 1), (2, 2)), ((2, 1), (1, 2))]:
                conv.append(conv_case(fmt, padding, strides, dilations))
        # Grouped filters (input depth 4, filter depth 2) and a 1x1 convolution.
        conv.append(conv_case(fmt, "SAME", (1, 1), (1, 1), cin=4, depth=2, cout=6))
        conv.append(conv_case(fmt, "VALID", (1, 1), (1, 1), kh=1, kw=1))
        # Batches with work enough to be split into one range of images per core, grouped
        # and not.
        big = dict(n=5, h=24, w=20, cin=16, kh=3, kw=3, cout=32)
        conv.append(conv_case(fmt, "SAME", (1, 1), (1, 1), **big))
        conv.append(conv_case(fmt, "VALID", (1, 1), (1, 1), depth=8, **big))
    pool = []
    for op in ["MaxPool", "AvgPool"]:
        for fmt in ["NHWC", "NCHW"]:
            paddings = ["SAME", "VALID"] + (["EXPLICIT"] if op == "MaxPool" else [])
            for padding in paddings:
                for ksize, strides in [((2, 2), (2, 2)), ((3, 2), (1, 2)), ((3, 3), (2, 1))]:
                    pool.append(pool_case(op, fmt, padding, ksize, strides))
    for fmt in ["NHWC", "NCHW"]:
        pool.append(pool_case("MaxPoolV2", fmt, "SAME", (3, 2), (2, 2)))
    print(json.dumps(dict(conv=conv, pool=pool)))


def cnn():
    """conv 3x3 SAME (4 filters) -> bias -> relu -> max pool 2x2 -> dense (10) -> softmax
    cross-entropy, batch-mean, on 8x8x1 inputs: the loss and every gradient."""
    n = 6
    x = rng.uniform(0, 1, (n, 8, 8, 1)).astype(np.float32)
    labels = rng.integers(0, 10, n)
    onehot = np.eye(10, dtype=np.float32)[labels]
    w = dict(conv=rng.normal(0, 0.5, (3, 3, 1, 4)).astype(np.float32),
             conv_b=rng.normal(0, 0.1, (4,)).astype(np.float32),
             dense=rng.normal(0, 0.3, (64, 10)).astype(np.float32),
             dense_b=rng.normal(0, 0.1, (10,)).astype(np.float32))
    v = {k: tf.Variable(val) for k, val in w.items()}
    with tf.GradientTape() as tape:
        h = tf.nn.conv2d(x, v["conv"], strides=[1, 1, 1, 1], padding="SAME")
        h = tf.nn.relu(tf.nn.bias_add(h, v["conv_b"]))
        h = tf.nn.max_pool2d(h, ksize=2, strides=2, padding="VALID")
        logits = tf.nn.bias_add(tf.matmul(tf.reshape(h, [-1, 64]), v["dense"]), v["dense_b"])
        loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(onehot, logits))
    grads = tape.gradient(loss, [v[k] for k in w])
    print(json.dumps(dict(x=flat(x), labels=flat(onehot), loss=float(loss),
                          weights={k: flat(val) for k, val in w.items()},
                          grads={k: flat(g) for k, g in zip(w, grads)})))


if __name__ == "__main__":
    {"kernels": kernels, "cnn": cnn}[sys.argv[1]]()
