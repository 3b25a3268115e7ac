//! The one workload every system runs: a lease cycle is "acquire a random set
//! of names from the key space with a TTL, then release it", repeated by
//! `concurrency` client tasks for a bounded time and a bounded count.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng, rngs::StdRng};
use tokio::sync::Semaphore;

use crate::procs::cpu_seconds;

/// One system's client side of a lease cycle.
///
/// `worker` is the index of the calling client task; drivers use it to pick a
/// connection from their pool so that every system gets the same number of
/// connections.
pub trait LeaseDriver: Send + Sync + 'static {
    /// What the holder keeps between acquire and release (ids, tokens, etags).
    type Held: Send + 'static;

    /// The largest name set this system can take atomically.
    fn max_names(&self) -> usize;

    /// Takes every name or none. `Ok(None)` means a name is held by someone
    /// else (a conflict, not an error).
    fn acquire(
        &self,
        worker: usize,
        names: &[String],
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Self::Held>>> + Send;

    /// Gives the names back.
    fn release(&self, worker: usize, held: Self::Held) -> impl Future<Output = Result<()>> + Send;
}

/// The shape of one measured point.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    pub concurrency: usize,
    pub names_per_cycle: usize,
    pub keyspace: u64,
    pub ttl: Duration,
    /// Cycles that complete before `warmup` has passed are not measured.
    pub warmup: Duration,
    pub duration: Duration,
    /// Hard bound on measured cycles, whatever the duration.
    pub max_cycles: u64,
    /// Prepended to every name, so points do not see each other's leases.
    pub prefix: String,
    /// Each request gets at most this long.
    pub op_timeout: Duration,
    /// Stop the point early after this many errors.
    pub max_errors: u64,
    /// Open loop: start cycles at this many per second in total (spread
    /// over the tasks) instead of as fast as each task can. Latencies then
    /// count from each cycle's scheduled start, so a stall is not hidden by
    /// the requests it kept from being sent.
    pub rate: Option<f64>,
}

/// What one point measured.
#[derive(Debug)]
pub struct LoadResult {
    pub cycles: u64,
    pub conflicts: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Length of the measured window.
    pub elapsed: Duration,
    /// Whole cycle (successful acquire + release), microseconds.
    pub cycle_us: Histogram<u64>,
    /// The successful acquire alone, microseconds.
    pub acquire_us: Histogram<u64>,
    /// Open loop only: how late a client task picked each measured cycle up
    /// after its scheduled start, microseconds. This lateness is the load
    /// generator's (pacer thread and task wake-ups), and it is included in
    /// the cycle and acquire latencies; reported so the two can be told apart.
    pub start_lag_us: Histogram<u64>,
    /// CPU seconds the server process used during the measured window.
    pub server_cpu_s: Option<f64>,
    /// CPU seconds this (client) process used during the measured window.
    pub client_cpu_s: Option<f64>,
}

pub fn new_histogram() -> Histogram<u64> {
    // 1 µs .. 100 s at 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000, 3).expect("valid histogram bounds")
}

pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Picks `n` distinct names out of `keyspace`.
fn pick_names(rng: &mut StdRng, prefix: &str, keyspace: u64, n: usize) -> Vec<String> {
    let mut ids: Vec<u64> = Vec::with_capacity(n);
    while ids.len() < n {
        let id = rng.gen_range(0..keyspace);
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids.into_iter().map(|id| format!("{prefix}{id}")).collect()
}

struct Shared {
    measured: AtomicU64,
    errors: AtomicU64,
    /// Next open-loop slot.
    slot: AtomicU64,
}

struct TaskOut {
    cycles: u64,
    conflicts: u64,
    errors: u64,
    first_error: Option<String>,
    cycle_us: Histogram<u64>,
    acquire_us: Histogram<u64>,
    start_lag_us: Histogram<u64>,
}

/// Runs one point: `spec.concurrency` tasks cycling until the window ends,
/// the cycle bound is reached or too many errors happened.
pub async fn run_load<D: LeaseDriver>(
    driver: Arc<D>,
    spec: &LoadSpec,
    server_pid: Option<u32>,
) -> LoadResult {
    assert!(spec.names_per_cycle >= 1 && spec.names_per_cycle <= driver.max_names());
    assert!(spec.keyspace >= spec.names_per_cycle as u64);
    let start = Instant::now();
    let measure_from = start + spec.warmup;
    let end = measure_from + spec.duration;
    let shared = Arc::new(Shared {
        measured: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        slot: AtomicU64::new(0),
    });

    // Samples CPU times at the edges of the measured window.
    let cpu = tokio::spawn(async move {
        tokio::time::sleep_until(measure_from.into()).await;
        let s0 = server_pid.and_then(cpu_seconds);
        let c0 = cpu_seconds(std::process::id());
        let t0 = Instant::now();
        tokio::time::sleep_until(end.into()).await;
        let s1 = server_pid.and_then(cpu_seconds);
        let c1 = cpu_seconds(std::process::id());
        let t1 = Instant::now();
        (
            s0.zip(s1).map(|(a, b)| b - a),
            c0.zip(c1).map(|(a, b)| b - a),
            t1 - t0,
        )
    });

    let pacer = spec.rate.map(|rate| pace(start, end, rate));
    let mut tasks = Vec::with_capacity(spec.concurrency);
    for worker in 0..spec.concurrency {
        let driver = driver.clone();
        let shared = shared.clone();
        let spec = spec.clone();
        let pacer = pacer.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::from_entropy();
            let mut out = TaskOut {
                cycles: 0,
                conflicts: 0,
                errors: 0,
                first_error: None,
                cycle_us: new_histogram(),
                acquire_us: new_histogram(),
                start_lag_us: new_histogram(),
            };
            let note_error = |out: &mut TaskOut, e: String| {
                out.errors += 1;
                out.first_error.get_or_insert(e);
                shared.errors.fetch_add(1, Ordering::Relaxed) + 1 >= spec.max_errors
            };
            loop {
                let (t0, picked_up) = match (spec.rate, &pacer) {
                    (Some(rate), Some(permits)) => {
                        // The pacer releases slot k's permit at its start
                        // time; a cycle counts from there, however late a
                        // busy client picks it up.
                        let Ok(permit) = permits.acquire().await else {
                            break;
                        };
                        permit.forget();
                        let slot = shared.slot.fetch_add(1, Ordering::Relaxed);
                        let at = start + Duration::from_secs_f64(slot as f64 / rate);
                        if at >= end {
                            break;
                        }
                        (at, Instant::now())
                    }
                    _ => {
                        let now = Instant::now();
                        (now, now)
                    }
                };
                if t0 >= end || shared.measured.load(Ordering::Relaxed) >= spec.max_cycles {
                    break;
                }
                let names = pick_names(&mut rng, &spec.prefix, spec.keyspace, spec.names_per_cycle);
                let held =
                    tokio::time::timeout(spec.op_timeout, driver.acquire(worker, &names, spec.ttl)).await;
                let held = match held {
                    Ok(Ok(Some(h))) => h,
                    Ok(Ok(None)) => {
                        if t0 >= measure_from && t0 <= end {
                            out.conflicts += 1;
                        }
                        continue;
                    }
                    Ok(Err(e)) => {
                        if note_error(&mut out, format!("acquire: {e:#}")) {
                            break;
                        }
                        continue;
                    }
                    Err(_) => {
                        if note_error(&mut out, "acquire: timed out".into()) {
                            break;
                        }
                        continue;
                    }
                };
                let t1 = Instant::now();
                let released = tokio::time::timeout(spec.op_timeout, driver.release(worker, held)).await;
                let t2 = Instant::now();
                match released {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        if note_error(&mut out, format!("release: {e:#}")) {
                            break;
                        }
                        continue;
                    }
                    Err(_) => {
                        if note_error(&mut out, "release: timed out".into()) {
                            break;
                        }
                        continue;
                    }
                }
                // Throughput counts the cycles that complete inside the
                // window, whenever they started.
                if t2 >= measure_from && t2 <= end {
                    out.cycles += 1;
                    shared.measured.fetch_add(1, Ordering::Relaxed);
                    out.cycle_us.saturating_record(micros(t2 - t0));
                    out.acquire_us.saturating_record(micros(t1 - t0));
                    if spec.rate.is_some() {
                        out.start_lag_us
                            .saturating_record(micros(picked_up.saturating_duration_since(t0)));
                    }
                }
            }
            out
        }));
    }

    let mut result = LoadResult {
        cycles: 0,
        conflicts: 0,
        errors: 0,
        first_error: None,
        elapsed: spec.duration,
        cycle_us: new_histogram(),
        acquire_us: new_histogram(),
        start_lag_us: new_histogram(),
        server_cpu_s: None,
        client_cpu_s: None,
    };
    for task in tasks {
        match task.await {
            Ok(out) => {
                result.cycles += out.cycles;
                result.conflicts += out.conflicts;
                result.errors += out.errors;
                if result.first_error.is_none() {
                    result.first_error = out.first_error;
                }
                result.cycle_us.add(&out.cycle_us).expect("same bounds");
                result.acquire_us.add(&out.acquire_us).expect("same bounds");
                result.start_lag_us.add(&out.start_lag_us).expect("same bounds");
            }
            Err(e) => {
                result.errors += 1;
                result.first_error.get_or_insert(format!("client task: {e}"));
            }
        }
    }
    // The window may have been cut short by the count bound or by errors.
    let finished = Instant::now();
    if finished < end {
        cpu.abort();
        result.elapsed = finished.saturating_duration_since(measure_from);
    } else if let Ok((server, client, _window)) = cpu.await {
        result.server_cpu_s = server;
        result.client_cpu_s = client;
    }
    result
}

/// Open-loop pacing: a thread of its own releases one permit per cycle
/// start, at `start + k / rate` for slot `k`, until `end`, then closes the
/// semaphore.
///
/// Why not `tokio::time::sleep_until` in each task: tokio's timer has a
/// 1 ms granularity, so every cycle would start up to a millisecond late
/// and that lateness, counted from the scheduled start, would be charged
/// to the server. A blocking thread sleeps with the OS timer (tens of µs).
fn pace(start: Instant, end: Instant, rate: f64) -> Arc<Semaphore> {
    let permits = Arc::new(Semaphore::new(0));
    let release = Arc::clone(&permits);
    std::thread::spawn(move || {
        let mut released: u64 = 0;
        loop {
            let now = Instant::now();
            if now >= end {
                break;
            }
            // Slots 0..=k are due once k / rate has passed.
            let due = (now.duration_since(start).as_secs_f64() * rate) as u64 + 1;
            if due > released {
                release.add_permits(usize::try_from(due - released).unwrap_or(usize::MAX));
                released = due;
            }
            let next = start + Duration::from_secs_f64(released as f64 / rate);
            std::thread::sleep(next.min(end).saturating_duration_since(Instant::now()));
        }
        release.close();
    });
    permits
}

/// Acquires `count` distinct names (`{prefix}{i}`) and keeps them: for the
/// memory measurement. Returns the holds so the caller decides when they go.
pub async fn hold_many<D: LeaseDriver>(
    driver: Arc<D>,
    prefix: &str,
    count: u64,
    concurrency: usize,
    ttl: Duration,
    op_timeout: Duration,
) -> Result<Vec<D::Held>> {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(concurrency);
    for worker in 0..concurrency {
        let driver = driver.clone();
        let next = next.clone();
        let prefix = prefix.to_string();
        tasks.push(tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, anyhow::Error>(held);
                }
                let names = [format!("{prefix}{i}")];
                match tokio::time::timeout(op_timeout, driver.acquire(worker, &names, ttl)).await {
                    Ok(Ok(Some(h))) => held.push(h),
                    Ok(Ok(None)) => anyhow::bail!("{} unexpectedly held", names[0]),
                    Ok(Err(e)) => return Err(e.context(format!("acquiring {}", names[0]))),
                    Err(_) => anyhow::bail!("acquiring {} timed out", names[0]),
                }
            }
        }));
    }
    let mut all = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(all)
}

/// A random secret for compare-and-delete style releases.
pub fn random_token() -> String {
    format!("{:032x}", rand::thread_rng().r#gen::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_distinct_names() {
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..100 {
            let names = pick_names(&mut rng, "p", 5, 4);
            let mut sorted = names.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), 4);
            assert!(names.iter().all(|n| n.starts_with('p')));
        }
    }
}
