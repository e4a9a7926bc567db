//! A checkpoint of resource variables read at one instant.
//!
//! A graph saves a resource variable through a `ReadVariableOp` of its handle feeding `SaveV2`,
//! one read per variable, each whenever the executor gets to it. An update of a variable and
//! its optimizer slots stores them together, but two separate reads can fall on either side of
//! it, and the checkpoint then holds the variable from one apply and its slot from the next.
//! Reference variables do not have this problem: `SaveV2` reads their references together.
//!
//! So before a graph runs, the `ReadVariableOp`s that feed a `SaveV2` become one
//! `_ReadVariablesTogether` of their handles, which reads every variable under one set of locks
//! ([`crate::tensor::var::snapshot_all`]). The reads keep serving any other readers; only the
//! save's inputs move, so everything else computes as before.

use std::collections::{HashMap, HashSet};

use crate::error::Result;
use crate::exec::TensorRef;
use crate::graph::attr::{self, value};
use crate::proto::{GraphDef, NodeDef};
use crate::tensor::DType;

/// `graph` with each `SaveV2`'s variable reads taken together; `None` when no `SaveV2` reads two
/// or more resource variables (the graph runs as it is).
pub fn read_saved_variables_together(graph: &GraphDef) -> Result<Option<GraphDef>> {
    // Most graphs save nothing: they are left without building anything.
    if !graph.node.iter().any(|n| n.op == "SaveV2") {
        return Ok(None);
    }
    let by_name: HashMap<&str, &NodeDef> =
        graph.node.iter().map(|n| (n.name.as_str(), n)).collect();
    let saves: Vec<(usize, Vec<(usize, &NodeDef)>)> = graph
        .node
        .iter()
        .enumerate()
        .filter(|(_, n)| n.op == "SaveV2")
        .map(|(i, save)| (i, reads(&by_name, save)))
        .filter(|(_, reads)| reads.len() > 1)
        .collect();
    if saves.is_empty() {
        return Ok(None);
    }
    let mut names: HashSet<String> = graph.node.iter().map(|n| n.name.clone()).collect();
    let mut rewritten = graph.clone();
    for (index, reads) in saves {
        let save = &mut rewritten.node[index];
        let name = unique_name(&mut names, &format!("{}/read_together", save.name));
        let mut together = NodeDef {
            name: name.clone(),
            op: "_ReadVariablesTogether".into(),
            device: save.device.clone(),
            ..Default::default()
        };
        let mut dtypes = Vec::with_capacity(reads.len());
        let mut controls = Vec::new();
        for (k, &(input, read)) in reads.iter().enumerate() {
            together.input.push(read.input[0].clone());
            controls.extend(
                read.input[1..]
                    .iter()
                    .filter(|i| i.starts_with('^'))
                    .cloned(),
            );
            dtypes.push(attr::dtype(read, "dtype")?);
            save.input[input] = format!("{name}:{k}");
        }
        controls.sort();
        controls.dedup();
        together.input.extend(controls);
        together
            .attr
            .insert("N".into(), value::int(reads.len() as i64));
        together
            .attr
            .insert("dtypes".into(), value::dtype_list(&dtypes));
        rewritten.node.push(together);
    }
    Ok(Some(rewritten))
}

/// The data inputs of `save` (past its prefix, names and slices) that come from a
/// `ReadVariableOp`, with their index and the read; `by_name` is the graph's nodes.
fn reads<'g>(by_name: &HashMap<&str, &'g NodeDef>, save: &NodeDef) -> Vec<(usize, &'g NodeDef)> {
    save.input
        .iter()
        .enumerate()
        .skip(3)
        .filter_map(|(i, input)| {
            let r = TensorRef::parse(input).ok()?;
            if r.slot != Some(0) {
                return None;
            }
            let read = *by_name.get(r.node)?;
            let dtype_known = attr::dtype(read, "dtype").is_ok_and(|d| d != DType::Resource);
            (read.op == "ReadVariableOp" && !read.input.is_empty() && dtype_known)
                .then_some((i, read))
        })
        .collect()
}

/// `base`, or `base_1`, `base_2`, ... whichever no node has yet (then taken).
fn unique_name(names: &mut HashSet<String>, base: &str) -> String {
    let mut name = base.to_string();
    let mut k = 0;
    while names.contains(&name) {
        k += 1;
        name = format!("{base}_{k}");
    }
    names.insert(name.clone());
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, op: &str, inputs: &[&str]) -> NodeDef {
        NodeDef {
            name: name.into(),
            op: op.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            attr: [("dtype".to_string(), value::dtype(DType::Float))].into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_saves_reads_become_one_and_other_readers_keep_theirs() {
        let graph = GraphDef {
            node: vec![
                node("w", "VarHandleOp", &[]),
                node("m", "VarHandleOp", &[]),
                node("w/read", "ReadVariableOp", &["w", "^init"]),
                node("m/read", "ReadVariableOp", &["m:0"]),
                node("loss", "Square", &["w/read"]),
                node(
                    "save",
                    "SaveV2",
                    &["prefix", "names", "slices", "w/read", "m/read:0"],
                ),
            ],
            ..Default::default()
        };
        let rewritten = read_saved_variables_together(&graph).unwrap().unwrap();
        let find = |name: &str| rewritten.node.iter().find(|n| n.name == name).unwrap();
        let together = find("save/read_together");
        assert_eq!(together.op, "_ReadVariablesTogether");
        assert_eq!(together.input, ["w", "m:0", "^init"]);
        assert_eq!(attr::int(together, "N").unwrap(), 2);
        assert_eq!(
            attr::dtype_list(together, "dtypes").unwrap(),
            [DType::Float, DType::Float]
        );
        assert_eq!(
            find("save").input,
            [
                "prefix",
                "names",
                "slices",
                "save/read_together:0",
                "save/read_together:1"
            ]
        );
        assert_eq!(find("loss").input, ["w/read"]);
        assert_eq!(rewritten.node.len(), graph.node.len() + 1);
    }

    #[test]
    fn a_graph_without_a_save_of_two_resource_reads_is_left_alone() {
        let graph = GraphDef {
            node: vec![
                node("w", "VariableV2", &[]),
                node("m/read", "ReadVariableOp", &["m"]),
                node(
                    "save",
                    "SaveV2",
                    &["prefix", "names", "slices", "w", "m/read"],
                ),
            ],
            ..Default::default()
        };
        assert!(read_saved_variables_together(&graph).unwrap().is_none());
    }
}
