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
    BagClosed {
        /// The log written to.
        log: String,
        /// The closed bag's second.
        bucket: Bucket,
    },
    /// The write landed, but after the bag's lock was taken without it: it
    /// is not part of the bag for any reader and is not acknowledged.
    #[error("write to bag {bucket} of log {log:?} landed after the bag was closed; it is not in the bag")]
    LateRejected {
        /// The log written to.
        log: String,
        /// The bag whose lock left the write out.
        bucket: Bucket,
    },
    /// The lease does not allow this timestamp (at or past deadline - margin).
    #[error(
        "timestamp {ts} is at or past the lease deadline {deadline} minus the safety margin {margin:?}: refusing to write"
    )]
    LeaseExpiring {
        /// The batch's last timestamp.
        ts: Micros,
        /// The deadline it reaches, µs since the Unix epoch.
        deadline: Micros,
        /// How long before the deadline writes stop ([`crate::BagConfig`]).
        margin: Duration,
    },
    /// The next timestamp would lie too far ahead of the local clock even
    /// after the bounded pause.
    #[error("next timestamp {ts} is {ahead:?} ahead of the clock ({now}) after pausing; refusing to write")]
    TooFarAhead {
        /// The timestamp the write would have had.
        ts: Micros,
        /// The local clock's reading after the pause.
        now: Micros,
        /// How far `ts` lies past `now`.
        ahead: Duration,
    },
    /// The rights do not allow writing (lost, released, tentative, or the
    /// witnesses do not cover the timestamps).
    #[error("no right to write: {reason}")]
    NoRights {
        /// Why the rights refuse, for people.
        reason: String,
    },
    /// The lease these writes were under is being released.
    #[error("the lease is being released: no more writes under it")]
    WritesClosed,
    /// No recent signed time could be had for the batch (or the local clock
    /// is off): readers would reject it.
    #[error("no signed time for the batch: {detail}")]
    NoSignedTime {
        /// What the time source said, for people.
        detail: String,
    },
    /// The batch's signed time is too far from its timestamps: readers
    /// would reject it.
    #[error(
        "timestamp {ts} is {diff_us} us from the batch's signed time {time} (limit {limit_us} us): refusing to write"
    )]
    SignedTimeOff {
        /// The batch's first or last timestamp, whichever is off.
        ts: Micros,
        /// The batch's signed time (the authority's clock).
        time: Micros,
        /// How far apart `ts` and `time` are, in µs.
        diff_us: u64,
        /// The most readers accept, in µs.
        limit_us: u64,
    },
    /// An item no longer is what the bag's lock lists (its ETag differs).
    #[error("item {item} of bag {bucket} changed since the bag was closed")]
    ItemChanged {
        /// The closed bag.
        bucket: Bucket,
        /// The item's name in the bag.
        item: String,
    },
    /// An item of a bag that the store will not read: a name that is not
    /// one of that bag's data files, a symbolic link, not a regular file,
    /// or a listed size over the reader's per-item limit.
    #[error("item {item:?} of bag {bucket} of log {log:?} refused: {reason}")]
    ItemRefused {
        /// The log read.
        log: String,
        /// The bag listing the item.
        bucket: Bucket,
        /// The item's name as listed.
        item: String,
        /// Why it was refused, for people.
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
        /// The log read.
        log: String,
        /// The earliest missing bag the read would seal.
        first: Bucket,
        /// How many missing bags it would seal.
        missing: u64,
        /// The reader's seal lookback it exceeds.
        limit: Duration,
    },
    /// A store call took longer than its bound ([`crate::BagConfig`]'s
    /// operation timeout); it may or may not have taken effect.
    #[error("storage operation {op} timed out after {after:?}")]
    Timeout {
        /// The operation and what it was on, for people.
        op: String,
        /// The bound it ran past.
        after: Duration,
    },
    /// A file system call failed (directory and NFS stores).
    #[error("{op} {path}: {source}")]
    Io {
        /// The call (`create`, `link`, `stat`, ...).
        op: &'static str,
        /// The file or directory it was on.
        path: String,
        /// What the file system said; its kind decides [`Error::is_retryable`].
        #[source]
        source: io::Error,
    },
    /// An object store call failed (S3 stores).
    #[error("object store {op} {path}: {source}")]
    Store {
        /// The call (`get`, `put`, `list`, ...).
        op: &'static str,
        /// The object's key, or the prefix listed.
        path: String,
        /// What the object store said; `NotFound` is [`Error::is_not_found`].
        #[source]
        source: object_store::Error,
    },
    /// The store accepted a second create-only PUT of the same key.
    #[error(
        "the object store {store} ignores conditional writes (a PUT of {key} with {condition}, which must be refused, succeeded); bags cannot be closed, nor leases held, safely on it: refusing to run"
    )]
    ConditionalWritesIgnored {
        /// The store, as its URL describes it.
        store: String,
        /// The key of the probe that should have been refused.
        key: String,
        /// The header the store ignored: `If-None-Match: *` or `If-Match`.
        condition: &'static str,
    },
    /// A lock file/object that does not parse.
    #[error("lock of bag {bucket} of log {log:?} is corrupt: {reason}")]
    CorruptLock {
        /// The log read.
        log: String,
        /// The bag whose lock it is.
        bucket: Bucket,
        /// What does not parse, for people.
        reason: String,
    },
    /// A span's seal that does not parse, or names another span.
    #[error("seal of the minute from {span} of log {log:?} is corrupt: {reason}")]
    CorruptSeal {
        /// The log read.
        log: String,
        /// The first second of the minute the seal closes.
        span: Bucket,
        /// What does not parse, for people.
        reason: String,
    },
    /// A stretch that cannot be summarized (yet): a minute not sealed, a
    /// bag not closed, too big.
    #[error("cannot summarize {stretch} of log {log:?}: {reason}")]
    NotSummarizable {
        /// The log summarized.
        log: String,
        /// The stretch, as its first second and length.
        stretch: String,
        /// What stands in the way, for people.
        reason: String,
    },
    /// A published summary is not the one the bags give.
    #[error("summary {name} of log {log:?}: {reason}")]
    SummaryMismatch {
        /// The log summarized.
        log: String,
        /// The summary's object name in the log.
        name: String,
        /// How it differs, for people.
        reason: String,
    },
    /// A published summary that does not parse, contradicts its name, or
    /// would expand past [`crate::summary::MAX_SUMMARY_EXPANSION`]. `name`
    /// is its object's name in the log (`_summary/<first second>.<seconds>`),
    /// so an operator can find (and remove) the very object.
    #[error("summary {name} of log {log:?} is corrupt: {reason}")]
    CorruptSummary {
        /// The log read.
        log: String,
        /// The summary's object name in the log.
        name: String,
        /// What is wrong, for people.
        reason: String,
    },
    /// Bad input from the caller: a log name, writer id, store URL,
    /// configuration; never goes away by retrying.
    #[error("invalid {what} {value:?}: {reason}")]
    Invalid {
        /// What kind of input (`log name`, `store URL`, ...).
        what: &'static str,
        /// The input as given.
        value: String,
        /// What is wrong with it, for people.
        reason: String,
    },
    /// The bag's close time has not come yet; closing it now could reject
    /// writes that are on time.
    #[error("bag {bucket} may not be closed before {close_at} (now {now})")]
    TooEarly {
        /// The bag asked to close.
        bucket: Bucket,
        /// Its close time: the end of its second plus grace.
        close_at: Micros,
        /// The closer's vouched time.
        now: Micros,
    },
    /// This process's clock is not vouched for by signed time right now
    /// (no time authority, no recent answer, a clock that is off or was
    /// stepped): it does not close bags, since a clock ahead would close
    /// them under writers that are on time.
    #[error("not closing bags: this process's clock is not vouched for by signed time: {reason}")]
    ClockUnvouched {
        /// Why the clock is not vouched for, for people.
        reason: String,
    },
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

/// A result whose error is the bag engine's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
