//! Bounded waits for kernels that block on a shared resource (a queue's dequeue, an
//! accumulator's take): when the wait ends, and how it notices a cancelled step.
//!
//! TensorFlow lets these ops wait forever, which is how a synchronous job hangs when one
//! replica dies. Here every wait has a deadline: the op's own timeout when it has one, else
//! the step's deadline, else the resource's default (set when the resource is created, from
//! the `_wait_timeout_ms` attr of its creating op or [`DEFAULT_WAIT`]). A waiter also polls the
//! step's cancellation token, so a closed session wakes its blocked kernels.

use std::sync::{Condvar, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::Status;
use crate::runtime::cancel::CancellationToken;
use crate::runtime::pool;

/// The wait of a blocking op that has neither its own timeout nor a step deadline.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// How often a waiter looks at its step's cancellation token (the token has no callbacks).
const CANCEL_POLL: Duration = Duration::from_millis(20);

/// How much earlier than the step's deadline a waiter gives up, so that its error (naming what
/// it waited for) becomes the step's error rather than the executor's generic one.
const STEP_DEADLINE_MARGIN: Duration = Duration::from_millis(25);

/// When a blocking wait ends and what can cut it short.
#[derive(Clone, Debug)]
pub struct Wait {
    /// The wait fails with DEADLINE_EXCEEDED at this instant.
    pub deadline: Instant,
    /// How long the wait was allowed, for messages ("within 30 s").
    pub allowed: Duration,
    /// The step's token; a cancelled step ends the wait with its reason.
    pub cancellation: Option<CancellationToken>,
}

impl Wait {
    /// The wait of an op: its own `timeout` (if any), else the step's deadline (a little before
    /// it), else `default`; the earliest of the first two when both are set.
    pub fn new(
        timeout: Option<Duration>,
        step_deadline: Option<Instant>,
        default: Duration,
        cancellation: Option<CancellationToken>,
    ) -> Self {
        let now = Instant::now();
        let step = step_deadline.map(|d| {
            let left = d.saturating_duration_since(now);
            now + left.saturating_sub(STEP_DEADLINE_MARGIN.min(left / 10))
        });
        let own = timeout.map(|t| now + t);
        let deadline = match (own, step) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => now + default,
        };
        Self {
            deadline,
            allowed: deadline.saturating_duration_since(now),
            cancellation,
        }
    }

    /// A wait of `timeout` from now that nothing cancels (tests, direct resource use).
    pub fn for_duration(timeout: Duration) -> Self {
        Self::new(Some(timeout), None, timeout, None)
    }

    /// Blocks on `cv` until `ready(state)` holds, the deadline passes or the step is cancelled.
    /// Returns the guard when ready; otherwise `Err(Ended::Deadline)` or
    /// `Err(Ended::Cancelled(reason))` with the guard, so the caller can describe the state.
    pub fn until<'a, T>(
        &self,
        cv: &Condvar,
        mut guard: MutexGuard<'a, T>,
        mut ready: impl FnMut(&T) -> bool,
    ) -> std::result::Result<MutexGuard<'a, T>, (Ended, MutexGuard<'a, T>)> {
        loop {
            if ready(&guard) {
                return Ok(guard);
            }
            if let Some(reason) = self.cancellation.as_ref().and_then(|t| t.reason()) {
                return Err((Ended::Cancelled(reason), guard));
            }
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err((Ended::Deadline, guard));
            }
            let slice = if self.cancellation.is_some() {
                left.min(CANCEL_POLL)
            } else {
                left
            };
            guard = pool::blocking(|| cv.wait_timeout(guard, slice))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Why a wait ended without its condition.
#[derive(Clone, Debug, PartialEq)]
pub enum Ended {
    /// The deadline passed.
    Deadline,
    /// The step was cancelled, with the canceller's reason.
    Cancelled(Status),
}

/// Formats a duration for people: `30 s`, `1.5 s`, `250 ms`.
pub fn human(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        let s = d.as_secs_f64();
        if (s - s.round()).abs() < 0.05 {
            format!("{} s", s.round())
        } else {
            format!("{s:.1} s")
        }
    } else {
        format!("{} ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn the_op_timeout_wins_over_a_later_step_deadline_and_the_default_applies_last() {
        let now = Instant::now();
        let w = Wait::new(
            Some(Duration::from_millis(100)),
            Some(now + Duration::from_secs(10)),
            DEFAULT_WAIT,
            None,
        );
        assert!(w.allowed <= Duration::from_millis(100));
        let w = Wait::new(None, Some(now + Duration::from_secs(1)), DEFAULT_WAIT, None);
        // A little before the step's deadline: at most 25 ms earlier.
        assert!(w.allowed <= Duration::from_secs(1) && w.allowed >= Duration::from_millis(950));
        let w = Wait::new(None, None, Duration::from_secs(3), None);
        assert!(w.allowed > Duration::from_millis(2900) && w.allowed <= Duration::from_secs(3));
    }

    #[test]
    fn a_cancelled_token_ends_the_wait_with_its_reason() {
        let token = CancellationToken::new();
        token.cancel(Status::cancelled("session closed"));
        let m = Mutex::new(0);
        let cv = Condvar::new();
        let w = Wait::new(
            Some(Duration::from_secs(5)),
            None,
            DEFAULT_WAIT,
            Some(token),
        );
        let started = Instant::now();
        let (ended, guard) = w.until(&cv, m.lock().unwrap(), |v| *v > 0).unwrap_err();
        drop(guard);
        assert_eq!(ended, Ended::Cancelled(Status::cancelled("session closed")));
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(human(Duration::from_secs(30)), "30 s");
        assert_eq!(human(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(human(Duration::from_millis(250)), "250 ms");
    }
}
