//! Issue 24, item 7 (server): which connections and owners the lease port
//! admits. One address cannot take every connection slot, a connection
//! that never sends a request gives its slot back early, and owners obey
//! the name rule (no text that displays as something else). The real
//! `bagel-server` on 127.0.0.1 (and 127.0.0.2, another address of the
//! loopback).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::ServerProcess;
use tokio::io::AsyncReadExt as _;
use tokio::net::{TcpSocket, TcpStream};
use tonic::Code;

/// A failure detector only: see each use.
const NEVER: Duration = Duration::from_secs(60);

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(NEVER, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing after {NEVER:?}"))
}

fn acquire(name: &str, owner: &str) -> pb::AcquireRequest {
    pb::AcquireRequest {
        names: vec![name.to_owned()],
        deadline_us: bagel_proto::Micros::now().as_micros() + 5_000_000,
        owner: owner.to_owned(),
        mode: pb::Mode::Full.into(),
        wait_us: 0,
        ..Default::default()
    }
}

/// A TCP connection to `to` from 127.0.0.2, saying nothing.
async fn silent_from_other_address(to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), 0))
        .unwrap();
    socket.connect(to).await.unwrap()
}

/// Waits until the server closes `stream` (EOF or reset).
async fn closed(stream: &mut TcpStream) {
    let mut buf = [0u8; 64];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// 1,000 silent connections from one address filled the connection cap
/// and locked a legitimate client out for 20 s.
#[tokio::test]
async fn one_address_cannot_take_every_connection_slot() {
    let server = ServerProcess::start_ready(&[
        "--max-connections",
        "40",
        "--max-connections-per-address",
        "10",
        "--first-request-timeout",
        "1h",
        "--idle-timeout",
        "1h",
    ])
    .await;
    let mut silent = Vec::new();
    for _ in 0..40 {
        silent.push(silent_from_other_address(server.addr).await);
    }
    // Beyond its 10, the address's connections are closed at accept (the
    // accept loop takes them in order, so the last 30 are the refused).
    for s in &mut silent[10..] {
        within("a connection over the per-address cap closed", closed(s)).await;
    }
    // Another address is served at once.
    let mut c = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    within(
        "an acquire from another address",
        c.acquire(acquire("slot", "legit")),
    )
    .await
    .unwrap();
}

/// A connection that never sends a request is closed after
/// `--first-request-timeout`, long before the idle timeout.
#[tokio::test]
async fn a_connection_that_never_sends_a_request_is_closed_early() {
    let server = ServerProcess::start_ready(&["--first-request-timeout", "1s", "--idle-timeout", "1h"]).await;
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    within("a silent connection closed", closed(&mut silent)).await;
    // A client that calls keeps its connection past that.
    let mut c = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    c.server_info(pb::ServerInfoRequest {}).await.unwrap();
}

/// `x\u{202e}evil-gnp.exe` was accepted as an owner and rendered reversed
/// on the status page: owners obey the name rule.
#[tokio::test]
async fn owners_that_display_as_something_else_are_refused() {
    let server = ServerProcess::start_ready(&[]).await;
    let mut c = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    for (owner, what) in [
        ("x\u{202e}evil-gnp.exe", "bidirectional override"),
        ("wor\u{200b}ker", "zero-width"),
        ("a\u{2066}b", "isolate"),
    ] {
        let refused = c.acquire(acquire("o", owner)).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().starts_with("owner"), "{refused:?}");
        assert!(refused.message().contains(what), "{refused:?}");
    }
    // Plain and non-ASCII owners still pass.
    c.acquire(acquire("o", "worker-7 caf\u{e9}")).await.unwrap();
}
