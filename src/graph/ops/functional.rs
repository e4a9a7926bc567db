//! Functional control flow (`functional_ops.cc`): `If`/`StatelessIf` (`tf.cond`),
//! `Case`/`StatelessCase` (`tf.switch_case`), `While`/`StatelessWhile` (`tf.while_loop`) and `PartitionedCall`/`StatefulPartitionedCall`
//! (a `tf.function` called in a graph), declared as TensorFlow declares them. Their functions
//! live in the graph's library; their kernels are in `kernels/functional/`, and masters lower
//! them to v1 control flow (`graph/lower.rs`) before placing a graph.

use crate::error::Result;
use crate::graph::attr;
use crate::graph::registry::{OpDef, Registry};
use crate::graph::shape_fn::ShapeCtx;
use crate::proto::attr_value;
use crate::tensor::PartialShape;

pub(super) fn register(r: &mut Registry) {
    for (name, stateful) in [("If", true), ("StatelessIf", false)] {
        let op = OpDef::build(name)
            .input("cond: Tcond")
            .input("input: Tin")
            .output("output: Tout")
            .attr("Tcond: type")
            .attr("Tin: list(type) >= 0")
            .attr("Tout: list(type) >= 0")
            .attr("then_branch: func")
            .attr("else_branch: func")
            .attr("output_shapes: list(shape) = []")
            .shape(if_shape)
            .no_grad();
        if stateful { op.stateful() } else { op }.register(r);
    }
    for (name, stateful) in [("Case", true), ("StatelessCase", false)] {
        let op = OpDef::build(name)
            .input("branch_index: int32")
            .input("input: Tin")
            .output("output: Tout")
            .attr("Tin: list(type) >= 0")
            .attr("Tout: list(type) >= 0")
            .attr("branches: list(func) >= 1")
            .attr("output_shapes: list(shape) = []")
            .shape(if_shape)
            .no_grad();
        if stateful { op.stateful() } else { op }.register(r);
    }
    for (name, stateful) in [("While", true), ("StatelessWhile", false)] {
        let op = OpDef::build(name)
            .input("input: T")
            .output("output: T")
            .attr("T: list(type) >= 0")
            .attr("cond: func")
            .attr("body: func")
            .attr("output_shapes: list(shape) = []")
            .attr("parallel_iterations: int = 10")
            .shape(while_shape)
            .no_grad();
        if stateful { op.stateful() } else { op }.register(r);
    }
    for (name, stateful) in [
        ("PartitionedCall", false),
        ("StatefulPartitionedCall", true),
    ] {
        let op = OpDef::build(name)
            .input("args: Tin")
            .output("output: Tout")
            .attr("Tin: list(type) >= 0")
            .attr("Tout: list(type) >= 0")
            .attr("f: func")
            .attr("config: string = ''")
            .attr("config_proto: string = ''")
            .attr("executor_type: string = ''")
            .no_grad();
        if stateful { op.stateful() } else { op }.register(r);
    }
}

/// The `output_shapes` attr, when the node sets one shape per output.
fn output_shapes(ctx: &ShapeCtx<'_>) -> Result<Option<Vec<PartialShape>>> {
    let shapes = match attr::get(ctx.node, "output_shapes") {
        Some(attr_value::Value::List(l)) if !l.shape.is_empty() => &l.shape,
        _ => return Ok(None),
    };
    if shapes.len() != ctx.num_outputs {
        return Err(ctx.error(format!(
            "output_shapes has {} shapes for {} outputs",
            shapes.len(),
            ctx.num_outputs
        )));
    }
    shapes
        .iter()
        .map(PartialShape::from_proto)
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// An `If`'s outputs have the shapes `output_shapes` gives, else unknown ones (TensorFlow's
/// `IfShapeInferenceFn`).
fn if_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    Ok(output_shapes(ctx)?.unwrap_or_else(|| vec![PartialShape::unknown(); ctx.num_outputs]))
}

/// A `While`'s outputs have the shapes `output_shapes` gives, else its inputs' shapes
/// (TensorFlow's `WhileShapeInferenceFn`).
fn while_shape(ctx: &ShapeCtx<'_>) -> Result<Vec<PartialShape>> {
    match output_shapes(ctx)? {
        Some(shapes) => Ok(shapes),
        None => Ok((0..ctx.num_outputs).map(|i| ctx.input(i)).collect()),
    }
}
