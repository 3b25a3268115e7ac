//! When each lease server could not serve its names: the driver records
//! its kills (through the restart wait) and its pauses, so that the user
//! journeys can tell a gap a fault explains from one nothing explains.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One lease server fault, on the driver's monotonic clock.
#[derive(Debug, Clone)]
pub struct Outage {
    /// The member's identity (`member-<i>`, its `--server-id`).
    pub member: String,
    /// `kill` (kill -9 and restart, then its restart wait) or `pause`
    /// (SIGSTOP, then SIGCONT).
    pub kind: &'static str,
    pub from: Instant,
    /// When it could serve again: for a kill, once restarted and its max
    /// TTL waited out (it grants nothing before).
    pub until: Instant,
}

/// The run's outages, shared by the driver (which records them) and the
/// journeys (which read them at the end).
#[derive(Debug, Clone, Default)]
pub struct Outages(Arc<Mutex<Vec<Outage>>>);

impl Outages {
    pub fn record(&self, member: String, kind: &'static str, from: Instant, until: Instant) {
        self.0.lock().expect("outages").push(Outage {
            member,
            kind,
            from,
            until,
        });
    }

    /// The first outage of `member` that overlaps `[from, until]`.
    pub fn of_member_during(&self, member: &str, from: Instant, until: Instant) -> Option<Outage> {
        self.0
            .lock()
            .expect("outages")
            .iter()
            .find(|o| o.member == member && o.from <= until && o.until >= from)
            .cloned()
    }

    /// Whether any kill of `member` (its table forgotten) overlaps
    /// `[from, until]`.
    pub fn killed_during(&self, member: &str, from: Instant, until: Instant) -> bool {
        self.0
            .lock()
            .expect("outages")
            .iter()
            .any(|o| o.member == member && o.kind == "kill" && o.from <= until && o.until >= from)
    }
}

/// `at - d`, or `at` itself when the monotonic clock started less than `d`
/// ago.
pub fn before(at: Instant, d: Duration) -> Instant {
    at.checked_sub(d).unwrap_or(at)
}
