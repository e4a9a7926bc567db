//! The daemon the RPC targets talk to: one in-process `Server` on 127.0.0.1:0, started on the
//! first input and kept for the whole run, and a tokio runtime for its clients. Each input is
//! one real gRPC call through tonic into the same handlers a remote peer reaches.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use tessera::cluster::{TaskConfig, Timeouts};
use tessera::server::Server;
use tonic::transport::{Channel, Endpoint};

/// The only device of the fuzzed task.
#[allow(dead_code)] // run_step does not name the device.
pub const DEVICE: &str = "/job:localhost/replica:0/task:0/device:CPU:0";

/// How long one call may take before the input counts as a hang (libFuzzer's -timeout is
/// the backstop).
pub const CALL_DEADLINE: Duration = Duration::from_secs(5);

/// A started daemon and a channel to it.
pub struct Daemon {
    pub runtime: tokio::runtime::Runtime,
    pub channel: Channel,
    /// Kept alive for the whole run.
    _server: Server,
}

/// Starts the daemon once: steps and receives give up after a second, so an input that waits
/// on a tensor nobody sends costs a second, not a minute.
pub fn daemon() -> &'static Daemon {
    static DAEMON: OnceLock<Daemon> = OnceLock::new();
    DAEMON.get_or_init(|| {
        let config = TaskConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            timeouts: Timeouts {
                rpc: Duration::from_secs(1),
                connect: Duration::from_secs(5),
                ..Default::default()
            },
            ..TaskConfig::local()
        };
        let server = Server::start(config).expect("the fuzzed daemon starts");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime for the client");
        let channel = runtime
            .block_on(
                Endpoint::from_shared(format!("http://{}", server.local_addr()))
                    .expect("a loopback endpoint")
                    .connect_timeout(CALL_DEADLINE)
                    .timeout(CALL_DEADLINE)
                    .connect(),
            )
            .expect("the client connects to the fuzzed daemon");
        Daemon {
            runtime,
            channel,
            _server: server,
        }
    })
}

/// Fails the input when the daemon's answer shows it stopped serving: UNAVAILABLE (its actors
/// are gone), CANCELLED (the client's deadline passed: a handler hung), or INTERNAL/UNKNOWN (a
/// bug rather than a refusal). DEADLINE_EXCEEDED is the daemon's own step deadline: an answer.
pub fn check_answer<T>(rpc: &str, answer: &Result<T, tonic::Status>) {
    if let Err(status) = answer {
        let code = status.code();
        assert!(
            !matches!(
                code,
                tonic::Code::Unavailable
                    | tonic::Code::Cancelled
                    | tonic::Code::Internal
                    | tonic::Code::Unknown
            ),
            "{rpc} answered {code:?}: {}",
            status.message()
        );
    }
}
