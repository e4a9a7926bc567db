//! The gradient of `SparseFillEmptyRows` (TensorFlow's `_SparseFillEmptyRowsGrad` in
//! `sparse_grad.py`): the output values' gradient goes back to the input values through the
//! reverse index map, and what fell on the filled rows to the default value.

use crate::error::Result;
use crate::graph::builder::{Graph, Output};
use crate::graph::gradients::GradCtx;

type Grads = Result<Vec<Option<Output>>>;

/// `SparseFillEmptyRows(indices, values, dense_shape, default_value)`:
/// `SparseFillEmptyRowsGrad(reverse_index_map, grad(output_values))` gives the values' and
/// the default's gradients; the integer inputs get none.
pub fn sparse_fill_empty_rows(g: &mut Graph, c: &GradCtx) -> Grads {
    let reverse_index_map = c.output(3)?.clone();
    let grad_values = c.grad(1)?.clone();
    let mut d = g.sparse_fill_empty_rows_grad(&reverse_index_map, &grad_values)?;
    let d_default = d.pop();
    let d_values = d.pop();
    Ok(vec![None, d_values, None, d_default])
}
