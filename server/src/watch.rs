//! The watch hub: lease events (grants, renewals, upgrades, releases,
//! breaks, expiries) numbered by revision and fanned out to watchers, each
//! through a bounded buffer.
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
//! * **Retention**: the last [`WatchConfig::retain`] events are kept, so a
//!   watcher can resume from a revision it saw. A revision older than that
//!   (or from before a gap) is refused naming the oldest one resumable.
//! * **Slow watchers**: each watcher has a buffer of
//!   [`WatchConfig::buffer`] events. A watcher whose buffer is full when an
//!   event comes is dropped; it receives what was buffered, then
//!   [`WatchError::Overflow`] naming the limit and the last revision it got.
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
//! mutex is always taken inside shard locks, never around them.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bagel_proto::Micros;
use tokio::sync::mpsc;

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
    Event(Event),
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
#[derive(Clone, Debug)]
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
         {oldest} (the server keeps the last {retain} events, --watch-retain, and none from \
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
    #[error("watchers on this server: limit {max} reached (the server's --max-watchers)")]
    TooMany { max: usize },
}

#[derive(Debug)]
struct Watcher {
    id: u64,
    filter: Filter,
    tx: mpsc::Sender<Event>,
    /// The last revision put in its buffer.
    last: u64,
    ended: Arc<Mutex<Option<WatchError>>>,
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
    retained: VecDeque<Event>,
    watchers: Vec<Watcher>,
    next_id: u64,
    /// Since when nobody watches (while active).
    idle_since: Option<Micros>,
    live: HashMap<LeaseId, Live>,
    by_deadline: BTreeSet<(Micros, LeaseId)>,
}

/// The hub. Share it behind an `Arc`.
#[derive(Debug)]
pub struct Hub {
    cfg: WatchConfig,
    active: AtomicBool,
    inner: Mutex<Inner>,
}

/// A watcher's end: events already retained (a resume), then live ones.
/// Dropping it unregisters the watcher.
#[derive(Debug)]
pub struct Subscription {
    hub: Arc<Hub>,
    id: u64,
    backlog: VecDeque<Event>,
    rx: mpsc::Receiver<Event>,
    ended: Arc<Mutex<Option<WatchError>>>,
    /// The last revision when it subscribed: the backlog holds what it
    /// asked for up to it, the buffer what comes after.
    start: u64,
}

impl Subscription {
    /// The next event; `Err` once the watcher was dropped for falling
    /// behind (after every event buffered for it), `None` never while the
    /// hub lives.
    pub async fn next(&mut self) -> Option<Result<Event, WatchError>> {
        if let Some(e) = self.backlog.pop_front() {
            return Some(Ok(e));
        }
        match self.rx.recv().await {
            Some(e) => Some(Ok(e)),
            None => lock(&self.ended).take().map(Err),
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
        !self.backlog.is_empty()
    }

    /// The next event if one is ready, else the revision up to which this
    /// watcher has been sent every event it wants: the hub's last revision,
    /// read under its lock with the watcher's buffer empty (every event is
    /// numbered and buffered under that lock, so none it wants is numbered
    /// up to there and unsent). `Err` once the watcher was dropped, as
    /// [`Subscription::next`].
    pub fn progress(&mut self) -> Option<Result<Item, WatchError>> {
        if let Some(e) = self.backlog.pop_front() {
            return Some(Ok(Item::Event(e)));
        }
        let inner = lock(&self.hub.inner);
        match self.rx.try_recv() {
            Ok(e) => Some(Ok(Item::Event(e))),
            Err(mpsc::error::TryRecvError::Empty) => Some(Ok(Item::Progress(inner.last_rev))),
            Err(mpsc::error::TryRecvError::Disconnected) => lock(&self.ended).take().map(Err),
        }
    }

    /// Like [`Subscription::next`] without waiting: `None` when nothing is
    /// ready.
    pub fn try_next(&mut self) -> Option<Result<Event, WatchError>> {
        if let Some(e) = self.backlog.pop_front() {
            return Some(Ok(e));
        }
        match self.rx.try_recv() {
            Ok(e) => Some(Ok(e)),
            Err(mpsc::error::TryRecvError::Empty) => None,
            Err(mpsc::error::TryRecvError::Disconnected) => lock(&self.ended).take().map(Err),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.unsubscribe(self.id);
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
                retained: VecDeque::new(),
                watchers: Vec::new(),
                next_id: 0,
                idle_since: None,
                live: HashMap::new(),
                by_deadline: BTreeSet::new(),
            }),
        }
    }

    pub fn config(&self) -> &WatchConfig {
        &self.cfg
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
        inner.retained.clear();
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
        let mut backlog = VecDeque::new();
        if let Some(from) = from {
            if incarnation_of(from) != inner.incarnation {
                if woke {
                    self.deactivate(&mut inner);
                }
                return Err(WatchError::OtherIncarnation {
                    from,
                    theirs: incarnation_of(from),
                    ours: inner.incarnation,
                });
            }
            if from < inner.oldest {
                if woke {
                    self.deactivate(&mut inner);
                }
                return Err(WatchError::TooOld {
                    from,
                    oldest: inner.oldest,
                    retain: self.cfg.retain,
                });
            }
            if from > inner.last_rev {
                if woke {
                    self.deactivate(&mut inner);
                }
                return Err(WatchError::Ahead {
                    from,
                    last: inner.last_rev,
                });
            }
            let skip = inner.retained.partition_point(|e| e.revision <= from);
            backlog.extend(
                inner
                    .retained
                    .iter()
                    .skip(skip)
                    .filter(|e| filter.matches(&e.event.name))
                    .cloned(),
            );
        }
        let (tx, rx) = mpsc::channel(self.cfg.buffer);
        let id = inner.next_id;
        inner.next_id += 1;
        let ended = Arc::new(Mutex::new(None));
        let last = inner.last_rev;
        inner.watchers.push(Watcher {
            id,
            filter,
            tx,
            last,
            ended: Arc::clone(&ended),
        });
        inner.idle_since = None;
        drop(inner);
        let sub = Subscription {
            hub: Arc::clone(self),
            id,
            backlog,
            rx,
            ended,
            start: last,
        };
        Ok((sub, woke))
    }

    fn unsubscribe(&self, id: u64) {
        let mut inner = lock(&self.inner);
        inner.watchers.retain(|w| w.id != id);
        if inner.watchers.is_empty() && inner.idle_since.is_none() {
            // The clock is the caller's; the next tick starts the linger.
            inner.idle_since = Some(Micros::ZERO);
        }
    }

    fn deactivate(&self, inner: &mut Inner) {
        self.active.store(false, Ordering::Relaxed);
        inner.retained.clear();
        inner.live.clear();
        inner.by_deadline.clear();
        inner.idle_since = None;
    }

    /// Records an event (call only when [`Hub::active`]; a late call after
    /// the hub went idle is ignored).
    pub fn publish(&self, event: NewEvent) {
        let mut inner = lock(&self.inner);
        if !self.active() {
            return;
        }
        self.track_locked(&mut inner, &event);
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

    fn track_locked(&self, inner: &mut Inner, e: &NewEvent) {
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
        let event = Event {
            revision: inner.last_rev,
            event,
        };
        if self.cfg.retain > 0 {
            if inner.retained.len() >= self.cfg.retain
                && let Some(old) = inner.retained.pop_front()
            {
                inner.oldest = old.revision;
            }
            inner.retained.push_back(event.clone());
        } else {
            inner.oldest = event.revision;
        }
        let buffer = self.cfg.buffer;
        inner.watchers.retain_mut(|w| {
            if !w.filter.matches(&event.event.name) {
                return true;
            }
            match w.tx.try_send(event.clone()) {
                Ok(()) => {
                    w.last = event.revision;
                    true
                }
                Err(mpsc::error::TrySendError::Full(_)) => {
                    *lock(&w.ended) = Some(WatchError::Overflow { buffer, last: w.last });
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
    }

    /// The count ran out: a new incarnation (the next one), the watchers
    /// ended with [`WatchError::Renumbered`] (their revisions would no
    /// longer resume), nothing retained.
    fn renumber(&self, inner: &mut Inner) {
        let last = inner.last_rev;
        inner.incarnation = (inner.incarnation + 1) & INCARNATION_MASK;
        inner.last_rev = u64::from(inner.incarnation) << COUNT_BITS;
        inner.oldest = inner.last_rev;
        inner.retained.clear();
        for w in inner.watchers.drain(..) {
            *lock(&w.ended) = Some(WatchError::Renumbered { last });
        }
    }

    /// Housekeeping, run periodically: goes idle once nobody has watched
    /// (or listed) for the linger time, and hands out the leases whose
    /// deadline passed by `now`, each with its names, no longer tracked.
    /// The table reports them (see `LeaseTable::watch_tick`): whether a
    /// lease expired is the table's to say, under its names' locks.
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
        let mut due = Vec::new();
        while let Some(&(deadline, lease)) = inner.by_deadline.first() {
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
        };
        Arc::new(Hub::new(cfg, 0))
    }

    fn all() -> Filter {
        Filter::Prefix(String::new())
    }

    fn drain(sub: &mut Subscription) -> Vec<Result<Event, WatchError>> {
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
        let names = |v: Vec<Result<Event, WatchError>>| {
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
}
