//! The read-and-sum step end to end: a stock TensorFlow client (`benches/read_and_sum_tf.py`,
//! `tf.compat.v1`, graph mode) whose graph holds a float32 variable of 16 or 64 MiB on
//! `/job:ps/task:0` and `tf.reduce_sum` of it on `/job:worker/task:0`, each step fetching only
//! the scalar. The transfer, the kernel that consumes it and the hand-offs between them all
//! count. Goal: through a tessera cluster at least 1.3x the same step through a TensorFlow
//! cluster, or at least 0.9x its floor, whichever is lower (either met meets it).
//!
//! ```text
//! tessera     client ─ RunStep ─► worker's master (in this process) ─ RunGraph ─► ps, worker
//!             worker's _Recv ◄══ v's value over the tensor channel ══ ps ; Sum ─► the scalar
//! TensorFlow  the same client and graph, ps and worker two tf.distribute.Server processes
//!             (the tensor over gRPC, as TensorFlow moves it)
//! floor       raw TCP on loopback: 8-byte length ─► server ─ N bytes ─► read_exact straight
//!             into a tensor's buffer; then tessera's in-process session (`Session::local()`)
//!             runs `Sum` of that tensor, fed (no copy); the two times added
//! reference   the floor's pull again, then a plain Rust sum (16 lanes, vectorised) of the
//!             tensor in place of the session's `Sum`: printed beside the floor, not a goal,
//!             to show what of the floor is the `Sum` kernel and what the memory's speed
//! ```
//!
//! The runtimes alternate, never at the same time: `ROUNDS` rounds per size, each round one
//! run of each (the order rotates from round to round); a run is one client process (its
//! start, the variable's initialisation and the warm-up steps untimed) timing each step on
//! its own, and its median step is the run's number. The bench prints every run, the medians
//! over the rounds and the two ratios with the goal. The client checks every fetched sum
//! against the exact one (the variable's elements are 0.25 * (i % 3), whose float32 sum is
//! exact in any order) and a wrong sum stops the bench; the floor checks its sums too. After
//! its timed steps each client runs three traced steps (`FULL_TRACE`); the last one is
//! printed: its time in the client, then its nodes per device as `name@start+duration` in
//! ms, which shows where a step's time goes (the transfer is the worker's `RecvTensor` on
//! TensorFlow, its `..._S1` receive on tessera). Without TensorFlow it prints why and stops.

mod support;

use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::cluster::LoopbackCluster;
use support::raw_tcp::{raw_pull, raw_server};
use support::{free_address, median, root, tensorflow_or_skip, Task};
use tessera::client::Session;
use tessera::graph::Graph;
use tessera::tensor::{DType, PartialShape, Tensor};

const ROUNDS: usize = 3;
const SIZES_MIB: [usize; 2] = [16, 64];
/// How long a client run, or a task's start, may take.
const DEADLINE: Duration = Duration::from_secs(300);
/// The goal: tessera / TensorFlow at least this ...
const GOAL_VS_TENSORFLOW: f64 = 1.3;
/// ... or tessera / floor at least this.
const GOAL_VS_FLOOR: f64 = 0.9;

/// Warm-up and timed steps per run for a size.
fn steps_for(mib: usize) -> (usize, usize) {
    if mib <= 16 {
        (5, 60)
    } else {
        (3, 30)
    }
}

/// The variable's element `i`, as the client initialises it.
fn element(i: usize) -> f32 {
    0.25 * (i % 3) as f32
}

/// The exact sum of the first `n` elements.
fn expected_sum(n: usize) -> f64 {
    0.25 * (3 * (n / 3) + usize::from(n % 3 == 2)) as f64
}

// ---------------------------------------------------------------------------------------------
// The clusters.

/// A TensorFlow ps and worker, a `tf.distribute.Server` process each, killed on drop.
struct TensorFlowCluster {
    _tasks: Vec<Task>,
    target: String,
}

impl TensorFlowCluster {
    fn start(python: &Path) -> Result<TensorFlowCluster, String> {
        let (ps, worker) = (free_address(), free_address());
        let cluster = format!(r#"{{"ps": ["{ps}"], "worker": ["{worker}"]}}"#);
        let script = root().join("benches/read_and_sum_tf.py");
        let mut tasks = Vec::new();
        for job in ["ps", "worker"] {
            tasks.push(Task::spawn(Command::new(python).arg(&script).args([
                "server",
                "--cluster",
                &cluster,
                "--job",
                job,
            ]))?);
        }
        for task in &mut tasks {
            task.line_starting("tensorflow: serving", DEADLINE)?;
        }
        Ok(TensorFlowCluster {
            _tasks: tasks,
            target: format!("grpc://{worker}"),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// A client run.

/// One client run: each timed step in ms, and its last traced step, printed.
struct ClientRun {
    step_ms: Vec<f64>,
    trace: String,
}

/// Runs the client against `target` with a variable of `mib` MiB. A wrong sum panics: the
/// bench must not time a wrong graph.
fn client(python: &Path, target: &str, mib: usize) -> Result<ClientRun, String> {
    let (warm_up, steps) = steps_for(mib);
    let script = root().join("benches/read_and_sum_tf.py");
    let mut run = Task::spawn(Command::new(python).arg(&script).args([
        "--target",
        target,
        "--mib",
        &mib.to_string(),
        "--warm-up",
        &warm_up.to_string(),
        "--steps",
        &steps.to_string(),
    ]))?;
    let line = match run.line_starting("{", DEADLINE) {
        Ok(line) => line,
        Err(e) if e.contains("the sum is") => panic!("a wrong sum through {target}: {e}"),
        Err(e) => return Err(e),
    };
    let value: serde_json::Value =
        serde_json::from_str(&line).map_err(|e| format!("{e}: {line}"))?;
    let sum = value["sum"].as_f64().ok_or("no sum")?;
    let expected = expected_sum(mib << 18);
    assert_eq!(sum, expected, "the sum through {target}");
    let step_ms: Vec<f64> = value["step_ms"]
        .as_array()
        .ok_or_else(|| format!("no step_ms in {line}"))?
        .iter()
        .filter_map(serde_json::Value::as_f64)
        .collect();
    if step_ms.len() != steps {
        return Err(format!("{} steps timed, not {steps}", step_ms.len()));
    }
    let trace = value["trace"]
        .as_array()
        .and_then(|t| t.last())
        .map(describe_trace)
        .unwrap_or_default();
    Ok(ClientRun { step_ms, trace })
}

/// `wall W ms; ps: a@0.00+0.01 b@...; worker: ...`: the traced step's time in the client,
/// then each device's nodes by start, in ms.
fn describe_trace(trace: &serde_json::Value) -> String {
    if let Some(error) = trace.get("error") {
        return format!("no trace ({error})");
    }
    let mut parts = vec![format!(
        "wall {:.2} ms",
        trace["wall_ms"].as_f64().unwrap_or(f64::NAN)
    )];
    for (device, nodes) in trace["devices"].as_object().into_iter().flatten() {
        let short = device
            .strip_prefix("/job:")
            .and_then(|d| d.split('/').next())
            .unwrap_or(device);
        let mut nodes: Vec<(String, f64, f64)> = nodes
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(name, v)| Some((name.clone(), v[0].as_f64()?, v[1].as_f64()?)))
            .collect();
        nodes.sort_by(|a, b| a.1.total_cmp(&b.1));
        let nodes: Vec<String> = nodes
            .iter()
            .map(|(name, start, took)| format!("{name}@{start:.2}+{took:.2}"))
            .collect();
        parts.push(format!("{short}: {}", nodes.join(" ")));
    }
    parts.join("; ")
}

// ---------------------------------------------------------------------------------------------
// The floor.

/// Raw TCP into a tensor's buffer, then `Sum` of it in tessera's in-process session.
struct Floor {
    stream: TcpStream,
    session: Session,
    /// Per size: the tensor the bytes land in, the placeholder and the sum's names.
    graphs: Vec<(usize, Tensor, String, String)>,
    /// Steps whose tensor was still shared when the bytes came (read into a copy).
    shared: usize,
}

/// One floor step's parts, in ms, and the reference's (another pull, then a plain Rust sum).
struct FloorStep {
    tcp_ms: f64,
    sum_ms: f64,
    reference_tcp_ms: f64,
    reference_sum_ms: f64,
}

/// A plain sum in 16 lanes (the compiler vectorises it); exact for the bench's elements.
fn lanes_sum(values: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let chunks = values.chunks_exact(16);
    let rest: f32 = chunks.remainder().iter().sum();
    for chunk in chunks {
        for (lane, v) in lanes.iter_mut().zip(chunk) {
            *lane += v;
        }
    }
    lanes.iter().sum::<f32>() + rest
}

impl Floor {
    fn start() -> Floor {
        let largest = SIZES_MIB.iter().max().expect("sizes") << 18;
        let values: Vec<f32> = (0..largest).map(element).collect();
        let addr = raw_server(bytemuck::cast_slice(&values).to_vec());
        let stream = TcpStream::connect(addr).expect("connect raw TCP");
        stream.set_nodelay(true).expect("nodelay");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("read timeout");
        let mut g = Graph::new();
        let mut graphs = Vec::new();
        for mib in SIZES_MIB {
            let n = mib << 18;
            let x = g
                .placeholder(
                    &format!("x{mib}"),
                    DType::Float,
                    PartialShape::new(vec![Some(n)]),
                )
                .expect("placeholder");
            let sum = g.sum(&x, &[0], false).expect("sum");
            let tensor = Tensor::from_vec(vec![n], vec![0f32; n]).expect("tensor");
            graphs.push((mib, tensor, x.name(), sum.name()));
        }
        let session = Session::local();
        session.extend(&g.to_graph_def()).expect("extend");
        Floor {
            stream,
            session,
            graphs,
            shared: 0,
        }
    }

    fn step(&mut self, mib: usize) -> FloorStep {
        let (_, tensor, x, sum) = self
            .graphs
            .iter_mut()
            .find(|g| g.0 == mib)
            .expect("a graph of this size");
        if !tensor.is_unique() {
            self.shared += 1;
        }
        let stream = &mut self.stream;
        let expected = expected_sum(mib << 18);
        let started = Instant::now();
        tensor
            .update_in_place::<f32, _>(|elements| {
                raw_pull(stream, bytemuck::cast_slice_mut(elements))
            })
            .expect("a float tensor");
        let received = Instant::now();
        let fetched = self
            .session
            .run(&[(x.as_str(), tensor.clone())], &[sum.as_str()], &[])
            .expect("Sum in process");
        let summed = Instant::now();
        let value: f32 = fetched[0].scalar_value().expect("a float scalar");
        assert_eq!(value as f64, expected, "the floor's in-process sum");
        // The session's result goes before the next pull, so the tensor's buffer is ours.
        drop(fetched);

        // The reference: the same pull, then the plain sum.
        if !tensor.is_unique() {
            self.shared += 1;
        }
        let reference_started = Instant::now();
        let value = tensor
            .update_in_place::<f32, _>(|elements| {
                raw_pull(stream, bytemuck::cast_slice_mut(elements));
                let received = Instant::now();
                (received, lanes_sum(elements))
            })
            .expect("a float tensor");
        let reference_summed = Instant::now();
        let (reference_received, value) = value;
        assert_eq!(value as f64, expected, "the reference's plain sum");
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        FloorStep {
            tcp_ms: ms(received - started),
            sum_ms: ms(summed - received),
            reference_tcp_ms: ms(reference_received - reference_started),
            reference_sum_ms: ms(reference_summed - reference_received),
        }
    }
}

// ---------------------------------------------------------------------------------------------

fn ms_summary(values: &[f64]) -> String {
    let mut sorted = values.to_vec();
    let mid = median(&mut sorted);
    format!(
        "median {mid:7.2} ms ({:6.1} steps/s), min {:7.2}, max {:7.2}",
        1000.0 / mid,
        sorted[0],
        sorted[sorted.len() - 1]
    )
}

fn main() {
    let Some(python) = tensorflow_or_skip() else {
        return;
    };
    // 1 ps + 1 worker in this process; the client, in its own process, dials the worker.
    let tessera = LoopbackCluster::start(1, 1);
    let tensorflow = TensorFlowCluster::start(&python).expect("a TensorFlow cluster");
    let mut floor = Floor::start();
    let targets = [
        ("TensorFlow cluster", tensorflow.target.clone()),
        ("tessera cluster", tessera.target("worker", 0)),
    ];
    println!(
        "read-and-sum: a TensorFlow client's step, v (float32) on /job:ps/task:0, \
         tf.reduce_sum(v) on /job:worker/task:0, the scalar fetched; {ROUNDS} rounds per size, \
         the runtimes alternating; floor = raw TCP on loopback into a tensor + Sum in tessera's \
         in-process session"
    );
    let mut results = Vec::new();
    for mib in SIZES_MIB {
        let (warm_up, steps) = steps_for(mib);
        println!("\n{mib} MiB: {warm_up} warm-up and {steps} timed steps per run");
        // Per runtime (TensorFlow, tessera, floor): each run's median step in ms.
        let mut medians: [Vec<f64>; 3] = Default::default();
        // The floor's raw TCP and Sum; the reference's step and sum.
        let mut floor_parts: [Vec<f64>; 4] = Default::default();
        for round in 0..ROUNDS {
            for k in 0..3 {
                let which = (round + k) % 3;
                if which < 2 {
                    let (name, target) = &targets[which];
                    match client(&python, target, mib) {
                        Ok(run) => {
                            println!(
                                "  round {}: {name:<18} {}",
                                round + 1,
                                ms_summary(&run.step_ms)
                            );
                            println!("           trace: {}", run.trace);
                            medians[which].push(median(&mut run.step_ms.clone()));
                        }
                        Err(e) => println!("  round {}: {name:<18} failed: {e}", round + 1),
                    }
                } else {
                    for _ in 0..warm_up {
                        floor.step(mib);
                    }
                    let parts: Vec<FloorStep> = (0..steps).map(|_| floor.step(mib)).collect();
                    let total: Vec<f64> = parts.iter().map(|p| p.tcp_ms + p.sum_ms).collect();
                    let part = |f: fn(&FloorStep) -> f64| {
                        median(&mut parts.iter().map(f).collect::<Vec<_>>())
                    };
                    let tcp = part(|p| p.tcp_ms);
                    let sum = part(|p| p.sum_ms);
                    let reference: Vec<f64> = parts
                        .iter()
                        .map(|p| p.reference_tcp_ms + p.reference_sum_ms)
                        .collect();
                    let reference_tcp = part(|p| p.reference_tcp_ms);
                    let reference_sum = part(|p| p.reference_sum_ms);
                    println!(
                        "  round {}: {:<18} {}; raw TCP median {tcp:.2} ms ({:.2} GiB/s), \
                         Sum median {sum:.2} ms",
                        round + 1,
                        "floor",
                        ms_summary(&total),
                        (mib as f64 / 1024.0) / (tcp / 1000.0)
                    );
                    println!(
                        "           reference (raw TCP + plain Rust sum): {}; raw TCP \
                         {reference_tcp:.2} ms, sum {reference_sum:.2} ms ({:.1} GiB/s)",
                        ms_summary(&reference),
                        (mib as f64 / 1024.0) / (reference_sum / 1000.0)
                    );
                    medians[2].push(median(&mut total.clone()));
                    floor_parts[0].push(tcp);
                    floor_parts[1].push(sum);
                    floor_parts[2].push(median(&mut reference.clone()));
                    floor_parts[3].push(reference_sum);
                }
            }
        }
        if medians.iter().any(Vec::is_empty) {
            println!("  a runtime has no finished run; no ratios at {mib} MiB");
            continue;
        }
        let [tf, ours, low] = [0, 1, 2].map(|k| median(&mut medians[k]));
        let [tcp, sum, reference, reference_sum] =
            [0, 1, 2, 3].map(|k| median(&mut floor_parts[k]));
        let vs_tf = tf / ours;
        let vs_floor = low / ours;
        let met = vs_tf >= GOAL_VS_TENSORFLOW || vs_floor >= GOAL_VS_FLOOR;
        println!(
            "  medians of the runs' medians: TensorFlow {tf:.2} ms, tessera {ours:.2} ms, floor \
             {low:.2} ms (raw TCP {tcp:.2} + Sum {sum:.2}); reference {reference:.2} ms (its \
             plain sum {reference_sum:.2}), tessera / reference {:.2}",
            reference / ours
        );
        println!(
            "  tessera / TensorFlow {vs_tf:.2} (goal >= {GOAL_VS_TENSORFLOW}), tessera / floor \
             {vs_floor:.2} (goal >= {GOAL_VS_FLOOR}); either: {}",
            if met { "met" } else { "missed" }
        );
        results.push((mib, vs_tf, vs_floor, met));
    }
    if floor.shared > 0 {
        println!(
            "note: {} floor steps found their tensor still shared and read into a copy",
            floor.shared
        );
    }
    println!("\nsummary (speed ratios; goal: >= {GOAL_VS_TENSORFLOW} vs TensorFlow or >= {GOAL_VS_FLOOR} vs the floor)");
    for (mib, vs_tf, vs_floor, met) in results {
        println!(
            "  {mib:>3} MiB: tessera / TensorFlow {vs_tf:.2}, tessera / floor {vs_floor:.2}: {}",
            if met { "met" } else { "missed" }
        );
    }
}
