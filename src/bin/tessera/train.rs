//! `tessera train` (one task of a training job) and `tessera local` (the embedded cluster).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use clap::Args;
use tessera::cluster::ClusterSpec;
use tessera::device::DeviceType;
use tessera::train::job::launcher::{Ended, LocalJob};
use tessera::train::job::{
    ChiefReport, DataSource, Finished, ModelKind, Replica, StopRequest, SyncSpec, TrainSpec,
};
use tracing::info;

use crate::serve::{start_and_announce, Signals, TaskArgs};
use crate::{parse_duration, Stopped};

/// How long a ps or worker keeps serving after the chief said training is over.
const LINGER: Duration = Duration::from_secs(1);
/// How long a signalled worker may take to finish its step in flight (and the chief its final
/// checkpoint) before the task exits without them.
const STOP_GRACE: Duration = Duration::from_secs(60);

#[derive(Debug, Args)]
pub(crate) struct TrainArgs {
    #[command(flatten)]
    pub(crate) task: TaskArgs,
    #[command(flatten)]
    pub(crate) training: TrainingFlags,
}

#[derive(Debug, Args)]
pub(crate) struct LocalArgs {
    #[command(flatten)]
    pub(crate) training: TrainingFlags,
    /// How long the whole job may take before every task is killed.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub(crate) timeout: Duration,
    /// ps tasks of the local cluster (the variables are spread over them; the embedding
    /// model's tables get one part on each).
    #[arg(long, default_value_t = 1)]
    pub(crate) ps: usize,
    /// Worker tasks of the local cluster (worker 0 is the chief).
    #[arg(long, default_value_t = 2)]
    pub(crate) workers: usize,
    /// Give each ps task a standby: a second daemon (`ps_standby` job) that holds a copy of the
    /// task's variables and takes the task over if it dies.
    #[arg(long)]
    pub(crate) standby: bool,
}

/// The model and training flags, the same for every task of a job.
#[derive(Clone, Debug, Args)]
pub(crate) struct TrainingFlags {
    /// The model: softmax (regression), mlp, cnn (3x3 convolutions with ReLU and 2x2 max
    /// pooling, then a dense layer; each example read as a square grayscale image: 8x8 for the
    /// digits, 28x28 for MNIST), or embedding (wide and deep: each id column hashed into two
    /// tables partitioned over every ps task, an embedding per id into dense layers, a weight
    /// per id added to the logits; --data clicks or csv:PATH with --id_columns), or regression
    /// (x W + b against real-valued targets, squared error, adagrad by default; --data teacher,
    /// sized by --inputs, --outputs and --teacher_rank). The cnn trains well with the same
    /// defaults as the mlp (adam, 0.01, batches of 64, 1000 steps).
    #[arg(long, default_value = "mlp")]
    model: String,
    /// Hidden layer widths of the mlp (and of the embedding model's deep part).
    #[arg(
        allow_negative_numbers = true,
        long,
        value_delimiter = ',',
        default_value = "128"
    )]
    hidden: Vec<usize>,
    /// Filters of each convolution of the cnn, input side first (default: 16,32).
    #[arg(allow_negative_numbers = true, long, value_delimiter = ',')]
    filters: Vec<usize>,
    /// Rows of the embedding model's tables (default: 1000000).
    #[arg(allow_negative_numbers = true, long = "table_rows")]
    table_rows: Option<usize>,
    /// The embedding model's embedding width (default: 32).
    #[arg(allow_negative_numbers = true, long = "embedding_dim")]
    embedding_dim: Option<usize>,
    /// Features per example of the teacher's data (`--model regression`; default: 1024).
    #[arg(allow_negative_numbers = true, long)]
    inputs: Option<usize>,
    /// Targets per example of the teacher's data (`--model regression`; default: 4096).
    #[arg(allow_negative_numbers = true, long)]
    outputs: Option<usize>,
    /// The rank of the teacher's map from features to targets (default: 8).
    #[arg(allow_negative_numbers = true, long = "teacher_rank")]
    teacher_rank: Option<usize>,
    /// The optimizer: gd, momentum, adagrad, adam or rmsprop (default: adam; adagrad for the
    /// embedding model, whose tables it updates row by row, where adam would update every row
    /// every step).
    #[arg(long)]
    optimizer: Option<String>,
    #[arg(
        allow_negative_numbers = true,
        long = "learning_rate",
        default_value_t = 0.01
    )]
    learning_rate: f64,
    /// Examples per step and worker.
    #[arg(
        allow_negative_numbers = true,
        long = "batch_size",
        default_value_t = 64
    )]
    batch_size: usize,
    /// In-graph towers per worker: split each batch over this many devices of the worker and
    /// average their gradients (CPU towers: the worker gets that many `[devices] cpu`).
    #[arg(allow_negative_numbers = true, long, default_value_t = 1)]
    towers: usize,
    /// What the towers run on: cpu (`CPU:0..N-1`) or gpu (`GPU:0..N-1`, the GPUs the worker
    /// has).
    #[arg(long = "tower_device", default_value = "cpu", value_parser = parse_tower_device)]
    tower_device: DeviceType,
    /// Sum the towers' gradients among the tower devices (NCCL between GPUs) instead of on
    /// the worker's CPU:0.
    #[arg(long = "all_reduce")]
    all_reduce: bool,
    /// Training ends when the global step reaches this.
    #[arg(allow_negative_numbers = true, long, default_value_t = 1000)]
    steps: i64,
    /// Synchronous replication: average the gradients of `--replicas_to_aggregate` workers per
    /// update, applied with `--optimizer`.
    #[arg(long)]
    sync: bool,
    /// Gradients per synchronous update (default: every worker).
    #[arg(allow_negative_numbers = true, long = "replicas_to_aggregate")]
    replicas_to_aggregate: Option<usize>,
    /// The chief saves checkpoints here and restores the latest at start.
    #[arg(long = "checkpoint_dir")]
    checkpoint_dir: Option<PathBuf>,
    /// Save a checkpoint every this many global steps (and at the end).
    #[arg(
        allow_negative_numbers = true,
        long = "save_every",
        default_value_t = 100
    )]
    save_every: u64,
    /// The chief writes TensorBoard event files here (default: runs/<YYYYmmdd-HHMMSS>, UTC,
    /// under the working directory).
    #[arg(long)]
    logdir: Option<PathBuf>,
    /// The chief writes summaries (loss, global steps/s, the variables' histograms) every
    /// this many global steps.
    #[arg(
        allow_negative_numbers = true,
        long = "summary_every",
        default_value_t = 10
    )]
    summary_every: u64,
    /// The chief traces its first step at or after this global step (every task, FULL_TRACE)
    /// and writes it beside the event files as a Chrome trace (LOGDIR/trace-step-N.json).
    #[arg(allow_negative_numbers = true, long = "trace_step")]
    trace_step: Option<i64>,
    /// The data: digits (the built-in handwritten digits), synthetic (seeded Gaussian blobs),
    /// clicks (a built-in synthetic click log: 4 id columns and 4 dense features, a 0/1
    /// label), csv:PATH (numeric features and an integer label, the last column unless
    /// --label_column says; a header line is detected; id columns with --id_columns),
    /// tfrecord:PATH (tf.train.Examples; --feature_keys, --label_key) or idx:IMAGES,LABELS
    /// (default: digits; clicks for the embedding model).
    #[arg(long)]
    data: Option<String>,
    /// The CSV column holding the label: a header name or a 0-based index (default: the
    /// last column).
    #[arg(long = "label_column")]
    label_column: Option<String>,
    /// The CSV file's first line is a header, even when its names are numbers (without the
    /// flag a first row that is not all numbers is read as the header).
    #[arg(long = "csv_header")]
    csv_header: bool,
    /// The CSV columns holding integer ids, for the embedding model: header names or 0-based
    /// indices, comma-separated. The other columns but the label's are dense features.
    #[arg(long = "id_columns", value_delimiter = ',')]
    id_columns: Vec<String>,
    /// The TFRecord file's feature keys (float or int64 lists of tf.train.Example),
    /// concatenated in this order (default: every key but the label's, in name order).
    #[arg(long = "feature_keys", value_delimiter = ',')]
    feature_keys: Vec<String>,
    /// The TFRecord file's label key (an int64 class; default: label).
    #[arg(long = "label_key")]
    label_key: Option<String>,
    /// Seeds the data, the initial weights and the batch order.
    #[arg(allow_negative_numbers = true, long, default_value_t = 1)]
    seed: u64,
    /// The fraction of examples held out for the final accuracy.
    #[arg(
        allow_negative_numbers = true,
        long = "held_out",
        default_value_t = 0.2
    )]
    held_out: f64,
    /// How long a worker waits for the chief to initialise the model (default: the startup
    /// timeout).
    #[arg(long = "wait_for_model", value_parser = parse_duration)]
    wait_for_model: Option<Duration>,
    /// How long a task waits for the job's other tasks to come up: they may start in any
    /// order (default 2h, as TensorFlow's; the cluster file's [timeouts] startup).
    #[arg(long = "startup_timeout", value_parser = parse_duration)]
    startup_timeout: Option<Duration>,
}

impl TrainingFlags {
    /// The spec for a cluster of `num_workers` workers.
    pub(crate) fn to_spec(&self, num_workers: usize) -> anyhow::Result<TrainSpec> {
        let sync = self.sync.then(|| SyncSpec {
            replicas_to_aggregate: self.replicas_to_aggregate.unwrap_or(num_workers),
            total_num_replicas: num_workers,
        });
        if !self.sync && self.replicas_to_aggregate.is_some() {
            bail!("--replicas_to_aggregate needs --sync");
        }
        let model = ModelKind::from_name(&self.model, &self.hidden)?
            .with_filters(&self.filters)?
            .with_table(self.table_rows, self.embedding_dim)?;
        let default_data = match model {
            ModelKind::Embedding { .. } => "clicks",
            ModelKind::Regression => "teacher",
            _ => "digits",
        };
        let optimizer = self.optimizer.clone().unwrap_or_else(|| {
            match model {
                ModelKind::Embedding { .. } | ModelKind::Regression => "adagrad",
                _ => "adam",
            }
            .into()
        });
        Ok(TrainSpec {
            model,
            optimizer,
            learning_rate: self.learning_rate,
            batch_size: self.batch_size,
            towers: self.towers,
            tower_device: self.tower_device,
            all_reduce: self.all_reduce,
            steps: self.steps,
            sync,
            checkpoint_dir: self.checkpoint_dir.clone(),
            save_every_steps: self.save_every,
            logdir: Some(self.logdir.clone().unwrap_or_else(default_logdir)),
            summary_every_steps: self.summary_every,
            trace_step: self.trace_step,
            data: DataSource::parse(self.data.as_deref().unwrap_or(default_data))?
                .with_csv_options(
                    self.label_column.as_deref(),
                    self.csv_header,
                    &self.id_columns,
                )?
                .with_tfrecord_options(&self.feature_keys, self.label_key.as_deref())?
                .with_teacher_sizes(self.inputs, self.outputs, self.teacher_rank)?,
            seed: self.seed,
            held_out_fraction: self.held_out,
            wait_for_model: self
                .wait_for_model
                .or(self.startup_timeout)
                .unwrap_or(TrainSpec::default().wait_for_model),
        })
    }

    /// The same flags as command-line arguments, for the children of `tessera local`.
    pub(crate) fn to_args(&self) -> Vec<String> {
        let hidden: Vec<String> = self.hidden.iter().map(usize::to_string).collect();
        let mut args = vec![
            format!("--model={}", self.model),
            format!("--hidden={}", hidden.join(",")),
            format!("--learning_rate={}", self.learning_rate),
            format!("--batch_size={}", self.batch_size),
            format!("--towers={}", self.towers),
            format!(
                "--tower_device={}",
                self.tower_device.as_str().to_lowercase()
            ),
            format!("--steps={}", self.steps),
            format!("--save_every={}", self.save_every),
            format!("--summary_every={}", self.summary_every),
            format!("--seed={}", self.seed),
            format!("--held_out={}", self.held_out),
        ];
        if let Some(wait) = self.wait_for_model {
            args.push(format!("--wait_for_model={}ms", wait.as_millis()));
        }
        if let Some(wait) = self.startup_timeout {
            args.push(format!("--startup_timeout={}ms", wait.as_millis()));
        }
        if !self.filters.is_empty() {
            let filters: Vec<String> = self.filters.iter().map(usize::to_string).collect();
            args.push(format!("--filters={}", filters.join(",")));
        }
        if let Some(data) = &self.data {
            args.push(format!("--data={data}"));
        }
        if let Some(optimizer) = &self.optimizer {
            args.push(format!("--optimizer={optimizer}"));
        }
        if let Some(rows) = self.table_rows {
            args.push(format!("--table_rows={rows}"));
        }
        if let Some(dim) = self.embedding_dim {
            args.push(format!("--embedding_dim={dim}"));
        }
        if let Some(n) = self.inputs {
            args.push(format!("--inputs={n}"));
        }
        if let Some(n) = self.outputs {
            args.push(format!("--outputs={n}"));
        }
        if let Some(rank) = self.teacher_rank {
            args.push(format!("--teacher_rank={rank}"));
        }
        if !self.id_columns.is_empty() {
            args.push(format!("--id_columns={}", self.id_columns.join(",")));
        }
        if self.sync {
            args.push("--sync".into());
        }
        if self.all_reduce {
            args.push("--all_reduce".into());
        }
        if let Some(label) = &self.label_column {
            args.push(format!("--label_column={label}"));
        }
        if self.csv_header {
            args.push("--csv_header".into());
        }
        if !self.feature_keys.is_empty() {
            args.push(format!("--feature_keys={}", self.feature_keys.join(",")));
        }
        if let Some(label) = &self.label_key {
            args.push(format!("--label_key={label}"));
        }
        if let Some(n) = self.replicas_to_aggregate {
            args.push(format!("--replicas_to_aggregate={n}"));
        }
        if let Some(dir) = &self.checkpoint_dir {
            args.push(format!("--checkpoint_dir={}", dir.display()));
        }
        if let Some(dir) = &self.logdir {
            args.push(format!("--logdir={}", dir.display()));
        }
        if let Some(step) = self.trace_step {
            args.push(format!("--trace_step={step}"));
        }
        args
    }
}

/// `runs/<YYYYmmdd-HHMMSS>` (UTC, now) under the working directory: where the chief writes
/// its event files without `--logdir`.
fn default_logdir() -> PathBuf {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    PathBuf::from("runs").join(utc_stamp(now))
}

/// `YYYYmmdd-HHMMSS` of a Unix time, in UTC.
fn utc_stamp(unix_seconds: u64) -> String {
    let (days, secs) = (unix_seconds / 86_400, unix_seconds % 86_400);
    // Howard Hinnant's days-to-civil, for days since 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// `--tower_device`: `cpu` or `gpu`.
fn parse_tower_device(s: &str) -> anyhow::Result<DeviceType> {
    match s.to_ascii_lowercase().as_str() {
        "cpu" => Ok(DeviceType::Cpu),
        "gpu" => Ok(DeviceType::Gpu),
        _ => bail!("`{s}` is not a tower device; use cpu or gpu"),
    }
}

/// `tessera local` (and `tessera` alone): the embedded cluster as child processes.
pub(crate) fn local(mut args: LocalArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find this program's path")?;
    // Every task gets the same log directory: the default is chosen once, here.
    if args.training.logdir.is_none() {
        args.training.logdir = Some(default_logdir());
    }
    if args.ps == 0 || args.workers == 0 {
        bail!(
            "--ps {} --workers {}: a local cluster needs at least one ps and one worker",
            args.ps,
            args.workers
        );
    }
    // Bad flags are refused here once, not by every child.
    let spec = args.training.to_spec(args.workers)?;
    spec.validate(args.workers)?;
    spec.check_logdir()?;
    let plural =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    println!(
        "tessera: local cluster of {}{} and {} training {} on {} for {} steps",
        plural(args.ps, "ps", "ps"),
        if args.standby {
            " (each with a standby)"
        } else {
            ""
        },
        plural(args.workers, "worker", "workers"),
        spec.model.describe(),
        spec.data.describe(),
        spec.steps
    );
    let ended = tessera::train::job::launcher::run_local(&LocalJob {
        exe,
        train_args: args.training.to_args(),
        deadline: args.timeout,
        ps: args.ps,
        workers: args.workers,
        standby: args.standby,
    })?;
    match ended {
        Ended::Completed(peaks) => {
            println!("tessera: every task exited 0");
            let peaks: Vec<String> = peaks
                .iter()
                .map(|(task, bytes)| format!("{task} {:.1} MiB", *bytes as f64 / (1 << 20) as f64))
                .collect();
            println!("tessera: peak resident memory: {}", peaks.join(", "));
            Ok(())
        }
        Ended::Signalled(signal) => Err(Stopped { signal }.into()),
    }
}

/// `tessera train`: this task's daemon and its part of the job; exits 0 once the chief says
/// training is over (the chief: once it told the others). SIGTERM or SIGINT before that stops
/// a worker after its step in flight, the chief after a final checkpoint, and exits 143 or
/// 130: a restarted task goes on from there.
pub(crate) fn train(args: TrainArgs) -> anyhow::Result<()> {
    if let Some(cluster) = evaluator_cluster(&args)? {
        return evaluate(&args, &cluster);
    }
    let mut config = args.task.load()?;
    if let Some(wait) = args.training.startup_timeout {
        config.timeouts.startup = wait;
    }
    let replicas = tessera::train::job::Replica::count(&config.cluster);
    let mut spec = args.training.to_spec(replicas)?;
    let args_steps = spec.steps;
    if args.training.wait_for_model.is_none() {
        spec.wait_for_model = config.timeouts.startup;
    }
    tessera::train::job::check(&config, &spec)?;
    tessera::train::job::check_tower_gpus(&config, &spec, &tessera::device::CudaProbe)?;
    tessera::train::job::provide_tower_devices(&mut config, &spec);
    tessera::train::job::confine_checkpoints(&mut config, &spec)?;
    tessera::train::job::confine_data(&mut config, &spec);
    let task = config.task.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot build the signal runtime")?;
    let mut signals = runtime.block_on(async { Signals::install() })?;
    let server = start_and_announce(config.clone())?;
    let addr = server.local_addr();
    // The client reaches its own server on loopback when it listens on every interface.
    let own = if addr.ip().is_unspecified() {
        SocketAddr::from(([127, 0, 0, 1], addr.port()))
    } else {
        addr
    };
    let target = format!("grpc://{own}");
    let stop = StopRequest::new();
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    let training = stop.clone();
    std::thread::Builder::new()
        .name("tessera-train".into())
        .spawn(move || {
            let _ = tx.send(tessera::train::job::run(&config, &target, &spec, &training));
        })
        .context("cannot start the training thread")?;
    let outcome = runtime.block_on(async {
        tokio::select! {
            signal = signals.recv() => Err(signal),
            finished = &mut rx => Ok(finished),
        }
    });
    let outcome = match outcome {
        Ok(finished) => Ok(finished),
        // A ps holds nothing to save: it stops at once, and comes back with the checkpoint.
        Err(signal) if task.job != "worker" => Err((signal, None)),
        Err(signal) => {
            info!(
                task = %task,
                reason = %signal,
                "stopping after the step in flight (the chief: after a final checkpoint)"
            );
            stop.request();
            let waited = runtime.block_on(async {
                tokio::select! {
                    again = signals.recv() => Err(again),
                    finished = tokio::time::timeout(STOP_GRACE, &mut rx) => Ok(finished),
                }
            });
            match waited {
                Ok(Ok(Ok(finished))) => Err((signal, Some(finished))),
                Ok(Ok(Err(_))) => bail!("{task}: the training thread ended without a result"),
                Ok(Err(_)) => {
                    tracing::warn!(task = %task, "the step in flight did not end in {STOP_GRACE:?}");
                    Err((signal, None))
                }
                Err(_) => Err((signal, None)),
            }
        }
    };
    if let Ok(Ok(Ok(Finished::Ps | Finished::Worker { .. }))) = &outcome {
        // The chief's session that told this task is closed right after; serving a moment
        // longer lets that close reach it instead of a refused connection.
        std::thread::sleep(LINGER);
    }
    server.stop();
    match outcome {
        Err((signal, finished)) => {
            let checkpoint = match finished {
                Some(Ok(Finished::Stopped {
                    global_step,
                    checkpoint,
                })) => {
                    info!(task = %task, global_step, "stopped before training ended");
                    checkpoint
                }
                // Training ended as the signal came: the job is over, nothing to come back to.
                Some(Ok(Finished::Chief(report))) => {
                    print_report(&report);
                    return Ok(());
                }
                Some(Ok(
                    Finished::Ps | Finished::Worker { .. } | Finished::AlreadyEnded { .. },
                )) => return Ok(()),
                Some(Err(e)) => {
                    tracing::warn!(task = %task, error = %e, "the step in flight failed");
                    None
                }
                None => None,
            };
            if let Some(checkpoint) = &checkpoint {
                println!("tessera: checkpoint {}", checkpoint.display());
            }
            Err(Stopped { signal }.into())
        }
        Ok(Err(_)) => bail!("{task}: the training thread ended without a result"),
        Ok(Ok(Err(e))) => Err(anyhow::Error::new(e).context(task.to_string())),
        Ok(Ok(Ok(finished))) => {
            match finished {
                Finished::Chief(report) => print_report(&report),
                Finished::AlreadyEnded {
                    global_step,
                    checkpoint,
                } => println!(
                    "tessera: training already ended: checkpoint {} is at global step \
                     {global_step} of --steps {}; nothing to do",
                    checkpoint.display(),
                    args_steps
                ),
                _ => {}
            }
            Ok(())
        }
    }
}

/// The cluster of a `TF_CONFIG` whose task is the `evaluator`, when this task is one (no
/// `--config`, no classic flags).
fn evaluator_cluster(args: &TrainArgs) -> anyhow::Result<Option<ClusterSpec>> {
    let classic = &args.task.classic;
    if args.task.config.is_some() || classic.ps_hosts.is_some() || classic.job_name.is_some() {
        return Ok(None);
    }
    let Ok(json) = std::env::var("TF_CONFIG") else {
        return Ok(None);
    };
    let Ok(doc) = serde_json::from_str::<serde_json::Value>(&json) else {
        // TaskConfig::from_tf_config names what is wrong with it.
        return Ok(None);
    };
    if doc["task"]["type"].as_str() != Some("evaluator") {
        return Ok(None);
    }
    // A TFJob with dynamic workers writes `sparseCluster`, empty for an evaluator.
    let key = if doc["cluster"].is_null() && !doc["sparseCluster"].is_null() {
        "sparseCluster"
    } else {
        "cluster"
    };
    let cluster = ClusterSpec::from_json(&doc[key])
        .map_err(|e| anyhow!("TF_CONFIG: {key}: {}", e.message()))?;
    Ok(Some(cluster))
}

/// `tessera train` as `TF_CONFIG`'s evaluator: scores each checkpoint of the job's
/// `--checkpoint_dir` until the one at the last step; SIGTERM ends it early (exit 143).
fn evaluate(args: &TrainArgs, cluster: &ClusterSpec) -> anyhow::Result<()> {
    let spec = args.training.to_spec(Replica::count(cluster).max(1))?;
    let startup = args
        .training
        .startup_timeout
        .unwrap_or(tessera::cluster::Timeouts::default().startup);
    let stop = StopRequest::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot build the signal runtime")?;
    let mut signals = runtime.block_on(async { Signals::install() })?;
    let (tx, rx) = std::sync::mpsc::channel();
    let watcher = stop.clone();
    let cluster = cluster.clone();
    std::thread::Builder::new()
        .name("tessera-evaluator".into())
        .spawn(move || {
            let result =
                tessera::train::job::evaluator::run(&spec, &cluster, startup, &watcher, &mut |e| {
                    println!(
                        "tessera: checkpoint {} (global step {}): held-out accuracy {:.2} % on {} \
                         examples",
                        e.checkpoint.display(),
                        e.global_step,
                        100.0 * e.scores.accuracy,
                        e.held_out_examples
                    );
                });
            let _ = tx.send(result);
        })
        .context("cannot start the evaluator")?;
    let (tx_done, rx_done) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx_done.send(rx.recv());
    });
    let outcome = runtime.block_on(async {
        tokio::select! {
            signal = signals.recv() => Err(signal),
            done = rx_done => Ok(done),
        }
    });
    match outcome {
        Err(signal) => {
            stop.request();
            Err(Stopped { signal }.into())
        }
        Ok(Ok(Ok(result))) => Ok(result?),
        Ok(_) => bail!("the evaluator ended without a result"),
    }
}

/// The chief's last words, on stdout.
fn print_report(report: &ChiefReport) {
    if let Some(from) = &report.restored_from {
        println!("tessera: started from checkpoint {}", from.display());
    }
    println!(
        "tessera: trained to global step {} ({:.1} steps/s), last batch loss {:.4}",
        report.global_step, report.steps_per_sec, report.final_loss
    );
    let scores = &report.held_out_scores;
    match &scores.regression {
        Some(r) => println!(
            "tessera: held-out mean squared error {:.6} (predicting zeros: {:.6}) on {} examples",
            r.mean_squared_error, r.zeros_mean_squared_error, report.held_out_examples
        ),
        None => println!(
            "tessera: held-out accuracy {:.2} % on {} examples",
            100.0 * report.held_out_accuracy,
            report.held_out_examples
        ),
    }
    if let (Some(auc), Some(baseline)) = (scores.auc, scores.baseline_log_loss) {
        println!(
            "tessera: held-out log loss {:.4} (predicting the label mean: {baseline:.4}), AUC \
             {auc:.4}",
            scores.log_loss
        );
    }
    if let Some(checkpoint) = &report.checkpoint {
        println!("tessera: checkpoint {}", checkpoint.display());
    }
    if let Some(logdir) = &report.logdir {
        println!("tessera: tensorboard --logdir {}", logdir.display());
    }
    if let Some(trace) = &report.trace {
        println!(
            "tessera: step trace {} (open it in chrome://tracing or ui.perfetto.dev)",
            trace.display()
        );
    }
    if !report.missing_workers.is_empty() {
        println!(
            "tessera: workers {:?} did not report their last step",
            report.missing_workers
        );
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    #[test]
    fn the_default_logdir_is_named_by_the_utc_time() {
        assert_eq!(utc_stamp(0), "19700101-000000");
        // 2024-02-29 23:59:58 UTC, a leap day.
        assert_eq!(utc_stamp(1_709_251_198), "20240229-235958");
        assert_eq!(utc_stamp(1_795_697_343), "20261126-124903");
        let dir = default_logdir();
        assert!(dir.starts_with("runs"), "{}", dir.display());
    }

    #[test]
    fn local_hands_its_children_the_training_flags_it_was_given() {
        let given = [
            "tessera",
            "local",
            "--model",
            "softmax",
            "--optimizer",
            "gd",
            "--sync",
            "--replicas_to_aggregate",
            "1",
            "--steps",
            "7",
            "--checkpoint_dir",
            "/tmp/c",
            "--wait_for_model",
            "3s",
            "--hidden",
            "8,4",
            "--towers",
            "2",
            "--tower_device",
            "GPU",
            "--all_reduce",
            "--batch_size",
            "32",
            "--logdir",
            "/tmp/runs/a",
            "--summary_every",
            "5",
        ];
        let Some(Command::Local(local)) = Cli::parse_from(given).command else {
            panic!("not parsed as local");
        };
        let args = local.training.to_args();
        let mut train = vec!["tessera".to_string(), "train".into()];
        train.extend(args.iter().cloned());
        let Some(Command::Train(child)) = Cli::parse_from(train).command else {
            panic!("not parsed as train");
        };
        assert_eq!(child.training.to_args(), args);
        let spec = child.training.to_spec(2).unwrap();
        assert_eq!(spec.steps, 7);
        assert_eq!((spec.towers, spec.batch_size), (2, 32));
        assert_eq!(spec.tower_device, tessera::device::DeviceType::Gpu);
        assert!(spec.all_reduce);
        assert_eq!(spec.wait_for_model, Duration::from_secs(3));
        assert_eq!(spec.logdir, Some(PathBuf::from("/tmp/runs/a")));
        assert_eq!(spec.summary_every_steps, 5);
        assert_eq!(
            spec.model.hidden(),
            &[] as &[usize],
            "softmax has no hidden layers"
        );
        let sync = spec.sync.unwrap();
        assert_eq!(
            (sync.replicas_to_aggregate, sync.total_num_replicas),
            (1, 2)
        );
    }

    #[test]
    fn negative_numbers_reach_the_checks_that_name_them() {
        // `--steps -5` is the value -5, refused by the spec's check with its own message,
        // not an unknown argument `-5`.
        let Some(Command::Train(train)) =
            Cli::try_parse_from(["tessera", "train", "--steps", "-5"])
                .unwrap()
                .command
        else {
            panic!("not parsed as train");
        };
        let err = train.training.to_spec(2).and_then(|spec| {
            spec.validate(2)?;
            Ok(spec)
        });
        assert!(
            format!("{:#}", err.unwrap_err()).contains("--steps -5"),
            "the check names the flag"
        );
    }

    #[test]
    fn local_hands_its_children_the_tfrecord_keys() {
        let given = [
            "tessera",
            "local",
            "--data",
            "tfrecord:/data/train.tfrecord",
            "--feature_keys",
            "pixels,extra",
            "--label_key",
            "digit",
        ];
        let Some(Command::Local(local)) = Cli::parse_from(given).command else {
            panic!("not parsed as local");
        };
        let mut train = vec!["tessera".to_string(), "train".into()];
        train.extend(local.training.to_args());
        let Some(Command::Train(child)) = Cli::parse_from(train).command else {
            panic!("not parsed as train");
        };
        let options = tessera::data::tfrecord::TfRecordOptions {
            feature_keys: vec!["pixels".into(), "extra".into()],
            label_key: "digit".into(),
        };
        assert_eq!(
            child.training.to_spec(2).unwrap().data,
            DataSource::TfRecord {
                path: "/data/train.tfrecord".into(),
                options,
            }
        );
        // The keys belong to a TFRecord source only.
        let digits = ["tessera", "local", "--label_key", "digit"];
        let Some(Command::Local(local)) = Cli::parse_from(digits).command else {
            panic!("not parsed as local");
        };
        let err = local.training.to_spec(2).unwrap_err().to_string();
        assert!(err.contains("--data tfrecord:PATH only"), "{err}");
    }

    #[test]
    fn local_hands_its_children_the_cnns_filters() {
        let given = ["tessera", "local", "--model", "cnn", "--filters", "8,16,32"];
        let Some(Command::Local(local)) = Cli::parse_from(given).command else {
            panic!("not parsed as local");
        };
        let mut train = vec!["tessera".to_string(), "train".into()];
        train.extend(local.training.to_args());
        let Some(Command::Train(child)) = Cli::parse_from(train).command else {
            panic!("not parsed as train");
        };
        assert_eq!(
            child.training.to_spec(2).unwrap().model,
            ModelKind::Cnn {
                filters: vec![8, 16, 32]
            }
        );
        // Without --filters, the cnn's own default.
        let given = ["tessera", "local", "--model", "cnn"];
        let Some(Command::Local(local)) = Cli::parse_from(given).command else {
            panic!("not parsed as local");
        };
        assert_eq!(
            local.training.to_spec(2).unwrap().model,
            ModelKind::Cnn {
                filters: vec![16, 32]
            }
        );
    }
}
