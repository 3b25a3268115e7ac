//! Issue 38, item 2: watchers whose clients read nothing must not take the
//! server's memory. Hundreds of Watch streams resume from the oldest
//! retained revision over plain HTTP/2 and never read their answers (their
//! windows run out): the server holds one shared copy of the retained
//! events, not one per watcher, and after the stall bound
//! (`--watch-stall-timeout`, 3 s here) each stream ends, once its client reads
//! again, with RESOURCE_EXHAUSTED naming the limit.

use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::ServerProcess;
use bagel_tests::raw::grpc_frame;
use tonic::transport::Channel;

const MIB: u64 = 1 << 20;
/// Streams the test opens, over connections of [`STREAMS_PER_CONN`]
/// (`WATCH_BOUNDS_STREAMS` raises it, to measure the 1,000).
const STREAMS: usize = 300;
const STREAMS_PER_CONN: usize = 100;

async fn watchers(c: &mut LeaseServiceClient<Channel>) -> u64 {
    let info = c
        .server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    info.load.unwrap().watchers
}

/// Waits until the server counts `n` watchers (a state change, polled:
/// the server has no way to push it).
async fn until_watchers(c: &mut LeaseServiceClient<Channel>, n: u64) {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(20));
    while watchers(c).await != n {
        tick.tick().await;
    }
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

/// Reads a response to its end (giving the window back as it goes) and
/// returns its gRPC status code and message.
async fn read_status(response: http::Response<h2::RecvStream>) -> (i32, String) {
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
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    read(&body.trailers().await.unwrap().unwrap()).unwrap()
}

#[tokio::test]
async fn watchers_that_never_read_hold_no_copy_and_end_naming_the_stall_bound() {
    let streams: usize = std::env::var("WATCH_BOUNDS_STREAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(STREAMS);
    let server = ServerProcess::start_ready(&[
        "--max-ttl",
        "10m",
        "--watch-retain",
        "10000",
        "--watch-stall-timeout",
        "3s",
        // The watcher that reads keeps up whatever the machine's load.
        "--watch-buffer",
        "20000",
        "--max-watchers",
        "2000",
        "--max-held-names",
        "100000",
        "--max-held-names-per-owner",
        "100000",
        "--max-held-names-per-peer",
        "100000",
    ])
    .await;
    let mut c = LeaseServiceClient::connect(server.url.clone()).await.unwrap();

    // One watcher that reads: the hub records from its start on.
    let mut keep = c.watch(pb::WatchRequest::default()).await.unwrap().into_inner();
    until_watchers(&mut c, 1).await;
    // 9,984 grants (64 names each), all retained.
    for i in 0..156 {
        let names = (0..64).map(|j| format!("bulk/{i:03}/{j:02}")).collect();
        c.acquire(pb::AcquireRequest {
            names,
            owner: "filler".into(),
            mode: pb::Mode::Full.into(),
            ttl_us: 600_000_000,
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let first = keep.message().await.unwrap().unwrap().revision;
    let drain = tokio::spawn(async move { while let Ok(Some(_)) = keep.message().await {} });
    let from = first - 1;

    let before = server.rss();
    let mut conns = Vec::new();
    let mut pending = Vec::new();
    for _ in 0..streams.div_ceil(STREAMS_PER_CONN) {
        let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let (client, conn) = h2::client::handshake(tcp).await.unwrap();
        conns.push(tokio::spawn(async move {
            let _ = conn.await;
        }));
        let mut client = client.ready().await.unwrap();
        let n = STREAMS_PER_CONN.min(streams - pending.len());
        for _ in 0..n {
            let request = http::Request::builder()
                .method("POST")
                .uri(format!("http://{}/bagel.v1.LeaseService/Watch", server.addr))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(())
                .unwrap();
            client = client.ready().await.unwrap();
            let (response, mut send) = client.send_request(request, false).unwrap();
            let watch = pb::WatchRequest {
                from_revision: from,
                ..Default::default()
            };
            send.send_data(grpc_frame(&watch), true).unwrap();
            pending.push(response);
        }
    }
    // Its headers come once the server has registered the watcher (they
    // need no window); its events are left unread.
    let mut responses = Vec::new();
    for response in pending {
        responses.push(response.await.unwrap());
    }
    let held = server.rss().saturating_sub(before);
    eprintln!(
        "{streams} watchers from revision {from}, unread: server RSS {} MiB -> {} MiB (+{} MiB)",
        before / MIB,
        (before + held) / MIB,
        held / MIB
    );
    // Before: each copied the ~10,000 retained events (~1 MB each).
    assert!(
        held < (streams as u64 * MIB) / 4,
        "{streams} unread watchers made the server hold {} MiB",
        held / MIB
    );

    // Past the stall bound they are ended (and no longer counted)...
    until_watchers(&mut c, 1).await;
    // ... and each says so to its client once it reads again (all at
    // once: a stream's data waits for the connection's window, which the
    // other streams' unread data holds).
    let reads: Vec<_> = responses
        .into_iter()
        .map(|r| tokio::spawn(read_status(r)))
        .collect();
    for read in reads {
        let (code, message) = read.await.unwrap();
        assert_eq!(code, tonic::Code::ResourceExhausted as i32, "{message}");
        assert!(message.contains("--watch-stall-timeout"), "{message}");
    }
    drain.abort();
    for conn in conns {
        conn.abort();
    }
}
