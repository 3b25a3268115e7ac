//! Batch (and Session, which shares it): many operations in one call,
//! each on its own, in order, each metered and answered with its own
//! error; one signature over all the grants' witnesses.

use std::time::Duration;

use bagel_proto::{Micros, pb};

use super::Service;
use crate::error::Error;
use crate::refusal::{self, Subject};
use crate::transport::Caller;

impl Service {
    pub(crate) async fn batch(
        &self,
        req: &pb::BatchRequest,
        caller: &Caller,
    ) -> Result<pb::BatchResponse, Error> {
        // Its answer, reserved as its request was read, counts against
        // the caller's share from here (a caller the policy does not know
        // is refused by each operation).
        if let (Some(slot), Ok(Some(identity))) = (&caller.answer, self.identity(caller)) {
            slot.identify(&identity)?;
        }
        let at = self.now();
        self.inner.cover(batch_deadline(&req.ops, at)).await?;
        Ok(self
            .batch_ops(&req.ops, caller, at)?
            .answer(req.ops.len(), req.lean))
    }

    /// Runs a batch: every operation on its own, in order; then one
    /// signature over all the grants' witnesses. Each operation is metered
    /// (and a refused one logged) here, from its domain error, before that
    /// error becomes its `OpError`: `Batch` and `Session` share this, and
    /// take the answers from the [`Ran`] it returns.
    ///
    /// `at` is the instant the batch's cover was computed from
    /// ([`batch_deadline`]): every relative TTL in the batch counts from
    /// it, so that the deadlines covered are the deadlines granted, however
    /// long the operations before take. An acquire is made at `at`, as a
    /// unary one is at the instant its cover was computed from (a holder
    /// whose deadline passed since is still in the way: the conservative
    /// side); a renewal as `renew_op` says.
    pub(crate) fn batch_ops(&self, ops: &[pb::BatchOp], caller: &Caller, at: Micros) -> Result<Ran, Error> {
        use pb::batch_op::Op;
        let max = self.inner.cfg.limits.max_batch_ops;
        if ops.len() > max {
            return Err(Error::invalid(
                "ops",
                format!("{} operations exceed the limit of {max} per batch", ops.len()),
            ));
        }
        // Grants need a healthy clock; releases do not.
        let clock = self.inner.may_grant();
        let outcomes: Vec<Outcome> = ops
            .iter()
            .map(|op| {
                let result = match &op.op {
                    None => Err(Error::invalid("ops.op", "is empty: set one operation")),
                    Some(Op::Acquire(a)) if a.wait_us != 0 => Err(Error::invalid(
                        "wait_us",
                        "must be 0 in a batch (acquires in a batch cannot wait); use Acquire",
                    )),
                    Some(Op::Acquire(a)) => clock
                        .clone()
                        .and_then(|()| self.acquire_spec(a, caller))
                        .and_then(|(mut spec, lifetime)| {
                            spec.deadline = lifetime.deadline_at(at);
                            self.inner.table.acquire(&spec, at)
                        })
                        .map(|g| Outcome::Granted(g, pb::WitnessKind::Acquire)),
                    Some(Op::Renew(r)) => self
                        .renew_op(r, caller, at)
                        .map(|g| Outcome::Granted(g, pb::WitnessKind::Renew)),
                    Some(Op::Upgrade(u)) => self
                        .upgrade_op(u, caller)
                        .map(|g| Outcome::Granted(g, pb::WitnessKind::Upgrade)),
                    Some(Op::Release(r)) => self.release_op(r, caller).map(Outcome::Released),
                };
                self.meter_op(op, result.as_ref().err());
                result.unwrap_or_else(Outcome::Refused)
            })
            .collect();
        let grants: Vec<(&crate::table::Grant, pb::WitnessKind)> = outcomes
            .iter()
            .filter_map(|o| match o {
                Outcome::Granted(g, k) => Some((g, *k)),
                Outcome::Released(_) | Outcome::Refused(_) => None,
            })
            .collect();
        let time = self.inner.time.signed()?;
        let signed = self.inner.witness.sign_batch(&grants, self.now(), &time);
        self.inner.meters.batch_sizes.observe(ops.len() as u64);
        Ok(Ran {
            outcomes: outcomes.into_iter(),
            signed,
            leaf: 0,
        })
    }

    /// Counts one operation of a batch by its outcome (a refused acquire's
    /// conflict by the mode it asked for) and logs it if refused.
    fn meter_op(&self, op: &pb::BatchOp, refused: Option<&Error>) {
        let meters = &self.inner.meters;
        let kind = crate::meter::Op::of(op);
        meters.op(kind, refused.map_or(tonic::Code::Ok, Error::code));
        let Some(e) = refused else { return };
        if let (Some(pb::batch_op::Op::Acquire(a)), Error::Conflict(_)) = (&op.op, e) {
            meters.conflict(a.mode);
        }
        refusal::log(kind.name(), &Subject::of_op(op), e);
    }
}

/// What one operation of a batch came to.
enum Outcome {
    Released(pb::ReleaseResponse),
    Granted(crate::table::Grant, pb::WitnessKind),
    Refused(Error),
}

/// A batch that ran ([`Service::batch_ops`]): its operations' outcomes, in
/// order, and the one signature over its grants' witnesses, answered a
/// request at a time (a session's group runs several requests as one).
pub(crate) struct Ran {
    outcomes: std::vec::IntoIter<Outcome>,
    signed: bagel_proto::SignedGroup,
    /// The leaf of the next grant in `signed`.
    leaf: usize,
}

impl Ran {
    /// The answer to the next `n` operations: in the full form, each grant
    /// with its own witness; in the lean form (`lean`, see
    /// `BatchRequest.lean`), each with its body alone and the answer with
    /// the signature over its run of the group's leaves.
    pub(crate) fn answer(&mut self, n: usize, lean: bool) -> pb::BatchResponse {
        use pb::batch_result::Result as R;
        let first = self.leaf;
        let results = self
            .outcomes
            .by_ref()
            .take(n)
            .map(|o| {
                let result = match o {
                    Outcome::Released(r) => R::Released(r),
                    Outcome::Refused(e) => R::Error(op_error(e)),
                    Outcome::Granted(g, kind) => {
                        let leaf = self.leaf;
                        self.leaf += 1;
                        match (lean, kind) {
                            (true, pb::WitnessKind::Renew) => R::LeanRenewed(pb::LeanRenewal {
                                body: self.signed.bodies()[leaf].clone(),
                            }),
                            (true, _) => R::LeanGrant(pb::LeanGrant {
                                token: g.token.to_string(),
                                body: self.signed.bodies()[leaf].clone(),
                            }),
                            (false, pb::WitnessKind::Renew) => R::Renewed(pb::RenewResponse {
                                deadline_us: g.deadline.as_micros(),
                                witness: Some(self.signed.witness(leaf)),
                            }),
                            (false, _) => R::Grant(crate::witness::grant_pb(&g, self.signed.witness(leaf))),
                        }
                    }
                };
                pb::BatchResult { result: Some(result) }
            })
            .collect();
        let signed = (lean && self.leaf > first).then(|| self.signed.range(first, self.leaf));
        pb::BatchResponse { results, signed }
    }
}

/// The latest deadline a batch's operations ask for (acquires, renewals),
/// for the granted-until mark; a relative TTL counts from `now`.
pub(crate) fn batch_deadline(ops: &[pb::BatchOp], now: Micros) -> Micros {
    use pb::batch_op::Op;
    ops.iter()
        .filter_map(|op| match &op.op {
            Some(Op::Acquire(a)) => Some(asked_deadline(a.deadline_us, a.ttl_us, now)),
            Some(Op::Renew(r)) => Some(asked_deadline(r.deadline_us, r.ttl_us, now)),
            _ => None,
        })
        .max()
        .unwrap_or(Micros::ZERO)
}

/// The deadline a request asks for, for the granted-until mark: its
/// absolute `deadline_us`, or its relative `ttl_us` counted from `now`.
pub(crate) fn asked_deadline(deadline_us: u64, ttl_us: u64, now: Micros) -> Micros {
    if deadline_us == 0 {
        now.saturating_add(Duration::from_micros(ttl_us))
    } else {
        Micros::from_micros(deadline_us)
    }
}

/// An operation's failure inside a batch, as the unary call's status.
fn op_error(e: Error) -> pb::OpError {
    let conflict = match &e {
        Error::Conflict(c) => Some(c.to_pb()),
        _ => None,
    };
    let status = tonic::Status::from(e);
    pb::OpError {
        code: status.code() as i32,
        message: status.message().to_owned(),
        conflict,
        details: bagel_proto::details::without_message(status.details()),
    }
}
