//! A daemon runs each local device's part of a step on that device's tower: a task with
//! `[devices] cpu = 2` (in process, on `127.0.0.1:0`) runs a graph whose nodes sit on both
//! CPUs, and the steps' traces show the nodes of `CPU:i` ran on tower `i`'s threads
//! (`tessera-CPU:i-N`): all of them in the first step, when no node has proved cheap enough to
//! run on the thread that starts the step, and never on the other tower's threads after.

use std::collections::HashMap;

use crate::support::cluster::{InProcessCluster, TEST_TIMEOUTS};
use tessera::client::Session;
use tessera::graph::Graph;
use tessera::proto::run_options::TraceLevel;
use tessera::proto::{RunOptions, StepStats};
use tessera::tensor::Tensor;

const CPU0: &str = "/job:worker/replica:0/task:0/device:CPU:0";
const CPU1: &str = "/job:worker/replica:0/task:0/device:CPU:1";

/// For each device of `stats`, the names of the threads that ran its nodes.
fn threads_by_device(stats: &StepStats) -> HashMap<String, Vec<String>> {
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    for device in &stats.dev_stats {
        let names = out.entry(device.device.clone()).or_default();
        for node in &device.node_stats {
            let name = device
                .thread_names
                .get(&node.thread_id)
                .cloned()
                .unwrap_or_else(|| format!("thread {}", node.thread_id));
            names.push(name);
        }
    }
    out
}

#[test]
fn each_devices_partition_runs_on_its_towers_threads() {
    let cluster = InProcessCluster::start_with(
        &[("worker", 1)],
        &TEST_TIMEOUTS.replace("[devices]\n", "[devices]\ncpu = 2\n"),
    );
    let mut g = Graph::new();
    let (a, x) = g
        .with_device(CPU0, |g| {
            let a = g.constant(&Tensor::from_vec([2, 2], vec![1.0f32, 2.0, 3.0, 4.0])?)?;
            let x = g.matmul(&a, &a)?;
            Ok((a, x))
        })
        .unwrap();
    let z = g
        .with_device(CPU1, |g| {
            let b = g.add(&a, &x)?;
            g.matmul(&b, &b)
        })
        .unwrap();
    let session = Session::connect(&cluster.target("worker", 0)).unwrap();
    session.extend(&g.to_graph_def()).unwrap();
    let options = RunOptions {
        trace_level: TraceLevel::FullTrace as i32,
        ..Default::default()
    };
    // Several steps: the first runs every node on the towers' pools, later ones may run the
    // nodes that proved cheap on the thread that starts the step.
    let mut steps: Vec<HashMap<String, Vec<String>>> = Vec::new();
    for _ in 0..4 {
        let (out, metadata) = session
            .run_with_options(&[], &[&z.name()], &[], &options)
            .unwrap();
        // a = [[1,2],[3,4]]; x = a@a = [[7,10],[15,22]]; b = a+x; z = b@b.
        let b = [8.0f32, 12.0, 18.0, 26.0];
        let expected = [
            b[0] * b[0] + b[1] * b[2],
            b[0] * b[1] + b[1] * b[3],
            b[2] * b[0] + b[3] * b[2],
            b[2] * b[1] + b[3] * b[3],
        ];
        assert_eq!(out[0].values::<f32>().unwrap().as_ref(), expected);
        let stats = metadata
            .step_stats
            .expect("a traced step returns its stats");
        steps.push(threads_by_device(&stats));
    }
    for (device, short, other) in [(CPU0, "CPU:0", "CPU:1"), (CPU1, "CPU:1", "CPU:0")] {
        let pool = format!("tessera-{short}-");
        let first = steps[0]
            .get(device)
            .unwrap_or_else(|| panic!("no node of {device} in the first trace: {:?}", steps[0]));
        assert!(
            first.iter().all(|n| n.starts_with(&pool)),
            "in the first step, a node of {device} ran off its tower's pool: {first:?}"
        );
        for names in steps.iter().filter_map(|step| step.get(device)) {
            assert!(
                names
                    .iter()
                    .all(|n| !n.starts_with(&format!("tessera-{other}-"))),
                "a node of {device} ran on the other tower's pool: {names:?}"
            );
        }
    }
}
