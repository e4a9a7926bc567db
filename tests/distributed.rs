//! A real cluster on loopback: 1 ps and 2 worker `tessera serve` processes (started by
//! `support::cluster`, each on a port the harness bound and passed by socket activation),
//! driven by remote sessions.
//!
//! The end-to-end test builds one graph with its variables on `/job:ps/task:0` and its
//! computation on both workers, trains a few steps through worker 1's master, and checks every
//! fetched value against the same graph run in process by `Session::local()` bit for bit (the
//! same kernels run the same ops on the same inputs, wherever they are placed). A second
//! client, on worker 0's master, then sees the same variable values: they live on the ps,
//! shared by every session. Bad requests fail with their code and leave the daemons serving.

use std::time::Duration;

use crate::support::cluster::{killed_by, wait_with_deadline, Cluster, BIN};
use tessera::client::Session;
use tessera::graph::Graph;
use tessera::proto::worker_service_client::WorkerServiceClient;
use tessera::proto::GetStatusRequest;
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::{Code, Result};

const RPC_DEADLINE: Duration = Duration::from_secs(10);

#[test]
fn the_harness_serves_each_task_on_its_pre_bound_port_and_stops_it() {
    let mut cluster = Cluster::start(&[("ps", 1), ("worker", 2)]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (job, index) in [("ps", 0), ("worker", 0), ("worker", 1)] {
        let addr = cluster.addr(job, index);
        let devices = runtime.block_on(async {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect_timeout(RPC_DEADLINE)
                .timeout(RPC_DEADLINE)
                .connect()
                .await
                .unwrap_or_else(|e| panic!("connect to /job:{job}/task:{index} at {addr}: {e}"));
            WorkerServiceClient::new(channel)
                .get_status(GetStatusRequest {})
                .await
                .unwrap()
                .into_inner()
                .device_attributes
        });
        assert_eq!(
            devices[0].name,
            format!("/job:{job}/replica:0/task:{index}/device:CPU:0")
        );
    }
    // SIGTERM drains and exits 0; SIGKILL is a crash.
    let status = cluster.terminate("worker", 1);
    assert!(status.success(), "worker 1 after SIGTERM: {status:?}");
    let status = cluster.kill("ps", 0);
    assert!(
        killed_by(status, libc::SIGKILL),
        "ps 0 after SIGKILL: {status:?}"
    );
    assert!(cluster.is_running("worker", 0));
}

#[test]
fn socket_activation_with_more_than_one_socket_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cluster.toml");
    std::fs::write(
        &config,
        "[cluster]\nps = [\"127.0.0.1:0\"]\n[devices]\ngpu = 0\n",
    )
    .unwrap();
    let child = std::process::Command::new("/bin/sh")
        .args(["-c", r#"LISTEN_PID=$$ exec "$0" "$@""#])
        .arg(BIN)
        .args(["serve", "--config"])
        .arg(&config)
        .env("LISTEN_FDS", "2")
        .env("TESSERA__TASK__JOB", "ps")
        .env("TESSERA__TASK__INDEX", "0")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = child;
    let stderr = child.stderr.take().unwrap();
    let status = wait_with_deadline(child, "tessera serve with LISTEN_FDS=2");
    let mut message = String::new();
    std::io::Read::read_to_string(&mut { stderr }, &mut message).unwrap();
    assert_eq!(status.code(), Some(1), "{message}");
    assert!(message.contains("LISTEN_FDS=2"), "{message}");
}

/// The names a test fetches and runs.
struct Model {
    graph: Graph,
    x: String,
    init: String,
    train: String,
    /// The sum of both workers' products, fetched each step.
    sum: String,
    /// Reads of the ps variables: w0, w1, the step counter.
    reads: Vec<String>,
}

/// `s = x·w0 (on worker 0) + x·w1 (on worker 1)`; each step moves `w0` by
/// `-lr · xᵀs` (computed on worker 0) and `w1` by `-lr · xᵀ(x·w1)` (on worker 1) with
/// ResourceApplyGradientDescent, and adds 1 to `count` with AssignAddVariableOp; all three
/// variables live on the ps.
fn model() -> Result<Model> {
    let mut g = Graph::new();
    let (w0, w1, count) = g.with_device("/job:ps/task:0", |g| {
        let i0 = g.constant(&Tensor::from_vec(
            vec![3, 2],
            vec![0.5f32, -1.25, 2.0, 0.75, -0.3, 1.1],
        )?)?;
        let w0 = g.variable("w0", &i0)?;
        let i1 = g.constant(&Tensor::from_vec(
            vec![3, 2],
            vec![-0.7f32, 0.2, 0.05, -1.5, 0.9, 0.333],
        )?)?;
        let w1 = g.variable("w1", &i1)?;
        let zero = g.scalar("zero", DType::Float, 0.0)?;
        let count = g.variable("count", &zero)?;
        Ok((w0, w1, count))
    })?;
    let init = g.global_variables_initializer()?;
    let x = g.placeholder("x", DType::Float, PartialShape::new(vec![None, Some(3)]))?;
    let lr = g.scalar("lr", DType::Float, 0.1)?;
    let one = g.scalar("one", DType::Float, 1.0)?;
    let h0 = g.with_device("/job:worker/task:0", |g| g.matmul(&x, &w0.value))?;
    let (h1, sum) = g.with_device("/job:worker/task:1", |g| {
        let h1 = g.matmul(&x, &w1.value)?;
        let sum = g.add(&h0, &h1)?;
        Ok((h1, sum))
    })?;
    let g0 = g.with_device("/job:worker/task:0", |g| g.matmul_t(&x, &sum, true, false))?;
    let g1 = g.with_device("/job:worker/task:1", |g| g.matmul_t(&x, &h1, true, false))?;
    let up0 = g.apply_gradient_descent(&w0.handle, &lr, &g0)?;
    let up1 = g.apply_gradient_descent(&w1.handle, &lr, &g1)?;
    let inc = g.assign_add_variable(&count.handle, &one)?;
    let train = g.group("train", &[&up0, &up1, &inc])?;
    Ok(Model {
        graph: g,
        x: x.name(),
        init,
        train,
        sum: sum.name(),
        reads: vec![w0.value.name(), w1.value.name(), count.value.name()],
    })
}

/// A batch of 2 for step `k`: values with fractional parts, so rounding matters.
fn batch(k: usize) -> Tensor {
    let values = (0..6)
        .map(|i| ((k * 7 + i * 3) % 11) as f32 / 8.0 - 0.6)
        .collect();
    Tensor::from_vec(vec![2, 3], values).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.values::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

fn refs(names: &[String]) -> Vec<&str> {
    names.iter().map(String::as_str).collect()
}

/// Runs the model's init and `steps` training steps; returns what each step fetched (the sum,
/// then the variables after it) as bit patterns.
fn train(sess: &Session, m: &Model, steps: usize) -> Vec<Vec<Vec<u32>>> {
    sess.run(&[], &[], &[&m.init]).unwrap();
    (0..steps)
        .map(|k| {
            let sum = sess
                .run(&[(&m.x, batch(k))], &[&m.sum], &[&m.train])
                .unwrap_or_else(|e| panic!("step {k}: {e}"));
            let mut fetched = vec![bits(&sum[0])];
            let vars = sess.run(&[], &refs(&m.reads), &[]).unwrap();
            fetched.extend(vars.iter().map(bits));
            fetched
        })
        .collect()
}

#[test]
fn a_graph_over_ps_and_two_workers_matches_the_in_process_session_bit_for_bit() {
    let m = model().unwrap();
    let local = Session::local();
    local.extend(&m.graph.to_graph_def()).unwrap();
    let expected = train(&local, &m, 4);
    // The counter counts steps, so the updates really ran: 4 steps → 4.0.
    assert_eq!(expected[3][3], [4.0f32.to_bits()]);

    let cluster = Cluster::start(&[("ps", 1), ("worker", 2)]);
    let remote = Session::connect(&cluster.target("worker", 1)).unwrap();
    remote.extend(&m.graph.to_graph_def()).unwrap();
    let got = train(&remote, &m, 4);
    for (k, (got, want)) in got.iter().zip(&expected).enumerate() {
        for (i, name) in std::iter::once(&m.sum).chain(&m.reads).enumerate() {
            assert_eq!(
                got[i], want[i],
                "step {k}: `{name}` differs from the in-process run"
            );
        }
    }

    // A second client, on worker 0's master, sees the variables the first one trained.
    let second = Session::connect(&cluster.target("worker", 0)).unwrap();
    second.extend(&m.graph.to_graph_def()).unwrap();
    let seen = second.run(&[], &refs(&m.reads), &[]).unwrap();
    let seen: Vec<Vec<u32>> = seen.iter().map(bits).collect();
    assert_eq!(
        seen,
        expected[3][1..],
        "the second session sees other values on the ps"
    );

    // Bad requests fail with their code and a message, and the daemons keep serving.
    let err = remote.run(&[], &["no_such_node:0"], &[]).unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    assert!(err.message().contains("no_such_node"), "{err}");
    let wrong = Tensor::from_vec(vec![2, 3], vec![1i32; 6]).unwrap();
    let err = remote.run(&[(&m.x, wrong)], &[&m.sum], &[]).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    let sum = remote.run(&[(&m.x, batch(0))], &[&m.sum], &[]).unwrap();
    assert_eq!(sum[0].dims(), [2, 2]);
    let sum = second.run(&[(&m.x, batch(0))], &[&m.sum], &[]).unwrap();
    assert_eq!(sum[0].dims(), [2, 2]);

    remote.close().unwrap();
    second.close().unwrap();
}
