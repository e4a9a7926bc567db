//! `Admission`: the master's count of what its clients hold — sessions open, and steps each
//! session runs — checked against `limits.max_sessions` and `limits.max_steps_in_flight`, and
//! mirrored in the `tessera_sessions_open` and `tessera_steps_in_flight` gauges.
//!
//! The master actor owns it and consults it before forwarding: a call over a limit is refused
//! at once with RESOURCE_EXHAUSTED naming the key, so a flood of sessions or steps never queues
//! up behind the ones running. A step holds a [`StepSlot`] for as long as it runs; dropping
//! the slot (the step answered, failed or its caller went away) gives the place back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::cluster::{Limits, TaskId};
use crate::error::Result;
use crate::ops::metrics::{self, StepInFlight, MASTER_STEP_SECONDS};

/// The master's sessions and their steps in flight.
pub struct Admission {
    /// The `task` label of the gauges.
    task: String,
    max_sessions: usize,
    max_steps_in_flight: usize,
    /// Steps running now, per open session.
    steps: HashMap<String, Arc<AtomicUsize>>,
    /// CreateSession calls admitted whose session has not started yet.
    creating: usize,
}

impl Admission {
    /// Nothing open yet on `task`'s master, enforcing `limits`.
    pub fn new(task: &TaskId, limits: &Limits) -> Self {
        let admission = Self {
            task: task.device_prefix(),
            max_sessions: limits.max_sessions,
            max_steps_in_flight: limits.max_steps_in_flight,
            steps: HashMap::new(),
            creating: 0,
        };
        admission.publish();
        admission
    }

    /// Admits a CreateSession, or refuses it when the sessions open and being created reach
    /// `limits.max_sessions`. An admitted call must end with [`Admission::created`].
    pub fn begin_create(&mut self) -> Result<()> {
        let held = self.steps.len() + self.creating;
        if held >= self.max_sessions {
            return Err(Limits::exceeded(
                "max_sessions",
                self.max_sessions,
                &format!(
                    "CreateSession: this task's master already holds {held} sessions; close \
                     sessions you no longer use"
                ),
            ));
        }
        self.creating += 1;
        Ok(())
    }

    /// Ends an admitted CreateSession: `Some(handle)` when its session started.
    pub fn created(&mut self, handle: Option<&str>) {
        self.creating = self.creating.saturating_sub(1);
        if let Some(handle) = handle {
            self.steps.insert(handle.to_owned(), Arc::default());
        }
        self.publish();
    }

    /// Forgets a closed session (steps still running keep their slots until they end).
    pub fn closed(&mut self, handle: &str) {
        self.steps.remove(handle);
        self.publish();
    }

    /// Forgets every session (Reset).
    pub fn closed_all(&mut self) {
        self.steps.clear();
        self.publish();
    }

    /// Returns the number of open sessions.
    #[cfg(test)]
    pub fn sessions(&self) -> usize {
        self.steps.len()
    }

    /// Admits a step of session `handle`, or refuses it when the session already runs
    /// `limits.max_steps_in_flight` steps. `None` for a session this master does not hold
    /// (the caller answers that itself).
    pub fn start_step(&self, handle: &str) -> Result<Option<StepSlot>> {
        let Some(count) = self.steps.get(handle) else {
            return Ok(None);
        };
        let running = count.fetch_add(1, Ordering::AcqRel);
        if running >= self.max_steps_in_flight {
            count.fetch_sub(1, Ordering::AcqRel);
            return Err(Limits::exceeded(
                "max_steps_in_flight",
                self.max_steps_in_flight,
                &format!(
                    "session {handle} already runs {running} step(s); wait for one to finish \
                     before starting another"
                ),
            ));
        }
        Ok(Some(StepSlot {
            count: Arc::clone(count),
            _gauge: StepInFlight::start(&self.task),
            task: self.task.clone(),
            started: Instant::now(),
        }))
    }

    fn publish(&self) {
        metrics::sessions_open(&self.task, self.steps.len());
    }
}

/// A running step's place in its session's count; freed, and the step's time recorded, when
/// dropped.
pub struct StepSlot {
    count: Arc<AtomicUsize>,
    _gauge: StepInFlight,
    task: String,
    started: Instant,
}

impl Drop for StepSlot {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
        metrics::seconds(MASTER_STEP_SECONDS, &self.task, self.started.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;

    fn admission(max_sessions: usize, max_steps: usize) -> Admission {
        let limits = Limits {
            max_sessions,
            max_steps_in_flight: max_steps,
            ..Limits::default()
        };
        Admission::new(&TaskId::new("worker", 0), &limits)
    }

    #[test]
    fn sessions_being_created_count_against_the_limit() {
        let mut a = admission(2, 1);
        a.begin_create().unwrap();
        a.begin_create().unwrap();
        let err = a.begin_create().unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted);
        assert!(
            err.message().contains("already holds 2 sessions")
                && err.message().contains("limits.max_sessions = 2"),
            "{err}"
        );
        // One creation failed, one started: one place is free again.
        a.created(None);
        a.created(Some("s1"));
        assert_eq!(a.sessions(), 1);
        a.begin_create().unwrap();
        a.created(Some("s2"));
        assert!(a.begin_create().is_err());
        a.closed("s1");
        assert!(a.begin_create().is_ok());
    }

    #[test]
    fn a_step_slot_is_freed_when_dropped() {
        let mut a = admission(4, 2);
        a.begin_create().unwrap();
        a.created(Some("s"));
        assert!(a.start_step("unknown").unwrap().is_none());
        let first = a.start_step("s").unwrap().unwrap();
        let second = a.start_step("s").unwrap().unwrap();
        let err = a.start_step("s").err().unwrap();
        assert_eq!(err.code(), Code::ResourceExhausted);
        assert!(
            err.message()
                .starts_with("session s already runs 2 step(s); wait for one to finish"),
            "{err}"
        );
        assert!(err.message().contains("limits.max_steps_in_flight = 2"));
        drop(first);
        let third = a.start_step("s").unwrap().unwrap();
        drop((second, third));
    }
}
