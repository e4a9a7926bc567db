//! The executor's control-flow engine: TensorFlow 1's dead tensors, frames and iterations, for
//! plans that hold `Switch`, `Merge`, `Enter`, `Exit`, `NextIteration` or `ControlTrigger`
//! (graphs without them run on the lock-free engine in `plain.rs` and pay nothing for this).
//!
//! The semantics are TensorFlow's (`propagator_state.cc`):
//!
//! - **Dead tensors.** A `Switch` sets one output; the other is dead. A node with a dead input
//!   (data or control) does not run: all its outputs are dead, and so is the node for its
//!   control successors. `_Send`/`_Recv` run dead, to carry the deadness to the other side.
//!   A `ControlTrigger` is never dead.
//! - **Merge** waits for all its control inputs and then fires on its first live data input;
//!   it is dead when all its data inputs are dead (or a dead `Enter` feeds it: a loop on an
//!   untaken branch).
//! - **Frames.** Each while loop is a frame, named by its `Enter` nodes' `frame_name`, with its
//!   own iterations. An instance of a frame is made per parent frame instance and parent
//!   iteration when its first `Enter` arrives. `Enter` moves a value into iteration 0 of the
//!   child (or, with `is_constant`, into every iteration: a loop invariant); `NextIteration`
//!   moves it into the next iteration, starting it, unless `parallel_iterations` are already
//!   under way (then it waits for the oldest to finish); `Exit` moves it out to the parent. A
//!   dead `NextIteration` starts nothing (the loop ends); dead `Exit`s of the last iteration are
//!   passed on, dead, when the frame finishes.
//! - An iteration is done when none of its nodes is ready or running, no child frame of it is
//!   alive, and the iteration before it is done (for iteration 0: every `Enter` of the frame has
//!   arrived). A frame is done when all its iterations are.
//!
//! Concurrency: every propagation happens under one mutex per step; kernels run outside it,
//! in parallel as their readiness allows. Inputs are stored at their destination, per
//! (frame instance, iteration), and taken by the node that reads them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use super::frame_plan::{frame_id, ControlPlan, FrameInfo, ROOT};
use super::step::StepCommon;
use super::{name_node, Kind, Plan, Source};
use crate::error::Status;
use crate::tensor::Tensor;

/// One iteration of a frame instance.
struct Iteration {
    /// Per node of the frame: data and control inputs still to come (see [`FrameInfo`]).
    pending: Vec<u32>,
    /// Per node of the frame: dead inputs received.
    dead: Vec<u32>,
    /// Input values, at their destination's slots; `None` until set, or dead.
    inputs: Vec<Option<Tensor>>,
    /// Nodes of this iteration ready or running.
    outstanding: usize,
    /// Child frame instances of this iteration still alive.
    children: usize,
}

impl Iteration {
    fn new(info: &FrameInfo) -> Iteration {
        Iteration {
            pending: info.pending.clone(),
            dead: vec![0; info.pending.len()],
            inputs: vec![None; info.slots],
            outstanding: 0,
            children: 0,
        }
    }
}

/// A live instance of a frame.
struct FrameInstance {
    info: usize,
    /// The instance and iteration that entered it; `None` for the root.
    parent: Option<(usize, i64)>,
    /// The id in rendezvous keys of transfers inside it (`frame_id` of `frame_id:iter`).
    id: u64,
    /// Iterations not yet done, from `first` on.
    iterations: VecDeque<Iteration>,
    first: i64,
    /// The newest iteration started.
    count: i64,
    /// `Enter` nodes not yet arrived.
    pending_enters: usize,
    dead_exits: Vec<usize>,
    /// `NextIteration` values waiting for a free iteration (`parallel_iterations`).
    deferred: Vec<(usize, Option<Tensor>)>,
    /// Loop invariants: the constant `Enter`s and their values, given to every iteration.
    invariants: Vec<(usize, Option<Tensor>)>,
}

impl FrameInstance {
    fn iteration(&mut self, iter: i64) -> &mut Iteration {
        let index = (iter - self.first) as usize;
        &mut self.iterations[index]
    }

    fn has_iteration(&self, iter: i64) -> bool {
        iter >= self.first && iter <= self.count
    }
}

/// A node ready to run: in which frame instance and iteration, and whether it is dead.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tagged {
    node: usize,
    frame: usize,
    /// The frame instance's id in rendezvous keys (0 for the root).
    frame_id: u64,
    iter: i64,
    dead: bool,
    /// When it became ready, on the trace clock (0 in a step without a trace).
    scheduled: u64,
}

/// The frames of one step.
struct Frames {
    instances: Vec<Option<FrameInstance>>,
    free: Vec<usize>,
    /// Live child instances by (parent instance, parent iteration, static frame).
    children: HashMap<(usize, i64, usize), usize>,
}

/// The state of one step on the control-flow engine.
pub(super) struct ControlStep {
    pub(super) common: StepCommon,
    frames: Mutex<Frames>,
}

impl ControlStep {
    pub(super) fn new(common: StepCommon) -> Arc<ControlStep> {
        let control = common.plan.control.as_ref().expect("a control-flow plan");
        let mut root_iter = Iteration::new(&control.frames[ROOT]);
        root_iter.outstanding = common.plan.roots.len();
        let root = FrameInstance {
            info: ROOT,
            parent: None,
            id: 0,
            iterations: VecDeque::from([root_iter]),
            first: 0,
            count: 0,
            pending_enters: 0,
            dead_exits: Vec::new(),
            deferred: Vec::new(),
            invariants: Vec::new(),
        };
        Arc::new(ControlStep {
            common,
            frames: Mutex::new(Frames {
                instances: vec![Some(root)],
                free: Vec::new(),
                children: HashMap::new(),
            }),
        })
    }

    /// The roots, tagged in the root frame.
    pub(super) fn roots(&self) -> Vec<Tagged> {
        let scheduled = self.common.trace_clock();
        self.common
            .plan
            .roots
            .iter()
            .map(|&node| Tagged {
                node,
                frame: 0,
                frame_id: 0,
                iter: 0,
                dead: false,
                scheduled,
            })
            .collect()
    }

    fn control(&self) -> &ControlPlan {
        self.common
            .plan
            .control
            .as_ref()
            .expect("a control-flow plan")
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Frames> {
        self.frames.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `first`, then one node it made ready after another on this thread, handing the
    /// others to the pool.
    pub(super) fn process(self: &Arc<Self>, first: Tagged) {
        let pool = self.common.plan.device.pool();
        let mut next = Some(first);
        while let Some(tagged) = next.take() {
            let ready = self.run(tagged);
            let mut ready = ready.into_iter();
            next = ready.next();
            for other in ready {
                let step = self.clone();
                pool.spawn(move || step.process(other));
            }
            // This node is done; the step ends when nothing is ready or running.
            if self.common.node_done() {
                self.common.finish();
            }
        }
    }

    /// Runs one tagged node and propagates its outputs; returns the nodes it made ready (each
    /// already counted as outstanding).
    fn run(&self, tagged: Tagged) -> Vec<Tagged> {
        let plan = &self.common.plan;
        let control = self.control();
        let node = &plan.nodes[tagged.node];
        // Take the inputs.
        let base = control.input_base[tagged.node];
        let slots: Vec<Option<Tensor>> = {
            let mut frames = self.lock();
            let instance = frames.instances[tagged.frame]
                .as_mut()
                .expect("a tagged node's frame is alive");
            let iteration = instance.iteration(tagged.iter);
            (0..node.inputs.len())
                .map(|i| iteration.inputs[base + i].take())
                .collect()
        };
        let outputs = if self.common.stopped() {
            None
        } else {
            self.compute(tagged, slots)
        };
        let mut frames = self.lock();
        let mut ready = Vec::new();
        match outputs {
            Some(outputs) => self.propagate(&mut frames, tagged, outputs, &mut ready),
            // Failed or stopped: nothing new starts; only account for this node.
            None => self.node_finished(&mut frames, tagged.frame, tagged.iter, &mut ready),
        }
        if self.common.failed() {
            // Nodes made ready after a failure are dropped, uncounted.
            for t in ready.drain(..) {
                self.common.drop_outstanding(t.node);
            }
        }
        ready
    }

    /// Computes a node's outputs: `Ok(None)` for a dead node, `None` when the step failed.
    fn compute(&self, tagged: Tagged, slots: Vec<Option<Tensor>>) -> Option<NodeOutputs> {
        let all_start = self.common.trace_start();
        let plan = &self.common.plan;
        let node = &plan.nodes[tagged.node];
        let frame_iter = (tagged.frame_id, tagged.iter);
        if node.kind == Kind::Merge {
            if tagged.dead {
                return Some(NodeOutputs::Dead);
            }
            let live = node
                .inputs
                .iter()
                .zip(slots)
                .enumerate()
                .find_map(|(i, (s, v))| match s {
                    Source::Feed(k) => Some((i, self.common.feeds[*k].clone())),
                    Source::Output { .. } => v.map(|v| (i, v)),
                });
            return Some(match live {
                Some((i, value)) => {
                    let values = vec![Some(value), Some(Tensor::scalar(i as i32))];
                    self.common
                        .trace_node(tagged.node, tagged.scheduled, all_start, &values);
                    NodeOutputs::Live(values)
                }
                None => NodeOutputs::Dead,
            });
        }
        let transfer = matches!(node.kind, Kind::Send | Kind::Recv);
        if tagged.dead && !transfer {
            return Some(NodeOutputs::Dead);
        }
        let mut inputs = Vec::with_capacity(slots.len());
        for (source, value) in node.inputs.iter().zip(slots) {
            match source {
                Source::Feed(k) => inputs.push(self.common.feeds[*k].clone()),
                Source::Output { .. } => match value {
                    Some(v) => inputs.push(v),
                    None if tagged.dead => inputs.push(Tensor::scalar(0f32)),
                    None => {
                        self.common.fail(Status::internal(format!(
                            "node `{}` ({}) is ready without its inputs in frame {}",
                            node.def.name, node.def.op, frame_iter.0
                        )));
                        return None;
                    }
                },
            }
        }
        // The memory of outputs in loops is not held against the budget past the check.
        let (values, _charge) = self.common.run_kernel(
            tagged.node,
            inputs,
            frame_iter,
            tagged.dead,
            tagged.scheduled,
            all_start,
        )?;
        let may_leave_unset = matches!(node.kind, Kind::Switch | Kind::Recv);
        if node.kind == Kind::Recv && values.iter().all(Option::is_none) {
            return Some(NodeOutputs::Dead);
        }
        if !may_leave_unset {
            if let Some(missing) = control_missing_output(&self.common.plan, tagged.node, &values) {
                self.common.fail(missing);
                return None;
            }
        }
        Some(NodeOutputs::Live(values))
    }

    fn propagate(
        &self,
        frames: &mut Frames,
        tagged: Tagged,
        outputs: NodeOutputs,
        ready: &mut Vec<Tagged>,
    ) {
        let plan = &self.common.plan;
        let control = self.control();
        let node = &plan.nodes[tagged.node];
        let dead = matches!(outputs, NodeOutputs::Dead);
        match node.kind {
            Kind::Enter => {
                let (child_frame, constant) =
                    control.enter[tagged.node].expect("Enter nodes have a frame");
                let child = self.child_instance(frames, tagged, child_frame);
                let value = outputs.first();
                if constant {
                    let instance = frames.instances[child].as_mut().expect("alive");
                    instance.invariants.push((tagged.node, value.clone()));
                    let (first, count) = (instance.first, instance.count);
                    for iter in first..=count {
                        self.activate(
                            frames,
                            tagged.node,
                            dead,
                            std::slice::from_ref(&value),
                            child,
                            iter,
                            ready,
                        );
                    }
                } else {
                    self.activate(frames, tagged.node, dead, &[value], child, 0, ready);
                }
                let instance = frames.instances[child].as_mut().expect("alive");
                instance.pending_enters -= 1;
                let first = instance.first;
                // The last Enter may be what the child's first iteration waited for.
                self.cleanup(frames, child, first, ready);
                self.node_finished(frames, tagged.frame, tagged.iter, ready);
            }
            Kind::Exit => {
                if dead {
                    let instance = frames.instances[tagged.frame].as_mut().expect("alive");
                    if tagged.iter == instance.count {
                        instance.dead_exits.push(tagged.node);
                    }
                } else {
                    let (parent, parent_iter) = frames.instances[tagged.frame]
                        .as_ref()
                        .and_then(|f| f.parent)
                        .expect("an Exit runs in a child frame");
                    let values = outputs.values();
                    if node.fetched && parent == 0 {
                        self.common.keep_fetched(tagged.node, values);
                    }
                    self.activate(
                        frames,
                        tagged.node,
                        false,
                        values,
                        parent,
                        parent_iter,
                        ready,
                    );
                }
                self.node_finished(frames, tagged.frame, tagged.iter, ready);
            }
            Kind::NextIteration => {
                if !dead {
                    let value = outputs.first();
                    let parallel = {
                        let instance = frames.instances[tagged.frame].as_ref().expect("alive");
                        control.frames[instance.info].parallel_iterations
                    };
                    let instance = frames.instances[tagged.frame].as_mut().expect("alive");
                    let newest = tagged.iter == instance.count;
                    if newest && instance.iterations.len() >= parallel {
                        // `parallel_iterations` are under way: wait for the oldest to finish.
                        instance.deferred.push((tagged.node, value));
                    } else {
                        if newest {
                            self.start_iteration(frames, tagged.frame, ready);
                        }
                        let (frame, next) = (tagged.frame, tagged.iter + 1);
                        self.activate(frames, tagged.node, false, &[value], frame, next, ready);
                    }
                }
                self.node_finished(frames, tagged.frame, tagged.iter, ready);
            }
            _ => {
                if node.fetched && tagged.frame == 0 {
                    self.common.keep_fetched(tagged.node, outputs.values());
                }
                let values = outputs.values();
                self.activate(
                    frames,
                    tagged.node,
                    dead,
                    values,
                    tagged.frame,
                    tagged.iter,
                    ready,
                );
                self.node_finished(frames, tagged.frame, tagged.iter, ready);
            }
        }
    }

    /// Finds or makes the instance of static frame `child` entered from `tagged`'s frame and
    /// iteration.
    fn child_instance(&self, frames: &mut Frames, tagged: Tagged, child: usize) -> usize {
        let key = (tagged.frame, tagged.iter, child);
        if let Some(&instance) = frames.children.get(&key) {
            return instance;
        }
        let control = self.control();
        let info = &control.frames[child];
        let parent_id = frames.instances[tagged.frame].as_ref().map_or(0, |f| f.id);
        let instance = FrameInstance {
            info: child,
            parent: Some((tagged.frame, tagged.iter)),
            id: frame_id(parent_id, tagged.iter, &info.name),
            iterations: VecDeque::from([Iteration::new(info)]),
            first: 0,
            count: 0,
            pending_enters: info.enters,
            dead_exits: Vec::new(),
            deferred: Vec::new(),
            invariants: Vec::new(),
        };
        let index = match frames.free.pop() {
            Some(i) => {
                frames.instances[i] = Some(instance);
                i
            }
            None => {
                frames.instances.push(Some(instance));
                frames.instances.len() - 1
            }
        };
        frames.children.insert(key, index);
        frames.instances[tagged.frame]
            .as_mut()
            .expect("alive")
            .iteration(tagged.iter)
            .children += 1;
        index
    }

    /// Starts the next iteration of `frame`: the deferred `NextIteration` values and the loop
    /// invariants go into it.
    fn start_iteration(&self, frames: &mut Frames, frame: usize, ready: &mut Vec<Tagged>) {
        let control = self.control();
        let instance = frames.instances[frame].as_mut().expect("alive");
        instance.count += 1;
        let iter = instance.count;
        instance
            .iterations
            .push_back(Iteration::new(&control.frames[instance.info]));
        instance.dead_exits.clear();
        let deferred = std::mem::take(&mut instance.deferred);
        let invariants = instance.invariants.clone();
        for (node, value) in deferred {
            self.activate(frames, node, false, &[value], frame, iter, ready);
        }
        for (node, value) in invariants {
            let dead = value.is_none();
            self.activate(frames, node, dead, &[value], frame, iter, ready);
        }
    }

    /// Delivers `node`'s outputs (`values[slot]`, `None` dead; every output dead when `dead`)
    /// to its successors in iteration `iter` of instance `frame`, collecting those made ready.
    #[allow(clippy::too_many_arguments)]
    fn activate(
        &self,
        frames: &mut Frames,
        node: usize,
        dead: bool,
        values: &[Option<Tensor>],
        frame: usize,
        iter: i64,
        ready: &mut Vec<Tagged>,
    ) {
        let plan = &self.common.plan;
        let control = self.control();
        let is_enter = plan.nodes[node].kind == Kind::Enter;
        let instance = frames.instances[frame].as_mut().expect("alive");
        let frame_id = instance.id;
        let iteration = instance.iteration(iter);
        let scheduled = self.common.trace_clock();
        let mut made_ready = |dst: usize, dst_dead: bool, iteration: &mut Iteration| {
            let dst_dead = dst_dead && plan.nodes[dst].kind != Kind::ControlTrigger;
            iteration.outstanding += 1;
            self.common.add_outstanding();
            ready.push(Tagged {
                node: dst,
                frame,
                frame_id,
                iter,
                dead: dst_dead,
                scheduled,
            });
        };
        for edge in &control.data_out[node] {
            let dst = edge.dst;
            let local = control.local[dst];
            let value = if dead {
                None
            } else {
                values.get(edge.slot).cloned().flatten()
            };
            if plan.nodes[dst].kind == Kind::Merge {
                match value {
                    Some(value) => {
                        if iteration.pending[local] & 1 == 1 {
                            iteration.inputs[control.input_base[dst] + edge.input] = Some(value);
                            iteration.pending[local] -= 1;
                            if iteration.pending[local] == 0 {
                                made_ready(dst, false, iteration);
                            }
                        }
                    }
                    None => {
                        iteration.dead[local] += 1;
                        let all_dead =
                            iteration.dead[local] as usize == control.data_inputs[dst] || is_enter;
                        if iteration.pending[local] == 1 && all_dead {
                            iteration.pending[local] = 0;
                            made_ready(dst, true, iteration);
                        }
                    }
                }
            } else {
                if value.is_none() {
                    iteration.dead[local] += 1;
                }
                iteration.inputs[control.input_base[dst] + edge.input] = value;
                iteration.pending[local] -= 1;
                if iteration.pending[local] == 0 {
                    let dst_dead = iteration.dead[local] > 0;
                    made_ready(dst, dst_dead, iteration);
                }
            }
        }
        for &dst in &control.control_out[node] {
            let local = control.local[dst];
            if plan.nodes[dst].kind == Kind::Merge {
                iteration.pending[local] -= 2;
                let all_dead = iteration.dead[local] as usize == control.data_inputs[dst];
                if iteration.pending[local] == 0 {
                    made_ready(dst, false, iteration);
                } else if iteration.pending[local] == 1 && all_dead {
                    iteration.pending[local] = 0;
                    made_ready(dst, true, iteration);
                }
            } else {
                if dead {
                    iteration.dead[local] += 1;
                }
                iteration.pending[local] -= 1;
                if iteration.pending[local] == 0 {
                    let dst_dead = iteration.dead[local] > 0;
                    made_ready(dst, dst_dead, iteration);
                }
            }
        }
    }

    /// Counts a node of iteration `iter` of `frame` done and cleans up what that finishes.
    fn node_finished(&self, frames: &mut Frames, frame: usize, iter: i64, ready: &mut Vec<Tagged>) {
        let instance = frames.instances[frame].as_mut().expect("alive");
        let iteration = instance.iteration(iter);
        iteration.outstanding -= 1;
        self.cleanup(frames, frame, iter, ready);
    }

    /// Retires the done iterations of `frame` from `iter` on, in order; when that finishes the
    /// frame, passes its dead exits on and retires it, then looks at its parent's iteration.
    fn cleanup(&self, frames: &mut Frames, frame: usize, iter: i64, ready: &mut Vec<Tagged>) {
        if frame == 0 {
            return;
        }
        let control = self.control();
        let mut iter = iter;
        loop {
            let instance = frames.instances[frame].as_mut().expect("alive");
            if !instance.has_iteration(iter) || iter != instance.first {
                break;
            }
            let done = {
                let pending_enters = instance.pending_enters;
                let it = instance.iteration(iter);
                it.outstanding == 0 && it.children == 0 && (iter != 0 || pending_enters == 0)
            };
            if !done {
                break;
            }
            instance.iterations.pop_front();
            instance.first += 1;
            iter += 1;
            if !instance.deferred.is_empty() {
                self.start_iteration(frames, frame, ready);
            }
        }
        let instance = frames.instances[frame].as_ref().expect("alive");
        let frame_done = instance.pending_enters == 0 && instance.iterations.is_empty();
        if !frame_done {
            return;
        }
        let instance = frames.instances[frame].take().expect("alive");
        frames.free.push(frame);
        let (parent, parent_iter) = instance.parent.expect("a child frame has a parent");
        frames
            .children
            .remove(&(parent, parent_iter, instance.info));
        for exit in instance.dead_exits {
            self.activate(frames, exit, true, &[], parent, parent_iter, ready);
        }
        let _ = control;
        let parent_instance = frames.instances[parent].as_mut().expect("alive");
        parent_instance.iteration(parent_iter).children -= 1;
        self.cleanup(frames, parent, parent_iter, ready);
    }

    /// The frames and iterations still running, for a deadline's message.
    pub(super) fn describe_running(&self) -> String {
        let frames = self.lock();
        let control = self.control();
        let mut loops: Vec<String> = frames
            .instances
            .iter()
            .flatten()
            .filter(|f| f.info != ROOT)
            .map(|f| {
                format!(
                    "while loop `{}` at iteration {}",
                    control.frame_name(f.info),
                    f.count
                )
            })
            .collect();
        loops.sort();
        loops.dedup();
        loops.join(", ")
    }
}

/// A node's outputs: its values (`None` for a dead output), or dead as a whole.
enum NodeOutputs {
    Live(Vec<Option<Tensor>>),
    Dead,
}

impl NodeOutputs {
    fn values(&self) -> &[Option<Tensor>] {
        match self {
            NodeOutputs::Live(v) => v,
            NodeOutputs::Dead => &[],
        }
    }

    fn first(&self) -> Option<Tensor> {
        self.values().first().cloned().flatten()
    }
}

/// INTERNAL naming the node when its kernel left an output unset that a consumer reads.
fn control_missing_output(plan: &Plan, node: usize, values: &[Option<Tensor>]) -> Option<Status> {
    let control = plan.control.as_ref()?;
    let missing = control.data_out[node]
        .iter()
        .find(|e| values.get(e.slot).is_none_or(Option::is_none))?;
    let def = &plan.nodes[node].def;
    Some(name_node(
        Status::internal(format!(
            "did not produce output {} ({} outputs set), which node `{}` needs",
            missing.slot,
            values.len(),
            plan.nodes[missing.dst].def.name
        )),
        def,
    ))
}

/// Starts a control-flow step's roots: the caller runs the first unless it must only wait.
pub(super) fn start(step: &Arc<ControlStep>, run_first_here: bool) {
    let roots = step.roots();
    let mut roots = roots.into_iter();
    let first = if run_first_here { roots.next() } else { None };
    let pool = step.common.plan.device.pool();
    for root in roots {
        let step = step.clone();
        pool.spawn(move || step.process(root));
    }
    if let Some(first) = first {
        step.process(first);
    }
}
