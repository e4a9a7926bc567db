//! Issue #33's coverage check: every op of six everyday TensorFlow 2.21 graphs has a CPU
//! kernel (`tessera::exec::kernel_for`, which includes tf.data's datasets and iterators) and
//! an op definition (`tessera::graph::registry::global()`).
//!
//! `tests/op_coverage_tf.py` builds the graphs live (skipped without TensorFlow, a failure
//! under CI) and prints each one's ops, its function library's bodies included: a TF1 MLP fed
//! by tf.data and evaluated with `in_top_k`, a wide-and-deep recommender from
//! `tf.compat.v1.feature_column` with partitioned variables over two ps tasks, a ResNet block
//! with batch norm and its gradients, a seq2seq decoder step with `top_k` and `cumsum`,
//! `tf.compat.v1.metrics` accuracy and AUC, and a float16 MLP with its gradient. The test
//! lists every op missing from each graph and fails when any is; it checks ops by name, so a
//! kernel that lacks a dtype a graph uses (the float16 MLP's) is not caught here.

use std::collections::BTreeMap;

use crate::support::tensorflow::script_json;
use tessera::device::DeviceType;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/op_coverage_tf.py");

/// The graphs the script builds; each must come back with its ops.
const GRAPHS: [&str; 6] = ["mlp", "wide_deep", "resnet", "seq2seq", "metrics", "half"];

/// What tessera lacks for `op`: a CPU kernel, an op definition, or both.
fn lacks(op: &str) -> Option<&'static str> {
    let kernel = tessera::exec::kernel_for(op, DeviceType::Cpu).is_some();
    let def = tessera::graph::registry::global().get(op).is_some();
    match (kernel, def) {
        (true, true) => None,
        (false, true) => Some("no CPU kernel"),
        (true, false) => Some("no op definition"),
        (false, false) => Some("no CPU kernel, no op definition"),
    }
}

#[test]
fn every_op_of_the_everyday_graphs_has_a_kernel_and_a_definition() {
    let test = "every_op_of_the_everyday_graphs_has_a_kernel_and_a_definition";
    let Some(json) = script_json(test, SCRIPT, &["tensorflow", "numpy", "tf_keras"]) else {
        return;
    };
    let mut missing: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut total = 0;
    for graph in GRAPHS {
        let ops = json[graph]
            .as_array()
            .unwrap_or_else(|| panic!("the script printed no ops for graph `{graph}`"));
        assert!(
            ops.len() >= 20,
            "graph `{graph}` has only {} ops",
            ops.len()
        );
        total += ops.len();
        for op in ops {
            let op = op.as_str().expect("op names are strings");
            if let Some(why) = lacks(op) {
                missing
                    .entry(graph)
                    .or_default()
                    .push(format!("{op} ({why})"));
            }
        }
    }
    let report: Vec<String> = missing
        .iter()
        .map(|(graph, ops)| format!("  {graph}: {}", ops.join(", ")))
        .collect();
    assert!(
        missing.is_empty(),
        "ops of everyday TensorFlow graphs that tessera lacks, by graph:\n{}",
        report.join("\n")
    );
    eprintln!(
        "{total} ops of {} graphs all have CPU kernels and definitions",
        GRAPHS.len()
    );
}
