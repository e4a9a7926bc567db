//! `tessera local`: the embedded default cluster (`config/local.toml`: 1 ps, 2 workers, or as
//! many as asked for) as real daemons on loopback, each a child process of this binary
//! running `tessera train`.
//!
//! ```text
//! bind 127.0.0.1:0 per task ──► cluster.toml naming the real ports (a private temp dir)
//! spawn per task: sh -c 'LISTEN_PID=$$ exec tessera train --config cluster.toml ...'
//!     fd 3 = its listener, LISTEN_FDS=1, TESSERA__TASK__JOB / __INDEX = its task
//! wait for every child (deadline) ──► Ok only when all exited 0
//! ```
//!
//! No port is guessed: the launcher binds each one and hands the socket over, as systemd's
//! socket activation does. The shell's `exec` keeps its pid, so `LISTEN_PID=$$` names the
//! daemon. When a task fails, the others are stopped and the error names the task and how it
//! ended; past the deadline every task still running is killed and named.
//!
//! The tasks never outlive the launcher. SIGTERM or SIGINT to it is passed on as SIGTERM to
//! every task (each in a process group of its own, so a terminal's Ctrl-C reaches only the
//! launcher), the workers first: they stop after their step in flight, the chief after a final
//! checkpoint (which the ps tasks write), then the ps tasks; the launcher waits for them
//! ([`STOP_GRACE`], then SIGKILL), removes its folder and reports [`Ended::Signalled`]. Should the launcher die without a word (SIGKILL), each
//! task gets SIGTERM from the kernel (`PR_SET_PDEATHSIG`).

use std::net::TcpListener;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::cluster::{TaskConfig, TaskId, STANDBY_JOB};
use crate::error::{Result, Status};
use crate::ops::signals::Interrupts;
use crate::ops::systemd::socket_activated;

/// What to launch.
#[derive(Clone, Debug)]
pub struct LocalJob {
    /// The `tessera` binary the children run.
    pub exe: PathBuf,
    /// Flags passed to every child's `tessera train` after `--config`.
    pub train_args: Vec<String>,
    /// How long the whole job may take.
    pub deadline: Duration,
    /// ps tasks.
    pub ps: usize,
    /// Worker tasks.
    pub workers: usize,
    /// A standby per ps task (the `ps_standby` job).
    pub standby: bool,
}

/// How long the tasks may take to stop once the launcher was signalled: a worker's step in
/// flight and the chief's final checkpoint (each task allows itself 60 s of it).
pub const STOP_GRACE: Duration = Duration::from_secs(75);

/// How the local job ended, when no task failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Every task exited 0: training is over. Each task's peak resident memory in bytes (the
    /// kernel's high-water mark of the process), in the order the tasks started.
    Completed(Vec<(TaskId, u64)>),
    /// The launcher was signalled (`"sigterm"` or `"sigint"`) and stopped every task.
    Signalled(&'static str),
}

/// What the launcher waits for.
enum Event {
    /// A task's exit status and peak resident memory in bytes.
    Exited(usize, std::io::Result<(ExitStatus, u64)>),
    Signalled(&'static str),
}

/// One child task.
struct Running {
    task: TaskId,
    pid: libc::pid_t,
    done: bool,
    peak_bytes: u64,
}

/// A private directory for the cluster file, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "tessera-local-{}-{:x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| {
            Status::unavailable(format!(
                "cannot create {} for the cluster file: {e}; set TMPDIR to a writable directory",
                dir.display()
            ))
        })?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the embedded cluster to the end: [`Ended::Completed`] once every task exited 0,
/// [`Ended::Signalled`] when a signal stopped it first.
pub fn run_local(job: &LocalJob) -> Result<Ended> {
    // Before any child starts: a signal from now on stops the children, not just the launcher.
    let interrupts = Interrupts::install()?;
    let embedded = TaskConfig::from_embedded_local(Vec::<(String, String)>::new())
        .map_err(|e| Status::internal(format!("the embedded config/local.toml: {e}")))?;
    let mut listeners = Vec::new();
    let mut text = String::from(
        "# Written by `tessera local`: the embedded cluster on the ports it bound.\n[cluster]\n",
    );
    let standby = job.standby.then_some(STANDBY_JOB);
    for job_name in embedded.cluster.jobs().chain(standby) {
        let count = match job_name {
            "ps" | STANDBY_JOB => job.ps,
            "worker" => job.workers,
            other => embedded.cluster.num_tasks(other)?,
        };
        let mut addrs = Vec::with_capacity(count);
        for index in 0..count {
            let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| {
                Status::unavailable(format!(
                    "cannot bind a loopback port for /job:{job_name}/task:{index}: {e}"
                ))
            })?;
            let addr = listener
                .local_addr()
                .map_err(|e| Status::internal(e.to_string()))?;
            addrs.push(format!("\"{addr}\""));
            listeners.push((TaskId::new(job_name, index as u32), listener));
        }
        text.push_str(&format!("{job_name} = [{}]\n", addrs.join(", ")));
    }
    let dir = TempDir::new()?;
    let config = dir.0.join("cluster.toml");
    std::fs::write(&config, &text)
        .map_err(|e| Status::unavailable(format!("cannot write {}: {e}", config.display())))?;

    let (tx, rx) = mpsc::channel::<Event>();
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            if let Some(signal) = interrupts.wait() {
                let _ = tx.send(Event::Signalled(signal));
            }
        });
    }
    let mut running = Vec::with_capacity(listeners.len());
    for (task, listener) in listeners {
        let child = match spawn(job, &config, &task, &listener) {
            Ok(child) => child,
            Err(e) => {
                kill_all(&mut running);
                return Err(e);
            }
        };
        // The child holds its own copy of the socket.
        drop(listener);
        let slot = running.len();
        running.push(Running {
            task,
            pid: child.id() as libc::pid_t,
            done: false,
            peak_bytes: 0,
        });
        let tx = tx.clone();
        std::thread::spawn(move || {
            let _ = tx.send(Event::Exited(slot, wait_with_peak(child)));
        });
    }
    drop(tx);

    let started = Instant::now();
    while running.iter().any(|r| !r.done) {
        let left = job.deadline.saturating_sub(started.elapsed());
        match rx.recv_timeout(left) {
            Ok(Event::Signalled(signal)) => {
                tracing::info!(signal, "stopping every task");
                stop_all(&mut running, &rx);
                return Ok(Ended::Signalled(signal));
            }
            Ok(Event::Exited(slot, status)) => {
                running[slot].done = true;
                let task = running[slot].task.clone();
                let (status, peak_bytes) =
                    status.map_err(|e| Status::internal(format!("waiting for {task}: {e}")))?;
                running[slot].peak_bytes = peak_bytes;
                if !status.success() {
                    kill_all(&mut running);
                    let message = format!(
                        "{task} {}; the other tasks were stopped (its log above says why)",
                        describe(status)
                    );
                    // A task's bad input (exit 1 to 127) is the launcher's too: not retried.
                    return Err(match status.code() {
                        Some(1..=127) => Status::failed_precondition(message),
                        _ => Status::aborted(message),
                    });
                }
                tracing::info!(task = %task, "exited 0");
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let late: Vec<String> = running
                    .iter()
                    .filter(|r| !r.done)
                    .map(|r| r.task.to_string())
                    .collect();
                kill_all(&mut running);
                return Err(Status::deadline_exceeded(format!(
                    "the local job did not end within {:?}: {} still running (killed); raise \
                     --timeout or lower --steps",
                    job.deadline,
                    late.join(", ")
                )));
            }
        }
    }
    Ok(Ended::Completed(
        running
            .into_iter()
            .map(|r| (r.task, r.peak_bytes))
            .collect(),
    ))
}

/// Waits for `child` to exit (reaping it): its status and its peak resident memory in bytes,
/// from the kernel's account of the process (`wait4`'s `ru_maxrss`).
fn wait_with_peak(child: Child) -> std::io::Result<(ExitStatus, u64)> {
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: `rusage` is plain integers; all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `pid` is this process's child, not reaped yet (only this thread waits for
        // it); `status` and `usage` are valid for writes.
        let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if reaped == pid {
            break;
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
    // Linux counts `ru_maxrss` in KiB.
    let peak = u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024;
    Ok((ExitStatus::from_raw(status), peak))
}

/// Stops every child still running: SIGTERM to the workers first (the chief's final
/// checkpoint is written by the ps tasks), then to the others; waits for them up to
/// [`STOP_GRACE`] in all and SIGKILLs the ones still running then.
fn stop_all(running: &mut [Running], rx: &mpsc::Receiver<Event>) {
    let started = Instant::now();
    for workers in [true, false] {
        let stopping: Vec<usize> = (0..running.len())
            .filter(|&i| !running[i].done && (running[i].task.job == "worker") == workers)
            .collect();
        for &i in &stopping {
            // SAFETY: as in `kill_all`: the child has not been reaped.
            unsafe { libc::kill(running[i].pid, libc::SIGTERM) };
        }
        while stopping.iter().any(|&i| !running[i].done) {
            match rx.recv_timeout(STOP_GRACE.saturating_sub(started.elapsed())) {
                Ok(Event::Exited(slot, status)) => {
                    running[slot].done = true;
                    if let Ok((status, _)) = status {
                        tracing::info!(task = %running[slot].task, "{}", describe(status));
                    }
                }
                // A second signal: the launcher is already stopping.
                Ok(Event::Signalled(_)) => {}
                Err(_) => {
                    kill_all(running);
                    return;
                }
            }
        }
    }
}

/// `exited with status 1` / `was killed by signal 9`.
fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        _ => format!("ended with {status}"),
    }
}

/// SIGKILLs every child still running.
fn kill_all(running: &mut [Running]) {
    for r in running.iter_mut().filter(|r| !r.done) {
        // SAFETY: the pid is our child's; its waiting thread has not reported it, so it has
        // not been reaped and the pid still names it.
        unsafe { libc::kill(r.pid, libc::SIGKILL) };
        r.done = true;
    }
}

/// Starts one task with `listener` as fd 3.
fn spawn(job: &LocalJob, config: &Path, task: &TaskId, listener: &TcpListener) -> Result<Child> {
    let mut command = socket_activated(&job.exe, listener);
    command
        .args(["train", "--config"])
        .arg(config)
        .args(&job.train_args)
        .env("TESSERA__TASK__JOB", &task.job)
        .env("TESSERA__TASK__INDEX", task.index.to_string())
        .stdin(Stdio::null())
        .process_group(0);
    let launcher = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec only async-signal-safe calls (prctl, getppid, kill) run.
    unsafe {
        command.pre_exec(move || {
            // The kernel SIGTERMs the task when the launcher dies; survives the exec.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher died before the prctl: nobody is left to wait for this task.
            if libc::getppid() != launcher {
                libc::kill(libc::getpid(), libc::SIGTERM);
            }
            Ok(())
        });
    }
    if std::env::var_os("RUST_LOG").is_none() {
        command.env("RUST_LOG", "warn");
    }
    command.spawn().map_err(|e| {
        Status::unavailable(format!(
            "cannot start {task} ({} train): {e}",
            job.exe.display()
        ))
    })
}
