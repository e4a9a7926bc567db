//! The in-process session: graph growth, executor caching, callables, close, placement.
//!
//! The first tests inject fake kernels (`Val` outputs its `v` attr, `Sum` adds its f32 scalar
//! inputs, `Gate` blocks until the test opens it) so they pin down the session itself; the
//! last ones run TensorFlow graphs on the real CPU kernels (Const, MatMul, AddV2, resource
//! variables) through `Session::local()` and shared devices.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera::client::{Session, SessionOptions};
use tessera::device::DeviceType;
use tessera::graph::attr;
use tessera::kernels::KernelLookup;
use tessera::kernels::{OpContext, OpKernel};
use tessera::proto::{CallableOptions, GraphDef, NodeDef};
use tessera::runtime::Device;
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::{Code, Result, Status};

/// Shared with the fake kernels: factory calls, and the gate's channels.
#[derive(Default)]
struct World {
    created: AtomicUsize,
    gate_entered: Mutex<Option<mpsc::Sender<()>>>,
    gate_open: Mutex<Option<mpsc::Receiver<()>>>,
}

struct Fake {
    op: String,
    world: Arc<World>,
}

impl OpKernel for Fake {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        match self.op.as_str() {
            "Val" => ctx.set_output(0, Tensor::scalar(attr::float_or(ctx.node(), "v", 0.0)?)),
            "Sum" => {
                let mut sum = 0.0f32;
                for t in ctx.inputs() {
                    sum += t.scalar_value::<f32>()?;
                }
                ctx.set_output(0, Tensor::scalar(sum));
            }
            "Gate" => {
                if let Some(entered) = self.world.gate_entered.lock().unwrap().take() {
                    entered.send(()).ok();
                }
                let open = self.world.gate_open.lock().unwrap().take();
                if let Some(open) = open {
                    open.recv_timeout(Duration::from_secs(10))
                        .map_err(|_| Status::deadline_exceeded("the gate was never opened"))?;
                }
                ctx.set_output(0, Tensor::scalar(0.0f32));
            }
            other => return Err(Status::unimplemented(format!("no fake op {other}"))),
        }
        Ok(())
    }
}

fn fake_kernels(world: &Arc<World>) -> Arc<KernelLookup> {
    let world = world.clone();
    Arc::new(
        move |node: &NodeDef, _: DeviceType| -> Result<Arc<dyn OpKernel>> {
            world.created.fetch_add(1, Ordering::SeqCst);
            Ok(Arc::new(Fake {
                op: node.op.clone(),
                world: world.clone(),
            }))
        },
    )
}

fn session(world: &Arc<World>, soft: bool) -> Session {
    let options = SessionOptions {
        allow_soft_placement: soft,
        kernels: fake_kernels(world),
        ..SessionOptions::default()
    };
    Session::with_options(Arc::new(Device::local_cpu()), options)
}

fn node(name: &str, op: &str, inputs: &[&str]) -> NodeDef {
    NodeDef {
        name: name.into(),
        op: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn val(name: &str, v: f32) -> NodeDef {
    let mut n = node(name, "Val", &[]);
    n.attr = HashMap::from([("v".to_string(), attr::value::float(v))]);
    n
}

fn graph(nodes: Vec<NodeDef>) -> GraphDef {
    GraphDef {
        node: nodes,
        ..Default::default()
    }
}

fn scalars(tensors: &[Tensor]) -> Vec<f32> {
    tensors
        .iter()
        .map(|t| t.scalar_value::<f32>().unwrap())
        .collect()
}

/// a = 1, b = 2, s = a + b, t = s + b.
fn sums() -> GraphDef {
    graph(vec![
        val("a", 1.0),
        val("b", 2.0),
        node("s", "Sum", &["a", "b"]),
        node("t", "Sum", &["s", "b"]),
    ])
}

#[test]
fn sessions_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Session>();
}

#[test]
fn feeds_in_any_order_and_spelling_reuse_one_executor() {
    let world = Arc::default();
    let sess = session(&world, true);
    sess.extend(&sums()).unwrap();
    // Feeding a and b: t = (a + b) + b.
    let out = sess.run(
        &[("a", Tensor::scalar(10f32)), ("b:0", Tensor::scalar(1f32))],
        &["t", "s"],
        &[],
    );
    assert_eq!(scalars(&out.unwrap()), [12.0, 11.0]);
    let built = world.created.load(Ordering::SeqCst);
    assert_eq!(built, 2, "s and t only: a and b are fed");
    let out = sess.run(
        &[("b", Tensor::scalar(3f32)), ("a:0", Tensor::scalar(4f32))],
        &["t", "s"],
        &[],
    );
    assert_eq!(scalars(&out.unwrap()), [10.0, 7.0]);
    assert_eq!(
        world.created.load(Ordering::SeqCst),
        built,
        "the cached executor was reused"
    );
    // Another signature builds another executor.
    assert_eq!(scalars(&sess.run(&[], &["t"], &[]).unwrap()), [5.0]);
    assert_eq!(world.created.load(Ordering::SeqCst), built + 4);
}

#[test]
fn duplicated_feeds_are_rejected() {
    let world = Arc::default();
    let sess = session(&world, true);
    sess.extend(&sums()).unwrap();
    let feeds = [("a", Tensor::scalar(1f32)), ("a:0", Tensor::scalar(2f32))];
    let err = sess.run(&feeds, &["s"], &[]).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("Duplicated feeds"), "{err}");
}

#[test]
fn extend_adds_nodes_bumps_the_version_and_rejects_taken_names() {
    let world = Arc::default();
    let sess = session(&world, true);
    assert_eq!(sess.graph_version(), 0);
    sess.extend(&sums()).unwrap();
    assert_eq!(sess.graph_version(), 1);
    assert_eq!(scalars(&sess.run(&[], &["t"], &[]).unwrap()), [5.0]); // (1 + 2) + 2

    // A taken name fails naming it, and nothing of that graph is added.
    let err = sess
        .extend(&graph(vec![val("fresh", 7.0), val("b", 9.0)]))
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("`b`"), "{err}");
    assert_eq!(sess.graph_version(), 1);
    assert_eq!(
        sess.run(&[], &["fresh"], &[]).unwrap_err().code(),
        Code::NotFound
    );

    // New nodes may consume old ones; executors of the old version are rebuilt on next use.
    let before = world.created.load(Ordering::SeqCst);
    sess.extend(&graph(vec![val("c", 4.0), node("u", "Sum", &["t", "c"])]))
        .unwrap();
    assert_eq!(sess.graph_version(), 2);
    assert_eq!(
        scalars(&sess.run(&[], &["u", "t"], &[]).unwrap()),
        [9.0, 5.0]
    );
    assert_eq!(scalars(&sess.run(&[], &["t"], &[]).unwrap()), [5.0]);
    // a, b, s, t, c, u for the first run; a, b, s, t again for the second.
    assert_eq!(world.created.load(Ordering::SeqCst) - before, 6 + 4);
}

#[test]
fn callables_take_feeds_and_give_fetches_in_their_options_order() {
    let world = Arc::default();
    let sess = session(&world, true);
    sess.extend(&sums()).unwrap();
    let options = CallableOptions {
        feed: vec!["b".into(), "a:0".into()],
        fetch: vec!["t".into(), "s:0".into(), "b".into()],
        ..Default::default()
    };
    let handle = sess.make_callable(options).unwrap();
    let built = world.created.load(Ordering::SeqCst);
    for (a, b) in [(1f32, 10f32), (5., 0.5)] {
        let out = sess
            .run_callable(handle, vec![Tensor::scalar(b), Tensor::scalar(a)])
            .unwrap();
        assert_eq!(scalars(&out), [a + 2.0 * b, a + b, b]);
    }
    assert_eq!(
        world.created.load(Ordering::SeqCst),
        built,
        "built once, at make_callable"
    );
    let err = sess
        .run_callable(handle, vec![Tensor::scalar(1f32)])
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "one feed short: {err}");

    sess.release_callable(handle).unwrap();
    sess.release_callable(handle).unwrap();
    let err = sess.run_callable(handle, vec![]).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains(&handle.to_string()), "{err}");
    assert_eq!(
        sess.run_callable(12345, vec![]).unwrap_err().code(),
        Code::InvalidArgument
    );
}

#[test]
fn every_call_after_close_fails_with_failed_precondition() {
    let world = Arc::default();
    let sess = session(&world, true);
    sess.extend(&sums()).unwrap();
    let handle = sess.make_callable(CallableOptions {
        fetch: vec!["s".into()],
        ..Default::default()
    });
    let handle = handle.unwrap();
    sess.close().unwrap();
    sess.close().unwrap();
    let errors = [
        sess.run(&[], &["s"], &[]).unwrap_err(),
        sess.extend(&graph(vec![val("z", 1.0)])).unwrap_err(),
        sess.make_callable(CallableOptions::default()).unwrap_err(),
        sess.run_callable(handle, vec![]).unwrap_err(),
        sess.release_callable(handle).unwrap_err(),
    ];
    for err in errors {
        assert_eq!(err.code(), Code::FailedPrecondition);
        assert!(err.message().contains("Session is closed"), "{err}");
    }
}

#[test]
fn close_cancels_a_running_step_and_waits_for_it() {
    // gate blocks until opened; after consumes it. Close while gate runs: gate finishes,
    // after never starts, and the step fails with CANCELLED.
    let world: Arc<World> = Arc::default();
    let (entered_tx, entered_rx) = mpsc::channel();
    let (open_tx, open_rx) = mpsc::channel();
    *world.gate_entered.lock().unwrap() = Some(entered_tx);
    *world.gate_open.lock().unwrap() = Some(open_rx);
    let sess = Arc::new(session(&world, true));
    sess.extend(&graph(vec![
        node("gate", "Gate", &[]),
        node("after", "Sum", &["gate"]),
    ]))
    .unwrap();

    let stepper = {
        let sess = sess.clone();
        std::thread::spawn(move || sess.run(&[], &["after"], &[]))
    };
    entered_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the gate kernel started");
    let closer = {
        let sess = sess.clone();
        std::thread::spawn(move || sess.close())
    };
    // Once a call sees the session closed, close has cancelled the step (both happen under
    // one lock); only then open the gate.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sess.run(&[], &[], &[]).is_ok() {
        assert!(Instant::now() < deadline, "close never took effect");
        std::thread::yield_now();
    }
    open_tx.send(()).unwrap();
    let err = stepper.join().unwrap().unwrap_err();
    assert_eq!(err.code(), Code::Cancelled, "{err}");
    assert!(err.message().contains("Close"), "{err}");
    closer.join().unwrap().unwrap();
}

#[test]
fn requested_devices_are_ignored_under_soft_placement_only() {
    let mut remote = val("on_ps", 3.0);
    remote.device = "/job:ps/replica:0/task:0/device:CPU:0".into();
    let mut here = val("here", 1.0);
    here.device = "/job:localhost/device:CPU:0".into();
    let g = graph(vec![remote, here, node("sum", "Sum", &["on_ps", "here"])]);

    let world = Arc::default();
    let soft = session(&world, true);
    soft.extend(&g).unwrap();
    assert_eq!(scalars(&soft.run(&[], &["sum"], &[]).unwrap()), [4.0]);

    let strict = session(&world, false);
    strict.extend(&g).unwrap();
    assert_eq!(scalars(&strict.run(&[], &["here"], &[]).unwrap()), [1.0]);
    let err = strict.run(&[], &["sum"], &[]).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("`on_ps`") && err.message().contains("/job:ps"),
        "{err}"
    );
}

#[test]
fn threads_may_run_steps_on_one_session_at_once() {
    let world = Arc::default();
    let sess = Arc::new(session(&world, true));
    sess.extend(&sums()).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let sess = sess.clone();
            std::thread::spawn(move || {
                for j in 0..25 {
                    let a = (i * 100 + j) as f32;
                    let out = sess.run(&[("a", Tensor::scalar(a))], &["t"], &[]).unwrap();
                    assert_eq!(scalars(&out), [a + 4.0]); // (a + 2) + 2
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

// ---- Real kernels ----------------------------------------------------------------------

/// A node with `T` = float and these extra attrs.
fn op(name: &str, op_name: &str, inputs: &[&str]) -> NodeDef {
    let mut n = node(name, op_name, inputs);
    n.attr.insert("T".into(), attr::value::dtype(DType::Float));
    n
}

fn constant(name: &str, value: Tensor) -> NodeDef {
    let mut n = node(name, "Const", &[]);
    n.attr
        .insert("dtype".into(), attr::value::dtype(value.dtype()));
    n.attr
        .insert("value".into(), attr::value::tensor(value.to_proto()));
    n
}

fn matrix(rows: usize, values: Vec<f32>) -> Tensor {
    let cols = values.len() / rows;
    Tensor::from_vec([rows, cols], values).unwrap()
}

fn floats(t: &Tensor) -> Vec<f32> {
    t.values::<f32>().unwrap().to_vec()
}

/// v: a float [2] resource variable; init assigns [1, 2]; read reads it; step subtracts
/// 0.5 from each element; apply does v -= 0.1 * [10, 20] with ResourceApplyGradientDescent.
fn variable_graph(device: &str) -> GraphDef {
    let mut v = node("v", "VarHandleOp", &[]);
    v.device = device.into();
    v.attr
        .insert("shared_name".into(), attr::value::string("v"));
    v.attr.insert("container".into(), attr::value::string(""));
    v.attr
        .insert("dtype".into(), attr::value::dtype(DType::Float));
    v.attr.insert(
        "shape".into(),
        attr::value::shape(&PartialShape::new(vec![Some(2)])),
    );
    let with_dtype = |mut n: NodeDef| {
        n.attr
            .insert("dtype".into(), attr::value::dtype(DType::Float));
        n
    };
    graph(vec![
        v,
        constant("init_value", Tensor::from_vec([2], vec![1f32, 2.]).unwrap()),
        with_dtype(node("init", "AssignVariableOp", &["v", "init_value"])),
        with_dtype(node("read", "ReadVariableOp", &["v"])),
        constant("half", Tensor::from_vec([2], vec![0.5f32, 0.5]).unwrap()),
        with_dtype(node("step", "AssignSubVariableOp", &["v", "half"])),
        constant("lr", Tensor::scalar(0.1f32)),
        constant("grad", Tensor::from_vec([2], vec![10f32, 20.]).unwrap()),
        op(
            "apply",
            "ResourceApplyGradientDescent",
            &["v", "lr", "grad"],
        ),
    ])
}

#[test]
fn a_local_session_runs_matmul_and_addv2() {
    let sess = Session::local();
    assert_eq!(
        sess.device().expect("a local session has a device").name(),
        "/job:localhost/replica:0/task:0/device:CPU:0"
    );
    let mut x = node("x", "Placeholder", &[]);
    x.attr
        .insert("dtype".into(), attr::value::dtype(DType::Float));
    x.attr.insert(
        "shape".into(),
        attr::value::shape(&PartialShape::new(vec![None, Some(2)])),
    );
    sess.extend(&graph(vec![
        constant("a", matrix(2, vec![1., 2., 3., 4.])),
        constant("b", matrix(2, vec![5., 6., 7., 8.])),
        op("c", "MatMul", &["a", "b"]),
        op("d", "AddV2", &["c", "a"]),
        x,
        op("y", "MatMul", &["x", "b"]),
    ]))
    .unwrap();
    let out = sess.run(&[], &["d", "c:0"], &[]).unwrap();
    // [[1,2],[3,4]] x [[5,6],[7,8]] = [[1*5+2*7, 1*6+2*8], [3*5+4*7, 3*6+4*8]].
    assert_eq!(floats(&out[1]), [19., 22., 43., 50.]);
    assert_eq!(out[1].dims(), [2, 2]);
    assert_eq!(floats(&out[0]), [20., 24., 46., 54.]);

    // A fed placeholder: [[1, 0], [0, 2]] x b = [[5, 6], [14, 16]].
    let feed = matrix(2, vec![1., 0., 0., 2.]);
    let out = sess.run(&[("x:0", feed)], &["y"], &[]).unwrap();
    assert_eq!(floats(&out[0]), [5., 6., 14., 16.]);
    // An unfed placeholder fails naming it; a badly shaped feed names the feed.
    let err = sess.run(&[], &["y"], &[]).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("'x'") || err.message().contains("`x`"),
        "{err}"
    );
    let err = sess
        .run(&[("x", matrix(1, vec![1., 2., 3.]))], &["y"], &[])
        .unwrap_err();
    assert!(err.message().contains("x:0"), "{err}");
}

#[test]
fn variables_must_be_initialized_then_update_in_place() {
    // The variable asks for a ps device: under soft placement it runs on the local CPU.
    let sess = Session::local();
    sess.extend(&variable_graph("/job:ps/replica:0/task:0/device:CPU:0"))
        .unwrap();
    let err = sess.run(&[], &["read"], &[]).unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(
        err.message().contains("`read`") && err.message().contains("`v`"),
        "{err}"
    );

    sess.run(&[], &[], &["init"]).unwrap();
    assert_eq!(floats(&sess.run(&[], &["read"], &[]).unwrap()[0]), [1., 2.]);
    sess.run(&[], &[], &["step"]).unwrap();
    sess.run(&[], &[], &["step"]).unwrap();
    assert_eq!(floats(&sess.run(&[], &["read"], &[]).unwrap()[0]), [0., 1.]); // [1, 2] - 2 * 0.5
    sess.run(&[], &[], &["init"]).unwrap();
    sess.run(&[], &[], &["apply"]).unwrap();
    // [1, 2] - 0.1 * [10, 20] = [0, 0].
    let after = floats(&sess.run(&[], &["read"], &[]).unwrap()[0]);
    assert!(after.iter().all(|v| v.abs() < 1e-6), "{after:?}");
}

#[test]
fn sessions_on_one_device_share_variables_and_local_sessions_do_not() {
    let device = Arc::new(Device::local_cpu());
    let first = Session::on_device(device.clone());
    first.extend(&variable_graph("")).unwrap();
    first.run(&[], &[], &["init"]).unwrap();
    first.close().unwrap();

    let second = Session::on_device(device.clone());
    second.extend(&variable_graph("")).unwrap();
    assert_eq!(
        floats(&second.run(&[], &["read"], &[]).unwrap()[0]),
        [1., 2.]
    );

    let local = Session::local();
    local.extend(&variable_graph("")).unwrap();
    assert_eq!(
        local.run(&[], &["read"], &[]).unwrap_err().code(),
        Code::FailedPrecondition
    );
}
