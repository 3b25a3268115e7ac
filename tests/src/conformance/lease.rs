//! The lease-handle conformance suite: every scenario, written once against
//! `bagel_client::LeaseBackend` (through a [`LeaseEnv`]) and the `Lease`
//! handle, is a public async function here, and each backend's test module
//! (`tests/tests/lease_conformance.rs`) calls it from one `#[tokio::test]`
//! with that backend's [`Capabilities`].
//!
//! What differs between backends is said by the environment or by a named
//! capability, never by which backend it is:
//!
//! * when an expired lease may be taken over: [`LeaseEnv::takeover_wait`]
//!   (at its deadline on servers, after the deadline plus the clock margin
//!   on S3; each waiter waits through the backend, never by a sleep);
//! * whether a grant has one witness or one per part:
//!   [`Capabilities::one_witness_per_grant`].
//!
//! A lease id may join parts (a cluster's `MEMBER:ID,...`), and what a
//! backend reports then names the part it holds: the scenarios compare ids
//! with [`names_lease`], which accepts either.

use std::time::Duration;

use bagel_client::{Ended, Error, HistoryEvent, LeaseOptions, Metadata, Micros, Mode, ReleaseOptions};
use bagel_proto::{pb, verify_witness};

use crate::{LeaseEnv, wire};

/// What a lease backend declares about itself, for the scenarios whose
/// assertions depend on it.
#[derive(Clone, Copy, Debug)]
pub struct Capabilities {
    /// A grant, upgrade or renewal carries one witness covering every name
    /// of the lease, stating its deadline and minimum timestamp (one
    /// server, one store). Without it a lease may be held in parts (a
    /// cluster), a witness per part, each of its own part's names and
    /// deadline; a lease in several parts is taken tentatively on each and
    /// upgraded.
    pub one_witness_per_grant: bool,
}

/// The ids a backend knows a lease by: the lease's own, or on a cluster
/// (`MEMBER:ID,MEMBER:ID`) each part's on its server.
pub fn part_ids(lease_id: &str) -> impl Iterator<Item = &str> {
    lease_id
        .split(',')
        .map(|part| part.split_once(':').map_or(part, |(_, id)| id))
}

/// Whether an id a backend reports (a conflict's holder, a previous holder,
/// describe, history) names the lease `lease_id` (on a cluster: a part).
pub fn names_lease(reported: &str, lease_id: &str) -> bool {
    reported == lease_id || part_ids(lease_id).any(|id| id == reported)
}

fn no_renew() -> LeaseOptions {
    LeaseOptions::default().with_auto_renew(false)
}

/// An acquire of a held name is refused as retryable, naming the holder
/// (its owner, lease and mode) and saying when to retry (the holder's
/// deadline); the refused acquire keeps none of its other names, whether
/// they sort before or after the busy one.
pub async fn a_held_name_is_refused_with_its_holder_and_deadline_and_nothing_is_taken(
    env: &LeaseEnv,
    _caps: Capabilities,
) {
    let first = env
        .acquire(["orders"])
        .owner("alice")
        .ttl(Duration::from_secs(5))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    // "stock" sorts after "orders": a refused acquire takes no name.
    let err = env
        .acquire(["stock", "orders"])
        .owner("bob")
        .options(no_renew())
        .send()
        .await
        .unwrap_err();
    assert!(err.is_retryable());
    assert_eq!(err.retry_after(), Some(first.deadline()));
    let Error::Busy {
        conflict: Some(c), ..
    } = &err
    else {
        panic!("expected Busy, got {err:?}")
    };
    assert_eq!((c.name.as_str(), c.holder_owner.as_str()), ("orders", "alice"));
    assert!(names_lease(&c.holder_lease_id, first.id()), "{c:?}");
    assert_eq!(c.holder_mode, Mode::Full);
    env.acquire(["stock"]).options(no_renew()).send().await.unwrap();
    // Names sorting before the busy one are not kept either.
    let err = env
        .acquire(["aardvark", "orders"])
        .options(no_renew())
        .send()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err:?}");
    env.acquire(["aardvark"])
        .options(no_renew())
        .send()
        .await
        .unwrap();
}

/// A release with a watermark hands it to the next holder as its minimum
/// timestamp, with the released lease's id and nothing unsettled; a name
/// never held has no predecessor.
pub async fn release_hands_the_watermark_and_the_lease_id_to_the_next_holder(
    env: &LeaseEnv,
    _caps: Capabilities,
) {
    let a = env.acquire(["t1"]).options(no_renew()).send().await.unwrap();
    let a_id = a.id().to_owned();
    let wm = env.backend().clock().now();
    assert_eq!(a.release(Some(wm)).await.unwrap(), wm);
    let b = env
        .acquire(["t1", "t2"])
        .options(no_renew())
        .send()
        .await
        .unwrap();
    assert_eq!(
        b.min_timestamp(),
        wm,
        "the next holder writes strictly after the watermark"
    );
    let prev = b.names()[0].previous.clone();
    assert_eq!((prev.ended, prev.watermark), (Ended::Released, wm));
    assert!(names_lease(prev.lease_id.as_deref().unwrap(), &a_id), "{prev:?}");
    assert!(
        b.close_before_reading().is_none(),
        "a released predecessor leaves nothing unsettled"
    );
    assert_eq!(b.names()[1].previous.ended, Ended::None, "t2 was never held");
}

/// A waiter takes over a lease that expired (within the env's takeover
/// wait): the predecessor is reported broken, its deadline becomes the
/// watermark, the fencing token grows, and the expired holder can neither
/// renew nor release.
pub async fn an_expired_lease_is_broken_and_its_deadline_becomes_the_watermark(
    env: &LeaseEnv,
    _caps: Capabilities,
) {
    let a = env
        .acquire(["job"])
        .ttl(Duration::from_millis(300))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    let b = env
        .acquire(["job"])
        .wait(env.takeover_wait())
        .options(no_renew())
        .send()
        .await
        .unwrap();
    let prev = b.names()[0].previous.clone();
    assert_eq!(prev.ended, Ended::Broken);
    assert!(names_lease(prev.lease_id.as_deref().unwrap(), a.id()), "{prev:?}");
    assert_eq!(prev.watermark, a.deadline());
    assert!(prev.ended_at >= a.deadline());
    assert_eq!(b.min_timestamp(), a.deadline());
    assert!(b.fencing_token("job").unwrap() > a.fencing_token("job").unwrap());
    let err = a.renew().await.unwrap_err();
    assert!(
        matches!(&err, Error::NotHeld { message, .. } if message.contains("expired")),
        "{err:?}"
    );
    assert!(!err.is_retryable());
    let err = a.release(None).await.unwrap_err();
    assert!(matches!(err, Error::NotHeld { .. }), "{err:?}");
}

/// A waiting acquire is granted on the release of the holder, before the
/// holder's deadline: woken by the release, not by the expiry.
pub async fn a_waiting_acquire_gets_the_name_when_it_is_released(env: &LeaseEnv, _caps: Capabilities) {
    let a = env
        .acquire(["q"])
        .ttl(Duration::from_secs(10))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    let waiter = {
        let b = env
            .acquire(["q"])
            .wait(Duration::from_secs(9))
            .options(no_renew());
        tokio::spawn(b.send())
    };
    let a_deadline = a.deadline();
    a.release(None).await.unwrap();
    let b = waiter.await.unwrap().unwrap();
    assert_eq!(b.names()[0].previous.ended, Ended::Released);
    assert!(
        env.backend().clock().now() < a_deadline,
        "it came with the release, not with the expiry"
    );
}

/// Each grant of a name carries a fencing token above every earlier
/// grant's.
pub async fn fencing_tokens_strictly_increase_per_name(env: &LeaseEnv, _caps: Capabilities) {
    let mut last = 0;
    for _ in 0..5 {
        let l = env.acquire(["f"]).options(no_renew()).send().await.unwrap();
        let token = l.fencing_token("f").unwrap();
        assert!(token > last, "fencing token {token} after {last}");
        last = token;
        l.release(None).await.unwrap();
    }
}

/// A tentative lease gives no right to write and refuses another
/// tentative acquire; a full acquire breaks it, leaving no trace as a
/// predecessor of the full lease, and its upgrade then fails naming the name and the new
/// holder.
pub async fn a_full_acquire_breaks_a_tentative_lease_and_its_upgrade_fails(
    env: &LeaseEnv,
    _caps: Capabilities,
) {
    let tentative = env
        .acquire(["x", "y"])
        .tentative()
        .options(no_renew())
        .send()
        .await
        .unwrap();
    assert_eq!(tentative.mode(), Mode::Tentative);
    assert!(!tentative.is_valid(), "a tentative lease gives no right to write");
    // Another tentative acquire is refused; a full one breaks it.
    let err = env
        .acquire(["y"])
        .tentative()
        .options(no_renew())
        .send()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err:?}");
    let full = env.acquire(["y"]).options(no_renew()).send().await.unwrap();
    assert_eq!(
        full.names()[0].previous.ended,
        Ended::None,
        "a tentative holder leaves no trace"
    );
    let err = tentative.upgrade().await.unwrap_err();
    let Error::NotHeld { message, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(
        message.contains("\"y\"") && part_ids(full.id()).any(|id| message.contains(id)),
        "{message}"
    );
}

/// A tentative lease upgraded while nobody else wants its names becomes
/// full and valid, with an upgrade witness, and holds its names against
/// others.
pub async fn tentative_then_upgrade_gives_a_full_lease(env: &LeaseEnv, _caps: Capabilities) {
    let lease = env
        .acquire(["m", "n"])
        .tentative()
        .options(no_renew())
        .send()
        .await
        .unwrap();
    lease.upgrade().await.unwrap();
    assert_eq!(lease.mode(), Mode::Full);
    assert!(lease.is_valid());
    let body = verify_witness(&wire(&lease.witness()), &env.keys().await).unwrap();
    assert_eq!(
        (body.mode(), body.kind()),
        (pb::Mode::Full, pb::WitnessKind::Upgrade)
    );
    assert!(names_lease(&body.lease_id, lease.id()), "{}", body.lease_id);
    assert!(env.acquire(["n"]).options(no_renew()).send().await.is_err());
}

/// Background renewal moves the deadline on; describe reports the holder
/// with at least that deadline, and the handle's witness is the latest
/// renewal's, stating it.
pub async fn background_renewal_extends_the_deadline_and_the_witness_follows(
    env: &LeaseEnv,
    _caps: Capabilities,
) {
    let lease = env
        .acquire(["keep"])
        .ttl(Duration::from_millis(900))
        .options(LeaseOptions::default().with_safety_margin(Duration::from_millis(100)))
        .send()
        .await
        .unwrap();
    let first_deadline = lease.deadline();
    let mut state = lease.subscribe();
    for _ in 0..3 {
        state.changed().await.unwrap();
    }
    assert!(lease.deadline() > first_deadline);
    assert!(lease.state().lost.is_none());
    let held = env.describe(&["keep"]).await;
    assert!(names_lease(
        &held[0].holder.as_ref().unwrap().lease_id,
        lease.id()
    ));
    assert!(held[0].holder.as_ref().unwrap().deadline >= lease.deadline());
    let body = verify_witness(&wire(&lease.witness()), &env.keys().await).unwrap();
    assert_eq!(body.kind(), pb::WitnessKind::Renew);
    assert_eq!(body.deadline_us, lease.deadline().as_micros());
    lease.release(None).await.unwrap();
}

/// A renewal asking for an earlier deadline than the one held keeps the
/// one held.
pub async fn a_renewal_never_shortens_the_lease(env: &LeaseEnv, _caps: Capabilities) {
    let lease = env
        .acquire(["long"])
        .ttl(Duration::from_secs(8))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    let long = lease.deadline();
    let backend = env.backend();
    let short = backend.clock().now().saturating_add(Duration::from_secs(2));
    let r = backend.renew_lease(lease.lease_ref(), short, None).await.unwrap();
    assert_eq!(r.deadline, long, "a renewal asking for less keeps what is held");
}

/// A lease taken over after it expired is refused a renewal as not held,
/// while the new holder holds on and renews.
pub async fn a_taken_over_lease_reports_loss_and_cannot_renew_or_release(
    env: &LeaseEnv,
    _caps: Capabilities,
) {
    // Background renewal against a lease whose name a full acquire takes
    // after it expired: the renewal is refused, the handle says lost.
    let a = env
        .acquire(["lost"])
        .ttl(Duration::from_millis(300))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    let b = env
        .acquire(["lost"])
        .wait(env.takeover_wait())
        .options(no_renew())
        .send()
        .await
        .unwrap();
    let err = env
        .backend()
        .renew_lease(
            a.lease_ref(),
            env.backend().clock().now().saturating_add(Duration::from_secs(5)),
            None,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotHeld { .. }), "{err:?}");
    // The winner holds on.
    assert!(b.is_valid());
    b.renew().await.unwrap();
}

/// Every witness of the grant verifies with the backend's keys and states
/// it: the lease (or its part), the owner, a full lease (acquired, or
/// upgraded where it is in several parts), its names in their fixed
/// (sorted) order with their fencing tokens, signed time and the server;
/// one flipped byte of its body or signature fails verification. With [`Capabilities::one_witness_per_grant`] the one
/// witness states the lease's deadline, minimum timestamp and every name;
/// without it the witnesses of the parts state each name once between
/// them, and each part's deadline is at least the lease's (the earliest)
/// and its minimum timestamp at most the lease's (the latest).
pub async fn witnesses_state_the_grant_and_a_flipped_byte_fails(env: &LeaseEnv, caps: Capabilities) {
    let lease = env
        .acquire(["w2", "w1"])
        .owner("auditor-test")
        .options(no_renew())
        .send()
        .await
        .unwrap();
    let keys = env.keys().await;
    let granted: Vec<(String, u64)> = lease
        .names()
        .iter()
        .map(|n| (n.name.clone(), n.fencing_token))
        .collect();
    let witnesses = lease.witnesses();
    if caps.one_witness_per_grant {
        assert_eq!(witnesses.len(), 1, "one witness per grant");
    }
    // A lease in several parts is taken tentatively on each, then upgraded.
    let kind = if witnesses.len() > 1 {
        pb::WitnessKind::Upgrade
    } else {
        pb::WitnessKind::Acquire
    };
    let mut stated = Vec::new();
    for witness in witnesses.iter().map(wire) {
        let body = verify_witness(&witness, &keys).unwrap();
        assert!(names_lease(&body.lease_id, lease.id()), "{}", body.lease_id);
        assert_eq!(body.owner, "auditor-test");
        if caps.one_witness_per_grant {
            assert_eq!(body.deadline_us, lease.deadline().as_micros());
            assert_eq!(body.min_timestamp_us, lease.min_timestamp().as_micros());
        } else {
            assert!(body.deadline_us >= lease.deadline().as_micros());
            assert!(body.min_timestamp_us <= lease.min_timestamp().as_micros());
        }
        assert_eq!((body.mode(), body.kind()), (pb::Mode::Full, kind));
        let names: Vec<(String, u64)> = body
            .names
            .iter()
            .map(|n| (n.name.clone(), n.fencing_token))
            .collect();
        assert!(
            names.is_sorted(),
            "names in their fixed (sorted) order: {names:?}"
        );
        stated.extend(names);
        assert!(body.signed_time.is_some());
        assert!(!body.server_id.is_empty());
        for i in [0, witness.body.len() / 2, witness.body.len() - 1] {
            let mut bad = witness.clone();
            let mut body = bad.body.to_vec();
            body[i] ^= 0x01;
            bad.body = body.into();
            assert!(
                verify_witness(&bad, &keys).is_err(),
                "flipped body byte {i} verified"
            );
        }
        let mut bad = witness.clone();
        let mut signature = bad.signature.to_vec();
        signature[0] ^= 0x01;
        bad.signature = signature.into();
        assert!(verify_witness(&bad, &keys).is_err());
    }
    if caps.one_witness_per_grant {
        assert_eq!(stated, granted);
        assert_eq!(stated[0].0, "w1", "names in their fixed (sorted) order");
    } else {
        let mut want = granted;
        want.sort();
        stated.sort();
        assert_eq!(stated, want, "each name stated by one part's witness");
    }
}

/// Metadata given on renew and release is kept in the name's history with
/// the event, watermark and owner; describe tells a known free name from
/// one never used.
pub async fn metadata_on_renew_and_release_is_kept_in_the_history(env: &LeaseEnv, _caps: Capabilities) {
    let lease = env
        .acquire(["h"])
        .owner("w-1")
        .options(no_renew())
        .send()
        .await
        .unwrap();
    let meta = |s: &str| Metadata::Data(s.as_bytes().to_vec());
    lease.renew_with_metadata(meta("s3://b/p/1")).await.unwrap();
    let wm = env.backend().clock().now();
    lease
        .release_with(
            ReleaseOptions::default()
                .with_watermark(wm)
                .with_metadata(Metadata::Wildcard),
        )
        .await
        .unwrap();
    let h = env.history("h").await;
    assert_eq!(h.entries.len(), 2);
    assert_eq!(h.entries[0].event, HistoryEvent::Renewed);
    assert_eq!(h.entries[0].metadata, Some(meta("s3://b/p/1")));
    assert_eq!(h.entries[1].event, HistoryEvent::Released);
    assert_eq!(h.entries[1].metadata, Some(Metadata::Wildcard));
    assert_eq!((h.entries[1].watermark, h.entries[1].owner.as_str()), (wm, "w-1"));
    let d = env.describe(&["h", "never-used"]).await;
    assert!(d[0].holder.is_none() && d[0].known);
    assert_eq!(d[0].previous.watermark, wm);
    assert!(!d[1].known);
}

/// Bad input (no names, a duplicate, an over-long or control-character
/// name, an over-long owner, a TTL over the limit, over-long metadata, a
/// watermark past the deadline) is refused as not retryable, naming the
/// field and saying why.
pub async fn bad_input_is_refused_naming_the_field(env: &LeaseEnv, _caps: Capabilities) {
    // Every backend names the field it refuses (as a field, not only in
    // the text) and says why.
    let refused = |e: Error, field: &str, why: &str| {
        let reason = match &e {
            Error::Invalid { reason, .. } | Error::OutOfRange { reason, .. } => reason,
            other => panic!("expected a refusal of {field}: {other:?}"),
        };
        assert_eq!(e.field(), Some(field), "{e:?}");
        assert!(reason.contains(why), "expected {why:?} in {reason:?}");
        assert!(!e.is_retryable());
    };
    let empty: [&str; 0] = [];
    refused(
        env.acquire(empty).send().await.unwrap_err(),
        "names",
        "at least one",
    );
    refused(
        env.acquire(["a", "a"]).send().await.unwrap_err(),
        "names",
        "duplicate",
    );
    refused(
        env.acquire(["x".repeat(300)]).send().await.unwrap_err(),
        "names",
        "256 bytes",
    );
    refused(
        env.acquire(["a\u{7}"]).send().await.unwrap_err(),
        "names",
        "control character",
    );
    refused(
        env.acquire(["a"])
            .owner("o".repeat(300))
            .send()
            .await
            .unwrap_err(),
        "owner",
        "bytes",
    );
    // A TTL over the limit names the limit: the server counts a TTL itself
    // (`ttl_us`, "--max-ttl"), the S3 backend checks the deadline it
    // computed (`deadline_us`, "max_ttl").
    let too_long = env
        .acquire(["a"])
        .ttl(Duration::from_secs(3600))
        .send()
        .await
        .unwrap_err();
    assert!(
        matches!(&too_long, Error::TtlOutOfRange { field: f, reason, .. }
            if (f == "ttl_us" && reason.contains("--max-ttl")) || (f == "deadline_us" && reason.contains("max_ttl"))),
        "expected a refusal naming the max TTL: {too_long:?}"
    );
    assert!(!too_long.is_retryable());
    let lease = env.acquire(["a"]).options(no_renew()).send().await.unwrap();
    refused(
        lease
            .renew_with_metadata(Metadata::Data(vec![0; 5000]))
            .await
            .unwrap_err(),
        "metadata.data",
        "over the limit",
    );
    let beyond = lease.deadline().saturating_add(Duration::from_secs(1));
    refused(
        lease.release(Some(beyond)).await.unwrap_err(),
        "watermark_us",
        "ahead of",
    );
}

/// The bags a broken lease may have left open are handed down (as the
/// time to close before reading) from holder to holder until one says it
/// settled them.
pub async fn unsettled_bags_of_a_broken_lease_travel_down_the_chain(env: &LeaseEnv, _caps: Capabilities) {
    let a = env
        .acquire(["u"])
        .ttl(Duration::from_millis(300))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    let b = env
        .acquire(["u"])
        .wait(env.takeover_wait())
        .options(no_renew())
        .send()
        .await
        .unwrap();
    assert_eq!(b.close_before_reading(), Some(a.deadline().next()));
    // B releases without closing them: C must still close.
    b.release(None).await.unwrap();
    let c = env.acquire(["u"]).options(no_renew()).send().await.unwrap();
    assert_eq!(c.close_before_reading(), Some(a.deadline().next()));
    // C closes through them and says so: D inherits nothing unsettled.
    c.settled_through(a.deadline().next());
    c.release(None).await.unwrap();
    let d = env.acquire(["u"]).options(no_renew()).send().await.unwrap();
    assert_eq!(d.close_before_reading(), None);
}

/// A release with a watermark below what the lease's writers wrote is
/// refused; a release without one publishes the largest timestamp
/// written, which the next holder starts from.
pub async fn a_release_publishes_what_the_writers_wrote(env: &LeaseEnv, _caps: Capabilities) {
    let lease = env.acquire(["wr"]).options(no_renew()).send().await.unwrap();
    let ledger = lease.rights().ledger().expect("a lease keeps a ledger");
    let ts = env.backend().clock().now();
    ledger.begin(ts).expect("writes are open").settled();
    let below = Micros::from_micros(ts.as_micros() - 1);
    let err = lease.release(Some(below)).await.unwrap_err();
    assert!(matches!(err, Error::WatermarkBelowWritten { .. }), "{err:?}");
    let lease = env.acquire(["wr2"]).options(no_renew()).send().await.unwrap();
    let ledger = lease.rights().ledger().unwrap();
    let ts = env.backend().clock().now();
    ledger.begin(ts).unwrap().settled();
    assert_eq!(lease.release(None).await.unwrap(), ts);
    let next = env.acquire(["wr2"]).options(no_renew()).send().await.unwrap();
    assert_eq!(next.min_timestamp(), ts);
}
