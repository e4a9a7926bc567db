//! `GrpcPeer`: another task's WorkerService over gRPC (tonic).
//!
//! The channel connects lazily, on the first call, and reconnects on its own when the
//! connection breaks (the task restarted, the network blinked): a peer outlives the process at
//! the other end. Creating one never touches the network, so a master can hold peers for every
//! task of a cluster while some of them are still starting.
//!
//! RecvTensor calls made from executor threads go over the task's tensor channel
//! ([`crate::wire::channel`]) when both sides speak plain text, and over gRPC otherwise.
//!
//! With the task's [`Security`], the channel speaks TLS against the cluster's CA (showing the
//! task's own certificate to peers that require one) and every call carries the cluster token.
//!
//! Every call carries its deadline twice: as gRPC's `grpc-timeout` header, so the remote task
//! stops working on a call nobody waits for, and as a local timer, so a task that never answers
//! (or a packet that never arrives) cannot hold the caller past the deadline.
//!
//! Errors are rewritten to name the task and its address, since a bare "transport error" in a
//! master's log does not say which of fifty tasks is down:
//! - the call could not reach the task → UNAVAILABLE "<task> at <addr> unreachable: <cause>";
//! - the connection broke during the call → UNAVAILABLE "<task> at <addr> lost the connection
//!   during <RPC>: <cause>";
//! - the deadline passed → DEADLINE_EXCEEDED "<task> at <addr> did not answer <RPC> within <t>";
//! - the task answered with an error status → that code, its message prefixed with
//!   "<RPC> on <task> at <addr>".

use std::error::Error as _;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::security::{AuthChannel, Security};
use crate::wire::channel::TensorChannel;

use super::{deadline_exceeded, lost_connection, unreachable, CallOptions, Peer, PeerFuture};
use crate::cluster::TaskId;
use crate::error::{Result, Status};
use crate::proto::worker_service_client::WorkerServiceClient;
#[allow(clippy::wildcard_imports)] // The table names every request and response.
use crate::proto::*;
use crate::wire::MAX_MESSAGE_BYTES;
use crate::worker::service::worker_rpcs;
use crate::worker::Rpc;

/// A remote task's WorkerService, reached over a lazily connected tonic channel (TLS and the
/// cluster token when the task's [`Security`] has them).
#[derive(Clone)]
pub struct GrpcPeer {
    task: TaskId,
    address: String,
    client: WorkerServiceClient<AuthChannel>,
    /// The same channel, for RecvTensor's hand-framed fast path ([`crate::wire`]).
    channel: AuthChannel,
    /// RecvTensor over plain TCP beside gRPC, when this side speaks plain text.
    tensor_channel: Option<Arc<TensorChannel>>,
}

impl GrpcPeer {
    /// A peer for `task` listening at `address` (`host:port`, or a `http://` URI), connecting
    /// on first use with `connect_timeout` per attempt, in plain text without a token.
    ///
    /// Must be called inside a tokio runtime (an actix system is one): the channel's worker task
    /// is spawned there, so that runtime must outlive the peer.
    pub fn connect_lazy(task: TaskId, address: &str, connect_timeout: Duration) -> Result<Self> {
        Self::connect_lazy_with(task, address, connect_timeout, &Security::plain())
    }

    /// [`connect_lazy`](Self::connect_lazy) with `security`: TLS against its CA when it has
    /// one, and its cluster token on every call.
    pub fn connect_lazy_with(
        task: TaskId,
        address: &str,
        connect_timeout: Duration,
        security: &Security,
    ) -> Result<Self> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Status::failed_precondition(format!(
                "the peer for {} at {address} was created outside a tokio runtime; create peers \
                 from async code",
                task.device_prefix()
            )));
        }
        let channel = dial_lazily(address, connect_timeout, security).map_err(|e| {
            Status::invalid_argument(format!(
                "address `{address}` of {} cannot be dialled: {}; fix it in the cluster spec",
                task.device_prefix(),
                e.message()
            ))
        })?;
        let client = WorkerServiceClient::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let tensor_channel =
            TensorChannel::new(task.clone(), address, connect_timeout, security).map(Arc::new);
        Ok(Self {
            task,
            address: address.to_string(),
            client,
            channel,
            tensor_channel,
        })
    }

    /// Returns the peer's channel, for other services of the same task.
    pub fn auth_channel(&self) -> AuthChannel {
        self.channel.clone()
    }

    /// Returns the address this peer connects to, as given.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Runs one call made by `call` under the deadline and rewrites its errors.
    async fn call<T>(
        &self,
        rpc: Rpc,
        options: CallOptions,
        call: impl Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T> {
        match tokio::time::timeout_at(options.deadline_at(), call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(self.rewrite(rpc, options, status)),
            Err(_) => Err(self.deadline_exceeded(rpc, options)),
        }
    }

    fn deadline_exceeded(&self, rpc: Rpc, options: CallOptions) -> Status {
        deadline_exceeded(
            &self.task,
            &format!("at {}", self.address),
            rpc,
            options.budget(),
        )
    }

    /// Turns a failed call's status into one that names the task and its address.
    fn rewrite(&self, rpc: Rpc, options: CallOptions, status: tonic::Status) -> Status {
        let code = status.code();
        // Whichever side's timer fired first (ours, or the server's `grpc-timeout`), a call that
        // failed at its deadline failed because of it.
        let timed_out = matches!(code, tonic::Code::Cancelled | tonic::Code::DeadlineExceeded)
            && options.remaining().is_zero();
        if timed_out {
            return self.deadline_exceeded(rpc, options);
        }
        // tonic keeps the transport error as the source of statuses it made up itself; a status
        // the remote task sent has none. Whatever broke the connection (refused, reset mid-call
        // by a crashing task), it is UNAVAILABLE: the code TensorFlow's clients retry on.
        if status.source().is_some() {
            let cause = cause_chain(&status);
            if code == tonic::Code::Unavailable {
                return unreachable(&self.task, &self.address, &cause);
            }
            return lost_connection(&self.task, &self.address, rpc, &cause);
        }
        Status::from(status).context(format_args!(
            "{rpc} on {} at {}",
            self.task.device_prefix(),
            self.address
        ))
    }
}

/// A channel to `address` with the wire's settings, connecting on first use within
/// `connect_timeout` and speaking as `security` says (TLS, the cluster token); the address's
/// error when it cannot be dialled.
pub(crate) fn dial_lazily(
    address: &str,
    connect_timeout: Duration,
    security: &Security,
) -> Result<AuthChannel> {
    let endpoint = security.endpoint(address)?;
    let channel = crate::wire::tune_endpoint(endpoint)
        .connect_timeout(connect_timeout)
        .connect_lazy();
    Ok(security.attach(channel))
}

/// The status's message followed by each distinct cause under it ("tcp connect error:
/// Connection refused (os error 111)").
fn cause_chain(status: &tonic::Status) -> String {
    crate::error::message_chain(status.message().to_string(), status.source())
}

/// A tonic request carrying the call's deadline as `grpc-timeout`.
fn request<T>(message: T, options: CallOptions) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(options.remaining());
    request
}

impl std::fmt::Debug for GrpcPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcPeer")
            .field("task", &self.task)
            .field("address", &self.address)
            .finish()
    }
}

/// Implements [`Peer`] as calls of the same name on the tonic client, but for RecvTensor.
macro_rules! remote {
    ($($method:ident: $rpc:ident($req:ty) -> $resp:ty, $waits:literal, $doc:literal;)*) => {$(
        fn $method(&self, message: $req, options: CallOptions) -> PeerFuture<'_, $resp> {
            remote_call!($method, $rpc, self, message, options)
        }
    )*};
}

macro_rules! remote_call {
    // Tensors are gathered into one pooled buffer and decoded without copying their content
    // ([`crate::wire`]); the bytes on the wire are tonic's.
    (recv_tensor, $rpc:ident, $peer:ident, $message:ident, $options:ident) => {{
        let mut channel = $peer.channel.clone();
        let call = async move {
            crate::wire::recv_tensor(
                &mut channel,
                $message,
                $options.remaining(),
                MAX_MESSAGE_BYTES,
            )
            .await
            .map(tonic::Response::new)
        };
        Box::pin($peer.call(Rpc::$rpc, $options, call))
    }};
    ($method:ident, $rpc:ident, $peer:ident, $message:ident, $options:ident) => {{
        // The client is a cheap handle on the shared channel; calls need it mutably.
        let mut client = $peer.client.clone();
        let call = async move { client.$method(request($message, $options)).await };
        Box::pin($peer.call(Rpc::$rpc, $options, call))
    }};
}

impl Peer for GrpcPeer {
    fn task(&self) -> &TaskId {
        &self.task
    }

    worker_rpcs!(remote);

    fn tensor_channel(&self) -> Option<&TensorChannel> {
        self.tensor_channel.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;

    #[test]
    fn needs_a_runtime_and_says_so() {
        let err = GrpcPeer::connect_lazy(TaskId::new("ps", 0), "h:1", Duration::from_secs(1))
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition);
        assert!(
            err.message().contains("/job:ps/replica:0/task:0 at h:1"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_malformed_address_names_the_task() {
        let err = GrpcPeer::connect_lazy(TaskId::new("ps", 1), "h:x y", Duration::from_secs(1))
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(
            err.message()
                .contains("`h:x y` of /job:ps/replica:0/task:1"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn statuses_the_task_sent_keep_their_code_and_gain_the_task() {
        let peer =
            GrpcPeer::connect_lazy(TaskId::new("ps", 0), "h:1", Duration::from_secs(1)).unwrap();
        let options = CallOptions::timeout(Duration::from_secs(5));
        let status = peer.rewrite(
            Rpc::RunGraph,
            options,
            tonic::Status::aborted("Step 7 aborted"),
        );
        assert_eq!(status.code(), Code::Aborted);
        assert_eq!(
            status.message(),
            "RunGraph on /job:ps/replica:0/task:0 at h:1: Step 7 aborted"
        );
    }
}
