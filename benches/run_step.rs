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
//! step, so that the machine's drift over the run falls on both alike).
//!
//! When the daemon's master cannot run sessions yet, the RunStep side is measured as the
//! RunStep RPC answered with its error by the master's gRPC front, and says so.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
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

    let session = Session::connect(&server.target()).expect("connect the session");
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
                rt.block_on(health.check(HealthCheckRequest {
                    service: String::new(),
                }))
                .expect("health check");
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
                        rt.block_on(health.check(HealthCheckRequest {
                            service: String::new(),
                        }))
                        .expect("health check");
                    });
                    step_time += timed("interleaved run_step", 1, &mut step);
                }
                step_time
            })
        });
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
    drop(session);
    server.stop();
}

criterion_group!(benches, bench);
criterion_main!(benches);
