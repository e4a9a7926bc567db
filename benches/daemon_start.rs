//! Daemon start to serving: an in-process tessera task (`Server::local`: its devices, actors,
//! gRPC server and tensor channel) from the call that starts it to its first answered health
//! check, beside a bare tonic server (the grpc.health.v1 service alone on loopback) timed the
//! same way in the same run. Both include the client's connection and first call. The two
//! alternate `ROUNDS` times; the bench prints every round, both medians and the ratio (goal:
//! tessera within 2x of the bare server), and where tessera's start went: the median of each
//! phase `Server::startup` reports (devices, setup, actors, gRPC) and the first call.

use std::time::{Duration, Instant};

use tessera::server::{Server, Startup};
use tokio::runtime::Runtime;
use tokio_stream::StreamExt;
use tonic::transport::Endpoint;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const ROUNDS: usize = 15;
/// How long a server may take to answer its first call.
const DEADLINE: Duration = Duration::from_secs(30);

/// Connects to `addr` and makes one health check, within [`DEADLINE`].
fn first_answer(rt: &Runtime, addr: std::net::SocketAddr) {
    rt.block_on(async {
        tokio::time::timeout(DEADLINE, async {
            let channel = Endpoint::from_shared(format!("http://{addr}"))
                .expect("endpoint")
                .tcp_nodelay(true)
                .connect()
                .await
                .expect("connect");
            HealthClient::new(channel)
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .expect("health check");
        })
        .await
        .expect("an answer within the deadline");
    });
}

/// A tessera task started and answering; with its phases and the first call's time.
fn tessera_start(rt: &Runtime) -> (Duration, Startup, Duration) {
    let started = Instant::now();
    let server = Server::local().expect("an in-process task");
    let serving = Instant::now();
    first_answer(rt, server.local_addr());
    let elapsed = started.elapsed();
    let first_call = serving.elapsed();
    let startup = server.startup();
    server.stop();
    (elapsed, startup, first_call)
}

/// A bare tonic server with the health service, started and answering.
fn tonic_start(rt: &Runtime) -> Duration {
    let started = Instant::now();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("a loopback port");
    let addr = listener.local_addr().expect("its address");
    let (_reporter, health) = tonic_health::server::health_reporter();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = rt.spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming_shutdown(
                // Without Nagle's algorithm, as tessera's sockets: a first call would otherwise
                // wait out a delayed acknowledgement (40 ms).
                tokio_stream::wrappers::TcpListenerStream::new(listener).map(|accepted| {
                    accepted.and_then(|stream| stream.set_nodelay(true).map(|()| stream))
                }),
                async {
                    let _ = stopped.await;
                },
            ),
    );
    first_answer(rt, addr);
    let elapsed = started.elapsed();
    let _ = stop.send(());
    let _ = rt.block_on(serving);
    elapsed
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a client runtime");
    // One of each first: the process's first task loads what every later one reuses (the
    // GPU probe, among others); printed apart, as a daemon's own start pays it once.
    let (t, startup, first_call) = tessera_start(&rt);
    let b = tonic_start(&rt);
    println!(
        "first start in this process (cold): bare tonic {b:.2?}, tessera {t:.2?} (devices \
         {:.2?}, setup {:.2?}, actors {:.2?}, gRPC {:.2?}, first call {first_call:.2?})",
        startup.devices, startup.setup, startup.actors, startup.grpc
    );
    let (mut ours, mut bare) = (Vec::new(), Vec::new());
    let mut phases: [Vec<Duration>; 5] = Default::default();
    println!("daemon start to serving (in process, through the first health check answered)");
    for round in 1..=ROUNDS {
        let b = tonic_start(&rt);
        let (t, startup, first_call) = tessera_start(&rt);
        println!(
            "  round {round:>2}: bare tonic {b:>10.2?}, tessera {t:>10.2?} (devices {:.2?}, \
             setup {:.2?}, actors {:.2?}, gRPC {:.2?}, first call {first_call:.2?})",
            startup.devices, startup.setup, startup.actors, startup.grpc
        );
        let parts = [
            startup.devices,
            startup.setup,
            startup.actors,
            startup.grpc,
            first_call,
        ];
        for (phase, took) in phases.iter_mut().zip(parts) {
            phase.push(took);
        }
        bare.push(b);
        ours.push(t);
    }
    let (b, t) = (median(bare), median(ours));
    println!(
        "medians: bare tonic {b:.2?}, tessera {t:.2?}, ratio {:.2} (goal <= 2.0)",
        t.as_secs_f64() / b.as_secs_f64()
    );
    let names = ["devices", "setup", "actors", "gRPC", "first call"];
    let parts: Vec<String> = names
        .iter()
        .zip(phases)
        .map(|(name, took)| format!("{name} {:.2?}", median(took)))
        .collect();
    println!("tessera's start, medians by phase: {}", parts.join(", "));
}
