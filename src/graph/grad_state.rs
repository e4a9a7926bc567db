//! The gradient of a while loop, as TensorFlow 1 builds it (`control_flow_state.py`).
//!
//! For each forward loop that lies between the ys and the xs, [`Graph::gradients`] builds one
//! gradient loop, which runs as many iterations as the forward loop did, in reverse:
//!
//! ```text
//! forward loop  gradients/f_count (0) → Enter → Merge → Switch → Add(1) → NextIteration
//!               counts the iterations; Exit gradients/f_count_2 is the total
//! grad loop     gradients/b_count: Enter(total) → Merge → GreaterEqual(1) → LoopCond
//!               → Switch → Sub(1) → NextIteration, in frame gradients/<forward frame>
//! ```
//!
//! A forward value that the gradient of a body op needs (a MatMul's inputs, a Tanh's output)
//! is pushed on a stack in every forward iteration (`f_acc` = `StackV2` outside the loop,
//! `StackPushV2` inside) and popped in the matching gradient iteration (`StackPopV2`). The
//! pushes of one iteration run before the counter's next iteration and the pops of one
//! gradient iteration before the next (`b_sync`), so both run in iteration order. Loop
//! invariants are not saved: they enter the gradient loop as they entered the forward one, and
//! their gradients are summed over the iterations by an accumulator loop (`b_acc`).
//!
//! Gradients of loops nested in loops (second-level history) are not built: they fail with
//! UNIMPLEMENTED naming the loops.

use std::collections::HashMap;

use crate::error::{Result, Status};
use crate::graph::attr::value;
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::context::{CtxId, Kind};
use crate::tensor::DType;

/// The state of one forward loop's gradient (`_GradLoopState`).
#[derive(Clone, Debug)]
pub(crate) struct GradLoopState {
    pub forward_ctx: CtxId,
    pub grad_ctx: CtxId,
    /// The forward counter's `NextIteration`; every push runs before it.
    pub forward_index: Output,
    /// The gradient counter's `NextIteration`.
    pub grad_index: Output,
    forward_sync: Option<String>,
    grad_sync: Option<String>,
    /// Forward tensor name → its value in the gradient loop.
    pub history_map: HashMap<String, Output>,
    /// A forward loop Switch → the Merge its gradient built on the first visit.
    pub switch_map: HashMap<String, Output>,
    pub unused_exits: Vec<Output>,
    pub deferred_exits: Vec<Output>,
    pub forward_loop_exits: Vec<Output>,
    pub pending_exits_count: usize,
}

/// The gradient loops of one `gradients` call, by forward loop (`_ControlFlowState`).
#[derive(Default)]
pub(crate) struct LoopState {
    pub map: HashMap<CtxId, usize>,
}

impl LoopState {
    /// The gradient state for `node`'s loop: the loop around an Exit's loop when `before`
    /// (its output gradients are summed outside its loop), else the node's own loop.
    pub fn grad_state(&self, g: &Graph, node: &str, before: bool) -> Option<usize> {
        let forward = if before && g.is_loop_exit(node) {
            let c = g.op_context(node);
            g.while_context_of(c.and_then(|c| g.ctx(c).outer))
        } else {
            g.op_while_context(node)
        };
        forward.and_then(|f| self.map.get(&f).copied())
    }

    /// The gradient loop's context for `node`, if it is in a differentiated loop.
    pub fn grad_context(&self, g: &Graph, node: &str, before: bool) -> Option<CtxId> {
        self.grad_state(g, node, before)
            .map(|s| g.cf.grad_states[s].grad_ctx)
    }
}

impl Graph {
    /// Creates the gradient state of the forward loop `node` (an Exit) is in, unless there is
    /// one: the forward counter, the gradient loop and its counter. Returns the loop's other
    /// Exits, which backprop must visit too.
    pub(crate) fn add_while_context(
        &mut self,
        loops: &mut LoopState,
        exit: &str,
    ) -> Result<Vec<Output>> {
        let forward = self
            .op_while_context(exit)
            .ok_or_else(|| loop_unknown(exit))?;
        if loops.map.contains_key(&forward) {
            return Ok(Vec::new());
        }
        if self.while_parts(forward)?.grad_state.is_some() {
            return Err(Status::unimplemented(format!(
                "second-order gradients through while loops are not supported (`{exit}` is in \
                 a gradient loop)"
            )));
        }
        let outer = self.ctx(forward).outer;
        if let Some(ow) = self.while_context_of(outer) {
            return Err(Status::unimplemented(format!(
                "the gradient of while loop `{}` nested in while loop `{}` is not supported; \
                 take gradients of the inner loop on its own or unroll one of them",
                self.while_parts(forward)?.frame,
                self.while_parts(ow)?.frame
            )));
        }
        let (frame, parallel) = {
            let w = self.while_parts(forward)?;
            (w.frame.clone(), w.parallel_iterations)
        };
        let exits = self.while_parts(forward)?.loop_exits.clone();
        let (count, forward_index) =
            self.cf_enter(outer, |g| g.add_forward_loop_counter(forward))?;
        let state = self.cf.grad_states.len();
        let grad_ctx = self.cf_enter(outer, |g| -> Result<CtxId> {
            let name = g.unique_name(&frame);
            let gc = g.new_while_context(outer, &name, parallel, Some(state));
            Ok(gc)
        })?;
        // The state must exist before the counter (its ops are built in the gradient loop).
        self.cf.grad_states.push(GradLoopState {
            forward_ctx: forward,
            grad_ctx,
            forward_index,
            grad_index: count.clone(),
            forward_sync: None,
            grad_sync: None,
            history_map: HashMap::new(),
            switch_map: HashMap::new(),
            unused_exits: Vec::new(),
            deferred_exits: Vec::new(),
            forward_loop_exits: exits.clone(),
            pending_exits_count: exits.len(),
        });
        let grad_index = self.cf_enter(outer, |g| g.add_backprop_loop_counter(grad_ctx, &count))?;
        self.cf.grad_states[state].grad_index = grad_index;
        loops.map.insert(forward, state);
        Ok(exits)
    }

    /// `n = 0; while (pivot) n++` in forward loop `w` (`AddForwardLoopCounter`); returns the
    /// total (an Exit) and the counter's NextIteration.
    fn add_forward_loop_counter(&mut self, w: CtxId) -> Result<(Output, Output)> {
        let n = self.constant_proto("f_count", crate::tensor::Tensor::scalar(0i32).to_proto())?;
        let (frame, parallel, pivot) = {
            let wc = self.while_parts(w)?;
            let pivot = wc.pivot.clone().ok_or_else(|| loop_unknown(&wc.frame))?;
            (wc.frame.clone(), wc.parallel_iterations, pivot)
        };
        self.cf_enter(Some(w), |g| {
            g.add_name(w, &n.name());
            let enter_n = g.enter_op(&n, &frame, false, parallel, "f_count")?;
            g.while_mut(w)?.loop_enters.push(enter_n.clone());
            let merge_n =
                g.add_node(NodeSpec::new("Merge").input_list(&[enter_n.clone(), enter_n.clone()]))?;
            let switch_n = g.switch_ref_or_tensor(&merge_n[0], &pivot, "Switch")?;
            g.cf.loop_switches.insert(switch_n[0].node.clone());
            let name = g.reserve_name("Add");
            let one = g.constant_proto(
                &format!("{name}/y/"),
                crate::tensor::Tensor::scalar(1i32).to_proto(),
            )?;
            let index = g.add1(
                NodeSpec::new("AddV2")
                    .name(&format!("{name}/"))
                    .input(&switch_n[1])
                    .input(&one),
            )?;
            let next_n = g.add1(NodeSpec::new("NextIteration").input(&index))?;
            g.update_input(&merge_n[0].node, 1, &next_n)?;
            let total = g.add1(NodeSpec::new("Exit").name("f_count").input(&switch_n[0]))?;
            g.while_mut(w)?.loop_exits.push(total.clone());
            g.exit_result(w, std::slice::from_ref(&total));
            Ok((total, next_n))
        })
    }

    /// `n = count; while (n >= 1) n--` as gradient loop `gc`'s counter, whose LoopCond is the
    /// loop's pivot (`AddBackpropLoopCounter`); returns the counter's NextIteration.
    fn add_backprop_loop_counter(&mut self, gc: CtxId, count: &Output) -> Result<Output> {
        let one = self.constant_proto("b_count", crate::tensor::Tensor::scalar(1i32).to_proto())?;
        let (frame, parallel) = {
            let w = self.while_parts(gc)?;
            (w.frame.clone(), w.parallel_iterations)
        };
        self.cf_enter(Some(gc), |g| {
            g.add_name(gc, &count.name());
            let enter = g.enter_op(count, &frame, false, parallel, "b_count")?;
            g.while_mut(gc)?.loop_enters.push(enter.clone());
            let merge =
                g.add_node(NodeSpec::new("Merge").input_list(&[enter.clone(), enter.clone()]))?;
            g.while_mut(gc)?.pivot_for_pred = Some(merge[0].clone());
            let pred = g.binary("GreaterEqual", &merge[0], &one)?;
            let pivot = g.add1(NodeSpec::new("LoopCond").name("b_count").input(&pred))?;
            g.while_mut(gc)?.pivot = Some(pivot.clone());
            let sw = g.switch_ref_or_tensor(&merge[0], &pivot, "Switch")?;
            let index = g.binary("Sub", &sw[1], &one)?;
            g.while_mut(gc)?.pivot_for_body = Some(index.clone());
            let next = g.add1(NodeSpec::new("NextIteration").input(&index))?;
            g.update_input(&merge[0].node, 1, &next)?;
            let zero = g.add1(NodeSpec::new("Exit").name("b_count").input(&sw[0]))?;
            g.while_mut(gc)?.loop_exits.push(zero.clone());
            g.exit_result(gc, std::slice::from_ref(&zero));
            Ok(next)
        })
    }

    /// `f_sync`, a ControlTrigger in the forward loop that the counter's next iteration waits
    /// for (pushes inside a cond in the loop run before it).
    fn forward_sync(&mut self, s: usize) -> Result<String> {
        if let Some(n) = &self.cf.grad_states[s].forward_sync {
            return Ok(n.clone());
        }
        let forward = self.cf.grad_states[s].forward_ctx;
        let sync = self.cf_raw(Some(forward), |g| {
            g.add_op(NodeSpec::new("ControlTrigger").name("f_sync"))
        })?;
        let index = self.cf.grad_states[s].forward_index.node.clone();
        self.add_control_input(&index, &sync)?;
        self.cf.grad_states[s].forward_sync = Some(sync.clone());
        Ok(sync)
    }

    /// `b_sync`, a ControlTrigger in the gradient loop: the pops of an iteration run before
    /// the gradient counter's next iteration.
    fn grad_sync(&mut self, s: usize) -> Result<String> {
        if let Some(n) = &self.cf.grad_states[s].grad_sync {
            return Ok(n.clone());
        }
        let gc = self.cf.grad_states[s].grad_ctx;
        let sync = self.cf_raw(Some(gc), |g| {
            g.add_op(NodeSpec::new("ControlTrigger").name("b_sync"))
        })?;
        let index = self.cf.grad_states[s].grad_index.node.clone();
        self.add_control_input(&index, &sync)?;
        self.cf.grad_states[s].grad_sync = Some(sync.clone());
        Ok(sync)
    }

    /// Pushes `value` on a new stack in every forward iteration (`AddForwardAccumulator`);
    /// returns the stack. `dead_branch`: `value` is a zeros shape for the untaken side of a
    /// cond in the loop.
    pub(crate) fn add_forward_accumulator(
        &mut self,
        s: usize,
        value: &Output,
        dead_branch: bool,
    ) -> Result<Output> {
        let (forward, grad_ctx) = {
            let st = &self.cf.grad_states[s];
            (st.forward_ctx, st.grad_ctx)
        };
        let curr = self.ctx(grad_ctx).outer;
        let acc = self.cf_raw(None, |g| {
            g.cf_enter(curr, |g| {
                g.with_colocation(&value.node.clone(), |g| {
                    let max_size =
                        g.constant_proto("Const", crate::tensor::Tensor::scalar(-1i32).to_proto())?;
                    g.add1(
                        NodeSpec::new("StackV2")
                            .name("f_acc")
                            .input(&max_size)
                            .attr("elem_type", value::dtype(value.dtype))
                            .attr("stack_name", value::string("")),
                    )
                })
            })
        })?;
        let push = self.cf_raw(None, |g| -> Result<Output> {
            let enter_acc = g.cf_add_value(forward, &acc)?;
            let value_ctx = g.output_context(&value.node);
            let push_in = |g: &mut Graph, ctx: Option<CtxId>| {
                g.cf_enter(ctx, |g| {
                    g.add1(
                        NodeSpec::new("StackPushV2")
                            .input(&enter_acc)
                            .input(value)
                            .attr("swap_memory", value::bool(false)),
                    )
                })
            };
            if value_ctx == Some(forward) {
                let push = push_in(g, Some(forward))?;
                let index = g.cf.grad_states[s].forward_index.node.clone();
                g.add_control_input(&index, &push.node)?;
                Ok(push)
            } else {
                let Some(vc) = value_ctx.filter(|&c| matches!(g.ctx(c).kind, Kind::Cond(_))) else {
                    return Err(Status::unimplemented(format!(
                        "gradient of while loop `{}`: `{}` is neither in the loop nor in a cond \
                         in it",
                        g.while_parts(forward)?.frame,
                        value.name()
                    )));
                };
                let push = if dead_branch {
                    let outer = g.ctx(vc).outer;
                    let push = push_in(g, outer)?;
                    g.cf.op_ctx.insert(push.node.clone(), vc);
                    push
                } else {
                    push_in(g, Some(vc))?
                };
                let sync = g.forward_sync(s)?;
                g.add_control_input(&sync, &push.node)?;
                Ok(push)
            }
        })?;
        // The push waits for the counter of its iteration.
        let index = self.cf.grad_states[s].forward_index.node.clone();
        let add = self.data_input(&index, 0)?.node;
        self.add_control_input(&push.node, &add)?;
        Ok(acc)
    }

    /// Pops the history `history` of forward value `value` in the gradient loop
    /// (`AddBackpropAccumulatedValue`), behind a Switch on the saved predicate when `value` is
    /// in a cond in the loop.
    pub(crate) fn add_backprop_accumulated_value(
        &mut self,
        s: usize,
        history: &Output,
        value: &Output,
        dead_branch: bool,
    ) -> Result<Output> {
        let history_ctx = self.op_context(&history.node);
        let mut cond_ctx = None;
        let mut vc = self.op_context(&value.node);
        while let Some(c) = vc {
            if Some(c) == history_ctx {
                break;
            }
            if matches!(self.ctx(c).kind, Kind::Cond(_)) {
                cond_ctx = Some(c);
                break;
            }
            vc = self.ctx(c).outer;
        }
        let grad_ctx = self.cf.grad_states[s].grad_ctx;
        let pop = self.cf_raw(None, |g| {
            g.cf_enter(Some(grad_ctx), |g| -> Result<Output> {
                let mut h = history.clone();
                if let Some(cc) = cond_ctx {
                    let (pred, branch) = g.cond_parts(cc)?;
                    let pred = g.cf.grad_states[s]
                        .history_map
                        .get(&pred.name())
                        .cloned()
                        .unwrap_or(pred);
                    let branch = if dead_branch { 1 - branch } else { branch };
                    h = g.switch_ref_or_tensor(&h, &pred, "Switch")?[branch].clone();
                }
                let pop = g.add1(
                    NodeSpec::new("StackPopV2")
                        .input(&h)
                        .attr("elem_type", value::dtype(value.dtype)),
                )?;
                Ok(g.set_output_shape(&pop, value.shape.clone()))
            })
        })?;
        if self.while_parts(grad_ctx)?.parallel_iterations > 1 {
            let sync = self.grad_sync(s)?;
            self.add_control_input(&sync, &pop.node)?;
        }
        Ok(pop)
    }

    /// The value of forward tensor `value` in the gradient loop (`GetRealValue`): a loop
    /// invariant enters the gradient loop directly, a constant is copied, anything else is
    /// saved in the forward loop and popped.
    pub(crate) fn get_real_value(&mut self, s: usize, value: &Output) -> Result<Output> {
        if let Some(v) = self.cf.grad_states[s].history_map.get(&value.name()) {
            return Ok(v.clone());
        }
        let grad_ctx = self.cf.grad_states[s].grad_ctx;
        let real = if let Some(enter) = self.loop_constant_enter(value)? {
            let outside = self.data_input(&enter, 0)?;
            self.cf_add_value(grad_ctx, &outside)?
        } else if self.op_type(&value.node) == "Const" {
            let node = self
                .node(&value.node)
                .cloned()
                .ok_or_else(|| Status::internal(format!("no node `{}`", value.node)))?;
            let mut spec = NodeSpec::new("Const");
            for (k, v) in &node.attr {
                if k != "_class" {
                    spec = spec.attr(k, v.clone());
                }
            }
            self.add1(spec)?
        } else {
            let history = self.add_forward_accumulator(s, value, false)?;
            self.add_backprop_accumulated_value(s, &history, value, false)?
        };
        self.cf.grad_states[s]
            .history_map
            .insert(value.name(), real.clone());
        Ok(real)
    }

    /// Sums `grad`, the gradient of loop invariant `enter` in one gradient iteration, over all
    /// iterations in an accumulator loop (`AddBackpropAccumulator`); returns the sum (an Exit
    /// of the gradient loop).
    pub(crate) fn add_backprop_accumulator(
        &mut self,
        gc: CtxId,
        enter: &str,
        grad: &Output,
    ) -> Result<Output> {
        let outer = self.ctx(gc).outer;
        let acc = self.cf_enter(outer, |g| -> Result<Output> {
            if grad.shape.is_fully_defined() {
                g.zeros_const("b_acc", grad.dtype, &grad.shape)
            } else {
                let mut value = g.data_input(enter, 0)?;
                if value.dtype == DType::Resource {
                    // The shape of the variable behind a handle.
                    value = g.read_variable(&value)?;
                }
                let shape = g.add1(NodeSpec::new("Shape").input(&value))?;
                g.zeros_filled(&shape, grad.dtype)
            }
        })?;
        let (frame, parallel, pivot) = {
            let w = self.while_parts(gc)?;
            let pivot = w.pivot.clone().ok_or_else(|| loop_unknown(&w.frame))?;
            (w.frame.clone(), w.parallel_iterations, pivot)
        };
        self.cf_enter(Some(gc), |g| {
            g.add_name(gc, &acc.name());
            let enter_acc = g.enter_op(&acc, &frame, false, parallel, "b_acc")?;
            g.while_mut(gc)?.loop_enters.push(enter_acc.clone());
            let merge = g.add_node(
                NodeSpec::new("Merge")
                    .name("b_acc")
                    .input_list(&[enter_acc.clone(), enter_acc.clone()]),
            )?;
            let sw = g.switch_ref_or_tensor(&merge[0], &pivot, "Switch")?;
            let add = g.add1(NodeSpec::new("AddV2").name("Add").input(&sw[1]).input(grad))?;
            let next = g.add1(NodeSpec::new("NextIteration").input(&add))?;
            g.update_input(&merge[0].node, 1, &next)?;
            let result = g.add1(NodeSpec::new("Exit").name("b_acc").input(&sw[0]))?;
            g.while_mut(gc)?.loop_exits.push(result.clone());
            g.exit_result(gc, std::slice::from_ref(&result));
            Ok(result)
        })
    }

    /// The zero gradient of an Exit nobody differentiated, while another Exit of its loop has
    /// a gradient (`ZerosLikeForExit`).
    pub(crate) fn zeros_like_for_exit(&mut self, val: &Output) -> Result<Output> {
        if val.shape.is_fully_defined() {
            self.zeros_const("zeros", val.dtype, &val.shape)
        } else {
            self.add1(NodeSpec::new("ZerosLike").name("zeros_like").input(val))
        }
    }

    /// The zero gradient of output `index` of `node` built in a gradient loop
    /// (`ZerosLikeV1WhileLoop`): None for a loop Switch, a constant when the shape is known
    /// (behind a Switch on the saved predicate for the untaken side of a cond), else zeros of
    /// the shape saved in the forward loop.
    pub(crate) fn zeros_like_in_loop(
        &mut self,
        loops: &LoopState,
        node: &str,
        index: usize,
    ) -> Result<Option<Output>> {
        if self.is_loop_switch(node) {
            return Ok(None);
        }
        let dead_branch = self.is_switch(node);
        let Some(s) = self
            .op_while_context(node)
            .and_then(|f| loops.map.get(&f).copied())
        else {
            return self.zeros_like_output(node, index).map(Some);
        };
        let op_ctx = self
            .op_context(node)
            .ok_or_else(|| Status::internal(format!("`{node}` has no context")))?;
        let val = self.output(node, index)?;
        if val.shape.is_fully_defined() {
            let zeros = self.zeros_const("Const", val.dtype, &val.shape)?;
            if !dead_branch {
                return Ok(Some(zeros));
            }
            let (pred, branch) = self.cond_parts(op_ctx)?;
            let pred = self.cf.grad_states[s]
                .history_map
                .get(&pred.name())
                .cloned()
                .ok_or_else(|| {
                    Status::internal(format!(
                        "no saved predicate `{}` for the zero gradient of `{node}`",
                        pred.name()
                    ))
                })?;
            let sw = self.switch_ref_or_tensor(&zeros, &pred, "Switch")?;
            return Ok(Some(sw[1 - branch].clone()));
        }
        let shape = if dead_branch {
            let (pred, branch) = self.cond_parts(op_ctx)?;
            let outer = self.ctx(op_ctx).outer;
            let data = self.data_input(node, 0)?;
            let (v, shape) = self.cf_enter(outer, |g| -> Result<(Output, Output)> {
                let v = g.switch_ref_or_tensor(&data, &pred, "Switch")?[1 - branch].clone();
                let shape = g.add1(NodeSpec::new("Shape").input(&v))?;
                Ok((v, shape))
            })?;
            self.cf.op_ctx.insert(v.node.clone(), op_ctx);
            self.cf.op_ctx.insert(shape.node.clone(), op_ctx);
            shape
        } else {
            self.cf_enter(Some(op_ctx), |g| g.add1(NodeSpec::new("Shape").input(&val)))?
        };
        let history = self.add_forward_accumulator(s, &shape, dead_branch)?;
        let shape = self.add_backprop_accumulated_value(s, &history, &shape, dead_branch)?;
        self.zeros_filled(&shape, val.dtype).map(Some)
    }

    /// The zero gradient of output `index` of `node` outside loops (`ZerosLike`): for a
    /// Switch in a cond, zeros built on the untaken side of the cond's predicate so that they
    /// exist exactly when the branch did not run; otherwise `ZerosLike` named `zeros_like`.
    pub(crate) fn zeros_like_output(&mut self, node: &str, index: usize) -> Result<Output> {
        let val = self.output(node, index)?;
        let cond = self
            .op_context(node)
            .filter(|&c| self.is_switch(node) && matches!(self.ctx(c).kind, Kind::Cond(_)));
        let Some(c) = cond else {
            return self.add1(NodeSpec::new("ZerosLike").name("zeros_like").input(&val));
        };
        let (pred, branch) = self.cond_parts(c)?;
        let data = self.data_input(node, 0)?;
        let switch_val =
            self.add_node(NodeSpec::new("Switch").input(&data).input(&pred))?[1 - branch].clone();
        let pivot = self.add1(NodeSpec::new("Identity").input(&switch_val))?;
        if val.dtype == DType::Resource {
            let shape = self
                .meta_of(&val)
                .and_then(|m| m.handle_shape.clone())
                .filter(|s| s.is_fully_defined())
                .ok_or_else(|| {
                    Status::unimplemented(format!(
                        "zero gradient for resource `{}`: its variable's shape is not known",
                        val.name()
                    ))
                })?;
            let dtype = self.resource_dtype(&val)?;
            let pivot = pivot.node.clone();
            return self.with_control_dependencies(&[pivot.as_str()], |g| {
                g.zeros_const("zeros", dtype, &shape)
            });
        }
        let shape = self.add1(NodeSpec::new("Shape").input(&switch_val))?;
        let pivot = pivot.node.clone();
        self.with_control_dependencies(&[pivot.as_str()], |g| g.zeros_filled(&shape, val.dtype))
    }

    /// The dtype of the variable behind a resource handle (through Switches and Enters).
    fn resource_dtype(&self, handle: &Output) -> Result<DType> {
        let mut node = handle.node.clone();
        loop {
            let n = self
                .node(&node)
                .ok_or_else(|| Status::internal(format!("no node `{node}`")))?;
            if n.op == "VarHandleOp" {
                return crate::graph::attr::dtype(n, "dtype");
            }
            if !matches!(n.op.as_str(), "Switch" | "Identity" | "Enter" | "Merge") {
                return Err(Status::unimplemented(format!(
                    "zero gradient for resource `{}`: it does not come from a VarHandleOp",
                    handle.name()
                )));
            }
            node = self.data_input(&node, 0)?.node;
        }
    }

    /// After backprop (`PostProcessing`): a loop variable whose next value does not depend on
    /// its previous one gets zeros as gradient for every iteration but the last.
    pub(crate) fn post_process_loops(&mut self, loops: &LoopState) -> Result<()> {
        let mut states: Vec<usize> = loops.map.values().copied().collect();
        states.sort_unstable();
        for s in states {
            let mut merges: Vec<Output> = self.cf.grad_states[s]
                .switch_map
                .values()
                .cloned()
                .collect();
            merges.sort_by(|a, b| a.node.cmp(&b.node));
            let grad_ctx = self.cf.grad_states[s].grad_ctx;
            for m in merges {
                let i0 = self.data_input(&m.node, 0)?;
                let i1 = self.data_input(&m.node, 1)?;
                if i0 != i1 {
                    continue;
                }
                let next = if i0.shape.is_fully_defined() {
                    self.cf_enter(Some(grad_ctx), |g| -> Result<Output> {
                        let zeros = g.zeros_const("Const", i0.dtype, &i0.shape)?;
                        g.add1(NodeSpec::new("NextIteration").input(&zeros))
                    })?
                } else {
                    let outer = self.ctx(grad_ctx).outer;
                    let outside = self.data_input(&i0.node, 0)?;
                    let zeros = self.cf_enter(outer, |g| -> Result<Output> {
                        let shape = g.add1(NodeSpec::new("Shape").input(&outside))?;
                        g.zeros_filled(&shape, i0.dtype)
                    })?;
                    self.cf_enter(Some(grad_ctx), |g| {
                        g.add1(NodeSpec::new("NextIteration").input(&zeros))
                    })?
                };
                self.update_input(&m.node, 1, &next)?;
            }
        }
        Ok(())
    }
}

fn loop_unknown(what: &str) -> Status {
    Status::unimplemented(format!(
        "`{what}` belongs to a while loop this graph builder did not build (an imported \
         graph); gradients through it need the loop built with Graph::while_loop"
    ))
}
