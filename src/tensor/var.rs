//! A variable's storage: the one mutable place in a world of immutable tensors.
//!
//! Both kinds of TensorFlow variables keep their value here: a resource variable
//! (`VarHandleOp`) reaches it through a handle looked up in its device's resources, a
//! reference variable (`VariableV2`) through a reference tensor ([`Tensor::reference`]) that
//! flows along the graph's ref edges and aliases the storage, so that an `Assign` through one
//! ref edge is seen by every reader of another.
//!
//! The storage decision, taken once for every use:
//!
//! - **Copy-on-write snapshots.** The value is an immutable [`Tensor`] behind a lock. A read
//!   clones it (a reference count, no copy), so a reader keeps a consistent snapshot however
//!   the variable changes afterwards: a checkpoint or a `_Send` never sees half an update.
//! - **In place when nobody looks.** An update takes the value out under the write lock and
//!   writes into its buffer directly when the variable holds the only reference to it
//!   ([`Tensor::update_in_place`]); only while a snapshot is still held elsewhere (a pending send, a
//!   reader mid-step) does it write a fresh buffer. Steady-state training (every reader done by
//!   the time the next update comes) therefore updates in place with no temporary.
//! - **Locking as asked.** `use_locking = true` holds the write lock across the whole
//!   read-modify-write, so concurrent updates apply one after the other. `use_locking = false`
//!   does the same while nobody else holds the value (updating in place beats copying it);
//!   while a reader does, it takes the current value under a brief read, computes outside any
//!   lock and stores the result: concurrent updates may then overwrite one another, as
//!   TensorFlow's Hogwild updates may (tessera loses whole updates where TensorFlow loses
//!   elements; both are what lock-free asynchronous SGD accepts).
//! - **One update, seen whole.** An update of several variables (a variable and its optimizer
//!   slots) holds all their write locks while it stores, taken in address order, and
//!   [`snapshot_all`] holds all their read locks while it reads, in the same order: a
//!   checkpoint that reads a variable with its slots that way never holds them from different
//!   applies of one update.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::{DType, PartialShape, Tensor};

/// A variable: a dtype, a declared shape and a value once initialized.
#[derive(Debug)]
pub struct Var {
    /// The dtype every assigned value must have.
    pub dtype: DType,
    /// The declared shape (the `shape` attr of the VarHandleOp or VariableV2).
    pub shape: PartialShape,
    /// The value; `None` until the first assignment. Writers go through [`Var::write`], which
    /// counts them.
    pub value: RwLock<Option<Tensor>>,
    /// How many times the value was write-locked: a replica of the store ships the variables
    /// whose count moved since it last looked (a ps task's standby).
    writes: AtomicU64,
    /// Whether a write other than a row update happened since the changes were last taken.
    changed_whole: AtomicBool,
    /// The rows (indices along dimension 0) row updates wrote since then.
    changed_rows: Mutex<BTreeSet<usize>>,
}

/// What a variable's writes changed since [`Var::take_changes`] last looked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Changes {
    /// Only these rows (indices along dimension 0): sparse updates, scatters.
    Rows(BTreeSet<usize>),
    /// Possibly the whole value.
    Whole,
}

impl Var {
    /// An uninitialized variable.
    pub fn new(dtype: DType, shape: PartialShape) -> Self {
        Self {
            dtype,
            shape,
            value: RwLock::new(None),
            writes: AtomicU64::new(0),
            changed_whole: AtomicBool::new(true),
            changed_rows: Mutex::new(BTreeSet::new()),
        }
    }

    /// Read-locks the value; a poisoned lock (a panic while writing) still gives the value,
    /// which every writer replaces whole.
    pub fn read(&self) -> RwLockReadGuard<'_, Option<Tensor>> {
        self.value.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Write-locks the value (see [`Var::read`] for poisoning), counting the write as one
    /// that may change the whole value.
    pub fn write(&self) -> RwLockWriteGuard<'_, Option<Tensor>> {
        let guard = self.write_rows();
        self.changed_whole.store(true, Ordering::Release);
        guard
    }

    /// Write-locks the value for a row update, counting the write; the caller names the rows
    /// it wrote with [`touched_rows`](Self::touched_rows) before it drops the lock.
    pub fn write_rows(&self) -> RwLockWriteGuard<'_, Option<Tensor>> {
        let guard = self.value.write().unwrap_or_else(|p| p.into_inner());
        // Counted under the lock: whoever reads the count and then the value (under the read
        // lock) sees this write's value, or a count that moves again.
        self.writes.fetch_add(1, Ordering::Release);
        guard
    }

    /// Records that a row update (holding the lock of [`write_rows`](Self::write_rows)) wrote
    /// `rows`.
    pub fn touched_rows(&self, rows: &[usize]) {
        if self.changed_whole.load(Ordering::Acquire) {
            return;
        }
        self.changed_rows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(rows.iter().copied());
    }

    /// The value and what changed in it since the last call, read together under the read
    /// lock (every write marks its changes under the write lock), the changes reset.
    pub fn take_changes(&self) -> (Option<Tensor>, Changes) {
        let value = self.read();
        let rows = std::mem::take(
            &mut *self
                .changed_rows
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let changes = if self.changed_whole.swap(false, Ordering::AcqRel) {
            Changes::Whole
        } else {
            Changes::Rows(rows)
        };
        (value.clone(), changes)
    }

    /// Returns how many times the value was write-locked so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Acquire)
    }

    /// A snapshot of the value, `None` while uninitialized.
    pub fn snapshot(&self) -> Option<Tensor> {
        self.read().clone()
    }

    /// Whether the variable holds a value.
    pub fn is_initialized(&self) -> bool {
        self.read().is_some()
    }
}

/// `vars` in the order their locks are taken: by address, each variable once.
fn lock_order<'a>(vars: &[&'a Var]) -> Vec<&'a Var> {
    let mut order: Vec<&Var> = vars.to_vec();
    order.sort_by_key(|&v| std::ptr::from_ref::<Var>(v) as usize);
    order.dedup_by_key(|v| std::ptr::from_ref::<Var>(*v) as usize);
    order
}

/// Stores `values` into `vars` at one instant (see the module doc): their write locks are held
/// together while they are stored, so a reader of several of them sees all of the new values or
/// none. A variable passed twice gets the later value.
pub fn store_all(vars: &[&Var], values: Vec<Tensor>) {
    let order = lock_order(vars);
    let mut guards: Vec<RwLockWriteGuard<'_, Option<Tensor>>> =
        order.iter().map(|v| v.write()).collect();
    for (var, value) in vars.iter().zip(values) {
        let k = order
            .iter()
            .position(|v| std::ptr::eq(*v, *var))
            .expect("every variable is locked");
        *guards[k] = Some(value);
    }
}

/// Snapshots of `vars` taken at one instant (see the module doc): their read locks are held
/// together, so an update of several of them is seen before or after, never half-applied.
/// A variable may be passed more than once.
pub fn snapshot_all(vars: &[&Var]) -> Vec<Option<Tensor>> {
    let order = lock_order(vars);
    let guards: Vec<(usize, RwLockReadGuard<'_, Option<Tensor>>)> = order
        .iter()
        .map(|v| (std::ptr::from_ref::<Var>(*v) as usize, v.read()))
        .collect();
    vars.iter()
        .map(|v| {
            let at = std::ptr::from_ref::<Var>(*v) as usize;
            let k = guards
                .binary_search_by_key(&at, |(a, _)| *a)
                .expect("every variable is locked");
            guards[k].1.clone()
        })
        .collect()
}
