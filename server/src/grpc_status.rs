//! How the server's [`Error`] goes on the wire: its gRPC code, and the
//! status with the richer error model's details (a conflict's holder and a
//! `RetryInfo`; the time a restart wait has left). The domain error names
//! the failure; only this module names a gRPC code for it.

use tonic::{Code, Status};

use crate::error::{Error, bounded};

impl Error {
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument { .. } => Code::InvalidArgument,
            Error::OutOfRange { .. } | Error::DeadlineOutOfRange { .. } | Error::TtlOutOfRange { .. } => {
                Code::OutOfRange
            }
            Error::NotReady { .. } | Error::ClockUnhealthy { .. } | Error::ShuttingDown => Code::Unavailable,
            Error::Conflict(_) => Code::Aborted,
            Error::UnknownLease { .. } | Error::Released { .. } => Code::NotFound,
            Error::Capacity { .. } | Error::Limit { .. } => Code::ResourceExhausted,
            Error::WrongToken { .. } | Error::NotOwner { .. } | Error::UntrustedIssuer { .. } => {
                Code::PermissionDenied
            }
            Error::Expired { .. } | Error::LostName { .. } => Code::FailedPrecondition,
            Error::Watch(e) => {
                use crate::watch::WatchError;
                match e {
                    WatchError::Overflow { .. } | WatchError::TooMany { .. } => Code::ResourceExhausted,
                    WatchError::TooOld { .. } | WatchError::Ahead { .. } => Code::OutOfRange,
                }
            }
        }
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let message = bounded(e.to_string());
        match &e {
            // The richer error model: a google.rpc.Status with the conflict
            // and a RetryInfo, which every language's standard decoder reads.
            Error::Conflict(c) => {
                let details = bagel_proto::details::conflict_details(
                    Code::Aborted,
                    &message,
                    &c.to_pb(),
                    c.retry_after(),
                );
                Status::with_details(Code::Aborted, message, details.into())
            }
            // How long until the restart wait ends, as a RetryInfo, so a
            // client can say (and wait) until when.
            Error::NotReady { ready_at, seen, .. } => {
                let details = bagel_proto::details::retry_details(
                    Code::Unavailable,
                    &message,
                    ready_at.duration_since(*seen),
                );
                Status::with_details(Code::Unavailable, message, details.into())
            }
            _ => Status::new(e.code(), message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::WatchError;

    /// A watch's refusals are domain errors now; the statuses they become
    /// are the ones the watch always sent: its code, its message as is.
    #[test]
    fn a_watch_error_becomes_the_status_it_always_was() {
        let cases = [
            (
                WatchError::Overflow { buffer: 4, last: 9 },
                Code::ResourceExhausted,
            ),
            (WatchError::TooMany { max: 2 }, Code::ResourceExhausted),
            (
                WatchError::TooOld {
                    from: 1,
                    oldest: 5,
                    retain: 10,
                },
                Code::OutOfRange,
            ),
            (WatchError::Ahead { from: 9, last: 5 }, Code::OutOfRange),
        ];
        for (e, code) in cases {
            let status = Status::from(Error::Watch(e.clone()));
            assert_eq!(status.code(), code, "{e}");
            assert_eq!(status.message(), e.to_string());
            assert!(status.details().is_empty());
        }
    }
}
