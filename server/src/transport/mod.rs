//! Connections: how many, how long idle, and what each may make the server
//! hold before a request is decoded.
//!
//! * [`accept`]: the accept loop. At `max_connections` it stops accepting
//!   (new clients wait in the kernel's backlog) rather than fail; an accept
//!   error (EMFILE at the file-descriptor limit) is logged, at most once a
//!   second, and backed off rather than retried at once: an error that
//!   persists must neither spin a core nor go unsaid.
//!   One address may hold at most `max_connections_per_address` of the
//!   slots: beyond, its new connections are closed at accept, so that
//!   silent connections from one address cannot lock every other client
//!   out.
//! * [`Conn`]: one accepted connection. It closes itself once no call has
//!   been in flight on it for `idle_timeout`, or, if it never began one,
//!   `first_request_timeout` after it was accepted: a client that connects
//!   and goes quiet (or never finishes its TLS handshake) cannot hold a
//!   socket forever, and a silent one gives its slot back early. Under an
//!   access policy, a call begins a connection only once a call on it is
//!   identified: a connection whose callers the policy does not know
//!   (no token, a wrong one) is closed `first_request_timeout` after it
//!   was accepted, however many refused calls it makes, so callers
//!   without an identity hold no connection slot for long. The identity
//!   a connection's calls are first identified as owns it, and holds at
//!   most its share of the server's connections
//!   (`--max-connections-per-identity`, see `crate::shares`).
//! * [`corked`]: a connection's writes wait for one yield of its task, so
//!   the answers that calls finish together go out in one system call and
//!   one TCP segment, not a `writev` and a segment each.
//! * [`answers`]: what the server holds of answers made and not yet read,
//!   bounded in bytes (new calls refused) and in time (a connection that
//!   leaves its answers unread is closed, see [`Conn`]).
//! * [`layer`]: every request's body passes through [`layer::Framed`],
//!   which takes each gRPC message whole before tonic sees it (tonic
//!   reserves the length a message *announces* as soon as its 5-byte
//!   prefix arrives: 1000 streams each sending a prefix claiming 4 MiB took
//!   2 GiB) and charges partly received messages to a per-connection and a
//!   global budget.

pub mod answers;
pub mod corked;
pub mod layer;
pub mod wire;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use self::corked::Corked;

/// What the server knows of a connection, shared by the connection and its
/// requests (as the tonic connect info).
#[derive(Debug)]
pub struct ConnState {
    /// Calls in flight (request received, response not yet finished).
    active: AtomicUsize,
    /// When the last call began or ended, in ms since [`epoch`].
    last_active_ms: AtomicU64,
    /// Bytes of partly received request messages buffered (see
    /// [`layer::Framed`]).
    pub(crate) inflight: AtomicUsize,
    /// The client certificate's subject (mutual TLS) and the certificates
    /// the client sent after it, read on first use.
    subject: OnceLock<Option<(Arc<str>, Chain)>>,
    /// Whether a call ever began on the connection.
    began: std::sync::atomic::AtomicBool,
    /// Unary answers made and not yet finished, and their bytes (see
    /// [`answers`]).
    pub(crate) answers: AtomicUsize,
    pub(crate) answer_bytes: AtomicUsize,
    /// Bytes written to the socket: whether a client with unfinished
    /// answers reads them.
    written: AtomicU64,
    /// When the connection was accepted, in ms since [`epoch`].
    accepted_ms: u64,
    /// The identity whose connection this is (the first its calls were
    /// identified as), holding one of its share of connections.
    owner: OnceLock<crate::shares::Share>,
}

impl ConnState {
    pub(crate) fn new() -> Self {
        ConnState {
            active: AtomicUsize::new(0),
            last_active_ms: AtomicU64::new(now_ms()),
            inflight: AtomicUsize::new(0),
            subject: OnceLock::new(),
            began: std::sync::atomic::AtomicBool::new(false),
            answers: AtomicUsize::new(0),
            answer_bytes: AtomicUsize::new(0),
            written: AtomicU64::new(0),
            accepted_ms: now_ms(),
            owner: OnceLock::new(),
        }
    }

    /// Whether a call on the connection was identified (see
    /// [`ConnState::identify`]).
    pub(crate) fn identified(&self) -> bool {
        self.owner.get().is_some()
    }

    /// A call on the connection was identified as `identity`: the first
    /// such call makes the connection `identity`'s, one of its share of
    /// `connections` (refused, naming the share, when it holds its share
    /// already: the connection stays unowned, and is closed as one whose
    /// calls were never identified). Later calls, whoever they are, change
    /// nothing.
    pub(crate) fn identify(
        &self,
        identity: &Arc<str>,
        connections: &Arc<crate::shares::Pool>,
    ) -> Result<(), crate::error::Error> {
        if self.owner.get().is_some() {
            return Ok(());
        }
        let share = connections.take(Some(identity))?;
        // Two calls at once: the loser's slot is given back as it drops.
        let _ = self.owner.set(share);
        Ok(())
    }

    /// A call began on the connection; the returned guard ends it.
    pub(crate) fn begin(self: &Arc<Self>) -> CallGuard {
        self.active.fetch_add(1, Ordering::AcqRel);
        self.last_active_ms.store(now_ms(), Ordering::Release);
        self.began.store(true, Ordering::Release);
        CallGuard {
            state: Arc::clone(self),
        }
    }

    /// When the connection went idle, if it is.
    fn idle_since(&self) -> Option<u64> {
        (self.active.load(Ordering::Acquire) == 0).then(|| self.last_active_ms.load(Ordering::Acquire))
    }
}

/// One call in flight on a connection, until dropped.
#[derive(Debug)]
pub(crate) struct CallGuard {
    state: Arc<ConnState>,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.state.last_active_ms.store(now_ms(), Ordering::Release);
        self.state.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Milliseconds since the first call (a monotonic clock).
fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// The connect info of our connections, as requests see it (inside
/// `TlsConnectInfo` with TLS).
#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub remote: Option<SocketAddr>,
    pub state: Arc<ConnState>,
}

/// An accepted TCP connection that closes itself when idle, or when it
/// leaves its answers unread.
#[derive(Debug)]
pub struct Conn {
    /// Writes wait for one yield of the connection's task, so answers
    /// finished together share a system call (see [`corked`]).
    stream: Corked<TcpStream>,
    info: ConnInfo,
    idle_timeout: Duration,
    /// Idle limit until the first call begins (never above `idle_timeout`).
    first_request_timeout: Duration,
    /// Whether only an identified call begins the connection (under an
    /// access policy).
    must_identify: bool,
    /// The bound on unread answers (see [`answers`]).
    answers: Arc<answers::AnswerBudget>,
    /// Since when the connection has held unfinished answers without
    /// writing [`answers::MIN_PROGRESS`] bytes, and the bytes written then.
    stalled_since: Option<(u64, u64)>,
    /// Fires when the connection may have gone idle, or stalled, for long
    /// enough.
    timer: Pin<Box<Sleep>>,
    closed: bool,
    _slot: OwnedSemaphorePermit,
    _address_slot: AddressSlot,
}

/// How often a connection whose calls were never identified, past its
/// first request timeout with a call still in flight, looks again.
const UNIDENTIFIED_RECHECK_MS: u64 = 1000;

/// Why a connection closes itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Close {
    Idle,
    UnreadAnswers,
}

impl Conn {
    /// Whether the connection is to close now; if not, re-arms the timer
    /// for the earliest moment it could have to.
    fn should_close(&mut self, cx: &mut Context<'_>) -> Option<Close> {
        let stall = self.answers.stall_timeout.as_millis() as u64;
        if stall > 0 && self.stalled_since.is_none() && self.info.state.answers.load(Ordering::Acquire) > 0 {
            // Answers appeared since the timer was armed (for as much as
            // the idle timeout): check them within the stall bound.
            self.stalled_since = Some((now_ms(), self.info.state.written.load(Ordering::Acquire)));
            let at = Instant::now() + Duration::from_millis(stall);
            if self.timer.deadline() > at {
                self.timer.as_mut().reset(at);
            }
        }
        while self.timer.as_mut().poll(cx).is_ready() {
            let now = now_ms();
            let idle = match self.idle_check(now) {
                Ok(next) => next,
                Err(close) => return Some(close),
            };
            let stalled = match self.stall_check(now, stall) {
                Ok(next) => next,
                Err(close) => return Some(close),
            };
            let next = idle.into_iter().chain(stalled).min().unwrap_or(u64::MAX);
            // Nothing to watch for: look again in a minute (a call that
            // begins re-arms it through `stalled_since`).
            let next = if next == u64::MAX { 60_000 } else { next };
            let at = Instant::now() + Duration::from_millis(next.max(1));
            self.timer.as_mut().reset(at);
        }
        None
    }

    /// `Err(Close::Idle)` once no call has been in flight for the whole
    /// idle timeout, else the milliseconds until that could be.
    fn idle_check(&self, now: u64) -> Result<Option<u64>, Close> {
        let state = &self.info.state;
        if self.must_identify && !state.identified() && !self.first_request_timeout.is_zero() {
            // Under an access policy, calls nobody is identified by do not
            // begin the connection: it holds its slot at most the first
            // request timeout from its accept (once no call is in flight).
            let deadline = state.accepted_ms + self.first_request_timeout.as_millis() as u64;
            if now < deadline {
                return Ok(Some(deadline - now));
            }
            if state.active.load(Ordering::Acquire) == 0 {
                return Err(Close::Idle);
            }
            // A call in flight: look again when it may have ended.
            return Ok(Some(UNIDENTIFIED_RECHECK_MS));
        }
        let timeout = if self.info.state.began.load(Ordering::Acquire) {
            self.idle_timeout
        } else {
            self.first_request_timeout
        };
        if timeout.is_zero() {
            return Ok(None);
        }
        let timeout = timeout.as_millis() as u64;
        Ok(Some(match self.info.state.idle_since() {
            Some(since) if now >= since + timeout => return Err(Close::Idle),
            Some(since) => since + timeout - now,
            None => timeout,
        }))
    }

    /// `Err(Close::UnreadAnswers)` once the connection has held unfinished
    /// answers for `stall` ms while writing less than
    /// [`answers::MIN_PROGRESS`] bytes, else the milliseconds until the
    /// next look.
    fn stall_check(&mut self, now: u64, stall: u64) -> Result<Option<u64>, Close> {
        let state = &self.info.state;
        if stall == 0 || state.answers.load(Ordering::Acquire) == 0 {
            self.stalled_since = None;
            return Ok(None);
        }
        let written = state.written.load(Ordering::Acquire);
        match self.stalled_since {
            Some((since, at)) if written.saturating_sub(at) < answers::MIN_PROGRESS => {
                if now >= since + stall {
                    return Err(Close::UnreadAnswers);
                }
                Ok(Some(since + stall - now))
            }
            _ => {
                self.stalled_since = Some((now, written));
                Ok(Some(stall))
            }
        }
    }
}

/// What the connection's last writes left held goes to the socket as the
/// connection is dropped, as it would have unheld (see
/// [`Corked::send_held_now`]).
impl Drop for Conn {
    fn drop(&mut self) {
        self.stream.send_held_now();
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.closed {
            return Poll::Ready(Ok(()));
        }
        let this = &mut *self;
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Pending => {
                let Some(why) = this.should_close(cx) else {
                    return Poll::Pending;
                };
                // End of stream: the HTTP/2 connection (or the TLS
                // handshake) ends, the socket is closed, and the streams
                // on it are dropped with what they held.
                match why {
                    Close::Idle => tracing::debug!(peer = ?this.info.remote, "closing an idle connection"),
                    Close::UnreadAnswers => {
                        this.answers.count_closed();
                        tracing::warn!(
                            peer = ?this.info.remote,
                            unread_bytes = this.info.state.answer_bytes.load(Ordering::Acquire),
                            "closing a connection that left its answers unread for {:?} \
                             (bagel-server --answer-stall-timeout)",
                            this.answers.stall_timeout
                        );
                    }
                }
                this.closed = true;
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl Conn {
    fn count_written(&self, written: &Poll<io::Result<usize>>) {
        if let Poll::Ready(Ok(n)) = written {
            self.info.state.written.fetch_add(*n as u64, Ordering::Relaxed);
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.count_written(&written);
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.count_written(&written);
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

/// How the accept loop behaves.
#[derive(Clone, Debug)]
pub struct AcceptConfig {
    /// One permit per connection (`--max-connections`), held by the
    /// connection until it closes.
    pub slots: Arc<Semaphore>,
    /// Connections per client address (`--max-connections-per-address`).
    pub per_address: Arc<PerAddress>,
    pub idle_timeout: Duration,
    /// `--first-request-timeout`; zero: only `idle_timeout` applies.
    pub first_request_timeout: Duration,
    /// Unread answers: the bound in time is the connection's to keep.
    pub answers: Arc<answers::AnswerBudget>,
    /// Whether a connection begins only with an identified call (a
    /// server with an access policy): see [`Conn`].
    pub must_identify: bool,
}

/// How many connections each client address holds, against a cap.
#[derive(Debug)]
pub struct PerAddress {
    max: usize,
    held: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

impl PerAddress {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(PerAddress {
            max: max.max(1),
            held: Default::default(),
        })
    }

    /// One more connection from `ip`, unless it holds `max` already.
    fn take(self: &Arc<Self>, ip: std::net::IpAddr) -> Option<AddressSlot> {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = held.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(AddressSlot {
            of: Arc::clone(self),
            ip,
        })
    }

    /// Connections held by `ip` now.
    pub fn held(&self, ip: std::net::IpAddr) -> usize {
        let held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.get(&ip).copied().unwrap_or(0)
    }
}

/// One connection counted against its address, until dropped.
#[derive(Debug)]
struct AddressSlot {
    of: Arc<PerAddress>,
    ip: std::net::IpAddr,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut held = self
            .of
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = held.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// Accepts connections on `listener` until `stop` is cancelled (or the
/// receiver goes away), as a stream for tonic.
pub fn accept(
    listener: TcpListener,
    cfg: AcceptConfig,
    stop: CancellationToken,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<Conn>> {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(accept_loop(listener, cfg, stop, tx));
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

async fn accept_loop(
    listener: TcpListener,
    cfg: AcceptConfig,
    stop: CancellationToken,
    tx: mpsc::Sender<io::Result<Conn>>,
) {
    let slots = Arc::clone(&cfg.slots);
    let mut backoff = Backoff::default();
    let mut logged_full: Option<Instant> = None;
    let mut logged_address: Option<Instant> = None;
    loop {
        // A free connection slot first: at the limit, stop accepting (the
        // kernel's backlog holds new clients) instead of accepting and
        // dropping them.
        let slot = match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if logged_full.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!(
                        "connection limit reached: not accepting until a connection closes \
                         (bagel-server --max-connections)"
                    );
                    logged_full = Some(Instant::now());
                }
                tokio::select! {
                    slot = Arc::clone(&slots).acquire_owned() => slot.expect("never closed"),
                    () = stop.cancelled() => return,
                    () = tx.closed() => return,
                }
            }
        };
        let accepted = tokio::select! {
            r = listener.accept() => r,
            () = stop.cancelled() => return,
            () = tx.closed() => return,
        };
        let (stream, remote) = match accepted {
            Ok(pair) => {
                backoff.reset();
                pair
            }
            Err(e) if is_transient(&e) => continue,
            Err(e) => {
                // EMFILE, ENFILE, ENOBUFS, ENOMEM: nothing to accept until
                // something is freed. Say so (not on every attempt), and
                // wait before trying again.
                let wait = backoff.next();
                backoff.log(&e, wait);
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = stop.cancelled() => return,
                }
                continue;
            }
        };
        let Some(address_slot) = cfg.per_address.take(remote.ip()) else {
            if logged_address.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                tracing::warn!(
                    peer = %remote.ip(),
                    "closing new connections from an address holding {} already \
                     (bagel-server --max-connections-per-address)",
                    cfg.per_address.max
                );
                logged_address = Some(Instant::now());
            }
            drop(stream);
            continue;
        };
        // Without it every small response may wait ~40 ms for the peer's
        // delayed ACK (Nagle).
        let _ = stream.set_nodelay(true);
        let first_request_timeout = match cfg.first_request_timeout {
            d if d.is_zero() => cfg.idle_timeout,
            d if cfg.idle_timeout.is_zero() => d,
            d => d.min(cfg.idle_timeout),
        };
        let conn = Conn {
            stream: Corked::new(stream),
            info: ConnInfo {
                remote: Some(remote),
                state: Arc::new(ConnState::new()),
            },
            idle_timeout: cfg.idle_timeout,
            first_request_timeout,
            must_identify: cfg.must_identify,
            answers: Arc::clone(&cfg.answers),
            stalled_since: None,
            timer: Box::pin(tokio::time::sleep(
                first_request_timeout.max(Duration::from_millis(1)),
            )),
            closed: false,
            _slot: slot,
            _address_slot: address_slot,
        };
        if tx.send(Ok(conn)).await.is_err() {
            return;
        }
    }
}

/// Errors after which the next accept may well succeed at once.
fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::TimedOut
    )
}

/// Exponential back-off after accept errors (10 ms up to 1 s), and a log
/// line at most once a second saying how many errors there were.
#[derive(Debug, Default)]
struct Backoff {
    wait: Duration,
    errors: u64,
    last_log: Option<Instant>,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MAX: Duration = Duration::from_secs(1);

    fn next(&mut self) -> Duration {
        self.wait = (self.wait * 2).clamp(Self::FIRST, Self::MAX);
        self.errors += 1;
        self.wait
    }

    fn log(&mut self, e: &io::Error, wait: Duration) {
        if self
            .last_log
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        tracing::error!(
            error = %e,
            errors = self.errors,
            "cannot accept connections (at the file-descriptor limit?); retrying in {wait:?}"
        );
        self.last_log = Some(Instant::now());
        self.errors = 0;
    }

    fn reset(&mut self) {
        self.wait = Duration::ZERO;
    }
}

/// The certificates a client sent after its own (DER), if any.
pub type Chain = Arc<[Vec<u8>]>;

/// Who made a request: its address, and with mutual TLS the subject of
/// its client certificate.
#[derive(Clone, Debug, Default)]
pub struct Caller {
    pub peer: Option<std::net::IpAddr>,
    pub subject: Option<Arc<str>>,
    /// The certificates the client sent after its own: whatever chain the
    /// handshake verified its certificate through.
    pub chain: Option<Chain>,
    /// The request's bearer token, hashed (the access policy's; see
    /// `crate::acl::bearer`).
    pub bearer: Option<crate::acl::Bearer>,
    /// Where a unary call reserves the bytes of its answer before making
    /// it (see [`answers`]); `None` off the gRPC port.
    pub answer: Option<Arc<answers::AnswerSlot>>,
    /// The connection the call came on; `None` off the gRPC port.
    pub conn: Option<Arc<ConnState>>,
}

impl Caller {
    /// The first certificate of the client's chain that is not one of
    /// `trusted` (DER), as its subject. A client certificate must be issued
    /// directly by a `--client-ca` certificate: the handshake follows any
    /// chain the client sends, so a client certificate that is itself a CA
    /// (CA:TRUE) could otherwise sign a leaf for any subject, and be
    /// anyone.
    pub fn untrusted_issuer(&self, trusted: &[Vec<u8>]) -> Option<Arc<str>> {
        self.chain
            .iter()
            .flat_map(|chain| chain.iter())
            .find(|der| !trusted.iter().any(|t| t == *der))
            .map(|der| subject_of(der).unwrap_or_else(|| Arc::from("(unreadable certificate)")))
    }
}

impl Caller {
    pub fn of(ext: &http::Extensions) -> Caller {
        let Some(info) = conn_info(ext) else {
            return Caller::default();
        };
        let identity = info
            .state
            .subject
            .get_or_init(|| {
                let tls = ext.get::<tonic::transport::server::TlsConnectInfo<ConnInfo>>()?;
                let certs = tls.peer_certs()?;
                let subject = identity_of(certs.first()?)?;
                let chain: Chain = certs.iter().skip(1).map(|c| c.to_vec()).collect();
                Some((subject, chain))
            })
            .clone();
        let (subject, chain) = identity.unzip();
        Caller {
            peer: info.remote.map(|a| a.ip()),
            subject,
            chain,
            bearer: None,
            answer: ext.get::<Arc<answers::AnswerSlot>>().cloned(),
            conn: Some(Arc::clone(&info.state)),
        }
    }
}

/// The subject of a DER certificate, as RFC 4514 text (`CN=worker-1,O=acme`).
pub fn subject_of(der: &[u8]) -> Option<Arc<str>> {
    use x509_cert::der::Decode as _;
    let cert = x509_cert::Certificate::from_der(der).ok()?;
    Some(Arc::from(cert.tbs_certificate.subject.to_string()))
}

/// Who a client certificate (DER) says it is: its subject as RFC 4514
/// text, or, when the subject is empty (as SPIFFE issues them), its one
/// URI SAN (`spiffe://example.org/ns/a/sa/worker`). Empty when it has
/// neither, or several URI SANs, or one holding `=` (which only a
/// subject may: a URI never passes for a subject's pattern): the
/// service refuses such a caller rather than let every such certificate
/// share the identity `""`.
pub fn identity_of(der: &[u8]) -> Option<Arc<str>> {
    use x509_cert::der::Decode as _;
    use x509_cert::der::oid::AssociatedOid as _;
    use x509_cert::ext::pkix::SubjectAltName;
    use x509_cert::ext::pkix::name::GeneralName;
    let cert = x509_cert::Certificate::from_der(der).ok()?;
    let tbs = &cert.tbs_certificate;
    if !tbs.subject.0.is_empty() {
        return Some(Arc::from(tbs.subject.to_string()));
    }
    let uris: Vec<String> = tbs
        .extensions
        .iter()
        .flatten()
        .filter(|ext| ext.extn_id == SubjectAltName::OID)
        .filter_map(|ext| SubjectAltName::from_der(ext.extn_value.as_bytes()).ok())
        .flat_map(|san| san.0)
        .filter_map(|name| match name {
            GeneralName::UniformResourceIdentifier(uri) => Some(uri.to_string()),
            _ => None,
        })
        .collect();
    match uris.as_slice() {
        [uri] if !uri.contains('=') => Some(Arc::from(uri.as_str())),
        _ => Some(Arc::from("")),
    }
}

/// The state of the connection a request came on, with or without TLS.
pub fn conn_info(ext: &http::Extensions) -> Option<&ConnInfo> {
    ext.get::<ConnInfo>().or_else(|| {
        ext.get::<tonic::transport::server::TlsConnectInfo<ConnInfo>>()
            .map(|t| t.get_ref())
    })
}
