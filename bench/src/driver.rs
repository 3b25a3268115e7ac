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
    /// Open loop only: how late the generator started each slot due in the
    /// measured window (actual start − scheduled start), microseconds. This
    /// lateness is the load generator's (timer, spin, a busy worker, no free
    /// client), and it is included in the cycle and acquire latencies,
    /// which count from the scheduled start; reported so the two can be
    /// told apart.
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

impl TaskOut {
    fn new() -> Self {
        TaskOut {
            cycles: 0,
            conflicts: 0,
            errors: 0,
            first_error: None,
            cycle_us: new_histogram(),
            acquire_us: new_histogram(),
            start_lag_us: new_histogram(),
        }
    }
}

/// How one cycle ended.
enum Outcome {
    /// Acquired at `t1`, released at `t2`.
    Done {
        t1: Instant,
        t2: Instant,
    },
    Conflict,
    Error(String),
}

/// One lease cycle: acquire `names`, then release them, each step bounded
/// by the spec's timeout.
async fn cycle<D: LeaseDriver>(driver: &D, worker: usize, names: &[String], spec: &LoadSpec) -> Outcome {
    let held = tokio::time::timeout(spec.op_timeout, driver.acquire(worker, names, spec.ttl)).await;
    let held = match held {
        Ok(Ok(Some(h))) => h,
        Ok(Ok(None)) => return Outcome::Conflict,
        Ok(Err(e)) => return Outcome::Error(format!("acquire: {e:#}")),
        Err(_) => return Outcome::Error("acquire: timed out".into()),
    };
    let t1 = Instant::now();
    let released = tokio::time::timeout(spec.op_timeout, driver.release(worker, held)).await;
    let t2 = Instant::now();
    match released {
        Ok(Ok(())) => Outcome::Done { t1, t2 },
        Ok(Err(e)) => Outcome::Error(format!("release: {e:#}")),
        Err(_) => Outcome::Error("release: timed out".into()),
    }
}

/// The measured window and the bounds every task of a point shares.
#[derive(Clone, Copy)]
struct Window {
    measure_from: Instant,
    end: Instant,
}

impl TaskOut {
    /// Books a cycle that was due at `t0` (its scheduled start in the open
    /// loop, its actual start in the closed one). Returns true when the
    /// point has seen too many errors and should stop.
    fn book(&mut self, outcome: Outcome, t0: Instant, w: Window, spec: &LoadSpec, shared: &Shared) -> bool {
        match outcome {
            Outcome::Done { t1, t2 } => {
                // Throughput counts the cycles that complete inside the
                // window, whenever they started.
                if t2 >= w.measure_from && t2 <= w.end {
                    self.cycles += 1;
                    shared.measured.fetch_add(1, Ordering::Relaxed);
                    self.cycle_us.saturating_record(micros(t2 - t0));
                    self.acquire_us.saturating_record(micros(t1 - t0));
                }
                false
            }
            Outcome::Conflict => {
                if t0 >= w.measure_from && t0 <= w.end {
                    self.conflicts += 1;
                }
                false
            }
            Outcome::Error(e) => {
                self.errors += 1;
                self.first_error.get_or_insert(e);
                shared.errors.fetch_add(1, Ordering::Relaxed) + 1 >= spec.max_errors
            }
        }
    }
}

/// Runs one point: `spec.concurrency` tasks cycling until the window ends,
/// the cycle bound is reached or too many errors happened; or, with
/// `spec.rate`, the open-loop schedule of [`paced_scheduler`].
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
    let window = Window { measure_from, end };
    let shared = Arc::new(Shared {
        measured: AtomicU64::new(0),
        errors: AtomicU64::new(0),
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

    let mut tasks = Vec::new();
    if let Some(rate) = spec.rate {
        // One scheduler per runtime worker thread, but no more than one per
        // PACED_RATE_PER_SCHEDULER starts/s (each spins before its starts:
        // idle cores are better left to the server) nor than clients.
        let wanted = (rate / PACED_RATE_PER_SCHEDULER).ceil().max(1.0) as usize;
        let schedulers = tokio::runtime::Handle::current()
            .metrics()
            .num_workers()
            .min(wanted)
            .clamp(1, spec.concurrency);
        let plan = PacedPlan {
            start,
            rate,
            schedulers,
            clients: spec.concurrency,
        };
        for index in 0..schedulers {
            tasks.push(tokio::spawn(paced_scheduler(
                driver.clone(),
                spec.clone(),
                shared.clone(),
                window,
                plan,
                index,
            )));
        }
    } else {
        for worker in 0..spec.concurrency {
            let driver = driver.clone();
            let shared = shared.clone();
            let spec = spec.clone();
            tasks.push(tokio::spawn(async move {
                let mut rng = StdRng::from_entropy();
                let mut out = TaskOut::new();
                loop {
                    let t0 = Instant::now();
                    if t0 >= end || shared.measured.load(Ordering::Relaxed) >= spec.max_cycles {
                        break;
                    }
                    let names = pick_names(&mut rng, &spec.prefix, spec.keyspace, spec.names_per_cycle);
                    let outcome = cycle(&*driver, worker, &names, &spec).await;
                    if out.book(outcome, t0, window, &spec, &shared) {
                        break;
                    }
                }
                out
            }));
        }
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

/// The open-loop schedule shared by a point's schedulers.
#[derive(Clone, Copy, Debug)]
struct PacedPlan {
    start: Instant,
    /// Cycle starts per second, all schedulers together.
    rate: f64,
    schedulers: usize,
    /// Most cycles in flight, all schedulers together (the point's clients).
    clients: usize,
}

impl PacedPlan {
    /// Slot `k` (over all schedulers) is due at `start + k / rate`.
    fn due(&self, slot: u64) -> Instant {
        self.start + Duration::from_secs_f64(slot as f64 / self.rate)
    }

    /// Scheduler `index`'s share of the clients (they add up to `clients`).
    fn in_flight(&self, index: usize) -> usize {
        self.clients / self.schedulers + usize::from(index < self.clients % self.schedulers)
    }
}

/// Starts per second one paced scheduler is given before another is added
/// (up to one per runtime worker): a slot every 100 µs leaves a scheduler
/// time to issue its cycles and handle their answers, while fewer
/// schedulers spin on fewer cores at low rates.
const PACED_RATE_PER_SCHEDULER: f64 = 10_000.0;

/// How long before a start its scheduler stops sleeping on tokio's timer
/// and spins: the timer fires on whole milliseconds (a deadline is rounded
/// up to the next tick), so a sleep to `due - SPIN` ends before `due`.
const SPIN: Duration = Duration::from_millis(1);

/// The corrected open-loop generator: scheduler `index` of `plan.schedulers`
/// owns slots `index, index + schedulers, ...` and starts each at its due
/// time whether or not its earlier cycles have answered (up to
/// `plan.in_flight` at once: the point's client count, spread over the
/// schedulers). Every latency counts from the slot's **scheduled** start,
/// so a stall of the server or the generator is charged to every cycle it
/// delayed (coordinated omission corrected), and the generator's own
/// lateness (first poll of the cycle − scheduled start) is recorded apart,
/// as `start_lag_us`, for every slot due in the window.
///
/// Why this shape, and why cheap:
/// * **One scheduler per runtime worker** (fewer at low rates, see
///   [`PACED_RATE_PER_SCHEDULER`]), **running its cycles itself** (a
///   `FuturesUnordered` polled by the scheduler task): a start is never
///   handed to another task or thread. The previous generator released
///   permits from an OS thread to a pool of client tasks; every start paid
///   a cross-thread wake-up, and a start found no free task when all were
///   waiting on answers, which put p99 lags of 30-63 ms on 16 cores.
/// * **Sleep on tokio's timer, then spin the last millisecond** with
///   `yield_now`: tokio's timer has 1 ms granularity, so sleeping to the
///   due time would make lags of up to 1 ms by construction; a pure spin
///   would burn a core per scheduler. Yielding while spinning lets the
///   worker run the connection tasks and answers in between. The spin
///   costs CPU (up to a worker per scheduler when a scheduler's own
///   interval is under 1 ms): the client CPU of a paced row includes it.
/// * A scheduler whose in-flight cycles all wait for answers starts the
///   next slot when one answers: that wait is the generator's (too few
///   clients), shows as lag, and the point is flagged.
async fn paced_scheduler<D: LeaseDriver>(
    driver: Arc<D>,
    spec: LoadSpec,
    shared: Arc<Shared>,
    window: Window,
    plan: PacedPlan,
    index: usize,
) -> TaskOut {
    use futures::FutureExt as _;
    use futures::StreamExt as _;
    use futures::stream::FuturesUnordered;

    let mut rng = StdRng::from_entropy();
    let mut out = TaskOut::new();
    let mut in_flight = FuturesUnordered::new();
    let mut stop = false;
    let step = plan.schedulers as u64;
    let most = plan.in_flight(index).max(1);
    let mut behind: u32 = 0;
    let mut slot = index as u64;
    // Books a finished cycle: (scheduled start, outcome).
    let book = |out: &mut TaskOut, (t0, outcome): (Instant, Outcome), stop: &mut bool| {
        *stop |= out.book(outcome, t0, window, &spec, &shared);
    };
    loop {
        let due = plan.due(slot);
        if stop || due >= window.end || shared.measured.load(Ordering::Relaxed) >= spec.max_cycles {
            break;
        }
        // Wait for the due time (and a free client), answering meanwhile.
        loop {
            let now = Instant::now();
            if in_flight.len() >= most {
                if let Some(done) = in_flight.next().await {
                    book(&mut out, done, &mut stop);
                }
                continue;
            }
            if now >= due {
                break;
            }
            if due - now > SPIN {
                let wake = tokio::time::sleep_until((due - SPIN).into());
                tokio::select! {
                    biased;
                    Some(done) = in_flight.next(), if !in_flight.is_empty() => book(&mut out, done, &mut stop),
                    () = wake => {}
                }
            } else {
                while let Some(Some(done)) = in_flight.next().now_or_never() {
                    book(&mut out, done, &mut stop);
                }
                tokio::task::yield_now().await;
            }
        }
        let names = pick_names(&mut rng, &spec.prefix, spec.keyspace, spec.names_per_cycle);
        let worker = usize::try_from(slot % spec.concurrency as u64).unwrap_or(0);
        let driver = driver.clone();
        let op = spec.clone();
        let measured = due >= window.measure_from;
        let lag = &mut out.start_lag_us;
        let started = Instant::now();
        if measured {
            lag.saturating_record(micros(started.saturating_duration_since(due)));
        }
        in_flight.push(async move { (due, cycle(&*driver, worker, &names, &op).await) });
        // Start it now: its first request goes out before the next slot.
        while let Some(Some(done)) = in_flight.next().now_or_never() {
            book(&mut out, done, &mut stop);
        }
        slot += step;
        if plan.due(slot) <= Instant::now() {
            // Behind: now and then let the connection tasks on this worker
            // send what was started (a yield polls tokio's I/O driver, a
            // syscall: once per slot would cost more than the slot).
            behind += 1;
            if behind.is_multiple_of(16) {
                tokio::task::yield_now().await;
            }
        } else {
            behind = 0;
        }
    }
    while let Some(done) = in_flight.next().await {
        book(&mut out, done, &mut stop);
    }
    out
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

    /// Counts cycles in flight; each acquire waits a little.
    #[derive(Default)]
    struct Slow {
        now: AtomicU64,
        most: AtomicU64,
    }

    impl LeaseDriver for Slow {
        type Held = ();
        fn max_names(&self) -> usize {
            1
        }
        async fn acquire(&self, _: usize, _: &[String], _: Duration) -> Result<Option<()>> {
            let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(n, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(2)).await;
            self.now.fetch_sub(1, Ordering::SeqCst);
            Ok(Some(()))
        }
        async fn release(&self, _: usize, (): ()) -> Result<()> {
            Ok(())
        }
    }

    /// The open loop keeps at most `concurrency` cycles in flight, records
    /// its own lag for the slots of the window and books their cycles (no
    /// timing asserted: only that each part is there).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn paced_point_bounds_clients_and_records_its_lag() {
        let driver = Arc::new(Slow::default());
        let spec = LoadSpec {
            concurrency: 3,
            names_per_cycle: 1,
            keyspace: 1000,
            ttl: Duration::from_secs(1),
            warmup: Duration::from_millis(50),
            duration: Duration::from_millis(200),
            max_cycles: 1_000_000,
            prefix: "t-".into(),
            op_timeout: Duration::from_secs(5),
            max_errors: 10,
            rate: Some(2000.0),
        };
        let r = run_load(driver.clone(), &spec, None).await;
        assert_eq!(r.errors, 0, "{:?}", r.first_error);
        assert!(r.cycles > 0);
        assert!(!r.start_lag_us.is_empty());
        assert!(driver.most.load(Ordering::SeqCst) <= 3);
    }

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
