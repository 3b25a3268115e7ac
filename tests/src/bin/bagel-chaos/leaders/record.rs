//! What the driver records of the leaders: the reader of each name's pipe,
//! which timestamps every line on the driver's clock as it arrives, and
//! `timeline.txt`, every line and every `bagel run`'s fate in one list.
//!
//! Separate from the checks: this only writes down what happened, in the
//! pipe's order; judging it is `check`'s.

use std::io::BufRead as _;
use std::time::Instant;

use super::{Event, Kind, LeaderSetup, Live, Shared, name_of};

/// `timeline.txt` beside the standbys' logs: every line the leaders wrote
/// and every `bagel run`'s fate, in seconds since the run began, for whoever
/// reads a failed run.
pub(super) fn write_timeline(live: &Live, setup: &LeaderSetup) -> anyhow::Result<()> {
    let t = |at: Instant| at.saturating_duration_since(setup.started).as_secs_f64();
    let mut rows: Vec<(f64, String)> = Vec::new();
    for (name, events) in live.events.iter().enumerate() {
        for e in events {
            rows.push((
                t(e.at),
                format!("{} {:?} unit {} token {}", name_of(name), e.kind, e.unit, e.token),
            ));
        }
    }
    for (unit, u) in &live.units {
        if let Some((at, exit)) = &u.exit {
            rows.push((
                t(*at),
                format!("{} unit {unit} ({}) bagel run {exit}", name_of(u.name), u.step),
            ));
        }
        if let Some(at) = u.migrated {
            rows.push((
                t(at),
                format!("{} unit {unit} SIGTERMed waiting on older lists", name_of(u.name)),
            ));
        }
        if let Some((at, what)) = u.killed {
            rows.push((t(at), format!("{} unit {unit} {what} SIGKILLed", name_of(u.name))));
        }
        for (from, until) in &u.freezes {
            rows.push((
                t(*from),
                format!("{} unit {unit} frozen until {:.3}", name_of(u.name), t(*until)),
            ));
        }
    }
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let text: String = rows.iter().map(|(at, row)| format!("{at:.3} {row}\n")).collect();
    std::fs::write(setup.dir.join("timeline.txt"), text)?;
    Ok(())
}

/// Reads one name's pipe until every command that held it has exited.
pub(super) fn read_lines(name: usize, reader: std::io::PipeReader, shared: &Shared) {
    for line in std::io::BufReader::new(reader).lines() {
        let Ok(line) = line else { break };
        let at = Instant::now();
        let f: Vec<&str> = line.split_whitespace().collect();
        let [kind, unit, token, pid] = f[..] else { continue };
        let kind = match kind {
            "START" => Kind::Start,
            "STEP" => Kind::Step,
            "END" => Kind::End,
            _ => continue,
        };
        let (Ok(unit), Ok(token), Ok(pid)) = (unit.parse(), token.parse(), pid.parse()) else {
            continue;
        };
        let mut live = shared.live.lock().expect("live");
        live.events[name].push(Event {
            at,
            kind,
            unit,
            token,
        });
        match kind {
            Kind::Start => {
                let u = live.units.entry(unit).or_default();
                u.cmd_pid = Some(pid);
                u.started = true;
                live.leading[name] = Some(unit);
            }
            Kind::End if live.leading[name] == Some(unit) => live.leading[name] = None,
            _ => {}
        }
    }
}
