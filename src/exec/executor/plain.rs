//! The executor's engine for graphs without control-flow ops: lock-free counting down of
//! per-node pending counts, outputs kept per producer and dropped after their last reader.
//!
//! Deadness reaches such a graph only through a `_Recv` whose sender's input was dead (the
//! other partition holds the `Switch`): the receive leaves its output unset, and every node
//! after it is dead (not run, its successors told so) except `_Send`s, which pass the deadness
//! on to the next partition.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::step::{dead_fetch, StepCommon};
use super::{Kind, Source};
use crate::device::memory::Charge;
use crate::error::{Result, Status};
use crate::kernels::Inline;
use crate::tensor::Tensor;

/// A node's outputs within a step.
struct Outputs {
    values: Vec<Option<Tensor>>,
    /// Reads still to come; `None` when fetched (kept until the step ends).
    reads_left: Option<usize>,
    /// The device memory the values hold, given back with them.
    charge: Option<Charge>,
    /// The node was dead: its outputs are dead.
    dead: bool,
}

/// The state of one step on the plain engine, shared by the threads running its nodes.
pub(super) struct StepState {
    pub(super) common: StepCommon,
    /// Per node: predecessors not yet done.
    pending: Box<[AtomicUsize]>,
    /// Per node: a predecessor was dead (allocated only for plans that receive tensors).
    dead_in: Option<Box<[AtomicBool]>>,
    /// Per node: its outputs, set once when it finishes, dropped after their last reader.
    outputs: Box<[Mutex<Outputs>]>,
    /// Per node: when it became ready, on the trace clock (allocated only in traced steps).
    scheduled: Option<Box<[AtomicU64]>>,
}

impl StepState {
    pub(super) fn new(common: StepCommon) -> Arc<StepState> {
        let plan = common.plan.clone();
        Arc::new(StepState {
            pending: plan
                .nodes
                .iter()
                .map(|n| AtomicUsize::new(n.pending))
                .collect(),
            dead_in: plan
                .may_be_dead
                .then(|| plan.nodes.iter().map(|_| AtomicBool::new(false)).collect()),
            outputs: plan
                .nodes
                .iter()
                .map(|n| {
                    Mutex::new(Outputs {
                        values: Vec::new(),
                        reads_left: n.readers,
                        charge: None,
                        dead: false,
                    })
                })
                .collect(),
            scheduled: common.options.stats.as_ref().map(|_| {
                let start = common.trace_clock();
                plan.nodes.iter().map(|_| AtomicU64::new(start)).collect()
            }),
            common,
        })
    }

    /// Runs node `n` unless the step has stopped, and counts it done; each successor it makes
    /// ready goes to `ready`. The node that ends the step wakes its caller.
    pub(super) fn run_node(&self, n: usize, mut ready: impl FnMut(usize)) {
        if !self.common.stopped() {
            if let Some(dead) = self.compute(n) {
                let plan = &self.common.plan;
                for &s in &plan.nodes[n].successors {
                    if dead {
                        if let Some(dead_in) = &self.dead_in {
                            dead_in[s].store(true, Ordering::Release);
                        }
                    }
                    if self.pending[s].fetch_sub(1, Ordering::AcqRel) == 1 {
                        if let Some(scheduled) = &self.scheduled {
                            scheduled[s].store(self.common.trace_clock(), Ordering::Relaxed);
                        }
                        self.common.add_outstanding();
                        ready(s);
                    }
                }
            }
        }
        if self.common.node_done() {
            self.common.finish();
        }
    }

    /// Whether node `n`, ready now, may run on the thread that started the step: it cannot
    /// wait, its last run took at most `limit`, and its inputs are no larger than then.
    pub(super) fn runs_inline(&self, n: usize, limit: Duration) -> bool {
        let node = &self.common.plan.nodes[n];
        let cheap = || {
            let nanos = node.cost.nanos.load(Ordering::Relaxed);
            nanos <= limit.as_nanos() as u64
                && self.input_bytes(n) <= node.cost.input_bytes.load(Ordering::Relaxed)
        };
        match &node.inline {
            Inline::Never => false,
            Inline::WhenCheap => cheap(),
            Inline::WhenSent(key) => {
                self.common
                    .options
                    .rendezvous
                    .as_ref()
                    .is_some_and(|r| r.holds(key))
                    && cheap()
            }
        }
    }

    /// The bytes of node `n`'s inputs as they stand (all produced once it is ready).
    fn input_bytes(&self, n: usize) -> u64 {
        self.common.plan.nodes[n]
            .inputs
            .iter()
            .map(|source| match *source {
                Source::Feed(k) => self.common.feeds[k].byte_size() as u64,
                Source::Output { node, slot } => self.outputs[node]
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .values
                    .get(slot)
                    .and_then(Option::as_ref)
                    .map_or(0, |t| t.byte_size() as u64),
            })
            .sum()
    }

    /// The step's first error, or its fetches in fetch order. On a device with a memory
    /// budget the step's other outputs, and their charges, are dropped here, before the
    /// caller has its answer: a thread that ran the last node may still hold the step for a
    /// moment, and the budget must not count a finished step.
    pub(super) fn result(&self) -> Result<Vec<Tensor>> {
        let result = self.fetches();
        if self.common.plan.device.memory().is_none() {
            return result;
        }
        for outputs in self.outputs.iter() {
            let mut outputs = outputs.lock().unwrap_or_else(|e| e.into_inner());
            outputs.values = Vec::new();
            outputs.charge = None;
        }
        result
    }

    fn fetches(&self) -> Result<Vec<Tensor>> {
        if let Some(status) = self.common.take_error() {
            return Err(status);
        }
        self.common
            .plan
            .fetches
            .iter()
            .map(|(name, source)| match *source {
                Source::Feed(k) => Ok(self.common.feeds[k].clone()),
                Source::Output { node, slot } => {
                    if self.outputs[node]
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .dead
                    {
                        return Err(dead_fetch(name));
                    }
                    let value = self.output(node, slot, || format!("fetch `{name}`"))?;
                    // A fetched reference (a VariableV2 itself) gives its value.
                    if value.is_ref() {
                        value.deref()
                    } else {
                        Ok(value)
                    }
                }
            })
            .collect()
    }

    /// Returns output `slot` of `node` for one of its readers, or INTERNAL naming both ends
    /// when it was not produced. The last reader takes the tensor instead of cloning it, and
    /// drops the node's other outputs.
    fn output(
        &self,
        node: usize,
        slot: usize,
        wanted_by: impl FnOnce() -> String,
    ) -> Result<Tensor> {
        let mut outputs = self.outputs[node].lock().unwrap_or_else(|e| e.into_inner());
        let last = match &mut outputs.reads_left {
            Some(left) => {
                *left = left.saturating_sub(1);
                *left == 0
            }
            None => false,
        };
        let produced = outputs.values.len();
        let tensor = match outputs.values.get_mut(slot) {
            Some(value) if last => value.take(),
            Some(value) => value.clone(),
            None => None,
        };
        if last {
            outputs.values = Vec::new();
            outputs.charge = None;
        }
        tensor.ok_or_else(|| {
            let def = &self.common.plan.nodes[node].def;
            Status::internal(format!(
                "node `{}` (op {}) did not produce output {slot} ({produced} outputs set), \
                 which {} needs",
                def.name,
                def.op,
                wanted_by()
            ))
        })
    }

    /// Runs node `n`'s kernel; `Some(dead)` when it finished (dead: its outputs are dead),
    /// `None` after recording its error (naming the node).
    fn compute(&self, n: usize) -> Option<bool> {
        let all_start = self.common.trace_start();
        let plan = &self.common.plan;
        let node = &plan.nodes[n];
        let dead = self
            .dead_in
            .as_ref()
            .is_some_and(|d| d[n].load(Ordering::Acquire));
        let transfer = matches!(node.kind, Kind::Send | Kind::Recv);
        if dead && !transfer {
            self.outputs[n]
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .dead = true;
            return Some(true);
        }
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for (i, source) in node.inputs.iter().enumerate() {
            let tensor = match *source {
                Source::Feed(k) => Ok(self.common.feeds[k].clone()),
                // A dead producer left nothing to read: a dead `_Send` sends a placeholder.
                Source::Output { node: p, .. } if dead && self.is_dead(p) => {
                    Ok(Tensor::scalar(0f32))
                }
                Source::Output { node: p, slot } => {
                    self.output(p, slot, || format!("node `{}` as input {i}", node.def.name))
                }
            };
            match tensor {
                Ok(t) => inputs.push(t),
                Err(e) => {
                    self.common.fail(e);
                    return None;
                }
            }
        }
        let scheduled = self
            .scheduled
            .as_ref()
            .map_or(0, |s| s[n].load(Ordering::Relaxed));
        let (values, charge) =
            self.common
                .run_kernel(n, inputs, (0, 0), dead, scheduled, all_start)?;
        let dead = node.kind == Kind::Recv && values.iter().all(Option::is_none);
        let mut outputs = self.outputs[n].lock().unwrap_or_else(|e| e.into_inner());
        outputs.values = values;
        outputs.charge = charge;
        outputs.dead = dead;
        Some(dead)
    }

    fn is_dead(&self, n: usize) -> bool {
        self.outputs[n]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .dead
    }
}

/// Runs node `first`, then keeps running one successor it made ready on this thread and hands
/// the other ready successors to the pool.
pub(super) fn process(state: &Arc<StepState>, first: usize) {
    let mut next = Some(first);
    while let Some(n) = next.take() {
        state.run_node(n, |s| {
            if next.is_none() {
                next = Some(s);
            } else {
                let pool = state.common.plan.device.pool();
                let state = state.clone();
                pool.spawn(move || process(&state, s));
            }
        });
    }
}
