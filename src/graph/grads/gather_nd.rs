//! Gradients of the n-dimensional gather and scatter and of `SparseToDense` (TensorFlow's
//! `_GatherNdGrad` and `_ScatterNdGrad` in `array_grad.py`, `_SparseToDenseGrad` in
//! `sparse_grad.py`).
//!
//! TensorFlow returns `GatherNd`'s gradient as `IndexedSlices` when the indices are `[n, 1]`;
//! the builder's gradients are dense, so it is always the `ScatterNd` TensorFlow builds for the
//! other shapes, which holds the same values (repeated indices summed).

use crate::error::Result;
use crate::graph::attr;
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::gradients::GradCtx;
use crate::tensor::{DType, Tensor};

type Grads = Result<Vec<Option<Output>>>;

/// The shape of `x` as a 1-D tensor of `dtype` (int32 or int64): a constant when it is known,
/// as `array_ops.shape` folds it, a `Shape` op otherwise.
fn shape_as(g: &mut Graph, x: &Output, dtype: DType) -> Result<Output> {
    match (x.shape.to_shape(), dtype) {
        (Some(_), DType::Int32) => g.shape_of(x),
        (Some(s), _) => {
            let dims: Vec<i64> = s.dims().iter().map(|&d| d as i64).collect();
            g.constant(&Tensor::from_vec([dims.len()], dims)?)
        }
        (None, _) => g.add1(
            NodeSpec::new("Shape")
                .input(x)
                .attr("out_type", attr::value::dtype(dtype)),
        ),
    }
}

/// The sum of every element of `x`, over constant axes when its rank is known.
fn sum_all(g: &mut Graph, x: &Output) -> Result<Output> {
    match x.shape.rank() {
        Some(rank) => {
            let axes: Vec<i64> = (0..rank as i64).collect();
            g.sum(x, &axes, false)
        }
        None => {
            let rank = g.unary("Rank", x)?;
            let zero = g.const_i32("Const", &[], &[0])?;
            let one = g.const_i32("Const", &[], &[1])?;
            let axes = g.range(&zero, &rank, &one)?;
            g.reduce("Sum", x, &axes, false)
        }
    }
}

/// `GatherNd(params, indices)`: the gradient scattered back to the params' positions,
/// `ScatterNd(indices, grad, shape(params))` with the op's `bad_indices_policy`.
pub fn gather_nd(g: &mut Graph, c: &GradCtx) -> Grads {
    let params = c.input(0)?.clone();
    let indices = c.input(1)?.clone();
    let shape = shape_as(g, &params, indices.dtype)?;
    let policy = attr::string_or(&c.node, "bad_indices_policy", "")?;
    let dx = g.scatter_nd_with_policy(&indices, c.grad(0)?, &shape, &policy)?;
    Ok(vec![Some(dx), None])
}

/// `ScatterNd(indices, updates, shape)`: each update's gradient is the gradient at its
/// position, `GatherNd(grad, indices)`.
pub fn scatter_nd(g: &mut Graph, c: &GradCtx) -> Grads {
    let indices = c.input(0)?.clone();
    let dy = g.gather_nd(c.grad(0)?, &indices)?;
    Ok(vec![None, Some(dy), None])
}

/// `SparseToDense(indices, shape, values, default)`: the values get the gradient at their
/// positions, the default the rest of the gradient's sum (TensorFlow's
/// `sum(grad) - sum(gather_nd(grad, indices))`); the integer inputs get none. Where
/// TensorFlow's gradient goes wrong, this one follows the op: vector or scalar indices (a 1-D
/// output) are read as rows of one index, as the op reads them, where TensorFlow's `GatherNd`
/// would read them as one deep index; and a scalar value (one value at every index) gets the
/// sum of the gradient at its positions, where TensorFlow returns them unsummed.
pub fn sparse_to_dense(g: &mut Graph, c: &GradCtx) -> Grads {
    let mut indices = c.input(0)?.clone();
    if matches!(indices.shape.rank(), Some(0 | 1)) {
        indices = g.reshape_to(&indices, &[-1, 1])?;
    }
    let grad = c.grad(0)?.clone();
    let mut values_grad = g.gather_nd(&grad, &indices)?;
    if c.input(2)?.shape.rank() == Some(0) {
        values_grad = sum_all(g, &values_grad)?;
    }
    let total = sum_all(g, &grad)?;
    let taken = sum_all(g, &values_grad)?;
    let default_grad = super::sub(g, &total, &taken)?;
    Ok(vec![None, None, Some(values_grad), Some(default_grad)])
}
