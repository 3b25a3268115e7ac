//! Checking the witnesses of one signed batch without folding each path
//! all the way up.
//!
//! A client receives the grants of a server's signing group together: one
//! signature over a Merkle root, and per grant its body and the path of
//! siblings to that root. Checking each witness alone costs its leaf hash
//! plus one node hash per level (at a group of 32, six of every ten hash
//! blocks a grant cost were nodes that the grant next to it had already
//! folded), and the signature once.
//!
//! [`VerifiedBatch`] remembers the tree positions (level, index) whose
//! nodes a checked witness proved, for the last signature it verified. A
//! witness of the same batch is folded only until it reaches a node
//! already proven at the same position; the siblings it states above that
//! point must then equal the proven nodes at their positions too, so the
//! witness would fold to the signed root exactly as a full check does.
//! Proven nodes of one root agree at every position (two values at one
//! position would be a SHA-256 collision), so what is accepted here is
//! exactly what [`crate::verify_witness`] accepts; a property test holds
//! the two to the same verdict on tampered witnesses.

use std::collections::HashMap;

use crate::merkle::{self, Hash};
use crate::{Error, KeyRing, pb, witness};

/// Deeper paths than a batch of 2^16 witnesses (a server signs at most
/// 512 at once) are checked in full and not remembered, so a peer cannot
/// make the map grow with long paths.
const MAX_DEPTH: usize = 16;

/// A node's place in a tree: (level, index on that level), leaves at 0.
type Position = (usize, u32);

/// The batch whose signature was checked last, and the nodes its
/// witnesses proved.
#[derive(Debug, Default)]
pub struct VerifiedBatch {
    last: Option<Batch>,
}

#[derive(Debug)]
struct Batch {
    signature: prost::bytes::Bytes,
    key_id: String,
    /// The signed message: the domain-prefixed root, or the
    /// domain-prefixed body of an unbatched witness.
    message: Vec<u8>,
    depth: usize,
    /// (level, index) → node, leaf level 0; the root is (depth, 0).
    proven: HashMap<Position, Hash>,
}

impl VerifiedBatch {
    /// Checks `witness`'s signature against `keys`: at once when it is of
    /// the batch checked last, else by verifying its signature (which then
    /// becomes the batch remembered).
    pub fn check(&mut self, witness: &pb::Witness, keys: &KeyRing) -> Result<(), Error> {
        if witness.batched && self.proves(witness) {
            return Ok(());
        }
        let (message, found) = if witness.batched {
            let (root, found) = fold(witness).ok_or_else(|| Error::Malformed {
                what: "witness merkle path",
                reason: "sibling of the wrong length or index beyond the path".into(),
            })?;
            (merkle::root_message(&root), found)
        } else {
            (witness::witness_signed_message(witness)?, Vec::new())
        };
        let same = self.last.as_ref().is_some_and(|b| {
            b.signature == witness.signature && b.key_id == witness.key_id && b.message == message
        });
        if !same {
            keys.verify(&witness.key_id, &message, &witness.signature)?;
            self.last = Some(Batch {
                signature: witness.signature.clone(),
                key_id: witness.key_id.clone(),
                message,
                depth: witness.merkle_path.len(),
                proven: HashMap::new(),
            });
        }
        let batch = self.last.as_mut().expect("set above");
        if witness.batched && batch.depth == witness.merkle_path.len() && batch.depth <= MAX_DEPTH {
            batch.proven.extend(found);
        }
        Ok(())
    }

    /// Checks a lean answer's signature over its folded range
    /// ([`crate::signed_range::FoldedRange`]): at once when it is the
    /// signature checked last, over the same message (the answers a
    /// session's server ran together share one), else by verifying it,
    /// which then becomes the batch remembered.
    pub fn check_range(
        &mut self,
        range: &crate::signed_range::FoldedRange<'_>,
        keys: &KeyRing,
    ) -> Result<(), Error> {
        let (key_id, signature) = range.signer();
        let message = range.signed_message();
        let same = self
            .last
            .as_ref()
            .is_some_and(|b| b.signature == *signature && b.key_id == key_id && b.message == message);
        if same {
            return Ok(());
        }
        keys.verify(key_id, message, signature)?;
        self.last = Some(Batch {
            signature: signature.clone(),
            key_id: key_id.to_owned(),
            message: message.to_vec(),
            // No node is proven: a full-form witness of this batch, were one
            // to come, is checked in full.
            depth: usize::MAX,
            proven: HashMap::new(),
        });
        Ok(())
    }

    /// Whether `witness` folds, through nodes already proven, to the
    /// remembered batch's root.
    fn proves(&self, witness: &pb::Witness) -> bool {
        let Some(batch) = &self.last else { return false };
        let depth = witness.merkle_path.len();
        if batch.signature != witness.signature
            || batch.key_id != witness.key_id
            || depth != batch.depth
            || depth > MAX_DEPTH
            || u64::from(witness.leaf_index) >> depth != 0
        {
            return false;
        }
        let mut node = merkle::leaf_hash(&witness.body);
        let mut index = witness.leaf_index;
        for level in 0..=depth {
            if batch.proven.get(&(level, index)) == Some(&node) {
                // Proven here: what the witness states above must be the
                // proven siblings, position by position.
                return witness.merkle_path[level..]
                    .iter()
                    .enumerate()
                    .all(|(up, sibling)| {
                        let at = (level + up, (index >> up) ^ 1);
                        batch
                            .proven
                            .get(&at)
                            .is_some_and(|p| p.as_slice() == &sibling[..])
                    });
            }
            let Some(sibling) = witness.merkle_path.get(level) else {
                return false;
            };
            let Ok(sibling) = <&Hash>::try_from(&sibling[..]) else {
                return false;
            };
            node = merkle::parent(&node, sibling, index);
            index >>= 1;
        }
        false
    }
}

/// Folds `witness`'s leaf up its path: the root, and each position's node
/// and sibling on the way (`None` when the path is malformed, as
/// [`merkle::root_from_path`] refuses it).
fn fold(witness: &pb::Witness) -> Option<(Hash, Vec<(Position, Hash)>)> {
    let depth = witness.merkle_path.len();
    let mut found = Vec::with_capacity(if depth <= MAX_DEPTH { 2 * depth + 1 } else { 0 });
    let mut node = merkle::leaf_hash(&witness.body);
    let mut index = witness.leaf_index;
    for (level, sibling) in witness.merkle_path.iter().enumerate() {
        let sibling: &Hash = &sibling[..].try_into().ok()?;
        if depth <= MAX_DEPTH {
            found.push(((level, index), node));
            found.push(((level, index ^ 1), *sibling));
        }
        node = merkle::parent(&node, sibling, index);
        index >>= 1;
    }
    if index != 0 {
        return None;
    }
    if depth <= MAX_DEPTH {
        found.push(((depth, 0), node));
    }
    Some((node, found))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use prost::Message as _;

    use super::*;
    use crate::{Signer, sign_witness_batch, verify_witness};

    /// Ways a witness in transit may differ from the one signed.
    #[derive(Clone, Copy, Debug)]
    enum Tamper {
        None,
        Body(usize),
        Index(u32),
        Sibling(usize, usize),
        DropSibling,
        ExtraSibling,
        Signature(usize),
        KeyId,
        Unbatched,
    }

    fn tamper() -> impl Strategy<Value = Tamper> {
        prop_oneof![
            4 => Just(Tamper::None),
            1 => any::<usize>().prop_map(Tamper::Body),
            1 => (1u32..64).prop_map(Tamper::Index),
            1 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Tamper::Sibling(a, b)),
            1 => Just(Tamper::DropSibling),
            1 => Just(Tamper::ExtraSibling),
            1 => any::<usize>().prop_map(Tamper::Signature),
            1 => Just(Tamper::KeyId),
            1 => Just(Tamper::Unbatched),
        ]
    }

    fn apply(mut w: pb::Witness, t: Tamper) -> pb::Witness {
        match t {
            Tamper::None => {}
            Tamper::Body(i) if !w.body.is_empty() => {
                let i = i % w.body.len();
                w.body = crate::tampered(&w.body, i, |b| *b ^= 1);
            }
            Tamper::Index(d) => w.leaf_index ^= d,
            Tamper::Sibling(i, j) if !w.merkle_path.is_empty() => {
                let i = i % w.merkle_path.len();
                let j = j % 32;
                w.merkle_path[i] = crate::tampered(&w.merkle_path[i], j, |b| *b ^= 0x80);
            }
            Tamper::DropSibling => {
                w.merkle_path.pop();
            }
            Tamper::ExtraSibling => w.merkle_path.push(vec![7; 32].into()),
            Tamper::Signature(i) => {
                let i = i % w.signature.len();
                w.signature = crate::tampered(&w.signature, i, |b| *b ^= 1);
            }
            Tamper::KeyId => w.key_id.push('x'),
            Tamper::Unbatched => w.batched = !w.batched,
            _ => {}
        }
        w
    }

    /// After the first witness of a batch, every other one is proven by
    /// the nodes remembered (no signature check, at most part of a fold),
    /// in any order.
    #[test]
    fn a_checked_batchs_other_witnesses_are_proven_by_remembered_nodes() {
        let signer = Signer::new(ed25519_dalek::SigningKey::from_bytes(&[1; 32]));
        let keys: KeyRing = [signer.verifying_key()].into_iter().collect();
        let bodies = (0..37).map(|i| format!("body-{i}").into_bytes()).collect();
        let mut witnesses = sign_witness_batch(&signer, bodies);
        witnesses.reverse();
        let mut checked = VerifiedBatch::default();
        assert!(!checked.proves(&witnesses[0]));
        checked.check(&witnesses[0], &keys).unwrap();
        for w in &witnesses[1..] {
            assert!(checked.proves(w), "witness {} not proven", w.leaf_index);
            checked.check(w, &keys).unwrap();
        }
        let mut forged = witnesses[5].clone();
        let last = forged.merkle_path.last_mut().unwrap();
        *last = crate::tampered(last, 0, |b| *b ^= 1);
        assert!(!checked.proves(&forged));
        assert!(checked.check(&forged, &keys).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever order the witnesses of two batches arrive in, and
        /// however they were altered, remembering proven nodes accepts
        /// exactly what checking each witness alone accepts.
        #[test]
        fn remembered_nodes_accept_exactly_what_a_full_check_accepts(
            sizes in (1usize..40, 1usize..12),
            same_signer in any::<bool>(),
            order in proptest::collection::vec((any::<bool>(), any::<usize>(), tamper()), 1..120),
        ) {
            let a = Signer::new(ed25519_dalek::SigningKey::from_bytes(&[1; 32]));
            let b = Signer::new(ed25519_dalek::SigningKey::from_bytes(&[2; 32]));
            let keys: KeyRing = [a.verifying_key(), b.verifying_key()].into_iter().collect();
            // Real bodies: `verify_witness` also decodes the body.
            let bodies = |n: usize, tag: &str| -> Vec<Vec<u8>> {
                (0..n)
                    .map(|i| pb::WitnessBody { lease_id: format!("{tag}-{i}"), ..Default::default() }.encode_to_vec())
                    .collect()
            };
            let first = sign_witness_batch(&a, bodies(sizes.0, "a"));
            let second = sign_witness_batch(if same_signer { &a } else { &b }, bodies(sizes.1, "b"));
            let mut checked = VerifiedBatch::default();
            for (from_first, i, t) in order {
                let batch = if from_first { &first } else { &second };
                let w = apply(batch[i % batch.len()].clone(), t);
                prop_assert_eq!(
                    checked.check(&w, &keys).is_ok(),
                    verify_witness(&w, &keys).is_ok(),
                    "{:?}", t
                );
            }
        }
    }
}
