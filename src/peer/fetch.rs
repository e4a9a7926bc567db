//! [`RemoteFetcher`]: the worker's remote-receive hook. A `_Recv` of a cross-task edge calls it
//! on its executor thread; it issues RecvTensor to the producer's task through the cluster's
//! [`PeerCache`] (over the peer's tensor channel when it has one, the executor thread doing the
//! I/O; else over gRPC on a small tokio runtime of its own) and blocks the executor thread until
//! the answer or the step's deadline. The daemon gives it to the worker
//! (`WorkerState::set_remote`), so the worker and the rendezvous know no transport.

use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

use super::{CallOptions, Peer, PeerCache};
use crate::cluster::{ClusterSpec, DeviceName, TaskId};
use crate::error::{Result, Status};
use crate::proto::{RecvTensorRequest, RecvTensorResponse};
use crate::runtime::rendezvous::{ParsedKey, Received};
use crate::runtime::{RemoteRecv, StepOptions};
use crate::tensor::Tensor;
use crate::wire::channel::ChannelLimit;

/// Pulls tensors from other tasks with RecvTensor, for `_Recv` kernels on executor threads: over
/// the peer's tensor channel when it has one (the executor thread does the I/O), else over gRPC.
pub struct RemoteFetcher {
    task: TaskId,
    /// The most bytes a peer's answer may announce (`limits.max_message_bytes`).
    max_message_bytes: usize,
    peers: Arc<PeerCache>,
    /// Drives the RecvTensor calls; made on first use, so tasks that never pull start none.
    runtime: OnceLock<std::result::Result<tokio::runtime::Runtime, String>>,
}

impl RemoteFetcher {
    /// A fetcher for `task`'s worker pulling through `peers`, taking answers of up to
    /// `max_message_bytes`.
    pub fn new(task: TaskId, peers: Arc<PeerCache>, max_message_bytes: usize) -> Self {
        Self {
            task,
            max_message_bytes,
            peers,
            runtime: OnceLock::new(),
        }
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
            self.peers.get(&src)?
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

    fn learn_tasks(&self, cluster: &ClusterSpec) {
        self.peers.learn(cluster);
    }
}

impl RemoteFetcher {
    /// RecvTensor through the peer's async call on this fetcher's runtime, the executor thread
    /// waiting for the answer while it watches its step.
    fn recv_over_grpc(
        &self,
        handle: &tokio::runtime::Handle,
        peer: Arc<dyn Peer>,
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
