//! The lease table: every rule about leases, with no gRPC and no clock of
//! its own. Every method takes `now`, so tests drive time exactly.
//!
//! # Sharding and locking
//!
//! Names are spread over a fixed array of shards, each a `std::sync::Mutex`
//! around a `HashMap`. A request locks the shards of its names **in
//! ascending shard order, all at once**, checks every name, then commits
//! every name: that makes multi-name acquires all-or-nothing and
//! deadlock-free, and requests on names in different shards never contend.
//!
//! Why not a `DashMap` of names: an all-or-nothing acquire must hold several
//! names at once. DashMap locks a shard per key access in an order we do not
//! control, and two live guards into one DashMap can deadlock when their keys
//! share a shard. A shard array gives us the global lock order explicitly.
//! The lease index (lease id → names), where every operation touches exactly
//! one key, is a `DashMap`.
//!
//! Locking rules: shard mutexes are never held across `.await` (the table
//! has no async code) and never while touching the index; the index's guards
//! are dropped before a shard is locked, except in `sweep`, which locks no
//! shard while iterating the index.

mod history;
mod ids;
mod record;

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bagel_proto::{Micros, duration_micros, pb};
use dashmap::DashMap;
use tokio::sync::Notify;

pub use history::{HistoryEntry, HistoryEvent, Metadata, NameHistory};
pub use ids::{LeaseId, Token};
pub use record::{Ended, Holder, Mode, Previous};

use crate::error::{Conflict, Error};
use history::{HistoryLog, NewEntry};
use record::NameRecord;

/// Limits of the table. Validation of sizes happens at the edge; these are
/// the rules that need the clock or the state.
#[derive(Clone, Debug)]
pub struct TableConfig {
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
    /// How long after its deadline a lease id still gets a precise "expired"
    /// answer rather than "unknown".
    pub index_grace: Duration,
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
            index_grace: max_ttl,
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
#[derive(Clone, Debug)]
pub struct ReleaseSpec {
    pub watermark: Micros,
    pub signed_time: Option<Arc<pb::SignedTime>>,
    pub metadata: Option<Metadata>,
}

/// A name's state for operators.
#[derive(Clone, Debug, PartialEq)]
pub struct NameView {
    pub name: Arc<str>,
    pub holder: Option<Holder>,
    pub previous: Previous,
    pub fencing: u64,
    pub known: bool,
}

/// The lease id → names index entry.
#[derive(Debug)]
struct LeaseRef {
    names: Arc<[Arc<str>]>,
    token: Token,
    /// Mirrors the names' holder deadline, so the sweeper can drop ended
    /// leases without locking shards.
    deadline: AtomicU64,
}

#[derive(Debug, Default)]
struct ShardState {
    records: HashMap<Arc<str>, NameRecord>,
    history: HistoryLog,
}

#[derive(Debug, Default)]
struct Shard {
    state: Mutex<ShardState>,
    /// Woken when a name of the shard is released, for bounded waiters.
    released: Notify,
    waiters: AtomicUsize,
}

impl Shard {
    fn lock(&self) -> MutexGuard<'_, ShardState> {
        // A panic while holding a shard lock leaves consistent data (every
        // mutation is a single assignment after all checks), so poisoning
        // is ignored rather than taking the whole server down.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wake_waiters(&self) {
        if self.waiters.load(Ordering::Acquire) > 0 {
            self.released.notify_waiters();
        }
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

/// The in-RAM lease table. Share it behind an `Arc`.
#[derive(Debug)]
pub struct LeaseTable {
    cfg: TableConfig,
    shards: Box<[Shard]>,
    hasher: std::collections::hash_map::RandomState,
    index: DashMap<LeaseId, LeaseRef>,
    /// What names with no record inherit as their previous watermark; only
    /// ever raised (see `forget_idle`).
    floor: AtomicU64,
}

impl LeaseTable {
    pub fn new(cfg: TableConfig) -> Self {
        let shards = (0..cfg.shards.max(1)).map(|_| Shard::default()).collect();
        LeaseTable {
            floor: AtomicU64::new(cfg.initial_floor.as_micros()),
            cfg,
            shards,
            hasher: Default::default(),
            index: DashMap::new(),
        }
    }

    pub fn config(&self) -> &TableConfig {
        &self.cfg
    }

    pub fn forgotten_floor(&self) -> Micros {
        Micros::from_micros(self.floor.load(Ordering::Acquire))
    }

    /// Number of leases in the index (live or recently ended).
    pub fn lease_count(&self) -> usize {
        self.index.len()
    }

    /// Number of name records held.
    pub fn record_count(&self) -> usize {
        self.shards.iter().map(|s| s.lock().records.len()).sum()
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

    /// Refuses a deadline outside `(now + min_ttl, now + max_ttl]`.
    pub fn check_deadline(&self, deadline: Micros, now: Micros) -> Result<(), Error> {
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
        self.check_ready(now)?;
        self.check_deadline(spec.deadline, now)?;
        let shard_of_name: Vec<usize> = spec.names.iter().map(|n| self.shard_of(n)).collect();
        let mut locked = self.lock_shards(&shard_of_name);

        for (name, &shard) in spec.names.iter().zip(&shard_of_name) {
            let Some(rec) = locked.state(shard).records.get(name) else {
                continue;
            };
            if let Some(h) = rec.live_holder(now) {
                let breakable = h.mode == Mode::Tentative && spec.mode == Mode::Full;
                if !breakable {
                    return Err(Error::Conflict(Box::new(Conflict {
                        name: Arc::clone(name),
                        holder: h.lease,
                        owner: Arc::clone(&h.owner),
                        mode: h.mode,
                        deadline: h.deadline,
                    })));
                }
            }
        }

        let lease = LeaseId::generate(now);
        let token = Token::generate();
        let floor = self.forgotten_floor();
        let mut names = Vec::with_capacity(spec.names.len());
        let mut min_timestamp = Micros::ZERO;
        for (name, &shard) in spec.names.iter().zip(&shard_of_name) {
            let rec = locked
                .state(shard)
                .records
                .entry(Arc::clone(name))
                .or_insert_with(|| NameRecord::new(floor, now));
            let previous = rec.inherit(now);
            let fencing = rec.next_fencing(now);
            min_timestamp = min_timestamp.max(previous.watermark);
            rec.prev = previous.clone();
            rec.fencing = fencing;
            rec.last_change = now;
            rec.holder = Some(Holder {
                lease,
                owner: Arc::clone(&spec.owner),
                deadline: spec.deadline,
                fencing,
                mode: spec.mode,
            });
            names.push(NameGrant {
                name: Arc::clone(name),
                fencing,
                previous,
            });
        }
        drop(locked);

        self.index.insert(
            lease,
            LeaseRef {
                names: spec.names.iter().cloned().collect(),
                token,
                deadline: AtomicU64::new(spec.deadline.as_micros()),
            },
        );
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

    /// Finds a lease and checks its token. Returns its names and deadline;
    /// the index guard is dropped before returning.
    fn authenticate(&self, lease: LeaseId, token: &Token) -> Result<(Arc<[Arc<str>]>, Micros), Error> {
        let entry = self.index.get(&lease).ok_or(Error::UnknownLease { lease })?;
        if !entry.token.matches(token) {
            return Err(Error::WrongToken { lease });
        }
        let deadline = Micros::from_micros(entry.deadline.load(Ordering::Acquire));
        Ok((Arc::clone(&entry.names), deadline))
    }

    /// Locks the lease's shards and checks the lease still holds every name
    /// at `now`. On success, returns the locked shards and each name's shard.
    fn lock_held(
        &self,
        lease: LeaseId,
        names: &[Arc<str>],
        deadline: Micros,
        now: Micros,
    ) -> Result<(Locked<'_>, Vec<usize>), Error> {
        let shard_of_name: Vec<usize> = names.iter().map(|n| self.shard_of(n)).collect();
        let mut locked = self.lock_shards(&shard_of_name);
        for (name, &shard) in names.iter().zip(&shard_of_name) {
            let holder = locked
                .state(shard)
                .records
                .get(name)
                .and_then(|r| r.holder.as_ref());
            match holder {
                Some(h) if h.lease == lease => {
                    if !h.is_live(now) {
                        return Err(Error::Expired {
                            lease,
                            deadline: h.deadline,
                        });
                    }
                }
                Some(h) if now < deadline => {
                    return Err(Error::LostName {
                        lease,
                        name: Arc::clone(name),
                        by: h.lease,
                    });
                }
                // Taken over after our deadline, or forgotten after it.
                _ => return Err(Error::Expired { lease, deadline }),
            }
        }
        Ok((locked, shard_of_name))
    }

    /// Describes the lease as currently held, for a witness. The caller
    /// holds the shard locks and has checked the lease holds every name.
    fn describe_held(
        locked: &mut Locked<'_>,
        lease: LeaseId,
        token: Token,
        names: &[Arc<str>],
        shard_of_name: &[usize],
    ) -> Grant {
        let mut grants = Vec::with_capacity(names.len());
        let mut min_timestamp = Micros::ZERO;
        let mut head: Option<Holder> = None;
        for (name, &shard) in names.iter().zip(shard_of_name) {
            let rec = &locked.state(shard).records[name];
            let h = rec.holder.as_ref().expect("checked by lock_held");
            min_timestamp = min_timestamp.max(rec.prev.watermark);
            grants.push(NameGrant {
                name: Arc::clone(name),
                fencing: h.fencing,
                previous: rec.prev.clone(),
            });
            head.get_or_insert_with(|| h.clone());
        }
        let head = head.expect("a lease has at least one name");
        Grant {
            lease,
            token,
            owner: head.owner,
            mode: head.mode,
            deadline: head.deadline,
            min_timestamp,
            names: grants,
        }
    }

    /// Moves a live lease's deadline. A deadline may not move earlier: the
    /// holder may already have written up to the current one, and a break
    /// after an earlier deadline would hand the next holder a watermark
    /// below those writes.
    pub fn renew(
        &self,
        lease: LeaseId,
        token: &Token,
        new_deadline: Micros,
        metadata: Option<Metadata>,
        now: Micros,
    ) -> Result<Grant, Error> {
        let (names, deadline) = self.authenticate(lease, token)?;
        let (mut locked, shard_of_name) = self.lock_held(lease, &names, deadline, now)?;
        self.check_deadline(new_deadline, now)?;
        if new_deadline < deadline {
            return Err(Error::out_of_range(
                "deadline_us",
                format!(
                    "{} must not be earlier than the lease's current deadline {} ({deadline})",
                    new_deadline.as_micros(),
                    deadline.as_micros()
                ),
            ));
        }
        for (name, &shard) in names.iter().zip(&shard_of_name) {
            let state = locked.state(shard);
            let ShardState { records, history } = &mut *state;
            let rec = records.get_mut(name).expect("checked by lock_held");
            let holder = rec.holder.as_mut().expect("checked by lock_held");
            holder.deadline = new_deadline;
            let owner = Arc::clone(&holder.owner);
            rec.last_change = now;
            if let Some(metadata) = &metadata {
                let entry = NewEntry {
                    lease,
                    owner,
                    event: HistoryEvent::Renewed,
                    at: now,
                    watermark: rec.prev.watermark,
                    metadata: Some(metadata.clone()),
                };
                history.push(name, &mut rec.history, entry, self.cfg.history_per_name);
                self.enforce_history_budget(state);
            }
        }
        let grant = Self::describe_held(&mut locked, lease, *token, &names, &shard_of_name);
        drop(locked);
        if let Some(entry) = self.index.get(&lease) {
            entry.deadline.store(new_deadline.as_micros(), Ordering::Release);
        }
        Ok(grant)
    }

    /// Turns a tentative lease into a full one. Fails if any of its names
    /// was broken by a full acquire meanwhile. Upgrading a full lease
    /// changes nothing and succeeds.
    pub fn upgrade(&self, lease: LeaseId, token: &Token, now: Micros) -> Result<Grant, Error> {
        let (names, deadline) = self.authenticate(lease, token)?;
        let (mut locked, shard_of_name) = self.lock_held(lease, &names, deadline, now)?;
        for (name, &shard) in names.iter().zip(&shard_of_name) {
            let rec = locked.state(shard).records.get_mut(name).expect("checked");
            rec.holder.as_mut().expect("checked").mode = Mode::Full;
            rec.last_change = now;
        }
        Ok(Self::describe_held(
            &mut locked,
            lease,
            *token,
            &names,
            &shard_of_name,
        ))
    }

    /// Ends a live lease, storing its watermark for the next holder.
    ///
    /// The watermark must be below the deadline. Stored watermarks never
    /// decrease: a holder that wrote nothing (watermark 0, or one below what
    /// it inherited) carries the inherited one forward. A tentative lease
    /// could not write, so it must say 0 and leaves no trace in the chain.
    pub fn release(
        &self,
        lease: LeaseId,
        token: &Token,
        spec: ReleaseSpec,
        now: Micros,
    ) -> Result<Released, Error> {
        let (names, deadline) = self.authenticate(lease, token)?;
        let (mut locked, shard_of_name) = self.lock_held(lease, &names, deadline, now)?;
        if spec.watermark >= deadline {
            return Err(Error::out_of_range(
                "watermark_us",
                format!(
                    "{} must be below the lease deadline {} ({deadline})",
                    spec.watermark.as_micros(),
                    deadline.as_micros()
                ),
            ));
        }
        // Every name of a lease has the same mode (upgrade changes all).
        let mode = locked.state(shard_of_name[0]).records[&names[0]]
            .holder
            .as_ref()
            .expect("checked by lock_held")
            .mode;
        if mode == Mode::Tentative && spec.watermark != Micros::ZERO {
            return Err(Error::invalid(
                "watermark_us",
                "must be 0 when releasing a tentative lease: it had no right to write",
            ));
        }
        let mut stored = Micros::ZERO;
        for (name, &shard) in names.iter().zip(&shard_of_name) {
            let state = locked.state(shard);
            let ShardState { records, history } = &mut *state;
            let rec = records.get_mut(name).expect("checked by lock_held");
            let holder = rec.holder.take().expect("checked by lock_held");
            if holder.mode == Mode::Full {
                rec.prev = Previous {
                    lease: Some(lease),
                    watermark: rec.prev.watermark.max(spec.watermark),
                    watermark_signed_time: spec.signed_time.clone(),
                    ended: Ended::Released,
                    ended_at: now,
                };
            }
            stored = stored.max(rec.prev.watermark);
            rec.last_change = now;
            let entry = NewEntry {
                lease,
                owner: holder.owner,
                event: HistoryEvent::Released,
                at: now,
                watermark: rec.prev.watermark,
                metadata: spec.metadata.clone(),
            };
            history.push(name, &mut rec.history, entry, self.cfg.history_per_name);
            self.enforce_history_budget(state);
        }
        drop(locked);
        self.index.remove(&lease);
        for &shard in &shard_of_name {
            self.shards[shard].wake_waiters();
        }
        Ok(Released { watermark: stored })
    }

    fn enforce_history_budget(&self, state: &mut ShardState) {
        let budget = self.cfg.history_budget_bytes / self.shards.len();
        while state.history.over_budget(budget) {
            let Some((name, seq)) = state.history.pop_oldest() else {
                break;
            };
            if let Some(hist) = state
                .records
                .get_mut(&name)
                .and_then(|r| r.history.as_deref_mut())
            {
                state.history.evict(hist, seq);
            }
        }
    }

    pub fn describe(&self, names: &[Arc<str>], now: Micros) -> Vec<NameView> {
        let floor = self.forgotten_floor();
        names
            .iter()
            .map(|name| {
                let shard = self.shards[self.shard_of(name)].lock();
                match shard.records.get(name) {
                    None => NameView {
                        name: Arc::clone(name),
                        holder: None,
                        previous: Previous::unknown(floor),
                        fencing: 0,
                        known: false,
                    },
                    Some(rec) => {
                        let holder = rec.live_holder(now).cloned();
                        NameView {
                            name: Arc::clone(name),
                            previous: if holder.is_some() {
                                rec.prev.clone()
                            } else {
                                rec.inherit(now)
                            },
                            holder,
                            fencing: rec.fencing,
                            known: true,
                        }
                    }
                }
            })
            .collect()
    }

    /// The name's recent history, oldest first, and whether some was dropped.
    pub fn history(&self, name: &str) -> (Vec<HistoryEntry>, bool) {
        let shard = self.shards[self.shard_of(name)].lock();
        match shard.records.get(name).and_then(|r| r.history.as_deref()) {
            None => (Vec::new(), false),
            Some(h) => (h.entries.iter().cloned().collect(), h.truncated),
        }
    }

    /// Something to wait on until a name of `name`'s shard is released.
    /// Call [`WaitGuard::notified`] *before* retrying, so no release is
    /// missed between the retry and the wait.
    pub fn wait_handle(&self, name: &str) -> WaitGuard<'_> {
        let shard = &self.shards[self.shard_of(name)];
        shard.waiters.fetch_add(1, Ordering::AcqRel);
        WaitGuard { shard }
    }

    /// Housekeeping, run periodically: drops index entries of leases ended
    /// long enough ago, and forgets the oldest idle name records beyond the
    /// record budget. Returns how many records were forgotten.
    pub fn sweep(&self, now: Micros) -> usize {
        let grace = duration_micros(self.cfg.index_grace);
        self.index
            .retain(|_, l| l.deadline.load(Ordering::Acquire).saturating_add(grace) > now.as_micros());
        let per_shard = self.cfg.max_records.div_ceil(self.shards.len());
        self.shards
            .iter()
            .map(|s| self.forget_idle(s, per_shard, now))
            .sum()
    }

    /// Forgets the least recently changed idle records of a shard beyond
    /// `cap`, down to 90% of it (so the work is amortised).
    ///
    /// Before a record goes, the forgotten floor is raised to the watermark
    /// its next holder would have inherited, under the shard lock: whoever
    /// later creates the name afresh (also under this lock) inherits at
    /// least that. Forgetting thus never lets a new holder write below an
    /// old holder's messages; it only loses the lease-id chain.
    fn forget_idle(&self, shard: &Shard, cap: usize, now: Micros) -> usize {
        let mut state = shard.lock();
        if state.records.len() <= cap {
            return 0;
        }
        let target = cap - cap / 10;
        let excess = state.records.len() - target;
        let mut idle: Vec<(Micros, Arc<str>)> = state
            .records
            .iter()
            .filter(|(_, r)| r.is_idle(now))
            .map(|(n, r)| (r.last_change, Arc::clone(n)))
            .collect();
        let take = excess.min(idle.len());
        if take == 0 {
            return 0;
        }
        if take < idle.len() {
            idle.select_nth_unstable(take - 1);
        }
        let ShardState { records, history } = &mut *state;
        for (_, name) in &idle[..take] {
            let rec = records.remove(name).expect("listed above");
            self.floor
                .fetch_max(rec.inherit(now).watermark.as_micros(), Ordering::AcqRel);
            if let Some(h) = &rec.history {
                history.forget(h);
            }
        }
        take
    }
}

/// Registration as a waiter on a shard; see [`LeaseTable::wait_handle`].
#[derive(Debug)]
pub struct WaitGuard<'a> {
    shard: &'a Shard,
}

impl WaitGuard<'_> {
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.shard.released.notified()
    }
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.shard.waiters.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests;
