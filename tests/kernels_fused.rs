//! The fused ops a TensorFlow 2.21 master sends a worker for dense and convolutional models
//! (grappler's remapper writes them): `_FusedMatMul` and `_FusedConv2D` with their `fused_ops`
//! lists, and `_FusedBatchNormEx`:
//!
//! - against stock TensorFlow's own fused kernels on seeded inputs (`tests/kernels_fused_tf.py`
//!   computes them live: skipped without TensorFlow, a failure under CI), each node declared
//!   with only the attrs TensorFlow set and its defaults filled in by tessera's registry, as a
//!   RegisterGraph's node is;
//! - against the unfused kernels run one after the other (no TensorFlow needed): a fused kernel
//!   is a chain of them, so the values must be the same to the bit;
//! - `fused_ops` lists and activations tessera does not run fail with UNIMPLEMENTED naming the
//!   list, and a `num_args` that does not fit it with INVALID_ARGUMENT, at kernel creation, so
//!   a worker refuses them at RegisterGraph.

use crate::kernels_support::*;
use crate::support::tensorflow::script_json;
use serde_json::Value;
use tessera::cluster::TaskId;
use tessera::error::Code;
use tessera::graph::registry;
use tessera::proto::{AttrValue, DeviceAttributes, GraphDef, NodeDef, RegisterGraphRequest};
use tessera::runtime::resource::ResourceMgr;
use tessera::tensor::{DType, Tensor};
use tessera::worker::{WorkerOptions, WorkerState};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kernels_fused_tf.py");

/// The activations a fused contraction may end with.
const ACTIVATIONS: [&str; 8] = [
    "Relu",
    "Relu6",
    "Elu",
    "LeakyRelu",
    "Tanh",
    "Sigmoid",
    "GeluApproximate",
    "GeluExact",
];

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn dims(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

fn dtype_named(name: &str) -> DType {
    match name {
        "float32" => DType::Float,
        "float64" => DType::Double,
        other => panic!("dtype {other}"),
    }
}

/// The attr the script wrote as `{"kind": value}`.
fn attr_of(v: &Value) -> AttrValue {
    let (kind, v) = v.as_object().unwrap().iter().next().unwrap();
    match kind.as_str() {
        "type" => value::dtype(dtype_named(v.as_str().unwrap())),
        "b" => value::bool(v.as_bool().unwrap()),
        "i" => value::int(v.as_i64().unwrap()),
        "f" => value::float(v.as_f64().unwrap() as f32),
        "s" => value::string(v.as_str().unwrap()),
        "ints" => value::int_list(
            v.as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_i64().unwrap())
                .collect(),
        ),
        "strings" => value::string_list(v.as_array().unwrap().iter().map(|s| s.as_str().unwrap())),
        "types" => value::dtype_list(
            &v.as_array()
                .unwrap()
                .iter()
                .map(|t| dtype_named(t.as_str().unwrap()))
                .collect::<Vec<_>>(),
        ),
        other => panic!("attr kind {other}"),
    }
}

/// Declares `node` as a RegisterGraph would: its op must be registered, and the attrs it leaves
/// out take their defaults.
fn declared(mut node: NodeDef) -> NodeDef {
    registry::lookup(&node)
        .unwrap()
        .fill_and_check_attrs(&mut node)
        .unwrap_or_else(|e| panic!("{}: {e}", node.op));
    node
}

fn check_case(case: &Value) {
    let what = case["what"].as_str().unwrap();
    let mut node = node(case["op"].as_str().unwrap()).name("fused");
    for (k, v) in case["attrs"].as_object().unwrap() {
        node = node.attr(k, attr_of(v));
    }
    let node = declared(node.build());
    let inputs: Vec<Tensor> = case["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let values: Vec<f32> = floats(&t["values"]).iter().map(|&v| v as f32).collect();
            f32s(&dims(&t["shape"]), &values)
        })
        .collect();
    let outs =
        run_with(&node, inputs, &ResourceMgr::new()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let want = case["outputs"].as_array().unwrap();
    assert_eq!(outs.len(), want.len(), "{what}: outputs");
    // y, and for batch normalization the batch statistics (the reserve spaces are each
    // runtime's own layout, read only by its gradient kernel).
    for (i, (got, want)) in outs.iter().zip(want).enumerate().take(3) {
        let expected = floats(&want["values"]);
        assert_eq!(got.dims(), dims(&want["shape"]), "{what}: output {i} shape");
        let values = got.values::<f32>().unwrap();
        for (j, (&g, &e)) in values.iter().zip(&expected).enumerate() {
            assert!(
                (f64::from(g) - e).abs() <= 2e-5 * (1.0 + e.abs()),
                "{what}: output {i} element {j}: tessera {g}, TensorFlow {e}"
            );
        }
    }
}

#[test]
fn fused_kernels_match_tensorflow() {
    let test = "fused_kernels_match_tensorflow";
    let Some(json) = script_json(test, SCRIPT, &["tensorflow", "numpy"]) else {
        return;
    };
    let group = |k: &str| json[k].as_array().unwrap().clone();
    let (matmul, conv, batch_norm) = (group("matmul"), group("conv"), group("batch_norm"));
    assert!(matmul.len() >= 11 && conv.len() >= 20 && batch_norm.len() >= 2);
    for case in matmul.iter().chain(&conv).chain(&batch_norm) {
        check_case(case);
    }
    eprintln!(
        "{} _FusedMatMul, {} _FusedConv2D and {} _FusedBatchNormEx cases match TensorFlow",
        matmul.len(),
        conv.len(),
        batch_norm.len()
    );
}

// ---------------------------------------------------------------------------------------------
// Against the unfused kernels

/// Values with both signs: v[i] = sin(0.37 i + seed) (1 + i mod 3) / 2.
fn seeded(dims: &[usize], seed: f32) -> Tensor {
    let n: usize = dims.iter().product();
    let values: Vec<f32> = (0..n)
        .map(|i| (0.37 * i as f32 + seed).sin() * (1.0 + (i % 3) as f32) / 2.0)
        .collect();
    f32s(dims, &values)
}

fn positive(dims: &[usize], seed: f32) -> Tensor {
    let t = seeded(dims, seed);
    let values: Vec<f32> = t
        .values::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.abs() + 0.3)
        .collect();
    f32s(dims, &values)
}

fn scalar(v: f64) -> Tensor {
    Tensor::scalar(v as f32)
}

/// Runs one unfused float32 op on `inputs` with `attrs`; returns its outputs.
fn unfused(op: &str, attrs: &[(&str, AttrValue)], inputs: Vec<Tensor>) -> Vec<Tensor> {
    let mut b = node(op).t(DType::Float);
    for (k, v) in attrs {
        b = b.attr(k, v.clone());
    }
    b.run(inputs).unwrap_or_else(|e| panic!("{op}: {e}"))
}

fn unfused1(op: &str, attrs: &[(&str, AttrValue)], inputs: Vec<Tensor>) -> Tensor {
    unfused(op, attrs, inputs).remove(0)
}

/// The activation as its unfused ops (GELU as TensorFlow's `gelu` writes it).
fn activate(activation: &str, x: Tensor, alpha: f32) -> Tensor {
    let mul = |a: Tensor, b: Tensor| unfused1("Mul", &[], vec![a, b]);
    let add = |a: Tensor, b: Tensor| unfused1("AddV2", &[], vec![a, b]);
    match activation {
        "LeakyRelu" => unfused1("LeakyRelu", &[("alpha", value::float(alpha))], vec![x]),
        "GeluExact" => {
            let erf = unfused1(
                "Erf",
                &[],
                vec![mul(x.clone(), scalar(std::f64::consts::FRAC_1_SQRT_2))],
            );
            mul(mul(x, scalar(0.5)), add(erf, scalar(1.0)))
        }
        "GeluApproximate" => {
            let cube = mul(mul(x.clone(), x.clone()), x.clone());
            let inner = add(x.clone(), mul(cube, scalar(0.044715)));
            let c = std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2;
            let tanh = unfused1("Tanh", &[], vec![mul(inner, scalar(c))]);
            mul(mul(x, scalar(0.5)), add(tanh, scalar(1.0)))
        }
        op => unfused1(op, &[], vec![x]),
    }
}

fn fused(op: &str, attrs: &[(&str, AttrValue)], inputs: Vec<Tensor>) -> Vec<Tensor> {
    let mut b = node(op).name("fused").t(DType::Float);
    for (k, v) in attrs {
        b = b.attr(k, v.clone());
    }
    let node = declared(b.build());
    run_with(&node, inputs, &ResourceMgr::new()).unwrap_or_else(|e| panic!("{op}: {e}"))
}

fn assert_same(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    let (g, w) = (got.values::<f32>().unwrap(), want.values::<f32>().unwrap());
    for (i, (g, w)) in g.iter().zip(w.iter()).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "{what}: element {i}: fused {g}, unfused {w}"
        );
    }
}

fn fused_ops(first: &str, activation: Option<&str>) -> AttrValue {
    value::string_list([Some(first), activation].into_iter().flatten())
}

#[test]
fn fused_matmul_is_its_unfused_chain() {
    let (a, b, bias) = (
        seeded(&[6, 5], 0.1),
        seeded(&[4, 5], 0.7),
        seeded(&[4], 1.3),
    );
    let alpha = 0.15;
    for activation in [None].into_iter().chain(ACTIVATIONS.map(Some)) {
        let attrs = [
            ("num_args", value::int(1)),
            ("fused_ops", fused_ops("BiasAdd", activation)),
            ("transpose_b", value::bool(true)),
            ("leakyrelu_alpha", value::float(alpha)),
        ];
        let got = fused(
            "_FusedMatMul",
            &attrs,
            vec![a.clone(), b.clone(), bias.clone()],
        );
        let product = unfused1(
            "MatMul",
            &[("transpose_b", value::bool(true))],
            vec![a.clone(), b.clone()],
        );
        let mut want = unfused1("BiasAdd", &[], vec![product, bias.clone()]);
        if let Some(activation) = activation {
            want = activate(activation, want, alpha);
        }
        assert_same(&format!("_FusedMatMul {activation:?}"), &got[0], &want);
    }
}

#[test]
fn fused_conv2d_is_its_unfused_chain() {
    let (x, f) = (seeded(&[2, 6, 5, 3], 0.2), seeded(&[3, 2, 3, 4], 0.9));
    let (bias, scale, offset) = (seeded(&[4], 1.1), seeded(&[4], 1.7), seeded(&[4], 2.3));
    let (mean, variance) = (seeded(&[4], 2.9), positive(&[4], 3.1));
    let conv_attrs = |format: &str| {
        let strides = if format == "NHWC" {
            [1, 2, 1, 1]
        } else {
            [1, 1, 2, 1]
        };
        vec![
            ("strides", value::int_list(strides.to_vec())),
            ("padding", value::string("SAME")),
            ("data_format", value::string(format)),
        ]
    };
    for format in ["NHWC", "NCHW"] {
        let x = if format == "NHWC" {
            x.clone()
        } else {
            unfused1("Transpose", &[], vec![x.clone(), i32s(&[4], &[0, 3, 1, 2])])
        };
        let product = unfused1("Conv2D", &conv_attrs(format), vec![x.clone(), f.clone()]);
        for first in ["BiasAdd", "FusedBatchNorm"] {
            for activation in [None].into_iter().chain(ACTIVATIONS.map(Some)) {
                let what = format!("_FusedConv2D {format} {first} {activation:?}");
                let args = if first == "BiasAdd" {
                    vec![bias.clone()]
                } else {
                    vec![
                        scale.clone(),
                        offset.clone(),
                        mean.clone(),
                        variance.clone(),
                    ]
                };
                let mut attrs = conv_attrs(format);
                attrs.extend([
                    ("TArgs", value::dtype_list(&vec![DType::Float; args.len()])),
                    ("num_args", value::int(args.len() as i64)),
                    ("fused_ops", fused_ops(first, activation)),
                    ("epsilon", value::float(0.001)),
                ]);
                let mut inputs = vec![x.clone(), f.clone()];
                inputs.extend(args.iter().cloned());
                let got = fused("_FusedConv2D", &attrs, inputs);
                let format_attr = [("data_format", value::string(format))];
                let mut want = if first == "BiasAdd" {
                    unfused1("BiasAdd", &format_attr, vec![product.clone(), bias.clone()])
                } else {
                    let bn_attrs = [
                        ("data_format", value::string(format)),
                        ("U", value::dtype(DType::Float)),
                        ("epsilon", value::float(0.001)),
                        ("is_training", value::bool(false)),
                    ];
                    let mut inputs = vec![product.clone()];
                    inputs.extend(args);
                    unfused1("FusedBatchNormV3", &bn_attrs, inputs)
                };
                if let Some(activation) = activation {
                    want = activate(activation, want, 0.2);
                }
                assert_same(&what, &got[0], &want);
            }
        }
    }
}

#[test]
fn fused_batch_norm_ex_is_its_unfused_chain() {
    let x = seeded(&[2, 3, 4, 5], 0.4);
    let side = seeded(&[2, 3, 4, 5], 0.8);
    let (scale, offset) = (seeded(&[5], 1.2), seeded(&[5], 1.9));
    let (mean, variance) = (seeded(&[5], 2.6), positive(&[5], 3.3));
    for training in [true, false] {
        for activation in ["Identity", "Relu"] {
            for side_inputs in [0, 1] {
                let what = format!(
                    "_FusedBatchNormEx training {training} {activation} {side_inputs} side inputs"
                );
                let bn_attrs = [
                    ("U", value::dtype(DType::Float)),
                    ("epsilon", value::float(0.001)),
                    ("exponential_avg_factor", value::float(0.5)),
                    ("is_training", value::bool(training)),
                ];
                let mut attrs = bn_attrs.to_vec();
                attrs.extend([
                    ("activation_mode", value::string(activation)),
                    ("num_side_inputs", value::int(side_inputs)),
                ]);
                let mut inputs = vec![
                    x.clone(),
                    scale.clone(),
                    offset.clone(),
                    mean.clone(),
                    variance.clone(),
                ];
                let bn = unfused("FusedBatchNormV3", &bn_attrs, inputs.clone());
                if side_inputs == 1 {
                    inputs.push(side.clone());
                }
                let got = fused("_FusedBatchNormEx", &attrs, inputs);
                assert_eq!(got.len(), 6, "{what}");
                let mut y = bn[0].clone();
                if side_inputs == 1 {
                    y = unfused1("AddV2", &[], vec![y, side.clone()]);
                }
                if activation == "Relu" {
                    y = unfused1("Relu", &[], vec![y]);
                }
                assert_same(&format!("{what}: y"), &got[0], &y);
                for i in 1..6 {
                    assert_same(&format!("{what}: output {i}"), &got[i], &bn[i]);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What tessera does not run

fn with_attrs(op: &str, attrs: &[(&str, AttrValue)]) -> NodeBuilder {
    let mut b = node(op).name("fused").t(DType::Float);
    for (k, v) in attrs {
        b = b.attr(k, v.clone());
    }
    b
}

#[test]
fn unsupported_combinations_are_unimplemented_and_name_the_list() {
    let conv = |ops: &[&str], num_args: i64| {
        with_attrs(
            "_FusedConv2D",
            &[
                ("strides", value::int_list(vec![1, 1, 1, 1])),
                ("padding", value::string("SAME")),
                ("TArgs", value::dtype_list(&[DType::Float])),
                ("num_args", value::int(num_args)),
                ("fused_ops", value::string_list(ops.iter().copied())),
            ],
        )
    };
    let matmul = |ops: &[&str], num_args: i64| {
        with_attrs(
            "_FusedMatMul",
            &[
                ("num_args", value::int(num_args)),
                ("fused_ops", value::string_list(ops.iter().copied())),
            ],
        )
    };
    let unimplemented = [
        (conv(&["BiasAdd", "Add", "Relu"], 2), "[BiasAdd, Add, Relu]"),
        (
            conv(&["BiasAdd", "Relu", "Relu"], 1),
            "[BiasAdd, Relu, Relu]",
        ),
        (conv(&["Relu"], 1), "[Relu]"),
        (conv(&[], 1), "fused_ops []"),
        (matmul(&["FusedBatchNorm"], 4), "[FusedBatchNorm]"),
        (matmul(&["BiasAdd", "Swish"], 1), "[BiasAdd, Swish]"),
        (
            with_attrs(
                "_FusedBatchNormEx",
                &[("activation_mode", value::string("Elu"))],
            ),
            "activation_mode Elu",
        ),
        (
            with_attrs("_FusedBatchNormEx", &[("num_side_inputs", value::int(2))]),
            "2 side inputs",
        ),
    ];
    for (b, needle) in unimplemented {
        let message = expect_err(b, vec![], Code::Unimplemented, needle);
        assert!(message.contains("`fused`"), "{message}");
    }
    expect_err(
        conv(&["FusedBatchNorm", "Relu"], 1),
        vec![],
        Code::InvalidArgument,
        "num_args is 1, but FusedBatchNorm takes 4 extra arguments",
    );
    expect_err(
        matmul(&["BiasAdd"], 2),
        vec![],
        Code::InvalidArgument,
        "num_args is 2, but BiasAdd takes 1 extra argument",
    );
}

#[test]
fn a_stage_error_names_the_fused_node() {
    // A bias of the wrong length fails in BiasAdd's kernel, inside the fused node.
    let b = with_attrs(
        "_FusedMatMul",
        &[
            ("num_args", value::int(1)),
            ("fused_ops", value::string_list(["BiasAdd", "Relu"])),
        ],
    );
    let inputs = vec![
        seeded(&[2, 3], 0.0),
        seeded(&[3, 4], 0.5),
        seeded(&[5], 1.0),
    ];
    let message = expect_err(b, inputs, Code::InvalidArgument, "_FusedMatMul `fused`");
    assert!(message.contains("[BiasAdd, Relu]"), "{message}");
    // Strides the convolution's own kernel refuses, when the chain is built.
    let b = with_attrs(
        "_FusedConv2D",
        &[
            ("strides", value::int_list(vec![1, 1, 1])),
            ("padding", value::string("SAME")),
            ("num_args", value::int(1)),
            ("fused_ops", value::string_list(["BiasAdd"])),
        ],
    );
    let message = expect_err(b, vec![], Code::InvalidArgument, "_FusedConv2D `fused`");
    assert!(message.contains("strides"), "{message}");
}

/// A RegisterGraph carrying an unsupported combination is refused then, with UNIMPLEMENTED
/// naming the node and its list (the master learns it before any step), while a supported
/// one registers.
#[test]
fn register_graph_refuses_an_unsupported_combination() {
    const CPU0: &str = "/job:worker/replica:0/task:0/device:CPU:0";
    let worker = WorkerState::with_options(
        TaskId::new("worker", 0),
        vec![DeviceAttributes {
            name: CPU0.into(),
            device_type: "CPU".into(),
            incarnation: 7,
            ..Default::default()
        }],
        None,
        WorkerOptions::default(),
    );
    let constant = |name: &str, t: Tensor| {
        let mut b = node("Const").name(name);
        b = b.attr("dtype", value::dtype(DType::Float));
        b = b.attr("value", value::tensor(t.to_proto()));
        let mut n = b.build();
        n.device = CPU0.into();
        n
    };
    let register = |fused_ops: &[&str], num_args: i64| {
        let mut fused = with_attrs(
            "_FusedMatMul",
            &[
                ("num_args", value::int(num_args)),
                ("fused_ops", value::string_list(fused_ops.iter().copied())),
            ],
        )
        .name("dense/Relu")
        .build();
        fused.device = CPU0.into();
        fused.input = ["a", "b", "bias", "side"][..2 + num_args as usize]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let nodes = vec![
            constant("a", seeded(&[2, 3], 0.1)),
            constant("b", seeded(&[3, 4], 0.2)),
            constant("bias", seeded(&[4], 0.3)),
            constant("side", seeded(&[2, 4], 0.4)),
            fused,
        ];
        worker.register_graph(&RegisterGraphRequest {
            graph_def: Some(GraphDef {
                node: nodes,
                ..Default::default()
            }),
            ..Default::default()
        })
    };
    register(&["BiasAdd", "Relu"], 1).expect("a supported combination registers");
    let err = register(&["BiasAdd", "Add", "Relu"], 2).expect_err("refused");
    assert_eq!(err.code(), Code::Unimplemented, "{err}");
    assert!(
        err.message().contains("`dense/Relu`") && err.message().contains("[BiasAdd, Add, Relu]"),
        "{err}"
    );
}

/// A graph that arrives unfused (a stock client's through tessera's master, or tessera's own)
/// is fused by the worker that registers it, as TensorFlow's grappler would have: one
/// `_FusedMatMul` runs where `MatMul`, `BiasAdd` and `Relu` were written, under the `Relu`'s
/// name, and the fetched value is the unfused kernels' to the bit.
#[test]
fn a_worker_fuses_the_dense_layer_of_a_graph_it_registers() {
    use crate::support::cluster::InProcessCluster;
    use tessera::client::Session;
    use tessera::graph::Graph;
    use tessera::proto::run_options::TraceLevel;
    use tessera::proto::RunOptions;
    use tessera::tensor::PartialShape;

    let cluster = InProcessCluster::start(&[("worker", 1)]);
    let session = Session::connect(&cluster.target("worker", 0)).unwrap();
    let (x, w, b) = (
        seeded(&[6, 5], 0.1),
        seeded(&[5, 7], 0.2),
        seeded(&[7], 0.3),
    );
    let mut g = Graph::new();
    let xp = g
        .placeholder("x", DType::Float, PartialShape::new(vec![None, Some(5)]))
        .unwrap();
    let wc = g.constant(&w).unwrap();
    let bc = g.constant(&b).unwrap();
    let product = g.matmul(&xp, &wc).unwrap();
    let biased = g.bias_add(&product, &bc).unwrap();
    let y = g.relu(&biased).unwrap();
    session.extend(&g.to_graph_def()).unwrap();
    let options = RunOptions {
        trace_level: TraceLevel::FullTrace as i32,
        ..Default::default()
    };
    let (out, metadata) = session
        .run_with_options(&[("x:0", x.clone())], &[&y.name()], &[], &options)
        .unwrap();

    let labels: Vec<&str> = metadata
        .step_stats
        .as_ref()
        .expect("a traced step")
        .dev_stats
        .iter()
        .flat_map(|d| &d.node_stats)
        .map(|n| n.timeline_label.as_str())
        .collect();
    let y_node = y.name().trim_end_matches(":0").to_string();
    assert!(
        labels
            .iter()
            .any(|l| l.starts_with(&format!("{y_node} = _FusedMatMul("))),
        "{labels:?}"
    );
    for unfused_op in ["MatMul", "BiasAdd", "Relu"] {
        assert!(
            !labels
                .iter()
                .any(|l| l.contains(&format!(" = {unfused_op}("))),
            "{unfused_op} still ran: {labels:?}"
        );
    }
    let want = unfused1(
        "Relu",
        &[],
        vec![unfused1(
            "BiasAdd",
            &[],
            vec![unfused1("MatMul", &[], vec![x, w]), b],
        )],
    );
    assert_same("the fused dense layer", &out[0], &want);
}

/// An element-wise kernel that is the last reader of its input writes its output over it
/// (`forward_input`); a tensor the step also fetches is never written over. Fetching the
/// chain's intermediate values and only its end give the same values, each as computed alone.
#[test]
fn element_wise_chains_write_over_their_inputs_but_never_over_a_fetched_tensor() {
    use crate::support::cluster::InProcessCluster;
    use tessera::client::Session;
    use tessera::graph::Graph;
    use tessera::tensor::PartialShape;

    let cluster = InProcessCluster::start(&[("worker", 1)]);
    let session = Session::connect(&cluster.target("worker", 0)).unwrap();
    let x = seeded(&[64, 300], 0.4);
    let mut g = Graph::new();
    let xp = g
        .placeholder("x", DType::Float, PartialShape::new(vec![None, Some(300)]))
        .unwrap();
    let negated = g.neg(&xp).unwrap();
    let rectified = g.relu(&negated).unwrap();
    let doubled = g.add(&rectified, &rectified).unwrap();
    let end = g.relu(&doubled).unwrap();
    session.extend(&g.to_graph_def()).unwrap();

    let xs = x.values::<f32>().unwrap().into_owned();
    let want_negated: Vec<f32> = xs.iter().map(|v| -v).collect();
    let want_rectified: Vec<f32> = want_negated.iter().map(|v| v.max(0.0)).collect();
    let want_end: Vec<f32> = want_rectified.iter().map(|v| (v + v).max(0.0)).collect();

    let all = session
        .run(
            &[("x:0", x.clone())],
            &[&negated.name(), &rectified.name(), &end.name()],
            &[],
        )
        .unwrap();
    assert_eq!(all[0].values::<f32>().unwrap().as_ref(), &want_negated[..]);
    assert_eq!(
        all[1].values::<f32>().unwrap().as_ref(),
        &want_rectified[..]
    );
    assert_eq!(all[2].values::<f32>().unwrap().as_ref(), &want_end[..]);

    let only_end = session
        .run(&[("x:0", x.clone())], &[&end.name()], &[])
        .unwrap();
    assert_eq!(only_end[0].values::<f32>().unwrap().as_ref(), &want_end[..]);
    // The fed tensor itself is never written over.
    assert_eq!(x.values::<f32>().unwrap().as_ref(), &xs[..]);
}

/// A tree of element-wise ops only the step's end reads becomes one `_FusedElementwise` on the
/// worker (an Adam-style update, `var - lr * m / (sqrt(v) + eps)`, and an LSTM cell's
/// elements), and computes the unfused kernels' bits; fetching an intermediate keeps it.
#[test]
fn element_wise_trees_fuse_on_the_worker_with_the_unfused_bits() {
    use crate::support::cluster::InProcessCluster;
    use tessera::client::Session;
    use tessera::graph::{Graph, Output};
    use tessera::proto::RunOptions;
    use tessera::tensor::PartialShape;

    let cluster = InProcessCluster::start(&[("worker", 1)]);
    let session = Session::connect(&cluster.target("worker", 0)).unwrap();
    let dims = [33, 70];
    let mut g = Graph::new();
    let input = |g: &mut Graph, name: &str| {
        g.placeholder(name, DType::Float, PartialShape::new(vec![None, Some(70)]))
            .unwrap()
    };
    let [var, m, v, c, f, i, j, o] =
        ["var", "m", "v", "c", "f", "i", "j", "o"].map(|name| input(&mut g, name));
    let lr = g.scalar("lr", DType::Float, 0.01).unwrap();
    let eps = g.scalar("eps", DType::Float, 1e-7).unwrap();
    let one = g.scalar("one", DType::Float, 1.0).unwrap();
    // The update.
    let root = g.unary("Sqrt", &v).unwrap();
    let denominator = g.add(&root, &eps).unwrap();
    let scaled = g.mul(&m, &lr).unwrap();
    let step = g.div(&scaled, &denominator).unwrap();
    let updated = g.sub(&var, &step).unwrap();
    // The cell.
    let f1 = g.add(&f, &one).unwrap();
    let forget = g.unary("Sigmoid", &f1).unwrap();
    let kept = g.mul(&c, &forget).unwrap();
    let gate = g.unary("Sigmoid", &i).unwrap();
    let candidate = g.unary("Tanh", &j).unwrap();
    let added = g.mul(&gate, &candidate).unwrap();
    let new_c = g.add(&kept, &added).unwrap();
    let squashed = g.unary("Tanh", &new_c).unwrap();
    let out = g.unary("Sigmoid", &o).unwrap();
    let h = g.mul(&squashed, &out).unwrap();
    session.extend(&g.to_graph_def()).unwrap();

    let values: Vec<Tensor> = (0..8).map(|k| seeded(&dims, k as f32)).collect();
    let [var_v, m_v, v_v, c_v, f_v, i_v, j_v, o_v] = [0, 1, 2, 3, 4, 5, 6, 7].map(|k| {
        if k == 2 {
            positive(&dims, 2.0)
        } else {
            values[k].clone()
        }
    });
    let feeds: Vec<(String, Tensor)> = [
        (&var, &var_v),
        (&m, &m_v),
        (&v, &v_v),
        (&c, &c_v),
        (&f, &f_v),
        (&i, &i_v),
        (&j, &j_v),
        (&o, &o_v),
    ]
    .iter()
    .map(|(p, t)| (p.name(), (*t).clone()))
    .collect();
    let feeds: Vec<(&str, Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();

    let one_op = |op: &str, inputs: Vec<Tensor>| unfused1(op, &[], inputs);
    let want_updated = one_op(
        "Sub",
        vec![
            var_v.clone(),
            one_op(
                "RealDiv",
                vec![
                    one_op("Mul", vec![m_v.clone(), scalar(0.01)]),
                    one_op(
                        "AddV2",
                        vec![one_op("Sqrt", vec![v_v.clone()]), scalar(1e-7)],
                    ),
                ],
            ),
        ],
    );
    let want_new_c = one_op(
        "AddV2",
        vec![
            one_op(
                "Mul",
                vec![
                    c_v.clone(),
                    one_op(
                        "Sigmoid",
                        vec![one_op("AddV2", vec![f_v.clone(), scalar(1.0)])],
                    ),
                ],
            ),
            one_op(
                "Mul",
                vec![
                    one_op("Sigmoid", vec![i_v.clone()]),
                    one_op("Tanh", vec![j_v.clone()]),
                ],
            ),
        ],
    );
    let want_h = one_op(
        "Mul",
        vec![
            one_op("Tanh", vec![want_new_c.clone()]),
            one_op("Sigmoid", vec![o_v.clone()]),
        ],
    );

    let options = RunOptions {
        output_partition_graphs: true,
        ..Default::default()
    };
    // Fetches `fetches` (checked against `want`) and checks that exactly the fetched nodes
    // are `_FusedElementwise` in the graphs the worker ran.
    let run_fused = |fetches: [&Output; 2], want: [&Tensor; 2]| {
        let names: Vec<String> = fetches.iter().map(|f| f.name()).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let (got, metadata) = session
            .run_with_options(&feeds, &names, &[], &options)
            .unwrap();
        for ((got, want), name) in got.iter().zip(want).zip(&names) {
            assert_same(name, got, want);
        }
        let mut fused: Vec<String> = metadata
            .partition_graphs
            .iter()
            .flat_map(|g| &g.node)
            .filter(|n| n.op == "_FusedElementwise")
            .map(|n| n.name.clone())
            .collect();
        fused.sort();
        let mut want_names: Vec<String> = names.iter().map(|n| node_name(n)).collect();
        want_names.sort();
        assert_eq!(fused, want_names);
    };
    run_fused([&updated, &h], [&want_updated, &want_h]);
    // new_c fetched too: it ends a tree of its own, which h's tree reads.
    run_fused([&new_c, &h], [&want_new_c, &want_h]);
}

/// `name:0` as a node name.
fn node_name(output: &str) -> String {
    output.split(':').next().unwrap().to_string()
}

/// An optimizer's update written as ops (Keras' `m.assign_add((g - m) * 0.1)`,
/// `w.assign_sub(g * lr)`) fuses with the assign that reads it: the worker runs each as one
/// `_FusedElementwiseAssign`, and the variables get the unfused ops' bits, the one whose
/// update reads its own value included (written in a copy: the read keeps its elements), and
/// one that broadcasts a row (run step by step).
#[test]
fn an_update_tree_fuses_with_its_variables_assign_and_keeps_the_unfused_bits() {
    use crate::support::cluster::InProcessCluster;
    use tessera::client::Session;
    use tessera::graph::attr::value;
    use tessera::graph::builder::NodeSpec;
    use tessera::graph::Graph;
    use tessera::proto::RunOptions;
    use tessera::tensor::PartialShape;

    let cluster = InProcessCluster::start(&[("worker", 1)]);
    let session = Session::connect(&cluster.target("worker", 0)).unwrap();
    let dims = [33, 70];
    let mut g = Graph::new();
    let placeholder = |g: &mut Graph, name: &str| {
        g.placeholder(
            name,
            DType::Float,
            PartialShape::new(vec![Some(33), Some(70)]),
        )
        .unwrap()
    };
    let [w_init, m_init, grad] = ["w_init", "m_init", "grad"].map(|n| placeholder(&mut g, n));
    let w = g.variable("w", &w_init).unwrap();
    let m = g.variable("m", &m_init).unwrap();
    let u = g.variable("u", &w_init).unwrap();
    let row = g
        .placeholder("row", DType::Float, PartialShape::new(vec![Some(70)]))
        .unwrap();
    let biased = g.add(&grad, &row).unwrap();
    let lr = g.scalar("lr", DType::Float, 0.01).unwrap();
    let decay = g.scalar("decay", DType::Float, 0.1).unwrap();
    let scaled = g.mul(&grad, &lr).unwrap();
    let m_now = g.read(&m).unwrap();
    let gap = g.sub(&grad, &m_now).unwrap();
    let step = g.mul(&gap, &decay).unwrap();
    let assign = |g: &mut Graph, op: &str, name: &str, handle, value| {
        g.add_op(
            NodeSpec::new(op)
                .name(name)
                .input(handle)
                .input(value)
                .attr("dtype", value::dtype(DType::Float)),
        )
        .unwrap()
    };
    let update_w = assign(
        &mut g,
        "AssignSubVariableOp",
        "update_w",
        &w.handle,
        &scaled,
    );
    let update_m = assign(&mut g, "AssignAddVariableOp", "update_m", &m.handle, &step);
    let update_u = assign(
        &mut g,
        "AssignAddVariableOp",
        "update_u",
        &u.handle,
        &biased,
    );
    let train = g
        .group("train", &[&update_w, &update_m, &update_u])
        .unwrap();
    session.extend(&g.to_graph_def()).unwrap();

    let (w0, m0) = (seeded(&dims, 1.0), seeded(&dims, 2.0));
    session
        .run(
            &[("w_init:0", w0.clone()), ("m_init:0", m0.clone())],
            &[],
            &[&w.initializer, &m.initializer, &u.initializer],
        )
        .unwrap();
    let (mut w_want, mut m_want) = (
        w0.values::<f32>().unwrap().to_vec(),
        m0.values::<f32>().unwrap().to_vec(),
    );
    let mut u_want = w_want.clone();
    let row_v = seeded(&[70], 9.0);
    let row_values = row_v.values::<f32>().unwrap().to_vec();
    let options = RunOptions {
        output_partition_graphs: true,
        ..Default::default()
    };
    for k in 0..3 {
        let grad_v = seeded(&dims, 3.0 + k as f32);
        let (_, metadata) = session
            .run_with_options(
                &[("grad:0", grad_v.clone()), ("row:0", row_v.clone())],
                &[],
                &[&train],
                &options,
            )
            .unwrap();
        for ((w, m), g) in w_want
            .iter_mut()
            .zip(&mut m_want)
            .zip(grad_v.values::<f32>().unwrap().iter())
        {
            *w -= g * 0.01f32;
            *m += (g - *m) * 0.1f32;
        }
        for (i, (u, g)) in u_want
            .iter_mut()
            .zip(grad_v.values::<f32>().unwrap().iter())
            .enumerate()
        {
            *u += g + row_values[i % 70];
        }
        if k == 0 {
            let mut fused: Vec<(String, String)> = metadata
                .partition_graphs
                .iter()
                .flat_map(|g| &g.node)
                .filter(|n| n.op.starts_with("_FusedElementwise"))
                .map(|n| (n.name.clone(), n.op.clone()))
                .collect();
            fused.sort();
            let assign = "_FusedElementwiseAssign".to_string();
            assert_eq!(
                fused,
                [
                    ("update_m".to_string(), assign.clone()),
                    ("update_u".to_string(), assign.clone()),
                    ("update_w".to_string(), assign)
                ]
            );
        }
    }
    let got = session
        .run(
            &[],
            &[&w.value.name(), &m.value.name(), &u.value.name()],
            &[],
        )
        .unwrap();
    assert_same("w", &got[0], &f32s(&dims, &w_want));
    assert_same("m", &got[1], &f32s(&dims, &m_want));
    assert_same("u", &got[2], &f32s(&dims, &u_want));
}
