//! Partitioning: splits a placed graph into one `GraphDef` per location, joining the pieces
//! with `_Send`/`_Recv` pairs, as TensorFlow's `graph_partition.cc` does (reference §5.3–5.4).
//!
//! The master partitions by task ([`by_task`]: `/job:J/replica:R/task:T`) and registers one
//! partition with each task; a worker partitions its piece again by device ([`by_device`]).
//! For every edge between locations:
//!
//! - a data edge gets a `_Send` in the producer's partition (on the producer's device) and a
//!   `_Recv` in the consumer's (on the consumer's device), both carrying `tensor_name =
//!   "edge_<id>_<producer>"`, `send_device`, `send_device_incarnation`, `recv_device` and
//!   `client_terminated = false`; `T` on the send and `tensor_type` on the recv;
//! - a control edge gets a dummy `Const` (float, shape `[0]`) with a control input from the
//!   producer, feeding a `_Send`; the other side gets `_Recv` → `Identity`, and the consumer a
//!   control input on that `Identity`.
//!
//! One pair serves every consumer of the same output in the same partition. Edge ids number
//! the graph's edges in a stable order (consumers in graph order, each one's inputs in order,
//! control inputs included, from 0); TensorFlow uses its in-memory edge ids, which no peer
//! relies on beyond both ends of a pair agreeing. New nodes are named like TensorFlow's:
//! `<producer>_S<n>` (and `<producer>/ctrl_S<n>` for the dummy `Const`), with `n` from a
//! counter the caller keeps per master session so names never repeat across partitionings.

use std::collections::{BTreeMap, HashMap};

use crate::cluster::DeviceName;
use crate::error::{Result, Status};
use crate::exec::edges::{tensor_input, GraphEdges};
use crate::graph::attr;
use crate::proto::{AttrValue, GraphDef, NodeDef};
use crate::runtime::rendezvous::PairAttrs;
use crate::tensor::{DType, Shape, Tensor};

/// What partitioning needs besides the placed graph.
pub struct PartitionOptions<'a> {
    /// The location of a placed node: [`by_task`] for the master, [`by_device`] for a worker.
    pub node_to_loc: &'a dyn Fn(&NodeDef) -> Result<String>,
    /// The incarnation of a device (from `GetStatus`), copied into every pair it sends from.
    pub incarnation: &'a dyn Fn(&str) -> Option<u64>,
    /// The dtype of a node's output; the op registry's answer in production.
    pub output_dtype: &'a dyn Fn(&NodeDef, usize) -> Result<DType>,
}

/// Locates a node by task: the `/job:J/replica:R/task:T` part of its device.
pub fn by_task(node: &NodeDef) -> Result<String> {
    let device = placed_device(node)?;
    // A fully specified name always has its task part.
    Ok(device.task_name().unwrap_or_default())
}

/// Locates a node by device: its full device name.
pub fn by_device(node: &NodeDef) -> Result<String> {
    Ok(placed_device(node)?.to_string())
}

fn placed_device(node: &NodeDef) -> Result<DeviceName> {
    let spec = DeviceName::parse(&node.device)
        .map_err(|e| e.context(format!("device of node `{}`", node.name)))?;
    if !spec.is_fully_specified() {
        return Err(Status::invalid_argument(format!(
            "node `{}` has device `{}`, not a full device name; place the graph before \
             partitioning it",
            node.name, node.device
        )));
    }
    Ok(spec)
}

pub(crate) fn new_node(name: String, op: &str, device: &str, input: Vec<String>) -> NodeDef {
    NodeDef {
        name,
        op: op.into(),
        device: device.into(),
        input,
        ..Default::default()
    }
}

/// TensorFlow's debugging attrs naming the original ends of a cut edge.
fn mark_ends(node: &mut NodeDef, src: &str, dst: &str) {
    node.attr.insert("_src".into(), attr::value::string(src));
    node.attr.insert("_dst".into(), attr::value::string(dst));
}

/// What a consumer's partition reads in place of a cut edge: the `_Recv` for data, the
/// `Identity` after the `_Recv` for control.
type Replacement = String;

struct Partitioner<'g, 'o> {
    graph: &'g GraphDef,
    options: &'o PartitionOptions<'o>,
    counter: &'o mut u64,
    locs: Vec<String>,
    parts: BTreeMap<String, Vec<NodeDef>>,
    /// (producer, output or None for control, consumer's location) → replacement input.
    pairs: HashMap<(usize, Option<usize>, String), Replacement>,
}

/// Splits a placed graph into one `GraphDef` per location, each with the graph's `versions`
/// and `library`. `counter` numbers new nodes and advances past every name used.
pub fn partition(
    graph: &GraphDef,
    options: &PartitionOptions<'_>,
    counter: &mut u64,
) -> Result<BTreeMap<String, GraphDef>> {
    let edges = GraphEdges::new(graph)?;
    let locs = graph
        .node
        .iter()
        .map(|n| (options.node_to_loc)(n))
        .collect::<Result<Vec<_>>>()?;
    let mut p = Partitioner {
        graph,
        options,
        counter,
        locs,
        parts: BTreeMap::new(),
        pairs: HashMap::new(),
    };
    for (dst, original) in graph.node.iter().enumerate() {
        let mut node = original.clone();
        for &e in &edges.in_edges[dst] {
            let edge = edges.edges[e];
            if p.locs[edge.src] == p.locs[dst] {
                continue;
            }
            let key = (edge.src, edge.src_slot, p.locs[dst].clone());
            let replacement = match p.pairs.get(&key) {
                Some(r) => r.clone(),
                None => {
                    let r = p.cut(edge.src, edge.src_slot, dst, e)?;
                    p.pairs.insert(key, r.clone());
                    r
                }
            };
            node.input[edge.dst_input] = match edge.src_slot {
                Some(_) => replacement,
                None => format!("^{replacement}"),
            };
        }
        p.parts.entry(p.locs[dst].clone()).or_default().push(node);
    }
    Ok(p.parts
        .into_iter()
        .map(|(loc, node)| {
            let part = GraphDef {
                node,
                versions: graph.versions.clone(),
                library: graph.library.clone(),
                version: graph.version,
            };
            (loc, part)
        })
        .collect())
}

impl Partitioner<'_, '_> {
    fn next_name(&mut self, prefix: &str) -> String {
        let name = format!("{prefix}_S{}", self.counter);
        *self.counter += 1;
        name
    }

    /// Adds the send side and the receive side of edge `edge_id` from `src` (output `slot`,
    /// or control) to `dst`; returns the name the consumer's partition reads instead.
    fn cut(
        &mut self,
        src: usize,
        slot: Option<usize>,
        dst: usize,
        edge_id: usize,
    ) -> Result<String> {
        let graph = self.graph;
        let (src_node, dst_node) = (&graph.node[src], &graph.node[dst]);
        let incarnation = (self.options.incarnation)(&src_node.device).ok_or_else(|| {
            Status::failed_precondition(format!(
                "no incarnation known for device `{}` of node `{}`; the device set the master \
                 collected from GetStatus does not list it",
                src_node.device, src_node.name
            ))
        })?;
        let tensor_name = format!("edge_{edge_id}_{}", src_node.name);
        let pair = PairAttrs {
            tensor_name: &tensor_name,
            send_device: &src_node.device,
            incarnation,
            recv_device: &dst_node.device,
            client_terminated: false,
        };
        let (src_loc, dst_loc) = (self.locs[src].clone(), self.locs[dst].clone());
        let (mut send, mut recv, extra_src, extra_dst) = match slot {
            Some(slot) => {
                let dtype = (self.options.output_dtype)(src_node, slot)
                    .map_err(|e| e.context(format!("output {slot} of node `{}`", src_node.name)))?;
                let input = tensor_input(&src_node.name, slot);
                let send_name = self.next_name(&src_node.name);
                let recv_name = self.next_name(&src_node.name);
                let send = pair.send(send_name, input, &src_node.device, dtype);
                let recv = pair.recv(recv_name, &dst_node.device, dtype);
                (send, recv, None, None)
            }
            None => {
                let ctrl_name = self.next_name(&format!("{}/ctrl", src_node.name));
                let mut ctrl = new_node(
                    ctrl_name.clone(),
                    "Const",
                    &src_node.device,
                    vec![format!("^{}", src_node.name)],
                );
                let empty = Tensor::zeros(DType::Float, Shape::new(vec![0]))?;
                ctrl.attr
                    .insert("dtype".into(), attr::value::dtype(DType::Float));
                ctrl.attr
                    .insert("value".into(), attr::value::tensor(empty.to_proto()));
                let send_name = self.next_name(&src_node.name);
                let recv_name = self.next_name(&src_node.name);
                let send = pair.send(send_name, ctrl_name, &src_node.device, DType::Float);
                let recv = pair.recv(recv_name.clone(), &dst_node.device, DType::Float);
                let mut identity = new_node(
                    self.next_name(&src_node.name),
                    "Identity",
                    &dst_node.device,
                    vec![recv_name],
                );
                identity.attr.insert("T".into(), float_type());
                (send, recv, Some(ctrl), Some(identity))
            }
        };
        mark_ends(&mut send, &src_node.name, &dst_node.name);
        mark_ends(&mut recv, &src_node.name, &dst_node.name);
        // Inside a while loop across devices, the receive runs once per iteration of its frame.
        if let Some(gate) = crate::exec::control_loops::gate_of(dst_node) {
            recv.input.push(format!("^{gate}"));
        }
        let replacement = extra_dst
            .as_ref()
            .map_or_else(|| recv.name.clone(), |n| n.name.clone());
        let src_part = self.parts.entry(src_loc).or_default();
        src_part.extend(extra_src);
        src_part.push(send);
        let dst_part = self.parts.entry(dst_loc).or_default();
        dst_part.push(recv);
        dst_part.extend(extra_dst);
        Ok(replacement)
    }
}

fn float_type() -> AttrValue {
    attr::value::dtype(DType::Float)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::rendezvous::rendezvous_key_of;

    #[test]
    fn rendezvous_key_of_a_pair_node_matches_tensorflow_layout() {
        // From golden traffic 0057 (a RecvTensor from a real TensorFlow worker).
        let mut recv = new_node("r".into(), "_Recv", "", vec![]);
        PairAttrs {
            tensor_name: "edge_15_MatMul/ReadVariableOp",
            send_device: "/job:ps/replica:0/task:0/device:CPU:0",
            incarnation: 0xe4b96570c8394f81,
            recv_device: "/job:worker/replica:0/task:0/device:CPU:0",
            client_terminated: false,
        }
        .apply(&mut recv);
        assert_eq!(
            rendezvous_key_of(&recv).unwrap().as_str(),
            "/job:ps/replica:0/task:0/device:CPU:0;e4b96570c8394f81;\
             /job:worker/replica:0/task:0/device:CPU:0;edge_15_MatMul/ReadVariableOp;0:0"
        );
        recv.attr.remove("send_device_incarnation");
        assert!(rendezvous_key_of(&recv)
            .unwrap_err()
            .message()
            .contains("`r`"));
    }

    #[test]
    fn by_task_needs_a_placed_node() {
        let mut node = new_node("n".into(), "NoOp", "/job:ps/task:0", vec![]);
        assert!(by_task(&node).unwrap_err().message().contains("`n`"));
        node.device = "/job:ps/replica:0/task:0/device:CPU:0".into();
        assert_eq!(by_task(&node).unwrap(), "/job:ps/replica:0/task:0");
        assert_eq!(by_device(&node).unwrap(), node.device);
    }
}
