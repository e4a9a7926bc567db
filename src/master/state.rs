//! The logic of a [`Master`](super::Master), without actix: who the master is, the config every
//! session starts from, and the checks and decisions of CreateSession and ListDevices.

use std::time::Duration;

use crate::cluster::{ClusterSpec, DeviceName, Limits, TaskId, Timeouts};
use crate::error::{Result, Status};
use crate::proto::{
    ConfigProto, CreateSessionRequest, DeviceAttributes, GetStatusResponse, ListDevicesResponse,
};

use super::discovery::{parse_filters, session_devices, target_tasks, FoundTask};
use super::session::graph::{DeviceSet, SessionGraph};
use super::session::step::SessionContext;

/// What the master knows: its task, its cluster, its defaults.
#[derive(Clone, Debug)]
pub struct MasterState {
    task: TaskId,
    cluster: ClusterSpec,
    timeouts: Timeouts,
    /// The server's default session config, merged into every session's.
    default_config: ConfigProto,
    /// Drawn at start; workers retire the sessions of an older incarnation of this master.
    incarnation: i64,
    /// What one client may take (`[limits]`).
    limits: Limits,
}

/// What CreateSession decided before asking any task.
pub struct SessionSetup {
    /// The validated graph.
    pub graph: SessionGraph,
    /// The session's config: the server's default merged with the request's.
    pub config: ConfigProto,
    /// Parsed `device_filters`.
    pub filters: Vec<DeviceName>,
    /// The tasks to ask for GetStatus and to create worker sessions on.
    pub tasks: Vec<TaskId>,
    /// How long GetStatus may take.
    pub discovery_budget: Duration,
}

impl MasterState {
    /// The master of `task` in a one-task cluster, with default timeouts (tests).
    pub fn new(task: TaskId) -> Self {
        let cluster = ClusterSpec::from_dense([(task.job.clone(), vec!["localhost:0"])]);
        Self::with_cluster(task, cluster, Timeouts::default(), true)
    }

    /// The master of `task` in `cluster`; `allow_soft_placement` is the server's default.
    pub fn with_cluster(
        task: TaskId,
        cluster: ClusterSpec,
        timeouts: Timeouts,
        allow_soft_placement: bool,
    ) -> Self {
        let incarnation = loop {
            let i: i64 = rand::random();
            if i != 0 {
                break i;
            }
        };
        Self {
            task,
            cluster,
            timeouts,
            default_config: ConfigProto {
                allow_soft_placement,
                ..Default::default()
            },
            incarnation,
            limits: Limits::default(),
        }
    }

    /// The same master, enforcing `limits` instead of the defaults.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Returns the limits this master enforces.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Returns the task this master serves.
    pub fn task(&self) -> &TaskId {
        &self.task
    }

    /// Returns the cluster.
    pub fn cluster(&self) -> &ClusterSpec {
        &self.cluster
    }

    /// Returns the deadlines.
    pub fn timeouts(&self) -> &Timeouts {
        &self.timeouts
    }

    /// Returns this master's incarnation.
    pub fn incarnation(&self) -> i64 {
        self.incarnation
    }

    /// The session config: the request's, with the server's defaults where the request leaves
    /// a field unset (a request cannot turn off the server's soft placement, as in TensorFlow
    /// where the default config is merged in).
    pub fn merge_config(&self, request: Option<&ConfigProto>) -> ConfigProto {
        let mut config = request.cloned().unwrap_or_default();
        config.allow_soft_placement |= self.default_config.allow_soft_placement;
        if config.operation_timeout_in_ms <= 0 {
            config.operation_timeout_in_ms = self.default_config.operation_timeout_in_ms;
        }
        config
    }

    /// Checks a CreateSession request and decides which tasks to ask: validates the graph
    /// (INVALID_ARGUMENT or NOT_FOUND naming the node) and the device filters.
    pub fn prepare_session(&self, request: &CreateSessionRequest) -> Result<SessionSetup> {
        if let Some(graph) = &request.graph_def {
            self.limits.check_graph("CreateSession: the graph", graph)?;
        }
        let graph = SessionGraph::new(&request.graph_def.clone().unwrap_or_default())
            .map_err(|e| e.context("CreateSession: the graph is not valid"))?;
        let config = self.merge_config(request.config.as_ref());
        let filters = parse_filters(&config.device_filters)?;
        let tasks = target_tasks(&self.cluster, &self.task, &filters);
        let discovery_budget = if config.operation_timeout_in_ms > 0 {
            Duration::from_millis(config.operation_timeout_in_ms as u64)
        } else {
            self.timeouts.create_session
        };
        Ok(SessionSetup {
            graph,
            config,
            filters,
            tasks,
            discovery_budget,
        })
    }

    /// The answer for a session handle this master does not have. TensorFlow answers ABORTED
    /// (the master may have restarted: the client should recreate its session).
    pub fn unknown_session(&self, handle: &str) -> Status {
        Status::aborted(format!(
            "Session {handle} is not found on {}; possibly this master has restarted or the \
             session was closed: create a new session",
            self.task
        ))
    }

    /// Answers ListDevices without a session from the own worker's GetStatus: its devices are
    /// the local ones.
    pub fn list_devices(&self, local: GetStatusResponse) -> ListDevicesResponse {
        ListDevicesResponse {
            local_device: local.device_attributes,
            remote_device: Vec::new(),
        }
    }

    /// Splits a session's devices into this task's (local) and the others (remote).
    pub fn split_devices(&self, devices: &[DeviceAttributes]) -> ListDevicesResponse {
        let prefix = format!("{}/", self.task.device_prefix());
        let (local_device, remote_device) = devices
            .iter()
            .cloned()
            .partition(|d| d.name.starts_with(&prefix));
        ListDevicesResponse {
            local_device,
            remote_device,
        }
    }
}

/// What a new master session starts from, once its tasks answered GetStatus.
pub struct SessionParts {
    /// The devices its nodes may be placed on, with every found device's incarnation.
    pub devices: DeviceSet,
    /// Its handle, peers, the tasks' incarnations and its config.
    pub context: SessionContext,
    /// Its devices split into this task's and the others' (ListDevices).
    pub listed: ListDevicesResponse,
}

impl MasterState {
    /// The parts of session `handle` over the tasks `found` (their devices kept by `filters`),
    /// with `config`: what the session actor is built from.
    pub fn session_parts(
        &self,
        handle: &str,
        found: &[FoundTask],
        filters: &[DeviceName],
        config: ConfigProto,
    ) -> SessionParts {
        let devices = session_devices(found, filters);
        let listed = self.split_devices(&devices);
        let device_set = DeviceSet {
            devices,
            incarnations: found
                .iter()
                .flat_map(|t| t.devices.iter())
                .map(|d| (d.name.clone(), d.incarnation))
                .collect(),
            client_device: format!("{}/device:CPU:0", self.task.device_prefix()),
            allow_soft_placement: config.allow_soft_placement,
        };
        let context = SessionContext {
            handle: handle.to_string(),
            peers: found
                .iter()
                .map(|t| (t.task.clone(), t.peer.clone()))
                .collect(),
            incarnations: found
                .iter()
                .filter_map(|t| Some((t.task.clone(), t.devices.first()?.incarnation)))
                .collect(),
            config,
        };
        SessionParts {
            devices: device_set,
            context,
            listed,
        }
    }
}

/// A new session handle: 64 random bits as 16 lowercase hex digits, as TensorFlow prints them.
pub fn new_session_handle() -> String {
    format!("{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;
    use crate::proto::{GraphDef, NodeDef};

    #[test]
    fn own_worker_devices_are_local() {
        let master = MasterState::new(TaskId::new("worker", 0));
        let cpu = DeviceAttributes {
            name: "/job:worker/replica:0/task:0/device:CPU:0".into(),
            incarnation: 3,
            ..Default::default()
        };
        let reply = master.list_devices(GetStatusResponse {
            device_attributes: vec![cpu.clone()],
        });
        assert_eq!(reply.local_device, vec![cpu]);
        assert!(reply.remote_device.is_empty());
    }

    #[test]
    fn session_devices_split_into_local_and_remote() {
        let master = MasterState::new(TaskId::new("worker", 1));
        let device = |name: &str| DeviceAttributes {
            name: name.into(),
            ..Default::default()
        };
        let reply = master.split_devices(&[
            device("/job:ps/replica:0/task:0/device:CPU:0"),
            device("/job:worker/replica:0/task:1/device:CPU:0"),
            device("/job:worker/replica:0/task:10/device:CPU:0"),
        ]);
        assert_eq!(reply.local_device.len(), 1);
        assert_eq!(
            reply.local_device[0].name,
            "/job:worker/replica:0/task:1/device:CPU:0"
        );
        assert_eq!(reply.remote_device.len(), 2);
    }

    #[test]
    fn a_sessions_parts_come_from_the_tasks_found() {
        use crate::peer::SimulatedCluster;

        let master = MasterState::new(TaskId::new("worker", 0));
        let spec = ClusterSpec::from_dense([("ps", vec!["ps0:1"]), ("worker", vec!["w0:1"])]);
        let cluster = SimulatedCluster::new(&spec);
        let peers = cluster.peer_cache(&TaskId::new("worker", 0)).unwrap();
        let device = |name: &str, incarnation: u64| DeviceAttributes {
            name: name.into(),
            incarnation,
            ..Default::default()
        };
        let found: Vec<FoundTask> = [("ps", 7), ("worker", 9)]
            .into_iter()
            .map(|(job, incarnation)| {
                let task = TaskId::new(job, 0);
                FoundTask {
                    peer: peers.get(&task).unwrap(),
                    devices: vec![device(
                        &format!("{}/device:CPU:0", task.device_prefix()),
                        incarnation,
                    )],
                    task,
                }
            })
            .collect();
        let config = ConfigProto {
            allow_soft_placement: true,
            ..Default::default()
        };
        let filters = parse_filters(&["/job:ps".to_string()]).unwrap();
        let parts = master.session_parts("abc", &found, &filters, config);
        // The filter keeps the ps's device for placement; every device's incarnation is known.
        let names: Vec<&str> = parts
            .devices
            .devices
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        assert_eq!(names, ["/job:ps/replica:0/task:0/device:CPU:0"]);
        assert_eq!(parts.devices.incarnations.len(), 2);
        assert_eq!(
            parts.devices.client_device,
            "/job:worker/replica:0/task:0/device:CPU:0"
        );
        assert!(parts.devices.allow_soft_placement);
        assert_eq!(parts.context.handle, "abc");
        assert_eq!(parts.context.peers.len(), 2);
        assert_eq!(parts.context.incarnations[&TaskId::new("ps", 0)], 7);
        assert_eq!(parts.listed.remote_device.len(), 1);
        assert!(parts.listed.local_device.is_empty());
    }

    #[test]
    fn unknown_handles_are_aborted_naming_the_handle() {
        let master = MasterState::new(TaskId::new("worker", 0));
        let err = master.unknown_session("2feaff26548834a9");
        assert_eq!(err.code(), Code::Aborted);
        assert!(err.message().contains("2feaff26548834a9"), "{err}");
    }

    #[test]
    fn the_server_default_soft_placement_is_merged_in() {
        let master = MasterState::with_cluster(
            TaskId::new("worker", 0),
            ClusterSpec::from_dense([("worker", vec!["w0:1"])]),
            Timeouts::default(),
            true,
        );
        let merged = master.merge_config(Some(&ConfigProto {
            operation_timeout_in_ms: 1500,
            ..Default::default()
        }));
        assert!(merged.allow_soft_placement);
        assert_eq!(merged.operation_timeout_in_ms, 1500);
    }

    #[test]
    fn a_malformed_graph_is_refused_naming_the_node() {
        let master = MasterState::new(TaskId::new("worker", 0));
        let request = CreateSessionRequest {
            graph_def: Some(GraphDef {
                node: vec![NodeDef {
                    name: "y".into(),
                    op: "Identity".into(),
                    input: vec!["missing".into()],
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let err = master.prepare_session(&request).err().unwrap();
        assert!(
            matches!(err.code(), Code::InvalidArgument | Code::NotFound),
            "{err}"
        );
        assert!(err.message().contains('y'), "{err}");
    }

    #[test]
    fn handles_are_16_hex_digits() {
        let handle = new_session_handle();
        assert_eq!(handle.len(), 16);
        assert!(handle.chars().all(|c| c.is_ascii_hexdigit()));
    }
}
