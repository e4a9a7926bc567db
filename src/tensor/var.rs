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
//!   ([`Tensor::make_mut`]); only while a snapshot is still held elsewhere (a pending send, a
//!   reader mid-step) does it write a fresh buffer. Steady-state training (every reader done by
//!   the time the next update comes) therefore updates in place with no temporary.
//! - **Locking as asked.** `use_locking = true` holds the write lock across the whole
//!   read-modify-write, so concurrent updates apply one after the other. `use_locking = false`
//!   takes the current value under a brief read, computes outside any lock and stores the
//!   result: concurrent updates may overwrite one another, as TensorFlow's Hogwild updates may
//!   (tessera loses whole updates where TensorFlow loses elements; both are what lock-free
//!   asynchronous SGD accepts).

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::{DType, PartialShape, Tensor};

/// A variable: a dtype, a declared shape and a value once initialized.
#[derive(Debug)]
pub struct Var {
    /// The dtype every assigned value must have.
    pub dtype: DType,
    /// The declared shape (the `shape` attr of the VarHandleOp or VariableV2).
    pub shape: PartialShape,
    /// The value; `None` until the first assignment.
    pub value: RwLock<Option<Tensor>>,
}

impl Var {
    /// An uninitialized variable.
    pub fn new(dtype: DType, shape: PartialShape) -> Self {
        Self {
            dtype,
            shape,
            value: RwLock::new(None),
        }
    }

    /// Read-locks the value; a poisoned lock (a panic while writing) still gives the value,
    /// which every writer replaces whole.
    pub fn read(&self) -> RwLockReadGuard<'_, Option<Tensor>> {
        self.value.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Write-locks the value (see [`Var::read`] for poisoning).
    pub fn write(&self) -> RwLockWriteGuard<'_, Option<Tensor>> {
        self.value.write().unwrap_or_else(|p| p.into_inner())
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
