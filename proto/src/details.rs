//! The status details of a refused acquire, in the gRPC richer error model.
//!
//! An ABORTED acquire's `grpc-status-details-bin` is a `google.rpc.Status`
//! whose `details` are `google.protobuf.Any`s: the [`pb::LeaseConflict`]
//! (who holds the name, until when) under [`LEASE_CONFLICT_TYPE_URL`], and
//! a `google.rpc.RetryInfo` whose `retry_delay` is the time until the
//! holder's deadline. That is what the standard decoders of every gRPC
//! language read (Go's `status.FromError(...).Details()`, Python's
//! `grpc_status.rpc_status.from_call`, Java's `StatusProto`); servers
//! before this sent the bare `LeaseConflict`, on which they fail.
//!
//! The server encodes with [`conflict_details`]; every decoder in the
//! workspace goes through [`conflict_of`], which also reads the old bare
//! form (a newer client against an older server).
//!
//! A refused or ended Watch carries a `google.rpc.ErrorInfo` (domain
//! [`ERROR_DOMAIN`], one of the `REASON_*` reasons, the numbers in its
//! metadata), so that a client tells "list again" from "resume from your
//! last revision" by a stable reason rather than by the message's words:
//! [`error_info_details`] encodes, [`error_info_of`] decodes.

use std::time::Duration;

use prost::Message as _;
use prost_types::Any;
use std::collections::HashMap;

use tonic_types::pb::{ErrorInfo, RetryInfo, Status as RpcStatus};

use crate::pb;

/// The `Any` type URL of a [`pb::LeaseConflict`] detail.
pub const LEASE_CONFLICT_TYPE_URL: &str = "type.googleapis.com/bagel.v1.LeaseConflict";

/// The `Any` type URL of a `google.rpc.RetryInfo` detail.
pub const RETRY_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// The `Any` type URL of a `google.rpc.ErrorInfo` detail.
pub const ERROR_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.ErrorInfo";

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
