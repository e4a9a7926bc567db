//! `tessera train` and `tessera local` end to end: real processes of the binary on loopback,
//! each task on a port this test bound and passed as fd 3 (socket activation), as
//! `tests/support/cluster.rs` does for `tessera serve`.
//!
//! The data is the default, the built-in handwritten digits (1797 8×8 images of 10 digits, a
//! fifth held out), where the main job's 1000 steps reach 97 % and more. Guessing is right 10 %
//! of the time; the tests of other things ask for 75 % after a few hundred steps, far above
//! chance and below what a converged model reaches, so they do not flake on a slow machine.
//!
//! Each test keeps its step count small: the whole file runs in about a minute in the dev
//! profile on two cores. The cnn's accuracy test runs its full 1000 steps (about 25 s alone);
//! its IDX test trains on 28×28 images (about 30 s).

use crate::support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::cluster::{killed_by, Cluster, BIN};
use tessera::client::Session;
use tessera::graph::attr::value;
use tessera::ops::systemd::socket_activated;
use tessera::proto::{GraphDef, NodeDef};
use tessera::train::checkpoint::{latest_checkpoint, BundleReader, Saver};
use tessera::train::job::model::{self, Placement};
use tessera::train::job::TrainSpec;

/// How long a whole training job may take (a cold debug binary on a busy two-core machine).
const JOB_DEADLINE: Duration = Duration::from_secs(180);

/// What a finished task left behind.
pub(crate) struct Ended {
    pub(crate) name: String,
    pub(crate) status: ExitStatus,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Runs a training job: one `tessera train` per task of `jobs`, all with `args`; waits for
/// every process (killing all past the deadline) and returns how each ended.
pub(crate) fn run_job(jobs: &[(&str, usize)], args: &[&str]) -> Vec<Ended> {
    let job = start_job(jobs, args);
    wait_all(job.tasks.into_iter().map(|t| (t.name, t.child)).collect())
}

/// A started task: its name, address and process.
pub(crate) struct Started {
    pub(crate) name: String,
    pub(crate) addr: std::net::SocketAddr,
    pub(crate) child: Child,
}

/// Started tasks and their cluster file's directory.
pub(crate) struct Job {
    pub(crate) tasks: Vec<Started>,
    _dir: tempfile::TempDir,
}

/// Starts one `tessera train` per task of `jobs`, all with `args`, each on a port bound here.
pub(crate) fn start_job(jobs: &[(&str, usize)], args: &[&str]) -> Job {
    start_job_with_devices(jobs, "", args)
}

/// [`start_job`] with `devices` (TOML lines) added to the cluster file's `[devices]` table.
fn start_job_with_devices(jobs: &[(&str, usize)], devices: &str, args: &[&str]) -> Job {
    start_job_each(jobs, devices, &|_, _| {
        args.iter().map(|a| a.to_string()).collect()
    })
}

/// [`start_job_with_devices`] with each task's arguments from `args` (job, index).
fn start_job_each(
    jobs: &[(&str, usize)],
    devices: &str,
    args: &dyn Fn(&str, usize) -> Vec<String>,
) -> Job {
    let dir = tempfile::tempdir().unwrap();
    let mut listeners = Vec::new();
    let mut text = String::from("[cluster]\n");
    for (job, count) in jobs {
        let mut addrs = Vec::new();
        for index in 0..*count {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            addrs.push(format!("\"{}\"", listener.local_addr().unwrap()));
            listeners.push((job.to_string(), index, listener));
        }
        text.push_str(&format!("{job} = [{}]\n", addrs.join(", ")));
    }
    text.push_str("[devices]\ngpu = 0\n");
    text.push_str(devices);
    let config = dir.path().join("cluster.toml");
    std::fs::write(&config, text).unwrap();

    let mut tasks = Vec::new();
    for (job, index, listener) in &listeners {
        let task_args = args(job, *index);
        let task_args: Vec<&str> = task_args.iter().map(String::as_str).collect();
        let child = spawn_train(&config, job, *index, listener, &task_args);
        tasks.push(Started {
            name: format!("/job:{job}/task:{index}"),
            addr: listener.local_addr().unwrap(),
            child,
        });
    }
    Job { tasks, _dir: dir }
}

/// `tessera train --config CONFIG ARGS` as task `job`/`index`, `listener` as fd 3.
pub(crate) fn spawn_train(
    config: &Path,
    job: &str,
    index: usize,
    listener: &TcpListener,
    args: &[&str],
) -> Child {
    let mut command = socket_activated(Path::new(BIN), listener);
    command.args(["train", "--config"]).arg(config).args(args);
    // The chief's event files go next to the cluster file, never into the checkout.
    if !args.contains(&"--logdir") {
        let runs = config.parent().expect("the cluster file's directory");
        command.arg("--logdir").arg(runs.join("runs"));
    }
    command
        .env("TESSERA__TASK__JOB", job)
        .env("TESSERA__TASK__INDEX", index.to_string())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command.spawn().expect("spawn tessera train")
}

/// Waits for every child with one deadline; reads their output to the end.
pub(crate) fn wait_all(children: Vec<(String, Child)>) -> Vec<Ended> {
    let (tx, rx) = mpsc::channel();
    let mut pids = Vec::new();
    for (slot, (name, mut child)) in children.into_iter().enumerate() {
        pids.push((name.clone(), child.id() as libc::pid_t));
        let mut stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let tx = tx.clone();
        thread::spawn(move || {
            let err = thread::spawn(move || {
                let mut s = String::new();
                let _ = stderr.read_to_string(&mut s);
                s
            });
            let mut out = String::new();
            let _ = stdout.read_to_string(&mut out);
            let status = child.wait().unwrap();
            let err = err.join().unwrap_or_default();
            let _ = tx.send((slot, name, status, out, err));
        });
    }
    drop(tx);
    let deadline = Instant::now() + JOB_DEADLINE;
    let mut ended: Vec<Option<Ended>> = pids.iter().map(|_| None).collect();
    while ended.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((slot, name, status, stdout, stderr)) => {
                ended[slot] = Some(Ended {
                    name,
                    status,
                    stdout,
                    stderr,
                })
            }
            Err(_) => {
                let late: Vec<&str> = pids
                    .iter()
                    .zip(&ended)
                    .filter(|(_, e)| e.is_none())
                    .map(|((name, pid), _)| {
                        // SAFETY: our child, not yet reaped (its waiter has not answered).
                        unsafe { libc::kill(*pid, libc::SIGKILL) };
                        name.as_str()
                    })
                    .collect();
                panic!("{late:?} still running after {JOB_DEADLINE:?} (killed)");
            }
        }
    }
    ended.into_iter().map(Option::unwrap).collect()
}

/// Asserts every task exited 0, showing the failures' output otherwise.
pub(crate) fn assert_all_exited_0(ended: &[Ended]) {
    for e in ended {
        assert!(
            e.status.success(),
            "{} ended with {:?}\nstdout:\n{}\nstderr:\n{}",
            e.name,
            e.status,
            e.stdout,
            e.stderr
        );
    }
}

/// The chief's `held-out accuracy X %` line, as a fraction.
pub(crate) fn held_out_accuracy(chief: &Ended) -> f64 {
    let line = chief
        .stdout
        .lines()
        .find(|l| l.contains("held-out accuracy"))
        .unwrap_or_else(|| panic!("no accuracy line in the chief's stdout:\n{}", chief.stdout));
    let number = line
        .split("held-out accuracy ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("unparsable accuracy line `{line}`"));
    number / 100.0
}

/// The held-out accuracy every training job here must reach (a nearest-center classifier, the
/// best there is for the built-in blobs, gets about 90 %).
const STATED_ACCURACY: f64 = 0.75;

/// Asserts a job trained: every task exited 0, the chief reports at least
/// [`STATED_ACCURACY`], and its `trained to global step ...` line starts with `step` (`"200 "`
/// for exactly 200; `"3"` for 300 or a little more, asynchronous workers passing the last step).
fn assert_trained(ended: &[Ended], step: &str) {
    assert_all_exited_0(ended);
    let chief = chief(ended);
    let accuracy = held_out_accuracy(chief);
    assert!(
        accuracy >= STATED_ACCURACY,
        "held-out accuracy {accuracy}:\n{}",
        chief.stdout
    );
    assert!(
        chief
            .stdout
            .contains(&format!("trained to global step {step}")),
        "the global step should reach the last step ({step}...):\n{}",
        chief.stdout
    );
}

pub(crate) fn chief(ended: &[Ended]) -> &Ended {
    ended
        .iter()
        .find(|e| e.name == "/job:chief/task:0")
        .or_else(|| ended.iter().find(|e| e.name == "/job:worker/task:0"))
        .expect("the chief")
}

/// Runs `tessera train` on each of `tasks`, each socket-activated on a loopback port of its
/// own, its `TF_CONFIG` made by `tf_config(job, index, address_of)` and `args` after `train`;
/// returns how each ended.
fn tf_config_job(
    tasks: &[(&str, usize)],
    tf_config: impl Fn(&str, usize, &dyn Fn(&str, usize) -> String) -> serde_json::Value,
    args: &[&std::ffi::OsStr],
) -> Vec<Ended> {
    let listeners: Vec<TcpListener> = tasks
        .iter()
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let address_of = |job: &str, index: usize| -> String {
        let at = tasks.iter().position(|t| *t == (job, index)).unwrap();
        listeners[at].local_addr().unwrap().to_string()
    };
    let mut children = Vec::new();
    for (&(job, index), listener) in tasks.iter().zip(&listeners) {
        let mut command = socket_activated(Path::new(BIN), listener);
        command
            .arg("train")
            .args(args)
            .env("TF_CONFIG", tf_config(job, index, &address_of).to_string())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = command.spawn().expect("spawn tessera train");
        children.push((format!("/job:{job}/task:{index}"), child));
    }
    wait_all(children)
}

/// Asserts the evaluator scored checkpoints of `ckpt` up to the last, which scores as the
/// chief said.
fn assert_evaluator_scored_the_last_checkpoint(ended: &[Ended], ckpt: &Path) {
    let latest = latest_checkpoint(ckpt).unwrap().expect("a checkpoint");
    let evaluator = ended
        .iter()
        .find(|e| e.name == "/job:evaluator/task:0")
        .unwrap();
    let last = evaluator.stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(&format!(
            "tessera: checkpoint {} (global step",
            latest.display()
        )),
        "{}\n{}",
        evaluator.stdout,
        evaluator.stderr
    );
    let accuracy = |line: &str| line.split("held-out accuracy ").nth(1).map(str::to_string);
    let chief_line = chief(ended)
        .stdout
        .lines()
        .find(|l| l.contains("held-out accuracy"));
    assert_eq!(
        accuracy(last),
        chief_line.and_then(accuracy),
        "{}",
        evaluator.stdout
    );
}

/// What a Kubeflow TFJob sets: one `TF_CONFIG` per task naming the whole cluster and the task;
/// an evaluator (outside the cluster) scores the chief's checkpoints.
#[test]
fn a_tf_config_with_a_chief_trains_on_1_chief_1_ps_and_2_workers_and_an_evaluator_scores_it() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let runs = dir.path().join("runs");
    let tasks = [
        ("chief", 0),
        ("ps", 0),
        ("worker", 0),
        ("worker", 1),
        ("evaluator", 0),
    ];
    let tf_config = |job: &str, index: usize, addr: &dyn Fn(&str, usize) -> String| {
        let cluster = serde_json::json!({
            "chief": [addr("chief", 0)], "ps": [addr("ps", 0)],
            "worker": [addr("worker", 0), addr("worker", 1)],
        });
        serde_json::json!({"cluster": cluster, "task": {"type": job, "index": index}})
    };
    let args = [
        "--steps".as_ref(),
        "200".as_ref(),
        "--checkpoint_dir".as_ref(),
        ckpt.as_os_str(),
        "--logdir".as_ref(),
        runs.as_os_str(),
    ];
    let ended = tf_config_job(&tasks, tf_config, &args);
    // Three replicas trained (the chief's own job and two workers) to step 200.
    assert_trained(&ended, "2");
    assert_evaluator_scored_the_last_checkpoint(&ended, &ckpt);
}

/// A Kubeflow TFJob with dynamic workers (`enableDynamicWorker`) writes a sparse
/// `TF_CONFIG`, under `sparseCluster`: a ps sees only itself (a one-address list, whatever its
/// index, and an empty worker job), a worker the ps tasks and itself, an evaluator nothing.
/// The ps tasks learn the workers from their masters' sessions, the workers meet the chief
/// (worker 0) on ps 0, and every task ends by itself.
#[test]
fn a_sparse_tf_config_of_dynamic_workers_trains_and_every_task_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let tasks = [
        ("ps", 0),
        ("ps", 1),
        ("worker", 0),
        ("worker", 1),
        ("worker", 2),
        ("evaluator", 0),
    ];
    // What the TFJob operator's sparse form gives each replica.
    let tf_config = |job: &str, index: usize, addr: &dyn Fn(&str, usize) -> String| {
        let sparse = match job {
            "ps" => serde_json::json!({"worker": {}, "ps": [addr(job, index)]}),
            "worker" => serde_json::json!({
                "worker": {index.to_string(): addr(job, index)},
                "ps": [addr("ps", 0), addr("ps", 1)],
            }),
            _ => serde_json::json!({"worker": {}, "ps": []}),
        };
        serde_json::json!({"sparseCluster": sparse, "task": {"type": job, "index": index}})
    };
    let args = [
        "--steps".as_ref(),
        "300".as_ref(),
        "--checkpoint_dir".as_ref(),
        ckpt.as_os_str(),
    ];
    let ended = tf_config_job(&tasks, tf_config, &args);
    // Three workers trained asynchronously to step 300 (or a little past it).
    assert_trained(&ended, "3");
    // Every worker's last step reached the chief through ps 0 before it ended the job.
    assert!(
        !chief(&ended).stderr.contains("not every unlisted worker"),
        "{}",
        chief(&ended).stderr
    );
    assert_evaluator_scored_the_last_checkpoint(&ended, &ckpt);
}

#[test]
fn async_training_of_the_mlp_reaches_the_stated_accuracy_and_every_task_exits_0() {
    let ended = run_job(
        &[("ps", 1), ("worker", 2)],
        &[
            "--model",
            "mlp",
            "--hidden",
            "64,32",
            "--optimizer",
            "adam",
            "--steps",
            "300",
        ],
    );
    assert_trained(&ended, "3");
}

#[test]
fn sync_training_with_two_replicas_reaches_the_stated_accuracy_and_every_task_exits_0() {
    // Momentum: the averaged gradients go through the optimizer's own update and its slots.
    let ended = run_job(
        &[("ps", 1), ("worker", 2)],
        &[
            "--sync",
            "--replicas_to_aggregate",
            "2",
            "--optimizer",
            "momentum",
            "--learning_rate",
            "0.05",
            "--steps",
            "200",
        ],
    );
    // Synchronous: one update per aggregated pair of gradients, so exactly the last step.
    assert_trained(&ended, "200 ");
}

/// A graph of one `ReadVariableOp` per checkpointed variable, named `check/<name>`.
fn reads(entries: &[(String, tessera::tensor::DType)]) -> GraphDef {
    GraphDef {
        node: entries
            .iter()
            .map(|(name, dtype)| NodeDef {
                name: format!("check/{name}"),
                op: "ReadVariableOp".into(),
                input: vec![name.clone()],
                attr: [("dtype".to_string(), value::dtype(*dtype))].into(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

#[test]
fn the_chiefs_checkpoint_restores_into_a_fresh_cluster_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let ckpt_arg = ckpt.to_str().unwrap();
    let ended = run_job(
        &[("ps", 1), ("worker", 2)],
        &[
            "--steps",
            "60",
            "--save_every",
            "25",
            "--checkpoint_dir",
            ckpt_arg,
        ],
    );
    assert_all_exited_0(&ended);
    let prefix = latest_checkpoint(&ckpt).unwrap().expect("a checkpoint");
    let prefix_str = prefix.to_str().unwrap().to_string();
    let bundle = BundleReader::open(&prefix_str).unwrap();
    let expected: Vec<(String, tessera::tensor::Tensor)> = bundle
        .entries()
        .keys()
        .map(|name| (name.clone(), bundle.read(name).unwrap()))
        .collect();
    // The default MLP's 2 layers of weights and biases, Adam's two slots per variable, its
    // two powers, and the global step.
    assert_eq!(
        expected.len(),
        4 * 3 + 2 + 1,
        "{:?}",
        bundle.entries().keys()
    );
    let step = expected
        .iter()
        .find(|(n, _)| n == "global_step")
        .map(|(_, t)| t.scalar_value::<i64>().unwrap())
        .unwrap();
    assert!(step >= 60, "final checkpoint at step {step}");
    assert!(
        prefix_str.ends_with(&format!("model.ckpt-{step}")),
        "{prefix_str}"
    );

    // A fresh cluster of plain daemons; the same graph (the default flags), restored.
    let cluster = Cluster::start(&[("ps", 1), ("worker", 2)]);
    let placement = Placement {
        num_ps: 1,
        job: "worker".into(),
        chief: true,
        worker_index: 0,
        num_workers: 2,
    };
    let built = model::build(&TrainSpec::default(), &placement, 32, 10).unwrap();
    let session = Session::connect(&cluster.target("worker", 0)).unwrap();
    session.extend(&built.graph).unwrap();
    Saver::new(built.saver.clone(), 5)
        .restore(&session, &prefix)
        .unwrap();
    let entries: Vec<_> = expected
        .iter()
        .map(|(n, t)| (n.clone(), t.dtype()))
        .collect();
    session.extend(&reads(&entries)).unwrap();
    let fetches: Vec<String> = entries
        .iter()
        .map(|(n, _)| format!("check/{n}:0"))
        .collect();
    let fetch_refs: Vec<&str> = fetches.iter().map(String::as_str).collect();
    let restored = session.run(&[], &fetch_refs, &[]).unwrap();
    for ((name, want), got) in expected.iter().zip(&restored) {
        assert_eq!(got.dtype(), want.dtype(), "{name}");
        assert_eq!(got.shape(), want.shape(), "{name}");
        assert_eq!(got.bytes(), want.bytes(), "{name}: values differ");
    }
}

#[test]
fn tessera_local_runs_the_embedded_cluster_to_the_end_and_exits_0() {
    let runs = tempfile::tempdir().unwrap();
    let child = Command::new(BIN)
        .args(["local", "--steps", "60", "--timeout", "150s", "--logdir"])
        .arg(runs.path())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ended = wait_all(vec![("tessera local".into(), child)]);
    let local = &ended[0];
    assert_all_exited_0(&ended);
    // Three readiness lines: 1 ps and 2 workers, each on the port the launcher bound.
    let serving = local
        .stdout
        .lines()
        .filter(|l| l.starts_with("tessera: serving /job:"))
        .count();
    assert_eq!(serving, 3, "{}", local.stdout);
    let accuracy = held_out_accuracy(local);
    assert!(
        accuracy > 0.1,
        "better than chance after 60 steps: {accuracy}"
    );
    assert!(
        local.stdout.contains("every task exited 0"),
        "{}",
        local.stdout
    );
    // Each task's peak resident memory, from the kernel's account of its process: a daemon
    // that trained holds more than a few MiB and, for this small model, less than a few GiB.
    let peaks = local
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("tessera: peak resident memory: "))
        .unwrap_or_else(|| panic!("no peak memory line:\n{}", local.stdout));
    let tasks: Vec<(&str, f64)> = peaks
        .split(", ")
        .map(|t| {
            let (task, mib) = t.strip_suffix(" MiB").unwrap().rsplit_once(' ').unwrap();
            (task, mib.parse().unwrap())
        })
        .collect();
    let names: Vec<&str> = tasks.iter().map(|(t, _)| *t).collect();
    assert_eq!(
        names,
        ["/job:ps/task:0", "/job:worker/task:0", "/job:worker/task:1"],
        "{peaks}"
    );
    for (task, mib) in tasks {
        assert!((5.0..4096.0).contains(&mib), "{task}: {mib} MiB");
    }
}

/// The chief's `held-out mean squared error X (predicting zeros: Y)` line: (X, Y).
fn held_out_mean_squared_error(chief: &Ended) -> (f64, f64) {
    let line = chief
        .stdout
        .lines()
        .find(|l| l.contains("held-out mean squared error"))
        .unwrap_or_else(|| {
            panic!(
                "no squared error line in the chief's stdout:\n{}",
                chief.stdout
            )
        });
    let numbers: Vec<f64> = line
        .split([' ', ')'])
        .filter_map(|w| w.parse().ok())
        .collect();
    match numbers[..] {
        [mse, zeros, ..] => (mse, zeros),
        _ => panic!("unparsable squared error line `{line}`"),
    }
}

#[test]
fn regression_on_a_teachers_targets_learns_the_map_on_1_ps_and_2_workers() {
    // 64 features, 32 targets from a rank-4 teacher: small enough for a test, the same graph
    // as the 1024 x 4096 model of the trainer bench.
    let ended = run_job(
        &[("ps", 1), ("worker", 2)],
        &[
            "--model",
            "regression",
            "--inputs",
            "64",
            "--outputs",
            "32",
            "--teacher_rank",
            "4",
            "--learning_rate",
            "0.1",
            "--batch_size",
            "32",
            "--steps",
            "300",
        ],
    );
    assert_all_exited_0(&ended);
    let (mse, zeros) = held_out_mean_squared_error(chief(&ended));
    assert!(
        mse < 0.1 * zeros,
        "held-out squared error {mse} is not a tenth of predicting zeros ({zeros})"
    );
}

#[test]
fn regression_and_classification_data_are_refused_by_the_other_kind_of_model() {
    let regression_on_digits = run_chief_alone(&["--model", "regression", "--data", "digits"]);
    assert_fails_with(
        &regression_on_digits,
        &["--model regression", "--data teacher"],
    );
    let mlp_on_teacher = run_chief_alone(&["--model", "mlp", "--data", "teacher"]);
    assert_fails_with(
        &mlp_on_teacher,
        &["real-valued targets", "--model regression"],
    );
    let sizes_on_digits = run_chief_alone(&["--model", "mlp", "--inputs", "8"]);
    assert_fails_with(&sizes_on_digits, &["--inputs", "--data teacher"]);
}

/// Runs the chief alone (`worker` 0 of a 1 ps + 1 worker cluster file whose ports are 0,
/// nothing else started) with `args`; returns how it ended.
fn run_chief_alone(args: &[&str]) -> Ended {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cluster.toml");
    std::fs::write(
        &config,
        "[cluster]\nps = [\"127.0.0.1:0\"]\nworker = [\"127.0.0.1:0\"]\n[devices]\ngpu = 0\n",
    )
    .unwrap();
    let mut command = Command::new(BIN);
    command.args(["train", "--config"]).arg(&config).args(args);
    if !args.contains(&"--logdir") {
        command.arg("--logdir").arg(dir.path().join("runs"));
    }
    let child = command
        .env("TESSERA__TASK__JOB", "worker")
        .env("TESSERA__TASK__INDEX", "0")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_all(vec![("chief".into(), child)]).remove(0)
}

fn assert_fails_with(ended: &Ended, needles: &[&str]) {
    assert!(
        !ended.status.success(),
        "exited 0:\n{}\n{}",
        ended.stdout,
        ended.stderr
    );
    for needle in needles {
        assert!(
            ended.stderr.contains(needle),
            "stderr lacks `{needle}`:\n{}",
            ended.stderr
        );
    }
}

#[test]
fn an_unknown_model_or_optimizer_is_refused_naming_the_known_ones() {
    let ended = run_chief_alone(&["--model", "resnet"]);
    assert_fails_with(&ended, &["unknown model `resnet`", "softmax, mlp"]);
    let ended = run_chief_alone(&["--optimizer", "lbfgs"]);
    assert_fails_with(
        &ended,
        &[
            "unknown optimizer `lbfgs`",
            "gd, momentum, adagrad, adam, rmsprop",
        ],
    );
}

#[test]
fn a_csv_with_a_bad_row_is_refused_naming_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("bad.csv");
    std::fs::write(&csv, "0.5,1.5,0\n2.5,0.25,1\n1.0,oops,1\n").unwrap();
    let data = format!("csv:{}", csv.display());
    let ended = run_chief_alone(&["--data", &data]);
    assert_fails_with(&ended, &[&format!("{}:3", csv.display())]);
}

/// A CSV file as users have it: a header line and the label (`species`, 3 classes) first,
/// then 4 features around each class's center.
fn header_label_first_csv(path: &Path) {
    let mut text = String::from("species,f0,f1,f2,f3\n");
    for i in 0..600u32 {
        let class = i % 3;
        // Deterministic noise in [-1, 1) per feature; the centers are 4 apart.
        let noise = |k: u32| ((i * 7919 + k * 104_729) % 1000) as f32 / 500.0 - 1.0;
        let f: Vec<String> = (0..4)
            .map(|k| format!("{}", 4.0 * ((class + k) % 3) as f32 + noise(k)))
            .collect();
        text.push_str(&format!("{class},{}\n", f.join(",")));
    }
    std::fs::write(path, text).unwrap();
}

#[test]
fn a_csv_with_a_header_and_the_label_first_trains_with_label_column() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("iris-like.csv");
    header_label_first_csv(&csv);
    let data = format!("csv:{}", csv.display());
    let ended = run_job(
        &[("ps", 1), ("worker", 1)],
        &[
            "--data",
            &data,
            "--label_column",
            "species",
            "--steps",
            "200",
        ],
    );
    assert_all_exited_0(&ended);
    let accuracy = held_out_accuracy(chief(&ended));
    assert!(
        accuracy >= 0.9,
        "held-out accuracy {accuracy} on 3 classes 4 apart:\n{}",
        chief(&ended).stdout
    );
}

#[test]
fn a_bad_label_column_is_refused_naming_the_header() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("iris-like.csv");
    header_label_first_csv(&csv);
    let data = format!("csv:{}", csv.display());
    let ended = run_chief_alone(&["--data", &data, "--label_column", "class"]);
    assert_fails_with(
        &ended,
        &[
            &format!(
                "{}:1: label column `class` is not in the header",
                csv.display()
            ),
            "(columns: species, f0, f1, f2, f3)",
        ],
    );
    let ended = run_chief_alone(&["--label_column", "0"]);
    assert_fails_with(
        &ended,
        &["--label_column, --csv_header and --id_columns apply to --data csv:PATH"],
    );
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    files.sort();
    files
}

#[test]
fn an_unwritable_logdir_is_refused_before_training_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    // A path whose parent is a file: no process can create the directory, root included.
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"precious").unwrap();
    let under_file = file.join("runs");
    let logdir = under_file.to_str().unwrap();
    let ended = run_chief_alone(&["--logdir", logdir]);
    assert_fails_with(&ended, &["not writable", "--logdir", logdir]);
    assert_eq!(std::fs::read(&file).unwrap(), b"precious");
    assert!(
        !ended.stdout.contains("tessera: serving"),
        "refused before the daemon started:\n{}",
        ended.stdout
    );
    // `tessera local` refuses it before starting any task.
    let child = Command::new(BIN)
        .args(["local", "--timeout", "60s", "--logdir", logdir])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ended = wait_all(vec![("tessera local".into(), child)]);
    assert_fails_with(&ended[0], &["not writable", "--logdir", logdir]);
    assert!(
        !ended[0].stdout.contains("tessera: serving"),
        "{}",
        ended[0].stdout
    );
}

#[test]
fn an_unwritable_checkpoint_dir_is_refused_before_training_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // A path whose parent is a file: no process can create the directory, root included.
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"precious").unwrap();
    let under_file = file.join("ckpt");
    let ended = run_chief_alone(&["--checkpoint_dir", under_file.to_str().unwrap()]);
    assert_fails_with(&ended, &["not writable", "--checkpoint_dir"]);
    assert_eq!(std::fs::read(&file).unwrap(), b"precious");
    assert!(
        !ended.stdout.contains("tessera: serving"),
        "refused before the daemon started:\n{}",
        ended.stdout
    );

    // A read-only directory holding a checkpoint (permissions bind only without root).
    let ckpt = dir.path().join("ckpt");
    std::fs::create_dir(&ckpt).unwrap();
    std::fs::write(
        ckpt.join("checkpoint"),
        "model_checkpoint_path: \"model.ckpt-7\"\n",
    )
    .unwrap();
    std::fs::write(ckpt.join("model.ckpt-7.index"), b"index bytes").unwrap();
    let before = snapshot(&ckpt);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ckpt, std::fs::Permissions::from_mode(0o555)).unwrap();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        let ended = run_chief_alone(&["--checkpoint_dir", ckpt.to_str().unwrap()]);
        assert_fails_with(&ended, &["not writable"]);
    }
    std::fs::set_permissions(&ckpt, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(snapshot(&ckpt), before);
}

#[test]
fn a_worker_started_with_another_model_than_the_chiefs_fails_naming_the_flag() {
    let job = start_job_each(&[("ps", 1), ("worker", 2)], "", &|_, index| {
        let hidden = if index == 1 { "64" } else { "128" };
        ["--steps", "100000", "--hidden", hidden]
            .map(String::from)
            .to_vec()
    });
    let mut tasks = job.tasks;
    let worker = tasks.remove(2);
    let ended = wait_all(vec![(worker.name, worker.child)]);
    let stderr = &ended[0].stderr;
    assert_eq!(ended[0].status.code(), Some(1), "{stderr}");
    for needle in [
        "/job:worker/task:1 trains another model than the chief's",
        "--hidden: the chief has 128, this task 64",
        "start every task of the job with the same flags",
    ] {
        assert!(stderr.contains(needle), "{needle}: {stderr}");
    }
    for task in tasks {
        // SAFETY: our children, not yet reaped.
        unsafe { libc::kill(task.child.id() as libc::pid_t, libc::SIGKILL) };
        support::cluster::wait_with_deadline(task.child, &task.name);
    }
}

#[test]
fn a_ps_not_given_the_checkpoint_dir_is_named_with_the_flag_it_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt").display().to_string();
    // The chief has --checkpoint_dir, the ps does not: the ps refuses the chief's SaveV2.
    let job = start_job_each(&[("ps", 1), ("worker", 1)], "", &|job, _| {
        let mut args = vec!["--steps".to_string(), "20".into()];
        if job == "worker" {
            args.extend(["--checkpoint_dir".to_string(), ckpt.clone()]);
        }
        args
    });
    let mut tasks = job.tasks;
    let ps = tasks.remove(0);
    let chief = tasks.remove(0);
    let ended = wait_all(vec![(chief.name, chief.child)]);
    assert_eq!(ended[0].status.code(), Some(1), "{}", ended[0].stderr);
    for needle in [
        "PERMISSION_DENIED",
        "on /job:ps/task:0, give this task's `tessera train` the same \
         --checkpoint_dir",
    ] {
        assert!(
            ended[0].stderr.contains(needle),
            "{needle}: {}",
            ended[0].stderr
        );
    }
    // SAFETY: our child, not yet reaped.
    unsafe { libc::kill(ps.child.id() as libc::pid_t, libc::SIGTERM) };
    support::cluster::wait_with_deadline(ps.child, "the ps after SIGTERM");
}

#[test]
fn a_ps_whose_chief_failed_keeps_serving_and_sigterm_ends_it_with_status_143() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("bad.csv");
    std::fs::write(&csv, "0.5,1.5,0\n1.0,oops,1\n").unwrap();
    let data = format!("csv:{}", csv.display());
    let mut job = start_job(&[("ps", 1), ("worker", 1)], &["--data", &data]);
    let mut ps = job.tasks.remove(0);
    let chief = job.tasks.remove(0);
    let ended = wait_all(vec![(chief.name, chief.child)]);
    assert!(
        !ended[0].status.success(),
        "the chief with a bad CSV exited 0"
    );

    // The ps was never told that training is over: it still serves (a restarted chief could
    // go on with it).
    let mut stdout = BufReader::new(ps.child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(
        line.trim_end(),
        format!("tessera: serving /job:ps/replica:0/task:0 on {}", ps.addr)
    );
    let status = Command::new(BIN)
        .args(["status", &format!("grpc://{}", ps.addr), "--timeout", "10s"])
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "the ps stopped serving: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(ps.child.try_wait().unwrap().is_none(), "the ps exited");

    // SAFETY: our child, not yet reaped.
    assert_eq!(
        unsafe { libc::kill(ps.child.id() as libc::pid_t, libc::SIGTERM) },
        0
    );
    let status = support::cluster::wait_with_deadline(ps.child, "the ps after SIGTERM");
    // Stopped before training ended: 128 + SIGTERM, which a TFJob retries.
    assert_eq!(status.code(), Some(143), "the ps after SIGTERM: {status:?}");
}

#[test]
fn a_chief_started_again_restores_the_latest_checkpoint_and_goes_on_from_its_step() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let ckpt_arg = ckpt.to_str().unwrap();
    let first = run_job(
        &[("ps", 1), ("worker", 1)],
        &["--steps", "30", "--checkpoint_dir", ckpt_arg],
    );
    assert_all_exited_0(&first);
    let saved = latest_checkpoint(&ckpt).unwrap().expect("a checkpoint");
    // One worker: the global step ends exactly at the last step.
    assert!(
        saved.to_str().unwrap().ends_with("model.ckpt-30"),
        "{saved:?}"
    );

    // A new cluster, the same directory, a later last step.
    let second = run_job(
        &[("ps", 1), ("worker", 1)],
        &["--steps", "50", "--checkpoint_dir", ckpt_arg],
    );
    assert_all_exited_0(&second);
    let chief = chief(&second);
    assert!(
        chief
            .stdout
            .contains(&format!("started from checkpoint {}", saved.display())),
        "{}",
        chief.stdout
    );
    // 20 more steps, not 50: training went on from step 30.
    assert!(
        chief.stdout.contains("trained to global step 50 "),
        "{}",
        chief.stdout
    );
    let last = latest_checkpoint(&ckpt).unwrap().expect("a checkpoint");
    assert!(
        last.to_str().unwrap().ends_with("model.ckpt-50"),
        "{last:?}"
    );

    // A task (re)started after training ended, its cluster gone: the checkpoint says the job
    // is over, and it exits 0 at once instead of waiting for tasks that will not come.
    let late = run_job(
        &[("ps", 1), ("worker", 2)],
        &["--steps", "50", "--checkpoint_dir", ckpt_arg],
    );
    assert_all_exited_0(&late);
    for task in &late {
        assert!(
            task.stdout.contains(&format!(
                "training already ended: checkpoint {} is at global step 50 of --steps 50",
                last.display()
            )),
            "{}: {}",
            task.name,
            task.stdout
        );
    }
}

#[test]
fn the_chiefs_signals_reach_every_task_through_its_own_server_and_stay_set() {
    use crate::support::cluster::InProcessCluster;
    use tessera::cluster::TaskId;
    use tessera::train::job::signal::{
        report_finished, report_unlisted, wait_for_done, ChiefSignals, UNLISTED_FINISHED,
        UNLISTED_STARTED,
    };

    let cluster = InProcessCluster::start(&[("ps", 1), ("worker", 2)]);
    let ps = TaskId::new("ps", 0);
    let chief = TaskId::new("worker", 0);
    let worker = TaskId::new("worker", 1);
    let (ps_target, worker_target) = (cluster.target("ps", 0), cluster.target("worker", 1));

    // Worker 1 reports its last step through its own server; the chief sees it.
    report_finished(&worker_target, &chief, 1).unwrap();
    let signals = ChiefSignals::connect(
        &cluster.target("worker", 0),
        &chief,
        &[ps.clone(), worker.clone()],
        &ps,
    )
    .unwrap();
    assert_eq!(signals.wait_for_workers(1, Duration::from_secs(20)), [1]);
    // No worker the chief does not know started: nothing to wait for.
    let started = Instant::now();
    signals.wait_for_unlisted(Duration::from_secs(20));
    assert!(started.elapsed() < Duration::from_secs(5));
    // One that did (a sparse TF_CONFIG's worker 1, reporting on ps 0) is waited for until
    // it reports its last step there.
    report_unlisted(&worker_target, &ps, UNLISTED_STARTED, 1).unwrap();
    thread::scope(|scope| {
        let (tx, rx) = mpsc::channel();
        let signals = &signals;
        scope.spawn(move || {
            signals.wait_for_unlisted(Duration::from_secs(20));
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(500)).is_err(),
            "the chief ended before the unlisted worker's last step"
        );
        report_unlisted(&worker_target, &ps, UNLISTED_FINISHED, 1).unwrap();
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the chief saw the unlisted worker finish within 10 s");
    });

    // The ps watches its own queue until the chief closes it.
    let (tx, rx) = mpsc::channel();
    let watched = ps.clone();
    let target = ps_target.clone();
    thread::spawn(move || {
        let _ = tx.send(wait_for_done(&target, &watched, None));
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "the ps saw an end nobody announced"
    );
    signals.announce_done().unwrap();
    rx.recv_timeout(Duration::from_secs(20))
        .expect("the ps was told within 20 s")
        .unwrap();
    // A task that looks only now (worker 1 finished late) sees the signal at once, and so
    // does a watcher that starts over: the queue stays closed.
    let started = Instant::now();
    wait_for_done(&worker_target, &worker, None).unwrap();
    wait_for_done(&ps_target, &ps, None).unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn the_chiefs_wait_for_workers_that_never_report_is_bounded() {
    use crate::support::cluster::InProcessCluster;
    use tessera::cluster::TaskId;
    use tessera::train::job::signal::ChiefSignals;

    let cluster = InProcessCluster::start(&[("ps", 1), ("worker", 2)]);
    let chief = TaskId::new("worker", 0);
    let ps = TaskId::new("ps", 0);
    let signals = ChiefSignals::connect(&cluster.target("worker", 0), &chief, &[], &ps).unwrap();
    let started = Instant::now();
    // Worker 1 never reports: the wait ends after its bound (polls of 2 s each) with nobody.
    assert!(signals
        .wait_for_workers(1, Duration::from_secs(3))
        .is_empty());
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(3) && waited < Duration::from_secs(15),
        "{waited:?}"
    );
}

#[test]
fn tessera_local_names_the_task_that_failed_and_how() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.csv");
    let data = format!("csv:{}", missing.display());
    let child = Command::new(BIN)
        .args(["local", "--data", &data, "--timeout", "120s", "--logdir"])
        .arg(dir.path().join("runs"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ended = wait_all(vec![("tessera local".into(), child)]);
    // Both workers read the data and fail; whichever the launcher hears of first is named,
    // with its exit status, and the other tasks (the ps would serve on) are stopped.
    assert_fails_with(
        &ended[0],
        &["exited with status 1", "the other tasks were stopped"],
    );
    // Bad input, not a fault a restart fixes: the launcher exits 1 as its task did.
    assert_eq!(ended[0].status.code(), Some(1));
    assert!(
        ended[0].stderr.contains("/job:worker/task:0 exited")
            || ended[0].stderr.contains("/job:worker/task:1 exited"),
        "{}",
        ended[0].stderr
    );
    assert!(
        ended[0].stderr.contains(&missing.display().to_string()),
        "the worker's own error names the file:\n{}",
        ended[0].stderr
    );
}

#[test]
fn async_training_with_two_towers_per_worker_reaches_the_stated_accuracy_and_exits_0() {
    // Each worker's batch of 64 splits into two towers of 32 on its CPU:0 and CPU:1. The
    // cluster file asks for no CPU count, so only `--towers 2` gives each worker a CPU:1; with
    // soft placement off, a tower op requesting a CPU:1 that did not exist would fail the
    // step instead of falling back to CPU:0.
    let job = start_job_with_devices(
        &[("ps", 1), ("worker", 2)],
        "soft_placement = false\n",
        &["--towers", "2", "--batch_size", "64", "--steps", "300"],
    );
    let ended = wait_all(job.tasks.into_iter().map(|t| (t.name, t.child)).collect());
    assert_trained(&ended, "3");
}

#[test]
fn towers_summing_gradients_with_all_reduce_train_and_exit_0() {
    // As above, with each gradient summed by NcclAllReduce among CPU:0 and CPU:1 of each
    // worker (in host memory: there are no GPUs) instead of AddN.
    let job = start_job_with_devices(
        &[("ps", 1), ("worker", 2)],
        "soft_placement = false\n",
        &[
            "--towers",
            "2",
            "--all_reduce",
            "--batch_size",
            "64",
            "--steps",
            "300",
        ],
    );
    let ended = wait_all(job.tasks.into_iter().map(|t| (t.name, t.child)).collect());
    assert_trained(&ended, "3");
}

#[test]
fn a_bad_towers_value_is_refused_naming_it_and_the_batch() {
    let ended = run_chief_alone(&["--towers", "0"]);
    assert_fails_with(&ended, &["--towers 0"]);
    // 50 = 3·16 + 2: three towers cannot take equal parts.
    let ended = run_chief_alone(&["--towers", "3", "--batch_size", "50"]);
    assert_fails_with(&ended, &["--batch_size 50", "--towers 3"]);
    let ended = run_chief_alone(&["--tower_device", "tpu"]);
    assert_fails_with(&ended, &["`tpu` is not a tower device"]);
    assert!(
        !ended.stdout.contains("tessera: serving"),
        "refused before the daemon started:\n{}",
        ended.stdout
    );
    // GPU towers on a worker without GPUs (`[devices] gpu = 0`), or in a build without the
    // GPU kernels, are refused rather than quietly run on the CPU.
    let ended = run_chief_alone(&["--towers", "2", "--tower_device", "gpu"]);
    assert_fails_with(&ended, &["--tower_device gpu", "--tower_device cpu"]);
    assert!(
        !ended.stdout.contains("tessera: serving"),
        "{}",
        ended.stdout
    );
}

#[test]
fn sync_training_with_two_towers_per_worker_reaches_the_stated_accuracy_and_exits_0() {
    // Each worker averages its two towers' gradients; the chief averages the two workers'.
    let ended = run_job(
        &[("ps", 1), ("worker", 2)],
        &[
            "--sync",
            "--optimizer",
            "gd",
            "--learning_rate",
            "0.05",
            "--towers",
            "2",
            "--steps",
            "200",
        ],
    );
    assert_trained(&ended, "200 ");
}

#[test]
fn the_main_job_trains_the_default_mlp_on_the_digits_to_97_percent() {
    // `cargo run --release` with no flags: the defaults, on the embedded cluster, in a
    // directory of its own (the default --logdir is runs/<time> under it).
    let cwd = tempfile::tempdir().unwrap();
    let child = Command::new(BIN)
        .args(["local", "--timeout", "150s"])
        .current_dir(cwd.path())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ended = wait_all(vec![("tessera local".into(), child)]);
    assert_all_exited_0(&ended);
    let local = &ended[0];
    assert!(
        local
            .stdout
            .contains("training an MLP (128) on the handwritten digits"),
        "{}",
        local.stdout
    );
    let accuracy = held_out_accuracy(local);
    assert!(
        accuracy >= 0.97,
        "held-out accuracy {accuracy} on the digits:\n{}",
        local.stdout
    );
    assert!(local.stdout.contains("on 359 examples"), "{}", local.stdout);
    assert!(local.stdout.contains(" steps/s)"), "{}", local.stdout);
    // Where TensorBoard finds the run: one event file under runs/<time>.
    let logdir = local
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("tessera: tensorboard --logdir "))
        .unwrap_or_else(|| panic!("no tensorboard line:\n{}", local.stdout));
    assert!(logdir.starts_with("runs/"), "{logdir}");
    let events: Vec<_> = std::fs::read_dir(cwd.path().join(logdir))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        events.len() == 1 && events[0].starts_with("events.out.tfevents."),
        "{events:?}"
    );
}

#[test]
fn trace_step_writes_a_chrome_trace_of_one_step_on_every_task_beside_the_event_files() {
    let runs = tempfile::tempdir().unwrap();
    let logdir = runs.path().join("run");
    let logdir_arg = logdir.to_str().unwrap();
    let ended = run_job(
        &[("ps", 1), ("worker", 2)],
        &[
            "--steps",
            "60",
            "--trace_step",
            "20",
            "--logdir",
            logdir_arg,
        ],
    );
    assert_all_exited_0(&ended);
    let chief = chief(&ended);
    let path = chief
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("tessera: step trace "))
        .and_then(|rest| rest.split(" (open").next())
        .unwrap_or_else(|| panic!("no step trace line:\n{}", chief.stdout));
    let name = Path::new(path).file_name().unwrap().to_str().unwrap();
    let at: i64 = name
        .strip_prefix("trace-step-")
        .and_then(|n| n.strip_suffix(".json"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{name}"));
    assert!((20..60).contains(&at), "traced at global step {at}");
    assert_eq!(Path::new(path).parent().unwrap(), logdir);
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    // A process per device of the step: the ps's and the chief's.
    let processes: Vec<&str> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    for device in [
        "/job:ps/replica:0/task:0/device:CPU:0",
        "/job:worker/replica:0/task:0/device:CPU:0",
    ] {
        assert!(
            processes.iter().any(|p| p.starts_with(device)),
            "{device} not in {processes:?}"
        );
    }
    // Ops ran on both: the gradients' MatMuls on the worker, the update on the ps.
    let ops: BTreeSet<&str> = events
        .iter()
        .filter(|e| e["ph"] == "X")
        .filter_map(|e| e["args"]["op"].as_str())
        .collect();
    for op in ["MatMul", "_Recv", "_Send", "ResourceApplyAdam"] {
        assert!(ops.contains(op), "no {op} in {ops:?}");
    }
}

/// The cnn's bar on the digits (the issue's: 97.5 %; measured with the defaults, seeds 1, 2,
/// 3 on the embedded cluster: 98.33, 98.89, 97.77 %).
const CNN_DIGITS_ACCURACY: f64 = 0.975;

#[test]
fn async_training_of_the_cnn_on_1_ps_and_2_workers_reaches_97_5_percent_on_the_digits() {
    // The defaults otherwise: adam, 0.01, batches of 64, 1000 steps, seed 1.
    let ended = run_job(&[("ps", 1), ("worker", 2)], &["--model", "cnn"]);
    assert_all_exited_0(&ended);
    let chief = chief(&ended);
    let accuracy = held_out_accuracy(chief);
    assert!(
        accuracy >= CNN_DIGITS_ACCURACY,
        "held-out accuracy {accuracy} of the cnn on the digits:\n{}",
        chief.stdout
    );
    assert!(
        chief.stdout.contains("trained to global step 1"),
        "{}",
        chief.stdout
    );
}

#[test]
fn sync_training_of_the_cnn_with_two_towers_per_worker_reaches_the_stated_accuracy() {
    // Each worker's batch of 64 splits over its CPU:0 and CPU:1; the chief averages the two
    // workers' gradients per update.
    let job = start_job_with_devices(
        &[("ps", 1), ("worker", 2)],
        "soft_placement = false\n",
        &[
            "--model",
            "cnn",
            "--filters",
            "8,16",
            "--sync",
            "--towers",
            "2",
            "--steps",
            "150",
        ],
    );
    let ended = wait_all(job.tasks.into_iter().map(|t| (t.name, t.child)).collect());
    assert_trained(&ended, "150 ");
}

/// Writes `n` MNIST-format images of `rows × cols` and their labels into `dir`: class `c` of
/// 4 is a bright 8×8 block in quadrant `c`, shifted by up to 3 pixels, on a noisy background.
/// Returns the `--data` argument.
fn write_quadrant_images(dir: &Path, n: usize, rows: usize, cols: usize) -> String {
    use rand::{Rng, SeedableRng};
    use tessera::data::idx::{write_idx, IdxArray};

    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let (mut pixels, mut labels) = (Vec::with_capacity(n * rows * cols), Vec::with_capacity(n));
    for i in 0..n {
        let class = i % 4;
        let (top, left) = ((class / 2) * rows / 2, (class % 2) * cols / 2);
        let (top, left) = (top + rng.random_range(0..4), left + rng.random_range(0..4));
        for r in 0..rows {
            for c in 0..cols {
                let inside = (top..top + 8).contains(&r) && (left..left + 8).contains(&c);
                let noise: u8 = rng.random_range(0..80);
                pixels.push(if inside { 175 + noise } else { noise });
            }
        }
        labels.push(class as u8);
    }
    let images = dir.join("images-idx3-ubyte");
    let labels_path = dir.join("labels-idx1-ubyte");
    write_idx(
        &images,
        &IdxArray {
            dims: vec![n, rows, cols],
            data: pixels,
        },
    )
    .unwrap();
    write_idx(
        &labels_path,
        &IdxArray {
            dims: vec![n],
            data: labels,
        },
    )
    .unwrap();
    format!("idx:{},{}", images.display(), labels_path.display())
}

#[test]
fn the_cnn_trains_on_28x28_mnist_format_idx_files() {
    let dir = tempfile::tempdir().unwrap();
    // 5200 images: the 1040 held out are evaluated in two steps (at most 1000 each).
    let data = write_quadrant_images(dir.path(), 5200, 28, 28);
    let ended = run_job(
        &[("ps", 1), ("worker", 2)],
        &["--model", "cnn", "--data", &data, "--steps", "60"],
    );
    assert_all_exited_0(&ended);
    let chief = chief(&ended);
    assert!(
        chief.stdout.contains("on 1040 examples"),
        "a fifth of 5200 held out:\n{}",
        chief.stdout
    );
    // Four classes (chance: 25 %), one bright block each: the cnn finds them.
    let accuracy = held_out_accuracy(chief);
    assert!(
        accuracy >= 0.9,
        "held-out accuracy {accuracy} on the IDX images:\n{}",
        chief.stdout
    );
}

#[test]
fn the_cnn_refuses_images_that_are_not_square_and_filters_without_the_cnn() {
    // Rows of 5 features (a CSV has no image shape): between 2×2 and 3×3.
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("five.csv");
    let rows: String = (0..20)
        .map(|i| format!("0.1,0.2,0.3,0.4,{},{}\n", i % 2, i % 2))
        .collect();
    std::fs::write(&csv, rows).unwrap();
    let data = format!("csv:{}", csv.display());
    let ended = run_chief_alone(&["--model", "cnn", "--data", &data]);
    assert_fails_with(
        &ended,
        &["--model cnn", "5 features per example", "not a square"],
    );
    // 16×4 IDX images: 64 features, as many as 8×8, but not a square image.
    let data = write_quadrant_images(dir.path(), 40, 16, 4);
    let ended = run_chief_alone(&["--model", "cnn", "--data", &data]);
    assert_fails_with(&ended, &["16x4 pixels", "needs square images"]);
    let ended = run_chief_alone(&["--filters", "8"]);
    assert_fails_with(&ended, &["--filters applies to --model cnn only"]);
    let ended = run_chief_alone(&["--model", "cnn", "--filters", "8,0"]);
    assert_fails_with(&ended, &["--filters [8, 0]"]);
}

/// Trains the MLP with `extra` flags on a ps with a standby and 2 workers, kills the primary
/// once the chief saved past step 0, and returns how the other tasks ended. Nothing restarts
/// the primary: the job ends only if its standby took the task over.
fn kill_the_primary_ps_mid_training(extra: &[&str]) -> Vec<Ended> {
    let ckpt = tempfile::tempdir().unwrap();
    let ckpt_dir = ckpt.path().to_str().unwrap().to_string();
    let mut args = vec![
        "--model",
        "mlp",
        "--hidden",
        "64,32",
        "--optimizer",
        "adam",
        "--steps",
        "600",
        "--save_every",
        "100",
        "--checkpoint_dir",
        &ckpt_dir,
    ];
    args.extend_from_slice(extra);
    let mut job = start_job(&[("ps", 1), ("ps_standby", 1), ("worker", 2)], &args);
    let deadline = Instant::now() + JOB_DEADLINE;
    while latest_checkpoint(ckpt.path())
        .unwrap()
        .is_none_or(|p| p.to_string_lossy().ends_with("-0"))
    {
        assert!(
            Instant::now() < deadline,
            "no checkpoint past step 0 within {JOB_DEADLINE:?}"
        );
        thread::sleep(Duration::from_millis(50));
    }
    let primary = job.tasks.remove(0);
    assert_eq!(primary.name, "/job:ps/task:0");
    let mut primary = primary.child;
    primary.kill().unwrap();
    assert!(killed_by(primary.wait().unwrap(), libc::SIGKILL));
    let ended = wait_all(job.tasks.into_iter().map(|t| (t.name, t.child)).collect());
    let standby = ended
        .iter()
        .find(|e| e.name == "/job:ps_standby/task:0")
        .unwrap();
    assert!(
        standby.stderr.contains("the standby took the task over"),
        "{}",
        standby.stderr
    );
    ended
}

#[test]
fn a_ps_with_a_standby_is_killed_mid_training_and_the_job_still_ends_with_every_other_task_exiting_0(
) {
    assert_trained(&kill_the_primary_ps_mid_training(&[]), "6");
}

#[test]
fn sync_training_goes_on_when_a_ps_with_a_standby_is_killed() {
    assert_trained(&kill_the_primary_ps_mid_training(&["--sync"]), "600 ");
}
