//! The handlers of the lease service: thin conversions between protobuf
//! messages and the lease table. All rules live in [`crate::table`].
//!
//! They answer with the server's domain error, [`Error`], never a gRPC
//! status: `crate::grpc` meters what they return and only then makes it a
//! `Status`, so nothing here knows about tonic's requests or responses.
//!
//! The handlers of the lease service's RPCs, one per method, each given
//! the request's message and its caller. `crate::grpc::GrpcService` is the
//! gRPC service: it times and counts each call around these and makes
//! their error a status. They are inherent methods rather than the trait's
//! so that a call is one boxed future (the trait's), not two, and they
//! answer with [`Error`] so that the metering sees the refusal itself.
//!
//! # Layout
//! * this file: the service's shared state ([`Inner`]) and what every
//!   handler uses (the clock, the caller's identity, signing a grant).
//! * `acquire`: Acquire, its validation and its wait in the name's queue.
//! * `held`: Upgrade, Renew, Release of a held lease.
//! * `batch`: Batch (and Session's operations), one witness signature for
//!   all grants.
//! * `watch`: List and Watch.
//! * `info`: Describe, History, ServerInfo, SignedNow.

mod acquire;
mod batch;
mod held;
mod info;
mod watch;

use std::sync::Arc;

use bagel_proto::{KeyRing, Micros, pb};

pub(crate) use batch::batch_deadline;

use crate::config::Config;
use crate::error::Error;
use crate::table::LeaseTable;
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

impl Service {
    pub(super) fn now(&self) -> Micros {
        self.inner.time.now()
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
    pub(super) fn check_owner(&self, lease: crate::table::LeaseId, caller: &Caller) -> Result<(), Error> {
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

    /// Signs the grant's witness. The clock was checked before the grant;
    /// in Roughtime mode a grant implies an answer exists, so `signed()`
    /// cannot fail here in practice.
    pub(super) async fn grant_pb(
        &self,
        grant: &crate::table::Grant,
        kind: pb::WitnessKind,
    ) -> Result<pb::LeaseGrant, Error> {
        let time = self.inner.time.signed()?;
        Ok(self.inner.witness.grant_pb(grant, kind, self.now(), &time).await)
    }
}
