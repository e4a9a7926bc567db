//! The string and parsing ops of issue #32: `StringSplit(V2)`, `Substr`, `RegexReplace`,
//! `StaticRegexReplace`, `StringLength`, `StringLower`/`Upper`, `StringStrip`, `StringJoin`,
//! `AsString`, `StringFormat`, `DecodeRaw`, `DecodeCSV`, `StringToNumber`, `ParseExampleV2`,
//! `ParseSingleExample`, `Print`, `PrintV2`, `ReadFile` and `WriteFile`:
//!
//! - against stock TensorFlow 2.21 on seeded inputs (`tests/kernels_strings_tf.py` computes
//!   them live, one Python process: skipped without TensorFlow, a failure under CI): every
//!   output exactly (floats by their bits, NaN as NaN), both on the kernel and through a
//!   `Session` (the ops' registration, attr defaults and shape functions), and for each input
//!   TensorFlow refuses, its error code and message, with the node named in front;
//!   `ParseExampleV2` reads Examples that `tf.train.Example(...).SerializeToString()` wrote;
//! - without TensorFlow: `ReadFile` and `WriteFile` through a task's `[checkpoints]
//!   allowed_dirs` (a client cannot read `/etc/passwd`), outputs past the memory budget
//!   refused before they are allocated, and the shape functions.

use crate::kernels_support::json::{
    array, assert_refused_as_in_tensorflow, assert_same_by, dtype_named, tensor, unhex,
};
use crate::kernels_support::*;
use crate::support::tensorflow::script_json;
use bytes::Bytes;
use serde_json::Value;
use tessera::client::{Session, SessionOptions};
use tessera::cluster::{CheckpointsConfig, TaskConfig};
use tessera::error::Code;
use tessera::graph::builder::NodeSpec;
use tessera::graph::Graph;
use tessera::proto::attr_value::{ListValue, Value as AttrKind};
use tessera::proto::{AttrValue, GraphDef, NodeDef};
use tessera::server::Server;
use tessera::tensor::{DType, PartialShape, Tensor};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kernels_strings_tf.py");

fn list(l: ListValue) -> AttrValue {
    AttrValue {
        value: Some(AttrKind::List(l)),
    }
}

/// An attr the script encoded as `{kind: value}`.
fn attr(v: &Value) -> AttrValue {
    let (kind, x) = v.as_object().unwrap().iter().next().unwrap();
    match kind.as_str() {
        "type" => value::dtype(dtype_named(x.as_str().unwrap())),
        "i" => value::int(x.as_i64().unwrap()),
        "b" => value::bool(x.as_bool().unwrap()),
        "s" => value::string(unhex(x.as_str().unwrap())),
        "list_i" => value::int_list(array(x).iter().map(|i| i.as_i64().unwrap()).collect()),
        "list_s" => value::string_list(array(x).iter().map(|s| s.as_str().unwrap())),
        "list_type" => {
            let types: Vec<DType> = array(x)
                .iter()
                .map(|t| dtype_named(t.as_str().unwrap()))
                .collect();
            value::dtype_list(&types)
        }
        "list_shape" => list(ListValue {
            shape: array(x)
                .iter()
                .map(|s| {
                    let dims = array(s)
                        .iter()
                        .map(|d| usize::try_from(d.as_i64().unwrap()).ok())
                        .collect::<Vec<_>>();
                    PartialShape::new(dims).to_proto()
                })
                .collect(),
            ..Default::default()
        }),
        other => panic!("attr kind {other}"),
    }
}

/// The elements of a tensor as strings that compare as TensorFlow's values do: floats by
/// their bits (any NaN as `nan`), the rest by value. Kept here, not `json::elements`: any NaN
/// matches any NaN and strings show as text.
fn elements(t: &Tensor) -> Vec<String> {
    let float = |x: f64, bits: String| if x.is_nan() { "nan".into() } else { bits };
    match t.dtype() {
        DType::Float => t
            .values::<f32>()
            .unwrap()
            .iter()
            .map(|x| float(f64::from(*x), format!("{:#x}", x.to_bits())))
            .collect(),
        DType::Double => t
            .values::<f64>()
            .unwrap()
            .iter()
            .map(|x| float(*x, format!("{:#x}", x.to_bits())))
            .collect(),
        DType::String => t
            .strings()
            .unwrap()
            .iter()
            .map(|s| format!("{:?}", String::from_utf8_lossy(s)))
            .collect(),
        _ => as_strings(t),
    }
}

fn as_strings(t: &Tensor) -> Vec<String> {
    match t.dtype() {
        DType::Bool => t
            .values::<bool>()
            .unwrap()
            .iter()
            .map(bool::to_string)
            .collect(),
        _ => as_f64s(t).iter().map(f64::to_string).collect(),
    }
}

fn assert_same(what: &str, got: &Tensor, want: &Tensor) {
    assert_same_by(what, got, want, elements)
}

/// A `NodeDef` for a graph: `name` running `op` on `inputs` with `attrs`.
fn node_def(name: &str, op: &str, inputs: &[String], attrs: Vec<(String, AttrValue)>) -> NodeDef {
    NodeDef {
        name: name.into(),
        op: op.into(),
        input: inputs.to_vec(),
        attr: attrs.into_iter().collect(),
        ..Default::default()
    }
}

/// Adds `op` on `inputs` (as constants) to `session`'s graph as node `{prefix}x` and runs
/// it; returns its `outputs`.
fn run_in_session(
    session: &Session,
    prefix: &str,
    op: &str,
    attrs: &[(String, AttrValue)],
    inputs: &[Tensor],
    outputs: usize,
) -> tessera::error::Result<Vec<Tensor>> {
    let mut nodes = Vec::new();
    let mut names = Vec::new();
    for (i, t) in inputs.iter().enumerate() {
        let name = format!("{prefix}in{i}");
        nodes.push(node_def(
            &name,
            "Const",
            &[],
            vec![
                ("dtype".into(), value::dtype(t.dtype())),
                ("value".into(), value::tensor(t.to_proto())),
            ],
        ));
        names.push(name);
    }
    nodes.push(node_def(&format!("{prefix}x"), op, &names, attrs.to_vec()));
    session.extend(&GraphDef {
        node: nodes,
        ..Default::default()
    })?;
    let fetches: Vec<String> = (0..outputs).map(|i| format!("{prefix}x:{i}")).collect();
    let fetches: Vec<&str> = fetches.iter().map(String::as_str).collect();
    session.run(&[], &fetches, &[])
}

/// Runs one of the script's cases on tessera's kernel (and, when TensorFlow computes it,
/// through `session`, as nodes `c{k}_...`) and compares its outputs, or its error's code and
/// message.
fn check_case(session: &Session, k: usize, case: &Value) {
    let op = case["op"].as_str().unwrap();
    let what = format!("{op} ({})", case["name"].as_str().unwrap());
    let attrs: Vec<(String, AttrValue)> = case["attrs"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), attr(v)))
        .collect();
    let mut b = node(op);
    for (k, v) in &attrs {
        b = b.attr(k, v.clone());
    }
    let inputs: Vec<Tensor> = array(&case["inputs"]).iter().map(tensor).collect();
    let result = b.run(inputs.clone());
    if (op, case["name"].as_str().unwrap()) == ("ParseExampleV2", "ragged") {
        // Ragged features are not implemented yet: refused naming the node.
        let err = result.expect_err("ragged features are refused");
        assert_eq!(err.code(), Code::Unimplemented, "{err}");
        assert!(
            err.message().starts_with("node `x` (op ParseExampleV2)"),
            "{err}"
        );
        return;
    }
    if let Some(error) = case.get("error") {
        let code = error["code"].as_str().unwrap();
        let message = error["message"].as_str().unwrap();
        assert_refused_as_in_tensorflow(&what, op, result, code, message);
        return;
    }
    let got = result.unwrap_or_else(|e| panic!("{what}: {e}"));
    let want: Vec<Tensor> = array(&case["outputs"]).iter().map(tensor).collect();
    assert_eq!(got.len(), want.len(), "{what}: outputs");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_same(&format!("{what}, output {i}"), g, w);
    }
    if !want.is_empty() && !matches!(op, "Print") {
        let got = run_in_session(session, &format!("c{k}_"), op, &attrs, &inputs, want.len())
            .unwrap_or_else(|e| panic!("{what} in a session: {e}"));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_same(&format!("{what} in a session, output {i}"), g, w);
        }
    }
}

/// `tf.io.parse_example` with `FixedLenSequenceFeature`s (dense shapes `[-1]`, `[-1, 2]`).
fn check_sequences(seq: &Value) {
    let examples: Vec<Bytes> = array(&seq["examples"])
        .iter()
        .map(|e| Bytes::from(unhex(e.as_str().unwrap())))
        .collect();
    let strings = |v: &[&str]| {
        let items = v.iter().map(|s| Bytes::from(s.to_string())).collect();
        Tensor::from_strings(vec![v.len()], items).unwrap()
    };
    let shapes = |dims: &[&[i64]]| {
        let shape = dims
            .iter()
            .map(|d| {
                let d: Vec<Option<usize>> = d.iter().map(|&x| usize::try_from(x).ok()).collect();
                PartialShape::new(d).to_proto()
            })
            .collect();
        list(ListValue {
            shape,
            ..Default::default()
        })
    };
    let parse = |serialized: Tensor, stride: i64| {
        node("ParseExampleV2")
            .attr("Tdense", value::dtype_list(&[DType::Float, DType::Int64]))
            .attr("num_sparse", value::int(0))
            .attr("sparse_types", value::dtype_list(&[]))
            .attr("ragged_value_types", value::dtype_list(&[]))
            .attr("ragged_split_types", value::dtype_list(&[]))
            .attr("dense_shapes", shapes(&[&[-1], &[-1, stride]]))
            .run(vec![
                serialized,
                strings(&[]),
                strings(&[]),
                strings(&["w", "n"]),
                strings(&[]),
                Tensor::scalar(-1f32),
                Tensor::scalar(0i64),
            ])
    };
    let batch = Tensor::from_strings(vec![examples.len()], examples.clone()).unwrap();
    let out = parse(batch, 2).unwrap();
    assert_same("FixedLenSequenceFeature w", &out[0], &tensor(&seq["w"]));
    assert_same("FixedLenSequenceFeature n", &out[1], &tensor(&seq["n"]));
    let single = Tensor::string(unhex(seq["single"].as_str().unwrap()));
    let out = parse(single.clone(), 2).unwrap();
    assert_same("one sequence w", &out[0], &tensor(&seq["single_w"]));
    assert_same("one sequence n", &out[1], &tensor(&seq["single_n"]));
    // A stride the values do not fill: in a batch, and for one example.
    let errors = array(&seq["errors"]);
    let two = Tensor::from_strings(vec![2], examples[..2].to_vec()).unwrap();
    let bad = |serialized: Tensor| {
        node("ParseExampleV2")
            .attr("Tdense", value::dtype_list(&[DType::Float]))
            .attr("num_sparse", value::int(0))
            .attr("sparse_types", value::dtype_list(&[]))
            .attr("ragged_value_types", value::dtype_list(&[]))
            .attr("ragged_split_types", value::dtype_list(&[]))
            .attr("dense_shapes", shapes(&[&[-1, 2]]))
            .run(vec![
                serialized,
                strings(&[]),
                strings(&[]),
                strings(&["w"]),
                strings(&[]),
                Tensor::scalar(0f32),
            ])
            .expect_err("TensorFlow refuses it")
    };
    for (serialized, want) in [(two, &errors[0]), (single, &errors[1])] {
        let err = bad(serialized);
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        let message = want["message"].as_str().unwrap();
        assert!(err.message().contains(message), "{err} vs {message}");
    }
}

#[test]
fn strings_and_parsing_match_tensorflow() {
    let test = "strings_and_parsing_match_tensorflow";
    let Some(json) = script_json(test, SCRIPT, &["tensorflow", "numpy"]) else {
        return;
    };
    let cases = array(&json["cases"]);
    let count = |op: &str| cases.iter().filter(|c| c["op"] == op).count();
    assert!(count("ParseExampleV2") >= 20 && count("DecodeCSV") >= 30);
    assert!(count("AsString") >= 25 && count("RegexReplace") >= 18);
    let refused = cases.iter().filter(|c| c.get("error").is_some()).count();
    // A session per 25 cases: each case adds its nodes to the graph and runs them (a graph
    // that keeps growing would be checked whole at every extend).
    for (chunk, group) in cases.chunks(25).enumerate() {
        let session = Session::local();
        for (k, case) in group.iter().enumerate() {
            check_case(&session, 25 * chunk + k, case);
        }
    }
    check_sequences(&json["sequences"]);
    eprintln!(
        "{} cases ({refused} refused with TensorFlow's code and message) match TensorFlow",
        cases.len()
    );
}

fn scalar_string(s: &str) -> Tensor {
    Tensor::string(Bytes::from(s.to_string()))
}

#[test]
fn files_go_through_the_tasks_allowed_directories() {
    let root = tempfile::tempdir().unwrap();
    let allowed = root.path().join("allowed");
    std::fs::create_dir(&allowed).unwrap();
    let secret = root.path().join("secret.txt");
    std::fs::write(&secret, "outside").unwrap();
    let server = Server::start(TaskConfig {
        checkpoints: CheckpointsConfig {
            allowed_dirs: Some(vec![allowed.clone()]),
            ..Default::default()
        },
        ..TaskConfig::local()
    })
    .unwrap();
    let session = Session::connect(&format!("grpc://{}", server.local_addr())).unwrap();
    let mut g = Graph::new();
    let scalar = PartialShape::new(vec![]);
    let path = g
        .placeholder("path", DType::String, scalar.clone())
        .unwrap();
    let contents = g.placeholder("contents", DType::String, scalar).unwrap();
    let write = g
        .add_node(
            NodeSpec::new("WriteFile")
                .name("write")
                .input(&path)
                .input(&contents),
        )
        .unwrap();
    assert!(write.is_empty());
    let read = g
        .add1(NodeSpec::new("ReadFile").name("read").input(&path))
        .unwrap();
    assert_eq!(read.shape, PartialShape::new(vec![]));
    session.extend(&g.to_graph_def()).unwrap();

    // Inside: written (its directory made) and read back.
    let inside = allowed.join("sub/dir/file.txt");
    let inside = inside.to_str().unwrap();
    session
        .run(
            &[
                ("path:0", scalar_string(inside)),
                ("contents:0", scalar_string("héllo\0bytes")),
            ],
            &[],
            &["write"],
        )
        .unwrap();
    let out = session
        .run(&[("path:0", scalar_string(inside))], &["read:0"], &[])
        .unwrap();
    assert_eq!(&out[0].strings().unwrap()[0][..], "héllo\0bytes".as_bytes());

    // Outside: refused naming the node and the key; nothing read or written.
    for path in ["/etc/passwd", secret.to_str().unwrap()] {
        let err = session
            .run(&[("path:0", scalar_string(path))], &["read:0"], &[])
            .expect_err("outside the allowed directories");
        assert_eq!(err.code(), Code::PermissionDenied, "{err}");
        assert!(err.message().contains("`read`"), "{err}");
        assert!(err.message().contains("checkpoints.allowed_dirs"), "{err}");
    }
    let escape = format!("{}/../escaped.txt", allowed.display());
    let err = session
        .run(
            &[
                ("path:0", scalar_string(&escape)),
                ("contents:0", scalar_string("x")),
            ],
            &[],
            &["write"],
        )
        .expect_err("outside through ..");
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    assert!(!root.path().join("escaped.txt").exists());
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "outside");

    // TensorFlow's codes: a missing file, a directory.
    let missing = allowed.join("missing.txt");
    let err = session
        .run(
            &[("path:0", scalar_string(missing.to_str().unwrap()))],
            &["read:0"],
            &[],
        )
        .expect_err("missing");
    assert_eq!(err.code(), Code::NotFound, "{err}");
    assert!(err.message().contains("No such file or directory"), "{err}");
    let err = session
        .run(
            &[("path:0", scalar_string(allowed.to_str().unwrap()))],
            &["read:0"],
            &[],
        )
        .expect_err("a directory");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("Is a directory"), "{err}");
}

#[test]
fn outputs_past_the_memory_budget_are_refused_before_they_are_allocated() {
    let session = Session::local_with(SessionOptions {
        cpu_memory_limit: Some(1 << 20),
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.bin");
    std::fs::write(&big, vec![7u8; 4 << 20]).unwrap();
    let mut g = Graph::new();
    let x = g
        .placeholder("x", DType::Int32, PartialShape::unknown_dims(1))
        .unwrap();
    let wide = g
        .add1(
            NodeSpec::new("AsString")
                .name("wide")
                .input(&x)
                .attr("width", value::int(1 << 18)),
        )
        .unwrap();
    let path = g.constant(&scalar_string(big.to_str().unwrap())).unwrap();
    let read = g
        .add1(NodeSpec::new("ReadFile").name("read").input(&path))
        .unwrap();
    let s = g
        .placeholder("s", DType::String, PartialShape::unknown_dims(1))
        .unwrap();
    let empty = g.constant(&scalar_string("")).unwrap();
    let split = g
        .add_node(
            NodeSpec::new("StringSplit")
                .name("split")
                .input(&s)
                .input(&empty),
        )
        .unwrap();
    session.extend(&g.to_graph_def()).unwrap();
    let long = Tensor::from_strings(vec![1], vec![Bytes::from(vec![b'a'; 200_000])]).unwrap();
    for (fetch, feeds) in [
        (wide.name(), vec![("x:0", i32s(&[8], &[1; 8]))]),
        (read.name(), vec![]),
        (split[1].name(), vec![("s:0", long)]),
    ] {
        let err = session
            .run(&feeds, &[&fetch], &[])
            .expect_err("over the budget");
        assert_eq!(err.code(), Code::ResourceExhausted, "{fetch}: {err}");
        let node = fetch.split(':').next().unwrap();
        assert!(err.message().contains(&format!("`{node}`")), "{err}");
    }
    // What fits runs in the same session.
    let out = session
        .run(&[("x:0", i32s(&[2], &[1, 2]))], &[&wide.name()], &[])
        .unwrap();
    assert_eq!(out[0].strings().unwrap()[0].len(), 1 << 18);
}

#[test]
fn shape_functions_follow_tensorflow() {
    let mut g = Graph::new();
    let known = |d: &[usize]| PartialShape::new(d.iter().map(|&d| Some(d)).collect::<Vec<_>>());
    let s = g.placeholder("s", DType::String, known(&[4])).unwrap();
    let sep = g.constant(&scalar_string(",")).unwrap();
    let split = g
        .add_node(NodeSpec::new("StringSplitV2").input(&s).input(&sep))
        .unwrap();
    let shapes: Vec<String> = split.iter().map(|o| o.shape.to_string()).collect();
    assert_eq!(shapes, ["[?,2]", "[?]", "[2]"]);
    let m = g.placeholder("m", DType::String, known(&[2, 3])).unwrap();
    let err = g
        .add_node(NodeSpec::new("StringSplit").input(&m).input(&sep))
        .expect_err("a matrix");
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");

    let records = g.placeholder("r", DType::String, known(&[5, 2])).unwrap();
    let d0 = g.constant(&i32s(&[1], &[0])).unwrap();
    let d1 = g.constant(&scalar_string("x")).unwrap();
    let columns = g
        .add_node(
            NodeSpec::new("DecodeCSV")
                .input(&records)
                .input_list(&[d0, d1])
                .attr(
                    "OUT_TYPE",
                    value::dtype_list(&[DType::Int32, DType::String]),
                ),
        )
        .unwrap();
    assert_eq!(columns.len(), 2);
    assert_eq!(
        (columns[0].dtype, columns[1].dtype),
        (DType::Int32, DType::String)
    );
    assert_eq!(columns[1].shape, known(&[5, 2]));

    let raw = g
        .add1(
            NodeSpec::new("DecodeRaw")
                .input(&s)
                .attr("out_type", value::dtype(DType::Float)),
        )
        .unwrap();
    assert_eq!(raw.shape.to_string(), "[4,?]");

    let batch = g
        .placeholder("b", DType::String, PartialShape::unknown_dims(1))
        .unwrap();
    let empty = g
        .constant(&Tensor::from_strings(vec![0], vec![]).unwrap())
        .unwrap();
    let sparse_keys = g
        .constant(&Tensor::from_strings(vec![1], vec![Bytes::from("tags")]).unwrap())
        .unwrap();
    let dense_keys = g
        .constant(&Tensor::from_strings(vec![1], vec![Bytes::from("w")]).unwrap())
        .unwrap();
    let default = g.constant(&f32s(&[2, 3], &[0.0; 6])).unwrap();
    let parsed = g
        .add_node(
            NodeSpec::new("ParseExampleV2")
                .input(&batch)
                .input(&empty)
                .input(&sparse_keys)
                .input(&dense_keys)
                .input(&empty)
                .input_list(&[default])
                .attr("Tdense", value::dtype_list(&[DType::Float]))
                .attr("num_sparse", value::int(1))
                .attr("sparse_types", value::dtype_list(&[DType::String]))
                .attr("ragged_value_types", value::dtype_list(&[]))
                .attr("ragged_split_types", value::dtype_list(&[]))
                .attr(
                    "dense_shapes",
                    list(ListValue {
                        shape: vec![known(&[2, 3]).to_proto()],
                        ..Default::default()
                    }),
                ),
        )
        .unwrap();
    let shapes: Vec<String> = parsed.iter().map(|o| o.shape.to_string()).collect();
    assert_eq!(shapes, ["[?,2]", "[?]", "[2]", "[?,2,3]"]);
    assert_eq!(parsed[1].dtype, DType::String);
}
