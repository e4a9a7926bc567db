//! `MasterSession`: one actor per client session, created by the [`Master`](super::Master) at
//! CreateSession and stopped at CloseSession or Reset.
//!
//! It owns the session's graph ([`graph::SessionGraph`]), the devices and peers found at
//! creation, and a cache of registered partitions per run signature, each registered once
//! (a `OnceCell` per signature: concurrent first steps wait for one registration). Steps run as
//! futures outside the actor ([`step::run_step`]), so several steps of one session run at once
//! and a slow step never blocks ExtendSession or CloseSession.
//!
//! Close: later steps are refused, running steps are cancelled and waited for (with a
//! deadline), every registered partition is deregistered and every task's worker session
//! deleted (errors only logged), then the actor stops.

pub mod graph;
pub mod step;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::{
    Actor, ActorContext, ActorFutureExt, Context, Handler, ResponseActFuture, ResponseFuture,
    WrapFuture,
};
use tokio::sync::{watch, OnceCell};
use tracing::{debug, warn};

use self::graph::{canonical, DeviceSet, SessionGraph, Signature};
use self::step::{
    deregister, new_step_id, register, run_step, step_deadline, Registered, SessionContext,
    StepOutput, StepTrace,
};
use super::{
    CloseSession, ExtendSession, ListDevices, MakeCallable, ReleaseCallable, RunCallable, RunStep,
};
use crate::error::{Result, Status};
use crate::peer::CallOptions;
use crate::proto::{
    CloseSessionResponse, DeleteWorkerSessionRequest, ExtendSessionResponse, ListDevicesResponse,
    MakeCallableResponse, NamedTensorProto, ReleaseCallableResponse, RunCallableResponse,
    RunStepResponse, TensorProto,
};

/// How long close waits for running steps to notice the cancellation.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// How long DeregisterGraph and DeleteWorkerSession may take at close (TensorFlow: 10 s).
const CLOSE_RPC: Duration = Duration::from_secs(10);

/// A callable: a signature, the order its feeds arrive in and what its runs record.
struct Callable {
    feeds: Vec<String>,
    signature: Signature,
    trace: StepTrace,
}

/// The actor shell around a session's graph, devices and caches.
pub struct MasterSession {
    graph: SessionGraph,
    devices: DeviceSet,
    context: Arc<SessionContext>,
    /// This task's devices and the others', for ListDevices.
    listed: ListDevicesResponse,
    /// Deadline of calls with no timeout of their own (RegisterGraph, steps without one).
    rpc_timeout: Duration,
    cache: HashMap<Signature, Arc<OnceCell<Arc<Registered>>>>,
    callables: HashMap<i64, Callable>,
    next_callable: i64,
    closed: bool,
    /// Set once, at close: running steps stop with this reason.
    cancel: watch::Sender<Option<Status>>,
    /// How many steps are running.
    running: Arc<watch::Sender<usize>>,
}

/// Counts a step as running until dropped.
struct Running(Arc<watch::Sender<usize>>);

impl Running {
    fn new(counter: &Arc<watch::Sender<usize>>) -> Self {
        counter.send_modify(|n| *n += 1);
        Self(counter.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl MasterSession {
    /// A session over a validated graph, the devices and peers CreateSession found, and the
    /// session's split of those devices for ListDevices.
    pub fn new(
        graph: SessionGraph,
        devices: DeviceSet,
        context: SessionContext,
        listed: ListDevicesResponse,
        rpc_timeout: Duration,
    ) -> Self {
        Self {
            graph,
            devices,
            context: Arc::new(context),
            listed,
            rpc_timeout,
            cache: HashMap::new(),
            callables: HashMap::new(),
            next_callable: 0,
            closed: false,
            cancel: watch::channel(None).0,
            running: Arc::new(watch::channel(0).0),
        }
    }

    fn check_open(&self) -> Result<()> {
        if self.closed {
            return Err(Status::failed_precondition(
                "Session is closed; create a new session to run more steps",
            ));
        }
        Ok(())
    }

    /// Everything a step does before its first RPC: checks, the cached registration cell and,
    /// when nothing is registered yet, the plan to register.
    fn prepare(&mut self, signature: Signature) -> Result<PreparedStep> {
        let cell = self.cache.entry(signature.clone()).or_default().clone();
        let plan = match cell.get() {
            Some(_) => None,
            None => Some(self.graph.plan(&signature, &self.devices)?),
        };
        Ok(PreparedStep {
            cell,
            plan,
            context: self.context.clone(),
            register_options: CallOptions::timeout(self.rpc_timeout),
            cancel: self.cancel.subscribe(),
            running: Running::new(&self.running),
        })
    }

    /// Starts a step: returns the future that registers (if needed) and runs it, recording
    /// what `trace` asks for.
    fn start_step(
        &mut self,
        signature: Signature,
        feeds: HashMap<String, TensorProto>,
        trace: StepTrace,
        options: CallOptions,
    ) -> Result<impl std::future::Future<Output = Result<StepOutput>>> {
        self.check_open()?;
        let prepared = self.prepare(signature)?;
        Ok(async move {
            let PreparedStep {
                cell,
                plan,
                context,
                register_options,
                cancel,
                running: _running,
            } = prepared;
            let registered = cell
                .get_or_try_init(|| async {
                    let plan = plan.ok_or_else(|| {
                        Status::unavailable(
                            "another step registering this signature failed; run the step again",
                        )
                    })?;
                    register(&plan, &context, register_options)
                        .await
                        .map(Arc::new)
                })
                .await?
                .clone();
            run_step(
                &registered,
                &context,
                new_step_id(),
                &feeds,
                trace,
                options,
                cancel,
            )
            .await
        })
    }
}

struct PreparedStep {
    cell: Arc<OnceCell<Arc<Registered>>>,
    plan: Option<graph::Plan>,
    context: Arc<SessionContext>,
    register_options: CallOptions,
    cancel: watch::Receiver<Option<Status>>,
    running: Running,
}

impl Actor for MasterSession {
    type Context = Context<Self>;

    fn started(&mut self, _ctx: &mut Self::Context) {
        debug!(session = %self.context.handle, tasks = self.context.peers.len(), "master session started");
    }
}

impl Handler<ExtendSession> for MasterSession {
    type Result = Result<ExtendSessionResponse, Status>;

    fn handle(&mut self, msg: ExtendSession, _ctx: &mut Self::Context) -> Self::Result {
        self.check_open()?;
        let nodes = msg.0.graph_def.unwrap_or_default();
        let version = self.graph.extend(&nodes, msg.0.current_graph_version)?;
        Ok(ExtendSessionResponse {
            new_graph_version: version,
        })
    }
}

impl Handler<RunStep> for MasterSession {
    type Result = ResponseFuture<Result<RunStepResponse, Status>>;

    fn handle(&mut self, msg: RunStep, _ctx: &mut Self::Context) -> Self::Result {
        let request = msg.0;
        let started = (|| {
            if !request.partial_run_handle.is_empty() {
                return Err(partial_runs_unsupported());
            }
            let names: Vec<String> = request.feed.iter().map(|f| f.name.clone()).collect();
            let signature = Signature::new(&names, &request.fetch, &request.target)?;
            let dtypes: Vec<(&str, i32)> = request
                .feed
                .iter()
                .map(|f| (f.name.as_str(), f.tensor.as_ref().map_or(0, |t| t.dtype)))
                .collect();
            self.graph.check_step(&signature, &dtypes)?;
            let mut feeds = HashMap::with_capacity(request.feed.len());
            for feed in &request.feed {
                feeds.insert(
                    canonical(&feed.name, "feed")?,
                    feed.tensor.clone().unwrap_or_default(),
                );
            }
            let options = step_deadline(
                request.options.as_ref().map_or(0, |o| o.timeout_in_ms),
                self.context.config.operation_timeout_in_ms,
                self.rpc_timeout,
            );
            let trace = StepTrace::from_options(request.options.as_ref());
            self.start_step(signature, feeds, trace, options)
        })();
        let fetch_names = request.fetch;
        Box::pin(async move {
            let StepOutput { fetched, metadata } = started?.await?;
            let mut tensor = Vec::with_capacity(fetch_names.len());
            for name in fetch_names {
                // Answered under the name the client used; a tensor fetched twice, twice.
                let value = fetched.get(&canonical(&name, "fetch")?).cloned();
                tensor.push(NamedTensorProto {
                    name,
                    tensor: Some(value.unwrap_or_default()),
                });
            }
            Ok(RunStepResponse {
                tensor,
                metadata: Some(metadata),
                ..Default::default()
            })
        })
    }
}

impl Handler<MakeCallable> for MasterSession {
    type Result = Result<MakeCallableResponse, Status>;

    fn handle(&mut self, msg: MakeCallable, _ctx: &mut Self::Context) -> Self::Result {
        self.check_open()?;
        let options = msg.0.options.unwrap_or_default();
        if !options.tensor_connection.is_empty() {
            return Err(Status::unimplemented(
                "CallableOptions.tensor_connection is not supported; feed the tensor instead",
            ));
        }
        let signature = Signature::new(&options.feed, &options.fetch, &options.target)?;
        self.graph.check_step(&signature, &[])?;
        let feeds = options
            .feed
            .iter()
            .map(|f| canonical(f, "feed"))
            .collect::<Result<_>>()?;
        let handle = self.next_callable;
        self.next_callable += 1;
        let trace = StepTrace::from_options(options.run_options.as_ref());
        self.callables.insert(
            handle,
            Callable {
                feeds,
                signature,
                trace,
            },
        );
        Ok(MakeCallableResponse { handle })
    }
}

impl Handler<RunCallable> for MasterSession {
    type Result = ResponseFuture<Result<RunCallableResponse, Status>>;

    fn handle(&mut self, msg: RunCallable, _ctx: &mut Self::Context) -> Self::Result {
        let request = msg.0;
        let started = (|| {
            self.check_open()?;
            let callable = self.callables.get(&request.handle).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "No such callable handle: {}; make it with MakeCallable (released handles \
                     are gone)",
                    request.handle
                ))
            })?;
            if request.feed.len() != callable.feeds.len() {
                return Err(Status::invalid_argument(format!(
                    "callable {} takes {} feeds, {} given",
                    request.handle,
                    callable.feeds.len(),
                    request.feed.len()
                )));
            }
            let dtypes: Vec<(&str, i32)> = callable
                .feeds
                .iter()
                .zip(&request.feed)
                .map(|(n, t)| (n.as_str(), t.dtype))
                .collect();
            self.graph.check_step(&callable.signature, &dtypes)?;
            let feeds = callable.feeds.iter().cloned().zip(request.feed).collect();
            let fetches = callable.signature.fetches.clone();
            let signature = callable.signature.clone();
            let trace = callable.trace;
            let options = step_deadline(
                0,
                self.context.config.operation_timeout_in_ms,
                self.rpc_timeout,
            );
            Ok((fetches, self.start_step(signature, feeds, trace, options)?))
        })();
        Box::pin(async move {
            let (fetches, step) = started?;
            let StepOutput { fetched, metadata } = step.await?;
            let fetch = fetches
                .iter()
                .map(|name| fetched.get(name).cloned().unwrap_or_default())
                .collect();
            Ok(RunCallableResponse {
                fetch,
                metadata: Some(metadata),
            })
        })
    }
}

impl Handler<ReleaseCallable> for MasterSession {
    type Result = Result<ReleaseCallableResponse, Status>;

    fn handle(&mut self, msg: ReleaseCallable, _ctx: &mut Self::Context) -> Self::Result {
        self.check_open()?;
        self.callables.remove(&msg.0.handle);
        Ok(ReleaseCallableResponse {})
    }
}

impl Handler<ListDevices> for MasterSession {
    type Result = Result<ListDevicesResponse, Status>;

    fn handle(&mut self, _msg: ListDevices, _ctx: &mut Self::Context) -> Self::Result {
        self.check_open()?;
        Ok(self.listed.clone())
    }
}

impl Handler<CloseSession> for MasterSession {
    type Result = ResponseActFuture<Self, Result<CloseSessionResponse, Status>>;

    fn handle(&mut self, _msg: CloseSession, _ctx: &mut Self::Context) -> Self::Result {
        self.closed = true;
        self.callables.clear();
        let _ = self.cancel.send(Some(Status::cancelled(
            "Step was cancelled by an explicit call to `Session::Close()`",
        )));
        let mut running = self.running.subscribe();
        let context = self.context.clone();
        let graphs: Vec<Arc<Registered>> = self
            .cache
            .drain()
            .filter_map(|(_, cell)| cell.get().cloned())
            .collect();
        let close = async move {
            if tokio::time::timeout(CLOSE_WAIT, running.wait_for(|n| *n == 0))
                .await
                .is_err()
            {
                warn!(session = %context.handle, "steps still running after close, not waiting longer");
            }
            let options = CallOptions::timeout(CLOSE_RPC);
            futures::future::join_all(
                graphs
                    .iter()
                    .map(|g| deregister(g, &context.handle, options)),
            )
            .await;
            let deletes = context.peers.values().map(|peer| {
                let request = DeleteWorkerSessionRequest {
                    session_handle: context.handle.clone(),
                };
                async move {
                    if let Err(e) = peer.delete_worker_session(request, options).await {
                        warn!(task = %peer.task().device_prefix(), error = %e, "delete worker session failed");
                    }
                }
            });
            futures::future::join_all(deletes).await;
            debug!(session = %context.handle, "master session closed");
            Ok(CloseSessionResponse {})
        };
        Box::pin(close.into_actor(self).map(|result, _session, ctx| {
            ctx.stop();
            result
        }))
    }
}

/// UNIMPLEMENTED for partial runs, which tessera's master does not serve.
pub fn partial_runs_unsupported() -> Status {
    Status::unimplemented(
        "partial runs (PartialRunSetup / RunStep with partial_run_handle) are not supported by \
         tessera; feed and fetch everything in one run() instead",
    )
}
