"""TensorFlow's side of tests/kernels_cnn.rs: the numbers stock TensorFlow computes for the
depthwise convolutions, fused batch normalization, local response normalization and the
element-wise ops of convolutional models, on seeded inputs, printed as one JSON line.

    python3 tests/kernels_cnn_tf.py

Inputs are printed with the outputs, so the Rust side runs its kernels on exactly these. A case
TensorFlow's CPU kernels refuse as asked (a layout, a dilation) is computed another way and says
so (`via`): in NHWC between transposes, or, for dilations, as the undilated convolution with the
filter's taps spread apart by zeros. Dilated depthwise backprops always take the second way:
TensorFlow 2.21's oneDNN kernels return wrong numbers for them.
"""
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

rng = np.random.default_rng(20261128)
TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def flat(t):
    return np.asarray(t).astype(np.float64).ravel().tolist()


def in_format(fmt, nhwc):
    return nhwc if fmt == "NHWC" else [nhwc[0], nhwc[3], nhwc[1], nhwc[2]]


def refused(e):
    # oneDNN refuses some geometries with ABORTED ("could not create a primitive").
    return isinstance(e, (tf.errors.UnimplementedError, tf.errors.InvalidArgumentError,
                          tf.errors.AbortedError))


def depthwise_case(fmt, padding, strides, dilations, multiplier, n=2, h=7, w=6, c=3, kh=3,
                   kw=2, explicit=((1, 2), (0, 1))):
    x_nhwc = rng.uniform(-1, 1, (n, h, w, c)).astype(np.float32)
    f = rng.uniform(-1, 1, (kh, kw, c, multiplier)).astype(np.float32)
    x = x_nhwc if fmt == "NHWC" else x_nhwc.transpose(TO_NCHW)
    pairs = [(0, 0), explicit[0], explicit[1], (0, 0)]
    ep = list(sum(in_format(fmt, pairs), ())) if padding == "EXPLICIT" else []
    ep_nhwc = list(sum(pairs, ())) if padding == "EXPLICIT" else []
    attrs = dict(strides=in_format(fmt, [1, *strides, 1]), padding=padding,
                 explicit_paddings=ep, dilations=in_format(fmt, [1, *dilations, 1]))

    def run(fmt_, x_, f_, dy_, dil):
        a = dict(strides=in_format(fmt_, [1, *strides, 1]), padding=padding,
                 explicit_paddings=ep if fmt_ == fmt else ep_nhwc,
                 dilations=in_format(fmt_, [1, *dil, 1]), data_format=fmt_)
        y = tf.raw_ops.DepthwiseConv2dNative(input=x_, filter=f_, **a)
        if dy_ is None:
            return [y]
        dx = tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
            input_sizes=list(x_.shape), filter=f_, out_backprop=dy_, **a)
        df = tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
            input=x_, filter_sizes=list(f_.shape), out_backprop=dy_, **a)
        return [y, dx, df]

    def per_channel(x_, f_, dy_, dil):
        """`run` in NHWC as one Conv2D per input channel (a depthwise convolution is a grouped
        one): TensorFlow's plain CPU depthwise kernels refuse unequal strides, Conv2D takes
        them. Output channel c * multiplier + m is channel c's m-th."""
        a = dict(strides=[1, *strides, 1], padding=padding, explicit_paddings=ep_nhwc,
                 dilations=[1, *dil, 1], data_format="NHWC")
        ys, dxs, dfs = [], [], []
        for ci in range(c):
            xc, fc = x_[..., ci:ci + 1], f_[:, :, ci:ci + 1, :]
            ys.append(np.asarray(tf.raw_ops.Conv2D(input=xc, filter=fc, **a)))
            if dy_ is not None:
                dyc = dy_[..., ci * multiplier:(ci + 1) * multiplier]
                dxs.append(np.asarray(tf.raw_ops.Conv2DBackpropInput(
                    input_sizes=list(xc.shape), filter=fc, out_backprop=dyc, **a)))
                dfs.append(np.asarray(tf.raw_ops.Conv2DBackpropFilter(
                    input=xc, filter_sizes=list(fc.shape), out_backprop=dyc, **a)))
        y = np.concatenate(ys, axis=-1)
        if dy_ is None:
            return [y]
        return [y, np.concatenate(dxs, axis=-1), np.concatenate(dfs, axis=2)]

    def spread(f_):
        dh, dw = dilations
        s = np.zeros(((kh - 1) * dh + 1, (kw - 1) * dw + 1, c, multiplier), np.float32)
        s[::dh, ::dw] = f_
        return s

    def variant(dy, nhwc, spread_taps, grouped=False):
        """(y[, dx, df]) in `fmt`, computed in NHWC and/or with a spread filter, and/or as
        one Conv2D per channel (which is always NHWC)."""
        nhwc = nhwc or (grouped and fmt == "NCHW")
        fmt_, x_ = ("NHWC", x_nhwc) if nhwc else (fmt, x)
        dy_ = dy.transpose(TO_NHWC) if nhwc and dy is not None else dy
        f_, dil = (spread(f), (1, 1)) if spread_taps else (f, dilations)
        r = (per_channel(x_, f_, dy_, dil) if grouped
             else [np.asarray(t) for t in run(fmt_, x_, f_, dy_, dil)])
        if nhwc:
            r[0] = r[0].transpose(TO_NCHW)
            if dy is not None:
                r[1] = r[1].transpose(TO_NCHW)
        if spread_taps and dy is not None:
            r[2] = r[2][::dilations[0], ::dilations[1]]
        return r

    def attempt(dy):
        """(y[, dx, df]) and how, trying the direct call first."""
        tries = [("direct", False, False)]
        if fmt == "NCHW":
            tries.append(("transpose", True, False))
        if dilations != (1, 1) and dy is not None:
            # TensorFlow 2.21's oneDNN depthwise backprops accept dilations but return wrong
            # numbers (they disagree with central differences of the forward op), and its
            # plain CPU kernels refuse them: the spread filter is the reference.
            tries = []
        if dilations != (1, 1):
            tries.append(("spread filter", False, True))
            if fmt == "NCHW":
                tries.append(("transpose, spread filter", True, True))
        if strides[0] != strides[1] and padding != "EXPLICIT":
            # Only oneDNN's depthwise kernels take unequal strides; builds without it (a CPU
            # without AVX-512) refuse them.
            tries.append(("per channel", False, False, True))
        last = None
        for via, *how in tries:
            try:
                return variant(dy, *how), via
            except Exception as e:  # noqa: BLE001
                if not refused(e):
                    raise
                last = e
        raise last

    (y,), via = attempt(None)
    dy = rng.uniform(-1, 1, y.shape).astype(np.float32)
    (y2, dx, df), via2 = attempt(dy)
    return dict(data_format=fmt, via=via, via_backprops=via2, x_shape=list(x.shape),
                x=flat(x), f_shape=list(f.shape), f=flat(f), y_shape=list(y.shape), y=flat(y),
                dy=flat(dy), dx=flat(dx), df=flat(df), **attrs)


def batch_norm_case(op, fmt, training, factor, n=3, h=4, w=5, c=4, epsilon=0.001):
    spatial = (2, h, w) if len(fmt) == 5 else (h, w)
    x_last = rng.normal(0.5, 2.0, (n, *spatial, c)).astype(np.float32)
    # Channels second for NCHW and NCDHW.
    x = x_last if fmt.endswith("C") else np.moveaxis(x_last, -1, 1).copy()
    scale = rng.uniform(0.5, 1.5, c).astype(np.float32)
    offset = rng.uniform(-1, 1, c).astype(np.float32)
    mean = rng.uniform(-1, 1, c).astype(np.float32)
    var = rng.uniform(0.5, 2, c).astype(np.float32)
    kw = dict(x=x, scale=scale, offset=offset, mean=mean, variance=var, epsilon=epsilon,
              data_format=fmt, is_training=training, exponential_avg_factor=factor)
    out = [np.asarray(t) for t in getattr(tf.raw_ops, op)(**kw)]
    dy = rng.normal(0, 1, x.shape).astype(np.float32)
    grad_op = op.replace("FusedBatchNorm", "FusedBatchNormGrad")
    gkw = dict(y_backprop=dy, x=x, scale=scale, reserve_space_1=out[3] if training else mean,
               reserve_space_2=out[4] if training else var, epsilon=epsilon, data_format=fmt,
               is_training=training)
    if op.endswith("V3"):
        gkw["reserve_space_3"] = out[5]
    try:
        grads = [np.asarray(t) for t in getattr(tf.raw_ops, grad_op)(**gkw)]
    except Exception as e:  # noqa: BLE001
        # The inference gradient takes NHWC only: the same numbers, channels last in 4-D.
        if not refused(e) or training:
            raise
        last = lambda t: t if fmt.endswith("C") else np.moveaxis(t, 1, -1)  # noqa: E731
        as4 = lambda t: last(t).reshape(n, -1, w, c)  # noqa: E731
        grads = [np.asarray(t) for t in getattr(tf.raw_ops, grad_op)(
            **dict(gkw, y_backprop=as4(dy), x=as4(x), data_format="NHWC"))]
        dx = grads[0].reshape(x_last.shape)
        grads[0] = dx if fmt.endswith("C") else np.moveaxis(dx, -1, 1)
    # In inference the reserve spaces are each kernel's own: TensorFlow's plain CPU kernel (5-D
    # inputs, and 4-D ones in builds without oneDNN) leaves them zero or uninitialized, oneDNN
    # writes the population statistics (as tessera does). Only their shapes are compared, and
    # their contents (stray NaNs among them, which JSON cannot carry) are not printed.
    garbage = [3, 4] if not training else []
    return dict(op=op, data_format=fmt, is_training=training, exponential_avg_factor=factor,
                uninitialized=garbage,
                epsilon=epsilon, x_shape=list(x.shape), x=flat(x), scale=flat(scale),
                offset=flat(offset), mean=flat(mean), variance=flat(var),
                out_shapes=[list(t.shape) for t in out],
                outs=[[] if i in garbage else flat(t) for i, t in enumerate(out)],
                dy=flat(dy), grads=[flat(t) for t in grads[:3]])


def lrn_case(depth_radius, bias, alpha, beta, shape=(2, 3, 4, 9)):
    x = rng.uniform(-2, 2, shape).astype(np.float32)
    attrs = dict(depth_radius=depth_radius, bias=bias, alpha=alpha, beta=beta)
    y = np.asarray(tf.raw_ops.LRN(input=x, **attrs))
    dy = rng.uniform(-1, 1, shape).astype(np.float32)
    dx = np.asarray(tf.raw_ops.LRNGrad(input_grads=dy, input_image=x, output_image=y, **attrs))
    return dict(attrs, x_shape=list(shape), x=flat(x), y=flat(y), dy=flat(dy), dx=flat(dx))


def elementwise():
    """Each op on float32 and float64 inputs that cross its kinks and thresholds."""
    points = [-20.0, -14.5, -6.0, -2.5, -1.0, -0.3, 0.0, 1e-4, 0.3, 1.0, 2.5, 5.999, 6.0,
              6.5, 14.5, 20.0]
    cases = []
    for dtype in [np.float32, np.float64]:
        x = np.array(points + list(rng.uniform(-8, 8, 16)), dtype=dtype)
        g = rng.uniform(-1, 1, x.shape).astype(dtype)
        pos = np.abs(x) + np.array(0.01, dtype)  # Log1p also below zero, above -1:
        pos = np.concatenate([pos, np.array([-0.9, -0.5, -1e-6], dtype)])
        for op, arg in [("Relu6", x), ("Softplus", x), ("Selu", x), ("Erf", x),
                        ("Log1p", pos)]:
            inputs = dict(features=arg) if op in ("Relu6", "Softplus", "Selu") else dict(x=arg)
            y = np.asarray(getattr(tf.raw_ops, op)(**inputs))
            cases.append(dict(op=op, dtype=np.dtype(dtype).name, inputs=[flat(arg)],
                              y=flat(y)))
        for op, second in [("Relu6Grad", x), ("SoftplusGrad", x),
                           ("SeluGrad", np.asarray(tf.raw_ops.Selu(features=x)))]:
            key = "outputs" if op == "SeluGrad" else "features"
            y = np.asarray(getattr(tf.raw_ops, op)(gradients=g, **{key: second}))
            cases.append(dict(op=op, dtype=np.dtype(dtype).name, inputs=[flat(g), flat(second)],
                              y=flat(y)))
    return cases


def main():
    depthwise = []
    for fmt in ["NHWC", "NCHW"]:
        for padding in ["SAME", "VALID", "EXPLICIT"]:
            for strides, dilations, mult in [((1, 1), (1, 1), 1), ((2, 2), (1, 1), 2),
                                             ((1, 1), (2, 2), 1), ((2, 2), (1, 2), 3)]:
                depthwise.append(depthwise_case(fmt, padding, strides, dilations, mult))
            # Unequal strides: only oneDNN's depthwise kernels take them, and not with
            # EXPLICIT; elsewhere the reference is one Conv2D per channel.
            if padding != "EXPLICIT":
                depthwise.append(depthwise_case(fmt, padding, (1, 2), (1, 1), 2))
    batch_norm = []
    for fmt in ["NHWC", "NCHW"]:
        for training, factor in [(True, 1.0), (True, 0.3), (False, 1.0)]:
            batch_norm.append(batch_norm_case("FusedBatchNormV3", fmt, training, factor))
    for fmt in ["NDHWC", "NCDHW"]:
        for training, factor in [(True, 0.3), (False, 1.0)]:
            batch_norm.append(batch_norm_case("FusedBatchNormV3", fmt, training, factor))
    batch_norm.append(batch_norm_case("FusedBatchNorm", "NHWC", True, 1.0))
    batch_norm.append(batch_norm_case("FusedBatchNormV2", "NHWC", True, 0.5))
    batch_norm.append(batch_norm_case("FusedBatchNormV2", "NHWC", False, 1.0))
    lrn = [lrn_case(5, 1.0, 1.0, 0.5), lrn_case(2, 2.0, 1e-4, 0.75), lrn_case(1, 0.5, 0.3, 1.2),
           lrn_case(0, 1.0, 0.5, 0.5), lrn_case(20, 1.0, 0.1, 0.6)]
    print(json.dumps(dict(depthwise=depthwise, batch_norm=batch_norm, lrn=lrn,
                          elementwise=elementwise())))


if __name__ == "__main__":
    main()
