//! Conditional gradient accumulators living in a device's
//! [`ResourceMgr`](super::resource::ResourceMgr) (TensorFlow's `ConditionalAccumulatorBase`):
//! the per-variable meeting points of synchronous replicas. Two kinds share everything here
//! but what a gradient is: [`ConditionalAccumulator`] sums dense tensors (`dense.rs`),
//! [`SparseConditionalAccumulator`] sums the rows of `IndexedSlices` (`sparse.rs`).
//!
//! Workers apply gradients tagged with the step they computed them at; a gradient older than
//! the accumulator's global step is stale and dropped (counted in [`dropped`] and logged, not
//! silently). The chief takes the average (or sum) once `num_required` gradients were
//! accepted, which resets the count and advances the global step. A take waits with a
//! deadline ([`Wait`]): when replicas stop contributing it fails with DEADLINE_EXCEEDED saying
//! how many of how many gradients arrived, instead of hanging as TensorFlow does. Gradients
//! may name the replica that sent them; the error then also names the replicas heard from
//! before that sent nothing since the last take.
//!
//! [`Accumulator`] holds that shared protocol (the global step, the count, the replicas heard
//! from, the wait) once, generic over the running sum `S` of its kind; each kind adds its own
//! `apply` and `take`, which hand their arithmetic to its `accept` and `take_with`.
//!
//! [`dropped`]: Accumulator::dropped

mod dense;
mod sparse;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

pub use dense::{ConditionalAccumulator, DenseSum};
pub use sparse::{SparseConditionalAccumulator, SparseSum, TakenSlices};

use crate::error::{Result, Status};
use crate::runtime::resource::Resource;
use crate::runtime::wait::{human, Ended, Wait};
use crate::tensor::{DType, PartialShape};

/// How accepted gradients combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    /// The average of the accepted gradients (TensorFlow's default).
    Mean,
    /// Their sum.
    Sum,
}

impl Reduction {
    /// Parses the `reduction_type` attr: `MEAN` or `SUM`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "MEAN" => Ok(Self::Mean),
            "SUM" => Ok(Self::Sum),
            other => Err(Status::invalid_argument(format!(
                "reduction_type `{other}` is not one of MEAN, SUM"
            ))),
        }
    }
}

/// The running sum of one kind of accumulator: what it keeps between takes.
pub trait Sum: Default + Send + 'static {
    /// The resource's type name (in resource-manager messages).
    const KIND: &'static str;

    /// Fails unless this kind sums gradients of `dtype`; `name` is the accumulator's.
    fn check_dtype(name: &str, dtype: DType) -> Result<()>;
}

/// The protocol state under the accumulator's lock, around the kind's running sum.
#[derive(Default)]
struct State<S> {
    sum: S,
    count: usize,
    global_step: i64,
    dropped: u64,
    /// Each named replica and the local step of its last gradient (stale ones included).
    replicas: BTreeMap<String, i64>,
    /// The named replicas whose gradients were accepted since the last take.
    contributed: BTreeSet<String>,
}

/// A conditional accumulator whose running sum is an `S` (see the module doc): use it as
/// [`ConditionalAccumulator`] or [`SparseConditionalAccumulator`].
pub struct Accumulator<S> {
    name: String,
    dtype: DType,
    shape: PartialShape,
    reduction: Reduction,
    default_wait: Duration,
    state: Mutex<State<S>>,
    changed: Condvar,
}

impl<S: Sum> Resource for Accumulator<S> {
    fn type_name(&self) -> &'static str {
        S::KIND
    }
}

impl<S: Sum> Accumulator<S> {
    /// An empty accumulator at global step 0 for gradients of `dtype` whose (dense) shape is
    /// `shape`; a take that has no step deadline waits `default_wait`. `name` is its shared
    /// name, used in messages.
    pub fn new(
        name: impl Into<String>,
        dtype: DType,
        shape: PartialShape,
        reduction: Reduction,
        default_wait: Duration,
    ) -> Result<Self> {
        let name = name.into();
        S::check_dtype(&name, dtype)?;
        Ok(Self {
            name,
            dtype,
            shape,
            reduction,
            default_wait,
            state: Mutex::default(),
            changed: Condvar::new(),
        })
    }

    /// Returns the accumulator's shared name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Returns the dtype of its gradients.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Returns the shape its gradients were declared with (the `shape` attr).
    pub fn shape(&self) -> &PartialShape {
        &self.shape
    }

    /// Returns how its gradients combine.
    pub fn reduction(&self) -> Reduction {
        self.reduction
    }

    /// Returns the wait of takes that have no step deadline.
    pub fn default_wait(&self) -> Duration {
        self.default_wait
    }

    /// Returns the number of gradients accepted since the last take.
    pub fn num_accumulated(&self) -> usize {
        self.lock().count
    }

    /// Returns the accumulator's global step.
    pub fn global_step(&self) -> i64 {
        self.lock().global_step
    }

    /// Returns how many stale gradients were dropped since the accumulator was created.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// Sets the global step; a lower step than the current one is allowed but logged.
    pub fn set_global_step(&self, step: i64) {
        let mut state = self.lock();
        if step < state.global_step {
            tracing::warn!(
                accumulator = %self.name,
                from = state.global_step,
                to = step,
                "accumulator global step lowered"
            );
        }
        state.global_step = step;
    }

    /// Accepts a gradient computed at `local_step` from `replica` (remembered, so that a take
    /// that times out can name who is missing): drops it when stale (returns `false`), else
    /// has `add` fold it into the sum — `add` gets the sum and how many gradients it already
    /// holds (0: the sum is left from before the last take and must be replaced) — and counts
    /// it. An error from `add` leaves the count as it was.
    fn accept(
        &self,
        local_step: i64,
        replica: Option<&str>,
        add: impl FnOnce(&mut S, usize) -> Result<()>,
    ) -> Result<bool> {
        let mut state = self.lock();
        if let Some(replica) = replica {
            state.replicas.insert(replica.to_string(), local_step);
        }
        if local_step < state.global_step {
            state.dropped += 1;
            tracing::debug!(
                accumulator = %self.name,
                local_step,
                global_step = state.global_step,
                dropped = state.dropped,
                "stale gradient dropped"
            );
            return Ok(false);
        }
        let count = state.count;
        add(&mut state.sum, count)?;
        state.count += 1;
        if let Some(replica) = replica {
            state.contributed.insert(replica.to_string());
        }
        drop(state);
        self.changed.notify_all();
        Ok(true)
    }

    /// Waits until `num_required` gradients were accepted, then has `finish` make the result
    /// out of the sum and the count, resets the count and advances the global step by one.
    fn take_with<R>(
        &self,
        num_required: i64,
        wait: &Wait,
        finish: impl FnOnce(&mut S, usize) -> Result<R>,
    ) -> Result<R> {
        let need = usize::try_from(num_required)
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "accumulator `{}`: num_required must be at least 1, got {num_required}",
                    self.name
                ))
            })?;
        let state = self.lock();
        let mut state = match wait.until(&self.changed, state, |s| s.count >= need) {
            Ok(state) => state,
            Err((Ended::Cancelled(reason), _)) => return Err(reason),
            Err((Ended::Deadline, state)) => {
                return Err(Status::deadline_exceeded(format!(
                    "accumulator `{}`: {} of {need} gradients arrived within {}; a replica \
                     stopped contributing (stale gradients dropped so far: {}){}",
                    self.name,
                    state.count,
                    human(wait.allowed),
                    state.dropped,
                    missing_replicas(&state)
                )))
            }
        };
        let count = state.count;
        let taken = finish(&mut state.sum, count)?;
        state.count = 0;
        state.contributed.clear();
        state.global_step += 1;
        drop(state);
        self.changed.notify_all();
        Ok(taken)
    }

    fn lock(&self) -> MutexGuard<'_, State<S>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `"; nothing since the last update from R (last gradient at local step N), ..."` for the
/// named replicas that have not contributed to this update; empty when none is known.
fn missing_replicas<S>(state: &State<S>) -> String {
    let missing: Vec<String> = state
        .replicas
        .iter()
        .filter(|(name, _)| !state.contributed.contains(*name))
        .map(|(name, step)| format!("{name} (last gradient at local step {step})"))
        .collect();
    if missing.is_empty() {
        return String::new();
    }
    format!(
        "; nothing since the last update from {}: check that it is alive",
        missing.join(", ")
    )
}
