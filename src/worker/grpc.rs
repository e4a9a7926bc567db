//! The WorkerService gRPC front: each handler converts the request and forwards it to the
//! worker's service ([`WorkerHandler`]) in one line; nothing here blocks or holds state.
//!
//! RPCs that tessera does not serve (logging, tracing, collectives) answer UNIMPLEMENTED naming
//! the RPC, so a TensorFlow peer gets a clear error instead of a hang.
//!
//! RecvTensor answers carry the tensor's buffer as `tensor_content`, a shared `Bytes`. The
//! server (`wire::WorkerServer`) frames that response by hand, so the buffer reaches the
//! socket without being copied; every other RPC is encoded by tonic's generated code.

use std::time::Duration;

use std::sync::Arc;

use tonic::{Request, Response};

use super::service::{HandlerFuture, WorkerHandler};
use crate::cluster::Limits;
use crate::ops::metrics;
use crate::proto::worker_service_server::WorkerService;
use crate::proto::*;

/// The UNIMPLEMENTED answer for an RPC tessera does not serve yet.
pub(crate) fn not_yet(rpc: &str) -> tonic::Status {
    tonic::Status::unimplemented(format!("{rpc} is not implemented yet by tessera"))
}

/// The caller's deadline from the `grpc-timeout` header (`<digits><H|M|S|m|u|n>`), if sent.
fn grpc_timeout<T>(request: &Request<T>) -> Option<Duration> {
    let text = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The WorkerService server: the worker's service its handlers forward to.
#[derive(Clone)]
pub struct WorkerGrpc {
    worker: Arc<dyn WorkerHandler>,
    /// The `task` label of the byte counters.
    task: String,
    /// Graphs a peer registers are held to `max_graph_nodes` and `max_graph_bytes`.
    limits: Limits,
}

impl WorkerGrpc {
    /// A front forwarding every RPC to `worker`, with default limits.
    pub fn new(worker: Arc<dyn WorkerHandler>) -> Self {
        Self {
            worker,
            task: String::new(),
            limits: Limits::default(),
        }
    }

    /// The same front for the task labelled `task` in metrics, enforcing `limits`.
    pub fn with_limits(mut self, task: impl Into<String>, limits: Limits) -> Self {
        self.task = task.into();
        self.limits = limits;
        self
    }
}

/// Turns the service's answer into a gRPC response.
async fn answer<R>(reply: HandlerFuture<'_, R>) -> Result<Response<R>, tonic::Status> {
    reply.await.map(Response::new).map_err(tonic::Status::from)
}

#[tonic::async_trait]
impl WorkerService for WorkerGrpc {
    async fn get_status(
        &self,
        request: Request<GetStatusRequest>,
    ) -> Result<Response<GetStatusResponse>, tonic::Status> {
        answer(self.worker.get_status(request.into_inner())).await
    }

    async fn create_worker_session(
        &self,
        request: Request<CreateWorkerSessionRequest>,
    ) -> Result<Response<CreateWorkerSessionResponse>, tonic::Status> {
        answer(self.worker.create_worker_session(request.into_inner())).await
    }

    async fn delete_worker_session(
        &self,
        request: Request<DeleteWorkerSessionRequest>,
    ) -> Result<Response<DeleteWorkerSessionResponse>, tonic::Status> {
        answer(self.worker.delete_worker_session(request.into_inner())).await
    }

    async fn register_graph(
        &self,
        request: Request<RegisterGraphRequest>,
    ) -> Result<Response<RegisterGraphResponse>, tonic::Status> {
        let request = request.into_inner();
        if let Some(graph) = &request.graph_def {
            self.limits.check_graph("RegisterGraph: the graph", graph)?;
        }
        answer(self.worker.register_graph(request)).await
    }

    async fn deregister_graph(
        &self,
        request: Request<DeregisterGraphRequest>,
    ) -> Result<Response<DeregisterGraphResponse>, tonic::Status> {
        answer(self.worker.deregister_graph(request.into_inner())).await
    }

    async fn run_graph(
        &self,
        request: Request<RunGraphRequest>,
    ) -> Result<Response<RunGraphResponse>, tonic::Status> {
        let timeout = grpc_timeout(&request);
        let request = request.into_inner();
        self.limits.check_request_tensors(
            "RunGraph: the tensors sent",
            request.send.iter().filter_map(|s| s.tensor.as_ref()),
        )?;
        metrics::received(
            &self.task,
            "RunGraph",
            prost::Message::encoded_len(&request),
        );
        let response = answer(self.worker.run_graph(request, timeout)).await?;
        metrics::sent(
            &self.task,
            "RunGraph",
            prost::Message::encoded_len(response.get_ref()),
        );
        Ok(response)
    }

    async fn cleanup_graph(
        &self,
        request: Request<CleanupGraphRequest>,
    ) -> Result<Response<CleanupGraphResponse>, tonic::Status> {
        answer(self.worker.cleanup_graph(request.into_inner())).await
    }

    async fn cleanup_all(
        &self,
        request: Request<CleanupAllRequest>,
    ) -> Result<Response<CleanupAllResponse>, tonic::Status> {
        answer(self.worker.cleanup_all(request.into_inner())).await
    }

    async fn recv_tensor(
        &self,
        request: Request<RecvTensorRequest>,
    ) -> Result<Response<RecvTensorResponse>, tonic::Status> {
        let timeout = grpc_timeout(&request);
        let request = request.into_inner();
        let response = answer(self.worker.recv_tensor(request, timeout)).await?;
        metrics::sent(
            &self.task,
            "RecvTensor",
            prost::Message::encoded_len(response.get_ref()),
        );
        Ok(response)
    }

    async fn mark_recv_finished(
        &self,
        _request: Request<MarkRecvFinishedRequest>,
    ) -> Result<Response<MarkRecvFinishedResponse>, tonic::Status> {
        Err(not_yet("MarkRecvFinished"))
    }

    async fn logging(
        &self,
        _request: Request<LoggingRequest>,
    ) -> Result<Response<LoggingResponse>, tonic::Status> {
        Err(not_yet("Logging"))
    }

    async fn tracing(
        &self,
        _request: Request<TracingRequest>,
    ) -> Result<Response<TracingResponse>, tonic::Status> {
        Err(not_yet("Tracing"))
    }

    async fn recv_buf(
        &self,
        _request: Request<RecvBufRequest>,
    ) -> Result<Response<RecvBufResponse>, tonic::Status> {
        Err(not_yet("RecvBuf"))
    }

    async fn complete_group(
        &self,
        _request: Request<CompleteGroupRequest>,
    ) -> Result<Response<CompleteGroupResponse>, tonic::Status> {
        Err(not_yet("CompleteGroup"))
    }

    async fn complete_instance(
        &self,
        _request: Request<CompleteInstanceRequest>,
    ) -> Result<Response<CompleteInstanceResponse>, tonic::Status> {
        Err(not_yet("CompleteInstance"))
    }

    async fn get_step_sequence(
        &self,
        request: Request<GetStepSequenceRequest>,
    ) -> Result<Response<GetStepSequenceResponse>, tonic::Status> {
        answer(self.worker.get_step_sequence(request.into_inner())).await
    }
}
