//! The element-wise functions convolutional models bring besides `Relu`: `Relu6`, `Softplus`,
//! `Selu` and their gradient ops, and `Erf` and `Log1p`, each computed as TensorFlow's
//! Eigen functors compute them (`relu_op_functor.h`, `softplus_op.h`, `cwise_ops.h`).
//!
//! A gradient op takes the incoming gradient first and the forward op's input (`Relu6Grad`,
//! `SoftplusGrad`) or output (`SeluGrad`) second; the two must have one shape, as TensorFlow
//! does not broadcast them.

use num_traits::{NumCast, Zero};

use super::nn::same_shape_binary;
use super::numeric::{Float, Real};
use super::{forward, same_dtype};
use crate::error::Result;
use crate::kernels::OpContext;
use crate::tensor::Tensor;

/// SELU's scale and `scale * alpha` (`tf.nn.selu`, Klambauer et al. 2017).
const SELU_SCALE: f64 = 1.050_700_987_355_480_5;
const SELU_SCALE_ALPHA: f64 = 1.758_099_340_847_376_9;

/// Maps each element of input 0 through `f`, over the input when this node is its last reader.
fn map<T: Real + bytemuck::Pod + Send + Sync>(
    ctx: &mut OpContext<'_>,
    f: impl Fn(T) -> T + Sync,
) -> Result<Tensor> {
    forward::map(ctx, 0, f)
}

/// Maps pairs of (gradient, forward value) of two same-shape inputs through `f`, over either
/// input when this node is its last reader.
fn map_grad<T: Real + bytemuck::Pod + Send + Sync>(
    ctx: &mut OpContext<'_>,
    f: impl Fn(T, T) -> T + Sync,
) -> Result<Tensor> {
    same_dtype(ctx, ctx.input(0)?, ctx.input(1)?)?;
    same_shape_binary(ctx, f)
}

/// A constant of a float element type.
fn constant<T: Float>(v: f64) -> T {
    <T as NumCast>::from(v).expect("a float constant")
}

/// 6 in any numeric type.
fn six<T: Real>() -> T {
    <T as NumCast>::from(6).expect("6 fits every numeric type")
}

/// `Relu6(features)`: `min(max(x, 0), 6)`.
pub(super) fn relu6(ctx: &mut OpContext<'_>) -> Result<()> {
    let dtype = ctx.input(0)?.dtype();
    let out = dispatch_real!(ctx, dtype, T => {
        let six = six::<T>();
        map::<T>(ctx, |x| {
            if x > six {
                six
            } else if x > T::zero() {
                x
            } else {
                T::zero()
            }
        })?
    });
    ctx.set_output(0, out);
    Ok(())
}

/// `Relu6Grad(gradients, features)`: the gradient where `0 < feature < 6`, else 0.
pub(super) fn relu6_grad(ctx: &mut OpContext<'_>) -> Result<()> {
    let dtype = ctx.input(0)?.dtype();
    let out = dispatch_real!(ctx, dtype, T => {
        let six = six::<T>();
        map_grad::<T>(ctx, |g, f| if f > T::zero() && f < six { g } else { T::zero() })?
    });
    ctx.set_output(0, out);
    Ok(())
}

/// `log(1 + exp(x))`, as TensorFlow's functor computes it: `x` itself above
/// `-(log(epsilon) + 2)`, `exp(x)` below `log(epsilon) + 2`, `log1p(exp(x))` between.
fn softplus_of<T: Float>(x: T) -> T {
    let threshold = T::epsilon().ln() + constant(2.0);
    if x > -threshold {
        x
    } else if x < threshold {
        x.exp()
    } else {
        x.exp().ln_1p()
    }
}

/// `Softplus(features)`: `log(1 + exp(x))`.
pub(super) fn softplus(ctx: &mut OpContext<'_>) -> Result<()> {
    let dtype = ctx.input(0)?.dtype();
    let out = dispatch_float!(ctx, dtype, T => map::<T>(ctx, softplus_of)?);
    ctx.set_output(0, out);
    Ok(())
}

/// `SoftplusGrad(gradients, features)`: `gradient / (1 + exp(-feature))`.
pub(super) fn softplus_grad(ctx: &mut OpContext<'_>) -> Result<()> {
    let dtype = ctx.input(0)?.dtype();
    let out = dispatch_float!(ctx, dtype, T => {
        map_grad::<T>(ctx, |g, f| g / ((-f).exp() + 1.0))?
    });
    ctx.set_output(0, out);
    Ok(())
}

/// `Selu(features)`: `scale * x` where `x >= 0`, `scale * alpha * (exp(x) - 1)` below.
pub(super) fn selu(ctx: &mut OpContext<'_>) -> Result<()> {
    let dtype = ctx.input(0)?.dtype();
    let out = dispatch_float!(ctx, dtype, T => {
        let (scale, scale_alpha) = (SELU_SCALE as T, SELU_SCALE_ALPHA as T);
        map::<T>(ctx, |x| if x < 0.0 { scale_alpha * x.exp_m1() } else { scale * x })?
    });
    ctx.set_output(0, out);
    Ok(())
}

/// `SeluGrad(gradients, outputs)`: `gradient * (output + scale * alpha)` where the output is
/// negative, `gradient * scale` elsewhere.
pub(super) fn selu_grad(ctx: &mut OpContext<'_>) -> Result<()> {
    let dtype = ctx.input(0)?.dtype();
    let out = dispatch_float!(ctx, dtype, T => {
        let (scale, scale_alpha) = (SELU_SCALE as T, SELU_SCALE_ALPHA as T);
        map_grad::<T>(ctx, |g, y| if y < 0.0 { g * (y + scale_alpha) } else { g * scale })?
    });
    ctx.set_output(0, out);
    Ok(())
}

/// The error function, through `libm` in double precision (rounded once for float32).
fn erf_of<T: Float>(x: T) -> T {
    constant(libm::erf(x.to_f64().unwrap_or(f64::NAN)))
}

/// `Erf(x)`: the Gauss error function.
pub(super) fn erf(ctx: &mut OpContext<'_>) -> Result<()> {
    let dtype = ctx.input(0)?.dtype();
    let out = dispatch_float!(ctx, dtype, T => map::<T>(ctx, erf_of)?);
    ctx.set_output(0, out);
    Ok(())
}

/// `Log1p(x)`: `log(1 + x)`, exact for small `x`.
pub(super) fn log1p(ctx: &mut OpContext<'_>) -> Result<()> {
    let dtype = ctx.input(0)?.dtype();
    let out = dispatch_float!(ctx, dtype, T => map::<T>(ctx, |x| x.ln_1p())?);
    ctx.set_output(0, out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softplus_switches_formulas_where_tensorflow_does() {
        // Above the threshold (about 13.94 for float32) softplus is x itself.
        assert_eq!(softplus_of(20f32), 20.0);
        assert_eq!(softplus_of(-20f32), (-20f32).exp());
        assert!((softplus_of(0f64) - 2f64.ln()).abs() < 1e-15);
    }

    #[test]
    fn erf_is_odd_and_saturates() {
        assert!((erf_of(0.5f64) - 0.520_499_877_813_046_5).abs() < 1e-15);
        assert_eq!(erf_of(-0.5f32), -erf_of(0.5f32));
        assert_eq!(erf_of(10f32), 1.0);
    }
}
