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
//! its first name's record, whose holder carries the token and, for
//! multi-name leases, the other names. Renew and release of a one-name lease
//! thus take exactly one lock and no extra memory per lease. Memory per held
//! one-name lease is the record in the slab (~152 bytes), the map entry
//! (~24 bytes at 50-87% load) and the name itself.
//!
//! Locking rules: shard mutexes are never held across `.await` (the table
//! has no async code). A thread holding a shard lock only ever takes
//! higher-numbered shard locks.

mod accounts;
mod history;
mod ids;
mod queue;
mod record;
mod stats;

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bagel_proto::{Micros, pb};

pub use accounts::{Account, Accounts, HeldLimits, Usage};
pub use history::{HistoryEntry, HistoryEvent, Metadata, NameHistory};
pub use ids::{LeaseId, MAX_SHARDS, MAX_SLOTS, Token};
pub use queue::Ticket;
pub use record::{Ended, Holder, Mode, Previous};
pub use stats::{BreakEvent, ByMode, Census, Counts, Tracked};

use crate::error::{Conflict, Error};
use history::{HistoryLog, NewEntry};
use queue::Waiter;
use record::NameRecord;

/// Limits of the table. Validation of sizes happens at the edge; these are
/// the rules that need the clock or the state.
#[derive(Clone, Debug)]
pub struct TableConfig {
    /// Number of shards (at most [`MAX_SHARDS`]).
    pub shards: usize,
    /// A deadline must be later than `now + min_ttl`.
    pub min_ttl: Duration,
    /// A deadline may be at most `now + max_ttl`.
    pub max_ttl: Duration,
    /// When this incarnation started (its epoch).
    pub started: Micros,
    /// No grant before this instant (restart quarantine).
    pub ready_at: Micros,
    /// What a name with no record inherits at start.
    pub initial_floor: Micros,
    /// Idle name records kept before the oldest are forgotten.
    pub max_records: usize,
    /// History entries kept per name.
    pub history_per_name: usize,
    /// Bytes of history kept over all names.
    pub history_budget_bytes: usize,
    /// Acquires waiting for one name, and in all.
    pub max_waiters_per_name: usize,
    pub max_waiters: usize,
    /// Names held at once: in all, per owner, per peer.
    pub held: HeldLimits,
}

impl TableConfig {
    /// A config for tests: ready at once, floor zero.
    pub fn for_tests(max_ttl: Duration) -> Self {
        TableConfig {
            shards: 8,
            min_ttl: Duration::from_millis(1),
            max_ttl,
            started: Micros::ZERO,
            ready_at: Micros::ZERO,
            initial_floor: Micros::ZERO,
            max_records: 1_000_000,
            history_per_name: 8,
            history_budget_bytes: 1 << 20,
            max_waiters_per_name: 1024,
            max_waiters: 65_536,
            held: HeldLimits::default(),
        }
    }
}

/// An acquire request, validated at the edge: names sorted and unique.
#[derive(Clone, Debug)]
pub struct AcquireSpec {
    pub names: Vec<Arc<str>>,
    pub deadline: Micros,
    pub owner: Arc<str>,
    pub mode: Mode,
    /// The client's address, for the per-peer quota (`None`: not known).
    pub peer: Option<std::net::IpAddr>,
}

/// One name of a grant.
#[derive(Clone, Debug, PartialEq)]
pub struct NameGrant {
    pub name: Arc<str>,
    pub fencing: u64,
    pub previous: Previous,
}

/// A lease as granted, upgraded or renewed: what the witness states.
#[derive(Clone, Debug)]
pub struct Grant {
    pub lease: LeaseId,
    pub token: Token,
    pub owner: Arc<str>,
    pub mode: Mode,
    pub deadline: Micros,
    /// Max of the names' previous watermarks; writes must be strictly later.
    pub min_timestamp: Micros,
    pub names: Vec<NameGrant>,
}

/// The outcome of a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    /// The highest watermark now stored among the lease's names.
    pub watermark: Micros,
}

/// What a release says.
#[derive(Clone, Debug, Default)]
pub struct ReleaseSpec {
    pub watermark: Micros,
    pub signed_time: Option<Arc<pb::SignedTime>>,
    pub metadata: Option<Metadata>,
    /// Some write under the lease may still land (its outcome is unknown).
    pub unsettled: bool,
    /// The holder closed every bag that can hold a timestamp below this.
    pub settled_through: Micros,
}

/// A name's state for operators.
#[derive(Clone, Debug, PartialEq)]
pub struct NameView {
    pub name: Arc<str>,
    pub holder: Option<Holder>,
    /// The holder's owner.
    pub owner: Option<Arc<str>>,
    pub previous: Previous,
    pub fencing: u64,
    pub known: bool,
    /// Acquires waiting for the name.
    pub waiters: usize,
}

/// A name and its record, in a shard's slab.
#[derive(Debug)]
struct Entry {
    name: Arc<str>,
    rec: NameRecord,
}

/// Name → slot, as a hash table of bare 4-byte slot numbers: the names live
/// once, in the slab, and the table compares against them there. A hash
/// table can be half empty right after it grows, so its buckets must be
/// small; this keeps them at 4 bytes (a `HashMap<Arc<str>, u32>` takes 24).
#[derive(Debug, Default)]
struct SlotIndex {
    table: hashbrown::HashTable<u32>,
    /// Seeded per shard, independent of the shard-choosing hash (which
    /// would otherwise put the same low bits on every name of a shard).
    hasher: std::collections::hash_map::RandomState,
}

impl SlotIndex {
    fn find(&self, name: &str, slab: &[Option<Entry>]) -> Option<usize> {
        let hash = self.hasher.hash_one(name);
        self.table
            .find(hash, |&s| {
                slab[s as usize].as_ref().is_some_and(|e| &*e.name == name)
            })
            .map(|&s| s as usize)
    }

    /// Indexes `slot`, whose entry is already in `slab`.
    fn insert(&mut self, name: &str, slot: usize, slab: &[Option<Entry>]) {
        let hasher = &self.hasher;
        let rehash = |&s: &u32| {
            let entry = slab[s as usize].as_ref().expect("an indexed slot is occupied");
            hasher.hash_one(&*entry.name)
        };
        self.table
            .insert_unique(hasher.hash_one(name), slot as u32, rehash);
    }

    fn remove(&mut self, name: &str, slot: usize) {
        let hash = self.hasher.hash_one(name);
        if let Ok(entry) = self.table.find_entry(hash, |&s| s as usize == slot) {
            entry.remove();
        }
    }

    fn len(&self) -> usize {
        self.table.len()
    }
}

/// One shard: an index from name to slot, and the slab of records.
#[derive(Debug, Default)]
struct ShardState {
    slots: SlotIndex,
    slab: Vec<Option<Entry>>,
    free: Vec<u32>,
    history: HistoryLog,
    /// The shard's busiest names by grants, for operators.
    busiest: stats::Busiest,
    /// Acquires waiting for a name of this shard, first come first served
    /// (see `queue`). Only names with waiters have an entry.
    queues: std::collections::HashMap<Arc<str>, VecDeque<Arc<Waiter>>>,
    /// Tentative leases whose first name is in this shard and that a full
    /// acquire broke, until their deadline (see `LeaseTable::free_broken`).
    broken: std::collections::HashMap<LeaseId, Tombstone>,
}

/// Why a tentative lease is gone: every later call on it says so, whichever
/// of its names was taken.
#[derive(Clone, Debug)]
struct Tombstone {
    name: Arc<str>,
    by: LeaseId,
    deadline: Micros,
}

impl Tombstone {
    fn error(&self, lease: LeaseId) -> Error {
        Error::LostName {
            lease,
            name: Arc::clone(&self.name),
            by: self.by,
        }
    }
}

/// Tombstones kept per shard; beyond, the one nearest its deadline goes
/// (its lease then answers "unknown lease", like any forgotten one).
const TOMBSTONES_PER_SHARD: usize = 256;

/// A tentative lease a full acquire just broke on `name`.
#[derive(Debug)]
struct Broken {
    lease: LeaseId,
    deadline: Micros,
    name: Arc<str>,
    /// Its names, when the broken name was its first (whose holder lists
    /// them); otherwise found from the first name's record.
    names: Option<Vec<Arc<str>>>,
}

impl ShardState {
    fn slot_of(&self, name: &str) -> Option<usize> {
        self.slots.find(name, &self.slab)
    }

    fn get(&self, name: &str) -> Option<&NameRecord> {
        let slot = self.slot_of(name)?;
        self.slab[slot].as_ref().map(|e| &e.rec)
    }

    fn at(&self, slot: usize) -> Option<&Entry> {
        self.slab.get(slot)?.as_ref()
    }

    fn rec_mut(&mut self, slot: usize) -> &mut NameRecord {
        &mut self.slab[slot].as_mut().expect("slot is occupied").rec
    }

    /// The slot of `name`, creating a fresh record (inheriting `floor` and
    /// `fencing_floor`) if it has none.
    fn slot_or_insert(
        &mut self,
        name: &Arc<str>,
        floor: Micros,
        fencing_floor: u64,
        now: Micros,
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
                // Grow by a quarter, not double: at a million names a
                // doubled slab would waste up to half its memory.
                if self.slab.len() == self.slab.capacity() {
                    self.slab.reserve_exact((self.slab.len() / 4).max(64));
                }
                self.slab.push(None);
                self.slab.len() - 1
            }
        };
        self.slab[slot] = Some(Entry {
            name: Arc::clone(name),
            rec: NameRecord::new(floor, fencing_floor, now),
        });
        self.slots.insert(name, slot, &self.slab);
        Ok(slot)
    }

    /// Wakes the first acquire waiting for `name`, which just became free.
    fn wake_first(&self, name: &str) {
        if self.queues.is_empty() {
            return;
        }
        if let Some(first) = self.queues.get(name).and_then(|q| q.front()) {
            first.wake.notify_one();
        }
    }

    /// Takes `waiter` out of `name`'s queue; if it was first, the next one
    /// becomes first and is woken to watch the holder itself.
    fn dequeue(&mut self, name: &str, waiter: &Arc<Waiter>) {
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

    fn remove_slot(&mut self, slot: usize) -> Option<Entry> {
        let entry = self.slab.get_mut(slot)?.take()?;
        self.slots.remove(&entry.name, slot);
        self.free.push(slot as u32);
        Some(entry)
    }
}

#[derive(Debug, Default)]
struct Shard {
    state: Mutex<ShardState>,
    counters: stats::ShardCounters,
}

impl Shard {
    fn lock(&self) -> MutexGuard<'_, ShardState> {
        // A panic while holding a shard lock leaves consistent data (every
        // mutation happens after all checks), so poisoning is ignored rather
        // than taking the whole server down.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The shards of one request, locked in ascending order.
struct Locked<'a> {
    order: Vec<usize>,
    guards: Vec<MutexGuard<'a, ShardState>>,
}

impl Locked<'_> {
    fn state(&mut self, shard: usize) -> &mut ShardState {
        let pos = self.order.binary_search(&shard).expect("shard was locked");
        &mut self.guards[pos]
    }
}

/// A lease found and checked: its shards locked, names and deadline.
struct HeldLease<'a> {
    locked: Locked<'a>,
    names: Vec<Arc<str>>,
    shard_of_name: Vec<usize>,
    deadline: Micros,
    mode: Mode,
}

impl HeldLease<'_> {
    fn rec(&mut self, i: usize) -> &mut NameRecord {
        let shard = self.shard_of_name[i];
        let state = self.locked.state(shard);
        let slot = state.slot_of(&self.names[i]).expect("held names have records");
        state.rec_mut(slot)
    }
}

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
            cfg,
            shards,
            hasher: Default::default(),
            stats: Default::default(),
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
            return Err(Error::out_of_range(
                "deadline_us",
                format!(
                    "{} ({deadline}) must lie in (now + min_ttl, now + max_ttl] = ({}, {}] \
                     (min_ttl {:?}, max_ttl {:?}, server now {})",
                    deadline.as_micros(),
                    lo.as_micros(),
                    hi.as_micros(),
                    self.cfg.min_ttl,
                    self.cfg.max_ttl,
                    now,
                ),
            ));
        }
        Ok(())
    }

    fn check_ready(&self, now: Micros) -> Result<(), Error> {
        if now < self.cfg.ready_at {
            return Err(Error::NotReady {
                started: self.cfg.started,
                ready_at: self.cfg.ready_at,
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

        // 1. Check every name; nothing changes if one is refused.
        for (name, &shard) in spec.names.iter().zip(&shard_of_name) {
            let Some(rec) = locked.state(shard).get(name) else {
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
        for (name, &shard) in spec.names.iter().zip(&shard_of_name) {
            match locked
                .state(shard)
                .slot_or_insert(name, floor, fencing_floor, now)
            {
                Ok(slot) => slots.push(slot),
                Err(e) => {
                    self.accounts.unhold(&account, spec.names.len());
                    return Err(e);
                }
            }
        }

        // 3. Grant.
        let lease = LeaseId::new(now, shard_of_name[0], slots[0]);
        let token = Token::generate();
        let mut names = Vec::with_capacity(spec.names.len());
        let mut min_timestamp = Micros::ZERO;
        let mut broken: Vec<Broken> = Vec::new();
        for (i, (name, &shard)) in spec.names.iter().zip(&shard_of_name).enumerate() {
            let state = locked.state(shard);
            state.busiest.observe(name);
            let rec = state.rec_mut(slots[i]);
            let counters = &self.shards[shard].counters;
            (self.stats).replacing(counters, shard, slots[i], name, rec, lease, now);
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
            min_timestamp = min_timestamp.max(previous.watermark);
            self.end_holding(rec);
            rec.charge(&account);
            rec.prev = previous.clone();
            rec.fencing = fencing;
            rec.last_change = now;
            rec.holder = Some(Holder {
                lease,
                token,
                deadline: spec.deadline,
                mode: spec.mode,
                counted: true,
                all_names: (i == 0 && spec.names.len() > 1).then(|| Box::new(spec.names.clone())),
            });
            names.push(NameGrant {
                name: Arc::clone(name),
                fencing,
                previous,
            });
        }
        self.shards[shard_of_name[0]].counters.granted(spec.mode);
        drop(locked);
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
        if !holder.token.matches(token) {
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
            None => vec![Arc::clone(&entry.name)],
        };
        let seen_deadline = holder.deadline;
        let shard_of_name: Vec<usize> = names.iter().map(|n| self.shard_of(n)).collect();

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
            let holder = state.get(&held.names[i]).and_then(|r| r.holder.as_ref());
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
                            None => vec![Arc::clone(&e.name)],
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
                // A tentative holder leaves no trace in the chain.
                self.end_holding(rec);
                rec.holder = None;
                rec.last_change = now;
                state.wake_first(name);
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
        for i in 0..held.names.len() {
            let name = Arc::clone(&held.names[i]);
            let rec = held.rec(i);
            min_timestamp = min_timestamp.max(rec.prev.watermark);
            owner.get_or_insert_with(|| rec.owner());
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
        self.check_deadline(new_deadline, now)?;
        let new_deadline = new_deadline.max(held.deadline);
        for i in 0..held.names.len() {
            let rec = held.rec(i);
            let holder = rec.holder.as_mut().expect("checked by lock_lease");
            holder.deadline = new_deadline;
            rec.last_change = now;
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
        for i in 0..held.names.len() {
            let rec = held.rec(i);
            rec.holder.as_mut().expect("checked by lock_lease").mode = Mode::Full;
            rec.last_change = now;
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
            let rec = held.rec(i);
            self.end_holding(rec);
            let owner = rec.owner();
            let holder = rec.holder.take().expect("checked by lock_lease");
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
            rec.last_change = now;
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
        let name = &held.names[i];
        let state = held.locked.state(held.shard_of_name[i]);
        let slot = state.slot_of(name).expect("held names have records");
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

    /// Housekeeping, run periodically: forgets the oldest idle name records
    /// beyond the record budget. Returns how many records were forgotten.
    pub fn sweep(&self, now: Micros) -> usize {
        let per_shard = self.cfg.max_records.div_ceil(self.shards.len());
        let forgotten = self
            .shards
            .iter()
            .enumerate()
            .map(|(i, s)| self.forget_idle(i, s, per_shard, now))
            .sum();
        self.accounts.sweep();
        forgotten
    }

    /// Names held in all (counted: not released, broken or swept).
    pub fn held(&self) -> usize {
        self.accounts.held()
    }

    /// What `owner` holds and has records of.
    pub fn owner_usage(&self, owner: &str) -> Option<Arc<Usage>> {
        self.accounts.owner_usage(owner)
    }

    /// Housekeeping of one shard: holders whose deadline passed stop
    /// counting against their account's quota, and beyond `cap` records the
    /// idle ones are forgotten, down to 90% of it (so the work is
    /// amortised).
    ///
    /// Which idle records go: those charged to the peer with the most
    /// records first, then to the owner with the most, then the least
    /// recently changed. So a client churning through names loses its own
    /// records, not other clients' (it used to be the oldest, whoever's).
    ///
    /// Before a record goes, the forgotten floor is raised to the watermark
    /// its next holder would have inherited, under the shard lock: whoever
    /// later creates the name afresh (also under this lock) inherits at
    /// least that. Forgetting thus never lets a new holder write below an
    /// old holder's messages; it only loses the lease-id chain.
    fn forget_idle(&self, index: usize, shard: &Shard, cap: usize, now: Micros) -> usize {
        let mut state = shard.lock();
        // A broken tentative lease past its deadline would be refused as
        // expired anyway; after one more max TTL nobody asks.
        let keep_until = now.saturating_sub(self.cfg.max_ttl);
        state.broken.retain(|_, t| t.deadline > keep_until);
        for entry in state.slab.iter_mut().flatten() {
            if entry
                .rec
                .holder
                .as_ref()
                .is_some_and(|h| h.counted && !h.is_live(now))
            {
                self.end_holding(&mut entry.rec);
            }
        }
        if state.slots.len() <= cap {
            return 0;
        }
        let target = cap - cap / 10;
        let excess = state.slots.len() - target;
        type Key = (std::cmp::Reverse<(usize, usize)>, Micros, usize);
        let mut idle: Vec<Key> = state
            .slab
            .iter()
            .enumerate()
            .filter_map(|(slot, e)| e.as_ref().map(|e| (slot, &e.rec)))
            .filter(|(_, r)| r.is_idle(now))
            .map(|(slot, r)| {
                let weight = r.account.as_ref().map_or((0, 0), |a| a.weight());
                (std::cmp::Reverse(weight), r.last_change, slot)
            })
            .collect();
        let take = excess.min(idle.len());
        if take == 0 {
            return 0;
        }
        if take < idle.len() {
            idle.select_nth_unstable(take - 1);
        }
        for &(_, _, slot) in &idle[..take] {
            let mut entry = state.remove_slot(slot).expect("listed above");
            (self.stats).forgetting(&shard.counters, index, slot, entry.rec.holder.as_ref());
            self.end_holding(&mut entry.rec);
            if let Some(account) = entry.rec.account.take() {
                account.sub_record();
            }
            let inherited = entry.rec.inherit(now).watermark.as_micros();
            if self.floor.fetch_max(inherited, Ordering::AcqRel) < inherited {
                self.stats.floor_raises.fetch_add(1, Ordering::Relaxed);
            }
            self.fencing_floor.fetch_max(entry.rec.fencing, Ordering::AcqRel);
            if let Some(h) = &entry.rec.history {
                state.history.forget(h);
            }
        }
        take
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod concurrent_tests;
