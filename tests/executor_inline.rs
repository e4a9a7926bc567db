//! `Executor::spawn` runs cheap nodes that cannot wait on the thread that starts the step
//! (an async runtime's, in a worker's RunGraph) and hands every other node to the pool.
//!
//! The kernels are the real ones, wrapped so that each run records the thread it ran on;
//! `QueueDequeueV2` stands for a kernel that may wait (a fake that passes its input on, so the
//! test needs no queue): the executor decides from the op, never from what the kernel did.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use tessera::device::DeviceType;
use tessera::exec::Executor;
use tessera::exec::InlineLimits;
use tessera::graph::{attr, Graph};
use tessera::kernels::{create_kernel, OpContext, OpKernel};
use tessera::proto::NodeDef;
use tessera::runtime::rendezvous::rendezvous_key_of;
use tessera::runtime::rendezvous::Rendezvous;
use tessera::runtime::{Device, StepOptions};
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::{Code, Result};

const CPU: &str = "/job:localhost/replica:0/task:0/device:CPU:0";

/// The thread each node ran on, in the order they ran.
type Runs = Arc<Mutex<Vec<(String, ThreadId)>>>;

/// A kernel that records where it ran and then runs `inner` (or passes input 0 on).
struct Recorded {
    inner: Option<Arc<dyn OpKernel>>,
    runs: Runs,
}

impl OpKernel for Recorded {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        self.runs
            .lock()
            .unwrap()
            .push((ctx.node().name.clone(), thread::current().id()));
        match &self.inner {
            Some(kernel) => kernel.compute(ctx),
            None => {
                let input = ctx.input(0)?.clone();
                ctx.set_output(0, input);
                Ok(())
            }
        }
    }
}

/// An executor over `nodes` with the recorded real kernels.
fn executor(
    nodes: Vec<NodeDef>,
    feeds: &[&str],
    fetches: &[&str],
    targets: &[&str],
    runs: &Runs,
) -> Executor {
    let graph = tessera::proto::GraphDef {
        node: nodes,
        ..Default::default()
    };
    let runs = runs.clone();
    let lookup = move |node: &NodeDef, device: DeviceType| -> Result<Arc<dyn OpKernel>> {
        let inner = match node.op.as_str() {
            "QueueDequeueV2" => None,
            _ => Some(create_kernel(node, device)?),
        };
        Ok(Arc::new(Recorded {
            inner,
            runs: runs.clone(),
        }))
    };
    Executor::new(
        &graph,
        feeds,
        fetches,
        targets,
        Arc::new(Device::local_cpu()),
        &lookup,
    )
    .expect("executor")
    .with_inline_limits(GENEROUS)
}

/// Limits no small kernel misses even in a debug build on a busy machine, so that what runs
/// inline depends only on the rules under test; an expensive node is measured against the
/// default limits.
const GENEROUS: InlineLimits = InlineLimits {
    node: Duration::from_millis(20),
    step: Duration::from_secs(1),
};

/// Starts one step from this thread, waits for it and returns its fetches and the nodes that
/// ran on this thread.
fn step(
    rt: &tokio::runtime::Runtime,
    exec: &Executor,
    feeds: Vec<Tensor>,
    options: &StepOptions,
    runs: &Runs,
) -> (Result<Vec<Tensor>>, Vec<String>) {
    runs.lock().unwrap().clear();
    let running = exec.spawn(feeds, options).expect("step starts");
    let result = rt.block_on(running.finish());
    let here = thread::current().id();
    let inline = runs
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, thread)| *thread == here)
        .map(|(name, _)| name.clone())
        .collect();
    (result, inline)
}

fn options() -> StepOptions {
    StepOptions {
        step_id: 7,
        deadline: Some(Instant::now() + Duration::from_secs(10)),
        rendezvous: Some(Arc::new(Rendezvous::new(7))),
        ..Default::default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// `y = x + 1` with `x` fed.
fn add_one() -> (Vec<NodeDef>, String) {
    let mut g = Graph::new();
    let x = g
        .placeholder("x", DType::Float, PartialShape::unknown())
        .unwrap();
    let one = g.scalar("one", DType::Float, 1.0).unwrap();
    let y = g.add(&x, &one).unwrap();
    (g.to_graph_def().node, y.name())
}

fn floats(t: &Tensor) -> Vec<f32> {
    t.values::<f32>().unwrap().to_vec()
}

#[test]
fn cheap_nodes_run_on_the_starting_thread_once_they_proved_cheap() {
    let runs = Runs::default();
    let (nodes, y) = add_one();
    let exec = executor(nodes, &["x:0"], &[&y], &[], &runs);
    let rt = runtime();

    // First step: no node has a measured cost yet, so all of them go to the pool.
    let (result, inline) = step(&rt, &exec, vec![Tensor::scalar(2.0f32)], &options(), &runs);
    assert_eq!(floats(&result.unwrap()[0]), [3.0]);
    assert!(
        inline.is_empty(),
        "ran inline before any cost was known: {inline:?}"
    );

    // Then every node ran in microseconds on inputs no larger: all run here.
    let (result, inline) = step(&rt, &exec, vec![Tensor::scalar(5.0f32)], &options(), &runs);
    assert_eq!(floats(&result.unwrap()[0]), [6.0]);
    let mut inline = inline;
    inline.sort();
    assert_eq!(inline, ["add", "one"], "nodes run on the starting thread");
}

#[test]
fn a_node_whose_inputs_grew_since_it_was_measured_goes_to_the_pool() {
    let runs = Runs::default();
    let (nodes, y) = add_one();
    let exec = executor(nodes, &["x:0"], &[&y], &[], &runs);
    let rt = runtime();
    for _ in 0..2 {
        let (result, _) = step(&rt, &exec, vec![Tensor::scalar(1.0f32)], &options(), &runs);
        result.unwrap();
    }
    let big = Tensor::from_vec(vec![4096], vec![1.0f32; 4096]).unwrap();
    let (result, inline) = step(&rt, &exec, vec![big], &options(), &runs);
    assert_eq!(floats(&result.unwrap()[0]), vec![2.0; 4096]);
    assert_eq!(inline, ["one"], "the add of 16 KiB was measured on 4 bytes");
}

#[test]
fn an_expensive_node_goes_to_the_pool() {
    let runs = Runs::default();
    let mut g = Graph::new();
    let a = g
        .constant(&Tensor::from_vec(vec![256, 256], vec![0.5f32; 256 * 256]).unwrap())
        .unwrap();
    let p = g.matmul(&a, &a).unwrap();
    let exec = executor(g.to_graph_def().node, &[], &[&p.name()], &[], &runs)
        .with_inline_limits(InlineLimits::default());
    let rt = runtime();
    for _ in 0..3 {
        let (result, inline) = step(&rt, &exec, vec![], &options(), &runs);
        assert_eq!(floats(&result.unwrap()[0])[0], 64.0);
        assert!(
            !inline.contains(&p.name()),
            "a 256x256 MatMul ran on the starting thread"
        );
    }
}

#[test]
fn a_node_that_may_wait_never_runs_on_the_starting_thread() {
    let runs = Runs::default();
    let mut g = Graph::new();
    let one = g.scalar("one", DType::Float, 1.0).unwrap();
    let mut nodes = g.to_graph_def().node;
    nodes.push(NodeDef {
        name: "dequeue".into(),
        op: "QueueDequeueV2".into(),
        input: vec![one.name()],
        ..Default::default()
    });
    let exec = executor(nodes, &[], &["dequeue:0"], &[], &runs);
    let rt = runtime();
    for _ in 0..3 {
        let (result, inline) = step(&rt, &exec, vec![], &options(), &runs);
        assert_eq!(floats(&result.unwrap()[0]), [1.0]);
        assert!(!inline.contains(&"dequeue".to_string()), "{inline:?}");
    }
}

/// A client-terminated `_Recv` of `x` feeding `_Send` of `x + 1`, as a worker's partition has.
fn recv_add_send() -> (Vec<NodeDef>, NodeDef, NodeDef) {
    let pair = |name: &str, op: &str, edge: &str, input: Vec<String>| {
        let mut node = NodeDef {
            name: name.into(),
            op: op.into(),
            input,
            device: CPU.into(),
            ..Default::default()
        };
        let a = &mut node.attr;
        a.insert("tensor_name".into(), attr::value::string(edge));
        a.insert("send_device".into(), attr::value::string(CPU));
        a.insert("send_device_incarnation".into(), attr::value::int(1));
        a.insert("recv_device".into(), attr::value::string(CPU));
        a.insert("client_terminated".into(), attr::value::bool(true));
        a.insert("tensor_type".into(), attr::value::dtype(DType::Float));
        a.insert("T".into(), attr::value::dtype(DType::Float));
        node
    };
    let recv = pair("x", "_Recv", "x:0", vec![]);
    let mut g = Graph::new();
    let one = g.scalar("one", DType::Float, 1.0).unwrap();
    let mut nodes = g.to_graph_def().node;
    let mut add = NodeDef {
        name: "add".into(),
        op: "AddV2".into(),
        input: vec!["x".into(), one.name()],
        ..Default::default()
    };
    add.attr = HashMap::from([("T".into(), attr::value::dtype(DType::Float))]);
    let send = pair("y", "_Send", "y:0", vec!["add".into()]);
    nodes.extend([recv.clone(), add, send.clone()]);
    (nodes, recv, send)
}

#[test]
fn a_receive_runs_inline_only_once_its_value_is_there() {
    let runs = Runs::default();
    let (nodes, recv, send) = recv_add_send();
    let (x, y) = (
        rendezvous_key_of(&recv).unwrap(),
        rendezvous_key_of(&send).unwrap(),
    );
    let exec = executor(nodes, &[], &[], &["y"], &runs);
    let rt = runtime();

    // Fed before the step starts (as RunGraph's `send` does): inline from the second step on.
    for (round, v) in [(0, 1.0f32), (1, 2.0)] {
        let options = options();
        let rendezvous = options.rendezvous.clone().unwrap();
        rendezvous.send(&x, Tensor::scalar(v), false).unwrap();
        let (result, inline) = step(&rt, &exec, vec![], &options, &runs);
        result.unwrap();
        let (out, _) = rt
            .block_on(rendezvous.recv(&y, tokio::time::Instant::now() + Duration::from_secs(5)))
            .unwrap();
        assert_eq!(floats(&out), [v + 1.0]);
        if round == 1 {
            let mut inline = inline;
            inline.sort();
            assert_eq!(inline, ["add", "one", "x", "y"]);
        }
    }

    // Not fed yet: the receive waits on the pool, never on the starting thread, and the step
    // ends once the value comes.
    runs.lock().unwrap().clear();
    let options = options();
    let rendezvous = options.rendezvous.clone().unwrap();
    let running = exec
        .spawn(vec![], &options)
        .expect("starts without waiting");
    rendezvous.send(&x, Tensor::scalar(10.0f32), false).unwrap();
    rt.block_on(running.finish()).unwrap();
    let (out, _) = rt
        .block_on(rendezvous.recv(&y, tokio::time::Instant::now() + Duration::from_secs(5)))
        .unwrap();
    assert_eq!(floats(&out), [11.0]);
    let here = thread::current().id();
    let runs = runs.lock().unwrap();
    let x_run = runs.iter().find(|(name, _)| name == "x").expect("x ran");
    assert_ne!(x_run.1, here, "the receive waited on the starting thread");
}

#[test]
fn a_spawned_step_ends_at_its_deadline_with_deadline_exceeded() {
    let runs = Runs::default();
    let (nodes, _, _) = recv_add_send();
    let exec = executor(nodes, &[], &[], &["y"], &runs);
    // Nobody feeds `x`: the step fails at its deadline, not at the receive's own.
    let started = Instant::now();
    let options = StepOptions {
        deadline: Some(started + Duration::from_millis(300)),
        ..options()
    };
    let err = runtime()
        .block_on(exec.spawn(vec![], &options).unwrap().finish())
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn nothing_runs_inline_past_the_step_budget() {
    let runs = Runs::default();
    let (nodes, y) = add_one();
    let exec = executor(nodes, &["x:0"], &[&y], &[], &runs).with_inline_limits(InlineLimits {
        node: Duration::from_millis(20),
        step: Duration::ZERO,
    });
    let rt = runtime();
    for v in [1.0f32, 2.0, 3.0] {
        let (result, inline) = step(&rt, &exec, vec![Tensor::scalar(v)], &options(), &runs);
        assert_eq!(floats(&result.unwrap()[0]), [v + 1.0]);
        assert!(inline.is_empty(), "ran inline with no budget: {inline:?}");
    }
}
