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

/// Where a shard's part of a page goes on from.
#[derive(Clone, Debug)]
enum Cursor {
    /// At this name (a page's prefix) or after it.
    From(compact_str::CompactString),
    /// Just after this name (a page token, or the last name read).
    After(compact_str::CompactString),
    /// The shard has no more names under the prefix.
    Done,
}

/// One shard's part of a page being merged.
struct Source {
    /// Held names read from the shard and not yet merged, in order.
    buf: VecDeque<Listed>,
    cursor: Cursor,
    /// How many to read next time: doubled each time, so a shard holding
    /// much of a page is locked a few times, not once per name.
    want: usize,
}

/// Names a page looks at per shard lock at most: a shard full of lapsed
/// holders (read and skipped) is not held for long at once.
const READ_MAX: usize = 1024;

/// A page of [`LeaseTable::list`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ListPage {
    /// In name order (bytewise).
    pub names: Vec<Listed>,
    /// More held names follow the last one.
    pub more: bool,
}

/// Records the seeding of a woken watch hub reads per tick (at least one
/// shard whatever its size): a million held names are read over about a
/// second of ticks, not on the request that woke the hub.
pub const SEED_RECORDS_PER_TICK: usize = 65_536;

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
    /// `prefix` and sort after `after`, in name order. A merge of the
    /// shards' name orders (`order`): each shard is read a few names at a
    /// time, one lock at a time, from just after the last name read there,
    /// so a page costs about its size plus a binary search per shard,
    /// never a pass over every record (a page must stay cheap at 10^6
    /// names). Names come and go between pages, and between the reads of
    /// one page; a page never repeats a name of an earlier one (it starts
    /// after the last).
    pub fn list(&self, prefix: &str, after: Option<&str>, limit: usize, now: Micros) -> ListPage {
        self.list_touching(prefix, after, limit, now, &mut 0)
    }

    /// [`LeaseTable::list`], counting in `touched` the names it looked at
    /// (compared while seeking, or read): what a page costs.
    pub(super) fn list_touching(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        now: Micros,
        touched: &mut usize,
    ) -> ListPage {
        let keep = limit.saturating_add(1);
        // Names spread evenly over the shards: a first read of a little
        // more than each one's share usually serves the whole page.
        let first = keep.div_ceil(self.shards.len()) + 1;
        let start = match after {
            Some(a) if a >= prefix => Cursor::After(a.into()),
            _ => Cursor::From(prefix.into()),
        };
        let mut sources: Vec<Source> = (0..self.shards.len())
            .map(|_| Source {
                buf: VecDeque::new(),
                cursor: start.clone(),
                want: first,
            })
            .collect();
        let mut heads = std::collections::BinaryHeap::new();
        for (i, src) in sources.iter_mut().enumerate() {
            self.refill(i, src, prefix, now, touched);
            if let Some(l) = src.buf.front() {
                heads.push(std::cmp::Reverse((Arc::clone(&l.name), i)));
            }
        }
        let mut names = Vec::with_capacity(keep.min(1024));
        while names.len() < keep {
            let Some(std::cmp::Reverse((_, i))) = heads.pop() else {
                break;
            };
            let src = &mut sources[i];
            names.push(src.buf.pop_front().expect("a head is buffered"));
            if src.buf.is_empty() && names.len() < keep {
                src.want = src.want.saturating_mul(2).min(keep - names.len()).max(1);
                self.refill(i, src, prefix, now, touched);
            }
            if let Some(l) = src.buf.front() {
                heads.push(std::cmp::Reverse((Arc::clone(&l.name), i)));
            }
        }
        let more = names.len() > limit;
        names.truncate(limit);
        ListPage { names, more }
    }

    /// Reads up to `src.want` held names of shard `i` from its cursor into
    /// its buffer (fewer if the shard's names under `prefix` end first),
    /// under the shard's lock, looking at no more than [`READ_MAX`] names
    /// at a time (lapsed holders not yet swept are skipped).
    fn refill(&self, i: usize, src: &mut Source, prefix: &str, now: Micros, touched: &mut usize) {
        let state = self.shards[i].lock();
        while src.buf.is_empty() {
            let (from, exclusive) = match &src.cursor {
                Cursor::Done => return,
                Cursor::From(n) => (n.as_str(), false),
                Cursor::After(n) => (n.as_str(), true),
            };
            let mut read = 0;
            let mut last = None;
            let mut out_of_prefix = false;
            let stopped = state.order.walk(from, exclusive, &state.slab, touched, |slot| {
                let e = state.at(slot as usize).expect("an ordered slot is occupied");
                if !e.name.starts_with(prefix) {
                    out_of_prefix = true;
                    return false;
                }
                read += 1;
                last = Some(slot);
                if let Some(h) = e.rec.live_holder(now) {
                    src.buf.push_back(Listed {
                        name: e.shared_name(),
                        lease: h.lease,
                        owner: e.rec.owner(),
                        mode: h.mode,
                        deadline: h.deadline,
                        fencing: e.rec.fencing,
                    });
                }
                src.buf.len() < src.want && read < READ_MAX
            });
            *touched += read + usize::from(out_of_prefix);
            src.cursor = match last {
                Some(slot) if stopped && !out_of_prefix => {
                    let e = state.at(slot as usize).expect("an ordered slot is occupied");
                    Cursor::After(e.name.clone())
                }
                _ => Cursor::Done,
            };
        }
    }

    /// Starts a watcher (see `crate::watch`). When the hub wakes up, the
    /// live leases are read into it by the next ticks (see
    /// `LeaseTable::seed_watch`), so their expiries are reported.
    pub fn watch(&self, filter: Filter, from: Option<u64>, now: Micros) -> Result<Subscription, WatchError> {
        let (sub, woke) = self.watch.subscribe(filter, from)?;
        if woke {
            self.watch.seed_from(now);
        }
        Ok(sub)
    }

    /// The watch revision a List reading the table from now on reflects
    /// (see `crate::watch::Hub::keep_for_list`): call it before reading.
    /// Wakes the hub if it is idle, so a Watch from the revision can follow.
    pub fn list_revision(&self, now: Micros) -> u64 {
        let (revision, woke) = self.watch.keep_for_list(now);
        if woke {
            self.watch.seed_from(now);
        }
        revision
    }

    /// Reads the live leases into a hub that woke up, a few shards at a
    /// time: at least [`SEED_RECORDS_PER_TICK`] records (or every shard)
    /// per call, each shard under its own lock. Called by
    /// [`LeaseTable::watch_tick`], off the request path.
    pub(super) fn seed_watch(&self) {
        let mut read = 0;
        while read < SEED_RECORDS_PER_TICK {
            let Some(work) = self.watch.seed_work(1, self.shards.len()) else {
                return;
            };
            for shard in &self.shards[work.shards] {
                let state = shard.lock();
                for e in state.slab.iter().flatten() {
                    read += 1;
                    if let Some(h) = &e.rec.holder
                        && !h.expired
                        && h.deadline > work.since
                    {
                        self.watch
                            .track_seeded(work.generation, h.lease, &e.shared_name(), h.deadline);
                    }
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
            Some(h) => shard.history.entries(h),
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
