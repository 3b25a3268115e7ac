//! Issue 13, item 2: a Session whose client sends but never reads is held
//! to a byte budget of answers, backpressured, then dropped with a clear
//! status; and sessions are bounded in number.

use std::time::Duration;

use bagel_client::Micros;
use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::ServerProcess;
use bytes::Bytes;
use tonic::Code;
use tonic::transport::Channel;

const MIB: u64 = 1 << 20;

async fn load(c: &mut LeaseServiceClient<Channel>) -> pb::ServerLoad {
    c.server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner()
        .load
        .expect("ServerInfo.load")
}

/// `message` as one gRPC frame.
fn frame(message: &impl prost::Message) -> Bytes {
    let body = message.encode_to_vec();
    let mut out = vec![0u8];
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Bytes::from(out)
}

/// A batch of 64 grants: an answer of some 25 KB.
fn acquires(round: usize) -> pb::BatchRequest {
    let deadline_us = Micros::now().as_micros() + 9_000_000;
    pb::BatchRequest {
        lean: false,
        ops: (0..64)
            .map(|i| pb::BatchOp {
                op: Some(pb::batch_op::Op::Acquire(pb::AcquireRequest {
                    names: vec![format!("s{round}-{i}")],
                    deadline_us,
                    owner: "reader-who-never-reads".into(),
                    mode: pb::Mode::Full.into(),
                    wait_us: 0,
                    ..Default::default()
                })),
            })
            .collect(),
    }
}

#[tokio::test]
async fn a_session_that_is_never_read_is_backpressured_then_dropped() {
    let server =
        ServerProcess::start_ready(&["--session-buffer-bytes", "65536", "--session-stall-timeout", "1s"])
            .await;
    let mut info = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    let before = server.rss();

    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{}/bagel.v1.LeaseService/Session", server.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut send) = client.send_request(request, false).unwrap();
    // 200 requests, answers of ~5 MB in all; nothing is read.
    for round in 0..200 {
        send.send_data(frame(&acquires(round)), false).unwrap();
    }
    // The server says when it gave up on the reader.
    let guard = tokio::time::Instant::now() + Duration::from_secs(60);
    while load(&mut info).await.sessions_dropped == 0 {
        assert!(
            tokio::time::Instant::now() < guard,
            "the session was never dropped"
        );
        tokio::task::yield_now().await;
    }
    let after = server.rss();
    assert!(
        after < before + 32 * MIB,
        "RSS {} -> {} MiB",
        before / MIB,
        after / MIB
    );

    // Reading now: what was on its way, then the status.
    let mut body = response.await.unwrap().into_body();
    let mut received = 0;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        received += chunk.len();
        body.flow_control().release_capacity(chunk.len()).unwrap();
    }
    let trailers = body.trailers().await.unwrap().expect("trailers");
    let code: i32 = trailers["grpc-status"].to_str().unwrap().parse().unwrap();
    let message = trailers
        .get("grpc-message")
        .map(|m| m.to_str().unwrap().to_owned())
        .unwrap_or_default();
    assert_eq!(code, Code::ResourceExhausted as i32, "{message}");
    for needle in ["session-buffer-bytes", "session-stall-timeout"] {
        assert!(message.contains(needle), "{message:?} lacks {needle}");
    }
    assert!(received < 2 << 20, "{received} bytes of answers came through");
    drop(send);
}

#[tokio::test]
async fn sessions_are_bounded_in_number() {
    let server = ServerProcess::start_ready(&["--max-sessions", "2"]).await;
    let mut c = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    let mut open = Vec::new();
    for _ in 0..2 {
        let (tx, rx) = tokio::sync::mpsc::channel::<pb::BatchRequest>(1);
        let answers = c
            .session(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        open.push((tx, answers));
    }
    let (_tx, rx) = tokio::sync::mpsc::channel::<pb::BatchRequest>(1);
    let refused = c
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    for needle in ["limit of 2", "--max-sessions"] {
        assert!(refused.message().contains(needle), "{refused:?} lacks {needle}");
    }
    assert_eq!(load(&mut c).await.sessions, 2);
    // One ends: its place is free again.
    let (tx, mut answers) = open.pop().unwrap();
    drop(tx);
    assert!(answers.message().await.unwrap().is_none());
    drop(answers);
    while load(&mut c).await.sessions != 1 {
        tokio::task::yield_now().await;
    }
    let (_tx, rx) = tokio::sync::mpsc::channel::<pb::BatchRequest>(1);
    c.session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap();
}
