//! The light lane: one reader thread at the runtime's own CPU priority,
//! for the reads of identities that read little.
//!
//! Why: `List` pages are read niced ([`super::readers`]) so that one
//! tenant's flood of reads cannot slow grants and renewals. But then
//! every tenant's page is read at that priority, after a turn among the
//! flood's pages: under another tenant's flood, on a contended core, a
//! tenant that lists now and then waited ten times its time alone
//! (`bagel-bench --noisy-neighbour`: `List` p50 1.45 ms alone, 14.4 ms
//! under the flood). What makes a read a danger to grants is not that it
//! is a read but that one identity reads *much*.
//!
//! So each identity's reading is counted: the CPU time of its reads, on
//! whichever thread, decaying by half every [`HALF_LIFE`], and the reads
//! it has in flight. A read is *light* when its identity has no other
//! read in flight or waiting and a count under [`LIGHT_BUDGET`]: it runs
//! at once, without waiting for a turn, on this lane's one thread at the
//! runtime's priority, when that thread is free and the lane's own count
//! is under [`LANE_BUDGET`]. Any other read waits for its turn and is
//! read niced, as before. A flood is never light: many reads at once are
//! never alone, and one read after another passes the budget within its
//! first pages. All light reads together take at most about a fourteenth
//! of a core at the grants' priority (a count of 100 ms at a half life of
//! a second is ~70 ms of CPU a second), and the lane adds one read to the
//! `--list-pages` read at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How fast a count forgets: it halves every this long.
pub const HALF_LIFE: Duration = Duration::from_secs(1);

/// An identity whose count of read CPU time is under this reads on the
/// light lane (steady, ~35 ms of reading a second, 3.5 % of a core).
pub const LIGHT_BUDGET: Duration = Duration::from_millis(50);

/// The lane reads only while its own count is under this (steady, ~70 ms
/// a second, 7 % of a core).
pub const LANE_BUDGET: Duration = Duration::from_millis(100);

/// Identities counted at most; past it, those whose count has faded
/// under a millisecond are forgotten, and if that is not enough, all are
/// (everyone is light again for a moment, and the lane's own budget
/// still holds).
const MAX_COUNTED: usize = 4096;

type Job = Box<dyn FnOnce() + Send>;

/// A count of CPU time that halves every [`HALF_LIFE`].
#[derive(Clone, Copy, Debug)]
struct Decaying {
    micros: f64,
    at: Instant,
}

impl Decaying {
    fn new(at: Instant) -> Self {
        Decaying { micros: 0.0, at }
    }

    fn value(&self, now: Instant) -> f64 {
        let halves = now.saturating_duration_since(self.at).as_secs_f64() / HALF_LIFE.as_secs_f64();
        self.micros * (-halves).exp2()
    }

    fn add(&mut self, now: Instant, spent: Duration) {
        self.micros = self.value(now) + spent.as_secs_f64() * 1e6;
        self.at = now;
    }

    fn under(&self, now: Instant, budget: Duration) -> bool {
        self.value(now) < budget.as_secs_f64() * 1e6
    }
}

#[derive(Debug)]
struct State {
    /// The lane's thread is reading.
    busy: bool,
    lane: Decaying,
    by_identity: HashMap<Arc<str>, Decaying>,
    /// Reads begun and not done, by identity (none at zero): bounded by
    /// the calls in flight.
    in_flight: HashMap<Arc<str>, usize>,
}

/// See the module docs.
#[derive(Debug)]
pub struct LightLane {
    /// The lane's thread; `None` if it could not be started (then no
    /// read is light).
    jobs: Option<mpsc::Sender<Job>>,
    state: Mutex<State>,
    /// Reads begun light, and begun to wait for a turn (for `/metrics`).
    light: AtomicU64,
    turned: AtomicU64,
}

impl LightLane {
    /// Starts the lane's thread (at the priority of the thread starting
    /// it: the runtime's).
    pub fn start() -> Arc<LightLane> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let started = std::thread::Builder::new()
            .name("bagel-light-reader".into())
            .spawn(move || {
                while let Ok(job) = queue.recv() {
                    job();
                }
            });
        let jobs = match started {
            Ok(_) => Some(jobs),
            Err(e) => {
                tracing::error!(error = %e, "could not start the light List reader thread; every read waits for a turn");
                None
            }
        };
        let now = Instant::now();
        Arc::new(LightLane {
            jobs,
            state: Mutex::new(State {
                busy: false,
                lane: Decaying::new(now),
                by_identity: HashMap::new(),
                in_flight: HashMap::new(),
            }),
            light: AtomicU64::new(0),
            turned: AtomicU64::new(0),
        })
    }

    /// A read of `identity` begins: on the lane if it is light and the
    /// lane free and within its budget ([`Reading::is_light`]), else it
    /// is to wait for a turn. Counted in flight until the [`Reading`] is
    /// dropped.
    pub fn begin(self: &Arc<Self>, identity: &Arc<str>) -> Reading {
        let now = Instant::now();
        let mut state = self.lock();
        let in_flight = state.in_flight.entry(Arc::clone(identity)).or_insert(0);
        let alone = *in_flight == 0;
        *in_flight += 1;
        let light = alone
            && self.jobs.is_some()
            && !state.busy
            && state.lane.under(now, LANE_BUDGET)
            && state
                .by_identity
                .get(identity)
                .is_none_or(|c| c.under(now, LIGHT_BUDGET));
        state.busy |= light;
        match light {
            true => &self.light,
            false => &self.turned,
        }
        .fetch_add(1, Ordering::Relaxed);
        Reading {
            lane: Arc::clone(self),
            identity: Arc::clone(identity),
            on_lane: light,
        }
    }

    /// Reads begun light (run at once on the lane), and reads begun to
    /// wait for a turn, since the start.
    pub fn reads(&self) -> (u64, u64) {
        (
            self.light.load(Ordering::Relaxed),
            self.turned.load(Ordering::Relaxed),
        )
    }

    /// Counts `spent` of read CPU time against `identity` (reads on any
    /// thread count).
    fn charge(&self, identity: &Arc<str>, spent: Duration) {
        let now = Instant::now();
        let mut state = self.lock();
        if !state.by_identity.contains_key(identity) && state.by_identity.len() >= MAX_COUNTED {
            state.by_identity.retain(|_, c| c.value(now) >= 1_000.0);
            if state.by_identity.len() >= MAX_COUNTED {
                state.by_identity.clear();
            }
        }
        state
            .by_identity
            .entry(Arc::clone(identity))
            .or_insert_with(|| Decaying::new(now))
            .add(now, spent);
    }

    /// Whether `identity`'s reading is under [`LIGHT_BUDGET`] now.
    #[cfg(test)]
    fn is_light(&self, identity: &str) -> bool {
        let state = self.lock();
        state
            .by_identity
            .get(identity)
            .is_none_or(|c| c.under(Instant::now(), LIGHT_BUDGET))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One read of an identity, in flight until dropped; holding the lane if
/// it is light.
#[derive(Debug)]
pub struct Reading {
    lane: Arc<LightLane>,
    identity: Arc<str>,
    on_lane: bool,
}

impl Reading {
    /// Whether the read is light: to run on the lane, at once.
    pub fn is_light(&self) -> bool {
        self.on_lane
    }

    /// Runs a light read's `job` on the lane's thread. False when the
    /// thread is gone (the job is dropped).
    pub fn run_on_lane(self, job: impl FnOnce() + Send + 'static) -> bool {
        debug_assert!(self.on_lane, "only a light read runs on the lane");
        let Some(jobs) = self.lane.jobs.clone() else {
            return false;
        };
        jobs.send(Box::new(move || {
            self.run_here(job);
        }))
        .is_ok()
    }

    /// Runs `job` on this thread (a reader's, or the lane's), counts its
    /// CPU time against the identity (and the lane, if on it) and returns
    /// it.
    pub fn run_here(self, job: impl FnOnce()) -> Duration {
        let spent = thread_cpu_time(job);
        self.lane.charge(&self.identity, spent);
        if self.on_lane {
            self.lane.lock().lane.add(Instant::now(), spent);
        }
        spent
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        let mut state = self.lane.lock();
        if self.on_lane {
            state.busy = false;
        }
        if let Some(n) = state.in_flight.get_mut(&self.identity) {
            *n -= 1;
            if *n == 0 {
                state.in_flight.remove(&self.identity);
            }
        }
    }
}

/// The CPU time the calling thread has spent.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// Runs `job` and returns the CPU time the calling thread spent on it.
pub fn thread_cpu_time(job: impl FnOnce()) -> Duration {
    let before = thread_cpu();
    job();
    thread_cpu().saturating_sub(before)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spends `d` of this thread's CPU time.
    fn busy_for(d: Duration) {
        let start = thread_cpu();
        while thread_cpu().saturating_sub(start) < d {
            std::hint::black_box(0u64);
        }
    }

    /// An identity that read little is read on the lane, at the runtime's
    /// priority; once its reads pass the budget it is not, while another
    /// identity still is; and its count fades.
    #[test]
    fn light_readers_take_the_lane_and_heavy_ones_wait_their_turn() {
        let lane = LightLane::start();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("tenant-a"), Arc::from("tenant-b"));
        let read = lane.begin(&b);
        assert!(read.is_light(), "never read: light");
        assert!(!lane.begin(&a).is_light(), "one read at a time on the lane");
        let (tx, rx) = mpsc::channel();
        assert!(read.run_on_lane(move || {
            // Past the identity's budget, within the lane's.
            busy_for(LIGHT_BUDGET + Duration::from_millis(45));
            tx.send(rustix::process::getpriority_process(None).unwrap())
                .unwrap();
        }));
        let nice = rx.recv().unwrap();
        assert_eq!(nice, rustix::process::getpriority_process(None).unwrap());
        // The lane is freed once the job is done; wait for that.
        while lane.lock().busy {
            std::thread::yield_now();
        }
        assert!(!lane.is_light("tenant-b"), "past its budget: heavy");
        assert!(!lane.begin(&b).is_light());
        assert!(lane.begin(&a).is_light(), "the other identity is still light");
        // Reads elsewhere count too, and counts fade (six half lives).
        lane.begin(&a).run_here(|| busy_for(LIGHT_BUDGET * 2));
        assert!(!lane.is_light("tenant-a"));
        let mut state = lane.lock();
        for c in state.by_identity.values_mut() {
            c.micros /= 64.0;
        }
        drop(state);
        assert!(lane.is_light("tenant-a") && lane.is_light("tenant-b"));
    }

    /// A read of an identity that has another in flight (a flood of reads
    /// at once) is never light, however little each costs; once they are
    /// done, it is again, and nothing is left counted in flight.
    #[test]
    fn an_identity_with_a_read_in_flight_is_not_light() {
        let lane = LightLane::start();
        let b: Arc<str> = Arc::from("tenant-b");
        let first = lane.begin(&b);
        assert!(first.is_light());
        let waiting: Vec<Reading> = (0..10).map(|_| lane.begin(&b)).collect();
        assert!(waiting.iter().all(|r| !r.is_light()));
        drop(first);
        drop(waiting);
        assert!(lane.lock().in_flight.is_empty());
        assert!(lane.begin(&b).is_light());
    }

    /// The lane's own budget: past it, nobody is read on the lane.
    #[test]
    fn the_lane_reads_no_more_than_its_budget() {
        let lane = LightLane::start();
        lane.lock().lane.add(Instant::now(), LANE_BUDGET * 2);
        assert!(!lane.begin(&Arc::from("fresh")).is_light());
    }

    /// A flood of identities cannot grow the counts past their bound.
    #[test]
    fn the_counts_are_bounded() {
        let lane = LightLane::start();
        for i in 0..MAX_COUNTED * 3 {
            lane.charge(&Arc::from(format!("id-{i}")), Duration::from_millis(5));
        }
        assert!(lane.lock().by_identity.len() <= MAX_COUNTED);
    }
}
