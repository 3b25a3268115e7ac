//! The handlers of the lease service: thin conversions between protobuf
//! messages and the lease table. All rules live in [`crate::table`].
//!
//! They answer with the server's domain error, [`Error`], never a gRPC
//! status: `crate::grpc` meters what they return and only then makes it a
//! `Status`, so nothing here knows about tonic's requests or responses.
//!
//! Longer than most files because it is every RPC's handler in one place:
//! request validation into table specs, the acquire wait loop, and the
//! conversion of each answer to its protobuf, each a few lines.

use std::sync::Arc;
use std::time::Duration;

use bagel_proto::acl::Scope;
use bagel_proto::{KeyRing, Micros, TimeProofKind, pb, verify_signed_time};
use tokio_stream::Stream;

use crate::config::Config;
use crate::error::Error;
use crate::refusal::{self, Subject};
use crate::table::{HistoryEvent, LeaseTable, Metadata, ReleaseSpec, Ticket};
use crate::timekeeper::TimeKeeper;
use crate::transport::Caller;
use crate::validate;
use crate::witness::WitnessSigner;

/// Shared state of the lease service. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Service {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub cfg: Config,
    pub table: LeaseTable,
    pub time: TimeKeeper,
    pub witness: Arc<WitnessSigner>,
    /// Our own public key(s), to verify signed times we issued.
    pub keys: KeyRing,
    /// What the edge counts, for `/metrics` (see `crate::meter`).
    pub meters: crate::meter::Meters,
    pub highwater: crate::highwater::HighWater,
    /// Cancelled when the server starts shutting down: waits end, sessions
    /// close, grants are refused.
    pub stopping: tokio_util::sync::CancellationToken,
    /// Sessions open (see `--max-sessions`), and closed for not reading.
    pub sessions: Arc<std::sync::atomic::AtomicUsize>,
    pub sessions_dropped: Arc<std::sync::atomic::AtomicU64>,
    /// Message framing limits and the bytes buffered (see `transport`).
    pub frames: Arc<crate::transport::layer::FrameLimits>,
    /// One permit per connection the server may accept.
    pub conn_slots: Arc<tokio::sync::Semaphore>,
    /// One permit per `List` page read at once (`Config::list_pages`).
    pub list_slots: Arc<tokio::sync::Semaphore>,
    /// When a grant last asked the mark to cover it (Unix µs).
    pub last_cover: std::sync::atomic::AtomicU64,
    /// Holder keys checked recently (see `crate::holder_keys`).
    pub holder_keys: crate::holder_keys::HolderKeys,
    /// The access policy (`--acl`), if any: who may lease or read what.
    pub acl: Option<Arc<crate::acl::Acl>>,
}

impl Inner {
    /// Whether clients must show a certificate (mutual TLS).
    pub fn client_auth(&self) -> bool {
        self.cfg.tls.as_ref().is_some_and(|t| t.client_ca_pem.is_some())
    }

    /// Whether this server grants now: not once it is stopping, and only
    /// with a healthy clock. Releases need neither.
    pub fn may_grant(&self) -> Result<(), Error> {
        if self.stopping.is_cancelled() {
            return Err(Error::ShuttingDown);
        }
        self.time.check()
    }

    /// Runs `read` (a `List` page, a side-port search) on a blocking
    /// thread once one of the `list_pages` turns is free, waiting for it
    /// otherwise. `ShuttingDown` if the runtime is going away.
    pub async fn off_workers<T: Send + 'static>(
        self: Arc<Self>,
        read: impl FnOnce(&Inner) -> T + Send + 'static,
    ) -> Result<T, Error> {
        let Ok(turn) = Arc::clone(&self.list_slots).acquire_owned().await else {
            return Err(Error::ShuttingDown);
        };
        let done = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            read(&self)
        });
        match done.await {
            Ok(answer) => Ok(answer),
            // A panic is the caller's, as if the read ran inline.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(Error::ShuttingDown),
        }
    }

    /// One page of held names (the gRPC List and the side port's search).
    pub fn list_page(&self, prefix: &str, after: &str, page_size: usize) -> pb::ListResponse {
        let max = self.cfg.list_max_page;
        let limit = if page_size == 0 { 100 } else { page_size }.min(max);
        let after = (!after.is_empty()).then_some(after);
        let page = self.table.list(prefix, after, limit, self.time.now());
        let next_page_token = match (page.more, page.names.last()) {
            (true, Some(last)) => last.name.to_string(),
            _ => String::new(),
        };
        let names = page
            .names
            .into_iter()
            .map(|l| pb::ListedName {
                name: l.name.to_string(),
                holder: Some(pb::Holder {
                    lease_id: l.lease.to_string(),
                    owner: l.owner.to_string(),
                    mode: pb::Mode::from(l.mode).into(),
                    deadline_us: l.deadline.as_micros(),
                    fencing_token: l.fencing,
                    granted_at_us: l.lease.granted_at().as_micros(),
                }),
            })
            .collect();
        pb::ListResponse {
            names,
            next_page_token,
            max_page_size: max as u32,
            // The gRPC List sets it (see `Service::list`).
            revision: 0,
        }
    }

    /// Whether grants were made in the last two mark steps.
    pub fn granting_recently(&self) -> bool {
        let last = self.last_cover.load(std::sync::atomic::Ordering::Relaxed);
        let window = bagel_proto::duration_micros(self.cfg.granted_until_step * 2);
        self.time.now().as_micros() < last.saturating_add(window)
    }

    /// Makes sure the granted-until mark covers `deadline` before a grant
    /// with it is made (see [`crate::highwater`]). A deadline beyond the
    /// max TTL is left to the table to refuse.
    pub async fn cover(&self, deadline: Micros) -> Result<(), Error> {
        let now = self.time.now();
        self.last_cover
            .store(now.as_micros(), std::sync::atomic::Ordering::Relaxed);
        let deadline = deadline.min(now.saturating_add(self.cfg.max_ttl));
        if deadline <= self.highwater.get() {
            return Ok(());
        }
        self.highwater.cover(deadline, now).await?;
        self.table.raise_grant_limit(self.highwater.get());
        Ok(())
    }
}

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
    fn now(&self) -> Micros {
        self.inner.time.now()
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
        if wait.is_zero() {
            let grant = inner.table.acquire(&spec, now)?;
            return self.grant_pb(&grant, pb::WitnessKind::Acquire).await;
        }
        // In the name's FIFO queue from the first refusal on; leaves it on
        // every way out (grant, error, timeout, the caller going away).
        let mut queued = Queued {
            table: &inner.table,
            ticket: Ticket::default(),
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
            result = self.retry(&spec, now, conflict, &mut queued.ticket);
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
    fn acquire_spec(
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

    /// With mutual TLS, the caller's certificate subject, the owner of
    /// what it does; refused when the certificate was not issued directly
    /// by a `--client-ca` certificate, and when its subject breaks the
    /// owner rule (`bagel_proto::names`): a CA may sign any subject, and
    /// one holding a bidirectional override or an invisible character
    /// would show operators another owner than the one holding the lease.
    /// `None` without mutual TLS.
    pub(crate) fn identity(&self, caller: &Caller) -> Result<Option<Arc<str>>, Error> {
        let Some(tls) = self.inner.cfg.tls.as_ref().filter(|t| t.client_ca_pem.is_some()) else {
            // Without mutual TLS, a bearer token the access policy knows.
            return self.token_identity(caller);
        };
        let subject = caller.subject.clone().unwrap_or_else(|| Arc::from(""));
        if let Some(issuer) = caller.untrusted_issuer(&tls.client_ca_der) {
            return Err(Error::UntrustedIssuer { subject, issuer });
        }
        validate::certificate_owner(subject, &self.inner.cfg.limits).map(Some)
    }

    /// With mutual TLS: refuses `caller` unless `lease` was granted to its
    /// certificate (a lease no longer held falls through to the operation,
    /// which says why).
    fn check_owner(&self, lease: crate::table::LeaseId, caller: &Caller) -> Result<(), Error> {
        let Some(caller) = self.identity(caller)? else {
            return Ok(());
        };
        let Some(owner) = self.inner.table.lease_owner(lease) else {
            return Ok(());
        };
        if owner == caller {
            Ok(())
        } else {
            Err(Error::NotOwner { lease, owner, caller })
        }
    }

    fn upgrade_op(&self, req: &pb::UpgradeRequest, caller: &Caller) -> Result<crate::table::Grant, Error> {
        let lease = validate::lease_id(&req.lease_id)?;
        let token = validate::token(&req.token)?;
        self.check_owner(lease, caller)?;
        self.permit_lease(caller, lease)?;
        self.inner.may_grant()?;
        self.inner.table.upgrade(lease, &token, self.now())
    }

    fn renew_op(&self, req: &pb::RenewRequest, caller: &Caller) -> Result<crate::table::Grant, Error> {
        let lease = validate::lease_id(&req.lease_id)?;
        let token = validate::token(&req.token)?;
        self.check_owner(lease, caller)?;
        self.permit_lease(caller, lease)?;
        let cfg = &self.inner.cfg;
        let lifetime = validate::lifetime(req.deadline_us, req.ttl_us, cfg.min_ttl, cfg.max_ttl)?;
        let metadata = validate::metadata(req.metadata.as_ref(), &cfg.limits)?;
        self.inner.may_grant()?;
        let now = self.now();
        self.inner
            .table
            .renew(lease, &token, lifetime.deadline_at(now), metadata, now)
    }

    fn release_op(&self, req: &pb::ReleaseRequest, caller: &Caller) -> Result<pb::ReleaseResponse, Error> {
        let lease = validate::lease_id(&req.lease_id)?;
        let token = validate::token(&req.token)?;
        self.check_owner(lease, caller)?;
        self.permit_lease(caller, lease)?;
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

    /// Runs a batch: every operation on its own, in order; then one
    /// signature over all the grants' witnesses. Each operation is metered
    /// (and a refused one logged) here, from its domain error, before that
    /// error becomes its `OpError`: `Batch` and `Session` share this.
    pub(crate) fn batch_ops(
        &self,
        ops: &[pb::BatchOp],
        caller: &Caller,
    ) -> Result<Vec<pb::BatchResult>, Error> {
        use pb::batch_op::Op;
        use pb::batch_result::Result as R;
        let max = self.inner.cfg.limits.max_batch_ops;
        if ops.len() > max {
            return Err(Error::invalid(
                "ops",
                format!("{} operations exceed the limit of {max} per batch", ops.len()),
            ));
        }
        // Grants need a healthy clock; releases do not.
        let clock = self.inner.may_grant();
        enum Outcome {
            Released(pb::ReleaseResponse),
            Granted(crate::table::Grant, pb::WitnessKind),
            Refused(Error),
        }
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
                            let now = self.now();
                            spec.deadline = lifetime.deadline_at(now);
                            self.inner.table.acquire(&spec, now)
                        })
                        .map(|g| Outcome::Granted(g, pb::WitnessKind::Acquire)),
                    Some(Op::Renew(r)) => self
                        .renew_op(r, caller)
                        .map(|g| Outcome::Granted(g, pb::WitnessKind::Renew)),
                    Some(Op::Upgrade(u)) => self
                        .upgrade_op(u, caller)
                        .map(|g| Outcome::Granted(g, pb::WitnessKind::Upgrade)),
                    Some(Op::Release(r)) => self.release_op(r, caller).map(Outcome::Released),
                };
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
        let mut witnesses = self
            .inner
            .witness
            .sign_batch(&grants, self.now(), &time)
            .into_iter();
        self.inner.meters.batch_sizes.observe(ops.len() as u64);
        let results: Vec<pb::BatchResult> = ops
            .iter()
            .zip(outcomes)
            .map(|(op, o)| {
                let result = match o {
                    Outcome::Released(r) => Ok(R::Released(r)),
                    Outcome::Refused(e) => Err(e),
                    Outcome::Granted(g, kind) => {
                        let w = witnesses.next().expect("one witness per grant");
                        Ok(if kind == pb::WitnessKind::Renew {
                            R::Renewed(pb::RenewResponse {
                                deadline_us: g.deadline.as_micros(),
                                witness: Some(w),
                            })
                        } else {
                            R::Grant(crate::witness::grant_pb(&g, w))
                        })
                    }
                };
                self.meter_op(op, result.as_ref().err());
                let result = result.unwrap_or_else(|e| R::Error(op_error(e)));
                pb::BatchResult { result: Some(result) }
            })
            .collect();
        Ok(results)
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

    /// Signs the grant's witness. The clock was checked before the grant;
    /// in Roughtime mode a grant implies an answer exists, so `signed()`
    /// cannot fail here in practice.
    async fn grant_pb(
        &self,
        grant: &crate::table::Grant,
        kind: pb::WitnessKind,
    ) -> Result<pb::LeaseGrant, Error> {
        let time = self.inner.time.signed()?;
        Ok(self.inner.witness.grant_pb(grant, kind, self.now(), &time).await)
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
    /// signing server's clock tolerance), as before. The 5 s Roughtime
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

/// The latest deadline a batch's operations ask for (acquires, renewals),
/// for the granted-until mark; a relative TTL counts from `now`.
pub(crate) fn batch_deadline(ops: &[pb::BatchOp], now: Micros) -> Micros {
    use pb::batch_op::Op;
    let deadline = ops
        .iter()
        .filter_map(|op| match &op.op {
            Some(Op::Acquire(a)) if a.deadline_us == 0 => {
                Some(now.saturating_add(Duration::from_micros(a.ttl_us)).as_micros())
            }
            Some(Op::Acquire(a)) => Some(a.deadline_us),
            Some(Op::Renew(r)) => Some(r.deadline_us),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    Micros::from_micros(deadline)
}

/// An operation's failure inside a batch, as the unary call's status.
fn op_error(e: Error) -> pb::OpError {
    let conflict = match &e {
        Error::Conflict(c) => Some(c.to_pb()),
        _ => None,
    };
    pb::OpError {
        code: e.code() as i32,
        message: crate::error::bounded(e.to_string()),
        conflict,
    }
}

fn watch_item_pb(item: crate::watch::Item) -> pb::WatchEvent {
    match item {
        crate::watch::Item::Event(e) => watch_event_pb(&e),
        crate::watch::Item::Progress(revision) => pb::WatchEvent {
            revision,
            kind: pb::WatchEventKind::Progress.into(),
            ..Default::default()
        },
    }
}

fn watch_event_pb(e: &crate::watch::Event) -> pb::WatchEvent {
    use crate::watch::EventKind;
    let kind = match e.event.kind {
        EventKind::Granted => pb::WatchEventKind::Granted,
        EventKind::Renewed => pb::WatchEventKind::Renewed,
        EventKind::Upgraded => pb::WatchEventKind::Upgraded,
        EventKind::Released => pb::WatchEventKind::Released,
        EventKind::Broken => pb::WatchEventKind::Broken,
        EventKind::Expired => pb::WatchEventKind::Expired,
    };
    pb::WatchEvent {
        revision: e.revision,
        kind: kind.into(),
        name: e.event.name.to_string(),
        lease_id: e.event.lease.to_string(),
        owner: e.event.owner.to_string(),
        mode: pb::Mode::from(e.event.mode).into(),
        deadline_us: e.event.deadline.as_micros(),
        at_us: e.event.at.as_micros(),
    }
}

/// A watch as its stream goes: the subscription, and what progress it
/// asked for.
struct WatchState {
    sub: crate::watch::Subscription,
    stopping: tokio_util::sync::CancellationToken,
    /// The interval of progress messages, if it asked for them.
    progress: Option<Duration>,
    /// The progress message due once the events resumed are sent: the
    /// revision it subscribed at.
    announce: Option<u64>,
    /// Events handed out since the stream last let go (see [`WATCH_BURST`]).
    burst: usize,
}

/// Events a watch stream hands tonic before it lets go once: tonic encodes
/// into one chunk for as long as the stream is ready (up to 32 KiB), and
/// a client that reads nothing leaves that chunk held by the server. A
/// burst of 64 events (~5 KiB) keeps what an unread watch holds small.
const WATCH_BURST: usize = 64;

impl WatchState {
    /// What to send next: an event, or a progress message when one is due
    /// (after the resumed events; then after the interval without a
    /// message); `None` never while the server runs.
    async fn next(&mut self) -> Option<Result<crate::watch::Item, Error>> {
        self.burst += 1;
        if self.burst > WATCH_BURST {
            self.burst = 0;
            tokio::task::yield_now().await;
        }
        if !self.sub.has_backlog()
            && let Some(revision) = self.announce.take()
        {
            return Some(Ok(crate::watch::Item::Progress(revision)));
        }
        let every = self.progress;
        let quiet = async move {
            match every {
                Some(every) => tokio::time::sleep(every).await,
                None => std::future::pending().await,
            }
        };
        let next = tokio::select! {
            next = self.sub.next() => next.map(|r| r.map(crate::watch::Item::Event)),
            () = quiet => self.sub.progress(),
            () = self.stopping.cancelled() => return Some(Err(Error::ShuttingDown)),
        };
        next.map(|r| r.map_err(Error::Watch))
    }
}

fn history_event(e: HistoryEvent) -> pb::HistoryEvent {
    match e {
        HistoryEvent::Renewed => pb::HistoryEvent::Renewed,
        HistoryEvent::Released => pb::HistoryEvent::Released,
    }
}

fn metadata_pb(m: &Metadata) -> pb::Metadata {
    match m {
        Metadata::Data(d) => pb::Metadata {
            data: d.to_vec(),
            wildcard: false,
        },
        Metadata::Wildcard => pb::Metadata {
            data: Vec::new(),
            wildcard: true,
        },
    }
}

/// The handlers of the lease service's RPCs, one per method, each given
/// the request's message and its caller. `crate::grpc::GrpcService` is the
/// gRPC service: it times and counts each call around these and makes
/// their error a status. They are inherent methods rather than the trait's
/// so that a call is one boxed future (the trait's), not two, and they
/// answer with [`Error`] so that the metering sees the refusal itself.
impl Service {
    pub(crate) async fn acquire(
        &self,
        req: &pb::AcquireRequest,
        caller: &Caller,
    ) -> Result<pb::AcquireResponse, Error> {
        let grant = self.acquire_waiting(req, caller).await?;
        Ok(pb::AcquireResponse { grant: Some(grant) })
    }

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
        self.inner.cover(Micros::from_micros(req.deadline_us)).await?;
        let grant = self.renew_op(req, caller)?;
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

    pub(crate) async fn batch(
        &self,
        req: &pb::BatchRequest,
        caller: &Caller,
    ) -> Result<pb::BatchResponse, Error> {
        self.inner.cover(batch_deadline(&req.ops, self.now())).await?;
        let results = self.batch_ops(&req.ops, caller)?;
        Ok(pb::BatchResponse { results })
    }

    pub(crate) fn describe(
        &self,
        req: &pb::DescribeRequest,
        caller: &Caller,
    ) -> Result<pb::DescribeResponse, Error> {
        let names = validate::names("names", &req.names, &self.inner.cfg.limits)?;
        self.permit(caller, bagel_proto::acl::Permission::Read, &names)?;
        let views = self.inner.table.describe(&names, self.now());
        let names = views
            .into_iter()
            .map(|v| pb::NameState {
                name: v.name.to_string(),
                holder: v.holder.map(|h| pb::Holder {
                    lease_id: h.lease.to_string(),
                    owner: v.owner.as_deref().unwrap_or_default().to_owned(),
                    mode: pb::Mode::from(h.mode).into(),
                    deadline_us: h.deadline.as_micros(),
                    fencing_token: v.fencing,
                    granted_at_us: h.lease.granted_at().as_micros(),
                }),
                previous: Some(v.previous.to_pb()),
                fencing_token: v.fencing,
                known: v.known,
                waiters: v.waiters as u32,
            })
            .collect();
        Ok(pb::DescribeResponse { names })
    }

    pub(crate) fn history(
        &self,
        req: &pb::HistoryRequest,
        caller: &Caller,
    ) -> Result<pb::HistoryResponse, Error> {
        let name = validate::name(&req.name, &self.inner.cfg.limits)?;
        self.permit(
            caller,
            bagel_proto::acl::Permission::Read,
            std::slice::from_ref(&name),
        )?;
        let (entries, truncated) = self.inner.table.history(&name);
        let entries = entries
            .into_iter()
            .map(|e| pb::HistoryEntry {
                lease_id: e.lease.to_string(),
                owner: e.owner.to_string(),
                event: history_event(e.event).into(),
                at_us: e.at.as_micros(),
                watermark_us: e.watermark.as_micros(),
                metadata: e.metadata.as_ref().map(metadata_pb),
            })
            .collect();
        Ok(pb::HistoryResponse { entries, truncated })
    }

    /// Never refused: what this server is, its limits and its load.
    pub(crate) fn server_info(&self, caller: &Caller) -> pb::ServerInfoResponse {
        let inner = &*self.inner;
        let cfg = &inner.cfg;
        let tcfg = inner.table.config();
        let now = self.now();
        let signer = &inner.witness.signer;
        pb::ServerInfoResponse {
            server_id: cfg.server_id.clone(),
            epoch_us: inner.witness.epoch.as_micros(),
            keys: vec![pb::PublicKey {
                key_id: signer.key_id().to_owned(),
                ed25519: signer.verifying_key().as_bytes().to_vec(),
            }],
            min_ttl_us: cfg.min_ttl.as_micros() as u64,
            max_ttl_us: cfg.max_ttl.as_micros() as u64,
            max_wait_us: cfg.max_wait.as_micros() as u64,
            ready_at_us: tcfg.ready_at.as_micros(),
            ready: now >= tcfg.ready_at,
            now_us: now.as_micros(),
            clock: Some(inner.time.status()),
            forgotten_floor_us: inner.table.forgotten_floor().as_micros(),
            unsafe_skip_restart_wait: cfg.unsafe_skip_restart_wait,
            max_names_per_request: cfg.limits.max_names_per_request as u32,
            max_name_bytes: cfg.limits.max_name_bytes as u32,
            max_owner_bytes: cfg.limits.max_owner_bytes as u32,
            max_metadata_bytes: cfg.limits.max_metadata_bytes as u32,
            timestamp_tolerance_us: cfg.timestamp_tolerance.as_micros() as u64,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            limits: Some(cfg.limits_pb()),
            tls: cfg.tls.is_some(),
            client_auth: inner.client_auth(),
            granted_until_us: inner.highwater.get().as_micros(),
            load: Some(pb::ServerLoad {
                connections: cfg
                    .limits
                    .max_connections
                    .saturating_sub(inner.conn_slots.available_permits()) as u64,
                sessions: inner.sessions.load(std::sync::atomic::Ordering::Relaxed) as u64,
                held_names: inner.table.held() as u64,
                waiters: inner.table.waiting() as u64,
                inflight_bytes: inner.frames.buffered() as u64,
                sessions_dropped: inner.sessions_dropped.load(std::sync::atomic::Ordering::Relaxed),
                watchers: inner.table.watch_hub().watchers() as u64,
            }),
            access: self.access_info(caller),
        }
    }

    /// A page of held names and the watch revision it reflects, read
    /// before the page (see `LeaseTable::list_revision`). At most
    /// `list_pages` pages are read at once, each on a blocking thread
    /// (more wait for a turn): pages of 1,000 names in a loop would
    /// otherwise hold the async workers that renewals need.
    pub(crate) async fn list(
        &self,
        req: &pb::ListRequest,
        caller: &Caller,
    ) -> Result<pb::ListResponse, Error> {
        let limits = &self.inner.cfg.limits;
        let prefix = validate::prefix("prefix", &req.prefix, limits)?;
        let scope = self.read_scope(caller, &prefix)?;
        let after = validate::prefix("page_token", &req.page_token, limits)?;
        let page_size = req.page_size as usize;
        let inner = Arc::clone(&self.inner);
        inner
            .off_workers(move |inner| {
                let revision = inner.table.list_revision(inner.time.now());
                let page = crate::acl::list_scoped(inner, &scope, &prefix, &after, page_size);
                pb::ListResponse { revision, ..page }
            })
            .await
    }

    /// The watch's events, ending with the error that ends it (a watcher
    /// that fell behind, or the server shutting down). With
    /// `progress_notify`, a progress message once the events resumed are
    /// sent, and whenever nothing was sent for the interval.
    pub(crate) async fn watch(
        &self,
        req: &pb::WatchRequest,
        caller: &Caller,
    ) -> Result<impl Stream<Item = Result<pb::WatchEvent, Error>> + Send + 'static, Error> {
        let progress = if req.progress_notify {
            Some(self.progress_interval(req.progress_interval_us)?)
        } else {
            None
        };
        let limits = &self.inner.cfg.limits;
        let (filter, scope) = if req.names.is_empty() {
            let prefix = validate::prefix("prefix", &req.prefix, limits)?;
            let scope = self.read_scope(caller, &prefix)?;
            (crate::watch::Filter::Prefix(prefix), scope)
        } else {
            if !req.prefix.is_empty() {
                return Err(Error::invalid("prefix", "give names or a prefix, not both"));
            }
            let names = validate::names("names", &req.names, limits)?;
            self.permit(caller, bagel_proto::acl::Permission::Read, &names)?;
            (
                crate::watch::Filter::Names(names.into_iter().collect()),
                Scope::All,
            )
        };
        let from = (req.from_revision != 0).then_some(req.from_revision);
        // The first watcher wakes the hub, which reads every live lease
        // (~2 s at 10^6): on a blocking thread, so no async worker's other
        // requests wait for that. Later ones subscribe inline (a blocking
        // thread each would cost more than the subscribing).
        let now = self.now();
        let sub = if self.inner.table.watch_hub().active() {
            self.inner.table.watch(filter, from, now)?
        } else {
            let inner = Arc::clone(&self.inner);
            tokio::task::spawn_blocking(move || inner.table.watch(filter, from, now))
                .await
                .map_err(|_| Error::ShuttingDown)??
        };
        let state = WatchState {
            announce: progress.map(|_| sub.start_revision()),
            sub,
            stopping: self.inner.stopping.clone(),
            progress,
            burst: 0,
        };
        let stream = futures::stream::unfold(Some(state), |state| async move {
            let mut state = state?;
            let next = state.next().await;
            match next? {
                Ok(item) => Some((Ok(watch_item_pb(item)), Some(state))),
                Err(e) => Some((Err(e), None)),
            }
        });
        Ok(crate::acl::scoped(stream, scope))
    }

    /// The progress interval a watch asked for (0: the server's).
    fn progress_interval(&self, us: u64) -> Result<Duration, Error> {
        use crate::watch::{MAX_PROGRESS, MIN_PROGRESS};
        if us == 0 {
            return Ok(self.inner.cfg.watch.progress);
        }
        let asked = Duration::from_micros(us);
        if !(MIN_PROGRESS..=MAX_PROGRESS).contains(&asked) {
            return Err(Error::out_of_range(
                "progress_interval_us",
                format!(
                    "{us} is outside [{}, {}] (10 ms to 1 h; 0 for the server's default)",
                    MIN_PROGRESS.as_micros(),
                    MAX_PROGRESS.as_micros()
                ),
            ));
        }
        Ok(asked)
    }

    pub(crate) fn signed_now(&self) -> Result<pb::SignedNowResponse, Error> {
        let reading = self.inner.time.signed()?;
        Ok(pb::SignedNowResponse {
            signed_time: Some(reading.signed.clone()),
            time_us: reading.time.as_micros(),
            radius_us: reading.radius_us,
        })
    }
}
