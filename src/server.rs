//! `Server`: one task's daemon, wired together. Nothing here holds logic.
//!
//! ```text
//!  thread tessera-grpc (tokio)             thread tessera-actors (actix System)
//!  tonic: MasterService ── Recipient ────► Master ──► MasterSession ×N
//!                                             │ Peer (own task: LocalPeer)
//!         WorkerService ─┐                    ▼
//!  tensor channel ───────┴──────────────► WorkerState (the worker's service, called directly)
//!         grpc.health.v1                     │ each device's part of a step
//!                                            ▼
//!                                         Tower ×N (own arbiters, own pools), VariableShard ×N
//!                                         Worker (owns them; collects stale steps, sessions)
//! ```
//!
//! With `[tls]` in the task's config the port serves TLS only (mutual TLS unless
//! `require_client_cert = false`), and with a cluster token MasterService and WorkerService sit
//! behind the token check ([`crate::security`]); grpc.health.v1 stays open to probes. The
//! task's peers are dialled with the same settings.
//!
//! The port also serves the tensor channel ([`crate::wire::channel`]): the accept loop reads
//! each connection's first bytes and keeps tensor-channel connections for itself (unless the
//! port serves TLS), handing all others to tonic.
//!
//! The gRPC runtime and the actor system run on separate threads: a MasterService handler only
//! awaits a mailbox; a WorkerService handler calls the worker's service, whose waiting calls
//! (RunGraph, RecvTensor) run their kernels on the executor pool and never block tonic's
//! runtime. Each tower has its own arbiter thread. The daemon injects what lower layers cannot
//! reach themselves: the cluster's peers into the master, and the peers' `RemoteFetcher` into
//! the worker, as its remote receive.
//!
//! Lifecycle: [`Server::start`] binds the port (before returning, so the caller can announce
//! it; [`Server::start_with_listener`] takes a socket already bound), builds the devices,
//! starts the actors and then the tonic server. [`Server::stop`]
//! stops accepting, lets in-flight calls finish within `timeouts.shutdown_grace`, then stops
//! the actors. Unlike TensorFlow's server, stop works and `join` returns once stopped.
//!
//! Operations: with `[metrics] listen` set, the Prometheus endpoint is bound at start (its
//! address is [`Server::metrics_addr`]) and served on the gRPC runtime; every RPC passes the
//! counting [`RpcLayer`]; `[limits]` go to tonic (message size), the master, the worker's front
//! and the variable shards' stores.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use actix::{Actor, Addr, Arbiter, Recipient};
use tokio::sync::watch;
use tonic::server::NamedService;
use tracing::{info, warn};

use crate::cluster::{Limits, TaskConfig, TaskId};
use crate::device;
use crate::device::host_pool::{self, HOST_POOL};
use crate::device::memory::MemoryBudget;
use crate::error::mailbox_failure;
use crate::error::{Result, Status};
use crate::format::files::{Files, ALLOWED_DIRS_KEY, DATA_ALLOWED_DIRS_KEY};
use crate::master::grpc::MasterGrpc;
use crate::master::local::{self, LocalMaster};
use crate::master::{ListDevices, Master, MasterState};
use crate::ops::metrics::{
    self, DEVICE_MEMORY_BYTES, DEVICE_MEMORY_LIMIT_BYTES, DEVICE_MEMORY_PEAK_BYTES,
    HOST_POOL_KEPT_BYTES,
};
use crate::ops::rpc_layer::RpcLayer;
use crate::peer::failover::replica_client;
use crate::peer::{LocalPeer, PeerCache, RemoteFetcher};
use crate::proto::master_service_server::MasterServiceServer;
use crate::proto::replica::replica_service_server::ReplicaServiceServer;
use crate::proto::worker_service_server::WorkerServiceServer;
use crate::proto::{DeviceAttributes, ListDevicesRequest};
use crate::runtime::intra::IntraPool;
use crate::security::Security;
use crate::shard::replica::{ReplicaGrpc, ReplicaState};
use crate::shard::{GetResources, ShardState, VariableShard};
use crate::tower::Tower;
use crate::wire::channel::{self, ChannelConfig};
use crate::wire::{tune_server, WorkerServer, MAX_MESSAGE_BYTES};
use crate::worker::grpc::WorkerGrpc;
use crate::worker::{Worker, WorkerHandler, WorkerOptions, WorkerState};

/// The longest a primary waits for its standby to store a batch before acknowledging the
/// step alone (a standby that does not answer is taken for dead).
const REPLICATE_DEADLINE: Duration = Duration::from_secs(10);

/// How long `start` waits for the actor system to come up before giving up.
const ACTORS_START_DEADLINE: Duration = Duration::from_secs(30);

/// A running task: its gRPC port and its actors.
pub struct Server {
    task: TaskId,
    local_addr: SocketAddr,
    /// Where the metrics endpoint listens, when `[metrics]` is set.
    metrics_addr: Option<SocketAddr>,
    /// The master's ListDevices: answering it takes the master actor and the worker.
    probe: Recipient<ListDevices>,
    /// Whether the port speaks TLS (for the target's scheme).
    tls: bool,
    grace: Duration,
    /// Set to true to stop accepting calls.
    shutdown: watch::Sender<bool>,
    /// The gRPC thread; it stops the actors on its way out.
    grpc_thread: Mutex<Option<JoinHandle<()>>>,
    /// The master's place among this process's in-process masters, until the task stops.
    in_process: Mutex<Option<local::Registration>>,
    startup: Startup,
    stopped: Arc<Stopped>,
}

/// Where a task's start went, phase by phase (logged with "serving", and
/// [`Server::startup`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Startup {
    /// Finding the devices (the GPU probe included).
    pub devices: Duration,
    /// The metrics endpoint, TLS settings and checkpoint confinement.
    pub setup: Duration,
    /// The actor thread: a tower per device, a variable shard per device, the worker and the
    /// master, until their mailboxes are ready.
    pub actors: Duration,
    /// The gRPC thread: its runtime, the services and the tensor channel, until calls are
    /// accepted.
    pub grpc: Duration,
}

/// The running actors: their system, its thread and the mailboxes the gRPC front needs.
type Actors = (actix::System, JoinHandle<()>, Mailboxes);

/// What the gRPC front forwards to.
struct Mailboxes {
    master: MasterGrpc,
    /// The worker's service, which the WorkerService front and the tensor channel answer with.
    worker: Arc<dyn WorkerHandler>,
    /// Keeps the worker actor (its towers, shard store and collection timer) running as long
    /// as the front serves.
    _worker_actor: Addr<Worker>,
    /// The master's ListDevices, which [`Server::probe`] asks.
    probe: Recipient<ListDevices>,
    /// This ps task's side of its pair of daemons, when it has a standby.
    replica: Option<Arc<ReplicaState>>,
}

/// What the gRPC thread serves besides the services: the task's label and limits, and the
/// metrics endpoint's socket when metrics are on.
struct Operations {
    task: String,
    limits: Limits,
    metrics: Option<TcpListener>,
    /// How long in-flight calls may finish once the server stops.
    grace: Duration,
}

/// A flag that turns true once, with a way to wait for it.
#[derive(Default)]
struct Stopped {
    flag: Mutex<bool>,
    changed: Condvar,
}

impl Stopped {
    fn set(&self) {
        *self.flag.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.changed.notify_all();
    }

    /// Waits until set; `false` when `deadline` passed first (`None` waits as long as it takes).
    fn wait(&self, deadline: Option<Duration>) -> bool {
        let flag = self.flag.lock().unwrap_or_else(|p| p.into_inner());
        match deadline {
            None => *self
                .changed
                .wait_while(flag, |f| !*f)
                .unwrap_or_else(|p| p.into_inner()),
            Some(d) => {
                let (flag, _) = self
                    .changed
                    .wait_timeout_while(flag, d, |f| !*f)
                    .unwrap_or_else(|p| p.into_inner());
                *flag
            }
        }
    }
}

impl Server {
    /// Starts the task described by `config`: binds `config.listen` (port 0 lets the OS pick),
    /// creates the devices, starts the actors and serves gRPC. Returns once calls are accepted.
    pub fn start(config: TaskConfig) -> Result<Server> {
        let listener = TcpListener::bind(config.listen).map_err(|e| {
            Status::unavailable(format!(
                "{}: cannot listen on {}: {e}; free the port or change `listen`",
                config.task, config.listen
            ))
        })?;
        Server::start_with_listener(config, listener)
    }

    /// Starts the task on a socket that is already bound and listening (handed over by a test
    /// harness that picked the port, or by systemd socket activation); `config.listen` is
    /// ignored. Returns once calls are accepted.
    pub fn start_with_listener(config: TaskConfig, listener: TcpListener) -> Result<Server> {
        let began = Instant::now();
        let devices = device::discover(&config.task, &config.devices)?;
        let devices_found = Instant::now();
        let local_addr = listener.local_addr().map_err(|e| {
            Status::internal(format!(
                "{}: cannot read the listener's bound address: {e}",
                config.task
            ))
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Status::internal(format!("cannot make {local_addr} non-blocking: {e}")))?;
        let label = config.task.device_prefix();
        let metrics_listener = match config.metrics.listen {
            Some(addr) => {
                metrics::install();
                Some(metrics::bind(&label, addr)?)
            }
            None => None,
        };
        let metrics_addr = match &metrics_listener {
            Some(listener) => Some(listener.local_addr().map_err(|e| {
                Status::internal(format!("{label}: cannot read the metrics address: {e}"))
            })?),
            None => None,
        };
        let operations = Operations {
            task: label,
            limits: config.limits.clone(),
            metrics: metrics_listener,
            grace: config.timeouts.shutdown_grace,
        };

        // TLS settings are checked before any thread starts, so a bad one leaves nothing behind.
        let guards = Guards::new(&config)?;
        let files = match &config.checkpoints.allowed_dirs {
            Some(dirs) => {
                let files =
                    Files::confined(dirs).map_err(|e| e.context(config.task.to_string()))?;
                match &config.checkpoints.widen_hint {
                    Some(how) => files.widened_by(format!("on {}, {how}", config.task)),
                    None => files,
                }
            }
            None => Files::ambient(),
        };
        let data_files = data_files(&config)?;
        let prepared = Instant::now();
        let (shutdown, shutdown_rx) = watch::channel(false);
        let stopped = Arc::new(Stopped::default());
        let (ready_tx, ready_rx) = mpsc::channel();
        let grace = config.timeouts.shutdown_grace;
        let tls = config.security.is_tls();
        // The gRPC thread builds its runtime while the actors start, then serves their
        // mailboxes; it stops the actors on its way out.
        let (actors_tx, actors_rx) = mpsc::channel::<Actors>();
        let grpc_thread = {
            let stopped = Arc::clone(&stopped);
            let task = config.task.clone();
            thread::Builder::new()
                .name("tessera-grpc".into())
                .spawn(move || {
                    let runtime = grpc_runtime();
                    // No actors: they failed to start, and `start` returns that error.
                    let Ok((system, actors_thread, mailboxes)) = actors_rx.recv() else {
                        return;
                    };
                    let result = runtime.and_then(|runtime| {
                        run_grpc(
                            runtime,
                            listener,
                            mailboxes,
                            operations,
                            guards,
                            shutdown_rx,
                            &ready_tx,
                        )
                    });
                    if let Err(e) = result {
                        let _ = ready_tx.send(Err(e.clone()));
                        warn!(task = %task, error = %e, "grpc server failed");
                    }
                    system.stop();
                    if actors_thread.join().is_err() {
                        warn!(task = %task, "actor system panicked");
                    }
                    stopped.set();
                })
                .map_err(|e| Status::internal(format!("cannot spawn the grpc thread: {e}")))?
        };
        let actors = match start_actors(&config, devices, files, data_files) {
            Ok(actors) => actors,
            Err(e) => {
                drop(actors_tx);
                let _ = grpc_thread.join();
                return Err(e);
            }
        };
        let actors_started = Instant::now();
        let mailboxes = &actors.2;
        let probe = mailboxes.probe.clone();
        let in_process = LocalMaster::new(mailboxes.master.mailboxes().clone(), &config.security);
        // The thread waits on the other end until it has them.
        let _ = actors_tx.send(actors);
        match ready_rx.recv_timeout(ACTORS_START_DEADLINE) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(Status::internal(format!(
                    "{}: grpc server did not start within {ACTORS_START_DEADLINE:?}",
                    config.task
                )))
            }
        }
        let startup = Startup {
            devices: devices_found - began,
            setup: prepared - devices_found,
            actors: actors_started - prepared,
            grpc: actors_started.elapsed(),
        };
        info!(
            task = %config.task,
            addr = %local_addr,
            tls = tls,
            mutual_tls = config.security.tls.as_ref().is_some_and(|t| t.requires_client_cert()),
            token = config.security.token.is_some(),
            startup = ?startup,
            "serving"
        );
        if let Some(warning) = exposure_warning(&config, local_addr) {
            warn!(task = %config.task, "{warning}");
        }
        if let Some(addr) = metrics_addr {
            info!(task = %config.task, url = %format!("http://{addr}/metrics"), "serving metrics");
        }
        let advertised = match &config.standbys.own {
            Some(pair) => Some(pair.own.as_str()),
            None => config
                .cluster
                .task_address(&config.task.job, config.task.index)
                .ok(),
        };
        let in_process = local::register(in_process, local::addresses(local_addr, advertised));
        Ok(Server {
            task: config.task,
            local_addr,
            tls,
            metrics_addr,
            probe,
            grace,
            shutdown,
            grpc_thread: Mutex::new(Some(grpc_thread)),
            in_process: Mutex::new(Some(in_process)),
            startup,
            stopped,
        })
    }

    /// Starts a one-task server (`/job:localhost/task:0`) on an OS-chosen port of 127.0.0.1.
    pub fn local() -> Result<Server> {
        Server::start(TaskConfig::local())
    }

    /// How long each phase of this task's start took.
    pub fn startup(&self) -> Startup {
        self.startup
    }

    /// Returns the task this server runs.
    pub fn task(&self) -> &TaskId {
        &self.task
    }

    /// Returns the address the gRPC server is bound to (with the OS-chosen port).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Returns the address the metrics endpoint is bound to (with the OS-chosen port), or
    /// `None` when `[metrics]` is not set.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Checks the task still answers: the master actor lists the devices, which takes the
    /// worker too. Fails when no answer comes within `deadline` (a wedged actor, a stopping
    /// task). `tessera serve` asks before each systemd watchdog ping, so a daemon that stopped
    /// answering is restarted instead of pinging on.
    pub async fn probe(&self, deadline: Duration) -> Result<()> {
        let asked = self.probe.send(ListDevices(ListDevicesRequest::default()));
        match tokio::time::timeout(deadline, asked).await {
            Ok(Ok(Ok(_))) => Ok(()),
            Ok(Ok(Err(e))) => Err(e.context(format!("{}: probe", self.task))),
            Ok(Err(_)) => Err(Status::unavailable(format!(
                "{}: probe: the actors are stopping",
                self.task
            ))),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "{}: probe: the master did not answer within {deadline:?}",
                self.task
            ))),
        }
    }

    /// Returns the target clients pass to a session: `grpc://localhost:PORT`, as TensorFlow's
    /// `server.target` (always localhost, whatever the cluster file lists); `grpcs://` when the
    /// task serves TLS.
    pub fn target(&self) -> String {
        let scheme = if self.tls { "grpcs" } else { "grpc" };
        format!("{scheme}://localhost:{}", self.local_addr.port())
    }

    /// Waits until the server has stopped (by [`Server::stop`] from another thread, or a
    /// fatal gRPC error).
    pub fn join(&self) {
        self.stopped.wait(None);
    }

    /// Stops accepting calls, lets in-flight calls finish within `timeouts.shutdown_grace`,
    /// then stops the actors. Calling it again does nothing.
    pub fn stop(&self) {
        // New sessions of this process go over gRPC from here on, and meet the stopping front.
        drop(
            self.in_process
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        let _ = self.shutdown.send(true);
        // The gRPC thread enforces the grace itself; the extra second covers stopping actors.
        if !self.stopped.wait(Some(self.grace + Duration::from_secs(1))) {
            warn!(task = %self.task, grace = ?self.grace, "server did not stop within the grace");
            return;
        }
        let thread = self
            .grpc_thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(thread) = thread {
            let _ = thread.join();
            info!(task = %self.task, "stopped");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts the actor system on its own thread: one tower per device (each on its own arbiter),
/// the variable shard, the worker and the master. Returns the system, its thread and the
/// mailboxes the gRPC front needs.
fn start_actors(
    config: &TaskConfig,
    devices: Vec<DeviceAttributes>,
    files: Files,
    data_files: Files,
) -> Result<Actors> {
    let task = config.task.clone();
    let master_state = MasterState::with_cluster(
        task.clone(),
        config.cluster.clone(),
        config.timeouts.clone(),
        config.devices.soft_placement,
    )
    .with_limits(config.limits.clone());
    let limits = config.limits.clone();
    let cpu_memory_limit = config.devices.cpu_memory_budget();
    HOST_POOL.set_capacity(host_pool_capacity(cpu_memory_limit));
    host_pool::start_releasing_idle();
    let intra_op_threads = config.devices.intra_op_threads();
    let timeouts = config.timeouts.clone();
    let security = config.security.clone();
    let standbys = config.standbys.clone();
    let (tx, rx) = mpsc::channel();
    let thread = thread::Builder::new()
        .name("tessera-actors".into())
        .spawn(move || {
            let system = actix::System::new();
            let arbiters = system.block_on(async move {
                let mut arbiters = Vec::new();
                let mut towers = Vec::new();
                let mut tower_handles = Vec::new();
                // One intra-op pool for the task's devices, as TensorFlow sizes one per
                // server from intra_op_parallelism_threads.
                let intra = IntraPool::new("tessera-intra", intra_op_threads);
                for device in &devices {
                    let arbiter = Arbiter::new();
                    let (tower, handle) =
                        Tower::start_on(&arbiter.handle(), device.clone(), Arc::clone(&intra));
                    towers.push(tower);
                    tower_handles.push(handle);
                    arbiters.push(arbiter);
                }
                // One variable shard per device; the ps variables live on the task's CPU:0, as
                // TensorFlow places them.
                let mut shards = HashMap::new();
                for device in &devices {
                    let shard = VariableShard::new(device.name.clone())
                        .reporting_for(task.device_prefix())
                        .start();
                    let resources = match shard.send(GetResources).await {
                        Ok(resources) => resources,
                        Err(e) => {
                            let what = format!("the variable shard of {}", device.name);
                            let _ = tx.send(Err(mailbox_failure(e, &what)));
                            return arbiters;
                        }
                    };
                    resources.set_max_var_bytes(limits.max_shard_bytes);
                    shards.insert(device.name.clone(), resources);
                }
                let state = WorkerState::with_towers(
                    task.clone(),
                    devices,
                    shards.clone(),
                    WorkerOptions {
                        max_sessions: limits.max_sessions,
                        files,
                        data_files,
                        cpu_memory_limit: Some(cpu_memory_limit),
                        ..WorkerOptions::from_timeouts(&timeouts)
                    },
                    tower_handles,
                );
                // The worker pulls tensors from other tasks through the cluster's peers, and
                // the master drives them through the same ones; the own task is the worker's
                // logic itself, and a weak handle keeps the state from owning itself through
                // its cache.
                let local = Arc::new(LocalPeer::new(task.clone(), Arc::new(state.downgrade())));
                let replica = match &standbys.own {
                    Some(pair) => {
                        let incarnation = devices_incarnation(&state);
                        let stores = shards
                            .iter()
                            .map(|(d, s)| ShardState::over(d.clone(), Arc::clone(s)))
                            .collect();
                        match replica_client(&pair.partner, timeouts.connect, &security) {
                            Ok(partner) => {
                                let replica = ReplicaState::new(
                                    pair.clone(),
                                    incarnation,
                                    stores,
                                    partner,
                                    timeouts.rpc.min(REPLICATE_DEADLINE),
                                );
                                let replica = Arc::new(replica);
                                state.set_replica(Arc::clone(&replica));
                                Some(replica)
                            }
                            Err(e) => {
                                let _ = tx.send(Err(e));
                                return arbiters;
                            }
                        }
                    }
                    None => None,
                };
                let cluster = master_state.cluster().clone();
                let peers = match PeerCache::with_standbys(
                    cluster,
                    local,
                    &timeouts,
                    security,
                    standbys.addresses.clone(),
                ) {
                    Ok(peers) => Arc::new(peers),
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return arbiters;
                    }
                };
                state.set_remote(Arc::new(RemoteFetcher::new(
                    task.clone(),
                    Arc::clone(&peers),
                    limits.max_message_bytes,
                )));
                collect_memory(&task, state.memory_budgets());
                let service: Arc<dyn WorkerHandler> = Arc::new(state.clone());
                let worker = Worker::new(state, towers, shards.into_values().collect()).start();
                let master = Master::new(master_state, peers).start();
                let mailboxes = Mailboxes {
                    probe: master.clone().recipient(),
                    master: MasterGrpc::new(&master).with_task(task.device_prefix()),
                    worker: service,
                    _worker_actor: worker,
                    replica,
                };
                let _ = tx.send(Ok((actix::System::current(), mailboxes)));
                arbiters
            });
            if let Err(e) = system.run() {
                warn!(error = %e, "actor system stopped with an error");
            }
            for arbiter in arbiters {
                arbiter.stop();
                let _ = arbiter.join();
            }
        })
        .map_err(|e| Status::internal(format!("cannot spawn the actor thread: {e}")))?;
    match rx.recv_timeout(ACTORS_START_DEADLINE) {
        Ok(Ok((system, mailboxes))) => Ok((system, thread, mailboxes)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Status::internal(format!(
            "actors did not start within {ACTORS_START_DEADLINE:?}"
        ))),
    }
}

/// A number that differs in each life of the task: its first device's incarnation.
fn devices_incarnation(state: &WorkerState) -> u64 {
    state
        .get_status(&crate::proto::GetStatusRequest {})
        .ok()
        .and_then(|status| status.device_attributes.first().map(|d| d.incarnation))
        .unwrap_or_else(rand::random)
}

/// Where the task's input kernels may read: [`DataConfig::read_dirs`](crate::cluster::DataConfig::read_dirs)
/// of its config, a refusal naming `data.allowed_dirs` and how to allow another directory.
fn data_files(config: &TaskConfig) -> Result<Files> {
    let Some(dirs) = config.data.read_dirs(&config.checkpoints) else {
        return Ok(Files::ambient());
    };
    let files = Files::confined_as(DATA_ALLOWED_DIRS_KEY, &dirs)
        .map_err(|e| e.context(config.task.to_string()))?;
    Ok(match (&config.data.widen_hint, &config.data.allowed_dirs) {
        (Some(how), _) => files.widened_by(format!("on {}, {how}", config.task)),
        // Only [checkpoints] is set: reads stay under its directories until [data] says more.
        (None, None) => files.widened_by(format!(
            "add this one to [data] allowed_dirs in the task's cluster file ({DATA_ALLOWED_DIRS_KEY} \
             is unset, so reads are confined to {ALLOWED_DIRS_KEY})"
        )),
        (None, Some(_)) => files,
    })
}

/// What to warn about at start when a task serving any client's checkpoint paths is reachable
/// beyond loopback by anyone: no `[checkpoints] allowed_dirs`, no TLS and no token.
fn exposure_warning(config: &TaskConfig, listening: SocketAddr) -> Option<String> {
    let open = config.checkpoints.allowed_dirs.is_none()
        && !listening.ip().is_loopback()
        && !config.security.is_tls()
        && config.security.token.is_none();
    open.then(|| {
        format!(
            "listening on {listening} beyond loopback with neither TLS nor a token, and \
             {ALLOWED_DIRS_KEY} unset: any client that reaches this port can save, restore and \
             merge checkpoints at any path this user can read or write; set [checkpoints] \
             allowed_dirs, [tls] or [auth] token_file in the cluster file"
        )
    })
}

/// What the host pool may keep of freed large buffers: an eighth of the CPU memory budget, at
/// most 1 GiB (the pool's own default on a host with 8 GiB or more).
fn host_pool_capacity(cpu_memory_limit: u64) -> usize {
    usize::try_from(cpu_memory_limit / 8)
        .unwrap_or(usize::MAX)
        .min(1 << 30)
}

/// Sets each device's memory gauges (held, peak, limit) and the host pool's at every scrape,
/// for as long as its budget lives.
fn collect_memory(task: &TaskId, budgets: Vec<Arc<MemoryBudget>>) {
    let task = task.device_prefix();
    let pool_task = task.clone();
    metrics::register_collector(Box::new(move || {
        ::metrics::gauge!(HOST_POOL_KEPT_BYTES, "task" => pool_task.clone())
            .set(HOST_POOL.stats().kept_bytes as f64);
        true
    }));
    for budget in budgets {
        let budget = Arc::downgrade(&budget);
        let task = task.clone();
        metrics::register_collector(Box::new(move || {
            let Some(budget) = budget.upgrade() else {
                return false;
            };
            let labels = [
                ("task", task.clone()),
                ("device", budget.device().to_owned()),
            ];
            ::metrics::gauge!(DEVICE_MEMORY_BYTES, &labels).set(budget.held() as f64);
            ::metrics::gauge!(DEVICE_MEMORY_PEAK_BYTES, &labels).set(budget.peak() as f64);
            ::metrics::gauge!(DEVICE_MEMORY_LIMIT_BYTES, &labels).set(budget.limit() as f64);
            true
        }));
    }
}

/// The server's half of [`Security`]: TLS on the port and the token check on the services.
struct Guards {
    security: Security,
    /// A tonic server builder, with TLS on when configured.
    builder: tonic::transport::Server,
}

impl Guards {
    /// Builds the TLS acceptor up front, so a bad setting fails `start` rather than the gRPC
    /// thread. A TLS handshake gets the task's connect timeout: a caller that opens a
    /// connection and says nothing cannot hold it longer than a dial may take.
    fn new(config: &TaskConfig) -> Result<Self> {
        let mut builder = tonic::transport::Server::builder();
        let tls = config
            .security
            .server_tls(config.timeouts.connect)
            .map_err(|e| e.context(format_args!("{}", config.task)))?;
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).map_err(|e| {
                Status::invalid_argument(format!(
                    "{}: cannot serve TLS: {}; check the [tls] files",
                    config.task,
                    crate::error::error_chain(&e)
                ))
            })?;
        }
        Ok(Self {
            security: config.security.clone(),
            builder,
        })
    }
}

/// The runtime the gRPC server and the tensor channel run on.
fn grpc_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tessera-grpc")
        .enable_all()
        .build()
        .map_err(|e| Status::internal(format!("cannot build the grpc runtime: {e}")))
}

/// Runs the tonic server on `runtime` until `shutdown` turns true, then gives in-flight
/// calls the operations' grace to finish. Reports on `ready` once the server accepts calls.
fn run_grpc(
    runtime: tokio::runtime::Runtime,
    listener: TcpListener,
    mailboxes: Mailboxes,
    operations: Operations,
    guards: Guards,
    mut shutdown: watch::Receiver<bool>,
    ready: &mpsc::Sender<Result<()>>,
) -> Result<()> {
    let result = runtime.block_on(async move {
        // A failure before serving reaches `start` through the gRPC thread, which reports
        // every error of this function on `ready`.
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| Status::internal(format!("cannot register the listener: {e}")))?;
        let Operations {
            task,
            limits,
            metrics: metrics_listener,
            grace,
        } = operations;
        if let Some(listener) = metrics_listener {
            tokio::spawn(metrics::serve(listener, shutdown.clone()));
        }
        // Requests are held to the configured size; answers may be as large as protobuf allows
        // (a client asked for them).
        let max_request = limits.max_message_bytes;
        let master = MasterServiceServer::new(mailboxes.master)
            .max_decoding_message_size(max_request)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let worker_front =
            Arc::new(WorkerGrpc::new(mailboxes.worker).with_limits(task.clone(), limits));
        // The port serves the tensor channel beside gRPC (crate::wire::channel): its
        // connections are told apart by their first bytes, the others go to tonic.
        let incoming = channel::incoming(
            listener,
            Arc::clone(&worker_front),
            ChannelConfig {
                serve: !guards.security.is_tls(),
                token: guards.security.token.clone(),
                task: task.clone(),
            },
            shutdown.clone(),
        );
        // RecvTensor answers share the tensor's buffer (crate::wire); the rest is tonic's.
        let worker = WorkerServer::from_arc(worker_front).max_decoding_message_size(max_request);
        // The token check guards the two services; health stays open to probes.
        let master = guards.security.guard(master);
        let worker = guards.security.guard(worker);
        let (health, health_service) = tonic_health::server::health_reporter();
        for name in ["", MASTER_SERVICE, WORKER_SERVICE] {
            health.set_service_status(name, tonic_health::ServingStatus::Serving).await;
        }
        let mut stop_signal = shutdown.clone();
        // A ps task's pair speaks ReplicaService; other tasks do not serve it.
        let replica = mailboxes.replica.map(|replica| {
            let service = ReplicaServiceServer::new(ReplicaGrpc(Arc::clone(&replica)))
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
            (replica, guards.security.guard(service))
        });
        let (replica, replica_service) = match replica {
            Some((replica, service)) => (Some(replica), Some(service)),
            None => (None, None),
        };
        let serve = tune_server(guards.builder)
            .layer(RpcLayer::new(task, max_request))
            .add_service(health_service)
            .add_service(master)
            .add_service(worker)
            .add_optional_service(replica_service)
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stop_signal.wait_for(|stop| *stop).await;
            });
        let mut serving = tokio::spawn(serve);
        // Serving first: the partner may be asking this daemon the same question.
        if let Some(replica) = replica {
            tokio::spawn(async move { replica.join().await });
        }
        let _ = ready.send(Ok(()));
        tokio::select! {
            finished = &mut serving => return flatten(finished),
            _ = shutdown.wait_for(|stop| *stop) => {}
        }
        for name in ["", MASTER_SERVICE, WORKER_SERVICE] {
            health.set_service_status(name, tonic_health::ServingStatus::NotServing).await;
        }
        match tokio::time::timeout(grace, &mut serving).await {
            Ok(finished) => flatten(finished),
            Err(_) => {
                warn!(grace = ?grace, "in-flight calls still running after the grace, dropping them");
                serving.abort();
                Ok(())
            }
        }
    });
    // Tasks left behind (aborted calls) get a moment to unwind, not more.
    runtime.shutdown_timeout(Duration::from_millis(200));
    result
}

const MASTER_SERVICE: &str = <MasterServiceServer<MasterGrpc> as NamedService>::NAME;
const WORKER_SERVICE: &str = <WorkerServiceServer<WorkerGrpc> as NamedService>::NAME;

/// Folds the serve task's join result and tonic's own result into one.
fn flatten(
    finished: std::result::Result<
        std::result::Result<(), tonic::transport::Error>,
        tokio::task::JoinError,
    >,
) -> Result<()> {
    match finished {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(Status::unavailable(format!("grpc server stopped: {e}"))),
        Err(e) => Err(Status::internal(format!("grpc server task failed: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::proto::master_service_client::MasterServiceClient;
    use crate::proto::worker_service_client::WorkerServiceClient;
    use crate::proto::{GetStatusRequest, ListDevicesRequest, RunStepRequest};

    async fn channel(server: &Server) -> tonic::transport::Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", server.local_addr()))
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .unwrap()
    }

    #[test]
    fn a_task_open_to_the_network_with_any_checkpoint_path_warns_naming_the_key() {
        let everywhere: SocketAddr = "0.0.0.0:2222".parse().unwrap();
        let config = TaskConfig::local();
        let warning = exposure_warning(&config, everywhere).unwrap();
        assert!(warning.contains(ALLOWED_DIRS_KEY), "{warning}");
        assert!(warning.contains("0.0.0.0:2222"), "{warning}");
        // Loopback, a token or allowed directories each silence it.
        assert!(exposure_warning(&config, "127.0.0.1:2222".parse().unwrap()).is_none());
        let mut confined = TaskConfig::local();
        confined.checkpoints.allowed_dirs = Some(vec![]);
        assert!(exposure_warning(&confined, everywhere).is_none());
        let mut token = TaskConfig::local();
        token.security.token =
            Some(crate::security::ClusterToken::new("a-secret-token-of-some-length").unwrap());
        assert!(exposure_warning(&token, everywhere).is_none());
    }

    #[tokio::test]
    async fn local_server_answers_get_status_and_list_devices() {
        let server = Server::local().unwrap();
        assert_ne!(server.local_addr().port(), 0);
        assert_eq!(
            server.target(),
            format!("grpc://localhost:{}", server.local_addr().port())
        );
        let channel = channel(&server).await;
        let status = WorkerServiceClient::new(channel.clone())
            .get_status(GetStatusRequest {})
            .await;
        let devices = status.unwrap().into_inner().device_attributes;
        assert_eq!(
            devices[0].name,
            "/job:localhost/replica:0/task:0/device:CPU:0"
        );
        assert_ne!(devices[0].incarnation, 0);
        let listed = MasterServiceClient::new(channel.clone())
            .list_devices(ListDevicesRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(listed.local_device, devices);
        let err = MasterServiceClient::new(channel)
            .run_step(RunStepRequest::default())
            .await
            .unwrap_err();
        // No session has that (empty) handle: TensorFlow's answer is ABORTED.
        assert_eq!(err.code(), tonic::Code::Aborted);
        assert!(err.message().contains("is not found"), "{err}");
        tokio::task::spawn_blocking(move || server.stop())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_running_server_answers_the_probe_and_a_stopped_one_does_not() {
        let server = Server::local().unwrap();
        server.probe(Duration::from_secs(5)).await.unwrap();
        let server = tokio::task::spawn_blocking(move || {
            server.stop();
            server
        })
        .await
        .unwrap();
        let err = server.probe(Duration::from_secs(5)).await.unwrap_err();
        assert_eq!(err.code(), crate::Code::Unavailable, "{err}");
    }

    #[test]
    fn stop_returns_within_the_grace_and_join_then_returns_at_once() {
        let server = Server::local().unwrap();
        let addr = server.local_addr();
        let started = Instant::now();
        server.stop();
        // Stopping an idle server needs no grace at all; 5 s is the configured ceiling.
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        server.join();
        server.stop();
        // The port is released: binding it again works.
        assert!(std::net::TcpListener::bind(addr).is_ok());
    }

    #[tokio::test]
    async fn a_pre_bound_listener_is_served_on_its_own_port() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut config = TaskConfig::local();
        // Ignored: the listener is already bound.
        config.listen = "127.0.0.1:1".parse().unwrap();
        let server = Server::start_with_listener(config, listener).unwrap();
        assert_eq!(server.local_addr(), addr);
        let devices = WorkerServiceClient::new(channel(&server).await)
            .get_status(GetStatusRequest {})
            .await
            .unwrap()
            .into_inner()
            .device_attributes;
        assert_eq!(
            devices[0].name,
            "/job:localhost/replica:0/task:0/device:CPU:0"
        );
        tokio::task::spawn_blocking(move || server.stop())
            .await
            .unwrap();
    }

    #[test]
    fn a_busy_port_is_unavailable_naming_the_address() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut config = TaskConfig::local();
        config.listen = taken.local_addr().unwrap();
        let err = Server::start(config).err().unwrap();
        assert_eq!(err.code(), crate::Code::Unavailable);
        assert!(
            err.message()
                .contains(&taken.local_addr().unwrap().to_string()),
            "{err}"
        );
    }
}
