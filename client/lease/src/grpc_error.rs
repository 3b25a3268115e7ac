//! The gRPC edge of the lease core's [`Error`]: the one place a status
//! code is read. A status becomes the variant that names its failure; the
//! server's messages begin with the field they refuse (`deadline_us: …`),
//! which becomes [`Error::Invalid`]'s or [`Error::OutOfRange`]'s `field`,
//! and a refusal's details (a `google.rpc.Status` with the conflict and a
//! `RetryInfo`) become `conflict` and `retry_after`.

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

/// `(field, reason)` of a message that begins with the field it is
/// about (`names[2]: …`, `metadata.data: …`); `(None, message)` else.
fn split_field(message: String) -> (Option<String>, String) {
    let Some((field, reason)) = message.split_once(": ") else {
        return (None, message);
    };
    let is_field = field.starts_with(|c: char| c.is_ascii_alphabetic())
        && field
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '[' | ']'));
    if is_field {
        (Some(field.to_owned()), reason.to_owned())
    } else {
        (None, message)
    }
}

/// The core's error for a status from a lease server (or made on this
/// side by the transport).
pub(crate) fn from_status(s: Status) -> Error {
    let message = status_message(&s);
    match s.code() {
        // The details are a google.rpc.Status with the conflict packed
        // in an Any; servers before that sent the bare conflict, which
        // `conflict_of` reads too.
        Code::Aborted => Error::Busy {
            conflict: bagel_proto::details::conflict_of(s.details()).map(|c| Box::new(Conflict::from(c))),
            message,
        },
        Code::Unavailable => Error::Unavailable {
            retry_after: bagel_proto::details::retry_delay_of(s.details()),
            message,
        },
        Code::InvalidArgument => {
            let (field, reason) = split_field(message);
            Error::Invalid { field, reason }
        }
        Code::OutOfRange => match revision_refusal(s.details()) {
            Some(refusal) => Error::WatchRevision { refusal, message },
            None => {
                let (field, reason) = split_field(message);
                Error::OutOfRange { field, reason }
            }
        },
        Code::NotFound => Error::not_held(NotHeldReason::Gone, message),
        Code::PermissionDenied => Error::not_held(NotHeldReason::NotYours, message),
        Code::FailedPrecondition => Error::not_held(NotHeldReason::Ended, message),
        Code::ResourceExhausted => Error::LimitExceeded { message },
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

/// Whether a status ends a watch that fell behind: by its reason, or by
/// its words from a server before reasons.
pub(crate) fn is_watch_overflow(s: &Status) -> bool {
    match d::error_info_of(s.details()) {
        Some((reason, _)) => reason == d::REASON_WATCH_OVERFLOW || reason == d::REASON_WATCH_STALLED,
        None => s.code() == Code::ResourceExhausted && s.message().contains("fell behind"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_its_field_and_a_message_without_one_has_none() {
        let e = from_status(Status::out_of_range("deadline_us: 5 is already past"));
        assert!(
            matches!(&e, Error::OutOfRange { field: Some(f), reason } if f == "deadline_us" && reason == "5 is already past"),
            "{e:?}"
        );
        let e = from_status(Status::invalid_argument("names[2]: empty"));
        assert_eq!(e.field(), Some("names[2]"));
        let e = from_status(Status::invalid_argument(
            "set either deadline_us or ttl_us: not both",
        ));
        assert_eq!(e.field(), None, "{e:?}");
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
