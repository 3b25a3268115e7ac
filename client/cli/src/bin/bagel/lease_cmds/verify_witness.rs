//! `bagel verify-witness`: a lease file's witnesses (or a bare witness)
//! checked against the servers' keys or those given; no connection to a
//! lease server unless its keys are asked for.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use bagel_cli::contract::{ServerNameJson, UncoveredPartJson, VerifiedJson, WitnessCheckJson, WitnessJson};
use bagel_client::Micros;
use clap::Args;

use super::Globals;

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// File with the JSON, or `-` for stdin (the default).
    #[arg(default_value = "-")]
    file: PathBuf,
    /// Trust this ed25519 public key (64 hex digits) instead of asking the
    /// server (with --lease-store: besides the store's published keys).
    /// Repeatable.
    #[arg(long = "key")]
    keys: Vec<String>,
}

/// Reads the witness JSON, fetches or takes the keys, verifies every
/// witness in it: a lease over several servers carries one per server,
/// and each must verify against the key of the server its part names.
pub async fn run(args: VerifyArgs, g: &Globals<'_>) -> anyhow::Result<ExitCode> {
    let text = if args.file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).context("reading stdin")?;
        s
    } else {
        std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file.display()))?
    };
    let value: serde_json::Value = serde_json::from_str(&text).context("input is not JSON")?;
    let expected = "expected the JSON of `bagel acquire --json` or {body_b64, signature_b64, key_id}";
    // `witnesses` (several servers) lists every witness, `witness` the
    // first; a bare witness is the whole input.
    let listed: Vec<serde_json::Value> = match value.get("witnesses").and_then(|w| w.as_array()) {
        Some(all) if !all.is_empty() => all.clone(),
        _ => vec![value.get("witness").cloned().unwrap_or_else(|| value.clone())],
    };
    let witnesses = listed
        .into_iter()
        .enumerate()
        .map(|(i, w)| {
            let w: WitnessJson =
                serde_json::from_value(w).with_context(|| format!("witness {i}: {expected}"))?;
            w.to_pb().map_err(|e| anyhow::anyhow!("witness {i}: {e}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Which key each server's part must be signed with (lease id -> key
    // id), from a lease file over several servers.
    let parts: Vec<ServerNameJson> = match value.get("servers") {
        Some(v) => {
            serde_json::from_value(v.clone()).context("servers: not the list `acquire --json` writes")?
        }
        None => Vec::new(),
    };

    let keys = g.target.witness_keys(&args.keys).await?;
    let mut covered = std::collections::BTreeSet::new();
    let mut checks = Vec::new();
    for witness in &witnesses {
        let checked = bagel_proto::verify_witness(witness, &keys)
            .map_err(|e| e.to_string())
            .and_then(|body| {
                let part = parts.iter().find(|p| p.lease_id == body.lease_id);
                match part {
                    Some(p) if p.key_id != witness.key_id => Err(format!(
                        "it states lease {} of server {}, whose key is {}, but is signed by key {}",
                        body.lease_id, p.server, p.key_id, witness.key_id
                    )),
                    None if !parts.is_empty() => Err(format!(
                        "it states lease {}, which is no part of this lease",
                        body.lease_id
                    )),
                    _ => Ok(body),
                }
            });
        checks.push(match checked {
            Ok(body) => {
                covered.insert(body.lease_id.clone());
                WitnessCheckJson {
                    deadline_us: Some(body.deadline_us),
                    error: None,
                    key_id: witness.key_id.clone(),
                    lease_id: Some(body.lease_id.clone()),
                    names: body.names.iter().map(|n| n.name.clone()).collect(),
                    server_id: Some(body.server_id.clone()),
                    verified: true,
                }
            }
            Err(e) => WitnessCheckJson {
                deadline_us: None,
                error: Some(e),
                key_id: witness.key_id.clone(),
                lease_id: None,
                names: Vec::new(),
                server_id: None,
                verified: false,
            },
        });
    }
    let uncovered: Vec<UncoveredPartJson> = parts
        .iter()
        .filter(|p| !covered.contains(&p.lease_id))
        .map(|p| UncoveredPartJson {
            lease_id: p.lease_id.clone(),
            name: p.name.clone(),
            server: p.server.clone(),
        })
        .collect();
    let report = VerifiedJson {
        verified: uncovered.is_empty() && checks.iter().all(|c| c.verified),
        uncovered,
        witnesses: checks,
    };
    if crate::output::json() {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(if report.verified {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The checks as text: a line on stdout per witness that verified, one on
/// stderr per witness that did not and per part no witness covers.
fn print_report(report: &VerifiedJson) {
    for (i, c) in report.witnesses.iter().enumerate() {
        match &c.error {
            None => println!(
                "witness OK: lease {} names {:?} deadline {} signed by key {} of {}",
                c.lease_id.as_deref().unwrap_or_default(),
                c.names,
                Micros::from_micros(c.deadline_us.unwrap_or_default()),
                c.key_id,
                c.server_id.as_deref().unwrap_or_default()
            ),
            Some(e) => eprintln!("bagel: witness {i} (key {}) does NOT verify: {e}", c.key_id),
        }
    }
    for p in &report.uncovered {
        eprintln!(
            "bagel: no verified witness states lease {} of server {} (name {})",
            p.lease_id, p.server, p.name
        );
    }
}
