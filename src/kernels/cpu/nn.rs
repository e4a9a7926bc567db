//! Neural-network ops: activations and their gradients (Relu, LeakyRelu, Elu, Sigmoid, Tanh),
//! BiasAdd and its
//! gradient, Softmax / LogSoftmax, the two softmax cross-entropy losses, and L2Loss; the
//! convolutions (`conv`, `depthwise`), pooling (`pool`), normalizations (`batch_norm`, `lrn`)
//! and the other activations (`activation`) are listed here too.
//!
//! Softmaxes subtract the row maximum before exponentiating so large logits do not overflow.

use std::borrow::Cow;
use std::sync::Arc;

use super::activation;
use super::batch_norm::BatchNorm;
use super::broadcast::{broadcast_shape, broadcast_to, incompatible};
use super::conv::{self, Conv2D, Pass};
use super::depthwise::Depthwise;
use super::lrn::Lrn;
use super::pool::Pool;
use super::{forward, split};
use num_traits::Zero;

use super::numeric::{Float, Real};
use super::{input, int_values, same_dtype, stateless};
use crate::error::Result;
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, Shape, Tensor};

/// Returns the factory for a neural-network op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "Relu" => |_| stateless(relu),
        "ReluGrad" => |_| stateless(relu_grad),
        "Sigmoid" => |_| stateless(sigmoid),
        "SigmoidGrad" => |_| stateless(sigmoid_grad),
        "Tanh" => |_| stateless(tanh),
        "TanhGrad" => |_| stateless(tanh_grad),
        "LeakyRelu" => LeakyRelu::create,
        "LeakyReluGrad" => LeakyRelu::create_grad,
        "Elu" => |_| stateless(elu),
        "EluGrad" => |_| stateless(elu_grad),
        "Softmax" => |_| stateless(softmax),
        "LogSoftmax" => |_| stateless(log_softmax),
        "BiasAdd" | "BiasAddV1" => BiasAdd::create,
        "BiasAddGrad" => BiasAdd::create_grad,
        "SoftmaxCrossEntropyWithLogits" => |_| stateless(softmax_xent),
        "SparseSoftmaxCrossEntropyWithLogits" => |_| stateless(sparse_softmax_xent),
        "L2Loss" => |_| stateless(l2_loss),
        "Conv2D" => |n| conv::create::<Conv2D>(n, Pass::Forward),
        "Conv2DBackpropInput" => |n| conv::create::<Conv2D>(n, Pass::BackpropInput),
        "Conv2DBackpropFilter" => |n| conv::create::<Conv2D>(n, Pass::BackpropFilter),
        "MaxPool" | "MaxPoolV2" => Pool::create_max,
        "MaxPoolGrad" | "MaxPoolGradV2" => Pool::create_max_grad,
        "AvgPool" => Pool::create_avg,
        "AvgPoolGrad" => Pool::create_avg_grad,
        "Relu6" => |_| stateless(activation::relu6),
        "Relu6Grad" => |_| stateless(activation::relu6_grad),
        "Softplus" => |_| stateless(activation::softplus),
        "SoftplusGrad" => |_| stateless(activation::softplus_grad),
        "Selu" => |_| stateless(activation::selu),
        "SeluGrad" => |_| stateless(activation::selu_grad),
        "Erf" => |_| stateless(activation::erf),
        "Log1p" => |_| stateless(activation::log1p),
        "DepthwiseConv2dNative" => |n| conv::create::<Depthwise>(n, Pass::Forward),
        "DepthwiseConv2dNativeBackpropInput" => {
            |n| conv::create::<Depthwise>(n, Pass::BackpropInput)
        }
        "DepthwiseConv2dNativeBackpropFilter" => {
            |n| conv::create::<Depthwise>(n, Pass::BackpropFilter)
        }
        "FusedBatchNorm" | "FusedBatchNormV2" | "FusedBatchNormV3" => BatchNorm::create,
        "FusedBatchNormGrad" | "FusedBatchNormGradV2" | "FusedBatchNormGradV3" => {
            BatchNorm::create_grad
        }
        "LRN" => Lrn::create,
        "LRNGrad" => Lrn::create_grad,
        _ => return None,
    };
    Some(factory)
}

fn relu(ctx: &mut OpContext<'_>) -> Result<()> {
    let out = dispatch_real!(ctx, ctx.input(0)?.dtype(), T => {
        let zero = T::zero();
        forward::map::<T>(ctx, 0, |e| if e > zero { e } else { zero })?
    });
    ctx.set_output(0, out);
    Ok(())
}

fn sigmoid(ctx: &mut OpContext<'_>) -> Result<()> {
    let out = dispatch_float!(ctx, ctx.input(0)?.dtype(), T => {
        forward::map::<T>(ctx, 0, T::sigmoid_fast)?
    });
    ctx.set_output(0, out);
    Ok(())
}

fn tanh(ctx: &mut OpContext<'_>) -> Result<()> {
    let out = dispatch_float!(ctx, ctx.input(0)?.dtype(), T => {
        forward::map::<T>(ctx, 0, T::tanh_fast)?
    });
    ctx.set_output(0, out);
    Ok(())
}

/// `LeakyRelu(features)`: `x` where positive, `alpha * x` elsewhere; `LeakyReluGrad(gradients,
/// features)`: the gradient where the feature is positive, `alpha` times it elsewhere.
struct LeakyRelu {
    alpha: f64,
    grad: bool,
}

impl LeakyRelu {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let alpha = f64::from(attr::float_or(node, "alpha", 0.2)?);
        Ok(Arc::new(LeakyRelu { alpha, grad: false }))
    }

    fn create_grad(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let alpha = f64::from(attr::float_or(node, "alpha", 0.2)?);
        Ok(Arc::new(LeakyRelu { alpha, grad: true }))
    }
}

impl OpKernel for LeakyRelu {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let out = if self.grad {
            dispatch_float!(ctx, binary_dtype(ctx)?, T => {
                let alpha = self.alpha as T;
                same_shape_binary::<T>(ctx, |g, f| if f > 0.0 { g } else { alpha * g })?
            })
        } else {
            dispatch_float!(ctx, ctx.input(0)?.dtype(), T => {
                let alpha = self.alpha as T;
                forward::map::<T>(ctx, 0, |e| if e > 0.0 { e } else { alpha * e })?
            })
        };
        ctx.set_output(0, out);
        Ok(())
    }
}

/// `Elu(features)`: `x` where positive, `exp(x) - 1` elsewhere.
fn elu(ctx: &mut OpContext<'_>) -> Result<()> {
    let out = dispatch_float!(ctx, ctx.input(0)?.dtype(), T => {
        forward::map::<T>(ctx, 0, |e| if e > 0.0 { e } else { e.exp_m1() })?
    });
    ctx.set_output(0, out);
    Ok(())
}

/// `EluGrad(gradients, outputs)`: the gradient where the output is positive, else the
/// gradient times `output + 1` (the derivative `exp(x)`).
fn elu_grad(ctx: &mut OpContext<'_>) -> Result<()> {
    let out = dispatch_float!(ctx, binary_dtype(ctx)?, T => {
        same_shape_binary::<T>(ctx, |g, y| if y > 0.0 { g } else { g * (y + 1.0) })?
    });
    ctx.set_output(0, out);
    Ok(())
}

/// Checks that the two inputs of a gradient op have one shape (TensorFlow does not broadcast
/// them).
pub(crate) fn same_shape(ctx: &OpContext<'_>, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.shape() != b.shape() {
        return Err(ctx.invalid(format!(
            "inputs must have the same size and shape: input 0: {} != input 1: {}",
            a.shape(),
            b.shape()
        )));
    }
    Ok(())
}

/// Applies `f(a, b)` to inputs 0 and 1, of one shape (the gradient ops), written over either
/// when this node is its last reader.
pub(super) fn same_shape_binary<T: Real + bytemuck::Pod + Send + Sync>(
    ctx: &mut OpContext<'_>,
    f: impl Fn(T, T) -> T + Sync,
) -> Result<Tensor> {
    same_shape(ctx, ctx.input(0)?, ctx.input(1)?)?;
    forward::zip(ctx, f)
}

/// The dtype of inputs 0 and 1, which must agree.
fn binary_dtype(ctx: &OpContext<'_>) -> Result<DType> {
    let (a, b) = (ctx.input(0)?, ctx.input(1)?);
    same_dtype(ctx, a, b)?;
    Ok(a.dtype())
}

/// ReluGrad(gradients, features): the gradient where the feature is positive, else 0.
fn relu_grad(ctx: &mut OpContext<'_>) -> Result<()> {
    let out = dispatch_real!(ctx, binary_dtype(ctx)?, T => {
        same_shape_binary::<T>(ctx, |g, f| if f > T::zero() { g } else { T::zero() })?
    });
    ctx.set_output(0, out);
    Ok(())
}

/// SigmoidGrad(y, dy) = dy * y * (1 - y).
fn sigmoid_grad(ctx: &mut OpContext<'_>) -> Result<()> {
    let out = dispatch_float!(ctx, binary_dtype(ctx)?, T => {
        same_shape_binary::<T>(ctx, |y, dy| dy * y * (1.0 - y))?
    });
    ctx.set_output(0, out);
    Ok(())
}

/// TanhGrad(y, dy) = dy * (1 - y^2).
fn tanh_grad(ctx: &mut OpContext<'_>) -> Result<()> {
    let out = dispatch_float!(ctx, binary_dtype(ctx)?, T => {
        same_shape_binary::<T>(ctx, |y, dy| dy * (1.0 - y * y))?
    });
    ctx.set_output(0, out);
    Ok(())
}

/// Cycles per element of a softmax row (a max, an `exp` and a divide or a subtract).
const SOFTMAX_CYCLES: f64 = 16.0;

/// Writes the softmax (or log-softmax) of each row of `x` into the same place of `out`.
fn softmax_rows<T: Float>(x: &[T], classes: usize, log: bool, out: &mut [T]) {
    for (row, out) in x.chunks(classes).zip(out.chunks_mut(classes)) {
        let max = row
            .iter()
            .copied()
            .fold(T::neg_infinity(), |a, b| if b > a { b } else { a });
        let sum = row.iter().fold(T::zero(), |s, &v| s + (v - max).exp());
        if log {
            let lse = sum.ln();
            for (o, &v) in out.iter_mut().zip(row) {
                *o = v - max - lse;
            }
        } else {
            for (o, &v) in out.iter_mut().zip(row) {
                *o = (v - max).exp() / sum;
            }
        }
    }
}

/// [`softmax_rows`] of `x` split by rows over the intra-op pool (each row computed as on one
/// thread, so the bits do not depend on the split).
fn softmax_rows_split<T: Float>(ctx: &OpContext<'_>, x: &[T], classes: usize, log: bool) -> Vec<T> {
    let mut out = vec![T::zero(); x.len()];
    if classes > 0 {
        ctx.intra().for_chunks(
            &mut out,
            classes,
            classes as f64 * SOFTMAX_CYCLES,
            |first, rows| {
                let at = first * classes;
                softmax_rows(&x[at..at + rows.len()], classes, log, rows)
            },
        );
    }
    out
}

fn softmax_kernel(ctx: &mut OpContext<'_>, log: bool) -> Result<()> {
    let x = input(ctx, 0)?;
    if x.rank() < 1 {
        return Err(ctx.invalid(format!(
            "logits must have >= 1 dimension, got {}",
            x.shape()
        )));
    }
    let classes = x.dims()[x.rank() - 1];
    let out = dispatch_float!(ctx, x.dtype(), T => {
        let v = x.values::<T>()?;
        Tensor::from_vec(x.shape().clone(), softmax_rows_split::<T>(ctx, &v, classes, log))?
    });
    ctx.set_output(0, out);
    Ok(())
}

fn softmax(ctx: &mut OpContext<'_>) -> Result<()> {
    softmax_kernel(ctx, false)
}

fn log_softmax(ctx: &mut OpContext<'_>) -> Result<()> {
    softmax_kernel(ctx, true)
}

/// Where BiasAdd's channels are: last (`NHWC`, the default) or right after the batch (`NCHW`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BiasLayout {
    /// Whether channels come right after the batch dimension (NCHW) rather than last (NHWC).
    pub channels_first: bool,
}

impl BiasLayout {
    /// The layout of a BiasAdd or BiasAddGrad node, from its `data_format`.
    pub fn of(node: &NodeDef) -> Result<BiasLayout> {
        let format = attr::string_or(node, "data_format", "NHWC")?;
        let channels_first = match format.as_str() {
            "NHWC" => false,
            "NCHW" => true,
            other => {
                return Err(crate::Status::invalid_argument(format!(
                    "node `{}` (op {}): unknown data_format `{other}`; use NHWC or NCHW",
                    node.name, node.op
                )))
            }
        };
        Ok(BiasLayout { channels_first })
    }

    /// The index of the channel dimension in a value of rank `rank` (at least 2).
    pub fn channel_axis(self, rank: usize) -> usize {
        if self.channels_first {
            1
        } else {
            rank - 1
        }
    }

    /// Returns (outer, channels, inner) sizes of `shape` around the channel dimension.
    pub fn split(self, ctx: &OpContext<'_>, shape: &Shape) -> Result<(usize, usize, usize)> {
        if shape.rank() < 2 {
            return Err(ctx.invalid(format!("Input tensor must be at least 2D: {shape}")));
        }
        let axis = self.channel_axis(shape.rank());
        let dims = shape.dims();
        Ok((
            dims[..axis].iter().product(),
            dims[axis],
            dims[axis + 1..].iter().product(),
        ))
    }

    /// Checks a bias against the value it is added to; returns the value's split.
    pub fn check_bias(
        self,
        ctx: &OpContext<'_>,
        value: &Shape,
        bias: &Shape,
    ) -> Result<(usize, usize, usize)> {
        let split = self.split(ctx, value)?;
        if bias.rank() != 1 {
            return Err(ctx.invalid(format!("Biases must be 1D: {bias}")));
        }
        if bias.dims()[0] != split.1 {
            return Err(ctx.invalid(format!(
                "Must provide as many biases as the channel dimension of the input tensor: \
                 {bias} vs. {value}"
            )));
        }
        Ok(split)
    }
}

/// BiasAdd adds a 1-D bias along the channel dimension; BiasAddGrad sums over every other one.
struct BiasAdd {
    layout: BiasLayout,
    grad: bool,
}

impl BiasAdd {
    fn parse(node: &NodeDef, grad: bool) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(BiasAdd {
            layout: BiasLayout::of(node)?,
            grad,
        }))
    }

    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Self::parse(node, false)
    }

    fn create_grad(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Self::parse(node, true)
    }

    fn add<T: Real + bytemuck::Pod + Send + Sync>(
        &self,
        ctx: &mut OpContext<'_>,
    ) -> Result<Tensor> {
        let (value, bias) = (ctx.input(0)?, ctx.input(1)?);
        let (outer, channels, inner) = self.layout.check_bias(ctx, value.shape(), bias.shape())?;
        if inner == 1 && channels > 0 {
            // Channels last: the bias is a row added to every row, over the value when this
            // node is its last reader.
            let row = bias.values::<T>()?.into_owned();
            return forward::rows(ctx, &row, |e, bc| Real::add(e, bc));
        }
        let (v, b) = (value.values::<T>()?, bias.values::<T>()?);
        let mut out = Vec::with_capacity(v.len());
        for o in 0..outer {
            for (c, &bc) in b.iter().enumerate() {
                let start = (o * channels + c) * inner;
                out.extend(v[start..start + inner].iter().map(|&e| Real::add(e, bc)));
            }
        }
        Tensor::from_vec(value.shape().clone(), out)
    }

    fn grad<T: Real>(&self, ctx: &OpContext<'_>, backprop: &Tensor) -> Result<Tensor> {
        let (outer, channels, inner) = self.layout.split(ctx, backprop.shape())?;
        let v = backprop.values::<T>()?;
        let block = channels * inner;
        // Each piece of the outer rows sums into sums of its own; the pieces' sums are added.
        let intra = ctx.intra();
        let pieces = intra.pieces(outer, block as f64 * split::ELEMENT_CYCLES);
        let ranges: Vec<_> = crate::runtime::intra::split(outer, pieces).collect();
        let parts = intra.map(ranges, |range| {
            let mut sums = vec![T::zero(); channels];
            if block == 0 {
                return sums;
            }
            let v = &v[range.start * block..range.end * block];
            split::lanes(|| {
                if inner == 1 {
                    sum_rows(&mut sums, v);
                } else {
                    for rows in v.chunks_exact(block) {
                        for (s, plane) in sums.iter_mut().zip(rows.chunks_exact(inner)) {
                            *s = plane.iter().fold(*s, |s, &e| Real::add(s, e));
                        }
                    }
                }
            });
            sums
        });
        let mut parts = parts.into_iter();
        let mut sums = parts.next().unwrap_or_else(|| vec![T::zero(); channels]);
        for part in parts {
            for (s, p) in sums.iter_mut().zip(part) {
                *s = Real::add(*s, p);
            }
        }
        Tensor::from_vec([channels], sums)
    }
}

/// Adds each row of `rows` (rows as long as `sums`) into `sums`, four rows a pass: a row of a
/// convolution's channels is short (32 floats), and summing one at a time spends more on the
/// loop than on the adds.
#[inline(always)]
fn sum_rows<T: Real>(sums: &mut [T], rows: &[T]) {
    let width = sums.len();
    let mut quads = rows.chunks_exact(4 * width);
    for quad in &mut quads {
        let (a, rest) = quad.split_at(width);
        let (b, rest) = rest.split_at(width);
        let (c, d) = rest.split_at(width);
        for ((((s, &a), &b), &c), &d) in sums.iter_mut().zip(a).zip(b).zip(c).zip(d) {
            *s = Real::add(*s, Real::add(Real::add(a, b), Real::add(c, d)));
        }
    }
    for row in quads.remainder().chunks_exact(width) {
        for (s, &e) in sums.iter_mut().zip(row) {
            *s = Real::add(*s, e);
        }
    }
}

impl OpKernel for BiasAdd {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let out = if self.grad {
            let value = ctx.input(0)?;
            dispatch_real!(ctx, value.dtype(), T => self.grad::<T>(ctx, value)?)
        } else {
            dispatch_real!(ctx, binary_dtype(ctx)?, T => self.add::<T>(ctx)?)
        };
        ctx.set_output(0, out);
        Ok(())
    }
}

/// SoftmaxCrossEntropyWithLogits(features, labels) -> (loss [batch], backprop [batch, classes]).
fn softmax_xent(ctx: &mut OpContext<'_>) -> Result<()> {
    let (logits, labels) = (input(ctx, 0)?, input(ctx, 1)?);
    same_dtype(ctx, &logits, &labels)?;
    let shape = broadcast_shape(logits.dims(), labels.dims())
        .ok_or_else(|| incompatible(ctx, logits.shape(), labels.shape()))?;
    if shape.len() != 2 {
        return Err(ctx.invalid(format!(
            "logits and labels must be either 2-dimensional, or broadcasted to be 2-dimensional; \
             got logits {} and labels {}",
            logits.shape(),
            labels.shape()
        )));
    }
    let (batch, classes) = (shape[0], shape[1]);
    let (loss, backprop) = dispatch_float!(ctx, logits.dtype(), T => {
        let lv = logits.values::<T>()?;
        let yv = labels.values::<T>()?;
        // Only an operand that really broadcasts is copied to the full shape.
        let x = if logits.dims() == shape.as_slice() {
            lv
        } else {
            Cow::Owned(broadcast_to(&lv, logits.dims(), &shape).expect("broadcast checked"))
        };
        let y = if labels.dims() == shape.as_slice() {
            yv
        } else {
            Cow::Owned(broadcast_to(&yv, labels.dims(), &shape).expect("broadcast checked"))
        };
        // The log-probabilities are computed into the backprop buffer, then turned into
        // `softmax - labels` in place; rows split over the intra-op pool.
        let mut backprop = vec![T::zero(); batch * classes];
        let mut loss = vec![T::zero(); batch];
        if classes > 0 && batch > 0 {
            let pieces = ctx.intra().pieces(batch, classes as f64 * (SOFTMAX_CYCLES + 4.0));
            let per_piece = batch.div_ceil(pieces);
            let items: Vec<(usize, &mut [T], &mut [T])> = backprop
                .chunks_mut(per_piece * classes)
                .zip(loss.chunks_mut(per_piece))
                .enumerate()
                .map(|(k, (rows, losses))| (k * per_piece, rows, losses))
                .collect();
            ctx.intra().map(items, |(first, rows, losses)| {
                let at = first * classes;
                softmax_rows::<T>(&x[at..at + rows.len()], classes, true, rows);
                for (b, l) in losses.iter_mut().enumerate() {
                    for j in b * classes..(b + 1) * classes {
                        *l -= y[at + j] * rows[j];
                        rows[j] = rows[j].exp() - y[at + j];
                    }
                }
            });
        }
        (Tensor::from_vec([batch], loss)?, Tensor::from_vec(Shape::new(shape.clone()), backprop)?)
    });
    ctx.set_output(0, loss);
    ctx.set_output(1, backprop);
    Ok(())
}

/// Checks SparseSoftmaxCrossEntropyWithLogits' inputs: logits [batch, classes] and labels
/// [batch] of class indices in `[0, classes)`; returns the labels.
pub(crate) fn sparse_xent_labels(
    ctx: &OpContext<'_>,
    logits: &Tensor,
    labels: &Tensor,
) -> Result<Vec<i64>> {
    if logits.rank() != 2 {
        return Err(ctx.invalid(format!(
            "logits must be 2-D, but got shape {}",
            logits.shape()
        )));
    }
    if labels.rank() != 1 {
        return Err(ctx.invalid(format!(
            "labels must be 1-D, but got shape {}",
            labels.shape()
        )));
    }
    let (batch, classes) = (logits.dims()[0], logits.dims()[1]);
    if labels.dims()[0] != batch {
        return Err(ctx.invalid(format!(
            "logits and labels must have the same first dimension, got logits shape {} and labels shape {}",
            logits.shape(),
            labels.shape()
        )));
    }
    if classes == 0 && batch > 0 {
        return Err(ctx.invalid(format!(
            "Must have at least one class, but got logits shape {}",
            logits.shape()
        )));
    }
    let label_values = int_values(ctx, labels, "labels")?;
    if let Some(&bad) = label_values.iter().find(|&&l| l < 0 || l >= classes as i64) {
        let shown: Vec<String> = label_values.iter().take(32).map(i64::to_string).collect();
        return Err(ctx.invalid(format!(
            "Received a label value of {bad} which is outside the valid range of [0, {classes}).  \
             Label values: {}",
            shown.join(" ")
        )));
    }
    Ok(label_values)
}

/// SparseSoftmaxCrossEntropyWithLogits(features [batch, classes], labels [batch] int32/int64).
fn sparse_softmax_xent(ctx: &mut OpContext<'_>) -> Result<()> {
    let (logits, labels) = (input(ctx, 0)?, input(ctx, 1)?);
    let label_values = sparse_xent_labels(ctx, &logits, &labels)?;
    let (batch, classes) = (logits.dims()[0], logits.dims()[1]);
    let (loss, backprop) = dispatch_float!(ctx, logits.dtype(), T => {
        let x = logits.values::<T>()?;
        // Log-probabilities go into the backprop buffer and become `softmax - onehot` in place.
        let mut backprop = softmax_rows_split::<T>(ctx, &x, classes, true);
        let mut loss = Vec::with_capacity(batch);
        for (row, &label) in backprop.chunks_mut(classes.max(1)).zip(&label_values) {
            loss.push(-row[label as usize]);
            for (j, lp) in row.iter_mut().enumerate() {
                *lp = lp.exp() - if j as i64 == label { 1.0 } else { 0.0 };
            }
        }
        (Tensor::from_vec([batch], loss)?, Tensor::from_vec([batch, classes], backprop)?)
    });
    ctx.set_output(0, loss);
    ctx.set_output(1, backprop);
    Ok(())
}

/// L2Loss(t) = sum(t^2) / 2, a scalar.
fn l2_loss(ctx: &mut OpContext<'_>) -> Result<()> {
    let x = input(ctx, 0)?;
    let out = dispatch_float!(ctx, x.dtype(), T => {
        let v = x.values::<T>()?;
        Tensor::scalar(v.iter().fold(0.0 as T, |s, &e| s + e * e) / 2.0)
    });
    ctx.set_output(0, out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{float32_bits, run_float32};
    use super::*;
    use crate::runtime::intra::IntraPool;

    /// Softmax, its log and both cross-entropies split by rows over a pool give the bits of
    /// one thread (each row is computed whole on one thread), past the split's threshold.
    #[test]
    fn softmax_and_the_cross_entropies_split_by_rows_keep_one_threads_bits() {
        let (one, three) = (IntraPool::new("nn-one", 1), IntraPool::new("nn-three", 3));
        let (batch, classes) = (257, 100);
        let logits: Vec<f32> = (0..batch * classes)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let labels: Vec<f32> = (0..batch * classes)
            .map(|i| {
                if i % classes == (i / classes) % classes {
                    1.0
                } else {
                    0.0
                }
            })
            .collect();
        let sparse: Vec<i32> = (0..batch).map(|b| (b % classes) as i32).collect();
        let logits = Tensor::from_vec([batch, classes], logits).unwrap();
        assert!(
            three.pieces(batch, classes as f64 * SOFTMAX_CYCLES) > 1,
            "it must split"
        );
        let cases: Vec<(&str, Vec<Tensor>)> = vec![
            ("Softmax", vec![logits.clone()]),
            ("LogSoftmax", vec![logits.clone()]),
            (
                "SoftmaxCrossEntropyWithLogits",
                vec![
                    logits.clone(),
                    Tensor::from_vec([batch, classes], labels).unwrap(),
                ],
            ),
            (
                "SparseSoftmaxCrossEntropyWithLogits",
                vec![logits.clone(), Tensor::from_vec([batch], sparse).unwrap()],
            ),
        ];
        for (op, inputs) in cases {
            let whole = run_float32(op, inputs.clone(), Some(&one));
            let split = run_float32(op, inputs, Some(&three));
            for (w, s) in whole.iter().zip(&split) {
                assert_eq!(w.dims(), s.dims(), "{op}");
                assert_eq!(float32_bits(w), float32_bits(s), "{op}");
            }
        }
        // The values are a softmax: each row sums to 1.
        let p = run_float32("Softmax", vec![logits], Some(&three)).remove(0);
        for row in p.values::<f32>().unwrap().chunks(classes) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        }
    }
}
