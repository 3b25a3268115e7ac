//! The bag conformance suite: every scenario, written once over the
//! `BagStore` trait, is a public async function here taking the store under
//! test (a [`BagEnv`]) and what it declares about itself
//! ([`Capabilities`]). Each store's test module
//! (`tests/tests/bags_conformance.rs`) calls every scenario from one
//! `#[tokio::test]`.
//!
//! Each scenario makes its own fresh log on the store, so scenarios on one
//! store never meet; the time is a manual clock, the leases are test
//! leases signed like a server signs them.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bagel_bags::reader::ReadReport;
use bagel_bags::seal::{self, Span};
use bagel_bags::store::faults::KillSwitch;
use bagel_bags::summary::{self, Stretch};
use bagel_bags::{
    self as bag, BagConfig, BagState, BagStore, Bucket, Error, Metronome, ReadOptions, Writer, frame,
};
use bagel_proto::clock::{AssumedExact, Clock, ManualClock};
use bagel_proto::{KeyRing, Micros, pb};
use bytes::Bytes;
use prost::Message as _;

use crate::{HookStore, TestLeases, payloads, t0, unique};

/// A bag store under test: how to open it (again, as another process
/// would, or doomed to fail part way) and how to reach its bytes around
/// it, as damage on disk would.
#[async_trait]
pub trait BagEnv: Send + Sync {
    /// A new handle on the store. Handles share what is stored, nothing
    /// else: several stand for several processes.
    async fn store(&self) -> Arc<dyn BagStore>;

    /// A new handle whose every low-level operation (a file operation, a
    /// request) after the ones `kill` allows fails, as a process killed
    /// part way through a close or a seal.
    async fn store_with(&self, kill: KillSwitch) -> Arc<dyn BagStore>;

    /// The bytes stored under `key`, a path below the store's root
    /// (`LOG/YYYY/MM/DD/hh/mm/ss/ITEM`, as a listing names an item), read
    /// around the store (a file, an object).
    async fn read_raw(&self, key: &str) -> Vec<u8>;

    /// Replaces the bytes stored under `key` (as [`BagEnv::read_raw`]),
    /// around the store.
    async fn write_raw(&self, key: &str, bytes: Vec<u8>);
}

/// What a bag store declares about itself, for the scenarios whose
/// assertions depend on it.
#[derive(Clone, Copy, Debug)]
pub struct Capabilities {
    /// Each appended batch is an object of its own, and a bag's lock pins
    /// each to its version (an object store's ETag): a changed batch is
    /// refused as changed and the others are read. Without it a bag is one
    /// file of records, and nothing after a damaged record can be framed.
    pub one_object_per_batch: bool,
}

fn cfg() -> BagConfig {
    BagConfig::default()
}

/// What one scenario works on: a handle on the store under test (and one
/// that runs a hook before its next append), a manual clock at [`t0`],
/// test leases and a fresh log.
struct Fixture {
    store: Arc<dyn BagStore>,
    hook: Arc<HookStore>,
    clock: ManualClock,
    leases: TestLeases,
    log: String,
}

impl Fixture {
    async fn new(env: &dyn BagEnv) -> Fixture {
        let store = env.store().await;
        Fixture {
            hook: Arc::new(HookStore::new(store.clone())),
            store,
            clock: ManualClock::new(t0()),
            leases: TestLeases::default(),
            log: unique("log"),
        }
    }

    fn writer(&self, id: &str, min: Micros, deadline: Micros) -> Writer {
        Writer::new(
            self.hook.store(),
            &self.log,
            id,
            Arc::new(self.leases.lease(&format!("lease-{id}"), min, deadline)),
            Arc::new(self.clock.clone()),
            self.leases.time(Arc::new(self.clock.clone())),
            cfg(),
        )
        .unwrap()
    }

    /// A writer with a lease valid around t0.
    fn writer_ok(&self, id: &str) -> Writer {
        self.writer(
            id,
            t0().saturating_sub(Duration::from_secs(60)),
            t0().saturating_add(Duration::from_secs(3600)),
        )
    }

    async fn read(&self, keys: Option<KeyRing>) -> ReadReport {
        bag::read(
            self.store.as_ref(),
            &self.log,
            &ReadOptions::default().with_keys(keys),
            &cfg(),
            &AssumedExact(self.clock.clone()),
        )
        .await
        .unwrap()
    }

    async fn read_checked(&self) -> ReadReport {
        self.read(Some(self.leases.keys())).await
    }
}

fn msgs(prefix: &str, n: usize) -> Vec<Bytes> {
    (0..n).map(|i| Bytes::from(format!("{prefix}-{i}"))).collect()
}

/// Two writers write batches over three rounds. Before any bag is closed
/// a plain read skips the open bags and an open read sees every message;
/// once closed, a checked read returns exactly what was acknowledged,
/// ordered by (timestamp, writer, sequence) with sequences counting up per
/// writer; a range read returns its part; a writer's watermark is the
/// largest timestamp it wrote.
pub async fn writes_are_read_back_in_order(env: &dyn BagEnv, _caps: Capabilities) {
    let e = Fixture::new(env).await;
    let w1 = e.writer_ok("w1");
    let w2 = e.writer_ok("w2");
    let mut want = Vec::new();
    for round in 0..3 {
        for w in [&w1, &w2] {
            let batch = msgs(&format!("{}-{round}", w.writer_id()), 4);
            let stamps = w.write_batch(batch.clone()).await.unwrap();
            want.extend(
                stamps
                    .into_iter()
                    .zip(batch)
                    .map(|(t, p)| (t, w.writer_id().to_owned(), p)),
            );
        }
        e.clock.advance(Duration::from_millis(400));
    }
    // Nothing is closed yet: a plain read skips open bags, an open read sees all.
    let r = e.read_checked().await;
    assert!(r.messages.is_empty());
    assert!(!r.skipped_open.is_empty());
    let open = bag::read(
        e.store.as_ref(),
        &e.log,
        &ReadOptions::default().with_include_open(true),
        &cfg(),
        &AssumedExact(e.clock.clone()),
    )
    .await
    .unwrap();
    assert_eq!(open.messages.len(), want.len());
    assert!(open.messages.iter().all(|m| m.from_open_bag));

    e.clock.advance(Duration::from_secs(5));
    let r = e.read_checked().await;
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    want.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let got: Vec<_> = r
        .messages
        .iter()
        .map(|m| (m.timestamp, m.writer_id.clone(), m.payload.clone()))
        .collect();
    assert_eq!(got, want);
    // Ordered by (timestamp, writer, sequence), and sequences count up per writer.
    for pair in r.messages.windows(2) {
        assert!((pair[0].timestamp, &pair[0].writer_id) < (pair[1].timestamp, &pair[1].writer_id));
    }
    assert_eq!(
        r.messages
            .iter()
            .filter(|m| m.writer_id == "w1")
            .map(|m| m.sequence)
            .max(),
        Some(11)
    );
    // Range reads.
    let mid = r.messages[5].timestamp;
    let part = bag::read(
        e.store.as_ref(),
        &e.log,
        &ReadOptions::default().with_range(mid, Micros::MAX),
        &cfg(),
        &AssumedExact(e.clock.clone()),
    )
    .await
    .unwrap();
    assert_eq!(
        part.messages.len(),
        r.messages.iter().filter(|m| m.timestamp >= mid).count()
    );
    assert!(part.messages.len() < r.messages.len());
    // The release watermark is the largest timestamp written.
    assert_eq!(
        w1.watermark(Micros::ZERO),
        r.messages
            .iter()
            .filter(|m| m.writer_id == "w1")
            .map(|m| m.timestamp)
            .max()
            .unwrap()
    );
    assert_eq!(w1.watermark(Micros::MAX), Micros::MAX);
}

/// An append in flight while its bag's close time passes and a closer
/// closes the bag lands afterwards: the write is refused (not retryable),
/// every reader sees only the on-time message, and the refused attempt
/// still counts toward the writer's watermark.
pub async fn late_write_after_close_is_rejected_and_invisible(env: &dyn BagEnv, _caps: Capabilities) {
    let e = Fixture::new(env).await;
    let w = e.writer_ok("w1");
    let b = Bucket::of(t0());
    w.write(Bytes::from("on-time")).await.unwrap();
    // The next append is in flight while the bag's close time passes and a
    // closer closes it; it lands afterwards.
    let (store, clock, log) = (e.store.clone(), e.clock.clone(), e.log.clone());
    e.hook.before_next_append(Box::new(move || {
        Box::pin(async move {
            clock.set(b.close_time(cfg().grace).saturating_add(Duration::from_millis(1)));
            store.close(&log, b).await.unwrap();
        })
    }));
    let err = w.write(Bytes::from("late")).await.unwrap_err();
    assert!(
        matches!(err, Error::LateRejected { .. } | Error::BagClosed { .. }),
        "unexpected {err:?}"
    );
    assert!(!err.is_retryable());
    // Every reader sees exactly the on-time message.
    for _ in 0..2 {
        let r = e.read_checked().await;
        assert_eq!(payloads(&r), vec!["on-time"]);
        assert!(r.rejected.is_empty());
    }
    // The rejected attempt still counts for the watermark: it may exist on disk.
    assert!(w.max_written().unwrap() > t0());
}

/// An append that lands past the bag's safe point but before anyone
/// started closing it is acknowledged and read.
pub async fn late_write_before_any_close_is_committed(env: &dyn BagEnv, _caps: Capabilities) {
    let e = Fixture::new(env).await;
    let w = e.writer_ok("w1");
    let b = Bucket::of(t0());
    let clock = e.clock.clone();
    // Lands past the safe point but before anyone started closing.
    e.hook.before_next_append(Box::new(move || {
        Box::pin(async move {
            clock.set(cfg().safe_point(b).saturating_add(Duration::from_millis(1)));
        })
    }));
    w.write(Bytes::from("slow")).await.unwrap();
    e.clock.advance(Duration::from_secs(5));
    assert_eq!(payloads(&e.read_checked().await), vec!["slow"]);
}

/// The metronome closes the bags that exist at their close time, and the
/// seconds nobody wrote into with their minute's one seal: a late writer
/// is acknowledged only where no seal has closed its second, and every
/// reader agrees either way.
pub async fn metronome_closes_bags_on_time_and_seals_empty_minutes_with_one_object(
    env: &dyn BagEnv,
    _caps: Capabilities,
) {
    let e = Fixture::new(env).await;
    let mut m = Metronome::new(
        e.store.clone(),
        vec![e.log.clone()],
        cfg().with_lookback(Duration::from_secs(2)),
        Arc::new(AssumedExact(Arc::new(e.clock.clone()))),
    )
    .unwrap();
    let b = Bucket::of(t0());
    let span = Span::of(b);
    // No writer has started the log: it is not created, and said so.
    let r = m.tick().await.unwrap();
    assert_eq!((r.closed, r.missing_logs.clone()), (0, vec![e.log.clone()]));
    assert_eq!(e.store.log_start(&e.log).await.unwrap(), None);
    let w = e.writer_ok("w1");
    w.write(Bytes::from("on-time")).await.unwrap();
    // At b's close time the bag that exists is closed, and no other.
    e.clock.set(b.close_time(cfg().grace));
    let r = m.tick().await.unwrap();
    assert_eq!((r.closed, r.through, r.sealed), (1, Some(b), 0), "{r:?}");
    assert!(r.missing_logs.is_empty());
    assert!(matches!(
        e.store.state(&e.log, b).await.unwrap(),
        BagState::Closed(_)
    ));
    assert_eq!(
        seal::bags_of(e.store.as_ref(), &e.log, span).await.unwrap(),
        vec![b]
    );
    // A writer stalled past the close time of an empty second of the
    // minute, before the minute is sealed: it closes the bag itself and is
    // acknowledged.
    let slow = b.next();
    e.clock.set(slow.start());
    let w2 = e.writer_ok("w2");
    let clock = e.clock.clone();
    e.hook.before_next_append(Box::new(move || {
        Box::pin(async move {
            clock.set(
                slow.close_time(cfg().grace)
                    .saturating_add(Duration::from_secs(1)),
            )
        })
    }));
    w2.write(Bytes::from("stalled-unsealed")).await.unwrap();
    // At the minute's close time one seal closes its other 58 seconds.
    e.clock.set(span.close_time(cfg().grace));
    let r = m.tick().await.unwrap();
    assert_eq!((r.sealed, r.through), (58, Some(span.last())), "{r:?}");
    let sealed = seal::seal_of(e.store.as_ref(), &e.log, span)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sealed.bags().collect::<Vec<_>>(), vec![b, slow]);
    assert_eq!(
        seal::bags_of(e.store.as_ref(), &e.log, span).await.unwrap(),
        vec![b, slow],
        "no bag is made for an empty second"
    );
    assert_eq!(
        e.store
            .get_named(&e.log, &format!("_seal/{}.intent", span.first().secs()), 0)
            .await
            .unwrap(),
        None,
        "the intent is gone once the seal exists: one object per idle minute"
    );
    // A writer stalled into an empty second while the minute is sealed is
    // refused, and its record is in no reader's view.
    let late = Bucket::from_secs(span.last().secs() - 1);
    e.clock.set(late.start());
    let w3 = e.writer_ok("w3");
    let (clock, store, log) = (e.clock.clone(), e.store.clone(), e.log.clone());
    e.hook.before_next_append(Box::new(move || {
        Box::pin(async move {
            clock.set(
                span.close_time(cfg().grace)
                    .saturating_add(Duration::from_secs(1)),
            );
            seal::seal(store.as_ref(), &log, span).await.unwrap();
        })
    }));
    let err = w3.write(Bytes::from("late")).await.unwrap_err();
    assert!(matches!(err, Error::LateRejected { .. }), "{err:?}");
    // A raw append into a sealed second (a writer that skipped the
    // protocol) is not read either.
    let rogue = Bucket::from_secs(span.last().secs() - 2);
    let raw = raw_batch(&e, "rogue", rogue.start().next(), None);
    let _ = e.store.append(&e.log, rogue, "rogue.0", 0, raw).await;
    for _ in 0..2 {
        let r = e.read_checked().await;
        assert_eq!(payloads(&r), vec!["on-time", "stalled-unsealed"]);
        assert!(r.rejected.is_empty() && r.problems.is_empty(), "{r:?}");
    }
    // The next minute: the metronome goes on with it (the readers above
    // closed its first past-due seconds one by one, as bags).
    e.clock.set(span.next().close_time(cfg().grace));
    let r = m.tick().await.unwrap();
    let made = seal::bags_of(e.store.as_ref(), &e.log, span.next())
        .await
        .unwrap();
    assert!(!made.is_empty());
    assert_eq!(r.sealed, 60 - made.len() as u64);
    assert!(r.max_lag.is_some());
}

/// A sealer dies after k storage operations while a stalled writer's
/// append into an empty second of the minute is in flight; another sealer
/// finishes. Every sealer agrees, the intent is gone, and readers read
/// exactly the acknowledged writes.
pub async fn sealer_killed_between_any_two_steps_is_finished_by_another(
    env: &dyn BagEnv,
    _caps: Capabilities,
) {
    let mut finished = false;
    for k in 0..40 {
        let e = Fixture::new(env).await;
        let b = Bucket::of(t0());
        let span = Span::of(b);
        let mut acked = BTreeSet::new();
        e.writer_ok("w1").write(Bytes::from("w1-a")).await.unwrap();
        acked.insert("w1-a".to_owned());
        e.clock.set(b.next().start());
        let w2 = e.writer_ok("w2");
        let faulty = env.store_with(KillSwitch::after(k)).await;
        let (clock, log) = (e.clock.clone(), e.log.clone());
        let died = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let died2 = died.clone();
        e.hook.before_next_append(Box::new(move || {
            Box::pin(async move {
                clock.set(span.close_time(cfg().grace));
                if seal::seal(faulty.as_ref(), &log, span).await.is_err() {
                    died2.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            })
        }));
        if w2.write(Bytes::from("w2-late")).await.is_ok() {
            acked.insert("w2-late".to_owned());
        }
        let s1 = seal::seal(e.store.as_ref(), &e.log, span).await.unwrap();
        let s2 = seal::seal(env.store().await.as_ref(), &e.log, span)
            .await
            .unwrap();
        assert_eq!(s1, s2);
        let intent = format!("_seal/{}.intent", span.first().secs());
        assert_eq!(e.store.get_named(&e.log, &intent, 0).await.unwrap(), None);
        let r = e.read_checked().await;
        let got: BTreeSet<String> = payloads(&r).into_iter().collect();
        assert_eq!(got, acked, "sealer killed after {k} operations");
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        if !died.load(std::sync::atomic::Ordering::SeqCst) {
            finished = true;
            break;
        }
    }
    assert!(finished, "the faulty sealer never got through");
}

/// Six sealers seal one minute at once: all return the same seal, listing
/// the three bags written, and readers read every acknowledged message.
pub async fn concurrent_sealers_agree(env: &dyn BagEnv, _caps: Capabilities) {
    let e = Fixture::new(env).await;
    let mut acked = BTreeSet::new();
    for (i, id) in ["w1", "w2", "w3"].into_iter().enumerate() {
        e.clock
            .set(t0().saturating_add(Duration::from_secs(3 * i as u64)));
        let w = e.writer_ok(id);
        for p in msgs(id, 2) {
            w.write(p.clone()).await.unwrap();
            acked.insert(String::from_utf8(p.to_vec()).unwrap());
        }
    }
    let span = Span::of(Bucket::of(t0()));
    e.clock.set(span.close_time(cfg().grace));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let store = env.store().await;
        let log = e.log.clone();
        tasks.push(tokio::spawn(async move {
            seal::seal(store.as_ref(), &log, span).await.unwrap()
        }));
    }
    let mut seals = Vec::new();
    for t in tasks {
        seals.push(t.await.unwrap());
    }
    assert!(seals.windows(2).all(|p| p[0] == p[1]), "{seals:?}");
    assert_eq!(seals[0].bags().count(), 3);
    let got: BTreeSet<String> = payloads(&e.read_checked().await).into_iter().collect();
    assert_eq!(got, acked);
}

/// A batch that skips the writer's checks, as a buggy writer would.
fn raw_batch(e: &Fixture, writer: &str, ts: Micros, witness: Option<pb::Witness>) -> Bytes {
    let witness = witness.unwrap_or_else(|| {
        e.leases.witness(
            "lease-rogue",
            t0().saturating_sub(Duration::from_secs(60)),
            t0().saturating_add(Duration::from_secs(3600)),
        )
    });
    let batch = pb::Batch {
        writer_id: writer.to_owned(),
        first_sequence: 0,
        signed_time: None,
        witnesses: vec![witness],
        entries: vec![pb::Entry {
            timestamp_us: ts.as_micros(),
            payload: format!("{writer}-raw").into_bytes(),
        }],
        ..Default::default()
    };
    frame::encode(&batch.encode_to_vec())
}

/// A writer refuses to write near its lease's deadline. Batches appended
/// around the checks (after the deadline, before the minimum timestamp,
/// under a witness of unknown keys) are rejected by a checked reader,
/// each with its reason; a reader without keys cannot tell the forged one
/// apart and marks what it reads as not verified.
pub async fn expired_lease_messages_are_rejected_by_the_reader(env: &dyn BagEnv, _caps: Capabilities) {
    let e = Fixture::new(env).await;
    let min = t0().saturating_sub(Duration::from_secs(1));
    let deadline = t0().saturating_add(Duration::from_millis(1500));
    let w = e.writer("w1", min, deadline);
    w.write(Bytes::from("in-lease")).await.unwrap();
    // The writer itself refuses near the deadline.
    e.clock.set(deadline.saturating_sub(Duration::from_millis(100)));
    let err = w.write(Bytes::from("too-late")).await.unwrap_err();
    assert!(matches!(err, Error::LeaseExpiring { .. }), "{err:?}");
    // A writer that keeps writing after its lease expired (bypassing the
    // checks) gets its messages into an open bag, and every reader rejects them.
    let lease = e.leases.witness("lease-w1", min, deadline);
    let after = deadline.saturating_add(Duration::from_millis(1));
    let raw = raw_batch(&e, "expired", after, Some(lease.clone()));
    e.store
        .append(&e.log, Bucket::of(after), "expired.0", 0, raw)
        .await
        .unwrap();
    let raw = raw_batch(&e, "early", min, Some(lease));
    e.store
        .append(&e.log, Bucket::of(min), "early.0", 0, raw)
        .await
        .unwrap();
    let forged = TestLeases::default().witness("lease-forged", min, deadline);
    let raw = raw_batch(&e, "forged", t0().next(), Some(forged));
    e.store
        .append(&e.log, Bucket::of(t0()), "forged.0", 0, raw)
        .await
        .unwrap();

    e.clock.advance(Duration::from_secs(10));
    let r = e.read_checked().await;
    assert_eq!(payloads(&r), vec!["in-lease"]);
    let mut reasons: Vec<(String, String)> = r
        .rejected
        .iter()
        .map(|x| (x.message.writer_id.clone(), x.reason.clone()))
        .collect();
    reasons.sort();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert_eq!(reasons[0].0, "early");
    assert!(reasons[0].1.contains("min_timestamp"), "{reasons:?}");
    assert_eq!(reasons[1].0, "expired");
    assert!(reasons[1].1.contains("deadline"), "{reasons:?}");
    assert_eq!(reasons[2].0, "forged");
    assert!(reasons[2].1.contains("witness"), "{reasons:?}");
    // Without keys the forged one cannot be told apart, and says so.
    let r = e.read(None).await;
    assert_eq!(r.rejected.len(), 2);
    assert!(
        r.messages
            .iter()
            .all(|m| m.notes.iter().any(|n| n.contains("NOT verified")))
    );
}

/// A closer dies after k storage operations while a writer's append is in
/// flight, for every k until one gets through; another closer finishes.
/// Every closer returns the same listing and readers read exactly the
/// acknowledged writes.
pub async fn closer_killed_between_any_two_steps_is_finished_by_another(
    env: &dyn BagEnv,
    _caps: Capabilities,
) {
    let mut finished = false;
    for k in 0..40 {
        let e = Fixture::new(env).await;
        let b = Bucket::of(t0());
        let w1 = e.writer_ok("w1");
        let w2 = e.writer_ok("w2");
        let mut acked = BTreeSet::new();
        for w in [&w1, &w2] {
            w.write(Bytes::from(format!("{}-a", w.writer_id())))
                .await
                .unwrap();
            acked.insert(format!("{}-a", w.writer_id()));
        }
        // A closer dies after k storage operations, while w1's next append
        // is in flight; the append lands after the dead closer's last step.
        let faulty = env.store_with(KillSwitch::after(k)).await;
        let (clock, log) = (e.clock.clone(), e.log.clone());
        let died = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let died2 = died.clone();
        e.hook.before_next_append(Box::new(move || {
            Box::pin(async move {
                clock.set(b.close_time(cfg().grace));
                if faulty.close(&log, b).await.is_err() {
                    died2.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            })
        }));
        if w1.write(Bytes::from("w1-late")).await.is_ok() {
            acked.insert("w1-late".to_owned());
        }
        // Another closer finishes; all closers agree; readers see exactly
        // the acknowledged writes.
        let l1 = e.store.close(&e.log, b).await.unwrap();
        let l2 = env.store().await.close(&e.log, b).await.unwrap();
        assert_eq!(l1, l2);
        let r = e.read_checked().await;
        let got: BTreeSet<String> = payloads(&r).into_iter().collect();
        assert_eq!(got, acked, "closer killed after {k} operations");
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        if !died.load(std::sync::atomic::Ordering::SeqCst) {
            finished = true;
            break;
        }
    }
    assert!(finished, "the faulty closer never got through");
}

/// Six closers close one bag at once: all return the same listing, and
/// readers read every acknowledged message.
pub async fn concurrent_closers_agree(env: &dyn BagEnv, _caps: Capabilities) {
    let e = Fixture::new(env).await;
    let mut acked = BTreeSet::new();
    for id in ["w1", "w2", "w3"] {
        let w = e.writer_ok(id);
        for p in msgs(id, 3) {
            w.write(p.clone()).await.unwrap();
            acked.insert(String::from_utf8(p.to_vec()).unwrap());
        }
    }
    let b = Bucket::of(t0());
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let store = env.store().await;
        let log = e.log.clone();
        tasks.push(tokio::spawn(async move { store.close(&log, b).await.unwrap() }));
    }
    let mut listings = Vec::new();
    for t in tasks {
        listings.push(t.await.unwrap());
    }
    assert!(listings.windows(2).all(|p| p[0] == p[1]), "{listings:?}");
    e.clock.advance(Duration::from_secs(5));
    let got: BTreeSet<String> = payloads(&e.read_checked().await).into_iter().collect();
    assert_eq!(got, acked);
}

/// One byte flipped inside the second of three records, below the store:
/// the read reports one problem and never returns a damaged message. With
/// [`Capabilities::one_object_per_batch`] the changed object is refused
/// and the other two batches are read; in one file nothing after the
/// damaged record is read, and the problem names the checksum.
pub async fn a_corrupt_record_is_reported_and_never_misread(env: &dyn BagEnv, caps: Capabilities) {
    let e = Fixture::new(env).await;
    let w = e.writer_ok("w1");
    for i in 0..3 {
        w.write(Bytes::from(format!("m{i}"))).await.unwrap();
    }
    let b = Bucket::of(t0());
    let listing = e.store.close(&e.log, b).await.unwrap();
    let objects = if caps.one_object_per_batch { 3 } else { 1 };
    assert_eq!(listing.items.len(), objects);
    // Flip one byte inside the second record's body, below the store.
    let mut seen = 0;
    let mut flipped = false;
    for item in &listing.items {
        let key = format!("{}/{}/{}", e.log, b.path(), item.name);
        let mut bytes = env.read_raw(&key).await;
        let frames = frame::decode(&Bytes::from(bytes.clone()));
        for f in &frames {
            let frame::Frame::Record { offset, .. } = f else {
                panic!("{frames:?}")
            };
            if seen == 1 {
                bytes[*offset as usize + frame::HEADER_LEN + 3] ^= 0x20;
                env.write_raw(&key, bytes.clone()).await;
                flipped = true;
            }
            seen += 1;
        }
    }
    assert!(flipped, "no second record in {} objects", listing.items.len());
    e.clock.advance(Duration::from_secs(5));
    let r = e.read_checked().await;
    assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
    if caps.one_object_per_batch {
        // One object per batch, each read pinned to the ETag its lock
        // lists: the rewritten object is refused as changed, the others
        // are read.
        assert_eq!(payloads(&r), vec!["m0", "m2"]);
        assert!(r.problems[0].what.contains("changed"), "{:?}", r.problems);
    } else {
        // One file: nothing after a record that fails its checksum can be
        // framed safely, and the problem says so.
        assert_eq!(payloads(&r), vec!["m0"]);
        let what = &r.problems[0].what;
        assert!(what.contains("checksum") && what.contains("unreadable"), "{what}");
    }
}

/// `close_through` a deadline waits for the last bag before it to be due,
/// then closes every bag up to it (within the lookback), and a read that
/// closes nothing itself finds the message written before.
pub async fn close_through_closes_everything_up_to_a_deadline(env: &dyn BagEnv, _caps: Capabilities) {
    let e = Fixture::new(env).await;
    let deadline = t0().saturating_add(Duration::from_millis(1200));
    let w = e.writer(
        "w1",
        t0().saturating_sub(Duration::from_secs(1)),
        deadline.saturating_add(Duration::from_secs(1)),
    );
    w.write(Bytes::from("before")).await.unwrap();
    let last = Bucket::of(Micros::from_micros(deadline.as_micros() - 1));
    // close_through waits for the last bag's close time; move the clock there.
    let clock = e.clock.clone();
    let mover = tokio::spawn(async move { clock.set(last.close_time(cfg().grace)) });
    let report = bag::close_through(
        e.store.as_ref(),
        &e.log,
        deadline,
        &cfg().with_lookback(Duration::from_secs(3)),
        &AssumedExact(e.clock.clone()),
    )
    .await
    .unwrap();
    mover.await.unwrap();
    assert_eq!(report.through, Some(last));
    assert!(report.closed >= 4);
    for s in last.secs() - 3..=last.secs() {
        assert!(matches!(
            e.store.state(&e.log, Bucket::from_secs(s)).await.unwrap(),
            BagState::Closed(_)
        ));
    }
    let r = bag::read(
        e.store.as_ref(),
        &e.log,
        &ReadOptions::default()
            .with_close_past_due(false)
            .with_keys(Some(e.leases.keys())),
        &cfg(),
        &AssumedExact(e.clock.clone()),
    )
    .await
    .unwrap();
    assert_eq!(payloads(&r), vec!["before"]);
    let _ = e.clock.now();
}

/// A writer stalls after choosing its timestamp, in a bag nobody has made
/// yet, until the bag is long past due and a reader has read the range;
/// then it goes on. The reader sealed the missing bag, so the writer is
/// refused and every later reader reads what the first one read.
pub async fn readers_of_a_past_range_agree_even_on_bags_nobody_made(env: &dyn BagEnv, _caps: Capabilities) {
    let e = Fixture::new(env).await;
    let w = e.writer_ok("w1");
    w.write(Bytes::from("before")).await.unwrap();
    let b1 = Bucket::of(t0()).next();
    e.clock.set(b1.start().saturating_add(Duration::from_millis(100)));
    let first_read = Arc::new(std::sync::Mutex::new(None));
    let (store, clock, log, keys, seen) = (
        e.store.clone(),
        e.clock.clone(),
        e.log.clone(),
        e.leases.keys(),
        first_read.clone(),
    );
    e.hook.before_next_append(Box::new(move || {
        Box::pin(async move {
            clock.set(b1.close_time(cfg().grace).saturating_add(Duration::from_secs(5)));
            let opts = ReadOptions::default().with_keys(Some(keys));
            let r = bag::read(store.as_ref(), &log, &opts, &cfg(), &AssumedExact(clock))
                .await
                .unwrap();
            assert!(r.sealed >= 1, "the missing past-due bag is sealed");
            *seen.lock().unwrap() = Some(payloads(&r));
        })
    }));
    let err = w.write(Bytes::from("stalled")).await.unwrap_err();
    assert!(
        matches!(err, Error::LateRejected { .. } | Error::BagClosed { .. }),
        "{err:?}"
    );
    let first = first_read.lock().unwrap().take().expect("the hook read");
    assert_eq!(first, vec!["before"]);
    assert_eq!(
        payloads(&e.read_checked().await),
        first,
        "two readers of one past range disagree"
    );
}

/// Two writers given one writer id (two processes, or a restart within the
/// same second): both start their sequence numbers at 0 in the same bag.
/// Neither may overwrite or interleave with the other's acknowledged
/// records.
pub async fn two_writers_given_one_id_lose_nothing(env: &dyn BagEnv, _caps: Capabilities) {
    let e = Fixture::new(env).await;
    let a = e.writer_ok("same");
    let b = e.writer_ok("same");
    a.write_batch(msgs("a", 3)).await.unwrap();
    b.write_batch(msgs("b", 3)).await.unwrap();
    a.write_batch(msgs("a2", 2)).await.unwrap();
    e.clock.advance(Duration::from_secs(5));
    let r = e.read_checked().await;
    assert!(r.problems.is_empty() && r.rejected.is_empty(), "{r:?}");
    let got: BTreeSet<String> = payloads(&r).into_iter().collect();
    let want: BTreeSet<String> = ["a-0", "a-1", "a-2", "b-0", "b-1", "b-2", "a2-0", "a2-1"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(got, want);
}

/// Random writers write random batches over two minutes, with a rogue
/// batch and a corrupt record among them; the minutes are sealed and
/// summarized. Reading with and without the summary gives the same
/// messages, rejections and problems, byte for byte; any number of
/// summarizers publish the same bytes; the summary checks against its
/// bags; a summary with a record left out is caught.
pub async fn summaries_read_the_same_messages_as_bags_byte_for_byte(env: &dyn BagEnv, _caps: Capabilities) {
    use rand::{Rng as _, SeedableRng as _};
    let seed = rand::random::<u64>();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let e = Fixture::new(env).await;
    let first = Span::of(Bucket::of(t0()));
    let writers: Vec<Writer> = (0..rng.gen_range(1..4))
        .map(|i| e.writer_ok(&format!("w{i}")))
        .collect();
    let mut at = t0();
    let end = first.next().last().start();
    let mut n = 0;
    while at < end {
        e.clock.set(at);
        let w = &writers[rng.gen_range(0..writers.len())];
        let k = rng.gen_range(1..5);
        w.write_batch(msgs(&format!("m{n}"), k)).await.unwrap();
        n += 1;
        at = at.saturating_add(Duration::from_millis(rng.gen_range(200..9000)));
    }
    // A batch past its lease's deadline, and a corrupt record.
    let rogue = Bucket::of(t0()).next();
    let expired = e
        .leases
        .witness("lease-old", t0().saturating_sub(Duration::from_secs(60)), t0());
    let raw = raw_batch(&e, "rogue", rogue.start().next(), Some(expired));
    let _ = e.store.append(&e.log, rogue, "rogue.0", 0, raw).await.unwrap();
    let mut bad = frame::encode(b"not a batch").to_vec();
    bad[9] ^= 0xff;
    let _ = e
        .store
        .append(&e.log, rogue, "bad.0", 0, Bytes::from(bad))
        .await
        .unwrap();
    e.clock.set(first.next().close_time(cfg().grace));
    let stretch = Stretch::new(first, 2);
    // Not sealed yet: refused, nothing published.
    let err = summary::summarize(e.store.as_ref(), &e.log, stretch)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotSummarizable { .. }), "{err}");
    let opts = |use_summaries| {
        ReadOptions::default()
            .with_keys(Some(e.leases.keys()))
            .with_summaries(use_summaries)
    };
    let clock = AssumedExact(e.clock.clone());
    let from_bags = bag::read(e.store.as_ref(), &e.log, &opts(false), &cfg(), &clock)
        .await
        .unwrap();
    assert!(from_bags.messages.len() >= n, "seed {seed}");
    assert!(!from_bags.rejected.is_empty(), "seed {seed}: {from_bags:?}");
    assert!(!from_bags.problems.is_empty(), "seed {seed}: {from_bags:?}");
    // Summarizers at once: one creates, all publish the same bytes.
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (store, log) = (env.store().await, e.log.clone());
        tasks.push(tokio::spawn(async move {
            summary::summarize(store.as_ref(), &log, stretch).await.unwrap()
        }));
    }
    let mut done = Vec::new();
    for t in tasks {
        done.push(t.await.unwrap());
    }
    assert_eq!(done.iter().filter(|d| d.created).count(), 1, "{done:?}");
    assert!(
        done.windows(2)
            .all(|p| (p[0].bytes, p[0].bags) == (p[1].bytes, p[1].bags))
    );
    let from_summary = bag::read(e.store.as_ref(), &e.log, &opts(true), &cfg(), &clock)
        .await
        .unwrap();
    assert_eq!(from_summary.summaries_read, 1);
    assert_eq!(from_summary.messages, from_bags.messages, "seed {seed}");
    assert_eq!(from_summary.rejected, from_bags.rejected, "seed {seed}");
    assert_eq!(from_summary.problems, from_bags.problems, "seed {seed}");
    let check = summary::check(e.store.as_ref(), &e.log, stretch).await.unwrap();
    assert!(check.mismatched.is_empty(), "{check:?}");
    assert_eq!(check.bags_matched, done[0].bags);
    // A forged summary of the next minute, one batch left out, is caught.
    let next = first.next().next();
    e.clock.set(next.first().start());
    e.writer_ok("w9").write_batch(msgs("later", 2)).await.unwrap();
    e.writer_ok("w8").write_batch(msgs("more", 1)).await.unwrap();
    e.clock.set(next.close_time(cfg().grace));
    seal::seal(e.store.as_ref(), &e.log, next).await.unwrap();
    let one = Stretch::new(next, 1);
    let mut forged = summary::build(e.store.as_ref(), &e.log, one).await.unwrap();
    forged.bags[0].items.pop();
    summary::publish(e.store.as_ref(), &e.log, one, &forged)
        .await
        .unwrap();
    let check = summary::check(e.store.as_ref(), &e.log, one).await.unwrap();
    assert_eq!(check.mismatched.len(), 1, "{check:?}");
    // And an honest summarizer refuses to take it for its own.
    let err = summary::summarize(e.store.as_ref(), &e.log, one)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::SummaryMismatch { .. }), "{err}");
}

/// Random writers over two minutes, and a corrupt record; summarized and
/// attested by three summarizers at once with one key: exactly one
/// publishes the attestation, all succeed. A reader that trusts the key
/// reads the same messages, rejections and problems as from the bags, each
/// message vouched for by that key; an attestation replaced by one over
/// other bytes is reported and the summary checked in full.
pub async fn attested_summaries_read_the_same_messages_as_bags(env: &dyn BagEnv, _caps: Capabilities) {
    use bagel_bags::Vouched;
    use bagel_bags::summary::attest::{self, Attested, Attester};
    use rand::{Rng as _, SeedableRng as _};
    let seed = rand::random::<u64>();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let e = Fixture::new(env).await;
    let first = Span::of(Bucket::of(t0()));
    let writers: Vec<Writer> = (0..rng.gen_range(1..4))
        .map(|i| e.writer_ok(&format!("w{i}")))
        .collect();
    let mut at = t0();
    let end = first.next().last().start();
    while at < end {
        e.clock.set(at);
        let w = &writers[rng.gen_range(0..writers.len())];
        w.write_batch(msgs("m", rng.gen_range(1..5))).await.unwrap();
        at = at.saturating_add(Duration::from_millis(rng.gen_range(200..9000)));
    }
    let mut bad = frame::encode(b"not a batch").to_vec();
    bad[9] ^= 0xff;
    let _ = e
        .store
        .append(&e.log, Bucket::of(t0()).next(), "bad.0", 0, Bytes::from(bad))
        .await
        .unwrap();
    e.clock.set(first.next().close_time(cfg().grace));
    for span in [first, first.next()] {
        seal::seal(e.store.as_ref(), &e.log, span).await.unwrap();
    }
    let stretch = Stretch::new(first, 2);
    let attester = Attester {
        signer: bagel_proto::Signer::generate(),
        keys: e.leases.keys(),
        roughtime_keys: Vec::new(),
    };
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (store, log, attester) = (env.store().await, e.log.clone(), attester.clone());
        tasks.push(tokio::spawn(async move {
            summary::summarize_attested(store.as_ref(), &log, stretch, Some(&attester))
                .await
                .unwrap()
        }));
    }
    let mut created = 0;
    for t in tasks {
        match t.await.unwrap().attestation {
            Some(Attested::Published { created: c, .. }) => created += usize::from(c),
            other => panic!("seed {seed}: {other:?}"),
        }
    }
    assert_eq!(created, 1, "seed {seed}");
    let trusted: KeyRing = [attester.signer.verifying_key()].into_iter().collect();
    let opts = |use_summaries| {
        ReadOptions::default()
            .with_keys(Some(e.leases.keys()))
            .with_summaries(use_summaries)
            .with_trusted_summarizers(trusted.clone())
    };
    let clock = AssumedExact(e.clock.clone());
    let from_bags = bag::read(e.store.as_ref(), &e.log, &opts(false), &cfg(), &clock)
        .await
        .unwrap();
    assert!(!from_bags.problems.is_empty(), "seed {seed}");
    let attested = bag::read(e.store.as_ref(), &e.log, &opts(true), &cfg(), &clock)
        .await
        .unwrap();
    assert_eq!((attested.summaries_read, attested.summaries_attested), (1, 1));
    let key_id: Arc<str> = Arc::from(attester.signer.key_id());
    assert!(attested.messages.iter().all(|m| m.vouched
        == Vouched::Attested {
            key_id: key_id.clone()
        }));
    let plain = |r: &ReadReport| -> Vec<bag::reader::Message> {
        r.messages
            .iter()
            .map(|m| bag::reader::Message {
                vouched: Vouched::Checked,
                ..m.clone()
            })
            .collect()
    };
    assert_eq!(plain(&attested), from_bags.messages, "seed {seed}");
    assert_eq!(attested.rejected, from_bags.rejected, "seed {seed}");
    assert_eq!(attested.problems, from_bags.problems, "seed {seed}");
    let audit = bagel_bags::audit::audit_summaries(e.store.as_ref(), &e.log, stretch.from(), stretch.last())
        .await
        .unwrap();
    assert_eq!(
        (audit.attestations_checked, audit.violations.len()),
        (1, 0),
        "{audit:?}"
    );
    // Replaced by an attestation over other bytes: reported, not used.
    let name = attest::name(stretch, attester.signer.key_id());
    e.store.remove_named(&e.log, &name).await.unwrap();
    let other = attest::encode(&attester.signer, &e.log, stretch, 2, &[0; 32]);
    assert_eq!(e.store.put_first(&e.log, &name, other).await.unwrap(), None);
    let r = bag::read(e.store.as_ref(), &e.log, &opts(true), &cfg(), &clock)
        .await
        .unwrap();
    assert_eq!(r.summaries_attested, 0);
    assert_eq!(r.messages, from_bags.messages, "seed {seed}");
    assert_eq!(r.problems.len(), from_bags.problems.len() + 1);
    assert!(
        r.problems
            .iter()
            .any(|p| p.kind == bag::ProblemKind::Attestation && p.item == name)
    );
}

/// Three minutes written; the first summarized honestly, the second with a
/// forged summary, the third not at all. Retention removes the first
/// minute's bags only, resumes after being cut off part way, refuses to
/// keep bags for less than its minimum, and every acknowledged message is
/// still read (the first minute from its summary).
pub async fn retention_removes_only_bags_a_checked_summary_holds(env: &dyn BagEnv, _caps: Capabilities) {
    let e = Fixture::new(env).await;
    let first = Span::of(Bucket::of(t0()));
    let mut acked = BTreeSet::new();
    for (m, span) in [first, first.next(), first.next().next()].into_iter().enumerate() {
        for k in 0..3u64 {
            e.clock.set(
                span.first()
                    .start()
                    .saturating_add(Duration::from_secs(10 * k + 1)),
            );
            let id = format!("w{m}{k}");
            e.writer_ok(&id).write_batch(msgs(&id, 2)).await.unwrap();
            acked.extend([format!("{id}-0"), format!("{id}-1")]);
        }
    }
    let third = first.next().next();
    e.clock.set(third.close_time(cfg().grace));
    for span in [first, first.next(), third] {
        seal::seal(e.store.as_ref(), &e.log, span).await.unwrap();
    }
    summary::summarize(e.store.as_ref(), &e.log, Stretch::new(first, 1))
        .await
        .unwrap();
    let second = Stretch::new(first.next(), 1);
    let mut forged = summary::build(e.store.as_ref(), &e.log, second).await.unwrap();
    forged.bags.pop();
    summary::publish(e.store.as_ref(), &e.log, second, &forged)
        .await
        .unwrap();
    let now = third.last().end().saturating_add(Duration::from_secs(3600));
    let keep = Duration::from_secs(600);
    let err = bagel_bags::retain::retain(e.store.as_ref(), &e.log, now, Duration::from_secs(60), None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }), "{err}");
    // Cut off part way (the store fails after a few operations), then run
    // again: the second run finishes the first's work.
    let faulty = env.store_with(KillSwitch::after(12)).await;
    let _ = bagel_bags::retain::retain(faulty.as_ref(), &e.log, now, keep, None).await;
    let r = bagel_bags::retain::retain(e.store.as_ref(), &e.log, now, keep, None)
        .await
        .unwrap();
    assert_eq!((r.summaries_checked, r.bags_removed), (2, 3), "{r:?}");
    assert_eq!(r.kept.len(), 1, "the forged summary's bags are kept: {r:?}");
    assert!(
        seal::bags_of(e.store.as_ref(), &e.log, first)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        seal::bags_of(e.store.as_ref(), &e.log, first.next())
            .await
            .unwrap()
            .len(),
        3
    );
    assert_eq!(
        seal::bags_of(e.store.as_ref(), &e.log, third)
            .await
            .unwrap()
            .len(),
        3
    );
    // What is gone is read from the summary; what stays from its bags.
    e.clock.set(now);
    let r = bag::read(
        e.store.as_ref(),
        &e.log,
        &ReadOptions::default()
            .with_keys(Some(e.leases.keys()))
            .with_summaries(false),
        &cfg(),
        &AssumedExact(e.clock.clone()),
    )
    .await
    .unwrap();
    assert_eq!(
        r.messages.len(),
        12,
        "without summaries the first minute is not read"
    );
    // ... and the read says so, naming the summary that holds it: never a
    // silent gap.
    let missing: Vec<&str> = r
        .problems
        .iter()
        .filter(|p| p.kind == bag::ProblemKind::Missing)
        .map(|p| p.item.as_str())
        .collect();
    assert_eq!(missing, [Stretch::new(first, 1).name()], "{:?}", r.problems);
    let check = summary::check(e.store.as_ref(), &e.log, Stretch::new(first, 1))
        .await
        .unwrap();
    assert_eq!((check.bags_gone, check.mismatched.len()), (3, 0));
    // A late closer over the retained minute (a new holder settling an old
    // predecessor, a metronome with a long lookback) finds it sealed and
    // summarized: closing its bags again would recreate them empty, and
    // the audit would take the honest summary for a forged one.
    seal::seal(e.store.as_ref(), &e.log, first).await.unwrap();
    assert!(
        seal::bags_of(e.store.as_ref(), &e.log, first)
            .await
            .unwrap()
            .is_empty(),
        "a retained minute's bags came back"
    );
    let check = summary::check(e.store.as_ref(), &e.log, Stretch::new(first, 1))
        .await
        .unwrap();
    assert_eq!((check.bags_gone, check.mismatched.len()), (3, 0));
    // The forged summary of the second minute hides one bag from readers
    // that use it (a summary can leave out, as a forged lock can); read
    // from bags, and from the honest summary, everything is there.
    summary::remove(e.store.as_ref(), &e.log, second).await.unwrap();
    let got: BTreeSet<String> = payloads(&e.read_checked().await).into_iter().collect();
    assert_eq!(got, acked);
}
