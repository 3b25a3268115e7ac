//! The lean answer's witnesses: one signature for a run of bodies that
//! travel together, and the full [`pb::Witness`] of each derived from it.
//!
//! A Batch or Session answer in the full form repeats, in every grant, the
//! group's signature and key id and carries each grant's own Merkle path
//! (a group of 128 is seven siblings a grant, most of them shared with the
//! grant beside it). In the lean form the answer carries the bodies of its
//! grants, which are consecutive leaves of the signed tree, and one
//! [`pb::SignedRange`]: the signature and the few nodes outside the run
//! that fold it to the root (at most two a level). The receiver folds the
//! run once, checks the signature once, and reads each body's path off the
//! folded tree: the witness it stores is byte for byte the one the full
//! form would have carried, so nothing downstream (bags, `bagel audit`,
//! other languages) sees a difference.

use crate::keys::in_domain;
use crate::merkle::{self, Hash};
use crate::{Error, pb};

/// The bytes of one node.
const HASH_LEN: usize = 32;

/// Deeper than any tree a server signs (at most 512 leaves, depth 9):
/// refused, so that a peer cannot make the fold allocate at will.
pub const MAX_DEPTH: u32 = 16;

/// The [`pb::SignedRange`] of leaves `first..end` of `tree`, signed with
/// `signature` by `key_id`.
///
/// # Panics
/// If the run is empty or reaches past the tree's leaves.
pub fn range_of(
    tree: &merkle::Tree,
    first: usize,
    end: usize,
    signature: &prost::bytes::Bytes,
    key_id: &str,
) -> pb::SignedRange {
    let depth = tree.depth();
    assert!(first < end && end <= 1 << depth, "a run of the tree's leaves");
    let mut nodes = Vec::with_capacity(2 * depth * HASH_LEN);
    let (mut a, mut b) = (first, end);
    for level in 0..depth {
        if a & 1 == 1 {
            nodes.extend_from_slice(tree.node(level, a - 1));
        }
        if b & 1 == 1 {
            nodes.extend_from_slice(tree.node(level, b));
        }
        a /= 2;
        b = b.div_ceil(2);
    }
    pb::SignedRange {
        signature: signature.clone(),
        key_id: key_id.to_owned(),
        batched: true,
        depth: depth as u32,
        first_leaf: first as u32,
        nodes: nodes.into(),
    }
}

/// The [`pb::SignedRange`] of a lone witness, signed over its body.
pub fn lone(signature: &prost::bytes::Bytes, key_id: &str) -> pb::SignedRange {
    pb::SignedRange {
        signature: signature.clone(),
        key_id: key_id.to_owned(),
        ..Default::default()
    }
}

/// The bodies an answer's [`pb::SignedRange`] signs: those of its
/// `lean_grant` and `lean_renewed` results, in order (shared, not copied).
pub fn lean_bodies(answer: &pb::BatchResponse) -> Vec<prost::bytes::Bytes> {
    use pb::batch_result::Result as R;
    answer
        .results
        .iter()
        .filter_map(|r| match &r.result {
            Some(R::LeanGrant(g)) => Some(g.body.clone()),
            Some(R::LeanRenewed(r)) => Some(r.body.clone()),
            _ => None,
        })
        .collect()
}

/// A run of bodies folded up to its signed root: what the signature is
/// over, and every node of the run's part of the tree, from which each
/// body's witness is read.
#[derive(Debug)]
pub struct FoldedRange<'a> {
    range: &'a pb::SignedRange,
    bodies: Vec<prost::bytes::Bytes>,
    /// Per level below the root, leaf level first: the index of the first
    /// node held, and the nodes (the run's, widened by the given nodes at
    /// its ends).
    levels: Vec<(usize, Vec<Hash>)>,
    message: Vec<u8>,
}

fn malformed(reason: impl Into<String>) -> Error {
    Error::Malformed {
        what: "signed range",
        reason: reason.into(),
    }
}

impl<'a> FoldedRange<'a> {
    /// Folds `bodies`, leaves `range.first_leaf..` in order, up to the root
    /// with `range.nodes`, refusing a range whose shape does not fit them
    /// (nodes too few, too many or of the wrong length, a run past the
    /// tree's leaves, a tree deeper than [`MAX_DEPTH`]). The signature is
    /// not checked here: [`signed_message`](Self::signed_message) is what
    /// it must be over.
    pub fn fold(range: &'a pb::SignedRange, bodies: Vec<prost::bytes::Bytes>) -> Result<Self, Error> {
        if bodies.is_empty() {
            return Err(malformed("no bodies to fold"));
        }
        if !range.batched {
            if bodies.len() != 1 || range.depth != 0 || range.first_leaf != 0 || !range.nodes.is_empty() {
                return Err(malformed("an unbatched range holds one body and nothing else"));
            }
            let message = in_domain(crate::witness::WITNESS_DOMAIN, &bodies[0]);
            return Ok(FoldedRange {
                range,
                bodies,
                levels: Vec::new(),
                message,
            });
        }
        if range.depth == 0 || range.depth > MAX_DEPTH {
            return Err(malformed(format!(
                "depth {} is not in 1..={MAX_DEPTH}",
                range.depth
            )));
        }
        let depth = range.depth as usize;
        let first = range.first_leaf as usize;
        if first + bodies.len() > 1 << depth {
            return Err(malformed(format!(
                "leaves {first}..{} reach past a tree of depth {depth}",
                first + bodies.len()
            )));
        }
        if !range.nodes.len().is_multiple_of(HASH_LEN) {
            return Err(malformed("nodes are not whole 32-byte hashes"));
        }
        let mut given = range
            .nodes
            .chunks_exact(HASH_LEN)
            .map(|n| <Hash>::try_from(n).expect("32 bytes"));
        let mut levels = Vec::with_capacity(depth);
        let mut row: Vec<Hash> = bodies.iter().map(|b| merkle::leaf_hash(b)).collect();
        let (mut a, mut b) = (first, first + bodies.len());
        for _ in 0..depth {
            let missing = || malformed("fewer nodes than the run needs");
            // The run widened to whole pairs by the given nodes at its ends.
            let start = a & !1;
            if a & 1 == 1 {
                let left = given.next().ok_or_else(missing)?;
                row = std::iter::once(left).chain(row).collect();
            }
            if b & 1 == 1 {
                row.push(given.next().ok_or_else(missing)?);
            }
            let up = row
                .chunks_exact(2)
                .map(|pair| merkle::parent(&pair[0], &pair[1], 0))
                .collect();
            levels.push((start, std::mem::replace(&mut row, up)));
            a /= 2;
            b = b.div_ceil(2);
        }
        if given.next().is_some() {
            return Err(malformed("more nodes than the run needs"));
        }
        debug_assert_eq!(row.len(), 1);
        Ok(FoldedRange {
            range,
            bodies,
            levels,
            message: merkle::root_message(&row[0]),
        })
    }

    /// What the range's signature must be over: the domain-prefixed root
    /// (or body, unbatched).
    pub fn signed_message(&self) -> &[u8] {
        &self.message
    }

    /// Checks the signature against `keys`.
    pub fn verify(&self, keys: &crate::KeyRing) -> Result<(), Error> {
        keys.verify(&self.range.key_id, &self.message, &self.range.signature)
    }

    /// The id of the key that signed, and the signature.
    pub fn signer(&self) -> (&str, &prost::bytes::Bytes) {
        (&self.range.key_id, &self.range.signature)
    }

    /// How many bodies the run holds.
    pub fn len(&self) -> usize {
        self.bodies.len()
    }

    /// Whether the run holds no body (never, once folded).
    pub fn is_empty(&self) -> bool {
        self.bodies.is_empty()
    }

    /// The full witness of the run's `k`-th body, in one allocation of its
    /// own (as [`crate::witness::compact`] leaves one): exactly the witness
    /// the full form of the answer would have carried.
    ///
    /// # Panics
    /// If `k` is not below [`len`](Self::len).
    pub fn witness(&self, k: usize) -> pb::Witness {
        let body = &self.bodies[k];
        let signature = &self.range.signature;
        let mut buf = Vec::with_capacity(body.len() + signature.len() + self.levels.len() * HASH_LEN);
        buf.extend_from_slice(body);
        buf.extend_from_slice(signature);
        let leaf = self.range.first_leaf as usize + k;
        let mut index = leaf;
        for (start, row) in &self.levels {
            buf.extend_from_slice(&row[(index ^ 1) - start]);
            index /= 2;
        }
        let buf = prost::bytes::Bytes::from(buf);
        let path_at = body.len() + signature.len();
        pb::Witness {
            body: buf.slice(..body.len()),
            signature: buf.slice(body.len()..path_at),
            key_id: self.range.key_id.clone(),
            batched: self.range.batched,
            leaf_index: if self.range.batched { leaf as u32 } else { 0 },
            merkle_path: (0..self.levels.len())
                .map(|l| buf.slice(path_at + l * HASH_LEN..path_at + (l + 1) * HASH_LEN))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use prost::Message as _;

    use super::*;
    use crate::{KeyRing, Signer, verify_witness};

    fn bodies(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                pb::WitnessBody {
                    lease_id: format!("lease-{i}"),
                    ..Default::default()
                }
                .encode_to_vec()
            })
            .collect()
    }

    /// The group as a server signs it, cut into consecutive runs.
    fn cut(n: usize, cuts: &[usize]) -> Vec<(usize, usize)> {
        let mut points: Vec<usize> = cuts.iter().map(|c| c % n).filter(|&c| c > 0).collect();
        points.extend([0, n]);
        points.sort_unstable();
        points.dedup();
        points.windows(2).map(|w| (w[0], w[1])).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// However a signed group is cut into runs, each run's range folds
        /// to the signed root and derives, for every body, exactly the
        /// witness the full form carries, which verifies on its own.
        #[test]
        fn every_run_derives_the_full_forms_witnesses(
            n in 1usize..70,
            cuts in proptest::collection::vec(any::<usize>(), 0..6),
        ) {
            let signer = Signer::new(ed25519_dalek::SigningKey::from_bytes(&[3; 32]));
            let keys: KeyRing = [signer.verifying_key()].into_iter().collect();
            let group = crate::witness::sign_witness_group(&signer, bodies(n));
            let full = group.witnesses();
            for (first, end) in cut(n, &cuts) {
                let range = group.range(first, end);
                let folded = FoldedRange::fold(&range, group.bodies()[first..end].to_vec()).unwrap();
                folded.verify(&keys).unwrap();
                for k in 0..end - first {
                    let w = folded.witness(k);
                    prop_assert_eq!(&w, &full[first + k]);
                    prop_assert_eq!(w.encode_to_vec(), full[first + k].encode_to_vec());
                    verify_witness(&w, &keys).unwrap();
                }
            }
        }

        /// A range or a body altered in transit never verifies: any byte of
        /// a body or node flipped, a node dropped or added, the run moved.
        #[test]
        fn an_altered_run_is_refused(
            n in 2usize..40,
            first in any::<usize>(),
            len in 1usize..40,
            how in 0u8..6,
            at in any::<usize>(),
        ) {
            let signer = Signer::new(ed25519_dalek::SigningKey::from_bytes(&[4; 32]));
            let keys: KeyRing = [signer.verifying_key()].into_iter().collect();
            let group = crate::witness::sign_witness_group(&signer, bodies(n));
            let first = first % n;
            let end = (first + len).min(n);
            let mut range = group.range(first, end);
            let mut run = group.bodies()[first..end].to_vec();
            match how {
                0 => { let k = at % run.len(); let i = at % run[k].len().max(1); if run[k].is_empty() { run[k] = vec![1].into() } else { run[k] = crate::tampered(&run[k], i, |b| *b ^= 1) } }
                1 if !range.nodes.is_empty() => { let i = at % range.nodes.len(); range.nodes = crate::tampered(&range.nodes, i, |b| *b ^= 1) }
                2 if !range.nodes.is_empty() => { range.nodes = range.nodes.slice(..range.nodes.len() - HASH_LEN) }
                3 => { let mut v = range.nodes.to_vec(); v.extend_from_slice(&[7; HASH_LEN]); range.nodes = v.into() }
                4 => range.first_leaf ^= 1 + (at as u32 % 4),
                5 => { let last = run.len() - 1; run.swap(0, last); if last == 0 { range.depth += 1 } }
                _ => return Ok(()),
            }
            let refused = FoldedRange::fold(&range, run).and_then(|f| f.verify(&keys));
            prop_assert!(refused.is_err());
        }
    }

    /// A group of one is signed over its body, and its range says so.
    #[test]
    fn a_lone_witness_travels_unbatched() {
        let signer = Signer::generate();
        let keys: KeyRing = [signer.verifying_key()].into_iter().collect();
        let group = crate::witness::sign_witness_group(&signer, bodies(1));
        let range = group.range(0, 1);
        assert!(!range.batched);
        let folded = FoldedRange::fold(&range, group.bodies().to_vec()).unwrap();
        folded.verify(&keys).unwrap();
        assert_eq!(folded.witness(0), group.witnesses()[0]);
        let mut two = group.bodies().to_vec();
        two.push(two[0].clone());
        assert!(FoldedRange::fold(&range, two).is_err());
    }

    #[test]
    fn a_tree_deeper_than_any_server_signs_is_refused_before_folding() {
        let range = pb::SignedRange {
            batched: true,
            depth: MAX_DEPTH + 1,
            ..Default::default()
        };
        let err = FoldedRange::fold(&range, vec![b"x".to_vec().into()]).unwrap_err();
        assert!(err.to_string().contains("depth 17"), "{err}");
    }
}
