//! Issue 51, holes 1 and 2: a writer stalled between taking its
//! timestamps and appending, while its minute is sealed, summarized and
//! removed by retention, on a directory store (whose data file names
//! repeat across a writer's records, so its late append re-creates the
//! summarized file at offset 0).
//!
//! Each test walks the same interleaving ([`stalled_past_retention`], or
//! [`stalled`] stopping at an earlier stage) with
//! the real writer, sealer, summarizer, retention, reader and audit, and
//! checks one rule of `docs/bags.md` ("Retention"):
//! * the late record is `LateRejected`, not acknowledged because the
//!   summary holds a file of its name at least as long (hole 1);
//! * nothing closes a bag in a removed minute, no summary is built over
//!   one, a reader reads it only from the summary its tombstone names (or
//!   reports it missing), and the audit flags two summaries that disagree
//!   on it (hole 2).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bagel_proto::Micros;
use bagel_proto::clock::{AssumedExact, ManualClock};
use bytes::Bytes;
use futures::future::BoxFuture;

use crate::seal::{self, Span};
use crate::store::directory::DirectoryStore;
use crate::store::faults::AppendsThrough;
use crate::summary::{self, Stretch};
use crate::testing::TestLeases;
use crate::{BagConfig, BagState, BagStore, Bucket, Error, ReadOptions, Writer};

const LOG: &str = "log";
/// The first second of minute `M`.
const M: u64 = 1_900_000_020;
/// What the writer was told was written, in second `M + 5`.
const FIRST: &str = "the first record of the second, acknowledged";
/// The stalled record: shorter, so it ends inside the summarized file.
const LATE: &str = "late";

/// The store, leases and clock after the interleaving, and what the
/// stalled write returned.
struct Stalled {
    _dir: tempfile::TempDir,
    store: Arc<dyn BagStore>,
    leases: TestLeases,
    clock: ManualClock,
    /// Minute `M`, which retention removed.
    span: Span,
    /// Second `M + 5`, both records' bag.
    bag: Bucket,
    /// The summary retention removed minute `M` under (its tombstone's).
    summary: Stretch,
    /// What the stalled write returned.
    late: crate::Result<Micros>,
}

type Hook = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

/// One writer writes [`FIRST`] into second `M + 5`, then takes timestamps
/// for [`LATE`] in the same second and stalls before its append; meanwhile
/// minute `M` is sealed (closing the bag), summarized and removed by
/// retention, and the writer's clock moves on half an hour. Then the
/// append lands.
async fn stalled_past_retention() -> Stalled {
    stalled(Stage::Retained, LATE).await
}

/// Writer `w` of [`LOG`] on `store`, on `clock`, under a lease of an hour
/// from `start` (and signed time of that clock).
fn writer_from(store: Arc<dyn BagStore>, leases: &TestLeases, clock: &ManualClock, start: Micros) -> Writer {
    let lease = leases.lease(
        "lease",
        start.saturating_sub(Duration::from_secs(1)),
        start.saturating_add(Duration::from_secs(3600)),
    );
    Writer::new(
        store,
        LOG,
        "w",
        Arc::new(lease),
        Arc::new(clock.clone()),
        leases.time(Arc::new(clock.clone())),
        BagConfig::default(),
    )
    .unwrap()
}

/// How far the minute got while the writer was stalled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    /// Nothing happened: the writer was not held for long.
    Nothing,
    /// Sealed, so the bag is closed.
    Sealed,
    /// Sealed and summarized.
    Summarized,
    /// Sealed, summarized, and removed by retention.
    Retained,
}

/// [`stalled_past_retention`], the minute taken as far as `stage` while
/// the writer is stalled, its stalled record `late`.
async fn stalled(stage: Stage, late: &'static str) -> Stalled {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn BagStore> = Arc::new(DirectoryStore::local(dir.path(), false));
    let (span, bag) = (Span::of(Bucket::from_secs(M)), Bucket::from_secs(M + 5));
    let summary = Stretch::new(span, 1);
    let start = Micros::from_micros(bag.secs() * 1_000_000 + 250_000);
    let clock = ManualClock::new(start);
    let hook: Arc<Mutex<Option<Hook>>> = Arc::default();
    let through = {
        let hook = Arc::clone(&hook);
        AppendsThrough::new(Arc::clone(&store), move |inner, append| {
            let hook = hook.lock().unwrap().take();
            Box::pin(async move {
                if let Some(h) = hook {
                    h().await;
                }
                append.to(&*inner).await
            })
        })
    };
    let leases = TestLeases::default();
    let writer = writer_from(Arc::new(through), &leases, &clock, start);
    writer.write(Bytes::from(FIRST)).await.unwrap();

    let (inner, resumed) = (Arc::clone(&store), clock.clone());
    *hook.lock().unwrap() = Some(Box::new(move || {
        Box::pin(async move {
            let store = inner.as_ref();
            if stage >= Stage::Sealed {
                let sealed = seal::seal(store, LOG, span).await.unwrap();
                assert!(sealed.has_bag(bag));
            }
            if stage >= Stage::Summarized {
                summary::summarize(store, LOG, summary).await.unwrap();
            }
            if stage >= Stage::Retained {
                let now = span.last().end().saturating_add(Duration::from_secs(10));
                let second = Duration::from_secs(1);
                let retained = crate::retain::retain_within(store, LOG, now, second, None, second)
                    .await
                    .unwrap();
                assert_eq!((retained.minutes_tombstoned, retained.bags_removed), (1, 1));
            }
            if stage > Stage::Nothing {
                resumed.set(start.saturating_add(Duration::from_secs(1800)));
            }
        })
    }));
    let late = writer.write(Bytes::from(late)).await;
    assert!(hook.lock().unwrap().is_none(), "the stalled append ran the hook");
    Stalled {
        _dir: dir,
        store,
        leases,
        clock,
        span,
        bag,
        summary,
        late,
    }
}

impl Stalled {
    /// The late append's bag closed, as a closer that looked for the
    /// tombstone just before retention wrote it (or code from before the
    /// rule) leaves it.
    async fn closed_late_bag(&self) {
        let listing = self.store.close(LOG, self.bag).await.unwrap();
        assert_eq!(listing.items.len(), 1, "the re-created file");
    }

    /// A two-minute summary from the minute before `M`, made from the
    /// late bag, as a summarizer that did not look at the tombstone made
    /// it: published with the tombstone out of the way, then put back.
    async fn summary_over_the_late_bag(&self) -> Stretch {
        let store = self.store.as_ref();
        let before = Span::of(Bucket::from_secs(M - 60));
        seal::seal(store, LOG, before).await.unwrap();
        self.closed_late_bag().await;
        let name = crate::tombstone::name(self.span);
        store.remove_named(LOG, &name).await.unwrap();
        let longer = Stretch::new(before, 2);
        summary::summarize(store, LOG, longer).await.unwrap();
        crate::tombstone::put(store, LOG, self.span, self.summary)
            .await
            .unwrap();
        longer
    }

    /// A read of the minute before `M` and `M`, with summaries.
    async fn read(&self) -> crate::ReadReport {
        let mut opts = ReadOptions::default().with_keys(Some(self.leases.keys()));
        opts.from = Micros::from_micros((M - 60) * 1_000_000);
        opts.to = Micros::from_micros((M + 60) * 1_000_000);
        let clock = AssumedExact(self.clock.clone());
        crate::read(self.store.as_ref(), LOG, &opts, &BagConfig::default(), &clock)
            .await
            .unwrap()
    }
}

fn payloads(r: &crate::ReadReport) -> Vec<String> {
    r.messages
        .iter()
        .map(|m| String::from_utf8(m.payload.to_vec()).unwrap())
        .collect()
}

/// Hole 1: the removed-minute verdict accepted the late record because
/// the summary holds an item of its file's name at least as long as the
/// re-created file; the summary holds the first record, not this one.
#[tokio::test]
async fn a_record_appended_after_its_minute_was_removed_is_late_rejected() {
    let s = stalled_past_retention().await;
    match &s.late {
        Err(Error::LateRejected { bucket, .. }) => assert_eq!(*bucket, s.bag),
        other => panic!("the late record must be refused, not {other:?}"),
    }
    // And what readers read holds the acknowledged record only.
    let read = s.read().await;
    assert_eq!(payloads(&read), [FIRST], "{:?}", read.problems);
    assert!(read.problems.is_empty(), "{:?}", read.problems);
}

/// Hole 2: the writer's seal verdict closed the re-created bag in the
/// removed minute (its close did not look at the tombstone), leaving a
/// closed bag a later summary could be built from.
#[tokio::test]
async fn the_late_writer_closes_no_bag_in_the_removed_minute() {
    let s = stalled_past_retention().await;
    match s.store.state(LOG, s.bag).await.unwrap() {
        BagState::Open(items) => assert_eq!(items.len(), 1, "the re-created file, open"),
        BagState::Closed(l) => panic!("the late bag was closed: {l:?}"),
    }
}

/// Hole 2: a summary of a longer stretch was built over the removed
/// minute from the late bag.
#[tokio::test]
async fn no_summary_is_built_over_a_removed_minute() {
    let s = stalled_past_retention().await;
    s.closed_late_bag().await;
    let before = Span::of(Bucket::from_secs(M - 60));
    seal::seal(s.store.as_ref(), LOG, before).await.unwrap();
    let err = summary::summarize(s.store.as_ref(), LOG, Stretch::new(before, 2))
        .await
        .unwrap_err();
    match &err {
        Error::NotSummarizable { reason, .. } => assert!(
            reason.contains("removed by retention") && reason.contains(&s.summary.name()),
            "{reason}"
        ),
        e => panic!("{e}"),
    }
    assert!(
        summary::list(s.store.as_ref(), LOG)
            .await
            .unwrap()
            .iter()
            .all(|st| *st == s.summary),
        "nothing else published"
    );
}

/// Hole 2: given the tombstone's summary and a longer one that starts
/// earlier and holds the late bag, the reader took the minute from the
/// one that starts earliest: the late message, and the acknowledged one
/// gone, with no problem. It reads the minute from the summary its
/// tombstone names, and where that one is gone, reports the minute
/// missing rather than read it from the other.
#[tokio::test]
async fn a_reader_reads_a_removed_minute_only_from_the_summary_its_tombstone_names() {
    let s = stalled_past_retention().await;
    let longer = s.summary_over_the_late_bag().await;
    let read = s.read().await;
    assert_eq!(payloads(&read), [FIRST], "{:?}", read.problems);
    assert!(read.problems.is_empty(), "{:?}", read.problems);
    assert_eq!(read.summaries_read, 2);

    // Its summary gone (`--keep-summaries`): the minute is missing, and
    // the problem does not send the reader to the other summary.
    summary::remove(s.store.as_ref(), LOG, s.summary).await.unwrap();
    let read = s.read().await;
    assert!(payloads(&read).is_empty(), "{:?}", payloads(&read));
    let missing: Vec<&crate::Problem> = read
        .problems
        .iter()
        .filter(|p| p.kind == crate::ProblemKind::Missing && p.bucket == s.bag)
        .collect();
    assert_eq!(missing.len(), 1, "{:?}", read.problems);
    assert!(
        missing[0].item != longer.name() && missing[0].what.contains("no published summary holds them"),
        "{:?}",
        missing[0]
    );
}

/// Hole 2: the audit checked each summary only against the bags still
/// there (the longer one matches the late bag it was made from) and
/// never compared the two summaries of the removed minute.
#[tokio::test]
async fn the_audit_flags_two_summaries_that_disagree_on_a_minute() {
    let s = stalled_past_retention().await;
    let longer = s.summary_over_the_late_bag().await;
    let audit =
        crate::audit::audit_summaries(s.store.as_ref(), LOG, Bucket::from_secs(M - 60), s.span.last())
            .await
            .unwrap();
    let disagree: Vec<&crate::audit::Violation> = audit
        .violations
        .iter()
        .filter(|v| v.kind == crate::audit::ViolationKind::SummariesDisagree)
        .collect();
    assert_eq!(disagree.len(), 1, "{:?}", audit.violations);
    let detail = &disagree[0].detail;
    assert!(
        detail.contains(&s.summary.name())
            && detail.contains(&longer.name())
            && detail.contains(&s.bag.to_string()),
        "{detail}"
    );
}

/// Two honest summaries of one minute (`--span 1m` and `--span 2m`, made
/// from the same sealed minute and closed bags) agree: no finding.
#[tokio::test]
async fn the_audit_finds_nothing_in_two_honest_summaries_of_a_minute() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn BagStore> = Arc::new(DirectoryStore::local(dir.path(), false));
    let span = Span::of(Bucket::from_secs(M));
    let start = Micros::from_micros((M + 5) * 1_000_000 + 250_000);
    let clock = ManualClock::new(start);
    let leases = TestLeases::default();
    let writer = writer_from(Arc::clone(&store), &leases, &clock, start);
    writer.write(Bytes::from(FIRST)).await.unwrap();
    for s in [span, span.next()] {
        seal::seal(store.as_ref(), LOG, s).await.unwrap();
    }
    for minutes in [1, 2] {
        summary::summarize(store.as_ref(), LOG, Stretch::new(span, minutes))
            .await
            .unwrap();
    }
    let audit = crate::audit::audit_summaries(store.as_ref(), LOG, span.first(), span.next().last())
        .await
        .unwrap();
    assert!(audit.violations.is_empty(), "{:?}", audit.violations);
}

/// Every stage the minute may reach while the writer is stalled, with a
/// stalled record shorter and longer than the first: an acknowledged
/// record is read, a refused one is not, and the first is always read.
#[tokio::test]
async fn whatever_happened_during_the_stall_an_acknowledged_record_is_read() {
    let long = "the stalled record of the second, longer than the first one was";
    for stage in [Stage::Nothing, Stage::Sealed, Stage::Summarized, Stage::Retained] {
        for late in [LATE, long] {
            let s = stalled(stage, late).await;
            // Read once the minute is long past (a reader closes its bags).
            s.clock.set(Micros::from_micros((M + 1800) * 1_000_000));
            let read = s.read().await;
            let got = payloads(&read);
            assert!(
                read.problems.is_empty(),
                "{stage:?} {late:?}: {:?}",
                read.problems
            );
            match &s.late {
                Ok(_) => assert_eq!(got, [FIRST, late], "{stage:?}: acknowledged, so read"),
                Err(Error::LateRejected { .. } | Error::BagClosed { .. }) => {
                    assert_eq!(got, [FIRST], "{stage:?}: refused, so not read")
                }
                Err(e) => panic!("{stage:?} {late:?}: {e}"),
            }
            assert_eq!(
                s.late.is_ok(),
                stage == Stage::Nothing,
                "{stage:?} {late:?}: {:?}",
                s.late
            );
        }
    }
}

/// The look after the append, held: an S3 writer behind true time (by
/// more than the tolerance, vouched for by a time source off with it)
/// appends into a bag that a closer on true time has closed, and its look
/// for a started close is held while the minute is sealed, summarized and
/// removed, which takes the bag's `_prelock` with it. The look then finds
/// no prelock: "no close started" was the removal's answer, not the
/// bag's. Found by the bag simulation (seed 1348, a writer 3.4 s behind,
/// its look held 75 s): the record was acknowledged and is in no read.
/// The writer reads its clock again once the verdict is in, so it looks
/// for the tombstone, and refuses the record.
#[cfg(feature = "testing")]
#[tokio::test(start_paused = true)]
async fn a_look_held_past_the_removal_of_its_minute_acknowledges_nothing() {
    use crate::store::memory::{Call, Plan, Script, Scripted, memory_s3};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Holds the writer's second look for a close for an hour, and says
    /// when it is asked (its append has landed by then).
    #[derive(Debug, Default)]
    struct HoldSecondLook {
        looks: AtomicUsize,
        asked: tokio::sync::Notify,
    }
    impl Script for HoldSecondLook {
        fn plan(&self, call: &Call) -> Plan {
            if call.op == "closing_started" && self.looks.fetch_add(1, Ordering::SeqCst) == 1 {
                self.asked.notify_one();
                return Plan {
                    before: Duration::from_secs(3600),
                    ..Plan::default()
                };
            }
            Plan::default()
        }
    }

    let inner: Arc<dyn BagStore> = Arc::new(memory_s3());
    let script = Arc::new(HoldSecondLook::default());
    let (span, bag) = (Span::of(Bucket::from_secs(M)), Bucket::from_secs(M + 5));
    let start = Micros::from_micros(bag.secs() * 1_000_000 + 250_000);
    let clock = ManualClock::new(start);
    let leases = TestLeases::default();
    let scripted = Arc::new(Scripted::new(Arc::clone(&inner), script.clone()));
    let writer = writer_from(scripted, &leases, &clock, start);
    writer.write(Bytes::from(FIRST)).await.unwrap();
    // A closer on true time closes the bag: this writer's clock is behind.
    inner.close(LOG, bag).await.unwrap();
    let late = tokio::spawn(async move { writer.write(Bytes::from(LATE)).await });
    script.asked.notified().await;

    // The late append landed in the closed bag; its look is held while
    // the minute is sealed, summarized and removed, and an hour passes.
    let store = inner.as_ref();
    assert!(seal::seal(store, LOG, span).await.unwrap().has_bag(bag));
    summary::summarize(store, LOG, Stretch::new(span, 1))
        .await
        .unwrap();
    let now = span.last().end().saturating_add(Duration::from_secs(10));
    let second = Duration::from_secs(1);
    let retained = crate::retain::retain_within(store, LOG, now, second, None, second)
        .await
        .unwrap();
    assert_eq!((retained.minutes_tombstoned, retained.bags_removed), (1, 1));
    clock.set(start.saturating_add(Duration::from_secs(1800)));

    match late.await.unwrap() {
        Err(Error::LateRejected { bucket, .. }) => assert_eq!(bucket, bag),
        other => panic!("the late record is in no read, so it must be refused, not {other:?}"),
    }
    let mut opts = ReadOptions::default().with_keys(Some(leases.keys()));
    opts.from = Micros::from_micros(M * 1_000_000);
    opts.to = Micros::from_micros((M + 60) * 1_000_000);
    let read = crate::read(store, LOG, &opts, &BagConfig::default(), &AssumedExact(clock))
        .await
        .unwrap();
    assert_eq!(payloads(&read), [FIRST], "{:?}", read.problems);
}
