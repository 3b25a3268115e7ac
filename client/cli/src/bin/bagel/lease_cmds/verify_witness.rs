//! `bagel verify-witness`: a lease file's witnesses (or a bare witness)
//! checked against the servers' keys or those given; no connection to a
//! lease server unless its keys are asked for.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use bagel_cli::contract::{ServerNameJson, WitnessJson};
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
    let mut failed = 0;
    let mut covered = std::collections::BTreeSet::new();
    for (i, witness) in witnesses.iter().enumerate() {
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
        match checked {
            Ok(body) => {
                covered.insert(body.lease_id.clone());
                println!(
                    "witness OK: lease {} names {:?} deadline {} signed by key {} of {}",
                    body.lease_id,
                    body.names.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
                    Micros::from_micros(body.deadline_us),
                    witness.key_id,
                    body.server_id
                );
            }
            Err(e) => {
                failed += 1;
                eprintln!("bagel: witness {i} (key {}) does NOT verify: {e}", witness.key_id);
            }
        }
    }
    for p in &parts {
        if !covered.contains(&p.lease_id) {
            failed += 1;
            eprintln!(
                "bagel: no verified witness states lease {} of server {} (name {})",
                p.lease_id, p.server, p.name
            );
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
