//! The lease core's one error type, for every backend alike. Its variants
//! name the failure (a field and why, who holds a name until when, why a
//! lease is not held, what is unavailable until when, a store's failure
//! and its source) and never a transport's codes: the gRPC client maps a
//! status into it at its edge (`bagel_client`'s `grpc_error`), the S3
//! backend says what its rules decided, and a new backend does the same.
//! Every variant says whether retrying the same call can help
//! ([`Error::is_retryable`]).

use std::time::Duration;

use bagel_proto::Micros;

use crate::types::Conflict;

/// The source of an error from below the lease core (a transport, an
/// object store), kept whole for its chain.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a lease is not held, as the backend knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NotHeldReason {
    /// The backend holds no lease by that id: released (the message says
    /// when), never granted there, or ended long enough ago to be
    /// forgotten.
    Gone,
    /// The lease is there but not the caller's: its token does not match,
    /// or (mutual TLS) another client certificate holds it.
    NotYours,
    /// The lease ended: its deadline passed, or a full acquire broke it or
    /// took one of its names.
    Ended,
}

impl NotHeldReason {
    /// The reason as error messages and logs spell it (`gone`, `not
    /// yours`, `ended`).
    pub fn as_str(self) -> &'static str {
        match self {
            NotHeldReason::Gone => "gone",
            NotHeldReason::NotYours => "not yours",
            NotHeldReason::Ended => "ended",
        }
    }
}

/// Why a watch cannot start from a revision (see
/// [`Error::WatchRevision`]); the remedy is the same for each: list again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RevisionRefusal {
    /// No longer kept: `oldest` is the oldest revision a watch may start
    /// from.
    Compacted {
        /// The revision the watch asked to start from.
        from: u64,
        /// The oldest revision the server still keeps.
        oldest: u64,
    },
    /// Of another incarnation: given out before the server restarted (or
    /// by another server), or the server's revisions ran out and started
    /// again.
    OtherIncarnation {
        /// The revision the watch asked to start from.
        from: u64,
    },
    /// Ahead of the server's last revision.
    Ahead {
        /// The revision the watch asked to start from.
        from: u64,
        /// The server's last revision.
        last: u64,
    },
}

/// Every failure of a lease call, whatever the backend. Match on the
/// variant to act (wait, retry, fix the request, give up);
/// [`Error::is_retryable`] says whether the same call may succeed later.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Could not reach the backend at `url`. Retryable: it may be
    /// restarting or the network down.
    #[error("cannot connect to {url}: {source}")]
    Connect {
        /// The backend's address as the caller gave it.
        url: String,
        /// The transport's own error.
        #[source]
        source: BoxError,
    },
    /// A name is held by someone else (who, in what mode, until when: in
    /// `conflict`). Retry after `conflict.holder_deadline`.
    #[error("{message}")]
    Busy {
        /// What the backend said, naming the name and its holder.
        message: String,
        /// Who holds the name, in what mode, until when; `None` when the
        /// backend cannot say (the names changed under every attempt).
        conflict: Option<Box<Conflict>>,
    },
    /// The backend cannot serve now (a restart wait, clock trouble, a
    /// shutdown, the network); `retry_after`, when the backend said, is
    /// how long until it expects to.
    #[error("unavailable: {message}")]
    Unavailable {
        /// What the backend said, for a person.
        message: String,
        /// How long until the backend expects to serve; `None` when it
        /// did not say (back off and retry).
        retry_after: Option<Duration>,
    },
    /// A field of the request is malformed (`field`, when the backend
    /// named it, and why). Retrying the same request won't help.
    #[error("invalid {}{reason}", field_prefix(.field))]
    Invalid {
        /// The request field at fault (`names`, `ttl_us`, ...); `None`
        /// when the backend did not name one.
        field: Option<String>,
        /// Why the value is malformed.
        reason: String,
    },
    /// A value of the request is outside what the backend allows; the
    /// reason states the range (and the flag or setting that sets it).
    /// Retrying the same request won't help.
    #[error("out of range: {}{reason}", field_prefix(.field))]
    OutOfRange {
        /// The request field at fault; `None` when the backend did not
        /// name one.
        field: Option<String>,
        /// The range allowed, and what sets it.
        reason: String,
    },
    /// An acquire asked to wait longer than the backend allows: `max` is
    /// its max wait, which a longer wait is cut into rounds of
    /// ([`crate::long_wait`]). Retrying the same request won't help.
    #[error("out of range: wait_us: {reason}")]
    WaitTooLong {
        /// The backend's max wait for one acquire.
        max: Duration,
        /// What the backend said, for a person.
        reason: String,
    },
    /// A lease's lifetime is outside the backend's TTL range
    /// `(min_ttl, max_ttl]`: asked as `field` (`ttl_us`, a relative TTL,
    /// or `deadline_us`, an absolute deadline already past, too close or
    /// too far). The reason says which, by the backend's clock. Retrying
    /// the same request won't help.
    #[error("out of range: {field}: {reason}")]
    TtlOutOfRange {
        /// `ttl_us` or `deadline_us`: how the lifetime was asked.
        field: String,
        /// The backend's min TTL (exclusive).
        min_ttl: Duration,
        /// The backend's max TTL (inclusive).
        max_ttl: Duration,
        /// Which bound was crossed, and by how much.
        reason: String,
    },
    /// The lease is not (or no longer) held: `reason` says which way.
    #[error("lease not held ({}): {message}", .reason.as_str())]
    NotHeld {
        /// Which way the lease is not held.
        reason: NotHeldReason,
        /// What the backend said (when it was released or ended, by
        /// whom).
        message: String,
    },
    /// An access policy gives the caller no right to do this on the names
    /// (or prefix) it asked for: a refusal of the caller, not a lease
    /// problem, so it reads as one (`permission denied: ...`, naming the
    /// identity, the permission and the name or prefix, which tell nothing
    /// of any lease). Retrying won't help until the policy grants it.
    #[error("{}", permission_text(.message))]
    PermissionDenied {
        /// What the backend said, for a person.
        message: String,
    },
    /// The request is over a bound the backend keeps (leases per client,
    /// names per lease, waiters, held names): the message names it and
    /// what sets it.
    #[error("over a limit: {message}")]
    LimitExceeded {
        /// The bound, its value and the setting that sets it.
        message: String,
    },
    /// The backend does not do this (a lease store cannot list or watch;
    /// an older server lacks a call). Retrying won't help.
    #[error("{what} is not supported by this lease backend ({location})")]
    Unsupported {
        /// The operation refused (`list`, `watch`, ...).
        what: String,
        /// The backend that refused it ([`crate::LeaseBackend::location`]:
        /// a server URL, an S3 prefix).
        location: String,
    },
    /// The backend's answer does not carry a valid witness: do not write
    /// under it. Retrying won't help until the backend (or the keys the
    /// client trusts) is fixed.
    #[error("bad witness: {reason}")]
    Witness {
        /// What is wrong with the witness.
        reason: String,
    },
    /// The local clock is further from the signed time than the tolerance
    /// allows (the message says by how much). Retrying will not help until
    /// the clock is fixed; writing would produce bad timestamps.
    #[error("refusing to timestamp: {detail}")]
    ClockOff {
        /// The offset measured and the tolerance.
        detail: String,
    },
    /// No recent, valid signed time could be had (no answer from Roughtime
    /// or the lease server, or an answer that does not verify). Retryable.
    #[error("no signed time: {detail}")]
    NoSignedTime {
        /// Which sources were asked and how each failed.
        detail: String,
    },
    /// A release named a watermark below a timestamp already written under
    /// the lease: the next holder could then write below it.
    #[error(
        "watermark {given} is below {written}, the highest timestamp written under the lease; release with at least that (or none)"
    )]
    WatermarkBelowWritten {
        /// The watermark the release named (µs).
        given: Micros,
        /// The highest timestamp written under the lease (µs); release
        /// with at least this.
        written: Micros,
    },
    /// A lease store without a server (S3 conditional writes) failed or
    /// refused: the message names the operation and the object, `source`
    /// is the store's own error when there is one. `retryable` says
    /// whether the same call may succeed later (a timeout, a store that is
    /// down) or not (a store that ignores conditional writes, an object
    /// that does not parse).
    #[error("lease store {location}: {message}")]
    Store {
        /// The store's location (an S3 prefix), or an object under it.
        location: String,
        /// The operation that failed and how.
        message: String,
        /// Whether the same call may succeed later.
        retryable: bool,
        /// The store client's own error; `None` when the lease core
        /// judged the answer itself.
        #[source]
        source: Option<BoxError>,
    },
    /// No answer within the client's time bound: `call` is `connect` or
    /// the call's name. Retryable; a call that changes a lease may have
    /// taken effect.
    #[error("no answer from {url} to {call} within {after:?} (the client's timeout)")]
    Timeout {
        /// The backend's address as the caller gave it.
        url: String,
        /// `connect`, or the name of the call that got no answer.
        call: &'static str,
        /// How long the client waited (its configured timeout).
        after: Duration,
    },
    /// The client's own configuration is wrong (a URL that is not http or
    /// https, TLS files without what they should hold, https without TLS).
    /// Fix the configuration; retrying won't help.
    #[error("{message}")]
    Config {
        /// What is wrong and what to set instead.
        message: String,
    },
    /// A server given with a pinned key (`URL#KEY`) presents other keys:
    /// not the server meant, or its key was changed. Names the server
    /// once, with both keys and what to do.
    #[error(
        "server {url} presents key {}, not the pinned key {pinned}: if its key was changed on \
         purpose, pin the new one (`bagel lease server-info` shows it); otherwise this is not \
         the server meant",
        presented_keys(.presented)
    )]
    KeyMismatch {
        /// The server's address, without the pinned key.
        url: String,
        /// The id of each pinned key (given after `#`), comma-separated.
        pinned: String,
        /// The ids of the keys the server presents; empty when it presents
        /// none.
        presented: Vec<String>,
    },
    /// The server dropped a watch that did not read fast enough (its
    /// buffer there was full). Watch again from `last_revision`, the last
    /// event received, to miss nothing (while the server still keeps it).
    #[error("{message}")]
    WatchDropped {
        /// What the server said, for a person.
        message: String,
        /// The revision of the last event received; `None` when none was
        /// (watch again from where this watch started).
        last_revision: Option<u64>,
    },
    /// A watch cannot start from (or go on after) the revision it asked
    /// for: list the names again and watch from the List's revision. The
    /// server said why with a stable reason (`google.rpc.ErrorInfo`), not
    /// only in its message.
    #[error("{message}")]
    WatchRevision {
        /// Why the revision was refused.
        refusal: RevisionRefusal,
        /// What the server said, for a person.
        message: String,
    },
    /// Any other failure, as the backend or its transport said it;
    /// `retryable` when the backend said the call may succeed later.
    #[error("{message}")]
    Other {
        /// What the backend or transport said.
        message: String,
        /// Whether the backend said the call may succeed later.
        retryable: bool,
    },
}

fn field_prefix(field: &Option<String>) -> String {
    field.as_ref().map_or_else(String::new, |f| format!("{f}: "))
}

/// A policy's refusal as people read it: the server's words already say
/// `permission denied`; a message that does not gets the words in front.
fn permission_text(message: &str) -> String {
    if message.contains("permission denied") {
        message.to_owned()
    } else {
        format!("permission denied: {message}")
    }
}

fn presented_keys(keys: &[String]) -> String {
    match keys {
        [] => "(none)".to_owned(),
        [one] => one.clone(),
        many => many.join(", "),
    }
}

impl Error {
    /// A malformed `field`, and why.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Invalid {
            field: Some(field.into()),
            reason: reason.into(),
        }
    }

    /// A `field` outside its range; `reason` states the range.
    pub fn out_of_range(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::OutOfRange {
            field: Some(field.into()),
            reason: reason.into(),
        }
    }

    /// A lease not held, and why.
    pub fn not_held(reason: NotHeldReason, message: impl Into<String>) -> Self {
        Error::NotHeld {
            reason,
            message: message.into(),
        }
    }

    /// A lease store's failure at `location`, with no source error.
    pub fn store(location: impl Into<String>, message: impl Into<String>, retryable: bool) -> Self {
        Error::Store {
            location: location.into(),
            message: message.into(),
            retryable,
            source: None,
        }
    }

    /// The same [`Error::Store`] with the store's own error as its source;
    /// any other error unchanged.
    #[must_use]
    pub fn with_source(self, e: impl Into<BoxError>) -> Self {
        match self {
            Error::Store {
                location,
                message,
                retryable,
                ..
            } => Error::Store {
                location,
                message,
                retryable,
                source: Some(e.into()),
            },
            other => other,
        }
    }

    /// Whether the same call may succeed later.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Connect { .. }
            | Error::Timeout { .. }
            | Error::Busy { .. }
            | Error::Unavailable { .. }
            | Error::NoSignedTime { .. } => true,
            Error::Store { retryable, .. } | Error::Other { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// The field a refused request named, for [`Error::Invalid`],
    /// [`Error::OutOfRange`], [`Error::WaitTooLong`] and
    /// [`Error::TtlOutOfRange`] (`deadline_us`, `names`, `watermark_us`).
    pub fn field(&self) -> Option<&str> {
        match self {
            Error::Invalid { field, .. } | Error::OutOfRange { field, .. } => field.as_deref(),
            Error::WaitTooLong { .. } => Some("wait_us"),
            Error::TtlOutOfRange { field, .. } => Some(field),
            _ => None,
        }
    }

    /// The same error, saying which server of several gave it.
    #[must_use]
    pub fn at_server(self, server: &str) -> Self {
        let on = |m: String| format!("server {server}: {m}");
        match self {
            Error::Busy { message, conflict } => Error::Busy {
                message: on(message),
                conflict: conflict.map(|c| {
                    Box::new(Conflict {
                        server: Some(server.to_owned()),
                        ..*c
                    })
                }),
            },
            Error::Unavailable { message, retry_after } => Error::Unavailable {
                message: on(message),
                retry_after,
            },
            Error::Invalid { field, reason } => Error::Invalid {
                field,
                reason: on(reason),
            },
            Error::OutOfRange { field, reason } => Error::OutOfRange {
                field,
                reason: on(reason),
            },
            Error::WaitTooLong { max, reason } => Error::WaitTooLong {
                max,
                reason: on(reason),
            },
            Error::TtlOutOfRange {
                field,
                min_ttl,
                max_ttl,
                reason,
            } => Error::TtlOutOfRange {
                field,
                min_ttl,
                max_ttl,
                reason: on(reason),
            },
            Error::NotHeld { reason, message } => Error::NotHeld {
                reason,
                message: on(message),
            },
            Error::PermissionDenied { message } => Error::PermissionDenied { message: on(message) },
            Error::LimitExceeded { message } => Error::LimitExceeded { message: on(message) },
            Error::Witness { reason } => Error::Witness { reason: on(reason) },
            Error::ClockOff { detail } => Error::ClockOff { detail: on(detail) },
            Error::NoSignedTime { detail } => Error::NoSignedTime { detail: on(detail) },
            Error::WatchDropped {
                message,
                last_revision,
            } => Error::WatchDropped {
                message: on(message),
                last_revision,
            },
            Error::WatchRevision { refusal, message } => Error::WatchRevision {
                refusal,
                message: on(message),
            },
            Error::Other { message, retryable } => Error::Other {
                message: on(message),
                retryable,
            },
            // Already names the server (connect, unsupported) or is not
            // about one.
            other => other,
        }
    }

    /// For [`Error::Busy`]: when the current holder's lease ends.
    pub fn retry_after(&self) -> Option<Micros> {
        match self {
            Error::Busy {
                conflict: Some(c), ..
            } => Some(c.holder_deadline),
            _ => None,
        }
    }
}

/// A lease call's result, failing with the lease core's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
