//! The ops embedding models are built from, besides the gather: segment reductions
//! (`UnsortedSegmentSum/Max/Min/Prod`, `SegmentSum/Mean/Max/Min/Prod`, the sparse
//! `SparseSegmentSum/Mean/SqrtN` with and without `num_segments`, and the gradient ops
//! `SparseSegment*Grad` and their `V2` forms that return only the touched rows), `Unique` /
//! `UniqueV2`, `DynamicPartition` and `DynamicStitch` / `ParallelDynamicStitch`.
//!
//! Every segment reduction is one loop, [`reduce_rows`]: rows of `data` (its elements past the
//! segmented dimensions) are folded into output rows picked by the segment ids. What differs is
//! how the ids are checked and what an empty segment holds, both as TensorFlow's kernels do:
//! the unsorted ops leave the reduction's identity there (the lowest value for a max), the
//! sorted and sparse ones a zero (a one for a product). Messages quote TensorFlow's.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use bytes::Bytes;
use num_traits::Bounded;

use super::numeric::Real;
use super::slicing::{gather_batched, unravel};
use super::{input, int_scalar, int_values, stateless, Items};
use crate::error::Result;
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, Shape, Tensor};

/// Returns the factory for a segment, unique, partition or stitch op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "Unique" | "UniqueV2" => Unique::create,
        "UnsortedSegmentSum"
        | "UnsortedSegmentMax"
        | "UnsortedSegmentMin"
        | "UnsortedSegmentProd" => Segments::create,
        "SegmentSum" | "SegmentMean" | "SegmentMax" | "SegmentMin" | "SegmentProd" => {
            Segments::create
        }
        "SparseSegmentSum"
        | "SparseSegmentMean"
        | "SparseSegmentSqrtN"
        | "SparseSegmentSumWithNumSegments"
        | "SparseSegmentMeanWithNumSegments"
        | "SparseSegmentSqrtNWithNumSegments" => Segments::create,
        "SparseSegmentSumGrad"
        | "SparseSegmentMeanGrad"
        | "SparseSegmentSqrtNGrad"
        | "SparseSegmentSumGradV2"
        | "SparseSegmentMeanGradV2"
        | "SparseSegmentSqrtNGradV2" => SparseSegmentGrad::create,
        "DynamicPartition" => |_| stateless(dynamic_partition),
        "DynamicStitch" | "ParallelDynamicStitch" => |_| stateless(dynamic_stitch),
        _ => return None,
    };
    Some(factory)
}

/// How a segment's rows combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reduce {
    Sum,
    Mean,
    SqrtN,
    Max,
    Min,
    Prod,
}

impl Reduce {
    /// The reduction an op's name ends with.
    fn of(op: &str) -> Reduce {
        let op = op
            .trim_end_matches("GradV2")
            .trim_end_matches("Grad")
            .trim_end_matches("WithNumSegments");
        if op.ends_with("Mean") {
            Reduce::Mean
        } else if op.ends_with("SqrtN") {
            Reduce::SqrtN
        } else if op.ends_with("Max") {
            Reduce::Max
        } else if op.ends_with("Min") {
            Reduce::Min
        } else if op.ends_with("Prod") {
            Reduce::Prod
        } else {
            Reduce::Sum
        }
    }

    /// The value an output row starts from.
    fn identity<T: Real>(self) -> T {
        match self {
            Reduce::Sum | Reduce::Mean | Reduce::SqrtN => T::default(),
            Reduce::Prod => T::one(),
            // TensorFlow starts from the lowest finite value, not -inf.
            Reduce::Max => <T as Bounded>::min_value(),
            Reduce::Min => <T as Bounded>::max_value(),
        }
    }

    fn combine<T: Real>(self, a: T, b: T) -> T {
        match self {
            Reduce::Sum | Reduce::Mean | Reduce::SqrtN => Real::add(a, b),
            Reduce::Prod => Real::mul(a, b),
            Reduce::Max => Real::max(a, b),
            Reduce::Min => Real::min(a, b),
        }
    }

    /// Divides a finished row by what its element count asks for (Mean, SqrtN).
    fn finish<T: Real>(self, v: T, count: usize) -> T {
        match self {
            Reduce::Mean => Real::div_count(v, count),
            Reduce::SqrtN => {
                let root = T::from((count as f64).sqrt()).unwrap_or_else(T::one);
                Real::div(v, root)
            }
            _ => v,
        }
    }
}

/// Folds the rows of `data` (rows of `inner` elements) into `rows` output rows: source row
/// `pairs[k].0` goes into output row `pairs[k].1`. Rows no pair reaches hold the reduction's
/// identity, or zero (one for a product) when `empty_is_zero`.
fn reduce_rows<T: Real>(
    data: &[T],
    inner: usize,
    pairs: &[(usize, usize)],
    rows: usize,
    reduce: Reduce,
    empty_is_zero: bool,
) -> Vec<T> {
    let mut out = vec![reduce.identity::<T>(); rows * inner];
    let mut counts = vec![0usize; rows];
    for &(src, dst) in pairs {
        counts[dst] += 1;
        let from = &data[src * inner..(src + 1) * inner];
        for (o, &x) in out[dst * inner..(dst + 1) * inner].iter_mut().zip(from) {
            *o = reduce.combine(*o, x);
        }
    }
    for (row, &count) in counts.iter().enumerate() {
        let values = &mut out[row * inner..(row + 1) * inner];
        if count == 0 {
            if empty_is_zero && matches!(reduce, Reduce::Max | Reduce::Min) {
                values.fill(T::default());
            }
        } else if matches!(reduce, Reduce::Mean | Reduce::SqrtN) {
            for v in values {
                *v = reduce.finish(*v, count);
            }
        }
    }
    out
}

/// Which family a segment op belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    /// `UnsortedSegment*(data, segment_ids, num_segments)`.
    Unsorted,
    /// `Segment*(data, segment_ids)`: sorted ids.
    Sorted,
    /// `SparseSegment*(data, indices, segment_ids[, num_segments])`.
    Sparse { num_segments: bool },
}

/// The segment reductions.
struct Segments {
    family: Family,
    reduce: Reduce,
}

impl Segments {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let op = node.op.as_str();
        let family = if op.starts_with("Unsorted") {
            Family::Unsorted
        } else if op.starts_with("Sparse") {
            Family::Sparse {
                num_segments: op.ends_with("WithNumSegments"),
            }
        } else {
            Family::Sorted
        };
        Ok(Arc::new(Segments {
            family,
            reduce: Reduce::of(op),
        }))
    }

    /// `UnsortedSegment*`: returns the (source row, output row) pairs, the output rows and
    /// the number of segmented dimensions of `data`.
    fn unsorted(&self, ctx: &OpContext<'_>, data: &Tensor) -> Result<Plan> {
        let (ids, num) = (input(ctx, 1)?, input(ctx, 2)?);
        if num.rank() != 0 {
            return Err(ctx.invalid(format!(
                "num_segments should be a scalar, not shape {}",
                num.shape()
            )));
        }
        let rows = int_scalar(ctx, &num, "num_segments")?;
        if rows < 0 {
            return Err(ctx.invalid(format!(
                "Input num_segments == {rows} must not be negative."
            )));
        }
        if !data.dims().starts_with(ids.dims()) {
            return Err(ctx.invalid(format!(
                "data.shape = {} does not start with segment_ids.shape = {}",
                data.shape(),
                ids.shape()
            )));
        }
        let mut pairs = Vec::with_capacity(ids.num_elements());
        for (i, &id) in int_values(ctx, &ids, "segment_ids")?.iter().enumerate() {
            if id < 0 {
                continue; // TensorFlow drops the rows of negative ids.
            }
            if id >= rows {
                return Err(ctx.invalid(format!(
                    "segment_ids{} = {id} is out of range [0, {rows})",
                    position(ids.dims(), i)
                )));
            }
            pairs.push((i, id as usize));
        }
        Ok(Plan {
            pairs,
            rows: rows as usize,
            segmented: ids.rank(),
        })
    }

    /// `Segment*`: sorted ids, one per row of `data`.
    fn sorted(&self, ctx: &OpContext<'_>, data: &Tensor) -> Result<Plan> {
        let ids = input(ctx, 1)?;
        if ids.rank() != 1 {
            return Err(ctx.invalid("segment_ids should be a vector."));
        }
        if data.dims().first() != Some(&ids.num_elements()) {
            return Err(ctx.invalid("segment_ids should be the same size as dimension 0 of input."));
        }
        let ids = int_values(ctx, &ids, "segment_ids")?;
        let rows = sorted_rows(ctx, &ids, None)?;
        let pairs = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| (i, id as usize))
            .collect();
        Ok(Plan {
            pairs,
            rows,
            segmented: 1,
        })
    }

    /// `SparseSegment*`: rows `indices[i]` of `data` into segments `segment_ids[i]` (sorted).
    fn sparse(&self, ctx: &OpContext<'_>, data: &Tensor, with_num: bool) -> Result<Plan> {
        let (indices, ids) = (input(ctx, 1)?, input(ctx, 2)?);
        if indices.rank() != 1 {
            return Err(ctx.invalid("indices should be a vector."));
        }
        if ids.rank() != 1 {
            return Err(ctx.invalid("segment_ids should be a vector."));
        }
        if indices.num_elements() != ids.num_elements() {
            return Err(ctx.invalid("segment_ids and indices should have same size."));
        }
        if data.rank() == 0 {
            return Err(ctx.invalid("data must be at least 1-D, got a scalar"));
        }
        let num = if with_num {
            let num = input(ctx, 3)?;
            Some(int_scalar(ctx, &num, "num_segments")?)
        } else {
            None
        };
        let ids = int_values(ctx, &ids, "segment_ids")?;
        let rows = sorted_rows(ctx, &ids, num)?;
        let limit = data.dims()[0];
        let mut pairs = Vec::with_capacity(ids.len());
        for (i, (&index, &id)) in int_values(ctx, &indices, "indices")?
            .iter()
            .zip(&ids)
            .enumerate()
        {
            if index < 0 || index as usize >= limit {
                return Err(ctx.invalid(format!(
                    "Bad: indices[{i}] == {index} out of range [0, {limit})"
                )));
            }
            pairs.push((index as usize, id as usize));
        }
        Ok(Plan {
            pairs,
            rows,
            segmented: 1,
        })
    }
}

/// What a segment op reduces: (source row, output row) pairs into `rows` rows, the rows of
/// `data` being its first `segmented` dimensions.
struct Plan {
    pairs: Vec<(usize, usize)>,
    rows: usize,
    segmented: usize,
}

/// Checks sorted segment ids as TensorFlow does and returns the output's row count: the last
/// id plus one, or `num_segments` when given.
fn sorted_rows(ctx: &OpContext<'_>, ids: &[i64], num_segments: Option<i64>) -> Result<usize> {
    let last = ids.last().copied();
    let rows = match num_segments {
        Some(n) => {
            if n < 0 {
                return Err(ctx.invalid(format!("Input num_segments == {n} must not be negative.")));
            }
            if last.is_some_and(|l| l >= n) {
                return Err(ctx.invalid("segment ids must be < num_segments"));
            }
            n
        }
        None => {
            let rows = last.map_or(0, |l| l + 1);
            if rows < 0 {
                return Err(ctx.invalid("segment ids must be >= 0"));
            }
            rows
        }
    };
    // TensorFlow checks that a run of ids is followed by a larger id before it checks the
    // run's id against the output's rows; the order decides which message a bad input gets.
    for (i, &id) in ids.iter().enumerate() {
        if ids.get(i + 1).is_some_and(|&next| next < id) {
            return Err(ctx.invalid("segment ids are not increasing"));
        }
        if id < 0 || id >= rows {
            return Err(ctx.invalid(format!(
                "Segment id {id} out of range [0, {rows}), possibly because 'segment_ids' input \
                 is not sorted."
            )));
        }
    }
    Ok(rows as usize)
}

/// Where flat element `i` of a tensor of shape `dims` sits, as TensorFlow writes it: `[1,0]`.
fn position(dims: &[usize], i: usize) -> String {
    if dims.is_empty() {
        String::new()
    } else {
        format!("[{}]", unravel(i, dims))
    }
}

impl OpKernel for Segments {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let data = input(ctx, 0)?;
        let plan = match self.family {
            Family::Unsorted => self.unsorted(ctx, &data)?,
            Family::Sorted => self.sorted(ctx, &data)?,
            Family::Sparse { num_segments } => self.sparse(ctx, &data, num_segments)?,
        };
        let mut dims = vec![plan.rows];
        dims.extend_from_slice(&data.dims()[plan.segmented..]);
        super::checked_elements(ctx, &dims)?;
        let inner: usize = data.dims()[plan.segmented..].iter().product();
        let empty_is_zero = self.family != Family::Unsorted;
        let reduce = self.reduce;
        let out = if matches!(reduce, Reduce::Mean | Reduce::SqrtN)
            && matches!(self.family, Family::Sparse { .. })
        {
            dispatch_float!(ctx, data.dtype(), T => {
                let v = data.values::<T>()?;
                Tensor::from_vec(dims, reduce_rows(&v, inner, &plan.pairs, plan.rows, reduce, empty_is_zero))?
            })
        } else {
            dispatch_real!(ctx, data.dtype(), T => {
                let v = data.values::<T>()?;
                Tensor::from_vec(dims, reduce_rows(&v, inner, &plan.pairs, plan.rows, reduce, empty_is_zero))?
            })
        };
        ctx.set_output(0, out);
        Ok(())
    }
}

/// `SparseSegment{Sum,Mean,SqrtN}Grad(grad, indices, segment_ids, output_dim0)`: the gradient
/// of the sparse reduction with respect to `data`, dense (`output_dim0` rows); the `V2` forms
/// return only the rows `indices` touch, with those rows' sorted unique indices.
struct SparseSegmentGrad {
    reduce: Reduce,
    sparse_output: bool,
}

impl SparseSegmentGrad {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(SparseSegmentGrad {
            reduce: Reduce::of(&node.op),
            sparse_output: node.op.ends_with("V2"),
        }))
    }

    fn compute_typed<T: Real>(
        &self,
        grad: &Tensor,
        rows: &[usize],
        segments: &[usize],
        counts: &[usize],
        out_rows: usize,
    ) -> Result<Vec<T>> {
        let inner: usize = grad.dims()[1..].iter().product();
        let g = grad.values::<T>()?;
        let mut out = vec![T::default(); out_rows * inner];
        for (&row, &segment) in rows.iter().zip(segments) {
            let scale = self.reduce.finish(T::one(), counts[segment]);
            let from = &g[segment * inner..(segment + 1) * inner];
            for (o, &x) in out[row * inner..(row + 1) * inner].iter_mut().zip(from) {
                *o = Real::add(*o, Real::mul(x, scale));
            }
        }
        Ok(out)
    }
}

impl OpKernel for SparseSegmentGrad {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (grad, indices, ids, dim0) = (
            input(ctx, 0)?,
            input(ctx, 1)?,
            input(ctx, 2)?,
            input(ctx, 3)?,
        );
        if dim0.num_elements() != 1 || dim0.rank() > 1 {
            return Err(ctx.invalid("output_dim0 should be a scalar."));
        }
        let dim0 = int_scalar(ctx, &dim0, "output_dim0")?;
        if indices.rank() != 1 {
            return Err(ctx.invalid("indices should be a vector."));
        }
        if ids.rank() != 1 {
            return Err(ctx.invalid("segment_ids should be a vector."));
        }
        if indices.num_elements() != ids.num_elements() {
            return Err(ctx.invalid("segment_ids and indices should have same size."));
        }
        if grad.rank() == 0 {
            return Err(ctx.invalid("grad must be at least 1-D, got a scalar"));
        }
        let num_segments = grad.dims()[0] as i64;
        let ids = int_values(ctx, &ids, "segment_ids")?;
        if ids.last().is_some_and(|&l| l >= num_segments) {
            return Err(ctx.invalid("Invalid number of segments"));
        }
        let raw = int_values(ctx, &indices, "indices")?;
        let mut counts = vec![0usize; num_segments as usize];
        let (mut rows, mut segments) = (Vec::with_capacity(raw.len()), Vec::new());
        for (&index, &id) in raw.iter().zip(&ids) {
            if index < 0 || index >= dim0 {
                return Err(ctx.invalid(format!("Index {index} out of range [0, {dim0}).")));
            }
            if id < 0 || id >= num_segments {
                return Err(
                    ctx.invalid(format!("Segment id {id} out of range [0, {num_segments})."))
                );
            }
            counts[id as usize] += 1;
            rows.push(index as usize);
            segments.push(id as usize);
        }
        // The V2 forms write into one row per distinct index, in sorted order.
        let (out_rows, unique) = if self.sparse_output {
            let mut unique = rows.clone();
            unique.sort_unstable();
            unique.dedup();
            for row in &mut rows {
                *row = unique.binary_search(row).unwrap_or_default();
            }
            (unique.len(), Some(unique))
        } else {
            (dim0 as usize, None)
        };
        let mut dims = grad.dims().to_vec();
        dims[0] = out_rows;
        super::checked_elements(ctx, &dims)?;
        let out = dispatch_float!(ctx, grad.dtype(), T => {
            Tensor::from_vec(dims, self.compute_typed::<T>(&grad, &rows, &segments, &counts, out_rows)?)?
        });
        ctx.set_output(0, out);
        if let Some(unique) = unique {
            let n = unique.len();
            let unique: Vec<i64> = unique.into_iter().map(|r| r as i64).collect();
            ctx.set_output(1, int_tensor(indices.dtype(), vec![n], unique)?);
        }
        Ok(())
    }
}

/// An int32 or int64 tensor of `dtype` (the dtype an index output takes from its attr).
fn int_tensor(dtype: DType, dims: Vec<usize>, values: Vec<i64>) -> Result<Tensor> {
    if dtype == DType::Int64 {
        Tensor::from_vec(dims, values)
    } else {
        Tensor::from_vec(
            dims,
            values.into_iter().map(|v| v as i32).collect::<Vec<_>>(),
        )
    }
}

/// The number of each key `Unique` has seen, hashed with foldhash: the ids of an embedding's
/// sparse gradient go through it every step (2,048 a step in the wide-and-deep model, whose
/// map took 44-59 µs with the standard library's SipHash and 23-27 µs with foldhash).
type IdMap<K> = HashMap<K, i64, foldhash::fast::RandomState>;

/// An element that `Unique` can tell apart from others: a hashable key, `None` for a value
/// equal to nothing (a NaN). `0.0` and `-0.0` share a key, as they compare equal.
trait UniqueKey: Items {
    type Key: Hash + Eq;
    fn key(&self) -> Option<Self::Key>;
}

macro_rules! int_key {
    ($($t:ty),*) => {
        $(impl UniqueKey for $t {
            type Key = i64;
            fn key(&self) -> Option<i64> {
                Some(i64::from(*self))
            }
        })*
    };
}

int_key!(i32, i64, bool);

impl UniqueKey for f32 {
    type Key = u32;
    fn key(&self) -> Option<u32> {
        (!self.is_nan()).then(|| if *self == 0.0 { 0 } else { self.to_bits() })
    }
}

impl UniqueKey for f64 {
    type Key = u64;
    fn key(&self) -> Option<u64> {
        (!self.is_nan()).then(|| if *self == 0.0 { 0 } else { self.to_bits() })
    }
}

/// The dtypes moved as their bytes key by their bits: exact for the integer types; a float16's
/// or bfloat16's `-0.0` and NaN count as values of their own.
impl<const N: usize> UniqueKey for super::items::Raw<N> {
    type Key = [u8; N];
    fn key(&self) -> Option<[u8; N]> {
        Some(self.0)
    }
}

impl UniqueKey for Bytes {
    type Key = Bytes;
    fn key(&self) -> Option<Bytes> {
        Some(self.clone())
    }
}

/// `Unique(x)` and `UniqueV2(x, axis)`: the distinct elements (or slices along `axis`) of `x`
/// in order of first occurrence, and for each element the position of its value among them.
struct Unique {
    out_idx: DType,
}

impl Unique {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let out_idx = match attr::get(node, "out_idx") {
            Some(_) => attr::dtype(node, "out_idx")?,
            None => DType::Int32,
        };
        Ok(Arc::new(Unique { out_idx }))
    }

    /// The slices of `x` along `axis` (of `n`), numbered by first occurrence: returns the
    /// position of each distinct slice's first occurrence and each slice's number.
    fn first_occurrences<T: UniqueKey>(x: &Tensor, axis: usize) -> Result<(Vec<usize>, Vec<i64>)> {
        let values = T::items(x)?;
        let dims = x.dims();
        let n = dims[axis];
        let outer: usize = dims[..axis].iter().product();
        let inner: usize = dims[axis + 1..].iter().product();
        if outer * inner == 1 {
            return Ok(Self::first_occurrences_1d(&values));
        }
        let mut seen: IdMap<Vec<T::Key>> = IdMap::default();
        let (mut firsts, mut idx) = (Vec::new(), Vec::with_capacity(n));
        for j in 0..n {
            let mut key = Vec::with_capacity(outer * inner);
            let mut comparable = true;
            for o in 0..outer {
                let start = (o * n + j) * inner;
                for v in &values[start..start + inner] {
                    match v.key() {
                        Some(k) => key.push(k),
                        None => comparable = false,
                    }
                }
            }
            let next = firsts.len() as i64;
            let number = if comparable {
                *seen.entry(key).or_insert(next)
            } else {
                next
            };
            if number == next {
                firsts.push(j);
            }
            idx.push(number);
        }
        Ok((firsts, idx))
    }
}

impl Unique {
    /// [`Unique::first_occurrences`] of single elements, without a key per slice (the ids
    /// of a sparse gradient come through here on every step).
    fn first_occurrences_1d<T: UniqueKey>(values: &[T]) -> (Vec<usize>, Vec<i64>) {
        let mut seen = IdMap::with_capacity_and_hasher(values.len(), Default::default());
        let (mut firsts, mut idx) = (Vec::new(), Vec::with_capacity(values.len()));
        for (j, v) in values.iter().enumerate() {
            let next = firsts.len() as i64;
            let number = match v.key() {
                Some(k) => *seen.entry(k).or_insert(next),
                None => next,
            };
            if number == next {
                firsts.push(j);
            }
            idx.push(number);
        }
        (firsts, idx)
    }
}

impl OpKernel for Unique {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = input(ctx, 0)?;
        let axis = if ctx.node().op == "UniqueV2" {
            let axis = int_values(ctx, &input(ctx, 1)?, "axis")?;
            match axis.as_slice() {
                [] => None,
                [a] => {
                    let rank = x.rank() as i64;
                    let a = if *a < 0 { a + rank } else { *a };
                    if !(0..rank).contains(&a) {
                        return Err(ctx.invalid(format!("axis has to be between [0, {rank})")));
                    }
                    Some(a as usize)
                }
                _ => {
                    return Err(ctx.invalid(format!(
                        "Axis argument should be a scalar or a vector of one element, got {} \
                         elements",
                        axis.len()
                    )))
                }
            }
        } else {
            None
        };
        if axis.is_none() && x.rank() != 1 {
            return Err(ctx.invalid("unique expects a 1D vector."));
        }
        let axis = axis.unwrap_or(0);
        let (firsts, idx) = dispatch_items!(ctx, x.dtype(), T => {
            Self::first_occurrences::<T>(&x, axis)?
        });
        let picks: Vec<i64> = firsts.iter().map(|&j| j as i64).collect();
        let picks = Tensor::from_vec([picks.len()], picks)?;
        let y = gather_batched(ctx, &x, &picks, axis, 0)?;
        let n = idx.len();
        ctx.set_output(0, y);
        ctx.set_output(1, int_tensor(self.out_idx, vec![n], idx)?);
        Ok(())
    }
}

/// DynamicPartition(data, partitions): output `p` stacks, in order, the slices of `data`
/// whose partition is `p` (`partitions.shape` is a prefix of `data.shape`).
fn dynamic_partition(ctx: &mut OpContext<'_>) -> Result<()> {
    let (data, partitions) = (input(ctx, 0)?, input(ctx, 1)?);
    let num = attr::int(ctx.node(), "num_partitions")?;
    if !data.dims().starts_with(partitions.dims()) {
        return Err(ctx.invalid(format!(
            "data.shape must start with partitions.shape, got data.shape = {}, \
             partitions.shape = {}",
            data.shape(),
            partitions.shape()
        )));
    }
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); num.max(0) as usize];
    for (i, &p) in int_values(ctx, &partitions, "partitions")?
        .iter()
        .enumerate()
    {
        if p < 0 || p >= num {
            return Err(ctx.invalid(format!(
                "partitions{} = {p} is not in [0, {num})",
                position(partitions.dims(), i)
            )));
        }
        members[p as usize].push(i);
    }
    let tail = &data.dims()[partitions.rank()..];
    let inner: usize = tail.iter().product();
    let outs: Vec<Tensor> = dispatch_items!(ctx, data.dtype(), T => {
        let values = T::items(&data)?;
        members
            .iter()
            .map(|rows| {
                let mut out = Vec::with_capacity(rows.len() * inner);
                for &r in rows {
                    out.extend_from_slice(&values[r * inner..(r + 1) * inner]);
                }
                let mut dims = vec![rows.len()];
                dims.extend_from_slice(tail);
                T::tensor(dims, out)
            })
            .collect::<Result<_>>()?
    });
    for (i, t) in outs.into_iter().enumerate() {
        ctx.set_output(i, t);
    }
    Ok(())
}

/// DynamicStitch(indices..., data...) and ParallelDynamicStitch: `merged[indices[m][i]] =
/// data[m][i]`, later inputs winning where indices repeat; rows no index names are zeros.
fn dynamic_stitch(ctx: &mut OpContext<'_>) -> Result<()> {
    let n = ctx.num_inputs() / 2;
    if n == 0 {
        return Err(ctx.invalid("DynamicStitch needs at least one indices and one data input"));
    }
    let inputs = ctx.inputs().to_vec();
    let (indices, data) = inputs.split_at(n);
    let tail0 = &data[0].dims()[indices[0].rank().min(data[0].rank())..];
    let mut all = Vec::with_capacity(n);
    let mut rows = 0i64;
    for m in 0..n {
        if !data[m].dims().starts_with(indices[m].dims()) {
            return Err(ctx.invalid(format!(
                "data[{m}].shape = {} does not start with indices[{m}].shape = {}",
                data[m].shape(),
                indices[m].shape()
            )));
        }
        let tail = &data[m].dims()[indices[m].rank()..];
        if tail != tail0 {
            return Err(ctx.invalid(format!(
                "Need data[0].shape[{}:] = {} to match data[{m}].shape[{}:] = {}",
                indices[0].rank(),
                Shape::new(tail0.to_vec()),
                indices[m].rank(),
                Shape::new(tail.to_vec())
            )));
        }
        if data[m].dtype() != data[0].dtype() {
            return Err(ctx.invalid(format!(
                "data[{m}] is {} but data[0] is {}",
                data[m].dtype(),
                data[0].dtype()
            )));
        }
        let values = int_values(ctx, &indices[m], "indices")?;
        rows = values.iter().fold(rows, |r, &v| r.max(v + 1));
        all.push(values);
    }
    for values in &all {
        if let Some(i) = values.iter().position(|&v| v < 0) {
            return Err(ctx.invalid(format!("indices[{i}] is out of range")));
        }
    }
    let mut dims = vec![rows as usize];
    dims.extend_from_slice(tail0);
    super::checked_elements(ctx, &dims)?;
    let inner: usize = tail0.iter().product();
    let out = dispatch_items!(ctx, data[0].dtype(), T => {
        stitch::<T>(&all, data, inner, dims)?
    });
    ctx.set_output(0, out);
    Ok(())
}

fn stitch<T: Items + Default>(
    indices: &[Vec<i64>],
    data: &[Tensor],
    inner: usize,
    dims: Vec<usize>,
) -> Result<Tensor> {
    let mut out = vec![T::default(); dims.iter().product()];
    for (rows, t) in indices.iter().zip(data) {
        let values = T::items(t)?;
        for (i, &row) in rows.iter().enumerate() {
            let row = row as usize;
            out[row * inner..(row + 1) * inner]
                .clone_from_slice(&values[i * inner..(i + 1) * inner]);
        }
    }
    T::tensor(dims, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reductions_fold_rows_and_fill_empty_ones() {
        let data = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let pairs = [(0, 0), (2, 0), (1, 2)];
        assert_eq!(
            reduce_rows(&data, 2, &pairs, 3, Reduce::Sum, true),
            [6.0, 8.0, 0.0, 0.0, 3.0, 4.0]
        );
        assert_eq!(
            reduce_rows(&data, 2, &pairs, 3, Reduce::Mean, true),
            [3.0, 4.0, 0.0, 0.0, 3.0, 4.0]
        );
        let max = reduce_rows(&data, 2, &pairs, 3, Reduce::Max, false);
        assert_eq!(max[2], f32::MIN);
        assert_eq!(reduce_rows(&data, 2, &pairs, 3, Reduce::Max, true)[2], 0.0);
        assert_eq!(
            Reduce::of("SparseSegmentSqrtNWithNumSegments"),
            Reduce::SqrtN
        );
        assert_eq!(Reduce::of("SparseSegmentMeanGradV2"), Reduce::Mean);
        assert_eq!(Reduce::of("UnsortedSegmentProd"), Reduce::Prod);
    }
}
