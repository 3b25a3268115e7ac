//! Every lease rule of the S3 backend, as pure functions of (lease object,
//! request, `now`): no I/O and no clock of their own, so tests drive time
//! exactly (the shape of the server's `table`). The backend reads objects,
//! asks these functions what the new object is, and writes it with a
//! conditional PUT; a lost race is a failed precondition, never a mix.
//!
//! The rules are the server's, with one difference forced by having no
//! single clock: **others** treat a lease as over only once their clock
//! passes its deadline plus the holder's clock error bound (stored in the
//! object) plus their own (and never before the clock margin), while its
//! **holder** treats it as over at the deadline (and its `Lease::is_valid`
//! earlier still, by its safety margin). The holder's clock reads at most
//! its bound behind true time and the taker's at most its bound ahead, so
//! the holder's deadline has passed in true time before anyone may take
//! over, whatever the bounds (docs/leases-without-a-server.md, "The clock margin").

use std::time::Duration;

use bagel_lease_core::chain::{self, Admission, HolderView};
use bagel_lease_core::{Conflict, Error, Metadata, Micros, Mode, NotHeldReason};

use crate::object::{
    EndedRecord, EventRecord, FORMAT_VERSION, HistoryRecord, HolderRecord, LeaseObject, ModeRecord,
    PreviousRecord,
};

/// The knobs the rules need.
#[derive(Clone, Debug)]
pub struct Rules {
    /// Others may break a lease no earlier than its deadline plus this
    /// (longer when the holder's and their own clock bounds add up to
    /// more).
    pub margin: Duration,
    /// History entries kept per name.
    pub history_per_name: usize,
}

/// What acquiring one name at `now` would do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The name can be taken; the grant inherits `previous`.
    Take { previous: PreviousRecord },
    /// A live lease holds it; others may take it over from `free_from`
    /// (by the asker's clock).
    Busy {
        conflict: Box<Conflict>,
        free_from: Micros,
    },
}

/// What a release says, checked by the backend's edge.
#[derive(Clone, Debug, Default)]
pub struct ReleaseSpec {
    pub watermark: Micros,
    /// Encoded signed time for the watermark (base64), if any.
    pub signed_time_b64: Option<String>,
    pub metadata: Option<Metadata>,
    pub unsettled: bool,
    pub settled_through: Micros,
}

fn not_held(reason: NotHeldReason, message: String) -> Error {
    Error::NotHeld { reason, message }
}

impl Rules {
    /// When others (whose clock errs by at most `own_bound`) may treat
    /// `h`'s lease as over: `deadline + max(margin, holder's bound +
    /// own_bound)`. A holder from an older client, with no bound stored,
    /// counts as within half the margin (what the margin alone assumed).
    pub fn free_from(&self, h: &HolderRecord, own_bound: Duration) -> Micros {
        let holder_bound = h.clock_bound_us.map_or(self.margin / 2, Duration::from_micros);
        Micros::from_micros(h.deadline_us).saturating_add(self.margin.max(holder_bound + own_bound))
    }

    /// Whether `name` (its object `obj`, absent if never written) can be
    /// taken in `mode` at `now`, and what the grant inherits.
    ///
    /// A live full holder refuses; a live tentative holder refuses a
    /// tentative request and is broken by a full one (it could not write,
    /// so it leaves no trace in the chain). A full holder past when others
    /// may treat it as over ([`Rules::free_from`]) is *broken*: its
    /// deadline becomes the watermark (it may have written anything below
    /// it) and its bags are unsettled.
    pub fn decide(
        &self,
        name: &str,
        obj: Option<&LeaseObject>,
        mode: Mode,
        now: Micros,
        own_bound: Duration,
    ) -> Decision {
        let Some(obj) = obj else {
            return Decision::Take {
                previous: PreviousRecord::none(),
            };
        };
        let Some(h) = &obj.holder else {
            return Decision::Take {
                previous: obj.previous.clone(),
            };
        };
        // The lease-chain rule every backend shares, with the holder live
        // (to others) until `free_from`: its deadline plus the clock
        // margins no single clock can vouch for here.
        let free_from = self.free_from(h, own_bound);
        let seen = |deadline: Micros| HolderView {
            mode: h.mode.into(),
            deadline,
            expired: false,
        };
        if chain::admit(Some(seen(free_from)), mode, now) == Admission::Refused {
            return Decision::Busy {
                conflict: Box::new(Conflict {
                    name: name.to_owned(),
                    holder_lease_id: h.lease_id.clone(),
                    holder_owner: h.owner.clone(),
                    holder_mode: h.mode.into(),
                    holder_deadline: Micros::from_micros(h.deadline_us),
                    server: None,
                }),
                free_from,
            };
        }
        let handoff = chain::handoff(
            Micros::from_micros(obj.previous.watermark_us),
            Some(seen(Micros::from_micros(h.deadline_us))),
        );
        let previous = if handoff.broken {
            PreviousRecord {
                lease_id: Some(h.lease_id.clone()),
                watermark_us: handoff.watermark.as_micros(),
                ended: EndedRecord::Broken,
                ended_at_us: now.as_micros(),
                unsettled: true,
                granted_at_us: h.granted_at_us,
                watermark_signed_time_b64: None,
            }
        } else {
            obj.previous.clone()
        };
        Decision::Take { previous }
    }

    /// The grant time of a lease on names whose objects are `objs`: `now`,
    /// or just after the latest earlier grant or end of a lease on any of
    /// them (`previous.ended_at`) if a clock ahead of ours stamped it, or
    /// it happened after `now` was read (the backend reads its clock
    /// before the objects). Grant times thus increase along every name's chain and follow the
    /// release they name, as they do on one server: the audit relies on
    /// the first to order grants that left no messages, and on the second
    /// to tell a grant after a release from one while the name was held.
    pub fn grant_time<'a>(objs: impl IntoIterator<Item = Option<&'a LeaseObject>>, now: Micros) -> Micros {
        objs.into_iter()
            .flatten()
            .map(|o| o.last_granted_at_us.max(o.previous.ended_at_us).saturating_add(1))
            .map(Micros::from_micros)
            .fold(now, Micros::max)
    }

    /// The object after granting `holder` the name. The fencing token is
    /// the server's rule, `max(last + 1, grant time in µs)`: strictly
    /// increasing along the object's chain, and still increasing if an
    /// operator deletes the object (a fresh one starts from the clock).
    /// A token that cannot grow (`u64::MAX`, only ever written by hand) is
    /// refused, naming the field: two grants never share a token.
    pub fn granted(
        name: &str,
        obj: Option<&LeaseObject>,
        previous: PreviousRecord,
        holder: HolderRecord,
    ) -> Result<LeaseObject, String> {
        let last = obj.map_or(0, |o| o.fencing_token);
        let next = last.checked_add(1).ok_or_else(|| {
            format!(
                "fencing_token = {last}: the largest token there is; no later grant could have a greater one"
            )
        })?;
        Ok(LeaseObject {
            version: FORMAT_VERSION,
            name: name.to_owned(),
            fencing_token: next.max(holder.granted_at_us),
            last_granted_at_us: holder.granted_at_us,
            holder: Some(holder),
            previous,
            history: obj.map(|o| o.history.clone()).unwrap_or_default(),
            history_truncated: obj.is_some_and(|o| o.history_truncated),
        })
    }

    /// The holder of `obj` if it is lease `lease_id` with a token hashing
    /// to `token_hash` and its deadline is still ahead of `now` (by the
    /// holder's clock: an expired lease can no longer be renewed, upgraded
    /// or released, as on the server). Otherwise why not.
    pub fn held<'a>(
        obj: &'a LeaseObject,
        lease_id: &str,
        token_hash: &str,
        now: Micros,
    ) -> Result<&'a HolderRecord, Error> {
        match &obj.holder {
            Some(h) if h.lease_id == lease_id => {
                if h.token_sha256 != token_hash {
                    return Err(not_held(
                        NotHeldReason::NotYours,
                        format!("token: does not match lease {lease_id}"),
                    ));
                }
                let deadline = Micros::from_micros(h.deadline_us);
                if now >= deadline {
                    return Err(not_held(
                        NotHeldReason::Ended,
                        format!(
                            "lease {lease_id} expired at {deadline}; it can no longer be renewed, upgraded or \
                             released"
                        ),
                    ));
                }
                Ok(h)
            }
            other => Err(Self::gone(obj, other.as_ref(), lease_id)),
        }
    }

    /// Why lease `lease_id` no longer holds `obj`'s name.
    fn gone(obj: &LeaseObject, holder: Option<&HolderRecord>, lease_id: &str) -> Error {
        let name = &obj.name;
        let prev = &obj.previous;
        if prev.lease_id.as_deref() == Some(lease_id) {
            return match prev.ended {
                EndedRecord::Released => not_held(
                    NotHeldReason::Gone,
                    format!(
                        "lease_id: lease {lease_id} was released at {}",
                        Micros::from_micros(prev.ended_at_us)
                    ),
                ),
                _ => not_held(
                    NotHeldReason::Ended,
                    format!(
                        "lease {lease_id} expired at {} and was broken on name {name:?}; it can no longer be \
                         renewed, upgraded or released",
                        Micros::from_micros(prev.watermark_us)
                    ),
                ),
            };
        }
        match holder {
            Some(h) => not_held(
                NotHeldReason::Ended,
                format!(
                    "lease {lease_id} lost name {name:?}: lease {} (owner {:?}) holds it now",
                    h.lease_id, h.owner
                ),
            ),
            None => not_held(
                NotHeldReason::Gone,
                format!(
                    "lease_id: unknown lease {lease_id} on name {name:?} (released, broken, or never granted)"
                ),
            ),
        }
    }

    fn push_history(&self, obj: &mut LeaseObject, entry: HistoryRecord) {
        if self.history_per_name == 0 {
            return;
        }
        obj.history.push(entry);
        let excess = obj.history.len().saturating_sub(self.history_per_name);
        obj.history.drain(..excess);
        obj.history_truncated |= excess > 0;
    }

    /// The object after renewing to `max(current deadline, deadline)`: a
    /// deadline never moves back (the holder may have written up to it).
    /// The holder's clock bound becomes `bound`, just measured.
    #[allow(clippy::too_many_arguments)]
    pub fn renewed(
        &self,
        obj: &LeaseObject,
        lease_id: &str,
        token_hash: &str,
        deadline: Micros,
        metadata: Option<&Metadata>,
        now: Micros,
        bound: Duration,
    ) -> Result<LeaseObject, Error> {
        let h = Self::held(obj, lease_id, token_hash, now)?;
        let owner = h.owner.clone();
        let mut next = obj.clone();
        let holder = next.holder.as_mut().expect("held");
        holder.deadline_us = holder.deadline_us.max(deadline.as_micros());
        holder.clock_bound_us = Some(bagel_proto::duration_micros(bound));
        if let Some(m) = metadata {
            let entry = HistoryRecord {
                lease_id: lease_id.to_owned(),
                owner,
                event: EventRecord::Renewed,
                at_us: now.as_micros(),
                watermark_us: obj.previous.watermark_us,
                metadata: Some(m.into()),
            };
            self.push_history(&mut next, entry);
        }
        Ok(next)
    }

    /// The object after turning the lease full (a full lease stays full),
    /// with the holder's clock bound just measured.
    pub fn upgraded(
        obj: &LeaseObject,
        lease_id: &str,
        token_hash: &str,
        now: Micros,
        bound: Duration,
    ) -> Result<LeaseObject, Error> {
        Self::held(obj, lease_id, token_hash, now)?;
        let mut next = obj.clone();
        let holder = next.holder.as_mut().expect("held");
        holder.mode = ModeRecord::Full;
        holder.clock_bound_us = Some(bagel_proto::duration_micros(bound));
        Ok(next)
    }

    /// The object after releasing, publishing the watermark.
    ///
    /// The watermark must be below the deadline, and 0 for a tentative
    /// lease (it had no right to write; it leaves no trace in the chain).
    /// A stored watermark never decreases. What is unsettled travels on:
    /// the next holder must close bags through the watermark if this holder
    /// had writes of unknown outcome, or inherited unsettled bags and did
    /// not close them.
    pub fn released(
        &self,
        obj: &LeaseObject,
        lease_id: &str,
        token_hash: &str,
        spec: &ReleaseSpec,
        now: Micros,
    ) -> Result<LeaseObject, Error> {
        let h = Self::held(obj, lease_id, token_hash, now)?;
        if spec.watermark.as_micros() >= h.deadline_us {
            return Err(Error::out_of_range(
                "watermark_us",
                format!(
                    "{} must be below the lease deadline {} ({})",
                    spec.watermark.as_micros(),
                    h.deadline_us,
                    Micros::from_micros(h.deadline_us)
                ),
            ));
        }
        if h.mode == ModeRecord::Tentative && spec.watermark != Micros::ZERO {
            return Err(Error::invalid(
                "watermark_us",
                "must be 0 when releasing a tentative lease: it had no right to write",
            ));
        }
        let mut next = obj.clone();
        let holder = next.holder.take().expect("held");
        if holder.mode == ModeRecord::Full {
            let inherited_open = obj.previous.unsettled
                && spec.settled_through.as_micros() < obj.previous.unsettled_until_us();
            next.previous = PreviousRecord {
                lease_id: Some(lease_id.to_owned()),
                watermark_us: obj.previous.watermark_us.max(spec.watermark.as_micros()),
                ended: EndedRecord::Released,
                ended_at_us: now.as_micros(),
                unsettled: spec.unsettled || inherited_open,
                granted_at_us: holder.granted_at_us,
                watermark_signed_time_b64: spec.signed_time_b64.clone(),
            };
        }
        let entry = HistoryRecord {
            lease_id: lease_id.to_owned(),
            owner: holder.owner,
            event: EventRecord::Released,
            at_us: now.as_micros(),
            watermark_us: next.previous.watermark_us,
            metadata: spec.metadata.as_ref().map(Into::into),
        };
        self.push_history(&mut next, entry);
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::token_hash;

    const SEC: u64 = 1_000_000;
    const T0: u64 = 1_800_000_000 * SEC;

    fn t(us: u64) -> Micros {
        Micros::from_micros(us)
    }

    fn rules() -> Rules {
        Rules {
            margin: Duration::from_secs(1),
            history_per_name: 2,
        }
    }

    fn holder(id: &str, mode: ModeRecord, granted: u64, deadline: u64) -> HolderRecord {
        HolderRecord {
            lease_id: id.into(),
            token_sha256: token_hash(&format!("token-{id}")),
            owner: format!("owner-{id}"),
            mode,
            deadline_us: deadline,
            granted_at_us: granted,
            names: vec!["n".into()],
            key_id: "k".into(),
            clock_bound_us: None,
            holder_key: String::new(),
        }
    }

    /// Grants `id` the name at `now` until `deadline`, as the backend does.
    fn grant(
        obj: Option<&LeaseObject>,
        id: &str,
        mode: Mode,
        now: u64,
        deadline: u64,
    ) -> Result<LeaseObject, Conflict> {
        match rules().decide("n", obj, mode, t(now), Duration::ZERO) {
            Decision::Busy { conflict, .. } => Err(*conflict),
            Decision::Take { previous } => {
                let at = Rules::grant_time([obj], t(now)).as_micros();
                Ok(Rules::granted("n", obj, previous, holder(id, mode.into(), at, deadline)).unwrap())
            }
        }
    }

    fn release(obj: &LeaseObject, id: &str, wm: u64, now: u64) -> Result<LeaseObject, Error> {
        let spec = ReleaseSpec {
            watermark: t(wm),
            ..Default::default()
        };
        rules().released(obj, id, &token_hash(&format!("token-{id}")), &spec, t(now))
    }

    #[test]
    fn a_live_lease_is_busy_until_its_deadline_plus_the_margin_then_broken() {
        let a = grant(None, "a", Mode::Full, T0, T0 + 2 * SEC).unwrap();
        assert_eq!(a.previous.ended, EndedRecord::None);
        // Past the deadline by less than the margin: still the holder's,
        // for others (its clock may be behind ours).
        let c = grant(Some(&a), "b", Mode::Full, T0 + 3 * SEC - 1, T0 + 9 * SEC).unwrap_err();
        assert_eq!(
            (c.holder_lease_id.as_str(), c.holder_deadline),
            ("a", t(T0 + 2 * SEC))
        );
        let b = grant(Some(&a), "b", Mode::Full, T0 + 3 * SEC, T0 + 9 * SEC).unwrap();
        let p = &b.previous;
        assert_eq!(
            (
                p.lease_id.as_deref(),
                p.ended,
                p.watermark_us,
                p.ended_at_us,
                p.unsettled
            ),
            (Some("a"), EndedRecord::Broken, T0 + 2 * SEC, T0 + 3 * SEC, true)
        );
        assert_eq!(p.unsettled_until_us(), T0 + 2 * SEC + 1);
        assert_eq!(p.granted_at_us, T0);
        assert!(b.fencing_token > a.fencing_token);
        // The holder itself cannot renew once its own clock passed the
        // deadline, even before anyone took over.
        let err = rules()
            .renewed(
                &a,
                "a",
                &token_hash("token-a"),
                t(T0 + 5 * SEC),
                None,
                t(T0 + 2 * SEC),
                Duration::ZERO,
            )
            .unwrap_err();
        assert!(
            matches!(&err, Error::NotHeld { reason: NotHeldReason::Ended, message } if message.contains("expired")),
            "{err:?}"
        );
    }

    #[test]
    fn release_hands_on_the_watermark_which_never_decreases() {
        let a = grant(None, "a", Mode::Full, T0, T0 + 5 * SEC).unwrap();
        let a = release(&a, "a", T0 + SEC, T0 + 2 * SEC).unwrap();
        assert!(a.holder.is_none());
        let p = &a.previous;
        assert_eq!(
            (p.lease_id.as_deref(), p.ended, p.watermark_us, p.unsettled),
            (Some("a"), EndedRecord::Released, T0 + SEC, false)
        );
        // Free at once for the next holder, before any deadline passes.
        let b = grant(Some(&a), "b", Mode::Full, T0 + 2 * SEC, T0 + 6 * SEC).unwrap();
        assert_eq!(b.previous.watermark_us, T0 + SEC);
        // B wrote nothing: it carries the inherited watermark forward.
        let b = release(&b, "b", 0, T0 + 3 * SEC).unwrap();
        assert_eq!(b.previous.watermark_us, T0 + SEC);
        assert_eq!(b.history.len(), 2, "bounded history keeps the latest");
        assert_eq!(b.history[1].lease_id, "b");
    }

    #[test]
    fn a_watermark_at_the_deadline_or_from_a_tentative_lease_is_refused() {
        let a = grant(None, "a", Mode::Full, T0, T0 + 5 * SEC).unwrap();
        let err = release(&a, "a", T0 + 5 * SEC, T0 + SEC).unwrap_err();
        assert!(
            matches!(&err, Error::OutOfRange { field: Some(field), .. } if field == "watermark_us"),
            "{err:?}"
        );
        let t = grant(None, "t", Mode::Tentative, T0, T0 + 5 * SEC).unwrap();
        let err = release(&t, "t", T0, T0 + SEC).unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Invalid {
                    field: Some(field),
                    ..
                } if field == "watermark_us"
            ),
            "{err:?}"
        );
        // A tentative lease leaves no trace in the chain.
        let after = release(&t, "t", 0, T0 + SEC).unwrap();
        assert_eq!(after.previous, PreviousRecord::none());
    }

    #[test]
    fn a_full_acquire_breaks_a_tentative_holder_which_can_no_longer_upgrade() {
        let t0 = grant(None, "t", Mode::Tentative, T0, T0 + 5 * SEC).unwrap();
        grant(Some(&t0), "u", Mode::Tentative, T0 + 1, T0 + 5 * SEC).unwrap_err();
        let f = grant(Some(&t0), "f", Mode::Full, T0 + 1, T0 + 5 * SEC).unwrap();
        assert_eq!(
            f.previous,
            PreviousRecord::none(),
            "a tentative holder wrote nothing"
        );
        let err = Rules::upgraded(&f, "t", &token_hash("token-t"), t(T0 + 2), Duration::ZERO).unwrap_err();
        assert!(
            matches!(&err, Error::NotHeld { message, .. } if message.contains("lost name")),
            "{err:?}"
        );
        // Untouched, an upgrade succeeds.
        let up = Rules::upgraded(&t0, "t", &token_hash("token-t"), t(T0 + 2), Duration::ZERO).unwrap();
        assert_eq!(up.holder.unwrap().mode, ModeRecord::Full);
    }

    #[test]
    fn renewals_never_shorten_and_need_the_token() {
        let a = grant(None, "a", Mode::Full, T0, T0 + 5 * SEC).unwrap();
        let hash = token_hash("token-a");
        let r = rules()
            .renewed(&a, "a", &hash, t(T0 + 3 * SEC), None, t(T0 + SEC), Duration::ZERO)
            .unwrap();
        assert_eq!(r.holder.as_ref().unwrap().deadline_us, T0 + 5 * SEC);
        let r = rules()
            .renewed(
                &r,
                "a",
                &hash,
                t(T0 + 7 * SEC),
                Some(&Metadata::Wildcard),
                t(T0 + SEC),
                Duration::ZERO,
            )
            .unwrap();
        assert_eq!(r.holder.as_ref().unwrap().deadline_us, T0 + 7 * SEC);
        assert_eq!(r.history.last().unwrap().event, EventRecord::Renewed);
        let err = rules()
            .renewed(
                &r,
                "a",
                &token_hash("guess"),
                t(T0 + 8 * SEC),
                None,
                t(T0 + SEC),
                Duration::ZERO,
            )
            .unwrap_err();
        assert!(matches!(
            err,
            Error::NotHeld {
                reason: NotHeldReason::NotYours,
                ..
            }
        ));
        let err = rules()
            .renewed(
                &r,
                "zz",
                &hash,
                t(T0 + 8 * SEC),
                None,
                t(T0 + SEC),
                Duration::ZERO,
            )
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::NotHeld {
                    reason: NotHeldReason::Ended,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn grant_times_and_fencing_tokens_increase_along_the_chain_whatever_the_clocks() {
        // B's clock is 10 s behind A's: its grant still comes after A's
        // grant and after A's release.
        let a = grant(None, "a", Mode::Full, T0 + 10 * SEC, T0 + 11 * SEC).unwrap();
        let a = release(&a, "a", 0, T0 + 10 * SEC + 1).unwrap();
        let b = grant(Some(&a), "b", Mode::Full, T0, T0 + 2 * SEC).unwrap();
        let hb = b.holder.as_ref().unwrap();
        assert_eq!(hb.granted_at_us, T0 + 10 * SEC + 2);
        assert!(b.fencing_token > a.fencing_token);
        assert_eq!(b.previous.granted_at_us, T0 + 10 * SEC);
        // A tentative holder ends nothing in the chain: a full acquire
        // breaking it comes just after its grant.
        let t = grant(None, "t", Mode::Tentative, T0 + 10 * SEC, T0 + 11 * SEC).unwrap();
        let f = grant(Some(&t), "f", Mode::Full, T0, T0 + 2 * SEC).unwrap();
        assert_eq!(f.holder.as_ref().unwrap().granted_at_us, T0 + 10 * SEC + 1);
    }

    /// The next grant is stamped after the release it follows, as on one
    /// server, even when the releaser's clock ran ahead of the taker's:
    /// its witness names that release (`previous.ended_at`), and a grant
    /// stated before the release it names reads as two holders at once.
    /// Here A's clock is 600 ms ahead of B's: A releases at T0 + 2 s by
    /// its clock, and B, reading the released object at once, reads
    /// T0 + 1.444 s on its own.
    #[test]
    fn a_grant_comes_after_the_release_it_follows_whatever_the_clocks() {
        let a = grant(None, "a", Mode::Full, T0, T0 + 5 * SEC).unwrap();
        let a = release(&a, "a", T0 + SEC, T0 + 2 * SEC).unwrap();
        let b = grant(Some(&a), "b", Mode::Full, T0 + 2 * SEC - 556_000, T0 + 6 * SEC).unwrap();
        assert_eq!(
            (b.previous.ended, b.previous.ended_at_us),
            (EndedRecord::Released, T0 + 2 * SEC)
        );
        assert_eq!(b.holder.as_ref().unwrap().granted_at_us, T0 + 2 * SEC + 1);
        assert!(b.fencing_token > a.fencing_token);
        // A clock already past the release keeps its own reading.
        let b = grant(Some(&a), "b", Mode::Full, T0 + 3 * SEC, T0 + 6 * SEC).unwrap();
        assert_eq!(b.holder.as_ref().unwrap().granted_at_us, T0 + 3 * SEC);
    }

    #[test]
    fn unsettled_bags_travel_down_the_chain_until_someone_closes_them() {
        let a = grant(None, "a", Mode::Full, T0, T0 + SEC).unwrap();
        let b = grant(Some(&a), "b", Mode::Full, T0 + 3 * SEC, T0 + 5 * SEC).unwrap();
        assert_eq!(b.previous.unsettled_until_us(), T0 + SEC + 1);
        // B releases without closing: C still must close through A's deadline.
        let b2 = release(&b, "b", 0, T0 + 4 * SEC).unwrap();
        assert!(b2.previous.unsettled);
        assert_eq!(b2.previous.unsettled_until_us(), T0 + SEC + 1);
        // B closed them: nothing unsettled for the next holder.
        let spec = ReleaseSpec {
            settled_through: t(T0 + SEC + 1),
            ..Default::default()
        };
        let b3 = rules()
            .released(&b, "b", &token_hash("token-b"), &spec, t(T0 + 4 * SEC))
            .unwrap();
        assert!(!b3.previous.unsettled);
    }

    /// Issue 23.6: the takeover waits for both clocks' bounds. A holder
    /// whose clock errs by up to 6 s and a taker whose clock errs by up
    /// to 5 s: with a 1 s margin the old rule let the taker in 1 s after
    /// the deadline, while the holder's clock (6 s behind) still showed
    /// 5 s of lease left. Now the taker waits deadline + 6 s + 5 s.
    #[test]
    fn a_takeover_waits_for_the_holders_bound_plus_its_own() {
        let r = rules();
        let mut a = grant(None, "a", Mode::Full, T0, T0 + 2 * SEC).unwrap();
        a.holder.as_mut().unwrap().clock_bound_us = Some(6 * SEC);
        let own = Duration::from_secs(5);
        let deadline = T0 + 2 * SEC;
        let free = deadline + 11 * SEC;
        for (now, busy) in [(deadline + SEC, true), (free - 1, true), (free, false)] {
            match r.decide("n", Some(&a), Mode::Full, t(now), own) {
                Decision::Busy { free_from, .. } => {
                    assert!(busy, "busy at {now}");
                    assert_eq!(free_from, t(free));
                }
                Decision::Take { previous } => {
                    assert!(!busy, "taken at {now}");
                    assert_eq!(previous.ended, EndedRecord::Broken);
                }
            }
        }
        // The margin stays the least wait when the bounds are small; a
        // holder from an older client (no bound) counts as half of it.
        a.holder.as_mut().unwrap().clock_bound_us = Some(100_000);
        let h = a.holder.as_ref().unwrap();
        assert_eq!(r.free_from(h, Duration::from_millis(100)), t(deadline + SEC));
        a.holder.as_mut().unwrap().clock_bound_us = None;
        let h = a.holder.as_ref().unwrap();
        assert_eq!(
            r.free_from(h, Duration::from_millis(800)),
            t(deadline + 1_300_000)
        );
    }

    #[test]
    fn renewals_and_upgrades_store_the_bound_just_measured() {
        let a = grant(None, "a", Mode::Tentative, T0, T0 + 5 * SEC).unwrap();
        let hash = token_hash("token-a");
        let up = Rules::upgraded(&a, "a", &hash, t(T0 + 1), Duration::from_millis(700)).unwrap();
        assert_eq!(up.holder.as_ref().unwrap().clock_bound_us, Some(700_000));
        let r = rules()
            .renewed(
                &up,
                "a",
                &hash,
                t(T0 + 6 * SEC),
                None,
                t(T0 + SEC),
                Duration::from_secs(3),
            )
            .unwrap();
        assert_eq!(r.holder.as_ref().unwrap().clock_bound_us, Some(3_000_000));
    }

    /// Issue 24.6: a token of u64::MAX - 1 gives one more grant (u64::MAX)
    /// and then refuses, naming the field, instead of handing u64::MAX to
    /// every later grant.
    #[test]
    fn a_fencing_token_that_cannot_grow_is_refused_not_saturated() {
        let a = grant(None, "a", Mode::Full, T0, T0 + SEC).unwrap();
        let mut a = release(&a, "a", 0, T0 + 1).unwrap();
        a.fencing_token = u64::MAX - 1;
        let b = grant(Some(&a), "b", Mode::Full, T0 + 2, T0 + SEC).unwrap();
        assert_eq!(b.fencing_token, u64::MAX);
        let b = release(&b, "b", 0, T0 + 3).unwrap();
        let h = holder("c", ModeRecord::Full, T0 + 4, T0 + SEC);
        let err = Rules::granted("n", Some(&b), b.previous.clone(), h).unwrap_err();
        assert!(err.starts_with("fencing_token = 18446744073709551615"), "{err}");
    }
}
