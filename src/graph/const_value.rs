//! Small `TensorProto`s the builder and the gradient functions create (shapes, axes, scalars
//! of a gradient's dtype, written in typed fields as TensorFlow's Python writes them), and
//! reading small integer constants back for shape inference. General tensor conversion is
//! [`Tensor::to_proto`] / [`Tensor::from_proto`].

use crate::error::{Result, Status};
use crate::proto::TensorProto;
use crate::tensor::{DType, PartialShape, Shape, Tensor};

fn proto(dtype: DType, dims: &[usize]) -> TensorProto {
    TensorProto {
        dtype: dtype.to_proto() as i32,
        tensor_shape: Some(Shape::new(dims.to_vec()).to_proto()),
        ..Default::default()
    }
}

/// An `int32` tensor proto with these dims, values in `int_val` as TensorFlow writes them.
pub fn int32(dims: &[usize], values: &[i32]) -> TensorProto {
    TensorProto {
        int_val: values.to_vec(),
        ..proto(DType::Int32, dims)
    }
}

/// An `int64` tensor proto.
pub fn int64(dims: &[usize], values: &[i64]) -> TensorProto {
    TensorProto {
        int64_val: values.to_vec(),
        ..proto(DType::Int64, dims)
    }
}

/// A scalar of a numeric `dtype` holding `value` (rounded for integer types).
pub fn scalar(dtype: DType, value: f64) -> Result<TensorProto> {
    Ok(match dtype {
        DType::Float => TensorProto {
            float_val: vec![value as f32],
            ..proto(dtype, &[])
        },
        DType::Double => TensorProto {
            double_val: vec![value],
            ..proto(dtype, &[])
        },
        DType::Int32 => int32(&[], &[value as i32]),
        DType::Int64 => int64(&[], &[value as i64]),
        DType::Bool => TensorProto {
            bool_val: vec![value != 0.0],
            ..proto(dtype, &[])
        },
        DType::UInt8 | DType::Int8 | DType::Int16 | DType::UInt16 => TensorProto {
            int_val: vec![match dtype {
                DType::UInt8 => i32::from(value as u8),
                DType::Int8 => i32::from(value as i8),
                DType::Int16 => i32::from(value as i16),
                _ => i32::from(value as u16),
            }],
            ..proto(dtype, &[])
        },
        DType::UInt32 => TensorProto {
            uint32_val: vec![value as u32],
            ..proto(dtype, &[])
        },
        DType::UInt64 => TensorProto {
            uint64_val: vec![value as u64],
            ..proto(dtype, &[])
        },
        // Through float32, as TensorFlow's Python converts a number to a 16-bit float.
        DType::Half => TensorProto {
            half_val: vec![i32::from(half::f16::from_f32(value as f32).to_bits())],
            ..proto(dtype, &[])
        },
        DType::BFloat16 => TensorProto {
            half_val: vec![i32::from(half::bf16::from_f32(value as f32).to_bits())],
            ..proto(dtype, &[])
        },
        DType::Complex64 => TensorProto {
            scomplex_val: vec![value as f32, 0.0],
            ..proto(dtype, &[])
        },
        DType::String | DType::Resource | DType::Variant => {
            return Err(Status::invalid_argument(format!(
                "no numeric scalar of dtype {dtype}"
            )))
        }
    })
}

/// Returns the shape a tensor proto declares.
pub fn shape_of(p: &TensorProto) -> PartialShape {
    p.tensor_shape
        .as_ref()
        .and_then(|s| PartialShape::from_proto(s).ok())
        .unwrap_or_else(|| PartialShape::new(vec![]))
}

/// Reads the values of a small `int32` / `int64` tensor proto (any encoding TensorFlow
/// writes), for shape inference; `None` for other dtypes, bad protos and large tensors.
pub fn int_values(p: &TensorProto) -> Option<Vec<i64>> {
    if shape_of(p).to_shape()?.num_elements() > 1024 {
        return None;
    }
    tensor_int_values(&Tensor::from_proto(p).ok()?)
}

/// Reads the values of an `int32` / `int64` tensor as `i64`; `None` for other dtypes.
pub fn tensor_int_values(t: &Tensor) -> Option<Vec<i64>> {
    match t.dtype() {
        DType::Int32 => Some(
            t.values::<i32>()
                .ok()?
                .iter()
                .map(|&v| i64::from(v))
                .collect(),
        ),
        DType::Int64 => Some(t.values::<i64>().ok()?.into_owned()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_values_read_every_encoding() {
        assert_eq!(int_values(&int32(&[3], &[1, -1, 4])), Some(vec![1, -1, 4]));
        assert_eq!(int_values(&int64(&[], &[7])), Some(vec![7]));
        // A single value fills the whole tensor, as in TensorFlow's compact encoding.
        assert_eq!(int_values(&int32(&[3], &[5])), Some(vec![5, 5, 5]));
        let mut p = int32(&[2], &[]);
        p.tensor_content = bytes::Bytes::from(vec![2, 0, 0, 0, 255, 255, 255, 255]);
        assert_eq!(int_values(&p), Some(vec![2, -1]));
        assert_eq!(int_values(&scalar(DType::Float, 1.0).unwrap()), None);
    }
}
