//! The flags of the commands that name a lease (renew, upgrade, release):
//! `--lease`, a lease id (with `--token`, and `--name` for an S3 lease
//! store) or the lease file `bagel acquire --json` wrote.

use std::convert::Infallible;
use std::path::Path;

use anyhow::Context as _;
use bagel_cli::contract::{LeaseId, LeaseJson, ModeJson};
use bagel_client::{Inherited, LeaseRef, Micros};
use clap::Args;

use crate::failure::echo;

/// What `--lease` names: a lease id (told by its form, see [`LeaseId`]),
/// or else the path of a lease file.
#[derive(Clone, Debug)]
pub enum LeaseArg {
    Id(LeaseId),
    /// The path, as given.
    File(String),
}

impl LeaseArg {
    fn parse(text: &str) -> Result<LeaseArg, Infallible> {
        Ok(LeaseId::parse(text).map_or_else(|| LeaseArg::File(text.to_owned()), LeaseArg::Id))
    }
}

#[derive(Debug, Args)]
pub struct TokenArgs {
    /// The lease id, or the lease file `bagel acquire --json` wrote (which
    /// also holds the token).
    #[arg(long = "lease", value_name = "LEASE_ID", value_parser = LeaseArg::parse)]
    pub lease: LeaseArg,
    /// The lease's secret token (read from the lease file when `--lease` is
    /// one).
    #[arg(long)]
    pub token: Option<String>,
    /// The lease's names (repeatable): an S3 lease store finds a lease by
    /// its names. Read from the lease file when `--lease` is one.
    #[arg(long = "name")]
    pub names: Vec<String>,
}

impl TokenArgs {
    /// The lease id and token, from the flags or from the lease file.
    pub fn resolve(&self) -> anyhow::Result<LeaseRef> {
        let path = match &self.lease {
            LeaseArg::Id(id) => {
                let token = self
                    .token
                    .clone()
                    .context("--token is required when --lease is a lease id (or give the lease file)")?;
                return Ok(LeaseRef::new(id.to_string(), token).with_names(self.names.clone()));
            }
            LeaseArg::File(path) => path,
        };
        crate::names::path_not_json("--lease", path)?;
        let text = std::fs::read_to_string(path).with_context(|| {
            format!(
                "--lease is neither a lease id (32 hex digits) nor the path of a readable lease file: {}",
                echo(path)
            )
        })?;
        let lease: LeaseJson =
            serde_json::from_str(&text).with_context(|| format!("parsing the lease file {}", echo(path)))?;
        let token = self.token.clone().unwrap_or(lease.token);
        let names = if self.names.is_empty() {
            lease.names.into_iter().map(|n| n.name).collect()
        } else {
            self.names.clone()
        };
        Ok(LeaseRef::new(lease.lease_id, token).with_names(names))
    }

    /// The lease file `--lease` names, when it is one (not a bare lease
    /// id), and its path: the commands that change the lease rewrite it.
    pub fn file(&self) -> anyhow::Result<Option<(&Path, LeaseJson)>> {
        let LeaseArg::File(path) = &self.lease else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the lease file {}", echo(path)))?;
        serde_json::from_str(&text)
            .map(|lease| Some((Path::new(path.as_str()), lease)))
            .with_context(|| format!("parsing the lease file {}", echo(path)))
    }

    /// What a full lease inherited, from its lease file (none for a bare
    /// lease id, whose server carries its own chain on): a lease over
    /// several servers passes it to each part on release.
    pub fn inherited(&self) -> anyhow::Result<Option<Inherited>> {
        let LeaseArg::File(path) = &self.lease else {
            return Ok(None);
        };
        let Ok(text) = std::fs::read_to_string(path) else {
            return Ok(None);
        };
        let lease: LeaseJson =
            serde_json::from_str(&text).with_context(|| format!("parsing the lease file {}", echo(path)))?;
        Ok((lease.mode == ModeJson::Full).then(|| Inherited {
            watermark: Micros::from_micros(lease.min_timestamp_us),
            unsettled_until: lease
                .names
                .iter()
                .filter_map(|n| n.previous.unsettled_until_us)
                .max()
                .map(Micros::from_micros),
        }))
    }
}

impl TokenArgs {
    /// Refuses a `--lease` that is neither a lease id nor a readable lease
    /// file, and names the servers would refuse, before connecting.
    pub fn check(&self) -> anyhow::Result<()> {
        self.resolve()?;
        crate::names::check("--name", &self.names)
    }
}
