//! `bagel route`: which server owns each name (with `--servers`; with
//! `--next-servers`, also which owns it next).

use std::process::ExitCode;

use bagel_cli::contract::{RouteJson, ServerRouteJson, StoreRouteJson};
use bagel_client::LeaseBackend as _;
use clap::Args;

use crate::target::Target;

#[derive(Debug, Args)]
pub struct RouteArgs {
    /// The names (all or none).
    #[arg(required = true)]
    names: Vec<String>,
}

impl RouteArgs {
    /// Refuses names the servers would refuse, before connecting.
    pub fn check(&self) -> anyhow::Result<()> {
        crate::names::check("name", &self.names)
    }
}

pub async fn run(args: RouteArgs, target: &Target) -> anyhow::Result<ExitCode> {
    let routes: Vec<RouteJson> = args
        .names
        .iter()
        .map(|name| match (target.server(), target.cluster()) {
            (Some(c), _) => RouteJson::Server(ServerRouteJson {
                name: name.clone(),
                server: c.url().to_owned(),
            }),
            (None, None) => RouteJson::Store(StoreRouteJson {
                lease_store: target.backend().location(),
                name: name.clone(),
            }),
            (None, Some(cluster)) => RouteJson::Servers(cluster.route(name).into()),
        })
        .collect();
    if crate::output::json() {
        println!("{}", serde_json::to_string_pretty(&routes)?);
    } else {
        for r in &routes {
            print_route(r);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A name's route as a line of text: name, tab, server (empty for a lease
/// store), and the next owner while migrating.
fn print_route(r: &RouteJson) {
    let next = r.next_server().map_or(String::new(), |n| format!(" (next: {n})"));
    println!(
        "{}\t{}{next}",
        crate::names::shown(r.name()),
        r.server().unwrap_or("")
    );
}
