//! The checks of one name's lines, on the pipe's order: at most one leader
//! at a time (a frozen leader's stale lines excepted, under a lower
//! fencing token), tokens rising, and no gap without a leader longer than
//! the TTL plus [`GAP_MARGIN`] that no outage of the name's server explains.
//! The checks hold across the migration: a leader on the old lists and the
//! next on the new ones write to the one pipe of their name like any two.
//!
//! Separate from the recording and the loops: a pure judgement over what
//! was recorded, run once the loops have stopped.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::outages::before;

use super::{Event, FailoverReport, GAP_MARGIN, KILL_GRACE, Kind, LeaderSetup, THAW_SLACK, Unit, ms};

/// The checks of one name's lines.
pub(super) struct Check<'a> {
    pub(super) name: String,
    /// The members that owned the name when the loops began.
    pub(super) first_owners: &'a [String],
    pub(super) events: &'a [Event],
    pub(super) units: &'a HashMap<u64, Unit>,
    pub(super) setup: &'a LeaderSetup,
    /// When the loops started, and when they were told to stop.
    pub(super) begun: Instant,
    pub(super) stopping: Instant,
}

/// One leader of a name: its first and last line (index in the pipe's
/// order, and when the driver read it).
struct Led {
    unit: u64,
    token: u64,
    start: (usize, Instant),
    last: (usize, Instant),
    ended: bool,
}

impl Check<'_> {
    pub(super) fn run(&self, report: &mut FailoverReport, found: &mut Vec<String>) {
        let mut leaders: Vec<Led> = Vec::new();
        let mut index: HashMap<u64, usize> = HashMap::new();
        for (i, e) in self.events.iter().enumerate() {
            if e.kind == Kind::Start {
                index.insert(e.unit, leaders.len());
                leaders.push(Led {
                    unit: e.unit,
                    token: e.token,
                    start: (i, e.at),
                    last: (i, e.at),
                    ended: false,
                });
            } else if let Some(&k) = index.get(&e.unit) {
                leaders[k].last = (i, e.at);
                leaders[k].ended |= e.kind == Kind::End;
            }
        }
        report.leaders += leaders.len() as u64;
        let t = |at: Instant| at.saturating_duration_since(self.setup.started).as_secs_f64();
        match leaders.first() {
            Some(first) => {
                self.gap(
                    report,
                    found,
                    self.first_owners,
                    "first election",
                    self.begun,
                    first.start.1,
                );
            }
            None => found.push(format!("leaders: {} never had a leader", self.name)),
        }
        for pair in leaders.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            let ua = &self.units[&a.unit];
            let ub = &self.units[&b.unit];
            report.count += 1;
            *report.across_migration.entry(ub.step).or_default() += 1;
            if ua.step != ub.step {
                report.between_steps += 1;
            }
            // Who owned the name under either's lists.
            let mut owners = ua.owners.clone();
            owners.extend(ub.owners.iter().filter(|o| !ua.owners.contains(o)).cloned());
            if b.token <= a.token {
                report.token_regressions += 1;
                found.push(format!(
                    "leaders: {}: unit {} led with fencing token {} after unit {} with {}",
                    self.name, b.unit, b.token, a.unit, a.token
                ));
            }
            if a.last.0 > b.start.0 {
                // A wrote after B had started.
                let stale: Vec<&Event> = self.events[b.start.0..]
                    .iter()
                    .filter(|e| e.unit == a.unit)
                    .collect();
                let thawed = ua.freezes.last().map(|f| f.1 + KILL_GRACE + THAW_SLACK);
                if let Some(by) = thawed
                    && a.token < b.token
                    && stale.iter().all(|e| e.at <= by)
                {
                    report.stale_steps_after_freeze += stale.len() as u64;
                } else {
                    report.overlaps += 1;
                    found.push(format!(
                        "leaders: {}: two leaders at once: unit {} (token {}, started {:.3}s, freezes {:?}, \
                         supervisor stops {}, killed {:?}, {}) wrote {} lines after unit {} (token {}) started at \
                         {:.3}s, the last at {:.3}s",
                        self.name,
                        a.unit,
                        a.token,
                        t(a.start.1),
                        ua.freezes.iter().map(|f| (t(f.0), t(f.1))).collect::<Vec<_>>(),
                        ua.stops,
                        ua.killed.map(|k| (t(k.0), k.1)),
                        ua.exit.as_ref().map_or("running", |e| e.1.as_str()),
                        stale.len(),
                        b.unit,
                        b.token,
                        t(b.start.1),
                        t(a.last.1)
                    ));
                }
                continue;
            }
            let cause = self.cause(a);
            *report.by_cause.entry(cause.clone()).or_default() += 1;
            let gap = self.gap(report, found, &owners, &cause, self.ended_at(a), b.start.1);
            let longest = report.longest_gap_ms_by_cause.entry(cause).or_default();
            *longest = (*longest).max(ms(gap));
        }
        // A name left without a leader before the stop.
        if let Some(last) = leaders.last() {
            let u = &self.units[&last.unit];
            let over =
                last.ended || u.killed.is_some() || u.exit.as_ref().is_some_and(|e| e.0 < self.stopping);
            let ended = self.ended_at(last);
            if over && ended < self.stopping {
                self.gap(
                    report,
                    found,
                    &u.owners,
                    "no leader at the stop",
                    ended,
                    self.stopping,
                );
            }
        }
    }

    /// When a leader was last seen working: its last line, or its kill.
    fn ended_at(&self, a: &Led) -> Instant {
        let killed = self.units[&a.unit].killed.map(|k| k.0);
        killed.map_or(a.last.1, |k| k.max(a.last.1))
    }

    /// How a leader's time ended.
    fn cause(&self, a: &Led) -> String {
        let u = &self.units[&a.unit];
        let exit = u.exit.as_ref().map_or("running", |e| e.1.as_str());
        match u.killed {
            Some((_, "unit")) => "unit killed".into(),
            Some((_, "command")) => "command killed".into(),
            _ if u.migrated.is_some() => format!("restarted onto new lists, then {exit}"),
            _ if !u.freezes.is_empty() => format!("frozen, then {exit}"),
            _ if u.stops > 0 => format!("supervisor stopped, then {exit}"),
            _ if exit == "exit 0" && a.ended => "released".into(),
            _ if exit == "exit 3" => "fenced".into(),
            _ => exit.to_owned(),
        }
    }

    /// Judges one leaderless stretch `[from, to]` of a name `owners` owned;
    /// returns its length.
    fn gap(
        &self,
        report: &mut FailoverReport,
        found: &mut Vec<String>,
        owners: &[String],
        what: &str,
        from: Instant,
        to: Instant,
    ) -> Duration {
        let gap = to.saturating_duration_since(from);
        let ttl = self.setup.ttl;
        // An outage of the owner up to a TTL before the gap began can
        // still hold it up: a lease it could not renew runs out, a restart
        // waits out its max TTL.
        if let Some(o) = owners
            .iter()
            .find_map(|owner| self.setup.outages.of_member_during(owner, before(from, ttl), to))
        {
            report.explained_gaps += 1;
            report.longest_explained_gap_ms = report.longest_explained_gap_ms.max(ms(gap));
            if gap > ttl + GAP_MARGIN {
                println!(
                    "bagel-chaos: {}: {} ms without a leader ({what}), explained by a {} of {}",
                    self.name,
                    ms(gap),
                    o.kind,
                    o.member
                );
            }
            return gap;
        }
        report.longest_gap_ms = report.longest_gap_ms.max(ms(gap));
        if gap > ttl + GAP_MARGIN {
            report.gaps_over_bound += 1;
            let t = |at: Instant| at.saturating_duration_since(self.setup.started).as_secs_f64();
            found.push(format!(
                "leaders: {}: no leader for {} ms ({what}), from {:.3}s to {:.3}s, over the TTL + {} ms with no \
                 outage of its servers {}",
                self.name,
                ms(gap),
                t(from),
                t(to),
                ms(GAP_MARGIN),
                owners.join(", ")
            ));
        }
        gap
    }
}
