//! The status details of a refused acquire, in the gRPC richer error model.
//!
//! An ABORTED acquire's `grpc-status-details-bin` is a `google.rpc.Status`
//! whose `details` are `google.protobuf.Any`s: the [`pb::LeaseConflict`]
//! (who holds the name, until when) under [`LEASE_CONFLICT_TYPE_URL`], and
//! a `google.rpc.RetryInfo` whose `retry_delay` is the time until the
//! holder's deadline. That is what the standard decoders of every gRPC
//! language read (Go's `status.FromError(...).Details()`, Python's
//! `grpc_status.rpc_status.from_call`, Java's `StatusProto`), which fail
//! on a bare `LeaseConflict`.
//!
//! The server encodes with [`conflict_details`]; every decoder in the
//! workspace goes through [`conflict_of`], which also reads a bare
//! `LeaseConflict` (the form an older server sends).
//!
//! A refused or ended Watch carries a `google.rpc.ErrorInfo` (domain
//! [`ERROR_DOMAIN`], one of the `REASON_*` reasons, the numbers in its
//! metadata), so that a client tells "list again" from "resume from your
//! last revision" by a stable reason rather than by the message's words:
//! [`error_info_details`] encodes, [`error_info_of`] decodes.
//!
//! Every refusal of a request field carries a `google.rpc.BadRequest`
//! naming the field ([`field_violation_of`]), and the refusals a client
//! acts on an `ErrorInfo` with their numbers: a wait over the server's max
//! ([`REASON_WAIT_TOO_LONG`]), a lifetime outside its TTL range
//! ([`REASON_TTL_OUT_OF_RANGE`]), a call the access policy does not allow
//! ([`REASON_PERMISSION_DENIED`]). [`Details`] builds any mix of them.

use std::time::Duration;

use prost::Message as _;
use prost_types::Any;
use std::collections::HashMap;

use tonic_types::pb::{BadRequest, ErrorInfo, RetryInfo, Status as RpcStatus, bad_request::FieldViolation};

use crate::pb;

/// The `Any` type URL of a [`pb::LeaseConflict`] detail.
pub const LEASE_CONFLICT_TYPE_URL: &str = "type.googleapis.com/bagel.v1.LeaseConflict";

/// The `Any` type URL of a `google.rpc.RetryInfo` detail.
pub const RETRY_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// The `Any` type URL of a `google.rpc.ErrorInfo` detail.
pub const ERROR_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.ErrorInfo";

/// The `Any` type URL of a `google.rpc.BadRequest` detail.
pub const BAD_REQUEST_TYPE_URL: &str = "type.googleapis.com/google.rpc.BadRequest";

/// The `ErrorInfo.domain` of this service's reasons.
pub const ERROR_DOMAIN: &str = "bagel.v1";

/// Watch: `from_revision` is older than the oldest event the server still
/// keeps (OUT_OF_RANGE). Metadata: `from_revision`, `oldest_revision`
/// (the oldest one a watch may start from), `retain`. List again.
pub const REASON_REVISION_COMPACTED: &str = "REVISION_COMPACTED";
/// Watch: `from_revision` is of another incarnation of the server (one
/// before a restart, or another server's), OUT_OF_RANGE. Metadata:
/// `from_revision`, `incarnation` (the revision's), `server_incarnation`.
/// List again.
pub const REASON_REVISION_OF_OTHER_INCARNATION: &str = "REVISION_OF_OTHER_INCARNATION";
/// Watch: `from_revision` is ahead of the server's last (OUT_OF_RANGE).
/// Metadata: `from_revision`, `last_revision`.
pub const REASON_REVISION_AHEAD: &str = "REVISION_AHEAD";
/// Watch: the watcher fell behind and was dropped (RESOURCE_EXHAUSTED).
/// Metadata: `buffer`, `last_revision` (the last one it was sent: watch
/// again from it).
pub const REASON_WATCH_OVERFLOW: &str = "WATCH_OVERFLOW";
/// Watch: the watcher's client read nothing it was owed for the server's
/// stall bound, and was dropped (RESOURCE_EXHAUSTED). Metadata:
/// `stall_ms`, `last_revision` (the last one it was sent: watch again
/// from it).
pub const REASON_WATCH_STALLED: &str = "WATCH_STALLED";

/// An acquire asked to wait longer than the server allows (OUT_OF_RANGE,
/// field `wait_us`). Metadata: `wait_us`, `max_wait_us` (wait in rounds
/// of at most that).
pub const REASON_WAIT_TOO_LONG: &str = "WAIT_TOO_LONG";
/// A lease's lifetime outside the server's TTL range (OUT_OF_RANGE, field
/// `ttl_us` or `deadline_us`). Metadata: `min_ttl_us`, `max_ttl_us`, and
/// `ttl_us` or `deadline_us` and `now_us` (the server's clock).
pub const REASON_TTL_OUT_OF_RANGE: &str = "TTL_OUT_OF_RANGE";
/// The server's access policy gives the caller no grant of a permission
/// on a name or prefix (PERMISSION_DENIED). Metadata: `permission`, `on`
/// (`name` or `prefix`). Other PERMISSION_DENIED refusals (a lease's
/// token, another certificate's lease) carry no reason.
pub const REASON_PERMISSION_DENIED: &str = "PERMISSION_DENIED";
/// A name the server does not own under the member lists it was started
/// with (FAILED_PRECONDITION): the caller's server list routes it to the
/// wrong member. Metadata: `name`, `server_id` (this server), `owners`
/// (the owner under each list in force, comma-separated). Retrying won't
/// help; fix the list.
pub const REASON_NAME_NOT_OWNED: &str = "NAME_NOT_OWNED";

/// A `google.rpc.Status` for a status's `grpc-status-details-bin`, built
/// up detail by detail: `code` and `message` as the gRPC status has them
/// (the model wants them repeated).
#[derive(Clone, Debug)]
pub struct Details(RpcStatus);

impl Details {
    /// A status with no details yet; `code` and `message` must be the
    /// gRPC status's own (clients compare them).
    pub fn new(code: tonic::Code, message: &str) -> Self {
        Details(RpcStatus {
            code: code as i32,
            message: message.to_owned(),
            details: Vec::new(),
        })
    }

    /// A `google.rpc.BadRequest` naming `field` and why (`description`).
    #[must_use]
    pub fn field_violation(mut self, field: &str, description: &str) -> Self {
        let bad = BadRequest {
            field_violations: vec![FieldViolation {
                field: field.to_owned(),
                description: description.to_owned(),
                ..FieldViolation::default()
            }],
        };
        self.0.details.push(Any {
            type_url: BAD_REQUEST_TYPE_URL.to_owned(),
            value: bad.encode_to_vec(),
        });
        self
    }

    /// A `google.rpc.ErrorInfo` of [`ERROR_DOMAIN`] with `reason` and
    /// its metadata.
    #[must_use]
    pub fn error_info<'a>(
        mut self,
        reason: &str,
        metadata: impl IntoIterator<Item = (&'a str, String)>,
    ) -> Self {
        let info = ErrorInfo {
            reason: reason.to_owned(),
            domain: ERROR_DOMAIN.to_owned(),
            metadata: metadata.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        };
        self.0.details.push(Any {
            type_url: ERROR_INFO_TYPE_URL.to_owned(),
            value: info.encode_to_vec(),
        });
        self
    }

    /// The `google.rpc.Status` bytes for `tonic::Status::with_details`.
    pub fn encode(&self) -> Vec<u8> {
        self.0.encode_to_vec()
    }
}

/// The first field violation of a `google.rpc.BadRequest` in a status's
/// details: the field and why. `None` when there is none (an older
/// server, or a refusal of no one field).
pub fn field_violation_of(details: &[u8]) -> Option<(String, String)> {
    let status = RpcStatus::decode(details).ok()?;
    let any = status
        .details
        .iter()
        .find(|a| a.type_url == BAD_REQUEST_TYPE_URL)?;
    let violation = BadRequest::decode(any.value.as_slice())
        .ok()?
        .field_violations
        .into_iter()
        .next()?;
    (!violation.field.is_empty()).then_some((violation.field, violation.description))
}

/// The encoded `google.rpc.Status` of a refused acquire: `code` and
/// `message` as the gRPC status has them (the model wants them repeated),
/// the conflict, and a retry delay of `retry_after` (the time until the
/// holder's deadline).
pub fn conflict_details(
    code: tonic::Code,
    message: &str,
    conflict: &pb::LeaseConflict,
    retry_after: Duration,
) -> Vec<u8> {
    let retry = retry_info(retry_after);
    RpcStatus {
        code: code as i32,
        message: message.to_owned(),
        details: vec![
            Any {
                type_url: LEASE_CONFLICT_TYPE_URL.to_owned(),
                value: conflict.encode_to_vec(),
            },
            Any {
                type_url: RETRY_INFO_TYPE_URL.to_owned(),
                value: retry.encode_to_vec(),
            },
        ],
    }
    .encode_to_vec()
}

/// The encoded `google.rpc.Status` of a refusal that a retry after
/// `retry_after` may not meet (a server still in its restart wait): `code`
/// and `message` as the gRPC status has them, and a `RetryInfo`.
pub fn retry_details(code: tonic::Code, message: &str, retry_after: Duration) -> Vec<u8> {
    RpcStatus {
        code: code as i32,
        message: message.to_owned(),
        details: vec![Any {
            type_url: RETRY_INFO_TYPE_URL.to_owned(),
            value: retry_info(retry_after).encode_to_vec(),
        }],
    }
    .encode_to_vec()
}

/// The encoded `google.rpc.Status` of a refusal with a stable `reason` (in
/// [`ERROR_DOMAIN`]) and the numbers that go with it.
pub fn error_info_details(
    code: tonic::Code,
    message: &str,
    reason: &str,
    metadata: &[(&str, u64)],
) -> Vec<u8> {
    let info = ErrorInfo {
        reason: reason.to_owned(),
        domain: ERROR_DOMAIN.to_owned(),
        metadata: metadata
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.to_string()))
            .collect(),
    };
    RpcStatus {
        code: code as i32,
        message: message.to_owned(),
        details: vec![Any {
            type_url: ERROR_INFO_TYPE_URL.to_owned(),
            value: info.encode_to_vec(),
        }],
    }
    .encode_to_vec()
}

/// A reason of this service and its metadata, from a status's details:
/// `None` when they hold no `ErrorInfo` of [`ERROR_DOMAIN`] (an older
/// server, or another failure).
pub fn error_info_of(details: &[u8]) -> Option<(String, HashMap<String, String>)> {
    let status = RpcStatus::decode(details).ok()?;
    let any = status
        .details
        .iter()
        .find(|a| a.type_url == ERROR_INFO_TYPE_URL)?;
    let info = ErrorInfo::decode(any.value.as_slice()).ok()?;
    (info.domain == ERROR_DOMAIN).then_some((info.reason, info.metadata))
}

fn retry_info(retry_after: Duration) -> RetryInfo {
    RetryInfo {
        retry_delay: Some(prost_types::Duration {
            seconds: i64::try_from(retry_after.as_secs()).unwrap_or(i64::MAX),
            // Below 10^9, so it fits.
            nanos: retry_after.subsec_nanos() as i32,
        }),
    }
}

/// `details` (a status's `grpc-status-details-bin`) without the copy of
/// the message the `google.rpc.Status` model repeats in them: for an
/// operation's refusal inside a batch, whose `OpError.message` already
/// says it (a thousand refused operations would otherwise answer it three
/// times each). Undecodable details are passed on as they are.
pub fn without_message(details: &[u8]) -> Vec<u8> {
    match RpcStatus::decode(details) {
        Ok(mut status) => {
            status.message.clear();
            status.encode_to_vec()
        }
        Err(_) => details.to_vec(),
    }
}

/// The conflict in a status's details: the `google.rpc.Status` form, or
/// the bare `LeaseConflict` older servers sent. The two cannot be taken
/// for one another: field 1 is a varint in one (`code`) and a string in
/// the other (`name`), so decoding the wrong one fails. `None` when the
/// details hold no conflict (or one without a name).
pub fn conflict_of(details: &[u8]) -> Option<pb::LeaseConflict> {
    if details.is_empty() {
        return None;
    }
    let conflict = match RpcStatus::decode(details) {
        Ok(status) => status
            .details
            .iter()
            .find(|any| any.type_url == LEASE_CONFLICT_TYPE_URL)
            .and_then(|any| pb::LeaseConflict::decode(any.value.as_slice()).ok()),
        Err(_) => pb::LeaseConflict::decode(details).ok(),
    };
    conflict.filter(|c| !c.name.is_empty())
}

/// The `RetryInfo` delay in a status's details, if it has one.
pub fn retry_delay_of(details: &[u8]) -> Option<Duration> {
    let status = RpcStatus::decode(details).ok()?;
    let any = status
        .details
        .iter()
        .find(|a| a.type_url == RETRY_INFO_TYPE_URL)?;
    let delay = RetryInfo::decode(any.value.as_slice()).ok()?.retry_delay?;
    Some(Duration::new(
        u64::try_from(delay.seconds).ok()?,
        u32::try_from(delay.nanos).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conflict() -> pb::LeaseConflict {
        pb::LeaseConflict {
            name: "a".to_owned(),
            holder_lease_id: "l1".to_owned(),
            holder_owner: "me".to_owned(),
            holder_mode: pb::Mode::Full.into(),
            holder_deadline_us: 42,
        }
    }

    #[test]
    fn the_standard_form_round_trips() {
        let bytes = conflict_details(
            tonic::Code::Aborted,
            "held",
            &conflict(),
            Duration::from_millis(1500),
        );
        assert_eq!(conflict_of(&bytes), Some(conflict()));
        assert_eq!(retry_delay_of(&bytes), Some(Duration::from_millis(1500)));
        let status = RpcStatus::decode(bytes.as_slice()).unwrap();
        assert_eq!(
            (status.code, status.message.as_str()),
            (tonic::Code::Aborted as i32, "held")
        );
    }

    #[test]
    fn the_old_bare_form_still_reads() {
        let bytes = conflict().encode_to_vec();
        assert_eq!(conflict_of(&bytes), Some(conflict()));
        assert_eq!(retry_delay_of(&bytes), None);
    }

    #[test]
    fn an_error_info_round_trips_and_another_domain_is_not_ours() {
        let bytes = error_info_details(
            tonic::Code::OutOfRange,
            "too old",
            REASON_REVISION_COMPACTED,
            &[("from_revision", 5), ("oldest_revision", 9)],
        );
        let (reason, meta) = error_info_of(&bytes).unwrap();
        assert_eq!(reason, REASON_REVISION_COMPACTED);
        assert_eq!(meta["from_revision"], "5");
        assert_eq!(meta["oldest_revision"], "9");
        assert_eq!(conflict_of(&bytes), None);
        let other = RpcStatus {
            code: 11,
            message: String::new(),
            details: vec![Any {
                type_url: ERROR_INFO_TYPE_URL.to_owned(),
                value: ErrorInfo {
                    reason: REASON_REVISION_COMPACTED.to_owned(),
                    domain: "elsewhere".to_owned(),
                    metadata: HashMap::new(),
                }
                .encode_to_vec(),
            }],
        }
        .encode_to_vec();
        assert_eq!(error_info_of(&other), None);
        assert_eq!(error_info_of(&[]), None);
    }

    #[test]
    fn a_field_violation_and_a_reason_go_together() {
        let bytes = Details::new(tonic::Code::OutOfRange, "wait_us: too long")
            .field_violation("wait_us", "too long")
            .error_info(
                REASON_WAIT_TOO_LONG,
                [("max_wait_us", "10".to_owned()), ("wait_us", "20".to_owned())],
            )
            .encode();
        assert_eq!(
            field_violation_of(&bytes),
            Some(("wait_us".to_owned(), "too long".to_owned()))
        );
        let (reason, meta) = error_info_of(&bytes).unwrap();
        assert_eq!(reason, REASON_WAIT_TOO_LONG);
        assert_eq!(meta["max_wait_us"], "10");
        assert_eq!(conflict_of(&bytes), None);
        let status = RpcStatus::decode(bytes.as_slice()).unwrap();
        assert_eq!(status.message, "wait_us: too long");
        assert_eq!(field_violation_of(&[]), None);
        let none = Details::new(tonic::Code::OutOfRange, "x").encode();
        assert_eq!(field_violation_of(&none), None);
    }

    #[test]
    fn no_details_no_conflict() {
        assert_eq!(conflict_of(&[]), None);
        let other = RpcStatus {
            code: 10,
            message: String::new(),
            details: vec![],
        }
        .encode_to_vec();
        assert_eq!(conflict_of(&other), None);
    }
}
