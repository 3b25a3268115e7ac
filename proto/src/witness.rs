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
pub(crate) const WITNESS_DOMAIN: &[u8] = b"bagel.v1 witness\0";

/// Encodes `body` and signs the bytes.
pub fn sign_witness(signer: &Signer, body: &pb::WitnessBody) -> pb::Witness {
    let body = body.encode_to_vec();
    let signature = signer.sign(&in_domain(WITNESS_DOMAIN, &body));
    pb::Witness {
        body: body.into(),
        signature: signature.into(),
        key_id: signer.key_id().to_owned(),
        ..Default::default()
    }
}

/// Signs several bodies with one signature over their Merkle root. A
/// single body is signed directly (no tree). The witnesses share the
/// signature and the tree's nodes (see [`merkle::Tree::shared_paths`]).
pub fn sign_witness_batch(signer: &Signer, bodies: Vec<Vec<u8>>) -> Vec<pb::Witness> {
    sign_witness_group(signer, bodies).witnesses()
}

/// Signs `bodies` with one signature: over their Merkle root, or over the
/// body itself when there is one.
pub fn sign_witness_group(signer: &Signer, bodies: Vec<Vec<u8>>) -> SignedGroup {
    let bodies: Vec<prost::bytes::Bytes> = bodies.into_iter().map(Into::into).collect();
    let key_id = signer.key_id().to_owned();
    if bodies.len() <= 1 {
        let signature = bodies
            .first()
            .map(|body| signer.sign(&in_domain(WITNESS_DOMAIN, body)).into())
            .unwrap_or_default();
        return SignedGroup {
            bodies,
            signature,
            key_id,
            tree: None,
        };
    }
    let leaves: Vec<merkle::Hash> = bodies.iter().map(|b| merkle::leaf_hash(b)).collect();
    let tree = merkle::Tree::new(&leaves);
    let signature = signer.sign(&merkle::root_message(&tree.root())).into();
    let paths = tree.shared_paths();
    SignedGroup {
        bodies,
        signature,
        key_id,
        tree: Some((tree, paths)),
    }
}

/// Witness bodies signed together ([`sign_witness_group`]): each one's
/// full witness, or the [`pb::SignedRange`] of a run of them (the lean
/// answer, see [`crate::signed_range`]).
#[derive(Debug)]
pub struct SignedGroup {
    bodies: Vec<prost::bytes::Bytes>,
    signature: prost::bytes::Bytes,
    key_id: String,
    /// None for a group of one (signed over its body).
    tree: Option<(merkle::Tree, merkle::SharedPaths)>,
}

impl SignedGroup {
    /// The bodies, in leaf order.
    pub fn bodies(&self) -> &[prost::bytes::Bytes] {
        &self.bodies
    }

    /// How many bodies were signed.
    pub fn len(&self) -> usize {
        self.bodies.len()
    }

    /// Whether the group signed nothing.
    pub fn is_empty(&self) -> bool {
        self.bodies.is_empty()
    }

    /// The full witness of body `i`: its path's siblings and the signature
    /// shared with the group's other witnesses, not copied.
    pub fn witness(&self, i: usize) -> pb::Witness {
        let (batched, leaf_index, merkle_path) = match &self.tree {
            Some((_, paths)) => (true, i as u32, paths.path(i)),
            None => (false, 0, Vec::new()),
        };
        pb::Witness {
            body: self.bodies[i].clone(),
            signature: self.signature.clone(),
            key_id: self.key_id.clone(),
            batched,
            leaf_index,
            merkle_path,
        }
    }

    /// Every body's full witness, in order.
    pub fn witnesses(&self) -> Vec<pb::Witness> {
        (0..self.len()).map(|i| self.witness(i)).collect()
    }

    /// The signature over bodies `first..end` as the lean answer carries
    /// it: from it and those bodies, each one's [`witness`](Self::witness)
    /// is derived byte for byte
    /// ([`FoldedRange`](crate::signed_range::FoldedRange)).
    ///
    /// # Panics
    /// If the run is empty or reaches past the group.
    pub fn range(&self, first: usize, end: usize) -> pb::SignedRange {
        assert!(first < end && end <= self.len(), "a run of the group's bodies");
        match &self.tree {
            Some((tree, _)) => crate::signed_range::range_of(tree, first, end, &self.signature, &self.key_id),
            None => crate::signed_range::lone(&self.signature, &self.key_id),
        }
    }
}

/// `witness` in one allocation of its own: its body, signature and
/// Merkle path copied into one buffer and sliced from it. A witness
/// decoded from an answer shares the answer's buffer (the `Bytes` fields
/// of `pb::Witness`); one kept for as long as its lease (a client's lease
/// state, a writer's rights) is compacted first, so that it holds neither
/// the whole answer nor one allocation per sibling.
pub fn compact(witness: pb::Witness) -> pb::Witness {
    let len = witness.body.len()
        + witness.signature.len()
        + witness.merkle_path.iter().map(|s| s.len()).sum::<usize>();
    let mut buf = Vec::with_capacity(len);
    buf.extend_from_slice(&witness.body);
    buf.extend_from_slice(&witness.signature);
    for sibling in &witness.merkle_path {
        buf.extend_from_slice(sibling);
    }
    let buf = prost::bytes::Bytes::from(buf);
    let mut at = 0;
    let mut next = |n: usize| {
        let part = buf.slice(at..at + n);
        at += n;
        part
    };
    let body = next(witness.body.len());
    let signature = next(witness.signature.len());
    let merkle_path = witness.merkle_path.iter().map(|s| next(s.len())).collect();
    pb::Witness {
        body,
        signature,
        merkle_path,
        ..witness
    }
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
    pb::WitnessBody::decode(&witness.body[..]).map_err(|e| Error::Malformed {
        what: "witness body",
        reason: e.to_string(),
    })
}

/// Reads a witness body without checking its signature: for reporting,
/// for readers that were given no keys (and say so), and for writers
/// checking what the witness they cite allows.
pub fn decode_unverified(w: &pb::Witness) -> Result<pb::WitnessBody, String> {
    pb::WitnessBody::decode(&w.body[..]).map_err(|e| format!("witness body does not decode: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch's witnesses carry the tree's own siblings (sliced from one
    /// shared buffer), and one compacted keeps every byte in a buffer of
    /// its own: it verifies, and it holds nothing of the batch's.
    #[test]
    fn batch_paths_are_the_trees_and_a_compacted_witness_stands_alone() {
        let signer = Signer::generate();
        let keys: KeyRing = [signer.verifying_key()].into_iter().collect();
        let bodies: Vec<Vec<u8>> = (0..5)
            .map(|i| {
                pb::WitnessBody {
                    lease_id: format!("l{i}"),
                    ..body()
                }
                .encode_to_vec()
            })
            .collect();
        let leaves: Vec<merkle::Hash> = bodies.iter().map(|b| merkle::leaf_hash(b)).collect();
        let tree = merkle::Tree::new(&leaves);
        let witnesses = sign_witness_batch(&signer, bodies);
        for (i, w) in witnesses.iter().enumerate() {
            let want: Vec<&[u8]> = tree.path(i).map(|h| &h[..]).collect();
            let got: Vec<&[u8]> = w.merkle_path.iter().map(|s| &s[..]).collect();
            assert_eq!(got, want, "leaf {i}");
            let alone = compact(w.clone());
            assert_eq!(&alone, w);
            verify_witness(&alone, &keys).unwrap();
            // Its siblings no longer point into the batch's shared nodes.
            let shared = w.merkle_path[0].as_ptr();
            assert!(alone.merkle_path.iter().all(|s| s.as_ptr() != shared));
            assert_ne!(alone.signature.as_ptr(), w.signature.as_ptr());
        }
    }

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
            bad.body = crate::tampered(&bad.body, i, |b| *b ^= 0x01);
            assert!(
                verify_witness(&bad, &keys).is_err(),
                "flip at body byte {i} went unnoticed"
            );
        }
        for i in 0..witness.signature.len() {
            let mut bad = witness.clone();
            bad.signature = crate::tampered(&bad.signature, i, |b| *b ^= 0x80);
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
            bad.body = crate::tampered(&bad.body, 0, |b| *b ^= 1);
            assert!(verify_witness(&bad, &keys).is_err());
            let mut bad = w.clone();
            bad.leaf_index ^= 1;
            assert!(verify_witness(&bad, &keys).is_err());
            let mut bad = w.clone();
            bad.merkle_path[0] = crate::tampered(&bad.merkle_path[0], 3, |b| *b ^= 1);
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
