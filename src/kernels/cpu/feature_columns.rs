//! The kernels of feature columns: `StringToHashBucketFast` and `StringToHashBucketStrong`
//! (a string's bucket by farmhash's `Fingerprint64` or a keyed SipHash-2-4, both in
//! `fingerprint.rs`), `Bucketize` (a number's bucket among sorted boundaries) and
//! `SparseToDense`.
//!
//! The hashes and `Bucketize` compute each element on its own, split over the intra-op pool
//! with the cost of one element stated (a hash reads the string's bytes, a bucket is a binary
//! search). `SparseToDense` fills the output with the default and writes each value at its
//! index in one pass, as TensorFlow's `SparseTensor::ToDense` does (a repeated index keeps the
//! last value). The checks and messages are TensorFlow 2.21's (`string_to_hash_bucket_op.h`,
//! `bucketize_op.cc`, `sparse_to_dense_op.cc` and `SparseTensor::IndicesValid`); the output
//! of `SparseToDense` goes through the memory budget before it is allocated.

use std::sync::Arc;

use super::fingerprint::{fingerprint64, sip_hash_24};
use super::gather_nd::make_shape;
use super::{checked_elements, input, int_values, same_dtype, unsupported_dtype, Items};
use crate::error::{Result, Status};
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::attr_value::Value;
use crate::proto::NodeDef;
use crate::tensor::{DType, Shape, Tensor};

/// Returns the factory for a feature-column op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "StringToHashBucketFast" => HashBucket::fast,
        "StringToHashBucketStrong" => HashBucket::strong,
        "Bucketize" => Bucketize::create,
        "SparseToDense" => |node| {
            Ok(Arc::new(SparseToDense {
                validate: attr::bool_or(node, "validate_indices", true)?,
            }))
        },
        _ => return None,
    };
    Some(factory)
}

/// An INVALID_ARGUMENT naming `node`, for the checks a factory makes.
fn invalid(node: &NodeDef, message: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("node `{}` (op {}): {message}", node.name, node.op))
}

/// `f(i)` for `i` in `0..len`, each costing `cycles`, computed over the intra-op pool.
fn each<U: Copy + Default + Send>(
    ctx: &OpContext<'_>,
    len: usize,
    cycles: f64,
    f: impl Fn(usize) -> U + Sync,
) -> Vec<U> {
    let mut out = vec![U::default(); len];
    ctx.intra().for_chunks(&mut out, 1, cycles, |first, chunk| {
        for (i, o) in chunk.iter_mut().enumerate() {
            *o = f(first + i);
        }
    });
    out
}

/// Which hash a hash-bucket kernel takes.
enum Hash {
    /// farmhash's `Fingerprint64` (`StringToHashBucketFast`).
    Fingerprint,
    /// SipHash-2-4 under this key (`StringToHashBucketStrong`).
    Keyed([u64; 2]),
}

/// StringToHashBucketFast / StringToHashBucketStrong(input): each string's hash modulo
/// `num_buckets`, as int64 of the input's shape.
struct HashBucket {
    num_buckets: u64,
    hash: Hash,
}

impl HashBucket {
    /// `num_buckets`, which TensorFlow's op definition holds to at least 1 (a graph with 0 is
    /// refused when imported; this catches a node made without that check).
    fn num_buckets(node: &NodeDef) -> Result<u64> {
        let n = attr::int(node, "num_buckets")?;
        u64::try_from(n).ok().filter(|&n| n >= 1).ok_or_else(|| {
            invalid(
                node,
                format!("Value for attr 'num_buckets' of {n} must be at least minimum 1"),
            )
        })
    }

    fn fast(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        Ok(Arc::new(HashBucket {
            num_buckets: Self::num_buckets(node)?,
            hash: Hash::Fingerprint,
        }))
    }

    fn strong(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let num_buckets = Self::num_buckets(node)?;
        let key = attr::int_list(node, "key")?;
        let [k0, k1] = key[..] else {
            return Err(invalid(node, "Key must have 2 elements"));
        };
        Ok(Arc::new(HashBucket {
            num_buckets,
            hash: Hash::Keyed([k0 as u64, k1 as u64]),
        }))
    }
}

impl OpKernel for HashBucket {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = input(ctx, 0)?;
        if x.dtype() != DType::String {
            return Err(unsupported_dtype(ctx, x.dtype(), &[DType::String]));
        }
        let strings = x.strings()?;
        // A hash mixes a word per 8 bytes in a few cycles, after a fixed cost per string.
        let bytes: usize = strings.iter().map(|s| s.len()).sum();
        let cycles = 30.0 + bytes as f64 / strings.len().max(1) as f64 / 2.0;
        let n = self.num_buckets;
        let buckets = match self.hash {
            Hash::Fingerprint => each(ctx, strings.len(), cycles, |i| {
                (fingerprint64(&strings[i]) % n) as i64
            }),
            Hash::Keyed(key) => each(ctx, strings.len(), cycles, |i| {
                (sip_hash_24(key, &strings[i]) % n) as i64
            }),
        };
        ctx.set_output(0, Tensor::from_vec(x.shape().clone(), buckets)?);
        Ok(())
    }
}

/// Bucketize(input): for each element, the index of the first boundary above it (C++'s
/// `std::upper_bound`), as int32 of the input's shape. The boundaries are float32, and every
/// element is compared as C++ compares it with a `float`: float32 and integer elements as
/// float32 (an int64 rounds to the nearest float32), float64 ones as float64. TensorFlow runs
/// its CPU kernels with subnormal operands read as zero (`ScopedFlushDenormal`), so a
/// subnormal element or boundary counts as zero here too.
struct Bucketize {
    boundaries: Vec<f32>,
}

impl Bucketize {
    fn create(node: &NodeDef) -> Result<Arc<dyn OpKernel>> {
        let boundaries = match attr::get(node, "boundaries") {
            Some(Value::List(l)) => l.f.clone(),
            Some(_) => return Err(invalid(node, "attr `boundaries` must be a list(float)")),
            None => {
                return Err(invalid(
                    node,
                    "missing attr `boundaries` (list(float)); set it",
                ))
            }
        };
        let boundaries: Vec<f32> = boundaries.into_iter().map(flush32).collect();
        // `std::is_sorted`: no boundary below the one before it (a NaN compares as neither).
        if boundaries.windows(2).any(|w| w[1] < w[0]) {
            return Err(invalid(node, "Expected sorted boundaries"));
        }
        Ok(Arc::new(Bucketize { boundaries }))
    }
}

/// A subnormal float32 as zero, as the CPU reads it under TensorFlow's flush-to-zero mode.
fn flush32(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0
    } else {
        x
    }
}

/// A subnormal float64 as zero.
fn flush64(x: f64) -> f64 {
    if x.is_subnormal() {
        0.0
    } else {
        x
    }
}

/// libstdc++'s `std::upper_bound(boundaries, value)`: its exact halving, so that the answer
/// is TensorFlow's even for a NaN among the boundaries.
fn upper_bound<T: Copy>(boundaries: &[T], below: impl Fn(T) -> bool) -> i32 {
    let (mut first, mut len) = (0usize, boundaries.len());
    while len > 0 {
        let half = len / 2;
        if below(boundaries[first + half]) {
            len = half;
        } else {
            first += half + 1;
            len -= half + 1;
        }
    }
    first as i32
}

impl OpKernel for Bucketize {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let x = input(ctx, 0)?;
        let b = &self.boundaries;
        let cycles = 2.0 + 3.0 * (b.len() as f64 + 1.0).log2();
        let n = x.num_elements();
        let buckets = match x.dtype() {
            DType::Float => {
                let v = x.values::<f32>()?;
                each(ctx, n, cycles, |i| {
                    let x = flush32(v[i]);
                    upper_bound(b, |e: f32| x < e)
                })
            }
            DType::Double => {
                let v = x.values::<f64>()?;
                let b: Vec<f64> = b.iter().map(|&e| f64::from(e)).collect();
                each(ctx, n, cycles, |i| {
                    let x = flush64(v[i]);
                    upper_bound(&b, |e: f64| x < e)
                })
            }
            DType::Int32 => {
                let v = x.values::<i32>()?;
                each(ctx, n, cycles, |i| {
                    upper_bound(b, |e: f32| (v[i] as f32) < e)
                })
            }
            DType::Int64 => {
                let v = x.values::<i64>()?;
                each(ctx, n, cycles, |i| {
                    upper_bound(b, |e: f32| (v[i] as f32) < e)
                })
            }
            other => {
                let accepted = [DType::Int32, DType::Int64, DType::Float, DType::Double];
                return Err(unsupported_dtype(ctx, other, &accepted));
            }
        };
        ctx.set_output(0, Tensor::from_vec(x.shape().clone(), buckets)?);
        Ok(())
    }
}

/// SparseToDense(sparse_indices, output_shape, sparse_values, default_value): a tensor of
/// `output_shape` holding `default_value` but at the indices, which hold the values (one
/// value for all when `sparse_values` is a scalar).
struct SparseToDense {
    validate: bool,
}

/// TensorFlow's `CheckSparseToDenseShapes`; returns the index count and depth.
fn check_shapes(
    ctx: &OpContext<'_>,
    indices: &Tensor,
    output_shape: &Tensor,
    values: &Tensor,
    default: &Tensor,
) -> Result<(usize, usize)> {
    if indices.rank() > 2 {
        return Err(ctx.invalid(format!(
            "sparse_indices should be a scalar, vector, or matrix, got shape {}",
            indices.shape()
        )));
    }
    let d = indices.dims();
    let count = d.first().copied().unwrap_or(1);
    let depth = d.get(1).copied().unwrap_or(1);
    if output_shape.rank() != 1 {
        return Err(ctx.invalid(format!(
            "output_shape must be rank 1, got shape {}",
            output_shape.shape()
        )));
    }
    if output_shape.num_elements() != depth {
        return Err(ctx.invalid(format!(
            "output_shape has incorrect number of elements: {} should be: {depth}",
            output_shape.num_elements()
        )));
    }
    if values.rank() != 0 && (values.rank() != 1 || values.num_elements() != count) {
        return Err(ctx.invalid(format!(
            "sparse_values has incorrect shape {}, should be [] or [{count}]",
            values.shape()
        )));
    }
    if default.rank() != 0 {
        return Err(ctx.invalid("default_value should be a scalar."));
    }
    Ok((count, depth))
}

/// TensorFlow's `SparseTensor::IndicesValid` in the standard order: every index inside
/// `dims`, each after the one before it in row-major order.
fn indices_valid(
    ctx: &OpContext<'_>,
    idx: &[i64],
    count: usize,
    depth: usize,
    dims: &[usize],
) -> Result<()> {
    let rows: Vec<&[i64]> = (0..count)
        .map(|n| &idx[n * depth..(n + 1) * depth])
        .collect();
    for (n, row) in rows.iter().enumerate() {
        let valid = row
            .iter()
            .zip(dims)
            .all(|(&i, &d)| i >= 0 && (i as u64) < d as u64);
        let (increasing, different) = match n.checked_sub(1).map(|p| rows[p]) {
            None => (true, true),
            Some(prev) => match row.iter().zip(prev).find(|(a, b)| a != b) {
                Some((a, b)) => (a > b, true),
                None => (true, false),
            },
        };
        if valid && increasing && different {
            continue;
        }
        let coords: Vec<String> = row.iter().map(i64::to_string).collect();
        let index = format!("indices[{n}] = [{}", coords.join(","));
        let index = if row.is_empty() { index } else { index + "]" };
        return Err(ctx.invalid(if !valid {
            let shape: Vec<String> = dims.iter().map(usize::to_string).collect();
            format!(
                "{index} is out of bounds: need 0 <= index < [{}]",
                shape.join(",")
            )
        } else if !increasing {
            format!(
                "{index} is out of order. Many sparse ops require sorted indices.\n    Use \
                 `tf.sparse.reorder` to create a correctly ordered copy.\n\n"
            )
        } else {
            format!("{index} is repeated")
        }));
    }
    Ok(())
}

/// A dense tensor of `dims` holding `fill` but at the `count` index rows of `depth` in `idx`,
/// which hold `values` (the one value at all of them when there is one); `None` when an index
/// is outside `dims`.
fn densify<T: Items>(
    values: &[T],
    fill: &T,
    idx: &[i64],
    count: usize,
    depth: usize,
    dims: &[usize],
) -> Option<Vec<T>> {
    let mut strides = vec![1usize; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * dims[d + 1];
    }
    let mut out = vec![fill.clone(); dims.iter().product()];
    for n in 0..count {
        let row = &idx[n * depth..(n + 1) * depth];
        let mut offset = 0usize;
        for ((&i, &d), &s) in row.iter().zip(dims).zip(&strides) {
            if i < 0 || i as u64 >= d as u64 {
                return None;
            }
            offset += i as usize * s;
        }
        out[offset] = values[n.min(values.len() - 1)].clone();
    }
    Some(out)
}

impl OpKernel for SparseToDense {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (indices, output_shape) = (input(ctx, 0)?, input(ctx, 1)?);
        let (values, default) = (input(ctx, 2)?, input(ctx, 3)?);
        let (count, depth) = check_shapes(ctx, &indices, &output_shape, &values, &default)?;
        same_dtype(ctx, &values, &default)?;
        let dims = make_shape(ctx, &int_values(ctx, &output_shape, "output_shape")?)?;
        checked_elements(ctx, &dims)?;
        let idx = int_values(ctx, &indices, "sparse_indices")?;
        if self.validate {
            indices_valid(ctx, &idx, count, depth, &dims)?;
        }
        let out = dispatch_items!(ctx, values.dtype(), T => {
            let vals = T::items(&values)?;
            let fill = T::items(&default)?;
            match densify(&vals, &fill[0], &idx, count, depth, &dims) {
                Some(out) => T::tensor(dims, out)?,
                None => {
                    return Err(ctx.invalid(format!(
                        "Indices are not valid (out of bounds).  Shape: {}",
                        Shape::new(dims)
                    )))
                }
            }
        });
        ctx.set_output(0, out);
        Ok(())
    }
}
