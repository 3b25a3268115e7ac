//! What a signed time proves, and where writers get one.

use async_trait::async_trait;

use crate::{Micros, pb};

/// A time reading recovered from a verified [`pb::SignedTime`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeReading {
    /// The time the signer vouches for (for Roughtime, its midpoint).
    pub time: Micros,
    /// The signer's error bound on `time`.
    pub radius_us: u64,
    /// Who signed it, which sets [`TimeReading::resolution_us`].
    pub source: TimeProofKind,
}

impl TimeReading {
    /// The granularity of `time`: a whole second for RFC Roughtime, a
    /// microsecond for a local time agent. A timestamp compared with a
    /// signed time must be allowed this much on top of any tolerance.
    pub fn resolution_us(&self) -> u64 {
        match self.source {
            TimeProofKind::Local => 1,
            TimeProofKind::Roughtime => crate::duration_micros(super::roughtime::RESOLUTION),
        }
    }

    /// Whether `ts` lies within `tolerance` plus this reading's radius and
    /// resolution of the reading: the check every reader and the audit make
    /// of a message against its batch's signed time, and writers make
    /// before they write. `Err` with the distance in microseconds and the
    /// limit.
    pub fn congruent(&self, ts: Micros, tolerance: std::time::Duration) -> Result<(), (u64, u64)> {
        let limit = crate::duration_micros(tolerance)
            .saturating_add(self.radius_us)
            .saturating_add(self.resolution_us());
        let diff = ts.as_micros().abs_diff(self.time.as_micros());
        if diff > limit { Err((diff, limit)) } else { Ok(()) }
    }
}

/// A signed time and the reading it proves, checked by whoever obtained it.
#[derive(Clone, Debug, PartialEq)]
pub struct SignedReading {
    /// The proof as it travels, attached to witnesses and batches.
    pub signed: pb::SignedTime,
    /// What `signed` proves, already verified.
    pub reading: TimeReading,
}

/// Which kind of authority signed a time: it decides how the proof is
/// verified and how coarse the time is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeProofKind {
    /// Signed by a lease server acting as local time agent.
    Local,
    /// A Roughtime exchange.
    Roughtime,
}

/// Where a writer gets the signed time every batch carries: a recent
/// signed reading it has checked, or why it has none (no answer, or the
/// local clock is off).
#[async_trait]
pub trait SignedClock: Send + Sync + std::fmt::Debug {
    /// A signed reading recent enough to stamp a batch with now, or why
    /// there is none (a sentence; the writer refuses the batch with it).
    async fn signed_now(&self) -> Result<SignedReading, String>;

    /// How far the local clock may be from true time, as measured at the
    /// latest check (`|offset| + radius + RTT/2`); `None` when this source
    /// does not measure it. A writer whose bound is wider than its bags'
    /// clock tolerance refuses to write; one that does not know its bound
    /// assumes the tolerance.
    fn error_bound(&self) -> Option<std::time::Duration> {
        None
    }
}
