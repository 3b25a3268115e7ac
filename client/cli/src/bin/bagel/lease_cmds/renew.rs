//! `bagel renew`: a lease's deadline moved to now + TTL, never earlier
//! than it was; its lease file (when `--lease` is one) rewritten.

use std::process::ExitCode;
use std::time::Duration;

use bagel_cli::contract::LeaseJson;
use bagel_client::LeaseBackend as _;
use clap::Args;

use super::lease_arg::TokenArgs;
use crate::target::Target;

#[derive(Debug, Args)]
pub struct RenewArgs {
    #[command(flatten)]
    lease: TokenArgs,
    /// The new deadline: now + this. A renewal never shortens a lease: if
    /// the lease already runs past now + TTL, its deadline stays (and the
    /// output says so); release the lease to end it sooner.
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Where the holder stored its updates (free text).
    #[arg(long)]
    metadata: Option<String>,
}

impl RenewArgs {
    /// Refuses what the backend would refuse, before connecting.
    pub fn check(&self) -> anyhow::Result<()> {
        self.lease.check()
    }
}

/// How far past the asked-for deadline an answer may be and still count
/// as what was asked: the server counts the TTL from its own clock, a
/// little later than this host's reading.
const SHORTER_SLACK: Duration = Duration::from_secs(1);

pub async fn run(args: RenewArgs, target: &Target) -> anyhow::Result<ExitCode> {
    let backend = target.backend();
    let lease = args.lease.resolve()?;
    let file = args.lease.file()?;
    let deadline = backend.clock().now().saturating_add(args.ttl);
    let r = backend
        .renew_lease(
            &lease,
            deadline,
            args.metadata.as_deref().map(super::metadata::parse),
        )
        .await?;
    let json = match file {
        Some((path, mut json)) => {
            json.renewed(&r);
            crate::lease_file::write(path, &json)?;
            json
        }
        None => LeaseJson::from_witness(&lease.token, &r.witnesses, target.single_location().as_deref())
            .map_err(|e| anyhow::anyhow!("renewed, but cannot state the lease as a lease file: {e}"))?,
    };
    if crate::output::json() {
        println!("{}", serde_json::to_string(&json)?);
    } else {
        println!("renewed until {}", crate::human::at(r.deadline));
        if r.deadline > deadline.saturating_add(SHORTER_SLACK) {
            println!(
                "kept the later deadline: --ttl {} from now would have shortened the lease, \
                 and a renewal never does (release it to end it sooner)",
                humantime::format_duration(args.ttl)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
