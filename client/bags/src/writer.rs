//! The writer: picks timestamps under the leases it holds, batches messages
//! into records, and acknowledges a batch only once it is committed.
//!
//! Timestamps are `max(now, last + 1, min_timestamp + 1)`, refused at or
//! past `deadline - deadline_margin`. If that runs more than `max_ahead`
//! ahead of the clock (a predecessor's watermark in the future), the writer
//! pauses up to `max_pause` for the clock to catch up rather than write far
//! ahead of it.
//!
//! A batch is written only if every reader would accept it: the rights
//! (witnesses and bounds, one snapshot taken after the timestamps are
//! chosen) allow every timestamp, every cited witness is of a full lease,
//! and the batch's signed time is congruent with its timestamps. Each batch
//! names its log and bag and is signed with the holder key of every lease
//! it cites ([`crate::holder_sig`]).
//!
//! Before its first write to a log, a writer makes sure the log's start
//! mark is at or before the bags it writes, and writes only bags whose
//! safe point is after it saw the mark: a reader that finds such a bag
//! missing and past due then knows it is inside the log's life and seals
//! it (closes it empty), so a stalled writer can never add it later.
//!
//! Commit: once its append has completed, the writer looks for a close of
//! the bag in progress, whatever its clock says (a clock off by more than
//! the tolerance must not make it skip the look), or, past the close time
//! itself, closes the bag; a started close's lock decides whether the
//! record is in. After its first record in a bag, and after every record
//! past its minute's safe point (`close_time - clock margin`), it first
//! looks for the minute's seal ([`crate::seal`]): a second the seal closed
//! empty takes no record. And once a seal was found or that safe point is
//! past, it looks for the minute's tombstone ([`crate::tombstone`]), before
//! and after the bag's verdict: a minute retention removed takes no record
//! its summary does not hold byte for byte, however long the writer was
//! held before its append, and the writer closes no bag there. Whether a
//! record is past that safe point is read on the clock after the append
//! and again after the bag's verdict: a look held past the minute's
//! removal finds no `_prelock`, as if no close had started. So a writer
//! on a skewed clock may have writes refused (`LateRejected`), never
//! acknowledged and left out of the bag. The decisions are a pure step
//! ([`crate::commit`]); the writer does the looks.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bagel_proto::{Micros, SignedClock, pb};
use bytes::Bytes;
use prost::Message as _;

use crate::pace::{self, Instant};
use crate::seal::{self, Span};
use crate::{BagConfig, BagStore, Bucket, Error, Result, frame, validate_log, validate_writer_id};
use bagel_proto::clock::Clock;
use bagel_proto::rights::{RightsSnapshot, WriteRights};

/// Serialised per-writer state. Held (a tokio mutex) across the whole
/// append of a batch: one writer appends to its single-writer files one
/// batch at a time.
#[derive(Debug)]
struct State {
    last_ts: Micros,
    next_seq: u64,
    /// Data file generation; bumped after a failed append, so a partial
    /// record left behind is never followed by good ones in the same file.
    file_gen: u32,
    /// The first bag this writer may write: the log's start mark is at or
    /// before it and was seen in time for it (see the module docs).
    opened_from: Option<Bucket>,
    /// The last bag a record of this writer was acknowledged in after its
    /// minute was looked at ([`Writer::confirm`]): no seal of the minute
    /// had started once the bag held that record, or the seal lists the
    /// bag. Either way every seal lists it, so its lock alone decides
    /// this writer's later records in it.
    in_every_seal: Option<Bucket>,
}

/// Writes batches of messages into the bags of one log.
pub struct Writer {
    store: Arc<dyn BagStore>,
    log: String,
    writer_id: String,
    /// `<writer_id>.<random>`: data files and objects are named from it, so
    /// two writers given one id (two processes, or a restart within a
    /// second) never write to the same file or object key.
    file_stem: String,
    rights: Arc<dyn WriteRights>,
    clock: Arc<dyn Clock>,
    time: Arc<dyn SignedClock>,
    cfg: BagConfig,
    state: tokio::sync::Mutex<State>,
    /// Largest timestamp handed to the store (0 = none), acknowledged or
    /// not: an append that failed may still have landed.
    max_written: AtomicU64,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("store", &self.store.describe())
            .field("log", &self.log)
            .field("writer_id", &self.writer_id)
            .finish_non_exhaustive()
    }
}

impl Writer {
    /// A writer of `log` as `writer_id`, under `rights`, timestamping from
    /// `clock` and signing batches' time with `time`. An invalid log name
    /// or writer id is [`Error::Invalid`].
    pub fn new(
        store: Arc<dyn BagStore>,
        log: &str,
        writer_id: &str,
        rights: Arc<dyn WriteRights>,
        clock: Arc<dyn Clock>,
        time: Arc<dyn SignedClock>,
        cfg: BagConfig,
    ) -> Result<Self> {
        validate_log(log)?;
        validate_writer_id(writer_id)?;
        Ok(Writer {
            store,
            log: log.to_owned(),
            writer_id: writer_id.to_owned(),
            file_stem: format!("{writer_id}.{:08x}", pace::random_u32()),
            rights,
            clock,
            time,
            cfg,
            state: tokio::sync::Mutex::new(State {
                last_ts: Micros::ZERO,
                next_seq: 0,
                file_gen: 0,
                opened_from: None,
                in_every_seal: None,
            }),
            max_written: AtomicU64::new(0),
        })
    }

    /// A writer id unique to this process: `<host>-<pid>-<random>`.
    pub fn default_writer_id() -> String {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| {
                h.trim()
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect::<String>()
            })
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "host".to_owned());
        let host: String = host.chars().take(32).collect();
        format!(
            "{host}-{}-{:06x}",
            std::process::id(),
            pace::random_u32() & 0xff_ffff
        )
    }

    /// The id its messages carry.
    pub fn writer_id(&self) -> &str {
        &self.writer_id
    }

    /// The log it writes.
    pub fn log(&self) -> &str {
        &self.log
    }

    /// The largest timestamp this writer has handed to the store, whether
    /// or not it was acknowledged (a failed append may have landed).
    pub fn max_written(&self) -> Option<Micros> {
        match self.max_written.load(Ordering::SeqCst) {
            0 => None,
            t => Some(Micros::from_micros(t)),
        }
    }

    /// The watermark to release with: the largest timestamp written, or the
    /// inherited one if larger (or if nothing was written).
    pub fn watermark(&self, inherited: Micros) -> Micros {
        self.max_written().map_or(inherited, |m| m.max(inherited))
    }

    /// Writes one message; see [`Writer::write_batch`].
    pub async fn write(&self, payload: Bytes) -> Result<Micros> {
        Ok(self.write_batch(vec![payload]).await?[0])
    }

    /// Writes messages as one record per bag touched (normally one) and
    /// returns their timestamps once every record is committed. On error a
    /// prefix of the batch (whole records, earlier bags) may be committed.
    pub async fn write_batch(&self, payloads: Vec<Bytes>) -> Result<Vec<Micros>> {
        if payloads.is_empty() {
            return Ok(Vec::new());
        }
        let mut st = self.state.lock().await;
        let min = self
            .rights
            .snapshot()
            .map_err(|reason| Error::NoRights { reason })?;
        let opened = self.ensure_opened(&mut st).await?;
        self.wait_for_opening(opened).await;
        let floor = st
            .last_ts
            .next()
            .max(min.min_timestamp.next())
            .max(opened.start());
        let first = self.first_timestamp(floor).await?;
        let n = payloads.len() as u64;
        let last = Micros::from_micros(first.as_micros() + n - 1);
        // The rights *after* the timestamps are chosen, as one snapshot: the
        // witnesses stored are the ones whose bounds were checked.
        let rights = self
            .rights
            .snapshot()
            .map_err(|reason| Error::NoRights { reason })?;
        check_rights(&rights, first, last, self.cfg.deadline_margin)?;
        let time = self
            .time
            .signed_now()
            .await
            .map_err(|detail| Error::NoSignedTime { detail })?;
        for ts in [first, last] {
            time.reading
                .congruent(ts, self.cfg.signed_time_tolerance)
                .map_err(|(diff_us, limit_us)| Error::SignedTimeOff {
                    ts,
                    time: time.reading.time,
                    diff_us,
                    limit_us,
                })?;
        }
        let ledger = self.rights.ledger();
        self.rights
            .before_write(last)
            .map_err(|reason| Error::NoRights { reason })?;

        let stamps: Vec<Micros> = (0..n)
            .map(|i| Micros::from_micros(first.as_micros() + i))
            .collect();
        let mut i = 0usize;
        let mut payloads = payloads.into_iter();
        while i < stamps.len() {
            let bucket = Bucket::of(stamps[i]);
            let j = stamps[i..]
                .iter()
                .position(|t| Bucket::of(*t) != bucket)
                .map_or(stamps.len(), |k| i + k);
            let entries: Vec<pb::Entry> = stamps[i..j]
                .iter()
                .zip(payloads.by_ref())
                .map(|(t, payload)| pb::Entry {
                    timestamp_us: t.as_micros(),
                    payload: payload.to_vec(),
                })
                .collect();
            let seq = st.next_seq;
            let mut batch = pb::Batch {
                writer_id: self.writer_id.clone(),
                first_sequence: seq,
                signed_time: Some(time.signed.clone()),
                witnesses: rights.witnesses.clone(),
                entries,
                log: self.log.clone(),
                bucket_secs: bucket.secs(),
                holder_signatures: Vec::new(),
            };
            // Signed with each cited lease's holder key, before any
            // sequence number is spent: a writer without the key writes
            // nothing rather than batches every reader rejects.
            crate::holder_sig::sign(&mut batch, &rights.holder_keys)
                .map_err(|reason| Error::NoRights { reason })?;
            let ticket = match &ledger {
                Some(l) => Some(l.begin(stamps[j - 1]).ok_or(Error::WritesClosed)?),
                None => None,
            };
            // Whatever happens next, these timestamps and sequence numbers
            // are spent: an append that failed may still have landed.
            st.last_ts = stamps[j - 1];
            st.next_seq += (j - i) as u64;
            self.max_written
                .fetch_max(stamps[j - 1].as_micros(), Ordering::SeqCst);
            let file = format!("{}.{}", self.file_stem, st.file_gen);
            let record = frame::encode(&batch.encode_to_vec());
            let outcome = match self
                .store
                .append(&self.log, bucket, &file, seq, record.clone())
                .await
            {
                Ok(receipt) => {
                    self.confirm(bucket, &receipt, &record, &mut st.in_every_seal)
                        .await
                }
                Err(e) => {
                    if !matches!(e, Error::BagClosed { .. }) {
                        st.file_gen += 1;
                    }
                    Err(e)
                }
            };
            // A closed bag refused the record, or its lock leaves it out: it
            // is in no bag, now or later. Any other failure may still land.
            let known = matches!(
                &outcome,
                Ok(()) | Err(Error::BagClosed { .. } | Error::LateRejected { .. })
            );
            if known && let Some(t) = ticket {
                t.settled();
            }
            outcome?;
            i = j;
        }
        Ok(stamps)
    }

    /// Makes sure the log's start mark is at or before every bag this
    /// writer will write, and returns the first bag it may write: the
    /// first whose safe point ([`Self::safe_point`], so allowing for this
    /// writer's measured clock bound) is after the instant the mark was
    /// seen. A reader that found that bag (or a later one) missing and past
    /// due must have listed the marks after this one existed, so it sealed
    /// the bag. (With a grace shorter than the clock margin that can be a
    /// later second, and the first write waits for it.)
    async fn ensure_opened(&self, st: &mut State) -> Result<Bucket> {
        if let Some(from) = st.opened_from {
            return Ok(from);
        }
        let want = Bucket::of(self.clock.now());
        match self.store.log_start(&self.log).await? {
            Some(start) if start <= want => {}
            _ => self.store.mark_log_start(&self.log, want).await?,
        }
        let seen = self.clock.now();
        let mut from = want;
        while self.safe_point(from) <= seen {
            from = from.next();
        }
        st.opened_from = Some(from);
        Ok(from)
    }

    /// How far this writer's clock may be off: its time source's measured
    /// error bound, but never less than the configured tolerance (the
    /// closers' rule assumes at least that much).
    fn clock_margin(&self) -> Duration {
        self.time.error_bound().map_or(self.cfg.clock_tolerance, |bound| {
            bound.max(self.cfg.clock_tolerance)
        })
    }

    /// The last instant, on this writer's clock, at which it may trust that
    /// no closer has started closing `bucket`: its close time less
    /// [`Self::clock_margin`]. The configured safe point when the time
    /// source measures no bound wider than the tolerance.
    fn safe_point(&self, bucket: Bucket) -> Micros {
        bucket
            .close_time(self.cfg.grace)
            .saturating_sub(self.clock_margin())
    }

    /// With a grace shorter than the clock margin, the first bag a writer
    /// may write can lie up to the margin ahead of its clock; its first
    /// write waits for the clock to get there (only then, and bounded by the
    /// margin and a second).
    async fn wait_for_opening(&self, opened: Bucket) {
        let cap = self.clock_margin() + Duration::from_secs(1);
        let started = Instant::now();
        loop {
            let ahead = opened
                .start()
                .saturating_sub(self.cfg.max_ahead)
                .duration_since(self.clock.now());
            if ahead.is_zero() || started.elapsed() >= cap {
                return;
            }
            pace::sleep(ahead.min(Duration::from_millis(20))).await;
        }
    }

    /// `max(now, floor)`, pausing (bounded) rather than running far ahead
    /// of the clock.
    async fn first_timestamp(&self, floor: Micros) -> Result<Micros> {
        let started = Instant::now();
        loop {
            let now = self.clock.now();
            let ts = now.max(floor);
            let ahead = ts.duration_since(now);
            if ahead <= self.cfg.max_ahead {
                return Ok(ts);
            }
            let waited = started.elapsed();
            if waited >= self.cfg.max_pause {
                return Err(Error::TooFarAhead { ts, now, ahead });
            }
            let nap = (ahead - self.cfg.max_ahead)
                .min(self.cfg.max_pause - waited)
                .min(Duration::from_millis(20));
            pace::sleep(nap).await;
        }
    }

    /// The late-write check, run once the append has completed; see the
    /// module docs and [`crate::vouched`].
    ///
    /// It looks for a close whatever this writer's clock says. The safe
    /// point is where this clock *expects* closers to start, but a clock
    /// (and the time source vouching for it) can be off by more than the
    /// tolerance, and a closer on true time then closes the bag while this
    /// clock says it is seconds from closing. Nor does the append's own
    /// refusal of a closed bag settle it: the directory store checks the
    /// bag when it opens its file, and a close can start and list the file
    /// before the bytes land; S3 refuses nothing. So after every append the
    /// writer asks the store whether a close has started (on S3 one HEAD of
    /// the bag's `_prelock`, or the answer of one that found none, sent
    /// less than `LOOK_TRUSTED_FOR` ago: closers list only
    /// `CLOSE_SETTLE` after their prelock, so that answer holds too; see
    /// [`crate::store::object`]): not yet, and every closer, which lists only
    /// after that, lists the record; started, and the lock decides. The
    /// look comes after the append completed, which is what makes "not
    /// started" mean "will list it". A clock skewed past the tolerance can
    /// thus make writes fail (`LateRejected`), never lose an acknowledged
    /// one.
    ///
    /// The same goes for the minute: a seal lists only the seconds that
    /// held a bag when it listed them, so a record in a second it left out
    /// is in nothing a reader reads. The writer looks for the minute's seal
    /// ([`crate::seal`]) after its first record in each bag, and after
    /// every record past the minute's safe point (its close time less the
    /// clock margin, as this clock reads it). No seal started once the bag
    /// held a record means every seal lists the bag, so the bag's own check
    /// covers this writer's later records in it.
    ///
    /// A writer helping to close is a closer: it closes only once its
    /// clock less its bound (the tolerance, when its time source measures
    /// none) is past the close time; before that it only looks for a
    /// close. The margin is the tolerance, or a wider error bound its time
    /// source measured (a Roughtime radius of 5 s).
    ///
    /// Past its minute's safe point, or once a seal was found, the minute
    /// may be summarized and removed by retention (a writer held between
    /// its rights check and its append for longer than the retention keeps
    /// bags): its append then made the removed bag again, and the lock its
    /// close reads lists the record. So the minute's tombstone
    /// ([`crate::tombstone`]) is looked for last, after the lock gave its
    /// verdict: absent then, no removal had begun when that lock was read,
    /// so it was the bag's own; present, the record counts only if the
    /// summary that holds the removed minute holds it: that very record,
    /// byte for byte, at its offset (see [`crate::summary::holds_record`]).
    /// A minute no seal had started on is not removed either: removal
    /// comes after the seal.
    ///
    /// Where the minute may be removed (a seal started, or its safe point
    /// past), the tombstone is also looked for *before* the seal's or the
    /// lock's verdict, and found, decides alone: a bag in a removed minute
    /// is never closed, as a close would make a closed bag of whatever
    /// the directory holds since the removal (this writer's own late
    /// record, in the file it re-created).
    ///
    /// The decisions are [`crate::commit::step`]'s, a pure function of
    /// what was looked up so far; this is its driver, doing each look on
    /// the store.
    async fn confirm(
        &self,
        bucket: Bucket,
        receipt: &crate::Receipt,
        record: &[u8],
        in_every_seal: &mut Option<Bucket>,
    ) -> Result<()> {
        use crate::commit::{self, BagLook, Facts, Next, Verdict};
        let now = self.clock.now();
        let span = Span::of(bucket);
        let span_safe = span
            .close_time(self.cfg.grace)
            .saturating_sub(self.clock_margin());
        let (store, log) = (self.store.as_ref(), self.log.as_str());
        let mut facts = Facts {
            early: now < span_safe,
            in_every_seal: *in_every_seal == Some(bucket),
            ..Facts::default()
        };
        // The error a failed look left, which is then the outcome.
        let mut failed: Option<Error> = None;
        let look = |verdict: Result<()>, failed: &mut Option<Error>| match verdict {
            Ok(()) => BagLook::Covered,
            Err(Error::LateRejected { .. }) => BagLook::NotCovered,
            Err(e) => {
                *failed = Some(e);
                BagLook::Failed
            }
        };
        loop {
            match commit::step(&facts) {
                Next::SealingStarted => {
                    facts.sealing_started = Some(seal::sealing_started(store, log, span).await?)
                }
                Next::TombstoneBefore => {
                    let found = crate::tombstone::of(store, log, span).await?;
                    facts.removed_before = Some(found.map(|t| t.summary));
                }
                Next::SealVerdict => {
                    let verdict = self.seal_verdict(bucket, receipt, span).await;
                    facts.bag = Some(look(verdict, &mut failed));
                    facts.early &= self.clock.now() < span_safe;
                }
                Next::LockVerdict => {
                    let verdict = self.lock_verdict(bucket, receipt, now).await;
                    facts.bag = Some(look(verdict, &mut failed));
                    // Early only if still early once the verdict is in: a
                    // writer held before its look (past the seal, the
                    // summary and the removal of its minute, which takes
                    // the bag's `_prelock` with it) must not take "no
                    // close started" for the bag's answer.
                    facts.early &= self.clock.now() < span_safe;
                }
                Next::TombstoneAfter => match crate::tombstone::of(store, log, span).await {
                    Ok(found) => facts.removed_after = Some(found.map(|t| t.summary)),
                    Err(e) => {
                        failed = Some(e);
                        facts.removed_after_failed = true;
                    }
                },
                Next::SummaryHolds(summary) => {
                    facts.summary_holds = Some(self.summary_holds(summary, bucket, receipt, record).await?)
                }
                Next::Done(Verdict::In { in_every_seal: all }) => {
                    if all {
                        *in_every_seal = Some(bucket);
                    }
                    return Ok(());
                }
                Next::Done(Verdict::Late) => {
                    return Err(Error::LateRejected {
                        log: self.log.clone(),
                        bucket,
                    });
                }
                Next::Done(Verdict::BagFailed | Verdict::TombstoneFailed) => {
                    return Err(failed.expect("a failed look keeps its error"));
                }
            }
        }
    }

    /// The record's verdict once its minute's seal has started: the seal
    /// decides first (a sealer may have listed the minute before this bag
    /// existed), then the bag's lock.
    async fn seal_verdict(&self, bucket: Bucket, receipt: &crate::Receipt, span: Span) -> Result<()> {
        let sealed = seal::seal(self.store.as_ref(), &self.log, span).await?;
        let listing = match sealed.has_bag(bucket) {
            true => Some(self.store.close(&self.log, bucket).await?),
            false => None,
        };
        match listing {
            Some(l) if l.covers(receipt) => Ok(()),
            _ => Err(Error::LateRejected {
                log: self.log.clone(),
                bucket,
            }),
        }
    }

    /// The record's verdict from its bag's lock ([`Self::confirm`]): `Ok`
    /// when no close had started once the record was in (any closer lists
    /// it), else what the lock says; or why it is unknown.
    async fn lock_verdict(&self, bucket: Bucket, receipt: &crate::Receipt, now: Micros) -> Result<()> {
        let bound = self.time.error_bound().unwrap_or(self.cfg.clock_tolerance);
        let close_at = bucket.close_time(self.cfg.grace);
        let must_close =
            now.saturating_sub(bound) >= close_at || self.store.closing_started(&self.log, bucket).await?;
        if !must_close {
            // No close has started, so any closer lists this record.
            return Ok(());
        }
        let listing = self.store.close(&self.log, bucket).await?;
        if listing.covers(receipt) {
            Ok(())
        } else {
            Err(Error::LateRejected {
                log: self.log.clone(),
                bucket,
            })
        }
    }

    /// Whether `summary`, the one a tombstone of the record's minute names
    /// (the one retention checked the minute's bags against, and the one
    /// readers read the minute from), holds that very record: its bytes, at
    /// the offset the receipt puts it ([`crate::summary::holds_record`]). A
    /// record appended after the removal is in no summary, and so
    /// `LateRejected`, as it would be by the bag's lock, even where its
    /// append re-created a summarized file and ended inside it. One whose
    /// summary is gone too (`--keep-summaries`) is in nothing a reader
    /// reads.
    async fn summary_holds(
        &self,
        summary: crate::summary::Stretch,
        bucket: Bucket,
        receipt: &crate::Receipt,
        record: &[u8],
    ) -> Result<bool> {
        match crate::summary::stored_bytes(self.store.as_ref(), &self.log, summary).await? {
            Some(bytes) => {
                let summary = crate::summary::parse(&self.log, summary, bytes)?;
                crate::summary::holds_record(&summary, bucket, &receipt.item, receipt.end, record)
            }
            None => Ok(false),
        }
    }
}

/// Refuses timestamps `[first, last]` unless the rights and every witness
/// they cite allow them, exactly as a reader will check them.
fn check_rights(rights: &RightsSnapshot, first: Micros, last: Micros, margin: Duration) -> Result<()> {
    let expiring = |deadline: Micros| Error::LeaseExpiring {
        ts: last,
        deadline,
        margin,
    };
    if rights.witnesses.is_empty() {
        return Err(Error::NoRights {
            reason: "no lease witness: messages must cite the leases they are written under".into(),
        });
    }
    if last >= rights.deadline.saturating_sub(margin) {
        return Err(expiring(rights.deadline));
    }
    for w in &rights.witnesses {
        let body = bagel_proto::witness::decode_unverified(w).map_err(|reason| Error::NoRights { reason })?;
        if pb::Mode::try_from(body.mode)
            .unwrap_or(pb::Mode::Unspecified)
            .normalized()
            != pb::Mode::Full
        {
            return Err(Error::NoRights {
                reason: format!("the witness of lease {} is not of a full lease", body.lease_id),
            });
        }
        if first.as_micros() <= body.min_timestamp_us {
            return Err(Error::NoRights {
                reason: format!(
                    "timestamp {first} is not after lease {}'s min_timestamp {}",
                    body.lease_id,
                    Micros::from_micros(body.min_timestamp_us)
                ),
            });
        }
        let deadline = Micros::from_micros(body.deadline_us);
        if last >= deadline.saturating_sub(margin) {
            return Err(expiring(deadline));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::directory::DirectoryStore;
    use crate::testing::TestLease;
    use crate::testing::TestLeases;
    use bagel_proto::clock::ManualClock;

    const T: u64 = 1_900_000_000_000_000;

    fn writer(dir: &std::path::Path, clock: &ManualClock, min: u64, deadline: u64, cfg: BagConfig) -> Writer {
        let leases = TestLeases::default();
        let lease = leases.lease("lease", Micros::from_micros(min), Micros::from_micros(deadline));
        Writer::new(
            Arc::new(DirectoryStore::local(dir, false)),
            "log",
            "w",
            Arc::new(lease),
            Arc::new(clock.clone()),
            leases.time(Arc::new(clock.clone())),
            cfg,
        )
        .unwrap()
    }

    #[tokio::test]
    async fn timestamps_follow_clock_last_and_min() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(Micros::from_micros(T));
        let w = writer(
            dir.path(),
            &clock,
            T + 50_000,
            T + 60_000_000,
            BagConfig::default(),
        );
        // min_timestamp is 50 ms ahead (within max_ahead): strictly after it.
        let a = w
            .write_batch(vec![Bytes::from("a"), Bytes::from("b")])
            .await
            .unwrap();
        assert_eq!(
            a,
            vec![Micros::from_micros(T + 50_001), Micros::from_micros(T + 50_002)]
        );
        // The clock has not moved: last + 1.
        assert_eq!(
            w.write(Bytes::from("c")).await.unwrap(),
            Micros::from_micros(T + 50_003)
        );
        // The clock moved past: now.
        clock.set(Micros::from_micros(T + 200_000));
        assert_eq!(
            w.write(Bytes::from("d")).await.unwrap(),
            Micros::from_micros(T + 200_000)
        );
        assert_eq!(w.max_written(), Some(Micros::from_micros(T + 200_000)));
        assert_eq!(
            w.watermark(Micros::from_micros(T)),
            Micros::from_micros(T + 200_000)
        );
    }

    #[tokio::test]
    async fn refuses_near_the_deadline_and_far_ahead_of_the_clock() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(Micros::from_micros(T));
        let cfg = BagConfig::default().with_max_pause(Duration::from_millis(30));
        let w = writer(dir.path(), &clock, T + 10_000_000, T + 60_000_000, cfg.clone());
        let err = w.write(Bytes::from("x")).await.unwrap_err();
        assert!(matches!(err, Error::TooFarAhead { .. }), "{err:?}");
        assert!(err.is_retryable());
        assert_eq!(w.max_written(), None, "nothing was handed to the store");

        let w = writer(dir.path(), &clock, T - 1_000_000, T + 400_000, cfg);
        let err = w.write(Bytes::from("x")).await.unwrap_err();
        assert!(matches!(err, Error::LeaseExpiring { .. }), "{err:?}");
        assert!(err.is_permanent());
    }

    #[tokio::test]
    async fn pauses_until_the_clock_catches_up() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(Micros::from_micros(T));
        let w = writer(
            dir.path(),
            &clock,
            T + 500_000,
            T + 60_000_000,
            BagConfig::default(),
        );
        let mover = {
            let clock = clock.clone();
            tokio::spawn(async move { clock.set(Micros::from_micros(T + 450_000)) })
        };
        let ts = w.write(Bytes::from("x")).await.unwrap();
        mover.await.unwrap();
        assert_eq!(ts, Micros::from_micros(T + 500_001));
    }

    #[tokio::test]
    async fn a_batch_spanning_two_seconds_becomes_two_records() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(Micros::from_micros(T + 999_999));
        let w = writer(dir.path(), &clock, T, T + 60_000_000, BagConfig::default());
        let ts = w
            .write_batch(vec![Bytes::from("a"), Bytes::from("b")])
            .await
            .unwrap();
        assert_eq!(Bucket::of(ts[0]).secs() + 1, Bucket::of(ts[1]).secs());
        for t in ts {
            let p = dir
                .path()
                .join("log")
                .join(Bucket::of(t).path())
                .join(format!("{}.0.log", w.file_stem));
            assert!(p.exists(), "{}", p.display());
        }
    }

    /// A writer whose clock is 30 s behind a closer on true time: the
    /// closer closed its bag and sealed its minute (leaving the next second
    /// out), while the writer's clock says both are far from closing. Its
    /// writes into them are refused, never acknowledged: the append refuses
    /// the closed bag, and once an append into the second the seal left out
    /// has completed, the writer looks for the seal whatever its clock says.
    #[tokio::test]
    async fn a_writer_behind_true_time_finds_the_close_and_the_seal() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirectoryStore::local(dir.path(), false);
        let start = Micros::from_micros(T + 10_250_000);
        let clock = ManualClock::new(start);
        let w = writer(dir.path(), &clock, T, T + 3_600_000_000, BagConfig::default());
        w.write(Bytes::from("on time")).await.unwrap();
        let bag = Bucket::of(start);
        let sealed = seal::seal(&store, "log", Span::of(bag)).await.unwrap();
        assert!(sealed.has_bag(bag) && !sealed.has_bag(bag.next()));
        let listing = store.close("log", bag).await.unwrap();
        assert_eq!(listing.items.len(), 1);

        // The bag's own data file is read-only now: the append refuses it.
        clock.advance(Duration::from_millis(100));
        let err = w.write(Bytes::from("late")).await.unwrap_err();
        assert!(matches!(err, Error::BagClosed { .. }), "{err:?}");
        // The next second, which the seal closed empty.
        clock.advance(Duration::from_secs(1));
        assert_eq!(Bucket::of(clock.now()), bag.next());
        let err = w.write(Bytes::from("sealed out")).await.unwrap_err();
        assert!(matches!(err, Error::LateRejected { .. }), "{err:?}");
        assert_eq!(store.close("log", bag).await.unwrap(), listing);
    }

    /// A signed clock that answers with a fixed reading, or none.
    #[derive(Debug)]
    struct FixedTime(Option<bagel_proto::SignedReading>);

    #[async_trait::async_trait]
    impl SignedClock for FixedTime {
        async fn signed_now(&self) -> std::result::Result<bagel_proto::SignedReading, String> {
            self.0
                .clone()
                .ok_or_else(|| "no answer from the time authority".to_owned())
        }
    }

    /// A signed clock that measured a wide error bound (a Roughtime
    /// radius), its readings those of `inner`.
    #[derive(Debug)]
    struct Bounded {
        inner: Arc<dyn SignedClock>,
        bound: Duration,
    }

    #[async_trait::async_trait]
    impl SignedClock for Bounded {
        async fn signed_now(&self) -> std::result::Result<bagel_proto::SignedReading, String> {
            self.inner.signed_now().await
        }
        fn error_bound(&self) -> Option<Duration> {
            Some(self.bound)
        }
    }

    #[tokio::test]
    async fn a_writer_with_a_wide_clock_bound_opens_its_log_past_that_bound() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(Micros::from_micros(T));
        let leases = TestLeases::default();
        let lease = leases.lease(
            "l",
            Micros::from_micros(T - 1_000_000),
            Micros::from_micros(T + 60_000_000),
        );
        let store: Arc<dyn BagStore> = Arc::new(DirectoryStore::local(dir.path(), false));
        let cfg = BagConfig::default();
        let opened_with = |bound: Option<Duration>| {
            let plain = leases.time(Arc::new(clock.clone()));
            let time: Arc<dyn SignedClock> = match bound {
                Some(bound) => Arc::new(Bounded { inner: plain, bound }),
                None => plain,
            };
            let w = Writer::new(
                store.clone(),
                "log",
                "w",
                Arc::new(lease.clone()),
                Arc::new(clock.clone()),
                time,
                cfg.clone(),
            )
            .unwrap();
            async move {
                let mut st = w.state.lock().await;
                w.ensure_opened(&mut st).await.unwrap()
            }
        };
        // Within the tolerance: the current second (it closes 3 s on, 2 s
        // after the safe point).
        assert_eq!(opened_with(None).await, Bucket::of(clock.now()));
        assert_eq!(
            opened_with(Some(Duration::from_millis(300))).await,
            Bucket::of(clock.now())
        );
        // A 5 s bound: a closer on true time may seal any bag closing within
        // 5 s of this clock without seeing the mark, so the first bag the
        // writer may write closes more than 5 s on.
        let bound = Duration::from_secs(5);
        let from = opened_with(Some(bound)).await;
        assert!(
            from.close_time(cfg.grace).saturating_sub(bound) > clock.now(),
            "{from:?}"
        );
        assert_eq!(from.secs(), Bucket::of(clock.now()).secs() + 3);
    }

    #[tokio::test]
    async fn refuses_without_a_congruent_signed_time_or_with_tentative_rights() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(Micros::from_micros(T));
        let leases = TestLeases::default();
        let lease = leases.lease(
            "l",
            Micros::from_micros(T - 1_000_000),
            Micros::from_micros(T + 60_000_000),
        );
        let store: Arc<dyn BagStore> = Arc::new(DirectoryStore::local(dir.path(), false));
        let with_time = |time: Arc<dyn SignedClock>, lease: TestLease| {
            Writer::new(
                store.clone(),
                "log",
                "w",
                Arc::new(lease),
                Arc::new(clock.clone()),
                time,
                BagConfig::default(),
            )
            .unwrap()
        };
        // No signed time at all.
        let w = with_time(Arc::new(FixedTime(None)), lease.clone());
        let err = w.write(Bytes::from("x")).await.unwrap_err();
        assert!(matches!(err, Error::NoSignedTime { .. }), "{err:?}");
        assert_eq!(w.max_written(), None, "nothing was handed to the store");
        // A signed time 3 s old: readers would reject the batch.
        let stale = leases.time(Arc::new(ManualClock::new(Micros::from_micros(T - 3_000_000))));
        let reading = stale.signed_now().await.unwrap();
        let w = with_time(Arc::new(FixedTime(Some(reading))), lease.clone());
        let err = w.write(Bytes::from("x")).await.unwrap_err();
        assert!(matches!(err, Error::SignedTimeOff { .. }), "{err:?}");
        assert!(err.is_retryable());
        // Rights whose witness says tentative.
        let mut body = bagel_proto::witness::decode_unverified(&lease.witness).unwrap();
        body.mode = pb::Mode::Tentative.into();
        let mut tentative = lease.clone();
        tentative.witness = bagel_proto::sign_witness(&leases.signer, &body);
        let w = with_time(leases.time(Arc::new(clock.clone())), tentative);
        let err = w.write(Bytes::from("x")).await.unwrap_err();
        assert!(matches!(err, Error::NoRights { .. }), "{err:?}");
        // And with everything right, it writes.
        let w = with_time(leases.time(Arc::new(clock.clone())), lease);
        w.write(Bytes::from("x")).await.unwrap();
    }
}
