//! The [`LeaseBackend`] impl: each request validated with the server's
//! limits and wording, then carried out by the parts beside this one; the
//! acquire's polling wait (backoff, woken no later than the holder's
//! deadline plus the clock margin) is here.
//!
//! Separate so that the trait's surface, what a [`bagel_lease_core::Lease`]
//! handle calls, reads as one list.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bagel_lease_core::backend::{Call, NameRoute, Offer};
use bagel_lease_core::{
    AcquireSpec, BackendInfo, Error, Grant, History, LeaseBackend, LeaseRef, Metadata, Micros, NameState,
    ReleaseOptions, Renewal, Result, StoreInfo,
};
use bagel_proto::clock::Clock;
use bagel_proto::{KeyRing, pb};

use super::acquire::{Attempt, Backoff};
use super::{MAX_RACES, S3LeaseBackend};
use crate::object::{signed_time_b64, token_hash};
use crate::rules::{ReleaseSpec, Rules};
use crate::validate;

#[async_trait]
impl LeaseBackend for S3LeaseBackend {
    fn location(&self) -> String {
        self.store.location().to_owned()
    }

    fn describe_self(&self) -> String {
        "the S3 lease backend".into()
    }

    /// Neither list nor watch: the store is one object per name, found by
    /// its name.
    fn offers(&self, call: Call) -> Offer {
        let why = match call {
            Call::List => "it would have to read every lease object of the store",
            Call::Watch => "S3 has no change notifications",
        };
        Offer::No {
            why: Some(why.into()),
        }
    }

    fn route_name(&self, _name: &str) -> Result<NameRoute> {
        Ok(NameRoute::Store(self.location()))
    }

    async fn describe(&self, names: &[String]) -> Result<Vec<NameState>> {
        S3LeaseBackend::describe(self, names).await
    }

    async fn history(&self, name: &str) -> Result<History> {
        S3LeaseBackend::history(self, name).await
    }

    /// The keys published in the store (every client's that ever took a
    /// lease there).
    async fn trusted_keys(&self) -> Result<KeyRing> {
        self.keys().await
    }

    /// There is no server: the store's limits, margin and published keys.
    async fn info(&self) -> Result<BackendInfo> {
        Ok(BackendInfo::Store(StoreInfo {
            location: self.location(),
            key_id: self.key_id().to_owned(),
            min_ttl: self.cfg.limits.min_ttl,
            max_ttl: self.cfg.limits.max_ttl,
            max_wait: self.cfg.limits.max_wait,
            clock_margin: self.cfg.clock_margin,
            keys: self.keys().await?,
        }))
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.time.clock()
    }

    fn max_ttl(&self) -> Duration {
        self.cfg.limits.max_ttl
    }

    fn max_wait(&self) -> Option<Duration> {
        Some(self.cfg.limits.max_wait)
    }

    /// Takes every name or none, in name order. With `wait`, polls a busy
    /// name with backoff and jitter (S3 cannot tell us when it frees up),
    /// waking no later than the holder's deadline plus the clock margin,
    /// and gives up while the requested deadline is still valid.
    ///
    /// A TTL (`spec.ttl`) is counted from each attempt's signed time, as a
    /// lease server counts it from its grant: a standby that polled for
    /// seconds gets the whole TTL, not what was left of a deadline fixed
    /// when it started waiting.
    async fn acquire_lease(&self, mut spec: AcquireSpec) -> Result<Grant> {
        let names = validate::names(&spec.names, &self.cfg)?;
        validate::owner(&spec.owner, &self.cfg)?;
        validate::wait(spec.wait, &self.cfg)?;
        let clock = self.time.clock();
        let first = self.stamp().await?;
        if let Some(ttl) = spec.ttl {
            spec.deadline = first.now.saturating_add(ttl);
        }
        validate::deadline(spec.deadline, first.now, &self.cfg)?;
        // An absolute deadline: waiting eats into the lease, so give up
        // while it still leaves the min TTL. A TTL: wait as asked.
        let usable = match spec.ttl {
            Some(_) => spec.wait,
            None => spec
                .deadline
                .saturating_sub(self.cfg.limits.min_ttl)
                .duration_since(first.now)
                .saturating_sub(Duration::from_micros(1)),
        };
        let give_up = tokio::time::Instant::now() + spec.wait.min(usable);
        let mut backoff = Backoff::new();
        let mut races = 0;
        let mut stamp = first;
        loop {
            if let Some(ttl) = spec.ttl {
                spec.deadline = stamp.now.saturating_add(ttl);
            }
            match self.attempt(&names, &spec, &stamp).await {
                Ok(grant) => return Ok(grant),
                Err(Attempt::Failed(e)) => return Err(e),
                Err(Attempt::Raced) if races < MAX_RACES => races += 1,
                Err(Attempt::Raced) => {
                    return Err(Error::Busy {
                        message: format!("the names changed under each of {MAX_RACES} attempts; try again"),
                        conflict: None,
                    });
                }
                Err(Attempt::Busy(busy, free_from)) => {
                    let now = tokio::time::Instant::now();
                    if now >= give_up {
                        return Err(busy);
                    }
                    let mut pause = backoff.pause().min(give_up - now);
                    let free_in = free_from.next().duration_since(clock.now());
                    if free_in > Duration::ZERO {
                        pause = pause.min(free_in);
                    }
                    tokio::time::sleep(pause.max(Duration::from_millis(1))).await;
                }
            }
            stamp = self.stamp().await?;
        }
    }

    async fn renew_lease(
        &self,
        lease: &LeaseRef,
        deadline: Micros,
        metadata: Option<Metadata>,
    ) -> Result<Renewal> {
        self.renew(lease, |_| deadline, metadata).await
    }

    /// Counted from the renewal's checked time, as an acquire's TTL is.
    async fn renew_lease_ttl(
        &self,
        lease: &LeaseRef,
        ttl: Duration,
        metadata: Option<Metadata>,
    ) -> Result<Renewal> {
        self.renew(lease, |now| now.saturating_add(ttl), metadata).await
    }

    async fn upgrade_lease(&self, lease: &LeaseRef) -> Result<Grant> {
        let names = self.names_of(lease)?;
        let stamp = self.stamp().await?;
        let hash = token_hash(&lease.token);
        let objs = futures::future::try_join_all(names.iter().map(|n| {
            self.change_held(n, &lease.id, stamp.bound, |obj, now| {
                Rules::upgraded(obj, &lease.id, &hash, now, stamp.bound)
            })
        }))
        .await?;
        let (deadline, mode, min_timestamp, names, witness) =
            self.statement_of(pb::WitnessKind::Upgrade, &lease.id, &objs, &stamp);
        Ok(Grant {
            lease_id: lease.id.clone(),
            token: lease.token.clone(),
            deadline,
            min_timestamp,
            names,
            mode,
            witnesses: vec![witness],
            servers: Vec::new(),
        })
    }

    async fn release_lease(&self, lease: &LeaseRef, options: ReleaseOptions) -> Result<Micros> {
        validate::metadata(options.metadata.as_ref(), &self.cfg)?;
        let names = self.names_of(lease)?;
        let stamp = self.stamp().await?;
        let watermark = options.watermark.unwrap_or(Micros::ZERO);
        bagel_lease_core::rules::check_watermark(
            &options,
            stamp.now,
            "the releaser's checked clock",
            self.cfg.timestamp_tolerance,
        )?;
        let spec = ReleaseSpec {
            watermark,
            signed_time_b64: options.signed_time.as_ref().map(|s| signed_time_b64(&s.signed)),
            metadata: options.metadata.clone(),
            unsettled: options.unsettled,
            settled_through: options.settled_through.unwrap_or(Micros::ZERO),
        };
        let hash = token_hash(&lease.token);
        let objs = futures::future::try_join_all(names.iter().map(|n| {
            self.change_held(n, &lease.id, stamp.bound, |obj, now| {
                self.rules.released(obj, &lease.id, &hash, &spec, now)
            })
        }))
        .await?;
        for n in &names {
            self.forget(n, &lease.id);
        }
        Ok(objs
            .iter()
            .map(|o| Micros::from_micros(o.previous.watermark_us))
            .max()
            .unwrap_or(Micros::ZERO))
    }
}

impl S3LeaseBackend {
    /// Renews to `deadline_at(now)`, `now` being the renewal's checked
    /// time.
    async fn renew(
        &self,
        lease: &LeaseRef,
        deadline_at: impl FnOnce(Micros) -> Micros,
        metadata: Option<Metadata>,
    ) -> Result<Renewal> {
        validate::metadata(metadata.as_ref(), &self.cfg)?;
        let names = self.names_of(lease)?;
        let stamp = self.stamp().await?;
        let deadline = deadline_at(stamp.now);
        validate::deadline(deadline, stamp.now, &self.cfg)?;
        let hash = token_hash(&lease.token);
        let objs = futures::future::try_join_all(names.iter().map(|n| {
            self.change_held(n, &lease.id, stamp.bound, |obj, now| {
                self.rules.renewed(
                    obj,
                    &lease.id,
                    &hash,
                    deadline,
                    metadata.as_ref(),
                    now,
                    stamp.bound,
                )
            })
        }))
        .await?;
        let (deadline, mode, _, _, witness) =
            self.statement_of(pb::WitnessKind::Renew, &lease.id, &objs, &stamp);
        Ok(Renewal {
            deadline,
            mode,
            witnesses: vec![witness],
        })
    }
}
