//! The lease-chain rule, once: who may take a name from its holder, what
//! the new holder inherits, the fencing token it gets, and when a
//! restarted server may grant again. Pure functions of the name's state
//! and the time; the lease server's table decides by them, and the model
//! checker (`tests/src/model/`) explores every interleaving of them.
//!
//! The rule (docs/concepts.md states the guarantees it gives):
//! * a live holder refuses every acquire, except that a full acquire
//!   breaks a tentative holder (which could not write);
//! * a holder whose deadline passed is broken by the next grant: it may
//!   have written anything below its deadline, so that deadline becomes
//!   the watermark the new holder writes above, the predecessor ended
//!   `Broken`, its bags unsettled;
//! * a tentative holder leaves no trace in the chain;
//! * fencing tokens strictly increase per name, and are at least the
//!   grant time in µs, so they keep increasing across a restart that
//!   waited out every earlier lease;
//! * a restarted server, which remembers nothing, grants nothing until
//!   every lease an earlier incarnation may have granted has ended.

use std::time::Duration;

use bagel_proto::Micros;

use crate::types::Mode;

/// A name's current holder, as the rule sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HolderView {
    /// Full (may write) or tentative.
    pub mode: Mode,
    /// Its absolute deadline.
    pub deadline: Micros,
    /// Ended before its deadline (a sweep saw it lapse): never live again.
    pub expired: bool,
}

impl HolderView {
    /// Whether it still holds the name at `now`: its deadline is ahead.
    pub fn is_live(&self, now: Micros) -> bool {
        !self.expired && now < self.deadline
    }
}

/// What an acquire of one name may do at `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Admission {
    /// Nobody holds it.
    Free,
    /// Its holder's deadline passed: the grant breaks it.
    BreaksExpired,
    /// A live tentative holder, broken by this full acquire.
    BreaksTentative,
    /// A live holder keeps it.
    Refused,
}

impl Admission {
    /// Whether the name may be granted.
    pub fn grants(self) -> bool {
        !matches!(self, Admission::Refused)
    }
}

/// Whether an acquire asking for `asked` may take a name held by
/// `holder` at `now`.
pub fn admit(holder: Option<HolderView>, asked: Mode, now: Micros) -> Admission {
    match holder {
        None => Admission::Free,
        Some(h) if !h.is_live(now) => Admission::BreaksExpired,
        Some(h) if h.mode == Mode::Tentative && asked == Mode::Full => Admission::BreaksTentative,
        Some(_) => Admission::Refused,
    }
}

/// What a new holder inherits when it replaces `holder` (which
/// [`admit`] let it break, or none) after a predecessor that left
/// `watermark`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handoff {
    /// Every timestamp earlier holders wrote is at or below it.
    pub watermark: Micros,
    /// The replaced holder was a full lease broken after its deadline
    /// (its writes may still land until its bags close).
    pub broken: bool,
}

/// The handoff from `holder` to a new holder, `watermark` being what
/// the chain carried before `holder`: a full holder passes on its
/// deadline (it may have written anything below it), a tentative one
/// nothing.
pub fn handoff(watermark: Micros, holder: Option<HolderView>) -> Handoff {
    match holder {
        Some(h) if h.mode == Mode::Full => Handoff {
            watermark: watermark.max(h.deadline),
            broken: true,
        },
        _ => Handoff {
            watermark,
            broken: false,
        },
    }
}

/// The next fencing token of a name whose last one was `last`, granted
/// at `now`: strictly above `last`, and at least `now` in µs (so a
/// restarted server, which grants only after every earlier lease ended,
/// starts above every token an earlier incarnation issued).
pub fn next_fencing(last: u64, now: Micros) -> u64 {
    (last + 1).max(now.as_micros())
}

/// When a server that started at `started` may grant: after every lease
/// an earlier incarnation may have granted has ended, by its clock too.
/// That is `max_ttl` past the start, or the granted-until `mark` kept
/// beside the key when it is later (a smaller `--max-ttl` this time, or a
/// clock stepped back), plus the clock `tolerance` (the earlier
/// incarnation's clock may have run that far ahead of ours).
pub fn restart_ready_at(started: Micros, mark: Micros, max_ttl: Duration, tolerance: Duration) -> Micros {
    mark.max(started.saturating_add(max_ttl))
        .saturating_add(tolerance)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(us: u64) -> Micros {
        Micros::from_micros(us)
    }

    fn holder(mode: Mode, deadline: u64) -> Option<HolderView> {
        Some(HolderView {
            mode,
            deadline: at(deadline),
            expired: false,
        })
    }

    #[test]
    fn a_live_holder_refuses_unless_a_full_acquire_breaks_a_tentative_one() {
        assert_eq!(admit(None, Mode::Full, at(5)), Admission::Free);
        assert_eq!(
            admit(holder(Mode::Full, 10), Mode::Full, at(5)),
            Admission::Refused
        );
        assert_eq!(
            admit(holder(Mode::Full, 10), Mode::Tentative, at(5)),
            Admission::Refused
        );
        assert_eq!(
            admit(holder(Mode::Tentative, 10), Mode::Tentative, at(5)),
            Admission::Refused
        );
        assert_eq!(
            admit(holder(Mode::Tentative, 10), Mode::Full, at(5)),
            Admission::BreaksTentative
        );
        // At the deadline the holder is gone.
        assert_eq!(
            admit(holder(Mode::Full, 10), Mode::Full, at(10)),
            Admission::BreaksExpired
        );
        let lapsed = Some(HolderView {
            mode: Mode::Full,
            deadline: at(10),
            expired: true,
        });
        assert_eq!(admit(lapsed, Mode::Tentative, at(5)), Admission::BreaksExpired);
    }

    #[test]
    fn a_broken_full_holder_passes_on_its_deadline_and_a_tentative_one_nothing() {
        assert_eq!(
            handoff(at(3), holder(Mode::Full, 10)),
            Handoff {
                watermark: at(10),
                broken: true
            }
        );
        assert_eq!(
            handoff(at(30), holder(Mode::Full, 10)).watermark,
            at(30),
            "the watermark never goes down"
        );
        assert_eq!(
            handoff(at(3), holder(Mode::Tentative, 10)),
            Handoff {
                watermark: at(3),
                broken: false
            }
        );
        assert!(!handoff(at(3), None).broken);
    }

    #[test]
    fn fencing_tokens_rise_and_start_above_the_grant_time() {
        assert_eq!(next_fencing(7, at(3)), 8);
        assert_eq!(next_fencing(7, at(100)), 100);
    }

    #[test]
    fn a_restart_waits_for_the_later_of_the_mark_and_the_max_ttl() {
        let s = Duration::from_secs(1);
        assert_eq!(restart_ready_at(at(0), at(0), 10 * s, s), at(11_000_000));
        assert_eq!(restart_ready_at(at(0), at(20_000_000), 10 * s, s), at(21_000_000));
    }
}
