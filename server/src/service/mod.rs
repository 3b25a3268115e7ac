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
pub(crate) mod light_lane;
mod list_size;
pub(crate) mod list_turns;
pub(crate) mod readers;
mod watch;

use std::sync::Arc;
use std::time::Duration;

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
    /// Each identity's share of the sessions, watchers and waiting
    /// acquires (see `crate::shares`).
    pub shares: crate::shares::Shares,
    /// Message framing limits and the bytes buffered (see `transport`).
    pub frames: Arc<crate::transport::layer::FrameLimits>,
    /// One permit per connection the server may accept.
    pub conn_slots: Arc<tokio::sync::Semaphore>,
    /// The turns among `List` pages read at once (`Config::list_pages`),
    /// given by identity in turn.
    pub list_turns: Arc<list_turns::ListTurns>,
    /// The threads that read the pages, one per turn (see [`readers`]).
    pub readers: readers::Readers,
    /// The one thread that reads, at once, for identities that read
    /// little (see [`light_lane`]).
    pub light: Arc<light_lane::LightLane>,
    /// Microseconds page turns stayed idle after turned reads, for
    /// `--list-share-while-granting` (see [`Inner::turned_read_pause`]).
    pub list_paused_micros: std::sync::atomic::AtomicU64,
    /// When a grant last asked the mark to cover it (Unix µs).
    pub last_cover: std::sync::atomic::AtomicU64,
    /// Holder keys checked recently (see `crate::holder_keys`).
    pub holder_keys: crate::holder_keys::HolderKeys,
    /// The access policy (`--acl`), if any: who may lease or read what.
    pub acl: Option<Arc<crate::acl::Acl>>,
    /// The member lists this server serves in (`--members` or
    /// `--members-file`), if given: only names it owns under one of them
    /// are granted.
    pub membership: Arc<crate::members::Members>,
}

impl Inner {
    /// Whether clients must show a certificate (mutual TLS).
    pub fn client_auth(&self) -> bool {
        self.cfg.tls.as_ref().is_some_and(|t| t.client_ca_pem.is_some())
    }

    /// Refuses the first of `names` this server does not own under its
    /// member lists (none without `--members`). Checked with every grant
    /// of new names, after the access policy (a caller learns who owns a
    /// name only for names it may lease).
    pub fn check_owned(&self, names: &[Arc<str>]) -> Result<(), Error> {
        let Some(membership) = self.membership.get() else {
            return Ok(());
        };
        for name in names {
            if let Err(not) = membership.owns(name) {
                return Err(Error::NotOwnedHere {
                    name: crate::validate::echo(name),
                    me: Arc::from(membership.me()),
                    owners: not.owners,
                });
            }
        }
        Ok(())
    }

    /// Whether this server grants now: not once it is stopping, and only
    /// with a healthy clock. Releases need neither.
    pub fn may_grant(&self) -> Result<(), Error> {
        if self.stopping.is_cancelled() {
            return Err(Error::ShuttingDown);
        }
        self.time.check()
    }

    /// Runs `read` (a `List` page, a side-port search) on a reader thread:
    /// at once on the light lane when `identity` reads little (see
    /// [`light_lane`]), else once one of the `list_pages` turns is
    /// `identity`'s (see [`list_turns`]) on a thread at a lower CPU
    /// priority than grants (see [`readers`]). Either way the read's CPU
    /// time is counted against `identity`. Refused when `identity` has
    /// too many calls waiting; `ShuttingDown` if no reader is left.
    pub async fn off_workers<T: Send + 'static>(
        self: Arc<Self>,
        identity: Arc<str>,
        read: impl FnOnce(&Inner) -> T + Send + 'static,
    ) -> Result<T, Error> {
        let (answer, done) = tokio::sync::oneshot::channel();
        let inner = Arc::clone(&self);
        let job = move || {
            let read = std::panic::AssertUnwindSafe(|| read(&inner));
            let _ = answer.send(std::panic::catch_unwind(read));
        };
        let reading = self.light.begin(&identity);
        let queued = if reading.is_light() {
            reading.run_on_lane(job)
        } else {
            let turn = self.list_turns.turn(&identity).await?;
            let pacer = Arc::clone(&self);
            self.readers.run(move || {
                let _turn = turn;
                let spent = reading.run_here(job);
                if let Some(pause) = pacer.turned_read_pause(spent) {
                    // The answer is on its way: the pause delays the
                    // next turned read, not this one.
                    pacer.list_paused_micros.fetch_add(
                        u64::try_from(pause.as_micros()).unwrap_or(u64::MAX),
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    std::thread::sleep(pause);
                }
            })
        };
        if !queued {
            return Err(Error::ShuttingDown);
        }
        match done.await {
            Ok(Ok(answer)) => Ok(answer),
            // A panic is the caller's, as if the read ran inline.
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
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

    /// How long a turn stays idle after a read in turn that took `spent`
    /// of CPU, if at all: while grants or renewals are being made, so
    /// that reads in turn take at most `--list-share-while-granting` of
    /// the turns' time.
    ///
    /// Why: reads in turn are niced, but the answers they make are sent
    /// on the threads that serve leases, and on loopback the kernel's
    /// work for them is charged to the same core. Under a tenant's flood
    /// of 32 `List`s of 1,000-name pages, another tenant's cycles fell to
    /// 0.71-0.85x of its rate alone and its `List` p50 to 1.9-3.4x
    /// (`bagel-bench --noisy-neighbour`). The reader of a few pages reads
    /// on the light lane and never pauses; a reader alone on a server that
    /// grants nothing reads at full speed.
    fn turned_read_pause(&self, spent: Duration) -> Option<Duration> {
        let share = u32::from(self.cfg.list_share_while_granting);
        if share >= 100 || spent.is_zero() || !self.granting_recently() {
            return None;
        }
        Some(pause_for(spent, share))
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
        let deadline = cover_at_most(deadline, now, self.cfg.max_ttl, self.cfg.granted_until_step);
        if deadline <= self.highwater.get() {
            return Ok(());
        }
        self.highwater.cover(deadline, now).await?;
        self.table.raise_grant_limit(self.highwater.get());
        Ok(())
    }
}

/// The idle time after a read of `spent` that leaves reads `share` percent
/// (1-99) of the time: `spent × (100 / share − 1)`, at most a second (a
/// page of the largest size takes tens of milliseconds).
fn pause_for(spent: Duration, share: u32) -> Duration {
    (spent * (100 - share) / share.max(1)).min(Duration::from_secs(1))
}

/// How far [`Inner::cover`] raises the mark for a request asking for
/// `deadline` at `now`: the deadline, but never past `now + max_ttl + step`,
/// so a client cannot push the restart wait out by asking for far
/// deadlines (the table refuses those anyway).
///
/// The bound is a step past the max TTL, not at it, because the table
/// checks the deadline against its own later reading of the clock: a
/// deadline at the edge of the TTL range when covered (a client whose
/// clock is ahead, asking for the max TTL) is inside the range a moment
/// later, and must find the mark covering it. A request delayed more than
/// a step between the two is refused with [`Error::MarkBehind`], which
/// clients retry. Only absolute deadlines meet this: a relative TTL counts
/// from the clock reading its cover was computed from, however late the
/// table sees it (`aim`, `renew_op`, `batch_ops`).
pub(crate) fn cover_at_most(deadline: Micros, now: Micros, max_ttl: Duration, step: Duration) -> Micros {
    deadline.min(now.saturating_add(max_ttl + step))
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
    ///
    /// The first identified call on a connection makes the connection
    /// that identity's, one of its share of connections (refused when it
    /// holds its share: see `ConnState::identify`).
    pub(crate) fn identity(&self, caller: &Caller) -> Result<Option<Arc<str>>, Error> {
        let identity = self.caller_identity(caller)?;
        if let (Some(identity), Some(conn)) = (&identity, &caller.conn) {
            conn.identify(identity, &self.inner.shares.connections)?;
        }
        Ok(identity)
    }

    /// Who the caller is (see [`Service::identity`]), counting nothing.
    fn caller_identity(&self, caller: &Caller) -> Result<Option<Arc<str>>, Error> {
        let Some(tls) = self.inner.cfg.tls.as_ref().filter(|t| t.client_ca_pem.is_some()) else {
            // Without mutual TLS, a bearer token the access policy knows.
            return self.token_identity(caller);
        };
        let subject = caller.subject.clone().unwrap_or_else(|| Arc::from(""));
        if let Some(issuer) = caller.untrusted_issuer(&tls.client_ca_der) {
            return Err(Error::UntrustedIssuer { subject, issuer });
        }
        // An empty identity would be one shared by every certificate
        // issued with an empty subject and no single URI SAN.
        if subject.is_empty() {
            return Err(Error::Unauthenticated {
                reason: if caller.subject.is_none() {
                    "no client certificate: this server identifies callers by client certificate"
                } else {
                    "the client certificate names nobody: its subject is empty and it has not \
                     exactly one URI SAN (a SPIFFE ID) without '=' to go by"
                },
            });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::highwater::HighWater;
    use crate::table::TableConfig;

    /// A read that took `t` leaves its turn idle `t × (100 / P − 1)`: at
    /// P = 2 %, 49 t (reads take 1 part in 50); at 50 %, t; never more
    /// than a second.
    #[test]
    fn a_pause_leaves_reads_their_share_of_the_turn() {
        let ms = Duration::from_millis;
        assert_eq!(pause_for(ms(2), 2), ms(98));
        assert_eq!(pause_for(ms(2), 50), ms(2));
        assert_eq!(pause_for(ms(2), 99), Duration::from_nanos(2_000_000 / 99));
        assert_eq!(pause_for(ms(100), 2), Duration::from_secs(1));
    }

    const SEC: Duration = Duration::from_secs(1);

    /// A client whose clock is ahead asks for the max TTL: when covered, its
    /// deadline is just past `now + max_ttl`; when the table checks it a
    /// moment later, it is inside the range. The mark, raised ahead earlier,
    /// lies between the two. Covering only up to `now + max_ttl` left the
    /// mark where it was, and the table refused the renewal as over a
    /// limit, which fenced the holder.
    #[tokio::test]
    async fn a_deadline_the_table_accepts_a_moment_after_its_cover_finds_the_mark_covering_it() {
        let (max_ttl, step) = (2 * SEC, SEC);
        let t1 = Micros::from_micros(1_000_000_000_000);
        // Raised ahead by `keep_mark_ahead` a little earlier.
        let mark = t1.saturating_add(max_ttl + Duration::from_millis(100));
        let hw = HighWater::new(None, mark, max_ttl, step);
        let table = LeaseTable::new(TableConfig::for_tests(max_ttl));
        table.set_grant_limit(hw.get());

        let asked = t1.saturating_add(max_ttl + Duration::from_millis(300));
        hw.cover(cover_at_most(asked, t1, max_ttl, step), t1)
            .await
            .unwrap();
        table.raise_grant_limit(hw.get());

        let t2 = t1.saturating_add(Duration::from_millis(400));
        table.check_deadline(asked, t2).expect("covered");
    }

    /// A request that waited longer than a step between its cover and the
    /// table gets a refusal clients retry (UNAVAILABLE), naming the mark.
    #[test]
    fn a_deadline_past_the_mark_is_refused_as_transient() {
        let max_ttl = 2 * SEC;
        let table = LeaseTable::new(TableConfig::for_tests(max_ttl));
        let now = Micros::from_micros(1_000_000_000_000);
        let mark = now.saturating_add(SEC);
        table.set_grant_limit(mark);
        let asked = now.saturating_add(max_ttl);
        let e = table.check_deadline(asked, now).unwrap_err();
        assert!(matches!(e, Error::MarkBehind { deadline, mark: m } if deadline == asked && m == mark));
        assert!(e.is_retryable());
        assert_eq!(e.code(), tonic::Code::Unavailable);
        assert!(e.to_string().contains("granted-until mark"), "{e}");
    }

    /// A clock that moves on by a millisecond each time it is read, so
    /// that every reading in a request is a later instant than the one
    /// before: what a busy server's clock does between a request's cover
    /// and its grant.
    #[derive(Debug)]
    struct Ticking(std::sync::atomic::AtomicU64);

    impl Ticking {
        const TICK_US: u64 = 1000;

        fn set(&self, t: Micros) {
            self.0.store(t.as_micros(), std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl bagel_proto::clock::Clock for Ticking {
        fn now(&self) -> Micros {
            let was = self
                .0
                .fetch_add(Self::TICK_US, std::sync::atomic::Ordering::SeqCst);
            Micros::from_micros(was)
        }
    }

    /// A server on a [`Ticking`] clock holding `name` for the max TTL, and
    /// the clock moved to halfway through that lease: the granted-until
    /// mark, raised by the acquire, is then less than a max TTL ahead.
    async fn holding(name: &str) -> (Service, Arc<Ticking>, pb::LeaseGrant) {
        let t0 = Micros::from_micros(1_900_000_000_000_000);
        let clock = Arc::new(Ticking(std::sync::atomic::AtomicU64::new(t0.as_micros())));
        // The clock is moved by hand below, with no monotonic time passing:
        // not a step to refuse grants for.
        let cfg = Config::default()
            .with_unsafe_skip_restart_wait(true)
            .with_clock_tolerance(3600 * SEC);
        let max_ttl = cfg.max_ttl;
        let server = crate::Server::new(cfg, bagel_proto::Signer::generate(), clock.clone()).unwrap();
        let service = server.service.clone();
        let acquire = pb::AcquireRequest {
            names: vec![name.to_owned()],
            owner: "holder".to_owned(),
            ttl_us: bagel_proto::duration_micros(max_ttl),
            ..Default::default()
        };
        let grant = service.acquire(&acquire, &Caller::default()).await.unwrap();
        let grant = grant.grant.unwrap();
        clock.set(t0.saturating_add(max_ttl / 2));
        (service, clock, grant)
    }

    /// A relative TTL whose deadline, counted from the request's first
    /// reading of the clock, is exactly the mark: covered, so granted.
    fn ttl_to_the_mark(service: &Service, clock: &Ticking) -> (u64, Micros) {
        let mark = service.inner.highwater.get();
        let first = clock.0.load(std::sync::atomic::Ordering::SeqCst);
        (mark.as_micros() - first, mark)
    }

    /// A renewal by TTL is covered and granted at one instant: the clock
    /// moving on between its cover and the table does not take its
    /// deadline past the mark (a spurious UNAVAILABLE the client must
    /// retry).
    #[tokio::test]
    async fn a_renewal_by_ttl_is_granted_the_deadline_its_cover_covered() {
        let (service, clock, grant) = holding("a").await;
        let (ttl_us, mark) = ttl_to_the_mark(&service, &clock);
        let renew = pb::RenewRequest {
            lease_id: grant.lease_id,
            token: grant.token,
            ttl_us,
            ..Default::default()
        };
        let renewed = service.renew(&renew, &Caller::default()).await.unwrap();
        assert_eq!(renewed.deadline_us, mark.as_micros());
    }

    /// A renewal by the least TTL is not refused as out of range for the
    /// moments between its cover and the table: its range is the TTL's own.
    #[tokio::test]
    async fn a_renewal_by_the_least_ttl_is_granted_however_late_the_table_reads_the_clock() {
        let (service, _clock, grant) = holding("a").await;
        let renew = pb::RenewRequest {
            lease_id: grant.lease_id,
            token: grant.token,
            ttl_us: bagel_proto::duration_micros(service.inner.cfg.min_ttl) + 1,
            ..Default::default()
        };
        service.renew(&renew, &Caller::default()).await.unwrap();
    }

    /// The same for a batch: its renewals and acquires by TTL count from
    /// the instant the batch's cover did.
    #[tokio::test]
    async fn a_batch_by_ttl_is_granted_the_deadlines_its_cover_covered() {
        use pb::batch_op::Op;
        use pb::batch_result::Result as R;
        let (service, clock, grant) = holding("a").await;
        let (ttl_us, mark) = ttl_to_the_mark(&service, &clock);
        let ops = vec![
            pb::BatchOp {
                op: Some(Op::Renew(pb::RenewRequest {
                    lease_id: grant.lease_id,
                    token: grant.token,
                    ttl_us,
                    ..Default::default()
                })),
            },
            pb::BatchOp {
                op: Some(Op::Acquire(pb::AcquireRequest {
                    names: vec!["b".to_owned()],
                    owner: "holder".to_owned(),
                    ttl_us,
                    ..Default::default()
                })),
            },
        ];
        let batch = service
            .batch(&pb::BatchRequest { ops, lean: false }, &Caller::default())
            .await
            .unwrap();
        let deadlines: Vec<Result<u64, String>> = batch
            .results
            .into_iter()
            .map(|r| match r.result.unwrap() {
                R::Renewed(r) => Ok(r.deadline_us),
                R::Grant(g) => Ok(g.deadline_us),
                R::Error(e) => Err(format!("{e:?}")),
                R::Released(_) | R::LeanGrant(_) | R::LeanRenewed(_) => {
                    unreachable!("nothing released, the full form asked for")
                }
            })
            .collect();
        assert_eq!(deadlines, vec![Ok(mark.as_micros()); 2]);
    }

    #[test]
    fn the_cover_never_passes_a_step_beyond_the_max_ttl() {
        let now = Micros::from_micros(1_000_000_000_000);
        let far = now.saturating_add(3600 * SEC);
        assert_eq!(cover_at_most(far, now, 2 * SEC, SEC), now.saturating_add(3 * SEC));
        let near = now.saturating_add(SEC);
        assert_eq!(cover_at_most(near, now, 2 * SEC, SEC), near);
    }
}
