//! Where leases live: one server (`--server`), several (`--servers`, with
//! `--next-servers` while migrating), or no server at all
//! (`--lease-store s3://...`, see `crate::store`). One URL in `--servers`
//! is the same as `--server`: the same calls, the same JSON. Every lease
//! command, `bagel run` and `bagel write` go through [`Target`], so the
//! rest of the CLI never asks which one it is: what only some backends
//! answer (list, watch, routing) the backend states and answers itself.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use bagel_cli::{LeaseBackendOptions, open_lease_backend};
use bagel_client::{ClientOptions, LeaseBackend, ServerSpec, TlsConfig};
use bagel_proto::clock::Clock;
use bagel_proto::{KeyRing, SignedClock};

use crate::store::StoreArgs;
use crate::time_cmds::RoughtimeArgs;

/// The lease flags, as given.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Lease servers")]
pub struct TargetArgs {
    /// The lease server: a URL, or HOST:PORT (http://, or https:// when
    /// --ca is given).
    #[arg(
        long,
        global = true,
        env = "BAGEL_SERVER",
        default_value = "http://127.0.0.1:7420"
    )]
    pub server: String,
    /// Several lease servers, comma-separated, each `[ID=]URL[#KEY]` (URL
    /// as for --server: HOST:PORT is accepted); or `dns+srv://NAME`, the
    /// members found in DNS by NAME's SRV records, routed by the lists
    /// they announce (their --members; resolver: BAGEL_DNS_SERVER=IP:PORT,
    /// else the system's).
    /// Names are routed over them by rendezvous hashing on the identity
    /// each server announces (its --server-id), never on the URL as
    /// written, so every spelling of a list routes alike. ID, when given,
    /// must be what that server announces (checked); give every ID so
    /// that a server that is down fails only its names (without its ID
    /// the client cannot start). KEY (the server's public key in hex) pins
    /// the key its witnesses must carry. Overrides --server.
    #[arg(long, global = true, env = "BAGEL_SERVERS")]
    pub servers: Option<String>,
    /// While migrating: the server list being moved to. Every name then
    /// needs a grant from its owner in --servers and in this list.
    #[arg(long, global = true, env = "BAGEL_NEXT_SERVERS", requires = "servers")]
    pub next_servers: Option<String>,
    /// Bound on connecting to a lease server and on each call to it (an
    /// acquire with --wait gets its wait on top).
    #[arg(
        long,
        global = true,
        env = "BAGEL_TIMEOUT",
        default_value = "30s",
        value_parser = humantime::parse_duration,
        value_name = "DURATION"
    )]
    pub timeout: Duration,
    /// For https:// servers: the CA certificate (PEM) their certificates
    /// must chain to. There are no default roots.
    #[arg(long, global = true, env = "BAGEL_CA", value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// For servers that require client certificates (mutual TLS): this
    /// client's certificate (PEM). Its subject becomes the owner of every
    /// lease taken.
    #[arg(long, global = true, env = "BAGEL_CERT", value_name = "FILE", requires_all = ["ca", "cert_key"])]
    pub cert: Option<PathBuf>,
    /// The private key (PEM) of --cert.
    #[arg(
        long,
        global = true,
        env = "BAGEL_CERT_KEY",
        value_name = "FILE",
        requires = "cert"
    )]
    pub cert_key: Option<PathBuf>,
    /// For servers with an access policy (bagel-server --acl) and no
    /// client certificates: a file holding this client's bearer token
    /// (one line), sent with every call as `authorization: Bearer`. A
    /// file rather than a flag, so the token is in no process listing.
    #[arg(long, global = true, env = "BAGEL_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Leases with no server (`--lease-store`), which replace all of the above.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Whether --server was given (on the command line or in
    /// `$BAGEL_SERVER`), not left at its default: set by `main` from
    /// clap's matches ([`server_given`]).
    #[arg(skip)]
    pub server_given: bool,
}

/// Whether `--server` was given anywhere on the command line (before or
/// after the subcommand) or by its environment variable.
pub fn server_given(matches: &clap::ArgMatches) -> bool {
    use clap::parser::ValueSource;
    let here = matches!(
        matches
            .try_get_raw("server")
            .ok()
            .and(matches.value_source("server")),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    );
    here || matches.subcommand().is_some_and(|(_, sub)| server_given(sub))
}

impl TargetArgs {
    /// Whether lease servers were named (--servers, or --server given
    /// rather than defaulted): a command that only reads a store asks a
    /// server for its keys only then, never one nobody named.
    pub fn servers_named(&self) -> bool {
        self.servers.is_some() || self.server_given
    }

    /// A server to ask for signed time when no Roughtime server is given:
    /// --server, or the first of --servers.
    pub fn time_server(&self) -> anyhow::Result<String> {
        match &self.servers {
            None => {
                let url = self.server_url();
                bagel_client::options::check_server_url(&url).map_err(|e| anyhow::anyhow!("--server {e}"))?;
                Ok(url)
            }
            // Signed time is asked of one server by URL; a list found in
            // DNS names none until it is looked up.
            Some(list) if bagel_client::cluster::dns::is_dns_list(list) => {
                if self.server_given {
                    return Ok(self.server_url());
                }
                bail!(
                    "--servers {list}: signed time comes from --roughtime, or from one lease server named \
                     by --server URL (a dns+srv:// list names none until it is looked up)"
                )
            }
            Some(list) => Ok(self
                .parse(list, "--servers")?
                .first()
                .map(|s| s.url.clone())
                .context("--servers: the list is empty")?),
        }
    }

    /// How to connect to the lease servers: --timeout, and TLS from --ca
    /// (with --cert and --cert-key for mutual TLS).
    pub fn client_options(&self) -> anyhow::Result<ClientOptions> {
        let mut options = ClientOptions::default().with_timeout(self.timeout);
        if let Some(ca) = &self.ca {
            let read = |flag: &str, path: &PathBuf| {
                std::fs::read(path).with_context(|| format!("{flag} {}: cannot read it", path.display()))
            };
            let mut tls = TlsConfig::new(read("--ca", ca)?);
            let mut files = format!("--ca {}", ca.display());
            if let (Some(cert), Some(key)) = (&self.cert, &self.cert_key) {
                tls = tls.with_identity(read("--cert", cert)?, read("--cert-key", key)?);
                files += &format!(", --cert {}, --cert-key {}", cert.display(), key.display());
            }
            tls.validate().with_context(|| files)?;
            options = options.with_tls(tls);
        }
        if let Some(path) = &self.token_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--token-file {}: cannot read it", path.display()))?;
            let token = bagel_client::BearerToken::new(&text)
                .map_err(|why| anyhow::anyhow!("--token-file {}: {why}", path.display()))?;
            options = options.with_bearer_token(token);
        }
        Ok(options)
    }

    /// A server URL must be http:// or https://; with TLS flags given, a
    /// plaintext URL is refused rather than silently used in the clear.
    fn check_url(&self, flag: &str, url: &str) -> anyhow::Result<()> {
        bagel_client::options::check_server_url(url).map_err(|e| anyhow::anyhow!("{flag} {e}"))?;
        if self.ca.is_some() && url.starts_with("http://") {
            bail!("{flag} {url:?} is plaintext http:// but --ca was given: use https:// to connect over TLS");
        }
        if self.ca.is_none() && url.starts_with("https://") {
            bail!("{flag} {url:?} is https://: give --ca FILE, the CA certificate (PEM) to trust");
        }
        Ok(())
    }

    /// Connects to the lease servers, or opens the S3 lease store (whose
    /// clock check needs the Roughtime flags), through
    /// [`bagel_cli::open_lease_backend`].
    pub async fn connect(&self, rt: &RoughtimeArgs) -> anyhow::Result<Target> {
        if let Some(s3) = self.store.open(rt).await? {
            return Ok(Target {
                backend: s3,
                flag: "--lease-store",
            });
        }
        self.connect_servers().await
    }

    async fn connect_servers(&self) -> anyhow::Result<Target> {
        let mut options = LeaseBackendOptions {
            client: self.client_options()?,
            ..LeaseBackendOptions::default()
        };
        let Some(list) = &self.servers else {
            let url = self.server_url();
            self.check_url("--server", &url)?;
            return Ok(Target {
                backend: open_lease_backend(&url, &options).await?,
                flag: "--server",
            });
        };
        if bagel_client::cluster::dns::is_dns_list(list) {
            // The members' announced lists decide the routing, a
            // migration included: a second list here would be a second
            // source of truth.
            if self.next_servers.is_some() {
                bail!(
                    "--next-servers is not taken with --servers dns+srv://...: the members found in DNS \
                     announce their lists (--members, --next-members) and the client routes by those"
                );
            }
            return Ok(Target {
                backend: open_lease_backend(list.trim(), &options).await?,
                flag: "--servers",
            });
        }
        let current = self.parse(list, "--servers")?;
        let next = self
            .next_servers
            .as_deref()
            .map(|n| self.parse(n, "--next-servers"))
            .transpose()?;
        for (flag, list) in [("--servers", Some(&current)), ("--next-servers", next.as_ref())] {
            for spec in list.into_iter().flatten() {
                self.check_url(flag, &spec.url)?;
            }
        }
        options.next_servers = next;
        Ok(Target {
            backend: open_lease_backend(&self.with_schemes(list), &options).await?,
            flag: "--servers",
        })
    }
}

impl TargetArgs {
    /// The keys witnesses are checked against: those given (`--key`), plus
    /// the keys published in the S3 lease store; without either, the lease
    /// servers' own.
    pub async fn witness_keys(&self, given: &[String]) -> anyhow::Result<KeyRing> {
        let mut ring = crate::keys::key_ring(given)?;
        if let Some(published) = self.store.published_keys().await? {
            ring.merge(&published);
            return Ok(ring);
        }
        if !given.is_empty() {
            return Ok(ring);
        }
        let servers = self
            .connect_servers()
            .await
            .context("no --key given, and asking the lease servers for their keys failed")?;
        Ok(servers.backend.trusted_keys().await?)
    }

    /// The signed time a writer attaches to its batches: Roughtime when
    /// configured; else a lease server's; under S3 leases with
    /// --unsafe-local-clock, this host's clock signed with the lease key.
    pub async fn writer_time(
        &self,
        rt: &RoughtimeArgs,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Arc<dyn SignedClock>> {
        let options = self.client_options()?;
        self.store
            .writer_time(&self.time_server()?, &options, rt, clock)
            .await
    }
}

impl TargetArgs {
    /// --server with its scheme (see [`with_scheme`]).
    pub fn server_url(&self) -> String {
        with_scheme(&self.server, self.ca.is_some())
    }

    /// A --servers list with each URL's scheme (see [`with_scheme`]).
    pub fn with_schemes(&self, list: &str) -> String {
        list.split(',')
            .map(|entry| with_scheme(entry.trim(), self.ca.is_some()))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn parse(&self, list: &str, flag: &str) -> anyhow::Result<Vec<ServerSpec>> {
        ServerSpec::parse_list(&self.with_schemes(list)).map_err(|e| anyhow::anyhow!("{flag}: {e}"))
    }
}

/// A server as written (`URL` or `ID=URL#KEY`) with `http://` (`https://`
/// when `tls`) before a URL written as bare `HOST:PORT`, as etcdctl and
/// redis-cli take addresses. Anything else is left for the URL check to
/// judge and name.
fn with_scheme(entry: &str, tls: bool) -> String {
    let (id, rest) = match entry.split_once('=') {
        Some((id, rest)) if !id.contains("://") => (Some(id), rest),
        _ => (None, entry),
    };
    let (url, key) = match rest.split_once('#') {
        Some((url, key)) => (url, Some(key)),
        None => (rest, None),
    };
    let bare = !url.contains("://")
        && url.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
        });
    if !bare {
        return entry.to_owned();
    }
    let scheme = if tls { "https" } else { "http" };
    let mut out = String::new();
    if let Some(id) = id {
        out += id;
        out.push('=');
    }
    out += &format!("{scheme}://{url}");
    if let Some(key) = key {
        out.push('#');
        out += key;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::with_scheme;

    #[test]
    fn a_bare_host_and_port_is_a_url_with_the_scheme_tls_implies() {
        assert_eq!(with_scheme("127.0.0.1:7420", false), "http://127.0.0.1:7420");
        assert_eq!(
            with_scheme("leases.example:7420", true),
            "https://leases.example:7420"
        );
        assert_eq!(with_scheme("[::1]:7420", false), "http://[::1]:7420");
        assert_eq!(
            with_scheme("a=10.0.0.1:7420#00ff", false),
            "a=http://10.0.0.1:7420#00ff"
        );
    }

    #[test]
    fn urls_and_what_is_not_an_address_are_left_to_the_url_check() {
        for same in [
            "http://127.0.0.1:7420",
            "https://h:1",
            "ftp://h:21",
            "localhost",
            "h:",
            ":7420",
            "h:port",
        ] {
            assert_eq!(with_scheme(same, false), same);
        }
        assert_eq!(with_scheme("a=http://h:1", false), "a=http://h:1");
    }
}

/// A connected lease target: every lease operation goes through its
/// [`LeaseBackend`], and the flag that chose it names it in messages.
#[derive(Clone, Debug)]
pub struct Target {
    backend: Arc<dyn LeaseBackend>,
    flag: &'static str,
}

impl Target {
    pub fn backend(&self) -> Arc<dyn LeaseBackend> {
        Arc::clone(&self.backend)
    }

    /// Where a grant came from when it is one place (lease files name it):
    /// the server URL or the lease store URL; none for several servers
    /// (each part names its own).
    pub fn single_location(&self) -> Option<String> {
        self.backend.single_location()
    }

    /// The backend as messages name it: what it says of itself and the
    /// flag that chose it ("the S3 lease backend (--lease-store)").
    pub fn named(&self) -> String {
        format!("{} ({})", self.backend.describe_self(), self.flag)
    }
}
