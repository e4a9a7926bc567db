//! Worker sessions: what one master session owns on this task.
//!
//! A master creates a worker session per task (CreateWorkerSession) and registers its graphs in
//! it; DeleteWorkerSession drops them. Requests with `create_worker_session_called = false`
//! (older masters) use the legacy session, which always exists and is never collected.
//!
//! Resources: by default a session runs on the task's shared devices, so variables live in the
//! task's stores and every session sees them (TensorFlow's `isolate_session_state = false`).
//! An isolated session gets devices of its own, with empty stores that die with the session.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use crate::runtime::device::Device;

use super::graphs::RegisteredGraph;

/// The handle of the legacy session.
pub const LEGACY_SESSION: &str = "";

/// One master session's state on this task.
#[derive(Debug)]
pub struct WorkerSession {
    /// The master task that created it (`/job:worker/replica:0/task:0`), empty for legacy.
    pub master_task: String,
    /// The incarnation of that master; a newer one retires this session.
    pub master_incarnation: i64,
    /// The devices its graphs run on: the task's shared ones, or its own when isolated.
    pub devices: Vec<Arc<Device>>,
    /// Its registered graphs, by handle.
    pub graphs: HashMap<String, Arc<RegisteredGraph>>,
    /// Steps it ran that no CleanupGraph ended yet.
    pub steps: HashSet<i64>,
    /// When the master last used it (RegisterGraph, RunGraph).
    pub last_used: Instant,
}

impl WorkerSession {
    /// A session on `devices` created by `master_task` of `master_incarnation`.
    pub fn new(master_task: String, master_incarnation: i64, devices: Vec<Arc<Device>>) -> Self {
        Self {
            master_task,
            master_incarnation,
            devices,
            graphs: HashMap::new(),
            steps: HashSet::new(),
            last_used: Instant::now(),
        }
    }

    /// Marks the session used now.
    pub fn touch(&mut self) {
        self.last_used = Instant::now();
    }
}

/// Devices with the same names, types, memory budgets and file confinement as `shared`, each
/// with an empty store of its own.
pub fn isolated_devices(shared: &[Arc<Device>]) -> Vec<Arc<Device>> {
    shared.iter().map(|d| Arc::new(d.isolated())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceType;

    #[test]
    fn isolated_devices_keep_names_but_not_stores() {
        let shared = vec![Arc::new(Device::new(
            "/job:ps/replica:0/task:0/device:CPU:0",
            DeviceType::Cpu,
        ))];
        let own = isolated_devices(&shared);
        assert_eq!(own[0].name(), shared[0].name());
        assert!(!Arc::ptr_eq(own[0].resources(), shared[0].resources()));
    }
}
