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
pub mod identities;
pub mod partition;
pub mod placement;
pub mod redundant;
pub mod remap;
pub mod subgraph;
pub mod support;

pub use executor::{Executor, InlineLimits, TensorRef};

use std::sync::Arc;

use crate::device::DeviceType;
use crate::error::{Result, Status};
use crate::kernels::{KernelFactory, OpKernel};
use crate::proto::NodeDef;

/// Returns the factory of `op`'s kernel on `device_type`: the kernels' families, and on the
/// CPU `tf.data`'s datasets and iterators ([`crate::dataset`]). Placement asks it which
/// devices can run a node.
pub fn kernel_for(op: &str, device_type: DeviceType) -> Option<KernelFactory> {
    match device_type {
        DeviceType::Cpu => {
            crate::dataset::kernel_for(op).or_else(|| crate::kernels::kernel_for(op, device_type))
        }
        DeviceType::Gpu => crate::kernels::kernel_for(op, device_type),
    }
}

/// Builds the kernel for `node` on `device_type` (see [`kernel_for`]), or UNIMPLEMENTED naming
/// the op and the node. What the daemon's executors create kernels with.
pub fn create_kernel(node: &NodeDef, device_type: DeviceType) -> Result<Arc<dyn OpKernel>> {
    let factory = kernel_for(&node.op, device_type).ok_or_else(|| {
        Status::unimplemented(format!(
            "no {} kernel for op {} (node `{}`)",
            device_type.as_str(),
            node.op,
            node.name
        ))
    })?;
    factory(node)
}
