//! Ops that move elements around: Transpose, ConcatV2, Pack, Unpack, Split, SplitV, Slice,
//! StridedSlice (begin / end / ellipsis / new_axis / shrink_axis masks), GatherV2 (any axis,
//! with batch dimensions) and Tile.
//!
//! Slice, StridedSlice and Tile reduce to one primitive, [`gather_dims`]: the cartesian product
//! of per-dimension source indices. Every op works for the numeric dtypes, bool and strings.

use std::sync::Arc;

use super::broadcast::gather_dims;
use super::Items;
use super::{input, int_scalar, int_values, normalize_axis, stateless};
use crate::error::Result;
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{Shape, Tensor};

/// Returns the factory for an element-moving op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "Transpose" => |_| stateless(transpose),
        "ConcatV2" => |_| stateless(concat),
        "Pack" => Pack::create,
        "Unpack" => Unpack::create,
        "Split" => |_| stateless(split),
        "SplitV" => |_| stateless(split_v),
        "Slice" => |_| stateless(slice),
        "StridedSlice" => StridedSlice::create,
        "StridedSliceGrad" => StridedSliceGrad::create,
        "GatherV2" => Gather::create,
        "Tile" => |_| stateless(tile),
        _ => return None,
    };
    Some(factory)
}

/// Transpose(x, perm): dimension `i` of the output is dimension `perm[i]` of `x`.
fn transpose(ctx: &mut OpContext<'_>) -> Result<()> {
    let (x, perm) = (input(ctx, 0)?, input(ctx, 1)?);
    let perm = int_values(ctx, &perm, "perm")?;
    let rank = x.rank();
    if perm.len() != rank {
        return Err(ctx.invalid(format!(
            "transpose expects a vector of size {rank}. But input(1) is a vector of size {}",
            perm.len()
        )));
    }
    let mut seen = vec![false; rank];
    let mut axes = Vec::with_capacity(rank);
    for (i, &p) in perm.iter().enumerate() {
        let d = normalize_axis(ctx, p, rank, &format!("perm[{i}]"))?;
        if seen[d] {
            return Err(ctx.invalid(format!("{d} is repeated in perm {perm:?}")));
        }
        seen[d] = true;
        axes.push(d);
    }
    let dims: Vec<usize> = axes.iter().map(|&d| x.dims()[d]).collect();
    let out = dispatch_items!(ctx, x.dtype(), T => {
        let values = T::items(&x)?;
        T::tensor(dims, permute(&values, x.dims(), &axes))?
    });
    ctx.set_output(0, out);
    Ok(())
}

/// `src` (row-major, dimensions `dims`) with its axes permuted: output axis `i` is input axis
/// `axes[i]`. The output is written row by row of its last dimension, each row a slice copy
/// when that dimension is the input's last too (the common case: batch and time swapped).
fn permute<T: Clone>(src: &[T], dims: &[usize], axes: &[usize]) -> Vec<T> {
    let rank = dims.len();
    let total: usize = dims.iter().product();
    if total == 0 || axes.iter().enumerate().all(|(i, &a)| i == a) {
        return src.to_vec();
    }
    let mut strides = vec![1usize; rank];
    for d in (0..rank.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * dims[d + 1];
    }
    let out_dims: Vec<usize> = axes.iter().map(|&a| dims[a]).collect();
    let out_strides: Vec<usize> = axes.iter().map(|&a| strides[a]).collect();
    let (inner, inner_stride) = (out_dims[rank - 1], out_strides[rank - 1]);
    let mut out = Vec::with_capacity(total);
    // An odometer over the output's leading dimensions, with the source offset it points at.
    let mut index = vec![0usize; rank - 1];
    let mut offset = 0usize;
    loop {
        if inner_stride == 1 {
            out.extend_from_slice(&src[offset..offset + inner]);
        } else {
            out.extend((0..inner).map(|j| src[offset + j * inner_stride].clone()));
        }
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            index[d] += 1;
            offset += out_strides[d];
            if index[d] < out_dims[d] {
                break;
            }
            offset -= out_strides[d] * out_dims[d];
            index[d] = 0;
        }
    }
}

/// Concatenates `parts` (row-major, all with `outer` rows of their own chunk length).
fn concat_chunks<T: Items>(parts: &[Tensor], outer: usize, chunks: &[usize]) -> Result<Vec<T>> {
    let values: Vec<_> = parts.iter().map(|t| T::items(t)).collect::<Result<_>>()?;
    let mut out = Vec::with_capacity(chunks.iter().sum::<usize>() * outer);
    for o in 0..outer {
        for (v, &c) in values.iter().zip(chunks) {
            out.extend_from_slice(&v[o * c..(o + 1) * c]);
        }
    }
    Ok(out)
}

/// Joins `parts` along `axis`; every other dimension must match. Returns the output dims.
fn join(ctx: &OpContext<'_>, parts: &[Tensor], axis: usize, what: &str) -> Result<Tensor> {
    let first = &parts[0];
    let rank = first.rank();
    let mut out_dims = first.dims().to_vec();
    out_dims[axis] = 0;
    for (i, t) in parts.iter().enumerate() {
        if t.dtype() != first.dtype() {
            return Err(ctx.invalid(format!(
                "{what}: input {i} is {} but input 0 is {}",
                t.dtype(),
                first.dtype()
            )));
        }
        if t.rank() != rank {
            return Err(ctx.invalid(format!(
                "{what} : Ranks of all input tensors should match: shape[0] = {} vs. shape[{i}] = {}",
                first.shape(),
                t.shape()
            )));
        }
        for d in (0..rank).filter(|&d| d != axis) {
            if t.dims()[d] != first.dims()[d] {
                return Err(ctx.invalid(format!(
                    "{what} : Dimension {d} in both shapes must be equal: shape[0] = {} vs. shape[{i}] = {}",
                    first.shape(),
                    t.shape()
                )));
            }
        }
        out_dims[axis] += t.dims()[axis];
    }
    let outer: usize = first.dims()[..axis].iter().product();
    let chunks: Vec<usize> = parts
        .iter()
        .map(|t| t.dims()[axis..].iter().product())
        .collect();
    dispatch_items!(ctx, first.dtype(), T => {
        T::tensor(out_dims, concat_chunks::<T>(parts, outer, &chunks)?)
    })
}

/// ConcatV2(values..., axis).
fn concat(ctx: &mut OpContext<'_>) -> Result<()> {
    let n = ctx.num_inputs();
    if n < 2 {
        return Err(ctx.invalid("ConcatV2 needs at least one value and an axis"));
    }
    let axis = int_scalar(ctx, &input(ctx, n - 1)?, "axis")?;
    let parts = ctx.inputs()[..n - 1].to_vec();
    if parts[0].rank() == 0 {
        return Err(ctx.invalid("Can't concatenate scalars (use tf.stack instead)"));
    }
    let axis = normalize_axis(ctx, axis, parts[0].rank(), "axis")?;
    let out = join(ctx, &parts, axis, "ConcatOp")?;
    ctx.set_output(0, out);
    Ok(())
}

/// Pack: stacks N same-shape tensors along a new dimension `axis`.
struct Pack {
    axis: i64,
}

impl Pack {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Pack {
            axis: attr::int_or(node, "axis", 0)?,
        }))
    }
}

impl OpKernel for Pack {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let parts = ctx.inputs().to_vec();
        let Some(first) = parts.first() else {
            return Err(ctx.invalid("Pack needs at least one input"));
        };
        for (i, t) in parts.iter().enumerate() {
            if t.shape() != first.shape() {
                return Err(ctx.invalid(format!(
                    "Shapes of all inputs must match: values[0].shape = {} != values[{i}].shape = {}",
                    first.shape(),
                    t.shape()
                )));
            }
        }
        let axis = normalize_axis(ctx, self.axis, first.rank() + 1, "axis")?;
        let mut dims = first.dims().to_vec();
        dims.insert(axis, 1);
        let expanded = parts
            .iter()
            .map(|t| t.reshape(dims.clone()))
            .collect::<Result<Vec<_>>>()?;
        let out = join(ctx, &expanded, axis, "Pack")?;
        ctx.set_output(0, out);
        Ok(())
    }
}

/// Unpack: splits a tensor into `num` tensors along `axis`, dropping that dimension.
struct Unpack {
    num: i64,
    axis: i64,
}

impl Unpack {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Unpack {
            num: attr::int(node, "num")?,
            axis: attr::int_or(node, "axis", 0)?,
        }))
    }

    fn split<T: Items>(&self, x: &Tensor, axis: usize) -> Result<Vec<Vec<T>>> {
        let values = T::items(x)?;
        let n = x.dims()[axis];
        let outer: usize = x.dims()[..axis].iter().product();
        let inner: usize = x.dims()[axis + 1..].iter().product();
        let mut outs = vec![Vec::with_capacity(outer * inner); n];
        for o in 0..outer {
            for (i, out) in outs.iter_mut().enumerate() {
                let start = (o * n + i) * inner;
                out.extend_from_slice(&values[start..start + inner]);
            }
        }
        Ok(outs)
    }
}

impl OpKernel for Unpack {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = input(ctx, 0)?;
        if x.rank() == 0 {
            return Err(ctx.invalid("cannot unpack a scalar"));
        }
        let axis = normalize_axis(ctx, self.axis, x.rank(), "axis")?;
        if x.dims()[axis] as i64 != self.num {
            return Err(ctx.invalid(format!(
                "Input shape axis {axis} must equal {}, got shape {}",
                self.num,
                x.shape()
            )));
        }
        let mut dims = x.dims().to_vec();
        dims.remove(axis);
        let outs: Vec<Tensor> = dispatch_items!(ctx, x.dtype(), T => {
            self.split::<T>(&x, axis)?
                .into_iter()
                .map(|v| T::tensor(dims.clone(), v))
                .collect::<Result<_>>()?
        });
        for (i, t) in outs.into_iter().enumerate() {
            ctx.set_output(i, t);
        }
        Ok(())
    }
}

/// Cuts `x` along `axis` into pieces of `sizes` (which add up to the dimension).
fn split_along<T: Items>(x: &Tensor, axis: usize, sizes: &[usize]) -> Result<Vec<Tensor>> {
    let values = T::items(x)?;
    let n = x.dims()[axis];
    let outer: usize = x.dims()[..axis].iter().product();
    let inner: usize = x.dims()[axis + 1..].iter().product();
    let mut start = 0;
    let mut outs = Vec::with_capacity(sizes.len());
    for &size in sizes {
        let mut piece = Vec::with_capacity(outer * size * inner);
        for o in 0..outer {
            let from = (o * n + start) * inner;
            piece.extend_from_slice(&values[from..from + size * inner]);
        }
        let mut dims = x.dims().to_vec();
        dims[axis] = size;
        outs.push(T::tensor(dims, piece)?);
        start += size;
    }
    Ok(outs)
}

/// Reads a split's `split_dim` input and maps it onto `[0, rank)`, as TensorFlow words it.
fn split_axis(ctx: &OpContext<'_>, t: &Tensor, x: &Tensor) -> Result<usize> {
    if t.num_elements() != 1 {
        return Err(ctx.invalid(format!(
            "split_dim must be a scalar but has rank {}",
            t.rank()
        )));
    }
    let dim = int_values(ctx, t, "split_dim")?[0];
    let rank = x.rank() as i64;
    let axis = if dim < 0 { dim + rank } else { dim };
    if !(0..rank).contains(&axis) {
        return Err(ctx.invalid(format!(
            "-input rank(-{rank}) <= split_dim < input rank ({rank}), but got {dim}"
        )));
    }
    Ok(axis as usize)
}

/// Sets the pieces as the outputs.
fn set_pieces(ctx: &mut OpContext<'_>, x: &Tensor, axis: usize, sizes: &[usize]) -> Result<()> {
    let pieces: Vec<Tensor> =
        dispatch_items!(ctx, x.dtype(), T => split_along::<T>(x, axis, sizes)?);
    for (i, t) in pieces.into_iter().enumerate() {
        ctx.set_output(i, t);
    }
    Ok(())
}

/// Split(split_dim, value): `num_split` equal pieces along `split_dim`.
fn split(ctx: &mut OpContext<'_>) -> Result<()> {
    let x = input(ctx, 1)?;
    let axis = split_axis(ctx, ctx.input(0)?, &x)?;
    let num_split = attr::int(ctx.node(), "num_split")?;
    if num_split <= 0 {
        return Err(ctx.invalid(format!(
            "Number of ways to split should be > 0, but got {num_split}"
        )));
    }
    let (n, k) = (x.dims()[axis], num_split as usize);
    if n % k != 0 {
        return Err(ctx.invalid(format!(
            "Number of ways to split should evenly divide the split dimension, but got \
             split_dim {axis} (size = {n}) and num_split {k}"
        )));
    }
    set_pieces(ctx, &x, axis, &vec![n / k; k])
}

/// SplitV(value, size_splits, split_dim): pieces of `size_splits` along `split_dim`; one
/// size may be -1, standing for what the others leave.
fn split_v(ctx: &mut OpContext<'_>) -> Result<()> {
    let x = input(ctx, 0)?;
    let axis = split_axis(ctx, ctx.input(2)?, &x)?;
    let num_split = attr::int(ctx.node(), "num_split")?;
    let sizes_t = ctx.input(1)?;
    if sizes_t.rank() != 1 || sizes_t.num_elements() as i64 != num_split {
        return Err(ctx.invalid(format!(
            "size of the split_tensor must be 1-D and have the same elements as outputs got {} \
             -D and {} elements",
            sizes_t.rank(),
            sizes_t.num_elements()
        )));
    }
    let mut sizes = int_values(ctx, sizes_t, "size_splits")?;
    let n = x.dims()[axis] as i64;
    let unknown: Vec<usize> = (0..sizes.len()).filter(|&i| sizes[i] == -1).collect();
    if unknown.len() > 1 {
        return Err(ctx.invalid("There can only be one -1 in the input."));
    }
    let known: i64 = sizes.iter().filter(|&&s| s != -1).sum();
    if (unknown.is_empty() && known != n) || (!unknown.is_empty() && known > n) {
        return Err(ctx.invalid(format!(
            "Determined shape must either match input shape along split_dim exactly if fully \
             specified, or be less than the size of the input along split_dim if not fully \
             specified.  Got: {known}"
        )));
    }
    if let Some(&i) = unknown.first() {
        sizes[i] = n - known;
    }
    let sizes = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            usize::try_from(s)
                .map_err(|_| ctx.invalid(format!("Split size at index {i} must be >= 0. Got: {s}")))
        })
        .collect::<Result<Vec<_>>>()?;
    set_pieces(ctx, &x, axis, &sizes)
}

/// Copies the elements of `x` at the cartesian product of `indices`, shaped as `dims`.
fn gather_tensor(
    ctx: &OpContext<'_>,
    x: &Tensor,
    indices: &[Vec<usize>],
    dims: Vec<usize>,
) -> Result<Tensor> {
    dispatch_items!(ctx, x.dtype(), T => {
        let values = T::items(x)?;
        T::tensor(dims, gather_dims(&values, x.dims(), indices))
    })
}

/// Slice(input, begin, size): `size[i] = -1` takes the rest of dimension `i`.
fn slice(ctx: &mut OpContext<'_>) -> Result<()> {
    let (x, begin, size) = (input(ctx, 0)?, input(ctx, 1)?, input(ctx, 2)?);
    let rank = x.rank();
    let (b, s) = (
        int_values(ctx, &begin, "begin")?,
        int_values(ctx, &size, "size")?,
    );
    if begin.rank() != 1 || size.rank() != 1 || b.len() != rank || s.len() != rank {
        return Err(ctx.invalid(format!(
            "Expected begin and size arguments to be 1-D tensors of size {rank}, but got shapes {} and {} instead.",
            begin.shape(),
            size.shape()
        )));
    }
    let mut indices = Vec::with_capacity(rank);
    for i in 0..rank {
        let d = x.dims()[i] as i64;
        if b[i] < 0 || b[i] > d {
            return Err(ctx.invalid(format!("Expected begin[{i}] in [0, {d}], but got {}", b[i])));
        }
        let len = if s[i] == -1 { d - b[i] } else { s[i] };
        if len < 0 || b[i] + len > d {
            return Err(ctx.invalid(format!(
                "Expected size[{i}] in [0, {}], but got {}",
                d - b[i],
                s[i]
            )));
        }
        indices.push((b[i] as usize..(b[i] + len) as usize).collect::<Vec<_>>());
    }
    let dims = indices.iter().map(Vec::len).collect();
    let out = gather_tensor(ctx, &x, &indices, dims)?;
    ctx.set_output(0, out);
    Ok(())
}

/// Tile(input, multiples): repeats the input `multiples[i]` times along dimension `i`.
fn tile(ctx: &mut OpContext<'_>) -> Result<()> {
    let (x, multiples) = (input(ctx, 0)?, input(ctx, 1)?);
    let m = int_values(ctx, &multiples, "multiples")?;
    if m.len() != x.rank() {
        return Err(ctx.invalid(format!(
            "Expected multiples argument to be a vector of length {} but got length {}",
            x.rank(),
            m.len()
        )));
    }
    let mut indices = Vec::with_capacity(m.len());
    for (i, (&d, &k)) in x.dims().iter().zip(&m).enumerate() {
        let k = usize::try_from(k)
            .map_err(|_| ctx.invalid(format!("Expected multiples[{i}] >= 0, but got {k}")))?;
        let n = super::checked_elements(ctx, &[d, k])?;
        indices.push((0..n).map(|j| j % d).collect::<Vec<_>>());
    }
    let dims: Vec<usize> = indices.iter().map(Vec::len).collect();
    super::checked_elements(ctx, &dims)?;
    let out = gather_tensor(ctx, &x, &indices, dims)?;
    ctx.set_output(0, out);
    Ok(())
}

/// GatherV2(params, indices, axis) with `batch_dims`: the output has shape
/// `params.shape[:axis] + indices.shape[batch_dims:] + params.shape[axis+1:]`, the first
/// `batch_dims` dimensions of `params` and `indices` being shared batch dimensions.
struct Gather {
    batch_dims: i64,
}

impl Gather {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(Gather {
            batch_dims: attr::int_or(node, "batch_dims", 0)?,
        }))
    }
}

impl OpKernel for Gather {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (params, indices, axis) = (input(ctx, 0)?, input(ctx, 1)?, input(ctx, 2)?);
        let axis = int_scalar(ctx, &axis, "axis")?;
        if params.rank() == 0 {
            return Err(ctx.invalid("params must be at least 1 dimensional"));
        }
        let rank = params.rank() as i64;
        if axis < -rank || axis >= rank {
            return Err(ctx.invalid(format!(
                "Expected axis in the range [{}, {rank}), but got {axis}",
                -rank
            )));
        }
        let axis = if axis < 0 { axis + rank } else { axis } as usize;
        let index_rank = indices.rank() as i64;
        let mut batch_dims = self.batch_dims;
        if batch_dims != 0 {
            if batch_dims < -index_rank || batch_dims > index_rank {
                return Err(ctx.invalid(format!(
                    "Expected batch_dims in the range [{}, {index_rank}], but got {batch_dims}",
                    -index_rank
                )));
            }
            if batch_dims < 0 {
                batch_dims += index_rank;
            }
            if batch_dims >= rank {
                return Err(ctx.invalid(format!(
                    "batch_dims ({batch_dims}) must be less than rank(params) ({rank})."
                )));
            }
            if axis < batch_dims as usize {
                return Err(ctx.invalid(format!(
                    "batch_dims ({batch_dims}) must be less than or equal to axis ({axis})."
                )));
            }
        }
        let out = gather_batched(ctx, &params, &indices, axis, batch_dims as usize)?;
        ctx.set_output(0, out);
        Ok(())
    }
}

/// Gathers the slices of `params` along `axis` at `indices`, the first `batch_dims`
/// dimensions of both being batch dimensions (`batch_dims <= axis < params.rank()`, checked by
/// the caller): `out[b, o, i, j] = params[b, o, indices[b, i], j]`. Fails with TensorFlow's
/// INVALID_ARGUMENT for mismatched batch dimensions and for an index outside `[0,
/// params.shape[axis])`. Shared with `ResourceGather`.
pub(super) fn gather_batched(
    ctx: &OpContext<'_>,
    params: &Tensor,
    indices: &Tensor,
    axis: usize,
    batch_dims: usize,
) -> Result<Tensor> {
    let (p, ix) = (params.dims(), indices.dims());
    for d in 0..batch_dims {
        if p[d] != ix[d] {
            return Err(ctx.invalid(format!(
                "params.shape[{d}]: {} should be equal to indices.shape[{d}]: {}",
                p[d], ix[d]
            )));
        }
    }
    let limit = p[axis];
    let raw = int_values(ctx, indices, "indices")?;
    let mut idx = Vec::with_capacity(raw.len());
    for (flat, &i) in raw.iter().enumerate() {
        if i < 0 || i as usize >= limit {
            let coords = unravel(flat, ix);
            return Err(ctx.invalid(format!("indices[{coords}] = {i} is not in [0, {limit})")));
        }
        idx.push(i as usize);
    }
    let mut dims = p[..axis].to_vec();
    dims.extend_from_slice(&ix[batch_dims..]);
    dims.extend_from_slice(&p[axis + 1..]);
    super::checked_elements(ctx, &dims)?;
    let batch: usize = p[..batch_dims].iter().product();
    let outer: usize = p[batch_dims..axis].iter().product();
    let inner: usize = p[axis + 1..].iter().product();
    let per_batch: usize = ix[batch_dims..].iter().product();
    dispatch_items!(ctx, params.dtype(), T => {
        let values = T::items(params)?;
        let mut out = Vec::with_capacity(batch * outer * per_batch * inner);
        for b in 0..batch {
            let picks = &idx[b * per_batch..(b + 1) * per_batch];
            for o in 0..outer {
                let base = (b * outer + o) * limit;
                for &i in picks {
                    let start = (base + i) * inner;
                    out.extend_from_slice(&values[start..start + inner]);
                }
            }
        }
        T::tensor(dims, out)
    })
}

/// Formats the coordinates of row-major position `flat` in `dims` as `1,0`.
pub(super) fn unravel(mut flat: usize, dims: &[usize]) -> String {
    let mut coords = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        coords[d] = flat % dims[d].max(1);
        flat /= dims[d].max(1);
    }
    coords
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// StridedSlice(input, begin, end, strides) with TensorFlow's five masks.
struct StridedSlice {
    begin_mask: i64,
    end_mask: i64,
    ellipsis_mask: i64,
    new_axis_mask: i64,
    shrink_axis_mask: i64,
}

/// The slice of one input dimension, after the sparse spec is expanded.
#[derive(Clone, Copy)]
struct DenseSpec {
    begin: i64,
    end: i64,
    stride: i64,
    begin_masked: bool,
    end_masked: bool,
    shrink: bool,
}

impl DenseSpec {
    /// The whole dimension (what an ellipsis, or a dimension past the spec, stands for).
    const WHOLE: DenseSpec = DenseSpec {
        begin: 0,
        end: 0,
        stride: 1,
        begin_masked: true,
        end_masked: true,
        shrink: false,
    };
}

/// One output dimension of a strided slice, before new axes and shrinks are applied.
enum FinalDim {
    /// A dimension of the processed input (its index there).
    Dense(usize),
    /// A new dimension of size 1.
    NewAxis,
}

impl StridedSlice {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(StridedSlice::masks(node)?))
    }

    /// The five masks of a StridedSlice or StridedSliceGrad node.
    fn masks(node: &NodeDef) -> Result<StridedSlice> {
        Ok(StridedSlice {
            begin_mask: attr::int_or(node, "begin_mask", 0)?,
            end_mask: attr::int_or(node, "end_mask", 0)?,
            ellipsis_mask: attr::int_or(node, "ellipsis_mask", 0)?,
            new_axis_mask: attr::int_or(node, "new_axis_mask", 0)?,
            shrink_axis_mask: attr::int_or(node, "shrink_axis_mask", 0)?,
        })
    }

    /// Computes the source indices along each input dimension and the output shape.
    fn plan(
        &self,
        ctx: &OpContext<'_>,
        dims: &[usize],
        begin: &[i64],
        end: &[i64],
        strides: &[i64],
    ) -> Result<(Vec<Vec<usize>>, Vec<usize>)> {
        let bit = |mask: i64, i: usize| i < 63 && (mask >> i) & 1 == 1;
        let n = begin.len();
        if n >= 63 {
            // The masks are 64-bit, so a longer spec cannot be expressed.
            return Err(ctx.invalid(format!(
                "slice spec has {n} entries; at most 62 are supported"
            )));
        }
        let rank = dims.len();
        // Expand the sparse spec (with its ellipsis, explicit or implied at the end) into one
        // entry per input dimension.
        let mut ellipsis_mask = self.ellipsis_mask;
        let mut sparse_n = n;
        if ellipsis_mask == 0 {
            ellipsis_mask = 1 << n;
            sparse_n += 1;
        }
        let mut dense: Vec<Option<DenseSpec>> = vec![None; rank];
        let mut final_dims = Vec::new();
        let mut full = 0usize;
        let mut seen_ellipsis = false;
        for i in 0..sparse_n {
            if bit(ellipsis_mask, i) {
                if seen_ellipsis {
                    return Err(ctx.invalid("Multiple ellipses in slice spec not allowed"));
                }
                seen_ellipsis = true;
                let after_new_axes = (i + 1..n)
                    .filter(|&j| bit(self.new_axis_mask, j) && !bit(ellipsis_mask, j))
                    .count();
                let remaining = n.saturating_sub(i + 1) - after_new_axes;
                let next = rank.saturating_sub(remaining).max(full);
                for (d, spec) in dense.iter_mut().enumerate().take(next).skip(full) {
                    *spec = Some(DenseSpec::WHOLE);
                    final_dims.push(FinalDim::Dense(d));
                }
                full = next;
            } else if bit(self.new_axis_mask, i) {
                final_dims.push(FinalDim::NewAxis);
            } else {
                if full >= rank {
                    return Err(ctx.invalid(format!(
                        "Index out of range using input dim {full}; input has only {rank} dims"
                    )));
                }
                dense[full] = Some(DenseSpec {
                    begin: begin[i],
                    end: end[i],
                    stride: strides[i],
                    begin_masked: bit(self.begin_mask, i),
                    end_masked: bit(self.end_mask, i),
                    shrink: bit(self.shrink_axis_mask, i),
                });
                if !bit(self.shrink_axis_mask, i) {
                    final_dims.push(FinalDim::Dense(full));
                }
                full += 1;
            }
        }
        let mut indices = Vec::with_capacity(rank);
        for (d, spec) in dense.iter().enumerate() {
            let size = dims[d] as i64;
            let DenseSpec {
                begin: b,
                end: e,
                stride: s,
                begin_masked: b_masked,
                end_masked: e_masked,
                shrink,
            } = spec.unwrap_or(DenseSpec::WHOLE);
            if s == 0 {
                return Err(ctx.invalid(format!("strides[{d}] must be non-zero")));
            }
            if shrink {
                if s < 0 {
                    return Err(ctx.invalid("only stride 1 allowed on non-range indexing."));
                }
                let x = if b < 0 { size + b } else { b };
                if x < 0 || x >= size {
                    return Err(
                        ctx.invalid(format!("slice index {b} of dimension {d} out of bounds."))
                    );
                }
                indices.push(vec![x as usize]);
                continue;
            }
            let (lower, upper) = if s > 0 { (0, size) } else { (-1, size - 1) };
            let canonical = |x: i64, masked: bool, is_begin: bool| -> i64 {
                if masked {
                    if (s > 0) == is_begin {
                        lower
                    } else {
                        upper
                    }
                } else {
                    let fwd = if x < 0 { size + x } else { x };
                    fwd.clamp(lower, upper)
                }
            };
            let start = canonical(b, b_masked, true);
            let stop = canonical(e, e_masked, false);
            let mut picked = Vec::new();
            let mut at = start;
            while (s > 0 && at < stop) || (s < 0 && at > stop) {
                picked.push(at as usize);
                at += s;
            }
            indices.push(picked);
        }
        let shape = final_dims
            .iter()
            .map(|f| match f {
                FinalDim::Dense(d) => indices[*d].len(),
                FinalDim::NewAxis => 1,
            })
            .collect();
        Ok((indices, shape))
    }
}

impl OpKernel for StridedSlice {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = input(ctx, 0)?;
        let begin = int_values(ctx, &input(ctx, 1)?, "begin")?;
        let end = int_values(ctx, &input(ctx, 2)?, "end")?;
        let strides = int_values(ctx, &input(ctx, 3)?, "strides")?;
        if begin.len() != end.len() || begin.len() != strides.len() {
            return Err(ctx.invalid(format!(
                "Expected begin, end, and strides to be 1D equal size tensors, but got lengths {}, {} and {} instead.",
                begin.len(),
                end.len(),
                strides.len()
            )));
        }
        let (indices, shape) = self.plan(ctx, x.dims(), &begin, &end, &strides)?;
        let gathered = gather_tensor(ctx, &x, &indices, indices.iter().map(Vec::len).collect())?;
        let out = gathered.reshape(Shape::new(shape))?;
        ctx.set_output(0, out);
        Ok(())
    }
}

/// StridedSliceGrad(shape, begin, end, strides, dy): a tensor of `shape`, zero but where the
/// same StridedSlice of it picks elements, which hold `dy` (the gradient of StridedSlice, as
/// TensorFlow 1 graphs write it).
struct StridedSliceGrad(StridedSlice);

impl StridedSliceGrad {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(StridedSliceGrad(StridedSlice::masks(node)?)))
    }
}

impl OpKernel for StridedSliceGrad {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let shape = int_values(ctx, &input(ctx, 0)?, "shape")?;
        let begin = int_values(ctx, &input(ctx, 1)?, "begin")?;
        let end = int_values(ctx, &input(ctx, 2)?, "end")?;
        let strides = int_values(ctx, &input(ctx, 3)?, "strides")?;
        let dy = input(ctx, 4)?;
        let dims = shape
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| ctx.invalid(format!("shape has {d}"))))
            .collect::<Result<Vec<usize>>>()?;
        let (indices, _) = self.0.plan(ctx, &dims, &begin, &end, &strides)?;
        let picked: usize = indices.iter().map(Vec::len).product();
        if picked != dy.num_elements() {
            return Err(ctx.invalid(format!(
                "dy has {} elements but the slice of shape {dims:?} picks {picked}",
                dy.num_elements()
            )));
        }
        let out = dispatch_real!(ctx, dy.dtype(), T => {
            let values = dy.values::<T>()?;
            let mut out = vec![T::default(); dims.iter().product()];
            let mut strides_out = vec![1usize; dims.len()];
            for d in (0..dims.len().saturating_sub(1)).rev() {
                strides_out[d] = strides_out[d + 1] * dims[d + 1];
            }
            let mut position = vec![0usize; dims.len()];
            for &v in values.iter() {
                let at: usize = position
                    .iter()
                    .enumerate()
                    .map(|(d, &p)| indices[d][p] * strides_out[d])
                    .sum();
                out[at] = v;
                for d in (0..dims.len()).rev() {
                    position[d] += 1;
                    if position[d] < indices[d].len() {
                        break;
                    }
                    position[d] = 0;
                }
            }
            Tensor::from_vec(Shape::new(dims.clone()), out)?
        });
        ctx.set_output(0, out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::permute;
    use crate::kernels::cpu::broadcast::view;

    #[test]
    fn every_permutation_matches_ndarrays() {
        let dims = [3, 4, 2, 5];
        let src: Vec<usize> = (0..120).collect();
        let perms = [
            [0, 1, 2, 3],
            [1, 0, 2, 3],
            [3, 2, 1, 0],
            [0, 2, 3, 1],
            [2, 0, 3, 1],
        ];
        for axes in perms {
            let want: Vec<usize> = view(&dims, &src)
                .permuted_axes(ndarray::IxDyn(&axes))
                .iter()
                .copied()
                .collect();
            assert_eq!(permute(&src, &dims, &axes), want, "{axes:?}");
        }
        assert_eq!(permute(&[7], &[], &[]), vec![7]);
        assert!(permute::<u8>(&[], &[0, 3], &[1, 0]).is_empty());
    }
}
