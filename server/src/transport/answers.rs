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
//! * **Time.** A connection with an answer unfinished that writes less than
//!   [`MIN_PROGRESS`] bytes to its socket in `--answer-stall-timeout` is
//!   closed (see `super::Conn`), and what it held is freed.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
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
    /// How long a connection may hold unfinished answers without writing
    /// [`MIN_PROGRESS`] bytes; zero: no bound.
    pub stall_timeout: Duration,
    held: AtomicUsize,
    refused: AtomicU64,
    closed: AtomicU64,
}

impl AnswerBudget {
    pub fn new(per_connection: usize, total: usize, stall_timeout: Duration) -> Arc<Self> {
        Arc::new(AnswerBudget {
            per_connection,
            total,
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
            bytes: room_here,
            made: false,
        })
    }

    fn refuse(&self, e: Error) -> Error {
        self.refused.fetch_add(1, Ordering::Relaxed);
        e
    }
}

/// One unfinished answer, or the bytes reserved for one, counted until
/// dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    budget: Arc<AnswerBudget>,
    conn: Arc<ConnState>,
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
        } else {
            let less = self.bytes - bytes;
            self.budget.held.fetch_sub(less, Ordering::AcqRel);
            self.conn.answer_bytes.fetch_sub(less, Ordering::AcqRel);
        }
        self.bytes = bytes;
        if !self.made {
            self.made = true;
            self.conn.answers.fetch_add(1, Ordering::AcqRel);
        }
        self
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
        self.conn.answer_bytes.fetch_sub(self.bytes, Ordering::AcqRel);
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
}

impl AnswerSlot {
    pub(crate) fn new(budget: Arc<AnswerBudget>, conn: Arc<ConnState>) -> Arc<Self> {
        Arc::new(AnswerSlot {
            budget,
            conn,
            reserved: Mutex::new(None),
        })
    }

    /// Reserves between `least` and `want` bytes for the answer (as the
    /// budget's own `reserve` does) in place of what was reserved before;
    /// returns the bytes reserved, which the answer must not pass.
    pub fn reserve(&self, want: usize, least: usize) -> Result<usize, Error> {
        // Freed first: a call's own earlier reservation never refuses it.
        drop(self.take());
        let charge = self.budget.reserve(&self.conn, want, least)?;
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
            None => self.budget.charge(&self.conn, bytes),
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
        let budget = AnswerBudget::new(100, 1000, Duration::ZERO);
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
        let budget = AnswerBudget::new(1000, 150, Duration::ZERO);
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
        let budget = AnswerBudget::new(1000, 10_000, Duration::ZERO);
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
        let budget = AnswerBudget::new(usize::MAX, 100_000, Duration::ZERO);
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
        let budget = AnswerBudget::new(1000, 10_000, Duration::ZERO);
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
    fn streams_are_not_charged_as_answers() {
        assert!(is_unary("/bagel.v1.LeaseService/List"));
        assert!(is_unary("/bagel.v1.LeaseService/Acquire"));
        assert!(!is_unary("/bagel.v1.LeaseService/Watch"));
        assert!(!is_unary("/bagel.v1.LeaseService/Session"));
    }
}
