//! Closing bags whose time has passed: the [`Metronome`] (a loop, one per
//! deployment or several: closing is idempotent) and [`close_through`] (the
//! new lease holder's wait before it reads what an unsettled predecessor
//! wrote).
//!
//! A bag `[s, s+1)` is closed at `s + 1 + grace`, whether or not anyone
//! wrote to it, so a late writer always finds it closed. The metronome
//! starts at `now - lookback` rather than at the epoch; that is safe because
//! writers never start a write into a bag whose close time passed, a write
//! that finishes after the close time closes its bag itself, and readers
//! close past-due bags before reading them (see [`super`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bagel_proto::Micros;
use tokio_util::sync::CancellationToken;

use crate::{BagConfig, BagStore, Bucket, Error, Result, closer_now, validate_log};
use bagel_proto::clock::CheckedClock;

/// What one round of closing did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CloseReport {
    /// Bags closed (or found closed) in this round.
    pub closed: u64,
    /// The last bag closed, per round (for any log).
    pub through: Option<Bucket>,
    /// The largest delay between a bag's close time and the end of its close.
    pub max_lag: Option<Duration>,
}

impl CloseReport {
    fn add(&mut self, bucket: Bucket, lag: Duration) {
        self.closed += 1;
        self.through = Some(self.through.map_or(bucket, |b| b.max(bucket)));
        self.max_lag = Some(self.max_lag.map_or(lag, |m| m.max(lag)));
    }
}

/// Waits (polling `clock`, sleeping on the real one) until true time has
/// surely reached `t` per `clock` ([`closer_now`]). Gives up with
/// [`Error::TooEarly`] if it has not got there after the expected wait
/// plus `slack` of real time, and at once when the clock cannot be
/// vouched for.
async fn wait_for(clock: &dyn CheckedClock, t: Micros, bucket: Bucket, slack: Duration) -> Result<()> {
    let start = Instant::now();
    let budget = t.duration_since(closer_now(clock).await?) + slack;
    loop {
        let now = closer_now(clock).await?;
        if now >= t {
            return Ok(());
        }
        if start.elapsed() >= budget {
            return Err(Error::TooEarly {
                bucket,
                close_at: t,
                now,
            });
        }
        tokio::time::sleep(t.duration_since(now).min(Duration::from_millis(50))).await;
    }
}

/// Closes every bag of `log` that can hold a timestamp `< until`, from
/// `until - lookback` on, waiting first (if needed) until the last one's
/// close time has passed: closing a bag earlier could reject writes that
/// are on time.
///
/// The lease client calls this when an acquire reports a broken or unknown
/// predecessor, with `until` = that predecessor's deadline, before reading
/// the predecessor's state: afterwards every message the predecessor can
/// ever get into a bag is visible.
///
/// `clock` is one that signed time vouches for (e.g. the lease client's
/// `TimeSource`), with its error bound: a closer whose clock is ahead would
/// close bags early, and a writer that finishes before its safe point
/// (`BagConfig::safe_point`) does not look for a close, so its acknowledged
/// batch would land in a bag already closed without it. So a bag is closed
/// only once the clock less its bound has passed the close time, and not
/// at all when the clock cannot be vouched for ([`Error::ClockUnvouched`]);
/// see [`crate::vouched`].
pub async fn close_through(
    store: &dyn BagStore,
    log: &str,
    until: Micros,
    cfg: &BagConfig,
    clock: &dyn CheckedClock,
) -> Result<CloseReport> {
    validate_log(log)?;
    let mut report = CloseReport::default();
    if until == Micros::ZERO {
        return Ok(report);
    }
    let last = Bucket::of(Micros::from_micros(until.as_micros() - 1));
    let first = Bucket::of(until.saturating_sub(cfg.lookback)).min(last);
    wait_for(clock, last.close_time(cfg.grace), last, Duration::from_secs(5)).await?;
    let mut b = first;
    while b <= last {
        store.close(log, b).await?;
        let now = closer_now(clock).await.unwrap_or(Micros::ZERO);
        report.add(b, now.duration_since(b.close_time(cfg.grace)));
        b = b.next();
    }
    Ok(report)
}

/// [`close_through`] for several logs: what a new lease holder does before
/// it reads, when its lease says bags below `until` are unsettled (the
/// lease client's `Lease::close_before_reading`), on every store its names'
/// holders write to. Afterwards it tells the lease (`settled_through`), so
/// its release spares the next holder the same work.
pub async fn close_logs_through(
    store: &dyn BagStore,
    logs: &[String],
    until: Micros,
    cfg: &BagConfig,
    clock: &dyn CheckedClock,
) -> Result<()> {
    for log in logs {
        close_through(store, log, until, cfg, clock).await?;
    }
    Ok(())
}

/// Closes, for each of its logs, every bag whose close time has passed.
pub struct Metronome {
    store: Arc<dyn BagStore>,
    logs: Vec<String>,
    /// Per log (same order): the next bag not yet closed by this metronome;
    /// empty until the clock is first vouched for (it starts at that
    /// instant less the lookback).
    next: Vec<Bucket>,
    cfg: BagConfig,
    clock: Arc<dyn CheckedClock>,
    /// The latest vouched instant (see [`closer_now`]) and when, on the
    /// monotonic clock, it was had: what `due` and the loop's sleeps
    /// estimate from between checks.
    vouched: Option<(Micros, Instant)>,
    observer: Option<Arc<dyn CloseObserver>>,
}

/// Told of every bag a [`Metronome`] closes and every close that fails,
/// as it happens: what metrics, status pages and progress bars watch. The
/// bag engine itself knows nothing of them.
pub trait CloseObserver: Send + Sync {
    /// `bucket` of `log` is closed, `lag` after its close time, holding
    /// `items` files or objects (0: an empty bag).
    fn closed(&self, log: &str, bucket: Bucket, lag: Duration, items: usize);
    /// Closing `bucket` of `log` failed; the next tick retries it.
    fn failed(&self, log: &str, bucket: Bucket, error: &Error);
    /// The clock check of a tick: `None` when the clock is vouched for,
    /// else why this metronome closes nothing until it is (what a
    /// readiness probe reports).
    fn clock_checked(&self, refused: Option<&Error>) {
        let _ = refused;
    }
}

impl std::fmt::Debug for Metronome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metronome")
            .field("store", &self.store.describe())
            .field("logs", &self.logs)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl Metronome {
    /// Starts at `now - lookback` for every log, `now` being the first
    /// instant `clock` vouches for. Closes nothing while `clock` cannot be
    /// vouched for (see [`crate::vouched`]).
    pub fn new(
        store: Arc<dyn BagStore>,
        logs: Vec<String>,
        cfg: BagConfig,
        clock: Arc<dyn CheckedClock>,
    ) -> Result<Self> {
        for log in &logs {
            validate_log(log)?;
        }
        Ok(Metronome {
            store,
            next: Vec::new(),
            logs,
            cfg,
            clock,
            vouched: None,
            observer: None,
        })
    }

    /// Checks the clock now and returns the vouched instant; remembers it
    /// (and, the first time, sets where closing starts). Tells the
    /// observer either way.
    pub async fn check_clock(&mut self) -> Result<Micros> {
        let checked = closer_now(self.clock.as_ref()).await;
        if let Some(o) = &self.observer {
            o.clock_checked(checked.as_ref().err());
        }
        let now = checked?;
        self.vouched = Some((now, Instant::now()));
        if self.next.is_empty() {
            let start = Bucket::of(now.saturating_sub(self.cfg.lookback));
            self.next = vec![start; self.logs.len()];
        }
        Ok(now)
    }

    /// The vouched instant estimated now: the latest one plus the time
    /// elapsed since (none before the first successful check).
    fn estimated_now(&self) -> Option<Micros> {
        self.vouched.map(|(t, at)| t.saturating_add(at.elapsed()))
    }

    /// Tells `observer` of every close and every failed one.
    #[must_use]
    pub fn with_observer(mut self, observer: Arc<dyn CloseObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The logs closed, in the order given.
    pub fn logs(&self) -> &[String] {
        &self.logs
    }

    /// How many bags (over every log) are past their close time and not
    /// yet closed by this metronome: the work the next tick has.
    /// Zero until the clock has been vouched for ([`Metronome::check_clock`]).
    pub fn due(&self) -> u64 {
        let Some(now) = self.estimated_now() else {
            return 0;
        };
        self.next
            .iter()
            .map(|b| {
                let mut n = 0;
                let mut b = *b;
                while b.close_time(self.cfg.grace) <= now {
                    n += 1;
                    b = b.next();
                }
                n
            })
            .sum()
    }

    /// When the next bag (of any log) becomes closable.
    pub fn next_close_time(&self) -> Micros {
        self.next
            .iter()
            .map(|b| b.close_time(self.cfg.grace))
            .min()
            .unwrap_or(Micros::MAX)
    }

    /// Closes every bag whose close time has surely passed, on a clock
    /// checked at the start of the tick; closes nothing when the check
    /// fails (the error says why). On an error the cursor stays at the
    /// failed bag, so the next tick retries it; the other logs are closed
    /// all the same (one bad log stalls only itself), and the first error
    /// is returned once they are.
    pub async fn tick(&mut self) -> Result<CloseReport> {
        let now = self.check_clock().await?;
        let mut report = CloseReport::default();
        let mut first_error = None;
        for (log, next) in self.logs.iter().zip(self.next.iter_mut()) {
            'log: loop {
                let close_at = next.close_time(self.cfg.grace);
                if now < close_at {
                    break;
                }
                let listing = match self.store.close(log, *next).await {
                    Ok(l) => l,
                    Err(e) => {
                        if let Some(o) = &self.observer {
                            o.failed(log, *next, &e);
                        }
                        first_error.get_or_insert(e);
                        break 'log;
                    }
                };
                let lag = self
                    .vouched
                    .map_or(now, |(t, at)| t.saturating_add(at.elapsed()))
                    .duration_since(close_at);
                if let Some(o) = &self.observer {
                    o.closed(log, *next, lag, listing.items.len());
                }
                report.add(*next, lag);
                *next = next.next();
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// One metronome per log, sharing store, settings and observer.
    fn per_log(self) -> Vec<Metronome> {
        // Before the first vouched instant no log has a cursor yet: each
        // sets its own at its first check.
        self.logs
            .into_iter()
            .enumerate()
            .map(|(i, log)| Metronome {
                store: Arc::clone(&self.store),
                logs: vec![log],
                next: self.next.get(i).map(|b| vec![*b]).unwrap_or_default(),
                cfg: self.cfg.clone(),
                clock: Arc::clone(&self.clock),
                vouched: self.vouched,
                observer: self.observer.clone(),
            })
            .collect()
    }

    /// Ticks at every close time until `shutdown`, handing each round's
    /// result (including errors, which do not stop the loop) to `on_tick`.
    /// Each log has its own loop: a log whose storage calls hang until
    /// they time out delays no other log's closes.
    pub async fn run(self, shutdown: CancellationToken, on_tick: impl FnMut(&Result<CloseReport>) + Send) {
        let on_tick = std::sync::Mutex::new(on_tick);
        let loops = self.per_log().into_iter().map(|m| {
            m.run_one(shutdown.clone(), |r| {
                let mut f = on_tick.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                (*f)(r);
            })
        });
        futures::future::join_all(loops).await;
    }

    async fn run_one(mut self, shutdown: CancellationToken, mut on_tick: impl FnMut(&Result<CloseReport>)) {
        loop {
            let r = self.tick().await;
            let failed = r.is_err();
            on_tick(&r);
            let wait = match (failed, self.estimated_now()) {
                (false, Some(now)) => self
                    .next_close_time()
                    .duration_since(now)
                    .min(Duration::from_secs(1)),
                _ => Duration::from_millis(200),
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}
