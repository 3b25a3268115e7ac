//! Progress bars for long work (`bagel read` and `bagel audit` over many
//! bags, `bagel metronome --once` catching up), on a terminal only: with
//! stderr not a terminal, or with `--json`, nothing is drawn, so scripts
//! and logs see exactly what they saw before.

use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar on stderr, or nothing.
#[derive(Debug, Clone)]
pub struct Bar(Option<ProgressBar>);

impl Bar {
    /// A bar counting `unit` (e.g. "bags"), shown only on a terminal and
    /// when the output is not JSON.
    pub fn new(what: &str, unit: &str, json: bool) -> Bar {
        if json || !std::io::stderr().is_terminal() {
            return Bar(None);
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(&format!(
            "{{prefix}} {{bar:30}} {{pos}}/{{len}} {unit} ({{per_sec}}, {{eta}} left)"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_prefix(what.to_owned());
        bar.enable_steady_tick(Duration::from_millis(200));
        Bar(Some(bar))
    }

    /// Sets the work done and the total.
    pub fn set(&self, done: u64, total: u64) {
        if let Some(b) = &self.0 {
            b.set_length(total);
            b.set_position(done);
        }
    }

    pub fn inc(&self) {
        if let Some(b) = &self.0 {
            b.inc(1);
        }
    }

    /// The bag reader's progress callback, drawing on this bar.
    pub fn for_reader(&self) -> bagel_bags::Progress {
        let bar = self.clone();
        bagel_bags::Progress::new(move |done, total| bar.set(done, total))
    }

    /// Removes the bar (before printing results).
    pub fn finish(&self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}
