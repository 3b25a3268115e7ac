//! Summaries: a closed stretch of a log (whole minutes, one by default) as
//! one object, so that reading an hour opens 60 objects instead of 3,600
//! bags.
//!
//! ```text
//! <log>/_summary/<first second>.<seconds>   a [`Summary`] (format 2, see [`packed`])
//! ```
//!
//! A summary holds every record of every bag of its stretch, in bag and
//! item order, with each witness, signed time and writer id stored once
//! and referred to by index, and a manifest of its source bags (each with
//! the SHA-256 of its lock). It is made only from what is final: minutes
//! that are sealed, bags that are closed, items read exactly as their locks
//! list them. So the same store always gives the same summary, byte for
//! byte, and publication is create-only (`If-None-Match: *` on S3, a
//! private file linked into place on a directory or NFS): any number of
//! summarizers may run at once, a crash at any step leaves either nothing
//! or the one summary, and a second summarizer that finds a *different*
//! summary under the same name says so ([`Error::SummaryMismatch`]).
//!
//! A reader rebuilds each batch from its parts and checks it exactly as it
//! checks a batch read from a bag (witness and holder signatures, signed
//! time, bounds), so a summary can leave messages out but cannot make a
//! forged one pass; [`check`] compares a summary with its source bags while
//! they exist.
//!
//! The stored form is format 2 ([`packed`]): each batch as a change from
//! the one before it in its item, so a summary costs little more than its
//! payloads and holder signatures. Summaries of format 1 (a `pb::Summary`)
//! are read as the same [`Summary`].

use std::collections::HashMap;

use bagel_proto::pb;
use bytes::Bytes;
use prost::Message as _;
use sha2::{Digest as _, Sha256};

use crate::frame::{self, Frame};
pub use crate::layout::{SUMMARY_DIR, Stretch};
use crate::seal::{self, Span};
use crate::{BagState, BagStore, Bucket, Error, Result};

pub mod attest;
mod budget;
pub mod packed;

pub use packed::{Summary, SummaryBag, SummaryBatch, SummaryItem, SummaryTime};

/// The largest summary made or read. A minute over this is left to its
/// bags ([`Error::NotSummarizable`]).
pub const MAX_SUMMARY_BYTES: u64 = 256 << 20;
/// The most one summary may expand to when read, in each of two ways:
/// the memory its decoded form takes (counted on its stored bytes before
/// they are decoded, each element at its size: vectors' spare capacity,
/// up to as much again, is not counted), and the bytes its records
/// rebuild to (each witness and signed time counted in every batch that
/// cites it; counted before any is rebuilt, and never held whole: a
/// reader shares a cited list of witnesses and hashes records as it
/// goes). A stored summary over either is corrupt
/// ([`Error::CorruptSummary`], naming it): a reader reports it and reads
/// its minutes from their bags, retention keeps their bags, a summarizer
/// names it and goes on with the next stretch. A summarizer does not
/// publish one over either (the stretch is left to its bags,
/// [`Error::NotSummarizable`]); no honest summary's records are over, as
/// they are the items it read, at most [`MAX_SUMMARY_BYTES`]. Without
/// the bound, a 51 KB summary citing one 50 KB witness 1,000 times in
/// each of ten batches made a read hold ~970 MB, and 4 MB of empty
/// batches took 313 MB to decode.
pub const MAX_SUMMARY_EXPANSION: u64 = MAX_SUMMARY_BYTES;

fn not_summarizable(log: &str, stretch: Stretch, reason: String) -> Error {
    Error::NotSummarizable {
        log: log.to_owned(),
        stretch: stretch.to_string(),
        reason,
    }
}

/// Builds the summary of `stretch` from its sealed minutes and closed bags.
/// Refused ([`Error::NotSummarizable`]) while a minute is not sealed or a
/// bag it lists is not closed, when a minute was removed by retention (its
/// [`crate::tombstone`]), when an item cannot be read as its lock lists
/// it, or when the summary would exceed [`MAX_SUMMARY_BYTES`].
///
/// Never over a removed minute: what its directory holds since the
/// removal (a stalled writer's append that made a bag again, a closer's
/// lock on it) is no data, and a summary made from it would claim the
/// minute with other records than the summary its tombstone names. The
/// tombstone is looked for before a minute's bags are read and again
/// after (retention writes it before it removes anything, so a minute
/// without one then was read as it was before any removal).
pub async fn build(store: &dyn BagStore, log: &str, stretch: Stretch) -> Result<Summary> {
    let mut out = packed::Builder::new(log, stretch.from().secs(), stretch.last().secs() + 1);
    let mut size = 0u64;
    let removed = |t: crate::tombstone::Tombstone| {
        not_summarizable(
            log,
            stretch,
            format!(
                "the minute {} was removed by retention: summary {} holds it",
                t.span,
                t.summary.name()
            ),
        )
    };
    for span in stretch.spans() {
        if let Some(t) = crate::tombstone::of(store, log, span).await? {
            return Err(removed(t));
        }
        let Some(sealed) = seal::seal_of(store, log, span).await? else {
            return Err(not_summarizable(
                log,
                stretch,
                format!("the minute {span} is not sealed yet"),
            ));
        };
        for bucket in sealed.bags() {
            let listing = match store.state(log, bucket).await? {
                BagState::Closed(l) => l,
                BagState::Open(_) => {
                    return Err(not_summarizable(
                        log,
                        stretch,
                        format!("bag {bucket} is not closed yet"),
                    ));
                }
            };
            out.bag(bucket.secs(), Sha256::digest(listing.encode()).to_vec());
            for item in &listing.items {
                size += item.size;
                if size > MAX_SUMMARY_BYTES {
                    return Err(not_summarizable(
                        log,
                        stretch,
                        format!("over {MAX_SUMMARY_BYTES} bytes: summarize shorter stretches"),
                    ));
                }
                let bytes = store.read_item(log, bucket, item, Some(item.size)).await?;
                let content = match (bytes.len() as u64 == item.size)
                    .then(|| as_batches(&bytes))
                    .flatten()
                {
                    Some(batches) => packed::Content::Batches(batches),
                    None => packed::Content::Raw(bytes),
                };
                out.item(&item.name, item.size, content);
            }
        }
        if let Some(t) = crate::tombstone::of(store, log, span).await? {
            return Err(removed(t));
        }
    }
    Ok(out.finish())
}

/// Whether `summary` holds the very record `record` (framed, as appended)
/// in item `item` of bag `bucket`, ending at `end`: the item's frame at
/// `end - record.len()` has the record's bytes. Its name and a size of at
/// least `end` are not enough: a writer's data file name repeats across
/// its records on a directory store, so a record appended after its
/// minute was removed re-creates the summarized file at offset 0 and may
/// end inside it. A summary whose parts do not fit together is
/// [`Error::CorruptSummary`].
pub fn holds_record(summary: &Summary, bucket: Bucket, item: &str, end: u64, record: &[u8]) -> Result<bool> {
    let Some(bag) = summary.bags.iter().find(|b| b.bucket_secs == bucket.secs()) else {
        return Ok(false);
    };
    let Some(start) = end.checked_sub(record.len() as u64) else {
        return Ok(false);
    };
    for si in &bag.items {
        let rebuilt = rebuild_item(summary, bag, si)?;
        if rebuilt.name != item {
            continue;
        }
        if rebuilt.size < end {
            return Ok(false);
        }
        return Ok(match rebuilt.records {
            // A frame's header follows from its body: equal bodies at the
            // same offset are the same bytes.
            Records::Batches(batches) => batches.iter().any(|b| {
                b.offset == start
                    && record.len() == frame::HEADER_LEN + b.body.len()
                    && record[frame::HEADER_LEN..] == b.body[..]
            }),
            Records::Raw(raw) => {
                usize::try_from(start)
                    .ok()
                    .zip(usize::try_from(end).ok())
                    .and_then(|(a, z)| raw.get(a..z))
                    == Some(record)
            }
        });
    }
    Ok(false)
}

/// Where two summaries that both hold minute `span` disagree on it (the
/// seconds that held a bag, a bag's lock, an item's records), or `None`
/// when they hold the same. Two honest summaries of one minute are made
/// from the same sealed minute and closed bags, so they agree; one that
/// does not was made from something else (a bag made again after
/// retention removed the minute, or a forgery), and a reader that took
/// the minute from it would read other messages than the other gives.
pub fn disagreement(a: &Summary, b: &Summary, span: Span) -> Result<Option<String>> {
    let in_span = |s: &'_ Summary| -> Vec<usize> {
        (0..s.bags.len())
            .filter(|&i| Span::of(Bucket::from_secs(s.bags[i].bucket_secs)) == span)
            .collect()
    };
    let (ours, theirs) = (in_span(a), in_span(b));
    let secs =
        |s: &Summary, idx: &[usize]| -> Vec<u64> { idx.iter().map(|&i| s.bags[i].bucket_secs).collect() };
    if secs(a, &ours) != secs(b, &theirs) {
        return Ok(Some(format!(
            "they hold other seconds of the minute {span} ({:?} and {:?})",
            secs(a, &ours),
            secs(b, &theirs)
        )));
    }
    for (&i, &j) in ours.iter().zip(&theirs) {
        let (x, y) = (&a.bags[i], &b.bags[j]);
        let bucket = Bucket::from_secs(x.bucket_secs);
        if x.lock_sha256 != y.lock_sha256 {
            return Ok(Some(format!("they hold bag {bucket} with other locks")));
        }
        if rebuild_all(a, x)? != rebuild_all(b, y)? {
            return Ok(Some(format!("they hold other records of bag {bucket}")));
        }
    }
    Ok(None)
}

/// The item's records as batches, when every frame is a whole record that
/// decodes and re-encodes to exactly its stored bytes (so a reader of the
/// summary sees what a reader of the bag sees); `None` otherwise.
fn as_batches(bytes: &Bytes) -> Option<Vec<pb::Batch>> {
    let mut out = Vec::new();
    for f in frame::decode(bytes) {
        let Frame::Record { body, .. } = f else {
            return None;
        };
        let batch = pb::Batch::decode(body.clone()).ok()?;
        if batch.encode_to_vec() != body {
            return None;
        }
        out.push(batch);
    }
    Some(out)
}

/// The batches of a summarized item, rebuilt, each with its frame's
/// offset in the item (a raw item has none: read its `raw` bytes as a
/// bag's item).
pub fn rebuild(summary: &Summary, bag: &SummaryBag, item: &SummaryItem) -> Result<Vec<(u64, Bytes)>> {
    Ok(rebuild_batches(summary, bag, item)?
        .into_iter()
        .map(|r| (r.offset, r.body))
        .collect())
}

/// [`rebuild`], keeping each batch as well as its bytes.
pub fn rebuild_batches(summary: &Summary, bag: &SummaryBag, item: &SummaryItem) -> Result<Vec<Rebuilt>> {
    match rebuild_item(summary, bag, item)?.records {
        Records::Batches(batches) => Ok(batches),
        Records::Raw(_) => Ok(Vec::new()),
    }
}

/// A summarized item, rebuilt: its name and size as its bag's lock lists
/// them, and its records.
#[derive(Clone, Debug)]
pub struct RebuiltItem {
    /// Its name in the bag.
    pub name: String,
    /// Its size as the lock lists it, in bytes.
    pub size: u64,
    /// What it holds.
    pub records: Records,
}

/// What a summarized item holds.
#[derive(Clone, Debug)]
pub enum Records {
    /// Its records, rebuilt, in order.
    Batches(Vec<Rebuilt>),
    /// Its bytes as stored: not all of them were whole records that
    /// decode as batches (read them as a bag's item).
    Raw(Bytes),
}

/// Rebuilds an item of a summarized bag; a summary whose parts do not fit
/// together is refused ([`Error::CorruptSummary`]).
pub fn rebuild_item(summary: &Summary, bag: &SummaryBag, item: &SummaryItem) -> Result<RebuiltItem> {
    packed::unpack_item(summary, bag, item).map_err(|reason| Error::CorruptSummary {
        log: summary.log.clone(),
        name: object_name(summary),
        reason,
    })
}

/// The object name of `summary` in its log, as its fields give it (those
/// of a loaded summary are checked against the name it was loaded from).
pub(crate) fn object_name(summary: &Summary) -> String {
    format!(
        "{SUMMARY_DIR}/{}.{}",
        summary.from_secs,
        summary.to_secs.saturating_sub(summary.from_secs)
    )
}

/// A batch of a summarized item as [`rebuild_batches`] rebuilds it.
#[derive(Clone, Debug)]
pub struct Rebuilt {
    /// Its frame's offset in the item.
    pub offset: u64,
    /// Its record's bytes: those the bag holds (a summarizer takes only
    /// records that re-encode to their stored bytes).
    pub body: Bytes,
    /// The batch itself, as decoding `body` gives it (prost decodes its
    /// own encoding to the message encoded), so a reader need not.
    pub batch: pb::Batch,
}

/// Publishes `summary` create-only and returns its name and whether this
/// call created it. One already there with other content is refused
/// ([`Error::SummaryMismatch`]): the same closed bags give the same
/// summary, so one of the two was not made from them. One there in format
/// 1 that holds the same records is the same summary. One there that is
/// corrupt (it does not decode within [`MAX_SUMMARY_EXPANSION`]) is
/// refused as such ([`Error::CorruptSummary`], naming it): the stretch
/// cannot be published while it is there, and the caller goes on with the
/// next. A summary that would itself be over [`MAX_SUMMARY_EXPANSION`] is
/// not published ([`Error::NotSummarizable`]): readers would refuse it.
pub async fn publish(
    store: &dyn BagStore,
    log: &str,
    stretch: Stretch,
    summary: &Summary,
) -> Result<(String, bool)> {
    let name = stretch.name();
    let ours = Bytes::from(summary.encode_to_vec());
    budget::check_decoded(&ours, budget::FORMAT_2)
        .and_then(|()| budget::check_records(budget::records_size(summary, MAX_SUMMARY_EXPANSION)?))
        .map_err(|reason| not_summarizable(log, stretch, format!("{reason}: summarize shorter stretches")))?;
    let same = |theirs: &Bytes| -> Result<bool> {
        if *theirs == ours {
            return Ok(true);
        }
        match packed::decode(theirs.clone()) {
            Ok(t) => Ok(t == *summary),
            Err(reason) => Err(Error::CorruptSummary {
                log: log.to_owned(),
                name: name.clone(),
                reason: format!("{reason} (the summary of {stretch} cannot be published while it is there)"),
            }),
        }
    };
    if let Some(theirs) = store.get_named(log, &name, MAX_SUMMARY_BYTES).await? {
        return match same(&theirs)? {
            true => Ok((name, false)),
            false => Err(Error::SummaryMismatch {
                log: log.to_owned(),
                name,
                reason: "a summary with other bytes is already published under this name".into(),
            }),
        };
    }
    match store.put_first(log, &name, ours.clone()).await? {
        None => Ok((name, true)),
        Some(first) if same(&first)? => Ok((name, false)),
        Some(_) => Err(Error::SummaryMismatch {
            log: log.to_owned(),
            name,
            reason: "another summarizer published other bytes first".into(),
        }),
    }
}

/// Builds and publishes the summary of `stretch`; see [`build`] and
/// [`publish`]. Returns its name, whether this call created it, and its
/// size in bytes.
pub async fn summarize(store: &dyn BagStore, log: &str, stretch: Stretch) -> Result<Summarized> {
    summarize_attested(store, log, stretch, None).await
}

/// [`summarize`], then with an `attester`, attests the published summary
/// ([`attest::attest`]): only after building it from the bags and
/// verifying every signature in it.
pub async fn summarize_attested(
    store: &dyn BagStore,
    log: &str,
    stretch: Stretch,
    attester: Option<&attest::Attester>,
) -> Result<Summarized> {
    let summary = build(store, log, stretch).await?;
    let (name, created) = publish(store, log, stretch, &summary).await?;
    let mut done = Summarized {
        stretch,
        name,
        created,
        bytes: summary.encoded_len() as u64,
        bags: summary.bags.len() as u64,
        messages: summary
            .bags
            .iter()
            .flat_map(|b| &b.items)
            .flat_map(|i| &i.batches)
            .map(|b| b.payloads.len() as u64)
            .sum(),
        attestation: None,
    };
    if let Some(a) = attester {
        done.attestation = Some(attest::attest(store, log, stretch, summary, a).await?);
    }
    Ok(done)
}

/// What [`summarize`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summarized {
    /// The stretch summarized.
    pub stretch: Stretch,
    /// The summary's object name in the log.
    pub name: String,
    /// This call published it; false when the same summary was already there.
    pub created: bool,
    /// Its encoded size, in bytes.
    pub bytes: u64,
    /// Bags it holds (the stretch's seconds that had one).
    pub bags: u64,
    /// Messages it holds.
    pub messages: u64,
    /// With an attester: what became of its attestation.
    pub attestation: Option<attest::Attested>,
}

/// Removes a published summary and its attestations (retention, once its
/// time is up); returns how many attestations went. The attestations go
/// first: a run cut off between leaves a summary without them (read in
/// full, and removed by the next run), never an attestation of nothing.
pub async fn remove(store: &dyn BagStore, log: &str, stretch: Stretch) -> Result<u64> {
    let mut gone = 0;
    for (st, key_id) in attest::list(store, log).await? {
        if st == stretch {
            store.remove_named(log, &attest::name(stretch, &key_id)).await?;
            gone += 1;
        }
    }
    store.remove_named(log, &stretch.name()).await?;
    Ok(gone)
}

/// Every published summary of `log`, by stretch (one listing).
pub async fn list(store: &dyn BagStore, log: &str) -> Result<Vec<Stretch>> {
    let mut out: Vec<Stretch> = store
        .list_named(log, SUMMARY_DIR)
        .await?
        .iter()
        .filter_map(|n| Stretch::parse(n))
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// Reads and checks the shape of a published summary: it names this log
/// and stretch, and its bags are distinct seconds of the stretch, in order.
pub async fn load(store: &dyn BagStore, log: &str, stretch: Stretch) -> Result<Summary> {
    Ok(load_bytes(store, log, stretch).await?.0)
}

/// A published summary's stored bytes, as they are (`None`: there is none).
pub async fn stored_bytes(store: &dyn BagStore, log: &str, stretch: Stretch) -> Result<Option<Bytes>> {
    store.get_named(log, &stretch.name(), MAX_SUMMARY_BYTES).await
}

/// [`load`], with the summary's stored bytes (what an attestation is over).
pub async fn load_bytes(store: &dyn BagStore, log: &str, stretch: Stretch) -> Result<(Summary, Bytes)> {
    let bytes = fetch(store, log, stretch).await?;
    Ok((parse(log, stretch, bytes.clone())?, bytes))
}

/// A published summary's stored bytes; gone since it was listed is an
/// error.
pub(crate) async fn fetch(store: &dyn BagStore, log: &str, stretch: Stretch) -> Result<Bytes> {
    store
        .get_named(log, &stretch.name(), MAX_SUMMARY_BYTES)
        .await?
        .ok_or_else(|| Error::CorruptSummary {
            log: log.to_owned(),
            name: stretch.name(),
            reason: "listed a moment ago, and now gone".into(),
        })
}

/// Decodes the stored bytes of the summary of `stretch` and checks their
/// shape, as [`load`] does (no I/O: a reader decodes several at once).
pub(crate) fn parse(log: &str, stretch: Stretch, bytes: Bytes) -> Result<Summary> {
    let bad = |reason: String| Error::CorruptSummary {
        log: log.to_owned(),
        name: stretch.name(),
        reason,
    };
    let s = packed::decode(bytes).map_err(bad)?;
    if s.log != log || s.from_secs != stretch.from().secs() || s.to_secs != stretch.last().secs() + 1 {
        return Err(bad(format!(
            "it says log {:?} seconds {}..{}: not what its name says",
            s.log, s.from_secs, s.to_secs
        )));
    }
    let mut prev = None;
    for b in &s.bags {
        let bucket = Bucket::from_secs(b.bucket_secs);
        if !stretch.contains(bucket) || prev.is_some_and(|p| p >= bucket) {
            return Err(bad(format!(
                "bag {bucket} is out of order or outside the stretch"
            )));
        }
        prev = Some(bucket);
    }
    Ok(s)
}

/// What [`check`] found comparing a summary with its source bags.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SummaryCheck {
    /// Bags compared and found as summarized.
    pub bags_matched: u64,
    /// Bags whose lock or records differ from the summary's: a forged or
    /// corrupted summary (or bag).
    pub mismatched: Vec<String>,
    /// Source bags gone (retention): what the summary says of them could
    /// not be checked.
    pub bags_gone: u64,
    /// Of those, bags found made again in a minute retention removed (its
    /// [`crate::tombstone`]): a late writer's append, a closer that listed
    /// the bag before it was removed, or the empty directory of a killed
    /// retention, closed since. Not the bag that was summarized, and no
    /// data (the tombstone decides the minute): the next retention
    /// removes them. Taken for a mismatch, they would make an honest
    /// summary look forged and keep its bags forever.
    pub bags_recreated: u64,
    /// The minutes of the stretch retention removed (each with its
    /// tombstone), ascending.
    pub minutes_removed: Vec<Span>,
}

/// Compares a published summary, bag by bag, with the bags it was made
/// from, while they exist. In a minute retention removed, a bag whose
/// lock is not the summarized one (or that is open) was made again after
/// the removal began ([`SummaryCheck::bags_recreated`]), not forged: the
/// lock is create-only and goes only in a removal, which the tombstone
/// precedes.
pub async fn check(store: &dyn BagStore, log: &str, stretch: Stretch) -> Result<SummaryCheck> {
    let published = load(store, log, stretch).await?;
    let mut out = SummaryCheck::default();
    let mut by_second: HashMap<u64, &SummaryBag> =
        published.bags.iter().map(|b| (b.bucket_secs, b)).collect();
    for span in stretch.spans() {
        let Some(sealed) = seal::seal_of(store, log, span).await? else {
            out.mismatched
                .push(format!("minute {span} is summarized but not sealed"));
            continue;
        };
        let removed = crate::tombstone::of(store, log, span).await?.is_some();
        if removed {
            out.minutes_removed.push(span);
        }
        for bucket in sealed.bags() {
            let Some(theirs) = by_second.remove(&bucket.secs()) else {
                out.mismatched
                    .push(format!("bag {bucket} is sealed in but left out of the summary"));
                continue;
            };
            match store.state(log, bucket).await? {
                BagState::Closed(listing) => {
                    let digest = Sha256::digest(listing.encode()).to_vec();
                    if digest != theirs.lock_sha256 && removed {
                        out.bags_gone += 1;
                        out.bags_recreated += 1;
                        continue;
                    }
                    if digest != theirs.lock_sha256 {
                        out.mismatched
                            .push(format!("bag {bucket}: its lock is not the one summarized"));
                        continue;
                    }
                    let one = match build_bag(store, log, bucket, &listing).await {
                        Ok(one) => one,
                        // Retention removed part of it (its lock goes last).
                        Err(e) if e.is_not_found() => {
                            out.bags_gone += 1;
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    match one == rebuild_all(&published, theirs)? {
                        true => out.bags_matched += 1,
                        false => out
                            .mismatched
                            .push(format!("bag {bucket}: its records are not the ones summarized")),
                    }
                }
                BagState::Open(items) if items.is_empty() => out.bags_gone += 1,
                BagState::Open(_) if removed => {
                    out.bags_gone += 1;
                    out.bags_recreated += 1;
                }
                BagState::Open(_) => out
                    .mismatched
                    .push(format!("bag {bucket} is summarized but not closed")),
            }
        }
    }
    for (secs, _) in by_second {
        out.mismatched.push(format!(
            "bag {} is in the summary but not in its minute's seal",
            Bucket::from_secs(secs)
        ));
    }
    out.mismatched.sort();
    Ok(out)
}

/// A bag's items for [`check`]: (name, size, whether raw, the SHA-256 of
/// each record or of the raw bytes).
type ItemDigests = Vec<(String, u64, bool, Vec<[u8; 32]>)>;

/// A closed bag's items, read as `listing` lists them, for comparison
/// with [`rebuild_all`].
async fn build_bag(
    store: &dyn BagStore,
    log: &str,
    bucket: Bucket,
    listing: &crate::Listing,
) -> Result<ItemDigests> {
    let mut out = Vec::new();
    for item in &listing.items {
        let bytes = store.read_item(log, bucket, item, Some(item.size)).await?;
        let (raw, records) = match (bytes.len() as u64 == item.size)
            .then(|| as_batches(&bytes))
            .flatten()
        {
            Some(batches) => (
                false,
                batches
                    .iter()
                    .map(|b| Sha256::digest(b.encode_to_vec()).into())
                    .collect(),
            ),
            None => (true, vec![Sha256::digest(&bytes).into()]),
        };
        out.push((item.name.clone(), item.size, raw, records));
    }
    Ok(out)
}

/// The same shape as [`build_bag`], from a summary: its records hashed as
/// rebuilt, with their witnesses shared rather than copied into each
/// ([`packed::rebuild_shared`]), so a check holds what the summary and
/// the bag hold, not what the summary's citations add up to.
fn rebuild_all(summary: &Summary, bag: &SummaryBag) -> Result<ItemDigests> {
    let corrupt = |reason| Error::CorruptSummary {
        log: summary.log.clone(),
        name: object_name(summary),
        reason,
    };
    bag.items
        .iter()
        .map(|item| {
            if item.is_raw {
                let rebuilt = rebuild_item(summary, bag, item)?;
                let Records::Raw(raw) = rebuilt.records else {
                    unreachable!("a raw item rebuilds raw");
                };
                return Ok((
                    rebuilt.name,
                    rebuilt.size,
                    true,
                    vec![Sha256::digest(&raw).into()],
                ));
            }
            let name = summary
                .item_names
                .get(item.name as usize)
                .ok_or_else(|| corrupt(format!("item name index {} out of range", item.name)))?;
            let (batches, framed) = packed::rebuild_shared(summary, bag, item).map_err(corrupt)?;
            Ok((
                name.clone(),
                item.size.unwrap_or(framed),
                false,
                batches.iter().map(|b| b.digest).collect(),
            ))
        })
        .collect()
}

#[cfg(test)]
mod attest_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stretch_names_round_trip_and_refuse_what_no_summarizer_names() {
        let s = Stretch::new(Span::of(Bucket::from_secs(1_900_000_000)), 5);
        assert_eq!(Stretch::parse(s.name().trim_start_matches("_summary/")), Some(s));
        assert_eq!(s.last().secs() - s.from().secs() + 1, 300);
        for bad in [
            "1899999961.60",
            "1899999960.0",
            "1899999960.61",
            "x.60",
            "1899999960",
            "",
        ] {
            assert_eq!(Stretch::parse(bad), None, "{bad}");
        }
    }
}
