//! The task's configuration, typed and validated.
//!
//! Three front ends build the same [`TaskConfig`]:
//! * a TOML cluster file ([`TaskConfig::from_file`], in `file.rs`) layered with
//!   `TESSERA__SECTION__KEY` environment overrides, so one file serves every host and each host
//!   sets only `TESSERA__TASK__JOB` / `TESSERA__TASK__INDEX`;
//! * TensorFlow's classic flags ([`TaskConfig::from_classic_flags`], in `tensorflow.rs`);
//! * a `TF_CONFIG` JSON document ([`TaskConfig::from_tf_config`], in `tensorflow.rs`).
//!
//! This file holds the typed configuration, the one error type every front end returns, and
//! the checks they share (addresses, job names, finding the task, duplicate addresses). Every
//! refusal is a [`ConfigError`] naming the source (file, environment variable, flag,
//! `TF_CONFIG`), the key, what is wrong and what to change.

mod file;
mod ops;
mod schema;
mod security;
mod tensorflow;

pub use file::{ENV_PREFIX, ENV_SEPARATOR};
pub use ops::{CheckpointsConfig, DataConfig, Limits, MetricsConfig};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use super::{ClusterSpec, TaskId};
use crate::security::Security;

/// Everything a daemon needs to start: the cluster, who it is, where it listens, its devices.
#[derive(Clone, Debug)]
pub struct TaskConfig {
    /// The whole cluster.
    pub cluster: ClusterSpec,
    /// This task.
    pub task: TaskId,
    /// The address the gRPC server binds (`0.0.0.0:2222`, `127.0.0.1:0`, ...).
    pub listen: SocketAddr,
    /// The devices this task creates.
    pub devices: DeviceConfig,
    /// Deadlines.
    pub timeouts: Timeouts,
    /// The Prometheus endpoint (`[metrics]`); off by default.
    pub metrics: MetricsConfig,
    /// What one request, session or shard may take (`[limits]`).
    pub limits: Limits,
    /// Where clients' checkpoint and summary kernels may touch files (`[checkpoints]`); any
    /// path by default.
    pub checkpoints: CheckpointsConfig,
    /// Where clients' input kernels may read files (`[data]`, with the checkpoint directories:
    /// [`DataConfig::read_dirs`]); any path when neither section is set.
    pub data: DataConfig,
    /// TLS and the cluster token, for the server and every channel to a peer (`[tls]`,
    /// `[auth]`); plain text without a token by default.
    pub security: Security,
    /// `cluster` names only some of the job's tasks: Kubeflow's sparse `TF_CONFIG` for
    /// dynamic workers, where a ps sees only itself and a worker the ps tasks and itself.
    /// Such a task learns the others from the masters that reach it.
    pub partial_cluster: bool,
    /// The ps tasks' standbys (the cluster file's `ps_standby` job, taken out of `cluster`),
    /// and this daemon's pair when it is one of a ps task's two daemons.
    pub standbys: Standbys,
}

/// The job whose task `i` stands by for ps task `i`: a second daemon holding a copy of the
/// task's variables, outside the `ps` job so that no device setter places a variable on it.
pub const STANDBY_JOB: &str = "ps_standby";

/// The ps tasks that have a standby, and this daemon's pair.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Standbys {
    /// Ps task index → its standby's address: every daemon's peers fail over to it.
    pub addresses: BTreeMap<u32, String>,
    /// This daemon's pair, when it is a ps task with a standby or that standby.
    pub own: Option<ReplicaConfig>,
}

/// One of the two daemons of a ps task with a standby.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaConfig {
    /// The ps task both daemons stand for.
    pub task: TaskId,
    /// This daemon's address.
    pub own: String,
    /// The other daemon's address.
    pub partner: String,
    /// Whether this daemon starts as the standby (it is the `ps_standby` task).
    pub standby: bool,
}

/// The devices a task creates at start; a session's config cannot change them later.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceConfig {
    /// Number of CPU devices (`CPU:0`, `CPU:1`, ...).
    pub cpu_count: NonZeroU32,
    /// Most GPUs to use; `None` means every visible GPU, `Some(0)` hides them.
    pub gpu_count: Option<u32>,
    /// Fraction of each GPU's memory this task may use, in (0, 1].
    pub gpu_memory_fraction: f64,
    /// Grow GPU memory as needed instead of reserving the fraction up front.
    pub allow_growth: bool,
    /// Physical GPU ids to use, in the order they become `GPU:0`, `GPU:1`, ...; empty means all.
    pub visible_devices: Vec<u32>,
    /// Place an op on CPU when the requested device has no kernel for it.
    pub soft_placement: bool,
    /// Bytes each CPU device's step tensors and variables may take together
    /// (`devices.cpu_memory_limit`); `None` means 80% of the host's memory
    /// ([`DeviceConfig::cpu_memory_budget`]).
    pub cpu_memory_limit: Option<u64>,
    /// Threads a kernel splits its work over (`devices.intra_op_threads`, TensorFlow's
    /// `intra_op_parallelism_threads`); `None` means one per core
    /// ([`DeviceConfig::intra_op_threads`]).
    pub intra_op_threads: Option<u32>,
}

/// Deadlines for the waits a task makes.
#[derive(Clone, Debug, PartialEq)]
pub struct Timeouts {
    /// Connecting to a peer task.
    pub connect: Duration,
    /// One RPC to a peer task.
    pub rpc: Duration,
    /// Waiting for every task at session creation.
    pub create_session: Duration,
    /// Finishing in-flight calls after SIGTERM before exiting anyway.
    pub shutdown_grace: Duration,
    /// A task of a training job waiting for the others to come up (`tessera train
    /// --startup_timeout`): tasks start in any order, and one may wait for a machine.
    pub startup: Duration,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            cpu_count: NonZeroU32::MIN,
            gpu_count: None,
            gpu_memory_fraction: 1.0,
            allow_growth: false,
            visible_devices: Vec::new(),
            soft_placement: true,
            cpu_memory_limit: None,
            intra_op_threads: None,
        }
    }
}

impl DeviceConfig {
    /// The bytes each CPU device may take: `cpu_memory_limit`, or 80% of the host's memory
    /// (`/proc/meminfo`'s MemTotal; 16 GiB where it cannot be read).
    pub fn cpu_memory_budget(&self) -> u64 {
        self.cpu_memory_limit
            .unwrap_or_else(|| host_memory().unwrap_or(16 << 30) / 5 * 4)
    }

    /// The threads of the task's intra-op pool: `intra_op_threads`, or one per core this
    /// process may run on.
    pub fn intra_op_threads(&self) -> usize {
        self.intra_op_threads.map_or_else(
            || std::thread::available_parallelism().map_or(1, |n| n.get()),
            |n| n as usize,
        )
    }
}

/// The host's physical memory in bytes, from `/proc/meminfo`.
fn host_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(10),
            rpc: Duration::from_secs(60),
            create_session: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(5),
            // TensorFlow's SessionManager waits up to two hours (`max_wait_secs=7200`).
            startup: Duration::from_secs(2 * 60 * 60),
        }
    }
}

impl TaskConfig {
    /// A one-task cluster (`job:localhost`, task 0) on `127.0.0.1:0`, for tests and
    /// `Server::local()`.
    pub fn local() -> Self {
        Self {
            cluster: ClusterSpec::from_dense([("localhost", vec!["127.0.0.1:0"])]),
            task: TaskId::new("localhost", 0),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            devices: DeviceConfig::default(),
            timeouts: Timeouts::default(),
            metrics: MetricsConfig::default(),
            limits: Limits::default(),
            checkpoints: CheckpointsConfig::default(),
            data: DataConfig::default(),
            security: Security::default(),
            partial_cluster: false,
            standbys: Standbys::default(),
        }
    }

    /// Takes the `ps_standby` job out of the cluster into [`Standbys`]: a standby daemon is
    /// its ps task (the same device names) at another address. Refuses a standby whose ps
    /// task the cluster lacks, naming it.
    pub(super) fn split_standbys(mut self, at: &str) -> Result<Self, ConfigError> {
        let Ok(addresses) = self.cluster.tasks(STANDBY_JOB) else {
            return Ok(self);
        };
        let addresses = addresses.clone();
        let mut primaries = BTreeMap::new();
        for index in addresses.keys() {
            let primary =
                self.cluster
                    .task_address("ps", *index)
                    .map_err(|_| ConfigError::InvalidValue {
                        at: at.to_owned(),
                        key: format!("cluster.{STANDBY_JOB}"),
                        message: format!(
                        "task {index} stands by for ps task {index}, which the cluster does not \
                         have; a ps_standby task's index is its ps task's"
                    ),
                    })?;
            primaries.insert(*index, primary.to_owned());
        }
        self.cluster = self.cluster.without_job(STANDBY_JOB);
        let index = self.task.index;
        self.standbys.own = match self.task.job.as_str() {
            STANDBY_JOB => {
                self.task = TaskId::new("ps", index);
                Some(ReplicaConfig {
                    task: self.task.clone(),
                    own: addresses[&index].clone(),
                    partner: primaries[&index].clone(),
                    standby: true,
                })
            }
            "ps" => addresses.get(&index).map(|standby| ReplicaConfig {
                task: self.task.clone(),
                own: primaries[&index].clone(),
                partner: standby.clone(),
                standby: false,
            }),
            _ => None,
        };
        self.standbys.addresses = addresses;
        Ok(self)
    }

    /// Returns the text of the embedded default cluster file of `tessera local` (1 ps and 2
    /// workers on `127.0.0.1:0`, this task worker 0).
    pub fn embedded_local() -> &'static str {
        file::LOCAL_TOML
    }

    /// Returns this task's address as the cluster lists it (what peers dial).
    pub fn task_address(&self) -> crate::Result<&str> {
        self.cluster.task_address(&self.task.job, self.task.index)
    }

    /// Whether this task is the chief: task 0 of `chief` (or legacy `master`), or worker 0 when
    /// the cluster has neither.
    pub fn is_chief(&self) -> bool {
        let has = |job: &str| self.cluster.jobs().any(|j| j == job);
        match self.task.job.as_str() {
            "chief" | "master" => self.task.index == 0,
            "worker" => self.task.index == 0 && !has("chief") && !has("master"),
            _ => false,
        }
    }
}

/// Why a configuration was refused: names the source (file, flags, `TF_CONFIG`), the key and
/// what to change.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The cluster file cannot be read.
    #[error("{path}: cannot read the cluster file: {error}; check the path and its permissions")]
    Read {
        /// The file as given.
        path: String,
        /// Why reading failed.
        #[source]
        error: std::io::Error,
    },
    /// The document is not valid TOML (or JSON, for `TF_CONFIG`).
    #[error("{source_name}:{line}:{column}: {message}; fix the syntax there")]
    Syntax {
        /// The file, or `TF_CONFIG`.
        source_name: String,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// A key the schema does not have (a typo, or a key from another section).
    #[error("{at}: {key}: unknown key; the keys allowed {scope} are {allowed}")]
    UnknownKey {
        /// The file or environment variable.
        at: String,
        /// The full dotted key.
        key: String,
        /// Where the key sits (`in [task]`, `at the top level`).
        scope: String,
        /// The allowed keys, comma-separated.
        allowed: String,
    },
    /// A value of the wrong type or out of range.
    #[error("{at}: {key}: {message}")]
    InvalidValue {
        /// The file, environment variable, flag or `TF_CONFIG`.
        at: String,
        /// The key or flag.
        key: String,
        /// What is wrong and what to change.
        message: String,
    },
    /// Two tasks share one `host:port`.
    #[error(
        "{at}: {key}: tasks {first} and {second} both have address \"{address}\"; give each \
         task its own host:port (port 0 lets each task pick one)"
    )]
    DuplicateAddress {
        /// The file, flags or `TF_CONFIG`.
        at: String,
        /// The key of the later task's job.
        key: String,
        /// The earlier task.
        first: Box<TaskId>,
        /// The later task.
        second: Box<TaskId>,
        /// The shared address.
        address: String,
    },
    /// This task's job or index is not in the cluster.
    #[error("{at}: {key}: {message}")]
    TaskNotInCluster {
        /// The file, environment variable, flag or `TF_CONFIG`.
        at: String,
        /// The key naming the job or index.
        key: String,
        /// What is missing and what to change.
        message: String,
    },
    /// The configuration describes a process that is not a server of the cluster (a
    /// `TF_CONFIG` evaluator, or no cluster at all).
    #[error("{at}: {key}: {message}")]
    NotAServer {
        /// Where the configuration came from.
        at: String,
        /// The key that makes it so.
        key: String,
        /// Why, and what to run instead.
        message: String,
    },
    /// The configuration is invalid.
    #[error("{0}")]
    Invalid(String),
}

impl ConfigError {
    /// Returns the status code this error maps to.
    pub fn code(&self) -> crate::error::Code {
        use crate::error::Code;
        match self {
            ConfigError::Read { error, .. } => match error.kind() {
                std::io::ErrorKind::NotFound => Code::NotFound,
                std::io::ErrorKind::PermissionDenied => Code::PermissionDenied,
                _ => Code::FailedPrecondition,
            },
            ConfigError::Syntax { .. }
            | ConfigError::UnknownKey { .. }
            | ConfigError::InvalidValue { .. }
            | ConfigError::DuplicateAddress { .. }
            | ConfigError::TaskNotInCluster { .. }
            | ConfigError::Invalid(_) => Code::InvalidArgument,
            ConfigError::NotAServer { .. } => Code::FailedPrecondition,
        }
    }
}

impl From<ConfigError> for crate::error::Status {
    fn from(e: ConfigError) -> Self {
        crate::error::Status::new(e.code(), e.to_string())
    }
}

/// TensorFlow's classic command-line flags for a task.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ClassicFlags {
    /// Comma-separated ps addresses (`h0:2222,h1:2222`).
    #[arg(long = "ps_hosts")]
    pub ps_hosts: Option<String>,
    /// Comma-separated worker addresses.
    #[arg(long = "worker_hosts")]
    pub worker_hosts: Option<String>,
    /// This task's job (`ps` or `worker`).
    #[arg(long = "job_name")]
    pub job_name: Option<String>,
    /// This task's index within its job.
    #[arg(long = "task_index")]
    pub task_index: Option<u32>,
}

// ---------------------------------------------------------------------------------------------
// Checks every front end shares.

/// Refuses a cluster in which two tasks share an address.
pub(super) fn check_duplicates(
    cluster: &ClusterSpec,
    at: &str,
    key: impl Fn(&str) -> String,
) -> Result<(), ConfigError> {
    match cluster.duplicate_address() {
        Some((first, second, address)) => Err(ConfigError::DuplicateAddress {
            at: at.to_owned(),
            key: key(&second.job),
            address: address.to_owned(),
            first: Box::new(first),
            second: Box::new(second),
        }),
        None => Ok(()),
    }
}

/// Checks a job name is usable in device names (`/job:NAME`): a letter, then letters, digits
/// or `_`.
pub(super) fn check_job_name(job: &str) -> Result<(), String> {
    let mut chars = job.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "job name \"{job}\" is not valid in device names; use a letter followed by letters, \
             digits or _"
        ))
    }
}

/// Checks `addr` is `host:port` with a port in 0..=65535; returns the port.
pub(super) fn check_address(addr: &str) -> Result<u16, String> {
    let fix = "write it as host:port, e.g. \"w0.example:2222\"";
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err(format!("\"{addr}\" is not host:port (no port); {fix}"));
    };
    if host.is_empty() {
        return Err(format!("\"{addr}\" has no host; {fix}"));
    }
    let bracketed = host.starts_with('[') && host.ends_with(']');
    if host.contains(':') && !bracketed {
        return Err(format!(
            "\"{addr}\" is not host:port; write IPv6 hosts in brackets, [::1]:2222"
        ));
    }
    if host.chars().any(char::is_whitespace) {
        return Err(format!("\"{addr}\" has a space in the host; {fix}"));
    }
    match port.parse::<u64>() {
        Ok(p) => u16::try_from(p).map_err(|_| {
            format!("port {p} in \"{addr}\" is out of range; use a port from 0 to 65535")
        }),
        Err(_) => Err(format!("\"{addr}\" has no valid port (\"{port}\"); {fix}")),
    }
}

/// Finds this task in the cluster, or says which job or index is missing and what exists.
pub(super) fn find_task(
    cluster: &ClusterSpec,
    job: &str,
    index: u32,
    at: (&str, &str),
    keys: (&str, &str),
) -> Result<TaskId, ConfigError> {
    let (job_at, index_at) = at;
    let (job_key, index_key) = keys;
    let Ok(tasks) = cluster.tasks(job) else {
        let jobs: Vec<&str> = cluster.jobs().collect();
        return Err(ConfigError::TaskNotInCluster {
            at: job_at.to_owned(),
            key: job_key.to_owned(),
            message: format!(
                "job \"{job}\" not in the cluster (jobs: {}); set {job_key} to one of them",
                jobs.join(", ")
            ),
        });
    };
    if !tasks.contains_key(&index) {
        let indices: Vec<String> = tasks.keys().map(u32::to_string).collect();
        return Err(ConfigError::TaskNotInCluster {
            at: index_at.to_owned(),
            key: index_key.to_owned(),
            message: format!(
                "task index {index} not in job \"{job}\" (tasks: {}); set {index_key} to one of \
                 them",
                indices.join(", ")
            ),
        });
    }
    Ok(TaskId::new(job, index))
}

/// The default listen address, on the port of this task's cluster address: loopback when every
/// task of the cluster is on a loopback address (no peer needs more), every interface
/// otherwise.
pub(super) fn default_listen(cluster: &ClusterSpec, task: &TaskId) -> SocketAddr {
    let port = cluster
        .task_address(&task.job, task.index)
        .ok()
        .and_then(|a| check_address(a).ok())
        .unwrap_or(0);
    let all_loopback = cluster
        .all_tasks()
        .all(|(_, address)| is_loopback_address(address));
    if all_loopback {
        SocketAddr::from(([127, 0, 0, 1], port))
    } else {
        SocketAddr::from(([0, 0, 0, 0], port))
    }
}

/// Whether a cluster address (`host:port`) names this host's loopback: `localhost`,
/// `127.0.0.0/8` or `[::1]`.
fn is_loopback_address(address: &str) -> bool {
    let host = address
        .rsplit_once(':')
        .map_or(address, |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_need_a_host_and_a_port_in_range() {
        assert_eq!(check_address("w0:2222"), Ok(2222));
        assert_eq!(check_address("[::1]:0"), Ok(0));
        assert!(check_address("w0").unwrap_err().contains("no port"));
        assert!(check_address(":2222").unwrap_err().contains("no host"));
        assert!(check_address("w0:70000")
            .unwrap_err()
            .contains("port 70000"));
        assert!(check_address("w0:http")
            .unwrap_err()
            .contains("no valid port"));
        assert!(check_address("::1:2222").unwrap_err().contains("brackets"));
    }

    #[test]
    fn a_cluster_all_on_loopback_listens_on_loopback_only() {
        let task = TaskId::new("worker", 0);
        let local = ClusterSpec::from_dense([
            ("ps", vec!["localhost:2222"]),
            ("worker", vec!["127.0.0.1:2223", "[::1]:2224"]),
        ]);
        assert_eq!(
            default_listen(&local, &task),
            SocketAddr::from(([127, 0, 0, 1], 2223))
        );
        let spread = ClusterSpec::from_dense([
            ("ps", vec!["ps0.example:2222"]),
            ("worker", vec!["127.0.0.1:2223"]),
        ]);
        assert_eq!(
            default_listen(&spread, &task),
            SocketAddr::from(([0, 0, 0, 0], 2223))
        );
        assert!(!is_loopback_address("10.0.0.1:1"));
        assert!(!is_loopback_address("localhost.example:1"));
    }

    #[test]
    fn chief_is_task_zero_of_chief_or_worker_zero_without_one() {
        let mut config = TaskConfig::local();
        config.cluster = ClusterSpec::from_dense([("worker", vec!["a:1", "b:1"])]);
        config.task = TaskId::new("worker", 0);
        assert!(config.is_chief());
        config.cluster = ClusterSpec::from_dense([("chief", vec!["c:1"]), ("worker", vec!["a:1"])]);
        assert!(!config.is_chief());
        config.task = TaskId::new("chief", 0);
        assert!(config.is_chief());
    }
}
