//! Two ps/worker trainers on TensorFlow's runtime and on tessera's, side by side in one run,
//! 1 ps and 2 workers, asynchronous and synchronous (every update averages both workers'
//! gradients): the classic trainer (an MLP 64-128-10 on the digits, batch 32, Adagrad 0.1, 4000
//! global steps) and the dense 16 MiB regression (`x @ W + b`, `W` 1024x4096, batch 64,
//! squared error, Adagrad 0.1, 300 global steps: every step pulls `W` and pushes its 16 MiB
//! gradient).
//!
//! TensorFlow's side is `tests/tensorflow_v1.py` (the `classic` and `sync` programs) and
//! `benches/tf_regression.py`, run by
//! `$TESSERA_TF_PYTHON` or `target/tf-venv/bin/python` (what `scripts/test` installs): one
//! process per task (`tf.distribute.Server`) and one client process per worker, as a
//! TensorFlow 1 job runs. tessera's side is `tessera local` with the same model, data,
//! optimizer and schedule (its ps and workers are processes too, each worker with its own
//! client inside). The two runtimes alternate, never at the same time, `ROUNDS` times per
//! mode; each run prints its global steps per second (from the chief's first step to its
//! last, start-up and evaluation left out) and the classic trainer's held-out accuracy, then
//! each mode its medians and the ratio, against the goals: 3x TensorFlow with the same
//! accuracy (>= 0.97) for the classic trainer, 1.5x for the regression. The classic trainer's
//! async rounds also run `tessera local --standby` (a standby per ps task, holding a copy of its
//! variables before each step is acknowledged): goals 0.7x of tessera without it and 2x
//! TensorFlow.
//!
//! The regression also has a floor, measured in the same run: raw TCP on loopback moving one
//! step's bytes (`W` to the worker and its gradient back, 32 MiB) plus the same step in one
//! process (`Session::local()`, the same graph without the ps); tessera's global steps per
//! second are printed as a fraction of its rate (goal: at least 0.8).
//!
//! Each tessera run also prints the largest peak resident memory of one of its tasks, as
//! `tessera local` reports it (the kernel's high-water mark of each task process): what a step
//! allocator that keeps buffers across steps must not grow.
//!
//! Without TensorFlow only tessera's runs are printed, saying why.

mod support;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::raw_tcp::raw_tcp_time;
use support::{free_address, median, root, tensorflow_python, Task};
use tessera::client::Session;
use tessera::graph::Graph;
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::train::optimizer::Optimizer;

const ROUNDS: usize = 3;
/// How long a task may take to start serving, or a chief to open its session.
const START: Duration = Duration::from_secs(180);
/// How long a whole training run may take.
const RUN: Duration = Duration::from_secs(600);

/// The two models of the comparison.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Model {
    /// The classic trainer's MLP 64-128-10 on the digits.
    Classic,
    /// The dense 16 MiB regression: `x @ W + b`, `W` 1024 x 4096.
    Regression,
}

impl Model {
    fn describe(self) -> &'static str {
        match self {
            Model::Classic => {
                "classic trainer: MLP 64-128-10 on the digits, batch 32, Adagrad 0.1, 4000 global \
                 steps"
            }
            Model::Regression => {
                "dense 16 MiB regression: x @ W + b, W 1024x4096 float32, batch 64, squared \
                 error, Adagrad 0.1, rank-8 teacher, 300 global steps"
            }
        }
    }

    fn steps(self) -> u64 {
        match self {
            Model::Classic => 4000,
            Model::Regression => 300,
        }
    }

    /// TensorFlow's side: its script, and the client's arguments before the cluster's.
    fn tensorflow(self, sync: bool) -> (&'static str, Vec<&'static str>) {
        match self {
            Model::Classic => (
                "tests/tensorflow_v1.py",
                vec![if sync { "sync" } else { "classic" }, "--no-cluster-def"],
            ),
            Model::Regression => (
                "benches/tf_regression.py",
                if sync { vec!["--sync"] } else { vec![] },
            ),
        }
    }

    /// `tessera local`'s model flags.
    fn tessera(self) -> Vec<&'static str> {
        match self {
            Model::Classic => vec![
                "--model",
                "mlp",
                "--hidden",
                "128",
                "--data",
                "digits",
                "--batch_size",
                "32",
            ],
            // The 16 MiB variable's histogram every 10 steps would be most of the chief's
            // work; TensorFlow's side writes no summaries.
            Model::Regression => vec![
                "--model",
                "regression",
                "--batch_size",
                "64",
                "--summary_every",
                "1000000",
            ],
        }
    }
}

/// One run's result.
#[derive(Clone, Copy, Debug)]
struct Run {
    steps_per_sec: f64,
    /// The held-out accuracy (the classic trainer's).
    accuracy: Option<f64>,
    /// tessera's: the largest peak resident memory of one task (MiB), as `tessera local`
    /// reports it.
    peak_mib: Option<f64>,
}

/// One run on TensorFlow: a ps and two worker servers, then the chief's client and, once it
/// has initialised the model, the other worker's.
fn tensorflow_run(python: &Path, model: Model, sync: bool) -> Result<Run, String> {
    let (script, program) = model.tensorflow(sync);
    let script = root().join(script);
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
    let steps = model.steps().to_string();
    let client = |index: &str, master: &str| {
        Task::spawn(
            Command::new(python)
                .arg(&script)
                .args(&program)
                .args(["--master", &format!("grpc://{master}"), "--ps", &ps])
                .args(["--worker", &workers, "--index", index, "--steps", &steps]),
        )
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
        accuracy: value["accuracy"].as_f64(),
        peak_mib: None,
    })
}

/// One run of `tessera local` with the same job (its summaries in a directory of its own).
fn tessera_run(model: Model, sync: bool, standby: bool) -> Result<Run, String> {
    let logdir = tempfile::tempdir().map_err(|e| format!("no temporary directory: {e}"))?;
    let mut command = Command::new(env!("CARGO_BIN_EXE_tessera"));
    command
        .arg("local")
        .args(model.tessera())
        .args(["--optimizer", "adagrad", "--learning_rate", "0.1"])
        .args([
            "--steps",
            &model.steps().to_string(),
            "--ps",
            "1",
            "--workers",
            "2",
        ])
        .args(["--timeout", &format!("{}s", RUN.as_secs()), "--logdir"])
        .arg(logdir.path());
    if sync {
        command.arg("--sync");
    }
    if standby {
        command.arg("--standby");
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
    // "tessera: peak resident memory: /job:ps/task:0 41.3 MiB, ...".
    let peak_mib = stdout
        .lines()
        .find_map(|l| l.strip_prefix("tessera: peak resident memory: "))
        .and_then(|tasks| {
            tasks
                .split(", ")
                .filter_map(|t| t.strip_suffix(" MiB")?.rsplit(' ').next()?.parse().ok())
                .reduce(f64::max)
        });
    Ok(Run {
        steps_per_sec: between("trained to global step", "(", " steps/s")?,
        accuracy: between("held-out accuracy", "accuracy ", "%")
            .ok()
            .map(|a| a / 100.0),
        peak_mib,
    })
}

fn show(run: &Result<Run, String>) -> String {
    let run = match run {
        Ok(run) => run,
        Err(e) => return format!("failed: {e}"),
    };
    let mut text = format!("{:7.1} steps/s", run.steps_per_sec);
    if let Some(accuracy) = run.accuracy {
        text.push_str(&format!(", accuracy {accuracy:.4}"));
    }
    if let Some(peak) = run.peak_mib {
        text.push_str(&format!(", largest task's peak memory {peak:.1} MiB"));
    }
    text
}

/// The median rate and (where the runs report one) accuracy of `runs`.
fn medians(runs: &[Run]) -> (f64, Option<f64>) {
    let mut rates: Vec<f64> = runs.iter().map(|r| r.steps_per_sec).collect();
    let mut accuracies: Vec<f64> = runs.iter().filter_map(|r| r.accuracy).collect();
    let accuracy = (!accuracies.is_empty()).then(|| median(&mut accuracies));
    (median(&mut rates), accuracy)
}

/// The regression's sizes: batch, inputs, outputs (as `tessera train`'s defaults).
const REGRESSION: (usize, usize, usize) = (64, 1024, 4096);

/// The regression's floor: the median time raw TCP moves one step's bytes, and the median
/// time of the same step in one process.
fn regression_floor() -> (Duration, Duration) {
    let (batch, inputs, outputs) = REGRESSION;
    let weights = inputs * outputs + outputs;
    // `W` and `b` to the worker, their gradients back.
    let bytes = 2 * weights * std::mem::size_of::<f32>();
    let tcp = raw_tcp_time(bytes, 9);

    let mut g = Graph::new();
    let build = |g: &mut Graph| -> tessera::Result<(String, String, String, String)> {
        let x = g.placeholder(
            "x",
            DType::Float,
            PartialShape::new(vec![Some(batch), Some(inputs)]),
        )?;
        let y = g.placeholder(
            "y",
            DType::Float,
            PartialShape::new(vec![Some(batch), Some(outputs)]),
        )?;
        let w = g.constant(&Tensor::from_vec(
            vec![inputs, outputs],
            vec![0.01f32; inputs * outputs],
        )?)?;
        let w = g.variable("w", &w)?;
        let b = g.constant(&Tensor::from_vec(vec![outputs], vec![0f32; outputs])?)?;
        let b = g.variable("b", &b)?;
        let prediction = g.matmul(&x, &w.value)?;
        let prediction = g.bias_add(&prediction, &b.value)?;
        let error = g.sub(&prediction, &y)?;
        let squared = g.mul(&error, &error)?;
        let loss = g.mean(&squared, &[0, 1], false)?;
        let train = Optimizer::adagrad(0.1).minimize(g, &loss, None)?;
        let init = g.global_variables_initializer()?;
        Ok((x.name(), y.name(), train, init))
    };
    let (x, y, train, init) = build(&mut g).expect("the regression's graph");
    let session = Session::local();
    session.extend(&g.to_graph_def()).expect("extend");
    session.run(&[], &[], &[&init]).expect("init");
    let feed_x = Tensor::from_vec(
        vec![batch, inputs],
        (0..batch * inputs).map(|i| (i % 7) as f32 * 0.1).collect(),
    )
    .expect("x");
    let feed_y = Tensor::from_vec(
        vec![batch, outputs],
        (0..batch * outputs).map(|i| (i % 5) as f32 * 0.1).collect(),
    )
    .expect("y");
    let step = || {
        let started = Instant::now();
        session
            .run(
                &[(x.as_str(), feed_x.clone()), (y.as_str(), feed_y.clone())],
                &[],
                &[&train],
            )
            .expect("a step");
        started.elapsed()
    };
    for _ in 0..3 {
        step();
    }
    let mut steps: Vec<Duration> = (0..15).map(|_| step()).collect();
    steps.sort();
    (tcp, steps[steps.len() / 2])
}

fn main() {
    // `cargo bench` passes `--bench`; `classic` or `regression` after `--` runs that model only.
    let chosen: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let tensorflow = tensorflow_python();
    if let Err(why) = &tensorflow {
        println!("TensorFlow's side skipped: {why}");
    }
    for model in [Model::Classic, Model::Regression] {
        let name = match model {
            Model::Classic => "classic",
            Model::Regression => "regression",
        };
        if !chosen.is_empty() && !chosen.iter().any(|c| c == name) {
            continue;
        }
        println!(
            "{}, 1 ps + 2 workers; {ROUNDS} rounds, the runtimes alternating",
            model.describe()
        );
        let floor = (model == Model::Regression).then(|| {
            let (tcp, step) = regression_floor();
            println!(
                "floor: raw TCP moves a step's 32 MiB in {tcp:.2?} (median of 9); the step in one \
                 process takes {step:.2?} (median of 15)"
            );
            (tcp, step)
        });
        for sync in [false, true] {
            let mode = if sync { "sync" } else { "async" };
            let (mut tf, mut ours, mut with_standby) = (Vec::new(), Vec::new(), Vec::new());
            for round in 1..=ROUNDS {
                if let Ok(python) = &tensorflow {
                    // A port chosen free may be taken before TensorFlow binds it: one more try.
                    let run = tensorflow_run(python, model, sync).or_else(|first| {
                        println!("  {mode} round {round}: TensorFlow failed ({first}); again");
                        tensorflow_run(python, model, sync)
                    });
                    println!("  {mode} round {round}: TensorFlow {}", show(&run));
                    tf.extend(run.ok());
                }
                let run = tessera_run(model, sync, false);
                println!("  {mode} round {round}: tessera    {}", show(&run));
                ours.extend(run.ok());
                // The classic trainer again with a standby per ps task: what the copy costs.
                if model == Model::Classic && !sync {
                    let run = tessera_run(model, sync, true);
                    println!(
                        "  {mode} round {round}: tessera with a standby {}",
                        show(&run)
                    );
                    with_standby.extend(run.ok());
                }
                let _ = std::io::stdout().flush();
            }
            if ours.is_empty() {
                println!("{mode}: no tessera run finished");
                continue;
            }
            let (rate, ours_accuracy) = medians(&ours);
            if !with_standby.is_empty() {
                let (standby_rate, standby_accuracy) = medians(&with_standby);
                let against_tf = if tf.is_empty() {
                    String::new()
                } else {
                    format!(
                        ", {:.2}x TensorFlow (goal >= 2.0)",
                        standby_rate / medians(&tf).0
                    )
                };
                println!(
                    "{mode} with a standby: median {standby_rate:.1} steps/s{}, {:.2} of tessera \
                     without one (goal >= 0.7){against_tf}",
                    standby_accuracy.map_or(String::new(), |a| format!(" (accuracy {a:.4})")),
                    standby_rate / rate
                );
            }
            if let Some((tcp, step)) = floor {
                let floor_rate = 1.0 / (tcp + step).as_secs_f64();
                println!(
                    "{mode}: floor {floor_rate:.1} steps/s (raw TCP {tcp:.2?} for a step's bytes + \
                     the step in process {step:.2?}); tessera at {:.2} of it (goal >= 0.8)",
                    rate / floor_rate
                );
            }
            let shown = |a: Option<f64>| a.map_or(String::new(), |a| format!(" (accuracy {a:.4})"));
            if tf.is_empty() {
                println!(
                    "{mode}: tessera median {rate:.1} steps/s{}",
                    shown(ours_accuracy)
                );
                continue;
            }
            let (base, base_accuracy) = medians(&tf);
            let goal = match model {
                Model::Classic => "goal >= 3.0, accuracy >= 0.97",
                Model::Regression => "goal >= 1.5",
            };
            println!(
                "{mode}: TensorFlow median {base:.1} steps/s{}, tessera median {rate:.1} steps/s{}, \
                 ratio {:.2} ({goal})",
                shown(base_accuracy),
                shown(ours_accuracy),
                rate / base
            );
        }
    }
}
