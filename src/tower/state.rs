//! The logic of a [`Tower`](super::Tower), without actix.
//!
//! A tower owns one device's execution: the device's attributes, the pool of threads its
//! executors run nodes on (named after the device, `tessera-CPU:0-N`) and, for a device whose
//! tensors live apart from the host's (a GPU), the device's memory with its context.
//! [`TowerState::start`] starts the device's part of a step: the nodes that cannot wait and
//! proved cheap run on the calling thread (the tower's; never a GPU's nodes), every other node
//! on the pool, and the step goes on there while the tower takes its next message; so
//! concurrent steps run concurrently, and a kernel that blocks (`_Recv`, a queue's dequeue, an
//! accumulator's take) blocks one pool thread, never the tower or another step.
//!
//! A GPU is called only where its context is current (`device::context`): each of its tower's
//! threads makes the context current as it starts, so every kernel, copy and all-reduce of its
//! steps runs under it; a buffer dropped anywhere else is handed back to the device, and the
//! thread that ends each of the device's steps frees those and reports an error the device
//! parked during the step (`MemorySpace::settle`).

use std::sync::Arc;

use crate::device::space::MemorySpace;
use crate::device::DeviceType;
use crate::error::{Result, Status};
use crate::exec::executor::RunningStep;
use crate::exec::Executor;
use crate::proto::DeviceAttributes;
use crate::runtime::intra::IntraPool;
use crate::runtime::pool::ThreadPool;
use crate::runtime::StepOptions;

/// One device's state: its attributes (name, type, incarnation, memory limit), its threads
/// (the executor's, which pick nodes, and the intra-op pool its kernels split large work over)
/// and, for a GPU, its memory and context.
pub struct TowerState {
    device: DeviceAttributes,
    pool: ThreadPool,
    intra: Arc<IntraPool>,
    memory: Option<Arc<dyn MemorySpace>>,
}

impl TowerState {
    /// The state of a tower for `device`, with a pool of its own; a GPU's tower opens the
    /// GPU's memory as the build has it (`kernels::memory_space`: with the `cuda` feature).
    pub fn new(device: DeviceAttributes) -> Self {
        let device_type = DeviceType::parse(&device.device_type).unwrap_or(DeviceType::Cpu);
        let memory = crate::kernels::memory_space(device_type, &device.name);
        Self::with_memory(device, memory)
    }

    /// The state of a tower for `device` whose tensors live in `memory` (`None`: the host's;
    /// an emulated GPU's memory in a local session). Each of its threads makes the memory's
    /// context current as it starts; one that cannot says so, and the device's first call on
    /// it fails with the reason.
    pub fn with_memory(device: DeviceAttributes, memory: Option<Arc<dyn MemorySpace>>) -> Self {
        let short = device
            .name
            .rsplit_once("/device:")
            .map_or(device.name.as_str(), |(_, short)| short);
        let name = format!("tessera-{short}");
        let pool = match &memory {
            Some(memory) => {
                let memory = Arc::clone(memory);
                ThreadPool::with_thread_start(
                    name,
                    Arc::new(move || {
                        if let Err(e) = memory.bind() {
                            tracing::warn!(
                                device = %memory.device(),
                                error = %e,
                                "a tower thread could not make its device's context current"
                            );
                        }
                    }),
                )
            }
            None => ThreadPool::new(name),
        };
        Self {
            device,
            pool,
            intra: Arc::clone(IntraPool::global()),
            memory,
        }
    }

    /// The same tower splitting its kernels' work over `intra` (a daemon's devices share one
    /// sized by `[devices] intra_op_threads`, so that towers side by side do not oversubscribe
    /// the cores).
    pub fn with_intra(mut self, intra: Arc<IntraPool>) -> Self {
        self.intra = intra;
        self
    }

    /// Returns the threads the device's kernels split large work over; the worker builds the
    /// device with them (`runtime::Device::with_intra`).
    pub fn intra(&self) -> &Arc<IntraPool> {
        &self.intra
    }

    /// Returns the device's full name (`/job:J/replica:0/task:T/device:CPU:0`).
    pub fn name(&self) -> &str {
        &self.device.name
    }

    /// Returns the device's own memory, when its tensors live apart from the host's; the worker
    /// builds the device with it (`runtime::Device::with_memory_space`).
    pub fn memory(&self) -> Option<&Arc<dyn MemorySpace>> {
        self.memory.as_ref()
    }

    /// Returns the device's attributes as GetStatus reports them.
    pub fn describe(&self) -> DeviceAttributes {
        self.device.clone()
    }

    /// Returns the threads the device's executors run nodes on; the worker builds the device
    /// with them (`runtime::Device::with_pool`).
    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    /// Starts `executor`'s part of the step described by `options` and returns it running.
    /// FAILED_PRECONDITION when the executor runs on another device.
    pub fn start(&self, executor: &Arc<Executor>, options: &StepOptions) -> Result<RunningStep> {
        let device = executor.device().name();
        if device != self.device.name {
            return Err(Status::failed_precondition(format!(
                "the tower of {} was handed a partition for {device}",
                self.device.name
            )));
        }
        executor.spawn(Vec::new(), options)
    }
}

impl std::fmt::Debug for TowerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TowerState")
            .field("device", &self.device.name)
            .field("threads", &self.pool.threads())
            .field("intra_op_threads", &self.intra.threads())
            .field("own_memory", &self.memory.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceType;
    use crate::graph::Graph;
    use crate::runtime::Device;
    use crate::tensor::Tensor;

    #[test]
    fn describes_the_device_it_was_given() {
        let device = DeviceAttributes {
            name: "/job:ps/replica:0/task:0/device:CPU:0".into(),
            incarnation: 7,
            ..Default::default()
        };
        let tower = TowerState::new(device.clone());
        assert_eq!(tower.name(), "/job:ps/replica:0/task:0/device:CPU:0");
        assert_eq!(tower.describe(), device);
    }

    fn executor_on(device: Arc<Device>) -> Arc<Executor> {
        let mut g = Graph::new();
        let a = g
            .constant(&Tensor::from_vec([2], vec![1.0f32, 2.0]).unwrap())
            .unwrap();
        let b = g.add(&a, &a).unwrap();
        let mut graph = g.to_graph_def();
        for node in &mut graph.node {
            node.device = device.name().to_string();
        }
        let kernels = crate::exec::create_kernel;
        Arc::new(Executor::new(&graph, &[], &[&b.name()], &[], device, &kernels).unwrap())
    }

    #[tokio::test]
    async fn runs_its_devices_nodes_on_its_own_threads() {
        let name = "/job:worker/replica:0/task:0/device:CPU:1";
        let tower = TowerState::new(DeviceAttributes {
            name: name.into(),
            ..Default::default()
        });
        let device = Arc::new(Device::new(name, DeviceType::Cpu).with_pool(tower.pool().clone()));
        let executor = executor_on(device);
        let stats = Arc::new(crate::runtime::stats::StepStatsCollector::new());
        let options = StepOptions {
            stats: Some(Arc::clone(&stats)),
            ..Default::default()
        };
        let out = tower
            .start(&executor, &options)
            .unwrap()
            .finish()
            .await
            .unwrap();
        assert_eq!(out[0].values::<f32>().unwrap().as_ref(), [2.0, 4.0]);
        // A first step runs no node inline (none has proved cheap yet): all on the pool.
        let traced = stats.finish();
        let threads: Vec<&String> = traced.dev_stats[0].thread_names.values().collect();
        assert!(!threads.is_empty());
        assert!(
            threads.iter().all(|t| t.starts_with("tessera-CPU:1-")),
            "{threads:?}"
        );
    }

    #[test]
    fn refuses_another_devices_partition() {
        let tower = TowerState::new(DeviceAttributes {
            name: "/job:worker/replica:0/task:0/device:CPU:0".into(),
            ..Default::default()
        });
        let other = Arc::new(Device::new(
            "/job:worker/replica:0/task:0/device:CPU:1",
            DeviceType::Cpu,
        ));
        let err = tower
            .start(&executor_on(other), &StepOptions::default())
            .err()
            .unwrap();
        assert_eq!(err.code(), crate::Code::FailedPrecondition);
    }
}
