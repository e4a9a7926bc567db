//! A while loop whose body spans two tasks of a real cluster (`tessera serve` processes on
//! loopback): the loop's machinery and counter on the worker, one multiplication of its body
//! on the ps. tessera's master adds a control loop on the ps (`runtime/control_loops.rs`), so
//! the ps runs the loop's iterations as the worker does and each iteration's tensors cross
//! with their own rendezvous key, both ways; the answer must equal the loop run in process.

use crate::support::cluster::Cluster;
use crate::support::v1_graph::{counting_loop, G};
use tessera::client::Session;
use tessera::proto::GraphDef;
use tessera::tensor::{DType, Tensor};

const WORKER: &str = "/job:worker/replica:0/task:0/device:CPU:0";
const PS: &str = "/job:ps/replica:0/task:0/device:CPU:0";

/// `counting_loop` on the worker, its `scaled` product (and the invariant it reads) on the ps.
fn graph(placed: bool) -> GraphDef {
    let mut g = G::default();
    let device = |d: &str| if placed { d.to_string() } else { String::new() };
    g.device = device(WORKER);
    g.placeholder("n", DType::Float);
    g.constant("zero", Tensor::scalar(0f32), &[]);
    g.device = device(PS);
    g.constant("two", Tensor::scalar(2f32), &[]);
    g.device = device(WORKER);
    counting_loop(&mut g, "while", "zero", "zero", "n", "two", 10);
    let mut graph = GraphDef {
        node: g.nodes,
        ..Default::default()
    };
    if placed {
        for node in &mut graph.node {
            if matches!(node.name.as_str(), "while/scaled" | "while/Enter_scale") {
                node.device = PS.into();
            }
        }
    }
    graph
}

#[test]
fn a_loop_body_across_two_tasks_iterates_on_both_and_matches_the_in_process_answer() {
    let local = Session::local();
    local.extend(&graph(false)).unwrap();
    let fetches = ["while/Exit_i:0", "while/Exit_acc:0"];
    let want = local
        .run(&[("n", Tensor::scalar(6f32))], &fetches, &[])
        .unwrap();
    assert_eq!(want[1].scalar_value::<f32>().unwrap(), 42.0);

    let cluster = Cluster::start(&[("ps", 1), ("worker", 1)]);
    let remote = Session::connect(&cluster.target("worker", 0)).unwrap();
    remote.extend(&graph(true)).unwrap();
    for n in [6f32, 0.0, 3.0] {
        let got = remote
            .run(&[("n", Tensor::scalar(n))], &fetches, &[])
            .unwrap_or_else(|e| panic!("n = {n}: {e}"));
        let want = local
            .run(&[("n", Tensor::scalar(n))], &fetches, &[])
            .unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(
                g.scalar_value::<f32>().unwrap(),
                w.scalar_value::<f32>().unwrap(),
                "n = {n}"
            );
        }
    }
    remote.close().unwrap();
}
