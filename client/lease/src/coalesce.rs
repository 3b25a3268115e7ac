//! [`Coalescer`]: client-side request coalescing over the `Batch` and
//! `Session` RPCs.
//!
//! Leases taken with `client.acquire(..).via(&coalescer)` run their
//! acquire, renewals and release through it. Many tasks' operations that
//! arrive while earlier calls are in flight queue up and go out together
//! in the next `Batch` call (group commit).
//! The server then pays one RPC and one signature per batch instead of per
//! operation, which is where a lease server's time goes under load. At low
//! load a batch holds one operation and costs what a unary call costs.
//!
//! Two transports ([`Transport`]): `Batch` calls (up to `in_flight` at
//! once, each its own HTTP/2 stream), or a few long-lived `Session` streams
//! on which batches are pipelined as they form, without waiting for the
//! answers to earlier ones; the server runs the batches that arrived
//! together as one. Either way every operation gets its own result.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bagel_proto::clock::Clock;
use bagel_proto::{Micros, pb};
use prost::Message as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::backend::{AcquireSpec, LeaseBackend};
use crate::client::{Client, RenewTo, acquire_request, release_request, renew_request, upgrade_request};
use crate::error::{Error, Result};
use crate::grpc_error::from_status;
use crate::types::{Grant, LeaseRef, Metadata, ReleaseOptions, Renewal};
use crate::verify::{self, Verified};

/// How a [`Coalescer`] reaches the server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transport {
    /// Unary `Batch` calls, up to `in_flight` at once.
    #[default]
    Batch,
    /// One `Session` stream (reopened after a failure), with up to
    /// `in_flight` batches sent ahead of their answers.
    Session,
}

/// How a [`Coalescer`] batches.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct CoalesceOptions {
    /// Most operations in one batch (the server's limit is 1024).
    pub max_batch: usize,
    /// Batches in flight at once (per stream with `Transport::Session`).
    pub in_flight: usize,
    /// Unary `Batch` calls (the default) or pipelined `Session` streams.
    pub transport: Transport,
    /// `Session` streams, each run by the server on its own task (so on
    /// more than one core). Default: one per two CPUs this process may
    /// use, 1 to 8.
    pub streams: usize,
    /// Most HTTP/2 connections the `Session` streams are spread over,
    /// round robin (the first is the client's own; never more than
    /// `streams`). One connection is served by one task on each side, so
    /// a server gives one connection's streams about one core: on a
    /// 16-core server one coalescer's sessions used 1.4 cores over one
    /// connection and 3 over 16. Default 8: up to 8 streams each get a
    /// connection of their own.
    pub connections: usize,
    /// Verify every grant's witness (one ed25519 check per batch, since the
    /// grants of a batch share their signature). Default true.
    pub verify_witnesses: bool,
    /// Ask for answers in the lean form (`BatchRequest.lean`): each grant's
    /// witness body alone and one signature per answer, from which every
    /// witness is derived byte for byte as the full form carries it, for
    /// less to encode, send and decode on both ends. Default true; a server
    /// that predates the lean form answers in the full one, which is read
    /// as before.
    pub lean_answers: bool,
}

impl Default for CoalesceOptions {
    fn default() -> Self {
        CoalesceOptions {
            max_batch: 256,
            in_flight: 16,
            transport: Transport::Batch,
            streams: default_streams(),
            connections: 8,
            verify_witnesses: true,
            lean_answers: true,
        }
    }
}

/// One session stream per two CPUs this process may run on, 1 to 8.
///
/// Why it depends on the client's CPUs: on one client core a second
/// stream only adds hand-offs (pinned 1+1: 54k cycles/s with one stream of
/// 16 in flight, 39k with two of 4, both cores a third idle), while on a
/// 16-core machine one stream kept the server on 1.3 cores (101k cycles/s)
/// and 8 to 16 streams on their own connections reached 195-271k.
fn default_streams() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).clamp(1, 8))
}

impl CoalesceOptions {
    /// Sets [`CoalesceOptions::max_batch`] (at least 1). A batch over
    /// the server's `--max-batch-ops` is refused whole: keep it at or
    /// below the server's limit.
    #[must_use]
    pub fn with_max_batch(mut self, n: usize) -> Self {
        self.max_batch = n.max(1);
        self
    }

    /// Sets [`CoalesceOptions::in_flight`] (at least 1): more lets
    /// batches form while others are answered, at the cost of more
    /// operations queued behind a slow server.
    #[must_use]
    pub fn with_in_flight(mut self, n: usize) -> Self {
        self.in_flight = n.max(1);
        self
    }

    /// Sets [`CoalesceOptions::streams`] (at least 1; `Session` only).
    #[must_use]
    pub fn with_streams(mut self, n: usize) -> Self {
        self.streams = n.max(1);
        self
    }

    /// `Session` streams spread over `n` connections (see
    /// [`CoalesceOptions::connections`]).
    #[must_use]
    pub fn with_connections(mut self, n: usize) -> Self {
        self.connections = n.max(1);
        self
    }

    /// Sets [`CoalesceOptions::transport`].
    #[must_use]
    pub fn with_transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }

    /// Sets [`CoalesceOptions::verify_witnesses`]. Off only where the
    /// caller checks witnesses itself (a benchmark of the server): an
    /// unverified grant is believed as the server sent it.
    #[must_use]
    pub fn with_verify_witnesses(mut self, on: bool) -> Self {
        self.verify_witnesses = on;
        self
    }

    /// Sets [`CoalesceOptions::lean_answers`] (off: the full form, as
    /// clients before it asked; for comparing the two).
    #[must_use]
    pub fn with_lean_answers(mut self, on: bool) -> Self {
        self.lean_answers = on;
        self
    }
}

/// What one operation of a batch came to, checked.
#[derive(Debug)]
pub(crate) enum Outcome {
    Granted(Grant),
    Renewed(Renewal),
    Released(Micros),
}

type Reply = oneshot::Sender<Result<Outcome>>;

/// One queued operation: the op, the lease a renewal is of (its witness
/// must say so), and who waits for the answer.
struct Job {
    op: pb::BatchOp,
    renewing: Option<String>,
    reply: Reply,
}

type Jobs = Arc<tokio::sync::Mutex<mpsc::Receiver<Job>>>;

/// Coalesces lease operations of many tasks into batches. Cheap to clone
/// (clones share the queue); its sending tasks stop when the last clone is
/// dropped. Use it with [`crate::AcquireBuilder::via`].
#[derive(Clone, Debug)]
pub struct Coalescer {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    tx: mpsc::Sender<Job>,
    /// The server batches go to (its clock, max TTL and URL).
    client: Client,
    _stop: DropGuard,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").finish_non_exhaustive()
    }
}

impl Coalescer {
    /// Starts the tasks that send `client`'s batches (`in_flight`
    /// flushers, or one task per `Session` stream); they stop when the
    /// last clone is dropped. Needs a tokio runtime: call it from async
    /// code.
    pub fn new(client: Client, options: CoalesceOptions) -> Self {
        let (tx, rx) = mpsc::channel(options.max_batch * options.in_flight * 2);
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let cancel = CancellationToken::new();
        match options.transport {
            Transport::Batch => {
                for _ in 0..options.in_flight {
                    tokio::spawn(flusher(client.clone(), Arc::clone(&rx), options, cancel.clone()));
                }
            }
            Transport::Session => {
                let connections: Vec<Client> = (0..options.connections.min(options.streams))
                    .map(|i| {
                        if i == 0 {
                            client.clone()
                        } else {
                            client.on_new_connection()
                        }
                    })
                    .collect();
                for i in 0..options.streams {
                    let on = connections[i % connections.len()].clone();
                    tokio::spawn(session(on, Arc::clone(&rx), options, cancel.clone()));
                }
            }
        }
        Coalescer {
            inner: Arc::new(Inner {
                tx,
                client,
                _stop: cancel.drop_guard(),
            }),
        }
    }

    /// Runs one renewal as part of some batch.
    async fn renew(&self, req: pb::RenewRequest, lease: &LeaseRef) -> Result<Renewal> {
        match self
            .call(pb::batch_op::Op::Renew(req), Some(lease.id.clone()))
            .await?
        {
            Outcome::Renewed(r) => Ok(r),
            other => Err(unexpected("renewal", &other)),
        }
    }

    /// Runs one operation as part of some batch.
    async fn call(&self, op: pb::batch_op::Op, renewing: Option<String>) -> Result<Outcome> {
        let stopped = || Error::Unavailable {
            message: "coalescer stopped".into(),
            retry_after: None,
        };
        let (reply, rx) = oneshot::channel();
        let job = Job {
            op: pb::BatchOp { op: Some(op) },
            renewing,
            reply,
        };
        self.inner.tx.send(job).await.map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }
}

/// The server a coalescer was made over, every operation batched.
#[async_trait]
impl LeaseBackend for Coalescer {
    fn location(&self) -> String {
        self.inner.client.url().to_owned()
    }

    fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(self.inner.client.clock())
    }

    fn max_ttl(&self) -> Duration {
        self.inner.client.max_ttl()
    }

    /// Batched acquires cannot wait: a long wait polls instead.
    fn max_wait(&self) -> Option<Duration> {
        Some(Duration::ZERO)
    }

    // What is not batched is asked of the server through the client the
    // coalescer was made over.
    async fn describe(&self, names: &[String]) -> Result<Vec<crate::types::NameState>> {
        LeaseBackend::describe(&self.inner.client, names).await
    }

    async fn history(&self, name: &str) -> Result<crate::types::History> {
        LeaseBackend::history(&self.inner.client, name).await
    }

    async fn trusted_keys(&self) -> Result<bagel_proto::KeyRing> {
        LeaseBackend::trusted_keys(&self.inner.client).await
    }

    async fn info(&self) -> Result<crate::backend::BackendInfo> {
        LeaseBackend::info(&self.inner.client).await
    }

    fn describe_self(&self) -> String {
        self.inner.client.describe_self()
    }

    fn offers(&self, call: crate::backend::Call) -> crate::backend::Offer {
        self.inner.client.offers(call)
    }

    async fn list_names(&self, prefix: &str, limit: usize) -> Result<crate::backend::Listing> {
        self.inner.client.list_names(prefix, limit).await
    }

    async fn watch_names(
        &self,
        target: crate::types::WatchTarget,
        options: crate::backend::WatchOptions,
    ) -> Result<Box<dyn crate::backend::WatchStream>> {
        self.inner.client.watch_names(target, options).await
    }

    fn route_name(&self, name: &str) -> Result<crate::backend::NameRoute> {
        self.inner.client.route_name(name)
    }

    /// Acquires without waiting (batched acquires cannot wait).
    async fn acquire_lease(&self, spec: AcquireSpec) -> Result<Grant> {
        if !spec.wait.is_zero() {
            return Err(Error::invalid(
                "wait",
                "batched acquires cannot wait; acquire without .via() to wait",
            ));
        }
        match self
            .call(pb::batch_op::Op::Acquire(acquire_request(spec)), None)
            .await?
        {
            Outcome::Granted(g) => Ok(g),
            other => Err(unexpected("grant", &other)),
        }
    }

    async fn upgrade_lease(&self, lease: &LeaseRef) -> Result<Grant> {
        match self
            .call(pb::batch_op::Op::Upgrade(upgrade_request(lease)), None)
            .await?
        {
            Outcome::Granted(g) => Ok(g),
            other => Err(unexpected("grant", &other)),
        }
    }

    async fn renew_lease(
        &self,
        lease: &LeaseRef,
        deadline: Micros,
        metadata: Option<Metadata>,
    ) -> Result<Renewal> {
        self.renew(renew_request(lease, RenewTo::Deadline(deadline), metadata), lease)
            .await
    }

    /// Sent as `ttl_us`: the server counts it from its own clock.
    async fn renew_lease_ttl(
        &self,
        lease: &LeaseRef,
        ttl: Duration,
        metadata: Option<Metadata>,
    ) -> Result<Renewal> {
        self.renew(renew_request(lease, RenewTo::Ttl(ttl), metadata), lease)
            .await
    }

    async fn release_lease(&self, lease: &LeaseRef, options: ReleaseOptions) -> Result<Micros> {
        match self
            .call(pb::batch_op::Op::Release(release_request(lease, options)), None)
            .await?
        {
            Outcome::Released(wm) => Ok(wm),
            other => Err(unexpected("release", &other)),
        }
    }
}

fn unexpected(wanted: &str, got: &Outcome) -> Error {
    Error::Witness {
        reason: format!("server answered a {wanted} request with {got:?}"),
    }
}

/// A failed operation of a batch, as the error the unary call gives.
fn op_error(e: &pb::OpError) -> Error {
    // The unary call's details; a server before them sent the conflict
    // alone.
    let details = if e.details.is_empty() {
        e.conflict.as_ref().map(|c| c.encode_to_vec()).unwrap_or_default()
    } else {
        e.details.clone()
    };
    from_status(tonic::Status::with_details(
        tonic::Code::from_i32(e.code),
        e.message.clone(),
        details.into(),
    ))
}

/// Waits for one job (or `cancel`), yields once, then takes whatever else
/// is queued, up to `max` jobs. `None` once cancelled or the queue is
/// closed.
async fn gather(
    rx: &mut mpsc::Receiver<Job>,
    max: usize,
    cancel: &CancellationToken,
) -> Option<(Vec<pb::BatchOp>, Vec<Waiter>)> {
    let first = tokio::select! {
        job = rx.recv() => job,
        () = cancel.cancelled() => None,
    };
    let Job { op, renewing, reply } = first?;
    let (mut ops, mut replies) = (vec![op], vec![(renewing, reply)]);
    // Let the tasks that are ready to run queue their operations first:
    // one pass of the scheduler, no timer. Callers woken by the previous
    // batch's answers join this one instead of making a batch each (20-30 %
    // more cycles/s at 16 and 256 clients in the bench).
    tokio::task::yield_now().await;
    while ops.len() < max {
        match rx.try_recv() {
            Ok(Job { op, renewing, reply }) => {
                ops.push(op);
                replies.push((renewing, reply));
            }
            Err(_) => break,
        }
    }
    Some((ops, replies))
}

/// Who waits for one operation's answer (and the lease, for a renewal).
type Waiter = (Option<String>, Reply);

/// A server restarted without its key file signs with a new key: learns
/// it (when the client's keys are learned, not pinned) before the answers
/// are checked. One batch is signed by one key, so the first witness says
/// which; the check is a map lookup when the key is known.
async fn learn_new_keys(client: &Client, response: &pb::BatchResponse, options: &CoalesceOptions) {
    use pb::batch_result::Result as R;
    if !options.verify_witnesses {
        return;
    }
    let key_id = response.signed.as_ref().map(|s| s.key_id.as_str()).or_else(|| {
        response.results.iter().find_map(|r| match &r.result {
            Some(R::Grant(g)) => g.witness.as_ref().map(|w| w.key_id.as_str()),
            Some(R::Renewed(r)) => r.witness.as_ref().map(|w| w.key_id.as_str()),
            _ => None,
        })
    });
    client.learn_key(key_id).await;
}

/// Hands each caller its result, checked (see [`crate::verify`]; the
/// grants of a batch, and of the batches a session's server ran together,
/// share their signature, so `verified` carries the last one checked).
fn answer(
    replies: Vec<Waiter>,
    response: pb::BatchResponse,
    options: &CoalesceOptions,
    client: &Client,
    verified: &mut Verified,
) {
    use pb::batch_result::Result as R;
    let results = response.results.len();
    if results != replies.len() {
        let n = replies.len();
        let e = Error::Witness {
            reason: format!("batch of {n} answered with {results} results"),
        };
        return fail(replies, &e);
    }
    let ring = options.verify_witnesses.then(|| client.keys());
    let keys = ring.as_deref();
    // A lean answer's witnesses, one per lean result, in order.
    let mut lean = match verify::lean_witnesses(&response, keys, verified) {
        Ok(witnesses) => witnesses.into_iter(),
        Err(e) => return fail(replies, &e),
    };
    for ((renewing, reply), result) in replies.into_iter().zip(response.results) {
        let r = match (result.result, renewing) {
            (None, _) => Err(Error::Witness {
                reason: "empty batch result".into(),
            }),
            (Some(R::Grant(g)), _) => verify::grant(g, keys, verified).map(Outcome::Granted),
            (Some(R::LeanGrant(g)), _) => {
                let witness = lean.next().expect("one witness per lean result");
                verify::lean_grant(g.token, witness).map(Outcome::Granted)
            }
            (Some(R::Renewed(r)), Some(lease)) => {
                verify::renewal(r, &lease, keys, verified).map(Outcome::Renewed)
            }
            (Some(R::LeanRenewed(_)), Some(lease)) => {
                let witness = lean.next().expect("one witness per lean result");
                verify::lean_renewal(witness, &lease).map(Outcome::Renewed)
            }
            (Some(R::Renewed(_) | R::LeanRenewed(_)), None) => Err(Error::Witness {
                reason: "a renewal answered an operation that was not one".into(),
            }),
            (Some(R::Released(r)), _) => Ok(Outcome::Released(Micros::from_micros(r.watermark_us))),
            (Some(R::Error(e)), _) => Err(op_error(&e)),
        };
        let _ = reply.send(r);
    }
}

/// Fails every caller of a batch that got no answer.
fn fail(replies: Vec<Waiter>, e: &Error) {
    let message = e.to_string();
    for (_, reply) in replies {
        let _ = reply.send(Err(if e.is_retryable() {
            Error::Unavailable {
                message: message.clone(),
                retry_after: None,
            }
        } else {
            Error::Other {
                message: message.clone(),
                retryable: false,
            }
        }));
    }
}

/// `Transport::Batch`: takes whatever is queued (up to `max_batch`) and
/// sends it as one `Batch` call; `in_flight` of these run at once.
async fn flusher(client: Client, rx: Jobs, options: CoalesceOptions, cancel: CancellationToken) {
    loop {
        let batch = {
            let mut rx = tokio::select! {
                rx = rx.lock() => rx,
                () = cancel.cancelled() => return,
            };
            gather(&mut rx, options.max_batch, &cancel).await
        };
        let Some((ops, replies)) = batch else { return };
        let lean = options.lean_answers;
        match client.rpc().batch(pb::BatchRequest { ops, lean }).await {
            Ok(r) => {
                let response = r.into_inner();
                learn_new_keys(&client, &response, &options).await;
                answer(
                    replies,
                    response,
                    &options,
                    &client,
                    &mut verify::Verified::default(),
                );
            }
            Err(status) => fail(replies, &from_status(status)),
        }
    }
}

/// Callers of the batches sent on a session, in the order sent; the
/// server answers in that order.
struct Waiting {
    /// False once the stream ended: nothing more will be answered.
    open: bool,
    /// Each with the permit that counts it as in flight.
    batches: VecDeque<(Vec<Waiter>, OwnedSemaphorePermit)>,
}

/// `Transport::Session`: sends batches on one `Session` stream as they
/// form, up to `in_flight` ahead of their answers; a failed stream fails
/// the batches it had not answered, and the next batch opens a new one.
///
/// A batch is formed only once it may be sent (its in-flight permit is
/// held): a batch formed first and then kept waiting for a permit would go
/// out with the one or two operations that were queued when it formed,
/// while everything that queued during the wait went in the batch after.
/// Forming it late makes each batch take all that waited, so the pipeline
/// carries as many operations as the callers have ready (formed first, a
/// session at 256 callers sent batches of a few operations and left both
/// the server's core and the client's idle).
async fn session(client: Client, jobs: Jobs, options: CoalesceOptions, cancel: CancellationToken) {
    let gather = || async {
        let mut rx = tokio::select! {
            rx = jobs.lock() => rx,
            () = cancel.cancelled() => return None,
        };
        gather(&mut rx, options.max_batch, &cancel).await
    };
    let in_flight = Arc::new(Semaphore::new(options.in_flight));
    // Room for one more batch in flight (`None` once cancelled).
    let room = || async {
        tokio::select! {
            p = Arc::clone(&in_flight).acquire_owned() => p.ok(), // never closed
            () = cancel.cancelled() => None,
        }
    };
    // A batch (with its permit) that a stream which ended could not take.
    let mut pending = None;
    loop {
        // Open a stream only when there is something to send.
        let next = match pending.take() {
            Some(next) => Some(next),
            None => match room().await {
                Some(p) => gather().await.map(|batch| (batch, p)),
                None => None,
            },
        };
        let Some(mut next) = next else { return };
        let (requests, outgoing) = mpsc::channel::<pb::BatchRequest>(options.in_flight);
        let waiting = Arc::new(Mutex::new(Waiting {
            open: true,
            batches: VecDeque::new(),
        }));
        tokio::spawn(read_answers(
            client.clone(),
            tokio_stream::wrappers::ReceiverStream::new(outgoing),
            Arc::clone(&waiting),
            options,
        ));
        loop {
            let ((ops, replies), permit) = next;
            {
                let mut w = waiting.lock().unwrap_or_else(PoisonError::into_inner);
                if !w.open {
                    // The stream ended: this batch goes on the next one.
                    pending = Some(((ops, replies), permit));
                    break;
                }
                w.batches.push_back((replies, permit));
            }
            let request = pb::BatchRequest {
                ops,
                lean: options.lean_answers,
            };
            if requests.send(request).await.is_err() {
                // The stream is gone; its reader fails what it left unanswered.
                break;
            }
            let Some(p) = room().await else { return };
            match gather().await {
                Some(batch) => next = (batch, p),
                None => return,
            }
        }
    }
}

/// Why a session ended, for the callers it leaves unanswered. This client
/// never cancels a stream it still reads, so CANCELLED (or UNKNOWN, a
/// transport error) means the connection went away: retryable, like
/// UNAVAILABLE. A status the server chose (a request refused as a whole)
/// keeps its meaning.
fn session_error(status: tonic::Status) -> Error {
    match status.code() {
        tonic::Code::Cancelled | tonic::Code::Unknown => Error::Unavailable {
            message: format!("session lost: {}", status.message()),
            retry_after: None,
        },
        _ => from_status(status),
    }
}

/// Reads a session's answers and hands them out in order; when the stream
/// ends, fails every batch still waiting.
async fn read_answers(
    client: Client,
    requests: tokio_stream::wrappers::ReceiverStream<pb::BatchRequest>,
    waiting: Arc<Mutex<Waiting>>,
    options: CoalesceOptions,
) {
    let next_waiting = || {
        waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .batches
            .pop_front()
    };
    let ended = match client.rpc().session(requests).await {
        Err(status) => session_error(status),
        Ok(call) => {
            let mut answers = call.into_inner();
            let mut verified = verify::Verified::default();
            loop {
                match answers.message().await {
                    Ok(Some(response)) => match next_waiting() {
                        Some((replies, _in_flight)) => {
                            learn_new_keys(&client, &response, &options).await;
                            answer(replies, response, &options, &client, &mut verified);
                        }
                        None => {
                            break Error::Witness {
                                reason: "session answered a batch that was never sent".into(),
                            };
                        }
                    },
                    Ok(None) => {
                        break Error::Unavailable {
                            message: "session ended by the server".into(),
                            retry_after: None,
                        };
                    }
                    Err(status) => break session_error(status),
                }
            }
        }
    };
    let unanswered = {
        let mut w = waiting.lock().unwrap_or_else(PoisonError::into_inner);
        w.open = false;
        std::mem::take(&mut w.batches)
    };
    for (replies, _in_flight) in unanswered {
        fail(replies, &ended);
    }
}
