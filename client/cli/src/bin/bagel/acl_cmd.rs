//! `bagel acl`: a lease server's access policy (`bagel-server --acl`),
//! offline. `check` answers what an identity may do to a name with the
//! server's own code (`bagel_proto::acl`), so a policy can be tried
//! before it is deployed; `hash-token` makes the SHA-256 a `[[token]]`
//! stores, so that the token itself never goes into the file.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use bagel_proto::acl::{FileFacts, Permission, Policy};
use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct AclArgs {
    #[command(subcommand)]
    command: AclCommand,
}

#[derive(Debug, Subcommand)]
enum AclCommand {
    /// Say whether IDENTITY may lease and read NAME under a policy file,
    /// and which grant allows it; exit 0 when every permission asked is
    /// granted, 1 otherwise (or when the file does not parse: the line
    /// and grant are named). Without --name, list what IDENTITY may do.
    ///
    /// Example: `bagel acl check --acl acl.toml --identity 'CN=worker-1,O=team-b' --name team-b/jobs/7`
    Check(CheckArgs),
    /// Print the SHA-256 (hex) of a bearer token read from stdin, for
    /// the `sha256` of a `[[token]]` in a policy file.
    ///
    /// Example: `head -c 32 /dev/urandom | base64 | tee ci.token | bagel acl hash-token`
    HashToken,
}

#[derive(Debug, Args)]
struct CheckArgs {
    /// The policy file (TOML), as given to bagel-server --acl.
    #[arg(long, value_name = "FILE")]
    acl: PathBuf,
    /// A client certificate's subject, as `bagel server-info` shows it
    /// (e.g. `CN=worker-1,O=team-b`), or a token's identity.
    #[arg(long)]
    identity: String,
    /// The name (or, for list and watch, prefix) to check.
    #[arg(long)]
    name: Option<String>,
    /// Check only this permission (default: lease and read).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(["lease", "read"]))]
    permission: Option<String>,
}

pub fn run(args: AclArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        AclCommand::Check(args) => check(&args),
        AclCommand::HashToken => hash_token(),
    }
}

fn check(args: &CheckArgs) -> anyhow::Result<ExitCode> {
    let text =
        std::fs::read_to_string(&args.acl).with_context(|| format!("cannot read {}", args.acl.display()))?;
    let policy = Policy::parse(&text).with_context(|| format!("{} does not parse", args.acl.display()))?;
    // What the server would warn of when it loads this file: said, and
    // the verdicts given all the same (the server takes the file).
    let warnings: Vec<String> = policy
        .warnings(&FileFacts::of(&args.acl))
        .iter()
        .map(ToString::to_string)
        .collect();
    for warning in &warnings {
        eprintln!("bagel: warning: {}: {warning}", args.acl.display());
    }
    let grants = policy.grants_for(&args.identity);
    let json = crate::output::json();
    let Some(name) = &args.name else {
        let summary = grants.summary();
        if json {
            let grants: Vec<_> = summary
                .iter()
                .map(|(prefix, perms)| {
                    serde_json::json!({
                        "prefix": prefix,
                        "permissions": perms.iter().map(|p| p.name()).collect::<Vec<_>>(),
                    })
                })
                .collect();
            let out = serde_json::json!({
                "identity": args.identity,
                "policy_sha256": policy.sha256_hex(),
                "warnings": warnings,
                "grants": grants,
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
        } else if summary.is_empty() {
            println!("{:?} may do nothing: no grant names it", args.identity);
        } else {
            for (prefix, perms) in &summary {
                let perms: Vec<&str> = perms.iter().map(|p| p.name()).collect();
                println!(
                    "{:?} may {} names under {prefix:?}",
                    args.identity,
                    perms.join(" and ")
                );
            }
        }
        return Ok(if summary.is_empty() {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    };
    let asked: Vec<Permission> = match args.permission.as_deref() {
        Some(p) => vec![p.parse().map_err(|e: String| anyhow::anyhow!(e))?],
        None => Permission::ALL.to_vec(),
    };
    let verdicts: Vec<(Permission, Option<(usize, usize)>)> =
        asked.iter().map(|&p| (p, grants.why(p, name))).collect();
    if json {
        let verdicts: Vec<_> = verdicts
            .iter()
            .map(|(p, why)| {
                serde_json::json!({
                    "permission": p.name(),
                    "allowed": why.is_some(),
                    "grant": why.map(|(g, _)| g),
                    "line": why.map(|(_, l)| l),
                })
            })
            .collect();
        let out = serde_json::json!({
            "identity": args.identity,
            "name": name,
            "policy_sha256": policy.sha256_hex(),
            "warnings": warnings,
            "verdicts": verdicts,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for (p, why) in &verdicts {
            match why {
                Some((grant, line)) => println!(
                    "{p} {name:?}: allowed to {:?} by grant {grant} (line {line})",
                    args.identity
                ),
                None => println!("{p} {name:?}: denied to {:?} (no grant allows it)", args.identity),
            }
        }
    }
    Ok(if verdicts.iter().all(|(_, why)| why.is_some()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn hash_token() -> anyhow::Result<ExitCode> {
    let mut token = String::new();
    std::io::stdin()
        .read_to_string(&mut token)
        .context("cannot read the token from stdin")?;
    // One line, as `echo` or a file with a final newline gives it.
    let token = token.strip_suffix('\n').unwrap_or(&token);
    let token = token.strip_suffix('\r').unwrap_or(token);
    if token.trim().is_empty() {
        bail!("no token on stdin");
    }
    if token.contains('\n') {
        bail!("the token on stdin is more than one line");
    }
    // Hash what a client sends: the library trims a token and refuses
    // one that is not visible ASCII, so a hash of anything else would be
    // a grant no client could ever use.
    bagel_client::BearerToken::new(token)
        .map_err(|e| anyhow::anyhow!("no client can send this token: {e}"))?;
    let hash = bagel_proto::hex::encode(&bagel_proto::acl::hash_token(token.trim()));
    if crate::output::json() {
        println!("{}", serde_json::json!({ "sha256": hash }));
    } else {
        println!("{hash}");
    }
    Ok(ExitCode::SUCCESS)
}

/// A write under a lease the access policy would not have granted: its
/// witness's owner has no `lease` permission on one of its names.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NotGranted {
    pub lease_id: String,
    pub owner: String,
    pub name: String,
    /// Where the first such message was read from.
    pub location: String,
}

impl std::fmt::Display for NotGranted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "lease {} of {:?} was used to write under {:?} ({}), which the policy grants it no lease on",
            self.lease_id, self.owner, self.name, self.location
        )
    }
}

/// `bagel audit --acl FILE`: the leases messages were written under whose
/// owner the policy does not allow to lease one of their names, once per
/// lease and name. A witness that does not verify is the audit's own
/// violation and is left to it. With mutual TLS or tokens the owner is
/// the server-checked identity, so this names grants made to identities
/// the policy did not allow (an older policy, a server run without one).
pub fn not_granted(
    policy_path: &std::path::Path,
    messages: &[bagel_bags::audit::AuditMessage],
    keys: &bagel_proto::KeyRing,
) -> anyhow::Result<Vec<NotGranted>> {
    let text = std::fs::read_to_string(policy_path)
        .with_context(|| format!("--acl {}: cannot read it", policy_path.display()))?;
    let policy =
        Policy::parse(&text).with_context(|| format!("--acl {} does not parse", policy_path.display()))?;
    let mut seen = std::collections::HashSet::new();
    let mut grants = std::collections::HashMap::new();
    let mut out = Vec::new();
    for m in messages {
        for w in m.witnesses.iter() {
            let Ok(body) = bagel_proto::verify_witness(w, keys) else {
                continue;
            };
            let g = grants
                .entry(body.owner.clone())
                .or_insert_with(|| policy.grants_for(&body.owner));
            for n in &body.names {
                if !g.allows(Permission::Lease, &n.name)
                    && seen.insert((body.lease_id.clone(), n.name.clone()))
                {
                    out.push(NotGranted {
                        lease_id: body.lease_id.clone(),
                        owner: body.owner.clone(),
                        name: n.name.clone(),
                        location: m.location.clone(),
                    });
                }
            }
        }
    }
    Ok(out)
}
