//! Gradient functions, one file per op family, and the helpers they share.
//!
//! Each function mirrors the one TensorFlow registers in Python (`math_grad.py`,
//! `array_grad.py`, `nn_grad.py`), including the names of the nodes it adds where TensorFlow
//! builds them with Python operators (`mul`, `truediv`, `add`).

pub mod array;
pub(crate) mod control_flow;
pub mod gather_nd;
pub mod linalg;
pub mod math;
pub mod nn;
pub mod sparse;
pub mod sparse_columns;

use crate::error::Result;
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::gradients::{static_reduction, Reduce};

/// Adds a two-input op named `name` (made unique in the current scope).
pub(crate) fn named(g: &mut Graph, op: &str, name: &str, x: &Output, y: &Output) -> Result<Output> {
    g.add1(NodeSpec::new(op).name(name).input(x).input(y))
}

/// `x * y` named `mul`, as Python's `*` names it.
pub(crate) fn mul(g: &mut Graph, x: &Output, y: &Output) -> Result<Output> {
    named(g, "Mul", "mul", x, y)
}

/// `x / y` named `truediv`.
pub(crate) fn div(g: &mut Graph, x: &Output, y: &Output) -> Result<Output> {
    named(g, "RealDiv", "truediv", x, y)
}

/// `x - y` named `sub`.
pub(crate) fn sub(g: &mut Graph, x: &Output, y: &Output) -> Result<Output> {
    named(g, "Sub", "sub", x, y)
}

/// The known value of a small integer tensor (a constant).
pub(crate) fn const_ints(g: &Graph, t: &Output) -> Option<Vec<i64>> {
    g.meta_of(t).and_then(|m| m.value.clone())
}

/// Sums `grad` down to `operand`'s shape (the single-operand form of unbroadcasting), with
/// constant axes when the shapes allow and `BroadcastGradientArgs` otherwise.
pub(crate) fn sum_to_shape(g: &mut Graph, grad: &Output, operand: &Output) -> Result<Output> {
    match static_reduction(&operand.shape, None, &grad.shape) {
        Reduce::None => Ok(grad.clone()),
        Reduce::Static(axes) if axes.is_empty() => {
            let s = g.shape_of(operand)?;
            g.reshape(grad, &s)
        }
        Reduce::Static(axes) => {
            let s = g.shape_of(operand)?;
            let summed = g.sum(grad, &axes, false)?;
            g.reshape(&summed, &s)
        }
        Reduce::Dynamic => {
            let s = g.shape_of(operand)?;
            let sg = g.shape(grad)?;
            let r = g.add_node(NodeSpec::new("BroadcastGradientArgs").input(&s).input(&sg))?;
            let summed = g.reduce("Sum", grad, &r[0], true)?;
            g.reshape(&summed, &s)
        }
    }
}
