//! What the table tells without changing anything: names and their
//! history for clients and operators, and the counts, census and busiest
//! names behind `/metrics` and the status page.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bagel_proto::Micros;

use super::accounts::Usage;
use super::stats::{self, BreakEvent, Census, Counts, Tracked};
use super::{HistoryEntry, LeaseId, LeaseTable, Mode, NameView, Previous};
use crate::watch::{Filter, Hub, Subscription, WatchError};

/// A held name, as [`LeaseTable::list`] shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Listed {
    pub name: Arc<str>,
    pub lease: LeaseId,
    pub owner: Arc<str>,
    pub mode: Mode,
    pub deadline: Micros,
    pub fencing: u64,
}

/// A page of [`LeaseTable::list`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ListPage {
    /// In name order (bytewise).
    pub names: Vec<Listed>,
    /// More held names follow the last one.
    pub more: bool,
}

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

    /// The first of live lease `lease`'s names for which `refuse` says
    /// why not (`None` when it refuses none, or the lease is not the live
    /// holder of its first name: the operation then says why). The access
    /// policy (`crate::acl`) checks renew, upgrade and release with it,
    /// under the shard's lock and without copying the names.
    pub fn refuse_lease_name<R>(
        &self,
        lease: super::LeaseId,
        mut refuse: impl FnMut(&str) -> Option<R>,
    ) -> Option<R> {
        let shard = self.shards.get(lease.shard())?;
        let state = shard.lock();
        let entry = state.at(lease.slot())?;
        let holder = entry.rec.holder.as_ref().filter(|h| h.lease == lease)?;
        match &holder.all_names {
            Some(all) => all.iter().find_map(|n| refuse(n)),
            None => refuse(entry.name.as_str()),
        }
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

    /// Up to `limit` names held at `now` (by a live holder) that start with
    /// `prefix` and sort after `after`, in name order. Each page scans
    /// every shard, one lock at a time, and keeps only the `limit + 1`
    /// first names it meets: the cost is a pass over the records, the
    /// memory the page. Names come and go between pages; a page never
    /// repeats a name of an earlier one (it starts after the last).
    pub fn list(&self, prefix: &str, after: Option<&str>, limit: usize, now: Micros) -> ListPage {
        let mut page: std::collections::BTreeMap<Arc<str>, Listed> = Default::default();
        let keep = limit.saturating_add(1);
        for shard in self.shards.iter() {
            let state = shard.lock();
            for e in state.slab.iter().flatten() {
                if !e.name.starts_with(prefix) || after.is_some_and(|a| e.name.as_str() <= a) {
                    continue;
                }
                if page.len() >= keep && page.last_key_value().is_some_and(|(k, _)| **k <= *e.name) {
                    continue;
                }
                let Some(h) = e.rec.live_holder(now) else { continue };
                let name = e.shared_name();
                page.insert(
                    Arc::clone(&name),
                    Listed {
                        name,
                        lease: h.lease,
                        owner: e.rec.owner(),
                        mode: h.mode,
                        deadline: h.deadline,
                        fencing: e.rec.fencing,
                    },
                );
                if page.len() > keep {
                    page.pop_last();
                }
            }
        }
        let more = page.len() > limit;
        let names = page.into_values().take(limit).collect();
        ListPage { names, more }
    }

    /// Starts a watcher (see `crate::watch`). When the hub wakes up, the
    /// live leases are read into it, so their expiries are reported.
    pub fn watch(&self, filter: Filter, from: Option<u64>, now: Micros) -> Result<Subscription, WatchError> {
        let (sub, woke) = self.watch.subscribe(filter, from)?;
        if woke {
            self.seed_watch(now);
        }
        Ok(sub)
    }

    /// The watch revision a List reading the table from now on reflects
    /// (see `crate::watch::Hub::keep_for_list`): call it before reading.
    /// Wakes the hub if it is idle, so a Watch from the revision can follow.
    pub fn list_revision(&self, now: Micros) -> u64 {
        let (revision, woke) = self.watch.keep_for_list(now);
        if woke {
            self.seed_watch(now);
        }
        revision
    }

    /// Reads the live leases into a hub that just woke up.
    fn seed_watch(&self, now: Micros) {
        for shard in self.shards.iter() {
            let state = shard.lock();
            for e in state.slab.iter().flatten() {
                if let Some(h) = e.rec.live_holder(now) {
                    self.watch.track(h.lease, &e.shared_name(), h.deadline);
                }
            }
        }
    }

    /// The watch hub, for its housekeeping and its numbers.
    pub fn watch_hub(&self) -> &Arc<Hub> {
        &self.watch
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
