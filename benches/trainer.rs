//! The classic ps/worker trainer on TensorFlow's runtime and on tessera's, side by side in one
//! run: an MLP 64-128-10 on the digits, batch 32, Adagrad 0.1, 4000 global steps, 1 ps and 2
//! workers, asynchronous and synchronous (every update averages both workers' gradients).
//!
//! TensorFlow's side is `tests/tensorflow_v1.py` (the `classic` and `sync` programs) run by
//! `$TESSERA_TF_PYTHON` or `target/tf-venv/bin/python` (what `scripts/test` installs): one
//! process per task (`tf.distribute.Server`) and one client process per worker, as a
//! TensorFlow 1 job runs. tessera's side is `tessera local` with the same model, data,
//! optimizer and schedule (its ps and workers are processes too, each worker with its own
//! client inside). The two runtimes alternate, never at the same time, `ROUNDS` times per
//! mode; each run prints its global steps per second (from the chief's first step to its
//! last, start-up and evaluation left out) and held-out accuracy, then each mode its medians
//! and the ratio, against the goal of 3x TensorFlow with the same accuracy (>= 0.97).
//!
//! Without TensorFlow only tessera's runs are printed, saying why.

mod support;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{free_address, median, root, tensorflow_python, Task};

const STEPS: u64 = 4000;
const ROUNDS: usize = 3;
/// How long a task may take to start serving, or a chief to open its session.
const START: Duration = Duration::from_secs(180);
/// How long a whole training run may take.
const RUN: Duration = Duration::from_secs(600);

/// One run's result.
#[derive(Clone, Copy, Debug)]
struct Run {
    steps_per_sec: f64,
    accuracy: f64,
}

/// One run on TensorFlow: a ps and two worker servers, then the chief's client and, once it
/// has initialised the model, the other worker's.
fn tensorflow_run(python: &Path, sync: bool) -> Result<Run, String> {
    let script = root().join("tests/tensorflow_v1.py");
    let (ps, w0, w1) = (free_address(), free_address(), free_address());
    let workers = format!("{w0},{w1}");
    let mut servers = Vec::new();
    for (job, index) in [("ps", "0"), ("worker", "0"), ("worker", "1")] {
        let mut server = Task::spawn(
            Command::new(python)
                .arg(&script)
                .args(["server", job, index, "--ps", &ps, "--worker", &workers]),
        )?;
        server.line_starting("tensorflow: serving", START)?;
        servers.push(server);
    }
    let program = if sync { "sync" } else { "classic" };
    let steps = STEPS.to_string();
    let client = |index: &str, master: &str| {
        Task::spawn(Command::new(python).arg(&script).args([
            program,
            "--master",
            &format!("grpc://{master}"),
            "--ps",
            &ps,
            "--worker",
            &workers,
            "--index",
            index,
            "--no-cluster-def",
            "--steps",
            &steps,
        ]))
    };
    let mut chief = client("0", &w0)?;
    chief.line_starting("ready", START)?;
    let other = client("1", &w1)?;
    let result = chief.line_starting("{", RUN)?;
    // The other worker ends on its own once the chief stops (a synchronous one after its
    // operation timeout); it is killed with the servers.
    drop(other);
    drop(servers);
    let value: serde_json::Value =
        serde_json::from_str(&result).map_err(|e| format!("{e}: {result}"))?;
    let number = |key: &str| {
        value[key]
            .as_f64()
            .ok_or_else(|| format!("no `{key}` in {result}"))
    };
    Ok(Run {
        steps_per_sec: number("global_step")? / number("train_seconds")?,
        accuracy: number("accuracy")?,
    })
}

/// One run of `tessera local` with the same job (its summaries in a directory of its own).
fn tessera_run(sync: bool) -> Result<Run, String> {
    let logdir = tempfile::tempdir().map_err(|e| format!("no temporary directory: {e}"))?;
    let mut command = Command::new(env!("CARGO_BIN_EXE_tessera"));
    command.args([
        "local",
        "--model",
        "mlp",
        "--hidden",
        "128",
        "--data",
        "digits",
        "--optimizer",
        "adagrad",
        "--learning_rate",
        "0.1",
        "--batch_size",
        "32",
        "--steps",
        &STEPS.to_string(),
        "--ps",
        "1",
        "--workers",
        "2",
        "--timeout",
        &format!("{}s", RUN.as_secs()),
        "--logdir",
    ]);
    command.arg(logdir.path());
    if sync {
        command.arg("--sync");
    }
    let out = command
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run tessera local: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("tessera local failed: {stdout}"));
    }
    // "tessera: trained to global step 4001 (812.3 steps/s), ..." (an asynchronous worker's
    // last step may pass the last one) and "tessera: held-out accuracy 97.50 % on 360 examples".
    let between = |marker: &str, open: &str, close: &str| -> Result<f64, String> {
        let line = stdout
            .lines()
            .find(|l| l.contains(marker))
            .ok_or_else(|| format!("no `{marker}` in: {stdout}"))?;
        let start = line.find(open).map(|i| i + open.len());
        let number = start
            .and_then(|s| line[s..].split(close).next())
            .ok_or_else(|| format!("no number in `{line}`"))?;
        number.trim().parse().map_err(|e| format!("{e}: {line}"))
    };
    Ok(Run {
        steps_per_sec: between("trained to global step", "(", " steps/s")?,
        accuracy: between("held-out accuracy", "accuracy ", "%")? / 100.0,
    })
}

fn show(run: &Result<Run, String>) -> String {
    match run {
        Ok(r) => format!(
            "{:7.1} steps/s, accuracy {:.4}",
            r.steps_per_sec, r.accuracy
        ),
        Err(e) => format!("failed: {e}"),
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a name filter is not supported (there is one bench).
    let tensorflow = tensorflow_python();
    if let Err(why) = &tensorflow {
        println!("TensorFlow's side skipped: {why}");
    }
    println!(
        "classic trainer: MLP 64-128-10 on the digits, batch 32, Adagrad 0.1, {STEPS} global \
         steps, 1 ps + 2 workers; {ROUNDS} rounds, the runtimes alternating"
    );
    for sync in [false, true] {
        let mode = if sync { "sync" } else { "async" };
        let (mut tf, mut ours) = (Vec::new(), Vec::new());
        for round in 1..=ROUNDS {
            if let Ok(python) = &tensorflow {
                // A port chosen free may be taken before TensorFlow binds it: one more try.
                let run = tensorflow_run(python, sync).or_else(|first| {
                    println!("  {mode} round {round}: TensorFlow failed ({first}); again");
                    tensorflow_run(python, sync)
                });
                println!("  {mode} round {round}: TensorFlow {}", show(&run));
                tf.extend(run.ok());
            }
            let run = tessera_run(sync);
            println!("  {mode} round {round}: tessera    {}", show(&run));
            ours.extend(run.ok());
            let _ = std::io::stdout().flush();
        }
        let mut ours_rate: Vec<f64> = ours.iter().map(|r| r.steps_per_sec).collect();
        let mut ours_acc: Vec<f64> = ours.iter().map(|r| r.accuracy).collect();
        if ours_rate.is_empty() {
            println!("{mode}: no tessera run finished");
            continue;
        }
        let (rate, acc) = (median(&mut ours_rate), median(&mut ours_acc));
        if tf.is_empty() {
            println!("{mode}: tessera median {rate:.1} steps/s (accuracy {acc:.4})");
            continue;
        }
        let mut tf_rate: Vec<f64> = tf.iter().map(|r| r.steps_per_sec).collect();
        let mut tf_acc: Vec<f64> = tf.iter().map(|r| r.accuracy).collect();
        let (base, base_acc) = (median(&mut tf_rate), median(&mut tf_acc));
        println!(
            "{mode}: TensorFlow median {base:.1} steps/s (accuracy {base_acc:.4}), tessera median \
             {rate:.1} steps/s (accuracy {acc:.4}), ratio {:.2} (goal >= 3.0, accuracy >= 0.97)",
            rate / base
        );
    }
    println!(
        "dense 16 MiB regression (x @ W + b, W 1024x4096): not measured; tessera train has no \
         --model regression yet"
    );
}
