//! Refusals a caller acts on arrive as typed errors with their numbers,
//! decoded from the status's structured details (a `google.rpc.BadRequest`
//! naming the field, an `ErrorInfo` with a stable reason and its
//! metadata), never from the message's words; and every backend refuses
//! by the same rules (`LeaseLimits`), so the same refusal is the same
//! variant on a server, on S3 and in memory. The messages and codes are
//! those the server always sent.

use std::sync::Arc;
use std::time::Duration;

use bagel_client::{
    AcquireSpec, CoalesceOptions, Coalescer, Error, LeaseBackend, LeaseOptions, Metadata, Micros, Mode,
    Transport,
};
use bagel_proto::clock::SystemClock;
use bagel_proto::details as d;
use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::{MemoryLeaseBackend, MemoryLimits, ServerProcess, s3_backend_at, s3_test_config, unique};
use tonic::Code;

const MAX_WAIT: Duration = Duration::from_secs(1);

/// An acquire of a fresh name asking to wait `wait`, for 5 s.
fn spec(wait: Duration) -> AcquireSpec {
    AcquireSpec {
        names: vec![unique("typed")],
        deadline: Micros::now().saturating_add(Duration::from_secs(5)),
        ttl: Some(Duration::from_secs(5)),
        mode: Mode::Full,
        owner: "typed-errors".to_owned(),
        wait,
        holder_key: None,
    }
}

/// Asks `backend` to wait 3 s, over its 1 s max: refused as
/// [`Error::WaitTooLong`] carrying the max, naming `wait_us`.
async fn refuses_the_long_wait(what: &str, backend: &dyn LeaseBackend) -> Error {
    let e = backend
        .acquire_lease(spec(Duration::from_secs(3)))
        .await
        .expect_err(what);
    assert!(
        matches!(&e, Error::WaitTooLong { max, .. } if *max == MAX_WAIT),
        "{what}: {e:?}"
    );
    assert_eq!(e.field(), Some("wait_us"), "{what}");
    assert!(!e.is_retryable(), "{what}");
    e
}

#[tokio::test]
async fn a_wait_over_the_max_is_one_typed_refusal_on_the_server_and_in_memory() {
    let server = ServerProcess::start_ready(&["--max-wait", "1s"]).await;
    let client = server.client().await;
    let e = refuses_the_long_wait("server", &client).await;
    // The words are the server's, as they always were.
    assert_eq!(
        e.to_string(),
        "out of range: wait_us: 3000000 exceeds the server's max wait of 1000000 us"
    );
    let mut limits = MemoryLimits::default();
    limits.lease.max_wait = MAX_WAIT;
    let memory = MemoryLeaseBackend::with_limits(Arc::new(SystemClock), limits);
    refuses_the_long_wait("memory", &memory).await;
}

#[tokio::test]
async fn a_wait_over_the_max_is_the_same_typed_refusal_on_s3() {
    let s3 = s3_backend_at(&unique("typed"), s3_test_config().with_max_wait(MAX_WAIT)).await;
    refuses_the_long_wait("s3", s3.as_ref()).await;
}

#[tokio::test]
async fn a_ttl_over_the_max_carries_the_range_on_the_server_and_in_memory() {
    let server = ServerProcess::start_ready(&["--max-ttl", "10s"]).await;
    let client = server.client().await;
    let memory = MemoryLeaseBackend::new(Arc::new(SystemClock));
    let backends: [(&str, &dyn LeaseBackend, &str); 2] =
        [("server", &client, "ttl_us"), ("memory", &memory, "deadline_us")];
    for (what, backend, field) in backends {
        let mut too_long = spec(Duration::ZERO);
        too_long.ttl = Some(Duration::from_secs(3600));
        too_long.deadline = Micros::now().saturating_add(Duration::from_secs(3600));
        let e = backend.acquire_lease(too_long).await.expect_err(what);
        assert!(
            matches!(&e, Error::TtlOutOfRange { field: f, max_ttl, .. }
                if f == field && *max_ttl == Duration::from_secs(10)),
            "{what}: {e:?}"
        );
        assert!(!e.is_retryable(), "{what}");
    }
}

/// Over the raw protocol: each refusal of a field carries a BadRequest
/// naming it, beside the message the server always sent; a wait over the
/// max and a TTL out of range carry their numbers in an ErrorInfo.
#[tokio::test]
async fn the_details_name_the_field_and_carry_the_numbers() {
    let server = ServerProcess::start_ready(&["--max-wait", "1s", "--max-ttl", "10s"]).await;
    let mut c = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    let acquire = |names: &[&str], ttl_us: u64, wait_us: u64| pb::AcquireRequest {
        names: names.iter().map(|n| (*n).to_owned()).collect(),
        ttl_us,
        owner: "raw".into(),
        mode: pb::Mode::Full.into(),
        wait_us,
        ..Default::default()
    };

    let s = c.acquire(acquire(&["a", "a"], 5_000_000, 0)).await.unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument);
    assert_eq!(s.message(), "names: [1] duplicate name \"a\"");
    assert_eq!(
        d::field_violation_of(s.details()),
        Some(("names".to_owned(), "[1] duplicate name \"a\"".to_owned()))
    );

    let s = c
        .acquire(acquire(&["w"], 5_000_000, 3_000_000))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::OutOfRange);
    assert_eq!(
        s.message(),
        "wait_us: 3000000 exceeds the server's max wait of 1000000 us"
    );
    assert_eq!(
        d::field_violation_of(s.details()).map(|(f, _)| f).as_deref(),
        Some("wait_us")
    );
    let (reason, meta) = d::error_info_of(s.details()).expect("an ErrorInfo");
    assert_eq!(reason, d::REASON_WAIT_TOO_LONG);
    assert_eq!(meta["max_wait_us"], "1000000");
    assert_eq!(meta["wait_us"], "3000000");

    let s = c.acquire(acquire(&["t"], 3_600_000_000, 0)).await.unwrap_err();
    assert_eq!(s.code(), Code::OutOfRange);
    assert!(s.message().starts_with("ttl_us: ttl "), "{}", s.message());
    let (reason, meta) = d::error_info_of(s.details()).expect("an ErrorInfo");
    assert_eq!(reason, d::REASON_TTL_OUT_OF_RANGE);
    assert_eq!(meta["max_ttl_us"], "10000000");
    assert_eq!(meta["ttl_us"], "3600000000");
}

/// A batched operation's refusal carries the unary call's details, so a
/// lease taken through the coalescer (Batch or Session) is refused with
/// the same typed error, naming the same field, as a unary call.
#[tokio::test]
async fn a_batched_refusal_names_its_field_as_a_unary_one_does() {
    let server = ServerProcess::start_ready(&["--max-ttl", "10s"]).await;
    let client = server.client().await;
    for transport in [Transport::Batch, Transport::Session] {
        let coalescer = Coalescer::new(
            client.clone(),
            CoalesceOptions::default().with_transport(transport),
        );
        let unary = client.acquire(["dup", "dup"]).send().await.unwrap_err();
        let batched = client
            .acquire(["dup", "dup"])
            .via(&coalescer)
            .send()
            .await
            .unwrap_err();
        assert!(
            matches!(&batched, Error::Invalid { field: Some(f), .. } if f == "names"),
            "{transport:?}: {batched:?}"
        );
        assert_eq!(batched.to_string(), unary.to_string(), "{transport:?}");
        let lease = client
            .acquire([unique("batched")])
            .options(LeaseOptions::default().with_auto_renew(false))
            .via(&coalescer)
            .send()
            .await
            .unwrap();
        let big = lease
            .renew_with_metadata(Metadata::Data(vec![0; 5000]))
            .await
            .unwrap_err();
        assert_eq!(big.field(), Some("metadata.data"), "{transport:?}: {big:?}");
    }
}
