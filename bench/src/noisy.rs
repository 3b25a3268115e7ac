//! The noisy neighbour (`--noisy-neighbour`): how much one tenant's flood
//! costs another on one `bagel-server` with an access policy.
//!
//! Tenant A runs acquire/release cycles on its own names and a `List` of
//! its prefix every 50 ms, first alone, then while tenant B floods every
//! pooled surface at once: idle sessions and watches, waiting acquires on
//! one held name, a `List` flood of its 10,000 held names, and callers
//! without a token opening sessions. The result compares A's cycle rate
//! and List latency in the two phases, gives the server's RSS, and
//! tallies B's refusals by code and message (each should be
//! `RESOURCE_EXHAUSTED` naming the limit and the share, or
//! `UNAUTHENTICATED` for the tokenless).
//!
//! Run it with the server's shares switched off (flags passed through
//! `--noisy-server-arg`) to see what the shares buy.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::process::Command;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::cpus::Cpus;
use crate::procs::{Server, WorkDir, free_port, rss_bytes};

/// Adds tenant's `authorization: Bearer <token>`, when it has one.
#[derive(Clone)]
struct Token(Option<Arc<str>>);

impl tonic::service::Interceptor for Token {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(t) = &self.0 {
            let value = format!("Bearer {t}")
                .parse()
                .map_err(|_| tonic::Status::internal("token is no header value"))?;
            req.metadata_mut().insert("authorization", value);
        }
        Ok(req)
    }
}

type Client = LeaseServiceClient<InterceptedService<Channel, Token>>;

/// What one phase of tenant A measured.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub label: String,
    pub cycles_per_s: f64,
    pub list_p50_ms: f64,
    pub list_p99_ms: f64,
    pub lists: u64,
    pub a_errors: u64,
    pub server_rss_mib: f64,
    /// A's refused calls, by code and message.
    pub a_refusals: BTreeMap<String, u64>,
}

/// The whole run: A alone, A under B, and how B's flood was answered.
#[derive(Debug, Clone, Serialize)]
pub struct NoisyReport {
    pub server_args: Vec<String>,
    pub alone: Phase,
    pub under_flood: Phase,
    /// B's calls by outcome: `ok`, or the gRPC code and the start of the
    /// message, with how many.
    pub flood_outcomes: BTreeMap<String, u64>,
}

fn policy(a: &str, b: &str) -> String {
    let hash = |t: &str| bagel_proto::hex::encode(&bagel_proto::acl::hash_token(t));
    format!(
        "[[token]]\nidentity = \"tenant-a\"\nsha256 = \"{}\"\n\n\
         [[token]]\nidentity = \"tenant-b\"\nsha256 = \"{}\"\n\n\
         [[grant]]\nidentity = \"tenant-a\"\nprefixes = [\"a/\"]\npermissions = [\"lease\", \"read\"]\n\n\
         [[grant]]\nidentity = \"tenant-b\"\nprefixes = [\"b/\"]\npermissions = [\"lease\", \"read\"]\n",
        hash(a),
        hash(b)
    )
}

async fn channel(addr: SocketAddr) -> Result<Channel> {
    Ok(Channel::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await?)
}

async fn client(addr: SocketAddr, token: Option<&str>) -> Result<Client> {
    Ok(LeaseServiceClient::with_interceptor(
        channel(addr).await?,
        Token(token.map(Arc::from)),
    ))
}

fn acquire(names: Vec<String>, ttl: Duration, wait: Duration) -> pb::AcquireRequest {
    pb::AcquireRequest {
        names,
        owner: String::new(),
        ttl_us: u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX),
        wait_us: u64::try_from(wait.as_micros()).unwrap_or(u64::MAX),
        ..Default::default()
    }
}

/// B's calls by outcome.
#[derive(Default)]
struct Outcomes(std::sync::Mutex<BTreeMap<String, u64>>);

impl Outcomes {
    fn count<T>(&self, what: &str, r: &Result<T, tonic::Status>) {
        let key = match r {
            Ok(_) => format!("{what}: ok"),
            Err(s) => {
                format!("{what}: {:?}: {}", s.code(), shape(s.message()))
            }
        };
        *self.0.lock().unwrap().entry(key).or_default() += 1;
    }
}

/// A refusal's message without what differs from call to call (lease
/// ids, other long hex runs, numbers past the first), cut to 100
/// characters: one outcome row per kind of refusal.
fn shape(message: &str) -> String {
    let mut out = String::new();
    let mut run = String::new();
    for c in message.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_hexdigit() {
            run.push(c);
            continue;
        }
        if run.len() >= 16 {
            out.push('…');
        } else {
            out.push_str(&run);
        }
        run.clear();
        out.push(c);
    }
    out.trim_end().chars().take(100).collect()
}

/// Runs the noisy-neighbour measurement and writes `noisy-neighbour.md`
/// and `.json` into `out`.
pub async fn run(
    binary: &Path,
    out: &Path,
    seconds: u64,
    server_args: &[String],
    server_cpus: Option<Cpus>,
) -> Result<NoisyReport> {
    anyhow::ensure!(binary.exists(), "{} not found", binary.display());
    std::fs::create_dir_all(out)?;
    let work = WorkDir::new()?;
    work.set_server_cpus(server_cpus);
    let (token_a, token_b) = ("tenant-a-noisy-bench-token", "tenant-b-noisy-bench-token");
    let acl = out.join("noisy-acl.toml");
    std::fs::write(&acl, policy(token_a, token_b))?;
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let mut cmd = Command::new(binary);
    // Both tenants connect from 127.0.0.1 here, where they would come
    // from hosts of their own: the per-address bound (which keeps one
    // host from filling the server's connections) is raised to the
    // server's own limit, so that it is the shares that are measured.
    cmd.args([
        "--listen",
        &addr.to_string(),
        "--max-ttl",
        "120s",
        "--unsafe-skip-restart-wait",
    ])
    .args(["--max-connections-per-address", "1000"])
    .arg("--acl")
    .arg(&acl)
    .args(server_args);
    let mut server = Server::spawn("bagel", &work, cmd, addr, None)?;
    server
        .wait_ready(Duration::from_secs(30), |addr| async move {
            crate::bagel::health(addr).await.unwrap_or(false)
        })
        .await?;

    // A holds 1,000 names, so its List pages are full ones.
    let mut a = client(addr, Some(token_a)).await?;
    for chunk in 0..20 {
        let names = (0..50).map(|i| format!("a/held/{:05}", chunk * 50 + i)).collect();
        a.acquire(acquire(names, Duration::from_secs(110), Duration::ZERO))
            .await
            .context("tenant A's held names")?;
    }
    let phase = Duration::from_secs(seconds);
    eprintln!("== noisy neighbour: tenant A alone ({seconds} s)");
    let alone = tenant_a(addr, token_a, phase, "A alone", server.pid).await?;

    eprintln!("== noisy neighbour: tenant B floods, tenant A again ({seconds} s)");
    let outcomes = Arc::new(Outcomes::default());
    let stop = Arc::new(AtomicBool::new(false));
    let b_runtime = flood_runtime()?;
    let flood = b_runtime
        .spawn(flood_b(addr, token_b, Arc::clone(&outcomes), Arc::clone(&stop)))
        .await??;
    let under_flood = tenant_a(addr, token_a, phase, "A under B's flood", server.pid).await?;
    stop.store(true, Ordering::Relaxed);
    for task in flood {
        task.abort();
    }
    b_runtime.shutdown_background();
    server.check_alive()?;
    server.stop().await;

    let report = NoisyReport {
        server_args: server_args.to_vec(),
        alone,
        under_flood,
        flood_outcomes: outcomes.0.lock().unwrap().clone(),
    };
    let md = markdown(&report);
    print!("{md}");
    std::fs::write(out.join("noisy-neighbour.md"), &md)?;
    std::fs::write(
        out.join("noisy-neighbour.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    Ok(report)
}

/// Tenant B's client: a runtime of its own, so that A's tasks never wait
/// behind B's in one scheduler (B's clients stand for other hosts). Its
/// threads inherit the caller's CPUs. (Its threads at nice 19 changed
/// nothing measurable: A's loss under B is the server's, not the load
/// generator's.)
fn flood_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tenant-b")
        .enable_all()
        .build()
        .context("building tenant B's runtime")
}

/// Tenant A for `phase`: 8 tasks of acquire/release cycles on their own
/// names, and one List of `a/` every 50 ms.
async fn tenant_a(addr: SocketAddr, token: &str, phase: Duration, label: &str, pid: u32) -> Result<Phase> {
    let cycles = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let refusals = Arc::new(Outcomes::default());
    let deadline = Instant::now() + phase;
    let mut tasks = Vec::new();
    for t in 0..8 {
        let mut c = client(addr, Some(token)).await?;
        let (cycles, errors, refusals) = (Arc::clone(&cycles), Arc::clone(&errors), Arc::clone(&refusals));
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while Instant::now() < deadline {
                i += 1;
                let name = format!("a/cycle/{t}/{}", i % 64);
                let granted = c
                    .acquire(acquire(vec![name], Duration::from_secs(10), Duration::ZERO))
                    .await;
                let g = match granted {
                    Ok(g) => g,
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        refusals.count("acquire", &Err::<(), _>(e));
                        continue;
                    }
                };
                let Some(grant) = g.into_inner().grant else {
                    continue;
                };
                let released = c
                    .release(pb::ReleaseRequest {
                        lease_id: grant.lease_id,
                        token: grant.token,
                        ..Default::default()
                    })
                    .await;
                if released.is_ok() {
                    cycles.fetch_add(1, Ordering::Relaxed);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    refusals.count("release", &released);
                }
            }
        }));
    }
    let mut lister = client(addr, Some(token)).await?;
    let mut hist = Histogram::<u64>::new(3)?;
    let mut rss_peak = 0u64;
    let started = Instant::now();
    while Instant::now() < deadline {
        let t0 = Instant::now();
        let r = lister
            .list(pb::ListRequest {
                prefix: "a/".into(),
                page_size: 100,
                page_token: String::new(),
            })
            .await;
        if r.is_ok() {
            hist.record(u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX))?;
        } else {
            errors.fetch_add(1, Ordering::Relaxed);
            refusals.count("list", &r);
        }
        rss_peak = rss_peak.max(rss_bytes(pid).unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for t in tasks {
        t.await?;
    }
    let secs = started.elapsed().as_secs_f64();
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    Ok(Phase {
        label: label.to_owned(),
        cycles_per_s: cycles.load(Ordering::Relaxed) as f64 / secs,
        list_p50_ms: ms(0.5),
        list_p99_ms: ms(0.99),
        lists: hist.len(),
        a_errors: errors.load(Ordering::Relaxed),
        server_rss_mib: rss_peak as f64 / (1024.0 * 1024.0),
        a_refusals: refusals.0.lock().unwrap().clone(),
    })
}

/// Starts tenant B's flood and returns its tasks once every surface is
/// flooded: 10,000 held names, 2,000 idle sessions and 2,000 idle
/// watches (over 64 connections), 3,000 acquires waiting on 8 held
/// names (each queueing again when its wait ends or is refused), 500
/// sessions from callers without a token, and 32 tasks listing its
/// names as fast as they are answered.
async fn flood_b(
    addr: SocketAddr,
    token: &str,
    outcomes: Arc<Outcomes>,
    stop: Arc<AtomicBool>,
) -> Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut b = client(addr, Some(token)).await?;
    for chunk in 0..200 {
        let names = (0..50).map(|i| format!("b/held/{:05}", chunk * 50 + i)).collect();
        let r = b
            .acquire(acquire(names, Duration::from_secs(110), Duration::ZERO))
            .await;
        outcomes.count("hold", &r);
    }
    let contended: Vec<String> = (0..8).map(|i| format!("b/contended/{i}")).collect();
    for name in &contended {
        let r = b
            .acquire(acquire(
                vec![name.clone()],
                Duration::from_secs(110),
                Duration::ZERO,
            ))
            .await;
        outcomes.count("hold", &r);
    }

    let mut tasks = Vec::new();
    let mut conns = Vec::new();
    // 64 connections: an HTTP/2 connection carries at most
    // `--max-streams-per-connection` streams at once, and a call past it
    // waits in the client for one to end, which an idle one never does.
    for _ in 0..64 {
        conns.push(client(addr, Some(token)).await?);
    }
    let mut opened = Vec::new();
    for i in 0..2000 {
        let mut c = conns[i % conns.len()].clone();
        let r = c.session(futures::stream::pending::<pb::BatchRequest>()).await;
        outcomes.count("idle session", &r);
        opened.push(r.ok());
        let mut c = conns[i % conns.len()].clone();
        let r = c
            .watch(pb::WatchRequest {
                prefix: "b/".into(),
                ..Default::default()
            })
            .await;
        outcomes.count("idle watch", &r);
        if let Ok(stream) = r {
            // Held open, never read.
            tasks.push(tokio::spawn(async move {
                let _stream = stream;
                std::future::pending::<()>().await;
            }));
        }
    }
    tasks.push(tokio::spawn(async move {
        let _opened = opened;
        std::future::pending::<()>().await;
    }));
    // Each waiter waits as long as the server allows (its default max
    // wait, 10 s), then queues again; a refused one tries again at once.
    // Waiters and Lists on connections of their own: an HTTP/2
    // connection carries only so many streams at once, and the idle ones
    // above fill theirs.
    let mut wait_conns = Vec::new();
    for _ in 0..40 {
        wait_conns.push(client(addr, Some(token)).await?);
    }
    for i in 0..3000 {
        let mut c = wait_conns[i % wait_conns.len()].clone();
        let name = contended[i % contended.len()].clone();
        let (outcomes, stop) = (Arc::clone(&outcomes), Arc::clone(&stop));
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let wait = Duration::from_secs(9);
                let r = c
                    .acquire(acquire(vec![name.clone()], Duration::from_secs(110), wait))
                    .await;
                outcomes.count("waiting acquire", &r);
                if r.is_err() {
                    // A slot flood, not a CPU one: a refused waiter
                    // queues again a little later.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }));
    }
    let mut anonymous = Vec::new();
    for _ in 0..500 {
        let mut c = client(addr, None).await?;
        let r = c.session(futures::stream::pending::<pb::BatchRequest>()).await;
        outcomes.count("tokenless session", &r);
        anonymous.push(r.ok());
    }
    tasks.push(tokio::spawn(async move {
        let _anonymous = anonymous;
        std::future::pending::<()>().await;
    }));
    for _ in 0..32 {
        let mut c = client(addr, Some(token)).await?;
        let (outcomes, stop) = (Arc::clone(&outcomes), Arc::clone(&stop));
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let r = c
                    .list(pb::ListRequest {
                        prefix: "b/".into(),
                        page_size: 1000,
                        page_token: String::new(),
                    })
                    .await;
                outcomes.count("list flood", &r);
            }
        }));
    }
    Ok(tasks)
}

/// The table a person reads.
pub fn markdown(r: &NoisyReport) -> String {
    let mut md = String::from("# Noisy neighbour: tenant A alone and under tenant B's flood\n\n");
    md += &format!(
        "Server flags beyond the defaults (besides `--acl`, `--max-connections-per-address 1000`): `{}`\n\n",
        if r.server_args.is_empty() {
            "(none)".to_owned()
        } else {
            r.server_args.join(" ")
        }
    );
    md += "| phase | A cycles/s | A List p50 ms | A List p99 ms | Lists | A errors | server RSS MiB |\n";
    md += "|---|--:|--:|--:|--:|--:|--:|\n";
    for p in [&r.alone, &r.under_flood] {
        md += &format!(
            "| {} | {:.0} | {:.2} | {:.2} | {} | {} | {:.0} |\n",
            p.label, p.cycles_per_s, p.list_p50_ms, p.list_p99_ms, p.lists, p.a_errors, p.server_rss_mib
        );
    }
    md += &format!(
        "\nA under B / A alone: cycles {:.2}x, List p50 {:.2}x, List p99 {:.2}x\n",
        r.under_flood.cycles_per_s / r.alone.cycles_per_s.max(f64::MIN_POSITIVE),
        r.under_flood.list_p50_ms / r.alone.list_p50_ms.max(f64::MIN_POSITIVE),
        r.under_flood.list_p99_ms / r.alone.list_p99_ms.max(f64::MIN_POSITIVE),
    );
    for p in [&r.alone, &r.under_flood] {
        if !p.a_refusals.is_empty() {
            md += &format!(
                "\n## Tenant A's refused calls ({})\n\n| refusal | calls |\n|---|--:|\n",
                p.label
            );
            for (k, n) in &p.a_refusals {
                md += &format!("| {} | {n} |\n", k.replace('|', "\\|"));
            }
        }
    }
    md += "\n## Tenant B's calls, by outcome\n\n| outcome | calls |\n|---|--:|\n";
    for (k, n) in &r.flood_outcomes {
        md += &format!("| {} | {n} |\n", k.replace('|', "\\|"));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_parses_and_grants_each_tenant_its_prefix() {
        let p = bagel_proto::acl::Policy::parse(&policy("ta", "tb")).unwrap();
        let a = p.token_identity(&bagel_proto::acl::hash_token("ta")).unwrap();
        assert_eq!(a, "tenant-a");
        let g = p.grants_for(a);
        assert!(g.allows(bagel_proto::acl::Permission::Lease, "a/x"));
        assert!(!g.allows(bagel_proto::acl::Permission::Read, "b/x"));
    }
}
