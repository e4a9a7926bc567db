//! Step traces (`RunOptions.trace_level = FULL_TRACE`): in process, on both of the executor's
//! engines, and on a cluster of 1 ps + 1 worker (in-process daemons on `127.0.0.1:0`), where
//! the master asks both tasks to record and merges what they return into one `StepStats`.
//!
//! Each traced node must be there once per run (once per iteration in a loop), with its
//! start on the wall clock inside the client's call, its kernel inside its own span, and its
//! outputs' dtypes, shapes and bytes; a `_Recv` has the tensor it received. A step without a
//! trace returns empty metadata.

use std::collections::{HashMap, HashSet};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::support::cluster::InProcessCluster;
use serde_json::Value;
use tessera::client::{chrome_trace, Session};
use tessera::graph::Graph;
use tessera::proto::run_options::TraceLevel;
use tessera::proto::{GraphDef, NodeExecStats, RunMetadata, RunOptions, StepStats};
use tessera::tensor::{DType, PartialShape, Tensor};

const LOCAL_CPU: &str = "/job:localhost/replica:0/task:0/device:CPU:0";
const PS_CPU: &str = "/job:ps/replica:0/task:0/device:CPU:0";
const WORKER_CPU: &str = "/job:worker/replica:0/task:0/device:CPU:0";

fn full_trace() -> RunOptions {
    RunOptions {
        trace_level: TraceLevel::FullTrace as i32,
        output_partition_graphs: true,
        ..Default::default()
    }
}

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// Runs one step with `options`, returning the fetches and the metadata, and the wall-clock
/// window (microseconds) the call took.
fn run_traced(
    session: &Session,
    feeds: &[(&str, Tensor)],
    fetches: &[&str],
    targets: &[&str],
    options: &RunOptions,
) -> (Vec<Tensor>, RunMetadata, (i64, i64)) {
    let before = now_micros();
    let (out, metadata) = session
        .run_with_options(feeds, fetches, targets, options)
        .unwrap();
    (out, metadata, (before, now_micros()))
}

/// Each device's node entries by node name.
fn by_device(stats: &StepStats) -> HashMap<&str, HashMap<&str, Vec<&NodeExecStats>>> {
    let mut devices = HashMap::new();
    for device in &stats.dev_stats {
        let nodes: &mut HashMap<&str, Vec<&NodeExecStats>> =
            devices.entry(device.device.as_str()).or_default();
        for node in &device.node_stats {
            nodes.entry(node.node_name.as_str()).or_default().push(node);
        }
    }
    devices
}

/// Checks every entry's times: the start inside the call's window, the kernel inside the
/// node's span, the node scheduled before it started; a thread the device names; the label
/// TensorFlow's form.
fn assert_sane(stats: &StepStats, (before, after): (i64, i64)) {
    for device in &stats.dev_stats {
        for n in &device.node_stats {
            let what = format!("{} on {}: {n:?}", n.node_name, device.device);
            assert!(
                before <= n.all_start_micros && n.all_start_micros <= after,
                "start outside the call ({before}..{after}): {what}"
            );
            assert!(n.scheduled_micros <= n.all_start_micros, "{what}");
            assert!(0 <= n.op_start_rel_nanos, "{what}");
            assert!(n.op_start_rel_nanos <= n.op_end_rel_nanos, "{what}");
            assert!(n.op_end_rel_nanos <= n.all_end_rel_nanos, "{what}");
            assert!(n.op_end_rel_micros <= n.all_end_rel_micros, "{what}");
            assert!(
                n.all_start_micros + n.all_end_rel_micros <= after,
                "ends after the call: {what}"
            );
            assert!(device.thread_names.contains_key(&n.thread_id), "{what}");
            assert!(
                n.timeline_label.starts_with(&format!("{} = ", n.node_name)),
                "{what}"
            );
        }
    }
}

/// The names of every node of the graphs `device` ran.
fn partition_nodes<'a>(graphs: &'a [GraphDef], device: &str) -> HashSet<&'a str> {
    graphs
        .iter()
        .flat_map(|g| &g.node)
        .filter(|n| n.device == device)
        .map(|n| n.name.as_str())
        .collect()
}

/// The output bytes of entry `n`, by slot.
fn output_bytes(n: &NodeExecStats) -> Vec<(i32, i64)> {
    n.output
        .iter()
        .map(|o| {
            let allocation = o
                .tensor_description
                .as_ref()
                .and_then(|d| d.allocation_description.as_ref())
                .unwrap();
            (o.slot, allocation.requested_bytes)
        })
        .collect()
}

fn output_dims(n: &NodeExecStats, slot: usize) -> Vec<i64> {
    n.output[slot]
        .tensor_description
        .as_ref()
        .unwrap()
        .shape
        .as_ref()
        .unwrap()
        .dim
        .iter()
        .map(|d| d.size)
        .collect()
}

#[test]
fn a_traced_local_step_records_every_node_with_its_times_and_outputs() {
    let mut g = Graph::new();
    let x = g
        .placeholder("x", DType::Float, PartialShape::new(vec![None, Some(3)]))
        .unwrap();
    let w = g
        .constant(&Tensor::from_vec([3, 2], vec![1f32, 2., 3., 4., 5., 6.]).unwrap())
        .unwrap();
    let y = g.matmul(&x, &w).unwrap();
    let z = g.add(&y, &y).unwrap();
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    let feed = Tensor::from_vec([4, 3], vec![1f32; 12]).unwrap();

    let (out, metadata, window) = run_traced(
        &session,
        &[("x:0", feed.clone())],
        &[&z.name()],
        &[],
        &full_trace(),
    );
    assert_eq!(out[0].dims(), [4, 2]);
    let stats = metadata.step_stats.as_ref().unwrap();
    assert_sane(stats, window);
    let devices = by_device(stats);
    assert_eq!(devices.keys().copied().collect::<Vec<_>>(), [LOCAL_CPU]);
    let nodes = &devices[LOCAL_CPU];
    // Every node the step ran, once (the fed placeholder is replaced by its feed). A session
    // on one device runs its graph unplaced.
    assert_eq!(metadata.partition_graphs.len(), 1);
    let ran: HashSet<&str> = metadata.partition_graphs[0]
        .node
        .iter()
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(ran.len(), 3, "{ran:?}");
    assert_eq!(nodes.keys().copied().collect::<HashSet<_>>(), ran);
    assert!(nodes.values().all(|n| n.len() == 1));
    let matmul = nodes[y.node.as_str()][0];
    assert_eq!(
        matmul.timeline_label,
        format!("{} = MatMul(x, {})", y.node, w.node)
    );
    assert_eq!(output_bytes(matmul), [(0, 4 * 2 * 4)]);
    assert_eq!(output_dims(matmul, 0), [4, 2]);

    // The same step untraced: empty metadata, and the same values.
    let (again, metadata, _) = run_traced(
        &session,
        &[("x:0", feed)],
        &[&z.name()],
        &[],
        &RunOptions::default(),
    );
    assert_eq!(metadata, RunMetadata::default());
    assert_eq!(
        again[0].values::<f32>().unwrap(),
        out[0].values::<f32>().unwrap()
    );
}

#[test]
fn a_traced_loop_records_its_control_flow_nodes_every_iteration() {
    let mut g = Graph::new();
    let i0 = g.const_i32("i0", &[], &[0]).unwrap();
    let n = g.const_i32("n", &[], &[3]).unwrap();
    let out = g
        .while_loop(
            |g, v| g.binary("Less", &v[0], &n),
            |g, v| {
                let one = g.const_i32("one", &[], &[1])?;
                Ok(vec![g.add(&v[0], &one)?])
            },
            &[i0],
            10,
            "loop",
        )
        .unwrap();
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    let (fetched, metadata, window) =
        run_traced(&session, &[], &[&out[0].name()], &[], &full_trace());
    assert_eq!(fetched[0].scalar_value::<i32>().unwrap(), 3);
    let stats = metadata.step_stats.as_ref().unwrap();
    assert_sane(stats, window);
    let nodes = &by_device(stats)[LOCAL_CPU];
    let count = |op: &str| {
        stats.dev_stats[0]
            .node_stats
            .iter()
            .filter(|n| n.timeline_label.contains(&format!(" = {op}(")))
            .count()
    };
    // The loop's Merge runs once per test (3 iterations and the last, false one), the body's
    // add once per iteration; the frames engine records Merge, which runs no kernel.
    assert_eq!(count("Merge"), 4, "{:?}", nodes.keys());
    assert_eq!(count("Switch"), 4);
    assert_eq!(count("AddV2"), 3);
    assert_eq!(count("Exit"), 1);
    let merge = stats.dev_stats[0]
        .node_stats
        .iter()
        .find(|n| n.timeline_label.contains(" = Merge("))
        .unwrap();
    // Its value and its value_index.
    assert_eq!(output_bytes(merge), [(0, 4), (1, 4)]);
}

/// `loss = sum((x·w)²)` with `w` a variable on the ps and the rest on the worker; the train op
/// moves `w` by gradient descent on the ps.
struct Model {
    graph: Graph,
    x: String,
    loss: String,
    init: String,
    train: String,
}

fn model() -> Model {
    let mut g = Graph::new();
    let w = g
        .with_device("/job:ps/task:0", |g| {
            let initial = g.constant(&Tensor::from_vec(
                [3, 2],
                vec![0.5f32, -1., 2., 0.25, 1., -0.5],
            )?)?;
            g.variable("w", &initial)
        })
        .unwrap();
    let init = g.global_variables_initializer().unwrap();
    let x = g
        .placeholder("x", DType::Float, PartialShape::new(vec![None, Some(3)]))
        .unwrap();
    let (loss, grad) = g
        .with_device("/job:worker/task:0", |g| {
            let h = g.matmul(&x, &w.value)?;
            let hh = g.mul(&h, &h)?;
            let loss = g.sum(&hh, &[0, 1], false)?;
            // d loss / d w = 2 xᵀ h
            let two = g.scalar("two", DType::Float, 2.0)?;
            let xh = g.matmul_t(&x, &h, true, false)?;
            Ok((loss, g.mul(&two, &xh)?))
        })
        .unwrap();
    let lr = g.scalar("lr", DType::Float, 0.01).unwrap();
    let train = g.apply_gradient_descent(&w.handle, &lr, &grad).unwrap();
    Model {
        graph: g,
        x: x.name(),
        loss: loss.name(),
        init,
        train,
    }
}

#[test]
fn a_traced_step_on_a_ps_and_a_worker_returns_both_tasks_nodes() {
    let cluster = InProcessCluster::start(&[("ps", 1), ("worker", 1)]);
    let m = model();
    let session = Session::connect(&cluster.target("worker", 0)).unwrap();
    session.extend(&m.graph.to_graph_def()).unwrap();
    session.run(&[], &[], &[&m.init]).unwrap();
    let batch = Tensor::from_vec([2, 3], vec![1f32, 0.5, -1., 0.25, 2., 1.]).unwrap();

    let (out, metadata, window) = run_traced(
        &session,
        &[(&m.x, batch.clone())],
        &[&m.loss],
        &[&m.train],
        &full_trace(),
    );
    assert!(out[0].scalar_value::<f32>().unwrap() > 0.0);
    let stats = metadata.step_stats.as_ref().expect("step stats");
    assert_sane(stats, window);
    let devices = by_device(stats);
    let mut names: Vec<&str> = devices.keys().copied().collect();
    names.sort_unstable();
    assert_eq!(names, [PS_CPU, WORKER_CPU]);

    // Every node of both partitions, once; and nothing else.
    assert_eq!(metadata.partition_graphs.len(), 2);
    for device in [PS_CPU, WORKER_CPU] {
        let ran = partition_nodes(&metadata.partition_graphs, device);
        let traced: HashSet<&str> = devices[device].keys().copied().collect();
        assert_eq!(traced, ran, "{device}");
        assert!(devices[device].values().all(|n| n.len() == 1), "{device}");
    }

    // Receives on both sides, each with the tensor it received: the worker's of `w` (3×2
    // floats, 24 bytes, from the ps) and of `x` (from the client); the ps's of the gradient
    // (3×2, from the worker).
    let recvs = |device: &str| -> Vec<&NodeExecStats> {
        devices[device]
            .values()
            .flatten()
            .copied()
            .filter(|n| n.timeline_label.contains(" = _Recv("))
            .collect()
    };
    for device in [PS_CPU, WORKER_CPU] {
        let received = recvs(device);
        assert!(!received.is_empty(), "no _Recv on {device}");
        for recv in received {
            let bytes = output_bytes(recv);
            assert!(bytes.len() == 1 && bytes[0].1 > 0, "{recv:?}");
        }
    }
    let from = |device: &str, peer: &str| -> Vec<&NodeExecStats> {
        recvs(device)
            .into_iter()
            .filter(|r| r.timeline_label.ends_with(&format!("@{peer})")))
            .collect()
    };
    let w_on_worker = from(WORKER_CPU, PS_CPU);
    assert_eq!(w_on_worker.len(), 1, "{w_on_worker:?}");
    assert_eq!(output_bytes(w_on_worker[0]), [(0, 24)]);
    assert_eq!(output_dims(w_on_worker[0], 0), [3, 2]);
    let grad_on_ps = from(PS_CPU, WORKER_CPU);
    assert!(
        grad_on_ps.iter().any(|r| output_dims(r, 0) == [3, 2]),
        "{grad_on_ps:?}"
    );
    // A receive's time includes its wait: it ends after its sender started.
    let sends: Vec<&NodeExecStats> = devices[WORKER_CPU]
        .values()
        .flatten()
        .copied()
        .filter(|n| n.timeline_label.contains(" = _Send("))
        .filter(|n| n.timeline_label.ends_with(&format!("@{PS_CPU})")))
        .collect();
    assert!(!sends.is_empty());
    for recv in &grad_on_ps {
        let end = recv.all_start_nanos + recv.all_end_rel_nanos;
        assert!(
            sends.iter().any(|s| s.all_start_nanos <= end),
            "{recv:?} ended before any send to the ps started: {sends:?}"
        );
    }

    // The Chrome trace has both tasks' devices, each node an event.
    let trace: Value = serde_json::from_str(&chrome_trace(stats)).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let processes: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        processes,
        [format!("{PS_CPU} Compute"), format!("{WORKER_CPU} Compute")]
    );
    let nodes: usize = stats.dev_stats.iter().map(|d| d.node_stats.len()).sum();
    assert_eq!(events.iter().filter(|e| e["ph"] == "X").count(), nodes);

    // Untraced, the same step returns empty metadata.
    let (_, metadata, _) = run_traced(
        &session,
        &[(&m.x, batch)],
        &[&m.loss],
        &[&m.train],
        &RunOptions::default(),
    );
    assert_eq!(metadata.step_stats, None);
    assert!(metadata.partition_graphs.is_empty());
    session.close().unwrap();
}

#[test]
fn every_trace_level_above_no_trace_traces() {
    let mut g = Graph::new();
    let a = g.scalar("a", DType::Float, 1.0).unwrap();
    let b = g.add(&a, &a).unwrap();
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    for level in [
        TraceLevel::SoftwareTrace,
        TraceLevel::HardwareTrace,
        TraceLevel::FullTrace,
    ] {
        let options = RunOptions {
            trace_level: level as i32,
            ..Default::default()
        };
        let (_, metadata) = session
            .run_with_options(&[], &[&b.name()], &[], &options)
            .unwrap();
        let stats = metadata.step_stats.unwrap();
        assert_eq!(stats.dev_stats[0].node_stats.len(), 2, "{level:?}");
        assert!(metadata.partition_graphs.is_empty());
    }
}

#[test]
fn a_monitored_session_traces_one_step_with_its_hooks() {
    use std::time::Duration;
    use tessera::train::monitored::{
        MonitoredSession, ReadyOp, RetryPolicy, Scaffold, SessionManager, StopAt, StopAtStepHook,
    };

    let mut g = Graph::new();
    let zero = g.constant(&Tensor::scalar(0i64)).unwrap();
    let step = g.variable("global_step", &zero).unwrap();
    let one = g.constant(&Tensor::scalar(1i64)).unwrap();
    let train = g.assign_add_variable(&step.handle, &one).unwrap();
    let init = g.global_variables_initializer().unwrap();
    let graph = g.to_graph_def();
    let ready = ReadyOp::for_variables(&[&step]);
    let manager = SessionManager::new(
        Box::new(move || {
            let session = Session::local();
            session.extend(&graph)?;
            Ok(session)
        }),
        Scaffold {
            init_op: Some(init),
            local_init_op: None,
            ready_op: ready,
        },
        true,
    );
    let global_step = step.value.name();
    let hooks: Vec<Box<dyn tessera::train::monitored::Hook>> = vec![Box::new(StopAtStepHook::new(
        &global_step,
        StopAt::LastStep(2),
    ))];
    let retry = RetryPolicy {
        max_attempts: 1,
        initial_backoff: Duration::from_millis(10),
        multiplier: 2.0,
        max_backoff: Duration::from_millis(10),
        startup: Duration::ZERO,
    };
    let mut session = MonitoredSession::new(manager, hooks, retry).unwrap();

    session.run(&[], &[], &[&train]).unwrap();
    // The second step, traced: the hook still counts it and stops training after it.
    let (out, metadata) = session
        .run_with_options(&[], &[&global_step], &[&train], &full_trace())
        .unwrap();
    assert_eq!(out.len(), 1);
    let stats = metadata.step_stats.unwrap();
    let nodes = &by_device(&stats)[LOCAL_CPU];
    assert!(nodes.contains_key(train.as_str()), "{:?}", nodes.keys());
    assert!(session.should_stop());
    session.close().unwrap();
}
