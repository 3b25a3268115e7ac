//! The clock margin of S3 leases tied to the error the clock check admits
//! (issue 23.6), on the real S3 server and the real Roughtime server
//! (roughenough 2.2, which reports a 5 s radius): a client whose error
//! bound is more than half its clock margin refuses, naming both; each
//! holder's bound is stored in its lease object, and a takeover waits the
//! holder's bound plus the taker's own, even when the taker's margin is
//! smaller.

use std::sync::Arc;
use std::time::Duration;

use bagel_client::{AcquireBuilder, Ended, Error, LeaseOptions, Micros};
use bagel_proto::Signer;
use bagel_proto::clock::SystemClock;
use bagel_s3_lease::{LeaseStore, LeaseTime, S3LeaseBackend};
use bagel_tests::{roughtime_time, s3_bucket, s3_lease_url, s3_test_config, unique};
use object_store::ObjectStoreExt as _;
use object_store::path::{Path, PathPart};

const RADIUS: Duration = Duration::from_secs(5);

async fn backend(prefix: &str, time: LeaseTime, margin: Duration) -> Arc<S3LeaseBackend> {
    let cfg = s3_test_config().with_clock_margin(margin);
    let store = LeaseStore::from_url(&s3_lease_url(prefix), cfg.op_timeout).unwrap();
    Arc::new(
        S3LeaseBackend::open(store, Signer::generate(), time, cfg)
            .await
            .unwrap(),
    )
}

/// With the 5 s radius every bound is over 5 s, so a 1 s margin (the old
/// default, safe only for clocks within 0.5 s) is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_over_half_the_margin_is_refused_naming_both() {
    let b = backend(
        &unique("bound"),
        LeaseTime::Signed(roughtime_time()),
        Duration::from_secs(1),
    )
    .await;
    let err = AcquireBuilder::new(b as _, ["n"])
        .ttl(Duration::from_secs(5))
        .send()
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::ClockOff { .. }), "{err:?}");
    assert!(
        text.contains("error bound 5.")
            && text.contains("clock margin 1.000 s")
            && text.contains("--clock-margin"),
        "{text}"
    );
}

/// A holder on Roughtime stores its bound (over the 5 s radius); a taker
/// running with a 2 s margin on an unchecked clock (claiming 1 s) waits
/// the holder's bound plus its own after the deadline, not its margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_waits_for_the_stored_bound_of_the_holder_plus_its_own() {
    let prefix = unique("bound");
    let holder = backend(
        &prefix,
        LeaseTime::Signed(roughtime_time()),
        Duration::from_secs(16),
    )
    .await;
    let a = AcquireBuilder::new(holder as _, ["n"])
        .ttl(Duration::from_secs(1))
        .options(LeaseOptions::default().with_auto_renew(false))
        .send()
        .await
        .unwrap();
    let object = Path::from(prefix.as_str())
        .join("leases")
        .join(PathPart::from("n"));
    let stored: serde_json::Value = serde_json::from_slice(
        &bagel_bags::store::url::s3_from_env(&s3_bucket())
            .unwrap()
            .get(&object)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap(),
    )
    .unwrap();
    let holder_bound = stored["holder"]["clock_bound_us"]
        .as_u64()
        .map(Duration::from_micros);
    assert!(
        holder_bound.is_some_and(|b| b >= RADIUS),
        "the holder's bound is stored: {stored}"
    );
    let taker_margin = Duration::from_secs(2);
    let taker = backend(
        &prefix,
        LeaseTime::UnsafeLocalClock(Arc::new(SystemClock)),
        taker_margin,
    )
    .await;
    // The deadline asked for is absolute: long enough to outlast the wait.
    let b = AcquireBuilder::new(taker as _, ["n"])
        .ttl(Duration::from_secs(40))
        .wait(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    let prev = b.names()[0].previous.clone();
    assert_eq!(
        (prev.lease_id.as_deref(), prev.ended),
        (Some(a.id()), Ended::Broken)
    );
    let waited = Duration::from_micros(prev.ended_at.as_micros() - a.deadline().as_micros());
    let own = taker_margin / 2;
    assert!(
        waited >= holder_bound.unwrap() + own,
        "taken over {waited:?} after the deadline {}: before the holder's bound {holder_bound:?} + own {own:?}",
        a.deadline()
    );
    assert!(prev.ended_at <= Micros::now());
}
