//! TensorFlow 1's control-flow ops (`control_flow_ops.cc`): `Switch` and `Merge` for
//! conditionals, `Enter`, `Exit`, `NextIteration` and `LoopCond` for while loops, their `Ref`
//! forms, and `ControlTrigger`. TensorFlow's masters lower `If` and `While` to these before
//! partitioning, and `tf.compat.v1` programs write them directly. Their semantics (dead
//! tensors, frames, iterations) live in the executor (`runtime/executor/frames.rs`); the
//! kernels in `kernels/cpu/control_flow.rs` only forward tensors. The builder writes them
//! with `Graph::cond` and `Graph::while_loop` (`graph/control_flow.rs`); their gradients are
//! in `grads/control_flow.rs`.

use crate::error::Result;
use crate::graph::grads::control_flow as grad;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::{self as sf, ShapeCtx};
use crate::tensor::PartialShape;

/// TensorFlow 1's control-flow ops that the executor, the partitioner and graph import treat
/// specially, each standing for its `Ref` form too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlFlowOp {
    /// `Switch`, `RefSwitch`.
    Switch,
    /// `Merge`, `RefMerge`.
    Merge,
    /// `Enter`, `RefEnter`.
    Enter,
    /// `Exit`, `RefExit`.
    Exit,
    /// `NextIteration`, `RefNextIteration`.
    NextIteration,
}

impl ControlFlowOp {
    /// The control-flow op `op` is, if it is one.
    pub fn of(op: &str) -> Option<ControlFlowOp> {
        Some(match op {
            "Switch" | "RefSwitch" => ControlFlowOp::Switch,
            "Merge" | "RefMerge" => ControlFlowOp::Merge,
            "Enter" | "RefEnter" => ControlFlowOp::Enter,
            "Exit" | "RefExit" => ControlFlowOp::Exit,
            "NextIteration" | "RefNextIteration" => ControlFlowOp::NextIteration,
            _ => return None,
        })
    }

    /// Whether an op is this one (or its `Ref` form).
    pub fn is(self, op: &str) -> bool {
        ControlFlowOp::of(op) == Some(self)
    }
}

/// Whether an edge from an op `src` into an op `dst` closes a while loop: a `NextIteration`
/// feeding its `Merge`, the one cycle a graph may have, which the `Merge` does not wait for.
pub fn is_loop_back_edge(src: &str, dst: &str) -> bool {
    ControlFlowOp::NextIteration.is(src) && ControlFlowOp::Merge.is(dst)
}

pub(super) fn register(r: &mut Registry) {
    for (name, data) in [("Switch", "data: T"), ("RefSwitch", "data: Ref(T)")] {
        let (out_false, out_true) = if name == "Switch" {
            ("output_false: T", "output_true: T")
        } else {
            ("output_false: Ref(T)", "output_true: Ref(T)")
        };
        OpDef::build(name)
            .attr("T: type")
            .input(data)
            .input("pred: bool")
            .output(out_false)
            .output(out_true)
            .shape(switch_shape)
            .grad(grad::switch)
            .register(r);
    }
    for (name, inputs, output) in [
        ("Merge", "inputs: N * T", "output: T"),
        ("RefMerge", "inputs: N * Ref(T)", "output: Ref(T)"),
    ] {
        OpDef::build(name)
            .attr("T: type")
            .attr("N: int >= 1")
            .input(inputs)
            .output(output)
            .output("value_index: int32")
            .shape(merge_shape)
            .grad(grad::merge)
            .register(r);
    }
    for (name, data, output) in [
        ("Enter", "data: T", "output: T"),
        ("RefEnter", "data: Ref(T)", "output: Ref(T)"),
    ] {
        OpDef::build(name)
            .attr("T: type")
            .attr("frame_name: string")
            .attr("is_constant: bool = false")
            .attr("parallel_iterations: int = 10")
            .input(data)
            .output(output)
            .shape(sf::unchanged)
            .grad(grad::enter)
            .register(r);
    }
    for (name, data, output) in [
        ("Exit", "data: T", "output: T"),
        ("RefExit", "data: Ref(T)", "output: Ref(T)"),
        ("NextIteration", "data: T", "output: T"),
        ("RefNextIteration", "data: Ref(T)", "output: Ref(T)"),
    ] {
        OpDef::build(name)
            .attr("T: type")
            .input(data)
            .output(output)
            .shape(sf::unchanged)
            .grad(if name.contains("Exit") {
                grad::exit
            } else {
                grad::next_iteration
            })
            .register(r);
    }
    OpDef::build("LoopCond")
        .input("input: bool")
        .output("output: bool")
        .shape(sf::scalar)
        .no_grad()
        .register(r);
    OpDef::build("Assert")
        .input("condition: bool")
        .input("data: T")
        .attr("T: list(type) >= 1")
        .attr("summarize: int = 3")
        .stateful()
        .shape(sf::no_outputs)
        .no_grad()
        .register(r);
    OpDef::build("ControlTrigger")
        .shape(sf::no_outputs)
        .no_grad()
        .register(r);
}

/// Both outputs of a `Switch` have its data's shape.
fn switch_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let data = ctx.input(0);
    Ok(vec![data.clone(), data])
}

/// A `Merge` has the shape its inputs agree on (unknown where they differ) and a scalar index.
fn merge_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    let mut shape = ctx.input(0);
    for i in 1..ctx.inputs.len() {
        shape = sf::merge(ctx, &shape, &ctx.input(i)).unwrap_or_else(|_| PartialShape::unknown());
    }
    Ok(vec![shape, PartialShape::new(Vec::new())])
}
