//! Each `[limits]` key refuses what goes over it with RESOURCE_EXHAUSTED naming the key, its
//! value and the request's size, and the task keeps serving: after every refusal a request
//! within the limits succeeds on the same server.
//!
//! Every test starts its own one-task server (`/job:localhost/task:0` on 127.0.0.1:0) with
//! small limits and talks TensorFlow's MasterService to it.

use std::time::{Duration, Instant};

use prost::Message;
use tessera::cluster::TaskId;
use tessera::cluster::{Limits, TaskConfig};
use tessera::graph::attr::value;
use tessera::graph::builder::Graph;
use tessera::proto::master_service_client::MasterServiceClient;
use tessera::proto::*;
use tessera::server::Server;
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::worker::{WorkerOptions, WorkerState};
use tessera::Code;
use tonic::transport::Channel;

/// Deadline of one RPC.
const RPC_DEADLINE: Duration = Duration::from_secs(20);

/// The limits of every test; each test relies on one of them.
fn limits() -> Limits {
    Limits {
        max_message_bytes: 64 << 10,
        max_graph_nodes: 20,
        max_graph_bytes: 4096,
        max_sessions: 2,
        max_steps_in_flight: 1,
        max_shard_bytes: 64,
        max_request_tensor_bytes: 1 << 20,
    }
}

/// A float tensor of `elements` elements described by one broadcast value: about 30 bytes on
/// the wire, `4 * elements` in memory.
fn broadcast_floats(elements: i64) -> TensorProto {
    TensorProto {
        dtype: DataType::DtFloat as i32,
        tensor_shape: Some(TensorShapeProto {
            dim: vec![tensor_shape_proto::Dim {
                size: elements,
                name: String::new(),
            }],
            unknown_rank: false,
        }),
        float_val: vec![1.0],
        ..Default::default()
    }
}

/// A channel to `server`, each call within [`RPC_DEADLINE`].
async fn channel(server: &Server) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{}", server.local_addr()))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(RPC_DEADLINE)
        .connect()
        .await
        .unwrap()
}

async fn start() -> (Server, MasterServiceClient<Channel>) {
    let server = tokio::task::spawn_blocking(|| {
        Server::start(TaskConfig {
            limits: limits(),
            ..TaskConfig::local()
        })
    })
    .await
    .unwrap()
    .unwrap();
    let channel = channel(&server).await;
    (server, MasterServiceClient::new(channel))
}

async fn stop(server: Server) {
    tokio::task::spawn_blocking(move || server.stop())
        .await
        .unwrap();
}

/// `y = x + 1` over a fed float vector: three nodes.
fn small_graph() -> GraphDef {
    let mut g = Graph::new();
    let x = g
        .placeholder("x", DType::Float, PartialShape::unknown())
        .unwrap();
    let one = g.constant(&Tensor::scalar(1.0f32)).unwrap();
    let y = g.add(&x, &one).unwrap();
    let mut def = g.to_graph_def();
    for node in &mut def.node {
        if node.name == y.node {
            node.name = "y".into();
        }
    }
    def
}

async fn create(
    master: &mut MasterServiceClient<Channel>,
    graph: GraphDef,
) -> Result<String, tonic::Status> {
    master
        .create_session(CreateSessionRequest {
            graph_def: Some(graph),
            config: Some(ConfigProto::default()),
            target: String::new(),
        })
        .await
        .map(|r| r.into_inner().session_handle)
}

fn add_one_step(handle: &str, x: Vec<f32>) -> RunStepRequest {
    let n = x.len();
    RunStepRequest {
        session_handle: handle.to_owned(),
        feed: vec![Tensor::from_vec(vec![n], x).unwrap().to_named_proto("x:0")],
        fetch: vec!["y:0".into()],
        ..Default::default()
    }
}

/// Runs `y = x + 1` on `[1, 2]` and checks `[2, 3]` comes back: the task still serves.
async fn still_serves(master: &mut MasterServiceClient<Channel>, handle: &str) {
    let reply = master
        .run_step(add_one_step(handle, vec![1.0, 2.0]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status_code, 0, "{}", reply.status_error_message);
    let y = Tensor::from_proto(reply.tensor[0].tensor.as_ref().unwrap()).unwrap();
    assert_eq!(y.values::<f32>().unwrap().as_ref(), &[2.0, 3.0]);
}

fn assert_exhausted(status: &tonic::Status, expected: &[&str]) {
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}");
    for part in expected {
        assert!(
            status.message().contains(part),
            "`{part}` not in: {}",
            status.message()
        );
    }
}

#[tokio::test]
async fn a_graph_with_too_many_nodes_is_refused() {
    let (server, mut master) = start().await;
    let mut g = Graph::new();
    for i in 0..25 {
        g.constant(&Tensor::scalar(i as f32)).unwrap();
    }
    let err = create(&mut master, g.to_graph_def()).await.unwrap_err();
    assert_exhausted(
        &err,
        &[
            "CreateSession: the graph has 25 nodes",
            "limits.max_graph_nodes = 20",
        ],
    );
    let handle = create(&mut master, small_graph()).await.unwrap();
    still_serves(&mut master, &handle).await;
    stop(server).await;
}

#[tokio::test]
async fn a_graph_of_too_many_bytes_is_refused() {
    let (server, mut master) = start().await;
    let mut g = Graph::new();
    // One constant of 2048 floats: 8192 bytes of tensor content alone, over 4096.
    g.constant(&Tensor::from_vec(vec![2048], vec![0.5f32; 2048]).unwrap())
        .unwrap();
    let graph = g.to_graph_def();
    let size = graph.encoded_len();
    assert!(size > 8192);
    let err = create(&mut master, graph).await.unwrap_err();
    assert_exhausted(
        &err,
        &[
            &format!("CreateSession: the graph is {size} bytes"),
            "limits.max_graph_bytes = 4096",
        ],
    );
    let handle = create(&mut master, small_graph()).await.unwrap();
    still_serves(&mut master, &handle).await;
    stop(server).await;
}

#[tokio::test]
async fn a_message_over_the_size_limit_is_refused_with_its_size() {
    let (server, mut master) = start().await;
    let handle = create(&mut master, small_graph()).await.unwrap();
    // 20 000 floats: 80 000 bytes of feed, over 65 536.
    let request = add_one_step(&handle, vec![0.25; 20_000]);
    let size = request.encoded_len();
    let err = master.run_step(request).await.unwrap_err();
    assert_exhausted(
        &err,
        &[
            &format!("the request is {size} bytes"),
            "limits.max_message_bytes = 65536",
        ],
    );
    still_serves(&mut master, &handle).await;
    stop(server).await;
}

#[tokio::test]
async fn feeds_expanding_past_the_request_budget_are_refused_before_decoding() {
    let (server, mut master) = start().await;
    let handle = create(&mut master, small_graph()).await.unwrap();
    // Three feeds of 512 KiB each, described in a few bytes: 1.5 MiB, over 1 MiB. (A 2 GiB
    // broadcast per feed is what a hostile client sends; the storm test does.)
    for feeds in [3usize, 1] {
        let feed = (0..feeds)
            .map(|_| NamedTensorProto {
                name: "x:0".into(),
                tensor: Some(broadcast_floats(if feeds == 1 { 1 << 29 } else { 1 << 17 })),
            })
            .collect();
        let request = RunStepRequest {
            session_handle: handle.clone(),
            feed,
            fetch: vec!["y:0".into()],
            ..Default::default()
        };
        assert!(request.encoded_len() < 200);
        let err = master.run_step(request).await.unwrap_err();
        assert_exhausted(
            &err,
            &[
                "RunStep: the feeds",
                "limits.max_request_tensor_bytes = 1048576",
            ],
        );
    }
    still_serves(&mut master, &handle).await;
    stop(server).await;
}

#[tokio::test]
async fn graph_constants_and_peer_tensors_past_the_request_budget_are_refused() {
    let (server, mut master) = start().await;
    let mut g = Graph::new();
    g.add_op(
        tessera::graph::builder::NodeSpec::new("Const")
            .name("huge")
            .attr("dtype", tessera::graph::attr::value::dtype(DType::Float))
            .attr(
                "value",
                tessera::graph::attr::value::tensor(broadcast_floats(1 << 30)),
            ),
    )
    .unwrap();
    let err = create(&mut master, g.to_graph_def()).await.unwrap_err();
    assert_exhausted(
        &err,
        &[
            "CreateSession: the graph: its constants",
            "limits.max_request_tensor_bytes",
        ],
    );
    let channel = channel(&server).await;
    let mut worker = tessera::proto::worker_service_client::WorkerServiceClient::new(channel);
    let err = worker
        .register_graph(RegisterGraphRequest {
            graph_def: Some(g.to_graph_def()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_exhausted(&err, &["RegisterGraph: the graph: its constants"]);
    let err = worker
        .run_graph(RunGraphRequest {
            graph_handle: "any".into(),
            send: vec![NamedTensorProto {
                name: "x".into(),
                tensor: Some(broadcast_floats(1 << 30)),
            }],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_exhausted(
        &err,
        &[
            "RunGraph: the tensors sent",
            "limits.max_request_tensor_bytes",
        ],
    );
    let handle = create(&mut master, small_graph()).await.unwrap();
    still_serves(&mut master, &handle).await;
    stop(server).await;
}

#[tokio::test]
async fn sessions_over_the_limit_are_refused_until_one_closes() {
    let (server, mut master) = start().await;
    let first = create(&mut master, small_graph()).await.unwrap();
    let _second = create(&mut master, small_graph()).await.unwrap();
    let err = create(&mut master, small_graph()).await.unwrap_err();
    assert_exhausted(
        &err,
        &["already holds 2 sessions", "limits.max_sessions = 2"],
    );
    master
        .close_session(CloseSessionRequest {
            session_handle: first,
        })
        .await
        .unwrap();
    let third = create(&mut master, small_graph()).await.unwrap();
    still_serves(&mut master, &third).await;
    stop(server).await;
}

#[tokio::test]
async fn a_step_over_the_in_flight_limit_is_refused_while_another_runs() {
    let (server, mut master) = start().await;
    // Session A: `y = x + 1`, plus a dequeue from an empty queue that blocks its step.
    let mut g = Graph::new();
    let x = g
        .placeholder("x", DType::Float, PartialShape::unknown())
        .unwrap();
    let one = g.constant(&Tensor::scalar(1.0f32)).unwrap();
    let y = g.add(&x, &one).unwrap();
    let queue = g
        .fifo_queue(
            "q",
            &[DType::Float],
            &[PartialShape::unknown()],
            None,
            "",
            None,
        )
        .unwrap();
    let blocked = g.queue_dequeue("take", &queue, &[DType::Float]).unwrap();
    let mut def = g.to_graph_def();
    for node in &mut def.node {
        if node.name == y.node {
            node.name = "y".into();
        }
    }
    let handle = create(&mut master, def).await.unwrap();

    // The blocking step gives up after its own timeout, 3 s after it starts.
    let blocking = RunStepRequest {
        session_handle: handle.clone(),
        fetch: vec![blocked[0].name()],
        options: Some(RunOptions {
            timeout_in_ms: 3000,
            ..Default::default()
        }),
        ..Default::default()
    };
    let spawn_blocker = |mut client: MasterServiceClient<Channel>, request: RunStepRequest| {
        tokio::spawn(async move { client.run_step(request).await })
    };
    let mut blocked_step = spawn_blocker(master.clone(), blocking.clone());

    // Until the blocking step is admitted, a quick step still runs (and may itself keep the
    // blocking one out: then it is sent again); once it is in, the quick one is refused.
    // Polled under a deadline.
    let deadline = Instant::now() + Duration::from_secs(20);
    let refusal = loop {
        assert!(
            Instant::now() < deadline,
            "no step was refused while another ran"
        );
        match master.run_step(add_one_step(&handle, vec![1.0])).await {
            Err(e) => break e,
            Ok(_) if blocked_step.is_finished() => {
                let lost = blocked_step.await.unwrap().unwrap_err();
                assert_eq!(lost.code(), tonic::Code::ResourceExhausted, "{lost}");
                blocked_step = spawn_blocker(master.clone(), blocking.clone());
            }
            Ok(_) => tokio::task::yield_now().await,
        }
    };
    assert_exhausted(
        &refusal,
        &[
            &format!("session {handle} already runs 1 step(s)"),
            "limits.max_steps_in_flight = 1",
        ],
    );
    // The blocked step ends by its deadline, not stuck; then the session runs steps again.
    let ended = tokio::time::timeout(Duration::from_secs(10), blocked_step)
        .await
        .expect("the blocked step ends by its own timeout")
        .unwrap();
    assert_eq!(
        ended.unwrap_err().code(),
        tonic::Code::DeadlineExceeded,
        "the blocked step should time out"
    );
    still_serves(&mut master, &handle).await;
    stop(server).await;
}

/// A local task whose CPU device may hold `bytes`, and a master client of it.
async fn start_with_cpu_budget(bytes: u64) -> (Server, MasterServiceClient<Channel>) {
    let mut config = TaskConfig::local();
    config.devices.cpu_memory_limit = Some(bytes);
    let server = tokio::task::spawn_blocking(|| Server::start(config))
        .await
        .unwrap()
        .unwrap();
    let master = MasterServiceClient::new(channel(&server).await);
    (server, master)
}

#[tokio::test]
async fn kernels_and_variables_past_the_cpu_memory_budget_are_refused_and_the_task_serves_on() {
    let (server, mut master) = start_with_cpu_budget(1 << 20).await;
    // `huge`: Fill of 2^30 floats (4 GiB) from a fed shape, over the 1 MiB budget; `first`: a
    // variable of a fed 600 KB value, and `second` a copy of it: one fits, two do not.
    let mut g = Graph::new();
    let dims = g
        .placeholder("dims", DType::Int32, PartialShape::unknown())
        .unwrap();
    let one = g.constant(&Tensor::scalar(1.0f32)).unwrap();
    g.add_op(
        tessera::graph::builder::NodeSpec::new("Fill")
            .name("huge")
            .input(&dims)
            .input(&one),
    )
    .unwrap();
    let init = g
        .placeholder("init", DType::Float, PartialShape::unknown())
        .unwrap();
    let first = g.variable("first", &init).unwrap();
    let copy = g.read(&first).unwrap();
    let second = g.variable("second", &copy).unwrap();
    let def = g.to_graph_def();
    let handle = create(&mut master, small_graph()).await.unwrap();
    let graph_handle = create(&mut master, def).await.unwrap();
    let err = master
        .run_step(RunStepRequest {
            session_handle: graph_handle.clone(),
            feed: vec![Tensor::from_vec(vec![1], vec![1i32 << 30])
                .unwrap()
                .to_named_proto("dims:0")],
            fetch: vec!["huge:0".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_exhausted(
        &err,
        &[
            "`huge` (op Fill)",
            "4294967296 bytes",
            "devices.cpu_memory_limit is 1048576 bytes",
        ],
    );
    let init_step = |target: &str| RunStepRequest {
        session_handle: graph_handle.clone(),
        feed: vec![Tensor::from_vec(vec![150_000], vec![0.5f32; 150_000])
            .unwrap()
            .to_named_proto("init:0")],
        target: vec![target.to_owned()],
        ..Default::default()
    };
    master
        .run_step(init_step(&first.initializer))
        .await
        .unwrap();
    let err = master
        .run_step(init_step(&second.initializer))
        .await
        .unwrap_err();
    assert_exhausted(
        &err,
        &[
            "variable `second`: a value of 600000 bytes",
            "over devices.cpu_memory_limit = 1048576 bytes",
        ],
    );
    // A small Fill runs on the same session, and another session's step too.
    let small = master
        .run_step(RunStepRequest {
            session_handle: graph_handle,
            feed: vec![Tensor::from_vec(vec![1], vec![4i32])
                .unwrap()
                .to_named_proto("dims:0")],
            fetch: vec!["huge:0".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let filled = Tensor::from_proto(small.tensor[0].tensor.as_ref().unwrap()).unwrap();
    assert_eq!(filled.values::<f32>().unwrap().as_ref(), &[1.0; 4]);
    still_serves(&mut master, &handle).await;
    stop(server).await;
}

#[tokio::test]
async fn a_kernels_scratch_is_charged_as_it_is_allocated_and_past_the_budget_is_refused() {
    // A 4 MiB budget. The filter gradient of a 3x3 convolution over a fed [1, 64, 64, 64]
    // image (1 MiB) has a small output ([3, 3, 64, 1], 2304 bytes), but its patch matrix is
    // 9.4 MB of scratch: the allocator charges it as the kernel makes it, and the step is
    // refused naming the node and its inputs' shapes. A 16x16 image's patches (590 KB) fit.
    let (server, mut master) = start_with_cpu_budget(4 << 20).await;
    let mut g = Graph::new();
    let x = g
        .placeholder("x", DType::Float, PartialShape::unknown())
        .unwrap();
    let dy = g
        .placeholder("dy", DType::Float, PartialShape::unknown())
        .unwrap();
    let sizes = g
        .constant(&Tensor::from_vec(vec![4], vec![3i32, 3, 64, 1]).unwrap())
        .unwrap();
    g.add_op(
        tessera::graph::builder::NodeSpec::new("Conv2DBackpropFilter")
            .name("dw")
            .input(&x)
            .input(&sizes)
            .input(&dy)
            .attr("strides", value::int_list(vec![1, 1, 1, 1]))
            .attr("padding", value::string("SAME")),
    )
    .unwrap();
    let handle = create(&mut master, g.to_graph_def()).await.unwrap();
    let step = |side: usize| RunStepRequest {
        session_handle: handle.clone(),
        feed: vec![
            Tensor::from_vec(vec![1, side, side, 64], vec![0.5f32; side * side * 64])
                .unwrap()
                .to_named_proto("x:0"),
            Tensor::from_vec(vec![1, side, side, 1], vec![0.25f32; side * side])
                .unwrap()
                .to_named_proto("dy:0"),
        ],
        fetch: vec!["dw:0".into()],
        ..Default::default()
    };
    let err = master.run_step(step(64)).await.unwrap_err();
    assert_exhausted(
        &err,
        &[
            "for node `dw` (op Conv2DBackpropFilter, inputs of shapes [[1,64,64,64], [4], \
             [1,64,64,1]]) while it ran",
            "devices.cpu_memory_limit is 4194304 bytes",
        ],
    );
    let reply = master.run_step(step(16)).await.unwrap().into_inner();
    let dw = Tensor::from_proto(reply.tensor[0].tensor.as_ref().unwrap()).unwrap();
    assert_eq!(dw.dims(), &[3, 3, 64, 1]);
    // The middle tap sees every pixel: 256 x 0.5 x 0.25.
    assert_eq!(dw.values::<f32>().unwrap()[4 * 64], 32.0);
    let small = create(&mut master, small_graph()).await.unwrap();
    still_serves(&mut master, &small).await;
    stop(server).await;
}

#[tokio::test]
async fn outputs_that_would_dwarf_their_inputs_are_refused_before_they_are_allocated() {
    // A 2 MiB budget; each input fits (a fed [100, 1000] float tensor, 400 KB, its transpose
    // and the transpose's scratch), but a Concat of 100 of them (40 MB), a Tile by a fed
    // multiple and a product of two fed matrices (4 MB) do not. Each step is refused naming
    // the node and its shape, and the task serves on.
    let (server, mut master) = start_with_cpu_budget(2 << 20).await;
    let mut g = Graph::new();
    let x = g
        .placeholder("x", DType::Float, PartialShape::unknown())
        .unwrap();
    let parts = vec![x.clone(); 100];
    g.concat(&parts, 0).unwrap();
    let multiples = g
        .placeholder("multiples", DType::Int32, PartialShape::unknown())
        .unwrap();
    g.tile(&x, &multiples).unwrap();
    let xt = g.transpose(&x, &[1, 0]).unwrap();
    g.matmul(&xt, &x).unwrap();
    let def = g.to_graph_def();
    let names: Vec<(String, String)> = def
        .node
        .iter()
        .filter(|n| matches!(n.op.as_str(), "ConcatV2" | "Tile" | "MatMul"))
        .map(|n| (n.op.clone(), n.name.clone()))
        .collect();
    let handle = create(&mut master, def).await.unwrap();
    let x_value = Tensor::from_vec(vec![100, 1000], vec![0.5f32; 100_000]).unwrap();
    let step = |fetch: &str| RunStepRequest {
        session_handle: handle.clone(),
        feed: vec![
            x_value.to_named_proto("x:0"),
            Tensor::from_vec(vec![2], vec![100i32, 1])
                .unwrap()
                .to_named_proto("multiples:0"),
        ],
        fetch: vec![format!("{fetch}:0")],
        ..Default::default()
    };
    for (op, name) in &names {
        let shape = match op.as_str() {
            "ConcatV2" | "Tile" => "[10000,1000]",
            _ => "[1000,1000]",
        };
        let err = master.run_step(step(name)).await.unwrap_err();
        assert_exhausted(
            &err,
            &[
                &format!("`{name}` (op {op})"),
                &format!("output shape {shape}"),
            ],
        );
    }
    // The same session runs a step that fits.
    let fine = master
        .run_step(RunStepRequest {
            fetch: vec!["x:0".into()],
            ..step("x")
        })
        .await
        .unwrap();
    assert_eq!(fine.into_inner().tensor.len(), 1);
    stop(server).await;
}

#[tokio::test]
async fn a_variable_over_the_shard_limit_is_refused() {
    let (server, mut master) = start().await;
    let mut g = Graph::new();
    // 32 floats (128 bytes) do not fit in 64; 8 floats (32 bytes) do.
    let big_init = g
        .constant(&Tensor::from_vec(vec![32], vec![1.0f32; 32]).unwrap())
        .unwrap();
    let big = g.variable("big", &big_init).unwrap();
    let small_init = g
        .constant(&Tensor::from_vec(vec![8], vec![1.0f32; 8]).unwrap())
        .unwrap();
    let small = g.variable("small", &small_init).unwrap();
    let handle = create(&mut master, g.to_graph_def()).await.unwrap();
    let run = |target: String| RunStepRequest {
        session_handle: handle.clone(),
        target: vec![target],
        ..Default::default()
    };
    let err = master
        .run_step(run(big.initializer.clone()))
        .await
        .unwrap_err();
    assert_exhausted(
        &err,
        &[
            "variable `big`: a value of 128 bytes would make the variable store hold 128 bytes",
            "limits.max_shard_bytes = 64",
        ],
    );
    // The task keeps serving: the small variable fits and initializes, then reads back (a
    // step of its own: a read in the initializing step is not ordered after the assignment).
    master
        .run_step(run(small.initializer.clone()))
        .await
        .unwrap();
    let reply = master
        .run_step(RunStepRequest {
            session_handle: handle.clone(),
            fetch: vec![small.value.name()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status_code, 0, "{}", reply.status_error_message);
    let value = Tensor::from_proto(reply.tensor[0].tensor.as_ref().unwrap()).unwrap();
    assert_eq!(value.values::<f32>().unwrap().as_ref(), &[1.0f32; 8]);
    stop(server).await;
}

const CLUSTER: &str =
    "[cluster]\nworker = [\"127.0.0.1:0\"]\n[task]\njob = \"worker\"\nindex = 0\n";

#[test]
fn limits_and_metrics_come_from_the_file_and_the_environment() {
    let text = format!(
        "{CLUSTER}[metrics]\nlisten = \"127.0.0.1:0\"\n[limits]\nmax_sessions = 3\n\
         max_shard_bytes = 1048576\nmax_request_tensor_bytes = 2048\n"
    );
    let env = [(
        "TESSERA__LIMITS__MAX_STEPS_IN_FLIGHT".to_owned(),
        "7".to_owned(),
    )];
    let config = TaskConfig::from_toml_with_env(&text, "t.toml", env).unwrap();
    assert_eq!(config.metrics.listen, Some("127.0.0.1:0".parse().unwrap()));
    assert_eq!(
        config.limits,
        Limits {
            max_sessions: 3,
            max_shard_bytes: 1 << 20,
            max_steps_in_flight: 7,
            max_request_tensor_bytes: 2048,
            ..Limits::default()
        }
    );
    // Without the sections: metrics off, default limits.
    let plain = TaskConfig::from_toml_with_env(CLUSTER, "t.toml", Vec::new()).unwrap();
    assert_eq!(plain.metrics.listen, None);
    assert_eq!(plain.limits, Limits::default());
}

#[test]
fn bad_limits_are_refused_naming_the_key() {
    let cases = [
        (
            "[limits]\nmax_sessions = 0\n",
            "t.toml: limits.max_sessions: 0 is not positive; set limits.max_sessions to 1 or \
             more, or remove it for the default 1024",
        ),
        (
            "[limits]\nmax_graph_nodes = \"many\"\n",
            "t.toml: limits.max_graph_nodes: expected an integer, found string \"many\"; set \
             limits.max_graph_nodes to an integer",
        ),
        (
            "[limits]\nmax_memory = 5\n",
            "t.toml: limits.max_memory: unknown key; the keys allowed in [limits] are \
             max_message_bytes, max_graph_nodes, max_graph_bytes, max_sessions, \
             max_steps_in_flight, max_shard_bytes, max_request_tensor_bytes",
        ),
    ];
    for (section, message) in cases {
        let text = format!("{CLUSTER}{section}");
        let err = TaskConfig::from_toml_with_env(&text, "t.toml", Vec::new()).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert_eq!(err.to_string(), message);
    }
}

#[test]
fn worker_sessions_over_the_limit_are_refused() {
    let worker = WorkerState::with_options(
        TaskId::new("worker", 0),
        vec![DeviceAttributes {
            name: "/job:worker/replica:0/task:0/device:CPU:0".into(),
            device_type: "CPU".into(),
            incarnation: 1,
            ..Default::default()
        }],
        None,
        WorkerOptions {
            max_sessions: 1,
            ..Default::default()
        },
    );
    let create = |handle: &str| CreateWorkerSessionRequest {
        session_handle: handle.into(),
        master_task: "/job:chief/replica:0/task:0".into(),
        master_incarnation: 7,
        ..Default::default()
    };
    worker.create_worker_session(&create("a")).unwrap();
    let err = worker.create_worker_session(&create("b")).unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(
        err.message().starts_with(
            "CreateWorkerSession: /job:worker/replica:0/task:0 already holds 1 worker sessions, \
             over limits.max_sessions = 1"
        ),
        "{err}"
    );
    worker
        .delete_worker_session(&DeleteWorkerSessionRequest {
            session_handle: "a".into(),
        })
        .unwrap();
    worker.create_worker_session(&create("b")).unwrap();
    // A restarted master's new session replaces its old ones: not refused.
    let restarted = CreateWorkerSessionRequest {
        master_incarnation: 8,
        ..create("c")
    };
    worker.create_worker_session(&restarted).unwrap();
}

#[tokio::test]
async fn a_peer_registering_a_graph_over_the_node_limit_is_refused() {
    let (server, _master) = start().await;
    let channel = channel(&server).await;
    let mut worker = tessera::proto::worker_service_client::WorkerServiceClient::new(channel);
    let mut g = Graph::new();
    for i in 0..21 {
        g.constant(&Tensor::scalar(i as f32)).unwrap();
    }
    let err = worker
        .register_graph(RegisterGraphRequest {
            graph_def: Some(g.to_graph_def()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_exhausted(
        &err,
        &[
            "RegisterGraph: the graph has 21 nodes",
            "limits.max_graph_nodes = 20",
        ],
    );
    // The worker still answers.
    let status = worker.get_status(GetStatusRequest {}).await.unwrap();
    assert!(!status.into_inner().device_attributes.is_empty());
    stop(server).await;
}
