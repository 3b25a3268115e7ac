//! The time a closer acts on: a clock that signed time vouches for, less
//! its error bound. Every process that acts on time (closes a bag, writes
//! a timestamp) checks its own clock against a time authority first: a
//! closer whose clock ran ahead would close bags under writers that are
//! on time.
//!
//! A writer skips the close check for a write that finishes before its
//! bag's safe point on the writer's clock: `close_time - clock_tolerance`,
//! or `close_time - bound` when its time source measured an error bound
//! wider than the tolerance (see `Writer`). Either way that write finished
//! before the close time in true time. Every closer closes a bag only once
//! its own clock, less its own bound, has passed the close time, i.e. once
//! true time surely has: so no close starts before such a write finished,
//! and every close lists it. Each side accounts for its own measured
//! bound, so no pair of them can exceed the margin between them.
//!
//! A closer whose clock cannot be vouched for (no answer from the time
//! authority, an old answer, a clock off by more than the tolerance beyond
//! the authority's radius, a clock stepped since the answer) refuses
//! ([`Error::ClockUnvouched`]) and closes nothing. A wide bound (a
//! Roughtime radius of 5 s) is no reason to refuse: it only makes the
//! closer close later.

use bagel_proto::Micros;
use bagel_proto::clock::CheckedClock;

use crate::{Error, Result};

/// The latest instant true time has surely reached, per `clock` (its
/// reading less its bound); refused ([`Error::ClockUnvouched`]) when the
/// clock cannot be vouched for.
pub async fn closer_now(clock: &dyn CheckedClock) -> Result<Micros> {
    let reading = clock
        .checked_now()
        .await
        .map_err(|reason| Error::ClockUnvouched { reason })?;
    Ok(reading.surely_reached())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bagel_proto::clock::{AssumedExact, BoundedNow, ManualClock, Unvouched};
    use std::time::Duration;

    #[derive(Debug)]
    struct Fixed(BoundedNow);

    #[async_trait::async_trait]
    impl CheckedClock for Fixed {
        async fn checked_now(&self) -> std::result::Result<BoundedNow, String> {
            Ok(self.0)
        }
    }

    const T: Micros = Micros::from_micros(1_900_000_000_000_000);

    #[tokio::test]
    async fn a_closer_acts_on_its_clock_less_its_bound_and_refuses_without_one() {
        let exact = AssumedExact(ManualClock::new(T));
        assert_eq!(closer_now(&exact).await.unwrap(), T);
        let wide = Fixed(BoundedNow {
            now: T,
            bound: Duration::from_millis(5_700),
        });
        assert_eq!(
            closer_now(&wide).await.unwrap(),
            T.saturating_sub(Duration::from_millis(5_700))
        );
        let none = Unvouched("no answer from roughtime 127.0.0.1:9".into());
        let e = closer_now(&none).await.unwrap_err();
        assert!(matches!(e, Error::ClockUnvouched { .. }), "{e}");
        assert!(e.to_string().contains("no answer from roughtime"), "{e}");
    }
}
