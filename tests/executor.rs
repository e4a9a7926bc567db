//! The dataflow executor against fake kernels injected through its kernel lookup, so these
//! tests pin down scheduling, pruning and errors without depending on the real kernels.
//!
//! Fake ops (all on f32 scalars):
//! - `Val` (attr `v`): outputs `v`.
//! - `Sum`: outputs the sum of its inputs (0 with none); logs its name.
//! - `Fail`: fails with FAILED_PRECONDITION; `Panic`: panics.
//! - `Meet`: waits until two `Meet` nodes are inside their kernels at once (5 s deadline),
//!   then outputs 1; would fail if the executor ran them one after the other.
//! - `OneOfTwo`: sets output 0 only.
//! - `Placeholder`: fails if it ever runs (it should only be fed).
//! - `Tracked`: outputs a tensor whose buffer counts its drops in `World::dropped`;
//!   `Dropped`: outputs that count (as f32), so a graph can observe when a buffer was freed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tessera::device::DeviceType;
use tessera::exec::Executor;
use tessera::graph::attr;
use tessera::kernels::{OpContext, OpKernel};
use tessera::proto::{GraphDef, NodeDef};
use tessera::runtime::{CancellationToken, Device, StepOptions};
use tessera::tensor::{DType, PartialShape, Shape, Tensor};
use tessera::{Code, Result, Status};

/// What the fake kernels share with the test: a log of the nodes run and the factory calls.
#[derive(Default)]
struct World {
    ran: Mutex<Vec<String>>,
    created: AtomicUsize,
    meeting: Mutex<usize>,
    met: Condvar,
    dropped: Arc<AtomicUsize>,
}

/// A tensor buffer that counts its drop.
struct TrackedBuffer {
    bytes: [u8; 4],
    dropped: Arc<AtomicUsize>,
}

impl AsRef<[u8]> for TrackedBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for TrackedBuffer {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

impl World {
    fn ran(&self) -> Vec<String> {
        self.ran.lock().unwrap().clone()
    }
}

struct Fake {
    op: String,
    world: Arc<World>,
}

impl OpKernel for Fake {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        self.world.ran.lock().unwrap().push(ctx.node().name.clone());
        match self.op.as_str() {
            "Val" => {
                let v = attr::float_or(ctx.node(), "v", 0.0)?;
                ctx.set_output(0, Tensor::scalar(v));
            }
            "Sum" => {
                let mut sum = 0.0f32;
                for t in ctx.inputs() {
                    sum += t.scalar_value::<f32>()?;
                }
                ctx.set_output(0, Tensor::scalar(sum));
            }
            "Fail" => return Err(Status::failed_precondition("the fake kernel fails")),
            "Panic" => panic!("the fake kernel panics"),
            "Meet" => {
                let deadline = Instant::now() + Duration::from_secs(5);
                let mut inside = self.world.meeting.lock().unwrap();
                *inside += 1;
                self.world.met.notify_all();
                while *inside < 2 {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(Status::deadline_exceeded("the other Meet node never came"));
                    }
                    inside = self.world.met.wait_timeout(inside, left).unwrap().0;
                }
                ctx.set_output(0, Tensor::scalar(1.0f32));
            }
            "OneOfTwo" => ctx.set_output(0, Tensor::scalar(1.0f32)),
            "Tracked" => {
                let buffer = TrackedBuffer {
                    bytes: 2f32.to_le_bytes(),
                    dropped: self.world.dropped.clone(),
                };
                let t =
                    Tensor::from_bytes(DType::Float, Shape::scalar(), Bytes::from_owner(buffer));
                ctx.set_output(0, t?);
            }
            "Dropped" => {
                let dropped = self.world.dropped.load(Ordering::SeqCst);
                ctx.set_output(0, Tensor::scalar(dropped as f32));
            }
            "Placeholder" => {
                return Err(Status::invalid_argument("placeholder ran but must be fed"))
            }
            other => unreachable!("no fake op {other}"),
        }
        Ok(())
    }
}

/// Builds executors over `graph` with the fake kernels.
struct Fixture {
    graph: GraphDef,
    world: Arc<World>,
    device: Arc<Device>,
}

impl Fixture {
    fn new(nodes: Vec<NodeDef>) -> Self {
        Self {
            graph: GraphDef {
                node: nodes,
                ..Default::default()
            },
            world: Arc::default(),
            device: Arc::new(Device::local_cpu()),
        }
    }

    fn executor(&self, feeds: &[&str], fetches: &[&str], targets: &[&str]) -> Result<Executor> {
        let world = self.world.clone();
        let lookup = move |node: &NodeDef, device: DeviceType| -> Result<Arc<dyn OpKernel>> {
            assert_eq!(device, DeviceType::Cpu);
            world.created.fetch_add(1, Ordering::SeqCst);
            Ok(Arc::new(Fake {
                op: node.op.clone(),
                world: world.clone(),
            }))
        };
        Executor::new(
            &self.graph,
            feeds,
            fetches,
            targets,
            self.device.clone(),
            &lookup,
        )
    }
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

fn placeholder(name: &str, dtype: DType, shape: PartialShape) -> NodeDef {
    let mut n = node(name, "Placeholder", &[]);
    n.attr = HashMap::from([
        ("dtype".to_string(), attr::value::dtype(dtype)),
        ("shape".to_string(), attr::value::shape(&shape)),
    ]);
    n
}

fn scalars(tensors: &[Tensor]) -> Vec<f32> {
    tensors
        .iter()
        .map(|t| t.scalar_value::<f32>().unwrap())
        .collect()
}

fn step() -> StepOptions {
    StepOptions {
        step_id: 1,
        ..Default::default()
    }
}

#[test]
fn only_the_nodes_the_fetches_need_are_created_and_run() {
    let f = Fixture::new(vec![
        val("a", 1.0),
        val("b", 2.0),
        node("c", "Sum", &["a", "b:0"]),
        node("unneeded", "Sum", &["a"]),
        node("broken", "Fail", &[]),
    ]);
    let exec = f.executor(&[], &["c:0"], &[]).unwrap();
    assert_eq!(
        f.world.created.load(Ordering::SeqCst),
        3,
        "kernels for a, b, c only"
    );
    assert_eq!(scalars(&exec.run(vec![], &step()).unwrap()), [3.0]); // 1 + 2
    let mut ran = f.world.ran();
    ran.sort();
    assert_eq!(ran, ["a", "b", "c"]);
}

#[test]
fn a_fed_tensor_replaces_its_producer() {
    let f = Fixture::new(vec![
        placeholder("x", DType::Float, PartialShape::new(vec![])),
        val("b", 2.0),
        node("y", "Sum", &["x", "b"]),
        node("broken", "Fail", &[]),
        node("z", "Sum", &["broken", "b"]),
    ]);
    let exec = f
        .executor(&["x:0", "broken:0"], &["y", "z", "x"], &[])
        .unwrap();
    let out = exec
        .run(
            vec![Tensor::scalar(5.0f32), Tensor::scalar(10.0f32)],
            &step(),
        )
        .unwrap();
    // y = 5 + 2, z = 10 + 2, and a fetched feed comes back as fed.
    assert_eq!(scalars(&out), [7.0, 12.0, 5.0]);
    assert!(
        !f.world.ran().iter().any(|n| n == "x" || n == "broken"),
        "ran: {:?}",
        f.world.ran()
    );
}

#[test]
fn control_inputs_order_nodes_and_targets_run_without_fetches() {
    // r3 waits on r2, which waits on r1; none passes data.
    let f = Fixture::new(vec![
        node("r3", "Sum", &["^r2"]),
        node("r2", "Sum", &["^r1"]),
        node("r1", "Sum", &[]),
        node("other", "Sum", &[]),
    ]);
    let exec = f.executor(&[], &[], &["r3"]).unwrap();
    for _ in 0..20 {
        assert!(exec.run(vec![], &step()).unwrap().is_empty());
    }
    let ran = f.world.ran();
    assert_eq!(ran.len(), 60);
    for chunk in ran.chunks(3) {
        assert_eq!(chunk, ["r1", "r2", "r3"]);
    }
}

#[test]
fn independent_nodes_run_at_the_same_time() {
    // Each Meet waits for the other inside its kernel: run one after the other, the first
    // would time out after 5 s and fail the step.
    let f = Fixture::new(vec![
        node("m1", "Meet", &[]),
        node("m2", "Meet", &[]),
        node("both", "Sum", &["m1", "m2"]),
    ]);
    let exec = f.executor(&[], &["both"], &[]).unwrap();
    assert_eq!(scalars(&exec.run(vec![], &step()).unwrap()), [2.0]);
}

#[test]
fn independent_nodes_behind_one_producer_also_meet() {
    // The fan-out case: one node makes both Meets ready at once.
    let f = Fixture::new(vec![
        val("src", 0.0),
        node("m1", "Meet", &["^src"]),
        node("m2", "Meet", &["^src"]),
        node("both", "Sum", &["m1", "m2"]),
    ]);
    let exec = f.executor(&[], &["both"], &[]).unwrap();
    assert_eq!(scalars(&exec.run(vec![], &step()).unwrap()), [2.0]);
}

#[test]
fn the_first_error_stops_the_step_and_names_the_node() {
    let f = Fixture::new(vec![
        val("v", 1.0),
        node("bad", "Fail", &["v"]),
        node("after", "Sum", &["bad"]),
        node("also_after", "Sum", &["^bad"]),
    ]);
    let exec = f.executor(&[], &["after"], &["also_after"]).unwrap();
    let err = exec.run(vec![], &step()).unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("`bad`"), "{err}");
    assert_eq!(f.world.ran(), ["v", "bad"]);
    // The executor is still usable: the next step fails the same way, it does not hang.
    assert_eq!(
        exec.run(vec![], &step()).unwrap_err().code(),
        Code::FailedPrecondition
    );
}

#[test]
fn a_panicking_kernel_fails_the_step_as_internal() {
    let f = Fixture::new(vec![node("boom", "Panic", &[]), node("fine", "Sum", &[])]);
    let exec = f.executor(&[], &[], &["boom", "fine"]).unwrap();
    let err = exec.run(vec![], &step()).unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    assert!(err.message().contains("`boom`"), "{err}");
}

#[test]
fn kernels_are_created_once_and_reused_across_steps() {
    let f = Fixture::new(vec![
        placeholder("x", DType::Float, PartialShape::unknown()),
        val("one", 1.0),
        node("y", "Sum", &["x", "one"]),
    ]);
    let exec = f.executor(&["x"], &["y"], &[]).unwrap();
    for i in 0..5 {
        let out = exec.run(vec![Tensor::scalar(i as f32)], &step()).unwrap();
        assert_eq!(scalars(&out), [i as f32 + 1.0]);
    }
    assert_eq!(
        f.world.created.load(Ordering::SeqCst),
        2,
        "one and y, once each"
    );
}

#[test]
fn steps_may_run_concurrently_on_one_executor() {
    let f = Fixture::new(vec![
        placeholder("x", DType::Float, PartialShape::unknown()),
        val("ten", 10.0),
        node("a", "Sum", &["x", "ten"]),
        node("b", "Sum", &["x", "x"]),
        node("y", "Sum", &["a", "b"]),
    ]);
    let exec = Arc::new(f.executor(&["x"], &["y"], &[]).unwrap());
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let exec = exec.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    let x = (t * 100 + i) as f32;
                    let out = exec.run(vec![Tensor::scalar(x)], &step()).unwrap();
                    assert_eq!(scalars(&out), [3.0 * x + 10.0]); // (x + 10) + (x + x)
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn unknown_names_are_not_found_and_name_themselves() {
    let f = Fixture::new(vec![val("a", 1.0)]);
    for (feeds, fetches, targets, named) in [
        (&[][..], &["nope:0"][..], &[][..], "nope"),
        (&["ghost:0"][..], &["a"][..], &[][..], "ghost"),
        (&[][..], &["a"][..], &["missing"][..], "missing"),
    ] {
        let err = f
            .executor(feeds, fetches, targets)
            .err()
            .expect("unknown name");
        assert_eq!(err.code(), Code::NotFound, "{err}");
        assert!(err.message().contains(named), "{err}");
    }
}

#[test]
fn feeding_one_tensor_twice_is_rejected() {
    let f = Fixture::new(vec![placeholder(
        "x",
        DType::Float,
        PartialShape::unknown(),
    )]);
    let err = f
        .executor(&["x", "x:0"], &["x"], &[])
        .err()
        .expect("duplicate feed");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("Duplicated feeds"), "{err}");
}

#[test]
fn a_feed_of_the_wrong_dtype_or_shape_names_the_feed() {
    let f = Fixture::new(vec![
        placeholder("x", DType::Float, PartialShape::new(vec![Some(2)])),
        node("y", "Sum", &["x"]),
    ]);
    let exec = f.executor(&["x"], &["y"], &[]).unwrap();
    let err = exec.run(vec![Tensor::scalar(1i32)], &step()).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("x:0") && err.message().contains("int32"),
        "{err}"
    );
    let err = exec.run(
        vec![Tensor::from_vec([3], vec![1f32, 2., 3.]).unwrap()],
        &step(),
    );
    assert!(err.unwrap_err().message().contains("x:0"));
    let err = exec.run(vec![], &step()).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(f.world.ran().is_empty());
}

#[test]
fn cycles_are_rejected_before_any_kernel_is_created() {
    let f = Fixture::new(vec![
        val("a", 1.0),
        node("p", "Sum", &["a", "q"]),
        node("q", "Sum", &["^p"]),
        node("out", "Sum", &["q"]),
    ]);
    let err = f.executor(&[], &["out"], &[]).err().expect("cycle");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("cycle") && err.message().contains("`p`"),
        "{err}"
    );
    assert_eq!(f.world.created.load(Ordering::SeqCst), 0);
}

#[test]
fn an_input_naming_no_node_is_invalid() {
    let f = Fixture::new(vec![node("y", "Sum", &["ghost:1"])]);
    let err = f.executor(&[], &["y"], &[]).err().expect("dangling input");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("`y`") && err.message().contains("ghost"),
        "{err}"
    );
}

#[test]
fn a_missing_output_is_internal_and_names_both_nodes() {
    let f = Fixture::new(vec![
        node("pair", "OneOfTwo", &[]),
        node("user", "Sum", &["pair:1"]),
    ]);
    let err = f
        .executor(&[], &["user"], &[])
        .unwrap()
        .run(vec![], &step())
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    assert!(
        err.message().contains("`pair`") && err.message().contains("`user`"),
        "{err}"
    );
    // Fetching the missing output directly names the fetch.
    let err = f
        .executor(&[], &["pair:1"], &[])
        .unwrap()
        .run(vec![], &step())
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    assert!(err.message().contains("pair:1"), "{err}");
}

#[test]
fn a_cancelled_step_starts_nothing() {
    let f = Fixture::new(vec![val("a", 1.0)]);
    let exec = f.executor(&[], &["a"], &[]).unwrap();
    let token = CancellationToken::new();
    token.cancel(Status::cancelled("session closed"));
    let options = StepOptions {
        cancellation: Some(token),
        ..step()
    };
    let err = exec.run(vec![], &options).unwrap_err();
    assert_eq!(err, Status::cancelled("session closed"));
    assert!(f.world.ran().is_empty());
}

#[test]
fn a_step_past_its_deadline_fails_with_deadline_exceeded() {
    let f = Fixture::new(vec![node("m", "Meet", &[]), node("after", "Sum", &["m"])]);
    let exec = f.executor(&[], &["after"], &[]).unwrap();
    // A deadline already past: nothing starts (the lone Meet would otherwise wait 5 s).
    let options = StepOptions {
        deadline: Some(Instant::now()),
        ..step()
    };
    assert_eq!(
        exec.run(vec![], &options).unwrap_err().code(),
        Code::DeadlineExceeded
    );
    assert!(f.world.ran().is_empty());

    // A kernel blocked past the deadline: the step returns at the deadline, well before the
    // kernel's own 5 s, and the kernel finishes in the background.
    let start = Instant::now();
    let options = StepOptions {
        deadline: Some(start + Duration::from_millis(200)),
        ..step()
    };
    let err = exec.run(vec![], &options).unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(f.world.ran(), ["m"]);
}

#[test]
fn outputs_are_freed_after_their_last_reader_unless_fetched() {
    // t's buffer is read by u only; u and v run before w (control edges), so by the time w
    // runs, t's output must have been dropped. f is fetched: kept to the end of the step.
    let f = Fixture::new(vec![
        node("t", "Tracked", &[]),
        node("u", "Sum", &["t", "t"]),
        node("w", "Dropped", &["^u"]),
        node("f", "Tracked", &[]),
        node("x", "Sum", &["f"]),
        node("y", "Dropped", &["^x"]),
    ]);
    let exec = f.executor(&[], &["u", "w"], &[]).unwrap();
    // u = 2 + 2; w saw one buffer dropped (t's), with u's two reads done.
    assert_eq!(scalars(&exec.run(vec![], &step()).unwrap()), [4.0, 1.0]);
    assert_eq!(f.world.dropped.load(Ordering::SeqCst), 1);

    let g = Fixture::new(f.graph.node.clone());
    let exec = g.executor(&[], &["f", "y"], &[]).unwrap();
    let out = exec.run(vec![], &step()).unwrap();
    // y ran after x read f, yet f's buffer lives on in the fetch.
    assert_eq!(scalars(&out), [2.0, 0.0]);
    assert_eq!(g.world.dropped.load(Ordering::SeqCst), 0);
    drop(out);
    assert_eq!(g.world.dropped.load(Ordering::SeqCst), 1);
}

#[test]
fn executors_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Executor>();
}
