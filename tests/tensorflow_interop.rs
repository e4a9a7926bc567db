//! Stock TensorFlow against tessera, live: TensorFlow 2's `tf.compat.v1.Session` client, and
//! TensorFlow's own gRPC server as a cluster task, talking to `tessera serve` processes over
//! TensorFlow's MasterService and WorkerService (`tests/tensorflow_interop.py` is TensorFlow's
//! side). The first three train one MLP with Adam and a global step, the variables on the
//! ps, and must match TensorFlow training it alone in the client's process:
//!
//! - a TensorFlow client on a tessera cluster (tessera's master, worker and ps);
//! - a TensorFlow ps under a tessera worker: tessera's master registers and runs the ps's
//!   partition on TensorFlow's worker service, and each side pulls tensors from the other;
//! - a TensorFlow worker (its master) with a tessera ps: TensorFlow drives tessera;
//! - TensorFlow 1's `MonitoredTrainingSession` as chief on a tessera cluster: it initialises,
//!   saves checkpoints (tessera's ps writes them, TensorFlow reads them), and after the
//!   cluster is replaced restores from them and goes on;
//! - two TensorFlow workers training synchronously with `SyncReplicasOptimizer` (its
//!   accumulators, token queue and chief queue runner) on a tessera ps and workers;
//! - tessera's Rust client on TensorFlow's server: a graph built with tessera's builder
//!   (gradients and optimizer included) trains on TensorFlow's runtime as on tessera's;
//! - a TensorFlow client traces a training step on a tessera cluster
//!   (`RunOptions(trace_level=FULL_TRACE)`) and draws it with TensorFlow's own `timeline`:
//!   both tasks' devices are in the trace; and the same with TensorFlow's master and worker
//!   over a tessera ps, whose step stats TensorFlow's master merges.
//!
//! They need a Python with TensorFlow (`$TESSERA_TF_PYTHON`, else `python3`); without one
//! they print why and pass, except under CI, where they fail (`support::requirement`).
//! `scripts/test` installs `tensorflow-cpu` in a virtual environment for them.

use std::net::SocketAddr;
use std::process::{Command, Stdio};

use crate::support::cluster::{Bound, Cluster, TEST_TIMEOUTS};
use crate::support::mlp;
use crate::support::tensorflow::{tensorflow_python, Client, TfServer, Trained};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tensorflow_interop.py");
/// The steps the script trains.
const STEPS: i64 = 150;

/// Starts TensorFlow's server as task 0 of `job`, in a cluster of one ps and one worker at
/// `ps` and `worker` (no ps job when `ps` is empty; its own address ends in `:0`).
fn tf_server(python: &str, job: &str, ps: &str, worker: &str) -> TfServer {
    TfServer::start(
        python,
        SCRIPT,
        &["server", job, "--ps", ps, "--worker", worker],
    )
}

/// Starts the script's client `args` for the cluster (`ps`, `workers`).
fn start_client(python: &str, ps: SocketAddr, workers: &str, args: &[String]) -> Client {
    let mut command = Command::new(python);
    command.arg(SCRIPT).args(args);
    command.args(["--ps", &ps.to_string(), "--worker", workers]);
    command.stdin(Stdio::null());
    Client::spawn(command)
}

impl Trained {
    /// The MLP trained on the ps's variables as TensorFlow trains it alone: every step
    /// counted, the same first loss (the same seeded initial weights, whichever side drew
    /// them, and the same forward pass), a last loss below a tenth of it and within 0.1 % of
    /// TensorFlow's (150 Adam steps compound float differences in the last places: about
    /// 1e-6 where measured), the training set learned.
    fn assert_trained(&self) {
        assert_eq!(
            self.json["global_step"].as_i64(),
            Some(STEPS),
            "{}",
            self.json
        );
        let (first, last) = (self.f64("first_loss"), self.f64("last_loss"));
        let reference = self.f64("reference_first_loss");
        assert!(
            (first - reference).abs() <= 1e-5 * reference,
            "first loss {first}, TensorFlow's {reference}"
        );
        assert!(last < first / 10.0, "loss {first} -> {last}");
        let reference = self.f64("reference_last_loss");
        assert!(
            (last - reference).abs() <= 1e-3 * reference,
            "last loss {last}, TensorFlow's {reference}"
        );
        assert!(self.f64("accuracy") >= 0.95, "{}", self.json);
        assert_eq!(self.strings("variable_devices"), vec!["/job:ps/task:0"]);
    }
}

/// Runs the TensorFlow client's training against the worker at `worker`.
fn train(python: &str, ps: SocketAddr, worker: SocketAddr, cluster_def: bool) -> Trained {
    let mut args = vec!["train".to_string()];
    if !cluster_def {
        args.push("--no-cluster-def".into());
    }
    client(python, ps, worker, &args)
}

/// Runs the script's client `args` for the cluster (`ps`, `worker`); returns its JSON line.
fn client(python: &str, ps: SocketAddr, worker: SocketAddr, args: &[String]) -> Trained {
    client_of(python, ps, &worker.to_string(), args)
}

/// Runs the script's client `args` for the cluster (`ps`, `workers`: `host:port,...`).
fn client_of(python: &str, ps: SocketAddr, workers: &str, args: &[String]) -> Trained {
    start_client(python, ps, workers, args).finish()
}

#[test]
fn a_tensorflow_client_trains_on_a_tessera_cluster() {
    let Some(python) = tensorflow_python("tensorflow client") else {
        return;
    };
    let cluster = Cluster::start(&[("ps", 1), ("worker", 1)]);
    let (ps, worker) = (cluster.addr("ps", 0), cluster.addr("worker", 0));
    let trained = train(&python, ps, worker, true);
    trained.assert_trained();
    // The session lists tessera's devices of the whole cluster.
    let devices = trained.strings("devices");
    for task in ["/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"] {
        let cpu = format!("{task}/device:CPU:0");
        assert!(devices.contains(&cpu), "{cpu} not in {devices:?}");
    }
}

/// Checks what the script's `trace` printed: op events on both tasks' devices in TensorFlow's
/// timeline, and a `_Recv` on each of `recv_tasks` with the bytes it received (TensorFlow's own
/// worker labels its receives otherwise).
fn assert_traced(traced: &Trained, recv_tasks: &[&str]) {
    let devices = traced.strings("devices");
    eprintln!("traced devices: {devices:?}");
    for task in ["/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"] {
        let cpu = format!("{task}/device:CPU:0");
        assert!(devices.contains(&cpu), "{cpu} not in {devices:?}");
        let events = traced.json["processes"][format!("{cpu} Compute")].as_u64();
        assert!(events.is_some_and(|n| n > 0), "{}", traced.json);
    }
    // The variables come from the ps and the gradients go to it: receives on both sides, each
    // with the bytes of what it received.
    let recvs = traced.json["recvs"].as_array().unwrap();
    for task in recv_tasks {
        assert!(
            recvs
                .iter()
                .any(|r| r["device"].as_str().unwrap().contains(task)),
            "no _Recv on {task}: {}",
            traced.json
        );
    }
    for recv in recvs {
        let bytes = recv["bytes"].as_array().unwrap();
        assert!(bytes.len() == 1 && bytes[0].as_i64() > Some(0), "{recv}");
    }
}

#[test]
fn a_tensorflow_client_traces_a_step_on_a_tessera_cluster() {
    let Some(python) = tensorflow_python("tensorflow trace") else {
        return;
    };
    let cluster = Cluster::start(&[("ps", 1), ("worker", 1)]);
    let (ps, worker) = (cluster.addr("ps", 0), cluster.addr("worker", 0));
    // The script asserts that TensorFlow's timeline drew op events on a device of each task.
    let traced = client(&python, ps, worker, &["trace".to_string()]);
    assert_traced(&traced, &["/job:ps/", "/job:worker/"]);
}

#[test]
fn a_tensorflow_master_traces_a_step_on_a_tessera_ps() {
    let Some(python) = tensorflow_python("tensorflow master trace") else {
        return;
    };
    let bound = Bound::bind(&[("ps", 1)]);
    let ps = bound.addr("ps", 0);
    let worker = tf_server(&python, "worker", &ps.to_string(), "127.0.0.1:0");
    let _cluster = bound.start(&[("worker", 0, worker.addr)], TEST_TIMEOUTS);
    // TensorFlow's master asks tessera's worker for its timeline and merges it with its own.
    let args = ["trace".to_string(), "--no-cluster-def".into()];
    assert_traced(&client(&python, ps, worker.addr, &args), &["/job:ps/"]);
}

#[test]
fn a_tensorflow_ps_serves_a_tessera_worker() {
    let Some(python) = tensorflow_python("tensorflow ps") else {
        return;
    };
    let bound = Bound::bind(&[("worker", 1)]);
    let worker = bound.addr("worker", 0);
    let ps = tf_server(&python, "ps", "127.0.0.1:0", &worker.to_string());
    let _cluster = bound.start(&[("ps", 0, ps.addr)], TEST_TIMEOUTS);
    train(&python, ps.addr, worker, true).assert_trained();
}

#[test]
fn a_tensorflow_master_runs_its_variables_on_a_tessera_ps() {
    let Some(python) = tensorflow_python("tensorflow master") else {
        return;
    };
    let bound = Bound::bind(&[("ps", 1)]);
    let ps = bound.addr("ps", 0);
    let worker = tf_server(&python, "worker", &ps.to_string(), "127.0.0.1:0");
    let _cluster = bound.start(&[("worker", 0, worker.addr)], TEST_TIMEOUTS);
    // A TensorFlow server refuses a session whose cluster names itself; it has the cluster.
    train(&python, ps, worker.addr, false).assert_trained();
}

#[test]
fn a_tensorflow_monitored_session_saves_and_restores_on_tessera() {
    let Some(python) = tensorflow_python("tensorflow monitored session") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let monitored = |cluster: &Cluster, last_step: i64| {
        let args = [
            "monitored".to_string(),
            "--checkpoint-dir".into(),
            dir.path().to_string_lossy().into_owned(),
            "--last-step".into(),
            last_step.to_string(),
        ];
        client(
            &python,
            cluster.addr("ps", 0),
            cluster.addr("worker", 0),
            &args,
        )
    };
    // A fresh cluster and no checkpoint: the chief initialises, trains to 30, saves.
    let first = Cluster::start(&[("ps", 1), ("worker", 1)]);
    let run = monitored(&first, 30);
    assert_eq!(run.json["start_step"].as_i64(), Some(0), "{}", run.json);
    assert_eq!(run.json["checkpoint"].as_str(), Some("model.ckpt-30"));
    assert_eq!(run.json["checkpoint_step"].as_i64(), Some(30));
    let variables = run.strings("variables");
    for name in [
        "global_step",
        "softmax/w",
        "softmax/w/Momentum",
        "softmax/b",
    ] {
        assert!(
            variables.iter().any(|v| v == name),
            "{name} not in {variables:?}"
        );
    }
    // Another cluster, its ps empty: the chief restores step 30 and goes on to 50.
    drop(first);
    let second = Cluster::start(&[("ps", 1), ("worker", 1)]);
    let run = monitored(&second, 50);
    assert_eq!(run.json["start_step"].as_i64(), Some(30), "{}", run.json);
    assert_eq!(run.json["checkpoint"].as_str(), Some("model.ckpt-50"));
    assert_eq!(run.json["checkpoint_step"].as_i64(), Some(50));
}

#[test]
fn tensorflow_workers_train_synchronously_on_tessera() {
    let Some(python) = tensorflow_python("tensorflow sync replicas") else {
        return;
    };
    let cluster = Cluster::start(&[("ps", 1), ("worker", 2)]);
    let workers = format!(
        "{},{}",
        cluster.addr("worker", 0),
        cluster.addr("worker", 1)
    );
    let ps = cluster.addr("ps", 0);
    // The chief first: a worker that finds the model uninitialized waits 30 s to look again.
    let start = |index: usize| {
        let args = ["sync".to_string(), "--index".into(), index.to_string()];
        start_client(&python, ps, &workers, &args)
    };
    let mut chief = start(0);
    chief.wait_for("ready");
    let other = start(1);
    let runs = [chief.finish(), other.finish()];
    // 20 updates of two gradients each: 40 steps at least between the workers (the chief may
    // take them all: its initial tokens let it run ahead), and each worker saw the global
    // step reach the last update (or the one before, fetched with its own last step; or one
    // more, when the chief's aggregation loop applied the gradients still pending at the end).
    let steps: i64 = runs
        .iter()
        .map(|r| r.json["local_steps"].as_i64().unwrap())
        .sum();
    assert!(steps >= 40, "{steps} steps in all");
    for run in &runs {
        assert!(
            run.json["local_steps"].as_i64().unwrap() >= 1,
            "{}",
            run.json
        );
        let last = run.json["last_step"].as_i64().unwrap();
        assert!((19..=21).contains(&last), "{}", run.json);
    }
}

#[test]
fn tesseras_client_trains_on_a_tensorflow_server_as_on_tessera() {
    let Some(python) = tensorflow_python("tessera client") else {
        return;
    };
    // TensorFlow's server alone, as the one worker of its cluster.
    let server = tf_server(&python, "worker", "", "127.0.0.1:0");
    let remote = tessera::client::Session::connect(&format!("grpc://{}", server.addr)).unwrap();
    let on_tensorflow = mlp::train(&remote, &mlp::single_device_model());
    let on_tessera = mlp::train(
        &tessera::client::Session::local(),
        &mlp::single_device_model(),
    );
    mlp::assert_same_training(&on_tensorflow, &on_tessera, 1e-5);
}
