//! Which bags a read reads: past-due bags closed, missing ones sealed
//! (within the lookback), and the bags retention removed.

use std::collections::{BTreeMap, BTreeSet};

use bagel_proto::Micros;

use crate::seal::Span;
use crate::summary::Stretch;
use crate::{BagConfig, BagStore, Bucket, Error, Result};

use super::options::ReadOptions;
use super::report::{Problem, ProblemKind};

/// The range being read, and the sealed minutes of its log.
pub(super) struct Range<'a> {
    pub(super) log: &'a str,
    pub(super) first: Bucket,
    pub(super) last: Bucket,
    pub(super) sealed: &'a BTreeSet<Span>,
    /// The minutes retention removed ([`crate::tombstone`]).
    pub(super) removed: &'a BTreeSet<Span>,
    /// Seconds read from a summary: nothing of them is sealed or opened.
    pub(super) summarized: &'a (dyn Fn(&Bucket) -> bool + Sync),
    /// Every published summary of the log, read from or not.
    pub(super) published: &'a [Stretch],
}

/// What [`settle`] found.
pub(super) struct Settled {
    /// The bags to read, ascending.
    pub(super) buckets: Vec<Bucket>,
    /// Missing past-due seconds this read closed empty.
    pub(super) sealed: u64,
    /// Bags a seal lists that are not there (retention removed them),
    /// ascending: never read, never closed again.
    pub(super) missing: Vec<Bucket>,
}

/// Which bags of `[first, last]` hold the range's messages, how many
/// missing seconds this read closed empty, and which bags a seal lists
/// that are gone.
///
/// A minute's seal decides its seconds: a second it does not list is
/// closed empty, whatever bag a late writer made there since; one it lists
/// is decided by its own lock. With `life` (the instant true time has
/// surely reached, and the log's start mark), a past-due minute inside the
/// log's life without a seal is sealed now, and a missing past-due second
/// of a minute not yet due is closed empty on its own: otherwise a stalled
/// writer could create it after this read and a later reader would see
/// messages this one did not.
pub(super) async fn settle(
    store: &dyn BagStore,
    range: &Range<'_>,
    existing: Vec<Bucket>,
    life: Option<(Micros, Bucket)>,
    opts: &ReadOptions,
    cfg: &BagConfig,
) -> Result<Settled> {
    let (log, first, last) = (range.log, range.first, range.last);
    let in_range = |b: &Bucket| (first..=last).contains(b);
    let existing: BTreeSet<Bucket> = existing.into_iter().collect();
    // The minutes that hold a bag, and the unsealed ones of the log's life
    // up to now (a closer may have to seal them): never every minute of
    // the range blindly (a read of "everything" spans millennia).
    let mut spans: BTreeSet<Span> = existing.iter().map(|b| Span::of(*b)).collect();
    if let Some((now, start)) = life {
        let (from, to) = (first.max(start), last.min(Bucket::of(now)));
        let horizon = Bucket::of(now.saturating_sub(opts.max_seal_lookback));
        if from <= to {
            for span in Span::covering(from, to).filter(|s| !range.sealed.contains(s)) {
                spans.insert(span);
                // The loop below refuses at this one: look no further.
                if span
                    .buckets()
                    .any(|b| in_range(&b) && b >= start && b < horizon && !existing.contains(&b))
                {
                    break;
                }
            }
        }
    }
    // The sealed minutes a summary holds, though no bag of theirs may be
    // left (retention): their seals say which bags are gone. Only these:
    // a bag is removed only under a summary, and reading the seal of
    // every quiet minute of a long range would cost a request each.
    for st in range.published {
        if st.last() >= first && st.from() <= last {
            spans.extend(
                st.spans()
                    .filter(|s| range.sealed.contains(s) && s.last() >= first && s.first() <= last),
            );
        }
    }
    // And the minutes retention removed, whose summary may be gone too:
    // their seals say what was there (the listing told which, at no cost).
    spans.extend(range.removed.range(Span::of(first)..=Span::of(last)).copied());
    spans.retain(|s| !(range.summarized)(&s.first()));
    let mut out = BTreeSet::new();
    let mut sealed = 0u64;
    let mut missing = Vec::new();
    for span in spans {
        let here = existing.range(span.first()..=span.last()).copied();
        if range.removed.contains(&span) {
            // Closed for good: whatever its directory holds now (a bag
            // made again after the removal) is no data, and is neither
            // read nor closed. What its seal lists is missing.
            let seal = crate::seal::seal_of(store, log, span)
                .await?
                .ok_or_else(|| Error::CorruptSeal {
                    log: log.to_owned(),
                    span: span.first(),
                    reason: "its tombstone says retention removed it, and it has no seal".into(),
                })?;
            missing.extend(seal.bags().filter(in_range));
            continue;
        }
        if range.sealed.contains(&span) {
            let seal = crate::seal::seal_of(store, log, span)
                .await?
                .ok_or_else(|| Error::CorruptSeal {
                    log: log.to_owned(),
                    span: span.first(),
                    reason: "listed a moment ago, and now gone".into(),
                })?;
            out.extend(here.filter(|b| in_range(b) && seal.has_bag(*b)));
            // Listed by the seal, so it existed and was closed: gone now.
            // Not closed again (that would make it an empty bag).
            missing.extend(seal.bags().filter(|b| in_range(b) && !existing.contains(b)));
            continue;
        }
        let Some((now, start)) = life else {
            out.extend(here.filter(in_range));
            continue;
        };
        let missing = |due: &dyn Fn(&Bucket) -> bool| -> Vec<Bucket> {
            span.buckets()
                .filter(|b| in_range(b) && *b >= start && due(b) && !existing.contains(b))
                .collect()
        };
        if now >= span.close_time(cfg.grace) && span.last() >= start {
            let missing = missing(&|_| true);
            refuse_old_seal(log, &missing, now, opts)?;
            let seal = crate::seal::seal(store, log, span).await?;
            sealed += missing.iter().filter(|b| !seal.has_bag(**b)).count() as u64;
            // Bags made since the listing above, that the seal lists, are
            // read too.
            out.extend(seal.bags().filter(in_range));
            continue;
        }
        let missing = missing(&|b| now >= b.close_time(cfg.grace));
        refuse_old_seal(log, &missing, now, opts)?;
        store.close_all(log, &missing).await?;
        sealed += missing.len() as u64;
        out.extend(missing);
        out.extend(here.filter(in_range));
    }
    Ok(Settled {
        buckets: out.into_iter().collect(),
        sealed,
        missing,
    })
}

/// What changed under a read while it read, found by [`meanwhile`].
pub(super) struct Meanwhile {
    /// One [`ProblemKind::Missing`] per minute retention removed while the
    /// read read it.
    pub(super) removed: Vec<Problem>,
    /// Bags the read read in a minute sealed since it listed the seals,
    /// that the seal does not list: the seal made their seconds empty
    /// before the bag was made (a late writer's, closed by a closer that
    /// never looked at the seal), so what the read found there is in no
    /// other reader's view and must not be in this one's.
    pub(super) not_in_seal: BTreeSet<Bucket>,
}

/// What seals and removals happened under the read, looked for after the
/// reading in one listing of the seals (`read`: the bags it read).
///
/// * **Removed.** A minute of the range retention removed while the read
///   read it: it may have found a bag gone, or made again empty by a
///   closer, or none at all where the listing came after the removal, so
///   what it read of the minute may be short. Retention writes a minute's
///   tombstone before it removes anything, so a minute without one now
///   was read whole, and one that had one when the read began
///   (`range.removed`) was read from its seal and summary already.
/// * **Sealed.** A minute sealed since the read listed the seals decides
///   its seconds by that seal, as it does for every later reader: a bag
///   read there that the seal does not list is dropped.
///
/// Every minute of the range, not only those whose bags were read or that
/// were sealed when the read listed the seals: the bag simulation's racing
/// reader found a read stalled long enough to see a minute it found open
/// sealed, summarized and removed before it read the bags (it closed the
/// removed bags empty and reported success without them); one that saw a
/// minute sealed, then listed the bags after their removal (no bag, so
/// nothing read and nothing said); and one that listed the seals before a
/// minute was sealed, then closed and read a late writer's bag the seal
/// had made empty, returning a record its writer was told was rejected.
/// Minutes read from a summary are whole whatever happened to their bags.
pub(super) async fn meanwhile(
    store: &dyn BagStore,
    range: &Range<'_>,
    read: &BTreeSet<Bucket>,
) -> Result<Meanwhile> {
    let (log, first, last) = (range.log, range.first, range.last);
    let (sealed_now, removed_now) = crate::seal::sealed_and_removed(store, log).await?;
    let mut out = Meanwhile {
        removed: Vec::new(),
        not_in_seal: BTreeSet::new(),
    };
    for span in removed_now.range(Span::of(first)..=Span::of(last)) {
        if range.removed.contains(span) || (range.summarized)(&span.first()) {
            continue;
        }
        let summary = crate::tombstone::of(store, log, *span).await?.map(|t| t.summary);
        let (item, held) = match summary {
            Some(st) => (
                st.name(),
                format!(
                    "they are in summary {} ({st}); read them with summaries",
                    st.name()
                ),
            ),
            // Listed a moment ago: a tombstone is never removed while its
            // seal stays, so this is a store that lost it.
            None => (span.seal_name(), "and its tombstone is gone now".to_owned()),
        };
        out.removed.push(Problem {
            kind: ProblemKind::Missing,
            bucket: span.first().max(first),
            item,
            offset: None,
            what: format!(
                "the bags of the minute {span} were removed by retention while this read read them, so \
                 it may have missed some of their messages: {held}"
            ),
            in_open_bag: false,
        });
    }
    let newly_sealed = sealed_now
        .range(Span::of(first)..=Span::of(last))
        .filter(|s| !range.sealed.contains(s) && !removed_now.contains(s));
    for &span in newly_sealed {
        let mut here = read.range(span.first()..=span.last()).peekable();
        if here.peek().is_none() {
            continue;
        }
        let seal = crate::seal::seal_of(store, log, span)
            .await?
            .ok_or_else(|| Error::CorruptSeal {
                log: log.to_owned(),
                span: span.first(),
                reason: "listed a moment ago, and now gone".into(),
            })?;
        out.not_in_seal.extend(here.filter(|b| !seal.has_bag(**b)));
    }
    Ok(out)
}

/// One [`ProblemKind::Missing`] per run of missing bags held by one
/// summary (naming it, so a reader without summaries knows where the
/// messages are) or, where no summary holds them, per minute. A bag of a
/// removed minute whose tombstone was read (`owners`) is held only by the
/// summary the tombstone names, if that one is published: another that
/// holds the minute was not made from its bags.
pub(super) fn missing_problems(
    missing: &[Bucket],
    published: &[Stretch],
    owners: &BTreeMap<Span, Stretch>,
) -> Vec<Problem> {
    #[derive(PartialEq)]
    enum Held {
        By(Stretch),
        Nowhere(Span),
    }
    let mut runs: Vec<(Held, Vec<Bucket>)> = Vec::new();
    for &b in missing {
        let holder = match owners.get(&Span::of(b)) {
            Some(owner) => published.iter().find(|st| *st == owner),
            None => published.iter().find(|st| st.contains(b)),
        };
        let held = match holder {
            Some(st) => Held::By(*st),
            None => Held::Nowhere(Span::of(b)),
        };
        match runs.last_mut() {
            Some((h, bags)) if *h == held => bags.push(b),
            _ => runs.push((held, vec![b])),
        }
    }
    runs.into_iter()
        .map(|(held, bags)| {
            let (first, last, n) = (bags[0], bags[bags.len() - 1], bags.len());
            let (item, what) = match held {
                Held::By(st) => (
                    st.name(),
                    format!(
                        "{n} bags from {first} to {last}, listed by their minute's seal, were removed by \
                         retention: their messages are in summary {} ({st}); read them with summaries",
                        st.name()
                    ),
                ),
                Held::Nowhere(span) => (
                    span.seal_name(),
                    format!(
                        "{n} bags from {first} to {last}, listed by the seal of the minute {span}, are gone \
                         and no published summary holds them (retention removed them and then their \
                         summary, or they were lost): their messages cannot be read"
                    ),
                ),
            };
            Problem {
                kind: ProblemKind::Missing,
                bucket: first,
                item,
                offset: None,
                what,
                in_open_bag: false,
            }
        })
        .collect()
}

/// Refuses to close missing bags older than `now - max_seal_lookback`:
/// most likely a stray start mark or a `from` far before the log began.
/// Bags that exist cost nothing, so an old range that was closed and
/// sealed in its time reads as before.
pub(super) fn refuse_old_seal(log: &str, missing: &[Bucket], now: Micros, opts: &ReadOptions) -> Result<()> {
    let horizon = Bucket::of(now.saturating_sub(opts.max_seal_lookback));
    match missing.first() {
        Some(first) if *first < horizon => Err(crate::Error::SealTooFar {
            log: log.to_owned(),
            first: *first,
            missing: missing.len() as u64,
            limit: opts.max_seal_lookback,
        }),
        _ => Ok(()),
    }
}
