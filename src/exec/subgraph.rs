//! Client-terminated feeds and fetches, and pruning: turns a placed graph into the graph of one
//! run signature (feeds, fetches, targets), as TensorFlow's master does before partitioning
//! (reference §5.2).
//!
//! Each feed `x:i` becomes a `_Recv` named `_recv_x_i` on the client device that every consumer
//! of `x:i` reads instead; each fetch `y:j` becomes a `_Send` named `_send_y_j` on the client
//! device. Both carry `tensor_name = "x:i"`, `send_device = recv_device = client device` and
//! `client_terminated = true`, so the master finds them under the rendezvous key it builds
//! from the tensor name (RunGraph's `send` and `recv_key`). Then everything that no fetch or
//! target needs is pruned, which is why a fed placeholder does not survive.

use std::collections::HashMap;

use crate::error::{Result, Status};
use crate::exec::edges::{tensor_input, GraphEdges, Input};
use crate::proto::{GraphDef, NodeDef};
use crate::runtime::rendezvous::PairAttrs;
use crate::tensor::DType;

/// One run signature and the client device its feeds and fetches cross.
pub struct ClientSignature<'a> {
    /// Fed tensors, `node:index` (`node` alone means output 0).
    pub feeds: &'a [String],
    /// Fetched tensors, `node:index`.
    pub fetches: &'a [String],
    /// Nodes to run without fetching anything from them.
    pub targets: &'a [String],
    /// The master task's device that talks to the client (its `CPU:0`).
    pub client_device: &'a str,
    /// That device's incarnation.
    pub client_incarnation: u64,
}

/// A feed or fetch: the node and its output index.
struct TensorId<'a> {
    node: &'a str,
    slot: usize,
}

impl TensorId<'_> {
    /// TensorFlow's canonical tensor name, always with the index: `x:0`.
    fn name(&self) -> String {
        format!("{}:{}", self.node, self.slot)
    }

    /// The node name TensorFlow gives the client-terminated end: `_recv_x_0`, `_send_x_0`.
    fn endpoint(&self, kind: &str) -> String {
        format!("_{kind}_{}_{}", self.node, self.slot)
    }
}

fn parse_tensor<'a>(text: &'a str, role: &str, edges: &GraphEdges) -> Result<TensorId<'a>> {
    let probe = NodeDef {
        name: format!("{role} `{text}`"),
        ..Default::default()
    };
    let input = Input::parse(text, &probe)?;
    match input.slot {
        Some(slot) if edges.by_name.contains_key(input.node) => Ok(TensorId {
            node: input.node,
            slot,
        }),
        Some(_) => Err(Status::not_found(format!(
            "{role} `{text}` names node `{}`, which is not in the graph",
            input.node
        ))),
        None => Err(Status::invalid_argument(format!(
            "{role} `{text}` is a control input; {role}s must be tensors (`node:index`)"
        ))),
    }
}

/// The attrs of a client-terminated pair: the client device is both ends.
fn client_pair<'a>(signature: &'a ClientSignature<'_>, tensor_name: &'a str) -> PairAttrs<'a> {
    PairAttrs {
        tensor_name,
        send_device: signature.client_device,
        incarnation: signature.client_incarnation,
        recv_device: signature.client_device,
        client_terminated: true,
    }
}

/// Rewrites `graph` for one signature: client-terminated `_Recv`/`_Send` for the feeds and
/// fetches, then pruned to what the fetches and targets need. `output_dtype` gives the dtype
/// of a node's output.
pub fn rewrite_for_client(
    graph: &GraphDef,
    signature: &ClientSignature<'_>,
    output_dtype: &dyn Fn(&NodeDef, usize) -> Result<DType>,
) -> Result<GraphDef> {
    let edges = GraphEdges::new(graph)?;
    let mut nodes = graph.node.clone();
    let add = |nodes: &mut Vec<NodeDef>, node: NodeDef| -> Result<()> {
        if edges.by_name.contains_key(&node.name) || nodes.iter().any(|n| n.name == node.name) {
            return Err(Status::invalid_argument(format!(
                "cannot add client endpoint `{}`: the graph already has a node of that name \
                 (is a tensor fed or fetched twice?)",
                node.name
            )));
        }
        nodes.push(node);
        Ok(())
    };
    // Fed tensor → the `_Recv` that replaces it.
    let mut fed: HashMap<(String, usize), String> = HashMap::new();
    for text in signature.feeds {
        let id = parse_tensor(text, "feed", &edges)?;
        let producer = &graph.node[edges.by_name[id.node]];
        let dtype =
            output_dtype(producer, id.slot).map_err(|e| e.context(format!("feed `{text}`")))?;
        let recv = client_pair(signature, &id.name()).recv(
            id.endpoint("recv"),
            signature.client_device,
            dtype,
        );
        fed.insert((id.node.to_string(), id.slot), recv.name.clone());
        add(&mut nodes, recv)?;
    }
    if !fed.is_empty() {
        for e in 0..edges.edges.len() {
            let edge = edges.edges[e];
            let Some(slot) = edge.src_slot else { continue };
            let key = (graph.node[edge.src].name.clone(), slot);
            if let Some(recv) = fed.get(&key) {
                nodes[edge.dst].input[edge.dst_input] = recv.clone();
            }
        }
    }

    let mut roots = Vec::new();
    for text in signature.fetches {
        let id = parse_tensor(text, "fetch", &edges)?;
        let producer = &graph.node[edges.by_name[id.node]];
        let dtype =
            output_dtype(producer, id.slot).map_err(|e| e.context(format!("fetch `{text}`")))?;
        // A fetch of a fed tensor returns the fed value.
        let input = fed
            .get(&(id.node.to_string(), id.slot))
            .cloned()
            .unwrap_or_else(|| tensor_input(id.node, id.slot));
        let send = client_pair(signature, &id.name()).send(
            id.endpoint("send"),
            input,
            signature.client_device,
            dtype,
        );
        roots.push(send.name.clone());
        add(&mut nodes, send)?;
    }
    for target in signature.targets {
        let name = target.strip_prefix('^').unwrap_or(target);
        if !edges.by_name.contains_key(name) {
            return Err(Status::not_found(format!(
                "target `{target}` is not a node of the graph"
            )));
        }
        roots.push(name.to_string());
    }
    let mut rewritten = GraphDef {
        node: nodes,
        ..graph.clone()
    };
    if drop_pure_control_inputs(&mut rewritten)? {
        // A feed stays even when nothing reads it any more: the client sends it either way.
        roots.extend(fed.into_values());
    }
    prune(&rewritten, &roots)
}

/// The v1 control-flow ops: a control edge from a node inside a cond or loop carries
/// deadness and frames, so graphs with any of them keep every control edge.
const CONTROL_FLOW: &[&str] = &[
    "Switch",
    "RefSwitch",
    "Merge",
    "RefMerge",
    "Enter",
    "RefEnter",
    "Exit",
    "RefExit",
    "NextIteration",
    "RefNextIteration",
    "LoopCond",
    "ControlTrigger",
];

/// Ops that run functions, whose bodies may have effects whatever the op's flag says.
const FUNCTIONAL: &[&str] = &[
    "If",
    "StatelessIf",
    "While",
    "StatelessWhile",
    "Case",
    "StatelessCase",
    "PartitionedCall",
    "StatefulPartitionedCall",
    "SymbolicGradient",
];

/// Stateful ops that only read: running them or not changes nothing another node sees.
const READ_ONLY: &[&str] = &[
    "VarHandleOp",
    "ReadVariableOp",
    "VariableV2",
    "Variable",
    "_Recv",
];

/// Drops the control inputs that name a side-effect-free node, as TensorFlow's grappler
/// (its dependency optimizer) does before a graph runs: such an edge only orders two
/// computations that touch no state, so without it the results are the same, and a node
/// that only such edges needed is then pruned. The gradient tuples TensorFlow 1 writes
/// (`tuple/group_deps`, a `NoOp` with control inputs on every gradient of one op) are what
/// this is for: they keep alive the gradient of a fed input (a first layer's input gradient,
/// a convolution's image gradient), which nothing reads. A node is side-effect free when its
/// op is stateless (or only reads: a variable read, a feed) and every node it depends on is
/// too; function calls and functional ops count as having effects. Returns whether it
/// changed anything; graphs with v1 control flow are left as they are.
fn drop_pure_control_inputs(graph: &mut GraphDef) -> Result<bool> {
    if graph
        .node
        .iter()
        .any(|n| CONTROL_FLOW.contains(&n.op.as_str()))
    {
        return Ok(false);
    }
    let edges = GraphEdges::new(graph)?;
    let registry = crate::graph::registry::global();
    // An op is pure when it is stateless, runs no function, and takes no reference (which it
    // may write: `Assign` is stateless in TensorFlow's registry too) and no resource handle.
    let op_is_pure = |node: &NodeDef| {
        READ_ONLY.contains(&node.op.as_str())
            || registry.get(&node.op).is_some_and(|def| {
                !def.stateful
                    && !FUNCTIONAL.contains(&node.op.as_str())
                    && !def.inputs.iter().any(|a| a.is_ref)
                    && def
                        .input_types(node)
                        .is_ok_and(|types| !types.contains(&DType::Resource))
            })
    };
    // Whether each node and everything it depends on is pure, in one post-order walk. A
    // node met again while its inputs are being walked (a cycle, which a graph without
    // control flow should not have) counts as impure.
    let n = graph.node.len();
    let mut pure: Vec<Option<bool>> = vec![None; n];
    let mut visiting = vec![false; n];
    for start in 0..n {
        let mut stack = vec![(start, false)];
        while let Some((i, inputs_done)) = stack.pop() {
            if pure[i].is_some() {
                continue;
            }
            if inputs_done {
                let inputs_pure = edges.in_edges[i]
                    .iter()
                    .all(|&e| pure[edges.edges[e].src] == Some(true));
                pure[i] = Some(inputs_pure && op_is_pure(&graph.node[i]));
                continue;
            }
            if std::mem::replace(&mut visiting[i], true) {
                pure[i] = Some(false);
                continue;
            }
            stack.push((i, true));
            for &e in &edges.in_edges[i] {
                let src = edges.edges[e].src;
                if pure[src].is_none() {
                    stack.push((src, false));
                }
            }
        }
    }
    let mut changed = false;
    for node in &mut graph.node {
        node.input.retain(|input| {
            let Some(name) = input.strip_prefix('^') else {
                return true;
            };
            let drop = edges
                .by_name
                .get(name)
                .is_some_and(|&i| pure[i] == Some(true));
            changed |= drop;
            !drop
        });
    }
    Ok(changed)
}

/// Keeps only the nodes that `roots` need through data and control inputs, in graph order.
pub fn prune(graph: &GraphDef, roots: &[String]) -> Result<GraphDef> {
    let edges = GraphEdges::new(graph)?;
    let mut keep = vec![false; graph.node.len()];
    let mut stack = Vec::new();
    for root in roots {
        let &i = edges.by_name.get(root).ok_or_else(|| {
            Status::not_found(format!(
                "`{root}` is not a node of the graph; cannot prune to it"
            ))
        })?;
        stack.push(i);
    }
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut keep[i], true) {
            continue;
        }
        stack.extend(edges.in_edges[i].iter().map(|&e| edges.edges[e].src));
    }
    let node = graph
        .node
        .iter()
        .zip(&keep)
        .filter(|(_, &k)| k)
        .map(|(n, _)| n.clone())
        .collect();
    Ok(GraphDef {
        node,
        ..graph.clone()
    })
}
