//! The task's Prometheus metrics: the series tessera exports, the process-wide recorder, and
//! the HTTP endpoint that serves them (`[metrics] listen`).
//!
//! Code that counts calls the `metrics` crate's macros with the names below; without an
//! installed recorder (no `[metrics]` section) those calls do nothing. The recorder is
//! `metrics-exporter-prometheus`'s, installed once per process the first time a server starts
//! with metrics on. Every series carries a `task` label (`/job:ps/replica:0/task:0`): a
//! process normally runs one task, but tests and `tessera local` run several, and their series
//! must not add up.
//!
//! Gauges that describe state rather than events (variables and bytes held by a shard) are read
//! when scraped: [`register_collector`] adds a function the endpoint runs before rendering.
//!
//! The endpoint is a small hyper HTTP/1 server on the task's gRPC runtime; the exporter's own
//! listener cannot report the port it bound, and port 0 must work for tests.

use std::net::{SocketAddr, TcpListener};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::error::{Result, Status};

/// RPCs served, by `service`, `method` and gRPC `code` (counter).
pub const RPCS: &str = "tessera_rpcs_total";
/// Time to answer an RPC, by `service` and `method`, up to the response's headers (histogram).
pub const RPC_SECONDS: &str = "tessera_rpc_duration_seconds";
/// Time of one master RunStep (or RunCallable), from the call to the answer (histogram).
pub const MASTER_STEP_SECONDS: &str = "tessera_master_step_duration_seconds";
/// Time of one worker RunGraph, from the call to the answer (histogram).
pub const WORKER_STEP_SECONDS: &str = "tessera_worker_step_duration_seconds";
/// Payload bytes this task sent, by `rpc` (RunStep and RunGraph answers, RecvTensor
/// answers) (counter).
pub const SENT_BYTES: &str = "tessera_sent_bytes_total";
/// Payload bytes this task received, by `rpc` (RunStep and RunGraph requests, tensors
/// fetched from peers with RecvTensor) (counter).
pub const RECEIVED_BYTES: &str = "tessera_received_bytes_total";
/// RecvTensor calls that waited on this task's rendezvous for a value (counter).
pub const RENDEZVOUS_WAITS: &str = "tessera_rendezvous_waits_total";
/// How long a RecvTensor waited on this task's rendezvous for its value (histogram).
pub const RENDEZVOUS_WAIT_SECONDS: &str = "tessera_rendezvous_wait_duration_seconds";
/// Variables the shard holds, by `device` (gauge).
pub const SHARD_VARIABLES: &str = "tessera_shard_variables";
/// Bytes of variable values the shard holds, by `device` (gauge).
pub const SHARD_BYTES: &str = "tessera_shard_variable_bytes";
/// Bytes charged to a device's memory budget now, step tensors and variables, by `device`
/// (gauge).
pub const DEVICE_MEMORY_BYTES: &str = "tessera_device_memory_bytes";
/// The most bytes ever charged to a device's memory budget at once, by `device` (gauge).
pub const DEVICE_MEMORY_PEAK_BYTES: &str = "tessera_device_memory_peak_bytes";
/// A device's memory budget (`devices.cpu_memory_limit`, `devices.gpu_memory_fraction`), by
/// `device` (gauge).
pub const DEVICE_MEMORY_LIMIT_BYTES: &str = "tessera_device_memory_limit_bytes";
/// Bytes of freed large host buffers the process's host pool keeps for the next step
/// (`device::host_pool`) (gauge).
pub const HOST_POOL_KEPT_BYTES: &str = "tessera_host_pool_kept_bytes";
/// Sessions the task's master holds open (gauge).
pub const SESSIONS_OPEN: &str = "tessera_sessions_open";
/// Steps the task's master is running now, across its sessions (gauge).
pub const STEPS_IN_FLIGHT: &str = "tessera_steps_in_flight";

/// Histogram buckets, in seconds: 100 µs to 2 minutes, about ×2.5 apart.
const SECONDS_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 120.0,
];

/// How long the endpoint waits for a scraper to send its request and take the answer.
const SCRAPE_DEADLINE: Duration = Duration::from_secs(10);

/// A function run before each scrape; returns `false` once what it reads is gone, and is
/// then dropped.
pub type Collector = Box<dyn Fn() -> bool + Send + Sync>;

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
static COLLECTORS: Mutex<Vec<Collector>> = Mutex::new(Vec::new());

/// Installs the process's Prometheus recorder (once; later calls return the same handle).
/// From then on every `metrics` macro call in the process is recorded.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new();
            let recorder = match builder.set_buckets(SECONDS_BUCKETS) {
                Ok(builder) => builder.build_recorder(),
                // Only an empty bucket list is refused; the list above is not empty.
                Err(e) => {
                    warn!(error = %e, "histogram buckets refused; histograms become summaries");
                    PrometheusBuilder::new().build_recorder()
                }
            };
            let handle = recorder.handle();
            if let Err(e) = metrics::set_global_recorder(recorder) {
                warn!(error = %e, "another metrics recorder is installed; tessera's series stay empty");
            }
            describe();
            handle
        })
        .clone()
}

/// The `# HELP` lines of every series.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        RPCS,
        "gRPC calls answered, by service, method and status code"
    );
    describe_histogram!(RPC_SECONDS, Unit::Seconds, "time to answer a gRPC call");
    describe_histogram!(
        MASTER_STEP_SECONDS,
        Unit::Seconds,
        "time of one master RunStep"
    );
    describe_histogram!(
        WORKER_STEP_SECONDS,
        Unit::Seconds,
        "time of one worker RunGraph"
    );
    describe_counter!(SENT_BYTES, Unit::Bytes, "payload bytes sent, by RPC");
    describe_counter!(
        RECEIVED_BYTES,
        Unit::Bytes,
        "payload bytes received, by RPC"
    );
    describe_counter!(
        RENDEZVOUS_WAITS,
        "RecvTensor calls that waited on the rendezvous"
    );
    describe_histogram!(
        RENDEZVOUS_WAIT_SECONDS,
        Unit::Seconds,
        "time a RecvTensor waited for its value"
    );
    describe_gauge!(SHARD_VARIABLES, "variables held by the variable shard");
    describe_gauge!(
        SHARD_BYTES,
        Unit::Bytes,
        "bytes of variable values held by the shard"
    );
    describe_gauge!(
        DEVICE_MEMORY_BYTES,
        Unit::Bytes,
        "bytes charged to the device's memory budget: step tensors and variables"
    );
    describe_gauge!(
        DEVICE_MEMORY_PEAK_BYTES,
        Unit::Bytes,
        "the most bytes ever charged to the device's memory budget at once"
    );
    describe_gauge!(
        DEVICE_MEMORY_LIMIT_BYTES,
        Unit::Bytes,
        "the device's memory budget"
    );
    describe_gauge!(
        HOST_POOL_KEPT_BYTES,
        Unit::Bytes,
        "bytes of freed large host buffers kept for reuse by the next step"
    );
    describe_gauge!(SESSIONS_OPEN, "sessions the master holds open");
    describe_gauge!(STEPS_IN_FLIGHT, "steps the master is running");
}

/// Whether the recorder is installed (some server of this process has metrics on).
pub fn enabled() -> bool {
    HANDLE.get().is_some()
}

/// Adds a function the endpoint runs before each scrape, to set gauges read from live state.
/// Does nothing while metrics are off (nobody would scrape).
pub fn register_collector(collector: Collector) {
    if enabled() {
        lock_collectors().push(collector);
    }
}

fn lock_collectors() -> std::sync::MutexGuard<'static, Vec<Collector>> {
    COLLECTORS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs the collectors (dropping those whose state is gone) and renders every series in
/// Prometheus' text format.
pub fn render() -> String {
    let Some(handle) = HANDLE.get() else {
        return String::new();
    };
    lock_collectors().retain(|collect| collect());
    handle.run_upkeep();
    handle.render()
}

/// Binds the metrics endpoint's port: called at server start, so a busy port fails the start
/// and the bound address (with the OS's port for port 0) is known before serving.
pub fn bind(task: &str, addr: SocketAddr) -> Result<TcpListener> {
    let listener = TcpListener::bind(addr).map_err(|e| {
        Status::unavailable(format!(
            "{task}: cannot listen for metrics on {addr}: {e}; free the port or change \
             metrics.listen"
        ))
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Status::internal(format!("cannot make {addr} non-blocking: {e}")))?;
    Ok(listener)
}

/// Serves `GET /metrics` (any path but `/health`, which answers `OK`) on `listener` until
/// `shutdown` turns true. Runs on the caller's tokio runtime.
pub async fn serve(listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(e) => {
            warn!(error = %e, "cannot register the metrics listener; metrics are not served");
            return;
        }
    };
    loop {
        let stream = tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    debug!(error = %e, "metrics: accept failed");
                    continue;
                }
            },
        };
        tokio::spawn(async move {
            let service = service_fn(
                |request: hyper::Request<hyper::body::Incoming>| async move {
                    let body = match request.uri().path() {
                        "/health" => String::from("OK\n"),
                        // Rendering walks every series; keep it off the runtime's async threads.
                        _ => tokio::task::spawn_blocking(render)
                            .await
                            .unwrap_or_default(),
                    };
                    let mut response = hyper::Response::new(Full::new(Bytes::from(body)));
                    response.headers_mut().insert(
                        hyper::header::CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
                    );
                    Ok::<_, std::convert::Infallible>(response)
                },
            );
            let connection = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            // A scraper that stops reading does not hold a task forever.
            match tokio::time::timeout(SCRAPE_DEADLINE, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!(error = %e, "metrics: connection failed"),
                Err(_) => debug!("metrics: scrape took longer than {SCRAPE_DEADLINE:?}, dropped"),
            }
        });
    }
}

/// Counts `bytes` sent by `task` for `rpc`.
pub fn sent(task: &str, rpc: &'static str, bytes: usize) {
    metrics::counter!(SENT_BYTES, "task" => task.to_owned(), "rpc" => rpc).increment(bytes as u64);
}

/// Counts `bytes` received by `task` for `rpc`.
pub fn received(task: &str, rpc: &'static str, bytes: usize) {
    metrics::counter!(RECEIVED_BYTES, "task" => task.to_owned(), "rpc" => rpc)
        .increment(bytes as u64);
}

/// Records one value of the histogram `name` (in seconds) for `task`.
pub fn seconds(name: &'static str, task: &str, elapsed: Duration) {
    metrics::histogram!(name, "task" => task.to_owned()).record(elapsed.as_secs_f64());
}

/// Counts one rendezvous wait of `task` that took `elapsed`.
pub fn rendezvous_wait(task: &str, elapsed: Duration) {
    metrics::counter!(RENDEZVOUS_WAITS, "task" => task.to_owned()).increment(1);
    seconds(RENDEZVOUS_WAIT_SECONDS, task, elapsed);
}

/// Sets the number of sessions `task`'s master holds.
pub fn sessions_open(task: &str, open: usize) {
    metrics::gauge!(SESSIONS_OPEN, "task" => task.to_owned()).set(open as f64);
}

/// A step of `task` in flight: raises [`STEPS_IN_FLIGHT`] now and lowers it when dropped,
/// however the step ends.
pub struct StepInFlight {
    task: String,
}

impl StepInFlight {
    /// Counts a step of `task` as started.
    pub fn start(task: &str) -> Self {
        metrics::gauge!(STEPS_IN_FLIGHT, "task" => task.to_owned()).increment(1.0);
        Self {
            task: task.to_owned(),
        }
    }
}

impl Drop for StepInFlight {
    fn drop(&mut self) {
        metrics::gauge!(STEPS_IN_FLIGHT, "task" => std::mem::take(&mut self.task)).decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_their_unit_and_prefix() {
        for name in [
            RPCS,
            RPC_SECONDS,
            MASTER_STEP_SECONDS,
            WORKER_STEP_SECONDS,
            SENT_BYTES,
            RECEIVED_BYTES,
            RENDEZVOUS_WAITS,
            RENDEZVOUS_WAIT_SECONDS,
            SHARD_VARIABLES,
            SHARD_BYTES,
            DEVICE_MEMORY_BYTES,
            DEVICE_MEMORY_PEAK_BYTES,
            DEVICE_MEMORY_LIMIT_BYTES,
            HOST_POOL_KEPT_BYTES,
            SESSIONS_OPEN,
            STEPS_IN_FLIGHT,
        ] {
            assert!(name.starts_with("tessera_"), "{name}");
        }
        // Prometheus conventions: counters end in _total, times in _seconds, sizes in _bytes.
        assert!(SENT_BYTES.ends_with("_bytes_total"));
        assert!(MASTER_STEP_SECONDS.ends_with("_seconds"));
        assert!(SHARD_BYTES.ends_with("_bytes"));
    }

    #[test]
    fn buckets_rise() {
        assert!(SECONDS_BUCKETS.windows(2).all(|w| w[0] < w[1]));
    }
}
