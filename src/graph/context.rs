//! TensorFlow's control-flow contexts in the builder (`ControlFlowContext`, `CondContext`,
//! `WhileContext` in `control_flow_ops.py`): what each cond branch and loop knows, and how an op
//! added in one gets its outside inputs (`AddValue`: a `Switch` per branch, an `Enter` per
//! loop, a stack pop in a gradient loop) and its control inputs (`AddOp`: the pivot for ops
//! with no inputs or only loop invariants; in a loop, outside control inputs replaced by
//! Identities built inside it). [`Graph::add_node`] calls [`Graph::cf_add_op`] while a context
//! is current; `control_flow.rs` builds the contexts.

use std::collections::{HashMap, HashSet};

use crate::error::{Result, Status};
use crate::graph::attr::{self, value};
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::grad_state::GradLoopState;
use crate::graph::ops::is_loop_back_edge;
use crate::graph::registry;
use crate::tensor::{DType, PartialShape};

/// The index of a context in [`ControlFlow::contexts`].
pub(crate) type CtxId = usize;

/// A branch of a cond: ops in it run only when `pred` is `branch` (1 true, 0 false).
#[derive(Clone, Debug)]
pub(crate) struct CondCtx {
    /// `cond/pred_id`.
    pub pred: Output,
    /// `cond/switch_t` or `cond/switch_f`.
    pub pivot: Output,
    /// 1 for the true branch, 0 for the false one.
    pub branch: usize,
}

/// A while loop (a forward loop or the gradient loop of one).
#[derive(Clone, Debug)]
pub(crate) struct WhileCtx {
    /// The frame's name (`while/while_context`).
    pub frame: String,
    pub parallel_iterations: i64,
    /// Whether gradients flow through the loop.
    pub back_prop: bool,
    /// The first loop variable's Merge, pivot of the ops of the condition.
    pub pivot_for_pred: Option<Output>,
    /// The first loop variable's Identity, pivot of the ops of the body.
    pub pivot_for_body: Option<Output>,
    /// The `LoopCond`.
    pub pivot: Option<Output>,
    pub loop_enters: Vec<Output>,
    pub loop_exits: Vec<Output>,
    /// For a gradient loop: its state in [`ControlFlow::grad_states`].
    pub grad_state: Option<usize>,
}

/// What kind of context.
#[derive(Clone, Debug)]
pub(crate) enum Kind {
    Cond(CondCtx),
    While(WhileCtx),
}

/// A control-flow context: the values known in it, and what outside values became in it.
#[derive(Clone, Debug)]
pub(crate) struct Context {
    pub outer: Option<CtxId>,
    pub kind: Kind,
    /// Tensor names (`node:i`) available in the context.
    pub values: HashSet<String>,
    /// Outside tensor name → the tensor standing for it in the context (a Switch output, an
    /// Enter, a stack pop).
    pub external_values: HashMap<String, Output>,
}

/// The builder's control-flow state: contexts, the current one, the context of every node.
#[derive(Clone, Debug, Default)]
pub(crate) struct ControlFlow {
    pub contexts: Vec<Context>,
    pub current: Option<CtxId>,
    pub op_ctx: HashMap<String, CtxId>,
    /// The loops' Switch nodes (a loop variable's `Switch(Merge, LoopCond)`).
    pub loop_switches: HashSet<String>,
    pub grad_states: Vec<GradLoopState>,
}

impl Graph {
    pub(crate) fn ctx(&self, c: CtxId) -> &Context {
        &self.cf.contexts[c]
    }

    pub(crate) fn ctx_mut(&mut self, c: CtxId) -> &mut Context {
        &mut self.cf.contexts[c]
    }

    pub(crate) fn while_parts(&self, c: CtxId) -> Result<&WhileCtx> {
        match &self.ctx(c).kind {
            Kind::While(w) => Ok(w),
            Kind::Cond(_) => Err(Status::internal(format!("context {c} is not a while loop"))),
        }
    }

    pub(crate) fn while_mut(&mut self, c: CtxId) -> Result<&mut WhileCtx> {
        match &mut self.ctx_mut(c).kind {
            Kind::While(w) => Ok(w),
            Kind::Cond(_) => Err(Status::internal(format!("context {c} is not a while loop"))),
        }
    }

    /// The predicate and branch of cond context `c`.
    pub(crate) fn cond_parts(&self, c: CtxId) -> Result<(Output, usize)> {
        match &self.ctx(c).kind {
            Kind::Cond(cc) => Ok((cc.pred.clone(), cc.branch)),
            Kind::While(_) => Err(Status::internal(format!("context {c} is not a cond"))),
        }
    }

    pub(crate) fn new_cond_context(
        &mut self,
        outer: Option<CtxId>,
        pred: &Output,
        pivot: &Output,
        branch: usize,
    ) -> CtxId {
        let id = self.cf.contexts.len();
        let mut values = HashSet::new();
        values.insert(pred.name());
        values.insert(pivot.name());
        let mut external_values = HashMap::new();
        external_values.insert(pred.name(), pred.clone());
        self.cf.contexts.push(Context {
            outer,
            kind: Kind::Cond(CondCtx {
                pred: pred.clone(),
                pivot: pivot.clone(),
                branch,
            }),
            values,
            external_values,
        });
        self.cf.op_ctx.insert(pivot.node.clone(), id);
        id
    }

    pub(crate) fn new_while_context(
        &mut self,
        outer: Option<CtxId>,
        frame: &str,
        parallel_iterations: i64,
        grad_state: Option<usize>,
    ) -> CtxId {
        let id = self.cf.contexts.len();
        self.cf.contexts.push(Context {
            outer,
            kind: Kind::While(WhileCtx {
                frame: frame.to_string(),
                parallel_iterations,
                back_prop: true,
                pivot_for_pred: None,
                pivot_for_body: None,
                pivot: None,
                loop_enters: Vec::new(),
                loop_exits: Vec::new(),
                grad_state,
            }),
            values: HashSet::new(),
            external_values: HashMap::new(),
        });
        id
    }

    /// Makes `name` known in context `c` (`AddName`).
    pub(crate) fn add_name(&mut self, c: CtxId, name: &str) {
        self.ctx_mut(c).values.insert(name.to_string());
    }

    /// Makes a context's results known in its outer context (`ExitResult`).
    pub(crate) fn exit_result(&mut self, c: CtxId, results: &[Output]) {
        if let Some(o) = self.ctx(c).outer {
            for r in results {
                self.add_name(o, &r.name());
            }
        }
    }

    /// The context node `node` was built in.
    pub(crate) fn op_context(&self, node: &str) -> Option<CtxId> {
        self.cf.op_ctx.get(node).copied()
    }

    /// The innermost while loop containing context `c` (`GetWhileContext`).
    pub(crate) fn while_context_of(&self, mut c: Option<CtxId>) -> Option<CtxId> {
        while let Some(x) = c {
            if matches!(self.ctx(x).kind, Kind::While(_)) {
                return Some(x);
            }
            c = self.ctx(x).outer;
        }
        None
    }

    /// The innermost while loop node `node` is in.
    pub(crate) fn op_while_context(&self, node: &str) -> Option<CtxId> {
        self.while_context_of(self.op_context(node))
    }

    /// The context a node's outputs are in: its own, or for a loop's Exit the loop's outer one.
    pub(crate) fn output_context(&self, node: &str) -> Option<CtxId> {
        let c = self.op_context(node);
        if self.is_loop_exit(node) {
            c.and_then(|c| self.ctx(c).outer)
        } else {
            c
        }
    }

    /// Whether context `inner` is `outer` or nested in it.
    fn is_containing(&self, mut inner: Option<CtxId>, outer: CtxId) -> bool {
        while let Some(x) = inner {
            if x == outer {
                return true;
            }
            inner = self.ctx(x).outer;
        }
        false
    }

    /// The op type of `node` (empty when there is no such node).
    pub(crate) fn op_type(&self, node: &str) -> &str {
        self.node(node).map(|n| n.op.as_str()).unwrap_or("")
    }

    pub(crate) fn is_loop_exit(&self, node: &str) -> bool {
        matches!(self.op_type(node), "Exit" | "RefExit")
    }

    pub(crate) fn is_switch(&self, node: &str) -> bool {
        matches!(self.op_type(node), "Switch" | "RefSwitch")
    }

    /// Whether `node` is the Switch of a loop variable (visited twice by backprop).
    pub(crate) fn is_loop_switch(&self, node: &str) -> bool {
        self.cf.loop_switches.contains(node)
    }

    /// Whether `node` is an `Enter` of a loop invariant.
    pub(crate) fn is_loop_constant_enter(&self, node: &str) -> bool {
        self.node(node).is_some_and(|n| {
            matches!(n.op.as_str(), "Enter" | "RefEnter")
                && attr::bool_or(n, "is_constant", false).unwrap_or(false)
        })
    }

    /// The loop-invariant Enter behind `value`, through Identities and Switches
    /// (`GetLoopConstantEnter`).
    pub(crate) fn loop_constant_enter(&self, value: &Output) -> Result<Option<String>> {
        let mut node = value.node.clone();
        while matches!(
            self.op_type(&node),
            "Switch" | "RefSwitch" | "Identity" | "RefIdentity"
        ) {
            node = self.data_input(&node, 0)?.node;
        }
        Ok(self.is_loop_constant_enter(&node).then_some(node))
    }

    /// Data input `i` of `node`.
    pub(crate) fn data_input(&self, node: &str, i: usize) -> Result<Output> {
        let n = self
            .node(node)
            .ok_or_else(|| Status::internal(format!("no node `{node}`")))?;
        let input = n
            .input
            .iter()
            .filter(|s| !s.starts_with('^'))
            .nth(i)
            .ok_or_else(|| Status::internal(format!("node `{node}` has no input {i}")))?;
        let (src, idx) = crate::graph::builder::parse_input(input);
        self.output(src, idx)
    }

    /// Whether `o` is a reference (`Ref(T)`) output, such as a `VariableV2`'s.
    pub(crate) fn is_ref_output(&self, o: &Output) -> bool {
        self.node(&o.node)
            .and_then(|n| {
                let def = registry::lookup(n).ok()?;
                def.ref_outputs(n).ok()?.get(o.index).copied()
            })
            .unwrap_or(false)
    }

    /// The pivot of context `c` (`GetControlPivot`): a branch's `switch_t`/`switch_f`, a
    /// loop body's first Identity (or the first Merge while the condition is built).
    pub(crate) fn control_pivot(&self, c: CtxId) -> Option<Output> {
        match &self.ctx(c).kind {
            Kind::Cond(cc) => Some(cc.pivot.clone()),
            Kind::While(w) => w
                .pivot_for_body
                .clone()
                .or_else(|| w.pivot_for_pred.clone()),
        }
    }

    /// Runs `f` with `ctx` as the current context (TensorFlow's `ctxt.Enter()` ... `Exit()`).
    pub(crate) fn cf_enter<R>(&mut self, ctx: Option<CtxId>, f: impl FnOnce(&mut Graph) -> R) -> R {
        let saved = std::mem::replace(&mut self.cf.current, ctx);
        let r = f(self);
        self.cf.current = saved;
        r
    }

    /// Runs `f` outside every context and control-dependency scope (TensorFlow's
    /// `control_dependencies(None)`), then places the nodes it added in `ctx`.
    pub(crate) fn cf_raw<R>(
        &mut self,
        ctx: Option<CtxId>,
        f: impl FnOnce(&mut Graph) -> Result<R>,
    ) -> Result<R> {
        let saved_ctx = self.cf.current.take();
        let saved_control = std::mem::take(&mut self.control);
        let first = self.nodes.len();
        let r = f(self);
        self.cf.current = saved_ctx;
        self.control = saved_control;
        if let Some(c) = ctx {
            let added: Vec<String> = self.nodes[first..].iter().map(|n| n.name.clone()).collect();
            for n in added {
                self.cf.op_ctx.entry(n).or_insert(c);
            }
        }
        r
    }

    /// `Switch(data, pred)` (`RefSwitch` for a reference) named `name` (made unique); returns
    /// `[output_false, output_true]`.
    pub(crate) fn switch_ref_or_tensor(
        &mut self,
        data: &Output,
        pred: &Output,
        name: &str,
    ) -> Result<Vec<Output>> {
        let op = if self.is_ref_output(data) {
            "RefSwitch"
        } else {
            "Switch"
        };
        self.add_node(NodeSpec::new(op).name(name).input(data).input(pred))
    }

    /// `Enter(data)` into `frame` (`RefEnter` for a reference), named `name` (made unique).
    pub(crate) fn enter_op(
        &mut self,
        data: &Output,
        frame: &str,
        is_constant: bool,
        parallel_iterations: i64,
        name: &str,
    ) -> Result<Output> {
        let op = if self.is_ref_output(data) {
            "RefEnter"
        } else {
            "Enter"
        };
        self.add1(
            NodeSpec::new(op)
                .name(name)
                .input(data)
                .attr("frame_name", value::string(frame))
                .attr("is_constant", value::bool(is_constant))
                .attr("parallel_iterations", value::int(parallel_iterations)),
        )
    }

    // ---- AddValue / AddOp ----

    /// Makes `val` available in context `c` and its outer contexts (`AddValue`): the tensor
    /// that stands for it in `c`.
    pub(crate) fn cf_add_value(&mut self, c: CtxId, val: &Output) -> Result<Output> {
        match &self.ctx(c).kind {
            Kind::Cond(_) => self.cond_add_value(c, val),
            Kind::While(_) => self.while_add_value(c, val),
        }
    }

    fn cond_add_value(&mut self, c: CtxId, val: &Output) -> Result<Output> {
        let key = val.name();
        if self.ctx(c).values.contains(&key) {
            return Ok(self
                .ctx(c)
                .external_values
                .get(&key)
                .cloned()
                .unwrap_or_else(|| val.clone()));
        }
        self.add_name(c, &key);
        let mut result = val.clone();
        if let Some(outer) = self.ctx(c).outer {
            result = self.cf_add_value(outer, val)?;
            let ctx = self.ctx_mut(c);
            ctx.values.insert(result.name());
            ctx.external_values.insert(result.name(), result.clone());
        }
        let (pred, branch) = self.cond_parts(c)?;
        let sw = self.cf_raw(Some(c), |g| {
            g.switch_ref_or_tensor(&result, &pred, "Switch")
        })?;
        let result = sw[branch].clone();
        let mut k = Some(c);
        while let Some(x) = k {
            self.add_name(x, &result.name());
            k = self.ctx(x).outer;
        }
        self.ctx_mut(c).external_values.insert(key, result.clone());
        Ok(result)
    }

    fn while_add_value(&mut self, c: CtxId, val: &Output) -> Result<Output> {
        let key = val.name();
        let new_value = !self.ctx(c).values.contains(&key) && self.op_context(&val.node) != Some(c);
        if !new_value {
            return Ok(self
                .ctx(c)
                .external_values
                .get(&key)
                .cloned()
                .unwrap_or_else(|| val.clone()));
        }
        self.add_name(c, &key);
        // In a gradient loop, a value of its forward loop is read back from its history.
        if let Some(gs) = self
            .while_context_of(self.cf.current)
            .and_then(|gw| self.while_parts(gw).ok()?.grad_state)
        {
            let mut forward = self.op_while_context(&val.node);
            if self.is_loop_exit(&val.node) {
                forward = self.while_context_of(forward.and_then(|f| self.ctx(f).outer));
            }
            if forward == Some(self.cf.grad_states[gs].forward_ctx) {
                let real = self.get_real_value(gs, val)?;
                self.ctx_mut(c).external_values.insert(key, real.clone());
                return Ok(real);
            }
        }
        let mut result = val.clone();
        if let Some(outer) = self.ctx(c).outer {
            result = self.cf_add_value(outer, val)?;
        }
        let (frame, parallel) = {
            let w = self.while_parts(c)?;
            (w.frame.clone(), w.parallel_iterations)
        };
        let enter = self.cf_raw(Some(c), |g| {
            g.enter_op(&result, &frame, true, parallel, "Enter")
        })?;
        let ctx = self.ctx_mut(c);
        ctx.values.insert(enter.name());
        ctx.external_values.insert(key, enter.clone());
        Ok(enter)
    }

    /// Hands an op about to be added in context `c` to that context (`AddOp`): rewrites its
    /// inputs and control inputs, and returns the context the op belongs to.
    pub(crate) fn cf_add_op(
        &mut self,
        c: CtxId,
        op: &str,
        inputs: &mut [Output],
        control: &mut Vec<String>,
    ) -> Result<CtxId> {
        // In a gradient loop, the shape of a forward value is taken in the forward loop
        // (and saved like any forward value) rather than saving the value itself.
        if matches!(op, "Shape" | "Size" | "Rank") && !inputs.is_empty() {
            if let Some(gs) = self
                .while_context_of(self.cf.current)
                .and_then(|gw| self.while_parts(gw).ok()?.grad_state)
            {
                let forward = self.cf.grad_states[gs].forward_ctx;
                if self.op_while_context(&inputs[0].node) == Some(forward) {
                    if let Some(ic) = self.op_context(&inputs[0].node) {
                        self.cf_add_op_internal(ic, op, inputs, control)?;
                        return Ok(ic);
                    }
                }
            }
        }
        self.cf_add_op_internal(c, op, inputs, control)?;
        Ok(c)
    }

    fn cf_add_op_internal(
        &mut self,
        c: CtxId,
        op: &str,
        inputs: &mut [Output],
        control: &mut Vec<String>,
    ) -> Result<()> {
        match self.ctx(c).kind.clone() {
            Kind::Cond(cc) => {
                if inputs.is_empty() {
                    self.remove_external_control_edges(c, control);
                    let inside = control
                        .iter()
                        .any(|x| self.is_containing(self.op_context(x), c));
                    if !inside {
                        control.push(cc.pivot.node.clone());
                    }
                } else {
                    for x in inputs.iter_mut() {
                        let back_edge = is_loop_back_edge(self.op_type(&x.node), op);
                        if !back_edge {
                            *x = self.cf_add_value(c, x)?;
                        }
                    }
                    self.remove_external_control_edges(c, control);
                }
            }
            Kind::While(_) => {
                let external = if inputs.is_empty() {
                    let (internal, external) = self.remove_external_control_edges(c, control);
                    if internal.is_empty() {
                        if let Some(p) = self.control_pivot(c) {
                            control.push(p.node);
                        }
                    }
                    external
                } else {
                    for x in inputs.iter_mut() {
                        *x = self.cf_add_value(c, x)?;
                    }
                    let (_, external) = self.remove_external_control_edges(c, control);
                    // An op that depends only on loop invariants would otherwise run once,
                    // outside the iterations.
                    let free = control.is_empty()
                        && inputs.iter().all(|x| self.is_loop_constant_enter(&x.node));
                    if free {
                        if let Some(p) = self.control_pivot(c) {
                            control.push(p.node);
                        }
                    }
                    external
                };
                // A control input from outside the loop becomes an Identity of its output,
                // entered into the loop; ops without outputs are dropped, as in TensorFlow.
                for x in external {
                    let Ok(first) = self.output(&x, 0) else {
                        continue;
                    };
                    let id = self.cf_raw(None, |g| {
                        g.cf_enter(Some(c), |g| g.add1(NodeSpec::new("Identity").input(&first)))
                    })?;
                    control.push(id.node);
                }
            }
        }
        Ok(())
    }

    /// Keeps the control inputs built in the same loop as `c` and returns `(kept, removed)`;
    /// outside any loop all are kept.
    fn remove_external_control_edges(
        &mut self,
        c: CtxId,
        control: &mut Vec<String>,
    ) -> (Vec<String>, Vec<String>) {
        let Some(w) = self.while_context_of(Some(c)) else {
            return (control.clone(), Vec::new());
        };
        let (internal, external): (Vec<String>, Vec<String>) =
            control.iter().cloned().partition(|x| {
                let xc = self.output_context(x);
                xc.is_some() && self.while_context_of(xc) == Some(w)
            });
        *control = internal.clone();
        (internal, external)
    }

    /// Records a node just added in context `c`: its outputs become known there (and, for a
    /// cond branch, in every outer context).
    pub(crate) fn cf_op_added(&mut self, c: CtxId, node: &str, outputs: &[Output]) {
        self.cf.op_ctx.insert(node.to_string(), c);
        let names: Vec<String> = outputs.iter().map(Output::name).collect();
        let all_outer = matches!(self.ctx(c).kind, Kind::Cond(_));
        let mut k = Some(c);
        while let Some(x) = k {
            self.ctx_mut(x).values.extend(names.iter().cloned());
            k = if all_outer { self.ctx(x).outer } else { None };
        }
    }

    /// A zero tensor of `shape` and `dtype` as TensorFlow's `constant(0, shape=...)`: a
    /// `Const` named `name`.
    pub(crate) fn zeros_const(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &PartialShape,
    ) -> Result<Output> {
        let shape = shape
            .to_shape()
            .ok_or_else(|| Status::internal(format!("zeros of a partly unknown shape {shape}")))?;
        let t = crate::tensor::Tensor::zeros(dtype, shape.dims().to_vec())?;
        self.constant_proto(name, t.to_proto())
    }

    /// `zeros(shape, dtype)` for a shape tensor: `Fill(shape, zeros/Const)` named `zeros`.
    pub(crate) fn zeros_filled(&mut self, shape: &Output, dtype: DType) -> Result<Output> {
        self.with_name_scope("zeros", |g| {
            let zero = g.scalar("Const", dtype, 0.0)?;
            let name = format!("{}/", g.name_scope());
            g.add1(NodeSpec::new("Fill").name(&name).input(shape).input(&zero))
        })
    }
}
