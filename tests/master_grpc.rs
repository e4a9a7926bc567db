//! The master end to end inside one process: two real tasks (`/job:ps/task:0` and
//! `/job:worker/task:0`) serving gRPC on 127.0.0.1 (ports bound first, then written into the
//! cluster spec), a client speaking TensorFlow's MasterService to one of them, and a step whose
//! graph needs both tasks.
//!
//! Graph: `a = Const([1, 2])` on the ps, placeholder `x`, `y = AddV2(a, x)` on the worker. With
//! `x = [10, 20]` the step must return `y = [11, 22]`, whichever task's master runs it: through
//! the worker's master the feed stays on the worker and `a` crosses from the ps; through the
//! ps's master the feed crosses to the worker and `y` comes back to the ps.

use std::net::TcpListener;
use std::time::Duration;

use tessera::cluster::{ClusterSpec, DeviceConfig, TaskConfig, TaskId, Timeouts};
use tessera::graph::builder::Graph;
use tessera::proto::master_service_client::MasterServiceClient;
use tessera::proto::*;
use tessera::server::Server;
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::Code;

/// The two tasks, each on its own pre-bound port.
fn start_cluster() -> (Server, Server) {
    let ps_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let worker_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let spec = ClusterSpec::from_dense([
        ("ps", vec![ps_listener.local_addr().unwrap().to_string()]),
        (
            "worker",
            vec![worker_listener.local_addr().unwrap().to_string()],
        ),
    ]);
    let config = |task: TaskId, listener: &TcpListener| TaskConfig {
        cluster: spec.clone(),
        task,
        listen: listener.local_addr().unwrap(),
        devices: DeviceConfig {
            gpu_count: Some(0),
            ..DeviceConfig::default()
        },
        timeouts: Timeouts {
            create_session: Duration::from_secs(10),
            rpc: Duration::from_secs(10),
            ..Timeouts::default()
        },
        security: Default::default(),
    };
    let ps = Server::start_with_listener(config(TaskId::new("ps", 0), &ps_listener), ps_listener)
        .unwrap();
    let worker = Server::start_with_listener(
        config(TaskId::new("worker", 0), &worker_listener),
        worker_listener,
    )
    .unwrap();
    (ps, worker)
}

fn graph() -> GraphDef {
    let mut g = Graph::new();
    let a = g
        .with_device("/job:ps/task:0", |g| {
            g.constant(&Tensor::from_vec(vec![2], vec![1.0f32, 2.0]).unwrap())
        })
        .unwrap();
    let x = g
        .placeholder("x", DType::Float, PartialShape::unknown())
        .unwrap();
    g.with_device("/job:worker/task:0", |g| g.add(&a, &x))
        .unwrap();
    let mut def = g.to_graph_def();
    for node in &mut def.node {
        if node.op == "AddV2" {
            node.name = "y".into();
        }
    }
    def
}

async fn client(server: &Server) -> MasterServiceClient<tonic::transport::Channel> {
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", server.local_addr()))
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(20))
            .connect()
            .await
            .unwrap();
    MasterServiceClient::new(channel)
}

/// Creates a session on `server`'s master, runs the step twice, closes the session.
async fn run_through(server: &Server) {
    let mut master = client(server).await;
    let created = master
        .create_session(CreateSessionRequest {
            graph_def: Some(graph()),
            config: Some(ConfigProto::default()),
            target: server.target(),
        })
        .await
        .unwrap()
        .into_inner();
    let handle = created.session_handle;
    for x in [[10.0f32, 20.0], [0.5, 0.25]] {
        let reply = master
            .run_step(RunStepRequest {
                session_handle: handle.clone(),
                feed: vec![Tensor::from_vec(vec![2], x.to_vec())
                    .unwrap()
                    .to_named_proto("x:0")],
                fetch: vec!["y:0".into()],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.status_code, 0, "{}", reply.status_error_message);
        assert_eq!(reply.tensor[0].name, "y:0");
        let y = Tensor::from_proto(reply.tensor[0].tensor.as_ref().unwrap()).unwrap();
        // [1, 2] + x, exact in f32.
        assert_eq!(
            y.values::<f32>().unwrap().to_vec(),
            [1.0 + x[0], 2.0 + x[1]]
        );
    }
    let listed = master
        .list_devices(ListDevicesRequest {
            session_handle: handle.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.local_device.len(), 1);
    assert_eq!(listed.remote_device.len(), 1);
    master
        .close_session(CloseSessionRequest {
            session_handle: handle.clone(),
        })
        .await
        .unwrap();
    let err = master
        .run_step(RunStepRequest {
            session_handle: handle,
            fetch: vec!["y:0".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Aborted);
}

#[test]
fn a_step_spanning_two_tasks_runs_through_either_master() {
    let (ps, worker) = start_cluster();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(run_through(&worker));
    runtime.block_on(run_through(&ps));
    ps.stop();
    worker.stop();
}

#[test]
fn a_bad_step_is_an_error_in_the_body_and_the_daemon_keeps_serving() {
    let (ps, worker) = start_cluster();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut master = client(&worker).await;
        let handle = master
            .create_session(CreateSessionRequest {
                graph_def: Some(graph()),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .session_handle;
        let reply = master
            .run_step(RunStepRequest {
                session_handle: handle.clone(),
                fetch: vec!["nothing:0".into()],
                store_errors_in_response_body: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.status_code, Code::NotFound as i32);
        assert!(reply.status_error_message.contains("nothing"));
        let err = master
            .create_session(CreateSessionRequest {
                graph_def: Some(GraphDef {
                    node: vec![NodeDef {
                        name: "bad".into(),
                        op: "NoSuchOp".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert!(err.message().contains("bad"), "{}", err.message());
        // Still serving.
        master
            .list_devices(ListDevicesRequest::default())
            .await
            .unwrap();
    });
    ps.stop();
    worker.stop();
}

/// `w` (a resource variable, [1, 2]) lives on the ps; `bump` adds the fed `x` to it there;
/// `y = w + x` is computed on the worker.
fn variable_graph() -> (GraphDef, String, String, String) {
    let mut g = Graph::new();
    let x = g
        .placeholder("x", DType::Float, PartialShape::unknown())
        .unwrap();
    let (w, bump) = g
        .with_device("/job:ps/task:0", |g| {
            let initial = g.constant(&Tensor::from_vec(vec![2], vec![1.0f32, 2.0])?)?;
            let w = g.variable("w", &initial)?;
            let bump = g.assign_add_variable(&w.handle, &x)?;
            Ok((w, bump))
        })
        .unwrap();
    let y = g
        .with_device("/job:worker/task:0", |g| g.add(&w.value, &x))
        .unwrap();
    let init = g.global_variables_initializer().unwrap();
    (
        g.to_graph_def(),
        init,
        bump,
        format!("{}:{}", y.node, y.index),
    )
}

async fn session(
    master: &mut MasterServiceClient<tonic::transport::Channel>,
    graph: &GraphDef,
) -> String {
    master
        .create_session(CreateSessionRequest {
            graph_def: Some(graph.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session_handle
}

async fn step(
    master: &mut MasterServiceClient<tonic::transport::Channel>,
    handle: &str,
    x: Option<[f32; 2]>,
    fetch: &[&str],
    target: &[&str],
) -> Vec<Vec<f32>> {
    let reply = master
        .run_step(RunStepRequest {
            session_handle: handle.into(),
            feed: x
                .map(|x| {
                    Tensor::from_vec(vec![2], x.to_vec())
                        .unwrap()
                        .to_named_proto("x:0")
                })
                .into_iter()
                .collect(),
            fetch: fetch.iter().map(|s| s.to_string()).collect(),
            target: target.iter().map(|s| s.to_string()).collect(),
            store_errors_in_response_body: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status_code, 0, "{}", reply.status_error_message);
    reply
        .tensor
        .iter()
        .map(|t| {
            Tensor::from_proto(t.tensor.as_ref().unwrap())
                .unwrap()
                .values::<f32>()
                .unwrap()
                .to_vec()
        })
        .collect()
}

#[test]
fn variables_on_the_ps_are_shared_by_sessions_of_both_masters() {
    let (ps, worker) = start_cluster();
    let (graph, init, bump, y) = variable_graph();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut on_worker = client(&worker).await;
        let first = session(&mut on_worker, &graph).await;
        step(&mut on_worker, &first, None, &[], &[&init]).await;
        // w = [1, 2], x = [10, 20]: y = [11, 22]; then w += x on the ps.
        let got = step(&mut on_worker, &first, Some([10.0, 20.0]), &[&y], &[]).await;
        assert_eq!(got, [vec![11.0, 22.0]]);
        step(&mut on_worker, &first, Some([10.0, 20.0]), &[], &[&bump]).await;

        // A session on the ps's master sees the updated w = [11, 22]: y = w + [1, 1].
        let mut on_ps = client(&ps).await;
        let second = session(&mut on_ps, &graph).await;
        let got = step(
            &mut on_ps,
            &second,
            Some([1.0, 1.0]),
            &[&y, "w/Read/ReadVariableOp:0"],
            &[],
        )
        .await;
        assert_eq!(got, [vec![12.0, 23.0], vec![11.0, 22.0]]);
    });
    ps.stop();
    worker.stop();
}
