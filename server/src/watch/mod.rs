//! The watch hub: lease events (grants, renewals, upgrades, releases,
//! breaks, expiries) numbered by revision and fanned out to the watchers
//! that want them, each through a bounded queue of shared events.
//!
//! * **Nobody watching costs one relaxed load.** The table calls
//!   [`Hub::active`] before it builds an event; the hub is active from the
//!   first watcher (or List, see [`Hub::keep_for_list`]) on until
//!   [`WatchConfig::linger`] after the last one left (so a watcher dropped
//!   for being slow can come back and resume, and a client that listed can
//!   start watching from the List's revision).
//! * **Revisions** grow by one per event. The high [`INCARNATION_BITS`]
//!   bits are the incarnation ([`incarnation`]: from the start time and the
//!   server id), the low [`COUNT_BITS`] count events. A resume from a
//!   revision whose incarnation is not ours is refused
//!   ([`WatchError::OtherIncarnation`]): before, revisions were the start
//!   time in microseconds plus a count, so after a restart (with the clock
//!   stepped back, or a busy earlier life) or on another server an old
//!   revision could fall among ours and be taken for one. Events are not
//!   recorded while the hub is inactive; waking up skips one revision,
//!   which marks the gap.
//! * **Retention**: the last [`WatchConfig::retain`] events (within
//!   [`WatchConfig::retain_bytes`]) are kept in one ring of `Arc`s, the
//!   only copy of an event: a watcher's queue holds pointers into it, and a
//!   watcher resuming from a revision reads the ring a chunk at a time (a
//!   bounded view, never a copy per watcher: 1,000 watchers resuming from
//!   the oldest of 10,000 events each copied them, 1.6 GB). A revision
//!   older than the ring (or from before a gap) is refused naming the
//!   oldest one resumable; a resume the ring moves past ends as an
//!   overflow.
//! * **Dispatch** goes through an index (names, prefixes by length, and the
//!   watchers of every name): an event is offered only to the watchers that
//!   want it ([`WatchStats::dispatched`]), so watchers of other names cost a
//!   lease event nothing (never a check of every watcher's filter).
//! * **Slow watchers**: each watcher queues at most
//!   [`WatchConfig::buffer`] events. A watcher whose queue is full when an
//!   event comes is dropped; it receives what was queued, then
//!   [`WatchError::Overflow`] naming the limit and the last revision it got;
//!   one resuming from the ring that the ring moves past before it read its
//!   events, with [`WatchError::ResumeOverrun`] naming the retention bound.
//!   One owed events that takes none for [`WatchConfig::stall`] (its client
//!   reads nothing) is ended with [`WatchError::Stalled`], its queue freed
//!   at once (see [`Hub::tick`]).
//! * **Progress**: [`Subscription::progress`] says up to which revision a
//!   watcher has been sent everything it asked for (read under the hub's
//!   lock with its buffer empty, so no event it wants is numbered at or
//!   below it and still unsent), for the progress messages of quiet
//!   streams.
//! * **Expiries** happen without a request: the hub tracks the deadline of
//!   every live lease while active (seeded from the table by the ticks
//!   after it wakes up, a few shards at a time,
//!   see `LeaseTable::watch`), and [`Hub::tick`] hands the table the leases
//!   whose deadline passed. The table decides and reports each expiry under
//!   the name's shard lock (`LeaseTable::watch_tick`), in order with the
//!   lease's other events: the hub reporting them on its own clock let a
//!   watcher see Expired and then Renewed for one lease (a renewal whose
//!   `now` was read just before the deadline).
//!
//! Locking: the table publishes while holding shard locks, so the hub's
//! mutex is always taken inside shard locks, never around them; under it a
//! publish only numbers the event, appends it to the ring and queues it for
//! the watchers that match (each queue's own lock, briefly). Expiries are
//! handed out [`EXPIRY_CHUNK`] at a time, the lock let go between chunks.
//!
//! # Layout
//! * this file: the [`Hub`] and its state, waking up, subscribing and
//!   unsubscribing, and the accessors the table and metrics read.
//! * `event`: the events, what a watcher is sent, and [`Filter`].
//! * `revision`: incarnation and count bits of a revision.
//! * `config`: [`WatchConfig`] and the progress interval bounds.
//! * `error`: [`WatchError`], why a watch ends.
//! * `watcher`: one watcher's queue, shared by the hub and its stream.
//! * `index`: which watchers want which names, for dispatch.
//! * `subscription`: a watcher's stream ([`Subscription`]): resume,
//!   queue, progress.
//! * `publish`: numbering, the retained ring and dispatch.
//! * `expiry`: the live leases tracked for expiries.
//! * `housekeeping`: [`Hub::tick`]: linger, stalled watchers, expiries.

mod config;
mod error;
mod event;
mod expiry;
mod housekeeping;
mod index;
mod publish;
mod revision;
mod subscription;
mod watcher;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bagel_proto::Micros;

pub use config::{MAX_PROGRESS, MIN_PROGRESS, WatchConfig};
pub use error::WatchError;
pub use event::{Event, EventKind, Filter, Item, NewEvent};
pub use expiry::{EXPIRY_CHUNK, SeedWork};
pub use revision::{COUNT_BITS, INCARNATION_BITS, incarnation, incarnation_of};
pub use subscription::Subscription;

use expiry::{Live, Seeding};
use index::Index;
use revision::INCARNATION_MASK;
use watcher::{Queue, Registered, Shared};

use crate::table::LeaseId;

#[derive(Debug)]
struct Inner {
    /// The incarnation part of every revision given out now.
    incarnation: u32,
    last_rev: u64,
    /// Revisions after this one are retained (while active).
    oldest: u64,
    /// The retained events, in revision order: one shared copy that every
    /// watcher's queue and resume reads point into.
    ring: VecDeque<Arc<Event>>,
    ring_bytes: usize,
    watchers: HashMap<u64, Registered>,
    index: Index,
    next_id: u64,
    /// Since when nobody watches (while active).
    idle_since: Option<Micros>,
    live: HashMap<LeaseId, Live>,
    by_deadline: BTreeSet<(Micros, LeaseId)>,
    /// Counts wake-ups: a seeding chunk taken before the hub went idle and
    /// woke again is not applied to the new one.
    generation: u64,
    /// The live leases still to read from the table after a wake-up
    /// (see [`Hub::seed_from`]).
    seeding: Option<Seeding>,
}

/// What the hub counts, for the metrics.
#[derive(Debug, Default)]
pub struct WatchStats {
    /// Watchers an event was offered to (each one that matched it): what a
    /// lease event costs the hub beyond numbering it.
    pub dispatched: AtomicU64,
    /// Watchers dropped for a full buffer, or for a resume the ring moved
    /// past.
    pub overflowed: AtomicU64,
    /// Watchers ended for taking nothing for the stall bound.
    pub stalled: AtomicU64,
}

/// The hub. Share it behind an `Arc`.
#[derive(Debug)]
pub struct Hub {
    cfg: WatchConfig,
    active: AtomicBool,
    inner: Mutex<Inner>,
    stats: WatchStats,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Hub {
    /// A hub whose revisions are of `incarnation` (see [`incarnation`];
    /// only its low [`INCARNATION_BITS`] bits count), counting from 1.
    pub fn new(cfg: WatchConfig, incarnation: u32) -> Self {
        let incarnation = incarnation & INCARNATION_MASK;
        let start = u64::from(incarnation) << COUNT_BITS;
        Hub {
            cfg: WatchConfig {
                buffer: cfg.buffer.max(1),
                ..cfg
            },
            active: AtomicBool::new(false),
            inner: Mutex::new(Inner {
                incarnation,
                last_rev: start,
                oldest: start,
                ring: VecDeque::new(),
                ring_bytes: 0,
                watchers: HashMap::new(),
                index: Index::default(),
                next_id: 0,
                idle_since: None,
                live: HashMap::new(),
                by_deadline: BTreeSet::new(),
                generation: 0,
                seeding: None,
            }),
            stats: WatchStats::default(),
        }
    }

    pub fn config(&self) -> &WatchConfig {
        &self.cfg
    }

    /// What the hub counted.
    pub fn stats(&self) -> &WatchStats {
        &self.stats
    }

    /// Whether events are recorded: check this before building one.
    #[inline]
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Watchers connected.
    pub fn watchers(&self) -> usize {
        lock(&self.inner).watchers.len()
    }

    /// Events retained now, and their bytes (see [`WatchConfig::retain_bytes`]).
    pub fn retained(&self) -> (usize, usize) {
        let inner = lock(&self.inner);
        (inner.ring.len(), inner.ring_bytes)
    }

    /// The last revision given out.
    pub fn last_revision(&self) -> u64 {
        lock(&self.inner).last_rev
    }

    /// The incarnation part of the revisions given out now.
    pub fn incarnation(&self) -> u32 {
        lock(&self.inner).incarnation
    }

    /// Wakes the hub up if it is idle (skipping a revision: whatever
    /// happened while nobody watched has no number, and a resume from
    /// before it is refused). Returns whether it woke.
    fn wake(&self, inner: &mut Inner) -> bool {
        if self.active() {
            return false;
        }
        inner.last_rev += 1;
        inner.oldest = inner.last_rev;
        inner.ring.clear();
        inner.ring_bytes = 0;
        inner.live.clear();
        inner.by_deadline.clear();
        inner.generation += 1;
        inner.seeding = None;
        self.active.store(true, Ordering::Relaxed);
        true
    }

    /// For a List at `now`: the revision it reflects when it reads the
    /// table after this returns (every event numbered up to it has been
    /// applied to the table under the lock of its name's shard, which the
    /// List takes after this). Wakes the hub if it is idle (the caller then
    /// starts seeding the live leases with [`Hub::seed_from`], as for a
    /// watcher) and,
    /// while nobody watches, starts the linger again: events after the
    /// List are numbered and kept for a watch from its revision.
    pub fn keep_for_list(&self, now: Micros) -> (u64, bool) {
        let mut inner = lock(&self.inner);
        let woke = self.wake(&mut inner);
        if inner.watchers.is_empty() {
            inner.idle_since = Some(now);
        }
        (inner.last_rev, woke)
    }

    /// Registers a watcher for `filter`. With `from`, it first gets the
    /// retained events after revision `from`. Returns the subscription and
    /// whether the hub just woke up (the caller then seeds the live leases
    /// with [`Hub::seed_from`]).
    pub fn subscribe(
        self: &Arc<Self>,
        filter: Filter,
        from: Option<u64>,
    ) -> Result<(Subscription, bool), WatchError> {
        let mut inner = lock(&self.inner);
        if inner.watchers.len() >= self.cfg.max_watchers {
            return Err(WatchError::TooMany {
                max: self.cfg.max_watchers,
            });
        }
        let woke = self.wake(&mut inner);
        let last = inner.last_rev;
        let mut backlog_read = last;
        if let Some(from) = from {
            let refused = if incarnation_of(from) != inner.incarnation {
                Some(WatchError::OtherIncarnation {
                    from,
                    theirs: incarnation_of(from),
                    ours: inner.incarnation,
                })
            } else if from < inner.oldest {
                Some(WatchError::TooOld {
                    from,
                    oldest: inner.oldest,
                    retain: self.cfg.retain,
                })
            } else if from > last {
                Some(WatchError::Ahead { from, last })
            } else {
                None
            };
            if let Some(e) = refused {
                if woke {
                    self.deactivate(&mut inner);
                }
                return Err(e);
            }
            backlog_read = from;
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let shared = Arc::new(Shared {
            id,
            queue: Mutex::new(Queue {
                items: VecDeque::new(),
                last,
                sent: backlog_read,
                ended: None,
                owed_since: (backlog_read < last).then(std::time::Instant::now),
                backlog: backlog_read < last,
            }),
            notify: tokio::sync::Notify::new(),
        });
        inner.index.insert(&filter, &shared);
        inner.watchers.insert(
            id,
            Registered {
                filter: filter.clone(),
                shared: Arc::clone(&shared),
            },
        );
        inner.idle_since = None;
        drop(inner);
        let sub = Subscription {
            hub: Arc::clone(self),
            shared,
            filter,
            chunk: VecDeque::new(),
            backlog_read,
            start: last,
            done: false,
        };
        Ok((sub, woke))
    }

    fn unsubscribe(&self, id: u64) {
        let mut inner = lock(&self.inner);
        Self::unregister(&mut inner, id);
        if inner.watchers.is_empty() && inner.idle_since.is_none() {
            // The clock is the caller's; the next tick starts the linger.
            inner.idle_since = Some(Micros::ZERO);
        }
    }

    fn unregister(inner: &mut Inner, id: u64) {
        if let Some(w) = inner.watchers.remove(&id) {
            inner.index.remove(&w.filter, id);
        }
    }

    fn deactivate(&self, inner: &mut Inner) {
        self.active.store(false, Ordering::Relaxed);
        inner.ring.clear();
        inner.ring_bytes = 0;
        inner.live.clear();
        inner.by_deadline.clear();
        inner.idle_since = None;
        inner.seeding = None;
    }
}

#[cfg(test)]
mod tests;
