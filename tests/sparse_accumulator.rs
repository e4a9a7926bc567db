//! TensorFlow's `SparseConditionalAccumulator` on tessera: the runtime accumulator
//! ([`SparseConditionalAccumulator`]) and its kernels (`SparseConditionalAccumulator`,
//! `SparseAccumulatorApplyGradient`, `SparseAccumulatorTakeGradient`, and the reference-handle
//! `AccumulatorSetGlobalStep` / `AccumulatorNumAccumulated` that TensorFlow shares with the
//! dense kind).
//!
//! `tests/sparse_accumulator_tf.py` runs scripted sequences of operations on stock TensorFlow
//! 2.21 (live: skipped without TensorFlow, a failure under CI): indices repeated within and
//! across gradients and out of order, stale gradients, MEAN and SUM in float32 and float64,
//! declared, partly known and unknown shapes, and gradients TensorFlow refuses. tessera replays
//! each sequence through its kernels and must give the same indices, values (to the bit) and
//! dense shapes, and refuse the same gradients with TensorFlow's message. The runtime's own
//! behaviour (staleness, repeated rows, the take's deadline and its error) and the op
//! signatures need no TensorFlow.

use std::time::Duration;

use crate::kernels_support::*;
use crate::support::tensorflow::script_json;
use serde_json::Value;
use tessera::error::Code;
use tessera::graph::registry;
use tessera::graph::{Graph, NodeSpec};
use tessera::runtime::accumulator::{
    ConditionalAccumulator, Reduction, SparseConditionalAccumulator, TakenSlices,
};
use tessera::runtime::resource::ResourceMgr;
use tessera::runtime::wait::Wait;
use tessera::tensor::{DType, PartialShape, Tensor};

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/sparse_accumulator_tf.py"
);

const LONG: Duration = Duration::from_secs(10);

fn dtype_of(name: &str) -> DType {
    match name {
        "float32" => DType::Float,
        "float64" => DType::Double,
        other => panic!("dtype {other}"),
    }
}

fn ints(v: &Value) -> Vec<i64> {
    let a = v.as_array().unwrap_or_else(|| panic!("not an array: {v}"));
    a.iter().map(|x| x.as_i64().unwrap()).collect()
}

fn dims(v: &Value) -> Vec<usize> {
    ints(v).into_iter().map(|d| d as usize).collect()
}

/// Bit patterns as the script prints values (uint32 for float32, uint64 for float64).
fn bits(v: &Value) -> Vec<u64> {
    let a = v.as_array().unwrap_or_else(|| panic!("not an array: {v}"));
    a.iter().map(|x| x.as_u64().unwrap()).collect()
}

/// A float32 or float64 tensor of `dims` holding the values whose bit patterns are `bits`.
fn float_tensor(dtype: DType, dims: &[usize], bits: &[u64]) -> Tensor {
    match dtype {
        DType::Float => {
            let values: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b as u32)).collect();
            f32s(dims, &values)
        }
        _ => f64s(
            dims,
            &bits.iter().map(|&b| f64::from_bits(b)).collect::<Vec<_>>(),
        ),
    }
}

/// A float tensor's values as bit patterns.
fn as_bits(t: &Tensor) -> Vec<u64> {
    match t.dtype() {
        DType::Float => t
            .values::<f32>()
            .unwrap()
            .iter()
            .map(|v| u64::from(v.to_bits()))
            .collect(),
        _ => t
            .values::<f64>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect(),
    }
}

/// The value of bit pattern `bits`, for messages.
fn as_float(dtype: DType, bits: u64) -> f64 {
    match dtype {
        DType::Float => f64::from(f32::from_bits(bits as u32)),
        _ => f64::from_bits(bits),
    }
}

/// The case's declared shape: `null` is an unknown rank, a `null` dimension an unknown one.
fn declared_shape(v: &Value) -> PartialShape {
    match v.as_array() {
        None => PartialShape::unknown(),
        Some(dims) => PartialShape::new(
            dims.iter()
                .map(|d| d.as_u64().map(|d| d as usize))
                .collect::<Vec<_>>(),
        ),
    }
}

/// Replays one of TensorFlow's sequences through tessera's kernels, checking every result.
fn replay(case: &Value) {
    let name = case["name"].as_str().unwrap();
    let dtype = dtype_of(case["dtype"].as_str().unwrap());
    let rm = ResourceMgr::new();
    let handle = node("SparseConditionalAccumulator")
        .name("accum")
        .attr("dtype", value::dtype(dtype))
        .attr("shape", value::shape(&declared_shape(&case["shape"])))
        .attr("shared_name", value::string("accum"))
        .attr(
            "reduction_type",
            value::string(case["reduction"].as_str().unwrap()),
        )
        .run_on(vec![], &rm)
        .unwrap()
        .remove(0);
    assert!(handle.is_ref(), "{name}: the handle is a reference");
    for (k, op) in case["ops"].as_array().unwrap().iter().enumerate() {
        let what = format!("{name}, operation {k} ({op})");
        match op["op"].as_str().unwrap() {
            "apply" => {
                let listed = op["indices"].as_array().unwrap();
                let indices = match listed.first() {
                    Some(Value::Array(_)) => {
                        let rows: Vec<i64> = listed.iter().flat_map(ints).collect();
                        i64s(&[listed.len(), rows.len() / listed.len()], &rows)
                    }
                    _ => i64s(&[listed.len()], &ints(&op["indices"])),
                };
                let values = float_tensor(dtype, &dims(&op["values_shape"]), &bits(&op["values"]));
                let (known, shape) = match op["shape"].as_array() {
                    None => (false, i64s(&[0], &[])),
                    Some(s) => (true, i64s(&[s.len()], &ints(&op["shape"]))),
                };
                let step = i64s(&[], &[op["local_step"].as_i64().unwrap()]);
                let result = node("SparseAccumulatorApplyGradient")
                    .name(&format!("apply_{k}"))
                    .attr("dtype", value::dtype(dtype))
                    .attr("has_known_shape", value::bool(known))
                    .run_on(vec![handle.clone(), step, indices, values, shape], &rm);
                match op["error"].as_str() {
                    None => {
                        result.unwrap_or_else(|e| panic!("{what}: {e}"));
                    }
                    Some(tf_message) => {
                        let e = result.expect_err(&format!("{what}: TensorFlow refused it"));
                        assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e}");
                        assert!(
                            e.message().contains(tf_message),
                            "{what}: tessera says `{}`, TensorFlow `{tf_message}`",
                            e.message()
                        );
                    }
                }
            }
            "take" => {
                let n = op["num_required"].as_i64().unwrap() as i32;
                let out = node("SparseAccumulatorTakeGradient")
                    .name(&format!("take_{k}"))
                    .attr("dtype", value::dtype(dtype))
                    .run_on(vec![handle.clone(), i32s(&[], &[n])], &rm)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(out.len(), 3, "{what}: indices, values, shape");
                assert_eq!(out[0].dtype(), DType::Int64);
                assert_eq!(
                    out[0].values::<i64>().unwrap().to_vec(),
                    ints(&op["indices"]),
                    "{what}: indices"
                );
                assert_eq!(
                    out[1].dims(),
                    dims(&op["values_shape"]),
                    "{what}: values' shape"
                );
                assert_eq!(out[1].dtype(), dtype);
                let (got, want) = (as_bits(&out[1]), bits(&op["values"]));
                assert_eq!(got.len(), want.len(), "{what}: values");
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        g == w,
                        "{what}: value {i}: tessera {}, TensorFlow {}",
                        as_float(dtype, *g),
                        as_float(dtype, *w)
                    );
                }
                assert_eq!(
                    out[2].values::<i64>().unwrap().to_vec(),
                    ints(&op["shape"]),
                    "{what}: dense shape"
                );
            }
            "set_global_step" => {
                let step = i64s(&[], &[op["step"].as_i64().unwrap()]);
                node("AccumulatorSetGlobalStep")
                    .run_on(vec![handle.clone(), step], &rm)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            "num_accumulated" => {
                let n = node("AccumulatorNumAccumulated")
                    .run_on(vec![handle.clone()], &rm)
                    .unwrap_or_else(|e| panic!("{what}: {e}"))
                    .remove(0);
                assert_eq!(
                    i64::from(n.scalar_value::<i32>().unwrap()),
                    op["value"].as_i64().unwrap(),
                    "{what}"
                );
            }
            other => panic!("{what}: unknown operation {other}"),
        }
    }
}

#[test]
fn the_sparse_accumulator_ops_match_tensorflow() {
    let test = "the_sparse_accumulator_ops_match_tensorflow";
    let Some(json) = script_json(test, SCRIPT, &["tensorflow", "numpy"]) else {
        return;
    };
    let cases = json["cases"].as_array().unwrap();
    let (mut takes, mut refusals) = (0, 0);
    for case in cases {
        replay(case);
        for op in case["ops"].as_array().unwrap() {
            takes += usize::from(op["op"] == "take");
            refusals += usize::from(op.get("error").is_some());
        }
    }
    assert!(
        takes >= 10 && refusals >= 7,
        "{takes} takes, {refusals} refusals"
    );
    // The op itself takes only int64 indices (TensorFlow's Python casts int32 ones first, as
    // the SyncReplicasOptimizer does); tessera's graph refuses them too.
    let int32 = &json["int32_indices"];
    assert_eq!(int32["accepted"], false, "{int32}");
    let e = int32_indices_in_a_graph().expect_err("int32 indices are refused");
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    eprintln!(
        "{} sequences ({takes} takes, {refusals} refused gradients) match TensorFlow {}",
        cases.len(),
        json["tensorflow"]
    );
}

/// Adds a `SparseAccumulatorApplyGradient` whose indices are int32.
fn int32_indices_in_a_graph() -> tessera::Result<String> {
    let mut g = Graph::new();
    let shape = PartialShape::new(vec![Some(4), Some(2)]);
    let accum =
        g.sparse_conditional_accumulator("accum", DType::Float, &shape, "a", "MEAN", None)?;
    let step = g.constant(&Tensor::scalar(0i64))?;
    let indices = g.constant(&Tensor::from_vec([1], vec![1i32])?)?;
    let values = g.constant(&Tensor::from_vec([1, 2], vec![1.0f32, 2.0])?)?;
    let dense_shape = g.constant(&Tensor::from_vec([2], vec![4i64, 2])?)?;
    g.add_op(
        NodeSpec::new("SparseAccumulatorApplyGradient")
            .input(&accum)
            .input(&step)
            .input(&indices)
            .input(&values)
            .input(&dense_shape)
            .attr("has_known_shape", value::bool(true)),
    )
}

#[test]
fn the_signatures_are_tensorflows() {
    // Input and output names with their ref-ness, and statefulness, as TensorFlow 2.21's op
    // registry lists them.
    for (op, inputs, outputs, stateful) in [
        (
            "SparseConditionalAccumulator",
            &[][..],
            &["handle*"][..],
            true,
        ),
        (
            "SparseAccumulatorApplyGradient",
            &[
                "handle*",
                "local_step",
                "gradient_indices",
                "gradient_values",
                "gradient_shape",
            ][..],
            &[][..],
            false,
        ),
        (
            "SparseAccumulatorTakeGradient",
            &["handle*", "num_required"][..],
            &["indices", "values", "shape"][..],
            false,
        ),
        (
            "AccumulatorSetGlobalStep",
            &["handle*", "new_global_step"][..],
            &[][..],
            false,
        ),
        (
            "AccumulatorNumAccumulated",
            &["handle*"][..],
            &["num_accumulated"][..],
            false,
        ),
    ] {
        let def = registry::global()
            .get(op)
            .unwrap_or_else(|| panic!("{op} is registered"));
        let names = |args: &[registry::ArgDef]| -> Vec<String> {
            args.iter()
                .map(|a| format!("{}{}", a.name, if a.is_ref { "*" } else { "" }))
                .collect()
        };
        assert_eq!(names(&def.inputs), inputs, "{op} inputs");
        assert_eq!(names(&def.outputs), outputs, "{op} outputs");
        assert_eq!(def.stateful, stateful, "{op} stateful");
    }
}

fn sparse(shape: &[Option<usize>], reduction: Reduction) -> SparseConditionalAccumulator {
    SparseConditionalAccumulator::new(
        "emb:0/grad_accum",
        DType::Float,
        PartialShape::new(shape.to_vec()),
        reduction,
        LONG,
    )
    .unwrap()
}

fn rows(indices: &[i64], values: &[f32]) -> (Tensor, Tensor) {
    let n = indices.len();
    let width = values.len().checked_div(n).unwrap_or(1);
    (i64s(&[n], indices), f32s(&[n, width], values))
}

fn apply(a: &SparseConditionalAccumulator, step: i64, indices: &[i64], values: &[f32]) -> bool {
    let (i, v) = rows(indices, values);
    a.apply(step, &i, &v, None).unwrap()
}

fn taken(t: &TakenSlices) -> (Vec<i64>, Vec<f32>, Vec<i64>) {
    (
        t.indices.values::<i64>().unwrap().to_vec(),
        t.values.values::<f32>().unwrap().to_vec(),
        t.shape.values::<i64>().unwrap().to_vec(),
    )
}

#[test]
fn repeated_rows_add_up_and_mean_divides_each_row_by_the_gradients_that_had_it() {
    let a = sparse(&[Some(10), Some(2)], Reduction::Mean);
    assert!(apply(&a, 0, &[1, 4], &[1.0, 2.0, 10.0, 20.0]));
    assert!(apply(&a, 0, &[4, 7], &[30.0, 40.0, 5.0, 6.0]));
    assert_eq!(a.num_accumulated(), 2);
    // Row 4 came from both gradients: (10+30)/2, (20+40)/2; rows 1 and 7 from one each, so
    // they are divided by 1 (TensorFlow's "average element-wise"), not by 2.
    assert_eq!(
        taken(&a.take(2, &Wait::for_duration(LONG)).unwrap()),
        (
            vec![1, 4, 7],
            vec![1.0, 2.0, 20.0, 30.0, 5.0, 6.0],
            vec![10, 2]
        )
    );
    assert_eq!((a.global_step(), a.num_accumulated()), (1, 0));

    // SUM adds; a repeat within the first gradient stays two entries, as in TensorFlow, and a
    // later gradient's row is added into the first of them.
    let s = sparse(&[None, Some(1)], Reduction::Sum);
    assert!(apply(&s, 0, &[3, 3], &[1.0, 2.0]));
    assert!(apply(&s, 0, &[3], &[4.0]));
    assert_eq!(
        taken(&s.take(2, &Wait::for_duration(LONG)).unwrap()),
        (vec![3, 3], vec![5.0, 2.0], vec![-1, 1])
    );
}

#[test]
fn stale_gradients_are_dropped_and_counted_and_a_take_resets_the_rows() {
    let a = sparse(&[Some(10), Some(1)], Reduction::Mean);
    a.set_global_step(5);
    assert!(!apply(&a, 4, &[0], &[100.0]));
    assert!(apply(&a, 5, &[2], &[1.0]));
    assert!(apply(&a, 6, &[2], &[3.0]));
    assert_eq!(a.dropped(), 1);
    assert_eq!(
        taken(&a.take(2, &Wait::for_duration(LONG)).unwrap()).1,
        vec![2.0]
    );
    assert_eq!(a.global_step(), 6);
    // Step 5 is stale now; the next update starts from no rows.
    assert!(!apply(&a, 5, &[2], &[1.0]));
    assert!(apply(&a, 6, &[9], &[7.0]));
    assert_eq!(
        taken(&a.take(1, &Wait::for_duration(LONG)).unwrap()),
        (vec![9], vec![7.0], vec![10, 1])
    );
    // A stale gradient is dropped before it is checked, as in TensorFlow.
    let (i, v) = rows(&[99], &[1.0]);
    assert!(!a.apply(0, &i, &v, None).unwrap());
    // An accepted one is checked: the row is past the table.
    let e = a.apply(7, &i, &v, None).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains(
            "accumulator `emb:0/grad_accum`: Shape mismatch: index of slice 0 exceeded limits \
             of shape; index is 99 exceeded 10"
        ),
        "{e}"
    );
    assert_eq!(a.num_accumulated(), 0, "a refused gradient is not counted");
}

#[test]
fn a_take_that_waits_too_long_says_how_many_gradients_came_and_who_sent_none() {
    let a = sparse(&[Some(10), Some(1)], Reduction::Mean);
    let (i, v) = rows(&[1], &[1.0]);
    a.apply_from(0, &i, &v, None, Some("/job:worker/task:0"))
        .unwrap();
    a.apply_from(0, &i, &v, None, Some("/job:worker/task:1"))
        .unwrap();
    a.take(2, &Wait::for_duration(LONG)).unwrap();
    a.apply_from(1, &i, &v, None, Some("/job:worker/task:0"))
        .unwrap();
    let started = std::time::Instant::now();
    let e = a
        .take(2, &Wait::for_duration(Duration::from_millis(200)))
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
    assert!(
        e.message().contains(
            "accumulator `emb:0/grad_accum`: 1 of 2 gradients arrived within 200 ms; a replica \
             stopped contributing (stale gradients dropped so far: 0); nothing since the last \
             update from /job:worker/task:1 (last gradient at local step 0)"
        ),
        "{e}"
    );
    // The wait changed nothing: the gradient is still there for the next take.
    assert_eq!((a.num_accumulated(), a.global_step()), (1, 1));
    let e = a.take(0, &Wait::for_duration(LONG)).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
}

#[test]
fn only_float_and_double_gradients_and_int64_indices_are_taken() {
    let e = SparseConditionalAccumulator::new(
        "a",
        DType::Int32,
        PartialShape::unknown(),
        Reduction::Mean,
        LONG,
    )
    .err()
    .expect("int32 is refused");
    assert!(e.message().contains("float or double"), "{e}");
    let a = sparse(&[Some(4), Some(1)], Reduction::Mean);
    let e = a
        .apply(0, &i32s(&[1], &[1]), &f32s(&[1, 1], &[1.0]), None)
        .unwrap_err();
    assert!(e.message().contains("indices must be int64"), "{e}");
    let e = a
        .apply(0, &i64s(&[1], &[1]), &f64s(&[1, 1], &[1.0]), None)
        .unwrap_err();
    assert!(
        e.message()
            .contains("holds float32 gradients, got float64 values"),
        "{e}"
    );
}

#[test]
fn the_shared_step_ops_reach_either_kind_of_accumulator() {
    // AccumulatorSetGlobalStep / AccumulatorNumAccumulated (and their Resource forms) find a
    // sparse accumulator by its reference handle and a dense one by its resource handle.
    let rm = ResourceMgr::new();
    let sparse_handle = node("SparseConditionalAccumulator")
        .attr("dtype", value::dtype(DType::Float))
        .attr("shape", value::shape(&PartialShape::unknown()))
        .attr("shared_name", value::string("s"))
        .run_on(vec![], &rm)
        .unwrap()
        .remove(0);
    let dense_handle = node("ResourceConditionalAccumulator")
        .attr("dtype", value::dtype(DType::Float))
        .attr("shape", value::shape(&PartialShape::unknown()))
        .attr("shared_name", value::string("d"))
        .run_on(vec![], &rm)
        .unwrap()
        .remove(0);
    for (op, handle, step) in [
        ("AccumulatorSetGlobalStep", &sparse_handle, 7),
        ("ResourceAccumulatorSetGlobalStep", &dense_handle, 9),
    ] {
        node(op)
            .run_on(vec![handle.clone(), i64s(&[], &[step])], &rm)
            .unwrap();
    }
    let s = rm.lookup::<SparseConditionalAccumulator>("", "s").unwrap();
    let d = rm.lookup::<ConditionalAccumulator>("", "d").unwrap();
    assert_eq!((s.global_step(), d.global_step()), (7, 9));
    let (i, v) = rows(&[0], &[1.0]);
    s.apply(7, &i, &v, None).unwrap();
    let n = node("AccumulatorNumAccumulated")
        .run_on(vec![sparse_handle.clone()], &rm)
        .unwrap()
        .remove(0);
    assert_eq!(n.scalar_value::<i32>().unwrap(), 1);
    // A handle to nothing names the ops that create accumulators.
    let missing = Tensor::from_strings([2], vec!["".into(), "nope".into()]).unwrap();
    let e = node("AccumulatorNumAccumulated")
        .run_on(vec![missing], &rm)
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
    assert!(e.message().contains("SparseConditionalAccumulator"), "{e}");
}
