//! The sparse optimizer updates, `SparseApplyX` on reference variables and
//! `ResourceSparseApplyX` on resource variables, against stock TensorFlow 2.21:
//! `tests/kernels_sparse_apply_tf.py` runs every rule (and its attr variants) in both forms for
//! three steps on seeded inputs whose indices repeat and come out of order, on 1-D, 2-D and 3-D
//! variables in float32 and float64 with int32 and int64 indices, live (skipped without
//! TensorFlow, a failure under CI); tessera runs the same inputs and every value of the
//! variable and of each slot must agree. The dense `ApplyAdagradDA`, whose rule the sparse
//! AdagradDA shares, is checked the same way. TensorFlow's errors for bad indices and shapes,
//! and the op signatures, need no TensorFlow.
//!
//! Values agree to 1e-12 (float64) or 2e-5 (float32) of their magnitude (at least 1):
//! TensorFlow's kernels write some formulas in another but equal order (`rsqrt` for `1 /
//! sqrt`, `ms * rho + g^2 * (1 - rho)` for `ms + (g^2 - ms) * (1 - rho)`).

use std::process::Command;
use std::sync::Arc;

use crate::kernels_support::*;
use crate::support::cluster::Cluster;
use crate::support::tensorflow::{python_with, Client};
use serde_json::Value;
use tessera::client::Session;
use tessera::device::DeviceType;
use tessera::error::Code;
use tessera::graph::registry;
use tessera::graph::{Graph, NodeSpec, VariableKind};
use tessera::kernels::{create_kernel, OpContext};
use tessera::runtime::resource::ResourceMgr;
use tessera::tensor::{DType, PartialShape, ResourceHandle, Shape, Tensor, Var};

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/kernels_sparse_apply_tf.py"
);

/// The rules with a sparse form, as TensorFlow names them after `SparseApply`.
const RULES: [&str; 11] = [
    "ProximalGradientDescent",
    "Adadelta",
    "Adagrad",
    "AdagradV2",
    "AdagradDA",
    "ProximalAdagrad",
    "Ftrl",
    "FtrlV2",
    "Momentum",
    "RMSProp",
    "CenteredRMSProp",
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Form {
    Ref,
    Resource,
}

fn floats(v: &Value) -> Vec<f64> {
    let a = v.as_array().unwrap_or_else(|| panic!("not an array: {v}"));
    a.iter().map(|x| x.as_f64().unwrap()).collect()
}

fn dims(v: &Value) -> Vec<usize> {
    let a = v.as_array().unwrap_or_else(|| panic!("not an array: {v}"));
    a.iter().map(|x| x.as_u64().unwrap() as usize).collect()
}

fn dtype_of(name: &str) -> DType {
    match name {
        "float32" => DType::Float,
        "float64" => DType::Double,
        "int32" => DType::Int32,
        "int64" => DType::Int64,
        other => panic!("dtype {other}"),
    }
}

/// A float32 or float64 tensor of `dims` holding `values`.
fn float_tensor(dtype: DType, dims: &[usize], values: &[f64]) -> Tensor {
    match dtype {
        DType::Float => f32s(dims, &values.iter().map(|&v| v as f32).collect::<Vec<_>>()),
        _ => f64s(dims, values),
    }
}

/// A 1-D int32 or int64 tensor of indices.
fn index_tensor(dtype: DType, values: &[i64]) -> Tensor {
    match dtype {
        DType::Int32 => i32s(
            &[values.len()],
            &values.iter().map(|&v| v as i32).collect::<Vec<_>>(),
        ),
        _ => i64s(&[values.len()], values),
    }
}

/// A handle to variable `name` of this test's device.
fn handle(name: &str) -> Tensor {
    Tensor::resource(ResourceHandle {
        device: DEVICE.into(),
        container: String::new(),
        name: name.into(),
        type_name: "Var".into(),
    })
}

/// Creates variable `name` in `rm` holding `value` and returns it.
fn new_var(rm: &ResourceMgr, name: &str, value: Tensor) -> Arc<Var> {
    let var: Arc<Var> = rm
        .lookup_or_create("", name, || {
            Ok(Var::new(value.dtype(), PartialShape::from(value.shape())))
        })
        .unwrap();
    *var.write() = Some(value);
    var
}

/// The op of `rule` in `form`, sparse or dense.
fn op_name(rule: &str, form: Form, sparse: bool) -> String {
    let sparse = if sparse { "Sparse" } else { "" };
    match form {
        Form::Ref => format!("{sparse}Apply{rule}"),
        Form::Resource => format!("Resource{sparse}Apply{rule}"),
    }
}

/// Runs one TensorFlow case in `form`: returns the values of the variable and its slots after
/// the case's steps.
fn run_case(case: &Value, form: Form, use_locking: bool) -> Vec<Vec<f64>> {
    let rule = case["rule"].as_str().unwrap();
    let sparse = case["sparse"].as_bool().unwrap();
    let op = op_name(rule, form, sparse);
    let def = registry::global()
        .get(&op)
        .unwrap_or_else(|| panic!("{op} is registered"));
    let dtype = dtype_of(case["dtype"].as_str().unwrap());
    let shape = dims(&case["shape"]);
    let rm = ResourceMgr::new();
    let names: Vec<String> = std::iter::once("var".to_string())
        .chain(
            case["slots"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| format!("var/{}", s.as_str().unwrap())),
        )
        .collect();
    let vars: Vec<Arc<Var>> = case["start"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&names)
        .map(|(v, name)| new_var(&rm, name, float_tensor(dtype, &shape, &floats(v))))
        .collect();
    let mut node = node(&op)
        .name("update")
        .t(dtype)
        .attr("use_locking", value::bool(use_locking));
    if sparse {
        let index_dtype = dtype_of(case["index_dtype"].as_str().unwrap());
        node = node.attr("Tindices", value::dtype(index_dtype));
    }
    for (k, v) in case["attrs"].as_object().unwrap() {
        node = node.attr(k, value::bool(v.as_bool().unwrap()));
    }
    let node = node.build();
    let kernel = create_kernel(&node, DeviceType::Cpu).unwrap();
    for (k, step) in case["steps"].as_array().unwrap().iter().enumerate() {
        let inputs: Vec<Tensor> = def
            .inputs
            .iter()
            .enumerate()
            .map(|(i, arg)| {
                if i < vars.len() {
                    return match form {
                        Form::Ref => Tensor::reference(vars[i].clone(), names[i].as_str()),
                        Form::Resource => handle(&names[i]),
                    };
                }
                match arg.name.as_str() {
                    "grad" => {
                        let g = floats(&step["grad"]);
                        let mut d = shape.clone();
                        d[0] = g.len() / shape[1..].iter().product::<usize>();
                        float_tensor(dtype, &d, &g)
                    }
                    "indices" => {
                        let idx: Vec<i64> = step["indices"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|v| v.as_i64().unwrap())
                            .collect();
                        index_tensor(dtype_of(case["index_dtype"].as_str().unwrap()), &idx)
                    }
                    "global_step" => i64s(
                        &[],
                        &[case["params"]["global_step"].as_f64().unwrap() as i64],
                    ),
                    name => {
                        let v = case["params"][name]
                            .as_f64()
                            .unwrap_or_else(|| panic!("{op}: no value for input {name}"));
                        float_tensor(dtype, &[], &[v])
                    }
                }
            })
            .collect();
        let mut ctx = OpContext::new(&node, inputs, &rm, DEVICE, k as i64 + 1);
        kernel
            .compute(&mut ctx)
            .unwrap_or_else(|e| panic!("{op} step {}: {e}", k + 1));
        let outputs = ctx.take_outputs();
        match form {
            Form::Ref => {
                let out = outputs[0]
                    .as_ref()
                    .expect("the ref form outputs the var's ref");
                let (var, name) = out.referenced().expect("a reference");
                assert!(
                    Arc::ptr_eq(var, &vars[0]),
                    "{op}: output 0 is the var's ref"
                );
                assert_eq!(name, "var");
            }
            Form::Resource => assert!(outputs.is_empty(), "{op} has no outputs"),
        }
    }
    vars.iter()
        .map(|v| {
            let t = v.snapshot().unwrap();
            assert_eq!(
                t.dims(),
                shape.as_slice(),
                "{op}: the variable keeps its shape"
            );
            as_f64s(&t)
        })
        .collect()
}

fn describe(case: &Value) -> String {
    format!(
        "{} {} {} shape {} indices {} attrs {}",
        if case["sparse"].as_bool().unwrap() {
            "sparse"
        } else {
            "dense"
        },
        case["rule"].as_str().unwrap(),
        case["dtype"].as_str().unwrap(),
        case["shape"],
        case["index_dtype"],
        case["attrs"]
    )
}

fn assert_matches(case: &Value, got: &[Vec<f64>], want: &Value, what: &str) {
    let tol = if case["dtype"] == "float32" {
        2e-5
    } else {
        1e-12
    };
    let slots = case["slots"].as_array().unwrap();
    for (v, (got, want)) in got.iter().zip(want.as_array().unwrap()).enumerate() {
        let name = if v == 0 {
            "var".to_string()
        } else {
            slots[v - 1].as_str().unwrap().to_string()
        };
        let want = floats(want);
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= tol * w.abs().max(1.0),
                "{} ({what}): {name} element {i}: tessera {g}, TensorFlow {w}",
                describe(case)
            );
        }
    }
}

#[test]
fn every_sparse_update_matches_tensorflow_in_both_forms() {
    let test = "every_sparse_update_matches_tensorflow_in_both_forms";
    let Some(python) = python_with(test, &["tensorflow", "numpy"]) else {
        return;
    };
    let mut command = Command::new(python);
    command.arg(SCRIPT).arg("kernels");
    let json = Client::spawn(command).finish_quietly().json;
    let cases = json["cases"].as_array().unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for case in cases {
        for (form, want) in [(Form::Ref, "ref"), (Form::Resource, "resource")] {
            let got = run_case(case, form, false);
            assert_matches(case, &got, &case[want], &format!("{form:?} form"));
            let locked = run_case(case, form, true);
            assert_eq!(
                got,
                locked,
                "{}: use_locking changes the numbers",
                describe(case)
            );
            seen.insert(op_name(
                case["rule"].as_str().unwrap(),
                form,
                case["sparse"].as_bool().unwrap(),
            ));
        }
    }
    for rule in RULES {
        for form in [Form::Ref, Form::Resource] {
            let op = op_name(rule, form, true);
            assert!(
                seen.contains(&op),
                "{op} was not checked against TensorFlow"
            );
        }
    }
    eprintln!(
        "{} cases (each in both forms, locked and not) match TensorFlow {}",
        cases.len(),
        json["tensorflow"]
    );
}

#[test]
fn a_tensorflow_client_runs_every_sparse_update_on_a_tessera_ps() {
    let test = "a_tensorflow_client_runs_every_sparse_update_on_a_tessera_ps";
    let Some(python) = python_with(test, &["tensorflow", "numpy"]) else {
        return;
    };
    let cluster = Cluster::start(&[("ps", 1), ("worker", 1)]);
    let mut command = Command::new(python);
    command.arg(SCRIPT).arg("cluster");
    command.args(["--ps", &cluster.addr("ps", 0).to_string()]);
    command.args(["--worker", &cluster.addr("worker", 0).to_string()]);
    command.stdin(std::process::Stdio::null());
    let json = Client::spawn(command).finish_quietly().json;
    let cases = json["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 2 * RULES.len(), "every rule in both forms");
    for case in cases {
        let op = case["op"].as_str().unwrap();
        for device in case["devices"].as_array().unwrap() {
            assert_eq!(
                device, "/job:ps/task:0",
                "{op}: the variables live on the ps"
            );
        }
        let (local, remote) = (
            case["local"].as_array().unwrap(),
            case["remote"].as_array().unwrap(),
        );
        assert_eq!(local.len(), remote.len(), "{op}");
        for (v, (want, got)) in local.iter().zip(remote).enumerate() {
            for (i, (w, g)) in floats(want).iter().zip(floats(got)).enumerate() {
                assert!(
                    (g - w).abs() <= 2e-5 * w.abs().max(1.0),
                    "{op}: variable {v} element {i}: on tessera {g}, in TensorFlow {w}"
                );
            }
        }
    }
    eprintln!(
        "{} sparse updates from a TensorFlow {} client on a tessera ps match TensorFlow alone",
        cases.len(),
        json["tensorflow"]
    );
}

// ---------------------------------------------------------------------------------------------
// Without TensorFlow: signatures, duplicate indices, errors
// ---------------------------------------------------------------------------------------------

#[test]
fn the_signatures_are_tensorflows() {
    // Input names and ref-ness in order, as TensorFlow 2.21's op registry lists them.
    for (op, inputs) in [
        (
            "SparseApplyAdagrad",
            &["var", "accum", "lr", "grad", "indices"][..],
        ),
        (
            "ResourceSparseApplyAdagradDA",
            &[
                "var",
                "gradient_accumulator",
                "gradient_squared_accumulator",
                "grad",
                "indices",
                "lr",
                "l1",
                "l2",
                "global_step",
            ],
        ),
        (
            "SparseApplyFtrlV2",
            &[
                "var",
                "accum",
                "linear",
                "grad",
                "indices",
                "lr",
                "l1",
                "l2",
                "l2_shrinkage",
                "lr_power",
            ],
        ),
        (
            "ResourceSparseApplyMomentum",
            &["var", "accum", "lr", "grad", "indices", "momentum"],
        ),
        (
            "SparseApplyProximalGradientDescent",
            &["var", "alpha", "l1", "l2", "grad", "indices"],
        ),
        (
            "SparseApplyCenteredRMSProp",
            &[
                "var", "mg", "ms", "mom", "lr", "rho", "momentum", "epsilon", "grad", "indices",
            ],
        ),
        (
            "ApplyAdagradDA",
            &[
                "var",
                "gradient_accumulator",
                "gradient_squared_accumulator",
                "grad",
                "lr",
                "l1",
                "l2",
                "global_step",
            ],
        ),
    ] {
        let def = registry::global().get(op).unwrap();
        let names: Vec<&str> = def.inputs.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, inputs, "{op}");
    }
    for rule in RULES {
        for form in [Form::Ref, Form::Resource] {
            let op = op_name(rule, form, true);
            let def = registry::global()
                .get(&op)
                .unwrap_or_else(|| panic!("{op} is registered"));
            let mut n = node(&op)
                .t(DType::Float)
                .attr("Tindices", value::dtype(DType::Int64))
                .build();
            def.fill_and_check_attrs(&mut n).unwrap();
            let refs = def.ref_inputs(&n).unwrap();
            let slots = refs.iter().take_while(|&&r| r).count();
            match form {
                Form::Ref => {
                    assert!(slots >= 1, "{op}: var is a reference");
                    assert_eq!(def.ref_outputs(&n).unwrap(), vec![true], "{op}");
                    assert!(!def.stateful, "{op}: TensorFlow's ref form is not stateful");
                }
                Form::Resource => {
                    assert!(refs.iter().all(|r| !r), "{op}");
                    assert!(def.outputs.is_empty(), "{op}");
                    assert!(def.stateful, "{op}");
                }
            }
            assert!(
                !tessera::graph::attr::bool_or(&n, "use_locking", true).unwrap(),
                "{op}: use_locking defaults to false"
            );
            assert!(
                create_kernel(&n, DeviceType::Cpu).is_ok(),
                "{op} has a CPU kernel"
            );
        }
    }
    for (op, flag, default) in [
        ("SparseApplyAdagrad", "update_slots", true),
        ("ResourceSparseApplyAdagradV2", "update_slots", true),
        ("SparseApplyMomentum", "use_nesterov", false),
        ("ResourceSparseApplyFtrl", "multiply_linear_by_lr", false),
    ] {
        let mut n = node(op)
            .t(DType::Float)
            .attr("Tindices", value::dtype(DType::Int32))
            .build();
        registry::global()
            .get(op)
            .unwrap()
            .fill_and_check_attrs(&mut n)
            .unwrap();
        assert_eq!(
            tessera::graph::attr::bool_or(&n, flag, !default).unwrap(),
            default,
            "{op}: {flag}"
        );
    }
    for op in [
        "SparseApplyGradientDescent",
        "ResourceSparseApplyAdam",
        "SparseApplyAdaMax",
    ] {
        assert!(
            registry::global().get(op).is_none(),
            "TensorFlow has no {op}"
        );
    }
}

/// A resource-form Adagrad on a fresh `w` [4, 2] (rows 0..4 hold 1, 2, 3, 4) and its accum
/// (0.5 everywhere): runs one update with `grad` and `indices`.
fn adagrad(
    rm: &ResourceMgr,
    grad: Tensor,
    indices: Tensor,
    attrs: &[(&str, bool)],
) -> tessera::Result<Vec<Tensor>> {
    let index_dtype = indices.dtype();
    let mut n = node("ResourceSparseApplyAdagrad")
        .name("adagrad")
        .t(DType::Float)
        .attr("Tindices", value::dtype(index_dtype));
    for &(k, v) in attrs {
        n = n.attr(k, value::bool(v));
    }
    n.run_on(
        vec![
            handle("w"),
            handle("w/accum"),
            f32s(&[], &[0.1]),
            grad,
            indices,
        ],
        rm,
    )
}

fn adagrad_vars(rm: &ResourceMgr) -> (Arc<Var>, Arc<Var>) {
    (
        new_var(
            rm,
            "w",
            f32s(&[4, 2], &[1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]),
        ),
        new_var(rm, "w/accum", f32s(&[4, 2], &[0.5; 8])),
    )
}

#[test]
fn repeated_indices_apply_in_order_and_other_rows_stay() {
    let rm = ResourceMgr::new();
    let (w, accum) = adagrad_vars(&rm);
    adagrad(
        &rm,
        f32s(&[3, 2], &[1.0, 2.0, 0.5, 0.5, 3.0, 1.0]),
        i64s(&[3], &[2, 0, 2]),
        &[],
    )
    .unwrap();
    // Row 2 sees grad [1, 2], then [3, 1]; row 0 grad [0.5, 0.5]; rows 1 and 3 stay.
    let mut want_w = vec![1.0f64, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0];
    let mut want_a = vec![0.5f64; 8];
    for (row, g) in [(2, [1.0, 2.0]), (0, [0.5, 0.5]), (2, [3.0, 1.0])] {
        for (j, g) in g.iter().enumerate() {
            let e = row * 2 + j;
            want_a[e] += g * g;
            want_w[e] -= 0.1 * g / want_a[e].sqrt();
        }
    }
    assert_f32(&w.snapshot().unwrap(), &[4, 2], &want_w, 1e-6);
    assert_f32(&accum.snapshot().unwrap(), &[4, 2], &want_a, 1e-6);
    // update_slots = false: accum stays, var moves by lr * g / sqrt(accum).
    let before = as_f64s(&w.snapshot().unwrap());
    adagrad(
        &rm,
        f32s(&[1, 2], &[1.0, -1.0]),
        i32s(&[1], &[3]),
        &[("update_slots", false)],
    )
    .unwrap();
    let mut want = before.clone();
    want[6] -= 0.1 / 0.5f64.sqrt();
    want[7] += 0.1 / 0.5f64.sqrt();
    assert_f32(&w.snapshot().unwrap(), &[4, 2], &want, 1e-5);
    assert_f32(&accum.snapshot().unwrap(), &[4, 2], &want_a, 0.0);
    // No indices: nothing changes.
    let before = as_f64s(&w.snapshot().unwrap());
    adagrad(&rm, f32s(&[0, 2], &[]), i64s(&[0], &[]), &[]).unwrap();
    assert_eq!(as_f64s(&w.snapshot().unwrap()), before);
}

#[test]
fn bad_indices_and_shapes_give_tensorflows_errors_and_change_nothing() {
    let rm = ResourceMgr::new();
    let (w, accum) = adagrad_vars(&rm);
    let ones = |rows: usize, cols: usize| f32s(&[rows, cols], &vec![1.0; rows * cols]);
    for (grad, indices, needle) in [
        (
            ones(2, 2),
            i64s(&[2], &[0, 4]),
            "Index 4 at offset 1 in indices is out of range",
        ),
        (
            ones(2, 2),
            i32s(&[2], &[-1, 0]),
            "Index -1 at offset 0 in indices is out of range",
        ),
        (
            ones(1, 2),
            i64s(&[1, 1], &[0]),
            "indices must be one-dimensional",
        ),
        (
            f32s(&[2], &[1.0, 1.0]),
            i64s(&[2], &[0, 1]),
            "grad must have the same number of dimensions as var",
        ),
        (
            ones(2, 3),
            i64s(&[2], &[0, 1]),
            "var and grad must match in dimension 1",
        ),
        (
            ones(3, 2),
            i64s(&[2], &[0, 1]),
            "grad must be the same size as indices in the first dimension.",
        ),
    ] {
        let err = adagrad(&rm, grad, indices, &[]).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(err.message().contains(needle), "`{needle}` not in: {err}");
        assert!(err.message().contains("node `adagrad`"), "{err}");
    }
    // The in-range index before the bad one did not move its row either.
    assert_f32(
        &w.snapshot().unwrap(),
        &[4, 2],
        &[1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0],
        0.0,
    );
    assert_f32(&accum.snapshot().unwrap(), &[4, 2], &[0.5; 8], 0.0);
    // A grad of another dtype, and a non-scalar lr.
    let err = adagrad(&rm, f64s(&[1, 2], &[1.0, 1.0]), i64s(&[1], &[0]), &[]).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    let err = node("ResourceSparseApplyAdagrad")
        .t(DType::Float)
        .attr("Tindices", value::dtype(DType::Int64))
        .run_on(
            vec![
                handle("w"),
                handle("w/accum"),
                f32s(&[2], &[0.1, 0.1]),
                ones(1, 2),
                i64s(&[1], &[0]),
            ],
            &rm,
        )
        .unwrap_err();
    assert!(err.message().contains("lr is not a scalar: [2]"), "{err}");
    // A slot of another shape.
    new_var(&rm, "w/short", f32s(&[2], &[0.5, 0.5]));
    let err = node("ResourceSparseApplyAdagrad")
        .t(DType::Float)
        .attr("Tindices", value::dtype(DType::Int64))
        .run_on(
            vec![
                handle("w"),
                handle("w/short"),
                f32s(&[], &[0.1]),
                ones(1, 2),
                i64s(&[1], &[0]),
            ],
            &rm,
        )
        .unwrap_err();
    assert!(
        err.message()
            .contains("var and accum do not have the same shape[4,2] [2]"),
        "{err}"
    );
}

#[test]
fn scalars_and_empty_rows_are_refused_where_tensorflow_refuses_them() {
    let rm = ResourceMgr::new();
    new_var(&rm, "s", f32s(&[], &[1.0]));
    new_var(&rm, "s/accum", f32s(&[], &[1.0]));
    let err = node("ResourceSparseApplyAdagrad")
        .t(DType::Float)
        .attr("Tindices", value::dtype(DType::Int64))
        .run_on(
            vec![
                handle("s"),
                handle("s/accum"),
                f32s(&[], &[0.1]),
                f32s(&[1], &[1.0]),
                i64s(&[1], &[0]),
            ],
            &rm,
        )
        .unwrap_err();
    assert!(
        err.message().contains("var must be at least 1 dimensional"),
        "{err}"
    );
    // Rows of no elements: Adagrad refuses them, Momentum (as in TensorFlow) does nothing.
    new_var(&rm, "e", f32s(&[2, 0], &[]));
    new_var(&rm, "e/accum", f32s(&[2, 0], &[]));
    let inputs = |lr_first: bool| {
        let mut v = vec![handle("e"), handle("e/accum")];
        if lr_first {
            v.extend([f32s(&[], &[0.1]), f32s(&[1, 0], &[]), i64s(&[1], &[0])]);
        } else {
            v.extend([
                f32s(&[], &[0.1]),
                f32s(&[1, 0], &[]),
                i64s(&[1], &[0]),
                f32s(&[], &[0.9]),
            ]);
        }
        v
    };
    let err = node("ResourceSparseApplyAdagrad")
        .t(DType::Float)
        .attr("Tindices", value::dtype(DType::Int64))
        .run_on(inputs(true), &rm)
        .unwrap_err();
    assert!(
        err.message()
            .contains("Inner dimension should be greater than zero."),
        "{err}"
    );
    node("ResourceSparseApplyMomentum")
        .t(DType::Float)
        .attr("Tindices", value::dtype(DType::Int64))
        .run_on(inputs(false), &rm)
        .unwrap();
}

#[test]
fn ftrl_and_proximal_adagrad_check_their_hyper_parameters() {
    let rm = ResourceMgr::new();
    for name in ["w", "w/accum", "w/linear"] {
        new_var(&rm, name, f32s(&[2, 1], &[0.5, 0.5]));
    }
    let ftrl = |lr: f32, l1: f32, l2: f32, shrinkage: f32, lr_power: f32, by_lr: bool| {
        node("ResourceSparseApplyFtrlV2")
            .t(DType::Float)
            .attr("Tindices", value::dtype(DType::Int32))
            .attr("multiply_linear_by_lr", value::bool(by_lr))
            .run_on(
                vec![
                    handle("w"),
                    handle("w/accum"),
                    handle("w/linear"),
                    f32s(&[1, 1], &[1.0]),
                    i32s(&[1], &[1]),
                    f32s(&[], &[lr]),
                    f32s(&[], &[l1]),
                    f32s(&[], &[l2]),
                    f32s(&[], &[shrinkage]),
                    f32s(&[], &[lr_power]),
                ],
                &rm,
            )
    };
    for (args, needle) in [
        (
            (0.0, 0.0, 0.0, 0.0, -0.5, false),
            "lr is not a positive scalar (or zero if multiply_linear_by_lr is set)",
        ),
        (
            (0.1, -1.0, 0.0, 0.0, -0.5, false),
            "l1 regularization strength is not a non-negative scalar",
        ),
        (
            (0.1, 0.0, -1.0, 0.0, -0.5, false),
            "l2 regularization strength is not a non-negative scalar",
        ),
        (
            (0.1, 0.0, 0.0, -1.0, -0.5, false),
            "l2 shrinkage regularization strength is not a non-negative scalar",
        ),
        (
            (0.1, 0.0, 0.0, 0.0, 0.5, false),
            "lr_power is not a non-positive scalar",
        ),
    ] {
        let (lr, l1, l2, s, p, by_lr) = args;
        let err = ftrl(lr, l1, l2, s, p, by_lr).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(err.message().contains(needle), "`{needle}` not in: {err}");
    }
    // A zero rate is allowed when linear is multiplied by it.
    ftrl(0.0, 0.0, 0.0, 0.0, -0.5, true).unwrap();
    let err = node("ResourceSparseApplyProximalAdagrad")
        .t(DType::Float)
        .attr("Tindices", value::dtype(DType::Int32))
        .run_on(
            vec![
                handle("w"),
                handle("w/accum"),
                f32s(&[], &[0.0]),
                f32s(&[], &[0.0]),
                f32s(&[], &[0.0]),
                f32s(&[1, 1], &[1.0]),
                i32s(&[1], &[1]),
            ],
            &rm,
        )
        .unwrap_err();
    assert!(
        err.message().contains("lr is not a positive scalar"),
        "{err}"
    );
}

#[test]
fn uninitialized_slots_and_reference_inputs_are_named() {
    let rm = ResourceMgr::new();
    let w = new_var(&rm, "w", f32s(&[2, 1], &[0.5, 0.5]));
    let accum: Arc<Var> = rm
        .lookup_or_create("", "w/accum", || {
            Ok(Var::new(
                DType::Float,
                PartialShape::from(&Shape::new(vec![2, 1])),
            ))
        })
        .unwrap();
    let err = node("SparseApplyMomentum")
        .name("momentum")
        .t(DType::Float)
        .attr("Tindices", value::dtype(DType::Int32))
        .run_on(
            vec![
                Tensor::reference(w.clone(), "w"),
                Tensor::reference(accum, "w/accum"),
                f32s(&[], &[0.1]),
                f32s(&[1, 1], &[1.0]),
                i32s(&[1], &[0]),
                f32s(&[], &[0.9]),
            ],
            &rm,
        )
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(
        err.message()
            .contains("Attempting to use uninitialized value w/accum"),
        "{err}"
    );
    assert_f32(&w.snapshot().unwrap(), &[2, 1], &[0.5, 0.5], 0.0);
}

#[test]
fn shape_functions_check_sparse_updates_as_they_are_built() {
    let mut g = Graph::new();
    let var = |g: &mut Graph, name: &str, dims: &[usize]| {
        g.add1(
            NodeSpec::new("VariableV2")
                .name(name)
                .attr("dtype", value::dtype(DType::Float))
                .attr(
                    "shape",
                    value::shape(&PartialShape::from(Shape::new(dims.to_vec()))),
                ),
        )
        .unwrap()
    };
    let w = var(&mut g, "w", &[10, 4]);
    let accum = var(&mut g, "accum", &[10, 4]);
    let lr = g.scalar("lr", DType::Float, 0.1).unwrap();
    let idx = g.const_vec_i32("idx", &[0, 3, 3]).unwrap();
    let grad = |g: &mut Graph, name: &str, dims: Vec<Option<usize>>| {
        g.placeholder(name, DType::Float, PartialShape::new(dims))
            .unwrap()
    };
    let rows = grad(&mut g, "rows", vec![None, Some(4)]);
    let out = g
        .add1(
            NodeSpec::new("SparseApplyAdagrad")
                .input(&w)
                .input(&accum)
                .input(&lr)
                .input(&rows)
                .input(&idx),
        )
        .unwrap();
    assert_eq!(out.shape, PartialShape::new(vec![Some(10), Some(4)]));
    for (name, dims, needle) in [
        (
            "narrow",
            vec![Some(3), Some(5)],
            "grad's dimensions after the first must be the variable's",
        ),
        (
            "long",
            vec![Some(4), Some(4)],
            "grad must be the same size as indices in the first dimension",
        ),
    ] {
        let bad = grad(&mut g, name, dims);
        let err = g
            .add1(
                NodeSpec::new("SparseApplyAdagrad")
                    .input(&w)
                    .input(&accum)
                    .input(&lr)
                    .input(&bad)
                    .input(&idx),
            )
            .unwrap_err();
        assert!(err.message().contains(needle), "`{needle}` not in: {err}");
    }
    let err = g
        .add1(
            NodeSpec::new("SparseApplyAdagrad")
                .input(&w)
                .input(&accum)
                .input(&rows)
                .input(&rows)
                .input(&idx),
        )
        .unwrap_err();
    assert!(err.message().contains("lr is not a scalar"), "{err}");
}

#[test]
fn a_sparse_update_writes_its_rows_in_place_even_without_use_locking() {
    // A 100,000 x 8 table: a lock-free update that copied the table would copy 3.2 MB per
    // step; the sparse update writes its rows where they lie.
    let rm = ResourceMgr::new();
    let rows = 100_000;
    let table = new_var(&rm, "table", f32s(&[rows, 8], &vec![1.0; rows * 8]));
    new_var(&rm, "table/accum", f32s(&[rows, 8], &vec![0.5; rows * 8]));
    let address = || table.read().as_ref().unwrap().bytes().unwrap().as_ptr() as usize;
    let update = node("ResourceSparseApplyAdagrad")
        .t(DType::Float)
        .attr("Tindices", value::dtype(DType::Int64))
        .attr("use_locking", value::bool(false))
        .build();
    let step = |index: i64| {
        run_with(
            &update,
            vec![
                handle("table"),
                handle("table/accum"),
                f32s(&[], &[0.1]),
                f32s(&[1, 8], &[1.0; 8]),
                i64s(&[1], &[index]),
            ],
            &rm,
        )
        .unwrap()
    };
    // The first update may copy the buffer the test's tensor shared; then it stays put.
    step(0);
    let before = address();
    step(7);
    step(rows as i64 - 1);
    assert_eq!(address(), before, "updated in place");
    // A reader's snapshot keeps its values; the update writes a new buffer.
    let snapshot = table.snapshot().unwrap();
    step(7);
    let old = snapshot.values::<f32>().unwrap();
    let new = table.snapshot().unwrap();
    let new = new.values::<f32>().unwrap();
    assert!(
        old[7 * 8] > new[7 * 8],
        "the row moved in the variable only"
    );
    assert_eq!(old[6 * 8], new[6 * 8], "other rows stay");
}

#[test]
fn a_session_runs_both_forms_and_moves_only_the_named_rows() {
    for kind in [VariableKind::Resource, VariableKind::Reference] {
        let mut g = Graph::new();
        let start = g
            .constant(&f32s(&[4, 2], &[1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]))
            .unwrap();
        let w = g.variable_with_kind("w", &start, kind).unwrap();
        let zeros = g.constant(&f32s(&[4, 2], &[0.0; 8])).unwrap();
        let accum = g.variable_with_kind("accum", &zeros, kind).unwrap();
        let lr = g.scalar("lr", DType::Float, 0.5).unwrap();
        let grad = g
            .placeholder("grad", DType::Float, PartialShape::new(vec![None, Some(2)]))
            .unwrap();
        let indices = g
            .placeholder("indices", DType::Int32, PartialShape::new(vec![None]))
            .unwrap();
        let op = match kind {
            VariableKind::Resource => "ResourceSparseApplyMomentum",
            VariableKind::Reference => "SparseApplyMomentum",
        };
        let momentum = g.scalar("momentum", DType::Float, 0.9).unwrap();
        let update = g
            .add_op(
                NodeSpec::new(op)
                    .name("update")
                    .input(&w.handle)
                    .input(&accum.handle)
                    .input(&lr)
                    .input(&grad)
                    .input(&indices)
                    .input(&momentum),
            )
            .unwrap();
        let read = match kind {
            VariableKind::Resource => g
                .add1(
                    NodeSpec::new("ReadVariableOp")
                        .name("w/after")
                        .input(&w.handle)
                        .attr("dtype", value::dtype(DType::Float)),
                )
                .unwrap()
                .name(),
            VariableKind::Reference => w.value.name(),
        };
        let init = g.global_variables_initializer().unwrap();
        let sess = Session::local();
        sess.extend(&g.to_graph_def()).unwrap();
        sess.run(&[], &[], &[&init]).unwrap();
        let feeds = [
            ("grad:0", f32s(&[3, 2], &[1.0, 1.0, 1.0, 1.0, 2.0, -2.0])),
            ("indices:0", i32s(&[3], &[3, 3, 0])),
        ];
        sess.run(&feeds, &[], &[&update]).unwrap();
        let after = sess.run(&[], &[&read], &[]).unwrap().remove(0);
        // Row 3: accum 1, then 1.9; var 4 - 0.5 - 0.95. Row 0: accum (2, -2), var 1 -+ 1.
        assert_f32(
            &after,
            &[4, 2],
            &[0.0, 2.0, 2.0, 2.0, 3.0, 3.0, 2.55, 2.55],
            1e-6,
        );
    }
}
