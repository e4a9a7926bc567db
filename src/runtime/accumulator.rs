//! A conditional gradient accumulator living in a device's
//! [`ResourceMgr`](super::resource::ResourceMgr) (TensorFlow's `ConditionalAccumulator`): the
//! per-variable meeting point of synchronous replicas.
//!
//! Workers apply gradients tagged with the step they computed them at; a gradient older than
//! the accumulator's global step is stale and dropped (counted in [`dropped`] and logged, not
//! silently). The chief takes the average (or sum) once `num_required` gradients were
//! accepted, which resets the sum and advances the global step. A take waits with a
//! deadline ([`Wait`]): when replicas stop contributing it fails with DEADLINE_EXCEEDED saying
//! how many of how many gradients arrived, instead of hanging as TensorFlow does. Gradients
//! may name the replica that sent them ([`apply_from`]); the error then also names the
//! replicas heard from before that sent nothing since the last take.
//!
//! [`apply_from`]: ConditionalAccumulator::apply_from
//! [`dropped`]: ConditionalAccumulator::dropped

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::error::{Result, Status};
use crate::runtime::resource::Resource;
use crate::runtime::wait::{human, Ended, Wait};
use crate::tensor::{DType, PartialShape, Tensor};

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

#[derive(Default)]
struct State {
    /// The running sum in f64 (exact for every gradient dtype's range that matters here).
    sum: Option<(crate::tensor::Shape, Vec<f64>)>,
    count: usize,
    global_step: i64,
    dropped: u64,
    /// Each named replica and the local step of its last gradient (stale ones included).
    replicas: BTreeMap<String, i64>,
    /// The named replicas whose gradients were accepted since the last take.
    contributed: BTreeSet<String>,
}

/// Sums gradients of one dtype and shape until the chief takes them.
pub struct ConditionalAccumulator {
    name: String,
    dtype: DType,
    shape: PartialShape,
    reduction: Reduction,
    default_wait: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

impl Resource for ConditionalAccumulator {
    fn type_name(&self) -> &'static str {
        "accumulator"
    }
}

impl ConditionalAccumulator {
    /// An empty accumulator at global step 0. `name` is its shared name, used in messages.
    pub fn new(
        name: impl Into<String>,
        dtype: DType,
        shape: PartialShape,
        reduction: Reduction,
        default_wait: Duration,
    ) -> Result<Self> {
        let name = name.into();
        if !dtype.is_numeric() {
            return Err(Status::invalid_argument(format!(
                "accumulator `{name}`: dtype {dtype} is not numeric; gradients are float, \
                 double, int32 or int64"
            )));
        }
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

    /// Adds `gradient` computed at `local_step`; returns whether it was accepted (a gradient
    /// whose step is below the global step is stale and dropped).
    pub fn apply(&self, local_step: i64, gradient: &Tensor) -> Result<bool> {
        self.apply_from(local_step, gradient, None)
    }

    /// [`apply`](Self::apply) for a gradient from `replica` (e.g. `/job:worker/task:1`), which
    /// the accumulator remembers so that a take that times out can name who is missing.
    pub fn apply_from(
        &self,
        local_step: i64,
        gradient: &Tensor,
        replica: Option<&str>,
    ) -> Result<bool> {
        if gradient.dtype() != self.dtype {
            return Err(Status::invalid_argument(format!(
                "accumulator `{}` holds {} gradients, got a {} one",
                self.name,
                self.dtype,
                gradient.dtype()
            )));
        }
        if !self.shape.is_compatible_with(gradient.shape()) {
            return Err(Status::invalid_argument(format!(
                "accumulator `{}`: gradient of shape {} does not match the declared shape {}",
                self.name,
                gradient.shape(),
                self.shape
            )));
        }
        let values = as_f64(gradient)?;
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
        match &mut state.sum {
            None => state.sum = Some((gradient.shape().clone(), values)),
            Some((shape, sum)) => {
                if shape != gradient.shape() {
                    return Err(Status::invalid_argument(format!(
                        "accumulator `{}`: gradient of shape {} does not match the shape {} of \
                         the gradients accumulated so far",
                        self.name,
                        gradient.shape(),
                        shape
                    )));
                }
                for (s, v) in sum.iter_mut().zip(values) {
                    *s += v;
                }
            }
        }
        state.count += 1;
        if let Some(replica) = replica {
            state.contributed.insert(replica.to_string());
        }
        drop(state);
        self.changed.notify_all();
        Ok(true)
    }

    /// Waits until `num_required` gradients were accepted, then returns their average (or sum),
    /// resets the accumulator and advances its global step by one.
    pub fn take(&self, num_required: i64, wait: &Wait) -> Result<Tensor> {
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
        let (shape, sum) = state.sum.take().ok_or_else(|| {
            Status::internal(format!(
                "accumulator `{}` counted gradients but holds none",
                self.name
            ))
        })?;
        state.count = 0;
        state.contributed.clear();
        state.global_step += 1;
        drop(state);
        self.changed.notify_all();
        let divisor = match self.reduction {
            Reduction::Mean => count as f64,
            Reduction::Sum => 1.0,
        };
        from_f64(self.dtype, shape, sum.into_iter().map(|v| v / divisor))
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

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `"; nothing since the last update from R (last gradient at local step N), ..."` for the
/// named replicas that have not contributed to this update; empty when none is known.
fn missing_replicas(state: &State) -> String {
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

fn as_f64(t: &Tensor) -> Result<Vec<f64>> {
    Ok(match t.dtype() {
        DType::Float => t.values::<f32>()?.iter().map(|&v| f64::from(v)).collect(),
        DType::Double => t.values::<f64>()?.into_owned(),
        DType::Int32 => t.values::<i32>()?.iter().map(|&v| f64::from(v)).collect(),
        DType::Int64 => t.values::<i64>()?.iter().map(|&v| v as f64).collect(),
        other => {
            return Err(Status::invalid_argument(format!(
                "an accumulator cannot hold {other} gradients"
            )))
        }
    })
}

fn from_f64(
    dtype: DType,
    shape: crate::tensor::Shape,
    values: impl Iterator<Item = f64>,
) -> Result<Tensor> {
    match dtype {
        DType::Float => Tensor::from_vec(shape, values.map(|v| v as f32).collect()),
        DType::Double => Tensor::from_vec(shape, values.collect()),
        // Integer means truncate toward zero, as TensorFlow's integer division does.
        DType::Int32 => Tensor::from_vec(shape, values.map(|v| v.trunc() as i32).collect()),
        DType::Int64 => Tensor::from_vec(shape, values.map(|v| v.trunc() as i64).collect()),
        other => Err(Status::invalid_argument(format!(
            "an accumulator cannot hold {other} gradients"
        ))),
    }
}
