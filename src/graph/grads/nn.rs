//! Gradients of neural-network ops (TensorFlow's `nn_grad.py`).

use super::{div, mul, sub};
use crate::error::Result;
use crate::graph::attr::{self, value};
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::gradients::GradCtx;

type Grads = Result<Vec<Option<Output>>>;

/// `BiasAdd`: the gradient, and `BiasAddGrad` of it for the bias.
pub fn bias_add(g: &mut Graph, c: &GradCtx) -> Grads {
    let gr = c.grad(0)?.clone();
    let fmt = attr::string_or(&c.node, "data_format", "NHWC")?;
    let gb = g.add1(
        NodeSpec::new("BiasAddGrad")
            .input(&gr)
            .attr("data_format", value::string(fmt)),
    )?;
    Ok(vec![Some(gr), Some(gb)])
}

/// `Relu`: `ReluGrad(grad, relu_output)`.
pub fn relu(g: &mut Graph, c: &GradCtx) -> Grads {
    Ok(vec![Some(g.binary(
        "ReluGrad",
        c.grad(0)?,
        c.output(0)?,
    )?)])
}

/// `Softmax`: `(grad - sum(grad * y, -1, keepdims)) * y`.
pub fn softmax(g: &mut Graph, c: &GradCtx) -> Grads {
    let (y, gr) = (c.output(0)?.clone(), c.grad(0)?.clone());
    let gy = mul(g, &gr, &y)?;
    let s = g.sum(&gy, &[-1], true)?;
    let d = sub(g, &gr, &s)?;
    Ok(vec![Some(mul(g, &d, &y)?)])
}

/// `LogSoftmax`: `grad - sum(grad, -1, keepdims) * exp(y)`.
pub fn log_softmax(g: &mut Graph, c: &GradCtx) -> Grads {
    let (y, gr) = (c.output(0)?.clone(), c.grad(0)?.clone());
    let softmax = g.unary("Exp", &y)?;
    let s = g.sum(&gr, &[-1], true)?;
    let t = mul(g, &s, &softmax)?;
    Ok(vec![Some(sub(g, &gr, &t)?)])
}

/// Whether a gradient is the zeros the driver filled in for an unused output.
fn is_zeros(g: &Graph, t: &Output) -> bool {
    g.node(&t.node).is_some_and(|n| n.op == "ZerosLike")
}

/// `SoftmaxCrossEntropyWithLogits`: `grad_loss[:, None] * backprop` for the logits (plus the
/// second-order term when the backprop output has a gradient), and
/// `grad_loss[:, None] * -log_softmax(logits)` for the labels.
pub fn softmax_xent(g: &mut Graph, c: &GradCtx) -> Grads {
    let (logits, backprop, gl) = (
        c.input(0)?.clone(),
        c.output(1)?.clone(),
        c.grad(0)?.clone(),
    );
    let glx = g.expand_dims(&gl, -1)?;
    let mut gx = mul(g, &glx, &backprop)?;
    if let Some(gg) = c
        .grads
        .get(1)
        .cloned()
        .flatten()
        .filter(|t| !is_zeros(g, t))
    {
        // (gg - squeeze(gg[:, None, :] @ softmax[:, :, None])) * softmax
        let sm = g.softmax(&logits)?;
        let a = g.expand_dims(&gg, 1)?;
        let b = g.expand_dims(&sm, 2)?;
        let p = g.batch_matmul(&a, &b, false, false)?;
        let p = g.squeeze(&p, &[1])?;
        let d = sub(g, &gg, &p)?;
        let extra = mul(g, &d, &sm)?;
        gx = g.add1(NodeSpec::new("AddV2").name("add").input(&gx).input(&extra))?;
    }
    let ls = g.unary("LogSoftmax", &logits)?;
    let nls = g.neg(&ls)?;
    let glx2 = g.expand_dims(&gl, -1)?;
    let glab = mul(g, &glx2, &nls)?;
    Ok(vec![Some(gx), Some(glab)])
}

/// `SparseSoftmaxCrossEntropyWithLogits`: `grad_loss[:, None] * backprop`; none for labels.
pub fn sparse_softmax_xent(g: &mut Graph, c: &GradCtx) -> Grads {
    let (backprop, gl) = (c.output(1)?.clone(), c.grad(0)?.clone());
    let glx = g.expand_dims(&gl, -1)?;
    Ok(vec![Some(mul(g, &glx, &backprop)?), None])
}

/// `LeakyRelu`: `LeakyReluGrad(grad, x)` with the forward node's `alpha`.
pub fn leaky_relu(g: &mut Graph, c: &GradCtx) -> Grads {
    let spec = NodeSpec::new("LeakyReluGrad")
        .input(c.grad(0)?)
        .input(c.input(0)?);
    Ok(vec![Some(g.add1(with_attrs(spec, c, &["alpha"]))?)])
}

/// `Elu`: `EluGrad(grad, y)`.
pub fn elu(g: &mut Graph, c: &GradCtx) -> Grads {
    Ok(vec![Some(g.binary("EluGrad", c.grad(0)?, c.output(0)?)?)])
}

/// `Relu6`: `Relu6Grad(grad, y)` (TensorFlow passes the output; `0 < y < 6` exactly where
/// `0 < x < 6`).
pub fn relu6(g: &mut Graph, c: &GradCtx) -> Grads {
    Ok(vec![Some(g.binary(
        "Relu6Grad",
        c.grad(0)?,
        c.output(0)?,
    )?)])
}

/// `Relu6Grad(dy, x)`: `Relu6Grad(grad, x)` for `dy`, zeros for `x`.
pub fn relu6_grad(g: &mut Graph, c: &GradCtx) -> Grads {
    let x = c.input(1)?.clone();
    let ddy = g.binary("Relu6Grad", c.grad(0)?, &x)?;
    Ok(vec![Some(ddy), Some(g.zeros_like(&x)?)])
}

/// `Softplus`: `grad * sigmoid(x)`.
pub fn softplus(g: &mut Graph, c: &GradCtx) -> Grads {
    let s = g.unary("Sigmoid", c.input(0)?)?;
    Ok(vec![Some(mul(g, c.grad(0)?, &s)?)])
}

/// `SoftplusGrad(dy, x)`: `SoftplusGrad(grad, x)` for `dy`, and
/// `grad * dy / (exp(-x) + 2 + exp(x))` for `x`.
pub fn softplus_grad(g: &mut Graph, c: &GradCtx) -> Grads {
    let (dy, x, gr) = (c.input(0)?.clone(), c.input(1)?.clone(), c.grad(0)?.clone());
    let ddy = g.binary("SoftplusGrad", &gr, &x)?;
    let neg = g.neg(&x)?;
    let e_neg = g.unary("Exp", &neg)?;
    let two = g.scalar("add/y", x.dtype, 2.0)?;
    let t = g.add(&e_neg, &two)?;
    let e_pos = g.unary("Exp", &x)?;
    let denominator = g.add(&t, &e_pos)?;
    let numerator = mul(g, &gr, &dy)?;
    Ok(vec![Some(ddy), Some(div(g, &numerator, &denominator)?)])
}

/// `Selu`: `SeluGrad(grad, y)`.
pub fn selu(g: &mut Graph, c: &GradCtx) -> Grads {
    Ok(vec![Some(g.binary(
        "SeluGrad",
        c.grad(0)?,
        c.output(0)?,
    )?)])
}

/// `SeluGrad(dy, y)`: `SeluGrad(grad, y)` for `dy`, and `grad * dy` where `y < 0` (zero
/// elsewhere) for `y`.
pub fn selu_grad(g: &mut Graph, c: &GradCtx) -> Grads {
    let (dy, y, gr) = (c.input(0)?.clone(), c.input(1)?.clone(), c.grad(0)?.clone());
    let ddy = g.binary("SeluGrad", &gr, &y)?;
    let zero = g.scalar("Less/y", y.dtype, 0.0)?;
    let negative = g.binary("Less", &y, &zero)?;
    let product = mul(g, &gr, &dy)?;
    let zeros = g.zeros_like(&y)?;
    let dout = g.select(&negative, &product, &zeros, true)?;
    Ok(vec![Some(ddy), Some(dout)])
}

/// `L2Loss`: `x * grad`.
pub fn l2_loss(g: &mut Graph, c: &GradCtx) -> Grads {
    Ok(vec![Some(mul(g, c.input(0)?, c.grad(0)?)?)])
}

/// Copies the listed attrs of the forward node onto a gradient node.
fn with_attrs(mut spec: NodeSpec, c: &GradCtx, names: &[&str]) -> NodeSpec {
    for name in names {
        if let Some(v) = c.node.attr.get(*name) {
            spec = spec.attr(name, v.clone());
        }
    }
    spec
}

/// The attrs `Conv2D` passes on to its backprops.
const CONV_ATTRS: [&str; 6] = [
    "strides",
    "padding",
    "explicit_paddings",
    "use_cudnn_on_gpu",
    "data_format",
    "dilations",
];

/// `Conv2D`: `Conv2DBackpropInput(shape(input), filter, grad)` and
/// `Conv2DBackpropFilter(input, shape(filter), grad)`, with the forward node's attrs.
pub fn conv2d(g: &mut Graph, c: &GradCtx) -> Grads {
    let (x, f, gr) = (c.input(0)?.clone(), c.input(1)?.clone(), c.grad(0)?.clone());
    let sx = g.shape_of(&x)?;
    let sf = g.shape_of(&f)?;
    let dx = g.add1(with_attrs(
        NodeSpec::new("Conv2DBackpropInput")
            .input(&sx)
            .input(&f)
            .input(&gr),
        c,
        &CONV_ATTRS,
    ))?;
    let df = g.add1(with_attrs(
        NodeSpec::new("Conv2DBackpropFilter")
            .input(&x)
            .input(&sf)
            .input(&gr),
        c,
        &CONV_ATTRS,
    ))?;
    Ok(vec![Some(dx), Some(df)])
}

/// The attrs `DepthwiseConv2dNative` passes on to its backprops.
const DEPTHWISE_ATTRS: [&str; 5] = [
    "strides",
    "padding",
    "explicit_paddings",
    "data_format",
    "dilations",
];

/// `DepthwiseConv2dNative`: `DepthwiseConv2dNativeBackpropInput(shape(input), filter, grad)`
/// and `DepthwiseConv2dNativeBackpropFilter(input, shape(filter), grad)`, with the forward
/// node's attrs.
pub fn depthwise_conv2d(g: &mut Graph, c: &GradCtx) -> Grads {
    let (x, f, gr) = (c.input(0)?.clone(), c.input(1)?.clone(), c.grad(0)?.clone());
    let sx = g.shape_of(&x)?;
    let sf = g.shape_of(&f)?;
    let dx = g.add1(with_attrs(
        NodeSpec::new("DepthwiseConv2dNativeBackpropInput")
            .input(&sx)
            .input(&f)
            .input(&gr),
        c,
        &DEPTHWISE_ATTRS,
    ))?;
    let df = g.add1(with_attrs(
        NodeSpec::new("DepthwiseConv2dNativeBackpropFilter")
            .input(&x)
            .input(&sf)
            .input(&gr),
        c,
        &DEPTHWISE_ATTRS,
    ))?;
    Ok(vec![Some(dx), Some(df)])
}

/// `DepthwiseConv2dNativeBackpropInput(sizes, filter, dy)`: none for the sizes,
/// `DepthwiseConv2dNativeBackpropFilter(grad, shape(filter), dy)` for the filter and
/// `DepthwiseConv2dNative(grad, filter)` for `dy`.
pub fn depthwise_backprop_input(g: &mut Graph, c: &GradCtx) -> Grads {
    let (f, dy, gr) = (c.input(1)?.clone(), c.input(2)?.clone(), c.grad(0)?.clone());
    let sf = g.shape_of(&f)?;
    let spec = NodeSpec::new("DepthwiseConv2dNativeBackpropFilter")
        .input(&gr)
        .input(&sf)
        .input(&dy);
    let df = g.add1(with_attrs(spec, c, &DEPTHWISE_ATTRS))?;
    let spec = NodeSpec::new("DepthwiseConv2dNative").input(&gr).input(&f);
    let ddy = g.add1(with_attrs(spec, c, &DEPTHWISE_ATTRS))?;
    Ok(vec![None, Some(df), Some(ddy)])
}

/// `DepthwiseConv2dNativeBackpropFilter(x, sizes, dy)`:
/// `DepthwiseConv2dNativeBackpropInput(shape(x), grad, dy)` for `x`, none for the sizes and
/// `DepthwiseConv2dNative(x, grad)` for `dy`.
pub fn depthwise_backprop_filter(g: &mut Graph, c: &GradCtx) -> Grads {
    let (x, dy, gr) = (c.input(0)?.clone(), c.input(2)?.clone(), c.grad(0)?.clone());
    let sx = g.shape_of(&x)?;
    let spec = NodeSpec::new("DepthwiseConv2dNativeBackpropInput")
        .input(&sx)
        .input(&gr)
        .input(&dy);
    let dx = g.add1(with_attrs(spec, c, &DEPTHWISE_ATTRS))?;
    let spec = NodeSpec::new("DepthwiseConv2dNative").input(&x).input(&gr);
    let ddy = g.add1(with_attrs(spec, c, &DEPTHWISE_ATTRS))?;
    Ok(vec![Some(dx), None, Some(ddy)])
}

/// `FusedBatchNorm`, `V2` and `V3` (TensorFlow's `_BaseFusedBatchNormGrad`): the matching
/// `FusedBatchNormGrad*` of the gradient of `y`, with the batch statistics the forward op
/// saved in its reserve spaces (training) or the population `mean` and `variance` inputs
/// (inference); no gradient for `mean` and `variance`.
pub fn fused_batch_norm(g: &mut Graph, c: &GradCtx) -> Grads {
    let op = match c.node.op.as_str() {
        "FusedBatchNormV3" => "FusedBatchNormGradV3",
        "FusedBatchNormV2" => "FusedBatchNormGradV2",
        _ => "FusedBatchNormGrad",
    };
    let training = attr::bool_or(&c.node, "is_training", true)?;
    let (mean, var) = if training {
        (c.output(3)?, c.output(4)?)
    } else {
        (c.input(3)?, c.input(4)?)
    };
    let mut spec = NodeSpec::new(op)
        .input(c.grad(0)?)
        .input(c.input(0)?)
        .input(c.input(1)?)
        .input(mean)
        .input(var);
    if op == "FusedBatchNormGradV3" {
        spec = spec.input(c.output(5)?);
    }
    let spec = with_attrs(spec, c, &["epsilon", "data_format", "is_training"]);
    let out = g.add_node(spec)?;
    Ok(vec![
        Some(out[0].clone()),
        Some(out[1].clone()),
        Some(out[2].clone()),
        None,
        None,
    ])
}

/// `LRN`: `LRNGrad(grad, input, output)` with the forward node's attrs.
pub fn lrn(g: &mut Graph, c: &GradCtx) -> Grads {
    let spec = NodeSpec::new("LRNGrad")
        .input(c.grad(0)?)
        .input(c.input(0)?)
        .input(c.output(0)?);
    let names = ["depth_radius", "bias", "alpha", "beta"];
    Ok(vec![Some(g.add1(with_attrs(spec, c, &names))?)])
}

/// `MaxPool`: `MaxPoolGrad(input, output, grad)` with the forward node's attrs.
pub fn max_pool(g: &mut Graph, c: &GradCtx) -> Grads {
    let spec = NodeSpec::new("MaxPoolGrad")
        .input(c.input(0)?)
        .input(c.output(0)?)
        .input(c.grad(0)?);
    let names = [
        "ksize",
        "strides",
        "padding",
        "explicit_paddings",
        "data_format",
    ];
    Ok(vec![Some(g.add1(with_attrs(spec, c, &names))?)])
}

/// `MaxPoolV2`: `MaxPoolGradV2(input, output, grad, ksize, strides)`; none for the window
/// and strides.
pub fn max_pool_v2(g: &mut Graph, c: &GradCtx) -> Grads {
    let spec = NodeSpec::new("MaxPoolGradV2")
        .input(c.input(0)?)
        .input(c.output(0)?)
        .input(c.grad(0)?)
        .input(c.input(1)?)
        .input(c.input(2)?);
    let dx = g.add1(with_attrs(spec, c, &["padding", "data_format"]))?;
    Ok(vec![Some(dx), None, None])
}

/// `AvgPool`: `AvgPoolGrad(shape(input), grad)` with the forward node's attrs.
pub fn avg_pool(g: &mut Graph, c: &GradCtx) -> Grads {
    let s = g.shape_of(c.input(0)?)?;
    let spec = NodeSpec::new("AvgPoolGrad").input(&s).input(c.grad(0)?);
    let names = ["ksize", "strides", "padding", "data_format"];
    Ok(vec![Some(g.add1(with_attrs(spec, c, &names))?)])
}

/// `TopKV2` (TensorFlow's `_TopKGrad`): the values' gradient put back at the indices they were
/// taken from, zero elsewhere. TensorFlow scatters it with `ScatterNd` into the flattened
/// input; tessera sums it by segment (`UnsortedSegmentSum`), which gives the same tensor since
/// a row's indices are distinct. The indices get no gradient.
pub fn top_k(g: &mut Graph, c: &GradCtx) -> Grads {
    let x = c.input(0)?.clone();
    let indices = c.output(1)?.clone();
    let last = |g: &mut Graph, shape: &Output| -> Result<Output> {
        let size = g.unary("Size", shape)?;
        let one = g.const_i32("Const", &[], &[1])?;
        let at = sub(g, &size, &one)?;
        g.gather(shape, &at, 0)
    };
    let in_shape = g.shape_of(&x)?;
    let ind_shape = g.shape_of(&indices)?;
    let k = last(g, &ind_shape)?;
    let n = last(g, &in_shape)?;
    // The indices as rows of k, each offset by its row's start in the flattened input.
    let minus_one = g.const_i32("Const", &[], &[-1])?;
    let rows_of_k = g.pack(&[minus_one, k], 0)?;
    let ind_2d = g.reshape(&indices, &rows_of_k)?;
    let shape_2d = g.shape(&ind_2d)?;
    let zero = g.const_i32("Const", &[], &[0])?;
    let outer = g.gather(&shape_2d, &zero, 0)?;
    let limit = mul(g, &outer, &n)?;
    let starts = g.range(&zero, &limit, &n)?;
    let mut starts = g.expand_dims(&starts, -1)?;
    if indices.dtype != starts.dtype {
        starts = g.cast(&starts, indices.dtype)?;
    }
    let offset = g.add(&ind_2d, &starts)?;
    let flat = g.reshape_to(&offset, &[-1])?;
    let values = g.reshape_to(c.grad(0)?, &[-1])?;
    let all = g.const_vec_i32("Const", &[0])?;
    let total = g.reduce("Prod", &in_shape, &all, false)?;
    let scattered = g.unsorted_segment_sum(&values, &flat, &total)?;
    Ok(vec![Some(g.reshape(&scattered, &in_shape)?), None])
}
