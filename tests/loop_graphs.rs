//! The graphs TensorFlow 2.21 builds for `tf.compat.v1.nn.dynamic_rnn` and its training step,
//! once with TensorFlow 1 control flow (TensorArrays and stacks in `Enter`/`Exit` loops) and
//! once with TensorFlow 2 control flow (`StatelessWhile` bodies over TensorLists); the files
//! and the script that wrote them are in `tests/data/graphs/`. Every TensorArray, stack,
//! TensorList and array node in them, function bodies included, must be one tessera declares
//! with the same attrs and runs on the CPU; what is still missing must be control flow only.

use std::collections::BTreeSet;
use std::path::Path;

use prost::Message;
use tessera::device::DeviceType;
use tessera::graph::registry;
use tessera::kernels::kernel_for;
use tessera::proto::{GraphDef, NodeDef};

/// The ops this change brings, which the graphs must find declared and runnable.
const DATA_STRUCTURE_OPS: &[&str] = &[
    "TensorArrayV3",
    "TensorArrayGradV3",
    "TensorArrayWriteV3",
    "TensorArrayReadV3",
    "TensorArrayGatherV3",
    "TensorArrayScatterV3",
    "StackV2",
    "StackPushV2",
    "StackPopV2",
    "EmptyTensorList",
    "TensorListReserve",
    "TensorListFromTensor",
    "TensorListGetItem",
    "TensorListSetItem",
    "TensorListStack",
    "TensorListLength",
    "TensorListElementShape",
    "TensorListPushBack",
    "TensorListPopBack",
    "ConcatOffset",
    "InvertPermutation",
];

/// Control flow, which the executor brings (frames, dead tensors, functional loops).
const CONTROL_FLOW_OPS: &[&str] = &[
    "Enter",
    "Exit",
    "Merge",
    "Switch",
    "NextIteration",
    "LoopCond",
    "ControlTrigger",
    "While",
    "StatelessWhile",
];

fn load(name: &str) -> GraphDef {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/graphs")
        .join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    GraphDef::decode(bytes.as_slice()).expect("a GraphDef")
}

/// Every node of the graph and of its functions.
fn all_nodes(g: &GraphDef) -> Vec<NodeDef> {
    let mut nodes = g.node.clone();
    if let Some(lib) = &g.library {
        for f in &lib.function {
            nodes.extend(f.node_def.iter().cloned());
        }
    }
    nodes
}

/// Checks the graph's nodes against the registry; returns the op types it does not know.
fn check(name: &str, expect_present: &[&str]) -> BTreeSet<String> {
    let nodes = all_nodes(&load(name));
    let ops: BTreeSet<&str> = nodes.iter().map(|n| n.op.as_str()).collect();
    for op in expect_present {
        assert!(ops.contains(op), "{name} has no {op} node: {ops:?}");
    }
    let mut unknown = BTreeSet::new();
    for n in &nodes {
        let Some(def) = registry::global().get(&n.op) else {
            unknown.insert(n.op.clone());
            continue;
        };
        let mut filled = n.clone();
        def.fill_and_check_attrs(&mut filled)
            .unwrap_or_else(|e| panic!("{name}: node `{}` ({}): {e}", n.name, n.op));
        let data_inputs = n.input.iter().filter(|i| !i.starts_with('^')).count();
        let declared = def
            .input_types(&filled)
            .unwrap_or_else(|e| panic!("{name}: node `{}`: {e}", n.name));
        assert_eq!(
            declared.len(),
            data_inputs,
            "{name}: node `{}` ({}) has {data_inputs} inputs, its declaration {}",
            n.name,
            n.op,
            declared.len()
        );
        if DATA_STRUCTURE_OPS.contains(&n.op.as_str()) {
            assert!(
                kernel_for(&n.op, DeviceType::Cpu).is_some(),
                "{name}: no CPU kernel for {}",
                n.op
            );
            tessera::kernels::create_kernel(&filled, DeviceType::Cpu)
                .unwrap_or_else(|e| panic!("{name}: node `{}` ({}): {e}", n.name, n.op));
        }
    }
    let not_control_flow: Vec<&String> = unknown
        .iter()
        .filter(|op| !CONTROL_FLOW_OPS.contains(&op.as_str()))
        .collect();
    assert!(
        not_control_flow.is_empty(),
        "{name} uses ops tessera does not declare: {not_control_flow:?}"
    );
    unknown
}

#[test]
fn the_tensorflow_1_dynamic_rnn_graph_declares_its_arrays_and_stacks_as_tessera_does() {
    let missing = check(
        "dynamic_rnn_v1.pb",
        &[
            "TensorArrayV3",
            "TensorArrayGradV3",
            "TensorArrayScatterV3",
            "TensorArrayReadV3",
            "TensorArrayWriteV3",
            "TensorArrayGatherV3",
            "StackV2",
            "StackPushV2",
            "StackPopV2",
            "ConcatOffset",
        ],
    );
    eprintln!("control flow ops the v1 graph needs beyond these kernels: {missing:?}");
}

#[test]
fn the_tensorflow_2_dynamic_rnn_graph_declares_its_lists_as_tessera_does() {
    let missing = check(
        "dynamic_rnn_v2.pb",
        &[
            "TensorListReserve",
            "TensorListFromTensor",
            "TensorListGetItem",
            "TensorListSetItem",
            "TensorListStack",
            "EmptyTensorList",
            "TensorListPushBack",
            "TensorListPopBack",
        ],
    );
    eprintln!("control flow ops the v2 graph needs beyond these kernels: {missing:?}");
}
