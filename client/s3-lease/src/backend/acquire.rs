//! One try at an all-or-nothing acquire: read every name, decide by the
//! rules, write in name order and put back what was taken when a write
//! fails; and the backoff between tries on a busy name.
//!
//! Separate from the polling loop in `lease_backend`, which only decides
//! whether and how long to wait between tries: everything one try reads
//! and writes is here.

use std::time::Duration;

use bagel_lease_core::{AcquireSpec, Conflict, Error, Grant, Micros, NameGrant, Result};
use bagel_proto::pb;
use rand::{Rng as _, RngCore as _};

use super::S3LeaseBackend;
use crate::object::{FORMAT_VERSION, HolderRecord, LeaseObject, PreviousRecord, token_hash};
use crate::rules::{Decision, Rules};
use crate::store::{Condition, ETag, Put};
use crate::time::Stamp;
use crate::witness::{self, Statement, WitnessName};

impl S3LeaseBackend {
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
    pub(super) async fn attempt(
        &self,
        names: &[String],
        spec: &AcquireSpec,
        stamp: &Stamp,
    ) -> Result<Grant, Attempt> {
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
                    "{} is not after the grant time {} plus min_ttl {:?}: an earlier grant or release on one \
                     of the names was stamped by a clock ahead of this one",
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
}

/// How one acquire attempt failed.
#[derive(Debug)]
pub(super) enum Attempt {
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
pub(super) struct Backoff {
    step: Duration,
}

impl Backoff {
    pub(super) fn new() -> Self {
        Backoff {
            step: Duration::from_millis(25),
        }
    }

    pub(super) fn pause(&mut self) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(Duration::from_secs(1));
        let half = step / 2;
        half + half.mul_f64(rand::thread_rng().r#gen::<f64>())
    }
}
