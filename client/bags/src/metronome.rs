//! Closing bags whose time has passed: the [`Metronome`] (a loop, one per
//! deployment or several: closing is idempotent) and [`close_through`] (the
//! new lease holder's wait before it reads what an unsettled predecessor
//! wrote).
//!
//! A bag `[s, s+1)` that exists is closed at `s + 1 + grace`. The seconds
//! of a minute that hold no bag by then are closed together by the
//! minute's seal ([`crate::seal`]) at the minute's close time: one object
//! per idle minute rather than three per second. Until its minute is
//! sealed, a writer that stalled past an empty second's close time may
//! still open it; it then closes that bag itself (or the next tick does)
//! and is acknowledged only if the lock lists it, so every reader still
//! agrees.
//!
//! Nothing about safety depends on how soon the metronome closes a bag
//! (see below), so it lists the open minute of a log that is idle less
//! and less often: each listing that finds no bag due and not yet closed
//! doubles the pause before the next one, up to
//! [`Metronome::with_max_idle_listing`] (8 s by default), and any listing
//! that finds one ends the pause. An idle log then costs a few listings a
//! minute, not one a second. A bag written meanwhile is closed at the next
//! listing (at most that pause after its close time) or by its minute's
//! seal, which is never delayed: the seal lists the minute itself.
//!
//! The metronome closes only logs that exist (a log's first writer marks
//! its start), from its start mark or `now - lookback`, whichever is later,
//! rather than from the epoch. That is safe because writers never start a
//! write into a bag whose close time passed, a write that finishes after
//! the close time closes its bag itself, and readers close past-due bags
//! and seal past-due minutes before reading them (see [`super`]).

use std::sync::Arc;
use std::time::Duration;

use bagel_proto::Micros;
use tokio_util::sync::CancellationToken;

use crate::pace::{self, Instant};
use crate::seal::{self, Span};
use crate::{BagConfig, BagState, BagStore, Bucket, Error, Result, closer_now, validate_log};
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
    /// Seconds closed empty by minute seals in this round (also counted in
    /// `closed`).
    pub sealed: u64,
    /// Logs with no start mark: nobody ever wrote them, so nothing of them
    /// is closed (a mistyped `--log` is not created and closed forever).
    pub missing_logs: Vec<String>,
    /// Summaries this round published or found published
    /// ([`Metronome::with_summaries`]).
    pub summarized: Vec<crate::summary::Summarized>,
}

impl CloseReport {
    fn add(&mut self, bucket: Bucket, lag: Duration) {
        self.add_many(bucket, lag, 1);
    }

    fn add_many(&mut self, through: Bucket, lag: Duration, n: u64) {
        self.closed += n;
        self.through = Some(self.through.map_or(through, |b| b.max(through)));
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
        pace::sleep(t.duration_since(now).min(Duration::from_millis(50))).await;
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
    let now = closer_now(clock).await?;
    for span in Span::covering(first, last) {
        // A minute wholly past due is sealed (one object for its empty
        // seconds); the seconds of one that is not are closed one by one.
        if now >= span.close_time(cfg.grace) {
            let sealed = seal::seal(store, log, span).await?;
            let through = span.last().min(last);
            let lag = closer_now(clock)
                .await
                .unwrap_or(Micros::ZERO)
                .duration_since(span.close_time(cfg.grace));
            let n = span.buckets().filter(|b| (first..=last).contains(b)).count() as u64;
            report.add_many(through, lag, n);
            report.sealed += sealed.empty_seconds();
            continue;
        }
        let due: Vec<Bucket> = span.buckets().filter(|b| (first..=last).contains(b)).collect();
        store.close_all(log, &due).await?;
        let now = closer_now(clock).await.unwrap_or(Micros::ZERO);
        for b in due {
            report.add(b, now.duration_since(b.close_time(cfg.grace)));
        }
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

/// Closes, for each of its logs, every bag whose close time has passed,
/// and seals every minute whose close time has passed.
pub struct Metronome {
    store: Arc<dyn BagStore>,
    logs: Vec<String>,
    /// Per log (same order): where it stands; `None` until the log's start
    /// mark is found (and, before that, until the clock is first vouched
    /// for).
    cursors: Vec<Option<Cursor>>,
    cfg: BagConfig,
    clock: Arc<dyn CheckedClock>,
    /// The latest vouched instant (see [`closer_now`]) and when, on the
    /// monotonic clock, it was had: what `due` and the loop's sleeps
    /// estimate from between checks.
    vouched: Option<(Micros, Instant)>,
    observer: Option<Arc<dyn CloseObserver>>,
    /// Summarize sealed stretches this long after their close time, this
    /// many minutes each.
    summarize: Option<(Duration, u32)>,
    /// Attest each summary ([`Metronome::with_attester`]).
    attester: Option<Arc<crate::summary::attest::Attester>>,
    /// The longest pause between listings of an idle log's open minute
    /// ([`Metronome::with_max_idle_listing`]).
    max_idle_listing: Duration,
}

/// [`Metronome::with_max_idle_listing`] by default.
pub const DEFAULT_MAX_IDLE_LISTING: Duration = Duration::from_secs(8);

/// Where one log's closing stands.
#[derive(Clone, Debug)]
struct Cursor {
    /// The first minute not sealed yet by this metronome.
    span: Span,
    /// The next stretch to summarize (with [`Metronome::with_summaries`]).
    summary: Option<crate::summary::Stretch>,
    /// Bags of that minute or later that this metronome closed already.
    closed: std::collections::BTreeSet<Bucket>,
    /// How long after a listing of the open minute the next one waits:
    /// zero while the log is busy (every tick), doubled by each listing
    /// that finds nothing to close, up to the metronome's cap.
    idle_pause: Duration,
    /// The open minute is not listed again before this (vouched) instant,
    /// unless its seal is due first.
    next_listing: Micros,
    /// Every second through this one was listed past its close time (and
    /// its bag closed) or sealed with its minute: what a tick in a pause
    /// reports to [`CloseObserver::caught_up`].
    listed_through: Option<Bucket>,
    /// Before this cursor's first tick: the bags and seals it meets may
    /// have been closed before this metronome started (an earlier run, a
    /// reader), so it asks before counting them as its own closes.
    fresh: bool,
}

impl Cursor {
    /// Notes a listing of the open (not yet sealable) minute at `now`:
    /// `found` whether it found a bag due and not yet closed, `pending` the
    /// earliest close time of a bag it found not yet due.
    fn listed_open_minute(&mut self, now: Micros, found: bool, pending: Option<Micros>, cap: Duration) {
        self.idle_pause = if found || cap.is_zero() {
            Duration::ZERO
        } else {
            (self.idle_pause * 2).max(Duration::from_secs(1)).min(cap)
        };
        let next = now.saturating_add(self.idle_pause);
        // A bag seen open is listed again at its close time, pause or not.
        self.next_listing = pending.map_or(next, |p| p.min(next));
    }

    /// A listing or a seal found work: list the open minute at every tick.
    fn busy(&mut self, now: Micros) {
        self.idle_pause = Duration::ZERO;
        self.next_listing = now;
    }
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
    /// The minute ending with `last` is sealed, `lag` after its close
    /// time: `empty` of its seconds are closed empty by the seal.
    fn sealed(&self, log: &str, last: Bucket, lag: Duration, empty: u64) {
        let _ = (log, last, lag, empty);
    }
    /// A tick is done with `log`: every bag of it through `through` is
    /// closed, and the seconds without one are sealed with their minute.
    /// `through` is only ever a second this metronome listed past its close
    /// time, or sealed: while `log` is idle and its open minute is not
    /// listed ([`CloseObserver::listing_paused`]), it stays where the last
    /// listing or seal left it, up to that pause behind the close times.
    fn caught_up(&self, log: &str, through: Bucket) {
        let _ = (log, through);
    }
    /// `log`'s open minute is next listed `pause` after its last listing,
    /// which found no bag due and not yet closed ([`Duration::ZERO`]: at
    /// every tick again, the log is busy). Told when the pause changes. A
    /// bag written meanwhile is closed at the next listing, up to `pause`
    /// after its close time, or by its minute's seal, whichever is first.
    fn listing_paused(&self, log: &str, pause: Duration) {
        let _ = (log, pause);
    }
    /// `log` has no start mark: no writer ever wrote it, so nothing of it
    /// is closed (told at every tick until it has one).
    fn log_missing(&self, log: &str) {
        let _ = log;
    }
}

impl std::fmt::Debug for Metronome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metronome")
            .field("store", &self.store.describe())
            .field("logs", &self.logs)
            .field("cursors", &self.cursors)
            .finish_non_exhaustive()
    }
}

impl Metronome {
    /// Starts, for each log, at its start mark or `now - lookback`,
    /// whichever is later, `now` being the first instant `clock` vouches
    /// for. Closes nothing while `clock` cannot be vouched for (see
    /// [`crate::vouched`]).
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
            cursors: vec![None; logs.len()],
            logs,
            cfg,
            clock,
            vouched: None,
            observer: None,
            summarize: None,
            attester: None,
            max_idle_listing: DEFAULT_MAX_IDLE_LISTING,
        })
    }

    /// The longest pause between listings of an idle log's open minute
    /// (default [`DEFAULT_MAX_IDLE_LISTING`], 8 s). Each listing that finds
    /// no bag due and not yet closed doubles the pause (from 1 s) up to
    /// this; one that finds a bag to close ends it. A bag written during a
    /// pause is closed by the next listing, at most `max` after its close
    /// time, or by its minute's seal, which the pause never delays.
    /// Writers, readers and the seal keep every acknowledged message safe
    /// whenever the close comes (see the module docs); what a pause costs
    /// is that a late write into such a bag may still be accepted (it
    /// closes the bag itself) and that readers may close it first. Zero:
    /// list every tick (one listing per log per second).
    #[must_use]
    pub fn with_max_idle_listing(mut self, max: Duration) -> Self {
        self.max_idle_listing = max;
        self
    }

    /// Also summarizes ([`crate::summary`]) every stretch of `minutes`
    /// minutes, from where this metronome started, once it is sealed and
    /// `after` past its close time.
    #[must_use]
    pub fn with_summaries(mut self, after: Duration, minutes: u32) -> Self {
        self.summarize = Some((after, minutes.max(1)));
        self
    }

    /// With [`Metronome::with_summaries`]: attests each summary
    /// ([`crate::summary::attest`]).
    #[must_use]
    pub fn with_attester(mut self, attester: crate::summary::attest::Attester) -> Self {
        self.attester = Some(Arc::new(attester));
        self
    }

    /// Checks the clock now and returns the vouched instant; remembers it.
    /// Tells the observer either way.
    pub async fn check_clock(&mut self) -> Result<Micros> {
        let checked = closer_now(self.clock.as_ref()).await;
        if let Some(o) = &self.observer {
            o.clock_checked(checked.as_ref().err());
        }
        let now = checked?;
        self.vouched = Some((now, Instant::now()));
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

    /// How many seconds (over every log found) are past their close time
    /// and not yet closed or sealed by this metronome: the work the next
    /// tick has, or for a log idle in a listing pause
    /// ([`Metronome::with_max_idle_listing`]), the work of its next listing
    /// or seal (its empty seconds all wait for their minute's seal). Zero until the clock has been vouched for
    /// ([`Metronome::check_clock`]) and the logs found
    /// ([`Metronome::find_logs`]).
    pub fn due(&self) -> u64 {
        let Some(now) = self.estimated_now() else {
            return 0;
        };
        // Seconds `b` with `b + 1 + grace <= now` are due: those below this.
        let due_below = now.saturating_sub(self.cfg.grace).as_micros() / 1_000_000;
        self.cursors
            .iter()
            .flatten()
            .map(|c| {
                let n = due_below.saturating_sub(c.span.first().secs());
                n.saturating_sub(c.closed.len() as u64)
            })
            .sum()
    }

    /// Looks up the start mark of every log not found yet, so that
    /// [`Metronome::due`] counts it (a tick does this itself).
    pub async fn find_logs(&mut self) -> Result<()> {
        let Some(now) = self.estimated_now() else {
            return Ok(());
        };
        let horizon = Bucket::of(now.saturating_sub(self.cfg.lookback));
        for i in 0..self.logs.len() {
            if self.cursors[i].is_none()
                && let Some(start) = self.store.log_start(&self.logs[i]).await?
            {
                self.cursors[i] = Some(self.new_cursor(start, horizon));
            }
        }
        Ok(())
    }

    /// Where closing `log` starts: at its start mark or the lookback
    /// horizon, whichever is later.
    fn new_cursor(&self, start: Bucket, horizon: Bucket) -> Cursor {
        let from = Span::of(start.max(horizon));
        Cursor {
            span: from,
            // The first whole stretch from where sealing starts.
            summary: self.summarize.map(|(_, minutes)| {
                let st = crate::summary::Stretch::aligned(from.first(), minutes);
                if st.from() < from.first() { st.next() } else { st }
            }),
            closed: Default::default(),
            idle_pause: Duration::ZERO,
            next_listing: Micros::ZERO,
            listed_through: None,
            fresh: true,
        }
    }

    /// When the next bag (of any log) becomes closable: the close time of
    /// the first second after the last vouched instant.
    pub fn next_close_time(&self) -> Micros {
        match self.vouched {
            Some((now, _)) => Bucket::of(now.saturating_sub(self.cfg.grace)).close_time(self.cfg.grace),
            None => Micros::ZERO,
        }
    }

    /// Closes every bag whose close time has surely passed and seals every
    /// minute whose close time has, on a clock checked at the start of the
    /// tick; closes nothing when the check fails (the error says why). On
    /// an error the log's cursor stays where it failed, so the next tick
    /// retries it; the other logs are closed all the same (one bad log
    /// stalls only itself), and the first error is returned once they are.
    pub async fn tick(&mut self) -> Result<CloseReport> {
        let now = self.check_clock().await?;
        let mut report = CloseReport::default();
        let mut first_error = None;
        for i in 0..self.logs.len() {
            if let Err((bucket, e)) = self.tick_log(i, now, &mut report).await {
                if let Some(o) = &self.observer {
                    o.failed(&self.logs[i], bucket, &e);
                }
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// One log's share of a tick; an error names the bag (or the first
    /// bag of the minute) it was at.
    async fn tick_log(
        &mut self,
        i: usize,
        now: Micros,
        report: &mut CloseReport,
    ) -> std::result::Result<(), (Bucket, Error)> {
        let (store, log, grace) = (self.store.as_ref(), self.logs[i].as_str(), self.cfg.grace);
        let observer = self.observer.as_deref();
        let horizon = Bucket::of(now.saturating_sub(self.cfg.lookback));
        if self.cursors[i].is_none() {
            match store.log_start(log).await.map_err(|e| (horizon, e))? {
                Some(start) => self.cursors[i] = Some(self.new_cursor(start, horizon)),
                None => {
                    report.missing_logs.push(log.to_owned());
                    if let Some(o) = observer {
                        o.log_missing(log);
                    }
                    return Ok(());
                }
            }
        }
        let cursor = self.cursors[i].as_mut().expect("set above");
        let cap = self.max_idle_listing;
        let pause_before = cursor.idle_pause;
        let lag_of = |close_at: Micros| now.duration_since(close_at);
        // Whether this tick looked at every second due (false: the log is
        // idle and its open minute waits for its next listing).
        let mut listed = true;
        while now >= cursor.span.first().close_time(grace) {
            let span = cursor.span;
            let sealable = now >= span.close_time(grace);
            if !sealable && now < cursor.next_listing {
                listed = false;
                break;
            }
            // Its bags that are due, as they appear. An idle log's minute
            // that is due whole is left to its seal, which lists it anyway.
            if !sealable || cursor.idle_pause.is_zero() {
                let bags = seal::bags_of(store, log, span)
                    .await
                    .map_err(|e| (span.first(), e))?;
                let (mut due, mut pending) = (Vec::new(), None::<Micros>);
                for b in bags {
                    if cursor.closed.contains(&b) {
                        continue;
                    }
                    let close_at = b.close_time(grace);
                    if now < close_at {
                        pending = Some(pending.map_or(close_at, |p| p.min(close_at)));
                        continue;
                    }
                    if cursor.fresh
                        && let BagState::Closed(_) = store.state(log, b).await.map_err(|e| (b, e))?
                    {
                        // Closed before this metronome started: not its
                        // close, and no work found.
                        cursor.closed.insert(b);
                        continue;
                    }
                    due.push(b);
                }
                // Together: a store whose close settles (S3) settles once.
                let found = !due.is_empty();
                if let Some(&first) = due.first() {
                    let listings = store.close_all(log, &due).await.map_err(|e| (first, e))?;
                    for (b, listing) in due.into_iter().zip(listings) {
                        let lag = lag_of(b.close_time(grace));
                        if let Some(o) = observer {
                            o.closed(log, b, lag, listing.items.len());
                        }
                        report.add(b, lag);
                        cursor.closed.insert(b);
                    }
                }
                if !sealable {
                    cursor.listed_open_minute(now, found, pending, cap);
                    break;
                }
                if found {
                    cursor.busy(now);
                }
            }
            // The whole minute is due: its seal closes the rest. A seal
            // made before this metronome started closed nothing now.
            let found_sealed = match cursor.fresh {
                true => seal::seal_of(store, log, span)
                    .await
                    .map_err(|e| (span.first(), e))?,
                false => None,
            };
            let sealed_now = found_sealed.is_none();
            let sealed = match found_sealed {
                Some(found) => found,
                None => seal::seal(store, log, span)
                    .await
                    .map_err(|e| (span.first(), e))?,
            };
            let lag = lag_of(span.close_time(grace));
            let mut found = false;
            for b in sealed.bags().filter(|b| sealed_now && !cursor.closed.contains(b)) {
                // A bag written since the last listing (or closed by a
                // reader): the seal closed it.
                found = true;
                let lag = lag_of(b.close_time(grace));
                if let Some(o) = observer {
                    o.closed(log, b, lag, 1);
                }
                report.add(b, lag);
            }
            if found {
                cursor.busy(now);
            }
            if sealed_now {
                if let Some(o) = observer {
                    o.sealed(log, span.last(), lag, sealed.empty_seconds());
                }
                report.add_many(span.last(), lag, sealed.empty_seconds());
                report.sealed += sealed.empty_seconds();
            }
            cursor.listed_through = Some(cursor.listed_through.map_or(span.last(), |t| t.max(span.last())));
            cursor.span = span.next();
            let next = cursor.span.first();
            cursor.closed.retain(|b| *b >= next);
        }
        cursor.fresh = false;
        // Summaries of what is sealed and old enough.
        if let (Some((after, _)), Some(stretch)) = (self.summarize, cursor.summary.as_mut()) {
            while stretch.last() < cursor.span.first()
                && now >= stretch.close_time(grace).saturating_add(after)
            {
                let done =
                    match crate::summary::summarize_attested(store, log, *stretch, self.attester.as_deref())
                        .await
                    {
                        Ok(done) => done,
                        // A corrupt object under the stretch's name (one over
                        // `MAX_SUMMARY_EXPANSION` included) cannot be replaced
                        // (publication is create-only) and will not heal: this
                        // round reports it, naming it, and the next goes on
                        // with the next stretch instead of stopping at it.
                        Err(e @ crate::Error::CorruptSummary { .. }) => {
                            let at = stretch.from();
                            *stretch = stretch.next();
                            return Err((at, e));
                        }
                        Err(e) => return Err((stretch.from(), e)),
                    };
                report.summarized.push(done);
                *stretch = stretch.next();
            }
        }
        // Every second whose close time had passed when its minute was
        // last listed is closed or sealed (or waits, empty, for its
        // minute's seal): every second due now, unless the log is idle in
        // a pause.
        if listed {
            let due = Bucket::of(now.saturating_sub(grace)).secs().checked_sub(1);
            if let Some(t) = due.map(Bucket::from_secs) {
                cursor.listed_through = Some(cursor.listed_through.map_or(t, |l| l.max(t)));
            }
        }
        if let Some(o) = observer {
            if let Some(t) = cursor.listed_through {
                o.caught_up(log, t);
            }
            if cursor.idle_pause != pause_before {
                o.listing_paused(log, cursor.idle_pause);
            }
        }
        Ok(())
    }

    /// One metronome per log, sharing store, settings and observer.
    fn per_log(self) -> Vec<Metronome> {
        self.logs
            .into_iter()
            .zip(self.cursors)
            .map(|(log, cursor)| Metronome {
                store: Arc::clone(&self.store),
                logs: vec![log],
                cursors: vec![cursor],
                cfg: self.cfg.clone(),
                clock: Arc::clone(&self.clock),
                vouched: self.vouched,
                observer: self.observer.clone(),
                summarize: self.summarize,
                attester: self.attester.clone(),
                max_idle_listing: self.max_idle_listing,
            })
            .collect()
    }

    /// Ticks at every close time until `shutdown`, handing each round's
    /// result (including errors, which do not stop the loop) to `on_tick`.
    /// Each log has its own loop: a log whose storage calls hang until
    /// they time out delays no other log's closes. A log idle in a listing
    /// pause ([`Metronome::with_max_idle_listing`]) still ticks once a
    /// second, but such a tick only checks the clock: it calls the store
    /// only when its pause is over or its minute's seal is due.
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
                () = pace::sleep(wait) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests;
