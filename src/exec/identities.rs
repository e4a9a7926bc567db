//! The Identity removal of TensorFlow's grappler dependency optimizer, run on every partition
//! a worker registers for a CPU device: an `Identity` that only hands a value on is dropped,
//! and its readers read the value where it is made.
//!
//! A TensorFlow 1 graph is full of them: a `while_loop` passes each loop variable through one
//! per iteration (`while/Identity`), and the gradients of a loop add more on both sides, so an
//! LSTM's training step over 16 steps runs about two thousand. Each costs the executor a node:
//! a hand-off, its bookkeeping in the loop's frame, and a place on the step's critical path.
//! TensorFlow's master drops them before a step ever runs; a stock client talking to
//! tessera's master, and tessera's own sessions on a cluster, send them, so the worker does it.
//!
//! An `Identity` with control inputs is dropped too: its readers wait for them instead. What is
//! kept, as grappler keeps it: an `Identity` that something waits on by a control edge (after
//! a `Switch`, only it marks the branch taken); one with control inputs that a `Merge` reads (a
//! `Merge` does not die of a dead control input, so they cannot move onto it); one with no
//! reader (nothing to rewire); and one that reads a variable (or its handle, or a read of it),
//! a reference or a `_Recv` (it is where the value is taken: an `Identity` of a reference
//! passes the reference on, see the executor).

use crate::error::Result;
use crate::exec::edges::{add_control_input, remove_nodes, tensor_input, GraphEdges};
use crate::proto::{GraphDef, NodeDef};

/// Whether `source`, which an `Identity` reads, is where a value is taken rather than made:
/// a variable, its handle or a read of it (grappler keeps these too), an op that passes a
/// reference on, or a receive.
fn takes_a_value(source: &NodeDef) -> bool {
    matches!(
        source.op.as_str(),
        "VariableV2"
            | "Variable"
            | "TemporaryVariable"
            | "AutoReloadVariable"
            | "VarHandleOp"
            | "_VarHandlesOp"
            | "ReadVariableOp"
            | "_Recv"
            | "_HostRecv"
    ) || source.op.starts_with("Ref")
}

/// Drops every `Identity` of `graph` (a partition for a CPU device) that only hands a value on
/// (see the module), each reader reading the value from where the `Identity` read it, and
/// waiting for what the `Identity` waited for; returns how many it dropped.
pub fn remove_identities(graph: &mut GraphDef) -> Result<usize> {
    let edges = GraphEdges::new(graph)?;
    let is_merge = |i: usize| matches!(graph.node[i].op.as_str(), "Merge" | "RefMerge");
    // For each dropped node: the data input that stands for it, and its control inputs.
    let mut dropped: Vec<Option<Hand>> = vec![None; graph.node.len()];
    for (i, node) in graph.node.iter().enumerate() {
        if node.op != "Identity" {
            continue;
        }
        let (ins, outs) = (&edges.in_edges[i], &edges.out_edges[i]);
        let Some((&first, controls)) = ins.split_first() else {
            continue;
        };
        let input = &edges.edges[first];
        let Some(slot) = input.src_slot else {
            continue;
        };
        if controls.iter().any(|&e| edges.edges[e].src_slot.is_some()) {
            // Two data inputs: not an `Identity` this pass understands.
            continue;
        }
        let controls: Vec<usize> = controls.iter().map(|&e| edges.edges[e].src).collect();
        let readers = || outs.iter().map(|&e| &edges.edges[e]);
        let hands_on = !outs.is_empty()
            && readers().all(|e| e.src_slot.is_some())
            // A Merge does not die of a dead control input as other nodes do, so what an
            // `Identity` waits for cannot move onto one.
            && (controls.is_empty() || readers().all(|e| !is_merge(e.dst)))
            && !takes_a_value(&graph.node[input.src]);
        if hands_on {
            dropped[i] = Some(Hand {
                source: (input.src, slot),
                controls,
            });
        }
    }
    // A chain of dropped identities resolves to the first one's input, waiting for what any
    // of them waited for (a chain is never a cycle: a loop goes through `NextIteration`,
    // which is kept).
    let resolve = |i: usize| {
        let hand = dropped[i].as_ref().expect("a dropped node");
        let mut at = hand.source;
        let mut controls = hand.controls.clone();
        while let Some(up) = &dropped[at.0] {
            at = up.source;
            controls.extend(&up.controls);
        }
        (at, controls)
    };
    let names: Vec<String> = graph.node.iter().map(|n| n.name.clone()).collect();
    let mut rewired: Vec<(usize, usize, String, Vec<usize>)> = Vec::new();
    for i in (0..graph.node.len()).filter(|&i| dropped[i].is_some()) {
        let ((node, slot), controls) = resolve(i);
        let input = tensor_input(&names[node], slot);
        for &e in &edges.out_edges[i] {
            let edge = &edges.edges[e];
            if dropped[edge.dst].is_none() {
                rewired.push((edge.dst, edge.dst_input, input.clone(), controls.clone()));
            }
        }
    }
    for (dst, position, input, controls) in rewired {
        let reader = &mut graph.node[dst];
        reader.input[position] = input;
        for c in controls {
            add_control_input(reader, &names[c]);
        }
    }
    Ok(remove_nodes(graph, |i| dropped[i].is_some()))
}

/// What a dropped `Identity` stood for: its data input (node, output) and the nodes it waited
/// for by control edges.
#[derive(Clone)]
struct Hand {
    source: (usize, usize),
    controls: Vec<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::test_node as node;

    fn inputs<'g>(graph: &'g GraphDef, name: &str) -> Vec<&'g str> {
        let node = graph.node.iter().find(|n| n.name == name).unwrap();
        node.input.iter().map(String::as_str).collect()
    }

    #[test]
    fn a_loops_identities_are_dropped_and_their_readers_read_the_switch() {
        // One loop variable: Enter, Merge, Switch, the body's Identity, an op, NextIteration;
        // an Identity of an Identity after it; the Exit's reader through one more.
        let mut graph = GraphDef {
            node: vec![
                node("x", "Placeholder", &[]),
                node("enter", "Enter", &["x"]),
                node("merge", "Merge", &["enter", "next"]),
                node("cond", "LoopCond", &["merge"]),
                node("switch", "Switch", &["merge", "cond"]),
                node("body", "Identity", &["switch:1"]),
                node("body2", "Identity", &["body"]),
                node("double", "Add", &["body2", "body"]),
                node("next", "NextIteration", &["double"]),
                node("exit", "Exit", &["switch"]),
                node("out", "Identity", &["exit"]),
                node("read", "Neg", &["out"]),
            ],
            ..Default::default()
        };
        assert_eq!(remove_identities(&mut graph).unwrap(), 3);
        assert!(graph.node.iter().all(|n| n.op != "Identity"));
        assert_eq!(inputs(&graph, "double"), ["switch:1", "switch:1"]);
        assert_eq!(inputs(&graph, "read"), ["exit"]);
        assert_eq!(inputs(&graph, "merge"), ["enter", "next"]);
        GraphEdges::new(&graph).expect("every input names a node");
    }

    #[test]
    fn control_inputs_move_onto_the_readers_and_chains_resolve_to_the_first_input() {
        let mut graph = GraphDef {
            node: vec![
                node("p", "Placeholder", &[]),
                node("a", "NoOp", &[]),
                node("b", "NoOp", &[]),
                node("first", "Identity", &["p", "^a"]),
                node("second", "Identity", &["first", "^b"]),
                node("neg", "Neg", &["second", "^a"]),
                node("abs", "Abs", &["first", "first"]),
            ],
            ..Default::default()
        };
        assert_eq!(remove_identities(&mut graph).unwrap(), 2);
        assert_eq!(inputs(&graph, "neg"), ["p", "^a", "^b"]);
        assert_eq!(inputs(&graph, "abs"), ["p", "p", "^a"]);
    }

    #[test]
    fn identities_that_mark_a_branch_or_take_a_value_are_kept() {
        let mut graph = GraphDef {
            node: vec![
                node("p", "Placeholder", &[]),
                node("v", "VariableV2", &[]),
                node("recv", "_Recv", &[]),
                node("switch", "Switch", &["p", "p"]),
                node("pivot", "Identity", &["switch:1"]),
                node("then", "Const", &["^pivot"]),
                node("waits", "Identity", &["p", "^then"]),
                node("merge", "Merge", &["waits", "then"]),
                node("read", "Identity", &["v"]),
                node("handle", "VarHandleOp", &[]),
                node("value", "ReadVariableOp", &["handle"]),
                node("snapshot", "Identity", &["value"]),
                node("received", "Identity", &["recv"]),
                node("ref", "RefSwitch", &["v", "p"]),
                node("of_ref", "Identity", &["ref"]),
                node("unread", "Identity", &["p"]),
                node(
                    "sum",
                    "AddN",
                    &["merge", "read", "snapshot", "received", "of_ref"],
                ),
            ],
            ..Default::default()
        };
        let before = graph.clone();
        assert_eq!(remove_identities(&mut graph).unwrap(), 0);
        assert_eq!(graph, before);
    }
}
