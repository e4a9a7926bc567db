//! `Cast`: converts between every pair of numeric dtypes and bool, element by element, giving
//! what TensorFlow 2.21's CPU kernel gives on x86-64:
//!
//! - to float32 and float64: rounded to nearest, ties to even (integers too: an int64 past
//!   2^24 rounds to the nearest float32);
//! - to float16 and bfloat16: through float32 (as Eigen converts every type to them), rounded
//!   to nearest even; float16 overflows to infinity from 65520 up; bfloat16 truncates instead
//!   when the node's `Truncate` attr is true;
//! - from a float to an integer: truncated toward zero, and past the target's range as x86's
//!   `cvttss2si` makes it (C++ leaves that undefined): int32 and narrower go through int32,
//!   where NaN, infinities and values out of range become -2^31, then keep their low bits
//!   (300.0 to uint8 is 44, -1.0 is 255); int64 and uint32 go through int64 the same way
//!   (-2^63); uint64 takes [2^63, 2^64) exactly and the rest through int64;
//! - between integers: the low bits (C++'s conversions); to bool: non-zero (NaN included);
//!   from bool: 1 and 0;
//! - complex64: from a real number, that number and 0i; to a real type or bool, the real part
//!   converted as above (TensorFlow's Cast of 1i to bool is false).
//!
//! TensorFlow's vectorized loop saturates out-of-range floats to int8, uint8, int16 and uint16
//! instead (300.0 to uint8 is 255 there), for the elements of a tensor that fill whole vector
//! registers; only values in range convert the same way in every position. Tessera gives the
//! element-by-element answer everywhere, which TensorFlow gives for small tensors.
//!
//! Every source type converts through one of four wide values (`i64`, `u64`, `f64`,
//! [`Complex64`]), so each target type has one conversion from each and the kernel compiles
//! 14 loops per target rather than a conversion per pair of types.

use std::sync::Arc;

use half::{bf16, f16};

use super::{input, split};
use crate::error::Result;
use crate::graph::attr;
use crate::kernels::{OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{Complex64, DType, Element, Tensor};

/// The kernel: the dtype to convert to, the input's dtype when the node names it, and the
/// rounding to bfloat16.
pub(super) struct Cast {
    src: Option<DType>,
    dst: DType,
    truncate: bool,
}

impl Cast {
    pub(super) fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let src = match attr::get(node, "SrcT") {
            Some(_) => Some(attr::dtype(node, "SrcT")?),
            None => None,
        };
        Ok(Arc::new(Cast {
            src,
            dst: attr::dtype(node, "DstT")?,
            truncate: attr::bool_or(node, "Truncate", false)?,
        }))
    }
}

impl OpKernel for Cast {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = input(ctx, 0)?;
        if let Some(src) = self.src {
            if src != x.dtype() {
                return Err(ctx.invalid(format!("input is {} but attr SrcT is {src}", x.dtype())));
            }
        }
        if x.dtype() == self.dst {
            ctx.set_output(0, x);
            return Ok(());
        }
        let out = if self.dst == DType::BFloat16 && self.truncate {
            let floats = convert::<f32>(ctx, &x)?;
            Tensor::from_vec(
                x.shape().clone(),
                split::map(ctx.intra(), &floats, truncate_bf16),
            )?
        } else {
            convert_to(ctx, &x, self.dst)?
        };
        ctx.set_output(0, out);
        Ok(())
    }
}

/// `x` converted to `dst` as Cast converts it (rounding to nearest even into bfloat16).
pub(super) fn convert_to(ctx: &OpContext<'_>, x: &Tensor, dst: DType) -> Result<Tensor> {
    if x.dtype() == dst {
        return Ok(x.clone());
    }
    let shape = x.shape().clone();
    match dst {
        DType::Float => Tensor::from_vec(shape, convert::<f32>(ctx, x)?),
        DType::Double => Tensor::from_vec(shape, convert::<f64>(ctx, x)?),
        DType::Int32 => Tensor::from_vec(shape, convert::<i32>(ctx, x)?),
        DType::Int64 => Tensor::from_vec(shape, convert::<i64>(ctx, x)?),
        DType::Bool => Tensor::from_vec(shape, convert::<bool>(ctx, x)?),
        DType::UInt8 => Tensor::from_vec(shape, convert::<u8>(ctx, x)?),
        DType::Int8 => Tensor::from_vec(shape, convert::<i8>(ctx, x)?),
        DType::Int16 => Tensor::from_vec(shape, convert::<i16>(ctx, x)?),
        DType::UInt16 => Tensor::from_vec(shape, convert::<u16>(ctx, x)?),
        DType::UInt32 => Tensor::from_vec(shape, convert::<u32>(ctx, x)?),
        DType::UInt64 => Tensor::from_vec(shape, convert::<u64>(ctx, x)?),
        DType::Half => Tensor::from_vec(shape, convert::<f16>(ctx, x)?),
        DType::BFloat16 => Tensor::from_vec(shape, convert::<bf16>(ctx, x)?),
        DType::Complex64 => Tensor::from_vec(shape, convert::<Complex64>(ctx, x)?),
        other => Err(unsupported(ctx, x.dtype(), other)),
    }
}

/// The error for a dtype Cast does not take, naming those it does.
fn unsupported(ctx: &OpContext<'_>, src: DType, dst: DType) -> crate::Status {
    let numbers: Vec<&str> = DType::ALL
        .iter()
        .filter(|d| d.size().is_some())
        .map(|d| d.name())
        .collect();
    ctx.invalid(format!(
        "no CPU kernel to cast {src} to {dst}; Cast converts between {}",
        numbers.join(", ")
    ))
}

/// The elements of `x` converted to `D`, over the device's intra-op pool.
fn convert<D: Target>(ctx: &OpContext<'_>, x: &Tensor) -> Result<Vec<D>> {
    let pool = ctx.intra();
    Ok(match x.dtype() {
        DType::Float => split::map(pool, &x.values::<f32>()?, |v| D::from_f64(f64::from(v))),
        DType::Double => split::map(pool, &x.values::<f64>()?, D::from_f64),
        DType::Half => split::map(pool, &x.values::<f16>()?, |v| D::from_f64(v.to_f64())),
        DType::BFloat16 => split::map(pool, &x.values::<bf16>()?, |v| D::from_f64(v.to_f64())),
        DType::Int32 => split::map(pool, &x.values::<i32>()?, |v| D::from_i64(i64::from(v))),
        DType::Int64 => split::map(pool, &x.values::<i64>()?, D::from_i64),
        DType::UInt8 => split::map(pool, &x.values::<u8>()?, |v| D::from_i64(i64::from(v))),
        DType::Int8 => split::map(pool, &x.values::<i8>()?, |v| D::from_i64(i64::from(v))),
        DType::Int16 => split::map(pool, &x.values::<i16>()?, |v| D::from_i64(i64::from(v))),
        DType::UInt16 => split::map(pool, &x.values::<u16>()?, |v| D::from_i64(i64::from(v))),
        DType::UInt32 => split::map(pool, &x.values::<u32>()?, |v| D::from_i64(i64::from(v))),
        DType::UInt64 => split::map(pool, &x.values::<u64>()?, D::from_u64),
        DType::Bool => split::map(pool, &x.values::<bool>()?, |v| D::from_i64(i64::from(v))),
        DType::Complex64 => split::map(pool, &x.values::<Complex64>()?, D::from_complex),
        other => return Err(unsupported(ctx, other, D::DTYPE)),
    })
}

/// `x` to bfloat16 by dropping the low 16 bits (`Truncate=true`); NaN stays a quiet NaN.
fn truncate_bf16(x: f32) -> bf16 {
    if x.is_nan() {
        bf16::from_bits(((x.to_bits() >> 16) as u16) | 0x0040)
    } else {
        bf16::from_bits((x.to_bits() >> 16) as u16)
    }
}

/// x86's `cvttsd2si` to 32 bits: truncation toward zero, and -2^31 (the "integer indefinite")
/// for NaN and everything out of range.
fn cvtt32(x: f64) -> i32 {
    if x > -2_147_483_649.0 && x < 2_147_483_648.0 {
        x as i32
    } else {
        i32::MIN
    }
}

/// x86's `cvttsd2si` to 64 bits: truncation toward zero, -2^63 for NaN and out of range.
fn cvtt64(x: f64) -> i64 {
    // -2^63 itself is in range; below it no f64 truncates into range.
    if (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&x) {
        x as i64
    } else {
        i64::MIN
    }
}

/// A dtype Cast converts to, from each of the four wide values.
trait Target: Element {
    fn from_i64(v: i64) -> Self;
    fn from_u64(v: u64) -> Self;
    fn from_f64(v: f64) -> Self;
    /// From a complex number: by default its real part, as a real number.
    fn from_complex(v: Complex64) -> Self {
        Self::from_f64(f64::from(v.re))
    }
}

/// Integers narrower than 64 bits: from integers their low bits, from floats through int32
/// or (uint32) int64.
macro_rules! int_target {
    ($($t:ty => $via:ident),*) => {$(
        impl Target for $t {
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            fn from_u64(v: u64) -> Self {
                v as $t
            }
            fn from_f64(v: f64) -> Self {
                $via(v) as $t
            }
        }
    )*};
}

int_target!(u8 => cvtt32, i8 => cvtt32, i16 => cvtt32, u16 => cvtt32, i32 => cvtt32, u32 => cvtt64);

impl Target for i64 {
    fn from_i64(v: i64) -> Self {
        v
    }
    fn from_u64(v: u64) -> Self {
        v as i64
    }
    fn from_f64(v: f64) -> Self {
        cvtt64(v)
    }
}

impl Target for u64 {
    fn from_i64(v: i64) -> Self {
        v as u64
    }
    fn from_u64(v: u64) -> Self {
        v
    }
    fn from_f64(v: f64) -> Self {
        // Compilers convert [2^63, 2^64) by subtracting 2^63 first; the rest goes through
        // int64 (so -1.0 wraps to 2^64 - 1 and NaN gives 2^63).
        if (9_223_372_036_854_775_808.0..18_446_744_073_709_551_616.0).contains(&v) {
            v as u64
        } else {
            cvtt64(v) as u64
        }
    }
}

impl Target for f32 {
    fn from_i64(v: i64) -> Self {
        v as f32
    }
    fn from_u64(v: u64) -> Self {
        v as f32
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl Target for f64 {
    fn from_i64(v: i64) -> Self {
        v as f64
    }
    fn from_u64(v: u64) -> Self {
        v as f64
    }
    fn from_f64(v: f64) -> Self {
        v
    }
}

/// The 16-bit floats: through float32, as Eigen's constructors from any other type go.
macro_rules! half_target {
    ($($t:ty),*) => {$(
        impl Target for $t {
            fn from_i64(v: i64) -> Self {
                <$t>::from_f32(v as f32)
            }
            fn from_u64(v: u64) -> Self {
                <$t>::from_f32(v as f32)
            }
            fn from_f64(v: f64) -> Self {
                <$t>::from_f32(v as f32)
            }
        }
    )*};
}

half_target!(f16, bf16);

impl Target for bool {
    fn from_i64(v: i64) -> Self {
        v != 0
    }
    fn from_u64(v: u64) -> Self {
        v != 0
    }
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
}

impl Target for Complex64 {
    fn from_i64(v: i64) -> Self {
        Complex64::new(v as f32, 0.0)
    }
    fn from_u64(v: u64) -> Self {
        Complex64::new(v as f32, 0.0)
    }
    fn from_f64(v: f64) -> Self {
        Complex64::new(v as f32, 0.0)
    }
    fn from_complex(v: Complex64) -> Self {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_out_of_range_convert_as_x86_does() {
        assert_eq!(u8::from_f64(300.0), 44);
        assert_eq!(u8::from_f64(-1.0), 255);
        assert_eq!(u8::from_f64(f64::NAN), 0);
        assert_eq!(i8::from_f64(-129.0), 127);
        assert_eq!(i32::from_f64(f64::INFINITY), i32::MIN);
        assert_eq!(i32::from_f64(-2_147_483_648.9), i32::MIN);
        assert_eq!(u32::from_f64(5e9), 705_032_704);
        assert_eq!(u32::from_f64(-3e9), 1_294_967_296);
        assert_eq!(u64::from_f64(1e19), 10_000_000_000_000_000_000);
        assert_eq!(u64::from_f64(f64::NAN), 1 << 63);
        assert_eq!(u64::from_f64(-1.0), u64::MAX);
    }

    #[test]
    fn sixteen_bit_floats_round_to_nearest_even() {
        assert_eq!(f16::from_f64(65519.0).to_f32(), 65504.0);
        assert!(f16::from_f64(65520.0).is_infinite());
        // 1 + 2^-8 is halfway between two bfloat16s: ties go to the even one, 1.
        assert_eq!(bf16::from_f64(1.0 + 1.0 / 256.0).to_f32(), 1.0);
        assert_eq!(bf16::from_f64(1.0 + 3.0 / 256.0).to_f32(), 1.015625);
        assert_eq!(truncate_bf16(1.0 + 3.0 / 256.0).to_f32(), 1.0078125);
        assert!(truncate_bf16(f32::NAN).is_nan());
    }
}
