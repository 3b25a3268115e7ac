//! The server's one error type. How it goes on the wire (its gRPC code,
//! the status and its details) is the gRPC edge's business:
//! `crate::grpc_status`.

use std::sync::Arc;

use bagel_proto::{Micros, human_duration, pb};

use crate::table::{LeaseId, Mode};

/// Who holds a name that a request wanted.
#[derive(Clone, Debug, PartialEq)]
pub struct Conflict {
    pub name: Arc<str>,
    pub holder: LeaseId,
    pub owner: Arc<str>,
    pub mode: Mode,
    pub deadline: Micros,
    /// Server time when the holder was found in the way: the retry delay
    /// a refusal sends is `deadline - seen`.
    pub seen: Micros,
}

impl Conflict {
    /// The status details of a refused acquire.
    pub fn to_pb(&self) -> pb::LeaseConflict {
        pb::LeaseConflict {
            name: self.name.to_string(),
            holder_lease_id: self.holder.to_string(),
            holder_owner: self.owner.to_string(),
            holder_mode: pb::Mode::from(self.mode).into(),
            holder_deadline_us: self.deadline.as_micros(),
        }
    }

    /// How long until the holder's deadline, as of when it was seen.
    pub fn retry_after(&self) -> std::time::Duration {
        self.deadline.duration_since(self.seen)
    }
}

/// Everything a lease request can fail with. Messages name the field and
/// the limit, because they go straight to the caller.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    #[error("{field}: {reason}")]
    OutOfRange { field: &'static str, reason: String },
    /// A deadline outside `(now + min_ttl, now + max_ttl]`. A variant of
    /// its own because callers act on it (a waiting acquire whose deadline
    /// came too close answers with the conflict it waited on), which they
    /// should not do by matching a field name. The message says, in human
    /// units and by the server's flags, how far off it is.
    #[error("deadline_us: {}", deadline_reason(*.deadline, *.now, *.min_ttl, *.max_ttl))]
    DeadlineOutOfRange {
        deadline: Micros,
        now: Micros,
        min_ttl: std::time::Duration,
        max_ttl: std::time::Duration,
    },
    /// A relative TTL (`ttl_us`) outside `(min_ttl, max_ttl]`.
    #[error("ttl_us: ttl {} is {}", human_duration(*.ttl), ttl_reason(*.ttl, *.min_ttl, *.max_ttl))]
    TtlOutOfRange {
        ttl: std::time::Duration,
        min_ttl: std::time::Duration,
        max_ttl: std::time::Duration,
    },
    /// A wait longer than the server's `--max-wait`. A variant of its own
    /// because a client acts on it (it waits in rounds of the max), which
    /// the status's details tell it.
    #[error(
        "wait_us: {} exceeds the server's max wait of {} us",
        bagel_proto::duration_micros(*.wait),
        .max.as_micros()
    )]
    WaitTooLong {
        wait: std::time::Duration,
        max: std::time::Duration,
    },
    #[error(
        "not ready: this server started at {started} and refuses grants until {ready_at}, \
         to wait out any lease a previous incarnation may have granted (max TTL + clock tolerance)"
    )]
    NotReady {
        started: Micros,
        ready_at: Micros,
        /// Server time of the refusal: the retry delay it sends is
        /// `ready_at - seen`.
        seen: Micros,
    },
    #[error(
        "name {:?} is held by lease {} (owner {:?}, {}) until {}; retry after that",
        .0.name, .0.holder, .0.owner, mode_word(.0.mode), .0.deadline
    )]
    Conflict(Box<Conflict>),
    #[error("lease_id: unknown lease {lease} (never granted by this server, released, or expired)")]
    UnknownLease { lease: LeaseId },
    #[error("lease_id: lease {lease} was released at {at}")]
    Released { lease: LeaseId, at: Micros },
    #[error("token: does not match lease {lease}")]
    WrongToken { lease: LeaseId },
    /// With mutual TLS or bearer tokens, a lease is renewed, upgraded and
    /// released only by the identity it was granted to: a lease token that
    /// leaked to another client is no use to it. The message says
    /// "identity", not "certificate": a token's caller has none.
    #[error(
        "lease {lease} was granted to {owner:?}; this caller is {caller:?}: only the identity \
         (client certificate or bearer token) a lease was granted to may renew, upgrade or \
         release it"
    )]
    NotOwner {
        lease: LeaseId,
        owner: Arc<str>,
        caller: Arc<str>,
    },
    /// With mutual TLS, a client certificate issued by anything but a
    /// `--client-ca` certificate (through a chain the client sent).
    #[error(
        "client certificate {subject:?} was issued through {issuer:?}, which is not a --client-ca \
         certificate: client certificates must be issued directly by a CA in --client-ca (a \
         client certificate that is itself a CA cannot vouch for others)"
    )]
    UntrustedIssuer { subject: Arc<str>, issuer: Arc<str> },
    /// With an access policy (`--acl`), a caller the policy cannot name:
    /// no client certificate nor bearer token, or a token it does not
    /// know. The reason never quotes the token.
    #[error("unauthenticated: {reason}")]
    Unauthenticated { reason: &'static str },
    /// With an access policy, a bearer token not looked at: its address
    /// sent more tokens the policy does not know than a window allows
    /// (`crate::acl`'s failures). Valid tokens from it wait too, or a
    /// guesser would learn a right guess at full speed.
    #[error(
        "bearer token not checked: {peer} sent {failures} tokens the access policy does not know \
         within {}; its tokens are refused for {} more",
        human_duration(*.window),
        human_duration(*.retry_after)
    )]
    TokenGuessing {
        peer: String,
        failures: u32,
        window: std::time::Duration,
        retry_after: std::time::Duration,
    },
    /// With an access policy, a call on a name (or a `List`/`Watch`
    /// prefix) the caller's identity has no grant of `permission` on. It
    /// names only what the caller sent, never what else exists.
    #[error(
        "permission denied: {identity:?} has no {permission} permission on {on} {name} (the \
         server's access policy, bagel-server --acl)"
    )]
    PermissionDenied {
        identity: Arc<str>,
        permission: &'static str,
        /// "name" or "prefix".
        on: &'static str,
        /// As the caller sent it, quoted and cut (`bagel_proto::names::echo`).
        name: String,
    },
    /// A name this server does not own under the member lists it serves
    /// (`--members`): the caller's server list routes it to the wrong
    /// member (a wrong or missing ID), and granting it here could give it
    /// a second holder beside the one its owner granted.
    #[error(
        "names: {name} belongs to server {owners} under this server's member lists (this is {me:?}): \
         the client's server list routes it to the wrong member; check every ID=URL in the list \
         against what each server announces (`bagel server-info`)",
        owners = .owners.join(" / ")
    )]
    NotOwnedHere {
        /// Quoted and cut (`bagel_proto::names::echo`).
        name: String,
        me: Arc<str>,
        /// The owner under each list in force.
        owners: Vec<String>,
    },
    #[error("lease {lease} expired at {deadline}; it can no longer be renewed, upgraded or released")]
    Expired { lease: LeaseId, deadline: Micros },
    #[error("lease {lease} lost name {name:?}: a full acquire by lease {by} broke it")]
    LostName {
        lease: LeaseId,
        name: Arc<str>,
        by: LeaseId,
    },
    /// The server's clock is not known to be right (off by more than its
    /// tolerance, or no recent Roughtime answer): it grants nothing.
    #[error("refusing to grant: this server's clock is unhealthy: {detail}")]
    ClockUnhealthy { detail: String },
    #[error("server full: {detail}")]
    Capacity { detail: String },
    /// The deadline asked for passes the granted-until mark on disk (see
    /// `crate::highwater`): the request raced the mark's next raise, or the
    /// disk is slow. Transient: the same request succeeds once the mark
    /// covers it, so clients retry it (UNAVAILABLE) rather than treat it as
    /// a refusal; a renewal refused as a limit would fence its holder.
    #[error(
        "deadline {} passes the granted-until mark not yet written ({}); retry",
        .deadline.as_micros(), .mark.as_micros()
    )]
    MarkBehind { deadline: Micros, mark: Micros },
    /// A bound on what one client (or all of them) can make the server
    /// hold. The message names the limit, its value and the flag that sets
    /// it, so an operator knows what to raise and a caller what it hit.
    #[error("{what}: over the limit of {value} {unit} (bagel-server --{flag})")]
    Limit {
        what: String,
        value: u64,
        unit: &'static str,
        flag: &'static str,
    },
    /// The server got SIGTERM/SIGINT: it grants nothing more and exits
    /// within its shutdown grace.
    #[error(
        "this server is shutting down: it grants nothing more; retry on another server \
         or after it restarts"
    )]
    ShuttingDown,
    /// A watch that cannot start (too many watchers, a revision no longer
    /// kept or not yet made) or goes on no longer (it fell behind). Its
    /// message names the revision to resume from, or the limit.
    #[error(transparent)]
    Watch(#[from] crate::watch::WatchError),
}

/// A refusal of the rules every backend shares, in the server's words:
/// its TTL and wait refusals name the server's flags and clock.
impl From<bagel_lease_core::Refusal> for Error {
    fn from(r: bagel_lease_core::Refusal) -> Self {
        use bagel_lease_core::Refusal;
        match r {
            Refusal::WaitTooLong { wait, max } => Error::WaitTooLong { wait, max },
            Refusal::TtlOutOfRange {
                ttl,
                min_ttl,
                max_ttl,
            } => Error::TtlOutOfRange {
                ttl,
                min_ttl,
                max_ttl,
            },
            Refusal::DeadlineOutOfRange {
                deadline,
                now,
                min_ttl,
                max_ttl,
            } => Error::DeadlineOutOfRange {
                deadline,
                now,
                min_ttl,
                max_ttl,
            },
            other => Error::InvalidArgument {
                field: other.field(),
                reason: other.reason(),
            },
        }
    }
}

/// The longest status message the server sends. Messages echo parts of
/// the request (names, ids, keys); whatever a caller sends, the answer
/// stays small.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// `message` cut to [`MAX_MESSAGE_BYTES`] on a character boundary.
pub fn bounded(mut message: String) -> String {
    if message.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES - 16;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str(" … (truncated)");
    }
    message
}

/// Why an absolute deadline is out of range, as the server's clock sees
/// it: already past (a slow path, or a clock behind the server's), too
/// close, or further off than `--max-ttl`.
fn deadline_reason(
    deadline: Micros,
    now: Micros,
    min_ttl: std::time::Duration,
    max_ttl: std::time::Duration,
) -> String {
    let at = format!("{} ({deadline})", deadline.as_micros());
    if deadline <= now {
        format!(
            "{at} is already past on the server's clock (server now {now}, {} later): the request \
             took longer than its TTL to arrive, or the client's clock is behind; ask with ttl_us \
             (a relative TTL) instead",
            human_duration(now.duration_since(deadline))
        )
    } else if deadline.duration_since(now) <= min_ttl {
        format!(
            "{at} leaves {} on the server's clock (server now {now}), not over the server's \
             --min-ttl of {}",
            human_duration(deadline.duration_since(now)),
            human_duration(min_ttl)
        )
    } else {
        format!(
            "{at} is {} from the server's now ({now}), over the server's --max-ttl of {}",
            human_duration(deadline.duration_since(now)),
            human_duration(max_ttl)
        )
    }
}

fn ttl_reason(
    ttl: std::time::Duration,
    min_ttl: std::time::Duration,
    max_ttl: std::time::Duration,
) -> String {
    if ttl > max_ttl {
        format!("over the server's --max-ttl of {}", human_duration(max_ttl))
    } else {
        format!("not over the server's --min-ttl of {}", human_duration(min_ttl))
    }
}

fn mode_word(m: Mode) -> &'static str {
    match m {
        Mode::Full => "full",
        Mode::Tentative => "tentative",
    }
}

impl Error {
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }

    pub fn limit(
        what: impl Into<String>,
        value: impl TryInto<u64>,
        unit: &'static str,
        flag: &'static str,
    ) -> Self {
        Error::Limit {
            what: what.into(),
            value: value.try_into().unwrap_or(u64::MAX),
            unit,
            flag,
        }
    }

    pub fn out_of_range(field: &'static str, reason: impl Into<String>) -> Self {
        Error::OutOfRange {
            field,
            reason: reason.into(),
        }
    }

    /// Whether the same request can succeed later without changes.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::NotReady { .. }
                | Error::Conflict(_)
                | Error::ClockUnhealthy { .. }
                | Error::Capacity { .. }
                | Error::MarkBehind { .. }
                | Error::Limit { .. }
                | Error::ShuttingDown
                | Error::Watch(crate::watch::WatchError::TooMany { .. })
        )
    }
}
