//! `List` over the shards' name orders: what a page costs (names looked
//! at, not time) and that the orders follow every way a holder comes and
//! goes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bagel_proto::Micros;

use super::*;

const T0: u64 = 1_000_000_000;
const SEC: u64 = 1_000_000;
const SHARDS: usize = 64;

fn t(us: u64) -> Micros {
    Micros::from_micros(us)
}

fn table(shards: usize) -> LeaseTable {
    LeaseTable::new(TableConfig {
        shards,
        max_records: 1 << 22,
        ..TableConfig::for_tests(Duration::from_secs(10))
    })
}

fn one(name: &str, deadline: u64, mode: Mode) -> AcquireSpec {
    AcquireSpec {
        names: vec![Arc::from(name)],
        deadline: t(deadline),
        owner: Arc::from("test"),
        mode,
        peer: None,
        holder_key: None,
    }
}

fn names(page: &ListPage) -> Vec<&str> {
    page.names.iter().map(|l| &*l.name).collect()
}

/// Every shard's order is sorted and holds exactly the names with a
/// listed holder.
fn check_orders(tbl: &LeaseTable) {
    for shard in tbl.shards.iter() {
        let state = shard.lock();
        state.order.check(&state.slab);
        let listed: BTreeSet<u32> = state
            .slab
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                e.as_ref()
                    .and_then(|e| e.rec.holder.as_ref())
                    .is_some_and(|h| h.listed)
            })
            .map(|(slot, _)| slot as u32)
            .collect();
        let ordered: BTreeSet<u32> = state.order.slots().collect();
        assert_eq!(listed, ordered);
    }
}

/// The cost: each page was a pass over every record (10^5 names
/// looked at, for a page of 100 or a prefix matching nothing). Now a page
/// of k looks at about k names plus a few per shard and a binary search
/// per shard, and a prefix matching nothing only at the searches.
#[test]
fn a_page_looks_at_about_its_size_not_at_the_table() {
    const N: usize = 100_000;
    let tbl = table(SHARDS);
    let deadline = T0 + 5 * SEC;
    for i in 0..N {
        tbl.acquire(&one(&format!("n-{i:06}"), deadline, Mode::Full), t(T0))
            .unwrap();
    }
    let now = t(T0 + 1);
    // A binary search per shard (over its runs, then within one, each
    // rounding up), and the first name past the prefix.
    let log = (usize::BITS - (N / SHARDS).leading_zeros()) as usize;
    let seek = SHARDS * (log + 4);
    for (prefix, after, k) in [
        ("", None, 100),
        ("", None, 1000),
        ("n-05", None, 100),
        ("", Some("n-070000"), 100),
        ("n-0", Some("n-099950"), 100),
    ] {
        let mut touched = 0;
        let page = tbl.list_touching(prefix, after, k, now, &mut touched);
        let matching: Vec<String> = (0..N)
            .map(|i| format!("n-{i:06}"))
            .filter(|n| n.starts_with(prefix) && after.is_none_or(|a| n.as_str() > a))
            .collect();
        assert_eq!(
            names(&page),
            matching[..k.min(matching.len())],
            "{prefix:?} after {after:?}"
        );
        assert_eq!(page.more, matching.len() > k);
        // Read: the page, the next name, and a first read of a couple of
        // names per shard beyond its share (doubling where a shard ran dry).
        let bound = 3 * (k + 1) + 4 * SHARDS + 2 * seek;
        assert!(
            touched <= bound,
            "{prefix:?} after {after:?}: {touched} > {bound}"
        );
    }
    for prefix in ["zz", "m", "n-1", "n-0999999"] {
        let mut touched = 0;
        let page = tbl.list_touching(prefix, None, 1000, now, &mut touched);
        assert!(page.names.is_empty() && !page.more, "{prefix:?}");
        assert!(touched <= seek, "{prefix:?}: {touched} > {seek}");
    }

    // Paging through everything: each name once, in order, at about one
    // name looked at per name listed.
    let (mut after, mut all, mut touched) = (None::<String>, Vec::new(), 0);
    loop {
        let page = tbl.list_touching("", after.as_deref(), 1000, now, &mut touched);
        all.extend(page.names.iter().map(|l| l.name.to_string()));
        if !page.more {
            break;
        }
        after = all.last().cloned();
    }
    assert_eq!(all.len(), N);
    assert!(all.windows(2).all(|w| w[0] < w[1]));
    let pages = N / 1000;
    assert!(touched <= 3 * N + pages * (4 * SHARDS + 2 * seek), "{touched}");
}

/// Holders that lapsed and were never released (a crashed client's) leave
/// the order at the sweep, so pages stop looking at them; one renewed
/// after the sweep (its `now` read before the deadline) is listed again.
#[test]
fn the_sweep_takes_lapsed_holders_out_and_a_late_renewal_puts_one_back() {
    let tbl = table(8);
    let deadline = T0 + 5 * SEC;
    let mut keeper = None;
    for i in 0..5000 {
        let g = tbl
            .acquire(&one(&format!("x-{i:05}"), deadline, Mode::Full), t(T0))
            .unwrap();
        if i == 1234 {
            keeper = Some(g);
        }
    }
    let live = tbl.acquire(&one("y", T0 + 9 * SEC, Mode::Full), t(T0)).unwrap();
    let after = t(deadline);
    let mut touched = 0;
    let page = tbl.list_touching("", None, 10, after, &mut touched);
    assert_eq!(names(&page), ["y"]);
    assert!(touched >= 5000, "unswept lapsed holders are looked at: {touched}");

    tbl.sweep(after);
    check_orders(&tbl);
    let mut touched = 0;
    let page = tbl.list_touching("", None, 10, after, &mut touched);
    assert_eq!(names(&page), ["y"]);
    assert!(touched < 100, "{touched}");

    // A renewal that read its clock a microsecond before the deadline.
    let keeper = keeper.unwrap();
    let before = t(deadline - 1);
    tbl.renew(
        keeper.lease,
        &keeper.token,
        t(deadline + 5 * SEC),
        before,
        None,
        before,
    )
    .unwrap();
    check_orders(&tbl);
    assert_eq!(names(&tbl.list("", None, 10, after)), ["x-01234", "y"]);
    tbl.release(live.lease, &live.token, ReleaseSpec::default(), after)
        .unwrap();
    assert_eq!(names(&tbl.list("", None, 10, after)), ["x-01234"]);
    check_orders(&tbl);
}

/// A tiny deterministic generator, so a failure replays.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Random grants (full and tentative, one or several names), breaks,
/// releases, renewals, expiries, sweeps and forgetting: after each step
/// the orders hold exactly the listed holders, and paging through a
/// prefix gives exactly the names held, in order.
#[test]
fn the_orders_follow_every_way_a_holder_comes_and_goes() {
    let tbl = LeaseTable::new(TableConfig {
        shards: 4,
        max_records: 40,
        ..TableConfig::for_tests(Duration::from_secs(10))
    });
    let mut rng = Lcg(38);
    let mut now = T0;
    let mut grants: Vec<Grant> = Vec::new();
    let pool: Vec<String> = (0..300)
        .map(|i| format!("{}{i}", ["a/", "b/", "ab"][i % 3]))
        .collect();
    for step in 0..4000 {
        now += rng.next(SEC / 4);
        match rng.next(10) {
            0..=4 => {
                let k = 1 + rng.next(3) as usize;
                let mut names: Vec<Arc<str>> = (0..k)
                    .map(|_| Arc::from(pool[rng.next(300) as usize].as_str()))
                    .collect();
                names.sort();
                names.dedup();
                let mode = if rng.next(3) == 0 {
                    Mode::Tentative
                } else {
                    Mode::Full
                };
                let spec = AcquireSpec {
                    names,
                    ..one("", now + SEC + rng.next(4 * SEC), mode)
                };
                if let Ok(g) = tbl.acquire(&spec, t(now)) {
                    grants.push(g);
                }
            }
            5 | 6 if !grants.is_empty() => {
                let g = grants.swap_remove(rng.next(grants.len() as u64) as usize);
                let _ = tbl.release(g.lease, &g.token, ReleaseSpec::default(), t(now));
            }
            7 if !grants.is_empty() => {
                let g = &grants[rng.next(grants.len() as u64) as usize];
                let _ = tbl.renew(g.lease, &g.token, t(now + 3 * SEC), t(now), None, t(now));
            }
            8 => {
                tbl.sweep(t(now));
            }
            _ => {}
        }
        check_orders(&tbl);
        if step % 20 != 0 {
            continue;
        }
        for prefix in ["", "a", "a/", "b/1", "c"] {
            let held: Vec<String> = tbl
                .describe(
                    &pool.iter().map(|n| Arc::from(n.as_str())).collect::<Vec<_>>(),
                    t(now),
                )
                .into_iter()
                .filter(|v| v.holder.is_some() && v.name.starts_with(prefix))
                .map(|v| v.name.to_string())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let mut listed = Vec::new();
            let mut after = None::<String>;
            loop {
                let page = tbl.list(prefix, after.as_deref(), 7, t(now));
                assert!(page.names.len() <= 7);
                listed.extend(page.names.iter().map(|l| l.name.to_string()));
                if !page.more {
                    break;
                }
                after = listed.last().cloned();
            }
            assert_eq!(listed, held, "step {step}, prefix {prefix:?}");
        }
    }
}
