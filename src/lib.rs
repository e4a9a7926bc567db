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
//!
//! ## Variables: one storage for both kinds
//!
//! A variable's value lives in one [`tensor::Var`] on the device that owns it, whether the
//! graph reaches it as a resource (`VarHandleOp` → handle → `ReadVariableOp`) or as a
//! TensorFlow 1 reference (`VariableV2`, whose output is a reference tensor that `Assign`,
//! `Apply*` and `Scatter*` take as `Ref(T)` inputs). The decision, taken once:
//!
//! - **Snapshots are immutable.** A read is a reference-counted clone of the value, so a
//!   reader (a `_Send`, a checkpoint's `SaveV2`, a fetch) holds a consistent value however the
//!   variable changes after it: no checkpoint or transfer sees half an update.
//! - **Updates are in place when nobody holds a snapshot**, into a fresh buffer otherwise
//!   (copy-on-write, [`tensor::Tensor::update_in_place`]): steady-state training updates with
//!   no temporary and no copy.
//! - **`use_locking` is honoured**: true holds the variable's write lock across the whole
//!   read-modify-write (updates apply one after the other); false computes from a snapshot and
//!   stores the result without the lock, as TensorFlow's Hogwild updates race.
//! - **Reference edges read late.** The executor reads a reference when the consuming kernel
//!   runs (an `Identity` of a reference, a variable's `read`, passes the reference on), which
//!   is what TensorFlow's aliasing of the variable's buffer gives its readers.
//!
//! ## Control flow
//!
//! The executor ([`runtime::executor`]) runs TensorFlow 1's control flow: dead tensors,
//! `Switch`/`Merge`, while-loop frames and iterations. Graphs without it run on a lock-free
//! engine that never pays for it. A loop whose body spans devices gets a control loop on
//! every device it touches ([`runtime::control_loops`]), as TensorFlow's partitioner builds.

pub mod client;
pub mod cluster;
pub mod codec;
pub mod data;
pub mod device;
pub mod error;
pub mod exec;
pub mod format;
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
