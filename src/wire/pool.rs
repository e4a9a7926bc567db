//! The receive-buffer pool: large buffers that received tensors live in, reused once the last
//! tensor sharing one is dropped.
//!
//! A fresh multi-MiB allocation is fresh pages from the kernel: every 4 KiB page faults and is
//! zeroed on first touch, which costs about as much as moving the bytes over loopback TCP. A
//! training step receives the same tensors every step, so the buffers of step k serve step
//! k+1 already mapped. Buffers return to the pool from the `Bytes` that shares them
//! ([`Bytes::from_owner`]), whichever thread drops it last.
//!
//! Bounded: at most [`idle_limit`] bytes wait in the pool (oldest evicted first): room for
//! [`LARGEST_KEPT`] buffers of the largest size given back so far, at least
//! [`MAX_IDLE_BYTES`] and at most [`IDLE_CEILING`], so that a step receiving two 256 MiB
//! tensors finds both buffers again instead of evicting one with the other. Buffers under
//! [`MIN_POOLED_BYTES`] are plain allocations (the allocator reuses those well by itself).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use bytes::Bytes;

/// Buffers smaller than this are not pooled.
pub const MIN_POOLED_BYTES: usize = 256 << 10;

/// The idle memory the pool may keep whatever the sizes it sees.
pub const MAX_IDLE_BYTES: usize = 256 << 20;

/// How many buffers of the largest size given back the pool makes room for.
pub const LARGEST_KEPT: usize = 4;

/// The most idle memory the pool keeps, however large its buffers.
pub const IDLE_CEILING: usize = 2 << 30;

/// The largest buffer given back so far.
static LARGEST: AtomicUsize = AtomicUsize::new(0);

/// The idle memory the pool keeps now: room for [`LARGEST_KEPT`] of the largest buffer given
/// back, within [`MAX_IDLE_BYTES`] and [`IDLE_CEILING`].
pub fn idle_limit() -> usize {
    (LARGEST_KEPT * LARGEST.load(Ordering::Relaxed)).clamp(MAX_IDLE_BYTES, IDLE_CEILING)
}

/// A buffer is reused for a request of at least half its capacity, so a small tensor does not
/// pin a huge buffer.
const MAX_WASTE_FACTOR: usize = 2;

/// Idle buffers, oldest first, with their total capacity.
struct Idle {
    buffers: VecDeque<Reusable>,
    bytes: usize,
}

/// An idle buffer and how many of its leading bytes were written during earlier uses.
struct Reusable {
    vec: Vec<u8>,
    initialized: usize,
}

static IDLE: Mutex<Idle> = Mutex::new(Idle {
    buffers: VecDeque::new(),
    bytes: 0,
});

fn idle() -> std::sync::MutexGuard<'static, Idle> {
    // The pool holds no invariant a panicking holder could break halfway.
    IDLE.lock().unwrap_or_else(|p| p.into_inner())
}

/// An empty buffer with room for at least `capacity` bytes, reused from the pool when one fits.
pub fn take(capacity: usize) -> Buffer {
    if capacity >= MIN_POOLED_BYTES {
        let mut idle = idle();
        let best = idle
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| {
                let held = b.vec.capacity();
                held >= capacity && held <= capacity * MAX_WASTE_FACTOR
            })
            .min_by_key(|(_, b)| b.vec.capacity())
            .map(|(i, _)| i);
        if let Some(Reusable { vec, initialized }) = best.and_then(|i| idle.buffers.remove(i)) {
            idle.bytes -= vec.capacity();
            return Buffer { vec, initialized };
        }
    }
    Buffer {
        vec: Vec::with_capacity(capacity),
        initialized: 0,
    }
}

/// Returns `vec` to the pool (or frees it when it is small or the pool is full).
fn give_back(mut vec: Vec<u8>, initialized: usize) {
    let capacity = vec.capacity();
    if capacity < MIN_POOLED_BYTES {
        return;
    }
    LARGEST.fetch_max(capacity.min(IDLE_CEILING), Ordering::Relaxed);
    let limit = idle_limit();
    if capacity > limit {
        return;
    }
    let initialized = initialized.max(vec.len());
    vec.clear();
    let mut idle = idle();
    while idle.bytes + capacity > limit {
        match idle.buffers.pop_front() {
            Some(old) => idle.bytes -= old.vec.capacity(),
            None => break,
        }
    }
    idle.bytes += capacity;
    idle.buffers.push_back(Reusable { vec, initialized });
}

/// Bytes held by idle buffers (for tests and metrics).
pub fn idle_bytes() -> usize {
    idle().bytes
}

/// A buffer being filled; [`Buffer::freeze`] turns it into `Bytes` that return it to the pool
/// when dropped.
#[derive(Debug)]
pub struct Buffer {
    vec: Vec<u8>,
    /// Leading bytes of the allocation written at some point (by this use or an earlier one);
    /// at least `vec.len()` once the buffer is frozen.
    initialized: usize,
}

impl Buffer {
    /// The address of the first byte (for alignment).
    pub fn as_ptr(&self) -> *const u8 {
        self.vec.as_ptr()
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.vec.len()
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.vec.is_empty()
    }

    /// Grows the buffer with zeros to `len` bytes (padding before a message).
    pub fn resize_to(&mut self, len: usize) {
        self.vec.resize(len, 0);
    }

    /// Appends `data` (within the capacity asked of [`take`], without reallocating).
    pub fn extend_from_slice(&mut self, data: &[u8]) {
        self.vec.extend_from_slice(data);
    }

    /// Grows the buffer by `n` bytes and returns them for the caller to overwrite (a socket
    /// reading into them). Their contents are unspecified: zeros, or bytes of an earlier use of
    /// a pooled buffer, which are not zeroed again (zeroing a buffer of many MiB costs as much
    /// as receiving it).
    pub fn grow_for_write(&mut self, n: usize) -> &mut [u8] {
        let start = self.vec.len();
        let end = start + n;
        self.vec.reserve(n);
        let reusable = self.initialized.min(end);
        if reusable > start {
            // SAFETY: `reusable <= initialized <= capacity`, and every byte below
            // `initialized` was written during this or an earlier use of this allocation; a
            // `u8` has no invalid values and nothing to drop.
            unsafe { self.vec.set_len(reusable) };
        }
        self.vec.resize(end, 0);
        self.initialized = self.initialized.max(end);
        &mut self.vec[start..end]
    }

    /// The written bytes as `Bytes` sharing this buffer; the buffer goes back to the pool once
    /// the last `Bytes` sharing it is dropped.
    pub fn freeze(self) -> Bytes {
        if self.vec.capacity() < MIN_POOLED_BYTES {
            return Bytes::from(self.vec);
        }
        let initialized = self.initialized.max(self.vec.len());
        Bytes::from_owner(Pooled {
            vec: self.vec,
            initialized,
        })
    }
}

/// The owner behind pooled `Bytes`: gives its buffer back when dropped.
struct Pooled {
    vec: Vec<u8>,
    initialized: usize,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.vec
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        give_back(std::mem::take(&mut self.vec), self.initialized);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pool is process-wide; tests that count its bytes run one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn a_dropped_buffer_serves_the_next_message_of_its_size() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let size = 3 << 20;
        let mut first = take(size);
        first.extend_from_slice(&[7u8; 100]);
        let address = first.as_ptr();
        let bytes = first.freeze();
        assert_eq!(&bytes[..], &[7u8; 100][..]);
        let shared = bytes.slice(10..20);
        drop(bytes);
        // Still shared by `shared`: not back yet, so a new buffer is a different one.
        let other = take(size);
        assert_ne!(other.as_ptr(), address);
        drop(other);
        drop(shared);
        let again = take(size);
        assert_eq!(again.as_ptr(), address);
        assert!(again.is_empty());
    }

    #[test]
    fn space_grown_for_writing_reuses_the_bytes_of_an_earlier_use() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let size = 5 << 20;
        let mut first = take(size);
        first.grow_for_write(100).fill(9);
        let address = first.as_ptr();
        drop(first.freeze());
        let mut again = take(size);
        assert_eq!(again.as_ptr(), address);
        // 100 bytes written before, 50 fresh ones: the space covers both and nothing else.
        let space = again.grow_for_write(150);
        assert_eq!(space.len(), 150);
        assert_eq!(space[149], 0);
        space.fill(3);
        let bytes = again.freeze();
        assert_eq!(&bytes[..], &[3u8; 150][..]);
    }

    #[test]
    fn small_requests_do_not_take_large_buffers_and_small_buffers_are_not_kept() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let big = take(8 << 20);
        let address = big.as_ptr();
        drop(big.freeze());
        // 1 MiB would waste 7 of 8 MiB: a fresh buffer.
        let small = take(1 << 20);
        assert_ne!(small.as_ptr(), address);
        let before = idle_bytes();
        drop(take(1000).freeze());
        assert_eq!(idle_bytes(), before);
    }

    #[test]
    fn idle_memory_stays_under_the_bound() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let buffers: Vec<Buffer> = (0..5).map(|_| take(64 << 20)).collect();
        for buffer in buffers {
            drop(buffer.freeze());
        }
        // Five 64 MiB buffers came back; the pool keeps four of the largest it has seen.
        assert!(idle_bytes() <= idle_limit(), "{}", idle_bytes());
        assert!(idle_bytes() >= 4 * (64 << 20), "{}", idle_bytes());
    }

    #[test]
    fn two_large_buffers_of_one_step_both_come_back() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        const LARGE: usize = 256 << 20;
        let (a, b) = (take(LARGE), take(LARGE));
        let addresses = [a.as_ptr(), b.as_ptr()];
        drop(a.freeze());
        drop(b.freeze());
        // The next step's two tensors land in the same two buffers, already mapped.
        let (c, d) = (take(LARGE), take(LARGE));
        let mut again = [c.as_ptr(), d.as_ptr()];
        again.sort();
        let mut before = addresses;
        before.sort();
        assert_eq!(again, before);
        assert!(idle_limit() >= 2 * LARGE);
        assert!(idle_limit() <= IDLE_CEILING);
    }
}
