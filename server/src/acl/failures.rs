//! Failed bearer tokens, counted by the address they came from: past
//! [`BUDGET`] failures in one [`WINDOW`], that address's token checks
//! are refused until the window ends, valid tokens included.
//!
//! Why refuse the valid ones too: a guesser whose right guess still
//! passed would learn it was right at full speed, and the budget would
//! slow nothing. A 256-bit token is not guessable, but a policy may hold
//! weak ones, and an operator must see guessing (`bagel_acl_unauthenticated`,
//! a WARN line per address per window) rather than have it answered for
//! free, `ServerInfo` included.
//!
//! Bounded: at most [`ADDRESSES`] addresses are tracked; past that, new
//! addresses share one ledger (so spraying addresses cannot grow memory,
//! and costs the sprayer's other addresses, not everyone's known ones).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// How long failures count against an address.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Failed tokens one address may send in a [`WINDOW`] before its token
/// checks are refused for the rest of it.
pub const BUDGET: u32 = 20;

/// Addresses tracked at once; new ones past it share one ledger.
pub const ADDRESSES: usize = 4096;

/// One address's failures in its current window.
#[derive(Clone, Copy, Debug)]
struct Window {
    started: Instant,
    failures: u32,
}

/// Why an address's token check is refused: how many it failed, and
/// when it may try again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocked {
    pub failures: u32,
    pub retry_after: Duration,
}

/// What recording a failure did: whether this one took the address past
/// its budget (the moment to log it, once per window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    Counted,
    NowBlocked,
}

/// The failures of every tracked address (the key `None`: addresses past
/// [`ADDRESSES`], and callers with no address).
#[derive(Debug, Default)]
pub struct Failures {
    by_address: HashMap<Option<IpAddr>, Window>,
}

impl Failures {
    /// The ledger `peer`'s failures go to: its own while there is room
    /// (one place is kept for the shared one).
    fn key(&self, peer: Option<IpAddr>) -> Option<IpAddr> {
        if self.by_address.contains_key(&peer) || self.by_address.len() < ADDRESSES - 1 {
            peer
        } else {
            None
        }
    }

    /// `Err` while `peer` is past its budget in its current window.
    pub fn check(&self, peer: Option<IpAddr>, now: Instant) -> Result<(), Blocked> {
        match self.by_address.get(&self.key(peer)) {
            Some(w) if w.failures >= BUDGET => {
                let ends = w.started + WINDOW;
                if now < ends {
                    Err(Blocked {
                        failures: w.failures,
                        retry_after: ends - now,
                    })
                } else {
                    Ok(())
                }
            }
            _ => Ok(()),
        }
    }

    /// Counts one failed token from `peer`.
    pub fn record(&mut self, peer: Option<IpAddr>, now: Instant) -> Recorded {
        if self.by_address.len() >= ADDRESSES - 1 && !self.by_address.contains_key(&peer) {
            self.by_address.retain(|_, w| now < w.started + WINDOW);
        }
        let key = self.key(peer);
        let w = self.by_address.entry(key).or_insert(Window {
            started: now,
            failures: 0,
        });
        if now >= w.started + WINDOW {
            *w = Window {
                started: now,
                failures: 0,
            };
        }
        w.failures = w.failures.saturating_add(1);
        if w.failures == BUDGET {
            Recorded::NowBlocked
        } else {
            Recorded::Counted
        }
    }

    /// Addresses tracked now (for tests of the bound).
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.by_address.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u32) -> Option<IpAddr> {
        Some(IpAddr::from(n.to_be_bytes()))
    }

    #[test]
    fn an_address_past_its_budget_is_blocked_until_its_window_ends() {
        let t0 = Instant::now();
        let mut f = Failures::default();
        for i in 1..BUDGET {
            assert_eq!(f.record(ip(1), t0), Recorded::Counted, "failure {i}");
            assert_eq!(f.check(ip(1), t0), Ok(()));
        }
        assert_eq!(f.record(ip(1), t0), Recorded::NowBlocked);
        let later = t0 + Duration::from_secs(4);
        assert_eq!(
            f.check(ip(1), later),
            Err(Blocked {
                failures: BUDGET,
                retry_after: WINDOW - Duration::from_secs(4)
            })
        );
        // Another address is not blocked; the window's end lifts the block.
        assert_eq!(f.check(ip(2), later), Ok(()));
        assert_eq!(f.check(ip(1), t0 + WINDOW), Ok(()));
        // A new window starts counting from one.
        assert_eq!(f.record(ip(1), t0 + WINDOW), Recorded::Counted);
        assert_eq!(f.check(ip(1), t0 + WINDOW), Ok(()));
    }

    #[test]
    fn spraying_addresses_stays_bounded_and_shares_one_ledger() {
        let t0 = Instant::now();
        let mut f = Failures::default();
        for n in 0..(ADDRESSES as u32 + 1000) {
            f.record(ip(n), t0);
        }
        assert!(f.tracked() <= ADDRESSES, "{}", f.tracked());
        // The addresses past the bound share one ledger: their failures
        // add up, and block them all, not the ones tracked before.
        assert!(f.check(ip(ADDRESSES as u32 + 999), t0).is_err());
        assert_eq!(f.check(ip(0), t0), Ok(()));
        // Once the tracked windows end, new addresses get their own.
        let later = t0 + WINDOW;
        f.record(ip(999_999), later);
        assert!(f.tracked() <= ADDRESSES);
        assert_eq!(f.check(ip(999_999), later), Ok(()));
    }
}
