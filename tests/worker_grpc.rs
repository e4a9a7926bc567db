//! Two tasks over gRPC on loopback: a ps and a worker `Server`, each on 127.0.0.1:0. Their
//! partitions are registered by hand, as a master would, with `_Send`/`_Recv` attrs carrying
//! the incarnations each task reported in GetStatus; the worker's `_Recv` pulls the ps's tensor
//! with RecvTensor over gRPC.

use std::net::SocketAddr;
use std::time::Duration;

use tessera::cluster::{ClusterSpec, TaskConfig, TaskId, Timeouts};
use tessera::graph::attr;
use tessera::proto::worker_service_client::WorkerServiceClient;
use tessera::proto::{
    AttrValue, GetStatusRequest, GetStepSequenceRequest, GraphDef, NodeDef, RecvTensorRequest,
    RegisterGraphRequest, RunGraphRequest,
};
use tessera::server::Server;
use tessera::tensor::{DType, Tensor};
use tonic::transport::Channel;

const PS0: &str = "/job:ps/replica:0/task:0/device:CPU:0";
const W0: &str = "/job:worker/replica:0/task:0/device:CPU:0";

fn config(task: TaskId, cluster: ClusterSpec) -> TaskConfig {
    TaskConfig {
        cluster,
        task,
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        devices: Default::default(),
        timeouts: Timeouts {
            rpc: Duration::from_secs(20),
            connect: Duration::from_secs(5),
            ..Default::default()
        },
        ..TaskConfig::local()
    }
}

fn node(
    name: &str,
    op: &str,
    device: &str,
    inputs: &[&str],
    attrs: Vec<(&str, AttrValue)>,
) -> NodeDef {
    NodeDef {
        name: name.into(),
        op: op.into(),
        device: device.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        attr: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        ..Default::default()
    }
}

fn pair(
    send_device: &str,
    incarnation: u64,
    recv_device: &str,
    tensor_name: &str,
    client_terminated: bool,
    dtype_attr: &'static str,
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
        (dtype_attr, attr::value::dtype(DType::Float)),
    ]
}

fn key(send_device: &str, incarnation: u64, recv_device: &str, tensor_name: &str) -> String {
    format!("{send_device};{incarnation:016x};{recv_device};{tensor_name};0:0")
}

async fn client(server: &Server) -> WorkerServiceClient<Channel> {
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", server.local_addr()))
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(20))
            .connect()
            .await
            .unwrap();
    WorkerServiceClient::new(channel)
}

async fn incarnation(client: &mut WorkerServiceClient<Channel>, device: &str) -> u64 {
    let status = client
        .get_status(GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    status
        .device_attributes
        .iter()
        .find(|d| d.name == device)
        .unwrap_or_else(|| panic!("{device} not in {status:?}"))
        .incarnation
}

async fn register(client: &mut WorkerServiceClient<Channel>, nodes: Vec<NodeDef>) -> String {
    client
        .register_graph(RegisterGraphRequest {
            graph_def: Some(GraphDef {
                node: nodes,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .graph_handle
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recv_on_one_task_pulls_the_tensor_from_another_over_grpc() {
    let ps = Server::start(config(
        TaskId::new("ps", 0),
        ClusterSpec::from_dense([("ps", vec!["127.0.0.1:0"]), ("worker", vec!["127.0.0.1:1"])]),
    ))
    .unwrap();
    let worker = Server::start(config(
        TaskId::new("worker", 0),
        ClusterSpec::from_dense([
            ("ps", vec![ps.local_addr().to_string()]),
            ("worker", vec!["127.0.0.1:0".to_string()]),
        ]),
    ))
    .unwrap();
    let mut ps_client = client(&ps).await;
    let mut worker_client = client(&worker).await;
    let ps_inc = incarnation(&mut ps_client, PS0).await;
    let w_inc = incarnation(&mut worker_client, W0).await;

    // ps: w = [1.5, 2.5] sent to the worker. worker: w + w, fetched by the client.
    let w = Tensor::from_vec(vec![2], vec![1.5f32, 2.5]).unwrap();
    let ps_graph = register(
        &mut ps_client,
        vec![
            node(
                "w",
                "Const",
                PS0,
                &[],
                vec![
                    ("dtype", attr::value::dtype(DType::Float)),
                    ("value", attr::value::tensor(w.to_proto())),
                ],
            ),
            node(
                "w_S0",
                "_Send",
                PS0,
                &["w"],
                pair(PS0, ps_inc, W0, "edge_1_w", false, "T"),
            ),
        ],
    )
    .await;
    let worker_graph = register(
        &mut worker_client,
        vec![
            node(
                "w_S1",
                "_Recv",
                W0,
                &[],
                pair(PS0, ps_inc, W0, "edge_1_w", false, "tensor_type"),
            ),
            node(
                "double",
                "AddV2",
                W0,
                &["w_S1", "w_S1"],
                vec![("T", attr::value::dtype(DType::Float))],
            ),
            node(
                "send_double",
                "_Send",
                W0,
                &["double"],
                pair(W0, w_inc, W0, "double:0", true, "T"),
            ),
        ],
    )
    .await;

    let fetch = key(W0, w_inc, W0, "double:0");
    let run = |graph: String, recv_key: Vec<String>| RunGraphRequest {
        graph_handle: graph,
        step_id: 42,
        recv_key,
        store_errors_in_response_body: true,
        ..Default::default()
    };
    // The worker's step starts first, so its `_Recv` waits for the ps to send.
    let mut worker_call = worker_client.clone();
    let worker_step =
        tokio::spawn(async move { worker_call.run_graph(run(worker_graph, vec![fetch])).await });
    let ps_step = ps_client
        .run_graph(run(ps_graph, vec![]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ps_step.status_code, 0, "{}", ps_step.status_error_message);
    let worker_step = worker_step.await.unwrap().unwrap().into_inner();
    assert_eq!(
        worker_step.status_code, 0,
        "{}",
        worker_step.status_error_message
    );
    let (_, doubled) = Tensor::from_named_proto(&worker_step.recv[0]).unwrap();
    // [1.5, 2.5] + [1.5, 2.5].
    assert_eq!(doubled.values::<f32>().unwrap().to_vec(), [3.0, 5.0]);

    // A key made for an earlier run of the ps is refused with ABORTED.
    let err = worker_client
        .recv_tensor(RecvTensorRequest {
            step_id: 43,
            rendezvous_key: key(W0, w_inc ^ 1, PS0, "edge_9_x"),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Aborted);
    assert!(err.message().contains("incarnation"), "{}", err.message());

    tokio::task::spawn_blocking(move || {
        worker.stop();
        ps.stop();
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_step_sequence_answers_a_stable_step_id_per_graph_key() {
    let server = Server::start(config(
        TaskId::new("worker", 0),
        ClusterSpec::from_dense([("worker", vec!["127.0.0.1:0"])]),
    ))
    .unwrap();
    let mut client = client(&server).await;
    let ask = |keys: Vec<i64>| GetStepSequenceRequest { graph_key: keys };
    let first = client
        .get_step_sequence(ask(vec![3, 5]))
        .await
        .unwrap()
        .into_inner()
        .step_sequence;
    let again = client
        .get_step_sequence(ask(vec![5, 3]))
        .await
        .unwrap()
        .into_inner()
        .step_sequence;
    assert_eq!(first.len(), 2);
    assert_eq!((first[0].graph_key, first[1].graph_key), (3, 5));
    assert_eq!(again[0], first[1]);
    assert_eq!(again[1], first[0]);
    for sequence in &first {
        // TensorFlow leaves a step id's top 7 bits clear.
        assert!(
            (0..1i64 << 57).contains(&sequence.next_step_id),
            "{sequence:?}"
        );
    }
    server.stop();
}
