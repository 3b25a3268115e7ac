//! [`MemoryLeaseBackend`]: leases in one process's memory. A test backend,
//! and the smallest one that passes the lease conformance suite
//! (`tests/tests/lease_conformance.rs`): the example a new backend copies.
//!
//! # What a backend owes the lease core
//!
//! A backend is a type implementing [`LeaseBackend`]. Everything above it
//! (the `Lease` handle and its background renewal, loss notification,
//! write rights, `AcquireBuilder`, waits of any length) is written once in
//! `bagel-lease-core` and relies on the backend for this:
//!
//! * **All or none.** `acquire_lease` takes every name of the spec or none,
//!   and no other operation sees half of it (here: one mutex; on S3:
//!   conditional writes, put back on failure; on a server: its table).
//! * **Each name's chain.** Every grant of a name gets a fencing token
//!   above all earlier ones, and inherits a [`Previous`]: the last full
//!   holder's lease id, its watermark (a released lease's published one, a
//!   broken lease's deadline), how it ended, and whether bags below the
//!   watermark may still change (`unsettled_until`, carried on until a
//!   holder says it closed them). A tentative holder could not write: it
//!   leaves no trace. The grant's `min_timestamp` is the highest inherited
//!   watermark.
//! * **Witnesses.** Every grant, upgrade and renewal carries a signed
//!   `WitnessBody` stating it ([`bagel_proto::sign_witness`]), and
//!   `trusted_keys` returns the keys that verify them: bag writers cite
//!   them, readers and the audit check them. The handle also reads each
//!   witness's `deadline_us - issued_at_us` to bound validity on the
//!   monotonic clock, so `issued_at_us` must be the real time of the grant.
//! * **Errors that say what happened**, as [`Error`]'s variants, because
//!   the handle acts on them: [`Error::Busy`] with the [`Conflict`] (who,
//!   which mode, until when) is retried and waited on; [`Error::NotHeld`]
//!   ends the lease (its message says `expired` when it did);
//!   [`Error::Invalid`] and [`Error::OutOfRange`] name the field, and
//!   [`Error::WaitTooLong`] carries the max wait that a long wait is cut
//!   into rounds of.
//! * **A clock and limits**: `clock` is what TTLs count on and what the
//!   handle judges validity by; `max_ttl` is the default TTL; `max_wait`
//!   cuts long waits into rounds. The request's values are checked by
//!   [`LeaseLimits`], the rules the server and every backend check them
//!   by.
//!
//! Which items of the trait matter: the four lease operations, `clock` and
//! `max_ttl` have no default. `max_wait`, `describe`, `history`,
//! `trusted_keys` and `info` do (unknown, or "unsupported"), but the
//! conformance suite uses all of them except `info`, and the CLI all.
//! The operator's calls not every backend answers (`list_names`,
//! `watch_names`, `route_name`) are refused by default; `offers` states
//! which a backend answers and `describe_self` names it in the refusal.
//! This one lists and routes (every name here), and does not watch.
//!
//! # How this one is built
//!
//! One `Mutex<HashMap<name, NameRecord>>`. Each operation checks its input,
//! locks the map, decides with the rules below (pure functions of a record,
//! the request and `now`, the shape of the server's `table` and of the S3
//! backend's `rules`), changes every name or none, unlocks, and signs the
//! witness. Leases are found by their names (the [`LeaseRef`]'s, as the S3
//! store finds them), so there is no second map to keep in step. An expired
//! holder stays in its record until the next grant turns it into the
//! previous lease: expiry is a matter of `now`, not an event to sweep.
//! Witnesses are signed with this backend's own key over its own clock's
//! time, marked `self_timed` like the S3 backend's unsafe local clock mode:
//! in one process there is nobody else to vouch for either.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bagel_lease_core::backend::{Call, Listed, ListedAt, Listing, NameRoute, Offer};
use bagel_lease_core::chain::{self, Admission, HolderView};
use bagel_lease_core::{
    AcquireSpec, BackendInfo, Conflict, Ended, Error, Grant, History, HistoryEntry, HistoryEvent, Holder,
    LeaseBackend, LeaseLimits, LeaseRef, ListedName, Metadata, Micros, Mode, NameGrant, NameState,
    NotHeldReason, Previous, ReleaseOptions, Renewal, Result, StoreInfo, Witness,
};
use bagel_proto::clock::Clock;
use bagel_proto::names::name_problem;
use bagel_proto::{KeyRing, Signer, pb, sign_local_time, sign_witness};
use tokio::sync::Notify;
use tokio::time::Instant;

/// What the backend accepts. Defaults: the server's limits, and a minimum
/// TTL short enough for the suite's 300 ms leases.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MemoryLimits {
    /// What a request may ask for, checked by the rules every backend
    /// checks it by.
    pub lease: LeaseLimits,
    /// How far a release's watermark may be ahead of the time it is
    /// checked against (its signed time, else this backend's clock).
    pub timestamp_tolerance: Duration,
    /// Renewals with metadata and releases kept per name.
    pub history_per_name: usize,
}

impl Default for MemoryLimits {
    fn default() -> Self {
        MemoryLimits {
            lease: LeaseLimits::default(),
            timestamp_tolerance: Duration::from_secs(1),
            history_per_name: 8,
        }
    }
}

/// One name's state.
struct NameRecord {
    /// The last fencing token granted.
    fencing_token: u64,
    /// The current holder, possibly past its deadline.
    holder: Option<HolderRecord>,
    /// The lease before `holder` (the last one, when nobody holds it).
    previous: Previous,
    /// Oldest first, at most `history_per_name`.
    history: VecDeque<HistoryEntry>,
    /// Older entries were dropped.
    history_truncated: bool,
}

/// A lease as each of its names keeps it.
#[derive(Clone)]
struct HolderRecord {
    lease_id: String,
    /// Proves the holder on renew, upgrade and release.
    token: String,
    owner: String,
    mode: Mode,
    deadline: Micros,
    granted_at: Micros,
    /// As the acquire gave it, stated in every witness of the lease: a
    /// renewer (who may hold only the token) cannot swap in its own key.
    holder_key: Option<[u8; 32]>,
}

impl HolderRecord {
    /// The holder as the lease-chain rule sees it.
    fn view(&self) -> HolderView {
        HolderView {
            mode: self.mode,
            deadline: self.deadline,
            expired: false,
        }
    }
}

// --- the rules: pure functions of (record, request, now) -------------------

/// What the first holder of a name inherits: nothing.
fn nothing_before() -> Previous {
    Previous {
        lease_id: None,
        watermark: Micros::ZERO,
        ended: Ended::None,
        ended_at: Micros::ZERO,
        unsettled_until: None,
        granted_at: None,
    }
}

impl NameRecord {
    fn new() -> Self {
        NameRecord {
            fencing_token: 0,
            holder: None,
            previous: nothing_before(),
            history: VecDeque::new(),
            history_truncated: false,
        }
    }

    /// The holder, while its deadline is ahead of `now`.
    fn live_holder(&self, now: Micros) -> Option<&HolderRecord> {
        self.holder.as_ref().filter(|h| now < h.deadline)
    }

    /// What a grant at `now` inherits when it replaces the holder (expired,
    /// or tentative). A full holder is *broken*: it may have written
    /// anything below its deadline, so the deadline becomes the watermark,
    /// and writes may still be in flight, so its bags are unsettled. A
    /// tentative holder could not write and leaves no trace.
    fn inherit(&self, now: Micros) -> Previous {
        let handoff = chain::handoff(
            self.previous.watermark,
            self.holder.as_ref().map(HolderRecord::view),
        );
        match &self.holder {
            Some(h) if handoff.broken => {
                let watermark = handoff.watermark;
                Previous {
                    lease_id: Some(h.lease_id.clone()),
                    watermark,
                    ended: Ended::Broken,
                    ended_at: now,
                    unsettled_until: Some(watermark.next()),
                    granted_at: Some(h.granted_at),
                }
            }
            _ => self.previous.clone(),
        }
    }
}

/// Whether `name` can be taken in `mode` at `now`: what the grant inherits,
/// or who holds it. A live holder refuses, except that a full acquire
/// breaks a tentative one.
fn decide(name: &str, rec: &NameRecord, mode: Mode, now: Micros) -> Result<Previous, Box<Conflict>> {
    match (
        chain::admit(rec.holder.as_ref().map(HolderRecord::view), mode, now),
        &rec.holder,
    ) {
        (Admission::Refused, Some(h)) => Err(Box::new(Conflict {
            name: name.to_owned(),
            holder_lease_id: h.lease_id.clone(),
            holder_owner: h.owner.clone(),
            holder_mode: h.mode,
            holder_deadline: h.deadline,
            server: None,
        })),
        _ => Ok(rec.inherit(now)),
    }
}

/// The holder of `name` if it is `lease` (by id and token) and its deadline
/// is ahead of `now`; otherwise why not. An expired lease can no longer be
/// renewed, upgraded or released, even if nobody took its names yet.
fn held<'a>(
    rec: Option<&'a NameRecord>,
    name: &str,
    lease: &LeaseRef,
    now: Micros,
) -> Result<&'a HolderRecord> {
    let id = &lease.id;
    let Some(rec) = rec else {
        return Err(Error::not_held(
            NotHeldReason::Gone,
            format!("lease_id: unknown lease {id}: name {name:?} was never leased here"),
        ));
    };
    match &rec.holder {
        Some(h) if h.lease_id == *id => {
            if h.token != lease.token {
                return Err(Error::not_held(
                    NotHeldReason::NotYours,
                    format!("token: does not match lease {id}"),
                ));
            }
            if now >= h.deadline {
                return Err(Error::not_held(
                    NotHeldReason::Ended,
                    format!(
                        "lease {id} expired at {}; it can no longer be renewed, upgraded or released",
                        h.deadline
                    ),
                ));
            }
            Ok(h)
        }
        other => Err(gone(rec, other.as_ref(), name, id)),
    }
}

/// Why lease `id` no longer holds `name`: released, broken after it
/// expired, taken over, or unknown.
fn gone(rec: &NameRecord, holder: Option<&HolderRecord>, name: &str, id: &str) -> Error {
    let prev = &rec.previous;
    if prev.lease_id.as_deref() == Some(id) {
        return match prev.ended {
            Ended::Released => Error::not_held(
                NotHeldReason::Gone,
                format!("lease_id: lease {id} was released at {}", prev.ended_at),
            ),
            _ => Error::not_held(
                NotHeldReason::Ended,
                format!(
                    "lease {id} expired at {} and was broken on name {name:?}; it can no longer be renewed, \
                     upgraded or released",
                    prev.watermark
                ),
            ),
        };
    }
    match holder {
        Some(h) => Error::not_held(
            NotHeldReason::Ended,
            format!(
                "lease {id} lost name {name:?}: lease {} (owner {:?}) holds it now",
                h.lease_id, h.owner
            ),
        ),
        None => Error::not_held(
            NotHeldReason::Gone,
            format!("lease_id: unknown lease {id} on name {name:?} (released, broken, or never granted)"),
        ),
    }
}

/// What the next holder inherits from full lease `h` released at `now`
/// over `previous` (what `h` inherited). A stored watermark never goes
/// down. What is unsettled travels on: the next holder must close bags
/// through the watermark if this holder had writes of unknown outcome, or
/// inherited unsettled bags and did not close them.
fn released(previous: &Previous, h: &HolderRecord, options: &ReleaseOptions, now: Micros) -> Previous {
    let watermark = previous.watermark.max(options.watermark.unwrap_or(Micros::ZERO));
    let inherited_open = previous
        .unsettled_until
        .is_some_and(|until| options.settled_through.is_none_or(|s| s < until));
    Previous {
        lease_id: Some(h.lease_id.clone()),
        watermark,
        ended: Ended::Released,
        ended_at: now,
        unsettled_until: (options.unsettled || inherited_open).then(|| watermark.next()),
        granted_at: Some(h.granted_at),
    }
}

/// A release's watermark against lease `h`: below its deadline (the next
/// holder writes above it), and 0 for a tentative lease (it could not
/// write).
fn check_release(h: &HolderRecord, watermark: Micros) -> Result<()> {
    if watermark >= h.deadline {
        return Err(Error::out_of_range(
            "watermark_us",
            format!(
                "{} must be below the lease deadline {} ({})",
                watermark.as_micros(),
                h.deadline.as_micros(),
                h.deadline
            ),
        ));
    }
    if h.mode == Mode::Tentative && watermark != Micros::ZERO {
        return Err(Error::invalid(
            "watermark_us",
            "must be 0 when releasing a tentative lease: it had no right to write",
        ));
    }
    Ok(())
}

/// Appends to a name's history, dropping the oldest beyond `keep`.
fn push_history(rec: &mut NameRecord, entry: HistoryEntry, keep: usize) {
    if keep == 0 {
        return;
    }
    rec.history.push_back(entry);
    while rec.history.len() > keep {
        rec.history.pop_front();
        rec.history_truncated = true;
    }
}

// --- the request's values, checked by the rules every backend shares --------

/// A lease's names, checked and sorted: every acquirer takes names in one
/// fixed order, and witnesses list them in it.
fn check_names(raw: &[String], limits: &LeaseLimits) -> Result<Vec<String>> {
    Ok(limits
        .check_names("names", raw)?
        .into_iter()
        .map(str::to_owned)
        .collect())
}

fn check_metadata(metadata: Option<&Metadata>, limits: &LeaseLimits) -> Result<()> {
    match metadata {
        Some(Metadata::Data(d)) => Ok(limits.check_metadata_bytes(d.len())?),
        _ => Ok(()),
    }
}

// --- the backend ------------------------------------------------------------

/// Leases in memory, behind the same `Lease` handle as a server's. Cheap to
/// share behind an `Arc`; gone when dropped.
pub struct MemoryLeaseBackend {
    /// `memory://<random>`: names this backend in witnesses (`server_id`)
    /// and lease files.
    location: String,
    clock: Arc<dyn Clock>,
    /// Signs every witness and the time in it.
    signer: Signer,
    limits: MemoryLimits,
    names: Mutex<HashMap<String, NameRecord>>,
    /// Woken by every release, for acquires waiting on a busy name.
    freed: Notify,
    /// Numbers the leases: ids are unique within this backend.
    leases: AtomicU64,
}

/// Never the records: they hold the holders' tokens.
impl fmt::Debug for MemoryLeaseBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryLeaseBackend")
            .field("location", &self.location)
            .field("key_id", &self.signer.key_id())
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl MemoryLeaseBackend {
    /// A backend on `clock` with the default limits and a fresh key.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryLeaseBackend::with_limits(clock, MemoryLimits::default())
    }

    pub fn with_limits(clock: Arc<dyn Clock>, limits: MemoryLimits) -> Self {
        MemoryLeaseBackend {
            location: format!("memory://{:08x}", rand::random::<u32>()),
            clock,
            signer: Signer::generate(),
            limits,
            names: Mutex::new(HashMap::new()),
            freed: Notify::new(),
            leases: AtomicU64::new(0),
        }
    }

    /// The id of the key that signs this backend's witnesses.
    pub fn key_id(&self) -> &str {
        self.signer.key_id()
    }

    pub fn limits(&self) -> &MemoryLimits {
        &self.limits
    }

    /// The records. Never held across an `.await`; a panic while holding
    /// it is a bug in a rule, and the tests should see it.
    fn lock(&self) -> MutexGuard<'_, HashMap<String, NameRecord>> {
        self.names
            .lock()
            .expect("a lease rule panicked while holding the lock")
    }

    /// A lease's names, checked and sorted: this backend finds leases by
    /// name.
    fn names_of(&self, lease: &LeaseRef) -> Result<Vec<String>> {
        if lease.names.is_empty() {
            return Err(Error::invalid(
                "names",
                format!(
                    "the memory lease backend finds lease {} by its names; give them (the lease file \
                     has them)",
                    lease.id
                ),
            ));
        }
        check_names(&lease.names, &self.limits.lease)
    }

    /// One try at taking every name of `spec` at `now`: all, or none and
    /// why (`Busy` naming the first name held).
    fn try_acquire(&self, names: &[String], spec: &AcquireSpec, now: Micros) -> Result<Grant> {
        // A TTL counts from the grant, so time spent waiting for a busy
        // name is not taken off the lease.
        let deadline = spec.ttl.map_or(spec.deadline, |ttl| now.saturating_add(ttl));
        self.limits.lease.check_deadline(deadline, now)?;
        let mut records = self.lock();
        let fresh = NameRecord::new();
        let inherited = names
            .iter()
            .map(|name| {
                let rec = records.get(name).unwrap_or(&fresh);
                decide(name, rec, spec.mode, now).map_err(|c| busy(*c))
            })
            .collect::<Result<Vec<_>>>()?;
        // Every name can be taken: take them all.
        let holder = HolderRecord {
            lease_id: format!("mem-{}", self.leases.fetch_add(1, Ordering::Relaxed) + 1),
            token: format!("{:032x}", rand::random::<u128>()),
            owner: spec.owner.clone(),
            mode: spec.mode,
            deadline,
            granted_at: now,
            holder_key: spec.holder_key,
        };
        let grants: Vec<NameGrant> = names
            .iter()
            .zip(inherited)
            .map(|(name, previous)| {
                let rec = records.entry(name.clone()).or_insert_with(NameRecord::new);
                rec.fencing_token += 1;
                rec.holder = Some(holder.clone());
                rec.previous = previous.clone();
                NameGrant {
                    name: name.clone(),
                    fencing_token: rec.fencing_token,
                    previous,
                }
            })
            .collect();
        drop(records);
        let min_timestamp = min_timestamp(&grants);
        Ok(Grant {
            witnesses: vec![self.witness(pb::WitnessKind::Acquire, &holder, &grants, now)],
            lease_id: holder.lease_id,
            token: holder.token,
            deadline,
            min_timestamp,
            names: grants,
            mode: spec.mode,
            servers: Vec::new(),
        })
    }

    /// Applies `change` to the record of each of `names`, all held by
    /// `lease` at `now` and passing `check` (all checked first, so a
    /// refusal changes nothing). Returns the holder after the change (none
    /// after a release) and each name's token and previous lease, for the
    /// witness.
    fn change_held(
        &self,
        names: &[String],
        lease: &LeaseRef,
        now: Micros,
        check: impl Fn(&HolderRecord) -> Result<()>,
        mut change: impl FnMut(&mut NameRecord),
    ) -> Result<(Option<HolderRecord>, Vec<NameGrant>)> {
        let mut records = self.lock();
        for name in names {
            check(held(records.get(name), name, lease, now)?)?;
        }
        let mut holder = None;
        let mut grants = Vec::with_capacity(names.len());
        for name in names {
            let rec = records.get_mut(name).expect("held, checked above");
            change(rec);
            holder = rec.holder.clone();
            grants.push(NameGrant {
                name: name.clone(),
                fencing_token: rec.fencing_token,
                previous: rec.previous.clone(),
            });
        }
        Ok((holder, grants))
    }

    /// The signed statement of lease `h` on `names` as of `now`.
    fn witness(&self, kind: pb::WitnessKind, h: &HolderRecord, names: &[NameGrant], now: Micros) -> Witness {
        let body = pb::WitnessBody {
            lease_id: h.lease_id.clone(),
            names: names
                .iter()
                .map(|n| pb::WitnessName {
                    name: n.name.clone(),
                    fencing_token: n.fencing_token,
                    previous: Some(pb::PreviousLease::from(&n.previous)),
                })
                .collect(),
            owner: h.owner.clone(),
            mode: pb::Mode::from(h.mode).into(),
            kind: kind.into(),
            deadline_us: h.deadline.as_micros(),
            min_timestamp_us: min_timestamp(names).as_micros(),
            issued_at_us: now.as_micros(),
            // This backend's clock, signed by itself (radius 0: the clock
            // is taken as exact), and said to be so.
            signed_time: Some(sign_local_time(&self.signer, &self.location, now, 0)),
            self_timed: true,
            server_id: self.location.clone(),
            epoch_us: 0,
            holder_key: h.holder_key.map_or_else(Vec::new, |k| k.to_vec()),
        };
        sign_witness(&self.signer, &body).into()
    }
}

/// A history entry of lease `h` at `now`.
fn history_entry(
    h: &HolderRecord,
    event: HistoryEvent,
    now: Micros,
    watermark: Micros,
    metadata: Option<Metadata>,
) -> HistoryEntry {
    HistoryEntry {
        lease_id: h.lease_id.clone(),
        owner: h.owner.clone(),
        event,
        at: now,
        watermark,
        metadata,
    }
}

/// Every message under a lease is above every watermark it inherited:
/// the highest of its names' previous watermarks.
fn min_timestamp(names: &[NameGrant]) -> Micros {
    names
        .iter()
        .map(|n| n.previous.watermark)
        .max()
        .unwrap_or(Micros::ZERO)
}

fn busy(c: Conflict) -> Error {
    Error::Busy {
        message: format!(
            "name {:?} is held by lease {} (owner {:?}, {}) until {} ({} us)",
            c.name,
            c.holder_lease_id,
            c.holder_owner,
            c.holder_mode.as_str(),
            c.holder_deadline,
            c.holder_deadline.as_micros()
        ),
        conflict: Some(Box::new(c)),
    }
}

#[async_trait]
impl LeaseBackend for MemoryLeaseBackend {
    fn location(&self) -> String {
        self.location.clone()
    }

    fn describe_self(&self) -> String {
        format!("the in-memory lease backend {}", self.location)
    }

    /// Lists (the records are at hand), but sends no change notifications.
    fn offers(&self, call: Call) -> Offer {
        match call {
            Call::List => Offer::Yes,
            Call::Watch => Offer::No {
                why: Some("it sends no change notifications".into()),
            },
        }
    }

    /// The live holders, in name order; no revisions (0): nothing watches.
    async fn list_names(&self, prefix: &str, limit: usize) -> Result<Listing> {
        let now = self.clock.now();
        let records = self.lock();
        let mut names: Vec<Listed> = records
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .filter_map(|(name, rec)| {
                let h = rec.live_holder(now)?;
                let holder = Holder {
                    lease_id: h.lease_id.clone(),
                    owner: h.owner.clone(),
                    mode: h.mode,
                    deadline: h.deadline,
                    fencing_token: rec.fencing_token,
                    granted_at: h.granted_at,
                };
                Some(Listed {
                    server: None,
                    name: ListedName {
                        name: name.clone(),
                        holder,
                    },
                })
            })
            .collect();
        names.sort_by(|a, b| a.name.name.cmp(&b.name.name));
        names.truncate(limit);
        Ok(Listing {
            names,
            revisions: vec![ListedAt {
                server: None,
                revision: 0,
            }],
        })
    }

    /// Every name here, with no server: a lease store.
    fn route_name(&self, _name: &str) -> Result<NameRoute> {
        Ok(NameRoute::Store(self.location.clone()))
    }

    /// What the next holder of each name would find now: a live holder,
    /// and what a grant would inherit (an expired full holder as broken).
    async fn describe(&self, names: &[String]) -> Result<Vec<NameState>> {
        for (i, name) in names.iter().enumerate() {
            if let Some(why) = name_problem(name, self.limits.lease.max_name_bytes) {
                return Err(Error::invalid("names", format!("[{i}] {why}")));
            }
        }
        let now = self.clock.now();
        let records = self.lock();
        Ok(names
            .iter()
            .map(|name| match records.get(name) {
                None => NameState {
                    name: name.clone(),
                    holder: None,
                    previous: nothing_before(),
                    fencing_token: 0,
                    known: false,
                },
                Some(rec) => {
                    let live = rec.live_holder(now);
                    NameState {
                        name: name.clone(),
                        holder: live.map(|h| Holder {
                            lease_id: h.lease_id.clone(),
                            owner: h.owner.clone(),
                            mode: h.mode,
                            deadline: h.deadline,
                            fencing_token: rec.fencing_token,
                            granted_at: h.granted_at,
                        }),
                        previous: live.map_or_else(|| rec.inherit(now), |_| rec.previous.clone()),
                        fencing_token: rec.fencing_token,
                        known: true,
                    }
                }
            })
            .collect())
    }

    async fn history(&self, name: &str) -> Result<History> {
        check_names(&[name.to_owned()], &self.limits.lease)?;
        Ok(self
            .lock()
            .get(name)
            .map_or_else(History::default, |rec| History {
                entries: rec.history.iter().cloned().collect(),
                truncated: rec.history_truncated,
            }))
    }

    async fn trusted_keys(&self) -> Result<KeyRing> {
        Ok([self.signer.verifying_key()].into_iter().collect())
    }

    /// There is no server: the limits and the one key.
    async fn info(&self) -> Result<BackendInfo> {
        Ok(BackendInfo::Store(StoreInfo {
            location: self.location(),
            key_id: self.key_id().to_owned(),
            min_ttl: self.limits.lease.min_ttl,
            max_ttl: self.limits.lease.max_ttl,
            max_wait: self.limits.lease.max_wait,
            // One clock decides every takeover: none is needed.
            clock_margin: Duration::ZERO,
            keys: self.trusted_keys().await?,
        }))
    }

    fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.clock)
    }

    fn max_ttl(&self) -> Duration {
        self.limits.lease.max_ttl
    }

    fn max_wait(&self) -> Option<Duration> {
        Some(self.limits.lease.max_wait)
    }

    /// Takes every name or none. While a name is busy and the wait lasts,
    /// sleeps until a release, the holder's deadline (the name frees then
    /// by itself) or the end of the wait, whichever comes first, and tries
    /// again. The deadline is slept on the monotonic clock: with a manual
    /// clock, only a release or the end of the wait wakes a waiter.
    async fn acquire_lease(&self, spec: AcquireSpec) -> Result<Grant> {
        let names = check_names(&spec.names, &self.limits.lease)?;
        self.limits.lease.check_owner(&spec.owner)?;
        self.limits.lease.check_wait(spec.wait)?;
        let give_up = Instant::now() + spec.wait;
        loop {
            // Listen before looking: a release between the look and the
            // sleep still wakes us.
            let mut freed = pin!(self.freed.notified());
            freed.as_mut().enable();
            let now = self.clock.now();
            let err = match self.try_acquire(&names, &spec, now) {
                Ok(grant) => return Ok(grant),
                Err(e) => e,
            };
            let Some(free_at) = err.retry_after() else {
                return Err(err);
            };
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(err);
            }
            let nap = left.min(free_at.duration_since(now));
            tokio::select! {
                () = freed => {}
                () = tokio::time::sleep(nap) => {}
            }
        }
    }

    /// Extends to `deadline`, never shortening; metadata goes to the
    /// history.
    async fn renew_lease(
        &self,
        lease: &LeaseRef,
        deadline: Micros,
        metadata: Option<Metadata>,
    ) -> Result<Renewal> {
        check_metadata(metadata.as_ref(), &self.limits.lease)?;
        let names = self.names_of(lease)?;
        let now = self.clock.now();
        self.limits.lease.check_deadline(deadline, now)?;
        let keep = self.limits.history_per_name;
        let (holder, grants) = self.change_held(
            &names,
            lease,
            now,
            |_| Ok(()),
            |rec| {
                let h = rec.holder.as_mut().expect("held");
                h.deadline = h.deadline.max(deadline);
                if let Some(m) = &metadata {
                    let entry = history_entry(
                        h,
                        HistoryEvent::Renewed,
                        now,
                        rec.previous.watermark,
                        Some(m.clone()),
                    );
                    push_history(rec, entry, keep);
                }
            },
        )?;
        let holder = holder.expect("renewed, so held");
        Ok(Renewal {
            deadline: holder.deadline,
            mode: holder.mode,
            witnesses: vec![self.witness(pb::WitnessKind::Renew, &holder, &grants, now)],
        })
    }

    /// Turns the lease full on every name; refused if a full acquire broke
    /// it on any (a full lease stays full).
    async fn upgrade_lease(&self, lease: &LeaseRef) -> Result<Grant> {
        let names = self.names_of(lease)?;
        let now = self.clock.now();
        let (holder, grants) = self.change_held(
            &names,
            lease,
            now,
            |_| Ok(()),
            |rec| rec.holder.as_mut().expect("held").mode = Mode::Full,
        )?;
        let holder = holder.expect("upgraded, so held");
        Ok(Grant {
            witnesses: vec![self.witness(pb::WitnessKind::Upgrade, &holder, &grants, now)],
            lease_id: holder.lease_id,
            token: lease.token.clone(),
            deadline: holder.deadline,
            min_timestamp: min_timestamp(&grants),
            names: grants,
            mode: Mode::Full,
            servers: Vec::new(),
        })
    }

    /// Frees every name, publishing the watermark to the next holder, and
    /// wakes the waiters. `options.inherited` is for a lease held on
    /// several backends; this one carries its own chain.
    async fn release_lease(&self, lease: &LeaseRef, options: ReleaseOptions) -> Result<Micros> {
        check_metadata(options.metadata.as_ref(), &self.limits.lease)?;
        let names = self.names_of(lease)?;
        let now = self.clock.now();
        bagel_lease_core::rules::check_watermark(
            &options,
            now,
            "this backend's clock",
            self.limits.timestamp_tolerance,
        )?;
        let watermark = options.watermark.unwrap_or(Micros::ZERO);
        let keep = self.limits.history_per_name;
        let (_, grants) = self.change_held(
            &names,
            lease,
            now,
            |h| check_release(h, watermark),
            |rec| {
                let h = rec.holder.take().expect("held");
                if h.mode == Mode::Full {
                    rec.previous = released(&rec.previous, &h, &options, now);
                }
                let entry = history_entry(
                    &h,
                    HistoryEvent::Released,
                    now,
                    rec.previous.watermark,
                    options.metadata.clone(),
                );
                push_history(rec, entry, keep);
            },
        )?;
        self.freed.notify_waiters();
        // The highest watermark stored: what the next holder of all these
        // names would write above.
        Ok(min_timestamp(&grants))
    }
}

#[cfg(test)]
mod tests {
    //! Exact-time checks of what only an injected clock can show; the
    //! conformance suite covers the rest.

    use bagel_lease_core::AcquireBuilder;
    use bagel_proto::clock::ManualClock;

    use super::*;

    const T0: Micros = Micros::from_micros(1_800_000_000_000_000);

    fn backend() -> (Arc<MemoryLeaseBackend>, ManualClock) {
        let clock = ManualClock::new(T0);
        (Arc::new(MemoryLeaseBackend::new(Arc::new(clock.clone()))), clock)
    }

    fn no_renew() -> bagel_lease_core::LeaseOptions {
        bagel_lease_core::LeaseOptions::default().with_auto_renew(false)
    }

    #[tokio::test]
    async fn a_lease_is_held_until_its_deadline_and_broken_from_it() {
        let (b, clock) = backend();
        let ttl = Duration::from_secs(5);
        let a = AcquireBuilder::new(b.clone(), ["n"])
            .ttl(ttl)
            .options(no_renew())
            .send()
            .await
            .unwrap();
        assert_eq!(a.deadline(), T0.saturating_add(ttl));
        clock.set(Micros::from_micros(a.deadline().as_micros() - 1));
        let err = AcquireBuilder::new(b.clone(), ["n"]).send().await.unwrap_err();
        assert_eq!(err.retry_after(), Some(a.deadline()));
        clock.set(a.deadline());
        let next = AcquireBuilder::new(b.clone(), ["n"])
            .options(no_renew())
            .send()
            .await
            .unwrap();
        let prev = &next.names()[0].previous;
        assert_eq!((prev.ended, prev.watermark), (Ended::Broken, a.deadline()));
        assert_eq!(prev.ended_at, a.deadline());
        let err = a.renew().await.unwrap_err();
        assert!(
            matches!(
                &err,
                Error::NotHeld {
                    reason: NotHeldReason::Ended,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn an_expired_lease_nobody_took_can_no_longer_be_released() {
        let (b, clock) = backend();
        let a = AcquireBuilder::new(b.clone(), ["n"])
            .ttl(Duration::from_secs(1))
            .options(no_renew())
            .send()
            .await
            .unwrap();
        let lease = a.lease_ref().clone();
        clock.advance(Duration::from_secs(1));
        let err = b
            .release_lease(&lease, ReleaseOptions::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::NotHeld { message, .. } if message.contains("expired")),
            "{err:?}"
        );
        // What the next holder would find: the expired lease, broken.
        let d = b.describe(&["n".to_owned()]).await.unwrap();
        assert!(d[0].holder.is_none());
        assert_eq!(d[0].previous.ended, Ended::Broken);
    }

    /// Tokio's time is paused (and the manual clock never moves): it moves
    /// only when every task is parked on a timer, so a waiter that woke by
    /// its timer would show as time passed; one woken by the release shows
    /// none. No wall-clock bound, no sleep.
    #[tokio::test(start_paused = true)]
    async fn a_waiter_is_woken_by_the_release_not_by_polling() {
        let (b, _clock) = backend();
        let a = AcquireBuilder::new(b.clone(), ["q"])
            .options(no_renew())
            .send()
            .await
            .unwrap();
        let waiter = tokio::spawn(
            AcquireBuilder::new(b.clone(), ["q"])
                .wait(Duration::from_secs(5))
                .options(no_renew())
                .send(),
        );
        // One turn of this single-threaded runtime runs the waiter until it
        // parks on the busy name (the backend answers without I/O).
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "the waiter waits");
        let started = Instant::now();
        a.release(None).await.unwrap();
        let next = waiter.await.unwrap().unwrap();
        assert_eq!(next.names()[0].previous.ended, Ended::Released);
        assert_eq!(Instant::now(), started, "woken by the release, not a timer");
    }
}
