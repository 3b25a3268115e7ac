//! The writer's commit verdict as a pure step: given what the writer has
//! looked up so far about the bag and minute its record went into, the
//! next thing to look up, or the verdict. [`crate::Writer`] is the driver:
//! it does each lookup on the store and feeds the answer back, so the
//! rules below can be tested (and explored) without a store.
//!
//! The rules (why each holds: [`crate::writer`], [`crate::seal`],
//! [`crate::tombstone`]):
//! * before its minute's safe point, in a bag every seal lists (its own
//!   earlier record was acknowledged with no seal started), the bag's
//!   lock alone decides;
//! * otherwise the writer looks whether a seal of the minute has started;
//!   where the minute may be removed (a seal started, or its safe point
//!   past), it looks for the minute's tombstone first, and a tombstone
//!   decides alone, with no close: the record is in only if the summary
//!   the tombstone names holds that very record;
//! * then the seal (once started) or the lock gives the bag's verdict;
//! * before the safe point with no seal started, that verdict stands (no
//!   minute is removed before it is sealed); else the tombstone is looked
//!   for again, *after* the verdict: absent, the lock read was the bag's
//!   own; present, the tombstone's summary decides.

use crate::summary::Stretch;

/// What the look at the bag (the seal's verdict, or the lock's) found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BagLook {
    /// The bag's lock lists the record (or no close has started, so every
    /// closer will).
    Covered,
    /// The seal closed the second empty, or the lock leaves the record out.
    NotCovered,
    /// The look failed (the driver keeps the error).
    Failed,
}

/// What the writer knows so far. `None`: not looked up yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// Its clock, read once the append completed and again once the
    /// bag's verdict was in, is before the minute's safe point (its close
    /// time less the writer's clock margin). Read again because a look
    /// held for long can answer from a minute retention removed since: a
    /// removed bag has no `_prelock`, and "no close started" would then
    /// be the removal's answer, not the bag's.
    pub early: bool,
    /// An earlier record of this writer in this bag was acknowledged with
    /// no seal of the minute started: every seal lists the bag.
    pub in_every_seal: bool,
    /// Whether a seal of the minute has started (its intent or seal).
    pub sealing_started: Option<bool>,
    /// The minute's tombstone as found before the bag's verdict: the
    /// summary it names, or none.
    pub removed_before: Option<Option<Stretch>>,
    /// The bag's verdict.
    pub bag: Option<BagLook>,
    /// The minute's tombstone as found after the bag's verdict.
    pub removed_after: Option<Option<Stretch>>,
    /// That look failed (the driver keeps the error).
    pub removed_after_failed: bool,
    /// Whether the tombstone's summary holds the very record.
    pub summary_holds: Option<bool>,
}

/// The next step of a commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Look whether a seal of the minute has started.
    SealingStarted,
    /// Look for the minute's tombstone, before the bag's verdict.
    TombstoneBefore,
    /// Take the bag's verdict from the minute's seal, then its lock.
    SealVerdict,
    /// Take the bag's verdict from its lock (closing it when due).
    LockVerdict,
    /// Look for the minute's tombstone, after the bag's verdict.
    TombstoneAfter,
    /// Read this summary (the tombstone's): does it hold the record?
    SummaryHolds(Stretch),
    /// Decided.
    Done(Verdict),
}

/// How a commit ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Acknowledged; `in_every_seal`: every seal of the minute lists the
    /// bag, so the writer's later records there need only its lock.
    In {
        /// See above.
        in_every_seal: bool,
    },
    /// `LateRejected`: in no bag or summary a reader reads, now or later.
    Late,
    /// Unknown: the bag's look failed (its error is the outcome).
    BagFailed,
    /// Unknown: the bag's lock lists the record, but the look for the
    /// tombstone after it failed (its error is the outcome).
    TombstoneFailed,
}

/// The next step, from the facts so far.
pub fn step(f: &Facts) -> Next {
    let from_bag = |bag: BagLook, in_every_seal: bool| match bag {
        BagLook::Covered => Next::Done(Verdict::In { in_every_seal }),
        BagLook::NotCovered => Next::Done(Verdict::Late),
        BagLook::Failed => Next::Done(Verdict::BagFailed),
    };
    let removed = |summary: Stretch| match f.summary_holds {
        None => Next::SummaryHolds(summary),
        Some(true) => Next::Done(Verdict::In { in_every_seal: false }),
        Some(false) => Next::Done(Verdict::Late),
    };
    if f.early && f.in_every_seal {
        return match f.bag {
            None => Next::LockVerdict,
            Some(bag) => from_bag(bag, true),
        };
    }
    let Some(started) = f.sealing_started else {
        return Next::SealingStarted;
    };
    if started || !f.early {
        match f.removed_before {
            None => return Next::TombstoneBefore,
            Some(Some(summary)) => return removed(summary),
            Some(None) => {}
        }
    }
    let Some(bag) = f.bag else {
        return match started {
            true => Next::SealVerdict,
            false => Next::LockVerdict,
        };
    };
    let unsealed_covered = !started && bag == BagLook::Covered;
    if !started && f.early {
        return from_bag(bag, unsealed_covered);
    }
    if f.removed_after_failed {
        // Never acknowledged without looking; refused stays refused.
        return match bag {
            BagLook::Covered => Next::Done(Verdict::TombstoneFailed),
            BagLook::NotCovered => Next::Done(Verdict::Late),
            BagLook::Failed => Next::Done(Verdict::BagFailed),
        };
    }
    match f.removed_after {
        None => Next::TombstoneAfter,
        Some(Some(summary)) => removed(summary),
        Some(None) => from_bag(bag, unsealed_covered),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Bucket;
    use crate::seal::Span;

    fn summary() -> Stretch {
        Stretch::new(Span::of(Bucket::from_secs(1_900_000_020)), 1)
    }

    /// Runs the step from `start`, answering each look from `answers`,
    /// and returns the looks asked for and the verdict.
    fn walk(start: Facts, answers: Answers) -> (Vec<Next>, Verdict) {
        let mut f = start;
        let mut asked = Vec::new();
        loop {
            let next = step(&f);
            match next {
                Next::Done(v) => return (asked, v),
                Next::SealingStarted => f.sealing_started = Some(answers.started),
                Next::TombstoneBefore => f.removed_before = Some(answers.removed_before),
                Next::SealVerdict | Next::LockVerdict => f.bag = Some(answers.bag),
                Next::TombstoneAfter => match answers.removed_after {
                    Ok(t) => f.removed_after = Some(t),
                    Err(()) => f.removed_after_failed = true,
                },
                Next::SummaryHolds(_) => f.summary_holds = Some(answers.holds),
            }
            asked.push(next);
            assert!(asked.len() < 10, "a commit takes a few looks: {asked:?}");
        }
    }

    #[derive(Clone, Copy)]
    struct Answers {
        started: bool,
        removed_before: Option<Stretch>,
        bag: BagLook,
        removed_after: Result<Option<Stretch>, ()>,
        holds: bool,
    }

    const PLAIN: Answers = Answers {
        started: false,
        removed_before: None,
        bag: BagLook::Covered,
        removed_after: Ok(None),
        holds: false,
    };

    #[test]
    fn an_early_record_in_a_bag_every_seal_lists_takes_the_locks_verdict_alone() {
        let f = Facts {
            early: true,
            in_every_seal: true,
            ..Facts::default()
        };
        assert_eq!(
            walk(f, PLAIN),
            (vec![Next::LockVerdict], Verdict::In { in_every_seal: true })
        );
    }

    #[test]
    fn an_early_record_with_no_seal_started_is_in_every_seal_once_covered() {
        let f = Facts {
            early: true,
            ..Facts::default()
        };
        let (asked, v) = walk(f, PLAIN);
        assert_eq!(asked, [Next::SealingStarted, Next::LockVerdict]);
        assert_eq!(v, Verdict::In { in_every_seal: true });
        let refused = Answers {
            bag: BagLook::NotCovered,
            ..PLAIN
        };
        assert_eq!(walk(f, refused).1, Verdict::Late);
    }

    /// Hole 1 and the close of hole 2 (issue 51): a record of a minute
    /// already removed is decided by the tombstone's summary, and no seal
    /// or lock verdict (each of which may close the bag) is taken.
    #[test]
    fn a_removed_minute_is_decided_by_its_summary_with_no_close() {
        let f = Facts::default();
        for started in [true, false] {
            let removed = Answers {
                started,
                removed_before: Some(summary()),
                ..PLAIN
            };
            let (asked, v) = walk(f, removed);
            assert_eq!(
                asked,
                [
                    Next::SealingStarted,
                    Next::TombstoneBefore,
                    Next::SummaryHolds(summary())
                ]
            );
            assert_eq!(v, Verdict::Late);
            let held = Answers {
                holds: true,
                ..removed
            };
            assert_eq!(walk(f, held).1, Verdict::In { in_every_seal: false });
        }
    }

    #[test]
    fn a_minute_removed_after_the_bags_verdict_is_decided_by_its_summary() {
        let f = Facts::default();
        let removed = Answers {
            started: true,
            removed_after: Ok(Some(summary())),
            ..PLAIN
        };
        let (asked, v) = walk(f, removed);
        assert_eq!(
            asked,
            [
                Next::SealingStarted,
                Next::TombstoneBefore,
                Next::SealVerdict,
                Next::TombstoneAfter,
                Next::SummaryHolds(summary())
            ]
        );
        assert_eq!(v, Verdict::Late, "covered by a lock, but in no summary");
    }

    #[test]
    fn never_acknowledged_without_looking_for_the_tombstone_after() {
        let f = Facts::default();
        let failed = Answers {
            started: true,
            removed_after: Err(()),
            ..PLAIN
        };
        assert_eq!(walk(f, failed).1, Verdict::TombstoneFailed);
        let refused = Answers {
            bag: BagLook::NotCovered,
            ..failed
        };
        assert_eq!(walk(f, refused).1, Verdict::Late);
        // Sealed, present, covered: in, and the seal lists the bag already.
        let sealed = Answers {
            started: true,
            ..PLAIN
        };
        assert_eq!(walk(f, sealed).1, Verdict::In { in_every_seal: false });
    }
}
