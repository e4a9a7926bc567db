//! Gradients of `Einsum` and `MatrixInverse` (TensorFlow's `_EinsumGrad` and
//! `_MatrixInverseGrad` in `linalg_grad.py`).
//!
//! `Einsum`'s gradient with respect to an input is another einsum: the output's gradient
//! contracted with the other input into the input's subscripts. Labels of the input that
//! appear nowhere else were summed by the forward op; their gradient is broadcast back along
//! them (through one more einsum when the input repeats a label or the order changes), and
//! ellipsis dimensions that were broadcast are summed back to the input's. Shapes are
//! constants where the forward op's inputs are fully known, `Shape` ops otherwise (the rank
//! must be known).

use std::collections::BTreeSet;

use crate::error::{Result, Status};
use crate::graph::attr::{self, value};
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::einsum::Equation;
use crate::graph::gradients::GradCtx;
use crate::tensor::Tensor;

type Grads = Result<Vec<Option<Output>>>;

const ELLIPSIS: &str = "...";

/// `Einsum(inputs)` with `equation`.
fn einsum_node(g: &mut Graph, equation: &str, inputs: &[&Output]) -> Result<Output> {
    let inputs: Vec<Output> = inputs.iter().map(|&o| o.clone()).collect();
    g.add1(
        NodeSpec::new("Einsum")
            .input_list(&inputs)
            .attr("equation", value::string(equation)),
    )
}

/// An int32 vector constant.
fn ints(g: &mut Graph, values: &[i64]) -> Result<Output> {
    let v: Vec<i32> = values.iter().map(|&v| v as i32).collect();
    g.constant(&Tensor::from_vec([v.len()], v)?)
}

/// The dimensions of `x` at `axes` (negative ones count from the end) as an int32 vector:
/// a constant when they are known, gathered from `Shape(x)` otherwise.
fn dims_at(g: &mut Graph, x: &Output, axes: &[i64]) -> Result<Output> {
    let rank = x.shape.rank().ok_or_else(|| {
        Status::unimplemented(format!(
            "the gradient of Einsum needs the rank of `{}`, which is unknown",
            x.name()
        ))
    })? as i64;
    let axes: Vec<i64> = axes
        .iter()
        .map(|&a| if a < 0 { a + rank } else { a })
        .collect();
    if let Some(dims) = x.shape.dims() {
        let known: Option<Vec<i64>> = axes
            .iter()
            .map(|&a| dims[a as usize].map(|d| d as i64))
            .collect();
        if let Some(known) = known {
            return ints(g, &known);
        }
    }
    let shape = g.shape_of(x)?;
    let indices = ints(g, &axes)?;
    g.gather(&shape, &indices, 0)
}

/// TensorFlow's `_GetAxisFromLabel`: the label's leftmost axis, negative after an ellipsis.
fn axis_of(subscripts: &str, label: char) -> Option<i64> {
    let mut parts = subscripts.splitn(2, ELLIPSIS);
    let head = parts.next().unwrap_or("");
    if let Some(i) = head.find(label) {
        return Some(i as i64);
    }
    let tail = parts.next()?;
    tail.find(label).map(|i| i as i64 - tail.len() as i64)
}

/// The labels of `subscripts` without `.`.
fn label_set(subscripts: &str) -> BTreeSet<char> {
    subscripts.chars().filter(|&c| c != '.').collect()
}

/// TensorFlow's `_GetGradReduced`: the gradient of a unary einsum `input_subs->output_subs`
/// that sums the labels `reduced`, given the output's gradient.
fn grad_reduced(
    g: &mut Graph,
    grad: &Output,
    output_subs: &str,
    input_subs: &str,
    input: &Output,
    reduced: &BTreeSet<char>,
) -> Result<Output> {
    let reduced_subs: String = reduced.iter().collect();
    let axes: Vec<i64> = reduced
        .iter()
        .map(|&c| axis_of(input_subs, c).expect("a reduced label of the input"))
        .collect();
    let repeated = label_set(input_subs).len() + label_set(output_subs).len()
        < input_subs.replace(ELLIPSIS, ".").len() + output_subs.replace(ELLIPSIS, ".").len();
    let without: String = input_subs
        .chars()
        .filter(|c| !reduced.contains(c))
        .collect();
    let input_shape = g.shape_of(input)?;
    if !repeated && without == output_subs {
        // The input's shape with 1 at the reduced axes: gather from [shape..., 1].
        let rank =
            input.shape.rank().ok_or_else(|| {
                Status::unimplemented("the gradient of Einsum needs its input's rank")
            })? as i64;
        let index: Vec<i64> = (0..rank)
            .map(|a| {
                let reduced = axes.iter().any(|&r| (r + rank) % rank == a);
                if reduced {
                    rank
                } else {
                    a
                }
            })
            .collect();
        let one = ints(g, &[1])?;
        let padded = g.concat(&[input_shape.clone(), one], 0)?;
        let index = ints(g, &index)?;
        let kept = g.gather(&padded, &index, 0)?;
        let reshaped = g.reshape(grad, &kept)?;
        return g.broadcast_to(&reshaped, &input_shape);
    }
    let reduced_dims = dims_at(g, input, &axes)?;
    let grad_shape = g.shape_of(grad)?;
    let with_reduced = g.concat(&[reduced_dims, grad_shape.clone()], 0)?;
    let ones = ints(g, &vec![1; reduced.len()])?;
    let reduced_shape = g.concat(&[ones, grad_shape], 0)?;
    let reshaped = g.reshape(grad, &reduced_shape)?;
    let broadcast = g.broadcast_to(&reshaped, &with_reduced)?;
    einsum_node(
        g,
        &format!("{reduced_subs}{output_subs}->{input_subs}"),
        &[&broadcast],
    )
}

/// TensorFlow's `_GetGradWrt`: the gradient of a binary einsum with respect to the input
/// `input_subs`, before any unbroadcasting.
fn grad_wrt(
    g: &mut Graph,
    grad: &Output,
    other: &Output,
    input: &Output,
    input_subs: &str,
    other_subs: &str,
    output_subs: &str,
) -> Result<Output> {
    let elsewhere = label_set(&format!("{output_subs}{other_subs}"));
    let reduced: BTreeSet<char> = label_set(input_subs)
        .into_iter()
        .filter(|c| !elsewhere.contains(c))
        .collect();
    let left: String = input_subs
        .chars()
        .filter(|c| !reduced.contains(c))
        .collect();
    let partial = einsum_node(
        g,
        &format!("{output_subs},{other_subs}->{left}"),
        &[grad, other],
    )?;
    if reduced.is_empty() {
        return Ok(partial);
    }
    grad_reduced(g, &partial, &left, input_subs, input, &reduced)
}

/// TensorFlow's `_GetBcastSubshape`: the axes `[start, end)` under the ellipsis, `end`
/// counted from the back (0: to the end).
fn bcast_axes(subscripts: &str) -> Option<(i64, i64)> {
    let start = subscripts.find(ELLIPSIS)?;
    let remaining = subscripts.len() - (start + ELLIPSIS.len());
    Some((start as i64, remaining as i64))
}

/// Sums `grad` over the ellipsis axes `x` broadcast against `y`'s, back to `x`'s shape.
fn unbroadcast(
    g: &mut Graph,
    grad: &Output,
    x: &Output,
    x_subs: &str,
    y: &Output,
    y_subs: &str,
) -> Result<Output> {
    let ellipsis_dims = |g: &mut Graph, t: &Output, subs: &str| -> Result<(i64, Output)> {
        let (start, remaining) = bcast_axes(subs).unwrap_or((0, 0));
        let rank = t.shape.rank().ok_or_else(|| {
            Status::unimplemented("the gradient of Einsum needs its inputs' ranks")
        })? as i64;
        let axes: Vec<i64> = (start..rank - remaining).collect();
        Ok((start, dims_at(g, t, &axes)?))
    };
    let (start, xb) = ellipsis_dims(g, x, x_subs)?;
    let (_, yb) = ellipsis_dims(g, y, y_subs)?;
    let args = g.add_node(NodeSpec::new("BroadcastGradientArgs").input(&xb).input(&yb))?;
    let offset = g.constant(&Tensor::scalar(start as i32))?;
    let axes = g.add(&args[0], &offset)?;
    let summed = g.reduce("Sum", grad, &axes, false)?;
    let shape = g.shape_of(x)?;
    g.reshape(&summed, &shape)
}

/// `_EinsumGrad`.
pub fn einsum(g: &mut Graph, c: &GradCtx) -> Grads {
    let text = attr::string_or(&c.node, "equation", "")?;
    let text = Equation::explicit(&text);
    let (inputs, output_subs) = text
        .split_once("->")
        .ok_or_else(|| c.err("Einsum's equation has no `->`"))?;
    let grad = c.grad(0)?.clone();
    if c.inputs.len() == 1 {
        let x = c.input(0)?.clone();
        let reduced: BTreeSet<char> = label_set(inputs)
            .difference(&label_set(output_subs))
            .copied()
            .collect();
        let gx = if reduced.is_empty() {
            einsum_node(g, &format!("{output_subs}->{inputs}"), &[&grad])?
        } else {
            grad_reduced(g, &grad, output_subs, inputs, &x, &reduced)?
        };
        return Ok(vec![Some(gx)]);
    }
    let (x_subs, y_subs) = inputs
        .split_once(',')
        .ok_or_else(|| c.err("Einsum has two inputs but one subscript"))?;
    let (mut x_subs, mut y_subs) = (x_subs.to_string(), y_subs.to_string());
    if output_subs.contains(ELLIPSIS) {
        if !x_subs.contains(ELLIPSIS) {
            x_subs.push_str(ELLIPSIS);
        }
        if !y_subs.contains(ELLIPSIS) {
            y_subs.push_str(ELLIPSIS);
        }
    }
    let (x, y) = (c.input(0)?.clone(), c.input(1)?.clone());
    let gx = grad_wrt(g, &grad, &y, &x, &x_subs, &y_subs, output_subs)?;
    let gy = grad_wrt(g, &grad, &x, &y, &y_subs, &x_subs, output_subs)?;
    if !output_subs.contains(ELLIPSIS) {
        return Ok(vec![Some(gx), Some(gy)]);
    }
    let static_batch = |t: &Output, subs: &str| -> Option<Vec<usize>> {
        let dims = t.shape.to_shape()?.dims().to_vec();
        let (start, remaining) = bcast_axes(subs).unwrap_or((0, 0));
        Some(dims[start as usize..dims.len() - remaining as usize].to_vec())
    };
    if let (Some(bx), Some(by)) = (static_batch(&x, &x_subs), static_batch(&y, &y_subs)) {
        if bx == by {
            return Ok(vec![Some(gx), Some(gy)]);
        }
    }
    let gx = unbroadcast(g, &gx, &x, &x_subs, &y, &y_subs)?;
    let gy = unbroadcast(g, &gy, &y, &y_subs, &x, &x_subs)?;
    Ok(vec![Some(gx), Some(gy)])
}

/// `_MatrixInverseGrad`: `-A^-T g A^-T` (for `adjoint`, `-A^-1 g A^-1` of the transposed
/// matrix's inverse), from the op's output.
pub fn matrix_inverse(g: &mut Graph, c: &GradCtx) -> Grads {
    let ainv = c.output(0)?.clone();
    let grad = c.grad(0)?.clone();
    let adjoint = attr::bool_or(&c.node, "adjoint", false)?;
    let product = |g: &mut Graph, a: &Output, b: &Output, ta: bool, tb: bool| {
        if a.shape.rank() == Some(2) && b.shape.rank() == Some(2) {
            g.matmul_t(a, b, ta, tb)
        } else {
            g.batch_matmul(a, b, ta, tb)
        }
    };
    let inner = product(g, &grad, &ainv, adjoint, !adjoint)?;
    let outer = product(g, &ainv, &inner, !adjoint, false)?;
    Ok(vec![Some(g.neg(&outer)?)])
}
