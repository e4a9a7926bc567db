//! The matrix product of every kernel that multiplies matrices (MatMul, BatchMatMul, the
//! convolutions and their gradients): `c = a·b` or `c += a·b` on 2-D views of any strides.
//! float32 and float64 go through the `gemm` crate, whose kernels use the widest vector unit
//! the CPU has (AVX-512 included, where `matrixmultiply` stops at AVX2), or, for a large
//! product where the host has OpenBLAS, through OpenBLAS ([`blas`]), faster there. A large
//! product is split over the device's intra-op threads (in bands, or by `gemm`'s own
//! `Parallelism::Rayon` inside the pool); a middling one is cut into bands the pool's idle
//! threads may take ([`IntraPool::share`]); other element types go through ndarray's
//! `general_mat_mul`. BENCHES.md has the comparisons that chose these.

use std::any::TypeId;
use std::ops::Range;

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

use super::blas::{self, Blas, Call};
use super::numeric::Real;
use crate::runtime::intra::IntraPool;

/// Cycles one multiply-add costs in a GEMM's inner kernel, for the pool's cost model: about
/// 1/16 cycle per lane on a core with AVX-512 FMA, counted high so that a product splits only
/// when each piece keeps a core busy for the piece's minimum.
const CYCLES_PER_MULTIPLY_ADD: f64 = 0.125;

/// Multiply-adds from which a product is split over the pool outright (by `gemm`, which
/// packs each operand once for every thread). Below this, about half a millisecond of one
/// core's work, a split product waits for its slowest piece, and inside a step the pool's
/// threads share the cores with the nodes running beside it (an LSTM's gates, its other
/// product): an LSTM's training step (128 x 192 x 512 products) ran about 7 % faster with
/// them whole than split (BENCHES.md, compute). So smaller products are shared instead
/// ([`SHARED_PIECE_MULTIPLY_ADDS`]).
const PARALLEL_MULTIPLY_ADDS: usize = 1 << 24;

/// The least work a piece of a product under [`PARALLEL_MULTIPLY_ADDS`] is given when it is
/// shared with the pool's idle threads ([`IntraPool::share`]: the calling thread runs the
/// pieces no idle thread takes, and waits only for those one has started): about 100 µs of
/// one core. Below twice this (32 x 64 x 128, say) a product runs whole on the calling thread.
const SHARED_PIECE_MULTIPLY_ADDS: usize = 1 << 21;

/// Rows or columns a shared product's pieces come in multiples of: whole tiles of `gemm`'s
/// micro-kernels.
const SHARED_PIECE_ALIGN: usize = 16;

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
    matmul_with(a, b, c, accumulate, threads, blas::get());
}

/// [`matmul`] with `blas` (the process's, or none) for the products of at least
/// [`PARALLEL_MULTIPLY_ADDS`]: smaller ones, where `gemm` is as fast and has no call's cost,
/// always go through `gemm`.
fn matmul_with<T: Real>(
    a: &ArrayView2<'_, T>,
    b: &ArrayView2<'_, T>,
    c: &mut ArrayViewMut2<'_, T>,
    accumulate: bool,
    threads: Threads<'_>,
    blas: Option<&'static Blas>,
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
    let product = Product {
        k,
        a: (a.as_ptr() as usize, a.strides()[0], a.strides()[1]),
        b: (b.as_ptr() as usize, b.strides()[0], b.strides()[1]),
        c: (c.as_mut_ptr() as usize, c.strides()[0], c.strides()[1]),
        accumulate,
        blas: blas.filter(|_| multiply_adds >= PARALLEL_MULTIPLY_ADDS),
        element: std::marker::PhantomData::<T>,
    };
    let pool = match threads {
        Threads::Pool(pool) if pool.threads() > 1 => pool,
        _ => {
            // SAFETY: the views are live for this call, their shapes agree, `c` is borrowed
            // mutably apart from `a` and `b`, and T is f32 or f64 (checked above).
            unsafe { product.run(0..m, 0..n, gemm::Parallelism::None) };
            return;
        }
    };
    // Along the longer axis of the output, each piece multiplies one operand whole by a band
    // of the other (so the band is packed once and the whole operand once per piece).
    let along_rows = m > n;
    let length = if along_rows { m } else { n };
    let band = move |range: Range<usize>| {
        if along_rows {
            (range, 0..n)
        } else {
            (0..m, range)
        }
    };
    if multiply_adds >= PARALLEL_MULTIPLY_ADDS && product.blas.is_some() {
        // Bands of whole micro-tiles, one per piece the pool's cost model gives.
        let tiles = length.div_ceil(SHARED_PIECE_ALIGN);
        let per_tile = (multiply_adds / tiles) as f64 * CYCLES_PER_MULTIPLY_ADD;
        pool.parallel_for(tiles, per_tile, |tiles| {
            let range =
                tiles.start * SHARED_PIECE_ALIGN..(tiles.end * SHARED_PIECE_ALIGN).min(length);
            let (rows, columns) = band(range);
            // SAFETY: as above, for the band of `c` this piece alone writes; `parallel_for`
            // returns when every piece has run.
            unsafe { product.run(rows, columns, gemm::Parallelism::None) };
        });
        return;
    }
    if multiply_adds >= PARALLEL_MULTIPLY_ADDS {
        let pieces = pool.pieces(multiply_adds, CYCLES_PER_MULTIPLY_ADD);
        // SAFETY: as above; the pool runs the product before `install` returns.
        pool.install(|| unsafe { product.run(0..m, 0..n, gemm::Parallelism::Rayon(pieces)) });
        return;
    }
    let pieces = (multiply_adds / SHARED_PIECE_MULTIPLY_ADDS)
        .min(length / SHARED_PIECE_ALIGN)
        .min(2 * pool.threads());
    if pieces < 2 {
        // SAFETY: as above.
        unsafe { product.run(0..m, 0..n, gemm::Parallelism::None) };
        return;
    }
    // Bands of whole micro-tiles, the last one taking what is left.
    let width = length.div_ceil(pieces).next_multiple_of(SHARED_PIECE_ALIGN);
    let pieces = length.div_ceil(width);
    pool.share(pieces, pool.threads() - 1, move |i| {
        let (rows, columns) = band(i * width..((i + 1) * width).min(length));
        // SAFETY: as above, for the bands of `c` the pieces cover, each written by one piece:
        // `share` returns only when every piece has run, and calls none after.
        unsafe { product.run(rows, columns, gemm::Parallelism::None) };
    });
}

/// A product's inner length, and each operand's address (as an integer, so pieces can carry
/// it to other threads) with its row and column strides in elements.
#[derive(Clone, Copy)]
struct Product<T> {
    k: usize,
    a: (usize, isize, isize),
    b: (usize, isize, isize),
    c: (usize, isize, isize),
    accumulate: bool,
    /// The BLAS that multiplies it, where its layout is one CBLAS takes; else `gemm`.
    blas: Option<&'static Blas>,
    element: std::marker::PhantomData<T>,
}

impl<T: Real> Product<T> {
    /// `c[rows, columns] (+)= a[rows, :]·b[:, columns]`.
    ///
    /// # Safety
    /// The addresses and strides are those of live views whose shapes agree (m×k, k×n, m×n),
    /// `rows` and `columns` lie within them, nothing else reads or writes that block of `c`
    /// meanwhile, and T is f32 or f64, which `gemm` implements.
    unsafe fn run(
        &self,
        rows: Range<usize>,
        columns: Range<usize>,
        parallelism: gemm::Parallelism,
    ) {
        let (a, a_rs, a_cs) = self.a;
        let (b, b_rs, b_cs) = self.b;
        let (c, c_rs, c_cs) = self.c;
        let (i, j) = (rows.start as isize, columns.start as isize);
        if let Some(blas) = self.blas {
            let call = Call {
                m: rows.len(),
                n: columns.len(),
                k: self.k,
                a: ((a as *const T).offset(i * a_rs) as usize, a_rs, a_cs),
                b: ((b as *const T).offset(j * b_cs) as usize, b_rs, b_cs),
                c: (
                    (c as *mut T).offset(i * c_rs + j * c_cs) as usize,
                    c_rs,
                    c_cs,
                ),
                accumulate: self.accumulate,
            };
            let done = if TypeId::of::<T>() == TypeId::of::<f32>() {
                blas.multiply::<f32>(&call)
            } else {
                blas.multiply::<f64>(&call)
            };
            if done {
                return;
            }
        }
        // `gemm`'s `alpha` scales the old `c` (read only with `read_dst`), its `beta` the
        // product.
        gemm::gemm(
            rows.len(),
            columns.len(),
            self.k,
            (c as *mut T).offset(i * c_rs + j * c_cs),
            c_cs,
            c_rs,
            self.accumulate,
            (a as *const T).offset(i * a_rs),
            a_cs,
            a_rs,
            (b as *const T).offset(j * b_cs),
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
        // Above PARALLEL_MULTIPLY_ADDS (split by `gemm`), and below it (shared in bands of
        // rows or of columns, one ending mid-tile).
        for (m, k, n) in [
            (256, 784, 128),
            (61, 1000, 301),
            (2, 4096, 3000),
            (128, 192, 512),
            (300, 129, 77),
            (64, 256, 1000),
        ] {
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
            if m * k * n < PARALLEL_MULTIPLY_ADDS {
                assert_eq!(
                    one, split,
                    "{m}x{k}x{n}: bands sum as the whole product does"
                );
                // Bands of a transposed view into a column-major output, accumulated.
                let at = a.t().to_owned();
                let mut f = Array2::<f32>::zeros((m, n).f());
                for _ in 0..2 {
                    matmul(
                        &at.t(),
                        &b.view(),
                        &mut f.view_mut(),
                        true,
                        Threads::Pool(&pool),
                    );
                }
                assert_eq!(f, &one * 2.0, "{m}x{k}x{n}: strided bands");
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

    /// The process's OpenBLAS; `None` where the host has none (the test skips, saying so), which
    /// fails under CI, where `scripts/test` installs it.
    fn openblas(test: &str) -> Option<&'static Blas> {
        let blas = blas::get();
        let ci = std::env::var("CI")
            .is_ok_and(|v| !matches!(v.trim().to_ascii_lowercase().as_str(), "" | "0" | "false"));
        match blas {
            None if ci => panic!(
                "{test}: no OpenBLAS (libopenblas.so.0); CI=true requires it (apt-get install \
                 libopenblas0, as scripts/test does)"
            ),
            None => eprintln!("{test}: skipped, no OpenBLAS (apt-get install libopenblas0)"),
            Some(_) => {}
        }
        blas
    }

    #[test]
    fn openblas_products_match_gemm_in_every_layout_and_band() {
        let Some(openblas) = openblas("openblas_products_match_gemm_in_every_layout_and_band")
        else {
            return;
        };
        let pool = IntraPool::new("test-blas", 3);
        // Over PARALLEL_MULTIPLY_ADDS: in bands of rows, of columns (one ending mid-tile), and
        // a row vector's product.
        for (m, k, n) in [
            (256, 784, 128),
            (61, 1000, 301),
            (2, 4096, 3000),
            (1, 1 << 24, 1),
        ] {
            let a = filled(m, k, 3).mapv(|v| v as f32 / 7.0);
            let b = filled(k, n, 4).mapv(|v| v as f32 / 5.0);
            let scale = a.mapv(f32::abs).dot(&b.mapv(f32::abs));
            let want = a.dot(&b);
            // Each operand as it is, as a transposed view of its transpose, and as a view of
            // the leading columns of a wider array; the output row- and column-major.
            let at = a.t().to_owned();
            let bt = b.t().to_owned();
            let mut wide_a = Array2::<f32>::zeros((m, k + 5));
            wide_a.slice_mut(ndarray::s![.., ..k]).assign(&a);
            let a_views = [a.view(), at.t(), wide_a.slice(ndarray::s![.., ..k])];
            let b_views = [b.view(), bt.t()];
            for (i, a_view) in a_views.iter().enumerate() {
                for (j, b_view) in b_views.iter().enumerate() {
                    for column_major in [false, true] {
                        for threads in [Threads::One, Threads::Pool(&pool)] {
                            let shape = (m, n).set_f(column_major);
                            let mut c = Array2::<f32>::from_elem(shape, f32::NAN);
                            for accumulate in [false, true] {
                                matmul_with(
                                    a_view,
                                    b_view,
                                    &mut c.view_mut(),
                                    accumulate,
                                    threads,
                                    Some(openblas),
                                );
                            }
                            for ((x, y), s) in c.iter().zip(&want).zip(&scale) {
                                assert!(
                                    (x - 2.0 * y).abs() <= 2e-5 * s.max(1.0),
                                    "{m}x{k}x{n}, a {i}, b {j}, column-major {column_major}: \
                                     {x} vs 2 x {y}"
                                );
                            }
                        }
                    }
                }
            }
        }
        // float64 (integers, which it multiplies exactly), and an operand CBLAS cannot take
        // (no contiguous axis), which `gemm` multiplies.
        let a = filled(300, 600, 1);
        let b = filled(1200, 400, 2);
        for b in [
            b.slice(ndarray::s![..600, ..200]),
            b.slice(ndarray::s![..;2, ..;2]),
        ] {
            let mut c = Array2::<f64>::zeros((300, 200));
            matmul_with(
                &a.view(),
                &b,
                &mut c.view_mut(),
                false,
                Threads::Pool(&pool),
                Some(openblas),
            );
            assert_eq!(c, a.dot(&b));
        }
    }
}
