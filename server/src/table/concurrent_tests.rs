//! The lease table under real concurrency. The property test in `tests.rs`
//! drives one thread against a reference model; here several threads race
//! on a handful of names (so multi-name leases span shards and meet in
//! them), every acknowledged answer is recorded, and a checker replays the
//! history against the rules a holder relies on:
//!
//! * fencing tokens strictly increase per name, also in real time (a grant
//!   acknowledged before another started has the lower token);
//! * a lease's deadline never moves below one already acknowledged (by a
//!   grant, renew or upgrade that finished before the later one started);
//! * each grant names the name's last full holder as its predecessor: a
//!   released one with its watermark, or a broken one, broken no earlier
//!   than every deadline it was acknowledged, its watermark at least that;
//! * watermarks never decrease along a chain, `min_timestamp` is the max
//!   of the inherited ones, and what is unsettled travels down the chain.
//!
//! The clock is injected (a shared counter every operation advances), so
//! leases expire and are broken within the run. `BAGEL_MODEL_OPS` sets the
//! operations per thread (default 20000: under a second).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

use super::*;

const T0: u64 = 1_000_000_000;
const NAMES: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

fn ops_per_thread() -> usize {
    std::env::var("BAGEL_MODEL_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

/// One acknowledged operation, with the instants (of a global sequence)
/// its call started and returned, and the `now` it was given.
#[derive(Clone, Debug)]
enum Acked {
    Grant {
        grant: Grant,
        now: u64,
    },
    /// A renew, or with `upgrade` an upgrade, and the deadline it states.
    Deadline {
        lease: LeaseId,
        deadline: u64,
        upgrade: bool,
    },
    Release {
        lease: LeaseId,
        spec: ReleaseSpec,
    },
}

#[derive(Clone, Debug)]
struct Event {
    start: u64,
    end: u64,
    what: Acked,
}

/// A lease some worker holds (as far as the workers know). The workers
/// share one pool, so renewals, upgrades and releases of one lease race.
#[derive(Clone, Copy)]
struct Held {
    lease: LeaseId,
    token: Token,
    full: bool,
    deadline: u64,
    inherited: u64,
}

type Pool = Mutex<Vec<Held>>;

fn worker(
    tbl: &LeaseTable,
    clock: &AtomicU64,
    seq: &AtomicU64,
    pool: &Pool,
    seed: u64,
    ops: usize,
) -> Vec<Event> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut events = Vec::new();
    for _ in 0..ops {
        let now = clock.fetch_add(rng.gen_range(0..40), Ordering::SeqCst);
        let t_now = Micros::from_micros(now);
        let pick = rng.gen_range(0..100);
        let chosen = {
            let mut pool = pool.lock().unwrap();
            if pool.is_empty() || pick < 40 {
                None
            } else {
                let i = rng.gen_range(0..pool.len());
                // Releasing or walking away takes it out of the pool.
                Some(if pick >= 70 { pool.swap_remove(i) } else { pool[i] })
            }
        };
        let start = seq.fetch_add(1, Ordering::SeqCst);
        let what = match chosen {
            None => {
                let k = rng.gen_range(1..=4);
                let mut names: Vec<Arc<str>> = (0..k)
                    .map(|_| Arc::from(NAMES[rng.gen_range(0..NAMES.len())]))
                    .collect();
                names.sort();
                names.dedup();
                let mode = if rng.gen_bool(0.25) {
                    Mode::Tentative
                } else {
                    Mode::Full
                };
                let spec = AcquireSpec {
                    names,
                    deadline: Micros::from_micros(now + rng.gen_range(200..3000)),
                    owner: Arc::from("w"),
                    mode,
                    peer: None,
                    holder_key: None,
                };
                tbl.acquire(&spec, t_now).ok().map(|grant| {
                    pool.lock().unwrap().push(Held {
                        lease: grant.lease,
                        token: grant.token,
                        full: mode == Mode::Full,
                        deadline: grant.deadline.as_micros(),
                        inherited: grant.min_timestamp.as_micros(),
                    });
                    Acked::Grant { grant, now }
                })
            }
            Some(h) => match pick {
                40..60 => {
                    let deadline = Micros::from_micros(now + rng.gen_range(100..3000));
                    tbl.renew(h.lease, &h.token, deadline, t_now, None, t_now)
                        .ok()
                        .map(|g| Acked::Deadline {
                            lease: h.lease,
                            deadline: g.deadline.as_micros(),
                            upgrade: false,
                        })
                }
                60..70 => tbl
                    .upgrade(h.lease, &h.token, t_now)
                    .ok()
                    .map(|g| Acked::Deadline {
                        lease: h.lease,
                        deadline: g.deadline.as_micros(),
                        upgrade: true,
                    }),
                70..95 => {
                    // A watermark the holder may not know is below the
                    // deadline; the table refuses it if not.
                    let watermark = if h.full && rng.gen_bool(0.7) {
                        rng.gen_range(0..h.deadline)
                    } else {
                        0
                    };
                    let spec = ReleaseSpec {
                        watermark: Micros::from_micros(watermark),
                        unsettled: h.full && rng.gen_bool(0.2),
                        settled_through: Micros::from_micros(if rng.gen_bool(0.5) {
                            h.inherited + 1
                        } else {
                            0
                        }),
                        ..Default::default()
                    };
                    tbl.release(h.lease, &h.token, spec.clone(), t_now)
                        .ok()
                        .map(|_| Acked::Release { lease: h.lease, spec })
                }
                // Walk away: the lease expires and is broken later.
                _ => None,
            },
        };
        let end = seq.fetch_add(1, Ordering::SeqCst);
        if let Some(what) = what {
            events.push(Event { start, end, what });
        }
    }
    events
}

/// What the history says about one lease.
#[derive(Debug, Default)]
struct LeaseLife {
    /// Acknowledged deadlines with the call's (start, end).
    deadlines: Vec<(u64, u64, u64)>,
    upgraded: bool,
    release: Option<ReleaseSpec>,
}

impl LeaseLife {
    fn max_deadline(&self) -> u64 {
        self.deadlines.iter().map(|d| d.2).max().unwrap_or(0)
    }
}

/// Checks the whole history; returns every violation found.
fn check(events: &[Event]) -> Vec<String> {
    let mut bad = Vec::new();
    let mut lives: HashMap<LeaseId, LeaseLife> = HashMap::new();
    // Per name: (fencing, the grant's event, the grant, its `now`).
    type NameGrants<'a> = Vec<(u64, &'a Event, &'a Grant, u64)>;
    let mut grants: HashMap<Arc<str>, NameGrants<'_>> = HashMap::new();
    for e in events {
        match &e.what {
            Acked::Grant { grant, now } => {
                let life = lives.entry(grant.lease).or_default();
                life.deadlines.push((e.start, e.end, grant.deadline.as_micros()));
                for n in &grant.names {
                    grants
                        .entry(Arc::clone(&n.name))
                        .or_default()
                        .push((n.fencing, e, grant, *now));
                }
            }
            Acked::Deadline {
                lease,
                deadline,
                upgrade,
            } => {
                let life = lives.entry(*lease).or_default();
                life.deadlines.push((e.start, e.end, *deadline));
                life.upgraded |= upgrade;
            }
            Acked::Release { lease, spec } => {
                lives.entry(*lease).or_default().release = Some(spec.clone());
            }
        }
    }
    // Deadlines never move back.
    for (lease, life) in &lives {
        for x in &life.deadlines {
            for y in &life.deadlines {
                if x.1 < y.0 && y.2 < x.2 {
                    bad.push(format!(
                        "lease {lease}: deadline {} acknowledged after {} was",
                        y.2, x.2
                    ));
                }
            }
        }
    }

    for (name, list) in &mut grants {
        list.sort_by_key(|g| g.0);
        for pair in list.windows(2) {
            if pair[0].0 == pair[1].0 {
                bad.push(format!("{name}: two grants with fencing token {}", pair[0].0));
            }
        }
        for x in list.iter() {
            for y in list.iter() {
                if x.1.end < y.1.start && x.0 >= y.0 {
                    bad.push(format!(
                        "{name}: grant {} (token {}) finished before grant {} (token {}) started",
                        x.2.lease, x.0, y.2.lease, y.0
                    ));
                }
            }
        }
        let mut last_full: Option<&Grant> = None;
        // The latest `now` of the grants since the last full holder's: a
        // holder is broken by the first grant after its deadline, which
        // may be a tentative one before `g`.
        let mut break_now = 0;
        for &(_, _, g, now) in list.iter() {
            break_now = break_now.max(now);
            let prev = &g
                .names
                .iter()
                .find(|n| n.name == *name)
                .expect("own name")
                .previous;
            if g.min_timestamp < prev.watermark {
                bad.push(format!(
                    "{name}: lease {} min_timestamp below its inheritance",
                    g.lease
                ));
            }
            match last_full {
                None => {
                    if prev.lease.is_some() || prev.unsettled {
                        bad.push(format!("{name}: first grant {} names {prev:?}", g.lease));
                    }
                }
                Some(a) => {
                    let a_prev = &a.names.iter().find(|n| n.name == *name).expect("own").previous;
                    let life = &lives[&a.lease];
                    if prev.lease != Some(a.lease) {
                        bad.push(format!(
                            "{name}: lease {} names {:?} as predecessor, not the last full holder {}",
                            g.lease, prev.lease, a.lease
                        ));
                    } else if let Some(rel) = &life.release {
                        let want_wm = a_prev.watermark.max(rel.watermark);
                        let want_unsettled = rel.unsettled
                            || a_prev.unsettled_until().is_some_and(|u| rel.settled_through < u);
                        if prev.ended != Ended::Released
                            || prev.watermark != want_wm
                            || prev.unsettled != want_unsettled
                        {
                            bad.push(format!(
                                "{name}: lease {} inherits {prev:?} from released {} (release {rel:?}, \
                                 its own inheritance {a_prev:?})",
                                g.lease, a.lease
                            ));
                        }
                    } else {
                        let max = life.max_deadline();
                        if prev.ended != Ended::Broken
                            || break_now < max
                            || prev.watermark.as_micros() < max
                            || !prev.unsettled
                        {
                            bad.push(format!(
                                "{name}: lease {} breaks {} (grants since at or before {break_now}) \
                                 whose acknowledged deadlines reach {max}; inherits {prev:?}",
                                g.lease, a.lease
                            ));
                        }
                    }
                    if prev.watermark < a_prev.watermark {
                        bad.push(format!("{name}: watermark went down at lease {}", g.lease));
                    }
                }
            }
            let full = g.mode == Mode::Full || lives[&g.lease].upgraded;
            if full {
                last_full = Some(g);
                break_now = 0;
            }
        }
    }
    bad
}

#[test]
fn concurrent_history_keeps_every_safety_rule() {
    let mut cfg = TableConfig::for_tests(Duration::from_millis(5));
    cfg.min_ttl = Duration::from_micros(10);
    let tbl = Arc::new(LeaseTable::new(cfg));
    let clock = Arc::new(AtomicU64::new(T0));
    let seq = Arc::new(AtomicU64::new(0));
    let ops = ops_per_thread();
    let seed: u64 = std::env::var("BAGEL_MODEL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    let threads = 4;
    let pool: Pool = Mutex::new(Vec::new());
    let start = Arc::new(Barrier::new(threads));
    let events: Vec<Event> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads as u64)
            .map(|i| {
                let (tbl, clock, seq, pool, start) = (&tbl, &clock, &seq, &pool, Arc::clone(&start));
                s.spawn(move || {
                    start.wait();
                    worker(tbl, clock, seq, pool, seed.wrapping_add(i), ops)
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("worker"))
            .collect()
    });
    let grants = events
        .iter()
        .filter(|e| matches!(e.what, Acked::Grant { .. }))
        .count();
    assert!(grants > ops / 4, "too few grants to mean anything: {grants}");
    let bad = check(&events);
    assert!(
        bad.is_empty(),
        "seed {seed}: {} violations in {} events, first: {:#?}",
        bad.len(),
        events.len(),
        &bad[..bad.len().min(5)]
    );
}

/// Two names in different shards, so a renew of a lease on both has to
/// drop its first shard lock to take both in order.
fn names_in_two_shards(tbl: &LeaseTable) -> (Arc<str>, Arc<str>) {
    let a: Arc<str> = Arc::from("x0");
    let b = (1..)
        .map(|i| Arc::<str>::from(format!("x{i}")))
        .find(|b| tbl.shard_of(b) != tbl.shard_of(&a))
        .expect("some name lands in another shard");
    if a < b { (a, b) } else { (b, a) }
}

#[test]
fn racing_renews_never_move_a_deadline_back() {
    let tbl = Arc::new(LeaseTable::new(TableConfig::for_tests(Duration::from_secs(10))));
    let (a, b) = names_in_two_shards(&tbl);
    let rounds: u64 = std::env::var("BAGEL_RACE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let barrier = Barrier::new(3);
    let lease: Mutex<Option<(LeaseId, Token, u64)>> = Mutex::new(None);
    let sec = 1_000_000;
    std::thread::scope(|s| {
        let renewers: Vec<_> = [6 * sec, 7 * sec]
            .into_iter()
            .map(|extra| {
                let (tbl, barrier, lease) = (&tbl, &barrier, &lease);
                s.spawn(move || {
                    let mut acked = Vec::new();
                    for _ in 0..rounds {
                        barrier.wait();
                        let (id, token, now) = lease.lock().unwrap().expect("set by the main thread");
                        let ok = tbl
                            .renew(
                                id,
                                &token,
                                Micros::from_micros(now + extra),
                                Micros::from_micros(now),
                                None,
                                Micros::from_micros(now),
                            )
                            .is_ok();
                        acked.push(ok.then_some(now + extra));
                        barrier.wait();
                    }
                    acked
                })
            })
            .collect();
        let mut finals = Vec::new();
        for round in 0..rounds {
            let now = T0 + round * 100 * sec;
            let g = tbl
                .acquire(
                    &AcquireSpec {
                        names: vec![Arc::clone(&a), Arc::clone(&b)],
                        deadline: Micros::from_micros(now + 5 * sec),
                        owner: Arc::from("t"),
                        mode: Mode::Full,
                        peer: None,
                        holder_key: None,
                    },
                    Micros::from_micros(now),
                )
                .expect("free");
            *lease.lock().unwrap() = Some((g.lease, g.token, now));
            barrier.wait();
            barrier.wait();
            let view = tbl.describe(std::slice::from_ref(&a), Micros::from_micros(now));
            finals.push(view[0].holder.as_ref().expect("held").deadline.as_micros());
            tbl.release(
                g.lease,
                &g.token,
                ReleaseSpec::default(),
                Micros::from_micros(now),
            )
            .expect("release");
        }
        let acked: Vec<Vec<Option<u64>>> = renewers.into_iter().map(|h| h.join().unwrap()).collect();
        let mut behind = 0;
        for (round, fin) in finals.iter().enumerate() {
            let best = acked.iter().filter_map(|a| a[round]).max().unwrap_or(0);
            if *fin < best {
                behind += 1;
            }
        }
        assert_eq!(
            behind, 0,
            "in {behind} of {rounds} rounds the deadline stayed below an acknowledged renewal"
        );
    });
}
