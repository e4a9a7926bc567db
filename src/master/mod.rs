//! `Master`: the actor behind this task's MasterService.
//!
//! Clients (a TensorFlow `Session("grpc://host:port")`, `Session::connect`) reach it through
//! [`grpc::MasterGrpc`] or, from the task's own process, straight through its mailbox
//! ([`local`]); both call it through [`MasterMailboxes`]. It owns the sessions: CreateSession
//! finds the session's tasks and devices ([`discovery`]), creates a worker session on each and
//! starts one [`MasterSession`] actor, which then serves every call naming its handle. The
//! master itself only looks handles up and forwards:
//!
//! ```text
//!   MasterGrpc ─┐
//!   LocalMaster ┴► Master ──(handle → Addr)──► MasterSession ──Peer──► workers
//!                    │  CreateSession: GetStatus + CreateWorkerSession to the tasks
//!                    │  Reset: close every session, CleanupAll to the tasks
//! ```
//!
//! Calls with an unknown handle are ABORTED, as in TensorFlow (the master may have restarted).
//! Sessions and steps are admitted against `[limits]` first (`admission.rs`): over
//! `max_sessions` or `max_steps_in_flight`, or with a graph over `max_graph_nodes` /
//! `max_graph_bytes`, a call is RESOURCE_EXHAUSTED at once, naming the limit.
//! RunStep errors go in the response body when the request sets
//! `store_errors_in_response_body`, else as the RPC's status.

mod admission;
pub mod discovery;
pub mod grpc;
pub mod local;
mod mailboxes;
pub mod session;
mod state;

use std::collections::HashMap;
use std::sync::Arc;

use actix::{
    Actor, ActorFutureExt, Addr, Context, Handler, Message, ResponseActFuture, ResponseFuture,
    WrapFuture,
};
use futures::future::join_all;
use tracing::{info, warn};

use self::admission::Admission;
use self::discovery::{discover, target_tasks, FoundTask};
use self::session::{partial_runs_unsupported, MasterSession};
use crate::error::mailbox_failure;
use crate::error::{Result, Status};
use crate::peer::{CallOptions, PeerCache};
use crate::proto::*;

pub use mailboxes::MasterMailboxes;
pub use state::{new_session_handle, MasterState, SessionParts, SessionSetup};

/// Creates a session (MasterService `CreateSession`).
#[derive(Debug, Message)]
#[rtype(result = "Result<CreateSessionResponse, Status>")]
pub struct CreateSession(pub CreateSessionRequest);

/// Adds nodes to a session's graph (MasterService `ExtendSession`).
#[derive(Debug, Message)]
#[rtype(result = "Result<ExtendSessionResponse, Status>")]
pub struct ExtendSession(pub ExtendSessionRequest);

/// Runs one step (MasterService `RunStep`).
#[derive(Debug, Message)]
#[rtype(result = "Result<RunStepResponse, Status>")]
pub struct RunStep(pub RunStepRequest);

/// Closes a session (MasterService `CloseSession`).
#[derive(Debug, Message)]
#[rtype(result = "Result<CloseSessionResponse, Status>")]
pub struct CloseSession(pub CloseSessionRequest);

/// Asks for the devices a client may place on (MasterService `ListDevices`).
#[derive(Debug, Message)]
#[rtype(result = "Result<ListDevicesResponse, Status>")]
pub struct ListDevices(pub ListDevicesRequest);

/// Closes every session and clears resource containers (MasterService `Reset`).
#[derive(Debug, Message)]
#[rtype(result = "Result<ResetResponse, Status>")]
pub struct Reset(pub ResetRequest);

/// Makes a callable (MasterService `MakeCallable`).
#[derive(Debug, Message)]
#[rtype(result = "Result<MakeCallableResponse, Status>")]
pub struct MakeCallable(pub MakeCallableRequest);

/// Runs a callable (MasterService `RunCallable`).
#[derive(Debug, Message)]
#[rtype(result = "Result<RunCallableResponse, Status>")]
pub struct RunCallable(pub RunCallableRequest);

/// Releases a callable (MasterService `ReleaseCallable`).
#[derive(Debug, Message)]
#[rtype(result = "Result<ReleaseCallableResponse, Status>")]
pub struct ReleaseCallable(pub ReleaseCallableRequest);

/// Sets up a partial run (MasterService `PartialRunSetup`): not supported.
#[derive(Debug, Message)]
#[rtype(result = "Result<PartialRunSetupResponse, Status>")]
pub struct PartialRunSetup(pub PartialRunSetupRequest);

/// The actor shell around [`MasterState`] and the session table.
pub struct Master {
    state: MasterState,
    peers: Arc<PeerCache>,
    sessions: HashMap<String, Addr<MasterSession>>,
    /// Sessions and steps in flight, against the limits.
    admission: Admission,
}

impl Master {
    /// A master over `state` reaching the cluster's tasks (its own included) through `peers`.
    pub fn new(state: MasterState, peers: Arc<PeerCache>) -> Self {
        let admission = Admission::new(state.task(), state.limits());
        Self {
            state,
            peers,
            sessions: HashMap::new(),
            admission,
        }
    }

    fn session(&self, handle: &str) -> Result<Addr<MasterSession>> {
        self.sessions
            .get(handle)
            .cloned()
            .ok_or_else(|| self.state.unknown_session(handle))
    }
}

impl Actor for Master {
    type Context = Context<Self>;

    fn started(&mut self, _ctx: &mut Self::Context) {
        tracing::debug!(task = %self.state.task(), "master started");
    }
}

/// Forwards `msg` to the session named `handle`.
fn forward<M, R>(master: &Master, handle: &str, msg: M) -> ResponseFuture<Result<R, Status>>
where
    M: Message<Result = Result<R, Status>> + Send + 'static,
    R: Send + 'static,
    MasterSession: Handler<M>,
{
    match master.session(handle) {
        Ok(addr) => {
            let session = format!("session {handle}");
            Box::pin(async move {
                addr.send(msg)
                    .await
                    .map_err(|e| mailbox_failure(e, &session))?
            })
        }
        Err(e) => Box::pin(std::future::ready(Err(e))),
    }
}

/// Forwards a step (RunStep, RunCallable) to the session named `handle` once admitted
/// against `limits.max_steps_in_flight`; the step's slot is held until it answers.
fn counted_step<M, R>(master: &Master, handle: &str, msg: M) -> ResponseFuture<Result<R, Status>>
where
    M: Message<Result = Result<R, Status>> + Send + 'static,
    R: Send + 'static,
    MasterSession: Handler<M>,
{
    let slot = match master.admission.start_step(handle) {
        Ok(slot) => slot,
        Err(e) => return Box::pin(std::future::ready(Err(e))),
    };
    let step = forward(master, handle, msg);
    Box::pin(async move {
        let result = step.await;
        drop(slot);
        result
    })
}

impl Handler<CreateSession> for Master {
    type Result = ResponseActFuture<Self, Result<CreateSessionResponse, Status>>;

    fn handle(&mut self, msg: CreateSession, _ctx: &mut Self::Context) -> Self::Result {
        let setup = match self.state.prepare_session(&msg.0) {
            Ok(setup) => setup,
            Err(e) => return Box::pin(actix::fut::ready(Err(e))),
        };
        if let Err(e) = self.admission.begin_create() {
            return Box::pin(actix::fut::ready(Err(e)));
        }
        let handle = new_session_handle();
        let peers = self.peers.clone();
        let state = self.state.clone();
        let SessionSetup {
            graph,
            config,
            filters,
            tasks,
            discovery_budget,
        } = setup;
        let found = {
            let handle = handle.clone();
            let config = config.clone();
            async move {
                let found = discover(&peers, &tasks, discovery_budget).await?;
                create_worker_sessions(&state, &found, &handle, &config, discovery_budget).await?;
                Ok::<_, Status>(found)
            }
        };
        Box::pin(found.into_actor(self).map(move |found, master, _ctx| {
            let found = match found {
                Ok(found) => found,
                Err(e) => {
                    master.admission.created(None);
                    return Err(e);
                }
            };
            let SessionParts {
                devices,
                context,
                listed,
            } = master
                .state
                .session_parts(&handle, &found, &filters, config);
            let rpc = master.state.timeouts().rpc;
            let session = MasterSession::new(graph, devices, context, listed, rpc).start();
            master.sessions.insert(handle.clone(), session);
            master.admission.created(Some(&handle));
            info!(session = %handle, tasks = found.len(), "start master session");
            Ok(CreateSessionResponse {
                session_handle: handle,
                graph_version: 0,
            })
        }))
    }
}

/// Creates the worker session on every found task, in parallel. On a failure the sessions
/// already created are deleted (best effort) and the failure is returned, naming the task.
async fn create_worker_sessions(
    state: &MasterState,
    found: &[FoundTask],
    handle: &str,
    config: &ConfigProto,
    budget: std::time::Duration,
) -> Result<()> {
    let options = CallOptions::timeout(budget);
    let calls = found.iter().map(|t| {
        let request = CreateWorkerSessionRequest {
            session_handle: handle.to_string(),
            server_def: Some(ServerDef {
                cluster: Some(state.cluster().to_cluster_def()),
                job_name: t.task.job.clone(),
                task_index: t.task.index as i32,
                default_session_config: Some(config.clone()),
                protocol: "grpc".into(),
                ..Default::default()
            }),
            isolate_session_state: config.isolate_session_state,
            master_task: state.task().device_prefix(),
            master_incarnation: state.incarnation(),
            ..Default::default()
        };
        t.peer.create_worker_session(request, options)
    });
    let replies = join_all(calls).await;
    let mut failure = None;
    let mut created = Vec::new();
    for (t, reply) in found.iter().zip(replies) {
        match reply {
            Ok(_) => created.push(t),
            Err(e) if failure.is_none() => {
                failure = Some(e.context(format!(
                    "CreateSession: CreateWorkerSession on {}",
                    t.task.device_prefix()
                )))
            }
            Err(_) => {}
        }
    }
    let Some(failure) = failure else {
        return Ok(());
    };
    let deletes = created.iter().map(|t| {
        let request = DeleteWorkerSessionRequest {
            session_handle: handle.to_string(),
        };
        t.peer.delete_worker_session(request, options)
    });
    for (t, reply) in created.iter().zip(join_all(deletes).await) {
        if let Err(e) = reply {
            warn!(task = %t.task.device_prefix(), error = %e, "delete worker session failed");
        }
    }
    Err(failure)
}

impl Handler<ExtendSession> for Master {
    type Result = ResponseFuture<Result<ExtendSessionResponse, Status>>;

    fn handle(&mut self, msg: ExtendSession, _ctx: &mut Self::Context) -> Self::Result {
        if let Some(graph) = &msg.0.graph_def {
            let checked = self
                .state
                .limits()
                .check_graph("ExtendSession: the graph", graph);
            if let Err(e) = checked {
                return Box::pin(std::future::ready(Err(e)));
            }
        }
        let handle = msg.0.session_handle.clone();
        forward(self, &handle, msg)
    }
}

impl Handler<RunStep> for Master {
    type Result = ResponseFuture<Result<RunStepResponse, Status>>;

    fn handle(&mut self, msg: RunStep, _ctx: &mut Self::Context) -> Self::Result {
        let in_body = msg.0.store_errors_in_response_body;
        let handle = msg.0.session_handle.clone();
        let feeds = msg.0.feed.iter().filter_map(|f| f.tensor.as_ref());
        let step = match self
            .state
            .limits()
            .check_request_tensors("RunStep: the feeds", feeds)
        {
            Ok(()) => counted_step(self, &handle, msg),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        };
        Box::pin(async move {
            match step.await {
                Err(e) if in_body => Ok(RunStepResponse {
                    status_code: e.code() as i32,
                    status_error_message: e.message().to_string(),
                    ..Default::default()
                }),
                other => other,
            }
        })
    }
}

impl Handler<CloseSession> for Master {
    type Result = ResponseFuture<Result<CloseSessionResponse, Status>>;

    fn handle(&mut self, msg: CloseSession, _ctx: &mut Self::Context) -> Self::Result {
        let handle = msg.0.session_handle.clone();
        let closing = forward(self, &handle, msg);
        self.sessions.remove(&handle);
        self.admission.closed(&handle);
        closing
    }
}

impl Handler<ListDevices> for Master {
    type Result = ResponseFuture<Result<ListDevicesResponse, Status>>;

    fn handle(&mut self, msg: ListDevices, _ctx: &mut Self::Context) -> Self::Result {
        if !msg.0.session_handle.is_empty() {
            let handle = msg.0.session_handle.clone();
            return forward(self, &handle, msg);
        }
        let state = self.state.clone();
        let peers = self.peers.clone();
        Box::pin(async move {
            let local = peers.get(state.task())?;
            let status = local
                .get_status(
                    GetStatusRequest {},
                    CallOptions::timeout(state.timeouts().rpc),
                )
                .await?;
            Ok(state.list_devices(status))
        })
    }
}

impl Handler<Reset> for Master {
    type Result = ResponseFuture<Result<ResetResponse, Status>>;

    fn handle(&mut self, msg: Reset, _ctx: &mut Self::Context) -> Self::Result {
        let sessions: Vec<_> = self.sessions.drain().collect();
        self.admission.closed_all();
        let state = self.state.clone();
        let peers = self.peers.clone();
        Box::pin(async move {
            let closes = sessions.into_iter().map(|(handle, addr)| async move {
                let request = CloseSessionRequest {
                    session_handle: handle.clone(),
                };
                match addr.send(CloseSession(request)).await {
                    Ok(Ok(_)) | Err(_) => {}
                    Ok(Err(e)) => warn!(session = %handle, error = %e, "reset: close failed"),
                }
            });
            join_all(closes).await;
            let filters = discovery::parse_filters(&msg.0.device_filters)?;
            let tasks = target_tasks(state.cluster(), state.task(), &filters);
            let options = CallOptions::timeout(state.timeouts().create_session);
            let mut calls = Vec::with_capacity(tasks.len());
            for task in &tasks {
                let peer = peers.get(task)?;
                let request = CleanupAllRequest {
                    container: msg.0.container.clone(),
                };
                calls.push(async move { peer.cleanup_all(request, options).await });
            }
            let failed: Vec<String> = tasks
                .iter()
                .zip(join_all(calls).await)
                .filter_map(|(task, reply)| {
                    reply
                        .err()
                        .map(|e| format!("{}: {}", task.device_prefix(), e.message()))
                })
                .collect();
            if failed.is_empty() {
                Ok(ResetResponse {})
            } else {
                Err(Status::unavailable(format!(
                    "Reset: sessions closed, but containers could not be cleared on {}; run \
                     Reset again once the tasks are back, or set device_filters to skip them",
                    failed.join("; ")
                )))
            }
        })
    }
}

impl Handler<MakeCallable> for Master {
    type Result = ResponseFuture<Result<MakeCallableResponse, Status>>;

    fn handle(&mut self, msg: MakeCallable, _ctx: &mut Self::Context) -> Self::Result {
        let handle = msg.0.session_handle.clone();
        forward(self, &handle, msg)
    }
}

impl Handler<RunCallable> for Master {
    type Result = ResponseFuture<Result<RunCallableResponse, Status>>;

    fn handle(&mut self, msg: RunCallable, _ctx: &mut Self::Context) -> Self::Result {
        let handle = msg.0.session_handle.clone();
        if let Err(e) = self
            .state
            .limits()
            .check_request_tensors("RunCallable: the feeds", &msg.0.feed)
        {
            return Box::pin(std::future::ready(Err(e)));
        }
        counted_step(self, &handle, msg)
    }
}

impl Handler<ReleaseCallable> for Master {
    type Result = ResponseFuture<Result<ReleaseCallableResponse, Status>>;

    fn handle(&mut self, msg: ReleaseCallable, _ctx: &mut Self::Context) -> Self::Result {
        let handle = msg.0.session_handle.clone();
        forward(self, &handle, msg)
    }
}

impl Handler<PartialRunSetup> for Master {
    type Result = Result<PartialRunSetupResponse, Status>;

    fn handle(&mut self, _msg: PartialRunSetup, _ctx: &mut Self::Context) -> Self::Result {
        Err(partial_runs_unsupported())
    }
}
