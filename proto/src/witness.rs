//! Signing and verifying lease witnesses and local signed times.
//!
//! Both are "sign the exact encoded bytes, ship the bytes": a verifier checks
//! the signature over the bytes it received and only then decodes them. It
//! never re-encodes, because protobuf encoding is not canonical and a
//! re-encoded body need not match what was signed.

use prost::Message as _;

use crate::keys::{KeyRing, Signer};
use crate::merkle;
use crate::pb;
use crate::{Error, Micros};

/// What a lone witness's signature covers is this prefix, then the body.
/// One key signs witnesses, local times and batch roots; the prefixes
/// (`merkle::root_message` has its own) keep a signature made for one kind
/// of statement from ever verifying as another.
const WITNESS_DOMAIN: &[u8] = b"bagel.v1 witness\0";
/// The prefix of what a local time agent's signature covers.
const LOCAL_TIME_DOMAIN: &[u8] = b"bagel.v1 local time\0";

fn in_domain(domain: &[u8], bytes: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(domain.len() + bytes.len());
    m.extend_from_slice(domain);
    m.extend_from_slice(bytes);
    m
}

/// Encodes `body` and signs the bytes.
pub fn sign_witness(signer: &Signer, body: &pb::WitnessBody) -> pb::Witness {
    let body = body.encode_to_vec();
    let signature = signer.sign(&in_domain(WITNESS_DOMAIN, &body));
    pb::Witness {
        body,
        signature,
        key_id: signer.key_id().to_owned(),
        ..Default::default()
    }
}

/// Signs several bodies with one signature over their Merkle root. A
/// single body is signed directly (no tree).
pub fn sign_witness_batch(signer: &Signer, bodies: Vec<Vec<u8>>) -> Vec<pb::Witness> {
    if bodies.len() == 1 {
        let body = bodies.into_iter().next().expect("one body");
        let signature = signer.sign(&in_domain(WITNESS_DOMAIN, &body));
        return vec![pb::Witness {
            body,
            signature,
            key_id: signer.key_id().to_owned(),
            ..Default::default()
        }];
    }
    if bodies.is_empty() {
        return Vec::new();
    }
    let leaves: Vec<merkle::Hash> = bodies.iter().map(|b| merkle::leaf_hash(b)).collect();
    let (root, paths) = merkle::build(&leaves);
    let signature = signer.sign(&merkle::root_message(&root));
    bodies
        .into_iter()
        .zip(paths)
        .enumerate()
        .map(|(i, (body, path))| pb::Witness {
            body,
            signature: signature.clone(),
            key_id: signer.key_id().to_owned(),
            batched: true,
            leaf_index: i as u32,
            merkle_path: path.iter().map(|h| h.to_vec()).collect(),
        })
        .collect()
}

/// What a witness's signature is over: its domain-prefixed body, or its
/// batch's domain-prefixed root.
pub fn witness_signed_message(witness: &pb::Witness) -> Result<Vec<u8>, Error> {
    if !witness.batched {
        return Ok(in_domain(WITNESS_DOMAIN, &witness.body));
    }
    let root = merkle::root_from_path(
        merkle::leaf_hash(&witness.body),
        witness.leaf_index,
        &witness.merkle_path,
    )
    .ok_or_else(|| Error::Malformed {
        what: "witness merkle path",
        reason: "sibling of the wrong length or index beyond the path".into(),
    })?;
    Ok(merkle::root_message(&root))
}

/// Checks the signature of `witness` against `keys`, then decodes its body.
pub fn verify_witness(witness: &pb::Witness, keys: &KeyRing) -> Result<pb::WitnessBody, Error> {
    let message = witness_signed_message(witness)?;
    keys.verify(&witness.key_id, &message, &witness.signature)?;
    pb::WitnessBody::decode(witness.body.as_slice()).map_err(|e| Error::Malformed {
        what: "witness body",
        reason: e.to_string(),
    })
}

/// A time reading recovered from a verified [`pb::SignedTime`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeReading {
    pub time: Micros,
    /// The signer's error bound on `time`.
    pub radius_us: u64,
    pub source: TimeProofKind,
}

impl TimeReading {
    /// The granularity of `time`: a whole second for RFC Roughtime, a
    /// microsecond for a local time agent. A timestamp compared with a
    /// signed time must be allowed this much on top of any tolerance.
    pub fn resolution_us(&self) -> u64 {
        match self.source {
            TimeProofKind::Local => 1,
            TimeProofKind::Roughtime => crate::duration_micros(crate::roughtime::RESOLUTION),
        }
    }

    /// Whether `ts` lies within `tolerance` plus this reading's radius and
    /// resolution of the reading: the check every reader and the audit make
    /// of a message against its batch's signed time, and writers make
    /// before they write. `Err` with the distance in microseconds and the
    /// limit.
    pub fn congruent(&self, ts: Micros, tolerance: std::time::Duration) -> Result<(), (u64, u64)> {
        let limit = crate::duration_micros(tolerance)
            .saturating_add(self.radius_us)
            .saturating_add(self.resolution_us());
        let diff = ts.as_micros().abs_diff(self.time.as_micros());
        if diff > limit { Err((diff, limit)) } else { Ok(()) }
    }
}

/// A signed time and the reading it proves, checked by whoever obtained it.
#[derive(Clone, Debug, PartialEq)]
pub struct SignedReading {
    pub signed: pb::SignedTime,
    pub reading: TimeReading,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeProofKind {
    /// Signed by a lease server acting as local time agent.
    Local,
    /// A Roughtime exchange.
    Roughtime,
}

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

/// Verifies either kind of signed time: a local proof against the lease
/// servers' keys, a Roughtime proof against the trusted Roughtime keys.
/// Needs no network: auditors call it on stored messages and witnesses.
pub fn verify_signed_time(
    signed: &pb::SignedTime,
    local_keys: &KeyRing,
    roughtime_keys: &[crate::roughtime::RoughtimeKey],
) -> Result<TimeReading, Error> {
    match &signed.proof {
        Some(pb::signed_time::Proof::Roughtime(proof)) => {
            crate::roughtime::verify_roughtime(proof, roughtime_keys).map(|x| x.reading())
        }
        _ => verify_local_time(signed, local_keys),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body() -> pb::WitnessBody {
        pb::WitnessBody {
            lease_id: "00ab".into(),
            names: vec![pb::WitnessName {
                name: "tenant-1".into(),
                fencing_token: 7,
                previous: None,
            }],
            deadline_us: 42,
            ..Default::default()
        }
    }

    #[test]
    fn witness_round_trips_and_detects_every_flipped_byte() {
        let signer = Signer::generate();
        let keys: KeyRing = [signer.verifying_key()].into_iter().collect();
        let witness = sign_witness(&signer, &body());
        assert_eq!(verify_witness(&witness, &keys).unwrap(), body());
        for i in 0..witness.body.len() {
            let mut bad = witness.clone();
            bad.body[i] ^= 0x01;
            assert!(
                verify_witness(&bad, &keys).is_err(),
                "flip at body byte {i} went unnoticed"
            );
        }
        for i in 0..witness.signature.len() {
            let mut bad = witness.clone();
            bad.signature[i] ^= 0x80;
            assert!(matches!(
                verify_witness(&bad, &keys),
                Err(Error::BadSignature { .. })
            ));
        }
    }

    #[test]
    fn batched_witnesses_verify_alone_and_reject_tampering() {
        let signer = Signer::generate();
        let keys: KeyRing = [signer.verifying_key()].into_iter().collect();
        let bodies: Vec<pb::WitnessBody> = (0..5)
            .map(|i| pb::WitnessBody {
                lease_id: format!("lease-{i}"),
                ..body()
            })
            .collect();
        let witnesses = sign_witness_batch(&signer, bodies.iter().map(|b| b.encode_to_vec()).collect());
        assert_eq!(witnesses.len(), 5);
        for (w, b) in witnesses.iter().zip(&bodies) {
            assert!(w.batched);
            assert_eq!(&verify_witness(w, &keys).unwrap(), b);
            let mut bad = w.clone();
            bad.body[0] ^= 1;
            assert!(verify_witness(&bad, &keys).is_err());
            let mut bad = w.clone();
            bad.leaf_index ^= 1;
            assert!(verify_witness(&bad, &keys).is_err());
            let mut bad = w.clone();
            bad.merkle_path[0][3] ^= 1;
            assert!(verify_witness(&bad, &keys).is_err());
            let mut bad = w.clone();
            bad.batched = false;
            assert!(verify_witness(&bad, &keys).is_err());
        }
        // A lone body is signed directly.
        let one = sign_witness_batch(&signer, vec![body().encode_to_vec()]);
        assert!(!one[0].batched);
        assert_eq!(verify_witness(&one[0], &keys).unwrap(), body());
    }

    #[test]
    fn witness_from_an_unknown_key_is_refused() {
        let witness = sign_witness(&Signer::generate(), &body());
        let keys: KeyRing = [Signer::generate().verifying_key()].into_iter().collect();
        assert!(matches!(
            verify_witness(&witness, &keys),
            Err(Error::UnknownKey { .. })
        ));
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
            body: local.body.clone(),
            signature: local.signature.clone(),
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
                body: w.body,
                signature: w.signature,
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
