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
}

impl HistoryEntry {
    fn weight(&self) -> usize {
        // A fixed overhead for the entry itself plus its variable parts.
        96 + self.owner.len() + self.metadata.as_ref().map_or(0, Metadata::weight)
    }
}

/// One name's recent history, oldest first.
#[derive(Debug, Default)]
pub struct NameHistory {
    pub entries: VecDeque<HistoryEntry>,
    /// Some entries were dropped (per-name cap or budget).
    pub truncated: bool,
}

/// A shard's record of which names got history entries, in order.
#[derive(Debug, Default)]
pub struct HistoryLog {
    order: VecDeque<(Arc<str>, u64)>,
    bytes: usize,
    next_seq: u64,
}

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
    /// Appends `entry` to `name`'s history (`slot`), keeping at most
    /// `per_name` entries for the name. The caller enforces the shard's
    /// byte budget with [`HistoryLog::pop_oldest`] and [`HistoryLog::evict`].
    pub fn push(
        &mut self,
        name: &Arc<str>,
        slot: &mut Option<Box<NameHistory>>,
        entry: NewEntry,
        per_name: usize,
    ) {
        if per_name == 0 {
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let entry = HistoryEntry {
            lease: entry.lease,
            owner: entry.owner,
            event: entry.event,
            at: entry.at,
            watermark: entry.watermark,
            metadata: entry.metadata,
            seq,
        };
        self.bytes += entry.weight();
        let hist = slot.get_or_insert_with(Default::default);
        hist.entries.push_back(entry);
        self.order.push_back((Arc::clone(name), seq));
        while hist.entries.len() > per_name {
            if let Some(old) = hist.entries.pop_front() {
                self.bytes -= old.weight();
                hist.truncated = true;
            }
        }
    }

    pub fn over_budget(&self, budget: usize) -> bool {
        self.bytes > budget
    }

    /// The oldest recorded (name, entry sequence) of the shard.
    pub fn pop_oldest(&mut self) -> Option<(Arc<str>, u64)> {
        self.order.pop_front()
    }

    /// Drops entry `seq` from `hist` if it is still its oldest (it may be
    /// gone already: per-name cap).
    pub fn evict(&mut self, hist: &mut NameHistory, seq: u64) {
        if hist.entries.front().is_some_and(|e| e.seq == seq) {
            let old = hist.entries.pop_front().expect("front exists");
            self.bytes -= old.weight();
            hist.truncated = true;
        }
    }

    /// Accounts for a forgotten name's entries.
    pub fn forget(&mut self, hist: &NameHistory) {
        self.bytes -= hist.entries.iter().map(HistoryEntry::weight).sum::<usize>();
    }

    /// The budgeted weight of the entries kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}
