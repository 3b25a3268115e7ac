//! Lease-table rules, driven by an exact injected time (plain `Micros`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bagel_proto::Micros;
use proptest::prelude::*;

use super::history::HistoryLog;
use super::*;

const T0: u64 = 1_000_000_000;
const SEC: u64 = 1_000_000;

fn t(us: u64) -> Micros {
    Micros::from_micros(us)
}

fn table() -> LeaseTable {
    LeaseTable::new(TableConfig::for_tests(Duration::from_secs(10)))
}

fn spec(names: &[&str], deadline: u64, mode: Mode) -> AcquireSpec {
    let mut names: Vec<Arc<str>> = names.iter().map(|n| Arc::from(*n)).collect();
    names.sort();
    AcquireSpec {
        names,
        deadline: t(deadline),
        owner: Arc::from("test"),
        mode,
        peer: None,
        holder_key: None,
    }
}

fn full(names: &[&str], deadline: u64) -> AcquireSpec {
    spec(names, deadline, Mode::Full)
}

fn release_at(wm: u64) -> ReleaseSpec {
    ReleaseSpec {
        watermark: t(wm),
        ..Default::default()
    }
}

#[test]
fn expiry_is_exact_to_the_microsecond() {
    let tbl = table();
    let deadline = T0 + 5 * SEC;
    let first = tbl.acquire(&full(&["a"], deadline), t(T0)).unwrap();

    // One microsecond before the deadline the lease still holds.
    let err = tbl
        .acquire(&full(&["a"], deadline + SEC), t(deadline - 1))
        .unwrap_err();
    let Error::Conflict(c) = err else {
        panic!("expected conflict, got {err:?}")
    };
    assert_eq!((c.holder, c.deadline), (first.lease, t(deadline)));

    // At the deadline it is over: the next grant breaks it.
    let second = tbl.acquire(&full(&["a"], deadline + SEC), t(deadline)).unwrap();
    let prev = &second.names[0].previous;
    assert_eq!(prev.lease, Some(first.lease));
    assert_eq!(prev.ended, Ended::Broken);
    assert_eq!(prev.ended_at, t(deadline));
    assert_eq!(
        prev.watermark,
        t(deadline),
        "a broken lease's deadline is its watermark"
    );
    assert_eq!(second.min_timestamp, t(deadline));

    // The broken holder can no longer renew or release.
    let err = tbl
        .renew(
            first.lease,
            &first.token,
            t(deadline + 2 * SEC),
            t(deadline),
            None,
            t(deadline),
        )
        .unwrap_err();
    assert!(matches!(err, Error::Expired { .. }), "{err:?}");
    let err = tbl
        .release(first.lease, &first.token, release_at(0), t(deadline))
        .unwrap_err();
    assert!(matches!(err, Error::Expired { .. }), "{err:?}");
}

#[test]
fn release_hands_the_watermark_on_and_it_never_decreases() {
    let tbl = table();
    let a = tbl.acquire(&full(&["x"], T0 + 5 * SEC), t(T0)).unwrap();
    assert_eq!(a.names[0].previous.ended, Ended::None);
    let r = tbl
        .release(a.lease, &a.token, release_at(T0 + 100), t(T0 + 200))
        .unwrap();
    assert_eq!(r.watermark, t(T0 + 100));

    let b = tbl.acquire(&full(&["x"], T0 + 6 * SEC), t(T0 + 300)).unwrap();
    assert_eq!(b.min_timestamp, t(T0 + 100));
    let prev = &b.names[0].previous;
    assert_eq!(
        (prev.lease, prev.ended, prev.ended_at),
        (Some(a.lease), Ended::Released, t(T0 + 200))
    );

    // A holder that wrote nothing carries the inherited watermark forward,
    // and a lower watermark cannot pull it back.
    let r = tbl
        .release(b.lease, &b.token, release_at(T0 + 50), t(T0 + 400))
        .unwrap();
    assert_eq!(r.watermark, t(T0 + 100));
    let c = tbl.acquire(&full(&["x"], T0 + 6 * SEC), t(T0 + 500)).unwrap();
    assert_eq!(c.min_timestamp, t(T0 + 100));
}

#[test]
fn watermark_at_or_after_the_deadline_is_refused() {
    let tbl = table();
    let a = tbl.acquire(&full(&["x"], T0 + 5 * SEC), t(T0)).unwrap();
    let err = tbl
        .release(a.lease, &a.token, release_at(T0 + 5 * SEC), t(T0 + 1))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutOfRange {
                field: "watermark_us",
                ..
            }
        ),
        "{err:?}"
    );
    // Refusal changed nothing: the lease still holds and can be released.
    tbl.release(a.lease, &a.token, release_at(T0 + 5 * SEC - 1), t(T0 + 2))
        .unwrap();
}

#[test]
fn min_timestamp_is_the_max_over_names() {
    let tbl = table();
    for (name, wm) in [("a", 10), ("b", 30), ("c", 20)] {
        let g = tbl.acquire(&full(&[name], T0 + SEC), t(T0)).unwrap();
        tbl.release(g.lease, &g.token, release_at(T0 + wm), t(T0 + 100))
            .unwrap();
    }
    let g = tbl
        .acquire(&full(&["a", "b", "c"], T0 + SEC), t(T0 + 200))
        .unwrap();
    assert_eq!(g.min_timestamp, t(T0 + 30));
}

#[test]
fn multi_name_acquire_is_all_or_nothing() {
    let tbl = table();
    let held = tbl.acquire(&full(&["b"], T0 + 5 * SEC), t(T0)).unwrap();
    let err = tbl
        .acquire(&full(&["a", "b", "c"], T0 + 5 * SEC), t(T0 + 1))
        .unwrap_err();
    assert!(matches!(&err, Error::Conflict(c) if &*c.name == "b" && c.holder == held.lease));
    // Neither a nor c was taken by the refused request.
    tbl.acquire(&full(&["a"], T0 + 5 * SEC), t(T0 + 2)).unwrap();
    tbl.acquire(&full(&["c"], T0 + 5 * SEC), t(T0 + 2)).unwrap();
}

#[test]
fn full_acquire_breaks_a_tentative_holder_and_its_upgrade_fails() {
    let tbl = table();
    let tent = tbl
        .acquire(&spec(&["a", "b"], T0 + 5 * SEC, Mode::Tentative), t(T0))
        .unwrap();
    // Tentative does not beat tentative.
    let err = tbl
        .acquire(&spec(&["b"], T0 + 5 * SEC, Mode::Tentative), t(T0 + 1))
        .unwrap_err();
    assert!(matches!(err, Error::Conflict(_)));
    // Full beats tentative.
    let f = tbl.acquire(&full(&["b"], T0 + 5 * SEC), t(T0 + 2)).unwrap();
    // The tentative lease wrote nothing: it is not in the chain.
    assert_eq!(f.names[0].previous.ended, Ended::None);
    assert!(f.names[0].fencing > tent.names[1].fencing);
    let err = tbl.upgrade(tent.lease, &tent.token, t(T0 + 3)).unwrap_err();
    assert!(
        matches!(&err, Error::LostName { name, by, .. } if &**name == "b" && *by == f.lease),
        "{err:?}"
    );
}

#[test]
fn upgrade_makes_a_tentative_lease_full() {
    let tbl = table();
    let tent = tbl
        .acquire(&spec(&["a", "b"], T0 + 5 * SEC, Mode::Tentative), t(T0))
        .unwrap();
    let up = tbl.upgrade(tent.lease, &tent.token, t(T0 + 1)).unwrap();
    assert_eq!(
        (up.lease, up.mode, up.deadline),
        (tent.lease, Mode::Full, t(T0 + 5 * SEC))
    );
    let err = tbl.acquire(&full(&["a"], T0 + 5 * SEC), t(T0 + 2)).unwrap_err();
    assert!(matches!(err, Error::Conflict(c) if c.mode == Mode::Full));
    // Upgrading twice is harmless.
    tbl.upgrade(tent.lease, &tent.token, t(T0 + 3)).unwrap();
}

#[test]
fn tentative_release_must_not_claim_writes() {
    let tbl = table();
    let tent = tbl
        .acquire(&spec(&["a"], T0 + 5 * SEC, Mode::Tentative), t(T0))
        .unwrap();
    let err = tbl
        .release(tent.lease, &tent.token, release_at(T0 + 1), t(T0 + 2))
        .unwrap_err();
    assert!(matches!(
        err,
        Error::InvalidArgument {
            field: "watermark_us",
            ..
        }
    ));
    tbl.release(tent.lease, &tent.token, release_at(0), t(T0 + 2))
        .unwrap();
}

#[test]
fn only_the_token_holder_may_renew_upgrade_or_release() {
    let tbl = table();
    let a = tbl.acquire(&full(&["a"], T0 + 5 * SEC), t(T0)).unwrap();
    // The token this lease would have under another table's key: right id,
    // right fencing token, wrong secret.
    let wrong = TokenKey::generate().token(a.lease, a.names[0].fencing);
    let now = t(T0 + 1);
    assert!(matches!(
        tbl.renew(a.lease, &wrong, t(T0 + 6 * SEC), now, None, now),
        Err(Error::WrongToken { .. })
    ));
    assert!(matches!(
        tbl.upgrade(a.lease, &wrong, now),
        Err(Error::WrongToken { .. })
    ));
    assert!(matches!(
        tbl.release(a.lease, &wrong, release_at(0), now),
        Err(Error::WrongToken { .. })
    ));
    let unknown = LeaseId::new(now, 0, 12_345);
    assert!(matches!(
        tbl.upgrade(unknown, &a.token, now),
        Err(Error::UnknownLease { .. })
    ));
}

#[test]
fn renew_extends_but_never_shortens() {
    let tbl = table();
    let a = tbl.acquire(&full(&["a"], T0 + 5 * SEC), t(T0)).unwrap();
    // Asking for less than the lease has keeps what it has.
    let r = tbl
        .renew(a.lease, &a.token, t(T0 + 4 * SEC), t(T0 + 1), None, t(T0 + 1))
        .unwrap();
    assert_eq!(r.deadline, t(T0 + 5 * SEC));
    let r = tbl
        .renew(a.lease, &a.token, t(T0 + 9 * SEC), t(T0 + 1), None, t(T0 + 1))
        .unwrap();
    assert_eq!(r.deadline, t(T0 + 9 * SEC));
    // Beyond the max TTL (a client whose clock is ahead asks for its TTL
    // from its now): granted as far as may be, not refused (before, its
    // every renewal of a lease at the max TTL was refused).
    let r = tbl
        .renew(
            a.lease,
            &a.token,
            t(T0 + 1 + 10 * SEC + 300_000),
            t(T0 + 1),
            None,
            t(T0 + 1),
        )
        .unwrap();
    assert_eq!(r.deadline, t(T0 + 1 + 10 * SEC));
    // The new deadline is what counts for conflicts and expiry.
    assert!(
        tbl.acquire(&full(&["a"], T0 + 12 * SEC), t(T0 + 9 * SEC))
            .is_err()
    );
    let b = tbl
        .acquire(&full(&["a"], T0 + 15 * SEC), t(T0 + 10 * SEC + 1))
        .unwrap();
    assert_eq!(b.min_timestamp, t(T0 + 10 * SEC + 1));
}

/// A renewal's deadline is judged from the instant its TTL was counted
/// from: the least TTL, counted a moment before the table's `now`, is in
/// range although it ends less than the min TTL after `now`; the same
/// deadline judged at `now` (as an absolute one is) is not.
#[test]
fn a_renewal_is_judged_from_where_its_ttl_was_counted() {
    let tbl = table();
    let min_ttl = 1000; // `TableConfig::for_tests`
    let a = tbl.acquire(&full(&["a"], T0 + min_ttl + 1), t(T0)).unwrap();
    let (counted_from, now) = (T0 + 400, T0 + 900);
    let deadline = counted_from + min_ttl + 1;
    let e = tbl
        .renew(a.lease, &a.token, t(deadline), t(now), None, t(now))
        .unwrap_err();
    assert!(matches!(e, Error::DeadlineOutOfRange { .. }), "{e:?}");
    let r = tbl
        .renew(a.lease, &a.token, t(deadline), t(counted_from), None, t(now))
        .unwrap();
    assert_eq!(r.deadline, t(deadline));
}

#[test]
fn deadlines_outside_the_range_are_refused() {
    let tbl = table();
    for deadline in [0, T0, T0 + 1000, T0 + 10 * SEC + 1] {
        let err = tbl.acquire(&full(&["a"], deadline), t(T0)).unwrap_err();
        assert!(matches!(err, Error::DeadlineOutOfRange { .. }), "{deadline}");
    }
    tbl.acquire(&full(&["a"], T0 + 10 * SEC), t(T0)).unwrap();
}

#[test]
fn restart_quarantine_and_unknown_predecessor() {
    let mut cfg = TableConfig::for_tests(Duration::from_secs(10));
    cfg.started = t(T0);
    cfg.ready_at = t(T0 + 11 * SEC);
    cfg.initial_floor = t(T0 + 10 * SEC);
    let tbl = LeaseTable::new(cfg);
    let err = tbl
        .acquire(&full(&["a"], T0 + 15 * SEC), t(T0 + 11 * SEC - 1))
        .unwrap_err();
    assert_eq!(
        err,
        Error::NotReady {
            started: t(T0),
            ready_at: t(T0 + 11 * SEC),
            seen: t(T0 + 11 * SEC - 1),
        }
    );
    let g = tbl
        .acquire(&full(&["a"], T0 + 15 * SEC), t(T0 + 11 * SEC))
        .unwrap();
    let prev = &g.names[0].previous;
    assert_eq!(
        (prev.ended, prev.lease, prev.watermark),
        (Ended::Unknown, None, t(T0 + 10 * SEC))
    );
    assert!(
        g.names[0].fencing >= T0 + 11 * SEC,
        "tokens start from the grant time"
    );
}

#[test]
fn fencing_tokens_strictly_increase() {
    let tbl = table();
    let mut last = 0;
    for i in 0..50u64 {
        // Several grants within the same microsecond still increase.
        let now = t(T0 + i / 5);
        let g = tbl.acquire(&full(&["f"], T0 + 5 * SEC), now).unwrap();
        assert!(g.names[0].fencing > last);
        last = g.names[0].fencing;
        tbl.release(g.lease, &g.token, release_at(0), now).unwrap();
    }
}

#[test]
fn forgetting_raises_the_floor_to_what_was_forgotten() {
    let mut cfg = TableConfig::for_tests(Duration::from_secs(10));
    cfg.shards = 1;
    cfg.max_records = 10;
    let tbl = LeaseTable::new(cfg);
    let mut top = 0;
    for i in 0..20u64 {
        let name = format!("n{i}");
        let now = T0 + i * SEC;
        let g = tbl.acquire(&full(&[&name], now + 5 * SEC), t(now)).unwrap();
        tbl.release(g.lease, &g.token, release_at(now + 1000 + i), t(now + 1))
            .unwrap();
        top = now + 1000 + i;
    }
    // One live holder is never forgotten.
    let live = tbl
        .acquire(&full(&["live"], T0 + 25 * SEC), t(T0 + 20 * SEC))
        .unwrap();
    assert_eq!(tbl.record_count(), 21);
    let forgotten = tbl.sweep(t(T0 + 21 * SEC));
    assert_eq!(forgotten, 21 - 9, "down to 90% of the cap");
    assert!(tbl.forgotten_floor() > Micros::ZERO);
    // Every name, forgotten or not, hands on at least its old watermark.
    for i in 0..20u64 {
        let name = format!("n{i}");
        let g = tbl
            .acquire(&full(&[&name], T0 + 30 * SEC), t(T0 + 22 * SEC))
            .unwrap();
        assert!(
            g.min_timestamp >= t(T0 + i * SEC + 1000 + i),
            "{name}: {:?}",
            g.min_timestamp
        );
        if g.names[0].previous.ended == Ended::Unknown {
            assert!(g.min_timestamp <= t(top));
        }
    }
    assert!(matches!(
        tbl.acquire(&full(&["live"], T0 + 30 * SEC), t(T0 + 22 * SEC)),
        Err(Error::Conflict(c)) if c.holder == live.lease
    ));
}

#[test]
fn forgotten_names_keep_their_tokens_rising_when_the_clock_steps_back() {
    let mut cfg = TableConfig::for_tests(Duration::from_secs(10));
    cfg.shards = 1;
    cfg.max_records = 1;
    let tbl = LeaseTable::new(cfg);
    let late = T0 + 100 * SEC;
    let g = tbl.acquire(&full(&["x"], late + 5 * SEC), t(late)).unwrap();
    let token = g.names[0].fencing;
    tbl.release(g.lease, &g.token, release_at(late), t(late + 1))
        .unwrap();
    // Two idle records over a cap of one: the older, x's, is forgotten.
    let g = tbl.acquire(&full(&["y"], late + 5 * SEC), t(late + 2)).unwrap();
    tbl.release(g.lease, &g.token, release_at(0), t(late + 3))
        .unwrap();
    assert_eq!(tbl.sweep(t(late + 4)), 1);
    assert_eq!(tbl.record_count(), 1);
    // The clock is stepped back a minute: the next token is still higher.
    let back = T0 + 40 * SEC;
    let g = tbl.acquire(&full(&["x"], back + 5 * SEC), t(back)).unwrap();
    assert_eq!(g.names[0].previous.ended, Ended::Unknown);
    assert!(
        g.names[0].fencing > token,
        "token {} after a forgotten {token}",
        g.names[0].fencing
    );
}

#[test]
fn unsettled_bags_travel_down_the_chain_until_someone_closes_them() {
    let tbl = table();
    let unsettled = |g: &Grant| g.names[0].previous.unsettled_until();
    // A holds and is broken: B is told to close through A's deadline.
    let a = tbl.acquire(&full(&["u"], T0 + SEC), t(T0)).unwrap();
    assert_eq!(unsettled(&a), None, "nothing came before A");
    let b = tbl.acquire(&full(&["u"], T0 + 3 * SEC), t(T0 + 2 * SEC)).unwrap();
    assert_eq!(b.names[0].previous.ended, Ended::Broken);
    assert_eq!(unsettled(&b), Some(t(T0 + SEC + 1)));
    // B releases without closing anything: C still has to, though its
    // immediate predecessor released.
    tbl.release(b.lease, &b.token, release_at(0), t(T0 + 2 * SEC + 1))
        .unwrap();
    let c = tbl
        .acquire(&full(&["u"], T0 + 5 * SEC), t(T0 + 2 * SEC + 2))
        .unwrap();
    assert_eq!(c.names[0].previous.ended, Ended::Released);
    assert_eq!(unsettled(&c), Some(t(T0 + SEC + 1)));
    // C closed through it: D inherits nothing unsettled.
    let rel = ReleaseSpec {
        settled_through: t(T0 + SEC + 1),
        ..Default::default()
    };
    tbl.release(c.lease, &c.token, rel, t(T0 + 2 * SEC + 3)).unwrap();
    let d = tbl
        .acquire(&full(&["u"], T0 + 6 * SEC), t(T0 + 2 * SEC + 4))
        .unwrap();
    assert_eq!(unsettled(&d), None);
    // D wrote something it is not sure landed: E must close through D's
    // watermark.
    let rel = ReleaseSpec {
        watermark: t(T0 + 2 * SEC + 100),
        unsettled: true,
        ..Default::default()
    };
    tbl.release(d.lease, &d.token, rel, t(T0 + 2 * SEC + 200))
        .unwrap();
    let e = tbl
        .acquire(&full(&["u"], T0 + 6 * SEC), t(T0 + 2 * SEC + 300))
        .unwrap();
    assert_eq!(unsettled(&e), Some(t(T0 + 2 * SEC + 101)));
    // A tentative holder wrote nothing and closes nothing: it changes
    // nothing of what the next holder inherits.
    tbl.release(e.lease, &e.token, release_at(0), t(T0 + 2 * SEC + 301))
        .unwrap();
    let f = tbl
        .acquire(
            &spec(&["u"], T0 + 6 * SEC, Mode::Tentative),
            t(T0 + 2 * SEC + 302),
        )
        .unwrap();
    tbl.release(f.lease, &f.token, release_at(0), t(T0 + 2 * SEC + 303))
        .unwrap();
    let g = tbl
        .acquire(&full(&["u"], T0 + 6 * SEC), t(T0 + 2 * SEC + 304))
        .unwrap();
    assert_eq!(g.names[0].previous.lease, Some(e.lease));
    assert_eq!(unsettled(&g), Some(t(T0 + 2 * SEC + 101)));
}

#[test]
fn history_is_bounded_per_name() {
    let mut cfg = TableConfig::for_tests(Duration::from_secs(10));
    cfg.history_per_name = 3;
    let tbl = LeaseTable::new(cfg);
    for i in 0..5u64 {
        let now = T0 + i * SEC;
        let g = tbl.acquire(&full(&["h"], now + 5 * SEC), t(now)).unwrap();
        let spec = ReleaseSpec {
            watermark: t(now + 10),
            metadata: Some(Metadata::Data(format!("m{i}").into_bytes().into())),
            ..Default::default()
        };
        tbl.release(g.lease, &g.token, spec, t(now + 20)).unwrap();
    }
    let (entries, truncated) = tbl.history("h");
    assert!(truncated);
    let metas: Vec<_> = entries.iter().map(|e| e.metadata.clone()).collect();
    let want: Vec<_> = (2..5)
        .map(|i| Some(Metadata::Data(format!("m{i}").into_bytes().into())))
        .collect();
    assert_eq!(metas, want);
}

#[test]
fn history_respects_the_byte_budget() {
    let mut cfg = TableConfig::for_tests(Duration::from_secs(10));
    cfg.shards = 1;
    cfg.history_budget_bytes = 4 * 1024;
    let tbl = LeaseTable::new(cfg);
    for i in 0..100u64 {
        let name = format!("n{}", i % 10);
        let now = T0 + i * 1000;
        let g = tbl.acquire(&full(&[&name], now + 5 * SEC), t(now)).unwrap();
        let spec = ReleaseSpec {
            watermark: t(now + 10),
            metadata: Some(Metadata::Data(vec![7u8; 200].into())),
            ..Default::default()
        };
        tbl.release(g.lease, &g.token, spec, t(now + 20)).unwrap();
    }
    let shard = tbl.shards[0].lock();
    assert!(shard.history.bytes() <= 4 * 1024, "{}", shard.history.bytes());
    drop(shard);
    // The newest entry of the last name written is still there.
    let (entries, _) = tbl.history("n9");
    assert_eq!(entries.last().map(|e| e.at), Some(t(T0 + 99 * 1000 + 20)));
    // The first name's early entries went for the budget, without its
    // record being touched: its read says so.
    let (entries, truncated) = tbl.history("n0");
    assert!(entries.iter().all(|e| e.at > t(T0 + 20)), "{entries:?}");
    assert!(truncated);
}

/// Renewals of one lease with metadata under the per-name cap must not
/// grow the shard's order list: it is drained over the byte budget,
/// which the cap keeps it under, so nothing else would bound it.
#[test]
fn history_bookkeeping_does_not_grow_with_renewals() {
    let mut cfg = TableConfig::for_tests(Duration::from_secs(10));
    cfg.shards = 1;
    cfg.history_per_name = 8;
    let tbl = LeaseTable::new(cfg);
    let g = tbl.acquire(&full(&["r"], T0 + 5 * SEC), t(T0)).unwrap();
    let meta = Some(Metadata::Data(vec![1u8; 16].into()));
    let bytes_after_8 = {
        for i in 1..=8u64 {
            tbl.renew(
                g.lease,
                &g.token,
                t(T0 + 5 * SEC + i),
                t(T0 + i),
                meta.clone(),
                t(T0 + i),
            )
            .unwrap();
        }
        tbl.shards[0].lock().history.bytes()
    };
    for i in 9..100_000u64 {
        tbl.renew(
            g.lease,
            &g.token,
            t(T0 + 5 * SEC + i),
            t(T0 + i),
            meta.clone(),
            t(T0 + i),
        )
        .unwrap();
    }
    let shard = tbl.shards[0].lock();
    assert_eq!(shard.history.len(), 8, "one order entry per kept entry");
    assert!(shard.history.held() <= 2 * 8 + HistoryLog::SLACK);
    assert_eq!(shard.history.bytes(), bytes_after_8);
    drop(shard);
    let (entries, truncated) = tbl.history("r");
    assert_eq!(entries.len(), 8);
    assert!(truncated);
    assert_eq!(entries.last().unwrap().at, t(T0 + 99_999));

    // A forgotten name takes its entries out of the order too.
    tbl.release(g.lease, &g.token, release_at(0), t(T0 + 100_000))
        .unwrap();
    let mut cfg = tbl.config().clone();
    cfg.max_records = 0;
    let small = LeaseTable::new(cfg);
    let g = small.acquire(&full(&["f"], T0 + 5 * SEC), t(T0)).unwrap();
    small
        .renew(g.lease, &g.token, t(T0 + 6 * SEC), t(T0 + 1), meta, t(T0 + 1))
        .unwrap();
    small
        .release(g.lease, &g.token, release_at(0), t(T0 + 2))
        .unwrap();
    assert_eq!(small.shards[0].lock().history.len(), 2);
    assert_eq!(small.sweep(t(T0 + 3)), 1);
    let shard = small.shards[0].lock();
    assert_eq!((shard.history.len(), shard.history.bytes()), (0, 0));
}

/// Entries the per-name cap drops from the middle of the shard's order
/// (a busy name's previous release, behind a thousand names released
/// once) leave tombstones there; the order keeps at most as many as it has
/// live entries (plus a little slack), and the oldest live entry is still
/// the first out (the one the byte budget evicts).
#[test]
fn history_order_keeps_tombstones_bounded() {
    let mut cfg = TableConfig::for_tests(Duration::from_secs(10));
    cfg.shards = 1;
    cfg.history_per_name = 1;
    let tbl = LeaseTable::new(cfg);
    let cycle = |name: &str, now: u64| {
        let g = tbl.acquire(&full(&[name], now + 5 * SEC), t(now)).unwrap();
        tbl.release(g.lease, &g.token, release_at(0), t(now + 1)).unwrap();
    };
    let quiet = 1000;
    for i in 0..quiet {
        cycle(&format!("n{i}"), T0 + i);
    }
    let live = quiet as usize + 1;
    let mut most = 0;
    for i in 0..20_000 {
        cycle("busy", T0 + SEC + i);
        let shard = tbl.shards[0].lock();
        assert_eq!(shard.history.len(), live);
        most = most.max(shard.history.held());
    }
    assert!(
        most <= 2 * live + HistoryLog::SLACK,
        "the order held {most} entries for {live} live ones"
    );
    let shard = tbl.shards[0].lock();
    // The oldest live entry is the first quiet name's release.
    let oldest = shard.history.oldest().expect("entries are kept");
    assert_eq!(oldest.at, t(T0 + 1));
}

// ---------------------------------------------------------------------------
// Property test against a reference model: a plain map, no sharding.

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        names: Vec<usize>,
        ttl: u64,
        tentative: bool,
    },
    Release {
        lease: usize,
        wm_back: u64,
    },
    Renew {
        lease: usize,
        extra: u64,
    },
    Upgrade {
        lease: usize,
    },
    Advance {
        us: u64,
    },
    Sweep,
}

const NAMES: [&str; 4] = ["a", "b", "c", "d"];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (proptest::collection::vec(0..NAMES.len(), 1..4), 10u64..5_000, any::<bool>())
            .prop_map(|(names, ttl, tentative)| Op::Acquire { names, ttl, tentative }),
        3 => (0usize..16, 0u64..3_000).prop_map(|(lease, wm_back)| Op::Release { lease, wm_back }),
        1 => (0usize..16, 0u64..3_000).prop_map(|(lease, extra)| Op::Renew { lease, extra }),
        1 => (0usize..16).prop_map(|lease| Op::Upgrade { lease }),
        3 => (0u64..4_000).prop_map(|us| Op::Advance { us }),
        1 => Just(Op::Sweep),
    ]
}

#[derive(Clone, Debug, Default)]
struct ModelName {
    holder: Option<(usize, u64, Mode)>,
    watermark: u64,
    fencing: u64,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn table_matches_reference_model(ops in proptest::collection::vec(op(), 1..60)) {
        let mut cfg = TableConfig::for_tests(Duration::from_millis(10));
        cfg.min_ttl = Duration::from_micros(5);
        let tbl = LeaseTable::new(cfg);
        let mut now = T0;
        let mut model: BTreeMap<&str, ModelName> = BTreeMap::new();
        let mut grants: Vec<Grant> = Vec::new();

        for op in ops {
            match op {
                Op::Advance { us } => now += us,
                Op::Sweep => { tbl.sweep(t(now)); }
                Op::Acquire { names, ttl, tentative } => {
                    let mut ns: Vec<&str> = names.iter().map(|&i| NAMES[i]).collect();
                    ns.sort();
                    ns.dedup();
                    let mode = if tentative { Mode::Tentative } else { Mode::Full };
                    let deadline = now + ttl;
                    let free = ns.iter().all(|n| match model.get(n).and_then(|m| m.holder) {
                        Some((_, d, hmode)) if d > now => hmode == Mode::Tentative && mode == Mode::Full,
                        _ => true,
                    });
                    let got = tbl.acquire(&spec(&ns, deadline, mode), t(now));
                    prop_assert_eq!(got.is_ok(), free, "acquire {:?} at {}: {:?}", ns, now, got);
                    if let Ok(g) = got {
                        // A tentative lease broken here loses all its names.
                        let broken: Vec<usize> = ns.iter()
                            .filter_map(|n| match model.get(n).and_then(|m| m.holder) {
                                Some((l, d, Mode::Tentative)) if d > now => Some(l),
                                _ => None,
                            })
                            .collect();
                        for m in model.values_mut() {
                            if m.holder.is_some_and(|(l, _, _)| broken.contains(&l)) {
                                m.holder = None;
                            }
                        }
                        let mut want_min = 0;
                        for (n, ng) in ns.iter().zip(&g.names) {
                            let m = model.entry(n).or_default();
                            if let Some((_, d, Mode::Full)) = m.holder {
                                m.watermark = m.watermark.max(d);
                            }
                            want_min = want_min.max(m.watermark);
                            prop_assert!(ng.fencing > m.fencing);
                            prop_assert_eq!(ng.previous.watermark, t(m.watermark));
                            m.fencing = ng.fencing;
                            m.holder = Some((grants.len(), deadline, mode));
                        }
                        prop_assert_eq!(g.min_timestamp, t(want_min));
                        grants.push(g);
                    }
                }
                Op::Release { lease, wm_back } => {
                    let Some(g) = grants.get(lease) else { continue };
                    let holds = |model: &BTreeMap<&str, ModelName>| g.names.iter().all(|ng| {
                        matches!(model.get(&*ng.name).and_then(|m| m.holder),
                                 Some((l, d, _)) if l == lease && d > now)
                    });
                    let full = model.get(&*g.names[0].name).and_then(|m| m.holder)
                        .is_some_and(|(_, _, m)| m == Mode::Full);
                    let deadline = model.get(&*g.names[0].name).and_then(|m| m.holder)
                        .map_or(0, |(_, d, _)| d);
                    let wm = if full { deadline.saturating_sub(1 + wm_back) } else { 0 };
                    let ok = holds(&model);
                    let got = tbl.release(g.lease, &g.token, release_at(wm), t(now));
                    prop_assert_eq!(got.is_ok(), ok, "release {:?}: {:?}", lease, got);
                    if ok {
                        for ng in &g.names {
                            let m = model.get_mut(&*ng.name).unwrap();
                            if full { m.watermark = m.watermark.max(wm); }
                            m.holder = None;
                        }
                    }
                }
                Op::Renew { lease, extra } => {
                    let Some(g) = grants.get(lease) else { continue };
                    let held: Vec<_> = g.names.iter().map(|ng| model.get(&*ng.name).and_then(|m| m.holder)).collect();
                    let ok_hold = held.iter().all(|h| matches!(h, Some((l, d, _)) if *l == lease && *d > now));
                    let current = held[0].map_or(0, |(_, d, _)| d);
                    let new_deadline = (current + extra).min(now + 10_000);
                    let ok = ok_hold && new_deadline > now + 5;
                    let got = tbl.renew(g.lease, &g.token, t(new_deadline), t(now), None, t(now));
                    prop_assert_eq!(got.is_ok(), ok, "renew {}: {:?}", lease, got);
                    if let Ok(r) = got {
                        let kept = new_deadline.max(current);
                        prop_assert_eq!(r.deadline, t(kept));
                        for ng in &g.names {
                            let m = model.get_mut(&*ng.name).unwrap();
                            m.holder = m.holder.map(|(l, _, md)| (l, kept, md));
                        }
                    }
                }
                Op::Upgrade { lease } => {
                    let Some(g) = grants.get(lease) else { continue };
                    let ok = g.names.iter().all(|ng| matches!(model.get(&*ng.name).and_then(|m| m.holder),
                        Some((l, d, _)) if l == lease && d > now));
                    let got = tbl.upgrade(g.lease, &g.token, t(now));
                    prop_assert_eq!(got.is_ok(), ok, "upgrade {}: {:?}", lease, got);
                    if ok {
                        for ng in &g.names {
                            let m = model.get_mut(&*ng.name).unwrap();
                            m.holder = m.holder.map(|(l, d, _)| (l, d, Mode::Full));
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_broken_tentative_lease_frees_its_names_and_answers_alike() {
    // Broken on its first name or on another: the same answer, and the
    // names nobody took are free at once.
    for (taken, other) in [("a", "b"), ("b", "a")] {
        let tbl = table();
        let tentative = tbl
            .acquire(&spec(&["a", "b"], T0 + 5 * SEC, Mode::Tentative), t(T0))
            .unwrap();
        let breaker = tbl.acquire(&full(&[taken], T0 + 5 * SEC), t(T0 + 1)).unwrap();
        for err in [
            tbl.upgrade(tentative.lease, &tentative.token, t(T0 + 2))
                .unwrap_err(),
            tbl.renew(
                tentative.lease,
                &tentative.token,
                t(T0 + 3 * SEC),
                t(T0 + 2),
                None,
                t(T0 + 2),
            )
            .unwrap_err(),
            tbl.release(tentative.lease, &tentative.token, release_at(0), t(T0 + 2))
                .unwrap_err(),
        ] {
            assert_eq!(
                err,
                Error::LostName {
                    lease: tentative.lease,
                    name: Arc::from(taken),
                    by: breaker.lease,
                },
                "{taken}"
            );
        }
        let view = tbl.describe(&[Arc::from(other)], t(T0 + 2));
        assert_eq!(view[0].holder, None, "{other} is free");
        tbl.acquire(&full(&[other], T0 + 5 * SEC), t(T0 + 2)).unwrap();
    }
}

/// Whether `ticket` has a wake-up waiting for it (without waiting).
fn woken(ticket: &Ticket) -> bool {
    use std::future::Future as _;
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    std::pin::pin!(ticket.notified()).poll(&mut cx).is_ready()
}

#[test]
fn a_release_wakes_only_the_first_waiter_of_the_name() {
    let tbl = table();
    let holder = tbl.acquire(&full(&["q"], T0 + 5 * SEC), t(T0)).unwrap();
    let (mut first, mut second, mut other) = (Ticket::default(), Ticket::default(), Ticket::default());
    let want = full(&["q"], T0 + 6 * SEC);
    assert!(tbl.acquire_queued(&want, t(T0 + 1), Some(&mut first)).is_err());
    assert!(tbl.acquire_queued(&want, t(T0 + 2), Some(&mut second)).is_err());
    let _busy = tbl.acquire(&full(&["r"], T0 + 5 * SEC), t(T0)).unwrap();
    assert!(
        tbl.acquire_queued(&full(&["r"], T0 + 6 * SEC), t(T0 + 3), Some(&mut other))
            .is_err()
    );
    assert!(first.is_first() && !second.is_first());
    assert_eq!(
        (
            tbl.waiting(),
            tbl.describe(&[Arc::from("q")], t(T0 + 3))[0].waiters
        ),
        (3, 2)
    );

    tbl.release(holder.lease, &holder.token, release_at(0), t(T0 + 4))
        .unwrap();
    assert!(woken(&first));
    assert!(!woken(&second) && !woken(&other));
    // The first takes the name and leaves the queue: the second is first
    // now, and woken to watch the new holder itself.
    let got = tbl.acquire_queued(&want, t(T0 + 5), Some(&mut first)).unwrap();
    assert!(!first.is_queued());
    assert!(woken(&second));
    assert!(tbl.acquire_queued(&want, t(T0 + 6), Some(&mut second)).is_err());
    assert!(second.is_first());
    tbl.leave_queue(&mut second);
    tbl.leave_queue(&mut other);
    assert_eq!(tbl.waiting(), 0);
    assert_eq!(got.names[0].name, Arc::from("q"));
}

#[test]
fn waiters_are_bounded_per_name_and_in_all() {
    let mut cfg = TableConfig::for_tests(Duration::from_secs(10));
    cfg.max_waiters_per_name = 2;
    cfg.max_waiters = 3;
    let tbl = LeaseTable::new(cfg);
    tbl.acquire(&full(&["a"], T0 + 5 * SEC), t(T0)).unwrap();
    tbl.acquire(&full(&["b"], T0 + 5 * SEC), t(T0)).unwrap();
    let mut tickets: Vec<Ticket> = (0..5).map(|_| Ticket::default()).collect();
    let mut try_wait = |name: &str, i: usize| {
        tbl.acquire_queued(&full(&[name], T0 + 6 * SEC), t(T0 + 1), Some(&mut tickets[i]))
            .unwrap_err()
    };
    assert!(matches!(try_wait("a", 0), Error::Conflict(_)));
    assert!(matches!(try_wait("a", 1), Error::Conflict(_)));
    let per_name = try_wait("a", 2).to_string();
    assert!(
        per_name.contains("limit of 2") && per_name.contains("--max-waiters-per-name"),
        "{per_name}"
    );
    assert!(matches!(try_wait("b", 3), Error::Conflict(_)));
    let total = try_wait("b", 4).to_string();
    assert!(
        total.contains("limit of 3") && total.contains("--max-waiters)"),
        "{total}"
    );
}

fn owned(names: &[&str], deadline: u64, owner: &str, peer: Option<&str>) -> AcquireSpec {
    let mut s = full(names, deadline);
    s.owner = Arc::from(owner);
    s.peer = peer.map(|p| p.parse().unwrap());
    s
}

#[test]
fn names_held_are_capped_in_all_per_owner_and_per_peer() {
    let mut cfg = TableConfig::for_tests(Duration::from_secs(10));
    cfg.held = HeldLimits {
        total: 6,
        per_owner: 3,
        per_peer: 4,
    };
    let tbl = LeaseTable::new(cfg);
    let d = T0 + 5 * SEC;
    let a = tbl
        .acquire(&owned(&["a1", "a2", "a3"], d, "a", Some("10.0.0.1")), t(T0))
        .unwrap();
    let err = tbl
        .acquire(&owned(&["a4"], d, "a", Some("10.0.0.2")), t(T0))
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    let msg = err.to_string();
    assert!(
        msg.contains("owner \"a\"")
            && msg.contains("limit of 3")
            && msg.contains("--max-held-names-per-owner"),
        "{msg}"
    );
    tbl.acquire(&owned(&["b1"], d, "b", Some("10.0.0.1")), t(T0))
        .unwrap();
    let err = tbl
        .acquire(&owned(&["b2"], d, "b", Some("10.0.0.1")), t(T0))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("10.0.0.1") && err.contains("limit of 4") && err.contains("--max-held-names-per-peer"),
        "{err}"
    );
    tbl.acquire(&owned(&["c1", "c2"], d, "c", None), t(T0)).unwrap();
    let err = tbl
        .acquire(&owned(&["c3"], d, "c", None), t(T0))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("limit of 6") && err.contains("--max-held-names)"),
        "{err}"
    );
    assert_eq!(tbl.held(), 6);
    // A refused acquire reserved nothing; a release gives its names back.
    tbl.release(a.lease, &a.token, release_at(0), t(T0 + 1)).unwrap();
    assert_eq!(tbl.held(), 3);
    assert_eq!(tbl.owner_usage("a").unwrap().held(), 0);
    tbl.acquire(&owned(&["a4", "a5"], d, "a", Some("10.0.0.2")), t(T0 + 1))
        .unwrap();
    // A lease whose deadline passed stops counting at the next sweep.
    tbl.sweep(t(d));
    assert_eq!(tbl.held(), 0);
    tbl.acquire(&owned(&["a6", "a7", "a8"], d + 5 * SEC, "a", None), t(d))
        .unwrap();
}

/// Item 4 of issue 13: a client churning through names must not make the
/// server forget another client's idle record (it forgot the oldest,
/// whoever's), and so hand that name the raised floor.
#[test]
fn churn_forgets_the_churners_records_not_others() {
    let mut cfg = TableConfig::for_tests(Duration::from_secs(10));
    cfg.shards = 1;
    cfg.max_records = 100;
    let tbl = LeaseTable::new(cfg);
    let keep = tbl
        .acquire(
            &owned(&["keep"], T0 + 5 * SEC, "keeper", Some("127.0.0.1")),
            t(T0),
        )
        .unwrap();
    tbl.release(keep.lease, &keep.token, release_at(T0 + 10), t(T0 + 20))
        .unwrap();
    let mut now = T0 + SEC;
    for i in 0..1_000 {
        let name = format!("churn-{i}");
        let g = tbl
            .acquire(&owned(&[&name], now + SEC, "churner", Some("127.0.0.1")), t(now))
            .unwrap();
        tbl.release(g.lease, &g.token, release_at(now + 10), t(now + 20))
            .unwrap();
        now += 100;
        if i % 50 == 0 {
            tbl.sweep(t(now));
        }
    }
    tbl.sweep(t(now));
    assert!(tbl.record_count() <= 100);
    assert!(
        tbl.forgotten_floor() > t(T0 + SEC),
        "the churner's records were forgotten"
    );
    let view = &tbl.describe(&[Arc::from("keep")], t(now))[0];
    assert!(view.known, "the keeper's idle record was forgotten");
    assert_eq!(view.previous.watermark, t(T0 + 10));
    assert_eq!(view.previous.lease, Some(keep.lease));
}

/// Issue 37 item 5: one lease's events reach watchers in the order they
/// happened in the table. The expiry is decided by the table under the
/// name's lock: once watchers were told a lease expired, a renewal whose
/// `now` was read before the deadline (it raced the hub's tick) is refused
/// rather than reported Renewed after Expired; a renewal that took the
/// lock first keeps the lease, and no expiry is reported for it.
#[test]
fn an_expiry_is_decided_by_the_table_in_order_with_the_lease_s_other_events() {
    use crate::watch::{EventKind, Filter};
    let tbl = table();
    let (mut sub, _) = tbl
        .watch_hub()
        .subscribe(Filter::Prefix(String::new()), None)
        .unwrap();
    let deadline = T0 + 5 * SEC;
    let a = tbl.acquire(&full(&["a", "a2"], deadline), t(T0)).unwrap();
    let b = tbl.acquire(&full(&["b"], deadline), t(T0)).unwrap();
    // `b` renews with a `now` just before the deadline, before the tick.
    tbl.renew(
        b.lease,
        &b.token,
        t(deadline + 5 * SEC),
        t(deadline - 1),
        None,
        t(deadline - 1),
    )
    .unwrap();
    tbl.watch_tick(t(deadline));
    // `a`'s renewal read its `now` before the deadline but comes after the
    // tick: too late, it is refused as expired.
    let err = tbl
        .renew(
            a.lease,
            &a.token,
            t(deadline + 5 * SEC),
            t(deadline - 1),
            None,
            t(deadline - 1),
        )
        .unwrap_err();
    assert!(matches!(err, Error::Expired { .. }), "{err:?}");
    let err = tbl.upgrade(a.lease, &a.token, t(deadline - 1)).unwrap_err();
    assert!(matches!(err, Error::Expired { .. }), "{err:?}");
    // Nor is it listed or described as held any more.
    assert!(tbl.list("a", None, 10, t(deadline - 1)).names.is_empty());
    // The next holder breaks it.
    tbl.acquire(&full(&["a"], deadline + 5 * SEC), t(deadline - 1))
        .unwrap();
    let mut events = Vec::new();
    let mut last = 0;
    while let Some(Ok(e)) = sub.try_next() {
        assert!(e.revision > last, "revisions grow");
        last = e.revision;
        events.push((e.event.kind, e.event.name.to_string(), e.event.lease));
    }
    let of = |lease: LeaseId| -> Vec<(EventKind, String)> {
        events
            .iter()
            .filter(|(_, _, l)| *l == lease)
            .map(|(k, n, _)| (*k, n.clone()))
            .collect()
    };
    assert_eq!(
        of(a.lease),
        [
            (EventKind::Granted, "a".to_owned()),
            (EventKind::Granted, "a2".to_owned()),
            (EventKind::Expired, "a".to_owned()),
            (EventKind::Expired, "a2".to_owned()),
            (EventKind::Broken, "a".to_owned()),
        ]
    );
    assert_eq!(
        of(b.lease),
        [
            (EventKind::Granted, "b".to_owned()),
            (EventKind::Renewed, "b".to_owned())
        ]
    );
}

/// Issue 38 item 4: the hub that a first watcher wakes is not seeded on
/// that watcher's request (at a million held names that took 2.5 s): the
/// ticks read the live leases into it, and a lease whose deadline passes
/// before its shard is read is still reported Expired; one that lapsed
/// before the hub woke is not (nobody watched then).
#[test]
fn the_woken_hub_is_seeded_by_the_ticks_and_misses_no_expiry() {
    use crate::watch::{EventKind, Filter};
    let tbl = table();
    let lapsed = tbl.acquire(&full(&["lapsed"], T0 + SEC), t(T0)).unwrap();
    let deadline = T0 + 5 * SEC;
    let mut held = Vec::new();
    for i in 0..100 {
        let name = format!("held-{i:03}");
        held.push(tbl.acquire(&full(&[&name], deadline), t(T0)).unwrap().lease);
    }
    let mut sub = tbl
        .watch(Filter::Prefix(String::new()), None, t(T0 + 2 * SEC))
        .unwrap();
    let hub = tbl.watch_hub();
    assert!(hub.seeding(), "seeding waits for the tick");
    assert_eq!(hub.tracked(), 0, "nothing was read on the watch's request");
    // The deadline passes before any tick: the first one seeds, then
    // reports every expiry.
    tbl.watch_tick(t(deadline));
    assert!(!hub.seeding());
    let mut expired = Vec::new();
    while let Some(Ok(e)) = sub.try_next() {
        assert_eq!(e.event.kind, EventKind::Expired, "{e:?}");
        expired.push(e.event.lease);
    }
    assert!(!expired.contains(&lapsed.lease), "lapsed before anyone watched");
    expired.sort();
    held.sort();
    assert_eq!(expired, held);
}
