//! The tower layer every gRPC request passes through before tonic decodes
//! it: message framing with limits, calls in flight per connection, and
//! the unread-answer budget (see [`super::answers`]).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::{Buf as _, Bytes};
use http::{HeaderMap, Request, Response};
use http_body::{Body as HttpBody, Frame};
use tonic::Status;
use tonic::body::Body;

use super::answers::{self, AnswerBudget, AnswerSlot, Charge};
use super::{CallGuard, ConnState, conn_info, wire};
use crate::error::Error;

/// The bounds the layer enforces, and the bytes buffered over all
/// connections.
#[derive(Debug)]
pub struct FrameLimits {
    /// Largest request message (its announced length).
    pub max_message: usize,
    /// Bytes of partly received messages buffered per connection.
    pub per_connection: usize,
    /// ... and over all connections.
    pub total: usize,
    pub max_names: usize,
    pub max_batch_ops: usize,
    /// The bounds on answers made and not yet read.
    pub answers: Arc<AnswerBudget>,
    /// What a `Batch` reserves for its answer, by its operations.
    pub batch_answer: answers::BatchBound,
    buffered: AtomicUsize,
}

impl FrameLimits {
    pub fn new(
        max_message: usize,
        per_connection: usize,
        total: usize,
        max_names: usize,
        max_batch_ops: usize,
    ) -> Self {
        FrameLimits {
            max_message,
            per_connection,
            total,
            max_names,
            max_batch_ops,
            answers: AnswerBudget::new(usize::MAX, usize::MAX, usize::MAX, std::time::Duration::ZERO),
            batch_answer: answers::BatchBound::new(256, 256),
            buffered: AtomicUsize::new(0),
        }
    }

    /// The same, with the bound on a `Batch` answer for these limits on a
    /// name's and an owner's bytes.
    pub fn with_batch_answer(mut self, bound: answers::BatchBound) -> Self {
        self.batch_answer = bound;
        self
    }

    /// The same, with bounds on unread answers.
    pub fn with_answers(mut self, answers: Arc<AnswerBudget>) -> Self {
        self.answers = answers;
        self
    }

    /// Bytes of partly received messages buffered now, over all connections.
    pub fn buffered(&self) -> usize {
        self.buffered.load(Ordering::Acquire)
    }
}

/// See the module docs.
#[derive(Clone, Debug)]
pub struct LimitLayer {
    limits: Arc<FrameLimits>,
    answers: Arc<AnswerBudget>,
}

impl LimitLayer {
    pub fn new(limits: Arc<FrameLimits>) -> Self {
        let answers = Arc::clone(&limits.answers);
        LimitLayer { limits, answers }
    }
}

impl<S> tower::Layer<S> for LimitLayer {
    type Service = LimitService<S>;

    fn layer(&self, inner: S) -> LimitService<S> {
        LimitService {
            inner,
            limits: Arc::clone(&self.limits),
            answers: Arc::clone(&self.answers),
        }
    }
}

#[derive(Clone, Debug)]
pub struct LimitService<S> {
    inner: S,
    limits: Arc<FrameLimits>,
    answers: Arc<AnswerBudget>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower::Service<Request<Body>> for LimitService<S>
where
    S: tower::Service<Request<Body>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: HttpBody + Default + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Send,
{
    type Response = Response<Tracked<B>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let conn = conn_info(req.extensions()).map(|c| Arc::clone(&c.state));
        // A connection that leaves its answers unread gets no new ones.
        if let Some(refusal) = conn.as_deref().and_then(|c| self.answers.admit(c).err()) {
            let response = refusal.into_http::<B>().map(Tracked::new);
            return Box::pin(std::future::ready(Ok(response)));
        }
        // The call is in flight until its response body is done: the
        // connection is not idle meanwhile (a long Session included).
        let guard = conn.as_ref().map(ConnState::begin);
        let path = req.uri().path();
        let scan = Scan::for_path(path);
        // A unary answer is reserved for (by its handler, or its request
        // body) and charged as made: see `answers`.
        let slot = conn
            .as_ref()
            .filter(|_| answers::is_unary(path))
            .map(|c| AnswerSlot::new(Arc::clone(&self.answers), Arc::clone(c)));
        let batch = slot.clone().filter(|_| scan == Scan::Batch);
        let limits = Arc::clone(&self.limits);
        let mut req =
            req.map(|body| Body::new(Framed::new(body, limits, conn.clone(), scan).reserving(batch)));
        if let Some(slot) = &slot {
            req.extensions_mut().insert(Arc::clone(slot));
        }
        let response = self.inner.call(req);
        Box::pin(async move {
            let (parts, inner) = response.await?.into_parts();
            let mut body = Tracked::new(inner);
            body.call = guard;
            if let Some(slot) = slot {
                body.charge_answer(&slot).await;
            }
            Ok(Response::from_parts(parts, body))
        })
    }
}
/// What a body's `poll_frame` gives once ready.
type Polled<B> = Option<Result<Frame<<B as HttpBody>::Data>, <B as HttpBody>::Error>>;

/// A response body that keeps its call counted as in flight until it is
/// finished or dropped, and a unary answer charged to the unread-answer
/// budget until then.
pub struct Tracked<B: HttpBody> {
    inner: B,
    /// What the answer's first poll gave, taken early to size the answer
    /// (see [`Tracked::charge_answer`]); yielded first.
    peeked: Option<Polled<B>>,
    charge: Option<Charge>,
    call: Option<CallGuard>,
}

/// Nothing of it is pinned but `inner`, itself `Unpin`: the peeked frame
/// is moved out by value.
impl<B: HttpBody + Unpin> Unpin for Tracked<B> {}

impl<B: HttpBody> std::fmt::Debug for Tracked<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracked")
            .field("peeked", &self.peeked.is_some())
            .field("charge", &self.charge)
            .finish_non_exhaustive()
    }
}

impl<B: HttpBody + Unpin> Tracked<B> {
    fn new(inner: B) -> Self {
        Tracked {
            inner,
            peeked: None,
            charge: None,
            call: None,
        }
    }

    /// Encodes the answer now (a unary answer's body is ready at once: its
    /// one message) and charges its bytes, in place of what was reserved
    /// for it, to its connection and the server until the body is finished
    /// or dropped.
    async fn charge_answer(&mut self, slot: &AnswerSlot) {
        let first = std::future::poll_fn(|cx| Pin::new(&mut self.inner).poll_frame(cx)).await;
        let bytes = match &first {
            Some(Ok(frame)) => frame.data_ref().map_or(0, |d| d.remaining()),
            _ => 0,
        };
        self.charge = slot.made(bytes);
        self.peeked = Some(first);
    }
}

impl<B: HttpBody + Unpin> HttpBody for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Polled<B>> {
        let this = &mut *self;
        let polled = match this.peeked.take() {
            Some(first) => first,
            None => std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)),
        };
        if polled.is_none() {
            // Finished: the client has taken the answer into its window.
            this.charge = None;
            this.call = None;
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        match &self.peeked {
            Some(first) => first.is_none(),
            None => self.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.peeked {
            Some(_) => http_body::SizeHint::default(),
            None => self.inner.size_hint(),
        }
    }
}

/// What a request's messages are checked for before decoding, by method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scan {
    Nothing,
    /// `AcquireRequest`, `DescribeRequest`: `names` (field 1).
    Names,
    /// `BatchRequest` (`Batch`, `Session`): `ops` (field 1), and the names
    /// of its acquires (`ops.acquire` is field 1, its `names` field 1).
    Batch,
}

impl Scan {
    pub(crate) fn for_path(path: &str) -> Scan {
        match path.strip_prefix("/bagel.v1.LeaseService/") {
            Some("Acquire" | "Describe") => Scan::Names,
            Some("Batch" | "Session") => Scan::Batch,
            _ => Scan::Nothing,
        }
    }

    /// Refuses a message whose repeated fields hold more elements than the
    /// request may have, before they are decoded (and allocated).
    fn check(self, message: &[u8], limits: &FrameLimits) -> Result<(), Status> {
        match self {
            Scan::Nothing => Ok(()),
            Scan::Names => {
                let n = wire::count(message, 1);
                if n > limits.max_names {
                    return Err(Error::invalid(
                        "names",
                        format!("{n} names exceed the limit of {} per request", limits.max_names),
                    )
                    .into());
                }
                Ok(())
            }
            Scan::Batch => {
                let ops = wire::count(message, 1);
                if ops > limits.max_batch_ops {
                    return Err(Error::invalid(
                        "ops",
                        format!(
                            "{ops} operations exceed the limit of {} per batch",
                            limits.max_batch_ops
                        ),
                    )
                    .into());
                }
                let names: usize = wire::messages(message, 1)
                    .flat_map(|op| wire::messages(op, 1))
                    .map(|acquire| wire::count(acquire, 1))
                    .sum();
                let max = limits.max_batch_ops.saturating_mul(limits.max_names);
                if names > max {
                    return Err(Error::invalid(
                        "ops",
                        format!(
                            "{names} names in one batch exceed the limit of {max} ({} operations of {} names)",
                            limits.max_batch_ops, limits.max_names
                        ),
                    )
                    .into());
                }
                Ok(())
            }
        }
    }
}

const HEADER: usize = 5;

#[derive(Debug)]
enum State {
    /// Reading a message's 5-byte prefix (compression flag, length).
    Header { buf: [u8; HEADER], have: usize },
    /// Reading its body of `len` bytes into `buf`.
    Body {
        header: [u8; HEADER],
        len: usize,
        buf: Vec<u8>,
    },
}

/// A request body handed to tonic one whole gRPC message at a time.
///
/// Why: tonic reserves the length a message's prefix announces as soon as
/// the prefix arrives, before the body does; a client can announce 4 MiB
/// with 5 bytes, per stream. Here a message's bytes are gathered as they
/// arrive (the buffer grows with what was received, never with what was
/// announced), charged to the connection's and the server's budget of
/// partly received bytes, and passed on prefix first only once whole; so
/// tonic's reservation is for bytes already here. A message announcing more
/// than the size limit is refused at its prefix, RESOURCE_EXHAUSTED naming
/// the limit (tonic said OUT_OF_RANGE, after its reservation).
#[derive(Debug)]
pub struct Framed {
    inner: Body,
    limits: Arc<FrameLimits>,
    conn: Option<Arc<ConnState>>,
    scan: Scan,
    state: State,
    /// Whole messages (prefix, then body) ready for tonic.
    ready: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
    /// Bytes charged to the budgets for `state`'s buffer.
    charged: usize,
    /// A unary `Batch`'s answer, reserved for by its operations once its
    /// message is whole (see [`answers::BatchBound`]).
    answer: Option<Arc<AnswerSlot>>,
    ended: bool,
    failed: bool,
}

impl Framed {
    pub(crate) fn new(
        inner: Body,
        limits: Arc<FrameLimits>,
        conn: Option<Arc<ConnState>>,
        scan: Scan,
    ) -> Self {
        Framed {
            inner,
            limits,
            conn,
            scan,
            state: State::Header {
                buf: [0; HEADER],
                have: 0,
            },
            ready: VecDeque::new(),
            trailers: None,
            charged: 0,
            answer: None,
            ended: false,
            failed: false,
        }
    }

    /// The same, reserving the answer of each whole message in `answer`.
    pub(crate) fn reserving(mut self, answer: Option<Arc<AnswerSlot>>) -> Self {
        self.answer = answer;
        self
    }

    /// Checks a whole uncompressed message, and reserves its answer.
    fn admit(&self, message: &[u8]) -> Result<(), Status> {
        self.scan.check(message, &self.limits)?;
        let Some(slot) = &self.answer else {
            return Ok(());
        };
        let ops = wire::count(message, 1);
        let names: usize = wire::messages(message, 1)
            .flat_map(|op| wire::messages(op, 1))
            .map(|acquire| wire::count(acquire, 1))
            .sum();
        // All of it, or refused: a Batch's answer cannot be cut short.
        // Never more than a connection's share, which would refuse it on
        // any connection.
        let want = self
            .limits
            .batch_answer
            .answer(ops, names)
            .min(self.limits.answers.per_connection);
        slot.reserve(want, want)?;
        Ok(())
    }

    /// Charges `n` more buffered bytes to the connection and the server.
    fn charge(&mut self, n: usize) -> Result<(), Status> {
        if let Some(conn) = &self.conn {
            let now = conn.inflight.fetch_add(n, Ordering::AcqRel) + n;
            if now > self.limits.per_connection {
                conn.inflight.fetch_sub(n, Ordering::AcqRel);
                return Err(Error::limit(
                    "bytes of partly received request messages on this connection",
                    self.limits.per_connection,
                    "bytes",
                    "max-inflight-bytes-per-connection",
                )
                .into());
            }
        }
        let now = self.limits.buffered.fetch_add(n, Ordering::AcqRel) + n;
        if now > self.limits.total {
            self.limits.buffered.fetch_sub(n, Ordering::AcqRel);
            if let Some(conn) = &self.conn {
                conn.inflight.fetch_sub(n, Ordering::AcqRel);
            }
            return Err(Error::limit(
                "bytes of partly received request messages on this server",
                self.limits.total,
                "bytes",
                "max-inflight-bytes",
            )
            .into());
        }
        self.charged += n;
        Ok(())
    }

    fn uncharge(&mut self) {
        let n = std::mem::take(&mut self.charged);
        if n > 0 {
            self.limits.buffered.fetch_sub(n, Ordering::AcqRel);
            if let Some(conn) = &self.conn {
                conn.inflight.fetch_sub(n, Ordering::AcqRel);
            }
        }
    }

    /// The common case, a chunk of whole messages (a unary request is one
    /// DATA frame): checked and passed on as it is, with no copy.
    fn feed_whole(&mut self, data: &Bytes) -> Option<Result<(), Status>> {
        if !matches!(self.state, State::Header { have: 0, .. }) {
            return None;
        }
        let mut end = 0;
        for (_, len, _, at) in whole_messages(data) {
            if len > self.limits.max_message {
                return None; // the general path says why
            }
            end = at;
        }
        if end != data.len() || data.is_empty() {
            return None;
        }
        for (flag, _, body, _) in whole_messages(data) {
            if flag == 0
                && let Err(status) = self.admit(body)
            {
                return Some(Err(status));
            }
        }
        self.ready.push_back(data.clone());
        Some(Ok(()))
    }

    /// Takes in one chunk of the body.
    fn feed(&mut self, mut data: Bytes) -> Result<(), Status> {
        if let Some(done) = self.feed_whole(&data) {
            return done;
        }
        while data.has_remaining() {
            match &mut self.state {
                State::Header { buf, have } => {
                    let n = (HEADER - *have).min(data.len());
                    buf[*have..*have + n].copy_from_slice(&data[..n]);
                    *have += n;
                    data.advance(n);
                    if *have < HEADER {
                        continue;
                    }
                    let header = *buf;
                    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
                    if len > self.limits.max_message {
                        return Err(Error::limit(
                            format!("a request message of {len} bytes"),
                            self.limits.max_message,
                            "bytes",
                            "max-message-bytes",
                        )
                        .into());
                    }
                    if data.len() >= len {
                        // The whole message is in this chunk: no copy.
                        let body = data.split_to(len);
                        self.complete(header, body)?;
                    } else {
                        self.state = State::Body {
                            header,
                            len,
                            buf: Vec::new(),
                        };
                    }
                }
                State::Body { len, buf, .. } => {
                    let n = (*len - buf.len()).min(data.len());
                    let want = buf.len() + n;
                    if want > buf.capacity() {
                        // Grow with what arrived (doubling, from 8 KiB),
                        // never beyond the message.
                        let cap = want.max(buf.capacity() * 2).max(8 << 10).min(*len);
                        let more = cap - self.charged;
                        self.charge(more)?;
                        let State::Body { buf, .. } = &mut self.state else {
                            unreachable!()
                        };
                        buf.reserve_exact(cap - buf.len());
                    }
                    let State::Body { header, len, buf } = &mut self.state else {
                        unreachable!()
                    };
                    buf.extend_from_slice(&data[..n]);
                    data.advance(n);
                    if buf.len() == *len {
                        let (header, body) = (*header, Bytes::from(std::mem::take(buf)));
                        self.uncharge();
                        self.complete(header, body)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// A whole message: checked, then queued for tonic.
    fn complete(&mut self, header: [u8; HEADER], body: Bytes) -> Result<(), Status> {
        // A compressed message cannot be looked into; its decompressed
        // size is bounded by tonic, and we accept no compression anyway.
        if header[0] == 0 {
            self.admit(&body)?;
        }
        self.ready.push_back(Bytes::copy_from_slice(&header));
        if !body.is_empty() {
            self.ready.push_back(body);
        }
        self.state = State::Header {
            buf: [0; HEADER],
            have: 0,
        };
        Ok(())
    }

    fn mid_message(&self) -> Option<(usize, usize)> {
        match &self.state {
            State::Header { have: 0, .. } => None,
            State::Header { have, .. } => Some((*have, HEADER)),
            State::Body { len, buf, .. } => Some((HEADER + buf.len(), HEADER + len)),
        }
    }
}

/// The messages at the start of `data`, as (compression flag, announced
/// length, body, end offset), as long as they are whole.
fn whole_messages(data: &[u8]) -> impl Iterator<Item = (u8, usize, &[u8], usize)> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let header = data.get(at..at + HEADER)?;
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let body = data.get(at + HEADER..(at + HEADER).checked_add(len)?)?;
        at += HEADER + len;
        Some((header[0], len, body, at))
    })
}

impl Drop for Framed {
    fn drop(&mut self) {
        self.uncharge();
    }
}

impl HttpBody for Framed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        loop {
            if let Some(b) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
            if this.failed {
                return Poll::Ready(None);
            }
            if this.ended {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                None => {
                    this.ended = true;
                    if let Some((got, want)) = this.mid_message() {
                        this.failed = true;
                        this.uncharge();
                        return Poll::Ready(Some(Err(Status::invalid_argument(format!(
                            "the request ended inside a message: {got} of its {want} bytes arrived"
                        )))));
                    }
                }
                Some(Err(status)) => {
                    this.failed = true;
                    this.uncharge();
                    return Poll::Ready(Some(Err(status)));
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        if let Err(status) = this.feed(data) {
                            this.failed = true;
                            this.ready.clear();
                            this.uncharge();
                            return Poll::Ready(Some(Err(status)));
                        }
                    }
                    Err(frame) => {
                        if let Ok(t) = frame.into_trailers() {
                            this.trailers = Some(t);
                        }
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        (self.ended || self.inner.is_end_stream())
            && self.ready.is_empty()
            && self.trailers.is_none()
            && self.mid_message().is_none()
    }
}
