//! The one place the client checks what a server signed: every grant and
//! renewal, unary or batched, goes through here before it becomes a
//! [`Grant`] or a [`Renewal`].
//!
//! A witness is checked in two parts: its signature (over the body, or
//! over its batch's Merkle root), then that its body states exactly what
//! the answer says. The grants of a batch share one signature, so
//! [`Verified`] remembers the last (signature, signed message) checked and
//! the others cost only their Merkle path. A lean answer's grants carry
//! their bodies alone and the answer one signature over them
//! ([`lean_witnesses`]): folded and checked once, each full witness read
//! off the fold, and the grant read from its body, which states it all.

use bagel_proto::{KeyRing, VerifiedBatch, pb};
use prost::Message as _;

use crate::error::{Error, Result};
use crate::types::{Grant, NameGrant, Renewal, Witness};

/// The batch whose signature was verified last, and the Merkle nodes its
/// witnesses proved (see [`VerifiedBatch`]).
pub(crate) type Verified = VerifiedBatch;

fn bad(reason: impl Into<String>) -> Error {
    Error::Witness {
        reason: reason.into(),
    }
}

/// Checks `witness`'s signature against `keys` (or finds it proven by its
/// batch already) and decodes its body. With `keys` `None`, the body is
/// only decoded: the caller turned verification off (benchmarks).
pub(crate) fn body(
    witness: &pb::Witness,
    keys: Option<&KeyRing>,
    verified: &mut Verified,
) -> Result<pb::WitnessBody> {
    if let Some(keys) = keys {
        verified.check(witness, keys).map_err(|e| bad(e.to_string()))?;
    }
    pb::WitnessBody::decode(&witness.body[..]).map_err(|e| bad(e.to_string()))
}

/// A grant whose witness verifies and states it exactly.
pub(crate) fn grant(mut g: pb::LeaseGrant, keys: Option<&KeyRing>, verified: &mut Verified) -> Result<Grant> {
    let witness = g.witness.take().ok_or_else(|| bad("grant has no witness"))?;
    let b = body(&witness, keys, verified)?;
    let names_match = b.names.len() == g.names.len()
        && b.names
            .iter()
            .zip(&g.names)
            .all(|(w, n)| w.name == n.name && w.fencing_token == n.fencing_token && w.previous == n.previous);
    if b.lease_id != g.lease_id
        || b.deadline_us != g.deadline_us
        || b.min_timestamp_us != g.min_timestamp_us
        || b.mode().normalized() != g.mode().normalized()
        || !names_match
    {
        return Err(bad(format!(
            "witness does not state the grant of lease {}",
            g.lease_id
        )));
    }
    Ok(Grant {
        names: g.names.iter().map(NameGrant::from).collect(),
        mode: g.mode().into(),
        lease_id: g.lease_id,
        token: g.token,
        deadline: bagel_proto::Micros::from_micros(g.deadline_us),
        min_timestamp: bagel_proto::Micros::from_micros(g.min_timestamp_us),
        witnesses: vec![Witness::from(witness)],
        servers: Vec::new(),
    })
}

/// A renewal of `lease_id` whose witness verifies and states its deadline.
pub(crate) fn renewal(
    r: pb::RenewResponse,
    lease_id: &str,
    keys: Option<&KeyRing>,
    verified: &mut Verified,
) -> Result<Renewal> {
    let witness = r.witness.ok_or_else(|| bad("renewal has no witness"))?;
    let b = body(&witness, keys, verified)?;
    if b.lease_id != lease_id || b.deadline_us != r.deadline_us {
        return Err(bad(format!(
            "renewal witness does not state lease {lease_id} until {}",
            r.deadline_us
        )));
    }
    Ok(Renewal {
        deadline: bagel_proto::Micros::from_micros(r.deadline_us),
        mode: b.mode().into(),
        witnesses: vec![Witness::from(witness)],
    })
}

/// The full witnesses of a lean answer's `lean_grant` and `lean_renewed`
/// results, in order: the answer's signed range folded over their bodies,
/// its signature checked against `keys` (or found checked already: the
/// answers a session's server ran together share it; with `keys` `None`
/// not checked), and each witness read off the fold, byte for byte the
/// one the full form carries (see `bagel_proto::signed_range`). Empty for
/// an answer in the full form.
pub(crate) fn lean_witnesses(
    response: &pb::BatchResponse,
    keys: Option<&KeyRing>,
    verified: &mut Verified,
) -> Result<Vec<pb::Witness>> {
    let bodies = bagel_proto::signed_range::lean_bodies(response);
    let Some(range) = &response.signed else {
        return if bodies.is_empty() {
            Ok(Vec::new())
        } else {
            Err(bad("a lean answer carries no signature for its grants"))
        };
    };
    if bodies.is_empty() {
        return Err(bad("an answer signs grants it does not carry"));
    }
    let folded =
        bagel_proto::signed_range::FoldedRange::fold(range, bodies).map_err(|e| bad(e.to_string()))?;
    if let Some(keys) = keys {
        verified
            .check_range(&folded, keys)
            .map_err(|e| bad(e.to_string()))?;
    }
    Ok((0..folded.len()).map(|k| folded.witness(k)).collect())
}

/// A grant in the lean form: its `witness` (derived and checked by
/// [`lean_witnesses`]) states the whole grant, and the answer adds only
/// the holder's `token`.
pub(crate) fn lean_grant(token: String, witness: pb::Witness) -> Result<Grant> {
    let b = pb::WitnessBody::decode(&witness.body[..]).map_err(|e| bad(e.to_string()))?;
    Ok(Grant {
        names: b.names.iter().map(NameGrant::from).collect(),
        mode: b.mode().into(),
        token,
        deadline: bagel_proto::Micros::from_micros(b.deadline_us),
        min_timestamp: bagel_proto::Micros::from_micros(b.min_timestamp_us),
        lease_id: b.lease_id,
        witnesses: vec![Witness::derived(witness)],
        servers: Vec::new(),
    })
}

/// A renewal of `lease_id` in the lean form: its `witness` (derived and
/// checked by [`lean_witnesses`]) must be of that lease; the deadline is
/// the one it states.
pub(crate) fn lean_renewal(witness: pb::Witness, lease_id: &str) -> Result<Renewal> {
    let b = pb::WitnessBody::decode(&witness.body[..]).map_err(|e| bad(e.to_string()))?;
    if b.lease_id != lease_id {
        return Err(bad(format!(
            "renewal witness is of lease {}, not {lease_id}",
            b.lease_id
        )));
    }
    Ok(Renewal {
        deadline: bagel_proto::Micros::from_micros(b.deadline_us),
        mode: b.mode().into(),
        witnesses: vec![Witness::derived(witness)],
    })
}
