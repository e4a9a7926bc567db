//! TensorFlow 1 programs, unchanged, on tessera, live (`tests/tensorflow_v1.py` is the
//! programs): the classic ps/worker trainer (an MLP on the digits, Adagrad, a global step,
//! `MonitoredTrainingSession` with `StopAtStepHook` and checkpoints), the same with
//! `SyncReplicasOptimizer`, a `dynamic_rnn` (LSTM) with Adam, a CNN with Momentum over two ps
//! tasks, and an embedding table partitioned over two ps tasks (`fixed_size_partitioner`,
//! `embedding_lookup`) trained by Adagrad's sparse updates, the MLP fed by a `tf.data`
//! pipeline (one-shot and initializable iterators, tensors or a TFRecord file parsed by
//! `ParseExampleV2`; a finite one ends training at its end; a restart resumes its input), whose checkpoints each runtime
//! restores from the other, under another partitioning too (`min_max_variable_partitioner`'s
//! three shards as two). Under
//! `disable_v2_behavior()` their graphs hold reference variables (`VariableV2`, `Assign`,
//! `Apply*`) and v1 control flow (the global step's `Switch`/`Merge`, `dynamic_rnn`'s while
//! loop with its TensorArrays and, in its gradient, stacks); with only
//! `disable_eager_execution()`, resource variables and TensorFlow 2's control flow (a
//! functional `StatelessWhile` over TensorLists, which TensorFlow's master and tessera's lower
//! to v1 loops before partitioning).
//!
//! Two layouts each: stock TensorFlow workers (their masters partition the graph) with a
//! tessera ps, and tessera ps and worker tasks driven by TensorFlow clients through tessera's
//! master. With one worker and fixed seeds the first loss must be TensorFlow's to 1e-5 and the
//! last within 1 %, the held-out accuracy within 0.02 (TensorFlow 2.21 alone, same script,
//! same seeds, gave the numbers below); with two workers, the held-out accuracy within 0.02.

use std::process::{Command, Stdio};

use crate::support::cluster::{Bound, Cluster, TEST_TIMEOUTS};
use crate::support::tensorflow::{python_with, Client, TfServer, Trained};

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
    /// The ps tasks the program spreads its variables over.
    ps_tasks: usize,
}

const CLASSIC: Reference = Reference {
    first_loss: 2.37646508,
    last_loss: 0.10137538,
    accuracy: 0.97777778,
    steps: 200,
    ps_tasks: 1,
};

const SYNC_ONE_WORKER: Reference = Reference {
    first_loss: 2.37646508,
    last_loss: 0.07422117,
    accuracy: 0.97777778,
    steps: 200,
    ps_tasks: 1,
};

const RNN_LSTM: Reference = Reference {
    first_loss: 2.32930803,
    last_loss: 0.34254396,
    accuracy: 0.82222223,
    steps: 100,
    ps_tasks: 1,
};

const CNN: Reference = Reference {
    first_loss: 2.27884007,
    last_loss: 0.04063952,
    accuracy: 0.97500002,
    steps: 200,
    ps_tasks: 2,
};

const EMBEDDING: Reference = Reference {
    first_loss: 2.47906876,
    last_loss: 0.04519423,
    accuracy: 0.94722223,
    steps: 200,
    ps_tasks: 2,
};

/// The classic MLP fed by a tf.data pipeline (uint8 pixels, map, shuffle, repeat, batch,
/// prefetch): the same batches in the same order on both runtimes, so the same losses.
const PIPELINE: Reference = Reference {
    first_loss: 2.23729730,
    last_loss: 0.14005105,
    accuracy: 0.98055553,
    steps: 200,
    ps_tasks: 1,
};

/// The pipeline over 3 passes of the data (45 batches each, the last one short): training
/// ends at the data's end, step 135.
const PIPELINE_THREE_EPOCHS: Reference = Reference {
    first_loss: 2.23729730,
    last_loss: 0.26842818,
    accuracy: 0.96944445,
    steps: 135,
    ps_tasks: 1,
};

/// The feature-column wide-and-deep recommender (hash-bucket, vocabulary-list and
/// vocabulary-file, bucketized, crossed, embedding and indicator columns over 2 ps tasks; Ftrl
/// and Adagrad; tf.data input). Its held-out log loss must be within 3 % of TensorFlow's; a
/// model that learnt nothing (the label mean) scores 0.6932.
const WIDE_DEEP: Reference = Reference {
    first_loss: 0.80170012,
    last_loss: 0.48511279,
    accuracy: 0.66900003,
    steps: 300,
    ps_tasks: 2,
};
const WIDE_DEEP_EVAL_LOSS: f64 = 0.60381728;

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
        let ps: Vec<String> = (0..want.ps_tasks)
            .map(|i| format!("/job:ps/task:{i}"))
            .collect();
        assert_eq!(self.strings("variable_devices"), ps, "{json}");
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

/// Runs `program` with one worker on `ps` tessera ps tasks and a tessera worker (TensorFlow's
/// client on tessera's master).
fn on_tessera(python: &str, program: &[&str], ps: usize) -> Trained {
    let cluster = Cluster::start(&[("ps", ps), ("worker", 1)]);
    let ps = addresses(|i| cluster.addr("ps", i), ps);
    let worker = cluster.addr("worker", 0).to_string();
    start(python, program, &ps, &worker, 0, true).finish()
}

/// Runs `program` with one stock TensorFlow worker (its master) and `ps` tessera ps tasks.
fn on_tessera_ps(python: &str, program: &[&str], ps: usize) -> Trained {
    let bound = Bound::bind(&[("ps", ps)]);
    let ps = addresses(|i| bound.addr("ps", i), ps);
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

/// `PROGRAM --alone`: the program on stock TensorFlow servers only.
fn on_tensorflow(python: &str, program: &[&str]) -> Trained {
    let mut command = Command::new(python);
    command.arg(SCRIPT).args(program).arg("--alone");
    command.stdin(Stdio::null());
    Client::spawn(command).finish()
}

/// The comma-separated addresses of `count` tasks.
fn addresses(addr: impl Fn(usize) -> std::net::SocketAddr, count: usize) -> String {
    (0..count)
        .map(|i| addr(i).to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs `program` with two workers on a tessera cluster, the chief first; returns both.
fn two_workers_on_tessera(python: &str, program: &[&str]) -> [Trained; 2] {
    let cluster = Cluster::start(&[("ps", 1), ("worker", 2)]);
    let ps = addresses(|i| cluster.addr("ps", i), 1);
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
    let on_tessera = on_tessera(&python, &program, 1);
    on_tessera.assert_matches(&CLASSIC);
    assert_eq!(on_tessera.strings("variable_ops"), vec!["VariableV2"]);
    on_tessera_ps(&python, &program, 1).assert_matches(&CLASSIC);
}

#[test]
fn classic_trainer_with_only_eager_execution_disabled_runs_on_tessera() {
    let Some(python) = tensorflow_python("classic trainer, eager only") else {
        return;
    };
    let program = ["classic", "--v2-behavior", "eager-only"];
    on_tessera(&python, &program, 1).assert_matches(&CLASSIC);
    on_tessera_ps(&python, &program, 1).assert_matches(&CLASSIC);
}

#[test]
fn a_tf_data_input_pipeline_runs_on_tessera_tasks() {
    let Some(python) = tensorflow_python("tf.data pipeline") else {
        return;
    };
    on_tessera(&python, &["pipeline"], 1).assert_matches(&PIPELINE);
    // An initializable iterator over tf.train.Examples read from a TFRecord file and parsed
    // by ParseExampleV2: the same images in the same order, so the same losses.
    let program = [
        "pipeline",
        "--iterator",
        "initializable",
        "--source",
        "tfrecord",
    ];
    on_tessera(&python, &program, 1).assert_matches(&PIPELINE);
}

#[test]
fn a_finite_tf_data_input_ends_training_at_its_last_batch() {
    let Some(python) = tensorflow_python("finite tf.data pipeline") else {
        return;
    };
    let program = ["pipeline", "--epochs", "3", "--steps", "100000"];
    let trained = on_tessera(&python, &program, 1);
    trained.assert_matches(&PIPELINE_THREE_EPOCHS);
    assert_eq!(
        trained.json["local_steps"].as_i64(),
        Some(135),
        "{}",
        trained.json
    );
}

#[test]
fn a_restarted_job_resumes_its_tf_data_input_where_it_stopped() {
    let Some(python) = tensorflow_python("tf.data resume") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().to_str().unwrap();
    let run = |steps: &str| {
        let program = [
            "pipeline",
            "--save-iterator",
            "--steps",
            steps,
            "--checkpoint-dir",
            ckpt,
        ];
        on_tessera(&python, &program, 1)
    };
    let first = run("100");
    assert_eq!(
        first.json["global_step"].as_i64(),
        Some(100),
        "{}",
        first.json
    );
    // A new cluster: the chief restores the model and the iterator's position from step 100,
    // so steps 101..200 see the batches an uninterrupted run sees (TensorFlow alone gives
    // 0.15406787 for the first of them; 0.22631045 when the input starts over).
    let resumed = run("200");
    let json = &resumed.json;
    assert_eq!(json["local_steps"].as_i64(), Some(100), "{json}");
    assert_eq!(json["global_step"].as_i64(), Some(200), "{json}");
    for (key, want) in [("first_loss", 0.15406787), ("last_loss", 0.14005105)] {
        let got = resumed.f64(key);
        assert!(
            (got - want).abs() <= 1e-2 * want,
            "{key} {got}, TensorFlow's {want}: {json}"
        );
    }
    let accuracy = resumed.f64("accuracy");
    assert!((accuracy - 0.98055553).abs() <= 0.02, "{json}");
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
    on_tessera_ps(&python, &program, 1).assert_matches(&SYNC_ONE_WORKER);
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
    let on_tessera = on_tessera(&python, &program, 1);
    on_tessera.assert_matches(&RNN_LSTM);
    let ops = on_tessera.strings("control_flow_ops");
    for op in ["Enter", "NextIteration", "TensorArrayV3", "StackPushV2"] {
        assert!(ops.iter().any(|o| o == op), "{op} not in {ops:?}");
    }
    on_tessera_ps(&python, &program, 1).assert_matches(&RNN_LSTM);
}

#[test]
fn dynamic_rnn_with_functional_while_over_tensor_lists_runs_on_tessera() {
    let Some(python) = tensorflow_python("dynamic_rnn v2 control flow") else {
        return;
    };
    let program = ["rnn", "--v2-behavior", "eager-only"];
    let on_tessera = on_tessera(&python, &program, 1);
    on_tessera.assert_matches(&RNN_LSTM);
    let ops = on_tessera.strings("control_flow_ops");
    for op in ["StatelessWhile", "TensorListReserve", "TensorListPopBack"] {
        assert!(ops.iter().any(|o| o == op), "{op} not in {ops:?}");
    }
    on_tessera_ps(&python, &program, 1).assert_matches(&RNN_LSTM);
}

#[test]
fn cnn_with_momentum_over_two_ps_tasks_runs_on_tessera() {
    let Some(python) = tensorflow_python("cnn v1") else {
        return;
    };
    let program = ["cnn", "--v2-behavior", "off"];
    on_tessera(&python, &program, 2).assert_matches(&CNN);
    on_tessera_ps(&python, &program, 2).assert_matches(&CNN);
}

impl Trained {
    /// The embedding table's shards: name -> (device, shape).
    fn table_parts(&self) -> Vec<(String, String, Vec<i64>)> {
        let parts = self.json["table_parts"]
            .as_object()
            .unwrap_or_else(|| panic!("no table_parts: {}", self.json));
        parts
            .iter()
            .map(|(name, part)| {
                let device = part[0].as_str().expect("a device").to_string();
                let shape = part[1]
                    .as_array()
                    .expect("a shape")
                    .iter()
                    .map(|d| d.as_i64().expect("a dimension"))
                    .collect();
                (name.clone(), device, shape)
            })
            .collect()
    }

    /// The held-out loss, to compare runs that restored one checkpoint.
    fn assert_same_model(&self, other: &Trained) {
        let (mine, theirs) = (self.f64("eval_loss"), other.f64("eval_loss"));
        assert!(
            (mine - theirs).abs() <= 1e-5 * theirs,
            "held-out loss {mine}, the checkpoint's model gave {theirs}:\n{}\n{}",
            self.json,
            other.json
        );
        assert_eq!(self.f64("accuracy"), other.f64("accuracy"));
    }
}

#[test]
fn partitioned_embedding_with_sparse_adagrad_runs_on_tessera() {
    let Some(python) = tensorflow_python("embedding v1") else {
        return;
    };
    let program = ["embedding", "--v2-behavior", "off"];
    let run = on_tessera(&python, &program, 2);
    run.assert_matches(&EMBEDDING);
    // The table's two shards, one on each ps task, updated by Adagrad's sparse apply.
    let parts = run.table_parts();
    let want = [
        ("embedding/part_0", "/job:ps/task:1", vec![544, 16]),
        ("embedding/part_1", "/job:ps/task:0", vec![544, 16]),
    ];
    let want: Vec<_> = want
        .into_iter()
        .map(|(n, d, s)| (n.to_string(), d.to_string(), s))
        .collect();
    assert_eq!(parts, want);
    assert_eq!(run.strings("sparse_update_ops"), vec!["SparseApplyAdagrad"]);
    on_tessera_ps(&python, &program, 2).assert_matches(&EMBEDDING);
    // Resource variables: ResourceGather and ResourceSparseApplyAdagrad.
    let resource = on_tessera(&python, &["embedding", "--v2-behavior", "eager-only"], 2);
    resource.assert_matches(&EMBEDDING);
    assert_eq!(resource.strings("variable_ops"), vec!["VarHandleOp"]);
    assert_eq!(
        resource.strings("sparse_update_ops"),
        vec!["ResourceSparseApplyAdagrad"]
    );
}

#[test]
fn a_feature_column_wide_and_deep_model_trains_on_tessera_tasks() {
    let Some(python) = tensorflow_python("feature-column wide and deep") else {
        return;
    };
    // Every op on tessera: the string hashing, vocabulary tables, crosses and sparse
    // reshapes on the worker, the partitioned tables and Ftrl's and Adagrad's sparse updates
    // on the ps tasks.
    let run = on_tessera(&python, &["wide_deep"], 2);
    run.assert_matches(&WIDE_DEEP);
    let json = &run.json;
    let loss = run.f64("eval_loss");
    assert!(
        (loss - WIDE_DEEP_EVAL_LOSS).abs() <= 0.03 * WIDE_DEEP_EVAL_LOSS,
        "held-out log loss {loss}, TensorFlow's {WIDE_DEEP_EVAL_LOSS}: {json}"
    );
    assert_eq!(
        run.strings("sparse_update_ops"),
        vec!["SparseApplyAdagrad", "SparseApplyFtrl"],
        "{json}"
    );
}

/// The embedding program with `partitions` table shards looked up by `strategy`, its chief's
/// checkpoints in `dir`.
fn embedding_in(dir: &std::path::Path, partitions: usize, strategy: &str) -> Vec<String> {
    let dir = dir.to_str().expect("a UTF-8 path");
    let partitions = partitions.to_string();
    [
        "embedding",
        "--v2-behavior",
        "off",
        "--partitions",
        &partitions,
        "--partition-strategy",
        strategy,
        "--checkpoint-dir",
        dir,
    ]
    .map(String::from)
    .to_vec()
}

fn evaluate_only(mut args: Vec<String>) -> Vec<String> {
    args.push("--evaluate-only".into());
    args
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[test]
fn partitioned_embedding_checkpoints_restore_on_the_other_runtime() {
    let Some(python) = tensorflow_python("embedding checkpoints") else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let restored_only = |run: &Trained| {
        assert_eq!(run.json["local_steps"].as_i64(), Some(0), "{}", run.json);
        assert_eq!(run.json["global_step"].as_i64(), Some(200), "{}", run.json);
    };

    // tessera trains and saves; TensorFlow restores and only evaluates.
    let args = embedding_in(&dir.path().join("tessera"), 2, "mod");
    let trained = on_tessera(&python, &strs(&args), 2);
    trained.assert_matches(&EMBEDDING);
    let restored = on_tensorflow(&python, &strs(&evaluate_only(args)));
    restored_only(&restored);
    restored.assert_same_model(&trained);

    // TensorFlow trains and saves three shards (min_max_variable_partitioner); tessera
    // restores them as two. Ids are looked up by "div" here: under "mod", shard k holds ids
    // k, k+N, ..., so which row of the whole table an id reads changes with N (TensorFlow
    // restoring its own two shards as three gets 12 % held out).
    let saved = dir.path().join("tensorflow");
    let mut min_max = embedding_in(&saved, 3, "div");
    min_max.extend(["--partitioner".to_string(), "min_max".to_string()]);
    let trained = on_tensorflow(&python, &strs(&min_max));
    assert_eq!(trained.table_parts().len(), 3, "{}", trained.json);
    let two = evaluate_only(embedding_in(&saved, 2, "div"));
    let restored = on_tessera(&python, &strs(&two), 2);
    restored_only(&restored);
    assert_eq!(restored.table_parts().len(), 2, "{}", restored.json);
    restored.assert_same_model(&trained);
}
