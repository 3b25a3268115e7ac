//! Picking the summaries a read reads minutes from, and reading a
//! summarized bag as a closed bag is read.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::StreamExt as _;

use crate::seal::Span;
use crate::summary::{Stretch, Summary, SummaryBag};
use crate::{BagStore, Bucket, Error, ListedItem, Result};

use super::items::{Place, read_batch, read_item};
use super::options::ReadOptions;
use super::report::{Problem, ProblemKind, ReadReport};
use super::seen::Seen;

/// The published summaries to read `[first, last]` from: those that
/// overlap it, each with the windows of whole minutes it is read for
/// ([`plan_windows`]), in ascending order of window.
///
/// A minute retention removed (`removed`, from the read's listing of
/// `_seal/`) is read only from the summary its tombstone names, the one
/// retention checked its bags against: another summary that holds it was
/// made otherwise (from a bag made again after the removal, or forged),
/// and would give other messages. Where the named summary is not
/// published, no summary is read for the minute, and the read reports
/// its bags missing. So a removed minute inside a summary's stretch costs
/// one small read (its tombstone).
///
/// With trusted summarizers, each comes with the key id of the first
/// trusted attestation that holds over its stored bytes; one that is
/// there and does not hold is a problem of the read.
pub(super) async fn pick_summaries(
    store: &dyn BagStore,
    log: &str,
    (published, removed): (&[Stretch], &BTreeSet<Span>),
    (first, last): (Bucket, Bucket),
    opts: &ReadOptions,
    report: &mut ReadReport,
) -> Result<Picked> {
    let mut out: Vec<PickedSummary> = Vec::new();
    let attested: Vec<(Stretch, String)> = match &opts.trusted_summarizers {
        Some(ring) => crate::summary::attest::list(store, log)
            .await?
            .into_iter()
            .filter(|(_, id)| ring.get(id).is_some())
            .collect(),
        None => Vec::new(),
    };
    let in_range = |st: &Stretch| st.last() >= first && st.from() <= last;
    // The removed minutes a summary could be read for, each with the
    // summary its tombstone names.
    let asked: Vec<Span> = removed
        .range(Span::of(first)..=Span::of(last))
        .copied()
        .filter(|s| published.iter().any(|st| in_range(st) && st.contains(s.first())))
        .collect();
    let owners: BTreeMap<Span, Stretch> = futures::stream::iter(asked)
        .map(|span| async move { crate::tombstone::of(store, log, span).await.map(|t| (span, t)) })
        .buffered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .filter_map(|r| match r {
            Ok((span, t)) => t.map(|t| Ok((span, t.summary))),
            Err(e) => Some(Err(e)),
        })
        .collect::<Result<_>>()?;
    let planned = plan_windows(published, first, last, removed, &owners);
    // Each summary fetched once, in order, however many windows it is
    // read for; decoded (and, where an attestation is to be checked,
    // hashed) a few at once on the machine's cores.
    let mut stretches: Vec<Stretch> = planned.iter().map(|(st, _)| *st).collect();
    stretches.sort_unstable();
    stretches.dedup();
    // Fetched in order; decoded (and, where an attestation is to be
    // checked, hashed) a few at once on the machine's cores.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let attested = &attested;
    let mut loaded = futures::stream::iter(stretches)
        .map(|st| async move {
            let bytes = crate::summary::fetch(store, log, st).await.map_err(|e| (st, e))?;
            let hash = attested.iter().any(|(a, _)| *a == st);
            let log = log.to_owned();
            let decoded = tokio::task::spawn_blocking(move || {
                let digest = hash.then(|| crate::summary::attest::digest(&bytes));
                crate::summary::parse(&log, st, bytes).map(|s| (s, digest))
            })
            .await;
            match decoded {
                Ok(decoded) => decoded
                    .map(|(summary, digest)| (st, summary, digest))
                    .map_err(|e| (st, e)),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => panic!("a summary's decoding was cancelled: {e}"),
            }
        })
        .buffered(cores.max(2));
    let mut read: Vec<(Stretch, Arc<Summary>, Option<Arc<str>>)> = Vec::new();
    while let Some(next) = loaded.next().await {
        let (st, summary, digest) = match next {
            Ok(loaded) => loaded,
            // A corrupt summary (one over `MAX_SUMMARY_EXPANSION`
            // included) is a finding of the read, naming the object, not
            // its end: its window is left uncovered, so its minutes are
            // read from their bags (those retention removed are `Missing`
            // problems naming it).
            Err((st, e @ Error::CorruptSummary { .. })) => {
                report.problems.push(Problem {
                    kind: ProblemKind::Damaged,
                    bucket: st.from(),
                    item: st.name(),
                    offset: None,
                    what: format!("{e}; its minutes are read from their bags"),
                    in_open_bag: false,
                });
                continue;
            }
            Err((_, e)) => return Err(e),
        };
        let mut vouched = None;
        for (_, key_id) in attested.iter().filter(|(a, _)| *a == st) {
            let digest = digest.as_ref().expect("hashed: it has an attestation to check");
            match crate::summary::attest::check(
                store,
                log,
                st,
                key_id,
                opts.trusted_summarizers.as_ref(),
                digest,
            )
            .await?
            {
                Some(Ok(_)) => {
                    vouched = Some(Arc::from(key_id.as_str()));
                    break;
                }
                Some(Err(why)) => report.problems.push(Problem {
                    kind: ProblemKind::Attestation,
                    bucket: st.from(),
                    item: crate::summary::attest::name(st, key_id),
                    offset: None,
                    what: format!("attestation not trusted, summary read with every check: {why}"),
                    in_open_bag: false,
                }),
                // Removed since the listing (retention): nothing to trust.
                None => {}
            }
        }
        read.push((st, Arc::new(summary), vouched));
    }
    for (st, window) in planned {
        if let Some((_, summary, vouched)) = read.iter().find(|(s, _, _)| *s == st) {
            out.push((window, Arc::clone(summary), vouched.clone()));
        }
    }
    Ok(Picked {
        summaries: out,
        owners,
    })
}

/// What [`pick_summaries`] picked.
pub(super) struct Picked {
    /// The summaries read, each with the window it is read for.
    pub(super) summaries: Vec<PickedSummary>,
    /// The removed minutes of the range a summary holds, each with the
    /// summary its tombstone names: where the read's problems say their
    /// messages are.
    pub(super) owners: BTreeMap<Span, Stretch>,
}

/// Which minutes of `[first, last]` each published summary is read for:
/// `(summary, window)` pairs, windows disjoint and ascending. Each minute
/// goes to the first summary that holds it (`published` is sorted by
/// first minute, then length), except that a minute retention removed
/// goes only to the summary its tombstone names (`owners`; one without an
/// entry, or naming no published summary, to none). Summaries of
/// different lengths overlap (`--span 1m` and `--span 2m` over one log):
/// a longer one is still read for the minutes beyond a shorter one, as
/// skipping it whole would read those minutes from their bags, which
/// retention may have removed. So one summary may be read for several
/// windows, around a removed minute that belongs to another.
pub(super) fn plan_windows(
    published: &[Stretch],
    first: Bucket,
    last: Bucket,
    removed: &BTreeSet<Span>,
    owners: &BTreeMap<Span, Stretch>,
) -> Vec<(Stretch, Stretch)> {
    // Minutes as their first second's number over SPAN_SECS, and runs of
    // them as half-open intervals: a summary may be long, so never minute
    // by minute except for the removed ones (a listing's worth).
    let minute = |s: Span| s.first().secs() / crate::seal::SPAN_SECS;
    let mut taken: Vec<(u64, u64)> = Vec::new();
    let mut out: Vec<(Stretch, Stretch)> = Vec::new();
    for &st in published {
        if st.last() < first || st.from() > last {
            continue;
        }
        let (from, to) = (minute(st.first), minute(st.first) + u64::from(st.minutes));
        // Its minutes, less those taken and the removed ones it does not own.
        let mut holes: Vec<(u64, u64)> = taken.clone();
        holes.extend(
            removed
                .range(st.first..=Span::of(st.last()))
                .filter(|s| owners.get(s) != Some(&st))
                .map(|&s| (minute(s), minute(s) + 1)),
        );
        holes.sort_unstable();
        let mut at = from;
        let mut free = Vec::new();
        for (a, z) in holes {
            if z <= at || a >= to {
                continue;
            }
            if a > at {
                free.push((at, a));
            }
            at = at.max(z);
        }
        if at < to {
            free.push((at, to));
        }
        for (a, z) in free {
            let span = Span::of(Bucket::from_secs(a * crate::seal::SPAN_SECS));
            let minutes = u32::try_from(z - a).expect("within the stretch, whose minutes fit");
            out.push((st, Stretch::new(span, minutes)));
            taken.push((a, z));
        }
        taken.sort_unstable();
    }
    out.sort_by_key(|(_, w)| w.first);
    out
}

/// A summary a read uses: the minutes it is read for (its window, see
/// [`pick_summaries`]), the summary (one decoded summary may be read for
/// several windows), and the trusted summarizer that attested it.
pub(super) type PickedSummary = (Stretch, Arc<Summary>, Option<Arc<str>>);

/// The parts of `[first, last]` no summary covers.
pub(super) fn uncovered(first: Bucket, last: Bucket, summaries: &[PickedSummary]) -> Vec<(Bucket, Bucket)> {
    let mut out = Vec::new();
    let mut at = first.secs();
    for (st, _, _) in summaries {
        if st.from().secs() > at {
            out.push((
                Bucket::from_secs(at),
                Bucket::from_secs(st.from().secs() - 1).min(last),
            ));
        }
        at = at.max(st.last().secs() + 1);
    }
    if at <= last.secs() {
        out.push((Bucket::from_secs(at), last));
    }
    out
}

/// Reads one summarized bag as [`read`] reads a closed bag.
pub(super) fn read_summarized(
    report: &mut ReadReport,
    seen: &mut Seen<'_>,
    opts: &ReadOptions,
    log: &str,
    summary: &Summary,
    bag: &SummaryBag,
    vouched: &Option<Arc<str>>,
) -> Result<()> {
    let bucket = Bucket::from_secs(bag.bucket_secs);
    let corrupt = |reason| Error::CorruptSummary {
        log: summary.log.clone(),
        name: crate::summary::object_name(summary),
        reason,
    };
    for si in &bag.items {
        // Batches rebuilt with their witnesses shared, not copied into
        // each (a summary may cite one witness in every batch of an item).
        let records = match si.is_raw {
            true => None,
            false => Some(crate::summary::packed::rebuild_shared(summary, bag, si).map_err(corrupt)?),
        };
        let rebuilt = match &records {
            None => crate::summary::rebuild_item(summary, bag, si)?,
            Some((_, framed)) => crate::summary::RebuiltItem {
                name: summary
                    .item_names
                    .get(si.name as usize)
                    .ok_or_else(|| corrupt(format!("item name index {} out of range", si.name)))?
                    .clone(),
                size: si.size.unwrap_or(*framed),
                records: crate::summary::Records::Batches(Vec::new()),
            },
        };
        let item = ListedItem {
            name: rebuilt.name,
            size: rebuilt.size,
            etag: None,
        };
        let at = Place {
            log,
            bucket,
            name: Arc::from(item.name.as_str()),
            item: &item,
            open: false,
            vouched: vouched.clone(),
        };
        if let Some(p) = at.too_big(opts) {
            report.problems.push(p);
            continue;
        }
        match (records, rebuilt.records) {
            // Rebuilt as batches: the record's digest names it (for copies
            // found twice) and its offset places its frame.
            (Some((batches, _)), _) => {
                for b in batches {
                    read_batch(
                        report,
                        seen,
                        opts,
                        &at,
                        b.offset,
                        b.digest,
                        (b.batch, b.witnesses),
                    );
                }
            }
            (None, crate::summary::Records::Raw(raw)) => read_item(report, seen, opts, &at, raw),
            (None, crate::summary::Records::Batches(_)) => unreachable!("an item not raw is rebuilt shared"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Minute `m` after a fixed minute, and stretches of it.
    fn minute(m: u64) -> Span {
        Span::of(Bucket::from_secs(1_900_000_020 + 60 * m))
    }

    fn st(m: u64, minutes: u32) -> Stretch {
        Stretch::new(minute(m), minutes)
    }

    fn plan(published: &[Stretch], removed: &[(u64, Option<Stretch>)]) -> Vec<(Stretch, Stretch)> {
        let owners: BTreeMap<Span, Stretch> = removed
            .iter()
            .filter_map(|(m, owner)| owner.map(|o| (minute(*m), o)))
            .collect();
        let removed: BTreeSet<Span> = removed.iter().map(|(m, _)| minute(*m)).collect();
        plan_windows(published, minute(0).first(), minute(9).last(), &removed, &owners)
    }

    #[test]
    fn each_minute_goes_to_the_first_summary_that_holds_it() {
        // `--span 1m` and `--span 2m` from one minute: the longer one is
        // read for the minute beyond the shorter.
        let (one, two) = (st(1, 1), st(1, 2));
        assert_eq!(plan(&[one, two], &[]), [(one, one), (two, st(2, 1))]);
    }

    #[test]
    fn a_removed_minute_goes_only_to_the_summary_its_tombstone_names() {
        // A longer summary that starts earlier and holds minute 1, which
        // retention removed under the one-minute summary.
        let (longer, one) = (st(0, 2), st(1, 1));
        assert_eq!(
            plan(&[longer, one], &[(1, Some(one))]),
            [(longer, st(0, 1)), (one, one)]
        );
        // Its summary not published: no summary is read for it.
        assert_eq!(plan(&[longer], &[(1, Some(one))]), [(longer, st(0, 1))]);
        // Its tombstone unread (not asked): none either.
        assert_eq!(plan(&[longer, one], &[(1, None)]), [(longer, st(0, 1))]);
        // Named by the longer one: that one reads it.
        assert_eq!(plan(&[longer, one], &[(1, Some(longer))]), [(longer, st(0, 2))]);
    }

    #[test]
    fn a_summary_is_read_around_a_removed_minute_another_holds() {
        let (long, one) = (st(0, 3), st(1, 1));
        assert_eq!(
            plan(&[long, one], &[(1, Some(one))]),
            [(long, st(0, 1)), (one, one), (long, st(2, 1))]
        );
    }
}
