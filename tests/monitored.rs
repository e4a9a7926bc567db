//! The monitored training session: the chief's preparation, workers waiting for it, hooks,
//! and recovery from preemptions, on real CPU kernels through `Session`s sharing one device
//! (as tasks share a ps).
//!
//! The model: `global_step` (int64, starts 0) and `w` (float, starts 2); the `train` op adds
//! 1 to the global step and 0.5 to `w`. A `fault` NoOp runs before the increment: its kernel
//! is injected and fails while the test says so (ABORTED for a preemption, INTERNAL for a
//! bug). `loss` is the identity of the fed placeholder `x`. Time is a `ManualClock`: sleeping
//! advances it, so nothing really sleeps.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera::client::{Session, SessionOptions};
use tessera::device::DeviceType;
use tessera::format::events::read_events;
use tessera::graph::builder::{Graph, NodeSpec};
use tessera::kernels::KernelLookup;
use tessera::kernels::{OpContext, OpKernel};
use tessera::proto::event::What;
use tessera::proto::{summary, GraphDef, NodeDef};
use tessera::runtime::Device;
use tessera::tensor::{DType, PartialShape, Tensor};
use tessera::train::monitored::{
    CheckpointSaverHook, Clock, CreateSession, Every, Hook, LoggingTensorHook, ManualClock,
    MonitoredSession, NanTensorHook, ReadyOp, RetryPolicy, SaveFn, Scaffold, SessionManager,
    StepCounterHook, StepRate, StopAt, StopAtStepHook, SummaryFile, SummarySaverHook,
    TrainingConfig,
};
use tessera::{Code, Result, Status};

const GLOBAL_STEP: &str = "global_step/Read/ReadVariableOp:0";

/// The test model's graph and its ready check.
struct Model {
    graph: GraphDef,
    ready: ReadyOp,
}

fn model() -> Model {
    let mut g = Graph::new();
    let zero = g.constant(&Tensor::scalar(0i64)).unwrap();
    let gs = g.variable("global_step", &zero).unwrap();
    let two = g.constant(&Tensor::scalar(2.0f32)).unwrap();
    let w = g.variable("w", &two).unwrap();
    let one = g.constant(&Tensor::scalar(1i64)).unwrap();
    let half = g.constant(&Tensor::scalar(0.5f32)).unwrap();
    let fault = g.add_op(NodeSpec::new("NoOp").name("fault")).unwrap();
    let incr = g
        .with_control_dependencies(&[&fault], |g| g.assign_add_variable(&gs.handle, &one))
        .unwrap();
    let update = g.assign_add_variable(&w.handle, &half).unwrap();
    g.group("train", &[&incr, &update]).unwrap();
    g.global_variables_initializer().unwrap();
    let x = g
        .placeholder("x", DType::Float, PartialShape::new(Vec::new()))
        .unwrap();
    let loss = g.identity(&x).unwrap();
    assert_eq!(loss.name(), "Identity:0");
    Model {
        graph: g.to_graph_def(),
        ready: ReadyOp::for_variables(&[&gs, &w]),
    }
}

/// What the test makes fail, and how many sessions were made.
#[derive(Default)]
struct Faults {
    /// Session creations left to fail with UNAVAILABLE.
    creations: AtomicUsize,
    /// Steps left whose `fault` node fails with `step_code`.
    steps: AtomicUsize,
    step_code: Mutex<Option<Code>>,
    created: AtomicUsize,
}

/// Counts down `n` if positive; true when it did.
fn take(n: &AtomicUsize) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
        .is_ok()
}

struct Fault(Arc<Faults>);

impl OpKernel for Fault {
    fn compute(&self, ctx: &mut OpContext<'_>) -> Result<()> {
        if take(&self.0.steps) {
            let code = self.0.step_code.lock().unwrap().unwrap_or(Code::Aborted);
            // A restarted ps comes back without its variables.
            if matches!(code, Code::Aborted | Code::Unavailable) {
                ctx.resources.clear(&[]);
            }
            return Err(Status::new(code, "ps0 was restarted"));
        }
        Ok(())
    }
}

/// Creates sessions on `device` with the model's graph and the injected `fault` kernel.
fn creator(device: &Arc<Device>, faults: &Arc<Faults>) -> CreateSession {
    let device = device.clone();
    let faults = faults.clone();
    let graph = model().graph;
    Box::new(move || {
        if take(&faults.creations) {
            return Err(Status::unavailable(
                "connecting to /job:ps/task:0: connection refused",
            ));
        }
        faults.created.fetch_add(1, Ordering::SeqCst);
        let f = faults.clone();
        let kernels: Arc<KernelLookup> =
            Arc::new(move |node: &NodeDef, device_type: DeviceType| {
                if node.name == "fault" {
                    return Ok(Arc::new(Fault(f.clone())) as Arc<dyn OpKernel>);
                }
                tessera::kernels::create_kernel(node, device_type)
            });
        let options = SessionOptions {
            kernels,
            ..Default::default()
        };
        let session = Session::with_options(device.clone(), options);
        session.extend(&graph)?;
        Ok(session)
    })
}

fn scaffold() -> Scaffold {
    Scaffold {
        init_op: Some("init".into()),
        local_init_op: None,
        ready_op: model().ready,
    }
}

struct Setup {
    device: Arc<Device>,
    faults: Arc<Faults>,
    clock: Arc<ManualClock>,
}

impl Setup {
    fn new() -> Self {
        Self {
            device: Arc::new(Device::local_cpu()),
            faults: Arc::default(),
            clock: Arc::new(ManualClock::new()),
        }
    }
    fn manager(&self, is_chief: bool) -> SessionManager {
        SessionManager::new(creator(&self.device, &self.faults), scaffold(), is_chief)
            .with_clock(self.clock.clone())
            .with_wait(Duration::from_secs(1), Duration::from_secs(5))
    }
    fn chief(&self, hooks: Vec<Box<dyn Hook>>, attempts: u32) -> Result<MonitoredSession> {
        MonitoredSession::new(self.manager(true), hooks, retry(attempts))
    }
    fn global_step(&self) -> i64 {
        let session = Session::on_device(self.device.clone());
        session.extend(&model().graph).unwrap();
        session.run(&[], &[GLOBAL_STEP], &[]).unwrap()[0]
            .scalar_value::<i64>()
            .unwrap()
    }
}

fn retry(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_backoff: Duration::from_millis(100),
        multiplier: 2.0,
        max_backoff: Duration::from_secs(1),
        startup: Duration::ZERO,
    }
}

fn stop_at(last: i64) -> Box<dyn Hook> {
    Box::new(StopAtStepHook::new(GLOBAL_STEP, StopAt::LastStep(last)))
}

/// Runs `train` until a hook stops; returns the number of runs.
fn train(session: &mut MonitoredSession) -> Result<usize> {
    let mut runs = 0;
    while !session.should_stop() {
        session.run(&[], &[], &["train"])?;
        runs += 1;
        assert!(runs < 100, "training did not stop");
    }
    Ok(runs)
}

#[test]
fn stop_at_step_stops_exactly_at_the_last_step() {
    let setup = Setup::new();
    let mut session = setup.chief(vec![stop_at(5)], 3).unwrap();
    assert!(!session.should_stop());
    assert_eq!(train(&mut session).unwrap(), 5);
    assert!(session.should_stop());
    // Running after the stop request is refused, not silently done.
    let err = session.run(&[], &[], &["train"]).unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    session.close().unwrap();
    assert_eq!(setup.global_step(), 5);

    // num_steps counts from the global step at creation: 5 + 3 = 8.
    let setup2 = Setup::new();
    let mut first = setup2.chief(vec![stop_at(5)], 3).unwrap();
    train(&mut first).unwrap();
    first.close().unwrap();
    let hook = Box::new(StopAtStepHook::new(GLOBAL_STEP, StopAt::NumSteps(3)));
    // A worker does not re-initialise: it continues from the chief's 5.
    let mut worker = MonitoredSession::new(setup2.manager(false), vec![hook], retry(3)).unwrap();
    assert_eq!(train(&mut worker).unwrap(), 3);
    worker.close().unwrap();
    assert_eq!(setup2.global_step(), 8);
}

/// A clock that plays the chief on the worker's second sleep.
struct ChiefArrives {
    inner: ManualClock,
    chief: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Clock for ChiefArrives {
    fn now(&self) -> Duration {
        self.inner.now()
    }
    fn sleep(&self, d: Duration) {
        self.inner.sleep(d);
        if self.inner.sleeps().len() == 2 {
            if let Some(chief) = self.chief.lock().unwrap().take() {
                chief();
            }
        }
    }
}

#[test]
fn a_worker_waits_until_the_chief_initializes_the_model() {
    let setup = Setup::new();
    let device = setup.device.clone();
    let clock = Arc::new(ChiefArrives {
        inner: ManualClock::new(),
        chief: Mutex::new(Some(Box::new(move || {
            let chief = Session::on_device(device);
            chief.extend(&model().graph).unwrap();
            chief.run(&[], &[], &["init"]).unwrap();
        }))),
    });
    let manager = SessionManager::new(creator(&setup.device, &setup.faults), scaffold(), false)
        .with_clock(clock.clone())
        .with_wait(Duration::from_secs(1), Duration::from_secs(5));
    let mut worker = MonitoredSession::new(manager, vec![stop_at(2)], retry(3)).unwrap();
    // Two polls found the model uninitialized, the third found it ready.
    assert_eq!(clock.inner.sleeps(), [Duration::from_secs(1); 2]);
    assert_eq!(setup.faults.created.load(Ordering::SeqCst), 3);
    assert_eq!(train(&mut worker).unwrap(), 2);
    worker.close().unwrap();
    assert_eq!(setup.global_step(), 2);
}

#[test]
fn a_worker_gives_up_naming_the_uninitialized_variables() {
    let setup = Setup::new();
    let err = match MonitoredSession::new(setup.manager(false), vec![], retry(3)) {
        Ok(_) => panic!("nobody initialized the model, yet the worker got a session"),
        Err(e) => e,
    };
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(
        err.message()
            .contains("model not ready after 5 s: waiting for global_step, w to be initialized"),
        "{err}"
    );
    // Polls at t = 0..=4 s, each followed by a 1 s sleep; at 5 s one more would pass 5 s.
    assert_eq!(setup.clock.sleeps(), [Duration::from_secs(1); 5]);
}

#[test]
fn session_creation_failing_twice_with_unavailable_is_retried_with_backoff() {
    let setup = Setup::new();
    setup.faults.creations.store(2, Ordering::SeqCst);
    let mut session = setup.chief(vec![stop_at(3)], 3).unwrap();
    // Backoff 100 ms, then 200 ms (doubling).
    assert_eq!(
        setup.clock.sleeps(),
        [Duration::from_millis(100), Duration::from_millis(200)]
    );
    assert_eq!(train(&mut session).unwrap(), 3);
    session.close().unwrap();
    assert_eq!(setup.global_step(), 3);
}

#[test]
fn the_first_session_waits_for_tasks_not_up_yet_up_to_the_startup_timeout() {
    // 40 refused creations: far past 3 attempts, within a 2-minute startup wait (2 s polls).
    let setup = Setup::new();
    setup.faults.creations.store(40, Ordering::SeqCst);
    let policy = RetryPolicy {
        startup: Duration::from_secs(120),
        ..retry(3)
    };
    let mut session =
        MonitoredSession::new(setup.manager(true), vec![stop_at(2)], policy.clone()).unwrap();
    assert_eq!(setup.clock.sleeps(), [Duration::from_secs(2); 40]);
    assert_eq!(train(&mut session).unwrap(), 2);
    session.close().unwrap();

    // Past the startup timeout the task gives up, naming the wait and how to lengthen it.
    let setup = Setup::new();
    setup.faults.creations.store(1000, Ordering::SeqCst);
    let err = match MonitoredSession::new(setup.manager(true), vec![], policy) {
        Ok(_) => panic!("a session while every creation was refused"),
        Err(e) => e,
    };
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    for needle in [
        "did not come up within 120 s",
        "connection refused",
        "--startup_timeout",
    ] {
        assert!(err.message().contains(needle), "{needle}: {err}");
    }
    assert_eq!(setup.clock.sleeps(), [Duration::from_secs(2); 60]);
}

#[test]
fn an_aborted_step_recreates_the_session_and_retries_the_step() {
    let setup = Setup::new();
    let mut session = setup.chief(vec![stop_at(4)], 3).unwrap();
    session.run(&[], &[], &["train"]).unwrap();
    session.run(&[], &[], &["train"]).unwrap();
    assert_eq!(setup.global_step(), 2);
    setup.faults.steps.store(1, Ordering::SeqCst);
    // The step fails before incrementing; the new chief session re-runs init_op (no restore
    // callback), so the global step restarts at 0 and the retried step makes it 1.
    session.run(&[], &[], &["train"]).unwrap();
    assert_eq!(session.sessions_created(), 2);
    assert_eq!(setup.global_step(), 1);
    assert_eq!(setup.clock.sleeps(), [Duration::from_millis(100)]);
    assert_eq!(train(&mut session).unwrap(), 3);
    session.close().unwrap();
    assert_eq!(setup.global_step(), 4);
}

#[test]
fn a_recreated_chief_restores_and_the_global_step_continues() {
    let setup = Setup::new();
    // An in-memory checkpoint of the global step, saved every 2 steps.
    let saved = Arc::new(Mutex::new(None::<i64>));
    let save: SaveFn = {
        let saved = saved.clone();
        Arc::new(move |_s: &Session, step| {
            *saved.lock().unwrap() = Some(step);
            Ok(())
        })
    };
    let restored_from = Arc::new(Mutex::new(Vec::new()));
    let restore = {
        let (saved, restored_from) = (saved.clone(), restored_from.clone());
        Arc::new(move |s: &Session| -> Result<bool> {
            let Some(step) = *saved.lock().unwrap() else {
                return Ok(false);
            };
            // Restore = init, then add the saved step.
            s.run(&[], &[], &["init"])?;
            for _ in 0..step {
                s.run(&[], &[], &["train"])?;
            }
            restored_from.lock().unwrap().push(step);
            Ok(true)
        })
    };
    let hook = CheckpointSaverHook::new(GLOBAL_STEP, Every::Steps(2), save).unwrap();
    let manager = setup.manager(true).with_restore(restore);
    let mut session =
        MonitoredSession::new(manager, vec![Box::new(hook), stop_at(6)], retry(3)).unwrap();
    for _ in 0..3 {
        session.run(&[], &[], &["train"]).unwrap();
    }
    // Saved at creation (0) and at 2; the ps "loses" step 3.
    assert_eq!(*saved.lock().unwrap(), Some(2));
    setup.faults.steps.store(1, Ordering::SeqCst);
    session.run(&[], &[], &["train"]).unwrap();
    assert_eq!(*restored_from.lock().unwrap(), [2]);
    assert_eq!(setup.global_step(), 3);
    assert_eq!(train(&mut session).unwrap(), 3);
    session.close().unwrap();
    assert_eq!(setup.global_step(), 6);
}

#[test]
fn exceeding_the_attempt_bound_names_the_attempts_and_the_cause() {
    let setup = Setup::new();
    let mut session = setup.chief(vec![], 3).unwrap();
    setup.faults.steps.store(100, Ordering::SeqCst);
    let err = session.run(&[], &[], &["train"]).unwrap_err();
    assert_eq!(err.code(), Code::Aborted, "{err}");
    assert!(err.message().contains("after 3 attempts"), "{err}");
    assert!(err.message().contains("ps0 was restarted"), "{err}");
    assert_eq!(session.sessions_created(), 3);
    assert_eq!(
        setup.clock.sleeps(),
        [Duration::from_millis(100), Duration::from_millis(200)]
    );
}

#[test]
fn a_non_retryable_error_propagates_at_once() {
    let setup = Setup::new();
    let mut session = setup.chief(vec![], 3).unwrap();
    *setup.faults.step_code.lock().unwrap() = Some(Code::Internal);
    setup.faults.steps.store(1, Ordering::SeqCst);
    let err = session.run(&[], &[], &["train"]).unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err}");
    assert!(err.message().contains("ps0 was restarted"), "{err}");
    assert!(!err.message().contains("attempts"), "{err}");
    assert_eq!(session.sessions_created(), 1);
    assert!(setup.clock.sleeps().is_empty());
    // The session is still usable.
    session.run(&[], &[], &["train"]).unwrap();
}

#[test]
fn nan_loss_fails_the_step_or_requests_a_stop() {
    let feed = |v: f32| [("x", Tensor::scalar(v))];
    let setup = Setup::new();
    let hook = Box::new(NanTensorHook::new("Identity:0", true));
    let mut session = setup.chief(vec![hook], 3).unwrap();
    session.run(&feed(1.5), &[], &["train"]).unwrap();
    let err = session.run(&feed(f32::NAN), &[], &["train"]).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("NaN loss during training"), "{err}");
    assert_eq!(session.sessions_created(), 1);

    let setup = Setup::new();
    let hook = Box::new(NanTensorHook::new("Identity:0", false));
    let mut session = setup.chief(vec![hook], 3).unwrap();
    session.run(&feed(1.5), &[], &["train"]).unwrap();
    assert!(!session.should_stop());
    session.run(&feed(f32::INFINITY), &[], &["train"]).unwrap();
    assert!(session.should_stop());
}

fn recording_saver() -> (SaveFn, Arc<Mutex<Vec<i64>>>) {
    let steps = Arc::new(Mutex::new(Vec::new()));
    let s = steps.clone();
    let save: SaveFn = Arc::new(move |_session: &Session, step| {
        s.lock().unwrap().push(step);
        Ok(())
    });
    (save, steps)
}

#[test]
fn checkpoints_are_saved_every_n_steps_at_creation_and_at_the_end() {
    let setup = Setup::new();
    let (save, steps) = recording_saver();
    let hook = CheckpointSaverHook::new(GLOBAL_STEP, Every::Steps(2), save).unwrap();
    let mut session = setup.chief(vec![Box::new(hook), stop_at(5)], 3).unwrap();
    train(&mut session).unwrap();
    session.close().unwrap();
    // Creation at 0, every 2 steps (2, 4), and the unsaved last step 5 at the end.
    assert_eq!(*steps.lock().unwrap(), [0, 2, 4, 5]);
}

#[test]
fn checkpoints_are_saved_every_n_seconds_on_the_clock() {
    let setup = Setup::new();
    let (save, steps) = recording_saver();
    let hook = CheckpointSaverHook::with_clock(
        GLOBAL_STEP,
        Every::Secs(Duration::from_secs(10)),
        save,
        setup.clock.clone(),
    )
    .unwrap();
    let mut session = setup.chief(vec![Box::new(hook), stop_at(6)], 3).unwrap();
    while !session.should_stop() {
        // Step n runs at t = 4n s: saves at t = 0 (step 0), 12 (3), 24 (6).
        setup.clock.advance(Duration::from_secs(4));
        session.run(&[], &[], &["train"]).unwrap();
    }
    session.close().unwrap();
    // Step 6 was saved by the timer, so the end does not save it twice.
    assert_eq!(*steps.lock().unwrap(), [0, 3, 6]);
}

#[test]
fn step_counter_and_logging_hooks_record_their_values() {
    let setup = Setup::new();
    let counter = StepCounterHook::new(GLOBAL_STEP, Every::Steps(2), setup.clock.clone()).unwrap();
    let rates = counter.records();
    let logger = LoggingTensorHook::new(
        &[("loss", "Identity:0")],
        Some(Every::Steps(2)),
        false,
        setup.clock.clone(),
    )
    .unwrap();
    let logged = logger.records();
    let at_end =
        LoggingTensorHook::new(&[("step", GLOBAL_STEP)], None, true, setup.clock.clone()).unwrap();
    let logged_at_end = at_end.records();
    let hooks: Vec<Box<dyn Hook>> = vec![
        Box::new(counter),
        Box::new(logger),
        Box::new(at_end),
        stop_at(6),
    ];
    let mut session = setup.chief(hooks, 3).unwrap();
    let mut i = 0;
    while !session.should_stop() {
        // Step n runs at t = 0.5n s with loss 10 * (n - 1).
        setup.clock.advance(Duration::from_millis(500));
        session
            .run(&[("x", Tensor::scalar(10.0 * i as f32))], &[], &["train"])
            .unwrap();
        i += 1;
    }
    session.close().unwrap();
    // First measured at step 1 (t = 0.5 s), then steps 3 and 5: 2 steps per second each
    // (2 steps in 1 s).
    let expected = [3, 5].map(|global_step| StepRate {
        global_step,
        steps_per_sec: 2.0,
    });
    assert_eq!(*rates.lock().unwrap(), expected);
    // Iterations 0, 2, 4: losses 0, 20, 40.
    let logged = logged.lock().unwrap();
    let got: Vec<(i64, String, f32)> = logged
        .iter()
        .map(|r| {
            (
                r.iteration,
                r.values[0].0.clone(),
                r.values[0].1.scalar_value::<f32>().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (0, "loss".into(), 0.0),
            (2, "loss".into(), 20.0),
            (4, "loss".into(), 40.0)
        ]
    );
    let at_end = logged_at_end.lock().unwrap();
    assert_eq!(at_end.len(), 1);
    assert_eq!(at_end[0].values[0].1.scalar_value::<i64>().unwrap(), 6);
}

#[test]
fn summaries_are_written_to_a_tensorboard_event_file() {
    let dir = tempfile::tempdir().unwrap();
    let setup = Setup::new();
    let file = SummaryFile::create(&dir.path().join("train")).unwrap();
    let hook = SummarySaverHook::new(
        file.clone(),
        GLOBAL_STEP,
        &[("loss", "Identity:0")],
        Every::Steps(2),
        setup.clock.clone(),
    )
    .unwrap()
    .with_histograms(&[("w", "w/Read/ReadVariableOp:0")]);
    let path = hook.path();
    let mut session = setup.chief(vec![Box::new(hook)], 3).unwrap();
    // The global step moves between monitored runs (not inside them), so the step each run
    // reads is exactly i.
    for i in 0..4 {
        session
            .run(&[("x", Tensor::scalar(i as f32 + 0.5))], &[], &[])
            .unwrap();
        session
            .raw_session()
            .unwrap()
            .run(&[], &[], &["train"])
            .unwrap();
    }
    file.scalar(4, "accuracy", 0.75).unwrap();
    session.close().unwrap();
    let events = read_events(&path).unwrap();
    assert_eq!(
        events[0].what,
        Some(What::FileVersion("brain.Event:2".into()))
    );
    // Written on the first run and then every 2 steps, at the step the run read: the loss
    // and the histogram of `w` each time, then what the trainer added.
    let written: Vec<(i64, String, Option<f32>)> = events[1..]
        .iter()
        .map(|e| {
            let Some(What::Summary(s)) = &e.what else {
                panic!("not a summary: {e:?}");
            };
            let v = &s.value[0];
            let simple = match &v.value {
                Some(summary::value::Value::SimpleValue(x)) => Some(*x),
                Some(summary::value::Value::Histo(h)) => {
                    assert!(h.num >= 1.0, "{h:?}");
                    None
                }
                other => panic!("{other:?}"),
            };
            (e.step, v.tag.clone(), simple)
        })
        .collect();
    assert_eq!(
        written,
        [
            (0, "loss".into(), Some(0.5)),
            (0, "w".into(), None),
            (2, "loss".into(), Some(2.5)),
            (2, "w".into(), None),
            (4, "accuracy".into(), Some(0.75)),
        ]
    );
}

#[test]
fn a_chief_whose_init_leaves_a_variable_uninitialized_fails_naming_it() {
    let setup = Setup::new();
    // init_op initializes only the global step: `w` stays uninitialized.
    let partial = Scaffold {
        init_op: Some("global_step/Assign".into()),
        ..scaffold()
    };
    let manager = SessionManager::new(creator(&setup.device, &setup.faults), partial, true);
    let err = MonitoredSession::new(manager, vec![], retry(3))
        .err()
        .unwrap();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(
        err.message()
            .contains("Init operations did not make model ready: w still uninitialized"),
        "{err}"
    );
    // Not retried: it is not a preemption.
    assert_eq!(setup.faults.created.load(Ordering::SeqCst), 1);

    // With neither init_op nor a checkpoint, the chief says what to add.
    let none = Scaffold {
        init_op: None,
        ..scaffold()
    };
    let manager = SessionManager::new(creator(&setup.device, &setup.faults), none, true);
    let err = MonitoredSession::new(manager, vec![], retry(3))
        .err()
        .unwrap();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("no init_op"), "{err}");
}

#[test]
fn the_ready_check_reads_a_report_of_uninitialized_names() {
    let mut g = Graph::new();
    let names = vec![bytes::Bytes::from("w1"), bytes::Bytes::from("b1")];
    let report = g
        .constant(&Tensor::from_strings([2], names).unwrap())
        .unwrap();
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    let ready = ReadyOp::default().with_report(&report.name());
    assert_eq!(ready.uninitialized(&session).unwrap(), ["w1", "b1"]);
    // A report that is not a string tensor is an error naming it.
    let m = model();
    let session = Session::local();
    session.extend(&m.graph).unwrap();
    let err = ReadyOp::default()
        .with_report("Const:0")
        .uninitialized(&session)
        .unwrap_err();
    assert!(err.message().contains("`Const:0`"), "{err}");
    // Before init both variables are reported, after it neither.
    assert_eq!(
        m.ready.uninitialized(&session).unwrap(),
        ["global_step", "w"]
    );
    session.run(&[], &[], &["init"]).unwrap();
    assert!(m.ready.uninitialized(&session).unwrap().is_empty());
}

#[test]
fn training_sessions_give_the_chief_the_default_hooks_and_workers_only_theirs() {
    let setup = Setup::new();
    let (save, steps) = recording_saver();
    let config = |save: Option<SaveFn>| {
        let mut c = TrainingConfig::new(GLOBAL_STEP);
        c.checkpoint = save.map(|s| (s, Every::Steps(2)));
        c.hooks = vec![stop_at(3)];
        c.retry = retry(3);
        c
    };
    let mut chief =
        MonitoredSession::training(setup.manager(true), config(Some(save.clone()))).unwrap();
    assert_eq!(train(&mut chief).unwrap(), 3);
    chief.close().unwrap();
    // Saved at creation, at 2, and the last step at the end.
    assert_eq!(*steps.lock().unwrap(), [0, 2, 3]);

    // A worker given the same checkpoint settings saves nothing; its StopAtStep still works.
    steps.lock().unwrap().clear();
    let mut worker = MonitoredSession::training(setup.manager(false), config(Some(save))).unwrap();
    // The chief already reached step 3: the worker's first run (to 4) sees it and stops.
    assert_eq!(train(&mut worker).unwrap(), 1);
    worker.close().unwrap();
    assert!(steps.lock().unwrap().is_empty());
}
