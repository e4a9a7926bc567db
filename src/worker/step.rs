//! Running one step of a registered graph, and pulling tensors from other tasks.
//!
//! [`run_executors`] starts every per-device executor of a graph ([`Executor::spawn`]: nodes
//! that may wait or take long go to the executor pool, never onto the async runtime's thread;
//! only cheap ones run there, within a bounded budget) and waits for them without blocking: the
//! first error aborts the step's rendezvous with that status, so the other devices' pending
//! `_Recv`s (and other tasks' RecvTensors for this step) fail at once with the root cause
//! instead of timing out.
//!
//! [`RemoteFetcher`] is the step's remote-receive hook: a `_Recv` of a cross-task edge calls it
//! on its executor thread; it issues RecvTensor to the producer's task through the worker's
//! [`PeerCache`] on a small tokio runtime the worker owns, and blocks the executor thread until
//! the answer or the step's deadline.

use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};

use crate::cluster::{DeviceName, TaskId};
use crate::error::{Result, Status};
use crate::exec::executor::{Executor, RemoteRecv, StepOptions};
use crate::peer::{CallOptions, PeerCache};
use crate::proto::{RecvTensorRequest, RecvTensorResponse};
use crate::runtime::rendezvous::{ParsedKey, Received};
use crate::tensor::Tensor;
use crate::wire::channel::ChannelLimit;

/// Runs every executor for the step described by `options`; returns the step's first error.
///
/// Requires `options.rendezvous` (aborted with the first error) and `options.cancellation`
/// (cancelled with it, so no new node starts anywhere in the step).
pub async fn run_executors(executors: &[Arc<Executor>], options: StepOptions) -> Result<()> {
    let mut running = FuturesUnordered::new();
    for executor in executors {
        match executor.spawn(Vec::new(), &options) {
            Ok(step) => running.push(futures::future::Either::Left(step.finish())),
            Err(e) => running.push(futures::future::Either::Right(std::future::ready(Err(e)))),
        }
    }
    let mut first: Option<Status> = None;
    while let Some(result) = running.next().await {
        if let Err(status) = result {
            if first.is_none() {
                if let Some(rendezvous) = &options.rendezvous {
                    rendezvous.abort(status.clone());
                }
                if let Some(token) = &options.cancellation {
                    token.cancel(status.clone());
                }
                first = Some(status);
            }
        }
    }
    first.map_or(Ok(()), Err)
}

/// Pulls tensors from other tasks with RecvTensor, for `_Recv` kernels on executor threads: over
/// the peer's tensor channel when it has one (the executor thread does the I/O), else over gRPC.
pub struct RemoteFetcher {
    task: TaskId,
    /// The most bytes a peer's answer may announce (`limits.max_message_bytes`).
    max_message_bytes: usize,
    peers: OnceLock<Arc<PeerCache>>,
    /// Drives the RecvTensor calls; made on first use, so tasks that never pull start none.
    runtime: OnceLock<std::result::Result<tokio::runtime::Runtime, String>>,
}

impl RemoteFetcher {
    /// A fetcher for `task`'s worker taking answers of up to `max_message_bytes`, with no
    /// peers until [`set_peers`](Self::set_peers).
    pub fn new(task: TaskId, max_message_bytes: usize) -> Self {
        Self {
            task,
            max_message_bytes,
            peers: OnceLock::new(),
            runtime: OnceLock::new(),
        }
    }

    /// Sets the peers of the cluster (once; later calls are ignored and return false).
    pub fn set_peers(&self, peers: Arc<PeerCache>) -> bool {
        self.peers.set(peers).is_ok()
    }

    fn handle(&self) -> Result<tokio::runtime::Handle> {
        let runtime = self.runtime.get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("tessera-recv")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        });
        match runtime {
            Ok(runtime) => Ok(runtime.handle().clone()),
            Err(e) => Err(Status::internal(format!(
                "cannot start the runtime for RecvTensor calls: {e}"
            ))),
        }
    }
}

impl std::fmt::Debug for RemoteFetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteFetcher")
            .field("task", &self.task)
            .field("peers", &self.peers.get().is_some())
            .finish()
    }
}

impl Drop for RemoteFetcher {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which panics inside another runtime; let it go instead.
        if let Some(Ok(runtime)) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl RemoteRecv for RemoteFetcher {
    fn recv(
        &self,
        step: &StepOptions,
        key: &ParsedKey,
        deadline: Instant,
        room: u64,
    ) -> Result<Received> {
        let step_id = step.step_id;
        let peers = self.peers.get().cloned().ok_or_else(|| {
            Status::failed_precondition(format!(
                "{}: cannot pull `{key}` from another task: this worker was given no cluster \
                 peers",
                self.task.device_prefix()
            ))
        })?;
        let src = DeviceName::parse(key.src_device())?
            .task_id()
            .ok_or_else(|| Status::invalid_argument(format!("key `{key}` names no source task")))?;
        let request = RecvTensorRequest {
            step_id,
            rendezvous_key: key.as_str().to_string(),
            ..Default::default()
        };
        let handle = self.handle()?;
        let peer = {
            // Creating a peer's gRPC channel needs a runtime.
            let _runtime = handle.enter();
            peers.get(&src)?
        };
        let response = match peer.tensor_channel() {
            Some(channel) => {
                let limit = ChannelLimit {
                    max_message_bytes: self.max_message_bytes,
                    room,
                };
                channel.recv_tensor(&request, deadline, limit, &|| stopped(step))
            }
            None => None,
        };
        let response = match response {
            Some(response) => response?,
            None => self.recv_over_grpc(&handle, peer, request, step, key, deadline)?,
        };
        crate::ops::metrics::received(
            &self.task.device_prefix(),
            "RecvTensor",
            prost::Message::encoded_len(&response),
        );
        let proto = response.tensor.as_ref().ok_or_else(|| {
            Status::internal(format!("RecvTensor for `{key}` answered without a tensor"))
        })?;
        let tensor =
            Tensor::from_proto(proto).map_err(|e| e.context(format!("RecvTensor for `{key}`")))?;
        Ok((tensor, response.is_dead))
    }
}

impl RemoteFetcher {
    /// RecvTensor through the peer's async call on this fetcher's runtime, the executor thread
    /// waiting for the answer while it watches its step.
    fn recv_over_grpc(
        &self,
        handle: &tokio::runtime::Handle,
        peer: Arc<dyn crate::peer::Peer>,
        request: RecvTensorRequest,
        step: &StepOptions,
        key: &ParsedKey,
        deadline: Instant,
    ) -> Result<RecvTensorResponse> {
        let step_id = step.step_id;
        let call_deadline = tokio::time::Instant::from_std(deadline);
        let (reply, answer) = mpsc::sync_channel(1);
        let call = handle.spawn(async move {
            let result = peer
                .recv_tensor(request, CallOptions::deadline(call_deadline))
                .await;
            let _ = reply.send(result);
        });
        // The call has the same deadline; the margin lets its own, more precise error arrive.
        let give_up = deadline + Duration::from_secs(1);
        loop {
            if let Some(status) = stopped(step) {
                call.abort();
                return Err(status);
            }
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                call.abort();
                return Err(Status::deadline_exceeded(format!(
                    "step {step_id}: RecvTensor for `{key}` did not answer within the step's \
                     deadline"
                )));
            }
            match answer.recv_timeout(left.min(ABORT_POLL)) {
                Ok(result) => return result,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(Status::internal(format!(
                        "step {step_id}: RecvTensor for `{key}` ended without an answer"
                    )))
                }
            }
        }
    }
}

/// How often a thread waiting for a remote tensor checks whether its step was aborted.
const ABORT_POLL: Duration = Duration::from_millis(20);

/// The status the step was aborted or cancelled with, if it was.
fn stopped(step: &StepOptions) -> Option<Status> {
    if let Some(status) = step.rendezvous.as_ref().and_then(|r| r.aborted()) {
        return Some(status);
    }
    step.cancellation.as_ref().and_then(|t| t.reason())
}
