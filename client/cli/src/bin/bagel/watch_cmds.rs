//! `bagel list` and `bagel watch`: what is held now, and what happens to
//! names as it happens (like `etcdctl get --prefix` and `etcdctl watch`).
//!
//! Over several servers (`--servers`), `list` asks each server and merges
//! the names in name order (each name lives on one server; during a
//! migration a name may be listed by both, each line saying its server);
//! `watch` follows one server only (revisions are per server). With
//! `--lease-store` (S3) neither is offered: the error says why and what to
//! use instead.

use std::process::ExitCode;

use anyhow::bail;
use bagel_cli::contract::{ListedNameJson, WatchEventJson};
use bagel_client::{Client, Error, ListedName, WatchEvent, WatchTarget};
use clap::{Args, Subcommand};

use crate::lease_cmds::Globals;
use crate::target::Target;

#[derive(Debug, Subcommand)]
pub enum FollowCommand {
    /// List the names held now (name, lease, owner, deadline, mode), in
    /// name order, paging through the server's bounded pages.
    List(ListArgs),
    /// Print grants, renewals, upgrades, releases, breaks and expiries of
    /// names as they happen, until interrupted.
    Watch(WatchArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only names starting with this.
    #[arg(long, default_value = "")]
    prefix: String,
    /// Print at most this many names (the server pages them; each page is
    /// at most its --list-max-page).
    #[arg(long, default_value_t = 1000)]
    limit: usize,
    /// Print one JSON object per name, one per line; errors then go to stderr as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// The names to watch (or --prefix).
    #[arg(required_unless_present = "prefix", conflicts_with = "prefix")]
    names: Vec<String>,
    /// Watch every name starting with this ("" for every name).
    #[arg(long)]
    prefix: Option<String>,
    /// Resume: first the events after this revision (the last one printed
    /// before), as far as the server still keeps them.
    #[arg(long)]
    from_revision: Option<u64>,
    /// Print one JSON object per event, one per line; errors then go to stderr as one JSON object.
    #[arg(long)]
    json: bool,
}

pub async fn run(cmd: FollowCommand, g: Globals<'_>) -> anyhow::Result<ExitCode> {
    match &cmd {
        FollowCommand::List(a) if !a.prefix.is_empty() => crate::names::check("--prefix", [&a.prefix])?,
        FollowCommand::Watch(a) => {
            crate::names::check("name", &a.names)?;
            if let Some(p) = a.prefix.as_ref().filter(|p| !p.is_empty()) {
                crate::names::check("--prefix", [p])?;
            }
        }
        FollowCommand::List(_) => {}
    }
    let target = g.target.connect(g.roughtime).await?;
    match cmd {
        FollowCommand::List(args) => list(args, &target).await,
        FollowCommand::Watch(args) => watch(args, &target).await,
    }
}

/// Up to `limit` held names of one server starting with `prefix`.
async fn list_one(client: &Client, prefix: &str, limit: usize) -> anyhow::Result<Vec<ListedName>> {
    let mut out = Vec::new();
    let mut page: Option<String> = None;
    while out.len() < limit {
        let want = u32::try_from(limit - out.len()).unwrap_or(u32::MAX);
        let p = client.list(prefix, page.as_deref(), want).await?;
        out.extend(p.names);
        match p.next_page {
            Some(next) => page = Some(next),
            None => break,
        }
    }
    out.truncate(limit);
    Ok(out)
}

async fn list(args: ListArgs, target: &Target) -> anyhow::Result<ExitCode> {
    let names: Vec<(Option<String>, ListedName)> = match (target.server(), target.cluster()) {
        (Some(c), _) => list_one(c, &args.prefix, args.limit)
            .await?
            .into_iter()
            .map(|n| (None, n))
            .collect(),
        (None, Some(cluster)) => {
            let mut all = Vec::new();
            for (url, id) in cluster.servers() {
                let client = cluster.client_of(&id).await.map_err(|e| e.at_server(&url))?;
                let names = list_one(client, &args.prefix, args.limit)
                    .await
                    .map_err(|e| e.context(format!("server {url}")))?;
                all.extend(names.into_iter().map(|n| (Some(url.clone()), n)));
            }
            all.sort_by(|a, b| a.1.name.cmp(&b.1.name).then_with(|| a.0.cmp(&b.0)));
            all.truncate(args.limit);
            all
        }
        (None, None) => bail!(
            "list is not supported on the S3 lease backend (--lease-store): it would have to read \
             every lease object of the store; ask for names with `bagel describe NAME...`"
        ),
    };
    for (server, n) in &names {
        let h = &n.holder;
        if args.json {
            let line = ListedNameJson::new(n, server.as_deref());
            println!("{}", serde_json::to_string(&line).expect("serializable"));
        } else {
            println!(
                "{} lease {} owner {:?} {} until {}{}",
                crate::names::shown(&n.name),
                h.lease_id,
                h.owner,
                h.mode.as_str(),
                h.deadline,
                server
                    .as_ref()
                    .map(|s| format!(" (server {s})"))
                    .unwrap_or_default()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn watch(args: WatchArgs, target: &Target) -> anyhow::Result<ExitCode> {
    let client = match (target.server(), target.cluster()) {
        (Some(c), _) => c,
        (None, Some(_)) => bail!(
            "watch follows one server (revisions are per server): give it with --server URL, once \
             per server to watch several"
        ),
        (None, None) => bail!(
            "watch is not supported on the S3 lease backend (--lease-store): S3 has no change \
             notifications; poll `bagel describe NAME...` instead"
        ),
    };
    let what = match args.prefix {
        Some(prefix) => WatchTarget::Prefix(prefix),
        None => WatchTarget::Names(args.names),
    };
    let mut events = client.watch(what, args.from_revision).await?;
    loop {
        match events.next().await {
            Ok(Some(e)) => print_event(&e, args.json),
            Ok(None) => return Ok(ExitCode::SUCCESS),
            Err(Error::WatchDropped {
                message,
                last_revision,
            }) => {
                let resume = last_revision
                    .map(|r| format!("; resume with --from-revision {r}"))
                    .unwrap_or_default();
                bail!("{message}{resume}")
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn print_event(e: &WatchEvent, json: bool) {
    if json {
        let line = WatchEventJson::from(e);
        println!("{}", serde_json::to_string(&line).expect("serializable"));
    } else {
        println!(
            "{} {} {} {} lease {} owner {:?} {} until {}",
            e.revision,
            e.at,
            e.kind.as_str(),
            crate::names::shown(&e.name),
            e.lease_id,
            e.owner,
            e.mode.as_str(),
            e.deadline
        );
    }
}
