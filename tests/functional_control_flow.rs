//! Functional control flow as TensorFlow 2.21 writes it in graphs (`tf.while_loop`, `tf.cond`
//! and `tf.function` with eager execution disabled; `tests/data/functional/make_graphs.py`
//! wrote the graphs and the values TensorFlow computed for them): every graph runs twice,
//! once as it is (the `While`/`If`/`PartitionedCall` kernels run its functions) and once
//! after `lower_functional_ops` (the executor runs the v1 `Switch`/`Merge`/`Enter`/`Exit`
//! frames), and both must give TensorFlow's answers. A loop that never ends is cut at the
//! step's deadline either way.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::kernels_support::as_f64s;
use crate::support::cluster::InProcessCluster;
use serde_json::Value;
use tessera::client::Session;
use tessera::device::DeviceType;
use tessera::exec::Executor;
use tessera::graph::attr;
use tessera::graph::lower::lower_functional_ops;
use tessera::kernels::{create_kernel, functional, OpContext};
use tessera::proto::{attr_value, GraphDef};
use tessera::runtime::resource::ResourceMgr;
use tessera::runtime::{CancellationToken, Device, StepOptions};
use tessera::tensor::{DType, Tensor};
use tessera::{Code, Result, Status};

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/functional")
}

fn graph(name: &str) -> GraphDef {
    let bytes = std::fs::read(data_dir().join(format!("{name}.pb"))).unwrap();
    prost::Message::decode(bytes.as_slice()).unwrap()
}

/// How a graph is run.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// As TensorFlow wrote it: the functional kernels run the functions.
    Functional,
    /// After `lower_functional_ops`: v1 control flow in the executor.
    Lowered,
}

const MODES: [Mode; 2] = [Mode::Functional, Mode::Lowered];

/// A graph prepared for one mode, run step after step on one device (whose resources, the
/// variables, outlive the steps).
struct Runner {
    graph: GraphDef,
    device: Arc<Device>,
}

impl Runner {
    fn new(graph: &GraphDef, mode: Mode) -> Self {
        let graph = match mode {
            Mode::Functional => graph.clone(),
            Mode::Lowered => lower_functional_ops(graph).unwrap(),
        };
        Self {
            graph,
            device: Arc::new(Device::local_cpu()),
        }
    }

    fn run_until(
        &self,
        feeds: &[(String, Tensor)],
        fetches: &[&str],
        targets: &[&str],
        deadline: Instant,
    ) -> Result<Vec<Tensor>> {
        let names: Vec<&str> = feeds.iter().map(|(n, _)| n.as_str()).collect();
        let executor = Executor::new(
            &self.graph,
            &names,
            fetches,
            targets,
            self.device.clone(),
            &create_kernel,
        )?;
        let options = StepOptions {
            step_id: 7,
            deadline: Some(deadline),
            ..Default::default()
        };
        executor.run(feeds.iter().map(|(_, t)| t.clone()).collect(), &options)
    }

    fn run(
        &self,
        feeds: &[(String, Tensor)],
        fetches: &[&str],
        targets: &[&str],
    ) -> Result<Vec<Tensor>> {
        self.run_until(
            feeds,
            fetches,
            targets,
            Instant::now() + Duration::from_secs(60),
        )
    }
}

/// The tensor a JSON value feeds to placeholder `name` of `graph`.
fn feed_tensor(graph: &GraphDef, name: &str, v: &Value) -> Tensor {
    let node = name.split(':').next().unwrap();
    let placeholder = graph.node.iter().find(|n| n.name == node).unwrap();
    let dtype = attr::dtype(placeholder, "dtype").unwrap();
    let values: Vec<f64> = match v {
        Value::Array(a) => a.iter().map(|x| x.as_f64().unwrap()).collect(),
        x => vec![x.as_f64().unwrap()],
    };
    let dims: Vec<usize> = match v {
        Value::Array(a) => vec![a.len()],
        _ => vec![],
    };
    match dtype {
        DType::Float => Tensor::from_vec(dims, values.iter().map(|&x| x as f32).collect()),
        DType::Int32 => Tensor::from_vec(dims, values.iter().map(|&x| x as i32).collect()),
        DType::Int64 => Tensor::from_vec(dims, values.iter().map(|&x| x as i64).collect()),
        other => panic!("no feeds of {other} in these graphs"),
    }
    .unwrap()
}

fn expected(v: &Value) -> Vec<f64> {
    match v {
        Value::Array(a) => a.iter().map(|x| x.as_f64().unwrap()).collect(),
        x => vec![x.as_f64().unwrap()],
    }
}

/// Runs `name`'s recorded runs in order, in `mode`, and compares every fetch with
/// TensorFlow's value.
fn replay(name: &str, mode: Mode) {
    let g = graph(name);
    let json: Value =
        serde_json::from_slice(&std::fs::read(data_dir().join(format!("{name}.json"))).unwrap())
            .unwrap();
    let runner = Runner::new(&g, mode);
    for (k, run) in json["runs"].as_array().unwrap().iter().enumerate() {
        let feeds: Vec<(String, Tensor)> = run["feeds"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(n, v)| (n.clone(), feed_tensor(&g, n, v)))
            .collect();
        let strings = |key: &str| -> Vec<String> {
            run[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_string())
                .collect()
        };
        let (fetches, targets) = (strings("fetches"), strings("targets"));
        let fetch_refs: Vec<&str> = fetches.iter().map(String::as_str).collect();
        let target_refs: Vec<&str> = targets.iter().map(String::as_str).collect();
        let out = runner
            .run(&feeds, &fetch_refs, &target_refs)
            .unwrap_or_else(|e| panic!("{name} run {k} ({mode:?}): {e}"));
        for ((fetch, got), want) in fetches
            .iter()
            .zip(&out)
            .zip(run["values"].as_array().unwrap())
        {
            let (got, want) = (as_f64s(got), expected(want));
            assert_eq!(got.len(), want.len(), "{name} run {k} {fetch} ({mode:?})");
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                    "{name} run {k} {fetch} ({mode:?}): got {got:?}, TensorFlow gave {want:?}"
                );
            }
        }
    }
}

/// The ops of a graph, counted.
fn ops(graph: &GraphDef) -> HashMap<&str, usize> {
    let mut ops = HashMap::new();
    for n in &graph.node {
        *ops.entry(n.op.as_str()).or_default() += 1;
    }
    ops
}

#[test]
fn a_stateless_while_computes_fibonacci_as_tensorflow_does() {
    for mode in MODES {
        replay("while_fib", mode);
    }
}

#[test]
fn a_while_with_maximum_iterations_stops_at_the_cap_as_tensorflow_does() {
    // n = 100 runs 7 iterations (the cap): 1 + 4 + ... + 49 = 140, and the vector doubles 7 times.
    for mode in MODES {
        replay("while_squares", mode);
    }
}

#[test]
fn a_cond_inside_a_while_body_counts_collatz_steps_as_tensorflow_does() {
    for mode in MODES {
        replay("while_cond", mode);
    }
}

#[test]
fn calls_of_functions_with_two_outputs_and_with_a_loop_inside_agree_with_tensorflow() {
    for mode in MODES {
        replay("call_two_outputs", mode);
    }
}

#[test]
fn a_while_body_assigning_and_reading_a_resource_variable_agrees_with_tensorflow() {
    // The variable doubles in each iteration and the loop sums what it reads after each
    // assignment; the variable keeps its value between steps; a stateful call adds to it.
    for mode in MODES {
        replay("while_variable", mode);
    }
}

#[test]
fn lowering_leaves_v1_control_flow_with_the_loop_as_a_frame_named_after_it() {
    let g = graph("while_fib");
    let lowered = lower_functional_ops(&g).unwrap();
    let counts = ops(&lowered);
    assert!(!counts.contains_key("StatelessWhile"), "{counts:?}");
    // Six loop variables (counter, maximum, i, a, b and the captured n): each takes Enter,
    // Merge, Switch, Exit and NextIteration, the loop invariants (maximum, n) too.
    for op in ["Enter", "Merge", "Switch", "Exit", "NextIteration"] {
        assert_eq!(counts.get(op), Some(&6), "{op}: {counts:?}");
    }
    assert_eq!(counts.get("LoopCond"), Some(&1));
    for enter in lowered.node.iter().filter(|n| n.op == "Enter") {
        assert_eq!(attr::string_or(enter, "frame_name", "").unwrap(), "fib");
        assert_eq!(attr::int(enter, "parallel_iterations").unwrap(), 10);
        assert!(!attr::bool_or(enter, "is_constant", true).unwrap());
    }
    // The loop's name stays fetchable.
    let fib = lowered.node.iter().find(|n| n.name == "fib").unwrap();
    assert_eq!(fib.op, "IdentityN");

    // A resource loop variable enters once, as a constant of the frame.
    let lowered = lower_functional_ops(&graph("while_variable")).unwrap();
    let constant_enters: Vec<_> = lowered
        .node
        .iter()
        .filter(|n| n.op == "Enter" && attr::bool_or(n, "is_constant", false).unwrap())
        .collect();
    assert_eq!(constant_enters.len(), 1);
    assert_eq!(constant_enters[0].input[0], "v");
    // This loop asked for one iteration at a time.
    for enter in lowered.node.iter().filter(|n| n.op == "Enter") {
        assert_eq!(attr::int(enter, "parallel_iterations").unwrap(), 1);
    }
    let counts = ops(&lowered);
    assert!(!counts.contains_key("While"), "{counts:?}");
    assert!(
        !counts.contains_key("StatefulPartitionedCall"),
        "{counts:?}"
    );
    assert_eq!(counts.get("Merge"), Some(&5), "{counts:?}");

    // The cond inside the loop body is lowered too: no functional op is left.
    let lowered = lower_functional_ops(&graph("while_cond")).unwrap();
    let counts = ops(&lowered);
    for op in ["StatelessIf", "StatelessWhile"] {
        assert!(!counts.contains_key(op), "{op}: {counts:?}");
    }
    assert!(lowered
        .node
        .iter()
        .any(|n| n.name.starts_with("collatz/body/") && n.name.ends_with("/pivot_t")));
}

#[test]
fn a_loop_that_never_ends_is_cut_at_the_step_deadline() {
    let g = graph("while_endless");
    for mode in MODES {
        let runner = Runner::new(&g, mode);
        let started = Instant::now();
        let err = runner
            .run_until(
                &[("x:0".into(), Tensor::scalar(0f32))],
                &["never:0"],
                &[],
                started + Duration::from_millis(300),
            )
            .unwrap_err();
        assert_eq!(err.code(), Code::DeadlineExceeded, "{mode:?}: {err}");
        // Lowered, the executor names the frame still running. As a kernel, the loop names
        // itself unless the executor's own deadline message came first.
        if mode == Mode::Lowered {
            assert!(err.message().contains("`forever`"), "{err}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{mode:?}: took {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn the_while_kernel_stops_at_the_deadline_naming_itself_and_its_iterations() {
    let g = graph("while_endless");
    let node = g.node.iter().find(|n| n.name == "forever").unwrap();
    let kernel =
        functional::create(node, g.library.as_ref(), DeviceType::Cpu, &create_kernel).unwrap();
    let resources = ResourceMgr::new();
    let started = Instant::now();
    let options = StepOptions {
        step_id: 1,
        deadline: Some(started + Duration::from_millis(200)),
        ..Default::default()
    };
    let inputs = vec![
        Tensor::scalar(0i32),
        Tensor::scalar(-1i32),
        Tensor::scalar(0f32),
    ];
    let mut ctx = OpContext::new(node, inputs, &resources, "/device:CPU:0", 1).with_step(&options);
    let err = kernel.compute(&mut ctx).unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    for part in ["`forever`", "StatelessWhile", "iterations", "forever_body"] {
        assert!(err.message().contains(part), "{part}: {err}");
    }
    let iterations: u64 = err
        .message()
        .split("after ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no iteration count in {err}"));
    assert!(iterations > 0, "{err}");
    // It gave up at the deadline, not long after.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // A cancelled step stops the loop too, with the cancellation's reason.
    let token = CancellationToken::new();
    token.cancel(Status::cancelled("the session was closed"));
    let options = StepOptions {
        step_id: 2,
        cancellation: Some(token),
        ..Default::default()
    };
    let inputs = vec![
        Tensor::scalar(0i32),
        Tensor::scalar(-1i32),
        Tensor::scalar(0f32),
    ];
    let mut ctx = OpContext::new(node, inputs, &resources, "/device:CPU:0", 2).with_step(&options);
    let err = kernel.compute(&mut ctx).unwrap_err();
    assert_eq!(err.code(), Code::Cancelled, "{err}");
    assert!(err.message().contains("session was closed"), "{err}");
}

#[test]
fn a_function_missing_from_the_library_is_named_by_lowering_and_by_the_kernel() {
    let mut g = graph("while_fib");
    let library = g.library.as_mut().unwrap();
    library
        .function
        .retain(|f| !f.signature.as_ref().unwrap().name.starts_with("fib_body"));
    let err = lower_functional_ops(&g).unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    for part in ["`fib`", "body `fib_body", "function library"] {
        assert!(err.message().contains(part), "{part}: {err}");
    }
    let err = Runner::new(&g, Mode::Functional)
        .run(&[("n:0".into(), Tensor::scalar(3i32))], &["fib_n:0"], &[])
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    assert!(err.message().contains("`fib`"), "{err}");
}

#[test]
fn a_loop_not_marked_for_lowering_stays_functional_and_runs() {
    // TensorFlow lowers only what `_lower_using_switch_merge` allows.
    let mut g = graph("while_fib");
    let fib = g.node.iter_mut().find(|n| n.name == "fib").unwrap();
    fib.attr.insert(
        "_lower_using_switch_merge".into(),
        tessera::proto::AttrValue {
            value: Some(attr_value::Value::B(false)),
        },
    );
    let lowered = lower_functional_ops(&g).unwrap();
    assert_eq!(ops(&lowered).get("StatelessWhile"), Some(&1));
    let runner = Runner {
        graph: lowered,
        device: Arc::new(Device::local_cpu()),
    };
    let out = runner
        .run(&[("n:0".into(), Tensor::scalar(10i32))], &["fib_n:0"], &[])
        .unwrap();
    assert_eq!(out[0].scalar_value::<i32>().unwrap(), 55);
}

/// TensorFlow's variable loop with the variable on a ps task and everything else on a worker,
/// run through a master over gRPC: as it is (the `While` runs where its variable lives), and
/// lowered before the client sends it (the loop's frame spans both tasks; the reads and
/// assignments inside it run on the ps).
#[test]
fn a_lowered_loop_updating_a_ps_variable_runs_across_tasks() {
    let cluster = InProcessCluster::start(&[("ps", 1), ("worker", 1)]);
    let mut g = graph("while_variable");
    for n in &mut g.node {
        n.device = if n.name == "v" || n.name.starts_with("v/") {
            "/job:ps/task:0".into()
        } else {
            "/job:worker/task:0".into()
        };
    }
    for mode in MODES {
        let g = match mode {
            Mode::Functional => g.clone(),
            Mode::Lowered => lower_functional_ops(&g).unwrap(),
        };
        let session = Session::connect(&cluster.target("worker", 0)).unwrap();
        session.extend(&g).unwrap();
        session.run(&[], &[], &["v/Assign"]).unwrap();
        let scalar = |fetches: &[&str], feeds: &[(&str, Tensor)]| -> Vec<f32> {
            session
                .run(feeds, fetches, &[])
                .unwrap_or_else(|e| panic!("{mode:?}: {e}"))
                .iter()
                .map(|t| t.scalar_value::<f32>().unwrap())
                .collect()
        };
        // TensorFlow's values (while_variable.json): 2 + 4 + 8, then the variable.
        assert_eq!(
            scalar(&["seen:0"], &[("n:0", Tensor::scalar(3i32))]),
            [14.0]
        );
        assert_eq!(scalar(&["read_v:0"], &[]), [8.0], "{mode:?}");
        assert_eq!(
            scalar(&["after_add:0", "tens:0"], &[]),
            [8.5, 5.0],
            "{mode:?}"
        );
        session.close().unwrap();
    }
}
