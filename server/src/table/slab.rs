//! A shard's records by slot, in fixed-size chunks.
//!
//! A `Vec` of records grows by reallocating: every growth copies the whole
//! slab into a new block and frees the old one, and the allocator keeps
//! the freed pages resident for reuse. Chunks never move: growing adds one
//! chunk, and a slot's address is a division by a constant. Chunks are
//! small (4 KiB) on purpose: the allocator serves them from pages of
//! like-sized blocks, packed, whereas a block of tens of KiB gets a page
//! range of its own, touched when it is handed out, so with 256 shards the
//! slack of larger chunks cost more than the records (`cargo bench -p
//! bagel-server --bench held`, 10^5 leases, table and names: a `Vec` slab
//! 273 bytes a lease; chunks of 1,024 records 524, of 256 230, of 16 210,
//! of 4 KiB 168, with the smaller record of the same change).

use std::ops::{Index, IndexMut};

use super::shard::Entry;

/// Slots per chunk: as many records as fit in 4 KiB, a size allocators
/// serve exactly (a chunk of 16 records of 144 bytes, 2,304 bytes, took a
/// 2,560-byte block). Finding a slot divides by a constant: a multiply.
const CHUNK: usize = 4096 / size_of::<Option<Entry>>();

#[derive(Debug, Default)]
pub(super) struct Slab {
    chunks: Vec<Vec<Option<Entry>>>,
    len: usize,
}

impl Slab {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn get(&self, slot: usize) -> Option<&Option<Entry>> {
        self.chunks.get(slot / CHUNK)?.get(slot % CHUNK)
    }

    pub(super) fn get_mut(&mut self, slot: usize) -> Option<&mut Option<Entry>> {
        self.chunks.get_mut(slot / CHUNK)?.get_mut(slot % CHUNK)
    }

    /// Appends an empty slot and returns it.
    pub(super) fn push_empty(&mut self) -> usize {
        if self.len.is_multiple_of(CHUNK) {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        self.chunks.last_mut().expect("a chunk with room").push(None);
        self.len += 1;
        self.len - 1
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Option<Entry>> {
        self.chunks.iter().flatten()
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = &mut Option<Entry>> {
        self.chunks.iter_mut().flatten()
    }
}

impl Index<usize> for Slab {
    type Output = Option<Entry>;

    fn index(&self, slot: usize) -> &Option<Entry> {
        self.get(slot).expect("slot within the slab")
    }
}

impl IndexMut<usize> for Slab {
    fn index_mut(&mut self, slot: usize) -> &mut Option<Entry> {
        self.get_mut(slot).expect("slot within the slab")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_dense_across_chunks_and_stay_where_they_were_put() {
        let mut slab = Slab::default();
        for expected in 0..3 * CHUNK + 5 {
            assert_eq!(slab.push_empty(), expected);
        }
        assert_eq!(slab.len(), 3 * CHUNK + 5);
        assert_eq!(slab.iter().count(), slab.len());
        assert!(slab.get(3 * CHUNK + 4).is_some());
        assert!(slab.get(3 * CHUNK + 5).is_none());
        // A chunk, once made, is never reallocated: the first record's
        // address is the same after the slab grew.
        let first: *const Option<Entry> = &slab[0];
        for _ in 0..4 * CHUNK {
            slab.push_empty();
        }
        assert!(std::ptr::eq(first, &slab[0]));
    }

    #[test]
    fn a_record_with_its_name_stays_within_144_bytes() {
        // What a held one-name lease costs in the slab, names up to 24
        // bytes included; the rest is the name index (~10 bytes) and
        // allocator slack. A field added here is paid a million times.
        assert!(
            size_of::<Option<Entry>>() <= 144,
            "{}",
            size_of::<Option<Entry>>()
        );
    }
}
