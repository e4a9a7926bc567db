//! Gradients of TensorFlow 1's control-flow ops (`control_flow_grad.py`).
//!
//! - `Merge` → a `Switch` of the gradient: on the cond's predicate (`cond_grad`), on the
//!   gradient loop's `LoopCond` for a loop variable's Merge, or on `value_index == i` for a
//!   Merge built by hand.
//! - `Switch` → a `Merge` of the gradients of both outputs: in a cond, the untaken side's
//!   gradient is zeros built on that side (`cond_grad`); for a loop variable, the first visit
//!   (from its Exit) builds `b_switch` = Merge(grad, grad) and the second (from the body)
//!   makes a NextIteration of the body's gradient its back edge.
//! - `Exit` → an `Enter` of the gradient into the gradient loop (`b_exit`).
//! - `Enter` → an `Exit` of the gradient out of it for a loop variable; for a loop invariant,
//!   the sum over the iterations (`b_acc`).
//! - `NextIteration` → the gradient itself (the back edge is added by `Switch`'s gradient).

use crate::error::{Result, Status};
use crate::graph::attr;
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::context::Kind;
use crate::graph::gradients::GradCtx;
use crate::tensor::DType;

/// The gradient loop the builder is in, with its state.
fn grad_loop(g: &Graph) -> Option<(usize, usize)> {
    let gc = g.while_context_of(g.cf.current)?;
    let s = g.while_parts(gc).ok()?.grad_state?;
    Some((gc, s))
}

pub(crate) fn switch(g: &mut Graph, ctx: &GradCtx) -> Result<Vec<Option<Output>>> {
    let node = ctx.node.name.clone();
    let kind = g.op_context(&node).map(|c| g.ctx(c).kind.clone());
    match kind {
        Some(Kind::While(_)) => {
            let (_, s) = grad_loop(g).ok_or_else(|| {
                ctx.err("a loop Switch is differentiated outside its gradient loop")
            })?;
            if let Some(merge) = g.cf.grad_states[s].switch_map.get(&node).cloned() {
                // The second visit, from the body: the body's gradient is the next value.
                if let Some(g1) = &ctx.grads[1] {
                    g.add_next_and_back_edge(&merge, g1, None)?;
                }
                return Ok(vec![None, None]);
            }
            let Some(g0) = &ctx.grads[0] else {
                return Ok(vec![None, None]);
            };
            let merge = g.add_node(
                NodeSpec::new("Merge")
                    .name("b_switch")
                    .input_list(&[g0.clone(), g0.clone()]),
            )?;
            g.cf.grad_states[s]
                .switch_map
                .insert(node, merge[0].clone());
            Ok(vec![Some(merge[0].clone()), None])
        }
        Some(Kind::Cond(cc)) => {
            let branch = cc.branch;
            let Some(taken) = ctx.grads[branch].clone() else {
                return Ok(vec![None, None]);
            };
            match ctx.grads[1 - branch].clone() {
                Some(zero) => {
                    let pair = if branch == 1 {
                        [zero, taken]
                    } else {
                        [taken, zero]
                    };
                    let m =
                        g.add_node(NodeSpec::new("Merge").name("cond_grad").input_list(&pair))?;
                    Ok(vec![Some(m[0].clone()), None])
                }
                None if ctx.inputs[0].dtype == DType::Resource => {
                    let m = g.add_node(
                        NodeSpec::new("Merge")
                            .name("cond_resource_grad")
                            .input_list(&[taken.clone(), taken]),
                    )?;
                    Ok(vec![Some(m[0].clone()), None])
                }
                None => Ok(vec![None, None]),
            }
        }
        None => {
            let (Some(g0), Some(g1)) = (&ctx.grads[0], &ctx.grads[1]) else {
                return Ok(vec![None, None]);
            };
            let pred = ctx.input(1)?.clone();
            let f = g.switch_ref_or_tensor(g0, &pred, "Switch")?[0].clone();
            let t = g.switch_ref_or_tensor(g1, &pred, "Switch")?[1].clone();
            let m = g.add_node(NodeSpec::new("Merge").input_list(&[f, t]))?;
            Ok(vec![Some(m[0].clone()), None])
        }
    }
}

pub(crate) fn merge(g: &mut Graph, ctx: &GradCtx) -> Result<Vec<Option<Output>>> {
    let grad = ctx.grad(0)?.clone();
    let input = ctx.input(0)?.node.clone();
    let kind = g.output_context(&input).map(|c| g.ctx(c).kind.clone());
    match kind {
        Some(Kind::While(_)) => {
            let (gc, _) = grad_loop(g).ok_or_else(|| {
                ctx.err("a loop Merge is differentiated outside its gradient loop")
            })?;
            let pivot = g
                .while_parts(gc)?
                .pivot
                .clone()
                .ok_or_else(|| ctx.err("the gradient loop has no LoopCond"))?;
            let sw = g.switch_ref_or_tensor(&grad, &pivot, "Switch")?;
            Ok(sw.into_iter().map(Some).collect())
        }
        Some(Kind::Cond(cc)) => {
            let mut pred = cc.pred.clone();
            if let Some((_, s)) = grad_loop(g) {
                // A cond inside a loop: the predicate of each iteration, saved.
                let saved = g.cf.grad_states[s].history_map.get(&pred.name()).cloned();
                pred = match saved {
                    Some(p) => p,
                    None => {
                        let history = g.add_forward_accumulator(s, &pred, false)?;
                        let real = g.add_backprop_accumulated_value(s, &history, &pred, false)?;
                        g.cf.grad_states[s]
                            .history_map
                            .insert(cc.pred.name(), real.clone());
                        real
                    }
                };
            }
            let sw = g.switch_ref_or_tensor(&grad, &pred, "cond_grad")?;
            Ok(sw.into_iter().map(Some).collect())
        }
        None => {
            let index = ctx.output(1)?.clone();
            let n = ctx.inputs.len();
            let mut out = Vec::with_capacity(n);
            for i in 0..n {
                let c = g.const_i32("Equal/y", &[], &[i as i32])?;
                let eq = g.binary("Equal", &index, &c)?;
                out.push(Some(
                    g.switch_ref_or_tensor(&grad, &eq, "Switch")?[1].clone(),
                ));
            }
            Ok(out)
        }
    }
}

pub(crate) fn exit(g: &mut Graph, ctx: &GradCtx) -> Result<Vec<Option<Output>>> {
    let Some(grad) = ctx.grads[0].clone() else {
        return Ok(vec![None]);
    };
    let (gc, _) = grad_loop(g)
        .ok_or_else(|| ctx.err("a loop Exit is differentiated outside its gradient loop"))?;
    if !g.while_parts(gc)?.back_prop {
        return Ok(vec![None]);
    }
    if let Some(fc) = g.op_while_context(&ctx.node.name) {
        if g.while_parts(fc)?.grad_state.is_some() {
            return Err(Status::unimplemented(
                "second-order gradients through while loops are not supported",
            ));
        }
    }
    let current = g.cf.current.unwrap_or(gc);
    g.add_name(current, &grad.name());
    let (frame, parallel) = {
        let w = g.while_parts(gc)?;
        (w.frame.clone(), w.parallel_iterations)
    };
    let result = g.cf_enter(Some(gc), |g| {
        g.enter_op(&grad, &frame, false, parallel, "b_exit")
    })?;
    g.while_mut(gc)?.loop_enters.push(result.clone());
    Ok(vec![Some(result)])
}

pub(crate) fn next_iteration(_g: &mut Graph, ctx: &GradCtx) -> Result<Vec<Option<Output>>> {
    Ok(vec![ctx.grads[0].clone()])
}

pub(crate) fn enter(g: &mut Graph, ctx: &GradCtx) -> Result<Vec<Option<Output>>> {
    let Some(grad) = ctx.grads[0].clone() else {
        return Ok(vec![None]);
    };
    let Some((gc, _)) = grad_loop(g) else {
        return Ok(vec![Some(grad)]);
    };
    if !g.while_parts(gc)?.back_prop {
        return Ok(vec![Some(grad)]);
    }
    if attr::bool_or(&ctx.node, "is_constant", false).unwrap_or(false) {
        let sum = g.add_backprop_accumulator(gc, &ctx.node.name, &grad)?;
        return Ok(vec![Some(sum)]);
    }
    let result = g.add1(NodeSpec::new("Exit").input(&grad))?;
    g.while_mut(gc)?.loop_exits.push(result.clone());
    g.exit_result(gc, std::slice::from_ref(&result));
    Ok(vec![Some(result)])
}
