use std::time::Duration;

use super::revision::COUNT_MASK;
use super::subscription::BACKLOG_CHUNK;
use super::*;
use crate::table::Mode;

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
        max_watchers_per_identity: None,
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
        max_watchers_per_identity: None,
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
/// a resume the ring moves past ends naming the retention bound (not the
/// watcher's buffer, which it did not overflow) and the last revision it
/// was sent.
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
        WatchError::ResumeOverrun { retain: 100, last }
    );
    let message = got.last().unwrap().clone().unwrap_err().to_string();
    assert!(
        message.contains("--watch-retain") && !message.contains("--watch-buffer"),
        "{message}"
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
