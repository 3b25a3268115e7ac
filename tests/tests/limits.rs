//! Issue 13, items 1 and 5: what one connection can make the server hold
//! is bounded (streams, announced and partly received message bytes,
//! decoded elements), idle connections are closed, and an accept loop at
//! the file-descriptor limit backs off. Memory is the server's own RSS.

use std::time::Duration;

use bagel_client::Micros;
use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::ServerProcess;
use bagel_tests::raw::raw_call;
use bytes::Bytes;
use futures::FutureExt as _;
use tokio::io::AsyncReadExt as _;
use tonic::Code;
use tonic::transport::Channel;

const MIB: u64 = 1 << 20;

/// An HTTP/2 connection without a gRPC client on top, and its ping.
async fn h2_connect(server: &ServerProcess) -> (h2::client::SendRequest<Bytes>, h2::PingPong) {
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (client, mut conn) = h2::client::handshake(tcp).await.unwrap();
    let mut ping = conn.ping_pong().expect("ping_pong");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    // The answer comes after the server's SETTINGS (its stream limit).
    ping.ping(h2::Ping::opaque()).await.unwrap();
    (client.ready().await.unwrap(), ping)
}

fn grpc_request(server: &ServerProcess, method: &str) -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri(format!("http://{}/bagel.v1.LeaseService/{method}", server.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

/// A gRPC message prefix: not compressed, `len` bytes announced.
fn prefix(len: u32) -> Bytes {
    let mut b = vec![0u8];
    b.extend_from_slice(&len.to_be_bytes());
    Bytes::from(b)
}

/// The status of a gRPC response (trailers-only or in the trailers).
async fn grpc_status(response: h2::client::ResponseFuture) -> (i32, String) {
    let response = response.await.unwrap();
    let read = |h: &http::HeaderMap| {
        h.get("grpc-status").map(|code| {
            let code: i32 = code.to_str().unwrap().parse().unwrap();
            let message = h
                .get("grpc-message")
                .map(|m| percent_decode(m.to_str().unwrap()))
                .unwrap_or_default();
            (code, message)
        })
    };
    if let Some(s) = read(response.headers()) {
        return s;
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let _ = chunk.unwrap();
    }
    read(&body.trailers().await.unwrap().unwrap()).unwrap()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 3 <= bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Item 1: many streams, each sending only a 5-byte prefix announcing
/// 4 MiB. On main: no stream limit, and tonic reserved the announced length
/// per stream (1000 streams: RSS 15 MiB -> 2 GiB). Now at most
/// --max-streams-per-connection (100) streams, and nothing reserved before
/// the bytes arrive.
#[tokio::test]
async fn announced_lengths_reserve_nothing_and_streams_are_capped() {
    let server = ServerProcess::start_ready(&[]).await;
    let before = server.rss();
    let mut held = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (mut client, mut ping) = h2_connect(&server).await;
        for _ in 0..1000 {
            // Beyond the server's stream limit, the client queues them.
            client = client.ready().await.unwrap();
            let (response, mut send) = client
                .send_request(grpc_request(&server, "Session"), false)
                .unwrap();
            send.send_data(prefix(4 << 20), false).unwrap();
            held.push((response, send));
        }
        // The server has read everything sent before its answer to this.
        ping.ping(h2::Ping::opaque()).await.unwrap();
        clients.push((client, ping));
    }
    // A call through the server, so the streams' handlers have run.
    let mut c = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    c.server_info(pb::ServerInfoRequest {}).await.unwrap();
    let after = server.rss();
    assert!(
        after < before + 64 * MIB,
        "4 x 1000 streams announcing 4 MiB each: RSS {} -> {} MiB",
        before / MIB,
        after / MIB
    );
    let limits = c
        .server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner()
        .limits
        .unwrap();
    assert_eq!(limits.max_streams_per_connection, 100);
    drop((held, clients));
}

/// Item 1: bytes actually sent but not yet a whole message are bounded per
/// connection: the stream that would pass the budget is refused
/// RESOURCE_EXHAUSTED naming the limit, and the server's memory stays
/// within it.
#[tokio::test]
async fn partly_received_messages_are_bounded_per_connection() {
    let server = ServerProcess::start_ready(&["--max-inflight-bytes-per-connection", "8388608"]).await;
    let before = server.rss();
    let (mut client, _ping) = h2_connect(&server).await;
    let mut responses = Vec::new();
    let mut senders = Vec::new();
    for _ in 0..4 {
        client = client.ready().await.unwrap();
        let (response, mut send) = client
            .send_request(grpc_request(&server, "Acquire"), false)
            .unwrap();
        send.send_data(prefix(4 << 20), false).unwrap();
        // 3 MiB of the 4: flow control lets it through as the server reads.
        send.send_data(Bytes::from(vec![0u8; 3 << 20]), false).unwrap();
        responses.push(grpc_status(response).boxed());
        senders.push(send);
    }
    // The first answer; the streams within the budget wait for the rest.
    let ((code, message), _, _) = futures::future::select_all(responses).await;
    assert_eq!(code, Code::ResourceExhausted as i32, "{message}");
    for needle in [
        "this connection",
        "limit of 8388608 bytes",
        "--max-inflight-bytes-per-connection",
    ] {
        assert!(message.contains(needle), "{message:?} lacks {needle}");
    }
    let after = server.rss();
    assert!(
        after < before + 48 * MIB,
        "RSS {} -> {} MiB",
        before / MIB,
        after / MIB
    );
    drop(senders);
}

/// Items 1 and 10: a message over the size limit is RESOURCE_EXHAUSTED
/// naming the limit (tonic said OUT_OF_RANGE); a message whose repeated
/// fields hold more elements than allowed is refused before it is decoded.
/// On main a 4 MB Batch of two million empty operations was decoded first
/// (hundreds of MiB).
#[tokio::test]
async fn oversized_and_overfull_messages_are_refused_before_decoding() {
    let server = ServerProcess::start_ready(&[]).await;
    let mut c = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    let before = server.rss();
    let empty_ops: Vec<u8> = [0x0a, 0x00].repeat(2_000_000);
    let status = raw_call(&server, "Batch", empty_ops).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("ops: 2000000 operations exceed the limit of 1024"),
        "{status:?}"
    );
    let empty_names: Vec<u8> = [0x0a, 0x00].repeat(2_000_000);
    let status = raw_call(&server, "Acquire", empty_names).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("names: 2000000 names exceed the limit of 64"),
        "{status:?}"
    );
    let after = server.rss();
    assert!(
        after < before + 64 * MIB,
        "RSS {} -> {} MiB",
        before / MIB,
        after / MIB
    );

    let status = c
        .describe(pb::DescribeRequest {
            names: vec!["x".repeat(5 << 20)],
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    for needle in ["limit of 4194304 bytes", "--max-message-bytes"] {
        assert!(status.message().contains(needle), "{status:?} lacks {needle}");
    }
}

/// Item 5: a connection with no call in flight for --idle-timeout is
/// closed, whether it never said anything or made calls; a call that lasts
/// longer than the timeout is not cut.
#[tokio::test]
async fn idle_connections_are_closed_but_long_calls_are_not() {
    let server = ServerProcess::start_ready(&["--idle-timeout", "1s"]).await;
    let guard = Duration::from_secs(60);

    // A TCP connection that never speaks: the server's HTTP/2 settings
    // arrive, then the end of the stream.
    let mut silent = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(guard, silent.read_to_end(&mut got))
        .await
        .expect("a silent connection was never closed")
        .ok();

    // A call that waits 2 s for a busy name, on a connection that is then
    // left idle.
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    let closed = tokio::spawn(conn);
    let channel = Channel::from_shared(server.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = LeaseServiceClient::new(channel);
    let now = Micros::now().as_micros();
    c.acquire(pb::AcquireRequest {
        names: vec!["busy".into()],
        deadline_us: now + 2_000_000,
        owner: "h".into(),
        mode: pb::Mode::Full.into(),
        wait_us: 0,
        ..Default::default()
    })
    .await
    .unwrap();
    let waited = c
        .acquire(pb::AcquireRequest {
            names: vec!["busy".into()],
            deadline_us: now + 6_000_000,
            owner: "w".into(),
            mode: pb::Mode::Full.into(),
            wait_us: 5_000_000,
            ..Default::default()
        })
        .await;
    assert!(waited.is_ok(), "a 2 s wait was cut: {waited:?}");
    drop(client);
    tokio::time::timeout(guard, closed)
        .await
        .expect("an idle HTTP/2 connection was never closed")
        .unwrap()
        .ok();
    let info = c
        .server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.limits.unwrap().idle_timeout_us, 1_000_000);
}

/// Item 5: at the file-descriptor limit the accept loop backs off instead
/// of spinning (on main: a core's worth of CPU while a client waited), and
/// serves again once descriptors are free.
#[tokio::test]
async fn the_accept_loop_backs_off_at_the_descriptor_limit() {
    let server = ServerProcess::start_ready(&[]).await;
    let mut c = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    c.server_info(pb::ServerInfoRequest {}).await.unwrap();
    let limit = std::process::Command::new("prlimit")
        .args(["--pid", &server.pid().to_string(), "--nofile=48:"])
        .status()
        .expect("prlimit (util-linux)");
    assert!(limit.success());
    // More connections than descriptors: the kernel completes them (the
    // backlog) and the server cannot accept the rest.
    let mut conns = Vec::new();
    for _ in 0..64 {
        conns.push(tokio::net::TcpStream::connect(server.addr).await.unwrap());
    }
    let start = server.cpu_ticks();
    // A window of wall time to measure CPU use in (not a synchronisation).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let used = server.cpu_ticks() - start;
    assert!(
        used < 50,
        "the server used {used} ticks of CPU in 2 s at the descriptor limit"
    );
    drop(conns);
    let limit = std::process::Command::new("prlimit")
        .args(["--pid", &server.pid().to_string(), "--nofile=1024:"])
        .status()
        .unwrap();
    assert!(limit.success());
    let mut fresh = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    fresh.server_info(pb::ServerInfoRequest {}).await.unwrap();
}
