//! The metronome on injected time over an in-memory object store whose
//! requests are counted: what an idle log costs, and that backing off
//! from idle logs loses no close, no seal and no acknowledged message.

use std::sync::Mutex;

use bagel_proto::clock::{AssumedExact, ManualClock};
use bytes::Bytes;
use object_store::memory::InMemory;

use super::*;
use crate::ReadOptions;
use crate::store::faults::{KillSwitch, RequestCounts, TestObjectStore};
use crate::store::object::ObjectBagStore;

/// A minute-aligned instant: second 0 of its minute.
const T0_SECS: u64 = 1_900_000_020;

fn at(secs: u64) -> Micros {
    Micros::from_micros(secs * 1_000_000)
}

/// One log on an in-memory object store: the metronome's view of it
/// counts every request (`counts.lists()` is what S3 bills as LIST);
/// writers and checks go through an uncounted view of the same objects.
struct Env {
    counts: Arc<RequestCounts>,
    counted: Arc<dyn BagStore>,
    plain: Arc<dyn BagStore>,
    clock: ManualClock,
    log: String,
}

impl Env {
    async fn new() -> Env {
        assert_eq!(T0_SECS % 60, 0);
        let mem = Arc::new(InMemory::new());
        let test_store = TestObjectStore::new(mem.clone(), KillSwitch::never());
        let counts = Arc::clone(&test_store.counts);
        let counted: Arc<dyn BagStore> =
            Arc::new(ObjectBagStore::new(Arc::new(test_store), "p", "counted".into()));
        let plain: Arc<dyn BagStore> = Arc::new(ObjectBagStore::new(mem, "p", "plain".into()));
        let log = "idle".to_owned();
        plain
            .mark_log_start(&log, Bucket::from_secs(T0_SECS))
            .await
            .unwrap();
        Env {
            counts,
            counted,
            plain,
            clock: ManualClock::new(at(T0_SECS)),
            log,
        }
    }

    fn writer(&self, leases: &crate::testing::TestLeases) -> crate::Writer {
        let lease = leases.lease("lease", at(T0_SECS - 60), at(T0_SECS + 3600));
        crate::Writer::new(
            Arc::clone(&self.plain),
            &self.log,
            "w",
            Arc::new(lease),
            Arc::new(self.clock.clone()),
            leases.time(Arc::new(self.clock.clone())),
            BagConfig::default(),
        )
        .unwrap()
    }

    /// Every bag of the log through `through` (as the store has them now),
    /// and whether each is closed.
    async fn bags_through(&self, through: Bucket) -> Vec<(Bucket, bool)> {
        let mut out = Vec::new();
        for span in Span::covering(Bucket::from_secs(T0_SECS), through) {
            for b in seal::bags_of(self.plain.as_ref(), &self.log, span).await.unwrap() {
                if b <= through {
                    let closed = matches!(
                        self.plain.state(&self.log, b).await.unwrap(),
                        crate::BagState::Closed(_)
                    );
                    out.push((b, closed));
                }
            }
        }
        out
    }

    fn metronome(&self, seen: &Arc<Seen>) -> Metronome {
        Metronome::new(
            Arc::clone(&self.counted),
            vec![self.log.clone()],
            BagConfig::default(),
            Arc::new(AssumedExact(self.clock.clone())),
        )
        .unwrap()
        .with_observer(Arc::clone(seen) as Arc<dyn CloseObserver>)
    }

    /// Ticks at `t`; returns the LIST requests the tick made.
    async fn tick_at(&self, m: &mut Metronome, t: Micros) -> u64 {
        self.clock.set(t);
        let before = self.counts.lists();
        m.tick().await.unwrap();
        self.counts.lists() - before
    }
}

/// What the metronome told its observer, with the (injected) time of each.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Closed(Bucket, Duration),
    Sealed(Bucket, Duration),
    CaughtUp(Bucket),
    Failed(Bucket, String),
    Paused(Duration),
}

#[derive(Debug)]
struct Seen {
    clock: ManualClock,
    events: Mutex<Vec<(Micros, Event)>>,
}

impl Seen {
    fn new(clock: &ManualClock) -> Arc<Seen> {
        Arc::new(Seen {
            clock: clock.clone(),
            events: Mutex::default(),
        })
    }

    fn push(&self, e: Event) {
        use bagel_proto::clock::Clock as _;
        self.events.lock().unwrap().push((self.clock.now(), e));
    }

    fn events(&self) -> Vec<(Micros, Event)> {
        self.events.lock().unwrap().clone()
    }

    fn seals(&self) -> Vec<(Micros, Bucket, Duration)> {
        self.events()
            .into_iter()
            .filter_map(|(t, e)| match e {
                Event::Sealed(last, lag) => Some((t, last, lag)),
                _ => None,
            })
            .collect()
    }

    fn last_caught_up(&self) -> Option<Bucket> {
        self.events().into_iter().rev().find_map(|(_, e)| match e {
            Event::CaughtUp(b) => Some(b),
            _ => None,
        })
    }
}

impl CloseObserver for Seen {
    fn closed(&self, _log: &str, bucket: Bucket, lag: Duration, _items: usize) {
        self.push(Event::Closed(bucket, lag));
    }
    fn failed(&self, _log: &str, bucket: Bucket, error: &Error) {
        self.push(Event::Failed(bucket, error.to_string()));
    }
    fn sealed(&self, _log: &str, last: Bucket, lag: Duration, _empty: u64) {
        self.push(Event::Sealed(last, lag));
    }
    fn caught_up(&self, _log: &str, through: Bucket) {
        self.push(Event::CaughtUp(through));
    }
    fn listing_paused(&self, _log: &str, pause: Duration) {
        self.push(Event::Paused(pause));
    }
}

/// The seconds whose close time `now` has passed: those through this one
/// (what a listing at `now` covers).
fn due_through(now: Micros) -> Bucket {
    Bucket::from_secs(Bucket::of(now.saturating_sub(BagConfig::default().grace)).secs() - 1)
}

/// An idle log ticked every second for eleven minutes: each minute is
/// sealed exactly once, at its close time to the tick, and a minute of
/// ticks costs a few LISTs rather than one per tick.
#[tokio::test]
async fn an_idle_log_is_listed_a_few_times_a_minute_and_sealed_on_time_once_a_minute() {
    let env = Env::new().await;
    let seen = Seen::new(&env.clock);
    let mut m = env.metronome(&seen);
    let grace = BagConfig::default().grace.as_secs();
    // Minute j (from T0) is sealed at T0 + 60 (j + 1) + grace.
    let seal_tick = |j: u64| T0_SECS + 60 * (j + 1) + grace;
    let mut per_minute = Vec::new();
    let mut lists = 0;
    for s in T0_SECS..=seal_tick(10) {
        lists += env.tick_at(&mut m, at(s)).await;
        if (s - T0_SECS) % 60 == grace && s > T0_SECS + 60 {
            // From the tick after one seal through the next.
            per_minute.push(lists);
            lists = 0;
        }
    }
    let seals = seen.seals();
    assert_eq!(seals.len(), 11, "{seals:?}");
    for (j, (t, last, lag)) in seals.iter().enumerate() {
        let span = Span::of(Bucket::from_secs(T0_SECS + 60 * j as u64));
        assert_eq!(
            (*last, *t, *lag),
            (span.last(), at(seal_tick(j as u64)), Duration::ZERO)
        );
    }
    // The ten minutes after the first seal.
    let steady = &per_minute[1..];
    eprintln!("LISTs per idle minute: {per_minute:?}");
    assert_eq!(steady.len(), 10);
    // Today's cap (8 s): a listing every 8 s (7 or 8 a minute) and the
    // seal's own; one per tick (61 a minute) before the pause.
    assert!(steady.iter().all(|n| *n <= 9), "{per_minute:?}");
    assert!(steady.iter().sum::<u64>() <= 85, "{per_minute:?}");
    // The pause grew 1, 2, 4, 8 s and stayed there.
    let pauses: Vec<Duration> = seen
        .events()
        .into_iter()
        .filter_map(|(_, e)| match e {
            Event::Paused(d) => Some(d),
            _ => None,
        })
        .collect();
    let secs = |v: &[u64]| v.iter().map(|s| Duration::from_secs(*s)).collect::<Vec<_>>();
    assert_eq!(pauses, secs(&[1, 2, 4, 8]));
    assert!(!seen.events().iter().any(|(_, e)| matches!(e, Event::Failed(..))));
}

/// The seconds (from T0) written into in [`idle_with_writes`]: after 40 s
/// idle (the pause at its cap), at every phase of a pause, two seconds in
/// a row, and the last seconds of a minute (closed by its seal when no
/// listing comes first).
const WRITTEN: [u64; 15] = [
    41, 53, 54, 67, 90, 100, 117, 118, 119, 150, 177, 179, 200, 233, 239,
];
/// [`idle_with_writes`] ticks through this second from T0: minute 3's seal.
const LAST_TICK: u64 = 242;

/// Ticks `m` at every second from T0 through [`LAST_TICK`]; into each
/// second of [`WRITTEN`] it writes two messages (0.3 s and 0.6 s into it,
/// before the next tick); after each tick, `check(now)`. Returns the
/// acknowledged payloads by second.
async fn idle_with_writes<F>(
    env: &Env,
    m: &mut Metronome,
    mut check: impl FnMut(Micros, u64) -> F,
) -> std::collections::BTreeMap<Bucket, Vec<String>>
where
    F: std::future::Future<Output = ()>,
{
    let leases = crate::testing::TestLeases::default();
    let w = env.writer(&leases);
    let mut acked = std::collections::BTreeMap::<Bucket, Vec<String>>::new();
    for k in 0..=LAST_TICK {
        let now = at(T0_SECS + k);
        let lists = env.tick_at(m, now).await;
        check(now, lists).await;
        if WRITTEN.contains(&k) {
            for ms in [300, 600] {
                env.clock.set(now.saturating_add(Duration::from_millis(ms)));
                let payload = format!("{k}.{ms}");
                let ts = w.write(Bytes::from(payload.clone())).await.unwrap();
                assert_eq!(Bucket::of(ts), Bucket::from_secs(T0_SECS + k));
                acked.entry(Bucket::of(ts)).or_default().push(payload);
            }
        }
    }
    acked
}

/// Every acknowledged message, read back from closed bags only (no reader
/// closes or seals anything here): each is in its bag's lock.
async fn assert_all_in_closed_bags(env: &Env, acked: &std::collections::BTreeMap<Bucket, Vec<String>>) {
    let opts = ReadOptions::default()
        .with_range(at(T0_SECS), at(T0_SECS + LAST_TICK))
        .with_include_open(false)
        .with_close_past_due(false);
    let r = crate::read(
        env.plain.as_ref(),
        &env.log,
        &opts,
        &BagConfig::default(),
        &AssumedExact(env.clock.clone()),
    )
    .await
    .unwrap();
    assert!(r.skipped_open.is_empty(), "open: {:?}", r.skipped_open);
    assert!(r.rejected.is_empty() && r.problems.is_empty(), "{r:?}");
    let mut read = std::collections::BTreeMap::<Bucket, Vec<String>>::new();
    for msg in &r.messages {
        read.entry(msg.bucket)
            .or_default()
            .push(String::from_utf8(msg.payload.to_vec()).unwrap());
    }
    assert_eq!(&read, acked);
}

/// Bags written while the log is idle in its listing pause are each closed
/// by the next listing, at most the cap after their close time, or by
/// their minute's seal if that comes first; every acknowledged message is
/// in its closed bag's lock; the pause ends at the first bag found.
#[tokio::test]
async fn a_bag_written_during_a_pause_is_closed_within_the_cap_or_by_its_seal() {
    let env = Env::new().await;
    let seen = Seen::new(&env.clock);
    let mut m = env.metronome(&seen);
    let acked = idle_with_writes(&env, &mut m, |_, _| async {}).await;
    assert_eq!(acked.len(), WRITTEN.len());
    let events = seen.events();
    let mut late = 0;
    for b in acked.keys() {
        let closes: Vec<Micros> = events
            .iter()
            .filter(|(_, e)| matches!(e, Event::Closed(c, _) if c == b))
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(closes.len(), 1, "{b}: closed at {closes:?}");
        let close_at = b.close_time(BagConfig::default().grace);
        let by = close_at
            .saturating_add(DEFAULT_MAX_IDLE_LISTING)
            .min(Span::of(*b).close_time(BagConfig::default().grace));
        assert!(
            closes[0] >= close_at && closes[0] <= by,
            "{b} closed at {}, by {by}",
            closes[0]
        );
        if closes[0] > close_at {
            late += 1;
        }
    }
    // The pause did delay some closes (else this tests nothing), and ended
    // when a listing found a bag.
    assert!(late > 0);
    assert!(events.iter().any(|(_, e)| *e == Event::Paused(Duration::ZERO)));
    assert_eq!(seen.seals().len(), 4);
    assert!(seen.seals().iter().all(|(_, _, lag)| lag.is_zero()));
    assert_all_in_closed_bags(&env, &acked).await;
}

/// A bag written just after a listing late in its minute, with the pause
/// at its cap, would wait for the next listing past the minute's close
/// time: the minute's seal, on time to the tick, closes it first, and its
/// message is in its lock.
#[tokio::test]
async fn a_bag_written_late_in_a_pause_is_closed_by_its_minutes_seal_on_time() {
    let env = Env::new().await;
    let seen = Seen::new(&env.clock);
    let mut m = env.metronome(&seen);
    let grace = BagConfig::default().grace;
    let w = env.writer(&crate::testing::TestLeases::default());
    // Listings come every 8 s, so their second of the minute moves by 4
    // each minute: one of seconds 55..=58 of some minute lists.
    let mut s = T0_SECS;
    let written = loop {
        let lists = env.tick_at(&mut m, at(s)).await;
        let in_minute = s % 60;
        if s > T0_SECS + 60 && lists > 0 && (55..=58).contains(&in_minute) {
            env.clock.set(at(s).saturating_add(Duration::from_millis(300)));
            let ts = w.write(Bytes::from("late in the minute")).await.unwrap();
            break Bucket::of(ts);
        }
        assert!(s < T0_SECS + 600, "no listing late in a minute");
        s += 1;
    };
    let span = Span::of(written);
    assert!(span.close_time(grace) < at(s).saturating_add(DEFAULT_MAX_IDLE_LISTING));
    while at(s) < span.close_time(grace) {
        s += 1;
        env.tick_at(&mut m, at(s)).await;
    }
    let events = seen.events();
    let closed: Vec<_> = events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Closed(b, _) if *b == written))
        .collect();
    assert_eq!(closed.len(), 1, "{events:?}");
    assert_eq!(closed[0].0, span.close_time(grace), "closed at its minute's seal");
    let (t, last, lag) = *seen.seals().last().unwrap();
    assert_eq!(
        (t, last, lag),
        (span.close_time(grace), span.last(), Duration::ZERO)
    );
    let sealed = seal::seal_of(env.plain.as_ref(), &env.log, span)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sealed.bags().collect::<Vec<_>>(), vec![written]);
    let mut acked = std::collections::BTreeMap::new();
    acked.insert(written, vec!["late in the minute".to_owned()]);
    assert_all_in_closed_bags(&env, &acked).await;
}

/// What `caught_up` claims is true when claimed: every bag through it is
/// closed (the empty seconds wait for their seal), and it is never past
/// the seconds due at the last tick that listed or sealed; it lags the
/// close times by at most the pause (and a tick).
#[tokio::test]
async fn caught_up_claims_only_seconds_listed_or_sealed() {
    let env = Env::new().await;
    let seen = Seen::new(&env.clock);
    let mut m = env.metronome(&seen);
    // Before the log's start nothing is to be listed.
    let horizon = Mutex::new(Bucket::from_secs(T0_SECS - 1));
    let lagging = std::sync::atomic::AtomicU64::new(0);
    let (env_ref, seen_ref) = (&env, &seen);
    let (horizon_ref, lagging_ref) = (&horizon, &lagging);
    idle_with_writes(&env, &mut m, |now, lists| async move {
        if lists > 0 {
            let mut h = horizon_ref.lock().unwrap();
            *h = (*h).max(due_through(now));
        }
        let Some(through) = seen_ref.last_caught_up() else {
            return;
        };
        let h = *horizon_ref.lock().unwrap();
        assert!(
            through <= h,
            "at {now}: caught up through {through}, listed through {h}"
        );
        let due = due_through(now);
        assert!(
            through.secs() + DEFAULT_MAX_IDLE_LISTING.as_secs() + 1 >= due.secs(),
            "at {now}: caught up through {through} only"
        );
        if through < due {
            lagging_ref.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        for (b, closed) in env_ref.bags_through(through).await {
            assert!(closed, "at {now}: caught up through {through}, but {b} is open");
        }
    })
    .await;
    // In a pause it did stay behind the close times (a claim of every due
    // second would have been false).
    assert!(lagging.into_inner() > 0);
}

/// `with_max_idle_listing(ZERO)`: as before the pause, every tick lists
/// the open minute (61 LISTs a minute), every bag is closed at its close
/// time to the tick, and `caught_up` claims every second due.
#[tokio::test]
async fn no_pause_lists_every_tick_as_before() {
    let env = Env::new().await;
    let seen = Seen::new(&env.clock);
    let mut m = env.metronome(&seen).with_max_idle_listing(Duration::ZERO);
    let grace = BagConfig::default().grace.as_secs();
    let per_tick = Mutex::new(Vec::new());
    let (seen_ref, per_tick_ref) = (&seen, &per_tick);
    let acked = idle_with_writes(&env, &mut m, |now, lists| async move {
        per_tick_ref.lock().unwrap().push((now, lists));
        if now > at(T0_SECS + 1 + grace) {
            assert_eq!(seen_ref.last_caught_up(), Some(due_through(now)));
        }
    })
    .await;
    for (now, lists) in per_tick.into_inner().unwrap() {
        let k = (now.as_micros() / 1_000_000 - T0_SECS) % 60;
        let expected = match k {
            // The new minute's first second is not due yet.
            _ if now < at(T0_SECS + 1 + grace) => 0,
            // Its seal: one listing before it, one in it.
            _ if k == grace && now > at(T0_SECS + 60) => 2,
            _ => 1,
        };
        // Closing a bag lists its items too.
        assert!(
            lists >= expected && lists <= expected + 1,
            "at {now}: {lists} LISTs"
        );
    }
    for (t, e) in seen.events() {
        match e {
            Event::Closed(b, lag) if acked.contains_key(&b) => {
                assert_eq!(
                    (t, lag),
                    (b.close_time(BagConfig::default().grace), Duration::ZERO)
                )
            }
            Event::Paused(_) => panic!("no pause with the option at zero"),
            _ => {}
        }
    }
    assert_all_in_closed_bags(&env, &acked).await;
}

/// A corrupt object under the name of the next stretch's summary (here
/// one over [`crate::summary::MAX_SUMMARY_EXPANSION`]: one 50 KB witness
/// cited 1,000 times by each of ten batches) cannot be replaced, as
/// publication is create-only. The tick that reaches it fails naming it,
/// and the next goes on with the stretch after it, rather than every tick
/// failing on it from then on (issue 38).
#[tokio::test]
async fn a_corrupt_summary_under_a_stretch_name_is_named_and_passed() {
    use crate::summary::{Stretch, Summary, SummaryBag, SummaryBatch, SummaryItem};
    use prost::Message as _;
    let env = Env::new().await;
    let leases = crate::testing::TestLeases::default();
    let w = env.writer(&leases);
    for m in 0..3 {
        env.clock.set(at(T0_SECS + 60 * m + 5));
        w.write_batch(vec![Bytes::from(format!("deposit {m}"))])
            .await
            .unwrap();
    }
    let minute = |m: u64| Stretch::new(Span::of(Bucket::from_secs(T0_SECS + 60 * m)), 1);
    let mut batches = vec![SummaryBatch {
        writer: 1,
        witnesses: vec![1; 1000],
        ..Default::default()
    }];
    batches.resize(10, SummaryBatch::default());
    let hostile = Summary {
        format: crate::summary::packed::FORMAT,
        log: env.log.clone(),
        from_secs: T0_SECS + 60,
        to_secs: T0_SECS + 120,
        witnesses: vec![bagel_proto::pb::Witness {
            body: vec![7; 50_000].into(),
            ..Default::default()
        }],
        writer_ids: vec!["w".into()],
        item_names: vec!["w.log".into()],
        bags: vec![SummaryBag {
            bucket_secs: T0_SECS + 65,
            lock_sha256: vec![0; 32],
            items: vec![SummaryItem {
                batches,
                ..Default::default()
            }],
        }],
        ..Default::default()
    };
    let name = minute(1).name();
    env.plain
        .put_first(&env.log, &name, Bytes::from(hostile.encode_to_vec()))
        .await
        .unwrap();
    let seen = Seen::new(&env.clock);
    let mut m = env.metronome(&seen).with_summaries(Duration::ZERO, 1);
    // Started at the log's start, so that its lookback reaches minute 0.
    env.clock.set(at(T0_SECS));
    m.tick().await.unwrap();
    env.clock.set(at(T0_SECS + 240));
    let err = m.tick().await.unwrap_err();
    assert!(
        matches!(&err, Error::CorruptSummary { name: n, .. } if *n == name),
        "{err}"
    );
    assert!(err.to_string().contains("MAX_SUMMARY_EXPANSION"), "{err}");
    let report = m.tick().await.unwrap();
    let made: Vec<Stretch> = report.summarized.iter().map(|s| s.stretch).collect();
    assert_eq!(made, vec![minute(2)]);
    let published = crate::summary::list(env.plain.as_ref(), &env.log).await.unwrap();
    assert_eq!(published, vec![minute(0), minute(1), minute(2)]);
    // Minute 1 is read from its bag, and named.
    let report = crate::read(
        env.plain.as_ref(),
        &env.log,
        &ReadOptions::default()
            .with_range(at(T0_SECS), at(T0_SECS + 180))
            .with_close_past_due(false),
        &BagConfig::default(),
        &AssumedExact(env.clock.clone()),
    )
    .await
    .unwrap();
    let payloads: Vec<&[u8]> = report.messages.iter().map(|m| &m.payload[..]).collect();
    assert_eq!(payloads, [&b"deposit 0"[..], b"deposit 1", b"deposit 2"]);
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.item == name && p.what.contains("corrupt")),
        "{:?}",
        report.problems
    );
}

/// A metronome started after another (a `--once` run after the last, a
/// restart) counts only what it closes itself: the bags and minutes the
/// first closed are not closed again in its report, nor told to its
/// observer, and what is still due is.
#[tokio::test]
async fn a_metronome_counts_only_what_it_closed_not_what_an_earlier_one_did() {
    let env = Env::new().await;
    let leases = crate::testing::TestLeases::default();
    let writer = env.writer(&leases);
    // Writes in seconds 5 and 70 (minute 0 and minute 1).
    for s in [5, 70] {
        env.clock
            .set(at(T0_SECS + s).saturating_add(Duration::from_millis(300)));
        writer.write_batch(vec![Bytes::from_static(b"m")]).await.unwrap();
    }
    let grace = BagConfig::default().grace.as_secs();
    // The first closes through minute 0's seal and second 70.
    let first_seen = Seen::new(&env.clock);
    let mut first = env.metronome(&first_seen);
    env.clock.set(at(T0_SECS + 71 + grace));
    let r = first.tick().await.unwrap();
    assert_eq!(r.closed, 61, "{r:?}"); // second 5 and 59 sealed empty; 70
    // The second, at the same instant: nothing of that is its close.
    let seen = Seen::new(&env.clock);
    let mut second = env.metronome(&seen);
    let r = second.tick().await.unwrap();
    assert_eq!((r.closed, r.sealed), (0, 0), "{r:?}");
    assert!(
        !seen
            .events()
            .iter()
            .any(|(_, e)| matches!(e, Event::Closed(..) | Event::Sealed(..))),
        "{:?}",
        seen.events()
    );
    // Minute 1's seal is still due to someone: the second makes it.
    env.clock.set(at(T0_SECS + 120 + grace));
    let r = second.tick().await.unwrap();
    assert_eq!((r.closed, r.sealed), (59, 59), "{r:?}");
}
