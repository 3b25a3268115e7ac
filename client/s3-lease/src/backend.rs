//! [`S3LeaseBackend`]: the lease backend over S3 conditional writes.
//!
//! Every operation is reads (GET), then a decision by the pure rules
//! (`rules`), then conditional PUTs (`If-None-Match: *` to create a name's
//! object, `If-Match: <etag>` to change it). A PUT refused for its
//! condition means someone changed the object since it was read; the
//! operation looks again rather than guessing.
//!
//! Requests per operation on `n` names, on the happy path: acquire `n`
//! GETs and `n` PUTs; renew, upgrade and release `n` PUTs each (the ETag
//! and object of the last read or write are cached per name, so no GET).
//! A cache miss (a renewal from another process holding only the lease
//! file) or a lost race adds a GET per name.
//!
//! # Parts
//!
//! * this file: the backend itself, its clock check and the refusals every
//!   operation shares (an implausible object, a lease given without names);
//! * `cache`: the per-name ETag cache and the reads behind it;
//! * `acquire`: one all-or-nothing acquire attempt (read all, decide all,
//!   write in name order, put back on failure) and the backoff between
//!   attempts on a busy name;
//! * `held`: the conditional-write loop that changes a held name (renew,
//!   upgrade, release) and the witness of the result;
//! * `operators`: `describe` and `history`, reads for operators that
//!   change nothing;
//! * `lease_backend`: the [`LeaseBackend`] impl, which validates each
//!   request and strings the parts above together (the acquire's polling
//!   wait included).

mod acquire;
mod cache;
mod held;
mod lease_backend;
mod operators;

use std::time::Duration;

#[cfg(doc)]
use bagel_lease_core::LeaseBackend;
use bagel_lease_core::{Error, LeaseRef, Micros, Result};
use bagel_proto::{KeyRing, Signer};
use dashmap::DashMap;

use crate::config::S3LeaseConfig;
use crate::object::LeaseObject;
use crate::plausible;
use crate::rules::Rules;
use crate::store::LeaseStore;
use crate::time::{LeaseTime, Stamp};
use crate::validate;
use cache::Cached;

/// Changing a held name gives up after this many lost races in a row (each
/// means another writer changed the object between our read and write; a
/// holder racing only itself settles in two).
const MAX_RACES: usize = 8;

/// Leases on an S3 prefix, behind the same [`bagel_lease_core::Lease`] handle
/// as a bagel server's. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct S3LeaseBackend {
    store: LeaseStore,
    signer: Signer,
    time: LeaseTime,
    cfg: S3LeaseConfig,
    rules: Rules,
    /// Per name, the version last read or written. A DashMap keyed by name:
    /// many leases of one process renew concurrently, each touching only
    /// its names. Entries are cloned out; no guard lives across an
    /// `.await`.
    cache: DashMap<String, Cached>,
}

impl S3LeaseBackend {
    /// Opens the backend on `store`: probes that the store honours
    /// conditional writes (refusing it otherwise) and publishes `signer`'s
    /// public key under the prefix.
    pub async fn open(
        store: LeaseStore,
        signer: Signer,
        time: LeaseTime,
        cfg: S3LeaseConfig,
    ) -> Result<Self> {
        store.probe().await?;
        store.publish_key(&signer).await?;
        if time.is_unsafe() {
            tracing::warn!(
                store = store.location(),
                "UNSAFE: S3 leases on an unchecked local clock; two holders at once become possible when \
                 clocks disagree by more than the clock margin"
            );
        }
        Ok(S3LeaseBackend {
            rules: Rules {
                margin: cfg.clock_margin,
                history_per_name: cfg.history_per_name,
            },
            store,
            signer,
            time,
            cfg,
            cache: DashMap::new(),
        })
    }

    /// The id of the key that signs this backend's witnesses.
    pub fn key_id(&self) -> &str {
        self.signer.key_id()
    }

    /// The limits and margins this backend was opened with.
    pub fn config(&self) -> &S3LeaseConfig {
        &self.cfg
    }

    /// The prefix the lease objects and published keys live under.
    pub fn store(&self) -> &LeaseStore {
        &self.store
    }

    /// Every public key published in the store (this client's included).
    pub async fn keys(&self) -> Result<KeyRing> {
        self.store.keys().await
    }

    /// Checks the clock, and refuses to act on it when its error bound is
    /// more than half the clock margin: every client of the store assumes
    /// the margin covers a holder's bound plus a taker's, and the stored
    /// bounds cover only holders and takers that keep to it.
    async fn stamp(&self) -> Result<Stamp> {
        let stamp = self
            .time
            .stamp(&self.signer, self.store.location(), self.cfg.clock_margin / 2)
            .await?;
        let margin = self.cfg.clock_margin;
        if stamp.bound > margin / 2 {
            return Err(Error::ClockOff {
                detail: format!(
                    "this clock's error bound {:.3} s (|offset| + radius + RTT/2 from the time authority) makes \
                     the clock margin {:.3} s unsafe: the margin must cover a holder's bound plus a taker's, so \
                     each may be at most half of it; raise --clock-margin (S3LeaseConfig::clock_margin) to at \
                     least {:.3} s on every client of {}, or use a time authority with a smaller radius",
                    stamp.bound.as_secs_f64(),
                    margin.as_secs_f64(),
                    (stamp.bound * 2).as_secs_f64(),
                    self.store.location()
                ),
            });
        }
        Ok(stamp)
    }

    /// Refuses an object no honest client could have written (see
    /// `plausible`), naming it and the field; judged at `now` on a clock
    /// whose error bound is `bound`.
    fn plausible(&self, obj: &LeaseObject, now: Micros, bound: Duration) -> Result<()> {
        let limits = plausible::Limits {
            now,
            max_ttl: self.cfg.limits.max_ttl,
            slack: self.cfg.clock_margin + bound,
        };
        plausible::check(obj, &limits).map_err(|why| self.corrupt(&obj.name, &why))
    }

    /// The error for a lease object that breaks the store's rules.
    fn corrupt(&self, name: &str, why: &str) -> Error {
        Error::Store {
            location: self.store.location().to_owned(),
            message: format!(
                "lease object {}: {why}; it breaks the lease rules (corrupt, or written by something other                  than a bagel client): nothing is granted on it until an operator repairs or deletes it",
                self.store.object_url(name)
            ),
            retryable: false,
            source: None,
        }
    }

    /// A lease's names, checked and sorted; the S3 store finds leases by
    /// name.
    fn names_of(&self, lease: &LeaseRef) -> Result<Vec<String>> {
        if lease.names.is_empty() {
            return Err(Error::invalid(
                "names",
                format!(
                    "the S3 lease store finds lease {} by its names; give them (the lease file has them)",
                    lease.id
                ),
            ));
        }
        validate::names(&lease.names, &self.cfg)
    }
}
