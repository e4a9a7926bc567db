//! The chief's progress display: step, steps per second and loss.
//!
//! On a terminal one line is redrawn in place (`\r`) at most ten times a second, as a bar;
//! otherwise (a log file, a pipe, a test) a plain line is written every [`LOG_EVERY`], so logs
//! stay readable. Both go to stderr, leaving stdout to the results.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// How often a plain progress line is written when stderr is not a terminal.
pub const LOG_EVERY: Duration = Duration::from_secs(2);
/// How often the terminal line is redrawn.
const REDRAW_EVERY: Duration = Duration::from_millis(100);
/// Width of the bar, in characters.
const BAR: usize = 24;

/// Progress of one training run towards `last_step`.
pub struct Progress {
    last_step: i64,
    terminal: bool,
    started: Instant,
    /// The step and time the rate is measured from.
    mark: (i64, Instant),
    rate: f64,
    last_drawn: Option<Instant>,
    first_step: Option<i64>,
    /// The last update not drawn yet (throttled).
    pending: Option<(i64, f32)>,
}

impl Progress {
    /// Progress towards `last_step`, redrawn when stderr is a terminal.
    pub fn new(last_step: i64) -> Self {
        Self::with_terminal(last_step, std::io::stderr().is_terminal())
    }

    /// The same, saying whether to redraw.
    pub fn with_terminal(last_step: i64, terminal: bool) -> Self {
        let now = Instant::now();
        Self {
            last_step,
            terminal,
            started: now,
            mark: (0, now),
            rate: 0.0,
            last_drawn: None,
            first_step: None,
            pending: None,
        }
    }

    /// Records that the global step reached `step` with batch loss `loss`; draws when due.
    pub fn update(&mut self, step: i64, loss: f32) {
        let now = Instant::now();
        if self.first_step.is_none() {
            self.first_step = Some(step);
            self.mark = (step, now);
        }
        let every = if self.terminal {
            REDRAW_EVERY
        } else {
            LOG_EVERY
        };
        if self
            .last_drawn
            .is_some_and(|t| now.duration_since(t) < every)
            && step < self.last_step
        {
            self.pending = Some((step, loss));
            return;
        }
        self.draw(step, loss, now);
    }

    fn draw(&mut self, step: i64, loss: f32, now: Instant) {
        self.pending = None;
        let elapsed = now.duration_since(self.mark.1).as_secs_f64();
        if elapsed > 0.0 && step > self.mark.0 {
            self.rate = (step - self.mark.0) as f64 / elapsed;
            self.mark = (step, now);
        }
        self.last_drawn = Some(now);
        let line = self.line(step, loss);
        let mut err = std::io::stderr().lock();
        let _ = if self.terminal {
            write!(err, "\r\x1b[2K{line}").and_then(|()| err.flush())
        } else {
            writeln!(err, "{line}")
        };
    }

    /// Draws the last update if it was throttled, ends the display (the terminal line is
    /// kept) and returns the mean steps per second up to `step`.
    pub fn finish(&mut self, step: i64) -> f64 {
        if let Some((step, loss)) = self.pending {
            self.draw(step, loss, Instant::now());
        }
        if self.terminal && self.last_drawn.is_some() {
            let _ = writeln!(std::io::stderr());
        }
        let secs = self.started.elapsed().as_secs_f64();
        let steps = step - self.first_step.unwrap_or(step);
        if secs > 0.0 {
            steps as f64 / secs
        } else {
            0.0
        }
    }

    /// `[#########...............]  step 412/1000  183.2 steps/s  loss 0.4312`.
    pub fn line(&self, step: i64, loss: f32) -> String {
        let done = if self.last_step > 0 {
            (step.clamp(0, self.last_step) as f64 / self.last_step as f64 * BAR as f64) as usize
        } else {
            BAR
        };
        format!(
            "[{}{}]  step {step}/{}  {:.1} steps/s  loss {loss:.4}",
            "#".repeat(done),
            ".".repeat(BAR - done),
            self.last_step,
            self.rate
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_shows_the_bar_step_rate_and_loss() {
        let progress = Progress::with_terminal(1000, false);
        // 250 of 1000 steps is a quarter of the 24-character bar: 6 marks.
        assert_eq!(
            progress.line(250, 0.5),
            "[######..................]  step 250/1000  0.0 steps/s  loss 0.5000"
        );
        assert!(progress
            .line(5000, 0.0)
            .starts_with(&format!("[{}]", "#".repeat(24))));
    }
}
