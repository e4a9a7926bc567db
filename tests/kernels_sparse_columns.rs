//! The ops of crossed, vocabulary and embedding feature columns: `SparseCross`,
//! `SparseCrossHashed`, `SparseCrossV2`, `SparseFillEmptyRows` with its gradient,
//! `SparseReshape`, and the lookup tables (`HashTableV2`, `MutableHashTableV2` and the ops on
//! them):
//!
//! - against stock TensorFlow 2.21 on seeded inputs (`tests/kernels_sparse_columns_tf.py`
//!   computes them live: skipped without TensorFlow, a failure under CI): every output bit for
//!   bit (the crosses' farmhash and SipHash chains included), TensorFlow's error code and
//!   message for each input it refuses, hash tables driven through the same sequence of ops
//!   (initializers, finds, inserts, imports, exports, text files) with the same results and
//!   errors, `SparseFillEmptyRows`'s gradient against `tf.GradientTape`'s, and a
//!   `tf.compat.v1.feature_column` graph (vocabulary list and file columns, crossed columns,
//!   indicator and embedding columns into `input_layer`, with its table initializers) run as
//!   TensorFlow exported it;
//! - without TensorFlow: a vocabulary file outside the task's allowed directories refused
//!   with the confinement's error naming the node, crosses past the output limit refused
//!   before they are allocated, the shape functions, and `index_table_from_tensor`'s graph
//!   built with the builder.

use crate::kernels_support::json::{
    array, assert_refused_as_in_tensorflow, assert_same, dims, dtype_named, elements, unhex,
    values_with,
};
use crate::kernels_support::*;
use crate::support::tensorflow::script_json;
use bytes::Bytes;
use serde_json::Value;
use tessera::client::Session;
use tessera::error::Code;
use tessera::format::files::Files;
use tessera::graph::{gradients, Graph};
use tessera::kernels::{create_kernel, OpContext};
use tessera::proto::AttrValue;
use tessera::runtime::resource::ResourceMgr;
use tessera::tensor::{DType, PartialShape, Tensor};

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/kernels_sparse_columns_tf.py"
);

/// A float the script wrote with `float.hex()`.
fn float_hex(v: &Value) -> f64 {
    let s = v.as_str().unwrap();
    match s {
        "inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        "nan" => f64::NAN,
        _ => {
            let (neg, s) = s.strip_prefix('-').map_or((false, s), |s| (true, s));
            let s = s.strip_prefix("0x").unwrap();
            let (mantissa, exp) = s.split_once('p').unwrap();
            let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
            let mut m = u64::from_str_radix(int, 16).unwrap() as f64;
            for (i, c) in frac.chars().enumerate() {
                m += c.to_digit(16).unwrap() as f64 / 16f64.powi(i as i32 + 1);
            }
            let x = m * 2f64.powi(exp.parse().unwrap());
            if neg {
                -x
            } else {
                x
            }
        }
    }
}

/// A tensor the script encoded as `{dtype, shape, values}`, its floats written with
/// `float.hex()` rather than as float64 bits.
fn tensor(v: &Value) -> Tensor {
    let dtype = dtype_named(v["dtype"].as_str().unwrap());
    values_with(&v["values"], dtype, dims(&v["shape"]), float_hex)
}

/// An attr the script encoded as `{type|i|b|s|list_type: ...}`.
fn attr(v: &Value) -> AttrValue {
    let (kind, x) = v.as_object().unwrap().iter().next().unwrap();
    match kind.as_str() {
        "type" => value::dtype(dtype_named(x.as_str().unwrap())),
        "i" => value::int(x.as_i64().unwrap()),
        "b" => value::bool(x.as_bool().unwrap()),
        "s" => value::string(x.as_str().unwrap()),
        "list_type" => {
            let types: Vec<DType> = array(x)
                .iter()
                .map(|t| dtype_named(t.as_str().unwrap()))
                .collect();
            value::dtype_list(&types)
        }
        other => panic!("attr kind {other}"),
    }
}

/// Checks a result against what the script recorded: every output, or the error's code and
/// message (and that it names the node).
fn check_result(what: &str, op: &str, result: tessera::Result<Vec<Tensor>>, want: &Value) {
    if let Some(error) = want.get("error") {
        let code = error["code"].as_str().unwrap();
        let message = error["message"].as_str().unwrap();
        assert_refused_as_in_tensorflow(what, op, result, code, message);
        return;
    }
    let got = result.unwrap_or_else(|e| panic!("{what}: {e}"));
    let want: Vec<Tensor> = array(&want["outputs"]).iter().map(tensor).collect();
    assert_eq!(got.len(), want.len(), "{what}: outputs");
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        if op == "LookupTableExportV2" {
            // A hash table's entries come out in no particular order: compare them sorted.
            let pairs = |keys: &Tensor, values: &Tensor| {
                let mut p: Vec<(String, String)> =
                    elements(keys).into_iter().zip(elements(values)).collect();
                p.sort();
                p
            };
            assert_eq!(pairs(&got[0], &got[1]), pairs(&want[0], &want[1]), "{what}");
            assert_eq!(got[0].dtype(), want[0].dtype(), "{what}");
            assert_eq!(got[1].dtype(), want[1].dtype(), "{what}");
            break;
        }
        assert_same(&format!("{what}, output {k}"), g, w);
    }
}

fn node_for(step: &Value) -> NodeBuilder {
    let mut b = node(step["op"].as_str().unwrap());
    for (k, v) in step["attrs"].as_object().unwrap() {
        b = b.attr(k, attr(v));
    }
    b
}

fn check_case(case: &Value) {
    let op = case["op"].as_str().unwrap();
    let what = format!("{op} ({})", case["name"].as_str().unwrap());
    let inputs: Vec<Tensor> = array(&case["inputs"]).iter().map(tensor).collect();
    check_result(&what, op, node_for(case).run(inputs), case);
}

/// Runs a table's steps on one resource manager: the first creates the table, each of the
/// others takes its handle first.
fn check_table(table: &Value) {
    let name = table["name"].as_str().unwrap();
    let steps = array(&table["steps"]);
    let resources = ResourceMgr::new();
    let handle = node_for(&steps[0])
        .run_on(vec![], &resources)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .remove(0);
    for (i, step) in steps.iter().enumerate().skip(1) {
        let op = step["op"].as_str().unwrap();
        let what = format!("table `{name}`, step {i} ({op})");
        let mut inputs = vec![handle.clone()];
        inputs.extend(array(&step["inputs"]).iter().map(tensor));
        check_result(&what, op, node_for(step).run_on(inputs, &resources), step);
    }
}

/// The builder's gradient of `sum(weights * output_values)` through `SparseFillEmptyRows`,
/// against `tf.GradientTape`'s.
fn check_gradient(case: &Value) {
    let mut g = Graph::new();
    let indices = g.constant(&tensor(&case["indices"])).unwrap();
    let shape = g.constant(&tensor(&case["shape"])).unwrap();
    let (values, default) = (tensor(&case["values"]), tensor(&case["default"]));
    let n = values.dims()[0];
    let v = g
        .placeholder("v", DType::Double, PartialShape::new(vec![Some(n)]))
        .unwrap();
    let d = g
        .placeholder("d", DType::Double, PartialShape::new(vec![]))
        .unwrap();
    let filled = g.sparse_fill_empty_rows(&indices, &v, &shape, &d).unwrap();
    let w = g.constant(&tensor(&case["weights"])).unwrap();
    let product = g.mul(&filled[1], &w).unwrap();
    let loss = g.sum(&product, &[0], false).unwrap();
    let grads: Vec<String> = gradients(&mut g, &[loss], &[v, d], None)
        .unwrap()
        .into_iter()
        .map(|x| x.expect("both inputs reach the loss").name())
        .collect();
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    let fetches: Vec<&str> = grads.iter().map(String::as_str).collect();
    let got = session
        .run(&[("v:0", values), ("d:0", default)], &fetches, &[])
        .unwrap();
    for (k, want) in array(&case["grads"]).iter().enumerate() {
        let (got, want) = (as_f64s(&got[k]), as_f64s(&tensor(want)));
        assert_eq!(got.len(), want.len());
        for (a, b) in got.iter().zip(&want) {
            assert!(
                (a - b).abs() <= 1e-12 * b.abs().max(1.0),
                "gradient {k}: {a} vs {b}"
            );
        }
    }
}

/// Runs TensorFlow's exported feature-column graph: its initializers, then the input layer.
fn check_graph(json: &Value) {
    use prost::Message;
    let bytes = unhex(json["graph_def"].as_str().unwrap());
    let graph = tessera::proto::GraphDef::decode(bytes.as_slice()).unwrap();
    let gaps = tessera::exec::support::unsupported(&graph);
    assert!(gaps.is_empty(), "tessera cannot run: {gaps:?}");
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
    let fetch = json["fetch"].as_str().unwrap();
    let got = session.run(&feeds, &[fetch], &[]).unwrap().remove(0);
    let want = tensor(&json["value"]);
    assert_eq!(got.dims(), want.dims());
    for (i, (a, b)) in as_f64s(&got).iter().zip(as_f64s(&want)).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6 * b.abs().max(1.0),
            "input layer element {i}: tessera {a}, TensorFlow {b}"
        );
    }
}

#[test]
fn sparse_columns_match_tensorflow() {
    let test = "sparse_columns_match_tensorflow";
    let Some(json) = script_json(test, SCRIPT, &["tensorflow", "numpy"]) else {
        return;
    };
    let cases = array(&json["cases"]);
    let count = |op: &str| cases.iter().filter(|c| c["op"] == op).count();
    assert!(count("SparseCross") >= 20 && count("SparseCrossHashed") >= 15);
    assert!(count("SparseCrossV2") >= 10 && count("SparseFillEmptyRows") >= 15);
    assert!(count("SparseFillEmptyRowsGrad") >= 6 && count("SparseReshape") >= 15);
    cases.iter().for_each(check_case);
    let tables = array(&json["tables"]);
    assert!(tables.len() >= 20);
    tables.iter().for_each(check_table);
    let grads = array(&json["gradients"]);
    assert_eq!(grads.len(), 2);
    grads.iter().for_each(check_gradient);
    check_graph(&json["graph"]);
    let refused = cases.iter().filter(|c| c.get("error").is_some()).count();
    eprintln!(
        "{} cases ({refused} refused with TensorFlow's code and message), {} table sequences, \
         {} gradients and the feature-column graph match TensorFlow",
        cases.len(),
        tables.len(),
        grads.len()
    );
}

fn strings(values: &[&str]) -> Tensor {
    let values: Vec<Bytes> = values.iter().map(|s| Bytes::from(s.to_string())).collect();
    Tensor::from_strings(vec![values.len()], values).unwrap()
}

#[test]
fn a_vocabulary_file_outside_the_allowed_directories_is_refused_naming_the_node() {
    let allowed = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let inside_file = allowed.path().join("vocab.txt");
    let outside_file = outside.path().join("vocab.txt");
    for f in [&inside_file, &outside_file] {
        std::fs::write(f, "apple\nbanana\n").unwrap();
    }
    let files = Files::confined(&[allowed.path().to_path_buf()]).unwrap();
    let resources = ResourceMgr::new();
    let create = node("HashTableV2")
        .attr("key_dtype", value::dtype(DType::String))
        .attr("value_dtype", value::dtype(DType::Int64))
        .attr("shared_name", value::string("vocab"));
    let handle = create.run_on(vec![], &resources).unwrap().remove(0);
    let init = node("InitializeTableFromTextFileV2")
        .name("init_vocab")
        .attr("key_index", value::int(-2))
        .attr("value_index", value::int(-1))
        .build();
    let run = |path: &std::path::Path| {
        let kernel = create_kernel(&init, tessera::device::DeviceType::Cpu).unwrap();
        let name = Tensor::from_strings(
            vec![],
            vec![Bytes::from(path.to_str().unwrap().to_string())],
        )
        .unwrap();
        let mut ctx = OpContext::new(&init, vec![handle.clone(), name], &resources, DEVICE, 1)
            .with_data_files(&files);
        kernel.compute(&mut ctx)
    };
    let err = run(&outside_file).expect_err("outside the allowed directories");
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    assert!(
        err.message()
            .starts_with("node `init_vocab` (op InitializeTableFromTextFileV2)"),
        "{err}"
    );
    assert!(err.message().contains("allowed_dirs"), "{err}");
    run(&inside_file).unwrap();
    let size = node("LookupTableSizeV2")
        .run_on(vec![handle], &resources)
        .unwrap();
    assert_exact(&size[0], &[], &[2i64]);
}

#[test]
fn crosses_past_the_output_limit_are_refused_before_they_are_allocated() {
    // Two dense columns of 70000 features each: 4.9e9 crosses in one row, past the 2^32
    // elements one output may hold.
    let wide: Vec<Bytes> = (0..70_000).map(|i| Bytes::from(i.to_string())).collect();
    let column = Tensor::from_strings(vec![1, 70_000], wide).unwrap();
    let err = node("SparseCrossV2")
        .attr("N", value::int(0))
        .attr("sparse_types", value::dtype_list(&[]))
        .attr(
            "dense_types",
            value::dtype_list(&[DType::String, DType::String]),
        )
        .run(vec![
            column.clone(),
            column,
            Tensor::from_strings(vec![], vec![Bytes::from("_")]).unwrap(),
        ])
        .expect_err("too many crosses");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(
        err.message().starts_with("node `x` (op SparseCrossV2)"),
        "{err}"
    );
}

#[test]
fn shape_functions_give_tensorflows_shapes() {
    let mut g = Graph::new();
    let indices = g
        .placeholder("i", DType::Int64, PartialShape::new(vec![Some(5), Some(2)]))
        .unwrap();
    let values = g
        .placeholder("v", DType::Float, PartialShape::new(vec![Some(5)]))
        .unwrap();
    let shape = g
        .constant(&Tensor::from_vec(vec![2], vec![4i64, 3]).unwrap())
        .unwrap();
    let default = g.scalar("d", DType::Float, 0.0).unwrap();
    let filled = g
        .sparse_fill_empty_rows(&indices, &values, &shape, &default)
        .unwrap();
    let dims: Vec<PartialShape> = filled.iter().map(|o| o.shape.clone()).collect();
    assert_eq!(
        dims,
        vec![
            PartialShape::new(vec![None, Some(2)]),
            PartialShape::new(vec![None]),
            PartialShape::new(vec![Some(4)]),
            PartialShape::new(vec![Some(5)]),
        ]
    );
    assert_eq!(filled[2].dtype, DType::Bool);
    let new_shape = g
        .constant(&Tensor::from_vec(vec![3], vec![2i64, -1, 3]).unwrap())
        .unwrap();
    let reshaped = g.sparse_reshape(&indices, &shape, &new_shape).unwrap();
    assert_eq!(reshaped[0].shape, PartialShape::new(vec![Some(5), Some(3)]));
    assert_eq!(reshaped[1].shape, PartialShape::new(vec![Some(3)]));
    // A bad default fails when the node is added, naming it.
    let vector = g
        .constant(&Tensor::from_vec(vec![1], vec![0f32]).unwrap())
        .unwrap();
    let err = g
        .sparse_fill_empty_rows(&indices, &values, &shape, &vector)
        .expect_err("default must be a scalar");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("SparseFillEmptyRows"), "{err}");
}

/// `index_table_from_tensor`'s graph: a string table initialized from a vocabulary, looked up
/// with a default, and crossed with another column.
#[test]
fn a_vocabulary_table_and_a_cross_run_through_a_session() {
    let mut g = Graph::new();
    let table = g
        .hash_table(DType::String, DType::Int64, "hash_table_vocab", false)
        .unwrap();
    let vocab = g.constant(&strings(&["red", "green", "blue"])).unwrap();
    let ids = g
        .constant(&Tensor::from_vec(vec![3], vec![0i64, 1, 2]).unwrap())
        .unwrap();
    let init = g.initialize_table(&table, &vocab, &ids).unwrap();
    let words = g
        .placeholder(
            "words",
            DType::String,
            PartialShape::new(vec![None, Some(2)]),
        )
        .unwrap();
    let default = g.scalar("default", DType::Int64, -1.0).unwrap();
    let found = g.lookup_table_find(&table, &words, &default).unwrap();
    assert_eq!(found.shape, PartialShape::new(vec![None, Some(2)]));
    let size = g.lookup_table_size(&table).unwrap();
    let sep = g
        .constant(&Tensor::from_strings(vec![], vec![Bytes::from("_X_")]).unwrap())
        .unwrap();
    let crossed = g
        .sparse_cross_v2(&[], &[words.clone(), found.clone()], &sep)
        .unwrap();
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    session.run(&[], &[], &[&init]).unwrap();
    let feed = Tensor::from_strings(
        vec![2, 2],
        ["blue", "pink", "red", "red"]
            .iter()
            .map(|s| Bytes::from(s.to_string()))
            .collect(),
    )
    .unwrap();
    let out = session
        .run(
            &[("words:0", feed)],
            &[&found.name(), &size.name(), &crossed.values.name()],
            &[],
        )
        .unwrap();
    assert_exact(&out[0], &[2, 2], &[2i64, -1, 0, 0]);
    assert_exact(&out[1], &[], &[3i64]);
    let crosses: Vec<&[u8]> = out[2]
        .strings()
        .unwrap()
        .iter()
        .map(|b| b.as_ref())
        .collect();
    assert_eq!(
        crosses,
        [
            &b"blue_X_2"[..],
            b"blue_X_-1",
            b"pink_X_2",
            b"pink_X_-1",
            b"red_X_0",
            b"red_X_0",
            b"red_X_0",
            b"red_X_0"
        ]
    );
    // A find before the initializer runs, in a fresh session on a fresh device: the table
    // exists but is empty.
    let fresh = Session::local();
    fresh.extend(&g.to_graph_def()).unwrap();
    let err = fresh
        .run(
            &[(
                "words:0",
                Tensor::from_strings(vec![1, 2], vec![Bytes::from("a"), Bytes::from("b")]).unwrap(),
            )],
            &[&found.name()],
            &[],
        )
        .expect_err("not initialized");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("Table not initialized."), "{err}");
    assert!(
        err.message().contains(&format!("`{}`", found.node)),
        "{err}"
    );
}
