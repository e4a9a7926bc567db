//! Daemon start to serving: an in-process tessera task (`Server::local`: its devices, actors,
//! gRPC server and tensor channel) from the call that starts it to its first answered health
//! check, beside a bare tonic server (the grpc.health.v1 service alone on loopback) timed the
//! same way in the same run. Both include the client's connection and first call. The two
//! alternate `ROUNDS` times; the bench prints every round, both medians and the ratio (goal:
//! tessera within 2x of the bare server).

use std::time::{Duration, Instant};

use tessera::server::Server;
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

/// A tessera task started and answering.
fn tessera_start(rt: &Runtime) -> Duration {
    let started = Instant::now();
    let server = Server::local().expect("an in-process task");
    first_answer(rt, server.local_addr());
    let elapsed = started.elapsed();
    server.stop();
    elapsed
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
    // One of each first: the process's first task loads what every later one reuses.
    tessera_start(&rt);
    tonic_start(&rt);
    let (mut ours, mut bare) = (Vec::new(), Vec::new());
    println!("daemon start to serving (in process, through the first health check answered)");
    for round in 1..=ROUNDS {
        let (b, t) = (tonic_start(&rt), tessera_start(&rt));
        println!("  round {round:>2}: bare tonic {b:>10.2?}, tessera {t:>10.2?}");
        bare.push(b);
        ours.push(t);
    }
    let (b, t) = (median(bare), median(ours));
    println!(
        "medians: bare tonic {b:.2?}, tessera {t:.2?}, ratio {:.2} (goal <= 2.0)",
        t.as_secs_f64() / b.as_secs_f64()
    );
}
