//! Issue 52, part 2: what queued `List` calls hold, and whose turn a page
//! is. Over a real `bagel-server`:
//! * a client that never reads (HTTP/2 window 0) and sends many Lists at
//!   once: each call reserves its answer's bytes when admitted, before it
//!   waits for its page turn, so what the server holds stays within the
//!   unread-answer budget, and the calls past it are refused
//!   `RESOURCE_EXHAUSTED` naming the limit, while a client that reads is
//!   served (in shorter pages);
//! * one tenant's flood of Lists does not starve another's: page turns go
//!   to the identities waiting in turn, so tenant A's List is answered
//!   while most of tenant B's are still queued (observed by order, not
//!   by time), and B's calls past its queue are refused naming the flag.

use std::collections::HashMap;

use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::ServerProcess;
use bagel_tests::raw::{grpc_frame, grpc_request};
use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use tonic::transport::Channel;

const SEC: u64 = 1_000_000;
/// Per-connection share and server budget of unread answers in the first
/// test: ~10 and ~20 pages of [`NAMES`] names.
const SHARE: u64 = 1_000_000;
const TOTAL: u64 = 2_000_000;
/// What a connection holding nothing may reserve past the server's budget
/// (`transport::answers::FLOOR`).
const FLOOR: u64 = 64 << 10;
/// Names held: one List page of all of them is ~100 KB.
const NAMES: usize = 2_048;

const TOKEN_A: &str = "tok-tenant-a-1f0c";
const TOKEN_B: &str = "tok-tenant-b-9d37";

/// Holds `n` names `t/NNNNN` for 2 minutes, through `c`.
async fn fill<C>(c: &mut LeaseServiceClient<C>, n: usize)
where
    C: tonic::client::GrpcService<tonic::body::Body>,
    C::Error: Into<tonic::codegen::StdError>,
    C::ResponseBody: tonic::codegen::Body<Data = Bytes> + Send + 'static,
    <C::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    for first in (0..n).step_by(64) {
        let names = (first..n.min(first + 64)).map(|i| format!("t/{i:05}")).collect();
        c.acquire(pb::AcquireRequest {
            names,
            owner: "filler".into(),
            mode: pb::Mode::Full.into(),
            ttl_us: 120 * SEC,
            ..Default::default()
        })
        .await
        .unwrap();
    }
}

/// A raw HTTP/2 connection whose streams never get a window: the server
/// can send an answer's head (and a refusal) but not a byte of its body.
async fn never_reading(server: &ServerProcess) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake(tcp)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client.ready().await.unwrap()
}

/// What a List's response head said: answered (its body unread), or
/// refused with this code and message.
/// An answered call keeps its stream (dropped, the client would reset it
/// and the server free its answer).
#[derive(Debug)]
enum Head {
    Answered(http::Response<h2::RecvStream>),
    Refused(i32, String),
}

/// Sends a List of every name under `t/` (one page) with `token`, and
/// returns a future of its response head, which needs no window.
async fn send_list(
    server: &ServerProcess,
    client: &mut h2::client::SendRequest<Bytes>,
    token: Option<&str>,
    page_size: u32,
) -> impl std::future::Future<Output = Head> + use<> {
    let list = pb::ListRequest {
        prefix: "t/".into(),
        page_size,
        page_token: String::new(),
    };
    send_call(server, client, token, "List", grpc_frame(&list)).await
}

/// Sends `message` to the lease service's `method` with `token`, and
/// returns a future of its response head.
async fn send_call(
    server: &ServerProcess,
    client: &mut h2::client::SendRequest<Bytes>,
    token: Option<&str>,
    method: &str,
    message: Bytes,
) -> impl std::future::Future<Output = Head> + use<> {
    let request = grpc_request(server, method, token);
    let mut ready = client.clone().ready().await.unwrap();
    let (response, mut send) = ready.send_request(request, false).unwrap();
    send.send_data(message, true).unwrap();
    async move {
        let response = response.await.unwrap();
        match response.headers().get("grpc-status") {
            None => Head::Answered(response),
            Some(code) => {
                let message = response
                    .headers()
                    .get("grpc-message")
                    .map(|m| m.to_str().unwrap().to_owned())
                    .unwrap_or_default();
                Head::Refused(code.to_str().unwrap().parse().unwrap(), message)
            }
        }
    }
}

/// A `Batch` message of `n` renewals of a lease that does not exist: each
/// answered with an error, ~100 bytes.
fn unknown_renewals(n: usize) -> Bytes {
    let renew = pb::BatchOp {
        op: Some(pb::batch_op::Op::Renew(pb::RenewRequest {
            lease_id: "0123456789abcdef0123456789abcdef".into(),
            token: "not-a-token".into(),
            ttl_us: SEC,
            ..Default::default()
        })),
    };
    grpc_frame(&pb::BatchRequest {
        lean: false,
        ops: vec![renew; n],
    })
}

/// The value of an unlabelled sample on the server's /metrics.
async fn metric(server: &ServerProcess, name: &str) -> u64 {
    metric_in(&metrics(server).await, name)
}

async fn metrics(server: &ServerProcess) -> String {
    reqwest::get(format!("{}/metrics", server.http_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of series `name` (with its labels) in a `/metrics` text.
fn metric_in(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}")) as u64
}

/// [`metric_in`], or 0 where the series is absent (an identity a pool
/// never named).
fn metric_or_zero(text: &str, name: &str) -> u64 {
    match text.lines().any(|l| l.starts_with(name)) {
        true => metric_in(text, name),
        false => 0,
    }
}

/// Every name under `t/`, paging `page_size` at a time; and the pages.
async fn page_through<C>(c: &mut LeaseServiceClient<C>, page_size: u32) -> (Vec<String>, usize)
where
    C: tonic::client::GrpcService<tonic::body::Body>,
    C::Error: Into<tonic::codegen::StdError>,
    C::ResponseBody: tonic::codegen::Body<Data = Bytes> + Send + 'static,
    <C::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let (mut names, mut token, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let req = pb::ListRequest {
            prefix: "t/".into(),
            page_size,
            page_token: token,
        };
        let page = c.list(req).await.unwrap().into_inner();
        pages += 1;
        names.extend(page.names.into_iter().map(|n| n.name));
        if page.next_page_token.is_empty() {
            return (names, pages);
        }
        token = page.next_page_token;
    }
}

/// Three connections that never read each send 20 Lists of ~100 KB at
/// once, all queued behind one page turn. Before, each call was admitted
/// while its connection held nothing yet (its answer was made later), so
/// all 60 answers were held: ~6 MB of a 2 MB budget. Now each reserves
/// its answer as it is admitted: what the server holds stays within the
/// budget, and the calls past it are refused naming the limit.
#[tokio::test]
async fn queued_lists_of_a_client_that_never_reads_stay_within_the_answer_budget() {
    let (share, total) = (SHARE.to_string(), TOTAL.to_string());
    let server = ServerProcess::start_ready(&[
        "--max-ttl",
        "2m",
        "--list-max-page",
        "5000",
        "--list-pages",
        "1",
        "--max-unread-answer-bytes-per-connection",
        &share,
        "--max-unread-answer-bytes",
        &total,
        "--answer-stall-timeout",
        "0",
        "--http",
        "127.0.0.1:0",
    ])
    .await;
    let mut c = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    fill(&mut c, NAMES).await;

    let mut heads = Vec::new();
    for _ in 0..3 {
        let mut client = never_reading(&server).await;
        for _ in 0..20 {
            heads.push(send_list(&server, &mut client, None, 5000).await);
        }
    }
    let (mut answered, mut refused) = (Vec::new(), 0);
    for head in heads {
        match head.await {
            Head::Answered(response) => answered.push(response),
            Head::Refused(code, message) => {
                assert_eq!(code, tonic::Code::ResourceExhausted as i32, "{message}");
                assert!(message.contains("--max-unread-answer-bytes"), "{message}");
                refused += 1;
            }
        }
    }
    let held = metric(&server, "bagel_unread_answers_bytes").await;
    eprintln!(
        "60 Lists queued unread: {} answered, {refused} refused, {held} bytes held",
        answered.len()
    );
    assert!(answered.len() >= 3, "each connection is answered at least once");
    assert!(
        held >= answered.len() as u64 * 50_000,
        "the answers made are held: {held} bytes"
    );
    assert!(refused > 0, "the calls past the budget are refused");
    assert!(
        held <= TOTAL + 3 * FLOOR,
        "{held} bytes of unread answers held, over the budget of {TOTAL} (+{FLOOR} per connection)"
    );
    assert!(
        metric(&server, "bagel_unread_answers_refused_total").await >= refused,
        "the refusals are counted"
    );

    // A client that reads is served meanwhile: in pages cut to what the
    // server has room for, every name, in order.
    let (names, pages) = page_through(&mut c, 5000).await;
    let expected: Vec<String> = (0..NAMES).map(|i| format!("t/{i:05}")).collect();
    assert_eq!(names, expected);
    eprintln!("a reading client paged through {NAMES} names in {pages} pages");

    // The unread answers reset by their client: everything reserved and
    // charged is given back (the server sees the resets in its own time).
    drop(answered);
    let mut polls = 0;
    while metric(&server, "bagel_unread_answers_bytes").await > 0 {
        polls += 1;
        assert!(
            polls < 10_000,
            "unread answers still held after their streams were reset"
        );
        tokio::task::yield_now().await;
    }
}

/// Four connections that never read each send 50 Batches of 1,024
/// renewals of leases that do not exist (each answered with ~100 KB of
/// errors) at once. Before, a Batch was admitted while its connection held
/// nothing yet, and its answer charged once made: every Batch that arrived
/// before the first answers were made was answered. Now each reserves its
/// operations' bound as its request is read, and the ones past the budget
/// are refused naming the limit.
#[tokio::test]
async fn batches_of_a_client_that_never_reads_reserve_their_answers_by_their_operations() {
    let total = TOTAL.to_string();
    let server = ServerProcess::start_ready(&[
        "--max-unread-answer-bytes",
        &total,
        "--answer-stall-timeout",
        "0",
        "--http",
        "127.0.0.1:0",
    ])
    .await;
    let batch = unknown_renewals(1024);
    let mut heads = Vec::new();
    for _ in 0..4 {
        let mut client = never_reading(&server).await;
        for _ in 0..50 {
            heads.push(send_call(&server, &mut client, None, "Batch", batch.clone()).await);
        }
    }
    let (mut answered, mut refused) = (Vec::new(), 0);
    for head in heads {
        match head.await {
            Head::Answered(response) => answered.push(response),
            Head::Refused(code, message) => {
                assert_eq!(code, tonic::Code::ResourceExhausted as i32, "{message}");
                assert!(message.contains("--max-unread-answer-bytes"), "{message}");
                refused += 1;
            }
        }
    }
    let held = metric(&server, "bagel_unread_answers_bytes").await;
    eprintln!(
        "200 Batches of 1024 operations unread: {} answered, {refused} refused, {held} bytes held",
        answered.len()
    );
    assert!(!answered.is_empty());
    assert!(refused > 0, "the Batches past the budget are refused");
    assert!(
        held <= TOTAL,
        "{held} bytes of unread answers held, over the budget of {TOTAL}"
    );
}

/// Two tenants by bearer token, both reading `t/`; A also leases it.
fn two_tenants() -> String {
    let hash = |t: &str| bagel_proto::hex::encode(&bagel_proto::acl::hash_token(t));
    format!(
        r#"
[[token]]
identity = "tenant-a"
sha256 = "{}"

[[token]]
identity = "tenant-b"
sha256 = "{}"

[[grant]]
identity = "tenant-a"
prefixes = ["t/"]
permissions = ["lease", "read"]

[[grant]]
identity = "tenant-b"
prefixes = ["t/"]
permissions = ["read"]
"#,
        hash(TOKEN_A),
        hash(TOKEN_B)
    )
}

/// A server under [`two_tenants`] with `--max-ttl 2m`, `--list-max-page
/// 5000`, no answer stall timeout, a side port and `extra`; and tenant
/// A's client, holding [`NAMES`] names.
async fn two_tenant_server(extra: &[&str]) -> (tempfile::TempDir, ServerProcess, TenantClient) {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.toml");
    std::fs::write(&acl, two_tenants()).unwrap();
    let mut args = vec![
        "--max-ttl",
        "2m",
        "--acl",
        acl.to_str().unwrap(),
        "--list-max-page",
        "5000",
        "--answer-stall-timeout",
        "0",
        "--http",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let server = ServerProcess::start_ready(&args).await;
    let mut a = tenant_client(&server, TOKEN_A).await;
    fill(&mut a, NAMES).await;
    (dir, server, a)
}

/// A client sending `authorization: Bearer <token>` on every call.
type TenantClient = LeaseServiceClient<tonic::service::interceptor::InterceptedService<Channel, Bearer>>;

#[derive(Clone)]
struct Bearer(tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

/// A tenant's client of `server`, with its token.
async fn tenant_client(server: &ServerProcess, token: &str) -> TenantClient {
    let channel = Channel::from_shared(server.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let bearer = Bearer(format!("Bearer {token}").parse().unwrap());
    LeaseServiceClient::with_interceptor(channel, bearer)
}

/// Tenant B floods the one page turn with 200 Lists (its queue holds 100);
/// tenant A then asks for one page. Before, turns went first come, first
/// served: A's page came after every one of B's. Now turns go to the
/// identities waiting in turn: A's page is answered while most of B's are
/// still queued, and B's calls past its queue are refused naming the flag.
/// And A, which reads little, does not even wait for a turn: its page is
/// read at once on the light lane (counted on `/metrics`), B's never.
#[tokio::test]
async fn a_flood_of_lists_from_one_tenant_does_not_starve_another_tenants_list() {
    const FLOOD: usize = 200;
    const QUEUE: u64 = 100;
    let queue = QUEUE.to_string();
    let (_dir, server, _a) = two_tenant_server(&[
        "--list-pages",
        "1",
        "--max-queued-lists-per-identity",
        &queue,
        // B's answers, left unread, are not what this test is about.
        "--max-unread-answer-bytes-per-connection",
        "100000000000",
        "--max-unread-answer-bytes",
        "100000000000",
    ])
    .await;

    // B's flood, on two connections (100 streams each), none awaited yet.
    let mut flood = Vec::new();
    for _ in 0..2 {
        let mut client = never_reading(&server).await;
        for _ in 0..FLOOD / 2 {
            flood.push(send_list(&server, &mut client, Some(TOKEN_B), 5000).await);
        }
    }
    // Once half of B's queue waits, A asks for a page.
    let mut waiting = metric(&server, "bagel_list_turns_waiting").await;
    while waiting < QUEUE / 2 {
        tokio::task::yield_now().await;
        waiting = metric(&server, "bagel_list_turns_waiting").await;
    }
    let light_before = metric(&server, "bagel_list_reads_light_total").await;
    let mut mine = never_reading(&server).await;
    let mine = send_list(&server, &mut mine, Some(TOKEN_A), 10).await;

    // Every answer's head in the order they come; B's before A's counted.
    let mut heads: FuturesUnordered<_> = flood
        .into_iter()
        .map(|f| {
            Box::pin(async move { (false, f.await) })
                as std::pin::Pin<Box<dyn std::future::Future<Output = _>>>
        })
        .collect();
    heads.push(Box::pin(async move { (true, mine.await) }));
    let (mut before_a, mut after_a, mut a_done) = (0, 0, false);
    let mut unread = Vec::new();
    let mut refusals: HashMap<String, usize> = HashMap::new();
    let mut b_waiting_at_a = 0;
    while let Some((is_a, head)) = heads.next().await {
        match (is_a, head) {
            (true, head) => {
                assert!(matches!(head, Head::Answered(_)), "{head:?}");
                a_done = true;
                // Whose calls wait is on /metrics by identity: all B's.
                let text = metrics(&server).await;
                b_waiting_at_a = metric_in(&text, "bagel_list_turns_waiting");
                // A, with no other read in flight and none lately, was
                // read at once on the light lane, without a turn; none of
                // B's, many in flight at once, was.
                assert_eq!(
                    metric_in(&text, "bagel_list_reads_light_total") - light_before,
                    1,
                    "A's read, alone, is light"
                );
                assert_eq!(
                    metric_in(
                        &text,
                        r#"bagel_share_held{pool="queued_lists",identity="tenant-b"}"#
                    ),
                    b_waiting_at_a
                );
                // A never queued: named with nothing, or not named at all.
                assert_eq!(
                    metric_or_zero(
                        &text,
                        r#"bagel_share_held{pool="queued_lists",identity="tenant-a"}"#
                    ),
                    0
                );
            }
            (false, Head::Answered(response)) => {
                unread.push(response);
                if a_done {
                    after_a += 1;
                } else {
                    before_a += 1;
                }
            }
            (false, Head::Refused(code, message)) => {
                assert_eq!(code, tonic::Code::ResourceExhausted as i32, "{message}");
                *refusals.entry(message).or_default() += 1;
            }
        }
    }
    eprintln!(
        "B: {FLOOD} Lists, {before_a} answered before A's, {after_a} after, refused: {refusals:?}; \
         B's calls waiting when A was answered: {b_waiting_at_a}"
    );
    assert!(
        after_a >= 20,
        "A's List waited behind B's queue: {before_a} of B's pages answered before it, {after_a} after"
    );
    assert!(b_waiting_at_a > 0, "B's queue had drained when A was answered");
    assert!(!refusals.is_empty(), "B's calls past its queue are refused");
    assert!(
        refusals
            .keys()
            .all(|m| m.contains("--max-queued-lists-per-identity") && m.contains("tenant-b")),
        "{refusals:?}"
    );
    // Each refusal is counted against B, none against A, and nothing waits.
    let text = metrics(&server).await;
    assert_eq!(
        metric_in(
            &text,
            r#"bagel_share_refusals_total{pool="queued_lists",identity="tenant-b"}"#
        ),
        refusals.values().sum::<usize>() as u64
    );
    assert_eq!(
        metric_or_zero(
            &text,
            r#"bagel_share_refusals_total{pool="queued_lists",identity="tenant-a"}"#
        ),
        0
    );
    assert_eq!(
        metric_in(
            &text,
            r#"bagel_share_held{pool="queued_lists",identity="tenant-b"}"#
        ),
        0
    );
}

/// Tenant B opens eight connections that never read and sends five Lists
/// of ~180 KB on each: 40 answers, ~7 MB, over a server
/// budget of 2 MB. Before, only the connection's and the server's bounds
/// held: B filled the server's whole budget, and then tenant A's second
/// call on a connection holding an answer was refused (the server was
/// over its budget). Now B holds at most its share over all its
/// connections (`--max-unread-answer-bytes-per-identity`), its calls past
/// it are refused naming that flag (a Batch too, whose answer was
/// reserved before the server knew whose it was), and A is answered.
#[tokio::test]
async fn one_tenants_unread_answers_stay_within_its_share_and_another_tenant_is_answered() {
    const ID_SHARE: u64 = 500_000;
    /// One answer past the share: what an identity holding nothing may take.
    const PAGE: u64 = 200_000;
    let (share, total, id_share) = (SHARE.to_string(), TOTAL.to_string(), ID_SHARE.to_string());
    let (_dir, server, _a) = two_tenant_server(&[
        "--max-unread-answer-bytes-per-connection",
        &share,
        "--max-unread-answer-bytes",
        &total,
        "--max-unread-answer-bytes-per-identity",
        &id_share,
    ])
    .await;

    // One call after the other (each head awaited), so that what B holds
    // grows one answer at a time; refused at B's share, or at a
    // connection's.
    let mut heads = Vec::new();
    for _ in 0..8 {
        let mut client = never_reading(&server).await;
        for _ in 0..5 {
            heads.push(send_list(&server, &mut client, Some(TOKEN_B), 5000).await.await);
        }
    }
    let (mut unread, mut refused, mut by_connection) = (Vec::new(), 0u64, 0);
    for head in heads {
        match head {
            Head::Answered(response) => unread.push(response),
            Head::Refused(code, message) => {
                assert_eq!(code, tonic::Code::ResourceExhausted as i32, "{message}");
                let message = message.replace("%20", " ");
                if message.contains("--max-unread-answer-bytes-per-connection") {
                    by_connection += 1;
                    continue;
                }
                for needle in ["--max-unread-answer-bytes-per-identity", "tenant-b", "its share"] {
                    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
                }
                refused += 1;
            }
        }
    }
    let text = metrics(&server).await;
    let b_held = metric_in(
        &text,
        r#"bagel_share_held{pool="unread_answer_bytes",identity="tenant-b"}"#,
    );
    let held = metric_in(&text, "bagel_unread_answers_bytes");
    eprintln!(
        "B: 40 Lists unread, {} answered, {refused} refused at its share, {by_connection} at a \
         connection's; B holds {b_held} bytes, the server {held}",
        unread.len()
    );
    assert!(!unread.is_empty() && refused > 0);
    assert!(
        b_held >= 50_000 * unread.len() as u64,
        "B's answers are held: {b_held}"
    );
    assert!(
        b_held <= ID_SHARE + PAGE,
        "B holds {b_held} bytes of unread answers, over its share of {ID_SHARE} (+ one answer)"
    );
    assert!(
        held < TOTAL / 2,
        "the server holds {held} bytes: B's share left room for others"
    );

    // B's Batch, its answer reserved by its operations before anyone knew
    // whose it was, is refused at B's share all the same.
    let batch = unknown_renewals(64);
    let mut client = never_reading(&server).await;
    match send_call(&server, &mut client, Some(TOKEN_B), "Batch", batch)
        .await
        .await
    {
        Head::Refused(code, message) => {
            assert_eq!(code, tonic::Code::ResourceExhausted as i32, "{message}");
            let message = message.replace("%20", " ");
            assert!(
                message.contains("--max-unread-answer-bytes-per-identity"),
                "{message}"
            );
            refused += 1;
        }
        head => panic!("B's Batch past its share was answered: {head:?}"),
    }

    // A, on a connection that never reads either, is answered three times:
    // the server is within its budget, whatever B left unread.
    let mut mine = never_reading(&server).await;
    for _ in 0..3 {
        let head = send_list(&server, &mut mine, Some(TOKEN_A), 5000).await.await;
        assert!(matches!(head, Head::Answered(_)), "{head:?}");
        unread.push(match head {
            Head::Answered(r) => r,
            Head::Refused(..) => unreachable!(),
        });
    }
    let text = metrics(&server).await;
    assert_eq!(
        metric_in(
            &text,
            r#"bagel_share_refusals_total{pool="unread_answer_bytes",identity="tenant-b"}"#
        ),
        refused
    );
    assert_eq!(
        metric_in(
            &text,
            r#"bagel_share_refusals_total{pool="unread_answer_bytes",identity="tenant-a"}"#
        ),
        0
    );
    assert!(
        metric_in(
            &text,
            r#"bagel_share_held{pool="unread_answer_bytes",identity="tenant-a"}"#
        ) >= 3 * 50_000
    );
}

/// The server's `List` pages are read on threads of their own at a lower
/// CPU priority than the threads that serve grants (so that one tenant's
/// reads cannot take the CPU its neighbours' renewals need): after a
/// `List`, the server has `--list-pages` reader threads, each at nice 10,
/// and its runtime's threads at the priority it started with.
#[tokio::test]
async fn list_pages_are_read_on_threads_of_a_lower_priority() {
    let server = ServerProcess::start_ready(&["--list-pages", "2", "--max-ttl", "2m"]).await;
    let channel = Channel::from_shared(server.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = LeaseServiceClient::new(channel);
    fill(&mut c, 10).await;
    let (names, _) = page_through(&mut c, 4).await;
    assert_eq!(names.len(), 10);
    // A thread's nice from its /proc stat: field 19, the 17th after the
    // parenthesised name.
    let nice = |stat: &str| -> i64 {
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        after.split(' ').nth(16).unwrap().parse().unwrap()
    };
    // (thread name, nice) of every thread of the server.
    let tasks = std::fs::read_dir(format!("/proc/{}/task", server.pid())).unwrap();
    let threads: Vec<(String, i64)> = tasks
        .map(|t| {
            let dir = t.unwrap().path();
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap();
            let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
            (comm.trim().to_owned(), nice(&stat))
        })
        .collect();
    // The server's runtime keeps the priority it inherited from us.
    let ours = nice(&std::fs::read_to_string("/proc/thread-self/stat").unwrap());
    let readers: Vec<i64> = threads
        .iter()
        .filter(|(name, _)| name.starts_with("bagel-reader-"))
        .map(|(_, nice)| *nice)
        .collect();
    assert_eq!(readers, vec![10, 10], "{threads:?}");
    let workers: Vec<i64> = threads
        .iter()
        .filter(|(name, _)| name.starts_with("tokio-rt-worker"))
        .map(|(_, nice)| *nice)
        .collect();
    assert!(
        !workers.is_empty() && workers.iter().all(|n| *n == ours),
        "{threads:?}"
    );
}

/// The seconds of counter `name` in a `/metrics` text (fractions kept).
fn seconds_in(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

/// While leases are being granted, pages read in turn take at most
/// `--list-share-while-granting` of the turn's time: after each, the turn
/// stays idle for the read's CPU time × (100 / P − 1), counted on
/// `/metrics`. Before, a tenant listing in a loop took a tenth of the
/// server's core from another tenant's cycles in the answers it had sent
/// (`bagel-bench --noisy-neighbour`: 0.71-0.85x), whatever was granting.
/// At 100 % no turn pauses.
#[tokio::test]
async fn pages_read_in_turn_leave_the_turn_idle_while_leases_are_granted() {
    for (share, pauses) in [("2", true), ("100", false)] {
        let (_dir, server, mut a) = two_tenant_server(&["--list-share-while-granting", share]).await;
        // A cycles one name until B's reading is done: leases are being
        // granted throughout.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let granting = {
            let stop = std::sync::Arc::clone(&stop);
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let grant = a
                        .acquire(pb::AcquireRequest {
                            names: vec!["t/cycle".into()],
                            owner: "cycler".into(),
                            mode: pb::Mode::Full.into(),
                            ttl_us: 10 * SEC,
                            ..Default::default()
                        })
                        .await
                        .unwrap()
                        .into_inner()
                        .grant
                        .unwrap();
                    a.release(pb::ReleaseRequest {
                        lease_id: grant.lease_id,
                        token: grant.token,
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                }
            })
        };
        let mut b = tenant_client(&server, TOKEN_B).await;
        // B reads all of A's names, page after page, until its reading is
        // no longer light: then a page is read in turn.
        let turned_before = metric(&server, "bagel_list_reads_turned_total").await;
        let mut pages = 0;
        while metric(&server, "bagel_list_reads_turned_total").await == turned_before {
            assert!(pages < 10_000, "B's reads stayed light for {pages} pages");
            page_through(&mut b, 5000).await;
            pages += 1;
        }
        // The pause is counted just after the page is answered: wait for
        // it (a bound on the wait, so that no pause fails rather than hangs).
        let paused_now = || async { seconds_in(&metrics(&server).await, "bagel_list_paused_seconds_total") };
        let mut paused = paused_now().await;
        if pauses {
            let counted = tokio::time::timeout(std::time::Duration::from_secs(30), async {
                while paused == 0.0 {
                    tokio::task::yield_now().await;
                    paused = paused_now().await;
                }
            });
            let _ = counted.await;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        granting.await.unwrap();
        assert_eq!(
            paused > 0.0,
            pauses,
            "share {share}%: paused {paused} s after {pages} pages"
        );
    }
}
