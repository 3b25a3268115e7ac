//! Answers made and not yet taken by their client: what the server holds
//! for clients that do not read.
//!
//! A unary answer is made in full before its client reads a byte of it;
//! HTTP/2 then sends it only as fast as the client opens its window. A
//! client that never reads (window 0, or a socket it never reads) leaves
//! the whole answer in the server's memory for as long as its connection
//! lives, and the connection's other bounds never close it: a call is in
//! flight, so it is not idle, and it answers pings. A thousand unread List
//! pages held a gigabyte.
//!
//! Two bounds, both on unary answers (Watch and Session streams have their
//! own: `--watch-stall-timeout`, `--session-stall-timeout`):
//! * **Bytes.** Each answer is encoded as soon as it is made and its size
//!   charged to its connection and to the server until it is finished (its
//!   last byte taken into the client's window) or dropped. A connection
//!   holding more than its share (`--max-unread-answer-bytes-per-connection`)
//!   has its new calls refused, and once the whole server holds more than
//!   `--max-unread-answer-bytes`, so has every connection that holds any:
//!   clients that read are not refused.
//! * **Reserved at admission.** A call that makes its answer later (a
//!   `List` waiting for its page turn, a `Batch` running its operations)
//!   reserves a bound on the answer's bytes from both budgets when it is
//!   admitted ([`AnswerSlot::reserve`]): calls queued on a connection count
//!   against its share before anything is made, so a client that never
//!   reads cannot queue a gigabyte of answers behind an empty budget (50
//!   connections x 100 queued Lists held 1.59 GB of a 256 MiB bound). A
//!   List page is then cut to what was reserved; the answer, once encoded,
//!   is charged at its real size in place of the reservation.
//! * **By identity.** Where callers have identities (an access policy,
//!   or mutual TLS), one identity may hold at most its share of the
//!   server's bytes over all its connections
//!   (`--max-unread-answer-bytes-per-identity`, by default a quarter of
//!   `--max-unread-answer-bytes`), so that a tenant with many connections
//!   that never read cannot take the whole budget and have every other
//!   tenant's connections holding an answer refused. The `List` and
//!   `Batch` handlers say whose the call is ([`AnswerSlot::identify`])
//!   before its answer is made: those are the answers that can be large
//!   (the other unary answers are a few hundred bytes, bounded per
//!   connection). An identity that holds nothing may take one answer
//!   whole, as a connection may.
//! * **Time.** A connection with an answer unfinished that writes less than
//!   [`MIN_PROGRESS`] bytes to its socket in `--answer-stall-timeout` is
//!   closed (see `super::Conn`), and what it held is freed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tonic::Status;

use super::ConnState;
use crate::error::Error;

/// Bytes a connection with unfinished answers must write to its socket
/// per stall timeout to count as read: more than keepalive pings (17 bytes
/// each), which a client that reads nothing still answers.
pub const MIN_PROGRESS: u64 = 1024;

/// What a connection holding no answer may always reserve for one, even
/// with the server over its budget: a client that reads is served (one
/// short `List` page, a small `Batch`), and the server holds at most this
/// much more per connection.
pub const FLOOR: usize = 64 << 10;

/// The server-wide bounds on unread answers, and what is held now.
#[derive(Debug)]
pub struct AnswerBudget {
    /// Bytes of unfinished answers one connection may hold before its new
    /// calls are refused.
    pub per_connection: usize,
    /// ... and all connections together.
    pub total: usize,
    /// ... and one identity over all its connections.
    identities: Identities,
    /// How long a connection may hold unfinished answers without writing
    /// [`MIN_PROGRESS`] bytes; zero: no bound.
    pub stall_timeout: Duration,
    held: AtomicUsize,
    refused: AtomicU64,
    closed: AtomicU64,
}

impl AnswerBudget {
    /// Budgets of `per_connection` bytes per connection, `per_identity`
    /// per identity and `total` for the server.
    pub fn new(
        per_connection: usize,
        per_identity: usize,
        total: usize,
        stall_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(AnswerBudget {
            per_connection,
            total,
            identities: Identities {
                share: per_identity.max(1),
                state: Mutex::default(),
            },
            stall_timeout,
            held: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            closed: AtomicU64::new(0),
        })
    }

    /// Bytes of unfinished answers held now, over all connections.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Calls refused because their connection (or the server) held too
    /// many unread answers.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Connections closed for leaving their answers unread.
    pub fn closed(&self) -> u64 {
        self.closed.load(Ordering::Relaxed)
    }

    /// What each identity holds and was refused at its share, by metric
    /// label (see `crate::shares::Labels`).
    pub fn identity_usage(&self) -> Vec<crate::shares::Usage> {
        self.identities.usage()
    }

    pub(crate) fn count_closed(&self) {
        self.closed.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether a new call on `conn` may begin: refused with
    /// RESOURCE_EXHAUSTED naming the bound if its connection holds more
    /// than its share, or holds any while the server is over its budget.
    pub(crate) fn admit(&self, conn: &ConnState) -> Result<(), Status> {
        let own = conn.answer_bytes.load(Ordering::Acquire);
        if own == 0 {
            return Ok(());
        }
        let refusal = if own > self.per_connection {
            format!(
                "this connection holds {own} bytes of answers it has not read \
                 (limit {}, bagel-server --max-unread-answer-bytes-per-connection): \
                 read them before calling again",
                self.per_connection
            )
        } else {
            let held = self.held();
            if held <= self.total {
                return Ok(());
            }
            format!(
                "the server holds {held} bytes of answers its clients have not read \
                 (limit {}, bagel-server --max-unread-answer-bytes), {own} of them on this \
                 connection: read them before calling again",
                self.total
            )
        };
        self.refused.fetch_add(1, Ordering::Relaxed);
        Err(Status::resource_exhausted(refusal))
    }

    /// Charges an answer of `bytes` to `conn` and the server until the
    /// returned charge is dropped.
    pub(crate) fn charge(self: &Arc<Self>, conn: &Arc<ConnState>, bytes: usize) -> Charge {
        self.held.fetch_add(bytes, Ordering::AcqRel);
        conn.answer_bytes.fetch_add(bytes, Ordering::AcqRel);
        conn.answers.fetch_add(1, Ordering::AcqRel);
        Charge {
            budget: Arc::clone(self),
            conn: Arc::clone(conn),
            identity: None,
            bytes,
            made: true,
        }
    }

    /// Reserves between `least` and `want` bytes (as many as both budgets
    /// have room for) for an answer not made yet, charged to `conn` and
    /// the server like one; refused, naming the bound, when not even
    /// `least` fits. A connection holding nothing may reserve one answer
    /// past its share (as one answer of any size was always made for it),
    /// and up to [`FLOOR`] whatever the server holds.
    pub(crate) fn reserve(
        self: &Arc<Self>,
        conn: &Arc<ConnState>,
        want: usize,
        least: usize,
    ) -> Result<Charge, Error> {
        let least = least.min(want);
        // Each counter is raised by compare-and-swap from what was read,
        // so that calls reserving at once never pass a bound together.
        let mut own = conn.answer_bytes.load(Ordering::Acquire);
        let mut room_here = loop {
            let room = if own == 0 {
                // One answer whole, as big as it may be: its share bounds
                // what a connection holds besides.
                usize::MAX
            } else {
                self.per_connection.saturating_sub(own)
            };
            let take = want.min(room);
            if take < least {
                return Err(self.refuse(Error::limit(
                    format!(
                        "bytes of answers this connection has not read ({own}), with the \
                         {least} this call's answer needs reserved"
                    ),
                    self.per_connection,
                    "bytes",
                    "max-unread-answer-bytes-per-connection",
                )));
            }
            match conn
                .answer_bytes
                .compare_exchange(own, own + take, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break take,
                Err(now) => own = now,
            }
        };
        let mut held = self.held();
        let take = loop {
            let mut room = self.total.saturating_sub(held);
            if own == 0 {
                room = room.max(FLOOR);
            }
            let take = room_here.min(room);
            if take < least {
                conn.answer_bytes.fetch_sub(room_here, Ordering::AcqRel);
                return Err(self.refuse(Error::limit(
                    format!(
                        "bytes of answers the server's clients have not read ({held}, {own} of \
                         them on this connection), with the {least} this call's answer needs \
                         reserved"
                    ),
                    self.total,
                    "bytes",
                    "max-unread-answer-bytes",
                )));
            }
            match self
                .held
                .compare_exchange(held, held + take, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break take,
                Err(now) => held = now,
            }
        };
        if take < room_here {
            conn.answer_bytes.fetch_sub(room_here - take, Ordering::AcqRel);
            room_here = take;
        }
        Ok(Charge {
            budget: Arc::clone(self),
            conn: Arc::clone(conn),
            identity: None,
            bytes: room_here,
            made: false,
        })
    }

    fn refuse(&self, e: Error) -> Error {
        self.refused.fetch_add(1, Ordering::Relaxed);
        e
    }
}

/// What each identity holds of unread answers over all its connections,
/// and the most it may (see the module docs).
#[derive(Debug)]
struct Identities {
    share: usize,
    state: Mutex<IdentityState>,
}

#[derive(Debug, Default)]
struct IdentityState {
    /// Bytes held, by identity (an identity holding none is removed).
    held: HashMap<Arc<str>, usize>,
    labels: crate::shares::Labels,
}

impl Identities {
    fn lock(&self) -> std::sync::MutexGuard<'_, IdentityState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reserves between `least` and `want` bytes for `identity` (as many
    /// as its share has room for; one answer whole when it holds nothing),
    /// or refuses naming the identity, what it holds and its share.
    fn reserve(&self, identity: &Arc<str>, want: usize, least: usize) -> Result<usize, Error> {
        let mut state = self.lock();
        state.labels.seen(identity);
        let held = state.held.get(identity).copied().unwrap_or(0);
        let room = if held == 0 {
            usize::MAX
        } else {
            self.share.saturating_sub(held)
        };
        let take = want.min(room);
        // Past its share (by one whole answer), nothing more until it reads.
        if take < least || held > self.share {
            state.labels.refused(identity);
            let needs = if least > 0 {
                format!(", with the {least} this call's answer needs reserved")
            } else {
                String::new()
            };
            return Err(Error::limit(
                format!(
                    "bytes of answers identity {} has not read over all its connections \
                     ({held}){needs}: its share of the server's budget",
                    crate::validate::echo(identity),
                ),
                self.share,
                "bytes per identity",
                "max-unread-answer-bytes-per-identity",
            ));
        }
        if take > 0 {
            *state.held.entry(Arc::clone(identity)).or_default() += take;
        }
        Ok(take)
    }

    /// Charges `bytes` more to `identity` (an answer made larger than its
    /// reservation, or one made without one: never refused, it is made).
    fn add(&self, identity: &Arc<str>, bytes: usize) {
        if bytes > 0 {
            *self.lock().held.entry(Arc::clone(identity)).or_default() += bytes;
        }
    }

    /// Gives back `bytes` of `identity`'s.
    fn sub(&self, identity: &Arc<str>, bytes: usize) {
        let mut state = self.lock();
        if let Some(n) = state.held.get_mut(identity) {
            *n = n.saturating_sub(bytes);
            if *n == 0 {
                state.held.remove(identity);
            }
        }
    }

    fn usage(&self) -> Vec<crate::shares::Usage> {
        let state = self.lock();
        state
            .labels
            .usage(state.held.iter().map(|(identity, n)| (identity, *n as u64)))
    }
}

/// One unfinished answer, or the bytes reserved for one, counted until
/// dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    budget: Arc<AnswerBudget>,
    conn: Arc<ConnState>,
    /// Whose share the bytes also count against, if the call said.
    identity: Option<Arc<str>>,
    bytes: usize,
    /// Whether the answer is made (a reservation is not: its connection
    /// waits for its answer, and is not stalled for writing nothing).
    made: bool,
}

impl Charge {
    /// Bytes charged.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The reservation, now charged as the answer made, of `bytes` (what
    /// it encoded to: less than reserved, but a Batch's bound is cut to
    /// the connection's share and its answer may be more).
    pub(crate) fn into_answer(mut self, bytes: usize) -> Charge {
        if bytes >= self.bytes {
            let more = bytes - self.bytes;
            self.budget.held.fetch_add(more, Ordering::AcqRel);
            self.conn.answer_bytes.fetch_add(more, Ordering::AcqRel);
            if let Some(identity) = &self.identity {
                self.budget.identities.add(identity, more);
            }
        } else {
            self.shrink(bytes);
        }
        self.bytes = bytes;
        if !self.made {
            self.made = true;
            self.conn.answers.fetch_add(1, Ordering::AcqRel);
        }
        self
    }
}

impl Charge {
    /// Gives back what is charged past `bytes`.
    fn shrink(&mut self, bytes: usize) {
        let less = self.bytes.saturating_sub(bytes);
        if less == 0 {
            return;
        }
        self.budget.held.fetch_sub(less, Ordering::AcqRel);
        self.conn.answer_bytes.fetch_sub(less, Ordering::AcqRel);
        if let Some(identity) = &self.identity {
            self.budget.identities.sub(identity, less);
        }
        self.bytes -= less;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
        self.conn.answer_bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        if let Some(identity) = &self.identity {
            self.budget.identities.sub(identity, self.bytes);
        }
        if self.made {
            self.conn.answers.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// One unary call's answer, from its admission to its last byte: what is
/// reserved for it (by its handler, a `List`, or its request body, a
/// `Batch`) and then charged as made (by the response body). Shared by the
/// three through the request's extensions; dropping the call frees it.
#[derive(Debug)]
pub struct AnswerSlot {
    budget: Arc<AnswerBudget>,
    conn: Arc<ConnState>,
    reserved: Mutex<Option<Charge>>,
    /// Whose call it is, once its handler said ([`AnswerSlot::identify`]).
    identity: OnceLock<Arc<str>>,
}

impl AnswerSlot {
    pub(crate) fn new(budget: Arc<AnswerBudget>, conn: Arc<ConnState>) -> Arc<Self> {
        Arc::new(AnswerSlot {
            budget,
            conn,
            reserved: Mutex::new(None),
            identity: OnceLock::new(),
        })
    }

    /// Says whose call this is: its answer counts against `identity`'s
    /// share from now on, what is reserved already included (a `Batch`'s,
    /// reserved as its request was read, before anyone knew whose it
    /// was). Refused, and the reservation freed, when the identity has no
    /// room for it. Said once; later calls change nothing.
    pub fn identify(&self, identity: &Arc<str>) -> Result<(), Error> {
        if self.identity.set(Arc::clone(identity)).is_err() {
            return Ok(());
        }
        let mut reserved = self.lock();
        let bytes = reserved.as_ref().map_or(0, Charge::bytes);
        match self.budget.identities.reserve(identity, bytes, bytes) {
            Ok(_) => {
                if let Some(charge) = reserved.as_mut() {
                    charge.identity = Some(Arc::clone(identity));
                }
                Ok(())
            }
            Err(e) => {
                let freed = reserved.take();
                drop(reserved);
                drop(freed);
                Err(self.budget.refuse(e))
            }
        }
    }

    /// Reserves between `least` and `want` bytes for the answer (as the
    /// budget's own `reserve` does, and within the identity's share once
    /// the call is identified) in place of what was reserved before;
    /// returns the bytes reserved, which the answer must not pass.
    pub fn reserve(&self, want: usize, least: usize) -> Result<usize, Error> {
        // Freed first: a call's own earlier reservation never refuses it.
        drop(self.take());
        let mut charge = self.budget.reserve(&self.conn, want, least)?;
        if let Some(identity) = self.identity.get() {
            let least = least.min(charge.bytes());
            let take = self
                .budget
                .identities
                .reserve(identity, charge.bytes(), least)
                .map_err(|e| self.budget.refuse(e))?;
            charge.shrink(take);
            charge.identity = Some(Arc::clone(identity));
        }
        let bytes = charge.bytes();
        *self.lock() = Some(charge);
        Ok(bytes)
    }

    /// The reservation, taken (and freed, once dropped).
    pub(crate) fn take(&self) -> Option<Charge> {
        self.lock().take()
    }

    /// The answer is made, `bytes` encoded: charged at that size in place
    /// of its reservation, until the returned charge is dropped.
    pub(crate) fn made(&self, bytes: usize) -> Option<Charge> {
        let reserved = self.take();
        if bytes == 0 {
            return None;
        }
        Some(match reserved {
            Some(reserved) => reserved.into_answer(bytes),
            None => {
                let mut charge = self.budget.charge(&self.conn, bytes);
                if let Some(identity) = self.identity.get() {
                    self.budget.identities.add(identity, bytes);
                    charge.identity = Some(Arc::clone(identity));
                }
                charge
            }
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Charge>> {
        self.reserved.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A bound on the bytes of a `Batch` answer, by what its request holds:
/// each result is at most an error (its message of at most
/// [`crate::error::MAX_MESSAGE_BYTES`], a conflict) or a grant's fixed part
/// (ids, token, witness and signature), plus, for each name acquired, its
/// entries in the grant and in the witness (the name twice and the previous
/// lease). An answer that encodes larger is charged at its size once made.
#[derive(Clone, Copy, Debug)]
pub struct BatchBound {
    pub per_op: usize,
    pub per_name: usize,
}

impl BatchBound {
    pub fn new(max_name_bytes: usize, max_owner_bytes: usize) -> Self {
        BatchBound {
            per_op: crate::error::MAX_MESSAGE_BYTES + max_name_bytes + max_owner_bytes,
            per_name: 2 * max_name_bytes + 512,
        }
    }

    /// The bound for `ops` operations acquiring `names` names in all.
    pub fn answer(&self, ops: usize, names: usize) -> usize {
        ops.saturating_mul(self.per_op)
            .saturating_add(names.saturating_mul(self.per_name))
    }
}

/// Whether the method at `path` answers once (its answer is charged) or
/// streams (bounded by its own stall timeout).
pub(crate) fn is_unary(path: &str) -> bool {
    !matches!(
        path,
        "/bagel.v1.LeaseService/Watch"
            | "/bagel.v1.LeaseService/Session"
            | "/grpc.health.v1.Health/Watch"
            | "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
            | "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_over_its_share_is_refused_naming_the_flag() {
        let budget = AnswerBudget::new(100, usize::MAX, 1000, Duration::ZERO);
        let conn = Arc::new(ConnState::new());
        assert!(budget.admit(&conn).is_ok());
        let first = budget.charge(&conn, 100);
        assert!(budget.admit(&conn).is_ok(), "at its share, not over it");
        let second = budget.charge(&conn, 1);
        let refusal = budget.admit(&conn).unwrap_err();
        assert_eq!(refusal.code(), tonic::Code::ResourceExhausted);
        assert!(
            refusal
                .message()
                .contains("--max-unread-answer-bytes-per-connection"),
            "{}",
            refusal.message()
        );
        assert_eq!(budget.refused(), 1);
        drop((first, second));
        assert_eq!(budget.held(), 0);
        assert!(budget.admit(&conn).is_ok(), "freed once the answers are done");
    }

    #[test]
    fn over_the_server_budget_only_connections_holding_answers_are_refused() {
        let budget = AnswerBudget::new(1000, usize::MAX, 150, Duration::ZERO);
        let (a, b, reader) = (
            Arc::new(ConnState::new()),
            Arc::new(ConnState::new()),
            Arc::new(ConnState::new()),
        );
        let _a = budget.charge(&a, 100);
        let _b = budget.charge(&b, 100);
        let refusal = budget.admit(&a).unwrap_err();
        assert!(
            refusal.message().contains("--max-unread-answer-bytes)"),
            "{}",
            refusal.message()
        );
        assert!(budget.admit(&b).is_err());
        assert!(
            budget.admit(&reader).is_ok(),
            "a client that reads is not refused"
        );
    }

    #[test]
    fn queued_calls_reserve_their_answers_and_the_ones_past_the_share_are_refused() {
        let budget = AnswerBudget::new(1000, usize::MAX, 10_000, Duration::ZERO);
        let conn = Arc::new(ConnState::new());
        // Holding nothing: one answer whole, past the share.
        let first = budget.reserve(&conn, 1500, 100).unwrap();
        assert_eq!(first.bytes(), 1500);
        // Made: charged at its size in place of the reservation.
        let first = first.into_answer(400);
        assert_eq!((budget.held(), conn.answers.load(Ordering::Acquire)), (400, 1));
        // Queued ones get what is left of the share, then nothing.
        let second = budget.reserve(&conn, 1500, 100).unwrap();
        assert_eq!(second.bytes(), 600);
        assert_eq!(
            conn.answers.load(Ordering::Acquire),
            1,
            "a reservation is no answer made"
        );
        let refused = budget.reserve(&conn, 1500, 100).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused
                .to_string()
                .contains("--max-unread-answer-bytes-per-connection"),
            "{refused}"
        );
        assert_eq!(budget.refused(), 1);
        drop((first, second));
        assert_eq!((budget.held(), conn.answer_bytes.load(Ordering::Acquire)), (0, 0));
    }

    #[test]
    fn over_the_server_budget_a_connection_holding_nothing_gets_the_floor() {
        let budget = AnswerBudget::new(usize::MAX, usize::MAX, 100_000, Duration::ZERO);
        let (a, reader) = (Arc::new(ConnState::new()), Arc::new(ConnState::new()));
        let _a = budget.reserve(&a, 200_000, 10).unwrap();
        assert_eq!(budget.held(), 100_000, "the server's whole budget");
        let refused = budget.reserve(&a, 200_000, 10).unwrap_err();
        assert!(
            refused.to_string().contains("--max-unread-answer-bytes)"),
            "{refused}"
        );
        let floor = budget.reserve(&reader, 5 * FLOOR, 10).unwrap();
        assert_eq!(floor.bytes(), FLOOR);
        // A call that cannot be cut short (a Batch) gets all or nothing.
        let other = Arc::new(ConnState::new());
        assert!(budget.reserve(&other, 2 * FLOOR, 2 * FLOOR).is_err());
    }

    #[test]
    fn a_slot_replaces_its_reservation_and_frees_it_with_the_call() {
        let budget = AnswerBudget::new(1000, usize::MAX, 10_000, Duration::ZERO);
        let conn = Arc::new(ConnState::new());
        let slot = AnswerSlot::new(Arc::clone(&budget), Arc::clone(&conn));
        assert_eq!(slot.reserve(800, 10).unwrap(), 800);
        assert_eq!(
            slot.reserve(900, 10).unwrap(),
            900,
            "its own reservation does not count"
        );
        let made = slot.made(300).unwrap();
        assert_eq!(budget.held(), 300);
        drop(made);
        assert_eq!(slot.reserve(500, 10).unwrap(), 500);
        drop(slot);
        assert_eq!(
            budget.held(),
            0,
            "a call dropped while queued frees its reservation"
        );
    }

    #[test]
    fn an_identity_holds_at_most_its_share_over_all_its_connections() {
        let budget = AnswerBudget::new(1000, 1500, 100_000, Duration::ZERO);
        let (a, b) = (Arc::<str>::from("team-a"), Arc::<str>::from("team-b"));
        let slot = || AnswerSlot::new(Arc::clone(&budget), Arc::new(ConnState::new()));
        // B's calls, each on a connection of its own holding nothing.
        let b_slots: Vec<_> = (0..4).map(|_| slot()).collect();
        b_slots[0].identify(&b).unwrap();
        assert_eq!(b_slots[0].reserve(1000, 10).unwrap(), 1000);
        b_slots[1].identify(&b).unwrap();
        assert_eq!(
            b_slots[1].reserve(1000, 10).unwrap(),
            500,
            "the rest of its share"
        );
        b_slots[2].identify(&b).unwrap();
        let refused = b_slots[2].reserve(1000, 10).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        for needle in [
            "identity \"team-b\"",
            "(1500)",
            "1500 bytes per identity",
            "--max-unread-answer-bytes-per-identity",
        ] {
            assert!(refused.to_string().contains(needle), "{refused} lacks {needle:?}");
        }
        // A Batch's answer, reserved before anyone knew whose it was, is
        // refused once it is, and its reservation freed.
        let held = budget.held();
        assert_eq!(b_slots[3].reserve(800, 800).unwrap(), 800);
        assert!(b_slots[3].identify(&b).is_err());
        assert_eq!(budget.held(), held);
        assert_eq!(budget.refused(), 2);
        // Another identity has its own share.
        let a_slot = slot();
        a_slot.identify(&a).unwrap();
        assert_eq!(a_slot.reserve(1000, 10).unwrap(), 1000);
        // Made: charged to the identity at its size.
        let made = b_slots[0].made(300).unwrap();
        let of = |who: &str| {
            budget
                .identity_usage()
                .into_iter()
                .find(|u| &*u.identity == who)
                .map(|u| (u.held, u.refused))
        };
        assert_eq!(of("team-b"), Some((800, 2)));
        assert_eq!(of("team-a"), Some((1000, 0)));
        drop((made, b_slots, a_slot));
        assert_eq!(of("team-b"), Some((0, 2)), "given back with the calls");
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn an_identity_past_its_share_by_one_whole_answer_is_refused_until_it_reads() {
        let budget = AnswerBudget::new(usize::MAX, 100, usize::MAX, Duration::ZERO);
        let b = Arc::<str>::from("team-b");
        let first = AnswerSlot::new(Arc::clone(&budget), Arc::new(ConnState::new()));
        first.identify(&b).unwrap();
        assert_eq!(first.reserve(5000, 10).unwrap(), 5000, "one answer whole");
        let second = AnswerSlot::new(Arc::clone(&budget), Arc::new(ConnState::new()));
        assert!(
            second.identify(&b).is_err(),
            "over its share, even with nothing to reserve"
        );
        drop(first);
        let third = AnswerSlot::new(Arc::clone(&budget), Arc::new(ConnState::new()));
        assert!(third.identify(&b).is_ok());
    }

    #[test]
    fn streams_are_not_charged_as_answers() {
        assert!(is_unary("/bagel.v1.LeaseService/List"));
        assert!(is_unary("/bagel.v1.LeaseService/Acquire"));
        assert!(!is_unary("/bagel.v1.LeaseService/Watch"));
        assert!(!is_unary("/bagel.v1.LeaseService/Session"));
    }
}
