//! The `tessera` command: train on the embedded local cluster, run one task of a training
//! job, run a task's daemon, check a cluster file, ask a task its status.
//!
//! ```text
//! tessera                      (same as `tessera local`)
//! tessera local [--steps 500 --optimizer adam ...]
//! tessera train --config cluster.toml --model mlp --hidden 64,32 --steps 1000 [--sync ...]
//! tessera train --config cluster.toml --towers 2    (batches split over CPU:0 and CPU:1)
//! tessera train --config cluster.toml --towers 2 --tower_device gpu --all_reduce
//! tessera train --ps_hosts=h0:2222 --worker_hosts=h1:2222,h2:2222 --job_name=worker --task_index=0
//! tessera serve --config /etc/tessera/ps0.toml [--listen 0.0.0.0:2222]
//! tessera serve --ps_hosts=h0:2222 --worker_hosts=h1:2222 --job_name=ps --task_index=0
//! TF_CONFIG='{"cluster": ..., "task": ...}' tessera serve
//! tessera validate /etc/tessera/ps0.toml
//! tessera validate --graph graph.pb     (what of a TensorFlow graph tessera cannot run)
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

mod serve;
mod status;
mod train;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use prost::Message as _;
use tessera::cluster::TaskConfig;
use tessera::ops::systemd;

use serve::{serve, ServeArgs};
use status::{status, SecurityArgs};
use train::{local, train, LocalArgs, TrainArgs};

#[derive(Debug, Parser)]
#[command(
    name = "tessera",
    version,
    about = "A distributed training runtime with TensorFlow's architecture"
)]
pub(crate) struct Cli {
    /// Without a command, `tessera local` runs with its defaults.
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Trains a model (--model: mlp by default, softmax, cnn, embedding, regression) on the
    /// embedded cluster (1 ps and 2 workers by default, child processes on loopback ports),
    /// reports how well it does on held-out data, and exits when every task did (or after
    /// --timeout, 10 minutes by default).
    Local(LocalArgs),
    /// Runs this task of a training job: its daemon, and (for a worker) its training client.
    /// Exits 0 when the chief says training is over.
    Train(TrainArgs),
    /// Runs this task's daemon (MasterService and WorkerService on one port) until SIGTERM.
    Serve(ServeArgs),
    /// Checks a cluster file and names this task, and/or lists what of a TensorFlow graph
    /// tessera cannot run (ops, kernels, dtypes); exits 1 when either is bad.
    Validate {
        /// The TOML cluster file.
        #[arg(required_unless_present = "graph")]
        file: Option<PathBuf>,
        /// A binary GraphDef, as TensorFlow writes it:
        /// `tf.io.write_graph(sess.graph_def, DIR, "graph.pb", as_text=False)`.
        #[arg(long, value_name = "GRAPH.pb")]
        graph: Option<PathBuf>,
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

/// Large buffers (a step's activations, gradients, patch matrices) come from the host pool and
/// go back to it, so each step reuses the last one's pages instead of faulting in fresh ones.
#[global_allocator]
static ALLOCATOR: tessera::device::host_pool::PooledAllocator =
    tessera::device::host_pool::PooledAllocator;

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
        Command::Validate { file, graph } => validate(file.as_deref(), graph.as_deref()),
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
            ExitCode::from(exit_code(&e))
        }
    }
}

/// A task stopped by a signal before its work was done (`"sigterm"` or `"sigint"`).
#[derive(Debug)]
pub(crate) struct Stopped {
    pub(crate) signal: &'static str,
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stopped by {} before training ended",
            self.signal.to_uppercase()
        )
    }
}

impl std::error::Error for Stopped {}

/// Exit code of faults a restart can fix (a task unreachable, a step aborted, a deadline):
/// 128 and above are retried by a Kubeflow TFJob's `ExitCode` restart policy, 1 to 127 are
/// not.
pub(crate) const EXIT_RETRYABLE: u8 = 128;

/// The exit code for `e`: 128 + the signal's number when a signal stopped the task (143 for
/// SIGTERM, 130 for SIGINT), [`EXIT_RETRYABLE`] for faults a restart can fix, 1 for bad input
/// and configuration.
pub(crate) fn exit_code(e: &anyhow::Error) -> u8 {
    use tessera::error::{Code, Status};
    if let Some(stopped) = e.downcast_ref::<Stopped>() {
        return match stopped.signal {
            "sigint" => 128 + 2,
            _ => 128 + 15,
        };
    }
    let retryable = e.chain().any(|cause| {
        cause.downcast_ref::<Status>().is_some_and(|s| {
            matches!(
                s.code(),
                Code::Unavailable
                    | Code::Aborted
                    | Code::DeadlineExceeded
                    | Code::Internal
                    | Code::Unknown
                    | Code::DataLoss
                    | Code::Cancelled
            )
        })
    });
    if retryable {
        EXIT_RETRYABLE
    } else {
        1
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

/// `tessera validate [FILE] [--graph GRAPH.pb]`: loads the cluster file and names the task it
/// describes; reads the graph and lists every op of it tessera cannot run.
fn validate(file: Option<&Path>, graph: Option<&Path>) -> anyhow::Result<()> {
    if let Some(file) = file {
        let config = TaskConfig::from_file(file)?;
        let tasks = config.cluster.all_tasks().count();
        let who = match &config.standbys.own {
            Some(pair) if pair.standby => "the standby of job",
            _ => "job",
        };
        let standbys = match config.standbys.addresses.len() {
            0 => String::new(),
            1 => ", 1 ps standby".to_string(),
            n => format!(", {n} ps standbys"),
        };
        println!(
            "{}: ok ({who} {} task {} of {tasks} tasks{standbys})",
            file.display(),
            config.task.job,
            config.task.index
        );
    }
    let Some(graph) = graph else {
        return Ok(());
    };
    let bytes = std::fs::read(graph).with_context(|| format!("cannot read {}", graph.display()))?;
    let def = tessera::proto::GraphDef::decode(bytes.as_slice()).with_context(|| {
        format!(
            "{} is not a binary GraphDef (write it with tf.io.write_graph(..., as_text=False))",
            graph.display()
        )
    })?;
    let findings = tessera::exec::support::unsupported(&def);
    if findings.is_empty() {
        println!(
            "{}: ok (every op of its {} nodes runs on tessera)",
            graph.display(),
            def.node.len()
        );
        return Ok(());
    }
    for finding in &findings {
        println!("{}: {finding}", graph.display());
    }
    bail!(
        "{}: {} op(s) tessera cannot run yet (the README's table of what does not run lists the \
         known ones)",
        graph.display(),
        findings.len()
    )
}

/// Parses `5s`, `500ms`, `2m`, `1h` or a bare number of seconds.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
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
    fn the_cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
