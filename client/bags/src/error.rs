//! The bag engine's one error type: every variant names what went wrong
//! and says whether retrying can help.

use std::io;
use std::time::Duration;

use bagel_proto::Micros;

use crate::bucket::Bucket;

/// Everything that can go wrong in the bag module.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The bag was already closed (or closing) before the write started.
    #[error("bag {bucket} of log {log:?} is closed to new writes")]
    BagClosed { log: String, bucket: Bucket },
    /// The write landed, but after the bag's lock was taken without it: it
    /// is not part of the bag for any reader and is not acknowledged.
    #[error("write to bag {bucket} of log {log:?} landed after the bag was closed; it is not in the bag")]
    LateRejected { log: String, bucket: Bucket },
    /// The lease does not allow this timestamp (at or past deadline - margin).
    #[error(
        "timestamp {ts} is at or past the lease deadline {deadline} minus the safety margin {margin:?}: refusing to write"
    )]
    LeaseExpiring {
        ts: Micros,
        deadline: Micros,
        margin: Duration,
    },
    /// The next timestamp would lie too far ahead of the local clock even
    /// after the bounded pause.
    #[error("next timestamp {ts} is {ahead:?} ahead of the clock ({now}) after pausing; refusing to write")]
    TooFarAhead {
        ts: Micros,
        now: Micros,
        ahead: Duration,
    },
    /// The rights do not allow writing (lost, released, tentative, or the
    /// witnesses do not cover the timestamps).
    #[error("no right to write: {reason}")]
    NoRights { reason: String },
    /// The lease these writes were under is being released.
    #[error("the lease is being released: no more writes under it")]
    WritesClosed,
    /// No recent signed time could be had for the batch (or the local clock
    /// is off): readers would reject it.
    #[error("no signed time for the batch: {detail}")]
    NoSignedTime { detail: String },
    /// The batch's signed time is too far from its timestamps: readers
    /// would reject it.
    #[error(
        "timestamp {ts} is {diff_us} us from the batch's signed time {time} (limit {limit_us} us): refusing to write"
    )]
    SignedTimeOff {
        ts: Micros,
        time: Micros,
        diff_us: u64,
        limit_us: u64,
    },
    /// An item no longer is what the bag's lock lists (its ETag differs).
    #[error("item {item} of bag {bucket} changed since the bag was closed")]
    ItemChanged { bucket: Bucket, item: String },
    /// An item of a bag that the store will not read: a name that is not
    /// one of that bag's data files, a symbolic link, not a regular file,
    /// or a listed size over the reader's per-item limit.
    #[error("item {item:?} of bag {bucket} of log {log:?} refused: {reason}")]
    ItemRefused {
        log: String,
        bucket: Bucket,
        item: String,
        reason: String,
    },
    /// A read would seal (close empty) missing bags further back than the
    /// reader's seal lookback allows: most likely a stray start mark or a
    /// `from` far before the log began.
    #[error(
        "reading log {log:?} would seal {missing} missing past bags from {first} on, further back than \
         the seal lookback {limit:?} allows (a reader closes missing past bags empty so that later \
         readers agree); read from a later time, or raise the lookback"
    )]
    SealTooFar {
        log: String,
        first: Bucket,
        missing: u64,
        limit: Duration,
    },
    #[error("storage operation {op} timed out after {after:?}")]
    Timeout { op: String, after: Duration },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("object store {op} {path}: {source}")]
    Store {
        op: &'static str,
        path: String,
        #[source]
        source: object_store::Error,
    },
    /// The store accepted a second create-only PUT of the same key.
    #[error(
        "the object store {store} ignores conditional writes (a PUT of {key} with {condition}, which must be refused, succeeded); bags cannot be closed, nor leases held, safely on it: refusing to run"
    )]
    ConditionalWritesIgnored {
        store: String,
        key: String,
        /// The header the store ignored: `If-None-Match: *` or `If-Match`.
        condition: &'static str,
    },
    /// A lock file/object that does not parse.
    #[error("lock of bag {bucket} of log {log:?} is corrupt: {reason}")]
    CorruptLock {
        log: String,
        bucket: Bucket,
        reason: String,
    },
    /// A span's seal that does not parse, or names another span.
    #[error("seal of the minute from {span} of log {log:?} is corrupt: {reason}")]
    CorruptSeal {
        log: String,
        span: Bucket,
        reason: String,
    },
    /// A stretch that cannot be summarized (yet): a minute not sealed, a
    /// bag not closed, too big.
    #[error("cannot summarize {stretch} of log {log:?}: {reason}")]
    NotSummarizable {
        log: String,
        stretch: String,
        reason: String,
    },
    /// A published summary is not the one the bags give.
    #[error("summary {name} of log {log:?}: {reason}")]
    SummaryMismatch {
        log: String,
        name: String,
        reason: String,
    },
    /// A published summary that does not parse, contradicts its name, or
    /// would expand past [`crate::summary::MAX_SUMMARY_EXPANSION`]. `name`
    /// is its object's name in the log (`_summary/<first second>.<seconds>`),
    /// so an operator can find (and remove) the very object.
    #[error("summary {name} of log {log:?} is corrupt: {reason}")]
    CorruptSummary {
        log: String,
        name: String,
        reason: String,
    },
    #[error("invalid {what} {value:?}: {reason}")]
    Invalid {
        what: &'static str,
        value: String,
        reason: String,
    },
    /// The bag's close time has not come yet; closing it now could reject
    /// writes that are on time.
    #[error("bag {bucket} may not be closed before {close_at} (now {now})")]
    TooEarly {
        bucket: Bucket,
        close_at: Micros,
        now: Micros,
    },
    /// This process's clock is not vouched for by signed time right now
    /// (no time authority, no recent answer, a clock that is off or was
    /// stepped): it does not close bags, since a clock ahead would close
    /// them under writers that are on time.
    #[error("not closing bags: this process's clock is not vouched for by signed time: {reason}")]
    ClockUnvouched { reason: String },
    /// Injected by the fault wrappers in tests.
    #[error("injected fault: {0}")]
    Injected(String),
}

impl Error {
    /// A short, fixed name of the variant (`timeout`, `io`, `store`, ...),
    /// for metrics labels and log fields: never carries a path or a value.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::BagClosed { .. } => "bag_closed",
            Error::LateRejected { .. } => "late_rejected",
            Error::LeaseExpiring { .. } => "lease_expiring",
            Error::TooFarAhead { .. } => "too_far_ahead",
            Error::NoRights { .. } => "no_rights",
            Error::WritesClosed => "writes_closed",
            Error::NoSignedTime { .. } => "no_signed_time",
            Error::SignedTimeOff { .. } => "signed_time_off",
            Error::ItemChanged { .. } => "item_changed",
            Error::ItemRefused { .. } => "item_refused",
            Error::SealTooFar { .. } => "seal_too_far",
            Error::Timeout { .. } => "timeout",
            Error::Io { .. } => "io",
            Error::Store { .. } => "store",
            Error::ConditionalWritesIgnored { .. } => "conditional_writes_ignored",
            Error::CorruptLock { .. } => "corrupt_lock",
            Error::CorruptSeal { .. } => "corrupt_seal",
            Error::NotSummarizable { .. } => "not_summarizable",
            Error::SummaryMismatch { .. } => "summary_mismatch",
            Error::CorruptSummary { .. } => "corrupt_summary",
            Error::Invalid { .. } => "invalid",
            Error::TooEarly { .. } => "too_early",
            Error::ClockUnvouched { .. } => "clock_unvouched",
            Error::Injected(_) => "injected",
        }
    }

    /// Whether trying the same operation again may succeed. Permanent errors
    /// (a closed bag, an expiring lease, a lying store, bad input) will not
    /// go away by retrying.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Timeout { .. }
            | Error::TooFarAhead { .. }
            | Error::TooEarly { .. }
            | Error::ClockUnvouched { .. }
            | Error::NotSummarizable { .. }
            | Error::NoSignedTime { .. }
            | Error::SignedTimeOff { .. } => true,
            Error::Io { source, .. } => !matches!(
                source.kind(),
                io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData | io::ErrorKind::Unsupported
            ),
            Error::Store { source, .. } => matches!(source, object_store::Error::Generic { .. }),
            Error::BagClosed { .. }
            | Error::LateRejected { .. }
            | Error::LeaseExpiring { .. }
            | Error::ConditionalWritesIgnored { .. }
            | Error::CorruptLock { .. }
            | Error::CorruptSeal { .. }
            | Error::SummaryMismatch { .. }
            | Error::CorruptSummary { .. }
            | Error::Invalid { .. }
            | Error::NoRights { .. }
            | Error::WritesClosed
            | Error::ItemChanged { .. }
            | Error::ItemRefused { .. }
            | Error::SealTooFar { .. }
            | Error::Injected(_) => false,
        }
    }

    /// A file or object that is not there (any more).
    pub fn is_not_found(&self) -> bool {
        match self {
            Error::Io { source, .. } => source.kind() == io::ErrorKind::NotFound,
            Error::Store { source, .. } => matches!(source, object_store::Error::NotFound { .. }),
            _ => false,
        }
    }

    /// The opposite of [`Error::is_retryable`].
    pub fn is_permanent(&self) -> bool {
        !self.is_retryable()
    }

    pub(crate) fn io(op: &'static str, path: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn invalid(what: &'static str, value: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Invalid {
            what,
            value: value.into(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
