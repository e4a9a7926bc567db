//! TensorFlow 1 programs, unchanged, on tessera, live (`tests/tensorflow_v1.py` is the
//! programs): the classic ps/worker trainer (an MLP on the digits, Adagrad, a global step,
//! `MonitoredTrainingSession` with `StopAtStepHook` and checkpoints), the same with
//! `SyncReplicasOptimizer`, and a `dynamic_rnn` (LSTM) with Adam. Under
//! `disable_v2_behavior()` their graphs hold reference variables (`VariableV2`, `Assign`,
//! `Apply*`) and v1 control flow (the global step's `Switch`/`Merge`, `dynamic_rnn`'s while
//! loop with its TensorArrays and, in its gradient, stacks); with only
//! `disable_eager_execution()`, resource variables.
//!
//! Two layouts each: stock TensorFlow workers (their masters partition the graph) with a
//! tessera ps, and tessera ps and worker tasks driven by TensorFlow clients through tessera's
//! master. With one worker and fixed seeds the first loss must be TensorFlow's to 1e-5 and the
//! last within 1 %, the held-out accuracy within 0.02 (TensorFlow 2.21 alone, same script,
//! same seeds, gave the numbers below); with two workers, the held-out accuracy within 0.02.

use std::process::{Command, Stdio};

mod support;

use support::cluster::{Bound, Cluster, TEST_TIMEOUTS};
use support::tensorflow::{python_with, Client, TfServer, Trained};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tensorflow_v1.py");

/// The Python with what the programs import: TensorFlow, tf-keras (TensorFlow 1's `rnn_cell`
/// under Keras 3) and scikit-learn (the digits).
fn tensorflow_python(test: &str) -> Option<String> {
    python_with(test, &["tensorflow", "tf_keras", "sklearn"])
}

/// What TensorFlow 2.21 alone gives for a program with one worker (`tensorflow_v1.py PROGRAM
/// --alone`): first loss, last loss, held-out accuracy, last global step.
struct Reference {
    first_loss: f64,
    last_loss: f64,
    accuracy: f64,
    steps: i64,
}

const CLASSIC: Reference = Reference {
    first_loss: 2.37646508,
    last_loss: 0.10137538,
    accuracy: 0.97777778,
    steps: 200,
};

const RNN_LSTM: Reference = Reference {
    first_loss: 2.32930803,
    last_loss: 0.34254396,
    accuracy: 0.82222223,
    steps: 100,
};

/// Two asynchronous or synchronous workers: TensorFlow alone reached these accuracies.
const CLASSIC_TWO_WORKERS_ACCURACY: f64 = 0.969;
const SYNC_TWO_WORKERS_ACCURACY: f64 = 0.975;

impl Trained {
    /// One worker: the same training as TensorFlow's alone.
    fn assert_matches(&self, want: &Reference) {
        let json = &self.json;
        assert_eq!(json["global_step"].as_i64(), Some(want.steps), "{json}");
        let first = self.f64("first_loss");
        assert!(
            (first - want.first_loss).abs() <= 1e-5 * want.first_loss,
            "first loss {first}, TensorFlow's {}: {json}",
            want.first_loss
        );
        let last = self.f64("last_loss");
        assert!(
            (last - want.last_loss).abs() <= 1e-2 * want.last_loss,
            "last loss {last}, TensorFlow's {}: {json}",
            want.last_loss
        );
        let accuracy = self.f64("accuracy");
        assert!(
            (accuracy - want.accuracy).abs() <= 0.02,
            "accuracy {accuracy}, TensorFlow's {}: {json}",
            want.accuracy
        );
        assert_eq!(self.strings("variable_devices"), vec!["/job:ps/task:0"]);
        let checkpoint = json["checkpoint"]["name"].as_str();
        assert_eq!(
            checkpoint,
            Some(format!("model.ckpt-{}", want.steps).as_str())
        );
    }
}

/// `PROGRAM --v2-behavior V --master grpc://WORKER_I ...` as worker `index` of the cluster.
fn start(
    python: &str,
    program: &[&str],
    ps: &str,
    workers: &str,
    index: usize,
    cluster_def: bool,
) -> Client {
    let master = workers.split(',').nth(index).expect("the worker's address");
    let mut command = Command::new(python);
    command.arg(SCRIPT).args(program);
    command.args(["--master", &format!("grpc://{master}")]);
    command.args([
        "--ps",
        ps,
        "--worker",
        workers,
        "--index",
        &index.to_string(),
    ]);
    if !cluster_def {
        command.arg("--no-cluster-def");
    }
    command.stdin(Stdio::null());
    Client::spawn(command)
}

/// Runs `program` with one worker on a tessera ps and worker (TensorFlow's client on
/// tessera's master).
fn on_tessera(python: &str, program: &[&str]) -> Trained {
    let cluster = Cluster::start(&[("ps", 1), ("worker", 1)]);
    let ps = cluster.addr("ps", 0).to_string();
    let worker = cluster.addr("worker", 0).to_string();
    start(python, program, &ps, &worker, 0, true).finish()
}

/// Runs `program` with one stock TensorFlow worker (its master) and a tessera ps.
fn on_tessera_ps(python: &str, program: &[&str]) -> Trained {
    let bound = Bound::bind(&[("ps", 1)]);
    let ps = bound.addr("ps", 0).to_string();
    let worker = TfServer::start(
        python,
        SCRIPT,
        &[
            "server",
            "worker",
            "0",
            "--ps",
            &ps,
            "--worker",
            "127.0.0.1:0",
        ],
    );
    let _cluster = bound.start(&[("worker", 0, worker.addr)], TEST_TIMEOUTS);
    // A TensorFlow server refuses a session whose cluster names itself; it has the cluster.
    start(python, program, &ps, &worker.addr.to_string(), 0, false).finish()
}

/// Runs `program` with two workers on a tessera cluster, the chief first; returns both.
fn two_workers_on_tessera(python: &str, program: &[&str]) -> [Trained; 2] {
    let cluster = Cluster::start(&[("ps", 1), ("worker", 2)]);
    let ps = cluster.addr("ps", 0).to_string();
    let workers = format!(
        "{},{}",
        cluster.addr("worker", 0),
        cluster.addr("worker", 1)
    );
    // A worker that finds the model uninitialised waits 30 s to look again: chief first.
    let mut chief = start(python, program, &ps, &workers, 0, true);
    chief.wait_for("ready");
    let other = start(python, program, &ps, &workers, 1, true);
    [chief.finish(), other.finish()]
}

#[test]
fn classic_trainer_under_disable_v2_behavior_runs_on_tessera() {
    let Some(python) = tensorflow_python("classic v1 trainer") else {
        return;
    };
    let program = ["classic", "--v2-behavior", "off"];
    let on_tessera = on_tessera(&python, &program);
    on_tessera.assert_matches(&CLASSIC);
    assert_eq!(on_tessera.strings("variable_ops"), vec!["VariableV2"]);
    on_tessera_ps(&python, &program).assert_matches(&CLASSIC);
}

#[test]
fn classic_trainer_with_only_eager_execution_disabled_runs_on_tessera() {
    let Some(python) = tensorflow_python("classic trainer, eager only") else {
        return;
    };
    let program = ["classic", "--v2-behavior", "eager-only"];
    on_tessera(&python, &program).assert_matches(&CLASSIC);
    on_tessera_ps(&python, &program).assert_matches(&CLASSIC);
}

#[test]
fn two_async_workers_train_the_classic_trainer_as_tensorflow_does() {
    let Some(python) = tensorflow_python("classic trainer, two workers") else {
        return;
    };
    let runs = two_workers_on_tessera(&python, &["classic", "--v2-behavior", "off"]);
    let steps: i64 = runs
        .iter()
        .map(|r| r.json["local_steps"].as_i64().unwrap())
        .sum();
    // Asynchronous workers may each pass the last step by one.
    assert!((200..=202).contains(&steps), "{steps} local steps in all");
    let accuracy = runs[0].f64("accuracy");
    assert!(
        (accuracy - CLASSIC_TWO_WORKERS_ACCURACY).abs() <= 0.02,
        "accuracy {accuracy}: {}",
        runs[0].json
    );
}

#[test]
fn sync_replicas_under_disable_v2_behavior_run_on_tessera() {
    let Some(python) = tensorflow_python("sync replicas v1") else {
        return;
    };
    // The chief's aggregation loop ends blocked in its accumulators' take; a bounded operation
    // ends it once the chief's hooks (the final checkpoint) are done.
    let program = [
        "sync",
        "--v2-behavior",
        "off",
        "--operation-timeout-ms",
        "15000",
    ];
    let runs = two_workers_on_tessera(&python, &program);
    for run in &runs {
        assert_eq!(run.json["global_step"].as_i64(), Some(200), "{}", run.json);
    }
    let accuracy = runs[0].f64("accuracy");
    assert!(
        (accuracy - SYNC_TWO_WORKERS_ACCURACY).abs() <= 0.02,
        "accuracy {accuracy}: {}",
        runs[0].json
    );
}

#[test]
fn dynamic_rnn_with_v1_loops_tensor_arrays_and_stacks_runs_on_tessera() {
    let Some(python) = tensorflow_python("dynamic_rnn v1") else {
        return;
    };
    let program = ["rnn", "--v2-behavior", "off"];
    let on_tessera = on_tessera(&python, &program);
    on_tessera.assert_matches(&RNN_LSTM);
    let ops = on_tessera.strings("control_flow_ops");
    for op in ["Enter", "NextIteration", "TensorArrayV3", "StackPushV2"] {
        assert!(ops.iter().any(|o| o == op), "{op} not in {ops:?}");
    }
    on_tessera_ps(&python, &program).assert_matches(&RNN_LSTM);
}
