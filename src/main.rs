//! The `tessera` command: train on the embedded local cluster, run one task of a training
//! job, run a task's daemon, check a cluster file, ask a task its status.
//!
//! ```text
//! tessera                      (same as `tessera local`)
//! tessera local [--steps 500 --optimizer adam ...]
//! tessera train --config cluster.toml --model mlp --hidden 64,32 --steps 1000 [--sync ...]
//! tessera train --config cluster.toml --towers 2    (batches split over CPU:0 and CPU:1)
//! tessera train --ps_hosts=h0:2222 --worker_hosts=h1:2222,h2:2222 --job_name=worker --task_index=0
//! tessera serve --config /etc/tessera/ps0.toml [--listen 0.0.0.0:2222]
//! tessera serve --ps_hosts=h0:2222 --worker_hosts=h1:2222 --job_name=ps --task_index=0
//! TF_CONFIG='{"cluster": ..., "task": ...}' tessera serve
//! tessera validate /etc/tessera/ps0.toml
//! tessera status grpc://h0:2222 [--timeout 5s]
//! tessera status grpcs://h0:2222 --ca ca.pem [--cert me.pem --key me.key] [--token-file token]
//! tessera export --safetensors model.safetensors /tmp/train/model.ckpt-1000
//! ```
//!
//! Under systemd socket activation (`LISTEN_FDS=1`, `LISTEN_PID` = our pid) `serve` takes the
//! listening socket from fd 3 instead of binding one (`config/tessera@.socket`).
//!
//! `serve` prints one readiness line on stdout once the port is bound and the actors are up
//! (`tessera: serving /job:ps/replica:0/task:0 on 127.0.0.1:2222`); logs go to stderr.
//!
//! Under systemd (`Type=notify`, `config/tessera@.service`) `serve` also sends `READY=1` at that
//! moment, `STATUS=` lines, `WATCHDOG=1` every half `WatchdogSec=` while it serves, and
//! `STOPPING=1` when it starts draining; with stderr on the journal (`JOURNAL_STREAM`) log
//! lines carry no colours and no timestamps of their own.

use std::io::{IsTerminal, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{FromRawFd, RawFd};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use clap::{Args, Parser, Subcommand};
use tessera::cluster::{ClassicFlags, TaskConfig};
use tessera::error::error_chain;
use tessera::ops::systemd::{self, Notifier};
use tessera::proto::worker_service_client::WorkerServiceClient;
use tessera::proto::{DeviceAttributes, GetStatusRequest};
use tessera::security::{ClusterToken, Security, TlsConfig};
use tessera::server::{Server, MAX_MESSAGE_BYTES};
use tessera::train::job::launcher::LocalJob;
use tessera::train::job::{ChiefReport, DataSource, Finished, ModelKind, SyncSpec, TrainSpec};
use tracing::{info, warn};

/// How long a ps or worker keeps serving after the chief said training is over.
const LINGER: Duration = Duration::from_secs(1);

#[derive(Debug, Parser)]
#[command(
    name = "tessera",
    version,
    about = "A distributed training runtime with TensorFlow's architecture"
)]
struct Cli {
    /// Without a command, `tessera local` runs with its defaults.
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Trains the MLP on the built-in data set with the embedded cluster (1 ps, 2 workers as
    /// child processes on loopback ports) and reports its accuracy.
    Local(LocalArgs),
    /// Runs this task of a training job: its daemon, and (for a worker) its training client.
    /// Exits 0 when the chief says training is over.
    Train(TrainArgs),
    /// Runs this task's daemon (MasterService and WorkerService on one port) until SIGTERM.
    Serve(ServeArgs),
    /// Checks a cluster file and names this task; exits 1 with the error when it is bad.
    Validate {
        /// The TOML cluster file.
        file: PathBuf,
    },
    /// Asks a running task for its devices (WorkerService GetStatus).
    Status {
        /// The task, as `grpc://HOST:PORT` (or `HOST:PORT`); `grpcs://HOST:PORT` for TLS.
        target: String,
        /// How long to wait for the task to answer (`5s`, `500ms`, `1m`).
        #[arg(long, default_value = "5s", value_parser = parse_duration)]
        timeout: Duration,
        #[command(flatten)]
        security: SecurityArgs,
    },
    /// Writes a checkpoint's tensors in another format.
    Export {
        /// Write this safetensors file (float32/float64/int32/int64/bool tensors; strings
        /// are skipped).
        #[arg(long, value_name = "OUT")]
        safetensors: PathBuf,
        /// The checkpoint: a prefix (`dir/model.ckpt-1000`) or a directory (its latest).
        checkpoint: PathBuf,
    },
}

/// How `tessera status` reaches a task that serves TLS or checks the cluster token.
#[derive(Debug, Args)]
struct SecurityArgs {
    /// Connect over TLS, checking the task's certificate against this CA file (PEM).
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
    /// This client's certificate (PEM), for a task that requires client certificates.
    #[arg(long, value_name = "FILE", requires = "key")]
    cert: Option<PathBuf>,
    /// The key of --cert (PEM).
    #[arg(long, value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
    /// Check the task's certificate against this name instead of the target's host.
    #[arg(long, value_name = "NAME")]
    server_name: Option<String>,
    /// Send the cluster token read from this file.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
}

impl SecurityArgs {
    /// Reads the files named; `tls` says whether the target asked for TLS.
    fn load(&self, tls: bool) -> anyhow::Result<Security> {
        let tls = match (&self.ca, tls) {
            (None, false) => {
                if self.cert.is_some() || self.server_name.is_some() {
                    bail!("--cert and --server-name need TLS: pass --ca with the cluster's CA");
                }
                None
            }
            (None, true) => bail!(
                "a grpcs:// target needs --ca FILE, the CA that signed the task's certificate"
            ),
            (Some(ca), _) => {
                let mut tls = TlsConfig::new(ca)?;
                if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
                    tls = tls.with_identity(cert, key)?;
                }
                if let Some(name) = &self.server_name {
                    tls = tls.server_name(name);
                }
                Some(tls)
            }
        };
        let token = match &self.token_file {
            Some(path) => Some(ClusterToken::from_file(path)?),
            None => None,
        };
        Ok(Security { tls, token })
    }
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// The TOML cluster file. Without it, the classic flags, then `TF_CONFIG`, are used.
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    classic: ClassicFlags,
    /// Listen on this address instead of the one the configuration gives (`127.0.0.1:0`).
    #[arg(long)]
    listen: Option<SocketAddr>,
}

#[derive(Debug, Args)]
struct TrainArgs {
    /// The TOML cluster file. Without it, the classic flags, then `TF_CONFIG`, are used.
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    classic: ClassicFlags,
    /// Listen on this address instead of the one the configuration gives.
    #[arg(long)]
    listen: Option<SocketAddr>,
    #[command(flatten)]
    training: TrainingFlags,
}

#[derive(Debug, Args)]
struct LocalArgs {
    #[command(flatten)]
    training: TrainingFlags,
    /// How long the whole job may take before every task is killed.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    timeout: Duration,
}

/// The model and training flags, the same for every task of a job.
#[derive(Clone, Debug, Args)]
struct TrainingFlags {
    /// The model: softmax (regression) or mlp.
    #[arg(long, default_value = "mlp")]
    model: String,
    /// Hidden layer widths of the mlp.
    #[arg(long, value_delimiter = ',', default_value = "64,32")]
    hidden: Vec<usize>,
    /// The optimizer: gd, momentum, adagrad, adam or rmsprop.
    #[arg(long, default_value = "adam")]
    optimizer: String,
    #[arg(long = "learning_rate", default_value_t = 0.01)]
    learning_rate: f64,
    /// Examples per step and worker.
    #[arg(long = "batch_size", default_value_t = 64)]
    batch_size: usize,
    /// In-graph towers per worker: split each batch over this many CPU devices of the worker
    /// (the worker gets that many `[devices] cpu`) and average their gradients.
    #[arg(long, default_value_t = 1)]
    towers: usize,
    /// Training ends when the global step reaches this.
    #[arg(long, default_value_t = 1000)]
    steps: i64,
    /// Synchronous replication: average the gradients of `--replicas_to_aggregate` workers per
    /// update, applied with `--optimizer`.
    #[arg(long)]
    sync: bool,
    /// Gradients per synchronous update (default: every worker).
    #[arg(long = "replicas_to_aggregate")]
    replicas_to_aggregate: Option<usize>,
    /// The chief saves checkpoints here and restores the latest at start.
    #[arg(long = "checkpoint_dir")]
    checkpoint_dir: Option<PathBuf>,
    /// Save a checkpoint every this many global steps (and at the end).
    #[arg(long = "save_every", default_value_t = 100)]
    save_every: u64,
    /// The data: synthetic, csv:PATH (features, then an integer label) or idx:IMAGES,LABELS.
    #[arg(long, default_value = "synthetic")]
    data: String,
    /// Seeds the data, the initial weights and the batch order.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The fraction of examples held out for the final accuracy.
    #[arg(long = "held_out", default_value_t = 0.2)]
    held_out: f64,
    /// How long a worker waits for the chief to initialise the model.
    #[arg(long = "wait_for_model", default_value = "120s", value_parser = parse_duration)]
    wait_for_model: Duration,
}

impl TrainingFlags {
    /// The spec for a cluster of `num_workers` workers.
    fn to_spec(&self, num_workers: usize) -> anyhow::Result<TrainSpec> {
        let sync = self.sync.then(|| SyncSpec {
            replicas_to_aggregate: self.replicas_to_aggregate.unwrap_or(num_workers),
            total_num_replicas: num_workers,
        });
        if !self.sync && self.replicas_to_aggregate.is_some() {
            bail!("--replicas_to_aggregate needs --sync");
        }
        Ok(TrainSpec {
            model: ModelKind::from_name(&self.model, &self.hidden)?,
            optimizer: self.optimizer.clone(),
            learning_rate: self.learning_rate,
            batch_size: self.batch_size,
            towers: self.towers,
            steps: self.steps,
            sync,
            checkpoint_dir: self.checkpoint_dir.clone(),
            save_every_steps: self.save_every,
            data: DataSource::parse(&self.data)?,
            seed: self.seed,
            held_out_fraction: self.held_out,
            wait_for_model: self.wait_for_model,
        })
    }

    /// The same flags as command-line arguments, for the children of `tessera local`.
    fn to_args(&self) -> Vec<String> {
        let hidden: Vec<String> = self.hidden.iter().map(usize::to_string).collect();
        let mut args = vec![
            format!("--model={}", self.model),
            format!("--hidden={}", hidden.join(",")),
            format!("--optimizer={}", self.optimizer),
            format!("--learning_rate={}", self.learning_rate),
            format!("--batch_size={}", self.batch_size),
            format!("--towers={}", self.towers),
            format!("--steps={}", self.steps),
            format!("--save_every={}", self.save_every),
            format!("--data={}", self.data),
            format!("--seed={}", self.seed),
            format!("--held_out={}", self.held_out),
            format!("--wait_for_model={}ms", self.wait_for_model.as_millis()),
        ];
        if self.sync {
            args.push("--sync".into());
        }
        if let Some(n) = self.replicas_to_aggregate {
            args.push(format!("--replicas_to_aggregate={n}"));
        }
        if let Some(dir) = &self.checkpoint_dir {
            args.push(format!("--checkpoint_dir={}", dir.display()));
        }
        args
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    // `tessera` alone is `tessera local` with its defaults.
    let command = cli
        .command
        .or_else(|| Cli::parse_from(["tessera", "local"]).command);
    let Some(command) = command else {
        eprintln!("tessera: no command; run `tessera --help`");
        return ExitCode::FAILURE;
    };
    let result = match command {
        Command::Local(args) => local(args),
        Command::Train(args) => train(args),
        Command::Serve(args) => serve(args),
        Command::Validate { file } => validate(&file),
        Command::Status {
            target,
            timeout,
            security,
        } => status(&target, timeout, &security),
        Command::Export {
            safetensors,
            checkpoint,
        } => export(&checkpoint, &safetensors),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tessera: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `tessera export --safetensors OUT CKPT`: one line per skipped tensor, then a summary.
fn export(checkpoint: &std::path::Path, out: &std::path::Path) -> anyhow::Result<()> {
    let summary = tessera::train::checkpoint::export::export_safetensors(checkpoint, out)?;
    for (name, why) in &summary.skipped {
        eprintln!("tessera: skipped `{name}`: {why}");
    }
    println!(
        "tessera: wrote {} tensors to {} ({} skipped)",
        summary.written.len(),
        out.display(),
        summary.skipped.len()
    );
    Ok(())
}

/// Structured logs on stderr: `RUST_LOG`-style filter (default `info`), colours only on a
/// terminal. On the journal, no colours and no timestamps: journald stamps each line itself.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if systemd::logs_to_journal() {
        logs.with_ansi(false).without_time().init();
    } else {
        logs.with_ansi(std::io::stderr().is_terminal()).init();
    }
}

/// Loads the task's configuration: `--config`, else the classic flags, else `TF_CONFIG`.
fn load_config(args: &ServeArgs) -> anyhow::Result<TaskConfig> {
    load_task_config(args.config.as_deref(), &args.classic, args.listen)
}

/// [`load_config`] from its parts.
fn load_task_config(
    file: Option<&std::path::Path>,
    classic: &ClassicFlags,
    listen: Option<SocketAddr>,
) -> anyhow::Result<TaskConfig> {
    let has_classic = classic.ps_hosts.is_some()
        || classic.worker_hosts.is_some()
        || classic.job_name.is_some()
        || classic.task_index.is_some();
    let mut config = match (file, has_classic) {
        (Some(_), true) => {
            bail!("--config and the classic flags (--ps_hosts, ...) exclude each other; pass one")
        }
        (Some(path), false) => TaskConfig::from_file(path)?,
        (None, true) => TaskConfig::from_classic_flags(classic)?,
        (None, false) => match std::env::var("TF_CONFIG") {
            Ok(json) if !json.trim().is_empty() => TaskConfig::from_tf_config(&json)?,
            _ => bail!(
                "no configuration: pass --config FILE, or --ps_hosts/--worker_hosts/--job_name/\
                 --task_index, or set TF_CONFIG"
            ),
        },
    };
    if let Some(listen) = listen {
        config.listen = listen;
    }
    Ok(config)
}

/// `tessera local` (and `tessera` alone): the embedded cluster as child processes.
fn local(args: LocalArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find this program's path")?;
    // Bad flags are refused here once, not by every child (the embedded cluster has 2 workers).
    args.training.to_spec(2)?.validate(2)?;
    println!(
        "tessera: local cluster of 1 ps and 2 workers training {} for {} steps",
        args.training.model, args.training.steps
    );
    tessera::train::job::launcher::run_local(&LocalJob {
        exe,
        train_args: args.training.to_args(),
        deadline: args.timeout,
    })?;
    println!("tessera: every task exited 0");
    Ok(())
}

/// `tessera train`: this task's daemon and its part of the job; exits once the chief says
/// training is over (the chief: once it told the others), or on SIGTERM.
fn train(args: TrainArgs) -> anyhow::Result<()> {
    let mut config = load_task_config(args.config.as_deref(), &args.classic, args.listen)?;
    let num_workers = config.cluster.num_tasks("worker").unwrap_or(0);
    let spec = args.training.to_spec(num_workers)?;
    tessera::train::job::check(&config, &spec)?;
    tessera::train::job::provide_tower_devices(&mut config, &spec);
    let task = config.task.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot build the signal runtime")?;
    let mut signals = runtime.block_on(async { Signals::install() })?;
    let server = match activated_listener()? {
        Some(listener) => Server::start_with_listener(config.clone(), listener)?,
        None => Server::start(config.clone())?,
    };
    let addr = server.local_addr();
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(
            stdout,
            "tessera: serving {} on {addr}",
            task.device_prefix()
        )
        .and_then(|()| stdout.flush())
        .context("cannot write the readiness line")?;
    }
    // The client reaches its own server on loopback when it listens on every interface.
    let own = if addr.ip().is_unspecified() {
        SocketAddr::from(([127, 0, 0, 1], addr.port()))
    } else {
        addr
    };
    let target = format!("grpc://{own}");
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("tessera-train".into())
        .spawn(move || {
            let _ = tx.send(tessera::train::job::run(&config, &target, &spec));
        })
        .context("cannot start the training thread")?;
    let outcome = runtime.block_on(async move {
        tokio::select! {
            signal = signals.recv() => Err(signal),
            finished = rx => Ok(finished),
        }
    });
    if let Ok(Ok(Ok(Finished::Ps | Finished::Worker { .. }))) = &outcome {
        // The chief's session that told this task is closed right after; serving a moment
        // longer lets that close reach it instead of a refused connection.
        std::thread::sleep(LINGER);
    }
    server.stop();
    match outcome {
        Err(signal) => {
            info!(task = %task, reason = %signal, "stopped before training ended");
            Ok(())
        }
        Ok(Err(_)) => bail!("{task}: the training thread ended without a result"),
        Ok(Ok(Err(e))) => Err(anyhow!("{task}: {e}")),
        Ok(Ok(Ok(finished))) => {
            if let Finished::Chief(report) = finished {
                print_report(&report);
            }
            Ok(())
        }
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
    println!(
        "tessera: held-out accuracy {:.2} % on {} examples",
        100.0 * report.held_out_accuracy,
        report.held_out_examples
    );
    if let Some(checkpoint) = &report.checkpoint {
        println!("tessera: checkpoint {}", checkpoint.display());
    }
    if !report.missing_workers.is_empty() {
        println!(
            "tessera: workers {:?} did not report their last step",
            report.missing_workers
        );
    }
}

/// `tessera serve`: starts the daemon, announces it, and stops it on SIGTERM or SIGINT.
fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let config = load_config(&args)?;
    let task = config.task.clone();
    // A small runtime of our own for signals; the server runs its own threads.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot build the signal runtime")?;
    // Handlers go in before the readiness line: a SIGTERM sent right after it must drain,
    // not kill the process with the default action.
    let mut signals = runtime.block_on(async { Signals::install() })?;
    let notifier = Notifier::from_env().context("cannot use NOTIFY_SOCKET")?;
    notify(
        &notifier,
        &format!("STATUS=starting {}", task.device_prefix()),
    );

    let server = Arc::new(match activated_listener()? {
        Some(listener) => Server::start_with_listener(config, listener)?,
        None => Server::start(config)?,
    });
    let addr = server.local_addr();
    // The port is bound and the actors are up: systemd may start the units that wait for us.
    notify(
        &notifier,
        &format!("READY=1\nSTATUS=serving {} on {addr}", task.device_prefix()),
    );
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(
            stdout,
            "tessera: serving {} on {addr}",
            task.device_prefix()
        )
        .and_then(|()| stdout.flush())
        .context("cannot write the readiness line")?;
    }

    let joined = Arc::clone(&server);
    let watchdog = systemd::watchdog_interval();
    let reason = runtime.block_on(async {
        tokio::select! {
            signal = signals.recv() => signal,
            _ = tokio::task::spawn_blocking(move || joined.join()) => "server stopped",
            () = keep_watchdog(&server, notifier.as_ref(), watchdog) => "watchdog stopped",
        }
    });
    info!(task = %task, reason = %reason, "shutting down");
    notify(
        &notifier,
        &format!("STOPPING=1\nSTATUS=stopping ({reason})"),
    );
    server.stop();
    Ok(())
}

/// Sends `state` to systemd when it listens; a failure is logged, never fatal (the daemon
/// serves either way, and systemd reports a missed READY=1 itself).
fn notify(notifier: &Option<Notifier>, state: &str) {
    if let Some(notifier) = notifier {
        if let Err(e) = notifier.notify(state) {
            warn!(error = %e, state = %state.replace('\n', " "), "sd_notify failed");
        }
    }
}

/// Sends `WATCHDOG=1` every `interval` (half of systemd's `WatchdogSec=`) for as long as the
/// daemon answers; never returns. Each ping follows a [`Server::probe`] of the actors, so a
/// daemon whose actors stopped answering misses its pings and systemd restarts it.
async fn keep_watchdog(server: &Server, notifier: Option<&Notifier>, interval: Option<Duration>) {
    let (Some(notifier), Some(interval)) = (notifier, interval) else {
        return std::future::pending().await;
    };
    info!(interval = ?interval, "keeping systemd's watchdog alive");
    let mut ticks = tokio::time::interval(interval);
    loop {
        ticks.tick().await;
        if let Err(e) = server.probe(interval).await {
            warn!(error = %e, "not answering: skipping the watchdog ping");
            continue;
        }
        if let Err(e) = notifier.notify("WATCHDOG=1") {
            warn!(error = %e, "sd_notify WATCHDOG=1 failed");
        }
    }
}

/// The listening socket systemd (or a test harness) passed as fd 3, if any.
///
/// Socket activation's protocol (`sd_listen_fds`): `LISTEN_PID` is our pid and `LISTEN_FDS`
/// the number of sockets, starting at fd 3. Variables meant for another process (a parent's
/// pid) are ignored. Both are removed so that children never take them for theirs.
fn activated_listener() -> anyhow::Result<Option<TcpListener>> {
    const FIRST_FD: RawFd = 3;
    let (Ok(pid), Ok(fds)) = (std::env::var("LISTEN_PID"), std::env::var("LISTEN_FDS")) else {
        return Ok(None);
    };
    if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
        return Ok(None);
    }
    std::env::remove_var("LISTEN_PID");
    std::env::remove_var("LISTEN_FDS");
    std::env::remove_var("LISTEN_FDNAMES");
    match fds.trim().parse::<u32>() {
        Ok(1) => {}
        _ => bail!(
            "socket activation passed LISTEN_FDS={fds}; tessera serves exactly one socket \
             (set ListenStream= once in the .socket unit)"
        ),
    }
    // SAFETY: LISTEN_PID names this process, so fd 3 was opened for it and nothing else in
    // the process owns it; the listener becomes its only owner.
    let listener = unsafe { TcpListener::from_raw_fd(FIRST_FD) };
    let addr = listener.local_addr().context(
        "socket activation passed fd 3, but it is not a bound TCP socket; use ListenStream= \
         with a host:port in the .socket unit",
    )?;
    info!(addr = %addr, "serving on the socket passed by socket activation");
    Ok(Some(listener))
}

/// SIGTERM and SIGINT, installed once.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            term: signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("cannot install the SIGINT handler")?,
        })
    }

    /// Waits for either signal and names it.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "sigterm",
            _ = self.int.recv() => "sigint",
        }
    }
}

/// `tessera validate FILE`: loads the file and names the task it describes.
fn validate(file: &std::path::Path) -> anyhow::Result<()> {
    let config = TaskConfig::from_file(file)?;
    let tasks = config.cluster.all_tasks().count();
    println!(
        "{}: ok (job {} task {} of {tasks} tasks)",
        file.display(),
        config.task.job,
        config.task.index
    );
    Ok(())
}

/// `tessera status TARGET`: prints the task's devices as a table.
fn status(target: &str, timeout: Duration, security: &SecurityArgs) -> anyhow::Result<()> {
    let (host_port, tls) = match target.split_once("://") {
        Some(("grpc", rest)) => (rest, false),
        Some(("grpcs" | "https", rest)) => (rest, true),
        Some(_) => ("", false),
        None => (target, false),
    };
    if host_port.is_empty() || host_port.contains("://") {
        bail!("bad target `{target}`: expected grpc://HOST:PORT, or grpcs://HOST:PORT for TLS");
    }
    let security = security.load(tls)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot build the client runtime")?;
    let devices = runtime
        .block_on(async {
            tokio::time::timeout(timeout, get_status(host_port, timeout, &security))
                .await
                .map_err(|_| anyhow!("no answer within {timeout:?}"))?
        })
        .with_context(|| format!("task at {target}"))?;
    print!("{}", device_table(&devices));
    Ok(())
}

/// Asks the task for its devices. A connection that fails says what to check about TLS (a
/// plain-text client to a TLS task sees only a broken connection); a status the task sent,
/// such as UNAUTHENTICATED, is shown as it is.
async fn get_status(
    host_port: &str,
    timeout: Duration,
    security: &Security,
) -> anyhow::Result<Vec<DeviceAttributes>> {
    let unreachable = |cause: String| anyhow!("unreachable: {cause}; {}", security.connect_hint());
    let channel = security
        .endpoint(host_port)?
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect()
        .await
        .map_err(|e| unreachable(error_chain(&e)))?;
    let reply = WorkerServiceClient::new(security.attach(channel))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .get_status(GetStatusRequest {})
        .await
        .map_err(|status| {
            if std::error::Error::source(&status).is_some() {
                unreachable(error_chain(&status))
            } else {
                anyhow::Error::from(tessera::Status::from(status))
            }
        })?;
    Ok(reply.into_inner().device_attributes)
}

/// Formats devices as `NAME TYPE MEMORY INCARNATION` rows, columns padded to fit.
fn device_table(devices: &[DeviceAttributes]) -> String {
    let rows: Vec<[String; 4]> = devices
        .iter()
        .map(|d| {
            [
                d.name.clone(),
                d.device_type.clone(),
                human_bytes(d.memory_limit),
                format!("{:#018x}", d.incarnation),
            ]
        })
        .collect();
    let header = ["NAME", "TYPE", "MEMORY", "INCARNATION"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let line = format!(
            "{:<w0$}  {:<w1$}  {:>w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `268435456` → `256.0 MiB`.
fn human_bytes(bytes: i64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Parses `5s`, `500ms`, `2m`, `1h` or a bare number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration; write it like 5s, 500ms or 2m"))?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "`{text}`: unknown unit `{unit}`; use ms, s, m or h"
            ))
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("`{text}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_every_unit() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn bytes_print_in_binary_units() {
        assert_eq!(human_bytes(268_435_456), "256.0 MiB");
        assert_eq!(human_bytes(85_899_345_920), "80.0 GiB");
        assert_eq!(human_bytes(512), "512 B");
    }

    #[test]
    fn the_table_aligns_columns() {
        let devices = [DeviceAttributes {
            name: "/job:ps/replica:0/task:0/device:CPU:0".into(),
            device_type: "CPU".into(),
            memory_limit: 268_435_456,
            incarnation: 0xab,
            ..Default::default()
        }];
        assert_eq!(
            device_table(&devices),
            "NAME                                   TYPE     MEMORY  INCARNATION\n\
             /job:ps/replica:0/task:0/device:CPU:0  CPU   256.0 MiB  0x00000000000000ab\n"
        );
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
            "--batch_size",
            "32",
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
        assert_eq!(spec.wait_for_model, Duration::from_secs(3));
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
    fn the_cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
