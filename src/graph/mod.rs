//! Dataflow graphs with TensorFlow's op names and semantics: the op registry, the builder,
//! gradients, and reading `GraphDef`s that TensorFlow produced.
//!
//! A graph is a TensorFlow `GraphDef`: the builder appends `NodeDef`s, the executor runs them,
//! and the master partitions them, so every layer speaks the wire format.
//!
//! - [`registry`]: op definitions (signature, attrs and defaults, statefulness, shape and
//!   gradient functions), declared per family in `ops/`.
//! - [`builder`] and [`scope`]: [`Graph`], name / device / control / colocation scopes, typed
//!   [`Output`]s checked at build time.
//! - [`import`]: [`validate`] and [`Graph::from_graph_def`] for graphs TensorFlow wrote.
//! - [`function`] and [`lower`]: the functions of a graph's library, and lowering the
//!   functional ops that call them (`If`, `While`, `PartitionedCall`) to v1 control flow.
//! - [`partitioned`]: variables stored as parts spread over ps tasks.
//! - `control_flow`, `context` and `grad_state`: TensorFlow 1 conds and while loops in the
//!   builder ([`Graph::cond`], [`Graph::while_loop`]), the control-flow contexts that wire what
//!   is built inside them, and the gradient loops of while loops (counters, stacks of forward
//!   values, accumulators).
//! - [`gradients()`]: the backward graph, with per-op functions in `grads/`;
//!   [`sparse_gradients`] gives the gradient of a tensor read only through gathers as
//!   [`IndexedSlices`] (its rows and their indices).
//! - [`einsum`]: einsum equations, parsed once for the `Einsum` kernel, shape and gradient.
//! - [`window`]: the sliding-window geometry of convolutions and pooling (output sizes,
//!   padding, attr checks), shared by their shape functions and kernels.

pub mod attr;
pub mod builder;
pub mod const_value;
mod context;
mod control_flow;
pub mod einsum;
pub mod function;
mod grad_state;
pub mod gradients;
pub mod grads;
pub mod import;
pub mod indexed_slices;
pub mod lower;
mod ops;
pub mod partitioned;
pub mod registry;
pub mod scope;
pub mod shape_fn;
pub mod window;

pub use builder::{Graph, NodeSpec, Output, Variable, VariableKind};
pub use gradients::{gradients, gradients_with, GradientOptions};
pub use import::validate;
pub use indexed_slices::{sparse_gradients, GradientTensor, IndexedSlices};
pub use ops::{is_loop_back_edge, ControlFlowOp};
pub use partitioned::{
    fixed_size_partitioner, min_max_variable_partitioner, PartitionStrategy, PartitionedVariable,
    Partitioner, SaveSlice,
};
pub use scope::{
    byte_size_load_fn, replica_device_setter, replica_device_setter_with, DeviceFn,
    GreedyLoadBalancingStrategy, PsStrategy, ReplicaDeviceSetter, RoundRobinStrategy,
};
