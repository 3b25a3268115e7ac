//! Why a connection to a lease server failed, in words a person can act
//! on: rustls's and HTTP/2's own words for the usual certificate mistakes
//! (a CA certificate used as the server's, a host missing from it, the
//! wrong `--ca`), a server that closes the connection on a client
//! certificate it does not trust, and a plaintext client of a TLS server.
//! Only the connect path reads these; a call's status otherwise becomes
//! the core's error in `grpc_error`, untouched.

use std::time::Duration;

use crate::error::{BoxError, Error};
use crate::grpc_error::{from_status, status_message};

/// A server that refuses the client's certificate (none presented, one
/// from another CA, an expired one) completes the TLS 1.3 handshake, then
/// closes the connection with an alert that the HTTP/2 layer reports only
/// as "connection closed" or "broken pipe": say what the likely reason is.
pub(super) fn hint_client_certificate(s: tonic::Status, presented: bool) -> Error {
    let hint = if presented {
        "the server closed the connection after the TLS handshake, as a server requiring client \
         certificates (mutual TLS) does with one it does not trust (another CA, expired)"
    } else {
        "the server closed the connection after the TLS handshake, as a server requiring client \
         certificates (mutual TLS) does when none is presented"
    };
    let closed = matches!(
        s.code(),
        tonic::Code::Cancelled | tonic::Code::Unknown | tonic::Code::Unavailable
    );
    if !closed {
        return from_status(s);
    }
    let message = format!("{}: {hint}", status_message(&s));
    from_status(tonic::Status::new(s.code(), message))
}

/// A TLS handshake failure in rustls's words (`invalid peer certificate:
/// Other(OtherError(CaUsedAsEndEntity))`) with what it means and what to
/// do, for the mistakes people make with certificates: a CA certificate
/// used as the server's (`openssl req -x509` makes CA:TRUE by default), a
/// host missing from the certificate's subjectAltName, a `--ca` that did
/// not issue it, dates out of range. Other errors are left as they are.
pub(super) fn with_tls_hint(source: BoxError) -> BoxError {
    let mut text = source.to_string();
    let mut cause = source.source();
    while let Some(c) = cause {
        let step = c.to_string();
        if !text.ends_with(&step) {
            text = format!("{text}: {step}");
        }
        cause = c.source();
    }
    let hint = if text.contains("CaUsedAsEndEntity") {
        "the server's certificate is a CA certificate (CA:TRUE, as `openssl req -x509` makes by \
         default); give the server a certificate issued by the CA, with CA:FALSE and this host in \
         its subjectAltName (the TLS recipe in docs/operating.md)"
    } else if text.contains("not valid for name") {
        "the server's certificate does not list the host of this URL in its subjectAltName; \
         connect by a name it lists, or reissue it with this host (the TLS recipe in \
         docs/operating.md)"
    } else if text.contains("UnknownIssuer") {
        "the server's certificate was not issued by the --ca given; pass the CA that issued it"
    } else if text.contains("Expired") || text.contains("NotValidYet") {
        "the server's certificate is outside its validity dates (or this host's clock is off)"
    } else {
        return source;
    };
    format!("{hint} ({text})").into()
}

/// A plaintext client of a TLS server only hears that the connection
/// closed (`operation was canceled: connection closed`) or that the TLS
/// alert was a bad HTTP/2 frame (`frame with invalid size`). When a call over
/// `http://` fails that way, ask the server once more, as a TLS client
/// would be answered: a TLS alert record (type 21, version 3.x) to our
/// plaintext says it speaks TLS, and the error says what to do.
pub(super) async fn hint_tls_server(s: tonic::Status, url: &str, timeout: Duration) -> Error {
    // The alert read as an HTTP/2 frame: `frame with invalid size`
    // (INTERNAL); or the closed connection (CANCELLED, UNKNOWN,
    // UNAVAILABLE).
    let closed = matches!(
        s.code(),
        tonic::Code::Cancelled | tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Unavailable
    );
    if !closed || !speaks_tls(url, timeout).await {
        return from_status(s);
    }
    Error::Config {
        message: format!("the server at {url} speaks TLS: use https:// and --ca (the CA to trust)"),
    }
}

/// Whether the server at `http://HOST:PORT` answers plaintext with a TLS
/// alert.
async fn speaks_tls(url: &str, timeout: Duration) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let Some(authority) = url
        .strip_prefix("http://")
        .map(|rest| rest.split('/').next().unwrap_or(rest))
    else {
        return false;
    };
    let probe = async {
        let mut tcp = tokio::net::TcpStream::connect(authority).await.ok()?;
        tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.ok()?;
        let mut head = [0u8; 2];
        tcp.read_exact(&mut head).await.ok()?;
        Some(head == [21, 3])
    };
    matches!(tokio::time::timeout(timeout, probe).await, Ok(Some(true)))
}
