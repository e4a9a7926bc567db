//! Element-wise arithmetic: binary ops with broadcasting (Add, Sub, Mul, RealDiv, DivNoNan,
//! Pow, Maximum, Minimum, FloorDiv, FloorMod), unary ops (Neg, Square, Sqrt, Rsqrt, Exp, Log,
//! Abs, Sign, Reciprocal), AddN, and CheckNumerics (the identity that fails on a NaN or an
//! infinity). Matrix products live in `matmul`, Cast in `cast`.
//!
//! Integer division (RealDiv, FloorDiv, FloorMod on int32/int64) checks the divisor for zeros
//! first and fails with INVALID_ARGUMENT instead of trapping, as TensorFlow does.

use std::sync::Arc;

use super::numeric::{int_pow, Real};
use super::{broadcast, forward, split};
use super::{input, same_dtype, stateless};
use crate::error::Result;
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, Tensor};

/// Returns the factory for an element-wise math op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "Add" | "AddV2" => |_| stateless(add),
        "Sub" => |_| stateless(sub),
        "Mul" => |_| stateless(mul),
        "RealDiv" => |_| stateless(real_div),
        "DivNoNan" => |_| stateless(div_no_nan),
        "CheckNumerics" | "CheckNumericsV2" => CheckNumerics::create,
        "FloorDiv" => |_| stateless(floor_div),
        "FloorMod" => |_| stateless(floor_mod),
        "Pow" => |_| stateless(pow),
        "Maximum" => |_| stateless(maximum),
        "Minimum" => |_| stateless(minimum),
        "SquaredDifference" => |_| stateless(squared_difference),
        "AddN" => |_| stateless(add_n),
        "Neg" => |_| stateless(neg),
        "Square" => |_| stateless(square),
        "Abs" => |_| stateless(abs),
        "Sign" => |_| stateless(sign),
        "Sqrt" => |_| stateless(sqrt),
        "Rsqrt" => |_| stateless(rsqrt),
        "Exp" => |_| stateless(exp),
        "Log" => |_| stateless(log),
        "Sin" => |_| stateless(sin),
        "Cos" => |_| stateless(cos),
        "Reciprocal" | "Inv" => |_| stateless(reciprocal),
        "Floor" => |_| stateless(floor),
        "Ceil" => |_| stateless(ceil),
        "Round" => |_| stateless(round),
        "Cast" => super::cast::Cast::create,
        "MatMul" => super::matmul::MatMul::create,
        "BatchMatMulV2" | "BatchMatMul" | "BatchMatMulV3" => super::matmul::BatchMatMul::create,
        _ => return None,
    };
    Some(factory)
}

/// Defines a broadcasting binary kernel over the dtypes of `$dispatch`.
macro_rules! binary_kernel {
    ($name:ident, $dispatch:ident, |$a:ident, $b:ident| $body:expr) => {
        fn $name(ctx: &mut OpContext<'_>) -> Result<()> {
            let (x, y) = (ctx.input(0)?, ctx.input(1)?);
            same_dtype(ctx, x, y)?;
            let out = $dispatch!(ctx, x.dtype(), T => {
                forward::binary::<T>(ctx, |$a, $b| $body)?
            });
            ctx.set_output(0, out);
            Ok(())
        }
    };
}

/// Defines an element-wise unary kernel over the dtypes of `$dispatch`.
macro_rules! unary_kernel {
    ($name:ident, $dispatch:ident, |$x:ident| $body:expr) => {
        pub(super) fn $name(ctx: &mut OpContext<'_>) -> Result<()> {
            let out = $dispatch!(ctx, ctx.input(0)?.dtype(), T => {
                forward::map::<T>(ctx, 0, |$x: T| $body)?
            });
            ctx.set_output(0, out);
            Ok(())
        }
    };
}

binary_kernel!(add, dispatch_real, |a, b| Real::add(a, b));
binary_kernel!(sub, dispatch_real, |a, b| Real::sub(a, b));
binary_kernel!(mul, dispatch_real, |a, b| Real::mul(a, b));
// 0 where the divisor is 0, whatever the dividend (NaN and infinities included), as
// TensorFlow's `div_no_nan` functor does; a NaN divisor still gives NaN.
binary_kernel!(div_no_nan, dispatch_float, |a, b| if b == 0.0 {
    0.0
} else {
    a / b
});
binary_kernel!(maximum, dispatch_real, |a, b| Real::max(a, b));
binary_kernel!(minimum, dispatch_real, |a, b| Real::min(a, b));
binary_kernel!(squared_difference, dispatch_real, |a, b| {
    let d = Real::sub(a, b);
    Real::mul(d, d)
});

unary_kernel!(neg, dispatch_real, |x| Real::neg(x));
unary_kernel!(square, dispatch_real, |x| Real::mul(x, x));
unary_kernel!(abs, dispatch_real, |x| Real::abs(x));
unary_kernel!(sign, dispatch_real, |x| Real::sign(x));
unary_kernel!(sqrt, dispatch_float, |x| x.sqrt());
unary_kernel!(rsqrt, dispatch_float, |x| 1.0 / x.sqrt());
unary_kernel!(exp, dispatch_float, |x| x.exp());
unary_kernel!(log, dispatch_float, |x| x.ln());
unary_kernel!(sin, dispatch_float, |x| x.sin());
unary_kernel!(cos, dispatch_float, |x| x.cos());
unary_kernel!(reciprocal, dispatch_float, |x| 1.0 / x);
unary_kernel!(floor, dispatch_float, |x| x.floor());
unary_kernel!(ceil, dispatch_float, |x| x.ceil());
// TensorFlow's Round rounds half to even (banker's rounding), as numpy does.
unary_kernel!(round, dispatch_float, |x| x.round_ties_even());

/// Fails when an integer divisor holds a zero (float division by zero gives inf or NaN).
fn check_divisor<T: Real>(ctx: &OpContext<'_>, divisor: &Tensor) -> Result<()> {
    if T::IS_INT && divisor.values::<T>()?.iter().any(|&v| Real::is_zero(v)) {
        return Err(ctx.invalid("Integer division by zero"));
    }
    Ok(())
}

/// A binary kernel whose integer variants must not divide by zero.
fn dividing(
    ctx: &mut OpContext<'_>,
    f: fn(DType, &OpContext<'_>, &Tensor, &Tensor) -> Result<Tensor>,
) -> Result<()> {
    let (x, y) = (input(ctx, 0)?, input(ctx, 1)?);
    same_dtype(ctx, &x, &y)?;
    let out = f(x.dtype(), ctx, &x, &y)?;
    ctx.set_output(0, out);
    Ok(())
}

fn real_div(ctx: &mut OpContext<'_>) -> Result<()> {
    dividing(ctx, |dtype, ctx, x, y| {
        dispatch_real!(ctx, dtype, T => {
            check_divisor::<T>(ctx, y)?;
            broadcast::binary::<T, T>(ctx, x, y, Real::div)
        })
    })
}

fn floor_div(ctx: &mut OpContext<'_>) -> Result<()> {
    dividing(ctx, |dtype, ctx, x, y| {
        dispatch_real!(ctx, dtype, T => {
            check_divisor::<T>(ctx, y)?;
            broadcast::binary::<T, T>(ctx, x, y, Real::floor_div)
        })
    })
}

fn floor_mod(ctx: &mut OpContext<'_>) -> Result<()> {
    dividing(ctx, |dtype, ctx, x, y| {
        dispatch_real!(ctx, dtype, T => {
            check_divisor::<T>(ctx, y)?;
            broadcast::binary::<T, T>(ctx, x, y, Real::floor_mod)
        })
    })
}

fn pow(ctx: &mut OpContext<'_>) -> Result<()> {
    let (x, y) = (input(ctx, 0)?, input(ctx, 1)?);
    same_dtype(ctx, &x, &y)?;
    let out = match x.dtype() {
        DType::Float => broadcast::binary::<f32, f32>(ctx, &x, &y, f32::powf)?,
        DType::Double => broadcast::binary::<f64, f64>(ctx, &x, &y, f64::powf)?,
        DType::Int32 => int_power::<i32>(ctx, &x, &y)?,
        DType::Int64 => int_power::<i64>(ctx, &x, &y)?,
        other => {
            return Err(super::unsupported_dtype(
                ctx,
                other,
                &[DType::Float, DType::Double, DType::Int32, DType::Int64],
            ))
        }
    };
    ctx.set_output(0, out);
    Ok(())
}

fn int_power<T: Real + num_traits::PrimInt>(
    ctx: &OpContext<'_>,
    x: &Tensor,
    y: &Tensor,
) -> Result<Tensor> {
    if y.values::<T>()?.iter().any(|&e| e < T::zero()) {
        return Err(ctx.invalid("Integers to negative integer powers are not allowed"));
    }
    broadcast::binary::<T, T>(ctx, x, y, |a, b| int_pow(a, b).unwrap_or_else(T::zero))
}

/// AddN: the element-wise sum of N tensors of one shape (no broadcasting, as in TensorFlow).
fn add_n(ctx: &mut OpContext<'_>) -> Result<()> {
    let first = input(ctx, 0)?;
    for (i, t) in ctx.inputs().iter().enumerate().skip(1) {
        if t.dtype() != first.dtype() || t.shape() != first.shape() {
            return Err(ctx.invalid(format!(
                "Inputs to operation AddN must have the same dtype, size and shape. Input 0: {} {} != input {i}: {} {}",
                first.dtype(),
                first.shape(),
                t.dtype(),
                t.shape()
            )));
        }
    }
    if first.dtype() == DType::Variant {
        // The sum of TensorList gradients, list element by list element.
        let mut sum = first;
        for t in &ctx.inputs()[1..] {
            sum = super::list::add(&sum, t).map_err(|e| ctx.invalid(e.message()))?;
        }
        ctx.set_output(0, sum);
        return Ok(());
    }
    let out = dispatch_real!(ctx, first.dtype(), T => {
        let mut sum = first.values::<T>()?.into_owned();
        for t in &ctx.inputs()[1..] {
            for (s, &v) in sum.iter_mut().zip(t.values::<T>()?.iter()) {
                *s = Real::add(*s, v);
            }
        }
        Tensor::from_vec(first.shape().clone(), sum)?
    });
    ctx.set_output(0, out);
    Ok(())
}

/// `CheckNumerics` and `CheckNumericsV2`: the input unchanged, or INVALID_ARGUMENT with the
/// node's `message` and what it found, in TensorFlow's words (`check_numerics_op.cc`): "Inf and
/// NaN" for the first, "-Inf, +Inf, and NaN" and their subsets for the second, which tells the
/// infinities' signs apart.
struct CheckNumerics {
    message: String,
    signed: bool,
}

impl CheckNumerics {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(CheckNumerics {
            message: attr::string_or(node, "message", "")?,
            signed: node.op == "CheckNumericsV2",
        }))
    }
}

const NAN: u8 = 1;
const NEG_INF: u8 = 2;
const POS_INF: u8 = 4;

/// What of NaN, -Inf and +Inf `values` hold, as [`NAN`] | [`NEG_INF`] | [`POS_INF`] bits.
fn non_finite<T: super::Float>(values: &[T]) -> u8 {
    // Finite values, the common case, cost one comparison each: a vectorized `is_finite`.
    if values.iter().all(|v| v.is_finite()) {
        return 0;
    }
    values.iter().fold(0, |bits, v| {
        bits | if v.is_nan() {
            NAN
        } else if v.is_infinite() {
            if v.is_sign_negative() {
                NEG_INF
            } else {
                POS_INF
            }
        } else {
            0
        }
    })
}

impl CheckNumerics {
    fn words(&self, bits: u8) -> &'static str {
        let (nan, inf) = (bits & NAN != 0, bits & (NEG_INF | POS_INF) != 0);
        if !self.signed {
            return match (inf, nan) {
                (true, true) => "Inf and NaN",
                (true, false) => "Inf",
                _ => "NaN",
            };
        }
        match (bits & NEG_INF != 0, bits & POS_INF != 0, nan) {
            (true, true, true) => "-Inf, +Inf, and NaN",
            (true, true, false) => "-Inf and +Inf",
            (true, false, true) => "-Inf and NaN",
            (false, true, true) => "+Inf and NaN",
            (true, false, false) => "-Inf",
            (false, true, false) => "+Inf",
            _ => "NaN",
        }
    }
}

impl OpKernel for CheckNumerics {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = input(ctx, 0)?;
        let bits = std::sync::atomic::AtomicU8::new(0);
        dispatch_float!(ctx, x.dtype(), T => {
            let values = x.values::<T>()?;
            ctx.intra().parallel_for(values.len(), split::ELEMENT_CYCLES, |range| {
                let found = non_finite(&values[range]);
                bits.fetch_or(found, std::sync::atomic::Ordering::Relaxed);
            });
        });
        let bits = bits.into_inner();
        if bits != 0 {
            return Err(ctx.invalid(format!(
                "{} : Tensor had {} values",
                self.message,
                self.words(bits)
            )));
        }
        ctx.set_output(0, x);
        Ok(())
    }
}
