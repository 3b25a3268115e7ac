//! Where the lease commands go: one server (`--server`), or several
//! (`--servers`, with `--next-servers` while migrating). One URL in
//! `--servers` is the same as `--server`: the same calls, the same JSON.

use std::sync::Arc;

use anyhow::Context as _;
use bagel_client::{Client, Cluster, History, LeaseBackend, NameState, ServerSpec};
use bagel_proto::KeyRing;

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

    pub async fn connect(&self) -> anyhow::Result<Target> {
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

fn parse(list: &str, flag: &str) -> anyhow::Result<Vec<ServerSpec>> {
    ServerSpec::parse_list(list).map_err(|e| anyhow::anyhow!("{flag}: {e}"))
}

/// A connected lease target.
#[derive(Debug)]
pub enum Target {
    One(Box<Client>),
    Many(Cluster),
}

impl Target {
    pub fn backend(&self) -> Arc<dyn LeaseBackend> {
        match self {
            Target::One(c) => Arc::new((**c).clone()),
            Target::Many(c) => Arc::new(c.clone()),
        }
    }

    /// The server a single-server grant came from (lease files name it).
    pub fn single_server(&self) -> Option<&str> {
        match self {
            Target::One(c) => Some(c.url()),
            Target::Many(_) => None,
        }
    }

    /// Every key a witness of these servers may be signed with.
    pub fn keys(&self) -> KeyRing {
        match self {
            Target::One(c) => c.keys().clone(),
            Target::Many(c) => c.keys(),
        }
    }

    pub async fn describe(&self, names: Vec<String>) -> bagel_client::Result<Vec<NameState>> {
        match self {
            Target::One(c) => c.describe(names).await,
            Target::Many(c) => c.describe(names).await,
        }
    }

    pub async fn history(&self, name: &str) -> bagel_client::Result<History> {
        match self {
            Target::One(c) => c.history(name).await,
            Target::Many(c) => c.history(name).await,
        }
    }
}
