//! The in-process session (TensorFlow's target `""`): a growing graph, run step by step on its
//! devices through cached executors.
//!
//! A [`LocalSession`] owns its graph (extended, never edited), an executor cache keyed by the
//! step's signature (sorted feeds, fetches, targets) and the graph version, and the callables
//! made from it. [`LocalSession::local`] makes its own CPU:0 with its own variables;
//! [`LocalSession::on_device`] shares a daemon's device, so variables outlive the session.
//!
//! With [`SessionOptions::device_count`] above 1 ([`LocalSession::local_with`]) the session has
//! `CPU:0..N-1`, each with its own variables and thread of control, as TensorFlow's
//! `ConfigProto.device_count = {"CPU": N}`: the graph is placed on them (a node's `device`
//! request, `/device:CPU:1`, is honoured; the rest goes to CPU:0) and each signature runs as one
//! executor per device joined by `_Send`/`_Recv` ([`super::multi_device`]). Placement is kept
//! across extends, so a node never moves once it has run.
//!
//! Calls are synchronous and may come from several threads at once (a training loop and its
//! hooks); executors are built outside the locks, so a slow build does not stall other steps.
//! After [`LocalSession::close`] every call fails with FAILED_PRECONDITION.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::multi_device::{LocalDevices, MultiDeviceStep};
use crate::device::space::Emulated;
use crate::device::DeviceType;
use crate::device::{CudaProbe, GpuProbe, GpuScan};
use crate::error::{Result, Status};
use crate::exec::placement::{place, registered_kernel, PlacementOptions};
use crate::exec::Executor;
use crate::exec::TensorRef;
use crate::kernels::KernelLookup;
use crate::proto::{CallableOptions, DeviceAttributes, GraphDef, RunMetadata, RunOptions};
use crate::runtime::stats::StepStatsCollector;
use crate::runtime::{CancellationToken, Device, StepOptions};
use crate::tensor::Tensor;
use crate::tower::TowerState;

/// How long [`LocalSession::close`] waits for running steps before it gives up on them.
const CLOSE_WAIT: Duration = Duration::from_secs(60);

/// How a session places and runs its steps.
#[derive(Clone)]
pub struct SessionOptions {
    /// Ignore the devices nodes request (`/job:ps/task:0`) and run everything on the session's
    /// device (TensorFlow's `allow_soft_placement`). When off, a node requesting another device
    /// fails the step with INVALID_ARGUMENT.
    pub allow_soft_placement: bool,
    /// Fails a step that has not finished after this long with DEADLINE_EXCEEDED
    /// (TensorFlow's `RunOptions.timeout_in_ms`); `None` waits for the kernels.
    pub step_timeout: Option<Duration>,
    /// Creates the kernels; [`crate::exec::create_kernel`] unless a test injects others.
    pub kernels: Arc<KernelLookup>,
    /// Which ops `kernels` has a kernel for on a device type, for placement:
    /// [`registered_kernel`] unless `kernels` is another set.
    pub has_kernel: fn(&str, DeviceType) -> bool,
    /// How many CPU devices [`LocalSession::local_with`] makes (`CPU:0..N-1`, TensorFlow's
    /// `device_count = {"CPU": N}`); at least 1. Sessions on an existing device ignore it.
    pub device_count: u32,
    /// At most how many GPUs [`LocalSession::local_with`] uses (`GPU:0..N-1` after the CPUs,
    /// TensorFlow's `device_count = {"GPU": N}`): the first N the CUDA driver reports, fewer
    /// or none when the host has fewer. 0, the default, never asks the driver.
    pub gpu_count: u32,
    /// A memory limit in bytes for each CPU device [`LocalSession::local_with`] makes: a step
    /// whose kernel outputs would go over it fails with RESOURCE_EXHAUSTED naming the node.
    /// `None` (the default) leaves CPU memory unaccounted.
    pub cpu_memory_limit: Option<u64>,
    /// How many emulated GPUs [`LocalSession::local_with`] makes instead of asking the driver
    /// (`GPU:0..N-1` after the CPUs): devices whose memory is a separate space in host memory
    /// that counts every copy in and out, running the GPU op set with the CPU kernels
    /// ([`crate::kernels::emulated`]). They place, partition and copy as GPUs do, on any host.
    /// With them, the session's `kernels` and `has_kernel` are the emulated GPU's.
    pub emulated_gpus: u32,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            allow_soft_placement: true,
            step_timeout: None,
            kernels: Arc::new(crate::exec::create_kernel),
            has_kernel: registered_kernel,
            device_count: 1,
            gpu_count: 0,
            cpu_memory_limit: None,
            emulated_gpus: 0,
        }
    }
}

/// A step's signature: the executor cache key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Signature {
    feeds: Vec<String>,
    fetches: Vec<String>,
    targets: Vec<String>,
}

/// The graph and what was built from it.
#[derive(Default)]
struct GraphState {
    graph: Arc<GraphDef>,
    names: HashSet<String>,
    version: u64,
    executors: HashMap<Signature, Arc<Runner>>,
    /// The graph placed on the session's devices (multi-device sessions), made on first use
    /// after each extend.
    placed: Option<Arc<GraphDef>>,
    /// Every node's device since it was first placed; later placements keep it.
    placements: HashMap<String, String>,
}

/// What runs one signature: one executor, or one per device.
enum Runner {
    Single(Executor),
    Multi(MultiDeviceStep),
}

impl Runner {
    fn run(&self, feeds: Vec<Tensor>, options: &StepOptions) -> Result<Vec<Tensor>> {
        match self {
            Runner::Single(executor) => executor.run(feeds, options),
            Runner::Multi(step) => step.run(feeds, options),
        }
    }

    /// What each device runs, one graph per device.
    fn partition_graphs(&self) -> Vec<GraphDef> {
        let graph = |e: &Executor| GraphDef {
            node: e.nodes().cloned().collect(),
            ..Default::default()
        };
        match self {
            Runner::Single(executor) => vec![graph(executor)],
            Runner::Multi(step) => step.executors().iter().map(|e| graph(e)).collect(),
        }
    }

    /// Runs one step as `options` ask: within `timeout_in_ms` when set, recording a trace when
    /// `trace_level` is above `NO_TRACE`, returning the partition graphs when
    /// `output_partition_graphs`.
    fn run_with_options(
        &self,
        feeds: Vec<Tensor>,
        mut step: StepOptions,
        options: &RunOptions,
    ) -> Result<(Vec<Tensor>, RunMetadata)> {
        if options.timeout_in_ms > 0 {
            let deadline = Instant::now() + Duration::from_millis(options.timeout_in_ms as u64);
            step.deadline = Some(step.deadline.map_or(deadline, |d| d.min(deadline)));
        }
        let stats = (options.trace_level > 0).then(|| Arc::new(StepStatsCollector::new()));
        step.stats = stats.clone();
        let fetched = self.run(feeds, &step)?;
        let metadata = RunMetadata {
            step_stats: stats.map(|s| s.finish()),
            partition_graphs: if options.output_partition_graphs {
                self.partition_graphs()
            } else {
                Vec::new()
            },
            ..Default::default()
        };
        Ok((fetched, metadata))
    }
}

/// Whether the session is open and how many calls are running in it.
#[derive(Default)]
struct Lifecycle {
    closed: bool,
    running: usize,
    callables: HashMap<i64, Arc<Runner>>,
    next_handle: i64,
}

/// An in-process session running a growing graph on one device; `Send + Sync`.
pub struct LocalSession {
    device: Arc<Device>,
    /// Every device of the session, `device` first; more than one makes a multi-device session.
    devices: Vec<Arc<Device>>,
    /// Each device's incarnation, for the `_Send`/`_Recv` pairs between them.
    incarnations: HashMap<String, u64>,
    /// Whether the session made its device (its variables die with it).
    owns_device: bool,
    options: SessionOptions,
    graph: RwLock<GraphState>,
    lifecycle: Mutex<Lifecycle>,
    idle: Condvar,
    cancel: CancellationToken,
    /// The session's name among the sessions of its device, for the resources TensorFlow
    /// keeps per session (an iterator without a `shared_name`).
    scope: String,
}

/// Counts a call as running until dropped, so that `close` can wait for it.
struct Running<'a>(&'a LocalSession);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut life = self.0.lifecycle.lock().unwrap_or_else(|e| e.into_inner());
        life.running -= 1;
        if life.running == 0 {
            self.0.idle.notify_all();
        }
    }
}

/// The attributes of a local session's GPU named `name`.
fn gpu_attributes(name: &str) -> DeviceAttributes {
    DeviceAttributes {
        name: name.to_string(),
        device_type: DeviceType::Gpu.as_str().to_string(),
        ..Default::default()
    }
}

/// A local session's GPU device, run by its tower: its nodes on the tower's threads, which
/// have the GPU's context current, its tensors in the tower's memory of the GPU.
fn gpu_device(tower: TowerState) -> Arc<Device> {
    let device = Device::new(tower.name(), DeviceType::Gpu).with_pool(tower.pool().clone());
    Arc::new(match tower.memory() {
        Some(memory) => device.with_memory_space(Arc::clone(memory)),
        None => device,
    })
}

impl LocalSession {
    /// A session with its own CPU device and variables
    /// (`/job:localhost/replica:0/task:0/device:CPU:0`): TensorFlow's `tf.Session("")`.
    pub fn local() -> Self {
        Self::local_with(SessionOptions::default())
    }

    /// A session with its own `options.device_count` CPU devices
    /// (`/job:localhost/replica:0/task:0/device:CPU:i`), each with its own variables and, with
    /// `options.cpu_memory_limit`, its own memory limit; then `options.emulated_gpus` emulated
    /// GPUs, or else up to `options.gpu_count` GPUs (`.../device:GPU:i`) when the host has them.
    pub fn local_with(mut options: SessionOptions) -> Self {
        const PREFIX: &str = "/job:localhost/replica:0/task:0";
        let mut devices: Vec<Arc<Device>> = (0..options.device_count.max(1))
            .map(|i| {
                let device = Device::new(format!("{PREFIX}/device:CPU:{i}"), DeviceType::Cpu);
                Arc::new(match options.cpu_memory_limit {
                    Some(limit) => device.with_memory_limit(limit),
                    None => device,
                })
            })
            .collect();
        if options.emulated_gpus > 0 {
            devices.extend((0..options.emulated_gpus).map(|i| {
                let name = format!("{PREFIX}/device:GPU:{i}");
                gpu_device(TowerState::with_memory(
                    gpu_attributes(&name),
                    Some(Emulated::new(name.clone())),
                ))
            }));
            options.kernels = crate::kernels::emulated::lookup();
            options.has_kernel = crate::kernels::emulated::has_kernel;
        } else if options.gpu_count > 0 {
            // GPU:i is the driver's i-th GPU: the kernels take the ordinal from the name.
            let found = match CudaProbe.scan() {
                GpuScan::Found(gpus) => gpus.len(),
                GpuScan::Unavailable { .. } => 0,
            };
            let gpus = found.min(options.gpu_count as usize);
            devices.extend((0..gpus).map(|i| {
                gpu_device(TowerState::new(gpu_attributes(&format!(
                    "{PREFIX}/device:GPU:{i}"
                ))))
            }));
        }
        Self::on_devices(devices, options)
    }

    /// A session of its own on `devices` (the first is the client's, where feeds and fetches
    /// live): placement spreads nodes over them and the step runs a partition per device, as
    /// [`LocalSession::local_with`] does over the devices it makes. Tests use it to put a
    /// device the host does not have, with `options.kernels` standing in for its kernels.
    pub fn on_devices(devices: Vec<Arc<Device>>, options: SessionOptions) -> Self {
        assert!(!devices.is_empty(), "a session needs at least one device");
        let mut session = Self::with_options(Arc::clone(&devices[0]), options);
        session.incarnations = devices
            .iter()
            .map(|d| (d.name().to_string(), rand::random::<u64>() | 1))
            .collect();
        session.devices = devices;
        session.owns_device = true;
        session
    }

    /// A session on an existing device, sharing its variables with every other session on it.
    pub fn on_device(device: Arc<Device>) -> Self {
        Self::with_options(device, SessionOptions::default())
    }

    /// A session on `device` with these options.
    pub fn with_options(device: Arc<Device>, options: SessionOptions) -> Self {
        let incarnations = HashMap::from([(device.name().to_string(), 1)]);
        Self {
            devices: vec![Arc::clone(&device)],
            incarnations,
            device,
            owns_device: false,
            options,
            graph: RwLock::default(),
            lifecycle: Mutex::default(),
            idle: Condvar::new(),
            cancel: CancellationToken::new(),
            scope: {
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                format!(
                    "local{}",
                    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                )
            },
        }
    }

    /// Returns the device the session runs on (its first, for a multi-device session).
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Returns every device of the session: its CPUs in `CPU:i` order, then its GPUs.
    pub fn devices(&self) -> &[Arc<Device>] {
        &self.devices
    }

    /// Returns the full device name each node of the current graph runs on (every node on the
    /// session's device when it has one). Placing the graph may fail, as a step would, with
    /// INVALID_ARGUMENT naming a node whose device request no device meets.
    pub fn placement(&self) -> Result<HashMap<String, String>> {
        let _running = self.enter()?;
        if self.devices.len() == 1 {
            let state = self.graph.read().unwrap_or_else(|e| e.into_inner());
            return Ok(state
                .graph
                .node
                .iter()
                .map(|n| (n.name.clone(), self.device.name().to_string()))
                .collect());
        }
        let placed = self.placed()?.0;
        Ok(placed
            .node
            .iter()
            .map(|n| (n.name.clone(), n.device.clone()))
            .collect())
    }

    /// Returns the graph version: 0 when empty, one more after each [`extend`](Self::extend).
    pub fn graph_version(&self) -> u64 {
        self.graph.read().unwrap_or_else(|e| e.into_inner()).version
    }

    /// Adds the nodes of `graph` to the session's graph. A node whose name is already taken
    /// fails the whole call with INVALID_ARGUMENT naming it, and nothing is added.
    pub fn extend(&self, graph: &GraphDef) -> Result<()> {
        let _running = self.enter()?;
        let mut state = self.graph.write().unwrap_or_else(|e| e.into_inner());
        let mut added = HashSet::with_capacity(graph.node.len());
        for node in &graph.node {
            if state.names.contains(&node.name) || !added.insert(node.name.as_str()) {
                return Err(Status::invalid_argument(format!(
                    "Duplicate node name in graph: `{}`; every node name must be unique in the \
                     session's graph",
                    node.name
                )));
            }
        }
        let whole = Arc::make_mut(&mut state.graph);
        whole.node.extend(graph.node.iter().cloned());
        if whole.versions.is_none() {
            whole.versions = graph.versions.clone();
        }
        if whole.library.is_none() {
            whole.library = graph.library.clone();
        }
        state
            .names
            .extend(graph.node.iter().map(|n| n.name.clone()));
        state.version += 1;
        state.placed = None;
        // Executors of the old version are rebuilt on next use (their nodes are unchanged,
        // but a signature that failed to build may now succeed).
        state.executors.clear();
        Ok(())
    }

    /// Runs one step: feeds `(tensor name, value)` in any order, returns the fetched tensors in
    /// fetch order and runs `targets` (node names) for their effects.
    pub fn run(
        &self,
        feeds: &[(&str, Tensor)],
        fetches: &[&str],
        targets: &[&str],
    ) -> Result<Vec<Tensor>> {
        let _running = self.enter()?;
        let (executor, tensors) = self.prepare_run(feeds, fetches, targets)?;
        executor.run(tensors, &self.step_options())
    }

    /// Runs one step as [`run`](Self::run) does, as `options` ask (TensorFlow's
    /// `session.run(..., options=, run_metadata=)`): `trace_level` above `NO_TRACE` returns
    /// the step's [`StepStats`](crate::proto::StepStats) in the metadata, one
    /// `DeviceStepStats` per device with every node that ran;
    /// `output_partition_graphs` returns the graph each device ran; `timeout_in_ms` bounds the
    /// step (the session's own step timeout still applies).
    pub fn run_with_options(
        &self,
        feeds: &[(&str, Tensor)],
        fetches: &[&str],
        targets: &[&str],
        options: &RunOptions,
    ) -> Result<(Vec<Tensor>, RunMetadata)> {
        let _running = self.enter()?;
        let (executor, tensors) = self.prepare_run(feeds, fetches, targets)?;
        executor.run_with_options(tensors, self.step_options(), options)
    }

    /// The runner of a step's signature and its feeds in the runner's order.
    fn prepare_run(
        &self,
        feeds: &[(&str, Tensor)],
        fetches: &[&str],
        targets: &[&str],
    ) -> Result<(Arc<Runner>, Vec<Tensor>)> {
        let mut named = Vec::with_capacity(feeds.len());
        for (name, tensor) in feeds {
            let r = TensorRef::parse(name).map_err(|e| e.context("feed"))?;
            named.push((r.canonical(), tensor.clone()));
        }
        named.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(w) = named.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(Status::invalid_argument(format!(
                "Duplicated feeds: `{}` is fed more than once",
                w[0].0
            )));
        }
        let (feed_names, tensors): (Vec<String>, Vec<Tensor>) = named.into_iter().unzip();
        let signature = Signature {
            feeds: feed_names,
            fetches: fetches.iter().map(|s| s.to_string()).collect(),
            targets: targets.iter().map(|s| s.to_string()).collect(),
        };
        Ok((self.executor(signature)?, tensors))
    }

    /// Builds an executor for `options` once and returns a handle to run it with
    /// [`run_callable`](Self::run_callable).
    pub fn make_callable(&self, options: CallableOptions) -> Result<i64> {
        let _running = self.enter()?;
        if !options.tensor_connection.is_empty() {
            return Err(Status::unimplemented(
                "CallableOptions.tensor_connection is not supported; feed the tensor instead",
            ));
        }
        let graph = self.graph_to_run()?.0;
        let executor = Arc::new(self.build(
            &graph,
            &Signature {
                feeds: options.feed,
                fetches: options.fetch,
                targets: options.target,
            },
        )?);
        let mut life = self.lifecycle.lock().unwrap_or_else(|e| e.into_inner());
        let handle = life.next_handle;
        life.next_handle += 1;
        life.callables.insert(handle, executor);
        Ok(handle)
    }

    /// Runs the callable `handle` with `feeds` in its `CallableOptions.feed` order; returns the
    /// fetches in `CallableOptions.fetch` order. An unknown handle is INVALID_ARGUMENT.
    pub fn run_callable(&self, handle: i64, feeds: Vec<Tensor>) -> Result<Vec<Tensor>> {
        let _running = self.enter()?;
        let executor = {
            let life = self.lifecycle.lock().unwrap_or_else(|e| e.into_inner());
            life.callables.get(&handle).cloned().ok_or_else(|| {
                Status::invalid_argument(format!(
                    "No such callable handle: {handle}; make it with make_callable (released \
                     handles are gone)"
                ))
            })?
        };
        executor.run(feeds, &self.step_options())
    }

    /// Forgets the callable `handle`; releasing an unknown or released handle is fine.
    pub fn release_callable(&self, handle: i64) -> Result<()> {
        let _running = self.enter()?;
        self.lifecycle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .callables
            .remove(&handle);
        Ok(())
    }

    /// Closes the session: running steps are cancelled (no new node starts in them) and
    /// waited for, then every later call fails with FAILED_PRECONDITION. Variables stay in a
    /// shared device's resources; a [`local`](Self::local) session's die with it. Closing twice
    /// is fine.
    pub fn close(&self) -> Result<()> {
        let mut life = self.lifecycle.lock().unwrap_or_else(|e| e.into_inner());
        if life.closed {
            return Ok(());
        }
        life.closed = true;
        life.callables.clear();
        self.cancel.cancel(Status::cancelled(
            "Step was cancelled by an explicit call to `Session::Close()`",
        ));
        let deadline = Instant::now() + CLOSE_WAIT;
        while life.running > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    running = life.running,
                    "session closed with steps still running"
                );
                break;
            }
            life = self
                .idle
                .wait_timeout(life, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(life);
        *self.graph.write().unwrap_or_else(|e| e.into_inner()) = GraphState::default();
        if self.owns_device {
            for device in &self.devices {
                device.resources().clear(&[]);
            }
        }
        Ok(())
    }

    /// Counts a call as running, or fails when the session is closed.
    fn enter(&self) -> Result<Running<'_>> {
        let mut life = self.lifecycle.lock().unwrap_or_else(|e| e.into_inner());
        if life.closed {
            return Err(Status::failed_precondition(
                "Session is closed; create a new session to run more steps",
            ));
        }
        life.running += 1;
        Ok(Running(self))
    }

    fn step_options(&self) -> StepOptions {
        StepOptions {
            step_id: new_step_id(),
            cancellation: Some(self.cancel.clone()),
            deadline: self.options.step_timeout.map(|t| Instant::now() + t),
            ..Default::default()
        }
    }

    /// Returns the cached executor for `signature`, building it on first use.
    fn executor(&self, signature: Signature) -> Result<Arc<Runner>> {
        {
            let state = self.graph.read().unwrap_or_else(|e| e.into_inner());
            if let Some(executor) = state.executors.get(&signature) {
                return Ok(executor.clone());
            }
        }
        let (graph, version) = self.graph_to_run()?;
        let executor = Arc::new(self.build(&graph, &signature)?);
        let mut state = self.graph.write().unwrap_or_else(|e| e.into_inner());
        if state.version == version {
            // Two threads may have built it at once; keep the first.
            let cached = state.executors.entry(signature).or_insert(executor);
            return Ok(cached.clone());
        }
        Ok(executor)
    }

    /// The graph steps run: the session's graph, placed when the session has several devices;
    /// with its version.
    fn graph_to_run(&self) -> Result<(Arc<GraphDef>, u64)> {
        if self.devices.len() > 1 {
            return self.placed();
        }
        let state = self.graph.read().unwrap_or_else(|e| e.into_inner());
        Ok((state.graph.clone(), state.version))
    }

    /// The graph placed on the session's devices, placed on first use after each extend; nodes
    /// placed before keep their device.
    fn placed(&self) -> Result<(Arc<GraphDef>, u64)> {
        {
            let state = self.graph.read().unwrap_or_else(|e| e.into_inner());
            if let Some(placed) = &state.placed {
                return Ok((placed.clone(), state.version));
            }
        }
        let mut state = self.graph.write().unwrap_or_else(|e| e.into_inner());
        if let Some(placed) = &state.placed {
            return Ok((placed.clone(), state.version));
        }
        let mut graph = (*state.graph).clone();
        for node in &mut graph.node {
            if let Some(device) = state.placements.get(&node.name) {
                node.device = device.clone();
            }
        }
        let attributes: Vec<DeviceAttributes> = self
            .devices
            .iter()
            .map(|d| DeviceAttributes {
                name: d.name().to_string(),
                device_type: d.device_type().as_str().to_string(),
                incarnation: self.incarnations.get(d.name()).copied().unwrap_or(1),
                ..Default::default()
            })
            .collect();
        let has_kernel = self.options.has_kernel;
        let options = PlacementOptions {
            default_device: self.device.name(),
            allow_soft_placement: self.options.allow_soft_placement,
            has_kernel: &has_kernel,
        };
        let placed = Arc::new(place(&graph, &attributes, &options)?);
        for node in &placed.node {
            state
                .placements
                .insert(node.name.clone(), node.device.clone());
        }
        state.placed = Some(placed.clone());
        Ok((placed, state.version))
    }

    fn build(&self, graph: &GraphDef, signature: &Signature) -> Result<Runner> {
        fn strs(v: &[String]) -> Vec<&str> {
            v.iter().map(String::as_str).collect()
        }
        if self.devices.len() > 1 {
            let local = LocalDevices {
                devices: &self.devices,
                incarnations: &self.incarnations,
                session: &self.scope,
            };
            let mut counter = next_free_suffix(graph);
            return Ok(Runner::Multi(MultiDeviceStep::build(
                graph,
                &signature.feeds,
                &signature.fetches,
                &signature.targets,
                &local,
                self.options.kernels.as_ref(),
                &mut counter,
            )?));
        }
        let executor = Executor::new(
            graph,
            &strs(&signature.feeds),
            &strs(&signature.fetches),
            &strs(&signature.targets),
            self.device.clone(),
            self.options.kernels.as_ref(),
        )?
        .in_session(&self.scope);
        if !self.options.allow_soft_placement {
            for node in executor.nodes() {
                if !node.device.is_empty() && !self.device.satisfies(&node.device)? {
                    return Err(Status::invalid_argument(format!(
                        "Cannot assign a device for operation `{}`: it requests `{}`, but this \
                         session runs only on `{}`; clear the node's device or allow soft \
                         placement",
                        node.name,
                        node.device,
                        self.device.name()
                    )));
                }
            }
        }
        Ok(Runner::Single(executor))
    }
}

impl Drop for LocalSession {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// One past the largest `n` of any node named `..._S<n>` in `graph`, so that the `_Send`/`_Recv`
/// nodes partitioning adds never take a name the graph uses.
fn next_free_suffix(graph: &GraphDef) -> u64 {
    graph
        .node
        .iter()
        .filter_map(|n| n.name.rsplit_once("_S"))
        .filter_map(|(_, n)| n.parse::<u64>().ok())
        .map(|n| n + 1)
        .max()
        .unwrap_or(0)
}

/// A fresh step id: random, with the top 7 bits clear as TensorFlow's master does.
fn new_step_id() -> i64 {
    (rand::random::<u64>() >> 7) as i64
}
