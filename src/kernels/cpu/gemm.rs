//! The matrix product of every kernel that multiplies matrices (MatMul, BatchMatMul, the
//! convolutions and their gradients): `c = a·b` or `c += a·b` on 2-D views of any strides.
//! float32 and float64 go through the `gemm` crate, whose kernels use the widest vector unit
//! the CPU has (AVX-512 included, where `matrixmultiply` stops at AVX2) and which splits a
//! large product over the device's intra-op threads (`Parallelism::Rayon` inside the pool);
//! other element types through ndarray's `general_mat_mul`. BENCHES.md has the comparison
//! that chose it.

use std::any::TypeId;

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

use super::numeric::Real;
use crate::runtime::intra::IntraPool;

/// Cycles one multiply-add costs in a GEMM's inner kernel, for the pool's cost model: about
/// 1/16 cycle per lane on a core with AVX-512 FMA, counted high so that a product splits only
/// when each piece keeps a core busy for the piece's minimum.
const CYCLES_PER_MULTIPLY_ADD: f64 = 0.125;

/// Multiply-adds below which a product runs on the calling thread alone, even with threads
/// to spare: under half a millisecond of one core's work. Split, such a product waits for its
/// slowest piece, and inside a step the pool's threads share the cores with the nodes running
/// beside it (an LSTM's gates, its other product): an LSTM's training step (128 x 192 x 512
/// products) ran about 7 % faster with them whole (BENCHES.md, compute). The smallest (32 x
/// 64 x 128) would lose to the split's own cost even alone.
const PARALLEL_MULTIPLY_ADDS: usize = 1 << 24;

/// What a fused kernel does to a product's output rows as they are written (a bias and an
/// activation): called on chunks of whole rows.
pub(super) type RowsFn<'a, T> = &'a (dyn Fn(&mut [T]) + Sync);

/// How a product may use the device's threads.
#[derive(Clone, Copy)]
pub(super) enum Threads<'a> {
    /// On the calling thread (a piece of work already split over the pool).
    One,
    /// Over the pool, when the product is large enough to gain from it.
    Pool(&'a IntraPool),
}

/// `c = a·b`, or `c += a·b` with `accumulate`. The shapes must agree (`[m, k]·[k, n]` into
/// `[m, n]`): callers build the views from one geometry.
pub(super) fn matmul<T: Real>(
    a: &ArrayView2<'_, T>,
    b: &ArrayView2<'_, T>,
    c: &mut ArrayViewMut2<'_, T>,
    accumulate: bool,
    threads: Threads<'_>,
) {
    let (m, k) = a.dim();
    let n = b.dim().1;
    debug_assert_eq!((b.dim().0, c.dim()), (k, (m, n)), "matmul shapes");
    if m == 0 || n == 0 {
        return;
    }
    let id = TypeId::of::<T>();
    if id != TypeId::of::<f32>() && id != TypeId::of::<f64>() {
        let beta = if accumulate { T::one() } else { T::zero() };
        general_mat_mul(T::one(), a, b, beta, c);
        return;
    }
    let multiply_adds = m.saturating_mul(n).saturating_mul(k);
    let pool = match threads {
        Threads::Pool(pool) if multiply_adds >= PARALLEL_MULTIPLY_ADDS => Some(pool),
        _ => None,
    };
    let pieces = pool.map_or(1, |pool| {
        pool.pieces(multiply_adds, CYCLES_PER_MULTIPLY_ADD)
    });
    let (a_rs, a_cs) = (a.strides()[0], a.strides()[1]);
    let (b_rs, b_cs) = (b.strides()[0], b.strides()[1]);
    let (c_rs, c_cs) = (c.strides()[0], c.strides()[1]);
    let (a_ptr, b_ptr, c_ptr) = (
        a.as_ptr() as usize,
        b.as_ptr() as usize,
        c.as_mut_ptr() as usize,
    );
    let product = move |parallelism| {
        // SAFETY: the pointers and strides are those of live views whose shapes agree (m×k,
        // k×n, m×n), borrowed for this whole call (the pool runs the product before `install`
        // returns); `c` is borrowed mutably and does not alias `a` or `b` (distinct borrows),
        // and T is f32 or f64, which `gemm` implements. `gemm`'s `alpha` scales the old `c`
        // (read only with `read_dst`), its `beta` the product.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                c_ptr as *mut T,
                c_cs,
                c_rs,
                accumulate,
                a_ptr as *const T,
                a_cs,
                a_rs,
                b_ptr as *const T,
                b_cs,
                b_rs,
                T::one(),
                T::one(),
                false,
                false,
                false,
                parallelism,
            );
        }
    };
    match pool {
        Some(pool) if pieces > 1 => {
            pool.install(|| product(gemm::Parallelism::Rayon(pieces)));
        }
        _ => product(gemm::Parallelism::None),
    }
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
        matmul(&a.view(), &b.view(), &mut c.view_mut(), false, Threads::One);
        assert_eq!(c, want);
        let at = a.t().to_owned();
        let mut f = Array2::<f64>::zeros((37, 23).f());
        matmul(&at.t(), &b.view(), &mut f.view_mut(), false, Threads::One);
        assert_eq!(f, want);
        matmul(&at.t(), &b.view(), &mut f.view_mut(), true, Threads::One);
        assert_eq!(f, &want * 2.0);
        // float32 and an integer type (ndarray's path).
        let (a32, b32) = (a.mapv(|v| v as f32), b.mapv(|v| v as f32));
        let mut c32 = Array2::<f32>::zeros((37, 23));
        matmul(
            &a32.view(),
            &b32.view(),
            &mut c32.view_mut(),
            false,
            Threads::One,
        );
        assert_eq!(c32, want.mapv(|v| v as f32));
        let (ai, bi) = (a.mapv(|v| v as i32), b.mapv(|v| v as i32));
        let mut ci = Array2::<i32>::zeros((37, 23));
        matmul(
            &ai.view(),
            &bi.view(),
            &mut ci.view_mut(),
            false,
            Threads::One,
        );
        assert_eq!(ci, want.mapv(|v| v as i32));
    }

    #[test]
    fn a_product_split_over_the_pool_matches_one_thread() {
        let pool = IntraPool::new("test-gemm", 4);
        for (m, k, n) in [(256, 784, 128), (61, 1000, 301), (2, 4096, 3000)] {
            let a = filled(m, k, 3).mapv(|v| v as f32 / 7.0);
            let b = filled(k, n, 4).mapv(|v| v as f32 / 5.0);
            let mut one = Array2::<f32>::zeros((m, n));
            matmul(
                &a.view(),
                &b.view(),
                &mut one.view_mut(),
                false,
                Threads::One,
            );
            let mut split = Array2::<f32>::zeros((m, n));
            matmul(
                &a.view(),
                &b.view(),
                &mut split.view_mut(),
                false,
                Threads::Pool(&pool),
            );
            // A tolerance scaled by each entry's sum of |a||b| (the products may be summed in
            // another order).
            let scale = a.mapv(f32::abs).dot(&b.mapv(f32::abs));
            for ((x, y), s) in one.iter().zip(&split).zip(&scale) {
                assert!(
                    (x - y).abs() <= 1e-5 * s.max(1.0),
                    "{m}x{k}x{n}: {x} vs {y}"
                );
            }
            let want = a.dot(&b);
            for ((x, y), s) in want.iter().zip(&split).zip(&scale) {
                assert!(
                    (x - y).abs() <= 1e-5 * s.max(1.0),
                    "{m}x{k}x{n}: {x} vs {y}"
                );
            }
        }
    }
}
