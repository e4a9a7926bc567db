//! The kernels against the graphs TensorFlow built for the MLP (shared/golden): every op of the
//! training graph has a CPU kernel, and every node tessera has a kernel for builds one from
//! TensorFlow's own attrs.

use std::collections::BTreeSet;

use crate::kernels_support::*;
use tessera::device::DeviceType;
use tessera::kernels::{create_kernel, functional, kernel_for};
use tessera::proto::GraphDef;
use tessera::runtime::resource::ResourceMgr;

#[test]
fn every_op_of_the_training_graph_has_a_cpu_kernel() {
    let graph: GraphDef = golden("graph.pb");
    let missing: BTreeSet<&str> = graph
        .node
        .iter()
        .map(|n| n.op.as_str())
        .filter(|op| kernel_for(op, DeviceType::Cpu).is_none())
        .collect();
    assert!(missing.is_empty(), "ops without a CPU kernel: {missing:?}");
}

#[test]
fn kernels_build_from_tensorflow_node_defs() {
    for file in [
        "graph.pb",
        "graph_monitored.pb",
        "graph_sync.pb",
        "graph_sync_monitored.pb",
    ] {
        let graph: GraphDef = golden(file);
        let mut built = 0;
        for n in &graph.node {
            if kernel_for(&n.op, DeviceType::Cpu).is_some() {
                // `If` (the global step's `cond`) instantiates its branches from the graph's
                // function library, as the executor creates it.
                if functional::is_functional(&n.op) {
                    let library = graph.library.as_ref();
                    functional::create(n, library, DeviceType::Cpu, &create_kernel)
                } else {
                    create_kernel(n, DeviceType::Cpu)
                }
                .unwrap_or_else(|e| panic!("{file}: node `{}` ({}): {e}", n.name, n.op));
                built += 1;
            }
        }
        assert!(
            built * 2 > graph.node.len(),
            "{file}: only {built} of {} nodes",
            graph.node.len()
        );
    }
}

#[test]
fn tensorflow_constants_and_placeholders_behave() {
    let graph: GraphDef = golden("graph.pb");
    let rm = ResourceMgr::new();
    for n in graph.node.iter().filter(|n| n.op == "Const") {
        let out = run_with(n, vec![], &rm).unwrap_or_else(|e| panic!("Const `{}`: {e}", n.name));
        assert_eq!(out.len(), 1);
    }
    // The feature placeholder is x: float32 [?, 64].
    let x = graph
        .node
        .iter()
        .find(|n| n.op == "Placeholder" && n.name == "x")
        .expect("placeholder x");
    let err = run_with(x, vec![], &rm).unwrap_err();
    assert!(
        err.message().contains(
            "You must feed a value for placeholder tensor 'x' with dtype float and shape [?,64]"
        ),
        "{err}"
    );
}
