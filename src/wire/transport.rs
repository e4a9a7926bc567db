//! The transport settings every gRPC channel and server of a task shares: message size,
//! HTTP/2 windows and frames, no Nagle. The daemon's server, its peers, remote sessions and
//! `tessera status` all build their endpoints here, so both ends of a connection agree. And the
//! words of a call that failed in transit: too slow, unreachable, or cut off.

use std::time::Duration;

use crate::cluster::TaskId;
use crate::error::Status;
use crate::worker::Rpc;

/// Largest gRPC message, both ways: TensorFlow uses INT32_MAX (protobuf's 2 GiB ceiling), as
/// variables and gradients of big models travel in one message.
pub const MAX_MESSAGE_BYTES: usize = i32::MAX as usize;

/// HTTP/2 flow-control window of one stream. Tensors of many MiB cross the wire in one
/// response; with HTTP/2's 64 KiB default the sender stalls every window, so both ends
/// advertise large windows (memory is only used while a tensor is in flight).
pub const STREAM_WINDOW_BYTES: u32 = 32 << 20;

/// HTTP/2 flow-control window of a whole connection (several tensors may be in flight).
pub const CONNECTION_WINDOW_BYTES: u32 = 64 << 20;

/// Largest HTTP/2 frame either end accepts: fewer, larger frames for tensor payloads.
pub const MAX_FRAME_BYTES: u32 = 1 << 20;

/// A channel endpoint with tessera's transport settings (large windows and frames, no Nagle).
pub fn tune_endpoint(endpoint: tonic::transport::Endpoint) -> tonic::transport::Endpoint {
    endpoint
        .tcp_nodelay(true)
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
}

/// A tonic server builder with tessera's transport settings (the server side of
/// [`tune_endpoint`]: large windows and frames, no Nagle).
pub fn server_builder() -> tonic::transport::Server {
    tune_server(tonic::transport::Server::builder())
}

/// `builder` with tessera's transport settings (as [`server_builder`]), for a builder that
/// already carries other settings (TLS).
pub fn tune_server(builder: tonic::transport::Server) -> tonic::transport::Server {
    builder
        .tcp_nodelay(true)
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
}

/// DEADLINE_EXCEEDED for a call to `task` (living at `place`) that did not answer in time.
pub(crate) fn deadline_exceeded(task: &TaskId, place: &str, rpc: Rpc, budget: Duration) -> Status {
    Status::deadline_exceeded(format!(
        "{} {place} did not answer {rpc} within {}; check that the task is running and not \
         overloaded, or raise the deadline (timeouts.rpc)",
        task.device_prefix(),
        format_duration(budget),
    ))
}

/// UNAVAILABLE for a task that could not be reached at `address`.
pub(crate) fn unreachable(task: &TaskId, address: &str, cause: &str) -> Status {
    Status::unavailable(format!(
        "{} at {address} unreachable: {cause}",
        task.device_prefix()
    ))
}

/// UNAVAILABLE for a call to `task` at `address` whose connection broke while it was in flight.
pub(crate) fn lost_connection(task: &TaskId, address: &str, rpc: Rpc, cause: &str) -> Status {
    Status::unavailable(format!(
        "{} at {address} lost the connection during {rpc}: {cause}; the task may have crashed \
         or restarted",
        task.device_prefix()
    ))
}

/// Formats a duration the way people write it: "10 s", "200 ms", "1.5 s".
pub(crate) fn format_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else if d.as_secs() == 0 && d.subsec_nanos() % 1_000_000 == 0 {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:?}", d)
    }
}
