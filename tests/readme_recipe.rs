//! The README's multi-task recipe ("Train on a cluster"), run as written: its three
//! `tessera train` lines with their flags and environment, the cluster file of "The cluster
//! file" (its addresses swapped for loopback ports bound here and handed over as fd 3, its
//! metrics port for port 0), the shared directory a temporary one. It trains and every task
//! exits 0, whatever order the tasks start in: as written, and in reverse with the ps a minute
//! late, which is an ordinary start (no warning) that the workers wait out.

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use crate::readme_commands::{blocks, readme};
use crate::support::cluster::BIN;
use tessera::ops::systemd::socket_activated;
use tessera::train::checkpoint::latest_checkpoint;

/// How long the job may take, a late ps included (a cold debug binary on two busy cores).
const DEADLINE: Duration = Duration::from_secs(300);

/// One line of the recipe: its environment and its arguments after `tessera`.
#[derive(Clone, Debug)]
struct Task {
    env: Vec<(String, String)>,
    args: Vec<String>,
}

impl Task {
    fn job(&self) -> (String, usize) {
        let get = |key: &str| {
            let found = self.env.iter().find(|(k, _)| k == key);
            found
                .unwrap_or_else(|| panic!("{key} in {self:?}"))
                .1
                .clone()
        };
        (
            get("TESSERA__TASK__JOB"),
            get("TESSERA__TASK__INDEX").parse().unwrap(),
        )
    }
}

/// The recipe's `tessera train` lines, in the README's order.
fn recipe(text: &str) -> Vec<Task> {
    let section = text
        .split("\n## Train on a cluster")
        .nth(1)
        .expect("the README's Train on a cluster section");
    let block = &blocks(section, "sh")[0];
    let tasks: Vec<Task> = block
        .lines()
        .filter(|l| l.starts_with("TESSERA__TASK__"))
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let at = words.iter().position(|w| *w == "tessera").expect("tessera");
            Task {
                env: words[..at]
                    .iter()
                    .map(|w| {
                        let (k, v) = w.split_once('=').expect("KEY=VALUE");
                        (k.to_string(), v.to_string())
                    })
                    .collect(),
                args: words[at + 1..].iter().map(|w| w.to_string()).collect(),
            }
        })
        .collect();
    assert_eq!(tasks.len(), 3, "the recipe's three tasks:\n{block}");
    tasks
}

/// The README's cluster file with `[cluster]` naming `addrs` (ps then workers) and the
/// metrics on port 0.
fn cluster_file(text: &str, ps: &[String], workers: &[String]) -> String {
    let toml = blocks(text, "toml")
        .into_iter()
        .find(|b| b.contains("[cluster]"))
        .expect("the README's cluster file");
    let quoted = |addrs: &[String]| {
        let q: Vec<String> = addrs.iter().map(|a| format!("\"{a}\"")).collect();
        q.join(", ")
    };
    toml.lines()
        .map(|line| {
            if line.starts_with("ps = ") {
                format!("ps = [{}]", quoted(ps))
            } else if line.starts_with("worker = ") {
                format!("worker = [{}]", quoted(workers))
            } else if line.starts_with("listen = ") {
                "listen = \"127.0.0.1:0\"".to_string()
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A task that ended: its name, exit code and output.
struct Ended {
    name: String,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn spawn(task: &Task, listener: &TcpListener, config: &Path, shared: &Path) -> Child {
    let args: Vec<String> = task
        .args
        .iter()
        .map(|a| match a.as_str() {
            "cluster.toml" => config.display().to_string(),
            "/shared/run1" => shared.display().to_string(),
            other => other.to_string(),
        })
        .collect();
    let mut command = socket_activated(Path::new(BIN), listener);
    command
        .args(&args)
        .envs(task.env.iter().map(|(k, v)| (k, v)))
        // As a user runs it: the default log level, the chief's event files beside its
        // checkpoints' parent (the default `runs/` would be in the checkout).
        .env_remove("RUST_LOG")
        .arg("--logdir")
        .arg(shared.join("runs"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command.spawn().expect("spawn tessera train")
}

/// Runs the recipe's tasks in `order` (indices into the recipe), the ones in `late` started
/// `delay` after the others; returns how each ended.
fn run(order: &[usize], late: &[usize], delay: Duration) -> (Vec<Ended>, tempfile::TempDir) {
    let text = readme();
    let tasks = recipe(&text);
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("run1");
    let listeners: Vec<TcpListener> = tasks
        .iter()
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addr_of = |job: &str| -> Vec<String> {
        let mut addrs: Vec<(usize, String)> = tasks
            .iter()
            .zip(&listeners)
            .filter(|(t, _)| t.job().0 == job)
            .map(|(t, l)| (t.job().1, l.local_addr().unwrap().to_string()))
            .collect();
        addrs.sort();
        addrs.into_iter().map(|(_, a)| a).collect()
    };
    let config = dir.path().join("cluster.toml");
    std::fs::write(
        &config,
        cluster_file(&text, &addr_of("ps"), &addr_of("worker")),
    )
    .unwrap();

    let (tx, rx) = mpsc::channel();
    let mut pids = Vec::new();
    let start = |i: usize, pids: &mut Vec<(String, libc::pid_t)>| {
        let (job, index) = tasks[i].job();
        let name = format!("/job:{job}/task:{index}");
        let mut child = spawn(&tasks[i], &listeners[i], &config, &shared);
        pids.push((name.clone(), child.id() as libc::pid_t));
        let tx = tx.clone();
        thread::spawn(move || {
            let mut stderr = child.stderr.take().unwrap();
            let err = thread::spawn(move || {
                let mut s = String::new();
                let _ = stderr.read_to_string(&mut s);
                s
            });
            let mut stdout = String::new();
            let _ = child.stdout.take().unwrap().read_to_string(&mut stdout);
            let code = child.wait().unwrap().code();
            let _ = tx.send(Ended {
                name,
                code,
                stdout,
                stderr: err.join().unwrap_or_default(),
            });
        });
    };
    for &i in order.iter().filter(|i| !late.contains(i)) {
        start(i, &mut pids);
    }
    // The late tasks' ports are bound already (the others' connections wait in its backlog
    // or are refused, as when a machine is slow to come up): nothing answers until they start.
    if !late.is_empty() {
        thread::sleep(delay);
        for &i in late {
            start(i, &mut pids);
        }
    }
    let mut ended = Vec::new();
    for _ in 0..tasks.len() {
        match rx.recv_timeout(DEADLINE) {
            Ok(e) => ended.push(e),
            Err(_) => {
                for (_, pid) in &pids {
                    // SAFETY: our children; a reaped one's pid is not reused this soon.
                    unsafe { libc::kill(*pid, libc::SIGKILL) };
                }
                // The killed tasks' output, then every task's.
                while ended.len() < tasks.len() {
                    match rx.recv_timeout(Duration::from_secs(10)) {
                        Ok(e) => ended.push(e),
                        Err(_) => break,
                    }
                }
                let outputs: Vec<String> = ended
                    .iter()
                    .map(|e| format!("{} ({:?}):\n{}\n{}", e.name, e.code, e.stdout, e.stderr))
                    .collect();
                panic!(
                    "the recipe's job did not end within {DEADLINE:?} (killed):\n{}",
                    outputs.join("\n")
                );
            }
        }
    }
    drop(listeners);
    (ended, dir)
}

/// The chief's output: worker 0's, as the recipe has no chief job.
fn chief(ended: &[Ended]) -> &Ended {
    let chief = ended.iter().find(|e| e.name == "/job:worker/task:0");
    chief.expect("the chief, worker 0, ended")
}

/// Every task exited 0, the chief reported its accuracy and a checkpoint is on disk.
fn assert_trained(ended: &[Ended], dir: &Path) {
    for e in ended {
        assert_eq!(
            e.code,
            Some(0),
            "{} exited {:?}:\n{}\n{}",
            e.name,
            e.code,
            e.stdout,
            e.stderr
        );
    }
    let chief = chief(ended);
    assert!(
        chief.stdout.contains("held-out accuracy"),
        "{}",
        chief.stdout
    );
    let latest = latest_checkpoint(&dir.join("run1")).unwrap();
    assert!(latest.is_some(), "no checkpoint in the shared directory");
}

#[test]
fn the_readme_recipe_trains_as_written_and_every_task_exits_0() {
    let (ended, dir) = run(&[0, 1, 2], &[], Duration::ZERO);
    assert_trained(&ended, dir.path());
}

#[test]
fn the_readme_recipe_trains_started_in_reverse_with_the_ps_a_minute_late() {
    let (ended, dir) = run(&[2, 1, 0], &[0], Duration::from_secs(60));
    assert_trained(&ended, dir.path());
    for e in &ended {
        assert!(
            !e.stderr.contains(" WARN "),
            "{} warned on an ordinary start:\n{}",
            e.name,
            e.stderr
        );
    }
    let chief = chief(&ended);
    assert!(
        chief
            .stderr
            .contains("waiting for the cluster's other tasks to come up"),
        "the chief says what it waits for:\n{}",
        chief.stderr
    );
}
