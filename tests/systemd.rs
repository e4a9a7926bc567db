//! `tessera serve` under a fake systemd: a unix datagram socket bound in a temp dir stands for
//! `NOTIFY_SOCKET`, and the test reads what the daemon tells it — `READY=1` once the gRPC port
//! accepts connections, `WATCHDOG=1` every half `WATCHDOG_USEC`, `STOPPING=1` on SIGTERM —
//! and, with `JOURNAL_STREAM` naming its stderr, log lines without colours or timestamps.
//!
//! Every wait has a deadline; a daemon left running by a failed assertion is killed by its
//! guard.

use std::fs::File;
use std::io::{BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use tessera::ops::systemd::socket_activated;

const BIN: &str = env!("CARGO_BIN_EXE_tessera");
/// How long a cold debug daemon may take to become ready on a busy machine.
const READY_DEADLINE: Duration = Duration::from_secs(30);
/// How long to wait for any later notification or for the exit after SIGTERM.
const DEADLINE: Duration = Duration::from_secs(10);

/// A daemon killed when dropped, unless it already exited.
struct Daemon {
    child: Option<Child>,
}

impl Daemon {
    fn pid(&self) -> libc::pid_t {
        self.child.as_ref().expect("running").id() as libc::pid_t
    }

    fn terminate(&mut self) {
        // SAFETY: our own child, not yet reaped (we still own its `Child`).
        assert_eq!(unsafe { libc::kill(self.pid(), libc::SIGTERM) }, 0);
    }

    /// Waits for the exit, failing past the deadline.
    fn wait(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let pid = child.id() as libc::pid_t;
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        match rx.recv_timeout(DEADLINE) {
            Ok(status) => status.expect("wait for tessera"),
            Err(_) => {
                // SAFETY: as above; the waiter thread reaps it.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                panic!("daemon {pid} still running {DEADLINE:?} after SIGTERM");
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

/// The fake systemd: the notification socket and what arrived on it.
struct Systemd {
    socket: UnixDatagram,
    path: PathBuf,
    received: Vec<String>,
}

impl Systemd {
    fn bind(dir: &Path) -> Self {
        let path = dir.join("notify");
        let socket = UnixDatagram::bind(&path).unwrap();
        Self {
            socket,
            path,
            received: Vec::new(),
        }
    }

    /// Receives datagrams until one contains `wanted`, within `deadline`; returns it.
    fn wait_for(&mut self, wanted: &str, deadline: Duration) -> String {
        let until = Instant::now() + deadline;
        let mut buf = vec![0u8; 4096];
        loop {
            let left = until.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "no `{wanted}` within {deadline:?}; received {:?}",
                self.received
            );
            self.socket.set_read_timeout(Some(left)).unwrap();
            let n = match self.socket.recv(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
                Err(e) => panic!("recv on the notify socket: {e}"),
            };
            let message = String::from_utf8_lossy(&buf[..n]).into_owned();
            self.received.push(message.clone());
            if message
                .lines()
                .any(|l| l == wanted || l.starts_with(wanted))
            {
                return message;
            }
        }
    }
}

fn write_config(dir: &Path) -> PathBuf {
    let path = dir.join("worker0.toml");
    std::fs::write(
        &path,
        "[cluster]\nworker = [\"127.0.0.1:0\"]\n\n[task]\njob = \"worker\"\nindex = 0\n",
    )
    .unwrap();
    path
}

fn serve(config: &Path, systemd: &Systemd) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--config"])
        .arg(config)
        .args(["--listen", "127.0.0.1:0"])
        .env("NOTIFY_SOCKET", &systemd.path)
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    command
}

/// The port in `STATUS=serving /job:worker/replica:0/task:0 on 127.0.0.1:PORT`.
fn serving_port(ready: &str) -> u16 {
    let status = ready
        .lines()
        .find_map(|l| l.strip_prefix("STATUS=serving /job:worker/replica:0/task:0 on 127.0.0.1:"))
        .unwrap_or_else(|| panic!("no serving STATUS in {ready:?}"));
    status.parse().unwrap()
}

#[test]
fn ready_once_serving_watchdog_pings_and_stopping_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let mut systemd = Systemd::bind(dir.path());
    let child = serve(&config, &systemd)
        .env("RUST_LOG", "warn")
        // 200 ms: a ping every 100 ms.
        .env("WATCHDOG_USEC", "200000")
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut daemon = Daemon { child: Some(child) };

    let ready = systemd.wait_for("READY=1", READY_DEADLINE);
    // READY=1 comes once the port is bound: it accepts a connection right away.
    let port = serving_port(&ready);
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), DEADLINE)
        .expect("the port accepts connections once READY=1 is sent");
    // Nothing but a STATUS came before.
    assert!(
        systemd.received[0].starts_with("STATUS=starting /job:worker/replica:0/task:0"),
        "{:?}",
        systemd.received
    );

    // The watchdog is kept alive while the daemon serves.
    for _ in 0..3 {
        systemd.wait_for("WATCHDOG=1", DEADLINE);
    }

    daemon.terminate();
    let stopping = systemd.wait_for("STOPPING=1", DEADLINE);
    assert!(stopping.contains("STATUS=stopping (sigterm)"), "{stopping}");
    let status = daemon.wait();
    assert!(status.success(), "{status:?}");
}

/// A pipe whose write end becomes the daemon's stderr; returns (read end, write end,
/// `JOURNAL_STREAM` naming the pipe).
fn journal_pipe() -> (File, OwnedFd, String) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe() writes.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: pipe() just opened both; each gets exactly one owner.
    let (read, write) = unsafe { (File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let meta = read.metadata().unwrap();
    let stream = format!("{}:{}", meta.dev(), meta.ino());
    (read, write, stream)
}

#[test]
fn journal_logs_have_no_colours_or_timestamps_and_no_watchdog_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let mut systemd = Systemd::bind(dir.path());
    let (stderr, stderr_write, stream) = journal_pipe();
    let child = serve(&config, &systemd)
        .env("RUST_LOG", "info")
        .env("JOURNAL_STREAM", &stream)
        .stderr(Stdio::from(stderr_write))
        .spawn()
        .unwrap();
    let mut daemon = Daemon { child: Some(child) };
    let logs = thread::spawn(move || {
        let mut text = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut text);
        text
    });

    systemd.wait_for("READY=1", READY_DEADLINE);
    daemon.terminate();
    systemd.wait_for("STOPPING=1", DEADLINE);
    assert!(daemon.wait().success());
    // No WATCHDOG_USEC: no pings.
    assert!(
        !systemd.received.iter().any(|m| m.contains("WATCHDOG=1")),
        "{:?}",
        systemd.received
    );

    // The pipe closes when the daemon exits, so the reader ends.
    let text = logs.join().unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.iter().any(|l| l.contains("serving")),
        "no `serving` log line in:\n{text}"
    );
    for line in &lines {
        assert!(!line.contains('\u{1b}'), "ANSI colour in `{line}`");
        // Each line starts with its level: journald adds the time itself.
        let first = line.split_whitespace().next().unwrap_or_default();
        assert!(
            ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&first),
            "line does not start with its level: `{line}`"
        );
    }
}

#[test]
fn a_socket_activated_daemon_is_ready_on_the_socket_it_was_given() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let mut systemd = Systemd::bind(dir.path());
    // systemd's part of tessera@.socket: bind the port, pass it as fd 3 with LISTEN_FDS=1 and
    // LISTEN_PID naming the daemon (`$$` of the shell that execs it).
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut command = socket_activated(Path::new(BIN), &listener);
    command
        .args(["serve", "--config"])
        .arg(&config)
        .env("NOTIFY_SOCKET", &systemd.path)
        .env("RUST_LOG", "warn")
        .env_remove("WATCHDOG_USEC")
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let mut daemon = Daemon {
        child: Some(command.spawn().unwrap()),
    };
    // The daemon owns the socket now; the test's copy must not keep the port open.
    drop(listener);

    let ready = systemd.wait_for("READY=1", READY_DEADLINE);
    assert_eq!(serving_port(&ready), port, "{ready}");
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), DEADLINE)
        .expect("the passed socket accepts connections once READY=1 is sent");
    daemon.terminate();
    systemd.wait_for("STOPPING=1", DEADLINE);
    assert!(daemon.wait().success());
}
