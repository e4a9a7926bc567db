//! tessera: a distributed training runtime with TensorFlow's distributed architecture.
//!
//! ```text
//!              gRPC (tonic)                        mailboxes (actix)
//! client ───► MasterService ──► Master ──► MasterSession  (one per client session:
//!                                               │          place, partition, register, run steps)
//!                                               ▼  Peer: LocalPeer | GrpcPeer | FailoverPeer
//!                                               │        | SimulatedPeer
//! peers  ───► WorkerService ─┐                  │
//! (gRPC or tensor channel)   ├──► WorkerHandler (the worker's one service trait, implemented
//!             LocalPeer ─────┘     by WorkerState: sessions, registered graphs, rendezvous)
//!                                       │ hands each device's partition of a step to its tower;
//!                                       │ a cross-task `_Recv` pulls through RemoteRecv, which
//!                                       ▼ the peers implement (peer::RemoteFetcher)
//!                               Tower ×N      one per device (CPU:i / GPU:i): starts the
//!                                             device's part of each step, its nodes on the
//!                                             device's own threads (tessera-CPU:i-N)
//!                               VariableShard one per device: the device's variables and
//!                               ×N            slots, consistent snapshots and restores; on a
//!                                             ps task with a standby, its ReplicaState keeps
//!                                             the standby's copy (ReplicaService) current
//!                               Worker        owns the towers and shards; collects stale
//!                                             steps and sessions
//! ```
//!
//! Every task runs one daemon serving TensorFlow's MasterService and WorkerService on one port.
//! Inside a daemon, actors talk through mailboxes and the worker's service is called directly;
//! between daemons, over gRPC with TensorFlow's own messages ([`proto`]), so stock TensorFlow
//! clients and tasks can talk to tessera tasks. Between two tessera tasks in plain text,
//! RecvTensor takes the tensor channel on the same port instead ([`wire::channel`]): plain TCP
//! with the copies of raw TCP.
//!
//! ## Layers
//!
//! The top-level modules form layers, lowest first; a module imports only from its own row and
//! the rows below, and `tests/layers.rs` fails on an import that points up or closes a cycle:
//!
//! | row | modules | what goes there |
//! |-----|---------|-----------------|
//! | 1 | [`codec`], [`proto`], [`error`] | TensorFlow's messages, their codec, [`Status`] |
//! | 2 | [`tensor`] | tensors, dtypes, shapes, variables' storage |
//! | 3 | [`format`] | files: V2 checkpoints, TFRecord, event files, allowed paths |
//! | 4 | [`data`] | data sets |
//! | 5 | [`security`] | TLS and the cluster token |
//! | 6 | [`cluster`] | cluster specs, device names, the task's configuration |
//! | 7 | [`ops`] | metrics, the RPC layer, systemd |
//! | 8 | [`graph`] | the op registry, the builder, gradients, lowering |
//! | 9 | [`device`] | device types, discovery, memory budgets, device memory spaces |
//! | 10 | [`runtime`] | what kernels run against: devices, resources, rendezvous, per-step state |
//! | 11 | [`kernels`] | CPU, CUDA and emulated-GPU kernels, functional ops |
//! | 12 | [`exec`] | placement, partitioning, the executor |
//! | 13 | [`tower`], [`shard`], [`worker`] | the daemon's actors, the worker's service and its table, a ps task's standby |
//! | 14 | [`wire`] | the transport: settings, RecvTensor framing, the tensor channel |
//! | 15 | [`peer`] | how a task reaches another |
//! | 16 | [`master`] | the master and its sessions |
//! | 17 | [`client`], [`train`] | sessions for programs; optimizers, checkpoints, training jobs |
//! | 18 | [`server`] | the daemon, wired together (then the `tessera` command) |
//!
//! When a lower layer needs something only a higher one can do, it defines a trait that the
//! higher one implements and the daemon injects: [`runtime::RemoteRecv`] (implemented by
//! [`peer::RemoteFetcher`]) lets a `_Recv` kernel pull from another task without the worker,
//! the rendezvous or the kernels knowing any transport.
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
//!   read-modify-write (updates apply one after the other); false computes from a snapshot
//!   without the lock, as TensorFlow's Hogwild updates race, when a reader still holds the
//!   value, and updates in place under the lock otherwise (copying a large variable to
//!   update it costs more than any wait).
//! - **One update is seen whole.** An update of a variable and its optimizer slots reads them
//!   together and stores them together, and a kernel reading several references (a
//!   `SaveV2`) reads them at one instant: no checkpoint holds a variable and its slots from
//!   different updates ([`tensor::var`]).
//! - **Reference edges read late.** The executor reads a reference when the consuming kernel
//!   runs (an `Identity` of a reference, a variable's `read`, passes the reference on), which
//!   is what TensorFlow's aliasing of the variable's buffer gives its readers.
//!
//! ## Control flow
//!
//! The executor ([`exec::executor`]) runs TensorFlow 1's control flow: dead tensors,
//! `Switch`/`Merge`, while-loop frames and iterations. Graphs without it run on a lock-free
//! engine that never pays for it. A loop whose body spans devices gets a control loop on
//! every device it touches ([`exec::control_loops`]), as TensorFlow's partitioner builds.

pub mod client;
pub mod cluster;
pub mod codec;
pub mod data;
pub mod dataset;
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
