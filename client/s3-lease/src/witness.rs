//! Witnesses of S3 leases, signed by the client's own key.
//!
//! No third party sees an S3 grant happen, so nobody else can sign for it.
//! The client that made the grant signs the same `WitnessBody` a server
//! would, filled from the lease objects it wrote: lease id, names with
//! fencing tokens and previous leases, owner, mode, deadline,
//! `min_timestamp`, the signed time it checked its clock with. The
//! `server_id` is the store's URL (every grant of a name is serialised by
//! that one store, which is what the audit's "same server" test asks) and
//! the epoch is 0 (a store has no incarnations). Published keys
//! (`keys/` in the store) let readers and the audit verify the chain.

use bagel_lease_core::{Micros, Mode, Witness};
use bagel_proto::{Signer, pb, sign_witness};

use crate::time::Stamp;

/// One name of a witness.
#[derive(Clone, Debug)]
pub struct WitnessName {
    pub name: String,
    pub fencing_token: u64,
    pub previous: pb::PreviousLease,
}

/// What a witness states.
#[derive(Clone, Debug)]
pub struct Statement<'a> {
    pub kind: pb::WitnessKind,
    pub lease_id: &'a str,
    pub owner: &'a str,
    pub mode: Mode,
    pub deadline: Micros,
    pub min_timestamp: Micros,
    pub names: Vec<WitnessName>,
    /// When the statement was made: the grant time for an acquire.
    pub issued_at: Micros,
    /// The holder's public key for the lease (32 bytes), or empty.
    pub holder_key: Vec<u8>,
}

/// Signs `s` with `signer`, stamped by `stamp`, as issued by `store`.
pub fn sign(signer: &Signer, store: &str, stamp: &Stamp, s: Statement<'_>) -> Witness {
    let body = pb::WitnessBody {
        lease_id: s.lease_id.to_owned(),
        names: s
            .names
            .into_iter()
            .map(|n| pb::WitnessName {
                name: n.name,
                fencing_token: n.fencing_token,
                previous: Some(n.previous),
            })
            .collect(),
        owner: s.owner.to_owned(),
        mode: pb::Mode::from(s.mode).into(),
        kind: s.kind.into(),
        deadline_us: s.deadline.as_micros(),
        min_timestamp_us: s.min_timestamp.as_micros(),
        issued_at_us: s.issued_at.as_micros(),
        signed_time: Some(stamp.signed.clone()),
        server_id: store.to_owned(),
        epoch_us: 0,
        self_timed: stamp.self_timed,
        holder_key: s.holder_key,
    };
    let w = sign_witness(signer, &body);
    Witness::from(w)
}
