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
//! This file holds the table itself, the locking every rule shares (shard
//! of a name, shards locked in order) and the checks every grant makes.
//! The rules that change leases each have a file: `acquire` (granting,
//! breaking tentative leases), `waiting` (acquires queued on a busy name),
//! `held` (renew, upgrade, release of a held lease), `expiry` (reporting
//! expiries to watchers). Around them: `spec` (requests and answers),
//! `shard` (one shard's index, slab, queues and the lock guards), `record`
//! (a name's record), `ids`, `history`, `queue` (waiters), `accounts`
//! (quotas), `views` (describe, history, counts for operators), `stats`,
//! `sweep` (forgetting idle records).

mod accounts;
mod acquire;
mod expiry;
mod held;
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
mod waiting;

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

use crate::error::Error;
use crate::watch::Hub;

pub use expiry::EXPIRY_PER_TICK;
use record::NameRecord;
use shard::{Locked, Shard};
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
        let mark = self.grant_limit.load(Ordering::Acquire);
        if deadline.as_micros() > mark {
            return Err(Error::MarkBehind {
                deadline,
                mark: Micros::from_micros(mark),
            });
        }
        Ok(())
    }

    /// The deadline rule every backend checks (`LeaseLimits`), against
    /// this table's TTL range.
    fn check_range(&self, deadline: Micros, now: Micros) -> Result<(), Error> {
        let rules = bagel_lease_core::LeaseLimits {
            min_ttl: self.cfg.min_ttl,
            max_ttl: self.cfg.max_ttl,
            ..bagel_lease_core::LeaseLimits::default()
        };
        Ok(rules.check_deadline(deadline, now)?)
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
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod concurrent_tests;

#[cfg(test)]
mod list_tests;
