//! Issue 13, server side: what a hostile or careless client sends is
//! answered precisely and cheaply, and shutdown and restart cannot be
//! tricked. The real `bagel-server` over gRPC on 127.0.0.1.

use bagel_client::Micros;
use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::ServerProcess;
use bagel_tests::raw::raw_call;
use prost::Message as _;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const SEC: u64 = 1_000_000;

fn now() -> u64 {
    Micros::now().as_micros()
}

async fn raw(server: &ServerProcess) -> LeaseServiceClient<Channel> {
    LeaseServiceClient::connect(server.url.clone())
        .await
        .unwrap()
        .max_decoding_message_size(usize::MAX)
}

fn acquire(names: &[&str], ttl_us: u64, mode: pb::Mode) -> pb::AcquireRequest {
    pb::AcquireRequest {
        names: names.iter().map(|s| s.to_string()).collect(),
        deadline_us: now() + ttl_us,
        owner: "t".into(),
        mode: mode.into(),
        wait_us: 0,
        ..Default::default()
    }
}

#[track_caller]
fn assert_status<T: std::fmt::Debug>(
    r: Result<T, tonic::Status>,
    code: Code,
    needles: &[&str],
) -> tonic::Status {
    let status = r.expect_err("request should have been refused");
    assert_eq!(status.code(), code, "{status:?}");
    for needle in needles {
        assert!(
            status.message().contains(needle),
            "{:?} lacks {needle:?}",
            status.message()
        );
    }
    status
}

/// Item 9: no error message grows with the input. A 4 MB lease id used to
/// come back escaped in a 34 MB trailer, a 4 MB batch as a 20 MB answer.
#[tokio::test]
async fn echoed_values_are_capped() {
    let server = ServerProcess::start_ready(&[]).await;
    let mut c = raw(&server).await;
    let huge = "\u{1}".repeat(4_000_000);
    let status = assert_status(
        c.renew(pb::RenewRequest {
            lease_id: huge.clone(),
            token: "0".repeat(32),
            deadline_us: now() + SEC,
            ttl_us: 0,
            metadata: None,
        })
        .await,
        Code::InvalidArgument,
        &["lease_id", "4000000 bytes"],
    );
    assert!(status.message().len() <= 1024, "{} bytes", status.message().len());

    // A batch whose every operation fails on a 3.9 KB lease id.
    let id = "\u{1}".repeat(3900);
    let ops: Vec<pb::BatchOp> = (0..1000)
        .map(|_| pb::BatchOp {
            op: Some(pb::batch_op::Op::Upgrade(pb::UpgradeRequest {
                lease_id: id.clone(),
                token: "0".repeat(32),
            })),
        })
        .collect();
    let request = pb::BatchRequest { ops, lean: false };
    let sent = request.encoded_len();
    let answer = c.batch(request).await.unwrap().into_inner();
    assert_eq!(answer.results.len(), 1000);
    let got = answer.encoded_len();
    // Each refusal says its capped message once, and its details (the
    // field named, the reason) once more.
    assert!(got / 1000 <= 1024, "{} bytes per refused operation", got / 1000);
    assert!(got < sent / 5, "a {sent}-byte batch got a {got}-byte answer");
}

/// Item 10: bytes that are not the request's protobuf are the caller's
/// fault (INVALID_ARGUMENT naming the message), not the server's
/// (INTERNAL).
#[tokio::test]
async fn undecodable_requests_are_invalid_arguments() {
    let server = ServerProcess::start_ready(&[]).await;
    // Field 1 (names), length-delimited, one byte that is not UTF-8.
    let not_utf8 = vec![0x0a, 0x01, 0xff];
    assert_status(
        raw_call(&server, "Acquire", not_utf8).await,
        Code::InvalidArgument,
        &["AcquireRequest", "UTF-8"],
    );
    // A length running past the end of the message.
    let truncated = vec![0x0a, 0x7f, b'a'];
    assert_status(
        raw_call(&server, "Describe", truncated).await,
        Code::InvalidArgument,
        &["DescribeRequest"],
    );
    // Wire type 7 does not exist.
    assert_status(
        raw_call(&server, "Batch", vec![0x0f, 0x00]).await,
        Code::InvalidArgument,
        &["BatchRequest"],
    );
}

/// Item 10: the overall health entry that load balancers probe says
/// NOT_SERVING while the lease service does (restart wait).
#[tokio::test]
async fn overall_health_mirrors_the_lease_service() {
    let server = ServerProcess::start(&["--max-ttl", "1s", "--clock-tolerance", "100ms"]).await;
    let channel = Channel::from_shared(server.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let check = |service: &str| tonic_health::pb::HealthCheckRequest {
        service: service.to_owned(),
    };
    let info = server.client().await.server_info().await.unwrap();
    assert!(!info.ready);
    let overall = health.check(check("")).await.unwrap().into_inner();
    assert_eq!(overall.status(), ServingStatus::NotServing);
    server.wait_ready().await;
    let overall = health.check(check("")).await.unwrap().into_inner();
    assert_eq!(overall.status(), ServingStatus::Serving);
}

/// Item 10: a tentative lease broken by a full acquire answers the same
/// FAILED_PRECONDITION whichever of its names was taken, and its other
/// names are free at once rather than reserved until its deadline.
#[tokio::test]
async fn a_broken_tentative_lease_answers_alike_and_frees_its_names() {
    let server = ServerProcess::start_ready(&[]).await;
    let mut c = raw(&server).await;
    for broken in ["a", "b"] {
        let (a, b) = (format!("{broken}-a"), format!("{broken}-b"));
        let taken = format!("{broken}-{broken}");
        let tentative = c
            .acquire(acquire(&[&a, &b], 10 * SEC, pb::Mode::Tentative))
            .await
            .unwrap()
            .into_inner()
            .grant
            .unwrap();
        let full = c
            .acquire(acquire(&[&taken], 10 * SEC, pb::Mode::Full))
            .await
            .unwrap()
            .into_inner()
            .grant
            .unwrap();
        let upgrade = c
            .upgrade(pb::UpgradeRequest {
                lease_id: tentative.lease_id.clone(),
                token: tentative.token.clone(),
            })
            .await;
        assert_status(
            upgrade,
            Code::FailedPrecondition,
            &[&tentative.lease_id, &taken, &full.lease_id],
        );
        let release = c
            .release(pb::ReleaseRequest {
                lease_id: tentative.lease_id.clone(),
                token: tentative.token.clone(),
                ..Default::default()
            })
            .await;
        assert_status(release, Code::FailedPrecondition, &[&taken]);
        // The name nobody took is free again.
        let other = if taken == a { &b } else { &a };
        let described = c
            .describe(pb::DescribeRequest {
                names: vec![other.clone()],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(described.names[0].holder, None, "{other} still held");
        c.acquire(acquire(&[other], 10 * SEC, pb::Mode::Full))
            .await
            .unwrap();
    }
}

/// Every limit is a flag of `bagel-server` (with its default in `--help`)
/// and is reported by ServerInfo, so operators and clients can see them.
#[tokio::test]
async fn every_limit_is_a_flag_and_in_server_info() {
    let help = std::process::Command::new(bagel_tests::bin("bagel-server"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    for flag in [
        "--max-message-bytes",
        "--max-streams-per-connection",
        "--max-inflight-bytes-per-connection",
        "--max-inflight-bytes",
        "--max-connections",
        "--idle-timeout",
        "--keepalive-interval",
        "--keepalive-timeout",
        "--max-sessions",
        "--session-buffer-bytes",
        "--session-stall-timeout",
        "--max-held-names",
        "--max-held-names-per-owner",
        "--max-held-names-per-peer",
        "--max-records",
        "--max-waiters-per-name",
        "--max-waiters",
        "--history-per-name",
        "--history-budget-bytes",
        "--shutdown-grace",
        "--max-batch-ops",
        "--tls-cert",
        "--tls-key",
        "--client-ca",
    ] {
        assert!(help.contains(&format!("{flag} <")), "--help lacks {flag}");
    }
    let server = ServerProcess::start_ready(&["--max-waiters", "7", "--idle-timeout", "90s"]).await;
    let mut c = raw(&server).await;
    let info = c
        .server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let l = info.limits.expect("limits");
    assert_eq!((l.max_waiters, l.idle_timeout_us), (7, 90 * SEC));
    assert_eq!(l.max_message_bytes, 4 << 20);
    assert_eq!(l.max_batch_ops, 1024);
    assert_eq!(l.max_streams_per_connection, 100);
    assert_eq!(l.max_connections, 1000);
    assert_eq!(l.max_held_names, 2_000_000);
    assert_eq!(l.shutdown_grace_us, 5 * SEC);
    assert!(!info.tls && !info.client_auth);
    let load = info.load.expect("load");
    assert!(load.connections >= 1, "{load:?}");
}
