//! [`Lease`]: a held lease, renewed in the background until released.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bagel_proto::Micros;
use bagel_proto::rights::{RightsSnapshot, WriteLedger, WriteRights, WriteSummary};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::LeaseBackend;
use crate::error::{Error, Result};
use crate::types::{Grant, LeaseRef, Metadata, Mode, NameGrant, ReleaseOptions, Witness};

/// How a [`Lease`] looks after itself.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LeaseOptions {
    /// Renew in the background (default true).
    pub auto_renew: bool,
    /// How often to renew; default a third of the TTL, so two renewals can
    /// fail before the lease is at risk.
    pub renew_every: Option<Duration>,
    /// [`Lease::is_valid`] turns false this long before the deadline, to
    /// leave room for clock error and for a write in flight to land.
    pub safety_margin: Duration,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            auto_renew: true,
            renew_every: None,
            safety_margin: Duration::from_millis(500),
        }
    }
}

impl LeaseOptions {
    /// Renew in the background, or not (then the caller renews).
    #[must_use]
    pub fn with_auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    /// Renew this often instead of every third of the TTL.
    #[must_use]
    pub fn with_renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// Count the lease invalid this long before its deadline.
    #[must_use]
    pub fn with_safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = margin;
        self
    }
}

/// Why a lease was lost.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// The server refused a renewal: it no longer holds the lease for us
    /// (its deadline passed, another grant broke it, the token is wrong).
    Refused {
        /// The backend's refusal, as its [`Error`] displays.
        error: String,
    },
    /// Renewals kept failing (server unreachable, restarting) until the
    /// deadline minus the safety margin came.
    OutOfTime {
        /// The deadline the lease ran out at (µs, the server's clock).
        deadline: Micros,
        /// The last renewal's failure, as its [`Error`] displays.
        last_error: String,
    },
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::Refused { error } => write!(f, "renewal refused: {error}"),
            LossReason::OutOfTime { deadline, last_error } => {
                write!(f, "no renewal before the deadline {deadline}: {last_error}")
            }
        }
    }
}

/// What changes over a lease's life.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseState {
    /// When the lease ends unless renewed (µs, the server's clock).
    pub deadline: Micros,
    /// What the lease grants now.
    pub mode: Mode,
    /// The witnesses that state `deadline` and `mode`: always from the
    /// one answer, so a writer citing it never writes past what it says.
    pub witnesses: Vec<Witness>,
    /// The lease counts as expired from this instant on, whatever the
    /// local wall clock says: the instant the answer's request was sent
    /// plus the time its witnesses say was left when they were issued
    /// (`deadline - issued_at`, the shortest of them). The server issued
    /// them after the request left, so this is never later than the true
    /// deadline, and it needs no clock but the monotonic one. `None` when
    /// no witness states when it was issued.
    pub valid_until: Option<Instant>,
    /// Set once the lease is lost; never cleared.
    pub lost: Option<LossReason>,
    /// Set when the release starts: no more writes under the lease.
    pub released: bool,
}

impl LeaseState {
    /// Takes an answer's (deadline, mode, witness) if it grants more than
    /// what is held: full before tentative, then the later deadline.
    /// Answers arrive in any order (a renewal in flight while another one
    /// or an upgrade lands); an older, lesser one never replaces a newer.
    ///
    /// Whatever it ranks, an answer's own count ([`LeaseState::valid_until`])
    /// is kept when it runs later: every answer's count ends no later than
    /// the deadline it states, and the server's deadline only grows. A
    /// renewal the server could not extend (a client clock behind the
    /// server's asks for less than is held) still restarts the count from
    /// its own send, which a grant after a long wait needs.
    fn adopt(&mut self, deadline: Micros, mode: Mode, witnesses: Vec<Witness>, sent: Instant) {
        let rank = |mode: Mode, deadline: Micros| (mode == Mode::Full, deadline);
        let counted = valid_until(&witnesses, sent);
        if rank(mode, deadline) > rank(self.mode, self.deadline) {
            self.deadline = deadline;
            self.mode = mode;
            self.valid_until = counted;
            self.witnesses = witnesses;
        } else if let (Some(now), Some(new)) = (self.valid_until, counted)
            && new > now
        {
            self.valid_until = Some(new);
        }
    }

    /// How long the lease still counts as held, measured conservatively:
    /// until the deadline on `wall_now` (the local wall clock) and until
    /// [`LeaseState::valid_until`] on the monotonic clock, whichever comes
    /// first. A wall clock that is behind therefore cannot stretch the
    /// lease past what the server granted.
    pub fn time_left(&self, wall_now: Micros) -> Duration {
        let wall = self.deadline.duration_since(wall_now);
        match self.valid_until {
            Some(until) => wall.min(until.saturating_duration_since(Instant::now())),
            None => wall,
        }
    }
}

/// `sent` plus the shortest time the witnesses say was left when they
/// were issued (see [`LeaseState::valid_until`]).
fn valid_until(witnesses: &[Witness], sent: Instant) -> Option<Instant> {
    crate::ttl_check::left_at_grant(witnesses).map(|left| sent + left)
}

#[derive(Debug)]
struct Shared {
    backend: Arc<dyn LeaseBackend>,
    /// The grant as answered, less its witnesses: they moved into `state`,
    /// which every later answer updates.
    grant: Grant,
    lease: LeaseRef,
    ttl: Duration,
    options: LeaseOptions,
    state: watch::Sender<LeaseState>,
    /// What the writers under this lease wrote; the release publishes it.
    /// Made by the first [`Lease::rights`]: most leases never write, and
    /// the ledger's allocation and the release's wait on it were part of
    /// every lease cycle.
    ledger: OnceLock<Arc<WriteLedger>>,
    /// This holder closed every bag below this (µs), having found its
    /// predecessors unsettled; the release says so.
    settled_through: AtomicU64,
    /// The key named in the lease's witnesses: signs its batches.
    holder: Arc<bagel_proto::Signer>,
}

/// A held lease. Renews itself in the background (unless told not to) and
/// reports loss through [`Lease::lost`] and [`Lease::subscribe`].
///
/// Dropping a `Lease` stops renewal but does not release it: a release
/// publishes a watermark. An unreleased lease expires at its deadline and
/// the next holder treats it as broken.
#[derive(Debug)]
pub struct Lease {
    shared: Arc<Shared>,
    /// Stops the renewal: made with it (see [`Lease::start_renewing`]).
    cancel: Option<CancellationToken>,
    renewer: Option<JoinHandle<()>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(cancel) = &self.cancel {
            cancel.cancel();
        }
    }
}

impl Lease {
    /// A handle on `grant`, whose request was sent at `sent`.
    ///
    /// `left` is what the grant's witnesses say was left when they were
    /// issued ([`crate::ttl_check::left_at_grant`], which the caller has
    /// read already to warn of a short grant). The witnesses move into the
    /// lease's state, the one place they are read from: a copy kept in the
    /// grant as well cost every acquire a clone of each witness's body,
    /// signature and Merkle path. It does not renew until
    /// [`Lease::start_renewing`].
    pub(crate) fn start(
        backend: Arc<dyn LeaseBackend>,
        mut grant: Grant,
        sent: Instant,
        left: Option<Duration>,
        ttl: Duration,
        options: LeaseOptions,
        holder: Arc<bagel_proto::Signer>,
    ) -> Self {
        let (state, _) = watch::channel(LeaseState {
            deadline: grant.deadline,
            mode: grant.mode,
            valid_until: left.map(|left| sent + left),
            witnesses: std::mem::take(&mut grant.witnesses),
            lost: None,
            released: false,
        });
        let shared = Arc::new(Shared {
            backend,
            lease: grant.lease_ref(),
            grant,
            ttl,
            options,
            state,
            ledger: OnceLock::new(),
            settled_through: AtomicU64::new(0),
            holder,
        });
        Lease {
            shared,
            cancel: None,
            renewer: None,
        }
    }

    /// Starts the background renewal, when the options ask for it. Not
    /// part of [`Lease::start`]: an acquire may first renew once itself
    /// ([`Lease::reanchor`]), and a background renewal must not race it on
    /// the grant's shorter count.
    pub(crate) fn start_renewing(&mut self) {
        if self.shared.options.auto_renew && self.renewer.is_none() {
            let cancel = self.cancel.get_or_insert_with(CancellationToken::new);
            self.renewer = Some(tokio::spawn(renew_loop(Arc::clone(&self.shared), cancel.clone())));
        }
    }

    /// The lease's id, unique on its backend.
    pub fn id(&self) -> &str {
        &self.shared.lease.id
    }

    /// The secret proving this holder. Keep it out of logs.
    pub fn token(&self) -> &str {
        &self.shared.lease.token
    }

    /// The lease's holder key: its public half is in every witness of the
    /// lease, and it signs every batch written under it. A secret like the
    /// token; hand it only to a process that is to write under the lease,
    /// and acquire such a lease with
    /// [`AcquireBuilder::own_holder_key`](crate::AcquireBuilder::own_holder_key)
    /// (by default leases acquired within a second share a key).
    pub fn holder_key(&self) -> &bagel_proto::Signer {
        &self.shared.holder
    }

    /// The lease by id and token, for handing to another process.
    pub fn lease_ref(&self) -> &LeaseRef {
        &self.shared.lease
    }

    /// The names with their fencing tokens and what each inherited.
    pub fn names(&self) -> &[NameGrant] {
        &self.shared.grant.names
    }

    /// For a lease over several servers, each server's part (empty for a
    /// lease from one server).
    pub fn servers(&self) -> &[crate::types::ServerPart] {
        &self.shared.grant.servers
    }

    /// The fencing token of `name` under this lease; `None` when the
    /// lease does not hold `name`.
    pub fn fencing_token(&self, name: &str) -> Option<u64> {
        self.names()
            .iter()
            .find(|n| n.name == name)
            .map(|n| n.fencing_token)
    }

    /// Every message written under this lease must be strictly later.
    pub fn min_timestamp(&self) -> Micros {
        self.shared.grant.min_timestamp
    }

    /// When the lease ends unless renewed (µs, the server's clock), as of
    /// the latest grant, upgrade or renewal.
    pub fn deadline(&self) -> Micros {
        self.shared.state.borrow().deadline
    }

    /// What the lease grants now (full after an upgrade).
    pub fn mode(&self) -> Mode {
        self.shared.state.borrow().mode
    }

    /// The witness of the latest grant, upgrade or renewal (the one that
    /// states the current deadline).
    pub fn witness(&self) -> Witness {
        self.shared.state.borrow().witnesses[0].clone()
    }

    /// Every witness of the latest grant, upgrade or renewal: one per
    /// server (or store) the lease is held on.
    pub fn witnesses(&self) -> Vec<Witness> {
        self.shared.state.borrow().witnesses.clone()
    }

    /// A snapshot of what changes over the lease's life (deadline, mode,
    /// witnesses, loss); [`Lease::is_valid`] is the check to write by.
    pub fn state(&self) -> LeaseState {
        self.shared.state.borrow().clone()
    }

    /// A local check, no RPC: not lost, not released, full, and more than
    /// the safety margin left by [`Lease::time_left`]: on the local wall
    /// clock *and* on the monotonic clock since the request was sent (so
    /// a local clock that is behind cannot keep a lease valid past the
    /// deadline the server meant).
    pub fn is_valid(&self) -> bool {
        let s = self.shared.state.borrow();
        s.lost.is_none()
            && !s.released
            && s.mode == Mode::Full
            && s.time_left(self.shared.backend.clock().now()) > self.shared.options.safety_margin
    }

    /// How long the lease still counts as held (zero once it does not),
    /// measured conservatively: see [`LeaseState::time_left`]. What a
    /// fence or a holder should stop by, minus its own margins.
    pub fn time_left(&self) -> Duration {
        self.shared
            .state
            .borrow()
            .time_left(self.shared.backend.clock().now())
    }

    /// Watches the lease's state (deadline, witness, loss).
    pub fn subscribe(&self) -> watch::Receiver<LeaseState> {
        self.shared.state.subscribe()
    }

    /// Resolves when the lease is lost, with the reason.
    pub async fn lost(&self) -> LossReason {
        let mut rx = self.subscribe();
        let state = rx
            .wait_for(|s| s.lost.is_some())
            .await
            .expect("the sender lives as long as `self`");
        state.lost.clone().expect("waited for it")
    }

    /// Every bag that can hold a timestamp below this must be closed
    /// before this holder may trust what it reads of its predecessors'
    /// data: some earlier holder of a name (not only the last) was broken,
    /// is unknown, or released with writes of unknown outcome, and nobody
    /// has closed its bags since. `None` when everything before is settled.
    ///
    /// Close them (`bagel_bags::close_through` on every log the names'
    /// holders write), then say so with [`Lease::settled_through`], so the
    /// release tells the next holder it need not close them again.
    pub fn close_before_reading(&self) -> Option<Micros> {
        self.names()
            .iter()
            .filter_map(|n| n.previous.unsettled_until)
            .max()
    }

    /// Records that this holder closed every bag below `until`.
    pub fn settled_through(&self, until: Micros) {
        self.shared
            .settled_through
            .fetch_max(until.as_micros(), Ordering::SeqCst);
    }

    /// Rights to write under this lease, for a bag writer. They follow
    /// renewals (deadline and witness, one pair), stop at once if the lease
    /// is lost, released or only tentative, and record what is written so
    /// that [`Lease::release`] publishes it.
    pub fn rights(&self) -> Arc<dyn WriteRights> {
        Arc::new(LeaseRights {
            min_timestamp: self.min_timestamp(),
            state: self.subscribe(),
            ledger: Arc::clone(self.shared.ledger.get_or_init(Default::default)),
            holder: Arc::clone(&self.shared.holder),
        })
    }

    /// What the writers under this lease have written so far.
    pub fn written(&self) -> WriteSummary {
        self.shared.ledger.get().map(|l| l.summary()).unwrap_or_default()
    }

    /// Renews now to `now + ttl`.
    pub async fn renew(&self) -> Result<Micros> {
        renew_once(&self.shared, None).await
    }

    /// Renews now so that the lease's local validity counts from this
    /// renewal's send rather than from the grant's (see
    /// `acquire::needs_reanchor`). A refusal is the caller's error (the
    /// lease is not held); a renewal that could not be made for now leaves
    /// the grant's shorter count, and the background renewal, which starts
    /// within a third of what is left, tries again.
    pub(crate) async fn reanchor(&self) -> Result<()> {
        match renew_once(&self.shared, None).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_retryable() => {
                tracing::warn!(lease = %self.shared.lease.id, error = %e,
                    "the renewal after a long-waited grant failed; its validity counts from the wait's start");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Renews now, attaching metadata that says where updates were stored.
    pub async fn renew_with_metadata(&self, metadata: Metadata) -> Result<Micros> {
        renew_once(&self.shared, Some(metadata)).await
    }

    /// Turns a tentative lease full; fails if a name was broken meanwhile.
    pub async fn upgrade(&self) -> Result<()> {
        let s = &self.shared;
        let sent = Instant::now();
        let grant = s.backend.upgrade_lease(&s.lease).await?;
        s.state
            .send_modify(|st| st.adopt(grant.deadline, Mode::Full, grant.witnesses, sent));
        Ok(())
    }

    /// Releases the lease, publishing a watermark: at least the highest
    /// timestamp its writers handed to the store (see [`Lease::rights`]),
    /// or `watermark` if that is higher (`None` = nothing more). A
    /// `watermark` below what was written is refused: the next holder
    /// could write below acknowledged messages. Writes in flight are
    /// waited for first, and none can start once the release has begun.
    /// Returns the watermark the server stored.
    pub async fn release(self, watermark: Option<Micros>) -> Result<Micros> {
        self.release_with(ReleaseOptions {
            watermark,
            ..Default::default()
        })
        .await
    }

    /// [`Lease::release`] with a signed time for the watermark and metadata
    /// (`unsettled` and `settled_through` are filled in from what the
    /// lease knows, and only ever raised).
    pub async fn release_with(mut self, mut options: ReleaseOptions) -> Result<Micros> {
        if let (Some(given), Some(written)) = (options.watermark, self.written().max_written)
            && given < written
        {
            return Err(Error::WatermarkBelowWritten { given, written });
        }
        // Stop renewing first, so no renewal races the release.
        if let Some(cancel) = &self.cancel {
            cancel.cancel();
        }
        if let Some(task) = self.renewer.take() {
            let _ = task.await;
        }
        // No new writes; then wait for those in flight to return. Only a
        // subscriber (a writer's rights, a watcher of the state) needs to
        // be woken, and nobody can subscribe now: the handle is ours.
        let watched = self.shared.state.receiver_count() > 0;
        self.shared.state.send_if_modified(|s| {
            s.released = true;
            watched
        });
        let written = match self.shared.ledger.get() {
            Some(ledger) => ledger.close().await,
            None => WriteSummary::default(),
        };
        let full = self.shared.state.borrow().mode == Mode::Full;
        // A tentative lease had no right to write: it says 0.
        options.watermark = options.watermark.max(written.max_written).filter(|_| full);
        options.unsettled |= written.uncertain;
        let settled = self.shared.settled_through.load(Ordering::SeqCst);
        options.settled_through = options
            .settled_through
            .max((settled > 0).then(|| Micros::from_micros(settled)));
        if full {
            options.inherited = Some(crate::types::Inherited {
                watermark: self.min_timestamp(),
                unsettled_until: self.close_before_reading(),
            });
        }
        let s = &self.shared;
        s.backend.release_lease(&s.lease, options).await
    }
}

/// See [`Lease::rights`].
#[derive(Debug)]
struct LeaseRights {
    min_timestamp: Micros,
    state: watch::Receiver<LeaseState>,
    ledger: Arc<WriteLedger>,
    holder: Arc<bagel_proto::Signer>,
}

impl WriteRights for LeaseRights {
    fn snapshot(&self) -> std::result::Result<RightsSnapshot, String> {
        let s = self.state.borrow();
        if let Some(reason) = &s.lost {
            return Err(format!("the lease was lost: {reason}"));
        }
        if s.released {
            return Err("the lease is released".into());
        }
        if s.mode != Mode::Full {
            return Err("the lease is tentative: upgrade it first".into());
        }
        if s.valid_until.is_some_and(|until| Instant::now() >= until) {
            return Err(format!(
                "the lease ran out of time: its deadline {} has passed by the monotonic clock since \
                 the request was sent, whatever the local wall clock says",
                s.deadline
            ));
        }
        Ok(RightsSnapshot {
            min_timestamp: self.min_timestamp,
            deadline: s.deadline,
            witnesses: s.witnesses.iter().map(|w| w.0.clone()).collect(),
            holder_keys: vec![(*self.holder).clone()],
        })
    }

    fn ledger(&self) -> Option<Arc<WriteLedger>> {
        Some(Arc::clone(&self.ledger))
    }
}

/// Renews for the lease's TTL, counted by the backend from its own clock
/// (a server's, at the renewal), so a local clock that is off does not
/// shorten or stretch what each renewal gives.
async fn renew_once(shared: &Shared, metadata: Option<Metadata>) -> Result<Micros> {
    let sent = Instant::now();
    let r = shared
        .backend
        .renew_lease_ttl(&shared.lease, shared.ttl, metadata)
        .await?;
    let deadline = r.deadline;
    shared
        .state
        .send_modify(|s| s.adopt(r.deadline, r.mode, r.witnesses, sent));
    Ok(deadline)
}

/// Renews every `renew_every` until cancelled or lost. A retryable failure
/// is retried quickly until the safety margin before the deadline; any
/// other failure, or running out of time, marks the lease lost.
async fn renew_loop(shared: Arc<Shared>, cancel: CancellationToken) {
    let every = shared
        .options
        .renew_every
        .unwrap_or(shared.ttl / 3)
        .max(Duration::from_millis(1));
    let retry = (every / 10).clamp(Duration::from_millis(1), Duration::from_millis(200));
    // Renew within a third of what is left, when that is less than the
    // period: a grant counted from a long wait's start may leave less than
    // the TTL (see `Lease::reanchor`).
    let due = |shared: &Shared| {
        let left = shared.state.borrow().time_left(shared.backend.clock().now());
        every.min(left / 3).max(Duration::from_millis(1))
    };
    let mut next = due(&shared);
    loop {
        tokio::select! {
            () = tokio::time::sleep(next) => {}
            () = cancel.cancelled() => return,
        }
        // A renewal that hangs (a server or store that stopped answering,
        // a client library retrying inside the call) must not push the
        // loss past the deadline: the holder has to hear of it in time to
        // stop. So the call is raced against the instant the lease runs
        // out of time (the deadline itself when already inside the margin).
        let bound = {
            let left = shared.state.borrow().time_left(shared.backend.clock().now());
            let margin = shared.options.safety_margin;
            if left > margin { left - margin } else { left }
        };
        let outcome = tokio::select! {
            biased;
            r = renew_once(&shared, None) => r,
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(bound) => Err(Error::Unavailable {
                message: format!("the renewal got no answer within {bound:?}, the time left"),
                retry_after: None,
            }),
        };
        match outcome {
            Ok(_) => next = due(&shared),
            Err(e) => {
                let (deadline, left) = {
                    let s = shared.state.borrow();
                    (s.deadline, s.time_left(shared.backend.clock().now()))
                };
                let out_of_time = left <= shared.options.safety_margin;
                if !e.is_retryable() || out_of_time {
                    let reason = if e.is_retryable() {
                        LossReason::OutOfTime {
                            deadline,
                            last_error: e.to_string(),
                        }
                    } else {
                        LossReason::Refused { error: e.to_string() }
                    };
                    tracing::warn!(lease = %shared.lease.id, %reason, "lease lost");
                    shared.state.send_modify(|s| s.lost = Some(reason));
                    return;
                }
                tracing::debug!(lease = %shared.lease.id, error = %e, "renewal failed; retrying");
                next = retry;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    fn state(deadline: u64, mode: Mode, tag: u8) -> LeaseState {
        LeaseState {
            deadline: Micros::from_micros(deadline),
            mode,
            witnesses: witness(tag),
            valid_until: None,
            lost: None,
            released: false,
        }
    }

    fn witness(tag: u8) -> Vec<Witness> {
        vec![Witness::from_parts(vec![tag], Vec::new(), String::new(), None)]
    }

    /// A backend that answers with a clock and records what each release
    /// said (the handles under test never renew).
    #[derive(Debug)]
    struct ReleaseRecorder {
        clock: Arc<dyn bagel_proto::clock::Clock>,
        released: std::sync::Mutex<Vec<ReleaseOptions>>,
    }

    impl ReleaseRecorder {
        fn new(clock: Arc<dyn bagel_proto::clock::Clock>) -> Self {
            ReleaseRecorder {
                clock,
                released: Default::default(),
            }
        }
    }

    #[async_trait::async_trait]
    impl LeaseBackend for ReleaseRecorder {
        fn location(&self) -> String {
            "test".into()
        }
        fn clock(&self) -> Arc<dyn bagel_proto::clock::Clock> {
            Arc::clone(&self.clock)
        }
        fn max_ttl(&self) -> Duration {
            Duration::from_secs(10)
        }
        async fn acquire_lease(&self, _: crate::backend::AcquireSpec) -> Result<Grant> {
            unreachable!()
        }
        async fn renew_lease(
            &self,
            _: &LeaseRef,
            _: Micros,
            _: Option<Metadata>,
        ) -> Result<crate::types::Renewal> {
            unreachable!()
        }
        async fn upgrade_lease(&self, _: &LeaseRef) -> Result<Grant> {
            unreachable!()
        }
        async fn release_lease(&self, _: &LeaseRef, options: ReleaseOptions) -> Result<Micros> {
            self.released.lock().unwrap().push(options);
            Ok(Micros::ZERO)
        }
    }

    const SERVER_NOW: u64 = 1_800_000_000_000_000;

    /// A lease granted at `SERVER_NOW` (the witness's issue time) for 5 s,
    /// its request sent `ago`, held by a client whose wall clock is 2 s
    /// behind the server's.
    fn granted_to_a_slow_clock(ago: Duration) -> Lease {
        let deadline = SERVER_NOW + 5_000_000;
        let body = bagel_proto::pb::WitnessBody {
            lease_id: "l".into(),
            deadline_us: deadline,
            issued_at_us: SERVER_NOW,
            ..Default::default()
        };
        let grant = Grant {
            lease_id: "l".into(),
            token: "t".into(),
            deadline: Micros::from_micros(deadline),
            min_timestamp: Micros::ZERO,
            names: Vec::new(),
            mode: Mode::Full,
            witnesses: vec![Witness::from_parts(
                body.encode_to_vec(),
                Vec::new(),
                String::new(),
                None,
            )],
            servers: Vec::new(),
        };
        // The true time now is the server's issue time plus `ago` (the
        // answer came back at once); the local clock reads 2 s less.
        let local = Micros::from_micros(SERVER_NOW)
            .saturating_add(ago)
            .saturating_sub(Duration::from_secs(2));
        let clock = Arc::new(bagel_proto::clock::ManualClock::new(local));
        let sent = Instant::now()
            .checked_sub(ago)
            .expect("the monotonic clock runs that long");
        let left = crate::ttl_check::left_at_grant(&grant.witnesses);
        Lease::start(
            Arc::new(ReleaseRecorder::new(clock)),
            grant,
            sent,
            left,
            Duration::from_secs(5),
            LeaseOptions::default().with_auto_renew(false),
            std::sync::Arc::new(bagel_proto::Signer::generate()),
        )
    }

    #[test]
    fn a_wall_clock_behind_does_not_stretch_validity_past_what_the_monotonic_clock_measured() {
        // 4.6 s after the request left, 0.4 s of the 5 s are left: below
        // the 0.5 s margin. The slow wall clock still sees 2.4 s.
        let lease = granted_to_a_slow_clock(Duration::from_millis(4600));
        let wall_left = lease
            .deadline()
            .duration_since(lease.shared.backend.clock().now());
        assert_eq!(
            wall_left,
            Duration::from_millis(2400),
            "the wall clock alone would say valid"
        );
        assert!(!lease.is_valid(), "invalid by the monotonic measure");
        assert!(
            lease.time_left() <= Duration::from_millis(400),
            "{:?}",
            lease.time_left()
        );
        // Writers may still write until the monotonic deadline itself.
        assert!(lease.rights().snapshot().is_ok());

        // 1 s after the request: valid on both clocks.
        let lease = granted_to_a_slow_clock(Duration::from_secs(1));
        assert!(lease.is_valid());
        assert!(lease.time_left() <= Duration::from_secs(4));
    }

    #[test]
    fn past_the_monotonic_deadline_a_writer_gets_no_rights() {
        // 5.5 s after the request: the server's deadline has passed, the
        // slow wall clock sees 1.5 s left.
        let lease = granted_to_a_slow_clock(Duration::from_millis(5500));
        assert_eq!(lease.time_left(), Duration::ZERO);
        let e = lease.rights().snapshot().unwrap_err();
        assert!(e.contains("ran out of time"), "{e}");
    }

    /// A witness of `deadline` issued at `issued` (µs).
    fn timed(deadline: u64, issued: u64) -> Vec<Witness> {
        let body = bagel_proto::pb::WitnessBody {
            deadline_us: deadline,
            issued_at_us: issued,
            ..Default::default()
        };
        vec![Witness::from_parts(
            body.encode_to_vec(),
            Vec::new(),
            String::new(),
            None,
        )]
    }

    /// A renewal the server could not extend (it answers the deadline held)
    /// still restarts the count from its own send: before, an answer that
    /// did not rank higher was dropped whole, and a standby 300 ms behind
    /// the server was fenced right after a long wait.
    #[test]
    fn an_equal_answer_sent_later_restarts_the_count() {
        let long_ago = Instant::now()
            .checked_sub(Duration::from_secs(9))
            .expect("the monotonic clock runs that long");
        let mut s = state(10_000_000, Mode::Full, 0);
        s.valid_until = valid_until(&timed(10_000_000, 1), long_ago);
        let before = s.valid_until.unwrap();
        let now = Instant::now();
        // Same deadline, issued 2 s before it, sent now.
        s.adopt(
            Micros::from_micros(10_000_000),
            Mode::Full,
            timed(10_000_000, 8_000_000),
            now,
        );
        assert_eq!(s.valid_until, Some(now + Duration::from_secs(2)));
        assert!(s.valid_until.unwrap() < before + Duration::from_secs(60));
        // An answer counting less never shortens it.
        s.adopt(
            Micros::from_micros(10_000_000),
            Mode::Full,
            timed(10_000_000, 9_000_000),
            long_ago,
        );
        assert_eq!(s.valid_until, Some(now + Duration::from_secs(2)));
    }

    #[test]
    fn a_late_lesser_answer_never_replaces_the_witness_of_a_greater_one() {
        let mut s = state(100, Mode::Full, 0);
        // Two renewals in flight: the later deadline's answer lands first.
        s.adopt(Micros::from_micros(300), Mode::Full, witness(3), Instant::now());
        s.adopt(Micros::from_micros(200), Mode::Full, witness(2), Instant::now());
        assert_eq!((s.deadline.as_micros(), s.witnesses[0].body()[0]), (300, 3));
    }

    #[test]
    fn an_upgrade_outranks_a_tentative_renewal_and_is_never_undone() {
        let mut s = state(100, Mode::Tentative, 0);
        // A renewal of the tentative lease and the upgrade race; the
        // server signs the upgrade with the current deadline, so the
        // tentative answer can say at most as much.
        s.adopt(Micros::from_micros(200), Mode::Full, witness(1), Instant::now());
        s.adopt(
            Micros::from_micros(200),
            Mode::Tentative,
            witness(2),
            Instant::now(),
        );
        assert_eq!((s.mode, s.witnesses[0].body()[0]), (Mode::Full, 1));
        // A full renewal with a later deadline moves on, in one piece.
        s.adopt(Micros::from_micros(250), Mode::Full, witness(3), Instant::now());
        assert_eq!((s.deadline.as_micros(), s.witnesses[0].body()[0]), (250, 3));
    }

    /// A full lease over `backend`, not renewing.
    fn held_over(backend: &Arc<ReleaseRecorder>) -> Lease {
        let grant = Grant {
            lease_id: "l".into(),
            token: "t".into(),
            deadline: Micros::now().saturating_add(Duration::from_secs(5)),
            min_timestamp: Micros::ZERO,
            names: Vec::new(),
            mode: Mode::Full,
            witnesses: witness(1),
            servers: Vec::new(),
        };
        Lease::start(
            Arc::clone(backend) as Arc<dyn LeaseBackend>,
            grant,
            Instant::now(),
            None,
            Duration::from_secs(5),
            LeaseOptions::default().with_auto_renew(false),
            Arc::new(bagel_proto::Signer::generate()),
        )
    }

    /// The write ledger is made by the first rights handed out: a lease
    /// that never had writers releases without one, saying nothing was
    /// written; one whose writer registered a record releases with that
    /// record's timestamp as its watermark, as before the ledger was lazy.
    #[tokio::test]
    async fn only_a_lease_with_writers_keeps_a_ledger_and_its_release_says_what_they_wrote() {
        let backend = Arc::new(ReleaseRecorder::new(Arc::new(bagel_proto::clock::SystemClock)));
        let lease = held_over(&backend);
        assert!(lease.shared.ledger.get().is_none());
        assert_eq!(lease.written(), WriteSummary::default());
        lease.release(None).await.unwrap();

        let lease = held_over(&backend);
        let rights = lease.rights();
        let ledger = rights.ledger().expect("a lease's rights keep its ledger");
        ledger.begin(Micros::from_micros(42)).expect("open").settled();
        assert_eq!(lease.written().max_written, Some(Micros::from_micros(42)));
        lease.release(None).await.unwrap();
        // The writer's rights see the release.
        assert!(rights.snapshot().is_err());

        let said: Vec<_> = backend
            .released
            .lock()
            .unwrap()
            .iter()
            .map(|o| (o.watermark, o.unsettled))
            .collect();
        assert_eq!(said, [(None, false), (Some(Micros::from_micros(42)), false)]);
    }
}
