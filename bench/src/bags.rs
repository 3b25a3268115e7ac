//! The bag measurements: `bagel-client`'s bag [`Writer`] and [`Metronome`]
//! (`client/bags`), on a tmpfs directory and on the S3 server (moto).
//!
//! * POSIX writes/s: one writer, 100-byte payloads, batches of 1000 and of
//!   100, fsync on and off, back to back for a bounded time and count.
//! * S3 PUTs per batch: the same writer on the moto server through
//!   `TestObjectStore`, the counting `ObjectStore` wrapper; the happy path
//!   should cost exactly one PUT per batch (two when a batch straddles a
//!   second, i.e. two bags).
//! * Metronome lag: a writer keeps writing while a [`Metronome`] (grace
//!   200 ms) closes every bag as its close time passes; the lag of a tick is
//!   the end of its close minus the bag's close time (`CloseReport::max_lag`).
//!
//! The bag path at scale (issue 27 item 4, `--bag-path` alone, or with
//! the rest of the bag measurements):
//!
//! * [`writers`]: 1, 8 and 64 concurrent writers on one log, as tasks and
//!   as processes, on a directory (tmpfs, disk), S3 (moto) and NFS
//!   (ganesha): messages/s, batches/s, acknowledgement p50/p99.
//! * [`many_logs`]: a metronome closing 1, 100 and 1,000 lightly written
//!   logs on a directory (tmpfs) and on S3: close lag p99 and the store
//!   requests per second it makes.

pub mod many_logs;
pub mod writers;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bagel_bags::store::directory::DirectoryStore;
use bagel_bags::store::faults::{KillSwitch, RequestCounts, TestObjectStore};
use bagel_bags::store::object::ObjectBagStore;
use bagel_bags::testing::TestLeases;
use bagel_bags::{BagConfig, BagStore, Metronome, Writer};
use bagel_proto::clock::{AssumedExact, Clock, SystemClock};
use bytes::Bytes;
use object_store::ObjectStore;
use serde::Serialize;

/// Pacing between write batches of the metronome-lag run.
const POLL_EVERY: Duration = Duration::from_millis(20);

pub const PAYLOAD_BYTES: usize = 100;

fn writer(store: Arc<dyn BagStore>, log: &str, cfg: BagConfig) -> Result<Writer> {
    // A full lease and signed times from a throwaway key (the writer only
    // checks times and cites witnesses; nothing here talks to a lease
    // server).
    let leases = TestLeases::default();
    Ok(Writer::new(
        store,
        log,
        "bench-w1",
        Arc::new(leases.lease_for_an_hour("bench-bags")),
        Arc::new(SystemClock),
        leases.time(Arc::new(SystemClock)),
        cfg,
    )?)
}

/// One writer's throughput on one store.
#[derive(Debug, Clone, Serialize)]
pub struct WriteRow {
    /// `posix` or `s3`.
    pub store: String,
    /// Whether the store fsyncs before acknowledging (POSIX).
    pub sync: bool,
    /// Where the POSIX directory lives (`tmpfs` or `disk`), or `moto`.
    pub medium: String,
    pub batch: usize,
    pub payload_bytes: usize,
    pub batches: u64,
    pub messages: u64,
    pub duration_s: f64,
    pub messages_per_s: f64,
    pub batch_p50_us: u64,
    pub batch_p99_us: u64,
    pub errors: u64,
    pub first_error: Option<String>,
}

/// What one [`write_loop`] measured.
#[derive(Debug)]
pub struct WriteLoop {
    pub batches: u64,
    /// Batches whose stamps fell into two seconds (two bags).
    pub straddling: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub secs: f64,
    /// Time per acknowledged batch, µs.
    pub hist: hdrhistogram::Histogram<u64>,
}

impl WriteLoop {
    fn messages_per_s(&self, batch: usize) -> f64 {
        if self.secs > 0.0 {
            (self.batches * batch as u64) as f64 / self.secs
        } else {
            0.0
        }
    }
}

/// Writes batches of `batch` 100-byte messages back to back for `duration`
/// or `max_batches`, whichever ends first (or until 10 errors).
pub async fn write_loop(w: &Writer, batch: usize, duration: Duration, max_batches: u64) -> WriteLoop {
    let payload = Bytes::from(vec![b'x'; PAYLOAD_BYTES]);
    let mut r = WriteLoop {
        batches: 0,
        straddling: 0,
        errors: 0,
        first_error: None,
        secs: 0.0,
        hist: hdrhistogram::Histogram::<u64>::new(3).expect("histogram"),
    };
    let start = Instant::now();
    while start.elapsed() < duration && r.batches + r.errors < max_batches && r.errors < 10 {
        let t = Instant::now();
        match tokio::time::timeout(
            Duration::from_secs(30),
            w.write_batch(vec![payload.clone(); batch]),
        )
        .await
        {
            Ok(Ok(stamps)) => {
                r.batches += 1;
                let _ = r.hist.record(t.elapsed().as_micros() as u64);
                if let (Some(a), Some(b)) = (stamps.first(), stamps.last())
                    && a.as_micros() / 1_000_000 != b.as_micros() / 1_000_000
                {
                    r.straddling += 1;
                }
            }
            Ok(Err(e)) => {
                r.errors += 1;
                r.first_error.get_or_insert_with(|| e.to_string());
            }
            Err(_) => {
                r.errors += 1;
                r.first_error
                    .get_or_insert_with(|| "write_batch timed out after 30 s".into());
            }
        }
    }
    r.secs = start.elapsed().as_secs_f64();
    r
}

fn write_row(store: &str, sync: bool, medium: &str, batch: usize, r: WriteLoop) -> WriteRow {
    WriteRow {
        store: store.into(),
        sync,
        medium: medium.into(),
        batch,
        payload_bytes: PAYLOAD_BYTES,
        batches: r.batches,
        messages: r.batches * batch as u64,
        duration_s: r.secs,
        messages_per_s: r.messages_per_s(batch),
        batch_p50_us: r.hist.value_at_quantile(0.5),
        batch_p99_us: r.hist.value_at_quantile(0.99),
        errors: r.errors,
        first_error: r.first_error,
    }
}

/// POSIX writes/s in `dir` for every (batch, sync) point.
pub async fn posix_writes(
    dir: &std::path::Path,
    medium: &str,
    batches: &[usize],
    duration: Duration,
) -> Result<Vec<WriteRow>> {
    let mut rows = Vec::new();
    for &sync in &[true, false] {
        for &batch in batches {
            let root = dir.join(format!(
                "writes-b{batch}-{}",
                if sync { "sync" } else { "nosync" }
            ));
            std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
            let store = Arc::new(DirectoryStore::local(&root, sync));
            let w = writer(store, "bench", BagConfig::default().with_sync(sync))?;
            let r = write_loop(&w, batch, duration, 10_000_000 / batch as u64).await;
            let row = write_row("posix", sync, medium, batch, r);
            eprintln!(
                "  posix ({medium}) batch {batch:4} fsync {sync:5}: {:>9.0} msgs/s  batch p50 {} µs p99 {} µs  errors {}",
                row.messages_per_s, row.batch_p50_us, row.batch_p99_us, row.errors
            );
            rows.push(row);
            // Tmpfs is RAM: drop what this point wrote.
            let _ = std::fs::remove_dir_all(&root);
        }
    }
    Ok(rows)
}

/// S3 requests per batch on the happy path.
#[derive(Debug, Clone, Serialize)]
pub struct S3PutRow {
    pub batch: usize,
    pub batches: u64,
    pub puts: u64,
    pub gets: u64,
    pub heads: u64,
    pub lists: u64,
    pub puts_per_batch: f64,
    /// Batches whose messages fell into two seconds (two bags, so two PUTs).
    pub straddling_batches: u64,
    pub messages_per_s: f64,
    pub batch_p50_us: u64,
    pub batch_p99_us: u64,
    pub errors: u64,
    pub first_error: Option<String>,
}

/// A bag store on `inner` under `prefix`, with request counts.
pub async fn counted_s3(
    inner: Arc<dyn ObjectStore>,
    prefix: &str,
) -> Result<(Arc<ObjectBagStore>, Arc<RequestCounts>)> {
    let test = TestObjectStore::new(inner, KillSwitch::never());
    let counts = test.counts.clone();
    let s3 = ObjectBagStore::new(
        Arc::new(test),
        prefix,
        format!("s3://{}/{prefix}", crate::s3::BUCKET),
    );
    s3.probe_conditional_put().await?;
    Ok((Arc::new(s3), counts))
}

pub async fn s3_puts(
    inner: Arc<dyn ObjectStore>,
    batch: usize,
    duration: Duration,
    max_batches: u64,
) -> Result<S3PutRow> {
    let (store, counts) = counted_s3(inner, &format!("bags-puts-b{batch}")).await?;
    let w = writer(store, "bench", BagConfig::default())?;
    let before = [counts.puts(), counts.gets(), counts.heads(), counts.lists()];
    let r = write_loop(&w, batch, duration, max_batches).await;
    let puts = counts.puts() - before[0];
    let row = S3PutRow {
        batch,
        batches: r.batches,
        puts,
        gets: counts.gets() - before[1],
        heads: counts.heads() - before[2],
        lists: counts.lists() - before[3],
        puts_per_batch: if r.batches > 0 {
            puts as f64 / r.batches as f64
        } else {
            0.0
        },
        straddling_batches: r.straddling,
        messages_per_s: r.messages_per_s(batch),
        batch_p50_us: r.hist.value_at_quantile(0.5),
        batch_p99_us: r.hist.value_at_quantile(0.99),
        errors: r.errors,
        first_error: r.first_error,
    };
    eprintln!(
        "  s3 (moto) batch {batch:4}: {} batches, {} PUTs ({:.3}/batch; {} straddle two seconds), {} GETs {} HEADs {} LISTs, {:.0} msgs/s, errors {}",
        row.batches,
        row.puts,
        row.puts_per_batch,
        row.straddling_batches,
        row.gets,
        row.heads,
        row.lists,
        row.messages_per_s,
        row.errors
    );
    Ok(row)
}

/// Metronome lag on one store while a writer keeps writing.
#[derive(Debug, Clone, Serialize)]
pub struct LagRow {
    pub store: String,
    pub grace_ms: u64,
    /// Ticks that closed at least one bag (not counting the catch-up tick
    /// at start, which closes the lookback window).
    pub ticks: u64,
    pub bags_closed: u64,
    /// Per tick: its close's end minus the bag's close time (the largest
    /// of the tick when it closed more than one).
    pub lag_p50_ms: f64,
    pub lag_max_ms: f64,
    pub duration_s: f64,
    pub messages_written: u64,
    pub errors: u64,
    pub first_error: Option<String>,
}

/// Runs a metronome like `Metronome::run` does (tick, sleep until the next
/// close time) for `duration`, with a writer writing 100-message batches
/// every 20 ms into the same log, so the closed bags are not empty.
pub async fn metronome_lag(
    store: Arc<dyn BagStore>,
    label: &str,
    grace: Duration,
    duration: Duration,
) -> Result<LagRow> {
    let cfg = BagConfig::default()
        .with_grace(grace)
        .with_clock_tolerance(grace / 2)
        .with_lookback(Duration::from_secs(1));
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let log = "bench-lag";
    let w = writer(store.clone(), log, cfg.clone())?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer_task = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let payload = Bytes::from(vec![b'x'; PAYLOAD_BYTES]);
            let (mut msgs, mut errors, mut first_error) = (0u64, 0u64, None::<String>);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match tokio::time::timeout(Duration::from_secs(30), w.write_batch(vec![payload.clone(); 100]))
                    .await
                {
                    Ok(Ok(s)) => msgs += s.len() as u64,
                    Ok(Err(e)) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| e.to_string());
                    }
                    Err(_) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| "write_batch timed out".into());
                    }
                }
                tokio::time::sleep(POLL_EVERY).await;
            }
            (msgs, errors, first_error)
        })
    };
    let mut m = Metronome::new(
        store,
        vec![log.into()],
        cfg,
        Arc::new(AssumedExact(clock.clone())),
    )?;
    let (mut lags, mut bags, mut errors, mut first_error) = (Vec::new(), 0u64, 0u64, None::<String>);
    // The catch-up round: bags of the lookback window, long past due.
    if let Err(e) = m.tick().await {
        errors += 1;
        first_error.get_or_insert_with(|| e.to_string());
    }
    let start = Instant::now();
    while start.elapsed() < duration && errors < 10 {
        let wait = m
            .next_close_time()
            .duration_since(clock.now())
            .min(Duration::from_secs(1));
        tokio::time::sleep(wait).await;
        match tokio::time::timeout(Duration::from_secs(30), m.tick()).await {
            Ok(Ok(r)) => {
                if let Some(lag) = r.max_lag.filter(|_| r.closed > 0) {
                    bags += r.closed;
                    lags.push(lag);
                }
            }
            Ok(Err(e)) => {
                errors += 1;
                first_error.get_or_insert_with(|| e.to_string());
            }
            Err(_) => {
                errors += 1;
                first_error.get_or_insert_with(|| "tick timed out after 30 s".into());
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (msgs, werr, wfirst) = writer_task.await.context("writer task")?;
    lags.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let row = LagRow {
        store: label.into(),
        grace_ms: grace.as_millis() as u64,
        ticks: lags.len() as u64,
        bags_closed: bags,
        lag_p50_ms: lags.get(lags.len() / 2).copied().map_or(0.0, ms),
        lag_max_ms: lags.last().copied().map_or(0.0, ms),
        duration_s: secs,
        messages_written: msgs,
        errors: errors + werr,
        first_error: first_error.or(wfirst),
    };
    eprintln!(
        "  metronome on {label} (grace {} ms): {} ticks, {} bags closed, lag p50 {:.1} ms max {:.1} ms; writer {} msgs; errors {}{}",
        row.grace_ms,
        row.ticks,
        row.bags_closed,
        row.lag_p50_ms,
        row.lag_max_ms,
        row.messages_written,
        row.errors,
        row.first_error
            .as_deref()
            .map_or(String::new(), |e| format!(" (first: {e})"))
    );
    Ok(row)
}

/// Everything the bag measurements produced, for `summary.json` and the
/// Markdown report.
#[derive(Debug, Default, Serialize)]
pub struct BagResults {
    pub writes: Vec<WriteRow>,
    pub s3_puts: Vec<S3PutRow>,
    pub metronome: Vec<LagRow>,
    /// Concurrent writers on one log (tasks and processes, per store).
    pub concurrent_writers: Vec<writers::WritersRow>,
    /// A metronome over 1, 100, 1,000 logs.
    pub metronome_many_logs: Vec<many_logs::ManyLogsRow>,
    /// Bag-path points that did not run, and why (a store not available).
    pub bag_path_skipped: Vec<Skipped>,
    /// How the bag-path points ran (batch, durations, processes).
    pub bag_path_settings: Option<serde_json::Value>,
}

/// A bag-path point that was not measured.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    pub what: String,
    pub why: String,
}

impl BagResults {
    /// The sections "Bag path: concurrent writers" and "Bag path:
    /// metronome over many logs" (empty when neither ran).
    pub fn path_markdown(&self) -> String {
        let mut md = String::new();
        let skipped = |md: &mut String, part: &str| {
            for s in self.bag_path_skipped.iter().filter(|s| s.what.starts_with(part)) {
                let _ = writeln!(md, "\n**Not measured: {}**: {}", s.what, s.why);
            }
        };
        let settings = self.bag_path_settings.as_ref();
        let setting = |k: &str| {
            settings
                .and_then(|s| s.get(k))
                .map_or("?".into(), ToString::to_string)
        };
        if !self.concurrent_writers.is_empty()
            || self
                .bag_path_skipped
                .iter()
                .any(|s| s.what.starts_with("writers"))
        {
            let _ = writeln!(md, "\n## Bag path: concurrent writers\n");
            let _ = writeln!(
                md,
                "Each writer its own `Writer` and writer id, all on one log; batches of {} messages of {PAYLOAD_BYTES} bytes, \
                 back to back for {} s; fsync on (directory, NFS). *tasks*: tokio tasks in the bench process, one store; \
                 *processes*: the writers spread over up to {} child processes (one thread each, a store each), started \
                 together. Ack = from `write_batch` to its return.\n",
                setting("batch"),
                setting("writers_duration_s"),
                setting("max_processes"),
            );
            let _ = writeln!(
                md,
                "| store | medium | mode | writers | processes | msgs/s | batches/s | ack p50 µs | ack p99 µs | ack max µs | errors |"
            );
            let _ = writeln!(md, "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|");
            for r in &self.concurrent_writers {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {:.0} | {:.0} | {} | {} | {} | {} |",
                    r.store,
                    r.medium,
                    r.mode,
                    r.writers,
                    r.processes,
                    r.messages_per_s,
                    r.batches_per_s,
                    r.ack_p50_us,
                    r.ack_p99_us,
                    r.ack_max_us,
                    r.errors
                );
            }
            for r in self.concurrent_writers.iter().filter(|r| r.first_error.is_some()) {
                let _ = writeln!(
                    md,
                    "\n{} ({}) {} × {}: first error: {}",
                    r.store,
                    r.medium,
                    r.mode,
                    r.writers,
                    r.first_error.as_deref().unwrap_or_default()
                );
            }
            skipped(&mut md, "writers");
        }
        if !self.metronome_many_logs.is_empty()
            || self
                .bag_path_skipped
                .iter()
                .any(|s| s.what.starts_with("metronome"))
        {
            let _ = writeln!(md, "\n## Bag path: metronome over many logs\n");
            let _ = writeln!(
                md,
                "Logs written lightly: {} messages of {PAYLOAD_BYTES} bytes a second in all, into the logs in turn \
                 (1 log: a bag a second; 1,000 logs: each a bag every 100 s, idle in between). One loop per log as \
                 `Metronome::run` does, grace {} ms, {} s per point. Lag = close returned − bag close time, per closed \
                 bag. Requests: the metronome's own store, counted (file-system calls for a directory, HTTP requests \
                 for S3); the writers' are not.\n",
                many_logs::WRITES_PER_S,
                many_logs::GRACE.as_millis(),
                setting("logs_duration_s"),
            );
            let _ = writeln!(
                md,
                "| store | medium | logs | bags closed | minutes sealed | lag p50 ms | lag p99 ms | lag max ms | requests/s | per log per s | requests by kind | ticks | msgs written | errors |"
            );
            let _ = writeln!(md, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|--:|");
            for r in &self.metronome_many_logs {
                let kinds = r
                    .requests_by_kind
                    .iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.0} | {:.2} | {} | {} | {} | {}{} |",
                    r.store,
                    r.medium,
                    r.logs,
                    r.bags_closed,
                    r.minutes_sealed,
                    r.close_lag_p50_ms,
                    r.close_lag_p99_ms,
                    r.close_lag_max_ms,
                    r.requests_per_s,
                    r.requests_per_log_per_s,
                    kinds,
                    r.ticks,
                    r.messages_written,
                    r.errors + r.write_errors,
                    if r.stopped_cleanly {
                        ""
                    } else {
                        " (loops not stopped in 20 s)"
                    }
                );
            }
            for r in self
                .metronome_many_logs
                .iter()
                .filter(|r| r.first_error.is_some())
            {
                let _ = writeln!(
                    md,
                    "\n{} ({}) {} logs: first error: {}",
                    r.store,
                    r.medium,
                    r.logs,
                    r.first_error.as_deref().unwrap_or_default()
                );
            }
            skipped(&mut md, "metronome");
        }
        md
    }
}
