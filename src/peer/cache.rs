//! `PeerCache`: one [`Peer`] per task of a cluster, created on first use and shared after.
//!
//! A master asks for the peer of every task a session spans, a worker for the peer of every task
//! it pulls tensors from; both go through the cache so that each task has one channel per
//! process, whoever asks. The own task resolves to its local peer (no gRPC to ourselves).
//! Other tasks get what the cache's [`Connector`] makes: a [`GrpcPeer`] in a daemon, a simulated
//! peer in tests.
//!
//! A task outside the cluster spec is INVALID_ARGUMENT naming it and what the spec holds: such a
//! name comes from a device string in a graph or a request, so it is the caller's input that is
//! wrong.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use super::{LocalPeer, Peer};
use crate::cluster::{ClusterSpec, TaskId, Timeouts};
use crate::error::{Result, Status};
use crate::security::Security;

/// Makes the peer of a task other than the own one, given its address in the cluster spec.
pub type Connector = Arc<dyn Fn(&TaskId, &str) -> Result<Arc<dyn Peer>> + Send + Sync>;

/// Peers of a cluster's tasks, one per task, created on first use.
pub struct PeerCache {
    spec: ClusterSpec,
    local: Arc<dyn Peer>,
    connector: Connector,
    peers: Mutex<HashMap<TaskId, Arc<dyn Peer>>>,
    /// Addresses of tasks `spec` does not name, learnt from the clusters of masters' worker
    /// sessions (see [`learn`](Self::learn)).
    learned: Mutex<HashMap<TaskId, String>>,
}

impl PeerCache {
    /// A cache whose other tasks are reached over gRPC, connecting within `timeouts.connect`;
    /// `local` is the own task, which must be in `spec`.
    ///
    /// Peers are created inside [`get`](Self::get), which must run inside the tokio runtime
    /// that serves the daemon (see [`GrpcPeer::connect_lazy`]).
    pub fn new(spec: ClusterSpec, local: Arc<LocalPeer>, timeouts: &Timeouts) -> Result<Self> {
        Self::with_security(spec, local, timeouts, Security::plain())
    }

    /// [`new`](Self::new), with every channel dialled with `security`: TLS against the
    /// cluster's CA (showing this task's certificate), and the cluster token on every call.
    pub fn with_security(
        spec: ClusterSpec,
        local: Arc<LocalPeer>,
        timeouts: &Timeouts,
        security: Security,
    ) -> Result<Self> {
        Self::with_standbys(spec, local, timeouts, security, BTreeMap::new())
    }

    /// [`with_security`](Self::with_security), where the ps tasks in `standbys` (ps index →
    /// its standby's address) are reached through a [`FailoverPeer`](super::FailoverPeer).
    pub fn with_standbys(
        spec: ClusterSpec,
        local: Arc<LocalPeer>,
        timeouts: &Timeouts,
        security: Security,
        standbys: BTreeMap<u32, String>,
    ) -> Result<Self> {
        let connector = super::failover::connector(standbys, timeouts.connect, security);
        Self::with_connector(spec, local, connector)
    }

    /// A cache whose other tasks are made by `connector`; `local` is the own task, which must be
    /// in `spec`.
    pub fn with_connector(
        spec: ClusterSpec,
        local: Arc<dyn Peer>,
        connector: Connector,
    ) -> Result<Self> {
        address_of(&spec, local.task()).map_err(|e| {
            e.context(format_args!(
                "the own task {} must be in the cluster spec",
                local.task().device_prefix()
            ))
        })?;
        Ok(Self {
            spec,
            local,
            connector,
            peers: Mutex::new(HashMap::new()),
            learned: Mutex::new(HashMap::new()),
        })
    }

    /// Returns the cluster the cache serves.
    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// Returns the own task.
    pub fn local_task(&self) -> &TaskId {
        self.local.task()
    }

    /// Returns the peer of `task`: the local peer for the own task, else the cached one, made
    /// on the first call for that task.
    pub fn get(&self, task: &TaskId) -> Result<Arc<dyn Peer>> {
        if task == self.local.task() {
            return Ok(self.local.clone());
        }
        // A lock poisoned by a panicking connector still guards a consistent map.
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(peer) = peers.get(task) {
            return Ok(peer.clone());
        }
        let peer = match address_of(&self.spec, task) {
            Ok(address) => (self.connector)(task, address)?,
            Err(unknown) => {
                let learned = self.learned.lock().unwrap_or_else(PoisonError::into_inner);
                match learned.get(task) {
                    Some(address) => (self.connector)(task, address)?,
                    None => return Err(unknown),
                }
            }
        };
        peers.insert(task.clone(), peer.clone());
        Ok(peer)
    }

    /// Learns the addresses of the tasks in `cluster` that this task's own cluster does not
    /// name, as a master's `CreateWorkerSession` gives them: under Kubeflow's sparse
    /// `TF_CONFIG` a ps knows only itself, and pulls a worker's gradients from the address the
    /// worker's master sent (TensorFlow's worker builds a session's worker cache from that
    /// cluster too). The own cluster's addresses always win; a learnt task whose address
    /// changes (a restarted worker's pod came back elsewhere) is connected anew.
    pub fn learn(&self, cluster: &ClusterSpec) {
        // The same lock order as `get`: peers, then learned.
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        let mut learned = self.learned.lock().unwrap_or_else(PoisonError::into_inner);
        for (task, address) in cluster.all_tasks() {
            if address_of(&self.spec, &task).is_ok()
                || learned.get(&task).map(String::as_str) == Some(address)
            {
                continue;
            }
            tracing::info!(task = %task.device_prefix(), address, "learnt a task's address from a master's cluster");
            peers.remove(&task);
            learned.insert(task, address.to_owned());
        }
    }

    /// Returns the peer of every task in the cluster, in cluster order, the own task included.
    pub fn all(&self) -> Result<Vec<Arc<dyn Peer>>> {
        self.spec
            .all_tasks()
            .map(|(task, _)| self.get(&task))
            .collect()
    }
}

impl std::fmt::Debug for PeerCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        let mut connected: Vec<_> = peers.keys().map(TaskId::device_prefix).collect();
        connected.sort();
        f.debug_struct("PeerCache")
            .field("local", &self.local.task())
            .field("connected", &connected)
            .finish()
    }
}

/// Returns `task`'s address, or INVALID_ARGUMENT saying what the cluster has instead.
fn address_of<'a>(spec: &'a ClusterSpec, task: &TaskId) -> Result<&'a str> {
    let Ok(tasks) = spec.tasks(&task.job) else {
        let jobs: Vec<_> = spec.jobs().collect();
        return Err(Status::invalid_argument(format!(
            "task {} is not in the cluster: no job \"{}\" (jobs: {}); check the device names \
             against the cluster spec",
            task.device_prefix(),
            task.job,
            if jobs.is_empty() {
                "none".to_string()
            } else {
                jobs.join(", ")
            },
        )));
    };
    tasks.get(&task.index).map(String::as_str).ok_or_else(|| {
        let indices: Vec<_> = tasks.keys().map(u32::to_string).collect();
        Status::invalid_argument(format!(
            "task {} is not in the cluster: job \"{}\" has tasks {}; check the device names \
             against the cluster spec",
            task.device_prefix(),
            task.job,
            if indices.is_empty() {
                "none".to_string()
            } else {
                indices.join(", ")
            },
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;

    fn spec() -> ClusterSpec {
        ClusterSpec::from_dense([
            ("ps", vec!["ps0:2222"]),
            ("worker", vec!["w0:2222", "w1:2222"]),
        ])
    }

    #[test]
    fn unknown_tasks_and_jobs_are_named_with_what_exists() {
        let spec = spec();
        let err = address_of(&spec, &TaskId::new("worker", 5)).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(
            err.message().starts_with(
                "task /job:worker/replica:0/task:5 is not in the cluster: job \"worker\" has \
                 tasks 0, 1;"
            ),
            "{err}"
        );
        let err = address_of(&spec, &TaskId::new("chief", 0)).unwrap_err();
        assert!(
            err.message()
                .contains("no job \"chief\" (jobs: ps, worker)"),
            "{err}"
        );
        assert_eq!(
            address_of(&spec, &TaskId::new("worker", 1)).unwrap(),
            "w1:2222"
        );
    }
}
