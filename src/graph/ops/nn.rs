//! Neural-network ops (`tensorflow/core/ops/nn_ops.cc`): bias, activations, softmax and the
//! cross-entropy losses, `L2Loss`, the largest entries of each row (`TopKV2`) and whether a
//! target is among them (`InTopKV2`).

use crate::error::Result;
use crate::graph::attr;
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::grads::nn as grad;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::{self as sf, ShapeCtx};
use crate::tensor::PartialShape;

const FLOAT: &str = "T: {float, double, half, bfloat16}";
/// TensorFlow's real number types that tessera computes on (the narrow ones through
/// `kernels::cpu::widen`).
const REAL: &str =
    "T: {float, double, int32, int64, uint8, int8, int16, uint16, uint32, half, bfloat16}";

pub(super) fn register(r: &mut Registry) {
    OpDef::build("BiasAdd")
        .input("value: T")
        .input("bias: T")
        .output("output: T")
        .attr(REAL)
        .attr("data_format: {'NHWC', 'NCHW'} = 'NHWC'")
        .shape(bias_add_shape)
        .grad(grad::bias_add)
        .register(r);
    OpDef::build("BiasAddGrad")
        .input("out_backprop: T")
        .output("output: T")
        .attr(REAL)
        .attr("data_format: {'NHWC', 'NCHW'} = 'NHWC'")
        .shape(bias_add_grad_shape)
        .register(r);
    OpDef::build("Relu")
        .input("features: T")
        .output("activations: T")
        .attr(REAL)
        .shape(sf::unchanged)
        .grad(grad::relu)
        .register(r);
    OpDef::build("ReluGrad")
        .input("gradients: T")
        .input("features: T")
        .output("backprops: T")
        .attr(REAL)
        .shape(sf::merge_all)
        .register(r);
    OpDef::build("LeakyRelu")
        .input("features: T")
        .output("activations: T")
        .attr("alpha: float = 0.2")
        .attr(FLOAT)
        .shape(sf::unchanged)
        .grad(grad::leaky_relu)
        .register(r);
    OpDef::build("LeakyReluGrad")
        .input("gradients: T")
        .input("features: T")
        .output("backprops: T")
        .attr("alpha: float = 0.2")
        .attr(FLOAT)
        .shape(sf::merge_all)
        .register(r);
    OpDef::build("Elu")
        .input("features: T")
        .output("activations: T")
        .attr(FLOAT)
        .shape(sf::unchanged)
        .grad(grad::elu)
        .register(r);
    OpDef::build("EluGrad")
        .input("gradients: T")
        .input("outputs: T")
        .output("backprops: T")
        .attr(FLOAT)
        .shape(sf::merge_all)
        .register(r);
    for (op, t, g) in [
        (
            "Relu6",
            REAL,
            grad::relu6 as crate::graph::gradients::GradFn,
        ),
        ("Softplus", FLOAT, grad::softplus),
        ("Selu", FLOAT, grad::selu),
    ] {
        OpDef::build(op)
            .input("features: T")
            .output("activations: T")
            .attr(t)
            .shape(sf::unchanged)
            .grad(g)
            .register(r);
    }
    for (op, t, second, g) in [
        (
            "Relu6Grad",
            REAL,
            "features: T",
            grad::relu6_grad as crate::graph::gradients::GradFn,
        ),
        ("SoftplusGrad", FLOAT, "features: T", grad::softplus_grad),
        ("SeluGrad", FLOAT, "outputs: T", grad::selu_grad),
    ] {
        OpDef::build(op)
            .input("gradients: T")
            .input(second)
            .output("backprops: T")
            .attr(t)
            .shape(sf::merge_all)
            .grad(g)
            .register(r);
    }
    OpDef::build("Softmax")
        .input("logits: T")
        .output("softmax: T")
        .attr(FLOAT)
        .shape(at_least_rank1)
        .grad(grad::softmax)
        .register(r);
    OpDef::build("LogSoftmax")
        .input("logits: T")
        .output("logsoftmax: T")
        .attr(FLOAT)
        .shape(at_least_rank1)
        .grad(grad::log_softmax)
        .register(r);
    OpDef::build("SoftmaxCrossEntropyWithLogits")
        .input("features: T")
        .input("labels: T")
        .output("loss: T")
        .output("backprop: T")
        .attr(FLOAT)
        .shape(softmax_xent_shape)
        .grad(grad::softmax_xent)
        .register(r);
    OpDef::build("SparseSoftmaxCrossEntropyWithLogits")
        .input("features: T")
        .input("labels: Tlabels")
        .output("loss: T")
        .output("backprop: T")
        .attr(FLOAT)
        .attr("Tlabels: {int32, int64} = DT_INT64")
        .shape(sparse_softmax_xent_shape)
        .grad(grad::sparse_softmax_xent)
        .register(r);
    OpDef::build("L2Loss")
        .input("t: T")
        .output("output: T")
        .attr(FLOAT)
        .shape(sf::scalar)
        .grad(grad::l2_loss)
        .register(r);
    register_top_k(r);
}

/// Registers `TopKV2` and `InTopKV2`.
fn register_top_k(r: &mut Registry) {
    OpDef::build("TopKV2")
        .input("input: T")
        .input("k: Tk")
        .output("values: T")
        .output("indices: index_type")
        .attr("sorted: bool = true")
        .attr(REAL)
        .attr("Tk: {int32, int64} = DT_INT32")
        .attr("index_type: {int32, int64} = DT_INT32")
        .shape(top_k_shape)
        .grad(grad::top_k)
        .register(r);
    OpDef::build("InTopKV2")
        .input("predictions: float")
        .input("targets: T")
        .input("k: T")
        .output("precision: bool")
        .attr("T: {int32, int64} = DT_INT32")
        .shape(in_top_k_shape)
        .no_grad()
        .register(r);
}

/// TensorFlow's `TopKShapeFn`: the input with its last dimension `k`, twice.
fn top_k_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let input = ctx.input(0);
    if input.rank() == Some(0) {
        return Err(ctx.error("input must be >= 1-D, got shape []"));
    }
    if let Some(r) = ctx.input(1).rank().filter(|&r| r != 0) {
        return Err(ctx.error(format!("k must be scalar, got rank {r}")));
    }
    let k = ctx.scalar_value(1);
    if let Some(k) = k.filter(|&k| k < 0) {
        return Err(ctx.error(format!("Need k >= 0, got {k}")));
    }
    let k = k.map(|k| k as usize);
    let Some(dims) = input.dims() else {
        return Ok(vec![PartialShape::unknown(); 2]);
    };
    let last = dims[dims.len() - 1];
    if let (Some(n), Some(k)) = (last, k) {
        if n < k {
            return Err(ctx.error(format!(
                "input must have last dimension >= k = {k} but is {n}"
            )));
        }
    }
    let mut out = dims.to_vec();
    *out.last_mut().expect("rank >= 1") = k;
    Ok(vec![PartialShape::new(out); 2])
}

/// One flag per row of the `[batch, classes]` predictions; the targets are `[batch]`.
fn in_top_k_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let predictions = ctx.with_rank(0, 2)?;
    let targets = ctx.with_rank(1, 1)?;
    let rows = |s: &PartialShape| s.dims().and_then(|d| d[0]);
    let batch = sf::merge_dim(rows(&predictions), rows(&targets)).ok_or_else(|| {
        ctx.error(format!(
            "predictions {predictions} and targets {targets} differ in the batch dimension"
        ))
    })?;
    Ok(vec![PartialShape::new(vec![batch])])
}

fn at_least_rank1(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let s = ctx.input(0);
    if s.rank() == Some(0) {
        return Err(ctx.error("logits must have rank at least 1, got a scalar"));
    }
    Ok(vec![s])
}

fn bias_add_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let v = ctx.input(0);
    let b = ctx.with_rank(1, 1)?;
    let nchw = attr::string_or(ctx.node, "data_format", "NHWC")? == "NCHW";
    let Some(dims) = v.dims() else {
        return Ok(vec![v]);
    };
    if dims.len() < 2 {
        return Err(ctx.error(format!("value must have rank at least 2, got shape {v}")));
    }
    // NCHW keeps channels third from the end (dimension 1 of a 4-D tensor).
    let c = if nchw && dims.len() >= 3 {
        dims.len() - 3
    } else {
        dims.len() - 1
    };
    let bd = b.dims().and_then(|d| d.first().copied()).flatten();
    let merged = sf::merge_dim(dims[c], bd).ok_or_else(|| {
        ctx.error(format!(
            "bias of shape {b} does not match dimension {c} of value {v}"
        ))
    })?;
    let mut out = dims.to_vec();
    out[c] = merged;
    Ok(vec![PartialShape::new(out)])
}

fn bias_add_grad_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let v = ctx.input(0);
    let nchw = attr::string_or(ctx.node, "data_format", "NHWC")? == "NCHW";
    Ok(vec![match v.dims() {
        Some(d) if d.len() >= 2 => {
            let c = if nchw && d.len() >= 3 {
                d.len() - 3
            } else {
                d.len() - 1
            };
            PartialShape::new(vec![d[c]])
        }
        _ => PartialShape::unknown_dims(1),
    }])
}

fn softmax_xent_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let both = sf::broadcast(ctx, &ctx.input(0), &ctx.input(1))?;
    let both = match both.rank() {
        None => PartialShape::unknown_dims(2),
        Some(2) => both,
        Some(_) => return Err(ctx.error(format!("features and labels must be 2-D, got {both}"))),
    };
    let batch = both.dims().map(|d| d[0]).unwrap_or(None);
    Ok(vec![PartialShape::new(vec![batch]), both])
}

fn sparse_softmax_xent_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let f = ctx.with_rank(0, 2)?;
    let l = ctx.with_rank(1, 1)?;
    let (fd, ld) = (f.dims().unwrap_or_default(), l.dims().unwrap_or_default());
    let batch = sf::merge_dim(fd[0], ld[0]).ok_or_else(|| {
        ctx.error(format!(
            "logits {f} and labels {l} must have the same first dimension (the batch)"
        ))
    })?;
    Ok(vec![
        PartialShape::new(vec![batch]),
        PartialShape::new(vec![batch, fd[1]]),
    ])
}

/// Neural-network op constructors.
impl Graph {
    /// `max(x, 0)`.
    pub fn relu(&mut self, x: &Output) -> Result<Output> {
        self.unary("Relu", x)
    }
    /// `x` where positive, `alpha * x` elsewhere (`tf.nn.leaky_relu`).
    pub fn leaky_relu(&mut self, x: &Output, alpha: f32) -> Result<Output> {
        self.add1(
            NodeSpec::new("LeakyRelu")
                .input(x)
                .attr("alpha", crate::graph::attr::value::float(alpha)),
        )
    }
    /// `x` where positive, `exp(x) - 1` elsewhere (`tf.nn.elu`).
    pub fn elu(&mut self, x: &Output) -> Result<Output> {
        self.unary("Elu", x)
    }
    /// `min(max(x, 0), 6)` (`tf.nn.relu6`).
    pub fn relu6(&mut self, x: &Output) -> Result<Output> {
        self.unary("Relu6", x)
    }
    /// `log(1 + exp(x))` (`tf.nn.softplus`).
    pub fn softplus(&mut self, x: &Output) -> Result<Output> {
        self.unary("Softplus", x)
    }
    /// The scaled exponential linear unit (`tf.nn.selu`).
    pub fn selu(&mut self, x: &Output) -> Result<Output> {
        self.unary("Selu", x)
    }
    /// Adds a 1-D `bias` along the last dimension of `value`.
    pub fn bias_add(&mut self, value: &Output, bias: &Output) -> Result<Output> {
        self.binary("BiasAdd", value, bias)
    }
    /// `softmax(logits)` over the last dimension.
    pub fn softmax(&mut self, logits: &Output) -> Result<Output> {
        self.unary("Softmax", logits)
    }
    /// Softmax cross-entropy against dense `labels`; returns (loss per row, backprop).
    pub fn softmax_cross_entropy(
        &mut self,
        logits: &Output,
        labels: &Output,
    ) -> Result<(Output, Output)> {
        let mut o = self.add_node(
            NodeSpec::new("SoftmaxCrossEntropyWithLogits")
                .input(logits)
                .input(labels),
        )?;
        let b = o.remove(1);
        Ok((o.remove(0), b))
    }
    /// The `k` largest entries of each row of `x` (its last dimension) and their indices
    /// (`TopKV2`, int32 indices); ties go to the lower index. `sorted` returns them largest
    /// first.
    pub fn top_k(&mut self, x: &Output, k: &Output, sorted: bool) -> Result<(Output, Output)> {
        let mut o = self.add_node(
            NodeSpec::new("TopKV2")
                .input(x)
                .input(k)
                .attr("sorted", crate::graph::attr::value::bool(sorted)),
        )?;
        let indices = o.remove(1);
        Ok((o.remove(0), indices))
    }
    /// Whether each row's target is among the `k` largest `predictions` of its row
    /// (`InTopKV2`).
    pub fn in_top_k(
        &mut self,
        predictions: &Output,
        targets: &Output,
        k: &Output,
    ) -> Result<Output> {
        self.add1(
            NodeSpec::new("InTopKV2")
                .input(predictions)
                .input(targets)
                .input(k),
        )
    }
    /// Softmax cross-entropy against class indices; returns (loss per row, backprop).
    pub fn sparse_softmax_cross_entropy(
        &mut self,
        logits: &Output,
        labels: &Output,
    ) -> Result<(Output, Output)> {
        let mut o = self.add_node(
            NodeSpec::new("SparseSoftmaxCrossEntropyWithLogits")
                .input(logits)
                .input(labels),
        )?;
        let b = o.remove(1);
        Ok((o.remove(0), b))
    }
}

#[cfg(test)]
mod tests {
    use crate::graph::builder::Graph;
    use crate::tensor::{DType, PartialShape};

    #[test]
    fn sparse_xent_checks_the_batch_dimension() {
        let mut g = Graph::new();
        let logits = g
            .placeholder(
                "logits",
                DType::Float,
                PartialShape::new(vec![Some(8), Some(10)]),
            )
            .unwrap();
        let labels = g
            .placeholder("labels", DType::Int64, PartialShape::new(vec![None]))
            .unwrap();
        let (loss, backprop) = g.sparse_softmax_cross_entropy(&logits, &labels).unwrap();
        assert_eq!(loss.shape.to_string(), "[8]");
        assert_eq!(backprop.shape.to_string(), "[8,10]");
        let bad = g
            .placeholder("bad", DType::Int64, PartialShape::new(vec![Some(4)]))
            .unwrap();
        assert!(g.sparse_softmax_cross_entropy(&logits, &bad).is_err());
    }

    #[test]
    fn top_k_replaces_the_last_dimension() {
        let mut g = Graph::new();
        let x = g
            .placeholder("x", DType::Float, PartialShape::new(vec![None, Some(5)]))
            .unwrap();
        let k = g.const_i32("k", &[], &[3]).unwrap();
        let (values, indices) = g.top_k(&x, &k, true).unwrap();
        assert_eq!(values.shape.to_string(), "[?,3]");
        assert_eq!(
            (indices.shape.to_string(), indices.dtype),
            ("[?,3]".into(), DType::Int32)
        );
        let too_many = g.const_i32("k", &[], &[6]).unwrap();
        let err = g.top_k(&x, &too_many, true).unwrap_err();
        assert!(err.message().contains("`TopKV2_1`"), "{err}");
        let targets = g
            .placeholder("t", DType::Int32, PartialShape::new(vec![Some(4)]))
            .unwrap();
        let p = g
            .placeholder("p", DType::Float, PartialShape::new(vec![Some(4), Some(5)]))
            .unwrap();
        assert_eq!(
            g.in_top_k(&p, &targets, &k).unwrap().shape.to_string(),
            "[4]"
        );
        assert!(g.in_top_k(&x, &p, &k).is_err());
    }

    #[test]
    fn bias_add_matches_the_last_dimension() {
        let mut g = Graph::new();
        let v = g
            .placeholder("v", DType::Float, PartialShape::new(vec![None, Some(3)]))
            .unwrap();
        let b = g
            .placeholder("b", DType::Float, PartialShape::new(vec![Some(3)]))
            .unwrap();
        assert_eq!(g.bias_add(&v, &b).unwrap().shape.to_string(), "[?,3]");
        let b4 = g
            .placeholder("b4", DType::Float, PartialShape::new(vec![Some(4)]))
            .unwrap();
        assert!(g.bias_add(&v, &b4).is_err());
    }
}
