//! What both of the executor's engines keep per step: the feeds, the count of nodes ready or
//! running, the first error, the wake-up of whoever waits for the step, and the one way a
//! node's kernel is run (reference inputs read, panics caught, cost measured, memory charged,
//! and, in a traced step, its times and outputs saved).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::frames::ControlStep;
use super::{name_node, Plan, StepOptions};
use crate::device::memory::{AllocationScope, Charge};
use crate::device::DeviceType;
use crate::error::{Result, Status};
use crate::kernels::OpContext;
use crate::runtime::pool;
use crate::runtime::stats::NodeTimes;
use crate::tensor::Tensor;

/// The state both engines share for one step.
pub(super) struct StepCommon {
    pub(super) plan: Arc<Plan>,
    pub(super) feeds: Vec<Tensor>,
    pub(super) options: StepOptions,
    /// Nodes ready or running; the step is over when it reaches zero.
    outstanding: AtomicUsize,
    failed: AtomicBool,
    status: Mutex<Option<Status>>,
    done: Mutex<bool>,
    done_cv: Condvar,
    /// Told when the step ends, for a step started by `Executor::spawn`.
    notify: Mutex<Option<oneshot::Sender<()>>>,
    /// The control-flow engine's fetched outputs, by plan node.
    fetched: Mutex<HashMap<usize, Vec<Option<Tensor>>>>,
    /// The control-flow step, to name its running loops when the deadline passes.
    control: OnceLock<Weak<ControlStep>>,
}

impl StepCommon {
    pub(super) fn new(
        plan: Arc<Plan>,
        feeds: Vec<Tensor>,
        options: &StepOptions,
        notify: Option<oneshot::Sender<()>>,
    ) -> StepCommon {
        let roots = plan.roots.len();
        StepCommon {
            plan,
            feeds,
            options: options.clone(),
            outstanding: AtomicUsize::new(roots),
            failed: AtomicBool::new(false),
            status: Mutex::new(None),
            done: Mutex::new(roots == 0),
            done_cv: Condvar::new(),
            notify: Mutex::new(notify),
            fetched: Mutex::new(HashMap::new()),
            control: OnceLock::new(),
        }
    }

    /// Lets a deadline's message name the loops `step` is still running.
    pub(super) fn set_control(&self, step: &Arc<ControlStep>) {
        let _ = self.control.set(Arc::downgrade(step));
    }

    /// Counts one more node ready.
    pub(super) fn add_outstanding(&self) {
        self.outstanding.fetch_add(1, Ordering::AcqRel);
    }

    /// Counts a node done; true when it was the last one (the caller then calls `finish`).
    pub(super) fn node_done(&self) -> bool {
        self.outstanding.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Forgets a node made ready after the step failed (never the last one: its maker is
    /// still counted).
    pub(super) fn drop_outstanding(&self, _node: usize) {
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether the step has failed.
    pub(super) fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Records the step's first error; later ones are dropped. The first also aborts the
    /// step's rendezvous, so that the step's other executors (other devices, other tasks)
    /// blocked in a `_Recv` for a value this one will now never send fail at once with the
    /// root cause, and so does this executor's own pending `_Recv`, which would otherwise hold
    /// the step until its deadline.
    pub(super) fn fail(&self, status: Status) {
        let first = {
            let mut slot = self.status.lock().unwrap_or_else(|e| e.into_inner());
            let first = slot.is_none();
            if first {
                *slot = Some(status.clone());
            }
            first
        };
        self.failed.store(true, Ordering::Release);
        if first {
            if let Some(rendezvous) = &self.options.rendezvous {
                rendezvous.abort(status);
            }
        }
    }

    /// Whether no new node may start (failed, cancelled or past the deadline), recording why.
    pub(super) fn stopped(&self) -> bool {
        if self.failed() {
            return true;
        }
        if let Some(token) = &self.options.cancellation {
            if token.is_cancelled() {
                let reason = token
                    .reason()
                    .unwrap_or_else(|| Status::cancelled("step cancelled"));
                self.fail(reason);
                return true;
            }
        }
        if self.options.deadline.is_some_and(|d| Instant::now() >= d) {
            self.fail(self.deadline_exceeded());
            return true;
        }
        false
    }

    /// DEADLINE_EXCEEDED for this step, naming the while loops still running, if any.
    pub(super) fn deadline_exceeded(&self) -> Status {
        let loops = self
            .control
            .get()
            .and_then(Weak::upgrade)
            .map(|step| step.describe_running())
            .filter(|loops| !loops.is_empty())
            .map(|loops| format!(" ({loops} was still running; a loop that never ends?)"))
            .unwrap_or_default();
        Status::deadline_exceeded(format!(
            "step {} did not finish before its deadline{loops}; raise the step timeout or find \
             the node that waits",
            self.options.step_id
        ))
    }

    /// Marks the step over and wakes the caller. Called by the thread that ran the step's last
    /// node; on a device with memory of its own (a GPU) that is one of the device's threads,
    /// which first frees what the step's dropped buffers handed back and fails the step with
    /// an error the device parked during it.
    pub(super) fn finish(&self) {
        if !self.plan.roots.is_empty() {
            if let Some(space) = self.plan.device.memory_space() {
                if let Err(parked) = space.settle() {
                    self.fail(parked);
                }
            }
        }
        let notify = self.notify.lock().unwrap_or_else(|e| e.into_inner()).take();
        match notify {
            Some(notify) => {
                let _ = notify.send(());
            }
            None => {
                *self.done.lock().unwrap_or_else(|e| e.into_inner()) = true;
                self.done_cv.notify_all();
            }
        }
    }

    /// Waits until every scheduled node is done, or fails the step at its deadline.
    pub(super) fn wait(&self) {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        while !*done {
            match self.options.deadline {
                None => {
                    done = pool::blocking(|| self.done_cv.wait(done))
                        .unwrap_or_else(|e| e.into_inner())
                }
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        // Stragglers finish on their own `Arc` of this state.
                        drop(done);
                        self.fail(self.deadline_exceeded());
                        return;
                    }
                    let slice = left.max(Duration::from_micros(1));
                    done = pool::blocking(|| self.done_cv.wait_timeout(done, slice))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }

    /// Takes the step's first error, if it failed.
    pub(super) fn take_error(&self) -> Option<Status> {
        self.status.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Keeps a fetched node's outputs (control-flow engine).
    pub(super) fn keep_fetched(&self, node: usize, values: &[Option<Tensor>]) {
        self.fetched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node, values.to_vec());
    }

    /// A fetched output kept by [`StepCommon::keep_fetched`]; INVALID_ARGUMENT naming the
    /// fetch when it is dead (or was never produced).
    pub(super) fn kept_fetch(&self, name: &str, node: usize, slot: usize) -> Result<Tensor> {
        let fetched = self.fetched.lock().unwrap_or_else(|e| e.into_inner());
        fetched
            .get(&node)
            .and_then(|values| values.get(slot).cloned().flatten())
            .ok_or_else(|| dead_fetch(name))
    }

    /// The trace clock's reading now (nanoseconds since the step's collector started), for
    /// when a node becomes ready; 0 in a step without a trace, which reads no clock.
    pub(super) fn trace_clock(&self) -> u64 {
        match &self.options.stats {
            Some(stats) => stats.now(),
            None => 0,
        }
    }

    /// Saves a node that ran without its kernel (a `Merge`) in a traced step: taken up at
    /// `all_start`, done now.
    pub(super) fn trace_node(
        &self,
        n: usize,
        scheduled: u64,
        all_start: Option<Instant>,
        outputs: &[Option<Tensor>],
    ) {
        if let (Some(stats), Some(all_start)) = (&self.options.stats, all_start) {
            let start = stats.nanos_at(all_start);
            let end = stats.now();
            let times = NodeTimes {
                scheduled,
                all_start: start,
                op_start: start,
                op_end: end,
                all_end: end,
            };
            stats.save(
                self.plan.device.name(),
                &self.plan.nodes[n].def,
                times,
                outputs,
            );
        }
    }

    /// When a node was taken up, in a traced step (`None` otherwise, reading no clock).
    pub(super) fn trace_start(&self) -> Option<Instant> {
        self.options.stats.as_ref().map(|_| Instant::now())
    }

    /// Runs node `n`'s kernel on `inputs` in iteration `frame_iter`: reference inputs the op
    /// reads as values are read first; `dead` tells a transfer node its input is dead. Returns
    /// the outputs and the memory they hold, or `None` after recording the error (naming the
    /// node). In a traced step the node's times (`scheduled` and `all_start` given by the
    /// engine: when it became ready and when its thread took it up) and outputs are saved.
    pub(super) fn run_kernel(
        &self,
        n: usize,
        mut inputs: Vec<Tensor>,
        frame_iter: (u64, i64),
        dead: bool,
        scheduled: u64,
        all_start: Option<Instant>,
    ) -> Option<(Vec<Option<Tensor>>, Option<Charge>)> {
        let node = &self.plan.nodes[n];
        if self.plan.has_refs {
            let wanted = |i: usize| !node.ref_inputs.get(i).copied().unwrap_or(false);
            if let Err(e) = Tensor::deref_together(&mut inputs, wanted) {
                self.fail(name_node(e, &node.def));
                return None;
            }
        }
        let input_bytes = inputs.iter().map(|t| t.byte_size() as u64).sum();
        let device = &self.plan.device;
        if let (Some(admission), Some(budget)) = (&node.admission, device.memory()) {
            if let Err(e) = admission.check(&node.def, &inputs, budget) {
                self.fail(e);
                return None;
            }
        }
        let mut ctx = OpContext::new(
            &node.def,
            inputs,
            device.resources(),
            device.name(),
            self.options.step_id,
        )
        .with_step(&self.options)
        .with_memory(device.memory())
        .with_memory_space(device.memory_space())
        .with_files(device.files())
        .with_data_files(device.data_files())
        .with_intra(device.intra())
        .with_frame_iter(frame_iter)
        .with_dead_input(dead)
        .with_functions(Some(&self.plan.functions))
        .with_session(&self.plan.session);
        // A CPU kernel's large host blocks are charged to the device's budget as they are
        // allocated, its scratch included.
        let scope = match (device.device_type(), device.memory()) {
            (DeviceType::Cpu, Some(budget)) => Some(AllocationScope::new(budget)),
            _ => None,
        };
        let started = Instant::now();
        let running = device.intra().running();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &scope {
            Some(scope) => scope.run(|| node.kernel.compute(&mut ctx)),
            None => node.kernel.compute(&mut ctx),
        }));
        drop(running);
        let refused = scope.and_then(AllocationScope::finish);
        if let (Ok(Ok(())), Some(bytes), Some(budget)) = (&result, refused, device.memory()) {
            let shapes: Vec<String> = ctx.inputs().iter().map(|t| t.shape().to_string()).collect();
            self.fail(budget.refused_while_running(
                &node.def.name,
                &node.def.op,
                &format!("[{}]", shapes.join(", ")),
                bytes,
            ));
            return None;
        }
        match result {
            Ok(Ok(())) => {
                let ended = Instant::now();
                node.cost.nanos.store(
                    ended.saturating_duration_since(started).as_nanos() as u64,
                    Ordering::Relaxed,
                );
                node.cost.input_bytes.store(input_bytes, Ordering::Relaxed);
                let values = ctx.take_outputs();
                if let Some(stats) = &self.options.stats {
                    let times = NodeTimes {
                        scheduled,
                        all_start: stats.nanos_at(all_start.unwrap_or(started)),
                        op_start: stats.nanos_at(started),
                        op_end: stats.nanos_at(ended),
                        all_end: stats.now(),
                    };
                    stats.save(device.name(), &node.def, times, &values);
                }
                let charge = match device.memory() {
                    Some(budget) => {
                        let bytes = if reads_variable_buffer(&node.def.op) {
                            0
                        } else {
                            allocated_bytes(ctx.inputs(), &values)
                        };
                        match budget.charge(&node.def.name, &node.def.op, bytes) {
                            Ok(charge) => Some(charge),
                            Err(e) => {
                                self.fail(e);
                                return None;
                            }
                        }
                    }
                    None => None,
                };
                Some((values, charge))
            }
            Ok(Err(e)) => {
                self.fail(name_node(e, &node.def));
                None
            }
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".to_string());
                self.fail(Status::internal(format!(
                    "node `{}` (op {}) panicked: {what}",
                    node.def.name, node.def.op
                )));
                None
            }
        }
    }
}

/// INVALID_ARGUMENT for a fetch whose value is dead (it comes from an untaken branch).
pub(super) fn dead_fetch(name: &str) -> Status {
    Status::invalid_argument(format!(
        "fetch `{name}` has no value in this step: it is dead (it comes from the branch of a \
         Switch that was not taken); fetch the Merge of both branches instead"
    ))
}

/// The address of the device buffer holding `t`'s elements, when a device's memory does.
fn device_buffer_address(t: &Tensor) -> Option<*const u8> {
    t.device_buffer()
        .map(|b| b as *const dyn crate::tensor::DeviceBuffer as *const u8)
}

/// Whether `op`'s output is a variable's own buffer, shared rather than copied: the budget
/// already counts it with the device's variables.
fn reads_variable_buffer(op: &str) -> bool {
    op == "ReadVariableOp"
}

/// The bytes of a kernel's outputs that are new allocations: outputs whose buffer lies inside
/// one of the inputs' (Identity, Reshape, a forwarded input) are views and cost nothing, and
/// so is an input's device buffer passed on.
fn allocated_bytes(inputs: &[Tensor], outputs: &[Option<Tensor>]) -> u64 {
    let range = |t: &Tensor| {
        t.bytes()
            .filter(|b| !b.is_empty())
            .map(|b| (b.as_ptr() as usize, b.as_ptr() as usize + b.len()))
    };
    let held: Vec<(usize, usize)> = inputs.iter().filter_map(range).collect();
    let on_device: Vec<*const u8> = inputs.iter().filter_map(device_buffer_address).collect();
    outputs
        .iter()
        .flatten()
        // A reference is the variable itself, counted with the device's variables.
        .filter(|t| !t.is_ref())
        .filter(|t| match range(t) {
            Some((start, _)) => !held.iter().any(|&(lo, hi)| lo <= start && start < hi),
            None => device_buffer_address(t).is_none_or(|a| !on_device.contains(&a)),
        })
        .map(|t| t.byte_size() as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::space::{Emulated, MemorySpace};

    #[test]
    fn only_new_buffers_are_allocations_on_the_host_and_on_a_device() {
        let host = Tensor::from_vec([4], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
        let view = host.reshape([2, 2]).unwrap();
        let fresh = Tensor::from_vec([2], vec![5.0f32, 6.0]).unwrap();
        assert_eq!(
            allocated_bytes(std::slice::from_ref(&host), &[Some(view)]),
            0
        );
        assert_eq!(
            allocated_bytes(std::slice::from_ref(&host), &[Some(fresh)]),
            8
        );
        let gpu = Emulated::new("/job:localhost/replica:0/task:0/device:GPU:0");
        gpu.bind().unwrap();
        let on_gpu = gpu.upload(&host).unwrap();
        let passed_on = on_gpu.reshape([2, 2]).unwrap();
        let computed = gpu.upload(&host).unwrap();
        assert_eq!(
            allocated_bytes(std::slice::from_ref(&on_gpu), &[Some(passed_on)]),
            0
        );
        assert_eq!(allocated_bytes(&[on_gpu], &[Some(computed), None]), 16);
    }
}
