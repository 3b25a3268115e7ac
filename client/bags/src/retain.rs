//! Retention: removing old bags once a summary that holds them has been
//! checked against them, and (optionally) old summaries with their
//! attestations. An attestation never stands in for that check: a
//! summarizer's word is for readers, not for deleting the evidence.
//!
//! Bags go only where a published summary covers them and
//! [`summary::check`] finds every one of them as summarized (a bag already
//! gone counts, so an interrupted run resumes): nothing that no summary
//! holds is ever removed, and whatever an auditor needs (every record with
//! its witnesses, signed times and holder signatures) is in the summary.
//!
//! Before it removes anything of a minute, retention writes the minute's
//! tombstone ([`crate::tombstone`]), naming the summary it checked, and
//! never removes it: from then on the minute is closed for good, to a
//! writer held for longer than the keep (its record is `LateRejected`
//! unless the summary holds it), to a closer or reader that listed a bag
//! just before it went, and across a run killed at any step. Each bag's
//! lock still goes last, so a bag half removed reads as closed too. Then
//! it removes every bag left in the minute: the summarized ones, and any
//! made again since the tombstone (a late append, a closer's lock, a
//! killed run's empty directory), which are no data. Minute seals stay
//! (one small object a minute, the tombstone beside each): without them a
//! reader would seal those minutes again.
//!
//! Safe beside writers, closers and summarizers: they only touch bags
//! within a metronome's lookback or a lease's deadline, far newer than
//! anything kept for [`MIN_KEEP`]. A reader that reads the removed bags
//! from their summary is unaffected; one that reads with summaries off
//! finds them missing from their minute's seal and reports a problem
//! naming the summary that holds them
//! ([`crate::ProblemKind::Missing`]), never a silent gap.
//!
//! A summary that does not check, or is corrupt, keeps its stretch's
//! bags (a line of [`RetainReport::kept`]) and the run goes on with the
//! other stretches: one bad summary must not stop the retention of a
//! log.

use std::time::Duration;

use bagel_proto::Micros;

use crate::seal;
use crate::summary::{self, Stretch};
use crate::{BagStore, Error, Result};

/// Bags are kept at least this long after their stretch ended.
pub const MIN_KEEP: Duration = Duration::from_secs(10 * 60);

/// What one run of [`retain`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetainReport {
    /// Summaries old enough whose bags were checked.
    pub summaries_checked: u64,
    /// Bags removed (or found removed) under a checked summary.
    pub bags_removed: u64,
    /// Bags found made again in minutes already removed (see
    /// [`summary::SummaryCheck::bags_recreated`]), and removed.
    pub leftovers_removed: u64,
    /// Minutes marked removed ([`crate::tombstone`]) by this run.
    pub minutes_tombstoned: u64,
    /// Summaries removed (`keep_summaries`).
    pub summaries_removed: u64,
    /// Attestations removed, each with its summary (never on their own,
    /// and never taken as a check: bags go only on [`summary::check`]).
    pub attestations_removed: u64,
    /// Stretches whose bags were kept, and why: their summary does not
    /// match them, or it (or a seal or bag it is checked against) is
    /// corrupt. Each names the stretch and its summary; the run goes on
    /// with the other stretches, so one bad summary does not stop
    /// retention of the log.
    pub kept: Vec<String>,
}

/// Removes the bags of every summarized stretch of `log` that ended more
/// than `keep_bags` before `now` (a vouched instant) and whose summary
/// checks against them; with `keep_summaries`, also the summaries of
/// stretches that ended more than that before `now`. `keep_bags` under
/// [`MIN_KEEP`] is refused.
pub async fn retain(
    store: &dyn BagStore,
    log: &str,
    now: Micros,
    keep_bags: Duration,
    keep_summaries: Option<Duration>,
) -> Result<RetainReport> {
    retain_within(store, log, now, keep_bags, keep_summaries, MIN_KEEP).await
}

/// [`retain`] with `min_keep` in place of [`MIN_KEEP`]: for fault runs,
/// which cannot wait ten minutes to see bags go. Safe only while
/// `min_keep` is longer than every closer's lookback and every lease's
/// TTL (nobody writes or closes a bag that old); `bagel retain
/// --unsafe-min-keep` says so.
pub async fn retain_within(
    store: &dyn BagStore,
    log: &str,
    now: Micros,
    keep_bags: Duration,
    keep_summaries: Option<Duration>,
    min_keep: Duration,
) -> Result<RetainReport> {
    crate::validate_log(log)?;
    for (what, keep) in [
        ("--keep-bags", Some(keep_bags)),
        ("--keep-summaries", keep_summaries),
    ] {
        if let Some(keep) = keep
            && keep < min_keep
        {
            return Err(Error::invalid(
                "retention",
                format!("{what} {keep:?}"),
                format!("keep at least {min_keep:?}: writers and closers still work on newer bags"),
            ));
        }
    }
    if let Some(ks) = keep_summaries
        && ks < keep_bags
    {
        return Err(Error::invalid(
            "retention",
            format!("--keep-summaries {ks:?}"),
            format!("shorter than --keep-bags {keep_bags:?}: the summary would go before its bags"),
        ));
    }
    let ended_before = |stretch: Stretch, keep: Duration| stretch.last().end().saturating_add(keep) <= now;
    let mut report = RetainReport::default();
    for stretch in summary::list(store, log).await? {
        if !ended_before(stretch, keep_bags) {
            continue;
        }
        report.summaries_checked += 1;
        match remove_checked(store, log, stretch, &mut report).await? {
            Checked::Removed => {}
            Checked::Kept(why) => {
                report
                    .kept
                    .push(format!("{stretch} (summary {}): {why}", stretch.name()));
                continue;
            }
        }
        if let Some(keep) = keep_summaries
            && ended_before(stretch, keep)
        {
            report.attestations_removed += summary::remove(store, log, stretch).await?;
            report.summaries_removed += 1;
        }
    }
    Ok(report)
}

/// What became of one stretch's bags.
enum Checked {
    Removed,
    /// Kept, and why.
    Kept(String),
}

/// Removes the bags of `stretch` (counting them in `report`) if its
/// summary checks against them: first a tombstone for each of its minutes
/// not yet removed, then the summarized bags, then whatever else is left
/// in those minutes. A summary that does not match, or that cannot be
/// checked because it, or a seal, tombstone or bag it is checked against,
/// is corrupt, keeps them: that is a finding about this stretch, and the
/// caller goes on with the others. Only a failing store (which another
/// run may not meet) ends the run.
async fn remove_checked(
    store: &dyn BagStore,
    log: &str,
    stretch: Stretch,
    report: &mut RetainReport,
) -> Result<Checked> {
    let bad = |e: Error| match e {
        Error::CorruptSummary { .. }
        | Error::CorruptSeal { .. }
        | Error::CorruptLock { .. }
        | Error::SummaryMismatch { .. }
        | Error::ItemChanged { .. }
        | Error::ItemRefused { .. } => Ok(Checked::Kept(e.to_string())),
        e => Err(e),
    };
    let check = match summary::check(store, log, stretch).await {
        Ok(check) => check,
        Err(e) => return bad(e),
    };
    if !check.mismatched.is_empty() {
        return Ok(Checked::Kept(check.mismatched.join("; ")));
    }
    let published = match summary::load(store, log, stretch).await {
        Ok(published) => published,
        Err(e) => return bad(e),
    };
    for span in stretch.spans() {
        if check.minutes_removed.contains(&span) {
            continue;
        }
        if let Err(e) = crate::tombstone::put(store, log, span, stretch).await {
            return bad(e);
        }
        report.minutes_tombstoned += 1;
    }
    let summarized: Vec<crate::Bucket> = published
        .bags
        .iter()
        .map(|b| crate::Bucket::from_secs(b.bucket_secs))
        .collect();
    for &bag in &summarized {
        store.remove_bag(log, bag).await?;
        report.bags_removed += 1;
    }
    report.leftovers_removed += check.bags_recreated;
    // A late writer may make a bag in a second the seal closed empty, and
    // whatever was made again since a minute's tombstone is no data: one
    // listing a minute finds them.
    for span in stretch.spans() {
        for bag in seal::bags_of(store, log, span).await? {
            store.remove_bag(log, bag).await?;
            report.leftovers_removed += 1;
        }
    }
    Ok(Checked::Removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::directory::DirectoryStore;

    /// Each refusal names the flag and the bound, and nothing is touched.
    #[tokio::test]
    async fn keeps_too_short_or_summaries_before_bags_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirectoryStore::local(dir.path(), false);
        let now = Micros::from_micros(2_000_000_000_000_000);
        let hour = Duration::from_secs(3600);
        for (bags, summaries, flag) in [
            (Duration::from_secs(60), None, "--keep-bags 60s"),
            (hour, Some(Duration::from_secs(599)), "--keep-summaries 599s"),
            (hour, Some(Duration::from_secs(1800)), "--keep-summaries 1800s"),
        ] {
            let err = retain(&store, "log", now, bags, summaries).await.unwrap_err();
            match &err {
                Error::Invalid { what, value, .. } => {
                    assert_eq!((*what, value.as_str()), ("retention", flag))
                }
                e => panic!("{e}"),
            }
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        // A legal keep on a log with no summaries: nothing to do.
        assert_eq!(
            retain(&store, "log", now, hour, None).await.unwrap(),
            RetainReport::default()
        );
        // A fault run's lower floor moves the bound, and the refusal names it.
        let floor = Duration::from_secs(45);
        assert!(
            retain_within(&store, "log", now, floor, None, floor)
                .await
                .is_ok()
        );
        let err = retain_within(&store, "log", now, Duration::from_secs(44), None, floor)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("keep at least 45s"), "{err}");
    }
}
