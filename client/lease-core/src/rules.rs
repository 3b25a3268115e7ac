//! Lease rules every backend that judges releases itself applies alike
//! (a server judges them on its side; the S3 store and the test's
//! in-memory backend here), so that a caller moving between backends sees
//! the same refusals in the same words.

use std::time::Duration;

use bagel_proto::{Micros, TimeProofKind};

use crate::error::{Error, Result};
use crate::types::ReleaseOptions;

/// Refuses a release's watermark ahead of the time it is judged against
/// by more than `tolerance`: the release's signed time plus its allowance
/// (a Roughtime reading's resolution, a local reading's radius) when it
/// gave one, else `now` on the backend's clock (`clock`, as the message
/// names it). A holder cannot have written later than the present, and a
/// watermark from the future would fence the next holder out of time that
/// has not come.
pub fn check_watermark(
    options: &ReleaseOptions,
    now: Micros,
    clock: &str,
    tolerance: Duration,
) -> Result<()> {
    let Some(watermark) = options.watermark.filter(|w| *w != Micros::ZERO) else {
        return Ok(());
    };
    let (reference, allowance, what) = match &options.signed_time {
        Some(st) => match st.reading.source {
            TimeProofKind::Roughtime => (
                st.reading.time,
                st.reading.resolution_us(),
                "signed_time (Roughtime)",
            ),
            TimeProofKind::Local => (st.reading.time, st.reading.radius_us, "signed_time"),
        },
        None => (now, 0, clock),
    };
    let tolerance = bagel_proto::duration_micros(tolerance);
    let limit = reference
        .as_micros()
        .saturating_add(tolerance)
        .saturating_add(allowance);
    if watermark.as_micros() > limit {
        return Err(Error::out_of_range(
            "watermark_us",
            format!(
                "{} is ahead of {what} ({}) by more than the tolerance of {tolerance} us (+{allowance} us \
                 allowance)",
                watermark.as_micros(),
                reference.as_micros()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watermark_beyond_now_plus_the_tolerance_is_refused_naming_the_field() {
        let now = Micros::from_micros(10_000_000);
        let at = |w: u64| ReleaseOptions {
            watermark: Some(Micros::from_micros(w)),
            ..ReleaseOptions::default()
        };
        let tolerance = Duration::from_secs(1);
        assert!(check_watermark(&at(11_000_000), now, "the clock", tolerance).is_ok());
        let e = check_watermark(&at(11_000_001), now, "the clock", tolerance).unwrap_err();
        assert_eq!(e.field(), Some("watermark_us"));
        assert!(e.to_string().contains("ahead of the clock"), "{e}");
        assert!(check_watermark(&ReleaseOptions::default(), now, "the clock", tolerance).is_ok());
    }
}
