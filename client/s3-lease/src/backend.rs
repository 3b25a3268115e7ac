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
//! Longer than most files: acquire, renew, upgrade and release each read,
//! decide and write with the same cache and race handling, and reading
//! them side by side is how one checks they agree.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bagel_lease_core::backend::{Call, NameRoute, Offer};
use bagel_lease_core::{
    AcquireSpec, BackendInfo, Conflict, Error, Grant, History, Holder, LeaseBackend, LeaseRef, Metadata,
    Micros, Mode, NameGrant, NameState, NotHeldReason, ReleaseOptions, Renewal, Result, StoreInfo,
};
use bagel_proto::clock::Clock;
use bagel_proto::{KeyRing, Signer, pb};
use dashmap::DashMap;
use rand::{Rng as _, RngCore as _};

use crate::config::S3LeaseConfig;
use crate::object::{FORMAT_VERSION, HolderRecord, LeaseObject, PreviousRecord, signed_time_b64, token_hash};
use crate::plausible;
use crate::rules::{Decision, ReleaseSpec, Rules};
use crate::store::{Condition, ETag, LeaseStore, Put};
use crate::time::{LeaseTime, Stamp};
use crate::validate;
use crate::witness::{self, Statement, WitnessName};

/// Changing a held name gives up after this many lost races in a row (each
/// means another writer changed the object between our read and write; a
/// holder racing only itself settles in two).
const MAX_RACES: usize = 8;

/// The last version of a name's object this process read or wrote, for the
/// lease it names.
#[derive(Clone, Debug)]
struct Cached {
    lease_id: String,
    etag: ETag,
    object: LeaseObject,
}

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

    pub fn config(&self) -> &S3LeaseConfig {
        &self.cfg
    }

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

    fn remember(&self, lease_id: &str, etag: Option<ETag>, object: LeaseObject) {
        match etag {
            Some(etag) => {
                self.cache.insert(
                    object.name.clone(),
                    Cached {
                        lease_id: lease_id.to_owned(),
                        etag,
                        object,
                    },
                );
            }
            None => {
                self.cache.remove(&object.name);
            }
        }
    }

    fn forget(&self, name: &str, lease_id: &str) {
        self.cache.remove_if(name, |_, c| c.lease_id == lease_id);
    }

    /// A name's object for an operation of `lease_id`: the cached version
    /// unless `fresh`, else read. Says whether it came from the cache.
    async fn current(&self, name: &str, lease_id: &str, fresh: bool) -> Result<(LeaseObject, ETag, bool)> {
        if !fresh
            && let Some(c) = self
                .cache
                .get(name)
                .filter(|c| c.lease_id == lease_id)
                .map(|c| c.clone())
        {
            return Ok((c.object, c.etag, true));
        }
        match self.store.get(name).await? {
            Some((obj, Some(etag))) => Ok((obj, etag, false)),
            Some((_, None)) => Err(self.no_etag(name)),
            None => Err(Error::not_held(
                NotHeldReason::Gone,
                format!("lease_id: unknown lease {lease_id}: name {name:?} has no lease object"),
            )),
        }
    }

    fn no_etag(&self, name: &str) -> Error {
        Error::Store {
            location: self.store.location().to_owned(),
            message: format!(
                "the store gave no ETag for the lease object of {name:?}: conditional writes impossible"
            ),
            retryable: false,
            source: None,
        }
    }

    /// Changes `name`'s object with `change` (given the object and the
    /// current time) for a lease that holds it. A lost race rereads and
    /// asks `change` again, which refuses once the lease no longer holds
    /// the name (a takeover is a loss). A PUT whose answer was lost (an
    /// error, or a 412 on the client's own retry of a PUT that had landed)
    /// is recognised on the reread: the object is exactly what was written.
    async fn change_held(
        &self,
        name: &str,
        lease_id: &str,
        bound: Duration,
        change: impl Fn(&LeaseObject, Micros) -> Result<LeaseObject>,
    ) -> Result<LeaseObject> {
        let clock = self.time.clock();
        let mut fresh = false;
        // The version read after a lost race, used as the next current one
        // (no second GET).
        let mut reread: Option<(LeaseObject, ETag)> = None;
        for _ in 0..MAX_RACES {
            let (obj, etag, cached) = match reread.take() {
                Some((obj, etag)) => (obj, etag, false),
                None => self.current(name, lease_id, fresh).await?,
            };
            if !cached {
                self.plausible(&obj, clock.now(), bound)?;
            }
            let next = match change(&obj, clock.now()) {
                Ok(next) => next,
                // A cached version may be stale (another process renewed
                // or released with the lease file): judge the fresh one.
                Err(_) if cached => {
                    fresh = true;
                    continue;
                }
                Err(e) => {
                    self.forget(name, lease_id);
                    return Err(e);
                }
            };
            let put = self.store.put(&next, Condition::Match(etag)).await;
            if let Ok(Put::Done(etag)) = put {
                self.remember(lease_id, etag, next.clone());
                return Ok(next);
            }
            self.forget(name, lease_id);
            // A failed precondition or an error: the answer may have been
            // lost after the PUT landed; the object then is exactly `next`.
            match self.store.get(name).await {
                Ok(Some((now_there, Some(etag)))) if now_there == next => {
                    tracing::debug!(name, "a PUT whose answer was lost had landed");
                    self.remember(lease_id, Some(etag), next.clone());
                    return Ok(next);
                }
                Ok(Some((now_there, Some(etag)))) if put.is_ok() => reread = Some((now_there, etag)),
                _ => {
                    put?;
                    fresh = true;
                }
            }
        }
        Err(Error::Store {
            location: self.store.location().to_owned(),
            message: format!("the lease object of {name:?} changed under each of {MAX_RACES} attempts"),
            retryable: true,
            source: None,
        })
    }

    /// After a PUT of `next` whose answer was an error or a failed
    /// precondition: the object's ETag if the store holds what `mine`
    /// recognises as this client's write (the PUT landed and only its
    /// answer was lost). `None` if it did not land or cannot be read.
    async fn landed(&self, next: &LeaseObject, mine: impl Fn(&LeaseObject) -> bool) -> Option<ETag> {
        match self.store.get(&next.name).await {
            Ok(Some((obj, Some(etag)))) if mine(&obj) => {
                tracing::debug!(name = %next.name, "a PUT whose answer was lost had landed");
                Some(etag)
            }
            _ => None,
        }
    }

    fn busy(&self, c: Conflict, free_from: Micros) -> Error {
        Error::Busy {
            message: format!(
                "name {:?} is held by lease {} (owner {:?}, {}) until {} ({} us); others may take it over from \
                 {free_from} (deadline + the larger of the clock margin {:?} and the holder's clock bound plus \
                 this client's)",
                c.name,
                c.holder_lease_id,
                c.holder_owner,
                c.holder_mode.as_str(),
                c.holder_deadline,
                c.holder_deadline.as_micros(),
                self.cfg.clock_margin
            ),
            conflict: Some(Box::new(c)),
        }
    }

    /// One try at taking every name of `spec`: read all, decide all, then
    /// write in name order; on a failed write, put back what was taken.
    async fn attempt(&self, names: &[String], spec: &AcquireSpec, stamp: &Stamp) -> Result<Grant, Attempt> {
        let reads = futures::future::try_join_all(names.iter().map(|n| self.store.get(n)))
            .await
            .map_err(Attempt::Failed)?;
        let now = stamp.now;
        let mut inherited = Vec::with_capacity(names.len());
        for (name, read) in names.iter().zip(&reads) {
            if let Some((obj, _)) = read {
                self.plausible(obj, now, stamp.bound).map_err(Attempt::Failed)?;
            }
            match self
                .rules
                .decide(name, read.as_ref().map(|(o, _)| o), spec.mode, now, stamp.bound)
            {
                Decision::Take { previous } => inherited.push(previous),
                Decision::Busy { conflict, free_from } => {
                    return Err(Attempt::Busy(self.busy(*conflict, free_from), free_from));
                }
            }
        }
        // Every message of the new holder must be above every inherited
        // watermark and below the deadline: a watermark at or past the
        // deadline asked for would grant a lease nothing can be written
        // under (an honest one is at most the release's signed time).
        for (name, previous) in names.iter().zip(&inherited) {
            if previous.watermark_us >= spec.deadline.as_micros() {
                return Err(Attempt::Failed(self.corrupt(
                    name,
                    &format!(
                        "previous.watermark_us = {} ({}): not below this grant's deadline {} ({}), so nothing \
                         could be written under it",
                        previous.watermark_us,
                        Micros::from_micros(previous.watermark_us),
                        spec.deadline.as_micros(),
                        spec.deadline
                    ),
                )));
            }
        }
        let granted_at = Rules::grant_time(reads.iter().map(|r| r.as_ref().map(|(o, _)| o)), now);
        if spec.deadline <= granted_at.saturating_add(self.cfg.limits.min_ttl) {
            return Err(Attempt::Failed(Error::out_of_range(
                "deadline_us",
                format!(
                    "{} is not after the grant time {} plus min_ttl {:?}: an earlier grant of one \
                     of the names was made by a clock ahead of this one",
                    spec.deadline.as_micros(),
                    granted_at.as_micros(),
                    self.cfg.limits.min_ttl
                ),
            )));
        }
        let lease_id = format!(
            "{:016x}{:016x}",
            granted_at.as_micros(),
            rand::thread_rng().next_u64()
        );
        let mut secret = [0u8; 16];
        rand::thread_rng().fill_bytes(&mut secret);
        let token = bagel_proto::hex::encode(&secret);
        let holder = HolderRecord {
            lease_id: lease_id.clone(),
            token_sha256: token_hash(&token),
            owner: spec.owner.clone(),
            mode: spec.mode.into(),
            deadline_us: spec.deadline.as_micros(),
            granted_at_us: granted_at.as_micros(),
            names: names.to_vec(),
            key_id: self.signer.key_id().to_owned(),
            clock_bound_us: Some(bagel_proto::duration_micros(stamp.bound)),
            holder_key: spec
                .holder_key
                .map_or_else(String::new, |k| bagel_proto::hex::encode(&k)),
        };
        let mut written: Vec<(LeaseObject, Option<ETag>)> = Vec::with_capacity(names.len());
        for ((name, read), previous) in names.iter().zip(&reads).zip(inherited) {
            let before = read.as_ref().map(|(o, _)| o);
            let next = match Rules::granted(name, before, previous, holder.clone()) {
                Ok(next) => next,
                Err(why) => {
                    self.undo(&written, &reads, &lease_id).await;
                    return Err(Attempt::Failed(self.corrupt(name, &why)));
                }
            };
            let cond = match read {
                None => Condition::Create,
                Some((_, Some(etag))) => Condition::Match(etag.clone()),
                Some((_, None)) => {
                    self.undo(&written, &reads, &lease_id).await;
                    return Err(Attempt::Failed(self.no_etag(name)));
                }
            };
            let put = self.store.put(&next, cond).await;
            if let Ok(Put::Done(etag)) = put {
                written.push((next, etag));
                continue;
            }
            // A lost answer (an error, or a 412 on a retry of a PUT that
            // had landed) looks like a lost race; the lease id, random and
            // this attempt's own, says whether the write is ours.
            let ours = |o: &LeaseObject| o.holder.as_ref().is_some_and(|h| h.lease_id == lease_id);
            if let Some(etag) = self.landed(&next, ours).await {
                written.push((next, Some(etag)));
                continue;
            }
            self.undo(&written, &reads, &lease_id).await;
            return Err(match put {
                Err(e) => Attempt::Failed(e),
                _ => Attempt::Raced,
            });
        }
        let mut grants = Vec::with_capacity(names.len());
        let mut wnames = Vec::with_capacity(names.len());
        let mut min_timestamp = Micros::ZERO;
        for (obj, etag) in written {
            min_timestamp = min_timestamp.max(Micros::from_micros(obj.previous.watermark_us));
            grants.push(NameGrant {
                name: obj.name.clone(),
                fencing_token: obj.fencing_token,
                previous: obj.previous.to_domain(),
            });
            wnames.push(WitnessName {
                name: obj.name.clone(),
                fencing_token: obj.fencing_token,
                previous: obj.previous.to_pb(),
            });
            self.remember(&lease_id, etag, obj);
        }
        let witness = witness::sign(
            &self.signer,
            self.store.location(),
            stamp,
            Statement {
                kind: pb::WitnessKind::Acquire,
                lease_id: &lease_id,
                owner: &spec.owner,
                mode: spec.mode,
                deadline: spec.deadline,
                min_timestamp,
                names: wnames,
                issued_at: granted_at,
                holder_key: spec.holder_key.map_or_else(Vec::new, |k| k.to_vec()),
            },
        );
        Ok(Grant {
            lease_id,
            token,
            deadline: spec.deadline,
            min_timestamp,
            names: grants,
            mode: spec.mode,
            witnesses: vec![witness],
            servers: Vec::new(),
        })
    }

    /// Puts back the names an acquire took before one failed: an object
    /// that existed gets its old content back (so a tentative holder broken
    /// on the way holds again, all or nothing as on the server); one that
    /// did not becomes a free object keeping the spent fencing token.
    /// Best effort: a name that cannot be put back stays held by a lease
    /// nobody was told of, and is broken after its deadline.
    async fn undo(
        &self,
        written: &[(LeaseObject, Option<ETag>)],
        reads: &[Option<(LeaseObject, Option<ETag>)>],
        lease_id: &str,
    ) {
        for (obj, etag) in written {
            self.forget(&obj.name, lease_id);
            let Some(etag) = etag else {
                tracing::warn!(name = %obj.name, lease_id, "cannot undo a partial acquire: no ETag");
                continue;
            };
            let before = reads
                .iter()
                .flatten()
                .find(|(o, _)| o.name == obj.name)
                .map(|(o, _)| o.clone());
            let restored = before.unwrap_or_else(|| LeaseObject {
                version: FORMAT_VERSION,
                name: obj.name.clone(),
                fencing_token: obj.fencing_token,
                last_granted_at_us: obj.last_granted_at_us,
                holder: None,
                previous: PreviousRecord::none(),
                history: Vec::new(),
                history_truncated: false,
            });
            match self.store.put(&restored, Condition::Match(etag.clone())).await {
                Ok(Put::Done(_)) => {}
                other => tracing::warn!(
                    name = %obj.name, lease_id, outcome = ?other,
                    "could not undo a partial acquire; the name stays held until the deadline"
                ),
            }
        }
    }

    /// What the next holder of each name would find now, for operators.
    pub async fn describe(&self, names: &[String]) -> Result<Vec<NameState>> {
        validate::names(names, &self.cfg)?;
        let reads = futures::future::try_join_all(names.iter().map(|n| self.store.get(n))).await?;
        let now = self.time.clock().now();
        let bound = self
            .time
            .bound_hint(self.cfg.clock_margin / 2)
            .unwrap_or(self.cfg.clock_margin / 2);
        for (obj, _) in reads.iter().flatten() {
            self.plausible(obj, now, bound)?;
        }
        Ok(names
            .iter()
            .zip(reads)
            .map(|(name, read)| match read {
                None => NameState {
                    name: name.clone(),
                    holder: None,
                    previous: PreviousRecord::none().to_domain(),
                    fencing_token: 0,
                    known: false,
                },
                Some((obj, _)) => {
                    let live = obj
                        .holder
                        .as_ref()
                        .filter(|h| now < self.rules.free_from(h, bound));
                    let previous = match self.rules.decide(name, Some(&obj), Mode::Full, now, bound) {
                        Decision::Take { previous } => previous,
                        Decision::Busy { .. } => obj.previous.clone(),
                    };
                    NameState {
                        name: name.clone(),
                        holder: live.map(|h| Holder {
                            lease_id: h.lease_id.clone(),
                            owner: h.owner.clone(),
                            mode: h.mode.into(),
                            deadline: Micros::from_micros(h.deadline_us),
                            fencing_token: obj.fencing_token,
                            granted_at: Micros::from_micros(h.granted_at_us),
                        }),
                        previous: previous.to_domain(),
                        fencing_token: obj.fencing_token,
                        known: true,
                    }
                }
            })
            .collect())
    }

    /// A name's recent renewals (with metadata) and releases.
    pub async fn history(&self, name: &str) -> Result<History> {
        validate::names(&[name.to_owned()], &self.cfg)?;
        Ok(match self.store.get(name).await? {
            None => History::default(),
            Some((obj, _)) => History {
                entries: obj.history.iter().map(|h| h.to_domain()).collect(),
                truncated: obj.history_truncated,
            },
        })
    }

    /// The witness of a held lease's current state (renewal or upgrade).
    fn statement_of(
        &self,
        kind: pb::WitnessKind,
        lease_id: &str,
        objs: &[LeaseObject],
        stamp: &Stamp,
    ) -> (Micros, Mode, Micros, Vec<NameGrant>, bagel_lease_core::Witness) {
        let holders: Vec<&HolderRecord> = objs.iter().map(|o| o.holder.as_ref().expect("held")).collect();
        // Every name of a lease carries one deadline and mode, except after
        // a renewal that failed half-way: then the lease is what all its
        // names give (the earliest deadline, tentative if any is).
        let deadline = holders
            .iter()
            .map(|h| Micros::from_micros(h.deadline_us))
            .min()
            .expect("a lease has names");
        let mode = if holders.iter().all(|h| Mode::from(h.mode) == Mode::Full) {
            Mode::Full
        } else {
            Mode::Tentative
        };
        let min_timestamp = objs
            .iter()
            .map(|o| Micros::from_micros(o.previous.watermark_us))
            .max()
            .unwrap_or(Micros::ZERO);
        let grants = objs
            .iter()
            .map(|o| NameGrant {
                name: o.name.clone(),
                fencing_token: o.fencing_token,
                previous: o.previous.to_domain(),
            })
            .collect();
        let witness = witness::sign(
            &self.signer,
            self.store.location(),
            stamp,
            Statement {
                kind,
                lease_id,
                owner: &holders[0].owner,
                mode,
                deadline,
                min_timestamp,
                names: objs
                    .iter()
                    .map(|o| WitnessName {
                        name: o.name.clone(),
                        fencing_token: o.fencing_token,
                        previous: o.previous.to_pb(),
                    })
                    .collect(),
                issued_at: stamp.now,
                // As the grant stated it: a renewer cannot swap in a key.
                holder_key: bagel_proto::hex::decode_array::<32>(&holders[0].holder_key)
                    .map_or_else(|_| Vec::new(), |k| k.to_vec()),
            },
        );
        (deadline, mode, min_timestamp, grants, witness)
    }
}

/// How one acquire attempt failed.
#[derive(Debug)]
enum Attempt {
    /// A live lease holds a name (the error says which) until the instant
    /// given, by this client's clock.
    Busy(Error, Micros),
    /// A name changed between reading and writing: look again.
    Raced,
    Failed(Error),
}

/// Exponential backoff with jitter for polling a busy name: 25 ms
/// doubling to 1 s, each pause drawn from [half, all] of the step, so
/// waiters that started together do not keep colliding.
#[derive(Debug)]
struct Backoff {
    step: Duration,
}

impl Backoff {
    fn new() -> Self {
        Backoff {
            step: Duration::from_millis(25),
        }
    }

    fn pause(&mut self) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(Duration::from_secs(1));
        let half = step / 2;
        half + half.mul_f64(rand::thread_rng().r#gen::<f64>())
    }
}

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
        validate::metadata(metadata.as_ref(), &self.cfg)?;
        let names = self.names_of(lease)?;
        let stamp = self.stamp().await?;
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
