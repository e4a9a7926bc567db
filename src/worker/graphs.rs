//! A registered graph: the task's partition of a master's graph, split once more by local
//! device, with one [`Executor`] per device (kernels created once, at RegisterGraph).
//!
//! Registration validates the partition before building anything, so that a bad graph is
//! INVALID_ARGUMENT naming the node and leaves the worker as it was: every node must carry the
//! full name of a device of this task, every op must have a kernel for that device's type, and
//! every input must name a node of the partition. The per-device split uses
//! [`partition::partition`] with [`partition::by_device`]: the `_Send`/`_Recv` pairs it inserts
//! between local devices meet in the step's in-process rendezvous. Each CPU device's piece
//! then loses the `Identity` nodes that only hand a value on (`exec::identities`), the `NoOp`s
//! that only pass waiting on and its constants made twice (`exec::redundant`), and has its
//! contractions fused (`exec::remap`: `MatMul`/`Conv2D` + `BiasAdd` + an activation become one
//! node), as TensorFlow's grappler rewrites a graph before it runs.

use std::collections::HashMap;
use std::sync::Arc;

use crate::cluster::DeviceName;
use crate::device::DeviceType;
use crate::error::{Result, Status};
use crate::exec::executor::{Executor, TensorRef};
use crate::exec::partition::{self, PartitionOptions};
use crate::exec::{create_kernel, kernel_for};
use crate::exec::{identities, redundant, remap};
use crate::graph::registry;
use crate::proto::{GraphDef, NodeDef};
use crate::runtime::device::Device;
use crate::tensor::DType;

/// One registered partition, ready to run step after step.
pub struct RegisteredGraph {
    handle: String,
    /// One per local device the partition uses, in device-name order.
    executors: Vec<Arc<Executor>>,
}

impl RegisteredGraph {
    /// Validates `graph` (this task's partition), splits it by device among `devices` (the
    /// session's view of the task's devices) and builds one executor per device.
    /// `incarnations` maps each local device name to its incarnation (from GetStatus);
    /// `session` is the worker session the graph belongs to.
    pub fn build(
        handle: String,
        session: &str,
        graph: &GraphDef,
        devices: &[Arc<Device>],
        incarnations: &HashMap<String, u64>,
    ) -> Result<Self> {
        let by_name: HashMap<&str, &Arc<Device>> = devices.iter().map(|d| (d.name(), d)).collect();
        validate(graph, &by_name)?;

        let incarnation = |device: &str| {
            let canonical = DeviceName::parse(device).ok()?.to_string();
            incarnations.get(&canonical).copied()
        };
        let options = PartitionOptions {
            node_to_loc: &partition::by_device,
            incarnation: &incarnation,
            output_dtype: &output_dtype,
        };
        // New pair nodes are named `<producer>_S<n>`; start past the master's own numbering so
        // they never collide with the pairs the master already inserted.
        let mut counter = next_free_suffix(graph);
        let parts = partition::partition(graph, &options, &mut counter)?;

        let mut executors = Vec::with_capacity(parts.len());
        for (loc, mut part) in parts {
            let device = by_name.get(loc.as_str()).ok_or_else(|| {
                Status::internal(format!(
                    "partitioning produced a piece for `{loc}`, which is not a device of this \
                     task"
                ))
            })?;
            if device.device_type() == DeviceType::Cpu {
                identities::remove_identities(&mut part)
                    .and_then(|_| redundant::bypass_no_ops(&mut part))
                    .and_then(|_| redundant::merge_constants(&mut part))
                    .and_then(|_| remap::fuse_contractions(&mut part))
                    .and_then(|_| remap::fuse_element_wise(&mut part))
                    .map_err(|e| e.context(format!("graph {handle} on {loc}")))?;
            }
            let targets: Vec<&str> = part.node.iter().map(|n| n.name.as_str()).collect();
            let executor = Executor::new(
                &part,
                &[],
                &[],
                &targets,
                Arc::clone(device),
                &create_kernel,
            )
            .map_err(|e| e.context(format!("graph {handle} on {loc}")))?
            .in_session(session);
            executors.push(Arc::new(executor));
        }
        Ok(Self { handle, executors })
    }

    /// Returns the handle the worker answered RegisterGraph with.
    pub fn handle(&self) -> &str {
        &self.handle
    }

    /// Returns the per-device executors.
    pub fn executors(&self) -> &[Arc<Executor>] {
        &self.executors
    }

    /// Returns what each device runs, one graph per device in device-name order (with the
    /// `_Send`/`_Recv` pairs between local devices): RunGraph's `partition_graph` when the
    /// master asks for them (`RunOptions.output_partition_graphs`).
    pub fn partition_graphs(&self) -> Vec<GraphDef> {
        self.executors
            .iter()
            .map(|e| GraphDef {
                node: e.nodes().cloned().collect(),
                ..Default::default()
            })
            .collect()
    }
}

impl std::fmt::Debug for RegisteredGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredGraph")
            .field("handle", &self.handle)
            .field(
                "devices",
                &self
                    .executors
                    .iter()
                    .map(|e| e.device().name())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Checks every node's device, op and inputs; INVALID_ARGUMENT naming the first bad node.
fn validate(graph: &GraphDef, devices: &HashMap<&str, &Arc<Device>>) -> Result<()> {
    let names: std::collections::HashSet<&str> =
        graph.node.iter().map(|n| n.name.as_str()).collect();
    let mut local: Vec<&str> = devices.keys().copied().collect();
    local.sort_unstable();
    for node in &graph.node {
        let device = DeviceName::parse(&node.device)
            .ok()
            .filter(DeviceName::is_fully_specified)
            .map(|d| d.to_string());
        let device = device
            .as_deref()
            .and_then(|d| devices.get(d))
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "node `{}` (op {}) is assigned to device `{}`, which is not a device of this \
                     task ({}); the master must register each task's own partition, with full \
                     device names",
                    node.name,
                    node.op,
                    node.device,
                    local.join(", ")
                ))
            })?;
        if kernel_for(&node.op, device.device_type()).is_none() {
            return Err(Status::invalid_argument(format!(
                "node `{}`: no {} kernel for op `{}` on {}; tessera does not implement this op \
                 for that device",
                node.name,
                device.device_type().as_str(),
                node.op,
                device.name()
            )));
        }
        for input in &node.input {
            let r = TensorRef::parse(input)
                .map_err(|e| e.context(format!("input of node `{}`", node.name)))?;
            if !names.contains(r.node) {
                return Err(Status::invalid_argument(format!(
                    "node `{}` has input `{input}`, but the partition has no node `{}`",
                    node.name, r.node
                )));
            }
        }
    }
    Ok(())
}

/// The dtype of output `slot` of `node`, from the op registry.
fn output_dtype(node: &NodeDef, slot: usize) -> Result<DType> {
    let types = registry::lookup(node)?.output_types(node)?;
    types.get(slot).copied().ok_or_else(|| {
        Status::invalid_argument(format!(
            "node `{}` (op {}) has {} outputs; output {slot} does not exist",
            node.name,
            node.op,
            types.len()
        ))
    })
}

/// One past the largest `n` of any node named `..._S<n>` in `graph` (0 when none is).
fn next_free_suffix(graph: &GraphDef) -> u64 {
    graph
        .node
        .iter()
        .filter_map(|n| n.name.rsplit_once("_S"))
        .filter_map(|(_, n)| n.parse::<u64>().ok())
        .map(|n| n + 1)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pair_numbering_starts_past_the_masters() {
        let node = |name: &str| NodeDef {
            name: name.into(),
            ..Default::default()
        };
        let graph = GraphDef {
            node: vec![node("x"), node("x_S4"), node("init/ctrl_S11"), node("a_Sb")],
            ..Default::default()
        };
        assert_eq!(next_free_suffix(&graph), 12);
        assert_eq!(next_free_suffix(&GraphDef::default()), 0);
    }
}
