//! TLS and mutual TLS between tasks and clients, with certificates made at test time.
//!
//! - A cluster of `tessera serve` processes (1 ps, 2 workers) with `[tls]` trains over mTLS:
//!   the client, the master and the workers reach each other only through TLS, and the
//!   variable on the ps moves as worked out by hand (`support::training`).
//! - A client or peer whose certificate another CA signed is refused, as is one with no
//!   certificate, and a client that trusts another CA refuses the task.
//! - A plain-text client to a TLS task fails with an error that says to use TLS.
//! - `require_client_cert = false` serves TLS to clients without a certificate.
//! - The cluster file's `[tls]` files are checked at load: a missing or wrong file is named
//!   with its key.

use std::process::Command;
use std::time::Duration;

use crate::support::certs::Pki;
use crate::support::cluster::{Cluster, InProcessCluster, BIN, TEST_TIMEOUTS};
use crate::support::training;
use tessera::client::{ConnectOptions, Session};
use tessera::cluster::{TaskConfig, TaskId};
use tessera::peer::{CallOptions, GrpcPeer, Peer};
use tessera::proto::GetStatusRequest;
use tessera::security::{Security, TlsConfig};
use tessera::Code;

fn options(tls: TlsConfig) -> ConnectOptions {
    ConnectOptions {
        connect_timeout: Duration::from_secs(10),
        call_timeout: Duration::from_secs(60),
        tls: Some(tls),
        ..Default::default()
    }
}

/// `grpcs://127.0.0.1:PORT` of a task.
fn tls_target(addr: std::net::SocketAddr) -> String {
    format!("grpcs://{addr}")
}

#[test]
fn an_mtls_cluster_of_daemons_trains_a_ps_variable_from_two_workers() {
    let pki = Pki::new("cluster");
    let task = pki.leaf("task");
    let cluster = Cluster::start_with(
        &[("ps", 1), ("worker", 2)],
        &format!("{TEST_TIMEOUTS}{}", pki.tls_section(&task)),
    );
    let client = pki.leaf("client");
    let target = tls_target(cluster.addr("worker", 0));
    let sess = Session::connect_with(&target, options(pki.client(Some(&client)))).unwrap();
    let job = training::job(2).unwrap();
    let seen = training::run_two_steps(&sess, &job).unwrap();
    assert_eq!(seen, training::expected_two_steps());
    sess.close().unwrap();

    // `tessera status` speaks the same TLS.
    let out = Command::new(BIN)
        .args([
            "status",
            &tls_target(cluster.addr("ps", 0)),
            "--timeout",
            "20s",
        ])
        .arg("--ca")
        .arg(&pki.ca)
        .arg("--cert")
        .arg(&client.cert)
        .arg("--key")
        .arg(&client.key)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("/job:ps/replica:0/task:0/device:CPU:0"),
        "{stdout}"
    );
}

/// One in-process ps serving mTLS with a certificate from `pki`.
fn mtls_ps(pki: &Pki) -> InProcessCluster {
    let leaf = pki.leaf("ps");
    InProcessCluster::start_with(
        &[("ps", 1)],
        &format!("{TEST_TIMEOUTS}{}", pki.tls_section(&leaf)),
    )
}

#[test]
fn clients_without_a_certificate_the_ca_signed_are_refused() {
    let pki = Pki::new("cluster");
    let ps = mtls_ps(&pki);
    let target = tls_target(ps.addr("ps", 0));

    // Trusts the cluster's CA, but shows a certificate from another CA.
    let other = Pki::new("other");
    let stranger = other.leaf("stranger");
    let tls = pki
        .client(None)
        .with_identity(&stranger.cert, &stranger.key)
        .unwrap();
    let err = connect_and_list(&target, tls).unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");

    // Shows no certificate at all.
    let err = connect_and_list(&target, pki.client(None)).unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");

    // Trusts another CA: the client refuses the task's certificate, and says so.
    let err = connect_and_list(&target, other.client(Some(&stranger))).unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.message().contains("certificate"), "{err}");

    // The right certificate works.
    let member = pki.leaf("member");
    let devices = connect_and_list(&target, pki.client(Some(&member))).unwrap();
    assert_eq!(devices, ["/job:ps/replica:0/task:0/device:CPU:0"]);
}

/// Connects a remote session and lists the master's devices.
fn connect_and_list(target: &str, tls: TlsConfig) -> tessera::Result<Vec<String>> {
    let sess = Session::connect_with(target, options(tls))?;
    let devices = sess.as_remote().unwrap().list_devices()?;
    Ok(devices.into_iter().map(|d| d.name).collect())
}

#[test]
fn a_peer_with_a_certificate_from_another_ca_is_refused() {
    let pki = Pki::new("cluster");
    let ps = mtls_ps(&pki);
    let addr = ps.addr("ps", 0).to_string();
    let other = Pki::new("other");
    let stranger = other.leaf("stranger");
    let member = pki.leaf("member");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let get_status = |tls: TlsConfig| {
        runtime.block_on(async {
            let security = Security {
                tls: Some(tls),
                token: None,
            };
            let peer = GrpcPeer::connect_lazy_with(
                TaskId::new("ps", 0),
                &addr,
                Duration::from_secs(5),
                &security,
            )
            .unwrap();
            peer.get_status(
                GetStatusRequest {},
                CallOptions::timeout(Duration::from_secs(10)),
            )
            .await
        })
    };
    // A peer trusting the cluster's CA but holding another CA's certificate.
    let tls = pki
        .client(None)
        .with_identity(&stranger.cert, &stranger.key)
        .unwrap();
    let err = get_status(tls).unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.message().contains("/job:ps/replica:0/task:0"), "{err}");
    // A peer of the cluster gets its answer over the same path.
    let reply = get_status(pki.client(Some(&member))).unwrap();
    assert_eq!(
        reply.device_attributes[0].name,
        "/job:ps/replica:0/task:0/device:CPU:0"
    );
}

#[test]
fn a_plain_text_client_to_a_tls_task_fails_saying_to_use_tls() {
    let pki = Pki::new("cluster");
    let ps = mtls_ps(&pki);
    let addr = ps.addr("ps", 0);
    let plain = ConnectOptions {
        connect_timeout: Duration::from_secs(5),
        call_timeout: Duration::from_secs(10),
        ..Default::default()
    };
    let err = Session::connect_with(&format!("grpc://{addr}"), plain)
        .and_then(|s| s.as_remote().unwrap().list_devices().map(|_| ()))
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.message().contains("if the task serves TLS"), "{err}");

    // A grpcs:// target without the CA is refused before any connection.
    let err = Session::connect(&format!("grpcs://{addr}")).err().unwrap();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("ConnectOptions::tls"), "{err}");

    // `tessera status` in plain text says the same.
    let out = Command::new(BIN)
        .args(["status", &format!("grpc://{addr}"), "--timeout", "10s"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("if the task serves TLS"), "{stderr}");
}

#[test]
fn server_only_tls_serves_clients_without_a_certificate() {
    let pki = Pki::new("cluster");
    let leaf = pki.leaf("ps");
    let ps = InProcessCluster::start_with(
        &[("ps", 1)],
        &format!(
            "{TEST_TIMEOUTS}{}require_client_cert = false\n",
            pki.tls_section(&leaf)
        ),
    );
    let target = tls_target(ps.addr("ps", 0));
    let devices = connect_and_list(&target, pki.client(None)).unwrap();
    assert_eq!(devices, ["/job:ps/replica:0/task:0/device:CPU:0"]);
    // The server's own target says TLS.
    assert!(ps.servers[0].target().starts_with("grpcs://localhost:"));
}

/// Loads a one-task cluster file with `tls` as its `[tls]` section.
fn load(tls: &str) -> Result<TaskConfig, String> {
    let text =
        format!("[cluster]\nps = [\"127.0.0.1:0\"]\n[task]\njob = \"ps\"\nindex = 0\n[tls]\n{tls}");
    TaskConfig::from_toml_with_env(&text, "cluster.toml", Vec::new()).map_err(|e| e.to_string())
}

#[test]
fn config_errors_name_the_key_and_the_file() {
    let pki = Pki::new("cluster");
    let leaf = pki.leaf("ps");
    let other = pki.leaf("other");
    let missing = pki.dir().join("absent.pem");
    let files = |cert: &std::path::Path, key: &std::path::Path, ca: &std::path::Path| {
        format!(
            "cert = \"{}\"\nkey = \"{}\"\nca = \"{}\"\n",
            cert.display(),
            key.display(),
            ca.display()
        )
    };

    let good = load(&files(&leaf.cert, &leaf.key, &pki.ca)).unwrap();
    let tls = good.security.tls.as_ref().unwrap();
    assert!(tls.requires_client_cert() && tls.has_identity());

    for (text, key, expected) in [
        (
            files(&missing, &leaf.key, &pki.ca),
            "tls.cert",
            "cannot read the certificate file",
        ),
        (
            files(&leaf.cert, &missing, &pki.ca),
            "tls.key",
            "cannot read the private key file",
        ),
        (
            files(&leaf.cert, &leaf.key, &missing),
            "tls.ca",
            "cannot read the CA certificate file",
        ),
    ] {
        let err = load(&text).unwrap_err();
        let prefix = format!("cluster.toml: {key}: {}: {expected}", missing.display());
        assert!(err.starts_with(&prefix), "{err}\nexpected: {prefix}");
    }

    // A key that belongs to another certificate.
    let err = load(&files(&leaf.cert, &other.key, &pki.ca)).unwrap_err();
    let prefix = format!(
        "cluster.toml: tls.key: {}: does not go with",
        other.key.display()
    );
    assert!(err.starts_with(&prefix), "{err}");
    // A key where the certificate should be.
    let err = load(&files(&leaf.key, &leaf.key, &pki.ca)).unwrap_err();
    assert!(
        err.starts_with(&format!(
            "cluster.toml: tls.cert: {}: holds no certificate",
            leaf.key.display()
        )),
        "{err}"
    );
    // A certificate where the key should be.
    let err = load(&files(&leaf.cert, &leaf.cert, &pki.ca)).unwrap_err();
    assert!(
        err.starts_with(&format!(
            "cluster.toml: tls.key: {}: holds no private key",
            leaf.cert.display()
        )),
        "{err}"
    );
    // [tls] without its CA.
    let text = format!(
        "cert = \"{}\"\nkey = \"{}\"\n",
        leaf.cert.display(),
        leaf.key.display()
    );
    let err = load(&text).unwrap_err();
    assert!(err.starts_with("cluster.toml: tls.ca: missing;"), "{err}");
    // One file for every host, each host naming its own certificate in the environment.
    let text = format!(
        "[cluster]\nps = [\"127.0.0.1:0\"]\n[task]\njob = \"ps\"\nindex = 0\n[tls]\nca = \"{}\"\n",
        pki.ca.display()
    );
    let env = [
        ("TESSERA__TLS__CERT", leaf.cert.display().to_string()),
        ("TESSERA__TLS__KEY", leaf.key.display().to_string()),
        ("TESSERA__TLS__REQUIRE_CLIENT_CERT", "false".to_string()),
    ]
    .map(|(k, v)| (k.to_string(), v));
    let config = TaskConfig::from_toml_with_env(&text, "cluster.toml", env).unwrap();
    let tls = config.security.tls.as_ref().unwrap();
    assert!(tls.has_identity() && !tls.requires_client_cert());
    let env = [(
        "TESSERA__TLS__KEY".to_string(),
        missing.display().to_string(),
    )];
    let text = format!("{text}cert = \"{}\"\n", leaf.cert.display());
    let err = TaskConfig::from_toml_with_env(&text, "cluster.toml", env)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!(
            "environment variable TESSERA__TLS__KEY: tls.key: {}: cannot read",
            missing.display()
        )),
        "{err}"
    );

    // A typo among the keys.
    let err = load("certificate = \"x\"\n").unwrap_err();
    assert!(err.contains("tls.certificate: unknown key"), "{err}");

    // `tessera validate` prints the same.
    let path = pki.dir().join("cluster.toml");
    std::fs::write(
        &path,
        format!(
            "[cluster]\nps = [\"127.0.0.1:0\"]\n[task]\njob = \"ps\"\nindex = 0\n[tls]\n{}",
            files(&missing, &leaf.key, &pki.ca)
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("validate")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("tls.cert: {}", missing.display())),
        "{stderr}"
    );
}

#[test]
fn bad_tls_files_in_tests_data_give_their_messages() {
    for (file, message) in [
        (
            "bad_tls_no_ca.toml",
            "tls.ca: missing; a task with [tls] serves TLS and dials its peers with it, so it \
             needs its certificate, its key and the cluster's CA: set tls.ca (with tls.cert, \
             tls.key and tls.ca), or remove [tls] for plain text",
        ),
        (
            "bad_tls_missing_cert.toml",
            "tls.cert: tests/data/absent/w0.pem: cannot read the certificate file: No such file \
             or directory (os error 2); check the path and its permissions",
        ),
    ] {
        let path = std::path::Path::new("tests/data").join(file);
        let err = TaskConfig::from_file_with_env(&path, Vec::new()).unwrap_err();
        assert_eq!(err.to_string(), format!("tests/data/{file}: {message}"));
        assert_eq!(err.code(), Code::InvalidArgument, "{file}");
    }
}

#[test]
fn a_task_without_a_certificate_of_its_own_refuses_to_start() {
    let pki = Pki::new("cluster");
    let mut config = TaskConfig::local();
    // Only the CA: enough to dial, not to serve.
    config.security = Security {
        tls: Some(pki.client(None)),
        token: None,
    };
    let err = tessera::server::Server::start(config).err().unwrap();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(
        err.message().contains(&pki.ca.display().to_string()),
        "{err}"
    );
    assert!(err.message().contains("set tls.cert and tls.key"), "{err}");
}
