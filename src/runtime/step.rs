//! What one step brings to the kernels that run in it: its id, deadline, cancellation,
//! rendezvous, trace, and the hook through which a `_Recv` pulls a tensor from another task.
//!
//! [`RemoteRecv`] is defined here, below the kernels that call it, and implemented above them
//! by the peers (RecvTensor over the tensor channel or gRPC); the daemon injects it into the
//! worker, so neither the rendezvous nor the kernels know any transport.

use std::sync::Arc;
use std::time::Instant;

use crate::cluster::ClusterSpec;
use crate::error::Result;
use crate::runtime::cancel::CancellationToken;
use crate::runtime::rendezvous::{ParsedKey, Received, Rendezvous};
use crate::runtime::stats::StepStatsCollector;

/// What one step brings besides its feeds.
///
/// Kernels reach the step through their `OpContext`: `_Send`/`_Recv` use the step's rendezvous,
/// and a `_Recv` whose producer is on another task pulls through `remote_recv`.
#[derive(Clone, Debug, Default)]
pub struct StepOptions {
    /// The step's id (TensorFlow draws a random one per step).
    pub step_id: i64,
    /// Cancels the step: no node starts once it is set.
    pub cancellation: Option<CancellationToken>,
    /// The step fails with DEADLINE_EXCEEDED when it has not finished by then.
    pub deadline: Option<Instant>,
    /// The step's rendezvous on this task, where `_Send` leaves and `_Recv` takes tensors.
    pub rendezvous: Option<Arc<Rendezvous>>,
    /// Pulls a tensor another task produced (RecvTensor), for `_Recv` of a cross-task edge.
    pub remote_recv: Option<Arc<dyn RemoteRecv>>,
    /// Where the step's executors record each node's times and outputs (a trace, TensorFlow's
    /// `RunOptions.trace_level`); `None`, the default, records nothing.
    pub stats: Option<Arc<StepStatsCollector>>,
}

/// Fetches the tensor another task's `_Send` left under a rendezvous key, for the `_Recv`
/// kernel of a cross-task edge. `peer::RemoteFetcher` implements it with RecvTensor to the
/// producer's task; the daemon hands it to the worker.
///
/// Called on an executor thread, which it may block until `deadline` but not past it; it
/// should give up early (with the step's status) once the step is aborted or cancelled.
pub trait RemoteRecv: Send + Sync + std::fmt::Debug {
    /// Receives the tensor under `key` for `step` from the task of its source device. `room`
    /// is what the receiving device's memory budget has left: an answer announcing more is
    /// refused before it is read.
    fn recv(
        &self,
        step: &StepOptions,
        key: &ParsedKey,
        deadline: Instant,
        room: u64,
    ) -> Result<Received>;

    /// Takes note of the tasks a master's session names (`CreateWorkerSession`'s cluster), so
    /// that tensors can be pulled from tasks this task's own cluster does not list. Nothing by
    /// default.
    fn learn_tasks(&self, _cluster: &ClusterSpec) {}
}
