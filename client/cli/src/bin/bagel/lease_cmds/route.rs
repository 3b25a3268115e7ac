//! `bagel route`: which server owns each name (with `--servers`; with
//! `--next-servers`, also which owns it next).

use std::process::ExitCode;

use bagel_client::LeaseBackend as _;
use clap::Args;
use serde_json::json;

use crate::target::Target;

#[derive(Debug, Args)]
pub struct RouteArgs {
    /// The names (all or none).
    #[arg(required = true)]
    names: Vec<String>,
    /// Print JSON (a lease file for lease commands); errors then go to stderr as one JSON object.
    #[arg(long)]
    json: bool,
}

impl RouteArgs {
    pub fn check(&self) -> anyhow::Result<()> {
        crate::names::check("name", &self.names)
    }
}

pub async fn run(args: RouteArgs, target: &Target) -> anyhow::Result<ExitCode> {
    let backend = target.backend();
    let routes: Vec<serde_json::Value> = args
        .names
        .iter()
        .map(|name| match (target.server(), target.cluster()) {
            (Some(c), _) => json!({ "name": name, "server": c.url() }),
            (None, None) => json!({ "name": name, "lease_store": backend.location() }),
            (None, Some(cluster)) => {
                // Routed by `member` (the configured identity);
                // `key_id` is the key it signs with, when known.
                let r = cluster.route(name);
                let key = |id: String| (!id.is_empty()).then_some(id);
                let mut v = json!({
                    "name": name, "server": r.current.0, "key_id": key(r.current.1),
                    "member": r.current_identity,
                });
                if let (Some((url, key_id)), Some(member)) = (r.next, r.next_identity) {
                    v["next_server"] = json!(url);
                    v["next_key_id"] = json!(key(key_id));
                    v["next_member"] = json!(member);
                }
                v
            }
        })
        .collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&routes)?);
    } else {
        for r in &routes {
            let next = r["next_server"]
                .as_str()
                .map_or(String::new(), |n| format!(" (next: {n})"));
            println!(
                "{}\t{}{next}",
                crate::names::shown(r["name"].as_str().unwrap_or("")),
                r["server"].as_str().unwrap_or("")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
