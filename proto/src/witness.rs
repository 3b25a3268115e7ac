//! Signing and verifying lease witnesses.
//!
//! "Sign the exact encoded bytes, ship the bytes": a verifier checks
//! the signature over the bytes it received and only then decodes them. It
//! never re-encodes, because protobuf encoding is not canonical and a
//! re-encoded body need not match what was signed.

use prost::Message as _;

use crate::Error;
use crate::keys::{KeyRing, Signer, in_domain};
use crate::merkle;
use crate::pb;

/// What a lone witness's signature covers is this prefix, then the body
/// (see [`crate::keys::in_domain`]; `merkle::root_message` has its own).
const WITNESS_DOMAIN: &[u8] = b"bagel.v1 witness\0";

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
    let tree = merkle::Tree::new(&leaves);
    let signature = signer.sign(&merkle::root_message(&tree.root()));
    bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| pb::Witness {
            body,
            signature: signature.clone(),
            key_id: signer.key_id().to_owned(),
            batched: true,
            leaf_index: i as u32,
            merkle_path: tree.path(i).map(|h| h.to_vec()).collect(),
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

/// Reads a witness body without checking its signature: for reporting,
/// for readers that were given no keys (and say so), and for writers
/// checking what the witness they cite allows.
pub fn decode_unverified(w: &pb::Witness) -> Result<pb::WitnessBody, String> {
    pb::WitnessBody::decode(w.body.as_slice()).map_err(|e| format!("witness body does not decode: {e}"))
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
}
