//! Asking the CPU for rows before a loop reaches them: a sparse optimizer update, whose rows
//! lie scattered over a large variable and its slots, otherwise waits for each row's cache
//! misses in turn. (An embedding's gather, which only copies its rows, gained nothing from it:
//! the CPU already overlaps the copies' misses.)

/// How many rows ahead of the one a loop works on it asks for.
pub(super) const ROWS_AHEAD: usize = 8;

/// The bytes of a row asked for: the hardware's own prefetcher follows a longer row.
const ROW_BYTES: usize = 256;

/// Asks the CPU to start loading the first cache lines of `row`, without waiting for them.
#[inline(always)]
pub(super) fn prefetch<T>(row: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let start = row.as_ptr().cast::<i8>();
        for offset in (0..std::mem::size_of_val(row).min(ROW_BYTES)).step_by(64) {
            // SAFETY: the address lies within `row`; a prefetch reads nothing and cannot
            // fault.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.add(offset)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}
