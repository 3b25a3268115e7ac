//! The live leases the hub tracks for expiries: seeded from the table
//! after the hub wakes, kept up to date from the events it records, and
//! handed back to the table, earliest deadline first and a chunk at a
//! time, once their deadline passed (the table decides and reports each
//! expiry under its names' shard locks).
//!
//! Seeding reads every live lease, which at a million held names took
//! 2.5 s inline, on the request that woke the hub. It is done instead by
//! the periodic tick, some shards at a time ([`Hub::seed_work`]), each
//! under its own lock: the first watcher is answered at once, and a lease
//! whose deadline passes before its shard is read is still reported,
//! since the seeding takes every holder not yet reported expired whose
//! deadline is after the wake-up.

use std::sync::Arc;

use bagel_proto::Micros;

use super::{EventKind, Hub, Inner, NewEvent, lock};
use crate::table::LeaseId;

/// Expiries handed out by one [`Hub::tick`] or [`Hub::due`] call: the table
/// reports each under its names' shard locks, a chunk at a time, so neither
/// the hub's lock nor a shard's is held across a mass expiry.
pub const EXPIRY_CHUNK: usize = 1024;

/// A live lease, for expiries: when, and which names the table is to
/// check (the event itself is built from the table's record).
#[derive(Debug)]
pub(super) struct Live {
    pub(super) deadline: Micros,
    pub(super) names: Vec<Arc<str>>,
}

/// Where the seeding after a wake-up stands.
#[derive(Debug)]
pub(crate) struct Seeding {
    /// The next shard of the table to read.
    next: usize,
    /// When the hub woke: holders whose deadline is after it are tracked.
    since: Micros,
}

/// A chunk of seeding: read `shards` of the table, tracking with
/// [`Hub::track_seeded`] every holder not reported expired whose deadline
/// is after `since`.
#[derive(Debug)]
pub struct SeedWork {
    pub generation: u64,
    pub shards: std::ops::Range<usize>,
    pub since: Micros,
}

impl Hub {
    /// Starts seeding the live leases after a wake-up at `now` (the table
    /// calls it when a watch or a List woke the hub).
    pub fn seed_from(&self, now: Micros) {
        let mut inner = lock(&self.inner);
        if self.active() {
            inner.seeding = Some(Seeding { next: 0, since: now });
        }
    }

    /// The next `shards` of the `of` shards to seed, if seeding is under way.
    pub fn seed_work(&self, shards: usize, of: usize) -> Option<SeedWork> {
        let mut inner = lock(&self.inner);
        let generation = inner.generation;
        let seeding = inner.seeding.as_mut()?;
        let start = seeding.next;
        let end = (start + shards.max(1)).min(of);
        let since = seeding.since;
        seeding.next = end;
        if end >= of {
            inner.seeding = None;
        }
        Some(SeedWork {
            generation,
            shards: start..end,
            since,
        })
    }

    /// Whether seeding is under way.
    pub fn seeding(&self) -> bool {
        lock(&self.inner).seeding.is_some()
    }

    /// Live leases tracked for their expiry (~360 bytes each while the hub
    /// is active: the sizing's).
    pub fn tracked(&self) -> usize {
        lock(&self.inner).live.len()
    }

    /// Seeds a live lease's name (idempotent), read by a chunk of
    /// [`Hub::seed_work`] of `generation` (ignored if the hub went idle
    /// since). Called under the name's shard lock, so it is in order with
    /// the lease's events.
    pub fn track_seeded(&self, generation: u64, lease: LeaseId, name: &Arc<str>, deadline: Micros) {
        let mut inner = lock(&self.inner);
        if !self.active() || inner.generation != generation {
            return;
        }
        let live = inner.live.entry(lease).or_insert_with(|| Live {
            deadline,
            names: Vec::new(),
        });
        if !live.names.contains(name) {
            live.names.push(Arc::clone(name));
        }
        let deadline = live.deadline;
        inner.by_deadline.insert((deadline, lease));
    }

    pub(super) fn track_locked(inner: &mut Inner, e: &NewEvent) {
        match e.kind {
            EventKind::Granted | EventKind::Renewed | EventKind::Upgraded => {
                let live = inner.live.entry(e.lease).or_insert_with(|| Live {
                    deadline: e.deadline,
                    names: Vec::new(),
                });
                let old = live.deadline;
                live.deadline = e.deadline;
                if !live.names.contains(&e.name) {
                    live.names.push(Arc::clone(&e.name));
                }
                inner.by_deadline.remove(&(old, e.lease));
                inner.by_deadline.insert((e.deadline, e.lease));
            }
            EventKind::Released | EventKind::Broken => {
                if let Some(live) = inner.live.get_mut(&e.lease) {
                    live.names.retain(|n| *n != e.name);
                    if live.names.is_empty() {
                        let deadline = live.deadline;
                        inner.live.remove(&e.lease);
                        inner.by_deadline.remove(&(deadline, e.lease));
                    }
                }
            }
            EventKind::Expired => {}
        }
    }

    /// Up to `max` more leases whose deadline passed by `now` (see
    /// [`Hub::tick`]).
    pub fn due(&self, now: Micros, max: usize) -> Vec<(LeaseId, Vec<Arc<str>>)> {
        let mut inner = lock(&self.inner);
        if !self.active() {
            return Vec::new();
        }
        Self::due_locked(&mut inner, now, max)
    }

    pub(super) fn due_locked(inner: &mut Inner, now: Micros, max: usize) -> Vec<(LeaseId, Vec<Arc<str>>)> {
        let mut due = Vec::new();
        while due.len() < max
            && let Some(&(deadline, lease)) = inner.by_deadline.first()
        {
            if deadline > now {
                break;
            }
            inner.by_deadline.pop_first();
            if let Some(live) = inner.live.remove(&lease) {
                due.push((lease, live.names));
            }
        }
        due
    }
}
