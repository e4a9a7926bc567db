//! Daemon start to serving: an in-process tessera task (`Server::local`: its devices, actors,
//! gRPC server and tensor channel) from the call that starts it to its first answered health
//! check, beside a bare tonic server (the grpc.health.v1 service alone on loopback) timed the
//! same way in the same run. Both include the client's connection and first call. The bare
//! server runs two ways: on the client's own runtime, and as a daemon runs one, on a thread and
//! a runtime of its own that its start builds, as tessera's start builds its gRPC front's. The
//! three alternate `ROUNDS` times; the bench prints every round, the medians and both ratios
//! (goal: tessera within 2x of the bare server), and where tessera's start went: the median of
//! each phase `Server::startup` reports (devices, setup, actors, gRPC) and the first call.

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

/// The health service alone on `listener`, until `stopped`.
async fn serve_health(
    listener: tokio::net::TcpListener,
    stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let (_reporter, health) = tonic_health::server::health_reporter();
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
        )
        .await
        .expect("the bare server");
}

/// A bare tonic server with the health service on the client's own runtime, started and
/// answering.
fn tonic_start(rt: &Runtime) -> Duration {
    let started = Instant::now();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("a loopback port");
    let addr = listener.local_addr().expect("its address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = rt.spawn(serve_health(listener, stopped));
    first_answer(rt, addr);
    let elapsed = started.elapsed();
    let _ = stop.send(());
    let _ = rt.block_on(serving);
    elapsed
}

/// The same server as a daemon runs one: on a thread and a runtime of its own (two worker
/// threads, as tessera's gRPC front), started and answering.
fn tonic_daemon_start(rt: &Runtime) -> Duration {
    let started = Instant::now();
    let (bound, address) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("the server's runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("a loopback port");
            let _ = bound.send(listener.local_addr().expect("its address"));
            serve_health(listener, stopped).await;
        });
    });
    let addr = address
        .recv_timeout(DEADLINE)
        .expect("the bare server bound");
    first_answer(rt, addr);
    let elapsed = started.elapsed();
    let _ = stop.send(());
    server.join().expect("the bare server's thread");
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
    let d = tonic_daemon_start(&rt);
    println!(
        "first start in this process (cold): bare tonic {b:.2?} (on its own runtime {d:.2?}), \
         tessera {t:.2?} (devices {:.2?}, setup {:.2?}, actors {:.2?}, gRPC {:.2?}, first call \
         {first_call:.2?})",
        startup.devices, startup.setup, startup.actors, startup.grpc
    );
    let (mut ours, mut bare, mut daemon) = (Vec::new(), Vec::new(), Vec::new());
    let mut phases: [Vec<Duration>; 5] = Default::default();
    println!("daemon start to serving (in process, through the first health check answered)");
    for round in 1..=ROUNDS {
        let b = tonic_start(&rt);
        let d = tonic_daemon_start(&rt);
        let (t, startup, first_call) = tessera_start(&rt);
        println!(
            "  round {round:>2}: bare tonic {b:>10.2?}, on its own runtime {d:>10.2?}, tessera \
             {t:>10.2?} (devices {:.2?}, setup {:.2?}, actors {:.2?}, gRPC {:.2?}, first call \
             {first_call:.2?})",
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
        daemon.push(d);
        ours.push(t);
    }
    let (b, d, t) = (median(bare), median(daemon), median(ours));
    let ratio = |base: Duration| t.as_secs_f64() / base.as_secs_f64();
    println!(
        "medians: bare tonic {b:.2?}, on its own runtime {d:.2?}, tessera {t:.2?}; ratio {:.2} \
         to the bare server, {:.2} to it on its own runtime (goal <= 2.0)",
        ratio(b),
        ratio(d)
    );
    let names = ["devices", "setup", "actors", "gRPC", "first call"];
    let parts: Vec<String> = names
        .iter()
        .zip(phases)
        .map(|(name, took)| format!("{name} {:.2?}", median(took)))
        .collect();
    println!("tessera's start, medians by phase: {}", parts.join(", "));
}
