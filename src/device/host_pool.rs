//! Large host buffers kept across steps: the CPU device's memory pool.
//!
//! A training step allocates the same large buffers every time (activations, their gradients,
//! a convolution's patch matrix), and frees them at the end. The system allocator gives blocks
//! of that size back to the kernel (`munmap`) and maps fresh ones next step, so every step
//! pays a page fault per 4 KiB it touches: on a CNN step measured on a 2-core host, 15 000
//! faults (60 MB) a step, a third of the step. This pool keeps freed blocks of 256 KiB and up,
//! in size classes, and hands them out again: the next step's buffers are already mapped.
//!
//! [`HostPool`] is a plain allocator over [`System`]; [`PooledAllocator`] installs the
//! process-wide one ([`HOST_POOL`]) as Rust's global allocator (the `tessera` binary does), so
//! every large allocation goes through it, kernel outputs and scratch alike, with no kernel
//! knowing. What it keeps is bounded: at most its capacity (1 GiB or an eighth of the host's
//! memory, whichever is less; [`HostPool::set_capacity`]) idles in it, and a block nobody took
//! back for [`IDLE_MS`] goes back to the system, so an idle task shrinks again. Small blocks
//! and over-aligned ones go straight to the system.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use super::memory;

/// Blocks smaller than this go straight to the system allocator.
pub const MIN_BYTES: usize = 256 << 10;
/// A kept block that nobody took back for this long goes back to the system.
pub const IDLE_MS: u64 = 10_000;
/// Every pooled block is this aligned (a cache line: vector loads never split one).
const ALIGN: usize = 64;
/// Size classes per power of two: a block is at most 1/8 larger than asked.
const STEPS: usize = 8;
const MIN_LOG2: usize = MIN_BYTES.trailing_zeros() as usize;
/// Blocks up to 2^40 bytes are pooled; larger ones go to the system.
const MAX_LOG2: usize = 40;
const CLASSES: usize = (MAX_LOG2 - MIN_LOG2) * STEPS + 1;
/// How often (at most) a pool operation looks for blocks idle past [`IDLE_MS`].
const TRIM_EVERY_MS: u64 = 1_000;
/// The capacity before [`HostPool::set_capacity`]: at most this much...
const DEFAULT_CAPACITY: usize = 1 << 30;
/// ...and at most this share of the host's memory.
const DEFAULT_SHARE_OF_HOST: usize = 8;

/// The process-wide pool [`PooledAllocator`] allocates from.
pub static HOST_POOL: HostPool = HostPool::new();

/// Rust's global allocator over [`HOST_POOL`]: `#[global_allocator] static A: PooledAllocator
/// = PooledAllocator;` in a binary sends its large allocations through the pool.
pub struct PooledAllocator;

// SAFETY: every method forwards to HOST_POOL, whose methods keep GlobalAlloc's contract.
unsafe impl GlobalAlloc for PooledAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HOST_POOL.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        HOST_POOL.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HOST_POOL.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HOST_POOL.realloc(ptr, layout, new_size)
    }
}

/// What a pool has done since it started ([`HostPool::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Large blocks handed out from the pool.
    pub reused: u64,
    /// Large blocks the system had to map.
    pub fresh: u64,
    /// Bytes of freed blocks the pool holds now.
    pub kept_bytes: usize,
    /// Bytes given back to the system because the pool was full or they sat idle.
    pub released_bytes: u64,
}

/// A freed block's first bytes while it waits in its class: the next one and when it came.
struct Free {
    next: *mut Free,
    freed_at_ms: u64,
}

/// One size class's freed blocks, newest first.
struct FreeList {
    head: *mut Free,
}

// SAFETY: the blocks a list points to belong to the pool, and a list is only touched under its
// mutex.
unsafe impl Send for FreeList {}

/// Large host blocks kept for reuse, in size classes (see the module docs).
pub struct HostPool {
    classes: [Mutex<FreeList>; CLASSES],
    /// Bytes the pool may keep; `usize::MAX` until first used or set (then the default).
    capacity: AtomicUsize,
    kept: AtomicUsize,
    reused: AtomicU64,
    fresh: AtomicU64,
    released: AtomicU64,
    last_trim_ms: AtomicU64,
}

impl std::fmt::Debug for HostPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostPool")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for HostPool {
    fn default() -> Self {
        Self::new()
    }
}

impl HostPool {
    /// An empty pool with the default capacity.
    pub const fn new() -> Self {
        Self {
            classes: [const {
                Mutex::new(FreeList {
                    head: ptr::null_mut(),
                })
            }; CLASSES],
            capacity: AtomicUsize::new(usize::MAX),
            kept: AtomicUsize::new(0),
            reused: AtomicU64::new(0),
            fresh: AtomicU64::new(0),
            released: AtomicU64::new(0),
            last_trim_ms: AtomicU64::new(0),
        }
    }

    /// Keeps at most `bytes` of freed blocks from now on (0: keep none, every large block goes
    /// back to the system as it is freed).
    pub fn set_capacity(&self, bytes: usize) {
        self.capacity.store(bytes, Ordering::Relaxed);
        if self.kept.load(Ordering::Relaxed) > bytes {
            self.release_idle(0);
        }
    }

    /// The bytes the pool may keep.
    pub fn capacity(&self) -> usize {
        match self.capacity.load(Ordering::Relaxed) {
            usize::MAX => {
                let default = default_capacity();
                // A concurrent set_capacity wins over the default.
                let _ = self.capacity.compare_exchange(
                    usize::MAX,
                    default,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                self.capacity.load(Ordering::Relaxed)
            }
            bytes => bytes,
        }
    }

    /// Bytes of freed blocks the pool keeps now.
    pub fn kept_bytes(&self) -> usize {
        self.kept.load(Ordering::Relaxed)
    }

    /// What the pool has done so far.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            reused: self.reused.load(Ordering::Relaxed),
            fresh: self.fresh.load(Ordering::Relaxed),
            kept_bytes: self.kept_bytes(),
            released_bytes: self.released.load(Ordering::Relaxed),
        }
    }

    /// Gives every kept block freed at least `idle_ms` ago back to the system (0: all of them).
    pub fn release_idle(&self, idle_ms: u64) {
        self.release_idle_at(now_ms(), idle_ms);
    }

    /// [`release_idle`](Self::release_idle) as of `now` (milliseconds since the pool started).
    fn release_idle_at(&self, now: u64, idle_ms: u64) {
        for (class, list) in self.classes.iter().enumerate() {
            let mut stale: *mut Free = ptr::null_mut();
            {
                let mut list = list.lock().unwrap_or_else(|e| e.into_inner());
                // Newest first: cut the list after the last block young enough to keep.
                let mut link: *mut *mut Free = &mut list.head;
                // SAFETY: every pointer in the list is a kept block holding a Free header.
                unsafe {
                    while !(*link).is_null() && now.saturating_sub((**link).freed_at_ms) < idle_ms {
                        link = &mut (**link).next;
                    }
                    ptr::swap(&mut stale, link);
                }
            }
            let size = class_size(class);
            while !stale.is_null() {
                // SAFETY: `stale` was cut off the list above, so nothing else reaches it; it
                // was allocated from System with the class layout.
                unsafe {
                    let next = (*stale).next;
                    System.dealloc(stale.cast(), class_layout(size));
                    stale = next;
                }
                self.kept.fetch_sub(size, Ordering::Relaxed);
                self.released.fetch_add(size as u64, Ordering::Relaxed);
            }
        }
    }

    /// Allocates `layout`: a kept block of its class when there is one. A large block is
    /// charged to the thread's allocation scope first, when a kernel runs on it
    /// ([`memory::AllocationScope`]).
    ///
    /// # Safety
    /// As [`GlobalAlloc::alloc`].
    pub unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        memory::charge_allocation(layout.size());
        self.alloc_block(layout)
    }

    /// [`alloc`](Self::alloc), uncharged.
    unsafe fn alloc_block(&self, layout: Layout) -> *mut u8 {
        match class_of(layout) {
            Some(class) => self.take(class).unwrap_or_else(|| {
                self.fresh.fetch_add(1, Ordering::Relaxed);
                System.alloc(class_layout(class_size(class)))
            }),
            None => System.alloc(layout),
        }
    }

    /// Allocates `layout` zeroed. A fresh block comes zeroed from the system without being
    /// touched; a kept one is cleared.
    ///
    /// # Safety
    /// As [`GlobalAlloc::alloc_zeroed`].
    pub unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        memory::charge_allocation(layout.size());
        match class_of(layout) {
            Some(class) => match self.take(class) {
                Some(block) => {
                    ptr::write_bytes(block, 0, layout.size());
                    block
                }
                None => {
                    self.fresh.fetch_add(1, Ordering::Relaxed);
                    System.alloc_zeroed(class_layout(class_size(class)))
                }
            },
            None => System.alloc_zeroed(layout),
        }
    }

    /// Frees a block [`alloc`](Self::alloc) gave for `layout`: a large one is kept while the
    /// pool has room.
    ///
    /// # Safety
    /// As [`GlobalAlloc::dealloc`].
    pub unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        memory::give_back_allocation(layout.size());
        match class_of(layout) {
            Some(class) => self.keep(class, block),
            None => System.dealloc(block, layout),
        }
    }

    /// Resizes a block: in place when the new size falls in the same class. A block left
    /// behind by a move goes back to the system, not into the pool: a buffer that grows (an
    /// encoder's, a vector's) would otherwise leave one kept block in every class it passed.
    ///
    /// # Safety
    /// As [`GlobalAlloc::realloc`].
    pub unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        memory::give_back_allocation(layout.size());
        memory::charge_allocation(new_size);
        match (class_of(layout), class_of(new_layout)) {
            (None, None) => System.realloc(block, layout, new_size),
            (Some(old), Some(new)) if old == new => block,
            (old, _) => {
                let moved = self.alloc_block(new_layout);
                if !moved.is_null() {
                    ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size));
                    match old {
                        Some(class) => self.release(class, block),
                        None => System.dealloc(block, layout),
                    }
                }
                moved
            }
        }
    }

    /// A kept block of `class`, newest first.
    fn take(&self, class: usize) -> Option<*mut u8> {
        self.maybe_release_idle();
        let block = {
            let mut list = self.classes[class]
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let head = list.head;
            if head.is_null() {
                return None;
            }
            // SAFETY: a listed block holds a Free header.
            list.head = unsafe { (*head).next };
            head
        };
        self.kept.fetch_sub(class_size(class), Ordering::Relaxed);
        self.reused.fetch_add(1, Ordering::Relaxed);
        Some(block.cast())
    }

    /// Keeps a freed block of `class`, or gives it to the system when the pool is full.
    fn keep(&self, class: usize, block: *mut u8) {
        self.keep_at(class, block, now_ms());
        self.maybe_release_idle();
    }

    /// [`keep`](Self::keep), the block freed at `freed_at_ms`.
    fn keep_at(&self, class: usize, block: *mut u8, freed_at_ms: u64) {
        let size = class_size(class);
        let capacity = self.capacity();
        let kept = self
            .kept
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |kept| {
                kept.checked_add(size).filter(|&k| k <= capacity)
            })
            .is_ok();
        if !kept {
            self.release(class, block);
            return;
        }
        let free = block.cast::<Free>();
        {
            let mut list = self.classes[class]
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            // SAFETY: the block is at least MIN_BYTES and ALIGN-aligned, ours until taken.
            unsafe {
                free.write(Free {
                    next: list.head,
                    freed_at_ms,
                })
            };
            list.head = free;
        }
    }

    /// Gives a block of `class` back to the system.
    fn release(&self, class: usize, block: *mut u8) {
        let size = class_size(class);
        self.released.fetch_add(size as u64, Ordering::Relaxed);
        // SAFETY: pooled blocks are allocated from System with their class layout.
        unsafe { System.dealloc(block, class_layout(size)) };
    }

    /// Releases idle blocks when the last look was more than [`TRIM_EVERY_MS`] ago.
    fn maybe_release_idle(&self) {
        let now = now_ms();
        let last = self.last_trim_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= TRIM_EVERY_MS
            && self
                .last_trim_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.release_idle(IDLE_MS);
        }
    }
}

/// Starts, once per process, a thread that gives [`HOST_POOL`]'s idle blocks back every
/// [`IDLE_MS`]: pool operations look for them too, but a task that has stopped allocating
/// large buffers makes none.
pub fn start_releasing_idle() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("tessera-host-pool".into())
            .spawn(|| loop {
                std::thread::sleep(std::time::Duration::from_millis(IDLE_MS));
                HOST_POOL.release_idle(IDLE_MS);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no thread to release the host pool's idle blocks; \
                 they go back when the pool is next used");
        }
    });
}

/// The class of a layout the pool serves; `None` for small, over-aligned or huge ones.
fn class_of(layout: Layout) -> Option<usize> {
    let size = layout.size();
    if size < MIN_BYTES || layout.align() > ALIGN || size > 1 << MAX_LOG2 {
        return None;
    }
    let log2 = usize::BITS as usize - 1 - size.leading_zeros() as usize;
    let step = 1usize << (log2 - STEPS.trailing_zeros() as usize);
    let steps = size.div_ceil(step);
    // `steps` is in STEPS..=2*STEPS; 2*STEPS is the next power of two's first class.
    Some((log2 - MIN_LOG2) * STEPS + steps - STEPS)
}

/// The bytes of every block of `class`.
fn class_size(class: usize) -> usize {
    let log2 = MIN_LOG2 + class / STEPS;
    let step = 1usize << (log2 - STEPS.trailing_zeros() as usize);
    (STEPS + class % STEPS) * step
}

fn class_layout(size: usize) -> Layout {
    // SAFETY: ALIGN is a power of two and class sizes are multiples of it, far below isize::MAX.
    unsafe { Layout::from_size_align_unchecked(size, ALIGN) }
}

/// Milliseconds since the pool was first used.
fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// The smaller of [`DEFAULT_CAPACITY`] and the host's memory over [`DEFAULT_SHARE_OF_HOST`].
fn default_capacity() -> usize {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    match (usize::try_from(pages), usize::try_from(page)) {
        (Ok(pages), Ok(page)) if pages > 0 && page > 0 => {
            DEFAULT_CAPACITY.min(pages.saturating_mul(page) / DEFAULT_SHARE_OF_HOST)
        }
        _ => DEFAULT_CAPACITY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(bytes: usize) -> Layout {
        Layout::from_size_align(bytes, 4).unwrap()
    }

    #[test]
    fn classes_cover_every_large_size_with_at_most_an_eighth_to_spare() {
        assert_eq!(class_of(layout(MIN_BYTES - 1)), None);
        assert_eq!(class_of(layout(MIN_BYTES)), Some(0));
        assert_eq!(class_size(0), MIN_BYTES);
        for size in [
            MIN_BYTES + 1,
            300_000,
            1 << 20,
            (1 << 20) + 1,
            37_748_736,
            (3 << 29) + 7,
        ] {
            let class = class_of(layout(size)).unwrap();
            let block = class_size(class);
            assert!(
                block >= size && block - size <= size / 8,
                "{size} -> {block}"
            );
            assert_eq!(block % ALIGN, 0);
            // The block's own size is of the same class.
            assert_eq!(class_of(layout(block)), Some(class), "{size}");
        }
        // Over-aligned and huge layouts are not pooled.
        assert_eq!(
            class_of(Layout::from_size_align(1 << 20, 4096).unwrap()),
            None
        );
        assert_eq!(class_of(layout((1 << MAX_LOG2) + 1)), None);
    }

    #[test]
    fn a_freed_large_block_is_handed_out_again_and_small_ones_are_not_kept() {
        let pool = HostPool::new();
        unsafe {
            let a = pool.alloc(layout(1 << 20));
            assert!(!a.is_null());
            assert_eq!(a as usize % ALIGN, 0);
            a.write_bytes(7, 1 << 20);
            pool.dealloc(a, layout(1 << 20));
            assert_eq!(pool.stats().kept_bytes, 1 << 20);
            // A slightly smaller request of the same class gets the same block, zeroed when
            // asked.
            let b = pool.alloc_zeroed(layout((1 << 20) - 100));
            assert_eq!(b, a);
            let bytes = std::slice::from_raw_parts(b, (1 << 20) - 100);
            assert!(bytes.iter().all(|&x| x == 0));
            assert_eq!(
                pool.stats(),
                PoolStats {
                    reused: 1,
                    fresh: 1,
                    kept_bytes: 0,
                    released_bytes: 0
                }
            );
            pool.dealloc(b, layout((1 << 20) - 100));

            let small = pool.alloc(layout(1000));
            pool.dealloc(small, layout(1000));
            assert_eq!(pool.stats().kept_bytes, 1 << 20);
            pool.release_idle(0);
            assert_eq!(pool.stats().kept_bytes, 0);
            assert_eq!(pool.stats().released_bytes, 1 << 20);
        }
    }

    #[test]
    fn the_pool_keeps_no_more_than_its_capacity() {
        let pool = HostPool::new();
        pool.set_capacity(3 << 20);
        unsafe {
            let blocks: Vec<*mut u8> = (0..5).map(|_| pool.alloc(layout(1 << 20))).collect();
            for &b in &blocks {
                pool.dealloc(b, layout(1 << 20));
            }
            let stats = pool.stats();
            assert_eq!(stats.kept_bytes, 3 << 20);
            assert_eq!(stats.released_bytes, 2 << 20);
            // Lowering the capacity gives back what no longer fits.
            pool.set_capacity(0);
            assert_eq!(pool.stats().kept_bytes, 0);
            let again = pool.alloc(layout(1 << 20));
            assert_eq!(pool.stats().fresh, 6);
            pool.dealloc(again, layout(1 << 20));
            assert_eq!(pool.stats().kept_bytes, 0);
        }
    }

    #[test]
    fn realloc_keeps_the_contents_across_classes_and_the_block_within_one() {
        let pool = HostPool::new();
        unsafe {
            let a = pool.alloc(layout(100));
            a.write_bytes(3, 100);
            // Small to large, large within its class, large to small.
            let b = pool.realloc(a, layout(100), (1 << 20) + 1000);
            assert!(std::slice::from_raw_parts(b, 100).iter().all(|&x| x == 3));
            b.add(100).write_bytes(5, (1 << 20) + 900);
            let c = pool.realloc(b, layout((1 << 20) + 1000), (1 << 20) + 2000);
            assert_eq!(c, b, "same class: same block");
            let d = pool.realloc(c, layout((1 << 20) + 2000), 200);
            let bytes = std::slice::from_raw_parts(d, 200);
            assert!(bytes[..100].iter().all(|&x| x == 3));
            assert!(bytes[100..].iter().all(|&x| x == 5));
            pool.dealloc(d, layout(200));
            // The large block the buffer moved out of went back to the system, not the pool.
            let class = class_of(layout((1 << 20) + 2000)).unwrap();
            assert_eq!(pool.stats().kept_bytes, 0);
            assert_eq!(pool.stats().released_bytes, class_size(class) as u64);
        }
    }

    #[test]
    fn blocks_idle_past_the_limit_go_back_and_recent_ones_stay() {
        let pool = HostPool::new();
        unsafe {
            let old = pool.alloc(layout(1 << 20));
            pool.keep_at(class_of(layout(1 << 20)).unwrap(), old, 0);
            let recent = pool.alloc(layout(2 << 20));
            pool.keep_at(class_of(layout(2 << 20)).unwrap(), recent, 50_000);
            // At 50.005 s, with 10 s allowed idle: the block freed at 0 goes.
            pool.release_idle_at(50_005, IDLE_MS);
            assert_eq!(pool.stats().kept_bytes, 2 << 20);
            pool.release_idle(0);
            assert_eq!(pool.stats().kept_bytes, 0);
        }
    }

    #[test]
    fn threads_share_the_pool_without_losing_blocks() {
        let pool = HostPool::new();
        std::thread::scope(|s| {
            for t in 0..4 {
                let pool = &pool;
                s.spawn(move || unsafe {
                    for i in 0..200 {
                        let size = (1 << 20) + (t * 200 + i) % 5 * 300_000;
                        let b = pool.alloc(layout(size));
                        b.write_bytes(t as u8, size);
                        assert!(std::slice::from_raw_parts(b, size)
                            .iter()
                            .all(|&x| x == t as u8));
                        pool.dealloc(b, layout(size));
                    }
                });
            }
        });
        let stats = pool.stats();
        assert_eq!(stats.reused + stats.fresh, 800);
        assert!(stats.reused > 700, "{stats:?}");
        pool.release_idle(0);
        assert_eq!(pool.stats().kept_bytes, 0);
    }
}
