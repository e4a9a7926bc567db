//! Element types a tessera tensor can hold, and their mapping onto TensorFlow's `DataType`.

use std::fmt;

use crate::error::{Result, Status};
use crate::proto::DataType;

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// `DT_FLOAT`, 4 bytes.
    Float,
    /// `DT_DOUBLE`, 8 bytes.
    Double,
    /// `DT_INT32`, 4 bytes.
    Int32,
    /// `DT_INT64`, 8 bytes.
    Int64,
    /// `DT_BOOL`, 1 byte (0 or 1).
    Bool,
    /// `DT_STRING`, variable-length byte strings.
    String,
    /// `DT_RESOURCE`, a handle to a variable or another resource on one device.
    Resource,
    /// `DT_VARIANT`, one opaque value per element (a `TensorList`); it lives on the task that
    /// made it and never crosses the wire.
    Variant,
    /// `DT_UINT8`, 1 byte (images).
    UInt8,
    /// `DT_INT8`, 1 byte.
    Int8,
    /// `DT_INT16`, 2 bytes.
    Int16,
    /// `DT_UINT16`, 2 bytes.
    UInt16,
    /// `DT_UINT32`, 4 bytes.
    UInt32,
    /// `DT_UINT64`, 8 bytes.
    UInt64,
    /// `DT_HALF`, IEEE float16, 2 bytes ([`half::f16`]).
    Half,
    /// `DT_BFLOAT16`, the top half of a float32, 2 bytes ([`half::bf16`]).
    BFloat16,
    /// `DT_COMPLEX64`, two float32s (real, imaginary), 8 bytes.
    Complex64,
}

impl DType {
    /// Every dtype, in TensorFlow's numbering order.
    pub const ALL: [DType; 17] = [
        DType::Float,
        DType::Double,
        DType::Int32,
        DType::UInt8,
        DType::Int16,
        DType::Int8,
        DType::String,
        DType::Complex64,
        DType::Int64,
        DType::Bool,
        DType::BFloat16,
        DType::UInt16,
        DType::Half,
        DType::Resource,
        DType::Variant,
        DType::UInt32,
        DType::UInt64,
    ];

    /// Returns the size of one element in bytes, or `None` for variable-size types.
    pub fn size(self) -> Option<usize> {
        match self {
            DType::Bool | DType::UInt8 | DType::Int8 => Some(1),
            DType::Int16 | DType::UInt16 | DType::Half | DType::BFloat16 => Some(2),
            DType::Float | DType::Int32 | DType::UInt32 => Some(4),
            DType::Double | DType::Int64 | DType::UInt64 | DType::Complex64 => Some(8),
            DType::String | DType::Resource | DType::Variant => None,
        }
    }

    /// Whether the type is float32 or float64, the types most kernels and every gradient
    /// compute in (half and bfloat16 are [`DType::is_half`]).
    pub fn is_float(self) -> bool {
        matches!(self, DType::Float | DType::Double)
    }

    /// Whether the type is one of the 16-bit floats, float16 or bfloat16.
    pub fn is_half(self) -> bool {
        matches!(self, DType::Half | DType::BFloat16)
    }

    /// Whether the type is an integer type, signed or unsigned.
    pub fn is_integer(self) -> bool {
        matches!(
            self,
            DType::Int32
                | DType::Int64
                | DType::UInt8
                | DType::Int8
                | DType::Int16
                | DType::UInt16
                | DType::UInt32
                | DType::UInt64
        )
    }

    /// Whether the type is a number (float or integer).
    pub fn is_numeric(self) -> bool {
        self.is_float() || self.is_integer()
    }

    /// Returns TensorFlow's `DataType` for this dtype.
    pub fn to_proto(self) -> DataType {
        match self {
            DType::Float => DataType::DtFloat,
            DType::Double => DataType::DtDouble,
            DType::Int32 => DataType::DtInt32,
            DType::Int64 => DataType::DtInt64,
            DType::Bool => DataType::DtBool,
            DType::String => DataType::DtString,
            DType::Resource => DataType::DtResource,
            DType::Variant => DataType::DtVariant,
            DType::UInt8 => DataType::DtUint8,
            DType::Int8 => DataType::DtInt8,
            DType::Int16 => DataType::DtInt16,
            DType::UInt16 => DataType::DtUint16,
            DType::UInt32 => DataType::DtUint32,
            DType::UInt64 => DataType::DtUint64,
            DType::Half => DataType::DtHalf,
            DType::BFloat16 => DataType::DtBfloat16,
            DType::Complex64 => DataType::DtComplex64,
        }
    }

    /// Reads TensorFlow's `DataType`; reference types (`DT_FLOAT_REF`) map to their base type.
    pub fn from_proto(dtype: DataType) -> Result<Self> {
        Ok(match dtype {
            DataType::DtFloat | DataType::DtFloatRef => DType::Float,
            DataType::DtDouble | DataType::DtDoubleRef => DType::Double,
            DataType::DtInt32 | DataType::DtInt32Ref => DType::Int32,
            DataType::DtInt64 | DataType::DtInt64Ref => DType::Int64,
            DataType::DtBool | DataType::DtBoolRef => DType::Bool,
            DataType::DtString | DataType::DtStringRef => DType::String,
            DataType::DtResource | DataType::DtResourceRef => DType::Resource,
            DataType::DtVariant | DataType::DtVariantRef => DType::Variant,
            DataType::DtUint8 | DataType::DtUint8Ref => DType::UInt8,
            DataType::DtInt8 | DataType::DtInt8Ref => DType::Int8,
            DataType::DtInt16 | DataType::DtInt16Ref => DType::Int16,
            DataType::DtUint16 | DataType::DtUint16Ref => DType::UInt16,
            DataType::DtUint32 | DataType::DtUint32Ref => DType::UInt32,
            DataType::DtUint64 | DataType::DtUint64Ref => DType::UInt64,
            DataType::DtHalf | DataType::DtHalfRef => DType::Half,
            DataType::DtBfloat16 | DataType::DtBfloat16Ref => DType::BFloat16,
            DataType::DtComplex64 | DataType::DtComplex64Ref => DType::Complex64,
            other => {
                let names: Vec<&str> = Self::ALL.iter().map(|d| d.name()).collect();
                return Err(Status::unimplemented(format!(
                    "data type {} is not supported by tessera (supported: {})",
                    other.as_str_name(),
                    names.join(", ")
                )));
            }
        })
    }

    /// Reads a raw `DataType` number as found in a message.
    pub fn from_i32(raw: i32) -> Result<Self> {
        let dtype = DataType::try_from(raw)
            .map_err(|_| Status::invalid_argument(format!("unknown data type number {raw}")))?;
        Self::from_proto(dtype)
    }

    /// Returns the name TensorFlow's Python prints (`float32`, `int64`, `float16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Float => "float32",
            DType::Double => "float64",
            DType::Int32 => "int32",
            DType::Int64 => "int64",
            DType::Bool => "bool",
            DType::String => "string",
            DType::Resource => "resource",
            DType::Variant => "variant",
            DType::UInt8 => "uint8",
            DType::Int8 => "int8",
            DType::Int16 => "int16",
            DType::UInt16 => "uint16",
            DType::UInt32 => "uint32",
            DType::UInt64 => "uint64",
            DType::Half => "float16",
            DType::BFloat16 => "bfloat16",
            DType::Complex64 => "complex64",
        }
    }

    /// Returns the name TensorFlow's C++ kernels use in their messages (`float`, `double`,
    /// `half`), where Python says `float32`, `float64`, `float16`.
    pub fn tf_name(self) -> &'static str {
        match self {
            DType::Float => "float",
            DType::Double => "double",
            DType::Half => "half",
            other => other.name(),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proto_numbers_round_trip() {
        let mut numbers = Vec::new();
        for dtype in DType::ALL {
            assert_eq!(DType::from_i32(dtype.to_proto() as i32).unwrap(), dtype);
            assert_eq!(
                DType::from_i32(dtype.to_proto() as i32 + 100).unwrap(),
                dtype
            );
            numbers.push(dtype.to_proto() as i32);
        }
        assert!(numbers.is_sorted(), "ALL is in TensorFlow's order");
        assert_eq!(DType::from_i32(1).unwrap(), DType::Float);
        assert_eq!(DType::from_i32(9).unwrap(), DType::Int64);
        assert_eq!(DType::from_i32(101).unwrap(), DType::Float);
        assert_eq!(DType::from_i32(119).unwrap(), DType::Half);
        assert_eq!(DType::from_i32(114).unwrap(), DType::BFloat16);
        assert_eq!(
            DType::from_i32(18).unwrap_err().code(),
            crate::error::Code::Unimplemented
        );
        assert_eq!(
            DType::from_i32(999).unwrap_err().code(),
            crate::error::Code::InvalidArgument
        );
    }
}
