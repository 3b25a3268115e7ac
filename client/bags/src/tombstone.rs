//! Tombstones: a minute whose bags retention removed stays closed, for
//! every writer, closer and reader, however late it comes back.
//!
//! ```text
//! <log>/_seal/<minute start>.removed   "bagel-removed v1\n<minute start>\n<summary name>\n"
//! ```
//!
//! Retention writes a minute's tombstone (create-only: the first one
//! written wins, naming the summary it checked the minute against) before
//! it removes any bag of the minute, and never removes it. From then on
//! the minute is decided by the tombstone, whatever its directory holds:
//! its bags are exactly the ones its seal lists and its summary holds,
//! read from that summary. A bag found there (a late writer's append that
//! made the directory again, a closer that closed a bag it listed before
//! retention removed it, an empty directory a killed retention left) is
//! never data: readers do not read it, [`crate::summary::check`] does not
//! take it for the summarized bag, and the next retention removes it.
//!
//! Why a tombstone, not the lock kept: a bag's lock is what makes it
//! closed, and keeping every lock would keep one object (and, on a
//! directory, a directory) per second written forever; a tombstone is one
//! small object per minute, beside the minute's seal, which stays anyway.
//! It names the summary that holds the minute, so a reader without
//! summaries says where the messages are, and an auditor can check the
//! claim.
//!
//! Why it cannot race: retention removes nothing of a minute before its
//! tombstone exists, so whoever reads a bag, a lock or a listing and only
//! then finds no tombstone read what was there before any removal began:
//! the bag's own, create-only lock. So each party looks at the tombstone
//! *after* what it decides on:
//! * a writer whose record finished past its minute's safe point takes its
//!   verdict from the bag's lock, then looks for the tombstone;
//!   finding it, its record counts only if the named summary holds that
//!   very record, its bytes at its offset (so a record appended into a
//!   removed bag is `LateRejected`, as it is while the bag is there, even
//!   where, on a directory store, whose data file names repeat across a
//!   writer's records, the append re-created a summarized file and ended
//!   inside it). It looks for the tombstone *before* the lock's verdict
//!   too: found then, it decides alone, and the writer closes nothing
//!   (see [`crate::commit`]);
//! * a summarizer builds no summary over a removed minute
//!   ([`crate::summary::build`] looks before reading its bags and after):
//!   one made from a bag made again would claim the minute with other
//!   records;
//! * a reader with summaries reads a removed minute only from the summary
//!   its tombstone names, however many others hold it, or reports its
//!   bags missing; and the audit flags two summaries that disagree on a
//!   minute ([`crate::audit::audit_summaries`]);
//! * a reader without summaries skips the minutes its listing of `_seal/`
//!   shows removed (a [`crate::ProblemKind::Missing`] naming the summary),
//!   and after reading a minute's bags looks for its tombstone again: one
//!   that appeared meanwhile makes what it read of the minute a `Missing`
//!   problem too, never a silent gap;
//! * a seal's finish closes nothing in a removed minute; one that looked
//!   just before the tombstone appeared may leave a bag, which nobody
//!   reads and the next retention removes.
//!
//! The tombstone lives in `_seal/` so that the one listing of seals a
//! reader makes anyway also says which minutes are removed.

use std::collections::BTreeSet;

#[cfg(test)]
use crate::layout::TOMBSTONE_MAGIC as MAGIC;
use crate::layout::{MAX_TOMBSTONE_BYTES, SPAN_SECS, Span, Stretch};
pub use crate::layout::{SUFFIX, Tombstone, tombstone_name as name};
use crate::{BagStore, Error, Result};

fn corrupt(log: &str, span: Span, reason: String) -> Error {
    Error::CorruptSeal {
        log: log.to_owned(),
        span: span.first(),
        reason: format!("its tombstone {}: {reason}", name(span)),
    }
}

/// The minute's tombstone, if retention removed it.
pub async fn of(store: &dyn BagStore, log: &str, span: Span) -> Result<Option<Tombstone>> {
    match store.get_named(log, &name(span), MAX_TOMBSTONE_BYTES).await {
        Ok(Some(bytes)) => Tombstone::decode(span, &bytes)
            .map(Some)
            .map_err(|r| corrupt(log, span, r)),
        Ok(None) => Ok(None),
        Err(Error::Invalid { reason, .. }) => Err(corrupt(log, span, reason)),
        Err(e) => Err(e),
    }
}

/// Marks the minute removed under `summary` (create-only) and returns the
/// tombstone that stands: this one, or the one written first (naming the
/// summary another retention checked it against).
pub async fn put(store: &dyn BagStore, log: &str, span: Span, summary: Stretch) -> Result<Tombstone> {
    let ours = Tombstone { span, summary };
    match store.put_first(log, &name(span), ours.encode()).await? {
        None => Ok(ours),
        Some(first) => Tombstone::decode(span, &first).map_err(|r| corrupt(log, span, r)),
    }
}

/// The removed minutes among the names of a log's `_seal/` objects.
pub(crate) fn removed_in<'a>(names: impl IntoIterator<Item = &'a str>) -> BTreeSet<Span> {
    names
        .into_iter()
        .filter_map(|n| n.strip_suffix(SUFFIX)?.parse::<u64>().ok())
        .filter(|s| s % SPAN_SECS == 0)
        .map(|s| Span::of(crate::Bucket::from_secs(s)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Bucket;

    #[test]
    fn tombstones_round_trip_and_refuse_what_retention_did_not_write() {
        let span = Span::of(Bucket::from_secs(1_900_000_000));
        let summary = Stretch::new(span, 2);
        let t = Tombstone { span, summary };
        assert_eq!(Tombstone::decode(span, &t.encode()), Ok(t));
        assert_eq!(
            removed_in([
                name(span).trim_start_matches("_seal/"),
                "1899999960",
                "1899999960.intent",
                "1899999961.removed",
            ]),
            BTreeSet::from([span])
        );
        let s = span.first().secs();
        for bad in [
            String::new(),
            format!("{MAGIC}\n{}\n{}\n", s + 60, summary.name()),
            format!("{MAGIC}\n{s}\n_summary/{}.60\n", s + 60),
            format!("{MAGIC}\n{s}\n_summary/x.60\n"),
            format!("{MAGIC}\n{s}\n{}\nmore\n", summary.name()),
        ] {
            assert!(Tombstone::decode(span, bad.as_bytes()).is_err(), "{bad:?}");
        }
    }
}
