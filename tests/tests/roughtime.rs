//! Signed time from a real Roughtime server (roughenough-server 2.2, started
//! by tests/run.sh): a lease server that takes its time from it, one whose
//! clock is off and so refuses to grant, the writer's `TimeSource`, and
//! watermarks checked against Roughtime signed time.

use std::sync::Arc;
use std::time::Duration;

use bagel_client::{ClockSource, Error, Micros, ReleaseOptions};
use bagel_client::{TimeOptions, TimeSource};
use bagel_proto::clock::{OffsetClock, SystemClock};
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_proto::signed_time::roughtime::{RoughtimeServer, verify_roughtime};
use bagel_proto::{KeyRing, TimeProofKind, pb, verify_signed_time, verify_witness};
use bagel_tests::{Roughtime, ServerProcess, describe_output, wire};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const SEC: u64 = 1_000_000;

async fn start_with_roughtime(rt: &Roughtime, extra: &[&str]) -> ServerProcess {
    let mut args = rt.flags().to_vec();
    args.extend_from_slice(extra);
    ServerProcess::start_ready(&args).await
}

fn acquire_req(name: &str, deadline_us: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        names: vec![name.into()],
        deadline_us,
        owner: "roughtime-test".into(),
        mode: pb::Mode::Full.into(),
        wait_us: 0,
        ..Default::default()
    }
}

/// The "local clock N s ahead of/behind" figure of a clock verdict.
fn stated_offset_secs(msg: &str) -> f64 {
    let rest = msg
        .split("local clock ")
        .nth(1)
        .unwrap_or_else(|| panic!("{msg:?} states no offset"));
    rest.split(" s ").next().unwrap().parse().unwrap()
}

/// 20 s injected, and the Roughtime midpoint is whole seconds (rounded
/// down), so the measured offset is within a second of it.
fn assert_about_20s(msg: &str) {
    let secs = stated_offset_secs(msg);
    assert!((19.0..=21.0).contains(&secs), "{msg:?}: {secs} s, not about 20 s");
}

fn roughtime_proof(st: &pb::SignedTime) -> &pb::RoughtimeProof {
    match &st.proof {
        Some(pb::signed_time::Proof::Roughtime(p)) => p,
        other => panic!("expected a Roughtime proof, got {other:?}"),
    }
}

#[tokio::test]
async fn a_server_with_roughtime_grants_and_its_witnesses_carry_verifiable_roughtime() {
    let rt = Roughtime::from_env();
    let server = start_with_roughtime(&rt, &[]).await;
    let client = server.client().await;

    let info = client.server_info().await.unwrap();
    let clock = info.clock;
    assert_eq!(clock.source, ClockSource::Roughtime, "{clock:?}");
    assert!(clock.healthy, "{clock:?}");
    assert!(clock.detail.contains(&rt.addr), "{}", clock.detail);
    assert!(
        clock.error_bound >= Duration::from_secs(5),
        "the bound includes the 5 s Roughtime radius: {clock:?}"
    );

    let lease = client
        .acquire(["rt-a"])
        .ttl(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    let body = verify_witness(&wire(&lease.witness()), &client.keys()).unwrap();
    assert!(
        !body.self_timed,
        "a Roughtime-timed witness says it is not self-timed"
    );
    let st = body.signed_time.expect("witness has a signed time");
    let proof = roughtime_proof(&st);
    assert_eq!(proof.public_key, rt.key.as_bytes());
    // Offline, with nothing but the Roughtime public key:
    let reading = verify_signed_time(&st, &KeyRing::new(), &[rt.key]).unwrap();
    assert_eq!(reading.source, TimeProofKind::Roughtime);
    assert_eq!(reading.radius_us, 5 * SEC);
    assert!(reading.time.as_micros() <= body.issued_at_us + reading.radius_us);
    // ... and not with another key.
    let stranger = bagel_proto::signed_time::roughtime::RoughtimeKey::from_bytes([7; 32]);
    assert!(verify_signed_time(&st, &KeyRing::new(), &[stranger]).is_err());

    // SignedNow hands out the same kind of proof.
    let now = TimeSource::lease_server(client.clone(), TimeOptions::default())
        .check()
        .await
        .unwrap();
    verify_roughtime(roughtime_proof(&now.signed), &[rt.key]).unwrap();
    assert_eq!(now.reading.radius_us, 5 * SEC);

    // A release with the Roughtime signed time and a watermark at it.
    let watermark = now.reading.time;
    let stored = lease
        .release_with(
            ReleaseOptions::default()
                .with_watermark(watermark)
                .with_signed_time(now),
        )
        .await
        .unwrap();
    assert_eq!(stored, watermark);
}

#[tokio::test]
async fn a_server_whose_clock_is_off_refuses_to_grant_and_says_by_how_much() {
    let rt = Roughtime::from_env();
    for (offset, side) in [("20s", "ahead of"), ("-20s", "behind")] {
        let mut args = rt.flags().to_vec();
        args.extend(["--unsafe-skip-restart-wait", "--unsafe-clock-offset", offset]);
        // Not start_ready: a server with a wrong clock never says SERVING.
        let server = ServerProcess::start(&args).await;
        let mut c = LeaseServiceClient::connect(server.url.clone()).await.unwrap();

        let deadline = Micros::now().as_micros() + 5 * SEC;
        let status = c.acquire(acquire_req("rt-off", deadline)).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        let msg = status.message();
        for needle in ["refusing to grant", "clock is off", side, &rt.addr, "tolerance"] {
            assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
        }
        assert_about_20s(msg);

        let info = c
            .server_info(pb::ServerInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        let clock = info.clock.unwrap();
        assert_eq!(clock.source(), pb::TimeSource::Roughtime);
        assert!(!clock.healthy, "{clock:?}");
        assert!(clock.error_bound_us >= 20 * SEC, "{clock:?}");

        let channel = tonic::transport::Endpoint::from_shared(server.url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut health = HealthClient::new(channel);
        let serving = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: "bagel.v1.LeaseService".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status();
        assert_eq!(serving, ServingStatus::NotServing);
    }
}

#[tokio::test]
async fn a_server_refuses_to_grant_before_its_first_roughtime_answer() {
    let rt = Roughtime::from_env();
    // A UDP socket that never answers, held for the test so nobody else
    // takes its port: Roughtime "configured but silent".
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let server = ServerProcess::start(&[
        "--unsafe-skip-restart-wait",
        "--roughtime",
        &addr,
        "--roughtime-key",
        &rt.key_hex,
        "--roughtime-timeout",
        "100ms",
    ])
    .await;
    let mut c = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    let status = c
        .acquire(acquire_req("rt-silent", Micros::now().as_micros() + 5 * SEC))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    for needle in ["refusing to grant", "no signed time yet", "no answer", &addr] {
        assert!(
            status.message().contains(needle),
            "{:?} lacks {needle:?}",
            status.message()
        );
    }
    let status = c.signed_now(pb::SignedNowRequest {}).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
}

#[tokio::test]
async fn the_writer_time_source_refuses_an_offset_clock_and_vouches_for_a_right_one() {
    let rt = Roughtime::from_env();

    let off = TimeSource::roughtime(
        vec![rt.server()],
        TimeOptions::default().with_clock(Arc::new(OffsetClock {
            inner: SystemClock,
            offset_us: -20_000_000,
        })),
    );
    let err = off.check().await.unwrap_err();
    assert!(matches!(err, Error::ClockOff { .. }), "{err:?}");
    assert!(!err.is_retryable(), "a wrong clock is not fixed by retrying");
    let text = err.to_string();
    for needle in ["refusing to timestamp", "clock is off", "behind", &rt.addr] {
        assert!(text.contains(needle), "{text:?} lacks {needle:?}");
    }
    assert_about_20s(&text);
    assert!(off.verdict().offset_us().expect("measured") < 0);

    let right = TimeSource::roughtime(vec![rt.server()], TimeOptions::default());
    let signed = right.check().await.unwrap();
    let reading = verify_signed_time(&signed.signed, &KeyRing::new(), &right.roughtime_keys()).unwrap();
    assert_eq!(reading.source, TimeProofKind::Roughtime);
    assert_eq!(right.signed_time(), Some(signed.clone()));
    // A second check within the refresh interval reuses the answer; a
    // forced refresh chains its nonce to the previous response.
    let first = roughtime_proof(&signed.signed).clone();
    let again = right.refresh().await.unwrap();
    let second = roughtime_proof(&again.signed).clone();
    assert!(bagel_proto::signed_time::roughtime::follows(&first, &second).unwrap());
    assert!(!bagel_proto::signed_time::roughtime::follows(&second, &first).unwrap());

    // A server that is not the configured one (wrong key) is never trusted.
    let wrong = TimeSource::roughtime(
        vec![RoughtimeServer::new(
            rt.addr.clone(),
            bagel_proto::signed_time::roughtime::RoughtimeKey::from_bytes([7; 32]),
        )],
        TimeOptions::default().with_query(
            bagel_proto::authority::querier::QueryConfig::default()
                .with_timeout(Duration::from_millis(200))
                .with_attempts(1),
        ),
    );
    let err = wrong.check().await.unwrap_err();
    assert!(matches!(err, Error::NoSignedTime { .. }), "{err:?}");
    assert!(err.is_retryable());
}

#[tokio::test]
async fn the_time_source_falls_back_to_the_lease_server() {
    // No Roughtime: the lease server is the local time agent.
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let time = TimeSource::lease_server(client.clone(), TimeOptions::default());
    let signed = time.check().await.unwrap();
    let reading = verify_signed_time(&signed.signed, &client.keys(), &[]).unwrap();
    assert_eq!(reading.source, TimeProofKind::Local);

    let off = TimeSource::lease_server(
        client,
        TimeOptions::default().with_clock(Arc::new(OffsetClock {
            inner: SystemClock,
            offset_us: 20_000_000,
        })),
    );
    let err = off.check().await.unwrap_err();
    assert!(matches!(err, Error::ClockOff { .. }), "{err:?}");
    assert!(err.to_string().contains("ahead of lease server"), "{err}");
    assert_about_20s(&err.to_string());
}

#[tokio::test]
async fn a_watermark_ahead_of_its_roughtime_signed_time_is_refused() {
    let rt = Roughtime::from_env();
    let server = start_with_roughtime(&rt, &["--max-ttl", "20s"]).await;
    let mut c = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    let grant = c
        .acquire(acquire_req("rt-wm", Micros::now().as_micros() + 15 * SEC))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    let time = TimeSource::roughtime(vec![rt.server()], TimeOptions::default());
    let signed = time.check().await.unwrap().signed;
    let midpoint = verify_signed_time(&signed, &KeyRing::new(), &[rt.key])
        .unwrap()
        .time
        .as_micros();
    let release = |watermark_us: u64, signed_time: pb::SignedTime| pb::ReleaseRequest {
        lease_id: grant.lease_id.clone(),
        token: grant.token.clone(),
        watermark_us,
        signed_time: Some(signed_time),
        metadata: None,
        ..Default::default()
    };

    // Limit: signed time + 1 s timestamp tolerance + 1 s Roughtime resolution.
    let status = c
        .release(release(midpoint + 2 * SEC + 1, signed.clone()))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    for needle in ["watermark_us", "ahead of signed_time (Roughtime", "tolerance"] {
        assert!(
            status.message().contains(needle),
            "{:?} lacks {needle:?}",
            status.message()
        );
    }

    // A tampered proof does not verify with the server's Roughtime keys.
    let mut tampered = signed.clone();
    if let Some(pb::signed_time::Proof::Roughtime(p)) = &mut tampered.proof {
        let n = p.response.len();
        p.response[n / 2] ^= 1;
    }
    let status = c.release(release(midpoint, tampered)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("signed_time"), "{status:?}");

    // Exactly at the limit is fine, and the lease is released.
    let ok = c
        .release(release(midpoint + 2 * SEC, signed))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.watermark_us, midpoint + 2 * SEC);
}

#[tokio::test]
async fn the_cli_checks_the_clock_against_roughtime() {
    let rt = Roughtime::from_env();
    // `--server` is unused with Roughtime, but the CLI always takes one.
    let out = bagel_tests::cli_no_server(&[&rt.flags()[..], &["time-check", "--json"]].concat());
    assert!(out.status.success(), "{}", describe_output(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["healthy"], true, "{v}");
    assert_eq!(v["radius_us"], 5 * SEC, "{v}");
    assert_eq!(v["proof"]["kind"], "roughtime", "{v}");
    assert_eq!(v["proof"]["public_key_hex"], rt.key_hex, "{v}");

    // Mismatched flags are refused, naming the problem.
    let out = bagel_tests::cli_no_server(&["--roughtime", &rt.addr, "time-check"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--roughtime-key"),
        "{}",
        describe_output(&out)
    );
}
