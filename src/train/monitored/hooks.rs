//! Session run hooks (TensorFlow's `basic_session_run_hooks`): stop at a step, save
//! checkpoints, count steps per second, log tensors, catch NaN losses, save TensorBoard
//! summaries (scalars and histograms, in an event file: `format::events`).
//!
//! Every hook is a [`Hook`]: `begin` before the first session, `after_create_session` after
//! each (also after a recovery), `before_run` returning the [`RunArgs`] to add to the step,
//! `after_run` with the hook's own fetched values, `end` before the session closes. The
//! periodic hooks fire through a [`SecondOrStepTimer`]; the ones a program reads back
//! (step rates, logged tensors) also keep records, shared through an `Arc`, so a caller can
//! use them without parsing logs.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::client::Session;
use crate::error::{Result, Status};
use crate::format::events::EventFileWriter;
use crate::tensor::{DType, Tensor};

use super::{Clock, SystemClock};

/// What a hook adds to a step.
#[derive(Clone, Debug, Default)]
pub struct RunArgs {
    /// Tensors to fetch; the hook's `after_run` receives their values in this order.
    pub fetches: Vec<String>,
    /// `(tensor, value)` feeds; feeding a tensor already fed fails the step.
    pub feeds: Vec<(String, Tensor)>,
    /// Nodes to run for their effects.
    pub targets: Vec<String>,
}

impl RunArgs {
    /// Fetches these tensors.
    pub fn fetch(fetches: &[&str]) -> Self {
        Self {
            fetches: fetches.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }
}

/// The step a hook is called around: its session, and the stop request.
pub struct RunContext<'a> {
    session: &'a Session,
    stop: bool,
}

impl<'a> RunContext<'a> {
    pub(crate) fn new(session: &'a Session) -> Self {
        Self {
            session,
            stop: false,
        }
    }
    /// The session the step runs in (hooks may run extra reads in it).
    pub fn session(&self) -> &'a Session {
        self.session
    }
    /// Asks the monitored session to stop: `should_stop()` turns true after this step.
    pub fn request_stop(&mut self) {
        self.stop = true;
    }
    /// Whether a hook asked to stop during this step.
    pub fn stop_requested(&self) -> bool {
        self.stop
    }
}

/// Code run around every step of a monitored session; every method defaults to nothing.
pub trait Hook: Send {
    /// Once, before the first session is created.
    fn begin(&mut self) -> Result<()> {
        Ok(())
    }
    /// After each session is created and its model is ready (again after a recovery).
    fn after_create_session(&mut self, _session: &Session) -> Result<()> {
        Ok(())
    }
    /// Before each step: what to add to it.
    fn before_run(&mut self, _context: &RunContext<'_>) -> Result<RunArgs> {
        Ok(RunArgs::default())
    }
    /// After each successful step, with the values of this hook's fetches.
    fn after_run(&mut self, _context: &mut RunContext<'_>, _values: &[Tensor]) -> Result<()> {
        Ok(())
    }
    /// Once, when the monitored session closes.
    fn end(&mut self, _session: &Session) -> Result<()> {
        Ok(())
    }
}

/// How often a periodic hook fires: every N steps or every so many seconds (exactly one,
/// which the type enforces where TensorFlow checks at run time).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Every {
    /// Every this many steps (at least 1).
    Steps(u64),
    /// Every this long (more than zero).
    Secs(Duration),
}

/// Fires on the first step, then once the step or time delta is reached, never twice for the
/// same step (TensorFlow's `SecondOrStepTimer`).
pub struct SecondOrStepTimer {
    every: Every,
    clock: Arc<dyn Clock>,
    last: Option<(i64, Duration)>,
}

impl SecondOrStepTimer {
    /// A timer on `clock`; a zero period is INVALID_ARGUMENT.
    pub fn new(every: Every, clock: Arc<dyn Clock>) -> Result<Self> {
        match every {
            Every::Steps(0) => Err(Status::invalid_argument(
                "a hook period of 0 steps never advances; use Every::Steps(n) with n >= 1",
            )),
            Every::Secs(d) if d.is_zero() => Err(Status::invalid_argument(
                "a hook period of 0 seconds fires every step; use Every::Steps(1) for that",
            )),
            _ => Ok(Self {
                every,
                clock,
                last: None,
            }),
        }
    }

    /// Whether the timer fires for `step`.
    pub fn should_trigger_for_step(&self, step: i64) -> bool {
        let Some((last_step, last_time)) = self.last else {
            return true;
        };
        if step == last_step {
            return false;
        }
        match self.every {
            Every::Steps(n) => step >= last_step.saturating_add(n as i64),
            Every::Secs(d) => self.clock.now() >= last_time + d,
        }
    }

    /// Marks `step` as fired now; returns the seconds and steps since the previous firing
    /// (`None` the first time).
    pub fn update_last_triggered_step(&mut self, step: i64) -> Option<(f64, i64)> {
        let now = self.clock.now();
        let elapsed = self
            .last
            .map(|(s, t)| (now.saturating_sub(t).as_secs_f64(), step - s));
        self.last = Some((step, now));
        elapsed
    }

    /// The step the timer last fired for.
    pub fn last_triggered_step(&self) -> Option<i64> {
        self.last.map(|(s, _)| s)
    }
}

/// Reads an integer scalar (the global step is int64, sometimes int32).
fn int_scalar(value: &Tensor, what: &str) -> Result<i64> {
    match value.dtype() {
        DType::Int64 => value.scalar_value::<i64>(),
        DType::Int32 => value.scalar_value::<i32>().map(i64::from),
        other => Err(Status::invalid_argument(format!(
            "{what} must be an int64 or int32 scalar, got {other:?}"
        ))),
    }
    .map_err(|e| e.context(what))
}

/// Reads a float scalar as f64.
fn float_scalar(value: &Tensor, what: &str) -> Result<f64> {
    match value.dtype() {
        DType::Float => value.scalar_value::<f32>().map(f64::from),
        DType::Double => value.scalar_value::<f64>(),
        DType::Int64 | DType::Int32 => int_scalar(value, what).map(|v| v as f64),
        other => Err(Status::invalid_argument(format!(
            "{what} must be a float scalar, got {other:?}"
        ))),
    }
    .map_err(|e| e.context(what))
}

/// Runs a read of the global step in `session`.
fn read_global_step(session: &Session, tensor: &str) -> Result<i64> {
    let values = session.run(&[], &[tensor], &[])?;
    let value = values
        .first()
        .ok_or_else(|| Status::internal(format!("fetching `{tensor}` returned nothing")))?;
    int_scalar(value, &format!("global step `{tensor}`"))
}

fn first<'a>(values: &'a [Tensor], what: &str) -> Result<&'a Tensor> {
    values
        .first()
        .ok_or_else(|| Status::internal(format!("the step returned no value for {what}")))
}

/// When [`StopAtStepHook`] stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopAt {
    /// This many steps after the global step at the first session creation.
    NumSteps(i64),
    /// Once the global step reaches this value.
    LastStep(i64),
}

/// Requests a stop once the global step reaches the last step.
pub struct StopAtStepHook {
    global_step: String,
    stop_at: StopAt,
    last_step: Option<i64>,
}

impl StopAtStepHook {
    /// Stops at `stop_at`, reading the global step from the tensor `global_step`.
    pub fn new(global_step: &str, stop_at: StopAt) -> Self {
        let last_step = match stop_at {
            StopAt::LastStep(n) => Some(n),
            StopAt::NumSteps(_) => None,
        };
        Self {
            global_step: global_step.to_string(),
            stop_at,
            last_step,
        }
    }
}

impl Hook for StopAtStepHook {
    fn after_create_session(&mut self, session: &Session) -> Result<()> {
        if let (None, StopAt::NumSteps(n)) = (self.last_step, self.stop_at) {
            let step = read_global_step(session, &self.global_step)?;
            self.last_step = Some(step + n);
        }
        Ok(())
    }
    fn before_run(&mut self, _context: &RunContext<'_>) -> Result<RunArgs> {
        Ok(RunArgs::fetch(&[&self.global_step]))
    }
    fn after_run(&mut self, context: &mut RunContext<'_>, values: &[Tensor]) -> Result<()> {
        let Some(last) = self.last_step else {
            return Ok(());
        };
        let stale = int_scalar(first(values, "the global step")?, "global step")?;
        // The value fetched may predate this step's increment; re-read when close.
        if stale + 1 >= last {
            let step = read_global_step(context.session(), &self.global_step)?;
            if step >= last {
                context.request_stop();
            }
        }
        Ok(())
    }
}

/// Saves a checkpoint of the session at a global step (the checkpoint saver, injected).
pub type SaveFn = Arc<dyn Fn(&Session, i64) -> Result<()> + Send + Sync>;

/// Saves checkpoints: at each session creation, every N steps or seconds, and at the end
/// unless the last step was just saved.
pub struct CheckpointSaverHook {
    global_step: String,
    save: SaveFn,
    timer: SecondOrStepTimer,
}

impl CheckpointSaverHook {
    /// Saves through `save` every `every`, reading the global step from `global_step`.
    pub fn new(global_step: &str, every: Every, save: SaveFn) -> Result<Self> {
        Self::with_clock(global_step, every, save, Arc::new(SystemClock))
    }
    /// The same, timing `Every::Secs` on `clock`.
    pub fn with_clock(
        global_step: &str,
        every: Every,
        save: SaveFn,
        clock: Arc<dyn Clock>,
    ) -> Result<Self> {
        Ok(Self {
            global_step: global_step.to_string(),
            save,
            timer: SecondOrStepTimer::new(every, clock)?,
        })
    }

    fn save(&mut self, session: &Session, step: i64) -> Result<()> {
        tracing::info!(step, "saving checkpoint");
        (self.save)(session, step)
            .map_err(|e| e.context(format!("saving checkpoint at step {step}")))?;
        self.timer.update_last_triggered_step(step);
        Ok(())
    }
}

impl Hook for CheckpointSaverHook {
    fn after_create_session(&mut self, session: &Session) -> Result<()> {
        let step = read_global_step(session, &self.global_step)?;
        self.save(session, step)
    }
    fn before_run(&mut self, _context: &RunContext<'_>) -> Result<RunArgs> {
        Ok(RunArgs::fetch(&[&self.global_step]))
    }
    fn after_run(&mut self, context: &mut RunContext<'_>, values: &[Tensor]) -> Result<()> {
        let stale = int_scalar(first(values, "the global step")?, "global step")?;
        if self.timer.should_trigger_for_step(stale + 1) {
            let step = read_global_step(context.session(), &self.global_step)?;
            if self.timer.should_trigger_for_step(step) {
                self.save(context.session(), step)?;
            }
        }
        Ok(())
    }
    fn end(&mut self, session: &Session) -> Result<()> {
        let step = read_global_step(session, &self.global_step)?;
        if self.timer.last_triggered_step() != Some(step) {
            self.save(session, step)?;
        }
        Ok(())
    }
}

/// One measurement of [`StepCounterHook`].
#[derive(Clone, Debug, PartialEq)]
pub struct StepRate {
    /// The global step at the measurement.
    pub global_step: i64,
    /// Global steps per second since the previous measurement.
    pub steps_per_sec: f64,
}

/// How many runs with an unchanged global step before [`StepCounterHook`] warns (as TF).
const STUCK_RUNS_WARNING: u32 = 20;

/// Logs global steps per second every N steps or seconds, and warns when the global step
/// does not move (a train op that does not increment it, or a stuck ps).
pub struct StepCounterHook {
    global_step: String,
    timer: SecondOrStepTimer,
    records: Arc<Mutex<Vec<StepRate>>>,
    last_seen: Option<i64>,
    unchanged_runs: u32,
}

impl StepCounterHook {
    /// Measures every `every` on `clock`.
    pub fn new(global_step: &str, every: Every, clock: Arc<dyn Clock>) -> Result<Self> {
        Ok(Self {
            global_step: global_step.to_string(),
            timer: SecondOrStepTimer::new(every, clock)?,
            records: Arc::default(),
            last_seen: None,
            unchanged_runs: 0,
        })
    }
    /// The measurements so far (shared: keep it before boxing the hook).
    pub fn records(&self) -> Arc<Mutex<Vec<StepRate>>> {
        self.records.clone()
    }
}

impl Hook for StepCounterHook {
    fn before_run(&mut self, _context: &RunContext<'_>) -> Result<RunArgs> {
        Ok(RunArgs::fetch(&[&self.global_step]))
    }
    fn after_run(&mut self, context: &mut RunContext<'_>, values: &[Tensor]) -> Result<()> {
        let stale = int_scalar(first(values, "the global step")?, "global step")?;
        if self.timer.should_trigger_for_step(stale + 1) {
            let step = read_global_step(context.session(), &self.global_step)?;
            let due = self.timer.should_trigger_for_step(step);
            if let Some((secs, steps)) = due
                .then(|| self.timer.update_last_triggered_step(step))
                .flatten()
            {
                if secs > 0.0 {
                    let rate = StepRate {
                        global_step: step,
                        steps_per_sec: steps as f64 / secs,
                    };
                    tracing::info!(
                        global_step = step,
                        steps_per_sec = rate.steps_per_sec,
                        "step rate"
                    );
                    self.records
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(rate);
                }
            }
        }
        if self.last_seen == Some(stale) {
            self.unchanged_runs += 1;
            if self.unchanged_runs % STUCK_RUNS_WARNING == 0 {
                tracing::warn!(
                    global_step = stale,
                    runs = self.unchanged_runs,
                    "the global step has not moved; does the train op increment `{}`?",
                    self.global_step
                );
            }
        } else {
            self.unchanged_runs = 0;
        }
        self.last_seen = Some(stale);
        Ok(())
    }
}

/// One firing of [`LoggingTensorHook`]: the local iteration and `(tag, value)` pairs.
#[derive(Clone, Debug)]
pub struct LoggedTensors {
    /// Count of this session's runs before the one logged (0-based).
    pub iteration: i64,
    /// The tensors, in the order given to the hook.
    pub values: Vec<(String, Tensor)>,
}

/// Logs named tensors every N local iterations or seconds, and optionally at the end.
pub struct LoggingTensorHook {
    tensors: Vec<(String, String)>,
    timer: Option<SecondOrStepTimer>,
    at_end: bool,
    iteration: i64,
    fetching: bool,
    records: Arc<Mutex<Vec<LoggedTensors>>>,
}

impl LoggingTensorHook {
    /// Logs `(tag, tensor)` pairs every `every` (`None`: only at the end, which then must be
    /// set).
    pub fn new(
        tensors: &[(&str, &str)],
        every: Option<Every>,
        at_end: bool,
        clock: Arc<dyn Clock>,
    ) -> Result<Self> {
        if every.is_none() && !at_end {
            return Err(Status::invalid_argument(
                "LoggingTensorHook logs nothing without a period or at_end; give one",
            ));
        }
        Ok(Self {
            tensors: tensors
                .iter()
                .map(|(t, n)| (t.to_string(), n.to_string()))
                .collect(),
            timer: every
                .map(|e| SecondOrStepTimer::new(e, clock))
                .transpose()?,
            at_end,
            iteration: 0,
            fetching: false,
            records: Arc::default(),
        })
    }
    /// The logged values so far (shared: keep it before boxing the hook).
    pub fn records(&self) -> Arc<Mutex<Vec<LoggedTensors>>> {
        self.records.clone()
    }

    fn log(&mut self, iteration: i64, values: &[Tensor]) {
        let values: Vec<(String, Tensor)> = self
            .tensors
            .iter()
            .zip(values)
            .map(|((tag, _), v)| (tag.clone(), v.clone()))
            .collect();
        let line: Vec<String> = values.iter().map(|(t, v)| format!("{t} = {v:?}")).collect();
        tracing::info!(iteration, "{}", line.join(", "));
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(LoggedTensors { iteration, values });
    }

    fn names(&self) -> Vec<&str> {
        self.tensors.iter().map(|(_, n)| n.as_str()).collect()
    }
}

impl Hook for LoggingTensorHook {
    fn before_run(&mut self, _context: &RunContext<'_>) -> Result<RunArgs> {
        self.fetching = self
            .timer
            .as_ref()
            .is_some_and(|t| t.should_trigger_for_step(self.iteration));
        if self.fetching {
            Ok(RunArgs::fetch(&self.names()))
        } else {
            Ok(RunArgs::default())
        }
    }
    fn after_run(&mut self, _context: &mut RunContext<'_>, values: &[Tensor]) -> Result<()> {
        if self.fetching {
            self.log(self.iteration, values);
            if let Some(timer) = &mut self.timer {
                timer.update_last_triggered_step(self.iteration);
            }
        }
        self.iteration += 1;
        Ok(())
    }
    fn end(&mut self, session: &Session) -> Result<()> {
        if self.at_end {
            let values = session.run(&[], &self.names(), &[])?;
            self.log(self.iteration, &values);
        }
        Ok(())
    }
}

/// Fails the step with INVALID_ARGUMENT ("NaN loss during training", the code TensorFlow's
/// `CheckNumerics` uses) or requests a stop when the loss is NaN or infinite.
pub struct NanTensorHook {
    loss: String,
    fail_on_nan_loss: bool,
}

impl NanTensorHook {
    /// Watches the scalar tensor `loss`; `fail_on_nan_loss` false only stops training.
    pub fn new(loss: &str, fail_on_nan_loss: bool) -> Self {
        Self {
            loss: loss.to_string(),
            fail_on_nan_loss,
        }
    }
}

impl Hook for NanTensorHook {
    fn before_run(&mut self, _context: &RunContext<'_>) -> Result<RunArgs> {
        Ok(RunArgs::fetch(&[&self.loss]))
    }
    fn after_run(&mut self, context: &mut RunContext<'_>, values: &[Tensor]) -> Result<()> {
        let loss = float_scalar(first(values, "the loss")?, &format!("loss `{}`", self.loss))?;
        if loss.is_finite() {
            return Ok(());
        }
        let message = format!(
            "NaN loss during training: `{}` is {loss}; lower the learning rate or check the \
             input data",
            self.loss
        );
        if self.fail_on_nan_loss {
            return Err(Status::invalid_argument(message));
        }
        tracing::error!("{message}; stopping");
        context.request_stop();
        Ok(())
    }
}

/// An event file that hooks and the trainer share: the summary hook writes its summaries
/// into it, and the trainer adds what it learns outside the steps (the held-out accuracy).
#[derive(Clone)]
pub struct SummaryFile(Arc<Mutex<EventFileWriter>>);

impl SummaryFile {
    /// Opens a new TensorBoard event file in `logdir` (created when missing).
    pub fn create(logdir: &Path) -> Result<Self> {
        Ok(Self(Arc::new(Mutex::new(EventFileWriter::create(
            logdir, "",
        )?))))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, EventFileWriter> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The event file's path.
    pub fn path(&self) -> PathBuf {
        self.lock().path().to_path_buf()
    }

    /// Appends the scalar `tag` = `value` at `step`.
    pub fn scalar(&self, step: i64, tag: &str, value: f32) -> Result<()> {
        self.lock().write_scalar(step, tag, value)
    }

    /// Appends a histogram of `values` as `tag` at `step`.
    pub fn histogram(&self, step: i64, tag: &str, values: &[f64]) -> Result<()> {
        self.lock()
            .write_histogram(step, tag, values.iter().copied())
    }

    /// Writes what is buffered to the file.
    pub fn flush(&self) -> Result<()> {
        self.lock().flush()
    }
}

/// Writes TensorBoard summaries into a [`SummaryFile`] every N steps or seconds (TensorFlow's
/// `SummarySaverHook` with `StepCounterHook`'s rate): the scalar tensors as `simple_value`s,
/// the others as histograms, and, when asked, `global_step/sec` between two writes. Each
/// event carries the global step the step read.
pub struct SummarySaverHook {
    file: SummaryFile,
    global_step: String,
    scalars: Vec<(String, String)>,
    histograms: Vec<(String, String)>,
    step_rate: bool,
    timer: SecondOrStepTimer,
    next_step: Option<i64>,
    fetching: bool,
}

impl SummarySaverHook {
    /// Writes `(tag, scalar tensor)` pairs every `every` into `file`.
    pub fn new(
        file: SummaryFile,
        global_step: &str,
        scalars: &[(&str, &str)],
        every: Every,
        clock: Arc<dyn Clock>,
    ) -> Result<Self> {
        let owned = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(t, n)| (t.to_string(), n.to_string()))
                .collect()
        };
        Ok(Self {
            file,
            global_step: global_step.to_string(),
            scalars: owned(scalars),
            histograms: Vec::new(),
            step_rate: false,
            timer: SecondOrStepTimer::new(every, clock)?,
            next_step: None,
            fetching: false,
        })
    }

    /// Also writes histograms of these `(tag, tensor)` pairs (the trainable variables).
    pub fn with_histograms(mut self, histograms: &[(&str, &str)]) -> Self {
        self.histograms = histograms
            .iter()
            .map(|(t, n)| (t.to_string(), n.to_string()))
            .collect();
        self
    }

    /// Also writes `global_step/sec`, the global steps per second since the last write.
    pub fn with_step_rate(mut self) -> Self {
        self.step_rate = true;
        self
    }

    /// The event file the summaries go to.
    pub fn path(&self) -> PathBuf {
        self.file.path()
    }

    fn write(&mut self, step: i64, values: &[Tensor], rate: Option<(f64, i64)>) -> Result<()> {
        let (scalars, histograms) = values.split_at(self.scalars.len().min(values.len()));
        for ((tag, name), value) in self.scalars.iter().zip(scalars) {
            let v = float_scalar(value, &format!("summary `{tag}` (`{name}`)"))?;
            self.file.scalar(step, tag, v as f32)?;
        }
        for ((tag, name), value) in self.histograms.iter().zip(histograms) {
            let what = || format!("histogram `{tag}` (`{name}`)");
            let numbers: Vec<f64> = match value.dtype() {
                DType::Float => value
                    .values::<f32>()?
                    .iter()
                    .map(|&v| f64::from(v))
                    .collect(),
                DType::Double => value.values::<f64>()?.into_owned(),
                other => {
                    return Err(Status::invalid_argument(format!(
                        "{}: a histogram needs a float tensor, got {other:?}",
                        what()
                    )))
                }
            };
            self.file
                .histogram(step, tag, &numbers)
                .map_err(|e| e.context(what()))?;
        }
        if let (true, Some((secs, steps))) = (self.step_rate, rate) {
            if secs > 0.0 {
                self.file
                    .scalar(step, "global_step/sec", (steps as f64 / secs) as f32)?;
            }
        }
        Ok(())
    }
}

impl Hook for SummarySaverHook {
    fn before_run(&mut self, _context: &RunContext<'_>) -> Result<RunArgs> {
        self.fetching = self
            .next_step
            .is_none_or(|s| self.timer.should_trigger_for_step(s));
        let mut fetches = vec![self.global_step.as_str()];
        if self.fetching {
            fetches.extend(self.scalars.iter().map(|(_, n)| n.as_str()));
            fetches.extend(self.histograms.iter().map(|(_, n)| n.as_str()));
        }
        Ok(RunArgs::fetch(&fetches))
    }
    fn after_run(&mut self, _context: &mut RunContext<'_>, values: &[Tensor]) -> Result<()> {
        let stale = int_scalar(first(values, "the global step")?, "global step")?;
        if self.fetching {
            let rate = self.timer.update_last_triggered_step(stale);
            self.write(stale, &values[1..], rate)?;
        }
        self.next_step = Some(stale + 1);
        Ok(())
    }
    fn end(&mut self, _session: &Session) -> Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::super::ManualClock;
    use super::*;

    #[test]
    fn the_step_timer_fires_first_then_every_n_steps_never_twice_for_a_step() {
        let mut timer =
            SecondOrStepTimer::new(Every::Steps(3), Arc::new(ManualClock::new())).unwrap();
        assert!(timer.should_trigger_for_step(7));
        assert_eq!(timer.update_last_triggered_step(7), None);
        assert!(!timer.should_trigger_for_step(7));
        assert!(!timer.should_trigger_for_step(9));
        assert!(timer.should_trigger_for_step(10));
        assert_eq!(timer.update_last_triggered_step(10), Some((0.0, 3)));
    }

    #[test]
    fn the_seconds_timer_follows_the_clock() {
        let clock = Arc::new(ManualClock::new());
        let mut timer =
            SecondOrStepTimer::new(Every::Secs(Duration::from_secs(5)), clock.clone()).unwrap();
        timer.update_last_triggered_step(0);
        clock.advance(Duration::from_secs(4));
        assert!(!timer.should_trigger_for_step(100));
        clock.advance(Duration::from_secs(1));
        assert!(timer.should_trigger_for_step(1));
        assert_eq!(timer.update_last_triggered_step(1), Some((5.0, 1)));
    }

    #[test]
    fn zero_periods_are_rejected() {
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new());
        let err = SecondOrStepTimer::new(Every::Steps(0), clock.clone())
            .err()
            .unwrap();
        assert_eq!(err.code(), crate::Code::InvalidArgument);
        assert!(SecondOrStepTimer::new(Every::Secs(Duration::ZERO), clock).is_err());
    }
}
