//! TensorFlow's own control-flow graphs, run in tessera's in-process session and compared with
//! the values TensorFlow 2.21's session returned for them (`tests/data/control_flow`, written
//! by `tests/golden_control_flow.py`).
//!
//! Each case is a GraphDef (`<name>.pb`) and what to do with it (`<name>.json`): the op to run
//! first (the variables' initializer), then runs in one session, each with its feeds, fetches
//! and targets, and either TensorFlow's values for the fetches or the error TensorFlow gave.
//! The `v1` cases are TensorFlow 1's control flow as `disable_v2_behavior()` writes it (Switch,
//! Merge, Enter, Exit, NextIteration, LoopCond, TensorArrayV3, StackV2 in gradients of loops,
//! VariableV2 with Assign); the `v2_` cases are TensorFlow 2's graph mode (If/StatelessIf,
//! While/StatelessWhile, PartitionedCall/StatefulPartitionedCall over the function library,
//! TensorLists, resource variables). Floats must match to 1e-5 relative.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use prost::Message;
use serde::Deserialize;
use serde_json::Value;
use tessera::client::{Session, SessionOptions};
use tessera::device::DeviceType;
use tessera::kernels::kernel_for;
use tessera::proto::GraphDef;
use tessera::tensor::{DType, Tensor};

/// A step that runs longer than this fails the case (DEADLINE_EXCEEDED) instead of hanging.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    description: String,
    control_flow: String,
    init: Option<String>,
    ops: Vec<String>,
    function_ops: Vec<String>,
    runs: Vec<Run>,
}

#[derive(Debug, Deserialize)]
struct Run {
    feeds: BTreeMap<String, JsonTensor>,
    fetches: Vec<String>,
    targets: Vec<String>,
    results: Option<BTreeMap<String, JsonTensor>>,
    error: Option<JsonError>,
}

#[derive(Debug, Deserialize)]
struct JsonTensor {
    dtype: String,
    shape: Vec<usize>,
    values: Vec<Value>,
}

#[derive(Debug, Deserialize)]
struct JsonError {
    code: String,
    node: Option<String>,
    message: String,
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/control_flow")
}

fn load(name: &str) -> (GraphDef, Case) {
    let pb = dir().join(format!("{name}.pb"));
    let bytes = std::fs::read(&pb).unwrap_or_else(|e| panic!("reading {}: {e}", pb.display()));
    let graph = GraphDef::decode(bytes.as_slice())
        .unwrap_or_else(|e| panic!("decoding {}: {e}", pb.display()));
    let json = dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&json)
        .unwrap_or_else(|e| panic!("reading {}: {e}", json.display()));
    let case: Case =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", json.display()));
    assert_eq!(case.name, name, "{}", json.display());
    (graph, case)
}

fn dtype(name: &str) -> DType {
    match name {
        "float32" => DType::Float,
        "float64" => DType::Double,
        "int32" => DType::Int32,
        "int64" => DType::Int64,
        "bool" => DType::Bool,
        other => panic!("no golden encoding for dtype {other}"),
    }
}

fn number(v: &Value) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("expected a number, found {v}"))
}

fn integer(v: &Value) -> i64 {
    v.as_i64()
        .unwrap_or_else(|| panic!("expected an integer, found {v}"))
}

/// The JSON tensor as a tessera tensor (a feed).
fn tensor(t: &JsonTensor) -> Tensor {
    let shape = t.shape.clone();
    let v = &t.values;
    match dtype(&t.dtype) {
        DType::Float => Tensor::from_vec(shape, v.iter().map(|x| number(x) as f32).collect()),
        DType::Double => Tensor::from_vec(shape, v.iter().map(number).collect()),
        DType::Int32 => Tensor::from_vec(shape, v.iter().map(|x| integer(x) as i32).collect()),
        DType::Int64 => Tensor::from_vec(shape, v.iter().map(integer).collect()),
        DType::Bool => Tensor::from_vec(
            shape,
            v.iter()
                .map(|x| {
                    x.as_bool()
                        .unwrap_or_else(|| panic!("expected a bool, found {x}"))
                })
                .collect(),
        ),
        other => unreachable!("{other}"),
    }
    .unwrap_or_else(|e| panic!("feed {t:?}: {e}"))
}

/// Asserts tessera's `got` is TensorFlow's `want`: same dtype and shape, floats within 1e-5
/// relative (1e-6 absolute near zero), everything else exact.
fn assert_matches(what: &str, got: &Tensor, want: &JsonTensor) {
    let dt = dtype(&want.dtype);
    assert_eq!(got.dtype(), dt, "{what}: dtype");
    assert_eq!(got.dims(), want.shape.as_slice(), "{what}: shape");
    let close = |g: f64, e: f64| (g - e).abs() <= 1e-5 * e.abs() + 1e-6;
    let mismatch = |i: usize, g: String, e: &Value| -> String {
        format!("{what}: element {i} is {g}, TensorFlow computed {e}")
    };
    match dt {
        DType::Float => {
            let got = got.values::<f32>().unwrap();
            for (i, (g, e)) in got.iter().zip(&want.values).enumerate() {
                assert!(
                    close(*g as f64, number(e)),
                    "{}",
                    mismatch(i, g.to_string(), e)
                );
            }
        }
        DType::Double => {
            let got = got.values::<f64>().unwrap();
            for (i, (g, e)) in got.iter().zip(&want.values).enumerate() {
                assert!(close(*g, number(e)), "{}", mismatch(i, g.to_string(), e));
            }
        }
        DType::Int32 => {
            let got = got.values::<i32>().unwrap();
            for (i, (g, e)) in got.iter().zip(&want.values).enumerate() {
                assert_eq!(*g as i64, integer(e), "{}", mismatch(i, g.to_string(), e));
            }
        }
        DType::Int64 => {
            let got = got.values::<i64>().unwrap();
            for (i, (g, e)) in got.iter().zip(&want.values).enumerate() {
                assert_eq!(*g, integer(e), "{}", mismatch(i, g.to_string(), e));
            }
        }
        DType::Bool => {
            let got = got.values::<bool>().unwrap();
            for (i, (g, e)) in got.iter().zip(&want.values).enumerate() {
                assert_eq!(Some(*g), e.as_bool(), "{}", mismatch(i, g.to_string(), e));
            }
        }
        other => unreachable!("{other}"),
    }
}

/// Imports the case's graph into a fresh in-process session, runs its initializer, then each
/// run in order, comparing with what TensorFlow returned.
fn run_case(name: &str) {
    let (graph, case) = load(name);
    let missing: BTreeSet<&str> = case
        .ops
        .iter()
        .chain(&case.function_ops)
        .map(String::as_str)
        .filter(|op| kernel_for(op, DeviceType::Cpu).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "{name} ({}): ops without a CPU kernel: {missing:?}",
        case.description
    );

    let session = Session::local_with(SessionOptions {
        step_timeout: Some(STEP_TIMEOUT),
        ..Default::default()
    });
    session
        .extend(&graph)
        .unwrap_or_else(|e| panic!("{name}: importing TensorFlow's graph: {e}"));
    if let Some(init) = &case.init {
        session
            .run(&[], &[], &[init.as_str()])
            .unwrap_or_else(|e| panic!("{name}: running the initializer `{init}`: {e}"));
    }
    for (i, run) in case.runs.iter().enumerate() {
        let feeds: Vec<(&str, Tensor)> = run
            .feeds
            .iter()
            .map(|(k, v)| (k.as_str(), tensor(v)))
            .collect();
        let fetches: Vec<&str> = run.fetches.iter().map(String::as_str).collect();
        let targets: Vec<&str> = run.targets.iter().map(String::as_str).collect();
        let feed_values: BTreeMap<&str, &Vec<Value>> = run
            .feeds
            .iter()
            .map(|(k, v)| (k.as_str(), &v.values))
            .collect();
        let what = format!("{name} run {i} (feeds {feed_values:?}, fetches {fetches:?})");
        let outcome = session.run(&feeds, &fetches, &targets);
        match (&run.results, &run.error) {
            (Some(results), None) => {
                let got = outcome.unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(got.len(), fetches.len(), "{what}: fetched tensors");
                for (fetch, t) in fetches.iter().zip(&got) {
                    assert_matches(&format!("{what}: `{fetch}`"), t, &results[*fetch]);
                }
            }
            (None, Some(want)) => {
                let err = match outcome {
                    Ok(got) => panic!(
                        "{what}: TensorFlow failed with {} ({}), tessera returned {got:?}",
                        want.code, want.message
                    ),
                    Err(e) => e,
                };
                assert_eq!(
                    err.code().as_str_name(),
                    want.code,
                    "{what}: {err} (TensorFlow: {})",
                    want.message
                );
                if let Some(node) = &want.node {
                    assert!(
                        err.message().contains(node.as_str()),
                        "{what}: the error does not name node `{node}`: {err}"
                    );
                }
            }
            _ => panic!("{what}: the golden run has neither results nor an error"),
        }
    }
}

macro_rules! golden_cases {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                run_case(stringify!($name));
            }
        )*
        const CASES: &[&str] = &[$(stringify!($name)),*];
    };
}

golden_cases!(
    cond_merge,
    cond_untaken_fails,
    cond_nested,
    while_counter,
    while_invariant_matmul,
    while_nested,
    while_parallel_tensorarray,
    while_in_untaken_cond,
    while_gradient,
    cond_gradient,
    dynamic_rnn_ref,
    v2_cond,
    v2_while,
    v2_function,
    v2_while_gradient,
    v2_dynamic_rnn,
);

#[test]
fn every_golden_case_has_a_test() {
    let on_disk: BTreeSet<String> = std::fs::read_dir(dir())
        .unwrap()
        .filter_map(|e| {
            let path = e.unwrap().path();
            (path.extension()? == "json").then(|| path.file_stem()?.to_str().map(String::from))?
        })
        .collect();
    let tested: BTreeSet<String> = CASES.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        on_disk,
        tested,
        "a .json in {} without a test here",
        dir().display()
    );
}

/// The graphs are what their cases claim: the op types the JSON lists are the graph's, and the
/// v1 graphs hold v1 control flow while the v2 ones hold TensorFlow 2's functional ops.
#[test]
fn golden_graphs_hold_the_control_flow_they_claim() {
    let v1 = [
        "Switch",
        "Merge",
        "Enter",
        "Exit",
        "NextIteration",
        "LoopCond",
    ];
    let v2 = [
        "If",
        "StatelessIf",
        "While",
        "StatelessWhile",
        "PartitionedCall",
    ];
    for name in CASES {
        let (graph, case) = load(name);
        let ops: BTreeSet<&str> = graph.node.iter().map(|n| n.op.as_str()).collect();
        let claimed: BTreeSet<&str> = case.ops.iter().map(String::as_str).collect();
        assert_eq!(ops, claimed, "{name}");
        let library = graph.library.as_ref().map_or(0, |l| l.function.len());
        match case.control_flow.as_str() {
            "v1" => {
                assert!(v1.iter().any(|op| ops.contains(op)), "{name}: {ops:?}");
                assert_eq!(library, 0, "{name}: a v1 graph has no function library");
            }
            "v2" => {
                assert!(
                    v2.iter().any(|op| ops.iter().any(|o| o.ends_with(op))),
                    "{name}: {ops:?}"
                );
                assert!(!v1.iter().any(|op| ops.contains(op)), "{name}: {ops:?}");
                assert!(library > 0, "{name}: the functions are in the library");
            }
            other => panic!("{name}: control_flow {other}"),
        }
    }
}
