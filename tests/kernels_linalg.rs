//! `Einsum`, `MatrixInverse`, `HistogramFixedWidth` and `Case`:
//!
//! - against stock TensorFlow 2.21's own values on seeded inputs
//!   (`tests/kernels_linalg_tf.py` computes them live: skipped without TensorFlow, a failure
//!   under CI): einsums of every kind of equation (products, ellipsis broadcasting, traces,
//!   diagonals read and written, reductions, empty dimensions) within a few ulps, inverses
//!   within 1e-5 of the largest entry (LU rounds in another order than Eigen's blocks),
//!   histograms exactly, TensorFlow's code and message for each input it refuses, the
//!   builder's gradients against `tf.GradientTape`'s, and a graph TensorFlow wrote with
//!   `tf.switch_case` run through a session for indices in and out of range;
//! - without TensorFlow: the shape functions, the implicit equations of `Graph::einsum`, and a
//!   `Case` built by hand with a branch missing from the library.

use crate::kernels_support::json::{array, assert_refused_as_in_tensorflow, dtype_named, tensor};
use crate::kernels_support::*;
use crate::support::tensorflow::script_json;
use prost::Message;
use serde_json::Value;
use tessera::client::Session;
use tessera::error::Code;
use tessera::graph::{gradients, Graph, Output};
use tessera::proto::{AttrValue, GraphDef};
use tessera::tensor::{DType, PartialShape, Tensor};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kernels_linalg_tf.py");

/// An attr the script encoded as `{type|i|b|s: ...}`.
fn attr(v: &Value) -> AttrValue {
    let (kind, x) = v.as_object().unwrap().iter().next().unwrap();
    match kind.as_str() {
        "type" => value::dtype(dtype_named(x.as_str().unwrap())),
        "i" => value::int(x.as_i64().unwrap()),
        "b" => value::bool(x.as_bool().unwrap()),
        "s" => value::string(x.as_str().unwrap()),
        other => panic!("attr kind {other}"),
    }
}

/// Asserts `got` holds `want`'s dtype, shape and values: integers exactly, floats within
/// `tol` times the largest magnitude of `want` (at least 1).
fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    let (g, w) = (as_f64s(got), as_f64s(want));
    let scale = w.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    for (i, (g, w)) in g.iter().zip(&w).enumerate() {
        let exact = !want.dtype().is_float();
        let ok = if exact {
            g == w
        } else {
            (g - w).abs() <= tol * scale
        };
        assert!(ok, "{what}: element {i}: tessera {g}, TensorFlow {w}");
    }
}

/// Runs one of the script's cases on tessera's kernel and compares its output, or its error's
/// code and message, with TensorFlow's.
fn check_case(case: &Value) {
    let op = case["op"].as_str().unwrap();
    let what = format!("{op} ({})", case["name"].as_str().unwrap());
    let mut b = node(op);
    for (k, v) in case["attrs"].as_object().unwrap() {
        b = b.attr(k, attr(v));
    }
    let inputs: Vec<Tensor> = array(&case["inputs"]).iter().map(tensor).collect();
    let result = b.run(inputs);
    if let Some(error) = case.get("error") {
        let code = error["code"].as_str().unwrap();
        let message = error["message"].as_str().unwrap().trim();
        assert_refused_as_in_tensorflow(&what, op, result, code, message);
        return;
    }
    let got = result.unwrap_or_else(|e| panic!("{what}: {e}"));
    let want = tensor(&case["output"]);
    let tol = match (op, want.dtype()) {
        ("MatrixInverse", DType::Float) => 1e-5,
        ("MatrixInverse", _) => 1e-12,
        (_, DType::Float) => 1e-6,
        _ => 1e-13,
    };
    assert_close(&what, &got[0], &want, tol);
}

/// The builder's gradients of `sum(weights * op(inputs))` through a local session, against
/// `tf.GradientTape`'s.
fn check_gradient(case: &Value) {
    let op = case["op"].as_str().unwrap();
    let what = format!("gradient of {op} ({})", case["name"].as_str().unwrap());
    let inputs: Vec<Tensor> = array(&case["inputs"]).iter().map(tensor).collect();
    let mut g = Graph::new();
    let mut feeds = Vec::new();
    let x: Vec<Output> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let dims: Vec<Option<usize>> = t.dims().iter().map(|&d| Some(d)).collect();
            let name = format!("x{i}");
            feeds.push((format!("{name}:0"), t.clone()));
            g.placeholder(&name, t.dtype(), PartialShape::new(dims))
                .unwrap()
        })
        .collect();
    let y = match op {
        "Einsum" => g.einsum(case["attrs"]["equation"].as_str().unwrap(), &x),
        _ => g.matrix_inverse(&x[0], case["attrs"]["adjoint"].as_bool().unwrap()),
    }
    .unwrap();
    let w = g.constant(&tensor(&case["weights"])).unwrap();
    let product = g.mul(&y, &w).unwrap();
    let rank = y.shape.rank().expect("known rank") as i64;
    let loss = g
        .sum(&product, &(0..rank).collect::<Vec<_>>(), false)
        .unwrap();
    let grads: Vec<String> = gradients(&mut g, std::slice::from_ref(&loss), &x, None)
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .into_iter()
        .map(|d| d.expect("every input reaches the loss").name())
        .collect();
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    let feeds: Vec<(&str, Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let fetches: Vec<&str> = grads.iter().map(String::as_str).collect();
    let got = session
        .run(&feeds, &fetches, &[])
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    for (k, want) in array(&case["grads"]).iter().enumerate() {
        let want = tensor(want);
        let tol = if want.dtype() == DType::Float {
            1e-5
        } else {
            1e-11
        };
        assert_close(&format!("{what}, input {k}"), &got[k], &want, tol);
    }
}

/// Runs the `tf.switch_case` graph TensorFlow wrote through a local session (placement on
/// the CPU, the master's rewrites, the Case kernel with the graph's library) for each index.
fn check_switch_case(case: &Value) {
    let hex = case["graph"].as_str().unwrap();
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let graph = GraphDef::decode(bytes.as_slice()).unwrap();
    assert!(
        graph.node.iter().any(|n| n.op.ends_with("Case")),
        "no Case in {:?}",
        case["ops"]
    );
    let session = Session::local();
    session.extend(&graph).unwrap();
    let x = tensor(&case["x"]);
    for run in array(&case["runs"]) {
        let index = run["index"].as_i64().unwrap() as i32;
        let out = session
            .run(
                &[("index:0", Tensor::scalar(index)), ("x:0", x.clone())],
                &["out:0"],
                &[],
            )
            .unwrap_or_else(|e| panic!("switch_case, index {index}: {e}"));
        assert_close(
            &format!("switch_case, index {index}"),
            &out[0],
            &tensor(&run["out"]),
            0.0,
        );
    }
}

#[test]
fn linalg_ops_match_tensorflow() {
    let test = "linalg_ops_match_tensorflow";
    let Some(json) = script_json(test, SCRIPT, &["tensorflow", "numpy"]) else {
        return;
    };
    let cases = array(&json["cases"]);
    let count = |op: &str| cases.iter().filter(|c| c["op"] == op).count();
    assert!(count("Einsum") >= 30 && count("MatrixInverse") >= 12);
    assert!(count("HistogramFixedWidth") >= 14);
    cases.iter().for_each(check_case);
    let grads = array(&json["gradients"]);
    assert!(grads.len() >= 12);
    grads.iter().for_each(check_gradient);
    check_switch_case(&json["case"]);
    let refused = cases.iter().filter(|c| c.get("error").is_some()).count();
    eprintln!(
        "{} cases ({refused} refused with TensorFlow's code and message), {} gradients and \
         tf.switch_case match TensorFlow",
        cases.len(),
        grads.len()
    );
}

#[test]
fn shape_functions_and_implicit_equations_follow_tensorflow() {
    let mut g = Graph::new();
    let known = |d: &[usize]| PartialShape::new(d.iter().map(|&d| Some(d)).collect::<Vec<_>>());
    let a = g.placeholder("a", DType::Float, known(&[2, 3])).unwrap();
    let b = g
        .placeholder("b", DType::Float, PartialShape::new(vec![None, Some(5)]))
        .unwrap();
    let ab = g.einsum("ij,jk", &[a.clone(), b.clone()]).unwrap();
    assert_eq!(ab.shape.to_string(), "[2,5]");
    let t = g.einsum("ij->ji", std::slice::from_ref(&a)).unwrap();
    assert_eq!(t.shape.to_string(), "[3,2]");
    let trace = g.einsum("ii", std::slice::from_ref(&b)).unwrap();
    assert_eq!(trace.shape.to_string(), "[]");
    let batched = g
        .placeholder("c", DType::Float, known(&[4, 1, 2, 3]))
        .unwrap();
    let other = g.placeholder("d", DType::Float, known(&[6, 3, 7])).unwrap();
    let bc = g.einsum("...ij,...jk", &[batched, other]).unwrap();
    assert_eq!(bc.shape.to_string(), "[4,6,2,7]");
    let err = g.einsum("ij,jk->ik", &[a.clone(), a.clone()]).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(
        err.message().contains("Expected dimension 3 at axis 0"),
        "{err}"
    );
    let err = g.einsum("ijk->i", std::slice::from_ref(&a)).unwrap_err();
    assert!(
        err.message().contains("Expected input 0 to have rank 3"),
        "{err}"
    );

    let m = g
        .placeholder(
            "m",
            DType::Double,
            PartialShape::new(vec![Some(4), None, Some(3)]),
        )
        .unwrap();
    let inv = g.matrix_inverse(&m, false).unwrap();
    assert_eq!(inv.shape.to_string(), "[4,3,3]");
    let err = g.matrix_inverse(&a, false).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");

    let range = g.constant(&f32s(&[2], &[0.0, 1.0])).unwrap();
    let nbins = g.constant(&Tensor::scalar(7i32)).unwrap();
    let h = g
        .histogram_fixed_width(&a, &range, &nbins, DType::Int64)
        .unwrap();
    assert_eq!((h.dtype, h.shape.to_string()), (DType::Int64, "[7]".into()));
}

/// A Case graph built by hand: a branch missing from the library is named when the graph
/// runs; with it there, every index runs its branch and the rest the last.
#[test]
fn a_case_built_by_hand_runs_its_branches_and_names_a_missing_one() {
    use tessera::proto::attr_value::{ListValue, Value as Kind};
    use tessera::proto::op_def::ArgDef;
    use tessera::proto::{FunctionDef, FunctionDefLibrary, NameAttrList, NodeDef, OpDef};

    let function = |name: &str, op: &str, constant: f32| {
        let c = NodeDef {
            name: "c".into(),
            op: "Const".into(),
            attr: [
                ("dtype".to_string(), value::dtype(DType::Float)),
                (
                    "value".to_string(),
                    value::tensor(Tensor::scalar(constant).to_proto()),
                ),
            ]
            .into(),
            ..Default::default()
        };
        let y = NodeDef {
            name: "y".into(),
            op: op.into(),
            input: vec!["x".into(), "c:output:0".into()],
            attr: [("T".to_string(), value::dtype(DType::Float))].into(),
            ..Default::default()
        };
        let arg = |name: &str| ArgDef {
            name: name.into(),
            r#type: DType::Float.to_proto() as i32,
            ..Default::default()
        };
        FunctionDef {
            signature: Some(OpDef {
                name: name.into(),
                input_arg: vec![arg("x")],
                output_arg: vec![arg("out")],
                ..Default::default()
            }),
            node_def: vec![c, y],
            ret: [("out".to_string(), "y:z:0".to_string())].into(),
            ..Default::default()
        }
    };
    let branches = ["times_three", "plus_one", "minus_five"];
    let case = NodeDef {
        name: "case".into(),
        op: "Case".into(),
        input: vec!["index".into(), "x".into()],
        attr: [
            ("Tin".to_string(), value::dtype_list(&[DType::Float])),
            ("Tout".to_string(), value::dtype_list(&[DType::Float])),
            (
                "branches".to_string(),
                AttrValue {
                    value: Some(Kind::List(ListValue {
                        func: branches
                            .iter()
                            .map(|b| NameAttrList {
                                name: b.to_string(),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    })),
                },
            ),
        ]
        .into(),
        ..Default::default()
    };
    let placeholder = |name: &str, dtype: DType| NodeDef {
        name: name.into(),
        op: "Placeholder".into(),
        attr: [("dtype".to_string(), value::dtype(dtype))].into(),
        ..Default::default()
    };
    let library = |missing: bool| FunctionDefLibrary {
        function: vec![
            function("times_three", "Mul", 3.0),
            function("plus_one", "AddV2", 1.0),
            function("minus_five", "Sub", 5.0),
        ]
        .into_iter()
        .filter(|f| !(missing && f.signature.as_ref().unwrap().name == "plus_one"))
        .collect(),
        ..Default::default()
    };
    let graph = |missing: bool| GraphDef {
        node: vec![
            placeholder("index", DType::Int32),
            placeholder("x", DType::Float),
            case.clone(),
        ],
        library: Some(library(missing)),
        ..Default::default()
    };

    let session = Session::local();
    session.extend(&graph(false)).unwrap();
    let x = f32s(&[2], &[2.0, -1.0]);
    for (index, want) in [
        (0, [6.0, -3.0]),
        (1, [3.0, 0.0]),
        (2, [-3.0, -6.0]),
        (3, [-3.0, -6.0]),
        (-4, [-3.0, -6.0]),
    ] {
        let out = session
            .run(
                &[("index:0", Tensor::scalar(index)), ("x:0", x.clone())],
                &["case:0"],
                &[],
            )
            .unwrap_or_else(|e| panic!("index {index}: {e}"));
        assert_f32(&out[0], &[2], &want, 0.0);
    }

    let session = Session::local();
    let err = session
        .extend(&graph(true))
        .and_then(|()| {
            session.run(
                &[("index:0", Tensor::scalar(0)), ("x:0", x.clone())],
                &["case:0"],
                &[],
            )
        })
        .expect_err("a branch is missing");
    assert_eq!(err.code(), Code::NotFound, "{err}");
    assert!(err.message().contains("plus_one"), "{err}");
}
