//! Surviving a lost task, with real `tessera serve` daemons on loopback.
//!
//! Every worker's client is a thread of the test: it connects a remote session to its own
//! worker daemon (`Session::connect`), and trains through a [`MonitoredSession`] over it, as
//! a between-graph replica does. The tasks are killed with SIGKILL, as a crash or a
//! preemption would end them.
//!
//! * Async (A): 1 ps + 2 workers; the ps dies mid-training and comes back on the same port
//!   with its variables gone. Both monitored sessions see ABORTED or UNAVAILABLE and recreate
//!   their sessions with bounded backoff; the chief restores the last checkpoint, so the global
//!   step goes on from the checkpoint's value; the other worker waits for the model to be
//!   ready again; training ends at the last step.
//! * Sync (B): 3 workers, 2 gradients per update and one backup; one worker (daemon and
//!   client) dies, the other two finish. Without a backup (2 of 2), the survivor's wait ends
//!   within the configured deadline with an error naming the missing replica.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use crate::support::cluster::{killed_by, Cluster};
use tessera::client::{ConnectOptions, Session};
use tessera::graph::scope::replica_device_setter;
use tessera::graph::{Graph, Output, Variable};
use tessera::proto::ConfigProto;
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::train::checkpoint::state::latest_checkpoint;
use tessera::train::checkpoint::{build_saver_ops, BundleReader, Saver};
use tessera::train::monitored::{
    Every, Hook, MonitoredSession, ReadyOp, RetryPolicy, RunArgs, RunContext, Scaffold,
    SessionManager, StopAt, StopAtStepHook, TrainingConfig,
};
use tessera::train::optimizer::{get_or_create_global_step, Optimizer};
use tessera::train::sync_replicas::{SyncReplicasHook, SyncReplicasOps, SyncReplicasOptimizer};
use tessera::{Code, Result, Status};

/// The global step as a hook fetches it.
pub(crate) const GLOBAL_STEP: &str = "global_step/Read/ReadVariableOp:0";
/// Features per example.
pub(crate) const FEATURES: usize = 2;
/// Examples per batch.
pub(crate) const BATCH: usize = 4;

/// The names one replica's graph gives the pieces a test runs.
pub(crate) struct Replica {
    pub(crate) graph: tessera::proto::GraphDef,
    pub(crate) x: String,
    pub(crate) y: String,
    pub(crate) loss: String,
    pub(crate) train: String,
    pub(crate) init: String,
    pub(crate) saver: Arc<Saver>,
    pub(crate) restored_step: String,
    pub(crate) ready: ReadyOp,
}

/// Linear regression's graph: `pred = x·w + b`, its mean squared error against `y`.
struct LinearModel {
    x: Output,
    y: Output,
    loss: Output,
    global_step: Variable,
    w: Variable,
    b: Variable,
}

/// Adds [`LinearModel`] to `g`, in whatever device scope the caller set.
fn linear_model(g: &mut Graph) -> Result<LinearModel> {
    let global_step = get_or_create_global_step(g)?;
    let w0 = g.constant(&Tensor::from_vec(
        vec![FEATURES, 1],
        vec![0.0f32; FEATURES],
    )?)?;
    let w = g.variable("w", &w0)?;
    let b0 = g.constant(&Tensor::from_vec(vec![1], vec![0.0f32])?)?;
    let b = g.variable("b", &b0)?;
    let x = g.placeholder(
        "x",
        DType::Float,
        PartialShape::new(vec![None, Some(FEATURES)]),
    )?;
    let y = g.placeholder("y", DType::Float, PartialShape::new(vec![None, Some(1)]))?;
    let xw = g.matmul(&x, &w.value)?;
    let pred = g.add(&xw, &b.value)?;
    let err = g.sub(&pred, &y)?;
    let sq = g.mul(&err, &err)?;
    let loss = g.mean(&sq, &[0, 1], false)?;
    Ok(LinearModel {
        x,
        y,
        loss,
        global_step,
        w,
        b,
    })
}

/// Linear regression `pred = x·w + b` with a mean squared error, built by worker `task` with
/// its variables on the ps (replica_device_setter) and its computation on its own task.
pub(crate) fn linear_replica(task: usize, optimizer: &Optimizer) -> Result<Replica> {
    let mut g = Graph::new();
    let setter = replica_device_setter(1, &format!("/job:worker/task:{task}"))?;
    let (x, y, loss, train, vars) = g.with_device_fn(setter, |g| -> Result<_> {
        let LinearModel {
            x,
            y,
            loss,
            global_step,
            w,
            b,
        } = linear_model(g)?;
        let train = optimizer.minimize(g, &loss, Some(&global_step))?;
        Ok((x, y, loss, train, [global_step, w, b]))
    })?;
    let init = g.global_variables_initializer()?;
    let saved: BTreeMap<String, Variable> = ["global_step", "w", "b"]
        .iter()
        .map(|n| n.to_string())
        .zip(vars.iter().cloned())
        .collect();
    let def = build_saver_ops(&mut g, &saved)?;
    // The global step as the restore left it, read in the restore's own step (a worker may
    // train as soon as the variables are back).
    let restored_step = g.with_control_dependencies(&[def.restore_op.as_str()], |g| {
        g.read_variable(&vars[0].handle)
    })?;
    let saver = Arc::new(Saver::new(def, 5));
    let ready = ReadyOp::for_variables(&vars.iter().collect::<Vec<_>>());
    Ok(Replica {
        graph: g.to_graph_def(),
        x: x.name(),
        y: y.name(),
        loss: loss.name(),
        train,
        init,
        saver,
        restored_step: restored_step.name(),
        ready,
    })
}

/// Batch `k` of worker `task`: `y = 2·x0 - 3·x1 + 0.5` on inputs in [-1, 1).
fn batch(task: usize, k: usize) -> (Tensor, Tensor) {
    let mut xs = Vec::with_capacity(BATCH * FEATURES);
    let mut ys = Vec::with_capacity(BATCH);
    for i in 0..BATCH {
        let seed = (k * 31 + task * 17 + i * 7) % 23;
        let x0 = seed as f32 / 11.5 - 1.0;
        let x1 = ((seed * 5 + 3) % 23) as f32 / 11.5 - 1.0;
        xs.extend([x0, x1]);
        ys.push(2.0 * x0 - 3.0 * x1 + 0.5);
    }
    (
        Tensor::from_vec(vec![BATCH, FEATURES], xs).unwrap(),
        Tensor::from_vec(vec![BATCH, 1], ys).unwrap(),
    )
}

/// A session creator: a fresh remote session to `target` with `graph` extended into it.
pub(crate) fn connect(
    target: String,
    graph: tessera::proto::GraphDef,
) -> tessera::train::monitored::CreateSession {
    Box::new(move || {
        let session = Session::connect(&target)?;
        session.extend(&graph)?;
        Ok(session)
    })
}

/// Retries long enough to cover a ps restart (about a second on a busy machine), bounded.
pub(crate) fn retry() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 30,
        initial_backoff: Duration::from_millis(50),
        multiplier: 2.0,
        max_backoff: Duration::from_secs(1),
        startup: Duration::ZERO,
    }
}

fn read_step(session: &Session) -> Result<i64> {
    session.run(&[], &[GLOBAL_STEP], &[])?[0].scalar_value::<i64>()
}

/// The step number of checkpoint prefix `dir/model.ckpt-N`.
fn checkpoint_step(prefix: &Path) -> i64 {
    let name = prefix.file_name().unwrap().to_string_lossy().into_owned();
    name.rsplit_once('-')
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or_else(|| panic!("checkpoint {name} has no step"))
}

/// Holds its worker once: when the global step reaches `at`, it tells the test (which kills
/// a task) and waits for its go-ahead. On the chief it is listed before the checkpoint saver,
/// so the step it holds at is never saved; on a worker of a synchronous job it holds the token
/// of the worker's next step.
struct PauseAt {
    at: i64,
    /// Also wait, when set, for a checkpoint past step 0 in this directory: in async
    /// training the other worker may pass `at` while the chief makes its first step, so that
    /// only the step-0 checkpoint exists yet.
    saved_in: Option<PathBuf>,
    fired: bool,
    reached: mpsc::Sender<i64>,
    resume: mpsc::Receiver<()>,
}

impl Hook for PauseAt {
    fn after_run(&mut self, context: &mut RunContext<'_>, _values: &[Tensor]) -> Result<()> {
        if self.fired {
            return Ok(());
        }
        // Re-read: the value is past every step the saver has seen.
        let step = read_step(context.session())?;
        let saved = match &self.saved_in {
            Some(dir) => latest_checkpoint(dir)?.is_some_and(|p| checkpoint_step(&p) > 0),
            None => true,
        };
        if step >= self.at && saved {
            self.fired = true;
            let _ = self.reached.send(step);
            self.resume
                .recv_timeout(Duration::from_secs(120))
                .map_err(|_| Status::internal("the test never let the chief go on"))?;
        }
        Ok(())
    }
}

/// Records, per session the worker had, the global step fetched with each of its steps.
struct Steps(Arc<Mutex<Vec<Vec<i64>>>>);

impl Hook for Steps {
    fn after_create_session(&mut self, _session: &Session) -> Result<()> {
        self.0.lock().unwrap().push(Vec::new());
        Ok(())
    }
    fn before_run(&mut self, _context: &RunContext<'_>) -> Result<RunArgs> {
        Ok(RunArgs::fetch(&[GLOBAL_STEP]))
    }
    fn after_run(&mut self, _context: &mut RunContext<'_>, values: &[Tensor]) -> Result<()> {
        let step = values[0].scalar_value::<i64>()?;
        if let Some(session) = self.0.lock().unwrap().last_mut() {
            session.push(step);
        }
        Ok(())
    }
}

/// What one worker's training loop saw.
#[derive(Debug)]
struct Outcome {
    sessions: u64,
    first_loss: f32,
    last_loss: f32,
}

/// Trains until the monitored session stops; `k` indexes the worker's batches.
fn train_loop(mut session: MonitoredSession, task: usize, replica: &Replica) -> Result<Outcome> {
    let mut losses = Vec::new();
    while !session.should_stop() {
        let (x, y) = batch(task, losses.len());
        let values = session.run(
            &[(&replica.x, x), (&replica.y, y)],
            &[&replica.loss],
            &[&replica.train],
        )?;
        losses.push(values[0].scalar_value::<f32>()?);
    }
    let outcome = Outcome {
        sessions: session.sessions_created(),
        first_loss: losses.first().copied().unwrap_or(f32::NAN),
        last_loss: losses.last().copied().unwrap_or(f32::NAN),
    };
    session.close()?;
    Ok(outcome)
}

#[test]
fn async_training_survives_a_ps_restart_and_goes_on_from_the_last_checkpoint() {
    // Far enough past the kill that the other worker, training on while the chief is held,
    // is still training when the ps dies.
    const LAST_STEP: i64 = 300;
    const KILL_AT: i64 = 35;
    const SAVE_EVERY: u64 = 10;
    let mut cluster = Cluster::start(&[("ps", 1), ("worker", 2)]);
    let dir = tempfile::tempdir().unwrap();
    let ckpt_dir: PathBuf = dir.path().join("train");
    let optimizer = Optimizer::gradient_descent(0.05);

    let (reached_tx, reached_rx) = mpsc::channel();
    let (resume_tx, resume_rx) = mpsc::channel();
    // The global step right after each restore the chief made, with the checkpoint it used.
    let restores: Arc<Mutex<Vec<(PathBuf, i64)>>> = Arc::default();

    let chief = {
        let replica = linear_replica(0, &optimizer).unwrap();
        let target = cluster.target("worker", 0);
        let ckpt_dir = ckpt_dir.clone();
        let restores = restores.clone();
        thread::spawn(move || -> Result<Outcome> {
            let scaffold = Scaffold {
                init_op: Some(replica.init.clone()),
                local_init_op: None,
                ready_op: replica.ready.clone(),
            };
            let restore = {
                let (def, dir) = (replica.saver.def().clone(), ckpt_dir.clone());
                let restored_step = replica.restored_step.clone();
                Arc::new(move |s: &Session| -> Result<bool> {
                    let Some(prefix) = latest_checkpoint(&dir)? else {
                        return Ok(false);
                    };
                    let name = Tensor::string(prefix.to_string_lossy().into_owned());
                    let step = s.run(
                        &[(&def.filename_tensor, name)],
                        &[&restored_step],
                        &[&def.restore_op],
                    )?[0]
                        .scalar_value::<i64>()?;
                    restores.lock().unwrap().push((prefix, step));
                    Ok(true)
                })
            };
            let manager =
                SessionManager::new(connect(target, replica.graph.clone()), scaffold, true)
                    .with_restore(restore);
            let save = {
                let (saver, dir) = (replica.saver.clone(), ckpt_dir.clone());
                Arc::new(move |s: &Session, step: i64| saver.save(s, &dir, Some(step)).map(|_| ()))
            };
            let mut config = TrainingConfig::new(GLOBAL_STEP);
            config.checkpoint = Some((save, Every::Steps(SAVE_EVERY)));
            config.log_step_count = None;
            config.chief_only_hooks.push(Box::new(PauseAt {
                at: KILL_AT,
                saved_in: Some(ckpt_dir.clone()),
                fired: false,
                reached: reached_tx,
                resume: resume_rx,
            }));
            config.hooks.push(Box::new(StopAtStepHook::new(
                GLOBAL_STEP,
                StopAt::LastStep(LAST_STEP),
            )));
            config.retry = retry();
            let session = MonitoredSession::training(manager, config)?;
            train_loop(session, 0, &replica)
        })
    };
    let seen: Arc<Mutex<Vec<Vec<i64>>>> = Arc::default();
    let worker = {
        let replica = linear_replica(1, &optimizer).unwrap();
        let target = cluster.target("worker", 1);
        let seen = seen.clone();
        thread::spawn(move || -> Result<Outcome> {
            let scaffold = Scaffold {
                init_op: None,
                local_init_op: None,
                ready_op: replica.ready.clone(),
            };
            let manager =
                SessionManager::new(connect(target, replica.graph.clone()), scaffold, false)
                    .with_wait(Duration::from_millis(100), Duration::from_secs(60));
            let mut config = TrainingConfig::new(GLOBAL_STEP);
            config.hooks.push(Box::new(Steps(seen)));
            config.hooks.push(Box::new(StopAtStepHook::new(
                GLOBAL_STEP,
                StopAt::LastStep(LAST_STEP),
            )));
            config.retry = retry();
            let session = MonitoredSession::training(manager, config)?;
            train_loop(session, 1, &replica)
        })
    };

    // The chief holds at KILL_AT (the worker trains on); the ps dies, losing every variable.
    let paused_at = match reached_rx.recv_timeout(Duration::from_secs(25)) {
        Ok(step) => step,
        Err(e) => panic!(
            "the chief never reached step {KILL_AT} ({e}): {:?}",
            chief.join()
        ),
    };
    let status = cluster.kill("ps", 0);
    assert!(killed_by(status, libc::SIGKILL), "{status:?}");
    let saved = latest_checkpoint(&ckpt_dir)
        .unwrap()
        .expect("a checkpoint before the kill");
    // In async training the other worker may step between the saver reading the global step
    // (the checkpoint's name) and the save op (its value): the value is what must come back.
    let saved_step = BundleReader::open(&saved.to_string_lossy())
        .and_then(|r| r.read("global_step"))
        .and_then(|t| t.scalar_value::<i64>())
        .unwrap();
    assert!(
        0 < checkpoint_step(&saved) && checkpoint_step(&saved) <= saved_step,
        "checkpoint {saved:?} holds global_step {saved_step}"
    );
    assert!(
        saved_step < paused_at,
        "the last checkpoint ({saved_step}) is older than the step at the kill ({paused_at})"
    );
    cluster.restart("ps", 0);
    resume_tx.send(()).unwrap();

    let chief = chief.join().unwrap().expect("the chief finishes");
    let worker = worker.join().unwrap().expect("the worker finishes");

    // The chief restored exactly once, from the checkpoint there was at the kill, and the
    // global step went on from its value: not from 0, not from where it was.
    let restores = restores.lock().unwrap().clone();
    assert!(!restores.is_empty(), "the chief restored after the restart");
    for restore in &restores {
        assert_eq!(
            restore,
            &(saved.clone(), saved_step),
            "restores: {restores:?}"
        );
    }
    assert!(
        chief.sessions >= 2,
        "the chief recreated its session: {chief:?}"
    );
    assert!(
        worker.sessions >= 2,
        "the worker recreated its session: {worker:?}"
    );
    // Every later session of the worker starts at or after the restored step: it waited for
    // the chief's restore rather than training uninitialized variables.
    let seen = seen.lock().unwrap().clone();
    assert!(
        !seen[0].is_empty(),
        "the worker trained before the kill: {seen:?}"
    );
    for later in seen.iter().skip(1).filter(|s| !s.is_empty()) {
        assert!(
            later[0] >= saved_step,
            "a session of the worker began at {later:?}"
        );
    }

    // Training finished at the last step, and it trained.
    let check = Session::connect(&cluster.target("worker", 0)).unwrap();
    check
        .extend(&linear_replica(0, &optimizer).unwrap().graph)
        .unwrap();
    let step = read_step(&check).unwrap();
    // A worker stops once it reads the last step after a step of its own; a step whose fetched
    // value (read before the other worker's increments) was still two short skips that read,
    // so each worker may run up to two steps past the other's arrival: 80 to 83.
    assert!(
        (LAST_STEP..=LAST_STEP + 3).contains(&step),
        "final global step {step}"
    );
    assert!(
        chief.last_loss < chief.first_loss,
        "the chief's loss fell: {chief:?}"
    );
    let final_ckpt = latest_checkpoint(&ckpt_dir).unwrap().unwrap();
    assert!(checkpoint_step(&final_ckpt) >= LAST_STEP, "{final_ckpt:?}");
}

/// One replica of the synchronous model: the same regression, its averaged gradients applied
/// by gradient descent through a SyncReplicasOptimizer naming the replica.
struct SyncReplica {
    graph: tessera::proto::GraphDef,
    x: String,
    y: String,
    loss: String,
    init: String,
    init_tokens: String,
    ops: SyncReplicasOps,
    ready: ReadyOp,
}

fn sync_replica(
    task: usize,
    aggregate: usize,
    total: usize,
    wait: Duration,
) -> Result<SyncReplica> {
    let mut g = Graph::new();
    let setter = replica_device_setter(1, &format!("/job:worker/task:{task}"))?;
    let optimizer = Optimizer::gradient_descent(0.05);
    let sync = SyncReplicasOptimizer::wrapping(optimizer.clone(), aggregate, Some(total))?
        .wait_timeout(wait)
        .replica_id(&format!("/job:worker/task:{task}"));
    let (x, y, loss, ops, vars) = g.with_device_fn(setter, |g| -> Result<_> {
        let LinearModel {
            x,
            y,
            loss,
            global_step,
            w,
            b,
        } = linear_model(g)?;
        let grads = optimizer.compute_gradients(g, &loss, &[w.clone(), b.clone()])?;
        let grads: Vec<(Output, Variable)> = grads
            .into_iter()
            .map(|(grad, var)| (grad.expect("the loss depends on every variable"), var))
            .collect();
        let ops = sync.apply_gradients(g, &grads, &global_step)?;
        Ok((x, y, loss, ops, [global_step, w, b]))
    })?;
    let init = g.global_variables_initializer()?;
    let init_tokens = ops.get_init_tokens_op(&mut g, -1)?;
    Ok(SyncReplica {
        graph: g.to_graph_def(),
        x: x.name(),
        y: y.name(),
        loss: loss.name(),
        init,
        init_tokens,
        ops,
        ready: ReadyOp::for_variables(&vars.iter().collect::<Vec<_>>()),
    })
}

/// Tells the test, once, that the global step reached `at` (training goes on).
struct Notify {
    at: i64,
    tx: Option<mpsc::Sender<i64>>,
}

impl Hook for Notify {
    fn before_run(&mut self, _context: &RunContext<'_>) -> Result<RunArgs> {
        Ok(RunArgs::fetch(&[GLOBAL_STEP]))
    }
    fn after_run(&mut self, _context: &mut RunContext<'_>, values: &[Tensor]) -> Result<()> {
        let step = values[0].scalar_value::<i64>()?;
        if step >= self.at {
            if let Some(tx) = self.tx.take() {
                let _ = tx.send(step);
            }
        }
        Ok(())
    }
}

/// Starts worker `task`'s client thread: a monitored session over its own daemon running
/// synchronous steps until it stops, the token queue closes (OUT_OF_RANGE) or it fails.
/// Returns the steps it ran, or the error that ended it (the chief's includes its runner's).
fn spawn_sync_worker(
    cluster: &Cluster,
    task: usize,
    replica: SyncReplica,
    last_step: i64,
    retry: RetryPolicy,
    extra: Option<Box<dyn Hook>>,
) -> thread::JoinHandle<Result<usize>> {
    let target = cluster.target("worker", task);
    thread::spawn(move || {
        let is_chief = task == 0;
        let scaffold = Scaffold {
            init_op: is_chief.then(|| replica.init.clone()),
            local_init_op: None,
            ready_op: replica.ready.clone(),
        };
        let manager = SessionManager::new(
            connect(target.clone(), replica.graph.clone()),
            scaffold,
            is_chief,
        )
        .with_wait(Duration::from_millis(100), Duration::from_secs(60));
        let mut config = TrainingConfig::new(GLOBAL_STEP);
        config.log_step_count = None;
        let sync: Box<dyn Hook> = if is_chief {
            let runner = connect(target, replica.graph.clone());
            Box::new(SyncReplicasHook::chief(
                &replica.ops,
                &replica.init_tokens,
                runner,
                Some(last_step),
            ))
        } else {
            Box::new(SyncReplicasHook::worker(&replica.ops))
        };
        config.hooks.push(sync);
        config.hooks.push(Box::new(StopAtStepHook::new(
            GLOBAL_STEP,
            StopAt::LastStep(last_step),
        )));
        config.hooks.extend(extra);
        config.retry = retry;
        let mut session = MonitoredSession::training(manager, config)?;
        let mut steps = 0;
        while !session.should_stop() {
            let (x, y) = batch(task, steps);
            match session.run(
                &[(&replica.x, x), (&replica.y, y)],
                &[&replica.loss, &replica.ops.train_op],
                &[],
            ) {
                Ok(_) => steps += 1,
                Err(e) if e.code() == Code::OutOfRange => break,
                Err(e) => return Err(e),
            }
        }
        session.close()?;
        Ok(steps)
    })
}

/// Few, quick retries: a worker whose own daemon is gone gives up soon.
fn short_retry() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(50),
        multiplier: 2.0,
        max_backoff: Duration::from_millis(200),
        startup: Duration::ZERO,
    }
}

#[test]
fn sync_training_with_a_backup_worker_finishes_when_one_worker_dies() {
    const LAST_STEP: i64 = 30;
    let mut cluster = Cluster::start(&[("ps", 1), ("worker", 3)]);
    let wait = Duration::from_secs(10);
    let (tx, rx) = mpsc::channel();
    let workers: Vec<_> = (0..3)
        .map(|task| {
            let replica = sync_replica(task, 2, 3, wait).unwrap();
            let notify = (task == 0).then(|| {
                Box::new(Notify {
                    at: 10,
                    tx: Some(tx.clone()),
                }) as Box<dyn Hook>
            });
            spawn_sync_worker(&cluster, task, replica, LAST_STEP, short_retry(), notify)
        })
        .collect();
    let at = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the chief reaches step 10");
    assert!(at < LAST_STEP);
    let status = cluster.kill("worker", 2);
    assert!(killed_by(status, libc::SIGKILL), "{status:?}");

    let results: Vec<Result<usize>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    // The dead worker's client lost its master: UNAVAILABLE after its few retries.
    let dead = results[2]
        .as_ref()
        .expect_err("worker 2's client fails with its daemon");
    assert_eq!(dead.code(), Code::Unavailable, "{dead}");
    // The other two finished training.
    for (task, result) in results[..2].iter().enumerate() {
        let steps = result
            .as_ref()
            .unwrap_or_else(|e| panic!("worker {task}: {e}"));
        assert!(*steps > 0, "worker {task} ran no step");
    }
    // Worker 2 is gone: this session asks only for the tasks it needs.
    let options = ConnectOptions {
        config: ConfigProto {
            device_filters: vec!["/job:ps".into(), "/job:worker/task:0".into()],
            ..Default::default()
        },
        ..Default::default()
    };
    let check = Session::connect_with(&cluster.target("worker", 0), options).unwrap();
    check
        .extend(&sync_replica(0, 2, 3, wait).unwrap().graph)
        .unwrap();
    let step = read_step(&check).unwrap();
    // The chief's loop ends at the last step: one update per step, no more.
    assert_eq!(step, LAST_STEP);
}

#[test]
fn without_a_backup_a_dead_worker_ends_the_survivors_wait_with_an_error_naming_it() {
    let mut cluster = Cluster::start(&[("ps", 1), ("worker", 2)]);
    let wait = Duration::from_secs(2);
    // Worker 1 is held after a step, holding the token for its next one, and dies there: the
    // chief gets the round's other token only, so the update misses worker 1's gradient. (A
    // worker dying with no token left behind would not stall anything: the chief would spend
    // the spare tokens and contribute twice per update, as in TensorFlow.)
    let (reached_tx, reached_rx) = mpsc::channel();
    let (resume_tx, resume_rx) = mpsc::channel();
    let mut hold = Some(PauseAt {
        at: 5,
        saved_in: None,
        fired: false,
        reached: reached_tx,
        resume: resume_rx,
    });
    let workers: Vec<_> = (0..2)
        .map(|task| {
            let replica = sync_replica(task, 2, 2, wait).unwrap();
            let extra = if task == 1 {
                hold.take().map(|h| Box::new(h) as Box<dyn Hook>)
            } else {
                None
            };
            spawn_sync_worker(&cluster, task, replica, 1000, short_retry(), extra)
        })
        .collect();
    reached_rx
        .recv_timeout(Duration::from_secs(120))
        .expect("worker 1 reaches step 5");
    let status = cluster.kill("worker", 1);
    assert!(killed_by(status, libc::SIGKILL), "{status:?}");
    let killed = std::time::Instant::now();
    resume_tx.send(()).unwrap();

    let mut workers = workers.into_iter();
    let chief = workers.next().unwrap().join().unwrap();
    let waited = killed.elapsed();
    let e = chief.expect_err("the survivor cannot finish without its peer");
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
    assert!(
        e.message()
            .contains("/job:worker/task:1 (last gradient at local step"),
        "the error names the missing replica: {e}"
    );
    assert!(!e.message().contains("/job:worker/task:0 ("), "{e}");
    // The chief's take waits `wait` from its last update; the survivor's token wait is
    // longer, so the take's error comes first and the closed queue releases the survivor.
    assert!(
        waited < wait * 2 + Duration::from_secs(3),
        "took {waited:?}"
    );
    let dead = workers.next().unwrap().join().unwrap();
    assert!(dead.is_err(), "{dead:?}");
}
