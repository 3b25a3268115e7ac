//! [`Lease`]: a held lease, renewed in the background until released.

use std::sync::Arc;
use std::time::Duration;

use bagel_proto::{KeyRing, Micros, pb, verify_witness};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::bag::{self, BagConfig, BagStore, RightsSnapshot, WriteLedger, WriteRights};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::json::LeaseJson;

/// How a [`Lease`] looks after itself.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LeaseOptions {
    /// Renew in the background (default true).
    pub auto_renew: bool,
    /// How often to renew; default a third of the TTL, so two renewals can
    /// fail before the lease is at risk.
    pub renew_every: Option<Duration>,
    /// [`Lease::is_valid`] turns false this long before the deadline, to
    /// leave room for clock error and for a write in flight to land.
    pub safety_margin: Duration,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            auto_renew: true,
            renew_every: None,
            safety_margin: Duration::from_millis(500),
        }
    }
}

impl LeaseOptions {
    #[must_use]
    pub fn with_auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    #[must_use]
    pub fn with_renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    #[must_use]
    pub fn with_safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = margin;
        self
    }
}

/// What changes over a lease's life.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseState {
    pub deadline: Micros,
    pub mode: pb::Mode,
    /// The witness that states `deadline` and `mode`: always the pair from
    /// one answer, so a writer citing it never writes past what it says.
    pub witness: pb::Witness,
    /// Set once the lease is lost; never cleared.
    pub lost: Option<String>,
    /// Set when the release starts: no more writes under the lease.
    pub released: bool,
}

impl LeaseState {
    /// Takes an answer's (deadline, mode, witness) if it grants more than
    /// what is held: full before tentative, then the later deadline.
    /// Answers arrive in any order (a renewal in flight while another one
    /// or an upgrade lands); an older, lesser one never replaces a newer.
    fn adopt(&mut self, deadline: Micros, mode: pb::Mode, witness: pb::Witness) {
        let rank = |mode: pb::Mode, deadline: Micros| (mode.normalized() == pb::Mode::Full, deadline);
        if rank(mode, deadline) > rank(self.mode, self.deadline) {
            self.deadline = deadline;
            self.mode = mode.normalized();
            self.witness = witness;
        }
    }
}

#[derive(Debug)]
struct Shared {
    client: Client,
    grant: pb::LeaseGrant,
    ttl: Duration,
    options: LeaseOptions,
    state: watch::Sender<LeaseState>,
    /// What the writers under this lease wrote; the release publishes it.
    ledger: Arc<WriteLedger>,
    /// This holder closed every bag below this (µs), having found its
    /// predecessors unsettled; the release says so.
    settled_through: std::sync::atomic::AtomicU64,
}

/// A held lease. Renews itself in the background (unless told not to) and
/// reports loss through [`Lease::lost`] and [`Lease::subscribe`].
///
/// Dropping a `Lease` stops renewal but does not release it: a release
/// publishes a watermark, which only the writer knows. An unreleased lease
/// expires at its deadline and the next holder treats it as broken.
#[derive(Debug)]
pub struct Lease {
    shared: Arc<Shared>,
    cancel: CancellationToken,
    renewer: Option<JoinHandle<()>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Verifies a grant's witness and that it states what the grant says.
pub(crate) fn check_grant(grant: &pb::LeaseGrant, keys: &KeyRing) -> Result<pb::WitnessBody> {
    let witness = grant.witness.as_ref().ok_or_else(|| Error::Witness {
        reason: "grant has no witness".into(),
    })?;
    let body = verify_witness(witness, keys).map_err(|e| Error::Witness {
        reason: e.to_string(),
    })?;
    grant_states(grant, &body)?;
    Ok(body)
}

/// Checks a grant's witness body states the grant, without checking the
/// signature (the caller verified it, or its batch root, already).
pub(crate) fn check_grant_body(grant: &pb::LeaseGrant) -> Result<()> {
    let witness = grant.witness.as_ref().ok_or_else(|| Error::Witness {
        reason: "grant has no witness".into(),
    })?;
    let body =
        <pb::WitnessBody as prost::Message>::decode(witness.body.as_slice()).map_err(|e| Error::Witness {
            reason: e.to_string(),
        })?;
    grant_states(grant, &body)
}

fn grant_states(grant: &pb::LeaseGrant, body: &pb::WitnessBody) -> Result<()> {
    let names_match =
        body.names.len() == grant.names.len()
            && body.names.iter().zip(&grant.names).all(|(w, g)| {
                w.name == g.name && w.fencing_token == g.fencing_token && w.previous == g.previous
            });
    if body.lease_id != grant.lease_id
        || body.deadline_us != grant.deadline_us
        || body.min_timestamp_us != grant.min_timestamp_us
        || !names_match
    {
        return Err(Error::Witness {
            reason: format!("witness does not state the grant of lease {}", grant.lease_id),
        });
    }
    Ok(())
}

impl Lease {
    pub(crate) fn start(client: Client, grant: pb::LeaseGrant, ttl: Duration, options: LeaseOptions) -> Self {
        let (state, _) = watch::channel(LeaseState {
            deadline: Micros::from_micros(grant.deadline_us),
            mode: grant.mode().normalized(),
            witness: grant.witness.clone().unwrap_or_default(),
            lost: None,
            released: false,
        });
        let shared = Arc::new(Shared {
            client,
            grant,
            ttl,
            options,
            state,
            ledger: Arc::new(WriteLedger::default()),
            settled_through: std::sync::atomic::AtomicU64::new(0),
        });
        let cancel = CancellationToken::new();
        let renewer = shared
            .options
            .auto_renew
            .then(|| tokio::spawn(renew_loop(Arc::clone(&shared), cancel.clone())));
        Lease {
            shared,
            cancel,
            renewer,
        }
    }

    pub fn id(&self) -> &str {
        &self.shared.grant.lease_id
    }

    /// The secret proving this holder. Keep it out of logs.
    pub fn token(&self) -> &str {
        &self.shared.grant.token
    }

    /// The names with their fencing tokens and previous leases.
    pub fn names(&self) -> &[pb::NameGrant] {
        &self.shared.grant.names
    }

    pub fn fencing_token(&self, name: &str) -> Option<u64> {
        self.names()
            .iter()
            .find(|n| n.name == name)
            .map(|n| n.fencing_token)
    }

    /// Every message written under this lease must be strictly later.
    pub fn min_timestamp(&self) -> Micros {
        Micros::from_micros(self.shared.grant.min_timestamp_us)
    }

    pub fn deadline(&self) -> Micros {
        self.shared.state.borrow().deadline
    }

    pub fn mode(&self) -> pb::Mode {
        self.shared.state.borrow().mode
    }

    /// The witness of the latest grant, upgrade or renewal.
    pub fn witness(&self) -> pb::Witness {
        self.shared.state.borrow().witness.clone()
    }

    pub fn state(&self) -> LeaseState {
        self.shared.state.borrow().clone()
    }

    /// A local check, no RPC: not lost, full, and the deadline minus the
    /// safety margin is still ahead of the local clock.
    pub fn is_valid(&self) -> bool {
        let s = self.shared.state.borrow();
        let now = self.shared.client.clock().now();
        s.lost.is_none()
            && !s.released
            && s.mode == pb::Mode::Full
            && now.saturating_add(self.shared.options.safety_margin) < s.deadline
    }

    /// Watches the lease's state (deadline, witness, loss).
    pub fn subscribe(&self) -> watch::Receiver<LeaseState> {
        self.shared.state.subscribe()
    }

    /// Resolves when the lease is lost, with the reason.
    pub async fn lost(&self) -> String {
        let mut rx = self.subscribe();
        let state = rx.wait_for(|s| s.lost.is_some()).await;
        match state {
            Ok(s) => s.lost.clone().unwrap_or_default(),
            // The sender lives in `self.shared`, so this cannot happen
            // while `self` is borrowed.
            Err(_) => "lease handle dropped".into(),
        }
    }

    /// Every bag that can hold a timestamp below this must be closed
    /// before this holder may trust what it reads of its predecessors'
    /// data: some earlier holder of a name (not only the last) was broken,
    /// is unknown, or released with writes of unknown outcome, and nobody
    /// has closed its bags since. `None` when everything before is settled.
    pub fn close_before_reading(&self) -> Option<Micros> {
        self.names()
            .iter()
            .filter_map(|n| n.previous.as_ref())
            .map(|p| p.unsettled_until_us)
            .filter(|&u| u > 0)
            .max()
            .map(Micros::from_micros)
    }

    /// Rights to write under this lease, for a [`bag::Writer`]. They follow
    /// renewals (deadline and witness, one pair), stop at once if the lease
    /// is lost, released or only tentative, and record what is written so
    /// that [`Lease::release`] publishes it.
    pub fn rights(&self) -> Arc<dyn WriteRights> {
        Arc::new(LeaseRights {
            min_timestamp: self.min_timestamp(),
            state: self.subscribe(),
            ledger: Arc::clone(&self.shared.ledger),
        })
    }

    /// What the writers under this lease have written so far.
    pub fn written(&self) -> bag::WriteSummary {
        self.shared.ledger.summary()
    }

    /// The design's sad path: if a predecessor of this lease was broken or
    /// is unknown, it may still have messages in flight. Close every bag of
    /// `logs` that can hold a timestamp below its watermark (waiting, if
    /// needed, until their close time), so everything it could ever write
    /// is visible before this holder reads its state. Returns at once when
    /// every predecessor released.
    pub async fn close_predecessor_bags(
        &self,
        store: &dyn BagStore,
        logs: &[String],
        cfg: &BagConfig,
    ) -> std::result::Result<(), bag::Error> {
        let Some(until) = self.close_before_reading() else {
            return Ok(());
        };
        for log in logs {
            bag::metronome::close_through(store, log, until, cfg, &**self.shared.client.clock()).await?;
        }
        // Settled: the release tells the next holder it need not close
        // these again.
        self.shared
            .settled_through
            .fetch_max(until.as_micros(), std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// The lease as the CLI prints it (`bagel acquire --json`), with the
    /// latest deadline and witness.
    pub fn to_json(&self) -> LeaseJson {
        let mut grant = self.shared.grant.clone();
        let s = self.state();
        grant.deadline_us = s.deadline.as_micros();
        grant.mode = s.mode.into();
        grant.witness = Some(s.witness);
        LeaseJson::from_grant(&grant, Some(self.shared.client.url()))
    }

    /// Renews now to `now + ttl`.
    pub async fn renew(&self) -> Result<Micros> {
        renew_once(&self.shared, None).await
    }

    /// Renews now, attaching metadata that says where updates were stored.
    pub async fn renew_with_metadata(&self, metadata: pb::Metadata) -> Result<Micros> {
        renew_once(&self.shared, Some(metadata)).await
    }

    /// Turns a tentative lease full; fails if a name was broken meanwhile.
    pub async fn upgrade(&self) -> Result<()> {
        let grant = self
            .shared
            .client
            .upgrade_raw(pb::UpgradeRequest {
                lease_id: self.id().to_owned(),
                token: self.token().to_owned(),
            })
            .await?;
        let witness = grant.witness.clone().unwrap_or_default();
        let deadline = Micros::from_micros(grant.deadline_us);
        self.shared
            .state
            .send_modify(|s| s.adopt(deadline, pb::Mode::Full, witness));
        Ok(())
    }

    /// Releases the lease, publishing a watermark: at least the highest
    /// timestamp its writers handed to the store (see [`Lease::rights`]),
    /// or `watermark` if that is higher (`None` = nothing more). A
    /// `watermark` below what was written is refused: the next holder
    /// could write below acknowledged messages. Writes in flight are
    /// waited for first, and none can start once the release has begun.
    /// Returns the watermark the server stored.
    pub async fn release(self, watermark: Option<Micros>) -> Result<Micros> {
        self.release_with(watermark, None, None).await
    }

    /// [`Lease::release`] with a signed time for the watermark and metadata.
    pub async fn release_with(
        mut self,
        watermark: Option<Micros>,
        signed_time: Option<pb::SignedTime>,
        metadata: Option<pb::Metadata>,
    ) -> Result<Micros> {
        if let (Some(given), Some(written)) = (watermark, self.written().max_written)
            && given < written
        {
            return Err(Error::WatermarkBelowWritten { given, written });
        }
        // Stop renewing first, so no renewal races the release.
        self.cancel.cancel();
        if let Some(task) = self.renewer.take() {
            let _ = task.await;
        }
        // No new writes; then wait for those in flight to return.
        self.shared.state.send_modify(|s| s.released = true);
        let written = self.shared.ledger.close().await;
        let watermark = watermark.max(written.max_written).unwrap_or(Micros::ZERO);
        let full = self.shared.state.borrow().mode == pb::Mode::Full;
        let resp = self
            .shared
            .client
            .release_raw(pb::ReleaseRequest {
                lease_id: self.id().to_owned(),
                token: self.token().to_owned(),
                // A tentative lease had no right to write: it says 0.
                watermark_us: if full { watermark.as_micros() } else { 0 },
                signed_time,
                metadata,
                unsettled: written.uncertain,
                settled_through_us: self
                    .shared
                    .settled_through
                    .load(std::sync::atomic::Ordering::SeqCst),
            })
            .await?;
        Ok(Micros::from_micros(resp.watermark_us))
    }
}

/// See [`Lease::rights`].
#[derive(Debug)]
struct LeaseRights {
    min_timestamp: Micros,
    state: watch::Receiver<LeaseState>,
    ledger: Arc<WriteLedger>,
}

impl WriteRights for LeaseRights {
    fn snapshot(&self) -> std::result::Result<RightsSnapshot, String> {
        let s = self.state.borrow();
        if let Some(reason) = &s.lost {
            return Err(format!("the lease was lost: {reason}"));
        }
        if s.released {
            return Err("the lease is released".into());
        }
        if s.mode != pb::Mode::Full {
            return Err("the lease is tentative: upgrade it first".into());
        }
        Ok(RightsSnapshot {
            min_timestamp: self.min_timestamp,
            deadline: s.deadline,
            witnesses: vec![s.witness.clone()],
        })
    }

    fn ledger(&self) -> Option<Arc<WriteLedger>> {
        Some(Arc::clone(&self.ledger))
    }
}

async fn renew_once(shared: &Shared, metadata: Option<pb::Metadata>) -> Result<Micros> {
    let deadline = shared.client.clock().now().saturating_add(shared.ttl);
    let (resp, body) = shared
        .client
        .renew_checked(pb::RenewRequest {
            lease_id: shared.grant.lease_id.clone(),
            token: shared.grant.token.clone(),
            deadline_us: deadline.as_micros(),
            metadata,
        })
        .await?;
    let deadline = Micros::from_micros(resp.deadline_us);
    let witness = resp.witness.unwrap_or_default();
    shared
        .state
        .send_modify(|s| s.adopt(deadline, body.mode().normalized(), witness));
    Ok(deadline)
}

/// Renews every `renew_every` until cancelled or lost. A retryable failure
/// is retried quickly until the safety margin before the deadline; any
/// other failure, or running out of time, marks the lease lost.
async fn renew_loop(shared: Arc<Shared>, cancel: CancellationToken) {
    let every = shared
        .options
        .renew_every
        .unwrap_or(shared.ttl / 3)
        .max(Duration::from_millis(1));
    let retry = (every / 10).clamp(Duration::from_millis(1), Duration::from_millis(200));
    let mut next = every;
    loop {
        tokio::select! {
            () = tokio::time::sleep(next) => {}
            () = cancel.cancelled() => return,
        }
        let outcome = tokio::select! {
            r = renew_once(&shared, None) => r,
            () = cancel.cancelled() => return,
        };
        match outcome {
            Ok(_) => next = every,
            Err(e) => {
                let deadline = shared.state.borrow().deadline;
                let now = shared.client.clock().now();
                let out_of_time = now.saturating_add(shared.options.safety_margin) >= deadline;
                if !e.is_retryable() || out_of_time {
                    let reason = format!("renewal failed: {e}");
                    tracing::warn!(lease = %shared.grant.lease_id, %reason, "lease lost");
                    shared.state.send_modify(|s| s.lost = Some(reason));
                    return;
                }
                tracing::debug!(lease = %shared.grant.lease_id, error = %e, "renewal failed; retrying");
                next = retry;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(deadline: u64, mode: pb::Mode, tag: u8) -> LeaseState {
        LeaseState {
            deadline: Micros::from_micros(deadline),
            mode,
            witness: witness(tag),
            lost: None,
            released: false,
        }
    }

    fn witness(tag: u8) -> pb::Witness {
        pb::Witness {
            body: vec![tag],
            ..Default::default()
        }
    }

    #[test]
    fn a_late_lesser_answer_never_replaces_the_witness_of_a_greater_one() {
        let mut s = state(100, pb::Mode::Full, 0);
        // Two renewals in flight: the later deadline's answer lands first.
        s.adopt(Micros::from_micros(300), pb::Mode::Full, witness(3));
        s.adopt(Micros::from_micros(200), pb::Mode::Full, witness(2));
        assert_eq!((s.deadline.as_micros(), s.witness.body[0]), (300, 3));
    }

    #[test]
    fn an_upgrade_outranks_a_tentative_renewal_and_is_never_undone() {
        let mut s = state(100, pb::Mode::Tentative, 0);
        // A renewal of the tentative lease and the upgrade race; the
        // server signs the upgrade with the current deadline, so the
        // tentative answer can say at most as much.
        s.adopt(Micros::from_micros(200), pb::Mode::Full, witness(1));
        s.adopt(Micros::from_micros(200), pb::Mode::Tentative, witness(2));
        assert_eq!((s.mode, s.witness.body[0]), (pb::Mode::Full, 1));
        // A full renewal with a later deadline moves on, in one piece.
        s.adopt(Micros::from_micros(250), pb::Mode::Full, witness(3));
        assert_eq!((s.deadline.as_micros(), s.witness.body[0]), (250, 3));
    }
}
