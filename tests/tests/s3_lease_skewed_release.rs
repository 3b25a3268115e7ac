//! A name handed on by release between S3-lease clients whose clocks
//! disagree, on the real S3 server (moto) and the real `bagel audit`.
//!
//! The releaser's clock runs ahead of the taker's (both within the error
//! each claims). The taker reads the released object before its own clock
//! has reached the release time the object states, yet its grant comes
//! after that release: the store's conditional write orders them. Its
//! witness must say so, as a server's would (granted after the release it
//! names), or the audit reads the hand-over as two holders at once.

use std::sync::Arc;
use std::time::Duration;

use bagel_bags::{self as bag, BagConfig, Writer};
use bagel_client::{AcquireBuilder, Ended, LeaseOptions, Micros};
use bagel_proto::clock::{AssumedExact, Clock, OffsetClock, SystemClock};
use bagel_proto::rights::WriteRights;
use bagel_proto::{Signer, pb};
use bagel_s3_lease::{LeaseStore, LeaseTime, S3LeaseBackend};
use bagel_tests::{Roughtime, bin, describe_output, roughtime_time, s3_lease_url, s3_test_config, unique};
use bytes::Bytes;
use prost::Message as _;

/// How far the releaser's clock runs ahead of the taker's (and of true
/// time): within the error each claims (7 s, half the test clock margin),
/// and longer than the hand-over takes even on a loaded machine.
const AHEAD: Duration = Duration::from_secs(6);

/// A client on `clock`, unchecked (its witnesses are self-timed and claim
/// half the clock margin as their error).
async fn client(prefix: &str, clock: Arc<dyn Clock>) -> Arc<S3LeaseBackend> {
    let cfg = s3_test_config();
    let store = LeaseStore::from_url(&s3_lease_url(prefix), cfg.op_timeout).unwrap();
    Arc::new(
        S3LeaseBackend::open(store, Signer::generate(), LeaseTime::UnsafeLocalClock(clock), cfg)
            .await
            .unwrap(),
    )
}

/// Writes `n` messages under `rights`, on the true clock with Roughtime
/// signed time.
async fn write(
    bags: &str,
    log: &str,
    cfg: &BagConfig,
    writer_id: &str,
    rights: Arc<dyn WriteRights>,
) -> Writer {
    let store = bag::open_store(bags, cfg).await.unwrap();
    let w = Writer::new(
        store,
        log,
        writer_id,
        rights,
        Arc::new(SystemClock),
        Arc::new(roughtime_time()),
        cfg.clone(),
    )
    .unwrap();
    for i in 0..2 {
        w.write(Bytes::from(format!("{writer_id}-{i}"))).await.unwrap();
    }
    w
}

fn issued_at(w: &bagel_client::Witness) -> u64 {
    pb::WitnessBody::decode(bagel_tests::wire(w).body.clone())
        .unwrap()
        .issued_at_us
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_by_a_clock_ahead_is_followed_by_a_grant_stated_after_it() {
    let prefix = unique("skewed");
    let lease_store = s3_lease_url(&prefix);
    let dir = tempfile::tempdir().unwrap();
    let bags = format!("file://{}", dir.path().display());
    let log = unique("log");
    let cfg = BagConfig::default().with_deadline_margin(Duration::from_millis(100));
    let ahead = OffsetClock {
        inner: SystemClock,
        offset_us: i64::try_from(AHEAD.as_micros()).unwrap(),
    };
    let releaser = client(&prefix, Arc::new(ahead)).await;
    let taker = client(&prefix, Arc::new(SystemClock)).await;
    let acquire = |b: &Arc<S3LeaseBackend>| {
        AcquireBuilder::new(Arc::clone(b) as _, ["acct"])
            .ttl(Duration::from_secs(40))
            .options(LeaseOptions::default().with_auto_renew(false))
    };

    let a = acquire(&releaser).send().await.unwrap();
    let a_id = a.id().to_owned();
    let wa = write(&bags, &log, &cfg, "writer-a", a.rights()).await;
    a.release(Some(wa.watermark(Micros::ZERO))).await.unwrap();
    let b = acquire(&taker).send().await.unwrap();
    let prev = b.names()[0].previous.clone();
    assert_eq!(
        (prev.lease_id.as_deref(), prev.ended),
        (Some(a_id.as_str()), Ended::Released)
    );
    assert!(
        prev.ended_at > Micros::now(),
        "the release time {} is not ahead of the taker's clock: the clocks did not disagree",
        prev.ended_at
    );
    let issued = issued_at(&b.witness());
    assert!(
        issued > prev.ended_at.as_micros(),
        "lease {} stated its grant at {issued}, before the release it names at {}",
        b.id(),
        prev.ended_at
    );
    let wb = write(&bags, &log, &cfg, "writer-b", b.rights()).await;
    let b_min = b.min_timestamp();
    b.release(Some(wb.watermark(b_min))).await.unwrap();
    let store = bag::open_store(&bags, &cfg).await.unwrap();
    let until = Micros::now().saturating_add(Duration::from_secs(1));
    bag::close_through(store.as_ref(), &log, until, &cfg, &AssumedExact(SystemClock))
        .await
        .unwrap();

    let out = std::process::Command::new(bin("bagel"))
        .args(Roughtime::from_env().flags())
        .args([
            "--lease-store",
            &lease_store,
            "audit",
            "--store",
            &bags,
            "--log",
            &log,
            "--grace",
            "200ms",
            "--json",
        ])
        .output()
        .unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe_output(&out)));
    assert!(
        out.status.success() && v["violations"].as_array().is_some_and(Vec::is_empty),
        "{}",
        describe_output(&out)
    );
    assert_eq!(
        (v["leases"].as_u64(), v["longest_chain"].as_u64()),
        (Some(2), Some(2)),
        "{}",
        describe_output(&out)
    );
}
