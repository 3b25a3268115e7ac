//! The gRPC handlers: thin conversions between the wire and the lease
//! table. All rules live in [`crate::table`].

use std::sync::Arc;
use std::time::Duration;

use bagel_proto::{KeyRing, Micros, pb, verify_local_time};
use pb::lease_service_server::LeaseService;
use tonic::{Request, Response, Status};

use crate::config::Config;
use crate::error::Error;
use crate::table::{HistoryEvent, LeaseTable, Metadata, ReleaseSpec};
use crate::timekeeper::TimeKeeper;
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
    pub witness: WitnessSigner,
    /// Our own public key(s), to verify signed times we issued.
    pub keys: KeyRing,
}

type Reply<T> = Result<Response<T>, Status>;

impl Service {
    fn now(&self) -> Micros {
        self.inner.time.now()
    }

    async fn acquire_waiting(&self, req: &pb::AcquireRequest) -> Result<pb::LeaseGrant, Error> {
        let inner = &*self.inner;
        let limits = &inner.cfg.limits;
        let spec = crate::table::AcquireSpec {
            names: validate::names("names", &req.names, limits)?,
            deadline: validate::deadline(req.deadline_us)?,
            owner: validate::owner(&req.owner, limits)?,
            mode: validate::mode(req.mode)?,
        };
        let wait = validate::wait(req.wait_us, inner.cfg.max_wait)?;
        let give_up = tokio::time::Instant::now() + wait;
        loop {
            let err = match inner.table.acquire(&spec, self.now()) {
                Ok(grant) => return Ok(self.grant_pb(&grant, pb::WitnessKind::Acquire)),
                Err(e) => e,
            };
            let Error::Conflict(conflict) = &err else {
                return Err(err);
            };
            if tokio::time::Instant::now() >= give_up {
                return Err(err);
            }
            // Register for release wake-ups *before* retrying, so a release
            // between the retry and the wait is not missed.
            let guard = inner.table.wait_handle(&conflict.name);
            let notified = guard.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let err = match inner.table.acquire(&spec, self.now()) {
                Ok(grant) => return Ok(self.grant_pb(&grant, pb::WitnessKind::Acquire)),
                Err(e) => e,
            };
            let Error::Conflict(conflict) = &err else {
                return Err(err);
            };
            // The holder's deadline frees the name even without a release.
            let until_expiry = conflict.deadline.duration_since(self.now()) + Duration::from_micros(1);
            let wake = give_up.min(tokio::time::Instant::now() + until_expiry);
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    fn grant_pb(&self, grant: &crate::table::Grant, kind: pb::WitnessKind) -> pb::LeaseGrant {
        let time = self.inner.time.signed();
        self.inner.witness.grant_pb(grant, kind, self.now(), &time)
    }

    /// Checks a release's watermark against its signed time (or, without
    /// one, the server's clock): it may not be ahead by more than the
    /// tolerance plus the time's own error bound.
    fn check_watermark_time(&self, req: &pb::ReleaseRequest) -> Result<(), Error> {
        if req.watermark_us == 0 {
            return Ok(());
        }
        let (reference, radius, what) = match &req.signed_time {
            Some(st) => {
                let reading = verify_local_time(st, &self.inner.keys).map_err(|e| {
                    Error::invalid(
                        "signed_time",
                        format!("does not verify with this server's keys: {e}"),
                    )
                })?;
                (reading.time, reading.radius_us, "signed_time")
            }
            None => (self.now(), 0, "the server's clock"),
        };
        let tolerance = bagel_proto::duration_micros(self.inner.cfg.timestamp_tolerance);
        let limit = reference
            .as_micros()
            .saturating_add(tolerance)
            .saturating_add(radius);
        if req.watermark_us > limit {
            return Err(Error::out_of_range(
                "watermark_us",
                format!(
                    "{} is ahead of {what} ({}) by more than the tolerance of {} us (+{} us error bound)",
                    req.watermark_us,
                    reference.as_micros(),
                    tolerance,
                    radius
                ),
            ));
        }
        Ok(())
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

#[tonic::async_trait]
impl LeaseService for Service {
    async fn acquire(&self, request: Request<pb::AcquireRequest>) -> Reply<pb::AcquireResponse> {
        let grant = self.acquire_waiting(request.get_ref()).await?;
        Ok(Response::new(pb::AcquireResponse { grant: Some(grant) }))
    }

    async fn upgrade(&self, request: Request<pb::UpgradeRequest>) -> Reply<pb::UpgradeResponse> {
        let req = request.get_ref();
        let lease = validate::lease_id(&req.lease_id)?;
        let token = validate::token(&req.token)?;
        let grant = self.inner.table.upgrade(lease, &token, self.now())?;
        Ok(Response::new(pb::UpgradeResponse {
            grant: Some(self.grant_pb(&grant, pb::WitnessKind::Upgrade)),
        }))
    }

    async fn renew(&self, request: Request<pb::RenewRequest>) -> Reply<pb::RenewResponse> {
        let req = request.get_ref();
        let lease = validate::lease_id(&req.lease_id)?;
        let token = validate::token(&req.token)?;
        let deadline = validate::deadline(req.deadline_us)?;
        let metadata = validate::metadata(req.metadata.as_ref(), &self.inner.cfg.limits)?;
        let grant = self
            .inner
            .table
            .renew(lease, &token, deadline, metadata, self.now())?;
        let time = self.inner.time.signed();
        let witness = self
            .inner
            .witness
            .sign(&grant, pb::WitnessKind::Renew, self.now(), &time);
        Ok(Response::new(pb::RenewResponse {
            deadline_us: grant.deadline.as_micros(),
            witness: Some(witness),
        }))
    }

    async fn release(&self, request: Request<pb::ReleaseRequest>) -> Reply<pb::ReleaseResponse> {
        let req = request.get_ref();
        let lease = validate::lease_id(&req.lease_id)?;
        let token = validate::token(&req.token)?;
        let metadata = validate::metadata(req.metadata.as_ref(), &self.inner.cfg.limits)?;
        self.check_watermark_time(req)?;
        let spec = ReleaseSpec {
            watermark: Micros::from_micros(req.watermark_us),
            signed_time: req.signed_time.clone().map(Arc::new),
            metadata,
        };
        let released = self.inner.table.release(lease, &token, spec, self.now())?;
        Ok(Response::new(pb::ReleaseResponse {
            watermark_us: released.watermark.as_micros(),
        }))
    }

    async fn describe(&self, request: Request<pb::DescribeRequest>) -> Reply<pb::DescribeResponse> {
        let req = request.get_ref();
        let names = validate::names("names", &req.names, &self.inner.cfg.limits)?;
        let views = self.inner.table.describe(&names, self.now());
        let names = views
            .into_iter()
            .map(|v| pb::NameState {
                name: v.name.to_string(),
                holder: v.holder.map(|h| pb::Holder {
                    lease_id: h.lease.to_string(),
                    owner: h.owner.to_string(),
                    mode: pb::Mode::from(h.mode).into(),
                    deadline_us: h.deadline.as_micros(),
                    fencing_token: h.fencing,
                    granted_at_us: h.lease.granted_at().as_micros(),
                }),
                previous: Some(v.previous.to_pb()),
                fencing_token: v.fencing,
                known: v.known,
            })
            .collect();
        Ok(Response::new(pb::DescribeResponse { names }))
    }

    async fn history(&self, request: Request<pb::HistoryRequest>) -> Reply<pb::HistoryResponse> {
        let name = validate::name(&request.get_ref().name, &self.inner.cfg.limits)?;
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
        Ok(Response::new(pb::HistoryResponse { entries, truncated }))
    }

    async fn server_info(&self, _request: Request<pb::ServerInfoRequest>) -> Reply<pb::ServerInfoResponse> {
        let inner = &*self.inner;
        let cfg = &inner.cfg;
        let tcfg = inner.table.config();
        let now = self.now();
        let signer = &inner.witness.signer;
        Ok(Response::new(pb::ServerInfoResponse {
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
        }))
    }

    async fn signed_now(&self, _request: Request<pb::SignedNowRequest>) -> Reply<pb::SignedNowResponse> {
        let reading = self.inner.time.signed();
        Ok(Response::new(pb::SignedNowResponse {
            signed_time: Some(reading.signed.clone()),
            time_us: reading.time.as_micros(),
            radius_us: reading.radius_us,
        }))
    }
}
