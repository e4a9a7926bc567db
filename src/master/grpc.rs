//! The MasterService gRPC front: each handler converts the request and forwards it to the
//! `Master`'s mailbox in one line; nothing here blocks or holds state.

use actix::Addr;
use tonic::{Request, Response};

use super::mailboxes::MasterMailboxes;
use super::Master;
use crate::error::Result;
use crate::ops::metrics;
use crate::proto::master_service_server::MasterService;
use crate::proto::*;

/// The MasterService server: the mailbox its handlers forward to.
#[derive(Clone)]
pub struct MasterGrpc {
    master: MasterMailboxes,
    /// The `task` label of the byte counters.
    task: String,
}

impl MasterGrpc {
    /// A front forwarding every RPC to `master`.
    pub fn new(master: &Addr<Master>) -> Self {
        Self {
            master: MasterMailboxes::new(master),
            task: String::new(),
        }
    }

    /// The same front, labelling its metrics with `task` (`/job:ps/replica:0/task:0`).
    pub fn with_task(mut self, task: impl Into<String>) -> Self {
        self.task = task.into();
        self.master = self.master.of_task(&self.task);
        self
    }

    /// The mailbox this front forwards to, for clients in the same process.
    pub fn mailboxes(&self) -> &MasterMailboxes {
        &self.master
    }
}

type Reply<T> = std::result::Result<Response<T>, tonic::Status>;

/// The master's answer as a gRPC response.
fn reply<T>(answer: Result<T>) -> Reply<T> {
    answer.map(Response::new).map_err(tonic::Status::from)
}

#[tonic::async_trait]
impl MasterService for MasterGrpc {
    async fn create_session(
        &self,
        r: Request<CreateSessionRequest>,
    ) -> Reply<CreateSessionResponse> {
        reply(self.master.create_session(r.into_inner()).await)
    }

    async fn extend_session(
        &self,
        r: Request<ExtendSessionRequest>,
    ) -> Reply<ExtendSessionResponse> {
        reply(self.master.extend_session(r.into_inner()).await)
    }

    async fn partial_run_setup(
        &self,
        r: Request<PartialRunSetupRequest>,
    ) -> Reply<PartialRunSetupResponse> {
        reply(self.master.partial_run_setup(r.into_inner()).await)
    }

    async fn run_step(&self, r: Request<RunStepRequest>) -> Reply<RunStepResponse> {
        let request = r.into_inner();
        metrics::received(&self.task, "RunStep", prost::Message::encoded_len(&request));
        let response = reply(self.master.run_step(request).await)?;
        metrics::sent(
            &self.task,
            "RunStep",
            prost::Message::encoded_len(response.get_ref()),
        );
        Ok(response)
    }

    async fn close_session(&self, r: Request<CloseSessionRequest>) -> Reply<CloseSessionResponse> {
        reply(self.master.close_session(r.into_inner()).await)
    }

    async fn list_devices(&self, r: Request<ListDevicesRequest>) -> Reply<ListDevicesResponse> {
        reply(self.master.list_devices(r.into_inner()).await)
    }

    async fn reset(&self, r: Request<ResetRequest>) -> Reply<ResetResponse> {
        reply(self.master.reset(r.into_inner()).await)
    }

    async fn make_callable(&self, r: Request<MakeCallableRequest>) -> Reply<MakeCallableResponse> {
        reply(self.master.make_callable(r.into_inner()).await)
    }

    async fn run_callable(&self, r: Request<RunCallableRequest>) -> Reply<RunCallableResponse> {
        reply(self.master.run_callable(r.into_inner()).await)
    }

    async fn release_callable(
        &self,
        r: Request<ReleaseCallableRequest>,
    ) -> Reply<ReleaseCallableResponse> {
        reply(self.master.release_callable(r.into_inner()).await)
    }
}
