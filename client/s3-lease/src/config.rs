//! [`S3LeaseConfig`]: the limits and margins of the S3 lease backend.

use std::time::Duration;

use bagel_lease_core::LeaseLimits;

/// Limits and margins. Defaults: TTLs in `(1 s, 60 s]`, a 14 s clock
/// margin, waits up to 60 s, 5 s per store call, the server's size limits.
///
/// The TTL range is wider than the server's (10 s max): an S3 renewal
/// costs a billed PUT and tens of milliseconds, so S3 leases are usually
/// longer. The minimum keeps a renewal (a third of the TTL) well above the
/// latency of a PUT.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct S3LeaseConfig {
    /// What a request may ask for (the TTL range, the longest wait, the
    /// sizes of names, owners and metadata), checked by the rules the
    /// server checks them by.
    pub limits: LeaseLimits,
    /// Others treat a lease as over no earlier than its deadline plus
    /// this, and later when the holder's stored clock error bound plus
    /// their own is more. A client refuses to act when its own bound is
    /// over half of it, so any two clients of one margin are covered (see
    /// docs/leases-without-a-server.md, "The clock margin"). Default 14 s: twice the 5 s
    /// radius of a roughenough 2.2 server plus 2 s of offset and RTT.
    pub clock_margin: Duration,
    /// Each store call is given up (as retryable) after this long.
    pub op_timeout: Duration,
    /// How far a release's watermark may be ahead of its signed time (or
    /// of the releaser's checked clock), as the server's
    /// `--timestamp-tolerance`.
    pub timestamp_tolerance: Duration,
    /// Renewals with metadata and releases kept per name, in its object.
    pub history_per_name: usize,
}

impl Default for S3LeaseConfig {
    fn default() -> Self {
        S3LeaseConfig {
            limits: LeaseLimits {
                min_ttl: Duration::from_secs(1),
                max_ttl: Duration::from_secs(60),
                max_wait: Duration::from_secs(60),
                ..LeaseLimits::default()
            },
            clock_margin: Duration::from_secs(14),
            op_timeout: Duration::from_secs(5),
            timestamp_tolerance: Duration::from_secs(1),
            history_per_name: 8,
        }
    }
}

impl S3LeaseConfig {
    /// Sets the shortest TTL asked for (exclusive: a deadline must lie
    /// beyond `now + d`). Keep a third of it well above a PUT's latency,
    /// or renewals fall behind.
    #[must_use]
    pub fn with_min_ttl(mut self, d: Duration) -> Self {
        self.limits.min_ttl = d;
        self
    }

    /// Sets the longest TTL a lease may be granted or renewed for.
    #[must_use]
    pub fn with_max_ttl(mut self, d: Duration) -> Self {
        self.limits.max_ttl = d;
        self
    }

    /// Sets [`S3LeaseConfig::clock_margin`]. Every client of one prefix
    /// must use the same margin: a smaller one lets a client take over a
    /// lease its holder still believes valid.
    #[must_use]
    pub fn with_clock_margin(mut self, d: Duration) -> Self {
        self.clock_margin = d;
        self
    }

    /// Sets the longest an acquire may wait (polling) for a busy name.
    #[must_use]
    pub fn with_max_wait(mut self, d: Duration) -> Self {
        self.limits.max_wait = d;
        self
    }

    /// Sets [`S3LeaseConfig::op_timeout`].
    #[must_use]
    pub fn with_op_timeout(mut self, d: Duration) -> Self {
        self.op_timeout = d;
        self
    }

    /// Sets [`S3LeaseConfig::history_per_name`]; the oldest entries are
    /// dropped past it (and the object says so).
    #[must_use]
    pub fn with_history_per_name(mut self, n: usize) -> Self {
        self.history_per_name = n;
        self
    }
}
