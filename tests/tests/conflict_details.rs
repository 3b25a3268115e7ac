//! A refused acquire's status details in the gRPC richer error model, as
//! any language's standard decoder reads them: `grpc-status-details-bin`
//! is a `google.rpc.Status` (decoded here with tonic-types, knowing
//! nothing of bagel's decoder) whose `details` hold the `LeaseConflict`
//! under `type.googleapis.com/bagel.v1.LeaseConflict` and a
//! `google.rpc.RetryInfo` with the time until the holder's deadline. The
//! bagel client reads the conflict out of the same status.

use std::time::Duration;

use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::ServerProcess;
use prost::Message as _;
use tonic::Code;
use tonic_types::StatusExt as _;

fn now_us() -> u64 {
    bagel_proto::Micros::now().as_micros()
}

fn acquire(name: &str, deadline_us: u64, owner: &str) -> pb::AcquireRequest {
    pb::AcquireRequest {
        names: vec![name.to_owned()],
        deadline_us,
        owner: owner.to_owned(),
        mode: pb::Mode::Full.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_conflict_is_a_standard_google_rpc_status_with_the_conflict_and_retry_info() {
    let server = ServerProcess::start_ready(&[]).await;
    let mut raw = LeaseServiceClient::connect(server.url.clone())
        .await
        .expect("connect");
    let deadline_us = now_us() + 5_000_000;
    let held = raw
        .acquire(acquire("x", deadline_us, "holder"))
        .await
        .expect("first acquire")
        .into_inner()
        .grant
        .expect("a grant");

    let before = now_us();
    let refused = raw
        .acquire(acquire("x", now_us() + 5_000_000, "rival"))
        .await
        .expect_err("the name is held");
    let after = now_us();
    assert_eq!(refused.code(), Code::Aborted, "{refused:?}");

    // The details, decoded as the standard google.rpc.Status.
    let status = tonic_types::pb::Status::decode(refused.details()).expect("details are a google.rpc.Status");
    assert_eq!(status.code, Code::Aborted as i32);
    assert_eq!(status.message, refused.message());
    let urls: Vec<&str> = status.details.iter().map(|a| a.type_url.as_str()).collect();
    assert_eq!(
        urls,
        [
            "type.googleapis.com/bagel.v1.LeaseConflict",
            "type.googleapis.com/google.rpc.RetryInfo"
        ]
    );
    let conflict = pb::LeaseConflict::decode(status.details[0].value.as_slice()).expect("a LeaseConflict");
    assert_eq!(conflict.name, "x");
    assert_eq!(conflict.holder_lease_id, held.lease_id);
    assert_eq!(conflict.holder_owner, "holder");
    assert_eq!(conflict.holder_deadline_us, deadline_us);

    // RetryInfo through tonic-types' own richer-error decoder: the time
    // from the server's "now" at the refusal (between `before` and
    // `after`, one host, one clock) to the holder's deadline.
    let delay = refused
        .get_details_retry_info()
        .expect("a RetryInfo detail")
        .retry_delay
        .expect("a retry delay");
    assert!(
        Duration::from_micros(deadline_us - after) <= delay
            && delay <= Duration::from_micros(deadline_us - before),
        "retry delay {delay:?} is the time to the holder's deadline"
    );

    // The bagel client reads the conflict from the same answer.
    let client = server.client().await;
    let err = client
        .acquire(["x"])
        .owner("rival")
        .ttl(Duration::from_secs(5))
        .send()
        .await
        .expect_err("the name is held");
    let bagel_client::Error::Busy {
        conflict: Some(c), ..
    } = &err
    else {
        panic!("expected a conflict, got {err:?}");
    };
    assert_eq!(c.holder_lease_id, held.lease_id);
    assert_eq!(c.holder_deadline.as_micros(), deadline_us);
}
