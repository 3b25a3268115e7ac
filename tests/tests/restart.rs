//! Restart by waiting out the TTL: a fresh server refuses grants until
//! start + max TTL + clock tolerance, and its first grants report an
//! unknown, unsettled predecessor whose watermark is that same instant.

use std::time::Duration;

use bagel_client::{Ended, Error, Micros};
use bagel_tests::ServerProcess;

#[tokio::test]
async fn a_fresh_server_waits_out_the_max_ttl_before_granting() {
    let server = ServerProcess::start(&["--max-ttl", "1500ms", "--clock-tolerance", "200ms"]).await;
    let client = server.client().await;
    let info = client.server_info().await.unwrap();
    assert!(!info.ready);
    assert!(!info.unsafe_skip_restart_wait);
    assert_eq!(info.ready_at.as_micros(), info.epoch.as_micros() + 1_700_000);
    assert_eq!(info.forgotten_floor.as_micros(), info.ready_at.as_micros());

    let err = client
        .acquire(["a"])
        .ttl(Duration::from_secs(1))
        .send()
        .await
        .unwrap_err();
    let Error::Unavailable { message, retry_after } = &err else {
        panic!("expected UNAVAILABLE, got {err:?}")
    };
    // Until when: the restart wait left (the server's RetryInfo), no more
    // than the whole wait.
    let retry_after = retry_after.expect("a refusal in the restart wait says how long it has left");
    assert!(
        !retry_after.is_zero() && retry_after <= Duration::from_millis(1_700),
        "{retry_after:?}"
    );
    assert!(message.contains("refuses grants until"), "{message}");
    assert!(
        message.contains(&Micros::from_micros(info.ready_at.as_micros()).to_string()),
        "{message}"
    );
    assert!(err.is_retryable());

    // Wait for the health service to flip to SERVING (an event the server
    // pushes), then grant.
    server.wait_ready().await;
    let lease = client
        .acquire(["a"])
        .ttl(Duration::from_secs(1))
        .send()
        .await
        .unwrap();
    let prev = lease.names()[0].previous.clone();
    assert_eq!(prev.ended, Ended::Unknown);
    assert_eq!(prev.watermark.as_micros(), info.ready_at.as_micros());
    assert_eq!(lease.min_timestamp().as_micros(), info.ready_at.as_micros());
    assert_eq!(
        lease.close_before_reading(),
        Some(Micros::from_micros(info.ready_at.as_micros() + 1)),
        "an unknown predecessor's bags are unsettled"
    );
    assert!(
        lease.fencing_token("a").unwrap() >= info.ready_at.as_micros(),
        "fencing tokens after a restart start above any earlier incarnation's"
    );
}

#[tokio::test]
async fn fencing_tokens_increase_across_a_restart() {
    let mut first = ServerProcess::start_ready(&[]).await;
    let client = first.client().await;
    let lease = client.acquire(["f"]).send().await.unwrap();
    let before = lease.fencing_token("f").unwrap();
    drop(lease);
    first.kill();

    let second = ServerProcess::start(&["--max-ttl", "300ms", "--clock-tolerance", "50ms"]).await;
    second.wait_ready().await;
    let client = second.client().await;
    let lease = client
        .acquire(["f"])
        .ttl(Duration::from_millis(200))
        .send()
        .await
        .unwrap();
    assert!(lease.fencing_token("f").unwrap() > before);
}
