//! Clocks, injectable so that time-dependent logic is tested exactly.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::Micros;

/// A source of "now". Production uses [`SystemClock`]; tests use
/// [`ManualClock`] to move time by exact amounts.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time by this clock. Not monotonic: a system clock may
    /// step back, and callers that compare readings must allow for it.
    fn now(&self) -> Micros;
}

/// A shared clock is a clock (so wrappers such as [`AssumedExact`] take
/// an `Arc<dyn Clock>`).
impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Micros {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> Micros {
        (**self).now()
    }
}

/// The host's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Micros {
        Micros::now()
    }
}

/// A clock that only moves when told to. Cheap to clone; clones share time.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `start` until it is set or advanced.
    pub fn new(start: Micros) -> Self {
        ManualClock {
            now: Arc::new(AtomicU64::new(start.as_micros())),
        }
    }

    /// Jumps to `t`, backwards too (to test a clock stepped back).
    pub fn set(&self, t: Micros) {
        self.now.store(t.as_micros(), Ordering::SeqCst);
    }

    /// Moves forward by `d` (whole microseconds), for every clone.
    pub fn advance(&self, d: Duration) {
        self.now.fetch_add(crate::duration_micros(d), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        Micros::from_micros(self.now.load(Ordering::SeqCst))
    }
}

/// A clock offset from another by a fixed amount; used to simulate a host
/// whose clock is wrong.
#[derive(Clone, Debug)]
pub struct OffsetClock<C> {
    /// The clock read before the offset is applied.
    pub inner: C,
    /// Microseconds added (positive) or subtracted (negative).
    pub offset_us: i64,
}

impl<C: Clock> Clock for OffsetClock<C> {
    fn now(&self) -> Micros {
        let t = self.inner.now().as_micros();
        Micros::from_micros(t.saturating_add_signed(self.offset_us))
    }
}

/// A clock reading that signed time vouches for, and how far from true
/// time it may be: true time lies in `[now - bound, now + bound]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoundedNow {
    /// The local clock's reading.
    pub now: Micros,
    /// How far `now` may be from true time, either way: the authority's
    /// radius plus the measured offset and drift since its answer.
    pub bound: Duration,
}

impl BoundedNow {
    /// An instant true time has surely reached: `now - bound`. A closer
    /// compares close times with this, never with `now`, so a clock ahead
    /// by up to its bound never closes a bag before its time.
    pub fn surely_reached(&self) -> Micros {
        self.now.saturating_sub(self.bound)
    }
}

/// A clock checked against a time authority: what every process that
/// closes bags acts on (a closer decides by time as much as a writer
/// does, so it is held to the same check). `checked_now` refuses, saying
/// why, when the clock cannot be vouched for right now (no answer from the
/// authority, an old answer, a clock that is off or stepped since the last
/// answer).
#[async_trait]
pub trait CheckedClock: Send + Sync + fmt::Debug {
    /// Now with its error bound, or why the clock cannot be vouched for
    /// (a sentence for logs and refusals; the caller does not act on time
    /// until a later call succeeds).
    async fn checked_now(&self) -> Result<BoundedNow, String>;
}

/// A clock *assumed* exact (bound 0) without asking any authority: for
/// tests whose processes share one host clock, and for tools run with an
/// explicit "unsafe: trust this host's clock" flag. Never what a closer
/// gets by default.
#[derive(Clone, Debug, Default)]
pub struct AssumedExact<C>(pub C);

#[async_trait]
impl<C: Clock> CheckedClock for AssumedExact<C> {
    async fn checked_now(&self) -> Result<BoundedNow, String> {
        Ok(BoundedNow {
            now: self.0.now(),
            bound: Duration::ZERO,
        })
    }
}

/// A clock that refuses every check with a fixed reason: what a closer is
/// given when no time authority could even be set up, so it says why it
/// does not close instead of closing on an unchecked clock.
#[derive(Clone, Debug)]
pub struct Unvouched(pub String);

#[async_trait]
impl CheckedClock for Unvouched {
    async fn checked_now(&self) -> Result<BoundedNow, String> {
        Err(self.0.clone())
    }
}
