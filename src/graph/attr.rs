//! Typed access to a `NodeDef`'s attrs, with errors that name the node and the attr.

use crate::error::{Result, Status};
use crate::proto::{attr_value, AttrValue, NodeDef, TensorProto};
use crate::tensor::{DType, PartialShape};

fn missing(node: &NodeDef, name: &str) -> Status {
    Status::invalid_argument(format!(
        "node `{}` (op {}) has no attr `{name}`",
        node.name, node.op
    ))
}

fn wrong_kind(node: &NodeDef, name: &str, want: &str) -> Status {
    Status::invalid_argument(format!(
        "attr `{name}` of node `{}` (op {}) is not a {want}",
        node.name, node.op
    ))
}

/// Returns the attr's value, if the node has it.
pub fn get<'a>(node: &'a NodeDef, name: &str) -> Option<&'a attr_value::Value> {
    node.attr.get(name).and_then(|a| a.value.as_ref())
}

/// Reads a `type` attr (`T`, `dtype`, ...).
pub fn dtype(node: &NodeDef, name: &str) -> Result<DType> {
    match get(node, name) {
        Some(attr_value::Value::Type(t)) => {
            DType::from_i32(*t).map_err(|e| e.context(format!("node `{}`", node.name)))
        }
        Some(_) => Err(wrong_kind(node, name, "type")),
        None => Err(missing(node, name)),
    }
}

/// Reads a `bool` attr.
pub fn bool(node: &NodeDef, name: &str) -> Result<bool> {
    match get(node, name) {
        Some(attr_value::Value::B(b)) => Ok(*b),
        Some(_) => Err(wrong_kind(node, name, "bool")),
        None => Err(missing(node, name)),
    }
}

/// Reads a `bool` attr, or `default` when absent.
pub fn bool_or(node: &NodeDef, name: &str, default: bool) -> Result<bool> {
    match get(node, name) {
        Some(attr_value::Value::B(b)) => Ok(*b),
        Some(_) => Err(wrong_kind(node, name, "bool")),
        None => Ok(default),
    }
}

/// Reads an `int` attr.
pub fn int(node: &NodeDef, name: &str) -> Result<i64> {
    match get(node, name) {
        Some(attr_value::Value::I(i)) => Ok(*i),
        Some(_) => Err(wrong_kind(node, name, "int")),
        None => Err(missing(node, name)),
    }
}

/// Reads an `int` attr, or `default` when absent.
pub fn int_or(node: &NodeDef, name: &str, default: i64) -> Result<i64> {
    match get(node, name) {
        None => Ok(default),
        Some(_) => int(node, name),
    }
}

/// Reads a `float` attr, or `default` when absent.
pub fn float_or(node: &NodeDef, name: &str, default: f32) -> Result<f32> {
    match get(node, name) {
        Some(attr_value::Value::F(f)) => Ok(*f),
        Some(_) => Err(wrong_kind(node, name, "float")),
        None => Ok(default),
    }
}

/// Reads a `string` attr as UTF-8, or `default` when absent.
pub fn string_or(node: &NodeDef, name: &str, default: &str) -> Result<String> {
    match get(node, name) {
        Some(attr_value::Value::S(s)) => String::from_utf8(s.to_vec()).map_err(|_| {
            Status::invalid_argument(format!(
                "attr `{name}` of node `{}` is not UTF-8",
                node.name
            ))
        }),
        Some(_) => Err(wrong_kind(node, name, "string")),
        None => Ok(default.to_string()),
    }
}

/// Reads a `shape` attr.
pub fn shape(node: &NodeDef, name: &str) -> Result<PartialShape> {
    match get(node, name) {
        Some(attr_value::Value::Shape(s)) => {
            PartialShape::from_proto(s).map_err(|e| e.context(format!("node `{}`", node.name)))
        }
        Some(_) => Err(wrong_kind(node, name, "shape")),
        None => Err(missing(node, name)),
    }
}

/// Reads a `tensor` attr (a Const's `value`).
pub fn tensor<'a>(node: &'a NodeDef, name: &str) -> Result<&'a TensorProto> {
    match get(node, name) {
        Some(attr_value::Value::Tensor(t)) => Ok(t),
        Some(_) => Err(wrong_kind(node, name, "tensor")),
        None => Err(missing(node, name)),
    }
}

/// Reads a `list(int)` attr, or an empty list when absent.
pub fn int_list(node: &NodeDef, name: &str) -> Result<Vec<i64>> {
    match get(node, name) {
        Some(attr_value::Value::List(l)) => Ok(l.i.clone()),
        Some(_) => Err(wrong_kind(node, name, "list(int)")),
        None => Ok(Vec::new()),
    }
}

/// Reads a `list(string)` attr as UTF-8 strings (`_class`), or an empty list when absent.
pub fn string_list(node: &NodeDef, name: &str) -> Result<Vec<String>> {
    match get(node, name) {
        Some(attr_value::Value::List(l)) => Ok(l
            .s
            .iter()
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect()),
        Some(_) => Err(wrong_kind(node, name, "list(string)")),
        None => Ok(Vec::new()),
    }
}

/// Reads a `list(type)` attr, or an empty list when absent.
pub fn dtype_list(node: &NodeDef, name: &str) -> Result<Vec<DType>> {
    match get(node, name) {
        Some(attr_value::Value::List(l)) => l.r#type.iter().map(|&t| DType::from_i32(t)).collect(),
        Some(_) => Err(wrong_kind(node, name, "list(type)")),
        None => Ok(Vec::new()),
    }
}

/// Builds attr values.
pub mod value {
    use super::*;
    use crate::proto::attr_value::ListValue;

    /// A `type` attr.
    pub fn dtype(d: DType) -> AttrValue {
        AttrValue {
            value: Some(attr_value::Value::Type(d.to_proto() as i32)),
        }
    }
    /// A `bool` attr.
    pub fn bool(b: bool) -> AttrValue {
        AttrValue {
            value: Some(attr_value::Value::B(b)),
        }
    }
    /// An `int` attr.
    pub fn int(i: i64) -> AttrValue {
        AttrValue {
            value: Some(attr_value::Value::I(i)),
        }
    }
    /// A `float` attr.
    pub fn float(f: f32) -> AttrValue {
        AttrValue {
            value: Some(attr_value::Value::F(f)),
        }
    }
    /// A `string` attr.
    pub fn string(s: impl AsRef<[u8]>) -> AttrValue {
        AttrValue {
            value: Some(attr_value::Value::S(bytes::Bytes::copy_from_slice(
                s.as_ref(),
            ))),
        }
    }
    /// A `shape` attr.
    pub fn shape(s: &PartialShape) -> AttrValue {
        AttrValue {
            value: Some(attr_value::Value::Shape(s.to_proto())),
        }
    }
    /// A `tensor` attr.
    pub fn tensor(t: TensorProto) -> AttrValue {
        AttrValue {
            value: Some(attr_value::Value::Tensor(t)),
        }
    }
    /// A `list(int)` attr.
    pub fn int_list(i: Vec<i64>) -> AttrValue {
        AttrValue {
            value: Some(attr_value::Value::List(ListValue {
                i,
                ..Default::default()
            })),
        }
    }
    /// A `list(string)` attr.
    pub fn string_list<S: AsRef<[u8]>>(s: impl IntoIterator<Item = S>) -> AttrValue {
        let s = s
            .into_iter()
            .map(|s| bytes::Bytes::copy_from_slice(s.as_ref()))
            .collect();
        AttrValue {
            value: Some(attr_value::Value::List(ListValue {
                s,
                ..Default::default()
            })),
        }
    }
    /// A `list(type)` attr.
    pub fn dtype_list(types: &[DType]) -> AttrValue {
        let r#type = types.iter().map(|d| d.to_proto() as i32).collect();
        AttrValue {
            value: Some(attr_value::Value::List(ListValue {
                r#type,
                ..Default::default()
            })),
        }
    }
}
