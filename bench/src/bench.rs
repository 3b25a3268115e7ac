//! The run's state ([`Bench`]: the arguments, the work directory, the
//! report being filled) and its bookkeeping: how each system's server ran,
//! what could not be measured, and the tables written as the run goes.
//! The measurements themselves are in `lease_sweep`, `extras` and
//! `bag_runs`, each an `impl Bench` of its own.

use crate::args::{Args, Settings};
use crate::procs::{Server, WorkDir};
use crate::report::{Missing, Report};

/// The first line of `bin --version`, for the report.
pub(crate) fn version_of(bin: &str) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_string)
        })
        .unwrap_or_else(|| "version unknown".into())
}

pub(crate) fn data_note(server: &Server) -> &'static str {
    match &server.data {
        Some(d) if d.tmpfs => "data on tmpfs",
        Some(_) => "data on disk (tmpfs mount failed)",
        None => "no data directory (in RAM)",
    }
}

pub(crate) struct Bench {
    pub(crate) args: Args,
    pub(crate) settings: Settings,
    /// The lease sweep's current round (0-based); rows carry it until the
    /// rounds are merged.
    pub(crate) round: usize,
    pub(crate) work: WorkDir,
    pub(crate) report: Report,
}

impl Bench {
    /// How `system`'s server ran, once per system (the bagel variants share
    /// one note).
    pub(crate) fn note_server(&mut self, system: &str, how: String) {
        if !self.report.servers.iter().any(|(s, _)| s == system) {
            self.report.servers.push((system.to_string(), how));
        }
    }

    /// Writes the tables so far (`results.md`, `results.json`,
    /// `summary.json`; no plots) into `--out`, so that a run stopped from
    /// outside (a time limit on a lent machine) still leaves what it
    /// measured. `merged`: the rows are already one per point.
    pub(crate) fn checkpoint(&mut self, merged: bool) {
        let raw = (!merged).then(|| (self.report.rows.clone(), self.report.cpu_floor.clone()));
        if raw.is_some() {
            self.report.merge_rounds();
        }
        if let Err(e) = self.report.write_tables(&self.args.out) {
            eprintln!("warning: could not write the results so far: {e:#}");
        }
        if let Some((rows, cpu_floor)) = raw {
            self.report.rows = rows;
            self.report.cpu_floor = cpu_floor;
        }
    }

    pub(crate) fn missing(&mut self, what: impl Into<String>, why: impl Into<String>) {
        let (what, why) = (what.into(), why.into());
        eprintln!("  not measured: {what}: {why}");
        // Once per part, however many rounds failed the same way.
        if !self.report.missing.iter().any(|m| m.what == what) {
            self.report.missing.push(Missing { what, why });
        }
    }
}
