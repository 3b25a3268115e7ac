//! Picking the summaries a read reads minutes from, and reading a
//! summarized bag as a closed bag is read.

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
/// overlap it, earliest first, each with the window of whole minutes it
/// is read for (its stretch, less what an earlier one covers). Summaries
/// of different lengths overlap (`--span 1m` and `--span 2m` over one
/// log); each minute is read from the first that holds it, and a longer
/// one is still read for the minutes beyond a shorter one: skipping it
/// whole would read those minutes from their bags, which retention may
/// have removed.
///
/// With trusted summarizers, each comes with the key id of the first
/// trusted attestation that holds over its stored bytes; one that is
/// there and does not hold is a problem of the read.
pub(super) async fn pick_summaries(
    store: &dyn BagStore,
    log: &str,
    published: &[Stretch],
    first: Bucket,
    last: Bucket,
    opts: &ReadOptions,
    report: &mut ReadReport,
) -> Result<Vec<PickedSummary>> {
    let mut out: Vec<PickedSummary> = Vec::new();
    let attested: Vec<(Stretch, String)> = match &opts.trusted_summarizers {
        Some(ring) => crate::summary::attest::list(store, log)
            .await?
            .into_iter()
            .filter(|(_, id)| ring.get(id).is_some())
            .collect(),
        None => Vec::new(),
    };
    // (stretch, window), windows disjoint and ascending: `published` is
    // sorted by first minute, then length.
    let mut picked: Vec<(Stretch, Stretch)> = Vec::new();
    for &st in published {
        if st.last() < first || st.from() > last {
            continue;
        }
        let from = match picked.last() {
            Some((_, w)) if w.last() >= st.from() => Span::of(w.last()).next(),
            _ => st.first,
        };
        if from.first() > st.last() {
            continue;
        }
        let minutes = (st.last().secs() + 1 - from.first().secs()) / crate::seal::SPAN_SECS;
        let minutes = u32::try_from(minutes).expect("within the stretch, whose minutes fit");
        picked.push((st, Stretch::new(from, minutes)));
    }
    // Fetched in order; decoded (and, where an attestation is to be
    // checked, hashed) a few at once on the machine's cores.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let attested = &attested;
    let mut loaded = futures::stream::iter(picked)
        .map(|(st, window)| async move {
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
                    .map(|(summary, digest)| (st, window, summary, digest))
                    .map_err(|e| (st, e)),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => panic!("a summary's decoding was cancelled: {e}"),
            }
        })
        .buffered(cores.max(2));
    while let Some(next) = loaded.next().await {
        let (st, window, summary, digest) = match next {
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
        out.push((window, summary, vouched));
    }
    Ok(out)
}

/// A summary a read uses: the minutes it is read for (its window, see
/// [`pick_summaries`]), the summary, and the trusted summarizer that
/// attested it.
pub(super) type PickedSummary = (Stretch, Summary, Option<Arc<str>>);

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
