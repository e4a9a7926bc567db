//! `StatelessRandomGetKeyCounter`, `StatelessRandomUniformV2`, `SerializeSparse` and
//! `DeserializeSparse` against stock TensorFlow 2.21 (`tests/kernels_stateless_sparse_tf.py`
//! computes its values live: skipped without TensorFlow, a failure under CI):
//!
//! - keys and counters of int32 and int64 seeds, and uniform samples of every dtype from
//!   them, bit for bit (the public `tf.random.stateless_uniform` too);
//! - serialized sparse tensors byte for byte, and TensorFlow's serialized triples (one, a
//!   batch, a batch of batches) deserialized to its indices, values and shape exactly;
//! - TensorFlow's code and message for a bad input of each op, naming the node.
//!
//! Without TensorFlow: a variant triple from `SerializeSparse` comes back whole through
//! `DeserializeSparse`, batched or not.

use crate::kernels_support::json::{array, dims, dtype_named, unhex};
use crate::kernels_support::*;
use crate::support::tensorflow::script_json;
use bytes::Bytes;
use serde_json::Value;
use tessera::error::Code;
use tessera::tensor::{DType, Tensor};

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/kernels_stateless_sparse_tf.py"
);

fn u64s(v: &Value) -> Vec<u64> {
    array(v).iter().map(|x| x.as_u64().unwrap()).collect()
}

fn i64s_of(v: &Value) -> Vec<i64> {
    array(v).iter().map(|x| x.as_i64().unwrap()).collect()
}

/// A values vector the script encoded: floats as float64 bits, strings as hex.
fn values(v: &Value, dtype: DType) -> Tensor {
    json::values(v, dtype, vec![array(v).len()])
}

/// The bits of each sample, as the script prints them.
fn sample_bits(t: &Tensor) -> Vec<u64> {
    match t.dtype() {
        DType::Float => t
            .values::<f32>()
            .unwrap()
            .iter()
            .map(|x| u64::from(x.to_bits()))
            .collect(),
        DType::Double => t
            .values::<f64>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect(),
        DType::Half => t
            .values::<half::f16>()
            .unwrap()
            .iter()
            .map(|x| u64::from(x.to_bits()))
            .collect(),
        DType::BFloat16 => t
            .values::<half::bf16>()
            .unwrap()
            .iter()
            .map(|x| u64::from(x.to_bits()))
            .collect(),
        other => panic!("samples of {other}"),
    }
}

fn key_counter(seed: Tensor) -> (Tensor, Tensor) {
    let mut out = node("StatelessRandomGetKeyCounter")
        .attr("Tseed", value::dtype(seed.dtype()))
        .run(vec![seed])
        .unwrap();
    let counter = out.pop().unwrap();
    (out.pop().unwrap(), counter)
}

fn check_key_counters(cases: &Value) {
    for case in array(cases) {
        let seed = i64s_of(&case["seed"]);
        let t = match case["dtype"].as_str().unwrap() {
            "int32" => i32s(&[2], &[seed[0] as i32, seed[1] as i32]),
            _ => i64s(&[2], &seed),
        };
        let (key, counter) = key_counter(t);
        assert_eq!(key.dims(), [1]);
        assert_eq!(counter.dims(), [2]);
        assert_eq!(
            key.values::<u64>().unwrap().to_vec(),
            u64s(&case["key"]),
            "{case}"
        );
        assert_eq!(
            counter.values::<u64>().unwrap().to_vec(),
            u64s(&case["counter"]),
            "{case}"
        );
    }
}

fn check_uniforms(cases: &Value) {
    for case in array(cases) {
        let seed = i64s_of(&case["seed"]);
        let (key, counter) = key_counter(i64s(&[2], &seed));
        let shape: Vec<i32> = i64s_of(&case["shape"]).iter().map(|&d| d as i32).collect();
        let dtype = dtype_named(case["dtype"].as_str().unwrap());
        let alg = case["alg"].as_i64().unwrap() as i32;
        let out = run1(
            node("StatelessRandomUniformV2")
                .attr("dtype", value::dtype(dtype))
                .attr("Tshape", value::dtype(DType::Int32)),
            vec![ivec(&shape), key, counter, Tensor::scalar(alg)],
        );
        let want: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
        assert_eq!(out.dims(), want, "{case}");
        assert_eq!(
            sample_bits(&out),
            u64s(&case["bits"]),
            "seed {seed:?} {dtype} {shape:?}"
        );
    }
}

fn serialize(indices: Tensor, values: Tensor, shape: Tensor, out_type: DType) -> Tensor {
    run1(
        node("SerializeSparse")
            .t(values.dtype())
            .attr("out_type", value::dtype(out_type)),
        vec![indices, values, shape],
    )
}

fn check_serializations(cases: &Value) {
    for case in array(cases) {
        let rank = case["rank"].as_u64().unwrap() as usize;
        let flat: Vec<i64> = array(&case["indices"]).iter().flat_map(i64s_of).collect();
        let indices = i64s(&[flat.len() / rank, rank], &flat);
        let dtype = dtype_named(case["dtype"].as_str().unwrap());
        let vals = values(&case["values"], dtype);
        let shape = i64s(&[rank], &i64s_of(&case["shape"]));
        let out = serialize(indices, vals, shape, DType::String);
        let got: Vec<Bytes> = out.strings().unwrap().to_vec();
        let want: Vec<Bytes> = array(&case["serialized"])
            .iter()
            .map(|s| Bytes::from(unhex(s.as_str().unwrap())))
            .collect();
        assert_eq!(out.dims(), [3]);
        assert_eq!(got, want, "{case}");
    }
}

fn check_deserializations(cases: &Value) {
    for case in array(cases) {
        let strings: Vec<Bytes> = array(&case["serialized"])
            .iter()
            .map(|s| Bytes::from(unhex(s.as_str().unwrap())))
            .collect();
        let serialized = Tensor::from_strings(dims(&case["serialized_shape"]), strings).unwrap();
        let dtype = dtype_named(case["dtype"].as_str().unwrap());
        let out = node("DeserializeSparse")
            .attr("dtype", value::dtype(dtype))
            .attr("Tserialized", value::dtype(DType::String))
            .run(vec![serialized])
            .unwrap();
        let flat: Vec<i64> = array(&case["indices"]).iter().flat_map(i64s_of).collect();
        assert_eq!(out[0].dims(), dims(&case["index_shape"]), "{case}");
        assert_eq!(out[0].values::<i64>().unwrap().to_vec(), flat, "{case}");
        assert_eq!(out[1], values(&case["values"], dtype), "{case}");
        assert_eq!(
            out[2].values::<i64>().unwrap().to_vec(),
            i64s_of(&case["shape"])
        );
    }
}

/// Runs each bad input on tessera and checks TensorFlow's code and message for it.
fn check_errors(errors: &Value) {
    let (key, counter) = key_counter(i64s(&[2], &[1, 2]));
    let uniform = || node("StatelessRandomUniformV2").attr("dtype", value::dtype(DType::Float));
    let good = serialize(
        i64s(&[2, 2], &[0, 1, 2, 0]),
        f32s(&[2], &[1.5, -2.25]),
        i64s(&[2], &[3, 4]),
        DType::String,
    );
    let deserialize = || node("DeserializeSparse").attr("dtype", value::dtype(DType::Int32));
    let strings = |dims: Vec<usize>, n: usize| {
        Tensor::from_strings(dims, vec![Bytes::from_static(b"a"); n]).unwrap()
    };
    let cases: Vec<(&str, NodeBuilder, Vec<Tensor>)> = vec![
        (
            "seed_shape",
            node("StatelessRandomGetKeyCounter"),
            vec![i64s(&[3], &[1, 2, 3])],
        ),
        (
            "threefry",
            uniform(),
            vec![
                ivec(&[3]),
                key.clone(),
                counter.clone(),
                Tensor::scalar(2i32),
            ],
        ),
        (
            "key_shape",
            uniform(),
            vec![
                ivec(&[3]),
                Tensor::from_vec(vec![2], vec![1u64, 2]).unwrap(),
                counter,
                Tensor::scalar(1i32),
            ],
        ),
        (
            "indices_vector",
            node("SerializeSparse").t(DType::Float),
            vec![i64s(&[1], &[0]), f32s(&[1], &[1.0]), i64s(&[1], &[3])],
        ),
        ("last_dim", deserialize(), vec![strings(vec![2], 2)]),
        ("no_tensors", deserialize(), vec![strings(vec![0, 3], 0)]),
        ("wrong_dtype", deserialize(), vec![good.clone()]),
        (
            "wrong_dtype_batch",
            deserialize(),
            vec![Tensor::from_strings(vec![2, 3], [good.strings().unwrap(); 2].concat()).unwrap()],
        ),
    ];
    for (name, b, inputs) in cases {
        let op = b.def().op.clone();
        let want = &errors[name];
        let err = b.run(inputs).expect_err(name);
        let code = Code::from_str_name(want["code"].as_str().unwrap()).unwrap();
        assert_eq!(err.code(), code, "{name}: {err}");
        let message = want["message"].as_str().unwrap();
        assert!(
            err.message().contains(message),
            "{name}: tessera says `{}`, TensorFlow `{message}`",
            err.message()
        );
        assert!(
            err.message().starts_with(&format!("node `x` (op {op})")),
            "{err}"
        );
    }
}

#[test]
fn stateless_uniforms_and_serialized_sparse_tensors_match_tensorflow() {
    let test = "stateless_uniforms_and_serialized_sparse_tensors_match_tensorflow";
    let Some(json) = script_json(test, SCRIPT, &["tensorflow", "numpy"]) else {
        return;
    };
    check_key_counters(&json["key_counters"]);
    check_uniforms(&json["uniforms"]);
    check_serializations(&json["serializations"]);
    check_deserializations(&json["deserializations"]);
    check_errors(&json["errors"]);
}

#[test]
fn variant_triples_deserialize_back_whole() {
    let triple = |first: i64, value: f32, len: i64| {
        serialize(
            i64s(&[2, 1], &[first, first + 1]),
            f32s(&[2], &[value, -value]),
            i64s(&[1], &[len]),
            DType::Variant,
        )
    };
    let deserialize = |serialized: Tensor| {
        node("DeserializeSparse")
            .attr("dtype", value::dtype(DType::Float))
            .attr("Tserialized", value::dtype(DType::Variant))
            .run(vec![serialized])
            .unwrap()
    };
    let one = triple(3, 1.5, 6);
    assert_eq!(one.dtype(), DType::Variant);
    let out = deserialize(one.clone());
    assert_exact(&out[0], &[2, 1], &[3i64, 4]);
    assert_exact(&out[1], &[2], &[1.5f32, -1.5]);
    assert_exact(&out[2], &[1], &[6i64]);
    let two = triple(0, 2.0, 9);
    let batch = Tensor::from_variants(
        vec![2, 3],
        [one.variants().unwrap(), two.variants().unwrap()].concat(),
    )
    .unwrap();
    let out = deserialize(batch);
    assert_exact(&out[0], &[4, 2], &[0i64, 3, 0, 4, 1, 0, 1, 1]);
    assert_exact(&out[1], &[4], &[1.5f32, -1.5, 2.0, -2.0]);
    assert_exact(&out[2], &[2], &[2i64, 9]);
}
