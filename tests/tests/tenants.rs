//! Issue 52: the server's pooled slots (sessions, watchers, waiting
//! acquires) are shared by identity. Under `--acl`, one identity that
//! fills a pool stops at its share (a quarter of the pool by default),
//! refused with `RESOURCE_EXHAUSTED` naming the share, and another
//! identity still gets a slot; a caller without an identity is refused
//! before it takes one. Real server binary, bearer tokens over gRPC.

use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::{ServerOptions, ServerProcess};
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

const SEC: u64 = 1_000_000;

const TOKEN_A: &str = "tenants-test-token-a";
const TOKEN_B: &str = "tenants-test-token-b";

/// Two tenants, each leasing and reading its own prefix.
fn policy() -> String {
    let hash = |t: &str| bagel_proto::hex::encode(&bagel_proto::acl::hash_token(t));
    format!(
        r#"
[[token]]
identity = "team-a"
sha256 = "{}"

[[token]]
identity = "team-b"
sha256 = "{}"

[[grant]]
identity = "team-a"
prefixes = ["team-a/"]
permissions = ["lease", "read"]

[[grant]]
identity = "team-b"
prefixes = ["team-b/"]
permissions = ["lease", "read"]
"#,
        hash(TOKEN_A),
        hash(TOKEN_B)
    )
}

/// Adds `authorization: Bearer <token>` to every call, when it has one.
#[derive(Clone)]
struct Token(Option<&'static str>);

impl tonic::service::Interceptor for Token {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(t) = self.0 {
            req.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        Ok(req)
    }
}

type Client = LeaseServiceClient<InterceptedService<Channel, Token>>;

/// A server under [`policy`] with `extra` flags (and its side port), and
/// the directory holding the policy.
struct Setup {
    _dir: tempfile::TempDir,
    server: ServerProcess,
}

impl Setup {
    async fn start(extra: &[&str]) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let acl = dir.path().join("acl.toml");
        std::fs::write(&acl, policy()).unwrap();
        let acl = acl.to_str().unwrap().to_owned();
        // Leases outlast every test, and waits are refused or granted, never
        // timed out.
        let mut args = vec![
            "--unsafe-skip-restart-wait",
            "--http",
            "127.0.0.1:0",
            "--acl",
            &acl,
            "--max-ttl",
            "60s",
            "--max-wait",
            "60s",
        ];
        args.extend_from_slice(extra);
        let server = ServerProcess::start_with(&args, ServerOptions::default()).await;
        server.wait_ready().await;
        Setup { _dir: dir, server }
    }

    /// A client sending `token` (none: no authorization header).
    async fn client(&self, token: Option<&'static str>) -> Client {
        let channel = Channel::from_shared(self.server.url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        LeaseServiceClient::with_interceptor(channel, Token(token))
    }

    async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.server.http_url()))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

async fn info(c: &mut Client) -> pb::ServerInfoResponse {
    c.server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner()
}

async fn load(c: &mut Client) -> pb::ServerLoad {
    info(c).await.load.expect("ServerInfo.load")
}

/// A session that sends `first` (if any) and then nothing, open until
/// dropped.
async fn session(
    c: &mut Client,
    first: Option<pb::BatchRequest>,
) -> Result<tonic::Streaming<pb::BatchResponse>, tonic::Status> {
    use futures::StreamExt as _;
    let requests = futures::stream::iter(first).chain(futures::stream::pending());
    c.session(requests).await.map(tonic::Response::into_inner)
}

fn acquire(name: &str, wait_us: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        names: vec![name.to_owned()],
        ttl_us: 50 * SEC,
        owner: "whoever".into(),
        mode: pb::Mode::Full.into(),
        wait_us,
        ..Default::default()
    }
}

/// Asserts a refusal at `identity`'s share of `pool` (holding `held` of
/// `size`), naming the flag.
#[track_caller]
fn assert_share_refusal(
    status: &tonic::Status,
    identity: &str,
    held: usize,
    size: usize,
    pool: &str,
    flag: &str,
) {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let m = status.message();
    for needle in [
        format!("identity {identity:?} holds {held} of the {size} {pool}"),
        "its share".to_owned(),
        format!("--{flag}"),
    ] {
        assert!(m.contains(&needle), "{m:?} lacks {needle:?}");
    }
}

/// Eight sessions, a share of two: team B gets two, its six more are
/// refused naming the share, and team A still opens one, which serves.
#[tokio::test]
async fn one_identity_holds_at_most_its_share_of_sessions_and_another_still_gets_one() {
    let s = Setup::start(&["--max-sessions", "8"]).await;
    let mut a = s.client(Some(TOKEN_A)).await;
    let mut b = s.client(Some(TOKEN_B)).await;

    let mut held = Vec::new();
    let mut refused = Vec::new();
    for _ in 0..8 {
        match session(&mut b, None).await {
            Ok(stream) => held.push(stream),
            Err(status) => refused.push(status),
        }
    }
    assert_eq!((held.len(), refused.len()), (2, 6), "{refused:?}");
    for status in &refused {
        assert_share_refusal(status, "team-b", 2, 8, "sessions", "max-sessions-per-identity");
    }

    let batch = pb::BatchRequest {
        lean: false,
        ops: vec![pb::BatchOp {
            op: Some(pb::batch_op::Op::Acquire(acquire("team-a/1", 0))),
        }],
    };
    let mut answers = session(&mut a, Some(batch)).await.expect("team A's session");
    let answer = answers.message().await.unwrap().expect("an answer");
    assert!(
        matches!(answer.results[0].result, Some(pb::batch_result::Result::Grant(_))),
        "{answer:?}"
    );
    assert_eq!(load(&mut a).await.sessions, 3);
    assert_eq!(info(&mut a).await.limits.unwrap().max_sessions_per_identity, 2);

    let metrics = s.metrics().await;
    for line in [
        r#"bagel_share_held{pool="sessions",identity="team-b"} 2"#,
        r#"bagel_share_held{pool="sessions",identity="team-a"} 1"#,
        r#"bagel_share_refusals_total{pool="sessions",identity="team-b"} 6"#,
    ] {
        assert!(metrics.lines().any(|l| l == line), "no {line:?} in\n{metrics}");
    }
}

/// Eight watchers, a share of two: team B's third watch of its own
/// prefix is refused naming the share, and team A still watches.
#[tokio::test]
async fn one_identity_holds_at_most_its_share_of_watchers_and_another_still_watches() {
    let s = Setup::start(&["--max-watchers", "8"]).await;
    let mut a = s.client(Some(TOKEN_A)).await;
    let mut b = s.client(Some(TOKEN_B)).await;
    let watch = |prefix: &str| pb::WatchRequest {
        prefix: prefix.to_owned(),
        ..Default::default()
    };

    let mut held = Vec::new();
    let mut refused = Vec::new();
    for _ in 0..8 {
        match b.watch(watch("team-b/")).await {
            Ok(stream) => held.push(stream.into_inner()),
            Err(status) => refused.push(status),
        }
    }
    assert_eq!((held.len(), refused.len()), (2, 6), "{refused:?}");
    for status in &refused {
        assert_share_refusal(status, "team-b", 2, 8, "watchers", "max-watchers-per-identity");
    }

    let mut events = a
        .watch(watch("team-a/"))
        .await
        .expect("team A's watch")
        .into_inner();
    a.acquire(acquire("team-a/1", 0)).await.unwrap();
    let event = events.message().await.unwrap().expect("an event");
    assert_eq!(event.name, "team-a/1");
    assert_eq!(load(&mut a).await.watchers, 3);
    assert_eq!(info(&mut a).await.limits.unwrap().max_watchers_per_identity, 2);
}

/// Eight waiting acquires, a share of two: team B's third acquire
/// waiting for its own busy name is refused at once naming the share,
/// and team A's still waits, and is granted when its name is released.
#[tokio::test]
async fn one_identity_holds_at_most_its_share_of_waiting_acquires_and_another_still_waits() {
    let s = Setup::start(&["--max-waiters", "8"]).await;
    let mut a = s.client(Some(TOKEN_A)).await;
    let mut b = s.client(Some(TOKEN_B)).await;
    let held_a = a
        .acquire(acquire("team-a/x", 0))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    b.acquire(acquire("team-b/x", 0)).await.unwrap();

    let mut waiting = Vec::new();
    for n in 1..=2 {
        let mut b = b.clone();
        waiting.push(tokio::spawn(async move {
            b.acquire(acquire("team-b/x", 30 * SEC)).await
        }));
        while load(&mut a).await.waiters < n {
            tokio::task::yield_now().await;
        }
    }
    for _ in 0..6 {
        let status = b.acquire(acquire("team-b/x", 30 * SEC)).await.unwrap_err();
        assert_share_refusal(
            &status,
            "team-b",
            2,
            8,
            "waiting acquires",
            "max-waiters-per-identity",
        );
    }

    let mut a2 = a.clone();
    let waits_a = tokio::spawn(async move { a2.acquire(acquire("team-a/x", 30 * SEC)).await });
    while load(&mut a).await.waiters < 3 {
        tokio::task::yield_now().await;
    }
    a.release(pb::ReleaseRequest {
        lease_id: held_a.lease_id,
        token: held_a.token,
        ..Default::default()
    })
    .await
    .unwrap();
    waits_a
        .await
        .unwrap()
        .expect("team A's waiting acquire is granted");
    assert!(
        waiting.iter().all(|w| !w.is_finished()),
        "team B's two still wait"
    );
    assert_eq!(info(&mut a).await.limits.unwrap().max_waiters_per_identity, 2);
}

/// Callers without an identity (no token, or one the policy does not
/// know) are refused their sessions before taking a slot: however many
/// try, a tenant still opens one, and only it is counted.
#[tokio::test]
async fn callers_without_an_identity_hold_no_session_slot() {
    let s = Setup::start(&["--max-sessions", "4"]).await;
    let mut a = s.client(Some(TOKEN_A)).await;
    let mut nobody = s.client(None).await;
    let mut unknown = s.client(Some("a-token-nobody-was-given")).await;

    let mut attempts = Vec::new();
    for _ in 0..6 {
        attempts.push(session(&mut nobody, None).await);
        attempts.push(session(&mut unknown, None).await);
    }
    let _mine = session(&mut a, None).await.expect("team A's session");
    for attempt in &attempts {
        match attempt {
            Ok(_) => panic!("a caller without an identity opened a session"),
            Err(status) => assert_eq!(status.code(), Code::Unauthenticated, "{status:?}"),
        }
    }
    assert_eq!(load(&mut a).await.sessions, 1);
    // The refusals are the policy's, counted as such; no share is.
    let metrics = s.metrics().await;
    assert!(
        !metrics.contains(r#"bagel_share_held{pool="sessions",identity="""#),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("bagel_acl_unauthenticated_total{") && !l.ends_with(" 0")),
        "{metrics}"
    );
}

/// Eight connections, a share of two: team B's calls on a third
/// connection of its own are refused naming the share, team A still
/// connects, and once one of B's connections closes B's third is served.
#[tokio::test]
async fn one_identity_holds_at_most_its_share_of_connections_and_another_still_connects() {
    let s = Setup::start(&["--max-connections", "8", "--max-connections-per-identity", "2"]).await;
    let mut b1 = s.client(Some(TOKEN_B)).await;
    let mut b2 = s.client(Some(TOKEN_B)).await;
    let mut b3 = s.client(Some(TOKEN_B)).await;
    b1.acquire(acquire("team-b/1", 0))
        .await
        .expect("B's first connection");
    b2.acquire(acquire("team-b/2", 0))
        .await
        .expect("B's second connection");
    let refused = b3.acquire(acquire("team-b/3", 0)).await.unwrap_err();
    assert_share_refusal(
        &refused,
        "team-b",
        2,
        8,
        "connections",
        "max-connections-per-identity",
    );
    let mut a = s.client(Some(TOKEN_A)).await;
    a.acquire(acquire("team-a/1", 0))
        .await
        .expect("team A's connection");

    let held = |metrics: &str, who: &str| {
        let prefix = format!(r#"bagel_share_held{{pool="connections",identity="{who}"}} "#);
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix)?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {prefix:?} in\n{metrics}"))
    };
    let limits = info(&mut a).await.limits.unwrap();
    assert_eq!(limits.max_connections_per_identity, 2);
    assert_eq!(
        limits.max_unread_answer_bytes_per_identity,
        (256 << 20) / 4,
        "a quarter of the budget by default"
    );
    let metrics = s.metrics().await;
    assert_eq!((held(&metrics, "team-b"), held(&metrics, "team-a")), (2, 1));
    assert!(
        metrics
            .lines()
            .any(|l| l == r#"bagel_share_refusals_total{pool="connections",identity="team-b"} 1"#),
        "{metrics}"
    );

    // B's first connection closes; once the server has seen it go, B's
    // third connection is B's second.
    drop(b1);
    let mut polls = 0;
    while held(&s.metrics().await, "team-b") > 1 {
        polls += 1;
        assert!(polls < 10_000, "B's closed connection still counted");
        tokio::task::yield_now().await;
    }
    b3.acquire(acquire("team-b/3", 0))
        .await
        .expect("B's connection, now within its share");
}

/// A raw HTTP/2 connection to `server`, and the task driving it: the
/// task ends when the server closes the connection.
async fn raw_connection(
    server: &ServerProcess,
) -> (h2::client::SendRequest<bytes::Bytes>, tokio::task::JoinHandle<()>) {
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    (client.ready().await.unwrap(), driver)
}

/// Acquires `name` for 50 s on `client` with `token` (none: no
/// authorization header), and returns the call's gRPC status code.
async fn raw_acquire(
    server: &ServerProcess,
    client: &mut h2::client::SendRequest<bytes::Bytes>,
    token: Option<&str>,
    name: &str,
) -> i32 {
    let request = bagel_tests::raw::grpc_request(server, "Acquire", token);
    let mut ready = client.clone().ready().await.unwrap();
    let (response, mut send) = ready.send_request(request, false).unwrap();
    send.send_data(bagel_tests::raw::grpc_frame(&acquire(name, 0)), true)
        .unwrap();
    let response = response.await.unwrap();
    let status = |headers: &http::HeaderMap| {
        headers
            .get("grpc-status")
            .map(|code| code.to_str().unwrap().parse::<i32>().unwrap())
    };
    if let Some(code) = status(response.headers()) {
        return code;
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        body.flow_control().release_capacity(chunk.len()).unwrap();
    }
    let trailers = body.trailers().await.unwrap().expect("trailers");
    status(&trailers).expect("grpc-status")
}

/// Under the policy, a connection whose calls are never identified (no
/// token) is closed the first request timeout after it was accepted,
/// however many refused calls it makes. Before, its first call began it,
/// and it held its connection slot for the whole idle timeout (an hour
/// here): a caller without an identity could hold every slot. A
/// connection of an identified caller, older still, keeps serving.
#[tokio::test]
async fn connections_whose_calls_are_never_identified_are_closed_after_the_first_request_timeout() {
    let s = Setup::start(&["--first-request-timeout", "1s", "--idle-timeout", "1h"]).await;
    let (mut known, _known_driver) = raw_connection(&s.server).await;
    assert_eq!(
        raw_acquire(&s.server, &mut known, Some(TOKEN_A), "team-a/1").await,
        0
    );

    let (mut nobody, driver) = raw_connection(&s.server).await;
    for i in 0..3 {
        let code = raw_acquire(&s.server, &mut nobody, None, &format!("team-a/n{i}")).await;
        assert_eq!(code, Code::Unauthenticated as i32);
    }
    // The server closes it: its driver ends (a guard, not a pace: before,
    // it stayed open for the hour).
    tokio::time::timeout(std::time::Duration::from_secs(60), driver)
        .await
        .expect("the connection of a caller without an identity is still open")
        .unwrap();
    assert_eq!(
        raw_acquire(&s.server, &mut known, Some(TOKEN_A), "team-a/2").await,
        0,
        "the identified caller's connection, accepted before, still serves"
    );
}
