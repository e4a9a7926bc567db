//! Linear algebra and histograms: `Einsum` (in `einsum.rs`), `MatrixInverse` and
//! `HistogramFixedWidth`.
//!
//! `MatrixInverse` inverts each matrix of a batch (`[..., n, n]`) as TensorFlow's
//! `matrix_inverse_op.cc` does through Eigen's `PartialPivLU`: an LU decomposition with
//! partial pivoting (the row of the largest magnitude in each column, the first on ties),
//! refused with "Input is not invertible." when a pivot is zero, then the inverse solved
//! column by column from the factors. With `adjoint` it inverts the matrix's transpose. The
//! matrices are split over the intra-op pool, each costing about `2n³` multiply-adds.
//!
//! `HistogramFixedWidth` counts values into `nbins` equal bins over `value_range`, values
//! below the range in the first and above it in the last, with TensorFlow's arithmetic
//! (`histogram_op.cc`): `min((max(x, lo) - lo) as f64 / ((hi - lo) as f64 / nbins), nbins - 1)`
//! truncated, the differences taken in the input's type.

use std::sync::Arc;

use num_traits::Float;

use super::{input, unsupported_dtype};
use crate::error::Result;
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::tensor::{DType, Element, Shape, Tensor};

/// Returns the factory for a linear-algebra or histogram op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "Einsum" => super::einsum::Einsum::create,
        "MatrixInverse" => |node| {
            Ok(Arc::new(MatrixInverse {
                adjoint: attr::bool_or(node, "adjoint", false)?,
            }))
        },
        "HistogramFixedWidth" => |node| {
            let dtype = match attr::get(node, "dtype") {
                None => DType::Int32,
                Some(_) => attr::dtype(node, "dtype")?,
            };
            Ok(Arc::new(HistogramFixedWidth { dtype }))
        },
        _ => return None,
    };
    Some(factory)
}

/// MatrixInverse(input): the inverse of each innermost matrix (of its transpose with
/// `adjoint`).
struct MatrixInverse {
    adjoint: bool,
}

/// The inverse of the row-major `n`×`n` matrix `a` (its transpose with `adjoint`) into `out`;
/// `false` when a pivot of its LU decomposition is zero.
fn invert<T: Float>(a: &[T], n: usize, adjoint: bool, out: &mut [T]) -> bool {
    let mut lu: Vec<T> = if adjoint {
        (0..n * n).map(|i| a[(i % n) * n + i / n]).collect()
    } else {
        a.to_vec()
    };
    // perm[r]: the row of the input that row r of the factors came from.
    let mut perm: Vec<usize> = (0..n).collect();
    for j in 0..n {
        let mut p = j;
        for i in j + 1..n {
            if lu[i * n + j].abs() > lu[p * n + j].abs() {
                p = i;
            }
        }
        if p != j {
            for c in 0..n {
                lu.swap(j * n + c, p * n + c);
            }
            perm.swap(j, p);
        }
        let pivot = lu[j * n + j];
        if pivot != T::zero() {
            for i in j + 1..n {
                let l = lu[i * n + j] / pivot;
                lu[i * n + j] = l;
                for c in j + 1..n {
                    lu[i * n + c] = lu[i * n + c] - l * lu[j * n + c];
                }
            }
        }
    }
    let min_pivot = (0..n)
        .map(|j| lu[j * n + j].abs())
        .fold(T::infinity(), T::min);
    // A NaN pivot counts as zero, as Eigen's `min_abs_pivot > 0` test does.
    if min_pivot.partial_cmp(&T::zero()) != Some(std::cmp::Ordering::Greater) {
        return false;
    }
    let mut x = vec![T::zero(); n];
    for col in 0..n {
        // Solve L y = P e_col (unit lower triangle), then U x = y.
        for r in 0..n {
            let mut s = if perm[r] == col { T::one() } else { T::zero() };
            for c in 0..r {
                s = s - lu[r * n + c] * x[c];
            }
            x[r] = s;
        }
        for r in (0..n).rev() {
            let mut s = x[r];
            for c in r + 1..n {
                s = s - lu[r * n + c] * x[c];
            }
            x[r] = s / lu[r * n + r];
        }
        for r in 0..n {
            out[r * n + col] = x[r];
        }
    }
    true
}

impl MatrixInverse {
    fn typed<T: Float + Element + Send + Sync>(
        &self,
        ctx: &OpContext<'_>,
        x: &Tensor,
    ) -> Result<Tensor> {
        let rank = x.rank();
        if rank < 2 {
            return Err(ctx.invalid(format!("Input tensor 0 must have rank >= 2, got {rank}")));
        }
        let (rows, cols) = (x.dims()[rank - 2], x.dims()[rank - 1]);
        if rows != cols {
            return Err(ctx.invalid("Input matrix must be square."));
        }
        let n = rows;
        let values = x.values::<T>()?;
        let mut out = vec![T::zero(); values.len()];
        if n > 0 {
            let matrices = values.len() / (n * n);
            let mut invertible = vec![true; matrices];
            let adjoint = self.adjoint;
            // Each matrix owns its slice of the output; pieces of whole matrices run apart.
            let mut work: Vec<(&mut [T], &mut bool, &[T])> = out
                .chunks_exact_mut(n * n)
                .zip(invertible.iter_mut())
                .zip(values.chunks_exact(n * n))
                .map(|((o, ok), a)| (o, ok, a))
                .collect();
            let pieces = ctx.intra().pieces(matrices, 2.0 * (n * n * n) as f64);
            let per_piece = matrices.div_ceil(pieces.max(1));
            let mut groups = Vec::new();
            while !work.is_empty() {
                let rest = work.split_off(per_piece.min(work.len()));
                groups.push(std::mem::replace(&mut work, rest));
            }
            ctx.intra().map(groups, |group| {
                for (o, ok, a) in group {
                    *ok = invert(a, n, adjoint, o);
                }
            });
            if invertible.iter().any(|ok| !ok) {
                return Err(ctx.invalid("Input is not invertible."));
            }
        }
        Tensor::from_vec(x.shape().clone(), out)
    }
}

impl OpKernel for MatrixInverse {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = input(ctx, 0)?;
        let out = dispatch_float!(ctx, x.dtype(), T => self.typed::<T>(ctx, &x)?);
        ctx.set_output(0, out);
        Ok(())
    }
}

/// HistogramFixedWidth(values, value_range, nbins): the count of values in each bin, as
/// `dtype` (int32 or int64).
struct HistogramFixedWidth {
    dtype: DType,
}

/// The arithmetic a histogram needs of its input's type.
trait Binned: Element + Copy + PartialOrd + std::fmt::Display {
    /// `a - b` in the type (wrapping for integers), as f64.
    fn diff(a: Self, b: Self) -> f64;
    fn is_nan(self) -> bool;
}

macro_rules! binned_int {
    ($($t:ty),*) => {$(
        impl Binned for $t {
            fn diff(a: Self, b: Self) -> f64 {
                a.wrapping_sub(b) as f64
            }
            fn is_nan(self) -> bool {
                false
            }
        }
    )*};
}
binned_int!(i32, i64);

macro_rules! binned_float {
    ($($t:ty),*) => {$(
        impl Binned for $t {
            fn diff(a: Self, b: Self) -> f64 {
                (a - b) as f64
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
        }
    )*};
}
binned_float!(f32, f64);

impl HistogramFixedWidth {
    /// The bin counts of `values` over `[lo, hi)`.
    fn counts<T: Binned>(
        ctx: &OpContext<'_>,
        values: &Tensor,
        range: &Tensor,
        nbins: i32,
    ) -> Result<Vec<i64>> {
        let range = range.values::<T>()?;
        let (lo, hi) = (range[0], range[1]);
        if nbins <= 0 {
            return Err(ctx.invalid(format!(
                "nbins should be a positive number, but got '{nbins}'"
            )));
        }
        if lo.partial_cmp(&hi) != Some(std::cmp::Ordering::Less) {
            return Err(ctx.invalid(format!(
                "value_range should satisfy value_range[0] < value_range[1], but got \
                 '[{lo}, {hi}]'"
            )));
        }
        let values = values.values::<T>()?;
        if values.iter().any(|v| v.is_nan()) {
            return Err(ctx.invalid("Histogram values must not contain NaN"));
        }
        let step = T::diff(hi, lo) / f64::from(nbins);
        let last = f64::from(nbins - 1);
        let mut counts = vec![0i64; nbins as usize];
        for &v in values.iter() {
            let clamped = if v < lo { lo } else { v };
            let bin = (T::diff(clamped, lo) / step).min(last) as i32;
            counts[bin as usize] += 1;
        }
        Ok(counts)
    }
}

impl OpKernel for HistogramFixedWidth {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (values, range, nbins) = (input(ctx, 0)?, input(ctx, 1)?, input(ctx, 2)?);
        if range.rank() != 1 {
            return Err(ctx.invalid("value_range should be a vector."));
        }
        if range.num_elements() != 2 {
            return Err(ctx.invalid("value_range should be a vector of 2 elements."));
        }
        if nbins.rank() != 0 {
            return Err(ctx.invalid("nbins should be a scalar."));
        }
        if nbins.dtype() != DType::Int32 {
            return Err(unsupported_dtype(ctx, nbins.dtype(), &[DType::Int32]));
        }
        super::same_dtype(ctx, &values, &range)?;
        let nbins = nbins.scalar_value::<i32>()?;
        let counts = dispatch!(ctx, values.dtype(),
            [Int32 => i32, Int64 => i64, Float => f32, Double => f64],
            T => Self::counts::<T>(ctx, &values, &range, nbins)?);
        let shape = Shape::new(vec![counts.len()]);
        let out = match self.dtype {
            DType::Int64 => Tensor::from_vec(shape, counts)?,
            DType::Int32 => Tensor::from_vec(
                shape,
                counts.into_iter().map(|c| c as i32).collect::<Vec<_>>(),
            )?,
            other => return Err(unsupported_dtype(ctx, other, &[DType::Int32, DType::Int64])),
        };
        ctx.set_output(0, out);
        Ok(())
    }
}
