//! Clocks, injectable so that time-dependent logic is tested exactly.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::Micros;

/// A source of "now". Production uses [`SystemClock`]; tests use
/// [`ManualClock`] to move time by exact amounts.
pub trait Clock: Send + Sync + fmt::Debug {
    fn now(&self) -> Micros;
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
    pub fn new(start: Micros) -> Self {
        ManualClock {
            now: Arc::new(AtomicU64::new(start.as_micros())),
        }
    }

    pub fn set(&self, t: Micros) {
        self.now.store(t.as_micros(), Ordering::SeqCst);
    }

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
