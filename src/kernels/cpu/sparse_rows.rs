//! The row-shaping kernels of sparse feature columns: `SparseFillEmptyRows` (a default entry in
//! every empty row, as `embedding_column` does before its lookup), its gradient op
//! `SparseFillEmptyRowsGrad`, and `SparseReshape`.
//!
//! `SparseFillEmptyRows` is TensorFlow 2.21's CPU kernel (`sparse_fill_empty_rows_op.cc`): it
//! counts the entries of each row, and unless every row has one and the rows are in order
//! (then the input is returned as is), writes each row's entries in their input order after
//! the rows before it, with `[row, 0, ...]` and the default in each empty row; only the row
//! index is checked. `SparseReshape` is `reshape_util.cc`: each index read as a row-major
//! offset into the old shape and written back in the new one, at most one `-1` inferred. The
//! outputs go through the memory budget before they are allocated; bad inputs fail with
//! TensorFlow's messages.

use super::{checked_elements, input, stateless, Items};
use crate::error::Result;
use crate::kernels::{KernelFactory, OpContext};
use crate::tensor::{DType, Shape, Tensor};

/// Returns the factory for a sparse row op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "SparseFillEmptyRows" => |_| stateless(fill_empty_rows),
        "SparseFillEmptyRowsGrad" => |_| stateless(fill_empty_rows_grad),
        "SparseReshape" => |_| stateless(reshape),
        _ => return None,
    };
    Some(factory)
}

/// Reads an int64 input, refusing any other dtype with the node's name.
fn int64s(ctx: &OpContext<'_>, t: &Tensor, what: &str) -> Result<Vec<i64>> {
    if t.dtype() != DType::Int64 {
        return Err(ctx.invalid(format!("{what} must be int64, got {}", t.dtype())));
    }
    Ok(t.values::<i64>()?.into_owned())
}

/// SparseFillEmptyRows(indices, values, dense_shape, default_value) -> (output_indices,
/// output_values, empty_row_indicator, reverse_index_map).
fn fill_empty_rows(ctx: &mut OpContext<'_>) -> Result<()> {
    let (indices, values) = (input(ctx, 0)?, input(ctx, 1)?);
    let (dense_shape, default) = (input(ctx, 2)?, input(ctx, 3)?);
    if dense_shape.rank() != 1 {
        return Err(ctx.invalid(format!(
            "dense_shape must be a vector, saw: {}",
            dense_shape.shape()
        )));
    }
    if indices.rank() != 2 {
        return Err(ctx.invalid(format!(
            "indices must be a matrix, saw: {}",
            indices.shape()
        )));
    }
    if values.rank() != 1 {
        return Err(ctx.invalid(format!("values must be a vector, saw: {}", values.shape())));
    }
    let (n, rank) = (indices.dims()[0], indices.dims()[1]);
    if values.dims()[0] != n {
        return Err(ctx.invalid(format!(
            "The length of `values` ({}) must match the first dimension of `indices` ({n}).",
            values.dims()[0]
        )));
    }
    if default.rank() != 0 {
        return Err(ctx.invalid(format!(
            "default_value must be a scalar, saw: {}",
            default.shape()
        )));
    }
    if dense_shape.num_elements() == 0 {
        return Err(ctx.invalid("Dense shape cannot be empty."));
    }
    if dense_shape.num_elements() != rank {
        return Err(ctx.invalid(format!(
            "The length of `dense_shape` ({}) must match the second dimension of `indices` \
             ({rank}).",
            dense_shape.num_elements()
        )));
    }
    if values.dtype() != default.dtype() {
        return Err(ctx.invalid(format!(
            "values and default_value have different dtypes: {} vs. {}",
            values.dtype(),
            default.dtype()
        )));
    }
    let idx = int64s(ctx, &indices, "indices")?;
    let dense_rows = int64s(ctx, &dense_shape, "dense_shape")?[0];
    let rows = usize::try_from(dense_rows)
        .map_err(|_| ctx.invalid(format!("Dimension {dense_rows} must be >= 0")))?;
    checked_elements(ctx, &[rows])?;
    if rows == 0 {
        if n != 0 {
            return Err(ctx.invalid(format!(
                "Received SparseTensor with dense_shape[0] = 0 but indices.shape[0] = {n}"
            )));
        }
        ctx.set_output(0, Tensor::from_vec(vec![0, rank], Vec::<i64>::new())?);
        ctx.set_output(1, values.clone());
        ctx.set_output(2, Tensor::from_vec(vec![0], Vec::<bool>::new())?);
        ctx.set_output(3, Tensor::from_vec(vec![0], Vec::<i64>::new())?);
        return Ok(());
    }
    let mut counts = vec![0usize; rows];
    let mut ordered = true;
    let mut last = 0i64;
    for i in 0..n {
        let row = idx[i * rank];
        if row < 0 || row >= dense_rows {
            return Err(ctx.invalid(format!("indices({i}, 0) is invalid: {row} >= {dense_rows}")));
        }
        counts[row as usize] += 1;
        ordered &= row >= last;
        last = row;
    }
    let empty: Vec<bool> = counts.iter().map(|&c| c == 0).collect();
    // Where each row starts in the output: the filled sizes of the rows before it.
    let mut starts = Vec::with_capacity(rows);
    let mut total = 0usize;
    for &c in &counts {
        starts.push(total);
        total += c.max(1);
    }
    let full = !empty.contains(&true);
    ctx.set_output(2, Tensor::from_vec(vec![rows], empty.clone())?);
    if full && ordered {
        ctx.set_output(0, indices);
        ctx.set_output(1, values);
        ctx.set_output(
            3,
            Tensor::from_vec(vec![n], (0..n as i64).collect::<Vec<_>>())?,
        );
        return Ok(());
    }
    checked_elements(ctx, &[total, rank])?;
    let mut out_idx = vec![0i64; total * rank];
    let mut reverse = vec![0i64; n];
    let mut filled = vec![0usize; rows];
    let mut at = vec![0usize; n];
    for i in 0..n {
        let row = idx[i * rank] as usize;
        let o = starts[row] + filled[row];
        filled[row] += 1;
        out_idx[o * rank..(o + 1) * rank].copy_from_slice(&idx[i * rank..(i + 1) * rank]);
        reverse[i] = o as i64;
        at[i] = o;
    }
    for (row, &is_empty) in empty.iter().enumerate() {
        if is_empty {
            out_idx[starts[row] * rank] = row as i64;
        }
    }
    let out_values = dispatch_items!(ctx, values.dtype(), T => {
        let out = placed(&T::items(&values)?, &T::items(&default)?[0], &at, total);
        T::tensor(vec![total], out)?
    });
    ctx.set_output(0, Tensor::from_vec(vec![total, rank], out_idx)?);
    ctx.set_output(1, out_values);
    ctx.set_output(3, Tensor::from_vec(vec![n], reverse)?);
    Ok(())
}

/// `total` copies of `fill`, but `values[i]` at position `at[i]`.
fn placed<T: Items>(values: &[T], fill: &T, at: &[usize], total: usize) -> Vec<T> {
    let mut out = vec![fill.clone(); total];
    for (v, &o) in values.iter().zip(at) {
        out[o] = v.clone();
    }
    out
}

/// SparseFillEmptyRowsGrad(reverse_index_map, grad_values) -> (d_values, d_default_value):
/// each input value's gradient is the gradient at its output position; the default's is the
/// sum of the rest.
fn fill_empty_rows_grad(ctx: &mut OpContext<'_>) -> Result<()> {
    let (map, grad) = (input(ctx, 0)?, input(ctx, 1)?);
    if map.rank() != 1 {
        return Err(ctx.invalid(format!(
            "reverse_index_map must be a vector, saw: {}",
            map.shape()
        )));
    }
    if grad.rank() != 1 {
        return Err(ctx.invalid(format!(
            "grad_values must be a vector, saw: {}",
            grad.shape()
        )));
    }
    let map = int64s(ctx, &map, "reverse_index_map")?;
    let full = grad.dims()[0];
    let mut visited = vec![false; full];
    for &r in &map {
        if r < 0 || r as u64 >= full as u64 {
            return Err(ctx.invalid(format!(
                "Elements in reverse index must be in [0, {full}) but got {r}"
            )));
        }
        visited[r as usize] = true;
    }
    let (d_values, d_default) = dispatch_real!(ctx, grad.dtype(), T => {
        let g = grad.values::<T>()?;
        let d: Vec<T> = map.iter().map(|&r| g[r as usize]).collect();
        let mut rest = T::default();
        for (i, &v) in g.iter().enumerate() {
            if !visited[i] {
                rest += v;
            }
        }
        (
            Tensor::from_vec(vec![map.len()], d)?,
            Tensor::from_vec(Shape::scalar(), vec![rest])?,
        )
    });
    ctx.set_output(0, d_values);
    ctx.set_output(1, d_default);
    Ok(())
}

/// SparseReshape(input_indices, input_shape, new_shape) -> (output_indices, output_shape).
fn reshape(ctx: &mut OpContext<'_>) -> Result<()> {
    let (indices, shape, target) = (input(ctx, 0)?, input(ctx, 1)?, input(ctx, 2)?);
    if indices.rank() != 2 {
        return Err(ctx.invalid("Input must be a matrix."));
    }
    if shape.rank() != 1 {
        return Err(ctx.invalid("Input shape must be a vector."));
    }
    let (nnz, in_rank) = (indices.dims()[0], indices.dims()[1]);
    if in_rank != shape.num_elements() {
        return Err(ctx.invalid("Input tensor rank must match input shape length."));
    }
    if target.rank() != 1 {
        return Err(ctx.invalid(format!(
            "Target shape should be a vector but received shape {}",
            target.shape()
        )));
    }
    let old = int64s(ctx, &shape, "input_shape")?;
    if let Some(&d) = old.iter().find(|&&d| d < 0) {
        return Err(ctx.invalid(format!("Dimension {d} must be >= 0")));
    }
    let dense_size = old
        .iter()
        .try_fold(1i64, |n, &d| n.checked_mul(d))
        .ok_or_else(|| ctx.invalid(format!("Shape {} is too large", shape_text(&old))))?;
    let want = int64s(ctx, &target, "new_shape")?;
    let mut new = Vec::with_capacity(want.len());
    let mut product = 1i64;
    let mut unknown: Option<usize> = None;
    for (d, &size) in want.iter().enumerate() {
        if size == -1 {
            if let Some(u) = unknown {
                return Err(ctx.invalid(format!(
                    "only one output dimension may be -1, not both {u} and {d}"
                )));
            }
            unknown = Some(d);
            new.push(1);
        } else {
            if size < 0 {
                return Err(ctx.invalid(format!("size {d} must be non-negative, not {size}")));
            }
            product = product
                .checked_mul(size)
                .ok_or_else(|| ctx.invalid("the requested shape is too large"))?;
            new.push(size);
        }
    }
    if let Some(u) = unknown {
        if product <= 0 {
            return Err(ctx.invalid(
                "reshape cannot infer the missing input size for an empty tensor unless all \
                 specified input sizes are non-zero",
            ));
        }
        let missing = dense_size / product;
        if product * missing != dense_size {
            return Err(ctx.invalid(format!(
                "Input to reshape is a SparseTensor with {dense_size} dense values, but the \
                 requested shape requires a multiple of {product}. input_shape={} \
                 output_shape={}",
                shape_text(&old),
                shape_text(&new)
            )));
        }
        new[u] = missing;
    }
    let new_size: i64 = new.iter().product();
    if new_size != dense_size {
        return Err(ctx.invalid(format!(
            "Input to reshape is a tensor with {dense_size} dense values, but the requested \
             shape has {new_size}. input_shape={} output_shape={}",
            shape_text(&old),
            shape_text(&new)
        )));
    }
    if old == new {
        ctx.set_output(0, indices);
        ctx.set_output(1, shape);
        return Ok(());
    }
    let out_rank = new.len();
    checked_elements(ctx, &[nnz, out_rank])?;
    let idx = int64s(ctx, &indices, "input_indices")?;
    let strides = |dims: &[i64]| {
        let mut s = vec![1i64; dims.len()];
        for d in (0..dims.len().saturating_sub(1)).rev() {
            s[d] = s[d + 1].wrapping_mul(dims[d + 1]);
        }
        s
    };
    let (in_strides, out_strides) = (strides(&old), strides(&new));
    let mut out = vec![0i64; nnz * out_rank];
    if nnz > 0 {
        if dense_size <= 0 || product <= 0 {
            return Err(ctx.invalid(format!(
                "Input tensor has {nnz} non zero elements but input shape ({}) or output shape \
                 ({}) is empty",
                shape_text(&old),
                shape_text(&new)
            )));
        }
        for i in 0..nnz {
            let row = &idx[i * in_rank..(i + 1) * in_rank];
            let mut id = row
                .iter()
                .zip(&in_strides)
                .fold(0i64, |id, (&x, &s)| id.wrapping_add(x.wrapping_mul(s)));
            for (o, &s) in out[i * out_rank..(i + 1) * out_rank]
                .iter_mut()
                .zip(&out_strides)
            {
                *o = id / s;
                id %= s;
            }
        }
    }
    ctx.set_output(0, Tensor::from_vec(vec![nnz, out_rank], out)?);
    ctx.set_output(1, Tensor::from_vec(vec![out_rank], new)?);
    Ok(())
}

/// A shape as TensorFlow's `TensorShape::DebugString` writes it (`[2,3]`).
fn shape_text(dims: &[i64]) -> String {
    let dims: Vec<String> = dims.iter().map(i64::to_string).collect();
    format!("[{}]", dims.join(","))
}
