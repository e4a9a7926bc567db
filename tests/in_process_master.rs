//! A client in the same process as a task reaches the task's master through its mailbox, not
//! gRPC on loopback (TensorFlow's `LocalMaster`; `tessera train`'s own client steps this way).
//!
//! The job is `support::training`'s: `w` on the ps, updated from two workers, whose two steps
//! are worked out by hand. Run in process and over gRPC (`rpc_options.
//! use_rpc_for_inprocess_master`) on the same cluster, it gives the same answers; the worker's
//! `tessera_received_bytes_total{rpc="RunStep"}` shows which way the steps went. A client the
//! gRPC front would refuse (no token, a wrong one, a certificate that is not the task's) is
//! sent there and meets its checks, and a stopped task fails an in-process session's next
//! call with UNAVAILABLE, not a hang.

use std::time::Duration;

use crate::support::certs::Pki;
use crate::support::cluster::{InProcessCluster, TEST_TIMEOUTS};
use crate::support::prometheus::{parse, scrape, value};
use crate::support::training;
use tessera::client::{ConnectOptions, Session};
use tessera::proto::{ConfigProto, RpcOptions};
use tessera::security::ClusterToken;
use tessera::Code;

const TOKEN: &str = "in-process-master-token-0123456789";

fn options(over_grpc: bool, token: Option<ClusterToken>) -> ConnectOptions {
    ConnectOptions {
        connect_timeout: Duration::from_secs(10),
        call_timeout: Duration::from_secs(60),
        config: ConfigProto {
            rpc_options: Some(RpcOptions {
                use_rpc_for_inprocess_master: over_grpc,
                ..Default::default()
            }),
            ..Default::default()
        },
        token,
        ..Default::default()
    }
}

fn in_process(sess: &Session) -> bool {
    sess.as_remote().expect("a remote session").is_in_process()
}

/// Threads of this process named as a session's client runtime names its thread.
fn client_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim_end() == "tessera-client")
        .count()
}

/// The RunStep bytes the worker's gRPC front received, from its metrics endpoint.
fn run_step_bytes(cluster: &InProcessCluster) -> f64 {
    let worker = cluster.servers.iter().find(|s| s.task().job == "worker");
    let endpoint = worker
        .and_then(|w| w.metrics_addr())
        .expect("metrics are on");
    let samples = parse(&scrape(endpoint));
    value(
        &samples,
        "tessera_received_bytes_total",
        &[("task", "/job:worker/replica:0/task:0"), ("rpc", "RunStep")],
    )
}

#[test]
fn a_client_beside_its_task_steps_through_the_master_without_grpc_with_the_same_answers() {
    let extra = format!("{TEST_TIMEOUTS}\n[metrics]\nlisten = \"127.0.0.1:0\"\n");
    let cluster = InProcessCluster::start_with(&[("ps", 1), ("worker", 2)], &extra);
    let target = cluster.target("worker", 0);
    let job = training::job(2).unwrap();

    let local = Session::connect_with(&target, options(false, None)).unwrap();
    assert!(in_process(&local));
    assert_eq!(
        client_threads(),
        0,
        "an in-process session runs its calls on the caller's thread"
    );
    let before = run_step_bytes(&cluster);
    let seen = training::run_two_steps(&local, &job).unwrap();
    assert_eq!(seen, training::expected_two_steps());
    assert_eq!(
        run_step_bytes(&cluster),
        before,
        "in-process steps crossed the gRPC front"
    );
    local.close().unwrap();

    // The same job over gRPC, asked for by the session's config, from a fresh initialisation:
    // the same answers, and this time the front counts the steps.
    let remote = Session::connect_with(&target, options(true, None)).unwrap();
    assert!(!in_process(&remote));
    assert_eq!(
        client_threads(),
        1,
        "a gRPC session keeps its connection on a thread"
    );
    let seen = training::run_two_steps(&remote, &job).unwrap();
    assert_eq!(seen, training::expected_two_steps());
    assert!(run_step_bytes(&cluster) > before);
    remote.close().unwrap();

    // `localhost` names the same task.
    let port = cluster.addr("worker", 0).port();
    let by_name = Session::connect_with(&format!("grpc://localhost:{port}"), options(false, None));
    assert!(in_process(&by_name.unwrap()));
}

#[test]
fn a_client_the_front_would_refuse_goes_over_grpc_and_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("token");
    std::fs::write(&path, TOKEN).unwrap();
    let extra = format!(
        "{TEST_TIMEOUTS}\n[auth]\ntoken_file = \"{}\"\n",
        path.display()
    );
    let cluster = InProcessCluster::start_with(&[("ps", 1), ("worker", 2)], &extra);
    let target = cluster.target("worker", 0);
    let job = training::job(2).unwrap();

    let wrong = ClusterToken::new("not-the-cluster-token-987654").unwrap();
    for token in [None, Some(wrong)] {
        let sess = Session::connect_with(&target, options(false, token)).unwrap();
        assert!(!in_process(&sess));
        let err = sess.extend(&job.graph.to_graph_def()).unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{err}");
    }

    let right = ClusterToken::new(TOKEN).unwrap();
    let sess = Session::connect_with(&target, options(false, Some(right))).unwrap();
    assert!(in_process(&sess));
    let seen = training::run_two_steps(&sess, &job).unwrap();
    assert_eq!(seen, training::expected_two_steps());
}

#[test]
fn over_tls_only_a_client_holding_the_tasks_own_certificate_skips_the_front() {
    let pki = Pki::new("cluster");
    let leaf = pki.leaf("worker");
    let extra = format!("{TEST_TIMEOUTS}{}", pki.tls_section(&leaf));
    let cluster = InProcessCluster::start_with(&[("ps", 1), ("worker", 1)], &extra);
    let target = format!("grpcs://{}", cluster.addr("worker", 0));
    let job = training::job(1).unwrap();
    let with_tls = |tls| ConnectOptions {
        tls: Some(tls),
        ..options(false, None)
    };

    // The task's own CA, certificate and key: the handshake would pass both ways.
    let own = Session::connect_with(&target, with_tls(pki.client(Some(&leaf)))).unwrap();
    assert!(in_process(&own));
    let seen = training::run_two_steps(&own, &job).unwrap();
    assert_eq!(seen, training::expected_two_steps());

    // Another member's certificate goes through the handshake, and passes it.
    let member = pki.leaf("member");
    let other = Session::connect_with(&target, with_tls(pki.client(Some(&member)))).unwrap();
    assert!(!in_process(&other));
    assert_eq!(other.as_remote().unwrap().list_devices().unwrap().len(), 1);

    // A stranger's goes through it too, and is refused there.
    let strangers = Pki::new("other");
    let stranger = strangers.leaf("stranger");
    let tls = pki
        .client(None)
        .with_identity(&stranger.cert, &stranger.key)
        .unwrap();
    let err = Session::connect_with(&target, with_tls(tls))
        .and_then(|s| s.as_remote().unwrap().list_devices().map(|_| ()))
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");

    // Plain text to a TLS port is refused as before.
    let plain = Session::connect_with(
        &format!("grpc://{}", cluster.addr("worker", 0)),
        options(false, None),
    )
    .and_then(|s| s.as_remote().unwrap().list_devices().map(|_| ()));
    assert!(plain.is_err());
}

#[test]
fn a_stopped_task_fails_in_process_calls_as_unavailable() {
    let cluster = InProcessCluster::start(&[("ps", 1), ("worker", 1)]);
    let target = cluster.target("worker", 0);
    let job = training::job(1).unwrap();
    let sess = Session::connect_with(&target, options(false, None)).unwrap();
    assert!(in_process(&sess));
    sess.extend(&job.graph.to_graph_def()).unwrap();
    sess.run(&[], &[], &[&job.init]).unwrap();

    let worker = cluster
        .servers
        .iter()
        .find(|s| s.task().job == "worker")
        .unwrap();
    worker.stop();
    let err = sess
        .run(&[(&job.x, training::batch())], &[], &[&job.train])
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(
        err.message()
            .contains("the master of /job:worker/replica:0/task:0"),
        "{err}"
    );
    // A stopped task is no longer in the registry: a new session goes over gRPC and finds
    // nobody there.
    let err = Session::connect_with(&target, options(false, None)).err();
    assert_eq!(err.map(|e| e.code()), Some(Code::Unavailable));
}
