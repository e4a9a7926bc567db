//! The logic of a [`Worker`](super::Worker), without actix: TensorFlow's WorkerService.
//!
//! [`WorkerState`] is a cheap handle (`Clone`, `Arc` inside) that the actor, its spawned
//! futures and the own task's `LocalPeer` share. It holds:
//! - the task's devices (attributes for GetStatus and incarnation checks, and the runtime
//!   devices whose resource stores every non-isolated session shares);
//! - the worker sessions, each with its registered graphs ([`super::session`]);
//! - the task's [`RendezvousMgr`]: one rendezvous per live step, found or created by RunGraph
//!   and by RecvTensor (which may come first), removed by CleanupGraph or by TTL collection;
//! - the remote-receive hook (`RemoteRecv`) that `_Recv` kernels use to pull tensors from
//!   other tasks: the peers implement it and the daemon hands it over
//!   ([`WorkerState::set_remote`]), so the worker knows no transport.
//!
//! Every wait has a deadline from [`WorkerOptions`]: a step that does not finish within
//! `step_timeout` fails with DEADLINE_EXCEEDED, a RecvTensor whose value does not come within
//! its deadline fails with DEADLINE_EXCEEDED naming the key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::cluster::{TaskId, Timeouts};
use crate::device::host_pool::HOST_POOL;
use crate::device::memory::MemoryBudget;
use crate::device::DeviceType;
use crate::error::{Result, Status};
use crate::format::files::Files;
use crate::proto::{
    CleanupAllRequest, CleanupAllResponse, CleanupGraphRequest, CleanupGraphResponse,
    CreateWorkerSessionRequest, CreateWorkerSessionResponse, DeleteWorkerSessionRequest,
    DeleteWorkerSessionResponse, DeregisterGraphRequest, DeregisterGraphResponse, DeviceAttributes,
    GetStatusRequest, GetStatusResponse, GetStepSequenceRequest, GetStepSequenceResponse,
    NamedTensorProto, RecvTensorRequest, RecvTensorResponse, RegisterGraphRequest,
    RegisterGraphResponse, RunGraphRequest, RunGraphResponse, StepSequence,
};
use crate::runtime::cancel::CancellationToken;
use crate::runtime::device::Device;
use crate::runtime::rendezvous::{check_incarnation, ParsedKey, RendezvousMgr};
use crate::runtime::resource::ResourceMgr;
use crate::runtime::stats::StepStatsCollector;
use crate::runtime::{RemoteRecv, StepOptions};
use crate::shard::replica::ReplicaState;
use crate::tensor::Tensor;

use super::graphs::RegisteredGraph;
use super::service::{worker_rpcs, HandlerFuture, WorkerHandler};
use super::session::{isolated_devices, WorkerSession, LEGACY_SESSION};
use super::step::run_executors;
use crate::ops::metrics;
use crate::tower::TowerHandle;

/// The worker's deadlines and collection periods.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerOptions {
    /// How long one RunGraph step may run.
    pub step_timeout: Duration,
    /// How long a RecvTensor waits for its value when the caller set no deadline.
    pub recv_timeout: Duration,
    /// A step nobody used for this long is collected (its master went away without
    /// CleanupGraph).
    pub step_ttl: Duration,
    /// A worker session whose master sent nothing for this long is collected with its graphs.
    pub session_ttl: Duration,
    /// Most worker sessions the task holds at once (`limits.max_sessions`); the legacy
    /// session does not count.
    pub max_sessions: usize,
    /// The paths the devices' checkpoint and summary kernels may touch
    /// (`checkpoints.allowed_dirs`).
    pub files: Files,
    /// The paths the devices' input kernels may read (`data.allowed_dirs`, with the
    /// checkpoint directories).
    pub data_files: Files,
    /// Bytes each CPU device's steps and variables may take (`devices.cpu_memory_limit`);
    /// `None`, no limit.
    pub cpu_memory_limit: Option<u64>,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self::from_timeouts(&Timeouts::default())
    }
}

impl WorkerOptions {
    /// Options derived from the task's timeouts: steps and receives get the RPC deadline;
    /// steps are collected after twice that (at least a minute), sessions after an hour.
    pub fn from_timeouts(timeouts: &Timeouts) -> Self {
        Self {
            step_timeout: timeouts.rpc,
            recv_timeout: timeouts.rpc,
            step_ttl: (timeouts.rpc * 2).max(Duration::from_secs(60)),
            session_ttl: Duration::from_secs(3600),
            max_sessions: crate::cluster::Limits::default().max_sessions,
            files: Files::ambient(),
            data_files: Files::ambient(),
            cpu_memory_limit: None,
        }
    }
}

/// What [`WorkerState::collect_stale`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Collected {
    /// Step ids whose rendezvous was aborted and removed.
    pub steps: Vec<i64>,
    /// Session handles removed with their graphs.
    pub sessions: Vec<String>,
}

/// The task's WorkerService state, shared by handle.
#[derive(Clone)]
pub struct WorkerState {
    inner: Arc<Inner>,
}

struct Inner {
    task: TaskId,
    devices: Vec<DeviceAttributes>,
    /// The runtime devices every non-isolated session runs on, in `devices` order.
    shared: Vec<Arc<Device>>,
    incarnations: HashMap<String, u64>,
    options: WorkerOptions,
    rendezvous: RendezvousMgr,
    sessions: Mutex<HashMap<String, WorkerSession>>,
    next_graph: AtomicU64,
    /// The next step id of each collective graph key this task leads (GetStepSequence).
    step_sequences: Mutex<HashMap<i64, i64>>,
    remote: OnceLock<Arc<dyn RemoteRecv>>,
    /// This ps task's pair of daemons, when it has a standby: steps run only on the primary,
    /// and answer once their writes are on the standby too.
    replica: OnceLock<Arc<ReplicaState>>,
    /// The towers of the devices that have one, by device name.
    towers: HashMap<String, TowerHandle>,
}

impl WorkerState {
    /// The state of `task`'s worker over its `devices` (built once at start), each device with
    /// a store of its own, and default options.
    pub fn new(task: TaskId, devices: Vec<DeviceAttributes>) -> Self {
        Self::with_options(task, devices, None, WorkerOptions::default())
    }

    /// The state of `task`'s worker over its `devices`; `cpu0_resources` is the variable
    /// shard's store, which the task's `CPU:0` uses (the other devices get their own).
    pub fn with_options(
        task: TaskId,
        devices: Vec<DeviceAttributes>,
        cpu0_resources: Option<Arc<ResourceMgr>>,
        options: WorkerOptions,
    ) -> Self {
        let cpu0 = format!("{}/device:CPU:0", task.device_prefix());
        let shards = cpu0_resources
            .map(|store| (cpu0, store))
            .into_iter()
            .collect();
        Self::with_towers(task, devices, shards, options, Vec::new())
    }

    /// The state of `task`'s worker as a daemon runs it: each device in `shards` keeps its
    /// variables in its shard's store (the others get a store of their own), and each device in
    /// `towers` runs its part of every step on its tower, its nodes on the tower's pool.
    /// Devices without a tower (a worker driven without actors, in tests) start their part on
    /// the caller's thread and run it on the process's shared pool.
    pub fn with_towers(
        task: TaskId,
        devices: Vec<DeviceAttributes>,
        shards: HashMap<String, Arc<ResourceMgr>>,
        options: WorkerOptions,
        towers: Vec<TowerHandle>,
    ) -> Self {
        let shared = devices
            .iter()
            .map(|d| {
                let device_type = DeviceType::parse(&d.device_type).unwrap_or(DeviceType::Cpu);
                let resources = shards
                    .get(&d.name)
                    .cloned()
                    .unwrap_or_else(|| Arc::new(ResourceMgr::new()));
                let mut device = Device::with_resources(&d.name, device_type, resources)
                    .with_files(options.files.clone())
                    .with_data_files(options.data_files.clone());
                let tower = towers.iter().find(|t| t.device() == d.name);
                if let Some(tower) = tower {
                    device = device
                        .with_pool(tower.pool().clone())
                        .with_intra(Arc::clone(tower.intra()));
                }
                // A GPU's memory and context belong to its tower, whose threads have the
                // context current.
                let memory = match tower {
                    Some(tower) => tower.memory().cloned(),
                    None => crate::kernels::memory_space(device_type, &d.name),
                };
                if let Some(memory) = memory {
                    device = device.with_memory_space(memory);
                }
                // A GPU's limit comes from gpu_memory_fraction; a CPU's from the options (the
                // daemon gives the same figure its attributes report).
                let budget = match device_type {
                    DeviceType::Gpu => Some(MemoryBudget::with_key(
                        &d.name,
                        d.memory_limit.max(0) as u64,
                        "devices.gpu_memory_fraction",
                    )),
                    DeviceType::Cpu => options.cpu_memory_limit.map(|limit| {
                        MemoryBudget::for_host(
                            &d.name,
                            limit,
                            "devices.cpu_memory_limit",
                            &HOST_POOL,
                        )
                    }),
                };
                Arc::new(match budget {
                    Some(budget) => device.with_memory(budget),
                    None => device,
                })
            })
            .collect();
        let incarnations = devices
            .iter()
            .map(|d| (d.name.clone(), d.incarnation))
            .collect();
        let mut sessions = HashMap::new();
        sessions.insert(
            LEGACY_SESSION.to_string(),
            WorkerSession::new(String::new(), 0, Vec::clone(&shared)),
        );
        Self {
            inner: Arc::new(Inner {
                remote: OnceLock::new(),
                replica: OnceLock::new(),
                towers: towers
                    .into_iter()
                    .map(|t| (t.device().to_string(), t))
                    .collect(),
                task,
                devices,
                shared,
                incarnations,
                rendezvous: RendezvousMgr::new(options.step_ttl),
                options,
                sessions: Mutex::new(sessions),
                next_graph: AtomicU64::new(1),
                step_sequences: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Gives the worker the way its `_Recv` kernels pull tensors from other tasks (the
    /// cluster's peers). Only the first call counts.
    pub fn set_remote(&self, remote: Arc<dyn RemoteRecv>) {
        if self.inner.remote.set(remote).is_err() {
            tracing::warn!(task = %self.inner.task, "worker peers were already set; kept the first");
        }
    }

    /// Makes this worker one of its ps task's pair: it serves steps only while `replica` is
    /// the primary, and a step's RunGraph answers once its writes are on the standby.
    pub fn set_replica(&self, replica: Arc<ReplicaState>) {
        if self.inner.replica.set(replica).is_err() {
            tracing::warn!(task = %self.inner.task, "the worker's replica was already set; kept the first");
        }
    }

    /// OK unless this daemon is its ps task's standby, which serves no `rpc`.
    fn check_serving(&self, rpc: &str) -> Result<()> {
        match self.inner.replica.get() {
            Some(replica) => replica.check_serving(rpc),
            None => Ok(()),
        }
    }

    /// Returns the task this worker serves.
    pub fn task(&self) -> &TaskId {
        &self.inner.task
    }

    /// Returns the memory budgets of the task's devices that have one.
    pub fn memory_budgets(&self) -> Vec<Arc<MemoryBudget>> {
        self.inner
            .shared
            .iter()
            .filter_map(|d| d.memory().cloned())
            .collect()
    }

    /// Returns the task's devices, CPUs first.
    pub fn devices(&self) -> &[DeviceAttributes] {
        &self.inner.devices
    }

    /// Returns the worker's options.
    pub fn options(&self) -> &WorkerOptions {
        &self.inner.options
    }

    /// Returns the task's step table.
    pub fn rendezvous(&self) -> &RendezvousMgr {
        &self.inner.rendezvous
    }

    /// Returns the resource store of the shared device named `device`, if it is one of the
    /// task's devices.
    pub fn resources_of(&self, device: &str) -> Option<Arc<ResourceMgr>> {
        self.inner
            .shared
            .iter()
            .find(|d| d.name() == device)
            .map(|d| Arc::clone(d.resources()))
    }

    /// Returns the number of graphs registered in session `handle` (`None` if no such session).
    pub fn graph_count(&self, handle: &str) -> Option<usize> {
        self.sessions().get(handle).map(|s| s.graphs.len())
    }

    /// Answers GetStatus: every local device, with the incarnation it got at start.
    pub fn get_status(&self, _request: &GetStatusRequest) -> Result<GetStatusResponse> {
        Ok(GetStatusResponse {
            device_attributes: self.inner.devices.clone(),
        })
    }

    /// CreateWorkerSession: a session for a master session. A newer `master_incarnation` of a
    /// master task retires that master's older sessions (graphs dropped, steps aborted).
    pub fn create_worker_session(
        &self,
        request: &CreateWorkerSessionRequest,
    ) -> Result<CreateWorkerSessionResponse> {
        self.check_serving("CreateWorkerSession")?;
        let handle = &request.session_handle;
        if handle.is_empty() {
            return Err(Status::invalid_argument(
                "CreateWorkerSession needs a session_handle; the master names its sessions",
            ));
        }
        // The master's cluster may name tasks this task's own does not (Kubeflow's sparse
        // TF_CONFIG: a ps knows only itself); the session's `_Recv`s pull from them.
        let cluster = request.server_def.as_ref().and_then(|d| d.cluster.as_ref());
        if let (Some(cluster), Some(remote)) = (cluster, self.inner.remote.get()) {
            match crate::cluster::ClusterSpec::from_cluster_def(cluster) {
                Ok(cluster) => remote.learn_tasks(&cluster),
                Err(e) => tracing::warn!(
                    task = %self.inner.task,
                    session = %handle,
                    error = %e,
                    "ignored the cluster of a CreateWorkerSession"
                ),
            }
        }
        let devices = if request.isolate_session_state {
            isolated_devices(&self.inner.shared)
        } else {
            Vec::clone(&self.inner.shared)
        };
        let retired = {
            let mut sessions = self.sessions();
            if sessions.contains_key(handle) {
                return Err(Status::already_exists(format!(
                    "worker session `{handle}` already exists on {}; session handles must be \
                     unique",
                    self.inner.task
                )));
            }
            let stale: Vec<String> = sessions
                .iter()
                .filter(|(h, s)| {
                    h.as_str() != LEGACY_SESSION
                        && !request.master_task.is_empty()
                        && s.master_task == request.master_task
                        && s.master_incarnation != request.master_incarnation
                })
                .map(|(h, _)| h.clone())
                .collect();
            // The legacy session is always there and the retired ones are about to go.
            let held = sessions.len().saturating_sub(1 + stale.len());
            if held >= self.inner.options.max_sessions {
                return Err(crate::cluster::Limits::exceeded(
                    "max_sessions",
                    self.inner.options.max_sessions,
                    &format!(
                        "CreateWorkerSession: {} already holds {held} worker sessions",
                        self.inner.task.device_prefix()
                    ),
                ));
            }
            let retired: Vec<(String, WorkerSession)> = stale
                .into_iter()
                .filter_map(|h| sessions.remove(&h).map(|s| (h, s)))
                .collect();
            sessions.insert(
                handle.clone(),
                WorkerSession::new(
                    request.master_task.clone(),
                    request.master_incarnation,
                    devices,
                ),
            );
            retired
        };
        for (old, session) in retired {
            tracing::info!(
                task = %self.inner.task,
                session = %old,
                master = %request.master_task,
                "retiring a session of an earlier incarnation of its master"
            );
            self.end_steps(
                &session,
                &format!("its master {} restarted", request.master_task),
            );
        }
        Ok(CreateWorkerSessionResponse {})
    }

    /// DeleteWorkerSession: drops the session, its graphs and its pending steps. Unknown
    /// handles are ignored (the master may retry); the legacy session cannot be deleted.
    pub fn delete_worker_session(
        &self,
        request: &DeleteWorkerSessionRequest,
    ) -> Result<DeleteWorkerSessionResponse> {
        if request.session_handle == LEGACY_SESSION {
            return Ok(DeleteWorkerSessionResponse {});
        }
        let removed = self.sessions().remove(&request.session_handle);
        if let Some(session) = removed {
            self.end_steps(&session, "its session was deleted");
        }
        Ok(DeleteWorkerSessionResponse {})
    }

    /// RegisterGraph: validates and builds the partition; answers its handle.
    pub fn register_graph(&self, request: &RegisterGraphRequest) -> Result<RegisterGraphResponse> {
        self.check_serving("RegisterGraph")?;
        let handle_of_session = session_key(
            &request.session_handle,
            request.create_worker_session_called,
        );
        let devices = {
            let mut sessions = self.sessions();
            let session = self.session_mut(&mut sessions, handle_of_session)?;
            session.touch();
            Vec::clone(&session.devices)
        };
        let graph_def = request.graph_def.as_ref().ok_or_else(|| {
            Status::invalid_argument("RegisterGraph carries no graph_def; send the partition")
        })?;
        let handle = format!(
            "{:016x}",
            self.inner.next_graph.fetch_add(1, Ordering::Relaxed)
        );
        // Building creates kernels; it runs outside the session lock.
        let graph = RegisteredGraph::build(
            handle.clone(),
            handle_of_session,
            graph_def,
            &devices,
            &self.inner.incarnations,
        )?;
        let mut sessions = self.sessions();
        let session = self.session_mut(&mut sessions, handle_of_session)?;
        session.graphs.insert(handle.clone(), Arc::new(graph));
        Ok(RegisterGraphResponse {
            graph_handle: handle,
        })
    }

    /// DeregisterGraph: drops a registered graph; ABORTED naming it when unknown.
    pub fn deregister_graph(
        &self,
        request: &DeregisterGraphRequest,
    ) -> Result<DeregisterGraphResponse> {
        let mut sessions = self.sessions();
        let key = session_key(
            &request.session_handle,
            request.create_worker_session_called,
        );
        let session = self.session_mut(&mut sessions, key)?;
        match session.graphs.remove(&request.graph_handle) {
            Some(_) => Ok(DeregisterGraphResponse {}),
            None => Err(unknown_graph(&request.graph_handle)),
        }
    }

    /// RunGraph: feeds `send` into the step's rendezvous, runs every device's executor, and
    /// answers the `recv_key` tensors. Step errors go in the body when
    /// `store_errors_in_response_body`, else they are the call's error.
    pub async fn run_graph(&self, request: RunGraphRequest) -> Result<RunGraphResponse> {
        self.run_graph_within(request, None).await
    }

    /// RunGraph for a caller that waits at most `timeout`: the step's deadline is the shorter
    /// of that and the worker's step timeout.
    pub async fn run_graph_within(
        &self,
        request: RunGraphRequest,
        timeout: Option<Duration>,
    ) -> Result<RunGraphResponse> {
        let in_body = request.store_errors_in_response_body;
        let budget = timeout.map_or(self.inner.options.step_timeout, |t| {
            t.min(self.inner.options.step_timeout)
        });
        let started = Instant::now();
        let result = self.run_graph_step(request, budget).await;
        metrics::seconds(
            metrics::WORKER_STEP_SECONDS,
            &self.inner.task.device_prefix(),
            started.elapsed(),
        );
        match result {
            Ok(response) => Ok(response),
            Err(status) if in_body => Ok(RunGraphResponse {
                status_code: status.code() as i32,
                status_error_message: status.message().to_string(),
                ..Default::default()
            }),
            Err(status) => Err(status),
        }
    }

    async fn run_graph_step(
        &self,
        request: RunGraphRequest,
        budget: Duration,
    ) -> Result<RunGraphResponse> {
        self.check_serving("RunGraph")?;
        if request.is_partial {
            return Err(Status::unimplemented(
                "partial runs (RunGraph is_partial) are not supported by tessera's worker",
            ));
        }
        let step_id = request.step_id;
        let graph = {
            let mut sessions = self.sessions();
            let key = session_key(
                &request.session_handle,
                request.create_worker_session_called,
            );
            let session = self.session_mut(&mut sessions, key)?;
            session.touch();
            let graph = session
                .graphs
                .get(&request.graph_handle)
                .cloned()
                .ok_or_else(|| unknown_graph(&request.graph_handle))?;
            session.steps.insert(step_id);
            graph
        };
        let rendezvous = self.inner.rendezvous.find_or_create(step_id);
        for named in &request.send {
            let fed = ParsedKey::parse(&named.name)
                .and_then(|key| Ok((key, Tensor::from_named_proto(named)?.1)))
                .map_err(|e| e.context(format!("RunGraph send `{}`", named.name)))?;
            rendezvous.send(&fed.0, fed.1, false)?;
        }
        let recv_keys = request
            .recv_key
            .iter()
            .map(|k| ParsedKey::parse(k).map_err(|e| e.context("RunGraph recv_key")))
            .collect::<Result<Vec<_>>>()?;
        let deadline = Instant::now() + budget;
        let exec_opts = request.exec_opts.unwrap_or_default();
        let stats = (exec_opts.record_timeline || exec_opts.record_costs)
            .then(|| Arc::new(StepStatsCollector::new()));
        let options = StepOptions {
            step_id,
            cancellation: Some(CancellationToken::new()),
            deadline: Some(deadline),
            rendezvous: Some(Arc::clone(&rendezvous)),
            remote_recv: self.inner.remote.get().cloned(),
            stats: stats.clone(),
        };
        run_executors(graph.executors(), options, &self.inner.towers).await?;
        if let Some(replica) = self.inner.replica.get() {
            replica.commit(step_id).await?;
        }
        let mut recv = Vec::with_capacity(recv_keys.len());
        let deadline = tokio::time::Instant::from_std(deadline);
        for key in recv_keys {
            let (tensor, _) = rendezvous.recv(&key, deadline).await?;
            // A fetch of a tensor in a GPU's memory is copied to the host here.
            let tensor = tensor.to_host()?;
            recv.push(NamedTensorProto {
                name: key.as_str().to_string(),
                tensor: Some(tensor.to_proto()),
            });
        }
        Ok(RunGraphResponse {
            recv,
            step_stats: stats.map(|s| s.finish()),
            partition_graph: if exec_opts.record_partition_graphs {
                graph.partition_graphs()
            } else {
                Vec::new()
            },
            ..Default::default()
        })
    }

    /// RecvTensor: checks the key's source device and incarnation against this task, then
    /// waits (at most `timeout`, else the configured one) for the value in the step's
    /// rendezvous, creating it if the step has not started here yet.
    pub async fn recv_tensor(
        &self,
        request: RecvTensorRequest,
        timeout: Option<Duration>,
    ) -> Result<RecvTensorResponse> {
        self.check_serving("RecvTensor")?;
        let key = ParsedKey::parse(&request.rendezvous_key)?;
        check_incarnation(
            &key,
            self.inner
                .devices
                .iter()
                .map(|d| (d.name.as_str(), d.incarnation)),
        )?;
        let rendezvous = self.inner.rendezvous.find_or_create(request.step_id);
        let wait = timeout.unwrap_or(self.inner.options.recv_timeout);
        let started = Instant::now();
        let received = rendezvous
            .recv(&key, tokio::time::Instant::now() + wait)
            .await;
        metrics::rendezvous_wait(&self.inner.task.device_prefix(), started.elapsed());
        let (tensor, is_dead) = received?;
        let send_start_micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        // A tensor in a GPU's memory crosses to the host here, on its way to the other task.
        let mut proto = tensor.to_host()?.to_proto_content();
        // TensorFlow leaves a scalar's empty shape out; so do we, byte for byte.
        if proto
            .tensor_shape
            .as_ref()
            .is_some_and(|s| s.dim.is_empty() && !s.unknown_rank)
        {
            proto.tensor_shape = None;
        }
        Ok(RecvTensorResponse {
            tensor: Some(proto),
            is_dead,
            send_start_micros,
            ..Default::default()
        })
    }

    /// CleanupGraph: removes and aborts the step's rendezvous; unknown ids are ignored.
    pub fn cleanup_graph(&self, request: &CleanupGraphRequest) -> Result<CleanupGraphResponse> {
        self.inner.rendezvous.cleanup(request.step_id);
        for session in self.sessions().values_mut() {
            session.steps.remove(&request.step_id);
        }
        Ok(CleanupGraphResponse {})
    }

    /// CleanupAll: clears the named resource containers (all when none is named) on every
    /// device, the sessions' isolated ones included.
    pub fn cleanup_all(&self, request: &CleanupAllRequest) -> Result<CleanupAllResponse> {
        for device in &self.inner.shared {
            device.resources().clear(&request.container);
        }
        for session in self.sessions().values() {
            for device in &session.devices {
                device.resources().clear(&request.container);
            }
        }
        Ok(CleanupAllResponse {})
    }

    /// GetStepSequence: the next step id of each collective graph key asked for. This task
    /// answers as the group leader, as a TensorFlow task with no other `collective_group_leader`
    /// configured does: a key it has not seen gets a random first id (the top 7 bits clear,
    /// which TensorFlow keeps for future use), and asking again answers the same id.
    pub fn get_step_sequence(
        &self,
        request: &GetStepSequenceRequest,
    ) -> Result<GetStepSequenceResponse> {
        /// TensorFlow's `kStepIdMask`: the low 57 bits.
        const STEP_ID_MASK: i64 = (1 << 57) - 1;
        let mut sequences = self
            .inner
            .step_sequences
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let step_sequence = request
            .graph_key
            .iter()
            .map(|&graph_key| StepSequence {
                graph_key,
                next_step_id: *sequences
                    .entry(graph_key)
                    .or_insert_with(|| rand::random::<i64>() & STEP_ID_MASK),
            })
            .collect();
        Ok(GetStepSequenceResponse { step_sequence })
    }

    /// Collects steps unused for longer than the step TTL and sessions whose master sent
    /// nothing for longer than the session TTL, as of `now`; returns what it removed.
    pub fn collect_stale(&self, now: Instant) -> Collected {
        let steps = self
            .inner
            .rendezvous
            .collect_stale(tokio::time::Instant::from_std(now));
        let ttl = self.inner.options.session_ttl;
        let removed: Vec<(String, WorkerSession)> = {
            let mut sessions = self.sessions();
            for session in sessions.values_mut() {
                for step_id in &steps {
                    session.steps.remove(step_id);
                }
            }
            let stale: Vec<String> = sessions
                .iter()
                .filter(|(h, s)| {
                    h.as_str() != LEGACY_SESSION && now.saturating_duration_since(s.last_used) > ttl
                })
                .map(|(h, _)| h.clone())
                .collect();
            stale
                .into_iter()
                .filter_map(|h| sessions.remove(&h).map(|s| (h, s)))
                .collect()
        };
        let mut handles = Vec::with_capacity(removed.len());
        for (handle, session) in removed {
            self.end_steps(&session, "its master sent nothing within the session TTL");
            handles.push(handle);
        }
        handles.sort();
        Collected {
            steps,
            sessions: handles,
        }
    }

    /// Aborts the live steps of a removed session.
    fn end_steps(&self, session: &WorkerSession, why: &str) {
        for &step_id in &session.steps {
            if let Some(rendezvous) = self.inner.rendezvous.find(step_id) {
                rendezvous.abort(Status::aborted(format!(
                    "step {step_id} aborted on {}: {why}",
                    self.inner.task
                )));
            }
            self.inner.rendezvous.cleanup(step_id);
        }
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<String, WorkerSession>> {
        self.inner
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The session `handle` in `sessions`, or ABORTED as TensorFlow answers for a handle this
    /// process never created (it probably restarted since).
    fn session_mut<'s>(
        &self,
        sessions: &'s mut HashMap<String, WorkerSession>,
        handle: &str,
    ) -> Result<&'s mut WorkerSession> {
        sessions.get_mut(handle).ok_or_else(|| {
            Status::aborted(format!(
                "Session handle is not found: {handle}. Possibly this worker (\"{}\") just \
                 restarted.",
                self.inner.task.device_prefix()
            ))
        })
    }
}

impl std::fmt::Debug for WorkerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerState")
            .field("task", &self.inner.task)
            .field("devices", &self.inner.devices.len())
            .field("steps", &self.inner.rendezvous.len())
            .finish()
    }
}

/// The session a request names: the legacy one unless the master created one.
fn session_key(handle: &str, create_worker_session_called: bool) -> &str {
    if create_worker_session_called {
        handle
    } else {
        LEGACY_SESSION
    }
}

/// TensorFlow's answer for a graph handle the worker does not know.
fn unknown_graph(handle: &str) -> Status {
    Status::aborted(format!(
        "Graph handle is not found: {handle}. Possibly, this worker just restarted."
    ))
}

/// A [`WorkerState`] that does not keep it alive: the own task's peer inside the cluster's
/// peer cache, which the worker holds (through its remote receive) and which would otherwise
/// own the state it belongs to. Once the worker is gone,
/// calls answer UNAVAILABLE.
#[derive(Clone)]
pub struct WeakWorkerState {
    inner: std::sync::Weak<Inner>,
    task: TaskId,
}

impl WorkerState {
    /// A handle that does not keep the state alive.
    pub fn downgrade(&self) -> WeakWorkerState {
        WeakWorkerState {
            inner: Arc::downgrade(&self.inner),
            task: self.inner.task.clone(),
        }
    }
}

impl WeakWorkerState {
    fn upgrade(&self) -> Result<WorkerState> {
        self.inner
            .upgrade()
            .map(|inner| WorkerState { inner })
            .ok_or_else(|| Status::unavailable(format!("the worker of {} has stopped", self.task)))
    }
}

/// Forwards each [`WorkerHandler`] method of [`WeakWorkerState`] to the live state.
macro_rules! forward_weak {
    ($($method:ident: $rpc:ident($req:ty) -> $resp:ty, $waits:literal, $doc:literal;)*) => {$(
        fn $method(&self, request: $req, timeout: Option<Duration>) -> HandlerFuture<'_, $resp> {
            Box::pin(async move {
                let state = self.upgrade()?;
                WorkerHandler::$method(&state, request, timeout).await
            })
        }
    )*};
}

impl WorkerHandler for WeakWorkerState {
    worker_rpcs!(forward_weak);
}

/// [`WorkerHandler`] on [`WorkerState`]: each call is the state's method of the same name,
/// a plain function of the request; the calls that wait get the caller's timeout.
macro_rules! worker_bodies {
    ($($method:ident: $rpc:ident($req:ty) -> $resp:ty, $waits:literal, $doc:literal;)*) => {$(
        fn $method(&self, request: $req, timeout: Option<Duration>) -> HandlerFuture<'_, $resp> {
            worker_body!($method, self, request, timeout)
        }
    )*};
}

macro_rules! worker_body {
    (run_graph, $state:ident, $request:ident, $timeout:ident) => {
        Box::pin($state.run_graph_within($request, $timeout))
    };
    (recv_tensor, $state:ident, $request:ident, $timeout:ident) => {
        Box::pin(WorkerState::recv_tensor($state, $request, $timeout))
    };
    ($method:ident, $state:ident, $request:ident, $timeout:ident) => {{
        let _ = $timeout;
        Box::pin(std::future::ready(WorkerState::$method($state, &$request)))
    }};
}

impl WorkerHandler for WorkerState {
    worker_rpcs!(worker_bodies);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str, incarnation: u64) -> DeviceAttributes {
        DeviceAttributes {
            name: name.into(),
            device_type: "CPU".into(),
            incarnation,
            ..Default::default()
        }
    }

    #[test]
    fn get_status_reports_every_device_in_order() {
        let devices = vec![
            device("/job:ps/replica:0/task:0/device:CPU:0", 11),
            device("/job:ps/replica:0/task:0/device:CPU:1", 12),
        ];
        let worker = WorkerState::new(TaskId::new("ps", 0), devices.clone());
        let status = worker.get_status(&GetStatusRequest {}).unwrap();
        assert_eq!(status.device_attributes, devices);
        assert_eq!(worker.task().to_string(), "/job:ps/task:0");
    }

    #[test]
    fn get_status_is_stable_across_calls() {
        // A changed incarnation means "the task restarted" to peers: it must not drift.
        let worker = WorkerState::new(
            TaskId::new("ps", 0),
            vec![device("/job:ps/replica:0/task:0/device:CPU:0", 99)],
        );
        let a = worker.get_status(&GetStatusRequest {}).unwrap();
        let b = worker.get_status(&GetStatusRequest {}).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn cpu0_uses_the_shard_store_and_other_devices_their_own() {
        let shard = Arc::new(ResourceMgr::new());
        let worker = WorkerState::with_options(
            TaskId::new("ps", 0),
            vec![
                device("/job:ps/replica:0/task:0/device:CPU:0", 1),
                device("/job:ps/replica:0/task:0/device:CPU:1", 2),
            ],
            Some(Arc::clone(&shard)),
            WorkerOptions::default(),
        );
        let cpu0 = worker
            .resources_of("/job:ps/replica:0/task:0/device:CPU:0")
            .unwrap();
        let cpu1 = worker
            .resources_of("/job:ps/replica:0/task:0/device:CPU:1")
            .unwrap();
        assert!(Arc::ptr_eq(&cpu0, &shard));
        assert!(!Arc::ptr_eq(&cpu1, &shard));
    }

    #[test]
    fn a_new_master_incarnation_retires_the_old_sessions() {
        let worker = WorkerState::new(
            TaskId::new("ps", 0),
            vec![device("/job:ps/replica:0/task:0/device:CPU:0", 1)],
        );
        let create = |handle: &str, incarnation: i64| CreateWorkerSessionRequest {
            session_handle: handle.into(),
            master_task: "/job:worker/replica:0/task:0".into(),
            master_incarnation: incarnation,
            ..Default::default()
        };
        worker.create_worker_session(&create("a", 7)).unwrap();
        worker.create_worker_session(&create("b", 7)).unwrap();
        assert!(worker.graph_count("a").is_some());
        worker.create_worker_session(&create("c", 8)).unwrap();
        assert!(worker.graph_count("a").is_none());
        assert!(worker.graph_count("b").is_none());
        assert_eq!(worker.graph_count("c"), Some(0));
        // The legacy session is never retired.
        assert_eq!(worker.graph_count(LEGACY_SESSION), Some(0));
        let again = worker.create_worker_session(&create("c", 8)).unwrap_err();
        assert_eq!(again.code(), crate::Code::AlreadyExists);
    }

    #[test]
    fn step_sequences_start_at_random_ids_and_answer_the_same_again() {
        let task = TaskId::new("worker", 0);
        let state = WorkerState::new(
            task,
            vec![device("/job:worker/replica:0/task:0/device:CPU:0", 1)],
        );
        let ask = |keys: &[i64]| {
            state
                .get_step_sequence(&GetStepSequenceRequest {
                    graph_key: keys.to_vec(),
                })
                .unwrap()
                .step_sequence
        };
        let first = ask(&[7, 9]);
        let keys: Vec<i64> = first.iter().map(|s| s.graph_key).collect();
        assert_eq!(keys, [7, 9]);
        for sequence in &first {
            assert!(
                (0..1 << 57).contains(&sequence.next_step_id),
                "{sequence:?} uses TensorFlow's reserved top bits"
            );
        }
        assert_ne!(first[0].next_step_id, first[1].next_step_id);
        // Asked again, in another order and with a new key: the same ids for the known keys.
        let again = ask(&[9, 7, 11]);
        assert_eq!(again[0], first[1]);
        assert_eq!(again[1], first[0]);
        assert_eq!(again[2].graph_key, 11);
    }
}
