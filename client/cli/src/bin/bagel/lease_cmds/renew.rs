//! `bagel renew`: a lease's deadline moved to now + TTL on the clock that
//! judges it (the server's), never earlier than it was; its lease file
//! (when `--lease` is one) rewritten.

use std::process::ExitCode;
use std::time::Duration;

use bagel_cli::contract::{LeaseJson, WitnessJson};
use bagel_client::{LeaseBackend as _, Renewal};
use clap::Args;

use super::lease_arg::TokenArgs;
use crate::target::Target;

#[derive(Debug, Args)]
pub struct RenewArgs {
    #[command(flatten)]
    lease: TokenArgs,
    /// The new deadline: now + this, counted by the server from its own
    /// clock at the renewal (so this host's clock does not move it). A
    /// renewal never shortens a lease: if the lease already runs past
    /// now + TTL, its deadline stays (and the output says so); release the
    /// lease to end it sooner.
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

pub async fn run(args: RenewArgs, target: &Target) -> anyhow::Result<ExitCode> {
    let backend = target.backend();
    let lease = args.lease.resolve()?;
    let file = args.lease.file()?;
    let r = backend
        .renew_lease_ttl(
            &lease,
            args.ttl,
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
        if left_at_renewal(&r).is_some_and(|left| left > args.ttl) {
            println!(
                "kept the later deadline: --ttl {} from now would have shortened the lease, \
                 and a renewal never does (release it to end it sooner)",
                humantime::format_duration(args.ttl)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What the renewal left of the lease on the clock that counted the TTL:
/// each witness's deadline less its issue time, the least of them (one
/// witness per server). More than the TTL means the renewal kept the
/// deadline the lease already had, later than now + TTL.
fn left_at_renewal(r: &Renewal) -> Option<Duration> {
    r.witnesses
        .iter()
        .filter_map(|w| {
            let body = bagel_proto::witness::decode_unverified(&WitnessJson::from(w).to_pb().ok()?).ok()?;
            (body.issued_at_us != 0)
                .then(|| Duration::from_micros(body.deadline_us.saturating_sub(body.issued_at_us)))
        })
        .min()
}
