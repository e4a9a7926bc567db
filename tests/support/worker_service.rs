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

// Test binaries that include `support` without a fake worker do not use it.
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

pub(crate) use worker_service;
