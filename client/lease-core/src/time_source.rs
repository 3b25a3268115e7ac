//! [`TimeSource`]: the signed time a writer attaches to what it writes, and
//! the check that its own clock is right before it timestamps anything.
//!
//! ```no_run
//! # async fn demo(client: impl bagel_lease_core::TimeAuthority + 'static) -> Result<(), bagel_lease_core::Error> {
//! use bagel_lease_core::{TimeOptions, TimeSource};
//! use bagel_proto::signed_time::roughtime::{RoughtimeKey, RoughtimeServer};
//!
//! // With Roughtime (what the CLI's --roughtime/--roughtime-key build):
//! let key = RoughtimeKey::parse("AW5uAoTSTDfG5NfY1bTh08GUnOqlRb+HVhbJ3ODJvsE=").unwrap();
//! let time = TimeSource::roughtime(
//!     vec![RoughtimeServer::new("roughtime.example:2002", key)],
//!     TimeOptions::default(),
//! );
//! // Or, without Roughtime, from the lease server's SignedNow:
//! let time = TimeSource::lease_server(client, TimeOptions::default());
//!
//! // Before writing: refuses (Error::ClockOff) if the local clock is off.
//! let signed = time.check().await?; // a recent signed time to attach
//! let ts = time.now(); // the local clock, just checked
//! # let _ = (signed, ts); Ok(()) }
//! ```
//!
//! That is the whole API a writer needs: [`TimeSource::check`] then
//! [`TimeSource::now`]. `check` asks the authority again when its latest
//! answer is older than [`TimeOptions::refresh`] (one query at a time,
//! shared by concurrent callers), so calling it per batch is cheap.
//!
//! The local clock is **off** when it is further from the signed time than
//! `tolerance + radius + RTT/2` (see [`bagel_proto::authority::monitor`]); then
//! `check` fails with [`Error::ClockOff`], which is not retryable: fix the
//! clock. No recent answer at all is [`Error::NoSignedTime`], retryable.
//!
//! With the lease server as the authority, its local signed time can be up
//! to its re-signing interval (100 ms by default) old when it answers; the
//! tolerance absorbs that. A Roughtime proof relayed by a lease server is
//! checked against the key it names: trusting it is trusting the lease
//! server that chose that Roughtime server. Configure Roughtime on the
//! writer to trust a Roughtime key directly.

use std::sync::Arc;
use std::time::Duration;

use bagel_proto::authority::monitor::{ClockMonitor, Measurement, Verdict};
use bagel_proto::authority::querier::{Querier, QueryConfig};
use bagel_proto::clock::{BoundedNow, CheckedClock, Clock, SystemClock};
use bagel_proto::signed_time::roughtime::{RoughtimeKey, RoughtimeServer};
use bagel_proto::{Micros, SignedClock, SignedReading};

use crate::error::{Error, Result};

/// Signed time from somewhere other than Roughtime: a lease server's
/// `SignedNow` (`bagel_client::Client` is one). Its answer is checked
/// here, against the keys it trusts, and measured on the local `clock`
/// (when it was sent, when it came back).
#[async_trait::async_trait]
pub trait TimeAuthority: Send + Sync + std::fmt::Debug {
    /// Asks once and returns the checked, measured answer; a failure is
    /// [`Error::NoSignedTime`] (or the transport's error), never a guess.
    async fn measure(&self, clock: &Arc<dyn Clock>) -> Result<Measurement>;
}

/// How a [`TimeSource`] judges and refreshes. Defaults: system clock, 500 ms
/// tolerance (the lease server's default), refresh every 1 s, an answer
/// older than 10 s is stale.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct TimeOptions {
    /// The local clock to check and to read timestamps from.
    pub clock: Arc<dyn Clock>,
    /// How far the local clock may be from the signed time (beyond the
    /// answer's radius and half its round trip) before
    /// [`TimeSource::check`] refuses with [`Error::ClockOff`].
    pub tolerance: Duration,
    /// How old the latest answer may get before [`TimeSource::check`] asks
    /// the authority again.
    pub refresh: Duration,
    /// An answer older than this no longer counts: with no newer one,
    /// [`TimeSource::check`] fails with [`Error::NoSignedTime`].
    pub max_age: Duration,
    /// How patiently Roughtime is asked (timeout and attempts per server).
    pub query: QueryConfig,
}

impl Default for TimeOptions {
    fn default() -> Self {
        TimeOptions {
            clock: Arc::new(SystemClock),
            tolerance: Duration::from_millis(500),
            refresh: Duration::from_secs(1),
            max_age: Duration::from_secs(10),
            query: QueryConfig::default(),
        }
    }
}

impl TimeOptions {
    /// The local clock to check and to read timestamps from.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// See [`TimeOptions::tolerance`].
    #[must_use]
    pub fn with_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// See [`TimeOptions::refresh`].
    #[must_use]
    pub fn with_refresh(mut self, refresh: Duration) -> Self {
        self.refresh = refresh;
        self
    }

    /// See [`TimeOptions::max_age`].
    #[must_use]
    pub fn with_max_age(mut self, max_age: Duration) -> Self {
        self.max_age = max_age;
        self
    }

    /// See [`TimeOptions::query`].
    #[must_use]
    pub fn with_query(mut self, query: QueryConfig) -> Self {
        self.query = query;
        self
    }
}

#[derive(Debug)]
enum Authority {
    Roughtime(Querier),
    LeaseServer(Arc<dyn TimeAuthority>),
}

#[derive(Debug)]
struct Inner {
    authority: Authority,
    monitor: ClockMonitor,
    refresh: Duration,
    /// Held while one caller refreshes, so concurrent `check`s share one
    /// query (an async mutex: it is held across the query's `.await`).
    refreshing: tokio::sync::Mutex<()>,
}

/// Signed time and a clock check for writers. Cheap to clone (clones share
/// the latest answer).
#[derive(Clone, Debug)]
pub struct TimeSource {
    inner: Arc<Inner>,
}

impl TimeSource {
    /// Signed time from Roughtime servers (tried in order).
    pub fn roughtime(servers: Vec<RoughtimeServer>, opts: TimeOptions) -> Self {
        let querier = Querier::new(servers, Arc::clone(&opts.clock)).with_config(opts.query);
        Self::with_authority(Authority::Roughtime(querier), opts)
    }

    /// Signed time from the lease server's `SignedNow` (its own signed clock,
    /// or the Roughtime proof it holds), through `server` (a
    /// `bagel_client::Client`).
    pub fn lease_server(server: impl TimeAuthority + 'static, opts: TimeOptions) -> Self {
        Self::with_authority(Authority::LeaseServer(Arc::new(server)), opts)
    }

    /// Roughtime when any server is given, else the lease server; what the
    /// CLI builds from its flags.
    pub fn from_config(
        roughtime: Vec<RoughtimeServer>,
        server: Option<impl TimeAuthority + 'static>,
        opts: TimeOptions,
    ) -> Result<Self> {
        match (roughtime.is_empty(), server) {
            (false, _) => Ok(Self::roughtime(roughtime, opts)),
            (true, Some(server)) => Ok(Self::lease_server(server, opts)),
            (true, None) => Err(Error::NoSignedTime {
                detail: "no time authority: configure --roughtime/--roughtime-key or a lease server".into(),
            }),
        }
    }

    fn with_authority(authority: Authority, opts: TimeOptions) -> Self {
        TimeSource {
            inner: Arc::new(Inner {
                authority,
                monitor: ClockMonitor::new(opts.clock, opts.tolerance, opts.max_age),
                refresh: opts.refresh,
                refreshing: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// The local clock this source checks, for code that must read the
    /// very clock the check vouches for (a lease backend's TTLs).
    pub fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(self.inner.monitor.clock())
    }

    /// The local clock. Call [`TimeSource::check`] first to know it is right.
    pub fn now(&self) -> Micros {
        self.inner.monitor.clock().now()
    }

    /// Refreshes the signed time if it is older than the refresh interval,
    /// then returns it with the reading it proves, or refuses if the local
    /// clock is off ([`Error::ClockOff`]) or no recent signed time could be
    /// had ([`Error::NoSignedTime`]).
    pub async fn check(&self) -> Result<SignedReading> {
        if self.needs_refresh() {
            let _one_at_a_time = self.inner.refreshing.lock().await;
            // Someone else may have refreshed while we waited.
            if self.needs_refresh() {
                let _ = self.query_and_record().await;
            }
        }
        match self.verdict() {
            Verdict::Healthy { measurement, .. } => Ok(SignedReading {
                signed: measurement.signed.clone(),
                reading: measurement.reading,
            }),
            v @ Verdict::Off { .. } => Err(Error::ClockOff {
                detail: v.to_string(),
            }),
            v => Err(Error::NoSignedTime {
                detail: v.to_string(),
            }),
        }
    }

    /// Asks the authority now, whatever the age of the latest answer.
    pub async fn refresh(&self) -> Result<Arc<Measurement>> {
        let _one_at_a_time = self.inner.refreshing.lock().await;
        self.query_and_record().await
    }

    /// The latest signed time, checked or not.
    pub fn signed_time(&self) -> Option<SignedReading> {
        self.latest().map(|m| SignedReading {
            signed: m.signed.clone(),
            reading: m.reading,
        })
    }

    /// The latest good answer, with its offset, radius and round trip.
    pub fn latest(&self) -> Option<Arc<Measurement>> {
        self.inner.monitor.latest()
    }

    /// The current verdict on the local clock, without asking again.
    pub fn verdict(&self) -> Verdict {
        self.inner.monitor.verdict()
    }

    /// The Roughtime keys this source trusts (empty for a lease server).
    pub fn roughtime_keys(&self) -> Vec<RoughtimeKey> {
        match &self.inner.authority {
            Authority::Roughtime(q) => q.trusted_keys(),
            Authority::LeaseServer(_) => Vec::new(),
        }
    }

    fn needs_refresh(&self) -> bool {
        self.inner
            .monitor
            .age()
            .is_none_or(|age| age >= self.inner.refresh)
    }

    async fn query_and_record(&self) -> Result<Arc<Measurement>> {
        let outcome = match &self.inner.authority {
            Authority::Roughtime(q) => q.query().await.map_err(|e| Error::NoSignedTime {
                detail: e.to_string(),
            }),
            Authority::LeaseServer(server) => server.measure(self.inner.monitor.clock()).await,
        };
        match outcome {
            Ok(m) => {
                self.inner.monitor.record(Ok(m));
                Ok(self.inner.monitor.latest().expect("just recorded"))
            }
            Err(e) => {
                self.inner.monitor.record(Err(e.to_string()));
                Err(e)
            }
        }
    }
}

/// Writers take their per-batch signed time from a [`TimeSource`]: it
/// refuses when the local clock is off or no recent answer could be had.
#[async_trait::async_trait]
impl SignedClock for TimeSource {
    async fn signed_now(&self) -> std::result::Result<SignedReading, String> {
        self.check().await.map_err(|e| e.to_string())
    }

    fn error_bound(&self) -> Option<Duration> {
        let v = self.verdict();
        v.is_healthy().then(|| v.error_bound()).flatten()
    }
}

/// Closers (metronomes, readers, audits, new holders settling a broken
/// predecessor) act on a [`TimeSource`] too: the local clock, once checked,
/// with its measured error bound; refused when the check fails.
#[async_trait::async_trait]
impl CheckedClock for TimeSource {
    async fn checked_now(&self) -> std::result::Result<BoundedNow, String> {
        self.check().await.map_err(|e| e.to_string())?;
        let now = self.now();
        match self.verdict() {
            v @ Verdict::Healthy { .. } => Ok(BoundedNow {
                now,
                bound: v.error_bound().expect("a healthy verdict has a measurement"),
            }),
            v => Err(v.to_string()),
        }
    }
}
