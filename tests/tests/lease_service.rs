//! The lease service end to end: the real `bagel-server` binary driven by
//! the client library over gRPC on 127.0.0.1.

use std::time::Duration;

use bagel_client::{
    Ended, Error, HistoryEvent, LeaseOptions, LossReason, Metadata, Micros, Mode, ReleaseOptions,
};
use bagel_proto::pb;
use bagel_proto::verify_witness;
use bagel_tests::{ServerProcess, wire};

fn no_renew() -> LeaseOptions {
    LeaseOptions::default().with_auto_renew(false)
}

#[tokio::test]
async fn a_held_name_is_refused_with_its_holder_and_deadline() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let first = client
        .acquire(["orders"])
        .owner("alice")
        .ttl(Duration::from_secs(5))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    let err = client
        .acquire(["orders", "stock"])
        .owner("bob")
        .send()
        .await
        .unwrap_err();
    assert!(err.is_retryable());
    assert_eq!(err.retry_after(), Some(first.deadline()));
    let Error::Busy {
        conflict: Some(c),
        message,
    } = &err
    else {
        panic!("expected Busy, got {err:?}")
    };
    assert_eq!(
        (c.name.as_str(), c.holder_lease_id.as_str()),
        ("orders", first.id())
    );
    assert_eq!(c.holder_owner, "alice");
    assert!(message.contains("until"), "{message}");
    // All or nothing: "stock" was not taken by the refused request.
    client.acquire(["stock"]).send().await.unwrap();
}

#[tokio::test]
async fn release_hands_the_watermark_to_the_next_holder() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let a = client.acquire(["t1"]).options(no_renew()).send().await.unwrap();
    let a_id = a.id().to_owned();
    let wm = Micros::now();
    assert_eq!(a.release(Some(wm)).await.unwrap(), wm);

    let b = client
        .acquire(["t1", "t2"])
        .options(no_renew())
        .send()
        .await
        .unwrap();
    assert_eq!(
        b.min_timestamp(),
        wm,
        "the next holder must write strictly after the watermark"
    );
    let prev = b.names()[0].previous.clone();
    assert_eq!(
        (prev.lease_id.as_deref(), prev.ended),
        (Some(a_id.as_str()), Ended::Released)
    );
    assert_eq!(prev.watermark.as_micros(), wm.as_micros());
    assert!(
        b.close_before_reading().is_none(),
        "released predecessors need no closing wait"
    );
    assert!(b.fencing_token("t1").unwrap() > 0);
}

#[tokio::test]
async fn an_expired_lease_is_broken_and_its_deadline_becomes_the_watermark() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let a = client
        .acquire(["job"])
        .ttl(Duration::from_millis(300))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    // The server itself waits for the name to free up: the acquire returns
    // exactly when the first lease's deadline has passed.
    let b = client
        .acquire(["job"])
        .wait(Duration::from_secs(5))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    let prev = b.names()[0].previous.clone();
    assert_eq!(prev.ended, Ended::Broken);
    assert_eq!(prev.lease_id.as_deref(), Some(a.id()));
    assert_eq!(prev.watermark.as_micros(), a.deadline().as_micros());
    assert!(prev.ended_at.as_micros() >= a.deadline().as_micros());
    assert_eq!(b.min_timestamp(), a.deadline());
    assert_eq!(b.close_before_reading(), Some(a.deadline().next()));

    // The broken holder can neither renew nor release.
    let err = a.renew().await.unwrap_err();
    assert!(
        matches!(&err, Error::NotHeld { code: tonic::Code::FailedPrecondition, message } if message.contains("expired")),
        "{err:?}"
    );
    let err = a.release(None).await.unwrap_err();
    assert!(matches!(err, Error::NotHeld { .. }), "{err:?}");
}

#[tokio::test]
async fn a_waiting_acquire_is_woken_by_a_release() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let a = client
        .acquire(["q"])
        .ttl(Duration::from_secs(10))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .acquire(["q"])
                .wait(Duration::from_secs(9))
                .options(no_renew())
                .send()
                .await
        })
    };
    // Whether the waiter is already parked on the server when the release
    // lands or arrives just after, it must get the name long before the
    // 10 s deadline: a release wakes waiters, it does not leave them to
    // the expiry.
    let a_deadline = a.deadline();
    a.release(None).await.unwrap();
    let b = waiter.await.unwrap().unwrap();
    assert_eq!(b.names()[0].previous.ended, Ended::Released);
    assert!(
        Micros::now() < a_deadline,
        "woken by the release, not by the expiry"
    );
}

#[tokio::test]
async fn a_full_acquire_breaks_a_tentative_lease_and_its_upgrade_fails() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let tentative = client
        .acquire(["x", "y"])
        .tentative()
        .options(no_renew())
        .send()
        .await
        .unwrap();
    assert_eq!(tentative.mode(), Mode::Tentative);
    assert!(!tentative.is_valid(), "a tentative lease gives no right to write");
    let full = client.acquire(["y"]).options(no_renew()).send().await.unwrap();
    let err = tentative.upgrade().await.unwrap_err();
    let Error::NotHeld { message, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(
        message.contains("\"y\"") && message.contains(full.id()),
        "{message}"
    );
}

#[tokio::test]
async fn tentative_then_upgrade_gives_a_full_lease() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let lease = client
        .acquire(["m", "n"])
        .tentative()
        .options(no_renew())
        .send()
        .await
        .unwrap();
    lease.upgrade().await.unwrap();
    assert_eq!(lease.mode(), Mode::Full);
    assert!(lease.is_valid());
    let body = verify_witness(&wire(&lease.witness()), client.keys()).unwrap();
    assert_eq!(
        (body.mode(), body.kind()),
        (pb::Mode::Full, pb::WitnessKind::Upgrade)
    );
    assert!(client.acquire(["n"]).send().await.is_err());
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
    let body = verify_witness(&wire(&lease.witness()), client.keys()).unwrap();
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
async fn witnesses_verify_and_a_flipped_byte_does_not() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let lease = client
        .acquire(["w1", "w2"])
        .owner("auditor-test")
        .send()
        .await
        .unwrap();
    let witness = wire(&lease.witness());
    let body = verify_witness(&witness, client.keys()).unwrap();
    assert_eq!(body.lease_id, lease.id());
    assert_eq!(body.owner, "auditor-test");
    assert_eq!(body.deadline_us, lease.deadline().as_micros());
    assert_eq!(body.min_timestamp_us, lease.min_timestamp().as_micros());
    assert_eq!(
        body.names.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
        ["w1", "w2"]
    );
    assert!(
        body.self_timed,
        "no time authority configured: the server says it timed itself"
    );
    assert!(body.signed_time.is_some());
    assert!(body.issued_at_us >= body.epoch_us);
    let info = client.server_info().await.unwrap();
    assert_eq!(
        (body.server_id.as_str(), body.epoch_us),
        (info.server_id.as_str(), info.epoch.as_micros())
    );

    for i in [0, witness.body.len() / 2, witness.body.len() - 1] {
        let mut bad = witness.clone();
        bad.body[i] ^= 0x01;
        assert!(
            verify_witness(&bad, client.keys()).is_err(),
            "flipped body byte {i} verified"
        );
    }
    let mut bad = witness.clone();
    bad.signature[0] ^= 0x01;
    assert!(verify_witness(&bad, client.keys()).is_err());
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
