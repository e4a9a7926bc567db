//! The embedding kernels (gathers on any axis with batch dimensions, `ResourceGather`, the
//! `ResourceScatter*` updates, `Unique`, the segment reductions and the sparse segment gradient
//! ops, `DynamicPartition`, `DynamicStitch`): against stock TensorFlow 2.21's own numbers and
//! errors on seeded inputs (`tests/kernels_sparse_tf.py` computes them live: skipped without
//! TensorFlow, a failure under CI); a graph TensorFlow 1 code wrote with these ops and their
//! gradients, run in a tessera session to TensorFlow's values; and a few cases worked out by
//! hand (no TensorFlow needed), in-place scatters among them.
//!
//! Integer and bool outputs must be equal; float ones agree to 1e-5 (float32) or 1e-12
//! (float64) of the largest magnitude in each output tensor, since sums may run in another
//! order. An error must have TensorFlow's code and contain TensorFlow's message.

use std::process::Command;
use std::sync::Arc;

use crate::kernels_support::*;
use crate::support::tensorflow::{python_with, script_json, Client};
use serde_json::Value;
use tessera::error::Code;
use tessera::graph::registry::dtype_named;
use tessera::runtime::resource::{ResourceMgr, Var};
use tessera::tensor::{DType, PartialShape, ResourceHandle, Tensor};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kernels_sparse_tf.py");

/// A tensor from the script's `{"dtype", "shape", "values"}`.
fn tensor(v: &Value) -> Tensor {
    let dims: Vec<usize> = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let values = v["values"].as_array().unwrap();
    let f = |x: &Value| x.as_f64().unwrap();
    let i = |x: &Value| x.as_i64().unwrap();
    match v["dtype"].as_str().unwrap() {
        "float32" => Tensor::from_vec(dims, values.iter().map(|x| f(x) as f32).collect()),
        "float64" => Tensor::from_vec(dims, values.iter().map(f).collect()),
        "int32" => Tensor::from_vec(dims, values.iter().map(|x| i(x) as i32).collect()),
        "int64" => Tensor::from_vec(dims, values.iter().map(i).collect()),
        "bool" => Tensor::from_vec(dims, values.iter().map(|x| x.as_bool().unwrap()).collect()),
        other => panic!("dtype {other}"),
    }
    .unwrap()
}

/// The case's inputs, lists (DynamicStitch's) flattened in order.
fn inputs(case: &Value) -> Vec<Tensor> {
    let mut out = Vec::new();
    for v in case["inputs"].as_array().unwrap() {
        match v.as_array() {
            Some(list) => out.extend(list.iter().map(tensor)),
            None => out.push(tensor(v)),
        }
    }
    out
}

fn node_of(case: &Value) -> NodeBuilder {
    let mut b = node(case["op"].as_str().unwrap());
    for (k, v) in case["attrs"].as_object().unwrap() {
        let (kind, value) = (v[0].as_str().unwrap(), &v[1]);
        let attr = match kind {
            "int" => value::int(value.as_i64().unwrap()),
            "bool" => value::bool(value.as_bool().unwrap()),
            _ => value::dtype(dtype_named(value.as_str().unwrap()).unwrap()),
        };
        b = b.attr(k, attr);
    }
    b
}

/// Asserts `got` equals TensorFlow's `want` (see the module doc for the tolerances).
fn assert_matches(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    let close = |g: &[f64], w: &[f64], tol: f64| {
        let scale = w.iter().fold(1f64, |m, v| m.max(v.abs()));
        for (i, (g, w)) in g.iter().zip(w).enumerate() {
            assert!(
                (g - w).abs() <= tol * scale,
                "{what}: element {i}: tessera {g}, TensorFlow {w}"
            );
        }
    };
    match got.dtype() {
        DType::Float => {
            let g: Vec<f64> = got
                .values::<f32>()
                .unwrap()
                .iter()
                .map(|&v| v as f64)
                .collect();
            let w: Vec<f64> = want
                .values::<f32>()
                .unwrap()
                .iter()
                .map(|&v| v as f64)
                .collect();
            close(&g, &w, 1e-5);
        }
        DType::Double => close(
            &got.values::<f64>().unwrap(),
            &want.values::<f64>().unwrap(),
            1e-12,
        ),
        DType::Int32 => assert_eq!(
            got.values::<i32>().unwrap(),
            want.values::<i32>().unwrap(),
            "{what}"
        ),
        DType::Int64 => assert_eq!(
            got.values::<i64>().unwrap(),
            want.values::<i64>().unwrap(),
            "{what}"
        ),
        DType::Bool => assert_eq!(
            got.values::<bool>().unwrap(),
            want.values::<bool>().unwrap(),
            "{what}"
        ),
        other => panic!("{what}: dtype {other}"),
    }
}

/// A resource variable named `table` holding `value`, and its handle.
fn table(resources: &ResourceMgr, value: Tensor) -> (Arc<Var>, Tensor) {
    let var: Arc<Var> = resources
        .lookup_or_create("localhost", "table", || {
            Ok(Var::new(value.dtype(), PartialShape::from(value.shape())))
        })
        .unwrap();
    *var.write() = Some(value);
    let handle = Tensor::resource(ResourceHandle {
        device: DEVICE.into(),
        container: "localhost".into(),
        name: "table".into(),
        type_name: "Var".into(),
    });
    (var, handle)
}

/// Runs one case; returns its outputs or its error.
fn run_case(case: &Value) -> tessera::Result<Vec<Tensor>> {
    let resources = ResourceMgr::new();
    let mut ins = inputs(case);
    let var = case.get("var").map(|v| {
        let (var, handle) = table(&resources, tensor(v));
        ins.insert(0, handle);
        var
    });
    let outs = node_of(case).run_on(ins, &resources)?;
    match var {
        Some(var) if outs.is_empty() => Ok(vec![var.snapshot().unwrap()]),
        _ => Ok(outs),
    }
}

fn code_named(name: &str) -> Code {
    match name {
        "InvalidArgumentError" => Code::InvalidArgument,
        "NotFoundError" => Code::NotFound,
        "FailedPreconditionError" => Code::FailedPrecondition,
        "OutOfRangeError" => Code::OutOfRange,
        "UnimplementedError" => Code::Unimplemented,
        "ResourceExhaustedError" => Code::ResourceExhausted,
        other => panic!("unmapped TensorFlow error {other}"),
    }
}

#[test]
fn embedding_kernels_match_tensorflow() {
    let test = "embedding_kernels_match_tensorflow";
    let Some(json) = script_json(test, SCRIPT, &["tensorflow", "numpy"]) else {
        return;
    };
    let cases = json["cases"].as_array().unwrap();
    assert!(cases.len() >= 150, "too few cases: {}", cases.len());
    let (mut values, mut errors) = (0, 0);
    let mut ops = std::collections::BTreeSet::new();
    for (n, case) in cases.iter().enumerate() {
        let op = case["op"].as_str().unwrap();
        ops.insert(op.to_string());
        let what = format!("case {n}: {op} {}", case["attrs"]);
        match (run_case(case), case.get("error")) {
            (Ok(got), None) => {
                let want = case["outputs"].as_array().unwrap();
                assert_eq!(got.len(), want.len(), "{what}: outputs");
                for (i, (g, w)) in got.iter().zip(want).enumerate() {
                    assert_matches(&format!("{what} output {i}"), g, &tensor(w));
                }
                values += 1;
            }
            (Err(e), Some(err)) => {
                let (code, message) = (
                    code_named(err["code"].as_str().unwrap()),
                    err["message"].as_str().unwrap(),
                );
                assert_eq!(e.code(), code, "{what}: {e}");
                assert!(
                    e.message().contains(message),
                    "{what}: tessera says `{}`, TensorFlow `{message}`",
                    e.message()
                );
                assert!(e.message().starts_with("node `x` (op "), "{what}: {e}");
                errors += 1;
            }
            (Ok(got), Some(err)) => {
                panic!("{what}: TensorFlow fails with {err}, tessera gives {got:?}")
            }
            (Err(e), None) => panic!("{what}: tessera fails: {e}"),
        }
    }
    eprintln!(
        "{values} value cases and {errors} error cases over {} ops match TensorFlow: {ops:?}",
        ops.len()
    );
}

#[test]
fn gathers_worked_by_hand() {
    // params [2,3]: [[0,1,2],[3,4,5]]; axis 1 picks columns 2 and 0.
    let p = i32s(&[2, 3], &[0, 1, 2, 3, 4, 5]);
    let gather = |bd: i64| {
        node("GatherV2")
            .attr("Tparams", value::dtype(DType::Int32))
            .attr("batch_dims", value::int(bd))
    };
    let y = run1(gather(0), vec![p.clone(), ivec(&[2, 0]), i32s(&[], &[1])]);
    assert_exact(&y, &[2, 2], &[2, 0, 5, 3]);
    // batch_dims 1: row i picks its own columns.
    let y = run1(
        gather(1),
        vec![p.clone(), i32s(&[2, 2], &[2, 2, 0, 1]), i32s(&[], &[1])],
    );
    assert_exact(&y, &[2, 2], &[2, 2, 3, 4]);
    // Unique keeps first occurrences; -0.0 and 0.0 are one value.
    let out = node("Unique")
        .run(vec![f32s(&[4], &[0.0, 2.0, -0.0, 2.0])])
        .unwrap();
    assert_exact(&out[1], &[4], &[0i32, 1, 0, 1]);
    assert_eq!(out[0].dims(), &[2]);
    // Strings move through Unique, DynamicPartition and DynamicStitch like numbers.
    let words = |w: &[&str]| {
        Tensor::from_strings(
            [w.len()],
            w.iter().map(|s| s.as_bytes().to_vec().into()).collect(),
        )
        .unwrap()
    };
    let out = node("Unique").run(vec![words(&["b", "a", "b"])]).unwrap();
    assert_eq!(out[0].strings().unwrap(), &["b", "a"]);
    assert_exact(&out[1], &[3], &[0i32, 1, 0]);
    let parts = node("DynamicPartition")
        .attr("num_partitions", value::int(2))
        .run(vec![words(&["x", "y", "z"]), ivec(&[1, 0, 1])])
        .unwrap();
    assert_eq!(parts[1].strings().unwrap(), &["x", "z"]);
    let merged = run1(
        node("DynamicStitch"),
        vec![
            ivec(&[2, 0]),
            ivec(&[1]),
            parts[1].clone(),
            parts[0].clone(),
        ],
    );
    assert_eq!(merged.strings().unwrap(), &["z", "y", "x"]);
}

#[test]
fn scatters_update_the_variable_in_place_and_reject_bad_updates() {
    let resources = ResourceMgr::new();
    let (var, handle) = table(&resources, f32s(&[3, 2], &[1., 2., 3., 4., 5., 6.]));
    // Repeated indices apply in order: row 1 gets +1 twice.
    node("ResourceScatterAdd")
        .run_on(
            vec![handle.clone(), ivec(&[1, 1]), f32s(&[2, 2], &[1.; 4])],
            &resources,
        )
        .unwrap();
    assert_f32(
        &var.snapshot().unwrap(),
        &[3, 2],
        &[1., 2., 5., 6., 5., 6.],
        0.0,
    );
    // TensorFlow accepts updates of the right rank and element count whatever their shape;
    // tessera asks for indices.shape + params.shape[1:].
    let err = node("ResourceScatterAdd")
        .run_on(
            vec![handle.clone(), ivec(&[0, 1]), f32s(&[2, 3], &[1.; 6])],
            &resources,
        )
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("Must have updates.shape"), "{err}");
    // Strings and bools update by copy.
    let (names, handle) = {
        let r = ResourceMgr::new();
        let (v, h) = table(
            &r,
            Tensor::from_strings([2], vec!["a".into(), "b".into()]).unwrap(),
        );
        node("ResourceScatterUpdate")
            .run_on(
                vec![
                    h.clone(),
                    ivec(&[1]),
                    Tensor::from_strings([1], vec!["z".into()]).unwrap(),
                ],
                &r,
            )
            .unwrap();
        (v, h)
    };
    assert_eq!(names.snapshot().unwrap().strings().unwrap()[1], "z");
    drop(handle);
    // An uninitialized variable is FAILED_PRECONDITION, as tessera's reads are.
    let empty = ResourceMgr::new();
    let h = Tensor::resource(ResourceHandle {
        device: DEVICE.into(),
        container: "localhost".into(),
        name: "nothing".into(),
        type_name: "Var".into(),
    });
    for op in ["ResourceGather", "DisableCopyOnRead"] {
        let mut ins = vec![h.clone()];
        if op == "ResourceGather" {
            ins.push(ivec(&[0]));
        }
        let err = node(op).run_on(ins, &empty).unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{op}: {err}");
    }
    // VariableShape and DisableCopyOnRead on an existing variable.
    let shape = node("VariableShape")
        .run_on(
            vec![table(&resources, f32s(&[3, 2], &[0.; 6])).1],
            &resources,
        )
        .unwrap();
    assert_exact(&shape[0], &[2], &[3i32, 2]);
}

/// A graph written by TensorFlow 1 code (embedding lookups, segment reductions, partition
/// and stitch, tf.gradients through them, a GradientDescent step whose sparse update is a
/// ResourceScatterAdd) runs in a tessera session to TensorFlow's values: the op defs accept
/// the nodes TensorFlow writes, and the kernels compute what TensorFlow's do.
#[test]
fn a_tensorflow_embedding_graph_runs_to_tensorflows_values() {
    use prost::Message;
    use tessera::client::Session;
    use tessera::proto::GraphDef;

    let test = "a_tensorflow_embedding_graph_runs_to_tensorflows_values";
    let Some(python) = python_with(test, &["tensorflow", "numpy"]) else {
        return;
    };
    let mut command = Command::new(python);
    command.arg(SCRIPT).arg("graph");
    let json = Client::spawn(command).finish_quietly().json;
    let hex = json["graph_def"].as_str().unwrap();
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let graph = GraphDef::decode(bytes.as_slice()).unwrap();
    let session = Session::local();
    session.extend(&graph).unwrap();
    session
        .run(&[], &[], &[json["init"].as_str().unwrap()])
        .unwrap();
    let feeds: Vec<(String, Tensor)> = json["feeds"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), tensor(v)))
        .collect();
    let feeds: Vec<(&str, Tensor)> = feeds.iter().map(|(k, t)| (k.as_str(), t.clone())).collect();
    let fetches: Vec<&str> = json["fetches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    let got = session.run(&feeds, &fetches, &[]).unwrap();
    for ((name, g), want) in fetches
        .iter()
        .zip(&got)
        .zip(json["values"].as_array().unwrap())
    {
        assert_matches(name, g, &tensor(want));
    }
    session
        .run(&feeds, &[], &[json["train"].as_str().unwrap()])
        .unwrap();
    let after = session
        .run(&[], &[json["table"].as_str().unwrap()], &[])
        .unwrap();
    assert_matches("table after the step", &after[0], &tensor(&json["after"]));
}

/// A scatter into a table nobody else holds writes the touched rows into the table's own
/// buffer (no copy of the table); one into a table a reader still holds copies it, and the
/// reader keeps the old rows.
#[test]
fn scatters_write_in_place_unless_a_reader_holds_the_table() {
    let resources = ResourceMgr::new();
    let rows = 1000;
    let (var, handle) = table(&resources, f32s(&[rows, 4], &vec![1.0; rows * 4]));
    let address = |var: &Var| var.snapshot().unwrap().bytes().unwrap().as_ptr() as usize;
    let add = |idx: &[i32]| {
        node("ResourceScatterAdd")
            .run_on(
                vec![
                    handle.clone(),
                    ivec(idx),
                    f32s(&[idx.len(), 4], &vec![1.0; idx.len() * 4]),
                ],
                &resources,
            )
            .unwrap();
    };
    // The first update may copy the assigned buffer (a tensor built from a Vec cannot be
    // written through); from then on the table's own buffer is written.
    add(&[999]);
    let before = address(&var);
    add(&[7, 999]);
    assert_eq!(address(&var), before, "the table was copied");
    let held = var.snapshot().unwrap();
    add(&[7]);
    assert_ne!(address(&var), before, "a held snapshot was written through");
    assert_eq!(held.values::<f32>().unwrap()[7 * 4], 2.0);
    let now = var
        .snapshot()
        .unwrap()
        .values::<f32>()
        .unwrap()
        .into_owned();
    assert_eq!((now[7 * 4], now[999 * 4], now[0]), (3.0, 3.0, 1.0));
}
