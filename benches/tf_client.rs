//! A stock TensorFlow client stepping a softmax regression (`benches/tf_client_steps.py`)
//! through a tessera task, through a TensorFlow task, and in its own local session (the
//! client's floor: the same graph without a runtime between), in one run. The three
//! alternate `ROUNDS` times; the bench prints every run, the medians and the ratios against
//! the goal: tessera at least 2.5x the TensorFlow task, or within 1.2x of the floor, whichever
//! is lower.
//!
//! The tessera task runs in this process (`Server::local`); the TensorFlow task is a
//! `tf.distribute.Server` process; each client is a Python process of its own, started per
//! run (its start-up and 100 warm-up steps are not timed). Without TensorFlow it prints why
//! and stops.

mod support;

use std::process::Command;
use std::time::Duration;

use support::{free_address, median, root, tensorflow_or_skip, Task};
use tessera::server::Server;

const ROUNDS: usize = 3;
const STEPS: &str = "2000";
/// How long a client run or a task's start may take.
const DEADLINE: Duration = Duration::from_secs(300);

/// The client's steps per second with `where_` (`--local`, or `--target grpc://...`).
fn client(python: &std::path::Path, where_: &[&str]) -> Result<f64, String> {
    let script = root().join("benches/tf_client_steps.py");
    let mut run = Task::spawn(
        Command::new(python)
            .arg(&script)
            .args(where_)
            .args(["--steps", STEPS]),
    )?;
    let line = run.line_starting("{", DEADLINE)?;
    let value: serde_json::Value =
        serde_json::from_str(&line).map_err(|e| format!("{e}: {line}"))?;
    value["steps_per_sec"]
        .as_f64()
        .ok_or_else(|| format!("no steps_per_sec in {line}"))
}

fn main() {
    let Some(python) = tensorflow_or_skip() else {
        return;
    };
    let tessera = Server::local().expect("an in-process tessera task");
    let address = free_address();
    let script = root().join("benches/tf_client_steps.py");
    let mut tensorflow = Task::spawn(
        Command::new(&python)
            .arg(&script)
            .args(["server", "--listen", &address]),
    )
    .expect("a TensorFlow task");
    tensorflow
        .line_starting("tensorflow: serving", DEADLINE)
        .expect("the TensorFlow task serves");
    let targets = [
        ("floor (local session)", vec!["--local".to_string()]),
        (
            "through a TensorFlow task",
            vec!["--target".into(), format!("grpc://{address}")],
        ),
        (
            "through a tessera task",
            vec!["--target".into(), tessera.target()],
        ),
    ];
    println!(
        "a TensorFlow client's softmax regression steps (64 -> 10, batch 32), {STEPS} timed \
         per run, {ROUNDS} rounds"
    );
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
    for round in 1..=ROUNDS {
        for (k, (name, args)) in targets.iter().enumerate() {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            match client(&python, &args) {
                Ok(rate) => {
                    println!("  round {round}: {name:<26} {rate:8.1} steps/s");
                    rates[k].push(rate);
                }
                Err(e) => println!("  round {round}: {name:<26} failed: {e}"),
            }
        }
    }
    if rates.iter().any(Vec::is_empty) {
        println!("a path has no finished run; no ratios");
        return;
    }
    let [floor, tf, ours] = [0, 1, 2].map(|k| median(&mut rates[k]));
    println!(
        "medians: floor {floor:.1}, TensorFlow task {tf:.1}, tessera task {ours:.1} steps/s; \
         tessera / TensorFlow {:.2} (goal >= 2.5), tessera / floor {:.2} (goal >= 0.83: within \
         1.2x)",
        ours / tf,
        ours / floor
    );
    tessera.stop();
}
