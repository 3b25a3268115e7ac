//! A metronome closing many logs (issue 27 item 4): 1, 100 and 1,000 logs
//! on one store, written lightly, closed the way `Metronome::run` does it
//! (one loop per log: tick, then sleep until the next close time; all the
//! loops in one task), counting every request the metronome makes.
//!
//! *Written lightly*: one writer per log, and 10 messages of 100 bytes a
//! second in all, one every 100 ms, into the logs in turn. With 1 log it
//! gets a bag every second; with 100 logs each gets one every 10 s, with
//! 1,000 every 100 s: the rest of the time a log is idle, and what the
//! metronome spends on an idle log shows in the requests per log.
//!
//! * Close lag, per closed bag: when the close returned (the observer is
//!   told right after) minus the bag's close time (end + grace), on the
//!   wall clock.
//! * Store requests: the metronome has a store of its own over the same
//!   bags, wrapped in a counter: `CountingFs` (file-system calls) for a
//!   directory, `TestObjectStore` (PUT/GET/HEAD/LIST/DELETE) for S3. The
//!   writers' requests are not counted. The start marks and the first
//!   (catch-up) tick of every log are not measured.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bagel_bags::store::counting::OpCounts;
use bagel_bags::store::faults::RequestCounts;
use bagel_bags::testing::TestLeases;
use bagel_bags::{BagConfig, BagStore, Bucket, CloseObserver, Error, Metronome, TimeoutStore, Writer};
use bagel_proto::clock::{AssumedExact, Clock, SystemClock};
use bytes::Bytes;
use futures::StreamExt;
use hdrhistogram::Histogram;
use serde::Serialize;

use super::PAYLOAD_BYTES;

/// The metronome's grace (like the single-log lag run).
pub const GRACE: Duration = Duration::from_millis(200);
/// Messages per second over all logs.
pub const WRITES_PER_S: u64 = 10;
/// Every store call of this measurement is bounded by this.
const OP_TIMEOUT: Duration = Duration::from_secs(10);

/// What counts the metronome's requests.
#[derive(Clone, Debug)]
pub enum Counter {
    Fs(Arc<OpCounts>),
    S3(Arc<RequestCounts>),
}

impl Counter {
    fn by_kind(&self) -> BTreeMap<String, u64> {
        match self {
            Counter::Fs(c) => c
                .snapshot()
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .map(|(k, n)| (k.to_string(), n))
                .collect(),
            Counter::S3(c) => [
                ("PUT", c.puts()),
                ("GET", c.gets()),
                ("HEAD", c.heads()),
                ("LIST", c.lists()),
                ("DELETE", c.deletes.load(Ordering::SeqCst)),
            ]
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| (k.to_string(), n))
            .collect(),
        }
    }

    fn reset(&self) {
        match self {
            Counter::Fs(c) => c.reset(),
            Counter::S3(c) => c.reset(),
        }
    }
}

/// One point: a metronome over `logs` logs.
#[derive(Debug, Clone, Serialize)]
pub struct ManyLogsRow {
    /// `posix` or `s3`.
    pub store: String,
    /// `tmpfs`, `disk` or `moto`.
    pub medium: String,
    pub logs: usize,
    /// How the logs were written.
    pub writes: String,
    pub grace_ms: u64,
    pub duration_s: f64,
    pub messages_written: u64,
    pub write_errors: u64,
    /// Bags the metronome closed in the window (each with a lag).
    pub bags_closed: u64,
    /// Minutes sealed (the seconds without a bag, closed together).
    pub minutes_sealed: u64,
    pub ticks: u64,
    pub close_lag_p50_ms: f64,
    pub close_lag_p99_ms: f64,
    pub close_lag_max_ms: f64,
    /// Every request the metronome made in the window.
    pub requests: u64,
    pub requests_per_s: f64,
    /// `requests_per_s / logs`.
    pub requests_per_log_per_s: f64,
    /// By kind: file-system calls (directory) or HTTP methods (S3).
    pub requests_by_kind: BTreeMap<String, u64>,
    /// Whether the loops stopped within 20 s of the end of the window
    /// (false: dropped mid-tick; the window then includes the wait).
    pub stopped_cleanly: bool,
    pub errors: u64,
    pub first_error: Option<String>,
}

/// Records every close (once armed).
struct Observer {
    grace: Duration,
    armed: std::sync::atomic::AtomicBool,
    lag_us: Mutex<Histogram<u64>>,
    sealed: AtomicU64,
    failed: AtomicU64,
    first_failure: Mutex<Option<String>>,
}

impl CloseObserver for Observer {
    fn closed(&self, _log: &str, bucket: Bucket, _lag: Duration, _items: usize) {
        if !self.armed.load(Ordering::Relaxed) {
            return;
        }
        let lag = SystemClock.now().duration_since(bucket.close_time(self.grace));
        let _ = self
            .lag_us
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .record(lag.as_micros() as u64);
    }

    fn failed(&self, log: &str, bucket: Bucket, error: &Error) {
        if !self.armed.load(Ordering::Relaxed) {
            return;
        }
        self.failed.fetch_add(1, Ordering::Relaxed);
        self.first_failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_or_insert_with(|| format!("closing {log} {bucket:?}: {error}"));
    }

    fn sealed(&self, _log: &str, _last: Bucket, _lag: Duration, _empty: u64) {
        if self.armed.load(Ordering::Relaxed) {
            self.sealed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Measures a metronome over `n` logs. `writes`: the writers' store;
/// `closes`: the metronome's, over the same bags, counted by `counter`.
pub async fn measure(
    writes: Arc<dyn BagStore>,
    closes: Arc<dyn BagStore>,
    counter: Counter,
    (store, medium): (&str, &str),
    n: usize,
    duration: Duration,
) -> Result<ManyLogsRow> {
    let writes: Arc<dyn BagStore> = Arc::new(TimeoutStore::new(writes, OP_TIMEOUT));
    let closes: Arc<dyn BagStore> = Arc::new(TimeoutStore::new(closes, OP_TIMEOUT));
    let cfg = BagConfig::default()
        .with_grace(GRACE)
        .with_clock_tolerance(GRACE / 2)
        .with_lookback(Duration::from_secs(1))
        .with_op_timeout(OP_TIMEOUT);
    let run = unix_secs();
    let logs: Vec<String> = (0..n).map(|i| format!("logs{n}-{run}/l{i:05}")).collect();

    // Every log started (what its first writer leaves), 16 at a time.
    let start = Bucket::of(SystemClock.now());
    let marks = futures::stream::iter(logs.iter().map(|l| writes.mark_log_start(l, start)))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    for m in marks {
        m.context("marking a log's start")?;
    }

    // The light writes.
    let leases = TestLeases::default();
    let lease = leases.lease_for_an_hour("bench-many-logs");
    let time = leases.time(Arc::new(SystemClock));
    let writers = logs
        .iter()
        .map(|l| {
            Writer::new(
                writes.clone(),
                l,
                "w",
                Arc::new(lease.clone()),
                Arc::new(SystemClock),
                time.clone(),
                cfg.clone(),
            )
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let writer_task = {
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let payload = Bytes::from(vec![b'x'; PAYLOAD_BYTES]);
            let mut every = tokio::time::interval(Duration::from_millis(1000 / WRITES_PER_S));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let (mut next, mut msgs, mut errors) = (0usize, 0u64, 0u64);
            loop {
                tokio::select! {
                    _ = stop.changed() => break,
                    _ = every.tick() => {}
                }
                let w = &writers[next % writers.len()];
                next += 1;
                match tokio::time::timeout(OP_TIMEOUT, w.write(payload.clone())).await {
                    Ok(Ok(_)) => msgs += 1,
                    _ => errors += 1,
                }
            }
            (msgs, errors)
        })
    };

    // One metronome per log (what `Metronome::run` makes of one over many).
    let observer = Arc::new(Observer {
        grace: GRACE,
        armed: false.into(),
        lag_us: Mutex::new(Histogram::new(3).expect("histogram")),
        sealed: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        first_failure: Mutex::new(None),
    });
    let clock = Arc::new(AssumedExact(Arc::new(SystemClock) as Arc<dyn Clock>));
    let mut metronomes = logs
        .iter()
        .map(|l| {
            Metronome::new(closes.clone(), vec![l.clone()], cfg.clone(), clock.clone())
                .map(|m| m.with_observer(observer.clone()))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    // The catch-up ticks, not measured.
    let _ = futures::stream::iter(metronomes.iter_mut().map(|m| m.tick()))
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    counter.reset();
    observer.armed.store(true, Ordering::Relaxed);
    let (ticks, tick_errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let first_tick_error = Arc::new(Mutex::new(None::<String>));
    let began = Instant::now();
    let loops = futures::future::join_all(metronomes.into_iter().map(|mut m| {
        let mut stop = stop_rx.clone();
        let (ticks, tick_errors, first_tick_error) =
            (ticks.clone(), tick_errors.clone(), first_tick_error.clone());
        async move {
            loop {
                if *stop.borrow() {
                    return;
                }
                let ok = match m.tick().await {
                    Ok(_) => true,
                    Err(e) => {
                        tick_errors.fetch_add(1, Ordering::Relaxed);
                        first_tick_error
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .get_or_insert_with(|| e.to_string());
                        false
                    }
                };
                ticks.fetch_add(1, Ordering::Relaxed);
                let wait = if ok {
                    m.next_close_time()
                        .duration_since(SystemClock.now())
                        .min(Duration::from_secs(1))
                } else {
                    Duration::from_millis(200)
                };
                tokio::select! {
                    _ = stop.changed() => return,
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }));
    let stopper = async {
        tokio::time::sleep(duration).await;
        let _ = stop_tx.send(true);
    };
    let (stopped_cleanly, ()) = tokio::join!(
        async {
            // The loops, and once told to stop, at most 20 s to finish.
            tokio::pin!(loops);
            tokio::select! {
                _ = &mut loops => true,
                () = tokio::time::sleep(duration + Duration::from_secs(20)) => false,
            }
        },
        stopper
    );
    let secs = began.elapsed().as_secs_f64();
    observer.armed.store(false, Ordering::Relaxed);
    let requests_by_kind = counter.by_kind();
    let (msgs, write_errors) = writer_task.await.context("writer task")?;

    let requests: u64 = requests_by_kind.values().sum();
    let lag = observer
        .lag_us
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let ms = |us: u64| us as f64 / 1000.0;
    let failed = observer.failed.load(Ordering::Relaxed);
    let first_error = first_tick_error
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
        .or_else(|| {
            observer
                .first_failure
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        });
    let row = ManyLogsRow {
        store: store.into(),
        medium: medium.into(),
        logs: n,
        writes: format!(
            "{WRITES_PER_S} msgs/s in all, into the logs in turn (each log every {} s)",
            n as u64 / WRITES_PER_S.min(n as u64)
        ),
        grace_ms: GRACE.as_millis() as u64,
        duration_s: secs,
        messages_written: msgs,
        write_errors,
        bags_closed: lag.len(),
        minutes_sealed: observer.sealed.load(Ordering::Relaxed),
        ticks: ticks.load(Ordering::Relaxed),
        close_lag_p50_ms: ms(lag.value_at_quantile(0.5)),
        close_lag_p99_ms: ms(lag.value_at_quantile(0.99)),
        close_lag_max_ms: ms(lag.max()),
        requests,
        requests_per_s: requests as f64 / secs,
        requests_per_log_per_s: requests as f64 / secs / n as f64,
        requests_by_kind,
        stopped_cleanly,
        errors: tick_errors.load(Ordering::Relaxed).max(failed),
        first_error,
    };
    eprintln!(
        "  metronome over {n:4} logs on {store} ({medium}): {} bags closed, lag p50 {:.1} ms p99 {:.1} ms max {:.1} ms; {:.0} requests/s ({:.2}/log/s) {:?}; {} ticks; writes {} ({} errors); errors {}{}{}",
        row.bags_closed,
        row.close_lag_p50_ms,
        row.close_lag_p99_ms,
        row.close_lag_max_ms,
        row.requests_per_s,
        row.requests_per_log_per_s,
        row.requests_by_kind,
        row.ticks,
        row.messages_written,
        row.write_errors,
        row.errors,
        if stopped_cleanly {
            ""
        } else {
            "; NOT stopped within 20 s"
        },
        row.first_error
            .as_deref()
            .map_or(String::new(), |e| format!(" (first: {e})"))
    );
    Ok(row)
}

fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
