//! How a [`crate::Client`] (or each server of a [`crate::Cluster`])
//! connects: TLS for `https://` servers, and time bounds on connecting and
//! on every call.

use std::fmt;
use std::time::Duration;

use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::error::{Error, Result};

/// TLS for `https://` lease servers (rustls with ring; no OpenSSL, and no
/// system roots: the CA is given). PEM text.
///
/// * `ca_pem`: the certificate(s) of the CA that signed the server's
///   certificate (`bagel-server --tls-cert`).
/// * [`TlsConfig::with_identity`]: this client's certificate and private
///   key, for servers that require one (`bagel-server --client-ca`); the
///   certificate's subject is then the owner of every lease it takes.
///
/// The server's certificate must name the host of the URL (a DNS name or
/// an IP address in its subjectAltName), unless
/// [`TlsConfig::with_domain`] names another.
#[derive(Clone)]
pub struct TlsConfig {
    ca_pem: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    domain: Option<String>,
}

impl fmt::Debug for TlsConfig {
    // The private key stays out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("ca_pem_bytes", &self.ca_pem.len())
            .field("client_certificate", &self.identity.is_some())
            .field("domain", &self.domain)
            .finish()
    }
}

impl TlsConfig {
    /// Trusts the CA certificate(s) in `ca_pem`.
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> Self {
        TlsConfig {
            ca_pem: ca_pem.into(),
            identity: None,
            domain: None,
        }
    }

    /// Presents this certificate and key (PEM) to servers that ask for one.
    #[must_use]
    pub fn with_identity(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Checks the server's certificate against this name instead of the
    /// URL's host.
    #[must_use]
    pub fn with_domain(mut self, domain: impl Into<String>) -> Self {
        self.domain = Some(domain.into());
        self
    }

    /// Whether a client certificate is configured.
    pub fn has_identity(&self) -> bool {
        self.identity.is_some()
    }

    /// Checks that the PEM holds what it should: rustls would otherwise
    /// skip what it cannot parse and fail later, at the handshake, with a
    /// less telling error. [`crate::Client::connect_with`] checks too.
    pub fn validate(&self) -> Result<()> {
        let has = |pem: &[u8], what: &str| {
            String::from_utf8_lossy(pem)
                .lines()
                .any(|l| l.starts_with("-----BEGIN ") && l.contains(what))
        };
        let refuse = |message: &str| {
            Err(Error::Config {
                message: format!("TLS: {message}"),
            })
        };
        if !has(&self.ca_pem, "CERTIFICATE") {
            return refuse("the CA file holds no PEM certificate (-----BEGIN CERTIFICATE-----)");
        }
        if let Some((cert, key)) = &self.identity {
            if !has(cert, "CERTIFICATE") {
                return refuse("the client certificate file holds no PEM certificate");
            }
            if !has(key, "PRIVATE KEY") {
                return refuse("the client key file holds no PEM private key");
            }
        }
        Ok(())
    }

    /// The tonic configuration, once [`TlsConfig::validate`]d.
    pub(crate) fn to_tonic(&self, handshake_timeout: Duration) -> Result<ClientTlsConfig> {
        self.validate()?;
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .timeout(handshake_timeout);
        if let Some((cert, key)) = &self.identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &self.domain {
            tls = tls.domain_name(domain.clone());
        }
        Ok(tls)
    }
}

/// How to connect to a lease server.
///
/// ```
/// use std::time::Duration;
/// use bagel_client::{ClientOptions, TlsConfig};
/// let ca_pem = b"-----BEGIN CERTIFICATE-----\n...".to_vec();
/// let options = ClientOptions::default()
///     .with_tls(TlsConfig::new(ca_pem))
///     .with_timeout(Duration::from_secs(30));
/// // Client::connect_with("https://leases.example:7420", &options)
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClientOptions {
    /// TLS for `https://` URLs (required for them: there are no default
    /// roots). Ignored for `http://` URLs.
    pub tls: Option<TlsConfig>,
    /// Bound on opening the connection (TCP, TLS handshake, HTTP/2);
    /// default 5 s.
    pub connect_timeout: Duration,
    /// Bound on each unary call of [`crate::Client`] (an acquire that lets
    /// the server wait gets its wait on top). `None` (the default): calls
    /// are not bounded by the client. Batches and sessions of a
    /// [`crate::Coalescer`] are not bounded by it; a lease's background
    /// renewals are always bounded by its deadline.
    pub call_timeout: Option<Duration>,
    /// A bearer token sent with every call (`authorization: Bearer
    /// <token>`): this client's identity on a server whose access policy
    /// (`bagel-server --acl`) knows it. Use it over TLS only.
    pub bearer_token: Option<BearerToken>,
    /// Opening a [`crate::Cluster`]: how long it waits for a member whose
    /// identity the list gives (`ID=URL`) to answer before going on
    /// without it, as it does for a member that is down; default 1 s.
    ///
    /// Why a bound: a member that is frozen (a long pause, a suspended VM,
    /// a hung host) accepts connections and answers nothing, so waiting
    /// for it would hold up every name for as long as it stays frozen. Its
    /// own names wait for it when used, and it is checked against its ID
    /// when it first answers. Members without an ID are always waited for:
    /// their identity decides which names are theirs.
    pub member_wait: Duration,
    /// A server list found in DNS (`dns+srv://NAME`, see
    /// [`crate::DnsCluster`]): the resolver to ask, `IP:PORT`. `None` (the
    /// default): `BAGEL_DNS_SERVER` when set, else the system's resolver
    /// (`/etc/resolv.conf`).
    pub dns_server: Option<std::net::SocketAddr>,
    /// A server list found in DNS: how often it is looked up again, with
    /// the members' announced lists; default 30 s. A change is followed
    /// only as the members announce it (see [`crate::DnsCluster`]), so an
    /// operator's migration waits this long on top of the max TTL.
    pub dns_refresh: Duration,
}

/// A bearer token, which `Debug` never prints.
#[derive(Clone)]
pub struct BearerToken(pub(crate) tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl BearerToken {
    /// `token` as an `authorization` value, refused when it is empty or
    /// not visible ASCII (the message never quotes it).
    pub fn new(token: &str) -> std::result::Result<Self, String> {
        let token = token.trim();
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("a bearer token must be non-empty visible ASCII (no spaces)".into());
        }
        let mut value: tonic::metadata::MetadataValue<tonic::metadata::Ascii> = format!("Bearer {token}")
            .parse()
            .map_err(|_| "a bearer token must be visible ASCII".to_owned())?;
        value.set_sensitive(true);
        Ok(BearerToken(value))
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(..)")
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            tls: None,
            connect_timeout: Duration::from_secs(5),
            call_timeout: None,
            bearer_token: None,
            member_wait: Duration::from_secs(1),
            dns_server: None,
            dns_refresh: Duration::from_secs(30),
        }
    }
}

impl ClientOptions {
    /// Sets [`ClientOptions::dns_server`].
    #[must_use]
    pub fn with_dns_server(mut self, at: std::net::SocketAddr) -> Self {
        self.dns_server = Some(at);
        self
    }

    /// Sets [`ClientOptions::dns_refresh`].
    #[must_use]
    pub fn with_dns_refresh(mut self, every: Duration) -> Self {
        self.dns_refresh = every;
        self
    }

    /// Sets [`ClientOptions::tls`]: needed for `https://` servers.
    #[must_use]
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Sets [`ClientOptions::connect_timeout`].
    #[must_use]
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`ClientOptions::member_wait`].
    #[must_use]
    pub fn with_member_wait(mut self, wait: Duration) -> Self {
        self.member_wait = wait;
        self
    }

    /// Sets [`ClientOptions::call_timeout`]: a call not answered within
    /// `timeout` fails with `Error::Timeout` (retryable; the server may
    /// still have done it, so a timed-out acquire may have been granted).
    #[must_use]
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = Some(timeout);
        self
    }

    /// Sets [`ClientOptions::bearer_token`].
    #[must_use]
    pub fn with_bearer_token(mut self, token: BearerToken) -> Self {
        self.bearer_token = Some(token);
        self
    }

    /// Bounds both connecting and every call by `timeout`.
    #[must_use]
    pub fn with_timeout(self, timeout: Duration) -> Self {
        self.with_connect_timeout(timeout).with_call_timeout(timeout)
    }
}

/// Refuses URLs that are not `http://` or `https://` (what else would
/// parse as a URI, `ftp://` or a bare `host:port`, fails later and less
/// clearly). The message quotes the URL; callers prefix the flag or field.
pub fn check_server_url(url: &str) -> std::result::Result<(), String> {
    let scheme = url.split_once("://").map(|(s, _)| s);
    match scheme {
        Some("http" | "https") => {}
        Some(other) => {
            return Err(format!(
                "{url:?}: scheme {other:?} is not served; use http:// or https://"
            ));
        }
        None => {
            return Err(format!(
                "{url:?} is not a URL; use http://HOST:PORT or https://HOST:PORT"
            ));
        }
    }
    let rest = &url[url.find("://").map_or(0, |i| i + 3)..];
    if rest.is_empty() || rest.starts_with('/') {
        return Err(format!("{url:?} has no host"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_http_and_https_urls_pass() {
        assert!(check_server_url("http://127.0.0.1:7420").is_ok());
        assert!(check_server_url("https://leases.example:7420").is_ok());
        let e = check_server_url("ftp://127.0.0.1:21").unwrap_err();
        assert!(e.contains("\"ftp\"") && e.contains("http://"), "{e}");
        assert!(
            check_server_url("127.0.0.1:7420")
                .unwrap_err()
                .contains("not a URL")
        );
        assert!(check_server_url("http://").unwrap_err().contains("no host"));
    }

    #[test]
    fn pem_without_certificates_is_refused_before_any_handshake() {
        let e = TlsConfig::new("not pem")
            .to_tonic(Duration::from_secs(1))
            .unwrap_err();
        assert!(e.to_string().contains("CA file"), "{e}");
        let ca = "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n";
        let e = TlsConfig::new(ca)
            .with_identity(ca, "no key here")
            .to_tonic(Duration::from_secs(1))
            .unwrap_err();
        assert!(e.to_string().contains("private key"), "{e}");
        assert!(!format!("{:?}", TlsConfig::new(ca).with_identity(ca, "secret")).contains("secret"));
    }
}
