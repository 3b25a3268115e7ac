//! Changing a name a lease holds (renew, upgrade, release): the
//! conditional-write loop that rereads after a lost race and recognises a
//! PUT whose answer was lost, and the witness of the lease's state after.
//!
//! Separate from the acquire: a held name is changed one name at a time,
//! each with its own retries, where an acquire takes all names or none.

use std::time::Duration;

use bagel_lease_core::{Error, Micros, Mode, NameGrant, Result};
use bagel_proto::clock::Clock;
use bagel_proto::pb;

use super::{MAX_RACES, S3LeaseBackend};
use crate::object::{HolderRecord, LeaseObject};
use crate::store::{Condition, ETag, Put};
use crate::time::Stamp;
use crate::witness::{self, Statement, WitnessName};

impl S3LeaseBackend {
    /// Changes `name`'s object with `change` (given the object and the
    /// current time) for a lease that holds it. A lost race rereads and
    /// asks `change` again, which refuses once the lease no longer holds
    /// the name (a takeover is a loss). A PUT whose answer was lost (an
    /// error, or a 412 on the client's own retry of a PUT that had landed)
    /// is recognised on the reread: the object is exactly what was written.
    pub(super) async fn change_held(
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

    /// The witness of a held lease's current state (renewal or upgrade).
    pub(super) fn statement_of(
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
