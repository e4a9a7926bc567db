//! A loopback cluster for tests: one `tessera serve` process per task (or one in-process
//! `Server` per task), on ports the harness bound itself, so no test guesses a free port.
//!
//! ```text
//! bind 127.0.0.1:0 × N ──► cluster.toml with the real ports ──► spawn per task:
//!   sh -c 'LISTEN_PID=$$ exec tessera serve --config cluster.toml'
//!      fd 3 = the task's listener, LISTEN_FDS=1, TESSERA__TASK__JOB/INDEX = its task
//!   wait for "tessera: serving /job:J/replica:0/task:I on ADDR" (deadline)
//! ```
//!
//! The listener reaches the daemon as systemd socket activation would pass it: `pre_exec`
//! duplicates it onto fd 3 (without close-on-exec), and the shell's `exec` keeps its pid, so
//! `LISTEN_PID=$$` names the daemon. Every task is killed when the [`Cluster`] is dropped,
//! whatever the test did.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use tessera::cluster::TaskConfig;
use tessera::ops::systemd::socket_activated;
use tessera::server::Server;

/// How long a daemon may take to print its readiness line (a cold debug binary on a busy
/// two-core machine).
pub const READY_DEADLINE: Duration = Duration::from_secs(60);
/// How long a daemon may take to exit after a signal (the shutdown grace is 5 s).
pub const EXIT_DEADLINE: Duration = Duration::from_secs(15);

pub const BIN: &str = env!("CARGO_BIN_EXE_tessera");

/// Timeouts short enough that a broken test fails in seconds rather than minutes.
pub const TEST_TIMEOUTS: &str = r#"
[devices]
gpu = 0

[timeouts]
connect = "5s"
rpc = "30s"
create_session = "20s"
shutdown_grace = "2s"
"#;

/// One task of the cluster: its name, address and (while running) its process.
pub struct Task {
    pub job: String,
    pub index: usize,
    pub addr: SocketAddr,
    /// Where its metrics endpoint listens, when the cluster file has `[metrics]`.
    pub metrics: Option<SocketAddr>,
    child: Option<Child>,
}

impl Task {
    /// `/job:J/replica:0/task:I`.
    pub fn prefix(&self) -> String {
        format!("/job:{}/replica:0/task:{}", self.job, self.index)
    }
}

/// A cluster of `tessera serve` processes on loopback, killed on drop.
pub struct Cluster {
    tasks: Vec<Task>,
    config: PathBuf,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts `jobs` (e.g. `[("ps", 1), ("worker", 2)]`) and returns once every task has
    /// printed its readiness line.
    pub fn start(jobs: &[(&str, usize)]) -> Cluster {
        Self::start_with(jobs, TEST_TIMEOUTS)
    }

    /// Starts `jobs` with `extra` TOML (sections other than `[cluster]` and `[task]`) in the
    /// cluster file.
    pub fn start_with(jobs: &[(&str, usize)], extra: &str) -> Cluster {
        Bound::bind(jobs).start(&[], extra)
    }

    /// Starts the tasks of `bound` with a cluster file that also names `others`, tasks this
    /// harness does not run (TensorFlow's own servers, say), as (job, index, address).
    fn start_bound(bound: Bound, others: &[(&str, usize, SocketAddr)], extra: &str) -> Cluster {
        let mut tasks: Vec<(String, usize, SocketAddr)> = bound
            .listeners
            .iter()
            .map(|(job, index, l)| (job.clone(), *index, l.local_addr().expect("bound address")))
            .collect();
        tasks.extend(
            others
                .iter()
                .map(|&(job, index, addr)| (job.to_string(), index, addr)),
        );
        let text = describe(&tasks) + extra;
        let listeners = bound.listeners;
        let dir = tempfile::tempdir().expect("temp dir for the cluster file");
        let config = dir.path().join("cluster.toml");
        std::fs::write(&config, &text).expect("write the cluster file");

        let mut cluster = Cluster {
            tasks: Vec::new(),
            config,
            _dir: dir,
        };
        // Spawn every task first (they start in parallel), then wait for each.
        let mut lines = Vec::new();
        for (job, index, listener) in listeners {
            let addr = listener.local_addr().expect("bound address");
            let (child, ready) = spawn(&cluster.config, &job, index, &listener);
            // The daemon holds its own copy; ours goes, so a killed task refuses connections
            // instead of leaving them in a backlog nobody accepts.
            drop(listener);
            cluster.tasks.push(Task {
                job,
                index,
                addr,
                metrics: None,
                child: Some(child),
            });
            lines.push(ready);
        }
        let deadline = Instant::now() + READY_DEADLINE;
        for (i, ready) in lines.into_iter().enumerate() {
            let task = &cluster.tasks[i];
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match ready.recv_timeout(left) {
                Ok(line) => line,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                    "no readiness line from {} within {READY_DEADLINE:?}",
                    task.prefix()
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("{} exited before its readiness line", task.prefix())
                }
            };
            let expected = format!("tessera: serving {} on {}", task.prefix(), task.addr);
            assert_eq!(line, expected, "readiness line of {}", task.prefix());
            if extra.contains("[metrics]") {
                let left = deadline.saturating_duration_since(Instant::now());
                let line = ready
                    .recv_timeout(left)
                    .unwrap_or_else(|e| panic!("no metrics line from {}: {e}", task.prefix()));
                let start = format!("tessera: metrics of {} on http://", task.prefix());
                let addr = line
                    .strip_prefix(&start)
                    .and_then(|rest| rest.strip_suffix("/metrics"))
                    .and_then(|addr| addr.parse().ok())
                    .unwrap_or_else(|| panic!("not a metrics line: {line}"));
                cluster.tasks[i].metrics = Some(addr);
            }
        }
        cluster
    }

    /// Returns the cluster file.
    pub fn config_path(&self) -> &Path {
        &self.config
    }

    /// Returns the task `job`/`index`.
    pub fn task(&self, job: &str, index: usize) -> &Task {
        self.tasks
            .iter()
            .find(|t| t.job == job && t.index == index)
            .unwrap_or_else(|| panic!("no task /job:{job}/task:{index} in this cluster"))
    }

    /// Returns `grpc://127.0.0.1:PORT` of a task, for `Session::connect`.
    pub fn target(&self, job: &str, index: usize) -> String {
        format!("grpc://{}", self.task(job, index).addr)
    }

    /// Returns `127.0.0.1:PORT` of a task.
    pub fn addr(&self, job: &str, index: usize) -> SocketAddr {
        self.task(job, index).addr
    }

    /// Returns the process id of a running task (for reading `/proc/<pid>`).
    pub fn pid(&self, job: &str, index: usize) -> Option<u32> {
        self.task(job, index).child.as_ref().map(Child::id)
    }

    /// Kills a task with SIGKILL and waits for it (a crash, as far as its peers can tell).
    pub fn kill(&mut self, job: &str, index: usize) -> ExitStatus {
        let task = self.task_mut(job, index);
        let mut child = task.child.take().expect("task is running");
        child.kill().expect("SIGKILL");
        wait_with_deadline(child, &format!("/job:{job}/task:{index}"))
    }

    /// Sends SIGTERM to a task and returns its exit status; panics if it has not exited within
    /// [`EXIT_DEADLINE`].
    pub fn terminate(&mut self, job: &str, index: usize) -> ExitStatus {
        let task = self.task_mut(job, index);
        let child = task.child.take().expect("task is running");
        // SAFETY: the pid is our own child, not yet reaped (we still own its `Child`).
        let sent = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(sent, 0, "SIGTERM to /job:{job}/task:{index}");
        wait_with_deadline(child, &format!("/job:{job}/task:{index}"))
    }

    /// Starts a task again after [`kill`](Self::kill) or [`terminate`](Self::terminate), on
    /// the same port (a new incarnation, as a restarted job would be), and waits for its
    /// readiness line. The port is bound again here (`SO_REUSEADDR`, so connections of the
    /// dead process lingering in TIME_WAIT do not block it) and handed over as before.
    pub fn restart(&mut self, job: &str, index: usize) {
        let config = self.config.clone();
        let task = self.task_mut(job, index);
        assert!(task.child.is_none(), "{} is still running", task.prefix());
        let listener = TcpListener::bind(task.addr)
            .unwrap_or_else(|e| panic!("bind {} again for {}: {e}", task.addr, task.prefix()));
        let (child, ready) = spawn(&config, job, index, &listener);
        drop(listener);
        task.child = Some(child);
        let line = match ready.recv_timeout(READY_DEADLINE) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                "no readiness line from the restarted {} within {READY_DEADLINE:?}",
                task.prefix()
            ),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                panic!(
                    "the restarted {} exited before its readiness line",
                    task.prefix()
                )
            }
        };
        let expected = format!("tessera: serving {} on {}", task.prefix(), task.addr);
        assert_eq!(
            line,
            expected,
            "readiness line of the restarted {}",
            task.prefix()
        );
    }

    /// Whether a task's process is still running (it has not exited on its own).
    pub fn is_running(&mut self, job: &str, index: usize) -> bool {
        let task = self.task_mut(job, index);
        match task.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    fn task_mut(&mut self, job: &str, index: usize) -> &mut Task {
        self.tasks
            .iter_mut()
            .find(|t| t.job == job && t.index == index)
            .unwrap_or_else(|| panic!("no task /job:{job}/task:{index} in this cluster"))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for task in &mut self.tasks {
            if let Some(mut child) = task.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// The same cluster as in-process servers (`Server::start_with_listener`), for tests that
/// need no process boundary. Stopped on drop.
pub struct InProcessCluster {
    pub servers: Vec<Server>,
}

impl InProcessCluster {
    /// Starts `jobs` in this process.
    pub fn start(jobs: &[(&str, usize)]) -> InProcessCluster {
        Self::start_with(jobs, TEST_TIMEOUTS)
    }

    /// Starts `jobs` in this process with `extra` TOML (sections other than `[cluster]` and
    /// `[task]`) in the cluster file.
    pub fn start_with(jobs: &[(&str, usize)], extra: &str) -> InProcessCluster {
        let (listeners, text) = Bound::describe(jobs, extra);
        let servers = listeners
            .into_iter()
            .map(|(job, index, listener)| {
                let env = [
                    ("TESSERA__TASK__JOB".to_string(), job.clone()),
                    ("TESSERA__TASK__INDEX".to_string(), index.to_string()),
                ];
                let config = TaskConfig::from_toml_with_env(&text, "cluster.toml", env)
                    .unwrap_or_else(|e| panic!("cluster file for /job:{job}/task:{index}: {e}"));
                Server::start_with_listener(config, listener)
                    .unwrap_or_else(|e| panic!("start /job:{job}/task:{index}: {e}"))
            })
            .collect();
        InProcessCluster { servers }
    }

    /// Returns `grpc://127.0.0.1:PORT` of a task.
    pub fn target(&self, job: &str, index: usize) -> String {
        format!("grpc://{}", self.addr(job, index))
    }

    /// Returns `127.0.0.1:PORT` of a task.
    pub fn addr(&self, job: &str, index: usize) -> SocketAddr {
        self.servers
            .iter()
            .find(|s| s.task().job == job && s.task().index as usize == index)
            .unwrap_or_else(|| panic!("no task /job:{job}/task:{index} in this cluster"))
            .local_addr()
    }
}

/// Loopback listeners bound for a cluster's tessera tasks before its cluster file is written:
/// for a cluster whose other tasks must be told the tessera tasks' addresses before their
/// own are known (a TensorFlow server binding port 0, say).
pub struct Bound {
    listeners: Vec<(String, usize, TcpListener)>,
}

impl Bound {
    /// Binds one loopback listener per task of `jobs` (e.g. `[("ps", 1)]`).
    pub fn bind(jobs: &[(&str, usize)]) -> Bound {
        let mut listeners = Vec::new();
        for (job, count) in jobs {
            for index in 0..*count {
                let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
                listeners.push((job.to_string(), index, listener));
            }
        }
        Bound { listeners }
    }

    /// Returns a bound task's address.
    pub fn addr(&self, job: &str, index: usize) -> SocketAddr {
        self.listeners
            .iter()
            .find(|(j, i, _)| j == job && *i == index)
            .unwrap_or_else(|| panic!("no task /job:{job}/task:{index} was bound"))
            .2
            .local_addr()
            .expect("bound address")
    }

    /// Starts the bound tasks as `tessera serve` processes with a cluster file that also
    /// names `others` (job, index, address): tasks this harness does not run.
    pub fn start(self, others: &[(&str, usize, SocketAddr)], extra: &str) -> Cluster {
        Cluster::start_bound(self, others, extra)
    }

    /// Binds `jobs` and writes the cluster file text naming their ports, with `extra` after.
    fn describe(
        jobs: &[(&str, usize)],
        extra: &str,
    ) -> (Vec<(String, usize, TcpListener)>, String) {
        let bound = Bound::bind(jobs);
        let tasks: Vec<(String, usize, SocketAddr)> = bound
            .listeners
            .iter()
            .map(|(job, index, l)| (job.clone(), *index, l.local_addr().expect("bound address")))
            .collect();
        (bound.listeners, describe(&tasks) + extra)
    }
}

/// The `[cluster]` section naming `tasks` (job, index, address): each job's tasks in index
/// order, the jobs in the order they first appear.
fn describe(tasks: &[(String, usize, SocketAddr)]) -> String {
    let mut jobs: Vec<&str> = Vec::new();
    for (job, _, _) in tasks {
        if !jobs.contains(&job.as_str()) {
            jobs.push(job);
        }
    }
    let mut text = String::from("[cluster]\n");
    for job in jobs {
        let mut members: Vec<(usize, SocketAddr)> = tasks
            .iter()
            .filter(|(j, _, _)| j == job)
            .map(|&(_, index, addr)| (index, addr))
            .collect();
        members.sort_unstable();
        for (position, (index, _)) in members.iter().enumerate() {
            assert_eq!(
                *index,
                position,
                "job `{job}` needs tasks 0..{}",
                members.len()
            );
        }
        let addrs: Vec<String> = members.iter().map(|(_, a)| format!("\"{a}\"")).collect();
        text.push_str(&format!("{job} = [{}]\n", addrs.join(", ")));
    }
    text
}

/// Spawns one daemon with `listener` as fd 3; returns it and a channel yielding its first
/// stdout line.
fn spawn(
    config: &Path,
    job: &str,
    index: usize,
    listener: &TcpListener,
) -> (Child, mpsc::Receiver<String>) {
    let mut command = socket_activated(Path::new(BIN), listener);
    command
        .args(["serve", "--config"])
        .arg(config)
        .env("TESSERA__TASK__JOB", job)
        .env("TESSERA__TASK__INDEX", index.to_string())
        .env(
            "RUST_LOG",
            std::env::var("TESSERA_TEST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("spawn tessera serve for /job:{job}/task:{index}: {e}"));
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        // Keep reading to the end, so the daemon never blocks on a full pipe.
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

/// Waits for `child` to exit; kills it and panics past [`EXIT_DEADLINE`].
pub fn wait_with_deadline(mut child: Child, name: &str) -> ExitStatus {
    let pid = child.id() as libc::pid_t;
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    match rx.recv_timeout(EXIT_DEADLINE) {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => panic!("waiting for {name}: {e}"),
        Err(_) => {
            // SAFETY: the waiting thread has not reaped it (it would have answered).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("{name} did not exit within {EXIT_DEADLINE:?}");
        }
    }
}

/// Whether a process was ended by `signal` (for asserting SIGKILL deaths).
pub fn killed_by(status: ExitStatus, signal: i32) -> bool {
    status.signal() == Some(signal)
}
