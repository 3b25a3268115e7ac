//! Lease subcommands, one file each (its flags, its run, its printer):
//! acquire, renew, upgrade, release, describe, history, server-info,
//! route, verify-witness. The `--lease` flag the commands naming a lease
//! share is in `lease_arg`, the `--metadata` text in `metadata`. The JSON
//! they print is `bagel_cli::contract`'s.

mod acquire;
mod describe;
mod history;
mod lease_arg;
mod metadata;
mod release;
mod renew;
mod route;
mod server_info;
mod upgrade;
mod verify_witness;

use std::process::ExitCode;

use bagel_client::Error;
use clap::Subcommand;

use crate::target::Target;

/// Exit code of a refused acquire (name held by someone else).
pub const EXIT_BUSY: u8 = 2;

#[derive(Debug, Subcommand)]
pub enum LeaseCommand {
    /// Acquire a lease on one or more names (all or none).
    ///
    /// Example: `bagel acquire --ttl 10s --json jobs/nightly > lease.json`
    Acquire(acquire::AcquireArgs),
    /// Renew a lease to now + TTL (never shortening it).
    ///
    /// Example: `bagel renew --lease lease.json --ttl 30s`
    Renew(renew::RenewArgs),
    /// Turn a tentative lease into a full one.
    ///
    /// Example: `bagel upgrade --lease lease.json`
    Upgrade(upgrade::UpgradeArgs),
    /// Release a lease, publishing its watermark.
    ///
    /// Example: `bagel release --lease lease.json`
    Release(release::ReleaseArgs),
    /// Show who holds names and what a new holder would inherit.
    ///
    /// Example: `bagel describe jobs/nightly jobs/hourly`
    Describe(describe::DescribeArgs),
    /// Show a name's recent renewals and releases with their metadata.
    ///
    /// Example: `bagel history jobs/nightly`
    History(history::HistoryArgs),
    /// Show the server's keys, limits, clock and readiness (with
    /// --servers: every server's).
    ///
    /// Example: `bagel server-info --server 127.0.0.1:7420`
    ServerInfo(server_info::ServerInfoArgs),
    /// Show which server owns each name (with --servers; and, with
    /// --next-servers, which owns it next).
    ///
    /// Example: `bagel route --servers a=10.0.0.1:7420,b=10.0.0.2:7420 jobs/nightly`
    Route(route::RouteArgs),
    /// Verify a witness (the JSON of `acquire --json`, or a bare witness).
    ///
    /// Example: `bagel verify-witness lease.json`
    VerifyWitness(verify_witness::VerifyArgs),
}

pub use crate::globals::Globals;

pub async fn run(cmd: LeaseCommand, g: Globals<'_>) -> anyhow::Result<ExitCode> {
    match cmd {
        LeaseCommand::VerifyWitness(args) => verify_witness::run(args, &g).await,
        cmd => {
            cmd.check()?;
            let target = g.target.connect(g.roughtime).await?;
            match run_with(cmd, &target).await {
                Err(e) => match e.downcast_ref::<Error>() {
                    Some(busy @ Error::Busy { .. }) => Ok(crate::failure::report_with(
                        "held",
                        EXIT_BUSY,
                        &busy_message(busy),
                        holder_json(busy),
                    )),
                    _ => Err(e),
                },
                ok => ok,
            }
        }
    }
}

impl LeaseCommand {
    /// Refuses names the servers would refuse, and a `--lease` that is
    /// neither a lease id nor a readable lease file, before connecting.
    fn check(&self) -> anyhow::Result<()> {
        match self {
            LeaseCommand::Acquire(a) => a.check(),
            LeaseCommand::Renew(a) => a.check(),
            LeaseCommand::Upgrade(a) => a.check(),
            LeaseCommand::Release(a) => a.check(),
            LeaseCommand::Describe(a) => a.check(),
            LeaseCommand::History(a) => a.check(),
            LeaseCommand::Route(a) => a.check(),
            LeaseCommand::ServerInfo(_) | LeaseCommand::VerifyWitness(_) => Ok(()),
        }
    }
}

/// The holder of a refused name, for the JSON error (`holder`: name,
/// lease id, owner, deadline in µs, server); empty when the backend could
/// not say.
pub fn holder_json(e: &Error) -> serde_json::Map<String, serde_json::Value> {
    let mut out = serde_json::Map::new();
    if let Error::Busy {
        conflict: Some(c), ..
    } = e
    {
        out.insert(
            "holder".into(),
            serde_json::json!({
                "deadline_us": c.holder_deadline.as_micros(),
                "lease_id": c.holder_lease_id,
                "name": c.name,
                "owner": c.holder_owner,
                "server": c.server,
            }),
        );
    }
    out
}

pub fn busy_message(e: &Error) -> String {
    match e {
        Error::Busy {
            conflict: Some(c), ..
        } => format!(
            "name {:?} is held by lease {} (owner {:?}) until {}{}",
            c.name,
            c.holder_lease_id,
            c.holder_owner,
            crate::human::at(c.holder_deadline),
            c.server
                .as_ref()
                .map_or(String::new(), |s| format!(" on server {s}"))
        ),
        other => other.to_string(),
    }
}

async fn run_with(cmd: LeaseCommand, target: &Target) -> anyhow::Result<ExitCode> {
    match cmd {
        LeaseCommand::Acquire(args) => acquire::run(args, target).await,
        LeaseCommand::Renew(args) => renew::run(args, target).await,
        LeaseCommand::Upgrade(args) => upgrade::run(args, target).await,
        LeaseCommand::Release(args) => release::run(args, target).await,
        LeaseCommand::Describe(args) => describe::run(args, target).await,
        LeaseCommand::History(args) => history::run(args, target).await,
        LeaseCommand::ServerInfo(args) => server_info::run(args, target).await,
        LeaseCommand::Route(args) => route::run(args, target).await,
        LeaseCommand::VerifyWitness(_) => unreachable!("handled without a connection"),
    }
}
