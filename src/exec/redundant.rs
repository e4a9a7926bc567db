//! Two more of grappler's rewrites, run with the Identity removal ([`super::identities`]) on
//! every partition a worker registers for a CPU device: nodes a step runs for nothing.
//!
//! - **NoOps that only pass waiting on.** A `NoOp` with control inputs and readers is dropped;
//!   each reader waits for what it waited for. Lowering a functional `While` (a TF2 loop, or
//!   `tf.compat.v1` control flow v2) puts three in each iteration (the condition's and the
//!   body's `input_control_node`, the body's `output_control_node`), about a hundred in an
//!   LSTM's training step over 16 steps; grappler's dependency optimizer drops them. Kept: a
//!   `NoOp` with no reader (a client's train op: its end is the step's), one with no control
//!   input (nothing to move onto its readers, which would leave their frame), one that waits
//!   on a `Switch` (where the graph hangs a branch's waiting on, it stays), and one too wide
//!   to pay (more edges after than before, as grappler counts).
//! - **Constants made twice.** `Const` nodes of one value, dtype and device that wait for the
//!   same nodes are one: the first stays and the others' readers read it. Inside a loop each
//!   runs every iteration: the same LSTM step ran 463 `Const` nodes where TensorFlow, whose
//!   grappler merges them, runs 101 (each `TensorListPopBack` of the backward loop has its own
//!   `element_shape` of -1).
//!
//! Both keep every value a step computes and every wait it honours; only nodes go.

use std::collections::{HashMap, HashSet};

use prost::Message;

use crate::error::Result;
use crate::exec::edges::{add_control_input, remove_nodes, GraphEdges};
use crate::proto::GraphDef;

/// Drops the `NoOp`s of `graph` that only pass waiting on (see the module), each reader
/// waiting for the `NoOp`'s control inputs instead; returns how many it dropped.
pub fn bypass_no_ops(graph: &mut GraphDef) -> Result<usize> {
    let edges = GraphEdges::new(graph)?;
    let op = |i: usize| graph.node[i].op.as_str();
    let mut dropped = vec![false; graph.node.len()];
    for (i, node) in graph.node.iter().enumerate() {
        if node.op != "NoOp" {
            continue;
        }
        let (ins, outs) = (&edges.in_edges[i], &edges.out_edges[i]);
        let (fan_in, fan_out) = (ins.len(), outs.len());
        let waits_on = || ins.iter().map(|&e| edges.edges[e].src);
        dropped[i] = fan_in > 0
            && fan_out > 0
            && fan_in * fan_out <= fan_in + fan_out
            && ins.iter().all(|&e| edges.edges[e].src_slot.is_none())
            && waits_on().all(|src| !matches!(op(src), "Switch" | "RefSwitch"));
    }
    // A chain of dropped NoOps resolves to the nodes the first kept ones wait on.
    fn resolve(i: usize, edges: &GraphEdges, dropped: &[bool], into: &mut Vec<usize>) {
        for &e in &edges.in_edges[i] {
            let src = edges.edges[e].src;
            if dropped[src] {
                resolve(src, edges, dropped, into);
            } else if !into.contains(&src) {
                into.push(src);
            }
        }
    }
    let names: Vec<String> = graph.node.iter().map(|n| n.name.clone()).collect();
    let mut waits: Vec<(usize, Vec<usize>)> = Vec::new();
    for i in (0..graph.node.len()).filter(|&i| dropped[i]) {
        let mut on = Vec::new();
        resolve(i, &edges, &dropped, &mut on);
        for &e in &edges.out_edges[i] {
            let reader = edges.edges[e].dst;
            if !dropped[reader] {
                waits.push((reader, on.clone()));
            }
        }
    }
    for (reader, on) in waits {
        for src in on {
            add_control_input(&mut graph.node[reader], &names[src]);
        }
    }
    // Their readers' control inputs naming them go with them.
    let gone: HashSet<String> = (0..names.len())
        .filter(|&i| dropped[i])
        .map(|i| format!("^{}", names[i]))
        .collect();
    for node in &mut graph.node {
        node.input.retain(|i| !gone.contains(i));
    }
    Ok(remove_nodes(graph, |i| dropped[i]))
}

/// Merges the `Const` nodes of `graph` that are one constant (see the module); returns how
/// many it dropped.
pub fn merge_constants(graph: &mut GraphDef) -> Result<usize> {
    let edges = GraphEdges::new(graph)?;
    let names: Vec<String> = graph.node.iter().map(|n| n.name.clone()).collect();
    let mut first: HashMap<ConstantKey<'_>, usize> = HashMap::new();
    let mut kept_as: Vec<Option<usize>> = vec![None; graph.node.len()];
    for (i, node) in graph.node.iter().enumerate() {
        let (Some(dtype), Some(value)) = (node.attr.get("dtype"), node.attr.get("value")) else {
            continue;
        };
        if node.op != "Const" {
            continue;
        }
        let mut waits: Vec<usize> = edges.in_edges[i]
            .iter()
            .map(|&e| edges.edges[e].src)
            .collect();
        waits.sort_unstable();
        waits.dedup();
        let key = (
            node.device.as_str(),
            dtype.encode_to_vec(),
            value.encode_to_vec(),
            waits,
        );
        let kept = *first.entry(key).or_insert(i);
        if kept != i {
            kept_as[i] = Some(kept);
        }
    }
    let mut readers = Vec::new();
    for (i, kept) in kept_as.iter().enumerate() {
        let Some(kept) = *kept else { continue };
        for &e in &edges.out_edges[i] {
            let edge = edges.edges[e];
            graph.node[edge.dst].input[edge.dst_input] = match edge.src_slot {
                Some(_) => names[kept].clone(),
                None => format!("^{}", names[kept]),
            };
            readers.push(edge.dst);
        }
    }
    // A reader of two merged constants by control edges may now name the kept one twice.
    for reader in readers {
        let mut seen = HashSet::new();
        graph.node[reader]
            .input
            .retain(|i| !i.starts_with('^') || seen.insert(i.clone()));
    }
    Ok(remove_nodes(graph, |i| kept_as[i].is_some()))
}

/// What makes two constants one: the device, the dtype and value as encoded, and the nodes
/// waited for (sorted, once each).
type ConstantKey<'g> = (&'g str, Vec<u8>, Vec<u8>, Vec<usize>);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::attr::value;
    use crate::proto::test_node as node;
    use crate::proto::NodeDef;
    use crate::tensor::Tensor;

    fn inputs<'g>(graph: &'g GraphDef, name: &str) -> Vec<&'g str> {
        let node = graph.node.iter().find(|n| n.name == name).unwrap();
        node.input.iter().map(String::as_str).collect()
    }

    fn names(graph: &GraphDef) -> Vec<&str> {
        graph.node.iter().map(|n| n.name.as_str()).collect()
    }

    fn constant(name: &str, v: Tensor, waits: &[&str]) -> NodeDef {
        let mut n = node(name, "Const", waits);
        n.attr.insert("dtype".into(), value::dtype(v.dtype()));
        n.attr.insert("value".into(), value::tensor(v.to_proto()));
        n
    }

    #[test]
    fn a_loop_bodys_no_ops_hand_their_waiting_to_their_readers() {
        // A lowered While's body: the pivot, the body's input and output control nodes, a
        // constant and an op waiting on the first, NextIteration on the second; a train op
        // with no reader; one NoOp on a Switch; one too wide (2 inputs, 3 readers).
        let mut graph = GraphDef {
            node: vec![
                node("p", "Placeholder", &[]),
                node("switch", "Switch", &["p", "p"]),
                node("pivot", "Identity", &["switch:1"]),
                node("input_control", "NoOp", &["^pivot"]),
                node("one", "Const", &["^input_control"]),
                node("add", "AddV2", &["switch:1", "one", "^input_control"]),
                node("output_control", "NoOp", &["^input_control"]),
                node("next", "NextIteration", &["add", "^output_control"]),
                node("on_branch", "NoOp", &["^switch"]),
                node("after_branch", "Neg", &["p", "^on_branch"]),
                node("wide", "NoOp", &["^p", "^add"]),
                node("r1", "Neg", &["p", "^wide"]),
                node("r2", "Neg", &["p", "^wide"]),
                node("r3", "Neg", &["p", "^wide"]),
                node("train", "NoOp", &["^r1", "^r2"]),
            ],
            ..Default::default()
        };
        assert_eq!(bypass_no_ops(&mut graph).unwrap(), 2);
        assert!(!names(&graph).contains(&"input_control"));
        assert!(!names(&graph).contains(&"output_control"));
        assert_eq!(inputs(&graph, "one"), ["^pivot"]);
        assert_eq!(inputs(&graph, "add"), ["switch:1", "one", "^pivot"]);
        assert_eq!(inputs(&graph, "next"), ["add", "^pivot"]);
        for kept in ["on_branch", "wide", "train"] {
            assert!(names(&graph).contains(&kept), "{kept} kept");
        }
        GraphEdges::new(&graph).expect("every input names a node");
    }

    #[test]
    fn constants_of_one_value_and_one_wait_are_one() {
        let minus_one = || Tensor::from_vec(vec![1], vec![-1i32]).unwrap();
        let mut graph = GraphDef {
            node: vec![
                node("pivot", "Placeholder", &[]),
                node("other", "Placeholder", &[]),
                constant("shape_a", minus_one(), &["^pivot"]),
                constant("shape_b", minus_one(), &["^pivot"]),
                constant("shape_c", minus_one(), &["^pivot", "^pivot"]),
                // Another wait, another dtype, another value: kept apart.
                constant("elsewhere", minus_one(), &["^other"]),
                constant(
                    "wide",
                    Tensor::from_vec(vec![1], vec![-1i64]).unwrap(),
                    &["^pivot"],
                ),
                constant(
                    "two",
                    Tensor::from_vec(vec![1], vec![2i32]).unwrap(),
                    &["^pivot"],
                ),
                node("pop_a", "TensorListPopBack", &["pivot", "shape_a"]),
                node("pop_b", "TensorListPopBack", &["pivot", "shape_b:0"]),
                node("after", "NoOp", &["^shape_b", "^shape_c", "^two"]),
                node("also", "Neg", &["elsewhere", "wide", "two"]),
            ],
            ..Default::default()
        };
        assert_eq!(merge_constants(&mut graph).unwrap(), 2);
        assert!(!names(&graph).contains(&"shape_b") && !names(&graph).contains(&"shape_c"));
        assert_eq!(inputs(&graph, "pop_a"), ["pivot", "shape_a"]);
        assert_eq!(inputs(&graph, "pop_b"), ["pivot", "shape_a"]);
        assert_eq!(inputs(&graph, "after"), ["^shape_a", "^two"]);
        assert_eq!(inputs(&graph, "also"), ["elsewhere", "wide", "two"]);
        GraphEdges::new(&graph).expect("every input names a node");
    }
}
