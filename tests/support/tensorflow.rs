//! Stock TensorFlow's side of the live interoperability tests: finding a Python that has
//! TensorFlow, its gRPC server as a cluster task, and its scripts' clients, read line by line
//! with deadlines.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use super::cluster::wait_with_deadline;
use super::requirement;

/// Importing TensorFlow takes seconds; a cold one on a busy two-core machine, more.
pub const SERVE_DEADLINE: Duration = Duration::from_secs(120);
/// How long the probe may take to import TensorFlow: `$TESSERA_IMPORT_DEADLINE` seconds
/// (scripts/test's too), else [`SERVE_DEADLINE`].
pub fn import_deadline() -> Duration {
    let secs = std::env::var("TESSERA_IMPORT_DEADLINE").ok();
    let secs = secs.and_then(|s| s.trim().parse::<u64>().ok());
    secs.map_or(SERVE_DEADLINE, Duration::from_secs)
}
/// Importing TensorFlow and training a few hundred steps.
pub const TRAIN_DEADLINE: Duration = Duration::from_secs(300);

/// The Python that has TensorFlow, or `None` (said) when there is none; under CI a missing
/// TensorFlow fails the test ([`requirement::missing`]).
pub fn tensorflow_python(test: &str) -> Option<String> {
    python_with(test, &["tensorflow"])
}

/// The Python that can import every one of `modules` (TensorFlow and what a script needs
/// besides), or `None` (said) when there is none. The import must finish within
/// [`import_deadline`]; one that does not is killed and counts as missing (under CI, a
/// failure).
pub fn python_with(test: &str, modules: &[&str]) -> Option<String> {
    let imports = format!("import {}", modules.join(", "));
    let python = std::env::var("TESSERA_TF_PYTHON").unwrap_or_else(|_| "python3".into());
    let child = Command::new(&python)
        .args(["-c", &imports])
        .env("TF_CPP_MIN_LOG_LEVEL", "3")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    let why = match child {
        Err(e) => format!("cannot run `{python}` ({e})"),
        Ok(child) => {
            let pid = child.id() as libc::pid_t;
            let (tx, rx) = mpsc::channel();
            thread::spawn(move || {
                let _ = tx.send(child.wait_with_output());
            });
            let deadline = import_deadline();
            match rx.recv_timeout(deadline) {
                Ok(Ok(out)) if out.status.success() => return Some(python),
                Ok(Ok(out)) => {
                    let stderr = String::from_utf8_lossy(&out.stderr);
                    let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
                    let last = last.unwrap_or("no message").trim();
                    format!("`{python}` cannot `{imports}` ({}: {last})", out.status)
                }
                Ok(Err(e)) => format!("waiting for `{python}` failed ({e})"),
                Err(_) => {
                    // SAFETY: our own child, not yet reaped (the waiter would have answered).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    format!("`{python} -c '{imports}'` did not finish within {deadline:?}")
                }
            }
        }
    };
    let packages = modules
        .iter()
        .map(|m| match *m {
            "tensorflow" => "tensorflow-cpu",
            "tf_keras" => "tf-keras",
            "sklearn" => "scikit-learn",
            other => other,
        })
        .collect::<Vec<_>>()
        .join(" ");
    let how = format!(
        "scripts/test installs it in target/tf-venv; or pip install {packages} and set \
         TESSERA_TF_PYTHON to that python"
    );
    requirement::missing(test, &why, &how);
    None
}

/// The JSON line `script` prints last, run by a Python that has `modules`; `None` where there
/// is none (see [`python_with`]: the test then passes saying why, except under CI).
pub fn script_json(test: &str, script: &str, modules: &[&str]) -> Option<serde_json::Value> {
    let python = python_with(test, modules)?;
    let mut command = Command::new(python);
    command.arg(script);
    Some(Client::spawn(command).finish_quietly().json)
}

/// A TensorFlow server process, killed when dropped.
pub struct TfServer {
    _client: Client,
    /// Held open: the script serves until its stdin closes.
    _stdin: ChildStdin,
    pub addr: SocketAddr,
}

impl TfServer {
    /// Runs `script` with `args` (a `server ...` command that prints
    /// `tensorflow: serving grpc://HOST:PORT` and serves until its stdin closes); returns once
    /// it says where it serves.
    pub fn start(python: &str, script: &str, args: &[&str]) -> TfServer {
        let mut command = Command::new(python);
        command.arg(script).args(args);
        command.stdin(Stdio::piped());
        let mut client = Client::spawn(command);
        let stdin = client.child.as_mut().and_then(|c| c.stdin.take());
        let stdin = stdin.expect("piped stdin");
        let line = client.next_line(SERVE_DEADLINE);
        let line = line.unwrap_or_else(|| panic!("TensorFlow's server {args:?} ended at once"));
        let target = line
            .strip_prefix("tensorflow: serving grpc://")
            .unwrap_or_else(|| panic!("TensorFlow's server {args:?} said: {line}"));
        let port = target
            .rsplit(':')
            .next()
            .and_then(|p| p.parse::<u16>().ok());
        let addr = SocketAddr::from(([127, 0, 0, 1], port.expect("a port")));
        TfServer {
            _client: client,
            _stdin: stdin,
            addr,
        }
    }
}

/// What a TensorFlow script reports: its last line, JSON.
pub struct Trained {
    pub json: serde_json::Value,
}

impl Trained {
    pub fn f64(&self, key: &str) -> f64 {
        self.json[key]
            .as_f64()
            .unwrap_or_else(|| panic!("no {key} in {}", self.json))
    }

    pub fn strings(&self, key: &str) -> Vec<String> {
        let values = self.json[key].as_array();
        let values = values.unwrap_or_else(|| panic!("no {key} in {}", self.json));
        values
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    }
}

/// A running script, its stdout read line by line; killed if dropped before it ends.
pub struct Client {
    /// The process, until [`Client::finish`] reaps it.
    pub child: Option<Child>,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Client {
    /// Spawns `command` with its stdout piped to us and its stderr to the test's.
    pub fn spawn(mut command: Command) -> Client {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the TensorFlow script");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        Client {
            child: Some(child),
            lines,
            seen: Vec::new(),
        }
    }

    /// The next line the script prints, within `deadline`; `None` once its stdout closed.
    pub fn next_line(&mut self, deadline: Duration) -> Option<String> {
        match self.lines.recv_timeout(deadline) {
            Ok(line) => {
                self.seen.push(line.clone());
                Some(line)
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => None,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                "the TensorFlow script printed nothing within {deadline:?} (so far: {:?})",
                self.seen
            ),
        }
    }

    /// Waits for the line `want`.
    pub fn wait_for(&mut self, want: &str) {
        while let Some(line) = self.next_line(TRAIN_DEADLINE) {
            if line == want {
                return;
            }
        }
        panic!(
            "the TensorFlow script ended without printing `{want}`: {:?}",
            self.seen
        );
    }

    /// Reads to the end; the script must exit 0 with a JSON line last, which is printed.
    pub fn finish(self) -> Trained {
        let trained = self.finish_quietly();
        eprintln!("trained: {}", trained.json);
        trained
    }

    /// [`Client::finish`] without printing the JSON (for scripts that print many numbers).
    pub fn finish_quietly(mut self) -> Trained {
        while self.next_line(TRAIN_DEADLINE).is_some() {}
        let child = self.child.take().expect("a running script");
        let status = wait_with_deadline(child, "the TensorFlow script");
        assert!(
            status.success(),
            "the TensorFlow script failed ({status}): {:?}",
            self.seen
        );
        let line = self.seen.last().cloned().unwrap_or_default();
        let json = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {:?}", self.seen));
        Trained { json }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
