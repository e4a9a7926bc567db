//! Synchronous replication in process: each "worker" is a thread with its own `Session` on
//! one shared `Device` (standing in for workers sharing a ps), building its own copy of the
//! graph as between-graph replication does; the chief's [`ChiefQueueRunner`] aggregates.
//!
//! The model's gradients are constants (`dw = [1, 2]`, `db = 0.5`) the same on every worker,
//! so after N updates of gradient descent with learning rate 0.1 on the *average* gradient,
//! `w = [1, -1] - 0.1 N [1, 2]` and `b = -0.1 N 0.5`, whichever replicas contributed (a sum of
//! two gradients would move twice as far). Every wait is bounded by the optimizer's
//! `wait_timeout`.
//!
//! The embedding tests train a table that the loss reads only through `ResourceGather`, so its
//! gradient is rows (`GradientTensor::Slices`): it must be accumulated, averaged and applied
//! as rows (a `SparseConditionalAccumulator`, a `ResourceScatterAdd`), with no node that makes
//! it as big as the table, and give what averaging the replicas' rows by hand gives. The
//! numbers are dyadic, so the arithmetic is exact in float32 and results compare with `==`.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use std::collections::BTreeMap;

use tessera::client::{Session, SessionOptions};
use tessera::graph::indexed_slices::GradientTensor;
use tessera::graph::Graph;
use tessera::proto::GraphDef;
use tessera::runtime::accumulator::{ConditionalAccumulator, SparseConditionalAccumulator};
use tessera::runtime::Device;
use tessera::tensor::{DType, Tensor};
use tessera::train::optimizer::Optimizer;
use tessera::train::sync_replicas::{ChiefQueueRunner, SyncReplicasOps, SyncReplicasOptimizer};
use tessera::{Code, Result};

const LR: f64 = 0.1;

struct Replica {
    graph: GraphDef,
    ops: SyncReplicasOps,
    init: String,
    init_tokens: String,
}

fn build(aggregate: usize, total: usize, worker: usize, wait: Duration) -> Replica {
    let opt = SyncReplicasOptimizer::new(LR, aggregate, Some(total))
        .unwrap()
        .wait_timeout(wait);
    build_with(opt, worker)
}

/// The replica of `worker` around `opt` (any wrapped optimizer).
fn build_with(opt: SyncReplicasOptimizer, worker: usize) -> Replica {
    let opt = opt.local_step_container(&format!("worker_{worker}"));
    let mut g = Graph::new();
    let zero = g.constant(&Tensor::scalar(0i64)).unwrap();
    let global_step = g.variable("global_step", &zero).unwrap();
    let w0 = g
        .constant(&Tensor::from_vec([2], vec![1.0f32, -1.0]).unwrap())
        .unwrap();
    let w = g.variable("w", &w0).unwrap();
    let b0 = g.constant(&Tensor::scalar(0.0f32)).unwrap();
    let b = g.variable("b", &b0).unwrap();
    let dw = g
        .constant(&Tensor::from_vec([2], vec![1.0f32, 2.0]).unwrap())
        .unwrap();
    let db = g.constant(&Tensor::scalar(0.5f32)).unwrap();
    let ops = opt
        .apply_gradients(&mut g, &[(dw, w), (db, b)], &global_step)
        .unwrap();
    let init = g.global_variables_initializer().unwrap();
    let init_tokens = ops.get_init_tokens_op(&mut g, -1).unwrap();
    Replica {
        graph: g.to_graph_def(),
        ops,
        init,
        init_tokens,
    }
}

/// Initialises the model and the chief's sync state, then starts the chief's loop.
fn start_chief(device: &Arc<Device>, chief: &Replica, last_step: i64) -> ChiefQueueRunner {
    let session = Session::on_device(device.clone());
    session.extend(&chief.graph).unwrap();
    session.run(&[], &[], &[&chief.init]).unwrap();
    session.run(&[], &[], &[&chief.ops.chief_init_op]).unwrap();
    session.run(&[], &[], &[&chief.init_tokens]).unwrap();
    ChiefQueueRunner::start(
        device.clone(),
        &chief.graph,
        SessionOptions::default(),
        &chief.ops,
        Some(last_step),
    )
    .unwrap()
}

/// A worker: `steps` train steps at most (None: until the token queue closes). Returns the
/// steps done; a closed queue ends it cleanly.
fn run_worker(
    device: Arc<Device>,
    replica: Replica,
    is_chief: bool,
    steps: Option<usize>,
) -> Result<usize> {
    let session = Session::on_device(device);
    session.extend(&replica.graph)?;
    if !is_chief {
        session.run(&[], &[], &[&replica.ops.local_step_init_op])?;
    }
    let mut done = 0;
    while steps.is_none_or(|n| done < n) {
        match session.run(&[], &[&replica.ops.train_op], &[]) {
            Ok(_) => done += 1,
            Err(e) if e.code() == Code::OutOfRange => break,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Trains `replicas` (the first the chief, each worker on a thread of its own) until the
/// chief's runner made `updates` updates.
fn train_until(device: &Arc<Device>, replicas: Vec<Replica>, updates: i64) {
    let runner = start_chief(device, &replicas[0], updates);
    let workers: Vec<_> = replicas
        .into_iter()
        .enumerate()
        .map(|(k, r)| {
            let device = device.clone();
            thread::spawn(move || run_worker(device, r, k == 0, None))
        })
        .collect();
    assert_eq!(runner.join().unwrap(), updates as u64);
    for w in workers {
        w.join().unwrap().unwrap();
    }
}

fn read(device: &Arc<Device>, graph: &GraphDef, tensor: &str) -> Tensor {
    let session = Session::on_device(device.clone());
    session.extend(graph).unwrap();
    session.run(&[], &[tensor], &[]).unwrap().remove(0)
}

fn assert_trained(device: &Arc<Device>, graph: &GraphDef, n: i64) {
    assert_eq!(
        read(device, graph, "global_step/Read/ReadVariableOp:0")
            .scalar_value::<i64>()
            .unwrap(),
        n
    );
    let w = read(device, graph, "w/Read/ReadVariableOp:0");
    let b = read(device, graph, "b/Read/ReadVariableOp:0");
    let n = n as f32;
    let want_w = [1.0 - 0.1 * n * 1.0, -1.0 - 0.1 * n * 2.0];
    for (got, want) in w.values::<f32>().unwrap().iter().zip(want_w) {
        assert!((got - want).abs() < 1e-5, "w = {got}, want {want}");
    }
    let got_b = b.scalar_value::<f32>().unwrap();
    assert!((got_b - (-0.1 * n * 0.5)).abs() < 1e-5, "b = {got_b}");
}

#[test]
fn three_workers_with_one_backup_advance_the_global_step_once_per_averaged_update() {
    let device = Arc::new(Device::local_cpu());
    let wait = Duration::from_secs(5);
    let replicas: Vec<Replica> = (0..3).map(|k| build(2, 3, k, wait)).collect();
    assert_eq!(
        SyncReplicasOptimizer::new(LR, 2, Some(3))
            .unwrap()
            .tokens_per_step(),
        3
    );
    let runner = start_chief(&device, &replicas[0], 6);
    let workers: Vec<_> = replicas
        .into_iter()
        .enumerate()
        .map(|(k, r)| {
            let device = device.clone();
            thread::spawn(move || run_worker(device, r, k == 0, None))
        })
        .collect();
    assert_eq!(runner.join().unwrap(), 6);
    let steps: Vec<usize> = workers
        .into_iter()
        .map(|w| w.join().unwrap().unwrap())
        .collect();
    assert!(
        steps.iter().sum::<usize>() >= 12,
        "two gradients per update: {steps:?}"
    );
    let graph = build(2, 3, 0, wait).graph;
    assert_trained(&device, &graph, 6);
    // The accumulators are shared by name on the ps device: one per variable.
    let accum = device
        .resources()
        .lookup::<ConditionalAccumulator>("", "w:0/grad_accum")
        .unwrap();
    assert_eq!(accum.global_step(), 6);
}

#[test]
fn with_a_backup_training_finishes_when_one_worker_stops_early() {
    let device = Arc::new(Device::local_cpu());
    let wait = Duration::from_secs(5);
    let replicas: Vec<Replica> = (0..3).map(|k| build(2, 3, k, wait)).collect();
    let runner = start_chief(&device, &replicas[0], 8);
    let started = Instant::now();
    let workers: Vec<_> = replicas
        .into_iter()
        .enumerate()
        .map(|(k, r)| {
            let device = device.clone();
            // Worker 2 stops after two steps (as if it died).
            let steps = if k == 2 { Some(2) } else { None };
            thread::spawn(move || run_worker(device, r, k == 0, steps))
        })
        .collect();
    assert_eq!(runner.join().unwrap(), 8);
    let steps: Vec<usize> = workers
        .into_iter()
        .map(|w| w.join().unwrap().unwrap())
        .collect();
    assert!(steps[2] <= 2, "{steps:?}");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_trained(&device, &build(2, 3, 0, wait).graph, 8);
}

#[test]
fn without_a_backup_a_replica_that_took_a_token_and_died_ends_the_chiefs_wait_with_an_error() {
    let device = Arc::new(Device::local_cpu());
    let wait = Duration::from_millis(500);
    let chief = build(2, 2, 0, wait);
    let dead = build(2, 2, 1, wait);
    let runner = start_chief(&device, &chief, 100);

    // The replica that will die: two steps, the first two gradients of update 1 come from it
    // and the chief (below); then one more step, which takes one of the two tokens of update
    // 2 — and it stops, holding that token.
    let dead_session = Session::on_device(device.clone());
    dead_session.extend(&dead.graph).unwrap();
    dead_session
        .run(&[], &[], &[&dead.ops.local_step_init_op])
        .unwrap();
    let chief_session = Session::on_device(device.clone());
    chief_session.extend(&chief.graph).unwrap();
    // Both apply at step 0 and take the two initial tokens; the chief's loop updates once.
    assert_eq!(
        dead_session.run(&[], &[&dead.ops.train_op], &[]).unwrap()[0]
            .scalar_value::<i64>()
            .unwrap(),
        0
    );
    assert_eq!(
        chief_session.run(&[], &[&chief.ops.train_op], &[]).unwrap()[0]
            .scalar_value::<i64>()
            .unwrap(),
        0
    );
    // Its stale gradient is dropped; it waits for a token of update 1, gets it, and dies.
    assert_eq!(
        dead_session.run(&[], &[&dead.ops.train_op], &[]).unwrap()[0]
            .scalar_value::<i64>()
            .unwrap(),
        1
    );
    drop(dead_session);

    // The surviving worker gets the other token, contributes one gradient, and waits.
    let started = Instant::now();
    let survivor = {
        let device = device.clone();
        thread::spawn(move || run_worker(device, chief, true, None))
    };
    let e = runner.join().unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
    assert!(
        e.message().contains(":0/grad_accum`: 1 of 2 gradients arrived within 500 ms; a replica stopped contributing"),
        "{e}"
    );
    // The runner closed the token queue: the survivor ends instead of waiting for a token.
    let survivor = survivor.join().unwrap();
    assert!(matches!(survivor, Ok(n) if n >= 1), "{survivor:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(
        read(
            &device,
            &build(2, 2, 0, wait).graph,
            "global_step/Read/ReadVariableOp:0"
        )
        .scalar_value::<i64>()
        .unwrap(),
        1
    );
}

#[test]
fn stopping_the_chief_runner_while_it_waits_for_gradients_is_clean_and_wakes_the_workers() {
    let device = Arc::new(Device::local_cpu());
    let replica = build(2, 2, 0, Duration::from_secs(20));
    let runner = start_chief(&device, &replica, 100);
    assert!(runner.is_running());
    let started = Instant::now();
    // Nobody contributes: the runner is blocked in take_grad; stop must not wait 20 s.
    assert_eq!(runner.stop().unwrap(), 0);
    assert!(started.elapsed() < Duration::from_secs(5));
    // The token queue is closed: a worker's step ends with OUT_OF_RANGE once the tokens run out.
    let steps = run_worker(
        device.clone(),
        build(2, 2, 0, Duration::from_secs(20)),
        true,
        None,
    )
    .unwrap();
    assert_eq!(steps, 2, "the two initial tokens, then the closed queue");
}

#[test]
fn too_few_init_tokens_are_refused() {
    let opt = SyncReplicasOptimizer::new(LR, 3, Some(1)).unwrap();
    let mut g = Graph::new();
    let zero = g.constant(&Tensor::scalar(0i64)).unwrap();
    let gs = g.variable("global_step", &zero).unwrap();
    let w0 = g.constant(&Tensor::scalar(1.0f32)).unwrap();
    let w = g.variable("w", &w0).unwrap();
    let dw = g.constant(&Tensor::scalar(1.0f32)).unwrap();
    let ops = opt.apply_gradients(&mut g, &[(dw, w)], &gs).unwrap();
    let e = ops.get_init_tokens_op(&mut g, 1).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(ops.get_init_tokens_op(&mut g, 2).is_ok());
}

#[test]
fn node_names_follow_tensorflows_sync_replicas_graph() {
    // The names graph_sync.pbtxt gives the same pieces (there with four variables).
    let r = build(2, 2, 0, Duration::from_secs(1));
    let node = |name: &str| {
        r.graph
            .node
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node `{name}`"))
    };
    assert_eq!(node("sync_rep_local_step").op, "VarHandleOp");
    assert_eq!(
        node("AssignVariableOp").input,
        ["sync_rep_local_step", "ReadVariableOp"]
    );
    let accum = node("sync_replicas/conditional_accumulator_1");
    assert_eq!(accum.op, "ResourceConditionalAccumulator");
    assert_eq!(
        tessera::graph::attr::string_or(accum, "shared_name", "").unwrap(),
        "b:0/grad_accum"
    );
    assert_eq!(
        node("sync_replicas/ResourceAccumulatorApplyGradient").input,
        [
            "sync_replicas/conditional_accumulator",
            "sync_replicas/ReadVariableOp",
            "Const_3"
        ]
    );
    assert_eq!(
        node("sync_replicas/ResourceAccumulatorTakeGradient_1").input,
        [
            "sync_replicas/conditional_accumulator_1",
            "sync_replicas/ResourceAccumulatorTakeGradient_1/num_required"
        ]
    );
    // The waits are bounded inside steps with longer deadlines (remote steps have one): the
    // take by the optimizer's wait (1 s here), the token by twice that.
    let take = node("sync_replicas/ResourceAccumulatorTakeGradient_1");
    assert_eq!(
        tessera::graph::attr::int_or(take, "_timeout_ms", -1).unwrap(),
        1000
    );
    let dequeue = node("sync_token_q_Dequeue");
    assert_eq!(
        tessera::graph::attr::int_or(dequeue, "timeout_ms", -1).unwrap(),
        2000
    );
    assert_eq!(
        dequeue.input,
        [
            "sync_token_q",
            "^sync_replicas/ResourceAccumulatorApplyGradient",
            "^sync_replicas/ResourceAccumulatorApplyGradient_1"
        ]
    );
    assert_eq!(
        node("AssignVariableOp_1").input,
        ["sync_rep_local_step", "sync_token_q_Dequeue"]
    );
    assert_eq!(r.ops.train_op, "ReadVariableOp_2:0");
    assert_eq!(r.ops.sync_op, "sync_token_q_EnqueueMany");
    assert_eq!(
        node("sync_token_q_EnqueueMany").input[..2],
        ["sync_token_q", "Fill"]
    );
    assert_eq!(node("Fill/dims").input, ["^GradientDescent"]);
    assert_eq!(
        node("sync_replicas/SetGlobalStep_1").op,
        "ResourceAccumulatorSetGlobalStep"
    );
    assert_eq!(r.ops.chief_init_op, "sync_replicas/group_deps");
    assert_eq!(r.ops.cancel_close_op, "sync_token_q_Close_1");
    assert_eq!(node("GradientDescent").op, "AssignAddVariableOp");
}

#[test]
fn the_averaged_gradients_go_through_the_wrapped_optimizer_with_its_slots() {
    // Momentum 0.9 at learning rate 0.1 wrapped for 2 of 2 replicas. Both replicas send the
    // same constant gradient g (dw = [1, 2], db = 0.5), so every average is g, and by hand:
    //   accum_n = 0.9 accum_(n-1) + g,   var_n = var_(n-1) - 0.1 accum_n,   accum_0 = 0.
    // (Plain gradient descent would give var_n = var_0 - 0.1 n g; a sum instead of an
    // average would double every step.)
    const UPDATES: i64 = 5;
    let device = Arc::new(Device::local_cpu());
    let wait = Duration::from_secs(5);
    let make = |k| {
        let momentum = Optimizer::momentum(LR, 0.9, false);
        let opt = SyncReplicasOptimizer::wrapping(momentum, 2, Some(2))
            .unwrap()
            .wait_timeout(wait);
        build_with(opt, k)
    };
    let replicas: Vec<Replica> = (0..2).map(make).collect();
    // The slot lives with its variable (on the ps, wherever the variable is placed).
    let slot = replicas[0]
        .graph
        .node
        .iter()
        .find(|n| n.name == "w/Momentum")
        .expect("the momentum slot of w");
    assert_eq!(slot.op, "VarHandleOp");
    let class = slot.attr.get("_class").expect("the slot is colocated");
    assert!(format!("{:?}", class.value).contains("loc:@w"), "{class:?}");
    train_until(&device, replicas, UPDATES);

    let (mut w, mut b) = ([1.0f64, -1.0], 0.0f64);
    let (mut acc_w, mut acc_b) = ([0.0f64; 2], 0.0f64);
    let g_w = [1.0, 2.0];
    for _ in 0..UPDATES {
        for i in 0..2 {
            acc_w[i] = 0.9 * acc_w[i] + g_w[i];
            w[i] -= LR * acc_w[i];
        }
        acc_b = 0.9 * acc_b + 0.5;
        b -= LR * acc_b;
    }
    let graph = make(0).graph;
    let got = |t: &str| -> Vec<f32> { read(&device, &graph, t).values::<f32>().unwrap().to_vec() };
    let close = |got: &[f32], want: &[f64], what: &str| {
        for (g, w) in got.iter().zip(want) {
            assert!(
                (*g as f64 - w).abs() < 1e-5,
                "{what}: got {got:?}, want {want:?}"
            );
        }
    };
    close(&got("w/Read/ReadVariableOp:0"), &w, "w");
    close(&got("b/Read/ReadVariableOp:0"), &[b], "b");
    close(
        &got("w/Momentum/Read/ReadVariableOp:0"),
        &acc_w,
        "w/Momentum",
    );
    assert_eq!(
        read(&device, &graph, "global_step/Read/ReadVariableOp:0")
            .scalar_value::<i64>()
            .unwrap(),
        UPDATES
    );
}

// ---------------------------------------------------------------------------------------------
// Sparse gradients: an embedding table trained by rows
// ---------------------------------------------------------------------------------------------

const ROWS: usize = 6;
/// The embedding tests' learning rate: dyadic, as every number there.
const EMB_LR: f64 = 0.25;

/// The table's initial rows: row r is [r + 1, -(r + 1) / 2].
fn table0() -> Vec<f32> {
    (0..ROWS)
        .flat_map(|r| [r as f32 + 1.0, -(r as f32 + 1.0) / 2.0])
        .collect()
}

/// What a replica of the embedding model reads and how its loss weighs it.
#[derive(Clone)]
struct Lookup {
    /// The rows it gathers; int32 ones when `int32`.
    ids: Vec<i64>,
    int32: bool,
    /// loss = scale/2 * sum(rows^2) + bias_weight * b: the rows' gradient is scale * rows,
    /// b's is bias_weight.
    scale: f32,
    bias_weight: f32,
}

/// Replica 0 reads rows 1 and 3 (int64 ids), replica 1 rows 3 and 5 (int32 ids, cast to int64
/// before they reach the accumulator) with three times the weight: row 3's update is the
/// average of two gradients, rows 1 and 5 each come from one replica alone.
fn two_lookups() -> [Lookup; 2] {
    [
        Lookup {
            ids: vec![1, 3],
            int32: false,
            scale: 1.0,
            bias_weight: 1.0,
        },
        Lookup {
            ids: vec![3, 5],
            int32: true,
            scale: 3.0,
            bias_weight: 3.0,
        },
    ]
}

/// The replica of `worker` for an embedding `table` [6, 2] (read only through
/// `ResourceGather`) and a dense scalar `b`, trained by `opt`.
fn build_embedding(opt: SyncReplicasOptimizer, worker: usize, lookup: &Lookup) -> Replica {
    let opt = opt.local_step_container(&format!("worker_{worker}"));
    let mut g = Graph::new();
    let zero = g.constant(&Tensor::scalar(0i64)).unwrap();
    let global_step = g.variable("global_step", &zero).unwrap();
    let t0 = g
        .constant(&Tensor::from_vec([ROWS, 2], table0()).unwrap())
        .unwrap();
    let table = g.variable("table", &t0).unwrap();
    let b0 = g.constant(&Tensor::scalar(0.0f32)).unwrap();
    let b = g.variable("b", &b0).unwrap();
    let ids = if lookup.int32 {
        let ids: Vec<i32> = lookup.ids.iter().map(|&i| i as i32).collect();
        Tensor::from_vec([ids.len()], ids).unwrap()
    } else {
        Tensor::from_vec([lookup.ids.len()], lookup.ids.clone()).unwrap()
    };
    let ids = g.constant(&ids).unwrap();
    let rows = g
        .resource_gather(&table.handle, &ids, DType::Float, 0)
        .unwrap();
    let squares = g.mul(&rows, &rows).unwrap();
    let half_scale = g.constant(&Tensor::scalar(lookup.scale / 2.0)).unwrap();
    let weighted = g.mul(&squares, &half_scale).unwrap();
    let rows_loss = g.sum(&weighted, &[0, 1], false).unwrap();
    let bias_weight = g.constant(&Tensor::scalar(lookup.bias_weight)).unwrap();
    let b_now = g.read_variable(&b.handle).unwrap();
    let bias_loss = g.mul(&b_now, &bias_weight).unwrap();
    let loss = g.add(&rows_loss, &bias_loss).unwrap();
    let grads = Optimizer::gradient_descent(EMB_LR)
        .compute_sparse_gradients(&mut g, &loss, &[table, b])
        .unwrap();
    let pairs: Vec<(GradientTensor, _)> = grads
        .into_iter()
        .map(|(grad, var)| (grad.expect("the loss reads every variable"), var))
        .collect();
    assert!(
        matches!(pairs[0].0, GradientTensor::Slices(_)),
        "the table's gradient is rows"
    );
    assert!(matches!(pairs[1].0, GradientTensor::Dense(_)));
    let ops = opt
        .apply_gradient_tensors(&mut g, &pairs, &global_step)
        .unwrap();
    let init = g.global_variables_initializer().unwrap();
    let init_tokens = ops.get_init_tokens_op(&mut g, -1).unwrap();
    Replica {
        graph: g.to_graph_def(),
        ops,
        init,
        init_tokens,
    }
}

fn sync_gd(aggregate: usize, total: usize) -> SyncReplicasOptimizer {
    SyncReplicasOptimizer::new(EMB_LR, aggregate, Some(total))
        .unwrap()
        .wait_timeout(Duration::from_secs(5))
}

/// One synchronous update by hand: each replica's gradient rows (scale * row, the rows it
/// reads) at the current table, summed per row and divided by the number of gradients that
/// had the row (TensorFlow's sparse accumulator averages row by row), then gradient descent
/// on those rows alone. Float32, in the order the runtime computes.
fn update_by_hand(table: &mut [f32], lookups: &[Lookup]) {
    let mut sums: BTreeMap<usize, ([f32; 2], f32)> = BTreeMap::new();
    for lookup in lookups {
        for &id in &lookup.ids {
            let r = id as usize;
            let grad = [lookup.scale * table[2 * r], lookup.scale * table[2 * r + 1]];
            let entry = sums.entry(r).or_insert(([0.0; 2], 0.0));
            entry.0 = [grad[0] + entry.0[0], grad[1] + entry.0[1]];
            entry.1 += 1.0;
        }
    }
    for (r, (sum, count)) in sums {
        for k in 0..2 {
            table[2 * r + k] -= EMB_LR as f32 * (sum[k] / count);
        }
    }
}

/// Runs `updates` updates in lockstep, so that every update averages one gradient of each
/// replica, all computed at the same table: each round, each replica takes its local step from
/// the global step (its local_step_init_op, as after a session creation) and applies, then the
/// chief updates and `after` is called with the update's number. (Free-running, a fast replica
/// may send both gradients of an update, and with replicas reading different rows the result
/// would depend on the schedule.)
fn lockstep(
    device: &Arc<Device>,
    replicas: &[Replica],
    updates: usize,
    mut after: impl FnMut(usize),
) {
    let sessions: Vec<Session> = replicas
        .iter()
        .map(|r| {
            let session = Session::on_device(device.clone());
            session.extend(&r.graph).unwrap();
            session
        })
        .collect();
    let chief = &replicas[0];
    for op in [&chief.init, &chief.ops.chief_init_op, &chief.init_tokens] {
        sessions[0].run(&[], &[], &[op]).unwrap();
    }
    for step in 0..updates {
        for (session, replica) in sessions.iter().zip(replicas) {
            session
                .run(&[], &[], &[&replica.ops.local_step_init_op])
                .unwrap();
            // It applies at `step`, then takes a token: one of the init tokens, or one the
            // last update left.
            let local = session.run(&[], &[&replica.ops.train_op], &[]).unwrap();
            assert_eq!(local[0].scalar_value::<i64>().unwrap(), step as i64);
        }
        let global = sessions[0]
            .run(&[], &[&chief.ops.global_step_after], &[&chief.ops.sync_op])
            .unwrap();
        assert_eq!(global[0].scalar_value::<i64>().unwrap(), step as i64 + 1);
        after(step);
    }
}

fn f32_values(device: &Arc<Device>, graph: &GraphDef, tensor: &str) -> Vec<f32> {
    read(device, graph, tensor)
        .values::<f32>()
        .unwrap()
        .to_vec()
}

#[test]
fn two_replicas_train_an_embedding_table_by_rows_as_averaging_them_by_hand_does() {
    const UPDATES: usize = 3;
    // Row 3's update is the average of two gradients, rows 1 and 5 each come from one
    // replica alone (see two_lookups).
    let lookups = two_lookups();
    let device = Arc::new(Device::local_cpu());
    let replicas: Vec<Replica> = lookups
        .iter()
        .enumerate()
        .map(|(k, l)| build_embedding(sync_gd(2, 2), k, l))
        .collect();

    let mut want = table0();
    lockstep(&device, &replicas, UPDATES, |_| {
        update_by_hand(&mut want, &lookups)
    });
    let graph = &replicas[0].graph;
    let got = f32_values(&device, graph, "table/Read/ReadVariableOp:0");
    assert_eq!(got, want, "the table after {UPDATES} updates");
    // Only the gathered rows moved (and each by the per-row average: row 1 by lr * row, not
    // by half of it, row 3 by lr * 2 * row, row 5 by lr * 3 * row).
    let start = table0();
    for r in 0..ROWS {
        let moved = got[2 * r..2 * r + 2] != start[2 * r..2 * r + 2];
        assert_eq!(moved, [1, 3, 5].contains(&r), "row {r}: {got:?}");
    }
    assert_eq!(got[2], 2.0 * 0.75f32.powi(UPDATES as i32));
    assert_eq!(got[6], 4.0 * 0.5f32.powi(UPDATES as i32));
    assert_eq!(got[10], 6.0 * 0.25f32.powi(UPDATES as i32));
    // The dense b beside it: the average of 1 and 3, three times.
    let b = read(&device, graph, "b/Read/ReadVariableOp:0");
    assert_eq!(
        b.scalar_value::<f32>().unwrap(),
        -(EMB_LR as f32) * 2.0 * 3.0
    );
    let accum = device
        .resources()
        .lookup::<SparseConditionalAccumulator>("", "table:0/grad_accum")
        .unwrap();
    assert_eq!(
        (
            accum.global_step(),
            accum.num_accumulated(),
            accum.dropped()
        ),
        (UPDATES as i64, 0, 0)
    );
}

#[test]
fn the_chiefs_runner_applies_an_embeddings_rows_with_repeats_and_never_densifies_them() {
    // Both replicas read rows 4, 1, 4 (a repeat, out of order) with the same weights, so every
    // update is lr * the rows' gradient whichever replicas contributed: row 4 moves by the sum
    // of its two lookups' rows, row 1 by its one.
    const UPDATES: i64 = 4;
    let lookup = Lookup {
        ids: vec![4, 1, 4],
        int32: false,
        scale: 1.0,
        bias_weight: 1.0,
    };
    let device = Arc::new(Device::local_cpu());
    let replicas: Vec<Replica> = (0..2)
        .map(|k| build_embedding(sync_gd(2, 2), k, &lookup))
        .collect();

    let graph = replicas[0].graph.clone();
    let node = |name: &str| {
        graph
            .node
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node `{name}`"))
    };
    for n in &graph.node {
        assert_ne!(n.op, "UnsortedSegmentSum", "`{}` densifies rows", n.name);
        assert_ne!(n.op, "ScatterNd", "`{}` densifies rows", n.name);
        if n.op == "ResourceConditionalAccumulator" {
            assert_eq!(
                tessera::graph::attr::string_or(n, "shared_name", "").unwrap(),
                "b:0/grad_accum",
                "only the dense b has a dense accumulator"
            );
        }
    }
    let accum = node("sync_replicas/sparse_conditional_accumulator");
    assert_eq!(accum.op, "SparseConditionalAccumulator");
    assert_eq!(
        tessera::graph::attr::string_or(accum, "shared_name", "").unwrap(),
        "table:0/grad_accum"
    );
    // The update reads the take's indices and values, and scatters them into the table.
    let scatter = node("GradientDescent/update_table/ResourceScatterAdd");
    assert_eq!(
        scatter.input[..2],
        ["table", "sync_replicas/SparseAccumulatorTakeGradient"]
    );

    train_until(&device, replicas, UPDATES);

    let mut want = table0();
    for _ in 0..UPDATES {
        // Both gradients at the same table or not, row 4 takes lr * 2 * row4 (two lookups),
        // row 1 lr * row1: gradient descent on one replica's gradient, as the average is.
        let (r1, r4) = ([want[2], want[3]], [want[8], want[9]]);
        for k in 0..2 {
            want[2 + k] -= EMB_LR as f32 * r1[k];
            want[8 + k] -= EMB_LR as f32 * r4[k];
            want[8 + k] -= EMB_LR as f32 * r4[k];
        }
    }
    let got = f32_values(&device, &graph, "table/Read/ReadVariableOp:0");
    assert_eq!(got, want);
    assert_eq!(
        read(&device, &graph, "global_step/Read/ReadVariableOp:0")
            .scalar_value::<i64>()
            .unwrap(),
        UPDATES
    );
}

#[test]
fn sparse_node_names_follow_tensorflows_sync_replicas_graph() {
    // The names TensorFlow 2.21's SyncReplicasOptimizer gives an embedding table's pieces
    // (tf.compat.v1, a resource table read by embedding_lookup, then a dense variable).
    let lookup = Lookup {
        ids: vec![1, 3],
        int32: true,
        scale: 1.0,
        bias_weight: 1.0,
    };
    let r = build_embedding(sync_gd(2, 2), 0, &lookup);
    let node = |name: &str| {
        r.graph
            .node
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node `{name}`"))
    };
    let accum = node("sync_replicas/sparse_conditional_accumulator");
    assert_eq!(accum.op, "SparseConditionalAccumulator");
    let apply = node("sync_replicas/SparseAccumulatorApplyGradient");
    assert_eq!(
        apply.input[0],
        "sync_replicas/sparse_conditional_accumulator"
    );
    assert_eq!(apply.input[1], "sync_replicas/ReadVariableOp");
    // int32 ids, then the dense shape: both cast to int64, in that order.
    assert_eq!(apply.input[2], "sync_replicas/Cast");
    assert_eq!(apply.input[4], "sync_replicas/Cast_1");
    assert_eq!(node("sync_replicas/Cast").op, "Cast");
    assert!(tessera::graph::attr::bool_or(apply, "has_known_shape", false).unwrap());
    assert_eq!(
        node("sync_replicas/SparseAccumulatorTakeGradient").input,
        [
            "sync_replicas/sparse_conditional_accumulator",
            "sync_replicas/SparseAccumulatorTakeGradient/num_required"
        ]
    );
    assert_eq!(
        node("sync_replicas/conditional_accumulator").op,
        "ResourceConditionalAccumulator"
    );
    let set = node("sync_replicas/SetGlobalStep");
    assert_eq!(set.op, "AccumulatorSetGlobalStep");
    assert_eq!(set.input[0], "sync_replicas/sparse_conditional_accumulator");
    assert_eq!(
        node("sync_replicas/SetGlobalStep_1").op,
        "ResourceAccumulatorSetGlobalStep"
    );
    assert_eq!(
        node(&r.ops.chief_init_op).input,
        [
            "^AssignVariableOp",
            "^sync_replicas/SetGlobalStep",
            "^sync_replicas/SetGlobalStep_1"
        ]
    );
    assert_eq!(
        r.ops.accumulators,
        [
            "sync_replicas/sparse_conditional_accumulator",
            "sync_replicas/conditional_accumulator"
        ]
    );
}

#[test]
fn an_optimizer_that_densifies_rows_gets_the_tables_shape_from_the_take() {
    // Adam applies a sparse gradient as its dense update on the rows made dense (as tessera's
    // Adam does), which needs the dense shape the take reports: the table's, since the
    // accumulator is declared with it. On the first step a row no replica read does not move.
    let lookups = two_lookups();
    let device = Arc::new(Device::local_cpu());
    let replicas: Vec<Replica> = lookups
        .iter()
        .enumerate()
        .map(|(k, l)| {
            let adam = SyncReplicasOptimizer::wrapping(Optimizer::adam(EMB_LR), 2, Some(2))
                .unwrap()
                .wait_timeout(Duration::from_secs(5));
            build_embedding(adam, k, l)
        })
        .collect();
    lockstep(&device, &replicas, 1, |_| {});
    let got = f32_values(&device, &replicas[0].graph, "table/Read/ReadVariableOp:0");
    let start = table0();
    for r in 0..ROWS {
        let moved = got[2 * r..2 * r + 2] != start[2 * r..2 * r + 2];
        assert_eq!(moved, [1, 3, 5].contains(&r), "row {r}: {got:?}");
    }
}
