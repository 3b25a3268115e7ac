//! Bounded per-name history of renewals and releases with their metadata.
//!
//! Each shard has its own byte budget (the global budget divided by the
//! number of shards) and a FIFO of what it recorded, so the oldest entries of
//! the shard go first when the budget is full, without a global lock on the
//! release path.

use std::collections::VecDeque;
use std::sync::Arc;

use bagel_proto::Micros;

use super::ids::LeaseId;

/// Where a holder stored its updates, as it told us.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Metadata {
    Data(Box<[u8]>),
    /// The holder declined to say: "could be anywhere".
    Wildcard,
}

impl Metadata {
    fn weight(&self) -> usize {
        match self {
            Metadata::Data(d) => d.len(),
            Metadata::Wildcard => 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HistoryEvent {
    Renewed,
    Released,
}

#[derive(Clone, Debug, PartialEq)]
pub struct HistoryEntry {
    pub lease: LeaseId,
    pub owner: Arc<str>,
    pub event: HistoryEvent,
    pub at: Micros,
    pub watermark: Micros,
    pub metadata: Option<Metadata>,
    seq: u64,
    /// Where the entry went in its shard's order: see [`Position`].
    position: Position,
}

/// Where an entry went in its shard's [`HistoryLog`] order: its absolute
/// position (entries pushed to the order before it, ever) and the order's
/// compaction epoch then. Until the order is compacted, the entry's index
/// is its position less the entries that have left the front, found
/// without a search; a compaction moves entries, so one from an earlier
/// epoch is found by binary search. (The search was 4 % of a session
/// server's CPU: the per-name cap drops a busy name's oldest entry at
/// every release, from a deque of thousands.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Position {
    epoch: u64,
    abs: u64,
}

impl HistoryEntry {
    /// What the entry costs the budget: itself and its slot in the
    /// shard's order (sizes the compiler says, so a field added to either
    /// is counted), plus its variable parts.
    fn weight(&self) -> usize {
        const FIXED: usize = std::mem::size_of::<HistoryEntry>() + std::mem::size_of::<(u64, u32)>();
        FIXED + self.owner.len() + self.metadata.as_ref().map_or(0, Metadata::weight)
    }
}

/// One name's recent history, oldest first.
#[derive(Debug, Default)]
pub struct NameHistory {
    pub entries: VecDeque<HistoryEntry>,
    /// Some entries were dropped (per-name cap or budget).
    pub truncated: bool,
}

/// A shard's history entries in the order they were recorded, oldest
/// first: (entry sequence number, slot of the name holding it).
///
/// It lists every entry that still exists, and at most as many removed
/// ones plus [`HistoryLog::SLACK`]: an entry dropped by the per-name cap or
/// with its forgotten name becomes a tombstone in place, found by binary
/// search (the sequence numbers only grow), and tombstones leave when they
/// reach the front or, all at once, when they outnumber the live entries.
/// (It was a FIFO drained only when the shard went over its byte budget,
/// which the per-name cap prevents: every renewal with metadata of one
/// lease grew it forever, 3.9 M renewals took 100 MiB, and the eventual
/// drain ran under the shard lock. Then a B-tree, whose node insert per
/// release was 2-3 % of a session server's CPU; appending to a ring is a
/// store.) A compaction moves at most twice the live entries plus the
/// slack, and each follows as many removals as it moves, so the cost per
/// removal stays constant.
#[derive(Debug, Default)]
pub struct HistoryLog {
    order: VecDeque<(u64, u32)>,
    /// Tombstones in `order`.
    dead: usize,
    bytes: usize,
    next_seq: u64,
    /// The absolute position of `order`'s front, and the compactions so
    /// far (see [`Position`]).
    front: u64,
    epoch: u64,
}

/// The slot a tombstone in [`HistoryLog`]'s order carries. No name has it:
/// a shard's slots are `u32` and far fewer than this (`max_records`).
const DEAD: u32 = u32::MAX;

/// What a new history entry says.
#[derive(Debug)]
pub struct NewEntry {
    pub lease: LeaseId,
    pub owner: Arc<str>,
    pub event: HistoryEvent,
    pub at: Micros,
    pub watermark: Micros,
    pub metadata: Option<Metadata>,
}

impl HistoryLog {
    /// Appends `entry` to the history of the name in `slot` (`hist`),
    /// keeping at most `per_name` entries for the name. The caller enforces
    /// the shard's byte budget with [`HistoryLog::pop_oldest`] and
    /// [`HistoryLog::evict`].
    pub fn push(
        &mut self,
        slot: usize,
        hist: &mut Option<Box<NameHistory>>,
        entry: NewEntry,
        per_name: usize,
    ) {
        if per_name == 0 {
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let position = Position {
            epoch: self.epoch,
            abs: self.front + self.order.len() as u64,
        };
        let entry = HistoryEntry {
            lease: entry.lease,
            owner: entry.owner,
            event: entry.event,
            at: entry.at,
            watermark: entry.watermark,
            metadata: entry.metadata,
            seq,
            position,
        };
        self.bytes += entry.weight();
        let hist = hist.get_or_insert_with(Default::default);
        hist.entries.push_back(entry);
        debug_assert_ne!(slot as u32, DEAD, "a slot is below u32::MAX");
        self.order.push_back((seq, slot as u32));
        while hist.entries.len() > per_name {
            if let Some(old) = hist.entries.pop_front() {
                self.bytes -= old.weight();
                self.remove(old.seq, old.position);
                hist.truncated = true;
            }
        }
    }

    /// How many tombstones the order keeps before compacting, whatever the
    /// live count: a few entries are not worth a pass.
    pub const SLACK: usize = 64;

    /// Marks entry `seq`, pushed at `position`, removed from the order.
    fn remove(&mut self, seq: u64, position: Position) {
        let Some(i) = self.index_of(seq, position) else {
            return;
        };
        if self.order[i].1 == DEAD {
            return;
        }
        self.order[i].1 = DEAD;
        self.dead += 1;
        self.drop_dead_front();
        if self.dead > Self::SLACK && self.dead > self.order.len() - self.dead {
            self.order.retain(|&(_, slot)| slot != DEAD);
            self.dead = 0;
            // Entries moved: positions taken before are no longer indexes.
            self.epoch += 1;
        }
    }

    /// Where entry `seq`, pushed at `position`, is in the order, if it is.
    fn index_of(&self, seq: u64, position: Position) -> Option<usize> {
        if position.epoch == self.epoch {
            // Gone from the front already: not in the order.
            let i = usize::try_from(position.abs.checked_sub(self.front)?).ok()?;
            if self.order.get(i).is_some_and(|&(s, _)| s == seq) {
                return Some(i);
            }
            debug_assert!(i >= self.order.len(), "entry {seq} not at its position {i}");
        }
        self.order.binary_search_by_key(&seq, |&(s, _)| s).ok()
    }

    /// Takes the order's front out.
    fn pop_front(&mut self) -> Option<(u64, u32)> {
        let front = self.order.pop_front()?;
        self.front += 1;
        Some(front)
    }

    fn drop_dead_front(&mut self) {
        while self.order.front().is_some_and(|&(_, slot)| slot == DEAD) {
            self.pop_front();
            self.dead -= 1;
        }
    }

    pub fn over_budget(&self, budget: usize) -> bool {
        self.bytes > budget
    }

    /// The slot of the name holding the shard's oldest entry, taken out of
    /// the order; the caller then drops it with [`HistoryLog::evict`].
    pub fn pop_oldest(&mut self) -> Option<(u64, usize)> {
        self.drop_dead_front();
        self.pop_front().map(|(seq, slot)| (seq, slot as usize))
    }

    /// Drops entry `seq`, the oldest of the shard, which is the oldest of
    /// its name's history.
    pub fn evict(&mut self, hist: &mut NameHistory, seq: u64) {
        if hist.entries.front().is_some_and(|e| e.seq == seq) {
            let old = hist.entries.pop_front().expect("front exists");
            self.bytes -= old.weight();
            hist.truncated = true;
        }
    }

    /// Accounts for a forgotten name's entries.
    pub fn forget(&mut self, hist: &NameHistory) {
        for e in &hist.entries {
            self.bytes -= e.weight();
            self.remove(e.seq, e.position);
        }
    }

    /// Entries listed in the order (each also in its name's history).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.order.len() - self.dead
    }

    /// What the order holds: the live entries and the tombstones.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.order.len()
    }

    /// The budgeted weight of the entries kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u64) -> NewEntry {
        NewEntry {
            lease: LeaseId::new(Micros::from_micros(n + 1), 0, 0),
            owner: Arc::from("o"),
            event: HistoryEvent::Released,
            at: Micros::from_micros(n),
            watermark: Micros::from_micros(n),
            metadata: None,
        }
    }

    /// Across pushes, per-name drops, forgotten names, budget evictions
    /// and the compactions they cause, every live entry is found where a
    /// search of the order finds it: by its position while its epoch
    /// holds, by the search after.
    #[test]
    fn every_live_entry_is_found_at_its_place_in_the_order() {
        let mut log = HistoryLog::default();
        let mut names: Vec<Option<Box<NameHistory>>> = (0..40).map(|_| None).collect();
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let (mut compacted, start_epoch) = (false, log.epoch);
        for n in 0..20_000u64 {
            let slot = (next() % 40) as usize;
            match next() % 20 {
                0 => {
                    if let Some(hist) = names[slot].take() {
                        log.forget(&hist);
                    }
                }
                1 => {
                    if let Some((seq, slot)) = log.pop_oldest()
                        && let Some(hist) = names[slot].as_deref_mut()
                    {
                        log.evict(hist, seq);
                    }
                }
                _ => log.push(slot, &mut names[slot], entry(n), 3),
            }
            compacted |= log.epoch != start_epoch;
            for (slot, hist) in names.iter().enumerate() {
                for e in hist.iter().flat_map(|h| h.entries.iter()) {
                    let searched = log.order.binary_search_by_key(&e.seq, |&(s, _)| s).ok();
                    let found = log.index_of(e.seq, e.position);
                    assert_eq!(found, searched, "entry {} of slot {slot}", e.seq);
                    let i = found.expect("a live entry is in the order");
                    assert_eq!(log.order[i], (e.seq, slot as u32));
                }
            }
        }
        assert!(compacted, "the run compacted the order at least once");
    }
}
