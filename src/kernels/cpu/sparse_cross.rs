//! The kernels of crossed feature columns: `SparseCross`, `SparseCrossHashed` and
//! `SparseCrossV2` (`tf.sparse.cross`, `tf.sparse.cross_hashed`, `crossed_column`).
//!
//! Each takes `N` sparse columns (indices `[n, 2]`, values, dense shape `[batch, width]`) and
//! any number of dense `[batch, width]` columns, int64 or string, and outputs, for each batch
//! row, every combination of one feature per column (the last column varying fastest), as a
//! sparse `[batch, most crosses in a row]` tensor. A cross is either the features' strings
//! joined by a separator (`"a_X_b"`; an int64 is written in decimal) or a hash: farmhash
//! `Fingerprint64` of each string feature, chained with TensorFlow's `FingerprintCat64`, modulo
//! `num_buckets` (modulo `i64::MAX` when it is 0).
//!
//! The semantics are TensorFlow 2.21's `sparse_cross_op.cc`, quirks included:
//! - `SparseCross` hashes an int64 feature as itself and starts the chain at `hash_key`;
//!   `SparseCrossHashed` starts it at the first feature and hashes a sparse int64 feature as
//!   the `Fingerprint64` (or, under `strong_hash`, the SipHash-2-4 keyed by `salt`) of its four
//!   low bytes (TensorFlow hashes `sizeof(DataType)` bytes of it), a dense one as itself
//!   unless `strong_hash`;
//! - a sparse column's features for batch row `b` are the run of entries, from where the last
//!   row's run ended, whose row index is `b`: rows out of order or past the batch lose their
//!   features, as in TensorFlow, rather than failing.
//!
//! Every batch row's crosses are made on their own, split over the intra-op pool; the outputs
//! go through the memory budget before they are allocated. Bad inputs fail with TensorFlow's
//! messages.

use std::sync::Arc;

use bytes::Bytes;

use super::fingerprint::{fingerprint64, sip_hash_24};
use super::{input, unsupported_dtype, MAX_ELEMENTS};
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::NodeDef;
use crate::tensor::{DType, Tensor};

/// Returns the factory for a cross op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "SparseCross" => Cross::v1,
        "SparseCrossHashed" => |node| Cross::create(node, Kind::Hashed),
        "SparseCrossV2" => |node| Cross::create(node, Kind::Joined),
        _ => return None,
    };
    Some(factory)
}

/// TensorFlow's `FingerprintCat64`: combines two fingerprints into one.
pub(crate) fn fingerprint_cat64(fp1: u64, fp2: u64) -> u64 {
    const MUL: u64 = 0xc6a4_a793_5bd1_e995;
    let shift_mix = |v: u64| v ^ (v >> 47);
    let mut result = fp1 ^ MUL;
    result ^= shift_mix(fp2.wrapping_mul(MUL)).wrapping_mul(MUL);
    result = result.wrapping_mul(MUL);
    result = shift_mix(result).wrapping_mul(MUL);
    shift_mix(result)
}

/// What a cross op makes of each combination.
#[derive(Clone, Copy)]
enum Kind {
    /// `SparseCross` with `hashed_output`: hashes chained from `hash_key`, int64 features as
    /// themselves.
    Hashed1 { num_buckets: u64, hash_key: u64 },
    /// `SparseCross` without `hashed_output`: strings joined by `_X_`; `strings_only` when
    /// `internal_type` is string, which refuses int64 features.
    Joined1 { strings_only: bool },
    /// `SparseCrossHashed`: keyed hashes chained from the first feature.
    Hashed,
    /// `SparseCrossV2`: strings joined by the `sep` input.
    Joined,
}

struct Cross {
    kind: Kind,
    /// The number of sparse columns (`N`).
    sparse: usize,
    /// The number of dense columns.
    dense: usize,
}

impl Cross {
    fn create(node: &NodeDef, kind: Kind) -> Result<Arc<dyn OpKernel>> {
        let sparse = usize::try_from(attr::int(node, "N")?).unwrap_or(0);
        let dense = attr::dtype_list(node, "dense_types")?.len();
        Ok(Arc::new(Cross {
            kind,
            sparse,
            dense,
        }))
    }

    fn v1(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let num_buckets = attr::int(node, "num_buckets")?;
        let num_buckets = u64::try_from(num_buckets).map_err(|_| {
            Status::invalid_argument(format!(
                "node `{}` (op {}): Value for attr 'num_buckets' of {num_buckets} must be at \
                 least minimum 0",
                node.name, node.op
            ))
        })?;
        let kind = if attr::bool(node, "hashed_output")? {
            Kind::Hashed1 {
                num_buckets,
                hash_key: attr::int(node, "hash_key")? as u64,
            }
        } else {
            Kind::Joined1 {
                strings_only: attr::dtype(node, "internal_type")? == DType::String,
            }
        };
        Self::create(node, kind)
    }
}

/// One column's features: a flat list of values and, per batch row, where its run starts
/// and how long it is.
struct Column<'a> {
    values: Values<'a>,
    /// Per batch row: (first value, count).
    runs: Vec<(usize, usize)>,
    dense: bool,
}

/// A column's values.
enum Values<'a> {
    Int(std::borrow::Cow<'a, [i64]>),
    Str(&'a [Bytes]),
}

impl Values<'_> {
    fn of<'t>(ctx: &OpContext<'_>, t: &'t Tensor) -> Result<Values<'t>> {
        match t.dtype() {
            DType::Int64 => Ok(Values::Int(t.values::<i64>()?)),
            DType::String => Ok(Values::Str(t.strings()?)),
            other => Err(unsupported_dtype(
                ctx,
                other,
                &[DType::Int64, DType::String],
            )),
        }
    }
}

/// TensorFlow's number for a dtype in its messages (`DataType` printed as an int).
fn enum_number(dtype: DType) -> i32 {
    dtype.to_proto() as i32
}

/// How the features of one column become what a cross combines.
impl Column<'_> {
    /// The feature at flat index `i` as a hash for `kind`.
    fn hash(&self, i: usize, kind: Kind, strong: Option<[u64; 2]>) -> u64 {
        match (&self.values, kind, strong) {
            (Values::Str(s), _, Some(key)) => sip_hash_24(key, &s[i]),
            (Values::Str(s), _, None) => fingerprint64(&s[i]),
            (Values::Int(v), Kind::Hashed, Some(key)) => sip_hash_24(key, &v[i].to_le_bytes()[..4]),
            (Values::Int(v), Kind::Hashed, None) if !self.dense => {
                fingerprint64(&v[i].to_le_bytes()[..4])
            }
            (Values::Int(v), _, _) => v[i] as u64,
        }
    }

    /// The feature at flat index `i` as the bytes a joined cross writes.
    fn bytes(&self, i: usize) -> Bytes {
        match &self.values {
            Values::Str(s) => s[i].clone(),
            Values::Int(v) => Bytes::from(v[i].to_string()),
        }
    }
}

/// The debug form of a tensor's shape, as TensorFlow prints it (`[1,3]`).
fn shape_of(t: &Tensor) -> String {
    t.shape().to_string()
}

impl Cross {
    /// TensorFlow's `ValidateInput`; returns the batch size.
    fn validate(&self, ctx: &OpContext<'_>, inputs: &[Tensor]) -> Result<usize> {
        let n = self.sparse;
        let (indices, rest) = inputs.split_at(n);
        let (values, rest) = rest.split_at(n);
        let (shapes, dense) = rest.split_at(n);
        let dense = &dense[..self.dense];
        let strings_only = matches!(self.kind, Kind::Joined1 { strings_only: true });
        for (i, t) in indices.iter().enumerate() {
            if t.rank() != 2 {
                return Err(ctx.invalid(format!(
                    "Input indices should be a matrix but received shape {} at position {i}",
                    shape_of(t)
                )));
            }
            if t.dims()[1] != 2 {
                return Err(ctx.invalid(format!(
                    "Expected D2 of index to be 2 got {} at position {i}",
                    t.dims()[1]
                )));
            }
        }
        for (i, t) in values.iter().enumerate() {
            if strings_only && t.dtype() == DType::Int64 {
                return Err(ctx.invalid(format!(
                    "Input values should be of internal type {} but received {}",
                    enum_number(DType::String),
                    enum_number(t.dtype())
                )));
            }
            if t.rank() != 1 {
                return Err(ctx.invalid(format!(
                    "Input values should be a vector but received shape {} at position {i}",
                    shape_of(t)
                )));
            }
            if indices[i].dims()[0] != t.dims()[0] {
                return Err(ctx.invalid(format!(
                    "Expected size of values to be {} got {} at position {i}",
                    indices[i].dims()[0],
                    t.dims()[0]
                )));
            }
        }
        for (i, t) in shapes.iter().enumerate() {
            if t.rank() != 1 {
                return Err(ctx.invalid(format!(
                    "Input shapes should be a vector but received shape {} at position {i}",
                    shape_of(t)
                )));
            }
            if t.num_elements() != 2 {
                return Err(ctx.invalid(format!(
                    "shape should imply a 2D tensor, but got {} at position {i}",
                    shape_of(t)
                )));
            }
        }
        for (i, t) in dense.iter().enumerate() {
            if strings_only && t.dtype() == DType::Int64 {
                return Err(ctx.invalid(format!(
                    "Dense inputs should be of internal type {} but received {}",
                    enum_number(DType::String),
                    enum_number(t.dtype())
                )));
            }
            if t.rank() != 2 {
                return Err(ctx.invalid(format!(
                    "Dense inputs should be a matrix but received shape {} at position {i}",
                    shape_of(t)
                )));
            }
        }
        let first_dim = |t: &Tensor| -> Result<i64> { Ok(t.values::<i64>()?[0]) };
        let batch = match (shapes.first(), dense.first()) {
            (Some(s), _) => first_dim(s)?,
            (None, Some(d)) => d.dims()[0] as i64,
            (None, None) => 0,
        };
        for (i, s) in shapes.iter().enumerate() {
            let got = first_dim(s)?;
            if got != batch {
                return Err(ctx.invalid(format!(
                    "Expected batch size {batch} got {got} at position {i}"
                )));
            }
        }
        for (i, d) in dense.iter().enumerate() {
            if d.dims()[0] as i64 != batch {
                return Err(ctx.invalid(format!(
                    "Expected batch size {batch} got {} at dense tensor {i}",
                    d.dims()[0]
                )));
            }
        }
        // TensorFlow sizes a vector by a negative batch and aborts; refuse it instead.
        usize::try_from(batch)
            .map_err(|_| ctx.invalid(format!("the batch size {batch} must not be negative")))
    }

    /// The columns, sparse ones first, with each batch row's run of features (TensorFlow's
    /// `ExtractFeatureData`).
    fn columns<'t>(
        &self,
        ctx: &OpContext<'_>,
        inputs: &'t [Tensor],
        batch: usize,
    ) -> Result<Vec<Column<'t>>> {
        let n = self.sparse;
        let mut columns = Vec::with_capacity(n + self.dense);
        for i in 0..n {
            let indices = inputs[i].values::<i64>()?;
            let rows = inputs[i].dims()[0];
            let mut runs = Vec::with_capacity(batch);
            let mut at = 0usize;
            for b in 0..batch {
                let start = at;
                while at < rows && indices[2 * at] == b as i64 {
                    at += 1;
                }
                runs.push((start, at - start));
            }
            columns.push(Column {
                values: Values::of(ctx, &inputs[n + i])?,
                runs,
                dense: false,
            });
        }
        for t in &inputs[3 * n..3 * n + self.dense] {
            let width = t.dims()[1];
            columns.push(Column {
                values: Values::of(ctx, t)?,
                runs: (0..batch).map(|b| (b * width, width)).collect(),
                dense: true,
            });
        }
        Ok(columns)
    }
}

/// Every combination of one feature per column for batch row `b`, in TensorFlow's order (the
/// last column fastest), each as the flat value index of its feature in every column.
fn for_each_cross(columns: &[Column<'_>], b: usize, mut f: impl FnMut(&[usize])) {
    if columns.iter().any(|c| c.runs[b].1 == 0) {
        return;
    }
    let mut at: Vec<usize> = vec![0; columns.len()];
    let mut picked: Vec<usize> = columns.iter().map(|c| c.runs[b].0).collect();
    loop {
        f(&picked);
        let mut i = columns.len();
        loop {
            if i == 0 {
                return;
            }
            i -= 1;
            at[i] += 1;
            if at[i] < columns[i].runs[b].1 {
                picked[i] = columns[i].runs[b].0 + at[i];
                break;
            }
            at[i] = 0;
            picked[i] = columns[i].runs[b].0;
        }
    }
}

/// A joined cross: the features' bytes with `sep` between them.
fn joined(columns: &[Column<'_>], picked: &[usize], sep: &[u8]) -> Bytes {
    let mut out = Vec::new();
    for (k, (c, &i)) in columns.iter().zip(picked).enumerate() {
        if k > 0 {
            out.extend_from_slice(sep);
        }
        out.extend_from_slice(&c.bytes(i));
    }
    Bytes::from(out)
}

/// A hashed cross: the chained fingerprints modulo `num_buckets` (`i64::MAX` when 0).
fn hashed(
    columns: &[Column<'_>],
    picked: &[usize],
    kind: Kind,
    strong: Option<[u64; 2]>,
    num_buckets: u64,
) -> i64 {
    let mut features = columns
        .iter()
        .zip(picked)
        .map(|(c, &i)| c.hash(i, kind, strong));
    let mut h = match kind {
        Kind::Hashed1 { hash_key, .. } => hash_key,
        _ => features.next().unwrap_or(0),
    };
    for f in features {
        h = fingerprint_cat64(h, f);
    }
    let modulus = if num_buckets > 0 {
        num_buckets
    } else {
        i64::MAX as u64
    };
    (h % modulus) as i64
}

impl OpKernel for Cross {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let inputs: Vec<Tensor> = (0..ctx.num_inputs())
            .map(|i| input(ctx, i))
            .collect::<Result<_>>()?;
        let batch = self.validate(ctx, &inputs)?;
        let extra = 3 * self.sparse + self.dense;
        // The inputs after the columns: SparseCrossHashed's buckets, strong_hash and salt;
        // SparseCrossV2's separator.
        let (num_buckets, strong, sep) = match self.kind {
            Kind::Hashed1 { num_buckets, .. } => (num_buckets, None, Bytes::new()),
            Kind::Joined1 { .. } => (0, None, Bytes::from_static(b"_X_")),
            Kind::Hashed => {
                let buckets = scalar::<i64>(ctx, &inputs[extra], "num_buckets")?;
                let strong = scalar::<bool>(ctx, &inputs[extra + 1], "strong_hash")?;
                let salt = inputs[extra + 2].values::<i64>()?;
                if salt.len() != 2 {
                    return Err(ctx.invalid(format!(
                        "Input \"salt\" must have length 2 but has length {}",
                        salt.len()
                    )));
                }
                let key = strong.then_some([salt[0] as u64, salt[1] as u64]);
                (u64::try_from(buckets).unwrap_or(0), key, Bytes::new())
            }
            Kind::Joined => {
                let sep = &inputs[extra];
                if sep.rank() != 0 {
                    let shown: Vec<String> = sep
                        .strings()?
                        .iter()
                        .map(|s| String::from_utf8_lossy(s).into_owned())
                        .collect();
                    return Err(ctx.invalid(format!(
                        "Input separator should be a scalar. Received: Tensor<type: string \
                         shape: {} values: {}>",
                        shape_of(sep),
                        shown.join(" ")
                    )));
                }
                (0, None, sep.strings()?[0].clone())
            }
        };
        let columns = self.columns(ctx, &inputs, batch)?;
        let counts: Vec<usize> = (0..batch)
            .map(|b| {
                columns
                    .iter()
                    .try_fold(1usize, |n, c| n.checked_mul(c.runs[b].1))
                    .unwrap_or(usize::MAX)
            })
            .collect();
        let total = counts
            .iter()
            .try_fold(0usize, |n, &c| n.checked_add(c))
            .filter(|&n| n <= MAX_ELEMENTS)
            .ok_or_else(|| {
                ctx.named(Status::resource_exhausted(
                    "OOM when allocating the crosses: there are more than 2^32",
                ))
            })?;
        let widest = counts.iter().copied().max().unwrap_or(0);
        // Indices take 16 bytes per cross; a value 8, or its string.
        ctx.check_fits((total as u64).saturating_mul(24))?;
        let mut indices = Vec::with_capacity(2 * total);
        for (b, &c) in counts.iter().enumerate() {
            for k in 0..c {
                indices.extend_from_slice(&[b as i64, k as i64]);
            }
        }
        let cycles = 50.0 * (columns.len() as f64 + 1.0);
        let values = if matches!(self.kind, Kind::Hashed1 { .. } | Kind::Hashed) {
            let mut rows: Vec<Vec<i64>> = vec![Vec::new(); batch];
            let kind = self.kind;
            ctx.intra()
                .for_chunks(&mut rows, 1, cycles, |first, chunk| {
                    for (k, row) in chunk.iter_mut().enumerate() {
                        for_each_cross(&columns, first + k, |p| {
                            row.push(hashed(&columns, p, kind, strong, num_buckets))
                        });
                    }
                });
            let flat: Vec<i64> = rows.concat();
            Tensor::from_vec(vec![total], flat)?
        } else {
            let mut rows: Vec<Vec<Bytes>> = vec![Vec::new(); batch];
            ctx.intra()
                .for_chunks(&mut rows, 1, cycles, |first, chunk| {
                    for (k, row) in chunk.iter_mut().enumerate() {
                        for_each_cross(&columns, first + k, |p| {
                            row.push(joined(&columns, p, &sep))
                        });
                    }
                });
            Tensor::from_strings(vec![total], rows.concat())?
        };
        ctx.set_output(0, Tensor::from_vec(vec![total, 2], indices)?);
        ctx.set_output(1, values);
        ctx.set_output(
            2,
            Tensor::from_vec(vec![2], vec![batch as i64, widest as i64])?,
        );
        Ok(())
    }
}

/// A scalar input of `T`.
fn scalar<T: crate::tensor::Element + Copy>(
    ctx: &OpContext<'_>,
    t: &Tensor,
    what: &str,
) -> Result<T> {
    if t.dtype() != T::DTYPE || t.num_elements() != 1 {
        return Err(ctx.invalid(format!(
            "{what} must be a scalar {}, got a {} tensor of shape {}",
            T::DTYPE,
            t.dtype(),
            shape_of(t)
        )));
    }
    Ok(t.values::<T>()?[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cat64_mixes_both_fingerprints() {
        assert_ne!(fingerprint_cat64(1, 2), fingerprint_cat64(2, 1));
        assert_ne!(fingerprint_cat64(0, 0), 0);
    }
}
