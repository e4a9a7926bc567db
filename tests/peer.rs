//! Peers as masters and workers see them: a gRPC peer against real tonic servers on loopback
//! (success, a task that never answers, a dead address, a task that restarts on its port), the
//! simulated peer's scripts, records, drops, delays and restarts on paused time, and the peer
//! cache.

use std::sync::Arc;
use std::time::Duration;

use crate::support::worker_service::worker_service;
use tessera::cluster::{ClusterSpec, TaskId, Timeouts};
use tessera::peer::{
    CallOptions, GrpcPeer, LocalPeer, Peer, PeerCache, SimulatedCluster, SimulatedPeer,
};
use tessera::proto::worker_service_server::{WorkerService, WorkerServiceServer};
use tessera::proto::*;
use tessera::worker::{HandlerFuture, Rpc, WorkerHandler};
use tessera::Code;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response};

/// Every wait on a real socket in these tests gives up after this long.
const NETWORK_DEADLINE: Duration = Duration::from_secs(5);

/// Larger than gRPC's 4 MiB default message limit.
const BIG_TENSOR_BYTES: usize = 8 << 20;

// ---------------------------------------------------------------------------------------------
// A small WorkerService: GetStatus answers one CPU device with the server's incarnation;
// RunGraph echoes the requested keys back, fails with ABORTED for step 13 and returns an 8 MiB
// tensor for step 64; RecvTensor never answers; the rest is unimplemented.

struct TestWorker {
    incarnation: u64,
}

type TonicResult<T> = std::result::Result<Response<T>, tonic::Status>;

worker_service! { TestWorker, {
    async fn get_status(&self, _: Request<GetStatusRequest>) -> TonicResult<GetStatusResponse> {
        Ok(Response::new(GetStatusResponse {
            device_attributes: vec![DeviceAttributes {
                name: "/job:worker/replica:0/task:2/device:CPU:0".into(),
                device_type: "CPU".into(),
                incarnation: self.incarnation,
                ..Default::default()
            }],
        }))
    }

    async fn run_graph(&self, request: Request<RunGraphRequest>) -> TonicResult<RunGraphResponse> {
        let request = request.into_inner();
        if request.step_id == 13 {
            return Err(tonic::Status::aborted("Step 13 was aborted"));
        }
        if request.step_id == 64 {
            return Ok(Response::new(RunGraphResponse {
                recv: vec![NamedTensorProto {
                    name: "big:0".into(),
                    tensor: Some(TensorProto {
                        tensor_content: vec![7u8; BIG_TENSOR_BYTES].into(),
                        ..Default::default()
                    }),
                }],
                ..Default::default()
            }));
        }
        Ok(Response::new(RunGraphResponse {
            recv: request
                .recv_key
                .into_iter()
                .map(|name| NamedTensorProto { name, tensor: None })
                .collect(),
            ..Default::default()
        }))
    }

    async fn recv_tensor(&self, _: Request<RecvTensorRequest>) -> TonicResult<RecvTensorResponse> {
        std::future::pending().await
    }
    }
        create_worker_session, CreateWorkerSessionRequest, CreateWorkerSessionResponse;
        delete_worker_session, DeleteWorkerSessionRequest, DeleteWorkerSessionResponse;
        register_graph, RegisterGraphRequest, RegisterGraphResponse;
        deregister_graph, DeregisterGraphRequest, DeregisterGraphResponse;
        cleanup_graph, CleanupGraphRequest, CleanupGraphResponse;
        cleanup_all, CleanupAllRequest, CleanupAllResponse;
        mark_recv_finished, MarkRecvFinishedRequest, MarkRecvFinishedResponse;
        logging, LoggingRequest, LoggingResponse;
        tracing, TracingRequest, TracingResponse;
        recv_buf, RecvBufRequest, RecvBufResponse;
        complete_group, CompleteGroupRequest, CompleteGroupResponse;
        complete_instance, CompleteInstanceRequest, CompleteInstanceResponse;
        get_step_sequence, GetStepSequenceRequest, GetStepSequenceResponse;
}

/// A running test server: stop it with [`stop`](Self::stop).
struct TestServer {
    shutdown: oneshot::Sender<()>,
    serving: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl TestServer {
    /// Serves a [`TestWorker`] on `listener`, which is already bound, so it is ready at once.
    fn start(listener: TcpListener, incarnation: u64) -> Self {
        let (shutdown, stopped) = oneshot::channel::<()>();
        let serving = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(WorkerServiceServer::new(TestWorker { incarnation }))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                }),
        );
        Self { shutdown, serving }
    }

    /// Stops serving, closes the listening socket and waits (with a deadline) until it is gone.
    async fn stop(self) {
        let _ = self.shutdown.send(());
        let served = tokio::time::timeout(NETWORK_DEADLINE, self.serving)
            .await
            .expect("the test server stops within the deadline");
        served.unwrap().unwrap();
    }
}

fn worker2() -> TaskId {
    TaskId::new("worker", 2)
}

fn grpc_peer(address: &str) -> GrpcPeer {
    GrpcPeer::connect_lazy(worker2(), address, Duration::from_secs(2)).unwrap()
}

fn short(budget: Duration) -> CallOptions {
    CallOptions::timeout(budget)
}

fn run_graph(step_id: i64, keys: &[&str]) -> RunGraphRequest {
    RunGraphRequest {
        step_id,
        recv_key: keys.iter().map(|k| k.to_string()).collect(),
        ..Default::default()
    }
}

fn recv_names(response: &RunGraphResponse) -> Vec<&str> {
    response.recv.iter().map(|r| r.name.as_str()).collect()
}

// ---------------------------------------------------------------------------------------------
// GrpcPeer against real servers.

#[tokio::test]
async fn grpc_peer_reaches_a_running_task() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let server = TestServer::start(listener, 0x1a2b);
    let peer: Arc<dyn Peer> = Arc::new(grpc_peer(&address));
    assert_eq!(peer.task(), &worker2());

    let status = peer
        .get_status(GetStatusRequest {}, short(NETWORK_DEADLINE))
        .await
        .unwrap();
    assert_eq!(status.device_attributes.len(), 1);
    assert_eq!(status.device_attributes[0].incarnation, 0x1a2b);

    let response = peer
        .run_graph(run_graph(7, &["x:0", "y:0"]), short(NETWORK_DEADLINE))
        .await;
    assert_eq!(recv_names(&response.unwrap()), ["x:0", "y:0"]);

    // An error status the task sends keeps its code and gains who sent it.
    let err = peer
        .run_graph(run_graph(13, &[]), short(NETWORK_DEADLINE))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    assert_eq!(
        err.message(),
        format!("RunGraph on /job:worker/replica:0/task:2 at {address}: Step 13 was aborted")
    );
    server.stop().await;
}

#[tokio::test]
async fn grpc_peer_takes_tensors_past_grpcs_default_message_limit() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let server = TestServer::start(listener, 1);
    let peer = grpc_peer(&address);
    let response = peer
        .run_graph(run_graph(64, &[]), short(NETWORK_DEADLINE))
        .await
        .unwrap();
    let tensor = response.recv[0].tensor.as_ref().unwrap();
    assert_eq!(tensor.tensor_content.len(), BIG_TENSOR_BYTES);
    assert!(tensor.tensor_content.iter().all(|&b| b == 7));
    server.stop().await;
}

#[tokio::test]
async fn grpc_peer_gives_up_on_a_silent_task_at_the_deadline() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let server = TestServer::start(listener, 1);
    let peer = grpc_peer(&address);

    let start = std::time::Instant::now();
    let err = peer
        .recv_tensor(
            RecvTensorRequest::default(),
            short(Duration::from_millis(200)),
        )
        .await
        .unwrap_err();
    let waited = start.elapsed();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(
        err.message().starts_with(&format!(
            "/job:worker/replica:0/task:2 at {address} did not answer RecvTensor within 200 ms"
        )),
        "{err}"
    );
    // It waited for the deadline, not for the task (which never answers).
    assert!(waited >= Duration::from_millis(200), "{waited:?}");
    assert!(waited < NETWORK_DEADLINE, "{waited:?}");
    server.stop().await;
}

#[tokio::test]
async fn grpc_peer_names_a_dead_task_and_its_address() {
    // A port the OS handed out and nobody listens on any more.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    drop(listener);
    let peer = grpc_peer(&address);

    let start = std::time::Instant::now();
    let err = peer
        .get_status(GetStatusRequest {}, short(NETWORK_DEADLINE))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    let prefix = format!("/job:worker/replica:0/task:2 at {address} unreachable: ");
    assert!(err.message().starts_with(&prefix), "{err}");
    // The cause follows, down to the operating system's word for it.
    assert!(err.message().contains("refused"), "{err}");
    assert!(start.elapsed() < NETWORK_DEADLINE);
}

#[tokio::test]
async fn grpc_peer_reports_a_connection_lost_mid_call_as_unavailable() {
    // A "task" that takes the connection, reads the start of the call and crashes.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let crashing = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut start = [0u8; 16];
            let _ = socket.read(&mut start).await;
        }
    });
    let peer = grpc_peer(&address);
    let start = std::time::Instant::now();
    let err = peer
        .run_graph(run_graph(1, &[]), short(NETWORK_DEADLINE))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(
        err.message().starts_with(&format!(
            "/job:worker/replica:0/task:2 at {address} lost the connection during RunGraph: "
        )),
        "{err}"
    );
    assert!(start.elapsed() < NETWORK_DEADLINE);
    crashing.abort();
}

#[tokio::test]
async fn grpc_peer_reconnects_when_the_task_restarts_on_its_port() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let first = TestServer::start(listener, 111);
    let peer = grpc_peer(&address.to_string());
    let before = peer
        .get_status(GetStatusRequest {}, short(NETWORK_DEADLINE))
        .await
        .unwrap();
    assert_eq!(before.device_attributes[0].incarnation, 111);

    first.stop().await;
    // While the task is down, calls fail as UNAVAILABLE (not hang).
    let down = peer
        .get_status(GetStatusRequest {}, short(NETWORK_DEADLINE))
        .await
        .unwrap_err();
    assert_eq!(down.code(), Code::Unavailable, "{down}");

    // The port came from the OS for this test, so taking it again is safe.
    let listener = TcpListener::bind(address).await.unwrap();
    let second = TestServer::start(listener, 222);
    let after = peer
        .get_status(GetStatusRequest {}, short(NETWORK_DEADLINE))
        .await
        .unwrap();
    assert_eq!(
        after.device_attributes[0].incarnation, 222,
        "a new process answers"
    );
    second.stop().await;
}

// ---------------------------------------------------------------------------------------------
// SimulatedPeer on paused time.

fn simulated() -> SimulatedPeer {
    SimulatedPeer::new(TaskId::new("ps", 0), "ps0:2222")
}

#[tokio::test(start_paused = true)]
async fn simulated_peer_replies_from_its_script_then_its_closure_then_defaults() {
    let peer = simulated();
    peer.reply::<RunGraphRequest>(Ok(RunGraphResponse {
        status_code: Code::Aborted as i32,
        status_error_message: "Step 1 aborted".into(),
        ..Default::default()
    }));
    peer.reply::<RunGraphRequest>(Err(tessera::Status::unavailable("scripted")));
    let options = short(Duration::from_secs(1));

    // First: an OK call whose body holds an error (left to the caller to read).
    let first = peer.run_graph(run_graph(1, &[]), options).await.unwrap();
    let body = tessera::Status::from_body(first.status_code, &first.status_error_message);
    assert_eq!(body, Some(tessera::Status::aborted("Step 1 aborted")));
    // Second: the scripted error.
    let second = peer
        .run_graph(run_graph(2, &[]), options)
        .await
        .unwrap_err();
    assert_eq!(second, tessera::Status::unavailable("scripted"));
    // Third: the queue is empty, so the default, an empty response.
    let third = peer.run_graph(run_graph(3, &["k"]), options).await.unwrap();
    assert!(third.recv.is_empty());
    // Then a closure answers every call.
    peer.answer_with(|r: &RunGraphRequest| {
        Ok(RunGraphResponse {
            recv: vec![NamedTensorProto {
                name: format!("step {}", r.step_id),
                tensor: None,
            }],
            ..Default::default()
        })
    });
    let fourth = peer.run_graph(run_graph(4, &[]), options).await.unwrap();
    assert_eq!(recv_names(&fourth), ["step 4"]);

    // Every request is recorded, in order, with the RPCs in the call log.
    let steps: Vec<_> = peer
        .requests::<RunGraphRequest>()
        .iter()
        .map(|r| r.step_id)
        .collect();
    assert_eq!(steps, [1, 2, 3, 4]);
    peer.cleanup_graph(CleanupGraphRequest { step_id: 4 }, options)
        .await
        .unwrap();
    assert_eq!(
        peer.calls(),
        [
            Rpc::RunGraph,
            Rpc::RunGraph,
            Rpc::RunGraph,
            Rpc::RunGraph,
            Rpc::CleanupGraph
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn simulated_drop_leaves_the_caller_to_its_deadline() {
    let peer = simulated();
    peer.drop_next::<GetStatusRequest>();
    let start = Instant::now();
    let err = peer
        .get_status(GetStatusRequest {}, short(Duration::from_secs(10)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);
    assert!(
        err.message().starts_with(
            "/job:ps/replica:0/task:0 at ps0:2222 did not answer GetStatus within 10 s"
        ),
        "{err}"
    );
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(10),
        "exactly the deadline, on paused time"
    );
    // Only the next call was dropped.
    peer.get_status(GetStatusRequest {}, short(Duration::from_secs(10)))
        .await
        .unwrap();

    // A dropping task drops every call until it stops, and its script waits for it.
    peer.reply::<CleanupAllRequest>(Err(tessera::Status::internal("scripted")));
    peer.set_dropping(true);
    let err = peer
        .cleanup_all(CleanupAllRequest::default(), short(Duration::from_secs(3)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);
    peer.set_dropping(false);
    let err = peer
        .cleanup_all(CleanupAllRequest::default(), short(Duration::from_secs(3)))
        .await
        .unwrap_err();
    assert_eq!(err, tessera::Status::internal("scripted"));
    assert_eq!(peer.requests::<CleanupAllRequest>().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn simulated_delays_run_on_tokio_time_and_respect_the_deadline() {
    let peer = simulated();
    peer.set_delay(Duration::from_millis(300));
    peer.reply_after::<RunGraphRequest>(
        Duration::from_millis(700),
        Ok(RunGraphResponse::default()),
    );

    // 300 ms for every call plus 700 ms for this reply: answered at exactly 1 s.
    let start = Instant::now();
    peer.run_graph(run_graph(1, &[]), short(Duration::from_secs(2)))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1));

    // A delay longer than the deadline is cut at the deadline.
    peer.set_delay(Duration::from_secs(60));
    let start = Instant::now();
    let err = peer
        .run_graph(run_graph(2, &[]), short(Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);
    assert!(err.message().contains("RunGraph within 5 s"), "{err}");
    assert_eq!(start.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn simulated_restart_brings_a_new_incarnation_and_aborts_old_keys() {
    let peer = simulated();
    let options = short(Duration::from_secs(1));
    let status = peer.get_status(GetStatusRequest {}, options).await.unwrap();
    let old = status.device_attributes[0].incarnation;
    assert_eq!(old, peer.incarnation());
    assert_eq!(
        status.device_attributes[0].name,
        "/job:ps/replica:0/task:0/device:CPU:0"
    );

    // A key as a worker's _Recv builds it from the ps's CPU:0 and its incarnation at the time.
    let key = |incarnation: u64| {
        format!(
            "/job:ps/replica:0/task:0/device:CPU:0;{incarnation:016x};\
             /job:worker/replica:0/task:1/device:CPU:0;edge_12_w/read;0:0"
        )
    };
    let recv = |incarnation: u64| RecvTensorRequest {
        step_id: 5,
        rendezvous_key: key(incarnation),
        ..Default::default()
    };
    peer.recv_tensor(recv(old), options).await.unwrap();

    let new = peer.restart();
    assert_ne!(new, old);
    assert_ne!(new, 0);
    let status = peer.get_status(GetStatusRequest {}, options).await.unwrap();
    assert_eq!(status.device_attributes[0].incarnation, new);

    // Even a scripted reply does not get past the incarnation check.
    peer.reply::<RecvTensorRequest>(Ok(RecvTensorResponse::default()));
    let err = peer.recv_tensor(recv(old), options).await.unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    let expected = format!(
        "RecvTensor expects a different device incarnation: {old} vs. {new}. Your worker job \
         (\"/job:ps/replica:0/task:0\") was probably restarted."
    );
    assert!(err.message().starts_with(&expected), "{err}");
    // Keys made after the restart are served (by the script still queued).
    peer.recv_tensor(recv(new), options).await.unwrap();
    assert_eq!(peer.requests::<RecvTensorRequest>().len(), 3);
}

// ---------------------------------------------------------------------------------------------
// PeerCache.

fn cluster() -> ClusterSpec {
    ClusterSpec::from_dense([
        ("ps", vec!["127.0.0.1:1"]),
        ("worker", vec!["127.0.0.1:2", "127.0.0.1:3"]),
    ])
}

struct NoWorker;

impl WorkerHandler for NoWorker {
    fn get_status(
        &self,
        _: GetStatusRequest,
        _: Option<Duration>,
    ) -> HandlerFuture<'_, GetStatusResponse> {
        Box::pin(async { Ok(GetStatusResponse::default()) })
    }
}

#[tokio::test]
async fn peer_cache_shares_one_peer_per_task_and_answers_the_own_task_locally() {
    let own = TaskId::new("worker", 0);
    let local = Arc::new(LocalPeer::new(own.clone(), Arc::new(NoWorker)));
    let cache = PeerCache::new(cluster(), local.clone(), &Timeouts::default()).unwrap();

    let own_peer = cache.get(&own).unwrap();
    let local_dyn: Arc<dyn Peer> = local.clone();
    assert!(
        Arc::ptr_eq(&own_peer, &local_dyn),
        "the own task is the local peer"
    );

    let ps = TaskId::new("ps", 0);
    let first = cache.get(&ps).unwrap();
    let again = cache.get(&ps).unwrap();
    assert!(Arc::ptr_eq(&first, &again), "one peer per task");
    assert_eq!(first.task(), &ps);
    let other = cache.get(&TaskId::new("worker", 1)).unwrap();
    assert!(!Arc::ptr_eq(&first, &other));
    assert_eq!(cache.all().unwrap().len(), 3);

    let err = cache.get(&TaskId::new("worker", 9)).err().unwrap();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().starts_with(
            "task /job:worker/replica:0/task:9 is not in the cluster: job \"worker\" has tasks \
             0, 1;"
        ),
        "{err}"
    );
}

#[tokio::test]
async fn peer_cache_refuses_an_own_task_outside_the_cluster() {
    let local = Arc::new(LocalPeer::new(TaskId::new("chief", 0), Arc::new(NoWorker)));
    let err = PeerCache::new(cluster(), local, &Timeouts::default())
        .err()
        .unwrap();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message()
            .contains("/job:chief/replica:0/task:0 must be in the cluster"),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn simulated_cluster_serves_a_cache_of_simulated_tasks() {
    let spec = cluster();
    let sim = SimulatedCluster::new(&spec);
    let own = TaskId::new("worker", 0);
    let cache = sim.peer_cache(&own).unwrap();
    let ps = TaskId::new("ps", 0);
    sim.peer(&ps).unwrap().set_unreachable(true);

    let err = cache
        .get(&ps)
        .unwrap()
        .get_status(GetStatusRequest {}, short(Duration::from_secs(1)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err
        .message()
        .starts_with("/job:ps/replica:0/task:0 at 127.0.0.1:1 unreachable"));

    cache
        .get(&own)
        .unwrap()
        .get_status(GetStatusRequest {}, short(Duration::from_secs(1)))
        .await
        .unwrap();
    assert_eq!(sim.peer(&own).unwrap().calls(), [Rpc::GetStatus]);
    assert_eq!(sim.peers().count(), 3);
}
