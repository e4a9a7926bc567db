//! Gradients of gathers, segment reductions, partitions and stitches (TensorFlow's
//! `_GatherV2Grad` and `ResourceGather`'s in `array_grad.py` / `resource_variable_ops.py`, the
//! segment gradients of `math_grad.py`, those of `data_flow_grad.py`).
//!
//! TensorFlow returns the gradient of an axis-0 gather as `IndexedSlices` (the gathered rows'
//! gradients and their indices); the builder's gradients are dense tensors, so these return
//! what TensorFlow makes of those slices when it needs a tensor: their `UnsortedSegmentSum`
//! into the params' rows. The values are the same, repeated indices summed.

use super::const_ints;
use crate::error::Result;
use crate::graph::attr;
use crate::graph::builder::{Graph, NodeSpec, Output};
use crate::graph::gradients::GradCtx;
use crate::tensor::DType;

type Grads = Result<Vec<Option<Output>>>;

/// Elements `from..to` of a 1-D int32 tensor (a shape), as a 1-D tensor.
fn dims(g: &mut Graph, shape: &Output, from: usize, to: usize) -> Result<Output> {
    let b = g.const_vec_i32("Const", &[from as i64])?;
    let s = g.const_vec_i32("Const", &[to as i64 - from as i64])?;
    g.slice(shape, &b, &s)
}

/// A scalar int32 constant.
fn int(g: &mut Graph, v: i32) -> Result<Output> {
    g.const_i32("Const", &[], &[v])
}

/// `ConcatV2(parts, 0)` of 1-D int32 tensors.
fn join(g: &mut Graph, parts: &[Output]) -> Result<Output> {
    g.concat(parts, 0)
}

fn as_i32(g: &mut Graph, t: &Output) -> Result<Output> {
    if t.dtype == DType::Int32 {
        Ok(t.clone())
    } else {
        g.cast(t, DType::Int32)
    }
}

/// The dense gradient of a gather of `params` (shape `ps`, an int32 vector, of rank `rank`)
/// along `axis` with `batch_dims` at `indices`: TensorFlow's `_GatherV2Grad` with the
/// `IndexedSlices` of the axis-0 case summed into rows. The axis is moved next to the batch
/// dimensions, the gradient's rows are summed into the params' rows with
/// `UnsortedSegmentSum` (batch `i`'s indices offset by `i` times the axis' size), and the
/// axis is moved back.
fn gather_grad(
    g: &mut Graph,
    grad: &Output,
    ps: &Output,
    rank: usize,
    indices: &Output,
    axis: usize,
    batch_dims: usize,
) -> Result<Output> {
    let b = batch_dims;
    let outer = dims(g, ps, 0, axis)?;
    let inner = dims(g, ps, axis + 1, rank)?;
    let minus_one = g.const_vec_i32("Const", &[-1])?;
    let values_shape = join(g, &[outer, minus_one.clone(), inner.clone()])?;
    let mut values = g.reshape(grad, &values_shape)?;
    // The permutation that moves the axis to position `batch_dims`.
    let perm: Vec<i64> = (0..b)
        .chain([axis])
        .chain(b..axis)
        .chain(axis + 1..rank)
        .map(|d| d as i64)
        .collect();
    if axis != b {
        values = g.transpose(&values, &perm)?;
    }
    let n_axis = dims(g, ps, axis, axis + 1)?;
    let n = g.reshape_to(&n_axis, &[])?;
    let summed = if b == 0 {
        let flat = g.reshape_to(indices, &[-1])?;
        g.unsorted_segment_sum(&values, &flat, &n)?
    } else {
        let batch_shape = dims(g, ps, 0, b)?;
        let mid = dims(g, ps, b, axis)?;
        let batch = g.reduce_axes("Prod", &batch_shape, &[0], false)?;
        let idx = as_i32(g, indices)?;
        let batch1 = g.reshape_to(&batch, &[1])?;
        let by_batch_shape = join(g, &[batch1, minus_one.clone()])?;
        let by_batch = g.reshape(&idx, &by_batch_shape)?;
        let (zero, one) = (int(g, 0)?, int(g, 1)?);
        let batches = g.range(&zero, &batch, &one)?;
        let offsets = g.mul(&batches, &n)?;
        let offsets = g.reshape_to(&offsets, &[-1, 1])?;
        let shifted = g.add(&by_batch, &offsets)?;
        let flat = g.reshape_to(&shifted, &[-1])?;
        let flat_shape = join(g, &[minus_one, mid.clone(), inner.clone()])?;
        let flat_values = g.reshape(&values, &flat_shape)?;
        let rows = g.mul(&batch, &n)?;
        let s = g.unsorted_segment_sum(&flat_values, &flat, &rows)?;
        let out_shape = join(g, &[batch_shape, n_axis, mid, inner])?;
        g.reshape(&s, &out_shape)?
    };
    let out = if axis != b {
        let mut inverse = vec![0i64; rank];
        for (i, &p) in perm.iter().enumerate() {
            inverse[p as usize] = i as i64;
        }
        g.transpose(&summed, &inverse)?
    } else {
        summed
    };
    g.reshape(&out, ps)
}

/// Maps a possibly negative `batch_dims` onto `[0, rank(indices)]` as `_GatherV2Grad` does.
fn batch_dims_of(c: &GradCtx, indices: &Output) -> Result<usize> {
    let b = attr::int_or(&c.node, "batch_dims", 0)?;
    let b = if b < 0 {
        let r = indices.shape.rank().ok_or_else(|| {
            c.err(
                "batch_dims < 0 needs indices of known rank for the gradient; pass a \
                 non-negative batch_dims",
            )
        })?;
        b + r as i64
    } else {
        b
    };
    usize::try_from(b).map_err(|_| c.err(format!("batch_dims {b} is out of range")))
}

/// `GatherV2`: the dense gradient of any axis and `batch_dims`: the gradient's rows summed into
/// the params' rows by `UnsortedSegmentSum`, the axis moved next to the batch dimensions and
/// back.
pub fn gather_v2(g: &mut Graph, c: &GradCtx) -> Grads {
    let (params, indices) = (c.input(0)?.clone(), c.input(1)?.clone());
    let rank = params
        .shape
        .rank()
        .ok_or_else(|| c.err("the params' rank must be known for the gradient"))?;
    let axis = const_ints(g, &c.inputs[2])
        .and_then(|v| v.first().copied())
        .ok_or_else(|| c.err("the axis must be a constant for the gradient"))?;
    let r = rank as i64;
    if axis < -r || axis >= r {
        return Err(c.err(format!(
            "axis {axis} is out of range for params of rank {rank}"
        )));
    }
    let axis = if axis < 0 { axis + r } else { axis } as usize;
    let b = batch_dims_of(c, &indices)?;
    if b > axis {
        return Err(c.err(format!(
            "batch_dims ({b}) must be less than or equal to axis ({axis})"
        )));
    }
    let ps = g.shape_of(&params)?;
    let ps = as_i32(g, &ps)?;
    let out = gather_grad(g, c.grad(0)?, &ps, rank, &indices, axis, b)?;
    Ok(vec![Some(out), None, None])
}

/// `ResourceGather`: the gradient of the variable (its handle), dense, from `VariableShape`.
pub fn resource_gather(g: &mut Graph, c: &GradCtx) -> Grads {
    let (handle, indices) = (c.input(0)?.clone(), c.input(1)?.clone());
    let b = batch_dims_of(c, &indices)?;
    let rank = g
        .meta_of(&handle)
        .and_then(|m| m.handle_shape.as_ref()?.rank())
        .or_else(|| {
            let out = c.outputs.first()?.shape.rank()?;
            Some(out + b + 1 - indices.shape.rank()?)
        })
        .ok_or_else(|| c.err("the variable's rank must be known for the gradient"))?;
    let ps = g.variable_shape(&handle)?;
    let out = gather_grad(g, c.grad(0)?, &ps, rank, &indices, b, b)?;
    Ok(vec![Some(out), None])
}

/// TensorFlow's `_GatherDropNegatives`: `params` gathered at the non-negative `ids`, zeros
/// where an id is negative. Returns the gathered values and the (broadcastable) mask of
/// non-negative ids.
fn gather_drop_negatives(
    g: &mut Graph,
    params: &Output,
    ids: &Output,
    data: &Output,
) -> Result<(Output, Output)> {
    let zeros = g.zeros_like(ids)?;
    let clipped = g.binary("Maximum", ids, &zeros)?;
    let gathered = g.gather(params, &clipped, 0)?;
    let zero = g.zeros_like(ids)?;
    let positive = g.binary("GreaterEqual", ids, &zero)?;
    // The mask gets trailing 1 dims so that it broadcasts over each id's row.
    let ids_shape = g.shape(ids)?;
    let extra = {
        let rd = g.unary("Rank", data)?;
        let ri = g.unary("Rank", ids)?;
        let k = g.sub(&rd, &ri)?;
        let k1 = g.reshape_to(&k, &[1])?;
        let one = int(g, 1)?;
        g.fill(&k1, &one)?
    };
    let mask_shape = join(g, &[ids_shape, extra])?;
    let positive = g.reshape(&positive, &mask_shape)?;
    let zeros = g.zeros_like(&gathered)?;
    let kept = g.select(&positive, &gathered, &zeros, true)?;
    Ok((kept, positive))
}

/// `UnsortedSegment{Sum,Max,Min,Prod}` (TensorFlow's `_UnsortedSegment*Grad`).
pub fn unsorted_segment(g: &mut Graph, c: &GradCtx) -> Grads {
    let (data, ids, num) = (
        c.input(0)?.clone(),
        c.input(1)?.clone(),
        c.input(2)?.clone(),
    );
    let grad = c.grad(0)?.clone();
    let dx = match c.node.op.as_str() {
        "UnsortedSegmentSum" => gather_drop_negatives(g, &grad, &ids, &data)?.0,
        "UnsortedSegmentProd" => {
            let zero = g.zeros_like(&data)?;
            let is_zero = g.binary("Equal", &data, &zero)?;
            let zeros_i = g.cast(&is_zero, DType::Int32)?;
            let num_zeros = g.unsorted_segment_sum(&zeros_i, &ids, &num)?;
            let one = int(g, 1)?;
            let many = g.binary("Greater", &num_zeros, &one)?;
            let grad_zeros = g.zeros_like(&grad)?;
            let grad = g.select(&many, &grad_zeros, &grad, true)?;
            let ones = g.ones_like(&data)?;
            let non_zero = g.select(&is_zero, &ones, &data, true)?;
            let non_zero_prod = g.unsorted_segment("UnsortedSegmentProd", &non_zero, &ids, &num)?;
            let ids_zero = g.zeros_like(&ids)?;
            let clipped = g.binary("Maximum", &ids, &ids_zero)?;
            let gathered_prod = g.gather(c.output(0)?, &clipped, 0)?;
            let gathered_non_zero = g.gather(&non_zero_prod, &clipped, 0)?;
            let divided = g.div(&gathered_prod, &data)?;
            let partial = g.select(&is_zero, &gathered_non_zero, &divided, true)?;
            let gathered_grad = gather_drop_negatives(g, &grad, &ids, &data)?.0;
            g.mul(&gathered_grad, &partial)?
        }
        _ => {
            // Max and Min: the gradient is shared evenly among the elements that reached the
            // segment's output.
            let (gathered_out, positive) = gather_drop_negatives(g, c.output(0)?, &ids, &data)?;
            let equal = g.binary("Equal", &data, &gathered_out)?;
            let selected = g.binary("LogicalAnd", &equal, &positive)?;
            let selected_t = g.cast(&selected, grad.dtype)?;
            let num_selected = g.unsorted_segment_sum(&selected_t, &ids, &num)?;
            let weighted = g.div(&grad, &num_selected)?;
            let gathered = gather_drop_negatives(g, &weighted, &ids, &data)?.0;
            let zeros = g.zeros_like(&gathered)?;
            g.select(&selected, &gathered, &zeros, true)?
        }
    };
    Ok(vec![Some(dx), None, None])
}

/// `Segment{Sum,Mean,Max,Min,Prod}` (TensorFlow's `_Segment*Grad`).
pub fn segment(g: &mut Graph, c: &GradCtx) -> Grads {
    let (data, ids) = (c.input(0)?.clone(), c.input(1)?.clone());
    let grad = c.grad(0)?.clone();
    let dx = match c.node.op.as_str() {
        "SegmentSum" => g.gather(&grad, &ids, 0)?,
        "SegmentMean" => {
            let ids_shape = g.shape(&ids)?;
            let rest = {
                let rd = g.unary("Rank", &data)?;
                let one = int(g, 1)?;
                let k = g.sub(&rd, &one)?;
                let k1 = g.reshape_to(&k, &[1])?;
                g.fill(&k1, &one)?
            };
            let ones_shape = join(g, &[ids_shape, rest])?;
            let one = g.scalar("Const", grad.dtype, 1.0)?;
            let ones = g.fill(&ones_shape, &one)?;
            let counts = g.segment("SegmentSum", &ones, &ids)?;
            let scaled = g.div(&grad, &counts)?;
            g.gather(&scaled, &ids, 0)?
        }
        "SegmentProd" => {
            let zero = g.zeros_like(&data)?;
            let is_zero = g.binary("Equal", &data, &zero)?;
            let zeros_i = g.cast(&is_zero, DType::Int32)?;
            let num_zeros = g.segment("SegmentSum", &zeros_i, &ids)?;
            let one = int(g, 1)?;
            let many = g.binary("Greater", &num_zeros, &one)?;
            let grad_zeros = g.zeros_like(&grad)?;
            let grad = g.select(&many, &grad_zeros, &grad, true)?;
            let ones = g.ones_like(&data)?;
            let non_zero = g.select(&is_zero, &ones, &data, true)?;
            let non_zero_prod = g.segment("SegmentProd", &non_zero, &ids)?;
            let gathered_prod = g.gather(c.output(0)?, &ids, 0)?;
            let gathered_non_zero = g.gather(&non_zero_prod, &ids, 0)?;
            let divided = g.div(&gathered_prod, &non_zero)?;
            let partial = g.select(&is_zero, &gathered_non_zero, &divided, true)?;
            let gathered_grad = g.gather(&grad, &ids, 0)?;
            g.mul(&gathered_grad, &partial)?
        }
        _ => {
            let zeros = g.zeros_like(&data)?;
            let gathered_out = g.gather(c.output(0)?, &ids, 0)?;
            let selected = g.binary("Equal", &data, &gathered_out)?;
            let selected_t = g.cast(&selected, grad.dtype)?;
            let num_selected = g.segment("SegmentSum", &selected_t, &ids)?;
            let weighted = g.div(&grad, &num_selected)?;
            let gathered = g.gather(&weighted, &ids, 0)?;
            g.select(&selected, &gathered, &zeros, true)?
        }
    };
    Ok(vec![Some(dx), None])
}

/// `SparseSegment{Sum,Mean,SqrtN}[WithNumSegments]`: `SparseSegment*Grad` into the data's
/// rows. With `sparse_gradient` TensorFlow returns the `V2` op's touched rows as
/// `IndexedSlices`; densified, that is the same tensor, so the dense op serves both.
pub fn sparse_segment(g: &mut Graph, c: &GradCtx) -> Grads {
    let (data, indices, ids) = (
        c.input(0)?.clone(),
        c.input(1)?.clone(),
        c.input(2)?.clone(),
    );
    let base = c.node.op.trim_end_matches("WithNumSegments");
    let shape = g.shape_of(&data)?;
    let shape = as_i32(g, &shape)?;
    let zero = g.const_i32("Const", &[], &[0])?;
    let dim0 = g.gather(&shape, &zero, 0)?;
    let dx = g.add1(
        NodeSpec::new(&format!("{base}Grad"))
            .input(c.grad(0)?)
            .input(&indices)
            .input(&ids)
            .input(&dim0),
    )?;
    let mut out = vec![Some(dx), None, None];
    out.resize(c.inputs.len(), None);
    Ok(out)
}

/// `DynamicPartition`: the partitions' gradients stitched back into the data's places.
pub fn dynamic_partition(g: &mut Graph, c: &GradCtx) -> Grads {
    let (data, partitions) = (c.input(0)?.clone(), c.input(1)?.clone());
    let num = c.outputs.len();
    let prefix = g.shape(&partitions)?;
    let count = g.reduce_axes("Prod", &prefix, &[0], false)?;
    let (zero, one) = (int(g, 0)?, int(g, 1)?);
    let positions = g.range(&zero, &count, &one)?;
    let original = g.reshape(&positions, &prefix)?;
    let parts = g.dynamic_partition(&original, &partitions, num)?;
    let grads = c
        .grads
        .iter()
        .enumerate()
        .map(|(i, grad)| match grad {
            Some(grad) => Ok(grad.clone()),
            None => g.zeros_like(c.output(i)?),
        })
        .collect::<Result<Vec<_>>>()?;
    let stitched = g.dynamic_stitch(&parts, &grads, true)?;
    let shape = g.shape(&data)?;
    Ok(vec![Some(g.reshape(&stitched, &shape)?), None])
}

/// `DynamicStitch` / `ParallelDynamicStitch`: each data input gets the merged gradient's
/// rows at its indices.
pub fn dynamic_stitch(g: &mut Graph, c: &GradCtx) -> Grads {
    let n = c.inputs.len() / 2;
    let grad = c.grad(0)?.clone();
    let mut out = vec![None; n];
    for i in 0..n {
        let indices = as_i32(g, &c.inputs[i])?;
        out.push(Some(g.gather(&grad, &indices, 0)?));
    }
    Ok(out)
}
