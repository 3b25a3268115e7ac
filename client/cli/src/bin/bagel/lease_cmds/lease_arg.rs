//! The `--lease` flag of the commands that name a lease (renew, upgrade,
//! release): a lease id with `--token`, or the lease file `bagel acquire
//! --json` wrote.

use anyhow::Context as _;
use bagel_cli::contract::{LeaseJson, ModeJson};
use bagel_client::{Inherited, LeaseRef, Micros};
use clap::Args;

use crate::failure::echo;

#[derive(Debug, Args)]
pub struct TokenArgs {
    /// The lease id, or the lease file `bagel acquire --json` wrote (which
    /// also holds the token).
    #[arg(long = "lease")]
    pub lease_id: String,
    /// The lease's secret token (read from the lease file when `--lease` is
    /// one).
    #[arg(long)]
    pub token: Option<String>,
    /// The lease's names (repeatable): an S3 lease store finds a lease by
    /// its names. Read from the lease file when `--lease` is one.
    #[arg(long = "name")]
    pub names: Vec<String>,
    /// Print JSON (a lease file for lease commands); errors then go to stderr as one JSON object.
    #[arg(long)]
    pub json: bool,
}

impl TokenArgs {
    /// Whether `--lease` is a lease id: one server's (32 hex digits), or
    /// a lease over several (KEYID:LEASEID,...).
    fn is_id(&self) -> bool {
        (self.lease_id.len() == 32 && self.lease_id.bytes().all(|b| b.is_ascii_hexdigit()))
            || (self.lease_id.contains(':')
                && self
                    .lease_id
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b','))
    }

    /// The lease id and token, from the flags or from the lease file.
    pub fn resolve(&self) -> anyhow::Result<LeaseRef> {
        if self.is_id() {
            let token = self
                .token
                .clone()
                .context("--token is required when --lease is a lease id (or give the lease file)")?;
            return Ok(LeaseRef::new(self.lease_id.clone(), token).with_names(self.names.clone()));
        }
        crate::names::path_not_json("--lease", &self.lease_id)?;
        let text = std::fs::read_to_string(&self.lease_id).with_context(|| {
            format!(
                "--lease is neither a lease id (32 hex digits) nor the path of a readable lease file: {}",
                echo(&self.lease_id)
            )
        })?;
        let lease: LeaseJson = serde_json::from_str(&text)
            .with_context(|| format!("parsing the lease file {}", echo(&self.lease_id)))?;
        let token = self.token.clone().unwrap_or(lease.token);
        let names = if self.names.is_empty() {
            lease.names.into_iter().map(|n| n.name).collect()
        } else {
            self.names.clone()
        };
        Ok(LeaseRef::new(lease.lease_id, token).with_names(names))
    }

    /// The lease file `--lease` names, when it is one (not a bare lease
    /// id): the commands that change the lease rewrite it.
    pub fn file(&self) -> anyhow::Result<Option<LeaseJson>> {
        if self.is_id() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&self.lease_id)
            .with_context(|| format!("reading the lease file {}", echo(&self.lease_id)))?;
        serde_json::from_str(&text)
            .map(Some)
            .with_context(|| format!("parsing the lease file {}", echo(&self.lease_id)))
    }

    /// What a full lease inherited, from its lease file (none for a bare
    /// lease id, whose server carries its own chain on): a lease over
    /// several servers passes it to each part on release.
    pub fn inherited(&self) -> anyhow::Result<Option<Inherited>> {
        let Ok(text) = std::fs::read_to_string(&self.lease_id) else {
            return Ok(None);
        };
        let lease: LeaseJson = serde_json::from_str(&text)
            .with_context(|| format!("parsing the lease file {}", echo(&self.lease_id)))?;
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
