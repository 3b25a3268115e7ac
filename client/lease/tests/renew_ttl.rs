//! Renewing by TTL (`LeaseBackend::renew_lease_ttl`) against a real lease
//! server in this process, whose clock is a manual one: the TTL is counted
//! on the server's clock at the renewal, whatever the client's clock says,
//! and a server that has been idle still covers the deadline it grants
//! with its granted-until mark.

use std::sync::Arc;
use std::time::Duration;

use bagel_client::{AcquireBuilder, Client, CoalesceOptions, Coalescer, LeaseBackend, LeaseOptions, Micros};
use bagel_proto::clock::{Clock as _, ManualClock, OffsetClock, SystemClock};

const SEC: u64 = 1_000_000;

/// A lease server on a free port whose clock is `clock`, with its default
/// limits (10 s max TTL, a granted-until step of 1 s) and a clock
/// tolerance wide enough that moving `clock` by hand is not taken for a
/// clock stepped against the monotonic one.
async fn serve(clock: &ManualClock) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let cfg = bagel_server::Config::default()
        .with_unsafe_skip_restart_wait(true)
        .with_clock_tolerance(Duration::from_secs(60));
    let server =
        bagel_server::Server::new(cfg, bagel_proto::Signer::generate(), Arc::new(clock.clone())).unwrap();
    tokio::spawn(server.serve(listener, std::future::pending()));
    url
}

fn no_renew() -> LeaseOptions {
    LeaseOptions::default().with_auto_renew(false)
}

/// A client whose clock is 8 s behind the server's renews by TTL: the new
/// deadline is the server's time at the renewal plus the TTL, not 8 s
/// short of it (as a deadline computed on the client's clock would be).
#[tokio::test]
async fn a_ttl_renewal_counts_on_the_servers_clock_not_the_clients() {
    let server_clock = ManualClock::new(Micros::now());
    let url = serve(&server_clock).await;
    let behind = OffsetClock {
        inner: SystemClock,
        offset_us: -8 * SEC as i64,
    };
    let client = Client::connect(url.as_str())
        .await
        .unwrap()
        .with_clock(Arc::new(behind));
    let lease = client
        .acquire(["skewed"])
        .ttl(Duration::from_secs(2))
        .options(no_renew())
        .send()
        .await
        .unwrap();

    let before = server_clock.now();
    let r = client
        .renew_lease_ttl(lease.lease_ref(), Duration::from_secs(9), None)
        .await
        .unwrap();
    assert_eq!(
        r.deadline,
        before.saturating_add(Duration::from_secs(9)),
        "the deadline is the server's clock at the renewal ({before}) plus 9 s"
    );
}

/// The same for the lease handle's renewals (`Lease::renew`, and the
/// background ones): a client 8 s behind the server renewing a 10 s lease
/// gets 10 s by the server's clock, not the 2 s a deadline from its own
/// clock would ask for (which the server would answer by keeping the
/// current deadline, until the lease ran out).
#[tokio::test]
async fn a_lease_handle_renews_for_its_ttl_on_the_servers_clock() {
    let server_clock = ManualClock::new(Micros::now());
    let url = serve(&server_clock).await;
    let behind = OffsetClock {
        inner: SystemClock,
        offset_us: -8 * SEC as i64,
    };
    let client = Client::connect(url.as_str())
        .await
        .unwrap()
        .with_clock(Arc::new(behind));
    let lease = client
        .acquire(["handle"])
        .ttl(Duration::from_secs(10))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    server_clock.advance(Duration::from_secs(5));
    let at = server_clock.now();
    let deadline = lease.renew().await.unwrap();
    assert_eq!(deadline, at.saturating_add(Duration::from_secs(10)));
}

/// After more than two granted-until steps without a grant, the server
/// stops keeping its mark ahead; a TTL renewal must still raise it to
/// cover the deadline it asks for, as an absolute one does, instead of
/// being refused for passing a mark nobody was asked to write. Over a
/// unary `Renew` and inside a `Batch`.
#[tokio::test]
async fn a_ttl_renewal_on_an_idle_server_is_granted() {
    for batched in [false, true] {
        let server_clock = ManualClock::new(Micros::now());
        let url = serve(&server_clock).await;
        let client = Client::connect(url.as_str()).await.unwrap();
        let backend: Arc<dyn LeaseBackend> = if batched {
            Arc::new(Coalescer::new(client.clone(), CoalesceOptions::default()))
        } else {
            Arc::new(client.clone())
        };
        let lease = AcquireBuilder::new(Arc::clone(&backend), ["idle"])
            .ttl(Duration::from_secs(10))
            .options(no_renew())
            .send()
            .await
            .unwrap();

        // The mark covers the acquire's time plus the max TTL and a step
        // (11 s); 5 s later, with nothing granted since, a 10 s renewal
        // asks for 15 s past the acquire.
        server_clock.advance(Duration::from_secs(5));
        let at = server_clock.now();
        let r = backend
            .renew_lease_ttl(lease.lease_ref(), Duration::from_secs(10), None)
            .await
            .unwrap_or_else(|e| panic!("batched {batched}: {e}"));
        assert_eq!(
            r.deadline,
            at.saturating_add(Duration::from_secs(10)),
            "batched {batched}"
        );
    }
}
