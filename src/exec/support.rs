//! What of a graph tessera cannot run, found before anything runs: ops the registry does not
//! declare, declared ops without a CPU kernel, and dtypes tessera does not hold. `tessera
//! validate --graph FILE` prints these for a GraphDef a user wrote with TensorFlow, so a
//! program's gaps show at once instead of one at a time at `CreateSession`.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use crate::graph::registry;
use crate::proto::{attr_value, DataType, GraphDef, NodeDef};
use crate::tensor::DType;

/// Why one op of a graph cannot run.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Gap {
    /// No op of this name is registered (nor is it a function of the graph's library).
    Op,
    /// The op is declared (its shapes and gradient are known) but has no CPU kernel.
    Kernel,
    /// A node of the op carries a dtype tessera does not hold (`DT_HALF`, say).
    DType(String),
}

/// One op tessera cannot run, with the nodes that use it (the first few of them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub op: String,
    pub gap: Gap,
    pub nodes: Vec<String>,
    /// How many nodes in all (the graph's and its functions').
    pub count: usize,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match &self.gap {
            Gap::Op => "not registered".to_string(),
            Gap::Kernel => "registered, but no CPU kernel".to_string(),
            Gap::DType(dtype) => format!("data type {dtype} is not supported"),
        };
        let more = self.count.saturating_sub(self.nodes.len());
        write!(f, "{}: {why} (node {}", self.op, self.nodes.join(", "))?;
        if more > 0 {
            write!(f, " and {more} more")?;
        }
        write!(f, ")")
    }
}

/// Nodes named per finding.
const NODES_NAMED: usize = 3;

/// Every op of `graph` (its functions' bodies included) that tessera cannot run, sorted by op.
pub fn unsupported(graph: &GraphDef) -> Vec<Finding> {
    let functions: HashSet<&str> = graph
        .library
        .iter()
        .flat_map(|lib| &lib.function)
        .filter_map(|f| f.signature.as_ref().map(|s| s.name.as_str()))
        .collect();
    let bodies = graph.library.iter().flat_map(|lib| &lib.function);
    let nodes = graph.node.iter().chain(bodies.flat_map(|f| &f.node_def));
    let mut found: BTreeMap<(String, Gap), Finding> = BTreeMap::new();
    for node in nodes {
        if let Some(gap) = gap(node, &functions) {
            let finding = found
                .entry((node.op.clone(), gap.clone()))
                .or_insert_with(|| Finding {
                    op: node.op.clone(),
                    gap,
                    nodes: Vec::new(),
                    count: 0,
                });
            finding.count += 1;
            if finding.nodes.len() < NODES_NAMED {
                finding.nodes.push(node.name.clone());
            }
        }
    }
    found.into_values().collect()
}

/// What keeps `node` from running, if anything.
fn gap(node: &NodeDef, functions: &HashSet<&str>) -> Option<Gap> {
    if functions.contains(node.op.as_str()) {
        return None;
    }
    if registry::global().get(&node.op).is_none() {
        return Some(Gap::Op);
    }
    if super::kernel_for(&node.op, crate::device::DeviceType::Cpu).is_none() {
        return Some(Gap::Kernel);
    }
    node.attr.values().find_map(|value| {
        let types: Vec<i32> = match &value.value {
            Some(attr_value::Value::Type(t)) => vec![*t],
            Some(attr_value::Value::List(list)) => list.r#type.clone(),
            Some(attr_value::Value::Tensor(t)) => vec![t.dtype],
            _ => Vec::new(),
        };
        types
            .into_iter()
            .find_map(|raw| match DataType::try_from(raw) {
                Ok(DataType::DtInvalid) => None,
                Ok(dtype) => DType::from_proto(dtype)
                    .err()
                    .map(|_| Gap::DType(dtype.as_str_name().to_string())),
                Err(_) => Some(Gap::DType(format!("number {raw}"))),
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::attr::value;
    use crate::proto::{FunctionDef, FunctionDefLibrary, OpDef};

    fn node(name: &str, op: &str) -> NodeDef {
        NodeDef {
            name: name.into(),
            op: op.into(),
            ..Default::default()
        }
    }

    #[test]
    fn names_unknown_ops_kernelless_ops_and_dtypes_once_per_op() {
        let mut complex = node("h", "Cast");
        complex.attr.insert("DstT".into(), {
            let mut v = value::dtype(DType::Float);
            v.value = Some(attr_value::Value::Type(DataType::DtComplex128 as i32));
            v
        });
        let mut float = node("f", "Cast");
        float.attr.insert("DstT".into(), value::dtype(DType::Float));
        let graph = GraphDef {
            node: vec![
                node("a", "WindowDataset"),
                node("b", "WindowDataset"),
                node("m", "MatMul"),
                node("call", "my_fn"),
                complex,
                float,
            ],
            library: Some(FunctionDefLibrary {
                function: vec![FunctionDef {
                    signature: Some(OpDef {
                        name: "my_fn".into(),
                        ..Default::default()
                    }),
                    node_def: vec![node("inner", "NoSuchOp")],
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let found = unsupported(&graph);
        let ops: Vec<_> = found.iter().map(|f| (f.op.as_str(), &f.gap)).collect();
        assert_eq!(
            ops,
            vec![
                ("Cast", &Gap::DType("DT_COMPLEX128".into())),
                ("NoSuchOp", &Gap::Op),
                ("WindowDataset", &Gap::Op),
            ]
        );
        assert_eq!(found[2].count, 2);
        assert_eq!(
            found[2].to_string(),
            "WindowDataset: not registered (node a, b)"
        );
        assert!(unsupported(&GraphDef::default()).is_empty());
    }
}
