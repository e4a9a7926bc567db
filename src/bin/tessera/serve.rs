//! `tessera serve`, and what every command that runs a daemon shares: loading the task's
//! configuration, taking the socket systemd (or `tessera local`) passed, announcing readiness,
//! and the signals that stop it.

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{FromRawFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::Args;
use tessera::cluster::{ClassicFlags, TaskConfig, TaskId};
use tessera::ops::systemd::{self, Notifier};
use tessera::server::Server;
use tracing::{info, warn};

/// Which task this is and of which cluster: the flags of every command that runs a daemon.
#[derive(Debug, Args)]
pub(crate) struct TaskArgs {
    /// The TOML cluster file. Without it, the classic flags, then `TF_CONFIG`, are used.
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) classic: ClassicFlags,
    /// Listen on this address instead of the one the configuration gives (`127.0.0.1:0`).
    #[arg(long)]
    pub(crate) listen: Option<SocketAddr>,
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub(crate) task: TaskArgs,
}

impl TaskArgs {
    /// Loads the task's configuration: `--config`, else the classic flags, else `TF_CONFIG`.
    pub(crate) fn load(&self) -> anyhow::Result<TaskConfig> {
        load_task_config(self.config.as_deref(), &self.classic, self.listen)
    }
}

/// [`TaskArgs::load`] from its parts.
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
        (None, true) => TaskConfig::from_classic_flags(classic)?
            .with_env("the classic flags", std::env::vars())?,
        (None, false) => match std::env::var("TF_CONFIG") {
            Ok(json) if !json.trim().is_empty() => {
                TaskConfig::from_tf_config(&json)?.with_env("TF_CONFIG", std::env::vars())?
            }
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

/// `tessera serve`: starts the daemon, announces it, and stops it on SIGTERM or SIGINT.
pub(crate) fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let config = args.task.load()?;
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

    let server = Arc::new(start_and_announce(config)?);
    let addr = server.local_addr();
    // The port is bound and the actors are up: systemd may start the units that wait for us.
    notify(
        &notifier,
        &format!("READY=1\nSTATUS=serving {} on {addr}", task.device_prefix()),
    );

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

/// Starts the task's daemon on the socket passed by socket activation, or on the configured
/// address, and prints the readiness line (`tessera: serving TASK on ADDR`) that launchers and
/// tests wait for; with `[metrics]`, then where the endpoint listens (`tessera: metrics of TASK
/// on http://ADDR/metrics`, its port read back when it was 0).
pub(crate) fn start_and_announce(config: TaskConfig) -> anyhow::Result<Server> {
    // A ps task's standby is that task at another address; it announces itself as the cluster
    // file names it.
    let task = match &config.standbys.own {
        Some(pair) if pair.standby => TaskId::new(tessera::cluster::STANDBY_JOB, config.task.index),
        _ => config.task.clone(),
    };
    let server = match activated_listener()? {
        Some(listener) => Server::start_with_listener(config, listener)?,
        None => Server::start(config)?,
    };
    announce(&task, server.local_addr())?;
    if let Some(metrics) = server.metrics_addr() {
        let mut stdout = std::io::stdout().lock();
        writeln!(
            stdout,
            "tessera: metrics of {} on http://{metrics}/metrics",
            task.device_prefix()
        )
        .and_then(|()| stdout.flush())
        .context("cannot write the metrics line")?;
    }
    Ok(server)
}

/// Prints the readiness line on stdout and flushes it.
fn announce(task: &TaskId, addr: SocketAddr) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "tessera: serving {} on {addr}",
        task.device_prefix()
    )
    .and_then(|()| stdout.flush())
    .context("cannot write the readiness line")
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
pub(crate) struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn install() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            term: signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("cannot install the SIGINT handler")?,
        })
    }

    /// Waits for either signal and names it.
    pub(crate) async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "sigterm",
            _ = self.int.recv() => "sigint",
        }
    }
}
