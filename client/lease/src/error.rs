//! The client's one error type. Every variant says whether retrying the
//! same call can help ([`Error::is_retryable`]).

use bagel_proto::Micros;
use tonic::Code;

use crate::types::Conflict;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Could not reach the server.
    #[error("cannot connect to {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
    /// A name is held by someone else. Retry after
    /// `conflict.holder_deadline`.
    #[error("{message}")]
    Busy {
        message: String,
        conflict: Option<Box<Conflict>>,
    },
    /// The server cannot serve now (restart wait, clock trouble, network).
    #[error("server unavailable: {message}")]
    Unavailable { message: String },
    /// The request was refused as malformed or out of range; the message
    /// names the field and the limit. Retrying the same request won't help.
    #[error("refused ({code:?}): {message}")]
    Rejected { code: Code, message: String },
    /// The lease is not (or no longer) held: expired, released, broken,
    /// unknown to the server, or the token is wrong.
    #[error("lease not held ({code:?}): {message}")]
    NotHeld { code: Code, message: String },
    /// The server's answer does not carry a valid witness.
    #[error("bad witness: {reason}")]
    Witness { reason: String },
    /// The local clock is further from the signed time than the tolerance
    /// allows (the message says by how much). Retrying will not help until
    /// the clock is fixed; writing would produce bad timestamps.
    #[error("refusing to timestamp: {detail}")]
    ClockOff { detail: String },
    /// No recent, valid signed time could be had (no answer from Roughtime
    /// or the lease server, or an answer that does not verify). Retryable.
    #[error("no signed time: {detail}")]
    NoSignedTime { detail: String },
    /// A release named a watermark below a timestamp already written under
    /// the lease: the next holder could then write below it.
    #[error(
        "watermark {given} is below {written}, the highest timestamp written under the lease; release with at least that (or none)"
    )]
    WatermarkBelowWritten { given: Micros, written: Micros },
    /// A lease store without a server (S3 conditional writes) failed or
    /// refused: the message names the operation and the object.
    /// `retryable` says whether the same call may succeed later (a timeout,
    /// a store that is down) or not (a store that ignores conditional
    /// writes, an object that does not parse).
    #[error("lease store {location}: {message}")]
    Store {
        location: String,
        message: String,
        retryable: bool,
    },
    /// No answer within the time bound of [`crate::ClientOptions`]:
    /// `call` is `connect` or the RPC's name.
    #[error("no answer from {url} to {call} within {after:?} (the client's timeout)")]
    Timeout {
        url: String,
        call: &'static str,
        after: std::time::Duration,
    },
    /// The client's own configuration is wrong (a URL that is not http or
    /// https, TLS files without what they should hold, https without TLS).
    #[error("{message}")]
    Config { message: String },
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
        url: String,
        pinned: String,
        presented: Vec<String>,
    },
    /// The server dropped a watch that did not read fast enough (its
    /// buffer there was full). Watch again from `last_revision`, the last
    /// event received, to miss nothing (while the server still keeps it).
    #[error("{message}")]
    WatchDropped {
        message: String,
        last_revision: Option<u64>,
    },
    /// Any other gRPC failure.
    #[error("rpc failed ({code:?}): {message}", code = .0.code(), message = status_message(.0))]
    Rpc(tonic::Status),
}

fn presented_keys(keys: &[String]) -> String {
    match keys {
        [] => "(none)".to_owned(),
        [one] => one.clone(),
        many => many.join(", "),
    }
}

impl Error {
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Connect { .. }
            | Error::Timeout { .. }
            | Error::Busy { .. }
            | Error::Unavailable { .. }
            | Error::NoSignedTime { .. } => true,
            Error::Store { retryable, .. } => *retryable,
            Error::Rpc(s) => matches!(
                s.code(),
                Code::Unavailable | Code::DeadlineExceeded | Code::Unknown
            ),
            _ => false,
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
            Error::Unavailable { message } => Error::Unavailable { message: on(message) },
            Error::Rejected { code, message } => Error::Rejected {
                code,
                message: on(message),
            },
            Error::NotHeld { code, message } => Error::NotHeld {
                code,
                message: on(message),
            },
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
            Error::Rpc(s) => Error::Rpc(tonic::Status::with_details(
                s.code(),
                on(s.message().to_owned()),
                s.details().to_vec().into(),
            )),
            // Already names the server (connect) or is not about one.
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

/// A status's message, followed by its source chain when it has one (a
/// status made on this side from a transport failure: a refused TLS
/// handshake, a reset connection), each step said once.
pub(crate) fn status_message(s: &tonic::Status) -> String {
    let mut message = s.message().to_owned();
    let mut source = std::error::Error::source(s);
    while let Some(e) = source {
        let text = e.to_string();
        if !text.is_empty() && message != text && !message.ends_with(&format!(": {text}")) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = e.source();
    }
    message
}

impl From<tonic::Status> for Error {
    fn from(s: tonic::Status) -> Self {
        let message = status_message(&s);
        match s.code() {
            // The details are a google.rpc.Status with the conflict packed
            // in an Any; servers before that sent the bare conflict, which
            // `conflict_of` reads too.
            Code::Aborted => Error::Busy {
                conflict: bagel_proto::details::conflict_of(s.details()).map(|c| Box::new(Conflict::from(c))),
                message,
            },
            Code::Unavailable => Error::Unavailable { message },
            code @ (Code::InvalidArgument | Code::OutOfRange) => Error::Rejected { code, message },
            code @ (Code::NotFound | Code::PermissionDenied | Code::FailedPrecondition) => {
                Error::NotHeld { code, message }
            }
            _ => Error::Rpc(s),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
