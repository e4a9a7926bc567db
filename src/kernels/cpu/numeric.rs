//! The element arithmetic kernels share: [`Real`] for every numeric dtype (float32, float64,
//! int32, int64) and [`Float`] for the floating-point ones.
//!
//! Integer arithmetic wraps on overflow like TensorFlow's (C++) kernels do, instead of panicking;
//! division by zero is checked by the kernels before they divide.

use ndarray::LinalgScalar;
use num_traits::{Bounded, NumCast};

use crate::tensor::Element;

/// A numeric element type: float32, float64, int32 or int64.
pub trait Real: Element + LinalgScalar + PartialOrd + Bounded + NumCast + Default {
    /// Whether the type is an integer type (its division by zero is an error).
    const IS_INT: bool;
    /// The identity of Max: -inf for floats, the minimum for integers.
    const LOWEST: Self;
    /// The identity of Min: +inf for floats, the maximum for integers.
    const HIGHEST: Self;

    /// `a + b`, wrapping for integers.
    fn add(a: Self, b: Self) -> Self;
    /// `a - b`, wrapping for integers.
    fn sub(a: Self, b: Self) -> Self;
    /// `a * b`, wrapping for integers.
    fn mul(a: Self, b: Self) -> Self;
    /// `a / b`, truncating for integers (`b` is not zero).
    fn div(a: Self, b: Self) -> Self;
    /// Division rounding toward negative infinity (`b` is not zero for integers).
    fn floor_div(a: Self, b: Self) -> Self;
    /// The remainder with the sign of the divisor, as Python's `%` (`b` is not zero for integers).
    fn floor_mod(a: Self, b: Self) -> Self;
    /// `-a`, wrapping for integers.
    fn neg(a: Self) -> Self;
    /// `|a|`, wrapping for integers.
    fn abs(a: Self) -> Self;
    /// -1, 0 or 1 (0 for a zero; NaN for a NaN).
    fn sign(a: Self) -> Self;
    /// The larger of `a` and `b`; NaN when either is NaN.
    fn max(a: Self, b: Self) -> Self;
    /// The smaller of `a` and `b`; NaN when either is NaN.
    fn min(a: Self, b: Self) -> Self;
    /// Whether the value is zero.
    fn is_zero(a: Self) -> bool;
    /// The value divided by an element count (Mean).
    fn div_count(a: Self, n: usize) -> Self;
    /// The value as an `f64` (for messages and for sums of floats).
    fn to_f64(a: Self) -> f64;
}

/// A floating-point element type: float32 or float64.
pub trait Float: Real + num_traits::Float {
    /// `tanh(x)`: for float32 the vectorizable approximation of [`super::approx`], for
    /// float64 the C library's.
    fn tanh_fast(self) -> Self;
    /// The logistic sigmoid `1 / (1 + e^-x)`, chosen as [`Self::tanh_fast`] is.
    fn sigmoid_fast(self) -> Self;
}

impl Float for f32 {
    #[inline(always)]
    fn tanh_fast(self) -> Self {
        super::approx::tanh_f32(self)
    }
    #[inline(always)]
    fn sigmoid_fast(self) -> Self {
        super::approx::sigmoid_f32(self)
    }
}

impl Float for f64 {
    fn tanh_fast(self) -> Self {
        self.tanh()
    }
    fn sigmoid_fast(self) -> Self {
        1.0 / (1.0 + (-self).exp())
    }
}

macro_rules! real_int {
    ($t:ty) => {
        impl Real for $t {
            const IS_INT: bool = true;
            const LOWEST: Self = <$t>::MIN;
            const HIGHEST: Self = <$t>::MAX;

            fn add(a: Self, b: Self) -> Self {
                a.wrapping_add(b)
            }
            fn sub(a: Self, b: Self) -> Self {
                a.wrapping_sub(b)
            }
            fn mul(a: Self, b: Self) -> Self {
                a.wrapping_mul(b)
            }
            fn div(a: Self, b: Self) -> Self {
                a.wrapping_div(b)
            }
            fn floor_div(a: Self, b: Self) -> Self {
                let q = a.wrapping_div(b);
                if (a.wrapping_rem(b) != 0) && ((a < 0) != (b < 0)) {
                    q - 1
                } else {
                    q
                }
            }
            fn floor_mod(a: Self, b: Self) -> Self {
                let r = a.wrapping_rem(b);
                if r != 0 && ((r < 0) != (b < 0)) {
                    r + b
                } else {
                    r
                }
            }
            fn neg(a: Self) -> Self {
                a.wrapping_neg()
            }
            fn abs(a: Self) -> Self {
                a.wrapping_abs()
            }
            fn sign(a: Self) -> Self {
                a.signum()
            }
            fn max(a: Self, b: Self) -> Self {
                Ord::max(a, b)
            }
            fn min(a: Self, b: Self) -> Self {
                Ord::min(a, b)
            }
            fn is_zero(a: Self) -> bool {
                a == 0
            }
            fn div_count(a: Self, n: usize) -> Self {
                if n == 0 {
                    0
                } else {
                    a.wrapping_div(n as Self)
                }
            }
            fn to_f64(a: Self) -> f64 {
                a as f64
            }
        }
    };
}

macro_rules! real_float {
    ($t:ty) => {
        impl Real for $t {
            const IS_INT: bool = false;
            const LOWEST: Self = <$t>::NEG_INFINITY;
            const HIGHEST: Self = <$t>::INFINITY;

            fn add(a: Self, b: Self) -> Self {
                a + b
            }
            fn sub(a: Self, b: Self) -> Self {
                a - b
            }
            fn mul(a: Self, b: Self) -> Self {
                a * b
            }
            fn div(a: Self, b: Self) -> Self {
                a / b
            }
            fn floor_div(a: Self, b: Self) -> Self {
                (a / b).floor()
            }
            fn floor_mod(a: Self, b: Self) -> Self {
                // Python semantics: the result takes the divisor's sign.
                let r = a % b;
                if r != 0.0 && ((r < 0.0) != (b < 0.0)) {
                    r + b
                } else {
                    r
                }
            }
            fn neg(a: Self) -> Self {
                -a
            }
            fn abs(a: Self) -> Self {
                a.abs()
            }
            fn sign(a: Self) -> Self {
                if a > 0.0 {
                    1.0
                } else if a < 0.0 {
                    -1.0
                } else {
                    a
                }
            }
            fn max(a: Self, b: Self) -> Self {
                if a.is_nan() || b.is_nan() {
                    Self::NAN
                } else {
                    a.max(b)
                }
            }
            fn min(a: Self, b: Self) -> Self {
                if a.is_nan() || b.is_nan() {
                    Self::NAN
                } else {
                    a.min(b)
                }
            }
            fn is_zero(a: Self) -> bool {
                a == 0.0
            }
            fn div_count(a: Self, n: usize) -> Self {
                a / n as Self
            }
            fn to_f64(a: Self) -> f64 {
                a as f64
            }
        }
    };
}

real_int!(i32);
real_int!(i64);
real_float!(f32);
real_float!(f64);

/// `base ^ exp` for integers; `None` for a negative exponent (TensorFlow rejects those).
pub fn int_pow<T: Real + num_traits::PrimInt>(base: T, exp: T) -> Option<T> {
    if exp < T::zero() {
        return None;
    }
    let mut result = T::one();
    let mut b = base;
    let mut e = exp;
    while e > T::zero() {
        if e & T::one() == T::one() {
            result = Real::mul(result, b);
        }
        b = Real::mul(b, b);
        e = e >> 1;
    }
    Some(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_division_follows_python() {
        assert_eq!(<i32 as Real>::floor_div(7, -2), -4);
        assert_eq!(<i32 as Real>::floor_div(-7, 2), -4);
        assert_eq!(<i32 as Real>::floor_div(6, -2), -3);
        assert_eq!(<i64 as Real>::floor_mod(-7, 3), 2);
        assert_eq!(<i64 as Real>::floor_mod(7, -3), -2);
        assert_eq!(<f32 as Real>::floor_mod(-7.0, 3.0), 2.0);
        assert_eq!(<f64 as Real>::floor_div(-7.0, 2.0), -4.0);
        assert_eq!(<i32 as Real>::floor_div(i32::MIN, -1), i32::MIN);
    }

    #[test]
    fn integer_powers() {
        assert_eq!(int_pow(3i32, 4), Some(81));
        assert_eq!(int_pow(-2i64, 3), Some(-8));
        assert_eq!(int_pow(5i32, 0), Some(1));
        assert_eq!(int_pow(2i32, -1), None);
    }
}
