//! Driving a signature's partitions on their tasks: registering them once, running one step,
//! cleaning up after it, deregistering them at close. Plain async functions over
//! [`Peer`]s, so tests drive them with simulated peers and paused time.
//!
//! A step (reference §5.5):
//!
//! ```text
//!   RunGraph(step_id) ──► every partition's task, in parallel, under one deadline
//!        │  the master's own partition gets the feeds (`send`, by rendezvous key)
//!        │  and names the fetches (`recv_key`)
//!        ├─ all answer OK ─► fetches mapped back to their names
//!        └─ the first failure (RPC error or status in the body) ─► the other calls are
//!           dropped (which cancels them) and that failure is the step's error; a CANCELLED
//!           first failure waits briefly for the root cause it was probably caused by
//!   then CleanupGraph(step_id) ──► every partition's task, fire and forget
//! ```
//!
//! A traced step (`RunOptions.trace_level`, [`StepTrace`]) asks every task to record its
//! timeline (`exec_opts.record_timeline`, `record_costs`) and merges the `DeviceStepStats` the
//! tasks return into one `StepStats`; `output_partition_graphs` asks for the graphs each
//! device ran. An untraced step sends default `exec_opts` and merges nothing.
//!
//! When a task fails a step, the master asks it for GetStatus: a task whose incarnation changed
//! since the session started has restarted and lost the session's graphs and variables, which
//! the client hears as ABORTED (TensorFlow's "recreate the session" code).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::watch;
use tracing::{debug, warn};

use super::graph::Plan;
use crate::cluster::TaskId;
use crate::error::{Code, Result, Status};
use crate::peer::{CallOptions, Peer};
use crate::proto::{
    CleanupGraphRequest, ConfigProto, DeregisterGraphRequest, ExecutorOpts, GetStatusRequest,
    GraphOptions, NamedTensorProto, RegisterGraphRequest, RunGraphRequest, RunMetadata, RunOptions,
    StepStats, TensorProto,
};

/// How long a CANCELLED first failure waits for the error that caused it.
const ROOT_CAUSE_GRACE: Duration = Duration::from_secs(1);

/// How long the restart check after a failed step may take.
const RESTART_CHECK: Duration = Duration::from_secs(5);

/// One registered partition: where it runs and what it trades with the client.
#[derive(Clone)]
pub struct RegisteredPartition {
    /// The task running it.
    pub task: TaskId,
    /// That task's peer.
    pub peer: Arc<dyn Peer>,
    /// The handle RegisterGraph answered.
    pub graph_handle: String,
    /// (canonical feed name, rendezvous key).
    pub feeds: Vec<(String, String)>,
    /// (canonical fetch name, rendezvous key).
    pub fetches: Vec<(String, String)>,
}

/// A signature's partitions, registered on their tasks.
#[derive(Clone)]
pub struct Registered {
    /// One per task the signature touches.
    pub partitions: Vec<RegisteredPartition>,
}

/// The session-wide facts every call of a step needs.
#[derive(Clone)]
pub struct SessionContext {
    /// The master session's handle, as the workers know it.
    pub handle: String,
    /// Peers of the session's tasks.
    pub peers: HashMap<TaskId, Arc<dyn Peer>>,
    /// Each task's incarnation at session creation (its `CPU:0`, or first device).
    pub incarnations: HashMap<TaskId, u64>,
    /// The session's config, sent with every RegisterGraph.
    pub config: ConfigProto,
}

impl SessionContext {
    fn peer(&self, task: &TaskId) -> Result<Arc<dyn Peer>> {
        self.peers.get(task).cloned().ok_or_else(|| {
            Status::invalid_argument(format!(
                "the graph places nodes on {}, which is not one of this session's tasks; \
                 check the node devices against the cluster and the session's device_filters",
                task.device_prefix()
            ))
        })
    }
}

/// Registers every partition of `plan` on its task, in parallel, within `options`. On failure
/// the partitions already registered are deregistered (best effort) and the first error is
/// returned, naming the task.
pub async fn register(
    plan: &Plan,
    session: &SessionContext,
    options: CallOptions,
) -> Result<Registered> {
    let mut calls = FuturesUnordered::new();
    for (i, part) in plan.partitions.iter().enumerate() {
        let peer = session.peer(&part.task)?;
        let request = RegisterGraphRequest {
            session_handle: session.handle.clone(),
            create_worker_session_called: true,
            graph_def: Some(part.graph.clone()),
            graph_options: Some(GraphOptions::default()),
            config_proto: Some(session.config.clone()),
            ..Default::default()
        };
        calls.push(async move {
            let reply = peer.register_graph(request, options).await;
            (i, peer, reply)
        });
    }
    let mut done: Vec<Option<RegisteredPartition>> = vec![None; plan.partitions.len()];
    let mut failure = None;
    while let Some((i, peer, reply)) = calls.next().await {
        let part = &plan.partitions[i];
        match reply {
            Ok(reply) => {
                done[i] = Some(RegisteredPartition {
                    task: part.task.clone(),
                    peer,
                    graph_handle: reply.graph_handle,
                    feeds: part.feeds.clone(),
                    fetches: part.fetches.clone(),
                });
            }
            Err(e) => {
                let e = e.context(format!(
                    "RegisterGraph of the partition for {}",
                    part.task.device_prefix()
                ));
                failure = Some(explain_restart(session, &part.task, e).await);
                break;
            }
        }
    }
    drop(calls);
    let partitions: Vec<_> = done.into_iter().flatten().collect();
    if let Some(e) = failure {
        deregister(
            &Registered { partitions },
            &session.handle,
            CallOptions::timeout(options.budget()),
        )
        .await;
        return Err(e);
    }
    Ok(Registered { partitions })
}

/// Deregisters every partition of `graph`, in parallel, within `options`; errors are logged.
pub async fn deregister(graph: &Registered, session_handle: &str, options: CallOptions) {
    let calls = graph.partitions.iter().map(|part| {
        let request = DeregisterGraphRequest {
            session_handle: session_handle.to_string(),
            create_worker_session_called: true,
            graph_handle: part.graph_handle.clone(),
        };
        async move {
            if let Err(e) = part.peer.deregister_graph(request, options).await {
                warn!(task = %part.task.device_prefix(), error = %e, "deregister graph failed");
            }
        }
    });
    futures::future::join_all(calls).await;
}

/// A fresh step id: random, with the top 7 bits clear as TensorFlow's master does.
pub fn new_step_id() -> i64 {
    (rand::random::<u64>() >> 7) as i64
}

/// What a step records besides its fetches, from the client's `RunOptions`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepTrace {
    /// Each node's times, thread and outputs (any `trace_level` above `NO_TRACE`: software,
    /// hardware and full traces are one here).
    pub timeline: bool,
    /// The graphs each device ran (`output_partition_graphs`).
    pub partition_graphs: bool,
}

impl StepTrace {
    /// What `options` asks for; nothing when there are none.
    pub fn from_options(options: Option<&RunOptions>) -> Self {
        options.map_or_else(Self::default, |o| Self {
            timeline: o.trace_level > 0,
            partition_graphs: o.output_partition_graphs,
        })
    }

    /// The executor options each partition's RunGraph carries.
    fn exec_opts(self) -> ExecutorOpts {
        ExecutorOpts {
            record_costs: self.timeline,
            record_timeline: self.timeline,
            record_partition_graphs: self.partition_graphs,
            ..Default::default()
        }
    }
}

/// A finished step: the fetches by canonical name and what the step recorded.
#[derive(Debug, Default)]
pub struct StepOutput {
    /// The fetched tensors, by canonical name.
    pub fetched: HashMap<String, TensorProto>,
    /// The merged step stats and partition graphs of every task, as far as the step's
    /// [`StepTrace`] asked; empty otherwise.
    pub metadata: RunMetadata,
}

/// Runs one step of `graph`: feeds by canonical name, returns fetches by canonical name and,
/// when `trace` asks, the step's stats and partition graphs from every task.
/// Fails with the first partition's failure (see the module docs), or with the reason sent on
/// `cancel` (session closed) as soon as it arrives. CleanupGraph goes out either way.
#[allow(clippy::too_many_arguments)]
pub async fn run_step(
    graph: &Registered,
    session: &SessionContext,
    step_id: i64,
    feeds: &HashMap<String, TensorProto>,
    trace: StepTrace,
    options: CallOptions,
    mut cancel: watch::Receiver<Option<Status>>,
) -> Result<StepOutput> {
    let mut calls = FuturesUnordered::new();
    for (i, part) in graph.partitions.iter().enumerate() {
        let mut send = Vec::with_capacity(part.feeds.len());
        for (name, key) in &part.feeds {
            let tensor = feeds.get(name).cloned().ok_or_else(|| {
                Status::invalid_argument(format!("feed `{name}` expected but not fed"))
            })?;
            send.push(NamedTensorProto {
                name: key.clone(),
                tensor: Some(tensor),
            });
        }
        let request = RunGraphRequest {
            session_handle: session.handle.clone(),
            create_worker_session_called: true,
            graph_handle: part.graph_handle.clone(),
            step_id,
            exec_opts: Some(trace.exec_opts()),
            send,
            recv_key: part.fetches.iter().map(|(_, key)| key.clone()).collect(),
            store_errors_in_response_body: true,
            ..Default::default()
        };
        let peer = part.peer.clone();
        calls.push(async move { (i, peer.run_graph(request, options).await) });
    }

    let mut fetched = HashMap::new();
    let mut metadata = RunMetadata::default();
    let mut cancelled_first: Option<(Status, Option<TaskId>)> = None;
    let mut failure: Option<(Status, Option<TaskId>)> = None;
    // Armed only when a CANCELLED failure arrives first (a timer armed every step would cost
    // the runtime a wake-up).
    let mut grace: Option<Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        tokio::select! {
            next = calls.next() => {
                let Some((i, reply)) = next else { break };
                let part = &graph.partitions[i];
                let outcome = reply.and_then(|resp| {
                    if let Some(e) = Status::from_body(resp.status_code, &resp.status_error_message) {
                        return Err(Status::new(
                            e.code(),
                            format!("From {}:\n{}", part.task.device_prefix(), e.message()),
                        ));
                    }
                    if trace.timeline {
                        merge_step_stats(&mut metadata, resp.step_stats.unwrap_or_default());
                    }
                    if trace.partition_graphs {
                        metadata.partition_graphs.extend(resp.partition_graph);
                    }
                    Ok(resp.recv)
                });
                match outcome {
                    Ok(recv) => {
                        let names: HashMap<&str, &str> = part
                            .fetches
                            .iter()
                            .map(|(name, key)| (key.as_str(), name.as_str()))
                            .collect();
                        for tensor in recv {
                            if let Some(name) = names.get(tensor.name.as_str()) {
                                fetched.insert(name.to_string(), tensor.tensor.unwrap_or_default());
                            }
                        }
                    }
                    Err(e) if e.code() == Code::Cancelled && cancelled_first.is_none() => {
                        // Likely caused by another partition's failure: give it a moment.
                        cancelled_first = Some((e, Some(part.task.clone())));
                        grace = Some(Box::pin(tokio::time::sleep(ROOT_CAUSE_GRACE)));
                    }
                    Err(e) if e.code() == Code::Cancelled => {}
                    Err(e) => {
                        failure = Some((e, Some(part.task.clone())));
                        break;
                    }
                }
            }
            _ = async { grace.as_mut().expect("armed").await }, if grace.is_some() => break,
            reason = cancel.wait_for(Option::is_some) => {
                let reason = reason
                    .ok()
                    .and_then(|r| r.clone())
                    .unwrap_or_else(|| Status::cancelled("step cancelled: the session went away"));
                failure = Some((reason, None));
                break;
            }
        }
    }
    // Dropping the outstanding calls cancels them on their tasks.
    drop(calls);
    cleanup(graph, step_id, options);
    let failure = failure.or(cancelled_first);
    if let Some((e, task)) = failure {
        debug!(step_id, error = %e, "step failed");
        return Err(match task {
            Some(task) => explain_restart(session, &task, e).await,
            None => e,
        });
    }
    for part in &graph.partitions {
        for (name, _) in &part.fetches {
            if !fetched.contains_key(name) {
                return Err(Status::internal(format!(
                    "{} finished the step without returning fetch `{name}`",
                    part.task.device_prefix()
                )));
            }
        }
    }
    if trace.timeline {
        let stats = metadata.step_stats.get_or_insert_with(StepStats::default);
        stats.dev_stats.sort_by(|a, b| a.device.cmp(&b.device));
    }
    Ok(StepOutput { fetched, metadata })
}

/// Adds one task's step stats to the step's: each device's entry as the task sent it (a
/// device reported twice, which one task never does, has its nodes joined).
fn merge_step_stats(metadata: &mut RunMetadata, task: StepStats) {
    let merged = metadata.step_stats.get_or_insert_with(StepStats::default);
    for device in task.dev_stats {
        match merged
            .dev_stats
            .iter_mut()
            .find(|d| d.device == device.device)
        {
            Some(known) => {
                known.node_stats.extend(device.node_stats);
                known.thread_names.extend(device.thread_names);
            }
            None => merged.dev_stats.push(device),
        }
    }
}

/// Sends CleanupGraph(step_id) to every partition's task without waiting; errors are logged.
fn cleanup(graph: &Registered, step_id: i64, options: CallOptions) {
    // The step's deadline may be spent; cleanup gets its own short one.
    let options = CallOptions::timeout(
        options
            .budget()
            .clamp(Duration::from_secs(1), Duration::from_secs(10)),
    );
    for part in &graph.partitions {
        let peer = part.peer.clone();
        let task = part.task.clone();
        tokio::spawn(async move {
            if let Err(e) = peer
                .cleanup_graph(CleanupGraphRequest { step_id }, options)
                .await
            {
                warn!(task = %task.device_prefix(), step_id, error = %e, "cleanup partition error");
            }
        });
    }
}

/// Turns a task's failure into ABORTED when the task has restarted since the session began
/// (its incarnation changed): its graphs and variables are gone, so the client must recreate
/// the session. Other failures are returned as they are.
async fn explain_restart(session: &SessionContext, task: &TaskId, error: Status) -> Status {
    let (Some(&known), Some(peer)) = (session.incarnations.get(task), session.peers.get(task))
    else {
        return error;
    };
    let Ok(status) = peer
        .get_status(GetStatusRequest {}, CallOptions::timeout(RESTART_CHECK))
        .await
    else {
        return error;
    };
    match status.device_attributes.first() {
        Some(device) if device.incarnation != known => Status::aborted(format!(
            "{} has restarted (incarnation {known:016x}, now {:016x}) and lost this session's \
             graphs and variables; recreate the session. The step failed with: {error}",
            task.device_prefix(),
            device.incarnation
        )),
        _ => error,
    }
}

/// The deadline of a step: the request's `timeout_in_ms`, else the session's
/// `operation_timeout_in_ms`, else `fallback`.
pub fn step_deadline(request_ms: i64, session_ms: i64, fallback: Duration) -> CallOptions {
    let budget = [request_ms, session_ms]
        .into_iter()
        .find(|&ms| ms > 0)
        .map(|ms| Duration::from_millis(ms as u64))
        .unwrap_or(fallback);
    CallOptions::timeout(budget)
}
