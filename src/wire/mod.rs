//! The RecvTensor fast path: TensorFlow's `RecvTensor` RPC framed by hand on both ends. The
//! sender never copies a tensor's bytes (the kernel's copy into the socket is the only one); the
//! receiver copies them once, from hyper's frame buffers into the buffer the tensor keeps.
//!
//! ```text
//!  sender (WorkerServer)                              receiver (GrpcPeer)
//!  Tensor ─ Bytes ─► [head | tensor_content | tail] ─► h2 ─► TCP ─► h2 frames ─► one pooled
//!          (shared, no encode copy)                                   buffer (sized from the
//!                                                                     gRPC header, aligned)
//!                                                   RecvTensorResponse::decode ─► Tensor
//!                                                   (tensor_content sliced, not copied)
//! ```
//!
//! tonic's generic path copies a tensor twice more: prost encodes `tensor_content` into tonic's
//! `BytesMut`, a fresh allocation whose pages fault in as they are written, and the receiver
//! gathers the frames into another fresh buffer. Here the sender hands the tensor's `Bytes`
//! to hyper (which writes large DATA payloads with vectored I/O, without copying), and the
//! receiver gathers into a buffer from [`pool`] whose pages are already mapped.
//!
//! What is left, measured by `benches/recv_tensor.rs`: one copy more than raw TCP on the
//! receiving side (HTTP/2 frames are parsed out of hyper's read buffer, so the socket cannot
//! read into the tensor's buffer), and tonic's per-call cost (channel, HTTP/2 stream, task
//! wake-ups), which dominates at 1 MiB.
//!
//! The bytes on the wire are exactly those of tonic and of TensorFlow's gRPC runtime
//! (`/tensorflow.WorkerService/RecvTensor`, a 5-byte message header, prost's encoding of
//! `RecvTensorResponse`), so stock TensorFlow tasks talk to tessera tasks either way. Every
//! other WorkerService RPC goes through tonic's generated code unchanged.
//!
//! Between two tessera tasks in plain text, RecvTensor skips gRPC altogether: the
//! [`channel`] carries it over plain TCP on the same port, negotiated per connection, with
//! the copies of raw TCP. This gRPC path is what TensorFlow tasks and TLS clusters use.

pub mod channel;
pub mod client;
pub mod message;
pub mod pool;
pub mod server;
pub mod transport;

pub use client::recv_tensor;
pub use server::WorkerServer;
pub use transport::{server_builder, tune_endpoint, tune_server, MAX_MESSAGE_BYTES};

/// The HTTP/2 path of TensorFlow's RecvTensor RPC.
pub const RECV_TENSOR_PATH: &str = "/tensorflow.WorkerService/RecvTensor";
