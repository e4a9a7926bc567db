//! Running graphs: placement of a client graph's nodes on devices, partitioning into one
//! graph per device (with `_Send`/`_Recv` pairs and control loops for cross-device edges),
//! the rewrite for a client's feeds and fetches, the reads of a checkpoint taken together, and
//! the dataflow executor that runs a partition's kernels for each step.
//!
//! Above the kernels (it creates and runs them) and below the actors that hold registered
//! graphs (the worker and its towers) and the master that builds them.

pub mod consistent_save;
pub mod control_loops;
mod edges;
pub mod executor;
pub mod partition;
pub mod placement;
pub mod subgraph;
pub mod support;

pub use executor::{Executor, InlineLimits, TensorRef};
