//! What each task of a training job does next to its daemon: a ps serves until the chief says
//! training is over; a worker trains its shard in a [`MonitoredSession`] on its own master, and
//! worker 0, the chief, also initialises or restores the model, saves checkpoints, shows
//! progress, evaluates on the held-out set and ends the job.
//!
//! ```text
//! chief (worker 0)                          worker k                       ps
//! init or restore ──────────────────────►   waits for the model
//! steps (+ sync: the aggregation loop)      steps on its shard
//! StopAtStep: global step = last            StopAtStep / token queue closed
//! waits (bounded) for ◄──────────────────── "finished k" (FINISHED_QUEUE)
//! held-out accuracy, final checkpoint
//! closes every DONE_QUEUE ────────────────► exits 0 ─────────────────────► exits 0
//! ```

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::client::{chrome_trace, ConnectOptions, Session};
use crate::cluster::{TaskConfig, TaskId};
use crate::data::{BatchOptions, Dataset};
use crate::device::DeviceType;
use crate::device::{GpuProbe, GpuScan};
use crate::error::{Code, Result, Status};
use crate::proto::{run_options::TraceLevel, RunOptions};
use crate::train::checkpoint::saver::Saver;
use crate::train::checkpoint::state::latest_checkpoint;
use crate::train::checkpoint::BundleReader;
use crate::train::monitored::{
    Every, Hook, MonitoredSession, NanTensorHook, Scaffold, SessionManager, StopAt, StopAtStepHook,
    SummaryFile, SummarySaverHook, SystemClock, TrainingConfig,
};
use crate::train::sync_replicas::SyncReplicasHook;

use super::agree;
use super::model::{self, Examples, Placement, Scores, TrainGraph, TrainOp, IDS, X, Y};
use super::progress::Progress;
use super::signal::{self, ChiefSignals};
use super::spec::TrainSpec;

/// How long the chief waits for the other workers' last steps before its final checkpoint.
pub const WAIT_FOR_WORKERS: Duration = Duration::from_secs(30);
/// Lets the task's input kernels read the job's own data files (`--data csv:PATH`,
/// `tfrecord:PATH`, `idx:IMAGES,LABELS`): each one's directory, when it exists, joins
/// `[data] allowed_dirs`. Directories the cluster file already allows stay allowed. Reads are
/// confined once [`confine_checkpoints`] has run (see `DataConfig::read_dirs`), so a client
/// of the job's tasks reads nowhere but there and the checkpoint directory.
pub fn confine_data(config: &mut TaskConfig, spec: &TrainSpec) {
    let mut dirs = config.data.allowed_dirs.take();
    for file in spec.data.files() {
        let dir = match file.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        // A missing directory is left to the data reader, whose error names the file.
        if !dir.is_dir() {
            continue;
        }
        let dirs = dirs.get_or_insert_with(Vec::new);
        if !dirs.iter().any(|d| d == dir) {
            dirs.push(dir.to_path_buf());
        }
    }
    config.data.allowed_dirs = dirs;
    config.data.widen_hint = Some(
        "add this one to [data] allowed_dirs in the task's cluster file (`tessera train` \
         allows reads only under its --data files' directories and its --checkpoint_dir)"
            .into(),
    );
}

/// Checkpoints the chief keeps.
const MAX_TO_KEEP: usize = 5;
/// How long one training step may take through the task's master.
const STEP_TIMEOUT: Duration = Duration::from_secs(120);
/// The most held-out examples evaluated in one step: a cnn's activations on all of MNIST's
/// 12,000 held-out images at once would take gigabytes.
const EVAL_BATCH: usize = 1000;

/// What the chief reports at the end.
#[derive(Clone, Debug)]
pub struct ChiefReport {
    /// The global step training ended at.
    pub global_step: i64,
    /// The accuracy on the held-out examples.
    pub held_out_accuracy: f64,
    /// The held-out log loss (mean cross-entropy) and, for two classes, its AUC and the log
    /// loss of always predicting the training labels' mean.
    pub held_out_scores: Scores,
    /// How many examples were held out.
    pub held_out_examples: usize,
    /// The batch loss of the chief's last step.
    pub final_loss: f32,
    /// Global steps per second seen by the chief over its run.
    pub steps_per_sec: f64,
    /// The final checkpoint, when checkpoints are on.
    pub checkpoint: Option<PathBuf>,
    /// The checkpoint training started from, when the chief restored one.
    pub restored_from: Option<PathBuf>,
    /// Workers that did not report their last step in time.
    pub missing_workers: Vec<u32>,
    /// The directory of the chief's TensorBoard event file, when summaries are on.
    pub logdir: Option<PathBuf>,
    /// The Chrome trace of one step (`--trace_step`), when one was asked for.
    pub trace: Option<PathBuf>,
}

/// How a task's part of the job ended.
#[derive(Clone, Debug)]
pub enum Finished {
    /// A ps told that training is over.
    Ps,
    /// A worker (not the chief) that trained and was told that training is over.
    Worker { global_step: i64 },
    /// The chief.
    Chief(Box<ChiefReport>),
    /// The job's checkpoint is at or past the last step already: this task, started after
    /// training ended (a pod restarted late), has nothing to do.
    AlreadyEnded {
        global_step: i64,
        checkpoint: PathBuf,
    },
    /// A worker asked to stop ([`StopRequest`]) before training ended: it stopped after its
    /// step in flight; the chief wrote `checkpoint` at `global_step` first. The job is not
    /// over: the other tasks wait for this one to come back.
    Stopped {
        global_step: i64,
        checkpoint: Option<PathBuf>,
    },
}

/// A request from outside the job (SIGTERM) that a worker stop at its next step, the chief
/// after writing a final checkpoint, so a restarted task loses nothing.
#[derive(Clone, Debug, Default)]
pub struct StopRequest(Arc<AtomicBool>);

impl StopRequest {
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the training loop to stop.
    pub fn request(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Runs this task's part of the job, the task's daemon serving at `target` (`grpc://...`); a
/// worker stops early when `stop` is requested.
pub fn run(
    config: &TaskConfig,
    target: &str,
    spec: &TrainSpec,
    stop: &StopRequest,
) -> Result<Finished> {
    let task = &config.task;
    if let Some((global_step, checkpoint)) = ended_checkpoint(spec)? {
        return Ok(Finished::AlreadyEnded {
            global_step,
            checkpoint,
        });
    }
    match task.job.as_str() {
        "ps" => {
            let pair = config
                .standbys
                .own
                .as_ref()
                .map(|pair| (pair, &config.security));
            signal::wait_for_done(target, task, pair)?;
            Ok(Finished::Ps)
        }
        "worker" | "chief" => train_worker(config, target, spec, stop),
        other => Err(Status::invalid_argument(format!(
            "{task}: tessera train runs jobs `ps`, `worker` and `chief` (without a chief job, \
             worker 0 is the chief), not `{other}`; rename the job in the cluster file"
        ))),
    }
}

/// The latest checkpoint of `--checkpoint_dir` and its global step, when that step is at or
/// past `--steps`: training ended.
fn ended_checkpoint(spec: &TrainSpec) -> Result<Option<(i64, PathBuf)>> {
    let Some(dir) = &spec.checkpoint_dir else {
        return Ok(None);
    };
    let Some(prefix) = latest_checkpoint(dir)? else {
        return Ok(None);
    };
    let bundle = BundleReader::open(&prefix.to_string_lossy())?;
    if !bundle.entries().contains_key("global_step") {
        return Ok(None);
    }
    let step = bundle.read("global_step")?.scalar_value::<i64>()?;
    Ok((step >= spec.steps).then_some((step, prefix)))
}

/// Where a training task stands in the job. The chief is the `chief` job's task where the
/// cluster has one (a Kubeflow TFJob's Chief replica, Estimator's rule), else worker 0; the
/// training tasks are replicas numbered from the chief's 0 (with a chief job, worker k is
/// replica k + 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    /// The chief's task.
    pub chief: TaskId,
    /// This task's number among the replicas; 0 is the chief.
    pub index: usize,
    /// How many replicas train: the workers, and the chief when it has a job of its own.
    pub count: usize,
}

impl Replica {
    /// The training replicas of `cluster`.
    pub fn count(cluster: &crate::cluster::ClusterSpec) -> usize {
        cluster.num_tasks("worker").unwrap_or(0) + cluster.num_tasks("chief").unwrap_or(0)
    }

    /// `task`'s place among them; `None` for a task that does not train (a ps).
    pub fn of(cluster: &crate::cluster::ClusterSpec, task: &TaskId) -> Option<Self> {
        let has_chief = cluster.num_tasks("chief").unwrap_or(0) > 0;
        let index = match (task.job.as_str(), has_chief) {
            ("chief", _) => 0,
            ("worker", true) => task.index as usize + 1,
            ("worker", false) => task.index as usize,
            _ => return None,
        };
        let chief = if has_chief {
            TaskId::new("chief", 0)
        } else {
            TaskId::new("worker", 0)
        };
        Some(Self {
            chief,
            index,
            count: Self::count(cluster),
        })
    }

    pub fn is_chief(&self) -> bool {
        self.index == 0
    }
}

/// Checks the job's shape and the spec before the daemon starts, so bad input fails at once.
pub fn check(config: &TaskConfig, spec: &TrainSpec) -> Result<()> {
    let cluster = &config.cluster;
    let num_ps = cluster.num_tasks("ps").unwrap_or(0);
    let replicas = Replica::count(cluster);
    // Under a sparse TF_CONFIG a ps sees only itself: the workers find it, not it them.
    let sparse_ps = config.partial_cluster && config.task.job == "ps";
    if num_ps == 0 || (replicas == 0 && !sparse_ps) {
        return Err(Status::invalid_argument(format!(
            "tessera train needs a cluster with a `ps` job and a `worker` (or `chief`) job; \
             this one has {num_ps} ps and {replicas} worker and chief tasks"
        )));
    }
    if config.partial_cluster && spec.sync.is_some() {
        return Err(Status::invalid_argument(format!(
            "{}: synchronous training (--sync) aggregates the gradients of every worker, but \
             this sparse TF_CONFIG (a TFJob's dynamic workers) names only some of them; train \
             asynchronously, or give every task the whole cluster (no enableDynamicWorker)",
            config.task
        )));
    }
    spec.validate(replicas.max(1))?;
    if Replica::of(cluster, &config.task).is_some_and(|r| r.is_chief()) {
        spec.check_checkpoint_dir()?;
        spec.check_logdir()?;
    }
    Ok(())
}

/// Confines the task's checkpoint and summary kernels to the job's `--checkpoint_dir`
/// (`[checkpoints] allowed_dirs`, created when missing): a client of the job's tasks can save,
/// restore or merge nowhere else. Directories the cluster file already allows stay allowed; a
/// job without a checkpoint directory allows none.
pub fn confine_checkpoints(config: &mut TaskConfig, spec: &TrainSpec) -> Result<()> {
    let mut dirs = config.checkpoints.allowed_dirs.take().unwrap_or_default();
    if let Some(dir) = &spec.checkpoint_dir {
        std::fs::create_dir_all(dir).map_err(|e| {
            Status::failed_precondition(format!(
                "cannot create the checkpoint directory {}: {e}; choose one this user can \
                 write (--checkpoint_dir)",
                dir.display()
            ))
        })?;
        dirs.push(dir.clone());
    }
    config.checkpoints.allowed_dirs = Some(dirs);
    config.checkpoints.widen_hint = Some(
        "give this task's `tessera train` the same --checkpoint_dir as the others (every task \
         of a job takes the same flags)"
            .into(),
    );
    Ok(())
}

/// Gives a worker the CPU devices its towers run on: with `--towers N` on CPUs, a worker
/// whose configuration asks for fewer than N CPU devices (`[devices] cpu`) gets N; a
/// configuration asking for more keeps its count, and a ps is left as it is (it only holds
/// variables). GPU towers use the GPUs the host has and `[devices]` allows.
pub fn provide_tower_devices(config: &mut TaskConfig, spec: &TrainSpec) {
    if Replica::of(&config.cluster, &config.task).is_none() || spec.tower_device != DeviceType::Cpu
    {
        return;
    }
    let wanted = u32::try_from(spec.towers).unwrap_or(u32::MAX);
    if let Some(wanted) = NonZeroU32::new(wanted) {
        if wanted > config.devices.cpu_count {
            config.devices.cpu_count = wanted;
        }
    }
}

/// Checks, before its daemon starts, that a worker training GPU towers (`--tower_device gpu`)
/// has a GPU for each tower: soft placement would otherwise run the towers on the CPU without
/// a word. `probe` finds the host's GPUs (the real one is [`crate::device::CudaProbe`]); the
/// count is of the GPUs `[devices]` lets the task use.
pub fn check_tower_gpus(config: &TaskConfig, spec: &TrainSpec, probe: &dyn GpuProbe) -> Result<()> {
    if Replica::of(&config.cluster, &config.task).is_none() || spec.tower_device != DeviceType::Gpu
    {
        return Ok(());
    }
    let task = &config.task;
    if !cfg!(feature = "cuda") {
        return Err(Status::failed_precondition(format!(
            "{task}: --tower_device gpu needs GPU kernels, and this tessera was built without \
             them; build it with `cargo build --release --features cuda`, or use --tower_device \
             cpu"
        )));
    }
    let (found, why) = match probe.scan() {
        GpuScan::Unavailable { reason } => (0, format!(" (no GPU driver: {reason})")),
        GpuScan::Found(_) => {
            let devices = crate::device::build_devices(task, &config.devices, probe)?;
            let gpus = devices.iter().filter(|d| d.device_type == "GPU").count();
            (gpus, String::new())
        }
    };
    if found >= spec.towers {
        return Ok(());
    }
    let instead = if found == 0 {
        "use --tower_device cpu".to_string()
    } else {
        format!("use --towers {found} or fewer, or --tower_device cpu")
    };
    Err(Status::failed_precondition(format!(
        "{task}: --tower_device gpu with --towers {} needs a GPU per tower, and this worker \
         has {found}{why} (of those [devices] allows); {instead}",
        spec.towers
    )))
}

/// How the training client reaches its own task's master: the cluster file's connect
/// timeout, [`STEP_TIMEOUT`] per step, the task's TLS and token, and device filters to the ps
/// tasks and this task (as between-graph TensorFlow programs set them): a session needs no
/// other worker, so one that is down or not up yet keeps nobody waiting.
fn connect_options(config: &TaskConfig) -> ConnectOptions {
    let mut options = ConnectOptions {
        connect_timeout: config.timeouts.connect,
        call_timeout: STEP_TIMEOUT,
        ..ConnectOptions::default()
    }
    .with_security(&config.security);
    options.config.device_filters = vec!["/job:ps".into(), config.task.device_prefix()];
    options
}

/// A worker's training, then its part of the ending.
fn train_worker(
    config: &TaskConfig,
    target: &str,
    spec: &TrainSpec,
    stop: &StopRequest,
) -> Result<Finished> {
    check(config, spec)?;
    let cluster = &config.cluster;
    let num_ps = cluster.num_tasks("ps")?;
    let replica = Replica::of(cluster, &config.task).ok_or_else(|| {
        Status::internal(format!("{} does not train, yet was asked to", config.task))
    })?;
    let (index, num_workers) = (replica.index as u32, replica.count);
    let is_chief = replica.is_chief();
    // A worker of a sparse TF_CONFIG does not know how many others train: it walks the
    // whole training set in its own order (its index seeds the shuffle), as the workers of
    // TensorFlow's dynamic-worker jobs each walk their own dataset.
    let unlisted = config.partial_cluster && !is_chief;
    let (train, held_out) = spec.load_data()?;
    let shard = if config.partial_cluster {
        train.shard(1, 0)?
    } else {
        train.shard(num_workers, index as usize)?
    };
    if shard.is_empty() {
        return Err(Status::invalid_argument(format!(
            "{}: its shard of {} training examples over {num_workers} workers is empty; use \
             more data or fewer workers",
            config.task,
            train.len()
        )));
    }
    // A shard smaller than a batch is trained on whole, one batch per step: that batch, too,
    // must split evenly over the towers.
    if shard.len() < spec.batch_size && shard.len() % spec.towers != 0 {
        return Err(Status::invalid_argument(format!(
            "{}: its shard of {} examples is smaller than --batch_size {} and does not divide \
             over --towers {}; use more data, a smaller batch or fewer towers",
            config.task,
            shard.len(),
            spec.batch_size,
            spec.towers
        )));
    }
    let placement = Placement {
        num_ps: num_ps as u32,
        job: config.task.job.clone(),
        chief: is_chief,
        worker_index: config.task.index,
        num_workers,
    };
    let built = model::build_for(spec, &placement, examples(&train, &held_out))?;
    let restored_from = if is_chief {
        match &spec.checkpoint_dir {
            Some(dir) => latest_checkpoint(dir)?,
            None => None,
        }
    } else {
        None
    };
    let summaries = match (&spec.logdir, is_chief) {
        (Some(dir), true) => Some(SummaryFile::create(dir)?),
        _ => None,
    };
    let ps0 = TaskId::new("ps", 0);
    if !is_chief {
        agree::check(target, &ps0, &config.task, spec, spec.wait_for_model)?;
    }
    let mut session = monitored_session(config, target, spec, &built, summaries.clone())?;
    if unlisted {
        // The chief does not know this worker: it learns of it from ps 0 and waits for its
        // last step there before it ends the job.
        signal::report_unlisted(target, &ps0, signal::UNLISTED_STARTED, index)?;
    }
    if is_chief {
        // The model is up (initialised or restored): the others may compare with it.
        agree::publish(target, &ps0, &config.task, spec)?;
    }
    if let Some(prefix) = &restored_from {
        tracing::info!(checkpoint = %prefix.display(), "restored the model");
    }
    let progress = is_chief.then(|| Progress::new(spec.steps));
    let trace = match (spec.trace_step, &spec.logdir) {
        (Some(at), Some(dir)) if is_chief => Some((at, dir.clone())),
        _ => None,
    };
    let outcome = train_loop(
        &mut session,
        &built,
        spec,
        &shard,
        index,
        progress,
        trace,
        stop,
    );
    let (global_step, final_loss, steps_per_sec, trace) = outcome?;
    if stop.is_requested() {
        // Closing runs the chief's checkpoint saver's `end`: a checkpoint at this step.
        session.close()?;
        let checkpoint = match (&spec.checkpoint_dir, is_chief) {
            (Some(dir), true) => latest_checkpoint(dir)?,
            _ => None,
        };
        return Ok(Finished::Stopped {
            global_step,
            checkpoint,
        });
    }
    if unlisted {
        // Its last update is in: the chief may end the job. No one can tell this worker
        // that training is over, and it needs no telling: its StopAtStep saw the last step.
        session.close()?;
        signal::report_unlisted(target, &ps0, signal::UNLISTED_FINISHED, index)?;
        return Ok(Finished::Worker { global_step });
    }
    if !is_chief {
        session.close()?;
        if let Err(e) = signal::report_finished(target, &replica.chief, index) {
            tracing::warn!(error = %e, "cannot tell the chief this worker finished");
        }
        signal::wait_for_done(target, &config.task, None)?;
        return Ok(Finished::Worker { global_step });
    }

    let others: Vec<TaskId> = cluster
        .all_tasks()
        .map(|(t, _)| t)
        .filter(|t| *t != config.task)
        .collect();
    let signals = ChiefSignals::connect(target, &config.task, &others, &ps0)?;
    let waiting = std::time::Instant::now();
    let reported = signals.wait_for_workers(num_workers - 1, WAIT_FOR_WORKERS);
    signals.wait_for_unlisted(WAIT_FOR_WORKERS.saturating_sub(waiting.elapsed()));
    let missing_workers = (1..num_workers as u32)
        .filter(|w| !reported.contains(w))
        .collect();
    let raw = session
        .raw_session()
        .ok_or_else(|| Status::internal("the monitored session has no session to evaluate in"))?;
    let held_out_scores = evaluate(raw, &built, &held_out, &train)?;
    let held_out_accuracy = held_out_scores.accuracy;
    let final_step = read_step(&session, &built)?.unwrap_or(global_step);
    if let Some(file) = &summaries {
        match &held_out_scores.regression {
            Some(r) => file.scalar(
                final_step,
                "mean_squared_error",
                r.mean_squared_error as f32,
            )?,
            None => file.scalar(final_step, "accuracy", held_out_accuracy as f32)?,
        }
        // Two classes: the log loss and AUC the chief prints, beside its accuracy.
        if let Some(auc) = held_out_scores.auc {
            file.scalar(final_step, "log_loss", held_out_scores.log_loss as f32)?;
            file.scalar(final_step, "auc", auc as f32)?;
        }
    }
    // Closing runs the checkpoint saver's `end`: the final checkpoint.
    session.close()?;
    let checkpoint = match &spec.checkpoint_dir {
        Some(dir) => latest_checkpoint(dir)?,
        None => None,
    };
    if let Err(e) = signals.announce_done() {
        tracing::warn!(error = %e, "ending the job");
    }
    Ok(Finished::Chief(Box::new(ChiefReport {
        global_step: final_step,
        held_out_accuracy,
        held_out_scores,
        held_out_examples: held_out.len(),
        final_loss,
        steps_per_sec,
        checkpoint,
        restored_from,
        missing_workers,
        logdir: summaries.and(spec.logdir.clone()),
        trace,
    })))
}

/// The monitored session: StopAtStep and NanTensor on every worker; the chief's step counter,
/// checkpoint saver (restoring the latest checkpoint first) and, given `summaries`, summary
/// saver on the chief.
fn monitored_session(
    config: &TaskConfig,
    target: &str,
    spec: &TrainSpec,
    built: &TrainGraph,
    summaries: Option<SummaryFile>,
) -> Result<MonitoredSession> {
    let is_chief = Replica::of(&config.cluster, &config.task).is_some_and(|r| r.is_chief());
    let graph = built.graph.clone();
    let target_owned = target.to_string();
    let options = connect_options(config);
    let create = Box::new(move || {
        let session = Session::connect_with(&target_owned, options.clone())?;
        session.extend(&graph)?;
        Ok(session)
    });
    let scaffold = Scaffold {
        init_op: Some(built.init_op.clone()),
        local_init_op: built.local_init_op.clone(),
        ready_op: built.ready.clone(),
    };
    let mut manager = SessionManager::new(create, scaffold, is_chief)
        .with_wait(Duration::from_secs(1), spec.wait_for_model);
    let mut training = TrainingConfig::new(&built.global_step);
    training.log_step_count = None;
    training.retry.startup = config.timeouts.startup;
    if is_chief {
        if let Some(dir) = &spec.checkpoint_dir {
            let saver = Arc::new(Saver::new(built.saver.clone(), MAX_TO_KEEP));
            let (restorer, restore_dir) = (saver.clone(), dir.clone());
            manager = manager.with_restore(Arc::new(move |session: &Session| {
                Ok(restorer.restore_latest(session, &restore_dir)?.is_some())
            }));
            let save_dir = dir.clone();
            let save: crate::train::monitored::SaveFn =
                Arc::new(move |session: &Session, step: i64| {
                    saver.save(session, &save_dir, Some(step)).map(|_| ())
                });
            training.checkpoint = Some((save, Every::Steps(spec.save_every_steps.max(1))));
        }
        training.log_step_count = Some(Every::Steps(1000));
    }
    let mut hooks: Vec<Box<dyn Hook>> = vec![
        Box::new(StopAtStepHook::new(
            &built.global_step,
            StopAt::LastStep(spec.steps),
        )),
        Box::new(NanTensorHook::new(&built.loss, true)),
    ];
    if let Some(file) = summaries {
        let histograms: Vec<(&str, &str)> = built
            .trainable
            .iter()
            .map(|(tag, tensor)| (tag.as_str(), tensor.as_str()))
            .collect();
        let hook = SummarySaverHook::new(
            file,
            &built.global_step,
            &[("loss", &built.loss)],
            Every::Steps(spec.summary_every_steps.max(1)),
            Arc::new(SystemClock),
        )?
        .with_histograms(&histograms)
        .with_step_rate();
        hooks.push(Box::new(hook));
    }
    // The chief's synchronous side runs in a hook, so that every session it creates (again
    // after a recovery: a ps task restarted, or its standby took over without the token queue)
    // gets the sync init, fresh tokens and an aggregation loop of its own.
    if let (TrainOp::Sync { ops, init_tokens }, true) = (&built.train, is_chief) {
        let (graph, target, options) = (
            built.graph.clone(),
            target.to_string(),
            connect_options(config),
        );
        let runner_session: crate::train::monitored::CreateSession = Box::new(move || {
            let own = Session::connect_with(&target, options.clone())?;
            own.extend(&graph)?;
            Ok(own)
        });
        hooks.push(Box::new(SyncReplicasHook::chief(
            ops,
            init_tokens,
            runner_session,
            Some(spec.steps),
        )));
    }
    training.hooks = hooks;
    MonitoredSession::training(manager, training)
}

/// Steps until a hook stops (the global step reached the last step), `stop` is requested or,
/// in synchronous training, until the chief closes the token queue. Returns the last global
/// step seen, the last batch loss, and the steps per second.
#[allow(clippy::too_many_arguments)]
fn train_loop(
    session: &mut MonitoredSession,
    built: &TrainGraph,
    spec: &TrainSpec,
    shard: &Dataset,
    index: u32,
    mut progress: Option<Progress>,
    trace: Option<(i64, PathBuf)>,
    stop: &StopRequest,
) -> Result<(i64, f32, f64, Option<PathBuf>)> {
    let options = BatchOptions::new(spec.batch_size)
        .seed(spec.seed.wrapping_add(u64::from(index)).wrapping_add(1))
        .drop_remainder(shard.len() >= spec.batch_size);
    let (mut step, mut loss) = (0i64, f32::NAN);
    let mut traced: Option<PathBuf> = None;
    let mut epoch = 0;
    let mut batches = shard.batches(&options, epoch)?;
    // What every step fetches and runs: the same each step.
    let (fetches, targets) = match &built.train {
        TrainOp::Async(op) => (
            vec![built.loss.as_str(), built.global_step.as_str()],
            vec![op.as_str()],
        ),
        TrainOp::Sync { ops, .. } => (
            vec![
                built.loss.as_str(),
                built.global_step.as_str(),
                ops.train_op.as_str(),
            ],
            Vec::new(),
        ),
    };
    while !session.should_stop() && !stop.is_requested() {
        let batch = match batches.next() {
            Some(batch) => batch,
            None => {
                epoch += 1;
                batches = shard.batches(&options, epoch)?;
                continue;
            }
        };
        let feeds = feeds(batch);
        let result = match &trace {
            Some((at, dir)) if traced.is_none() && step >= *at => {
                traced_step(session, &feeds, &fetches, &targets, dir).map(|(values, path)| {
                    traced = Some(path);
                    values
                })
            }
            _ => session.run(&feeds, &fetches, &targets),
        };
        match result {
            Ok(values) => {
                loss = values[0].scalar_value::<f32>()?;
                step = values[1].scalar_value::<i64>()?;
                if let Some(progress) = &mut progress {
                    progress.update(step, loss);
                }
            }
            // The chief closed the token queue: synchronous training is over.
            Err(e)
                if e.code() == Code::OutOfRange && matches!(built.train, TrainOp::Sync { .. }) =>
            {
                tracing::info!("the token queue is closed; synchronous training is over");
                break;
            }
            Err(e) => return Err(e),
        }
    }
    if let Some(progress) = &mut progress {
        // The step fetched last was read while the update ran; show where training ended.
        if let Ok(Some(now)) = read_step(session, built) {
            step = step.max(now);
        }
        progress.update(step, loss);
    }
    let rate = progress.as_mut().map_or(0.0, |p| p.finish(step));
    Ok((step, loss, rate, traced))
}

/// Runs one training step with a full trace of every task it touches and writes the trace to
/// `dir/trace-step-N.json` (N: the global step the step read) as Chrome's trace format.
fn traced_step(
    session: &mut MonitoredSession,
    feeds: &[(&str, crate::tensor::Tensor)],
    fetches: &[&str],
    targets: &[&str],
    dir: &std::path::Path,
) -> Result<(Vec<crate::tensor::Tensor>, PathBuf)> {
    let options = RunOptions {
        trace_level: TraceLevel::FullTrace as i32,
        ..Default::default()
    };
    let (values, metadata) = session.run_with_options(feeds, fetches, targets, &options)?;
    let at = values[1].scalar_value::<i64>()?;
    let path = dir.join(format!("trace-step-{at}.json"));
    let trace = chrome_trace(&metadata.step_stats.unwrap_or_default());
    std::fs::write(&path, trace).map_err(|e| {
        Status::permission_denied(format!(
            "cannot write the step trace {}: {e}; choose a writable --logdir",
            path.display()
        ))
    })?;
    Ok((values, path))
}

/// The global step now, if the session is up.
fn read_step(session: &MonitoredSession, built: &TrainGraph) -> Result<Option<i64>> {
    match session.raw_session() {
        Some(s) => Ok(Some(
            s.run(&[], &[&built.global_step], &[])?[0].scalar_value::<i64>()?,
        )),
        None => Ok(None),
    }
}

/// What a step feeds from `batch`: the features, the ids when the data has them, the labels.
fn feeds(batch: crate::data::Batch) -> Vec<(&'static str, crate::tensor::Tensor)> {
    let mut feeds = vec![(X, batch.x)];
    if let Some(ids) = batch.ids {
        feeds.push((IDS, ids));
    }
    feeds.push((Y, batch.y));
    feeds
}

/// The model's scores on `held_out` (the baseline's label mean from `train`), in steps of at
/// most [`EVAL_BATCH`] examples.
/// What the model's inputs and outputs are for these examples: a regression's "classes" are
/// its targets per example, the model's outputs.
pub(super) fn examples(train: &Dataset, held_out: &Dataset) -> Examples {
    let classes = match train.num_targets() {
        0 => train.num_classes().max(held_out.num_classes()),
        targets => targets,
    };
    Examples {
        features: train.num_features(),
        ids: train.num_ids(),
        classes,
    }
}

/// The model's scores on `held_out` in `raw` (the class balance from `train`'s labels).
pub(super) fn evaluate(
    raw: &Session,
    built: &TrainGraph,
    held_out: &Dataset,
    train: &Dataset,
) -> Result<Scores> {
    let indices: Vec<usize> = (0..held_out.len()).collect();
    let mut logits = Vec::with_capacity(held_out.len());
    for chunk in indices.chunks(EVAL_BATCH) {
        let batch = held_out.select(chunk).to_batch()?;
        logits.push(raw.run(&feeds(batch), &[&built.logits], &[])?.remove(0));
    }
    if held_out.num_targets() > 0 {
        let targets: Vec<f32> = (0..held_out.len())
            .flat_map(|i| held_out.targets(i).iter().copied())
            .collect();
        return Scores::of_regression(&logits, &targets);
    }
    Scores::of(&logits, held_out.labels(), train.labels())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(job: &str, cpu: u32) -> TaskConfig {
        let mut config = TaskConfig::local();
        config.task = TaskId::new(job, 0);
        config.devices.cpu_count = NonZeroU32::new(cpu).unwrap();
        config
    }

    fn with_towers(towers: usize) -> TrainSpec {
        TrainSpec {
            towers,
            ..TrainSpec::default()
        }
    }

    #[test]
    fn a_job_confines_checkpoints_to_its_checkpoint_dir_created_when_missing() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("ckpt");
        let spec = TrainSpec {
            checkpoint_dir: Some(dir.clone()),
            ..TrainSpec::default()
        };
        let mut ps = config("ps", 1);
        ps.checkpoints.allowed_dirs = Some(vec![scratch.path().join("kept")]);
        confine_checkpoints(&mut ps, &spec).unwrap();
        assert!(dir.is_dir());
        assert_eq!(
            ps.checkpoints.allowed_dirs,
            Some(vec![scratch.path().join("kept"), dir])
        );
        // Without a checkpoint directory, nothing is allowed.
        let mut worker = config("worker", 1);
        confine_checkpoints(&mut worker, &TrainSpec::default()).unwrap();
        assert_eq!(worker.checkpoints.allowed_dirs, Some(vec![]));
    }

    #[test]
    fn a_job_lets_its_tasks_read_its_data_files_directories() {
        let scratch = tempfile::tempdir().unwrap();
        let data = scratch.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let spec = TrainSpec {
            data: crate::train::job::DataSource::Idx {
                images: data.join("images.idx"),
                labels: data.join("labels.idx"),
            },
            ..TrainSpec::default()
        };
        let mut worker = config("worker", 1);
        worker.data.allowed_dirs = Some(vec![scratch.path().join("kept")]);
        confine_data(&mut worker, &spec);
        assert_eq!(
            worker.data.allowed_dirs,
            Some(vec![scratch.path().join("kept"), data])
        );
        assert!(worker.data.widen_hint.is_some());
        // Built-in data adds nothing: with the checkpoint directory confined, reads stay
        // under it.
        let mut ps = config("ps", 1);
        confine_data(&mut ps, &TrainSpec::default());
        confine_checkpoints(&mut ps, &TrainSpec::default()).unwrap();
        assert_eq!(ps.data.allowed_dirs, None);
        assert_eq!(ps.data.read_dirs(&ps.checkpoints), Some(vec![]));
        // A file whose directory is missing is left to the reader.
        let missing = TrainSpec {
            data: crate::train::job::DataSource::parse("csv:/no/such/dir/a.csv").unwrap(),
            ..TrainSpec::default()
        };
        let mut chief = config("worker", 1);
        confine_data(&mut chief, &missing);
        assert_eq!(chief.data.allowed_dirs, None);
    }

    /// A probe that finds `gpus` GPUs of 16 GiB, or no driver at all.
    struct FakeGpus(Option<usize>);

    impl GpuProbe for FakeGpus {
        fn scan(&self) -> GpuScan {
            match self.0 {
                None => GpuScan::Unavailable {
                    reason: "libcuda not found".into(),
                },
                Some(n) => GpuScan::Found(
                    (0..n as u32)
                        .map(|ordinal| crate::device::GpuInfo {
                            ordinal,
                            name: "Fake GPU".into(),
                            total_memory: 16 << 30,
                            pci_bus_id: None,
                            compute_capability: Some((9, 0)),
                        })
                        .collect(),
                ),
            }
        }
    }

    #[test]
    fn gpu_towers_need_a_gpu_per_tower_on_a_worker() {
        let gpu_towers = |towers| TrainSpec {
            towers,
            tower_device: DeviceType::Gpu,
            ..TrainSpec::default()
        };
        let worker = config("worker", 1);
        // A ps holds variables only, and CPU towers need no GPU.
        check_tower_gpus(&config("ps", 1), &gpu_towers(2), &FakeGpus(None)).unwrap();
        check_tower_gpus(&worker, &with_towers(2), &FakeGpus(None)).unwrap();
        if !cfg!(feature = "cuda") {
            let err = check_tower_gpus(&worker, &gpu_towers(1), &FakeGpus(Some(1))).unwrap_err();
            assert_eq!(err.code(), Code::FailedPrecondition);
            assert!(err.message().contains("--features cuda"), "{err}");
            return;
        }
        check_tower_gpus(&worker, &gpu_towers(2), &FakeGpus(Some(2))).unwrap();
        let err = check_tower_gpus(&worker, &gpu_towers(2), &FakeGpus(None)).unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition);
        for part in [
            "/job:worker",
            "--towers 2",
            "has 0",
            "libcuda not found",
            "--tower_device cpu",
        ] {
            assert!(err.message().contains(part), "{part}: {err}");
        }
        let err = check_tower_gpus(&worker, &gpu_towers(4), &FakeGpus(Some(3))).unwrap_err();
        assert!(err.message().contains("has 3"), "{err}");
        assert!(err.message().contains("--towers 3 or fewer"), "{err}");
        // [devices] gpu = 1 leaves one of the host's two GPUs to the task.
        let mut one = config("worker", 1);
        one.devices.gpu_count = Some(1);
        let err = check_tower_gpus(&one, &gpu_towers(2), &FakeGpus(Some(2))).unwrap_err();
        assert!(err.message().contains("has 1"), "{err}");
    }

    #[test]
    fn a_worker_gets_a_cpu_device_per_tower_unless_it_asks_for_more() {
        let mut worker = config("worker", 1);
        provide_tower_devices(&mut worker, &with_towers(3));
        assert_eq!(worker.devices.cpu_count.get(), 3);
        let mut bigger = config("worker", 4);
        provide_tower_devices(&mut bigger, &with_towers(2));
        assert_eq!(bigger.devices.cpu_count.get(), 4);
        let mut ps = config("ps", 1);
        provide_tower_devices(&mut ps, &with_towers(2));
        assert_eq!(ps.devices.cpu_count.get(), 1);
    }
}
