//! The HTTP/1.1 server behind every `--http` side port (`bagel-server`'s
//! metrics and status page, `bagel metronome`'s): what one client can make
//! the process hold is bounded, and shutdown waits on nobody for long.
//!
//! Why not `axum::serve`: it has no connection cap, no header timeout, a
//! 400 KB header buffer per connection, and its graceful shutdown waits for
//! every connection to finish, however slowly a client sends. One client
//! holding an unfinished request kept a server alive 120 s after SIGTERM;
//! 1,000 connections each sending 400 KB of one header line took 565 MB;
//! 2,100 idle connections under `ulimit -n 2048` took every descriptor, and
//! then the lease port could not accept either.
//!
//! Here ([`SidePortLimits`]):
//! * at most `max_connections` connections; one more is answered `503` and
//!   closed at once (a load balancer sees an answer, not a hang);
//! * a connection that would leave fewer than `reserved_fds` descriptors
//!   free to the process is refused the same way, so the lease port keeps
//!   its descriptors whatever the side port is sent;
//! * a request's head must arrive whole within `header_timeout` (also the
//!   longest a kept-alive connection may sit between requests), and be at
//!   most `max_header_bytes`;
//! * a connection on which no byte moves either way for `idle_timeout` is
//!   closed (a client that never reads its answer, or dribbles a body);
//! * on shutdown: no more accepts, idle connections close at once, requests
//!   in flight get `shutdown_grace`, then every connection is dropped.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

/// What one side port may hold; see the module docs for what each bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SidePortLimits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Time to send one request's head (and to begin the next one on a
    /// kept-alive connection).
    pub header_timeout: Duration,
    /// A connection with no byte read or written for this long is closed.
    pub idle_timeout: Duration,
    /// Largest request head, in bytes (at least [`MIN_HEADER_BYTES`]).
    pub max_header_bytes: usize,
    /// File descriptors the side port leaves free to the rest of the process.
    pub reserved_fds: u64,
    /// After shutdown begins, how long requests in flight may take.
    pub shutdown_grace: Duration,
}

/// hyper's smallest read buffer: a request head limit below it is raised to it.
pub const MIN_HEADER_BYTES: usize = 8192;

impl Default for SidePortLimits {
    fn default() -> Self {
        SidePortLimits {
            max_connections: 64,
            header_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            max_header_bytes: 16 << 10,
            reserved_fds: 256,
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

impl SidePortLimits {
    /// Sets [`SidePortLimits::max_connections`] (at least 1; one more is
    /// answered `503` and closed).
    #[must_use]
    pub fn with_max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Sets [`SidePortLimits::header_timeout`].
    #[must_use]
    pub fn with_header_timeout(mut self, d: Duration) -> Self {
        self.header_timeout = d;
        self
    }

    /// Sets [`SidePortLimits::idle_timeout`].
    #[must_use]
    pub fn with_idle_timeout(mut self, d: Duration) -> Self {
        self.idle_timeout = d;
        self
    }

    /// Sets [`SidePortLimits::max_header_bytes`], raised to
    /// [`MIN_HEADER_BYTES`] if below it.
    #[must_use]
    pub fn with_max_header_bytes(mut self, n: usize) -> Self {
        self.max_header_bytes = n.max(MIN_HEADER_BYTES);
        self
    }

    /// Sets [`SidePortLimits::reserved_fds`].
    #[must_use]
    pub fn with_reserved_fds(mut self, n: u64) -> Self {
        self.reserved_fds = n;
        self
    }

    /// Sets [`SidePortLimits::shutdown_grace`].
    #[must_use]
    pub fn with_shutdown_grace(mut self, d: Duration) -> Self {
        self.shutdown_grace = d;
        self
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown`, then stops
/// accepting and returns once every connection is closed, at most
/// `limits.shutdown_grace` later.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: SidePortLimits,
    shutdown: CancellationToken,
) {
    let addr = listener.local_addr().ok();
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let closing = CancellationToken::new();
    let mut conns = JoinSet::new();
    let mut refusals = RefusalLog::default();
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            () = shutdown.cancelled() => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and friends: nothing to accept until something
                // is freed; do not spin on it.
                refusals.log(&format!("cannot accept on the HTTP side port {addr:?}: {e}"));
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                    () = shutdown.cancelled() => break,
                }
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            refusals.log(&format!(
                "HTTP side port {addr:?}: {} connections open, refusing more",
                limits.max_connections
            ));
            refuse(&stream, "too many connections to this port\n");
            continue;
        };
        if let Some(free) = fds_short(limits.reserved_fds) {
            refusals.log(&format!(
                "HTTP side port {addr:?}: only {free} file descriptors left, {} reserved for the \
                 rest of the process: refusing the connection",
                limits.reserved_fds
            ));
            refuse(&stream, "out of file descriptors\n");
            continue;
        }
        let _ = stream.set_nodelay(true);
        conns.spawn(connection(
            stream,
            app.clone(),
            limits,
            closing.child_token(),
            slot,
        ));
    }
    drop(listener);
    closing.cancel();
    let drained = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(limits.shutdown_grace, drained)
        .await
        .is_err()
    {
        tracing::warn!(
            ?addr,
            open = conns.len(),
            "HTTP side port: connections still open after the shutdown grace ({:?}): closing them",
            limits.shutdown_grace
        );
        conns.abort_all();
        while conns.join_next().await.is_some() {}
    }
}

/// One connection, until it ends or `closing` fires (then: no more
/// requests; the one in flight, if any, finishes).
async fn connection(
    stream: TcpStream,
    app: axum::Router,
    limits: SidePortLimits,
    closing: CancellationToken,
    _slot: tokio::sync::OwnedSemaphorePermit,
) {
    let io = TokioIo::new(Idle::new(stream, limits.idle_timeout));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_header_bytes.max(MIN_HEADER_BYTES))
        .keep_alive(true);
    let conn = builder.serve_connection(io, TowerToHyperService::new(app));
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        () = closing.cancelled() => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

/// Answers a refused connection in one non-blocking write (if the socket
/// takes it) and closes it.
fn refuse(stream: &TcpStream, why: &str) {
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{why}",
        why.len()
    );
    let _ = stream.try_write(answer.as_bytes());
}

/// `Some(free)` when fewer than `reserved` descriptors are left below the
/// process's limit (`RLIMIT_NOFILE`), counting the open ones in
/// `/proc/self/fd`. `None` when there is room, or when it cannot be told.
fn fds_short(reserved: u64) -> Option<u64> {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current?;
    let open = match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir.count() as u64,
        // Not even one descriptor left to look with.
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::MFILE.raw_os_error()) => limit,
        Err(_) => return None,
    };
    let free = limit.saturating_sub(open);
    (free < reserved).then_some(free)
}

/// Logs a refusal at most once a second, with how many there were.
#[derive(Debug, Default)]
struct RefusalLog {
    last: Option<Instant>,
    unlogged: u64,
}

impl RefusalLog {
    fn log(&mut self, what: &str) {
        self.unlogged += 1;
        if self.last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        tracing::warn!(refused = self.unlogged, "{what}");
        self.last = Some(Instant::now());
        self.unlogged = 0;
    }
}

/// A TCP stream that fails with `TimedOut` once no byte has moved either
/// way for `timeout` while the server waits on it.
#[derive(Debug)]
struct Idle {
    stream: TcpStream,
    timeout: Duration,
    last_progress: Instant,
    timer: Pin<Box<Sleep>>,
}

impl Idle {
    fn new(stream: TcpStream, timeout: Duration) -> Self {
        let now = Instant::now();
        Idle {
            stream,
            timeout,
            last_progress: now,
            timer: Box::pin(tokio::time::sleep_until(now + timeout)),
        }
    }

    fn progressed(&mut self) {
        self.last_progress = Instant::now();
    }

    /// Called when the stream would block: an error once idle too long,
    /// otherwise the timer is armed for the moment it would be.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.timeout.is_zero() {
            return Ok(());
        }
        let due = self.last_progress + self.timeout;
        if self.timer.deadline() != due {
            self.timer.as_mut().reset(due);
        }
        if self.timer.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no byte moved for {:?}", self.timeout),
            ));
        }
        Ok(())
    }

    fn after<T>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending => match self.check(cx) {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            },
            ready => {
                self.progressed();
                ready
            }
        }
    }
}

impl AsyncRead for Idle {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        this.after(cx, polled)
    }
}

impl AsyncWrite for Idle {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.after(cx, polled)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.stream).poll_flush(cx);
        this.after(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_limit_below_hypers_minimum_is_raised() {
        let limits = SidePortLimits::default().with_max_header_bytes(100);
        assert_eq!(limits.max_header_bytes, MIN_HEADER_BYTES);
    }

    #[test]
    fn a_process_far_from_its_descriptor_limit_has_room() {
        assert_eq!(fds_short(0), None);
    }
}
