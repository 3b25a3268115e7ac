//! How the server's [`Error`] goes on the wire: its gRPC code, and the
//! status with the richer error model's details (a conflict's holder and a
//! `RetryInfo`; the time a restart wait has left). The domain error names
//! the failure; only this module names a gRPC code for it.

use bagel_proto::details as d;
use tonic::{Code, Status};

use crate::error::{Error, bounded};

impl Error {
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument { .. } => Code::InvalidArgument,
            Error::OutOfRange { .. }
            | Error::DeadlineOutOfRange { .. }
            | Error::TtlOutOfRange { .. }
            | Error::WaitTooLong { .. } => Code::OutOfRange,
            Error::NotReady { .. }
            | Error::ClockUnhealthy { .. }
            | Error::MarkBehind { .. }
            | Error::ShuttingDown => Code::Unavailable,
            Error::Conflict(_) => Code::Aborted,
            Error::UnknownLease { .. } | Error::Released { .. } => Code::NotFound,
            Error::Capacity { .. } | Error::Limit { .. } | Error::TokenGuessing { .. } => {
                Code::ResourceExhausted
            }
            Error::WrongToken { .. }
            | Error::NotOwner { .. }
            | Error::UntrustedIssuer { .. }
            | Error::PermissionDenied { .. } => Code::PermissionDenied,
            Error::Unauthenticated { .. } => Code::Unauthenticated,
            Error::Expired { .. } | Error::LostName { .. } | Error::NotOwnedHere { .. } => {
                Code::FailedPrecondition
            }
            Error::Watch(e) => {
                use crate::watch::WatchError;
                // OUT_OF_RANGE for a revision the watch cannot start from
                // (as etcd's "compacted"): the client lists again, then
                // watches from the List's revision; the ErrorInfo's reason
                // says why (see `watch_details`).
                match e {
                    WatchError::Overflow { .. }
                    | WatchError::ResumeOverrun { .. }
                    | WatchError::Stalled { .. }
                    | WatchError::TooMany { .. } => Code::ResourceExhausted,
                    WatchError::TooOld { .. }
                    | WatchError::OtherIncarnation { .. }
                    | WatchError::Ahead { .. }
                    | WatchError::Renumbered { .. } => Code::OutOfRange,
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
            // When the address may try again, as a RetryInfo.
            Error::TokenGuessing { retry_after, .. } => {
                let details =
                    bagel_proto::details::retry_details(Code::ResourceExhausted, &message, *retry_after);
                Status::with_details(Code::ResourceExhausted, message, details.into())
            }
            Error::InvalidArgument { field, .. } | Error::OutOfRange { field, .. } => {
                let details = refused_field(&e, &message, field).encode();
                Status::with_details(e.code(), message, details.into())
            }
            Error::WaitTooLong { wait, max } => {
                let details = refused_field(&e, &message, "wait_us")
                    .error_info(
                        d::REASON_WAIT_TOO_LONG,
                        [("wait_us", micros(*wait)), ("max_wait_us", micros(*max))],
                    )
                    .encode();
                Status::with_details(e.code(), message, details.into())
            }
            Error::TtlOutOfRange {
                ttl,
                min_ttl,
                max_ttl,
            } => {
                let details = refused_field(&e, &message, "ttl_us")
                    .error_info(
                        d::REASON_TTL_OUT_OF_RANGE,
                        [
                            ("ttl_us", micros(*ttl)),
                            ("min_ttl_us", micros(*min_ttl)),
                            ("max_ttl_us", micros(*max_ttl)),
                        ],
                    )
                    .encode();
                Status::with_details(e.code(), message, details.into())
            }
            Error::DeadlineOutOfRange {
                deadline,
                now,
                min_ttl,
                max_ttl,
            } => {
                let details = refused_field(&e, &message, "deadline_us")
                    .error_info(
                        d::REASON_TTL_OUT_OF_RANGE,
                        [
                            ("deadline_us", deadline.as_micros().to_string()),
                            ("now_us", now.as_micros().to_string()),
                            ("min_ttl_us", micros(*min_ttl)),
                            ("max_ttl_us", micros(*max_ttl)),
                        ],
                    )
                    .encode();
                Status::with_details(e.code(), message, details.into())
            }
            Error::PermissionDenied { permission, on, .. } => {
                let details = d::Details::new(e.code(), &message)
                    .error_info(
                        d::REASON_PERMISSION_DENIED,
                        [("permission", (*permission).to_owned()), ("on", (*on).to_owned())],
                    )
                    .encode();
                Status::with_details(e.code(), message, details.into())
            }
            Error::NotOwnedHere { name, me, owners } => {
                let details = d::Details::new(e.code(), &message)
                    .error_info(
                        d::REASON_NAME_NOT_OWNED,
                        [
                            ("name", name.clone()),
                            ("server_id", me.to_string()),
                            ("owners", owners.join(",")),
                        ],
                    )
                    .encode();
                Status::with_details(e.code(), message, details.into())
            }
            Error::Watch(w) => match watch_details(w) {
                Some((reason, metadata)) => {
                    let details =
                        bagel_proto::details::error_info_details(e.code(), &message, reason, &metadata);
                    Status::with_details(e.code(), message, details.into())
                }
                None => Status::new(e.code(), message),
            },
            _ => Status::new(e.code(), message),
        }
    }
}

fn micros(d: std::time::Duration) -> String {
    bagel_proto::duration_micros(d).to_string()
}

/// The details of a refusal of `field`: a `google.rpc.BadRequest` naming
/// it, with the message's words after the field (the message is
/// `field: reason`, so a client shows `field` and the reason as the
/// message said them, cut or not).
fn refused_field(e: &Error, message: &str, field: &str) -> d::Details {
    let description = message
        .strip_prefix(field)
        .and_then(|rest| rest.strip_prefix(": "))
        .unwrap_or(message);
    d::Details::new(e.code(), message).field_violation(field, description)
}

/// The stable reason of a watch's refusal or end, and its numbers, for a
/// `google.rpc.ErrorInfo`: clients act on the reason (list again, or
/// resume from the last revision) without reading the message.
fn watch_details(e: &crate::watch::WatchError) -> Option<(&'static str, Vec<(&'static str, u64)>)> {
    use crate::watch::WatchError;
    use bagel_proto::details as d;
    Some(match *e {
        WatchError::TooOld { from, oldest, retain } => (
            d::REASON_REVISION_COMPACTED,
            vec![
                ("from_revision", from),
                ("oldest_revision", oldest),
                ("retain", retain as u64),
            ],
        ),
        WatchError::OtherIncarnation { from, theirs, ours } => (
            d::REASON_REVISION_OF_OTHER_INCARNATION,
            vec![
                ("from_revision", from),
                ("incarnation", u64::from(theirs)),
                ("server_incarnation", u64::from(ours)),
            ],
        ),
        // The revisions the watcher had are of the incarnation that ran
        // out: the same remedy as a revision from before a restart.
        WatchError::Renumbered { last } => (
            d::REASON_REVISION_OF_OTHER_INCARNATION,
            vec![("last_revision", last)],
        ),
        WatchError::Ahead { from, last } => (
            d::REASON_REVISION_AHEAD,
            vec![("from_revision", from), ("last_revision", last)],
        ),
        WatchError::Overflow { buffer, last } => (
            d::REASON_WATCH_OVERFLOW,
            vec![("buffer", buffer as u64), ("last_revision", last)],
        ),
        // Dropped all the same: the client resumes from the last revision.
        WatchError::ResumeOverrun { retain, last } => (
            d::REASON_WATCH_OVERFLOW,
            vec![("retain", retain as u64), ("last_revision", last)],
        ),
        WatchError::Stalled { after, last } => (
            d::REASON_WATCH_STALLED,
            vec![("stall_ms", after.as_millis() as u64), ("last_revision", last)],
        ),
        WatchError::TooMany { .. } => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::WatchError;

    /// A refused field names itself in a BadRequest, beside the message
    /// it always had; the refusals a client acts on carry their numbers.
    #[test]
    fn a_refusal_carries_its_field_and_numbers_beside_its_message() {
        use bagel_proto::details::{error_info_of, field_violation_of};
        let status = Status::from(Error::invalid("names", "[1] duplicate name \"a\""));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "names: [1] duplicate name \"a\"");
        assert_eq!(
            field_violation_of(status.details()),
            Some(("names".to_owned(), "[1] duplicate name \"a\"".to_owned()))
        );
        assert_eq!(error_info_of(status.details()), None);

        let e = Error::WaitTooLong {
            wait: std::time::Duration::from_secs(3),
            max: std::time::Duration::from_secs(1),
        };
        let status = Status::from(e);
        assert_eq!(status.code(), Code::OutOfRange);
        assert_eq!(
            status.message(),
            "wait_us: 3000000 exceeds the server's max wait of 1000000 us"
        );
        let (reason, meta) = error_info_of(status.details()).unwrap();
        assert_eq!(reason, d::REASON_WAIT_TOO_LONG);
        assert_eq!(meta["max_wait_us"], "1000000");
        assert_eq!(
            field_violation_of(status.details()).map(|(f, _)| f).as_deref(),
            Some("wait_us")
        );

        let status = Status::from(Error::PermissionDenied {
            identity: "ci".into(),
            permission: "lease",
            on: "name",
            name: "\"x\"".to_owned(),
        });
        assert_eq!(status.code(), Code::PermissionDenied);
        let (reason, meta) = error_info_of(status.details()).unwrap();
        assert_eq!(reason, d::REASON_PERMISSION_DENIED);
        assert_eq!(
            (meta["permission"].as_str(), meta["on"].as_str()),
            ("lease", "name")
        );
    }

    /// A watch's refusals are domain errors now; the statuses they become
    /// are the ones the watch always sent: its code, its message as is,
    /// and now a stable reason in an ErrorInfo.
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
            (
                WatchError::OtherIncarnation {
                    from: 9,
                    theirs: 1,
                    ours: 2,
                },
                Code::OutOfRange,
            ),
            (WatchError::Renumbered { last: 9 }, Code::OutOfRange),
        ];
        for (e, code) in cases {
            let status = Status::from(Error::Watch(e.clone()));
            assert_eq!(status.code(), code, "{e}");
            assert_eq!(status.message(), e.to_string());
            let reason = bagel_proto::details::error_info_of(status.details()).map(|(r, _)| r);
            let want = watch_details(&e).map(|(r, _)| r.to_owned());
            assert_eq!(reason, want, "{e}");
        }
        let status = Status::from(Error::Watch(WatchError::TooOld {
            from: 1,
            oldest: 5,
            retain: 10,
        }));
        let (reason, meta) = bagel_proto::details::error_info_of(status.details()).unwrap();
        assert_eq!(reason, bagel_proto::details::REASON_REVISION_COMPACTED);
        assert_eq!(meta["oldest_revision"], "5");
    }
}
