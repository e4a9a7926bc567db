//! In-graph towers over two CPU devices train exactly like one device with the whole batch,
//! in the in-process session and on a real daemon with `[devices] cpu = 2`; each tower's ops
//! run on their own device; a device's memory limit fails a step with RESOURCE_EXHAUSTED.
//!
//! The model is a 4-5-3 MLP (ReLU, softmax cross-entropy, batch-mean loss) with fixed initial
//! weights, trained by gradient descent (learning rate 0.5) for 10 steps on 8 examples whose
//! features and labels follow closed formulas. With two towers each tower's loss is the mean
//! over its 4 examples, so the averaged gradient `(g0 + g1) / 2` equals the whole batch's
//! gradient mathematically; only the float summation order differs (4 + 4 then a sum of two,
//! against 8 at once).
//!
//! Tolerance: each f32 sum of k terms is within about k·2⁻²⁴ ≈ k·6e-8 relative of the exact
//! one, so one step's gradients agree to ~1e-6 relative; 10 steps of lr 0.5 on weights of size
//! ~1 compound that to well under 1e-5. We allow 1e-5 absolute plus 1e-5 relative.

use std::collections::HashMap;
use std::num::NonZeroU32;

use tessera::client::remote::ConnectOptions;
use tessera::client::{LocalSession, Session, SessionOptions};
use tessera::cluster::TaskConfig;
use tessera::graph::{Graph, Output, Variable};
use tessera::proto::ConfigProto;
use tessera::server::Server;
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::train::optimizer::Optimizer;
use tessera::train::towers::{build_towers, tower_devices, TowerOptions};
use tessera::Code;

const BATCH: usize = 8;
const FEATURES: usize = 4;
const HIDDEN: usize = 5;
const CLASSES: usize = 3;
const STEPS: usize = 10;
const LEARNING_RATE: f64 = 0.5;
const TOLERANCE: f32 = 1e-5;

/// Row `r` of the batch: x[r][c] = sin(1.3 r + 0.7 c + 0.1 step), label (r + step) mod 3.
fn batch(step: usize) -> (Tensor, Tensor) {
    let mut x = Vec::with_capacity(BATCH * FEATURES);
    let mut y = vec![0f32; BATCH * CLASSES];
    for r in 0..BATCH {
        for c in 0..FEATURES {
            x.push((1.3 * r as f32 + 0.7 * c as f32 + 0.1 * step as f32).sin());
        }
        y[r * CLASSES + (r + step) % CLASSES] = 1.0;
    }
    (
        Tensor::from_vec([BATCH, FEATURES], x).unwrap(),
        Tensor::from_vec([BATCH, CLASSES], y).unwrap(),
    )
}

/// Fixed initial values: w[i][j] = 0.3 cos(i + 2j + k) for the k-th variable.
fn initial(dims: &[usize], k: usize) -> Tensor {
    let n: usize = dims.iter().product();
    let cols = *dims.last().unwrap();
    let values = (0..n)
        .map(|e| 0.3 * ((e / cols) as f32 + 2.0 * (e % cols) as f32 + k as f32).cos())
        .collect();
    Tensor::from_vec(dims.to_vec(), values).unwrap()
}

struct Model {
    graph: Graph,
    vars: Vec<Variable>,
    init: String,
    train_op: String,
    loss: Output,
}

/// The variables (on CPU:0, where TensorFlow keeps shared tower variables).
fn variables(g: &mut Graph) -> Vec<Variable> {
    g.with_device("/device:CPU:0", |g| {
        let shapes: [(&str, Vec<usize>); 4] = [
            ("w1", vec![FEATURES, HIDDEN]),
            ("b1", vec![HIDDEN]),
            ("w2", vec![HIDDEN, CLASSES]),
            ("b2", vec![CLASSES]),
        ];
        let mut vars = Vec::new();
        for (k, (name, dims)) in shapes.iter().enumerate() {
            let value = g.constant(&initial(dims, k))?;
            vars.push(g.variable(name, &value)?);
        }
        Ok(vars)
    })
    .unwrap()
}

/// The tower function: batch-mean softmax cross-entropy of the MLP on `inputs` = [x, labels].
fn mlp_loss(g: &mut Graph, vars: &[Variable], inputs: &[Output]) -> tessera::Result<Output> {
    let w1 = g.read_variable(&vars[0].handle)?;
    let b1 = g.read_variable(&vars[1].handle)?;
    let w2 = g.read_variable(&vars[2].handle)?;
    let b2 = g.read_variable(&vars[3].handle)?;
    let h = g.matmul(&inputs[0], &w1)?;
    let h = g.bias_add(&h, &b1)?;
    let h = g.relu(&h)?;
    let logits = g.matmul(&h, &w2)?;
    let logits = g.bias_add(&logits, &b2)?;
    let (per_row, _) = g.softmax_cross_entropy(&logits, &inputs[1])?;
    g.mean(&per_row, &[0], false)
}

fn placeholders(g: &mut Graph) -> Vec<Output> {
    g.with_device("/device:CPU:0", |g| {
        Ok(vec![
            g.placeholder(
                "x",
                DType::Float,
                PartialShape::new(vec![None, Some(FEATURES)]),
            )?,
            g.placeholder(
                "labels",
                DType::Float,
                PartialShape::new(vec![None, Some(CLASSES)]),
            )?,
        ])
    })
    .unwrap()
}

/// One device, whole batch: `minimize` on the batch-mean loss.
fn single_device_model() -> Model {
    let mut g = Graph::new();
    let inputs = placeholders(&mut g);
    let vars = variables(&mut g);
    let loss = mlp_loss(&mut g, &vars, &inputs).unwrap();
    let train_op = Optimizer::gradient_descent(LEARNING_RATE)
        .minimize_vars(&mut g, &loss, &vars, None)
        .unwrap();
    let init = g.global_variables_initializer().unwrap();
    Model {
        graph: g,
        vars,
        init,
        train_op,
        loss,
    }
}

/// `towers` towers on CPU:0..towers-1.
fn tower_model(towers: usize) -> Model {
    let mut g = Graph::new();
    let inputs = placeholders(&mut g);
    let vars = variables(&mut g);
    let built = build_towers(
        &mut g,
        &inputs,
        &vars,
        &Optimizer::gradient_descent(LEARNING_RATE),
        None,
        &TowerOptions::new(tower_devices(towers)),
        |g, parts| mlp_loss(g, &vars, parts),
    )
    .unwrap();
    let init = g.global_variables_initializer().unwrap();
    Model {
        graph: g,
        vars,
        init,
        train_op: built.train_op,
        loss: built.loss,
    }
}

/// Trains `model` for STEPS steps; returns the losses before each step and the final values of
/// the variables.
fn train(session: &Session, model: &Model) -> (Vec<f32>, Vec<Vec<f32>>) {
    session.extend(&model.graph.to_graph_def()).unwrap();
    session.run(&[], &[], &[&model.init]).unwrap();
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (x, y) = batch(step);
        let out = session
            .run(
                &[("x:0", x), ("labels:0", y)],
                &[&model.loss.name()],
                &[&model.train_op],
            )
            .unwrap();
        losses.push(out[0].scalar_value::<f32>().unwrap());
    }
    let reads: Vec<String> = model.vars.iter().map(|v| v.value.name()).collect();
    let reads: Vec<&str> = reads.iter().map(String::as_str).collect();
    let values = session
        .run(&[], &reads, &[])
        .unwrap()
        .iter()
        .map(|t| t.values::<f32>().unwrap().into_owned())
        .collect();
    (losses, values)
}

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let bound = TOLERANCE + TOLERANCE * w.abs();
        assert!(
            (g - w).abs() <= bound,
            "{what}[{i}]: towers {g}, one device {w} (|diff| {} > {bound})",
            (g - w).abs()
        );
    }
}

fn assert_same_training(
    (tower_losses, tower_vars): &(Vec<f32>, Vec<Vec<f32>>),
    (losses, vars): &(Vec<f32>, Vec<Vec<f32>>),
) {
    assert_close("loss", tower_losses, losses);
    for (k, (t, o)) in tower_vars.iter().zip(vars).enumerate() {
        assert_close(&format!("variable {k}"), t, o);
    }
    // The runs trained: the parameters moved, and the loss fell.
    assert!(
        losses[STEPS - 1] < losses[0],
        "loss did not fall: {losses:?}"
    );
}

fn two_cpu_session() -> Session {
    Session::local_with(SessionOptions {
        device_count: 2,
        allow_soft_placement: false,
        ..Default::default()
    })
}

#[test]
fn two_towers_in_process_train_like_one_device_with_the_whole_batch() {
    let reference = train(&Session::local(), &single_device_model());
    let session = two_cpu_session();
    let towers = train(&session, &tower_model(2));
    assert_same_training(&towers, &reference);
}

#[test]
fn each_towers_ops_run_on_its_own_device() {
    let session = two_cpu_session();
    let model = tower_model(2);
    session.extend(&model.graph.to_graph_def()).unwrap();
    let placement = session.as_local().unwrap().placement().unwrap();
    let cpu = |i: usize| format!("/job:localhost/replica:0/task:0/device:CPU:{i}");
    let mut per_tower = [0usize; 2];
    for node in &model.graph.to_graph_def().node {
        let device = &placement[&node.name];
        for (i, count) in per_tower.iter_mut().enumerate() {
            // Reads of the shared variables run where the variables live (CPU:0); everything
            // else a tower adds, forward and backward, runs on the tower's device.
            if node.name.starts_with(&format!("tower_{i}/")) && node.op != "ReadVariableOp" {
                assert_eq!(device, &cpu(i), "node `{}` ({})", node.name, node.op);
                *count += 1;
            }
        }
        if node.name.starts_with("split_batch/") || node.name.starts_with("average_gradients/") {
            assert_eq!(device, &cpu(0), "node `{}`", node.name);
        }
        if node.op == "VarHandleOp" || node.op == "ResourceApplyGradientDescent" {
            assert_eq!(device, &cpu(0), "node `{}`", node.name);
        }
    }
    // Each tower has its forward MatMuls and their gradients, at least.
    assert!(per_tower.iter().all(|&c| c >= 6), "{per_tower:?}");
    // The tower devices really run them: a step crosses CPU:0 -> CPU:1 and back.
    session.run(&[], &[], &[&model.init]).unwrap();
    let (x, y) = batch(0);
    let out = session
        .run(
            &[("x:0", x), ("labels:0", y)],
            &[&model.loss.name()],
            &[&model.train_op],
        )
        .unwrap();
    assert!(out[0].scalar_value::<f32>().unwrap().is_finite());
}

#[test]
fn a_multi_device_session_takes_short_names_and_repeated_fetches() {
    // c = a + b with a on CPU:0 and b, c on CPU:1; fetch `c` (no `:0`) twice and `a:0`.
    let mut g = Graph::new();
    let a = g
        .with_device("/device:CPU:0", |g| g.scalar("a", DType::Float, 2.0))
        .unwrap();
    let c = g
        .with_device("/device:CPU:1", |g| {
            let b = g.scalar("b", DType::Float, 3.0)?;
            g.with_name_scope("c", |g| g.add(&a, &b))
        })
        .unwrap();
    let session = two_cpu_session();
    session.extend(&g.to_graph_def()).unwrap();
    let out = session.run(&[], &[&c.node, &c.name(), "a:0"], &[]).unwrap();
    let values: Vec<f32> = out.iter().map(|t| t.scalar_value().unwrap()).collect();
    assert_eq!(values, [5.0, 5.0, 2.0]);
    // Feeding the CPU:0 input replaces it on both devices: 10 + 3.
    let out = session
        .run(&[("a", Tensor::scalar(10f32))], &[&c.node], &[])
        .unwrap();
    assert_eq!(out[0].scalar_value::<f32>().unwrap(), 13.0);
    let placement = session.as_local().unwrap().placement().unwrap();
    assert!(placement[&c.node].ends_with("CPU:1"), "{placement:?}");
}

#[test]
fn a_batch_the_towers_do_not_divide_fails_the_step_naming_the_split() {
    let session = two_cpu_session();
    let model = tower_model(2);
    session.extend(&model.graph.to_graph_def()).unwrap();
    session.run(&[], &[], &[&model.init]).unwrap();
    let x = Tensor::from_vec([3, FEATURES], vec![0f32; 3 * FEATURES]).unwrap();
    let y = Tensor::from_vec([3, CLASSES], vec![0f32; 3 * CLASSES]).unwrap();
    let err = session
        .run(&[("x:0", x), ("labels:0", y)], &[], &[&model.train_op])
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("split_batch/"), "{err}");
}

/// A daemon on 127.0.0.1:0 with `cpu` CPU devices and hard placement.
fn daemon(cpu: u32) -> Server {
    let mut config = TaskConfig::local();
    config.devices.cpu_count = NonZeroU32::new(cpu).unwrap();
    config.devices.gpu_count = Some(0);
    // The server's default is OR-ed into each session's `allow_soft_placement`.
    config.devices.soft_placement = false;
    Server::start(config).unwrap()
}

/// Hard placement: a node requesting `/device:CPU:1` runs there or the step fails.
fn connect_hard(server: &Server) -> Session {
    let options = ConnectOptions {
        config: ConfigProto {
            allow_soft_placement: false,
            ..Default::default()
        },
        ..Default::default()
    };
    Session::connect_with(&server.target(), options).unwrap()
}

#[test]
fn two_towers_on_a_daemon_with_two_cpus_train_like_one_device() {
    let reference = train(&Session::local(), &single_device_model());
    let server = daemon(2);
    let devices = {
        let session = connect_hard(&server);
        let towers = train(&session, &tower_model(2));
        assert_same_training(&towers, &reference);
        let names: Vec<String> = session
            .as_remote()
            .unwrap()
            .list_devices()
            .unwrap()
            .into_iter()
            .map(|d| d.name)
            .collect();
        session.close().unwrap();
        names
    };
    assert!(
        devices.contains(&"/job:localhost/replica:0/task:0/device:CPU:1".to_string()),
        "{devices:?}"
    );
    server.stop();

    // The same graph cannot be placed on a daemon with one CPU: tower 1's ops really asked
    // for CPU:1, and the two-CPU daemon put them there.
    let server = daemon(1);
    let session = connect_hard(&server);
    let model = tower_model(2);
    session.extend(&model.graph.to_graph_def()).unwrap();
    let (x, y) = batch(0);
    let err = session
        .run(&[("x:0", x), ("labels:0", y)], &[], &[&model.train_op])
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("CPU:1"), "{err}");
    session.close().unwrap();
    server.stop();
}

#[test]
fn a_step_over_the_devices_memory_limit_is_resource_exhausted_naming_node_and_sizes() {
    // x is fed [16, 16] f32 (1024 bytes, fed tensors are the caller's). y = x·x is 1024
    // bytes; z = concat(y, y) on axis 0 is [32, 16] = 32·16·4 = 2048 bytes. With a 1500-byte
    // limit y fits and z does not (y is released when z takes it, so z asks for 2048 alone).
    let mut g = Graph::new();
    let x = g
        .placeholder(
            "x",
            DType::Float,
            PartialShape::new(vec![Some(16), Some(16)]),
        )
        .unwrap();
    let y = g.matmul(&x, &x).unwrap();
    let z = g
        .with_name_scope("z", |g| g.concat(&[y.clone(), y.clone()], 0))
        .unwrap();
    let graph = g.to_graph_def();
    let ones = || Tensor::from_vec([16, 16], vec![1f32; 256]).unwrap();

    let session = LocalSession::local_with(SessionOptions {
        cpu_memory_limit: Some(1500),
        ..Default::default()
    });
    session.extend(&graph).unwrap();
    let err = session
        .run(&[("x:0", ones())], &[&z.name()], &[])
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    for part in [
        format!("`{}`", z.node),
        "2048 bytes".to_string(),
        "limit is 1500 bytes".to_string(),
        "CPU:0".to_string(),
    ] {
        assert!(err.message().contains(&part), "{part} missing from: {err}");
    }
    // The session survives, and nothing stays charged after the failed step.
    let budget = session.device().memory().unwrap().clone();
    assert_eq!(budget.in_use(), 0);

    // With room for it the same step runs: every entry of ones·ones is 16.
    let session = LocalSession::local_with(SessionOptions {
        cpu_memory_limit: Some(4096),
        ..Default::default()
    });
    session.extend(&graph).unwrap();
    let out = session.run(&[("x:0", ones())], &[&z.name()], &[]).unwrap();
    assert_eq!(out[0].dims(), &[32, 16]);
    assert!(out[0].values::<f32>().unwrap().iter().all(|&v| v == 16.0));
    let budget = session.device().memory().unwrap();
    assert_eq!(budget.in_use(), 0, "charges are given back after the step");
    assert!(
        budget.peak() >= 2048 && budget.peak() <= 4096,
        "{}",
        budget.peak()
    );
}

#[test]
fn placement_of_a_single_device_session_is_its_device() {
    let session = LocalSession::local();
    let model = single_device_model();
    session.extend(&model.graph.to_graph_def()).unwrap();
    let placement: HashMap<String, String> = session.placement().unwrap();
    assert_eq!(placement.len(), model.graph.to_graph_def().node.len());
    assert!(placement
        .values()
        .all(|d| d == "/job:localhost/replica:0/task:0/device:CPU:0"));
}
