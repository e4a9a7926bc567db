//! Element-wise work split over the device's intra-op threads: a map of one slice or a zip of
//! two into a fresh output, each piece a plain loop the compiler vectorizes. Work under the
//! pool's threshold (a small model's tensors) runs inline on the calling thread.
//!
//! The crate is compiled for the baseline of its target (SSE2 on x86-64: 4 float32 lanes), so
//! each loop is also compiled for AVX2 and FMA (8 lanes) and that copy runs on CPUs that have
//! them, chosen once per call ([`lanes`]).

use std::mem::MaybeUninit;

use crate::runtime::intra::IntraPool;

/// Cycles an element-wise function costs per element, for the pool's cost model: a load or
/// two, the function and a store, memory-bound on large tensors.
pub(super) const ELEMENT_CYCLES: f64 = 1.0;

/// `f` of each element of `x`, computed over the pool.
pub(super) fn map<T: Copy + Sync, U: Copy + Send>(
    intra: &IntraPool,
    x: &[T],
    f: impl Fn(T) -> U + Sync,
) -> Vec<U> {
    fill(intra, x.len(), 1, |start, out| {
        lanes(|| {
            for (o, &v) in out.iter_mut().zip(&x[start..]) {
                o.write(f(v));
            }
        })
    })
}

/// `f` of each pair of elements of `a` and `b` (of one length), computed over the pool.
pub(super) fn zip<A: Copy + Sync, B: Copy + Sync, U: Copy + Send>(
    intra: &IntraPool,
    a: &[A],
    b: &[B],
    f: impl Fn(A, B) -> U + Sync,
) -> Vec<U> {
    debug_assert_eq!(a.len(), b.len(), "zip of one length");
    let len = a.len().min(b.len());
    fill(intra, len, 1, |start, out| {
        lanes(|| {
            for ((o, &x), &y) in out.iter_mut().zip(&a[start..]).zip(&b[start..]) {
                o.write(f(x, y));
            }
        })
    })
}

/// `f(a[i * w + j], row[j])` for every row `i` of `a` (rows of `w = row.len()` elements, at
/// least one), computed over the pool: a bias added to each row, say.
pub(super) fn rows<A: Copy + Sync, B: Copy + Sync, U: Copy + Send>(
    intra: &IntraPool,
    a: &[A],
    row: &[B],
    f: impl Fn(A, B) -> U + Sync,
) -> Vec<U> {
    let width = row.len().max(1);
    debug_assert_eq!(a.len() % width, 0, "whole rows");
    fill(intra, a.len() / width * width, width, |first, out| {
        let start = first * width;
        lanes(|| {
            for (o, x) in out
                .chunks_exact_mut(width)
                .zip(a[start..].chunks_exact(width))
            {
                for ((o, &x), &r) in o.iter_mut().zip(x).zip(row) {
                    o.write(f(x, r));
                }
            }
        })
    })
}

/// [`map`] written over `x` itself: the output of a kernel that forwarded its input
/// (`OpContext::forward_input`).
pub(super) fn map_in_place<T: Copy + Send + Sync>(
    intra: &IntraPool,
    x: &mut [T],
    f: impl Fn(T) -> T + Sync,
) {
    intra.for_chunks(x, 1, ELEMENT_CYCLES, |_, chunk| {
        lanes(|| {
            for v in chunk.iter_mut() {
                *v = f(*v);
            }
        })
    });
}

/// [`zip`] written over `a` itself (`b` as long as `a`).
pub(super) fn zip_in_place<T: Copy + Send + Sync, B: Copy + Sync>(
    intra: &IntraPool,
    a: &mut [T],
    b: &[B],
    f: impl Fn(T, B) -> T + Sync,
) {
    debug_assert_eq!(a.len(), b.len(), "zip of one length");
    intra.for_chunks(a, 1, ELEMENT_CYCLES, |start, chunk| {
        lanes(|| {
            for (x, &y) in chunk.iter_mut().zip(&b[start..]) {
                *x = f(*x, y);
            }
        })
    });
}

/// [`rows`] written over `a` itself.
pub(super) fn rows_in_place<T: Copy + Send + Sync, B: Copy + Sync>(
    intra: &IntraPool,
    a: &mut [T],
    row: &[B],
    f: impl Fn(T, B) -> T + Sync,
) {
    let width = row.len().max(1);
    debug_assert_eq!(a.len() % width, 0, "whole rows");
    intra.for_chunks(a, width, width as f64 * ELEMENT_CYCLES, |_, chunk| {
        lanes(|| {
            for x in chunk.chunks_exact_mut(width) {
                for (x, &r) in x.iter_mut().zip(row) {
                    *x = f(*x, r);
                }
            }
        })
    });
}

/// Runs `body`, a loop over slices, compiled for AVX2 and FMA when the CPU has both (the
/// closure and what it calls are inlined into that copy, whose loops the compiler then
/// vectorizes 8 float32 lanes wide), else as compiled for the target's baseline. Both copies
/// compute the same values: Rust never fuses a multiply and an add on its own.
#[inline(always)]
pub(super) fn lanes<R>(body: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA, checked just above.
        return unsafe { avx2(body) };
    }
    body()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2<R>(body: impl FnOnce() -> R) -> R {
    body()
}

/// A vector of `len` elements, every one written by `write(first, chunk)` over the pool, in
/// chunks of whole units of `unit` elements (`first`: the chunk's first unit).
fn fill<U: Copy + Send>(
    intra: &IntraPool,
    len: usize,
    unit: usize,
    write: impl Fn(usize, &mut [MaybeUninit<U>]) + Sync,
) -> Vec<U> {
    let mut out: Vec<U> = Vec::with_capacity(len);
    let cycles = unit as f64 * ELEMENT_CYCLES;
    intra.for_chunks(&mut out.spare_capacity_mut()[..len], unit, cycles, write);
    // SAFETY: the chunks cover `0..len` and `write` wrote every element of its chunk (the
    // callers zip each chunk with inputs at least as long); a panic in `write` returns before
    // this, leaving the vector empty.
    unsafe { out.set_len(len) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_and_zips_match_a_plain_loop_inline_and_split() {
        let pool = IntraPool::new("test-split", 3);
        for len in [0, 1, 7, 200_003] {
            let x: Vec<f32> = (0..len).map(|i| i as f32 - 5.0).collect();
            let y: Vec<f32> = (0..len).map(|i| (i % 7) as f32).collect();
            assert_eq!(
                map(&pool, &x, |v| v.max(0.0)),
                x.iter().map(|v| v.max(0.0)).collect::<Vec<_>>()
            );
            assert_eq!(
                zip(&pool, &x, &y, |a, b| a * b),
                x.iter().zip(&y).map(|(a, b)| a * b).collect::<Vec<_>>()
            );
            let row = [1.0f32, -2.0, 3.0];
            let a: Vec<f32> = (0..len / 3 * 3).map(|i| i as f32).collect();
            let want: Vec<f32> = a.iter().enumerate().map(|(i, v)| v + row[i % 3]).collect();
            assert_eq!(rows(&pool, &a, &row, |x, r| x + r), want);

            // In place, the same values.
            let mut m = x.clone();
            map_in_place(&pool, &mut m, |v| v.max(0.0));
            assert_eq!(m, map(&pool, &x, |v| v.max(0.0)));
            let mut z = x.clone();
            zip_in_place(&pool, &mut z, &y, |a, b| a * b);
            assert_eq!(z, zip(&pool, &x, &y, |a, b| a * b));
            let mut r = a.clone();
            rows_in_place(&pool, &mut r, &row, |x, r| x + r);
            assert_eq!(r, want);
        }
    }
}
