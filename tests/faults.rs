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

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use support::cluster::{killed_by, Cluster};
use tessera::client::Session;
use tessera::graph::scope::replica_device_setter;
use tessera::graph::{Graph, Variable};
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::train::checkpoint::state::latest_checkpoint;
use tessera::train::checkpoint::{build_saver_ops, BundleReader, Saver};
use tessera::train::monitored::{
    Every, Hook, MonitoredSession, ReadyOp, RetryPolicy, RunArgs, RunContext, Scaffold,
    SessionManager, StopAt, StopAtStepHook, TrainingConfig,
};
use tessera::train::optimizer::{get_or_create_global_step, Optimizer};
use tessera::{Code, Result, Status};

/// The global step as a hook fetches it.
const GLOBAL_STEP: &str = "global_step/Read/ReadVariableOp:0";
/// Features per example.
const FEATURES: usize = 2;
/// Examples per batch.
const BATCH: usize = 4;

/// The names one replica's graph gives the pieces a test runs.
struct Replica {
    graph: tessera::proto::GraphDef,
    x: String,
    y: String,
    loss: String,
    train: String,
    init: String,
    saver: Arc<Saver>,
    restored_step: String,
    ready: ReadyOp,
}

/// Linear regression `pred = x·w + b` with a mean squared error, built by worker `task` with
/// its variables on the ps (replica_device_setter) and its computation on its own task.
fn linear_replica(task: usize, optimizer: &Optimizer) -> Result<Replica> {
    let mut g = Graph::new();
    let setter = replica_device_setter(1, &format!("/job:worker/task:{task}"))?;
    let (x, y, loss, train, vars) = g.with_device_fn(setter, |g| -> Result<_> {
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
fn connect(
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
fn retry() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 30,
        initial_backoff: Duration::from_millis(50),
        multiplier: 2.0,
        max_backoff: Duration::from_secs(1),
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

/// The chief's hook that stops the world once: when the global step reaches `at`, it tells
/// the test (which kills the ps) and waits for its go-ahead. Listed before the checkpoint
/// saver, so the step it stops at is never saved.
struct PauseAt {
    at: i64,
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
        if step >= self.at {
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
    steps: usize,
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
        steps: losses.len(),
        sessions: session.sessions_created(),
        first_loss: losses.first().copied().unwrap_or(f32::NAN),
        last_loss: losses.last().copied().unwrap_or(f32::NAN),
    };
    session.close()?;
    Ok(outcome)
}

#[test]
fn async_training_survives_a_ps_restart_and_goes_on_from_the_last_checkpoint() {
    const LAST_STEP: i64 = 80;
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
    let paused_at = match reached_rx.recv_timeout(Duration::from_secs(120)) {
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
    assert!(seen[0].first().is_some_and(|&s| s < saved_step), "{seen:?}");
    for later in seen.iter().skip(1).filter(|s| !s.is_empty()) {
        assert!(
            later[0] >= saved_step,
            "a session of the worker began at {later:?}"
        );
    }
    assert!(
        seen.iter()
            .skip(1)
            .any(|s| s.first().is_some_and(|&v| v < paused_at)),
        "after the restart the worker trained from the restored step: {seen:?}"
    );

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
