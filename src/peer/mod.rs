//! `Peer`: how a master or a worker reaches a task's WorkerService.
//!
//! One object-safe trait, [`Peer`], with one method per WorkerService RPC that a ps/worker job
//! uses, and three implementations that callers never tell apart (they hold `Arc<dyn Peer>`):
//!
//! ```text
//! MasterSession / Worker ──► Arc<dyn Peer> ─┬─► LocalPeer      own task: the worker, in process
//!    (from a PeerCache)                     ├─► GrpcPeer       another task: tonic, lazy channel
//!                                           └─► SimulatedPeer  tests: scripts, delays, restarts
//! ```
//!
//! [`PeerCache`] hands out one peer per task of a cluster, created on first use.
//!
//! Invariants every implementation keeps:
//! - **Every call has a deadline** ([`CallOptions`]). A call that has not answered by then fails
//!   with DEADLINE_EXCEEDED naming the task, where it lives and the RPC
//!   ("/job:worker/replica:0/task:2 at h2:2222 did not answer RunGraph within 10 s").
//! - **A task that cannot be reached** fails with UNAVAILABLE naming the task and its address
//!   ("/job:worker/replica:0/task:2 at h2:2222 unreachable: <cause>").
//! - **Statuses inside response bodies are the caller's business.** A peer returns
//!   `Ok(RunGraphResponse)` even when its `status_code` is not OK (the master sets
//!   `store_errors_in_response_body`, so a worker's step error usually arrives that way); the
//!   caller reads it with [`Status::from_body`](crate::Status::from_body), because only the caller
//!   knows which step and partition the error belongs to. A peer turns into `Err` only what went
//!   wrong with the call itself: unreachable, too slow, or an error status returned by the RPC.
//!
//! A master's step, against a simulated cluster here (a daemon's cache holds gRPC peers):
//!
//! ```
//! # use std::time::Duration;
//! # use tessera::cluster::{ClusterSpec, TaskId};
//! # use tessera::peer::{CallOptions, SimulatedCluster};
//! # use tessera::proto::RunGraphRequest;
//! # use tessera::Status;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> tessera::Result<()> {
//! let spec = ClusterSpec::from_dense([("ps", vec!["ps0:2222"]), ("worker", vec!["w0:2222"])]);
//! let cluster = SimulatedCluster::new(&spec);
//! let peers = cluster.peer_cache(&TaskId::new("worker", 0))?;
//!
//! let ps = peers.get(&TaskId::new("ps", 0))?;
//! let request = RunGraphRequest {
//!     step_id: 1,
//!     store_errors_in_response_body: true,
//!     ..Default::default()
//! };
//! let response = ps.run_graph(request, CallOptions::timeout(Duration::from_secs(10))).await?;
//! // A step error travels in the body; reading it is the caller's job.
//! if let Some(error) = Status::from_body(response.status_code, &response.status_error_message) {
//!     return Err(error.context(format_args!("step 1 on {}", ps.task())));
//! }
//! # Ok(())
//! # }
//! ```

pub mod cache;
pub mod failover;
pub mod fetch;
pub mod grpc;
pub mod local;
pub mod simulated;

use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;

use crate::cluster::TaskId;
use crate::error::Result;
#[allow(clippy::wildcard_imports)] // The table names every request and response.
use crate::proto::*;
use crate::wire::channel::TensorChannel;
pub(crate) use crate::wire::transport::{
    deadline_exceeded, format_duration, lost_connection, unreachable,
};
use crate::worker::service::worker_rpcs;

pub use cache::{Connector, PeerCache};
pub use failover::FailoverPeer;
pub use fetch::RemoteFetcher;
pub use grpc::GrpcPeer;
pub use local::LocalPeer;
pub use simulated::{SimulatedCluster, SimulatedPeer, SimulatedRpc};

/// The future a [`Peer`] call returns: the response, or why there is none.
pub type PeerFuture<'a, T> = BoxFuture<'a, Result<T>>;

/// How long one call may take: a deadline on tokio's clock (so tests can pause it) and the
/// budget it was given, which error messages quote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallOptions {
    deadline: Instant,
    budget: Duration,
}

impl CallOptions {
    /// A call that must answer within `budget` from now.
    pub fn timeout(budget: Duration) -> Self {
        let now = Instant::now();
        // A budget too large for the clock (`Duration::MAX`) means "a very long time", not a panic.
        let deadline = now.checked_add(budget).unwrap_or_else(|| now + FAR_FUTURE);
        Self { deadline, budget }
    }

    /// A call that must answer by `deadline` (shared by the calls of one step, say).
    pub fn deadline(deadline: Instant) -> Self {
        Self {
            deadline,
            budget: deadline.saturating_duration_since(Instant::now()),
        }
    }

    /// Returns the instant by which the call must answer.
    pub fn deadline_at(&self) -> Instant {
        self.deadline
    }

    /// Returns the time the call was given, as error messages quote it.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// Returns the time left before the deadline (zero once it has passed).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

/// What "no deadline" stands for: about 30 years, as tokio's own far future.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// [`Peer`]'s methods from the WorkerService's table ([`worker_rpcs!`](crate::worker::service)).
macro_rules! peer_methods {
    ($($method:ident: $rpc:ident($req:ty) -> $resp:ty, $waits:literal, $doc:literal;)*) => {$(
        #[doc = concat!("`", stringify!($rpc), "`: ", $doc, ".")]
        fn $method(&self, request: $req, options: CallOptions) -> PeerFuture<'_, $resp>;
    )*};
}

/// A task's WorkerService, wherever it lives.
///
/// Object-safe: masters and workers hold `Arc<dyn Peer>`. Each method takes TensorFlow's
/// request message and a deadline and resolves to the response message; see the module docs for
/// which failures become `Err` and which stay in the response body. One method per row of the
/// service's table.
pub trait Peer: Send + Sync {
    /// Returns the task this peer reaches.
    fn task(&self) -> &TaskId;

    worker_rpcs!(peer_methods);

    /// The task's tensor channel ([`crate::wire::channel`]), for RecvTensor calls made by
    /// blocking on an executor thread; `None` when RecvTensor goes only through
    /// [`recv_tensor`](Peer::recv_tensor) (the own task, TLS, simulated peers).
    fn tensor_channel(&self) -> Option<&TensorChannel> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::Rpc;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(format_duration(Duration::from_secs(10)), "10 s");
        assert_eq!(format_duration(Duration::from_millis(200)), "200 ms");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::ZERO), "0 s");
    }

    #[test]
    fn errors_name_the_task_its_place_and_the_rpc() {
        let task = TaskId::new("worker", 2);
        let slow = deadline_exceeded(&task, "at h2:2222", Rpc::RunGraph, Duration::from_secs(10));
        assert_eq!(slow.code(), crate::Code::DeadlineExceeded);
        assert!(
            slow.message().starts_with(
                "/job:worker/replica:0/task:2 at h2:2222 did not answer RunGraph within 10 s;"
            ),
            "{slow}"
        );
        let dead = unreachable(&task, "h2:2222", "connection refused");
        assert_eq!(dead.code(), crate::Code::Unavailable);
        assert_eq!(
            dead.message(),
            "/job:worker/replica:0/task:2 at h2:2222 unreachable: connection refused"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn call_options_count_down_on_tokio_time() {
        let options = CallOptions::timeout(Duration::from_secs(3));
        assert_eq!(options.remaining(), Duration::from_secs(3));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(options.remaining(), Duration::from_secs(2));
        assert_eq!(options.budget(), Duration::from_secs(3));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(options.remaining(), Duration::ZERO);

        let shared = CallOptions::deadline(Instant::now() + Duration::from_millis(250));
        assert_eq!(shared.budget(), Duration::from_millis(250));
        // No panic for "forever".
        assert!(CallOptions::timeout(Duration::MAX).remaining() > Duration::from_secs(86_400));
    }
}
