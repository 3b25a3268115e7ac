//! [`Corked`]: a connection's writes held back until its task has let the
//! other ready tasks run once, so the answers they finish go out in the
//! same system call.
//!
//! Why: HTTP/2 (h2) writes and flushes whatever frames are queued each
//! time its connection task runs, and a tokio worker runs a task it just
//! woke next (its LIFO slot). Each call's task that finishes an answer
//! wakes the connection task, which then ran at once and flushed that one
//! answer: on the pinned unary bench, 23,700 `writev`s a second for 26,000
//! answers, a system call and a TCP segment each (13 % of the server's
//! CPU in `writev` alone), although 32 calls were in flight on each
//! connection.
//!
//! A flush here first yields the task once (it wakes itself and returns
//! `Pending`, which puts it at the back of the run queue), so the calls
//! whose answers are ready finish theirs first; the flush after that writes
//! everything with one call. The cost is one scheduler pass per flush; at
//! low load there is nothing else to run and the answer goes out at once.
//!
//! Bounded: at most [`HIGH_WATER`] bytes wait here (a write beyond it
//! first sends what waits, and is refused with `Pending` while the socket
//! cannot take it, as a socket's own buffer would), and an idle connection
//! keeps at most [`KEEP_CAPACITY`] bytes of buffer. A connection dropped
//! without a flush hands what it holds to the socket on the way out
//! ([`Corked::send_held_now`]), as a plain socket would have sent it.
//! A write of [`CORK_BELOW`] bytes or more with nothing held goes straight
//! to the socket: it would be sent at its flush anyway, and copying a
//! session's answers through the buffer gained nothing.
//!
//! Why not tokio's `BufWriter` with a yield in front of its flush: after a
//! flush the socket took only in part, its `buffer()` still holds the
//! bytes already sent (its count of them is private), so a connection
//! dropped in that state could not tell what is left to hand over; and it
//! allocates its whole capacity, which is also its most bytes per system
//! call, for every connection up front.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Most bytes held back before a write must wait for the socket.
pub const HIGH_WATER: usize = 256 * 1024;

/// A flush of this many bytes or more writes at once: an answer this big
/// is worth its system call, and one that waited would wait behind
/// whatever the other ready tasks do (a session's next group: holding a
/// session's answers back for it cost its client a quarter of its
/// throughput).
pub const CORK_BELOW: usize = 4 * 1024;

/// Buffer capacity an emptied buffer keeps (more is given back).
pub const KEEP_CAPACITY: usize = 8 * 1024;

/// `S` with its writes held until the next flush after a yield.
#[derive(Debug)]
pub struct Corked<S> {
    inner: S,
    /// Bytes accepted and not yet written to `inner`.
    held: Vec<u8>,
    /// How many bytes of `held` are already written.
    sent: usize,
    /// The task has yielded once since `held` became non-empty: the next
    /// flush writes.
    yielded: bool,
}

impl<S> Corked<S> {
    pub fn new(inner: S) -> Self {
        Corked {
            inner,
            held: Vec::new(),
            sent: 0,
            yielded: false,
        }
    }

    /// Bytes accepted and not yet written.
    pub fn held(&self) -> usize {
        self.held.len() - self.sent
    }
}

impl Corked<tokio::net::TcpStream> {
    /// Hands what is held to the socket without waiting, as far as it
    /// takes it: for a connection about to be dropped without a flush.
    ///
    /// Why: bytes written to a plain socket reach the kernel at once and
    /// go out even if the connection is then dropped. A TLS acceptor that
    /// fails a handshake (a plaintext client on a TLS port) writes its
    /// alert and drops the connection without flushing; held here, the
    /// alert was lost and the client could no longer be told that the
    /// server speaks TLS.
    pub fn send_held_now(&mut self) {
        while self.sent < self.held.len() {
            match self.inner.try_write(&self.held[self.sent..]) {
                Ok(n) if n > 0 => self.sent += n,
                _ => break,
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> Corked<S> {
    /// Writes out everything held (`Pending` while the socket is full).
    fn poll_send_held(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.held.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.held[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.held.clear();
        self.held.shrink_to(KEEP_CAPACITY);
        self.sent = 0;
        self.yielded = false;
        Poll::Ready(Ok(()))
    }

    /// Room for `n` more bytes: sends what is held first when `n` would
    /// take it past [`HIGH_WATER`].
    fn poll_room(&mut self, cx: &mut Context<'_>, n: usize) -> Poll<io::Result<()>> {
        if self.held() > 0 && self.held() + n > HIGH_WATER {
            ready!(self.poll_send_held(cx))?;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Corked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Corked<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.held() == 0 && buf.len() >= CORK_BELOW {
            return Pin::new(&mut self.inner).poll_write(cx, buf);
        }
        ready!(self.poll_room(cx, buf.len()))?;
        self.held.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let n: usize = bufs.iter().map(|b| b.len()).sum();
        if self.held() == 0 && n >= CORK_BELOW {
            return Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        }
        ready!(self.poll_room(cx, n))?;
        self.held.reserve(n);
        for b in bufs {
            self.held.extend_from_slice(b);
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.held() > 0 {
            if !self.yielded && self.held() < CORK_BELOW {
                // Yield: a task that wakes itself while running is queued
                // behind the tasks already ready (not in the LIFO slot).
                self.yielded = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            ready!(self.poll_send_held(cx))?;
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_send_held(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    use super::*;

    /// A socket that records each write it takes, or takes none while full.
    #[derive(Default)]
    struct Socket {
        writes: Vec<Vec<u8>>,
        full: bool,
        flushed: usize,
        shut: bool,
    }

    impl AsyncWrite for Socket {
        fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            if self.full {
                return Poll::Pending;
            }
            self.writes.push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.flushed += 1;
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.shut = true;
            Poll::Ready(Ok(()))
        }
    }

    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waker() -> (Arc<Wakes>, Waker) {
        let wakes = Arc::new(Wakes::default());
        (Arc::clone(&wakes), Waker::from(wakes))
    }

    fn write(c: &mut Corked<Socket>, cx: &mut Context<'_>, bytes: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(c).poll_write(cx, bytes)
    }

    /// Asserts that a write took all its bytes at once.
    fn taken(p: Poll<io::Result<usize>>) {
        assert!(matches!(p, Poll::Ready(Ok(_))), "the write was not taken");
    }

    fn flush(c: &mut Corked<Socket>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(c).poll_flush(cx)
    }

    #[test]
    fn small_answers_flushed_before_a_yield_go_out_in_one_write_after_it() {
        let (wakes, waker) = waker();
        let mut cx = Context::from_waker(&waker);
        let mut c = Corked::new(Socket::default());
        assert!(matches!(write(&mut c, &mut cx, b"one "), Poll::Ready(Ok(4))));
        let parts = [IoSlice::new(b"two "), IoSlice::new(b"three")];
        assert!(matches!(
            Pin::new(&mut c).poll_write_vectored(&mut cx, &parts),
            Poll::Ready(Ok(9))
        ));
        // The first flush yields: the task woke itself, nothing was written.
        assert!(flush(&mut c, &mut cx).is_pending());
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
        assert!(c.inner.writes.is_empty());
        // More finished while it waited; the next flush sends all at once.
        assert!(matches!(write(&mut c, &mut cx, b" four"), Poll::Ready(Ok(5))));
        assert!(matches!(flush(&mut c, &mut cx), Poll::Ready(Ok(()))));
        assert_eq!(c.inner.writes, vec![b"one two three four".to_vec()]);
        assert_eq!((c.inner.flushed, c.held()), (1, 0));
        // The next small answer yields again.
        taken(write(&mut c, &mut cx, b"five"));
        assert!(flush(&mut c, &mut cx).is_pending());
        assert_eq!(wakes.0.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_flush_with_nothing_held_or_with_a_large_answer_does_not_wait() {
        let (wakes, waker) = waker();
        let mut cx = Context::from_waker(&waker);
        let mut c = Corked::new(Socket::default());
        assert!(matches!(flush(&mut c, &mut cx), Poll::Ready(Ok(()))));
        // A large answer with nothing held goes to the socket as written,
        // not copied into the buffer first.
        let big = vec![7u8; CORK_BELOW];
        taken(write(&mut c, &mut cx, &big));
        assert_eq!((c.inner.writes.len(), c.held()), (1, 0));
        let parts = [IoSlice::new(&big[..10]), IoSlice::new(&big[10..])];
        taken(Pin::new(&mut c).poll_write_vectored(&mut cx, &parts));
        assert_eq!((c.inner.writes.len(), c.held()), (2, 0));
        assert!(matches!(flush(&mut c, &mut cx), Poll::Ready(Ok(()))));
        // Held behind a small one, it is sent at the flush without a wait.
        taken(write(&mut c, &mut cx, b"small"));
        taken(write(&mut c, &mut cx, &big));
        assert!(matches!(flush(&mut c, &mut cx), Poll::Ready(Ok(()))));
        assert_eq!(c.inner.writes[2].len(), 5 + big.len());
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn held_bytes_are_bounded_and_a_full_socket_holds_the_writer_back() {
        let (_, waker) = waker();
        let mut cx = Context::from_waker(&waker);
        let mut c = Corked::new(Socket::default());
        // Chunks below CORK_BELOW: each is held, none goes straight out.
        let chunk = vec![1u8; 1024];
        for _ in 0..HIGH_WATER / chunk.len() {
            taken(write(&mut c, &mut cx, &chunk));
        }
        assert_eq!((c.held(), c.inner.writes.len()), (HIGH_WATER, 0));
        // One more would pass the high water mark: what is held goes first.
        taken(write(&mut c, &mut cx, &chunk));
        assert_eq!(c.inner.writes.len(), 1);
        assert_eq!(c.inner.writes[0].len(), HIGH_WATER);
        assert_eq!(c.held(), chunk.len());
        // While the socket takes nothing, a write past the mark waits.
        c.inner.full = true;
        for _ in 0..HIGH_WATER / chunk.len() - 1 {
            taken(write(&mut c, &mut cx, &chunk));
        }
        assert!(write(&mut c, &mut cx, &chunk).is_pending());
        assert_eq!(c.held(), HIGH_WATER);
        c.inner.full = false;
        assert!(matches!(write(&mut c, &mut cx, &chunk), Poll::Ready(Ok(_))));
        assert_eq!(c.held(), chunk.len());
    }

    #[test]
    fn shutdown_sends_what_is_held_first() {
        let (_, waker) = waker();
        let mut cx = Context::from_waker(&waker);
        let mut c = Corked::new(Socket::default());
        taken(write(&mut c, &mut cx, b"last words"));
        assert!(matches!(
            Pin::new(&mut c).poll_shutdown(&mut cx),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(c.inner.writes, vec![b"last words".to_vec()]);
        assert!(c.inner.shut);
    }

    #[tokio::test]
    async fn what_is_held_reaches_the_peer_when_a_socket_is_given_up_without_a_flush() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let mut peer = tokio::net::TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (socket, _) = listener.accept().await.expect("accept");
        let mut c = Corked::new(socket);
        c.write_all(b"an alert").await.expect("held");
        assert_eq!(c.held(), 8);
        c.send_held_now();
        drop(c);
        let mut got = Vec::new();
        peer.read_to_end(&mut got).await.expect("read until closed");
        assert_eq!(got, b"an alert");
    }

    #[test]
    fn an_emptied_buffer_gives_back_what_it_grew_beyond_the_kept_capacity() {
        let (_, waker) = waker();
        let mut cx = Context::from_waker(&waker);
        let mut c = Corked::new(Socket::default());
        taken(write(&mut c, &mut cx, &vec![0u8; 100 * 1024]));
        assert!(matches!(flush(&mut c, &mut cx), Poll::Ready(Ok(()))));
        assert!(c.held.capacity() <= KEEP_CAPACITY);
    }
}
