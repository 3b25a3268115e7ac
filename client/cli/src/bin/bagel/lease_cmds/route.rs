//! `bagel route`: which server owns each name (with `--servers`; with
//! `--next-servers`, also which owns it next), as the backend answers it:
//! one server or one lease store holds every name.

use std::process::ExitCode;

use bagel_cli::contract::{RouteJson, ServerRouteJson, StoreRouteJson};
use bagel_client::backend::NameRoute;
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
    let backend = target.backend();
    let routes = args
        .names
        .iter()
        .map(|name| {
            Ok(match backend.route_name(name)? {
                NameRoute::Server(server) => RouteJson::Server(ServerRouteJson {
                    name: name.clone(),
                    server,
                }),
                NameRoute::Store(lease_store) => RouteJson::Store(StoreRouteJson {
                    lease_store,
                    name: name.clone(),
                }),
                NameRoute::Servers(route) => RouteJson::Servers(route.into()),
            })
        })
        .collect::<anyhow::Result<Vec<RouteJson>>>()?;
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
