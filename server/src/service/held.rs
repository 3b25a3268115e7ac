//! What a holder does with its lease: upgrade, renew and release, each
//! checked against the caller's certificate and the access policy; and
//! the release's watermark checked against its signed time.

use std::sync::Arc;

use bagel_proto::{Micros, TimeProofKind, pb, verify_signed_time};

use super::Service;
use crate::error::Error;
use crate::table::ReleaseSpec;
use crate::transport::Caller;
use crate::validate;

impl Service {
    pub(crate) async fn upgrade(
        &self,
        req: &pb::UpgradeRequest,
        caller: &Caller,
    ) -> Result<pb::UpgradeResponse, Error> {
        let grant = self.upgrade_op(req, caller)?;
        Ok(pb::UpgradeResponse {
            grant: Some(self.grant_pb(&grant, pb::WitnessKind::Upgrade).await?),
        })
    }

    pub(crate) async fn renew(
        &self,
        req: &pb::RenewRequest,
        caller: &Caller,
    ) -> Result<pb::RenewResponse, Error> {
        // One reading of the clock: the deadline covered is the deadline
        // granted (see `renew_op`).
        let at = self.now();
        let asked = super::batch::asked_deadline(req.deadline_us, req.ttl_us, at);
        self.inner.cover(asked).await?;
        let grant = self.renew_op(req, caller, at)?;
        let time = self.inner.time.signed()?;
        let witness = self
            .inner
            .witness
            .sign_queued(&grant, pb::WitnessKind::Renew, self.now(), &time)
            .await;
        Ok(pb::RenewResponse {
            deadline_us: grant.deadline.as_micros(),
            witness: Some(witness),
        })
    }

    pub(crate) fn release(
        &self,
        req: &pb::ReleaseRequest,
        caller: &Caller,
    ) -> Result<pb::ReleaseResponse, Error> {
        self.release_op(req, caller)
    }

    pub(super) fn upgrade_op(
        &self,
        req: &pb::UpgradeRequest,
        caller: &Caller,
    ) -> Result<crate::table::Grant, Error> {
        let lease = validate::lease_id(&req.lease_id)?;
        let token = validate::token(&req.token)?;
        self.permit_lease(caller, lease)?;
        self.check_owner(lease, caller)?;
        self.inner.may_grant()?;
        self.inner.table.upgrade(lease, &token, self.now())
    }

    /// Renews a held lease. A relative TTL counts from `at`, the instant
    /// the granted-until mark's cover was computed from, not from a later
    /// reading: counted from a later one, its deadline could pass the mark
    /// just covered and be refused with [`Error::MarkBehind`], a retry the
    /// client should not have to make. The table judges that deadline's
    /// range from `at` too: it is the TTL's range, which
    /// `validate::lifetime` checked on the TTL itself. An absolute
    /// deadline, and whether the lease is still held, are judged at the
    /// table's own later reading.
    pub(super) fn renew_op(
        &self,
        req: &pb::RenewRequest,
        caller: &Caller,
        at: Micros,
    ) -> Result<crate::table::Grant, Error> {
        let lease = validate::lease_id(&req.lease_id)?;
        let token = validate::token(&req.token)?;
        self.permit_lease(caller, lease)?;
        self.check_owner(lease, caller)?;
        let cfg = &self.inner.cfg;
        let lifetime = validate::lifetime(req.deadline_us, req.ttl_us, cfg.min_ttl, cfg.max_ttl)?;
        let metadata = validate::metadata(req.metadata.as_ref(), &cfg.limits)?;
        self.inner.may_grant()?;
        let now = self.now();
        let counted_from = match lifetime {
            validate::Lifetime::For(_) => at,
            validate::Lifetime::Until(_) => now,
        };
        self.inner.table.renew(
            lease,
            &token,
            lifetime.deadline_at(at),
            counted_from,
            metadata,
            now,
        )
    }

    pub(super) fn release_op(
        &self,
        req: &pb::ReleaseRequest,
        caller: &Caller,
    ) -> Result<pb::ReleaseResponse, Error> {
        let lease = validate::lease_id(&req.lease_id)?;
        let token = validate::token(&req.token)?;
        self.permit_lease(caller, lease)?;
        self.check_owner(lease, caller)?;
        let metadata = validate::metadata(req.metadata.as_ref(), &self.inner.cfg.limits)?;
        self.check_watermark_time(req)?;
        let spec = ReleaseSpec {
            watermark: Micros::from_micros(req.watermark_us),
            signed_time: req.signed_time.clone().map(Arc::new),
            metadata,
            unsettled: req.unsettled,
            settled_through: Micros::from_micros(req.settled_through_us),
        };
        let released = self.inner.table.release(lease, &token, spec, self.now())?;
        Ok(pb::ReleaseResponse {
            watermark_us: released.watermark.as_micros(),
        })
    }

    /// Checks a release's watermark against its signed time (or, without
    /// one, the server's clock). The limit is explicit:
    ///
    /// ```text
    /// watermark <= signed time + timestamp_tolerance + allowance
    /// ```
    ///
    /// where the allowance is, for a Roughtime proof, its resolution (1 s:
    /// RFC Roughtime midpoints are whole seconds, so a correct signed time
    /// may read up to 1 s early), and for a local proof its radius (the
    /// signing server's clock tolerance). The 5 s Roughtime
    /// radius is deliberately *not* added: it is a fixed, conservative
    /// claim, and adding it would let watermarks run 7 s ahead. A Roughtime
    /// proof must verify with one of this server's configured Roughtime
    /// keys; a local proof with this server's own key.
    fn check_watermark_time(&self, req: &pb::ReleaseRequest) -> Result<(), Error> {
        if req.watermark_us == 0 {
            return Ok(());
        }
        let (reference, allowance, what) = match &req.signed_time {
            Some(st) => {
                let reading = verify_signed_time(st, &self.inner.keys, &self.inner.time.roughtime_keys())
                    .map_err(|e| {
                        Error::invalid(
                            "signed_time",
                            format!("does not verify with this server's keys or its Roughtime keys: {e}"),
                        )
                    })?;
                match reading.source {
                    TimeProofKind::Roughtime => (
                        reading.time,
                        reading.resolution_us(),
                        "signed_time (Roughtime; +1 s resolution)",
                    ),
                    TimeProofKind::Local => (reading.time, reading.radius_us, "signed_time"),
                }
            }
            None => (self.now(), 0, "the server's clock"),
        };
        let tolerance = bagel_proto::duration_micros(self.inner.cfg.timestamp_tolerance);
        let limit = reference
            .as_micros()
            .saturating_add(tolerance)
            .saturating_add(allowance);
        if req.watermark_us > limit {
            return Err(Error::out_of_range(
                "watermark_us",
                format!(
                    "{} is ahead of {what} ({}) by more than the tolerance of {} us (+{} us allowance)",
                    req.watermark_us,
                    reference.as_micros(),
                    tolerance,
                    allowance
                ),
            ));
        }
        Ok(())
    }
}
