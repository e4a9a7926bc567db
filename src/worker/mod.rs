//! The worker: this task's WorkerService.
//!
//! [`WorkerHandler`] is the service, one trait ([`service`]); [`WorkerState`] implements it, a
//! shared handle over the task's devices, worker sessions, registered graphs and step
//! rendezvous. Callers reach it without a hop through an actor's thread: the gRPC front
//! ([`grpc::WorkerGrpc`]) and the tensor channel for other tasks, the own task's `LocalPeer`
//! for its master. Quick calls (sessions, RegisterGraph, CleanupGraph) answer on the caller's
//! task; RunGraph and RecvTensor wait (for executors, for a value) without blocking it.
//! Executors run on the executor pool's threads, never on an async runtime's.
//!
//! [`Worker`] is the actor that owns the worker's lifetime in the daemon: the towers of its
//! devices and the stores of their variable shards, and a timer that collects steps nobody
//! used within the step TTL and sessions whose master went away (no request within the
//! session TTL), logging what it removed.

mod graphs;
pub mod grpc;
pub mod service;
mod session;
mod state;
mod step;

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, AsyncContext, Context, Recipient};

use crate::runtime::resource::ResourceMgr;
use crate::tower::DescribeDevice;

pub use graphs::RegisteredGraph;
pub use service::{HandlerFuture, Rpc, WorkerHandler};
pub use session::LEGACY_SESSION;
pub use state::{Collected, WeakWorkerState, WorkerOptions, WorkerState};

/// The actor shell around [`WorkerState`].
pub struct Worker {
    state: WorkerState,
    /// One per local device, in the order of the device list.
    towers: Vec<Recipient<DescribeDevice>>,
    /// The variable stores of the devices' shards, shared with the towers' kernels.
    shards: Vec<Arc<ResourceMgr>>,
}

impl Worker {
    /// A worker over `state`'s devices, owning their `towers` (one per device, same order)
    /// and their shards' stores.
    pub fn new(
        state: WorkerState,
        towers: Vec<Recipient<DescribeDevice>>,
        shards: Vec<Arc<ResourceMgr>>,
    ) -> Self {
        Self {
            state,
            towers,
            shards,
        }
    }

    /// Returns the state shared with the own task's local peer.
    pub fn state(&self) -> &WorkerState {
        &self.state
    }
}

impl Actor for Worker {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        tracing::debug!(
            task = %self.state.task(),
            towers = self.towers.len(),
            variables = self.shards.iter().map(|s| s.len()).sum::<usize>(),
            "worker started"
        );
        let options = self.state.options();
        let period = (options.step_ttl.min(options.session_ttl) / 2).max(Duration::from_secs(1));
        ctx.run_interval(period, |worker, _ctx| {
            let collected = worker.state.collect_stale(Instant::now());
            if collected != Collected::default() {
                tracing::info!(
                    task = %worker.state.task(),
                    steps = ?collected.steps,
                    sessions = ?collected.sessions,
                    "collected stale steps and sessions"
                );
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{DeviceConfig, TaskId};
    use crate::device::{build_devices, GpuProbe, GpuScan};
    use crate::proto::{
        CleanupGraphRequest, RecvTensorRequest, RegisterGraphRequest, RunGraphRequest,
    };

    struct NoGpu;

    impl GpuProbe for NoGpu {
        fn scan(&self) -> GpuScan {
            GpuScan::Unavailable {
                reason: "test".into(),
            }
        }
    }

    #[tokio::test]
    async fn a_recv_tensor_waiting_does_not_block_register_and_run() {
        use crate::graph::attr;
        use crate::proto::{GraphDef, NodeDef};

        let task = TaskId::new("worker", 0);
        let devices = build_devices(&task, &DeviceConfig::default(), &NoGpu).unwrap();
        let cpu0 = devices[0].name.clone();
        let incarnation = devices[0].incarnation;
        let worker: Arc<dyn WorkerHandler> = Arc::new(WorkerState::new(task, devices));
        let peer = "/job:ps/replica:0/task:0/device:CPU:0";
        let key = format!("{cpu0};{incarnation:016x};{peer};edge_0_c;0:0");
        // Asked first: the value comes only with the RunGraph that comes after.
        let waiting = {
            let worker = Arc::clone(&worker);
            tokio::spawn(async move {
                let request = RecvTensorRequest {
                    step_id: 4,
                    rendezvous_key: key,
                    ..Default::default()
                };
                worker
                    .recv_tensor(request, Some(Duration::from_secs(30)))
                    .await
            })
        };
        let node = |name: &str, op: &str, input: &[&str]| NodeDef {
            name: name.into(),
            op: op.into(),
            device: cpu0.clone(),
            input: input.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let mut c = node("c", "Const", &[]);
        c.attr.insert(
            "dtype".into(),
            attr::value::dtype(crate::tensor::DType::Int32),
        );
        c.attr.insert(
            "value".into(),
            attr::value::tensor(crate::tensor::Tensor::scalar(7i32).to_proto()),
        );
        let mut send = node("c_S0", "_Send", &["c"]);
        for (k, v) in [
            ("send_device", attr::value::string(&cpu0)),
            (
                "send_device_incarnation",
                attr::value::int(incarnation as i64),
            ),
            ("recv_device", attr::value::string(peer)),
            ("tensor_name", attr::value::string("edge_0_c")),
            ("T", attr::value::dtype(crate::tensor::DType::Int32)),
        ] {
            send.attr.insert(k.into(), v);
        }
        let handle = worker
            .register_graph(
                RegisterGraphRequest {
                    graph_def: Some(GraphDef {
                        node: vec![c, send],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                None,
            )
            .await
            .unwrap()
            .graph_handle;
        let request = RunGraphRequest {
            graph_handle: handle,
            step_id: 4,
            ..Default::default()
        };
        worker.run_graph(request, None).await.unwrap();
        let response = waiting.await.unwrap().unwrap();
        // A scalar int32 7, little-endian.
        assert_eq!(
            response.tensor.unwrap().tensor_content.as_ref(),
            [7, 0, 0, 0]
        );
        worker
            .cleanup_graph(CleanupGraphRequest { step_id: 4 }, None)
            .await
            .unwrap();
    }
}
