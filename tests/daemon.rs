//! The real `tessera` binary, as systemd runs it: two daemons (ps 0 and worker 0 of one
//! cluster file) on OS-chosen ports, asked over gRPC by tonic clients and by the CLI, then
//! stopped with SIGTERM.
//!
//! Every wait has a deadline; the port comes from the daemon's readiness line, never a sleep;
//! a daemon left running by a failed assertion is killed by its guard.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use tessera::proto::master_service_client::MasterServiceClient;
use tessera::proto::worker_service_client::WorkerServiceClient;
use tessera::proto::{
    DeviceAttributes, GetStatusRequest, ListDevicesRequest, RunGraphRequest, RunStepRequest,
};
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::support::requirement;

/// How long a daemon may take to print its readiness line (a cold debug binary on a busy
/// two-core machine).
const READY_DEADLINE: Duration = Duration::from_secs(30);
/// How long a daemon may take to exit after SIGTERM (grace is 5 s by default).
const EXIT_DEADLINE: Duration = Duration::from_secs(10);
/// Deadline of one RPC.
const RPC_DEADLINE: Duration = Duration::from_secs(5);

const BIN: &str = env!("CARGO_BIN_EXE_tessera");

/// A running daemon; killed (SIGKILL) when dropped unless it was terminated cleanly.
struct Daemon {
    child: Option<Child>,
    port: u16,
}

impl Daemon {
    /// Starts `tessera serve --config FILE --listen 127.0.0.1:0` and waits for its readiness
    /// line (`tessera: serving /job:J/replica:0/task:T on 127.0.0.1:PORT`).
    fn start(config: &Path, task_prefix: &str) -> Daemon {
        let mut child = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(config)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn tessera serve");
        let stdout = child.stdout.take().expect("piped stdout");
        // The guard exists before the first wait, so a timeout below still kills the child.
        let mut daemon = Daemon {
            child: Some(child),
            port: 0,
        };
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let line = match rx.recv_timeout(READY_DEADLINE) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = daemon.child.as_mut().map(|c| c.wait());
                panic!("{task_prefix} exited before its readiness line: {status:?}")
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("no readiness line from {task_prefix} within {READY_DEADLINE:?}")
            }
        };
        let expected = format!("tessera: serving {task_prefix} on 127.0.0.1:");
        let port = line
            .strip_prefix(&expected)
            .unwrap_or_else(|| panic!("readiness line `{line}` does not start with `{expected}`"));
        daemon.port = port
            .parse()
            .unwrap_or_else(|e| panic!("port in `{line}`: {e}"));
        assert_ne!(daemon.port, 0);
        daemon
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    async fn channel(&self) -> Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr()))
            .unwrap()
            .connect_timeout(RPC_DEADLINE)
            .timeout(RPC_DEADLINE)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.addr()))
    }

    /// Sends SIGTERM and returns the exit status, failing if it takes past the deadline.
    fn terminate(mut self) -> (ExitStatus, Duration) {
        let mut child = self.child.take().expect("daemon still owned");
        let pid = child.id() as libc::pid_t;
        let sent = Instant::now();
        // SAFETY: `pid` is our own child, not yet reaped (we still own its `Child`).
        assert_eq!(
            unsafe { libc::kill(pid, libc::SIGTERM) },
            0,
            "SIGTERM to {pid}"
        );
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        match rx.recv_timeout(EXIT_DEADLINE) {
            Ok(status) => (status.expect("wait for tessera"), sent.elapsed()),
            Err(_) => {
                // SAFETY: as above; the waiter thread reaps it once killed.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                panic!("daemon {pid} still running {EXIT_DEADLINE:?} after SIGTERM");
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Writes a two-task cluster (ps 0 and worker 0) and one file per task naming it.
/// Port 0 in the cluster: each task picks its own port (the daemons also get `--listen`).
fn write_cluster(dir: &Path) -> (PathBuf, PathBuf) {
    let cluster = "[cluster]\nps = [\"127.0.0.1:0\"]\nworker = [\"127.0.0.1:0\"]\n";
    let write = |job: &str| {
        let path = dir.join(format!("{job}0.toml"));
        // A CPU budget of 3 GiB, which `tessera status` must show.
        let text = format!(
            "{cluster}\n[task]\njob = \"{job}\"\nindex = 0\n[devices]\ncpu_memory_limit = 3221225472\n"
        );
        std::fs::write(&path, text).expect("write cluster file");
        path
    };
    (write("ps"), write("worker"))
}

/// Runs the CLI to completion with a deadline.
fn run_cli(args: &[&str], deadline: Duration) -> (Output, Duration) {
    let child = Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tessera");
    let pid = child.id() as libc::pid_t;
    let started = Instant::now();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(deadline) {
        Ok(output) => (output.expect("tessera output"), started.elapsed()),
        Err(_) => {
            // SAFETY: our own child, reaped by the waiter thread.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!(
                "`tessera {}` still running after {deadline:?}",
                args.join(" ")
            );
        }
    }
}

async fn get_status(daemon: &Daemon) -> Vec<DeviceAttributes> {
    WorkerServiceClient::new(daemon.channel().await)
        .get_status(GetStatusRequest {})
        .await
        .unwrap_or_else(|e| panic!("GetStatus on {}: {e}", daemon.addr()))
        .into_inner()
        .device_attributes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_serve_their_devices_and_stop_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let (ps_file, worker_file) = write_cluster(dir.path());
    let ps = Daemon::start(&ps_file, "/job:ps/replica:0/task:0");
    let worker = Daemon::start(&worker_file, "/job:worker/replica:0/task:0");
    assert_ne!(ps.port, worker.port);

    // GetStatus: each task's own CPU device, named after the task, with a live incarnation.
    let ps_devices = get_status(&ps).await;
    let worker_devices = get_status(&worker).await;
    assert_eq!(ps_devices[0].name, "/job:ps/replica:0/task:0/device:CPU:0");
    assert_eq!(ps_devices[0].device_type, "CPU");
    assert_eq!(
        ps_devices[0].memory_limit,
        3 << 30,
        "the device reports its budget, [devices] cpu_memory_limit"
    );
    assert_eq!(
        worker_devices[0].name,
        "/job:worker/replica:0/task:0/device:CPU:0"
    );
    assert_ne!(ps_devices[0].incarnation, 0);
    assert_ne!(worker_devices[0].incarnation, 0);
    assert_ne!(ps_devices[0].incarnation, worker_devices[0].incarnation);
    // Only GPUs may follow the CPU (a host with a driver); every device belongs to the task.
    for d in &ps_devices[1..] {
        assert_eq!(d.device_type, "GPU", "{d:?}");
    }
    assert!(ps_devices
        .iter()
        .all(|d| d.name.starts_with("/job:ps/replica:0/task:0/device:")));

    // ListDevices on the master: the same devices, as local ones; no remote ones yet.
    let listed = MasterServiceClient::new(ps.channel().await)
        .list_devices(ListDevicesRequest::default())
        .await
        .expect("ListDevices")
        .into_inner();
    assert_eq!(listed.local_device, ps_devices);
    assert!(listed.remote_device.is_empty());

    // Health: the server and both services are SERVING.
    let mut health = HealthClient::new(worker.channel().await);
    for service in ["", "tensorflow.MasterService", "tensorflow.WorkerService"] {
        let reply = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("health check of `{service}`: {e}"))
            .into_inner();
        assert_eq!(
            reply.status,
            ServingStatus::Serving as i32,
            "service `{service}`"
        );
    }

    // A step in a session the master does not have: ABORTED, as TensorFlow answers.
    let err = MasterServiceClient::new(worker.channel().await)
        .run_step(RunStepRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Aborted);
    assert!(err.message().contains("is not found"), "{}", err.message());
    // RunGraph is served: a graph handle the worker never gave out is ABORTED, as in
    // TensorFlow (the master re-registers after a worker restart).
    let err = WorkerServiceClient::new(ps.channel().await)
        .run_graph(RunGraphRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Aborted);
    assert!(
        err.message().contains("Graph handle is not found"),
        "{}",
        err.message()
    );

    // `tessera status` prints the same device and incarnation.
    let target = format!("grpc://{}", ps.addr());
    let (output, _) = run_cli(&["status", &target, "--timeout", "5s"], EXIT_DEADLINE);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "status failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let row = stdout
        .lines()
        .find(|l| l.starts_with("/job:ps/replica:0/task:0/device:CPU:0 "))
        .unwrap_or_else(|| panic!("no CPU:0 row in:\n{stdout}"));
    assert!(row.contains(" CPU "), "{row}");
    assert!(
        row.contains("3.0 GiB"),
        "the budget of [devices] cpu_memory_limit: {row}"
    );
    assert!(
        row.ends_with(&format!("{:#018x}", ps_devices[0].incarnation)),
        "{row}"
    );

    // SIGTERM: both exit 0, well within the deadline.
    let (status, took) = tokio::task::spawn_blocking(move || ps.terminate())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0), "ps exit status {status:?}");
    assert!(took < EXIT_DEADLINE, "ps took {took:?} to exit");
    let (status, _) = tokio::task::spawn_blocking(move || worker.terminate())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0), "worker exit status {status:?}");
}

#[test]
fn validate_accepts_a_good_file_and_refuses_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let (ps_file, _) = write_cluster(dir.path());
    let ps_path = ps_file.to_str().unwrap();
    let (output, _) = run_cli(&["validate", ps_path], EXIT_DEADLINE);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!("{ps_path}: ok (job ps task 0 of 2 tasks)\n")
    );

    // Task 3 of a one-task job: refused, exit 1, the error on stderr naming the file.
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[cluster]\nps = [\"127.0.0.1:0\"]\n\n[task]\njob = \"ps\"\nindex = 3\n",
    )
    .unwrap();
    let bad_path = bad.to_str().unwrap();
    let (output, _) = run_cli(&["validate", bad_path], EXIT_DEADLINE);
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("bad.toml"), "{stderr}");
}

#[test]
fn status_of_a_dead_task_names_it_and_fails_within_the_timeout() {
    // A port that was just released: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let target = format!("grpc://127.0.0.1:{port}");
    let (output, took) = run_cli(&["status", &target, "--timeout", "2s"], EXIT_DEADLINE);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&target), "{stderr}");
    // 2 s timeout, plus process start.
    assert!(took < Duration::from_secs(4), "took {took:?}");
}

#[test]
fn health_check_py_sees_serving() {
    let probe = Command::new("python3")
        .args(["-c", "import grpc, grpc_health"])
        .output();
    if !matches!(&probe, Ok(o) if o.status.success()) {
        requirement::missing(
            "health_check.py",
            "python3 cannot `import grpc, grpc_health`",
            "scripts/test installs them; or pip install grpcio grpcio-health-checking",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (ps_file, _) = write_cluster(dir.path());
    let ps = Daemon::start(&ps_file, "/job:ps/replica:0/task:0");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/health_check.py");
    let child = Command::new("python3")
        .args([script, &ps.port.to_string(), "--timeout", "5"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn python3");
    let pid = child.id() as libc::pid_t;
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let output = match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(output) => output.expect("health_check.py output"),
        Err(_) => {
            // SAFETY: our own child, reaped by the waiter thread.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("health_check.py still running after 30 s");
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "health_check.py failed:\n{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        stdout,
        "(server): SERVING\ntensorflow.MasterService: SERVING\ntensorflow.WorkerService: SERVING\n"
    );
    let (status, _) = ps.terminate();
    assert_eq!(status.code(), Some(0));
}
