//! The bytes one training step of `--model embedding` moves between its tasks, from the
//! tasks' own byte counters (`tessera_sent_bytes_total`, every RPC, summed over the tasks),
//! for tables of 100,000 to 4,000,000 rows and batches of 64 to 1024 examples: they must grow
//! with the rows a step touches, not with the table.
//!
//! Each configuration runs the graph `tessera train` builds (two ps tasks holding the tables'
//! parts, one worker; 4 id columns, 4 dense features, embedding width 32, Adagrad) on three
//! in-process servers on loopback, through the worker's master, with the chief's batches of
//! uniformly random rows (so nearly every id of the batch is a distinct row). After 3 warm-up
//! steps it reads the counters, runs 20 steps, reads them again, and prints bytes per step,
//! distinct rows per step, bytes per distinct row, and the table's size beside them (what a
//! step that moved the table would move, each way).
//!
//! `cargo bench --bench embedding_bytes` (bytes, not time: the numbers are the same on any
//! machine up to the ids drawn).

use std::collections::BTreeSet;
use std::net::TcpListener;

use rand::{Rng, SeedableRng};
use tessera::client::Session;
use tessera::cluster::TaskConfig;
use tessera::server::Server;
use tessera::tensor::Tensor;
use tessera::train::job::model::{self, Examples, Placement, TrainOp, IDS, X, Y};
use tessera::train::job::{ModelKind, TrainSpec};

const COLUMNS: usize = 4;
const DENSE: usize = 4;
const DIM: usize = 32;
const WARM_UP: usize = 3;
const STEPS: usize = 20;

/// Three in-process servers (`ps` 0 and 1, `worker` 0) on loopback ports bound here.
fn cluster() -> Vec<Server> {
    let tasks = [("ps", 0), ("ps", 1), ("worker", 0)];
    let listeners: Vec<TcpListener> = tasks
        .iter()
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a loopback port"))
        .collect();
    let addr = |i: usize| listeners[i].local_addr().expect("bound").to_string();
    let text = format!(
        "[cluster]\nps = [\"{}\", \"{}\"]\nworker = [\"{}\"]\n",
        addr(0),
        addr(1),
        addr(2)
    );
    tasks
        .iter()
        .zip(listeners)
        .map(|((job, index), listener)| {
            let env = [
                ("TESSERA__TASK__JOB".to_string(), job.to_string()),
                ("TESSERA__TASK__INDEX".to_string(), index.to_string()),
            ];
            let config = TaskConfig::from_toml_with_env(&text, "cluster.toml", env)
                .expect("the cluster file");
            Server::start_with_listener(config, listener).expect("a server")
        })
        .collect()
}

/// Every task's `tessera_sent_bytes_total`, summed.
fn sent_bytes() -> f64 {
    tessera::ops::metrics::render()
        .lines()
        .filter(|l| l.starts_with("tessera_sent_bytes_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One configuration's measurement: bytes per step and distinct rows per step.
fn measure(rows: usize, batch: usize) -> (f64, f64) {
    let servers = cluster();
    let worker = servers
        .iter()
        .find(|s| s.task().job == "worker")
        .expect("the worker");
    let spec = TrainSpec {
        model: ModelKind::Embedding {
            rows,
            dim: DIM,
            hidden: vec![64],
        },
        optimizer: "adagrad".into(),
        ..TrainSpec::default()
    };
    let placement = Placement {
        num_ps: 2,
        job: "worker".into(),
        chief: true,
        worker_index: 0,
        num_workers: 1,
    };
    let examples = Examples {
        features: DENSE,
        ids: COLUMNS,
        classes: 2,
    };
    let built = model::build_for(&spec, &placement, examples).expect("the training graph");
    let TrainOp::Async(train_op) = &built.train else {
        unreachable!("asynchronous training");
    };
    let session = Session::connect(&format!("grpc://{}", worker.local_addr())).expect("session");
    session.extend(&built.graph).expect("extend");
    session.run(&[], &[], &[&built.init_op]).expect("init");
    let mut rng = rand::rngs::StdRng::seed_from_u64(rows as u64 ^ batch as u64);
    let mut touched = 0usize;
    let mut before = 0.0;
    for step in 0..WARM_UP + STEPS {
        if step == WARM_UP {
            before = sent_bytes();
        }
        let ids: Vec<i64> = (0..batch * COLUMNS)
            .map(|_| rng.random_range(0..rows as i64))
            .collect();
        if step >= WARM_UP {
            touched += ids.iter().collect::<BTreeSet<_>>().len();
        }
        let x: Vec<f32> = (0..batch * DENSE).map(|_| rng.random()).collect();
        let y: Vec<i64> = (0..batch).map(|_| rng.random_range(0..2)).collect();
        let feeds = [
            (X, Tensor::from_vec([batch, DENSE], x).expect("x")),
            (IDS, Tensor::from_vec([batch, COLUMNS], ids).expect("ids")),
            (Y, Tensor::from_vec([batch], y).expect("y")),
        ];
        session
            .run(&feeds, &[&built.loss], &[train_op])
            .expect("a training step");
    }
    let moved = (sent_bytes() - before) / STEPS as f64;
    drop(session);
    drop(servers);
    (moved, touched as f64 / STEPS as f64)
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not used.
    tessera::ops::metrics::install();
    println!(
        "embedding_bytes: bytes per training step, summed over 2 ps + 1 worker (tessera_sent_bytes_total)"
    );
    println!(
        "{:>10} {:>6} {:>14} {:>14} {:>12} {:>14}",
        "rows", "batch", "bytes/step", "rows touched", "bytes/row", "table MB"
    );
    let configs = [
        (100_000, 256),
        (1_000_000, 256),
        (4_000_000, 256),
        (1_000_000, 64),
        (1_000_000, 1024),
    ];
    for (rows, batch) in configs {
        let (bytes, touched) = measure(rows, batch);
        let table_mb = (rows * (DIM + 2) * 4) as f64 / 1e6;
        println!(
            "{rows:>10} {batch:>6} {bytes:>14.0} {touched:>14.1} {:>12.1} {table_mb:>14.1}",
            bytes / touched
        );
    }
}
