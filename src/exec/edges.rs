//! The edges of a `GraphDef`, read once from its nodes' `input` strings: data edges
//! (`node`, `node:1`) and control edges (`^node`), with both ends as node indices.
//!
//! Placement, partitioning and pruning all walk the graph by edges; this is where an input that
//! names no node is caught, with the consumer and the input named in the error.

use std::collections::HashMap;

use crate::error::{Result, Status};
use crate::proto::{GraphDef, NodeDef};

/// One parsed `input` entry of a `NodeDef`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Input<'a> {
    /// The producing node's name.
    pub node: &'a str,
    /// The producer's output index; `None` for a control input.
    pub slot: Option<usize>,
}

impl<'a> Input<'a> {
    /// Parses `name`, `name:3` or `^name`.
    pub fn parse(text: &'a str, consumer: &NodeDef) -> Result<Self> {
        if let Some(node) = text.strip_prefix('^') {
            return Ok(Input { node, slot: None });
        }
        match text.rsplit_once(':') {
            Some((node, index)) => {
                let slot = index.parse::<usize>().map_err(|_| {
                    Status::invalid_argument(format!(
                        "node `{}` has malformed input `{text}`: the output index after `:` \
                         must be a number",
                        consumer.name
                    ))
                })?;
                Ok(Input {
                    node,
                    slot: Some(slot),
                })
            }
            None => Ok(Input {
                node: text,
                slot: Some(0),
            }),
        }
    }
}

/// An edge between two nodes of one graph, by index into `GraphDef.node`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Edge {
    pub src: usize,
    /// `None` for a control edge.
    pub src_slot: Option<usize>,
    pub dst: usize,
    /// The position of this edge in the consumer's `input` list.
    pub dst_input: usize,
}

/// A graph's nodes indexed by name, with every edge in a stable order: consumers in graph
/// order, each consumer's inputs in their listed order. That order also numbers the edges.
pub(crate) struct GraphEdges {
    pub by_name: HashMap<String, usize>,
    pub edges: Vec<Edge>,
    /// For each node, the indices into `edges` of its inputs, in input order.
    pub in_edges: Vec<Vec<usize>>,
    /// For each node, the indices into `edges` of its consumers.
    pub out_edges: Vec<Vec<usize>>,
}

impl GraphEdges {
    /// Indexes `graph`; INVALID_ARGUMENT for a duplicate node name or an input naming no node.
    pub fn new(graph: &GraphDef) -> Result<Self> {
        let mut by_name = HashMap::with_capacity(graph.node.len());
        for (i, node) in graph.node.iter().enumerate() {
            if by_name.insert(node.name.clone(), i).is_some() {
                return Err(Status::invalid_argument(format!(
                    "graph has two nodes named `{}`; node names must be unique",
                    node.name
                )));
            }
        }
        let mut edges = Vec::new();
        let mut in_edges = vec![Vec::new(); graph.node.len()];
        let mut out_edges = vec![Vec::new(); graph.node.len()];
        for (dst, node) in graph.node.iter().enumerate() {
            for (dst_input, text) in node.input.iter().enumerate() {
                let input = Input::parse(text, node)?;
                let src = *by_name.get(input.node).ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "node `{}` has input `{text}`, but the graph has no node `{}`",
                        node.name, input.node
                    ))
                })?;
                let id = edges.len();
                edges.push(Edge {
                    src,
                    src_slot: input.slot,
                    dst,
                    dst_input,
                });
                in_edges[dst].push(id);
                out_edges[src].push(id);
            }
        }
        Ok(GraphEdges {
            by_name,
            edges,
            in_edges,
            out_edges,
        })
    }

    /// Returns the node indices in a topological order (producers first). Nodes on a cycle
    /// (loops through `NextIteration`) follow in graph order, so every node appears once.
    pub fn topological_order(&self) -> Vec<usize> {
        let n = self.in_edges.len();
        let mut pending: Vec<usize> = self.in_edges.iter().map(Vec::len).collect();
        let mut ready: std::collections::VecDeque<usize> =
            (0..n).filter(|&i| pending[i] == 0).collect();
        let mut order = Vec::with_capacity(n);
        let mut done = vec![false; n];
        while let Some(i) = ready.pop_front() {
            order.push(i);
            done[i] = true;
            for &e in &self.out_edges[i] {
                let dst = self.edges[e].dst;
                pending[dst] -= 1;
                if pending[dst] == 0 {
                    ready.push_back(dst);
                }
            }
        }
        order.extend((0..n).filter(|&i| !done[i]));
        order
    }
}

/// Formats a data input the way `NodeDef.input` writes it (`:0` omitted).
pub(crate) fn tensor_input(node: &str, slot: usize) -> String {
    if slot == 0 {
        node.to_string()
    } else {
        format!("{node}:{slot}")
    }
}

/// Makes `node` wait for the node named `source` by a control edge, unless it already does.
pub(crate) fn add_control_input(node: &mut NodeDef, source: &str) {
    let control = format!("^{source}");
    if !node.input.contains(&control) {
        node.input.push(control);
    }
}

/// Removes the nodes of `graph` whose index `dropped` holds (their readers must no longer
/// name them); returns how many.
pub(crate) fn remove_nodes(graph: &mut GraphDef, dropped: impl Fn(usize) -> bool) -> usize {
    let before = graph.node.len();
    let mut index = 0;
    graph.node.retain(|_| {
        index += 1;
        !dropped(index - 1)
    });
    before - graph.node.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, inputs: &[&str]) -> NodeDef {
        NodeDef {
            name: name.into(),
            op: "NoOp".into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn parses_inputs_and_orders_producers_first() {
        let graph = GraphDef {
            node: vec![node("c", &["b:1", "^a"]), node("b", &["a"]), node("a", &[])],
            ..Default::default()
        };
        let edges = GraphEdges::new(&graph).unwrap();
        assert_eq!(edges.edges.len(), 3);
        assert_eq!(
            edges.edges[0],
            Edge {
                src: 1,
                src_slot: Some(1),
                dst: 0,
                dst_input: 0
            }
        );
        assert_eq!(
            edges.edges[1],
            Edge {
                src: 2,
                src_slot: None,
                dst: 0,
                dst_input: 1
            }
        );
        assert_eq!(edges.topological_order(), vec![2, 1, 0]);
    }

    #[test]
    fn unknown_input_names_consumer_and_input() {
        let graph = GraphDef {
            node: vec![node("c", &["nope:0"])],
            ..Default::default()
        };
        let err = GraphEdges::new(&graph).err().unwrap();
        assert!(err.message().contains("`c`") && err.message().contains("`nope`"));
        let graph = GraphDef {
            node: vec![node("c", &["x:y"]), node("x", &[])],
            ..Default::default()
        };
        assert!(GraphEdges::new(&graph).is_err());
    }
}
