//! S3-specific checks on the real S3 server: one PUT and one HEAD per batch
//! on the happy path (after a writer's one-time start mark), and refusing a store that
//! ignores conditional writes (the double is in `bagel_tests`, shared with
//! the S3 lease tests).

use std::sync::Arc;
use std::time::Duration;

use bagel_bags::store::faults::KillSwitch;
use bagel_bags::store::object::{LOOK_TRUSTED_FOR, ObjectBagStore};
use bagel_bags::{self as bag, BagConfig, Error, Writer};
use bagel_proto::clock::ManualClock;
use bagel_tests::{Backend, Ignores, IgnoresConditions, TestLeases, t0, unique};
use bytes::Bytes;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn happy_path_is_exactly_one_put_per_batch() {
    let backend = Backend::s3();
    let (store, counts) = backend.store_with(KillSwitch::never()).await;
    let counts = counts.unwrap();
    let clock = ManualClock::new(t0());
    let leases = TestLeases::default();
    let lease = leases.lease(
        "l1",
        t0().saturating_sub(Duration::from_secs(1)),
        t0().saturating_add(Duration::from_secs(60)),
    );
    let w = Writer::new(
        store,
        &unique("log"),
        "w1",
        Arc::new(lease),
        Arc::new(clock.clone()),
        leases.time(Arc::new(clock.clone())),
        BagConfig::default(),
    )
    .unwrap();
    // The first write of a writer also looks for (one LIST) and makes (one
    // PUT) the log's start mark; count from after it.
    let since_first_look = std::time::Instant::now();
    w.write(Bytes::from("first")).await.unwrap();
    assert_eq!((counts.puts(), counts.lists()), (2, 1));
    counts.reset();
    let batches = 20u64;
    for i in 0..batches {
        let batch = (0..10).map(|j| Bytes::from(format!("m{i}-{j}"))).collect();
        w.write_batch(batch).await.unwrap();
        clock.advance(Duration::from_millis(30));
    }
    println!(
        "S3 requests for {batches} batches: {} PUT, {} GET, {} HEAD, {} LIST",
        counts.puts(),
        counts.gets(),
        counts.heads(),
        counts.lists()
    );
    assert_eq!(counts.puts(), batches);
    // After each PUT the writer asks whether a close of the bag has
    // started, whatever its clock says; a HEAD of `_prelock` that found
    // none answers for `LOOK_TRUSTED_FOR` (closers settle longer before
    // they list), so there is at most one HEAD per such window since the
    // first write's look. Its minute's seal was looked for after the first
    // record in the bag, before the reset.
    let windows = since_first_look.elapsed().as_micros() / LOOK_TRUSTED_FOR.as_micros() + 1;
    assert!(
        u128::from(counts.heads()) <= windows.min(u128::from(batches)),
        "{} HEADs for {batches} batches in {windows} windows of {LOOK_TRUSTED_FOR:?}",
        counts.heads()
    );
    assert_eq!((counts.gets(), counts.lists()), (0, 0));
    // The first batch in the next second also looks for its minute's seal
    // (a GET of the seal's intent, then of the seal), once per bag.
    counts.reset();
    clock.advance(Duration::from_secs(1));
    w.write(Bytes::from("next second")).await.unwrap();
    assert_eq!(
        (counts.puts(), counts.gets(), counts.heads(), counts.lists()),
        (1, 2, 1, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_ignores_conditional_writes_is_refused() {
    let bucket = bagel_tests::s3_bucket();
    let real = bag::store::url::s3_from_env(&bucket).unwrap();
    let honest = ObjectBagStore::new(real.clone(), &unique("p"), "honest".into());
    honest.probe_conditional_put().await.unwrap();
    honest.probe_conditional_update().await.unwrap();
    let liar = IgnoresConditions {
        inner: real.clone(),
        ignores: Ignores::IfMatch,
    };
    let liar = ObjectBagStore::new(Arc::new(liar), &unique("p"), "liar".into());
    let err = liar.probe_conditional_update().await.unwrap_err();
    assert!(err.to_string().contains("with If-Match"), "{err}");
    let liar = IgnoresConditions {
        inner: real,
        ignores: Ignores::IfNoneMatch,
    };
    let liar = ObjectBagStore::new(Arc::new(liar), &unique("p"), "liar".into());
    let err = liar.probe_conditional_put().await.unwrap_err();
    assert!(matches!(err, Error::ConditionalWritesIgnored { .. }), "{err:?}");
    assert!(err.to_string().contains("ignores conditional writes"), "{err}");
    assert!(err.is_permanent());
}
