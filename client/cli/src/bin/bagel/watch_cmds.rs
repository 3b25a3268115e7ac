//! `bagel list` and `bagel watch`: what is held now, and what happens to
//! names as it happens (like `etcdctl get --prefix` and `etcdctl watch`).
//!
//! Over several servers (`--servers`), `list` asks each server and merges
//! the names in name order (each name lives on one server; during a
//! migration a name may be listed by both, each line saying its server);
//! `watch` follows one server only (revisions are per server). With
//! `--lease-store` (S3) neither is offered: the error says why and what to
//! use instead.
//!
//! List then watch misses nothing: `list` says the revision its listing
//! reflects (`--json`: each line's `revision`; else on stderr), `watch
//! --from-revision` it follows on, and `list --watch` does both in one.
//! A watch always keeps a revision to resume from (the server's progress
//! messages move it on a quiet watch), and says it when the watch breaks.

use std::process::ExitCode;

use anyhow::bail;
use bagel_cli::contract::{ListedNameJson, WatchEventJson, WatchProgressJson};
use bagel_client::{Client, Error, ListedName, WatchEvent, WatchMessage, WatchOptions, WatchTarget};
use clap::{Args, Subcommand};

use crate::lease_cmds::Globals;
use crate::target::Target;

#[derive(Debug, Subcommand)]
pub enum FollowCommand {
    /// List the names held now (name, lease, owner, deadline, mode), in
    /// name order, paging through the server's bounded pages.
    ///
    /// Example: `bagel list --prefix jobs/ --watch`
    List(ListArgs),
    /// Print grants, renewals, upgrades, releases, breaks and expiries of
    /// names as they happen, until interrupted.
    ///
    /// Example: `bagel watch --prefix jobs/`
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
    /// Then follow the names under --prefix from the listing's revision, as
    /// `bagel watch --prefix P --from-revision R` would: every change after
    /// the listing is printed, none missed (one server only).
    #[arg(long)]
    watch: bool,
    /// With --watch: also print the server's progress messages (see
    /// `bagel watch --progress`).
    #[arg(long, requires = "watch")]
    progress: bool,
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
    /// before, or a `bagel list`'s), as far as the server still keeps
    /// them; refused when it does not (list again), or when the revision
    /// is from before the server restarted.
    #[arg(long)]
    from_revision: Option<u64>,
    /// Also print the server's progress messages: "REVISION progress" (or
    /// `{"kind":"progress","revision":R}` with --json) as the watch starts
    /// and when it was quiet a while: every event up to REVISION has been
    /// printed, so --from-revision REVISION resumes it.
    #[arg(long)]
    progress: bool,
    /// How long the watch may be quiet before the server sends progress
    /// (10ms to 1h; default: the server's, 5s).
    #[arg(long, value_parser = humantime::parse_duration)]
    progress_interval: Option<std::time::Duration>,
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

/// Up to `limit` held names of one server starting with `prefix`, and the
/// revision of the first page (every page reflects at least that one, so
/// a watch from it misses nothing after the listing).
async fn list_one(client: &Client, prefix: &str, limit: usize) -> anyhow::Result<(Vec<ListedName>, u64)> {
    let mut out = Vec::new();
    let mut page: Option<String> = None;
    let mut revision = None;
    while out.len() < limit || revision.is_none() {
        let want = u32::try_from(limit.saturating_sub(out.len()).max(1)).unwrap_or(u32::MAX);
        let p = client.list(prefix, page.as_deref(), want).await?;
        revision.get_or_insert(p.revision);
        out.extend(p.names);
        match p.next_page {
            Some(next) => page = Some(next),
            None => break,
        }
    }
    out.truncate(limit);
    Ok((out, revision.unwrap_or(0)))
}

async fn list(args: ListArgs, target: &Target) -> anyhow::Result<ExitCode> {
    if args.watch && target.server().is_none() {
        bail!("list --watch follows one server (revisions are per server): give it with --server URL");
    }
    let mut revisions: Vec<(Option<String>, u64)> = Vec::new();
    let names: Vec<(Option<String>, ListedName)> = match (target.server(), target.cluster()) {
        (Some(c), _) => {
            let (names, revision) = list_one(c, &args.prefix, args.limit).await?;
            revisions.push((None, revision));
            names.into_iter().map(|n| (None, n)).collect()
        }
        (None, Some(cluster)) => {
            let mut all = Vec::new();
            for (url, id) in cluster.servers() {
                let client = cluster.client_of(&id).await.map_err(|e| e.at_server(&url))?;
                let (names, revision) = list_one(client, &args.prefix, args.limit)
                    .await
                    .map_err(|e| e.context(format!("server {url}")))?;
                revisions.push((Some(url.clone()), revision));
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
    let revision_of =
        |server: &Option<String>| revisions.iter().find(|(s, _)| s == server).map_or(0, |(_, r)| *r);
    for (server, n) in &names {
        let h = &n.holder;
        if crate::output::json() {
            let line = ListedNameJson::new(n, server.as_deref()).at_revision(revision_of(server));
            println!("{}", serde_json::to_string(&line).expect("serializable"));
        } else {
            println!(
                "{} lease {} owner {:?} {} until {}{}",
                crate::names::shown(&n.name),
                h.lease_id,
                h.owner,
                h.mode.as_str(),
                crate::human::at(h.deadline),
                server
                    .as_ref()
                    .map(|s| format!(" (server {s})"))
                    .unwrap_or_default()
            );
        }
    }
    if args.watch {
        let client = target.server().expect("checked above");
        let revision = revision_of(&None);
        let what = WatchTarget::Prefix(args.prefix);
        // A server before revisions says 0: from now, as before.
        let from = (revision != 0).then_some(revision);
        let shown = Shown {
            json: crate::output::json(),
            progress: args.progress,
        };
        return follow(
            client,
            what,
            WatchOptions {
                from_revision: from,
                progress_interval: None,
            },
            shown,
        )
        .await;
    }
    if !crate::output::json() {
        for (server, revision) in revisions.iter().filter(|(_, r)| *r != 0) {
            let at = server.as_ref().map(|s| format!(" of {s}")).unwrap_or_default();
            eprintln!(
                "listed at revision {revision}{at}: `bagel watch --from-revision {revision}` follows \
                 on from here"
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// How a watch's lines are printed.
#[derive(Clone, Copy, Debug)]
struct Shown {
    json: bool,
    progress: bool,
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
    let options = WatchOptions {
        from_revision: args.from_revision,
        progress_interval: args.progress_interval,
    };
    let shown = Shown {
        json: crate::output::json(),
        progress: args.progress,
    };
    follow(client, what, options, shown).await
}

/// Prints a watch's events until it ends. When it breaks, the error says
/// the revision to resume from (of the last event or progress message),
/// or, when the server cannot start from the revision asked, to list
/// again.
async fn follow(
    client: &Client,
    what: WatchTarget,
    options: WatchOptions,
    shown: Shown,
) -> anyhow::Result<ExitCode> {
    let mut events = client.watch_with(what, options).await.map_err(relist_hint)?;
    loop {
        match events.next_message().await {
            Ok(Some(WatchMessage::Event(e))) => print_event(&e, shown.json),
            Ok(Some(WatchMessage::Progress { revision })) => {
                if shown.progress {
                    print_progress(revision, shown.json);
                }
            }
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
            Err(e @ Error::WatchRevision { .. }) => return Err(relist_hint(e)),
            Err(e) => {
                let resume = events
                    .last_revision()
                    .map(|r| format!(" (resume with --from-revision {r})"))
                    .unwrap_or_default();
                return Err(anyhow::Error::from(e).context(format!("the watch broke{resume}")));
            }
        }
    }
}

/// A refused revision says the remedy (the message already names it; the
/// command to run is ours to say).
fn relist_hint(e: Error) -> anyhow::Error {
    match e {
        Error::WatchRevision { .. } => {
            anyhow::Error::from(e).context("cannot watch from that revision: run `bagel list --watch` (or list, then watch from the listing's revision)")
        }
        e => e.into(),
    }
}

fn print_progress(revision: u64, json: bool) {
    if json {
        let line = WatchProgressJson::new(revision);
        println!("{}", serde_json::to_string(&line).expect("serializable"));
    } else {
        println!("{revision} progress");
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
            crate::human::at(e.deadline)
        );
    }
}
