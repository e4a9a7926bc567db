//! WorkerService logic on one task (`WorkerState`, no actors, no sockets): worker sessions,
//! RegisterGraph with the per-device split, RunGraph with feeds and fetches through the step's
//! rendezvous, RecvTensor (before its RunGraph, wrong incarnation, deadline), step errors that
//! abort the other devices' receives, CleanupGraph, DeleteWorkerSession, bad graphs, and golden
//! TensorFlow traffic replayed against the worker.
//!
//! Partitions are written by hand as a master would send them; every rendezvous key is spelled
//! out here in TensorFlow's layout (`src;incarnation as 16 hex;dst;name;0:0`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use prost::Message;
use std::sync::Arc;

use tessera::cluster::{ClusterSpec, Limits, TaskId};
use tessera::graph::attr;
use tessera::peer::{RemoteFetcher, SimulatedCluster, SimulatedPeer};
use tessera::proto::{
    AttrValue, CleanupAllRequest, CleanupGraphRequest, CreateWorkerSessionRequest,
    DeleteWorkerSessionRequest, DeregisterGraphRequest, DeviceAttributes, GetStatusRequest,
    GraphDef, NamedTensorProto, NodeDef, RecvTensorRequest, RecvTensorResponse,
    RegisterGraphRequest, RunGraphRequest, RunGraphResponse,
};
use tessera::runtime::rendezvous::ParsedKey;
use tessera::runtime::resource::Var;
use tessera::tensor::{DType, Tensor};
use tessera::worker::{WorkerOptions, WorkerState};
use tessera::Code;

const CPU0: &str = "/job:worker/replica:0/task:0/device:CPU:0";
const CPU1: &str = "/job:worker/replica:0/task:0/device:CPU:1";
const INC0: u64 = 0x1111_2222_3333_4444;
const INC1: u64 = 0x5555_6666_7777_8888;
/// The client device of the master (here, the same task's CPU:0).
const CLIENT: &str = CPU0;
const PS0: &str = "/job:ps/replica:0/task:0/device:CPU:0";

fn cpu(name: &str, incarnation: u64) -> DeviceAttributes {
    DeviceAttributes {
        name: name.into(),
        device_type: "CPU".into(),
        incarnation,
        ..Default::default()
    }
}

/// A worker task with two CPUs and generous deadlines (tests that need a short one set it).
fn worker() -> WorkerState {
    worker_with(WorkerOptions {
        step_timeout: Duration::from_secs(30),
        recv_timeout: Duration::from_secs(30),
        ..Default::default()
    })
}

fn worker_with(options: WorkerOptions) -> WorkerState {
    WorkerState::with_options(
        TaskId::new("worker", 0),
        vec![cpu(CPU0, INC0), cpu(CPU1, INC1)],
        None,
        options,
    )
}

fn node(name: &str, op: &str, device: &str, inputs: &[&str]) -> NodeDef {
    NodeDef {
        name: name.into(),
        op: op.into(),
        device: device.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn with(mut n: NodeDef, attrs: Vec<(&str, AttrValue)>) -> NodeDef {
    for (k, v) in attrs {
        n.attr.insert(k.into(), v);
    }
    n
}

fn constant(name: &str, device: &str, value: Tensor) -> NodeDef {
    with(
        node(name, "Const", device, &[]),
        vec![
            ("dtype", attr::value::dtype(value.dtype())),
            ("value", attr::value::tensor(value.to_proto())),
        ],
    )
}

fn binary(name: &str, op: &str, device: &str, a: &str, b: &str) -> NodeDef {
    with(
        node(name, op, device, &[a, b]),
        vec![("T", attr::value::dtype(DType::Float))],
    )
}

/// The attrs both ends of a pair carry.
fn pair_attrs(
    send_device: &str,
    incarnation: u64,
    recv_device: &str,
    tensor_name: &str,
    client_terminated: bool,
) -> Vec<(&'static str, AttrValue)> {
    vec![
        ("send_device", attr::value::string(send_device)),
        (
            "send_device_incarnation",
            attr::value::int(incarnation as i64),
        ),
        ("recv_device", attr::value::string(recv_device)),
        ("tensor_name", attr::value::string(tensor_name)),
        ("client_terminated", attr::value::bool(client_terminated)),
    ]
}

#[allow(clippy::too_many_arguments)]
fn send(
    name: &str,
    input: &str,
    send_device: &str,
    incarnation: u64,
    recv_device: &str,
    tensor_name: &str,
    client_terminated: bool,
) -> NodeDef {
    let mut attrs = pair_attrs(
        send_device,
        incarnation,
        recv_device,
        tensor_name,
        client_terminated,
    );
    attrs.push(("T", attr::value::dtype(DType::Float)));
    with(node(name, "_Send", send_device, &[input]), attrs)
}

fn recv(
    name: &str,
    send_device: &str,
    incarnation: u64,
    recv_device: &str,
    tensor_name: &str,
    client_terminated: bool,
) -> NodeDef {
    let mut attrs = pair_attrs(
        send_device,
        incarnation,
        recv_device,
        tensor_name,
        client_terminated,
    );
    attrs.push(("tensor_type", attr::value::dtype(DType::Float)));
    with(node(name, "_Recv", recv_device, &[]), attrs)
}

/// A rendezvous key in TensorFlow's layout, written out by hand.
fn key(send_device: &str, incarnation: u64, recv_device: &str, tensor_name: &str) -> String {
    format!("{send_device};{incarnation:016x};{recv_device};{tensor_name};0:0")
}

fn floats(values: &[f32]) -> Tensor {
    Tensor::from_vec(vec![values.len()], values.to_vec()).unwrap()
}

fn register(worker: &WorkerState, session: &str, nodes: Vec<NodeDef>) -> tessera::Result<String> {
    worker
        .register_graph(&RegisterGraphRequest {
            session_handle: session.into(),
            create_worker_session_called: !session.is_empty(),
            graph_def: Some(GraphDef {
                node: nodes,
                ..Default::default()
            }),
            ..Default::default()
        })
        .map(|r| r.graph_handle)
}

fn run_request(session: &str, graph: &str, step_id: i64) -> RunGraphRequest {
    RunGraphRequest {
        session_handle: session.into(),
        create_worker_session_called: !session.is_empty(),
        graph_handle: graph.into(),
        step_id,
        ..Default::default()
    }
}

fn values(proto: &NamedTensorProto) -> Vec<f32> {
    Tensor::from_named_proto(proto)
        .unwrap()
        .1
        .values::<f32>()
        .unwrap()
        .to_vec()
}

/// x (fed, on CPU:0) * b (CPU:1) and a (CPU:0) + b (CPU:1) on CPU:1, both fetched: every
/// cross-device edge goes through a local pair the worker inserts itself.
fn two_device_graph() -> Vec<NodeDef> {
    vec![
        recv("x", CLIENT, INC0, CPU0, "x:0", true),
        constant("a", CPU0, floats(&[1.0, 2.0])),
        constant("b", CPU1, floats(&[10.0, 20.0])),
        binary("prod", "Mul", CPU0, "x", "b"),
        binary("sum", "AddV2", CPU1, "a", "b"),
        send("send_prod", "prod", CPU0, INC0, CLIENT, "prod:0", true),
        send("send_sum", "sum", CPU1, INC1, CLIENT, "sum:0", true),
    ]
}

#[tokio::test]
async fn register_then_run_splits_by_device_and_answers_fetches() {
    let worker = worker();
    worker
        .create_worker_session(&CreateWorkerSessionRequest {
            session_handle: "s1".into(),
            master_task: "/job:worker/replica:0/task:0".into(),
            master_incarnation: 5,
            ..Default::default()
        })
        .unwrap();
    let handle = register(&worker, "s1", two_device_graph()).unwrap();
    assert_eq!(worker.graph_count("s1"), Some(1));

    let mut request = run_request("s1", &handle, 77);
    request.send = vec![floats(&[3.0, 4.0]).to_named_proto(key(CLIENT, INC0, CPU0, "x:0"))];
    request.recv_key = vec![
        key(CPU0, INC0, CLIENT, "prod:0"),
        key(CPU1, INC1, CLIENT, "sum:0"),
    ];
    let response = worker.run_graph(request).await.unwrap();
    assert_eq!(response.status_code, 0, "{}", response.status_error_message);
    assert_eq!(response.recv.len(), 2);
    assert_eq!(response.recv[0].name, key(CPU0, INC0, CLIENT, "prod:0"));
    // [3, 4] * [10, 20] and [1, 2] + [10, 20].
    assert_eq!(values(&response.recv[0]), [30.0, 80.0]);
    assert_eq!(values(&response.recv[1]), [11.0, 22.0]);

    // The graph runs again for a new step with new feeds.
    let mut request = run_request("s1", &handle, 78);
    request.send = vec![floats(&[-1.0, 0.5]).to_named_proto(key(CLIENT, INC0, CPU0, "x:0"))];
    request.recv_key = vec![key(CPU0, INC0, CLIENT, "prod:0")];
    let response = worker.run_graph(request).await.unwrap();
    assert_eq!(values(&response.recv[0]), [-10.0, 10.0]);
}

#[tokio::test]
async fn recv_tensor_may_come_before_its_run_graph() {
    let worker = worker();
    let edge = "edge_4_w";
    let handle = register(
        &worker,
        "",
        vec![
            constant("w", CPU1, floats(&[1.5, -2.5])),
            send("w_S0", "w", CPU1, INC1, PS0, edge, false),
        ],
    )
    .unwrap();
    let pending = {
        let worker = worker.clone();
        tokio::spawn(async move {
            worker
                .recv_tensor(
                    RecvTensorRequest {
                        step_id: 9,
                        rendezvous_key: key(CPU1, INC1, PS0, edge),
                        ..Default::default()
                    },
                    Some(Duration::from_secs(30)),
                )
                .await
        })
    };
    // Wait until the receive is registered, so it really comes first.
    while worker
        .rendezvous()
        .find(9)
        .is_none_or(|r| r.pending_receivers() == 0)
    {
        tokio::task::yield_now().await;
    }
    worker.run_graph(run_request("", &handle, 9)).await.unwrap();
    let response: RecvTensorResponse = pending.await.unwrap().unwrap();
    let tensor = response.tensor.unwrap();
    assert!(!response.is_dead);
    assert!(response.send_start_micros > 0);
    assert_eq!(tensor.dtype, DType::Float.to_proto() as i32);
    // Little-endian f32 in tensor_content: 1.5 = 0x3fc00000, -2.5 = 0xc0200000.
    assert_eq!(
        tensor.tensor_content.as_ref(),
        [0, 0, 0xc0, 0x3f, 0, 0, 0x20, 0xc0]
    );
}

#[tokio::test]
async fn recv_tensor_with_a_wrong_incarnation_is_aborted() {
    let worker = worker();
    let err = worker
        .recv_tensor(
            RecvTensorRequest {
                step_id: 1,
                rendezvous_key: key(CPU0, 0xdead, PS0, "edge_1_a"),
                ..Default::default()
            },
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    assert!(
        err.message()
            .starts_with("RecvTensor expects a different device incarnation"),
        "{err}"
    );
    // A device that is not on this task is the caller's mistake.
    let err = worker
        .recv_tensor(
            RecvTensorRequest {
                step_id: 1,
                rendezvous_key: key(PS0, 1, CPU0, "edge_1_a"),
                ..Default::default()
            },
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn a_recv_that_never_comes_meets_its_deadline_naming_the_key() {
    let worker = worker();
    let started = Instant::now();
    let err = worker
        .recv_tensor(
            RecvTensorRequest {
                step_id: 3,
                rendezvous_key: key(CPU0, INC0, PS0, "edge_7_never"),
                ..Default::default()
            },
            Some(Duration::from_millis(50)),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);
    assert!(err.message().contains("edge_7_never"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn an_error_on_one_device_fails_the_others_receives_with_the_root_cause() {
    let worker = worker();
    // CPU:0 reshapes 2 elements into 3 (fails); CPU:1 waits for its result through a local pair.
    let shape = Tensor::from_vec(vec![1], vec![3i32]).unwrap();
    let handle = register(
        &worker,
        "",
        vec![
            constant("a", CPU0, floats(&[1.0, 2.0])),
            constant("shape", CPU0, shape),
            with(
                node("bad", "Reshape", CPU0, &["a", "shape"]),
                vec![
                    ("T", attr::value::dtype(DType::Float)),
                    ("Tshape", attr::value::dtype(DType::Int32)),
                ],
            ),
            with(
                node("use", "Identity", CPU1, &["bad"]),
                vec![("T", attr::value::dtype(DType::Float))],
            ),
        ],
    )
    .unwrap();
    let started = Instant::now();
    let mut request = run_request("", &handle, 11);
    request.store_errors_in_response_body = true;
    let response: RunGraphResponse = worker.run_graph(request).await.unwrap();
    assert_eq!(response.status_code, Code::InvalidArgument as i32);
    assert!(
        response.status_error_message.contains("`bad`"),
        "{}",
        response.status_error_message
    );
    // The step deadline is 30 s: the CPU:1 receive was cut short by the abort, not the clock.
    assert!(started.elapsed() < Duration::from_secs(10));
    let aborted = worker.rendezvous().find(11).unwrap().aborted().unwrap();
    assert_eq!(aborted.code(), Code::InvalidArgument);

    // Without store_errors_in_response_body the error is the call's.
    let err = worker
        .run_graph(run_request("", &handle, 12))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn cleanup_graph_aborts_pending_receives() {
    let worker = worker();
    let pending = {
        let worker = worker.clone();
        tokio::spawn(async move {
            worker
                .recv_tensor(
                    RecvTensorRequest {
                        step_id: 21,
                        rendezvous_key: key(CPU0, INC0, PS0, "edge_2_x"),
                        ..Default::default()
                    },
                    Some(Duration::from_secs(30)),
                )
                .await
        })
    };
    while worker
        .rendezvous()
        .find(21)
        .is_none_or(|r| r.pending_receivers() == 0)
    {
        tokio::task::yield_now().await;
    }
    worker
        .cleanup_graph(&CleanupGraphRequest { step_id: 21 })
        .unwrap();
    let err = pending.await.unwrap().unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    assert!(err.message().contains("21"), "{err}");
    assert!(worker.rendezvous().find(21).is_none());
    // Unknown steps are ignored.
    worker
        .cleanup_graph(&CleanupGraphRequest { step_id: 999 })
        .unwrap();
}

#[tokio::test]
async fn delete_worker_session_frees_its_graphs() {
    let worker = worker();
    worker
        .create_worker_session(&CreateWorkerSessionRequest {
            session_handle: "gone".into(),
            ..Default::default()
        })
        .unwrap();
    let handle = register(&worker, "gone", two_device_graph()).unwrap();
    worker
        .delete_worker_session(&DeleteWorkerSessionRequest {
            session_handle: "gone".into(),
        })
        .unwrap();
    assert_eq!(worker.graph_count("gone"), None);
    let err = worker
        .run_graph(run_request("gone", &handle, 1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    assert!(err.message().contains("gone"), "{err}");
}

#[tokio::test]
async fn deregister_graph_frees_it_and_unknown_handles_are_named() {
    let worker = worker();
    let handle = register(&worker, "", vec![constant("a", CPU0, floats(&[1.0]))]).unwrap();
    let deregister = |h: &str| {
        worker.deregister_graph(&DeregisterGraphRequest {
            graph_handle: h.into(),
            ..Default::default()
        })
    };
    deregister(&handle).unwrap();
    let err = deregister(&handle).unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    assert!(err.message().contains(&handle), "{err}");
}

#[tokio::test]
async fn bad_graphs_are_invalid_arguments_naming_the_node_and_the_worker_keeps_serving() {
    let worker = worker();
    let cases = [
        (node("mystery", "NoSuchOp", CPU0, &[]), "mystery"),
        (constant("elsewhere", PS0, floats(&[1.0])), "elsewhere"),
        (
            constant("partial", "/job:worker/task:0", floats(&[1.0])),
            "partial",
        ),
        (
            with(
                node("dangling", "Identity", CPU0, &["nobody:0"]),
                vec![("T", attr::value::dtype(DType::Float))],
            ),
            "dangling",
        ),
        (
            with(
                node("malformed", "Identity", CPU0, &["a:x"]),
                vec![("T", attr::value::dtype(DType::Float))],
            ),
            "malformed",
        ),
    ];
    for (bad, name) in cases {
        let nodes = vec![constant("a", CPU0, floats(&[1.0])), bad];
        let err = register(&worker, "", nodes).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{name}: {err}");
        assert!(err.message().contains(name), "{name}: {err}");
    }
    let err = worker
        .register_graph(&RegisterGraphRequest::default())
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    // Still serving: GetStatus and a good graph.
    assert_eq!(
        worker
            .get_status(&GetStatusRequest {})
            .unwrap()
            .device_attributes
            .len(),
        2
    );
    assert_eq!(worker.graph_count(""), Some(0));
    register(&worker, "", two_device_graph()).unwrap();
}

#[tokio::test]
async fn sessions_share_variables_unless_isolated() {
    let worker = worker();
    for (handle, isolate) in [("shared", false), ("own", true)] {
        worker
            .create_worker_session(&CreateWorkerSessionRequest {
                session_handle: handle.into(),
                isolate_session_state: isolate,
                ..Default::default()
            })
            .unwrap();
    }
    let graph = || {
        vec![
            with(
                node("v", "VarHandleOp", CPU0, &[]),
                vec![
                    ("dtype", attr::value::dtype(DType::Float)),
                    (
                        "shape",
                        attr::value::shape(&tessera::tensor::PartialShape::unknown()),
                    ),
                    ("shared_name", attr::value::string("v")),
                    ("container", attr::value::string("")),
                ],
            ),
            with(
                node("init", "AssignVariableOp", CPU0, &["v", "c"]),
                vec![("dtype", attr::value::dtype(DType::Float))],
            ),
            constant("c", CPU0, floats(&[4.0])),
        ]
    };
    let store = worker.resources_of(CPU0).unwrap();
    let own = register(&worker, "own", graph()).unwrap();
    worker.run_graph(run_request("own", &own, 1)).await.unwrap();
    assert!(
        store.lookup::<Var>("", "v").is_err(),
        "isolated session wrote the shared store"
    );
    let shared = register(&worker, "shared", graph()).unwrap();
    worker
        .run_graph(run_request("shared", &shared, 2))
        .await
        .unwrap();
    assert!(store.lookup::<Var>("", "v").is_ok());
    worker
        .cleanup_all(&CleanupAllRequest { container: vec![] })
        .unwrap();
    assert!(store.lookup::<Var>("", "v").is_err());
}

#[tokio::test]
async fn stale_steps_and_sessions_are_collected() {
    let worker = worker_with(WorkerOptions {
        step_ttl: Duration::from_secs(60),
        session_ttl: Duration::from_secs(600),
        ..Default::default()
    });
    worker
        .create_worker_session(&CreateWorkerSessionRequest {
            session_handle: "old".into(),
            ..Default::default()
        })
        .unwrap();
    drop(worker.rendezvous().find_or_create(5));
    let soon = worker.collect_stale(Instant::now() + Duration::from_secs(30));
    assert!(
        soon.steps.is_empty() && soon.sessions.is_empty(),
        "{soon:?}"
    );
    let later = worker.collect_stale(Instant::now() + Duration::from_secs(601));
    assert_eq!(later.steps, [5]);
    assert_eq!(later.sessions, ["old"]);
    // The legacy session stays.
    assert_eq!(worker.graph_count(""), Some(0));
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
        .find(|d| d.join("traffic").is_dir())
        .expect("golden traffic not found; set TESSERA_GOLDEN_DIR")
}

fn golden<M: Message + Default>(name: &str) -> M {
    let bytes = std::fs::read(golden_dir().join("traffic").join(name)).unwrap();
    M::decode(bytes.as_slice()).unwrap()
}

/// The ps of the golden `train` scenario: its CPU:0 with the incarnation in its keys.
fn golden_ps() -> WorkerState {
    WorkerState::with_options(
        TaskId::new("ps", 0),
        vec![cpu(PS0, 0xe4b9_6570_c839_4f81)],
        None,
        WorkerOptions {
            step_timeout: Duration::from_secs(30),
            recv_timeout: Duration::from_secs(30),
            ..Default::default()
        },
    )
}

#[tokio::test]
async fn golden_recv_tensor_is_answered_as_tensorflow_did() {
    let worker = golden_ps();
    let request: RecvTensorRequest = golden("0012_WorkerService_RecvTensor.req.pb");
    let expected: RecvTensorResponse = golden("0012_WorkerService_RecvTensor.resp.pb");
    // What the ps's `_Send` left: a scalar bool `true`.
    let key = ParsedKey::parse(&request.rendezvous_key).unwrap();
    worker
        .rendezvous()
        .find_or_create(request.step_id)
        .send(&key, Tensor::scalar(true), false)
        .unwrap();
    let response = worker.recv_tensor(request, None).await.unwrap();
    assert_eq!(response.tensor, expected.tensor);
    assert_eq!(response.is_dead, expected.is_dead);
    // Byte for byte, but for the send time.
    let strip = |mut r: RecvTensorResponse| {
        r.send_start_micros = 0;
        r.encode_to_vec()
    };
    assert_eq!(strip(response), strip(expected));
}

#[tokio::test]
async fn golden_session_registration_and_initialisation_step_run() {
    let worker = golden_ps();
    let create: CreateWorkerSessionRequest =
        golden("0003_WorkerService_CreateWorkerSession.req.pb");
    worker.create_worker_session(&create).unwrap();
    let register: RegisterGraphRequest = golden("0005_WorkerService_RegisterGraph.req.pb");
    let handle = worker.register_graph(&register).unwrap().graph_handle;
    let mut run: RunGraphRequest = golden("0006_WorkerService_RunGraph.req.pb");
    run.graph_handle = handle;
    let response = worker.run_graph(run).await.unwrap();
    assert_eq!(response.status_code, 0, "{}", response.status_error_message);
    // The initialisation step created and assigned the ps's variables in the shared store.
    let store = worker.resources_of(PS0).unwrap();
    for name in ["w1", "b1", "w2", "b2"] {
        let var = store.lookup::<Var>("", name).unwrap();
        assert!(
            var.value.read().unwrap().is_some(),
            "{name} is not initialised"
        );
    }
}

/// The worker with a simulated ps (`ps0:2222`) to pull from.
fn worker_and_simulated_ps() -> (WorkerState, Arc<SimulatedPeer>) {
    let spec = ClusterSpec::from_dense([("ps", vec!["ps0:2222"]), ("worker", vec!["w0:2222"])]);
    let cluster = SimulatedCluster::new(&spec);
    let worker = worker();
    let peers = Arc::new(cluster.peer_cache(&TaskId::new("worker", 0)).unwrap());
    worker.set_remote(Arc::new(RemoteFetcher::new(
        TaskId::new("worker", 0),
        peers,
        Limits::default().max_message_bytes,
    )));
    (worker, cluster.peer(&TaskId::new("ps", 0)).unwrap())
}

/// CPU:1 pulls `edge_5_w` from the ps and fetches `w + w`; CPU:0 runs `extra` (when given).
fn remote_graph(ps_incarnation: u64, extra: Vec<NodeDef>) -> Vec<NodeDef> {
    let mut nodes = vec![
        recv("w_S0", PS0, ps_incarnation, CPU1, "edge_5_w", false),
        binary("double", "AddV2", CPU1, "w_S0", "w_S0"),
        send(
            "send_double",
            "double",
            CPU1,
            INC1,
            CLIENT,
            "double:0",
            true,
        ),
    ];
    nodes.extend(extra);
    nodes
}

#[tokio::test]
async fn a_cross_task_recv_pulls_through_the_peer() {
    let (worker, ps) = worker_and_simulated_ps();
    ps.reply::<RecvTensorRequest>(Ok(RecvTensorResponse {
        tensor: Some(floats(&[0.25, -4.0]).to_proto_content()),
        ..Default::default()
    }));
    let handle = register(&worker, "", remote_graph(ps.incarnation(), vec![])).unwrap();
    let mut request = run_request("", &handle, 31);
    request.recv_key = vec![key(CPU1, INC1, CLIENT, "double:0")];
    let response = worker.run_graph(request).await.unwrap();
    // [0.25, -4] + [0.25, -4].
    assert_eq!(values(&response.recv[0]), [0.5, -8.0]);
    let asked = ps.requests::<RecvTensorRequest>();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].step_id, 31);
    assert_eq!(
        asked[0].rendezvous_key,
        key(PS0, ps.incarnation(), CPU1, "edge_5_w")
    );
}

#[tokio::test]
async fn a_restarted_producer_task_fails_the_step_with_aborted() {
    let (worker, ps) = worker_and_simulated_ps();
    let old = ps.incarnation();
    let handle = register(&worker, "", remote_graph(old, vec![])).unwrap();
    ps.restart();
    let err = worker
        .run_graph(run_request("", &handle, 32))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    assert!(err.message().contains("incarnation"), "{err}");
}

#[tokio::test]
async fn a_local_error_stops_a_pending_remote_recv_with_the_root_cause() {
    let (worker, ps) = worker_and_simulated_ps();
    // The ps never answers; only the abort can end CPU:1's wait before the 30 s deadline.
    ps.set_dropping(true);
    let shape = Tensor::from_vec(vec![1], vec![3i32]).unwrap();
    let failing = vec![
        constant("a", CPU0, floats(&[1.0, 2.0])),
        constant("shape", CPU0, shape),
        with(
            node("bad", "Reshape", CPU0, &["a", "shape"]),
            vec![
                ("T", attr::value::dtype(DType::Float)),
                ("Tshape", attr::value::dtype(DType::Int32)),
            ],
        ),
    ];
    let handle = register(&worker, "", remote_graph(ps.incarnation(), failing)).unwrap();
    let started = Instant::now();
    let err = worker
        .run_graph(run_request("", &handle, 33))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("`bad`"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn a_step_whose_feed_never_comes_ends_at_the_callers_deadline() {
    let worker = worker();
    let handle = register(&worker, "", two_device_graph()).unwrap();
    let started = Instant::now();
    // No `send` for x: CPU:0's `_Recv` waits; the caller gives the step 100 ms of its 30 s.
    let err = worker
        .run_graph_within(
            run_request("", &handle, 41),
            Some(Duration::from_millis(100)),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
}
