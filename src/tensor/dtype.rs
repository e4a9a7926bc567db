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
}

impl DType {
    /// Every dtype, in TensorFlow's numbering order.
    pub const ALL: [DType; 8] = [
        DType::Float,
        DType::Double,
        DType::Int32,
        DType::String,
        DType::Int64,
        DType::Bool,
        DType::Resource,
        DType::Variant,
    ];

    /// Returns the size of one element in bytes, or `None` for variable-size types.
    pub fn size(self) -> Option<usize> {
        match self {
            DType::Float | DType::Int32 => Some(4),
            DType::Double | DType::Int64 => Some(8),
            DType::Bool => Some(1),
            DType::String | DType::Resource | DType::Variant => None,
        }
    }

    /// Whether the type is a floating-point type (the types gradients flow through).
    pub fn is_float(self) -> bool {
        matches!(self, DType::Float | DType::Double)
    }

    /// Whether the type is a signed integer type.
    pub fn is_integer(self) -> bool {
        matches!(self, DType::Int32 | DType::Int64)
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
            other => {
                return Err(Status::unimplemented(format!(
                    "data type {} is not supported by tessera (supported: float32, float64, \
                     int32, int64, bool, string, resource, variant)",
                    other.as_str_name()
                )))
            }
        })
    }

    /// Reads a raw `DataType` number as found in a message.
    pub fn from_i32(raw: i32) -> Result<Self> {
        let dtype = DataType::try_from(raw)
            .map_err(|_| Status::invalid_argument(format!("unknown data type number {raw}")))?;
        Self::from_proto(dtype)
    }

    /// Returns the Python-style name (`float32`, `int64`, ...).
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
        for dtype in DType::ALL {
            assert_eq!(DType::from_i32(dtype.to_proto() as i32).unwrap(), dtype);
        }
        assert_eq!(DType::from_i32(1).unwrap(), DType::Float);
        assert_eq!(DType::from_i32(9).unwrap(), DType::Int64);
        assert_eq!(DType::from_i32(101).unwrap(), DType::Float);
        assert_eq!(
            DType::from_i32(19).unwrap_err().code(),
            crate::error::Code::Unimplemented
        );
        assert_eq!(
            DType::from_i32(999).unwrap_err().code(),
            crate::error::Code::InvalidArgument
        );
    }
}
