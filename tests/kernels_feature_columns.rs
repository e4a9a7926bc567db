//! The ops of feature columns, `StringToHashBucketFast`, `StringToHashBucketStrong`,
//! `Bucketize` and `SparseToDense`, and `GatherNd` / `ScatterNd` with their gradients:
//!
//! - against stock TensorFlow 2.21's own values on seeded inputs
//!   (`tests/kernels_feature_columns_tf.py` computes them live: skipped without TensorFlow, a
//!   failure under CI): hash buckets of about 190 strings of every length class bit for bit,
//!   bucket ids, gathers, scatters and dense tensors exactly (float scatters with repeated
//!   indices to a few ulps, as their sums may be added in another order), TensorFlow's error
//!   code and message for each input it refuses, and the builder's gradients against
//!   `tf.GradientTape`'s;
//! - without TensorFlow: bad inputs fail with TensorFlow's code naming the node, whether the
//!   kernel or the graph's import or shape inference catches them; outputs past a device's
//!   memory budget are refused before they are allocated; the shape functions; and
//!   `SparseToDense`'s gradient where TensorFlow's goes wrong (vector indices, a scalar
//!   value), against the values worked out by hand.

use crate::kernels_support::json::{
    array, assert_refused_as_in_tensorflow, dtype_named, float_bits, tensor, unhex,
};
use crate::kernels_support::*;
use crate::support::tensorflow::script_json;
use bytes::Bytes;
use serde_json::Value;
use tessera::client::{Session, SessionOptions};
use tessera::error::Code;
use tessera::graph::{gradients, Graph, Output};
use tessera::proto::attr_value::{ListValue, Value as AttrKind};
use tessera::proto::{AttrValue, GraphDef, NodeDef};
use tessera::tensor::{DType, PartialShape, Tensor};

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/kernels_feature_columns_tf.py"
);

/// An attr the script encoded as `{type|i|b|s|list_i|list_f: ...}`.
fn attr(v: &Value) -> AttrValue {
    let (kind, x) = v.as_object().unwrap().iter().next().unwrap();
    match kind.as_str() {
        "type" => value::dtype(dtype_named(x.as_str().unwrap())),
        "i" => value::int(x.as_i64().unwrap()),
        "b" => value::bool(x.as_bool().unwrap()),
        "s" => value::string(x.as_str().unwrap()),
        "list_i" => value::int_list(array(x).iter().map(|i| i.as_i64().unwrap()).collect()),
        "list_f" => AttrValue {
            value: Some(AttrKind::List(ListValue {
                f: float_bits(x).into_iter().map(|f| f as f32).collect(),
                ..Default::default()
            })),
        },
        other => panic!("attr kind {other}"),
    }
}

/// The values of a float tensor, widened.
fn floats(t: &Tensor) -> Vec<f64> {
    match t.dtype() {
        DType::Float => t
            .values::<f32>()
            .unwrap()
            .iter()
            .map(|&x| f64::from(x))
            .collect(),
        DType::Double => t.values::<f64>().unwrap().to_vec(),
        other => panic!("not a float tensor: {other}"),
    }
}

/// Asserts `got` holds `want`'s dtype, shape and values: exactly, or within `rel` of each
/// value (at least 1) for floats when `rel` is given.
fn assert_same(what: &str, got: &Tensor, want: &Tensor, rel: Option<f64>) {
    match rel {
        Some(rel) if want.dtype().is_float() => {
            assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
            assert_eq!(got.dims(), want.dims(), "{what}: shape");
            for (i, (g, w)) in floats(got).iter().zip(floats(want)).enumerate() {
                assert!(
                    (g - w).abs() <= rel * w.abs().max(1.0),
                    "{what}: element {i}: tessera {g}, TensorFlow {w}"
                );
            }
        }
        _ => json::assert_same(what, got, want),
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
    // Repeated indices add their floats in an order TensorFlow does not promise.
    let rel = (op == "ScatterNd").then_some(1e-6);
    assert_same(&what, &got[0], &tensor(&case["output"]), rel);
}

/// Checks the buckets of every string against TensorFlow's, kernel by kernel and through a
/// session (the ops' registration, shape functions and placement).
fn check_hashes(hash: &Value) {
    let strings: Vec<Bytes> = array(&hash["strings"])
        .iter()
        .map(|s| Bytes::from(unhex(s.as_str().unwrap())))
        .collect();
    let n = strings.len();
    assert!(n >= 180, "{n} strings");
    let input = Tensor::from_strings(vec![n], strings).unwrap();
    let want = |v: &Value| {
        let buckets: Vec<i64> = array(&v["buckets"])
            .iter()
            .map(|b| b.as_i64().unwrap())
            .collect();
        Tensor::from_vec(vec![n], buckets).unwrap()
    };
    for v in array(&hash["fast"]) {
        let buckets = v["num_buckets"].as_i64().unwrap();
        let got = run1(
            node("StringToHashBucketFast").attr("num_buckets", value::int(buckets)),
            vec![input.clone()],
        );
        assert_same(&format!("Fast, {buckets} buckets"), &got, &want(v), None);
    }
    for v in array(&hash["strong"]) {
        let buckets = v["num_buckets"].as_i64().unwrap();
        let key: Vec<i64> = array(&v["key"])
            .iter()
            .map(|k| k.as_i64().unwrap_or_else(|| k.as_u64().unwrap() as i64))
            .collect();
        let got = run1(
            node("StringToHashBucketStrong")
                .attr("num_buckets", value::int(buckets))
                .attr("key", value::int_list(key.clone())),
            vec![input.clone()],
        );
        assert_same(
            &format!("Strong, key {key:?}, {buckets} buckets"),
            &got,
            &want(v),
            None,
        );
    }
    let mut g = Graph::new();
    let c = g.constant(&input).unwrap();
    let fast = g.string_to_hash_bucket_fast(&c, 1000).unwrap();
    let strong = g.string_to_hash_bucket_strong(&c, 1000, [1, 2]).unwrap();
    assert_eq!((fast.dtype, strong.dtype), (DType::Int64, DType::Int64));
    assert_eq!(fast.shape, PartialShape::new(vec![Some(n)]));
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    let out = session
        .run(&[], &[&fast.name(), &strong.name()], &[])
        .unwrap();
    let by = |num: i64, key: Option<[i64; 2]>| {
        let list = if key.is_some() { "strong" } else { "fast" };
        array(&hash[list])
            .iter()
            .find(|v| {
                v["num_buckets"] == num
                    && key.is_none_or(|k| v["key"] == serde_json::json!(k.to_vec()))
            })
            .map(want)
            .unwrap()
    };
    assert_same("Fast through a session", &out[0], &by(1000, None), None);
    assert_same(
        "Strong through a session",
        &out[1],
        &by(1000, Some([1, 2])),
        None,
    );
}

/// The op of a gradient case, built with the graph's constructors.
fn build(g: &mut Graph, op: &str, x: &[Output]) -> Output {
    match op {
        "GatherNd" => g.gather_nd(&x[0], &x[1]),
        "ScatterNd" => g.scatter_nd(&x[0], &x[1], &x[2]),
        "SparseToDense" => g.sparse_to_dense(&x[0], &x[1], &x[2], &x[3], true),
        other => panic!("no gradient case for {other}"),
    }
    .unwrap()
}

/// The builder's gradients of `sum(weights * op(inputs))` through a local session, against
/// `tf.GradientTape`'s.
fn check_gradient(case: &Value) {
    let op = case["op"].as_str().unwrap();
    let what = format!("gradient of {op} ({})", case["name"].as_str().unwrap());
    let inputs: Vec<Tensor> = array(&case["inputs"]).iter().map(tensor).collect();
    let wrt: Vec<usize> = array(&case["wrt"])
        .iter()
        .map(|i| i.as_u64().unwrap() as usize)
        .collect();
    let mut g = Graph::new();
    let mut feeds = Vec::new();
    let x: Vec<Output> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if wrt.contains(&i) {
                let dims: Vec<Option<usize>> = t.dims().iter().map(|&d| Some(d)).collect();
                let name = format!("x{i}");
                let p = g
                    .placeholder(&name, t.dtype(), PartialShape::new(dims))
                    .unwrap();
                feeds.push((format!("{name}:0"), t.clone()));
                p
            } else {
                g.constant(t).unwrap()
            }
        })
        .collect();
    let y = build(&mut g, op, &x);
    let w = g.constant(&tensor(&case["weights"])).unwrap();
    let product = g.mul(&y, &w).unwrap();
    let rank = y.shape.rank().expect("known rank") as i64;
    let loss = g
        .sum(&product, &(0..rank).collect::<Vec<_>>(), false)
        .unwrap();
    let xs: Vec<Output> = wrt.iter().map(|&i| x[i].clone()).collect();
    let grads: Vec<String> = gradients(&mut g, std::slice::from_ref(&loss), &xs, None)
        .unwrap()
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
        let tol = if got[k].dtype() == DType::Float {
            1e-6
        } else {
            1e-12
        };
        assert_same(
            &format!("{what}, input {}", wrt[k]),
            &got[k],
            &tensor(want),
            Some(tol),
        );
    }
}

#[test]
fn feature_columns_match_tensorflow() {
    let test = "feature_columns_match_tensorflow";
    let Some(json) = script_json(test, SCRIPT, &["tensorflow", "numpy"]) else {
        return;
    };
    check_hashes(&json["hash"]);
    let cases = array(&json["cases"]);
    let count = |op: &str| cases.iter().filter(|c| c["op"] == op).count();
    assert!(count("Bucketize") >= 8 && count("GatherNd") >= 20 && count("ScatterNd") >= 25);
    assert!(count("SparseToDense") >= 25);
    let refused = cases.iter().filter(|c| c.get("error").is_some()).count();
    cases.iter().for_each(check_case);
    let grads = array(&json["gradients"]);
    assert!(grads.len() >= 6);
    grads.iter().for_each(check_gradient);
    eprintln!(
        "hash buckets of {} strings, {} cases ({refused} refused with TensorFlow's code and \
         message) and {} gradients match TensorFlow",
        array(&json["hash"]["strings"]).len(),
        cases.len(),
        grads.len()
    );
}

fn strings(values: &[&str]) -> Tensor {
    let values = values.iter().map(|s| Bytes::from(s.to_string())).collect();
    Tensor::from_strings(vec![2], values).unwrap()
}

/// Asserts `result` failed with `code`, naming a node whose name starts with `node` (the
/// builder numbers repeated names: `ScatterNd_1`) and saying `needle`.
fn assert_refused<T: std::fmt::Debug>(
    result: tessera::error::Result<T>,
    code: Code,
    node: &str,
    needle: &str,
) {
    let err = result.expect_err("should fail");
    assert_eq!(err.code(), code, "{err}");
    let message = err.message();
    assert!(message.contains(&format!("`{node}")), "{message}");
    assert!(message.contains(needle), "{message}");
}

/// A `NodeDef` for a graph: `name` running `op` on `inputs` with `attrs`.
fn node_def(name: &str, op: &str, inputs: &[&str], attrs: &[(&str, AttrValue)]) -> NodeDef {
    NodeDef {
        name: name.into(),
        op: op.into(),
        input: inputs.iter().map(|i| i.to_string()).collect(),
        attr: attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        ..Default::default()
    }
}

#[test]
fn bad_inputs_fail_with_tensorflows_code_naming_the_node() {
    // num_buckets 0: the op definition refuses it when a graph is imported; a kernel made
    // without that check refuses it too.
    let message = expect_err(
        node("StringToHashBucketFast").attr("num_buckets", value::int(0)),
        vec![strings(&["a", "b"])],
        Code::InvalidArgument,
        "Value for attr 'num_buckets' of 0 must be at least minimum 1",
    );
    assert!(
        message.starts_with("node `x` (op StringToHashBucketFast)"),
        "{message}"
    );
    let graph = GraphDef {
        node: vec![
            node_def(
                "words",
                "Const",
                &[],
                &[
                    ("dtype", value::dtype(DType::String)),
                    ("value", value::tensor(strings(&["a", "b"]).to_proto())),
                ],
            ),
            node_def(
                "hashed",
                "StringToHashBucketFast",
                &["words"],
                &[("num_buckets", value::int(0))],
            ),
        ],
        ..Default::default()
    };
    let session = Session::local();
    assert_refused(
        session
            .extend(&graph)
            .and_then(|()| session.run(&[], &["hashed:0"], &[])),
        Code::InvalidArgument,
        "hashed",
        "num_buckets",
    );

    // An index outside params, in the kernel and in a session.
    let params = f32s(&[3, 4], &[0.0; 12]);
    let message = expect_err(
        node("GatherNd").name("gather"),
        vec![params.clone(), i32s(&[2, 2], &[0, 1, 3, 0])],
        Code::InvalidArgument,
        "indices[1] = [3, 0] does not index into param shape [3,4], node name: gather",
    );
    assert!(
        message.starts_with("node `gather` (op GatherNd)"),
        "{message}"
    );
    let mut g = Graph::new();
    let p = g.constant(&params).unwrap();
    let i = g
        .placeholder("i", DType::Int32, PartialShape::new(vec![None, Some(2)]))
        .unwrap();
    let gathered = g.gather_nd(&p, &i).unwrap();
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    assert_refused(
        session.run(
            &[("i:0", i32s(&[1, 2], &[2, -1]))],
            &[&gathered.name()],
            &[],
        ),
        Code::InvalidArgument,
        &gathered.node,
        "indices[0] = [2, -1] does not index into param shape [3,4]",
    );

    // ScatterNd's shapes disagreeing: in the kernel, at graph construction when the shapes are
    // known, and in a session when they are fed.
    expect_err(
        node("ScatterNd").name("scatter"),
        vec![
            i32s(&[2, 1], &[1, 3]),
            f32s(&[3], &[1.0, 2.0, 3.0]),
            ivec(&[5]),
        ],
        Code::InvalidArgument,
        "Dimensions [0,1) of indices[shape=[2,1]] must match dimensions [0,1) of \
         updates[shape=[3]]",
    );
    let mut g = Graph::new();
    let indices = g.const_i32("indices", &[2, 1], &[1, 3]).unwrap();
    let updates = g.constant(&f32s(&[2, 3], &[0.0; 6])).unwrap();
    let shape = g.const_vec_i32("shape", &[5, 4]).unwrap();
    assert_refused(
        g.scatter_nd(&indices, &updates, &shape),
        Code::InvalidArgument,
        "ScatterNd",
        "Dimensions [1,2) of input[shape=[5,4]]",
    );
    let u = g
        .placeholder("u", DType::Float, PartialShape::unknown())
        .unwrap();
    let scattered = g.scatter_nd(&indices, &u, &shape).unwrap();
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    assert_refused(
        session.run(
            &[("u:0", f32s(&[2, 3], &[0.0; 6]))],
            &[&scattered.name()],
            &[],
        ),
        Code::InvalidArgument,
        &scattered.node,
        "Dimensions [1,2) of input[shape=[5,4]] must match dimensions [1,2) of \
         updates[shape=[2,3]]",
    );
    // The same session runs updates that fit.
    let fine = session
        .run(
            &[("u:0", f32s(&[2, 4], &[1.0; 8]))],
            &[&scattered.name()],
            &[],
        )
        .unwrap();
    assert_eq!(fine[0].dims(), [5, 4]);

    // Unsorted boundaries are refused when the kernel is made.
    let mut b = node("Bucketize").t(DType::Float);
    b = b.attr(
        "boundaries",
        AttrValue {
            value: Some(AttrKind::List(ListValue {
                f: vec![2.0, 1.0],
                ..Default::default()
            })),
        },
    );
    expect_err(
        b,
        vec![f32s(&[1], &[0.5])],
        Code::InvalidArgument,
        "Expected sorted boundaries",
    );
}

#[test]
fn outputs_past_the_memory_budget_are_refused_before_they_are_allocated() {
    // A 1 MiB CPU budget: each input fits, the outputs their shapes or values ask for do not.
    let session = Session::local_with(SessionOptions {
        cpu_memory_limit: Some(1 << 20),
        ..Default::default()
    });
    let mut g = Graph::new();
    let unknown = |n| PartialShape::unknown_dims(n);
    let shape = g.placeholder("shape", DType::Int64, unknown(1)).unwrap();
    let indices = g.constant(&i64s(&[1, 1], &[0])).unwrap();
    let updates = g.placeholder("updates", DType::Float, unknown(2)).unwrap();
    let scattered = g.scatter_nd(&indices, &updates, &shape).unwrap();
    let sparse_indices = g.constant(&i64s(&[1, 2], &[0, 0])).unwrap();
    let one = g.constant(&f32s(&[1], &[1.0])).unwrap();
    let zero = g.constant(&Tensor::scalar(0f32)).unwrap();
    let dense = g
        .sparse_to_dense(&sparse_indices, &shape, &one, &zero, true)
        .unwrap();
    let params = g.constant(&f32s(&[10, 1000], &[0.5; 10_000])).unwrap();
    let rows = g.placeholder("rows", DType::Int32, unknown(2)).unwrap();
    let gathered = g.gather_nd(&params, &rows).unwrap();
    session.extend(&g.to_graph_def()).unwrap();

    let huge = i64s(&[2], &[100_000, 10_000]);
    let updates_row = f32s(&[1, 10_000], &[1.0; 10_000]);
    let cases = [
        (&scattered, "[100000,10000]"),
        (&dense, "[100000,10000]"),
        (&gathered, "[10000,1000]"),
    ];
    for (out, shape) in cases {
        let err = session
            .run(
                &[
                    ("shape:0", huge.clone()),
                    ("updates:0", updates_row.clone()),
                    ("rows:0", i32s(&[10_000, 1], &[3; 10_000])),
                ],
                &[&out.name()],
                &[],
            )
            .expect_err("over the budget");
        assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
        let message = err.message();
        assert!(message.contains(&format!("`{}`", out.node)), "{message}");
        assert!(
            message.contains(&format!("output shape {shape}")),
            "{message}"
        );
    }
    // Outputs that fit run in the same session.
    let out = session
        .run(
            &[
                ("shape:0", i64s(&[2], &[4, 10_000])),
                ("updates:0", updates_row),
                ("rows:0", i32s(&[2, 1], &[3, 9])),
            ],
            &[&scattered.name(), &dense.name(), &gathered.name()],
            &[],
        )
        .unwrap();
    assert_eq!(out[0].dims(), [4, 10_000]);
    assert_eq!(out[1].dims(), [4, 10_000]);
    assert_eq!(out[2].dims(), [2, 1000]);
}

#[test]
fn shape_functions_follow_tensorflow() {
    let mut g = Graph::new();
    let known = |d: &[usize]| PartialShape::new(d.iter().map(|&d| Some(d)).collect::<Vec<_>>());
    let params = g.placeholder("p", DType::Float, known(&[5, 4, 3])).unwrap();
    let rows = g
        .placeholder("r", DType::Int64, PartialShape::new(vec![None, Some(2)]))
        .unwrap();
    let out = g.gather_nd(&params, &rows).unwrap();
    assert_eq!(
        (out.dtype, out.shape.to_string()),
        (DType::Float, "[?,3]".into())
    );
    let depth_unknown = g
        .placeholder("d", DType::Int32, PartialShape::new(vec![Some(2), None]))
        .unwrap();
    assert_eq!(
        g.gather_nd(&params, &depth_unknown).unwrap().shape,
        PartialShape::unknown()
    );
    let too_deep = g.const_i32("deep", &[1, 4], &[0, 0, 0, 0]).unwrap();
    assert_refused(
        g.gather_nd(&params, &too_deep),
        Code::InvalidArgument,
        "GatherNd",
        "indices.shape[-1] must be <= params.rank",
    );

    let indices = g.const_i32("indices", &[2, 1], &[1, 3]).unwrap();
    let updates = g
        .placeholder("u", DType::Double, PartialShape::new(vec![None, Some(4)]))
        .unwrap();
    let shape = g.const_vec_i32("shape", &[5, 4]).unwrap();
    let out = g.scatter_nd(&indices, &updates, &shape).unwrap();
    assert_eq!(
        (out.dtype, out.shape.to_string()),
        (DType::Double, "[5,4]".into())
    );
    let fed_shape = g.placeholder("s", DType::Int32, known(&[2])).unwrap();
    let out = g.scatter_nd(&indices, &updates, &fed_shape).unwrap();
    assert_eq!(out.shape.to_string(), "[?,?]");
    let empty = g.const_vec_i32("empty", &[0]).unwrap();
    let one = g.constant(&f64s(&[2], &[1.0, 2.0])).unwrap();
    assert_refused(
        g.scatter_nd(&indices, &one, &empty),
        Code::InvalidArgument,
        "ScatterNd",
        "Indices and updates specified for empty input",
    );

    let dense_shape = g.const_vec_i32("dense_shape", &[3, 2]).unwrap();
    let at = g.const_i32("at", &[1, 2], &[0, 1]).unwrap();
    let v = g.constant(&f32s(&[1], &[1.0])).unwrap();
    let d = g.constant(&Tensor::scalar(0f32)).unwrap();
    let dense = g.sparse_to_dense(&at, &dense_shape, &v, &d, true).unwrap();
    assert_eq!(
        (dense.dtype, dense.shape.to_string()),
        (DType::Float, "[3,2]".into())
    );

    let x = g.placeholder("x", DType::Double, known(&[2, 7])).unwrap();
    let buckets = g.bucketize(&x, &[0.0, 1.0]).unwrap();
    assert_eq!(
        (buckets.dtype, buckets.shape.to_string()),
        (DType::Int32, "[2,7]".into())
    );
}

#[test]
fn sparse_to_dense_gradients_follow_the_op_for_vector_indices_and_a_scalar_value() {
    // y = SparseToDense([1, 3], [5], values, default), loss = sum(w * y) with w = 1..5: the
    // values get w at their positions, the default the rest of w's sum. TensorFlow's gradient
    // fails on vector indices and leaves a scalar value's gradient unsummed.
    for scalar in [false, true] {
        let mut g = Graph::new();
        let values_shape = if scalar { vec![] } else { vec![Some(2)] };
        let values = g
            .placeholder("v", DType::Double, PartialShape::new(values_shape))
            .unwrap();
        let default = g
            .placeholder("d", DType::Double, PartialShape::new(vec![]))
            .unwrap();
        let at = g.constant(&i64s(&[2], &[1, 3])).unwrap();
        let shape = g.constant(&i64s(&[1], &[5])).unwrap();
        let y = g
            .sparse_to_dense(&at, &shape, &values, &default, true)
            .unwrap();
        let w = g.constant(&f64s(&[5], &[1.0, 2.0, 3.0, 4.0, 5.0])).unwrap();
        let product = g.mul(&y, &w).unwrap();
        let loss = g.sum(&product, &[0], false).unwrap();
        let grads = gradients(&mut g, &[loss], &[values.clone(), default.clone()], None).unwrap();
        let names: Vec<String> = grads.iter().map(|d| d.as_ref().unwrap().name()).collect();
        let session = Session::local();
        session.extend(&g.to_graph_def()).unwrap();
        let v = if scalar {
            Tensor::scalar(7.0f64)
        } else {
            f64s(&[2], &[7.0, 8.0])
        };
        let out = session
            .run(
                &[("v:0", v), ("d:0", Tensor::scalar(0.5f64))],
                &[&names[0], &names[1]],
                &[],
            )
            .unwrap();
        if scalar {
            assert_f64(&out[0], &[], &[6.0], 0.0);
        } else {
            assert_f64(&out[0], &[2], &[2.0, 4.0], 0.0);
        }
        assert_f64(&out[1], &[], &[9.0], 0.0);
    }
}
