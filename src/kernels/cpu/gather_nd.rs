//! `GatherNd` and `ScatterNd`: slices of a tensor picked by n-dimensional indices, and their
//! sum into a fresh zero tensor of a given shape.
//!
//! Each row of `indices` (its last dimension, `nd` long) indexes the first `nd` dimensions of
//! the bigger tensor and names a slice of the rest. The indices are checked and turned into
//! slice offsets first, in one pass; `GatherNd` then copies a slice per row, the rows of its
//! output split over the intra-op pool (a slice copy, a `memcpy` for the fixed-size dtypes);
//! `ScatterNd` adds each update's slice onto its place in one pass, as TensorFlow's CPU kernel
//! does (repeated indices add up, so its rows cannot be split), a plain loop over two slices
//! with no bounds checks inside, which the compiler can vectorize.
//!
//! The checks, their order and their messages are TensorFlow 2.21's (`gather_nd_op.cc`,
//! `scatter_nd_op.cc`), down to the index depths its kernels take (7) and the bad index they
//! name: the last one, as its single-threaded loop leaves it. Where TensorFlow's kernel aborts
//! the process (a `ScatterNd` whose updates have fewer dimensions than the indices' outer
//! ones), tessera answers INVALID_ARGUMENT. The output's size goes through the memory budget
//! before it is allocated.

use std::sync::Arc;

use super::numeric::Real;
use super::{checked_elements, input, int_values, Items};
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, Shape, Tensor};

/// Returns the factory for an n-dimensional gather or scatter.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "GatherNd" => |node| Ok(Arc::new(GatherNd(Policy::of(node)?))),
        "ScatterNd" => |node| Ok(Arc::new(ScatterNd(Policy::of(node)?))),
        _ => return None,
    };
    Some(factory)
}

/// The deepest index rows TensorFlow's kernels take (`indices.shape[-1]`).
const MAX_INDEX_DEPTH: usize = 7;

/// What a kernel does with an index outside the tensor (`bad_indices_policy`).
#[derive(Clone, Copy, PartialEq)]
enum Policy {
    /// Fail naming the index: the CPU's default, and `ERROR`.
    Error,
    /// Skip it: a gather reads zeros, a scatter drops the update.
    Ignore,
}

impl Policy {
    fn of(node: &NodeDef) -> Result<Policy> {
        match attr::string_or(node, "bad_indices_policy", "")?.as_str() {
            "" | "DEFAULT" | "ERROR" => Ok(Policy::Error),
            "IGNORE" => Ok(Policy::Ignore),
            other => Err(Status::invalid_argument(format!(
                "node `{}` (op {}): bad_indices_policy `{other}` is not one of DEFAULT, ERROR, \
                 IGNORE",
                node.name, node.op
            ))),
        }
    }
}

/// Reads a shape from int values as TensorFlow's `TensorShapeUtils::MakeShape` does: every
/// dimension non-negative, the element count within `i64`.
pub(super) fn make_shape(ctx: &OpContext<'_>, values: &[i64]) -> Result<Vec<usize>> {
    let mut count = 1i64;
    let mut dims = Vec::with_capacity(values.len());
    for &d in values {
        if d < 0 {
            return Err(ctx.invalid(format!("Dimension {d} must be >= 0")));
        }
        count = count.checked_mul(d).ok_or_else(|| {
            ctx.invalid(format!(
                "Shape {} would have more than 2**63 - 1 elements",
                Shape::new(values.iter().map(|&d| d as usize).collect::<Vec<_>>())
            ))
        })?;
        dims.push(d as usize);
    }
    Ok(dims)
}

/// Checks that an output of `dims` and `dtype` may be allocated: at most 2^32 elements and
/// room in the device's memory budget for its bytes. Returns its element count.
fn admit(ctx: &OpContext<'_>, dims: &[usize], dtype: DType) -> Result<usize> {
    let n = checked_elements(ctx, dims)?;
    if let Some(size) = dtype.size().filter(|&s| s > 4) {
        ctx.check_fits((n as u64).saturating_mul(size as u64))?;
    }
    Ok(n)
}

/// Position `flat` of a tensor of `dims` as TensorFlow's `SliceDebugString` writes it: nothing
/// for a scalar, `[3]` for a vector, `[1,2]` above.
fn slice_debug(dims: &[usize], flat: usize) -> String {
    match dims.len() {
        0 => String::new(),
        1 => format!("[{flat}]"),
        _ => format!("[{}]", super::slicing::unravel(flat, dims)),
    }
}

/// An index row as TensorFlow prints it: `[1, 2]`.
fn row_debug(row: &[i64]) -> String {
    let parts: Vec<String> = row.iter().map(i64::to_string).collect();
    format!("[{}]", parts.join(", "))
}

/// The slice offsets (in slices) of the `rows` index rows of `depth` in `idx` into leading
/// dimensions `lead`; `None` for a row outside them. Also returns the last such row.
fn offsets(
    idx: &[i64],
    rows: usize,
    depth: usize,
    lead: &[usize],
) -> (Vec<Option<usize>>, Option<usize>) {
    let mut out = Vec::with_capacity(rows);
    let mut bad = None;
    for r in 0..rows {
        let row = &idx[r * depth..(r + 1) * depth];
        let mut offset = 0usize;
        let mut inside = true;
        for (&i, &d) in row.iter().zip(lead) {
            inside &= i >= 0 && (i as u64) < d as u64;
            offset = offset.wrapping_mul(d).wrapping_add(i as usize);
        }
        if inside {
            out.push(Some(offset));
        } else {
            out.push(None);
            bad = Some(r);
        }
    }
    (out, bad)
}

/// GatherNd(params, indices): `out[i] = params[indices[i]]`, of shape
/// `indices.shape[:-1] + params.shape[indices.shape[-1]:]`.
struct GatherNd(Policy);

impl OpKernel for GatherNd {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (params, indices) = (input(ctx, 0)?, input(ctx, 1)?);
        if params.rank() == 0 {
            return Err(ctx.invalid("params must be at least a vector"));
        }
        if indices.rank() == 0 {
            return Err(ctx.invalid("indices must be at least a vector"));
        }
        let (p, ix) = (params.dims(), indices.dims());
        let (&depth, outer) = ix.split_last().expect("indices has a dimension");
        if depth > p.len() {
            return Err(ctx.invalid(format!(
                "index innermost dimension length must be <= params rank; saw: {depth} vs. {}",
                p.len()
            )));
        }
        let rows: u128 = outer.iter().map(|&d| d as u128).product();
        if rows > i32::MAX as u128 {
            return Err(ctx.invalid(format!(
                "indices has too many elements for int indexing: {rows} > {}",
                i32::MAX
            )));
        }
        let rows = rows as usize;
        if indices.dtype() == DType::Int32 && params.num_elements() > i32::MAX as usize {
            return Err(ctx.invalid(format!(
                "params.NumElements() too large for int32 indexing: {} > {}",
                params.num_elements(),
                i32::MAX
            )));
        }
        let mut dims = outer.to_vec();
        dims.extend_from_slice(&p[depth..]);
        admit(ctx, &dims, params.dtype())?;
        if rows > 0 {
            if params.num_elements() == 0 {
                return Err(ctx.invalid(format!(
                    "Requested more than 0 entries, but params is empty.  Params shape: {}",
                    params.shape()
                )));
            }
            if depth > MAX_INDEX_DEPTH {
                return Err(ctx.invalid(format!(
                    "Only indices.shape[-1] values between 1 and {MAX_INDEX_DEPTH} are currently \
                     supported.  Requested rank: {depth}"
                )));
            }
        }
        let idx = int_values(ctx, &indices, "indices")?;
        let (offsets, bad) = offsets(&idx, rows, depth, &p[..depth]);
        if let (Some(b), Policy::Error) = (bad, self.0) {
            return Err(ctx.invalid(format!(
                "indices{} = {} does not index into param shape {}, node name: {}",
                slice_debug(outer, b),
                row_debug(&idx[b * depth..(b + 1) * depth]),
                params.shape(),
                ctx.node().name
            )));
        }
        let slice: usize = p[depth..].iter().product();
        let out = dispatch_items!(ctx, params.dtype(), T => {
            gather_slices::<T>(ctx, &params, &offsets, slice, dims)?
        });
        ctx.set_output(0, out);
        Ok(())
    }
}

/// The output of a gather: the slice of `slice` elements at each offset (zeros for `None`),
/// the output's rows split over the intra-op pool.
fn gather_slices<T: Items + Default>(
    ctx: &OpContext<'_>,
    params: &Tensor,
    offsets: &[Option<usize>],
    slice: usize,
    dims: Vec<usize>,
) -> Result<Tensor> {
    if slice == 0 || offsets.is_empty() {
        return T::tensor(dims, Vec::new());
    }
    let values = T::items(params)?;
    let mut out = vec![T::default(); offsets.len() * slice];
    ctx.intra()
        .for_chunks(&mut out, slice, slice as f64, |first, chunk| {
            for (row, offset) in chunk.chunks_exact_mut(slice).zip(&offsets[first..]) {
                if let Some(o) = offset {
                    row.clone_from_slice(&values[o * slice..(o + 1) * slice]);
                }
            }
        });
    T::tensor(dims, out)
}

/// Whether indices and updates may be given for an output of `output` elements (TensorFlow's
/// `ValidEmptyOutputShape`): none of either, or some of all three.
fn valid_empty_output(output: usize, indices: usize, updates: usize) -> bool {
    (indices == 0 && updates == 0) || (output != 0 && indices != 0 && updates != 0)
}

/// ScatterNd(indices, updates, shape): zeros of `shape`, each slice of `updates` added at its
/// row of `indices`.
struct ScatterNd(Policy);

impl ScatterNd {
    /// The checks of TensorFlow's `ScatterNdOp::Compute` and of `PrepareAndValidateInputs`,
    /// in their order; returns the output's dims and the index depth.
    fn check(
        ctx: &OpContext<'_>,
        indices: &Tensor,
        updates: &Tensor,
        shape_input: &Tensor,
    ) -> Result<(Vec<usize>, usize)> {
        if indices.rank() < 1 {
            return Err(ctx.invalid(format!(
                "Indices shape must have rank at least one. Found:{}",
                indices.shape()
            )));
        }
        if updates.rank() < 1 {
            return Err(ctx.invalid(format!(
                "Updates shape must have rank at least one. Found:{}",
                updates.shape()
            )));
        }
        let shape = make_shape(ctx, &int_values(ctx, shape_input, "shape")?)?;
        let (ni, nu) = (indices.num_elements(), updates.num_elements());
        if !valid_empty_output(shape_input.num_elements(), ni, nu) {
            return Err(ctx.invalid("Indices and updates specified for empty output shape"));
        }
        let (i, u) = (indices.dims(), updates.dims());
        let outer = i.len() - 1;
        if u.len() < outer || u[..outer] != i[..outer] {
            return Err(ctx.invalid(format!(
                "Dimensions [0,{outer}) of indices[shape={}] must match dimensions [0,{outer}) \
                 of updates[shape={}]",
                indices.shape(),
                updates.shape()
            )));
        }
        let ix = i[outer];
        let inner_mismatch = || {
            ctx.invalid(format!(
                "Dimensions [{ix},{}) of input[shape={}] must match dimensions [{outer},{}) of \
                 updates[shape={}]",
                shape.len(),
                Shape::new(shape.clone()),
                u.len(),
                updates.shape()
            ))
        };
        if ix > shape.len() || u.len() - outer != shape.len() - ix {
            return Err(inner_mismatch());
        }
        if u[outer..] != shape[ix..] {
            return Err(inner_mismatch());
        }
        if shape_input.rank() != 1 {
            return Err(ctx.invalid("Shape must be a vector"));
        }
        if shape.is_empty() {
            return Err(ctx.invalid("Output must be at least 1-D, got shape: []"));
        }
        let total: usize = shape.iter().product();
        if !(total > 0 || (ni == 0 && nu == 0)) {
            return Err(ctx.invalid(format!(
                "Indices and updates specified for empty output.  indices shape: {}",
                indices.shape()
            )));
        }
        if u[0] != i[0] {
            return Err(ctx.invalid(format!(
                "Dimensions [0,1) of indices[shape={}] = {} must match dimensions [0,1) of \
                 updates[shape={}] = {}",
                indices.shape(),
                i[0],
                updates.shape(),
                u[0]
            )));
        }
        // TensorFlow's `ValidateScatterNdUpdateShape` reads vector indices as a batch of
        // one-deep rows, which the checks above already make impossible but for this message.
        let (depth, batch) = if i.len() > 1 { (ix, outer) } else { (1, 1) };
        let suffix = u.len() >= batch
            && shape.len() >= depth + (u.len() - batch)
            && u.len() == batch + shape.len() - depth
            && u[batch..] == shape[depth..];
        if u.len() < batch || u[..batch] != i[..batch] {
            return Err(ctx.invalid(format!(
                "Dimensions [0,{batch}) of indices[shape={}] must match dimensions [0,{batch}) \
                 of updates[shape={}]",
                indices.shape(),
                updates.shape()
            )));
        }
        if !suffix {
            return Err(ctx.invalid(format!(
                "Dimensions [{depth},{}) of input[shape={}] must match dimensions [{batch},{}) \
                 of updates[shape={}]",
                shape.len(),
                Shape::new(shape.clone()),
                u.len(),
                updates.shape()
            )));
        }
        Ok((shape, depth))
    }
}

impl OpKernel for ScatterNd {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (indices, updates, shape_input) = (input(ctx, 0)?, input(ctx, 1)?, input(ctx, 2)?);
        let (shape, depth) = Self::check(ctx, &indices, &updates, &shape_input)?;
        let total = admit(ctx, &shape, updates.dtype())?;
        let out = dispatch_real!(ctx, updates.dtype(), T => {
            let mut out = vec![T::default(); total];
            if total > 0 {
                if !(1..=MAX_INDEX_DEPTH).contains(&depth) {
                    // TensorFlow's message says 5, though its kernels take up to 7.
                    return Err(ctx.invalid(format!(
                        "Only indices.shape[-1] values between 1 and 5 are currently \
                         supported.  Requested rank: {depth}"
                    )));
                }
                let idx = int_values(ctx, &indices, "indices")?;
                let rows = idx.len() / depth;
                let slice: usize = shape[depth..].iter().product();
                let (offsets, bad) = offsets(&idx, rows, depth, &shape[..depth]);
                if let (Some(b), Policy::Error) = (bad, self.0) {
                    let outer = &indices.dims()[..indices.rank() - 1];
                    return Err(ctx.invalid(format!(
                        "indices{} = {} does not index into shape {}",
                        slice_debug(outer, b),
                        row_debug(&idx[b * depth..(b + 1) * depth]),
                        Shape::new(shape.clone())
                    )));
                }
                let values = updates.values::<T>()?;
                for (update, offset) in values.chunks_exact(slice.max(1)).zip(&offsets) {
                    let Some(o) = offset else { continue };
                    let place = &mut out[o * slice..(o + 1) * slice];
                    for (x, &y) in place.iter_mut().zip(update) {
                        *x = Real::add(*x, y);
                    }
                }
            }
            Tensor::from_vec(shape, out)?
        });
        ctx.set_output(0, out);
        Ok(())
    }
}
