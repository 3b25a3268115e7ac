//! What `List` pages cost a server and its other clients (issue 38, item
//! 3), over gRPC against a real `bagel-server`:
//!
//! - the time of one page at N held names, for `""` and for a prefix that
//!   matches nothing, and of paging through all N;
//! - the rate of a well-behaved client (sequential acquire + release)
//!   while 4 other clients page through the table with `List` in a loop,
//!   against the same with 4 clients calling `Describe` in a loop,
//!   measured back to back, twice.
//!
//! `cargo run --release -p bagel-server --example list_load -- SERVER_BINARY [N] [SECS]`
//! (N default 100,000; SECS per phase, default 5). The numbers are for
//! reports, never for tests: they depend on the machine.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use tonic::transport::Channel;

const HOUR_US: u64 = 3_600_000_000;

/// Names a fill request holds at once (the server's default limit).
const PER_ACQUIRE: usize = 64;

async fn connect(url: &str) -> LeaseServiceClient<Channel> {
    LeaseServiceClient::connect(url.to_owned())
        .await
        .expect("connect")
        .max_decoding_message_size(64 << 20)
}

fn name(i: usize) -> String {
    format!("fill-{i:07}")
}

/// Holds names 0..n for an hour, from 16 connections.
async fn fill(url: &str, n: usize) {
    let tasks = 16;
    let mut joins = Vec::new();
    for t in 0..tasks {
        let mut c = connect(url).await;
        joins.push(tokio::spawn(async move {
            let mut i = t * PER_ACQUIRE;
            while i < n {
                let names = (i..n.min(i + PER_ACQUIRE)).map(name).collect();
                let req = pb::AcquireRequest {
                    names,
                    owner: format!("fill-{t}"),
                    mode: pb::Mode::Full.into(),
                    ttl_us: HOUR_US,
                    ..Default::default()
                };
                c.acquire(req).await.expect("fill acquire");
                i += tasks * PER_ACQUIRE;
            }
        }));
    }
    for j in joins {
        j.await.unwrap();
    }
}

fn list_req(prefix: &str, page_size: u32, page_token: String) -> pb::ListRequest {
    pb::ListRequest {
        prefix: prefix.to_owned(),
        page_size,
        page_token,
    }
}

/// The median time of `reps` first pages of `prefix`.
async fn page_ms(c: &mut LeaseServiceClient<Channel>, prefix: &str, page_size: u32, reps: usize) -> f64 {
    let mut times = Vec::new();
    for _ in 0..reps {
        let start = Instant::now();
        c.list(list_req(prefix, page_size, String::new()))
            .await
            .expect("list");
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    times[reps / 2]
}

/// Pages through every held name; returns (names, pages).
async fn page_through(c: &mut LeaseServiceClient<Channel>, page_size: u32) -> (usize, usize) {
    let (mut token, mut names, mut pages) = (String::new(), 0, 0);
    loop {
        let page = c
            .list(list_req("", page_size, token))
            .await
            .expect("list")
            .into_inner();
        names += page.names.len();
        pages += 1;
        if page.next_page_token.is_empty() {
            return (names, pages);
        }
        token = page.next_page_token;
    }
}

/// Sequential acquire + release cycles per second over `secs`.
async fn probe(url: &str, secs: u64) -> f64 {
    let mut c = connect(url).await;
    let start = Instant::now();
    let mut cycles = 0u64;
    while start.elapsed() < Duration::from_secs(secs) {
        let req = pb::AcquireRequest {
            names: vec!["probe".into()],
            owner: "probe".into(),
            mode: pb::Mode::Full.into(),
            ttl_us: 10_000_000,
            ..Default::default()
        };
        let grant = c
            .acquire(req)
            .await
            .expect("probe acquire")
            .into_inner()
            .grant
            .unwrap();
        let rel = pb::ReleaseRequest {
            lease_id: grant.lease_id,
            token: grant.token,
            ..Default::default()
        };
        c.release(rel).await.expect("probe release");
        cycles += 1;
    }
    cycles as f64 / start.elapsed().as_secs_f64()
}

#[derive(Clone, Copy, Debug)]
enum Load {
    Describe,
    List,
}

/// The probe's rate while 4 clients run `load` in a loop; and the load's
/// calls per second.
async fn phase(url: &str, n: usize, load: Load, secs: u64) -> (f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let mut joins = Vec::new();
    for t in 0..4 {
        let mut c = connect(url).await;
        let (stop, calls) = (Arc::clone(&stop), Arc::clone(&calls));
        joins.push(tokio::spawn(async move {
            let mut token = String::new();
            let mut i = t * 7919;
            while !stop.load(Ordering::Relaxed) {
                match load {
                    Load::Describe => {
                        i = (i + 104_729) % n;
                        let req = pb::DescribeRequest { names: vec![name(i)] };
                        c.describe(req).await.expect("describe");
                    }
                    Load::List => {
                        let page = c.list(list_req("", 1000, token)).await.expect("list");
                        token = page.into_inner().next_page_token;
                    }
                }
                calls.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let start = Instant::now();
    // The probe on a thread and runtime of its own: on the load's workers
    // it would queue behind the decoding of their pages, which measures
    // this client, not the server.
    let probe_url = url.to_owned();
    let rate = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(probe(&probe_url, secs))
    })
    .join()
    .unwrap();
    let load_rate = calls.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for j in joins {
        j.await.unwrap();
    }
    (rate, load_rate)
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let server = args.next().expect("usage: list_load SERVER_BINARY [N] [SECS]");
    let n: usize = args.next().map_or(100_000, |a| a.parse().expect("N"));
    let secs: u64 = args.next().map_or(5, |a| a.parse().expect("SECS"));

    let mut child = Command::new(&server)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--max-ttl",
            "1h",
            "--unsafe-skip-restart-wait",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the server");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("the server's address").unwrap();
        if let Some((_, rest)) = line.split_once(" listening on ") {
            break rest.split(',').next().unwrap().to_owned();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let url = format!("http://{addr}");
    // The server goes with this process, even when a step panics.
    let _server = KillOnDrop(child);

    let start = Instant::now();
    fill(&url, n).await;
    println!("held {n} names in {:.1} s", start.elapsed().as_secs_f64());

    let mut c = connect(&url).await;
    for (prefix, size) in [("", 100), ("", 1000), ("nothing-", 100), ("nothing-", 1000)] {
        let ms = page_ms(&mut c, prefix, size, 21).await;
        println!("page of {size:>4} for {prefix:?}: {ms:.3} ms (median of 21)");
    }
    let start = Instant::now();
    let (names, pages) = page_through(&mut c, 1000).await;
    let secs_all = start.elapsed().as_secs_f64();
    println!("paged through {names} names in {pages} pages of 1000: {secs_all:.2} s");

    for round in 1..=2 {
        for load in [Load::Describe, Load::List] {
            let (rate, load_rate) = phase(&url, n, load, secs).await;
            println!(
                "round {round}: acquire+release {rate:.0} cycles/s with 4 {load:?} clients in a loop ({load_rate:.0} calls/s)"
            );
        }
    }
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
