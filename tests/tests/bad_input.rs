//! Every bad input is answered with a precise gRPC
//! status whose message names the field and the limit, and changes nothing.

use bagel_client::Micros;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_proto::{Signer, pb, sign_local_time};
use bagel_tests::ServerProcess;
use tonic::Code;
use tonic::transport::Channel;

const SEC: u64 = 1_000_000;

async fn raw(server: &ServerProcess) -> LeaseServiceClient<Channel> {
    LeaseServiceClient::connect(server.url.clone()).await.unwrap()
}

fn now() -> u64 {
    Micros::now().as_micros()
}

fn acquire(names: &[&str], deadline_us: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        names: names.iter().map(|s| s.to_string()).collect(),
        deadline_us,
        owner: "t".into(),
        mode: pb::Mode::Full.into(),
        wait_us: 0,
        ..Default::default()
    }
}

#[track_caller]
fn assert_status(
    r: Result<tonic::Response<impl std::fmt::Debug>, tonic::Status>,
    code: Code,
    needles: &[&str],
) {
    let status = r.expect_err("request should have been refused");
    assert_eq!(status.code(), code, "{status:?}");
    for needle in needles {
        assert!(
            status.message().contains(needle),
            "{:?} lacks {needle:?}",
            status.message()
        );
    }
}

#[tokio::test]
async fn bad_acquires_are_refused_precisely() {
    let server = ServerProcess::start_ready(&["--max-ttl", "10s"]).await;
    let mut c = raw(&server).await;
    let d = now() + 5 * SEC;
    let long = "n".repeat(257);
    let many: Vec<String> = (0..65).map(|i| format!("n{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();

    let cases: Vec<(pb::AcquireRequest, Code, Vec<&str>)> = vec![
        (
            acquire(&[], d),
            Code::InvalidArgument,
            vec!["names", "at least one"],
        ),
        (
            acquire(&[""], d),
            Code::InvalidArgument,
            vec!["names", "[0]", "empty"],
        ),
        (
            acquire(&["ok", &long], d),
            Code::InvalidArgument,
            vec!["names", "[1]", "257 bytes", "256"],
        ),
        (
            acquire(&many, d),
            Code::InvalidArgument,
            vec!["names", "65 names", "limit of 64"],
        ),
        (
            acquire(&["a", "b", "a"], d),
            Code::InvalidArgument,
            vec!["names", "[2]", "duplicate", "\"a\""],
        ),
        (
            acquire(&["a\u{7}"], d),
            Code::InvalidArgument,
            vec!["names", "control"],
        ),
        (
            acquire(&["a"], 0),
            Code::InvalidArgument,
            vec!["deadline_us", "required"],
        ),
        (
            acquire(&["a"], now() - SEC),
            Code::OutOfRange,
            vec!["deadline_us", "already past on the server's clock", "server now"],
        ),
        (
            acquire(&["a"], now() + 60 * SEC),
            Code::OutOfRange,
            vec![
                "deadline_us",
                "from the server's now",
                "over the server's --max-ttl of 10s",
            ],
        ),
        (
            pb::AcquireRequest {
                mode: 9,
                ..acquire(&["a"], d)
            },
            Code::InvalidArgument,
            vec!["mode", "unknown value 9"],
        ),
        (
            pb::AcquireRequest {
                owner: "o".repeat(300),
                ..acquire(&["a"], d)
            },
            Code::InvalidArgument,
            vec!["owner", "300 bytes", "256"],
        ),
        (
            pb::AcquireRequest {
                wait_us: 3600 * SEC,
                ..acquire(&["a"], d)
            },
            Code::OutOfRange,
            vec!["wait_us", "max wait"],
        ),
    ];
    for (req, code, needles) in cases {
        assert_status(c.acquire(req).await, code, &needles);
    }
    // None of the refused requests took anything.
    let ok = c.acquire(acquire(&["a", "b", "ok"], d)).await.unwrap();
    assert_eq!(ok.into_inner().grant.unwrap().names.len(), 3);
}

#[tokio::test]
async fn bad_renewals_releases_and_upgrades_are_refused_precisely() {
    let server = ServerProcess::start_ready(&[]).await;
    let mut c = raw(&server).await;
    let grant = c
        .acquire(acquire(&["x"], now() + 5 * SEC))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    let id = grant.lease_id.clone();
    let token = grant.token.clone();
    let wrong_token = "0".repeat(32);
    let unknown = "f".repeat(32);

    let renew = |lease_id: &str, token: &str, deadline_us: u64| pb::RenewRequest {
        lease_id: lease_id.into(),
        token: token.into(),
        deadline_us,
        ttl_us: 0,
        metadata: None,
    };
    let release = |lease_id: &str, token: &str, watermark_us: u64| pb::ReleaseRequest {
        lease_id: lease_id.into(),
        token: token.into(),
        watermark_us,
        signed_time: None,
        metadata: None,
        ..Default::default()
    };
    let d = now() + 6 * SEC;

    assert_status(
        c.renew(renew("zz", &token, d)).await,
        Code::InvalidArgument,
        &["lease_id", "32 lowercase hex"],
    );
    assert_status(
        c.renew(renew(&id, "nope", d)).await,
        Code::InvalidArgument,
        &["token"],
    );
    assert_status(
        c.renew(renew(&id, &wrong_token, d)).await,
        Code::PermissionDenied,
        &["token", &id],
    );
    assert_status(
        c.renew(renew(&unknown, &token, d)).await,
        Code::NotFound,
        &["lease_id", "unknown lease"],
    );
    assert_status(
        c.renew(renew(&id, &token, 0)).await,
        Code::InvalidArgument,
        &["deadline_us", "required"],
    );
    // Asking for less than the lease already has is no error (two renewals
    // may race); the answer states the deadline the lease keeps.
    let kept = c.renew(renew(&id, &token, grant.deadline_us - 1)).await.unwrap();
    assert_eq!(kept.into_inner().deadline_us, grant.deadline_us);
    assert_status(
        c.renew(pb::RenewRequest {
            metadata: Some(pb::Metadata {
                data: vec![0; 5000],
                wildcard: false,
            }),
            ..renew(&id, &token, d)
        })
        .await,
        Code::InvalidArgument,
        &["metadata.data", "5000 bytes", "4096"],
    );
    assert_status(
        c.upgrade(pb::UpgradeRequest {
            lease_id: id.clone(),
            token: wrong_token.clone(),
        })
        .await,
        Code::PermissionDenied,
        &["token"],
    );

    // A watermark at the deadline (a lease short enough that the deadline
    // is within the clock tolerance, so only the deadline rule applies).
    let short = c
        .acquire(acquire(&["short"], now() + 400_000))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    assert_status(
        c.release(release(&short.lease_id, &short.token, short.deadline_us))
            .await,
        Code::OutOfRange,
        &["watermark_us", "below the lease deadline"],
    );
    // A watermark far ahead of its signed time (a clock gone wild).
    let far = now() + 4 * SEC;
    assert_status(
        c.release(release(&id, &token, far)).await,
        Code::OutOfRange,
        &["watermark_us", "ahead of the server's clock", "tolerance"],
    );
    // A signed time from a key the server does not know.
    let forged = sign_local_time(&Signer::generate(), "evil", Micros::now(), 0);
    assert_status(
        c.release(pb::ReleaseRequest {
            signed_time: Some(forged),
            ..release(&id, &token, now())
        })
        .await,
        Code::InvalidArgument,
        &["signed_time", "does not verify"],
    );
    // A signed time from the server itself, and the watermark too far past it.
    let signed = c.signed_now(pb::SignedNowRequest {}).await.unwrap().into_inner();
    assert_status(
        c.release(pb::ReleaseRequest {
            signed_time: signed.signed_time.clone(),
            ..release(&id, &token, signed.time_us + signed.radius_us + 2 * SEC)
        })
        .await,
        Code::OutOfRange,
        &["watermark_us", "ahead of signed_time"],
    );
    assert_status(
        c.release(release(&id, &wrong_token, 0)).await,
        Code::PermissionDenied,
        &["token"],
    );

    // After all that, the lease is intact and releases cleanly.
    let ok = c
        .release(pb::ReleaseRequest {
            signed_time: signed.signed_time,
            ..release(&id, &token, signed.time_us)
        })
        .await
        .unwrap();
    assert_eq!(ok.into_inner().watermark_us, signed.time_us);
    assert_status(
        c.renew(renew(&id, &token, d)).await,
        Code::NotFound,
        &["lease_id", "was released"],
    );
}

#[tokio::test]
async fn an_expired_lease_cannot_be_released_or_upgraded() {
    let server = ServerProcess::start_ready(&[]).await;
    let mut c = raw(&server).await;
    let take = |names: &[&str], ttl: u64, wait_us: u64, mode: pb::Mode| pb::AcquireRequest {
        wait_us,
        mode: mode.into(),
        ..acquire(names, now() + ttl)
    };
    let full = c.acquire(take(&["e"], 200_000, 0, pb::Mode::Full)).await.unwrap();
    let full = full.into_inner().grant.unwrap();
    let tentative = c
        .acquire(take(&["t"], 200_000, 0, pb::Mode::Tentative))
        .await
        .unwrap();
    let tentative = tentative.into_inner().grant.unwrap();
    // Wait for both expiries through the server: acquires that wait.
    c.acquire(take(&["e"], 5 * SEC, 5 * SEC, pb::Mode::Full))
        .await
        .unwrap();
    c.acquire(take(&["t"], 5 * SEC, 5 * SEC, pb::Mode::Tentative))
        .await
        .unwrap();

    // The broken full lease is known as expired.
    let up = pb::UpgradeRequest {
        lease_id: full.lease_id.clone(),
        token: full.token.clone(),
    };
    assert_status(c.upgrade(up).await, Code::FailedPrecondition, &["expired"]);
    let rel = pb::ReleaseRequest {
        lease_id: full.lease_id.clone(),
        token: full.token.clone(),
        watermark_us: 0,
        signed_time: None,
        metadata: None,
        ..Default::default()
    };
    assert_status(c.release(rel).await, Code::FailedPrecondition, &["expired"]);
    // A displaced tentative lease leaves no trace (it could not write), so
    // the server no longer knows it.
    let up = pb::UpgradeRequest {
        lease_id: tentative.lease_id.clone(),
        token: tentative.token.clone(),
    };
    assert_status(
        c.upgrade(up).await,
        Code::NotFound,
        &["lease_id", "unknown lease"],
    );
}

#[tokio::test]
async fn describe_and_history_validate_names() {
    let server = ServerProcess::start_ready(&[]).await;
    let mut c = raw(&server).await;
    assert_status(
        c.describe(pb::DescribeRequest { names: vec![] }).await,
        Code::InvalidArgument,
        &["names"],
    );
    assert_status(
        c.history(pb::HistoryRequest { name: String::new() }).await,
        Code::InvalidArgument,
        &["name", "empty"],
    );
}

/// Names that display as something else (bidirectional overrides and
/// isolates) or hide characters (zero-width ones) are refused like control
/// characters, naming the field and the code point; the name is quoted
/// escaped, never raw.
#[tokio::test]
async fn names_with_bidi_or_zero_width_characters_are_refused() {
    let server = ServerProcess::start_ready(&[]).await;
    let mut c = raw(&server).await;
    let d = now() + 5 * SEC;
    let bad = [
        ("tenant-\u{202E}7", "U+202E"),
        ("\u{202A}x", "U+202A"),
        ("x\u{2066}y\u{2069}", "U+2066"),
        ("x\u{2069}", "U+2069"),
        ("ten\u{200B}ant", "U+200B"),
        ("a\u{200D}", "U+200D"),
        ("a\u{2060}", "U+2060"),
        ("\u{FEFF}a", "U+FEFF"),
    ];
    for (name, code_point) in bad {
        for r in [
            c.acquire(acquire(&["fine", name], d)).await.map(|_| ()),
            c.describe(pb::DescribeRequest {
                names: vec![name.to_owned()],
            })
            .await
            .map(|_| ()),
            c.history(pb::HistoryRequest {
                name: name.to_owned(),
            })
            .await
            .map(|_| ()),
        ] {
            let status = r.expect_err(name);
            assert_eq!(status.code(), Code::InvalidArgument, "{name:?}: {status:?}");
            let m = status.message();
            assert!(m.starts_with("name"), "{name:?}: {m}");
            assert!(m.contains(code_point), "{name:?}: {m}");
            let bad_char = name.chars().find(|ch| !ch.is_ascii()).unwrap();
            assert!(!m.contains(bad_char), "{name:?} echoed raw: {m}");
        }
    }
    // Nothing was taken: "fine" is free.
    let ok = c.acquire(acquire(&["fine"], d)).await.unwrap();
    assert_eq!(ok.into_inner().grant.unwrap().names.len(), 1);
}
