//! Waits of any length for busy names, up to "until I get it", over
//! backends that each wait only a bounded time per call (a server's
//! `--max-wait`, an S3 lease store's `max_wait`).
//!
//! The wait is cut into rounds, each at most the backend's max wait
//! ([`crate::LeaseBackend::max_wait`], or the max an
//! [`Error::WaitTooLong`] refusal carries): a round that ends busy is re-issued at once, so a waiter is back
//! in the server's queue straight away (FIFO fairness as far as one
//! server's queue goes: a waiter re-queues behind those already queued). A
//! server that cannot serve for now (its restart wait, a lost connection,
//! a call that timed out) is asked again after a bounded pause, within the
//! same overall wait. When the overall wait is over, the last answer is
//! the caller's: "busy" naming the holder, or why the server could not
//! serve.

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{AcquireSpec, LeaseBackend};
use crate::error::{Error, Result};
use crate::types::Grant;

/// A round's wait when the backend does not say its max wait (a server's
/// default `--max-wait`): a refusal naming a smaller max shrinks it.
const DEFAULT_ROUND: Duration = Duration::from_secs(10);

/// The first and the longest pause before asking again a backend that
/// could not serve, or that answered "busy" without waiting.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// The longest wait stated as a time: anything longer is "forever".
pub const FOREVER: Duration = Duration::MAX;

/// Acquires with `wait` in all (a wait of [`FOREVER`] never gives up),
/// re-issuing bounded waits. `spec_at` makes each round's spec from the
/// wait that round may use (a deadline given as a TTL is counted from
/// each round's start, so a long wait does not eat the lease).
pub async fn acquire(
    backend: &dyn LeaseBackend,
    wait: Duration,
    mut spec_at: impl FnMut(Duration) -> AcquireSpec,
) -> Result<Grant> {
    if wait.is_zero() {
        // One round that does not wait, answered as it comes: nothing to
        // time (the loop below would read the clock four times for it).
        return backend.acquire_lease(spec_at(Duration::ZERO)).await;
    }
    let give_up = Instant::now().checked_add(wait);
    let mut round_cap = backend.max_wait().unwrap_or(DEFAULT_ROUND);
    let mut pause = FIRST_PAUSE;
    loop {
        let remaining = give_up.map_or(FOREVER, |g| g.saturating_duration_since(Instant::now()));
        let round = remaining.min(round_cap);
        let started = Instant::now();
        let error = match backend.acquire_lease(spec_at(round)).await {
            Ok(grant) => return Ok(grant),
            Err(e) => e,
        };
        let left = give_up.map_or(FOREVER, |g| g.saturating_duration_since(Instant::now()));
        if left.is_zero() {
            return Err(error);
        }
        match &error {
            // The round waited its time out: queue again at once.
            Error::Busy { .. } if !round.is_zero() && started.elapsed() >= round / 2 => {
                pause = FIRST_PAUSE;
                continue;
            }
            // Refused as a longer wait than the backend allows: go on in
            // rounds of the max it stated.
            Error::WaitTooLong { max, .. } if *max < round => {
                round_cap = *max;
                continue;
            }
            // A backend that said until when it cannot serve (a server in
            // its restart wait): ask again then, not before.
            Error::Unavailable {
                retry_after: Some(after),
                ..
            } => {
                tokio::time::sleep((*after).min(left)).await;
                pause = FIRST_PAUSE;
                continue;
            }
            // Busy without waiting (a backend that cannot wait, a race),
            // or a server that cannot serve for now: ask again soon.
            Error::Busy { .. }
            | Error::Unavailable { .. }
            | Error::Connect { .. }
            | Error::Timeout { .. }
            | Error::NoSignedTime { .. } => {}
            e if e.is_retryable() => {}
            _ => return Err(error),
        }
        tokio::time::sleep(pause.min(left)).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;
    use bagel_proto::clock::{Clock, SystemClock};

    use super::*;
    use crate::types::{LeaseRef, Metadata, ReleaseOptions, Renewal};
    use crate::{Micros, Mode};

    /// A backend that does not say its max wait (1 s), refuses a longer
    /// one as [`Error::WaitTooLong`], and refuses anything else as
    /// invalid, recording the waits it was asked for.
    #[derive(Debug, Default)]
    struct Unsaid {
        asked: Mutex<Vec<Duration>>,
    }

    const MAX: Duration = Duration::from_secs(1);

    #[async_trait]
    impl LeaseBackend for Unsaid {
        fn location(&self) -> String {
            "test://unsaid".into()
        }
        fn clock(&self) -> Arc<dyn Clock> {
            Arc::new(SystemClock)
        }
        fn max_ttl(&self) -> Duration {
            Duration::from_secs(10)
        }
        async fn acquire_lease(&self, spec: AcquireSpec) -> Result<Grant> {
            self.asked.lock().unwrap().push(spec.wait);
            if spec.wait > MAX {
                return Err(Error::WaitTooLong {
                    max: MAX,
                    reason: "over the max".into(),
                });
            }
            Err(Error::invalid("names", "stop here"))
        }
        async fn renew_lease(&self, _: &LeaseRef, _: Micros, _: Option<Metadata>) -> Result<Renewal> {
            unreachable!("not renewed")
        }
        async fn upgrade_lease(&self, _: &LeaseRef) -> Result<Grant> {
            unreachable!("not upgraded")
        }
        async fn release_lease(&self, _: &LeaseRef, _: ReleaseOptions) -> Result<Micros> {
            unreachable!("not released")
        }
    }

    fn spec(wait: Duration) -> AcquireSpec {
        AcquireSpec {
            names: vec!["n".into()],
            deadline: Micros::now().saturating_add(Duration::from_secs(5)),
            ttl: Some(Duration::from_secs(5)),
            mode: Mode::Full,
            owner: "o".into(),
            wait,
            holder_key: None,
        }
    }

    /// The max comes from the refusal's number, whatever its words: the
    /// next round asks for it.
    #[tokio::test]
    async fn a_refused_wait_is_cut_to_the_max_the_refusal_carries() {
        let backend = Unsaid::default();
        let e = acquire(&backend, Duration::from_secs(3), spec).await.unwrap_err();
        assert!(matches!(e, Error::Invalid { .. }), "{e:?}");
        let asked = backend.asked.lock().unwrap().clone();
        assert!(
            matches!(asked.as_slice(), [first, second] if *first > MAX && *second == MAX),
            "{asked:?}"
        );
    }

    /// An acquire that does not wait is one round asking for no wait,
    /// answered as it comes (here a refusal), not retried.
    #[tokio::test]
    async fn no_wait_is_one_round() {
        let backend = Unsaid::default();
        let e = acquire(&backend, Duration::ZERO, spec).await.unwrap_err();
        assert!(matches!(e, Error::Invalid { .. }), "{e:?}");
        assert_eq!(*backend.asked.lock().unwrap(), [Duration::ZERO]);
    }
}
