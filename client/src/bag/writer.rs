//! The writer: picks timestamps under the leases it holds, batches messages
//! into records, and acknowledges a batch only once it is committed.
//!
//! Timestamps are `max(now, last + 1, min_timestamp + 1)`, refused at or
//! past `deadline - deadline_margin`. If that runs more than `max_ahead`
//! ahead of the clock (a predecessor's watermark in the future), the writer
//! pauses up to `max_pause` for the clock to catch up rather than write far
//! ahead of it.
//!
//! Commit: a record whose append finished before the bag's safe point
//! (`close_time - clock_tolerance`) is in, because no closer can have
//! started yet. Past it, the writer looks for a close in progress (or, past
//! the close time itself, closes the bag) and acknowledges the record only
//! if the lock lists it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bagel_proto::{Micros, pb};
use bytes::Bytes;
use prost::Message as _;

use super::{BagConfig, BagStore, Bucket, Error, Result, frame, validate_log, validate_writer_id};
use crate::clock::Clock;
use crate::json::LeaseJson;

/// What a writer needs from the leases it writes under. The lease handle
/// implements it; so does a lease read back from `bagel acquire --json`.
pub trait WriteRights: Send + Sync {
    /// Every message must be strictly later than this.
    fn min_timestamp(&self) -> Micros;
    /// Every message must be strictly earlier than this (minus the margin).
    fn deadline(&self) -> Micros;
    /// The witnesses of the leases held, stored with every batch.
    fn witnesses(&self) -> Vec<pb::Witness>;
}

impl WriteRights for LeaseJson {
    fn min_timestamp(&self) -> Micros {
        Micros::from_micros(self.min_timestamp_us)
    }

    fn deadline(&self) -> Micros {
        Micros::from_micros(self.deadline_us)
    }

    /// Empty if the JSON's witness does not decode (the writer then refuses
    /// to write; check [`crate::json::WitnessJson::to_pb`] first for the
    /// reason).
    fn witnesses(&self) -> Vec<pb::Witness> {
        self.witness.to_pb().ok().into_iter().collect()
    }
}

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
}

/// Writes batches of messages into the bags of one log.
pub struct Writer {
    store: Arc<dyn BagStore>,
    log: String,
    writer_id: String,
    rights: Arc<dyn WriteRights>,
    clock: Arc<dyn Clock>,
    cfg: BagConfig,
    /// Refreshed by the caller; never held across `.await`.
    signed_time: Mutex<Option<pb::SignedTime>>,
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
    pub fn new(
        store: Arc<dyn BagStore>,
        log: &str,
        writer_id: &str,
        rights: Arc<dyn WriteRights>,
        clock: Arc<dyn Clock>,
        cfg: BagConfig,
    ) -> Result<Self> {
        validate_log(log)?;
        validate_writer_id(writer_id)?;
        Ok(Writer {
            store,
            log: log.to_owned(),
            writer_id: writer_id.to_owned(),
            rights,
            clock,
            cfg,
            signed_time: Mutex::new(None),
            state: tokio::sync::Mutex::new(State {
                last_ts: Micros::ZERO,
                next_seq: 0,
                file_gen: 0,
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
            rand::random::<u32>() & 0xff_ffff
        )
    }

    pub fn writer_id(&self) -> &str {
        &self.writer_id
    }

    pub fn log(&self) -> &str {
        &self.log
    }

    /// The signed time stored with the following batches.
    pub fn set_signed_time(&self, st: Option<pb::SignedTime>) {
        *self.signed_time.lock().expect("signed_time lock poisoned") = st;
    }

    /// The largest timestamp this writer has handed to the store, whether
    /// or not it was acknowledged (a failed append may have landed). Release
    /// the lease with [`Writer::watermark`] only after every write returned.
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
        let witnesses = self.rights.witnesses();
        if witnesses.is_empty() {
            return Err(Error::invalid(
                "write rights",
                "",
                "no lease witness: messages must cite the leases they are written under",
            ));
        }
        let mut st = self.state.lock().await;
        let first = self.first_timestamp(st.last_ts).await?;
        let n = payloads.len() as u64;
        let last = Micros::from_micros(first.as_micros() + n - 1);
        let deadline = self.rights.deadline();
        if last >= deadline.saturating_sub(self.cfg.deadline_margin) {
            return Err(Error::LeaseExpiring {
                ts: last,
                deadline,
                margin: self.cfg.deadline_margin,
            });
        }
        let signed_time = self
            .signed_time
            .lock()
            .expect("signed_time lock poisoned")
            .clone();

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
            let batch = pb::Batch {
                writer_id: self.writer_id.clone(),
                first_sequence: seq,
                signed_time: signed_time.clone(),
                witnesses: witnesses.clone(),
                entries,
            };
            // Whatever happens next, these timestamps and sequence numbers
            // are spent: an append that failed may still have landed.
            st.last_ts = stamps[j - 1];
            st.next_seq += (j - i) as u64;
            self.max_written
                .fetch_max(stamps[j - 1].as_micros(), Ordering::SeqCst);
            let file = format!("{}.{}", self.writer_id, st.file_gen);
            let record = frame::encode(&batch.encode_to_vec());
            let receipt = match self.store.append(&self.log, bucket, &file, seq, record).await {
                Ok(r) => r,
                Err(e) => {
                    if !matches!(e, Error::BagClosed { .. }) {
                        st.file_gen += 1;
                    }
                    return Err(e);
                }
            };
            self.confirm(bucket, &receipt).await?;
            i = j;
        }
        Ok(stamps)
    }

    /// `max(now, last + 1, min_timestamp + 1)`, pausing (bounded) rather
    /// than running far ahead of the clock.
    async fn first_timestamp(&self, last: Micros) -> Result<Micros> {
        let floor = last.next().max(self.rights.min_timestamp().next());
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
            tokio::time::sleep(nap).await;
        }
    }

    /// The late-write check; see the module docs.
    async fn confirm(&self, bucket: Bucket, receipt: &super::Receipt) -> Result<()> {
        let now = self.clock.now();
        if now < self.cfg.safe_point(bucket) {
            return Ok(());
        }
        let must_close =
            now >= bucket.close_time(self.cfg.grace) || self.store.closing_started(&self.log, bucket).await?;
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bag::posix::PosixStore;
    use crate::clock::ManualClock;

    struct Rights {
        min: Micros,
        deadline: Micros,
    }

    impl WriteRights for Rights {
        fn min_timestamp(&self) -> Micros {
            self.min
        }
        fn deadline(&self) -> Micros {
            self.deadline
        }
        fn witnesses(&self) -> Vec<pb::Witness> {
            vec![pb::Witness::default()]
        }
    }

    const T: u64 = 1_900_000_000_000_000;

    fn writer(dir: &std::path::Path, clock: &ManualClock, min: u64, deadline: u64, cfg: BagConfig) -> Writer {
        Writer::new(
            Arc::new(PosixStore::local(dir, false, Duration::from_secs(5))),
            "log",
            "w",
            Arc::new(Rights {
                min: Micros::from_micros(min),
                deadline: Micros::from_micros(deadline),
            }),
            Arc::new(clock.clone()),
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
            let p = dir.path().join("log").join(Bucket::of(t).path()).join("w.0.log");
            assert!(p.exists(), "{}", p.display());
        }
    }
}
