//! Issue 13, item 6: SIGTERM stops granting at once (health NOT_SERVING
//! first), answers what is in flight, closes sessions and waits with a
//! clear status, and the process exits within --shutdown-grace even with
//! connections left open (on main it never exited while one was open).

use std::time::Duration;

use bagel_client::Micros;
use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::ServerProcess;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const SEC: u64 = 1_000_000;
/// Only against hanging forever when something is broken.
const GUARD: Duration = Duration::from_secs(60);

async fn channel(server: &ServerProcess) -> Channel {
    Channel::from_shared(server.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn acquire(name: &str, wait_us: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        names: vec![name.to_owned()],
        deadline_us: Micros::now().as_micros() + 9 * SEC,
        owner: "s".into(),
        mode: pb::Mode::Full.into(),
        wait_us,
        ..Default::default()
    }
}

async fn guarded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen"))
}

#[tokio::test]
async fn sigterm_stops_granting_closes_sessions_and_exits_within_the_grace() {
    let server = ServerProcess::start_ready(&["--shutdown-grace", "2s"]).await;
    let mut c = LeaseServiceClient::new(channel(&server).await);

    // Watching health, as a load balancer would.
    let mut health = HealthClient::new(channel(&server).await)
        .watch(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        health.message().await.unwrap().unwrap().status(),
        ServingStatus::Serving
    );

    // A session, answered once and left open.
    let (requests, rx) = tokio::sync::mpsc::channel(4);
    let mut session = LeaseServiceClient::new(channel(&server).await)
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    requests
        .send(pb::BatchRequest {
            lean: false,
            ops: vec![pb::BatchOp {
                op: Some(pb::batch_op::Op::Acquire(acquire("in-session", 0))),
            }],
        })
        .await
        .unwrap();
    session.message().await.unwrap().unwrap();

    // An acquire waiting server-side for a busy name.
    c.acquire(acquire("busy", 0)).await.unwrap();
    let mut waiter = LeaseServiceClient::new(channel(&server).await);
    let waiting = tokio::spawn(async move { waiter.acquire(acquire("busy", 8 * SEC)).await });
    guarded("the acquire waiting", async {
        loop {
            let d = c
                .describe(pb::DescribeRequest {
                    names: vec!["busy".into()],
                })
                .await
                .unwrap()
                .into_inner();
            if d.names[0].waiters == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;

    let kill = std::process::Command::new("kill")
        .args(["-TERM", &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());

    let status = guarded("health NOT_SERVING", health.message()).await;
    assert_eq!(status.unwrap().unwrap().status(), ServingStatus::NotServing);
    let waited = guarded("the waiting acquire ending", waiting).await.unwrap();
    let refused = waited.expect_err("a wait cannot end in a grant while stopping");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("shutting down"), "{refused:?}");
    let closed = guarded("the session closing", session.message())
        .await
        .expect_err("the session ends with a status");
    assert_eq!(closed.code(), Code::Unavailable, "{closed:?}");
    assert!(closed.message().contains("shutting down"), "{closed:?}");

    // The health watch keeps its connection open; the process exits anyway.
    let mut server = server;
    let exited = guarded(
        "the process exiting",
        tokio::task::spawn_blocking(move || {
            let status = server.wait_exit();
            (server, status)
        }),
    )
    .await
    .unwrap();
    assert!(exited.1.success(), "{:?}", exited.1);
    drop((health, requests, c));
}
