//! What an operator sees of a running task: Prometheus metrics ([`metrics`]), the RPC layer
//! that counts calls and words the message-size refusal ([`rpc_layer`]), and systemd's
//! readiness, watchdog and journal ([`systemd`]), and the signals a blocking launcher waits for
//! ([`signals`]).
//!
//! The limits themselves are configuration (`[limits]`, [`crate::cluster::Limits`]) enforced
//! where the work happens: the master (graphs, sessions, steps in flight), the worker's gRPC
//! front (graphs), the variable store (bytes held) and tonic (message size).

pub mod metrics;
pub mod rpc_layer;
pub mod signals;
pub mod systemd;
