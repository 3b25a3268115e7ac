//! What an acquire says about its TTL when the answer is not what was
//! asked: a grant that leaves much less than asked for (an absolute
//! deadline sent over a slow path, or from a host whose clock is behind
//! the server's), and a refusal of a deadline the server found already
//! past. Without these, `--ttl 10s` could come back with a second left,
//! silently, and a refusal named only the server's side of the story.

use std::time::Duration;

use bagel_proto::{Micros, human_duration};
use prost::Message as _;

use crate::error::Error;
use crate::types::{Grant, Witness};

/// A grant leaving less than this share of the TTL asked for is worth a
/// warning (in quarters): a lease renewed every third of its TTL has
/// little room to spare.
const SHORT_QUARTERS: u32 = 3;

/// The two fields of a `WitnessBody` (`witness.proto`) this module reads.
/// Decoding only them skips the names, owner and signed time without
/// allocating them: a whole body was decoded twice more per acquire,
/// after its verification had decoded it once (see bench/README.md,
/// the CPU rounds).
#[derive(Clone, Copy, PartialEq, prost::Message)]
struct Timing {
    #[prost(uint64, tag = "6")]
    deadline_us: u64,
    #[prost(uint64, tag = "8")]
    issued_at_us: u64,
}

/// The time the grant's witnesses say was left when they were issued
/// (`deadline - issued_at` on the server's clock, the least of them);
/// `None` when no witness says when it was issued.
pub(crate) fn left_at_grant(witnesses: &[Witness]) -> Option<Duration> {
    witnesses
        .iter()
        .filter_map(|w| {
            let body = Timing::decode(w.body()).ok()?;
            (body.issued_at_us != 0)
                .then(|| Duration::from_micros(body.deadline_us.saturating_sub(body.issued_at_us)))
        })
        .min()
}

/// A warning when `grant`, whose witnesses say `left` was left
/// ([`left_at_grant`]), leaves much less than `asked`, naming both.
pub(crate) fn short_grant(grant: &Grant, left: Option<Duration>, asked: Duration) -> Option<String> {
    let left = left?;
    if left >= asked / 4 * SHORT_QUARTERS {
        return None;
    }
    Some(format!(
        "lease {}: asked for {} but the server's grant leaves {} (deadline {}): the request took \
         longer to be granted than it had, or this host's clock is behind the server's; a TTL \
         (--ttl, AcquireBuilder::ttl) is counted from the grant instead",
        grant.lease_id,
        human_duration(asked),
        human_duration(left),
        grant.deadline
    ))
}

/// `e` with this host's side added when it refuses the absolute
/// `deadline` as out of range: what the local clock read when the request
/// was sent and when the refusal came (the server's message names the
/// server's time), so a clock behind the server's shows as such.
pub(crate) fn past_deadline(e: Error, deadline: Micros, sent: Micros, refused: Micros) -> Error {
    match e {
        Error::TtlOutOfRange {
            field,
            min_ttl,
            max_ttl,
            reason,
        } if field == "deadline_us" => Error::TtlOutOfRange {
            field,
            min_ttl,
            max_ttl,
            reason: format!(
                "{reason}; this host's clock read {sent} when the request was sent ({} before the \
                 deadline asked, {deadline}) and {refused} at the refusal",
                human_duration(deadline.duration_since(sent))
            ),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use bagel_proto::pb;
    use prost::Message as _;

    use super::Timing;

    #[test]
    fn timing_reads_the_body_fields_it_names() {
        let body = pb::WitnessBody {
            lease_id: "l".into(),
            names: vec![pb::WitnessName {
                name: "n".into(),
                ..Default::default()
            }],
            owner: "o".into(),
            deadline_us: 7_000_000,
            min_timestamp_us: 1,
            issued_at_us: 5_000_000,
            signed_time: Some(pb::SignedTime::default()),
            server_id: "s".into(),
            epoch_us: 3,
            holder_key: vec![9; 32],
            ..Default::default()
        };
        let t = Timing::decode(body.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!((t.deadline_us, t.issued_at_us), (7_000_000, 5_000_000));
    }
}
