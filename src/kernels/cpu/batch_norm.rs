//! Fused batch normalization: `FusedBatchNorm`, `FusedBatchNormV2`, `FusedBatchNormV3` and
//! their gradients `FusedBatchNormGrad{,V2,V3}`, float32, `NHWC` and `NCHW` (and the 3-D
//! `NDHWC` and `NCDHW` where `V3` takes them), training and inference, as TensorFlow's CPU
//! kernels compute them (`fused_batch_norm_op.cc`).
//!
//! Training normalizes by the batch's own mean and (biased) variance per channel and reports
//! running statistics: with `exponential_avg_factor` 1 the batch mean and the variance with
//! Bessel's correction `n / (n - 1)`; otherwise those blended into the `mean` and `variance`
//! inputs, `old * (1 - factor) + batch * factor`. Inference normalizes by the `mean` and
//! `variance` inputs and passes them through.
//!
//! The reserve spaces are what TensorFlow's default (oneDNN) CPU build hands on: in training
//! `reserve_space_1` is the batch mean and `reserve_space_2` the biased batch variance, in
//! inference the two inputs; `V3`'s `reserve_space_3` is an empty `[0]` (a scalar for 5-D
//! inputs, which TensorFlow's plain CPU kernel takes, leaving the first two reserve spaces
//! uninitialized in inference where tessera passes the statistics on). The gradient ops'
//! two trailing reserve outputs, which nothing reads, have the shapes TensorFlow's shape
//! function gives them: `[0]` in training, zeros per channel in inference.
//! The gradient takes the first two reserve spaces as the statistics to differentiate
//! through (training) or the population statistics (inference).
//!
//! Sums are accumulated in float64.

use std::borrow::Cow;
use std::sync::Arc;

use super::input;
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::graph::window::node_error;
use crate::kernels::{OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, Tensor};

/// A fused batch normalization node (forward or gradient) and its attrs.
pub(super) struct BatchNorm {
    epsilon: f64,
    factor: f64,
    /// Whether channels come last (`NHWC`, `NDHWC`) rather than second (`NCHW`, `NCDHW`).
    channels_last: bool,
    /// The rank the data format implies: 4, or 5 for the 3-D formats.
    rank: usize,
    training: bool,
    /// How many outputs the forward op has (5, or 6 for `V3`).
    outputs: usize,
}

impl BatchNorm {
    fn parse(node: &NodeDef) -> Result<BatchNorm> {
        let (channels_last, rank) = match attr::string_or(node, "data_format", "NHWC")?.as_str() {
            "NHWC" => (true, 4),
            "NCHW" => (false, 4),
            "NDHWC" => (true, 5),
            "NCDHW" => (false, 5),
            other => {
                return Err(node_error(
                    node,
                    Status::invalid_argument(format!(
                        "unknown data_format `{other}`; use NHWC, NCHW, NDHWC or NCDHW"
                    )),
                ))
            }
        };
        Ok(BatchNorm {
            epsilon: f64::from(attr::float_or(node, "epsilon", 1e-4)?),
            factor: f64::from(attr::float_or(node, "exponential_avg_factor", 1.0)?),
            channels_last,
            rank,
            training: attr::bool_or(node, "is_training", true)?,
            outputs: if node.op.ends_with("V3") { 6 } else { 5 },
        })
    }

    pub(super) fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Forward(Self::parse(node)?)))
    }

    pub(super) fn create_grad(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Backward(Self::parse(node)?)))
    }
}

/// `FusedBatchNorm*`.
struct Forward(BatchNorm);

/// `FusedBatchNormGrad*`.
struct Backward(BatchNorm);

/// Reads a float32 input as values, failing with TensorFlow's dtype message otherwise.
fn floats(ctx: &OpContext<'_>, t: &Tensor) -> Result<Vec<f32>> {
    if t.dtype() != DType::Float {
        return Err(super::unsupported_dtype(ctx, t.dtype(), &[DType::Float]));
    }
    Ok(t.values::<f32>()?.into_owned())
}

impl BatchNorm {
    /// Fails unless `t` has the rank of the data format.
    fn check_rank(&self, ctx: &OpContext<'_>, t: &Tensor) -> Result<()> {
        if t.rank() != self.rank {
            return Err(ctx.invalid(format!(
                "input must be {}-dimensional{}",
                self.rank,
                t.shape()
            )));
        }
        Ok(())
    }

    /// The channel count of an input of these dims.
    fn channels(&self, dims: &[usize]) -> usize {
        if self.channels_last {
            dims[dims.len() - 1]
        } else {
            dims[1]
        }
    }

    /// The values of an input of these dims with channels last (borrowed when they are).
    fn channels_last_values<'a>(&self, dims: &[usize], v: &'a [f32]) -> Cow<'a, [f32]> {
        if self.channels_last {
            return Cow::Borrowed(v);
        }
        let (c, rest) = (dims[1], dims[2..].iter().product::<usize>());
        let mut out = Vec::with_capacity(v.len());
        for image in v.chunks_exact((c * rest).max(1)) {
            for p in 0..rest {
                out.extend((0..c).map(|ch| image[ch * rest + p]));
            }
        }
        Cow::Owned(out)
    }

    /// Lays out channels-last values in the data format, for an output of these dims.
    fn in_format(&self, dims: &[usize], v: Vec<f32>) -> Vec<f32> {
        if self.channels_last {
            return v;
        }
        let (c, rest) = (dims[1], dims[2..].iter().product::<usize>());
        let mut out = Vec::with_capacity(v.len());
        for image in v.chunks_exact((c * rest).max(1)) {
            for ch in 0..c {
                out.extend((0..rest).map(|p| image[p * c + ch]));
            }
        }
        out
    }
}

/// Fails unless `t` is 1-D; with `channels`, also unless it holds that many elements.
fn check_vector(
    ctx: &OpContext<'_>,
    t: &Tensor,
    what: &str,
    channels: Option<(usize, &str)>,
) -> Result<()> {
    if t.rank() != 1 {
        return Err(ctx.invalid(format!("{what} must be 1-dimensional{}", t.shape())));
    }
    if let Some((c, prefix)) = channels {
        if t.num_elements() != c {
            return Err(ctx.invalid(format!(
                "{prefix}{what} must have the same number of elements as the channels of x, \
                 got {} and {c}",
                t.num_elements()
            )));
        }
    }
    Ok(())
}

/// Per-channel sums of `f(value, channel)` over `NHWC` values with `c` channels.
fn channel_sums(values: &[f32], c: usize, f: impl Fn(usize, f32) -> f64) -> Vec<f64> {
    let mut sums = vec![0f64; c];
    for pixel in values.chunks_exact(c.max(1)) {
        for (ch, (s, &v)) in sums.iter_mut().zip(pixel).enumerate() {
            *s += f(ch, v);
        }
    }
    sums
}

/// A 1-D float32 tensor.
fn vector(values: Vec<f32>) -> Result<Tensor> {
    Tensor::from_vec([values.len()], values)
}

impl OpKernel for Forward {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let bn = &self.0;
        let x = input(ctx, 0)?;
        let [scale, offset, mean_in, var_in] = [1, 2, 3, 4].map(|i| input(ctx, i));
        let (scale, offset, mean_in, var_in) = (scale?, offset?, mean_in?, var_in?);
        bn.check_rank(ctx, &x)?;
        for (t, what) in [
            (&scale, "scale"),
            (&offset, "offset"),
            (&mean_in, "mean"),
            (&var_in, "variance"),
        ] {
            check_vector(ctx, t, what, None)?;
        }
        let c = bn.channels(x.dims());
        check_vector(ctx, &scale, "scale", Some((c, "")))?;
        check_vector(ctx, &offset, "offset", Some((c, "")))?;
        let need_stats = if !bn.training {
            Some("When is_training=false, ")
        } else if bn.factor != 1.0 {
            Some("When exponential_avg_factor != 1, ")
        } else {
            None
        };
        if let Some(prefix) = need_stats {
            check_vector(ctx, &mean_in, "mean", Some((c, prefix)))?;
            check_vector(ctx, &var_in, "variance", Some((c, prefix)))?;
        }
        let xv = floats(ctx, &x)?;
        let xs = bn.channels_last_values(x.dims(), &xv);
        let (scale, offset) = (floats(ctx, &scale)?, floats(ctx, &offset)?);
        let (mean_in, var_in) = (floats(ctx, &mean_in)?, floats(ctx, &var_in)?);
        let rest = xs.len().checked_div(c).unwrap_or(0);
        let (mean, var): (Vec<f64>, Vec<f64>) = if bn.training {
            let n = rest as f64;
            let mean: Vec<f64> = channel_sums(&xs, c, |_, v| f64::from(v))
                .into_iter()
                .map(|s| s / n)
                .collect();
            let var = channel_sums(&xs, c, |ch, v| (f64::from(v) - mean[ch]).powi(2))
                .into_iter()
                .map(|s| s / n)
                .collect();
            (mean, var)
        } else {
            (
                mean_in.iter().map(|&v| f64::from(v)).collect(),
                var_in.iter().map(|&v| f64::from(v)).collect(),
            )
        };
        // y = x * a + b per channel, a = scale / sqrt(var + eps), b = offset - mean * a.
        let a: Vec<f64> = (0..c)
            .map(|ch| f64::from(scale[ch]) / (var[ch] + bn.epsilon).sqrt())
            .collect();
        let b: Vec<f64> = (0..c)
            .map(|ch| f64::from(offset[ch]) - mean[ch] * a[ch])
            .collect();
        let mut y = Vec::with_capacity(xs.len());
        for pixel in xs.chunks_exact(c.max(1)) {
            y.extend(
                pixel
                    .iter()
                    .enumerate()
                    .map(|(ch, &v)| (f64::from(v) * a[ch] + b[ch]) as f32),
            );
        }
        let y = bn.in_format(x.dims(), y);
        let as_f32 = |v: &[f64]| v.iter().map(|&v| v as f32).collect::<Vec<f32>>();
        let (batch_mean, batch_var, reserve_1, reserve_2) = if bn.training {
            let adjust = rest as f64 / (rest.max(2) - 1) as f64;
            let (running_mean, running_var): (Vec<f64>, Vec<f64>) = if bn.factor == 1.0 {
                (mean.clone(), var.iter().map(|v| v * adjust).collect())
            } else {
                let (f, keep) = (bn.factor, 1.0 - bn.factor);
                (
                    (0..c)
                        .map(|ch| f64::from(mean_in[ch]) * keep + mean[ch] * f)
                        .collect(),
                    (0..c)
                        .map(|ch| f64::from(var_in[ch]) * keep + var[ch] * adjust * f)
                        .collect(),
                )
            };
            (
                as_f32(&running_mean),
                as_f32(&running_var),
                as_f32(&mean),
                as_f32(&var),
            )
        } else {
            (mean_in.clone(), var_in.clone(), mean_in, var_in)
        };
        ctx.set_output(0, Tensor::from_vec(x.shape().clone(), y)?);
        ctx.set_output(1, vector(batch_mean)?);
        ctx.set_output(2, vector(batch_var)?);
        ctx.set_output(3, vector(reserve_1)?);
        ctx.set_output(4, vector(reserve_2)?);
        if bn.outputs == 6 {
            // TensorFlow's oneDNN kernel (4-D) gives an empty vector, its plain one (5-D) a
            // scalar.
            let reserve_3 = if bn.rank == 4 {
                vector(Vec::new())?
            } else {
                Tensor::scalar(0f32)
            };
            ctx.set_output(5, reserve_3);
        }
        Ok(())
    }
}

impl OpKernel for Backward {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let bn = &self.0;
        let (dy, x) = (input(ctx, 0)?, input(ctx, 1)?);
        let (scale, mean, var) = (input(ctx, 2)?, input(ctx, 3)?, input(ctx, 4)?);
        bn.check_rank(ctx, &dy)?;
        bn.check_rank(ctx, &x)?;
        for (t, what) in [
            (&scale, "scale"),
            (&mean, "reserve_space_1"),
            (&var, "reserve_space_2"),
        ] {
            check_vector(ctx, t, what, None)?;
        }
        if x.shape() != dy.shape() {
            return Err(ctx.invalid(format!(
                "x and y_backprop must have same shape, but x has shape {} and y_backprop has \
                 shape {}",
                x.shape(),
                dy.shape()
            )));
        }
        let c = bn.channels(x.dims());
        check_vector(ctx, &scale, "scale", Some((c, "")))?;
        check_vector(ctx, &mean, "reserve_space_1", Some((c, "")))?;
        check_vector(ctx, &var, "reserve_space_2", Some((c, "")))?;
        let (dyv, xv) = (floats(ctx, &dy)?, floats(ctx, &x)?);
        let (dys, xs) = (
            bn.channels_last_values(dy.dims(), &dyv),
            bn.channels_last_values(x.dims(), &xv),
        );
        let (scale, mean, var) = (
            floats(ctx, &scale)?,
            floats(ctx, &mean)?,
            floats(ctx, &var)?,
        );
        let coef: Vec<f64> = var
            .iter()
            .map(|&v| 1.0 / (f64::from(v) + bn.epsilon).sqrt())
            .collect();
        let centered = |ch: usize, v: f32| f64::from(v) - f64::from(mean[ch]);
        let sum_dy = channel_sums(&dys, c, |_, d| f64::from(d));
        let mut sum_dy_xc = vec![0f64; c];
        for (dp, xp) in dys.chunks_exact(c.max(1)).zip(xs.chunks_exact(c.max(1))) {
            for ch in 0..c {
                sum_dy_xc[ch] += f64::from(dp[ch]) * centered(ch, xp[ch]);
            }
        }
        let n = xs.len().checked_div(c).unwrap_or(0) as f64;
        let mut dx = Vec::with_capacity(xs.len());
        for (dp, xp) in dys.chunks_exact(c.max(1)).zip(xs.chunks_exact(c.max(1))) {
            for ch in 0..c {
                let k = f64::from(scale[ch]) * coef[ch];
                let d = f64::from(dp[ch]);
                let v = if bn.training {
                    let xc = centered(ch, xp[ch]);
                    k * (d - sum_dy[ch] / n - xc * coef[ch] * coef[ch] * sum_dy_xc[ch] / n)
                } else {
                    k * d
                };
                dx.push(v as f32);
            }
        }
        let dscale: Vec<f32> = (0..c).map(|ch| (sum_dy_xc[ch] * coef[ch]) as f32).collect();
        let doffset: Vec<f32> = sum_dy.iter().map(|&s| s as f32).collect();
        ctx.set_output(
            0,
            Tensor::from_vec(x.shape().clone(), bn.in_format(x.dims(), dx))?,
        );
        ctx.set_output(1, vector(dscale)?);
        ctx.set_output(2, vector(doffset)?);
        let reserve = if bn.training { 0 } else { c };
        ctx.set_output(3, vector(vec![0.0; reserve])?);
        ctx.set_output(4, vector(vec![0.0; reserve])?);
        Ok(())
    }
}
