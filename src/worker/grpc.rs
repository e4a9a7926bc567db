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

use super::service::{worker_rpcs, HandlerFuture, WorkerHandler};
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

/// The tonic service from the WorkerService's table: each row converts the request, lets
/// [`admit!`] check and count it, and forwards it to the worker's service in one line; the
/// RPCs tessera does not serve answer UNIMPLEMENTED naming themselves.
macro_rules! front {
    ($($method:ident: $rpc:ident($req:ty) -> $resp:ty, $waits:literal, $doc:literal;)*) => {
        front_impl! {
            served: [$($method: $rpc($req) -> $resp, $waits;)*]
            not_served: [
                mark_recv_finished: MarkRecvFinished(MarkRecvFinishedRequest)
                    -> MarkRecvFinishedResponse;
                logging: Logging(LoggingRequest) -> LoggingResponse;
                tracing: Tracing(TracingRequest) -> TracingResponse;
                recv_buf: RecvBuf(RecvBufRequest) -> RecvBufResponse;
                complete_group: CompleteGroup(CompleteGroupRequest) -> CompleteGroupResponse;
                complete_instance: CompleteInstance(CompleteInstanceRequest)
                    -> CompleteInstanceResponse;
            ]
        }
    };
}

/// The whole impl in one expansion, so that `async_trait` sees every method.
macro_rules! front_impl {
    (
        served: [$($method:ident: $rpc:ident($req:ty) -> $resp:ty, $waits:literal;)*]
        not_served: [$($other:ident: $other_rpc:ident($other_req:ty) -> $other_resp:ty;)*]
    ) => {
        #[tonic::async_trait]
        impl WorkerService for WorkerGrpc {
            $(
                async fn $method(
                    &self,
                    request: Request<$req>,
                ) -> Result<Response<$resp>, tonic::Status> {
                    let timeout = if $waits { grpc_timeout(&request) } else { None };
                    let request = request.into_inner();
                    admit!($method, self, &request);
                    let response = answer(self.worker.$method(request, timeout)).await?;
                    count!($method, self, response.get_ref());
                    Ok(response)
                }
            )*
            $(
                async fn $other(
                    &self,
                    _request: Request<$other_req>,
                ) -> Result<Response<$other_resp>, tonic::Status> {
                    Err(not_yet(stringify!($other_rpc)))
                }
            )*
        }
    };
}

/// What the front checks of a request before the worker sees it: a registered graph's size,
/// the tensors a RunGraph carries (and their bytes, counted).
macro_rules! admit {
    (register_graph, $front:ident, $request:expr) => {
        if let Some(graph) = &$request.graph_def {
            $front
                .limits
                .check_graph("RegisterGraph: the graph", graph)?;
        }
    };
    (run_graph, $front:ident, $request:expr) => {
        $front.limits.check_request_tensors(
            "RunGraph: the tensors sent",
            $request.send.iter().filter_map(|s| s.tensor.as_ref()),
        )?;
        metrics::received(
            &$front.task,
            "RunGraph",
            prost::Message::encoded_len($request),
        );
    };
    ($method:ident, $front:ident, $request:expr) => {};
}

/// The answers whose bytes the front counts: RunGraph's and RecvTensor's.
macro_rules! count {
    (run_graph, $front:ident, $response:expr) => {
        metrics::sent(
            &$front.task,
            "RunGraph",
            prost::Message::encoded_len($response),
        )
    };
    (recv_tensor, $front:ident, $response:expr) => {
        metrics::sent(
            &$front.task,
            "RecvTensor",
            prost::Message::encoded_len($response),
        )
    };
    ($method:ident, $front:ident, $response:expr) => {};
}

worker_rpcs!(front);
