//! The monitored training session: TensorFlow's `MonitoredSession` with its hooks and
//! recovery, with the flaws of TensorFlow's fixed.
//!
//! A [`MonitoredSession`] gets a session with a ready model from a [`SessionManager`] (the
//! chief initialises or restores, workers wait for it), and runs each step with its
//! [`Hook`]s: every hook's `before_run` may add fetches, feeds and targets, the step runs once,
//! then every `after_run` sees its own results and may request a stop.
//!
//! When a step or the creation of a session fails with ABORTED or UNAVAILABLE (a ps
//! restarted, a task was preempted), the session is closed, a new one created (the chief
//! re-initialises or restores, workers wait) and the step retried — with exponential backoff
//! and a bound on attempts, where TensorFlow retries forever and at once. Other errors
//! propagate unchanged; OUT_OF_RANGE (the input, or the sync token queue, ran out) also makes
//! `should_stop()` true, as it ends training in TensorFlow. Hooks asking for the same tensor
//! share one fetch. Time goes through a [`Clock`] so that tests do not sleep.

pub mod hooks;
pub mod session_manager;

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::client::Session;
use crate::error::{Code, Result, Status};
use crate::peer::format_duration;
use crate::proto::{RunMetadata, RunOptions};
use crate::tensor::Tensor;

pub use hooks::{
    CheckpointSaverHook, Every, Hook, LoggedTensors, LoggingTensorHook, NanTensorHook, RunArgs,
    RunContext, SaveFn, SecondOrStepTimer, StepCounterHook, StepRate, StopAt, StopAtStepHook,
    SummaryFile, SummarySaverHook,
};
pub use session_manager::{CreateSession, ReadyOp, RestoreFn, Scaffold, SessionManager};

/// Where the monitored session and its hooks read the time and sleep.
pub trait Clock: Send + Sync {
    /// Time since an arbitrary fixed origin.
    fn now(&self) -> Duration;
    /// Waits `duration` (a test clock just advances).
    fn sleep(&self, duration: Duration);
}

/// The real clock: monotonic time and `thread::sleep`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

fn origin() -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        origin().elapsed()
    }
    fn sleep(&self, duration: Duration) {
        std::thread::sleep(duration);
    }
}

/// A clock that moves only when told to or slept on; `sleep` advances it at once.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: Mutex<Duration>,
    slept: Mutex<Vec<Duration>>,
}

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }
    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        *self.now.lock().unwrap_or_else(|e| e.into_inner()) += by;
    }
    /// Returns every duration slept so far, in order.
    pub fn sleeps(&self) -> Vec<Duration> {
        self.slept.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        *self.now.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn sleep(&self, duration: Duration) {
        self.slept
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(duration);
        self.advance(duration);
    }
}

/// How a monitored session retries after ABORTED or UNAVAILABLE.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Attempts per step (or per session creation), the first included; at least 1.
    pub max_attempts: u32,
    /// Wait before the first recreation.
    pub initial_backoff: Duration,
    /// The wait grows by this factor per attempt...
    pub multiplier: f64,
    /// ...up to this.
    pub max_backoff: Duration,
    /// How long the first session's creation waits for tasks that are not up yet
    /// (UNAVAILABLE) before `max_attempts` counts: a cluster's tasks start in any order, and
    /// one may wait minutes for a machine (TensorFlow's `SessionManager` waits up to two
    /// hours). Zero: no such wait.
    pub startup: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            multiplier: 2.0,
            max_backoff: Duration::from_secs(30),
            startup: Duration::ZERO,
        }
    }
}

/// How often a task waiting for the others to come up says so.
const STARTUP_LOG_EVERY: Duration = Duration::from_secs(30);
/// The longest pause between two attempts while waiting for the others to come up.
const STARTUP_POLL: Duration = Duration::from_secs(2);

impl RetryPolicy {
    /// The wait after failed attempt `attempt` (1-based): `initial * multiplier^(attempt-1)`,
    /// capped at `max_backoff`.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = self
            .multiplier
            .max(1.0)
            .powi(attempt.saturating_sub(1) as i32);
        let secs = self.initial_backoff.as_secs_f64() * factor;
        Duration::from_secs_f64(secs.min(self.max_backoff.as_secs_f64()))
    }
}

/// A session that runs hooks around every step and recovers from preemptions.
pub struct MonitoredSession {
    manager: SessionManager,
    hooks: Vec<Box<dyn Hook>>,
    retry: RetryPolicy,
    session: Option<Session>,
    stop_requested: bool,
    closed: bool,
    created: u64,
}

impl MonitoredSession {
    /// Calls every hook's `begin`, creates the first session (retrying preemptions under
    /// `retry`) and calls every hook's `after_create_session`.
    pub fn new(
        manager: SessionManager,
        hooks: Vec<Box<dyn Hook>>,
        retry: RetryPolicy,
    ) -> Result<Self> {
        if retry.max_attempts == 0 {
            return Err(Status::invalid_argument(
                "RetryPolicy.max_attempts must be at least 1 (the first attempt counts)",
            ));
        }
        let mut this = Self {
            manager,
            hooks,
            retry,
            session: None,
            stop_requested: false,
            closed: false,
            created: 0,
        };
        for hook in &mut this.hooks {
            hook.begin()?;
        }
        let mut attempt = 1;
        let clock = this.manager.clock().clone();
        let started = clock.now();
        let mut said: Option<Duration> = None;
        loop {
            match this.ensure_session() {
                Ok(()) => return Ok(this),
                // A task not up yet refuses connections (UNAVAILABLE) or, its port bound but
                // its daemon not serving, does not answer (DEADLINE_EXCEEDED).
                Err(e)
                    if matches!(e.code(), Code::Unavailable | Code::DeadlineExceeded)
                        && !this.retry.startup.is_zero()
                        && this.created == 0 =>
                {
                    let waited = clock.now().saturating_sub(started);
                    let startup = this.retry.startup;
                    if waited >= startup {
                        return Err(Status::unavailable(format!(
                            "the cluster did not come up within {} (the startup timeout): {};                              start the tasks named, or wait longer (tessera train                              --startup_timeout, [timeouts] startup)",
                            format_duration(startup),
                            e.message()
                        )));
                    }
                    if said.is_none_or(|at| waited >= at + STARTUP_LOG_EVERY) {
                        said = Some(waited);
                        tracing::info!(
                            waited_s = waited.as_secs(),
                            "waiting for the cluster's other tasks to come up (normal while a                              cluster starts; up to {}): {}",
                            format_duration(startup),
                            e.message()
                        );
                    }
                    clock.sleep(STARTUP_POLL.min(startup - waited));
                }
                Err(e) => this.recover(e, &mut attempt, "creating the session")?,
            }
        }
    }

    /// Runs one step with the hooks: `feeds` `(tensor, value)`, `fetches` returned in order,
    /// `targets` run for effect. A preempted step is retried in a new session.
    pub fn run(
        &mut self,
        feeds: &[(&str, Tensor)],
        fetches: &[&str],
        targets: &[&str],
    ) -> Result<Vec<Tensor>> {
        self.run_step(feeds, fetches, targets, None)
            .map(|(values, _)| values)
    }

    /// Runs one step with the hooks as [`run`](Self::run) does, as `options` ask, and returns
    /// the step's `RunMetadata` too ([`Session::run_with_options`]): with
    /// `RunOptions.trace_level = FULL_TRACE`, the step's trace, which
    /// [`chrome_trace`](crate::client::chrome_trace) writes as a Chrome trace. The hooks see
    /// the step as any other; a retried step returns the metadata of the attempt that ran.
    pub fn run_with_options(
        &mut self,
        feeds: &[(&str, Tensor)],
        fetches: &[&str],
        targets: &[&str],
        options: &RunOptions,
    ) -> Result<(Vec<Tensor>, RunMetadata)> {
        self.run_step(feeds, fetches, targets, Some(options))
    }

    fn run_step(
        &mut self,
        feeds: &[(&str, Tensor)],
        fetches: &[&str],
        targets: &[&str],
        options: Option<&RunOptions>,
    ) -> Result<(Vec<Tensor>, RunMetadata)> {
        if self.closed {
            return Err(Status::failed_precondition(
                "MonitoredSession is closed; create a new one to run more steps",
            ));
        }
        if self.stop_requested {
            return Err(Status::failed_precondition(
                "Run called even after should_stop requested; check should_stop() before each \
                 step",
            ));
        }
        let mut attempt = 1;
        loop {
            let result = self
                .ensure_session()
                .and_then(|()| self.run_with_hooks(feeds, fetches, targets, options));
            match result {
                Ok(values) => return Ok(values),
                // The input (or the token queue) ran out: training is over, as TensorFlow's
                // monitored session treats OUT_OF_RANGE. The error is still returned.
                Err(e) if e.code() == crate::error::Code::OutOfRange => {
                    self.stop_requested = true;
                    return Err(e);
                }
                Err(e) => self.recover(e, &mut attempt, "running a step")?,
            }
        }
    }

    /// Whether a hook asked to stop or the session was closed.
    pub fn should_stop(&self) -> bool {
        self.stop_requested || self.closed
    }

    /// The session steps run in now (absent between a preemption and its recovery).
    pub fn raw_session(&self) -> Option<&Session> {
        self.session.as_ref()
    }

    /// How many sessions have been created (one more per recovery).
    pub fn sessions_created(&self) -> u64 {
        self.created
    }

    /// Calls every hook's `end` (while a session is up), then closes the session. Closing
    /// twice is fine; preemption errors from `end` are logged and ignored, as a lost ps at
    /// shutdown must not fail a finished run.
    pub fn close(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        let mut first_error = None;
        if let Some(session) = &self.session {
            for hook in &mut self.hooks {
                if let Err(e) = hook.end(session) {
                    if e.is_retryable() {
                        tracing::warn!(error = %e, "hook end failed by preemption; ignored");
                    } else if first_error.is_none() {
                        first_error = Some(e);
                    }
                }
            }
        }
        if let Some(session) = self.session.take() {
            if let Err(e) = session.close() {
                tracing::warn!(error = %e, "closing the session failed; ignored");
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Creates a session (and runs the hooks' `after_create_session`) when there is none.
    fn ensure_session(&mut self) -> Result<()> {
        if self.session.is_some() {
            return Ok(());
        }
        let session = self.manager.create_session()?;
        self.created += 1;
        for hook in &mut self.hooks {
            if let Err(e) = hook.after_create_session(&session) {
                let _ = session.close();
                return Err(e);
            }
        }
        self.session = Some(session);
        Ok(())
    }

    /// Handles a failed attempt: a preemption within the bound closes the session and waits
    /// the backoff (the caller then retries); anything else is returned.
    fn recover(&mut self, error: Status, attempt: &mut u32, doing: &str) -> Result<()> {
        if !error.is_retryable() {
            return Err(error);
        }
        if let Some(session) = self.session.take() {
            let _ = session.close();
        }
        if *attempt >= self.retry.max_attempts {
            return Err(Status::new(
                error.code(),
                format!(
                    "gave up {doing} after {} attempts; last error: {}; the cluster did not \
                     recover, check the tasks named above or raise RetryPolicy.max_attempts",
                    *attempt,
                    error.message()
                ),
            ));
        }
        let wait = self.retry.backoff(*attempt);
        tracing::warn!(
            error = %error,
            attempt = *attempt,
            backoff_s = wait.as_secs_f64(),
            "{doing} failed, possibly by preemption; recreating the session"
        );
        self.manager.clock().sleep(wait);
        *attempt += 1;
        Ok(())
    }

    /// One step: collect the hooks' additions, run once (as `options` ask, when given), hand
    /// each hook its results.
    fn run_with_hooks(
        &mut self,
        feeds: &[(&str, Tensor)],
        fetches: &[&str],
        targets: &[&str],
        options: Option<&RunOptions>,
    ) -> Result<(Vec<Tensor>, RunMetadata)> {
        let session = self.session.as_ref().ok_or_else(|| {
            Status::internal("monitored session has no session after creating one")
        })?;
        let mut all_feeds: Vec<(String, Tensor)> = feeds
            .iter()
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect();
        let mut fed: HashSet<String> = all_feeds.iter().map(|(n, _)| n.clone()).collect();
        let mut all_fetches: Vec<String> = fetches.iter().map(|s| s.to_string()).collect();
        let mut all_targets: Vec<String> = targets.iter().map(|s| s.to_string()).collect();
        let mut spans = Vec::with_capacity(self.hooks.len());
        {
            let context = RunContext::new(session);
            for hook in &mut self.hooks {
                let args = hook.before_run(&context)?;
                for (name, value) in args.feeds {
                    if !fed.insert(name.clone()) {
                        return Err(Status::invalid_argument(format!(
                            "a hook feeds `{name}`, which is already fed by the caller or \
                             another hook; feed each tensor once"
                        )));
                    }
                    all_feeds.push((name, value));
                }
                let start = all_fetches.len();
                all_fetches.extend(args.fetches);
                spans.push(start..all_fetches.len());
                all_targets.extend(args.targets);
            }
        }
        let feed_refs: Vec<(&str, Tensor)> = all_feeds
            .iter()
            .map(|(n, t)| (n.as_str(), t.clone()))
            .collect();
        // Hooks often fetch the same tensor (the global step); each is fetched once and its
        // value handed to every asker, as a master may refuse a tensor fetched twice.
        let (unique, slots) = dedup(&all_fetches);
        let target_refs: Vec<&str> = all_targets.iter().map(String::as_str).collect();
        let (fetched, metadata) = match options {
            Some(options) => {
                session.run_with_options(&feed_refs, &unique, &target_refs, options)?
            }
            None => (
                session.run(&feed_refs, &unique, &target_refs)?,
                RunMetadata::default(),
            ),
        };
        let mut values = Vec::with_capacity(slots.len());
        for slot in slots {
            let value = fetched.get(slot).ok_or_else(|| {
                Status::internal(format!(
                    "the step returned {} values for {} fetches",
                    fetched.len(),
                    unique.len()
                ))
            })?;
            values.push(value.clone());
        }
        let mut context = RunContext::new(session);
        for (hook, span) in self.hooks.iter_mut().zip(spans) {
            hook.after_run(&mut context, &values[span])?;
        }
        if context.stop_requested() {
            self.stop_requested = true;
        }
        values.truncate(fetches.len());
        Ok((values, metadata))
    }
}

impl Drop for MonitoredSession {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(error = %e, "closing the monitored session on drop failed");
        }
    }
}

/// The distinct names of `fetches` in first-seen order, and for each fetch its index there.
fn dedup(fetches: &[String]) -> (Vec<&str>, Vec<usize>) {
    let mut unique: Vec<&str> = Vec::new();
    let mut index = std::collections::HashMap::new();
    let slots = fetches
        .iter()
        .map(|name| {
            *index.entry(name.as_str()).or_insert_with(|| {
                unique.push(name.as_str());
                unique.len() - 1
            })
        })
        .collect();
    (unique, slots)
}

/// What [`MonitoredSession::training`] sets up (TensorFlow's `MonitoredTrainingSession`
/// arguments; a period is one [`Every`], so "both secs and steps" cannot be asked for).
pub struct TrainingConfig {
    /// The global step tensor the default hooks read (`global_step/Read/ReadVariableOp:0`).
    pub global_step: String,
    /// The chief saves checkpoints through this, this often.
    pub checkpoint: Option<(SaveFn, Every)>,
    /// The chief logs steps per second this often (`None`: no step counter).
    pub log_step_count: Option<Every>,
    /// Hooks every task runs.
    pub hooks: Vec<Box<dyn Hook>>,
    /// Hooks only the chief runs (before the default ones).
    pub chief_only_hooks: Vec<Box<dyn Hook>>,
    /// Recovery from preemptions.
    pub retry: RetryPolicy,
}

impl TrainingConfig {
    /// Defaults for the global step tensor `global_step`: steps/s every 100 steps, no
    /// checkpoints, no hooks, the default retry policy.
    pub fn new(global_step: &str) -> Self {
        Self {
            global_step: global_step.to_string(),
            checkpoint: None,
            log_step_count: Some(Every::Steps(100)),
            hooks: Vec::new(),
            chief_only_hooks: Vec::new(),
            retry: RetryPolicy::default(),
        }
    }
}

impl MonitoredSession {
    /// A monitored session for training: the chief runs `chief_only_hooks`, a
    /// [`StepCounterHook`] and a [`CheckpointSaverHook`] (when configured) before the user
    /// hooks; other workers run only the user hooks, as in TensorFlow.
    pub fn training(manager: SessionManager, config: TrainingConfig) -> Result<Self> {
        let mut hooks = Vec::new();
        if manager.is_chief() {
            hooks.extend(config.chief_only_hooks);
            if let Some(every) = config.log_step_count {
                let clock = manager.clock().clone();
                hooks.push(
                    Box::new(StepCounterHook::new(&config.global_step, every, clock)?)
                        as Box<dyn Hook>,
                );
            }
            if let Some((save, every)) = config.checkpoint {
                let clock = manager.clock().clone();
                hooks.push(Box::new(CheckpointSaverHook::with_clock(
                    &config.global_step,
                    every,
                    save,
                    clock,
                )?));
            }
        }
        hooks.extend(config.hooks);
        Self::new(manager, hooks, config.retry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tensor_fetched_twice_is_fetched_once_and_handed_to_both() {
        let names: Vec<String> = ["loss", "step", "w", "step", "loss"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (unique, slots) = dedup(&names);
        assert_eq!(unique, ["loss", "step", "w"]);
        assert_eq!(slots, [0, 1, 2, 1, 0]);
    }

    #[test]
    fn backoff_doubles_from_the_initial_wait_up_to_the_cap() {
        let policy = RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            multiplier: 2.0,
            max_backoff: Duration::from_millis(500),
            startup: Duration::ZERO,
        };
        // 100 * 2^(n-1) ms, capped at 500 ms.
        let waits: Vec<u128> = (1..=5).map(|n| policy.backoff(n).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 500, 500]);
    }

    #[test]
    fn the_manual_clock_advances_only_when_told_or_slept_on() {
        let clock = ManualClock::new();
        assert_eq!(clock.now(), Duration::ZERO);
        clock.advance(Duration::from_secs(2));
        clock.sleep(Duration::from_millis(500));
        assert_eq!(clock.now(), Duration::from_millis(2500));
        assert_eq!(clock.sleeps(), [Duration::from_millis(500)]);
    }
}
