//! The lease table: every rule about leases, with no gRPC and no clock of
//! its own. Every method takes `now`, so tests drive time exactly.
//!
//! # Sharding and locking
//!
//! Names are spread over a fixed array of shards, each a `std::sync::Mutex`
//! around a map from name to slot and a slab of records. A request locks
//! the shards of its names **in ascending shard order, all at once**,
//! checks every name, then commits every name: that makes multi-name
//! acquires all-or-nothing and deadlock-free, and requests on names in
//! different shards never contend.
//!
//! Why not a `DashMap`: an all-or-nothing acquire must hold several names
//! at once. DashMap locks a shard per key access in an order we do not
//! control, and two live guards into one DashMap can deadlock when their
//! keys share a shard. A shard array gives us the global lock order.
//!
//! There is no lease-id index: a [`LeaseId`] carries the shard and slot of
//! its first name's record, whose holder carries, for multi-name leases,
//! the other names; the token is derived from the id (`ids::TokenKey`), not
//! stored. Renew and release of a one-name lease thus take exactly one lock
//! and no extra memory per lease. Memory per held one-name lease is the
//! record with its name in the slab (144 bytes, in chunks that never move:
//! see `slab`; a name over 24 bytes adds its own allocation) and the index
//! entry (4-byte slot and a control byte, at 44-87% load), and its 4-byte
//! slot in the shard's name order (`order`, which `List` pages through).
//!
//! Locking rules: shard mutexes are never held across `.await` (the table
//! has no async code). A thread holding a shard lock only ever takes
//! higher-numbered shard locks.
//!
//! # Where things are
//! This file holds the rules that change leases (acquire, renew, upgrade,
//! release, breaking tentative leases, waiting) and the locking they share,
//! in one place so one lease's life reads top to bottom; it is longer than
//! most files for that reason. Around it: `spec` (requests and answers),
//! `shard` (one shard's index, slab, queues and the lock guards), `record`
//! (a name's record), `ids`, `history`, `queue` (waiters), `accounts`
//! (quotas), `views` (describe, history, counts for operators), `stats`,
//! `sweep` (forgetting idle records).

mod accounts;
mod history;
mod ids;
mod order;
mod queue;
mod record;
mod shard;
mod slab;
mod spec;
mod stats;
mod sweep;
mod views;

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bagel_proto::Micros;

pub use accounts::{Account, Accounts, HeldLimits, Usage};
pub use history::{HistoryEntry, HistoryEvent, Metadata, NameHistory};
pub use ids::{LeaseId, MAX_SHARDS, MAX_SLOTS, Token, TokenKey};
pub use queue::Ticket;
pub use record::{Ended, Holder, Mode, Previous};
pub use stats::{BreakEvent, ByMode, Census, Counts, Tracked};

use crate::error::{Conflict, Error};
use crate::watch::{EventKind, Hub, NewEvent};

/// Expiries [`LeaseTable::watch_tick`] reports per call (one tick, every
/// 50 ms): 10^5 leases expiring together are reported over about a
/// second, the hub's lock and each shard's taken per lease, not held.
pub const EXPIRY_PER_TICK: usize = 8192;
use history::NewEntry;
use record::NameRecord;
use shard::{Broken, HeldLease, Locked, Shard, ShardState, TOMBSTONES_PER_SHARD, Tombstone};
pub use spec::{AcquireSpec, Grant, NameGrant, NameView, ReleaseSpec, Released, TableConfig};
pub use views::{ListPage, Listed};

/// The in-RAM lease table. Share it behind an `Arc`.
#[derive(Debug)]
pub struct LeaseTable {
    cfg: TableConfig,
    shards: Box<[Shard]>,
    hasher: std::collections::hash_map::RandomState,
    /// What names with no record inherit as their previous watermark; only
    /// ever raised (see `forget_idle`).
    floor: AtomicU64,
    /// What names with no record start their fencing tokens above; raised
    /// to a record's last token when it is forgotten, so tokens never go
    /// down even if the clock is stepped back.
    fencing_floor: AtomicU64,
    stats: stats::TableStats,
    /// No grant's deadline may pass this: what the granted-until file
    /// durably says (see `crate::highwater`). The service raises it before
    /// granting; the check here makes "written ahead of any grant" hold
    /// even if a grant were to come late after its raise.
    grant_limit: AtomicU64,
    /// Acquires in some name's queue.
    waiting: AtomicUsize,
    /// Names held and records kept, per owner and per peer.
    accounts: Accounts,
    /// Lease events for watchers (see `crate::watch`); one relaxed load
    /// per change while nobody watches.
    watch: Arc<Hub>,
    /// Derives each lease's token (tokens are not stored).
    tokens: TokenKey,
}

impl LeaseTable {
    pub fn new(cfg: TableConfig) -> Self {
        let n = cfg.shards.clamp(1, MAX_SHARDS);
        let shards = (0..n).map(|_| Shard::default()).collect();
        LeaseTable {
            floor: AtomicU64::new(cfg.initial_floor.as_micros()),
            fencing_floor: AtomicU64::new(cfg.initial_floor.as_micros()),
            grant_limit: AtomicU64::new(u64::MAX),
            waiting: AtomicUsize::new(0),
            accounts: Accounts::default(),
            watch: Arc::new(Hub::new(cfg.watch, cfg.incarnation)),
            cfg,
            shards,
            hasher: Default::default(),
            stats: Default::default(),
            tokens: TokenKey::generate(),
        }
    }

    pub fn config(&self) -> &TableConfig {
        &self.cfg
    }

    pub fn forgotten_floor(&self) -> Micros {
        Micros::from_micros(self.floor.load(Ordering::Acquire))
    }

    /// The last fencing token a name with no record is taken to have had.
    pub fn fencing_floor(&self) -> u64 {
        self.fencing_floor.load(Ordering::Acquire)
    }

    /// Number of name records held.
    pub fn record_count(&self) -> usize {
        self.shards.iter().map(|s| s.lock().slots.len()).sum()
    }

    fn shard_of(&self, name: &str) -> usize {
        (self.hasher.hash_one(name) % self.shards.len() as u64) as usize
    }

    fn lock_shards(&self, shard_of_name: &[usize]) -> Locked<'_> {
        let mut order = shard_of_name.to_vec();
        order.sort_unstable();
        order.dedup();
        let guards = order.iter().map(|&i| self.shards[i].lock()).collect();
        Locked { order, guards }
    }

    /// Grants from now on may not pass `mark` (until raised again). A new
    /// table has no limit.
    pub fn set_grant_limit(&self, mark: Micros) {
        self.grant_limit.store(mark.as_micros(), Ordering::Release);
    }

    /// Raises the grant limit to `mark` (never lowers it).
    pub fn raise_grant_limit(&self, mark: Micros) {
        self.grant_limit.fetch_max(mark.as_micros(), Ordering::AcqRel);
    }

    /// Refuses a deadline outside `(now + min_ttl, now + max_ttl]`, or past
    /// the grant limit.
    pub fn check_deadline(&self, deadline: Micros, now: Micros) -> Result<(), Error> {
        self.check_range(deadline, now)?;
        if deadline.as_micros() > self.grant_limit.load(Ordering::Acquire) {
            return Err(Error::Capacity {
                detail: format!(
                    "deadline {} passes the granted-until mark not yet written ({}); retry",
                    deadline.as_micros(),
                    self.grant_limit.load(Ordering::Acquire)
                ),
            });
        }
        Ok(())
    }

    fn check_range(&self, deadline: Micros, now: Micros) -> Result<(), Error> {
        let lo = now.saturating_add(self.cfg.min_ttl);
        let hi = now.saturating_add(self.cfg.max_ttl);
        if deadline <= lo || deadline > hi {
            return Err(Error::DeadlineOutOfRange {
                deadline,
                now,
                min_ttl: self.cfg.min_ttl,
                max_ttl: self.cfg.max_ttl,
            });
        }
        Ok(())
    }

    fn check_ready(&self, now: Micros) -> Result<(), Error> {
        if now < self.cfg.ready_at {
            return Err(Error::NotReady {
                started: self.cfg.started,
                ready_at: self.cfg.ready_at,
                seen: now,
            });
        }
        Ok(())
    }

    /// Grants every name of `spec`, or none.
    ///
    /// A name is refused while a live full lease holds it, or a live
    /// tentative one holds it and `spec` is tentative too; a full request
    /// breaks a tentative holder. An expired holder is broken.
    pub fn acquire(&self, spec: &AcquireSpec, now: Micros) -> Result<Grant, Error> {
        self.acquire_queued(spec, now, None)
    }

    /// [`LeaseTable::acquire`] for an acquire that waits: on a conflict,
    /// `ticket` joins the FIFO queue of the busy name (leaving the queue of
    /// another of its names if it was there), under the lock of the check;
    /// on a grant it leaves its queue. Refuses with a limit error when the
    /// name, or the server, has as many waiters as allowed.
    pub fn acquire_queued(
        &self,
        spec: &AcquireSpec,
        now: Micros,
        ticket: Option<&mut Ticket>,
    ) -> Result<Grant, Error> {
        self.check_ready(now)?;
        self.check_deadline(spec.deadline, now)?;
        let shard_of_name: Vec<usize> = spec.names.iter().map(|n| self.shard_of(n)).collect();
        let mut locked = self.lock_shards(&shard_of_name);

        // 1. Check every name; nothing changes if one is refused. The slots
        //    found are kept for step 2 (a name is hashed and looked up once).
        let mut found = Vec::with_capacity(spec.names.len());
        for (name, &shard) in spec.names.iter().zip(&shard_of_name) {
            let state = locked.state(shard);
            let slot = state.slot_of(name);
            found.push(slot);
            let Some(rec) = slot.and_then(|s| state.at(s)).map(|e| &e.rec) else {
                continue;
            };
            if let Some(h) = rec.live_holder(now) {
                let breakable = h.mode == Mode::Tentative && spec.mode == Mode::Full;
                if !breakable {
                    let conflict = Error::Conflict(Box::new(Conflict {
                        name: Arc::clone(name),
                        holder: h.lease,
                        owner: rec.owner(),
                        mode: h.mode,
                        deadline: h.deadline,
                        seen: now,
                    }));
                    if let Some(ticket) = ticket {
                        self.enqueue(&mut locked, ticket, name, shard)?;
                    }
                    return Err(conflict);
                }
            }
        }
        if let Some(ticket) = ticket {
            self.unqueue(&mut locked, ticket);
        }

        // 2. Reserve the names in the quotas, then find or create every
        //    record (the only steps that can fail for lack of room, so they
        //    run before anything is granted).
        let account = self.accounts.get(&spec.owner, spec.peer);
        self.accounts.hold(&account, spec.names.len(), &self.cfg.held)?;
        let floor = self.forgotten_floor();
        let fencing_floor = self.fencing_floor();
        let mut slots = Vec::with_capacity(spec.names.len());
        for ((name, &shard), slot) in spec.names.iter().zip(&shard_of_name).zip(found) {
            let slot = match slot {
                Some(slot) => Ok(slot),
                None => locked.state(shard).slot_or_insert(name, floor, fencing_floor),
            };
            match slot {
                Ok(slot) => slots.push(slot),
                Err(e) => {
                    self.accounts.unhold(&account, spec.names.len());
                    return Err(e);
                }
            }
        }

        // 3. Grant.
        let lease = LeaseId::new(now, shard_of_name[0], slots[0]);
        let mut names = Vec::with_capacity(spec.names.len());
        let mut min_timestamp = Micros::ZERO;
        let mut broken: Vec<Broken> = Vec::new();
        for (i, (name, &shard)) in spec.names.iter().zip(&shard_of_name).enumerate() {
            let state = locked.state(shard);
            state.busiest.observe(name);
            let rec = state.rec_mut(slots[i]);
            let counters = &self.shards[shard].counters;
            (self.stats).replacing(counters, shard, slots[i], name, rec, lease, now);
            if self.watch.active()
                && let Some(h) = &rec.holder
            {
                // An expired holder, or a live tentative one we break.
                self.watch.publish(NewEvent {
                    kind: EventKind::Broken,
                    name: Arc::clone(name),
                    lease: h.lease,
                    owner: rec.owner(),
                    mode: h.mode,
                    deadline: h.deadline,
                    at: now,
                });
            }
            if let Some(h) = rec.live_holder(now) {
                // Step 1 let us through: a live tentative holder we break.
                debug_assert_eq!(h.mode, Mode::Tentative);
                if let Some(b) = broken.iter_mut().find(|b| b.lease == h.lease) {
                    b.names = b.names.take().or_else(|| h.all_names.as_deref().cloned());
                } else {
                    broken.push(Broken {
                        lease: h.lease,
                        deadline: h.deadline,
                        name: Arc::clone(name),
                        names: match &h.all_names {
                            Some(all) => Some(all.to_vec()),
                            // A one-name lease: its first name is this one.
                            None if h.lease.shard() == shard && h.lease.slot() == slots[i] => {
                                Some(vec![Arc::clone(name)])
                            }
                            None => None,
                        },
                    });
                }
            }
            let previous = rec.inherit(now);
            let fencing = rec.next_fencing(now);
            // A name stays in the order from one holder to the next.
            let listed = rec.holder.as_ref().is_some_and(|h| h.listed);
            min_timestamp = min_timestamp.max(previous.watermark);
            self.end_holding(rec);
            rec.charge(&account);
            rec.prev = previous.clone();
            rec.fencing = fencing;
            rec.holder = Some(Holder {
                lease,
                deadline: spec.deadline,
                mode: spec.mode,
                counted: true,
                all_names: (i == 0 && spec.names.len() > 1).then(|| Box::new(spec.names.clone())),
                holder_key: spec.holder_key.clone(),
                expired: false,
                listed: true,
            });
            if self.watch.active() {
                self.watch.publish(NewEvent {
                    kind: EventKind::Granted,
                    name: Arc::clone(name),
                    lease,
                    owner: Arc::clone(&spec.owner),
                    mode: spec.mode,
                    deadline: spec.deadline,
                    at: now,
                });
            }
            names.push(NameGrant {
                name: Arc::clone(name),
                fencing,
                previous,
            });
            if !listed {
                locked.state(shard).list_slot(slots[i]);
            }
        }
        self.shards[shard_of_name[0]].counters.granted(spec.mode);
        drop(locked);
        let token = self.tokens.token(lease, names[0].fencing);
        for b in broken {
            self.free_broken(b, lease, now);
        }
        Ok(Grant {
            lease,
            token,
            owner: Arc::clone(&spec.owner),
            mode: spec.mode,
            deadline: spec.deadline,
            min_timestamp,
            names,
            holder_key: spec.holder_key.clone(),
        })
    }

    /// The holder of `rec` no longer counts as holding the name (released,
    /// replaced, broken, forgotten, or its deadline passed).
    fn end_holding(&self, rec: &mut NameRecord) {
        if let (Some(h), Some(account)) = (rec.holder.as_mut(), rec.account.as_ref())
            && h.counted
        {
            h.counted = false;
            self.accounts.unhold(account, 1);
        }
    }

    /// Puts `ticket` in `name`'s queue (all of the request's shards are
    /// locked, so its previous queue's too).
    fn enqueue(
        &self,
        locked: &mut Locked<'_>,
        ticket: &mut Ticket,
        name: &Arc<str>,
        shard: usize,
    ) -> Result<(), Error> {
        if let Some((s, n)) = &ticket.queued
            && *s == shard
            && n == name
        {
            let q = &locked.state(shard).queues[name];
            ticket.first = q.front().is_some_and(|w| Arc::ptr_eq(w, &ticket.waiter));
            return Ok(());
        }
        let queued_here = locked.state(shard).queues.get(name).map_or(0, VecDeque::len);
        if queued_here >= self.cfg.max_waiters_per_name {
            self.unqueue(locked, ticket);
            return Err(Error::limit(
                format!("acquires waiting for name {}", crate::validate::echo(name)),
                self.cfg.max_waiters_per_name,
                "waiting acquires per name",
                "max-waiters-per-name",
            ));
        }
        match ticket.queued.take() {
            // Moving from another of its names: still one waiter.
            Some((s, n)) => locked.state(s).dequeue(&n, &ticket.waiter),
            None => {
                if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.cfg.max_waiters {
                    self.waiting.fetch_sub(1, Ordering::AcqRel);
                    return Err(Error::limit(
                        "acquires waiting on this server",
                        self.cfg.max_waiters,
                        "waiting acquires",
                        "max-waiters",
                    ));
                }
            }
        }
        let q = locked.state(shard).queues.entry(Arc::clone(name)).or_default();
        q.push_back(Arc::clone(&ticket.waiter));
        ticket.first = q.len() == 1;
        ticket.queued = Some((shard, Arc::clone(name)));
        Ok(())
    }

    /// Takes `ticket` out of its queue, among locked shards.
    fn unqueue(&self, locked: &mut Locked<'_>, ticket: &mut Ticket) {
        if let Some((s, n)) = ticket.queued.take() {
            locked.state(s).dequeue(&n, &ticket.waiter);
            self.waiting.fetch_sub(1, Ordering::AcqRel);
        }
        ticket.first = false;
    }

    /// Takes `ticket` out of its queue (a waiting acquire that gave up, or
    /// went away); the next waiter becomes first.
    pub fn leave_queue(&self, ticket: &mut Ticket) {
        if let Some((s, n)) = ticket.queued.take() {
            self.shards[s].lock().dequeue(&n, &ticket.waiter);
            self.waiting.fetch_sub(1, Ordering::AcqRel);
        }
        ticket.first = false;
    }

    /// Acquires waiting in all.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Finds a lease by the slot its id names, checks the token, locks all
    /// its names' shards and checks it still holds every name at `now`.
    ///
    /// Everything the caller decides on (deadline, mode) is read *after*
    /// every shard is locked: a lease whose names span shards is found
    /// under its first shard's lock, which is dropped to take all shards in
    /// order, and a concurrent renew or upgrade may change the lease in
    /// between. Deciding on the first reading let two racing renews both
    /// succeed and leave the earlier deadline in place.
    fn lock_lease(&self, lease: LeaseId, token: &Token, now: Micros) -> Result<HeldLease<'_>, Error> {
        let first_shard = lease.shard();
        if first_shard >= self.shards.len() {
            return Err(Error::UnknownLease { lease });
        }
        let guard = self.shards[first_shard].lock();
        if let Some(t) = guard.broken.get(&lease) {
            return Err(t.error(lease));
        }
        let entry = guard.at(lease.slot()).ok_or(Error::UnknownLease { lease })?;
        let holder = match &entry.rec.holder {
            Some(h) if h.lease == lease => h,
            _ => return Err(Self::gone(lease, &entry.rec)),
        };
        if !self.tokens.token(lease, entry.rec.fencing).matches(token) {
            return Err(Error::WrongToken { lease });
        }
        if !holder.is_live(now) {
            return Err(Error::Expired {
                lease,
                deadline: holder.deadline,
            });
        }
        let names = match &holder.all_names {
            Some(all) => all.to_vec(),
            None => vec![entry.shared_name()],
        };
        let seen_deadline = holder.deadline;
        // The first name's shard and slot are the id's: neither is hashed
        // or looked up again (that was ~8% of a release's CPU).
        let shard_of_name: Vec<usize> = std::iter::once(first_shard)
            .chain(names[1..].iter().map(|n| self.shard_of(n)))
            .collect();

        let locked = if shard_of_name.iter().all(|&s| s == first_shard) {
            Locked {
                order: vec![first_shard],
                guards: vec![guard],
            }
        } else {
            // Take every shard in ascending order; the lease may have
            // changed while no lock was held, so everything is read again
            // below.
            drop(guard);
            self.lock_shards(&shard_of_name)
        };
        let mut held = HeldLease {
            locked,
            slots: Vec::with_capacity(names.len()),
            names,
            shard_of_name,
            deadline: seen_deadline,
            mode: Mode::Full,
        };
        if let Some(t) = held.locked.state(first_shard).broken.get(&lease) {
            return Err(t.error(lease));
        }
        for i in 0..held.names.len() {
            let shard = held.shard_of_name[i];
            let state = held.locked.state(shard);
            let slot = if i == 0 {
                Some(lease.slot())
            } else {
                state.slot_of(&held.names[i])
            };
            let holder = slot.and_then(|s| state.at(s)).and_then(|e| e.rec.holder.as_ref());
            match holder {
                Some(h) if h.lease == lease => {
                    if !h.is_live(now) {
                        return Err(Error::Expired {
                            lease,
                            deadline: h.deadline,
                        });
                    }
                    // Every name of a lease carries the same deadline and
                    // mode (both change only with all shards locked).
                    held.deadline = h.deadline;
                    held.mode = h.mode;
                    held.slots.extend(slot);
                }
                Some(h) if now < held.deadline => {
                    return Err(Error::LostName {
                        lease,
                        name: Arc::clone(&held.names[i]),
                        by: h.lease,
                    });
                }
                _ => {
                    return Err(Error::Expired {
                        lease,
                        deadline: held.deadline,
                    });
                }
            }
        }
        Ok(held)
    }

    /// Frees every name a broken tentative lease still holds, and leaves a
    /// tombstone so that every later call on it (upgrade, renew, release)
    /// answers the same FAILED_PRECONDITION "lost name", whichever of its
    /// names was broken. Its other names would otherwise stay reserved until
    /// its deadline although the lease can never be upgraded.
    ///
    /// Runs after the breaking grant released its locks (the broken lease's
    /// names may lie in shards it did not lock); until then the lease only
    /// keeps names it can no longer use.
    fn free_broken(&self, b: Broken, by: LeaseId, now: Micros) {
        let first = b.lease.shard();
        let names = {
            let mut state = self.shards[first].lock();
            if state.broken.len() >= TOMBSTONES_PER_SHARD {
                let oldest = state
                    .broken
                    .iter()
                    .min_by_key(|(_, t)| t.deadline)
                    .map(|(id, _)| *id);
                if let Some(id) = oldest {
                    state.broken.remove(&id);
                }
            }
            state.broken.insert(
                b.lease,
                Tombstone {
                    name: Arc::clone(&b.name),
                    by,
                    deadline: b.deadline,
                },
            );
            match b.names {
                Some(names) => names,
                None => match state.at(b.lease.slot()) {
                    Some(e) => match &e.rec.holder {
                        Some(h) if h.lease == b.lease => match &h.all_names {
                            Some(all) => all.to_vec(),
                            None => vec![e.shared_name()],
                        },
                        _ => return,
                    },
                    None => return,
                },
            }
        };
        let shard_of_name: Vec<usize> = names.iter().map(|n| self.shard_of(n)).collect();
        let mut locked = self.lock_shards(&shard_of_name);
        for (name, &shard) in names.iter().zip(&shard_of_name) {
            let state = locked.state(shard);
            let Some(slot) = state.slot_of(name) else { continue };
            let rec = state.rec_mut(slot);
            if rec.holder.as_ref().is_some_and(|h| h.lease == b.lease) {
                if self.watch.active() {
                    self.watch.publish(NewEvent {
                        kind: EventKind::Broken,
                        name: Arc::clone(name),
                        lease: b.lease,
                        owner: rec.owner(),
                        mode: Mode::Tentative,
                        deadline: b.deadline,
                        at: now,
                    });
                }
                // A tentative holder leaves no trace in the chain.
                self.end_holding(rec);
                let listed = rec.holder.take().is_some_and(|h| h.listed);
                if listed {
                    state.unlist_slot(slot);
                }
                state.wake_first(name);
            }
        }
    }

    /// Reports to watchers the leases whose deadline passed by `now` (the
    /// hub's candidates, see `crate::watch::Hub::tick`). Each is decided
    /// here, with all its names' shards locked: a name still held by the
    /// lease past its deadline is reported Expired and its holder marked
    /// so that no later request revives it; a lease renewed meanwhile (the
    /// hub tracks it again from its Renewed event) or whose name was
    /// released or taken is left alone. So one lease's events reach
    /// watchers in the order they happened in the table.
    ///
    /// At most [`EXPIRY_PER_TICK`] leases per call, taken from the hub a
    /// chunk at a time (`crate::watch::EXPIRY_CHUNK`); the rest wait for
    /// the next tick. Run it off the async workers: a mass expiry is work
    /// proportional to the leases, not a request's.
    pub fn watch_tick(&self, now: Micros) {
        let mut left = EXPIRY_PER_TICK;
        let mut due = self.watch.tick(now);
        while !due.is_empty() {
            left = left.saturating_sub(due.len());
            self.report_expiries(due, now);
            if left == 0 {
                break;
            }
            due = self.watch.due(now, left.min(crate::watch::EXPIRY_CHUNK));
        }
    }

    fn report_expiries(&self, due: Vec<(LeaseId, Vec<Arc<str>>)>, now: Micros) {
        for (lease, names) in due {
            let shard_of_name: Vec<usize> = names.iter().map(|n| self.shard_of(n)).collect();
            let mut locked = self.lock_shards(&shard_of_name);
            for (name, &shard) in names.iter().zip(&shard_of_name) {
                let state = locked.state(shard);
                let Some(slot) = state.slot_of(name) else { continue };
                let rec = state.rec_mut(slot);
                let owner = rec.owner();
                let Some(h) = rec.holder.as_mut() else { continue };
                if h.lease != lease || h.expired || now < h.deadline {
                    continue;
                }
                h.expired = true;
                let event = NewEvent {
                    kind: EventKind::Expired,
                    name: Arc::clone(name),
                    lease,
                    owner,
                    mode: h.mode,
                    deadline: h.deadline,
                    at: now,
                };
                self.watch.publish(event);
            }
        }
    }

    /// Why a lease no longer holds its first name, from the name's record.
    fn gone(lease: LeaseId, rec: &NameRecord) -> Error {
        match (rec.prev.lease, rec.prev.ended) {
            (Some(l), Ended::Released) if l == lease => Error::Released {
                lease,
                at: rec.prev.ended_at,
            },
            (Some(l), Ended::Broken) if l == lease => Error::Expired {
                lease,
                deadline: rec.prev.watermark,
            },
            _ => Error::UnknownLease { lease },
        }
    }

    /// Describes a held lease for a witness.
    fn describe_held(held: &mut HeldLease<'_>, lease: LeaseId, token: Token) -> Grant {
        let mut grants = Vec::with_capacity(held.names.len());
        let mut min_timestamp = Micros::ZERO;
        let mut owner = None;
        let mut holder_key = None;
        for i in 0..held.names.len() {
            let name = Arc::clone(&held.names[i]);
            let rec = held.rec(i);
            min_timestamp = min_timestamp.max(rec.prev.watermark);
            owner.get_or_insert_with(|| rec.owner());
            if i == 0 {
                holder_key = rec.holder.as_ref().and_then(|h| h.holder_key.clone());
            }
            grants.push(NameGrant {
                name,
                fencing: rec.fencing,
                previous: rec.prev.clone(),
            });
        }
        Grant {
            lease,
            token,
            owner: owner.expect("a lease has at least one name"),
            mode: held.mode,
            deadline: held.deadline,
            min_timestamp,
            names: grants,
            holder_key,
        }
    }

    /// Moves a live lease's deadline to `max(current, new_deadline)`. A
    /// deadline never moves earlier: the holder may already have written up
    /// to the current one, and a break after an earlier deadline would hand
    /// the next holder a watermark below those writes. A renewal that asks
    /// for less than a renewal already granted (two renewals racing) is
    /// answered with the current deadline, not refused: the lease is held,
    /// and refusing would look like a loss to the holder.
    pub fn renew(
        &self,
        lease: LeaseId,
        token: &Token,
        new_deadline: Micros,
        metadata: Option<Metadata>,
        now: Micros,
    ) -> Result<Grant, Error> {
        let mut held = self.lock_lease(lease, token, now)?;
        // A renewal asks for now + its TTL on the client's clock; a client
        // ahead of this server by any amount would have every renewal of a
        // lease at the max TTL refused (its first renewal fenced it). It is
        // granted as far as may be: the witness states the deadline given.
        let new_deadline = new_deadline.min(now.saturating_add(self.cfg.max_ttl));
        self.check_deadline(new_deadline, now)?;
        let new_deadline = new_deadline.max(held.deadline);
        for i in 0..held.names.len() {
            let watched = self.watch.active().then(|| Arc::clone(&held.names[i]));
            let rec = held.rec(i);
            let holder = rec.holder.as_mut().expect("checked by lock_lease");
            holder.deadline = new_deadline;
            let mode = holder.mode;
            if let Some(name) = watched {
                self.watch.publish(NewEvent {
                    kind: EventKind::Renewed,
                    name,
                    lease,
                    owner: rec.owner(),
                    mode,
                    deadline: new_deadline,
                    at: now,
                });
            }
            if let Some(metadata) = &metadata {
                let entry = NewEntry {
                    lease,
                    owner: rec.owner(),
                    event: HistoryEvent::Renewed,
                    at: now,
                    watermark: rec.prev.watermark,
                    metadata: Some(metadata.clone()),
                };
                self.record_history(&mut held, i, entry);
            }
            held.relist(i);
        }
        held.deadline = new_deadline;
        self.shards[lease.shard()].counters.renewed();
        Ok(Self::describe_held(&mut held, lease, *token))
    }

    /// Turns a tentative lease into a full one. Fails if any of its names
    /// was broken by a full acquire meanwhile. Upgrading a full lease
    /// changes nothing and succeeds.
    pub fn upgrade(&self, lease: LeaseId, token: &Token, now: Micros) -> Result<Grant, Error> {
        let mut held = self.lock_lease(lease, token, now)?;
        let deadline = held.deadline;
        for i in 0..held.names.len() {
            let watched = self.watch.active().then(|| Arc::clone(&held.names[i]));
            let rec = held.rec(i);
            rec.holder.as_mut().expect("checked by lock_lease").mode = Mode::Full;
            if let Some(name) = watched {
                self.watch.publish(NewEvent {
                    kind: EventKind::Upgraded,
                    name,
                    lease,
                    owner: rec.owner(),
                    mode: Mode::Full,
                    deadline,
                    at: now,
                });
            }
            held.relist(i);
        }
        held.mode = Mode::Full;
        self.shards[lease.shard()].counters.upgraded();
        Ok(Self::describe_held(&mut held, lease, *token))
    }

    /// Ends a live lease, storing its watermark for the next holder.
    ///
    /// The watermark must be below the deadline. Stored watermarks never
    /// decrease: a holder that wrote nothing (watermark 0, or one below what
    /// it inherited) carries the inherited one forward. A tentative lease
    /// could not write, so it must say 0 and leaves no trace in the chain.
    ///
    /// What is unsettled travels on: the next holder is told to close the
    /// bags through the watermark if this holder had writes of unknown
    /// outcome, or if it inherited unsettled bags and did not close them
    /// (`settled_through` below what it inherited).
    pub fn release(
        &self,
        lease: LeaseId,
        token: &Token,
        spec: ReleaseSpec,
        now: Micros,
    ) -> Result<Released, Error> {
        let mut held = self.lock_lease(lease, token, now)?;
        if spec.watermark >= held.deadline {
            return Err(Error::out_of_range(
                "watermark_us",
                format!(
                    "{} must be below the lease deadline {} ({})",
                    spec.watermark.as_micros(),
                    held.deadline.as_micros(),
                    held.deadline
                ),
            ));
        }
        if held.mode == Mode::Tentative && spec.watermark != Micros::ZERO {
            return Err(Error::invalid(
                "watermark_us",
                "must be 0 when releasing a tentative lease: it had no right to write",
            ));
        }
        let mut stored = Micros::ZERO;
        for i in 0..held.names.len() {
            let watched = self.watch.active().then(|| Arc::clone(&held.names[i]));
            let rec = held.rec(i);
            self.end_holding(rec);
            let owner = rec.owner();
            let holder = rec.holder.take().expect("checked by lock_lease");
            if let Some(name) = watched {
                self.watch.publish(NewEvent {
                    kind: EventKind::Released,
                    name,
                    lease,
                    owner: Arc::clone(&owner),
                    mode: holder.mode,
                    deadline: holder.deadline,
                    at: now,
                });
            }
            if holder.mode == Mode::Full {
                let inherited_open = rec
                    .prev
                    .unsettled_until()
                    .is_some_and(|until| spec.settled_through < until);
                rec.prev = Previous {
                    lease: Some(lease),
                    watermark: rec.prev.watermark.max(spec.watermark),
                    watermark_signed_time: spec.signed_time.clone(),
                    ended: Ended::Released,
                    unsettled: spec.unsettled || inherited_open,
                    ended_at: now,
                };
            }
            stored = stored.max(rec.prev.watermark);
            let entry = NewEntry {
                lease,
                owner,
                event: HistoryEvent::Released,
                at: now,
                watermark: rec.prev.watermark,
                metadata: spec.metadata.clone(),
            };
            self.record_history(&mut held, i, entry);
            let shard = held.shard_of_name[i];
            if holder.listed {
                held.locked.state(shard).unlist_slot(held.slots[i]);
            }
            held.locked.state(shard).wake_first(&held.names[i]);
        }
        self.shards[lease.shard()].counters.released(held.mode);
        Ok(Released { watermark: stored })
    }

    /// Appends to name `i`'s history and keeps its shard within budget.
    fn record_history(&self, held: &mut HeldLease<'_>, i: usize, entry: NewEntry) {
        if self.cfg.history_per_name == 0 {
            return;
        }
        let slot = held.slots[i];
        let state = held.locked.state(held.shard_of_name[i]);
        let ShardState { slab, history, .. } = state;
        let rec = &mut slab[slot].as_mut().expect("occupied").rec;
        history.push(slot, &mut rec.history, entry, self.cfg.history_per_name);
        // Each step drops one entry that exists, so this loop runs about
        // once per push (a new entry pushes out roughly its own weight).
        let budget = self.cfg.history_budget_bytes / self.shards.len();
        while history.over_budget(budget) {
            let Some((seq, old_slot)) = history.pop_oldest() else {
                break;
            };
            let old = slab.get_mut(old_slot).and_then(Option::as_mut);
            if let Some(hist) = old.and_then(|e| e.rec.history.as_deref_mut()) {
                history.evict(hist, seq);
            }
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod concurrent_tests;

#[cfg(test)]
mod list_tests;
