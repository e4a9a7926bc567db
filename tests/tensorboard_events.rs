//! TensorBoard reads what tessera writes, live (`tests/tensorboard_events.py` is TensorBoard's
//! and TensorFlow's side):
//!
//! - `tessera local` trains with `--logdir`, and TensorBoard's own `EventAccumulator` finds
//!   the chief's `loss` curve, `global_step/sec`, the held-out `accuracy` and a histogram per
//!   trainable variable;
//! - a TensorFlow 1 program (`tf.compat.v1.summary.scalar` and `histogram`, `merge_all`,
//!   `MonitoredTrainingSession(summary_dir=...)`) on a tessera ps and worker: the summary ops
//!   run on tessera, TensorFlow's hook writes their output, and TensorBoard reads the loss
//!   and histogram tags, each loss that of its step, on the loss curve the same program
//!   follows on stock TensorFlow servers;
//! - a graph with TensorFlow 2's `tf.summary.create_file_writer` and `tf.summary.scalar` run
//!   on a tessera task: the task writes the event file, and TensorBoard reads the values the
//!   same graph writes in a TensorFlow session.
//!
//! Under CI a missing TensorFlow or TensorBoard fails each test; elsewhere they skip, saying so.

use std::fs::File;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use crate::support::cluster::{Cluster, BIN};
use crate::support::tensorflow::{python_with, Client, Trained};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tensorboard_events.py");

/// How long `tessera local` may take for its 200 steps (a cold debug binary on a busy
/// two-core machine).
const LOCAL_DEADLINE: Duration = Duration::from_secs(300);

/// The Python that has TensorFlow and TensorBoard, or `None` (said) when there is none.
fn tensorboard_python(test: &str) -> Option<String> {
    python_with(test, &["tensorflow", "tensorboard"])
}

/// Runs `tensorboard_events.py ARGS`; returns its JSON line.
fn script(python: &str, args: &[&str]) -> Trained {
    let mut command = Command::new(python);
    command.arg(SCRIPT).args(args).stdin(Stdio::null());
    Client::spawn(command).finish()
}

/// `[[step, value], ...]` under `kind` (`scalars`, `tensors`, `histograms`) and `tag`.
fn points(read: &Trained, kind: &str, tag: &str) -> Vec<(i64, f64)> {
    let series = read.json[kind][tag]
        .as_array()
        .unwrap_or_else(|| panic!("no {kind} `{tag}` in {}", read.json));
    series
        .iter()
        .map(|p| (p[0].as_i64().unwrap(), p[1].as_f64().unwrap()))
        .collect()
}

/// The loss of every step, as the program fetched it.
fn curve(run: &Trained) -> Vec<f64> {
    let values = run.json["curve"].as_array();
    let values = values.unwrap_or_else(|| panic!("no curve in {}", run.json));
    values.iter().map(|v| v.as_f64().unwrap()).collect()
}

/// The event files' names.
fn files(read: &Trained) -> Vec<String> {
    read.strings("files")
}

#[test]
fn tensorboard_reads_the_chiefs_summaries_of_a_tessera_local_run() {
    let Some(python) = tensorboard_python("tessera local summaries") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let logdir = dir.path().join("run");
    let out = dir.path().join("stdout");
    let child = Command::new(BIN)
        .args(["local", "--steps", "200", "--timeout", "280s", "--logdir"])
        .arg(&logdir)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(File::create(&out).unwrap())
        .stderr(File::create(dir.path().join("stderr")).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let (tx, rx) = mpsc::channel();
    let mut child = child;
    thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = match rx.recv_timeout(LOCAL_DEADLINE) {
        Ok(status) => status.unwrap(),
        Err(_) => {
            // SAFETY: our child, which the waiting thread has not reaped (it would have
            // answered).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("tessera local did not finish within {LOCAL_DEADLINE:?}");
        }
    };
    let stdout = std::fs::read_to_string(&out).unwrap();
    let stderr = std::fs::read_to_string(dir.path().join("stderr")).unwrap();
    assert!(status.success(), "{status}: {stdout}\n{stderr}");
    let hint = format!("tessera: tensorboard --logdir {}", logdir.display());
    assert!(stdout.lines().any(|l| l == hint), "{stdout}");

    let read = script(&python, &["read", logdir.to_str().unwrap()]);
    let names = files(&read);
    assert_eq!(names.len(), 1, "one event file, the chief's: {names:?}");
    assert!(names[0].starts_with("events.out.tfevents."), "{names:?}");
    let loss = points(&read, "scalars", "loss");
    assert!(loss.len() >= 10, "{} loss points: {loss:?}", loss.len());
    assert!(loss.windows(2).all(|w| w[0].0 < w[1].0), "{loss:?}");
    assert!(
        loss.last().unwrap().1 < loss[0].1,
        "the loss falls: {loss:?}"
    );
    let rates = points(&read, "scalars", "global_step/sec");
    assert!(
        !rates.is_empty() && rates.iter().all(|&(_, r)| r > 0.0),
        "{rates:?}"
    );
    let accuracy = points(&read, "scalars", "accuracy");
    assert_eq!(accuracy.len(), 1, "{accuracy:?}");
    assert!(accuracy[0].1 > 0.1, "better than chance: {accuracy:?}");
    // The default MLP (128) on the digits: two layers of weights and biases.
    for tag in ["layer0/w", "layer0/b", "layer1/w", "layer1/b"] {
        let histograms = points(&read, "histograms", tag);
        assert_eq!(histograms.len(), loss.len(), "{tag}: {histograms:?}");
    }
    // layer0/w is 64 pixels by 128 units.
    assert_eq!(points(&read, "histograms", "layer0/w")[0].1, 8192.0);
}

#[test]
fn a_tensorflow_1_program_writes_its_summaries_from_tessera_tasks() {
    let Some(python) = tensorboard_python("v1 summaries on tessera") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let alone = dir.path().join("alone");
    let on_tessera = dir.path().join("tessera");
    let want = script(
        &python,
        &["v1", "--alone", "--logdir", alone.to_str().unwrap()],
    );

    let cluster = Cluster::start(&[("ps", 1), ("worker", 1)]);
    let (ps, worker) = (cluster.addr("ps", 0), cluster.addr("worker", 0));
    let got = script(
        &python,
        &[
            "v1",
            "--master",
            &format!("grpc://{worker}"),
            "--ps",
            &ps.to_string(),
            "--worker",
            &worker.to_string(),
            "--logdir",
            on_tessera.to_str().unwrap(),
        ],
    );
    // Full-batch gradient descent from fixed weights: the same loss curve on both runtimes
    // (within float rounding).
    let (curve, want_curve) = (curve(&got), curve(&want));
    assert_eq!(curve.len(), 30, "{curve:?}");
    assert_eq!(curve.len(), want_curve.len());
    for (step, (g, w)) in curve.iter().zip(&want_curve).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1.0),
            "loss at step {step}: {g} on tessera, {w} on TensorFlow"
        );
    }
    // save_summaries_steps=5 over 30 steps: the first step and then about every 5 (which
    // steps depends on timing, on TensorFlow too); each written loss is the loss of a step
    // next to the global step it is written at.
    let loss = points(&got, "scalars", "loss");
    assert!((5..=8).contains(&loss.len()), "{loss:?}");
    assert!(loss.windows(2).all(|w| w[0].0 < w[1].0), "{loss:?}");
    for &(step, value) in &loss {
        let near = curve
            .iter()
            .enumerate()
            .any(|(i, c)| (i as i64 - step).abs() <= 1 && (c - value).abs() <= 1e-6 * c.abs());
        assert!(
            near,
            "loss {value} at step {step} is no step's loss: {curve:?}"
        );
    }
    assert!(
        (loss[0].1 - want_curve[0]).abs() <= 1e-5 * want_curve[0],
        "first loss {loss:?}, TensorFlow's {}",
        want_curve[0]
    );
    // The histogram op is named `w_1` (the variable is `w`), and so is its tag.
    let histograms = points(&got, "histograms", "w_1");
    assert_eq!(histograms.len(), loss.len(), "{histograms:?}");
    assert!(histograms.iter().all(|&(_, n)| n == 4.0), "{histograms:?}");
}

#[test]
fn a_tensorflow_2_summary_writer_runs_on_a_tessera_task() {
    let Some(python) = tensorboard_python("v2 summary writer on tessera") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let alone = dir.path().join("alone");
    let on_tessera = dir.path().join("tessera");
    let want = script(
        &python,
        &["v2", "--alone", "--logdir", alone.to_str().unwrap()],
    );

    let cluster = Cluster::start(&[("worker", 1)]);
    let got = script(
        &python,
        &[
            "v2",
            "--master",
            &cluster.target("worker", 0),
            "--logdir",
            on_tessera.to_str().unwrap(),
        ],
    );
    let values = points(&got, "tensors", "value");
    assert_eq!(values, points(&want, "tensors", "value"));
    let expected: Vec<(i64, f64)> = (0..10).map(|s| (s, 0.5 * s as f64 - 1.0)).collect();
    assert_eq!(values, expected);
    // The tessera daemon wrote the file, named as TensorFlow 2 names it.
    let names = files(&got);
    assert_eq!(names.len(), 1, "{names:?}");
    let pid = cluster.pid("worker", 0).unwrap();
    assert!(
        names[0].starts_with("events.out.tfevents.") && names[0].ends_with(&format!(".{pid}.0.v2")),
        "{names:?} (the daemon's pid is {pid})"
    );
}
