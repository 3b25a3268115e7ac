//! Hostile readers beside honest workers: watchers that open streams from
//! the oldest retained revision and never read them, and listers paging
//! through every held name as fast as they are answered, on a server
//! holding a few thousand names, while workers run acquire and release
//! cycles of their own names.
//!
//! The property: every worker cycle succeeds, none takes longer than
//! [`CYCLE_BOUND`], the unread watch streams are ended by the server
//! (`--watch-stall-timeout`) rather than held, and the server's memory
//! grows by less than [`RSS_BOUND_MB`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::{ServerOptions, ServerProcess};
use serde::Serialize;
use tonic::transport::Channel;

const RUNNING: Duration = Duration::from_secs(15);
const HELD: usize = 3_000;
const WATCH_CONNECTIONS: usize = 8;
const WATCHES_PER_CONNECTION: usize = 25;
const LISTERS: usize = 4;
const WORKERS: usize = 4;
/// The longest an honest acquire+release cycle may take meanwhile.
const CYCLE_BOUND: Duration = Duration::from_secs(5);
/// How much the server's resident memory may grow.
const RSS_BOUND_MB: u64 = 512;

/// What the phase did, for `chaos.json` (`hostile_readers`).
#[derive(Debug, Default, Serialize)]
pub struct HostileReport {
    pub ran: bool,
    pub watchers: usize,
    /// Unread streams the server ended (read once the phase was over).
    pub watchers_ended: usize,
    pub list_pages: u64,
    pub cycles: u64,
    pub slowest_cycle_ms: u64,
    pub rss_before_mb: u64,
    pub rss_peak_mb: u64,
}

fn rss_mb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()))
        })
        .map_or(0, |kb| kb / 1024)
}

pub async fn run() -> anyhow::Result<(HostileReport, Vec<String>)> {
    let mut report = HostileReport::default();
    let mut violations = Vec::new();
    let server = ServerProcess::start_with(
        &[
            "--unsafe-skip-restart-wait",
            "--max-ttl",
            "60s",
            "--watch-stall-timeout",
            "2s",
        ],
        ServerOptions {
            rust_log: "error".to_owned(),
            ..ServerOptions::default()
        },
    )
    .await;
    let channel = || Channel::from_shared(server.url.clone()).map(|c| c.connect_lazy());
    let mut setup = LeaseServiceClient::new(channel()?);
    // A List first: the server records events from then on (it keeps
    // none while nobody lists or watches), so the setup's grants are
    // events the watchers below are owed, from this revision.
    let oldest = setup
        .list(pb::ListRequest {
            prefix: "held/".into(),
            page_size: 1,
            ..Default::default()
        })
        .await?
        .into_inner()
        .revision;
    for chunk in 0..HELD / 50 {
        setup
            .acquire(pb::AcquireRequest {
                names: (0..50).map(|i| format!("held/{chunk:03}/{i:02}")).collect(),
                ttl_us: 50_000_000,
                owner: "hostile-setup".into(),
                ..Default::default()
            })
            .await?;
    }
    report.rss_before_mb = rss_mb(server.pid());

    // Watchers that never read.
    let mut streams = Vec::new();
    for _ in 0..WATCH_CONNECTIONS {
        // A small receive window: the server can send a few events, then
        // every stream is owed the rest and takes none.
        let endpoint = tonic::transport::Endpoint::from_shared(server.url.clone())?
            .initial_stream_window_size(1024)
            .initial_connection_window_size(64 * 1024);
        let mut c = LeaseServiceClient::new(endpoint.connect_lazy());
        for _ in 0..WATCHES_PER_CONNECTION {
            let s = c
                .watch(pb::WatchRequest {
                    prefix: "held/".into(),
                    from_revision: oldest,
                    ..Default::default()
                })
                .await?;
            streams.push(s.into_inner());
        }
    }
    report.watchers = streams.len();

    let stop = Arc::new(AtomicBool::new(false));
    let pages = Arc::new(AtomicU64::new(0));
    let mut listers = Vec::new();
    for _ in 0..LISTERS {
        let (mut c, stop, pages) = (
            LeaseServiceClient::new(channel()?),
            Arc::clone(&stop),
            Arc::clone(&pages),
        );
        listers.push(tokio::spawn(async move {
            let mut token = String::new();
            while !stop.load(Ordering::SeqCst) {
                let page = c
                    .list(pb::ListRequest {
                        prefix: String::new(),
                        page_size: 1000,
                        page_token: std::mem::take(&mut token),
                    })
                    .await?
                    .into_inner();
                pages.fetch_add(1, Ordering::Relaxed);
                token = page.next_page_token;
            }
            anyhow::Ok(())
        }));
    }
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (mut c, stop) = (LeaseServiceClient::new(channel()?), Arc::clone(&stop));
        workers.push(tokio::spawn(async move {
            let (mut cycles, mut slowest, mut failures) = (0u64, Duration::ZERO, Vec::new());
            while !stop.load(Ordering::SeqCst) {
                let started = Instant::now();
                let outcome = async {
                    let grant = c
                        .acquire(pb::AcquireRequest {
                            names: vec![format!("worker/{w}")],
                            ttl_us: 5_000_000,
                            owner: format!("worker-{w}"),
                            ..Default::default()
                        })
                        .await?
                        .into_inner()
                        .grant
                        .ok_or_else(|| tonic::Status::internal("no grant"))?;
                    c.release(pb::ReleaseRequest {
                        lease_id: grant.lease_id,
                        token: grant.token,
                        ..Default::default()
                    })
                    .await
                }
                .await;
                slowest = slowest.max(started.elapsed());
                cycles += 1;
                if let Err(s) = outcome {
                    failures.push(format!("{:?} {}", s.code(), s.message()));
                }
            }
            (cycles, slowest, failures)
        }));
    }

    let began = Instant::now();
    let mut peak = report.rss_before_mb;
    while began.elapsed() < RUNNING {
        tokio::time::sleep(Duration::from_millis(200)).await;
        peak = peak.max(rss_mb(server.pid()));
    }
    stop.store(true, Ordering::SeqCst);
    report.rss_peak_mb = peak;
    for l in listers {
        if let Err(e) = l.await? {
            violations.push(format!("hostile: a lister failed: {e:#}"));
        }
    }
    report.list_pages = pages.load(Ordering::Relaxed);
    for w in workers {
        let (cycles, slowest, failures) = w.await?;
        report.cycles += cycles;
        report.slowest_cycle_ms = report.slowest_cycle_ms.max(slowest.as_millis() as u64);
        for f in failures.iter().take(3) {
            violations.push(format!(
                "hostile: a worker's cycle failed beside hostile readers: {f}"
            ));
        }
    }
    if report.slowest_cycle_ms > CYCLE_BOUND.as_millis() as u64 {
        violations.push(format!(
            "hostile: a worker's cycle took {} ms beside hostile readers (bound {} ms)",
            report.slowest_cycle_ms,
            CYCLE_BOUND.as_millis()
        ));
    }
    if peak.saturating_sub(report.rss_before_mb) > RSS_BOUND_MB {
        violations.push(format!(
            "hostile: the server grew from {} to {} MB with {} unread watch streams",
            report.rss_before_mb, peak, report.watchers
        ));
    }
    // The unread streams, read now: each must have been ended by the
    // server, after what it had sent.
    for mut s in streams {
        let ended = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                match s.message().await {
                    Ok(Some(_)) => continue,
                    Ok(None) => return true,
                    Err(status) => return status.code() == tonic::Code::ResourceExhausted,
                }
            }
        })
        .await
        .unwrap_or(false);
        report.watchers_ended += usize::from(ended);
    }
    if report.watchers_ended != report.watchers {
        violations.push(format!(
            "hostile: {} of {} unread watch streams were not ended by the server",
            report.watchers - report.watchers_ended,
            report.watchers
        ));
    }
    if report.list_pages == 0 || report.cycles == 0 {
        violations.push(format!(
            "hostile: nothing ran ({} list pages, {} cycles)",
            report.list_pages, report.cycles
        ));
    }
    report.ran = true;
    println!(
        "hostile readers: {} unread watch streams ({} ended by the server), {} list pages; {} worker cycles, \
         slowest {} ms; server RSS {} → {} MB",
        report.watchers,
        report.watchers_ended,
        report.list_pages,
        report.cycles,
        report.slowest_cycle_ms,
        report.rss_before_mb,
        report.rss_peak_mb
    );
    Ok((report, violations))
}
