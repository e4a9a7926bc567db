//! The MasterService gRPC front: each handler converts the request and forwards it to the
//! `Master`'s mailbox in one line; nothing here blocks or holds state.

use actix::{Addr, Message, Recipient};
use tonic::{Request, Response};

use super::{
    CloseSession, CreateSession, ExtendSession, ListDevices, MakeCallable, Master, PartialRunSetup,
    ReleaseCallable, Reset, RunCallable, RunStep,
};
use crate::error::{mailbox_failure, Status};
use crate::ops::metrics;
use crate::proto::master_service_server::MasterService;
use crate::proto::*;

/// Sends `msg` to `mailbox` and turns the reply into a gRPC response. A closed mailbox means
/// the actors are stopping: UNAVAILABLE, which clients treat as "retry elsewhere or later".
pub(crate) async fn forward<M, R>(
    mailbox: &Recipient<M>,
    msg: M,
) -> Result<Response<R>, tonic::Status>
where
    M: Message<Result = Result<R, Status>> + Send + 'static,
    R: Send + 'static,
{
    let reply = mailbox
        .send(msg)
        .await
        .map_err(|e| mailbox_failure(e, "this task's master"))?;
    reply.map(Response::new).map_err(tonic::Status::from)
}

/// The MasterService server: the mailboxes its handlers forward to.
#[derive(Clone)]
pub struct MasterGrpc {
    create_session: Recipient<CreateSession>,
    extend_session: Recipient<ExtendSession>,
    partial_run_setup: Recipient<PartialRunSetup>,
    run_step: Recipient<RunStep>,
    close_session: Recipient<CloseSession>,
    list_devices: Recipient<ListDevices>,
    reset: Recipient<Reset>,
    make_callable: Recipient<MakeCallable>,
    run_callable: Recipient<RunCallable>,
    release_callable: Recipient<ReleaseCallable>,
    /// The `task` label of the byte counters.
    task: String,
}

impl MasterGrpc {
    /// A front forwarding every RPC to `master`.
    pub fn new(master: &Addr<Master>) -> Self {
        Self {
            create_session: master.clone().recipient(),
            extend_session: master.clone().recipient(),
            partial_run_setup: master.clone().recipient(),
            run_step: master.clone().recipient(),
            close_session: master.clone().recipient(),
            list_devices: master.clone().recipient(),
            reset: master.clone().recipient(),
            make_callable: master.clone().recipient(),
            run_callable: master.clone().recipient(),
            release_callable: master.clone().recipient(),
            task: String::new(),
        }
    }

    /// The same front, labelling its metrics with `task` (`/job:ps/replica:0/task:0`).
    pub fn with_task(mut self, task: impl Into<String>) -> Self {
        self.task = task.into();
        self
    }
}

type Reply<T> = Result<Response<T>, tonic::Status>;

#[tonic::async_trait]
impl MasterService for MasterGrpc {
    async fn create_session(
        &self,
        r: Request<CreateSessionRequest>,
    ) -> Reply<CreateSessionResponse> {
        forward(&self.create_session, CreateSession(r.into_inner())).await
    }

    async fn extend_session(
        &self,
        r: Request<ExtendSessionRequest>,
    ) -> Reply<ExtendSessionResponse> {
        forward(&self.extend_session, ExtendSession(r.into_inner())).await
    }

    async fn partial_run_setup(
        &self,
        r: Request<PartialRunSetupRequest>,
    ) -> Reply<PartialRunSetupResponse> {
        forward(&self.partial_run_setup, PartialRunSetup(r.into_inner())).await
    }

    async fn run_step(&self, r: Request<RunStepRequest>) -> Reply<RunStepResponse> {
        let request = r.into_inner();
        metrics::received(&self.task, "RunStep", prost::Message::encoded_len(&request));
        let response = forward(&self.run_step, RunStep(request)).await?;
        metrics::sent(
            &self.task,
            "RunStep",
            prost::Message::encoded_len(response.get_ref()),
        );
        Ok(response)
    }

    async fn close_session(&self, r: Request<CloseSessionRequest>) -> Reply<CloseSessionResponse> {
        forward(&self.close_session, CloseSession(r.into_inner())).await
    }

    async fn list_devices(&self, r: Request<ListDevicesRequest>) -> Reply<ListDevicesResponse> {
        forward(&self.list_devices, ListDevices(r.into_inner())).await
    }

    async fn reset(&self, r: Request<ResetRequest>) -> Reply<ResetResponse> {
        forward(&self.reset, Reset(r.into_inner())).await
    }

    async fn make_callable(&self, r: Request<MakeCallableRequest>) -> Reply<MakeCallableResponse> {
        forward(&self.make_callable, MakeCallable(r.into_inner())).await
    }

    async fn run_callable(&self, r: Request<RunCallableRequest>) -> Reply<RunCallableResponse> {
        forward(&self.run_callable, RunCallable(r.into_inner())).await
    }

    async fn release_callable(
        &self,
        r: Request<ReleaseCallableRequest>,
    ) -> Reply<ReleaseCallableResponse> {
        forward(&self.release_callable, ReleaseCallable(r.into_inner())).await
    }
}
