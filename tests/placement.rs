//! Placement: requested devices, colocation through resources and `_class`, device-type
//! priority, soft placement, the heuristics, and the golden replica_device_setter graph placed
//! where TensorFlow places it.

use std::fs;
use std::path::{Path, PathBuf};

use prost::Message;
use tessera::device::DeviceType;
use tessera::exec::placement::{place, registered_kernel, PlacementOptions};
use tessera::graph::attr;
use tessera::proto::{DeviceAttributes, GraphDef, NodeDef};
use tessera::Code;

const PS0: &str = "/job:ps/replica:0/task:0/device:CPU:0";
const PS1: &str = "/job:ps/replica:0/task:1/device:CPU:0";
const W0: &str = "/job:worker/replica:0/task:0/device:CPU:0";
const W0_GPU: &str = "/job:worker/replica:0/task:0/device:GPU:0";

fn node(name: &str, op: &str, device: &str, inputs: &[&str]) -> NodeDef {
    NodeDef {
        name: name.into(),
        op: op.into(),
        device: device.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn colocated(mut n: NodeDef, with: &[&str]) -> NodeDef {
    let classes: Vec<String> = with.iter().map(|w| format!("loc:@{w}")).collect();
    n.attr
        .insert("_class".into(), attr::value::string_list(classes));
    n
}

fn device(name: &str) -> DeviceAttributes {
    let device_type = if name.contains("GPU") { "GPU" } else { "CPU" };
    DeviceAttributes {
        name: name.into(),
        device_type: device_type.into(),
        ..Default::default()
    }
}

fn cluster() -> Vec<DeviceAttributes> {
    // Deliberately not sorted: placement must not depend on the order GetStatus replies come.
    [W0_GPU, PS1, W0, PS0].into_iter().map(device).collect()
}

/// Every op has a CPU kernel; only MatMul and Identity have GPU kernels.
fn cpu_and_some_gpu(op: &str, ty: DeviceType) -> bool {
    match ty {
        DeviceType::Cpu => true,
        DeviceType::Gpu => matches!(op, "MatMul" | "Identity"),
    }
}

fn run(graph: Vec<NodeDef>, soft: bool) -> tessera::Result<Vec<(String, String)>> {
    let graph = GraphDef {
        node: graph,
        ..Default::default()
    };
    let options = PlacementOptions {
        default_device: W0,
        allow_soft_placement: soft,
        has_kernel: &cpu_and_some_gpu,
    };
    let placed = place(&graph, &cluster(), &options)?;
    Ok(placed
        .node
        .into_iter()
        .map(|n| (n.name, n.device))
        .collect())
}

fn device_of<'a>(placed: &'a [(String, String)], name: &str) -> &'a str {
    &placed
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no node {name}"))
        .1
}

#[test]
fn requested_full_partial_and_legacy_devices_are_honoured() {
    let placed = run(
        vec![
            node("full", "NoOp", PS1, &[]),
            node("partial", "NoOp", "/job:ps/task:0", &[]),
            node("legacy", "NoOp", "/job:worker/task:0/cpu:0", &[]),
            node(
                "legacy_gpu",
                "MatMul",
                "/job:worker/replica:0/task:0/gpu:0",
                &[],
            ),
            node("type_only", "NoOp", "/device:CPU:0", &[]),
        ],
        false,
    )
    .unwrap();
    assert_eq!(device_of(&placed, "full"), PS1);
    assert_eq!(device_of(&placed, "partial"), PS0);
    assert_eq!(device_of(&placed, "legacy"), W0);
    assert_eq!(device_of(&placed, "legacy_gpu"), W0_GPU);
    // `/device:CPU:0` alone matches ps0, ps1 and worker0's CPU; ties go by name, and
    // "/job:ps/replica:0/task:0" sorts first.
    assert_eq!(device_of(&placed, "type_only"), PS0);
}

#[test]
fn resource_consumers_follow_their_variable() {
    let placed = run(
        vec![
            node("v", "VarHandleOp", "/job:ps/task:1", &[]),
            // replica_device_setter puts these on the worker; the variable's device wins.
            node(
                "v/IsInitialized",
                "VarIsInitializedOp",
                "/job:worker/task:0",
                &["v"],
            ),
            node("v/Assign", "AssignVariableOp", "", &["v", "v/init"]),
            node("v/init", "Const", "", &[]),
            node("v/Read", "ReadVariableOp", "", &["v"]),
            node(
                "mm",
                "MatMul",
                "/job:worker/task:0/device:CPU:0",
                &["v/Read", "v/Read"],
            ),
        ],
        false,
    )
    .unwrap();
    for name in ["v", "v/IsInitialized", "v/Assign", "v/Read"] {
        assert_eq!(device_of(&placed, name), PS1, "{name}");
    }
    // The initial value is a generator whose only consumer is on ps1.
    assert_eq!(device_of(&placed, "v/init"), PS1);
    assert_eq!(device_of(&placed, "mm"), W0);
}

#[test]
fn queue_and_accumulator_users_follow_the_resource() {
    // SyncReplicas under replica_device_setter: the token queue and the accumulators sit on
    // the ps (colocated with their variables), their users are requested on the worker.
    let placed = run(
        vec![
            node("q", "FIFOQueueV2", "/job:ps/task:1", &[]),
            node("q_Dequeue", "QueueDequeueV2", "/job:worker/task:0", &["q"]),
            node("q_Close", "QueueCloseV2", "/job:worker/task:0", &["q"]),
            node(
                "acc",
                "ResourceConditionalAccumulator",
                "/job:ps/task:1",
                &[],
            ),
            node("step", "Const", "/job:worker/task:0", &[]),
            node(
                "acc_SetGlobalStep",
                "ResourceAccumulatorSetGlobalStep",
                "/job:worker/task:0",
                &["acc", "step"],
            ),
            // A sparse accumulator's users follow its Ref(string) handle the same way.
            node(
                "sparse",
                "SparseConditionalAccumulator",
                "/job:ps/task:1",
                &[],
            ),
            node(
                "sparse_SetGlobalStep",
                "AccumulatorSetGlobalStep",
                "/job:worker/task:0",
                &["sparse", "step"],
            ),
        ],
        false,
    )
    .unwrap();
    for name in [
        "q",
        "q_Dequeue",
        "q_Close",
        "acc",
        "acc_SetGlobalStep",
        "sparse",
        "sparse_SetGlobalStep",
    ] {
        assert_eq!(device_of(&placed, name), PS1, "{name}");
    }
    assert_eq!(device_of(&placed, "step"), W0);
}

#[test]
fn class_groups_merge_their_requests() {
    let placed = run(
        vec![
            node("v", "VarHandleOp", "/job:ps/task:0", &[]),
            colocated(node("v/Initializer/zeros", "Const", "", &[]), &["v"]),
            colocated(node("slot/Initializer", "Fill", "", &[]), &["v"]),
            // A group whose members request different parts of one device.
            node("a", "MatMul", "/job:worker/task:0", &[]),
            colocated(node("b", "Identity", "/device:GPU:0", &[]), &["a"]),
        ],
        false,
    )
    .unwrap();
    assert_eq!(device_of(&placed, "v/Initializer/zeros"), PS0);
    assert_eq!(device_of(&placed, "slot/Initializer"), PS0);
    assert_eq!(device_of(&placed, "a"), W0_GPU);
    assert_eq!(device_of(&placed, "b"), W0_GPU);
}

#[test]
fn conflicting_colocation_is_an_error_naming_both_nodes() {
    let graph = vec![
        node("a", "NoOp", "/job:ps/task:0", &[]),
        colocated(node("b", "NoOp", "/job:worker/task:0", &[]), &["a"]),
    ];
    for soft in [false, true] {
        // Soft placement relaxes device types and ids, never jobs or tasks.
        let err = run(graph.clone(), soft).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        let m = err.message();
        assert!(m.starts_with("Cannot colocate nodes `a` and `b`"), "{m}");
        assert!(
            m.contains("/job:ps/task:0") && m.contains("/job:worker/task:0"),
            "{m}"
        );
    }
}

#[test]
fn conflicting_device_types_are_relaxed_by_soft_placement() {
    let graph = vec![
        node("a", "MatMul", "/job:worker/task:0/device:GPU:0", &[]),
        colocated(
            node("b", "Identity", "/job:worker/task:0/device:CPU:0", &[]),
            &["a"],
        ),
    ];
    let err = run(graph.clone(), false).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("Cannot colocate nodes `a` and `b`"),
        "{}",
        err.message()
    );
    // Relaxed to /job:worker/task:0; both ops have GPU kernels, so GPU wins.
    let placed = run(graph, true).unwrap();
    assert_eq!(device_of(&placed, "a"), W0_GPU);
    assert_eq!(device_of(&placed, "b"), W0_GPU);
}

#[test]
fn gpu_is_preferred_only_where_every_op_of_the_group_has_a_gpu_kernel() {
    let placed = run(
        vec![
            node("mm", "MatMul", "/job:worker/task:0", &[]),
            node("relu", "Relu", "/job:worker/task:0", &[]),
            node("mm2", "MatMul", "/job:worker/task:0", &[]),
            colocated(node("relu2", "Relu", "", &[]), &["mm2"]),
        ],
        false,
    )
    .unwrap();
    assert_eq!(device_of(&placed, "mm"), W0_GPU);
    assert_eq!(device_of(&placed, "relu"), W0);
    // Relu has no GPU kernel, so its whole group stays on the CPU.
    assert_eq!(device_of(&placed, "mm2"), W0);
    assert_eq!(device_of(&placed, "relu2"), W0);
}

#[test]
fn unknown_device_is_an_error_naming_node_and_devices() {
    for soft in [false, true] {
        let err = run(vec![node("x", "NoOp", "/job:ps/task:9", &[])], soft).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        let m = err.message();
        assert!(
            m.starts_with("Cannot assign a device for operation `x`"),
            "{m}"
        );
        assert!(m.contains("requested `/job:ps/task:9`"), "{m}");
        for d in [PS0, PS1, W0, W0_GPU] {
            assert!(m.contains(d), "{m} lacks {d}");
        }
    }
}

#[test]
fn soft_placement_falls_back_from_missing_gpus_and_gpu_kernels() {
    let graph = vec![
        node(
            "no_such_gpu",
            "MatMul",
            "/job:worker/task:0/device:GPU:1",
            &[],
        ),
        node(
            "no_gpu_kernel",
            "Relu",
            "/job:worker/task:0/device:GPU:0",
            &[],
        ),
    ];
    let err = run(graph[..1].to_vec(), false).unwrap_err();
    assert!(err.message().contains("`no_such_gpu`"), "{}", err.message());
    let err = run(graph[1..].to_vec(), false).unwrap_err();
    assert!(
        err.message().contains("`no_gpu_kernel`"),
        "{}",
        err.message()
    );
    assert!(err
        .message()
        .contains("Relu on /job:worker/replica:0/task:0/device:GPU:0"));

    let placed = run(graph, true).unwrap();
    assert_eq!(device_of(&placed, "no_such_gpu"), W0_GPU);
    assert_eq!(device_of(&placed, "no_gpu_kernel"), W0);
}

#[test]
fn unconstrained_nodes_follow_the_heuristics_or_the_default_device() {
    let placed = run(
        vec![
            node("v", "VarHandleOp", "/job:ps/task:1", &[]),
            node("read", "ReadVariableOp", "", &["v"]),
            node("shape", "Shape", "", &["read"]),
            node("c", "Const", "", &[]),
            node("add", "AddV2", "/job:ps/task:1", &["read", "c"]),
            node("c2", "Const", "", &[]),
            node("mixed_a", "AddV2", "/job:ps/task:0", &["c2", "c2"]),
            node("mixed_b", "AddV2", "/job:ps/task:1", &["c2", "c2"]),
            node("free", "AddV2", "", &["shape", "shape"]),
        ],
        false,
    )
    .unwrap();
    assert_eq!(device_of(&placed, "read"), PS1);
    assert_eq!(
        device_of(&placed, "shape"),
        PS1,
        "metadata follows its input"
    );
    assert_eq!(
        device_of(&placed, "c"),
        PS1,
        "generator joins its only consumer"
    );
    assert_eq!(
        device_of(&placed, "c2"),
        W0,
        "consumers disagree: the default device"
    );
    assert_eq!(
        device_of(&placed, "free"),
        W0,
        "unconstrained: the default device"
    );
}

#[test]
fn malformed_requests_and_inputs_are_invalid_arguments() {
    let err = run(vec![node("x", "NoOp", "/job:ps/task:zero", &[])], false).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("`x`") && err.message().contains("/job:ps/task:zero"));
    let err = run(vec![node("y", "NoOp", "", &["missing"])], false).unwrap_err();
    assert!(err.message().contains("`y`") && err.message().contains("`missing`"));
}

/// Finds the golden directory: `$TESSERA_GOLDEN_DIR`, then `../shared/golden` next to the
/// crate, then `/work/shared/golden`.
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

/// Where TensorFlow puts each node of the golden graph (built with
/// replica_device_setter(ps_tasks=2)): a variable, everything colocated with it by `_class`
/// and everything reading or updating it through its resource handle on the variable's ps
/// (w1, w2 on ps1; global_step, b1, b2 on ps0, round-robin in creation order), the optimizer's
/// per-ps NoOps where the graph requests them, all other nodes on the worker.
fn tensorflow_device(name: &str) -> &'static str {
    let var_of = |prefix: &str| {
        name == prefix
            || name.starts_with(&format!("{prefix}/"))
            || name.starts_with(&format!("Adagrad/update_{prefix}/"))
    };
    // Reads the models' forward pass does through each variable's handle.
    match name {
        "MatMul/ReadVariableOp" | "MatMul_1/ReadVariableOp" | "Adagrad/update/NoOp_1" => PS1,
        "add/ReadVariableOp" | "logits/ReadVariableOp" | "Adagrad/update/NoOp" => PS0,
        "Adagrad" | "Adagrad/Const" => PS0,
        _ if var_of("w1") || var_of("w2") => PS1,
        _ if var_of("global_step") || var_of("b1") || var_of("b2") => PS0,
        _ => W0,
    }
}

#[test]
fn golden_graph_lands_where_tensorflow_puts_it() {
    let bytes = fs::read(golden_dir().join("graph.pb")).unwrap();
    let graph = GraphDef::decode(bytes.as_slice()).unwrap();
    assert_eq!(graph.node.len(), 130);
    let devices: Vec<DeviceAttributes> = [PS0, PS1, W0].into_iter().map(device).collect();
    let all_cpu = |_: &str, ty: DeviceType| ty == DeviceType::Cpu;
    let options = PlacementOptions {
        default_device: W0,
        allow_soft_placement: false,
        has_kernel: &all_cpu,
    };
    let placed = place(&graph, &devices, &options).unwrap();
    let mut on_ps = 0;
    for (before, after) in graph.node.iter().zip(&placed.node) {
        assert_eq!(before.name, after.name);
        assert_eq!(
            after.device,
            tensorflow_device(&after.name),
            "node {}",
            after.name
        );
        on_ps += usize::from(after.device != W0);
    }
    // 5 variables + 4 slots with their initializers, reads, assigns, checks and updates.
    assert!(on_ps > 50, "only {on_ps} nodes on the ps tasks");
}

#[test]
fn golden_graph_places_with_tessera_kernels() {
    // Every op of the golden training graph has a CPU kernel in tessera's registry, so the
    // production predicate places it exactly like the all-CPU table above.
    let bytes = fs::read(golden_dir().join("graph.pb")).unwrap();
    let graph = GraphDef::decode(bytes.as_slice()).unwrap();
    let devices: Vec<DeviceAttributes> = [PS0, PS1, W0].into_iter().map(device).collect();
    let options = PlacementOptions {
        default_device: W0,
        allow_soft_placement: false,
        has_kernel: &registered_kernel,
    };
    let placed = place(&graph, &devices, &options).unwrap();
    for n in &placed.node {
        assert_eq!(n.device, tensorflow_device(&n.name), "node {}", n.name);
    }
}
