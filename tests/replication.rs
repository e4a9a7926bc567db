//! A ps task with a standby loses no acknowledged update when a daemon of the pair dies, with
//! real `tessera serve` daemons on loopback killed by SIGKILL.
//!
//! 1 ps (primary + `ps_standby`) + 2 workers train a linear classifier between-graph, async,
//! each step adding 1 to the global step and applying gradient descent to the ps's
//! variables. A daemon of the pair is killed at a step drawn from a printed seed
//! (`TESSERA_FAULT_SEED` repeats one). The run must finish with the global step between the
//! steps that succeeded and the steps attempted (every acknowledged increment kept, none
//! applied twice), the standby's record must show no step sent twice, and the held-out
//! accuracy must be within 0.02 of a run without the kill.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use crate::faults::{connect, linear_replica, retry, Replica, FEATURES, GLOBAL_STEP};
use crate::support::cluster::{killed_by, Cluster};
use tessera::client::Session;
use tessera::proto::replica::replica_service_client::ReplicaServiceClient;
use tessera::proto::replica::{ReplicaStatusRequest, ReplicaStatusResponse, Role};
use tessera::tensor::Tensor;
use tessera::train::monitored::{
    Hook, MonitoredSession, RunArgs, RunContext, Scaffold, SessionManager, StopAt, StopAtStepHook,
    TrainingConfig,
};
use tessera::train::optimizer::Optimizer;
use tessera::Result;

/// The global step training stops at.
const LAST_STEP: i64 = 300;

/// Gradient descent's learning rate.
const LEARNING_RATE: f32 = 0.1;
/// Examples per step.
const BATCH: usize = 32;

/// Which daemon of the ps task's pair the test kills.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kill {
    Nothing,
    Primary,
    /// The standby, restarted once the run has gone on without it: it rejoins and catches up.
    Standby,
    /// The standby, restarted as above, then the primary the moment the standby is back: the
    /// standby takes over whether or not its whole copy had landed.
    PrimaryDuringCatchUp,
}

/// What a run ended with.
#[derive(Debug)]
struct Run {
    counter: i64,
    succeeded: u64,
    attempted: u64,
    accuracy: f64,
    standby: ReplicaStatusResponse,
    killed_at: Option<i64>,
}

/// Counts every attempt at a step (a retried step calls `before_run` again) and sends the
/// global step after each success, so that the test can kill a daemon at a drawn step.
struct Count {
    attempts: Arc<AtomicU64>,
    steps: Option<mpsc::Sender<i64>>,
}

impl Hook for Count {
    fn before_run(&mut self, _context: &RunContext<'_>) -> Result<RunArgs> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        Ok(RunArgs::fetch(&[GLOBAL_STEP]))
    }
    fn after_run(&mut self, _context: &mut RunContext<'_>, values: &[Tensor]) -> Result<()> {
        if let Some(steps) = &self.steps {
            let _ = steps.send(values[0].scalar_value::<i64>()?);
        }
        Ok(())
    }
}

/// A step's batch of worker `task`: points in [-1, 1)², labelled 1 above the line
/// `2·x0 - 3·x1 + 0.5 = 0`.
fn batch(task: usize, k: usize) -> (Tensor, Tensor) {
    points(((task as u64) << 32) | k as u64, BATCH)
}

/// `n` labelled points drawn from `seed`.
fn points(seed: u64, n: usize) -> (Tensor, Tensor) {
    let mut state = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    let mut next = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let mut xs = Vec::with_capacity(n * FEATURES);
    let mut ys = Vec::with_capacity(n);
    for _ in 0..n {
        let (x0, x1) = (next(), next());
        xs.extend([x0, x1]);
        ys.push(if 2.0 * x0 - 3.0 * x1 + 0.5 > 0.0 {
            1.0f32
        } else {
            0.0
        });
    }
    (
        Tensor::from_vec(vec![n, FEATURES], xs).unwrap(),
        Tensor::from_vec(vec![n, 1], ys).unwrap(),
    )
}

/// One worker's training loop; returns its successful steps.
fn train(
    task: usize,
    target: String,
    attempts: Arc<AtomicU64>,
    steps: Option<mpsc::Sender<i64>>,
) -> Result<u64> {
    let optimizer = Optimizer::gradient_descent(LEARNING_RATE);
    let replica = linear_replica(task, &optimizer)?;
    let scaffold = Scaffold {
        init_op: (task == 0).then(|| replica.init.clone()),
        local_init_op: None,
        ready_op: replica.ready.clone(),
    };
    let manager = SessionManager::new(connect(target, replica.graph.clone()), scaffold, task == 0)
        .with_wait(Duration::from_millis(100), Duration::from_secs(60));
    let mut config = TrainingConfig::new(GLOBAL_STEP);
    config.log_step_count = None;
    config.hooks.push(Box::new(Count { attempts, steps }));
    config.hooks.push(Box::new(StopAtStepHook::new(
        GLOBAL_STEP,
        StopAt::LastStep(LAST_STEP),
    )));
    config.retry = retry();
    let mut session = MonitoredSession::training(manager, config)?;
    let mut succeeded = 0;
    while !session.should_stop() {
        let (x, y) = batch(task, succeeded as usize);
        session.run(
            &[(&replica.x, x), (&replica.y, y)],
            &[&replica.loss],
            &[&replica.train],
        )?;
        succeeded += 1;
    }
    session.close()?;
    Ok(succeeded)
}

/// The held-out accuracy of the trained model and its global step, read through worker 0.
fn evaluate(cluster: &Cluster, replica: &Replica) -> (f64, i64) {
    let session = Session::connect(&cluster.target("worker", 0)).unwrap();
    session.extend(&replica.graph).unwrap();
    let values = session
        .run(
            &[],
            &[
                "w/Read/ReadVariableOp:0",
                "b/Read/ReadVariableOp:0",
                GLOBAL_STEP,
            ],
            &[],
        )
        .unwrap();
    let w = values[0].values::<f32>().unwrap();
    let b = values[1].values::<f32>().unwrap()[0];
    let (x, y) = points(7_777, 2000);
    let (x, labels) = (x.values::<f32>().unwrap(), y.values::<f32>().unwrap());
    let right = x
        .chunks(FEATURES)
        .zip(labels.iter())
        .filter(|(p, l)| ((p[0] * w[0] + p[1] * w[1] + b) > 0.5) == (**l > 0.5))
        .count();
    let step = values[2].scalar_value::<i64>().unwrap();
    (right as f64 / labels.len() as f64, step)
}

/// The standby's record, asked over its ReplicaService.
fn replica_status(cluster: &Cluster, job: &str) -> ReplicaStatusResponse {
    let address = format!("http://{}", cluster.addr(job, 0));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut client = tokio::time::timeout(
            Duration::from_secs(10),
            ReplicaServiceClient::connect(address),
        )
        .await
        .expect("the daemon answers within 10 s")
        .expect("connect to the daemon");
        client
            .replica_status(ReplicaStatusRequest::default())
            .await
            .expect("ReplicaStatus")
            .into_inner()
    })
}

/// Trains on 1 ps with a standby and 2 workers, killing `kill` at the global step `kill_at`.
fn run(kill: Kill, kill_at: i64) -> Run {
    let mut cluster = Cluster::start(&[("ps", 1), ("ps_standby", 1), ("worker", 2)]);
    let attempts = Arc::new(AtomicU64::new(0));
    let (steps_tx, steps_rx) = mpsc::channel();
    let workers: Vec<_> = (0..2)
        .map(|task| {
            let target = cluster.target("worker", task);
            let attempts = Arc::clone(&attempts);
            let steps = (task == 0).then(|| steps_tx.clone());
            thread::spawn(move || train(task, target, attempts, steps))
        })
        .collect();
    drop(steps_tx);
    let mut killed_at = None;
    if kill != Kill::Nothing {
        loop {
            match steps_rx.recv_timeout(Duration::from_secs(60)) {
                Ok(step) if step >= kill_at => {
                    killed_at = Some(step);
                    break;
                }
                Ok(_) => {}
                Err(e) => panic!("the chief never reached step {kill_at}: {e}"),
            }
        }
        let job = if kill == Kill::Primary {
            "ps"
        } else {
            "ps_standby"
        };
        let status = cluster.kill(job, 0);
        assert!(killed_by(status, libc::SIGKILL), "{status:?}");
        if matches!(kill, Kill::Standby | Kill::PrimaryDuringCatchUp) {
            // Training goes on without the standby; then it comes back and catches up.
            let later = killed_at.unwrap() + 20;
            while steps_rx
                .recv_timeout(Duration::from_secs(60))
                .expect("training goes on without the standby")
                < later
            {}
            cluster.restart("ps_standby", 0);
        }
        if kill == Kill::PrimaryDuringCatchUp {
            let status = cluster.kill("ps", 0);
            assert!(killed_by(status, libc::SIGKILL), "{status:?}");
        }
    }
    // The chief's channel stays open until it ends; drain it meanwhile.
    let drain = thread::spawn(move || while steps_rx.recv().is_ok() {});
    let succeeded: u64 = workers
        .into_iter()
        .map(|w| w.join().unwrap().expect("the worker finishes"))
        .sum();
    drain.join().unwrap();
    let replica = linear_replica(0, &Optimizer::gradient_descent(LEARNING_RATE)).unwrap();
    let (accuracy, counter) = evaluate(&cluster, &replica);
    // The daemon standing by at the end holds the record of what it stored; after a killed
    // primary that is the one left, the promoted standby, whose record holds what it stored
    // before the kill.
    let standby = replica_status(&cluster, "ps_standby");
    Run {
        counter,
        succeeded,
        attempted: attempts.load(Ordering::SeqCst),
        accuracy,
        standby,
        killed_at,
    }
}

/// The step to kill at, drawn from `TESSERA_FAULT_SEED` or the clock, and printed.
fn kill_step() -> i64 {
    let seed: u64 = std::env::var("TESSERA_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos() as u64
        });
    let step = 20 + (seed % 60) as i64;
    println!("TESSERA_FAULT_SEED={seed}: killing at global step {step}");
    step
}

fn assert_nothing_lost(run: &Run, baseline: &Run) {
    assert!(
        run.succeeded as i64 <= run.counter && run.counter as u64 <= run.attempted,
        "succeeded {} <= counter {} <= attempted {}: {run:?}",
        run.succeeded,
        run.counter,
        run.attempted
    );
    assert!(run.counter >= LAST_STEP, "{run:?}");
    assert_eq!(
        run.standby.steps_replayed, 0,
        "no step was sent twice: {run:?}"
    );
    assert!(
        (run.accuracy - baseline.accuracy).abs() <= 0.02,
        "accuracy {} against {} without the kill",
        run.accuracy,
        baseline.accuracy
    );
}

#[test]
fn the_standby_takes_over_a_killed_primary_and_no_acknowledged_update_is_lost() {
    let kill_at = kill_step();
    let baseline = run(Kill::Nothing, 0);
    assert!(baseline.accuracy > 0.9, "{baseline:?}");
    assert!(
        baseline.standby.steps_stored > 0,
        "the standby stored the steps: {baseline:?}"
    );
    assert_eq!(baseline.standby.role(), Role::Standby);
    let run = run(Kill::Primary, kill_at);
    assert_nothing_lost(&run, &baseline);
    // The standby served the task after the kill, from its copy: the global step went on from
    // where the acknowledged steps had left it, not from a checkpoint or from 0.
    assert!(run.counter >= run.killed_at.unwrap(), "{run:?}");
}

#[test]
fn a_killed_standby_leaves_training_going_and_catches_up_when_it_returns() {
    let kill_at = kill_step();
    let baseline = run(Kill::Nothing, 0);
    let run = run(Kill::Standby, kill_at);
    assert_nothing_lost(&run, &baseline);
    // The restarted standby holds a whole copy again and stored the steps after its return.
    assert_eq!(run.standby.role(), Role::Standby, "{run:?}");
    assert!(run.standby.synced, "{run:?}");
    assert!(run.standby.steps_stored > 0, "{run:?}");
    assert_eq!(run.standby.steps_replayed, 0, "{run:?}");
}

#[test]
fn a_primary_killed_while_its_restarted_standby_catches_up_leaves_training_going() {
    // Killed the moment the standby is back: the standby takes over with its whole copy if it
    // had landed, else empty, and the chief initializes the model again (what a ps without a
    // standby and without a checkpoint comes to). Either way training ends, on the standby.
    let run = run(Kill::PrimaryDuringCatchUp, kill_step());
    assert!(run.counter >= LAST_STEP, "{run:?}");
    assert!(run.counter as u64 <= run.attempted, "{run:?}");
    assert!(run.accuracy > 0.9, "{run:?}");
    assert_eq!(run.standby.role(), Role::Primary, "{run:?}");
}
