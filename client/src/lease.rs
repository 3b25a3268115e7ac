//! [`Lease`]: a held lease, renewed in the background until released.

use std::sync::Arc;
use std::time::Duration;

use bagel_proto::{KeyRing, Micros, pb, verify_witness};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::bag::{self, BagConfig, BagStore, WriteRights};
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
    /// The witness of the latest grant, upgrade or renewal.
    pub witness: pb::Witness,
    /// Set once the lease is lost; never cleared.
    pub lost: Option<String>,
}

#[derive(Debug)]
struct Shared {
    client: Client,
    grant: pb::LeaseGrant,
    ttl: Duration,
    options: LeaseOptions,
    state: watch::Sender<LeaseState>,
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
        });
        let shared = Arc::new(Shared {
            client,
            grant,
            ttl,
            options,
            state,
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

    /// The earliest time up to which every bag must be closed before this
    /// holder may trust what it reads of the previous holders' data: the
    /// highest previous watermark among names whose previous lease was
    /// broken or is unknown. `None` on the happy path (all released).
    pub fn close_before_reading(&self) -> Option<Micros> {
        self.names()
            .iter()
            .filter_map(|n| n.previous.as_ref())
            .filter(|p| matches!(p.ended(), pb::Ended::Broken | pb::Ended::Unknown))
            .map(|p| Micros::from_micros(p.watermark_us))
            .max()
    }

    /// Rights to write under this lease, for a [`bag::Writer`]. They follow
    /// renewals (deadline and witness), and stop at once if the lease is
    /// lost or is only tentative.
    pub fn rights(&self) -> Arc<dyn WriteRights> {
        Arc::new(LeaseRights {
            min_timestamp: self.min_timestamp(),
            state: self.subscribe(),
        })
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
        self.shared.state.send_modify(|s| {
            s.mode = pb::Mode::Full;
            s.witness = witness;
        });
        Ok(())
    }

    /// Releases the lease, publishing `watermark` (an upper bound of every
    /// timestamp written under it; `None` = wrote nothing). Call only once
    /// the writes are durable. Returns the watermark the server stored.
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
        // Stop renewing first, so no renewal races the release.
        self.cancel.cancel();
        if let Some(task) = self.renewer.take() {
            let _ = task.await;
        }
        let resp = self
            .shared
            .client
            .release_raw(pb::ReleaseRequest {
                lease_id: self.id().to_owned(),
                token: self.token().to_owned(),
                watermark_us: watermark.map_or(0, Micros::as_micros),
                signed_time,
                metadata,
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
}

impl WriteRights for LeaseRights {
    fn min_timestamp(&self) -> Micros {
        self.min_timestamp
    }

    fn deadline(&self) -> Micros {
        let s = self.state.borrow();
        if s.lost.is_some() || s.mode != pb::Mode::Full {
            // No right to write: a deadline in the past makes writers refuse.
            Micros::ZERO
        } else {
            s.deadline
        }
    }

    fn witnesses(&self) -> Vec<pb::Witness> {
        vec![self.state.borrow().witness.clone()]
    }
}

async fn renew_once(shared: &Shared, metadata: Option<pb::Metadata>) -> Result<Micros> {
    let deadline = shared.client.clock().now().saturating_add(shared.ttl);
    let resp = shared
        .client
        .renew_raw(pb::RenewRequest {
            lease_id: shared.grant.lease_id.clone(),
            token: shared.grant.token.clone(),
            deadline_us: deadline.as_micros(),
            metadata,
        })
        .await?;
    let deadline = Micros::from_micros(resp.deadline_us);
    let witness = resp.witness.unwrap_or_default();
    shared.state.send_modify(|s| {
        s.deadline = s.deadline.max(deadline);
        s.witness = witness;
    });
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
