//! A RunStep of a trivial graph (`y = x + 1`, `x` fed) through a daemon's master, beside a
//! bare tonic round trip to the same daemon in the same run: grpc.health.v1 `Check`, a unary
//! call answered from a table (target: RunStep within 2x of it).
//!
//! Both go through the same client shape: a synchronous call blocking on a client-owned tokio
//! runtime (the remote `Session`'s own, and one built the same way for the echo), over one
//! loopback HTTP/2 connection to an in-process `Server`.
//!
//! Two ratios are printed: back to back (all echoes, then all steps: each loop runs hot, and
//! the stricter of the two, since the echo gains most from it) and interleaved (one echo, one
//! step, so that the machine's drift over the run falls on both alike). The session reaches
//! the master over gRPC (`rpc_options.use_rpc_for_inprocess_master`), as a client in another
//! process would.
//!
//! Then the remote trivial step of a training job (target: within 1.5x of the echo): on a
//! cluster of a ps and a worker, the worker's client adds 1 to a scalar variable on the ps
//! (`AssignAddVariableOp`), reaching its own task's master in process as `tessera train`'s
//! client does, and over gRPC; interleaved with the echo, one of each in turn. Two graphs:
//! the 1 a constant without a device, which placement puts beside its consumer on the ps as
//! TensorFlow's placer does (one RunGraph to the ps), and the 1 a constant on the worker, as
//! `replica_device_setter` places it (the ps then pulls it from the worker: a RecvTensor on
//! top of the RunGraph).
//!
//! When the daemon's master cannot run sessions yet, the RunStep side is measured as the
//! RunStep RPC answered with its error by the master's gRPC front, and says so.

mod support;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use support::cluster::{connect, LoopbackCluster, Reach};
use tessera::client::Session;
use tessera::graph::Graph;
use tessera::proto::master_service_client::MasterServiceClient;
use tessera::proto::RunStepRequest;
use tessera::server::Server;
use tessera::tensor::{DType, PartialShape, Tensor};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// Total time and calls per measured name, summed by `iter_custom`.
static TIMES: Mutex<Vec<(&'static str, Duration, u64)>> = Mutex::new(Vec::new());

fn record(name: &'static str, elapsed: Duration, iters: u64) {
    let mut times = TIMES.lock().unwrap_or_else(|e| e.into_inner());
    match times.iter_mut().find(|t| t.0 == name) {
        Some(t) => {
            t.1 += elapsed;
            t.2 += iters;
        }
        None => times.push((name, elapsed, iters)),
    }
}

/// One bare tonic round trip: a grpc.health.v1 `Check` answered from a table.
fn echo(rt: &tokio::runtime::Runtime, health: &mut HealthClient<tonic::transport::Channel>) {
    rt.block_on(health.check(HealthCheckRequest {
        service: String::new(),
    }))
    .expect("health check");
}

fn timed(name: &'static str, iters: u64, mut f: impl FnMut()) -> Duration {
    let started = Instant::now();
    for _ in 0..iters {
        f();
    }
    let elapsed = started.elapsed();
    record(name, elapsed, iters);
    elapsed
}

/// `y = AddV2(x, 1)` with `x` a fed float scalar; returns the graph and the fetch name.
fn trivial_graph() -> (Graph, String) {
    let mut g = Graph::new();
    let x = g
        .placeholder("x", DType::Float, PartialShape::new(vec![]))
        .expect("placeholder");
    let one = g.scalar("one", DType::Float, 1.0).expect("const");
    let y = g.add(&x, &one).expect("add");
    (g, y.name())
}

/// A scalar variable `v` on the ps and `AssignAddVariableOp(v, 1)` beside it, the 1 a
/// constant on the worker when `one_on_worker`, else without a device; returns the graph, the
/// initializer, the update and `v`'s read.
fn assign_add_graph(one_on_worker: bool) -> (Graph, String, String, String) {
    let mut g = Graph::new();
    let v = g
        .with_device("/job:ps/task:0", |g| {
            let zero = g.scalar("zero", DType::Float, 0.0)?;
            g.variable("v", &zero)
        })
        .expect("variable");
    let one = if one_on_worker {
        g.with_device("/job:worker/task:0", |g| g.scalar("one", DType::Float, 1.0))
    } else {
        g.scalar("one", DType::Float, 1.0)
    }
    .expect("const");
    let add = g
        .with_device("/job:ps/task:0", |g| g.assign_add_variable(&v.handle, &one))
        .expect("assign_add");
    let read = v.value.name();
    (g, v.initializer, add, read)
}

/// The worker's client of a ps + worker cluster, reaching its master as `reach` says, with the
/// assign-add graph initialised; returns it with the update and the read.
fn assign_add_session(
    cluster: &LoopbackCluster,
    reach: Reach,
    one_on_worker: bool,
) -> (Session, String, String) {
    let session = connect(&cluster.target("worker", 0), reach);
    let (graph, init, add, read) = assign_add_graph(one_on_worker);
    session.extend(&graph.to_graph_def()).expect("extend");
    session.run(&[], &[], &[&init]).expect("init");
    (session, add, read)
}

fn bench(c: &mut Criterion) {
    let server = Server::local().expect("in-process daemon");
    let addr = server.local_addr();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("client runtime");
    let channel = rt
        .block_on(
            tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .expect("endpoint")
                .tcp_nodelay(true)
                .connect(),
        )
        .expect("connect");
    let mut health = HealthClient::new(channel.clone());
    let mut master = MasterServiceClient::new(channel);

    let session = connect(&server.target(), Reach::Grpc);
    let (graph, fetch) = trivial_graph();
    let runs_steps = match session.extend(&graph.to_graph_def()) {
        Ok(()) => {
            let y = session
                .run(&[("x:0", Tensor::scalar(2.0f32))], &[&fetch], &[])
                .expect("first step");
            assert_eq!(y[0].scalar_value::<f32>().expect("f32"), 3.0);
            true
        }
        Err(e) => {
            println!(
                "note: the daemon's master cannot run sessions ({e}); measuring the RunStep RPC \
                 answered with that error instead"
            );
            false
        }
    };

    let mut group = c.benchmark_group("run_step");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("health_check_echo (baseline)", |b| {
        b.iter_custom(|iters| {
            timed("echo", iters, || {
                echo(&rt, &mut health);
            })
        })
    });
    if runs_steps {
        let mut step = || {
            session
                .run(&[("x:0", Tensor::scalar(2.0f32))], &[&fetch], &[])
                .expect("step");
        };
        group.bench_function("run_step (x + 1)", |b| {
            b.iter_custom(|iters| timed("run_step", iters, &mut step))
        });
        group.bench_function("interleaved (run_step time)", |b| {
            b.iter_custom(|iters| {
                let mut step_time = Duration::ZERO;
                for _ in 0..iters {
                    timed("interleaved echo", 1, || {
                        echo(&rt, &mut health);
                    });
                    step_time += timed("interleaved run_step", 1, &mut step);
                }
                step_time
            })
        });
        let cluster = LoopbackCluster::start(1, 1);
        // (name, session, update, read) for each way of reaching the master and each graph.
        let variants = [
            ("ps step in process", Reach::InProcess, false),
            ("ps step over gRPC", Reach::Grpc, false),
            (
                "ps step in process, 1 on the worker",
                Reach::InProcess,
                true,
            ),
            ("ps step over gRPC, 1 on the worker", Reach::Grpc, true),
        ]
        .map(|(name, reach, one_on_worker)| {
            let (session, add, read) = assign_add_session(&cluster, reach, one_on_worker);
            (name, session, add, read)
        });
        let mut steps = 0u64;
        group.bench_function("interleaved (ps assign_add, client in process)", |b| {
            b.iter_custom(|iters| {
                let mut step_time = Duration::ZERO;
                for _ in 0..iters {
                    timed("ps echo", 1, || {
                        echo(&rt, &mut health);
                    });
                    for (i, (name, session, add, _)) in variants.iter().enumerate() {
                        let took = timed(name, 1, || {
                            session.run(&[], &[], &[add]).expect("assign_add");
                        });
                        if i == 0 {
                            step_time += took;
                        }
                    }
                    steps += 1;
                }
                step_time
            })
        });
        // The ps keeps one `v` for every session (variables live in its container by name):
        // initialised by each session as it started, then stepped by all four.
        for (name, session, _, read) in &variants {
            let v = session.run(&[], &[read], &[]).expect("read v");
            let v = v[0].scalar_value::<f32>().expect("f32");
            let expected = (variants.len() as u64 * steps) as f32;
            assert_eq!(v, expected, "{name}: v should count every step");
        }
    } else {
        group.bench_function("run_step_rpc (error answer)", |b| {
            b.iter_custom(|iters| {
                timed("run_step", iters, || {
                    let _ = rt.block_on(master.run_step(RunStepRequest::default()));
                })
            })
        });
    }
    group.finish();

    let times = TIMES.lock().unwrap_or_else(|e| e.into_inner());
    let micros = |name: &str| {
        times
            .iter()
            .find(|t| t.0 == name)
            .map(|t| t.1.as_secs_f64() * 1e6 / t.2 as f64)
    };
    let ratio = |echo: &str, step: &str, how: &str| {
        if let (Some(echo), Some(step)) = (micros(echo), micros(step)) {
            println!(
                "  {how}: echo {echo:.1} µs, RunStep {step:.1} µs{}, ratio {:.2}",
                if runs_steps {
                    ""
                } else {
                    " (error answer, no step run)"
                },
                step / echo
            );
        }
    };
    println!("\nRunStep vs bare tonic echo (same run; target: ratio <= 2.0)");
    ratio("echo", "run_step", "back to back");
    ratio("interleaved echo", "interleaved run_step", "interleaved");
    println!(
        "\nThe worker's client adding 1 to a ps variable vs the same echo, interleaved (target: \
         ratio <= 1.5)"
    );
    for name in [
        "ps step in process",
        "ps step over gRPC",
        "ps step in process, 1 on the worker",
        "ps step over gRPC, 1 on the worker",
    ] {
        ratio("ps echo", name, name);
    }
    drop(session);
    server.stop();
}

criterion_group!(benches, bench);
criterion_main!(benches);
