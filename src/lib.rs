//! tessera: a distributed training runtime with TensorFlow's distributed architecture.
//!
//! ```text
//!              gRPC (tonic)                       mailboxes (actix)
//! client ───► MasterService ──► Master ──► MasterSession   (one per client session:
//!                                               │           place, partition, register, run steps)
//!                                               ▼  Peer: local mailbox | remote gRPC | simulated
//! peers  ───► WorkerService ──► Worker ──► Tower            (one per local device, CPU:i / GPU:i;
//!                                   │          │             runs its device's subgraph for a step)
//!                                   ▼          ▼
//!                              Rendezvous   VariableShard    (the variables and optimizer slots
//!                           (per step_id)                     this task hosts; applies updates)
//! ```
//!
//! Every task runs one daemon serving TensorFlow's MasterService and WorkerService on one port.
//! Inside a daemon, actors talk through mailboxes; between daemons, over gRPC with TensorFlow's
//! own messages ([`proto`]), so stock TensorFlow clients and tasks can talk to tessera tasks.
//! Between two tessera tasks in plain text, RecvTensor takes the tensor channel on the same
//! port instead ([`wire::channel`]): plain TCP with the copies of raw TCP.

pub mod client;
pub mod cluster;
pub mod codec;
pub mod data;
pub mod device;
pub mod error;
pub mod graph;
pub mod kernels;
pub mod master;
pub mod ops;
pub mod peer;
pub mod proto;
pub mod runtime;
pub mod security;
pub mod server;
pub mod shard;
pub mod tensor;
pub mod tower;
pub mod train;
pub mod wire;
pub mod worker;

pub use error::{Code, Result, Status};
