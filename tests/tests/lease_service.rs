//! The lease service end to end: the real `bagel-server` binary driven by
//! the client library over gRPC on 127.0.0.1. What every lease backend
//! must do (conflicts, hand-offs, expiry, waits, tentative/upgrade,
//! witnesses) is in `lease_conformance.rs`, which runs on the server too;
//! this file keeps what is the server's own.

use std::time::Duration;

use bagel_client::{Error, HistoryEvent, LeaseOptions, LossReason, Metadata, Micros, ReleaseOptions};
use bagel_proto::pb;
use bagel_proto::verify_witness;
use bagel_tests::{ServerProcess, wire};

fn no_renew() -> LeaseOptions {
    LeaseOptions::default().with_auto_renew(false)
}

#[tokio::test]
async fn renewal_after_expiry_is_refused() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let a = client
        .acquire(["r"])
        .ttl(Duration::from_millis(200))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    // Wait for the expiry through the server (a waiting acquire on the name).
    let _b = client
        .acquire(["r"])
        .wait(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    let err = a.renew().await.unwrap_err();
    assert!(!err.is_retryable());
    assert!(
        matches!(&err, Error::NotHeld { message, .. } if message.contains("expired")),
        "{err:?}"
    );
}

#[tokio::test]
async fn background_renewal_keeps_the_lease_and_loss_is_reported() {
    let mut server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let lease = client
        .acquire(["keep"])
        .ttl(Duration::from_millis(600))
        .options(LeaseOptions::default().with_safety_margin(Duration::from_millis(100)))
        .send()
        .await
        .unwrap();
    let first_deadline = lease.deadline();
    let mut state = lease.subscribe();
    // Three renewals, observed as events.
    for _ in 0..3 {
        state.changed().await.unwrap();
    }
    assert!(lease.deadline() > first_deadline);
    let held = client.describe(["keep"]).await.unwrap();
    assert_eq!(
        held[0].holder.as_ref().unwrap().deadline.as_micros(),
        lease.deadline().as_micros()
    );
    let body = verify_witness(&wire(&lease.witness()), &client.keys()).unwrap();
    assert_eq!(body.kind(), pb::WitnessKind::Renew);
    assert_eq!(body.deadline_us, lease.deadline().as_micros());

    // With the server gone, renewals fail until the deadline: lost.
    server.kill();
    let reason = tokio::time::timeout(Duration::from_secs(10), lease.lost())
        .await
        .expect("loss reported before the deadline passed by much");
    assert!(matches!(reason, LossReason::OutOfTime { .. }), "{reason}");
    assert!(!lease.is_valid());
}

#[tokio::test]
async fn metadata_history_and_describe() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let lease = client
        .acquire(["h"])
        .owner("w-1")
        .options(no_renew())
        .send()
        .await
        .unwrap();
    let meta = |s: &str| Metadata::Data(s.as_bytes().to_vec());
    lease.renew_with_metadata(meta("s3://b/p/1")).await.unwrap();
    let wm = Micros::now();
    lease
        .release_with(
            ReleaseOptions::default()
                .with_watermark(wm)
                .with_metadata(Metadata::Wildcard),
        )
        .await
        .unwrap();
    let h = client.history("h").await.unwrap();
    assert_eq!(h.entries.len(), 2);
    assert_eq!(h.entries[0].event, HistoryEvent::Renewed);
    assert_eq!(h.entries[0].metadata, Some(meta("s3://b/p/1")));
    assert_eq!(h.entries[1].event, HistoryEvent::Released);
    assert_eq!(h.entries[1].metadata, Some(Metadata::Wildcard));
    assert_eq!(h.entries[1].watermark, wm);
    assert_eq!(h.entries[1].owner, "w-1");

    let d = client.describe(["h", "never-used"]).await.unwrap();
    assert!(d[0].holder.is_none() && d[0].known);
    assert_eq!(d[0].previous.watermark, wm);
    assert!(!d[1].known);
}
