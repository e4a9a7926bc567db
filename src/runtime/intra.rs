//! The intra-op pool: the threads one kernel splits its work over (a matrix product's blocks,
//! a convolution's images, an element-wise op's ranges), one pool per device, as TensorFlow
//! gives each device an intra-op thread pool beside its inter-op executor threads.
//!
//! The executor's threads (`runtime::pool`) pick nodes; a kernel whose work is large enough
//! hands pieces of it to this pool and waits for them. The split follows a cost per unit of
//! work, as Eigen's `parallelFor` does: work under [`MIN_PIECE_CYCLES`] in all runs inline on
//! the calling thread, so the many tiny nodes of a small model's step never pay for a hand-off;
//! larger work is cut into at most one piece per thread, each of at least that cost.
//!
//! The pool is a rayon pool of fixed size (about one thread per core). Its jobs only compute:
//! they never wait for another node, a rendezvous or a lock another step holds, so a fixed
//! size cannot starve (the executor's pool, whose jobs may block, is the one that grows). A
//! kernel waiting for its pieces is not marked `pool::blocking`: its pieces keep the cores
//! busy meanwhile, and starting another executor thread would only oversubscribe them.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::device::memory::ScopeHandle;

/// Cycles of work below which a kernel runs inline, and the least work a piece is given: a
/// hand-off to a pool thread and back costs a few microseconds, about this much work.
pub const MIN_PIECE_CYCLES: f64 = 40_000.0;

/// A device's intra-op threads.
pub struct IntraPool {
    pool: rayon::ThreadPool,
    threads: usize,
    /// Kernels of the device's steps running now ([`Self::running`]): what [`Self::share`]
    /// reads to tell whether a core is idle.
    running: AtomicUsize,
}

impl std::fmt::Debug for IntraPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntraPool")
            .field("threads", &self.threads)
            .finish()
    }
}

impl IntraPool {
    /// A pool of `threads` threads (at least one) named `{name}-{i}`.
    pub fn new(name: &str, threads: usize) -> Arc<Self> {
        let threads = threads.max(1);
        let prefix = name.to_string();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(move |i| format!("{prefix}-{i}"))
            .build()
            .unwrap_or_else(|e| panic!("cannot start the intra-op threads `{name}`: {e}"));
        Arc::new(Self {
            pool,
            threads,
            running: AtomicUsize::new(0),
        })
    }

    /// The process's pool for devices that have none of their own (an in-process session's),
    /// one thread per core.
    pub fn global() -> &'static Arc<IntraPool> {
        static GLOBAL: OnceLock<Arc<IntraPool>> = OnceLock::new();
        GLOBAL.get_or_init(|| IntraPool::new("tessera-intra", default_threads()))
    }

    /// How many threads the pool has.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Counts a kernel of the device as running until the guard drops: the executor holds one
    /// around each kernel it runs on the device, so that [`Self::share`] offers pieces to the
    /// pool only when a core is idle.
    pub fn running(&self) -> Running<'_> {
        self.running.fetch_add(1, Ordering::Relaxed);
        Running(&self.running)
    }

    /// How many pieces `units` units of `cycles_per_unit` each are worth cutting into: 1 for
    /// work under [`MIN_PIECE_CYCLES`], else at most one per thread and per unit.
    pub fn pieces(&self, units: usize, cycles_per_unit: f64) -> usize {
        let total = units as f64 * cycles_per_unit.max(0.0);
        if total < MIN_PIECE_CYCLES || self.threads == 1 || units < 2 {
            return 1;
        }
        let worth = (total / MIN_PIECE_CYCLES) as usize;
        worth.clamp(1, self.threads).min(units)
    }

    /// Runs `f` over `0..units`, cut into [`Self::pieces`] consecutive ranges run on the pool
    /// (inline when one piece). Returns when every piece has run; a panic in a piece goes on
    /// here.
    pub fn parallel_for(
        &self,
        units: usize,
        cycles_per_unit: f64,
        f: impl Fn(Range<usize>) + Sync,
    ) {
        let pieces = self.pieces(units, cycles_per_unit);
        if pieces <= 1 {
            if units > 0 {
                f(0..units);
            }
            return;
        }
        let f = &f;
        let charged = ScopeHandle::current();
        self.pool.scope(|scope| {
            for range in split(units, pieces) {
                // SAFETY: the pieces end before `scope` returns, inside the kernel's run.
                scope.spawn(move |_| unsafe { charged.run(|| f(range)) });
            }
        });
    }

    /// Runs `f(first, chunk)` over `data` cut into [`Self::pieces`] chunks of whole units of
    /// `unit` elements (`first`: the index of the chunk's first unit), on the pool (inline
    /// when one piece). `data.len()` must be a multiple of `unit`.
    pub fn for_chunks<T: Send>(
        &self,
        data: &mut [T],
        unit: usize,
        cycles_per_unit: f64,
        f: impl Fn(usize, &mut [T]) + Sync,
    ) {
        let unit = unit.max(1);
        debug_assert_eq!(data.len() % unit, 0, "whole units");
        let units = data.len() / unit;
        let pieces = self.pieces(units, cycles_per_unit);
        if pieces <= 1 {
            f(0, data);
            return;
        }
        let f = &f;
        let charged = ScopeHandle::current();
        self.pool.scope(|scope| {
            let mut rest = data;
            for range in split(units, pieces) {
                let (chunk, tail) = std::mem::take(&mut rest).split_at_mut(range.len() * unit);
                rest = tail;
                // SAFETY: the pieces end before `scope` returns, inside the kernel's run.
                scope.spawn(move |_| unsafe { charged.run(|| f(range.start, chunk)) });
            }
        });
    }

    /// `f` of each item on the pool (inline when there is one); the results in order.
    pub fn map<I: Send, R: Send>(&self, items: Vec<I>, f: impl Fn(I) -> R + Sync) -> Vec<R> {
        if items.len() <= 1 {
            return items.into_iter().map(f).collect();
        }
        let f = &f;
        let mut results: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
        let charged = ScopeHandle::current();
        self.pool.scope(|scope| {
            for (item, slot) in items.into_iter().zip(results.iter_mut()) {
                // SAFETY: the pieces end before `scope` returns, inside the kernel's run.
                scope.spawn(move |_| unsafe { charged.run(|| *slot = Some(f(item))) });
            }
        });
        results
            .into_iter()
            .map(|r| r.expect("every piece ran"))
            .collect()
    }

    /// Runs `piece(i)` for every `i` in `0..pieces`, shared with the pool's idle threads: the
    /// calling thread takes pieces in turn, and up to `helpers` pool threads take them too, one
    /// for each core idle when it is called (one the device's running kernels,
    /// [`Self::running`], the caller's among them, do not hold). Returns when every piece has
    /// run; it waits only for pieces a helper has started, never for a helper that has not (a
    /// pool busy with other kernels leaves the caller to run every piece itself, at the cost of
    /// one queued job per helper). A helper that starts after the last piece was taken does
    /// nothing: `piece` is never called after `share` returns, so it may hold the addresses of
    /// the caller's buffers (it is `'static` only because a late helper drops it). A panic in
    /// a piece goes on here once the started pieces have ended.
    ///
    /// What a matrix product of a step's recurrence uses (see `kernels::cpu::gemm`): split
    /// outright, it waits for its slowest piece while the step's other nodes hold the cores;
    /// run whole, it leaves an idle core idle.
    pub fn share(
        &self,
        pieces: usize,
        helpers: usize,
        piece: impl Fn(usize) + Send + Sync + 'static,
    ) {
        // The cores no kernel holds: one per thread of the pool, less the running kernels (the
        // caller's own counted as one when it runs outside a step).
        let idle = self
            .threads
            .saturating_sub(self.running.load(Ordering::Relaxed).max(1));
        let helpers = helpers.min(idle).min(pieces.saturating_sub(1));
        if helpers == 0 || self.pool.current_thread_index().is_some() {
            // One piece, no idle core (the kernels beside this one hold them, and a helper
            // would only take turns with them), or a kernel already running on this pool (its
            // pieces would wait for threads the caller holds): all inline.
            (0..pieces).for_each(piece);
            return;
        }
        let shared = Arc::new(Shared {
            piece,
            pieces,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            caller: std::thread::current(),
            charged: ScopeHandle::current(),
        });
        for _ in 0..helpers {
            let shared = Arc::clone(&shared);
            // A panicking piece marks the share failed as it unwinds; the caller panics with
            // it (a panic left to rayon would abort the process).
            self.pool.spawn(move || {
                let take = std::panic::AssertUnwindSafe(|| shared.take_pieces());
                let _ = std::panic::catch_unwind(take);
            });
        }
        // Waits (also when a piece of the caller's panics) for the pieces helpers started.
        let _wait = WaitForPieces(&shared);
        shared.take_pieces();
    }

    /// Runs `f` on the pool, so that rayon-parallel code inside it (the GEMM's) uses these
    /// threads.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let charged = ScopeHandle::current();
        // SAFETY: `install` returns when `f` has run, inside the kernel's run.
        self.pool.install(move || unsafe { charged.run(f) })
    }
}

/// A running kernel, counted by [`IntraPool::running`] until dropped.
pub struct Running<'a>(&'a AtomicUsize);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The pieces of one [`IntraPool::share`], held by the caller and each helper.
struct Shared<F> {
    piece: F,
    pieces: usize,
    /// The next piece to take; at or past `pieces` once every piece is taken (or the caller
    /// closed the share).
    next: AtomicUsize,
    /// How many pieces have ended (run, failed, or closed untaken).
    done: AtomicUsize,
    failed: AtomicBool,
    caller: std::thread::Thread,
    charged: ScopeHandle,
}

/// What `next` is set to when the caller closes a share: far past any piece, and far from
/// overflowing as late helpers add to it.
const CLOSED: usize = usize::MAX / 2;

impl<F: Fn(usize)> Shared<F> {
    /// Runs pieces until none is left to take.
    fn take_pieces(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::AcqRel);
            if i >= self.pieces {
                return;
            }
            let ended = PieceEnded(self);
            // SAFETY: the caller is inside `share` until this piece ends (it waits for every
            // piece taken), so its allocation scope is alive.
            unsafe { self.charged.run(|| (self.piece)(i)) };
            drop(ended);
        }
    }

    /// Counts `n` pieces as ended, waking the caller when they are the last.
    fn end(&self, n: usize) {
        if n > 0 && self.done.fetch_add(n, Ordering::AcqRel) + n == self.pieces {
            self.caller.unpark();
        }
    }
}

/// Ends a piece when it returns or unwinds.
struct PieceEnded<'a, F: Fn(usize)>(&'a Shared<F>);

impl<F: Fn(usize)> Drop for PieceEnded<'_, F> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.failed.store(true, Ordering::Release);
        }
        self.0.end(1);
    }
}

/// The caller's end of a share: closes it (pieces no one took end untaken) and waits for the
/// pieces helpers are running.
struct WaitForPieces<'a, F: Fn(usize)>(&'a Shared<F>);

impl<F: Fn(usize)> Drop for WaitForPieces<'_, F> {
    fn drop(&mut self) {
        let shared = self.0;
        let taken = shared
            .next
            .swap(CLOSED, Ordering::AcqRel)
            .min(shared.pieces);
        shared.end(shared.pieces - taken);
        while shared.done.load(Ordering::Acquire) < shared.pieces {
            // A piece that ends last unparks this thread; a wake-up for anything else loops.
            std::thread::park();
        }
        if shared.failed.load(Ordering::Acquire) && !std::thread::panicking() {
            panic!("a piece of a kernel shared with the intra-op threads panicked");
        }
    }
}

/// One thread per core (what `std::thread::available_parallelism` reports: the cores this
/// process may run on, `taskset` and cgroup quotas included).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `0..units` cut into `pieces` consecutive ranges as equal as can be, the first ones one
/// longer.
pub fn split(units: usize, pieces: usize) -> impl Iterator<Item = Range<usize>> {
    let pieces = pieces.clamp(1, units.max(1));
    let (base, extra) = (units / pieces, units % pieces);
    (0..pieces).scan(0, move |at, i| {
        let len = base + usize::from(i < extra);
        let range = *at..*at + len;
        *at += len;
        Some(range)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_charge_the_allocation_scope_of_the_kernel_that_split_them() {
        use crate::device::host_pool::HostPool;
        use crate::device::memory::{AllocationScope, MemoryBudget};
        use std::alloc::Layout;
        static POOL: HostPool = HostPool::new();
        let pool = IntraPool::new("test-scope", 2);
        let budget = MemoryBudget::new("/device:CPU:0", 64 << 20);
        let scope = AllocationScope::new(&budget);
        let layout = Layout::from_size_align(1 << 20, 8).unwrap();
        let blocks = std::sync::Mutex::new(Vec::new());
        // SAFETY: every block is freed once below, with this layout.
        let alloc = || {
            blocks
                .lock()
                .unwrap()
                .push(unsafe { POOL.alloc(layout) } as usize)
        };
        scope.run(|| {
            pool.parallel_for(4, MIN_PIECE_CYCLES, |range| range.for_each(|_| alloc()));
            pool.for_chunks(&mut [0u8; 2], 1, MIN_PIECE_CYCLES, |_, _| alloc());
            let _ = pool.map(vec![(), ()], |()| alloc());
            pool.install(alloc);
        });
        assert_eq!(
            budget.in_use(),
            9 << 20,
            "every piece charged the kernel's scope"
        );
        assert_eq!(scope.finish(), None);
        assert_eq!(budget.in_use(), 0);
        for b in blocks.into_inner().unwrap() {
            // SAFETY: allocated above with this layout.
            unsafe { POOL.dealloc(b as *mut u8, layout) };
        }
    }
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    #[test]
    fn small_work_runs_inline_and_large_work_splits_over_the_threads() {
        let pool = IntraPool::new("test-intra", 4);
        assert_eq!(pool.pieces(10, 1.0), 1, "10 adds stay inline");
        assert_eq!(pool.pieces(1 << 20, 1.0), 4);
        assert_eq!(pool.pieces(3, 1e9), 3, "never more pieces than units");
        assert_eq!(
            pool.pieces(100, 800.0),
            2,
            "80,000 cycles: two pieces' worth"
        );

        let caller = std::thread::current().id();
        let seen = Mutex::new(Vec::new());
        pool.parallel_for(10, 1.0, |r| {
            seen.lock().unwrap().push((r, std::thread::current().id()))
        });
        assert_eq!(*seen.lock().unwrap(), vec![(0..10, caller)]);

        let covered = AtomicUsize::new(0);
        let names = Mutex::new(std::collections::BTreeSet::new());
        pool.parallel_for(1 << 20, 1.0, |r| {
            covered.fetch_add(r.len(), Ordering::Relaxed);
            let name = std::thread::current().name().map(str::to_string);
            names.lock().unwrap().insert(name.unwrap_or_default());
        });
        assert_eq!(covered.load(Ordering::Relaxed), 1 << 20);
        assert!(names
            .lock()
            .unwrap()
            .iter()
            .all(|n| n.starts_with("test-intra-")));
    }

    #[test]
    fn map_keeps_the_order_and_split_covers_every_unit() {
        let pool = IntraPool::new("test-map", 2);
        assert_eq!(
            pool.map((0..9).collect(), |i| i * i),
            (0..9).map(|i| i * i).collect::<Vec<_>>()
        );
        let ranges: Vec<_> = split(32, 3).collect();
        assert_eq!(ranges, vec![0..11, 11..22, 22..32]);
        assert_eq!(split(2, 4).collect::<Vec<_>>(), vec![0..1, 1..2]);
        assert_eq!(split(0, 2).collect::<Vec<_>>(), vec![0..0]);
    }

    #[test]
    fn chunks_cover_the_data_in_whole_units() {
        let pool = IntraPool::new("test-chunks", 3);
        let mut data = vec![0usize; 3 * 100_000];
        pool.for_chunks(&mut data, 3, 10.0, |first, chunk| {
            assert_eq!(chunk.len() % 3, 0);
            for (i, v) in chunk.iter_mut().enumerate() {
                *v = first * 3 + i;
            }
        });
        assert!(data.iter().enumerate().all(|(i, &v)| i == v));
        let mut small = vec![1u8; 12];
        pool.for_chunks(&mut small, 4, 1.0, |first, chunk| {
            assert_eq!((first, chunk.len()), (0, 12), "one piece, inline");
        });
    }

    #[test]
    fn idle_threads_take_pieces_of_a_shared_kernel() {
        let pool = IntraPool::new("test-share", 2);
        let caller = std::thread::current().id();
        let ran: Arc<Mutex<Vec<(usize, std::thread::ThreadId)>>> = Arc::default();
        let helped = Arc::new(AtomicBool::new(false));
        let (record, seen) = (Arc::clone(&ran), Arc::clone(&helped));
        pool.share(4, 1, move |i| {
            let me = std::thread::current().id();
            if me != caller {
                seen.store(true, Ordering::Release);
            } else {
                // The caller's first piece holds it until a helper has taken another one.
                let deadline = Instant::now() + Duration::from_secs(30);
                while !seen.load(Ordering::Acquire) && Instant::now() < deadline {
                    std::thread::yield_now();
                }
            }
            record.lock().unwrap().push((i, me));
        });
        let mut ran = ran.lock().unwrap().clone();
        assert!(helped.load(Ordering::Acquire), "no helper took a piece");
        assert!(ran.iter().any(|&(_, t)| t != caller) && ran.iter().any(|&(_, t)| t == caller));
        ran.sort_by_key(|&(i, _)| i);
        assert_eq!(
            ran.iter().map(|&(i, _)| i).collect::<Vec<_>>(),
            vec![0, 1, 2, 3]
        );
    }

    #[test]
    fn a_busy_pool_leaves_every_piece_to_the_caller_and_never_runs_one_late() {
        let pool = IntraPool::new("test-busy", 2);
        // The pool's threads are held (by jobs of a kernel that is not a step's, so the cores
        // count as idle) until the share has returned.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let held = Arc::new(Mutex::new(held));
        let (started, wait_started) = std::sync::mpsc::channel();
        for _ in 0..2 {
            let (held, started) = (Arc::clone(&held), started.clone());
            pool.pool.spawn(move || {
                started.send(()).unwrap();
                let _ = held.lock().unwrap().recv_timeout(Duration::from_secs(30));
            });
        }
        for _ in 0..2 {
            wait_started.recv_timeout(Duration::from_secs(30)).unwrap();
        }
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let caller = std::thread::current().id();
        // The pieces' closure, and so this token, lives until the queued helper has run.
        let token = Arc::new(());
        let held_by_pieces = Arc::clone(&token);
        pool.share(5, 1, move |_| {
            let _ = &held_by_pieces;
            assert_eq!(std::thread::current().id(), caller);
            counted.fetch_add(1, Ordering::AcqRel);
        });
        assert_eq!(calls.load(Ordering::Acquire), 5);
        assert!(
            Arc::strong_count(&token) > 1,
            "the helper was queued and has not run"
        );
        // Let the queued helper run: it finds nothing to take.
        release.send(()).unwrap();
        release.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Arc::strong_count(&token) > 1 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(Arc::strong_count(&token), 1, "the helper never ran");
        assert_eq!(
            calls.load(Ordering::Acquire),
            5,
            "a piece ran after share returned"
        );
    }

    #[test]
    fn with_every_core_running_a_kernel_the_caller_runs_every_piece() {
        let pool = IntraPool::new("test-all-busy", 2);
        let _this = pool.running();
        let beside = pool.running();
        let caller = std::thread::current().id();
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let threads: Arc<Mutex<Vec<_>>> = Arc::default();
        let seen = Arc::clone(&threads);
        pool.share(4, 1, move |i| {
            seen.lock().unwrap().push(std::thread::current().id());
            if i == 0 {
                // Time enough for a helper, were one offered, to take a piece meanwhile.
                let until = Instant::now() + Duration::from_millis(200);
                while Instant::now() < until {
                    std::thread::yield_now();
                }
            }
            counted.fetch_add(1, Ordering::AcqRel);
        });
        assert_eq!(calls.load(Ordering::Acquire), 4);
        assert!(
            threads.lock().unwrap().iter().all(|&t| t == caller),
            "a helper took a piece"
        );
        drop(beside);
        assert_eq!(pool.running.load(Ordering::Relaxed), 1);
    }

    #[test]
    #[should_panic(expected = "shared with the intra-op threads panicked")]
    fn a_panic_in_a_piece_a_helper_took_reaches_the_caller() {
        let caller = std::thread::current().id();
        let helper_started = Arc::new(AtomicBool::new(false));
        IntraPool::new("test-helper-panic", 2).share(2, 1, move |_| {
            if std::thread::current().id() != caller {
                helper_started.store(true, Ordering::Release);
                panic!("piece failed");
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            while !helper_started.load(Ordering::Acquire) && Instant::now() < deadline {
                std::thread::yield_now();
            }
        });
    }

    #[test]
    #[should_panic(expected = "piece failed")]
    fn a_panic_in_a_piece_of_the_caller_reaches_it() {
        IntraPool::new("test-share-panic", 2).share(3, 1, |i| assert!(i != 0, "piece failed"));
    }

    #[test]
    #[should_panic(expected = "piece failed")]
    fn a_panic_in_a_piece_reaches_the_caller() {
        IntraPool::new("test-panic", 2).parallel_for(1 << 20, 1.0, |r| {
            assert!(r.start != 0, "piece failed");
        });
    }
}
