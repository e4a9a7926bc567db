//! The remote client (`Session::connect("grpc://host:port")`) against a fake MasterService
//! backed by in-process sessions: what goes on the wire (CreateSession carrying the first
//! graph, ExtendSession carrying only new nodes and the version, RunStep asking for errors in
//! the body), how replies are read (fetches matched by name, errors from the body and from
//! gRPC status), callables, close, and the failures of the connection itself (malformed
//! target, dead address, silent master, async context), each within its deadline.
//!
//! Expected values are worked out by hand from the graph
//! `y = x · w`, `w = [[1, 2], [3, 4], [5, 6]]` (TensorFlow's `session` golden scenario):
//! `x = [[1, 2, 3]]` gives `y = [[22, 28]]`; `x = [[2, 2, 2]]` gives `y = [[18, 24]]`.

use std::net::TcpListener;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::fake_master::{Call, FakeMaster};
use tessera::client::{ConnectOptions, Session};
use tessera::graph::Graph;
use tessera::proto::{CallableOptions, GraphDef};
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::Code;

/// `x` [?, 3] float placeholder, `w` the constant above, `y = MatMul(x, w)`.
fn matmul_graph() -> Graph {
    let mut g = Graph::new();
    let x = g
        .placeholder("x", DType::Float, PartialShape::new(vec![None, Some(3)]))
        .unwrap();
    let w = g
        .constant(&Tensor::from_vec(vec![3, 2], vec![1f32, 2., 3., 4., 5., 6.]).unwrap())
        .unwrap();
    let y = g.matmul(&x, &w).unwrap();
    assert_eq!((x.node.as_str(), y.node.as_str()), ("x", "MatMul"));
    g
}

/// The nodes of `g` from the `from`-th on: what a client sends when the graph grew.
fn nodes_since(g: &Graph, from: usize) -> GraphDef {
    let mut def = g.to_graph_def();
    def.node.drain(..from);
    def
}

fn row(values: [f32; 3]) -> Tensor {
    Tensor::from_vec(vec![1, 3], values.to_vec()).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.values::<f32>().unwrap().to_vec()
}

#[test]
fn the_first_extend_creates_the_session_and_later_ones_send_only_new_nodes() {
    let master = FakeMaster::start();
    let sess = Session::connect(&master.target()).unwrap();
    assert_eq!(sess.target(), master.target());
    assert!(sess.device().is_none());

    let mut g = matmul_graph();
    sess.extend(&g.to_graph_def()).unwrap();
    assert_eq!(sess.graph_version(), 0);
    let sent = g.nodes().len();
    let y = g.tensor("MatMul").unwrap();
    let z = g.add(&y, &y).unwrap();
    sess.extend(&nodes_since(&g, sent)).unwrap();
    assert_eq!(sess.graph_version(), 1);

    // Two fetches; the fake master answers them in reverse order.
    let fetched = sess
        .run(&[("x:0", row([1., 2., 3.]))], &["MatMul:0", &z.name()], &[])
        .unwrap();
    assert_eq!(values(&fetched[0]), [22., 28.]);
    assert_eq!(values(&fetched[1]), [44., 56.]);
    assert_eq!(fetched[0].shape().dims(), [1, 2]);

    let calls = master.calls();
    let Call::Create(create) = &calls[0] else {
        panic!("{:?}", calls[0])
    };
    let created: Vec<&str> = create
        .graph_def
        .as_ref()
        .unwrap()
        .node
        .iter()
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(created, ["x", "Const", "MatMul"]);
    assert_eq!(create.target, master.target());
    let Call::Extend(extend) = &calls[1] else {
        panic!("{:?}", calls[1])
    };
    let added: Vec<&str> = extend
        .graph_def
        .as_ref()
        .unwrap()
        .node
        .iter()
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(added, [z.node.as_str()]);
    assert_eq!(extend.current_graph_version, 0);
    let Call::RunStep(step) = &calls[2] else {
        panic!("{:?}", calls[2])
    };
    assert!(step.store_errors_in_response_body);
    assert_eq!(step.fetch, ["MatMul:0".to_string(), z.name()]);
    assert_eq!(step.feed[0].name, "x:0");
    // The feed travels as raw little-endian bytes, as TensorFlow's client sends it.
    assert_eq!(
        step.feed[0].tensor.as_ref().unwrap().tensor_content.len(),
        12
    );
    assert_eq!(step.session_handle, create_handle(&sess));
}

fn create_handle(sess: &Session) -> String {
    sess.as_remote().unwrap().session_handle().unwrap()
}

#[test]
fn a_step_before_any_extend_creates_an_empty_session() {
    let master = FakeMaster::start();
    let sess = Session::connect(&master.target()).unwrap();
    let fetched = sess.run(&[], &[], &[]).unwrap();
    assert!(fetched.is_empty());
    let calls = master.calls();
    let Call::Create(create) = &calls[0] else {
        panic!("{:?}", calls[0])
    };
    assert!(create.graph_def.as_ref().unwrap().node.is_empty());
    let devices = sess.as_remote().unwrap().list_devices().unwrap();
    assert_eq!(
        devices[0].name,
        "/job:localhost/replica:0/task:0/device:CPU:0"
    );
}

#[test]
fn step_errors_keep_their_code_from_the_body_and_from_grpc_status() {
    let master = FakeMaster::start();
    let sess = Session::connect(&master.target()).unwrap();
    sess.extend(&matmul_graph().to_graph_def()).unwrap();
    for in_status in [false, true] {
        master.errors_in_status(in_status);
        let err = sess.run(&[], &["nope:0"], &[]).unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "in status: {in_status}: {err}");
        assert!(err.message().contains("nope"), "{err}");

        let wrong = Tensor::from_vec(vec![1, 3], vec![1i32, 2, 3]).unwrap();
        let err = sess.run(&[("x:0", wrong)], &["MatMul:0"], &[]).unwrap_err();
        assert_eq!(
            err.code(),
            Code::InvalidArgument,
            "in status: {in_status}: {err}"
        );
        assert!(err.message().contains("x"), "{err}");
    }
    // The session still works after failed steps.
    let fetched = sess
        .run(&[("x", row([1., 2., 3.]))], &["MatMul"], &[])
        .unwrap();
    assert_eq!(values(&fetched[0]), [22., 28.]);
}

#[test]
fn a_duplicate_node_name_fails_the_extend_and_keeps_the_version() {
    let master = FakeMaster::start();
    let first = Session::connect(&master.target()).unwrap();
    first.extend(&matmul_graph().to_graph_def()).unwrap();
    // Extending with a name already taken fails and leaves the version alone.
    let err = first.extend(&nodes_since(&matmul_graph(), 2)).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("MatMul"), "{err}");
    assert_eq!(first.graph_version(), 0);
}

#[test]
fn callables_run_with_feeds_in_order_and_release() {
    let master = FakeMaster::start();
    let sess = Session::connect(&master.target()).unwrap();
    sess.extend(&matmul_graph().to_graph_def()).unwrap();
    let handle = sess
        .make_callable(CallableOptions {
            feed: vec!["x:0".into()],
            fetch: vec!["MatMul:0".into()],
            ..Default::default()
        })
        .unwrap();
    let fetched = sess.run_callable(handle, vec![row([2., 2., 2.])]).unwrap();
    assert_eq!(values(&fetched[0]), [18., 24.]);
    sess.release_callable(handle).unwrap();
    let err = sess
        .run_callable(handle, vec![row([2., 2., 2.])])
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    let kinds: Vec<&str> = master
        .calls()
        .iter()
        .map(|c| match c {
            Call::Create(_) => "create",
            Call::MakeCallable(_) => "make",
            Call::RunCallable(_) => "run",
            Call::ReleaseCallable(_) => "release",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["create", "make", "run", "release", "run"]);
}

#[test]
fn close_ends_the_master_session_and_later_calls_fail() {
    let master = FakeMaster::start();
    let sess = Session::connect(&master.target()).unwrap();
    sess.extend(&matmul_graph().to_graph_def()).unwrap();
    assert_eq!(master.open_sessions(), 1);
    sess.close().unwrap();
    assert_eq!(master.open_sessions(), 0);
    let err = sess.run(&[], &["MatMul:0"], &[]).unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    sess.close().unwrap();
    let closes = master
        .calls()
        .iter()
        .filter(|c| matches!(c, Call::Close(_)))
        .count();
    assert_eq!(closes, 1);

    // Dropping an open session closes it too.
    let dropped = Session::connect(&master.target()).unwrap();
    dropped.extend(&matmul_graph().to_graph_def()).unwrap();
    assert_eq!(master.open_sessions(), 1);
    drop(dropped);
    assert_eq!(master.open_sessions(), 0);
}

#[test]
fn steps_from_several_threads_share_one_session() {
    let master = FakeMaster::start();
    let sess = Arc::new(Session::connect(&master.target()).unwrap());
    sess.extend(&matmul_graph().to_graph_def()).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let sess = Arc::clone(&sess);
            thread::spawn(move || {
                for _ in 0..5 {
                    let v = i as f32;
                    let fetched = sess
                        .run(&[("x:0", row([v, v, v]))], &["MatMul:0"], &[])
                        .unwrap();
                    // [v, v, v] · w = [9v, 12v].
                    assert_eq!(values(&fetched[0]), [9. * v, 12. * v]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn malformed_targets_are_invalid_arguments_naming_them() {
    for target in [
        "localhost:2222",
        "grpc://localhost",
        "grpc://localhost:99999",
        "grpc://:1",
    ] {
        let err = Session::connect(target).err().unwrap();
        assert_eq!(err.code(), Code::InvalidArgument, "{target}: {err}");
        assert!(err.message().contains(target), "{err}");
    }
}

#[test]
fn a_dead_master_is_unavailable_naming_its_address_within_the_deadline() {
    // A port nobody listens on: bind one, then free it.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let target = format!("grpc://127.0.0.1:{port}");
    let options = ConnectOptions {
        connect_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let started = Instant::now();
    let err = Session::connect_with(&target, options).err().unwrap();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(
        err.message().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_master_that_goes_away_fails_the_next_call_as_unavailable() {
    let master = FakeMaster::start();
    let target = master.target();
    let sess = Session::connect_with(
        &target,
        ConnectOptions {
            connect_timeout: Duration::from_secs(2),
            call_timeout: Duration::from_secs(5),
            ..Default::default()
        },
    )
    .unwrap();
    sess.extend(&matmul_graph().to_graph_def()).unwrap();
    drop(master);
    let started = Instant::now();
    let err = sess
        .run(&[("x:0", row([1., 2., 3.]))], &["MatMul:0"], &[])
        .unwrap_err();
    assert!(
        matches!(err.code(), Code::Unavailable | Code::Cancelled),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(7),
        "{:?}",
        started.elapsed()
    );
    if err.code() == Code::Unavailable {
        assert!(err.message().contains(&target), "{err}");
    }
}

#[test]
fn a_silent_master_fails_within_the_deadlines_naming_its_address() {
    // Bound and listening, so the kernel completes TCP handshakes, but never accepted: no
    // HTTP/2 answer ever comes.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let target = format!("grpc://{addr}");
    let options = ConnectOptions {
        connect_timeout: Duration::from_millis(500),
        call_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let started = Instant::now();
    let err = match Session::connect_with(&target, options) {
        Err(e) => e,
        Ok(sess) => sess.extend(&matmul_graph().to_graph_def()).unwrap_err(),
    };
    assert!(
        matches!(err.code(), Code::Unavailable | Code::DeadlineExceeded),
        "{err}"
    );
    assert!(err.message().contains(&addr.to_string()), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn calls_from_inside_an_async_runtime_fail_instead_of_panicking() {
    let master = FakeMaster::start();
    let sess = Session::connect(&master.target()).unwrap();
    sess.extend(&matmul_graph().to_graph_def()).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = runtime
        .block_on(async { sess.run(&[("x:0", row([1., 2., 3.]))], &["MatMul:0"], &[]) })
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("spawn_blocking"), "{err}");
    // From a plain thread it works again.
    let fetched = sess
        .run(&[("x:0", row([1., 2., 3.]))], &["MatMul:0"], &[])
        .unwrap();
    assert_eq!(values(&fetched[0]), [22., 28.]);
}

#[test]
fn a_tensor_fetched_twice_is_returned_twice() {
    // Two hooks of a monitored session both read the global step in one step.
    let server = tessera::server::Server::local().unwrap();
    let session = Session::connect(&server.target()).unwrap();
    let mut g = Graph::new();
    let c = g.constant(&Tensor::scalar(7i64)).unwrap();
    session.extend(&g.to_graph_def()).unwrap();
    let (tensor, node) = (c.name(), c.node.clone());
    // `Const` and `Const:0` are one tensor too.
    let out = session.run(&[], &[&tensor, &node, &tensor], &[]).unwrap();
    let got: Vec<i64> = out
        .iter()
        .map(|t| t.scalar_value::<i64>().unwrap())
        .collect();
    assert_eq!(got, [7, 7, 7]);
    session.close().unwrap();
    server.stop();
}

#[test]
fn a_step_carries_its_deadline_in_run_options_never_longer_than_the_sessions() {
    let master = FakeMaster::start();
    let config = |ms| tessera::proto::ConfigProto {
        operation_timeout_in_ms: ms,
        ..Default::default()
    };
    for (operation_timeout_ms, expected_ms) in [(0, 7_000), (1_500, 1_500), (60_000, 7_000)] {
        let sess = Session::connect_with(
            &master.target(),
            ConnectOptions {
                call_timeout: Duration::from_secs(7),
                config: config(operation_timeout_ms),
                ..Default::default()
            },
        )
        .unwrap();
        sess.extend(&matmul_graph().to_graph_def()).unwrap();
        sess.run(&[("x:0", row([1., 2., 3.]))], &["MatMul:0"], &[])
            .unwrap();
        let calls = master.calls();
        let Some(Call::RunStep(step)) = calls.last() else {
            panic!("{:?}", calls.last())
        };
        assert_eq!(
            step.options.as_ref().map(|o| o.timeout_in_ms),
            Some(expected_ms),
            "operation_timeout_in_ms {operation_timeout_ms}"
        );
    }
}

#[test]
fn a_step_that_waits_past_the_sessions_operation_timeout_fails_at_it() {
    let server = tessera::server::Server::local().unwrap();
    let sess = Session::connect_with(
        &server.target(),
        ConnectOptions {
            call_timeout: Duration::from_secs(60),
            config: tessera::proto::ConfigProto {
                operation_timeout_in_ms: 300,
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    // A dequeue from a queue nobody fills waits until the step's deadline.
    let mut g = Graph::new();
    let q = g
        .fifo_queue("q", &[DType::Float], &[], None, "", None)
        .unwrap();
    let out = g.queue_dequeue("take", &q, &[DType::Float]).unwrap();
    sess.extend(&g.to_graph_def()).unwrap();
    let started = Instant::now();
    let err = sess.run(&[], &[&out[0].name()], &[]).unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the step ran for {:?} against a 300 ms operation timeout",
        started.elapsed()
    );
}
