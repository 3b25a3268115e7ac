//! Settings shared by writers, closers and readers.

use std::time::Duration;

use bagel_proto::Micros;

use crate::bucket::Bucket;

/// Settings shared by writers, closers and readers. The writer's `grace`
/// and `clock_tolerance` must match (or be more cautious than) what the
/// metronomes use.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct BagConfig {
    /// A bag `[s, s+1)` closes at `s + 1 + grace`.
    pub grace: Duration,
    /// How far apart the clocks of writers and closers may be. A write that
    /// finishes before `close_time - clock_tolerance` needs no extra check.
    pub clock_tolerance: Duration,
    /// Writers refuse timestamps at or past `deadline - deadline_margin`.
    pub deadline_margin: Duration,
    /// A timestamp may run at most this far ahead of the clock...
    pub max_ahead: Duration,
    /// ...after pausing at most this long for the clock to catch up.
    pub max_pause: Duration,
    /// Every storage call gives up after this long.
    pub op_timeout: Duration,
    /// The metronome starts closing at `now - lookback`.
    pub lookback: Duration,
    /// fsync data files and lock files before acknowledging (POSIX).
    pub sync: bool,
    /// Readers reject a message more than this (plus the signer's radius)
    /// away from its batch's signed time.
    pub signed_time_tolerance: Duration,
}

impl Default for BagConfig {
    fn default() -> Self {
        BagConfig {
            grace: Duration::from_secs(2),
            clock_tolerance: Duration::from_secs(1),
            deadline_margin: Duration::from_millis(500),
            max_ahead: Duration::from_millis(100),
            max_pause: Duration::from_secs(1),
            op_timeout: Duration::from_secs(10),
            lookback: Duration::from_secs(60),
            sync: true,
            signed_time_tolerance: Duration::from_secs(1),
        }
    }
}

impl BagConfig {
    /// Set [`BagConfig::grace`]: every closer and writer of a log must agree on it.
    #[must_use]
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }
    /// Set [`BagConfig::clock_tolerance`].
    #[must_use]
    pub fn with_clock_tolerance(mut self, d: Duration) -> Self {
        self.clock_tolerance = d;
        self
    }
    /// Set [`BagConfig::deadline_margin`].
    #[must_use]
    pub fn with_deadline_margin(mut self, d: Duration) -> Self {
        self.deadline_margin = d;
        self
    }
    /// Set [`BagConfig::max_ahead`].
    #[must_use]
    pub fn with_max_ahead(mut self, d: Duration) -> Self {
        self.max_ahead = d;
        self
    }
    /// Set [`BagConfig::max_pause`].
    #[must_use]
    pub fn with_max_pause(mut self, d: Duration) -> Self {
        self.max_pause = d;
        self
    }
    /// Set [`BagConfig::op_timeout`].
    #[must_use]
    pub fn with_op_timeout(mut self, d: Duration) -> Self {
        self.op_timeout = d;
        self
    }
    /// Set [`BagConfig::lookback`].
    #[must_use]
    pub fn with_lookback(mut self, d: Duration) -> Self {
        self.lookback = d;
        self
    }
    /// Set [`BagConfig::sync`]: off trades durability on a crash for speed.
    #[must_use]
    pub fn with_sync(mut self, sync: bool) -> Self {
        self.sync = sync;
        self
    }
    /// Set [`BagConfig::signed_time_tolerance`].
    #[must_use]
    pub fn with_signed_time_tolerance(mut self, d: Duration) -> Self {
        self.signed_time_tolerance = d;
        self
    }

    /// Before this instant a finished write of `bucket` is known to be in.
    pub fn safe_point(&self, bucket: Bucket) -> Micros {
        bucket.close_time(self.grace).saturating_sub(self.clock_tolerance)
    }
}
