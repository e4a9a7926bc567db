//! Local response normalization: `LRN` and its gradient `LRNGrad`, float32 and float64, on
//! 4-D `NHWC` values, as TensorFlow's CPU kernels compute them (`lrn_op.cc`).
//!
//! Each value is divided by `(bias + alpha * sum of squares)^beta`, the sum over the channels
//! within `depth_radius` of its own at the same pixel. `alpha` is not divided by the window's
//! size (TensorFlow's convention, unlike Caffe's). The gradient needs the forward op's input
//! and output and follows TensorFlow's loop term for term.

use std::sync::Arc;

use super::numeric::Float;
use super::{input, same_dtype};
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::graph::window::node_error;
use crate::kernels::{OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::Tensor;

/// `LRN` or `LRNGrad` with its attrs.
pub(super) struct Lrn {
    depth_radius: usize,
    bias: f64,
    alpha: f64,
    beta: f64,
    grad: bool,
}

impl Lrn {
    fn parse(node: &NodeDef, grad: bool) -> Result<Arc<dyn OpKernel>> {
        let radius = attr::int_or(node, "depth_radius", 5)?;
        let depth_radius = usize::try_from(radius)
            .ok()
            .filter(|&r| r <= i32::MAX as usize)
            .ok_or_else(|| {
                node_error(
                    node,
                    Status::invalid_argument(format!(
                        "depth_radius = {radius} larger than int max"
                    )),
                )
            })?;
        Ok(Arc::new(Lrn {
            depth_radius,
            bias: f64::from(attr::float_or(node, "bias", 1.0)?),
            alpha: f64::from(attr::float_or(node, "alpha", 1.0)?),
            beta: f64::from(attr::float_or(node, "beta", 0.5)?),
            grad,
        }))
    }

    pub(super) fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Self::parse(node, false)
    }

    pub(super) fn create_grad(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Self::parse(node, true)
    }

    /// The channels `[begin, end)` in the window of channel `j` of `depth`.
    fn window(&self, j: usize, depth: usize) -> (usize, usize) {
        (
            j.saturating_sub(self.depth_radius),
            (j + self.depth_radius + 1).min(depth),
        )
    }

    /// `bias + alpha * sum of squares` over the window of channel `j` of one pixel.
    fn norm<T: Float>(&self, pixel: &[T], j: usize) -> T {
        let (begin, end) = self.window(j, pixel.len());
        let sum = pixel[begin..end].iter().fold(T::zero(), |s, &v| s + v * v);
        cast::<T>(self.alpha) * sum + cast(self.bias)
    }

    fn forward<T: Float>(&self, x: &Tensor) -> Result<Tensor> {
        let depth = x.dims()[3];
        let v = x.values::<T>()?;
        let beta: T = cast(self.beta);
        let mut out = Vec::with_capacity(v.len());
        for pixel in v.chunks_exact(depth.max(1)) {
            for (j, &e) in pixel.iter().enumerate() {
                out.push(e * self.norm(pixel, j).powf(-beta));
            }
        }
        Tensor::from_vec(x.shape().clone(), out)
    }

    fn backward<T: Float>(&self, grads: &Tensor, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        let depth = x.dims()[3];
        let (gv, xv, yv) = (grads.values::<T>()?, x.values::<T>()?, y.values::<T>()?);
        let (alpha, beta): (T, T) = (cast(self.alpha), cast(self.beta));
        let two: T = cast(2.0);
        let mut out = vec![T::zero(); xv.len()];
        let step = depth.max(1);
        for (p, pixel) in xv.chunks_exact(step).enumerate() {
            let base = p * depth;
            for j in 0..depth {
                let norm = self.norm(pixel, j);
                let pow = norm.powf(-beta);
                let (g, act) = (gv[base + j], yv[base + j]);
                let (begin, end) = self.window(j, depth);
                for k in begin..end {
                    let mut d = -two * alpha * beta * pixel[k] * act / norm;
                    if k == j {
                        d = d + pow;
                    }
                    out[base + k] = out[base + k] + d * g;
                }
            }
        }
        Tensor::from_vec(x.shape().clone(), out)
    }
}

/// A float attr in the element type.
fn cast<T: Float>(v: f64) -> T {
    <T as num_traits::NumCast>::from(v).expect("a float attr")
}

impl OpKernel for Lrn {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let out = if self.grad {
            let (g, x, y) = (input(ctx, 0)?, input(ctx, 1)?, input(ctx, 2)?);
            if [&g, &x, &y].iter().any(|t| t.rank() != 4) {
                return Err(ctx.invalid(format!(
                    "inputs must be 4-dimensional (input_grads {}, input_image {}, \
                     output_image {})",
                    g.shape(),
                    x.shape(),
                    y.shape()
                )));
            }
            if g.shape() != x.shape() || x.shape() != y.shape() {
                return Err(ctx.invalid(format!(
                    "input_grads, input_image, and out_image should have the same shape \
                     ({}, {}, {})",
                    g.shape(),
                    x.shape(),
                    y.shape()
                )));
            }
            same_dtype(ctx, &g, &x)?;
            same_dtype(ctx, &x, &y)?;
            dispatch_float!(ctx, x.dtype(), T => self.backward::<T>(&g, &x, &y)?)
        } else {
            let x = input(ctx, 0)?;
            if x.rank() != 4 {
                return Err(ctx.invalid(format!("in must be 4-dimensional, got {}", x.shape())));
            }
            dispatch_float!(ctx, x.dtype(), T => self.forward::<T>(&x)?)
        };
        ctx.set_output(0, out);
        Ok(())
    }
}
