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
//! * **Time.** A connection with an answer unfinished that writes less than
//!   [`MIN_PROGRESS`] bytes to its socket in `--answer-stall-timeout` is
//!   closed (see `super::Conn`), and what it held is freed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tonic::Status;

use super::ConnState;

/// Bytes a connection with unfinished answers must write to its socket
/// per stall timeout to count as read: more than keepalive pings (17 bytes
/// each), which a client that reads nothing still answers.
pub const MIN_PROGRESS: u64 = 1024;

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
        }
    }
}

/// One unfinished answer, counted until dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    budget: Arc<AnswerBudget>,
    conn: Arc<ConnState>,
    bytes: usize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
        self.conn.answer_bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        self.conn.answers.fetch_sub(1, Ordering::AcqRel);
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
    fn streams_are_not_charged_as_answers() {
        assert!(is_unary("/bagel.v1.LeaseService/List"));
        assert!(is_unary("/bagel.v1.LeaseService/Acquire"));
        assert!(!is_unary("/bagel.v1.LeaseService/Watch"));
        assert!(!is_unary("/bagel.v1.LeaseService/Session"));
    }
}
