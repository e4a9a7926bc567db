//! `worker_service!`: a test `WorkerService` written as only the methods a test answers; every
//! other listed method is UNIMPLEMENTED. (The whole impl comes from the macro so that
//! `async_trait` sees the expanded methods.)
//!
//! ```ignore
//! worker_service! { TestWorker, {
//!     async fn get_status(&self, _: Request<GetStatusRequest>) -> TonicResult<GetStatusResponse> { .. }
//! }
//!     run_graph, RunGraphRequest, RunGraphResponse;
//! }
//! ```

// The CUDA test binaries include `support` without a fake worker.
#![allow(unused_macros, unused_imports)]

macro_rules! worker_service {
    ($worker:ty, { $($answered:item)* } $($method:ident, $req:ty, $resp:ty;)*) => {
        #[tonic::async_trait]
        impl WorkerService for $worker {
            $($answered)*
            $(
                async fn $method(
                    &self,
                    _: ::tonic::Request<$req>,
                ) -> ::std::result::Result<::tonic::Response<$resp>, ::tonic::Status> {
                    Err(::tonic::Status::unimplemented(stringify!($method)))
                }
            )*
        }
    };
}

/// `worker_service!` for a worker that answers RecvTensor alone (the fast paths' tests).
macro_rules! recv_tensor_worker {
    ($worker:ty, { $($answered:item)* }) => {
        worker_service! { $worker, { $($answered)* }
            get_status, GetStatusRequest, GetStatusResponse;
            create_worker_session, CreateWorkerSessionRequest, CreateWorkerSessionResponse;
            delete_worker_session, DeleteWorkerSessionRequest, DeleteWorkerSessionResponse;
            register_graph, RegisterGraphRequest, RegisterGraphResponse;
            deregister_graph, DeregisterGraphRequest, DeregisterGraphResponse;
            run_graph, RunGraphRequest, RunGraphResponse;
            cleanup_graph, CleanupGraphRequest, CleanupGraphResponse;
            cleanup_all, CleanupAllRequest, CleanupAllResponse;
            mark_recv_finished, MarkRecvFinishedRequest, MarkRecvFinishedResponse;
            logging, LoggingRequest, LoggingResponse;
            tracing, TracingRequest, TracingResponse;
            recv_buf, RecvBufRequest, RecvBufResponse;
            complete_group, CompleteGroupRequest, CompleteGroupResponse;
            complete_instance, CompleteInstanceRequest, CompleteInstanceResponse;
            get_step_sequence, GetStepSequenceRequest, GetStepSequenceResponse;
        }
    };
}

pub(crate) use {recv_tensor_worker, worker_service};
