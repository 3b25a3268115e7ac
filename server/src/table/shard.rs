//! One shard of the table and the locks a request holds: the name → slot
//! index, the slab of records, the per-name waiter queues, the tombstones
//! of broken tentative leases; [`Locked`] is a request's shards, locked in
//! ascending order, and [`HeldLease`] a lease found and checked under them.

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bagel_proto::Micros;

use super::history::HistoryLog;
use super::order::NameOrder;
use super::queue::Waiter;
use super::record::NameRecord;
use super::slab::Slab;
use super::{Error, LeaseId, MAX_SLOTS, Mode, stats};

/// A name and its record, in a shard's slab.
#[derive(Debug)]
pub(super) struct Entry {
    /// The name itself, inline when it fits in 24 bytes (most do): a
    /// separate allocation per name cost a held lease ~44 bytes more
    /// (`cargo bench -p bagel-server --bench held`). Requests name it as an
    /// `Arc<str>`, made again where an answer needs one.
    pub(super) name: compact_str::CompactString,
    pub(super) rec: NameRecord,
}

impl Entry {
    /// The name, shared, for answers and events.
    pub(super) fn shared_name(&self) -> Arc<str> {
        Arc::from(self.name.as_str())
    }
}

/// Name → slot, as a hash table of bare 4-byte slot numbers: the names live
/// once, in the slab, and the table compares against them there. A hash
/// table can be half empty right after it grows, so its buckets must be
/// small; this keeps them at 4 bytes (a `HashMap<Arc<str>, u32>` takes 24).
#[derive(Debug, Default)]
pub(super) struct SlotIndex {
    pub(super) table: hashbrown::HashTable<u32>,
    /// Seeded per shard, independent of the shard-choosing hash (which
    /// would otherwise put the same low bits on every name of a shard).
    pub(super) hasher: std::collections::hash_map::RandomState,
}

impl SlotIndex {
    pub(super) fn find(&self, name: &str, slab: &Slab) -> Option<usize> {
        let hash = self.hasher.hash_one(name);
        self.table
            .find(hash, |&s| {
                slab[s as usize].as_ref().is_some_and(|e| e.name == name)
            })
            .map(|&s| s as usize)
    }

    /// Indexes `slot`, whose entry is already in `slab`.
    pub(super) fn insert(&mut self, name: &str, slot: usize, slab: &Slab) {
        let hasher = &self.hasher;
        let rehash = |&s: &u32| {
            let entry = slab[s as usize].as_ref().expect("an indexed slot is occupied");
            hasher.hash_one(entry.name.as_str())
        };
        self.table
            .insert_unique(hasher.hash_one(name), slot as u32, rehash);
    }

    pub(super) fn remove(&mut self, name: &str, slot: usize) {
        let hash = self.hasher.hash_one(name);
        if let Ok(entry) = self.table.find_entry(hash, |&s| s as usize == slot) {
            entry.remove();
        }
    }

    pub(super) fn len(&self) -> usize {
        self.table.len()
    }
}

/// One shard: an index from name to slot, and the slab of records.
#[derive(Debug, Default)]
pub(super) struct ShardState {
    pub(super) slots: SlotIndex,
    /// The names whose record has a holder (`Holder::listed`), in name
    /// order: what `List` pages through.
    pub(super) order: NameOrder,
    pub(super) slab: Slab,
    pub(super) free: Vec<u32>,
    pub(super) history: HistoryLog,
    /// The shard's busiest names by grants, for operators.
    pub(super) busiest: stats::Busiest,
    /// Acquires waiting for a name of this shard, first come first served
    /// (see `queue`). Only names with waiters have an entry.
    pub(super) queues: std::collections::HashMap<Arc<str>, VecDeque<Arc<Waiter>>>,
    /// Tentative leases whose first name is in this shard and that a full
    /// acquire broke, until their deadline (see `LeaseTable::free_broken`).
    pub(super) broken: std::collections::HashMap<LeaseId, Tombstone>,
}

/// Why a tentative lease is gone: every later call on it says so, whichever
/// of its names was taken.
#[derive(Clone, Debug)]
pub(super) struct Tombstone {
    pub(super) name: Arc<str>,
    pub(super) by: LeaseId,
    pub(super) deadline: Micros,
}

impl Tombstone {
    pub(super) fn error(&self, lease: LeaseId) -> Error {
        Error::LostName {
            lease,
            name: Arc::clone(&self.name),
            by: self.by,
        }
    }
}

/// Tombstones kept per shard; beyond, the one nearest its deadline goes
/// (its lease then answers "unknown lease", like any forgotten one).
pub(super) const TOMBSTONES_PER_SHARD: usize = 256;

/// A tentative lease a full acquire just broke on `name`.
#[derive(Debug)]
pub(super) struct Broken {
    pub(super) lease: LeaseId,
    pub(super) deadline: Micros,
    pub(super) name: Arc<str>,
    /// Its names, when the broken name was its first (whose holder lists
    /// them); otherwise found from the first name's record.
    pub(super) names: Option<Vec<Arc<str>>>,
}

impl ShardState {
    pub(super) fn slot_of(&self, name: &str) -> Option<usize> {
        self.slots.find(name, &self.slab)
    }

    pub(super) fn get(&self, name: &str) -> Option<&NameRecord> {
        let slot = self.slot_of(name)?;
        self.slab[slot].as_ref().map(|e| &e.rec)
    }

    pub(super) fn at(&self, slot: usize) -> Option<&Entry> {
        self.slab.get(slot)?.as_ref()
    }

    pub(super) fn rec_mut(&mut self, slot: usize) -> &mut NameRecord {
        &mut self.slab[slot].as_mut().expect("slot is occupied").rec
    }

    /// The slot of `name`, creating a fresh record (inheriting `floor` and
    /// `fencing_floor`) if it has none.
    pub(super) fn slot_or_insert(
        &mut self,
        name: &Arc<str>,
        floor: Micros,
        fencing_floor: u64,
    ) -> Result<usize, Error> {
        if let Some(slot) = self.slot_of(name) {
            return Ok(slot);
        }
        let slot = match self.free.pop() {
            Some(slot) => slot as usize,
            None => {
                if self.slab.len() >= MAX_SLOTS {
                    return Err(Error::Capacity {
                        detail: format!("a shard holds at most {MAX_SLOTS} names"),
                    });
                }
                self.slab.push_empty()
            }
        };
        self.slab[slot] = Some(Entry {
            name: compact_str::CompactString::from(&**name),
            rec: NameRecord::new(floor, fencing_floor),
        });
        self.slots.insert(name, slot, &self.slab);
        Ok(slot)
    }

    /// Wakes the first acquire waiting for `name`, which just became free.
    pub(super) fn wake_first(&self, name: &str) {
        if self.queues.is_empty() {
            return;
        }
        if let Some(first) = self.queues.get(name).and_then(|q| q.front()) {
            first.wake.notify_one();
        }
    }

    /// Takes `waiter` out of `name`'s queue; if it was first, the next one
    /// becomes first and is woken to watch the holder itself.
    pub(super) fn dequeue(&mut self, name: &str, waiter: &Arc<Waiter>) {
        let Some(q) = self.queues.get_mut(name) else {
            return;
        };
        let Some(pos) = q.iter().position(|w| Arc::ptr_eq(w, waiter)) else {
            return;
        };
        q.remove(pos);
        if q.is_empty() {
            self.queues.remove(name);
        } else if pos == 0 {
            q[0].wake.notify_one();
        }
    }

    /// Puts `slot`, whose record just got a holder, in the name order.
    pub(super) fn list_slot(&mut self, slot: usize) {
        self.order.insert(slot as u32, &self.slab);
    }

    /// Takes `slot` out of the name order (its holder went).
    pub(super) fn unlist_slot(&mut self, slot: usize) {
        let removed = self.order.remove(slot as u32, &self.slab);
        debug_assert!(removed, "slot {slot} was listed");
    }

    pub(super) fn remove_slot(&mut self, slot: usize) -> Option<Entry> {
        let listed = self.at(slot)?.rec.holder.as_ref().is_some_and(|h| h.listed);
        if listed {
            self.unlist_slot(slot);
        }
        let entry = self.slab.get_mut(slot)?.take()?;
        self.slots.remove(&entry.name, slot);
        self.free.push(slot as u32);
        Some(entry)
    }
}

#[derive(Debug, Default)]
pub(super) struct Shard {
    pub(super) state: Mutex<ShardState>,
    pub(super) counters: stats::ShardCounters,
}

impl Shard {
    pub(super) fn lock(&self) -> MutexGuard<'_, ShardState> {
        // A panic while holding a shard lock leaves consistent data (every
        // mutation happens after all checks), so poisoning is ignored rather
        // than taking the whole server down.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The shards of one request, locked in ascending order.
pub(super) struct Locked<'a> {
    pub(super) order: Vec<usize>,
    pub(super) guards: Vec<MutexGuard<'a, ShardState>>,
}

impl Locked<'_> {
    pub(super) fn state(&mut self, shard: usize) -> &mut ShardState {
        let pos = self.order.binary_search(&shard).expect("shard was locked");
        &mut self.guards[pos]
    }
}

/// A lease found and checked: its shards locked, names and deadline.
pub(super) struct HeldLease<'a> {
    pub(super) locked: Locked<'a>,
    pub(super) names: Vec<Arc<str>>,
    pub(super) shard_of_name: Vec<usize>,
    /// Each name's slot in its shard, found once by `lock_lease` (every
    /// step after would otherwise hash and compare the name again).
    pub(super) slots: Vec<usize>,
    pub(super) deadline: Micros,
    pub(super) mode: Mode,
}

impl HeldLease<'_> {
    pub(super) fn rec(&mut self, i: usize) -> &mut NameRecord {
        let shard = self.shard_of_name[i];
        let slot = self.slots[i];
        self.locked.state(shard).rec_mut(slot)
    }

    /// Puts name `i` back in the name order if the sweep took it out (a
    /// renewal or upgrade whose `now` was read before the deadline the
    /// sweep saw passed keeps the lease live).
    pub(super) fn relist(&mut self, i: usize) {
        let holder = self
            .rec(i)
            .holder
            .as_mut()
            .expect("a held lease's name has a holder");
        if !holder.listed {
            holder.listed = true;
            let shard = self.shard_of_name[i];
            let slot = self.slots[i];
            self.locked.state(shard).list_slot(slot);
        }
    }
}
