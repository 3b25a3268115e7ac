//! The gRPC edge of the lease core's [`Error`]: the one place a status
//! code is read. A status becomes the variant that names its failure, by
//! its code and its details (a `google.rpc.Status` in
//! `grpc-status-details-bin`), never by its message's words: a
//! `BadRequest` names the refused field, an `ErrorInfo`'s reason and
//! metadata make a typed refusal (a wait over the max, a TTL out of
//! range, a watch dropped, an access policy's refusal), a conflict and a
//! `RetryInfo` become `conflict` and `retry_after`. The message is kept
//! as it came, for people.

use std::time::Duration;

use bagel_lease_core::{Conflict, Error, NotHeldReason, RevisionRefusal};
use bagel_proto::details as d;
use tonic::{Code, Status};

/// A status's message, followed by its source chain when it has one (a
/// status made on this side from a transport failure: a refused TLS
/// handshake, a reset connection), each step said once.
pub(crate) fn status_message(s: &Status) -> String {
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

/// The core's error for a status from a lease server (or made on this
/// side by the transport).
pub(crate) fn from_status(s: Status) -> Error {
    let message = status_message(&s);
    if made_by_transport(&s) {
        // Whatever code tonic gave it (UNKNOWN for a broken pipe under
        // HTTP/2, INTERNAL for a connection torn mid-frame, CANCELLED for
        // a stream closed under the call), a failure of this side's own
        // connection says nothing of the request: the server is
        // unavailable for now, and a retry on a new connection may pass.
        return Error::Unavailable {
            retry_after: None,
            message: format!("the connection to the server failed: {message}"),
        };
    }
    match s.code() {
        // The details are a google.rpc.Status with the conflict packed
        // in an Any; `conflict_of` also reads a bare conflict (the form
        // an older server sends).
        Code::Aborted => Error::Busy {
            conflict: bagel_proto::details::conflict_of(s.details()).map(|c| Box::new(Conflict::from(c))),
            message,
        },
        Code::Unavailable => Error::Unavailable {
            retry_after: bagel_proto::details::retry_delay_of(s.details()),
            message,
        },
        Code::InvalidArgument => {
            let (field, reason) = field_and_reason(s.details(), message);
            Error::Invalid { field, reason }
        }
        Code::OutOfRange => out_of_range(s.details(), message),
        Code::NotFound => Error::not_held(NotHeldReason::Gone, message),
        Code::PermissionDenied => match d::error_info_of(s.details()) {
            Some((reason, _)) if reason == d::REASON_PERMISSION_DENIED => Error::PermissionDenied { message },
            _ => Error::not_held(NotHeldReason::NotYours, message),
        },
        Code::FailedPrecondition => match d::error_info_of(s.details()) {
            // The member the list sent a name to does not own it: the
            // list is wrong, and no retry fixes it.
            Some((reason, _)) if reason == d::REASON_NAME_NOT_OWNED => Error::Config { message },
            _ => Error::not_held(NotHeldReason::Ended, message),
        },
        Code::ResourceExhausted => resource_exhausted(s.details(), message),
        Code::Unimplemented => Error::Other {
            message: format!("the server does not know this call (an older server?): {message}"),
            retryable: false,
        },
        code => Error::Other {
            message: format!("rpc failed ({code:?}): {message}"),
            retryable: matches!(code, Code::DeadlineExceeded | Code::Unknown),
        },
    }
}

/// The field a refusal names in its `google.rpc.BadRequest`, and the
/// reason the violation gives; `(None, message)` without one (an older
/// server, or a refusal of no one field): the words are shown as they
/// came, never taken apart.
fn field_and_reason(details: &[u8], message: String) -> (Option<String>, String) {
    match d::field_violation_of(details) {
        Some((field, reason)) => (Some(field), reason),
        None => (None, message),
    }
}

/// Whether `s` was made on this side from a failure of the connection
/// itself: its source chain holds an HTTP/2, HTTP or I/O error (or
/// tonic's transport error around one). A status a server sent has no
/// source at all, so no refusal of a server is ever taken for one.
fn made_by_transport(s: &Status) -> bool {
    let mut source = std::error::Error::source(s);
    while let Some(e) = source {
        if e.is::<h2::Error>()
            || e.is::<hyper::Error>()
            || e.is::<std::io::Error>()
            || e.is::<tonic::transport::Error>()
        {
            return true;
        }
        source = e.source();
    }
    false
}

/// An OUT_OF_RANGE refusal, by the reason in its `ErrorInfo`: a watch's
/// revision, a wait over the max, a lifetime outside the TTL range; else
/// a refusal of the field its `BadRequest` names.
fn out_of_range(details: &[u8], message: String) -> Error {
    if let Some(refusal) = revision_refusal(details) {
        return Error::WatchRevision { refusal, message };
    }
    let info = d::error_info_of(details);
    let micros = |k: &str| -> Option<Duration> {
        let (_, meta) = info.as_ref()?;
        meta.get(k)?.parse().ok().map(Duration::from_micros)
    };
    let (field, reason) = field_and_reason(details, message);
    match (info.as_ref().map(|(r, _)| r.as_str()), field) {
        (Some(d::REASON_WAIT_TOO_LONG), _) if let Some(max) = micros("max_wait_us") => {
            Error::WaitTooLong { max, reason }
        }
        (Some(d::REASON_TTL_OUT_OF_RANGE), Some(field))
            if let (Some(min_ttl), Some(max_ttl)) = (micros("min_ttl_us"), micros("max_ttl_us")) =>
        {
            Error::TtlOutOfRange {
                field,
                min_ttl,
                max_ttl,
                reason,
            }
        }
        (_, field) => Error::OutOfRange { field, reason },
    }
}

/// A watch's refusal of its revision, by the reason in the status's
/// `ErrorInfo` (never by the message's words); `None` for another
/// refusal, or a server before reasons.
fn revision_refusal(details: &[u8]) -> Option<RevisionRefusal> {
    let (reason, meta) = d::error_info_of(details)?;
    let num = |k: &str| meta.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    match reason.as_str() {
        d::REASON_REVISION_COMPACTED => Some(RevisionRefusal::Compacted {
            from: num("from_revision"),
            oldest: num("oldest_revision"),
        }),
        d::REASON_REVISION_OF_OTHER_INCARNATION => Some(RevisionRefusal::OtherIncarnation {
            from: num("from_revision"),
        }),
        d::REASON_REVISION_AHEAD => Some(RevisionRefusal::Ahead {
            from: num("from_revision"),
            last: num("last_revision"),
        }),
        _ => None,
    }
}

/// A RESOURCE_EXHAUSTED status: a watch dropped for falling behind (or
/// reading too slowly), told by its reason, with the last revision the
/// server sent it; any other, a limit.
fn resource_exhausted(details: &[u8], message: String) -> Error {
    match d::error_info_of(details) {
        Some((reason, meta)) if reason == d::REASON_WATCH_OVERFLOW || reason == d::REASON_WATCH_STALLED => {
            Error::WatchDropped {
                message,
                last_revision: meta.get("last_revision").and_then(|v| v.parse().ok()),
            }
        }
        _ => Error::LimitExceeded { message },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(code: Code, message: &str, details: d::Details) -> Status {
        Status::with_details(code, message, details.encode().into())
    }

    #[test]
    fn a_call_the_transport_cancelled_is_unavailable_and_one_the_server_cancelled_is_not() {
        let mut lost = Status::cancelled("operation was canceled: connection closed");
        lost.set_source(std::sync::Arc::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        let e = from_status(lost);
        assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
        assert!(e.is_retryable());
        let sent = from_status(Status::cancelled("the server cancelled it"));
        assert!(matches!(sent, Error::Other { retryable: false, .. }), "{sent:?}");
    }

    #[test]
    fn a_failure_of_the_connection_is_unavailable_whatever_code_tonic_gives_it() {
        let broken_pipe = || -> std::sync::Arc<dyn std::error::Error + Send + Sync> {
            std::sync::Arc::new(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
        };
        let torn = || -> std::sync::Arc<dyn std::error::Error + Send + Sync> {
            std::sync::Arc::new(h2::Error::from(h2::Reason::INTERNAL_ERROR))
        };
        for (code, source) in [
            (Code::Unknown, broken_pipe()),
            (Code::Internal, torn()),
            (Code::Cancelled, broken_pipe()),
            (Code::Unavailable, torn()),
        ] {
            let mut s = Status::new(code, "transport error");
            s.set_source(source);
            let e = from_status(s);
            assert!(matches!(e, Error::Unavailable { .. }), "{code:?}: {e:?}");
            assert!(e.is_retryable(), "{code:?}");
        }
        // The same codes sent by a server (no source) keep their meaning.
        let e = from_status(Status::internal("bug"));
        assert!(matches!(e, Error::Other { retryable: false, .. }), "{e:?}");
    }

    #[test]
    fn a_refusal_names_the_field_its_details_name_and_never_reads_the_words() {
        let message = "deadline_us: 5 is already past";
        let s = with(
            Code::OutOfRange,
            message,
            d::Details::new(Code::OutOfRange, message).field_violation("deadline_us", "5 is already past"),
        );
        let e = from_status(s);
        assert!(
            matches!(&e, Error::OutOfRange { field: Some(f), reason } if f == "deadline_us" && reason == "5 is already past"),
            "{e:?}"
        );
        assert_eq!(e.to_string(), format!("out of range: {message}"));
        // Without a BadRequest (an older server) the words stay whole,
        // field-like or not, and say the same.
        let e = from_status(Status::invalid_argument("names[2]: empty"));
        assert!(
            matches!(&e, Error::Invalid { field: None, reason } if reason == "names[2]: empty"),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "invalid names[2]: empty");
    }

    #[test]
    fn a_wait_over_the_max_carries_the_max_from_its_details() {
        let message = "wait_us: 30000000 exceeds the server's max wait of 2000000 us";
        let details = d::Details::new(Code::OutOfRange, message)
            .field_violation("wait_us", "30000000 exceeds the server's max wait of 2000000 us")
            .error_info(
                d::REASON_WAIT_TOO_LONG,
                [
                    ("wait_us", "30000000".to_owned()),
                    ("max_wait_us", "2000000".to_owned()),
                ],
            );
        let e = from_status(with(Code::OutOfRange, message, details));
        assert!(
            matches!(&e, Error::WaitTooLong { max, .. } if *max == Duration::from_secs(2)),
            "{e:?}"
        );
        assert_eq!(e.field(), Some("wait_us"));
        assert_eq!(e.to_string(), format!("out of range: {message}"));
        // The same words without the reason: no max is made up from them.
        let e = from_status(Status::out_of_range(message));
        assert!(matches!(e, Error::OutOfRange { field: None, .. }), "{e:?}");
    }

    #[test]
    fn a_lifetime_out_of_range_carries_the_range() {
        let message = "ttl_us: ttl 1h is over the server's --max-ttl of 10s";
        let details = d::Details::new(Code::OutOfRange, message)
            .field_violation("ttl_us", "ttl 1h is over the server's --max-ttl of 10s")
            .error_info(
                d::REASON_TTL_OUT_OF_RANGE,
                [
                    ("ttl_us", "3600000000".to_owned()),
                    ("min_ttl_us", "10000".to_owned()),
                    ("max_ttl_us", "10000000".to_owned()),
                ],
            );
        let e = from_status(with(Code::OutOfRange, message, details));
        assert!(
            matches!(&e, Error::TtlOutOfRange { field, max_ttl, min_ttl, .. }
                if field == "ttl_us" && *max_ttl == Duration::from_secs(10) && *min_ttl == Duration::from_millis(10)),
            "{e:?}"
        );
        assert_eq!(e.to_string(), format!("out of range: {message}"));
    }

    #[test]
    fn a_dropped_watch_is_told_by_its_reason_not_its_words() {
        let dropped = d::error_info_details(
            Code::ResourceExhausted,
            "any words",
            d::REASON_WATCH_OVERFLOW,
            &[("buffer", 4), ("last_revision", 17)],
        );
        let e = from_status(Status::with_details(
            Code::ResourceExhausted,
            "any words",
            dropped.into(),
        ));
        assert!(
            matches!(&e, Error::WatchDropped { last_revision: Some(17), message } if message == "any words"),
            "{e:?}"
        );
        // The words of a dropped watch without its reason: a limit.
        let e = from_status(Status::resource_exhausted("watcher fell behind and was dropped"));
        assert!(matches!(e, Error::LimitExceeded { .. }), "{e:?}");
    }

    #[test]
    fn an_access_policy_refusal_is_its_own_variant_and_says_what_it_said() {
        let message = "permission denied: \"cli\" has no acquire permission on name \"x\"";
        let details = d::Details::new(Code::PermissionDenied, message).error_info(
            d::REASON_PERMISSION_DENIED,
            [("permission", "acquire".to_owned()), ("on", "name".to_owned())],
        );
        let e = from_status(with(Code::PermissionDenied, message, details));
        assert!(matches!(&e, Error::PermissionDenied { .. }), "{e:?}");
        // A refusal of the caller reads as one, never as a lease problem.
        assert_eq!(e.to_string(), message);
        let not_yours = from_status(Status::permission_denied("token does not match"));
        assert!(matches!(not_yours, Error::NotHeld { .. }));
        assert!(not_yours.to_string().starts_with("lease not held (not yours)"));
        assert!(!e.is_retryable());
    }

    #[test]
    fn a_refused_revision_is_told_by_its_reason_not_its_words() {
        let details = d::error_info_details(
            Code::OutOfRange,
            "whatever the words",
            d::REASON_REVISION_COMPACTED,
            &[("from_revision", 3), ("oldest_revision", 7)],
        );
        let s = Status::with_details(Code::OutOfRange, "whatever the words", details.into());
        assert!(matches!(
            from_status(s),
            Error::WatchRevision {
                refusal: RevisionRefusal::Compacted { from: 3, oldest: 7 },
                ..
            }
        ));
        // Without a reason (an older server): the plain OUT_OF_RANGE.
        let e = from_status(Status::out_of_range("from_revision 3 is no longer retained"));
        assert!(matches!(e, Error::OutOfRange { .. }), "{e:?}");
    }

    #[test]
    fn a_name_the_member_does_not_own_is_a_wrong_list_not_a_lost_lease() {
        let message = "names: \"n\" belongs to server b under this server's member lists";
        let details = d::Details::new(Code::FailedPrecondition, message).error_info(
            d::REASON_NAME_NOT_OWNED,
            [("name", "\"n\"".to_owned()), ("owners", "b".to_owned())],
        );
        let e = from_status(with(Code::FailedPrecondition, message, details));
        assert!(
            matches!(&e, Error::Config { message: m } if m == message),
            "{e:?}"
        );
        assert!(!e.is_retryable());
    }

    #[test]
    fn not_held_says_why_by_the_code() {
        for (status, reason) in [
            (Status::not_found("x"), NotHeldReason::Gone),
            (Status::permission_denied("x"), NotHeldReason::NotYours),
            (Status::failed_precondition("x"), NotHeldReason::Ended),
        ] {
            assert!(matches!(from_status(status), Error::NotHeld { reason: r, .. } if r == reason));
        }
    }

    #[test]
    fn other_codes_keep_their_retryability() {
        assert!(from_status(Status::deadline_exceeded("slow")).is_retryable());
        assert!(!from_status(Status::internal("bug")).is_retryable());
        assert!(!from_status(Status::resource_exhausted("full")).is_retryable());
    }
}
