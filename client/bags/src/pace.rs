//! Time, sleeping and entropy, behind one seam: every timing loop of this
//! crate (the writer's waits for its clock, the metronome's loop and its
//! vouched-instant estimate) measures elapsed time with [`Instant`] and
//! waits with [`sleep`], and every name drawn at random (a writer's data
//! file stem, a directory store's private temporary files) comes from
//! [`random_u32`] / [`random_u64`].
//!
//! By default these are tokio's clock (which is the monotonic clock) and
//! the operating system's entropy. Why a seam: a deterministic simulation
//! (`bagel_bags::sim`-style tests, see `docs/development.md`) runs the real
//! code on a current-thread runtime whose clock is paused
//! (`start_paused(true)`), where tokio's [`Instant`] and [`sleep`] follow
//! the simulated clock and auto-advance when every task waits; and it
//! seeds this thread's entropy ([`seeded`]) so that one seed replays one
//! run, file names included. `std::time::Instant` follows neither.

use std::cell::RefCell;
use std::time::Duration;

use rand::{Rng as _, RngCore as _, SeedableRng as _};

/// The monotonic instant every loop of this crate measures with: tokio's,
/// which a paused runtime's simulated clock drives.
pub use tokio::time::Instant;

/// Sleeps `d` on tokio's clock (simulated time on a paused runtime).
pub async fn sleep(d: Duration) {
    tokio::time::sleep(d).await;
}

/// Measures elapsed time for a decision that must not under-count it: the
/// longer of tokio's clock (the simulated one on a paused runtime) and,
/// on Linux, `CLOCK_BOOTTIME`, which keeps counting while the host is
/// suspended. Why both: `CLOCK_MONOTONIC`, behind tokio's clock, stops
/// during a suspend, so a process suspended between two steps would
/// believe no time passed while others acted for hours; and a simulation
/// runs far faster than the time it simulates, so its clock is tokio's.
/// Over-counting is always safe where this is used (a fact is trusted for
/// less long), under-counting never is.
#[derive(Clone, Copy, Debug)]
pub struct Stopwatch {
    started: Instant,
    #[cfg(target_os = "linux")]
    boot: Duration,
}

impl Stopwatch {
    /// Starts now.
    pub fn start() -> Self {
        Stopwatch {
            started: Instant::now(),
            #[cfg(target_os = "linux")]
            boot: boottime(),
        }
    }

    /// Time elapsed since [`Stopwatch::start`], by the clock that counted
    /// more.
    pub fn elapsed(&self) -> Duration {
        let tokio = self.started.elapsed();
        #[cfg(target_os = "linux")]
        let tokio = tokio.max(boottime().saturating_sub(self.boot));
        tokio
    }
}

#[cfg(target_os = "linux")]
fn boottime() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

thread_local! {
    /// This thread's seeded entropy, when a simulation set one.
    static SEEDED: RefCell<Option<rand::rngs::StdRng>> = const { RefCell::new(None) };
}

/// 32 random bits: from this thread's seeded generator inside
/// [`seeded`], else from the operating system's entropy.
pub fn random_u32() -> u32 {
    SEEDED.with(|s| match s.borrow_mut().as_mut() {
        Some(rng) => rng.r#gen(),
        None => rand::random(),
    })
}

/// 64 random bits; see [`random_u32`].
pub fn random_u64() -> u64 {
    SEEDED.with(|s| match s.borrow_mut().as_mut() {
        Some(rng) => rng.next_u64(),
        None => rand::random(),
    })
}

/// Until the guard is dropped, this thread's draws of [`random_u32`] and
/// [`random_u64`] come from a generator seeded with `seed`: a simulation
/// on a current-thread runtime draws the same names on every run of one
/// seed. Guards nest; dropping one restores what was there before.
#[must_use = "the seeded entropy lasts as long as the guard"]
pub fn seeded(seed: u64) -> SeededGuard {
    let previous = SEEDED.with(|s| s.replace(Some(rand::rngs::StdRng::seed_from_u64(seed))));
    SeededGuard { previous }
}

/// See [`seeded`].
#[derive(Debug)]
pub struct SeededGuard {
    previous: Option<rand::rngs::StdRng>,
}

impl Drop for SeededGuard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        SEEDED.with(|s| *s.borrow_mut() = previous);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_draws_the_same_names_and_the_guard_restores_os_entropy() {
        let draw = || (random_u32(), random_u64());
        let a = {
            let _g = seeded(7);
            draw()
        };
        let b = {
            let _g = seeded(7);
            draw()
        };
        assert_eq!(a, b);
        // Outside the guard: the OS's entropy, which two draws of 96 bits
        // do not repeat.
        assert_ne!(draw(), draw());
    }

    #[cfg(feature = "testing")]
    #[tokio::test(start_paused = true)]
    async fn a_stopwatch_counts_simulated_time_and_never_less_than_the_host_did() {
        let w = Stopwatch::start();
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(w.elapsed() >= Duration::from_secs(3), "{:?}", w.elapsed());
        // Real time passes too, which the paused clock does not see: the
        // stopwatch counts it on Linux (`CLOCK_BOOTTIME`). Spun, not slept.
        #[cfg(target_os = "linux")]
        {
            let w = Stopwatch::start();
            let real = std::time::Instant::now();
            while real.elapsed() < Duration::from_millis(5) {
                std::hint::spin_loop();
            }
            let seen = real.elapsed();
            assert!(w.elapsed() >= seen, "{:?} < {seen:?}", w.elapsed());
        }
    }
}
