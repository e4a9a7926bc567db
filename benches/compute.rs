//! Real models' steps, where the time is arithmetic: a stock TensorFlow client
//! (`benches/compute_steps.py`) trains each model through a `tessera serve` task and through a
//! TensorFlow task, interleaved, `COMPUTE_ROUNDS` rounds (3); the bench prints every run, the
//! medians, tessera's ratio to TensorFlow against its goal, the losses side by side, and the
//! wide MLP's share of the machine's fp32 peak.
//!
//! Both tasks are processes of their own, so they can be held to the same cores:
//! `COMPUTE_CORES=0` runs both under `taskset -c 0` (one core), `COMPUTE_CORES=0,1` on two;
//! comparing the two runs shows how the work splits over cores. `COMPUTE_MODELS=mlp,cnn`
//! picks models (default: all six; `mlp_data` is the MLP fed by a `tf.data` pipeline in the
//! graph instead of feeds). Without TensorFlow it prints why and stops.
//!
//! The peak is cores × clock × fp32 FLOP per cycle and core, stated in the output: the clock
//! is `/proc/cpuinfo`'s nominal one (a core may boost above it), and a core is taken to have
//! two FMA pipes: 32 fp32 FLOP per cycle with AVX2 (and on AMD's Zen 4, which runs AVX-512 as
//! two 256-bit halves), 64 with AVX-512 on Intel cores.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::{free_address, median, root, tensorflow_or_skip, Task};

/// How long a client run or a task's start may take.
const DEADLINE: Duration = Duration::from_secs(600);

/// A model of the bench: its name, timed steps per run, warm-up steps, goal (tessera's
/// steps/s over TensorFlow's) and fp32 FLOP per step (when counted). Each run times two
/// seconds or more of steps: on the shared 2-core machine shorter runs swung by 20 % and more
/// from round to round.
struct Model {
    name: &'static str,
    steps: u32,
    warm_up: u32,
    goal: f64,
    flop: Option<f64>,
}

/// FLOP of one training step of a dense stack: each layer's forward product and its weight
/// gradient, and the input gradient of every layer but the first (whose input is a feed).
fn dense_flop(batch: f64, widths: &[f64]) -> f64 {
    widths
        .windows(2)
        .enumerate()
        .map(|(i, w)| if i == 0 { 4.0 } else { 6.0 } * batch * w[0] * w[1])
        .sum()
}

fn models() -> Vec<Model> {
    vec![
        Model {
            name: "mlp",
            steps: 200,
            warm_up: 5,
            goal: 1.0,
            flop: Some(dense_flop(256.0, &[784.0, 1024.0, 10.0])),
        },
        Model {
            name: "mlp_data",
            steps: 200,
            warm_up: 5,
            goal: 1.0,
            flop: Some(dense_flop(256.0, &[784.0, 1024.0, 10.0])),
        },
        Model {
            name: "wide_mlp",
            steps: 8,
            warm_up: 2,
            goal: 1.0,
            flop: Some(dense_flop(512.0, &[1024.0, 4096.0, 4096.0, 10.0])),
        },
        Model {
            name: "cnn",
            steps: 20,
            warm_up: 3,
            goal: 1.0,
            flop: None,
        },
        Model {
            name: "wide_deep",
            steps: 300,
            warm_up: 5,
            goal: 1.2,
            flop: None,
        },
        Model {
            name: "rnn",
            steps: 60,
            warm_up: 3,
            goal: 1.2,
            flop: None,
        },
    ]
}

/// `command` run under `taskset -c CORES` when `COMPUTE_CORES` is set.
fn on_cores(program: &Path, cores: Option<&str>) -> Command {
    match cores {
        Some(cores) => {
            let mut command = Command::new("taskset");
            command.args(["-c", cores]).arg(program);
            command
        }
        None => Command::new(program),
    }
}

/// One client run: steps/s and the last loss.
fn client(python: &Path, model: &Model, target: &str) -> Result<(f64, f64), String> {
    let script = root().join("benches/compute_steps.py");
    let mut run = Task::spawn(
        Command::new(python)
            .arg(&script)
            .arg(model.name)
            .args(["--target", target])
            .args(["--steps", &model.steps.to_string()])
            .args(["--warm_up", &model.warm_up.to_string()]),
    )?;
    let line = run.line_starting("{", DEADLINE)?;
    let value: serde_json::Value =
        serde_json::from_str(&line).map_err(|e| format!("{e}: {line}"))?;
    let field = |name: &str| {
        value[name]
            .as_f64()
            .ok_or_else(|| format!("no {name} in {line}"))
    };
    Ok((field("steps_per_sec")?, field("loss")?))
}

/// The machine's fp32 peak in FLOP/s over `cores` cores, and how it was computed.
fn peak(cores: usize) -> (f64, String) {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        info.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split(':').nth(1))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    let mhz: f64 = field("cpu MHz").parse().unwrap_or(0.0);
    let flags = field("flags");
    let has = |flag: &str| flags.split_whitespace().any(|f| f == flag);
    // Two FMA pipes per core: 2 x lanes x 2 FLOP. AMD's Zen 4 runs AVX-512 as two halves.
    let amd = field("vendor_id") == "AuthenticAMD";
    let per_cycle = if has("avx512f") && !amd {
        64.0
    } else if has("fma") && has("avx2") {
        32.0
    } else {
        8.0
    };
    let peak = cores as f64 * mhz * 1e6 * per_cycle;
    let how = format!(
        "{cores} cores x {:.2} GHz x {per_cycle} fp32 FLOP/cycle = {:.0} GFLOP/s ({})",
        mhz / 1e3,
        peak / 1e9,
        field("model name")
    );
    (peak, how)
}

fn main() {
    let Some(python) = tensorflow_or_skip() else {
        return;
    };
    let cores = std::env::var("COMPUTE_CORES").ok();
    let rounds: usize = std::env::var("COMPUTE_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let picked = std::env::var("COMPUTE_MODELS").ok();
    let models: Vec<Model> = models()
        .into_iter()
        .filter(|m| {
            picked
                .as_deref()
                .is_none_or(|p| p.split(',').any(|n| n == m.name))
        })
        .collect();

    let dir = tempfile::tempdir().expect("a temporary directory");
    let tessera_address = free_address();
    let config = dir.path().join("worker.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nworker = [\"{tessera_address}\"]\n[task]\njob = \"worker\"\nindex = 0\n\
             [devices]\ngpu = 0\n"
        ),
    )
    .expect("write the cluster file");
    let mut tessera = Task::spawn(
        on_cores(Path::new(env!("CARGO_BIN_EXE_tessera")), cores.as_deref())
            .args(["serve", "--config"])
            .arg(&config)
            .env("RUST_LOG", "warn"),
    )
    .expect("a tessera task");
    tessera
        .line_starting("tessera: serving", DEADLINE)
        .expect("the tessera task serves");
    let tf_address = free_address();
    let mut tensorflow = Task::spawn(
        on_cores(&python, cores.as_deref())
            .arg(root().join("benches/compute_steps.py"))
            .args(["server", "--listen", &tf_address]),
    )
    .expect("a TensorFlow task");
    tensorflow
        .line_starting("tensorflow: serving", DEADLINE)
        .expect("the TensorFlow task serves");

    let core_count = cores.as_deref().map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        |c| c.split(',').count(),
    );
    let (peak, how) = peak(core_count);
    println!(
        "compute: a TensorFlow client's training steps through a tessera task and a TensorFlow \
         task, {rounds} rounds interleaved, tasks on {}",
        cores
            .as_deref()
            .map_or("every core".to_string(), |c| format!("cores {c}"))
    );
    println!("peak: {how}");
    let targets = [
        ("tessera", format!("grpc://{tessera_address}")),
        ("tensorflow", format!("grpc://{tf_address}")),
    ];
    // (model, target) -> steps/s of each round, and the last loss.
    let mut rates: BTreeMap<(&str, &str), Vec<f64>> = BTreeMap::new();
    let mut losses: BTreeMap<(&str, &str), f64> = BTreeMap::new();
    for round in 1..=rounds {
        for model in &models {
            for (who, target) in &targets {
                match client(&python, model, target) {
                    Ok((rate, loss)) => {
                        println!(
                            "  round {round}: {:<10} {who:<10} {rate:8.2} steps/s  loss {loss:.6}",
                            model.name
                        );
                        rates.entry((model.name, who)).or_default().push(rate);
                        losses.insert((model.name, who), loss);
                    }
                    Err(e) => println!("  round {round}: {:<10} {who:<10} failed: {e}", model.name),
                }
            }
        }
    }
    println!();
    println!(
        "| model | tessera steps/s | TensorFlow steps/s | ratio | goal | loss tessera / TensorFlow |"
    );
    println!("|---|---|---|---|---|---|");
    for model in &models {
        let mut med = |who| rates.get_mut(&(model.name, who)).map(|r| median(r));
        let (t, f) = (med("tessera"), med("tensorflow"));
        let ratio = match (t, f) {
            (Some(t), Some(f)) => format!("{:.2}x", t / f),
            _ => "-".into(),
        };
        let loss = |who| {
            losses
                .get(&(model.name, who))
                .map_or("-".into(), |l| format!("{l:.6}"))
        };
        let show = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
        println!(
            "| {} | {} | {} | {ratio} | >= {:.1}x | {} / {} |",
            model.name,
            show(t),
            show(f),
            model.goal,
            loss("tessera"),
            loss("tensorflow")
        );
        if let (Some(flop), Some(t)) = (model.flop, t) {
            let f = f.unwrap_or(0.0);
            println!(
                "  {}: {:.1} GFLOP/step; tessera {:.0} GFLOP/s ({:.0} % of peak), TensorFlow \
                 {:.0} GFLOP/s ({:.0} %)",
                model.name,
                flop / 1e9,
                flop * t / 1e9,
                100.0 * flop * t / peak,
                flop * f / 1e9,
                100.0 * flop * f / peak
            );
        }
    }
}
