//! `LocalPeer`: the own task, reached without gRPC.
//!
//! A master talks to its own task's worker through the same [`Peer`] trait as to any other
//! task, but the request goes straight to the worker's service, the [`WorkerHandler`] that its
//! gRPC front answers with too: no encoding, no socket, tensors stay `bytes::Bytes` shared with
//! the caller. The peer adds what every peer owes its caller, the deadline.

use std::sync::Arc;

use super::{deadline_exceeded, CallOptions, Peer, PeerFuture};
use crate::cluster::TaskId;
use crate::error::Result;
#[allow(clippy::wildcard_imports)] // The table names every request and response.
use crate::proto::*;
use crate::worker::service::worker_rpcs;
use crate::worker::{HandlerFuture, Rpc, WorkerHandler};

/// The own task as a [`Peer`]: calls go to its [`WorkerHandler`] directly.
#[derive(Clone)]
pub struct LocalPeer {
    task: TaskId,
    handler: Arc<dyn WorkerHandler>,
}

impl LocalPeer {
    /// A peer for `task` (this process's own task) answered by `handler`.
    pub fn new(task: TaskId, handler: Arc<dyn WorkerHandler>) -> Self {
        Self { task, handler }
    }

    /// Awaits `reply` until the call's deadline.
    async fn within<T>(
        &self,
        rpc: Rpc,
        options: CallOptions,
        reply: HandlerFuture<'_, T>,
    ) -> Result<T> {
        match tokio::time::timeout_at(options.deadline_at(), reply).await {
            Ok(result) => result,
            Err(_) => Err(deadline_exceeded(
                &self.task,
                "(this task)",
                rpc,
                options.budget(),
            )),
        }
    }
}

impl std::fmt::Debug for LocalPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalPeer")
            .field("task", &self.task)
            .finish()
    }
}

/// Implements [`Peer`] by forwarding each call to the handler under its deadline; the calls
/// that wait pass the time left on.
macro_rules! forward {
    ($($method:ident: $rpc:ident($req:ty) -> $resp:ty, $waits:literal, $doc:literal;)*) => {$(
        fn $method(&self, request: $req, options: CallOptions) -> PeerFuture<'_, $resp> {
            let timeout = $waits.then(|| options.remaining());
            Box::pin(self.within(Rpc::$rpc, options, self.handler.$method(request, timeout)))
        }
    )*};
}

impl Peer for LocalPeer {
    fn task(&self) -> &TaskId {
        &self.task
    }

    worker_rpcs!(forward);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::proto::NamedTensorProto;
    use crate::Code;

    /// Answers RunGraph with the requested keys and GetStatus never; the rest is unimplemented.
    struct EchoWorker;

    impl WorkerHandler for EchoWorker {
        fn run_graph(
            &self,
            request: RunGraphRequest,
            _timeout: Option<Duration>,
        ) -> HandlerFuture<'_, RunGraphResponse> {
            Box::pin(async move {
                Ok(RunGraphResponse {
                    recv: request
                        .recv_key
                        .into_iter()
                        .map(|name| NamedTensorProto { name, tensor: None })
                        .collect(),
                    ..Default::default()
                })
            })
        }

        fn get_status(
            &self,
            _request: GetStatusRequest,
            _timeout: Option<Duration>,
        ) -> HandlerFuture<'_, GetStatusResponse> {
            Box::pin(std::future::pending())
        }
    }

    fn peer() -> Arc<dyn Peer> {
        Arc::new(LocalPeer::new(
            TaskId::new("worker", 0),
            Arc::new(EchoWorker),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn forwards_to_the_handler() {
        let request = RunGraphRequest {
            recv_key: vec!["a".into(), "b".into()],
            ..Default::default()
        };
        let response = peer()
            .run_graph(request, CallOptions::timeout(Duration::from_secs(1)))
            .await
            .unwrap();
        let names: Vec<_> = response.recv.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_that_never_answers_meets_the_deadline() {
        let start = tokio::time::Instant::now();
        let err = peer()
            .get_status(
                GetStatusRequest {},
                CallOptions::timeout(Duration::from_secs(10)),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::DeadlineExceeded);
        assert!(
            err.message().starts_with(
                "/job:worker/replica:0/task:0 (this task) did not answer GetStatus within 10 s"
            ),
            "{err}"
        );
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test]
    async fn the_own_worker_answers_through_its_service() {
        use crate::device::{build_devices, GpuProbe, GpuScan};
        use crate::worker::WorkerState;

        struct NoGpu;
        impl GpuProbe for NoGpu {
            fn scan(&self) -> GpuScan {
                GpuScan::Unavailable {
                    reason: "test".into(),
                }
            }
        }

        let task = TaskId::new("worker", 1);
        let config = crate::cluster::DeviceConfig {
            cpu_count: std::num::NonZeroU32::new(2).unwrap(),
            ..Default::default()
        };
        let devices = build_devices(&task, &config, &NoGpu).unwrap();
        let state = WorkerState::new(task.clone(), devices);
        let peer: Arc<dyn Peer> = Arc::new(LocalPeer::new(task, Arc::new(state.downgrade())));
        let status = peer
            .get_status(
                GetStatusRequest {},
                CallOptions::timeout(Duration::from_secs(5)),
            )
            .await
            .unwrap();
        let names: Vec<_> = status
            .device_attributes
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "/job:worker/replica:0/task:1/device:CPU:0",
                "/job:worker/replica:0/task:1/device:CPU:1"
            ]
        );
        drop(state);
        // The peer holds the worker weakly: once the worker is gone, calls say so.
        let err = peer
            .get_status(
                GetStatusRequest {},
                CallOptions::timeout(Duration::from_secs(5)),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err}");
    }

    #[tokio::test]
    async fn rpcs_the_worker_lacks_are_unimplemented() {
        let err = peer()
            .cleanup_all(
                CleanupAllRequest::default(),
                CallOptions::timeout(Duration::from_secs(1)),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unimplemented);
        assert!(err.message().contains("CleanupAll"), "{err}");
    }
}
