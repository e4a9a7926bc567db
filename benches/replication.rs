//! What a ps task's standby costs and how fast it takes over: the classic model (MLP 64-128-10,
//! Adagrad 0.1, batches of 32, async) on `tessera serve` daemons, 1 ps + 2 workers, each
//! worker's client a thread of this process; with and without a standby (`ps_standby`),
//! alternating, 3 rounds of 1500 global steps. Then, with the standby, the primary is killed
//! with SIGKILL mid-run: the time from the kill to the next step that succeeds (either
//! worker's, through a session created again), 3 times.
//!
//! `cargo bench --bench replication`; `-- --quick` runs one short round (a smoke test).

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use tessera::client::Session;
use tessera::ops::systemd::socket_activated;
use tessera::tensor::Tensor;
use tessera::train::job::model::{build, Placement, TrainOp};
use tessera::train::job::spec::{ModelKind, TrainSpec};

const BIN: &str = env!("CARGO_BIN_EXE_tessera");
const FEATURES: usize = 64;
const CLASSES: usize = 10;
const BATCH: usize = 32;

/// Daemons of one cluster, killed when dropped.
struct Daemons {
    children: Vec<(String, Child)>,
    addrs: Vec<(String, String)>,
    _dir: tempfile::TempDir,
}

impl Daemons {
    fn start(standby: bool) -> Daemons {
        let mut jobs = vec![("ps", 1), ("worker", 2)];
        if standby {
            jobs.push(("ps_standby", 1));
        }
        let mut listeners = Vec::new();
        let mut text = String::from("[cluster]\n");
        for (job, n) in &jobs {
            let mut addrs = Vec::new();
            for i in 0..*n {
                let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
                addrs.push(format!("\"{}\"", listener.local_addr().unwrap()));
                listeners.push((job.to_string(), i, listener));
            }
            text.push_str(&format!("{job} = [{}]\n", addrs.join(", ")));
        }
        text.push_str("[devices]\ngpu = 0\n[timeouts]\nconnect = \"5s\"\nrpc = \"30s\"\n");
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("cluster.toml");
        std::fs::write(&config, text).unwrap();
        let mut children = Vec::new();
        let mut addrs = Vec::new();
        for (job, index, listener) in listeners {
            let mut command = socket_activated(Path::new(BIN), &listener);
            command
                .args(["serve", "--config"])
                .arg(&config)
                .env("TESSERA__TASK__JOB", &job)
                .env("TESSERA__TASK__INDEX", index.to_string())
                .env("RUST_LOG", "error")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            let mut child = command.spawn().expect("spawn tessera serve");
            let stdout = child.stdout.take().unwrap();
            let (tx, rx) = mpsc::channel();
            thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(stdout).lines() {
                    let _ = tx.send(line);
                }
            });
            rx.recv_timeout(Duration::from_secs(60))
                .expect("the daemon's readiness line")
                .expect("read it");
            let name = format!("{job}{index}");
            addrs.push((name.clone(), listener.local_addr().unwrap().to_string()));
            children.push((name, child));
        }
        Daemons {
            children,
            addrs,
            _dir: dir,
        }
    }

    fn target(&self, name: &str) -> String {
        let (_, addr) = self.addrs.iter().find(|(n, _)| n == name).unwrap();
        format!("grpc://{addr}")
    }

    fn kill(&mut self, name: &str) {
        let (_, child) = self.children.iter_mut().find(|(n, _)| n == name).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

impl Drop for Daemons {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A batch of random features and labels.
fn batch(seed: u64) -> (Tensor, Tensor) {
    let mut state = seed | 1;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let x: Vec<f32> = (0..BATCH * FEATURES)
        .map(|_| (next() % 17) as f32 / 16.0)
        .collect();
    let y: Vec<i64> = (0..BATCH)
        .map(|_| (next() % CLASSES as u64) as i64)
        .collect();
    (
        Tensor::from_vec(vec![BATCH, FEATURES], x).unwrap(),
        Tensor::from_vec(vec![BATCH], y).unwrap(),
    )
}

/// What the workers saw: steps/s between the chief's first and last step, and the time from
/// `killed` to the next success.
struct Outcome {
    steps_per_s: f64,
    recovery: Option<Duration>,
}

/// Trains `steps` global steps on `daemons`; kills the primary at `kill_at` when given.
fn train(daemons: &mut Daemons, steps: i64, kill_at: Option<i64>) -> Outcome {
    let spec = TrainSpec {
        model: ModelKind::Mlp { hidden: vec![128] },
        optimizer: "adagrad".into(),
        learning_rate: 0.1,
        batch_size: BATCH,
        ..TrainSpec::default()
    };
    let graphs: Vec<_> = (0..2)
        .map(|w| {
            let placement = Placement {
                num_ps: 1,
                job: "worker".into(),
                chief: w == 0,
                worker_index: w,
                num_workers: 2,
            };
            build(&spec, &placement, FEATURES, CLASSES).unwrap()
        })
        .collect();
    let init = Session::connect(&daemons.target("worker0")).unwrap();
    init.extend(&graphs[0].graph).unwrap();
    init.run(&[], &[], &[&graphs[0].init_op]).unwrap();
    drop(init);

    let global = Arc::new(AtomicI64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let killed: Arc<Mutex<Option<Instant>>> = Arc::default();
    let recovered: Arc<Mutex<Option<Instant>>> = Arc::default();
    let started = Instant::now();
    let workers: Vec<_> = graphs
        .into_iter()
        .enumerate()
        .map(|(w, graph)| {
            let target = daemons.target(&format!("worker{w}"));
            let (global, done, killed, recovered) = (
                Arc::clone(&global),
                Arc::clone(&done),
                Arc::clone(&killed),
                Arc::clone(&recovered),
            );
            thread::spawn(move || {
                let TrainOp::Async(train) = &graph.train else {
                    unreachable!("async")
                };
                let connect = || {
                    let s = Session::connect(&target)?;
                    s.extend(&graph.graph)?;
                    Ok::<_, tessera::Status>(s)
                };
                let mut session = connect().unwrap();
                let mut k = w as u64 * 1_000_003;
                let deadline = Instant::now() + Duration::from_secs(300);
                while !done.load(Ordering::SeqCst) && Instant::now() < deadline {
                    k += 1;
                    let (x, y) = batch(k);
                    match session.run(&[("x:0", x), ("y:0", y)], &[&graph.global_step], &[train]) {
                        Ok(values) => {
                            let step = values[0].scalar_value::<i64>().unwrap();
                            global.fetch_max(step, Ordering::SeqCst);
                            if killed.lock().unwrap().is_some() {
                                recovered.lock().unwrap().get_or_insert_with(Instant::now);
                            }
                            if step >= steps {
                                done.store(true, Ordering::SeqCst);
                            }
                        }
                        Err(_) => {
                            thread::sleep(Duration::from_millis(20));
                            if let Ok(s) = connect() {
                                session = s;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    if let Some(at) = kill_at {
        while global.load(Ordering::SeqCst) < at {
            thread::sleep(Duration::from_millis(1));
        }
        daemons.kill("ps0");
        *killed.lock().unwrap() = Some(Instant::now());
    }
    for w in workers {
        w.join().unwrap();
    }
    let elapsed = started.elapsed();
    let recovery = match (*killed.lock().unwrap(), *recovered.lock().unwrap()) {
        (Some(k), Some(r)) => Some(r.saturating_duration_since(k)),
        _ => None,
    };
    Outcome {
        steps_per_s: global.load(Ordering::SeqCst) as f64 / elapsed.as_secs_f64(),
        recovery,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // `cargo test --benches` runs this without `--bench`: one short round as a smoke test.
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick") || !args.iter().any(|a| a == "--bench");
    let (rounds, steps) = if quick { (1, 100) } else { (3, 1500) };
    let mut plain = Vec::new();
    let mut replicated = Vec::new();
    for round in 0..rounds {
        for standby in [false, true] {
            let mut daemons = Daemons::start(standby);
            let outcome = train(&mut daemons, steps, None);
            println!(
                "round {round}: {} {:.1} steps/s",
                if standby {
                    "with a standby   "
                } else {
                    "without a standby"
                },
                outcome.steps_per_s
            );
            if standby {
                replicated.push(outcome.steps_per_s);
            } else {
                plain.push(outcome.steps_per_s);
            }
        }
    }
    let (p, r) = (median(plain), median(replicated));
    println!(
        "steps/s medians: without {p:.1}, with {r:.1}: ratio {:.2} (goal >= 0.7)",
        r / p
    );
    let mut recoveries = Vec::new();
    for round in 0..rounds {
        let mut daemons = Daemons::start(true);
        let outcome = train(&mut daemons, steps, Some(steps / 3));
        let recovery = outcome.recovery.expect("a step succeeded after the kill");
        println!(
            "kill {round}: next successful step {:.3} s after the kill",
            recovery.as_secs_f64()
        );
        recoveries.push(recovery.as_secs_f64());
    }
    println!(
        "kill to next successful step, median {:.3} s (goal <= 3 s)",
        median(recoveries)
    );
}
