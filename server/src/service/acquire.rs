//! Acquire: a request validated into a table spec (the owner from the
//! client certificate under mutual TLS), the granted-until mark covering
//! its deadline, and the wait in the name's FIFO queue while it is held.
//! The only handler that waits, so it has a file of its own.

use std::time::Duration;

use bagel_proto::{Micros, pb};

use super::Service;
use crate::error::Error;
use crate::table::{LeaseTable, Ticket};
use crate::transport::Caller;
use crate::validate;

/// A waiting acquire's place in its name's queue, left on drop (also when
/// the caller goes away mid-wait and the handler future is dropped).
struct Queued<'a> {
    table: &'a LeaseTable,
    ticket: Ticket,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.table.leave_queue(&mut self.ticket);
    }
}

impl Service {
    pub(crate) async fn acquire(
        &self,
        req: &pb::AcquireRequest,
        caller: &Caller,
    ) -> Result<pb::AcquireResponse, Error> {
        let grant = self.acquire_waiting(req, caller).await?;
        Ok(pb::AcquireResponse { grant: Some(grant) })
    }

    async fn acquire_waiting(
        &self,
        req: &pb::AcquireRequest,
        caller: &Caller,
    ) -> Result<pb::LeaseGrant, Error> {
        let inner = &*self.inner;
        // First, so that a server with a wrong clock says so rather than
        // judging deadlines by it.
        inner.may_grant()?;
        let (mut spec, lifetime) = self.acquire_spec(req, caller)?;
        let wait = validate::wait(req.wait_us, inner.cfg.max_wait)?;
        // An absolute deadline makes waiting eat into the lease: stop
        // waiting while the deadline is still valid, and answer with the
        // conflict rather than an out-of-range deadline. A relative TTL
        // counts from the grant, so the wait takes nothing off it.
        let usable = match lifetime {
            validate::Lifetime::Until(deadline) => deadline
                .saturating_sub(inner.cfg.min_ttl)
                .duration_since(self.now())
                .saturating_sub(Duration::from_micros(1)),
            validate::Lifetime::For(_) => Duration::MAX,
        };
        let give_up = tokio::time::Instant::now() + wait.min(usable);
        let now = self.aim(&mut spec, lifetime).await?;
        // Permission is judged at the grant: the policy may have been
        // reloaded while the mark was being covered.
        self.permit(caller, bagel_proto::acl::Permission::Lease, &spec.names)?;
        if wait.is_zero() {
            let grant = inner.table.acquire(&spec, now)?;
            return self.grant_pb(&grant, pb::WitnessKind::Acquire).await;
        }
        // In the name's FIFO queue from the first refusal on; leaves it on
        // every way out (grant, error, timeout, the caller going away).
        // While queued it holds one of its identity's share of the waiting
        // acquires (`--max-waiters-per-identity`).
        let mut queued = Queued {
            table: &inner.table,
            ticket: Ticket::for_tenant(&inner.shares.waiters, self.tenant(caller)?),
        };
        let mut result = inner.table.acquire_queued(&spec, now, Some(&mut queued.ticket));
        loop {
            let conflict = match result {
                Ok(grant) => return self.grant_pb(&grant, pb::WitnessKind::Acquire).await,
                Err(Error::Conflict(c)) if tokio::time::Instant::now() < give_up => c,
                Err(e) => return Err(e),
            };
            // Only the first waiter watches the holder's deadline (a lease
            // that ends without a release); the others wait to be first.
            let wake = if queued.ticket.is_first() {
                let until_expiry = conflict.deadline.duration_since(self.now()) + Duration::from_micros(1);
                give_up.min(tokio::time::Instant::now() + until_expiry)
            } else {
                give_up
            };
            tokio::select! {
                () = queued.ticket.notified() => {}
                () = tokio::time::sleep_until(wake) => {}
                () = inner.stopping.cancelled() => return Err(Error::ShuttingDown),
            }
            let now = self.aim(&mut spec, lifetime).await?;
            // Again at this grant: a policy reloaded while the acquire
            // waited (its turn can come long after it was admitted) may
            // have revoked the caller's permission.
            result = self
                .permit(caller, bagel_proto::acl::Permission::Lease, &spec.names)
                .and_then(|()| self.retry(&spec, now, conflict, &mut queued.ticket));
        }
    }

    /// Sets `spec`'s deadline for a grant made now (a relative TTL counts
    /// from this instant) and makes sure the granted-until mark covers it;
    /// returns the instant to grant at.
    async fn aim(
        &self,
        spec: &mut crate::table::AcquireSpec,
        lifetime: validate::Lifetime,
    ) -> Result<Micros, Error> {
        let now = self.now();
        spec.deadline = lifetime.deadline_at(now);
        self.inner.cover(spec.deadline).await?;
        Ok(now)
    }

    /// Retries a waiting acquire. The deadline was valid when the request
    /// arrived; if waiting made it too close, the answer is still the
    /// conflict that made us wait.
    fn retry(
        &self,
        spec: &crate::table::AcquireSpec,
        now: Micros,
        mut conflict: Box<crate::error::Conflict>,
        ticket: &mut Ticket,
    ) -> Result<crate::table::Grant, Error> {
        self.inner.may_grant()?;
        match self.inner.table.acquire_queued(spec, now, Some(ticket)) {
            Err(Error::DeadlineOutOfRange { .. }) => {
                // Its retry delay counts from now, not from when we began.
                conflict.seen = now;
                Err(Error::Conflict(conflict))
            }
            other => other,
        }
    }

    /// Validates an acquire request. With mutual TLS the owner is the
    /// client certificate's subject, whatever the request says: the
    /// witness then names an identity the server checked, and per-owner
    /// quotas cannot be dodged by changing the owner field.
    pub(super) fn acquire_spec(
        &self,
        req: &pb::AcquireRequest,
        caller: &Caller,
    ) -> Result<(crate::table::AcquireSpec, validate::Lifetime), Error> {
        let limits = &self.inner.cfg.limits;
        let cfg = &self.inner.cfg;
        let owner = match self.identity(caller)? {
            Some(subject) => subject,
            None => validate::owner(&req.owner, limits)?,
        };
        let names = validate::names("names", &req.names, limits)?;
        self.permit(caller, bagel_proto::acl::Permission::Lease, &names)?;
        self.inner.check_owned(&names)?;
        let lifetime = validate::lifetime(req.deadline_us, req.ttl_us, cfg.min_ttl, cfg.max_ttl)?;
        let spec = crate::table::AcquireSpec {
            names,
            deadline: lifetime.deadline_at(self.now()),
            owner,
            mode: validate::mode(req.mode)?,
            peer: caller.peer,
            holder_key: validate::holder_key(&req.holder_key, &self.inner.holder_keys)?,
        };
        Ok((spec, lifetime))
    }
}
