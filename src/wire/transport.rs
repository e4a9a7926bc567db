//! The transport settings every gRPC channel and server of a task shares: message size,
//! HTTP/2 windows and frames, no Nagle. The daemon's server, its peers, remote sessions and
//! `tessera status` all build their endpoints here, so both ends of a connection agree.

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
