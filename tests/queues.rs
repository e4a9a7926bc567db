//! Queues and conditional accumulators: TensorFlow's semantics (FIFO order, enqueue/dequeue
//! many, capacity, close, stale gradients, averages), and the bounded waits tessera adds
//! (deadline errors naming the queue or accumulator, cancellation). Every wait is bounded.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use prost::Message;
use tessera::client::{Session, SessionOptions};
use tessera::device::DeviceType;
use tessera::graph::Graph;
use tessera::kernels::create_kernel;
use tessera::proto::GraphDef;
use tessera::runtime::accumulator::{ConditionalAccumulator, Reduction};
use tessera::runtime::queue::FifoQueue;
use tessera::runtime::wait::Wait;
use tessera::runtime::Device;
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::Code;

const LONG: Duration = Duration::from_secs(10);

fn scalar_queue(capacity: Option<usize>) -> FifoQueue {
    FifoQueue::new(
        "q",
        vec![DType::Int64],
        vec![PartialShape::new(Vec::<Option<usize>>::new())],
        capacity,
        LONG,
    )
    .unwrap()
}

fn i64s(t: &Tensor) -> Vec<i64> {
    t.values::<i64>().unwrap().into_owned()
}

#[test]
fn elements_leave_in_the_order_they_entered_singly_and_many_at_a_time() {
    let q = scalar_queue(None);
    let w = Wait::for_duration(LONG);
    q.enqueue(vec![Tensor::scalar(1i64)], &w).unwrap();
    q.enqueue_many(vec![Tensor::from_vec([3], vec![2i64, 3, 4]).unwrap()], &w)
        .unwrap();
    assert_eq!(q.size(), 4);
    assert_eq!(i64s(&q.dequeue(&w).unwrap()[0]), vec![1]);
    let two = q.dequeue_many(2, &w).unwrap();
    assert_eq!(two[0].dims(), &[2]);
    assert_eq!(i64s(&two[0]), vec![2, 3]);
    assert_eq!(i64s(&q.dequeue(&w).unwrap()[0]), vec![4]);
    assert_eq!(q.size(), 0);
}

#[test]
fn tuples_of_two_components_stack_per_component() {
    let q = FifoQueue::new(
        "pairs",
        vec![DType::Float, DType::Int32],
        vec![],
        None,
        LONG,
    )
    .unwrap();
    let w = Wait::for_duration(LONG);
    q.enqueue_many(
        vec![
            Tensor::from_vec([2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap(),
            Tensor::from_vec([2], vec![7i32, 8]).unwrap(),
        ],
        &w,
    )
    .unwrap();
    let first = q.dequeue(&w).unwrap();
    assert_eq!(first[0].values::<f32>().unwrap().as_ref(), &[1.0, 2.0]);
    assert_eq!(first[1].values::<i32>().unwrap().as_ref(), &[7]);
    // A wrong dtype is refused with the component named.
    let e = q
        .enqueue(vec![Tensor::scalar(1i32), Tensor::scalar(1i32)], &w)
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("component 0 must be float"), "{e}");
}

#[test]
fn an_enqueue_into_a_full_queue_waits_until_a_dequeue_makes_room() {
    let q = Arc::new(scalar_queue(Some(1)));
    let w = Wait::for_duration(LONG);
    q.enqueue(vec![Tensor::scalar(1i64)], &w).unwrap();
    let producer = {
        let q = q.clone();
        thread::spawn(move || q.enqueue(vec![Tensor::scalar(2i64)], &Wait::for_duration(LONG)))
    };
    // The producer cannot finish while the queue is full; the dequeue lets it in.
    assert_eq!(i64s(&q.dequeue(&w).unwrap()[0]), vec![1]);
    producer.join().unwrap().unwrap();
    assert_eq!(i64s(&q.dequeue(&w).unwrap()[0]), vec![2]);
    // Full again with nobody dequeuing: the wait ends at its deadline, naming the queue.
    q.enqueue(vec![Tensor::scalar(3i64)], &w).unwrap();
    let e = q
        .enqueue(
            vec![Tensor::scalar(4i64)],
            &Wait::for_duration(Duration::from_millis(100)),
        )
        .unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded);
    assert!(
        e.message().contains("queue `q`") && e.message().contains("capacity 1"),
        "{e}"
    );
}

#[test]
fn closing_wakes_a_waiting_dequeuer_with_out_of_range_after_the_queue_drains() {
    let q = Arc::new(scalar_queue(None));
    let waiter = {
        let q = q.clone();
        thread::spawn(move || q.dequeue_many(2, &Wait::for_duration(LONG)))
    };
    q.enqueue(vec![Tensor::scalar(5i64)], &Wait::for_duration(LONG))
        .unwrap();
    let started = Instant::now();
    q.close(false);
    let e = waiter.join().unwrap().unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(e.code(), Code::OutOfRange);
    assert_eq!(
        e.message(),
        "FIFOQueue 'q' is closed and has insufficient elements (requested 2, current size 1)"
    );
    // What is left can still be dequeued; enqueues are refused.
    assert_eq!(
        i64s(&q.dequeue(&Wait::for_duration(LONG)).unwrap()[0]),
        vec![5]
    );
    let e = q
        .enqueue(vec![Tensor::scalar(6i64)], &Wait::for_duration(LONG))
        .unwrap_err();
    assert_eq!(e.code(), Code::Cancelled);
}

#[test]
fn close_with_cancel_pending_enqueues_fails_a_blocked_enqueue() {
    let q = Arc::new(scalar_queue(Some(1)));
    q.enqueue(vec![Tensor::scalar(1i64)], &Wait::for_duration(LONG))
        .unwrap();
    let producer = {
        let q = q.clone();
        thread::spawn(move || q.enqueue(vec![Tensor::scalar(2i64)], &Wait::for_duration(LONG)))
    };
    q.close(true);
    assert_eq!(
        producer.join().unwrap().unwrap_err().code(),
        Code::Cancelled
    );
}

/// A graph with the token-queue ops of a synchronous job, for running them through kernels.
fn queue_graph(wait_ms: Option<u64>, timeout_ms: i64) -> GraphDef {
    let mut g = Graph::new();
    let q = g
        .fifo_queue(
            "tq",
            &[DType::Int64],
            &[PartialShape::new(Vec::<Option<usize>>::new())],
            None,
            "tq",
            wait_ms,
        )
        .unwrap();
    g.queue_dequeue("deq", &q, &[DType::Int64]).unwrap();
    g.queue_size("size", &q).unwrap();
    g.queue_close("close", &q, false).unwrap();
    let mut def = g.to_graph_def();
    for n in def.node.iter_mut().filter(|n| n.name == "deq") {
        n.attr.insert(
            "timeout_ms".into(),
            tessera::graph::attr::value::int(timeout_ms),
        );
    }
    def
}

#[test]
fn a_dequeue_op_ends_at_its_timeout_with_deadline_exceeded_naming_the_queue() {
    let session = Session::local();
    session.extend(&queue_graph(None, 150)).unwrap();
    let started = Instant::now();
    let e = session.run(&[], &["deq:0"], &[]).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
    assert!(
        e.message().contains("queue `tq`") && e.message().contains("0 of 1"),
        "{e}"
    );
    assert_eq!(
        session.run(&[], &["size:0"], &[]).unwrap()[0]
            .scalar_value::<i32>()
            .unwrap(),
        0
    );
}

#[test]
fn without_an_op_timeout_the_step_deadline_bounds_the_dequeue_and_names_the_queue() {
    let options = SessionOptions {
        step_timeout: Some(Duration::from_millis(300)),
        ..Default::default()
    };
    let session = Session::with_options(Arc::new(Device::local_cpu()), options);
    session.extend(&queue_graph(None, -1)).unwrap();
    let e = session.run(&[], &["deq:0"], &[]).unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
    assert!(e.message().contains("queue `tq`"), "{e}");
}

#[test]
fn the_creating_ops_wait_attr_bounds_a_dequeue_that_has_no_other_deadline() {
    let session = Session::local();
    session.extend(&queue_graph(Some(120), -1)).unwrap();
    let started = Instant::now();
    let e = session.run(&[], &["deq:0"], &[]).unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e}");
    assert!(e.message().contains("within 120 ms"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn closing_the_session_cancels_a_blocked_dequeue() {
    let session = Arc::new(Session::local());
    session.extend(&queue_graph(Some(20_000), -1)).unwrap();
    let blocked = {
        let session = session.clone();
        thread::spawn(move || session.run(&[], &["deq:0"], &[]))
    };
    // Wait until the queue exists (the blocked step created it), bounded.
    let deadline = Instant::now() + LONG;
    while session
        .device()
        .expect("an in-process session has a device")
        .resources()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the dequeue step never started");
        thread::yield_now();
    }
    let started = Instant::now();
    session.close().unwrap();
    let e = blocked.join().unwrap().unwrap_err();
    assert_eq!(e.code(), Code::Cancelled, "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

fn accumulator(shape: &[usize]) -> ConditionalAccumulator {
    let dims: Vec<Option<usize>> = shape.iter().map(|&d| Some(d)).collect();
    ConditionalAccumulator::new(
        "w1:0/grad_accum",
        DType::Float,
        PartialShape::new(dims),
        Reduction::Mean,
        LONG,
    )
    .unwrap()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.values::<f32>().unwrap().into_owned()
}

#[test]
fn take_returns_the_average_of_accepted_gradients_and_advances_the_global_step() {
    let a = accumulator(&[2]);
    assert!(a
        .apply(0, &Tensor::from_vec([2], vec![1.0f32, 2.0]).unwrap())
        .unwrap());
    assert!(a
        .apply(0, &Tensor::from_vec([2], vec![3.0f32, 6.0]).unwrap())
        .unwrap());
    assert_eq!(a.num_accumulated(), 2);
    // (1+3)/2 = 2, (2+6)/2 = 4.
    assert_eq!(
        f32s(&a.take(2, &Wait::for_duration(LONG)).unwrap()),
        vec![2.0, 4.0]
    );
    assert_eq!(a.global_step(), 1);
    assert_eq!(a.num_accumulated(), 0);
    // SUM adds instead: 1 + 3 = 4.
    let s = ConditionalAccumulator::new(
        "s",
        DType::Float,
        PartialShape::unknown(),
        Reduction::Sum,
        LONG,
    )
    .unwrap();
    s.apply(0, &Tensor::scalar(1.0f32)).unwrap();
    s.apply(0, &Tensor::scalar(3.0f32)).unwrap();
    assert_eq!(
        f32s(&s.take(2, &Wait::for_duration(LONG)).unwrap()),
        vec![4.0]
    );
}

#[test]
fn gradients_are_summed_in_their_own_dtype_as_tensorflow_sums_them() {
    // int64 beyond f64's 53 bits: a sum through f64 would round these to 2^60.
    let big = 1i64 << 60;
    let a = ConditionalAccumulator::new(
        "steps",
        DType::Int64,
        PartialShape::unknown(),
        Reduction::Mean,
        LONG,
    )
    .unwrap();
    a.apply(0, &Tensor::from_vec([2], vec![big + 1, -7]).unwrap())
        .unwrap();
    a.apply(0, &Tensor::from_vec([2], vec![big + 5, 2]).unwrap())
        .unwrap();
    // (2^60 + 3) exactly; (-7 + 2) / 2 truncates toward zero, as TensorFlow's division.
    assert_eq!(
        i64s(&a.take(2, &Wait::for_duration(LONG)).unwrap()),
        [big + 3, -2]
    );
    // float32 gradients add in float32: 2^24 + 1 is not a float32, so the 1 is lost (in
    // float64 the sum would be 2^24 + 1 + 1 = 2^24 + 2, a float32).
    let f = accumulator(&[1]);
    for g in [16_777_216.0f32, 1.0, 1.0] {
        f.apply(0, &Tensor::from_vec([1], vec![g]).unwrap())
            .unwrap();
    }
    let mean = f32s(&f.take(3, &Wait::for_duration(LONG)).unwrap());
    assert_eq!(mean, [16_777_216.0f32 / 3.0]);
}

#[test]
fn stale_gradients_are_dropped_and_counted() {
    let a = accumulator(&[1]);
    a.set_global_step(5);
    assert!(!a
        .apply(4, &Tensor::from_vec([1], vec![100.0f32]).unwrap())
        .unwrap());
    assert!(a
        .apply(5, &Tensor::from_vec([1], vec![1.0f32]).unwrap())
        .unwrap());
    assert!(a
        .apply(6, &Tensor::from_vec([1], vec![3.0f32]).unwrap())
        .unwrap());
    assert_eq!(a.dropped(), 1);
    // The dropped 100 is not in the average: (1+3)/2 = 2.
    assert_eq!(
        f32s(&a.take(2, &Wait::for_duration(LONG)).unwrap()),
        vec![2.0]
    );
    assert_eq!(a.global_step(), 6);
    // Step 5 is now stale too.
    assert!(!a
        .apply(5, &Tensor::from_vec([1], vec![1.0f32]).unwrap())
        .unwrap());
    assert_eq!(a.dropped(), 2);
    // Lowering the global step is allowed (logged).
    a.set_global_step(0);
    assert!(a
        .apply(0, &Tensor::from_vec([1], vec![1.0f32]).unwrap())
        .unwrap());
    // A gradient of the wrong shape is refused, naming the accumulator.
    let e = a
        .apply(0, &Tensor::from_vec([2], vec![1.0f32, 1.0]).unwrap())
        .unwrap_err();
    assert!(e.message().contains("w1:0/grad_accum"), "{e}");
}

#[test]
fn take_waits_until_enough_gradients_arrived() {
    let a = Arc::new(accumulator(&[1]));
    a.apply(0, &Tensor::from_vec([1], vec![2.0f32]).unwrap())
        .unwrap();
    let taker = {
        let a = a.clone();
        thread::spawn(move || a.take(2, &Wait::for_duration(LONG)))
    };
    a.apply(0, &Tensor::from_vec([1], vec![4.0f32]).unwrap())
        .unwrap();
    assert_eq!(f32s(&taker.join().unwrap().unwrap()), vec![3.0]);
}

#[test]
fn a_take_that_cannot_be_served_ends_at_its_deadline_naming_the_accumulator_and_the_count() {
    let a = accumulator(&[1]);
    a.apply(0, &Tensor::from_vec([1], vec![2.0f32]).unwrap())
        .unwrap();
    let started = Instant::now();
    let e = a
        .take(2, &Wait::for_duration(Duration::from_millis(200)))
        .unwrap_err();
    assert!(
        started.elapsed() >= Duration::from_millis(190)
            && started.elapsed() < Duration::from_secs(5)
    );
    assert_eq!(e.code(), Code::DeadlineExceeded);
    assert!(
        e.message().starts_with("accumulator `w1:0/grad_accum`: 1 of 2 gradients arrived within 200 ms; a replica stopped contributing"),
        "{e}"
    );
    assert_eq!(
        a.num_accumulated(),
        1,
        "a failed take leaves the gradients in place"
    );
}

/// The golden fixtures: `$TESSERA_GOLDEN_DIR`, else `shared/golden` beside the checkout, else
/// `/work/shared/golden`.
fn golden(name: &str) -> Vec<u8> {
    let candidates: Vec<PathBuf> = std::env::var_os("TESSERA_GOLDEN_DIR")
        .map(PathBuf::from)
        .into_iter()
        .chain([
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/golden")),
            PathBuf::from("/work/shared/golden"),
        ])
        .collect();
    let dir = candidates
        .iter()
        .find(|d| d.is_dir())
        .expect("golden fixtures not found");
    std::fs::read(dir.join(name)).unwrap()
}

#[test]
fn the_queue_and_accumulator_ops_of_tensorflows_sync_graph_have_kernels() {
    let graph = GraphDef::decode(golden("graph_sync.pb").as_slice()).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for node in &graph.node {
        if node.op.starts_with("Queue")
            || node.op.contains("Accumulator")
            || node.op == "FIFOQueueV2"
        {
            create_kernel(node, DeviceType::Cpu)
                .unwrap_or_else(|e| panic!("node `{}` (op {}): {e}", node.name, node.op));
            seen.insert(node.op.clone());
        }
    }
    let expected = [
        "FIFOQueueV2",
        "QueueCloseV2",
        "QueueDequeueV2",
        "QueueEnqueueManyV2",
        "ResourceAccumulatorApplyGradient",
        "ResourceAccumulatorSetGlobalStep",
        "ResourceAccumulatorTakeGradient",
        "ResourceConditionalAccumulator",
    ];
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), expected);
}
