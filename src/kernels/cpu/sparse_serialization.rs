//! `SerializeSparse` and `DeserializeSparse`, with which tf.data carries a `SparseTensor` as
//! one tensor of three elements (TensorFlow's `serialize_sparse_op.cc` and
//! `deserialize_sparse_string_op.cc` / `deserialize_sparse_variant_op.cc`).
//!
//! As strings, the three elements are the indices, values and dense shape as serialized
//! `TensorProto`s with every element in `tensor_content` (TensorFlow's `AsProtoTensorContent`,
//! byte for byte); as variants, each element holds the [`Tensor`] itself, which is all a
//! `DeserializeSparse` here needs (a variant does not leave the process as it is).
//!
//! `DeserializeSparse` reads `N` such triples laid out in the leading dims of its input and
//! concatenates them into one sparse tensor whose indices start with each triple's position in
//! those dims: rows in input order, each triple's own rows in their order (not sorted again,
//! as in TensorFlow's `SparseTensor::Concat`), the dense shape the leading dims then the
//! largest of each dim over the triples. One triple in a vector of three comes back as it was.

use std::sync::Arc;

use prost::Message;

use super::{input, Items};
use crate::error::Result;
use crate::graph::attr;
use crate::kernels::{KernelFactory, OpContext, OpKernel};
use crate::proto::TensorProto;
use crate::tensor::{DType, Tensor, VariantValue};

/// Returns the factory for a sparse serialization op.
pub(super) fn kernel_for(op: &str) -> Option<KernelFactory> {
    let factory: KernelFactory = match op {
        "SerializeSparse" => |node| {
            Ok(Arc::new(SerializeSparse {
                out_type: match attr::get(node, "out_type") {
                    Some(_) => attr::dtype(node, "out_type")?,
                    None => DType::String,
                },
            }))
        },
        "DeserializeSparse" => |node| {
            Ok(Arc::new(DeserializeSparse {
                dtype: attr::dtype(node, "dtype")?,
            }))
        },
        _ => return None,
    };
    Some(factory)
}

/// A node's invalid attr, as INVALID_ARGUMENT naming it.
fn check_type(ctx: &OpContext<'_>, what: &str, dtype: DType) -> Result<()> {
    if matches!(dtype, DType::String | DType::Variant) {
        return Ok(());
    }
    Err(ctx.invalid(format!("{what} must be string or variant, got {dtype}")))
}

/// SerializeSparse(sparse_indices, sparse_values, sparse_shape) -> serialized [3].
struct SerializeSparse {
    out_type: DType,
}

impl OpKernel for SerializeSparse {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let (indices, values, shape) = (input(ctx, 0)?, input(ctx, 1)?, input(ctx, 2)?);
        check_type(ctx, "out_type", self.out_type)?;
        for (t, rank, what) in [
            (&indices, 2, "Input indices should be a matrix"),
            (&values, 1, "Input values should be a vector"),
            (&shape, 1, "Input shape should be a vector"),
        ] {
            if t.rank() != rank {
                return Err(ctx.invalid(format!("{what} but received shape {}", t.shape())));
            }
        }
        let parts = [indices, values, shape];
        let out = if self.out_type == DType::String {
            let strings = parts
                .iter()
                .map(|t| t.to_proto_content().encode_to_vec().into())
                .collect();
            Tensor::from_strings(vec![3], strings)?
        } else {
            let variants = parts
                .into_iter()
                .map(|t| Arc::new(t) as VariantValue)
                .collect();
            Tensor::from_variants(vec![3], variants)?
        };
        ctx.set_output(0, out);
        Ok(())
    }
}

/// DeserializeSparse(serialized [..., 3]) -> sparse_indices, sparse_values, sparse_shape.
struct DeserializeSparse {
    dtype: DType,
}

/// One deserialized sparse tensor: its index rows (of its rank), values and dense shape.
struct Part {
    indices: Vec<i64>,
    rank: usize,
    values: Tensor,
    shape: Vec<i64>,
}

/// Element `j` of triple `i` as a tensor: parsed from a string, or the variant's tensor.
fn element(ctx: &OpContext<'_>, serialized: &Tensor, i: usize, j: usize) -> Result<Tensor> {
    let at = 3 * i + j;
    if serialized.dtype() == DType::String {
        let bytes = &serialized.strings()?[at];
        let proto = TensorProto::decode(bytes.as_ref()).map_err(|e| {
            ctx.invalid(format!(
                "Could not parse serialized proto at [{i}, {j}]: {e}"
            ))
        })?;
        Tensor::from_proto(&proto).map_err(|e| ctx.named(e))
    } else {
        serialized.variants()?[at]
            .downcast_ref::<Tensor>()
            .cloned()
            .ok_or_else(|| ctx.invalid(format!("serialized_sparse[{i}, {j}] holds no tensor")))
    }
}

/// Triple `i`, with TensorFlow's checks (`GetAndValidateSparseTensor`).
fn part(ctx: &OpContext<'_>, serialized: &Tensor, i: usize, dtype: DType) -> Result<Part> {
    let indices = element(ctx, serialized, i, 0)?;
    let values = element(ctx, serialized, i, 1)?;
    let shape = element(ctx, serialized, i, 2)?;
    if indices.dtype() != DType::Int64 || indices.rank() != 2 {
        return Err(ctx.invalid(format!(
            "Expected serialized_sparse[{i}, 0] to represent an index matrix but received \
             {} of shape {}",
            indices.dtype(),
            indices.shape()
        )));
    }
    if values.dtype() != dtype {
        return Err(ctx.invalid(format!(
            "Requested SparseTensor of type {} but SparseTensor[{i}].values.dtype() == {}",
            dtype.tf_name(),
            values.dtype().tf_name()
        )));
    }
    if values.rank() != 1 {
        return Err(ctx.invalid(format!(
            "Expected serialized_sparse[{i}, 1] to represent a values vector but received \
             shape {}",
            values.shape()
        )));
    }
    if shape.dtype() != DType::Int64 || shape.rank() != 1 {
        return Err(ctx.invalid(format!(
            "Expected serialized_sparse[{i}, 2] to represent a shape vector but received {} \
             of shape {}",
            shape.dtype(),
            shape.shape()
        )));
    }
    let (rows, rank) = (indices.dims()[0], indices.dims()[1]);
    if rank != shape.num_elements() || rows != values.num_elements() {
        return Err(ctx.invalid(format!(
            "SparseTensor[{i}] is inconsistent: indices of shape {}, values of shape {}, dense \
             shape of shape {}",
            indices.shape(),
            values.shape(),
            shape.shape()
        )));
    }
    Ok(Part {
        indices: indices.values::<i64>()?.into_owned(),
        rank,
        values,
        shape: shape.values::<i64>()?.into_owned(),
    })
}

/// The values of `parts` one after another, as one vector of `dtype`.
fn concat_values(ctx: &OpContext<'_>, parts: &[Part], dtype: DType) -> Result<Tensor> {
    Ok(dispatch_items!(ctx, dtype, T => {
        let mut all: Vec<T> = Vec::new();
        for p in parts {
            all.extend_from_slice(&T::items(&p.values)?);
        }
        let n = all.len();
        T::tensor(vec![n], all)?
    }))
}

impl OpKernel for DeserializeSparse {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        let serialized = input(ctx, 0)?;
        check_type(ctx, "Tserialized", serialized.dtype())?;
        let dims = serialized.dims().to_vec();
        let Some((&last, lead)) = dims.split_last() else {
            return Err(ctx.invalid(format!(
                "Serialized sparse should have non-zero rank {}",
                serialized.shape()
            )));
        };
        if last != 3 {
            return Err(ctx.invalid(format!(
                "Serialized sparse should have 3 as the last dimension {}",
                serialized.shape()
            )));
        }
        let count: usize = lead.iter().product();
        if count == 0 {
            return Err(ctx.invalid(format!(
                "Serialized sparse should have at least 1 serialized tensor, but has a zero \
                 dimension {}",
                serialized.shape()
            )));
        }
        let parts = (0..count)
            .map(|i| part(ctx, &serialized, i, self.dtype))
            .collect::<Result<Vec<_>>>()?;
        let rank = parts[0].rank;
        if let Some((i, p)) = parts.iter().enumerate().find(|(_, p)| p.rank != rank) {
            return Err(ctx.invalid(format!(
                "Inconsistent shape across SparseTensors: rank prior to SparseTensor[{i}] was: \
                 {rank} but rank of SparseTensor[{i}] is: {}",
                p.rank
            )));
        }
        if lead.is_empty() {
            let p = &parts[0];
            let rows = p.indices.len() / rank.max(1);
            let rows = if rank == 0 {
                p.values.num_elements()
            } else {
                rows
            };
            ctx.set_output(0, Tensor::from_vec(vec![rows, rank], p.indices.clone())?);
            ctx.set_output(1, p.values.clone());
            ctx.set_output(2, Tensor::from_vec(vec![rank], p.shape.clone())?);
            return Ok(());
        }
        let out_rank = lead.len() + rank;
        let mut indices = Vec::new();
        let mut shape: Vec<i64> = lead.iter().map(|&d| d as i64).collect();
        shape.extend(std::iter::repeat_n(0, rank));
        for (i, p) in parts.iter().enumerate() {
            // Triple i's position in the leading dims, the last dim fastest.
            let mut position = vec![0i64; lead.len()];
            let mut rest = i;
            for (slot, &d) in position.iter_mut().zip(lead).rev() {
                *slot = (rest % d) as i64;
                rest /= d;
            }
            for row in 0..p.values.num_elements() {
                indices.extend_from_slice(&position);
                indices.extend_from_slice(&p.indices[row * rank..(row + 1) * rank]);
            }
            for (s, &d) in shape[lead.len()..].iter_mut().zip(&p.shape) {
                *s = (*s).max(d);
            }
        }
        let rows = indices.len() / out_rank;
        ctx.set_output(0, Tensor::from_vec(vec![rows, out_rank], indices)?);
        ctx.set_output(1, concat_values(ctx, &parts, self.dtype)?);
        ctx.set_output(2, Tensor::from_vec(vec![out_rank], shape)?);
        Ok(())
    }
}
