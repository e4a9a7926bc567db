//! The GraphDefs TensorFlow 2.21 wrote for the MLP training job (see
//! `shared/golden/README.md`) load and validate, with the node and op counts TensorFlow
//! reported in the `.ops.txt` files.

use std::collections::BTreeMap;
use std::path::PathBuf;

use prost::Message;
use tessera::device::DeviceType;
use tessera::graph::{validate, Graph};
use tessera::kernels::kernel_for;
use tessera::proto::GraphDef;

fn golden_dir() -> PathBuf {
    if let Ok(d) = std::env::var("TESSERA_GOLDEN_DIR") {
        return PathBuf::from(d);
    }
    let beside = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/golden");
    if beside.is_dir() {
        return beside;
    }
    PathBuf::from("/work/shared/golden")
}

fn load(name: &str) -> GraphDef {
    let path = golden_dir().join(format!("{name}.pb"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    GraphDef::decode(bytes.as_slice())
        .unwrap_or_else(|e| panic!("decoding {}: {e}", path.display()))
}

/// Reads `NAME.ops.txt`: one `OpType count` per line.
fn op_counts_file(name: &str) -> BTreeMap<String, usize> {
    let path = golden_dir().join(format!("{name}.ops.txt"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (op, n) = l
                .split_once(' ')
                .unwrap_or_else(|| panic!("bad line `{l}`"));
            (op.to_string(), n.trim().parse().unwrap())
        })
        .collect()
}

fn op_counts(g: &GraphDef) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for n in &g.node {
        *m.entry(n.op.clone()).or_default() += 1;
    }
    m
}

fn check(name: &str, nodes: usize, op_types: usize) {
    let gd = load(name);
    assert_eq!(gd.node.len(), nodes, "{name}: node count");
    let counts = op_counts(&gd);
    assert_eq!(counts.len(), op_types, "{name}: distinct op types");
    assert_eq!(counts, op_counts_file(name), "{name}: op counts");
    validate(&gd).unwrap_or_else(|e| panic!("{name} does not validate: {e}"));
    let g = Graph::from_graph_def(&gd).unwrap();
    assert_eq!(g.nodes().len(), nodes);
}

#[test]
fn client_graph_validates() {
    check("graph", 130, 31);
}

#[test]
fn monitored_graph_validates() {
    check("graph_monitored", 281, 46);
}

#[test]
fn sync_graph_validates() {
    check("graph_sync", 216, 45);
}

#[test]
fn sync_monitored_graph_validates() {
    check("graph_sync_monitored", 374, 54);
}

#[test]
fn imported_graph_knows_dtypes_and_shapes() {
    let g = Graph::from_graph_def(&load("graph")).unwrap();
    // x is float32 [?,64]; MatMul with w1 [64,32] gives [?,32]; the loss is a scalar.
    let mm = g.tensor("MatMul:0").unwrap();
    assert_eq!(mm.shape.to_string(), "[?,32]");
    assert_eq!(g.tensor("logits").unwrap().shape.to_string(), "[?,10]");
    assert_eq!(g.tensor("loss").unwrap().shape.to_string(), "[]");
    let w = g.tensor("gradients/MatMul_grad/MatMul_1").unwrap();
    assert_eq!(w.shape.to_string(), "[64,32]");
    // Defaults TensorFlow leaves implicit are filled in.
    let mm = g.node("MatMul").unwrap();
    assert!(mm.attr.contains_key("transpose_a"));
}

#[test]
fn corrupted_graphs_fail_naming_the_node() {
    let mut gd = load("graph");
    let i = gd.node.iter().position(|n| n.name == "MatMul").unwrap();
    gd.node[i].input[1] = "no_such_node".into();
    let err = validate(&gd).unwrap_err();
    assert!(
        err.message().contains("`MatMul`") && err.message().contains("no_such_node"),
        "{err}"
    );

    let mut gd = load("graph");
    gd.node[i].input[1] = "w1:3".into();
    assert!(validate(&gd).unwrap_err().message().contains("`MatMul`"));

    let mut gd = load("graph");
    gd.node[i].op = "NotAnOp".into();
    assert!(validate(&gd).unwrap_err().message().contains("`MatMul`"));

    let mut gd = load("graph");
    let dup = gd.node[i].clone();
    gd.node.push(dup);
    assert!(validate(&gd).unwrap_err().message().contains("twice"));

    let mut gd = load("graph");
    gd.node[i].name = "bad name".into();
    assert!(validate(&gd).is_err());

    // hidden -> MatMul_1 -> ... ; making x depend on the loss closes a cycle.
    let mut gd = load("graph");
    let x = gd.node.iter().position(|n| n.name == "x").unwrap();
    gd.node[x].input.push("^loss".into());
    assert!(validate(&gd).unwrap_err().message().contains("cycle"));

    // A float fed where MatMul's int... wrong dtype: feed y (int64) into MatMul.
    let mut gd = load("graph");
    gd.node[i].input[0] = "y".into();
    let err = validate(&gd).unwrap_err();
    assert!(
        err.message().contains("`MatMul`") && err.message().contains("int64"),
        "{err}"
    );
}

/// Every op of the client graph has a CPU kernel, so the whole MLP training step can run.
#[test]
fn client_graph_ops_have_cpu_kernels() {
    let counts = op_counts_file("graph");
    let registry = tessera::graph::registry::global();
    let missing: Vec<&String> = counts
        .keys()
        .filter(|op| {
            registry
                .get(op)
                .is_none_or(|d| kernel_for(d.name, DeviceType::Cpu).is_none())
        })
        .collect();
    assert!(
        missing.is_empty(),
        "ops of graph.pb without a CPU kernel: {missing:?}"
    );
}

/// TensorFlow's own training graph runs on tessera: after its variable initializers, the forward
/// part (`loss`) on a fed batch equals the same MLP computed here in plain f64 from the
/// variables' values read back out of the session.
#[test]
fn golden_graph_forward_pass_matches_a_hand_computed_mlp() {
    use tessera::client::Session;
    use tessera::tensor::Tensor;

    let session = Session::local();
    session.extend(&load("graph")).unwrap();
    session
        .run(
            &[],
            &[],
            &["w1/Assign", "b1/Assign", "w2/Assign", "b2/Assign"],
        )
        .unwrap();

    let batch = 8;
    let x: Vec<f32> = (0..batch * 64)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    let y: Vec<i64> = (0..batch as i64).map(|i| (i * 3) % 10).collect();
    let fetches = [
        "loss:0",
        "w1/Read/ReadVariableOp:0",
        "b1/Read/ReadVariableOp:0",
        "w2/Read/ReadVariableOp:0",
        "b2/Read/ReadVariableOp:0",
    ];
    let out = session
        .run(
            &[
                ("x:0", Tensor::from_vec([batch, 64], x.clone()).unwrap()),
                ("y:0", Tensor::from_vec([batch], y.clone()).unwrap()),
            ],
            &fetches,
            &[],
        )
        .unwrap();
    let loss = out[0].scalar_value::<f32>().unwrap();
    let w1 = out[1].values::<f32>().unwrap();
    let b1 = out[2].values::<f32>().unwrap();
    let w2 = out[3].values::<f32>().unwrap();
    let b2 = out[4].values::<f32>().unwrap();
    assert_eq!(
        (w1.len(), b1.len(), w2.len(), b2.len()),
        (64 * 32, 32, 32 * 10, 10)
    );

    // hidden = relu(x·w1 + b1); logits = hidden·w2 + b2; loss = mean(-log softmax(logits)[y]).
    let mut total = 0.0f64;
    for r in 0..batch {
        let hidden: Vec<f64> = (0..32)
            .map(|j| {
                let z: f64 = (0..64)
                    .map(|k| x[r * 64 + k] as f64 * w1[k * 32 + j] as f64)
                    .sum();
                (z + b1[j] as f64).max(0.0)
            })
            .collect();
        let logits: Vec<f64> = (0..10)
            .map(|c| {
                (0..32)
                    .map(|j| hidden[j] * w2[j * 10 + c] as f64)
                    .sum::<f64>()
                    + b2[c] as f64
            })
            .collect();
        let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let log_sum = logits.iter().map(|l| (l - max).exp()).sum::<f64>().ln() + max;
        total += log_sum - logits[y[r] as usize];
    }
    let expected = total / batch as f64;
    assert!(loss.is_finite() && loss > 0.0, "loss {loss}");
    assert!(
        (loss as f64 - expected).abs() <= 1e-4 * expected.abs().max(1.0),
        "tessera's loss {loss} vs hand-computed {expected}"
    );
}
