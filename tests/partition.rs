//! Partitioning: the exact `_Send`/`_Recv` nodes for a small two-task graph, `_Recv` sharing,
//! control edges, client feeds and fetches, and the golden graph split the way TensorFlow's
//! master splits it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use prost::Message;
use tessera::device::DeviceType;
use tessera::exec::partition::{by_device, by_task, partition, PartitionOptions};
use tessera::exec::placement::{place, PlacementOptions};
use tessera::exec::subgraph::{rewrite_for_client, ClientSignature};
use tessera::graph::attr::{self, value};
use tessera::proto::{AttrValue, DeviceAttributes, GraphDef, NodeDef, TensorProto};
use tessera::runtime::rendezvous::rendezvous_key_of;
use tessera::tensor::DType;
use tessera::{Code, Result};

const PS0: &str = "/job:ps/replica:0/task:0/device:CPU:0";
const PS1: &str = "/job:ps/replica:0/task:1/device:CPU:0";
const W0: &str = "/job:worker/replica:0/task:0/device:CPU:0";
/// The ps incarnation of golden traffic 0012 (`e4b96570c8394f81` in its rendezvous key); the
/// same task's partitions in 0005 carry it as the int64 attr -1965428227300569215.
const PS0_INC: u64 = 0xe4b9_6570_c839_4f81;
const PS0_INC_ATTR: i64 = -1_965_428_227_300_569_215;
const PS1_INC: u64 = 7;
const W0_INC: u64 = 0x0123_4567_89ab_cdef;

fn node(
    name: &str,
    op: &str,
    device: &str,
    inputs: &[&str],
    attrs: &[(&str, AttrValue)],
) -> NodeDef {
    NodeDef {
        name: name.into(),
        op: op.into(),
        device: device.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        attr: attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        ..Default::default()
    }
}

fn incarnation(device: &str) -> Option<u64> {
    match device {
        PS0 => Some(PS0_INC),
        PS1 => Some(PS1_INC),
        W0 => Some(W0_INC),
        _ => None,
    }
}

/// Output dtypes as TensorFlow's op definitions give them, for the ops these tests use.
fn output_dtype(node: &NodeDef, _index: usize) -> Result<DType> {
    match node.op.as_str() {
        "VarHandleOp" => Ok(DType::Resource),
        "VarIsInitializedOp" => Ok(DType::Bool),
        "Shape" | "Size" => attr::dtype(node, "out_type"),
        "Cast" => attr::dtype(node, "DstT"),
        "_Recv" => attr::dtype(node, "tensor_type"),
        "Const" | "Placeholder" | "ReadVariableOp" | "RandomUniform" => attr::dtype(node, "dtype"),
        _ => attr::dtype(node, "T"),
    }
}

fn split(graph: &GraphDef, counter: &mut u64) -> Result<BTreeMap<String, GraphDef>> {
    let options = PartitionOptions {
        node_to_loc: &by_task,
        incarnation: &incarnation,
        output_dtype: &output_dtype,
    };
    partition(graph, &options, counter)
}

fn float() -> AttrValue {
    value::dtype(DType::Float)
}

/// The attrs TensorFlow puts on both ends of a cut edge.
fn pair_attrs(
    tensor: &str,
    send: &str,
    inc: i64,
    recv: &str,
    src: &str,
    dst: &str,
) -> Vec<(&'static str, AttrValue)> {
    vec![
        ("tensor_name", value::string(tensor)),
        ("send_device", value::string(send)),
        ("send_device_incarnation", value::int(inc)),
        ("recv_device", value::string(recv)),
        ("client_terminated", value::bool(false)),
        ("_src", value::string(src)),
        ("_dst", value::string(dst)),
    ]
}

fn with(
    mut attrs: Vec<(&'static str, AttrValue)>,
    extra: (&'static str, AttrValue),
) -> Vec<(&'static str, AttrValue)> {
    attrs.push(extra);
    attrs
}

/// ps0 holds a variable and reads it; the worker multiplies by it twice (one `_Recv` serves
/// both), and a ps node waits on the worker's MatMul through a control edge.
fn two_task_graph() -> GraphDef {
    GraphDef {
        node: vec![
            node("v", "VarHandleOp", PS0, &[], &[("dtype", float())]),
            node("read", "ReadVariableOp", PS0, &["v"], &[("dtype", float())]),
            node("x", "Const", W0, &[], &[("dtype", float())]),
            node("mm", "MatMul", W0, &["x", "read"], &[("T", float())]),
            node("relu", "Relu", W0, &["read"], &[("T", float())]),
            node("upd", "NoOp", PS0, &["^mm"], &[]),
        ],
        versions: Some(tessera::proto::VersionDef {
            producer: 2474,
            min_consumer: 12,
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn two_task_graph_gives_tensorflows_send_recv_nodes() {
    let graph = two_task_graph();
    let mut counter = 0;
    let parts = split(&graph, &mut counter).unwrap();
    assert_eq!(
        parts.keys().collect::<Vec<_>>(),
        ["/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"]
    );
    // Edges are numbered consumer by consumer, inputs in order: v→read 0, x→mm 1, read→mm 2,
    // read→relu 3, ^mm→upd 4. The cut ones are 2 (read→relu shares its pair) and 4.
    let empty = TensorProto {
        dtype: tessera::proto::DataType::DtFloat as i32,
        tensor_shape: Some(tessera::proto::TensorShapeProto {
            dim: vec![tessera::proto::tensor_shape_proto::Dim {
                size: 0,
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let ps_expected = vec![
        graph.node[0].clone(),
        graph.node[1].clone(),
        node(
            "read_S0",
            "_Send",
            PS0,
            &["read"],
            &with(
                pair_attrs("edge_2_read", PS0, PS0_INC_ATTR, W0, "read", "mm"),
                ("T", float()),
            ),
        ),
        node(
            "mm_S4",
            "_Recv",
            PS0,
            &[],
            &with(
                pair_attrs("edge_4_mm", W0, W0_INC as i64, PS0, "mm", "upd"),
                ("tensor_type", float()),
            ),
        ),
        node("mm_S5", "Identity", PS0, &["mm_S4"], &[("T", float())]),
        node("upd", "NoOp", PS0, &["^mm_S5"], &[]),
    ];
    let worker_expected = vec![
        graph.node[2].clone(),
        node(
            "read_S1",
            "_Recv",
            W0,
            &[],
            &with(
                pair_attrs("edge_2_read", PS0, PS0_INC_ATTR, W0, "read", "mm"),
                ("tensor_type", float()),
            ),
        ),
        node("mm", "MatMul", W0, &["x", "read_S1"], &[("T", float())]),
        node("relu", "Relu", W0, &["read_S1"], &[("T", float())]),
        node(
            "mm/ctrl_S2",
            "Const",
            W0,
            &["^mm"],
            &[("dtype", float()), ("value", value::tensor(empty))],
        ),
        node(
            "mm_S3",
            "_Send",
            W0,
            &["mm/ctrl_S2"],
            &with(
                pair_attrs("edge_4_mm", W0, W0_INC as i64, PS0, "mm", "upd"),
                ("T", float()),
            ),
        ),
    ];
    let ps = &parts["/job:ps/replica:0/task:0"];
    let worker = &parts["/job:worker/replica:0/task:0"];
    assert_eq!(ps.node, ps_expected);
    assert_eq!(worker.node, worker_expected);
    assert_eq!(ps.versions, graph.versions);
    assert_eq!(worker.versions, graph.versions);
    assert_eq!(counter, 6, "six new nodes were named");

    // Both ends of each pair meet under one rendezvous key.
    let key = "/job:ps/replica:0/task:0/device:CPU:0;e4b96570c8394f81;\
               /job:worker/replica:0/task:0/device:CPU:0;edge_2_read;0:0";
    assert_eq!(rendezvous_key_of(&ps.node[2]).unwrap().as_str(), key);
    assert_eq!(rendezvous_key_of(&worker.node[1]).unwrap().as_str(), key);
    assert_eq!(
        rendezvous_key_of(&ps.node[3]).unwrap(),
        rendezvous_key_of(&worker.node[5]).unwrap()
    );
}

#[test]
fn the_counter_carries_over_between_partitionings() {
    let mut counter = 40;
    let parts = split(&two_task_graph(), &mut counter).unwrap();
    let names: HashSet<&str> = parts
        .values()
        .flat_map(|g| &g.node)
        .map(|n| n.name.as_str())
        .collect();
    for name in [
        "read_S40",
        "read_S41",
        "mm/ctrl_S42",
        "mm_S43",
        "mm_S44",
        "mm_S45",
    ] {
        assert!(names.contains(name), "{name} missing from {names:?}");
    }
    assert_eq!(counter, 46);
}

#[test]
fn partitioning_needs_placed_nodes_and_known_incarnations() {
    let mut graph = two_task_graph();
    graph.node[4].device = "/job:worker/task:0".into();
    let err = split(&graph, &mut 0).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("`relu`"), "{}", err.message());

    let mut graph = two_task_graph();
    for n in &mut graph.node[..2] {
        n.device = "/job:ps/replica:0/task:3/device:CPU:0".into();
    }
    let err = split(&graph, &mut 0).unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("task:3") && err.message().contains("`read`"));
}

#[test]
fn control_inputs_on_pure_nodes_are_dropped_and_what_only_they_needed_is_pruned() {
    // A gradient tuple as TensorFlow 1 writes it: `group_deps` waits for both gradients, and
    // the update reads one of them through an identity that waits for `group_deps`. The
    // input gradient `dx` is read by nothing; the initializer's `Assign` writes a variable.
    let graph = GraphDef {
        node: vec![
            node("x", "Placeholder", W0, &[], &[("dtype", float())]),
            node("w", "Const", W0, &[], &[("dtype", float())]),
            node("dy", "Const", W0, &[], &[("dtype", float())]),
            node("dx", "MatMul", W0, &["dy", "w"], &[("T", float())]),
            node("dw", "MatMul", W0, &["x", "dy"], &[("T", float())]),
            node("group_deps", "NoOp", W0, &["^dx", "^dw"], &[]),
            node(
                "dw_dep",
                "Identity",
                W0,
                &["dw", "^group_deps"],
                &[("T", float())],
            ),
            node("v", "VariableV2", W0, &[], &[("dtype", float())]),
            node("assign", "Assign", W0, &["v", "w"], &[("T", float())]),
            node("init", "NoOp", W0, &["^assign"], &[]),
            node(
                "after_init",
                "Identity",
                W0,
                &["dw_dep", "^init"],
                &[("T", float())],
            ),
        ],
        ..Default::default()
    };
    let (feeds, fetches) = (["x:0".to_string()], ["after_init:0".to_string()]);
    let signature = ClientSignature {
        feeds: &feeds,
        fetches: &fetches,
        targets: &[],
        client_device: W0,
        client_incarnation: W0_INC,
    };
    let rewritten = rewrite_for_client(&graph, &signature, &output_dtype).unwrap();
    let names: Vec<&str> = rewritten.node.iter().map(|n| n.name.as_str()).collect();
    assert!(
        !names.contains(&"dx") && !names.contains(&"group_deps"),
        "{names:?}"
    );
    for kept in ["dw", "assign", "init", "v"] {
        assert!(names.contains(&kept), "{kept} must stay: {names:?}");
    }
    let after = rewritten
        .node
        .iter()
        .find(|n| n.name == "after_init")
        .unwrap();
    assert!(
        after.input.contains(&"^init".to_string()),
        "{:?}",
        after.input
    );

    // With v1 control flow in the graph every control edge stays.
    let mut looped = graph.clone();
    looped
        .node
        .push(node("s", "Switch", W0, &["w", "w"], &[("T", float())]));
    let rewritten = rewrite_for_client(&looped, &signature, &output_dtype).unwrap();
    assert!(rewritten.node.iter().any(|n| n.name == "dx"));
}

#[test]
fn client_feeds_and_fetches_become_client_terminated_pairs() {
    let graph = GraphDef {
        node: vec![
            node("x", "Placeholder", W0, &[], &[("dtype", float())]),
            node("w", "Const", W0, &[], &[("dtype", float())]),
            node("y", "MatMul", W0, &["x", "w"], &[("T", float())]),
            node("z", "Relu", W0, &["y"], &[("T", float())]),
            node("unused", "Const", W0, &[], &[("dtype", float())]),
            node("train", "NoOp", W0, &["^w"], &[]),
        ],
        ..Default::default()
    };
    let (feeds, fetches, targets) = (
        ["x:0".to_string()],
        ["z:0".to_string()],
        ["train".to_string()],
    );
    let signature = ClientSignature {
        feeds: &feeds,
        fetches: &fetches,
        targets: &targets,
        client_device: W0,
        client_incarnation: W0_INC,
    };
    let rewritten = rewrite_for_client(&graph, &signature, &output_dtype).unwrap();
    let client = |tensor: &str, extra: (&'static str, AttrValue)| {
        vec![
            ("tensor_name", value::string(tensor)),
            ("send_device", value::string(W0)),
            ("send_device_incarnation", value::int(W0_INC as i64)),
            ("recv_device", value::string(W0)),
            ("client_terminated", value::bool(true)),
            extra,
        ]
    };
    let expected = vec![
        graph.node[1].clone(),
        node("y", "MatMul", W0, &["_recv_x_0", "w"], &[("T", float())]),
        graph.node[3].clone(),
        // Its control input on a constant orders nothing and is dropped, as grappler does.
        node("train", "NoOp", W0, &[], &[]),
        node(
            "_recv_x_0",
            "_Recv",
            W0,
            &[],
            &client("x:0", ("tensor_type", float())),
        ),
        node(
            "_send_z_0",
            "_Send",
            W0,
            &["z"],
            &client("z:0", ("T", float())),
        ),
    ];
    // The fed placeholder and the unused constant are pruned.
    assert_eq!(rewritten.node, expected);
    let key = format!("{W0};0123456789abcdef;{W0};x:0;0:0");
    assert_eq!(rendezvous_key_of(&rewritten.node[4]).unwrap().as_str(), key);
    assert_eq!(
        rendezvous_key_of(&rewritten.node[5]).unwrap().as_str(),
        format!("{W0};0123456789abcdef;{W0};z:0;0:0")
    );

    let missing = ["nope:0".to_string()];
    let bad = ClientSignature {
        fetches: &missing,
        ..signature
    };
    let err = rewrite_for_client(&graph, &bad, &output_dtype).unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("nope"), "{}", err.message());
}

#[test]
fn a_feed_on_another_task_travels_like_tensorflows_edge_to_the_worker() {
    // As in golden traffic 0205: the client's master is the ps, so x arrives there and is sent
    // on to the worker under `edge_<id>__recv_x_0`.
    let graph = GraphDef {
        node: vec![
            node("x", "Placeholder", W0, &[], &[("dtype", float())]),
            node("hidden", "Relu", W0, &["x"], &[("T", float())]),
        ],
        ..Default::default()
    };
    let (feeds, fetches) = (["x:0".to_string()], ["hidden:0".to_string()]);
    let signature = ClientSignature {
        feeds: &feeds,
        fetches: &fetches,
        targets: &[],
        client_device: PS0,
        client_incarnation: PS0_INC,
    };
    let rewritten = rewrite_for_client(&graph, &signature, &output_dtype).unwrap();
    let parts = split(&rewritten, &mut 0).unwrap();
    let worker = &parts["/job:worker/replica:0/task:0"];
    let recv = worker.node.iter().find(|n| n.op == "_Recv").unwrap();
    // Edges of the rewritten graph [hidden, _recv_x_0, _send_hidden_0]: _recv_x_0→hidden is
    // edge 0, hidden→_send_hidden_0 edge 1.
    assert_eq!(recv.name, "_recv_x_0_S1");
    assert_eq!(
        attr::string_or(recv, "tensor_name", "").unwrap(),
        "edge_0__recv_x_0"
    );
    assert_eq!(attr::string_or(recv, "send_device", "").unwrap(), PS0);
    let ps = &parts["/job:ps/replica:0/task:0"];
    let ops: Vec<&str> = ps.node.iter().map(|n| n.op.as_str()).collect();
    // The send of x comes first: it was added when the worker's `hidden` was partitioned.
    assert_eq!(ops, ["_Send", "_Recv", "_Recv", "_Send"]);
}

#[test]
fn a_worker_splits_its_partition_by_device() {
    const GPU: &str = "/job:worker/replica:0/task:0/device:GPU:0";
    let graph = GraphDef {
        node: vec![
            node("x", "Const", W0, &[], &[("dtype", float())]),
            node("mm", "MatMul", GPU, &["x", "x"], &[("T", float())]),
            node("out", "Identity", W0, &["mm"], &[("T", float())]),
        ],
        ..Default::default()
    };
    let gpu_inc = |d: &str| if d == GPU { Some(9) } else { incarnation(d) };
    let options = PartitionOptions {
        node_to_loc: &by_device,
        incarnation: &gpu_inc,
        output_dtype: &output_dtype,
    };
    let parts = partition(&graph, &options, &mut 0).unwrap();
    assert_eq!(parts.keys().collect::<Vec<_>>(), [W0, GPU]);
    // Both uses of x on the GPU share one pair (edge 0: x→mm input 0); mm goes back to the CPU.
    let gpu: Vec<(&str, &str, &[String])> = parts[GPU]
        .node
        .iter()
        .map(|n| (n.name.as_str(), n.op.as_str(), &n.input[..]))
        .collect();
    assert_eq!(
        gpu,
        [
            ("x_S1", "_Recv", &[][..]),
            (
                "mm",
                "MatMul",
                &["x_S1".to_string(), "x_S1".to_string()][..]
            ),
            ("mm_S2", "_Send", &["mm".to_string()][..]),
        ]
    );
    let recv = &parts[GPU].node[0];
    assert_eq!(
        rendezvous_key_of(recv).unwrap().as_str(),
        format!("{W0};0123456789abcdef;{GPU};edge_0_x;0:0")
    );
    let out = parts[W0].node.iter().find(|n| n.name == "out").unwrap();
    assert_eq!(out.input, ["mm_S3"]);
}

fn golden_dir() -> PathBuf {
    let mut candidates = Vec::new();
    if let Ok(dir) = std::env::var("TESSERA_GOLDEN_DIR") {
        candidates.push(PathBuf::from(dir));
    }
    candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/golden"));
    candidates.push(PathBuf::from("/work/shared/golden"));
    candidates
        .into_iter()
        .find(|d| d.join("graph.pb").is_file())
        .expect("golden graph.pb not found; set TESSERA_GOLDEN_DIR")
}

/// Follows a partition input back to the original producer: through a `_Recv` to its
/// `_Send`'s input, and for control inputs through `Identity` ← `_Recv` ← `_Send` ← `Const`.
fn resolve(
    input: &str,
    nodes: &HashMap<&str, &NodeDef>,
    sends: &HashMap<String, &NodeDef>,
) -> String {
    let (control, name) = match input.strip_prefix('^') {
        Some(n) => (true, n),
        None => (false, input),
    };
    let base = name.split(':').next().unwrap();
    let Some(node) = nodes.get(base) else {
        panic!("input {input} names no partition node")
    };
    let cut =
        |n: &NodeDef| n.op == "_Recv" && !attr::bool_or(n, "client_terminated", false).unwrap();
    let recv = if !control {
        Some(*node).filter(|n| cut(n))
    } else if node.op == "Identity" {
        node.input
            .first()
            .and_then(|i| nodes.get(i.as_str()))
            .copied()
            .filter(|n| cut(n))
    } else {
        None
    };
    let Some(recv) = recv else {
        return input.to_string();
    };
    let tensor = attr::string_or(recv, "tensor_name", "").unwrap();
    let send = sends
        .get(&tensor)
        .unwrap_or_else(|| panic!("no _Send for {tensor}"));
    for key in ["send_device", "recv_device", "send_device_incarnation"] {
        assert_eq!(
            send.attr.get(key),
            recv.attr.get(key),
            "{key} of pair {tensor}"
        );
    }
    assert_eq!(
        attr::dtype(send, "T").unwrap(),
        attr::dtype(recv, "tensor_type").unwrap()
    );
    if control {
        let ctrl = nodes[send.input[0].as_str()];
        assert_eq!(ctrl.op, "Const");
        ctrl.input[0].clone()
    } else {
        send.input[0].clone()
    }
}

#[test]
fn golden_graph_partitions_into_matching_pairs() {
    let bytes = fs::read(golden_dir().join("graph.pb")).unwrap();
    let graph = GraphDef::decode(bytes.as_slice()).unwrap();
    let devices: Vec<DeviceAttributes> = [PS0, PS1, W0]
        .into_iter()
        .map(|d| DeviceAttributes {
            name: d.into(),
            device_type: "CPU".into(),
            ..Default::default()
        })
        .collect();
    let all_cpu = |_: &str, ty: DeviceType| ty == DeviceType::Cpu;
    let placement = PlacementOptions {
        default_device: W0,
        allow_soft_placement: false,
        has_kernel: &all_cpu,
    };
    let placed = place(&graph, &devices, &placement).unwrap();

    // The training step of golden traffic 0053.
    let feeds = ["x:0".to_string(), "y:0".to_string()];
    let fetches = [
        "global_step/Read/ReadVariableOp:0".to_string(),
        "loss:0".to_string(),
    ];
    let targets = ["Adagrad".to_string()];
    let signature = ClientSignature {
        feeds: &feeds,
        fetches: &fetches,
        targets: &targets,
        client_device: W0,
        client_incarnation: W0_INC,
    };
    let pruned = rewrite_for_client(&placed, &signature, &output_dtype).unwrap();
    let mut counter = 0;
    let parts = split(&pruned, &mut counter).unwrap();
    assert_eq!(
        parts.keys().collect::<Vec<_>>(),
        [
            "/job:ps/replica:0/task:0",
            "/job:ps/replica:0/task:1",
            "/job:worker/replica:0/task:0"
        ]
    );

    let all: Vec<&NodeDef> = parts.values().flat_map(|g| &g.node).collect();
    let nodes: HashMap<&str, &NodeDef> = all.iter().map(|n| (n.name.as_str(), *n)).collect();
    assert_eq!(
        nodes.len(),
        all.len(),
        "node names are unique across partitions"
    );
    let mut sends = HashMap::new();
    for n in all
        .iter()
        .filter(|n| n.op == "_Send" && !attr::bool_or(n, "client_terminated", false).unwrap())
    {
        let tensor = attr::string_or(n, "tensor_name", "").unwrap();
        assert!(
            sends.insert(tensor, *n).is_none(),
            "one _Send per tensor name"
        );
    }

    // Every partition is self-contained and on its own task.
    for (task, part) in &parts {
        let names: HashSet<&str> = part.node.iter().map(|n| n.name.as_str()).collect();
        for n in &part.node {
            assert!(
                n.device.starts_with(&format!("{task}/")),
                "{} on {}",
                n.name,
                n.device
            );
            for input in &n.input {
                let base = input.trim_start_matches('^').split(':').next().unwrap();
                assert!(
                    names.contains(base),
                    "{} in {task} reads {input} from elsewhere",
                    n.name
                );
            }
        }
        assert_eq!(part.versions, graph.versions);
    }

    // No node lost or duplicated: the originals in the partitions are exactly the pruned graph.
    let pruned_names: HashSet<&str> = pruned.node.iter().map(|n| n.name.as_str()).collect();
    let new_names: HashSet<&str> = all
        .iter()
        .map(|n| n.name.as_str())
        .filter(|n| !pruned_names.contains(n))
        .collect();
    assert_eq!(all.len(), pruned.node.len() + new_names.len());
    assert_eq!(
        new_names.len() as u64,
        counter,
        "every new node is numbered"
    );
    assert!(!pruned_names.contains("x") && pruned_names.contains("_recv_x_0"));

    // Every edge of the pruned graph survives, directly or through a matching pair.
    let mut crossing = 0;
    for original in &pruned.node {
        let copy = nodes[original.name.as_str()];
        assert_eq!(copy.input.len(), original.input.len());
        for (was, is) in original.input.iter().zip(&copy.input) {
            crossing += usize::from(was != is);
            assert_eq!(
                &resolve(is, &nodes, &sends),
                was,
                "input of {}",
                original.name
            );
        }
    }
    assert!(crossing >= 10, "only {crossing} edges cross tasks");

    // As in golden traffic 0057: w1's forward read comes from ps1 to the worker.
    let worker = &parts["/job:worker/replica:0/task:0"];
    let read = worker
        .node
        .iter()
        .find(|n| n.op == "_Recv" && n.name.starts_with("MatMul/ReadVariableOp_S"))
        .expect("worker receives MatMul/ReadVariableOp");
    assert_eq!(attr::string_or(read, "send_device", "").unwrap(), PS1);
    assert_eq!(
        attr::int(read, "send_device_incarnation").unwrap(),
        PS1_INC as i64
    );
    assert!(attr::string_or(read, "tensor_name", "")
        .unwrap()
        .ends_with("_MatMul/ReadVariableOp"));
    // The apply ops run on the ps that holds their variables.
    let ps1 = &parts["/job:ps/replica:0/task:1"];
    assert!(ps1
        .node
        .iter()
        .any(|n| n.name == "Adagrad/update_w1/ResourceApplyAdagrad"));
}
