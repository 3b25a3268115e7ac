//! What the lease table counts for operators, at the cost of an atomic add.
//!
//! The table stays free of any metrics library: it keeps plain atomics and
//! small bounded structures, and the HTTP side (`crate::http`) reads them
//! when it is scraped. Everything here is updated by a thread that already
//! holds the shard lock of the lease's first name, so the counters of a
//! shard sit on a cache line no other core writes, and the hot path takes no
//! extra lock and allocates nothing.
//!
//! Three kinds of numbers:
//!
//! * **Counters per shard** ([`ShardCounters`]): grants, upgrades,
//!   renewals, releases, breaks, and expired leases the table dropped.
//!   Read without locks and summed ([`Counts`]).
//! * **A census** ([`Census`]): what only a scan can tell exactly, because
//!   leases expire without anybody touching them: names held, leases held,
//!   and leases whose deadline passed without a release. Taken on demand
//!   (a scrape), one shard lock at a time.
//! * **Bounded memory of notable names**: the busiest names by grants (a
//!   Space-Saving sketch per shard, [`Busiest`]) and the last few breaks
//!   ([`BreakEvent`]). Memory stays bounded whatever the name churn.

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};

use bagel_proto::Micros;

use super::ids::LeaseId;
use super::record::{Holder, Mode, NameRecord};

/// Names tracked per shard by the busiest-names sketch. With 256 shards the
/// table tracks 2048 names; any name with more than 1/8 of its shard's
/// grants is guaranteed to be among them.
pub const BUSIEST_PER_SHARD: usize = 8;

/// Breaks remembered for the status page.
pub const RECENT_BREAKS: usize = 16;

/// A pair of numbers, one per lease mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByMode {
    pub full: u64,
    pub tentative: u64,
}

impl ByMode {
    pub fn get(&self, mode: Mode) -> u64 {
        match mode {
            Mode::Full => self.full,
            Mode::Tentative => self.tentative,
        }
    }

    fn add(&mut self, mode: Mode, n: u64) {
        match mode {
            Mode::Full => self.full += n,
            Mode::Tentative => self.tentative += n,
        }
    }

    pub fn total(&self) -> u64 {
        self.full + self.tentative
    }
}

/// A counter per mode.
#[derive(Debug, Default)]
struct ModeCounter([AtomicU64; 2]);

impl ModeCounter {
    fn inc(&self, mode: Mode) {
        self.0[mode as usize].fetch_add(1, Relaxed);
    }

    fn read(&self) -> ByMode {
        ByMode {
            full: self.0[Mode::Full as usize].load(Relaxed),
            tentative: self.0[Mode::Tentative as usize].load(Relaxed),
        }
    }
}

/// One shard's counters, each changed under the shard lock of the lease's
/// first name (so a lease is counted once, whatever its number of names).
#[derive(Debug, Default)]
pub(super) struct ShardCounters {
    grants: ModeCounter,
    upgrades: AtomicU64,
    renewals: AtomicU64,
    releases: ModeCounter,
    /// Per name: a full holder's deadline had passed (`full`), or a live
    /// tentative holder was preempted by a full acquire (`tentative`).
    breaks: ModeCounter,
    /// Expired leases the table no longer holds (replaced by a grant or
    /// forgotten). Read under the shard lock by the census, so that
    /// together with the expired holders still in the shard it never
    /// counts a lease twice nor goes down.
    lapsed: ModeCounter,
}

impl ShardCounters {
    pub(super) fn granted(&self, mode: Mode) {
        self.grants.inc(mode);
    }

    pub(super) fn upgraded(&self) {
        self.upgrades.fetch_add(1, Relaxed);
    }

    pub(super) fn renewed(&self) {
        self.renewals.fetch_add(1, Relaxed);
    }

    pub(super) fn released(&self, mode: Mode) {
        self.releases.inc(mode);
    }
}

/// Lease events since the table was made, summed over shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Leases granted by an acquire.
    pub grants: ByMode,
    pub upgrades: u64,
    pub renewals: u64,
    /// Leases released by their holder.
    pub releases: ByMode,
    /// Names taken from a holder: `full`, a holder whose deadline had
    /// passed without a release; `tentative`, a live tentative holder
    /// preempted by a full acquire.
    pub breaks: ByMode,
}

impl Counts {
    pub(super) fn add(&mut self, c: &ShardCounters) {
        let g = c.grants.read();
        self.grants.full += g.full;
        self.grants.tentative += g.tentative;
        self.upgrades += c.upgrades.load(Relaxed);
        self.renewals += c.renewals.load(Relaxed);
        let r = c.releases.read();
        self.releases.full += r.full;
        self.releases.tentative += r.tentative;
        let b = c.breaks.read();
        self.breaks.full += b.full;
        self.breaks.tentative += b.tentative;
    }
}

/// What a scan of the table found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// Name records kept (held or idle).
    pub names: u64,
    /// Names with a live holder, by the holder's mode.
    pub held_names: ByMode,
    /// Live leases, by mode.
    pub held_leases: ByMode,
    /// Leases whose deadline passed without a release, since the table was
    /// made (still in the table or already dropped). Never goes down.
    pub expiries: ByMode,
    /// Bytes of renew/release history kept (the budgeted weight).
    pub history_bytes: u64,
}

impl Census {
    /// Adds one shard's record. `first` says whether the record is its
    /// holder's lease's first name (where a lease is counted).
    pub(super) fn record(&mut self, holder: Option<&Holder>, first: bool, now: Micros) {
        self.names += 1;
        let Some(h) = holder else { return };
        if h.is_live(now) {
            self.held_names.add(h.mode, 1);
            if first {
                self.held_leases.add(h.mode, 1);
            }
        } else if first {
            self.expiries.add(h.mode, 1);
        }
    }

    /// Adds a shard's dropped expiries, read under its lock.
    pub(super) fn lapsed(&mut self, c: &ShardCounters) {
        let l = c.lapsed.read();
        self.expiries.full += l.full;
        self.expiries.tentative += l.tentative;
    }
}

/// A name whose full holder missed its deadline, found by the next grant.
#[derive(Clone, Debug, PartialEq)]
pub struct BreakEvent {
    pub name: Arc<str>,
    /// The lease that missed its deadline, and its owner.
    pub lease: LeaseId,
    pub owner: Arc<str>,
    pub deadline: Micros,
    /// When the next grant found it.
    pub at: Micros,
    /// The lease that took the name.
    pub by: LeaseId,
}

/// Table-wide statistics that are rarely written.
#[derive(Debug, Default)]
pub(super) struct TableStats {
    /// The last [`RECENT_BREAKS`] breaks, oldest first. Its lock is a leaf
    /// (taken under shard locks, never the other way round) and only on a
    /// break, which means a holder missed its deadline.
    recent_breaks: Mutex<VecDeque<BreakEvent>>,
    /// How often forgetting idle records raised the forgotten floor.
    pub floor_raises: AtomicU64,
}

impl TableStats {
    /// Counts what a grant by lease `by` at `now` does to the holder it
    /// replaces on `name`, whose record is at `slot` of shard `shard`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn replacing(
        &self,
        counters: &ShardCounters,
        shard: usize,
        slot: usize,
        name: &Arc<str>,
        rec: &NameRecord,
        by: LeaseId,
        now: Micros,
    ) {
        let Some(h) = rec.holder.as_ref() else { return };
        let live = h.is_live(now);
        if !live && is_first(h, shard, slot) {
            counters.lapsed.inc(h.mode);
        }
        match (h.mode, live) {
            (Mode::Full, false) => {
                counters.breaks.inc(Mode::Full);
                let mut ring = self.recent_breaks.lock().unwrap_or_else(PoisonError::into_inner);
                if ring.len() == RECENT_BREAKS {
                    ring.pop_front();
                }
                ring.push_back(BreakEvent {
                    name: Arc::clone(name),
                    lease: h.lease,
                    owner: rec.owner(),
                    deadline: h.deadline,
                    at: now,
                    by,
                });
            }
            // A full acquire preempting a tentative reservation.
            (Mode::Tentative, true) => counters.breaks.inc(Mode::Tentative),
            // An expired tentative lease leaves no trace but its expiry.
            (Mode::Tentative, false) | (Mode::Full, true) => {}
        }
    }

    /// Counts an expired holder dropped with its record.
    pub(super) fn forgetting(
        &self,
        counters: &ShardCounters,
        shard: usize,
        slot: usize,
        holder: Option<&Holder>,
    ) {
        if let Some(h) = holder
            && is_first(h, shard, slot)
        {
            counters.lapsed.inc(h.mode);
        }
    }

    pub(super) fn recent_breaks(&self) -> Vec<BreakEvent> {
        let ring = self.recent_breaks.lock().unwrap_or_else(PoisonError::into_inner);
        ring.iter().cloned().collect()
    }
}

/// Whether this record (shard, slot) is where `h`'s lease is counted: its
/// first name, which its id points at.
pub(super) fn is_first(h: &Holder, shard: usize, slot: usize) -> bool {
    h.lease.shard() == shard && h.lease.slot() == slot
}

/// The busiest names of one shard by grants: a Space-Saving sketch
/// (Metwally et al., 2005) of [`BUSIEST_PER_SHARD`] counters.
///
/// A name already tracked gets its count raised; an untracked one takes
/// over the smallest counter, inheriting its count as an overestimate
/// (`error`). Every name granted more often than `1/k` of the shard's
/// grants is tracked, and every count is at most `error` too high. Memory
/// is fixed, whatever the number of distinct names.
#[derive(Debug, Default)]
pub(super) struct Busiest {
    slots: Vec<Slot>,
    hasher: RandomState,
}

/// A tracked name with the hash of it: a grant of a name not tracked (most
/// of them, when many names are busy) is told apart by comparing the
/// hashes, which lie in the slots, not by reading eight names from eight
/// places in memory (which was 2-3 % of a session server's CPU).
#[derive(Debug)]
struct Slot {
    print: u64,
    tracked: Tracked,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Tracked {
    pub name: Arc<str>,
    pub grants: u64,
    /// How much of `grants` may belong to names this one displaced.
    pub error: u64,
}

impl Busiest {
    pub(super) fn observe(&mut self, name: &Arc<str>) {
        let print = self.hasher.hash_one(&**name);
        if let Some(slot) = self
            .slots
            .iter_mut()
            .find(|s| s.print == print && (Arc::ptr_eq(&s.tracked.name, name) || *s.tracked.name == **name))
        {
            slot.tracked.grants += 1;
            return;
        }
        let tracked = |grants, error| Tracked {
            name: Arc::clone(name),
            grants,
            error,
        };
        if self.slots.len() < BUSIEST_PER_SHARD {
            self.slots.push(Slot {
                print,
                tracked: tracked(1, 0),
            });
            return;
        }
        let min = self
            .slots
            .iter_mut()
            .min_by_key(|s| s.tracked.grants)
            .expect("the sketch is full");
        let grants = min.tracked.grants;
        *min = Slot {
            print,
            tracked: tracked(grants + 1, grants),
        };
    }

    /// Halves every count, so the sketch follows what is busy now rather
    /// than since the start. Counts that reach zero free their slot.
    pub(super) fn decay(&mut self) {
        for Slot { tracked: t, .. } in &mut self.slots {
            t.grants /= 2;
            t.error /= 2;
        }
        self.slots.retain(|s| s.tracked.grants > 0);
    }

    pub(super) fn tracked(&self) -> impl Iterator<Item = &Tracked> {
        self.slots.iter().map(|s| &s.tracked)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{AcquireSpec, LeaseTable, ReleaseSpec, TableConfig};
    use super::*;

    const SEC: u64 = 1_000_000;

    fn t(s: u64) -> Micros {
        Micros::from_micros(1_000 * SEC + s * SEC)
    }

    fn spec(names: &[&str], deadline: Micros, mode: Mode) -> AcquireSpec {
        AcquireSpec {
            names: names.iter().map(|n| Arc::from(*n)).collect(),
            deadline,
            owner: Arc::from("w1"),
            mode,
            peer: None,
            holder_key: None,
        }
    }

    #[test]
    fn counts_and_census_follow_leases_through_their_lives() {
        let tbl = LeaseTable::new(TableConfig::for_tests(Duration::from_secs(10)));
        let a = tbl.acquire(&spec(&["a"], t(5), Mode::Full), t(0)).unwrap();
        let bc = tbl
            .acquire(&spec(&["b", "c"], t(5), Mode::Tentative), t(0))
            .unwrap();
        let d = tbl.acquire(&spec(&["d"], t(3), Mode::Full), t(0)).unwrap();
        assert!(tbl.acquire(&spec(&["a"], t(5), Mode::Full), t(1)).is_err());
        tbl.renew(a.lease, &a.token, t(6), t(1), None, t(1)).unwrap();
        let c = tbl.counts();
        assert_eq!(
            c.grants,
            ByMode {
                full: 2,
                tentative: 1
            }
        );
        assert_eq!((c.renewals, c.upgrades, c.releases.total()), (1, 0, 0));
        let census = tbl.census(t(1));
        assert_eq!(census.names, 4);
        assert_eq!(
            census.held_names,
            ByMode {
                full: 2,
                tentative: 2
            }
        );
        assert_eq!(
            census.held_leases,
            ByMode {
                full: 2,
                tentative: 1
            }
        );
        assert_eq!(census.expiries, ByMode::default());

        // `d` lapses: an expiry as soon as its deadline passes, before
        // anyone touches the name, and still one after a grant breaks it.
        assert_eq!(
            tbl.census(t(3)).expiries,
            ByMode {
                full: 1,
                tentative: 0
            }
        );
        assert!(tbl.recent_breaks().is_empty());
        let d2 = tbl.acquire(&spec(&["d"], t(8), Mode::Full), t(4)).unwrap();
        assert_eq!(
            tbl.census(t(4)).expiries,
            ByMode {
                full: 1,
                tentative: 0
            }
        );
        let breaks = tbl.recent_breaks();
        assert_eq!(breaks.len(), 1);
        assert_eq!(
            (
                &*breaks[0].name,
                breaks[0].lease,
                &*breaks[0].owner,
                breaks[0].deadline,
                breaks[0].by
            ),
            ("d", d.lease, "w1", t(3), d2.lease)
        );

        // A full acquire preempts the tentative holder of `c` (a break of
        // a tentative lease), which frees its other name `b` too: a broken
        // lease neither holds names nor lapses later.
        tbl.acquire(&spec(&["c"], t(9), Mode::Full), t(4)).unwrap();
        let c = tbl.counts();
        assert_eq!(
            c.breaks,
            ByMode {
                full: 1,
                tentative: 1
            }
        );
        assert_eq!(
            tbl.census(t(4)).held_leases,
            ByMode {
                full: 3,
                tentative: 0
            }
        );
        assert_eq!(
            tbl.census(t(5)).expiries,
            ByMode {
                full: 1,
                tentative: 0
            }
        );
        tbl.acquire(&spec(&["b"], t(9), Mode::Full), t(5)).unwrap();
        assert_eq!(
            tbl.census(t(5)).expiries,
            ByMode {
                full: 1,
                tentative: 0
            }
        );
        let _ = bc;

        // Releases by mode.
        tbl.release(a.lease, &a.token, ReleaseSpec::default(), t(5))
            .unwrap();
        assert_eq!(
            tbl.counts().releases,
            ByMode {
                full: 1,
                tentative: 0
            }
        );

        // Busiest names: by grants, then by name.
        let top: Vec<_> = tbl
            .busiest(3)
            .into_iter()
            .map(|t| (t.name.to_string(), t.grants))
            .collect();
        assert_eq!(top, [("b".into(), 2), ("c".into(), 2), ("d".into(), 2)]);
    }

    #[test]
    fn forgetting_an_expired_holder_keeps_it_counted() {
        let mut cfg = TableConfig::for_tests(Duration::from_secs(10));
        cfg.max_records = 0;
        cfg.shards = 1;
        let tbl = LeaseTable::new(cfg);
        tbl.acquire(&spec(&["x"], t(2), Mode::Full), t(0)).unwrap();
        assert_eq!(tbl.census(t(3)).expiries.full, 1);
        assert_eq!(tbl.sweep(t(3)), 1);
        let census = tbl.census(t(3));
        assert_eq!((census.names, census.expiries.full), (0, 1));
        assert_eq!(tbl.floor_raises(), 1);
    }

    fn name(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    #[test]
    fn busiest_keeps_heavy_hitters_in_fixed_memory() {
        let mut b = Busiest::default();
        // Two heavy names among a stream of ten thousand distinct ones.
        for i in 0..10_000 {
            b.observe(&name(&format!("churn-{i}")));
            if i % 3 == 0 {
                b.observe(&name("hot"));
            }
            if i % 5 == 0 {
                b.observe(&name("warm"));
            }
        }
        assert_eq!(b.tracked().count(), BUSIEST_PER_SHARD);
        let get = |n: &str| b.tracked().find(|t| &*t.name == n).cloned().expect(n);
        let hot = get("hot");
        let warm = get("warm");
        // Never an underestimate; the overestimate is bounded by `error`.
        assert!(hot.grants >= 3334 && hot.grants - hot.error <= 3334, "{hot:?}");
        assert!(
            warm.grants >= 2000 && warm.grants - warm.error <= 2000,
            "{warm:?}"
        );
    }

    #[test]
    fn busiest_decays_and_frees_slots() {
        let mut b = Busiest::default();
        b.observe(&name("b"));
        for _ in 0..4 {
            b.observe(&name("a"));
        }
        b.decay();
        let left = |b: &Busiest| -> Vec<_> { b.tracked().map(|t| (t.name.to_string(), t.grants)).collect() };
        assert_eq!(left(&b), vec![("a".to_owned(), 2)]);
        // The slot freed before it takes nothing of "a"'s: "a" is still
        // found where it moved to.
        b.observe(&name("a"));
        assert_eq!(left(&b), vec![("a".to_owned(), 3)]);
    }
}
