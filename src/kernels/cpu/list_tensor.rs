//! TensorList kernels that convert between a list and one tensor: `TensorListFromTensor`,
//! `TensorListStack`, `TensorListGather`, `TensorListScatter`, `TensorListScatterV2`,
//! `TensorListScatterIntoExistingList`, `TensorListConcat`, `TensorListConcatV2`,
//! `TensorListSplit`. These are what `tf.TensorArray` becomes under TensorFlow 2
//! (`unstack`, `stack`, `gather`, `scatter`, `concat`, `split`) and what the gradients of
//! the element ops emit. The list value and the element ops are in [`super::list`].
//!
//! Cutting a tensor into elements shares its buffer; stacking or concatenating copies once
//! into the output. An unset element stacks as zeros of the element shape, which must then be
//! known (from the list, the op's `element_shape` input, or the list's set elements).

use super::list::{
    check_dtype, element_shape_from_input, list_input, merge_set_shapes, shape_from_tensor, Attrs,
    ListOp, TensorList,
};
use super::{input, int_values, rows};
use crate::error::Result;
use crate::kernels::{KernelFactory, OpContext};
use crate::tensor::{PartialShape, Shape, Tensor};

/// Returns the factory for a TensorList op that converts to or from a tensor.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "TensorListFromTensor" => |n| ListOp::build(n, from_tensor),
        "TensorListStack" => |n| ListOp::build(n, stack),
        "TensorListGather" => |n| ListOp::build(n, gather),
        "TensorListScatter" | "TensorListScatterV2" => |n| ListOp::build(n, scatter),
        "TensorListScatterIntoExistingList" => |n| ListOp::build(n, scatter_into),
        "TensorListConcat" | "TensorListConcatV2" => |n| ListOp::build(n, concat),
        "TensorListSplit" => |n| ListOp::build(n, split),
        _ => return None,
    };
    Some(factory)
}

/// The dimensions after the first of `t`, which must have at least one.
fn rows_of(ctx: &OpContext<'_>, t: &Tensor) -> Result<Shape> {
    match t.dims().split_first() {
        Some((_, rest)) => Ok(Shape::new(rest.to_vec())),
        None => Err(ctx.invalid(format!(
            "Tensor must be at least a vector, but saw shape: {}",
            t.shape()
        ))),
    }
}

/// Stacks the elements at `indices` of `list`, unset ones as zeros of `shape`.
fn stack_elements(
    ctx: &OpContext<'_>,
    list: &TensorList,
    indices: &[usize],
    shape: &Shape,
) -> Result<Tensor> {
    let mut dims = vec![indices.len()];
    dims.extend_from_slice(shape.dims());
    super::checked_elements(ctx, &dims)?;
    let named = |e| ctx.named(e);
    let needs_zeros = indices.iter().any(|&i| list.tensors[i].is_none());
    let zeros = if needs_zeros {
        Some(rows::zeros(list.element_dtype, shape).map_err(named)?)
    } else {
        None
    };
    let parts: Vec<&Tensor> = indices
        .iter()
        .map(|&i| {
            list.tensors[i]
                .as_ref()
                .unwrap_or_else(|| zeros.as_ref().expect("zeros made for unset elements"))
        })
        .collect();
    rows::stack(list.element_dtype, &parts, shape).map_err(named)
}

/// TensorListFromTensor(tensor, element_shape) -> output_handle: one element per row.
fn from_tensor(ctx: &mut OpContext<'_>, _: &Attrs) -> Result<()> {
    let shape = shape_from_tensor(ctx, ctx.input(1)?)?;
    let t = input(ctx, 0)?;
    let row = rows_of(ctx, &t)?;
    if !shape.is_compatible_with(&row) {
        return Err(ctx.invalid(format!(
            "Specified a list with shape {shape} from a tensor with shape {row}"
        )));
    }
    rows::check_slots("TensorList", t.dims()[0]).map_err(|e| ctx.named(e))?;
    let mut list = TensorList::new(t.dtype(), shape);
    list.tensors = rows::unstack(&t)
        .map_err(|e| ctx.named(e))?
        .into_iter()
        .map(Some)
        .collect();
    ctx.set_output(0, list.into_tensor());
    Ok(())
}

/// TensorListStack(input_handle, element_shape) -> tensor: every element, stacked.
fn stack(ctx: &mut OpContext<'_>, a: &Attrs) -> Result<()> {
    let list = list_input(ctx, 0)?;
    check_dtype(ctx, a, &list)?;
    let len = list.tensors.len();
    if a.num_elements != -1 && len as i64 != a.num_elements {
        return Err(ctx.invalid(format!(
            "Operation expected a list with {} elements but got a list with {len} elements.",
            a.num_elements
        )));
    }
    let shape = element_shape_from_input(ctx, &list, 1)?;
    if !shape.is_fully_defined() && len == 0 {
        return Err(ctx.invalid(format!(
            "Tried to stack elements of an empty list with non-fully-defined element_shape: \
             {shape}"
        )));
    }
    let shape = merge_set_shapes(ctx, shape, &list.tensors)?;
    let Some(shape) = shape.to_shape() else {
        return Err(ctx.invalid(format!(
            "Tried to stack list which only contains uninitialized tensors and has a \
             non-fully-defined element_shape: {shape}"
        )));
    };
    let all: Vec<usize> = (0..len).collect();
    let out = stack_elements(ctx, &list, &all, &shape)?;
    ctx.set_output(0, out);
    Ok(())
}

/// TensorListGather(input_handle, indices, element_shape) -> values: the elements at
/// `indices`, stacked.
fn gather(ctx: &mut OpContext<'_>, a: &Attrs) -> Result<()> {
    let list = list_input(ctx, 0)?;
    check_dtype(ctx, a, &list)?;
    let indices = int_values(ctx, ctx.input(1)?, "indices")?;
    let shape = element_shape_from_input(ctx, &list, 2)?;
    if !shape.is_fully_defined() && indices.is_empty() {
        return Err(ctx.invalid(format!(
            "Tried to gather 0-elements from a list with non-fully-defined shape: {shape}"
        )));
    }
    let len = list.tensors.len();
    let indices = indices
        .iter()
        .map(|&i| {
            usize::try_from(i).ok().filter(|&i| i < len).ok_or_else(|| {
                ctx.invalid(format!(
                    "Index {i} out of range; list only has {len} elements."
                ))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let shape = merge_set_shapes(ctx, shape, indices.iter().map(|&i| &list.tensors[i]))?;
    let Some(shape) = shape.to_shape() else {
        return Err(ctx.invalid(format!(
            "Tried to gather uninitialized tensors from a list with non-fully-defined \
             element_shape: {shape}"
        )));
    };
    let out = stack_elements(ctx, &list, &indices, &shape)?;
    ctx.set_output(0, out);
    Ok(())
}

/// Reads the `indices` input of a scatter: one non-negative index per row of `t`.
fn scatter_indices(
    ctx: &OpContext<'_>,
    i: usize,
    t: &Tensor,
    v2_message: bool,
) -> Result<Vec<usize>> {
    let indices = ctx.input(i)?;
    let values = int_values(ctx, indices, "indices")?;
    let rows = t.dims()[0];
    if values.len() != rows {
        return Err(ctx.invalid(if v2_message {
            format!(
                "Expected len(indices) == tensor.shape[0], but saw: {} vs. {rows}",
                values.len()
            )
        } else {
            format!(
                "Invalid number of rows in input tensor. Expected: {} Actual: {rows}",
                values.len()
            )
        }));
    }
    values
        .iter()
        .map(|&v| {
            usize::try_from(v)
                .map_err(|_| ctx.invalid("Indices in TensorListScatter must all be non-negative."))
        })
        .collect()
}

/// Puts row `k` of `t` at `indices[k]` of `list` (later rows win on a repeated index).
fn scatter_rows(
    ctx: &OpContext<'_>,
    list: &mut TensorList,
    t: &Tensor,
    indices: &[usize],
) -> Result<()> {
    let needed = indices.iter().map(|&i| i + 1).max().unwrap_or(0);
    if needed > list.tensors.len() {
        rows::check_slots("TensorList", needed).map_err(|e| ctx.named(e))?;
        list.tensors.resize(needed, None);
    }
    for (row, &i) in rows::unstack(t)
        .map_err(|e| ctx.named(e))?
        .into_iter()
        .zip(indices)
    {
        list.tensors[i] = Some(row);
    }
    Ok(())
}

/// TensorListScatter(tensor, indices, element_shape) and TensorListScatterV2(tensor,
/// indices, element_shape, num_elements) -> output_handle: a new list holding row `k` of
/// `tensor` at `indices[k]`, at least `num_elements` long.
fn scatter(ctx: &mut OpContext<'_>, _: &Attrs) -> Result<()> {
    let shape = shape_from_tensor(ctx, ctx.input(2)?)?;
    let num_elements = if ctx.num_inputs() >= 4 {
        super::int_scalar(ctx, ctx.input(3)?, "num_elements")?
    } else {
        -1
    };
    if num_elements < -1 {
        return Err(ctx.invalid(format!(
            "TensorListScatter expects num_elements >= -1, found: {num_elements}"
        )));
    }
    let t = input(ctx, 0)?;
    let row = rows_of(ctx, &t)?;
    if !shape.is_compatible_with(&row) {
        return Err(ctx.invalid(format!(
            "Specified a list with shape {shape} from a tensor with shape {row}"
        )));
    }
    let indices = scatter_indices(ctx, 1, &t, false)?;
    if let Some(&i) = indices
        .iter()
        .find(|&&i| num_elements != -1 && i as i64 >= num_elements)
    {
        return Err(ctx.invalid(format!(
            "TensorListScatter: Trying to scatter at index {i} in list with size {num_elements}"
        )));
    }
    let mut list = TensorList::new(t.dtype(), shape);
    let len = num_elements.max(0) as usize;
    rows::check_slots("TensorList", len).map_err(|e| ctx.named(e))?;
    list.tensors = vec![None; len];
    scatter_rows(ctx, &mut list, &t, &indices)?;
    ctx.set_output(0, list.into_tensor());
    Ok(())
}

/// TensorListScatterIntoExistingList(input_handle, tensor, indices) -> output_handle: the
/// list with row `k` of `tensor` at `indices[k]`, grown to fit the largest index.
fn scatter_into(ctx: &mut OpContext<'_>, _: &Attrs) -> Result<()> {
    let list = list_input(ctx, 0)?;
    let t = input(ctx, 1)?;
    if t.dtype() != list.element_dtype {
        return Err(ctx.invalid(format!(
            "Invalid data types; input tensor type: {} list element_type: {}",
            super::array::tf_dtype_name(t.dtype()),
            super::array::tf_dtype_name(list.element_dtype)
        )));
    }
    let row = rows_of(ctx, &t)?;
    let indices_t = ctx.input(2)?;
    if indices_t.rank() != 1 {
        return Err(ctx.invalid(format!(
            "Expected indices to be a vector, but received shape: {}",
            indices_t.shape()
        )));
    }
    if !list.element_shape.is_compatible_with(&row) {
        return Err(ctx.invalid(format!(
            "Tried to scatter tensors of shape {row} into a list of element shape {}",
            list.element_shape
        )));
    }
    let indices = scatter_indices(ctx, 2, &t, true)?;
    let mut out = (*list).clone();
    scatter_rows(ctx, &mut out, &t, &indices)?;
    ctx.set_output(0, out.into_tensor());
    Ok(())
}

/// TensorListConcat(input_handle) and TensorListConcatV2(input_handle, element_shape,
/// leading_dims) -> (tensor, lengths): the elements joined along dimension 0, and each one's
/// length there. An unset element joins as zeros whose length is its entry of
/// `leading_dims`, else the length every set element shares.
fn concat(ctx: &mut OpContext<'_>, a: &Attrs) -> Result<()> {
    let list = list_input(ctx, 0)?;
    check_dtype(ctx, a, &list)?;
    let v2 = ctx.num_inputs() > 1;
    let element_shape = if v2 {
        element_shape_from_input(ctx, &list, 1)?
    } else {
        a.element_shape
            .merge_with(&list.element_shape)
            .map_err(|e| ctx.named(e))?
    };
    if element_shape.rank() == Some(0) {
        return Err(
            ctx.invalid("Concat requires elements to be at least vectors, found scalars instead.")
        );
    }
    let (first_dim, mut rest) = match element_shape.dims() {
        Some(d) => (d[0], PartialShape::new(d[1..].to_vec())),
        None => (None, PartialShape::unknown()),
    };
    if list.tensors.is_empty() && !rest.is_fully_defined() {
        return Err(ctx.invalid(format!(
            "All except the first dimension must be fully defined when concating an empty \
             tensor list. element_shape: {rest}"
        )));
    }
    // The set elements must agree past dimension 0 (and on it, when the op says its size);
    // when they all share dimension 0 too, unset elements take that length.
    let mut shared_first: Option<Option<usize>> = first_dim.map(Some);
    for (i, t) in list.tensors.iter().enumerate() {
        let Some(t) = t else { continue };
        let Some((&d0, tail)) = t.dims().split_first() else {
            return Err(ctx.invalid(format!(
                "Concat saw a scalar shape at index {i} but requires at least vectors."
            )));
        };
        rest = rest
            .merge_with(&PartialShape::from(Shape::new(tail.to_vec())))
            .map_err(|e| ctx.named(e))?;
        if let Some(f) = first_dim {
            if f != d0 {
                return Err(ctx.invalid(format!(
                    "First entry of element_shape input does not match the first dim of list \
                     element at index: {i} Expected: {f} Actual: {d0}"
                )));
            }
        }
        shared_first = match shared_first {
            None => Some(Some(d0)),
            Some(Some(s)) if s == d0 => Some(Some(s)),
            Some(_) => Some(None),
        };
    }
    let inferred_first = shared_first.flatten();
    let Some(rest) = rest.to_shape() else {
        return Err(ctx.invalid(format!(
            "Trying to concat list with only uninitialized tensors but \
             element_shape_except_first_dim_ is not fully defined: {rest}"
        )));
    };
    let leading = if v2 {
        int_values(ctx, ctx.input(2)?, "leading_dims")?
    } else {
        Vec::new()
    };
    let mut lengths = Vec::with_capacity(list.tensors.len());
    for (i, t) in list.tensors.iter().enumerate() {
        let len = match (t, leading.get(i), inferred_first) {
            (Some(t), _, _) => t.dims()[0],
            (None, None, Some(f)) => f,
            (None, _, _) if !v2 => {
                return Err(ctx.invalid(
                    "Concating lists with uninitialized tensors is not supported in this \
                     version of TensorListConcat. Consider updating your GraphDef to run the \
                     newer version.",
                ))
            }
            (None, None, None) => {
                return Err(ctx.invalid(format!(
                    "List contains uninitialized tensor at index {i} but leading_dims has only \
                     {} elements.",
                    leading.len()
                )))
            }
            (None, Some(&l), _) => usize::try_from(l)
                .map_err(|_| ctx.invalid(format!("leading_dims[{i}] is negative: {l}")))?,
        };
        lengths.push(len);
    }
    let total = lengths
        .iter()
        .try_fold(0usize, |t, &l| t.checked_add(l))
        .ok_or_else(|| ctx.invalid("the lengths of the elements add up past what fits"))?;
    let mut dims = vec![total];
    dims.extend_from_slice(rest.dims());
    super::checked_elements(ctx, &dims)?;
    let named = |e| ctx.named(e);
    let mut zeros = Vec::new();
    for (t, &len) in list.tensors.iter().zip(&lengths) {
        if t.is_none() {
            let mut zdims = vec![len];
            zdims.extend_from_slice(rest.dims());
            zeros.push(rows::zeros(list.element_dtype, &Shape::new(zdims)).map_err(named)?);
        }
    }
    let mut zeros = zeros.iter();
    let parts: Vec<&Tensor> = list
        .tensors
        .iter()
        .map(|t| match t {
            Some(t) => t,
            None => zeros.next().expect("one zeros tensor per unset element"),
        })
        .collect();
    let out = rows::join(list.element_dtype, &parts, Shape::new(dims)).map_err(named)?;
    let lengths: Vec<i64> = lengths.iter().map(|&l| l as i64).collect();
    ctx.set_output(0, out);
    ctx.set_output(1, Tensor::from_vec([lengths.len()], lengths)?);
    Ok(())
}

/// TensorListSplit(tensor, element_shape, lengths) -> output_handle: `tensor` cut along
/// dimension 0 into elements of `lengths`.
fn split(ctx: &mut OpContext<'_>, _: &Attrs) -> Result<()> {
    let shape = shape_from_tensor(ctx, ctx.input(1)?)?;
    if shape.rank() == Some(0) {
        return Err(ctx.invalid(format!(
            "TensorListSplit requires element_shape to be at least of rank 1, but saw: {shape}"
        )));
    }
    let t = input(ctx, 0)?;
    let row = rows_of(ctx, &t)?;
    let shape_rest = match shape.dims() {
        Some(d) => PartialShape::new(d[1..].to_vec()),
        None => PartialShape::unknown(),
    };
    if !shape_rest.is_compatible_with(&row) {
        return Err(ctx.invalid(format!(
            "tensor shape {} is not compatible with element_shape {shape}",
            t.shape()
        )));
    }
    let lengths_t = ctx.input(2)?;
    if lengths_t.rank() != 1 {
        return Err(ctx.invalid(format!(
            "Expected lengths to be a vector, received shape: {}",
            lengths_t.shape()
        )));
    }
    let lengths = int_values(ctx, lengths_t, "lengths")?;
    rows::check_slots("TensorList", lengths.len()).map_err(|e| ctx.named(e))?;
    let n = t.dims()[0];
    let mut list = TensorList::new(t.dtype(), shape);
    let mut start = 0usize;
    for &len in &lengths {
        let len = usize::try_from(len)
            .map_err(|_| ctx.invalid(format!("Invalid value in lengths: {len}")))?;
        let end = start.saturating_add(len);
        if end > n {
            return Err(ctx.invalid(format!(
                "Attempting to slice [{start}, {end}] from tensor with length {n}"
            )));
        }
        list.tensors.push(Some(
            rows::slice_rows(&t, start, end).map_err(|e| ctx.named(e))?,
        ));
        start = end;
    }
    if start != n {
        return Err(ctx.invalid(format!(
            "Unused values in tensor. Length of tensor: {n} Values used: {start}"
        )));
    }
    ctx.set_output(0, list.into_tensor());
    Ok(())
}
