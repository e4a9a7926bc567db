//! The sparse kind: [`SparseConditionalAccumulator`] (TensorFlow's
//! `SparseConditionalAccumulator`, `sparse_conditional_accumulator.h`) sums gradients given as
//! rows (`IndexedSlices`: indices, values, an optional dense shape), so that an embedding
//! table's gradient travels and adds up as the rows a step touched, never as the table.
//!
//! Its arithmetic is TensorFlow's, to the letter, quirks included:
//! - The first gradient after a take is kept as given: its indices in their order, a
//!   repeated index as repeated entries, each entry counted once.
//! - Each later gradient is merged in one pass, as a sorted merge would be
//!   (`AddToAccumGradFunction`): while both lists last, the smaller head index is copied
//!   over, and equal heads are added into one entry whose count grows by one; then the rest
//!   of either list. For indices that arrive sorted and unique this is the sorted union with
//!   repeated rows summed; for others it is whatever that pass makes of them, as in
//!   TensorFlow (nothing sorts or deduplicates them first).
//! - MEAN divides each entry by its own count, the number of gradients merged into it
//!   (`DivideAccumGradByCounter`'s "average element-wise"), not by the number of gradients
//!   accepted: a row only one of two replicas touched comes out as that replica's row.
//! - A take returns the entries in the order they stand, the values' shape `[n, ...]` as the
//!   gradients gave it, and the dense shape `[shape[0], values' dims past the first]`, with -1
//!   for a first dimension the declared shape leaves unknown.
//!
//! As in TensorFlow, a stale gradient is dropped before it is checked (only its dtypes are,
//! as TensorFlow's op signature does), and float32 sums and divisions are done in float32.

use std::ops::{Add, Div};

use super::{Accumulator, Reduction, Sum};
use crate::error::{Result, Status};
use crate::runtime::wait::Wait;
use crate::tensor::{DType, Element, Tensor};

/// Sums sparse gradients (rows of a tensor) of one dtype until the chief takes them.
pub type SparseConditionalAccumulator = Accumulator<SparseSum>;

/// The running sum of a [`SparseConditionalAccumulator`]: the entries accepted since the last
/// take, each an index, its row of values and how many gradients were added into it.
#[derive(Default)]
pub struct SparseSum(Option<Held>);

impl Sum for SparseSum {
    const KIND: &'static str = "sparse accumulator";

    fn check_dtype(name: &str, dtype: DType) -> Result<()> {
        if !matches!(dtype, DType::Float | DType::Double) {
            return Err(Status::invalid_argument(format!(
                "sparse accumulator `{name}`: no kernel for {dtype} gradients; TensorFlow's \
                 SparseConditionalAccumulator takes float or double (and half) gradients"
            )));
        }
        Ok(())
    }
}

/// What a take returns: TensorFlow's `SparseAccumulatorTakeGradient` outputs.
#[derive(Clone, Debug)]
pub struct TakenSlices {
    /// `[n]` int64: the entries' indices, in the order they stand.
    pub indices: Tensor,
    /// `[n, ...]`: the entries' rows, averaged or summed.
    pub values: Tensor,
    /// The dense shape, int64: the declared first dimension (-1 when unknown), then the
    /// values' dimensions past the first.
    pub shape: Tensor,
}

/// The entries, in the accumulator's dtype.
enum Held {
    Float(Rows<f32>),
    Double(Rows<f64>),
}

impl Held {
    /// The values' dimensions: `[n, ...]`.
    fn values_dims(&self) -> Vec<usize> {
        match self {
            Held::Float(r) => r.values_dims(),
            Held::Double(r) => r.values_dims(),
        }
    }
}

/// Entries `i`: `indices[i]`, the row `values[i * width..(i + 1) * width]`, `counts[i]`.
struct Rows<T> {
    indices: Vec<i64>,
    counts: Vec<i32>,
    /// The values' dimensions past the first (a row's shape).
    row_dims: Vec<usize>,
    values: Vec<T>,
}

/// The element types a sparse accumulator holds (TensorFlow registers its CPU kernel for
/// half, float and double; tessera has no half).
trait Value: Element + Add<Output = Self> + Div<Output = Self> {
    fn from_count(count: i32) -> Self;
    fn hold(rows: Rows<Self>) -> Held;
    fn held(held: Held) -> Option<Rows<Self>>;
}

impl Value for f32 {
    fn from_count(count: i32) -> Self {
        count as f32
    }
    fn hold(rows: Rows<Self>) -> Held {
        Held::Float(rows)
    }
    fn held(held: Held) -> Option<Rows<Self>> {
        match held {
            Held::Float(r) => Some(r),
            Held::Double(_) => None,
        }
    }
}

impl Value for f64 {
    fn from_count(count: i32) -> Self {
        f64::from(count)
    }
    fn hold(rows: Rows<Self>) -> Held {
        Held::Double(rows)
    }
    fn held(held: Held) -> Option<Rows<Self>> {
        match held {
            Held::Double(r) => Some(r),
            Held::Float(_) => None,
        }
    }
}

impl<T: Value> Rows<T> {
    fn width(&self) -> usize {
        self.row_dims.iter().product()
    }

    fn values_dims(&self) -> Vec<usize> {
        std::iter::once(self.indices.len())
            .chain(self.row_dims.iter().copied())
            .collect()
    }

    /// The first gradient after a take, kept as given (`AllocateAndAssignToAccumGradFunction`):
    /// rows of shape `row_dims`.
    fn first(indices: Vec<i64>, row_dims: &[usize], values: Vec<T>) -> Self {
        Rows {
            counts: vec![1; indices.len()],
            indices,
            row_dims: row_dims.to_vec(),
            values,
        }
    }

    /// Merges a later gradient in TensorFlow's one pass (see the module doc).
    fn merge(self, indices: &[i64], values: &[T]) -> Self {
        let width = self.width();
        let capacity = self.indices.len() + indices.len();
        let mut out = Rows {
            indices: Vec::with_capacity(capacity),
            counts: Vec::with_capacity(capacity),
            row_dims: self.row_dims.clone(),
            values: Vec::with_capacity(capacity * width),
        };
        let (mut i, mut j) = (0, 0);
        while i < self.indices.len() || j < indices.len() {
            let from_accum =
                j == indices.len() || (i < self.indices.len() && self.indices[i] < indices[j]);
            let from_grad =
                i == self.indices.len() || (j < indices.len() && indices[j] < self.indices[i]);
            if from_accum {
                out.indices.push(self.indices[i]);
                out.counts.push(self.counts[i]);
                out.values.extend_from_slice(row(&self.values, width, i));
                i += 1;
            } else if from_grad {
                out.indices.push(indices[j]);
                out.counts.push(1);
                out.values.extend_from_slice(row(values, width, j));
                j += 1;
            } else {
                out.indices.push(self.indices[i]);
                out.counts.push(self.counts[i].saturating_add(1));
                let sum = row(&self.values, width, i)
                    .iter()
                    .zip(row(values, width, j))
                    .map(|(&a, &g)| g + a);
                out.values.extend(sum);
                i += 1;
                j += 1;
            }
        }
        out
    }

    /// The take's outputs; MEAN divides each entry by its count.
    fn into_taken(mut self, reduction: Reduction, dim0: i64) -> Result<TakenSlices> {
        let width = self.width();
        if reduction == Reduction::Mean && width > 0 {
            for (row, &count) in self.values.chunks_mut(width).zip(&self.counts) {
                let count = T::from_count(count);
                for v in row {
                    *v = *v / count;
                }
            }
        }
        let dims = self.values_dims();
        let mut shape = vec![dim0];
        shape.extend(self.row_dims.iter().map(|&d| d as i64));
        Ok(TakenSlices {
            indices: Tensor::from_vec([self.indices.len()], self.indices)?,
            values: Tensor::from_vec(dims, self.values)?,
            shape: Tensor::from_vec([shape.len()], shape)?,
        })
    }
}

/// Row `i` of `values`, rows being `width` long.
fn row<T>(values: &[T], width: usize, i: usize) -> &[T] {
    &values[i * width..(i + 1) * width]
}

impl Accumulator<SparseSum> {
    /// Adds the gradient whose rows `indices` (`[n]`, int64) hold `values` (`[n, ...]`),
    /// computed at `local_step`; `dense_shape` (int64), when known, is checked against the
    /// declared shape. Returns whether it was accepted (a stale gradient is dropped).
    pub fn apply(
        &self,
        local_step: i64,
        indices: &Tensor,
        values: &Tensor,
        dense_shape: Option<&Tensor>,
    ) -> Result<bool> {
        self.apply_from(local_step, indices, values, dense_shape, None)
    }

    /// [`apply`](Self::apply) for a gradient from `replica` (e.g. `/job:worker/task:1`), which
    /// the accumulator remembers so that a take that times out can name who is missing.
    pub fn apply_from(
        &self,
        local_step: i64,
        indices: &Tensor,
        values: &Tensor,
        dense_shape: Option<&Tensor>,
        replica: Option<&str>,
    ) -> Result<bool> {
        if values.dtype() != self.dtype {
            return Err(self.invalid(format!(
                "holds {} gradients, got {} values; cast them to {}",
                self.dtype,
                values.dtype(),
                self.dtype
            )));
        }
        for (what, t) in [("indices", Some(indices)), ("shape", dense_shape)] {
            if let Some(t) = t.filter(|t| t.dtype() != DType::Int64) {
                return Err(self.invalid(format!(
                    "the gradient's {what} must be int64, got {}; cast them to int64",
                    t.dtype()
                )));
            }
        }
        match self.dtype {
            DType::Float => {
                self.apply_typed::<f32>(local_step, indices, values, dense_shape, replica)
            }
            _ => self.apply_typed::<f64>(local_step, indices, values, dense_shape, replica),
        }
    }

    fn apply_typed<T: Value>(
        &self,
        local_step: i64,
        indices: &Tensor,
        values: &Tensor,
        dense_shape: Option<&Tensor>,
        replica: Option<&str>,
    ) -> Result<bool> {
        self.accept(local_step, replica, |sum, count| {
            let held = sum.0.as_ref().filter(|_| count > 0);
            let accumulated = held.map(Held::values_dims);
            let indices = self.validate(indices, values, dense_shape, accumulated.as_deref())?;
            // Everything that can fail comes before the sum is taken apart.
            let grad = values.values::<T>()?;
            let rows = match sum.0.take().filter(|_| count > 0).and_then(T::held) {
                Some(rows) => rows.merge(&indices, &grad),
                None => Rows::first(indices, &values.dims()[1..], grad.into_owned()),
            };
            sum.0 = Some(T::hold(rows));
            Ok(())
        })
    }

    /// TensorFlow's checks of an accepted gradient (`GetAndValidateTensorInputForApplyGrad`
    /// and `ValidateShape`), with its messages; returns the indices. `accumulated` is the
    /// values' shape of the gradients accepted since the last take, if any.
    fn validate(
        &self,
        indices: &Tensor,
        values: &Tensor,
        dense_shape: Option<&Tensor>,
        accumulated: Option<&[usize]>,
    ) -> Result<Vec<i64>> {
        if indices.rank() != 1 {
            return Err(self.invalid(format!(
                "Input indices should be vector but received shape: {}",
                indices.shape()
            )));
        }
        let nnz = indices.dims()[0];
        if values.rank() == 0 {
            return Err(self.invalid("Values cannot be 0-dimensional."));
        }
        if values.dims()[0] != nnz {
            return Err(self.invalid(format!(
                "Expected {nnz} non-empty input values, got {}",
                values.dims()[0]
            )));
        }
        // An unknown rank declares nothing to check against (TensorFlow's dims() of -1).
        let declared = self.shape.dims().unwrap_or(&[]);
        if let Some(dense_shape) = dense_shape {
            let given = dense_shape.values::<i64>()?;
            if declared.len() > given.len() {
                return Err(self.invalid(format!(
                    "Shape mismatch: expected shape rank at least {}, got {}",
                    declared.len(),
                    given.len()
                )));
            }
            for (i, (want, got)) in declared.iter().zip(given.iter()).enumerate() {
                if let Some(want) = want.filter(|&w| w as i64 != *got) {
                    return Err(self.invalid(format!(
                        "Shape mismatch: expected shape dim {i} to be {want}, got {got}"
                    )));
                }
            }
        }
        let indices = indices.values::<i64>()?.into_owned();
        // As TensorFlow, only indices past the first dimension are refused, not negative ones
        // (the update that uses the rows refuses those).
        if let Some(Some(rows)) = declared.first() {
            if let Some((i, index)) = indices
                .iter()
                .enumerate()
                .find(|(_, &index)| index >= *rows as i64)
            {
                return Err(self.invalid(format!(
                    "Shape mismatch: index of slice {i} exceeded limits of shape; index is \
                     {index} exceeded {rows}"
                )));
            }
        }
        match accumulated {
            Some(dims) => {
                if dims.len() != values.rank() {
                    return Err(self.invalid(format!(
                        "Shape mismatch: expected values rank {}, got {}",
                        dims.len(),
                        values.rank()
                    )));
                }
                let mut pairs = dims.iter().zip(values.dims()).enumerate().skip(1);
                if let Some((i, (want, got))) = pairs.find(|(_, (w, g))| w != g) {
                    return Err(self.invalid(format!(
                        "Shape mismatch: expected values dim {i} to be {want}, got {got}"
                    )));
                }
            }
            None => {
                if declared.len() > values.rank() {
                    return Err(self.invalid(format!(
                        "Shape mismatch: expected values rank at least {}, got {}",
                        declared.len(),
                        values.rank()
                    )));
                }
                for (i, want) in declared.iter().enumerate().skip(1) {
                    if let Some(want) = want.filter(|&w| w != values.dims()[i]) {
                        return Err(self.invalid(format!(
                            "Shape mismatch: expected values dim {i} to be {want}, got {}",
                            values.dims()[i]
                        )));
                    }
                }
            }
        }
        Ok(indices)
    }

    /// Waits until `num_required` gradients were accepted, then returns their rows averaged
    /// (or summed) as TensorFlow does (see the module doc), resets the accumulator and
    /// advances its global step by one.
    pub fn take(&self, num_required: i64, wait: &Wait) -> Result<TakenSlices> {
        let dim0 = match self.shape.dims() {
            Some([Some(rows), ..]) => *rows as i64,
            _ => -1,
        };
        self.take_with(num_required, wait, |sum, _| {
            let held = sum.0.take().ok_or_else(|| {
                Status::internal(format!(
                    "sparse accumulator `{}` counted gradients but holds none",
                    self.name
                ))
            })?;
            match held {
                Held::Float(rows) => rows.into_taken(self.reduction, dim0),
                Held::Double(rows) => rows.into_taken(self.reduction, dim0),
            }
        })
    }

    /// INVALID_ARGUMENT naming the accumulator.
    fn invalid(&self, message: impl std::fmt::Display) -> Status {
        Status::invalid_argument(format!("sparse accumulator `{}`: {message}", self.name))
    }
}
