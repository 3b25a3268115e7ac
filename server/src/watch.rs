//! The watch hub: lease events (grants, renewals, upgrades, releases,
//! breaks, expiries) numbered by revision and fanned out to watchers, each
//! through a bounded buffer.
//!
//! * **Nobody watching costs one relaxed load.** The table calls
//!   [`Hub::active`] before it builds an event; the hub is active from the
//!   first watcher on until [`WatchConfig::linger`] after the last one left
//!   (so a watcher dropped for being slow can come back and resume).
//! * **Revisions** grow by one per event. They start at the server's start
//!   time in microseconds, so a revision seen from an earlier incarnation is
//!   older than anything this one retained and a resume from it is refused
//!   rather than silently skipping events. Events are not recorded while the
//!   hub is inactive; waking up skips one revision, which marks the gap.
//! * **Retention**: the last [`WatchConfig::retain`] events are kept, so a
//!   watcher can resume from a revision it saw. A revision older than that
//!   (or from before a gap) is refused naming the oldest one resumable.
//! * **Slow watchers**: each watcher has a buffer of
//!   [`WatchConfig::buffer`] events. A watcher whose buffer is full when an
//!   event comes is dropped; it receives what was buffered, then
//!   [`WatchError::Overflow`] naming the limit and the last revision it got.
//! * **Expiries** happen without a request: the hub tracks the deadline of
//!   every live lease while active (seeded from the table when it wakes up,
//!   see `LeaseTable::watch`), and [`Hub::tick`] reports those whose
//!   deadline passed.
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
    /// How long events are still recorded after the last watcher left.
    pub linger: Duration,
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            buffer: 1024,
            retain: 10_000,
            max_watchers: 1024,
            linger: Duration::from_secs(60),
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
    #[error("from_revision {from} is ahead of this server's last revision {last}")]
    Ahead { from: u64, last: u64 },
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

/// A live lease, for expiries.
#[derive(Debug)]
struct Live {
    deadline: Micros,
    owner: Arc<str>,
    mode: Mode,
    names: Vec<Arc<str>>,
}

#[derive(Debug)]
struct Inner {
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
    /// A hub whose first revision follows `start` (the server's start, in
    /// microseconds).
    pub fn new(cfg: WatchConfig, start: u64) -> Self {
        Hub {
            cfg: WatchConfig {
                buffer: cfg.buffer.max(1),
                ..cfg
            },
            active: AtomicBool::new(false),
            inner: Mutex::new(Inner {
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
        let woke = !self.active();
        if woke {
            // Skip a revision: whatever happened while nobody watched has
            // no number, and a resume from before it is refused.
            inner.last_rev += 1;
            inner.oldest = inner.last_rev;
            inner.retained.clear();
            inner.live.clear();
            inner.by_deadline.clear();
            self.active.store(true, Ordering::Relaxed);
        }
        let mut backlog = VecDeque::new();
        if let Some(from) = from {
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
    pub fn track(&self, lease: LeaseId, name: &Arc<str>, owner: &Arc<str>, mode: Mode, deadline: Micros) {
        let mut inner = lock(&self.inner);
        if !self.active() {
            return;
        }
        let live = inner.live.entry(lease).or_insert_with(|| Live {
            deadline,
            owner: Arc::clone(owner),
            mode,
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
                    owner: Arc::clone(&e.owner),
                    mode: e.mode,
                    names: Vec::new(),
                });
                let old = live.deadline;
                live.deadline = e.deadline;
                live.mode = e.mode;
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

    /// Housekeeping, run periodically: reports the leases whose deadline
    /// passed (by `now`) as expired, and goes idle once nobody has watched
    /// for the linger time.
    pub fn tick(&self, now: Micros) {
        let mut inner = lock(&self.inner);
        if !self.active() {
            return;
        }
        if inner.watchers.is_empty() {
            match inner.idle_since {
                None | Some(Micros::ZERO) => inner.idle_since = Some(now),
                Some(since) if now >= since.saturating_add(self.cfg.linger) => {
                    self.deactivate(&mut inner);
                    return;
                }
                Some(_) => {}
            }
        }
        while let Some(&(deadline, lease)) = inner.by_deadline.first() {
            if deadline > now {
                break;
            }
            inner.by_deadline.pop_first();
            let Some(live) = inner.live.remove(&lease) else {
                continue;
            };
            for name in live.names {
                self.emit(
                    &mut inner,
                    NewEvent {
                        kind: EventKind::Expired,
                        name,
                        lease,
                        owner: Arc::clone(&live.owner),
                        mode: live.mode,
                        deadline: live.deadline,
                        at: now,
                    },
                );
            }
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
        };
        Arc::new(Hub::new(cfg, 1000))
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
        assert_eq!(h.last_revision(), 1000, "nothing recorded while inactive");
        let (mut sub, woke) = h.subscribe(all(), None).unwrap();
        assert!(woke && h.active());
        h.publish(ev(EventKind::Granted, "a", lease, 50, 2));
        let got = drain(&mut sub);
        assert_eq!(got.len(), 1);
        // 1000 → 1001 (the gap on waking) → 1002.
        assert_eq!(got[0].as_ref().unwrap().revision, 1002);
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
        assert_eq!(got[0].as_ref().unwrap().revision, 1002);
        assert_eq!(got[1].as_ref().unwrap().revision, 1003);
        let err = got[2].clone().unwrap_err();
        assert_eq!(
            err,
            WatchError::Overflow {
                buffer: 2,
                last: 1003
            }
        );
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
        // Revisions 1002..=1006; retained 1004..=1006, so a resume from
        // 1003 (seen) on works, from 1002 does not.
        let (mut sub, _) = h.subscribe(all(), Some(1004)).unwrap();
        let revs: Vec<u64> = drain(&mut sub).into_iter().map(|e| e.unwrap().revision).collect();
        assert_eq!(revs, [1005, 1006]);
        let (mut sub, _) = h.subscribe(all(), Some(1003)).unwrap();
        assert_eq!(drain(&mut sub).len(), 3);
        let err = h.subscribe(all(), Some(1002)).unwrap_err();
        assert_eq!(
            err,
            WatchError::TooOld {
                from: 1002,
                oldest: 1003,
                retain: 3
            }
        );
        let err = h.subscribe(all(), Some(2000)).unwrap_err();
        assert_eq!(
            err,
            WatchError::Ahead {
                from: 2000,
                last: 1006
            }
        );
        // Resuming from the last revision: nothing old, then what comes.
        let (mut sub, _) = h.subscribe(all(), Some(1006)).unwrap();
        h.publish(ev(EventKind::Released, "a", lease, 60, 3));
        let revs: Vec<u64> = drain(&mut sub).into_iter().map(|e| e.unwrap().revision).collect();
        assert_eq!(revs, [1007]);
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
        let err = h.subscribe(all(), Some(1002)).unwrap_err();
        assert_eq!(
            err,
            WatchError::TooOld {
                from: 1002,
                oldest: 1003,
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
        h.tick(us(79));
        assert!(drain(&mut sub).is_empty());
        h.tick(us(80));
        let got: Vec<(EventKind, String)> = drain(&mut sub)
            .into_iter()
            .map(|e| e.unwrap().event)
            .map(|e| (e.kind, e.name.to_string()))
            .collect();
        assert_eq!(
            got,
            [
                (EventKind::Expired, "a".into()),
                (EventKind::Expired, "a2".into())
            ]
        );
        h.tick(us(1000));
        assert!(drain(&mut sub).is_empty(), "reported once");
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
