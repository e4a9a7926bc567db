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

use std::net::TcpListener;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::cluster::{TaskConfig, TaskId};
use crate::error::{Result, Status};
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
}

/// One child task.
struct Running {
    task: TaskId,
    pid: libc::pid_t,
    done: bool,
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

/// Runs the embedded cluster to the end: Ok once every task exited 0.
pub fn run_local(job: &LocalJob) -> Result<()> {
    let embedded = TaskConfig::from_embedded_local(Vec::<(String, String)>::new())
        .map_err(|e| Status::internal(format!("the embedded config/local.toml: {e}")))?;
    let mut listeners = Vec::new();
    let mut text = String::from(
        "# Written by `tessera local`: the embedded cluster on the ports it bound.\n[cluster]\n",
    );
    for job_name in embedded.cluster.jobs() {
        let count = match job_name {
            "ps" => job.ps,
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

    let (tx, rx) = mpsc::channel::<(usize, std::io::Result<ExitStatus>)>();
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
        });
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut child: Child = child;
            let _ = tx.send((slot, child.wait()));
        });
    }
    drop(tx);

    let started = Instant::now();
    while running.iter().any(|r| !r.done) {
        let left = job.deadline.saturating_sub(started.elapsed());
        match rx.recv_timeout(left) {
            Ok((slot, status)) => {
                running[slot].done = true;
                let task = running[slot].task.clone();
                let status =
                    status.map_err(|e| Status::internal(format!("waiting for {task}: {e}")))?;
                if !status.success() {
                    kill_all(&mut running);
                    return Err(Status::aborted(format!(
                        "{task} {}; the other tasks were stopped (its log above says why)",
                        describe(status)
                    )));
                }
                tracing::info!(task = %task, "exited 0");
            }
            Err(_) => {
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
    Ok(())
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
        .stdin(Stdio::null());
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
