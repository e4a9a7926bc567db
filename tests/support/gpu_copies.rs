//! The copies a GPU tower's training step makes between the host and the GPU, held to what
//! its dataflow moves: its feeds, its fetches and the tensors that cross between the GPU and
//! the host. Used on an emulated GPU (tests/emulated_gpu.rs) and on a real one (tests/gpu.rs).
//!
//! The copies a step must make are worked out from the graph as placed: each float32 tensor
//! made on one side and read on the other crosses once (the partitioner sends it once to each
//! device that reads it), and a fetched tensor made on the GPU crosses to the host once. Every
//! other tensor of the step stays where its kernel wrote it.

use std::collections::{BTreeSet, HashMap};

use tessera::client::{LocalSession, Session};
use tessera::device::space::Copies;
use tessera::graph::registry::global;
use tessera::proto::GraphDef;
use tessera::tensor::DType;

use super::mlp;

/// The GPU the tower runs on.
pub const GPU: &str = "/job:localhost/replica:0/task:0/device:GPU:0";

fn copies(local: &LocalSession) -> Copies {
    let gpu = local.devices().iter().find(|d| d.name() == GPU).unwrap();
    gpu.memory_space()
        .expect("the GPU has memory of its own")
        .copies()
}

/// The nodes a step fetching `fetches` and running `targets` runs: those they depend on.
fn step_nodes<'g>(graph: &'g GraphDef, fetches: &[&str], targets: &[&str]) -> BTreeSet<&'g str> {
    let nodes: HashMap<&str, _> = graph.node.iter().map(|n| (n.name.as_str(), n)).collect();
    let mut todo: Vec<&str> = fetches
        .iter()
        .map(|f| f.split_once(':').map_or(*f, |(n, _)| n))
        .chain(targets.iter().copied())
        .collect();
    let mut seen = BTreeSet::new();
    while let Some(name) = todo.pop() {
        let node = nodes[name];
        if seen.insert(node.name.as_str()) {
            for input in &node.input {
                let input = input.trim_start_matches('^');
                todo.push(input.split_once(':').map_or(input, |(n, _)| n));
            }
        }
    }
    seen
}

/// The float32 tensors that cross between the GPU and the rest in one step fetching `fetches`
/// and running `targets`: (into the GPU, out of it).
fn crossings(
    graph: &GraphDef,
    placement: &HashMap<String, String>,
    fetches: &[&str],
    targets: &[&str],
) -> (BTreeSet<String>, BTreeSet<String>) {
    let nodes: HashMap<&str, _> = graph.node.iter().map(|n| (n.name.as_str(), n)).collect();
    let runs = step_nodes(graph, fetches, targets);
    let is_float = |tensor: &str| {
        let (node, slot) = tensor.split_once(':').unwrap_or((tensor, "0"));
        let types = global()
            .get(&nodes[node].op)
            .unwrap()
            .output_types(nodes[node])
            .unwrap();
        types[slot.parse::<usize>().unwrap()] == DType::Float
    };
    let on_gpu = |node: &str| placement[node] == GPU;
    let mut into: BTreeSet<String> = BTreeSet::new();
    let mut out: BTreeSet<String> = BTreeSet::new();
    for node in graph.node.iter().filter(|n| runs.contains(n.name.as_str())) {
        for input in node.input.iter().filter(|i| !i.starts_with('^')) {
            let tensor = if input.contains(':') {
                input.clone()
            } else {
                format!("{input}:0")
            };
            let source = tensor.split_once(':').unwrap().0;
            if !is_float(&tensor) || on_gpu(source) == on_gpu(&node.name) {
                continue;
            }
            if on_gpu(&node.name) {
                into.insert(tensor);
            } else {
                out.insert(tensor);
            }
        }
    }
    for fetch in fetches {
        let source = fetch.split_once(':').unwrap().0;
        if on_gpu(source) && is_float(fetch) {
            out.insert(fetch.to_string());
        }
    }
    (into, out)
}

/// Trains the MLP's tower on `GPU:0` of `session` (fresh) for three steps and checks each
/// step's copies: the first puts the GPU's float constants in its memory besides the step's
/// crossings; every later one copies exactly the crossings, each once.
pub fn check_tower_step_copies(session: &Session) {
    let local = session.as_local().unwrap();
    let model = mlp::tower_model(vec!["/device:GPU:0".into()]);
    session.extend(&model.graph.to_graph_def()).unwrap();
    session.run(&[], &[], &[&model.init]).unwrap();

    let mut per_step = Vec::new();
    let mut losses = Vec::new();
    for step in 0..3 {
        let before = copies(local);
        losses.push(mlp::train_step(session, &model, step));
        per_step.push(copies(local) - before);
    }

    // The tower's compute ran on the GPU.
    let placement = local.placement().unwrap();
    let graph = model.graph.to_graph_def();
    let on_gpu: Vec<&str> = graph
        .node
        .iter()
        .filter(|n| placement[&n.name] == GPU)
        .map(|n| n.op.as_str())
        .collect();
    for op in [
        "MatMul",
        "BiasAdd",
        "Relu",
        "ReluGrad",
        "SoftmaxCrossEntropyWithLogits",
    ] {
        assert!(on_gpu.contains(&op), "no {op} on the GPU: {on_gpu:?}");
    }

    let loss = model.loss.name();
    let (into, out) = crossings(&graph, &placement, &[&loss], &[&model.train_op]);
    assert!(!into.is_empty() && !out.is_empty(), "nothing crosses");
    // A float constant on the GPU goes into its memory on the first step and stays there for
    // every later one; one the host reads is copied out on the first step, and that host copy
    // is kept with it.
    let runs = step_nodes(&graph, &[&loss], &[&model.train_op]);
    let gpu_constants: BTreeSet<&str> = graph
        .node
        .iter()
        .filter(|n| runs.contains(n.name.as_str()))
        .filter(|n| n.op == "Const" && placement[&n.name] == GPU)
        .filter(|n| global().get(&n.op).unwrap().output_types(n).unwrap()[0] == DType::Float)
        .map(|n| n.name.as_str())
        .collect();
    let constants_out = out
        .iter()
        .filter(|t| gpu_constants.contains(t.split_once(':').unwrap().0))
        .count();
    let (into, out) = (into.len() as u64, out.len() as u64);
    assert_eq!(
        (per_step[0].to_device, per_step[0].to_host),
        (into + gpu_constants.len() as u64, out),
        "the first step: {:?}",
        per_step[0]
    );
    // Every later step: exactly the crossings, each once.
    for (step, copies) in per_step.iter().enumerate().skip(1) {
        assert_eq!(
            (copies.to_device, copies.to_host),
            (into, out - constants_out as u64),
            "step {step}: {copies:?}"
        );
    }
    // Far fewer than copying each GPU kernel's inputs in and outputs out, as the GPU path did.
    let kernel_edges: usize = graph
        .node
        .iter()
        .filter(|n| runs.contains(n.name.as_str()) && placement[&n.name] == GPU)
        .map(|n| n.input.iter().filter(|i| !i.starts_with('^')).count() + 1)
        .sum();
    assert!(
        (into + out) as usize * 2 < kernel_edges,
        "{into} + {out} copies against {kernel_edges} kernel inputs and outputs"
    );
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
}
