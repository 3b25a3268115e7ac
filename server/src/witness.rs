//! Turning a table grant into the signed witness and the wire grant.

use bagel_proto::{Micros, Signer, pb, sign_witness, sign_witness_batch};
use prost::Message as _;

use crate::table::{Grant, NameGrant};
use crate::timekeeper::SignedReading;

/// Who signs, and what every witness says about the server.
#[derive(Debug)]
pub struct WitnessSigner {
    pub signer: Signer,
    pub server_id: String,
    pub epoch: Micros,
}

impl WitnessSigner {
    pub fn sign(
        &self,
        grant: &Grant,
        kind: pb::WitnessKind,
        now: Micros,
        time: &SignedReading,
    ) -> pb::Witness {
        sign_witness(&self.signer, &self.body(grant, kind, now, time))
    }

    /// Signs many grants with one signature (Merkle-batched witnesses).
    pub fn sign_batch(
        &self,
        grants: &[(&Grant, pb::WitnessKind)],
        now: Micros,
        time: &SignedReading,
    ) -> Vec<pb::Witness> {
        let bodies = grants
            .iter()
            .map(|(g, kind)| self.body(g, *kind, now, time).encode_to_vec())
            .collect();
        sign_witness_batch(&self.signer, bodies)
    }

    fn body(
        &self,
        grant: &Grant,
        kind: pb::WitnessKind,
        now: Micros,
        time: &SignedReading,
    ) -> pb::WitnessBody {
        pb::WitnessBody {
            lease_id: grant.lease.to_string(),
            names: grant.names.iter().map(witness_name).collect(),
            owner: grant.owner.to_string(),
            mode: pb::Mode::from(grant.mode).into(),
            kind: kind.into(),
            deadline_us: grant.deadline.as_micros(),
            min_timestamp_us: grant.min_timestamp.as_micros(),
            issued_at_us: now.as_micros(),
            signed_time: Some(time.signed.clone()),
            server_id: self.server_id.clone(),
            epoch_us: self.epoch.as_micros(),
            self_timed: true,
        }
    }

    /// The wire form of a grant, with its witness.
    pub fn grant_pb(
        &self,
        grant: &Grant,
        kind: pb::WitnessKind,
        now: Micros,
        time: &SignedReading,
    ) -> pb::LeaseGrant {
        grant_pb(grant, self.sign(grant, kind, now, time))
    }
}

/// The wire form of a grant with its (already signed) witness.
pub fn grant_pb(grant: &Grant, witness: pb::Witness) -> pb::LeaseGrant {
    pb::LeaseGrant {
        lease_id: grant.lease.to_string(),
        token: grant.token.to_string(),
        deadline_us: grant.deadline.as_micros(),
        min_timestamp_us: grant.min_timestamp.as_micros(),
        names: grant
            .names
            .iter()
            .map(|n| pb::NameGrant {
                name: n.name.to_string(),
                fencing_token: n.fencing,
                previous: Some(n.previous.to_pb()),
            })
            .collect(),
        mode: pb::Mode::from(grant.mode).into(),
        witness: Some(witness),
    }
}

fn witness_name(n: &NameGrant) -> pb::WitnessName {
    pb::WitnessName {
        name: n.name.to_string(),
        fencing_token: n.fencing,
        previous: Some(n.previous.to_pb()),
    }
}
