//! `bagel acquire`: take a lease on names (all or none), print it (text,
//! or with `--json` the lease file), and with `--hold` keep it until Ctrl-C.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use bagel_cli::contract::LeaseJson;
use bagel_client::{AcquireBuilder, LeaseOptions, Micros};
use clap::Args;

use crate::target::Target;

#[derive(Debug, Args)]
pub struct AcquireArgs {
    /// The names (all or none).
    #[arg(required = true)]
    names: Vec<String>,
    /// Lease length (default: the server's max TTL).
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "deadline")]
    ttl: Option<Duration>,
    /// Absolute deadline, Unix microseconds.
    #[arg(long)]
    deadline: Option<u64>,
    /// Reserve only; upgrade before writing.
    #[arg(long)]
    tentative: bool,
    /// Who is holding it (free text for operators; default `host:pid`).
    #[arg(long, env = "BAGEL_OWNER")]
    owner: Option<String>,
    /// Wait up to this long for busy names (any length: re-asked in rounds
    /// of the server's max wait, through its restarts), or `forever`.
    #[arg(long, value_parser = crate::names::parse_wait)]
    wait: Option<Duration>,
    /// Keep renewing until Ctrl-C, then release.
    #[arg(long)]
    hold: bool,
    /// Also print the lease's secret token in the text output (which
    /// leaves it out, as terminals are shared and scrolled back; `--json`
    /// writes it into the lease file, which the other commands read).
    #[arg(long)]
    show_token: bool,
}

impl AcquireArgs {
    /// Refuses names the servers would refuse, before connecting.
    pub fn check(&self) -> anyhow::Result<()> {
        crate::names::check("name", &self.names)
    }
}

pub async fn run(args: AcquireArgs, target: &Target) -> anyhow::Result<ExitCode> {
    // Its key is printed into a lease file, for other processes to write
    // with: a key of its own.
    let mut builder = AcquireBuilder::new(target.backend(), args.names)
        .owner(crate::owner::owner_or_default(args.owner.as_deref()))
        .own_holder_key();
    if let Some(ttl) = args.ttl {
        builder = builder.ttl(ttl);
    }
    if let Some(d) = args.deadline {
        builder = builder.deadline(Micros::from_micros(d));
    }
    if args.tentative {
        builder = builder.tentative();
    }
    if let Some(w) = args.wait {
        builder = builder.wait(w);
    }
    builder = builder.options(LeaseOptions::default().with_auto_renew(args.hold));
    let lease = builder.send().await?;
    print_grant(
        &LeaseJson::from_lease(&lease, target.single_location().as_deref()),
        Shown {
            json: crate::output::json(),
            token: args.show_token,
        },
    );
    if !args.hold {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("holding lease {}; Ctrl-C to release", lease.id());
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C")?,
        reason = lease.lost() => bail!("lease lost while holding: {reason}"),
    }
    // Still renewed while the release waits for `bagel write` runs of it.
    let lock = tokio::select! {
        lock = crate::written::lock_for_release(lease.id()) => lock?,
        reason = lease.lost() => bail!("lease lost while waiting for its writers to end: {reason}"),
    };
    let wm = crate::run_cmd::release_locked(lease, lock).await?;
    match wm.as_micros() {
        0 => eprintln!("released; stored watermark 0 (nothing written under it)"),
        _ => eprintln!("released; stored watermark {wm}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// How a grant is printed: the lease file (`--json`), or lines for
/// people, with the secret token only when asked (`--show-token`).
#[derive(Clone, Copy, Debug)]
pub struct Shown {
    pub json: bool,
    pub token: bool,
}

/// A grant as `acquire` and `upgrade` print it: the lease file with
/// `--json`, else a few lines for people. The token is a secret (whoever
/// has it may renew and release the lease): it goes to a terminal only
/// when asked for, as `ssh-keygen` and `aws` print no secret unasked.
pub fn print_grant(l: &LeaseJson, shown: Shown) {
    if shown.json {
        println!("{}", serde_json::to_string(l).expect("serializable"));
        return;
    }
    println!("lease     {} ({})", l.lease_id, l.mode.as_str());
    if shown.token {
        println!("token     {}", l.token);
    }
    println!(
        "deadline  {}",
        crate::human::at(Micros::from_micros(l.deadline_us))
    );
    match l.min_timestamp_us {
        0 => println!("write after any timestamp (min_timestamp 0: no watermark to stay above)"),
        us => println!("write after {} (min_timestamp)", Micros::from_micros(us)),
    }
    for n in &l.names {
        println!(
            "  {}  fencing {}  previous: {}",
            crate::names::shown(&n.name),
            n.fencing_token,
            crate::human::previous(
                n.previous.ended.as_str(),
                Some(&n.previous.lease_id),
                Micros::from_micros(n.previous.watermark_us),
                Micros::from_micros(n.previous.ended_at_us)
            )
        );
    }
}
