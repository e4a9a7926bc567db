//! Soak: a training job on a real cluster (1 ps + 2 worker `tessera serve` processes) for many
//! steps while clients connect and leave, checking that no daemon's resident memory or open
//! file descriptors grow with the work done.
//!
//! Two clients, one per worker, each run rounds of: `Session::connect` to its worker's master,
//! extend the graph, train `steps_per_session` steps, close. Every session creates a master
//! session, worker sessions on all three tasks and registered partitions, and every step runs
//! RunGraph on the workers with RecvTensor to and from the ps; closing must release all of it.
//!
//! The model is linear regression, `pred = x·w + b` with `w` and `b` on the ps and the
//! forward and backward pass on the client's worker, trained with the optimizer API
//! (`Optimizer::gradient_descent(..).minimize(..)`) on batches from a fixed target,
//! `y = x·[1, -2, 0.5] + 0.3`, so the loss must fall as well.
//!
//! Each daemon's `VmRSS` (from `/proc/<pid>/status`) and open descriptors (entries of
//! `/proc/<pid>/fd`) are sampled once the first round has warmed everything up ("start")
//! and after the last round ("end"). Tolerance: RSS may grow by at most
//! [`RSS_SLACK_BYTES`] plus [`RSS_SLACK_FRACTION`] of its start value (allocator arenas and
//! caches settle), descriptors by at most [`FD_SLACK`] (a connection being replaced).
//!
//! `soak_short` runs in CI (a few hundred steps). `soak_long` is ignored by default:
//! `cargo test --release --test integration soak::soak_long -- --ignored --nocapture`, with
//! `SOAK_STEPS` (default 20000) steps in all; its table is in BENCHES.md ("Soak").

use std::fs;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::cluster::Cluster;
use crate::support::regression::{batch, model, scalar, Model};
use tessera::client::Session;

/// Fixed RSS growth allowed between the start and end samples.
const RSS_SLACK_BYTES: u64 = 16 << 20;
/// RSS growth allowed in proportion to the start value.
const RSS_SLACK_FRACTION: f64 = 0.10;
/// Descriptor growth allowed between the start and end samples.
const FD_SLACK: i64 = 4;

const JOBS: [(&str, usize); 3] = [("ps", 0), ("worker", 0), ("worker", 1)];

/// Memory and descriptors of one process at one moment.
#[derive(Clone, Copy, Debug)]
struct Sample {
    rss_bytes: u64,
    fds: i64,
}

/// Reads `VmRSS` and counts `/proc/<pid>/fd` entries.
fn sample(pid: u32) -> Sample {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS line in /proc/{pid}/status"));
    let fds = fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap_or_else(|e| panic!("list /proc/{pid}/fd: {e}"))
        .count() as i64;
    Sample {
        rss_bytes: kib * 1024,
        fds,
    }
}

/// One client session: connect, extend, train `steps` steps, close. Returns the last loss.
fn session_round(target: &str, m: &Model, first_step: usize, steps: usize) -> f32 {
    let sess = Session::connect(target).unwrap_or_else(|e| panic!("connect to {target}: {e}"));
    sess.extend(&m.graph.to_graph_def())
        .unwrap_or_else(|e| panic!("extend on {target}: {e}"));
    let mut loss = f32::NAN;
    for k in first_step..first_step + steps {
        let (x, y) = batch(k);
        let out = sess
            .run(&[(&m.x, x), (&m.y, y)], &[&m.loss], &[&m.train])
            .unwrap_or_else(|e| panic!("step {k} on {target}: {e}"));
        loss = scalar(&out[0]);
    }
    sess.close()
        .unwrap_or_else(|e| panic!("close on {target}: {e}"));
    loss
}

/// What one soak run measured.
struct Report {
    steps: usize,
    sessions: usize,
    duration: Duration,
    first_loss: f32,
    last_loss: f32,
    start: Vec<Sample>,
    end: Vec<Sample>,
}

impl Report {
    fn print(&self) {
        println!(
            "soak: {} steps in {} sessions, {:.1} s ({:.0} steps/s); loss {:.4} -> {:.6}",
            self.steps,
            self.sessions,
            self.duration.as_secs_f64(),
            self.steps as f64 / self.duration.as_secs_f64(),
            self.first_loss,
            self.last_loss
        );
        println!(
            "| daemon | RSS start (MiB) | RSS end (MiB) | growth (MiB) | fds start | fds end |"
        );
        println!("|---|---|---|---|---|---|");
        for (i, (job, index)) in JOBS.iter().enumerate() {
            let (s, e) = (self.start[i], self.end[i]);
            println!(
                "| /job:{job}/task:{index} | {:.1} | {:.1} | {:+.1} | {} | {} |",
                mib(s.rss_bytes),
                mib(e.rss_bytes),
                mib(e.rss_bytes) - mib(s.rss_bytes),
                s.fds,
                e.fds
            );
        }
    }

    /// Asserts every daemon flat within the tolerance of the module doc.
    fn assert_flat(&self) {
        for (i, (job, index)) in JOBS.iter().enumerate() {
            let (s, e) = (self.start[i], self.end[i]);
            let allowed =
                s.rss_bytes + RSS_SLACK_BYTES + (s.rss_bytes as f64 * RSS_SLACK_FRACTION) as u64;
            assert!(
                e.rss_bytes <= allowed,
                "/job:{job}/task:{index}: RSS grew from {:.1} MiB to {:.1} MiB over {} steps \
                 (allowed up to {:.1} MiB)",
                mib(s.rss_bytes),
                mib(e.rss_bytes),
                self.steps,
                mib(allowed)
            );
            assert!(
                e.fds <= s.fds + FD_SLACK,
                "/job:{job}/task:{index}: open descriptors grew from {} to {} over {} steps",
                s.fds,
                e.fds,
                self.steps
            );
        }
        assert!(
            self.last_loss < self.first_loss / 10.0,
            "the loss did not fall: {} -> {}",
            self.first_loss,
            self.last_loss
        );
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// Runs `rounds` rounds of both clients in parallel, `steps_per_session` steps per session.
fn soak(rounds: usize, steps_per_session: usize) -> Report {
    let cluster = Cluster::start(&[("ps", 1), ("worker", 2)]);
    let pids: Vec<u32> = JOBS
        .iter()
        .map(|(job, index)| cluster.pid(job, *index).expect("a running daemon"))
        .collect();
    let targets: Vec<String> = (0..2).map(|w| cluster.target("worker", w)).collect();
    let models: Vec<Model> = (0..2).map(model).collect();

    // Initialise the shared variables once, through worker 0's master.
    let setup = Session::connect(&targets[0]).expect("connect for init");
    setup
        .extend(&models[0].graph.to_graph_def())
        .expect("extend for init");
    setup.run(&[], &[], &[&models[0].init]).expect("init");
    let (x, y) = batch(0);
    let first_loss = scalar(
        &setup
            .run(
                &[(&models[0].x, x), (&models[0].y, y)],
                &[&models[0].loss],
                &[],
            )
            .expect("first loss")[0],
    );
    setup.close().expect("close the init session");

    let round = |r: usize| -> f32 {
        thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|w| {
                    let (target, m) = (&targets[w], &models[w]);
                    s.spawn(move || {
                        session_round(
                            target,
                            m,
                            (r * 2 + w) * steps_per_session,
                            steps_per_session,
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a client thread"))
                .fold(f32::NAN, |_, l| l)
        })
    };
    // A warm-up round: connections, kernels and allocator arenas settle before "start".
    round(0);
    let start: Vec<Sample> = pids.iter().map(|&p| sample(p)).collect();
    let began = Instant::now();
    let mut last_loss = f32::NAN;
    for r in 1..=rounds {
        last_loss = round(r);
    }
    let duration = began.elapsed();
    let end: Vec<Sample> = pids.iter().map(|&p| sample(p)).collect();
    Report {
        steps: rounds * 2 * steps_per_session,
        sessions: rounds * 2,
        duration,
        first_loss,
        last_loss,
        start,
        end,
    }
}

#[test]
fn soak_short() {
    // 12 rounds × 2 clients × 25 steps = 600 steps in 24 sessions.
    let report = soak(12, 25);
    report.print();
    report.assert_flat();
}

#[test]
#[ignore = "long: run with --ignored --nocapture (SOAK_STEPS, default 20000)"]
fn soak_long() {
    let steps: usize = std::env::var("SOAK_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let per_session = 100;
    let report = soak(steps.div_ceil(2 * per_session), per_session);
    report.print();
    report.assert_flat();
}
