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
//!   lease event nothing (every event used to check every watcher's filter).
//! * **Slow watchers**: each watcher queues at most
//!   [`WatchConfig::buffer`] events. A watcher whose queue is full when an
//!   event comes is dropped; it receives what was queued, then
//!   [`WatchError::Overflow`] naming the limit and the last revision it got.
//!   One owed events that takes none for [`WatchConfig::stall`] (its client
//!   reads nothing) is ended with [`WatchError::Stalled`], its queue freed
//!   at once (see [`Hub::tick`]).
//! * **Progress**: [`Subscription::progress`] says up to which revision a
//!   watcher has been sent everything it asked for (read under the hub's
//!   lock with its buffer empty, so no event it wants is numbered at or
//!   below it and still unsent), for the progress messages of quiet
//!   streams.
//! * **Expiries** happen without a request: the hub tracks the deadline of
//!   every live lease while active (seeded from the table when it wakes up,
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

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bagel_proto::Micros;

use crate::table::{LeaseId, Mode};

/// What happened to a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    Granted,
    Renewed,
    Upgraded,
    Released,
    /// Taken from its holder by a grant: a full holder whose deadline had
    /// passed, or a live tentative holder preempted by a full acquire.
    Broken,
    /// The holder's deadline passed without a release.
    Expired,
}

/// An event, before the hub numbers it.
#[derive(Clone, Debug, PartialEq)]
pub struct NewEvent {
    pub kind: EventKind,
    pub name: Arc<str>,
    pub lease: LeaseId,
    pub owner: Arc<str>,
    pub mode: Mode,
    /// The lease's deadline after the event.
    pub deadline: Micros,
    pub at: Micros,
}

/// A numbered event.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub revision: u64,
    pub event: NewEvent,
}

/// What a watcher is sent: an event, or how far it has been sent
/// everything (see [`Subscription::progress`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Event(Arc<Event>),
    Progress(u64),
}

/// Bits of a revision that count events; the bits above them are the
/// incarnation. 2^40 events is 12 days at a million a second, every one
/// of them watched; past it the hub starts a new incarnation (see
/// [`WatchError::Renumbered`]).
pub const COUNT_BITS: u32 = 40;
/// Bits of a revision that name the incarnation.
pub const INCARNATION_BITS: u32 = 64 - COUNT_BITS;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const INCARNATION_MASK: u32 = (1 << INCARNATION_BITS) - 1;

/// The incarnation part of a revision.
pub fn incarnation_of(revision: u64) -> u32 {
    (revision >> COUNT_BITS) as u32
}

/// The incarnation of a server with id `server_id` started at `started`:
/// its start in milliseconds (so two starts of one server less than 4.6
/// hours apart, 2^24 ms, always differ: a restart within a millisecond of
/// the last is not possible), mixed with a hash of the id (so two servers
/// started together differ too, but for a 2^-24 chance).
pub fn incarnation(server_id: &str, started: Micros) -> u32 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    server_id.hash(&mut h);
    ((started.as_micros() / 1000) ^ h.finish()) as u32 & INCARNATION_MASK
}

/// Which names a watcher wants.
#[derive(Clone, Debug, PartialEq)]
pub enum Filter {
    Names(HashSet<Arc<str>>),
    /// Every name starting with this (the empty prefix: every name).
    Prefix(String),
}

impl Filter {
    pub fn matches(&self, name: &str) -> bool {
        match self {
            Filter::Names(names) => names.contains(name),
            Filter::Prefix(p) => name.starts_with(p.as_str()),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct WatchConfig {
    /// Events buffered per watcher before it is dropped.
    pub buffer: usize,
    /// Events kept for watchers resuming from a revision.
    pub retain: usize,
    /// ... and at most this many bytes of them (see `event_bytes`): the
    /// ring is the only copy of an event, whatever the watchers.
    pub retain_bytes: usize,
    /// A watcher owed events that takes none for this long (its client
    /// reads nothing: an HTTP/2 window left at 0) is ended with
    /// [`WatchError::Stalled`] and its queue freed; zero: never.
    pub stall: Duration,
    /// Watchers at once.
    pub max_watchers: usize,
    /// How long events are still recorded after the last watcher left (or
    /// the last List, when nobody watched).
    pub linger: Duration,
    /// How long a watch that asked for progress messages goes without a
    /// message before it is sent one, unless it asked for another interval.
    pub progress: Duration,
}

/// The shortest progress interval a watch may ask for: a progress message
/// costs a lock of the hub.
pub const MIN_PROGRESS: Duration = Duration::from_millis(10);
/// The longest progress interval a watch may ask for.
pub const MAX_PROGRESS: Duration = Duration::from_secs(3600);

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            buffer: 1024,
            retain: 10_000,
            retain_bytes: 32 << 20,
            stall: Duration::from_secs(30),
            max_watchers: 1024,
            linger: Duration::from_secs(60),
            progress: Duration::from_secs(5),
        }
    }
}

/// Why a watch cannot start or goes on no longer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    #[error(
        "watcher fell behind: more than {buffer} events buffered for it (the server's \
         --watch-buffer); last revision sent {last}: watch again with from_revision {last}"
    )]
    Overflow { buffer: usize, last: u64 },
    #[error(
        "from_revision {from} is no longer retained: the oldest revision to resume from is \
         {oldest} (the server keeps the last {retain} events, --watch-retain, within \
         --watch-retain-bytes, and none from \
         before it last had a watcher or from an earlier incarnation); list the names again and \
         watch from now"
    )]
    TooOld { from: u64, oldest: u64, retain: usize },
    #[error(
        "from_revision {from} is of another incarnation ({theirs:06x}) than this server's \
         ({ours:06x}): it was given out before the server restarted, or by another server; list \
         the names again and watch from the List's revision"
    )]
    OtherIncarnation { from: u64, theirs: u32, ours: u32 },
    #[error("from_revision {from} is ahead of this server's last revision {last}")]
    Ahead { from: u64, last: u64 },
    #[error(
        "this server's watch revisions ran out of their {COUNT_BITS} bits after revision {last} \
         and start again in a new incarnation; list the names again and watch from the List's \
         revision"
    )]
    Renumbered { last: u64 },
    #[error(
        "watcher stalled: its client read nothing it was owed for {after:?} (the server's \
         --watch-stall-timeout); last revision sent {last}: watch again with from_revision {last}"
    )]
    Stalled { after: Duration, last: u64 },
    #[error("watchers on this server: limit {max} reached (the server's --max-watchers)")]
    TooMany { max: usize },
}

/// Expiries handed out by one [`Hub::tick`] or [`Hub::due`] call: the table
/// reports each under its names' shard locks, a chunk at a time, so neither
/// the hub's lock nor a shard's is held across a mass expiry.
pub const EXPIRY_CHUNK: usize = 1024;

/// Events a resuming watcher reads out of the retained ones per lock of
/// the hub (it scans at most [`BACKLOG_SCAN`] per lock): the backlog is a
/// view of the shared ring, read a little at a time, never a copy.
const BACKLOG_CHUNK: usize = 64;
const BACKLOG_SCAN: usize = 4096;

/// What one retained event costs the ring's byte budget: the event, the
/// `Arc` around it, and its name and owner (shared with the table, but
/// kept alive by the ring once the table lets go).
fn event_bytes(e: &Event) -> usize {
    std::mem::size_of::<Event>() + 16 + e.event.name.len() + e.event.owner.len()
}

/// A watcher's queue: the events dispatched to it and not yet taken (each
/// an `Arc` of the ring's event, never a copy), and how it ended.
#[derive(Debug)]
struct Queue {
    items: VecDeque<Arc<Event>>,
    /// The last revision queued (or, before any, the one it started at).
    last: u64,
    /// The last revision taken by its stream.
    sent: u64,
    ended: Option<WatchError>,
    /// Since when it has been owed something (a queued event or retained
    /// ones it resumes from) without taking any: what the stall bound
    /// ([`WatchConfig::stall`]) is measured against.
    owed_since: Option<std::time::Instant>,
    /// Retained events it resumes from are still to be read.
    backlog: bool,
}

/// A watcher as the hub and its subscription share it.
#[derive(Debug)]
struct Shared {
    id: u64,
    queue: Mutex<Queue>,
    notify: tokio::sync::Notify,
}

impl Shared {
    /// Ends the watcher (unless it ended already); `clear` drops what was
    /// queued for it (a stalled watcher: its memory is returned now, not
    /// when its client comes back).
    fn end(&self, error: WatchError, clear: bool) {
        let mut q = lock(&self.queue);
        if q.ended.is_none() {
            q.ended = Some(error);
        }
        if clear {
            q.items = VecDeque::new();
            q.backlog = false;
        }
        drop(q);
        self.notify.notify_one();
    }
}

/// Which watchers want which names, so an event touches only those that
/// match: by name, by prefix (looked up once per distinct prefix length),
/// and the watchers of every name.
#[derive(Debug, Default)]
struct Index {
    names: HashMap<Arc<str>, Vec<Arc<Shared>>>,
    prefixes: HashMap<Box<str>, Vec<Arc<Shared>>>,
    /// Distinct non-empty prefix lengths watched, and by how many watchers.
    prefix_lens: std::collections::BTreeMap<usize, usize>,
    all: Vec<Arc<Shared>>,
}

impl Index {
    fn insert(&mut self, filter: &Filter, w: &Arc<Shared>) {
        match filter {
            Filter::Names(names) => {
                for n in names {
                    self.names.entry(Arc::clone(n)).or_default().push(Arc::clone(w));
                }
            }
            Filter::Prefix(p) if p.is_empty() => self.all.push(Arc::clone(w)),
            Filter::Prefix(p) => {
                self.prefixes
                    .entry(p.as_str().into())
                    .or_default()
                    .push(Arc::clone(w));
                *self.prefix_lens.entry(p.len()).or_default() += 1;
            }
        }
    }

    fn remove(&mut self, filter: &Filter, id: u64) {
        match filter {
            Filter::Names(names) => {
                for n in names {
                    if let Some(v) = self.names.get_mut(&**n) {
                        v.retain(|w| w.id != id);
                        if v.is_empty() {
                            self.names.remove(&**n);
                        }
                    }
                }
            }
            Filter::Prefix(p) if p.is_empty() => self.all.retain(|w| w.id != id),
            Filter::Prefix(p) => {
                if let Some(v) = self.prefixes.get_mut(p.as_str()) {
                    v.retain(|w| w.id != id);
                    if v.is_empty() {
                        self.prefixes.remove(p.as_str());
                    }
                }
                if let Some(n) = self.prefix_lens.get_mut(&p.len()) {
                    *n -= 1;
                    if *n == 0 {
                        self.prefix_lens.remove(&p.len());
                    }
                }
            }
        }
    }

    /// Calls `f` with every watcher that wants `name`, once each.
    fn for_each_match(&self, name: &str, mut f: impl FnMut(&Arc<Shared>)) {
        self.all.iter().for_each(&mut f);
        if let Some(v) = self.names.get(name) {
            v.iter().for_each(&mut f);
        }
        for &len in self.prefix_lens.keys() {
            if len > name.len() {
                break;
            }
            if !name.is_char_boundary(len) {
                continue;
            }
            if let Some(v) = self.prefixes.get(&name[..len]) {
                v.iter().for_each(&mut f);
            }
        }
    }
}

#[derive(Debug)]
struct Registered {
    filter: Filter,
    shared: Arc<Shared>,
}

/// A live lease, for expiries: when, and which names the table is to
/// check (the event itself is built from the table's record).
#[derive(Debug)]
struct Live {
    deadline: Micros,
    names: Vec<Arc<str>>,
}

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

/// A watcher's end: events retained since the revision it resumes from
/// (read from the ring a chunk at a time), then those dispatched to it.
/// Dropping it unregisters the watcher and frees its queue.
#[derive(Debug)]
pub struct Subscription {
    hub: Arc<Hub>,
    shared: Arc<Shared>,
    filter: Filter,
    /// Resumed events read from the ring, not yet taken.
    chunk: VecDeque<Arc<Event>>,
    /// The last revision of the ring read for the resume.
    backlog_read: u64,
    /// The last revision when it subscribed: the resume reads up to it,
    /// the queue holds what comes after.
    start: u64,
    /// Its end was handed out: nothing more comes.
    done: bool,
}

impl Subscription {
    /// The next event; `Err` once the watcher was ended (dropped for
    /// falling behind after every event buffered for it, stalled, or
    /// renumbered), `None` after that.
    pub async fn next(&mut self) -> Option<Result<Arc<Event>, WatchError>> {
        loop {
            if let Some(r) = self.poll_ready() {
                return r;
            }
            // A notify between the look and the wait is kept as a permit.
            self.shared.notify.notified().await;
        }
    }

    /// What is ready now: `Some(None)` once ended and handed out, `None`
    /// when nothing is.
    fn poll_ready(&mut self) -> Option<Option<Result<Arc<Event>, WatchError>>> {
        if self.done {
            return Some(None);
        }
        loop {
            {
                let mut q = lock(&self.shared.queue);
                if matches!(q.ended, Some(WatchError::Stalled { .. })) {
                    self.chunk.clear();
                    self.backlog_read = self.start;
                }
                if let Some(e) = self.chunk.pop_front() {
                    q.sent = e.revision;
                    Self::delivered(&mut q, !self.chunk.is_empty() || self.backlog_read < self.start);
                    return Some(Some(Ok(e)));
                }
                if self.backlog_read >= self.start {
                    if q.backlog {
                        q.backlog = false;
                        Self::delivered(&mut q, false);
                    }
                    if let Some(e) = q.items.pop_front() {
                        q.sent = e.revision;
                        Self::delivered(&mut q, false);
                        return Some(Some(Ok(e)));
                    }
                    if let Some(err) = q.ended.take() {
                        self.done = true;
                        return Some(Some(Err(err)));
                    }
                    return None;
                }
            }
            self.read_backlog();
        }
    }

    /// Stamps a delivery: it made progress, and is owed more only if its
    /// queue (or resume) still holds some.
    fn delivered(q: &mut Queue, more: bool) {
        q.owed_since = (more || !q.items.is_empty()).then(std::time::Instant::now);
    }

    /// Reads the next chunk of the resume from the ring; if the ring moved
    /// past it, the watcher is dropped as overflowed, naming the last
    /// revision it was sent.
    fn read_backlog(&mut self) {
        let inner = lock(&self.hub.inner);
        if self.backlog_read < inner.oldest {
            drop(inner);
            let mut q = lock(&self.shared.queue);
            // This end, not one the live queue may have had meanwhile: the
            // resume broke first, and nothing after it is sent.
            q.ended = Some(WatchError::Overflow {
                buffer: self.hub.cfg.buffer,
                last: q.sent.max(self.backlog_read),
            });
            q.items = VecDeque::new();
            q.backlog = false;
            drop(q);
            self.hub.stats.overflowed.fetch_add(1, Ordering::Relaxed);
            self.backlog_read = self.start;
            self.hub.unsubscribe(self.shared.id);
            return;
        }
        let skip = inner.ring.partition_point(|e| e.revision <= self.backlog_read);
        let mut scanned = 0;
        for e in inner.ring.iter().skip(skip) {
            if e.revision > self.start || self.chunk.len() >= BACKLOG_CHUNK || scanned >= BACKLOG_SCAN {
                break;
            }
            scanned += 1;
            self.backlog_read = e.revision;
            if self.filter.matches(&e.event.name) {
                self.chunk.push_back(Arc::clone(e));
            }
        }
        if scanned == 0 || inner.ring.back().is_none_or(|e| e.revision <= self.backlog_read) {
            // Nothing more retained up to its start.
            self.backlog_read = self.backlog_read.max(self.start);
        }
    }

    /// The last revision when it subscribed: once the events resumed are
    /// sent (see [`Subscription::has_backlog`]), it has been sent every
    /// event it wants up to this one.
    pub fn start_revision(&self) -> u64 {
        self.start
    }

    /// Whether events resumed from before it subscribed are still to come.
    pub fn has_backlog(&self) -> bool {
        !self.done && (!self.chunk.is_empty() || self.backlog_read < self.start)
    }

    /// The next event if one is ready, else the revision up to which this
    /// watcher has been sent every event it wants: the hub's last revision,
    /// read under its lock with the watcher's queue empty (every event is
    /// numbered and queued under that lock, so none it wants is numbered
    /// up to there and unsent). `Err` once the watcher was ended, as
    /// [`Subscription::next`].
    pub fn progress(&mut self) -> Option<Result<Item, WatchError>> {
        if let Some(r) = self.poll_ready() {
            return r.map(|r| r.map(Item::Event));
        }
        let inner = lock(&self.hub.inner);
        let mut q = lock(&self.shared.queue);
        if let Some(e) = q.items.pop_front() {
            q.sent = e.revision;
            Self::delivered(&mut q, false);
            return Some(Ok(Item::Event(e)));
        }
        if let Some(err) = q.ended.take() {
            self.done = true;
            return Some(Err(err));
        }
        Some(Ok(Item::Progress(inner.last_rev)))
    }

    /// Like [`Subscription::next`] without waiting: `None` when nothing is
    /// ready.
    pub fn try_next(&mut self) -> Option<Result<Arc<Event>, WatchError>> {
        self.poll_ready().flatten()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.unsubscribe(self.shared.id);
    }
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
        self.active.store(true, Ordering::Relaxed);
        true
    }

    /// For a List at `now`: the revision it reflects when it reads the
    /// table after this returns (every event numbered up to it has been
    /// applied to the table under the lock of its name's shard, which the
    /// List takes after this). Wakes the hub if it is idle (the caller then
    /// seeds the live leases with [`Hub::track`], as for a watcher) and,
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
    /// with [`Hub::track`]).
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
    }

    /// Records an event (call only when [`Hub::active`]; a late call after
    /// the hub went idle is ignored). The table calls it under the name's
    /// shard lock; what it does under the hub's lock is bounded: number
    /// the event, append it to the ring, and queue it for the watchers
    /// the index says want it (none is asked about a name it does not
    /// watch).
    pub fn publish(&self, event: NewEvent) {
        let mut inner = lock(&self.inner);
        if !self.active() {
            return;
        }
        Self::track_locked(&mut inner, &event);
        self.emit(&mut inner, event);
    }

    /// Seeds a live lease's name (idempotent), when the hub wakes up.
    pub fn track(&self, lease: LeaseId, name: &Arc<str>, deadline: Micros) {
        let mut inner = lock(&self.inner);
        if !self.active() {
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

    fn track_locked(inner: &mut Inner, e: &NewEvent) {
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

    fn emit(&self, inner: &mut Inner, event: NewEvent) {
        if inner.last_rev & COUNT_MASK == COUNT_MASK {
            self.renumber(inner);
        }
        inner.last_rev += 1;
        let event = Arc::new(Event {
            revision: inner.last_rev,
            event,
        });
        inner.ring_bytes += event_bytes(&event);
        inner.ring.push_back(Arc::clone(&event));
        while inner.ring.len() > self.cfg.retain || inner.ring_bytes > self.cfg.retain_bytes {
            let Some(old) = inner.ring.pop_front() else { break };
            inner.ring_bytes -= event_bytes(&old);
            inner.oldest = old.revision;
        }
        let buffer = self.cfg.buffer;
        let mut overflowed = Vec::new();
        let mut offered = 0;
        inner.index.for_each_match(&event.event.name, |w| {
            offered += 1;
            let mut q = lock(&w.queue);
            if q.ended.is_some() {
                return;
            }
            if q.items.len() >= buffer {
                q.ended = Some(WatchError::Overflow { buffer, last: q.last });
                drop(q);
                w.notify.notify_one();
                overflowed.push(w.id);
                return;
            }
            if q.owed_since.is_none() {
                q.owed_since = Some(std::time::Instant::now());
            }
            q.items.push_back(Arc::clone(&event));
            q.last = event.revision;
            drop(q);
            w.notify.notify_one();
        });
        self.stats.dispatched.fetch_add(offered, Ordering::Relaxed);
        if !overflowed.is_empty() {
            self.stats
                .overflowed
                .fetch_add(overflowed.len() as u64, Ordering::Relaxed);
            for id in overflowed {
                Self::unregister(inner, id);
            }
        }
    }

    /// The count ran out: a new incarnation (the next one), the watchers
    /// ended with [`WatchError::Renumbered`] (their revisions would no
    /// longer resume), nothing retained.
    fn renumber(&self, inner: &mut Inner) {
        let last = inner.last_rev;
        inner.incarnation = (inner.incarnation + 1) & INCARNATION_MASK;
        inner.last_rev = u64::from(inner.incarnation) << COUNT_BITS;
        inner.oldest = inner.last_rev;
        inner.ring.clear();
        inner.ring_bytes = 0;
        inner.index = Index::default();
        for (_, w) in inner.watchers.drain() {
            w.shared.end(WatchError::Renumbered { last }, false);
        }
    }

    /// Housekeeping, run periodically (off the request path): goes idle
    /// once nobody has watched (or listed) for the linger time, ends the
    /// watchers that took nothing they were owed for
    /// [`WatchConfig::stall`] (their queues freed), and hands out up to
    /// [`EXPIRY_CHUNK`] leases whose deadline passed by `now`, each with
    /// its names, no longer tracked (more with [`Hub::due`]). The table
    /// reports them (see `LeaseTable::watch_tick`): whether a lease
    /// expired is the table's to say, under its names' locks.
    pub fn tick(&self, now: Micros) -> Vec<(LeaseId, Vec<Arc<str>>)> {
        let mut inner = lock(&self.inner);
        if !self.active() {
            return Vec::new();
        }
        if inner.watchers.is_empty() {
            match inner.idle_since {
                None | Some(Micros::ZERO) => inner.idle_since = Some(now),
                Some(since) if now >= since.saturating_add(self.cfg.linger) => {
                    self.deactivate(&mut inner);
                    return Vec::new();
                }
                Some(_) => {}
            }
        }
        self.end_stalled(&mut inner, std::time::Instant::now());
        Self::due_locked(&mut inner, now, EXPIRY_CHUNK)
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

    fn due_locked(inner: &mut Inner, now: Micros, max: usize) -> Vec<(LeaseId, Vec<Arc<str>>)> {
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

    /// Ends the watchers owed something that took nothing for the stall
    /// bound: their client reads nothing (an HTTP/2 window left at 0), so
    /// what is queued for them is freed now and their stream ends with
    /// [`WatchError::Stalled`] when the client reads again.
    fn end_stalled(&self, inner: &mut Inner, now: std::time::Instant) {
        let stall = self.cfg.stall;
        if stall.is_zero() {
            return;
        }
        let stalled: Vec<u64> = inner
            .watchers
            .iter()
            .filter(|(_, w)| {
                let q = lock(&w.shared.queue);
                q.ended.is_none() && q.owed_since.is_some_and(|t| now.duration_since(t) >= stall)
            })
            .map(|(&id, _)| id)
            .collect();
        for id in stalled {
            if let Some(w) = inner.watchers.get(&id) {
                let sent = lock(&w.shared.queue).sent;
                w.shared.end(
                    WatchError::Stalled {
                        after: stall,
                        last: sent,
                    },
                    true,
                );
            }
            Self::unregister(inner, id);
            self.stats.stalled.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Micros {
        Micros::from_micros(n)
    }

    fn ev(kind: EventKind, name: &str, lease: LeaseId, deadline: u64, at: u64) -> NewEvent {
        NewEvent {
            kind,
            name: Arc::from(name),
            lease,
            owner: Arc::from("o"),
            mode: Mode::Full,
            deadline: us(deadline),
            at: us(at),
        }
    }

    fn hub(buffer: usize, retain: usize) -> Arc<Hub> {
        let cfg = WatchConfig {
            buffer,
            retain,
            max_watchers: 4,
            linger: Duration::from_secs(1),
            progress: Duration::from_secs(5),
            retain_bytes: usize::MAX,
            stall: Duration::ZERO,
        };
        Arc::new(Hub::new(cfg, 0))
    }

    fn all() -> Filter {
        Filter::Prefix(String::new())
    }

    fn drain(sub: &mut Subscription) -> Vec<Result<Arc<Event>, WatchError>> {
        std::iter::from_fn(|| sub.try_next()).collect()
    }

    #[test]
    fn inactive_until_a_watcher_and_revisions_follow_the_start() {
        let h = hub(8, 8);
        let lease = LeaseId::new(us(1), 0, 0);
        assert!(!h.active());
        h.publish(ev(EventKind::Granted, "a", lease, 50, 1));
        assert_eq!(h.last_revision(), 0, "nothing recorded while inactive");
        let (mut sub, woke) = h.subscribe(all(), None).unwrap();
        assert!(woke && h.active());
        h.publish(ev(EventKind::Granted, "a", lease, 50, 2));
        let got = drain(&mut sub);
        assert_eq!(got.len(), 1);
        // 0 → 1 (the gap on waking) → 2.
        assert_eq!(got[0].as_ref().unwrap().revision, 2);
    }

    #[test]
    fn filters_by_name_and_prefix() {
        let h = hub(8, 8);
        let lease = LeaseId::new(us(1), 0, 0);
        let names = Filter::Names([Arc::from("b")].into_iter().collect());
        let (mut by_name, _) = h.subscribe(names, None).unwrap();
        let (mut by_prefix, _) = h.subscribe(Filter::Prefix("a/".into()), None).unwrap();
        for n in ["a/1", "b", "a/2", "c"] {
            h.publish(ev(EventKind::Granted, n, lease, 50, 2));
        }
        let names = |v: Vec<Result<Arc<Event>, WatchError>>| {
            v.into_iter()
                .map(|e| e.unwrap().event.name.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(drain(&mut by_name)), ["b"]);
        assert_eq!(names(drain(&mut by_prefix)), ["a/1", "a/2"]);
    }

    #[test]
    fn a_full_buffer_drops_the_watcher_after_what_it_holds() {
        let h = hub(2, 8);
        let lease = LeaseId::new(us(1), 0, 0);
        let (mut slow, _) = h.subscribe(all(), None).unwrap();
        let (mut fast, _) = h.subscribe(all(), None).unwrap();
        for i in 0..3 {
            h.publish(ev(EventKind::Renewed, "a", lease, 50 + i, 2));
            assert_eq!(drain(&mut fast).len(), 1);
        }
        let got = drain(&mut slow);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].as_ref().unwrap().revision, 2);
        assert_eq!(got[1].as_ref().unwrap().revision, 3);
        let err = got[2].clone().unwrap_err();
        assert_eq!(err, WatchError::Overflow { buffer: 2, last: 3 });
        assert!(err.to_string().contains("--watch-buffer"), "{err}");
        assert_eq!(h.watchers(), 1);
    }

    #[test]
    fn resumes_after_a_revision_and_refuses_what_is_no_longer_retained() {
        let h = hub(16, 3);
        let lease = LeaseId::new(us(1), 0, 0);
        let (_keep, _) = h.subscribe(all(), None).unwrap();
        for i in 0..5 {
            h.publish(ev(EventKind::Renewed, "a", lease, 50 + i, 2));
        }
        // Revisions 2..=6; retained 4..=6, so a resume from
        // 3 (seen) on works, from 2 does not.
        let (mut sub, _) = h.subscribe(all(), Some(4)).unwrap();
        let revs: Vec<u64> = drain(&mut sub).into_iter().map(|e| e.unwrap().revision).collect();
        assert_eq!(revs, [5, 6]);
        let (mut sub, _) = h.subscribe(all(), Some(3)).unwrap();
        assert_eq!(drain(&mut sub).len(), 3);
        let err = h.subscribe(all(), Some(2)).unwrap_err();
        assert_eq!(
            err,
            WatchError::TooOld {
                from: 2,
                oldest: 3,
                retain: 3
            }
        );
        let err = h.subscribe(all(), Some(1000)).unwrap_err();
        assert_eq!(err, WatchError::Ahead { from: 1000, last: 6 });
        // Resuming from the last revision: nothing old, then what comes.
        let (mut sub, _) = h.subscribe(all(), Some(6)).unwrap();
        h.publish(ev(EventKind::Released, "a", lease, 60, 3));
        let revs: Vec<u64> = drain(&mut sub).into_iter().map(|e| e.unwrap().revision).collect();
        assert_eq!(revs, [7]);
    }

    #[test]
    fn going_idle_forgets_and_a_resume_across_the_gap_is_refused() {
        let h = hub(16, 16);
        let lease = LeaseId::new(us(1), 0, 0);
        let (sub, _) = h.subscribe(all(), None).unwrap();
        h.publish(ev(EventKind::Granted, "a", lease, 50, 2));
        drop(sub);
        h.tick(us(10));
        assert!(h.active(), "lingers");
        h.tick(us(10 + 1_000_000));
        assert!(!h.active());
        h.publish(ev(EventKind::Released, "a", lease, 50, 3));
        let err = h.subscribe(all(), Some(2)).unwrap_err();
        assert_eq!(
            err,
            WatchError::TooOld {
                from: 2,
                oldest: 3,
                retain: 16
            }
        );
        assert!(!h.active(), "a refused resume does not wake the hub");
    }

    #[test]
    fn expiries_follow_renewals_and_skip_released_leases() {
        let h = hub(16, 16);
        let a = LeaseId::new(us(1), 0, 0);
        let b = LeaseId::new(us(1), 0, 1);
        let (mut sub, _) = h.subscribe(all(), None).unwrap();
        h.publish(ev(EventKind::Granted, "a", a, 50, 2));
        h.publish(ev(EventKind::Granted, "a2", a, 50, 2));
        h.publish(ev(EventKind::Renewed, "a", a, 80, 3));
        h.publish(ev(EventKind::Renewed, "a2", a, 80, 3));
        h.publish(ev(EventKind::Granted, "b", b, 60, 2));
        h.publish(ev(EventKind::Released, "b", b, 60, 4));
        drain(&mut sub);
        assert!(h.tick(us(79)).is_empty());
        let due = h.tick(us(80));
        let due: Vec<(LeaseId, Vec<String>)> = due
            .into_iter()
            .map(|(l, names)| (l, names.iter().map(|n| n.to_string()).collect()))
            .collect();
        assert_eq!(due, [(a, vec!["a".to_owned(), "a2".to_owned()])]);
        assert!(h.tick(us(1000)).is_empty(), "handed out once");
        assert!(drain(&mut sub).is_empty(), "the hub reports no expiry itself");
    }

    #[test]
    fn a_revision_of_another_incarnation_is_refused_whatever_its_count() {
        let h = hub(16, 16);
        let lease = LeaseId::new(us(1), 0, 0);
        let (_keep, _) = h.subscribe(all(), None).unwrap();
        for _ in 0..3 {
            h.publish(ev(EventKind::Renewed, "a", lease, 50, 2));
        }
        assert_eq!(incarnation_of(h.last_revision()), 0);
        // The same count in incarnation 7: in range by count alone.
        let theirs = (7 << COUNT_BITS) | 2;
        let err = h.subscribe(all(), Some(theirs)).unwrap_err();
        assert_eq!(
            err,
            WatchError::OtherIncarnation {
                from: theirs,
                theirs: 7,
                ours: 0
            }
        );
        assert!(err.to_string().contains("list the names again"), "{err}");
        // Incarnations differ between starts a millisecond apart, and
        // between servers.
        let t = Micros::from_micros(1_700_000_000_000_000);
        assert_ne!(
            incarnation("s", t),
            incarnation("s", t.saturating_add(Duration::from_millis(1)))
        );
        assert_ne!(incarnation("s1", t), incarnation("s2", t));
        assert_eq!(incarnation("s", t), incarnation("s", t), "a function of both");
    }

    #[test]
    fn progress_is_the_last_revision_once_the_buffer_is_empty() {
        let h = hub(16, 16);
        let lease = LeaseId::new(us(1), 0, 0);
        let names = Filter::Names([Arc::from("mine")].into_iter().collect());
        let (mut sub, _) = h.subscribe(names, None).unwrap();
        let start = sub.start_revision();
        assert_eq!(sub.progress(), Some(Ok(Item::Progress(start))));
        h.publish(ev(EventKind::Granted, "other", lease, 50, 2));
        // Not ours: progress moves past it all the same.
        assert_eq!(sub.progress(), Some(Ok(Item::Progress(start + 1))));
        h.publish(ev(EventKind::Granted, "mine", lease, 50, 2));
        h.publish(ev(EventKind::Granted, "other", lease, 50, 2));
        // Ours is still buffered: it comes first, then the progress.
        match sub.progress() {
            Some(Ok(Item::Event(e))) => assert_eq!(e.revision, start + 2),
            other => panic!("{other:?}"),
        }
        assert_eq!(sub.progress(), Some(Ok(Item::Progress(start + 3))));
    }

    #[test]
    fn a_list_wakes_the_hub_and_keeps_it_for_the_linger() {
        let h = hub(16, 16);
        let lease = LeaseId::new(us(1), 0, 0);
        let (rev, woke) = h.keep_for_list(us(10));
        assert!(woke && h.active());
        h.publish(ev(EventKind::Granted, "a", lease, 50, 2));
        // Still kept just before the linger ends: a watch from the List's
        // revision gets what happened since.
        h.tick(us(10 + 1_000_000 - 1));
        let (mut sub, woke) = h.subscribe(all(), Some(rev)).unwrap();
        assert!(!woke);
        let got = drain(&mut sub);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().unwrap().revision, rev + 1);
        drop(sub);
        // A second List while nobody watches starts the linger again.
        let (rev2, woke) = h.keep_for_list(us(20));
        assert!(!woke);
        assert_eq!(rev2, rev + 1);
        h.tick(us(20 + 1_000_000));
        assert!(!h.active());
    }

    #[test]
    fn revisions_that_run_out_start_a_new_incarnation_and_end_the_watchers() {
        let h = hub(16, 16);
        let lease = LeaseId::new(us(1), 0, 0);
        let (mut sub, _) = h.subscribe(all(), None).unwrap();
        lock(&h.inner).last_rev = COUNT_MASK - 1;
        h.publish(ev(EventKind::Renewed, "a", lease, 50, 2));
        h.publish(ev(EventKind::Renewed, "a", lease, 51, 2));
        let got = drain(&mut sub);
        assert_eq!(got[0].as_ref().unwrap().revision, COUNT_MASK);
        assert_eq!(got[1], Err(WatchError::Renumbered { last: COUNT_MASK }));
        assert_eq!(h.last_revision(), (1 << COUNT_BITS) | 1);
        assert!(matches!(
            h.subscribe(all(), Some(COUNT_MASK)),
            Err(WatchError::OtherIncarnation { .. })
        ));
    }

    #[test]
    fn the_number_of_watchers_is_bounded() {
        let h = hub(4, 4);
        let subs: Vec<_> = (0..4).map(|_| h.subscribe(all(), None).unwrap()).collect();
        assert_eq!(
            h.subscribe(all(), None).unwrap_err(),
            WatchError::TooMany { max: 4 }
        );
        drop(subs);
        assert!(h.subscribe(all(), None).is_ok());
    }

    fn hub_with(cfg: impl FnOnce(&mut WatchConfig)) -> Arc<Hub> {
        let mut c = WatchConfig {
            buffer: 16,
            retain: 16,
            max_watchers: 4096,
            linger: Duration::from_secs(1),
            progress: Duration::from_secs(5),
            retain_bytes: usize::MAX,
            stall: Duration::ZERO,
        };
        cfg(&mut c);
        Arc::new(Hub::new(c, 0))
    }

    fn names(ns: &[&str]) -> Filter {
        Filter::Names(ns.iter().map(|n| Arc::from(*n)).collect())
    }

    /// Issue 38, item 4: an event is offered only to the watchers that
    /// want its name, found through the index; a thousand watchers of
    /// other names (and prefixes) cost it nothing. The count is of
    /// watchers touched, not time.
    #[test]
    fn an_event_touches_only_the_watchers_that_match_it() {
        let h = hub_with(|_| {});
        let lease = LeaseId::new(us(1), 0, 0);
        let mut subs = Vec::new();
        for i in 0..1000 {
            let ns: Vec<String> = (0..8).map(|j| format!("w{i}/n{j}")).collect();
            let ns: Vec<&str> = ns.iter().map(String::as_str).collect();
            subs.push(h.subscribe(names(&ns), None).unwrap().0);
        }
        for i in 0..100 {
            subs.push(h.subscribe(Filter::Prefix(format!("p{i}/")), None).unwrap().0);
        }
        h.publish(ev(EventKind::Granted, "unwatched", lease, 50, 2));
        h.publish(ev(EventKind::Granted, "p1", lease, 50, 2));
        assert_eq!(h.stats().dispatched.load(Ordering::Relaxed), 0);
        h.publish(ev(EventKind::Granted, "w7/n3", lease, 50, 2));
        h.publish(ev(EventKind::Granted, "p42/x", lease, 50, 2));
        assert_eq!(h.stats().dispatched.load(Ordering::Relaxed), 2);
        let (mut every, _) = h.subscribe(all(), None).unwrap();
        h.publish(ev(EventKind::Granted, "p42/y", lease, 50, 2));
        assert_eq!(h.stats().dispatched.load(Ordering::Relaxed), 4);
        assert_eq!(drain(&mut subs[1042]).len(), 2);
        assert_eq!(drain(&mut every).len(), 1);
        // A prefix that cuts a character in two matches nothing, and
        // panics not.
        let (mut accent, _) = h.subscribe(Filter::Prefix("é".into()), None).unwrap();
        h.publish(ev(EventKind::Granted, "éa", lease, 50, 2));
        h.publish(ev(EventKind::Granted, "a", lease, 50, 2));
        assert_eq!(drain(&mut accent).len(), 1);
    }

    /// Watchers resuming from the same revision read the one retained
    /// copy of each event (the ring's `Arc`), not copies of their own;
    /// a resume the ring moves past ends as an overflow naming the last
    /// revision it was sent.
    #[test]
    fn resumes_are_views_of_the_shared_ring_and_end_when_it_moves_past_them() {
        let h = hub_with(|c| {
            c.retain = 100;
            c.buffer = 1000;
        });
        let lease = LeaseId::new(us(1), 0, 0);
        let (_keep, _) = h.subscribe(all(), None).unwrap();
        let first = h.last_revision();
        for i in 0..100 {
            h.publish(ev(EventKind::Renewed, "a", lease, 50 + i, 2));
        }
        let (mut a, _) = h.subscribe(all(), Some(first)).unwrap();
        let (mut b, _) = h.subscribe(all(), Some(first)).unwrap();
        let ea = a.try_next().unwrap().unwrap();
        let eb = b.try_next().unwrap().unwrap();
        assert!(Arc::ptr_eq(&ea, &eb), "one copy of the event");
        // `b` reads on while the ring moves on past `a`'s place.
        let rest = drain(&mut b);
        assert_eq!(rest.len(), 99);
        for i in 0..100 {
            h.publish(ev(EventKind::Renewed, "a", lease, 200 + i, 2));
        }
        let got = drain(&mut a);
        let last = ea.revision + BACKLOG_CHUNK as u64 - 1;
        assert_eq!(got.len(), BACKLOG_CHUNK);
        assert_eq!(
            got.last().unwrap().clone().unwrap_err(),
            WatchError::Overflow { buffer: 1000, last }
        );
        assert!(a.try_next().is_none(), "ended");
    }

    /// The ring keeps at most `retain_bytes` of events, whatever `retain`.
    #[test]
    fn the_ring_is_bounded_by_bytes_too() {
        let h = hub_with(|c| {
            c.retain = 1000;
            c.retain_bytes = 10_000;
        });
        let lease = LeaseId::new(us(1), 0, 0);
        let (_keep, _) = h.subscribe(all(), None).unwrap();
        let long = "n".repeat(1000);
        for _ in 0..100 {
            h.publish(ev(EventKind::Renewed, &long, lease, 50, 2));
        }
        let (n, bytes) = h.retained();
        assert!(bytes <= 10_000 && n < 10, "{n} events, {bytes} bytes");
    }

    /// Issue 38, item 2: a watcher owed events that takes none for the
    /// stall bound is ended, its queue freed at once, and its stream says
    /// so (after nothing more) naming the limit and its last revision.
    #[test]
    fn a_watcher_that_takes_nothing_for_the_stall_bound_is_ended_and_freed() {
        let h = hub_with(|c| c.stall = Duration::from_secs(30));
        let lease = LeaseId::new(us(1), 0, 0);
        let (mut stuck, _) = h.subscribe(all(), None).unwrap();
        let (mut quiet, _) = h.subscribe(names(&["other"]), None).unwrap();
        h.publish(ev(EventKind::Granted, "a", lease, 50, 2));
        let first = stuck.try_next().unwrap().unwrap().revision;
        h.publish(ev(EventKind::Renewed, "a", lease, 60, 2));
        h.publish(ev(EventKind::Renewed, "a", lease, 70, 2));
        let later = std::time::Instant::now() + Duration::from_secs(31);
        h.end_stalled(&mut lock(&h.inner), later);
        assert!(lock(&stuck.shared.queue).items.is_empty(), "freed");
        assert_eq!(h.watchers(), 1, "the quiet one, owed nothing, stays");
        let err = stuck.try_next().unwrap().unwrap_err();
        assert_eq!(
            err,
            WatchError::Stalled {
                after: Duration::from_secs(30),
                last: first
            }
        );
        assert!(err.to_string().contains("--watch-stall-timeout"), "{err}");
        assert!(quiet.try_next().is_none());
        assert_eq!(h.stats().stalled.load(Ordering::Relaxed), 1);
    }

    /// Issue 38, item 4: a mass expiry is handed out a chunk at a time,
    /// the hub's lock let go between chunks.
    #[test]
    fn expiries_are_handed_out_in_bounded_chunks() {
        let h = hub_with(|_| {});
        let (_keep, _) = h.subscribe(names(&["x"]), None).unwrap();
        let n = EXPIRY_CHUNK * 2 + 10;
        for i in 0..n {
            let lease = LeaseId::new(us(1), 0, i);
            h.publish(ev(EventKind::Granted, &format!("n{i}"), lease, 50, 2));
        }
        assert_eq!(h.tick(us(100)).len(), EXPIRY_CHUNK);
        assert_eq!(h.due(us(100), EXPIRY_CHUNK).len(), EXPIRY_CHUNK);
        assert_eq!(h.due(us(100), EXPIRY_CHUNK).len(), 10);
        assert!(h.due(us(100), EXPIRY_CHUNK).is_empty());
    }
}
