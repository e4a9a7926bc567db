//! The `tessera` command: run a task's daemon, check a cluster file, ask a task its status.
//!
//! ```text
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
use tessera::proto::worker_service_client::WorkerServiceClient;
use tessera::proto::{DeviceAttributes, GetStatusRequest};
use tessera::security::{ClusterToken, Security, TlsConfig};
use tessera::server::{Server, MAX_MESSAGE_BYTES};
use tracing::info;

#[derive(Debug, Parser)]
#[command(
    name = "tessera",
    version,
    about = "A distributed training runtime with TensorFlow's architecture"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let result = match cli.command {
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
/// terminal.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Loads the task's configuration: `--config`, else the classic flags, else `TF_CONFIG`.
fn load_config(args: &ServeArgs) -> anyhow::Result<TaskConfig> {
    let classic = &args.classic;
    let has_classic = classic.ps_hosts.is_some()
        || classic.worker_hosts.is_some()
        || classic.job_name.is_some()
        || classic.task_index.is_some();
    let mut config = match (&args.config, has_classic) {
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
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    Ok(config)
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

    let server = Arc::new(match activated_listener()? {
        Some(listener) => Server::start_with_listener(config, listener)?,
        None => Server::start(config)?,
    });
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

    let joined = Arc::clone(&server);
    let reason = runtime.block_on(async move {
        tokio::select! {
            signal = signals.recv() => signal,
            _ = tokio::task::spawn_blocking(move || joined.join()) => "server stopped",
        }
    });
    info!(task = %task, reason = %reason, "shutting down");
    server.stop();
    Ok(())
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

/// The error's message followed by each distinct cause under it.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![error.to_string()];
    let mut source = error.source();
    while let Some(err) = source {
        let text = err.to_string();
        if !parts.iter().any(|p| p == &text) {
            parts.push(text);
        }
        source = err.source();
    }
    parts.retain(|p| !p.is_empty() && p != "transport error");
    parts.join(": ")
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
    fn the_cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
