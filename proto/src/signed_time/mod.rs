//! Signed time: a clock reading that carries its own proof, so anyone can
//! check later, offline, that a timestamp was near the time an authority
//! vouched for.
//!
//! * [`reading`]: what a verified proof says ([`TimeReading`]), a proof
//!   with its reading ([`SignedReading`]), and where writers get one
//!   ([`SignedClock`]).
//! * [`local`]: the lease server as local time agent, signing its own clock.
//! * [`roughtime`]: Roughtime exchanges, verified offline.
//!
//! Asking an authority over the network and judging the local clock is
//! [`crate::authority`]'s business, not this module's.

pub mod local;
pub mod reading;
pub mod roughtime;

pub use local::{sign_local_time, verify_local_time};
pub use reading::{SignedClock, SignedReading, TimeProofKind, TimeReading};

use crate::keys::KeyRing;
use crate::{Error, pb};

/// Verifies either kind of signed time: a local proof against the lease
/// servers' keys, a Roughtime proof against the trusted Roughtime keys.
/// Needs no network: auditors call it on stored messages and witnesses.
pub fn verify_signed_time(
    signed: &pb::SignedTime,
    local_keys: &KeyRing,
    roughtime_keys: &[roughtime::RoughtimeKey],
) -> Result<TimeReading, Error> {
    match &signed.proof {
        Some(pb::signed_time::Proof::Roughtime(proof)) => {
            roughtime::verify_roughtime(proof, roughtime_keys).map(|x| x.reading())
        }
        _ => verify_local_time(signed, local_keys),
    }
}
