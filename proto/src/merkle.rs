//! Merkle trees over witness bodies, so a server can sign a whole batch of
//! grants with one ed25519 signature (as Roughtime servers do) and each
//! witness still verifies on its own: body + path + root signature.
//!
//! Leaves are `SHA-256(0x00 || body)`, inner nodes `SHA-256(0x01 || l || r)`;
//! the leaf level is padded to a power of two with `SHA-256(0x02)`. The
//! prefixes keep leaves, nodes and padding from ever being confused.

use sha2::{Digest as _, Sha256};

/// A SHA-256 digest: a leaf, an inner node or the root.
pub type Hash = [u8; 32];

/// The bytes of one [`Hash`].
const HASH_LEN: usize = 32;

/// What the server signs for a batch: a domain-separated root.
pub fn root_message(root: &Hash) -> Vec<u8> {
    let mut m = b"bagel.v1 witness batch root\0".to_vec();
    m.extend_from_slice(root);
    m
}

/// The leaf of one witness: `SHA-256(0x00 || body)`, over the body's
/// exact bytes as they travel (never a re-encoding).
pub fn leaf_hash(body: &[u8]) -> Hash {
    Sha256::new()
        .chain_update([0u8])
        .chain_update(body)
        .finalize()
        .into()
}

fn node(left: &Hash, right: &Hash) -> Hash {
    Sha256::new()
        .chain_update([1u8])
        .chain_update(left)
        .chain_update(right)
        .finalize()
        .into()
}

/// The node above `node` (at `index` on its level) and its `sibling`.
pub fn parent(node: &Hash, sibling: &Hash, index: u32) -> Hash {
    if index & 1 == 0 {
        self::node(node, sibling)
    } else {
        self::node(sibling, node)
    }
}

fn padding() -> Hash {
    Sha256::digest([2u8]).into()
}

/// A tree over a batch's leaves: every level, leaf level (padded to a power
/// of two) first, root last. Kept whole so each leaf's path is read off it
/// when its witness is built, instead of being gathered level by level
/// into a vector per leaf (at 128 leaves that was most of a batch's cost
/// after the signature).
#[derive(Debug)]
pub struct Tree {
    levels: Vec<Vec<Hash>>,
}

impl Tree {
    /// Builds every level over `leaves`, in batch order.
    ///
    /// # Panics
    /// If `leaves` is empty: a batch signs at least one witness.
    pub fn new(leaves: &[Hash]) -> Self {
        assert!(!leaves.is_empty(), "a batch has at least one leaf");
        let width = leaves.len().next_power_of_two();
        let mut level = Vec::with_capacity(width);
        level.extend_from_slice(leaves);
        level.resize(width, padding());
        let mut levels = Vec::with_capacity(width.trailing_zeros() as usize + 1);
        while level.len() > 1 {
            let up = level.chunks(2).map(|pair| node(&pair[0], &pair[1])).collect();
            levels.push(std::mem::replace(&mut level, up));
        }
        levels.push(level);
        Tree { levels }
    }

    /// Levels above the leaves: the length of every leaf's path.
    pub fn depth(&self) -> usize {
        self.levels.len() - 1
    }

    /// The node at `index` on `level` (leaves at 0, padding included).
    pub fn node(&self, level: usize, index: usize) -> &Hash {
        &self.levels[level][index]
    }

    /// The root, which the server signs (as [`root_message`]).
    pub fn root(&self) -> Hash {
        self.levels.last().expect("a tree has a root")[0]
    }

    /// Every node below the root in one buffer, from which each leaf's
    /// path is sliced ([`SharedPaths::path`]): a witness's siblings then
    /// share the group's one allocation instead of taking one each.
    pub fn shared_paths(&self) -> SharedPaths {
        let below = &self.levels[..self.levels.len() - 1];
        let mut nodes = Vec::with_capacity(below.iter().map(|l| l.len() * HASH_LEN).sum());
        let mut starts = Vec::with_capacity(below.len());
        for level in below {
            starts.push(nodes.len());
            for hash in level {
                nodes.extend_from_slice(hash);
            }
        }
        SharedPaths {
            nodes: prost::bytes::Bytes::from(nodes),
            starts,
        }
    }

    /// The siblings from leaf `index` up to the root, leaf level first.
    pub fn path(&self, mut index: usize) -> impl ExactSizeIterator<Item = &Hash> {
        self.levels[..self.levels.len() - 1].iter().map(move |level| {
            let sibling = &level[index ^ 1];
            index /= 2;
            sibling
        })
    }
}

/// A [`Tree`]'s nodes below its root in one shared buffer
/// ([`Tree::shared_paths`]).
#[derive(Debug)]
pub struct SharedPaths {
    nodes: prost::bytes::Bytes,
    /// Where each level starts in `nodes` (bytes), leaf level first.
    starts: Vec<usize>,
}

impl SharedPaths {
    /// The siblings from leaf `index` up to the root, leaf level first,
    /// each a slice of the shared buffer (the same hashes as
    /// [`Tree::path`]).
    pub fn path(&self, mut index: usize) -> Vec<prost::bytes::Bytes> {
        self.starts
            .iter()
            .map(|&start| {
                let at = start + (index ^ 1) * HASH_LEN;
                index /= 2;
                self.nodes.slice(at..at + HASH_LEN)
            })
            .collect()
    }
}

/// The root over `leaves` and, for each leaf, its path of siblings (leaf
/// level first): the shape the tests check paths in.
#[cfg(test)]
pub(crate) fn build(leaves: &[Hash]) -> (Hash, Vec<Vec<Hash>>) {
    let tree = Tree::new(leaves);
    let paths = (0..leaves.len())
        .map(|i| tree.path(i).copied().collect())
        .collect();
    (tree.root(), paths)
}

/// Folds a leaf up its path to the root.
pub fn root_from_path(leaf: Hash, mut index: u32, path: &[impl AsRef<[u8]>]) -> Option<Hash> {
    let mut cur = leaf;
    for sibling in path {
        let sibling: &Hash = sibling.as_ref().try_into().ok()?;
        cur = parent(&cur, sibling, index);
        index >>= 1;
    }
    (index == 0).then_some(cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_leaf_folds_to_the_root_and_no_other_does() {
        for n in 1..=9 {
            let bodies: Vec<Vec<u8>> = (0..n).map(|i| format!("body-{i}").into_bytes()).collect();
            let leaves: Vec<Hash> = bodies.iter().map(|b| leaf_hash(b)).collect();
            let (root, paths) = build(&leaves);
            for (i, path) in paths.iter().enumerate() {
                let path: Vec<Vec<u8>> = path.iter().map(|h| h.to_vec()).collect();
                assert_eq!(
                    root_from_path(leaves[i], i as u32, &path),
                    Some(root),
                    "n={n} i={i}"
                );
                let other = (i + 1) % n;
                if other != i {
                    assert_ne!(root_from_path(leaves[i], other as u32, &path), Some(root));
                }
                assert_ne!(root_from_path(leaf_hash(b"forged"), i as u32, &path), Some(root));
            }
        }
    }
}
