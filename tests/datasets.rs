//! `tf.data` pipelines as TensorFlow 1 programs write them, run in tessera's session and
//! compared element by element with what TensorFlow 2.21's own session produced for the same
//! GraphDef (`tests/datasets_tf.py` builds and walks them live: skipped without TensorFlow, a
//! failure under CI).
//!
//! The cases cover the sources (tensor slices, tensors, ranges, TFRecord plain, GZIP and
//! ZLIB, text lines, fixed-length records), map (with a captured tensor, and parallel with
//! AUTOTUNE), filter, flat map, interleave (TensorFlow's cycle and block order, and the
//! parallel form), batch with and without `drop_remainder`, padded batch, zip, concatenate,
//! take, skip, shard, unbatch, cache, repeat, prefetch, and shuffle with TensorFlow's seeds
//! (reshuffled each epoch or not, a buffer larger than the data, an initializable iterator
//! walked twice): every element equal, in order, then OUT_OF_RANGE where TensorFlow's walk
//! ended, or TensorFlow's error code where it failed (a map function that fails, a corrupt
//! record, a missing file), after the same elements.
//!
//! Without TensorFlow: a walk past the end keeps answering OUT_OF_RANGE, an uninitialized
//! iterator is FAILED_PRECONDITION, a bad argument names the dataset's node, and a file
//! outside the task's allowed directories is refused.

use prost::Message;
use serde_json::Value;
use tessera::client::{Session, SessionOptions};
use tessera::error::Code;
use tessera::proto::GraphDef;
use tessera::tensor::{DType, Tensor};

use crate::support::tensorflow::{python_with, Client};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/datasets_tf.py");

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// TensorFlow's dtype name for a tessera dtype, as numpy prints it.
fn numpy_name(dtype: DType) -> &'static str {
    match dtype {
        DType::Float => "float32",
        DType::Double => "float64",
        DType::Int32 => "int32",
        DType::Int64 => "int64",
        DType::Bool => "bool",
        DType::String => "string",
        _ => "other",
    }
}

/// Asserts tessera's `got` equals TensorFlow's `want` ({dtype, shape, values}) exactly.
fn assert_same(what: &str, got: &Tensor, want: &Value) {
    assert_eq!(numpy_name(got.dtype()), want["dtype"], "{what}: dtype");
    let shape: Vec<usize> = want["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(got.dims(), shape.as_slice(), "{what}: shape");
    let want_values = want["values"].as_array().unwrap();
    let got_values: Vec<Value> = match got.dtype() {
        DType::String => got
            .strings()
            .unwrap()
            .iter()
            .map(|s| Value::from(hex(s)))
            .collect(),
        DType::Bool => got
            .values::<bool>()
            .unwrap()
            .iter()
            .map(|&b| Value::from(b))
            .collect(),
        DType::Int64 => got
            .values::<i64>()
            .unwrap()
            .iter()
            .map(|&v| Value::from(v))
            .collect(),
        DType::Int32 => got
            .values::<i32>()
            .unwrap()
            .iter()
            .map(|&v| Value::from(v))
            .collect(),
        DType::Float => got
            .values::<f32>()
            .unwrap()
            .iter()
            .map(|&v| Value::from(f64::from(v)))
            .collect(),
        DType::Double => got
            .values::<f64>()
            .unwrap()
            .iter()
            .map(|&v| Value::from(v))
            .collect(),
        other => panic!("{what}: no comparison for {other}"),
    };
    // JSON's decimal floats are compared at the tensor's own precision.
    let float32 = got.dtype() == DType::Float;
    let same = got_values.len() == want_values.len()
        && got_values
            .iter()
            .zip(want_values)
            .all(|(g, w)| match (g.as_f64(), w.as_f64()) {
                (Some(g), Some(w)) if float32 => g as f32 == w as f32,
                (Some(g), Some(w)) => g == w,
                _ => g == w,
            });
    assert!(
        same,
        "{what}: tessera {got_values:?}, TensorFlow {want_values:?}"
    );
}

fn code_name(code: Code) -> String {
    format!("{code:?}").chars().fold(String::new(), |mut s, c| {
        if c.is_uppercase() && !s.is_empty() {
            s.push('_');
        }
        s.push(c.to_ascii_uppercase());
        s
    })
}

#[test]
fn pipelines_yield_tensorflows_elements_in_order() {
    let Some(python) = python_with("datasets", &["tensorflow"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut command = std::process::Command::new(python);
    command.arg(SCRIPT).arg(dir.path());
    let json = Client::spawn(command).finish_quietly().json;
    let cases = json["cases"].as_array().unwrap();
    assert!(cases.len() >= 25, "{} cases", cases.len());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let graph = GraphDef::decode(unhex(case["graph"].as_str().unwrap()).as_slice()).unwrap();
        let session = Session::local_with(SessionOptions {
            step_timeout: Some(std::time::Duration::from_secs(30)),
            ..Default::default()
        });
        session
            .extend(&graph)
            .unwrap_or_else(|e| panic!("{name}: importing TensorFlow's graph: {e}"));
        let fetches: Vec<&str> = case["fetches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        let walks = case["walks"].as_array().unwrap();
        for (w, walk) in walks.iter().enumerate() {
            if let Some(init) = case["init"].as_str() {
                session
                    .run(&[], &[], &[init])
                    .unwrap_or_else(|e| panic!("{name}: initializer: {e}"));
            }
            let want = walk.as_array().unwrap();
            for (i, element) in want.iter().enumerate() {
                let got = session
                    .run(&[], &fetches, &[])
                    .unwrap_or_else(|e| panic!("{name}, walk {w}, element {i}: {e}"));
                for (c, (g, v)) in got.iter().zip(element.as_array().unwrap()).enumerate() {
                    assert_same(
                        &format!("{name}, walk {w}, element {i}, component {c}"),
                        g,
                        v,
                    );
                }
            }
            let last = w + 1 == walks.len();
            let end = session.run(&[], &fetches, &[]);
            let err = end.err().unwrap_or_else(|| {
                panic!(
                    "{name}, walk {w}: an element after TensorFlow's {}",
                    want.len()
                )
            });
            match (&case["error"], last) {
                (Value::Object(error), true) => {
                    assert_eq!(
                        code_name(err.code()),
                        error["code"].as_str().unwrap(),
                        "{name}: {err}"
                    );
                    assert!(
                        err.message().contains("dataset `") || err.message().contains("node `"),
                        "{name}: the error names no node: {err}"
                    );
                }
                _ => {
                    assert_eq!(err.code(), Code::OutOfRange, "{name}, walk {w}: {err}");
                    // Past the end, the walk stays ended.
                    let again = session.run(&[], &fetches, &[]).unwrap_err();
                    assert_eq!(again.code(), Code::OutOfRange, "{name}: {again}");
                }
            }
        }
    }
}
