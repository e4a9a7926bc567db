//! Stock TensorFlow against tessera, live: TensorFlow 2's `tf.compat.v1.Session` client, and
//! TensorFlow's own gRPC server as a cluster task, talking to `tessera serve` processes over
//! TensorFlow's MasterService and WorkerService (`tests/tensorflow_interop.py` is TensorFlow's
//! side). Each scenario trains the same MLP with Adam and a global step, the variables on the
//! ps, and must reach the same result:
//!
//! - a TensorFlow client on a tessera cluster (tessera's master, worker and ps);
//! - a TensorFlow ps under a tessera worker: tessera's master registers and runs the ps's
//!   partition on TensorFlow's worker service, and each side pulls tensors from the other;
//! - a TensorFlow worker (its master) with a tessera ps: TensorFlow drives tessera;
//! - TensorFlow 1's `MonitoredTrainingSession` as chief on a tessera cluster: it initialises,
//!   saves checkpoints (tessera's ps writes them, TensorFlow reads them), and after the
//!   cluster is replaced restores from them and goes on.
//!
//! They need a Python with TensorFlow (`$TESSERA_TF_PYTHON`, else `python3`); without one
//! they print why and pass. CI installs `tensorflow-cpu` in a virtual environment for them.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

mod support;

use support::cluster::{Bound, Cluster, TEST_TIMEOUTS};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tensorflow_interop.py");
/// Importing TensorFlow takes seconds; a cold one on a busy two-core machine, more.
const SERVE_DEADLINE: Duration = Duration::from_secs(120);
/// Importing TensorFlow and training 150 steps.
const TRAIN_DEADLINE: Duration = Duration::from_secs(300);
/// The steps the script trains.
const STEPS: i64 = 150;

/// The Python that has TensorFlow, or `None` (said) when there is none.
fn tensorflow_python(test: &str) -> Option<String> {
    let python = std::env::var("TESSERA_TF_PYTHON").unwrap_or_else(|_| "python3".into());
    let (tx, rx) = mpsc::channel();
    let probe = python.clone();
    thread::spawn(move || {
        let found = Command::new(&probe)
            .args(["-c", "import tensorflow"])
            .env("TF_CPP_MIN_LOG_LEVEL", "3")
            .stdin(Stdio::null())
            .output();
        let _ = tx.send(found.is_ok_and(|o| o.status.success()));
    });
    if rx.recv_timeout(SERVE_DEADLINE).unwrap_or(false) {
        return Some(python);
    }
    eprintln!(
        "{test}: skipped, `{python}` cannot import tensorflow (pip install tensorflow-cpu, or \
         set TESSERA_TF_PYTHON to a python that can)"
    );
    None
}

/// A TensorFlow server process, killed when dropped.
struct TfServer {
    child: Child,
    /// Held open: the script serves until its stdin closes.
    _stdin: ChildStdin,
    addr: SocketAddr,
}

impl TfServer {
    /// Starts TensorFlow's server as task 0 of `job`, in a cluster of one ps and one worker at
    /// `ps` and `worker` (its own address ends in `:0`); returns once it says where it serves.
    fn start(python: &str, job: &str, ps: &str, worker: &str) -> TfServer {
        let mut child = Command::new(python)
            .args([SCRIPT, "server", job, "--ps", ps, "--worker", worker])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the TensorFlow server");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let line = rx.recv_timeout(SERVE_DEADLINE).unwrap_or_else(|e| {
            let _ = child.kill();
            panic!("TensorFlow's {job} server said nothing within {SERVE_DEADLINE:?}: {e}")
        });
        let target = line
            .strip_prefix("tensorflow: serving grpc://")
            .unwrap_or_else(|| panic!("TensorFlow's {job} server said: {line}"));
        let port = target
            .rsplit(':')
            .next()
            .and_then(|p| p.parse::<u16>().ok());
        let addr = SocketAddr::from(([127, 0, 0, 1], port.expect("a port")));
        TfServer {
            child,
            _stdin: stdin,
            addr,
        }
    }
}

impl Drop for TfServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the TensorFlow client's training reports.
struct Trained {
    json: serde_json::Value,
}

impl Trained {
    fn f64(&self, key: &str) -> f64 {
        self.json[key]
            .as_f64()
            .unwrap_or_else(|| panic!("no {key} in {}", self.json))
    }

    fn strings(&self, key: &str) -> Vec<String> {
        let values = self.json[key].as_array();
        let values = values.unwrap_or_else(|| panic!("no {key} in {}", self.json));
        values
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    }

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
    let mut command = Command::new(python);
    command.arg(SCRIPT).args(args);
    command.args(["--ps", &ps.to_string(), "--worker", &worker.to_string()]);
    let output = run_with_deadline(command, TRAIN_DEADLINE);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the TensorFlow client failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let line = stdout.lines().last().unwrap_or_default();
    let json = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    eprintln!("trained: {json}");
    Trained { json }
}

/// Runs `command` to its end; kills it and panics past `deadline`.
fn run_with_deadline(mut command: Command, deadline: Duration) -> Output {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the TensorFlow client");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(deadline) {
        Ok(output) => output.expect("the TensorFlow client's output"),
        Err(_) => {
            // SAFETY: kill(2) on the child we spawned, which has not been reaped.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("the TensorFlow client did not finish within {deadline:?}")
        }
    }
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

#[test]
fn a_tensorflow_ps_serves_a_tessera_worker() {
    let Some(python) = tensorflow_python("tensorflow ps") else {
        return;
    };
    let bound = Bound::bind(&[("worker", 1)]);
    let worker = bound.addr("worker", 0);
    let ps = TfServer::start(&python, "ps", "127.0.0.1:0", &worker.to_string());
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
    let worker = TfServer::start(&python, "worker", &ps.to_string(), "127.0.0.1:0");
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
