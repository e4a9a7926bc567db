//! Normalization ops (`tensorflow/core/ops/nn_ops.cc`): fused batch normalization
//! (`FusedBatchNorm`, `V2`, `V3` and their gradients) and local response normalization (`LRN`,
//! `LRNGrad`), with their shape functions and the builder methods `fused_batch_norm` and `lrn`.

use crate::error::Result;
use crate::graph::attr::{self, value};
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::grads::nn as grad;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::{self as sf, ShapeCtx};
use crate::tensor::PartialShape;

/// The attrs every fused batch normalization op shares (the gradients have no
/// `exponential_avg_factor`).
fn batch_norm_op(name: &'static str, forward: bool) -> crate::graph::registry::OpBuilder {
    let format = if name.ends_with("V3") {
        "data_format: {'NHWC', 'NCHW', 'NDHWC', 'NCDHW'} = 'NHWC'"
    } else {
        "data_format: {'NHWC', 'NCHW'} = 'NHWC'"
    };
    let b = OpDef::build(name).attr("epsilon: float = 0.0001");
    let b = if forward {
        b.attr("exponential_avg_factor: float = 1.0")
    } else {
        b
    };
    b.attr(format).attr("is_training: bool = true")
}

pub(super) fn register(r: &mut Registry) {
    // FusedBatchNorm is float32 throughout; V2 and V3 keep the statistics in `U`.
    batch_norm_op("FusedBatchNorm", true)
        .attr("T: {float}")
        .input("x: T")
        .input("scale: T")
        .input("offset: T")
        .input("mean: T")
        .input("variance: T")
        .output("y: T")
        .output("batch_mean: T")
        .output("batch_variance: T")
        .output("reserve_space_1: T")
        .output("reserve_space_2: T")
        .shape(batch_norm_shape)
        .grad(grad::fused_batch_norm)
        .register(r);
    for name in ["FusedBatchNormV2", "FusedBatchNormV3"] {
        let b = batch_norm_op(name, true)
            .attr("T: {half, bfloat16, float}")
            .attr("U: {float}")
            .input("x: T")
            .input("scale: U")
            .input("offset: U")
            .input("mean: U")
            .input("variance: U")
            .output("y: T")
            .output("batch_mean: U")
            .output("batch_variance: U")
            .output("reserve_space_1: U")
            .output("reserve_space_2: U");
        let b = if name == "FusedBatchNormV3" {
            b.output("reserve_space_3: U")
        } else {
            b
        };
        b.shape(batch_norm_shape)
            .grad(grad::fused_batch_norm)
            .register(r);
    }
    batch_norm_op("FusedBatchNormGrad", false)
        .attr("T: {float}")
        .input("y_backprop: T")
        .input("x: T")
        .input("scale: T")
        .input("reserve_space_1: T")
        .input("reserve_space_2: T")
        .output("x_backprop: T")
        .output("scale_backprop: T")
        .output("offset_backprop: T")
        .output("reserve_space_3: T")
        .output("reserve_space_4: T")
        .shape(batch_norm_grad_shape)
        .register(r);
    for name in ["FusedBatchNormGradV2", "FusedBatchNormGradV3"] {
        let b = batch_norm_op(name, false)
            .attr("T: {half, bfloat16, float}")
            .attr("U: {float}")
            .input("y_backprop: T")
            .input("x: T")
            .input("scale: float")
            .input("reserve_space_1: U")
            .input("reserve_space_2: U");
        let b = if name == "FusedBatchNormGradV3" {
            b.input("reserve_space_3: U")
                .output("x_backprop: T")
                .output("scale_backprop: U")
                .output("offset_backprop: U")
                .output("reserve_space_4: U")
                .output("reserve_space_5: U")
        } else {
            b.output("x_backprop: T")
                .output("scale_backprop: U")
                .output("offset_backprop: U")
                .output("reserve_space_3: U")
                .output("reserve_space_4: U")
        };
        b.shape(batch_norm_grad_shape).register(r);
    }

    let lrn = |name: &'static str| {
        OpDef::build(name)
            .attr("depth_radius: int = 5")
            .attr("bias: float = 1.0")
            .attr("alpha: float = 1.0")
            .attr("beta: float = 0.5")
            .attr("T: {half, bfloat16, float} = DT_FLOAT")
    };
    lrn("LRN")
        .input("input: T")
        .output("output: T")
        .shape(|ctx| Ok(vec![ctx.with_rank(0, 4)?]))
        .grad(grad::lrn)
        .register(r);
    lrn("LRNGrad")
        .input("input_grads: T")
        .input("input_image: T")
        .input("output_image: T")
        .output("output: T")
        .shape(|ctx| {
            ctx.with_rank(0, 4)?;
            sf::merge_all(ctx)
        })
        .register(r);
}

/// The channel count of input 0 (4-D in the node's `data_format`), merged with the lengths of
/// the per-channel inputs `vectors`.
fn channels(ctx: &ShapeCtx<'_>, vectors: &[usize]) -> Result<(PartialShape, Option<usize>)> {
    // The 3-D formats (`V3` only: the registry checks the attr's values) take 5-D inputs.
    let format = attr::string_or(ctx.node, "data_format", "NHWC")?;
    let rank = if format.len() == 5 { 5 } else { 4 };
    let x = ctx.with_rank(0, rank)?;
    let mut c = x.dims().and_then(|d| {
        if format.ends_with('C') {
            d[rank - 1]
        } else {
            d[1]
        }
    });
    for &i in vectors {
        let v = ctx.with_rank(i, 1)?;
        let n = v.dims().and_then(|d| d[0]);
        c = sf::merge_dim(c, n).ok_or_else(|| {
            ctx.error(format!(
                "input {i} must have the same number of elements as the channels of x, got \
                 {v} and {}",
                c.map_or("?".to_string(), |c| c.to_string())
            ))
        })?;
    }
    Ok((x, c))
}

pub(super) fn batch_norm_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let training = attr::bool_or(ctx.node, "is_training", true)?;
    let factor = attr::float_or(ctx.node, "exponential_avg_factor", 1.0)?;
    // The statistics inputs only count where they are read.
    let vectors: &[usize] = if training && factor == 1.0 {
        &[1, 2]
    } else {
        &[1, 2, 3, 4]
    };
    let (x, c) = channels(ctx, vectors)?;
    let v = PartialShape::new(vec![c]);
    let mut out = vec![x, v.clone(), v.clone(), v.clone(), v];
    if ctx.node.op == "FusedBatchNormV3" {
        out.push(PartialShape::unknown());
    }
    Ok(out)
}

fn batch_norm_grad_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let (x, c) = channels(ctx, &[2, 3, 4])?;
    let dy = ctx.with_rank(1, x.rank().unwrap_or(4))?;
    let x = sf::merge(ctx, &x, &dy)?;
    let v = PartialShape::new(vec![c]);
    // As TensorFlow's shape function: empty reserve outputs in training, per-channel ones
    // in inference.
    let reserve = if attr::bool_or(ctx.node, "is_training", true)? {
        PartialShape::new(vec![Some(0)])
    } else {
        v.clone()
    };
    Ok(vec![x, v.clone(), v, reserve.clone(), reserve])
}

/// Normalization constructors.
impl Graph {
    /// `FusedBatchNormV3` of a 4-D `NHWC` `x` with per-channel `scale`, `offset`, `mean` and
    /// `variance` (the last two read in inference, or when another node sets an
    /// `exponential_avg_factor`): returns its six outputs (`y`, `batch_mean`, `batch_variance`
    /// and the three reserve spaces).
    #[allow(clippy::too_many_arguments)]
    pub fn fused_batch_norm(
        &mut self,
        x: &Output,
        scale: &Output,
        offset: &Output,
        mean: &Output,
        variance: &Output,
        epsilon: f32,
        is_training: bool,
    ) -> Result<Vec<Output>> {
        self.add_node(
            NodeSpec::new("FusedBatchNormV3")
                .input(x)
                .input(scale)
                .input(offset)
                .input(mean)
                .input(variance)
                .attr("epsilon", value::float(epsilon))
                .attr("is_training", value::bool(is_training)),
        )
    }

    /// Local response normalization of a 4-D `NHWC` `x` across channels (`tf.nn.lrn`).
    pub fn lrn(
        &mut self,
        x: &Output,
        depth_radius: i64,
        bias: f32,
        alpha: f32,
        beta: f32,
    ) -> Result<Output> {
        self.add1(
            NodeSpec::new("LRN")
                .input(x)
                .attr("depth_radius", value::int(depth_radius))
                .attr("bias", value::float(bias))
                .attr("alpha", value::float(alpha))
                .attr("beta", value::float(beta)),
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::graph::attr::value;
    use crate::graph::builder::{Graph, NodeSpec};
    use crate::tensor::{DType, PartialShape};

    fn ph(g: &mut Graph, name: &str, dims: &[Option<usize>]) -> crate::graph::Output {
        g.placeholder(name, DType::Float, PartialShape::new(dims.to_vec()))
            .unwrap()
    }

    #[test]
    fn batch_norm_shapes_follow_the_channels_of_the_format() {
        let mut g = Graph::new();
        let x = ph(&mut g, "x", &[None, Some(5), Some(4), Some(4)]);
        let v = ph(&mut g, "v", &[None]);
        let e = ph(&mut g, "e", &[Some(0)]);
        let outs = g
            .add_node(
                NodeSpec::new("FusedBatchNormV3")
                    .input(&x)
                    .input(&v)
                    .input(&v)
                    .input(&e)
                    .input(&e)
                    .attr("data_format", value::string("NCHW")),
            )
            .unwrap();
        let shapes: Vec<String> = outs.iter().map(|o| o.shape.to_string()).collect();
        assert_eq!(
            shapes,
            ["[?,5,4,4]", "[5]", "[5]", "[5]", "[5]", "<unknown>"]
        );
        // In inference the mean and variance must match the channels.
        let three = ph(&mut g, "three", &[Some(3)]);
        let err = g
            .fused_batch_norm(&x, &v, &v, &three, &three, 1e-3, false)
            .unwrap_err();
        assert!(err.message().contains("channels of x"), "{err}");
    }

    #[test]
    fn lrn_takes_4d_inputs() {
        let mut g = Graph::new();
        let x = ph(&mut g, "x", &[Some(2), Some(3)]);
        let err = g.lrn(&x, 2, 1.0, 1e-4, 0.75).unwrap_err();
        assert!(err.message().contains("rank"), "{err}");
        let x = ph(&mut g, "x4", &[None, Some(3), Some(3), Some(8)]);
        assert_eq!(
            g.lrn(&x, 2, 1.0, 1e-4, 0.75).unwrap().shape.to_string(),
            "[?,3,3,8]"
        );
    }
}
