//! `bagel audit`: check a range of a log from the stored messages and
//! witnesses alone.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bagel_bags as bag;
use bagel_bags::audit::{AuditConfig, AuditMessage};
use bagel_proto::Micros;
use serde_json::json;

use crate::progress::Bar;

use super::Globals;
use super::args::{LogRange, TimingArgs};
use super::read::{read_error, say_close_refused};

#[derive(clap::Args, Debug)]
pub struct AuditArgs {
    #[command(flatten)]
    range: LogRange,
    /// A lease server's ed25519 public key (64 hex digits, as `bagel
    /// server-info` prints it); repeatable. Without any, the keys of the
    /// servers named by --server or --servers are asked for (never the
    /// default server's: an audit must not trust a server nobody named);
    /// with --lease-store, the keys published in the store are added.
    #[arg(long = "key")]
    keys: Vec<String>,
    /// How far a timestamp may be ahead of its signed time.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    tolerance: Duration,
    /// A lease server's access policy (bagel-server --acl): also report
    /// writes under leases whose owner it gives no lease permission on
    /// one of their names (NOT GRANTED; exit 1).
    #[arg(long, value_name = "FILE")]
    acl: Option<std::path::PathBuf>,
    #[command(flatten)]
    timing: TimingArgs,
}

pub(super) async fn run(a: AuditArgs, g: &Globals<'_>) -> anyhow::Result<ExitCode> {
    let cfg = a.timing.config();
    if a.keys.is_empty() && !g.target.store.has_lease_store() && !g.target.servers_named() {
        // As `bagel read`: the keys to trust are given, never assumed.
        return Err(crate::failure::usage(
            "audit needs the keys to check witnesses against: give --key KEY (a lease server's public \
             key, as `bagel server-info` prints it), --server/--servers to ask the servers that granted the \
             leases, or --lease-store",
        ));
    }
    let keys = g.target.witness_keys(&a.keys).await?;
    let roughtime_keys: Vec<_> = g.roughtime.servers()?.into_iter().map(|s| s.key).collect();
    let store = a.range.store.open(&cfg).await?;
    let bar = Bar::new("audit: reading", "bags", crate::output::json());
    let opts = a
        .range
        .read_options()
        .with_keys(Some(keys.clone()))
        .with_roughtime_keys(roughtime_keys.clone())
        .with_progress(bar.for_reader());
    let log = &a.range.log;
    let clock = crate::closer_clock::closer_clock(g.target, g.roughtime, cfg.clock_tolerance)?;
    let report = bag::read(store.as_ref(), log, &opts, &cfg, clock.as_ref()).await;
    bar.finish();
    let report = report.map_err(read_error)?;
    say_close_refused(&report);
    let messages = AuditMessage::from_report(&report, log);
    let mut acfg = AuditConfig::new(keys.clone());
    acfg.tolerance = a.tolerance;
    let local = keys.clone();
    acfg.verify_time = Arc::new(move |st| {
        bagel_proto::verify_signed_time(st, &local, &roughtime_keys).map_err(|e| e.to_string())
    });
    let mut result = bagel_bags::audit::audit(&messages, &acfg);
    result
        .violations
        .extend(bagel_bags::audit::problem_violations(&report.problems, log));
    // Every summary of the range, against its source bags while they exist.
    let (first, last) = (
        bag::Bucket::of(a.range.from.unwrap_or(Micros::ZERO)),
        bag::Bucket::of(
            a.range
                .to
                .unwrap_or(Micros::MAX)
                .saturating_sub(Duration::from_micros(1)),
        ),
    );
    // Every summary of the range, against its source bags while they
    // exist, and every attestation of them.
    let summaries = bagel_bags::audit::audit_summaries(store.as_ref(), log, first, last).await?;
    result.violations.extend(summaries.violations);
    let unchecked = summaries.unchecked;
    let not_granted = match &a.acl {
        Some(path) => crate::acl_cmd::not_granted(path, &messages, &keys)?,
        None => Vec::new(),
    };
    if crate::output::json() {
        let mut out = serde_json::to_value(&result)?;
        if a.acl.is_some() {
            out["not_granted"] = json!(not_granted);
        }
        out["unchecked_summaries"] = json!(unchecked);
        out["attestations_checked"] = json!(summaries.attestations_checked);
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "audited {} messages, {} leases, {} names; longest chain {}; {} chain gaps; {} violations",
            result.messages,
            result.leases,
            result.names,
            result.longest_chain,
            result.chain_gaps,
            result.violations.len()
        );
        if result.unbound_messages > 0 {
            println!(
                "UNBOUND {} messages cite leases acquired without a holder key: their witnesses verify, but \
                 nothing binds their bytes to the lease's holder",
                result.unbound_messages
            );
        }
        for v in &result.violations {
            match v.kind {
                // Not a forgery found: a key the audit was not told to
                // trust, said once with how to trust it.
                bagel_bags::audit::ViolationKind::UntrustedKey => println!("UNTRUSTED KEY {}", v.detail),
                _ => println!("VIOLATION {v}"),
            }
        }
        for u in &unchecked {
            println!("UNCHECKED {u}");
        }
        for n in &not_granted {
            println!("NOT GRANTED {n}");
        }
    }
    Ok(if result.is_clean() && not_granted.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
