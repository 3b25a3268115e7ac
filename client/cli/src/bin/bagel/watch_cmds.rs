//! `bagel list` and `bagel watch`: what is held now, and what happens to
//! names as it happens (like `etcdctl get --prefix` and `etcdctl watch`).
//!
//! Over several servers (`--servers`), `list` asks each server and merges
//! the names in name order (each name lives on one server; during a
//! migration a name may be listed by both, each line saying its server);
//! `watch` follows one server only (revisions are per server). A backend
//! that offers neither (the S3 lease store) says why, and the error says
//! that and what to use instead.
//!
//! List then watch misses nothing: `list` says the revision its listing
//! reflects (`--json`: each line's `revision`; else on stderr), `watch
//! --from-revision` it follows on, and `list --watch` does both in one.
//! A watch always keeps a revision to resume from (the server's progress
//! messages move it on a quiet watch), and says it when the watch breaks.

use std::process::ExitCode;

use anyhow::bail;
use bagel_cli::contract::{ListedNameJson, WatchEventJson, WatchProgressJson};
use bagel_client::backend::{Call, Offer, WatchStream};
use bagel_client::{Error, WatchEvent, WatchMessage, WatchOptions, WatchTarget};
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

/// What to do instead of a list or watch the backend does not offer.
const LIST_INSTEAD: &str = "ask for names with `bagel describe NAME...`";
const WATCH_INSTEAD: &str = "poll `bagel describe NAME...` instead";

/// Refuses `what` (as the user asked it) unless the backend offers
/// `call`, in the words the backend states: why not, and `instead` when it
/// offers it not at all, or `per_server` when each of its servers does
/// alone.
fn check_offered(
    target: &Target,
    call: Call,
    what: &str,
    instead: &str,
    per_server: &str,
) -> anyhow::Result<()> {
    match target.backend().offers(call) {
        Offer::Yes => Ok(()),
        Offer::EachServer { why } => {
            bail!("{what} follows one server ({why}): give it with --server URL{per_server}")
        }
        Offer::No { why } => {
            let why = why.map(|w| format!(": {w}")).unwrap_or_default();
            bail!("{what} is not supported on {}{why}; {instead}", target.named())
        }
    }
}

async fn list(args: ListArgs, target: &Target) -> anyhow::Result<ExitCode> {
    check_offered(target, Call::List, "list", LIST_INSTEAD, "")?;
    if args.watch {
        check_offered(target, Call::Watch, "list --watch", WATCH_INSTEAD, "")?;
    }
    let listing = target.backend().list_names(&args.prefix, args.limit).await?;
    let (names, revisions) = (listing.names, listing.revisions);
    let revision_of = |server: &Option<String>| {
        revisions
            .iter()
            .find(|r| &r.server == server)
            .map_or(0, |r| r.revision)
    };
    for listed in &names {
        let (server, n) = (&listed.server, &listed.name);
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
        // Offered whole: the backend is one place, with one revision.
        let revision = revisions.first().map_or(0, |r| r.revision);
        let what = WatchTarget::Prefix(args.prefix);
        // A server before revisions says 0: from now, as before.
        let from = (revision != 0).then_some(revision);
        let shown = Shown {
            json: crate::output::json(),
            progress: args.progress,
        };
        return follow(
            target,
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
        for r in revisions.iter().filter(|r| r.revision != 0) {
            let revision = r.revision;
            let at = r.server.as_ref().map(|s| format!(" of {s}")).unwrap_or_default();
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
    check_offered(
        target,
        Call::Watch,
        "watch",
        WATCH_INSTEAD,
        ", once per server to watch several",
    )?;
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
    follow(target, what, options, shown).await
}

/// Prints a watch's events until it ends. When it breaks, the error says
/// the revision to resume from (of the last event or progress message),
/// or, when the server cannot start from the revision asked, to list
/// again.
async fn follow(
    target: &Target,
    what: WatchTarget,
    options: WatchOptions,
    shown: Shown,
) -> anyhow::Result<ExitCode> {
    let mut events: Box<dyn WatchStream> = target
        .backend()
        .watch_names(what, options)
        .await
        .map_err(relist_hint)?;
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
            "{} {} {} {} lease {} owner {:?} {} {}",
            e.revision,
            e.at,
            e.kind.as_str(),
            crate::names::shown(&e.name),
            e.lease_id,
            e.owner,
            e.mode.as_str(),
            deadline_text(e)
        );
    }
}

/// The event's deadline as people read it: a live lease's "until T (in
/// 4.2 s)"; an ended one's deadline as it stood, with no hint that it
/// still runs (a released lease is not held "until" anything).
fn deadline_text(e: &WatchEvent) -> String {
    use bagel_client::WatchEventKind as K;
    match e.kind {
        K::Granted | K::Renewed | K::Upgraded => format!("until {}", crate::human::at(e.deadline)),
        K::Released | K::Broken | K::Expired => format!("(its deadline was {})", e.deadline),
    }
}
