//! The Prometheus endpoint of a running cluster: two tasks in this process (`/job:ps/task:0`
//! holding a variable, `/job:worker/task:0` whose master runs the steps and pulls the
//! variable's value across with RecvTensor), both with `[metrics] listen = "127.0.0.1:0"`,
//! scraped with a plain HTTP GET under a deadline before and after steps run.
//!
//! Graph: `w = Variable([1, 2, 3, 4])` on the ps, placeholder `x`, `y = AddV2(w, x)` on the
//! worker. One initializing step, then three steps fetching `y`: the counts below follow from
//! that by hand (4 RunSteps, 3 RecvTensors of `w`'s 16 bytes over the tensor channel, one
//! variable of 16 bytes, one session).

use std::time::Duration;

use crate::support::cluster::{InProcessCluster, TEST_TIMEOUTS};
use crate::support::prometheus::{has, parse, scrape, value};
use prost::Message;
use tessera::graph::builder::Graph;
use tessera::proto::master_service_client::MasterServiceClient;
use tessera::proto::*;
use tessera::server::Server;
use tessera::tensor::{DType, PartialShape, Tensor};

const PS: &str = "/job:ps/replica:0/task:0";
const WORKER: &str = "/job:worker/replica:0/task:0";

/// The two tasks, each on its own pre-bound port, each with a metrics endpoint on port 0.
fn start_cluster() -> (Server, Server) {
    let extra = format!("{TEST_TIMEOUTS}\n[metrics]\nlisten = \"127.0.0.1:0\"\n");
    let mut cluster = InProcessCluster::start_with(&[("ps", 1), ("worker", 1)], &extra);
    let worker = cluster.servers.pop().expect("the worker");
    let ps = cluster.servers.pop().expect("the ps");
    assert_eq!(
        (ps.task().job.as_str(), worker.task().job.as_str()),
        ("ps", "worker")
    );
    (ps, worker)
}

fn graph() -> (GraphDef, String) {
    let mut g = Graph::new();
    let w = g
        .with_device("/job:ps/task:0", |g| {
            let initial = g.constant(&Tensor::from_vec(vec![4], vec![1.0f32, 2., 3., 4.])?)?;
            g.variable("w", &initial)
        })
        .unwrap();
    let x = g
        .placeholder("x", DType::Float, PartialShape::unknown())
        .unwrap();
    let y = g
        .with_device("/job:worker/task:0", |g| g.add(&w.value, &x))
        .unwrap();
    let mut def = g.to_graph_def();
    for node in &mut def.node {
        if node.name == y.node {
            node.name = "y".into();
        }
    }
    (def, w.initializer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_serves_every_series_and_they_move_when_steps_run() {
    let (ps, worker) = tokio::task::spawn_blocking(start_cluster).await.unwrap();
    let endpoint = worker.metrics_addr().expect("metrics are on");
    assert_ne!(endpoint.port(), 0);
    assert_ne!(ps.metrics_addr(), worker.metrics_addr());

    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", worker.local_addr()))
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(20))
            .connect()
            .await
            .unwrap();
    let mut master = MasterServiceClient::new(channel);
    let scrape_now = || {
        let addr = endpoint;
        tokio::task::spawn_blocking(move || parse(&scrape(addr)))
    };
    let before = scrape_now().await.unwrap();

    let (def, initializer) = graph();
    let handle = master
        .create_session(CreateSessionRequest {
            graph_def: Some(def),
            config: Some(ConfigProto::default()),
            target: worker.target(),
        })
        .await
        .unwrap()
        .into_inner()
        .session_handle;
    let mut requests = vec![RunStepRequest {
        session_handle: handle.clone(),
        target: vec![initializer],
        ..Default::default()
    }];
    for step in 0..3 {
        let x = vec![step as f32; 4];
        requests.push(RunStepRequest {
            session_handle: handle.clone(),
            feed: vec![Tensor::from_vec(vec![4], x).unwrap().to_named_proto("x:0")],
            fetch: vec!["y:0".into()],
            ..Default::default()
        });
    }
    let (mut sent_up, mut sent_down) = (0, 0);
    for request in requests {
        sent_up += request.encoded_len();
        let reply = master.run_step(request).await.unwrap().into_inner();
        assert_eq!(reply.status_code, 0, "{}", reply.status_error_message);
        sent_down += reply.encoded_len();
    }
    let during = scrape_now().await.unwrap();
    master
        .close_session(CloseSessionRequest {
            session_handle: handle,
        })
        .await
        .unwrap();
    let after = scrape_now().await.unwrap();

    // Series are described for whoever reads the endpoint.
    let text = tokio::task::spawn_blocking(move || scrape(endpoint))
        .await
        .unwrap();
    assert!(
        text.contains("# HELP tessera_rpcs_total gRPC calls answered"),
        "{text}"
    );
    // Every listed series is there.
    for name in [
        "tessera_rpcs_total",
        "tessera_rpc_duration_seconds_bucket",
        "tessera_master_step_duration_seconds_count",
        "tessera_worker_step_duration_seconds_count",
        "tessera_sent_bytes_total",
        "tessera_received_bytes_total",
        "tessera_rendezvous_waits_total",
        "tessera_rendezvous_wait_duration_seconds_count",
        "tessera_shard_variables",
        "tessera_shard_variable_bytes",
        "tessera_sessions_open",
        "tessera_steps_in_flight",
    ] {
        assert!(has(&during, name), "{name} missing from:\n{during:?}");
    }

    let moved = |name: &str, labels: &[(&str, &str)]| {
        value(&during, name, labels) - value(&before, name, labels)
    };
    // RPCs by method and code: 4 RunSteps answered OK by the worker's master.
    let run_steps = [
        ("task", WORKER),
        ("service", "MasterService"),
        ("method", "RunStep"),
        ("code", "OK"),
    ];
    assert_eq!(moved("tessera_rpcs_total", &run_steps), 4.0);
    assert_eq!(
        moved(
            "tessera_rpcs_total",
            &[
                ("task", WORKER),
                ("method", "CreateSession"),
                ("code", "OK")
            ]
        ),
        1.0
    );
    // The three reads of `w` crossed from the ps, one RecvTensor each, answered by the ps.
    let recvs = [("task", PS), ("method", "RecvTensor"), ("code", "OK")];
    assert_eq!(moved("tessera_rpcs_total", &recvs), 3.0);
    // All three over the tensor channel: both tasks speak plain text.
    let over_channel = [
        ("task", PS),
        ("service", "TensorChannel"),
        ("method", "RecvTensor"),
        ("code", "OK"),
    ];
    assert_eq!(moved("tessera_rpcs_total", &over_channel), 3.0);
    assert_eq!(
        moved("tessera_rendezvous_waits_total", &[("task", PS)]),
        3.0
    );
    // Step latency: one master step per RunStep.
    assert_eq!(
        moved(
            "tessera_master_step_duration_seconds_count",
            &[("task", WORKER)]
        ),
        4.0
    );
    // The ps ran its partition in every step (the initializer is all on the ps).
    assert_eq!(
        moved(
            "tessera_worker_step_duration_seconds_count",
            &[("task", PS)]
        ),
        4.0
    );
    // Bytes: RunStep's payloads as the client encoded them, both ways.
    let worker_run_step = [("task", WORKER), ("rpc", "RunStep")];
    assert_eq!(
        moved("tessera_received_bytes_total", &worker_run_step),
        sent_up as f64
    );
    assert_eq!(
        moved("tessera_sent_bytes_total", &worker_run_step),
        sent_down as f64
    );
    // RecvTensor: what the ps sent is what the worker received; each carries w's 16 bytes.
    let ps_sent = moved(
        "tessera_sent_bytes_total",
        &[("task", PS), ("rpc", "RecvTensor")],
    );
    let worker_got = moved(
        "tessera_received_bytes_total",
        &[("task", WORKER), ("rpc", "RecvTensor")],
    );
    assert_eq!(ps_sent, worker_got);
    assert!(ps_sent >= 3.0 * 16.0, "{ps_sent}");
    // The ps's shard holds w: one variable of 4 floats.
    let shard = [
        ("task", PS),
        ("device", "/job:ps/replica:0/task:0/device:CPU:0"),
    ];
    assert_eq!(value(&during, "tessera_shard_variables", &shard), 1.0);
    assert_eq!(value(&during, "tessera_shard_variable_bytes", &shard), 16.0);
    // Sessions open and steps in flight: one session, no step running between calls.
    assert_eq!(
        value(&during, "tessera_sessions_open", &[("task", WORKER)]),
        1.0
    );
    assert_eq!(
        value(&during, "tessera_steps_in_flight", &[("task", WORKER)]),
        0.0
    );
    assert_eq!(
        value(&after, "tessera_sessions_open", &[("task", WORKER)]),
        0.0
    );

    // The ps's endpoint serves too.
    let ps_endpoint = ps.metrics_addr().unwrap();
    let ps_view = tokio::task::spawn_blocking(move || parse(&scrape(ps_endpoint)))
        .await
        .unwrap();
    assert!(has(&ps_view, "tessera_rpcs_total"));

    tokio::task::spawn_blocking(move || {
        worker.stop();
        ps.stop();
    })
    .await
    .unwrap();
}

#[test]
fn without_a_metrics_section_there_is_no_endpoint() {
    let server = Server::local().unwrap();
    assert_eq!(server.metrics_addr(), None);
    server.stop();
}
