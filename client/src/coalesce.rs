//! [`Coalescer`]: client-side request coalescing over the `Batch` RPC.
//!
//! Many tasks call [`Coalescer::acquire`]/[`Coalescer::release`]/...
//! concurrently; operations that arrive while earlier calls are in flight
//! queue up and go out together in the next `Batch` call (group commit).
//! The server then pays one RPC and one signature per batch instead of per
//! operation, which is where a lease server's time goes under load. At low
//! load a batch holds one operation and costs what a unary call costs.

use std::sync::Arc;

use bagel_proto::{KeyRing, pb, witness_signed_message};
use prost::Message as _;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::client::Client;
use crate::error::{Error, Result};

/// How a [`Coalescer`] batches.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct CoalesceOptions {
    /// Most operations in one `Batch` call (the server's limit is 1024).
    pub max_batch: usize,
    /// `Batch` calls in flight at once.
    pub in_flight: usize,
    /// Verify every grant's witness (one ed25519 check per batch, since the
    /// grants of a batch share their signature). Default true.
    pub verify_witnesses: bool,
}

impl Default for CoalesceOptions {
    fn default() -> Self {
        CoalesceOptions {
            max_batch: 256,
            in_flight: 4,
            verify_witnesses: true,
        }
    }
}

impl CoalesceOptions {
    #[must_use]
    pub fn with_max_batch(mut self, n: usize) -> Self {
        self.max_batch = n.max(1);
        self
    }

    #[must_use]
    pub fn with_in_flight(mut self, n: usize) -> Self {
        self.in_flight = n.max(1);
        self
    }

    #[must_use]
    pub fn with_verify_witnesses(mut self, on: bool) -> Self {
        self.verify_witnesses = on;
        self
    }
}

type Reply = oneshot::Sender<Result<pb::batch_result::Result>>;

/// Coalesces lease operations of many tasks into `Batch` calls. Cheap to
/// share behind an `Arc`; its flusher tasks stop when it is dropped.
#[derive(Debug)]
pub struct Coalescer {
    tx: mpsc::Sender<(pb::BatchOp, Reply)>,
    _stop: DropGuard,
}

impl Coalescer {
    pub fn new(client: Client, options: CoalesceOptions) -> Self {
        let (tx, rx) = mpsc::channel(options.max_batch * options.in_flight * 2);
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let cancel = CancellationToken::new();
        for _ in 0..options.in_flight {
            tokio::spawn(flusher(client.clone(), Arc::clone(&rx), options, cancel.clone()));
        }
        Coalescer {
            tx,
            _stop: cancel.drop_guard(),
        }
    }

    /// Runs one operation as part of some batch.
    pub async fn call(&self, op: pb::BatchOp) -> Result<pb::batch_result::Result> {
        let (reply, rx) = oneshot::channel();
        self.tx.send((op, reply)).await.map_err(|_| Error::Unavailable {
            message: "coalescer stopped".into(),
        })?;
        rx.await.map_err(|_| Error::Unavailable {
            message: "coalescer stopped".into(),
        })?
    }

    /// Acquires without waiting (batched acquires cannot wait); returns the
    /// grant with its witness checked (unless the options say not to).
    pub async fn acquire(&self, req: pb::AcquireRequest) -> Result<pb::LeaseGrant> {
        use pb::batch_result::Result as R;
        match self.call(op(pb::batch_op::Op::Acquire(req))).await? {
            R::Grant(grant) => Ok(grant),
            other => Err(unexpected("grant", &other)),
        }
    }

    pub async fn renew(&self, req: pb::RenewRequest) -> Result<pb::RenewResponse> {
        use pb::batch_result::Result as R;
        match self.call(op(pb::batch_op::Op::Renew(req))).await? {
            R::Renewed(r) => Ok(r),
            other => Err(unexpected("renewal", &other)),
        }
    }

    pub async fn release(&self, req: pb::ReleaseRequest) -> Result<pb::ReleaseResponse> {
        use pb::batch_result::Result as R;
        match self.call(op(pb::batch_op::Op::Release(req))).await? {
            R::Released(r) => Ok(r),
            other => Err(unexpected("release", &other)),
        }
    }
}

fn op(op: pb::batch_op::Op) -> pb::BatchOp {
    pb::BatchOp { op: Some(op) }
}

fn unexpected(wanted: &str, got: &pb::batch_result::Result) -> Error {
    use pb::batch_result::Result as R;
    match got {
        R::Error(e) => op_error(e),
        _ => Error::Witness {
            reason: format!("server answered a {wanted} request with something else"),
        },
    }
}

/// A failed operation of a batch, as the error the unary call gives.
fn op_error(e: &pb::OpError) -> Error {
    let details = e.conflict.as_ref().map(|c| c.encode_to_vec()).unwrap_or_default();
    Error::from(tonic::Status::with_details(
        tonic::Code::from_i32(e.code),
        e.message.clone(),
        details.into(),
    ))
}

/// Checks the witness of a grant in a batch's answer; other results pass.
///
/// The grants of a batch share one signature over a Merkle root, so the
/// first costs an ed25519 check and the others only their Merkle path (the
/// root they fold to must be the one just verified) and the body check.
/// `verified` carries the (signature, signed message) checked last.
fn check_one(
    grant: &pb::LeaseGrant,
    keys: &KeyRing,
    verified: &mut Option<(Vec<u8>, Vec<u8>)>,
) -> Result<()> {
    let witness = grant.witness.as_ref().ok_or_else(|| Error::Witness {
        reason: "grant has no witness".into(),
    })?;
    let message = witness_signed_message(witness).map_err(|e| Error::Witness {
        reason: e.to_string(),
    })?;
    let known = verified
        .as_ref()
        .is_some_and(|(sig, msg)| *sig == witness.signature && msg.as_slice() == &*message);
    if known {
        crate::lease::check_grant_body(grant)
    } else {
        crate::lease::check_grant(grant, keys)?;
        *verified = Some((witness.signature.clone(), message.into_owned()));
        Ok(())
    }
}

/// Takes whatever is queued (up to `max_batch`) and sends it as one batch.
async fn flusher(
    client: Client,
    rx: Arc<tokio::sync::Mutex<mpsc::Receiver<(pb::BatchOp, Reply)>>>,
    options: CoalesceOptions,
    cancel: CancellationToken,
) {
    let max = options.max_batch;
    loop {
        let mut ops = Vec::new();
        let mut replies = Vec::new();
        {
            let mut rx = tokio::select! {
                rx = rx.lock() => rx,
                () = cancel.cancelled() => return,
            };
            let first = tokio::select! {
                job = rx.recv() => job,
                () = cancel.cancelled() => return,
            };
            let Some((op, reply)) = first else { return };
            ops.push(op);
            replies.push(reply);
            while ops.len() < max {
                match rx.try_recv() {
                    Ok((op, reply)) => {
                        ops.push(op);
                        replies.push(reply);
                    }
                    Err(_) => break,
                }
            }
        }
        match client.batch_raw(ops).await {
            Ok(results) if results.len() == replies.len() => {
                let mut verified = None;
                for (reply, result) in replies.into_iter().zip(results) {
                    let r = match result.result {
                        None => Err(Error::Witness {
                            reason: "empty batch result".into(),
                        }),
                        Some(pb::batch_result::Result::Grant(grant)) if options.verify_witnesses => {
                            check_one(&grant, client.keys(), &mut verified)
                                .map(|()| pb::batch_result::Result::Grant(grant))
                        }
                        Some(r) => Ok(r),
                    };
                    let _ = reply.send(r);
                }
            }
            Ok(results) => {
                let n = replies.len();
                for reply in replies {
                    let _ = reply.send(Err(Error::Witness {
                        reason: format!("batch of {n} answered with {} results", results.len()),
                    }));
                }
            }
            Err(e) => {
                let retryable = e.is_retryable();
                let message = e.to_string();
                for reply in replies {
                    let _ = reply.send(Err(if retryable {
                        Error::Unavailable {
                            message: message.clone(),
                        }
                    } else {
                        Error::Rejected {
                            code: tonic::Code::Unknown,
                            message: message.clone(),
                        }
                    }));
                }
            }
        }
    }
}
