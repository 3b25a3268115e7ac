//! What the cuts, the batches and the reads must show, and the parsing
//! of the writers' and the readers' lines.

use std::collections::BTreeSet;

use anyhow::bail;

use super::{Batch, Failure, Outcome, StoreCut, StorePhase, WRITER_OP_TIMEOUTS, batch_bound};

/// One cut's outcome from the batches and closes around it, and its
/// violations: for a writer cut, no batch wholly inside it acknowledged
/// and at least one failed; for a closer cut, the writers acknowledged
/// batches during it.
pub(super) fn judge_cut(
    kind: &'static str,
    direction: &'static str,
    (cut_at, heal_at, recovered_at): (u64, u64, u64),
    batches: &[Batch],
    closes: &[(u64, u64)],
    violations: &mut Vec<String>,
) -> StoreCut {
    let during: Vec<&Batch> = batches
        .iter()
        .filter(|b| b.start_us >= cut_at && b.start_us < heal_at)
        .collect();
    let acked = during
        .iter()
        .filter(|b| matches!(b.outcome, Outcome::Acked(_)))
        .count() as u64;
    let cut = StoreCut {
        kind,
        direction,
        length_ms: (heal_at - cut_at) / 1000,
        batches: during.len() as u64,
        failed: during.len() as u64 - acked,
        acked,
        closes: closes
            .iter()
            .filter(|(t, _)| (cut_at..heal_at).contains(t))
            .map(|(_, n)| n)
            .sum(),
        recovered_ms: recovered_at.saturating_sub(heal_at) / 1000,
    };
    let name = format!("{kind} ({direction})");
    if kind == "writer_to_store" {
        for b in during.iter().filter(|b| b.end_us <= heal_at) {
            if let Outcome::Acked(msgs) = &b.outcome {
                violations.push(format!(
                    "{name}: writer {} had a batch acknowledged with its store cut off the whole time \
                     ({} µs to {} µs, cut {cut_at} to {heal_at}): {msgs:?}",
                    b.writer, b.start_us, b.end_us
                ));
            }
        }
        if cut.failed == 0 {
            violations.push(format!(
                "{name}: no write failed during a {} ms cut",
                cut.length_ms
            ));
        }
    } else if acked == 0 {
        violations.push(format!(
            "{name}: the writers had nothing acknowledged while only the closer was cut off"
        ));
    }
    cut
}

/// The failures by why, the longest batch, and every batch within its
/// bound.
pub(super) fn judge_batches(batches: &[Batch], report: &mut StorePhase, violations: &mut Vec<String>) {
    for b in batches {
        let took = b.end_us.saturating_sub(b.start_us);
        let longest = &mut report.longest_batch_ms[b.writer];
        *longest = (*longest).max(took / 1000);
        let bound = batch_bound(WRITER_OP_TIMEOUTS[b.writer]);
        if took > bound.as_micros() as u64 {
            violations.push(format!(
                "writer {}: a batch took {} ms (bound {} ms)",
                b.writer,
                took / 1000,
                bound.as_millis()
            ));
        }
        match &b.outcome {
            Outcome::Failed {
                why: Failure::Timeout,
                ..
            } => report.failed_timeout += 1,
            Outcome::Failed {
                why: Failure::Late, ..
            } => report.failed_late += 1,
            Outcome::Failed {
                why: Failure::Other, ..
            } => report.failed_other += 1,
            Outcome::Acked(_) => {}
        }
    }
}

/// A writer's line: `OK <start> <end> <ts>:<payload>...` or `FAILED
/// <start> <end> <why> <payload>,... <error>`.
pub(super) fn parse_batch(writer: usize, line: &str) -> Option<Batch> {
    let mut f = line.split_whitespace();
    let what = f.next()?;
    let start_us = f.next()?.parse().ok()?;
    let end_us = f.next()?.parse().ok()?;
    let outcome = match what {
        "OK" => Outcome::Acked(
            f.map(|m| {
                let (ts, p) = m.split_once(':')?;
                Some((ts.parse().ok()?, p.to_owned()))
            })
            .collect::<Option<_>>()?,
        ),
        "FAILED" => Outcome::Failed {
            why: match f.next()? {
                "timeout" => Failure::Timeout,
                "late" => Failure::Late,
                _ => Failure::Other,
            },
            payloads: f.next()?.split(',').map(str::to_owned).collect(),
        },
        _ => return None,
    };
    Some(Batch {
        writer,
        start_us,
        end_us,
        outcome,
    })
}

/// What one `bagel read --json` read: (timestamp, payload) of each
/// message, and the lines that say something is wrong.
pub(super) struct Read {
    pub(super) messages: BTreeSet<(u64, String)>,
    pub(super) bad: Vec<String>,
}

pub(super) fn parse_read(out: &std::process::Output) -> anyhow::Result<Read> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !stdout.contains(r#""kind":"summary""#) {
        bail!(
            "failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut r = Read {
        messages: BTreeSet::new(),
        bad: Vec::new(),
    };
    for line in stdout.lines() {
        let v: serde_json::Value = serde_json::from_str(line)?;
        match v["kind"].as_str() {
            Some("message") => {
                r.messages.insert((
                    v["timestamp_us"].as_u64().unwrap_or(0),
                    v["payload"].as_str().unwrap_or_default().to_owned(),
                ));
            }
            Some("rejected") => r.bad.push(format!("rejected: {line}")),
            Some("problem") => r.bad.push(format!("damage: {line}")),
            Some("summary") if v["open_bags_skipped"].as_u64() != Some(0) => r
                .bad
                .push(format!("open bags skipped after every bag was due: {line}")),
            _ => {}
        }
    }
    Ok(r)
}
