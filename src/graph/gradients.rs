//! Symbolic gradients: adds the backward graph of `ys` with respect to `xs`, as TensorFlow's
//! `tf.gradients` does, with its node names.
//!
//! The backward pass visits the ops that lie on a path from an `x` to a `y` (data edges only),
//! in reverse topological order. Each op's output gradients are summed over its consumers
//! (`gradients/AddN`), missing float output gradients become `gradients/zeros_like`, and the
//! op's registered gradient function runs in name scope `gradients/<op name>_grad`. Ops marked
//! not differentiable (`StopGradient`, `Shape`, comparisons, integer-valued ops) pass nothing
//! back; an op with no gradient function on a path is an error naming it. An `x` that no `y`
//! depends on gets `None`.
//!
//! Reading a resource variable (`ReadVariableOp`) passes its gradient to the handle, so a
//! variable's gradient is taken with respect to its `VarHandleOp` output and sums every read.
//!
//! Control flow built with [`Graph::cond`] and [`Graph::while_loop`] is differentiated as
//! TensorFlow 1 does (`gradients_util.py` with `control_flow_state.py`): every forward loop on
//! the way gets a gradient loop before backprop starts (see `grad_state.rs`), the gradient
//! functions of ops in a loop run in its gradient loop, a loop's Switch is visited once from
//! its Exit and once from its body, and a loop's Exits are visited together (an Exit nobody
//! differentiated gets zeros once another has a gradient). Each gradient takes the static shape
//! of the input it is for.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::error::{Result, Status};
use crate::graph::builder::{parse_input, Graph, NodeSpec, Output};
use crate::graph::grad_state::LoopState;
use crate::graph::registry::{self, Gradient};
use crate::proto::NodeDef;
use crate::tensor::{DType, PartialShape};

/// A gradient function: given the forward op and the gradients of its outputs, adds nodes
/// computing the gradients of its inputs (`None` where no gradient flows).
pub type GradFn = fn(&mut Graph, &GradCtx) -> Result<Vec<Option<Output>>>;

/// What a gradient function sees of the forward op.
pub struct GradCtx {
    /// The forward node.
    pub node: NodeDef,
    /// Its data inputs.
    pub inputs: Vec<Output>,
    /// Its outputs.
    pub outputs: Vec<Output>,
    /// The gradient of each output (`None` for outputs no gradient flows through, such as
    /// integer outputs).
    pub grads: Vec<Option<Output>>,
}

impl GradCtx {
    /// Returns input `i`.
    pub fn input(&self, i: usize) -> Result<&Output> {
        self.inputs
            .get(i)
            .ok_or_else(|| self.err(format!("has no input {i}")))
    }

    /// Returns output `i`.
    pub fn output(&self, i: usize) -> Result<&Output> {
        self.outputs
            .get(i)
            .ok_or_else(|| self.err(format!("has no output {i}")))
    }

    /// Returns the gradient of output `i`, which must exist.
    pub fn grad(&self, i: usize) -> Result<&Output> {
        self.grads
            .get(i)
            .and_then(Option::as_ref)
            .ok_or_else(|| self.err(format!("has no gradient for output {i}")))
    }

    /// An INTERNAL / UNIMPLEMENTED-free error naming the forward node.
    pub fn err(&self, message: impl std::fmt::Display) -> Status {
        Status::invalid_argument(format!(
            "gradient of node `{}` (op {}): {message}",
            self.node.name, self.node.op
        ))
    }
}

/// Options of [`gradients_with`].
#[derive(Clone, Debug, Default)]
pub struct GradientOptions {
    /// Gate each op's input gradients behind one another (TensorFlow's `gate_gradients`,
    /// which optimizers turn on): when an op passes back two or more gradients, they go
    /// through `<op>_grad/tuple/control_dependency*` identities that all wait on
    /// `<op>_grad/tuple/group_deps`, so none is used before all are computed.
    pub gate_gradients: bool,
}

/// Adds the gradients of `sum(ys)` (weighted by `grad_ys`, ones by default) with respect to
/// each of `xs`; `None` where an `x` does not reach any `y`. This is `tf.gradients` with its
/// defaults; see [`gradients_with`] for gating.
pub fn gradients(
    g: &mut Graph,
    ys: &[Output],
    xs: &[Output],
    grad_ys: Option<&[Output]>,
) -> Result<Vec<Option<Output>>> {
    gradients_with(g, ys, xs, grad_ys, &GradientOptions::default())
}

/// [`gradients`] with options.
pub fn gradients_with(
    g: &mut Graph,
    ys: &[Output],
    xs: &[Output],
    grad_ys: Option<&[Output]>,
    options: &GradientOptions,
) -> Result<Vec<Option<Output>>> {
    if let Some(gy) = grad_ys {
        if gy.len() != ys.len() {
            return Err(Status::invalid_argument(format!(
                "{} grad_ys given for {} ys; pass one per y",
                gy.len(),
                ys.len()
            )));
        }
    }
    for t in ys.iter().chain(xs) {
        g.output(&t.node, t.index)?;
    }
    g.with_name_scope("gradients", |g| backprop(g, ys, xs, grad_ys, options))
}

/// Routes two or more gradients through identities that wait for all of them
/// (`tuple/group_deps`, `tuple/control_dependency`, ...), as TensorFlow's `tuple` does.
fn gate(g: &mut Graph, grads: Vec<Option<Output>>) -> Result<Vec<Option<Output>>> {
    if grads.iter().flatten().count() < 2 {
        return Ok(grads);
    }
    g.with_name_scope("tuple", |g| {
        let mut deps: Vec<String> = grads.iter().flatten().map(|o| o.node.clone()).collect();
        deps.sort();
        deps.dedup();
        // The group runs where its inputs run when they share a device, like `tf.group`.
        let devices: HashSet<&str> = deps
            .iter()
            .filter_map(|d| g.node(d))
            .map(|n| n.device.as_str())
            .collect();
        let device = match devices.len() {
            1 => devices.into_iter().next().unwrap_or_default().to_string(),
            _ => String::new(),
        };
        let mut spec = NodeSpec::new("NoOp").name("group_deps");
        for d in &deps {
            spec = spec.control(d);
        }
        let group = g.with_device_scopes_cleared(|g| g.with_device(&device, |g| g.add_op(spec)))?;
        grads
            .into_iter()
            .map(|o| {
                o.map(|o| {
                    g.with_colocation(&o.node.clone(), |g| {
                        g.add1(
                            NodeSpec::new("Identity")
                                .name("control_dependency")
                                .input(&o)
                                .control(&group),
                        )
                    })
                })
                .transpose()
            })
            .collect()
    })
}

type Key = (String, usize);

fn data_inputs(node: &NodeDef) -> impl Iterator<Item = (&str, usize)> {
    node.input
        .iter()
        .filter(|i| !i.starts_with('^'))
        .map(|i| parse_input(i))
}

fn backprop(
    g: &mut Graph,
    ys: &[Output],
    xs: &[Output],
    grad_ys: Option<&[Output]>,
    options: &GradientOptions,
) -> Result<Vec<Option<Output>>> {
    // Consumers of each node, over data edges.
    let mut consumers: HashMap<String, Vec<String>> = HashMap::new();
    for n in g.nodes() {
        for (src, _) in data_inputs(n) {
            consumers
                .entry(src.to_string())
                .or_default()
                .push(n.name.clone());
        }
    }
    // Ops reachable from the xs, then those of them the ys depend on.
    let mut reached: HashSet<String> = HashSet::new();
    let mut stack: Vec<String> = xs.iter().map(|x| x.node.clone()).collect();
    while let Some(n) = stack.pop() {
        if reached.insert(n.clone()) {
            stack.extend(consumers.get(&n).into_iter().flatten().cloned());
        }
    }
    let mut between: HashSet<String> = HashSet::new();
    let mut between_list: Vec<String> = Vec::new();
    let mut stack: Vec<String> = ys.iter().map(|y| y.node.clone()).collect();
    while let Some(n) = stack.pop() {
        if reached.contains(&n) && between.insert(n.clone()) {
            let node = g
                .node(&n)
                .ok_or_else(|| Status::internal(format!("lost node `{n}`")))?;
            stack.extend(data_inputs(node).map(|(s, _)| s.to_string()));
            between_list.push(n);
        }
    }
    // While loops on the way get their gradient loops; every Exit of such a loop is visited.
    let mut loops: Option<LoopState> = None;
    let exits: Vec<String> = between_list
        .iter()
        .filter(|n| g.is_loop_exit(n))
        .cloned()
        .collect();
    for exit in exits {
        let state = loops.get_or_insert_with(LoopState::default);
        for e in g.add_while_context(state, &exit)? {
            if between.insert(e.node.clone()) {
                between_list.push(e.node);
            }
        }
    }
    // How many between-op consumers (edges) each op waits for.
    let mut pending: HashMap<String, i64> = HashMap::new();
    for n in &between_list {
        let node = g
            .node(n)
            .ok_or_else(|| Status::internal(format!("lost node `{n}`")))?;
        for (src, _) in data_inputs(node) {
            if between.contains(src) {
                *pending.entry(src.to_string()).or_default() += 1;
            }
        }
    }

    let mut grads: HashMap<Key, Vec<Output>> = HashMap::new();
    for (i, y) in ys.iter().enumerate() {
        let gy = match grad_ys {
            Some(gy) => {
                if gy[i].dtype != y.dtype {
                    return Err(Status::invalid_argument(format!(
                        "grad_ys[{i}] is {} but y `{}` is {}",
                        gy[i].dtype,
                        y.name(),
                        y.dtype
                    )));
                }
                gy[i].clone()
            }
            None => default_grad_y(g, y, i)?,
        };
        grads.entry((y.node.clone(), y.index)).or_default().push(gy);
    }

    let x_nodes: HashSet<&str> = xs.iter().map(|x| x.node.as_str()).collect();
    let mut queue: VecDeque<String> = VecDeque::new();
    let mut to_ops: HashSet<String> = HashSet::new();
    for y in ys {
        if between.contains(&y.node)
            && pending.get(&y.node).copied().unwrap_or(0) == 0
            && to_ops.insert(y.node.clone())
        {
            queue.push_back(y.node.clone());
        }
    }
    // The gradients summed so far of a loop Switch's outputs, kept for its second visit.
    let mut switch_grads: HashMap<Key, Output> = HashMap::new();
    if let Some(state) = &loops {
        for exit in process_unused_loop_exits(g, state, &pending, &to_ops) {
            if exit.dtype.is_float() {
                let zeros = g.zeros_like_for_exit(&exit)?;
                grads
                    .entry((exit.node.clone(), exit.index))
                    .or_default()
                    .push(zeros);
                queue.push_back(exit.node.clone());
            }
        }
    }
    let top = g.cf.current;
    let mut final_grads: HashMap<Key, Output> = HashMap::new();
    while let Some(name) = queue.pop_front() {
        let node = g
            .node(&name)
            .cloned()
            .ok_or_else(|| Status::internal(format!("lost node `{name}`")))?;
        let outputs = g.outputs_of(&name)?;
        // Output gradients are summed where the op's consumers are: outside an Exit's loop.
        let before = loops
            .as_ref()
            .and_then(|l| l.grad_context(g, &name, true))
            .or(top);
        let mut out_grads: Vec<Option<Output>> = Vec::with_capacity(outputs.len());
        for o in &outputs {
            let key = (name.clone(), o.index);
            let received = grads.remove(&key).unwrap_or_default();
            let summed = match switch_grads.get(&key) {
                Some(kept) if received.is_empty() => Some(kept.clone()),
                _ => g.cf_enter(before, |g| aggregate(g, received))?,
            };
            if let Some(s) = &summed {
                final_grads.insert(key.clone(), s.clone());
                if g.is_loop_switch(&name) {
                    switch_grads.insert(key, s.clone());
                }
            }
            out_grads.push(summed);
        }
        let inputs: Vec<Output> = data_inputs(&node)
            .map(|(s, i)| g.output(s, i))
            .collect::<Result<_>>()?;
        let feeds_between = inputs.iter().any(|i| between.contains(&i.node));
        let is_stop = x_nodes.contains(name.as_str()) && !feeds_between;
        let after = loops
            .as_ref()
            .and_then(|l| l.grad_context(g, &name, false))
            .or(top);
        if out_grads.iter().any(Option::is_some) && !is_stop && feeds_between {
            let in_grads = g.cf_enter(after, |g| {
                op_gradients(g, &loops, &node, &inputs, outputs, out_grads, options)
            })?;
            for (input, ig) in inputs.iter().zip(in_grads) {
                let Some(ig) = ig else { continue };
                // A gradient has its input's shape (TensorFlow's `set_shape` here), which keeps
                // shapes known through run-time reductions, as loop accumulators need.
                let ig = refine_shape(g, &node, input, ig)?;
                if between.contains(&input.node)
                    && (input.dtype.is_float() || input.dtype == DType::Resource)
                {
                    grads
                        .entry((input.node.clone(), input.index))
                        .or_default()
                        .push(ig);
                }
            }
        }
        // One decrement per edge; a loop Switch is visited again for each of its consumers.
        for input in &inputs {
            if !between.contains(&input.node) {
                continue;
            }
            let p = pending.entry(input.node.clone()).or_default();
            *p -= 1;
            let ready = *p == 0 || (loops.is_some() && *p > 0 && g.is_loop_switch(&input.node));
            if !ready {
                continue;
            }
            match &mut loops {
                Some(state) if g.is_loop_exit(&input.node) => {
                    let ready_exits = defer_exit(g, state, input, &grads)?;
                    for (exit, zeros) in ready_exits {
                        if zeros {
                            let z = g.cf_enter(top, |g| g.zeros_like_for_exit(&exit))?;
                            grads
                                .entry((exit.node.clone(), exit.index))
                                .or_default()
                                .push(z);
                        }
                        queue.push_back(exit.node);
                    }
                }
                _ => queue.push_back(input.node.clone()),
            }
        }
    }
    if let Some(state) = &loops {
        g.post_process_loops(state)?;
    }
    xs.iter()
        .map(|x| {
            let key = (x.node.clone(), x.index);
            if let Some(gr) = final_grads.get(&key) {
                return Ok(Some(gr.clone()));
            }
            aggregate(g, grads.remove(&key).unwrap_or_default())
        })
        .collect()
}

/// Gives gradient `ig` of `input` (an input of `node`) what is known of `input`'s shape;
/// shapes that cannot agree are an error naming the op.
fn refine_shape(g: &mut Graph, node: &NodeDef, input: &Output, ig: Output) -> Result<Output> {
    if input.dtype == DType::Resource || ig.dtype == DType::Resource || ig.shape == input.shape {
        return Ok(ig);
    }
    let (Some(a), Some(b)) = (ig.shape.dims(), input.shape.dims()) else {
        let known = if ig.shape.rank().is_some() {
            ig.shape.clone()
        } else {
            input.shape.clone()
        };
        return Ok(g.set_output_shape(&ig, known));
    };
    let merged: Option<Vec<Option<usize>>> = (a.len() == b.len())
        .then(|| {
            a.iter()
                .zip(b)
                .map(|(x, y)| match (x, y) {
                    (Some(x), Some(y)) if x != y => None,
                    (Some(x), _) | (None, Some(x)) => Some(Some(*x)),
                    (None, None) => Some(None),
                })
                .collect()
        })
        .flatten();
    match merged {
        Some(dims) => Ok(g.set_output_shape(&ig, PartialShape::new(dims))),
        None => Err(Status::internal(format!(
            "the gradient `{}` computed for input `{}` of node `{}` (op {}) has shape {}, \
             incompatible with the input's shape {}",
            ig.name(),
            input.name(),
            node.name,
            node.op,
            ig.shape,
            input.shape
        ))),
    }
}

/// Runs the gradient function of `node` (in its gradient loop when it is in a loop): fills
/// the missing gradients of its float outputs with zeros first, and gates the results when
/// asked.
fn op_gradients(
    g: &mut Graph,
    loops: &Option<LoopState>,
    node: &NodeDef,
    inputs: &[Output],
    outputs: Vec<Output>,
    mut out_grads: Vec<Option<Output>>,
    options: &GradientOptions,
) -> Result<Vec<Option<Output>>> {
    let name = node.name.clone();
    let def = registry::lookup(node)?;
    let f = match def.gradient {
        Gradient::NotDifferentiable => return Ok(vec![None; inputs.len()]),
        Gradient::Missing => {
            return Err(Status::unimplemented(format!(
                "no gradient is defined for op {} (node `{}`), which lies between the \
                 ys and xs; wrap its output in StopGradient or drop that path",
                node.op, node.name
            )))
        }
        Gradient::Fn(f) => f,
    };
    // Float outputs nobody differentiated get zeros, as TensorFlow does.
    for (o, og) in outputs.iter().zip(out_grads.iter_mut()) {
        if og.is_none() && o.dtype.is_float() {
            *og = match loops {
                Some(state) => g.zeros_like_in_loop(state, &name, o.index)?,
                None => Some(g.zeros_like_output(&name, o.index)?),
            };
        }
        // A resource Switch of a cond (a variable read in one branch) gets zeros of the
        // variable's shape on the untaken side.
        if og.is_none()
            && o.dtype == DType::Resource
            && g.is_switch(&name)
            && !g.is_loop_switch(&name)
            && g.op_while_context(&name).is_none()
            && g.op_context(&name).is_some()
        {
            *og = g.zeros_like_output(&name, o.index).ok();
        }
    }
    let ctx = GradCtx {
        node: node.clone(),
        inputs: inputs.to_vec(),
        outputs,
        grads: out_grads,
    };
    let scope = format!("{name}_grad");
    let r = g.with_name_scope(&scope, |g| {
        let r = f(g, &ctx)?;
        if options.gate_gradients {
            gate(g, r)
        } else {
            Ok(r)
        }
    })?;
    if r.len() != inputs.len() {
        return Err(ctx.err(format!(
            "gradient function returned {} gradients for {} inputs",
            r.len(),
            inputs.len()
        )));
    }
    Ok(r)
}

/// The loops' Exits no y depends on (`ProcessUnusedLoopExits`): they count as visited, and
/// when all Exits of a loop are, those that need a zero gradient are returned.
fn process_unused_loop_exits(
    g: &mut Graph,
    state: &LoopState,
    pending: &HashMap<String, i64>,
    to_ops: &HashSet<String>,
) -> Vec<Output> {
    let mut out = Vec::new();
    let mut states: Vec<usize> = state.map.values().copied().collect();
    states.sort_unstable();
    for s in states {
        let exits = g.cf.grad_states[s].forward_loop_exits.clone();
        for y in exits {
            if pending.get(&y.node).copied().unwrap_or(0) != 0 {
                continue;
            }
            let st = &mut g.cf.grad_states[s];
            st.pending_exits_count = st.pending_exits_count.saturating_sub(1);
            if !to_ops.contains(&y.node) {
                st.unused_exits.push(y.clone());
            }
            if st.pending_exits_count == 0 {
                out.extend(st.unused_exits.iter().cloned());
            }
        }
    }
    out
}

/// An Exit whose consumers are done waits for the other Exits of its loop; when the last one
/// is in, returns the Exits to visit, with whether each needs a zero gradient.
fn defer_exit(
    g: &mut Graph,
    state: &LoopState,
    exit: &Output,
    grads: &HashMap<Key, Vec<Output>>,
) -> Result<Vec<(Output, bool)>> {
    let s = state
        .grad_state(g, &exit.node, false)
        .ok_or_else(|| Status::internal(format!("Exit `{}` has no gradient loop", exit.node)))?;
    let st = &mut g.cf.grad_states[s];
    st.deferred_exits.push(exit.clone());
    st.pending_exits_count = st.pending_exits_count.saturating_sub(1);
    if st.pending_exits_count > 0 {
        return Ok(Vec::new());
    }
    let has_grad = |y: &Output| {
        grads
            .iter()
            .any(|((n, _), v)| n == &y.node && !v.is_empty())
    };
    let mut out = Vec::new();
    let deferred = std::mem::take(&mut st.deferred_exits);
    let mut any = false;
    for y in deferred {
        if has_grad(&y) {
            any = true;
            out.push((y, false));
        } else {
            st.unused_exits.push(y);
        }
    }
    for y in st.unused_exits.clone() {
        let zeros = any && y.dtype.is_float();
        out.push((y, zeros));
    }
    Ok(out)
}

/// The initial gradient of `y`: ones of its shape (`gradients/Shape`, `gradients/grad_ys_i`).
fn default_grad_y(g: &mut Graph, y: &Output, i: usize) -> Result<Output> {
    if !y.dtype.is_float() {
        return Err(Status::invalid_argument(format!(
            "cannot differentiate `{}`: it is {}, gradients need float32 or float64 ys",
            y.name(),
            y.dtype
        )));
    }
    let shape = g.shape_of(y)?;
    g.with_name_scope(&format!("grad_ys_{i}"), |g| {
        let one = g.scalar("Const", y.dtype, 1.0)?;
        let name = format!("{}/", g.name_scope());
        g.add1(NodeSpec::new("Fill").name(&name).input(&shape).input(&one))
    })
}

/// Sums the gradients reaching one output: itself when one, `AddN` when several.
fn aggregate(g: &mut Graph, mut gs: Vec<Output>) -> Result<Option<Output>> {
    match gs.len() {
        0 => Ok(None),
        1 => Ok(gs.pop()),
        _ => g.add_n(&gs).map(Some),
    }
}

/// How the gradient of a broadcasting binary op is reduced back to one operand's shape.
pub(crate) enum Reduce {
    /// The operand already has the gradient's shape.
    None,
    /// Sum over these constant axes, then reshape to the operand's shape.
    Static(Vec<i64>),
    /// Shapes are only known at run time: use `BroadcastGradientArgs`.
    Dynamic,
}

/// Decides statically, when the partial shapes allow, which axes of `grad` to sum to get back
/// to `operand` (TensorFlow's `SmartBroadcastGradientArgs`). `other` is the operand `operand`
/// was broadcast against, when there is one: an unknown dim of `operand` needs no reduction
/// when `other` lacks that dim or has it as 1, since the result's dim is then `operand`'s.
pub(crate) fn static_reduction(
    operand: &PartialShape,
    other: Option<&PartialShape>,
    grad: &PartialShape,
) -> Reduce {
    if operand == grad && operand.is_fully_defined() {
        return Reduce::None;
    }
    let (Some(od), Some(gd)) = (operand.dims(), grad.dims()) else {
        return Reduce::Dynamic;
    };
    if od.len() > gd.len() {
        return Reduce::Dynamic;
    }
    let other = other
        .and_then(PartialShape::dims)
        .filter(|o| o.len() <= gd.len());
    let lead = gd.len() - od.len();
    let mut axes: Vec<i64> = (0..lead as i64).collect();
    for (k, &o) in od.iter().enumerate() {
        let i = lead + k;
        // The other operand's size at this dim; a missing dim broadcasts like 1.
        let other_dim = other.map(|ot| {
            let ol = gd.len() - ot.len();
            if i < ol {
                Some(1)
            } else {
                ot[i - ol]
            }
        });
        match o {
            // Summing a grad dim that turns out to be 1 is harmless, so reduce unless known 1.
            Some(1) if gd[i] != Some(1) => axes.push(i as i64),
            Some(_) => {}
            None if other_dim == Some(Some(1)) => {}
            None => return Reduce::Dynamic,
        }
    }
    Reduce::Static(axes)
}

/// Reduces `grad` (of a broadcast result) back to the shapes of `x` and `y`, with the nodes
/// TensorFlow adds: `Shape`, `Shape_1`, then per operand `Sum` + `Reshape`, through
/// `BroadcastGradientArgs` when the shapes are only known at run time.
pub(crate) fn unbroadcast(
    g: &mut Graph,
    x: &Output,
    y: &Output,
    gx: Output,
    gy: Output,
) -> Result<(Output, Output)> {
    if x.shape == y.shape
        && x.shape.is_fully_defined()
        && gx.shape == x.shape
        && gy.shape == y.shape
    {
        return Ok((gx, gy));
    }
    let sx = g.shape_of(x)?;
    let sy = g.shape_of(y)?;
    let rx = static_reduction(&x.shape, Some(&y.shape), &gx.shape);
    let ry = static_reduction(&y.shape, Some(&x.shape), &gy.shape);
    if matches!(rx, Reduce::Dynamic) || matches!(ry, Reduce::Dynamic) {
        let mut r = g.add_node(NodeSpec::new("BroadcastGradientArgs").input(&sx).input(&sy))?;
        let (r0, r1) = (r.remove(0), r.remove(0));
        let sum_x = g.reduce("Sum", &gx, &r0, false)?;
        let gx = g.reshape(&sum_x, &sx)?;
        let sum_y = g.reduce("Sum", &gy, &r1, false)?;
        let gy = g.reshape(&sum_y, &sy)?;
        return Ok((gx, gy));
    }
    let reduce =
        |g: &mut Graph, r: Reduce, grad: Output, s: &Output, operand: &Output| -> Result<Output> {
            match r {
                Reduce::None => Ok(grad),
                Reduce::Static(axes) if axes.is_empty() && grad.shape == operand.shape => Ok(grad),
                Reduce::Static(axes) if axes.is_empty() => g.reshape(&grad, s),
                Reduce::Static(axes) => {
                    let summed = g.sum(&grad, &axes, false)?;
                    g.reshape(&summed, s)
                }
                Reduce::Dynamic => unreachable!("handled above"),
            }
        };
    let gx = reduce(g, rx, gx, &sx, x)?;
    let gy = reduce(g, ry, gy, &sy, y)?;
    Ok((gx, gy))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_reduction_matches_tensorflow_cases() {
        let s = |d: Vec<Option<usize>>| PartialShape::new(d);
        let (x, b, g) = (
            s(vec![None, Some(32)]),
            s(vec![Some(32)]),
            s(vec![None, Some(32)]),
        );
        // x [?,32] + b [32]: x's dims are the result's, b sums over axis 0.
        assert!(matches!(static_reduction(&x, Some(&b), &g), Reduce::Static(a) if a.is_empty()));
        assert!(matches!(static_reduction(&b, Some(&x), &g), Reduce::Static(a) if a == [0]));
        // [4,1] against [4,3]: sum axis 1.
        let (p, q) = (s(vec![Some(4), Some(1)]), s(vec![Some(3)]));
        let r = static_reduction(&p, Some(&q), &s(vec![Some(4), Some(3)]));
        assert!(matches!(r, Reduce::Static(a) if a == [1]));
        // [?,3] + [?,3]: either batch dim may be 1 at run time.
        assert!(matches!(
            static_reduction(&x, Some(&x), &g),
            Reduce::Dynamic
        ));
        assert!(matches!(
            static_reduction(&s(vec![None]), None, &s(vec![Some(5)])),
            Reduce::Dynamic
        ));
        let full = s(vec![Some(2), Some(3)]);
        assert!(matches!(static_reduction(&full, None, &full), Reduce::None));
    }
}
