//! Reading what the live kernel tests' Python scripts print: dtypes by name, hex strings,
//! `{dtype, shape, values}` tensors (floats as the bits of their float64 value, strings as
//! hex), elements as comparable strings, and TensorFlow's refusals.

use std::fmt::Debug;

use bytes::Bytes;
use serde_json::Value;
use tessera::error::{Code, Result};
use tessera::tensor::{DType, Tensor};

/// The dtype a script names: TensorFlow's names (the registry's reading of them), and
/// numpy's `bytes` and `object` for strings.
pub fn dtype_named(name: &str) -> DType {
    match name {
        "bytes" | "object" => DType::String,
        other => {
            tessera::graph::registry::dtype_named(other).unwrap_or_else(|| panic!("dtype {other}"))
        }
    }
}

/// The bytes of a hex string.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

pub fn array(v: &Value) -> &Vec<Value> {
    v.as_array().unwrap_or_else(|| panic!("not an array: {v}"))
}

/// A shape the script wrote as a list of dimensions.
pub fn dims(v: &Value) -> Vec<usize> {
    array(v)
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect()
}

/// The float64 values of a list of float64 bit patterns.
pub fn float_bits(v: &Value) -> Vec<f64> {
    array(v)
        .iter()
        .map(|b| f64::from_bits(b.as_u64().unwrap()))
        .collect()
}

/// A tensor the script encoded as `{dtype, shape, values}`.
pub fn tensor(v: &Value) -> Tensor {
    let shape = dims(&v["shape"]);
    values(
        &v["values"],
        dtype_named(v["dtype"].as_str().unwrap()),
        shape,
    )
}

/// A tensor of `dtype` and `shape` holding the values the script encoded: floats as float64
/// bits, integers and bools as themselves, strings as hex.
pub fn values(v: &Value, dtype: DType, shape: Vec<usize>) -> Tensor {
    values_with(v, dtype, shape, |b| f64::from_bits(b.as_u64().unwrap()))
}

/// [`values`], with the floats decoded by `float` (a script that writes `float.hex()`, say).
pub fn values_with(
    v: &Value,
    dtype: DType,
    shape: Vec<usize>,
    float: impl Fn(&Value) -> f64,
) -> Tensor {
    let values = array(v);
    let ints = || values.iter().map(|x| x.as_i64().unwrap());
    match dtype {
        DType::Float => {
            let f: Vec<f32> = values.iter().map(|x| float(x) as f32).collect();
            Tensor::from_vec(shape, f)
        }
        DType::Double => Tensor::from_vec(shape, values.iter().map(float).collect::<Vec<_>>()),
        DType::Int32 => Tensor::from_vec(shape, ints().map(|x| x as i32).collect::<Vec<_>>()),
        DType::Int64 => Tensor::from_vec(shape, ints().collect::<Vec<_>>()),
        DType::Bool => Tensor::from_vec(
            shape,
            values
                .iter()
                .map(|x| x.as_bool().unwrap())
                .collect::<Vec<_>>(),
        ),
        DType::String => Tensor::from_strings(
            shape,
            values
                .iter()
                .map(|x| Bytes::from(unhex(x.as_str().unwrap())))
                .collect(),
        ),
        other => panic!("no {other} values in a script's JSON"),
    }
    .unwrap()
}

/// The elements of a tensor as strings that compare as TensorFlow's values do: floats by
/// their bits (so NaN equals NaN), the rest by value.
pub fn elements(t: &Tensor) -> Vec<String> {
    fn shown<T: tessera::tensor::Element + Copy>(
        t: &Tensor,
        f: impl Fn(T) -> String,
    ) -> Vec<String> {
        t.values::<T>().unwrap().iter().map(|&x| f(x)).collect()
    }
    match t.dtype() {
        DType::Float => shown(t, |x: f32| format!("{:#x}", x.to_bits())),
        DType::Double => shown(t, |x: f64| format!("{:#x}", x.to_bits())),
        DType::Int32 => shown(t, |x: i32| x.to_string()),
        DType::Int64 => shown(t, |x: i64| x.to_string()),
        DType::Bool => shown(t, |x: bool| x.to_string()),
        _ => t
            .strings()
            .unwrap()
            .iter()
            .map(|s| format!("{s:?}"))
            .collect(),
    }
}

/// Asserts `got` holds `want`'s dtype, shape and values exactly, as [`elements`] shows them.
pub fn assert_same(what: &str, got: &Tensor, want: &Tensor) {
    assert_same_by(what, got, want, elements)
}

/// Asserts `got` holds `want`'s dtype, shape and values, compared as `elements` shows them.
pub fn assert_same_by(
    what: &str,
    got: &Tensor,
    want: &Tensor,
    elements: impl Fn(&Tensor) -> Vec<String>,
) {
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    let (g, w) = (elements(got), elements(want));
    if let Some(i) = (0..g.len()).find(|&i| g[i] != w[i]) {
        panic!("{what}: element {i}: tessera {}, TensorFlow {}", g[i], w[i]);
    }
}

/// Asserts tessera refused what TensorFlow refused: the same code (by name), a message that
/// contains TensorFlow's `message`, and the error naming node `x` (op `op`).
pub fn assert_refused_as_in_tensorflow<T: Debug>(
    what: &str,
    op: &str,
    result: Result<T>,
    code: &str,
    message: &str,
) {
    let err = match result {
        Ok(out) => panic!("{what}: TensorFlow refuses it, tessera returned {out:?}"),
        Err(e) => e,
    };
    let code = Code::from_str_name(code).unwrap();
    assert_eq!(err.code(), code, "{what}: {err}");
    assert!(
        err.message().contains(message),
        "{what}: tessera says `{}`, TensorFlow `{message}`",
        err.message()
    );
    assert!(
        err.message().starts_with(&format!("node `x` (op {op})")),
        "{what}: {err}"
    );
}
