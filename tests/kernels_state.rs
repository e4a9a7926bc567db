//! Kernels with state: random ops (seeding, ranges, moments), resource variables and the
//! optimizer updates applied to them.

use std::sync::Arc;

use crate::kernels_support::*;
use tessera::device::DeviceType;
use tessera::error::Code;
use tessera::kernels::{create_kernel, OpContext, OpKernel};
use tessera::proto::NodeDef;
use tessera::runtime::resource::ResourceMgr;
use tessera::tensor::{DType, Tensor};

fn random(op: &str, seed: i64, seed2: i64, dtype: DType) -> NodeDef {
    node(op)
        .attr("dtype", value::dtype(dtype))
        .attr("seed", value::int(seed))
        .attr("seed2", value::int(seed2))
        .build()
}

/// Runs a kernel (kept across calls, like the executor does) once with these inputs.
fn step(
    kernel: &Arc<dyn OpKernel>,
    node: &NodeDef,
    inputs: Vec<Tensor>,
    rm: &ResourceMgr,
) -> tessera::Result<Vec<Tensor>> {
    let mut ctx = OpContext::new(node, inputs, rm, DEVICE, 7);
    kernel.compute(&mut ctx)?;
    Ok(ctx
        .take_outputs()
        .into_iter()
        .map(|t| t.expect("output set"))
        .collect())
}

fn sample(op: &str, dtype: DType, n: usize) -> Vec<f64> {
    let rm = ResourceMgr::new();
    let out = run_with(&random(op, 0, 0, dtype), vec![ivec(&[n as i32])], &rm)
        .unwrap()
        .remove(0);
    assert_eq!(out.dtype(), dtype);
    assert_eq!(out.dims(), &[n]);
    as_f64s(&out)
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[test]
fn random_uniform_lies_in_the_unit_interval() {
    let rm = ResourceMgr::new();
    let out = run_with(
        &random("RandomUniform", 0, 0, DType::Float),
        vec![ivec(&[2, 3])],
        &rm,
    )
    .unwrap()
    .remove(0);
    assert_eq!(out.dims(), &[2, 3]);
    for dtype in [DType::Float, DType::Double] {
        let v = sample("RandomUniform", dtype, 20_000);
        assert!(v.iter().all(|&x| (0.0..1.0).contains(&x)));
        // Uniform[0,1): mean 1/2, std 1/sqrt(12) = 0.2887
        let (mean, std) = mean_std(&v);
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
        assert!((std - 0.2887).abs() < 0.02, "std {std}");
    }
}

#[test]
fn normal_samples_have_unit_moments_and_truncation_bounds() {
    let v = sample("RandomStandardNormal", DType::Float, 20_000);
    let (mean, std) = mean_std(&v);
    assert!(mean.abs() < 0.05, "mean {mean}");
    assert!((std - 1.0).abs() < 0.05, "std {std}");
    let v = sample("TruncatedNormal", DType::Double, 20_000);
    assert!(v.iter().all(|x| x.abs() <= 2.0));
    // A standard normal truncated to (-2, 2) has std ~0.880.
    let (mean, std) = mean_std(&v);
    assert!(mean.abs() < 0.05, "mean {mean}");
    assert!((std - 0.88).abs() < 0.05, "std {std}");
}

#[test]
fn seeded_kernels_repeat_the_same_sequence_and_advance_per_step() {
    let rm = ResourceMgr::new();
    let n = random("RandomUniform", 7, 3, DType::Float);
    let k1 = create_kernel(&n, DeviceType::Cpu).unwrap();
    let k2 = create_kernel(&n, DeviceType::Cpu).unwrap();
    let a1 = step(&k1, &n, vec![ivec(&[5])], &rm).unwrap();
    let a2 = step(&k1, &n, vec![ivec(&[5])], &rm).unwrap();
    let b1 = step(&k2, &n, vec![ivec(&[5])], &rm).unwrap();
    let b2 = step(&k2, &n, vec![ivec(&[5])], &rm).unwrap();
    assert_eq!(a1, b1);
    assert_eq!(a2, b2);
    assert_ne!(a1, a2, "the sequence advances each step");
    let other = random("RandomUniform", 7, 4, DType::Float);
    let c1 = run_with(&other, vec![ivec(&[5])], &rm).unwrap();
    assert_ne!(a1, c1, "another seed pair gives another sequence");
    // Unseeded kernels draw from entropy.
    let free = random("RandomStandardNormal", 0, 0, DType::Float);
    assert_ne!(
        run_with(&free, vec![ivec(&[8])], &rm).unwrap(),
        run_with(&free, vec![ivec(&[8])], &rm).unwrap()
    );
    let int_dtype = random("RandomUniform", 1, 1, DType::Int32);
    assert_eq!(
        create_kernel(&int_dtype, DeviceType::Cpu)
            .err()
            .unwrap()
            .code(),
        Code::InvalidArgument
    );
}

fn var_handle(name: &str, shared_name: &str) -> NodeDef {
    node("VarHandleOp")
        .name(name)
        .attr("shared_name", value::string(shared_name))
        .attr("container", value::string(""))
        .attr("dtype", value::dtype(DType::Float))
        .build()
}

fn handle(rm: &ResourceMgr, name: &str) -> Tensor {
    run_with(&var_handle(name, ""), vec![], rm)
        .unwrap()
        .remove(0)
}

fn read(rm: &ResourceMgr, h: &Tensor) -> tessera::Result<Tensor> {
    let n = node("ReadVariableOp")
        .name("read")
        .attr("dtype", value::dtype(DType::Float))
        .build();
    run_with(&n, vec![h.clone()], rm).map(|mut v| v.remove(0))
}

fn assign(rm: &ResourceMgr, op: &str, h: &Tensor, v: Tensor) -> tessera::Result<Vec<Tensor>> {
    let n = node(op)
        .name("assign")
        .attr("dtype", value::dtype(v.dtype()))
        .build();
    run_with(&n, vec![h.clone(), v], rm)
}

fn is_initialized(rm: &ResourceMgr, h: &Tensor) -> bool {
    let n = node("VarIsInitializedOp").build();
    run_with(&n, vec![h.clone()], rm).unwrap()[0]
        .scalar_value::<bool>()
        .unwrap()
}

#[test]
fn var_handle_names_the_variable_without_creating_it() {
    let rm = ResourceMgr::new();
    let t = run_with(&var_handle("w1", ""), vec![], &rm)
        .unwrap()
        .remove(0);
    assert_eq!(t.dtype(), DType::Resource);
    let h = t.resource_handle().unwrap();
    assert_eq!(
        (h.device.as_str(), h.container.as_str(), h.name.as_str()),
        (DEVICE, "", "w1")
    );
    let shared = run_with(&var_handle("w1_1", "layer/w"), vec![], &rm)
        .unwrap()
        .remove(0);
    assert_eq!(shared.resource_handle().unwrap().name, "layer/w");
    assert!(rm.is_empty());
}

#[test]
fn variables_are_created_assigned_updated_and_destroyed() {
    let rm = ResourceMgr::new();
    let h = handle(&rm, "w");
    assert!(!is_initialized(&rm, &h));
    let err = read(&rm, &h).unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("uninitialized value w") && err.message().contains("initializer"),
        "{err}"
    );
    let err = assign(&rm, "AssignAddVariableOp", &h, f32s(&[2], &[1., 1.])).unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);

    assign(&rm, "AssignVariableOp", &h, f32s(&[2], &[1., 2.])).unwrap();
    assert!(is_initialized(&rm, &h));
    assert_f32(&read(&rm, &h).unwrap(), &[2], &[1., 2.], 0.0);
    let snapshot = read(&rm, &h).unwrap();
    assign(&rm, "AssignAddVariableOp", &h, f32s(&[2], &[10., 20.])).unwrap();
    assign(&rm, "AssignSubVariableOp", &h, f32s(&[2], &[1., 1.])).unwrap();
    assert_f32(&read(&rm, &h).unwrap(), &[2], &[10., 21.], 0.0);
    // An earlier read is a snapshot, untouched by later updates.
    assert_f32(&snapshot, &[2], &[1., 2.], 0.0);

    let err = assign(&rm, "AssignVariableOp", &h, i32s(&[2], &[1, 2])).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("wrong dtype"), "{err}");
    let err = assign(&rm, "AssignAddVariableOp", &h, f32s(&[3], &[1., 1., 1.])).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("shapes must be equal"), "{err}");

    let destroy = node("DestroyResourceOp").build();
    run_with(&destroy, vec![h.clone()], &rm).unwrap();
    assert!(!is_initialized(&rm, &h));
    run_with(&destroy, vec![h.clone()], &rm).unwrap();
    let strict = node("DestroyResourceOp")
        .attr("ignore_lookup_error", value::bool(false))
        .build();
    assert_eq!(
        run_with(&strict, vec![h], &rm).unwrap_err().code(),
        Code::NotFound
    );
}

#[test]
fn an_update_no_reader_holds_is_made_in_the_variables_own_buffer() {
    let rm = ResourceMgr::new();
    let h = handle(&rm, "w");
    assign(&rm, "AssignVariableOp", &h, f32s(&[3], &[1., 2., 3.])).unwrap();
    let at = |t: &Tensor| t.raw_bytes().unwrap().as_ptr() as usize;
    let before = at(&read(&rm, &h).unwrap());
    assign(&rm, "AssignAddVariableOp", &h, f32s(&[3], &[1., 1., 1.])).unwrap();
    assign(&rm, "AssignSubVariableOp", &h, f32s(&[3], &[0.5, 0.5, 0.5])).unwrap();
    let after = read(&rm, &h).unwrap();
    assert_eq!(
        at(&after),
        before,
        "the update is written where the value lies"
    );
    assert_f32(&after, &[3], &[1.5, 2.5, 3.5], 0.0);
    // Held by a reader, the value is copied first: the reader keeps its elements.
    assign(&rm, "AssignAddVariableOp", &h, f32s(&[3], &[1., 1., 1.])).unwrap();
    assert_f32(&after, &[3], &[1.5, 2.5, 3.5], 0.0);
    assert_f32(&read(&rm, &h).unwrap(), &[3], &[2.5, 3.5, 4.5], 0.0);
}

#[test]
fn integer_variables_accumulate() {
    let rm = ResourceMgr::new();
    let h = handle(&rm, "global_step");
    assign(&rm, "AssignVariableOp", &h, i64s(&[], &[0])).unwrap();
    for _ in 0..3 {
        assign(&rm, "AssignAddVariableOp", &h, i64s(&[], &[1])).unwrap();
    }
    let n = node("ReadVariableOp")
        .attr("dtype", value::dtype(DType::Int64))
        .build();
    assert_exact(&run_with(&n, vec![h], &rm).unwrap()[0], &[], &[3i64]);
}

#[test]
fn gradient_descent_update() {
    let rm = ResourceMgr::new();
    let h = handle(&rm, "v");
    assign(&rm, "AssignVariableOp", &h, f32s(&[2], &[1., 2.])).unwrap();
    let n = node("ResourceApplyGradientDescent").build();
    // var -= 0.5 * [2, -4]  ->  [0, 4]
    run_with(
        &n,
        vec![h.clone(), f32s(&[], &[0.5]), f32s(&[2], &[2., -4.])],
        &rm,
    )
    .unwrap();
    assert_f32(&read(&rm, &h).unwrap(), &[2], &[0., 4.], 0.0);
    let err = run_with(
        &n,
        vec![h.clone(), f32s(&[], &[0.5]), f32s(&[3], &[0.; 3])],
        &rm,
    )
    .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = run_with(
        &n,
        vec![h, f32s(&[2], &[0.5, 0.5]), f32s(&[2], &[0.; 2])],
        &rm,
    )
    .unwrap_err();
    assert!(err.message().contains("alpha is not a scalar"), "{err}");
    let missing = handle(&rm, "never_assigned");
    let err = run_with(
        &n,
        vec![missing, f32s(&[], &[0.5]), f32s(&[2], &[0.; 2])],
        &rm,
    )
    .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
}

#[test]
fn adagrad_update_follows_tensorflow() {
    let rm = ResourceMgr::new();
    let (var, accum) = (handle(&rm, "w"), handle(&rm, "w/Adagrad"));
    assign(&rm, "AssignVariableOp", &var, f64s(&[2], &[1.0, -1.0])).unwrap();
    assign(&rm, "AssignVariableOp", &accum, f64s(&[2], &[0.1, 0.1])).unwrap();
    let n = node("ResourceApplyAdagrad").build();
    let (lr, g) = (0.01f64, [0.5f64, -2.0]);
    run_with(
        &n,
        vec![var.clone(), accum.clone(), f64s(&[], &[lr]), f64s(&[2], &g)],
        &rm,
    )
    .unwrap();
    // accum = 0.1 + g^2; var -= lr * g / sqrt(accum)
    let acc: Vec<f64> = g.iter().map(|g| 0.1 + g * g).collect();
    let expected: Vec<f64> = [1.0, -1.0]
        .iter()
        .zip(&g)
        .zip(&acc)
        .map(|((v, g), a)| v - lr * g / a.sqrt())
        .collect();
    let read64 = node("ReadVariableOp")
        .attr("dtype", value::dtype(DType::Double))
        .build();
    assert_f64(
        &run_with(&read64, vec![var.clone()], &rm).unwrap()[0],
        &[2],
        &expected,
        1e-12,
    );
    assert_f64(
        &run_with(&read64, vec![accum.clone()], &rm).unwrap()[0],
        &[2],
        &acc,
        1e-12,
    );

    // update_slots=false leaves accum alone.
    let frozen = node("ResourceApplyAdagrad")
        .attr("update_slots", value::bool(false))
        .build();
    run_with(
        &frozen,
        vec![var.clone(), accum.clone(), f64s(&[], &[lr]), f64s(&[2], &g)],
        &rm,
    )
    .unwrap();
    assert_f64(
        &run_with(&read64, vec![accum.clone()], &rm).unwrap()[0],
        &[2],
        &acc,
        1e-12,
    );
    let twice: Vec<f64> = expected
        .iter()
        .zip(&g)
        .zip(&acc)
        .map(|((v, g), a)| v - lr * g / a.sqrt())
        .collect();
    assert_f64(
        &run_with(&read64, vec![var.clone()], &rm).unwrap()[0],
        &[2],
        &twice,
        1e-12,
    );

    let err = run_with(
        &n,
        vec![var, accum, f64s(&[], &[lr]), f64s(&[3], &[0.; 3])],
        &rm,
    )
    .unwrap_err();
    assert!(
        err.message()
            .contains("var and grad do not have the same shape"),
        "{err}"
    );
}

#[test]
fn concurrent_updates_are_not_lost() {
    let rm = ResourceMgr::new();
    let h = handle(&rm, "counter");
    assign(&rm, "AssignVariableOp", &h, i64s(&[2], &[0, 0])).unwrap();
    let add = node("AssignAddVariableOp")
        .attr("dtype", value::dtype(DType::Int64))
        .build();
    let kernel = create_kernel(&add, DeviceType::Cpu).unwrap();
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..100 {
                    step(&kernel, &add, vec![h.clone(), i64s(&[2], &[1, 2])], &rm).unwrap();
                }
            });
        }
    });
    let read = node("ReadVariableOp")
        .attr("dtype", value::dtype(DType::Int64))
        .build();
    assert_exact(
        &run_with(&read, vec![h], &rm).unwrap()[0],
        &[2],
        &[800i64, 1600],
    );
}

#[test]
fn adagrad_v2_adds_epsilon_to_the_denominator() {
    let rm = ResourceMgr::new();
    let (var, accum) = (handle(&rm, "v"), handle(&rm, "v/Adagrad"));
    assign(&rm, "AssignVariableOp", &var, f32s(&[1], &[1.0])).unwrap();
    assign(&rm, "AssignVariableOp", &accum, f32s(&[1], &[0.0])).unwrap();
    let n = node("ResourceApplyAdagradV2").build();
    let inputs = vec![
        var.clone(),
        accum,
        f32s(&[], &[0.5]),
        f32s(&[], &[1.0]),
        f32s(&[1], &[3.0]),
    ];
    run_with(&n, inputs, &rm).unwrap();
    // accum = 9; var = 1 - 0.5 * 3 / (3 + 1) = 0.625
    assert_f32(&read(&rm, &var).unwrap(), &[1], &[0.625], 1e-7);
}

/// What TensorFlow 2.21's CPU kernels return for shape [7], `seed` 7, `seed2` 3: two runs of
/// one kernel, per op and dtype (printed with `repr(float(x))` from a `tf.compat.v1.Session`).
const TENSORFLOW_SEED_7_3: [(&str, DType, [[f64; 7]; 2]); 6] = [
    (
        "RandomUniform",
        DType::Float,
        [
            [
                0.4010878801345825,
                0.37683892250061035,
                0.3092927932739258,
                0.08807563781738281,
                0.7460572719573975,
                0.45470714569091797,
                0.5017683506011963,
            ],
            [
                0.2667226791381836,
                0.9463282823562622,
                0.13512349128723145,
                0.030855774879455566,
                0.7861028909683228,
                0.8527462482452393,
                0.33464670181274414,
            ],
        ],
    ),
    (
        "RandomUniform",
        DType::Double,
        [
            [
                0.20870315912522175,
                0.4743429181875207,
                0.9684586142277478,
                0.014147302814984108,
                0.3769711665674116,
                0.7548736035948285,
                0.6591726200137684,
            ],
            [
                0.13378209051923506,
                0.08098830288435477,
                0.2888237123428774,
                0.6771744679054656,
                0.4641413613509424,
                0.733691113730583,
                0.5102661376697946,
            ],
        ],
    ),
    (
        "RandomStandardNormal",
        DType::Float,
        [
            [
                0.9447038173675537,
                -0.9667906761169434,
                0.8051716685295105,
                1.3033159971237183,
                0.2149045467376709,
                -0.7346575856208801,
                0.8827847242355347,
            ],
            [
                -0.5379212498664856,
                1.534187912940979,
                0.38547152280807495,
                1.96329927444458,
                -0.5541626214981079,
                0.41741934418678284,
                1.2853710651397705,
            ],
        ],
    ),
    (
        "RandomStandardNormal",
        DType::Double,
        [
            [
                0.2841397934847126,
                -1.7472690787243486,
                0.022475391397604266,
                0.2521783387351514,
                -1.3961891433687852,
                0.042767129482479266,
                -0.7503893057986882,
            ],
            [
                0.9771796342587652,
                1.7516295122334433,
                -1.4138992482397594,
                -0.6962517171212307,
                -1.2325051630479866,
                -0.1267408900144918,
                0.6933966503311622,
            ],
        ],
    ),
    (
        "TruncatedNormal",
        DType::Float,
        [
            [
                0.9447038173675537,
                -0.9667906761169434,
                0.8051716685295105,
                1.3033159971237183,
                -0.21878036856651306,
                -0.8048995137214661,
                -0.1616145819425583,
            ],
            [
                -0.5379212498664856,
                1.534187912940979,
                0.38547152280807495,
                1.96329927444458,
                0.1509600430727005,
                -1.4326051473617554,
                0.8124901652336121,
            ],
        ],
    ),
    (
        "TruncatedNormal",
        DType::Double,
        [
            [
                0.2841397934847126,
                -1.7472690787243486,
                -0.8324516698354941,
                1.1555486766159675,
                -0.7045877862978654,
                0.6053747576806723,
                0.49198875314691143,
            ],
            [
                0.9771796342587652,
                1.7516295122334433,
                0.045152187538396275,
                -0.8485068568003423,
                -0.1226465345307222,
                -0.5888818598650107,
                -0.5489589710708321,
            ],
        ],
    ),
];

#[test]
fn seeded_random_ops_draw_tensorflows_numbers() {
    let rm = ResourceMgr::new();
    for (op, dtype, runs) in TENSORFLOW_SEED_7_3 {
        let node = random(op, 7, 3, dtype);
        let kernel = create_kernel(&node, DeviceType::Cpu).unwrap();
        for (run, want) in runs.iter().enumerate() {
            let out = step(&kernel, &node, vec![ivec(&[7])], &rm)
                .unwrap()
                .remove(0);
            let got = as_f64s(&out);
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                // Uniform values are bit for bit; normal ones go through sin, cos and log,
                // which may differ in the last place between math libraries.
                let ulps = if op == "RandomUniform" { 0.0 } else { 4.0 };
                let eps = if dtype == DType::Float {
                    f32::EPSILON as f64
                } else {
                    f64::EPSILON
                };
                assert!(
                    (g - w).abs() <= ulps * eps * w.abs().max(1.0),
                    "{op} {dtype} run {run} [{i}]: {g} but TensorFlow gives {w}"
                );
            }
        }
    }
    // A seed past 32 bits keys both key words, a negative seed2 the counter's high words:
    // TruncatedNormal [2, 5] with seed 0x1234567890 and seed2 -5, as TensorFlow draws it.
    let node = random("TruncatedNormal", 0x12_3456_7890, -5, DType::Float);
    let out = run_with(&node, vec![ivec(&[2, 5])], &rm).unwrap().remove(0);
    let want = [
        1.1851108074188232,
        0.34860730171203613,
        0.976168692111969,
        0.3717062771320343,
        0.7521666884422302,
        -1.1176599264144897,
        0.7764051556587219,
        0.046951211988925934,
        0.7454683780670166,
        0.5418919920921326,
    ];
    for (g, w) in out.values::<f32>().unwrap().iter().zip(want) {
        assert!(
            (*g as f64 - w).abs() <= 4.0 * f32::EPSILON as f64 * w.abs().max(1.0),
            "{g} vs {w}"
        );
    }
}
