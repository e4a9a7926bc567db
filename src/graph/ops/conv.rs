//! Convolution and pooling ops (`tensorflow/core/ops/nn_ops.cc`): `Conv2D` and its two
//! backprops, `DepthwiseConv2dNative` and its two backprops, `MaxPool`, `MaxPoolV2`, `AvgPool`
//! and their gradients, with shape functions that compute TensorFlow's output sizes from
//! [`crate::graph::window`], and the builder methods `conv2d`, `depthwise_conv2d`, `max_pool`
//! and `avg_pool`.

use crate::error::Result;
use crate::graph::attr::value;
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::grads::nn as grad;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::ShapeCtx;
use crate::graph::window::{node_error, ConvAttrs, DataFormat, PoolAttrs, WindowDim};
use crate::tensor::PartialShape;

const FLOAT: &str = "T: {float, double}";
const REAL: &str = "T: {float, double, int32, int64}";
const CONV_PADDING: &str = "padding: {'SAME', 'VALID', 'EXPLICIT'}";
const FORMAT: &str = "data_format: {'NHWC', 'NCHW'} = 'NHWC'";

pub(super) fn register(r: &mut Registry) {
    let conv = |name: &'static str| {
        OpDef::build(name)
            .output("output: T")
            .attr(FLOAT)
            .attr("strides: list(int)")
            .attr("use_cudnn_on_gpu: bool = true")
            .attr(CONV_PADDING)
            .attr("explicit_paddings: list(int) = []")
            .attr(FORMAT)
            .attr("dilations: list(int) = [1, 1, 1, 1]")
    };
    conv("Conv2D")
        .input("input: T")
        .input("filter: T")
        .shape(conv2d_shape)
        .grad(grad::conv2d)
        .register(r);
    conv("Conv2DBackpropInput")
        .input("input_sizes: int32")
        .input("filter: T")
        .input("out_backprop: T")
        .shape(|ctx| sizes_shape(ctx, 0))
        .register(r);
    conv("Conv2DBackpropFilter")
        .input("input: T")
        .input("filter_sizes: int32")
        .input("out_backprop: T")
        .shape(|ctx| sizes_shape(ctx, 1))
        .register(r);

    let depthwise = |name: &'static str| {
        OpDef::build(name)
            .output("output: T")
            .attr(FLOAT)
            .attr("strides: list(int)")
            .attr(CONV_PADDING)
            .attr("explicit_paddings: list(int) = []")
            .attr(FORMAT)
            .attr("dilations: list(int) = [1, 1, 1, 1]")
    };
    depthwise("DepthwiseConv2dNative")
        .input("input: T")
        .input("filter: T")
        .shape(depthwise_shape)
        .grad(grad::depthwise_conv2d)
        .register(r);
    depthwise("DepthwiseConv2dNativeBackpropInput")
        .input("input_sizes: int32")
        .input("filter: T")
        .input("out_backprop: T")
        .shape(|ctx| sizes_shape(ctx, 0))
        .grad(grad::depthwise_backprop_input)
        .register(r);
    depthwise("DepthwiseConv2dNativeBackpropFilter")
        .input("input: T")
        .input("filter_sizes: int32")
        .input("out_backprop: T")
        .shape(|ctx| sizes_shape(ctx, 1))
        .grad(grad::depthwise_backprop_filter)
        .register(r);

    let pool = |name: &'static str, t: &'static str| {
        OpDef::build(name)
            .output("output: T")
            .attr(t)
            .attr("ksize: list(int) >= 4")
            .attr("strides: list(int) >= 4")
            .attr(FORMAT)
    };
    pool("MaxPool", REAL)
        .input("input: T")
        .attr(CONV_PADDING)
        .attr("explicit_paddings: list(int) = []")
        .shape(pool_shape)
        .grad(grad::max_pool)
        .register(r);
    pool("AvgPool", FLOAT)
        .input("value: T")
        .attr("padding: {'SAME', 'VALID'}")
        .shape(pool_shape)
        .grad(grad::avg_pool)
        .register(r);
    pool("MaxPoolGrad", REAL)
        .input("orig_input: T")
        .input("orig_output: T")
        .input("grad: T")
        .attr(CONV_PADDING)
        .attr("explicit_paddings: list(int) = []")
        .shape(pool_grad_shape)
        .register(r);
    pool("AvgPoolGrad", FLOAT)
        .input("orig_input_shape: int32")
        .input("grad: T")
        .attr("padding: {'SAME', 'VALID'}")
        .shape(|ctx| sizes_shape(ctx, 0))
        .register(r);
    OpDef::build("MaxPoolV2")
        .input("input: T")
        .input("ksize: int32")
        .input("strides: int32")
        .output("output: T")
        .attr(REAL)
        .attr("padding: {'SAME', 'VALID'}")
        .attr(FORMAT)
        .shape(max_pool_v2_shape)
        .grad(grad::max_pool_v2)
        .register(r);
    OpDef::build("MaxPoolGradV2")
        .input("orig_input: T")
        .input("orig_output: T")
        .input("grad: T")
        .input("ksize: int32")
        .input("strides: int32")
        .output("output: T")
        .attr(REAL)
        .attr("padding: {'SAME', 'VALID'}")
        .attr(FORMAT)
        .shape(pool_grad_shape)
        .register(r);
}

/// The dims of a 4-D input in `NHWC` order, or an error when its rank is known and not 4.
fn nhwc_dims(
    ctx: &ShapeCtx<'_>,
    i: usize,
    what: &str,
    format: DataFormat,
) -> Result<[Option<usize>; 4]> {
    let s = ctx.input(i);
    match s.dims() {
        None => Ok([None; 4]),
        Some(d) if d.len() == 4 => Ok(format.nhwc(d)),
        Some(_) => Err(ctx.error(format!("{what} must be 4-dimensional, got shape {s}"))),
    }
}

/// The output shape of a windowed op over `input` (`NHWC` dims), given how to compute the two
/// spatial dims once their input sizes are known.
fn windowed(
    ctx: &ShapeCtx<'_>,
    format: DataFormat,
    input: [Option<usize>; 4],
    channels: Option<usize>,
    dims: impl Fn(usize, usize) -> Result<[WindowDim; 2]>,
) -> Result<Vec<PartialShape>> {
    let [n, h, w, _] = input;
    let (oh, ow) = match (h, w) {
        (Some(h), Some(w)) => {
            let d = dims(h, w).map_err(|e| node_error(ctx.node, e))?;
            (Some(d[0].output), Some(d[1].output))
        }
        // One unknown spatial size: the other is still computed, with a stand-in of 1.
        (Some(h), None) => (
            Some(dims(h, 1).map_err(|e| node_error(ctx.node, e))?[0].output),
            None,
        ),
        (None, Some(w)) => (
            None,
            Some(dims(1, w).map_err(|e| node_error(ctx.node, e))?[1].output),
        ),
        (None, None) => (None, None),
    };
    Ok(vec![PartialShape::new(
        format.from_nhwc([n, oh, ow, channels]).to_vec(),
    )])
}

pub(super) fn conv2d_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let attrs = ConvAttrs::of(ctx.node)?;
    let input = nhwc_dims(ctx, 0, "input", attrs.format)?;
    let filter = match ctx.input(1).dims() {
        None => [None; 4],
        Some(d) if d.len() == 4 => [d[0], d[1], d[2], d[3]],
        Some(_) => {
            return Err(ctx.error(format!(
                "filter must be 4-dimensional, got shape {}",
                ctx.input(1)
            )))
        }
    };
    if let (Some(c), Some(depth)) = (input[3], filter[2]) {
        if depth == 0 || c % depth != 0 {
            return Err(ctx.error(format!(
                "input depth must be evenly divisible by filter depth: {c} vs {depth}"
            )));
        }
    }
    match (filter[0], filter[1]) {
        (Some(fh), Some(fw)) => windowed(ctx, attrs.format, input, filter[3], |h, w| {
            attrs.dims([h, w], [fh, fw])
        }),
        _ => {
            let [n, _, _, _] = input;
            Ok(vec![PartialShape::new(
                attrs.format.from_nhwc([n, None, None, filter[3]]).to_vec(),
            )])
        }
    }
}

/// The filter's dims (`[kh, kw, in, out]`), unknown where its shape is.
fn filter_dims(ctx: &ShapeCtx<'_>) -> Result<[Option<usize>; 4]> {
    match ctx.input(1).dims() {
        None => Ok([None; 4]),
        Some(d) if d.len() == 4 => Ok([d[0], d[1], d[2], d[3]]),
        Some(_) => Err(ctx.error(format!(
            "filter must be 4-dimensional, got shape {}",
            ctx.input(1)
        ))),
    }
}

/// `DepthwiseConv2dNative`: `in_depth * multiplier` output channels.
fn depthwise_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let attrs = ConvAttrs::of(ctx.node)?;
    let input = nhwc_dims(ctx, 0, "input", attrs.format)?;
    let filter = filter_dims(ctx)?;
    if let (Some(c), Some(depth)) = (input[3], filter[2]) {
        if c != depth {
            return Err(ctx.error(format!(
                "input and filter must have the same depth: {c} vs {depth}"
            )));
        }
    }
    let channels = match (input[3].or(filter[2]), filter[3]) {
        (Some(c), Some(m)) => Some(c * m),
        _ => None,
    };
    match (filter[0], filter[1]) {
        (Some(fh), Some(fw)) => windowed(ctx, attrs.format, input, channels, |h, w| {
            attrs.dims([h, w], [fh, fw])
        }),
        _ => Ok(vec![PartialShape::new(
            attrs
                .format
                .from_nhwc([input[0], None, None, channels])
                .to_vec(),
        )]),
    }
}

fn pool_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let attrs = PoolAttrs::of(ctx.node)?;
    let input = nhwc_dims(ctx, 0, "input", attrs.format)?;
    windowed(ctx, attrs.format, input, input[3], |h, w| {
        attrs.dims([h, w])
    })
}

fn max_pool_v2_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let format = DataFormat::of(ctx.node)?;
    let input = nhwc_dims(ctx, 0, "input", format)?;
    match (ctx.value(1), ctx.value(2)) {
        (Some(k), Some(s)) => {
            let attrs = PoolAttrs::from_lists(ctx.node, k, s)?;
            windowed(ctx, format, input, input[3], |h, w| attrs.dims([h, w]))
        }
        _ => Ok(vec![PartialShape::new(
            format.from_nhwc([input[0], None, None, input[3]]).to_vec(),
        )]),
    }
}

fn pool_grad_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let s = ctx.with_rank(0, 4)?;
    Ok(vec![s])
}

/// The output is input `i` read as a 4-D shape (`input_sizes`, `filter_sizes`,
/// `orig_input_shape`).
fn sizes_shape(ctx: &ShapeCtx<'_>, i: usize) -> Result<Vec<PartialShape>> {
    let s = ctx.shape_value(i);
    match s.rank() {
        None => Ok(vec![PartialShape::unknown_dims(4)]),
        Some(4) => Ok(vec![s]),
        Some(r) => Err(ctx.error(format!("input {i} must hold a 4-D shape, got {r} values"))),
    }
}

/// Convolution and pooling constructors (`NHWC`; other attrs through [`NodeSpec`]).
impl Graph {
    /// A 2-D convolution of an `NHWC` `input` with an `HWIO` `filter`: `strides` has 4 entries
    /// (`[1, sh, sw, 1]`), `padding` is `SAME` or `VALID`.
    pub fn conv2d(
        &mut self,
        input: &Output,
        filter: &Output,
        strides: &[i64],
        padding: &str,
    ) -> Result<Output> {
        self.convolution("Conv2D", input, filter, strides, padding)
    }

    /// A depthwise convolution of an `NHWC` `input` with a `[kh, kw, in, multiplier]`
    /// `filter` (`tf.nn.depthwise_conv2d` without its dilation rewrite): each input channel
    /// gets its own `multiplier` filters; `strides` has 4 entries, `padding` is `SAME` or
    /// `VALID`.
    pub fn depthwise_conv2d(
        &mut self,
        input: &Output,
        filter: &Output,
        strides: &[i64],
        padding: &str,
    ) -> Result<Output> {
        self.convolution("DepthwiseConv2dNative", input, filter, strides, padding)
    }

    /// `op(input, filter)` with `strides` and `padding`, for [`conv2d`](Self::conv2d) and
    /// [`depthwise_conv2d`](Self::depthwise_conv2d).
    fn convolution(
        &mut self,
        op: &str,
        input: &Output,
        filter: &Output,
        strides: &[i64],
        padding: &str,
    ) -> Result<Output> {
        self.add1(
            NodeSpec::new(op)
                .input(input)
                .input(filter)
                .attr("strides", value::int_list(strides.to_vec()))
                .attr("padding", value::string(padding)),
        )
    }

    /// Max pooling of an `NHWC` `value` over windows of `ksize` (`[1, kh, kw, 1]`) at
    /// `strides`, `padding` `SAME` or `VALID`.
    pub fn max_pool(
        &mut self,
        value: &Output,
        ksize: &[i64],
        strides: &[i64],
        padding: &str,
    ) -> Result<Output> {
        self.pool("MaxPool", value, ksize, strides, padding)
    }

    /// Average pooling of an `NHWC` `value` (see [`Graph::max_pool`]); `SAME` borders average
    /// only the positions inside the input.
    pub fn avg_pool(
        &mut self,
        value: &Output,
        ksize: &[i64],
        strides: &[i64],
        padding: &str,
    ) -> Result<Output> {
        self.pool("AvgPool", value, ksize, strides, padding)
    }

    fn pool(
        &mut self,
        op: &str,
        value: &Output,
        ksize: &[i64],
        strides: &[i64],
        padding: &str,
    ) -> Result<Output> {
        self.add1(
            NodeSpec::new(op)
                .input(value)
                .attr("ksize", value::int_list(ksize.to_vec()))
                .attr("strides", value::int_list(strides.to_vec()))
                .attr("padding", value::string(padding)),
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::graph::builder::Graph;
    use crate::tensor::{DType, PartialShape};

    fn input(g: &mut Graph, dims: [Option<usize>; 4]) -> crate::graph::Output {
        g.placeholder("x", DType::Float, PartialShape::new(dims.to_vec()))
            .unwrap()
    }

    #[test]
    fn conv2d_and_pooling_compute_tensorflow_output_sizes() {
        let mut g = Graph::new();
        let x = input(&mut g, [None, Some(8), Some(7), Some(3)]);
        let f = g
            .placeholder(
                "f",
                DType::Float,
                PartialShape::new(vec![Some(3), Some(3), Some(3), Some(5)]),
            )
            .unwrap();
        let y = g.conv2d(&x, &f, &[1, 2, 2, 1], "SAME").unwrap();
        assert_eq!(y.shape.to_string(), "[?,4,4,5]");
        let y = g.conv2d(&x, &f, &[1, 1, 1, 1], "VALID").unwrap();
        assert_eq!(y.shape.to_string(), "[?,6,5,5]");
        let p = g
            .max_pool(&y, &[1, 2, 2, 1], &[1, 2, 2, 1], "VALID")
            .unwrap();
        assert_eq!(p.shape.to_string(), "[?,3,2,5]");
        let p = g
            .avg_pool(&y, &[1, 2, 2, 1], &[1, 2, 2, 1], "SAME")
            .unwrap();
        assert_eq!(p.shape.to_string(), "[?,3,3,5]");
    }

    #[test]
    fn depthwise_outputs_in_depth_times_multiplier_channels() {
        let mut g = Graph::new();
        let x = input(&mut g, [None, Some(8), Some(7), Some(3)]);
        let f = g
            .placeholder(
                "f",
                DType::Float,
                PartialShape::new(vec![Some(3), Some(3), Some(3), Some(2)]),
            )
            .unwrap();
        let y = g.depthwise_conv2d(&x, &f, &[1, 2, 2, 1], "SAME").unwrap();
        assert_eq!(y.shape.to_string(), "[?,4,4,6]");
        let f4 = g
            .placeholder(
                "f4",
                DType::Float,
                PartialShape::new(vec![Some(3), Some(3), Some(4), Some(2)]),
            )
            .unwrap();
        let err = g
            .depthwise_conv2d(&x, &f4, &[1, 1, 1, 1], "VALID")
            .unwrap_err();
        assert!(
            err.message()
                .contains("input and filter must have the same depth: 3 vs 4"),
            "{err}"
        );
    }

    #[test]
    fn bad_convolutions_fail_at_build_time_naming_the_node() {
        let mut g = Graph::new();
        let x = input(&mut g, [None, Some(8), Some(8), Some(4)]);
        let f = g
            .placeholder(
                "f",
                DType::Float,
                PartialShape::new(vec![Some(3), Some(3), Some(3), Some(5)]),
            )
            .unwrap();
        let err = g.conv2d(&x, &f, &[1, 1, 1, 1], "SAME").unwrap_err();
        assert!(
            err.message()
                .contains("evenly divisible by filter depth: 4 vs 3"),
            "{err}"
        );
        let f = g
            .placeholder(
                "f4",
                DType::Float,
                PartialShape::new(vec![Some(3), Some(3), Some(4), Some(5)]),
            )
            .unwrap();
        let err = g.conv2d(&x, &f, &[2, 1, 1, 1], "SAME").unwrap_err();
        assert!(err.message().contains("node `Conv2D"), "{err}");
        assert!(err.message().contains("batch and depth"), "{err}");
        let err = g.conv2d(&x, &f, &[1, 1, 1], "SAME").unwrap_err();
        assert!(err.message().contains("4 dimensions"), "{err}");
        let err = g.conv2d(&x, &f, &[1, 1, 1, 1], "FULL").unwrap_err();
        assert!(err.message().contains("unknown padding `FULL`"), "{err}");
    }
}
