//! Where leases live: one server (`--server`), several (`--servers`, with
//! `--next-servers` while migrating), or no server at all
//! (`--lease-store s3://...`, see `crate::store`). One URL in `--servers`
//! is the same as `--server`: the same calls, the same JSON. Every lease
//! command, `bagel run` and `bagel write` go through [`Target`], so the
//! rest of the CLI never asks which one it is; what only one kind can
//! answer (a server's info) is matched on its variants.

use std::sync::Arc;

use anyhow::Context as _;
use bagel_client::{Client, Cluster, History, LeaseBackend, NameState, ServerSpec};
use bagel_proto::clock::Clock;
use bagel_proto::{KeyRing, SignedClock};
use bagel_s3_lease::S3LeaseBackend;

use crate::store::StoreArgs;
use crate::time_cmds::RoughtimeArgs;

/// The lease flags, as given.
#[derive(Clone, Debug, clap::Args)]
pub struct TargetArgs {
    /// The lease server.
    #[arg(
        long,
        global = true,
        env = "BAGEL_SERVER",
        default_value = "http://127.0.0.1:7420"
    )]
    pub server: String,
    /// Several lease servers, comma-separated (`URL` or `URL#KEY`, KEY the
    /// server's public key in hex, which lets names be routed while it is
    /// down). Names are routed over them by rendezvous hashing. Overrides
    /// --server.
    #[arg(long, global = true, env = "BAGEL_SERVERS")]
    pub servers: Option<String>,
    /// While migrating: the server list being moved to. Every name then
    /// needs a grant from its owner in --servers and in this list.
    #[arg(long, global = true, env = "BAGEL_NEXT_SERVERS", requires = "servers")]
    pub next_servers: Option<String>,
    /// Leases with no server (`--lease-store`), which replace all of the above.
    #[command(flatten)]
    pub store: StoreArgs,
}

impl TargetArgs {
    /// A server to ask for signed time when no Roughtime server is given:
    /// --server, or the first of --servers.
    pub fn time_server(&self) -> anyhow::Result<String> {
        match &self.servers {
            None => Ok(self.server.clone()),
            Some(list) => Ok(parse(list, "--servers")?
                .first()
                .map(|s| s.url.clone())
                .context("--servers: the list is empty")?),
        }
    }

    /// Connects to the lease servers, or opens the S3 lease store (whose
    /// clock check needs the Roughtime flags).
    pub async fn connect(&self, rt: &RoughtimeArgs) -> anyhow::Result<Target> {
        if let Some(s3) = self.store.open(rt).await? {
            return Ok(Target::S3(s3));
        }
        self.connect_servers().await
    }

    async fn connect_servers(&self) -> anyhow::Result<Target> {
        let Some(list) = &self.servers else {
            return Ok(Target::One(Box::new(Client::connect(self.server.clone()).await?)));
        };
        let current = parse(list, "--servers")?;
        let next = self
            .next_servers
            .as_deref()
            .map(|n| parse(n, "--next-servers"))
            .transpose()?;
        Ok(match (current.as_slice(), next) {
            ([one], None) => {
                let client = match one.key {
                    None => Client::connect(one.url.clone()).await?,
                    Some(key) => {
                        let mut ring = KeyRing::new();
                        ring.insert_bytes(&key)?;
                        Client::connect_pinned(one.url.clone(), ring).await?
                    }
                };
                Target::One(Box::new(client))
            }
            (_, None) => Target::Many(Cluster::connect(&current).await?),
            (_, Some(next)) => Target::Many(Cluster::migrating(&current, &next).await?),
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
        Ok(servers.keys())
    }

    /// The signed time a writer attaches to its batches: Roughtime when
    /// configured; else a lease server's; under S3 leases with
    /// --unsafe-local-clock, this host's clock signed with the lease key.
    pub async fn writer_time(
        &self,
        rt: &RoughtimeArgs,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Arc<dyn SignedClock>> {
        self.store.writer_time(&self.time_server()?, rt, clock).await
    }
}

fn parse(list: &str, flag: &str) -> anyhow::Result<Vec<ServerSpec>> {
    ServerSpec::parse_list(list).map_err(|e| anyhow::anyhow!("{flag}: {e}"))
}

/// A connected lease target.
#[derive(Debug)]
pub enum Target {
    One(Box<Client>),
    Many(Cluster),
    S3(Arc<S3LeaseBackend>),
}

impl Target {
    pub fn backend(&self) -> Arc<dyn LeaseBackend> {
        match self {
            Target::One(c) => Arc::new((**c).clone()),
            Target::Many(c) => Arc::new(c.clone()),
            Target::S3(b) => Arc::clone(b) as _,
        }
    }

    /// Where a grant came from when it is one place (lease files name it):
    /// the server URL or the lease store URL; none for several servers
    /// (each part names its own).
    pub fn single_location(&self) -> Option<String> {
        match self {
            Target::One(c) => Some(c.url().to_owned()),
            Target::Many(_) => None,
            Target::S3(b) => Some(b.location()),
        }
    }

    /// Every key a witness of these servers may be signed with (S3: the
    /// keys published in the store, see [`TargetArgs::witness_keys`]).
    fn keys(&self) -> KeyRing {
        match self {
            Target::One(c) => c.keys().clone(),
            Target::Many(c) => c.keys(),
            Target::S3(_) => KeyRing::new(),
        }
    }

    pub async fn describe(&self, names: Vec<String>) -> anyhow::Result<Vec<NameState>> {
        Ok(match self {
            Target::One(c) => c.describe(names).await?,
            Target::Many(c) => c.describe(names).await?,
            Target::S3(b) => b.describe(&names).await?,
        })
    }

    pub async fn history(&self, name: &str) -> anyhow::Result<History> {
        Ok(match self {
            Target::One(c) => c.history(name).await?,
            Target::Many(c) => c.history(name).await?,
            Target::S3(b) => b.history(name).await?,
        })
    }
}
