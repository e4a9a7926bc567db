//! Running graphs: placement and partitioning of client graphs, the dataflow executor, the devices
//! it runs on, the threads that run its nodes, step cancellation, the per-device resource store
//! (variables) and the per-step rendezvous where sends meet receives and all-reduces meet.

pub mod accumulator;
pub mod cancel;
pub mod collective;
pub mod control_loops;
pub mod device;
mod edges;
pub mod executor;
pub mod partition;
pub mod placement;
pub mod pool;
pub mod queue;
pub mod rendezvous;
pub mod resource;
pub mod subgraph;
pub mod wait;

pub use cancel::CancellationToken;
pub use device::Device;
pub use executor::{Executor, InlineLimits, KernelLookup, StepOptions, TensorRef};
