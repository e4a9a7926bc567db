//! What the benches that run TensorFlow beside tessera share: finding the venv's Python,
//! child processes that are killed with the bench, free loopback ports, medians.
#![allow(dead_code)]

pub mod cluster;
pub mod raw_tcp;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// A child process killed when dropped, its stdout lines sent to a channel and the last lines
/// of its stderr kept for errors.
pub struct Task {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Task {
    pub fn spawn(command: &mut Command) -> Result<Task, String> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {command:?}: {e}"))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (send, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let tail = Arc::clone(&stderr);
        let err = child.stderr.take().expect("piped stderr");
        thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut tail = tail.lock().unwrap();
                if tail.len() == 5 {
                    tail.remove(0);
                }
                tail.push(line);
            }
        });
        let stdin = child.stdin.take();
        Ok(Task {
            child,
            stdin,
            lines,
            stderr,
        })
    }

    /// Waits for a line starting with `prefix`, up to `within`; returns it. An error says
    /// whether the process ended first, with the end of its stderr.
    pub fn line_starting(&mut self, prefix: &str, within: Duration) -> Result<String, String> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Ok(line),
                Ok(_) => continue,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!("no line starting `{prefix}` within {within:?}"))
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
                    let stderr = self.stderr.lock().unwrap().join(" / ");
                    return Err(format!(
                        "it ended ({status}) before a line starting `{prefix}`: {stderr}"
                    ));
                }
            }
        }
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An address on loopback with a port the OS just handed out.
pub fn free_address() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port on loopback");
    format!("127.0.0.1:{}", listener.local_addr().unwrap().port())
}

/// The package's root.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The Python with TensorFlow, or why there is none.
pub fn tensorflow_python() -> Result<PathBuf, String> {
    let python = std::env::var_os("TESSERA_TF_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/tf-venv/bin/python"));
    let imports = Command::new(&python)
        .args(["-c", "import tensorflow"])
        .env("TF_CPP_MIN_LOG_LEVEL", "3")
        .output();
    match imports {
        Ok(out) if out.status.success() => Ok(python),
        Ok(_) => Err(format!("{} cannot import tensorflow", python.display())),
        Err(e) => Err(format!(
            "no Python at {} ({e}); run scripts/test --setup or set TESSERA_TF_PYTHON",
            python.display()
        )),
    }
}

/// The Python with TensorFlow for a bench that has nothing to run without it; `None` after
/// saying why it is skipped.
pub fn tensorflow_or_skip() -> Option<PathBuf> {
    tensorflow_python()
        .map_err(|why| println!("skipped: {why}"))
        .ok()
}

/// The median (of an even count, the mean of the middle two).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}
