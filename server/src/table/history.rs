//! Bounded per-name history of renewals and releases with their metadata.
//!
//! Each shard has its own byte budget (the global budget divided by the
//! number of shards) and a log of what it recorded, oldest first, so the
//! oldest entries of the shard go first when the budget is full, without a
//! global lock on the release path.
//!
//! The entries live in the shard's log; a name keeps only where its own
//! entries are. So the budget drops the log's oldest entry without
//! touching its name: a name whose entry is gone finds out when it is
//! read. (Each name kept its entries itself, and dropping the shard's
//! oldest one meant loading that name's record, its history and the
//! entry, three cache misses of a cold name at every release once the
//! budget was full: 12 % of a session server's CPU.)

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

/// One renewal or release of a name.
#[derive(Clone, Debug, PartialEq)]
pub struct HistoryEntry {
    pub lease: LeaseId,
    pub owner: Arc<str>,
    pub event: HistoryEvent,
    pub at: Micros,
    pub watermark: Micros,
    pub metadata: Option<Metadata>,
}

impl HistoryEntry {
    /// What the entry costs the budget: its slot in the shard's log and
    /// its place in its name's list (sizes the compiler says, so a field
    /// added to either is counted), plus its variable parts.
    fn weight(&self) -> usize {
        const FIXED: usize = std::mem::size_of::<Slot>() + std::mem::size_of::<Place>();
        FIXED + self.owner.len() + self.metadata.as_ref().map_or(0, Metadata::weight)
    }
}

/// Where an entry went in its shard's [`HistoryLog`]: its sequence number
/// (which only grows along the log), its absolute position (entries
/// pushed to the log before it, ever) and the log's compaction epoch then.
/// Until the log is compacted, the entry's index is its position less the
/// entries that have left the front, found without a search; a compaction
/// moves entries, so one from an earlier epoch is found by binary search
/// on the sequence numbers. (The search was 4 % of a session server's
/// CPU: the per-name cap drops a busy name's oldest entry at every
/// release, from a log of thousands.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Place {
    seq: u64,
    epoch: u64,
    abs: u64,
}

/// One name's recent history: where its entries are in the shard's log,
/// oldest first. Some may have left the log since (the byte budget drops
/// the shard's oldest entries without telling their names); reads skip
/// them and say the history was truncated.
#[derive(Debug, Default)]
pub struct NameHistory {
    places: VecDeque<Place>,
    /// Some entries were dropped by the per-name cap.
    capped: bool,
}

/// An entry of a shard's log, or the tombstone of one dropped from the
/// middle (by the per-name cap or with its forgotten name).
#[derive(Debug)]
struct Slot {
    seq: u64,
    entry: Option<HistoryEntry>,
}

/// A shard's history entries in the order they were recorded, oldest
/// first.
///
/// It holds every entry that still exists, and at most as many removed
/// ones plus [`HistoryLog::SLACK`]: an entry dropped by the per-name cap or
/// with its forgotten name becomes a tombstone in place, and tombstones
/// leave when they reach the front or, all at once, when they outnumber
/// the live entries. (Without that, every renewal with metadata of one
/// lease grew the log forever: the per-name cap keeps the shard under its
/// byte budget, so nothing drains the front. A B-tree instead cost a node
/// insert per release, 2-3 % of a session server's CPU; appending to a
/// ring is a store.) A compaction moves at most twice the live entries
/// plus the slack, and each follows as many removals as it moves, so the
/// cost per removal stays constant.
#[derive(Debug, Default)]
pub struct HistoryLog {
    order: VecDeque<Slot>,
    /// Tombstones in `order`.
    dead: usize,
    bytes: usize,
    next_seq: u64,
    /// The absolute position of `order`'s front, and the compactions so
    /// far (see [`Place`]).
    front: u64,
    epoch: u64,
}

impl HistoryLog {
    /// Appends `entry` to the log and to the history of its name (`hist`),
    /// keeping at most `per_name` entries for the name. The caller keeps
    /// the shard within its byte budget with [`HistoryLog::fit`].
    pub fn push(&mut self, hist: &mut Option<Box<NameHistory>>, entry: HistoryEntry, per_name: usize) {
        if per_name == 0 {
            return;
        }
        let place = Place {
            seq: self.next_seq,
            epoch: self.epoch,
            abs: self.front + self.order.len() as u64,
        };
        self.next_seq += 1;
        self.bytes += entry.weight();
        self.order.push_back(Slot {
            seq: place.seq,
            entry: Some(entry),
        });
        let hist = hist.get_or_insert_with(Default::default);
        hist.places.push_back(place);
        while hist.places.len() > per_name {
            if let Some(old) = hist.places.pop_front() {
                self.remove(old);
                hist.capped = true;
            }
        }
    }

    /// How many tombstones the log keeps before compacting, whatever the
    /// live count: a few entries are not worth a pass.
    pub const SLACK: usize = 64;

    /// Drops the entry at `place`, if it is still in the log.
    fn remove(&mut self, place: Place) {
        let Some(i) = self.index_of(place) else {
            return;
        };
        let Some(old) = self.order[i].entry.take() else {
            return;
        };
        self.bytes -= old.weight();
        self.dead += 1;
        self.drop_dead_front();
        if self.dead > Self::SLACK && self.dead > self.order.len() - self.dead {
            self.order.retain(|s| s.entry.is_some());
            self.dead = 0;
            // Entries moved: positions taken before are no longer indexes.
            self.epoch += 1;
        }
    }

    /// Where the entry at `place` is in the log, if it still is.
    fn index_of(&self, place: Place) -> Option<usize> {
        if place.epoch == self.epoch {
            // Gone from the front already: not in the log.
            let i = usize::try_from(place.abs.checked_sub(self.front)?).ok()?;
            if self.order.get(i).is_some_and(|s| s.seq == place.seq) {
                return Some(i);
            }
            debug_assert!(
                i >= self.order.len(),
                "entry {} not at its position {i}",
                place.seq
            );
        }
        self.order.binary_search_by_key(&place.seq, |s| s.seq).ok()
    }

    /// The live entry at `place`.
    fn get(&self, place: Place) -> Option<&HistoryEntry> {
        self.order[self.index_of(place)?].entry.as_ref()
    }

    /// Takes the log's front out, returning its entry (`None` for a
    /// tombstone) or `None` when the log is empty.
    fn pop_front(&mut self) -> Option<Option<HistoryEntry>> {
        let front = self.order.pop_front()?;
        self.front += 1;
        if front.entry.is_none() {
            self.dead -= 1;
        }
        Some(front.entry)
    }

    fn drop_dead_front(&mut self) {
        while self.order.front().is_some_and(|s| s.entry.is_none()) {
            self.pop_front();
        }
    }

    /// Drops the shard's oldest entries until what is kept weighs at most
    /// `budget` bytes. Their names are not touched: see [`NameHistory`].
    pub fn fit(&mut self, budget: usize) {
        while self.bytes > budget {
            match self.pop_front() {
                Some(Some(old)) => self.bytes -= old.weight(),
                Some(None) => {}
                None => break,
            }
        }
    }

    /// Drops a forgotten name's entries.
    pub fn forget(&mut self, hist: &NameHistory) {
        for &place in &hist.places {
            self.remove(place);
        }
    }

    /// The entries of `hist` still kept, oldest first, and whether some
    /// were dropped (by the per-name cap or the byte budget).
    pub fn entries(&self, hist: &NameHistory) -> (Vec<HistoryEntry>, bool) {
        let kept: Vec<HistoryEntry> = hist.places.iter().filter_map(|&p| self.get(p).cloned()).collect();
        let truncated = hist.capped || kept.len() < hist.places.len();
        (kept, truncated)
    }

    /// Live entries in the log.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.order.len() - self.dead
    }

    /// What the log holds: the live entries and the tombstones.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.order.len()
    }

    /// The shard's oldest live entry: the next the byte budget drops.
    #[cfg(test)]
    pub fn oldest(&self) -> Option<&HistoryEntry> {
        self.order.iter().find_map(|s| s.entry.as_ref())
    }

    /// The budgeted weight of the entries kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u64) -> HistoryEntry {
        HistoryEntry {
            lease: LeaseId::new(Micros::from_micros(n + 1), 0, 0),
            owner: Arc::from("o"),
            event: HistoryEvent::Released,
            at: Micros::from_micros(n),
            watermark: Micros::from_micros(n),
            metadata: None,
        }
    }

    /// Across pushes, per-name drops, forgotten names, budget evictions
    /// and the compactions they cause, every name's kept entry is found
    /// where a search of the log finds it: by its position while its
    /// epoch holds, by the search after. A name reads exactly its entries
    /// still in the log, and knows when it lost one.
    #[test]
    fn every_kept_entry_is_found_at_its_place_in_the_log() {
        let mut log = HistoryLog::default();
        let mut names: Vec<Option<Box<NameHistory>>> = (0..40).map(|_| None).collect();
        // What each name was given, by the entry's `at`, to check reads.
        let mut given: Vec<Vec<u64>> = vec![Vec::new(); 40];
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let (mut compacted, start_epoch, mut evicted) = (false, log.epoch, false);
        for n in 0..20_000u64 {
            let slot = (next() % 40) as usize;
            match next() % 20 {
                0 => {
                    if let Some(hist) = names[slot].take() {
                        log.forget(&hist);
                    }
                    given[slot].clear();
                }
                1 => {
                    let before = log.len();
                    log.fit(log.bytes().saturating_sub(1));
                    evicted |= log.len() < before;
                }
                _ => {
                    log.push(&mut names[slot], entry(n), 3);
                    given[slot].push(n);
                }
            }
            compacted |= log.epoch != start_epoch;
            for (slot, hist) in names.iter().enumerate() {
                let Some(hist) = hist.as_deref() else { continue };
                for &p in &hist.places {
                    let searched = log.order.binary_search_by_key(&p.seq, |s| s.seq).ok();
                    let found = log.index_of(p);
                    assert_eq!(found, searched, "entry {} of slot {slot}", p.seq);
                }
                let (read, truncated) = log.entries(hist);
                let read: Vec<u64> = read.iter().map(|e| e.at.as_micros()).collect();
                let last3 = &given[slot][given[slot].len().saturating_sub(3)..];
                assert!(last3.ends_with(&read), "slot {slot} read {read:?} of {last3:?}");
                assert_eq!(truncated, read.len() < given[slot].len(), "slot {slot}");
            }
        }
        let live: usize = names.iter().flatten().map(|h| log.entries(h).0.len()).sum();
        assert_eq!(log.len(), live, "the log holds the names' entries and no others");
        assert!(compacted, "the run compacted the log at least once");
        assert!(evicted, "the run dropped entries for the budget");
    }
}
