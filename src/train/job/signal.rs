//! How a job ends: the chief tells every task that training is over, through the runtime.
//!
//! Each task has a `FIFOQueueV2` shared as [`DONE_QUEUE`] on its own CPU. A ps, and a worker
//! that finished its steps, watch their own queue through their own server: a dequeue with a
//! bounded wait ([`POLL`]), again and again. When the chief is done (its final checkpoint
//! written) it closes every task's queue; the next dequeue there fails with OUT_OF_RANGE,
//! which is the signal, and the task's process exits 0. A closed queue stays closed, so a
//! task that looks only later (it was busy, or its watcher reconnected) still sees it.
//!
//! Until then a ps keeps serving, whatever else happens: a chief that failed may be restarted
//! and restore from its checkpoint. SIGTERM still ends any task.
//!
//! The other way round, each worker that finished its last step enqueues its index into the
//! chief's [`FINISHED_QUEUE`]; the chief waits for them a bounded time before its final save,
//! so the checkpoint holds their last updates, and then goes on without the ones that did not
//! answer (a dead or slow worker must not keep the job from ending).
//!
//! Under Kubeflow's sparse `TF_CONFIG` (dynamic workers) the chief does not know the other
//! workers, nor they the chief: they meet on ps 0, which everyone knows. Such a worker enqueues
//! its index into ps 0's [`UNLISTED_STARTED`] once its session is open and into
//! [`UNLISTED_FINISHED`] after its last step, then exits by itself; the chief, before its final
//! save, waits (bounded) until as many have finished there as started.
//!
//! Every signal has a graph of its own, run in a session of its own on the task's master,
//! apart from the training graph.

use std::time::{Duration, Instant};

use crate::client::{ConnectOptions, Session};
use crate::cluster::{ReplicaConfig, TaskId};
use crate::error::{Code, Result, Status};
use crate::graph::attr::value;
use crate::graph::{Graph, NodeSpec, Output};
use crate::peer::failover::ask_replica_status as ask_status;
use crate::proto::replica::{ReplicaStatusRequest, Role};
use crate::security::Security;
use crate::tensor::{DType, PartialShape, Tensor};

/// The shared name of every task's "training is over" queue.
pub const DONE_QUEUE: &str = "tessera_training_done";
/// The shared name of the chief's "this worker finished" queue.
pub const FINISHED_QUEUE: &str = "tessera_workers_finished";
/// The shared names of ps 0's queues where workers the chief does not know (a sparse
/// `TF_CONFIG`) say that they train, and that they took their last step.
pub const UNLISTED_STARTED: &str = "tessera_unlisted_workers_started";
pub const UNLISTED_FINISHED: &str = "tessera_unlisted_workers_finished";
/// How long one dequeue waits before the watcher asks again.
pub const POLL: Duration = Duration::from_secs(2);
/// How long one signal call may take in all (connection, step).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The CPU of `task`, where its queues live.
fn cpu(task: &TaskId) -> String {
    format!("{}/device:CPU:0", task.device_prefix())
}

/// Adds the queue `shared_name` on `task`'s CPU, under node name `name`. Every graph creates
/// it with the same attributes: whichever runs first creates the resource.
fn queue(g: &mut Graph, name: &str, task: &TaskId, shared_name: &str) -> Result<Output> {
    g.with_device(&cpu(task), |g| {
        g.fifo_queue(
            name,
            &[DType::Int32],
            &[PartialShape::new(Vec::<Option<usize>>::new())],
            None,
            shared_name,
            Some(POLL.as_millis() as u64),
        )
    })
}

/// A dequeue of one element waiting at most [`POLL`]: the op's own timeout, which wins over
/// the step's deadline (the whole call's), so each poll ends on time.
fn dequeue(g: &mut Graph, name: &str, queue: &Output) -> Result<Vec<Output>> {
    g.add_node(
        NodeSpec::new("QueueDequeueV2")
            .name(name)
            .input(queue)
            .attr("component_types", value::dtype_list(&[DType::Int32]))
            .attr("timeout_ms", value::int(POLL.as_millis() as i64)),
    )
}

/// A session on the master at `target` holding `graph`; with `device_filters`, one that needs
/// only the tasks they name.
pub(super) fn session(target: &str, graph: &Graph, device_filters: &[String]) -> Result<Session> {
    let mut options = ConnectOptions {
        connect_timeout: Duration::from_secs(10),
        call_timeout: CALL_TIMEOUT,
        ..ConnectOptions::default()
    };
    options.config.device_filters = device_filters.to_vec();
    let session = Session::connect_with(target, options)?;
    session.extend(&graph.to_graph_def())?;
    Ok(session)
}

/// Blocks until the chief closes `task`'s done queue (or puts anything in it), watching it
/// through the task's own master at `target`. Failures of the watch itself (a step that
/// failed, a master restarting) are logged and the watch starts over after a pause: only the
/// signal, or the process ending, ends it.
///
/// One of a ps task's pair of daemons (`pair`) watches only while it serves the task (the
/// chief closes the queue of the daemon serving then); when the signal comes it tells the
/// other daemon, which ends its wait too.
pub fn wait_for_done(
    target: &str,
    task: &TaskId,
    pair: Option<(&ReplicaConfig, &Security)>,
) -> Result<()> {
    let mut g = Graph::new();
    let q = queue(&mut g, "done_queue", task, DONE_QUEUE)?;
    let dequeue = g.with_device(&cpu(task), |g| dequeue(g, "done_dequeue", &q))?;
    let dequeue = dequeue[0].name();
    tracing::info!(task = %task, "serving until the chief says training is over");
    loop {
        if let Some((pair, security)) = pair {
            let own = ask_status(&pair.own, security, ReplicaStatusRequest::default(), POLL);
            match own {
                Ok(status) if status.training_over => {
                    tracing::info!(task = %task, "the task's other daemon says training is over");
                    return Ok(());
                }
                Ok(status) if status.role() != Role::Primary => {
                    std::thread::sleep(POLL);
                    continue;
                }
                _ => {}
            }
        }
        let watch = session(target, &g, &[]).and_then(|s| loop {
            match s.run(&[], &[&dequeue], &[]) {
                Ok(_) => break Ok(()),
                Err(e) if e.code() == Code::OutOfRange => break Ok(()),
                Err(e) if e.code() == Code::DeadlineExceeded => continue,
                Err(e) => break Err(e),
            }
        });
        match watch {
            Ok(()) => {
                tracing::info!(task = %task, "the chief says training is over");
                if let Some((pair, security)) = pair {
                    let over = ReplicaStatusRequest {
                        training_over: true,
                        ..Default::default()
                    };
                    if let Err(e) = ask_status(&pair.partner, security, over, POLL) {
                        tracing::warn!(task = %task, partner = %pair.partner, error = %e,
                            "could not tell the task's other daemon that training is over");
                    }
                }
                return Ok(());
            }
            Err(e) => {
                tracing::warn!(task = %task, error = %e, "watching for the end of training failed; watching again");
                std::thread::sleep(POLL);
            }
        }
    }
}

/// A worker's "I finished my last step": enqueues `worker_index` into the chief's queue,
/// through this worker's master at `target`. Bounded by the call timeout.
pub fn report_finished(target: &str, chief: &TaskId, worker_index: u32) -> Result<()> {
    let mut g = Graph::new();
    let q = queue(&mut g, "finished_queue", chief, FINISHED_QUEUE)?;
    let index = g.with_device(&cpu(chief), |g| {
        g.constant(&Tensor::scalar(worker_index as i32))
    })?;
    let enqueue = g.with_device(&cpu(chief), |g| {
        g.queue_enqueue("finished_enqueue", &q, &[index])
    })?;
    let s = session(target, &g, &[])?;
    s.run(&[], &[], &[&enqueue])?;
    let _ = s.close();
    Ok(())
}

/// A worker the chief does not know enqueues `worker_index` into ps 0's `shared_name` queue
/// ([`UNLISTED_STARTED`] or [`UNLISTED_FINISHED`]), through its master at `target`. Bounded
/// by the call timeout.
pub fn report_unlisted(
    target: &str,
    ps0: &TaskId,
    shared_name: &str,
    worker_index: u32,
) -> Result<()> {
    let mut g = Graph::new();
    let q = queue(&mut g, "unlisted_queue", ps0, shared_name)?;
    let enqueue = g.with_device(&cpu(ps0), |g| {
        let index = g.constant(&Tensor::scalar(worker_index as i32))?;
        g.queue_enqueue("unlisted_enqueue", &q, &[index])
    })?;
    let s = session(target, &g, &[])?;
    s.run(&[], &[], &[&enqueue])?;
    let _ = s.close();
    Ok(())
}

/// The chief's end of the signals, on its own master.
pub struct ChiefSignals {
    session: Session,
    finished: String,
    /// The sizes of ps 0's queues of unlisted workers: started, finished.
    unlisted: [String; 2],
    closes: Vec<(TaskId, String)>,
}

impl ChiefSignals {
    /// Connects to the chief's master at `target`; `others` are the tasks to tell at the end
    /// (every ps and every other worker), `ps0` where the unlisted workers report.
    pub fn connect(target: &str, chief: &TaskId, others: &[TaskId], ps0: &TaskId) -> Result<Self> {
        let mut g = Graph::new();
        let q = queue(&mut g, "finished_queue", chief, FINISHED_QUEUE)?;
        let dequeue = g.with_device(&cpu(chief), |g| dequeue(g, "finished_dequeue", &q))?;
        let mut unlisted = Vec::with_capacity(2);
        for (name, shared) in [
            ("started", UNLISTED_STARTED),
            ("finished", UNLISTED_FINISHED),
        ] {
            let q = queue(&mut g, &format!("unlisted_{name}"), ps0, shared)?;
            let size = g.with_device(&cpu(ps0), |g| {
                g.queue_size(&format!("unlisted_{name}_size"), &q)
            })?;
            unlisted.push(size.name());
        }
        let unlisted: [String; 2] = unlisted.try_into().expect("two queues");
        let mut closes = Vec::with_capacity(others.len());
        for (k, task) in others.iter().enumerate() {
            let q = queue(&mut g, &format!("done_queue_{k}"), task, DONE_QUEUE)?;
            let close = g.with_device(&cpu(task), |g| {
                g.queue_close(&format!("done_close_{k}"), &q, false)
            })?;
            closes.push((task.clone(), close));
        }
        Ok(Self {
            session: session(target, &g, &[])?,
            finished: dequeue[0].name(),
            unlisted,
            closes,
        })
    }

    /// Waits up to `deadline` until as many unlisted workers (a sparse `TF_CONFIG`) reported
    /// their last step on ps 0 as started there; at once when there are none.
    pub fn wait_for_unlisted(&self, deadline: Duration) {
        let started = Instant::now();
        let [begun, ended] = &self.unlisted;
        loop {
            let sizes = self
                .session
                .run(&[], &[begun.as_str(), ended.as_str()], &[])
                .and_then(|v| Ok((v[0].scalar_value::<i32>()?, v[1].scalar_value::<i32>()?)));
            match sizes {
                Ok((begun, ended)) if ended >= begun => return,
                Ok((begun, ended)) if started.elapsed() >= deadline => {
                    tracing::warn!(
                        started = begun,
                        finished = ended,
                        "not every unlisted worker reported its last step; ending without them"
                    );
                    return;
                }
                Ok(_) => std::thread::sleep(Duration::from_millis(100)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read ps 0's reports of unlisted workers");
                    return;
                }
            }
        }
    }

    /// Waits up to `deadline` for `expected` workers to report their last step; returns the
    /// indices of those that did.
    pub fn wait_for_workers(&self, expected: usize, deadline: Duration) -> Vec<u32> {
        let started = Instant::now();
        let mut finished = Vec::new();
        while finished.len() < expected && started.elapsed() < deadline {
            match self.session.run(&[], &[&self.finished], &[]) {
                Ok(values) => match values.first().map(|v| v.scalar_value::<i32>()) {
                    Some(Ok(index)) => finished.push(index as u32),
                    _ => tracing::warn!("a worker's finished report was not an int32 scalar"),
                },
                Err(e) if e.code() == Code::DeadlineExceeded => {}
                Err(e) => {
                    tracing::warn!(error = %e, "waiting for the workers' last steps failed");
                    break;
                }
            }
        }
        if finished.len() < expected {
            tracing::warn!(
                finished = ?finished,
                expected,
                waited_s = started.elapsed().as_secs_f64(),
                "not every worker reported its last step; ending without them"
            );
        }
        finished
    }

    /// Tells every other task that training is over. A task that cannot be told (it is gone)
    /// is named in the error; every other task is told anyway.
    pub fn announce_done(&self) -> Result<()> {
        let mut failed = Vec::new();
        for (task, close) in &self.closes {
            if let Err(e) = self.session.run(&[], &[], &[close]) {
                tracing::warn!(task = %task, error = %e, "cannot tell the task that training is over");
                failed.push(format!("{task} ({})", e.message()));
            }
        }
        let _ = self.session.close();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(Status::unavailable(format!(
                "training finished, but these tasks could not be told to exit: {}; stop them \
                 with SIGTERM",
                failed.join(", ")
            )))
        }
    }
}
