//! Time for leases with no server: whose clock counts, and what vouches
//! for it.
//!
//! A bagel server judges every deadline on its one clock. Without a server,
//! each holder and each would-be taker judges by its own, so every one of
//! them must know its clock is right before it grants, renews or takes
//! over. [`LeaseTime::Signed`] checks it the way bag writers do (a
//! [`TimeSource`], normally Roughtime): an acquire or renewal is refused
//! when the clock is off, and the witness carries the signed time.
//! [`LeaseTime::UnsafeLocalClock`] trusts the local clock unchecked and
//! says so in every witness (`self_timed`); for development only.

use std::sync::Arc;
use std::time::Duration;

use bagel_lease_core::{Error, TimeSource};
use bagel_proto::clock::Clock;
use bagel_proto::signed_time::TimeReading;
use bagel_proto::{Micros, SignedClock, SignedReading, Signer, pb, sign_local_time, verify_local_time};

/// Where the S3 backend's time comes from.
#[derive(Clone, Debug)]
pub enum LeaseTime {
    /// The local clock, checked against signed time before every grant,
    /// renewal and release (refused with [`Error::ClockOff`] when off).
    Signed(TimeSource),
    /// UNSAFE: the local clock, unchecked. Witnesses carry the client's own
    /// signature over its clock reading and say `self_timed`. Two holders
    /// at once become possible as soon as clocks disagree by more than the
    /// clock margin.
    UnsafeLocalClock(Arc<dyn Clock>),
}

/// A checked instant, the signed time that vouches for it, and how far
/// the clock may be from true time.
#[derive(Clone, Debug)]
pub struct Stamp {
    /// The local clock, read after the check: the `now` every rule of the
    /// grant, renewal or release is judged at.
    pub now: Micros,
    /// The signed time the witness carries (the authority's, or the
    /// client's own signature over `now` for an unchecked clock).
    pub signed: pb::SignedTime,
    /// Whether `signed` is the client's own (an unchecked clock): the
    /// witness says so, and an audit can tell.
    pub self_timed: bool,
    /// The clock's error bound: `|offset| + radius + RTT/2` from the
    /// authority's latest answer, or the radius an unchecked clock claims.
    pub bound: Duration,
}

impl LeaseTime {
    /// The local clock, unchecked: what the lease handle schedules
    /// renewals and judges validity by. A grant, renewal or release is
    /// judged at a [`LeaseTime::stamp`], which checks the clock first.
    pub fn clock(&self) -> Arc<dyn Clock> {
        match self {
            LeaseTime::Signed(ts) => ts.clock(),
            LeaseTime::UnsafeLocalClock(c) => Arc::clone(c),
        }
    }

    /// Whether the clock is unchecked ([`LeaseTime::UnsafeLocalClock`]):
    /// tools warn, and the backend's info says so.
    pub fn is_unsafe(&self) -> bool {
        matches!(self, LeaseTime::UnsafeLocalClock(_))
    }

    /// Checks the clock and reads it. `signer` and `who` sign a local
    /// reading when there is no authority; `radius` is the error claimed.
    pub async fn stamp(&self, signer: &Signer, who: &str, radius: Duration) -> Result<Stamp, Error> {
        match self {
            LeaseTime::Signed(ts) => {
                let signed = ts.check().await?;
                let verdict = ts.verdict();
                let bound = verdict.error_bound().ok_or_else(|| Error::NoSignedTime {
                    detail: verdict.to_string(),
                })?;
                Ok(Stamp {
                    now: ts.now(),
                    signed: signed.signed,
                    self_timed: false,
                    bound,
                })
            }
            LeaseTime::UnsafeLocalClock(clock) => {
                let now = clock.now();
                Ok(Stamp {
                    now,
                    signed: sign_local_time(signer, who, now, bagel_proto::duration_micros(radius)),
                    self_timed: true,
                    bound: radius,
                })
            }
        }
    }

    /// The clock's latest known error bound without asking the authority
    /// (for `describe`, which acts on nothing); `radius` for an unchecked
    /// clock, `None` before any answer.
    pub fn bound_hint(&self, radius: Duration) -> Option<Duration> {
        match self {
            LeaseTime::Signed(ts) => ts.verdict().error_bound(),
            LeaseTime::UnsafeLocalClock(_) => Some(radius),
        }
    }
}

/// UNSAFE signed time for bag writers under S3 leases without a time
/// authority: the local clock, signed with the client's lease key (so the
/// reader and the audit, trusting that key, accept it and can see it is
/// self-signed). It vouches for nothing beyond "this client said so".
#[derive(Clone, Debug)]
pub struct SelfSignedClock {
    /// The client's lease key (the one published under the prefix, which
    /// readers trust).
    pub signer: Signer,
    /// The local clock whose readings are signed.
    pub clock: Arc<dyn Clock>,
    /// Names the signer in the signed reading (the lease store's URL).
    pub who: String,
    /// The error the readings claim; writers compare it with their bags'
    /// clock tolerance.
    pub radius: Duration,
}

#[async_trait::async_trait]
impl SignedClock for SelfSignedClock {
    async fn signed_now(&self) -> Result<SignedReading, String> {
        let now = self.clock.now();
        let signed = sign_local_time(
            &self.signer,
            &self.who,
            now,
            bagel_proto::duration_micros(self.radius),
        );
        let ring = [self.signer.verifying_key()].into_iter().collect();
        let reading: TimeReading = verify_local_time(&signed, &ring).map_err(|e| e.to_string())?;
        Ok(SignedReading { signed, reading })
    }
}
