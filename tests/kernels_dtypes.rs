//! Issue #33's dtypes (uint8, int8, int16, uint16, uint32, uint64, float16, bfloat16,
//! complex64) against stock TensorFlow 2.21, live (`tests/kernels_dtypes_tf.py` computes the
//! values: skipped without TensorFlow, a failure under CI):
//!
//! - every new dtype's `TensorProto`, as `tf.make_tensor_proto` writes it (`tensor_content`)
//!   and in the typed field TensorFlow reads for it (`int_val`, `half_val`, `uint32_val`,
//!   `uint64_val`, `scomplex_val`), read by tessera to TensorFlow's elements; tessera's own
//!   proto of them is, byte for byte, one TensorFlow reads back to the same elements;
//! - `Cast` between every pair of the 14 numeric and bool dtypes on edge values (NaN,
//!   infinities, -0.0, out of range, 65504 and 65520 for float16, bfloat16's rounding ties,
//!   `Truncate`), bit for bit;
//! - the arithmetic, comparison and reduction ops on each narrow dtype (exact for integers and
//!   comparisons, within an ulp or two of float16 and bfloat16 for sums, products,
//!   transcendentals), a float16 `MatMul`, and uint8 pixels cast and scaled through a session;
//! - a TensorFlow 1 client feeding uint8 and bfloat16 tensors over the wire to a `tessera
//!   serve` task and fetching casts of them: TensorFlow's own session's values.
//!
//! Without TensorFlow: moving kernels (Identity, Reshape, ConcatV2, Pack, Transpose, Tile,
//! GatherV2, Select, ...) keep the new dtypes' bytes, and a dtype an op does not take fails
//! with INVALID_ARGUMENT naming the node and the dtypes it takes.

use std::process::Command;

use crate::kernels_support::json::{dims, dtype_named, unhex};
use crate::kernels_support::*;
use crate::support::cluster::Cluster;
use crate::support::tensorflow::{script_json, tensorflow_python, Client};
use bytes::Bytes;
use prost::Message;
use serde_json::Value;
use tessera::client::Session;
use tessera::error::Code;
use tessera::proto::{GraphDef, NodeDef, TensorProto};
use tessera::tensor::{bf16, f16, DType, Shape, Tensor};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kernels_dtypes_tf.py");

/// A tensor the script encoded as `{dtype, shape, hex}`: kept here, as only this script
/// writes raw little-endian bytes rather than `values`.
fn tensor(v: &Value) -> Tensor {
    let shape = dims(&v["shape"]);
    let dtype = dtype_named(v["dtype"].as_str().unwrap());
    let bytes = Bytes::from(unhex(v["hex"].as_str().unwrap()));
    Tensor::from_bytes(dtype, shape, bytes).unwrap()
}

/// The elements as `f64`s (the real part of complex numbers, imaginary parts after them).
fn as_f64s(t: &Tensor) -> Vec<f64> {
    let t = t.to_host().unwrap();
    match t.dtype() {
        DType::Float => t
            .values::<f32>()
            .unwrap()
            .iter()
            .map(|&v| v.into())
            .collect(),
        DType::Double => t.values::<f64>().unwrap().into_owned(),
        DType::Half => t
            .values::<f16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f64())
            .collect(),
        DType::BFloat16 => t
            .values::<bf16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f64())
            .collect(),
        DType::Complex64 => {
            let v = t.values::<tessera::tensor::Complex64>().unwrap();
            v.iter()
                .map(|c| f64::from(c.re))
                .chain(v.iter().map(|c| f64::from(c.im)))
                .collect()
        }
        _ => panic!("{t:?} is not a float tensor"),
    }
}

/// Whether the dtype's elements are floats, compared as numbers (NaN equal to NaN).
fn floating(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Float | DType::Double | DType::Half | DType::BFloat16 | DType::Complex64
    )
}

/// Asserts `got` is `want`: same dtype and shape; floats equal as numbers within `rel`
/// (relative, and as much absolutely), NaN equal to NaN, -0.0 told from 0.0 when `rel` is 0;
/// the rest byte for byte.
fn assert_same(what: &str, got: &Tensor, want: &Tensor, rel: f64) {
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    if !floating(want.dtype()) {
        let got = got.to_host().unwrap();
        assert_eq!(
            got.raw_bytes().unwrap(),
            want.raw_bytes().unwrap(),
            "{what}: got {got:?}, want {want:?}"
        );
        return;
    }
    let (g, w) = (as_f64s(got), as_f64s(want));
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let same = if rel == 0.0 {
            (a.is_nan() && b.is_nan()) || (a == b && a.is_sign_negative() == b.is_sign_negative())
        } else {
            (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= rel * b.abs().max(1.0)
        };
        assert!(
            same,
            "{what}: element {i} is {a}, TensorFlow's {b} ({got:?} vs {want:?})"
        );
    }
}

/// One run of the script (importing TensorFlow is most of its time) for every check against
/// its values.
#[test]
fn the_new_dtypes_match_stock_tensorflow() {
    let Some(json) = script_json("kernels_dtypes::stock", SCRIPT, &["tensorflow"]) else {
        return;
    };
    tensor_protos_of_every_new_dtype_read_and_write_as_tensorflow_does(&json);
    cast_between_every_pair_of_dtypes_is_tensorflows_bit_for_bit(&json);
    arithmetic_comparisons_and_reductions_on_narrow_dtypes_match_tensorflow(&json);
    uint8_images_cast_and_scale_and_a_float16_matmul_through_a_session(&json);
}

fn tensor_protos_of_every_new_dtype_read_and_write_as_tensorflow_does(json: &Value) {
    for case in json["protos"].as_array().unwrap() {
        let want = tensor(&case["values"]);
        let what = want.dtype().name();
        for field in ["content", "typed"] {
            let bytes = unhex(case[field].as_str().unwrap());
            let proto = TensorProto::decode(bytes.as_slice()).unwrap();
            let got = Tensor::from_proto(&proto)
                .unwrap_or_else(|e| panic!("{what} from its {field} proto: {e}"));
            assert_same(&format!("{what} from {field}"), &got, &want, 0.0);
        }
        // tessera's proto is, byte for byte, one TensorFlow was shown to read.
        let ours = want.to_proto().encode_to_vec();
        assert_eq!(
            ours,
            unhex(case["raw"].as_str().unwrap()),
            "{what}: tessera's TensorProto is not the one TensorFlow read"
        );
        let content = Tensor::from_proto(&want.to_proto_content()).unwrap();
        assert_same(
            &format!("{what} through tensor_content"),
            &content,
            &want,
            0.0,
        );
    }
}

fn cast_between_every_pair_of_dtypes_is_tensorflows_bit_for_bit(json: &Value) {
    let cases = json["casts"].as_array().unwrap();
    assert!(cases.len() > 500, "only {} casts", cases.len());
    let mut pairs = std::collections::BTreeSet::new();
    for case in cases {
        let (x, want) = (tensor(&case["x"]), tensor(&case["y"]));
        let mut cast = node("Cast")
            .attr("SrcT", value::dtype(x.dtype()))
            .attr("DstT", value::dtype(want.dtype()));
        if case["truncate"] == Value::Bool(true) {
            cast = cast.attr("Truncate", value::bool(true));
        }
        let what = format!("Cast {x:?} to {}", want.dtype());
        let got = cast
            .run(vec![x.clone()])
            .unwrap_or_else(|e| panic!("{what}: {e}"))
            .remove(0);
        assert_same(&what, &got, &want, 0.0);
        pairs.insert((x.dtype(), want.dtype()));
    }
    // Every ordered pair of the 14 dtypes TensorFlow casts between.
    assert_eq!(pairs.len(), 14 * 13, "pairs covered: {pairs:?}");
}

fn arithmetic_comparisons_and_reductions_on_narrow_dtypes_match_tensorflow(json: &Value) {
    let mut checked = 0;
    for case in json["ops"].as_array().unwrap() {
        if case.get("error").is_some() {
            continue; // TensorFlow has no kernel for it (RealDiv on integers, Neg on uint8)
        }
        let op = case["op"].as_str().unwrap();
        let dtype = dtype_named(case["dtype"].as_str().unwrap());
        let inputs: Vec<Tensor> = case["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(tensor)
            .collect();
        let mut b = node(op).t(dtype);
        if let Some(keep) = case["attrs"]["keep_dims"].as_bool() {
            b = b.attr("keep_dims", value::bool(keep));
        }
        if let Some(out) = case["attrs"]["output_type"].as_str() {
            b = b.attr("output_type", value::dtype(dtype_named(out)));
        }
        let want = tensor(&case["out"]);
        let what = format!("{op} on {dtype}");
        let got = b
            .run(inputs)
            .unwrap_or_else(|e| panic!("{what}: {e}"))
            .remove(0);
        // Element-wise arithmetic rounds once, as Eigen does; sums, products, means and
        // transcendental functions may round on another path.
        let loose = matches!(
            op,
            "Sum" | "Mean" | "Prod" | "Exp" | "Tanh" | "Sigmoid" | "Softmax"
        );
        let rel = match dtype {
            DType::Half if loose => 2e-3,
            DType::BFloat16 if loose => 1.6e-2,
            _ => 0.0,
        };
        assert_same(&what, &got, &want, rel);
        checked += 1;
    }
    assert!(checked > 150, "only {checked} cases compared");
}

/// A `NodeDef` for a session graph.
fn graph_node(
    name: &str,
    op: &str,
    inputs: &[&str],
    attrs: &[(&str, tessera::proto::AttrValue)],
) -> NodeDef {
    NodeDef {
        name: name.into(),
        op: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        attr: attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        ..Default::default()
    }
}

fn uint8_images_cast_and_scale_and_a_float16_matmul_through_a_session(json: &Value) {
    let image = tensor(&json["image"]["x"]);
    let (a, b) = (tensor(&json["matmul"]["a"]), tensor(&json["matmul"]["b"]));
    let constant = |name: &str, t: &Tensor| {
        graph_node(
            name,
            "Const",
            &[],
            &[
                ("dtype", value::dtype(t.dtype())),
                ("value", value::tensor(t.to_proto())),
            ],
        )
    };
    let graph = GraphDef {
        node: vec![
            constant("image", &image),
            constant("scale", &Tensor::scalar(255.0f32)),
            graph_node(
                "float",
                "Cast",
                &["image"],
                &[
                    ("SrcT", value::dtype(DType::UInt8)),
                    ("DstT", value::dtype(DType::Float)),
                ],
            ),
            graph_node(
                "scaled",
                "RealDiv",
                &["float", "scale"],
                &[("T", value::dtype(DType::Float))],
            ),
            constant("a", &a),
            constant("b", &b),
            graph_node(
                "product",
                "MatMul",
                &["a", "b"],
                &[
                    ("T", value::dtype(DType::Half)),
                    ("transpose_a", value::bool(false)),
                    ("transpose_b", value::bool(false)),
                ],
            ),
        ],
        ..Default::default()
    };
    let session = Session::local();
    session.extend(&graph).unwrap();
    let out = session.run(&[], &["scaled:0", "product:0"], &[]).unwrap();
    assert_same(
        "uint8 pixels / 255",
        &out[0],
        &tensor(&json["image"]["y"]),
        0.0,
    );
    // TensorFlow's float16 product may accumulate in another order: an ulp or two.
    assert_same(
        "float16 MatMul",
        &out[1],
        &tensor(&json["matmul"]["y"]),
        2e-3,
    );
}

#[test]
fn a_tensorflow_client_feeds_uint8_and_bfloat16_over_the_wire() {
    let Some(python) = tensorflow_python("kernels_dtypes::wire") else {
        return;
    };
    let cluster = Cluster::start(&[("worker", 1)]);
    let mut command = Command::new(python);
    command
        .arg(SCRIPT)
        .arg("wire")
        .arg(cluster.addr("worker", 0).to_string());
    let json = Client::spawn(command).finish().json;
    let ours = json["tessera"].as_array().unwrap();
    let theirs = json["tensorflow"].as_array().unwrap();
    assert_eq!(ours.len(), 5);
    for (i, (got, want)) in ours.iter().zip(theirs).enumerate() {
        assert_same(&format!("fetch {i}"), &tensor(got), &tensor(want), 0.0);
    }
}

/// `n` elements of `dtype` from a fixed pattern of bytes (any bits: moving kernels never look
/// at them).
fn sample(dtype: DType, n: usize) -> Tensor {
    let size = dtype.size().unwrap();
    let bytes: Vec<u8> = (0..n * size).map(|i| (i * 37 % 251) as u8).collect();
    Tensor::from_bytes(dtype, [n], Bytes::from(bytes)).unwrap()
}

const NEW: [DType; 9] = [
    DType::UInt8,
    DType::Int8,
    DType::Int16,
    DType::UInt16,
    DType::UInt32,
    DType::UInt64,
    DType::Half,
    DType::BFloat16,
    DType::Complex64,
];

#[test]
fn moving_kernels_keep_the_bytes_of_every_new_dtype() {
    for dtype in NEW {
        let x = sample(dtype, 6);
        let size = dtype.size().unwrap();
        let bytes = x.raw_bytes().unwrap().to_vec();
        let element = |i: usize| bytes[i * size..(i + 1) * size].to_vec();
        let join = |order: &[usize]| order.iter().flat_map(|&i| element(i)).collect::<Vec<u8>>();
        let check = |what: &str, got: &Tensor, dims: &[usize], order: &[usize]| {
            assert_eq!(got.dtype(), dtype, "{what} of {dtype}");
            assert_eq!(got.dims(), dims, "{what} of {dtype}");
            assert_eq!(
                got.raw_bytes().unwrap().to_vec(),
                join(order),
                "{what} of {dtype}"
            );
        };
        let m = x.reshape([2, 3]).unwrap();
        let out = run1(node("Identity").t(dtype), vec![x.clone()]);
        check("Identity", &out, &[6], &[0, 1, 2, 3, 4, 5]);
        let out = run1(
            node("Reshape").t(dtype),
            vec![x.clone(), i32s(&[2], &[3, 2])],
        );
        check("Reshape", &out, &[3, 2], &[0, 1, 2, 3, 4, 5]);
        let out = run1(
            node("Transpose").t(dtype),
            vec![m.clone(), i32s(&[2], &[1, 0])],
        );
        check("Transpose", &out, &[3, 2], &[0, 3, 1, 4, 2, 5]);
        let out = run1(
            node("ConcatV2").t(dtype).attr("N", value::int(2)),
            vec![m.clone(), m.clone(), i32s(&[], &[1])],
        );
        check(
            "ConcatV2",
            &out,
            &[2, 6],
            &[0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5],
        );
        let out = run1(
            node("Pack").t(dtype).attr("N", value::int(2)),
            vec![x.clone(), x.clone()],
        );
        check("Pack", &out, &[2, 6], &[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5]);
        let out = run1(
            node("GatherV2").t(dtype),
            vec![x.clone(), i32s(&[3], &[5, 0, 5]), i32s(&[], &[0])],
        );
        check("GatherV2", &out, &[3], &[5, 0, 5]);
        let out = run1(node("Tile").t(dtype), vec![m.clone(), i32s(&[2], &[1, 2])]);
        check("Tile", &out, &[2, 6], &[0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5]);
        let out = run1(
            node("Slice").t(dtype),
            vec![m.clone(), i32s(&[2], &[1, 1]), i32s(&[2], &[1, 2])],
        );
        check("Slice", &out, &[1, 2], &[4, 5]);
        let y = sample(dtype, 12).reshape([2, 6]).unwrap();
        let cond = bools(&[6], &[true, false, true, false, true, false]);
        let out = run1(node("SelectV2").t(dtype), vec![cond, x.clone(), x.clone()]);
        check("SelectV2", &out, &[6], &[0, 1, 2, 3, 4, 5]);
        let out = run1(node("ZerosLike").t(dtype), vec![y.clone()]);
        assert!(
            out.raw_bytes().unwrap().iter().all(|&b| b == 0),
            "ZerosLike of {dtype}"
        );
        let out = run1(
            node("Fill").t(dtype),
            vec![
                i32s(&[1], &[3]),
                sample(dtype, 1).reshape(Shape::scalar()).unwrap(),
            ],
        );
        check("Fill", &out, &[3], &[0, 0, 0]);
        let ones = run1(node("OnesLike").t(dtype), vec![x.clone()]);
        let back = run1(
            node("Cast").attr("DstT", value::dtype(DType::Int32)),
            vec![ones],
        );
        assert_eq!(
            back.values::<i32>().unwrap().as_ref(),
            &[1; 6],
            "OnesLike of {dtype}"
        );
        let out = run1(node("Shape").t(dtype), vec![m.clone()]);
        assert_eq!(out.values::<i32>().unwrap().as_ref(), &[2, 3]);
    }
}

#[test]
fn a_dtype_an_op_does_not_take_names_the_node_and_the_dtypes_it_takes() {
    let x = sample(DType::Int8, 3);
    let message = expect_err(
        node("Sqrt").name("root").t(DType::Int8),
        vec![x],
        Code::InvalidArgument,
        "node `root` (op Sqrt)",
    );
    assert!(
        message.contains("int8") && message.contains("float16, bfloat16"),
        "{message}"
    );
    let z = sample(DType::Complex64, 2);
    let message = expect_err(
        node("AddV2").name("sum").t(DType::Complex64),
        vec![z.clone(), z],
        Code::InvalidArgument,
        "node `sum` (op AddV2)",
    );
    assert!(
        message.contains("complex64") && message.contains("uint8"),
        "{message}"
    );
}
