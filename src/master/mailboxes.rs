//! [`MasterMailboxes`]: the master's MasterService calls as plain async methods on its
//! mailbox, the one way in for the gRPC front ([`super::grpc`]) and for clients in the same
//! process ([`super::local`]).

use actix::{Addr, Message, Recipient};

use super::{
    CloseSession, CreateSession, ExtendSession, ListDevices, MakeCallable, Master, PartialRunSetup,
    ReleaseCallable, Reset, RunCallable, RunStep,
};
use crate::error::{mailbox_failure, Result, Status};
use crate::proto::*;

/// Sends `msg` to `mailbox` and waits for the answer. A closed mailbox means the actors are
/// stopping: UNAVAILABLE naming `master`, which clients treat as "retry elsewhere or later".
async fn ask<M, R>(mailbox: &Recipient<M>, msg: M, master: &str) -> Result<R>
where
    M: Message<Result = Result<R, Status>> + Send + 'static,
    R: Send + 'static,
{
    mailbox
        .send(msg)
        .await
        .map_err(|e| mailbox_failure(e, master))?
}

/// The master's mailbox, one typed recipient per MasterService call. Cheap to clone.
#[derive(Clone)]
pub struct MasterMailboxes {
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
    /// Who answers, for errors: "the master of /job:worker/replica:0/task:0".
    master: String,
}

impl MasterMailboxes {
    /// The calls of `master`.
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
            master: "this task's master".into(),
        }
    }

    /// The same mailbox, naming `task` (`/job:worker/replica:0/task:0`) in its errors.
    pub fn of_task(mut self, task: &str) -> Self {
        self.master = format!("the master of {task}");
        self
    }

    pub async fn create_session(&self, r: CreateSessionRequest) -> Result<CreateSessionResponse> {
        ask(&self.create_session, CreateSession(r), &self.master).await
    }

    pub async fn extend_session(&self, r: ExtendSessionRequest) -> Result<ExtendSessionResponse> {
        ask(&self.extend_session, ExtendSession(r), &self.master).await
    }

    pub async fn partial_run_setup(
        &self,
        r: PartialRunSetupRequest,
    ) -> Result<PartialRunSetupResponse> {
        ask(&self.partial_run_setup, PartialRunSetup(r), &self.master).await
    }

    pub async fn run_step(&self, r: RunStepRequest) -> Result<RunStepResponse> {
        ask(&self.run_step, RunStep(r), &self.master).await
    }

    pub async fn close_session(&self, r: CloseSessionRequest) -> Result<CloseSessionResponse> {
        ask(&self.close_session, CloseSession(r), &self.master).await
    }

    pub async fn list_devices(&self, r: ListDevicesRequest) -> Result<ListDevicesResponse> {
        ask(&self.list_devices, ListDevices(r), &self.master).await
    }

    pub async fn reset(&self, r: ResetRequest) -> Result<ResetResponse> {
        ask(&self.reset, Reset(r), &self.master).await
    }

    pub async fn make_callable(&self, r: MakeCallableRequest) -> Result<MakeCallableResponse> {
        ask(&self.make_callable, MakeCallable(r), &self.master).await
    }

    pub async fn run_callable(&self, r: RunCallableRequest) -> Result<RunCallableResponse> {
        ask(&self.run_callable, RunCallable(r), &self.master).await
    }

    pub async fn release_callable(
        &self,
        r: ReleaseCallableRequest,
    ) -> Result<ReleaseCallableResponse> {
        ask(&self.release_callable, ReleaseCallable(r), &self.master).await
    }
}
