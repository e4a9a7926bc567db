//! The everyday ops stock TensorFlow graphs bring: `Pad`, `PadV2`, `MirrorPad` (`REFLECT` and
//! `SYMMETRIC`), `MirrorPadGrad`, `Cumsum`, `Cumprod`, `TopKV2`, `InTopKV2`, `DivNoNan`,
//! `CheckNumerics` and `CheckNumericsV2`:
//!
//! - against stock TensorFlow 2.21's own numbers (`tests/kernels_everyday_tf.py` computes them
//!   live: skipped without TensorFlow, a failure under CI): every kernel on every dtype its CPU
//!   kernel takes (`TopKV2`'s unsorted order included); every gradient, built by tessera's
//!   gradient builder and run in a local session, against `tf.GradientTape`'s in float32 and
//!   float64; TensorFlow's code and message for each bad input below; and a TensorFlow 1 graph
//!   using every op, with `tf.gradients` through them, which tessera validates, imports and
//!   runs to TensorFlow's values;
//! - bad inputs (no TensorFlow needed): TensorFlow's status code and message, with the node
//!   named, from the kernels; and from a session, which runs the same graph again afterwards;
//!   the gradient of `CheckNumerics` failing on an infinite gradient in TensorFlow's words;
//! - padded outputs past a task's memory budget refused by the executor's admission check
//!   before the kernel runs, and paddings too large for any tensor refused by the kernel, both
//!   RESOURCE_EXHAUSTED naming the node.

use crate::kernels_support::json::{dims, dtype_named};
use crate::kernels_support::*;
use crate::support::tensorflow::script_json;
use bytes::Bytes;
use serde_json::Value;
use tessera::client::Session;
use tessera::error::Code;
use tessera::graph::{gradients, Graph, NodeSpec, Output};
use tessera::proto::AttrValue;
use tessera::tensor::{DType, PartialShape, Tensor};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kernels_everyday_tf.py");

/// A float the script wrote: a number, or "nan", "inf", "-inf".
fn float(v: &Value) -> f64 {
    match v.as_str() {
        Some("nan") => f64::NAN,
        Some("inf") => f64::INFINITY,
        Some("-inf") => f64::NEG_INFINITY,
        _ => v.as_f64().unwrap_or_else(|| panic!("not a float: {v}")),
    }
}

/// A tensor the script wrote as `{dtype, shape, values}`: kept here, as this script writes
/// floats as JSON numbers (or "nan", "inf") and strings as text, not bits and hex.
fn tensor(v: &Value) -> Tensor {
    let shape = dims(&v["shape"]);
    let values = v["values"].as_array().unwrap();
    match dtype_named(v["dtype"].as_str().unwrap()) {
        DType::Float => {
            let x: Vec<f32> = values.iter().map(|x| float(x) as f32).collect();
            Tensor::from_vec(shape, x)
        }
        DType::Double => Tensor::from_vec(shape, values.iter().map(float).collect::<Vec<_>>()),
        DType::Int32 => {
            let x: Vec<i32> = values.iter().map(|x| x.as_i64().unwrap() as i32).collect();
            Tensor::from_vec(shape, x)
        }
        DType::Int64 => {
            let x: Vec<i64> = values.iter().map(|x| x.as_i64().unwrap()).collect();
            Tensor::from_vec(shape, x)
        }
        DType::Bool => {
            let x: Vec<bool> = values.iter().map(|x| x.as_bool().unwrap()).collect();
            Tensor::from_vec(shape, x)
        }
        DType::String => {
            let x: Vec<Bytes> = values
                .iter()
                .map(|x| Bytes::from(x.as_str().unwrap().to_owned()))
                .collect();
            Tensor::from_strings(shape, x)
        }
        other => panic!("no tensors of {other} here"),
    }
    .unwrap()
}

/// Asserts `got` is `want`: the same dtype and shape, integers, bools and strings equal,
/// floats within a relative `tol` (float32: 2e-6, float64: 1e-12, times `scale`), NaN matching
/// NaN.
fn assert_matches(what: &str, got: &Tensor, want: &Tensor, scale: f64) {
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    match want.dtype() {
        DType::Bool => assert_eq!(
            got.values::<bool>().unwrap(),
            want.values::<bool>().unwrap(),
            "{what}"
        ),
        DType::String => assert_eq!(got.strings().unwrap(), want.strings().unwrap(), "{what}"),
        DType::Int32 | DType::Int64 => assert_eq!(as_f64s(got), as_f64s(want), "{what}"),
        dtype => {
            let tol = scale * if dtype == DType::Float { 2e-6 } else { 1e-12 };
            for (i, (g, w)) in as_f64s(got).into_iter().zip(as_f64s(want)).enumerate() {
                let ok =
                    (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * w.abs().max(1.0);
                assert!(ok, "{what}: element {i}: tessera {g}, TensorFlow {w}");
            }
        }
    }
}

/// The attr a case's JSON gives: a flag, a mode or message, or a dtype (`index_type`).
fn attr_value(key: &str, v: &Value) -> AttrValue {
    match v {
        Value::Bool(b) => value::bool(*b),
        Value::String(s) if key == "index_type" => value::dtype(dtype_named(s)),
        Value::String(s) => value::string(s),
        other => panic!("attr {key}: {other}"),
    }
}

/// The index-typed attr of an op's second input (paddings, axis, k), if it has one.
fn index_attr(op: &str) -> Option<&'static str> {
    match op {
        "Pad" | "PadV2" | "MirrorPad" | "MirrorPadGrad" => Some("Tpaddings"),
        "Cumsum" | "Cumprod" => Some("Tidx"),
        "TopKV2" => Some("Tk"),
        _ => None,
    }
}

fn check_kernel(i: usize, case: &Value) {
    let op = case["op"].as_str().unwrap();
    let inputs: Vec<Tensor> = case["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(tensor)
        .collect();
    let what = format!(
        "kernel case {i}: {op} {} on {:?}",
        case["attrs"],
        inputs
            .iter()
            .map(|t| (t.dtype(), t.dims().to_vec()))
            .collect::<Vec<_>>()
    );
    // InTopKV2's `T` is its targets' dtype; every other op's is its first input's.
    let t = if op == "InTopKV2" {
        &inputs[1]
    } else {
        &inputs[0]
    };
    let mut b = node(op).name(&format!("everyday/{op}")).t(t.dtype());
    if let Some(key) = index_attr(op) {
        b = b.attr(key, value::dtype(inputs[1].dtype()));
    }
    for (k, v) in case["attrs"].as_object().unwrap() {
        b = b.attr(k, attr_value(k, v));
    }
    let outs = b.run(inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
    let want = case["outputs"].as_array().unwrap();
    assert_eq!(outs.len(), want.len(), "{what}: outputs");
    for (k, (got, want)) in outs.iter().zip(want).enumerate() {
        assert_matches(&format!("{what}: output {k}"), got, &tensor(want), 1.0);
    }
}

/// The gradient cases, built into one graph by tessera's gradient builder and run in one
/// session: each case's differentiable inputs are fed, its other inputs are constants, and the
/// gradients are taken for the case's `dy`.
fn check_gradients(cases: &[Value]) {
    let mut g = Graph::new();
    let mut feeds: Vec<(String, Tensor)> = Vec::new();
    let mut fetches: Vec<(String, String, Tensor)> = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let op = case["op"].as_str().unwrap();
        let what = format!("gradient case {i}: {op} {}", case["attrs"]);
        let mut xs = Vec::new();
        let mut spec = NodeSpec::new(op).name(&format!("case{i}/{op}"));
        for input in case["inputs"].as_array().unwrap() {
            let t = tensor(input);
            let name = format!("case{i}/{}", input["name"].as_str().unwrap());
            let o = if input["differentiable"].as_bool().unwrap() {
                let dims = t.dims().iter().map(|&d| Some(d)).collect::<Vec<_>>();
                let p = g
                    .placeholder(&name, t.dtype(), PartialShape::new(dims))
                    .unwrap();
                feeds.push((p.name(), t));
                xs.push(p.clone());
                p
            } else {
                g.constant_proto(&name, t.to_proto()).unwrap()
            };
            spec = spec.input(&o);
        }
        for (k, v) in case["attrs"].as_object().unwrap() {
            spec = spec.attr(k, attr_value(k, v));
        }
        let outs = g.add_node(spec).unwrap_or_else(|e| panic!("{what}: {e}"));
        let y: Output = outs[case["output"].as_u64().unwrap() as usize].clone();
        let dy = g.constant(&tensor(&case["dy"])).unwrap();
        let grads =
            gradients(&mut g, &[y], &xs, Some(&[dy])).unwrap_or_else(|e| panic!("{what}: {e}"));
        for (k, (gr, want)) in grads
            .iter()
            .zip(case["grads"].as_array().unwrap())
            .enumerate()
        {
            let gr = gr
                .as_ref()
                .unwrap_or_else(|| panic!("{what}: no gradient {k}"));
            fetches.push((format!("{what}: gradient {k}"), gr.name(), tensor(want)));
        }
    }
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    let feeds: Vec<(&str, Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let names: Vec<&str> = fetches.iter().map(|(_, n, _)| n.as_str()).collect();
    let got = session.run(&feeds, &names, &[]).unwrap();
    for ((what, _, want), got) in fetches.iter().zip(&got) {
        // Sums of a few products: a few roundings more than the forward kernels.
        assert_matches(what, got, want, 4.0);
    }
}

/// TensorFlow's name of a status code.
fn code_name(code: Code) -> String {
    format!("{code:?}")
}

/// Runs the script's TensorFlow 1 graph in a local session with its feeds.
fn check_graph(json: &Value) {
    use prost::Message;
    use tessera::proto::GraphDef;
    let hex = json["graph_def"].as_str().unwrap();
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let graph = GraphDef::decode(bytes.as_slice()).unwrap();
    // What `tessera validate --graph` reports for it: nothing.
    let gaps = tessera::exec::support::unsupported(&graph);
    assert!(gaps.is_empty(), "tessera cannot run: {gaps:?}");
    let session = Session::local();
    session.extend(&graph).unwrap();
    let feeds: Vec<(String, Tensor)> = json["feeds"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), tensor(v)))
        .collect();
    let feeds: Vec<(&str, Tensor)> = feeds.iter().map(|(k, t)| (k.as_str(), t.clone())).collect();
    let fetches: Vec<(&String, &str)> = json["fetches"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k, v.as_str().unwrap()))
        .collect();
    let names: Vec<&str> = fetches.iter().map(|(_, n)| *n).collect();
    let got = session.run(&feeds, &names, &[]).unwrap();
    for ((key, name), got) in fetches.iter().zip(&got) {
        let want = tensor(&json["values"][key.as_str()]);
        assert_matches(&format!("graph fetch {key} ({name})"), got, &want, 8.0);
    }
}

#[test]
fn everyday_ops_match_tensorflow() {
    let test = "everyday_ops_match_tensorflow";
    let Some(json) = script_json(test, SCRIPT, &["tensorflow", "numpy"]) else {
        return;
    };
    let kernels = json["kernels"].as_array().unwrap();
    let grads = json["grads"].as_array().unwrap();
    let ops: std::collections::BTreeSet<&str> =
        kernels.iter().map(|c| c["op"].as_str().unwrap()).collect();
    assert_eq!(ops.len(), 11, "{ops:?}");
    assert!(kernels.len() >= 200 && grads.len() >= 40);
    for (i, case) in kernels.iter().enumerate() {
        check_kernel(i, case);
    }
    check_gradients(grads);
    // The expected messages of the bad inputs below are TensorFlow's, word for word.
    let errors = json["errors"].as_object().unwrap();
    let cases = error_cases();
    assert_eq!(
        errors.len(),
        cases.len(),
        "the script and this file have the same cases"
    );
    for case in &cases {
        let tf = &errors[case.name];
        assert_eq!(tf["code"], code_name(case.code), "{}", case.name);
        assert_eq!(tf["message"], case.message, "{}", case.name);
    }
    check_graph(&json["graph"]);
    eprintln!(
        "{} kernel cases, {} gradient cases, {} bad inputs and a TensorFlow 1 graph of {} \
         fetches match TensorFlow",
        kernels.len(),
        grads.len(),
        cases.len(),
        json["graph"]["fetches"].as_object().unwrap().len()
    );
}

/// A bad input: the node, its inputs, and TensorFlow's status for them.
struct ErrorCase {
    name: &'static str,
    node: NodeBuilder,
    inputs: Vec<Tensor>,
    code: Code,
    message: String,
}

fn zeros(dims: &[usize]) -> Tensor {
    f32s(dims, &vec![0.0; dims.iter().product()])
}

/// The bad inputs `tests/kernels_everyday_tf.py` runs through TensorFlow, by the same names.
fn error_cases() -> Vec<ErrorCase> {
    let case = |name: &'static str,
                op: &str,
                attrs: &[(&str, &str)],
                inputs: Vec<Tensor>,
                code: Code,
                message: &str| {
        let mut b = node(op).name(&format!("everyday/{name}"));
        let t = if op == "InTopKV2" {
            &inputs[1]
        } else {
            &inputs[0]
        };
        b = b.t(t.dtype());
        if let Some(key) = index_attr(op) {
            b = b.attr(key, value::dtype(inputs[1].dtype()));
        }
        for (k, v) in attrs {
            b = b.attr(k, value::string(v));
        }
        ErrorCase {
            name,
            node: b,
            inputs,
            code,
            message: message.to_string(),
        }
    };
    let bad = Code::InvalidArgument;
    let x = || zeros(&[2, 3]);
    let reflect = [("mode", "REFLECT")];
    let symmetric = [("mode", "SYMMETRIC")];
    let m = |rows: usize, v: &[i32]| i32s(&[rows, v.len() / rows], v);
    let s32 = |v: i32| i32s(&[], &[v]);
    let mut cases = vec![
        case(
            "pad_paddings_rows",
            "Pad",
            &[],
            vec![x(), m(1, &[1, 1])],
            bad,
            "The first dimension of paddings must be the rank of inputs[1,2] [2,3]",
        ),
        case(
            "pad_paddings_columns",
            "Pad",
            &[],
            vec![x(), m(2, &[1; 6])],
            bad,
            "paddings must be a matrix with 2 columns: [2,3]",
        ),
        case(
            "pad_negative",
            "Pad",
            &[],
            vec![x(), m(2, &[1, -1, 0, 0])],
            bad,
            "Paddings must be non-negative: 1 -1",
        ),
        case(
            "pad_v2_constant_not_scalar",
            "PadV2",
            &[],
            vec![x(), m(2, &[1, 1, 0, 0]), zeros(&[2])],
            bad,
            "constant_values must be a scalar. Found: [2]",
        ),
        case(
            "pad_rank_9",
            "Pad",
            &[],
            vec![zeros(&[1; 9]), m(9, &[0; 18])],
            Code::Unimplemented,
            "inputs rank not in [0,8]: 9",
        ),
        case(
            "mirror_pad_reflect_too_large",
            "MirrorPad",
            &reflect,
            vec![x(), m(2, &[2, 0, 0, 0])],
            bad,
            "paddings must be less than the dimension size: 2, 0 not less than 2",
        ),
        case(
            "mirror_pad_symmetric_too_large",
            "MirrorPad",
            &symmetric,
            vec![x(), m(2, &[3, 0, 0, 0])],
            bad,
            "paddings must be no greater than the dimension size: 3, 0 greater than 2",
        ),
        case(
            "mirror_pad_negative",
            "MirrorPad",
            &symmetric,
            vec![x(), m(2, &[-1, 0, 0, 0])],
            bad,
            "paddings must be non-negative: -1 0",
        ),
        case(
            "mirror_pad_rows",
            "MirrorPad",
            &symmetric,
            vec![x(), m(1, &[1, 0])],
            bad,
            "The first dimension of paddings must be the rank of inputs[1,2], [2,3]",
        ),
        case(
            "mirror_pad_rank_6",
            "MirrorPad",
            &reflect,
            vec![zeros(&[1; 6]), m(6, &[0; 12])],
            Code::Unimplemented,
            "inputs rank not in [0,5]: 6",
        ),
        case(
            "mirror_pad_grad_total",
            "MirrorPadGrad",
            &reflect,
            vec![x(), m(2, &[2, 0, 0, 0])],
            bad,
            "Total paddings must be less than the input dimension size: 2 was not less than 2",
        ),
        case(
            "mirror_pad_grad_reflect",
            "MirrorPadGrad",
            &reflect,
            vec![x(), m(2, &[1, 0, 0, 0])],
            bad,
            "paddings must be less than the output dimension size: 1, 0 not less than 1",
        ),
        case(
            "mirror_pad_grad_symmetric",
            "MirrorPadGrad",
            &symmetric,
            vec![zeros(&[4, 3]), m(2, &[2, 1, 0, 0])],
            bad,
            "paddings must be no greater than the output dimension size: 2, 1 greater than 1",
        ),
        case(
            "cumsum_axis_not_scalar",
            "Cumsum",
            &[],
            vec![x(), ivec(&[0])],
            bad,
            "ScanOp: axis must be a scalar, not [1]",
        ),
        case(
            "cumsum_axis_out_of_range",
            "Cumsum",
            &[],
            vec![x(), s32(2)],
            bad,
            "ScanOp: Expected scan axis in the range [-2, 2), but got 2",
        ),
        case(
            "cumprod_negative_axis",
            "Cumprod",
            &[],
            vec![x(), i64s(&[], &[-3])],
            bad,
            "ScanOp: Expected scan axis in the range [-2, 2), but got -1",
        ),
        case(
            "top_k_too_few_columns",
            "TopKV2",
            &[],
            vec![x(), s32(4)],
            bad,
            "input must have at least k columns. Had 3, needed 4",
        ),
        case(
            "top_k_negative_k",
            "TopKV2",
            &[],
            vec![x(), s32(-1)],
            bad,
            "Need k >= 0, got -1",
        ),
        case(
            "top_k_k_not_scalar",
            "TopKV2",
            &[],
            vec![x(), ivec(&[1])],
            bad,
            "k must be scalar, got shape [1]",
        ),
        case(
            "top_k_scalar_input",
            "TopKV2",
            &[],
            vec![zeros(&[]), s32(1)],
            bad,
            "input must be >= 1-D, got shape []",
        ),
        case(
            "in_top_k_k_not_scalar",
            "InTopKV2",
            &[],
            vec![x(), ivec(&[0, 1]), ivec(&[1])],
            bad,
            "k must be 0-D, got shape [1]",
        ),
        case(
            "in_top_k_batch",
            "InTopKV2",
            &[],
            vec![x(), ivec(&[0, 1, 2]), s32(1)],
            bad,
            "First dimension of predictions 2 must match length of targets 3",
        ),
        case(
            "in_top_k_predictions_rank",
            "InTopKV2",
            &[],
            vec![zeros(&[2]), ivec(&[0, 1]), s32(1)],
            bad,
            "predictions must be 2-dimensional",
        ),
        case(
            "in_top_k_targets_rank",
            "InTopKV2",
            &[],
            vec![x(), m(1, &[0, 1]), s32(1)],
            bad,
            "targets must be 1-dimensional",
        ),
        case(
            "div_no_nan_shapes",
            "DivNoNan",
            &[],
            vec![x(), f32s(&[2], &[1.0, 1.0])],
            bad,
            "Incompatible shapes: [2,3] vs. [2]",
        ),
    ];
    let (nan, inf) = (f64::NAN, f64::INFINITY);
    for (version, op) in [("", "CheckNumerics"), ("v2", "CheckNumericsV2")] {
        for (name, values, v1, v2) in [
            ("nan", vec![nan], "NaN", "NaN"),
            ("inf", vec![inf], "Inf", "+Inf"),
            ("neg_inf", vec![-inf], "Inf", "-Inf"),
            ("nan_inf", vec![nan, inf], "Inf and NaN", "+Inf and NaN"),
            (
                "nan_neg_inf",
                vec![nan, -inf],
                "Inf and NaN",
                "-Inf and NaN",
            ),
            ("infs", vec![inf, -inf], "Inf", "-Inf and +Inf"),
            (
                "all",
                vec![nan, inf, -inf],
                "Inf and NaN",
                "-Inf, +Inf, and NaN",
            ),
        ] {
            let name: &'static str = Box::leak(format!("check_numerics{version}_{name}").into());
            let mut x = vec![1.0];
            x.extend(values);
            let words = if version.is_empty() { v1 } else { v2 };
            cases.push(ErrorCase {
                name,
                node: node(op)
                    .name(&format!("everyday/{name}"))
                    .t(DType::Double)
                    .attr("message", value::string("x went bad")),
                inputs: vec![f64s(&[x.len()], &x)],
                code: bad,
                message: format!("x went bad : Tensor had {words} values"),
            });
        }
    }
    cases
}

#[test]
fn bad_inputs_fail_as_in_tensorflow_naming_the_node() {
    for case in error_cases() {
        let name = format!("`everyday/{}`", case.name);
        let err = case
            .node
            .run(case.inputs)
            .err()
            .unwrap_or_else(|| panic!("{}: the op should fail", case.name));
        assert_eq!(err.code(), case.code, "{}: {err}", case.name);
        assert!(
            err.message().contains(&case.message) && err.message().contains(&name),
            "{}: `{}` should name {name} and say `{}`",
            case.name,
            err.message(),
            case.message
        );
    }
}

/// A session whose fed inputs are bad fails the step with TensorFlow's code and a message that
/// names the node, and runs the next step as if nothing happened.
#[test]
fn a_session_reports_bad_inputs_and_keeps_running() {
    let mut g = Graph::new();
    let x = g
        .placeholder("x", DType::Float, PartialShape::new(vec![None, Some(4)]))
        .unwrap();
    let p = g
        .placeholder("p", DType::Int32, PartialShape::new(vec![Some(2), Some(2)]))
        .unwrap();
    let k = g
        .placeholder("k", DType::Int32, PartialShape::new(vec![]))
        .unwrap();
    let axis = g
        .placeholder("axis", DType::Int32, PartialShape::unknown())
        .unwrap();
    let padded = g.mirror_pad(&x, &p, "REFLECT").unwrap();
    let (values, _) = g.top_k(&x, &k, true).unwrap();
    let sums = g.cumsum(&x, &axis, false, false).unwrap();
    let checked = g.check_numerics(&x, "x is not finite").unwrap();
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    let good_x = f32s(&[2, 4], &[1.0, 5.0, 3.0, 2.0, -1.0, 0.0, 4.0, 4.0]);
    let good = || -> Vec<(&str, Tensor)> {
        vec![
            ("x", good_x.clone()),
            ("p", i32s(&[2, 2], &[1, 1, 3, 0])),
            ("k", i32s(&[], &[2])),
            ("axis", i32s(&[], &[1])),
        ]
    };
    let fetch = [padded.name(), values.name(), sums.name(), checked.name()];
    let fetch: Vec<&str> = fetch.iter().map(String::as_str).collect();
    let run = |feeds: Vec<(&str, Tensor)>| session.run(&feeds, &fetch, &[]);
    let first = run(good()).unwrap();
    assert_eq!(first[0].dims(), [4, 7]);
    assert_exact(&first[1], &[2, 2], &[5.0f32, 3.0, 4.0, 4.0]);
    let with = |key: &str, t: Tensor| {
        let mut feeds = good();
        feeds.iter_mut().find(|(k, _)| *k == key).unwrap().1 = t;
        feeds
    };
    for (feeds, node, says) in [
        (
            with("p", i32s(&[2, 2], &[1, 0, 4, 0])),
            padded.node.clone(),
            "paddings must be less than the dimension size: 4, 0 not less than 4",
        ),
        (
            with("k", i32s(&[], &[5])),
            values.node.clone(),
            "input must have at least k columns. Had 4, needed 5",
        ),
        (
            with("axis", ivec(&[1])),
            sums.node.clone(),
            "ScanOp: axis must be a scalar, not [1]",
        ),
        (
            with(
                "x",
                f32s(&[2, 4], &[1.0, f32::NAN, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]),
            ),
            checked.node.clone(),
            "x is not finite : Tensor had NaN values",
        ),
    ] {
        let err = run(feeds).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        let msg = err.message();
        assert!(msg.contains(says) && msg.contains(&node), "{node}: {msg}");
    }
    // The session still runs, to the same values.
    let again = run(good()).unwrap();
    for (a, b) in first.iter().zip(&again) {
        assert_eq!(a.bytes().unwrap(), b.bytes().unwrap());
    }
}

/// Paddings that would make an output larger than a tensor may hold fail before anything is
/// allocated.
#[test]
fn a_padding_too_large_to_hold_is_resource_exhausted() {
    let huge = 1i64 << 40;
    for (x, p) in [
        (zeros(&[4]), vec![huge, 0]),
        (zeros(&[3, 0]), vec![0, 0, huge, huge]),
        (zeros(&[1 << 10, 4]), vec![0, 0, 1 << 31, 1 << 31]),
    ] {
        let rows = p.len() / 2;
        let err = node("Pad")
            .name("everyday/huge")
            .t(DType::Float)
            .attr("Tpaddings", value::dtype(DType::Int64))
            .run(vec![x, i64s(&[rows, 2], &p)])
            .unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
        assert!(err.message().contains("`everyday/huge`"), "{err}");
    }
    // An empty output is fine however wide its padded dimension.
    let empty = node("Pad")
        .t(DType::Float)
        .attr("Tpaddings", value::dtype(DType::Int64))
        .run(vec![
            zeros(&[0, 4]),
            i64s(&[2, 2], &[0, 0, 1 << 32, 1 << 32]),
        ])
        .unwrap();
    assert_eq!(empty[0].dims(), [0, (1 << 33) + 4]);
}

/// On a task whose CPU may hold 1 MiB, a padded output past the budget is refused by the
/// executor's admission check (its message gives the output's shape) before the kernel runs,
/// naming the node; the task serves the next step.
#[test]
fn padded_outputs_past_the_memory_budget_are_refused_before_they_are_allocated() {
    use tessera::cluster::TaskConfig;
    use tessera::server::Server;

    let mut config = TaskConfig::local();
    config.devices.cpu_memory_limit = Some(1 << 20);
    let server = Server::start(config).unwrap();
    let session = Session::connect(&format!("grpc://{}", server.local_addr())).unwrap();
    let mut g = Graph::new();
    let x = g
        .placeholder("x", DType::Float, PartialShape::unknown())
        .unwrap();
    let p = g
        .placeholder("p", DType::Int64, PartialShape::unknown())
        .unwrap();
    let c = g.scalar("c", DType::Float, 1.5).unwrap();
    let outs = [
        g.pad(&x, &p).unwrap(),
        g.pad_v2(&x, &p, &c).unwrap(),
        g.mirror_pad(&x, &p, "SYMMETRIC").unwrap(),
    ];
    session.extend(&g.to_graph_def()).unwrap();
    let x = f32s(&[10, 10], &[1.0; 100]);
    let paddings = |p: i64| i64s(&[2, 2], &[p, p, 0, 0]);
    for out in &outs {
        let fetch = [out.name()];
        let fetch: Vec<&str> = fetch.iter().map(String::as_str).collect();
        // SYMMETRIC pads at most the dimension: 10 + 10 + 10 rows of 10 fit, so the mirror
        // pad goes past the budget through a wider input instead.
        let (x_big, big) = if out.node.starts_with("MirrorPad") {
            (f32s(&[100, 1000], &vec![1.0; 100_000]), paddings(100))
        } else {
            (x.clone(), paddings(100_000))
        };
        let err = session
            .run(&[("x", x_big), ("p", big)], &fetch, &[])
            .unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
        let msg = err.message();
        assert!(
            msg.contains(&format!("`{}`", out.node)) && msg.contains("output shape ["),
            "{msg}"
        );
        let fine = session
            .run(&[("x", x.clone()), ("p", paddings(3))], &fetch, &[])
            .unwrap();
        assert_eq!(fine[0].dims(), [16, 10]);
    }
    server.stop();
}

/// The gradient of `CheckNumerics` checks the gradient, failing with TensorFlow's message
/// (which Python writes with the forward message as a bytes literal).
#[test]
fn the_check_numerics_gradient_checks_the_gradient_in_tensorflows_words() {
    let mut g = Graph::new();
    let x = g
        .placeholder("x", DType::Float, PartialShape::new(vec![Some(2)]))
        .unwrap();
    let dy = g
        .placeholder("dy", DType::Float, PartialShape::new(vec![Some(2)]))
        .unwrap();
    let y = g.check_numerics(&x, "fwd").unwrap();
    let dx = gradients(&mut g, &[y], &[x], Some(&[dy])).unwrap()[0]
        .clone()
        .unwrap();
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    let run = |dy: Tensor| {
        session.run(
            &[("x", f32s(&[2], &[1.0, 2.0])), ("dy", dy)],
            &[&dx.name()],
            &[],
        )
    };
    let fine = run(f32s(&[2], &[3.0, 4.0])).unwrap();
    assert_exact(&fine[0], &[2], &[3.0f32, 4.0]);
    let err = run(f32s(&[2], &[f32::INFINITY, 4.0])).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    // TensorFlow 2.21, word for word.
    let tf = "Not a number (NaN) or infinity (Inf) values detected in gradient. b'fwd' : Tensor \
              had Inf values";
    assert!(
        err.message().contains(tf) && err.message().contains(&dx.node),
        "{err}"
    );
}
