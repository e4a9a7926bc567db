//! The dataflow executor: runs the part of a `GraphDef` that a set of fetches and targets needs,
//! on one device, once per step, with independent nodes in parallel.
//!
//! An [`Executor`] is built once for (graph, feeds, fetches, targets, device): it prunes the
//! graph to the nodes the fetches and targets need (through data and control inputs, stopping
//! at fed tensors, since a fed tensor replaces its producer's output), checks for cycles (a
//! while loop's `NextIteration` into its `Merge` is the one allowed), creates each node's
//! kernel once and precomputes everything a step needs (pending counts,
//! successor lists, where each input comes from). [`Executor::run`] then only counts down:
//! a node starts when its last data or control predecessor is done.
//!
//! Scheduling: the thread that finishes a node runs the first successor it made ready itself
//! and hands the others to its device's pool ([`crate::runtime::Device::pool`]), so a chain
//! costs no thread hops and a fan-out runs in parallel. The pool runs about one thread per
//! core; kernels may block (a `_Recv` waiting for its rendezvous, with a deadline), and a
//! blocked thread, marked by [`crate::runtime::pool::blocking`], lets a queued node have a
//! thread of its own rather than starve. Two ways in:
//!
//! - [`Executor::run`] blocks its caller until the step ends. The caller runs the first root
//!   node itself, unless the step has a deadline: then it only waits, so that it can return at
//!   the deadline.
//! - [`Executor::spawn`] is for a caller on an async runtime (a worker's RunGraph). The caller
//!   runs only nodes that cannot wait and took at most a few microseconds last step, on inputs
//!   no larger ([`Inline`], [`InlineLimits`]), then returns; the thread that ends the step
//!   wakes the task awaiting it. A small step (the feed, an add, the fetch) thus costs no
//!   thread hop at all: on a two-core machine each hop is 15-20 µs, several times the step.
//!
//! Errors: the first failing node fails the step with its name in the message; nodes already
//! running finish, nothing new starts, and `run` returns once they are done (or at the step's
//! deadline, in which case stragglers finish in the background on their own copy of the state).
//!
//! Memory: a node's outputs are dropped as soon as the last node reading them has taken its
//! input (counted per step from the plan's reader counts), as TensorFlow does, so a step holds
//! its live tensors only; fetched outputs are kept until the step ends.
//!
//! Two engines run a step, chosen once per plan: graphs with TensorFlow 1 control flow
//! (`Switch`, `Merge`, `Enter`, `Exit`, `NextIteration`, `ControlTrigger`) run on
//! `frames.rs`, which knows dead tensors, while-loop frames and iterations (`frame_plan.rs` is
//! what it knows of a plan); every other graph runs on `plain.rs`, lock-free, paying only for
//! the deadness a `_Recv` may bring in from another partition. `step.rs` holds what both
//! share: the step's bookkeeping and the one way a kernel is run (reference inputs read first,
//! panics caught, memory charged).
//!
//! Traces: a step whose [`StepOptions::stats`] holds a [`StepStatsCollector`] records each
//! node's times, thread and outputs there (`stats.rs`); a step without one pays a branch per
//! node.
//!
//! Invariant: a step's node `n` runs at most once per frame iteration, after every
//! predecessor's outputs are set (once per step outside loops).

mod admit;
mod frame_plan;
mod frames;
mod plain;
mod step;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::error::{Result, Status};
use crate::graph::{attr, is_loop_back_edge, registry, ControlFlowOp};
use crate::kernels::functional::FunctionLibrary;
use crate::kernels::{inline_kind, Inline, OpKernel};
use crate::proto::{GraphDef, NodeDef};
use crate::runtime::device::Device;
use crate::tensor::{DType, PartialShape, Tensor};

pub use crate::kernels::KernelLookup;
pub use crate::runtime::stats::StepStatsCollector;
pub use crate::runtime::step::{RemoteRecv, StepOptions};

/// How much of a step [`Executor::spawn`]'s caller may run itself (see [`Inline`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InlineLimits {
    /// The most a node's last run may have taken for the caller to run it: the default is a
    /// few times a kernel's fixed cost, below the thread hop it saves.
    pub node: Duration,
    /// How long the caller runs nodes before it hands the rest to the pool: the most a step
    /// keeps an async runtime's thread (plus the node under way).
    pub step: Duration,
}

impl Default for InlineLimits {
    fn default() -> Self {
        Self {
            node: Duration::from_micros(10),
            step: Duration::from_micros(50),
        }
    }
}

/// A tensor name split into node and output slot: `node:i`, `node` (= `node:0`), `^node`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorRef<'a> {
    /// The producing node's name.
    pub node: &'a str,
    /// The output slot; `None` for a control input (`^node`).
    pub slot: Option<usize>,
}

impl<'a> TensorRef<'a> {
    /// Parses `node:i`, `node` or `^node`; INVALID_ARGUMENT naming `name` when malformed.
    pub fn parse(name: &'a str) -> Result<Self> {
        let bad = || {
            Status::invalid_argument(format!(
                "malformed tensor name `{name}`; expected `node`, `node:index` or `^node`"
            ))
        };
        if let Some(node) = name.strip_prefix('^') {
            if node.is_empty() || node.contains(':') {
                return Err(bad());
            }
            return Ok(Self { node, slot: None });
        }
        let (node, slot) = match name.rsplit_once(':') {
            Some((node, index)) => (node, index.parse::<usize>().map_err(|_| bad())?),
            None => (name, 0),
        };
        if node.is_empty() {
            return Err(bad());
        }
        Ok(Self {
            node,
            slot: Some(slot),
        })
    }

    /// Returns the canonical form: `node:i`, or `^node` for a control input.
    pub fn canonical(&self) -> String {
        match self.slot {
            Some(i) => format!("{}:{i}", self.node),
            None => format!("^{}", self.node),
        }
    }
}

/// Where a node input or a fetch comes from.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// The `k`th feed of the step.
    Feed(usize),
    /// Output `slot` of plan node `node`.
    Output { node: usize, slot: usize },
}

/// What the executor does with a node beyond running its kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Runs its kernel when all its inputs are live; dead otherwise.
    Plain,
    /// `_Send`: runs dead too, sending the deadness on.
    Send,
    /// `_Recv`: runs dead too; may receive a dead tensor (its output then dead).
    Recv,
    /// `Switch`/`RefSwitch`: sets one of its two outputs.
    Switch,
    /// `Merge`/`RefMerge`: fires on its first live input.
    Merge,
    /// `Enter`/`RefEnter`: into a while loop's frame.
    Enter,
    /// `Exit`/`RefExit`: out of a while loop's frame.
    Exit,
    /// `NextIteration`/`RefNextIteration`: into the next iteration.
    NextIteration,
    /// `ControlTrigger`: never dead.
    ControlTrigger,
}

impl Kind {
    fn of(op: &str) -> Kind {
        match op {
            "_Send" | "_HostSend" => Kind::Send,
            "_Recv" | "_HostRecv" => Kind::Recv,
            "ControlTrigger" => Kind::ControlTrigger,
            _ => match ControlFlowOp::of(op) {
                Some(ControlFlowOp::Switch) => Kind::Switch,
                Some(ControlFlowOp::Merge) => Kind::Merge,
                Some(ControlFlowOp::Enter) => Kind::Enter,
                Some(ControlFlowOp::Exit) => Kind::Exit,
                Some(ControlFlowOp::NextIteration) => Kind::NextIteration,
                None => Kind::Plain,
            },
        }
    }

    /// Whether the node needs the control-flow engine.
    fn is_control_flow(self) -> bool {
        !matches!(self, Kind::Plain | Kind::Send | Kind::Recv)
    }
}

/// A node of the pruned graph with its kernel and precomputed edges.
struct PlanNode {
    def: NodeDef,
    kernel: Arc<dyn OpKernel>,
    kind: Kind,
    /// Per input: whether the kernel gets it as a reference (`Ref(T)`, or an `Identity`
    /// passing a reference on); empty when none does.
    ref_inputs: Box<[bool]>,
    /// Whether a fetch reads its outputs.
    fetched: bool,
    inputs: Vec<Source>,
    /// Distinct nodes that wait for this one (data or control).
    successors: Vec<usize>,
    /// Number of distinct predecessors (data or control) in the pruned graph.
    pending: usize,
    /// How many data inputs of the step read this node's outputs; once they all have, the
    /// outputs are dropped. `None` when a fetch reads them after the step (kept to the end).
    readers: Option<usize>,
    /// Whether the thread that starts a step may run this node itself.
    inline: Inline,
    /// What the kernel took the last time it succeeded.
    cost: Cost,
    /// The check of its outputs against the device's memory before it runs, for the ops
    /// whose outputs can dwarf their inputs.
    admission: Option<admit::Admission>,
}

/// A node's last successful run: nanoseconds in its kernel and the bytes of its inputs
/// (`u64::MAX` nanoseconds until it has run).
struct Cost {
    nanos: AtomicU64,
    input_bytes: AtomicU64,
}

impl Default for Cost {
    fn default() -> Self {
        Self {
            nanos: AtomicU64::new(u64::MAX),
            input_bytes: AtomicU64::new(0),
        }
    }
}

/// A feed and what its placeholder (if it is one) says about it.
struct Feed {
    name: String,
    dtype: Option<DType>,
    shape: Option<PartialShape>,
}

/// Everything a step needs, computed once.
struct Plan {
    device: Arc<Device>,
    nodes: Vec<PlanNode>,
    roots: Vec<usize>,
    feeds: Vec<Feed>,
    fetches: Vec<(String, Source)>,
    /// Frames and dead-tensor bookkeeping, for plans with control-flow ops.
    control: Option<frame_plan::ControlPlan>,
    /// Whether a node may output a reference (a `VariableV2`), so inputs are checked for one.
    has_refs: bool,
    /// Whether a node may be dead (a `_Recv` may receive a dead tensor).
    may_be_dead: bool,
    /// Whether a node keeps state in the step's resource container (TensorArrays, stacks,
    /// temporary variables), which is dropped when the step ends.
    per_step_resources: bool,
    /// The graph's function library, for kernels that run the functions they name when they
    /// run (`tf.data`'s map, filter and the iterator's dataset factory).
    functions: Arc<FunctionLibrary>,
    /// The session the graph belongs to (see [`Executor::in_session`]).
    session: String,
}

/// Runs the pruned graph for one signature, step after step; `Send + Sync`, steps may overlap.
pub struct Executor {
    plan: Arc<Plan>,
    inline: InlineLimits,
}

impl Executor {
    /// Prunes `graph` to what `fetches` and `targets` need given `feeds`, and creates each
    /// remaining node's kernel for `device` through `kernels`.
    ///
    /// Errors: NOT_FOUND naming an unknown feed, fetch or target; INVALID_ARGUMENT for
    /// duplicated feeds ("Duplicated feeds"), malformed names, an input naming no node, or a
    /// cycle; whatever `kernels` returns, naming the node.
    pub fn new(
        graph: &GraphDef,
        feeds: &[&str],
        fetches: &[&str],
        targets: &[&str],
        device: Arc<Device>,
        kernels: &KernelLookup,
    ) -> Result<Self> {
        // A SaveV2's resource-variable reads become one read at one instant.
        let rewritten = crate::exec::consistent_save::read_saved_variables_together(graph)?;
        let graph = rewritten.as_ref().unwrap_or(graph);
        let mut index: HashMap<&str, usize> = HashMap::with_capacity(graph.node.len());
        for (i, node) in graph.node.iter().enumerate() {
            if index.insert(node.name.as_str(), i).is_some() {
                return Err(Status::invalid_argument(format!(
                    "the graph has two nodes named `{}`; node names must be unique",
                    node.name
                )));
            }
        }
        let find = |name: &str, what: &str, role: &str| {
            index.get(name).copied().ok_or_else(|| {
                Status::not_found(format!(
                    "{role} `{what}`: no node named `{name}` in the graph"
                ))
            })
        };

        // Feeds, keyed by (graph node, slot).
        let mut fed: HashMap<(usize, usize), usize> = HashMap::with_capacity(feeds.len());
        let mut feed_specs = Vec::with_capacity(feeds.len());
        for (k, name) in feeds.iter().enumerate() {
            let r = TensorRef::parse(name).map_err(|e| e.context("feed"))?;
            let Some(slot) = r.slot else {
                return Err(Status::invalid_argument(format!(
                    "feed `{name}` is a control input; feed a tensor (`node:index`)"
                )));
            };
            let g = find(r.node, name, "feed")?;
            if fed.insert((g, slot), k).is_some() {
                return Err(Status::invalid_argument(format!(
                    "Duplicated feeds: `{}` is fed more than once",
                    r.canonical()
                )));
            }
            feed_specs.push(placeholder_spec(&graph.node[g], slot, r.canonical()));
        }

        // Roots of the pruning walk: fetched tensors that are not fed, and targets.
        let mut fetch_refs = Vec::with_capacity(fetches.len());
        let mut stack = Vec::new();
        for name in fetches {
            let r = TensorRef::parse(name).map_err(|e| e.context("fetch"))?;
            let Some(slot) = r.slot else {
                return Err(Status::invalid_argument(format!(
                    "fetch `{name}` is a control input; fetch a tensor or make it a target"
                )));
            };
            let g = find(r.node, name, "fetch")?;
            if !fed.contains_key(&(g, slot)) {
                stack.push(g);
            }
            fetch_refs.push((r.canonical(), g, slot));
        }
        for name in targets {
            let node = name.strip_prefix('^').unwrap_or(name);
            stack.push(find(node, name, "target")?);
        }

        // Walk back through data and control inputs; a fed data input ends the walk there.
        let mut inputs_of: HashMap<usize, Vec<(usize, Option<usize>)>> = HashMap::new();
        while let Some(g) = stack.pop() {
            if inputs_of.contains_key(&g) {
                continue;
            }
            let node = &graph.node[g];
            let mut inputs = Vec::with_capacity(node.input.len());
            for input in &node.input {
                let r = TensorRef::parse(input)
                    .map_err(|e| e.context(format!("input of node `{}`", node.name)))?;
                let p = index.get(r.node).copied().ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "node `{}` has input `{input}`, but no node is named `{}`",
                        node.name, r.node
                    ))
                })?;
                let is_fed = r.slot.is_some_and(|slot| fed.contains_key(&(p, slot)));
                if !is_fed && !inputs_of.contains_key(&p) {
                    stack.push(p);
                }
                inputs.push((p, r.slot));
            }
            inputs_of.insert(g, inputs);
        }

        // Plan nodes in graph order, so runs and messages are deterministic.
        let mut kept: Vec<usize> = inputs_of.keys().copied().collect();
        kept.sort_unstable();
        let plan_index: HashMap<usize, usize> =
            kept.iter().enumerate().map(|(i, &g)| (g, i)).collect();

        // A `NextIteration` feeding a `Merge` closes a while loop: the only cycle allowed, and
        // not an edge the Merge waits for.
        let back_edge =
            |p: usize, g: usize| is_loop_back_edge(&graph.node[p].op, &graph.node[g].op);
        let mut edges: Vec<(Vec<Source>, Vec<usize>)> = Vec::with_capacity(kept.len());
        let mut control_inputs: Vec<Vec<usize>> = Vec::with_capacity(kept.len());
        for &g in &kept {
            let mut sources = Vec::new();
            let mut preds = Vec::new();
            let mut controls = Vec::new();
            for &(p, slot) in &inputs_of[&g] {
                match slot {
                    Some(slot) => match fed.get(&(p, slot)) {
                        Some(&k) => sources.push(Source::Feed(k)),
                        None => {
                            sources.push(Source::Output {
                                node: plan_index[&p],
                                slot,
                            });
                            if !back_edge(p, g) {
                                preds.push(plan_index[&p]);
                            }
                        }
                    },
                    None => {
                        preds.push(plan_index[&p]);
                        controls.push(plan_index[&p]);
                    }
                }
            }
            preds.sort_unstable();
            preds.dedup();
            controls.sort_unstable();
            controls.dedup();
            edges.push((sources, preds));
            control_inputs.push(controls);
        }
        let mut successors = vec![Vec::new(); kept.len()];
        for (n, (_, preds)) in edges.iter().enumerate() {
            for &p in preds {
                successors[p].push(n);
            }
        }
        check_acyclic(&kept, &edges, &successors, graph)?;

        let mut nodes = Vec::with_capacity(kept.len());
        for ((&g, (inputs, preds)), successors) in kept.iter().zip(edges).zip(successors) {
            let def = graph.node[g].clone();
            let kernel = if crate::kernels::functional::is_functional(&def.op) {
                let library = graph.library.as_ref();
                crate::kernels::functional::create(&def, library, device.device_type(), kernels)
            } else {
                kernels(&def, device.device_type())
            }
            .map_err(|e| name_node(e, &def))?;
            let inline = inline_kind(&def, device.device_type());
            let ref_inputs: Box<[bool]> = match registry::lookup(&def) {
                // An `Identity` of a reference (a variable's `read`) passes the reference on:
                // its readers read the variable when they run, as TensorFlow's aliasing of the
                // variable's buffer makes them see updates made in between
                // (SyncReplicasOptimizer's tokens read the global step through its `read`
                // after the step's increment).
                _ if def.op == "Identity" => Box::new([true]),
                Ok(op) if op.inputs.iter().any(|a| a.is_ref) => {
                    op.ref_inputs(&def).map_err(|e| name_node(e, &def))?.into()
                }
                _ => Box::new([]),
            };
            nodes.push(PlanNode {
                admission: admit::Admission::of(&def),
                kind: Kind::of(&def.op),
                ref_inputs,
                fetched: false,
                def,
                kernel,
                inputs,
                successors,
                pending: preds.len(),
                readers: Some(0),
                inline,
                cost: Cost::default(),
            });
        }
        for n in 0..nodes.len() {
            for i in 0..nodes[n].inputs.len() {
                if let Source::Output { node: p, .. } = nodes[n].inputs[i] {
                    nodes[p].readers = nodes[p].readers.map(|r| r + 1);
                }
            }
        }
        let roots: Vec<usize> = (0..nodes.len())
            .filter(|&n| nodes[n].pending == 0)
            .collect();
        let mut fetches = Vec::with_capacity(fetch_refs.len());
        for (name, g, slot) in fetch_refs {
            let source = match fed.get(&(g, slot)) {
                Some(&k) => Source::Feed(k),
                None => {
                    let node = plan_index[&g];
                    nodes[node].readers = None;
                    nodes[node].fetched = true;
                    Source::Output { node, slot }
                }
            };
            fetches.push((name, source));
        }
        let control = if nodes.iter().any(|n| n.kind.is_control_flow()) {
            let control = frame_plan::ControlPlan::new(&nodes, &control_inputs, &roots)?;
            for (name, source) in &fetches {
                if let Source::Output { node, .. } = *source {
                    control.check_fetch(name, node, nodes[node].kind)?;
                }
            }
            Some(control)
        } else {
            None
        };
        let has_refs = nodes
            .iter()
            .any(|n| registry::lookup(&n.def).is_ok_and(|op| op.outputs.iter().any(|a| a.is_ref)));
        let may_be_dead = control.is_some() || nodes.iter().any(|n| n.kind == Kind::Recv);
        let per_step_resources = nodes.iter().any(|n| {
            matches!(
                n.def.op.as_str(),
                "TensorArrayV3" | "StackV2" | "Stack" | "TemporaryVariable"
            )
        });
        let functions = Arc::new(FunctionLibrary::new(
            graph.library.clone(),
            device.device_type(),
            crate::exec::create_kernel,
        ));
        Ok(Self {
            inline: InlineLimits::default(),
            plan: Arc::new(Plan {
                functions,
                session: String::new(),
                device,
                nodes,
                roots,
                feeds: feed_specs,
                fetches,
                control,
                has_refs,
                may_be_dead,
                per_step_resources,
            }),
        })
    }

    /// The same executor for a graph of session `session` (a worker session's handle, a
    /// local session's name): its kernels name per-session resources within it, so two
    /// sessions running one graph on a task each walk their own iterators, as in TensorFlow.
    pub fn in_session(mut self, session: &str) -> Self {
        Arc::get_mut(&mut self.plan)
            .expect("an executor's plan is shared only once it runs")
            .session = session.to_string();
        self
    }

    /// The same executor with other [`InlineLimits`].
    pub fn with_inline_limits(mut self, limits: InlineLimits) -> Self {
        self.inline = limits;
        self
    }

    /// Returns the device the executor runs on.
    pub fn device(&self) -> &Arc<Device> {
        &self.plan.device
    }

    /// Returns the canonical feed names (`node:i`), in the order `run` takes their tensors.
    pub fn feed_names(&self) -> impl Iterator<Item = &str> {
        self.plan.feeds.iter().map(|f| f.name.as_str())
    }

    /// Returns the nodes that a step runs, in graph order.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeDef> {
        self.plan.nodes.iter().map(|n| &n.def)
    }

    /// Runs one step: `feeds` in the order the executor was built with; returns the fetched
    /// tensors in fetch order. Blocks the calling thread until the step ends (or its deadline).
    pub fn run(&self, feeds: Vec<Tensor>, options: &StepOptions) -> Result<Vec<Tensor>> {
        let step = self.begin(feeds, options, None)?;
        let plan = &self.plan;
        // With a deadline the caller only waits, so that it can give up at the deadline even
        // when a kernel blocks; without one it runs the first root itself (no thread hop),
        // unless the device has memory of its own: a GPU is called only from its own threads.
        let run_first_here = options.deadline.is_none() && plan.device.memory_space().is_none();
        match &step {
            Engine::Plain(state) => {
                let inline = if run_first_here {
                    plan.roots.first()
                } else {
                    None
                };
                for &root in &plan.roots {
                    if Some(&root) != inline {
                        let state = state.clone();
                        plan.device
                            .pool()
                            .spawn(move || plain::process(&state, root));
                    }
                }
                if let Some(&root) = inline {
                    plain::process(state, root);
                }
            }
            Engine::Control(state) => frames::start(state, run_first_here),
        }
        if !plan.roots.is_empty() {
            step.common().wait();
        }
        step.result()
    }

    /// Starts one step and returns without waiting for it, for callers on an async runtime;
    /// the thread that finishes the step's last node wakes the task awaiting
    /// [`RunningStep::finish`].
    ///
    /// The calling thread first runs the nodes that cannot wait and proved cheap in earlier
    /// steps (see [`Inline`]), within the executor's [`InlineLimits`]; every other node goes
    /// to the pool. A small step thus finishes here without a thread hop, as TensorFlow runs
    /// inexpensive kernels inline. A node whose work grows while its inputs do not (a `Fill`
    /// fed a larger shape value) may run here once more before it is measured again. Steps
    /// with control flow run entirely on the pool.
    pub fn spawn(&self, feeds: Vec<Tensor>, options: &StepOptions) -> Result<RunningStep> {
        let (notify, finished) = oneshot::channel();
        let step = self.begin(feeds, options, Some(notify))?;
        if self.plan.roots.is_empty() {
            step.common().finish();
        }
        match &step {
            Engine::Plain(state) => {
                let started = Instant::now();
                let mut ready: Vec<usize> = self.plan.roots.iter().rev().copied().collect();
                while let Some(n) = ready.pop() {
                    if started.elapsed() < self.inline.step
                        && state.runs_inline(n, self.inline.node)
                    {
                        state.run_node(n, |s| ready.push(s));
                    } else {
                        let state = state.clone();
                        self.plan
                            .device
                            .pool()
                            .spawn(move || plain::process(&state, n));
                    }
                }
            }
            Engine::Control(state) => frames::start(state, false),
        }
        Ok(RunningStep { step, finished })
    }

    /// Checks the feeds and sets up a step's state; `notify` is told when the step ends.
    fn begin(
        &self,
        feeds: Vec<Tensor>,
        options: &StepOptions,
        notify: Option<oneshot::Sender<()>>,
    ) -> Result<Engine> {
        let plan = &self.plan;
        if feeds.len() != plan.feeds.len() {
            return Err(Status::invalid_argument(format!(
                "{} feed tensors given; this executor takes {} ({})",
                feeds.len(),
                plan.feeds.len(),
                plan.feeds
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        for (spec, tensor) in plan.feeds.iter().zip(&feeds) {
            spec.check(tensor)?;
        }
        let common = step::StepCommon::new(plan.clone(), feeds, options, notify);
        Ok(match plan.control {
            None => Engine::Plain(plain::StepState::new(common)),
            Some(_) => {
                let state = frames::ControlStep::new(common);
                state.common.set_control(&state);
                Engine::Control(state)
            }
        })
    }
}

/// A step on one of the two engines.
enum Engine {
    Plain(Arc<plain::StepState>),
    Control(Arc<frames::ControlStep>),
}

impl Engine {
    fn common(&self) -> &step::StepCommon {
        match self {
            Engine::Plain(s) => &s.common,
            Engine::Control(s) => &s.common,
        }
    }

    /// The step's first error, or its fetches in fetch order. The step's resource container
    /// (its TensorArrays, stacks and temporary variables) is dropped.
    fn result(&self) -> Result<Vec<Tensor>> {
        let common = self.common();
        if common.plan.per_step_resources {
            common
                .plan
                .device
                .resources()
                .cleanup_step(common.options.step_id);
        }
        match self {
            Engine::Plain(s) => s.result(),
            Engine::Control(s) => {
                let common = &s.common;
                if let Some(status) = common.take_error() {
                    return Err(status);
                }
                common
                    .plan
                    .fetches
                    .iter()
                    .map(|(name, source)| match *source {
                        Source::Feed(k) => Ok(common.feeds[k].clone()),
                        Source::Output { node, slot } => common
                            .kept_fetch(name, node, slot)
                            .and_then(|t| if t.is_ref() { t.deref() } else { Ok(t) }),
                    })
                    .collect()
            }
        }
    }
}

/// A step started by [`Executor::spawn`], running on the pool.
pub struct RunningStep {
    step: Engine,
    finished: oneshot::Receiver<()>,
}

impl RunningStep {
    /// Waits for the step to end without blocking a thread; returns the fetched tensors in
    /// fetch order, or the step's first error. At the step's deadline it fails the step with
    /// DEADLINE_EXCEEDED and returns; nodes still running finish on their own.
    pub async fn finish(self) -> Result<Vec<Tensor>> {
        let common = self.step.common();
        let finished = match common.options.deadline {
            Some(deadline) => tokio::time::timeout_at(deadline.into(), self.finished)
                .await
                .is_ok(),
            None => self.finished.await.is_ok(),
        };
        if !finished {
            common.fail(common.deadline_exceeded());
        }
        self.step.result()
    }
}

impl Feed {
    /// Checks a fed tensor against its placeholder's `dtype` and `shape` attrs.
    fn check(&self, tensor: &Tensor) -> Result<()> {
        if let Some(dtype) = self.dtype {
            if tensor.dtype() != dtype {
                return Err(Status::invalid_argument(format!(
                    "feed `{}` is a {} tensor, but its placeholder has dtype {dtype}",
                    self.name,
                    tensor.dtype()
                )));
            }
        }
        if let Some(shape) = &self.shape {
            if !shape.is_compatible_with(tensor.shape()) {
                return Err(Status::invalid_argument(format!(
                    "cannot feed a value of shape {} for `{}`, whose placeholder has shape {shape}",
                    tensor.shape(),
                    self.name
                )));
            }
        }
        Ok(())
    }
}

/// What a fed node says about its output `slot`: placeholders declare a dtype and a shape.
fn placeholder_spec(node: &NodeDef, slot: usize, name: String) -> Feed {
    let is_placeholder = matches!(
        node.op.as_str(),
        "Placeholder" | "PlaceholderV2" | "PlaceholderWithDefault"
    );
    if !is_placeholder || slot != 0 {
        return Feed {
            name,
            dtype: None,
            shape: None,
        };
    }
    let dtype = attr::dtype(node, "dtype").ok();
    let shape = attr::shape(node, "shape").ok();
    Feed { name, dtype, shape }
}

/// Puts the node's name in front of an error that does not mention it yet.
fn name_node(status: Status, node: &NodeDef) -> Status {
    if status.message().contains(&format!("`{}`", node.name)) {
        status
    } else {
        status.context(format!("node `{}` (op {})", node.name, node.op))
    }
}

/// Fails with INVALID_ARGUMENT naming some nodes on a cycle, when the pruned graph has one.
fn check_acyclic(
    kept: &[usize],
    edges: &[(Vec<Source>, Vec<usize>)],
    successors: &[Vec<usize>],
    graph: &GraphDef,
) -> Result<()> {
    let mut pending: Vec<usize> = edges.iter().map(|(_, preds)| preds.len()).collect();
    let mut ready: Vec<usize> = (0..kept.len()).filter(|&n| pending[n] == 0).collect();
    let mut seen = 0;
    while let Some(n) = ready.pop() {
        seen += 1;
        for &s in &successors[n] {
            pending[s] -= 1;
            if pending[s] == 0 {
                ready.push(s);
            }
        }
    }
    if seen == kept.len() {
        return Ok(());
    }
    let stuck: HashSet<usize> = (0..kept.len()).filter(|&n| pending[n] > 0).collect();
    let mut names: Vec<&str> = stuck
        .iter()
        .map(|&n| graph.node[kept[n]].name.as_str())
        .collect();
    names.sort_unstable();
    let shown = names
        .iter()
        .take(5)
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    Err(Status::invalid_argument(format!(
        "the graph has a cycle among {} nodes ({shown}{}); tessera runs acyclic graphs only",
        names.len(),
        if names.len() > 5 { ", ..." } else { "" }
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_names_parse_to_node_and_slot() {
        assert_eq!(
            TensorRef::parse("a").unwrap(),
            TensorRef {
                node: "a",
                slot: Some(0)
            }
        );
        assert_eq!(
            TensorRef::parse("a/b:2").unwrap(),
            TensorRef {
                node: "a/b",
                slot: Some(2)
            }
        );
        assert_eq!(
            TensorRef::parse("^a").unwrap(),
            TensorRef {
                node: "a",
                slot: None
            }
        );
        assert_eq!(TensorRef::parse("a:1").unwrap().canonical(), "a:1");
        for bad in ["", ":0", "a:x", "^", "^a:0", "a:-1"] {
            assert!(TensorRef::parse(bad).is_err(), "{bad:?} should not parse");
        }
    }
}
