//! A training job stopped from outside, as an operator or Kubernetes stops one: SIGTERM to the
//! chief's `tessera train` (a final checkpoint at the step it stopped, exit 143), SIGTERM to
//! the `tessera local` launcher (every task stopped, nothing left behind, exit 143), and the
//! launcher killed outright (its tasks end anyway).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::cluster::{wait_with_deadline, BIN};
use crate::train::start_job;
use tessera::train::checkpoint::{latest_checkpoint, BundleReader};

/// How long a line may take to show up (a cold debug binary on a busy two-core machine).
const LINE_DEADLINE: Duration = Duration::from_secs(120);

/// A child's output, line by line, read on a thread of its own.
struct Lines {
    rx: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    fn of(stream: impl Read + Send + 'static) -> Lines {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines {
            rx,
            seen: Vec::new(),
        }
    }

    /// The first line from now on that `want` accepts; panics past the deadline or at the end
    /// of the stream, showing what was read.
    fn until(&mut self, what: &str, want: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + LINE_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if want(&line) {
                        return line;
                    }
                }
                Err(e) => panic!("no {what} ({e:?}); read:\n{}", self.seen.join("\n")),
            }
        }
    }

    /// Every line up to the end of the stream (the child exited).
    fn rest(mut self) -> Vec<String> {
        while let Ok(line) = self.rx.recv_timeout(LINE_DEADLINE) {
            self.seen.push(line);
        }
        self.seen
    }
}

/// The step of a progress line (`[###...]  step 412/1000000  ...`).
fn progress_step(line: &str) -> Option<i64> {
    let rest = line.split("  step ").nth(1)?;
    rest.split('/').next()?.parse().ok()
}

fn signal(child: &Child, signal: libc::c_int) {
    // SAFETY: our child, not yet reaped.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, signal) }, 0);
}

/// The global step stored in the checkpoint `prefix`.
fn checkpoint_step(prefix: &Path) -> i64 {
    let bundle = BundleReader::open(prefix.to_str().unwrap()).unwrap();
    bundle
        .read("global_step")
        .unwrap()
        .scalar_value::<i64>()
        .unwrap()
}

#[test]
fn sigterm_to_the_chief_writes_a_checkpoint_at_the_step_it_stopped_and_exits_143() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let args = [
        "--steps",
        "1000000",
        "--save_every",
        "1000000",
        "--checkpoint_dir",
        ckpt.to_str().unwrap(),
    ];
    let mut job = start_job(&[("ps", 1), ("worker", 1)], &args);
    let mut chief = job.tasks.remove(1);
    let mut ps = job.tasks.remove(0);
    let mut progress = Lines::of(chief.child.stderr.take().unwrap());
    let stdout = Lines::of(chief.child.stdout.take().unwrap());
    // Training is under way (the first checkpoint, at step 0, is written before any step).
    progress.until("a progress line past step 0", |l| {
        progress_step(l).is_some_and(|s| s > 0)
    });

    signal(&chief.child, libc::SIGTERM);
    let status = wait_with_deadline(chief.child, "the chief after SIGTERM");
    let out = stdout.rest();
    let err = progress.rest();
    assert_eq!(
        status.code(),
        Some(143),
        "the chief after SIGTERM: {status:?}\n{}",
        err.join("\n")
    );
    let latest = latest_checkpoint(&ckpt).unwrap().expect("a checkpoint");
    let step = checkpoint_step(&latest);
    assert!(step > 0, "the final checkpoint is at step {step}");
    assert!(
        latest
            .to_str()
            .unwrap()
            .ends_with(&format!("model.ckpt-{step}")),
        "{}",
        latest.display()
    );
    assert!(
        out.contains(&format!("tessera: checkpoint {}", latest.display())),
        "the chief names its final checkpoint: {out:?}"
    );
    assert!(
        err.iter()
            .any(|l| l.contains("stopped by SIGTERM before training ended")),
        "{}",
        err.join("\n")
    );

    // The ps had not been told training is over: SIGTERM stops it the same way.
    signal(&ps.child, libc::SIGTERM);
    drop(ps.child.stdout.take());
    let status = wait_with_deadline(ps.child, "the ps after SIGTERM");
    assert_eq!(status.code(), Some(143), "the ps after SIGTERM: {status:?}");
}

/// Pids of the processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<libc::pid_t> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<libc::pid_t>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        // A zombie (exited, not reaped) has an empty command line: it is gone.
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            found.push(pid);
        }
    }
    found
}

/// `tessera local` with a private TMPDIR (where it writes its cluster file) and `args`.
fn spawn_local(tmp: &Path, args: &[&str]) -> Child {
    Command::new(BIN)
        .arg("local")
        .args(args)
        .env("TMPDIR", tmp)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tessera local")
}

/// Starts `tessera local` training for long and waits until its chief trained a step;
/// returns the launcher, its output and its tasks' pids.
fn local_under_way(tmp: &Path, ckpt: &Path) -> (Child, Lines, Lines, Vec<libc::pid_t>) {
    let mut local = spawn_local(
        tmp,
        &[
            "--steps",
            "1000000",
            "--timeout",
            "10m",
            "--checkpoint_dir",
            ckpt.to_str().unwrap(),
        ],
    );
    let mut out = Lines::of(local.stdout.take().unwrap());
    let mut err = Lines::of(local.stderr.take().unwrap());
    for _ in 0..3 {
        out.until("a task's readiness line", |l| {
            l.starts_with("tessera: serving")
        });
    }
    err.until("a progress line past step 0", |l| {
        progress_step(l).is_some_and(|s| s > 0)
    });
    let tasks = processes_mentioning(&tmp.display().to_string());
    assert_eq!(tasks.len(), 3, "the 1 ps and 2 workers: {tasks:?}");
    (local, out, err, tasks)
}

/// Waits until none of `pids` runs any more.
fn wait_gone(pids: &[libc::pid_t], needle: &str) {
    let deadline = Instant::now() + LINE_DEADLINE;
    loop {
        let left: Vec<_> = processes_mentioning(needle)
            .into_iter()
            .filter(|p| pids.contains(p))
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "tasks {left:?} still running {LINE_DEADLINE:?} after their launcher ended"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// What the launcher left in its TMPDIR.
fn left_in(tmp: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(tmp)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect()
}

#[test]
fn signalling_tessera_local_stops_every_task_and_leaves_no_process_and_no_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tempfile::tempdir().unwrap();
    let (local, out, err, tasks) = local_under_way(tmp.path(), ckpt.path());

    signal(&local, libc::SIGTERM);
    let status = wait_with_deadline(local, "tessera local after SIGTERM");
    let err = err.rest();
    assert_eq!(status.code(), Some(143), "{status:?}\n{}", err.join("\n"));
    // The launcher waited for its tasks: none is left, nor its folder.
    let needle = tmp.path().display().to_string();
    let left: Vec<_> = processes_mentioning(&needle)
        .into_iter()
        .filter(|p| tasks.contains(p))
        .collect();
    assert!(left.is_empty(), "tasks {left:?} outlived the launcher");
    assert_eq!(left_in(tmp.path()), Vec::<PathBuf>::new());
    // The chief stopped after a final checkpoint, named on the launcher's stdout.
    let out = out.rest();
    let latest = latest_checkpoint(ckpt.path())
        .unwrap()
        .expect("a checkpoint");
    assert!(checkpoint_step(&latest) > 0);
    assert!(
        out.contains(&format!("tessera: checkpoint {}", latest.display())),
        "{out:?}"
    );
    for task in ["/job:ps/task:0", "/job:worker/task:0", "/job:worker/task:1"] {
        assert!(
            err.iter()
                .any(|l| l.contains("exited with status 143") && l.contains(task)),
            "{task} stopped with 143:\n{}",
            err.join("\n")
        );
    }
}

#[test]
fn the_tasks_of_a_killed_tessera_local_end_too() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tempfile::tempdir().unwrap();
    let (local, _out, _err, tasks) = local_under_way(tmp.path(), ckpt.path());
    // SIGKILL: the launcher can do nothing; the kernel SIGTERMs its tasks.
    signal(&local, libc::SIGKILL);
    let status = wait_with_deadline(local, "tessera local after SIGKILL");
    assert_eq!(status.code(), None, "{status:?}");
    wait_gone(&tasks, &tmp.path().display().to_string());
}
