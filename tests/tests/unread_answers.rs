//! Answers a client never reads must not stay in the server's memory: a
//! connection that leaves its unary answers unread (HTTP/2 window 0: it
//! answers pings, and a call is in flight, so neither keepalive nor the idle
//! timeout ever closes it) is closed after `--answer-stall-timeout`, and
//! what it held is freed; a connection holding more than its share of
//! unread answers has its new calls refused, naming the limit, while other
//! clients are served.

use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::ServerProcess;
use bagel_tests::raw::grpc_frame;
use bytes::Bytes;
use tonic::transport::Channel;

const SEC: u64 = 1_000_000;
/// Names held, so that one List page (all of them) is ~100 KB.
const NAMES: usize = 2_048;

/// A server holding [`NAMES`] names, started with `args`.
async fn filled_server(args: &[&str]) -> (ServerProcess, LeaseServiceClient<Channel>) {
    let mut all = vec![
        "--max-ttl",
        "2m",
        "--list-max-page",
        "5000",
        "--http",
        "127.0.0.1:0",
    ];
    all.extend_from_slice(args);
    let server = ServerProcess::start_ready(&all).await;
    let mut c = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    for first in (0..NAMES).step_by(64) {
        let names = (first..first + 64).map(|i| format!("unread/{i:05}")).collect();
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
    (server, c)
}

/// A raw HTTP/2 connection whose streams never get a window: the server
/// can send headers but not a byte of any answer. Returns the client and
/// the connection's task, which ends when the server closes it.
async fn never_reading(
    server: &ServerProcess,
) -> (h2::client::SendRequest<Bytes>, tokio::task::JoinHandle<()>) {
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake(tcp)
        .await
        .unwrap();
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (client.ready().await.unwrap(), task)
}

/// Sends a List of every name on `client`, and returns its response head
/// (which needs no window) with the gRPC status if it carries one.
async fn list_unread(
    server: &ServerProcess,
    client: &mut h2::client::SendRequest<Bytes>,
) -> (http::Response<h2::RecvStream>, Option<(i32, String)>) {
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{}/bagel.v1.LeaseService/List", server.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let mut ready = client.clone().ready().await.unwrap();
    let (response, mut send) = ready.send_request(request, false).unwrap();
    let list = pb::ListRequest {
        prefix: String::new(),
        page_size: 5000,
        page_token: String::new(),
    };
    send.send_data(grpc_frame(&list), true).unwrap();
    let response = response.await.unwrap();
    let status = response.headers().get("grpc-status").map(|code| {
        let message = response
            .headers()
            .get("grpc-message")
            .map(|m| m.to_str().unwrap().to_owned())
            .unwrap_or_default();
        (code.to_str().unwrap().parse().unwrap(), message)
    });
    (response, status)
}

/// The value of an unlabelled sample on the server's /metrics.
async fn metric(server: &ServerProcess, name: &str) -> u64 {
    let text = reqwest::get(format!("{}/metrics", server.http_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}")) as u64
}

async fn list_all(c: &mut LeaseServiceClient<Channel>) -> usize {
    let req = pb::ListRequest {
        prefix: String::new(),
        page_size: 5000,
        page_token: String::new(),
    };
    c.list(req).await.unwrap().into_inner().names.len()
}

#[tokio::test]
async fn a_connection_that_leaves_its_answers_unread_is_closed_and_what_it_held_freed() {
    // `UNREAD_ANSWERS_PAGES` raises it (100 streams a connection), to
    // measure the server's memory under many unread pages.
    let pages: usize = std::env::var("UNREAD_ANSWERS_PAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let (server, mut c) = filled_server(&["--answer-stall-timeout", "3s"]).await;
    let before = server.rss();
    let mut unread = Vec::new();
    let mut closings = Vec::new();
    let mut refused = 0;
    for first in (0..pages).step_by(100) {
        let (mut client, closed) = never_reading(&server).await;
        closings.push(closed);
        for _ in first..pages.min(first + 100) {
            match list_unread(&server, &mut client).await {
                (response, None) => unread.push(response),
                // Past a connection's share (16 MiB: some 90 pages here).
                (_, Some((code, message))) => {
                    assert_eq!(code, tonic::Code::ResourceExhausted as i32, "{message}");
                    assert!(message.contains("--max-unread-answer-bytes"), "{message}");
                    refused += 1;
                }
            }
        }
    }
    let held = metric(&server, "bagel_unread_answers_bytes").await;
    eprintln!(
        "{pages} pages asked, {} answered and left unread, {refused} refused: {held} bytes held, \
         server RSS +{} MiB",
        unread.len(),
        server.rss().saturating_sub(before) >> 20
    );
    assert!(
        unread.len() >= 20,
        "the first pages of each connection are answered"
    );
    assert!(
        held > unread.len() as u64 * NAMES as u64 * 20,
        "{} unread pages of {NAMES} names are held: {held} bytes",
        unread.len()
    );
    // A client that reads is served meanwhile.
    assert_eq!(list_all(&mut c).await, NAMES);

    // The server closes each connection (its task ends)...
    let connections = closings.len() as u64;
    for closed in closings {
        closed.await.unwrap();
    }
    // ... and what it held is freed.
    assert_eq!(metric(&server, "bagel_unread_answers_bytes").await, 0);
    assert_eq!(
        metric(&server, "bagel_unread_answers_closed_total").await,
        connections
    );
    eprintln!(
        "after the stall bound: server RSS +{} MiB",
        server.rss().saturating_sub(before) >> 20
    );
    assert_eq!(list_all(&mut c).await, NAMES);
}

#[tokio::test]
async fn a_connection_over_its_share_of_unread_answers_is_refused_naming_the_limit() {
    // One page (~100 KB) is within the share; two are over it.
    let (server, mut c) = filled_server(&[
        "--max-unread-answer-bytes-per-connection",
        "150000",
        "--answer-stall-timeout",
        "0",
    ])
    .await;
    let (mut client, _conn) = never_reading(&server).await;
    let mut answered = Vec::new();
    let refusal = loop {
        assert!(answered.len() < 10, "10 unread pages answered, none refused");
        let (response, status) = list_unread(&server, &mut client).await;
        match status {
            None => answered.push(response),
            Some(refusal) => break refusal,
        }
    };
    assert!(!answered.is_empty(), "answers are made until the share is passed");
    assert_eq!(refusal.0, tonic::Code::ResourceExhausted as i32, "{refusal:?}");
    assert!(
        refusal.1.contains("--max-unread-answer-bytes-per-connection"),
        "{refusal:?}"
    );
    assert_eq!(metric(&server, "bagel_unread_answers_refused_total").await, 1);
    // Another connection is served.
    assert_eq!(list_all(&mut c).await, NAMES);
}
