//! What the table tells without changing anything: names and their
//! history for clients and operators, and the counts, census and busiest
//! names behind `/metrics` and the status page.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bagel_proto::Micros;

use super::accounts::Usage;
use super::stats::{self, BreakEvent, Census, Counts, Tracked};
use super::{HistoryEntry, LeaseTable, NameView, Previous};

impl LeaseTable {
    /// The owner lease `lease` was granted to, while it is the live holder
    /// of its first name (`None` otherwise: the operation itself then says
    /// why). With mutual TLS, renew, upgrade and release check it against
    /// the caller's certificate.
    pub fn lease_owner(&self, lease: super::LeaseId) -> Option<Arc<str>> {
        let shard = self.shards.get(lease.shard())?;
        let state = shard.lock();
        let entry = state.at(lease.slot())?;
        entry
            .rec
            .holder
            .as_ref()
            .filter(|h| h.lease == lease)
            .map(|_| entry.rec.owner())
    }

    pub fn describe(&self, names: &[Arc<str>], now: Micros) -> Vec<NameView> {
        let floor = self.forgotten_floor();
        names
            .iter()
            .map(|name| {
                let shard = self.shards[self.shard_of(name)].lock();
                let waiters = shard.queues.get(name).map_or(0, VecDeque::len);
                match shard.get(name) {
                    None => NameView {
                        name: Arc::clone(name),
                        holder: None,
                        owner: None,
                        previous: Previous::unknown(floor),
                        fencing: 0,
                        known: false,
                        waiters,
                    },
                    Some(rec) => {
                        let holder = rec.live_holder(now).cloned();
                        NameView {
                            owner: holder.as_ref().map(|_| rec.owner()),
                            name: Arc::clone(name),
                            previous: if holder.is_some() {
                                rec.prev.clone()
                            } else {
                                rec.inherit(now)
                            },
                            holder,
                            fencing: rec.fencing,
                            known: true,
                            waiters,
                        }
                    }
                }
            })
            .collect()
    }

    /// The name's recent history, oldest first, and whether some was dropped.
    pub fn history(&self, name: &str) -> (Vec<HistoryEntry>, bool) {
        let shard = self.shards[self.shard_of(name)].lock();
        match shard.get(name).and_then(|r| r.history.as_deref()) {
            None => (Vec::new(), false),
            Some(h) => (h.entries.iter().cloned().collect(), h.truncated),
        }
    }

    /// Lease events since the table was made. Reads atomics only: cheap
    /// enough to call every second.
    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for s in self.shards.iter() {
            c.add(&s.counters);
        }
        c
    }

    /// Scans every shard (one lock at a time, each held for a pass over
    /// its records) for what only a scan can tell: held names and leases,
    /// and expiries, which happen without a request. For scrapes, not for
    /// the request path.
    pub fn census(&self, now: Micros) -> Census {
        let mut c = Census::default();
        for (i, shard) in self.shards.iter().enumerate() {
            let state = shard.lock();
            for (slot, entry) in state.slab.iter().enumerate() {
                if let Some(e) = entry {
                    let holder = e.rec.holder.as_ref();
                    let first = holder.is_some_and(|h| stats::is_first(h, i, slot));
                    c.record(holder, first, now);
                }
            }
            c.lapsed(&shard.counters);
            c.history_bytes += state.history.bytes() as u64;
        }
        c
    }

    /// Acquires waiting server-side for a busy name right now.
    pub fn waiters(&self) -> u64 {
        self.waiting.load(Ordering::Relaxed) as u64
    }

    /// How often forgetting idle records raised the forgotten floor.
    pub fn floor_raises(&self) -> u64 {
        self.stats.floor_raises.load(Ordering::Relaxed)
    }

    /// The last few names whose holder missed its deadline, oldest first.
    pub fn recent_breaks(&self) -> Vec<BreakEvent> {
        self.stats.recent_breaks()
    }

    /// Up to `n` of the busiest names by grants (decayed, see
    /// [`LeaseTable::decay_busiest`]), busiest first.
    pub fn busiest(&self, n: usize) -> Vec<Tracked> {
        let mut all: Vec<Tracked> = self
            .shards
            .iter()
            .flat_map(|s| s.lock().busiest.tracked().cloned().collect::<Vec<_>>())
            .collect();
        all.sort_by(|a, b| b.grants.cmp(&a.grants).then_with(|| a.name.cmp(&b.name)));
        all.truncate(n);
        all
    }

    /// Halves the busiest-names counts, so they follow current load (call
    /// it periodically: every minute makes a one-minute half-life).
    pub fn decay_busiest(&self) {
        for s in self.shards.iter() {
            s.lock().busiest.decay();
        }
    }

    /// Names held in all (counted: not released, broken or swept).
    pub fn held(&self) -> usize {
        self.accounts.held()
    }

    /// What `owner` holds and has records of.
    pub fn owner_usage(&self, owner: &str) -> Option<Arc<Usage>> {
        self.accounts.owner_usage(owner)
    }
}
