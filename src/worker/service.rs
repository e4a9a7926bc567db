//! The worker's service: [`WorkerHandler`], the one trait of TensorFlow's WorkerService in
//! tessera, and [`Rpc`], the names of its calls.

use std::fmt;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::error::{Result, Status};
use crate::proto::{
    CleanupAllRequest, CleanupAllResponse, CleanupGraphRequest, CleanupGraphResponse,
    CreateWorkerSessionRequest, CreateWorkerSessionResponse, DeleteWorkerSessionRequest,
    DeleteWorkerSessionResponse, DeregisterGraphRequest, DeregisterGraphResponse, GetStatusRequest,
    GetStatusResponse, GetStepSequenceRequest, GetStepSequenceResponse, RecvTensorRequest,
    RecvTensorResponse, RegisterGraphRequest, RegisterGraphResponse, RunGraphRequest,
    RunGraphResponse,
};

/// The WorkerService RPCs, for messages, logs and recorded calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rpc {
    /// `GetStatus`: the task's devices and their incarnations.
    GetStatus,
    /// `CreateWorkerSession`: a master session's state on the task.
    CreateWorkerSession,
    /// `DeleteWorkerSession`: drops that state.
    DeleteWorkerSession,
    /// `RegisterGraph`: installs the task's partition of a graph.
    RegisterGraph,
    /// `DeregisterGraph`: drops a registered partition.
    DeregisterGraph,
    /// `RunGraph`: runs a registered partition for one step.
    RunGraph,
    /// `CleanupGraph`: drops a step's rendezvous.
    CleanupGraph,
    /// `CleanupAll`: clears resource containers.
    CleanupAll,
    /// `RecvTensor`: pulls one tensor a step produced on the task.
    RecvTensor,
    /// `GetStepSequence`: the next step ids of collective graphs, from their group leader.
    GetStepSequence,
}

impl Rpc {
    /// Returns the RPC's name as in `/tensorflow.WorkerService/<name>`.
    pub fn name(self) -> &'static str {
        match self {
            Rpc::GetStatus => "GetStatus",
            Rpc::CreateWorkerSession => "CreateWorkerSession",
            Rpc::DeleteWorkerSession => "DeleteWorkerSession",
            Rpc::RegisterGraph => "RegisterGraph",
            Rpc::DeregisterGraph => "DeregisterGraph",
            Rpc::RunGraph => "RunGraph",
            Rpc::CleanupGraph => "CleanupGraph",
            Rpc::CleanupAll => "CleanupAll",
            Rpc::RecvTensor => "RecvTensor",
            Rpc::GetStepSequence => "GetStepSequence",
        }
    }
}

impl fmt::Display for Rpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The future a [`WorkerHandler`] method returns.
pub type HandlerFuture<'a, T> = BoxFuture<'a, Result<T>>;

/// TensorFlow's WorkerService as tessera answers it: the one trait of the service.
///
/// The worker implements it ([`WorkerState`](super::WorkerState)); everything else adapts it:
/// the gRPC front ([`WorkerGrpc`](super::grpc::WorkerGrpc)) and the tensor channel answer
/// remote callers with it, the own task's `LocalPeer` answers its master with it, and tests
/// implement the calls they need. A new call is a method here (answering UNIMPLEMENTED by
/// default), its body in `WorkerState`, and its line in the gRPC front.
///
/// Deadlines are the caller's: a peer stops waiting when its call's deadline passes. The calls
/// that wait (RunGraph, RecvTensor) also take the caller's `timeout`, so that the work itself
/// stops then; `None` leaves it to the worker's own deadlines.
pub trait WorkerHandler: Send + Sync {
    /// `GetStatus`.
    fn get_status(&self, _request: GetStatusRequest) -> HandlerFuture<'_, GetStatusResponse> {
        unimplemented_rpc(Rpc::GetStatus)
    }

    /// `CreateWorkerSession`.
    fn create_worker_session(
        &self,
        _request: CreateWorkerSessionRequest,
    ) -> HandlerFuture<'_, CreateWorkerSessionResponse> {
        unimplemented_rpc(Rpc::CreateWorkerSession)
    }

    /// `DeleteWorkerSession`.
    fn delete_worker_session(
        &self,
        _request: DeleteWorkerSessionRequest,
    ) -> HandlerFuture<'_, DeleteWorkerSessionResponse> {
        unimplemented_rpc(Rpc::DeleteWorkerSession)
    }

    /// `RegisterGraph`.
    fn register_graph(
        &self,
        _request: RegisterGraphRequest,
    ) -> HandlerFuture<'_, RegisterGraphResponse> {
        unimplemented_rpc(Rpc::RegisterGraph)
    }

    /// `DeregisterGraph`.
    fn deregister_graph(
        &self,
        _request: DeregisterGraphRequest,
    ) -> HandlerFuture<'_, DeregisterGraphResponse> {
        unimplemented_rpc(Rpc::DeregisterGraph)
    }

    /// `RunGraph`.
    fn run_graph(
        &self,
        _request: RunGraphRequest,
        _timeout: Option<Duration>,
    ) -> HandlerFuture<'_, RunGraphResponse> {
        unimplemented_rpc(Rpc::RunGraph)
    }

    /// `CleanupGraph`.
    fn cleanup_graph(
        &self,
        _request: CleanupGraphRequest,
    ) -> HandlerFuture<'_, CleanupGraphResponse> {
        unimplemented_rpc(Rpc::CleanupGraph)
    }

    /// `CleanupAll`.
    fn cleanup_all(&self, _request: CleanupAllRequest) -> HandlerFuture<'_, CleanupAllResponse> {
        unimplemented_rpc(Rpc::CleanupAll)
    }

    /// `RecvTensor`.
    fn recv_tensor(
        &self,
        _request: RecvTensorRequest,
        _timeout: Option<Duration>,
    ) -> HandlerFuture<'_, RecvTensorResponse> {
        unimplemented_rpc(Rpc::RecvTensor)
    }

    /// `GetStepSequence`.
    fn get_step_sequence(
        &self,
        _request: GetStepSequenceRequest,
    ) -> HandlerFuture<'_, GetStepSequenceResponse> {
        unimplemented_rpc(Rpc::GetStepSequence)
    }
}

/// UNIMPLEMENTED for an RPC this worker does not answer yet.
fn unimplemented_rpc<T: Send + 'static>(rpc: Rpc) -> HandlerFuture<'static, T> {
    Box::pin(std::future::ready(Err(Status::unimplemented(format!(
        "{rpc} is not implemented by this task's worker"
    )))))
}
