//! The local time agent's proof: a lease server signing its own clock
//! reading, in its own signature domain.

use prost::Message as _;

use super::reading::{TimeProofKind, TimeReading};
use crate::keys::{KeyRing, Signer, in_domain};
use crate::{Error, Micros, pb};

/// The prefix of what a local time agent's signature covers.
const LOCAL_TIME_DOMAIN: &[u8] = b"bagel.v1 local time\0";

/// Signs a clock reading as a local time agent.
pub fn sign_local_time(signer: &Signer, server_id: &str, time: Micros, radius_us: u64) -> pb::SignedTime {
    let body = pb::LocalTimeBody {
        time_us: time.as_micros(),
        radius_us,
        server_id: server_id.to_owned(),
    }
    .encode_to_vec();
    let signature = signer.sign(&in_domain(LOCAL_TIME_DOMAIN, &body));
    pb::SignedTime {
        proof: Some(pb::signed_time::Proof::Local(pb::LocalTimeProof {
            body,
            signature,
            key_id: signer.key_id().to_owned(),
        })),
    }
}

/// Verifies a local-time proof against `keys` and returns the reading.
///
/// Roughtime proofs are verified by the crate that speaks Roughtime; here
/// they are reported as [`Error::UnsupportedProof`].
pub fn verify_local_time(signed: &pb::SignedTime, keys: &KeyRing) -> Result<TimeReading, Error> {
    match &signed.proof {
        None => Err(Error::Malformed {
            what: "signed time",
            reason: "no proof".into(),
        }),
        Some(pb::signed_time::Proof::Roughtime(_)) => Err(Error::UnsupportedProof { proof: "roughtime" }),
        Some(pb::signed_time::Proof::Local(local)) => {
            keys.verify(
                &local.key_id,
                &in_domain(LOCAL_TIME_DOMAIN, &local.body),
                &local.signature,
            )?;
            let body = pb::LocalTimeBody::decode(local.body.as_slice()).map_err(|e| Error::Malformed {
                what: "local time body",
                reason: e.to_string(),
            })?;
            Ok(TimeReading {
                time: Micros::from_micros(body.time_us),
                radius_us: body.radius_us,
                source: TimeProofKind::Local,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signed_time::verify_signed_time;
    use crate::witness::{sign_witness, verify_witness};

    fn body() -> pb::WitnessBody {
        pb::WitnessBody {
            lease_id: "00ab".into(),
            deadline_us: 42,
            ..Default::default()
        }
    }

    #[test]
    fn a_signature_of_one_kind_never_verifies_as_another() {
        let signer = Signer::generate();
        let keys: KeyRing = [signer.verifying_key()].into_iter().collect();
        // A local time whose body bytes are presented as a witness body:
        // same key, same bytes, but signed in the local-time domain.
        let st = sign_local_time(&signer, "s1", Micros::from_micros(99), 5);
        let Some(pb::signed_time::Proof::Local(local)) = st.proof else {
            panic!("a local proof")
        };
        let forged = pb::Witness {
            body: local.body.clone().into(),
            signature: local.signature.clone().into(),
            key_id: local.key_id.clone(),
            ..Default::default()
        };
        assert!(matches!(
            verify_witness(&forged, &keys),
            Err(Error::BadSignature { .. })
        ));
        // And a witness signature presented as a local time.
        let w = sign_witness(&signer, &body());
        let forged = pb::SignedTime {
            proof: Some(pb::signed_time::Proof::Local(pb::LocalTimeProof {
                body: w.body.to_vec(),
                signature: w.signature.to_vec(),
                key_id: w.key_id,
            })),
        };
        assert!(matches!(
            verify_local_time(&forged, &keys),
            Err(Error::BadSignature { .. })
        ));
    }

    #[test]
    fn local_time_round_trips() {
        let signer = Signer::generate();
        let keys: KeyRing = [signer.verifying_key()].into_iter().collect();
        let st = sign_local_time(&signer, "s1", Micros::from_micros(99), 5);
        let reading = verify_local_time(&st, &keys).unwrap();
        assert_eq!(reading.time, Micros::from_micros(99));
        assert_eq!(reading.radius_us, 5);
        assert_eq!(verify_signed_time(&st, &keys, &[]).unwrap(), reading);
        let other: KeyRing = [Signer::generate().verifying_key()].into_iter().collect();
        assert!(matches!(
            verify_signed_time(&st, &other, &[]),
            Err(Error::UnknownKey { .. })
        ));
    }
}
