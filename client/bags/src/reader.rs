//! Ordered, checked reads of a time range of a log.
//!
//! Closed bags are read exactly as their lock lists them (each item up to
//! its listed size, nothing else); a past-due bag found open is closed
//! first; still-open bags are skipped, or read up to each item's last whole
//! record with [`ReadOptions::include_open`]. Messages come back ordered by
//! `(timestamp, writer, sequence)`.
//!
//! A past-due bag that does not exist yet, inside the log's life (from the
//! earliest writer start mark on), is *sealed*: closed empty. Otherwise a
//! stalled writer could create it after this read and a later reader would
//! see messages this one did not; sealed, the writer finds it closed and
//! is refused. So any two readers of a past range read the same messages.
//!
//! Every message is checked: the signatures of the witnesses it cites, that
//! its timestamp lies strictly between each lease's `min_timestamp` and
//! `deadline`, and that it is near its batch's signed time. A message that
//! fails goes to [`ReadReport::rejected`] with the reason; damaged records go
//! to [`ReadReport::problems`]. Nothing is dropped silently. Without a key
//! ring, signatures are not checked and each message says so in its notes.

use bagel_proto::{KeyRing, Micros, pb};
use bytes::Bytes;
use prost::Message as _;

use std::sync::Arc;

use crate::frame::{self, Frame};
use crate::{BagConfig, BagState, BagStore, Bucket, ListedItem, Result, list_buckets, validate_log};
use bagel_proto::clock::CheckedClock;

/// What to read.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ReadOptions {
    /// First timestamp included.
    pub from: Micros,
    /// First timestamp excluded.
    pub to: Micros,
    /// Also read bags that are not closed yet (each item up to its last
    /// whole record). Such messages may still be rejected by the close.
    pub include_open: bool,
    /// Close past-due bags found open before reading them, and seal the
    /// missing ones (default on). Without it, two readers of one range may
    /// disagree.
    pub close_past_due: bool,
    /// Trusted witness/time keys. `None`: signatures are not checked and
    /// every message carries a note saying so.
    pub keys: Option<KeyRing>,
    /// Trusted Roughtime keys, for signed times that are Roughtime proofs.
    pub roughtime_keys: Vec<bagel_proto::signed_time::roughtime::RoughtimeKey>,
    /// Told (bags read, bags to read) as the read goes (a progress bar).
    pub progress: Option<Progress>,
}

/// A callback told `(done, total)` as long work advances.
#[derive(Clone)]
pub struct Progress(Arc<dyn Fn(u64, u64) + Send + Sync>);

impl Progress {
    pub fn new(f: impl Fn(u64, u64) + Send + Sync + 'static) -> Self {
        Progress(Arc::new(f))
    }

    fn report(&self, done: u64, total: u64) {
        (self.0)(done, total);
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress")
    }
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            from: Micros::ZERO,
            to: Micros::MAX,
            include_open: false,
            close_past_due: true,
            keys: None,
            roughtime_keys: Vec::new(),
            progress: None,
        }
    }
}

impl ReadOptions {
    #[must_use]
    pub fn with_progress(mut self, progress: Progress) -> Self {
        self.progress = Some(progress);
        self
    }

    pub fn with_range(mut self, from: Micros, to: Micros) -> Self {
        self.from = from;
        self.to = to;
        self
    }
    #[must_use]
    pub fn with_include_open(mut self, yes: bool) -> Self {
        self.include_open = yes;
        self
    }
    #[must_use]
    pub fn with_close_past_due(mut self, yes: bool) -> Self {
        self.close_past_due = yes;
        self
    }
    #[must_use]
    pub fn with_keys(mut self, keys: Option<KeyRing>) -> Self {
        self.keys = keys;
        self
    }
    #[must_use]
    pub fn with_roughtime_keys(
        mut self,
        keys: Vec<bagel_proto::signed_time::roughtime::RoughtimeKey>,
    ) -> Self {
        self.roughtime_keys = keys;
        self
    }
}

/// One message as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub timestamp: Micros,
    pub writer_id: String,
    pub sequence: u64,
    pub payload: Bytes,
    pub bucket: Bucket,
    /// The lease ids of the witnesses it cites.
    pub lease_ids: Vec<String>,
    /// Read from a bag that was not closed.
    pub from_open_bag: bool,
    /// What could not be checked (e.g. no key given, no signed time).
    pub notes: Vec<String>,
    /// The witnesses of its batch, as stored (for the audit).
    pub witnesses: Arc<[pb::Witness]>,
    /// The signed time of its batch, as stored.
    pub signed_time: Option<Arc<pb::SignedTime>>,
}

/// A message that failed a check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    pub message: Message,
    pub reason: String,
}

/// Damage found in a bag: a corrupt record, a torn tail, a short file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub bucket: Bucket,
    pub item: String,
    pub offset: Option<u64>,
    pub what: String,
    /// In an open bag, a torn tail may just be a write in progress.
    pub in_open_bag: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadReport {
    /// Accepted messages, ordered by `(timestamp, writer, sequence)`.
    pub messages: Vec<Message>,
    pub rejected: Vec<Rejected>,
    pub problems: Vec<Problem>,
    /// Bags in range that were open and not read.
    pub skipped_open: Vec<Bucket>,
    pub closed_bags_read: u64,
    /// Missing past-due bags this read closed empty.
    pub sealed: u64,
    /// Why this read closed nothing although asked to close past-due bags:
    /// its clock could not be vouched for (the text of
    /// [`crate::Error::ClockUnvouched`]). The open bags it met are in
    /// `skipped_open`, waiting for a closer whose clock is vouched for.
    pub close_refused: Option<String>,
}

/// Reads `[from, to)` of `log`; see the module docs.
pub async fn read(
    store: &dyn BagStore,
    log: &str,
    opts: &ReadOptions,
    cfg: &BagConfig,
    clock: &dyn CheckedClock,
) -> Result<ReadReport> {
    validate_log(log)?;
    let mut report = ReadReport::default();
    if opts.to <= opts.from {
        return Ok(report);
    }
    // Closing acts on the instant true time has surely reached, checked
    // once: a reader whose clock is ahead must not seal the next seconds.
    // Refused, it closes nothing and says why (see `crate::vouched`).
    let closer_now = if opts.close_past_due {
        match crate::closer_now(clock).await {
            Ok(now) => Some(now),
            Err(e @ crate::Error::ClockUnvouched { .. }) => {
                report.close_refused = Some(e.to_string());
                None
            }
            Err(e) => return Err(e),
        }
    } else {
        None
    };
    // Year 9999 is as far as the tree goes.
    let to = opts.to.min(Micros::from_micros(253_402_300_800_000_000));
    let first = Bucket::of(opts.from);
    let last = Bucket::of(to.saturating_sub_us(1));
    let mut buckets = list_buckets(store, log, first, last).await?;
    if let Some(now) = closer_now
        && let Some(start) = store.log_start(log).await?
    {
        let sealed = seal_missing(store, log, &buckets, start.max(first), last, cfg, now).await?;
        report.sealed = sealed.len() as u64;
        buckets.extend(sealed);
        buckets.sort_unstable();
    }
    let total = buckets.len() as u64;
    for (done, bucket) in buckets.into_iter().enumerate() {
        if let Some(p) = &opts.progress {
            p.report(done as u64, total);
        }
        let (items, open) = match store.state(log, bucket).await? {
            BagState::Closed(l) => (l.items, false),
            BagState::Open(_) if closer_now.is_some_and(|now| now >= bucket.close_time(cfg.grace)) => {
                (store.close(log, bucket).await?.items, false)
            }
            BagState::Open(items) if opts.include_open => (items, true),
            BagState::Open(_) => {
                report.skipped_open.push(bucket);
                continue;
            }
        };
        if !open {
            report.closed_bags_read += 1;
        }
        for item in items {
            let limit = (!open).then_some(item.size);
            match store.read_item(log, bucket, &item, limit).await {
                Ok(bytes) => read_item(&mut report, opts, cfg, bucket, &item, bytes, open),
                Err(e @ crate::Error::ItemChanged { .. }) => report.problems.push(Problem {
                    bucket,
                    item: item.name.clone(),
                    offset: None,
                    what: e.to_string(),
                    in_open_bag: open,
                }),
                Err(e) => return Err(e),
            }
        }
    }
    if let Some(p) = &opts.progress {
        p.report(total, total);
    }
    let key = |m: &Message| (m.timestamp, m.writer_id.clone(), m.sequence);
    report.messages.sort_by_key(key);
    report.rejected.sort_by_key(|r| key(&r.message));
    Ok(report)
}

/// Closes, empty, every past-due bag of `[from, to]` that is not among
/// `existing`; returns them. `now`: the instant true time has surely
/// reached.
async fn seal_missing(
    store: &dyn BagStore,
    log: &str,
    existing: &[Bucket],
    from: Bucket,
    to: Bucket,
    cfg: &BagConfig,
    now: Micros,
) -> Result<Vec<Bucket>> {
    let existing: std::collections::HashSet<Bucket> = existing.iter().copied().collect();
    let mut sealed = Vec::new();
    let mut b = from;
    while b <= to && now >= b.close_time(cfg.grace) {
        if !existing.contains(&b) {
            store.close(log, b).await?;
            sealed.push(b);
        }
        b = b.next();
    }
    Ok(sealed)
}

trait SubUs {
    fn saturating_sub_us(self, us: u64) -> Micros;
}

impl SubUs for Micros {
    fn saturating_sub_us(self, us: u64) -> Micros {
        Micros::from_micros(self.as_micros().saturating_sub(us))
    }
}

fn read_item(
    report: &mut ReadReport,
    opts: &ReadOptions,
    cfg: &BagConfig,
    bucket: Bucket,
    item: &ListedItem,
    bytes: Bytes,
    open: bool,
) {
    let problem = |offset, what: String| Problem {
        bucket,
        item: item.name.clone(),
        offset,
        what,
        in_open_bag: open,
    };
    if !open && (bytes.len() as u64) < item.size {
        report.problems.push(problem(
            Some(bytes.len() as u64),
            format!(
                "item is {} bytes, shorter than its listed size {}",
                bytes.len(),
                item.size
            ),
        ));
    }
    for f in frame::decode(&bytes) {
        match f {
            Frame::Record { offset, body } => match pb::Batch::decode(body) {
                Ok(batch) => check_batch(report, opts, cfg, bucket, batch, open),
                Err(e) => report.problems.push(problem(
                    Some(offset),
                    format!("record does not decode as a batch: {e}"),
                )),
            },
            Frame::Corrupt { offset, reason } => {
                report
                    .problems
                    .push(problem(Some(offset), format!("corrupt record: {reason}")));
            }
            Frame::TornTail { offset, missing } => report.problems.push(problem(
                Some(offset),
                if open {
                    format!(
                        "incomplete record at the tail ({missing} bytes missing; a write may be in progress)"
                    )
                } else {
                    format!("torn record inside the listed size ({missing} bytes missing)")
                },
            )),
        }
    }
}

/// The verdict on a batch's witnesses: per lease, its bounds.
struct Lease {
    id: String,
    min: Micros,
    deadline: Micros,
}

fn check_batch(
    report: &mut ReadReport,
    opts: &ReadOptions,
    cfg: &BagConfig,
    bucket: Bucket,
    batch: pb::Batch,
    open: bool,
) {
    let mut batch_notes = Vec::new();
    let mut batch_error: Option<String> = None;
    let mut leases = Vec::new();
    if batch.witnesses.is_empty() {
        batch_error = Some("cites no lease witness".into());
    }
    for w in &batch.witnesses {
        let body = match &opts.keys {
            Some(keys) => {
                bagel_proto::verify_witness(w, keys).map_err(|e| format!("witness {}: {e}", w.key_id))
            }
            None => {
                bagel_proto::witness::decode_unverified(w).map_err(|e| format!("witness {}: {e}", w.key_id))
            }
        };
        match body {
            Ok(b) if b.mode().normalized() != pb::Mode::Full => {
                batch_error.get_or_insert(format!(
                    "cites the witness of lease {}, which is tentative: no right to write",
                    b.lease_id
                ));
            }
            Ok(b) => leases.push(Lease {
                id: b.lease_id,
                min: Micros::from_micros(b.min_timestamp_us),
                deadline: Micros::from_micros(b.deadline_us),
            }),
            Err(e) => {
                batch_error.get_or_insert(e);
            }
        }
    }
    if opts.keys.is_none() {
        batch_notes.push("witness signatures NOT verified (no key given)".to_owned());
    }
    // The signed time: a local proof with the same keys, a Roughtime
    // proof with the Roughtime keys (plus its one-second resolution).
    let mut time_ref: Option<bagel_proto::TimeReading> = None;
    let is_roughtime = matches!(
        batch.signed_time.as_ref().and_then(|t| t.proof.as_ref()),
        Some(pb::signed_time::Proof::Roughtime(_))
    );
    let empty = KeyRing::new();
    match (&batch.signed_time, &opts.keys) {
        (None, _) => batch_notes.push("no signed time".to_owned()),
        (Some(_), _) if is_roughtime && opts.roughtime_keys.is_empty() => {
            batch_notes.push("Roughtime signed time NOT verified (no Roughtime key given)".to_owned())
        }
        (Some(_), None) if !is_roughtime => {
            batch_notes.push("signed time NOT verified (no key given)".to_owned())
        }
        (Some(st), keys) => {
            match bagel_proto::verify_signed_time(st, keys.as_ref().unwrap_or(&empty), &opts.roughtime_keys) {
                Ok(r) => time_ref = Some(r),
                Err(e) => {
                    batch_error.get_or_insert(format!("signed time: {e}"));
                }
            }
        }
    }
    let lease_ids: Vec<String> = leases.iter().map(|l| l.id.clone()).collect();
    let witnesses: Arc<[pb::Witness]> = Arc::from(batch.witnesses);
    let signed_time = batch.signed_time.map(Arc::new);
    for (i, e) in batch.entries.into_iter().enumerate() {
        let ts = Micros::from_micros(e.timestamp_us);
        if ts < opts.from || ts >= opts.to {
            continue;
        }
        let message = Message {
            timestamp: ts,
            writer_id: batch.writer_id.clone(),
            sequence: batch.first_sequence + i as u64,
            payload: Bytes::from(e.payload),
            bucket,
            lease_ids: lease_ids.clone(),
            from_open_bag: open,
            notes: batch_notes.clone(),
            witnesses: Arc::clone(&witnesses),
            signed_time: signed_time.clone(),
        };
        let reason = batch_error.clone().or_else(|| {
            if Bucket::of(ts) != bucket {
                return Some(format!("timestamp {ts} does not belong in bag {bucket}"));
            }
            for l in &leases {
                if ts <= l.min {
                    return Some(format!(
                        "timestamp {ts} is not after lease {}'s min_timestamp {}",
                        l.id, l.min
                    ));
                }
                if ts >= l.deadline {
                    return Some(format!(
                        "timestamp {ts} is at or after lease {}'s deadline {}",
                        l.id, l.deadline
                    ));
                }
            }
            if let Some(r) = time_ref
                && let Err((diff, limit)) = r.congruent(ts, cfg.signed_time_tolerance)
            {
                return Some(format!(
                    "timestamp {ts} is {diff} us away from its signed time {} (limit {limit} us)",
                    r.time
                ));
            }
            None
        });
        match reason {
            Some(reason) => report.rejected.push(Rejected { message, reason }),
            None => report.messages.push(message),
        }
    }
}
