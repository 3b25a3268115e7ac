//! Span seals: one object closes every second of a minute that nobody
//! wrote into, instead of three per second.
//!
//! A log's time is cut into minute-aligned [`Span`]s. A bag that exists
//! (somebody wrote into its second, or a reader closed it) is closed by its
//! own lock, as always. The seconds of a span that hold no bag are closed
//! together, once the whole span is past due, by its *seal*:
//!
//! ```text
//! <log>/_seal/<span start, unix seconds>.intent   "a seal has started"
//! <log>/_seal/<span start, unix seconds>          the seal: the seconds
//!                                                 that held a bag
//! <log>/_seal/<span start, unix seconds>.removed  retention removed its
//!                                                 bags ([`crate::tombstone`])
//! ```
//!
//! Sealing (any process, concurrently, each step idempotent; a closer on a
//! vouched clock, only once the span's last second is past its close time):
//! 1. read the seal; if it exists, done (use it);
//! 2. create the intent (create-only; "exists" is fine);
//! 3. list the span's bags (the second-level names of its minute);
//! 4. create the seal listing them, create-only: the first one written
//!    wins and every sealer reads that one back;
//! 5. close each listed bag by its own protocol;
//! 6. remove the intent (best effort: see [`seal`]).
//!
//! A second of a sealed span is closed *empty* unless the seal lists it;
//! a listed one is exactly what its own lock lists. Readers and writers
//! look at the seal before the bag.
//!
//! Why a late writer cannot slip into a sealed second: a writer whose
//! append finished before the span's safe point (its close time less the
//! writer's clock margin) finished before any sealer started (sealers act
//! on a vouched clock, after the close time), so the listing of step 3 saw
//! its bag. A writer that finishes later looks for the intent and then for
//! the seal, in that order; finding either, it finishes the seal itself
//! and is acknowledged only if the seal lists its second and that bag's
//! lock lists its record. Finding neither, no sealer had reached step 2
//! when it looked, so every sealer lists after its bag existed. The intent
//! is removed only after the seal exists, so "no intent, then no seal" can
//! only mean "not started". A sealer crashed anywhere leaves at most an
//! intent, which the next sealer finishes and removes.
//!
//! Only the operations the bag protocol already uses: create-only objects
//! (a private file linked into place on a directory or NFS, `If-None-Match:
//! *` on S3), a directory listing or prefix LIST, and the removal of the
//! intent. So an idle log costs one object per minute.

use std::collections::BTreeSet;

use bytes::Bytes;

use crate::layout::MAX_SEAL_BYTES;
#[cfg(test)]
use crate::layout::SEAL_MAGIC as MAGIC;
pub use crate::layout::{SEAL_DIR, SPAN_SECS, Seal, Span};
use crate::{BagStore, Bucket, Error, Result};

fn corrupt(log: &str, span: Span, reason: String) -> Error {
    Error::CorruptSeal {
        log: log.to_owned(),
        span: span.first(),
        reason,
    }
}

/// The span's seal, if it is sealed.
pub async fn seal_of(store: &dyn BagStore, log: &str, span: Span) -> Result<Option<Seal>> {
    match store.get_named(log, &span.seal_name(), MAX_SEAL_BYTES).await {
        Ok(Some(bytes)) => Seal::decode(span, &bytes)
            .map(Some)
            .map_err(|r| corrupt(log, span, r)),
        Ok(None) => Ok(None),
        Err(Error::Invalid { reason, .. }) => Err(corrupt(log, span, reason)),
        Err(e) => Err(e),
    }
}

/// Every sealed span of `log` (one listing of its seals).
pub async fn sealed_spans(store: &dyn BagStore, log: &str) -> Result<BTreeSet<Span>> {
    Ok(sealed_and_removed(store, log).await?.0)
}

/// Every sealed span of `log`, and every one retention removed (its
/// [`crate::tombstone`]), from one listing of `_seal/`.
pub async fn sealed_and_removed(store: &dyn BagStore, log: &str) -> Result<(BTreeSet<Span>, BTreeSet<Span>)> {
    let names = store.list_named(log, SEAL_DIR).await?;
    let sealed = names
        .iter()
        .filter_map(|n| n.parse::<u64>().ok())
        .filter(|s| s % SPAN_SECS == 0)
        .map(Span)
        .collect();
    Ok((
        sealed,
        crate::tombstone::removed_in(names.iter().map(String::as_str)),
    ))
}

/// Whether some process has started sealing the span: its intent, then
/// (in that order: see the module docs) its seal.
pub async fn sealing_started(store: &dyn BagStore, log: &str, span: Span) -> Result<bool> {
    if store.get_named(log, &span.intent_name(), 0).await?.is_some() {
        return Ok(true);
    }
    Ok(seal_of(store, log, span).await?.is_some())
}

/// The seconds of the span that hold a bag now (that somebody wrote into,
/// or that a closer closed), ascending.
pub async fn bags_of(store: &dyn BagStore, log: &str, span: Span) -> Result<Vec<Bucket>> {
    let mut bags: Vec<Bucket> = store
        .list_level(log, &span.minute_parts())
        .await?
        .iter()
        .filter(|n| n.len() == 2)
        .filter_map(|n| n.parse::<u64>().ok())
        .filter(|s| *s < SPAN_SECS)
        .map(|s| Bucket::from_secs(span.0 + s))
        .collect();
    bags.sort_unstable();
    Ok(bags)
}

/// Seals the span (or finishes someone else's seal) and returns the seal,
/// the same for every caller. The caller must be a closer whose vouched
/// clock is past [`Span::close_time`], or one that found the seal started
/// ([`sealing_started`]).
pub async fn seal(store: &dyn BagStore, log: &str, span: Span) -> Result<Seal> {
    if let Some(found) = seal_of(store, log, span).await? {
        return finish(store, log, found).await;
    }
    store.put_first(log, &span.intent_name(), Bytes::new()).await?;
    let bags = bags_of(store, log, span).await?.into_iter().collect();
    let ours = Seal { span, bags };
    match store.put_first(log, &span.seal_name(), ours.encode()).await? {
        None => {
            store.close_all(log, &ours.bags().collect::<Vec<_>>()).await?;
            remove_intent(store, log, span).await;
            Ok(ours)
        }
        Some(first) => {
            let theirs = Seal::decode(span, &first).map_err(|r| corrupt(log, span, r))?;
            finish(store, log, theirs).await
        }
    }
}

/// Finishes a seal found published: closes the bags it lists that are
/// still there, unless retention removed the minute.
///
/// Why not every bag it lists: a listed bag existed when the seal was
/// made, and only retention removes bags, once a summary holds them. A
/// listed bag that is gone was removed so, and closing it again (a new
/// holder settling an old predecessor, a metronome with a long lookback)
/// would recreate it empty. One listing of the minute tells which are
/// left. And a minute with a tombstone ([`crate::tombstone`]) is closed
/// for good: nothing of it is closed again (a bag retention is removing
/// right now would come back empty). A finish that looked just before
/// the tombstone was written may still close a bag retention then
/// removes; that bag is no data (the tombstone decides the minute) and
/// the next retention removes it.
async fn finish(store: &dyn BagStore, log: &str, seal: Seal) -> Result<Seal> {
    if crate::tombstone::of(store, log, seal.span).await?.is_some() {
        remove_intent(store, log, seal.span).await;
        return Ok(seal);
    }
    let present: BTreeSet<Bucket> = bags_of(store, log, seal.span).await?.into_iter().collect();
    let left: Vec<Bucket> = seal.bags().filter(|b| present.contains(b)).collect();
    store.close_all(log, &left).await?;
    remove_intent(store, log, seal.span).await;
    Ok(seal)
}

/// Cleanup only: the seal is decided. Sealers racing to remove one intent
/// may see it vanish under them (NFSv4 answers STALE), and an intent left
/// behind costs one object and misleads nobody (a writer that finds it
/// finishes the seal, which exists).
async fn remove_intent(store: &dyn BagStore, log: &str, span: Span) {
    let _ = store.remove_named(log, &span.intent_name()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_minutes() {
        let b = Bucket::from_secs(1_900_000_000); // second 40 of its minute
        let s = Span::of(b);
        assert_eq!(s.first().secs(), 1_899_999_960);
        assert_eq!(s.last().secs(), 1_900_000_019);
        assert_eq!(Span::of(s.last()), s);
        assert_eq!(s.next().first(), s.last().next());
        assert_eq!(s.buckets().count(), 60);
        let spans: Vec<Span> = Span::covering(b, Bucket::from_secs(1_900_000_100)).collect();
        assert_eq!(spans.len(), 3);
    }

    #[test]
    fn seals_round_trip_and_refuse_what_no_sealer_wrote() {
        let span = Span::of(Bucket::from_secs(1_900_000_000));
        let seal = Seal {
            span,
            bags: [span.first(), span.last()].into_iter().collect(),
        };
        assert_eq!(Seal::decode(span, &seal.encode()).unwrap(), seal);
        assert_eq!(seal.empty_seconds(), 58);
        assert!(seal.has_bag(span.last()) && !seal.has_bag(span.first().next()));
        for bad in [
            "".to_owned(),
            "bagel-seal v1\n5\n".to_owned(),
            format!("{MAGIC}\n{}\n{}\n", span.0, span.0 + 60),
            format!("{MAGIC}\n{}\n{}\n{}\n", span.0, span.0, span.0),
            format!("{MAGIC}\n{}\nx\n", span.0),
        ] {
            assert!(Seal::decode(span, bad.as_bytes()).is_err(), "{bad:?}");
        }
    }
}
