//! The cluster token (`[auth] token_file`): every task sends it on every call, MasterService
//! and WorkerService refuse calls without it with UNAUTHENTICATED and log the caller's
//! address (never the token), and the health service stays open.
//!
//! - Raw tonic calls: no token, a wrong token, a non-bearer authorization → UNAUTHENTICATED;
//!   the right token → the answer; health without a token → SERVING.
//! - A 1 ps + 2 worker cluster with a token trains through a remote session carrying it, so
//!   the master's calls to the workers and ps and the workers' tensor pulls all carry it too.
//! - `tessera status --token-file` gets through; without it the task's refusal is printed.
//! - Token files are checked at load, and their errors name the file, never the token.

use std::io::Write;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::support::cluster::{InProcessCluster, BIN, TEST_TIMEOUTS};
use crate::support::training;
use tessera::client::{ConnectOptions, Session};
use tessera::cluster::TaskConfig;
use tessera::proto::master_service_client::MasterServiceClient;
use tessera::proto::worker_service_client::WorkerServiceClient;
use tessera::proto::{GetStatusRequest, ListDevicesRequest};
use tessera::security::ClusterToken;
use tessera::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const TOKEN: &str = "d41d8cd98f00b204e9800998ecf8427e";
const WRONG: &str = "d41d8cd98f00b204e9800998ecf8427f";

/// A token file and the `[auth]` section naming it.
struct TokenFile {
    dir: tempfile::TempDir,
}

impl TokenFile {
    fn new(token: &str) -> TokenFile {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), format!("{token}\n")).unwrap();
        TokenFile { dir }
    }

    fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("token")
    }

    fn section(&self) -> String {
        format!("\n[auth]\ntoken_file = \"{}\"\n", self.path().display())
    }
}

fn start(jobs: &[(&str, usize)], token: &TokenFile) -> InProcessCluster {
    InProcessCluster::start_with(jobs, &format!("{TEST_TIMEOUTS}{}", token.section()))
}

async fn channel(addr: SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap()
}

fn with_authorization<T>(message: T, value: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(value) = value {
        request
            .metadata_mut()
            .insert("authorization", value.parse().unwrap());
    }
    request
}

/// Every log line of this test process, for the tests that read what was logged.
fn captured_logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&logs);
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || LogWriter(Arc::clone(&sink)))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        logs
    })
    .clone()
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn calls_without_the_right_token_are_unauthenticated_and_health_stays_open() {
    let logs = captured_logs();
    let token = TokenFile::new(TOKEN);
    let cluster = start(&[("ps", 1)], &token);
    let addr = cluster.addr("ps", 0);
    let channel = channel(addr).await;
    let mut master = MasterServiceClient::new(channel.clone());
    let mut worker = WorkerServiceClient::new(channel.clone());

    let bearer = |t: &str| format!("Bearer {t}");
    let refused = [
        (None, "carried no cluster token"),
        (Some(bearer(WRONG)), "carried a wrong cluster token"),
        (Some(bearer("")), "carried a wrong cluster token"),
        (
            Some(format!("Basic {TOKEN}")),
            "carried an authorization that is not a bearer token",
        ),
    ];
    for (value, why) in &refused {
        let err = master
            .list_devices(with_authorization(
                ListDevicesRequest::default(),
                value.as_deref(),
            ))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{value:?}: {err}");
        assert!(err.message().starts_with("MasterService requires"), "{err}");
        assert!(err.message().contains(why), "{value:?}: {err}");
        let err = worker
            .get_status(with_authorization(GetStatusRequest {}, value.as_deref()))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{value:?}: {err}");
        assert!(err.message().starts_with("WorkerService requires"), "{err}");
    }

    // The right token gets the answers.
    let right = bearer(TOKEN);
    let devices = worker
        .get_status(with_authorization(GetStatusRequest {}, Some(&right)))
        .await
        .unwrap()
        .into_inner()
        .device_attributes;
    assert_eq!(devices[0].name, "/job:ps/replica:0/task:0/device:CPU:0");
    let listed = master
        .list_devices(with_authorization(
            ListDevicesRequest::default(),
            Some(&right),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.local_device, devices);

    // Health needs no token.
    let mut health = HealthClient::new(channel);
    for service in ["", "tensorflow.MasterService", "tensorflow.WorkerService"] {
        let reply = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("health check of `{service}`: {e}"))
            .into_inner();
        assert_eq!(reply.status, ServingStatus::Serving as i32, "`{service}`");
    }

    // Each refusal was logged with the caller's address; no token ever was.
    let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    let refusals: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("refused an unauthenticated call"))
        .collect();
    // Two services × four refusals here (other tests in the same process may add theirs).
    assert!(refusals.len() >= 2 * refused.len(), "{text}");
    for line in &refusals {
        assert!(line.contains("peer=127.0.0.1:"), "{line}");
    }
    for reason in [
        "no token",
        "wrong token",
        "authorization is not a bearer token",
    ] {
        assert!(text.contains(&format!("reason=\"{reason}\"")), "{text}");
    }
    assert!(!text.contains(TOKEN) && !text.contains(WRONG), "{text}");
}

#[test]
fn a_cluster_with_a_token_trains_when_every_task_and_the_client_send_it() {
    let token = TokenFile::new(TOKEN);
    let cluster = start(&[("ps", 1), ("worker", 2)], &token);
    let target = cluster.target("worker", 0);

    // Without the token, the first call is refused.
    let options = |token: Option<ClusterToken>| ConnectOptions {
        connect_timeout: Duration::from_secs(10),
        call_timeout: Duration::from_secs(60),
        token,
        ..Default::default()
    };
    let job = training::job(2).unwrap();
    let sess = Session::connect_with(&target, options(None)).unwrap();
    let err = sess.extend(&job.graph.to_graph_def()).unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err}");
    let wrong = ClusterToken::new(WRONG).unwrap();
    let sess = Session::connect_with(&target, options(Some(wrong))).unwrap();
    let err = sess.extend(&job.graph.to_graph_def()).unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err}");

    // With it, the master reaches both workers and the ps, which pull tensors from each
    // other: each of those calls is refused unless the task sends the token too.
    let right = ClusterToken::from_file(token.path()).unwrap();
    let sess = Session::connect_with(&target, options(Some(right))).unwrap();
    let seen = training::run_two_steps(&sess, &job).unwrap();
    assert_eq!(seen, training::expected_two_steps());
    sess.close().unwrap();
}

#[test]
fn tessera_status_sends_the_token_file_it_is_given() {
    let token = TokenFile::new(TOKEN);
    let cluster = start(&[("ps", 1)], &token);
    let target = cluster.target("ps", 0);
    let status = |extra: &[&std::ffi::OsStr]| {
        Command::new(BIN)
            .args(["status", &target, "--timeout", "20s"])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = status(&["--token-file".as_ref(), token.path().as_os_str()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("/job:ps/replica:0/task:0/device:CPU:0"),
        "{stdout}"
    );

    let out = status(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("UNAUTHENTICATED"), "{stderr}");
    assert!(stderr.contains("carried no cluster token"), "{stderr}");
}

/// Loads a one-task cluster file with `auth` as its `[auth]` section and `env` overrides.
fn load(auth: &str, env: &[(&str, &str)]) -> Result<TaskConfig, String> {
    let text = format!(
        "[cluster]\nps = [\"127.0.0.1:0\"]\n[task]\njob = \"ps\"\nindex = 0\n[auth]\n{auth}"
    );
    let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    TaskConfig::from_toml_with_env(&text, "cluster.toml", env).map_err(|e| e.to_string())
}

#[test]
fn token_files_are_checked_at_load_and_never_echoed() {
    let good = TokenFile::new(TOKEN);
    let config = load(&format!("token_file = \"{}\"", good.path().display()), &[]).unwrap();
    let token = config.security.token.as_ref().unwrap();
    assert!(token.matches(TOKEN.as_bytes()));
    // Neither the config's nor the token's Debug shows it.
    assert!(!format!("{config:?}").contains(TOKEN));

    let short = TokenFile::new("hunter2");
    let err = load(&format!("token_file = \"{}\"", short.path().display()), &[]).unwrap_err();
    assert_eq!(
        err,
        format!(
            "cluster.toml: auth.token_file: {}: token has 7 characters, fewer than 16; use a \
             random token such as the output of `openssl rand -hex 32`",
            short.path().display()
        )
    );
    assert!(!err.contains("hunter2"), "{err}");

    // An override names its variable.
    let err = load("", &[("TESSERA__AUTH__TOKEN_FILE", "/nonexistent/token")]).unwrap_err();
    assert!(
        err.starts_with(
            "environment variable TESSERA__AUTH__TOKEN_FILE: auth.token_file: \
             /nonexistent/token: cannot read the token file"
        ),
        "{err}"
    );

    // The bad file kept in tests/data.
    let path = std::path::Path::new("tests/data/bad_auth_missing_token.toml");
    let err = TaskConfig::from_file_with_env(path, Vec::new()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tests/data/bad_auth_missing_token.toml: auth.token_file: tests/data/absent/token: \
         cannot read the token file: No such file or directory (os error 2); check the path \
         and its permissions"
    );
}
