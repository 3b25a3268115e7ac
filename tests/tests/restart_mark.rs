//! Issue 13, item 7: a restart waits out the previous incarnation's leases
//! even when its settings or its clock changed, thanks to the granted-until
//! high-water mark kept beside the key file.

use bagel_client::Micros;
use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::ServerProcess;
use tonic::Code;
use tonic::transport::Channel;

const SEC: u64 = 1_000_000;

async fn raw(server: &ServerProcess) -> LeaseServiceClient<Channel> {
    LeaseServiceClient::connect(server.url.clone()).await.unwrap()
}

async fn info(c: &mut LeaseServiceClient<Channel>) -> pb::ServerInfoResponse {
    c.server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner()
}

fn acquire(name: &str, deadline_us: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        names: vec![name.to_owned()],
        deadline_us,
        owner: "t".into(),
        mode: pb::Mode::Full.into(),
        wait_us: 0,
        ..Default::default()
    }
}

fn mark_file(key: &std::path::Path) -> u64 {
    let mut path = key.as_os_str().to_owned();
    path.push(".granted-until");
    let text = std::fs::read_to_string(path).expect("granted-until file beside the key");
    text.split_whitespace().next().unwrap().parse().unwrap()
}

/// Killed with 60 s leases outstanding, restarted with a 2 s max TTL: the
/// new incarnation must not grant before the old leases end (on main it
/// granted after 2.1 s).
#[tokio::test]
async fn a_smaller_max_ttl_after_a_crash_still_waits_out_the_old_leases() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("server.key");
    let key_arg = key.to_str().unwrap();
    let mut first = ServerProcess::start_ready(&["--key", key_arg, "--max-ttl", "60s"]).await;
    let mut c = raw(&first).await;
    let deadline = Micros::now().as_micros() + 59 * SEC;
    let grant = c
        .acquire(acquire("old", deadline))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    assert_eq!(grant.deadline_us, deadline);
    // Written ahead of the grant: the file already covers its deadline.
    assert!(mark_file(&key) >= deadline);
    assert!(info(&mut c).await.granted_until_us >= deadline);
    first.kill();

    let second =
        ServerProcess::start(&["--key", key_arg, "--max-ttl", "2s", "--clock-tolerance", "100ms"]).await;
    let mut c = raw(&second).await;
    let info = info(&mut c).await;
    assert!(!info.ready);
    assert!(
        info.ready_at_us >= deadline + 100_000,
        "ready at {} before the old lease's deadline {deadline} + tolerance",
        info.ready_at_us
    );
    assert_eq!(info.forgotten_floor_us, info.ready_at_us);
    let now = Micros::now().as_micros();
    let refused = c.acquire(acquire("old", now + SEC)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
}

/// A clock stepped back between two incarnations must not lower fencing
/// tokens: the first runs 3 s ahead, the second on time. On main the
/// second granted after its 1.1 s wait with tokens ~2 s below the first's.
#[tokio::test]
async fn a_clock_stepped_back_does_not_lower_fencing_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("server.key");
    let key_arg = key.to_str().unwrap();
    let mut first =
        ServerProcess::start_ready(&["--key", key_arg, "--max-ttl", "1s", "--unsafe-clock-offset", "3s"])
            .await;
    let mut c = raw(&first).await;
    let ahead = info(&mut c).await.now_us;
    let grant = c
        .acquire(acquire("f", ahead + SEC / 2))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    let before = grant.names[0].fencing_token;
    first.kill();

    let second =
        ServerProcess::start(&["--key", key_arg, "--max-ttl", "1s", "--clock-tolerance", "100ms"]).await;
    let mut c = raw(&second).await;
    let info = info(&mut c).await;
    assert!(
        info.ready_at_us > before,
        "ready at {} <= token {before}",
        info.ready_at_us
    );
    second.wait_ready().await;
    let now = Micros::now().as_micros();
    let grant = c
        .acquire(acquire("f", now + SEC / 2))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    let after = grant.names[0].fencing_token;
    assert!(
        after > before,
        "token {after} after the restart <= {before} before"
    );
    assert!(grant.names[0].previous.as_ref().unwrap().watermark_us >= info.ready_at_us);
}

/// No mark (first start with a key, or the file deleted) or a mark that
/// cannot be read: wait the configured max TTL, as without the file.
#[tokio::test]
async fn a_missing_or_unreadable_mark_waits_the_configured_max_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("server.key");
    let key_arg = key.to_str().unwrap();
    for garbage in [None, Some("not a number\n")] {
        if let Some(text) = garbage {
            let mut path = key.as_os_str().to_owned();
            path.push(".granted-until");
            std::fs::write(path, text).unwrap();
        }
        let server = ServerProcess::start(&[
            "--key",
            key_arg,
            "--max-ttl",
            "1500ms",
            "--clock-tolerance",
            "200ms",
        ])
        .await;
        let mut c = raw(&server).await;
        let info = info(&mut c).await;
        assert_eq!(info.ready_at_us, info.epoch_us + 1_700_000, "{garbage:?}");
    }
}
