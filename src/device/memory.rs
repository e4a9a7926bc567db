//! Device memory accounting: how many bytes a device's steps hold, against its limit.
//!
//! Every device type goes through the same [`MemoryBudget`]: the executor charges the buffers a
//! kernel allocates on its device before it keeps them (see `exec::executor`), and the GPU
//! kernels charge their device buffers the same way, so a step that would go over a GPU's
//! `gpu_memory_fraction` (or a CPU's configured limit) fails with RESOURCE_EXHAUSTED naming the
//! node, the bytes it asked for and the limit, instead of crashing the process in the driver or
//! the allocator.
//!
//! A [`Charge`] gives its bytes back when dropped, so the accounting follows the tensors' life
//! in the step: a kernel's outputs are charged when it finishes and released after their last
//! reader; a view of an input (an output whose buffer lies inside one of the kernel's inputs)
//! is not charged. Variables live between steps: each resource store on the device reports the
//! bytes its variables hold ([`MemoryBudget::set_resident`]), and those count against the limit
//! too. Kernels that allocate an output from a shape they are given check it fits
//! ([`MemoryBudget::check_fits`]) before allocating.
//!
//! On a CPU device the allocator charges as it allocates, too: while a kernel runs, every
//! host block of [`MIN_BYTES`] and up it allocates (its outputs, and scratch such as a
//! convolution's patch matrix) is charged to the device's budget the moment it is allocated,
//! on the kernel's thread and on the intra-op threads it splits its work over
//! ([`AllocationScope`]), and given back when freed inside the kernel. Kernels running side by
//! side thus see each other's buffers, and a kernel whose buffers would take the device over
//! its limit fails with RESOURCE_EXHAUSTED naming it. (Rust's allocation cannot fail back into
//! a kernel that did not ask for a fallible one, so such a block is still allocated and the
//! step fails when the kernel returns; outputs far past the host's memory are refused before
//! the kernel runs, by the executor's admission.) The host pool's idle blocks count too: a
//! charge that needs their room makes the pool give them back to the system
//! ([`MemoryBudget::for_host`]), so what the device holds and what the pool keeps stay under
//! the limit together.

use std::cell::Cell;
use std::collections::HashMap;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::host_pool::{HostPool, MIN_BYTES};
use crate::error::{Result, Status};

/// One device's memory limit and the bytes charged against it; shared (`Arc`) by every step on
/// the device.
#[derive(Debug)]
pub struct MemoryBudget {
    device: String,
    limit: u64,
    /// The config key that sets the limit, named in errors (`devices.cpu_memory_limit`).
    key: &'static str,
    in_use: AtomicU64,
    peak: AtomicU64,
    /// Bytes of variables, per resource store (keyed by its address), and their sum.
    resident: Mutex<HashMap<usize, u64>>,
    resident_total: AtomicU64,
    /// The host pool whose idle blocks share the limit (a CPU device's), if any.
    idle: Option<&'static HostPool>,
}

impl MemoryBudget {
    /// A budget of `limit` bytes for `device` (its full name, used in errors).
    pub fn new(device: impl Into<String>, limit: u64) -> Arc<Self> {
        Self::with_key(device, limit, "the device's memory limit")
    }

    /// A budget of `limit` bytes for `device`, set by the config key `key`, which errors name.
    pub fn with_key(device: impl Into<String>, limit: u64, key: &'static str) -> Arc<Self> {
        Arc::new(Self {
            device: device.into(),
            limit,
            key,
            in_use: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            resident: Mutex::new(HashMap::new()),
            resident_total: AtomicU64::new(0),
            idle: None,
        })
    }

    /// A host device's budget of `limit` bytes, set by `key`, that `pool`'s idle blocks share:
    /// when a charge fits only without them, the pool gives them back to the system first.
    pub fn for_host(
        device: impl Into<String>,
        limit: u64,
        key: &'static str,
        pool: &'static HostPool,
    ) -> Arc<Self> {
        let mut budget = Self::with_key(device, limit, key);
        Arc::get_mut(&mut budget).expect("a new budget").idle = Some(pool);
        budget
    }

    /// Returns the device's full name.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Returns the config key that sets the limit.
    pub fn key(&self) -> &'static str {
        self.key
    }

    /// Records that the resource store `store` (any stable id, e.g. its address) holds `bytes`
    /// of variables now; they count against the limit until replaced (0 when it goes away).
    pub fn set_resident(&self, store: usize, bytes: u64) {
        let mut resident = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        if bytes == 0 {
            resident.remove(&store);
        } else {
            resident.insert(store, bytes);
        }
        let total: u64 = resident.values().sum();
        self.resident_total.store(total, Ordering::Release);
        self.peak
            .fetch_max(self.in_use().saturating_add(total), Ordering::AcqRel);
    }

    /// Returns the bytes of variables on the device, as its stores last reported them.
    pub fn resident(&self) -> u64 {
        self.resident_total.load(Ordering::Acquire)
    }

    /// Returns the bytes of variables `store` last reported.
    pub fn resident_of(&self, store: usize) -> u64 {
        let resident = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        resident.get(&store).copied().unwrap_or(0)
    }

    /// Returns the bytes of variables every store but `store` last reported (read at once, so
    /// a concurrent report cannot make it negative).
    pub fn resident_except(&self, store: usize) -> u64 {
        let resident = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        resident
            .iter()
            .filter(|(&id, _)| id != store)
            .map(|(_, &bytes)| bytes)
            .sum()
    }

    /// Returns the bytes left under the limit now: steps' tensors and variables taken out.
    pub fn room(&self) -> u64 {
        self.limit
            .saturating_sub(self.in_use())
            .saturating_sub(self.resident())
    }

    /// Checks, without charging, that `bytes` more would fit now; the RESOURCE_EXHAUSTED of
    /// [`charge`](Self::charge) otherwise. For kernels about to allocate from a given shape.
    pub fn check_fits(&self, node: &str, op: &str, bytes: u64) -> Result<()> {
        let current = self.in_use.load(Ordering::Acquire);
        match current
            .checked_add(self.resident())
            .and_then(|c| c.checked_add(bytes))
        {
            Some(wanted) if wanted <= self.limit => Ok(()),
            _ => Err(self.exhausted(node, op, bytes, current)),
        }
    }

    /// The RESOURCE_EXHAUSTED for `bytes` more for `node` when `in_use` are charged.
    fn exhausted(&self, node: &str, op: &str, bytes: u64, in_use: u64) -> Status {
        self.exhausted_for(&format!("node `{node}` (op {op})"), bytes, in_use)
    }

    /// The RESOURCE_EXHAUSTED for a block of `bytes` that node `node` (op `op`, run on inputs
    /// of `shapes`) allocated past the limit while it ran ([`AllocationScope`]).
    pub fn refused_while_running(&self, node: &str, op: &str, shapes: &str, bytes: u64) -> Status {
        let what = format!("node `{node}` (op {op}, inputs of shapes {shapes}) while it ran");
        self.exhausted_for(&what, bytes, self.in_use())
    }

    /// The RESOURCE_EXHAUSTED for `bytes` more for `what` when `in_use` are charged.
    fn exhausted_for(&self, what: &str, bytes: u64, in_use: u64) -> Status {
        Status::resource_exhausted(format!(
            "OOM when allocating {bytes} bytes for {what} on {}: {in_use} bytes \
             are in use by steps and {} by variables, and {} is {} bytes; use a smaller batch, \
             more towers, or raise {}",
            self.device,
            self.resident(),
            self.key,
            self.limit,
            self.key
        ))
    }

    /// Returns the limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Returns the bytes charged now.
    pub fn in_use(&self) -> u64 {
        self.in_use.load(Ordering::Acquire)
    }

    /// Returns the bytes charged now with the variables: what the device holds.
    pub fn held(&self) -> u64 {
        self.in_use().saturating_add(self.resident())
    }

    /// Returns the most bytes ever held at once (step tensors and variables), as of the
    /// charges made.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Acquire)
    }

    /// Charges `bytes` for node `node` (op `op`), or fails with RESOURCE_EXHAUSTED when that
    /// would take the device over its limit; nothing is charged then.
    pub fn charge(self: &Arc<Self>, node: &str, op: &str, bytes: u64) -> Result<Charge> {
        match self.take(bytes) {
            Ok(()) => Ok(Charge {
                budget: Arc::clone(self),
                bytes,
            }),
            Err(in_use) => Err(self.exhausted(node, op, bytes, in_use)),
        }
    }

    /// Adds `bytes` to the bytes in use when they fit under the limit; the bytes in use it
    /// saw otherwise. Makes no allocation (the allocator calls it). When what the device holds
    /// and the host pool's idle blocks would go over the limit together, the pool gives its
    /// blocks back.
    fn take(&self, bytes: u64) -> std::result::Result<(), u64> {
        let mut current = self.in_use.load(Ordering::Acquire);
        let resident = self.resident();
        loop {
            let wanted = current.checked_add(bytes);
            let fits = wanted
                .and_then(|w| w.checked_add(resident))
                .is_some_and(|w| w <= self.limit);
            let (Some(wanted), true) = (wanted, fits) else {
                return Err(current);
            };
            match self.in_use.compare_exchange_weak(
                current,
                wanted,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    let held = wanted.saturating_add(resident);
                    self.peak.fetch_max(held, Ordering::AcqRel);
                    if let Some(pool) = self.idle {
                        let kept = pool.kept_bytes() as u64;
                        if kept > 0 && held.saturating_add(kept) > self.limit {
                            pool.release_idle(0);
                        }
                    }
                    return Ok(());
                }
                Err(now) => current = now,
            }
        }
    }

    /// Gives back `bytes` that [`take`](Self::take) added.
    fn give_back(&self, bytes: u64) {
        self.in_use.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// Bytes charged to a device; given back when dropped.
#[derive(Debug)]
pub struct Charge {
    budget: Arc<MemoryBudget>,
    bytes: u64,
}

impl Charge {
    /// Returns the bytes this charge holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

/// The host allocations of one kernel's run on a CPU device, charged to the device's budget as
/// the allocator makes them (see the module docs). The executor runs each kernel inside one
/// ([`run`](Self::run)); the intra-op pool carries it onto the threads a kernel splits its work
/// over ([`ScopeHandle`]).
#[derive(Debug)]
pub struct AllocationScope<'a> {
    budget: &'a MemoryBudget,
    /// Bytes this scope charged and has not given back.
    charged: AtomicU64,
    /// The first block the budget had no room for (0: none).
    refused: AtomicU64,
}

thread_local! {
    /// The scope the thread's allocations are charged to now (null: none).
    static CURRENT: Cell<*const AllocationScope<'static>> = const { Cell::new(ptr::null()) };
}

impl<'a> AllocationScope<'a> {
    /// A scope charging `budget`.
    pub fn new(budget: &'a MemoryBudget) -> Self {
        Self {
            budget,
            charged: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// Runs `f` with this thread's large allocations charged to the scope.
    pub fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        let handle = ScopeHandle((self as *const Self).cast());
        // SAFETY: `self` outlives the call, which restores the thread's scope when it returns.
        unsafe { handle.run(f) }
    }

    /// Ends the scope. What its allocations still hold (the kernel's outputs) is given back:
    /// the executor charges the outputs for as long as they live. Returns the bytes of the
    /// first block the budget had no room for, if one was refused.
    pub fn finish(self) -> Option<u64> {
        self.budget
            .give_back(self.charged.swap(0, Ordering::AcqRel));
        Some(self.refused.load(Ordering::Acquire)).filter(|&b| b > 0)
    }
}

/// The allocation scope of the current thread, to carry onto the threads a kernel splits its
/// work over: [`ScopeHandle::run`] there, inside the kernel's run.
#[derive(Clone, Copy, Debug)]
pub struct ScopeHandle(*const AllocationScope<'static>);

// SAFETY: the handle is only dereferenced by the allocator, under `run`'s contract that the
// scope is alive; AllocationScope is Sync (atomics and a shared reference).
unsafe impl Send for ScopeHandle {}
unsafe impl Sync for ScopeHandle {}

impl ScopeHandle {
    /// The current thread's scope (none outside a kernel's run).
    pub fn current() -> Self {
        Self(CURRENT.with(Cell::get))
    }

    /// Runs `f` with this thread's large allocations charged to the handle's scope.
    ///
    /// # Safety
    /// The scope must outlive the call: call it only inside the kernel's run that made the
    /// handle (a pool's pieces, which the kernel waits for).
    pub unsafe fn run<R>(self, f: impl FnOnce() -> R) -> R {
        struct Restore(*const AllocationScope<'static>);
        impl Drop for Restore {
            fn drop(&mut self) {
                CURRENT.with(|c| c.set(self.0));
            }
        }
        let _restore = Restore(CURRENT.with(|c| c.replace(self.0)));
        f()
    }
}

/// Charges a block of `bytes` the allocator is about to make to the current thread's scope,
/// if it has one and the block is large. Allocates nothing.
pub(crate) fn charge_allocation(bytes: usize) {
    with_scope(bytes, |scope| {
        if scope.budget.take(bytes as u64).is_ok() {
            scope.charged.fetch_add(bytes as u64, Ordering::AcqRel);
        } else {
            let _ = scope.refused.compare_exchange(
                0,
                bytes as u64,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    });
}

/// Gives back what the current thread's scope charged for a large block of `bytes` freed
/// inside it (at most what the scope holds: a block it did not charge may be freed there too).
pub(crate) fn give_back_allocation(bytes: usize) {
    with_scope(bytes, |scope| {
        let given = scope
            .charged
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                Some(c.saturating_sub(bytes as u64))
            })
            .map_or(0, |before| before.min(bytes as u64));
        scope.budget.give_back(given);
    });
}

/// `f` of the current thread's scope, for a block of `bytes` of at least [`MIN_BYTES`].
fn with_scope(bytes: usize, f: impl FnOnce(&AllocationScope<'_>)) {
    if bytes < MIN_BYTES {
        return;
    }
    let current = CURRENT.try_with(Cell::get).unwrap_or(ptr::null());
    // SAFETY: a thread's CURRENT is set only inside `ScopeHandle::run`, whose contract keeps
    // the scope alive until it is reset.
    if let Some(scope) = unsafe { current.as_ref() } {
        f(scope);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;

    const MIB: usize = 1 << 20;

    fn block(bytes: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(bytes, 8).unwrap()
    }

    #[test]
    fn a_scope_charges_large_blocks_as_they_are_made_and_gives_back_those_freed_in_it() {
        static POOL: HostPool = HostPool::new();
        let budget = MemoryBudget::new("/device:CPU:0", 4 * MIB as u64);
        let scope = AllocationScope::new(&budget);
        let (big, small) = (block(MIB), block(1024));
        let output = scope.run(|| {
            // SAFETY: each block is freed once, with the layout it was allocated with.
            unsafe {
                let output = POOL.alloc(big);
                let scratch = POOL.alloc_zeroed(big);
                let tiny = POOL.alloc(small);
                assert_eq!(
                    budget.in_use(),
                    2 * MIB as u64,
                    "small blocks are not charged"
                );
                POOL.dealloc(scratch, big);
                POOL.dealloc(tiny, small);
                output
            }
        });
        assert_eq!(budget.in_use(), MIB as u64);
        assert_eq!(budget.peak(), 2 * MIB as u64);
        // Outside a scope nothing is charged.
        // SAFETY: as above.
        let outside = unsafe { POOL.alloc(big) };
        assert_eq!(budget.in_use(), MIB as u64);
        // The end of the scope gives back what it still holds (the executor charges outputs).
        assert_eq!(scope.finish(), None);
        assert_eq!(budget.in_use(), 0);
        // SAFETY: as above.
        unsafe {
            POOL.dealloc(output, big);
            POOL.dealloc(outside, big);
        }
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn threads_carrying_a_scope_charge_it_and_a_block_past_the_limit_is_refused() {
        static POOL: HostPool = HostPool::new();
        let budget = MemoryBudget::new("/device:CPU:0", 3 * MIB as u64);
        let scope = AllocationScope::new(&budget);
        let barrier = std::sync::Barrier::new(3);
        let over = scope.run(|| {
            let handle = ScopeHandle::current();
            std::thread::scope(|s| {
                for _ in 0..2 {
                    // SAFETY: the threads end inside the scope's run; blocks freed once.
                    s.spawn(|| unsafe {
                        handle.run(|| {
                            let b = POOL.alloc(block(MIB));
                            barrier.wait();
                            barrier.wait();
                            POOL.dealloc(b, block(MIB));
                        })
                    });
                }
                barrier.wait();
                assert_eq!(budget.in_use(), 2 * MIB as u64, "both threads charged");
                // 2 MiB more would go over: refused (still allocated), nothing charged.
                // SAFETY: freed below with its layout.
                let over = unsafe { POOL.alloc(block(2 * MIB)) };
                assert_eq!(budget.in_use(), 2 * MIB as u64);
                barrier.wait();
                over as usize
            })
        });
        assert_eq!(budget.in_use(), 0, "the threads gave their blocks back");
        assert_eq!(scope.finish(), Some(2 * MIB as u64));
        // SAFETY: allocated above with this layout.
        unsafe { POOL.dealloc(over as *mut u8, block(2 * MIB)) };
    }

    #[test]
    fn a_host_budget_makes_the_pool_give_back_idle_blocks_when_a_charge_needs_their_room() {
        static POOL: HostPool = HostPool::new();
        POOL.set_capacity(8 * MIB);
        let budget = MemoryBudget::for_host(
            "/device:CPU:0",
            4 * MIB as u64,
            "devices.cpu_memory_limit",
            &POOL,
        );
        // SAFETY: freed once, with its layout.
        unsafe { POOL.dealloc(POOL.alloc(block(MIB)), block(MIB)) };
        assert_eq!(POOL.stats().kept_bytes, MIB);
        // 2 MiB held and 1 MiB idle fit the 4 MiB together: the pool keeps its block.
        let first = budget.charge("a", "Add", 2 * MIB as u64).unwrap();
        assert_eq!(POOL.stats().kept_bytes, MIB);
        // 3.5 MiB held would not leave the idle block room: it goes back to the system.
        let second = budget.charge("b", "Add", 3 * MIB as u64 / 2).unwrap();
        assert_eq!(POOL.stats().kept_bytes, 0);
        drop((first, second));
    }

    #[test]
    fn charges_add_up_to_the_limit_and_are_given_back_on_drop() {
        let budget = MemoryBudget::new("/job:w/replica:0/task:0/device:GPU:0", 1000);
        let a = budget.charge("a", "MatMul", 600).unwrap();
        let b = budget.charge("b", "Relu", 400).unwrap();
        assert_eq!(budget.in_use(), 1000);
        drop(a);
        assert_eq!(budget.in_use(), 400);
        let c = budget.charge("c", "Add", 600).unwrap();
        assert_eq!(budget.peak(), 1000);
        drop((b, c));
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn going_over_is_resource_exhausted_naming_node_bytes_and_limit() {
        let budget = MemoryBudget::new("/job:w/replica:0/task:0/device:GPU:0", 1000);
        let _held = budget.charge("a", "MatMul", 600).unwrap();
        let err = budget.charge("dense/MatMul", "MatMul", 401).unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted);
        for part in [
            "`dense/MatMul`",
            "401 bytes",
            "600 bytes are in use",
            "is 1000 bytes",
            "GPU:0",
        ] {
            assert!(err.message().contains(part), "{part} missing: {err}");
        }
        // The failed charge took nothing.
        assert_eq!(budget.in_use(), 600);
        let huge = budget.charge("x", "Fill", u64::MAX).unwrap_err();
        assert_eq!(huge.code(), Code::ResourceExhausted);
    }

    #[test]
    fn variables_count_against_the_limit_and_errors_name_the_key() {
        let budget = MemoryBudget::with_key(
            "/job:ps/task:0/device:CPU:0",
            1000,
            "devices.cpu_memory_limit",
        );
        budget.set_resident(1, 300);
        budget.set_resident(2, 200);
        assert_eq!(budget.resident(), 500);
        let _held = budget.charge("a", "MatMul", 500).unwrap();
        let err = budget.charge("b", "Fill", 1).unwrap_err();
        assert!(err.message().contains("500 by variables"), "{err}");
        assert!(
            err.message().contains("raise devices.cpu_memory_limit"),
            "{err}"
        );
        assert!(budget.check_fits("b", "Fill", 1).is_err());
        // A store that lets go of its variables gives their bytes back.
        assert_eq!(budget.resident_except(1), 200);
        budget.set_resident(2, 0);
        assert_eq!(budget.resident_of(2), 0);
        budget.check_fits("b", "Fill", 200).unwrap();
        budget.charge("b", "Fill", 200).unwrap();
    }
}
