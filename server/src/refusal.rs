//! The log line of every refused call or operation: once, at debug level,
//! under the target `bagel_server::refusal`, with the names or lease it was
//! about, the holder that stood in the way and the reason (never a token).
//!
//! It reads the domain error, not the status it becomes: a conflict's
//! holder comes straight from [`Error::Conflict`]'s fields, with nothing
//! decoded back out of status details.

use bagel_proto::pb;

use crate::error::{Error, bounded};
use crate::meter::code_label;

/// What a refused request was about, for its log line.
#[derive(Debug)]
pub(crate) struct Subject<'a> {
    names: &'a [String],
    lease: &'a str,
}

impl<'a> Subject<'a> {
    /// A request that names no name nor lease (or whose line shows none).
    pub(crate) const NONE: Subject<'static> = Subject {
        names: &[],
        lease: "",
    };

    pub(crate) fn of_op(op: &'a pb::BatchOp) -> Self {
        use pb::batch_op::Op as O;
        match &op.op {
            Some(O::Acquire(a)) => Subject::names(&a.names),
            Some(O::Renew(r)) => Subject::lease(&r.lease_id),
            Some(O::Upgrade(u)) => Subject::lease(&u.lease_id),
            Some(O::Release(r)) => Subject::lease(&r.lease_id),
            None => Subject::NONE,
        }
    }

    pub(crate) fn names(names: &'a [String]) -> Self {
        Subject { names, lease: "" }
    }

    pub(crate) fn lease(lease: &'a str) -> Self {
        Subject { names: &[], lease }
    }
}

/// Logs `error`, the refusal of `op` (a method or operation name). The
/// fields are the request's names (at most a few shown, and never more
/// than the request's own size limits), the lease it was about, the holder
/// that stood in the way, the gRPC code name and the reason (the message
/// the caller gets, which never contains a token).
pub(crate) fn log(op: &str, subject: &Subject<'_>, error: &Error) {
    // Checked first, so that with debug logging off a refusal costs no
    // formatting.
    if !tracing::enabled!(target: "bagel_server::refusal", tracing::Level::DEBUG) {
        return;
    }
    const SHOWN: usize = 8;
    let names = match subject.names.len() {
        0 => String::new(),
        n if n <= SHOWN => subject.names.join(","),
        n => format!("{},… ({n} names)", subject.names[..SHOWN].join(",")),
    };
    let (name, holder, holder_owner) = match error {
        Error::Conflict(c) => (&*c.name, c.holder.to_string(), &*c.owner),
        _ => ("", String::new(), ""),
    };
    let reason = bounded(error.to_string());
    tracing::debug!(
        target: "bagel_server::refusal",
        op,
        code = code_label(error.code()),
        names = %names,
        lease = subject.lease,
        name,
        holder = holder.as_str(),
        holder_owner,
        reason = reason.as_str(),
        "refused"
    );
}
