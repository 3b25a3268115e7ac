//! Issue 13, item 8: acquires waiting server-side for a busy name are
//! served first come, first served, one woken per release, and bounded per
//! name and in all.

use std::sync::{Arc, Mutex};

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

fn acquire(name: &str, ttl_us: u64, wait_us: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        names: vec![name.to_owned()],
        deadline_us: Micros::now().as_micros() + ttl_us,
        owner: "w".into(),
        mode: pb::Mode::Full.into(),
        wait_us,
        ..Default::default()
    }
}

async fn waiters(c: &mut LeaseServiceClient<Channel>, name: &str) -> u32 {
    let r = c
        .describe(pb::DescribeRequest {
            names: vec![name.to_owned()],
        })
        .await
        .unwrap()
        .into_inner();
    r.names[0].waiters
}

/// Returns once `name` has `n` waiters (the server says so in Describe).
async fn until_waiters(c: &mut LeaseServiceClient<Channel>, name: &str, n: u32) {
    while waiters(c, name).await != n {
        tokio::task::yield_now().await;
    }
}

fn release(grant: &pb::LeaseGrant) -> pb::ReleaseRequest {
    pb::ReleaseRequest {
        lease_id: grant.lease_id.clone(),
        token: grant.token.clone(),
        ..Default::default()
    }
}

/// Forty acquires queue, one after the other, for a held name; each
/// releases as soon as it gets it. They get it in the order they came.
#[tokio::test]
async fn waiters_are_served_in_the_order_they_came() {
    let server = ServerProcess::start_ready(&[]).await;
    let mut c = raw(&server).await;
    let holder = c
        .acquire(acquire("q", 9 * SEC, 0))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for k in 0..40u32 {
        let mut w = c.clone();
        let order = Arc::clone(&order);
        tasks.push(tokio::spawn(async move {
            let grant = w
                .acquire(acquire("q", 9 * SEC, 8 * SEC))
                .await
                .unwrap()
                .into_inner()
                .grant
                .unwrap();
            order.lock().unwrap().push(k);
            w.release(release(&grant)).await.unwrap();
        }));
        until_waiters(&mut c, "q", k + 1).await;
    }
    c.release(release(&holder)).await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order, (0..40).collect::<Vec<_>>());
    assert_eq!(waiters(&mut c, "q").await, 0);
}

/// Waiters per name and in all are bounded, with RESOURCE_EXHAUSTED naming
/// the limit; a waiter that goes away frees its place.
#[tokio::test]
async fn waiters_are_bounded_per_name_and_in_all() {
    let server = ServerProcess::start_ready(&["--max-waiters-per-name", "3", "--max-waiters", "5"]).await;
    let mut c = raw(&server).await;
    for name in ["a", "b"] {
        c.acquire(acquire(name, 9 * SEC, 0)).await.unwrap();
    }
    let wait = |name: &'static str, c: &LeaseServiceClient<Channel>| {
        let mut w = c.clone();
        tokio::spawn(async move { w.acquire(acquire(name, 9 * SEC, 8 * SEC)).await })
    };
    let mut on_a = Vec::new();
    for k in 1..=3 {
        on_a.push(wait("a", &c));
        until_waiters(&mut c, "a", k).await;
    }
    let refused = c.acquire(acquire("a", 9 * SEC, 8 * SEC)).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    for needle in ["\"a\"", "limit of 3", "--max-waiters-per-name"] {
        assert!(refused.message().contains(needle), "{refused:?} lacks {needle}");
    }
    // A busy name without the wait is still just a conflict.
    let busy = c.acquire(acquire("a", 9 * SEC, 0)).await.unwrap_err();
    assert_eq!(busy.code(), Code::Aborted);

    let mut on_b = Vec::new();
    for k in 1..=2 {
        on_b.push(wait("b", &c));
        until_waiters(&mut c, "b", k).await;
    }
    let refused = c.acquire(acquire("b", 9 * SEC, 8 * SEC)).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    for needle in ["limit of 5", "--max-waiters)"] {
        assert!(refused.message().contains(needle), "{refused:?} lacks {needle}");
    }

    // The caller of a waiting acquire goes away: its place is free.
    on_a.pop().unwrap().abort();
    until_waiters(&mut c, "a", 2).await;
    let again = wait("b", &c);
    until_waiters(&mut c, "b", 3).await;
    for t in on_a.into_iter().chain(on_b).chain([again]) {
        t.abort();
    }
}
