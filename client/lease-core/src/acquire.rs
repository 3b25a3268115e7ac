//! [`AcquireBuilder`]: the options of one acquire, on any backend.

use std::sync::Arc;
use std::time::Duration;

use bagel_proto::Micros;

use crate::backend::{AcquireSpec, LeaseBackend};
use crate::error::Result;
use crate::holder_key::HolderKey;
use crate::lease::{Lease, LeaseOptions};
use crate::ttl_check;
use crate::types::Mode;

#[derive(Clone, Copy, Debug)]
enum DeadlineSpec {
    Ttl(Duration),
    At(Micros),
}

/// Options of one acquire. Defaults: full mode, TTL = the backend's max
/// TTL, no waiting for busy names, background renewal on.
#[derive(Debug)]
#[must_use = "call .send() to acquire"]
pub struct AcquireBuilder {
    backend: Arc<dyn LeaseBackend>,
    names: Vec<String>,
    deadline: DeadlineSpec,
    mode: Mode,
    owner: String,
    wait: Duration,
    options: LeaseOptions,
    holder: HolderKey,
}

impl AcquireBuilder {
    /// An acquire of `names` on `backend` (a `bagel_client::Client` makes one
    /// with `Client::acquire`).
    pub fn new<I, S>(backend: Arc<dyn LeaseBackend>, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        AcquireBuilder {
            deadline: DeadlineSpec::Ttl(backend.max_ttl()),
            backend,
            names: names.into_iter().map(Into::into).collect(),
            mode: Mode::Full,
            owner: String::new(),
            wait: Duration::ZERO,
            options: LeaseOptions::default(),
            holder: HolderKey::default(),
        }
    }

    /// Deadline = now + `ttl` (renewals keep extending by `ttl`).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.deadline = DeadlineSpec::Ttl(ttl);
        self
    }

    /// An absolute deadline. Renewals then extend by the TTL this implies.
    pub fn deadline(mut self, deadline: Micros) -> Self {
        self.deadline = DeadlineSpec::At(deadline);
        self
    }

    /// Reserve only; write after [`Lease::upgrade`].
    pub fn tentative(mut self) -> Self {
        self.mode = Mode::Tentative;
        self
    }

    /// Who is acquiring, free text for operators: conflicts, `describe`
    /// and watches show it (default empty; under mutual TLS the server
    /// takes the certificate's subject).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// Wait up to `wait` for busy names, however long: the wait is
    /// re-issued in rounds of at most the backend's max wait, and a
    /// server that cannot serve for now (its restart wait, a reconnect) is
    /// asked again within it (see [`crate::long_wait`]). With
    /// [`AcquireBuilder::via`] (batched acquires cannot wait server-side)
    /// the names are polled instead.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Wait until the names are had, however long that takes.
    pub fn wait_forever(self) -> Self {
        self.wait(crate::long_wait::FOREVER)
    }

    /// A holder key made for this lease alone, rather than the one the
    /// process's leases share for a second (see [`crate::holder_key`]):
    /// for a lease whose key will be handed to another process (a lease
    /// file), so that what leaves signs for this lease only.
    pub fn own_holder_key(mut self) -> Self {
        self.holder = HolderKey::Own;
        self
    }

    /// Renewal interval, safety margin, whether to renew at all.
    pub fn options(mut self, options: LeaseOptions) -> Self {
        self.options = options;
        self
    }

    /// Sends the acquire, and later the lease's renewals, upgrade and
    /// release, through `backend` instead: typically a `bagel_client`
    /// `Coalescer`, which batches them with other tasks' operations (one
    /// RPC and one signature per batch) and talks to the server it was
    /// made over, whatever backend this builder began with.
    pub fn via<B: LeaseBackend + Clone>(mut self, backend: &B) -> Self {
        self.backend = Arc::new(backend.clone());
        self
    }

    /// Sends the acquire. With a TTL, the server counts it from its grant
    /// (see [`AcquireSpec::ttl`]). With an absolute deadline, a grant that
    /// leaves much less than was asked is logged as a warning naming both,
    /// and a refusal of a deadline already past on the server's clock says
    /// what this host's clock read.
    pub async fn send(self) -> Result<Lease> {
        let clock = self.backend.clock();
        // The key the witnesses name (the same for every server of a lease
        // over several): it signs the batches written under this lease.
        let holder = self.holder.get();
        let holder_key = Some(holder.verifying_key().to_bytes());
        let relative = match self.deadline {
            DeadlineSpec::Ttl(t) => Some(t),
            DeadlineSpec::At(_) => None,
        };
        // Each round's request: a TTL counts from the server's grant (and,
        // for the lease's own renewals, from when the granting round was
        // sent), so a long wait must not eat the lease. Every round sets
        // when it was sent, the TTL it counts, and its deadline with the
        // clock then (there is a round before any answer, so these are
        // read once per round, never ahead of it).
        let mut sent = None;
        let mut ttl = Duration::ZERO;
        let mut asked = None;
        let spec_at = |wait: Duration| {
            sent = Some(tokio::time::Instant::now());
            let now = clock.now();
            let deadline = match self.deadline {
                DeadlineSpec::Ttl(t) => {
                    ttl = t;
                    now.saturating_add(t)
                }
                DeadlineSpec::At(at) => {
                    ttl = at.duration_since(now);
                    at
                }
            };
            asked = Some((deadline, now));
            AcquireSpec {
                names: self.names.clone(),
                deadline,
                ttl: relative,
                mode: self.mode,
                owner: self.owner.clone(),
                wait,
                holder_key,
            }
        };
        let grant = match crate::long_wait::acquire(&*self.backend, self.wait, spec_at).await {
            Ok(grant) => grant,
            Err(e) => {
                return Err(match (relative, asked) {
                    (None, Some((deadline, now))) => ttl_check::past_deadline(e, deadline, now, clock.now()),
                    _ => e,
                });
            }
        };
        let left = ttl_check::left_at_grant(&grant.witnesses);
        if let Some(warning) = ttl_check::short_grant(&grant, left, ttl) {
            tracing::warn!("{warning}");
        }
        let sent = sent.unwrap_or_else(tokio::time::Instant::now);
        let answered_in = sent.elapsed();
        let margin = self.options.safety_margin;
        let mut lease = Lease::start(self.backend, grant, sent, left, ttl, self.options, holder);
        if needs_reanchor(answered_in, left)
            && let Err(e) = lease.reanchor().await
        {
            // The server holds the names for a holder that cannot renew
            // (its clock is too far off, say): give them back now rather
            // than leave them held, with no one working, until the deadline.
            if let Err(release) = lease.release(None).await {
                tracing::warn!(error = %release, "could not release a grant whose first renewal was refused");
            }
            return Err(e);
        }
        // A grant this host's wall clock already counts as over, or as
        // inside the safety margin although the server granted more (its
        // clock is ahead of the server's by more than the margin), can
        // never be used: every writer refuses it and `bagel run` would
        // fence at once. Holding it anyway keeps the names from everyone
        // until the deadline, so it is given back at once. (A grant that is
        // short because it was asked short is the caller's to judge.)
        let deadline = lease.deadline();
        let wall_left = deadline.duration_since(clock.now());
        let unusable = if lease.time_left().is_zero() {
            Some("it is ahead of the server's by more than the TTL; the names were released".to_owned())
        } else {
            left.filter(|&granted| wall_left <= margin && granted > margin)
                .map(|granted| {
                    format!(
                        "it leaves {} of the {} the server granted, inside the safety margin of {}: this \
                     host's clock is ahead of the server's by about {}; the names were released",
                        bagel_proto::human_duration(wall_left),
                        bagel_proto::human_duration(granted),
                        bagel_proto::human_duration(margin),
                        bagel_proto::human_duration(granted.saturating_sub(wall_left)),
                    )
                })
        };
        if let Some(why) = unusable {
            if let Err(release) = lease.release(None).await {
                tracing::warn!(error = %release, "could not release a grant this host cannot use");
            }
            let when = if wall_left.is_zero() {
                "has already passed on this host's clock"
            } else {
                "is too close on this host's clock"
            };
            return Err(crate::error::Error::ClockOff {
                detail: format!("the grant's deadline {deadline} {when}: {why}"),
            });
        }
        lease.start_renewing();
        Ok(lease)
    }
}

/// Whether a grant whose request took `answered_in` to be answered must be
/// renewed at once to be counted from a fresh send.
///
/// The lease's local validity is counted from the send of the request that
/// was answered (the grant was issued at some instant after it, and the
/// monotonic clock cannot know which). For a request that waited for a
/// busy name, that send was long before the grant: a standby that waited
/// 6 s of a 10 s TTL would count 4 s left of a lease the server granted
/// for 10 s from now, and be fenced a second after taking over. A renewal
/// answered at once restarts the count from its own send. Waits shorter
/// than a tenth of the grant cost too little to be worth the round trip.
fn needs_reanchor(answered_in: Duration, left: Option<Duration>) -> bool {
    left.is_some_and(|left| answered_in > left / 10)
}

#[cfg(test)]
mod tests {
    use super::needs_reanchor;
    use std::time::Duration;

    #[test]
    fn only_a_grant_that_took_a_tenth_of_its_time_is_renewed_at_once() {
        let ten = Some(Duration::from_secs(10));
        assert!(!needs_reanchor(Duration::from_millis(3), ten));
        assert!(!needs_reanchor(Duration::from_secs(1), ten));
        assert!(needs_reanchor(Duration::from_millis(1001), ten));
        assert!(needs_reanchor(Duration::from_secs(60), ten));
        // No witness says when it was issued: nothing is counted from the
        // send, so nothing to restart.
        assert!(!needs_reanchor(Duration::from_secs(60), None));
    }
}
