//! In-graph towers over two CPU devices train exactly like one device with the whole batch,
//! in the in-process session and on a real daemon with `[devices] cpu = 2`; each tower's ops
//! run on their own device; a device's memory limit fails a step with RESOURCE_EXHAUSTED.
//!
//! The model is the MLP of `support::mlp`. With two towers each tower's loss is the mean over
//! its 4 examples, so the averaged gradient `(g0 + g1) / 2` equals the whole batch's gradient
//! mathematically; only the float summation order differs (4 + 4 then a sum of two, against 8
//! at once).
//!
//! Tolerance: each f32 sum of k terms is within about k·2⁻²⁴ ≈ k·6e-8 relative of the exact
//! one, so one step's gradients agree to ~1e-6 relative; 10 steps of lr 0.5 on weights of size
//! ~1 compound that to well under 1e-5. We allow 1e-5 absolute plus 1e-5 relative.

use std::collections::HashMap;
use std::num::NonZeroU32;

use tessera::client::remote::ConnectOptions;
use tessera::client::{LocalSession, Session, SessionOptions};
use tessera::cluster::TaskConfig;
use tessera::device::DeviceType;
use tessera::device::{CudaProbe, GpuProbe, GpuScan};
use tessera::graph::{Graph, Output, Variable};
use tessera::proto::ConfigProto;
use tessera::server::Server;
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::train::towers::{tower_devices, GradientSum, TowerOptions};
use tessera::Code;

use crate::support::mlp::*;

const TOLERANCE: f32 = 1e-5;

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
    let towers = train(&session, &tower_model(tower_devices(2)));
    assert_same_training(&towers, &reference, TOLERANCE);
}

#[test]
fn each_towers_ops_run_on_its_own_device() {
    let session = two_cpu_session();
    let model = tower_model(tower_devices(2));
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
    assert!(train_step(&session, &model, 0).is_finite());
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
    let model = tower_model(tower_devices(2));
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
        let towers = train(&session, &tower_model(tower_devices(2)));
        assert_same_training(&towers, &reference, TOLERANCE);
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
    let model = tower_model(tower_devices(2));
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
    // x is fed [16, 16] f32 (1024 bytes, fed tensors are the caller's). y = x + x is 1024
    // bytes; z = concat(y, y) on axis 0 is [32, 16] = 32·16·4 = 2048 bytes. With a 1500-byte
    // limit y fits and z does not (y is released when z takes it, so z asks for 2048 alone).
    // (Not a product: a matrix product's packing buffers alone are 512 KiB of scratch.)
    let mut g = Graph::new();
    let x = g
        .placeholder(
            "x",
            DType::Float,
            PartialShape::new(vec![Some(16), Some(16)]),
        )
        .unwrap();
    let y = g.add(&x, &x).unwrap();
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

    // With room for it the same step runs: every entry of ones + ones is 2.
    let session = LocalSession::local_with(SessionOptions {
        cpu_memory_limit: Some(4096),
        ..Default::default()
    });
    session.extend(&graph).unwrap();
    let out = session.run(&[("x:0", ones())], &[&z.name()], &[]).unwrap();
    assert_eq!(out[0].dims(), &[32, 16]);
    assert!(out[0].values::<f32>().unwrap().iter().all(|&v| v == 2.0));
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

#[test]
fn a_session_asking_for_gpus_gets_those_the_host_has_and_soft_places_without_them() {
    let found = match CudaProbe.scan() {
        GpuScan::Found(gpus) => gpus.len(),
        GpuScan::Unavailable { .. } => 0,
    };
    let session = Session::local_with(SessionOptions {
        gpu_count: 2,
        ..Default::default()
    });
    let gpus: Vec<&str> = session
        .as_local()
        .unwrap()
        .devices()
        .iter()
        .filter(|d| d.device_type() == DeviceType::Gpu)
        .map(|d| d.name())
        .collect();
    assert_eq!(gpus.len(), found.min(2), "{gpus:?}");
    if let Some(first) = gpus.first() {
        assert_eq!(*first, "/job:localhost/replica:0/task:0/device:GPU:0");
    }
    // A tower asking for GPU:0 trains like one CPU: on the GPU where there is one (within the
    // GPU kernels' tolerance, see tests/gpu.rs), else soft-placed on the CPU.
    let reference = train(&Session::local(), &single_device_model());
    let tower = train(&session, &tower_model(vec!["/device:GPU:0".into()]));
    assert_same_training(&tower, &reference, 1e-4);
}

fn all_reduce_options(devices: Vec<String>) -> TowerOptions {
    TowerOptions {
        gradient_sum: GradientSum::AllReduce,
        ..TowerOptions::new(devices)
    }
}

#[test]
fn towers_summing_gradients_with_all_reduce_train_like_one_device() {
    let reference = train(&Session::local(), &single_device_model());
    let model = tower_model_with(&all_reduce_options(tower_devices(2)));
    // Each variable's gradient is summed by one NcclAllReduce per tower, on that tower's device.
    let session = two_cpu_session();
    session.extend(&model.graph.to_graph_def()).unwrap();
    let placement = session.as_local().unwrap().placement().unwrap();
    let mut members = [0usize; 2];
    for node in model.graph.to_graph_def().node.iter() {
        if node.op == "NcclAllReduce" {
            let tower = usize::from(placement[&node.name].ends_with("CPU:1"));
            assert!(
                node.name.starts_with(&format!("tower_{tower}/all_reduce")),
                "{}",
                node.name
            );
            members[tower] += 1;
        }
    }
    assert_eq!(members, [4, 4], "one member per variable per tower");
    let towers = train(&two_cpu_session(), &model);
    assert_same_training(&towers, &reference, TOLERANCE);
}

#[test]
fn all_reduce_towers_train_on_a_daemon_with_two_cpus() {
    let reference = train(&Session::local(), &single_device_model());
    let server = daemon(2);
    let session = connect_hard(&server);
    let towers = train(
        &session,
        &tower_model_with(&all_reduce_options(tower_devices(2))),
    );
    assert_same_training(&towers, &reference, TOLERANCE);
    session.close().unwrap();
    server.stop();
}

#[test]
fn an_all_reduce_whose_other_member_never_runs_fails_the_step_naming_it() {
    // Two members are declared but only CPU:0's runs: the step fails at its deadline, naming
    // the all-reduce and the device that came, and the session stays usable.
    let mut g = Graph::new();
    let x = g
        .with_device("/device:CPU:0", |g| g.scalar("x", DType::Float, 2.0))
        .unwrap();
    let lone = g
        .with_device("/device:CPU:0", |g| {
            g.nccl_all_reduce(&x, "sum", 2, "lonely")
        })
        .unwrap();
    let session = Session::local_with(SessionOptions {
        device_count: 2,
        step_timeout: Some(std::time::Duration::from_millis(300)),
        ..Default::default()
    });
    session.extend(&g.to_graph_def()).unwrap();
    let err = session.run(&[], &[&lone.name()], &[]).unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(
        err.message().contains("all-reduce `lonely`: 1 of 2"),
        "{err}"
    );
    assert!(err.message().contains("CPU:0"), "{err}");
    assert_eq!(
        session.run(&[], &[&x.name()], &[]).unwrap()[0]
            .scalar_value::<f32>()
            .unwrap(),
        2.0
    );
}

/// A table of 10 rows of 3 read by row gathers: the loss is the mean over the batch of
/// `Σ_c table[ids[b, c]] · w`, `w` fixed, trained by gradient descent on one device or over
/// `towers` CPU towers. Returns the graph, the table and the train op.
fn table_model(towers: usize) -> (Graph, Variable, String) {
    use tessera::train::optimizer::Optimizer;
    let mut g = Graph::new();
    let ids = g
        .placeholder("ids", DType::Int64, PartialShape::new([None, Some(2)]))
        .unwrap();
    let init: Vec<f32> = (0..30).map(|i| i as f32 / 10.0 - 1.5).collect();
    let init = g
        .constant(&Tensor::from_vec([10, 3], init).unwrap())
        .unwrap();
    let table = g.variable("table", &init).unwrap();
    let w = g
        .constant(&Tensor::from_vec([3, 1], vec![1.0f32, -2.0, 0.5]).unwrap())
        .unwrap();
    let table_for_loss = table.clone();
    let loss = move |g: &mut Graph, inputs: &[Output]| -> tessera::Result<Output> {
        let flat = g.reshape_to(&inputs[0], &[-1])?;
        let rows = g.resource_gather(&table_for_loss.handle, &flat, DType::Float, 0)?;
        let scores = g.matmul(&rows, &w)?;
        g.mean(&scores, &[0, 1], false)
    };
    let optimizer = Optimizer::gradient_descent(0.5);
    let train = if towers == 1 {
        let l = loss(&mut g, std::slice::from_ref(&ids)).unwrap();
        optimizer
            .minimize_vars(&mut g, &l, std::slice::from_ref(&table), None)
            .unwrap()
    } else {
        let options = TowerOptions::new(tower_devices(towers));
        let built = tessera::train::towers::build_towers(
            &mut g,
            std::slice::from_ref(&ids),
            std::slice::from_ref(&table),
            &optimizer,
            None,
            &options,
            loss,
        )
        .unwrap();
        assert!(
            matches!(
                built.grads_and_vars[0].0,
                Some(tessera::graph::indexed_slices::GradientTensor::Slices(_))
            ),
            "the towers' average of a gathered table's gradients stays sparse"
        );
        built.train_op
    };
    (g, table, train)
}

#[test]
fn towers_average_a_gathered_tables_gradients_as_rows_and_train_like_one_device() {
    let ids = Tensor::from_vec([4, 2], vec![1i64, 3, 3, 5, 1, 1, 7, 3]).unwrap();
    let run = |session: &Session, towers: usize| {
        let (g, table, train) = table_model(towers);
        session.extend(&g.to_graph_def()).unwrap();
        session.run(&[], &[], &[&table.initializer]).unwrap();
        for _ in 0..3 {
            session
                .run(&[("ids:0", ids.clone())], &[], &[&train])
                .unwrap();
        }
        let values = session.run(&[], &[&table.value.name()], &[]).unwrap();
        values[0].values::<f32>().unwrap().to_vec()
    };
    let one = run(&Session::local(), 1);
    let two = run(&two_cpu_session(), 2);
    for (i, (a, b)) in one.iter().zip(&two).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6,
            "value {i}: {a} one device, {b} two towers"
        );
    }
    // Only the rows read (1, 3, 5, 7) moved.
    for row in 0..10 {
        let moved = (0..3).any(|c| one[row * 3 + c] != (row * 3 + c) as f32 / 10.0 - 1.5);
        assert_eq!(moved, [1, 3, 5, 7].contains(&row), "row {row}");
    }
}
