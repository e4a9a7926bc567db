//! The chief's progress display: step, steps per second and loss.
//!
//! On a terminal an `indicatif` progress bar is redrawn in place (step, rate, loss, time
//! left); otherwise (systemd, CI, a log file, a pipe, a test) a plain line is written every
//! [`LOG_EVERY`], so logs stay readable. Both go to stderr, leaving stdout to the results.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The terminal bar: `[####....]  step 412/1000  183.2 steps/s  loss 0.4312  4s left`.
pub const BAR_TEMPLATE: &str = "[{bar:24}]  step {pos}/{len}  {per_sec}  loss {msg}  {eta} left";

/// How often a plain progress line is written when stderr is not a terminal.
pub const LOG_EVERY: Duration = Duration::from_secs(2);
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
    /// The terminal's bar, made at the first update (its rate counts from that step).
    bar: Option<ProgressBar>,
    /// Whether the plain line at the last step was written: later updates (the global step
    /// moves on while asynchronous workers finish) add no line.
    drew_last: bool,
}

/// The bar towards `last_step`, at `step` with batch loss `loss`, drawn to `target`.
fn terminal_bar(last_step: i64, step: i64, loss: f32, target: ProgressDrawTarget) -> ProgressBar {
    let style = ProgressStyle::with_template(BAR_TEMPLATE)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("#>.")
        .with_key(
            "per_sec",
            |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{:.1} steps/s", state.per_sec());
            },
        );
    let bar = ProgressBar::with_draw_target(Some(last_step.max(0) as u64), target)
        .with_style(style)
        .with_message(format!("{loss:.4}"));
    bar.set_position(step.max(0) as u64);
    bar.reset_eta();
    bar
}

impl Progress {
    /// Progress towards `last_step`: a bar when stderr is a terminal, plain lines otherwise.
    pub fn new(last_step: i64) -> Self {
        Self::with_terminal(last_step, std::io::stderr().is_terminal())
    }

    /// The same, saying whether stderr is a terminal (a bar) or not (plain lines).
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
            bar: None,
            drew_last: false,
        }
    }

    /// Records that the global step reached `step` with batch loss `loss`; draws when due.
    pub fn update(&mut self, step: i64, loss: f32) {
        let now = Instant::now();
        if self.first_step.is_none() {
            self.first_step = Some(step);
            self.mark = (step, now);
            if self.terminal {
                self.bar = Some(terminal_bar(
                    self.last_step,
                    step,
                    loss,
                    ProgressDrawTarget::stderr(),
                ));
            }
        }
        if let Some(bar) = &self.bar {
            // indicatif throttles its own redraws.
            bar.set_message(format!("{loss:.4}"));
            bar.set_position(step.clamp(0, self.last_step.max(0)) as u64);
            self.last_drawn = Some(now);
            return;
        }
        if self.drew_last {
            return;
        }
        if self
            .last_drawn
            .is_some_and(|t| now.duration_since(t) < LOG_EVERY)
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
        self.drew_last = step >= self.last_step;
        let line = self.line(step, loss);
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{line}");
    }

    /// Draws the last update if it was throttled, ends the display (the terminal line is
    /// kept) and returns the mean steps per second up to `step`.
    pub fn finish(&mut self, step: i64) -> f64 {
        if let Some(bar) = self.bar.take() {
            // The bar stays on the terminal, at its last step; the results go below it.
            bar.abandon();
            let _ = writeln!(std::io::stderr());
        } else if let Some((step, loss)) = self.pending {
            self.draw(step, loss, Instant::now());
        }
        let secs = self.started.elapsed().as_secs_f64();
        let steps = step - self.first_step.unwrap_or(step);
        if secs > 0.0 {
            steps as f64 / secs
        } else {
            0.0
        }
    }

    /// The plain line: `[#########...............]  step 412/1000  183.2 steps/s  loss 0.4312`;
    /// a step past the last shows as the last.
    pub fn line(&self, step: i64, loss: f32) -> String {
        let step = step.min(self.last_step.max(0));
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
            .starts_with(&format!("[{}]  step 1000/1000", "#".repeat(24))));
    }

    #[test]
    fn plain_lines_end_at_the_last_step() {
        let mut progress = Progress::with_terminal(1000, false);
        progress.update(999, 0.5);
        assert!(!progress.drew_last);
        progress.update(1000, 0.5);
        assert!(progress.drew_last);
        // Asynchronous workers moved the global step on: nothing more is pending or drawn.
        progress.update(1001, 0.25);
        assert!(progress.pending.is_none());
        let at = progress.last_drawn;
        progress.finish(1001);
        assert_eq!(progress.last_drawn, at, "no line after the last step's");
    }

    #[test]
    fn the_bar_template_parses_and_tracks_the_step_and_loss() {
        assert!(ProgressStyle::with_template(BAR_TEMPLATE).is_ok());
        // Restored at step 300 of 1000: the bar starts there, the rate counts from there.
        let bar = terminal_bar(1000, 300, 0.75, ProgressDrawTarget::hidden());
        assert_eq!(bar.message(), "0.7500");
        assert_eq!(bar.length(), Some(1000));
        assert_eq!(bar.position(), 300);
        let mut progress = Progress::with_terminal(1000, true);
        progress.update(300, 0.5);
        progress.update(400, 0.25);
        let shown = progress.bar.as_ref().expect("a bar on a terminal");
        assert_eq!(shown.position(), 400);
        assert_eq!(shown.message(), "0.2500");
        // Past the last step (asynchronous workers), the bar is full, not beyond.
        progress.update(1003, 0.125);
        assert_eq!(progress.bar.as_ref().unwrap().position(), 1000);
        assert!(progress.finish(1003) >= 0.0);
        assert!(progress.bar.is_none(), "finished");
        // Not a terminal: no bar, plain lines.
        let mut plain = Progress::with_terminal(1000, false);
        plain.update(1, 1.0);
        assert!(plain.bar.is_none());
    }
}
