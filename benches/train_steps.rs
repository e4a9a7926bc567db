//! Training steps per second of one MLP: in process (one task, `Session::local()`) against
//! asynchronous between-graph replication over loopback with 1 ps and 1 or 2 workers.
//!
//! ```text
//! local            Session::local()          one client thread, every op in process
//! 1 worker         ps:0 + worker:0           the worker's client → its master (in process,
//!                                            as `tessera train`'s); variables on the ps
//! 1 worker (gRPC)  ps:0 + worker:0           the same, the client reaching its master over
//!                                            gRPC on loopback, as one in another process would
//! 2 workers        ps:0 + worker:0, worker:1 two client threads, one per worker, steps counted
//!                                            together (global steps per second)
//! ```
//!
//! The tasks are in-process `Server`s on listeners bound to 127.0.0.1:0, so the distributed
//! runs pay the real path between tasks (RunGraph to the ps, the variables and gradients over
//! the tensor channel) but no process start. Each step feeds one batch of 32 examples, runs forward,
//! backward and a GradientDescent update of the four variables (16→64→10, about 1,700
//! floats) and fetches the loss. At the end it prints steps per second of each setup and
//! their ratios to the in-process baseline.

mod support;

use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use support::cluster::{connect, LoopbackCluster, Reach};
use tessera::client::Session;
use tessera::graph::scope::replica_device_setter;
use tessera::graph::Graph;
use tessera::proto::GraphDef;
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::train::optimizer::{get_or_create_global_step, Optimizer};

const BATCH: usize = 32;
const INPUTS: usize = 16;
const HIDDEN: usize = 64;
const CLASSES: usize = 10;

/// The MLP's graph and the names a step feeds, fetches and runs.
struct Mlp {
    graph: GraphDef,
    init: String,
    loss: String,
    train: String,
}

/// A deterministic value in [-0.5, 0.5) for weight initialisation and data.
fn value(i: usize, salt: usize) -> f32 {
    ((i * 7919 + salt * 104_729) % 1000) as f32 / 1000.0 - 0.5
}

/// Builds the MLP; `worker` places it as that worker's replica (variables on the ps).
fn mlp(worker: Option<usize>) -> Mlp {
    let mut g = Graph::new();
    let build = |g: &mut Graph| -> tessera::Result<(String, String)> {
        let global_step = get_or_create_global_step(g)?;
        let w1 = Tensor::from_vec(
            vec![INPUTS, HIDDEN],
            (0..INPUTS * HIDDEN).map(|i| value(i, 1) * 0.3).collect(),
        )?;
        let w1 = g.constant(&w1)?;
        let w1 = g.variable("w1", &w1)?;
        let b1 = g.constant(&Tensor::from_vec(vec![HIDDEN], vec![0.0f32; HIDDEN])?)?;
        let b1 = g.variable("b1", &b1)?;
        let w2 = Tensor::from_vec(
            vec![HIDDEN, CLASSES],
            (0..HIDDEN * CLASSES).map(|i| value(i, 2) * 0.3).collect(),
        )?;
        let w2 = g.constant(&w2)?;
        let w2 = g.variable("w2", &w2)?;
        let b2 = g.constant(&Tensor::from_vec(vec![CLASSES], vec![0.0f32; CLASSES])?)?;
        let b2 = g.variable("b2", &b2)?;
        let x = g.placeholder(
            "x",
            DType::Float,
            PartialShape::new(vec![None, Some(INPUTS)]),
        )?;
        let y = g.placeholder("y", DType::Int64, PartialShape::new(vec![None]))?;
        let h = g.matmul(&x, &w1.value)?;
        let h = g.bias_add(&h, &b1.value)?;
        let h = g.relu(&h)?;
        let logits = g.matmul(&h, &w2.value)?;
        let logits = g.bias_add(&logits, &b2.value)?;
        let (per_example, _) = g.sparse_softmax_cross_entropy(&logits, &y)?;
        let loss = g.mean(&per_example, &[0], false)?;
        let train = Optimizer::gradient_descent(0.1).minimize(g, &loss, Some(&global_step))?;
        Ok((loss.name(), train))
    };
    let (loss, train) = match worker {
        None => build(&mut g),
        Some(task) => {
            let setter = replica_device_setter(1, &format!("/job:worker/task:{task}"))
                .expect("device setter");
            g.with_device_fn(setter, build)
        }
    }
    .expect("build the MLP");
    let init = g.global_variables_initializer().expect("init");
    Mlp {
        graph: g.to_graph_def(),
        init,
        loss,
        train,
    }
}

/// One batch: inputs in [-0.5, 0.5), labels from the sign pattern of the first inputs.
fn batch(seed: usize) -> (Tensor, Tensor) {
    let x: Vec<f32> = (0..BATCH * INPUTS).map(|i| value(i, seed + 3)).collect();
    let y: Vec<i64> = (0..BATCH)
        .map(|r| (x[r * INPUTS] > 0.0) as i64 * 2 + (x[r * INPUTS + 1] > 0.0) as i64)
        .collect();
    (
        Tensor::from_vec(vec![BATCH, INPUTS], x).expect("x"),
        Tensor::from_vec(vec![BATCH], y).expect("y"),
    )
}

fn step(session: &Session, m: &Mlp, feed: &(Tensor, Tensor)) {
    session
        .run(
            &[("x:0", feed.0.clone()), ("y:0", feed.1.clone())],
            &[&m.loss],
            &[&m.train],
        )
        .expect("training step");
}

/// Seconds per step measured per setup, summed over criterion's calls.
static RATES: Mutex<Vec<(&'static str, Duration, u64)>> = Mutex::new(Vec::new());

fn record(name: &'static str, elapsed: Duration, steps: u64) {
    let mut rates = RATES.lock().unwrap_or_else(|e| e.into_inner());
    match rates.iter_mut().find(|r| r.0 == name) {
        Some(r) => {
            r.1 += elapsed;
            r.2 += steps;
        }
        None => rates.push((name, elapsed, steps)),
    }
}

/// Clients of one distributed setup: one session per worker, each on its own worker's master.
struct Replicas {
    sessions: Vec<Arc<Session>>,
    models: Vec<Arc<Mlp>>,
}

impl Replicas {
    fn connect(cluster: &LoopbackCluster, workers: usize, reach: Reach) -> Self {
        let mut sessions = Vec::new();
        let mut models = Vec::new();
        for task in 0..workers {
            let m = mlp(Some(task));
            let session = connect(&cluster.target("worker", task), reach);
            session.extend(&m.graph).expect("extend");
            if task == 0 {
                session.run(&[], &[], &[&m.init]).expect("init");
            }
            sessions.push(Arc::new(session));
            models.push(Arc::new(m));
        }
        Self { sessions, models }
    }

    /// Runs `steps` steps split over the workers, each on its own thread; returns the wall time.
    fn run(&self, steps: u64) -> Duration {
        let n = self.sessions.len() as u64;
        let start = Arc::new(Barrier::new(self.sessions.len() + 1));
        let threads: Vec<_> = (0..self.sessions.len())
            .map(|k| {
                let (session, m) = (self.sessions[k].clone(), self.models[k].clone());
                let share = steps / n + u64::from((k as u64) < steps % n);
                let start = start.clone();
                thread::spawn(move || {
                    let feed = batch(k);
                    start.wait();
                    for _ in 0..share {
                        step(&session, &m, &feed);
                    }
                })
            })
            .collect();
        start.wait();
        let began = Instant::now();
        for t in threads {
            t.join().expect("worker thread");
        }
        began.elapsed()
    }
}

fn bench(c: &mut Criterion) {
    let local = Session::local();
    let local_mlp = mlp(None);
    local.extend(&local_mlp.graph).expect("extend local");
    local.run(&[], &[], &[&local_mlp.init]).expect("init local");
    let local_feed = batch(0);

    let one = LoopbackCluster::start(1, 1);
    let one_replicas = Replicas::connect(&one, 1, Reach::InProcess);
    let one_grpc = LoopbackCluster::start(1, 1);
    let one_grpc_replicas = Replicas::connect(&one_grpc, 1, Reach::Grpc);
    let two = LoopbackCluster::start(1, 2);
    let two_replicas = Replicas::connect(&two, 2, Reach::InProcess);

    let mut group = c.benchmark_group("train_steps");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("in-process (1 task)", |b| {
        b.iter_custom(|iters| {
            let began = Instant::now();
            for _ in 0..iters {
                step(&local, &local_mlp, &local_feed);
            }
            let elapsed = began.elapsed();
            record("local", elapsed, iters);
            elapsed
        })
    });
    group.bench_function("1 ps + 1 worker", |b| {
        b.iter_custom(|iters| {
            let elapsed = one_replicas.run(iters);
            record("1 worker", elapsed, iters);
            elapsed
        })
    });
    group.bench_function("1 ps + 1 worker, client over gRPC", |b| {
        b.iter_custom(|iters| {
            let elapsed = one_grpc_replicas.run(iters);
            record("1 worker (gRPC)", elapsed, iters);
            elapsed
        })
    });
    group.bench_function("1 ps + 2 workers (steps of both)", |b| {
        b.iter_custom(|iters| {
            let elapsed = two_replicas.run(iters);
            record("2 workers", elapsed, iters);
            elapsed
        })
    });
    group.finish();

    let rates = RATES.lock().unwrap_or_else(|e| e.into_inner());
    let per_sec = |name: &str| {
        rates
            .iter()
            .find(|r| r.0 == name)
            .map(|r| r.2 as f64 / r.1.as_secs_f64())
    };
    if let Some(base) = per_sec("local") {
        println!("\ntraining steps per second (MLP {INPUTS}-{HIDDEN}-{CLASSES}, batch {BATCH})");
        println!("  in-process (1 task)   {base:8.1} steps/s  (baseline)");
        for name in ["1 worker", "1 worker (gRPC)", "2 workers"] {
            if let Some(rate) = per_sec(name) {
                println!(
                    "  1 ps + {name:<16}    {rate:8.1} steps/s  ratio to baseline {:.2}",
                    rate / base
                );
            }
        }
        if let (Some(local), Some(grpc)) = (per_sec("1 worker"), per_sec("1 worker (gRPC)")) {
            println!(
                "  1 worker: client in process / over gRPC {:.2}",
                local / grpc
            );
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
