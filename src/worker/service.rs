//! The worker's service: [`worker_rpcs!`], the table of TensorFlow's WorkerService in tessera
//! (one row per RPC), and what it makes here: [`WorkerHandler`], the service's one trait, and
//! [`Rpc`], the names of its calls.

use std::fmt;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::error::{Result, Status};
#[allow(clippy::wildcard_imports)] // The table names every request and response.
use crate::proto::*;

/// The WorkerService as tessera makes and answers it: one row per RPC,
/// `method: Rpc(Request) -> Response, waits, "what it does";`.
///
/// `waits` says whether the call may wait on a step (RunGraph runs one, RecvTensor waits for a
/// value): its caller's deadline then reaches the work, so the work stops when nobody waits.
/// Everything else comes from this table, each piece by a macro named after it that takes the
/// rows: [`Rpc`] and [`WorkerHandler`] here, the worker's own service
/// ([`WorkerState`](super::WorkerState)), the gRPC front ([`WorkerGrpc`](super::grpc::WorkerGrpc)),
/// the `Peer` client (`peer/`) and its local, gRPC, failover and simulated
/// implementations. A new RPC is a row here and its body in `WorkerState` (and, for a call
/// only some pieces treat apart, an arm in that piece's macro).
macro_rules! worker_rpcs {
    ($piece:ident) => {
        $piece! {
            get_status: GetStatus(GetStatusRequest) -> GetStatusResponse, false,
                "the task's devices and their incarnations";
            create_worker_session: CreateWorkerSession(CreateWorkerSessionRequest)
                -> CreateWorkerSessionResponse, false,
                "sets up a master session's state on the task";
            delete_worker_session: DeleteWorkerSession(DeleteWorkerSessionRequest)
                -> DeleteWorkerSessionResponse, false,
                "drops a master session's state on the task";
            register_graph: RegisterGraph(RegisterGraphRequest) -> RegisterGraphResponse, false,
                "installs the task's partition of a graph; answers its handle";
            deregister_graph: DeregisterGraph(DeregisterGraphRequest) -> DeregisterGraphResponse,
                false, "drops a registered partition";
            run_graph: RunGraph(RunGraphRequest) -> RunGraphResponse, true,
                "runs a registered partition for one step; a step error may come back inside \
the response (`status_code`), which the caller checks";
            cleanup_graph: CleanupGraph(CleanupGraphRequest) -> CleanupGraphResponse, false,
                "drops a step's rendezvous on the task";
            cleanup_all: CleanupAll(CleanupAllRequest) -> CleanupAllResponse, false,
                "clears the named resource containers on the task";
            recv_tensor: RecvTensor(RecvTensorRequest) -> RecvTensorResponse, true,
                "pulls the tensor a step sent under a rendezvous key";
            get_step_sequence: GetStepSequence(GetStepSequenceRequest)
                -> GetStepSequenceResponse, false,
                "the next step ids of collective graphs, from their group leader";
        }
    };
}
pub(crate) use worker_rpcs;

/// [`Rpc`] from the table.
macro_rules! rpc_enum {
    ($($method:ident: $rpc:ident($req:ty) -> $resp:ty, $waits:literal, $doc:literal;)*) => {
        /// The WorkerService RPCs, for messages, logs and recorded calls.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Rpc {
            $(#[doc = concat!("`", stringify!($rpc), "`: ", $doc, ".")] $rpc,)*
        }

        impl Rpc {
            /// Returns the RPC's name as in `/tensorflow.WorkerService/<name>`.
            pub fn name(self) -> &'static str {
                match self {
                    $(Rpc::$rpc => stringify!($rpc),)*
                }
            }
        }
    };
}
worker_rpcs!(rpc_enum);

impl fmt::Display for Rpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The future a [`WorkerHandler`] method returns.
pub type HandlerFuture<'a, T> = BoxFuture<'a, Result<T>>;

/// [`WorkerHandler`]'s methods from the table, each UNIMPLEMENTED until implemented.
macro_rules! handler_methods {
    ($($method:ident: $rpc:ident($req:ty) -> $resp:ty, $waits:literal, $doc:literal;)*) => {$(
        #[doc = concat!("`", stringify!($rpc), "`: ", $doc, ".")]
        fn $method(&self, _request: $req, _timeout: Option<Duration>) -> HandlerFuture<'_, $resp> {
            unimplemented_rpc(Rpc::$rpc)
        }
    )*};
}

/// TensorFlow's WorkerService as tessera answers it: the one trait of the service.
///
/// The worker implements it ([`WorkerState`](super::WorkerState)); everything else adapts it:
/// the gRPC front ([`WorkerGrpc`](super::grpc::WorkerGrpc)) and the tensor channel answer
/// remote callers with it, the own task's `LocalPeer` answers its master with it, and tests
/// implement the calls they need. Its methods come from [`worker_rpcs!`], the service's table.
///
/// Deadlines are the caller's: a peer stops waiting when its call's deadline passes. The calls
/// that wait (RunGraph, RecvTensor: `waits` in the table) also get the caller's `timeout`, so that
/// the work itself stops then; `None` leaves it to the worker's own deadlines, and the other
/// calls get `None`.
pub trait WorkerHandler: Send + Sync {
    worker_rpcs!(handler_methods);
}

/// UNIMPLEMENTED for an RPC this worker does not answer yet.
fn unimplemented_rpc<T: Send + 'static>(rpc: Rpc) -> HandlerFuture<'static, T> {
    Box::pin(std::future::ready(Err(Status::unimplemented(format!(
        "{rpc} is not implemented by this task's worker"
    )))))
}
