//! The `Session` RPC: `Batch` over one long-lived bidirectional stream.
//!
//! Why a stream as well as `Batch`: a unary call costs an HTTP/2 stream of
//! its own (headers, trailers, a task per request), and a client waiting
//! for one batch's answer before sending the next keeps both sides idle for
//! a round trip. On a session the client pipelines batches as its callers
//! produce operations, and the server runs whatever requests have arrived
//! together as one batch, with one signature for all their grants.
//!
//! Answers go out one per request, in the order the requests came.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bagel_proto::pb;
use prost::Message as _;
use tokio::sync::Notify;
use tokio_stream::Stream;
use tonic::{Status, Streaming};

use crate::error::Error;
use crate::service::Service;
use crate::transport::Caller;

/// Opens a session on `requests`: identifies the caller (under an access
/// policy, one without an identity is refused here, holding nothing),
/// takes one of its identity's share of sessions and one of the server's
/// `--max-sessions`, and runs the session in a task of its own, whose
/// answers come out of the returned stream.
pub(crate) fn open(
    service: &Service,
    requests: Streaming<pb::BatchRequest>,
    caller: Caller,
) -> Result<Answers, Error> {
    let limits = &service.inner.cfg.limits;
    let tenant = service.tenant(&caller)?;
    let share = service.inner.shares.sessions.take(tenant.as_ref())?;
    let slot = SessionSlot::take(&service.inner.sessions, limits.max_sessions, share)?;
    let outbox = Outbox::new(
        limits.session_buffer_bytes,
        limits.session_stall_timeout,
        Arc::clone(&service.inner.sessions_dropped),
    );
    tokio::spawn(run(service.clone(), requests, Arc::clone(&outbox), caller));
    Ok(Answers::new(outbox, slot))
}

/// Runs one session until the client closes its side, the stream fails, a
/// request is refused as a whole, the client stops reading, or the server
/// stops.
async fn run(
    service: Service,
    mut requests: Streaming<pb::BatchRequest>,
    answers: Arc<Outbox>,
    caller: Caller,
) {
    let inner = Arc::clone(&service.inner);
    let stopping = inner.stopping.clone();
    let sent = async {
        tokio::select! {
            () = serve(&service, &mut requests, &answers, &caller) => {}
            // Answers already made still go out, then this status.
            () = stopping.cancelled() => answers.push_final(Error::ShuttingDown.into()),
        }
    };
    sent.await;
    answers.finish();
}

async fn serve(
    service: &Service,
    requests: &mut Streaming<pb::BatchRequest>,
    answers: &Outbox,
    caller: &Caller,
) {
    let max_ops = service.inner.cfg.limits.max_batch_ops;
    // A request read ahead that did not fit in the previous group.
    let mut carried = None;
    loop {
        let first = match carried.take() {
            Some(request) => request,
            None => match requests.message().await {
                Ok(Some(request)) => request,
                Ok(None) => return,
                Err(status) => {
                    answers.push_final(status);
                    return;
                }
            },
        };
        let (group, ended) = take_ready(requests, first, max_ops, &mut carried);
        let forms: Vec<(usize, bool)> = group.iter().map(|r| (r.ops.len(), r.lean)).collect();
        let ops: Vec<pb::BatchOp> = group.into_iter().flat_map(|r| r.ops).collect();
        let at = service.inner.time.now();
        let covered = service
            .inner
            .cover(crate::service::batch_deadline(&ops, at))
            .await;
        let mut ran = match covered.and_then(|()| service.batch_ops(&ops, caller, at)) {
            Ok(ran) => ran,
            Err(e) => {
                answers.push_final(e.into());
                return;
            }
        };
        for (n, lean) in forms {
            if answers.send(ran.answer(n, lean)).await.is_err() {
                return; // the client went away, or stopped reading
            }
        }
        match ended {
            Requests::GoOn => {}
            Requests::Closed => return,
            Requests::Failed(status) => {
                answers.push_final(status);
                return;
            }
        }
    }
}

/// One answer of a session, or the status that ends it.
type Answer = Result<pb::BatchResponse, Status>;

/// Answers on their way to a session's reader, bounded in bytes.
///
/// Why bytes: a count of answers bounds nothing when answers can be
/// large, and a client that sends but never reads would make a session
/// hold gigabytes. The answers waiting for the reader may take `budget`
/// bytes (one answer larger than that may wait alone); beyond, the
/// session stops reading requests (HTTP/2 flow control then stops the
/// client). A reader that takes nothing for `stall` while
/// the buffer is full is dropped: the waiting answers are discarded and
/// the stream ends at once with RESOURCE_EXHAUSTED naming both limits.
#[derive(Debug)]
pub struct Outbox {
    state: Mutex<Out>,
    /// Woken when the reader takes an answer (or goes away).
    space: Notify,
    budget: usize,
    stall: Duration,
    /// The server's count of sessions dropped for stalling.
    dropped: Arc<std::sync::atomic::AtomicU64>,
}

#[derive(Debug, Default)]
struct Out {
    queue: VecDeque<(Answer, usize)>,
    bytes: usize,
    /// Set when the reader stalled: sent before anything queued.
    dropped: Option<Status>,
    /// No more answers will come.
    finished: bool,
    reader_gone: bool,
    waker: Option<Waker>,
}

/// The reader went away or stalled; the session should end.
#[derive(Debug)]
pub(crate) struct Gone;

impl Outbox {
    fn new(budget: usize, stall: Duration, dropped: Arc<std::sync::atomic::AtomicU64>) -> Arc<Self> {
        Arc::new(Outbox {
            state: Mutex::new(Out::default()),
            space: Notify::new(),
            budget: budget.max(1),
            stall,
            dropped,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Out> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `answer`, waiting while the buffer is full; drops the reader
    /// if it takes nothing for the stall timeout meanwhile.
    async fn send(&self, answer: pb::BatchResponse) -> Result<(), Gone> {
        let size = answer.encoded_len().min(self.budget);
        let mut answer = Some(answer);
        let give_up = tokio::time::Instant::now() + self.stall;
        loop {
            let space = self.space.notified();
            tokio::pin!(space);
            space.as_mut().enable();
            {
                let mut out = self.lock();
                if out.reader_gone || out.dropped.is_some() {
                    return Err(Gone);
                }
                if out.bytes == 0 || out.bytes + size <= self.budget {
                    out.bytes += size;
                    out.queue
                        .push_back((Ok(answer.take().expect("queued once")), size));
                    if let Some(w) = out.waker.take() {
                        w.wake();
                    }
                    return Ok(());
                }
            }
            tokio::select! {
                () = &mut space => {}
                () = tokio::time::sleep_until(give_up) => {
                    self.drop_reader();
                    return Err(Gone);
                }
            }
        }
    }

    /// The reader took nothing for the stall timeout: discard what waits
    /// and end the stream with a status saying why.
    fn drop_reader(&self) {
        self.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut out = self.lock();
        let waiting = out.bytes;
        out.queue.clear();
        out.bytes = 0;
        out.dropped = Some(Status::resource_exhausted(format!(
            "session closed: the client read no answer for {:?} while {waiting} bytes of answers \
             waited (limits: {} bytes buffered, bagel-server --session-buffer-bytes; {:?}, \
             --session-stall-timeout)",
            self.stall, self.budget, self.stall
        )));
        if let Some(w) = out.waker.take() {
            w.wake();
        }
    }

    /// Queues the status that ends the session, after what is queued (the
    /// budget does not apply: a status is small).
    fn push_final(&self, status: Status) {
        let mut out = self.lock();
        if out.dropped.is_none() && !out.finished {
            out.queue.push_back((Err(status), 0));
        }
        out.finished = true;
        if let Some(w) = out.waker.take() {
            w.wake();
        }
    }

    /// No more answers.
    fn finish(&self) {
        let mut out = self.lock();
        out.finished = true;
        if let Some(w) = out.waker.take() {
            w.wake();
        }
    }
}

/// The response stream of a session.
#[derive(Debug)]
pub struct Answers {
    outbox: Arc<Outbox>,
    /// Counted in the server's sessions until dropped.
    _slot: SessionSlot,
}

impl Answers {
    fn new(outbox: Arc<Outbox>, slot: SessionSlot) -> Self {
        Answers { outbox, _slot: slot }
    }
}

impl Stream for Answers {
    type Item = Answer;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Answer>> {
        let mut out = self.outbox.lock();
        if let Some(status) = out.dropped.take() {
            out.finished = true;
            out.queue.clear();
            return Poll::Ready(Some(Err(status)));
        }
        if let Some((answer, size)) = out.queue.pop_front() {
            out.bytes -= size;
            drop(out);
            self.outbox.space.notify_one();
            return Poll::Ready(Some(answer));
        }
        if out.finished {
            return Poll::Ready(None);
        }
        out.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Answers {
    fn drop(&mut self) {
        let mut out = self.outbox.lock();
        out.reader_gone = true;
        out.queue.clear();
        drop(out);
        self.outbox.space.notify_one();
    }
}

/// One of the server's `--max-sessions`, and of its identity's share,
/// given back on drop.
#[derive(Debug)]
pub struct SessionSlot {
    count: Arc<std::sync::atomic::AtomicUsize>,
    _share: crate::shares::Share,
}

impl SessionSlot {
    /// Takes a slot, or says the server has `max` sessions already.
    fn take(
        count: &Arc<std::sync::atomic::AtomicUsize>,
        max: usize,
        share: crate::shares::Share,
    ) -> Result<Self, Error> {
        use std::sync::atomic::Ordering;
        if count.fetch_add(1, Ordering::AcqRel) >= max {
            count.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::limit(
                "sessions open on this server",
                max,
                "sessions",
                "max-sessions",
            ));
        }
        Ok(SessionSlot {
            count: Arc::clone(count),
            _share: share,
        })
    }
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        self.count.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Whether the client's request stream goes on after a group is taken.
enum Requests {
    GoOn,
    Closed,
    Failed(Status),
}

/// `first` and the requests that have already arrived behind it, as long
/// as together they stay within `max_ops` operations. The request that
/// would overflow the group goes to `carried`, to start the next one (a
/// request over the limit on its own is refused by `batch_ops`).
fn take_ready(
    requests: &mut Streaming<pb::BatchRequest>,
    first: pb::BatchRequest,
    max_ops: usize,
    carried: &mut Option<pb::BatchRequest>,
) -> (Vec<pb::BatchRequest>, Requests) {
    let mut total = first.ops.len();
    let mut group = vec![first];
    if total >= max_ops {
        return (group, Requests::GoOn);
    }
    // Poll without waiting: a request that is not fully here yet waits for
    // the next round (the next `message().await` registers the real waker).
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        match Pin::new(&mut *requests).poll_next(&mut cx) {
            Poll::Ready(Some(Ok(request))) => {
                total += request.ops.len();
                if total > max_ops {
                    *carried = Some(request);
                    return (group, Requests::GoOn);
                }
                group.push(request);
            }
            Poll::Ready(Some(Err(status))) => return (group, Requests::Failed(status)),
            Poll::Ready(None) => return (group, Requests::Closed),
            Poll::Pending => return (group, Requests::GoOn),
        }
    }
}
