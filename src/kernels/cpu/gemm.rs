//! The matrix product of the convolutions: `c = a·b` or `c += a·b` on 2-D views of any
//! strides, float32 and float64 through the `gemm` crate (its kernels use the widest vector
//! unit the CPU has, AVX-512 included, where `matrixmultiply` stops at AVX2), other element
//! types through ndarray's `general_mat_mul`; and the split of a convolution's images over
//! the host's cores.

use std::any::TypeId;

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

use super::numeric::Real;
use crate::graph::partitioned::part_lengths;

/// Multiply-adds below which a convolution runs on the calling thread alone: spawning
/// threads costs tens of microseconds, the work of a few million multiply-adds.
const PARALLEL_MULTIPLY_ADDS: usize = 1 << 22;

/// `c = a·b`, or `c += a·b` with `accumulate`. The shapes must agree (`[m, k]·[k, n]` into
/// `[m, n]`): callers build the views from one geometry.
pub(super) fn matmul<T: Real>(
    a: &ArrayView2<'_, T>,
    b: &ArrayView2<'_, T>,
    c: &mut ArrayViewMut2<'_, T>,
    accumulate: bool,
) {
    let (m, k) = a.dim();
    let n = b.dim().1;
    debug_assert_eq!((b.dim().0, c.dim()), (k, (m, n)), "matmul shapes");
    if m == 0 || n == 0 {
        return;
    }
    let id = TypeId::of::<T>();
    if id == TypeId::of::<f32>() || id == TypeId::of::<f64>() {
        let (a_rs, a_cs) = (a.strides()[0], a.strides()[1]);
        let (b_rs, b_cs) = (b.strides()[0], b.strides()[1]);
        let (c_rs, c_cs) = (c.strides()[0], c.strides()[1]);
        // SAFETY: the pointers and strides are those of live views whose shapes agree (m×k,
        // k×n, m×n), `c` is borrowed mutably and does not alias `a` or `b` (distinct
        // borrows), and T is f32 or f64, which `gemm` implements. `gemm`'s `alpha` scales the
        // old `c` (read only with `read_dst`), its `beta` the product.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                c.as_mut_ptr(),
                c_cs,
                c_rs,
                accumulate,
                a.as_ptr(),
                a_cs,
                a_rs,
                b.as_ptr(),
                b_cs,
                b_rs,
                T::one(),
                T::one(),
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
        return;
    }
    let beta = if accumulate { T::one() } else { T::zero() };
    general_mat_mul(T::one(), a, b, beta, c);
}

/// How many pieces to split `images` images of `multiply_adds` in all over: one per core (at
/// most one per image), or 1 for work too small to gain from threads.
pub(super) fn pieces(images: usize, multiply_adds: usize) -> usize {
    if multiply_adds < PARALLEL_MULTIPLY_ADDS {
        return 1;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.min(images).max(1)
}

/// Images `0..images` cut into `pieces` consecutive ranges as equal as can be (the first ones
/// one longer, as a partitioned variable's parts are).
pub(super) fn ranges(images: usize, pieces: usize) -> Vec<(usize, usize)> {
    let mut at = 0;
    part_lengths(images, pieces.clamp(1, images.max(1)))
        .into_iter()
        .map(|len| {
            at += len;
            (at - len, at)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array2, ShapeBuilder};

    fn filled(m: usize, n: usize, seed: usize) -> Array2<f64> {
        Array2::from_shape_fn((m, n), |(i, j)| {
            ((i * 31 + j * 17 + seed) % 23) as f64 - 11.0
        })
    }

    #[test]
    fn products_of_any_strides_match_ndarray_and_accumulate() {
        let a = filled(37, 19, 1);
        let b = filled(19, 23, 2);
        let want = a.dot(&b);
        // Row-major, a transposed view, a column-major output.
        let mut c = Array2::<f64>::zeros((37, 23));
        matmul(&a.view(), &b.view(), &mut c.view_mut(), false);
        assert_eq!(c, want);
        let at = a.t().to_owned();
        let mut f = Array2::<f64>::zeros((37, 23).f());
        matmul(&at.t(), &b.view(), &mut f.view_mut(), false);
        assert_eq!(f, want);
        matmul(&at.t(), &b.view(), &mut f.view_mut(), true);
        assert_eq!(f, &want * 2.0);
        // float32 and an integer type (ndarray's path).
        let (a32, b32) = (a.mapv(|v| v as f32), b.mapv(|v| v as f32));
        let mut c32 = Array2::<f32>::zeros((37, 23));
        matmul(&a32.view(), &b32.view(), &mut c32.view_mut(), false);
        assert_eq!(c32, want.mapv(|v| v as f32));
        let (ai, bi) = (a.mapv(|v| v as i32), b.mapv(|v| v as i32));
        let mut ci = Array2::<i32>::zeros((37, 23));
        matmul(&ai.view(), &bi.view(), &mut ci.view_mut(), false);
        assert_eq!(ci, want.mapv(|v| v as i32));
    }

    #[test]
    fn images_split_into_near_equal_ranges() {
        assert_eq!(ranges(32, 3), vec![(0, 11), (11, 22), (22, 32)]);
        assert_eq!(ranges(2, 4), vec![(0, 1), (1, 2)]);
        assert_eq!(ranges(0, 2), vec![(0, 0)]);
        assert_eq!(pieces(32, 100), 1, "too little work for threads");
        assert!(pieces(1, usize::MAX) == 1);
    }
}
