//! A shard's held names in name order, for `List` and the side port's
//! search: a page then costs about its size plus a binary search per
//! shard, never a pass over every record (which at 10^6 names costs tens
//! of milliseconds a page, on the async workers, even for a prefix that
//! matches nothing).
//!
//! The order holds bare 4-byte slot numbers, sorted by the names they
//! point at in the slab (as `SlotIndex` does for hashing): the names live
//! once, inline in the slab. A `BTreeMap` of names would copy every name
//! into its nodes (24 bytes inline, more beyond, plus node slack); this
//! costs about 8 (`cargo bench -p bagel-server --bench held`, 10^6
//! leases: 161.5 resident bytes a lease before the order, 169.9 with it).
//! It is a list of sorted runs of at most [`RUN`] slots: finding a name
//! is a binary search over the runs' first names, then one within a run;
//! an insert or removal moves at most a run's worth of slots (512 bytes).

use super::slab::Slab;

/// Slots per run at most: a run is split in two halves when it reaches
/// this, and merged into a neighbour when it shrinks below a quarter.
const RUN: usize = 128;

#[derive(Debug, Default)]
pub(super) struct NameOrder {
    /// Sorted by name, each run non-empty; every name of a run sorts
    /// before every name of the next.
    runs: Vec<Vec<u32>>,
    len: usize,
}

/// The name of an ordered slot (which is always occupied: a slot leaves
/// the order before its record leaves the slab).
fn name(slab: &Slab, slot: u32) -> &str {
    slab[slot as usize]
        .as_ref()
        .expect("an ordered slot is occupied")
        .name
        .as_str()
}

impl NameOrder {
    /// The run that holds, or would hold, `key`: the last whose first name
    /// is at most `key` (the first run when none is). Counts the names it
    /// compares in `touched`.
    fn run_of(&self, key: &str, slab: &Slab, touched: &mut usize) -> usize {
        let after = self.runs.partition_point(|r| {
            *touched += 1;
            name(slab, r[0]) <= key
        });
        after.saturating_sub(1)
    }

    /// Adds `slot`, whose record (and name) is in `slab` and not yet in
    /// the order.
    pub(super) fn insert(&mut self, slot: u32, slab: &Slab) {
        let key = name(slab, slot);
        self.len += 1;
        if self.runs.is_empty() {
            self.runs.push(vec![slot]);
            return;
        }
        let r = self.run_of(key, slab, &mut 0);
        let run = &mut self.runs[r];
        let pos = run.partition_point(|&s| name(slab, s) < key);
        debug_assert!(run.get(pos) != Some(&slot), "slot {slot} ordered twice");
        run.insert(pos, slot);
        if run.len() >= RUN {
            let tail = run.split_off(RUN / 2);
            self.runs.insert(r + 1, tail);
        }
    }

    /// Removes `slot`, whose record is still in `slab`. Returns whether it
    /// was there.
    pub(super) fn remove(&mut self, slot: u32, slab: &Slab) -> bool {
        if self.runs.is_empty() {
            return false;
        }
        let key = name(slab, slot);
        let r = self.run_of(key, slab, &mut 0);
        let run = &mut self.runs[r];
        let pos = run.partition_point(|&s| name(slab, s) < key);
        if run.get(pos) != Some(&slot) {
            return false;
        }
        run.remove(pos);
        self.len -= 1;
        let left = run.len();
        if left == 0 {
            self.runs.remove(r);
        } else if left < RUN / 4 {
            // Merge into a neighbour while the two fit in half a run, so
            // that runs stay few and reasonably full.
            if r > 0 && self.runs[r - 1].len() + left <= RUN / 2 {
                let run = self.runs.remove(r);
                self.runs[r - 1].extend(run);
            } else if r + 1 < self.runs.len() && left + self.runs[r + 1].len() <= RUN / 2 {
                let next = self.runs.remove(r + 1);
                self.runs[r].extend(next);
            } else if self.runs[r].capacity() > RUN / 2 {
                self.runs[r].shrink_to(RUN / 4);
            }
        }
        true
    }

    /// Calls `visit` with each ordered slot whose name sorts after `from`
    /// (or at it, unless `exclusive`), in name order, until `visit` returns
    /// false. Returns whether it was stopped so (false: the order ended).
    /// Counts the names compared to find the start in `touched`.
    pub(super) fn walk(
        &self,
        from: &str,
        exclusive: bool,
        slab: &Slab,
        touched: &mut usize,
        mut visit: impl FnMut(u32) -> bool,
    ) -> bool {
        if self.runs.is_empty() {
            return false;
        }
        let r = self.run_of(from, slab, touched);
        let pos = self.runs[r].partition_point(|&s| {
            *touched += 1;
            let n = name(slab, s);
            if exclusive { n <= from } else { n < from }
        });
        let mut slots = self.runs[r][pos..]
            .iter()
            .chain(self.runs[r + 1..].iter().flatten());
        !slots.all(|&s| visit(s))
    }

    /// Every ordered slot, in name order (for tests' invariant checks).
    #[cfg(test)]
    pub(super) fn slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.runs.iter().flatten().copied()
    }

    #[cfg(test)]
    pub(super) fn check(&self, slab: &Slab) {
        assert!(self.runs.iter().all(|r| !r.is_empty() && r.len() < RUN));
        let names: Vec<&str> = self.slots().map(|s| name(slab, s)).collect();
        assert!(names.windows(2).all(|w| w[0] < w[1]), "names out of order");
        assert_eq!(names.len(), self.len);
    }
}
