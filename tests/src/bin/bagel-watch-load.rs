//! Measures what watchers cost a lease server (issue 38, items 2 and 4),
//! against a real `bagel-server` next to this binary. Prints numbers; it
//! asserts nothing (the tests do not time things).
//!
//! * `cpu W`: W watchers of 64 names each that never change, then 20,480
//!   acquire/release cycles in batches of 64: the server's CPU for them.
//! * `expiry N W`: W such watchers, N one-name leases with one deadline,
//!   and an unrelated client's acquire/release cycles around it: their
//!   slowest while the N expire, against before.
//!
//! The memory of unread watchers is `tests/tests/watch_bounds.rs`'s (it
//! prints it; `WATCH_BOUNDS_STREAMS=1000` for the attack).

use std::time::{Duration, Instant};

use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::ServerProcess;
use tonic::transport::Channel;

const WIDE: &[&str] = &[
    "--max-ttl",
    "10m",
    "--max-watchers",
    "4096",
    "--max-held-names",
    "2000000",
    "--max-held-names-per-owner",
    "2000000",
    "--max-held-names-per-peer",
    "2000000",
    "--max-records",
    "4000000",
];

async fn client(server: &ServerProcess) -> LeaseServiceClient<Channel> {
    LeaseServiceClient::connect(server.url.clone()).await.unwrap()
}

async fn watchers(c: &mut LeaseServiceClient<Channel>) -> u64 {
    c.server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner()
        .load
        .unwrap()
        .watchers
}

/// `n` watchers of 64 names each that nothing touches, read as they come.
async fn idle_watchers(server: &ServerProcess, n: usize) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    let mut c = client(server).await;
    for w in 0..n {
        // At most 100 streams per connection (the server's default).
        if w % 64 == 0 {
            c = client(server).await;
        }
        let names = (0..64).map(|j| format!("idle/{w}/{j}")).collect();
        let mut s = c
            .watch(pb::WatchRequest {
                names,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        tasks.push(tokio::spawn(async move {
            while let Ok(Some(_)) = s.message().await {}
        }));
    }
    while watchers(&mut c).await < n as u64 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tasks
}

fn acquire_op(name: String, ttl_us: u64, deadline_us: u64) -> pb::BatchOp {
    pb::BatchOp {
        op: Some(pb::batch_op::Op::Acquire(pb::AcquireRequest {
            names: vec![name],
            owner: "load".into(),
            mode: pb::Mode::Full.into(),
            ttl_us,
            deadline_us,
            ..Default::default()
        })),
    }
}

/// One batch of `names` acquired, then one releasing them.
async fn cycle(c: &mut LeaseServiceClient<Channel>, names: impl Iterator<Item = String>) {
    let ops = names.map(|n| acquire_op(n, 60_000_000, 0)).collect();
    let got = c
        .batch(pb::BatchRequest { ops, lean: false })
        .await
        .unwrap()
        .into_inner();
    let ops = got
        .results
        .into_iter()
        .filter_map(|r| match r.result {
            Some(pb::batch_result::Result::Grant(g)) => Some(pb::BatchOp {
                op: Some(pb::batch_op::Op::Release(pb::ReleaseRequest {
                    lease_id: g.lease_id,
                    token: g.token,
                    ..Default::default()
                })),
            }),
            _ => None,
        })
        .collect();
    c.batch(pb::BatchRequest { ops, lean: false }).await.unwrap();
}

async fn cpu(w: usize) {
    let server = ServerProcess::start_ready(WIDE).await;
    let _watchers = idle_watchers(&server, w).await;
    let mut c = client(&server).await;
    let rounds = 20_480 / 64;
    let before = server.cpu_ticks();
    let t = Instant::now();
    for r in 0..rounds {
        cycle(&mut c, (0..64).map(|i| format!("hot/{}/{i}", r % 4))).await;
    }
    let ticks = server.cpu_ticks() - before;
    println!(
        "cpu: {w} idle watchers: 20,480 cycles in {:.2} s wall, server CPU {:.2} s",
        t.elapsed().as_secs_f64(),
        ticks as f64 / 100.0
    );
}

async fn expiry(n: usize, w: usize) {
    let server = ServerProcess::start_ready(WIDE).await;
    let _watchers = idle_watchers(&server, w).await;
    let mut c = client(&server).await;
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    // Every lease ends at one deadline, a while after they are granted.
    let t0 = Instant::now();
    let deadline = now_us + 20_000_000 + n as u64 * 30;
    for b in 0..n.div_ceil(64) {
        let ops = (b * 64..((b + 1) * 64).min(n))
            .map(|i| acquire_op(format!("mass/{i}"), 0, deadline))
            .collect();
        c.batch(pb::BatchRequest { ops, lean: false }).await.unwrap();
    }
    let expire_at = t0 + Duration::from_micros(deadline - now_us);
    println!(
        "expiry: {n} leases granted in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let mut other = client(&server).await;
    let mut before = Duration::ZERO;
    let mut during = Duration::ZERO;
    let mut count = 0;
    while Instant::now() < expire_at + Duration::from_secs(5) {
        let t = Instant::now();
        cycle(&mut other, std::iter::once("unrelated".to_owned())).await;
        let took = t.elapsed();
        if t + Duration::from_secs(1) < expire_at {
            before = before.max(took);
        } else {
            during = during.max(took);
            count += 1;
        }
    }
    println!(
        "expiry: {n} leases, {w} watchers: an unrelated cycle took at most {:.1} ms before, \
         {:.1} ms from 1 s before the deadline to 5 s after ({count} cycles)",
        before.as_secs_f64() * 1e3,
        during.as_secs_f64() * 1e3
    );
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: usize| args.get(i).and_then(|v| v.parse().ok()).unwrap_or(d);
    match args.first().map(String::as_str) {
        Some("cpu") => cpu(num(1, 256)).await,
        Some("expiry") => expiry(num(1, 100_000), num(2, 1024)).await,
        _ => eprintln!("usage: bagel-watch-load cpu W | expiry N W"),
    }
}
