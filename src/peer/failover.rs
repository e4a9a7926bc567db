//! `FailoverPeer`: a ps task that has a standby, reached at whichever of its two daemons
//! serves it.
//!
//! Calls go to the daemon that served last. When one fails with UNAVAILABLE (the daemon is
//! dead, or it is the standby now), the peer asks the other daemon to take the task over
//! (`Promote`; it does so only when it cannot reach its partner either) and sends later calls
//! there. The failed call still fails with UNAVAILABLE: the step it belonged to is retried by
//! the monitored session, on the daemon that serves now.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tonic::Request;
use tracing::{info, warn};

use super::{CallOptions, GrpcPeer, Peer, PeerFuture};
use crate::cluster::TaskId;
use crate::error::{Code, Result, Status};
use crate::proto::replica::replica_service_client::ReplicaServiceClient;
use crate::proto::replica::{PromoteRequest, ReplicaStatusRequest, ReplicaStatusResponse};
#[allow(clippy::wildcard_imports)] // The table names every request and response.
use crate::proto::*;
use crate::security::{AuthChannel, Security};
use crate::wire::channel::TensorChannel;
use crate::worker::service::worker_rpcs;

/// How long a `Promote` may take: the standby probes its primary first.
const PROMOTE_DEADLINE: Duration = Duration::from_secs(5);

/// One of a ps task's two daemons.
struct Daemon {
    peer: GrpcPeer,
    replica: ReplicaServiceClient<AuthChannel>,
}

/// A ps task with a standby: its primary and standby daemons, calls going to the one serving.
pub struct FailoverPeer {
    task: TaskId,
    daemons: [Daemon; 2],
    serving: AtomicUsize,
}

impl FailoverPeer {
    /// The peer of `task`, served at `primary` with a standby at `standby`, both dialled lazily
    /// with `security`.
    pub fn connect_lazy(
        task: TaskId,
        primary: &str,
        standby: &str,
        connect_timeout: Duration,
        security: &Security,
    ) -> Result<Self> {
        let daemon = |address: &str| -> Result<Daemon> {
            let peer =
                GrpcPeer::connect_lazy_with(task.clone(), address, connect_timeout, security)?;
            let replica = ReplicaServiceClient::new(peer.auth_channel());
            Ok(Daemon { peer, replica })
        };
        Ok(Self {
            daemons: [daemon(primary)?, daemon(standby)?],
            task,
            serving: AtomicUsize::new(0),
        })
    }

    /// Returns the address of the daemon calls go to now.
    pub fn serving_address(&self) -> &str {
        self.daemons[self.serving.load(Ordering::Acquire)]
            .peer
            .address()
    }

    /// Runs one call on the serving daemon; an UNAVAILABLE answer moves later calls to the
    /// other daemon once it has taken the task over.
    async fn call<T>(&self, call: impl FnOnce(&GrpcPeer) -> PeerFuture<'_, T>) -> Result<T> {
        let at = self.serving.load(Ordering::Acquire);
        let result = call(&self.daemons[at].peer).await;
        if let Err(e) = &result {
            if e.code() == Code::Unavailable {
                self.fail_over(at, e).await;
            }
        }
        result
    }

    /// Asks the daemon other than `failed` to take the task over; on success calls go there.
    async fn fail_over(&self, failed: usize, error: &Status) {
        let other = 1 - failed;
        let mut client = self.daemons[other].replica.clone();
        let mut request = Request::new(PromoteRequest {
            reason: error.message().to_string(),
        });
        request.set_timeout(PROMOTE_DEADLINE);
        match tokio::time::timeout(PROMOTE_DEADLINE, client.promote(request)).await {
            Ok(Ok(_)) => {
                if self
                    .serving
                    .compare_exchange(failed, other, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    info!(task = %self.task.device_prefix(), from = self.daemons[failed].peer.address(),
                        to = self.daemons[other].peer.address(), "failed over to the task's other daemon");
                }
            }
            Ok(Err(status)) => {
                warn!(task = %self.task.device_prefix(), error = %status.message(), "the task's other daemon did not take it over");
            }
            Err(_) => {
                warn!(task = %self.task.device_prefix(), address = self.daemons[other].peer.address(),
                    "the task's other daemon did not answer Promote within {PROMOTE_DEADLINE:?}");
            }
        }
    }
}

impl std::fmt::Debug for FailoverPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FailoverPeer")
            .field("task", &self.task)
            .field("serving", &self.serving_address())
            .finish()
    }
}

/// Implements [`Peer`] as the same call on the serving daemon.
macro_rules! failover {
    ($($method:ident: $rpc:ident($req:ty) -> $resp:ty, $waits:literal, $doc:literal;)*) => {$(
        fn $method(&self, request: $req, options: CallOptions) -> PeerFuture<'_, $resp> {
            Box::pin(self.call(move |peer| peer.$method(request, options)))
        }
    )*};
}

impl Peer for FailoverPeer {
    fn task(&self) -> &TaskId {
        &self.task
    }

    worker_rpcs!(failover);

    fn tensor_channel(&self) -> Option<&TensorChannel> {
        self.daemons[self.serving.load(Ordering::Acquire)]
            .peer
            .tensor_channel()
    }
}

/// Makes the failover peers of the ps tasks in `standbys` (ps index → standby address) and
/// plain gRPC peers of the rest.
pub(super) fn connector(
    standbys: std::collections::BTreeMap<u32, String>,
    connect_timeout: Duration,
    security: Security,
) -> super::Connector {
    Arc::new(move |task: &TaskId, address: &str| {
        let standby = (task.job == "ps")
            .then(|| standbys.get(&task.index))
            .flatten();
        Ok(match standby {
            Some(standby) => Arc::new(FailoverPeer::connect_lazy(
                task.clone(),
                address,
                standby,
                connect_timeout,
                &security,
            )?) as Arc<dyn Peer>,
            None => Arc::new(GrpcPeer::connect_lazy_with(
                task.clone(),
                address,
                connect_timeout,
                &security,
            )?) as Arc<dyn Peer>,
        })
    })
}

/// A ReplicaService client of the daemon at `address` (one of a ps task's pair), dialled
/// lazily with `security`.
pub fn replica_client(
    address: &str,
    connect_timeout: Duration,
    security: &Security,
) -> Result<ReplicaServiceClient<AuthChannel>> {
    let channel = super::grpc::dial_lazily(address, connect_timeout, security).map_err(|e| {
        Status::invalid_argument(format!(
            "`{address}` of a ps task's pair cannot be dialled: {}; fix the ps or ps_standby \
             job in the cluster file",
            e.message()
        ))
    })?;
    Ok(ReplicaServiceClient::new(channel)
        .max_decoding_message_size(crate::wire::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(crate::wire::MAX_MESSAGE_BYTES))
}

/// Asks the daemon at `address` (one of a ps task's pair) its ReplicaStatus, from a thread
/// outside any runtime (a training loop's), within `timeout`.
pub fn ask_replica_status(
    address: &str,
    security: &Security,
    request: ReplicaStatusRequest,
    timeout: Duration,
) -> Result<ReplicaStatusResponse> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Status::internal(format!("cannot build a runtime to ask {address}: {e}")))?;
    runtime.block_on(async {
        let mut client = replica_client(address, timeout, security)?;
        let mut request = Request::new(request);
        request.set_timeout(timeout);
        match tokio::time::timeout(timeout, client.replica_status(request)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(Status::from(status)),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "{address} did not answer ReplicaStatus within {timeout:?}"
            ))),
        }
    })
}
