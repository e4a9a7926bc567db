//! Loading and validating `GraphDef`s, whether TensorFlow or the builder produced them.
//!
//! [`validate`] checks what TensorFlow's graph constructor checks before it runs anything:
//! node names follow TensorFlow's rule, no name repeats, every op is registered, inputs are
//! well formed (`node`, `node:i`, `^node`, control inputs last) and name existing nodes and
//! outputs, attrs are declared, present or defaulted, input dtypes match the op, shapes infer,
//! and the data and control edges form no cycle but while loops' (a `NextIteration` into its
//! `Merge`). Errors name the node.
//! [`Graph::from_graph_def`] does the same and returns a [`Graph`] that the builder can extend.

use std::collections::{HashMap, VecDeque};

use crate::error::{Result, Status};
use crate::graph::builder::{parse_input, Graph};
use crate::graph::ops::is_loop_back_edge;
use crate::graph::registry;
use crate::proto::GraphDef;

/// Whether `name` is a valid node name: `[A-Za-z0-9.][A-Za-z0-9_./-]*`, optionally followed by
/// `>`-separated parts that start like a name (TensorFlow's `IsValidNodeName`); internal
/// names such as `_recv_x_0` may also start with `_`.
pub fn is_valid_node_name(name: &str, allow_internal: bool) -> bool {
    let rest_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/');
    let mut parts = name.split('>');
    let first_ok = |s: &str, internal: bool| {
        let mut chars = s.chars();
        match chars.next() {
            Some(c) if c.is_ascii_alphanumeric() || c == '.' || (internal && c == '_') => {
                chars.all(rest_ok)
            }
            _ => false,
        }
    };
    match parts.next() {
        Some(p) if first_ok(p, allow_internal) => parts.all(|p| first_ok(p, false)),
        _ => false,
    }
}

/// Checks a `GraphDef` as described in the module doc, without keeping the result.
pub fn validate(graph: &GraphDef) -> Result<()> {
    Graph::from_graph_def(graph).map(|_| ())
}

/// Checks names, duplicates, op registration and input syntax; returns each node's index.
fn check_structure(graph: &GraphDef) -> Result<HashMap<&str, usize>> {
    let mut index = HashMap::with_capacity(graph.node.len());
    for (i, n) in graph.node.iter().enumerate() {
        if !is_valid_node_name(&n.name, true) {
            return Err(Status::invalid_argument(format!(
                "node name `{}` (op {}) is not valid; names match [A-Za-z0-9.][A-Za-z0-9_./-]*",
                n.name, n.op
            )));
        }
        if index.insert(n.name.as_str(), i).is_some() {
            return Err(Status::invalid_argument(format!(
                "node name `{}` appears twice in the graph",
                n.name
            )));
        }
        registry::lookup(n)?;
    }
    for n in &graph.node {
        let mut seen_control = false;
        for input in &n.input {
            let control = input.starts_with('^');
            if seen_control && !control {
                return Err(Status::invalid_argument(format!(
                    "node `{}`: data input `{input}` comes after a control input; control inputs go last",
                    n.name
                )));
            }
            seen_control |= control;
            let body = input.strip_prefix('^').unwrap_or(input);
            let (src, idx) = parse_input(input);
            let well_formed = match body.rsplit_once(':') {
                Some((_, i)) => !control && !i.is_empty() && i.chars().all(|c| c.is_ascii_digit()),
                None => true,
            };
            if !well_formed || !is_valid_node_name(src, true) {
                return Err(Status::invalid_argument(format!(
                    "node `{}` has malformed input `{input}`; write `node`, `node:index` or `^node`",
                    n.name
                )));
            }
            if !index.contains_key(src) {
                return Err(Status::invalid_argument(format!(
                    "node `{}`: input `{input}` names node `{src}`, which is not in the graph",
                    n.name
                )));
            }
            let _ = idx;
        }
    }
    Ok(index)
}

/// Orders the nodes so every node comes after its inputs (data and control), or fails naming
/// a node on a cycle.
fn topological_order(graph: &GraphDef, index: &HashMap<&str, usize>) -> Result<Vec<usize>> {
    let n = graph.node.len();
    let mut pending = vec![0usize; n];
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, node) in graph.node.iter().enumerate() {
        for input in &node.input {
            let (src, _) = parse_input(input);
            let s = index[src];
            // A while loop's back edge: the Merge does not wait for it.
            if is_loop_back_edge(&graph.node[s].op, &node.op) {
                continue;
            }
            pending[i] += 1;
            consumers[s].push(i);
        }
    }
    let mut ready: VecDeque<usize> = (0..n).filter(|&i| pending[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop_front() {
        order.push(i);
        for &c in &consumers[i] {
            pending[c] -= 1;
            if pending[c] == 0 {
                ready.push_back(c);
            }
        }
    }
    if order.len() != n {
        let stuck = (0..n)
            .find(|&i| pending[i] > 0)
            .map(|i| graph.node[i].name.as_str())
            .unwrap_or("?");
        return Err(Status::invalid_argument(format!(
            "the graph has a cycle through node `{stuck}`; only a while loop's NextIteration may \
             feed back, into its Merge"
        )));
    }
    Ok(order)
}

impl Graph {
    /// Loads and validates a `GraphDef` (see the module doc): attr defaults are filled in, and
    /// every output's dtype and shape are inferred. Node order is kept.
    pub fn from_graph_def(graph: &GraphDef) -> Result<Graph> {
        let index = check_structure(graph)?;
        let order = topological_order(graph, &index)?;
        let mut nodes = graph.node.clone();
        let mut metas = vec![Vec::new(); nodes.len()];
        // Infer in dependency order against a graph holding the nodes done so far.
        let mut partial = Graph::new();
        for &i in &order {
            let def = registry::lookup(&nodes[i])?;
            let meta = partial.infer(def, &mut nodes[i])?;
            for input in nodes[i].input.iter().filter(|s| !s.starts_with('^')) {
                let (src, idx) = parse_input(input);
                let outs = &metas[index[src]];
                // A loop's back edge into a Merge is checked once its producer is inferred.
                let back_edge = is_loop_back_edge(&graph.node[index[src]].op, &nodes[i].op);
                if back_edge && outs.is_empty() {
                    continue;
                }
                if idx >= outs.len() {
                    return Err(Status::invalid_argument(format!(
                        "node `{}`: input `{input}` asks for output {idx} of `{src}`, which has {}",
                        nodes[i].name,
                        outs.len()
                    )));
                }
            }
            metas[i] = meta.clone();
            partial.insert(nodes[i].clone(), meta);
        }
        let mut g = Graph::new();
        for (node, meta) in nodes.into_iter().zip(metas) {
            g.mark_name_used(&node.name);
            g.insert(node, meta);
        }
        g.versions = graph.versions.clone();
        g.library = graph.library.clone();
        Ok(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_follow_tensorflow_rule() {
        for ok in [
            "x",
            "gradients/MatMul_grad/MatMul",
            "a-b.c",
            ".x",
            "0",
            "a>b",
            "x/y>z_1",
        ] {
            assert!(is_valid_node_name(ok, false), "{ok}");
        }
        for bad in ["", "_x", "a b", "-x", "a>", "a>_b", "/x", "x:0"] {
            assert!(!is_valid_node_name(bad, false), "{bad}");
        }
        assert!(is_valid_node_name("_recv_x_0", true));
    }
}
