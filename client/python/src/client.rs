//! `bagel.Client`: a lease backend opened from its URL (one server, a
//! list, or an `s3://` lease store) with the signed time its writers and
//! closers use; `acquire` gives a [`Lease`].

use std::sync::Arc;
use std::time::Duration;

use bagel_cli::{LeaseBackendOptions, S3Options, open_lease_backend};
use bagel_client::{
    AcquireBuilder, ClientOptions, LeaseBackend, LeaseOptions, TimeOptions, TimeSource, TlsConfig,
};
use bagel_proto::KeyRing;
use bagel_proto::signed_time::roughtime::RoughtimeServer;
use bagel_s3_lease::{LeaseStore, LeaseTime, S3LeaseConfig};
use pyo3::prelude::*;

use crate::errors::Failure;
use crate::lease::Lease;
use crate::runtime::{awaitable, block_on};

/// Where `bagel-server` listens by default.
const DEFAULT_SERVER: &str = "http://127.0.0.1:7420";

/// What a client's leases, writers and closers share.
#[derive(Debug)]
pub struct Env {
    pub backend: Arc<dyn LeaseBackend>,
    /// Signed time: what writers attach to their batches and what closers
    /// (metronome, reader) check their clock against. Roughtime when
    /// given, else the first lease server's signed time.
    pub time: TimeSource,
    /// Where the witness keys come from, said in errors.
    pub describe: String,
}

impl Env {
    /// The keys that verify this backend's witnesses: the servers' keys,
    /// or those published in an S3 lease store.
    pub async fn trusted_keys(&self) -> Result<KeyRing, Failure> {
        Ok(self.backend.trusted_keys().await?)
    }
}

/// A connection to where leases live.
///
/// `servers` is one lease server URL (`http://host:port`, `https://...`
/// with `ca`), several comma-separated (names are routed by rendezvous
/// hashing), or a list of them, or `dns+srv://NAME`: the members NAME's
/// SRV records name, routed by the lists they announce (their `--members`;
/// the resolver is `BAGEL_DNS_SERVER=IP:PORT` when set, else the
/// system's). `lease_store="s3://bucket/prefix"` keeps
/// leases on S3 conditional writes instead (endpoint and credentials from
/// the `AWS_*` environment); it needs `roughtime` and `lease_key`.
///
/// `roughtime` is a list of `(host:port, public_key)` pairs: signed time
/// for writers and closers. Without it, signed time comes from the first
/// lease server.
#[pyclass(frozen, subclass, module = "bagel._bagel")]
#[derive(Debug)]
pub struct Client {
    pub env: Arc<Env>,
}

fn read_file(what: &str, path: &str) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|e| Failure::invalid(format!("{what} {path}: cannot read it: {e}")))
}

fn client_options(
    ca: Option<String>,
    cert: Option<String>,
    cert_key: Option<String>,
    timeout: Option<f64>,
) -> Result<ClientOptions, Failure> {
    let mut options = ClientOptions::default();
    if let Some(secs) = timeout {
        options = options.with_timeout(seconds("timeout", secs)?);
    }
    match (ca, cert, cert_key) {
        (None, None, None) => {}
        (Some(ca), cert, key) => {
            let mut tls = TlsConfig::new(read_file("ca", &ca)?);
            match (cert, key) {
                (Some(cert), Some(key)) => {
                    tls = tls.with_identity(read_file("cert", &cert)?, read_file("cert_key", &key)?)
                }
                (None, None) => {}
                _ => return Err(Failure::invalid("cert and cert_key go together")),
            }
            tls.validate()?;
            options = options.with_tls(tls);
        }
        (None, _, _) => return Err(Failure::invalid("cert and cert_key need ca (the servers' CA)")),
    }
    Ok(options)
}

/// A duration in seconds from Python, checked.
pub fn seconds(what: &str, secs: f64) -> Result<Duration, Failure> {
    Duration::try_from_secs_f64(secs)
        .map_err(|_| Failure::invalid(format!("{what}: {secs} is not a duration in seconds (>= 0)")))
}

async fn open(
    servers: String,
    options: ClientOptions,
    lease_store: Option<String>,
    lease_key: Option<String>,
    roughtime: Vec<RoughtimeServer>,
) -> Result<Env, Failure> {
    let first = servers.split(',').next().unwrap_or_default().trim().to_owned();
    let first = first
        .split_once('=')
        .map_or(first.as_str(), |(_, url)| url)
        .to_owned();
    let first = first.split('#').next().unwrap_or_default().to_owned();
    let time_options = TimeOptions::default();
    let Some(url) = lease_store else {
        let backend = open_lease_backend(
            &servers,
            &LeaseBackendOptions {
                client: options.clone(),
                ..LeaseBackendOptions::default()
            },
        )
        .await?;
        let time = if roughtime.is_empty() {
            // A list found in DNS: signed time from the first member it names.
            let first = if bagel_client::cluster::dns::is_dns_list(&servers) {
                let found = bagel_client::cluster::dns::resolve(servers.trim(), &options).await?;
                found.first().map(|s| s.url.clone()).unwrap_or_default()
            } else {
                first
            };
            let client = bagel_client::Client::connect_with(first, &options).await?;
            TimeSource::lease_server(client, time_options)
        } else {
            TimeSource::roughtime(roughtime, time_options)
        };
        return Ok(Env {
            backend,
            time,
            describe: servers,
        });
    };
    if roughtime.is_empty() {
        return Err(Failure::invalid(
            "an S3 lease store needs signed time: give roughtime=[(\"host:port\", \"key\")]",
        ));
    }
    let Some(key_path) = lease_key else {
        return Err(Failure::invalid(
            "an S3 lease store needs lease_key: the file of the ed25519 key this client signs its witnesses \
             with (created, mode 0600, if missing)",
        ));
    };
    let signer = bagel_s3_lease::load_or_create_key(std::path::Path::new(&key_path))
        .map_err(|e| Failure::invalid(format!("lease_key {key_path}: {e}")))?;
    let config = S3LeaseConfig::default();
    // A URL that is not s3:// is refused by the store's own check.
    LeaseStore::from_url(&url, config.op_timeout)?;
    let time = TimeSource::roughtime(roughtime, time_options);
    let backend = open_lease_backend(
        &url,
        &LeaseBackendOptions {
            s3: Some(S3Options {
                signer,
                time: LeaseTime::Signed(time.clone()),
                config,
            }),
            ..LeaseBackendOptions::default()
        },
    )
    .await?;
    Ok(Env {
        backend,
        time,
        describe: url,
    })
}

/// Sends `builder`'s acquire; a refusal on this host's clock says what
/// the clock check measured.
async fn acquired(env: Arc<Env>, builder: AcquireBuilder) -> Result<Lease, Failure> {
    match builder.send().await {
        Ok(held) => Lease::acquired(env, held),
        Err(e) => Err(Failure::from(e).on_clock(&env.time)),
    }
}

/// `names` as a list: one name (a str) or a sequence of names.
fn name_list(names: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if let Ok(one) = names.extract::<String>() {
        return Ok(vec![one]);
    }
    names.extract::<Vec<String>>()
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (servers=None, *, ca=None, cert=None, cert_key=None, lease_store=None, lease_key=None, roughtime=None, timeout=None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn new(
        py: Python<'_>,
        servers: Option<&Bound<'_, PyAny>>,
        ca: Option<String>,
        cert: Option<String>,
        cert_key: Option<String>,
        lease_store: Option<String>,
        lease_key: Option<String>,
        roughtime: Option<Vec<(String, String)>>,
        timeout: Option<f64>,
    ) -> PyResult<Self> {
        let servers = match servers {
            Some(s) => name_list(s)?.join(","),
            None => DEFAULT_SERVER.to_owned(),
        };
        let options = client_options(ca, cert, cert_key, timeout)?;
        let (addrs, keys): (Vec<String>, Vec<String>) = roughtime.unwrap_or_default().into_iter().unzip();
        let roughtime =
            RoughtimeServer::pair(&addrs, &keys).map_err(|e| Failure::invalid(format!("roughtime: {e}")))?;
        let env = block_on(py, open(servers, options, lease_store, lease_key, roughtime))?;
        Ok(Client { env: Arc::new(env) })
    }

    /// Acquires a lease on `names` (all or none) for `ttl` seconds.
    ///
    /// `wait`: how long to wait for busy names, in seconds; `None` waits
    /// for as long as it takes; 0 (the default) fails at once with
    /// `HeldError`. `tentative=True` asks for a tentative lease (no write
    /// rights until `upgrade()`). `owner`: who holds it, as a conflict
    /// tells others (default `host:pid`, as the `bagel` CLI's). The lease
    /// renews itself in the background until released or lost
    /// (`auto_renew=False`: only when `renew()` is called; it is lost at
    /// its deadline otherwise).
    #[pyo3(signature = (names, *, ttl=10.0, wait=Some(0.0), tentative=false, owner=None, auto_renew=true))]
    #[pyo3(
        text_signature = "(self, names, *, ttl=10.0, wait=0.0, tentative=False, owner=None, auto_renew=True)"
    )]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn acquire(
        &self,
        py: Python<'_>,
        names: &Bound<'_, PyAny>,
        ttl: f64,
        wait: Option<f64>,
        tentative: bool,
        owner: Option<String>,
        auto_renew: bool,
    ) -> PyResult<Lease> {
        let builder = self
            .builder(name_list(names)?, ttl, wait, tentative, owner)?
            .options(LeaseOptions::default().with_auto_renew(auto_renew));
        let env = Arc::clone(&self.env);
        block_on(py, async move { acquired(env, builder).await })
    }

    /// `acquire`, awaitable.
    #[pyo3(signature = (names, *, ttl=10.0, wait=Some(0.0), tentative=false, owner=None, auto_renew=true))]
    #[pyo3(
        text_signature = "(self, names, *, ttl=10.0, wait=0.0, tentative=False, owner=None, auto_renew=True)"
    )]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn acquire_async<'py>(
        &self,
        py: Python<'py>,
        names: &Bound<'py, PyAny>,
        ttl: f64,
        wait: Option<f64>,
        tentative: bool,
        owner: Option<String>,
        auto_renew: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let builder = self
            .builder(name_list(names)?, ttl, wait, tentative, owner)?
            .options(LeaseOptions::default().with_auto_renew(auto_renew));
        let env = Arc::clone(&self.env);
        awaitable(py, async move { acquired(env, builder).await })
    }

    /// The public keys (hex) that verify this backend's witnesses.
    fn trusted_keys(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let env = Arc::clone(&self.env);
        block_on(py, async move {
            let ring = env.trusted_keys().await?;
            let mut keys: Vec<String> = ring
                .ids()
                .filter_map(|id| ring.get(id))
                .map(|key| bagel_proto::hex::encode(key.as_bytes()))
                .collect();
            keys.sort();
            Ok(keys)
        })
    }

    fn __repr__(&self) -> String {
        format!("bagel.Client({:?})", self.env.describe)
    }
}

impl Client {
    fn builder(
        &self,
        names: Vec<String>,
        ttl: f64,
        wait: Option<f64>,
        tentative: bool,
        owner: Option<String>,
    ) -> Result<AcquireBuilder, Failure> {
        if names.is_empty() {
            return Err(Failure::invalid("names: give at least one name"));
        }
        let mut b = AcquireBuilder::new(Arc::clone(&self.env.backend), names).ttl(seconds("ttl", ttl)?);
        b = match wait {
            None => b.wait_forever(),
            Some(w) => b.wait(seconds("wait", w)?),
        };
        if tentative {
            b = b.tentative();
        }
        Ok(b.owner(owner.unwrap_or_else(crate::owner::default_owner)))
    }
}
