//! Lease subcommands: acquire, renew, upgrade, release, describe, history,
//! server-info, verify-witness.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use bagel_cli::contract::{LeaseJson, ModeJson, ServerNameJson, WitnessJson};
use bagel_client::{
    AcquireBuilder, BackendInfo, ClockSource, Error, HistoryEvent, Inherited, LeaseBackend as _,
    LeaseOptions, LeaseRef, Metadata, Micros, NameState, Previous, ReleaseOptions, ServerInfo, StoreInfo,
};
use clap::{Args, Subcommand};
use serde_json::json;

use crate::failure::echo;
use crate::target::{Target, TargetArgs};
use crate::time_cmds::RoughtimeArgs;

/// Exit code of a refused acquire (name held by someone else).
pub const EXIT_BUSY: u8 = 2;

#[derive(Debug, Subcommand)]
pub enum LeaseCommand {
    /// Acquire a lease on one or more names (all or none).
    Acquire(AcquireArgs),
    /// Renew a lease to now + TTL.
    Renew(RenewArgs),
    /// Turn a tentative lease into a full one.
    Upgrade(TokenArgs),
    /// Release a lease, publishing its watermark.
    Release(ReleaseArgs),
    /// Show who holds names and what a new holder would inherit.
    Describe(DescribeArgs),
    /// Show a name's recent renewals and releases with their metadata.
    History(HistoryArgs),
    /// Show the server's keys, limits, clock and readiness (with
    /// --servers: every server's).
    ServerInfo(JsonFlag),
    /// Show which server owns each name (with --servers; and, with
    /// --next-servers, which owns it next).
    Route(RouteArgs),
    /// Verify a witness (the JSON of `acquire --json`, or a bare witness).
    VerifyWitness(VerifyArgs),
}

#[derive(Debug, Args)]
pub struct AcquireArgs {
    /// The names (all or none).
    #[arg(required = true)]
    names: Vec<String>,
    /// Lease length (default: the server's max TTL).
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "deadline")]
    ttl: Option<Duration>,
    /// Absolute deadline, Unix microseconds.
    #[arg(long)]
    deadline: Option<u64>,
    /// Reserve only; upgrade before writing.
    #[arg(long)]
    tentative: bool,
    /// Who is holding it (free text for operators; default `host:pid`).
    #[arg(long, env = "BAGEL_OWNER")]
    owner: Option<String>,
    /// Wait up to this long for busy names (any length: re-asked in rounds
    /// of the server's max wait, through its restarts), or `forever`.
    #[arg(long, value_parser = crate::names::parse_wait)]
    wait: Option<Duration>,
    /// Print JSON (a lease file for lease commands); errors then go to stderr as one JSON object.
    #[arg(long)]
    json: bool,
    /// Keep renewing until Ctrl-C, then release.
    #[arg(long)]
    hold: bool,
}

#[derive(Debug, Args)]
pub struct TokenArgs {
    /// The lease id, or the lease file `bagel acquire --json` wrote (which
    /// also holds the token).
    #[arg(long = "lease")]
    lease_id: String,
    /// The lease's secret token (read from the lease file when `--lease` is
    /// one).
    #[arg(long)]
    token: Option<String>,
    /// The lease's names (repeatable): an S3 lease store finds a lease by
    /// its names. Read from the lease file when `--lease` is one.
    #[arg(long = "name")]
    names: Vec<String>,
    /// Print JSON (a lease file for lease commands); errors then go to stderr as one JSON object.
    #[arg(long)]
    json: bool,
}

impl TokenArgs {
    /// Whether `--lease` is a lease id: one server's (32 hex digits), or
    /// a lease over several (KEYID:LEASEID,...).
    fn is_id(&self) -> bool {
        (self.lease_id.len() == 32 && self.lease_id.bytes().all(|b| b.is_ascii_hexdigit()))
            || (self.lease_id.contains(':')
                && self
                    .lease_id
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b','))
    }

    /// The lease id and token, from the flags or from the lease file.
    fn resolve(&self) -> anyhow::Result<LeaseRef> {
        if self.is_id() {
            let token = self
                .token
                .clone()
                .context("--token is required when --lease is a lease id (or give the lease file)")?;
            return Ok(LeaseRef::new(self.lease_id.clone(), token).with_names(self.names.clone()));
        }
        crate::names::path_not_json("--lease", &self.lease_id)?;
        let text = std::fs::read_to_string(&self.lease_id).with_context(|| {
            format!(
                "--lease is neither a lease id (32 hex digits) nor the path of a readable lease file: {}",
                echo(&self.lease_id)
            )
        })?;
        let lease: LeaseJson = serde_json::from_str(&text)
            .with_context(|| format!("parsing the lease file {}", echo(&self.lease_id)))?;
        let token = self.token.clone().unwrap_or(lease.token);
        let names = if self.names.is_empty() {
            lease.names.into_iter().map(|n| n.name).collect()
        } else {
            self.names.clone()
        };
        Ok(LeaseRef::new(lease.lease_id, token).with_names(names))
    }

    /// The lease file `--lease` names, when it is one (not a bare lease
    /// id): the commands that change the lease rewrite it.
    fn file(&self) -> anyhow::Result<Option<LeaseJson>> {
        if self.is_id() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&self.lease_id)
            .with_context(|| format!("reading the lease file {}", echo(&self.lease_id)))?;
        serde_json::from_str(&text)
            .map(Some)
            .with_context(|| format!("parsing the lease file {}", echo(&self.lease_id)))
    }

    /// What a full lease inherited, from its lease file (none for a bare
    /// lease id, whose server carries its own chain on): a lease over
    /// several servers passes it to each part on release.
    fn inherited(&self) -> anyhow::Result<Option<Inherited>> {
        let Ok(text) = std::fs::read_to_string(&self.lease_id) else {
            return Ok(None);
        };
        let lease: LeaseJson = serde_json::from_str(&text)
            .with_context(|| format!("parsing the lease file {}", echo(&self.lease_id)))?;
        Ok((lease.mode == ModeJson::Full).then(|| Inherited {
            watermark: Micros::from_micros(lease.min_timestamp_us),
            unsettled_until: lease
                .names
                .iter()
                .filter_map(|n| n.previous.unsettled_until_us)
                .max()
                .map(Micros::from_micros),
        }))
    }
}

#[derive(Debug, Args)]
pub struct RenewArgs {
    #[command(flatten)]
    lease: TokenArgs,
    /// The new deadline: now + this.
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Where the holder stored its updates (free text).
    #[arg(long)]
    metadata: Option<String>,
}

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    lease: TokenArgs,
    /// Upper bound of every timestamp written under the lease (Unix µs).
    /// Omitted: the highest timestamp `bagel write` wrote under the lease
    /// on this machine (none: the inherited watermark carries on). A value
    /// below that is refused.
    #[arg(long)]
    watermark: Option<u64>,
    /// Where the holder stored its updates (free text); `*` = unknown.
    #[arg(long)]
    metadata: Option<String>,
}

#[derive(Debug, Args)]
pub struct DescribeArgs {
    /// The names (all or none).
    #[arg(required = true)]
    names: Vec<String>,
    /// Print JSON (a lease file for lease commands); errors then go to stderr as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// The name.
    name: String,
    /// Print JSON (a lease file for lease commands); errors then go to stderr as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct RouteArgs {
    /// The names (all or none).
    #[arg(required = true)]
    names: Vec<String>,
    /// Print JSON (a lease file for lease commands); errors then go to stderr as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct JsonFlag {
    /// Print JSON (a lease file for lease commands); errors then go to stderr as one JSON object.
    #[arg(long)]
    json: bool,
}

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

/// What the lease commands need from the global flags.
#[derive(Clone, Copy, Debug)]
pub struct Globals<'a> {
    pub target: &'a TargetArgs,
    pub roughtime: &'a RoughtimeArgs,
}

pub async fn run(cmd: LeaseCommand, g: Globals<'_>) -> anyhow::Result<ExitCode> {
    match cmd {
        LeaseCommand::VerifyWitness(args) => verify_witness(args, &g).await,
        cmd => {
            cmd.check_names()?;
            let target = g.target.connect(g.roughtime).await?;
            match run_with(cmd, &target).await {
                Err(e) => match e.downcast_ref::<Error>() {
                    Some(busy @ Error::Busy { .. }) => {
                        Ok(crate::failure::report("held", EXIT_BUSY, &busy_message(busy)))
                    }
                    _ => Err(e),
                },
                ok => ok,
            }
        }
    }
}

impl LeaseCommand {
    /// Refuses names the servers would refuse, and a `--lease` that is
    /// neither a lease id nor a readable lease file, before connecting.
    fn check_names(&self) -> anyhow::Result<()> {
        use crate::names::check;
        match self {
            LeaseCommand::Renew(RenewArgs { lease, .. })
            | LeaseCommand::Upgrade(lease)
            | LeaseCommand::Release(ReleaseArgs { lease, .. }) => {
                lease.resolve()?;
            }
            _ => {}
        }
        match self {
            LeaseCommand::Acquire(a) => check("name", &a.names),
            LeaseCommand::Describe(a) => check("name", &a.names),
            LeaseCommand::History(a) => check("name", [&a.name]),
            LeaseCommand::Route(a) => check("name", &a.names),
            LeaseCommand::Renew(a) => check("--name", &a.lease.names),
            LeaseCommand::Upgrade(a) => check("--name", &a.names),
            LeaseCommand::Release(a) => check("--name", &a.lease.names),
            LeaseCommand::ServerInfo(_) | LeaseCommand::VerifyWitness(_) => Ok(()),
        }
    }
}

pub fn busy_message(e: &Error) -> String {
    match e {
        Error::Busy {
            conflict: Some(c), ..
        } => format!(
            "name {:?} is held by lease {} (owner {:?}) until {} ({} us){}",
            c.name,
            c.holder_lease_id,
            c.holder_owner,
            c.holder_deadline,
            c.holder_deadline.as_micros(),
            c.server
                .as_ref()
                .map_or(String::new(), |s| format!(" on server {s}"))
        ),
        other => other.to_string(),
    }
}

async fn run_with(cmd: LeaseCommand, target: &Target) -> anyhow::Result<ExitCode> {
    let backend = target.backend();
    match cmd {
        LeaseCommand::Acquire(args) => acquire(args, target).await,
        LeaseCommand::Renew(args) => {
            let lease = args.lease.resolve()?;
            let file = args.lease.file()?;
            let deadline = backend.clock().now().saturating_add(args.ttl);
            let r = backend
                .renew_lease(&lease, deadline, args.metadata.as_deref().map(metadata))
                .await?;
            let json = match file {
                Some(mut json) => {
                    json.renewed(&r);
                    crate::lease_file::write(Path::new(&args.lease.lease_id), &json)?;
                    json
                }
                None => {
                    LeaseJson::from_witness(&lease.token, &r.witnesses, target.single_location().as_deref())
                        .map_err(|e| {
                        anyhow::anyhow!("renewed, but cannot state the lease as a lease file: {e}")
                    })?
                }
            };
            if args.lease.json {
                println!("{}", serde_json::to_string(&json)?);
            } else {
                println!("renewed until {} ({} us)", r.deadline, r.deadline.as_micros());
            }
            Ok(ExitCode::SUCCESS)
        }
        LeaseCommand::Upgrade(args) => {
            let grant = backend.upgrade_lease(&args.resolve()?).await?;
            let mut json = LeaseJson::from_grant(&grant, target.single_location().as_deref());
            if let Some(file) = args.file()? {
                json.holder_secret = file.holder_secret;
                json.server = json.server.or(file.server);
                crate::lease_file::write(Path::new(&args.lease_id), &json)?;
            }
            print_grant(&json, args.json);
            Ok(ExitCode::SUCCESS)
        }
        LeaseCommand::Release(args) => {
            let lease = args.lease.resolve()?;
            let lock = crate::written::lock_for_release(&lease.id).await?;
            let written = lock.written()?;
            if let (Some(given), Some(up_to)) = (args.watermark, written.max_written)
                && given < up_to.as_micros()
            {
                bail!(
                    "--watermark {given} is below {}, the highest timestamp `bagel write` wrote under lease \
                     {}: the next holder could write below it. Release with at least that, or without \
                     --watermark",
                    up_to.as_micros(),
                    lease.id
                );
            }
            let mut options = ReleaseOptions::default().with_unsettled(written.uncertain);
            if let Some(wm) = args.watermark.map(Micros::from_micros).max(written.max_written) {
                options = options.with_watermark(wm);
            }
            if let Some(m) = args.metadata.as_deref().map(metadata) {
                options = options.with_metadata(m);
            }
            options.inherited = args.lease.inherited()?;
            let stored = backend.release_lease(&lease, options).await?;
            lock.released();
            if args.lease.json {
                println!("{}", json!({ "watermark_us": stored.as_micros() }));
            } else {
                println!("released; stored watermark {stored} ({} us)", stored.as_micros());
            }
            Ok(ExitCode::SUCCESS)
        }
        LeaseCommand::Describe(args) => {
            let states = backend.describe(&args.names).await?;
            if args.json {
                let v: Vec<_> = states.iter().map(name_state_json).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                for s in &states {
                    print_name_state(s);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        LeaseCommand::History(args) => {
            let h = backend.history(&args.name).await?;
            let event = |e: HistoryEvent| match e {
                HistoryEvent::Renewed => "renewed",
                HistoryEvent::Released => "released",
            };
            if args.json {
                let entries: Vec<_> = h
                    .entries
                    .iter()
                    .map(|e| {
                        json!({
                            "lease_id": e.lease_id,
                            "owner": e.owner,
                            "event": event(e.event),
                            "at_us": e.at.as_micros(),
                            "watermark_us": e.watermark.as_micros(),
                            "metadata": e.metadata.as_ref().map(metadata_text),
                        })
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::to_string_pretty(&json!({ "entries": entries, "truncated": h.truncated }))?
                );
            } else {
                if h.truncated {
                    println!("(older entries dropped)");
                }
                for e in &h.entries {
                    println!(
                        "{} {} lease {} owner {:?} watermark {} metadata {}",
                        e.at,
                        event(e.event),
                        e.lease_id,
                        e.owner,
                        e.watermark.as_micros(),
                        e.metadata
                            .as_ref()
                            .map_or("-".into(), |m| crate::names::shown(&metadata_text(m)))
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        LeaseCommand::ServerInfo(args) => {
            let (infos, v) = match backend.info().await? {
                BackendInfo::Store(store) => return store_info(&store, args.json),
                // One server: the one object, as always.
                BackendInfo::Server { url, info } => {
                    let v = server_info_json(&info);
                    (vec![(url, info)], v)
                }
                BackendInfo::Servers(infos) => {
                    let v = infos.iter().map(|(_, i)| server_info_json(i)).collect();
                    (infos, serde_json::Value::Array(v))
                }
                other => bail!("server-info: this lease backend says {other:?}, which this CLI cannot print"),
            };
            if args.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                for (url, info) in &infos {
                    if infos.len() > 1 {
                        println!("== {url}");
                    }
                    print_server_info(info);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        LeaseCommand::Route(args) => {
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
        LeaseCommand::VerifyWitness(_) => unreachable!("handled without a connection"),
    }
}

/// What `server-info` says of an S3 lease store: there is no server, so
/// its limits, margin and the keys published there.
fn store_info(store: &StoreInfo, as_json: bool) -> anyhow::Result<ExitCode> {
    let keys = &store.keys;
    let us = |d: Duration| bagel_proto::duration_micros(d);
    let v = json!({
        "lease_store": store.location,
        "key_id": store.key_id,
        "min_ttl_us": us(store.min_ttl),
        "max_ttl_us": us(store.max_ttl),
        "max_wait_us": us(store.max_wait),
        "clock_margin_us": us(store.clock_margin),
        "keys": keys.ids().map(|id| json!({
            "key_id": id, "ed25519_hex": bagel_proto::hex::encode(keys.get(id).expect("listed").as_bytes())
        })).collect::<Vec<_>>(),
    });
    if as_json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "lease store {} (no server); this client signs with key {}",
            store.location, store.key_id
        );
        println!(
            "ttl: ({} us, {} us]; max wait {} us; clock margin {} us",
            us(store.min_ttl),
            us(store.max_ttl),
            us(store.max_wait),
            us(store.clock_margin)
        );
        for id in keys.ids() {
            println!(
                "key {id} ed25519 {}",
                bagel_proto::hex::encode(keys.get(id).expect("listed").as_bytes())
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn acquire(args: AcquireArgs, target: &Target) -> anyhow::Result<ExitCode> {
    // Its key is printed into a lease file, for other processes to write
    // with: a key of its own.
    let mut builder = AcquireBuilder::new(target.backend(), args.names)
        .owner(crate::owner::owner_or_default(args.owner.as_deref()))
        .own_holder_key();
    if let Some(ttl) = args.ttl {
        builder = builder.ttl(ttl);
    }
    if let Some(d) = args.deadline {
        builder = builder.deadline(Micros::from_micros(d));
    }
    if args.tentative {
        builder = builder.tentative();
    }
    if let Some(w) = args.wait {
        builder = builder.wait(w);
    }
    builder = builder.options(LeaseOptions::default().with_auto_renew(args.hold));
    let lease = builder.send().await?;
    print_grant(
        &LeaseJson::from_lease(&lease, target.single_location().as_deref()),
        args.json,
    );
    if !args.hold {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("holding lease {}; Ctrl-C to release", lease.id());
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C")?,
        reason = lease.lost() => bail!("lease lost while holding: {reason}"),
    }
    // Still renewed while the release waits for `bagel write` runs of it.
    let lock = tokio::select! {
        lock = crate::written::lock_for_release(lease.id()) => lock?,
        reason = lease.lost() => bail!("lease lost while waiting for its writers to end: {reason}"),
    };
    let wm = crate::run_cmd::release_locked(lease, lock).await?;
    eprintln!("released; stored watermark {wm}");
    Ok(ExitCode::SUCCESS)
}

fn print_grant(l: &LeaseJson, as_json: bool) {
    if as_json {
        println!("{}", serde_json::to_string(l).expect("serializable"));
        return;
    }
    println!(
        "lease     {} ({})",
        l.lease_id,
        if l.mode == bagel_cli::contract::ModeJson::Full {
            "full"
        } else {
            "tentative"
        }
    );
    println!("token     {}", l.token);
    println!(
        "deadline  {} ({} us)",
        Micros::from_micros(l.deadline_us),
        l.deadline_us
    );
    println!("write after {} us (min_timestamp)", l.min_timestamp_us);
    for n in &l.names {
        println!(
            "  {}  fencing {}  previous: {} lease {:?} watermark {} ended at {}",
            crate::names::shown(&n.name),
            n.fencing_token,
            n.previous.ended,
            n.previous.lease_id,
            n.previous.watermark_us,
            n.previous.ended_at_us
        );
    }
}

fn metadata(text: &str) -> Metadata {
    if text == "*" {
        Metadata::Wildcard
    } else {
        Metadata::Data(text.as_bytes().to_vec())
    }
}

fn metadata_text(m: &Metadata) -> String {
    match m {
        Metadata::Wildcard => "*".into(),
        Metadata::Data(d) => String::from_utf8_lossy(d).into_owned(),
    }
}

fn previous_json(p: &Previous) -> serde_json::Value {
    json!({
        "lease_id": p.lease_id.clone().unwrap_or_default(),
        "watermark_us": p.watermark.as_micros(),
        "ended": p.ended.as_str(),
        "ended_at_us": p.ended_at.as_micros(),
        "unsettled_until_us": p.unsettled_until.map(Micros::as_micros),
    })
}

/// A holder as `describe --json` and `list --json` print it.
pub(crate) fn holder_json(h: &bagel_client::Holder) -> serde_json::Value {
    json!({
        "lease_id": h.lease_id,
        "owner": h.owner,
        "mode": h.mode.as_str(),
        "deadline_us": h.deadline.as_micros(),
        "fencing_token": h.fencing_token,
        "granted_at_us": h.granted_at.as_micros(),
    })
}

fn name_state_json(s: &NameState) -> serde_json::Value {
    json!({
        "name": s.name,
        "known": s.known,
        "fencing_token": s.fencing_token,
        "holder": s.holder.as_ref().map(holder_json),
        "previous": previous_json(&s.previous),
    })
}

fn print_name_state(s: &NameState) {
    match &s.holder {
        Some(h) => println!(
            "{}: held by lease {} (owner {:?}, {}) until {}; fencing {}",
            crate::names::shown(&s.name),
            h.lease_id,
            h.owner,
            h.mode.as_str(),
            h.deadline,
            h.fencing_token
        ),
        None => println!(
            "{}: free{}",
            crate::names::shown(&s.name),
            if s.known { "" } else { " (no record)" }
        ),
    }
    let p = &s.previous;
    println!(
        "  previous: {} lease {:?} watermark {} ended at {}",
        p.ended.as_str(),
        p.lease_id.as_deref().unwrap_or(""),
        p.watermark.as_micros(),
        p.ended_at.as_micros()
    );
}

fn server_info_json(info: &ServerInfo) -> serde_json::Value {
    let clock = &info.clock;
    let us = |d: Duration| bagel_proto::duration_micros(d);
    json!({
        "server_id": info.server_id,
        "version": info.version,
        "epoch_us": info.epoch.as_micros(),
        "ready": info.ready,
        "ready_at_us": info.ready_at.as_micros(),
        "now_us": info.now.as_micros(),
        "min_ttl_us": us(info.min_ttl),
        "max_ttl_us": us(info.max_ttl),
        "max_wait_us": us(info.max_wait),
        "forgotten_floor_us": info.forgotten_floor.as_micros(),
        "unsafe_skip_restart_wait": info.unsafe_skip_restart_wait,
        "keys": info.keys.iter().map(|(id, raw)| json!({
            "key_id": id, "ed25519_hex": bagel_proto::hex::encode(raw)
        })).collect::<Vec<_>>(),
        "clock": {
            "source": match clock.source {
                ClockSource::Roughtime => "roughtime",
                ClockSource::Local => "local",
            },
            "error_bound_us": us(clock.error_bound),
            "healthy": clock.healthy,
            "detail": clock.detail,
        },
        "limits": {
            "max_names_per_request": info.max_names_per_request,
            "max_name_bytes": info.max_name_bytes,
            "max_owner_bytes": info.max_owner_bytes,
            "max_metadata_bytes": info.max_metadata_bytes,
            "timestamp_tolerance_us": us(info.timestamp_tolerance),
        },
    })
}

fn print_server_info(info: &ServerInfo) {
    let us = |d: Duration| bagel_proto::duration_micros(d);
    println!("server {} (version {})", info.server_id, info.version);
    println!(
        "ready: {} (at {}){}",
        info.ready,
        info.ready_at,
        if info.unsafe_skip_restart_wait {
            " UNSAFE: restart wait skipped"
        } else {
            ""
        }
    );
    println!(
        "ttl: ({} us, {} us]; max wait {} us",
        us(info.min_ttl),
        us(info.max_ttl),
        us(info.max_wait)
    );
    for (id, raw) in &info.keys {
        println!("key {id} ed25519 {}", bagel_proto::hex::encode(raw));
    }
    println!(
        "clock: {} (error bound {} us)",
        info.clock.detail,
        us(info.clock.error_bound)
    );
}

/// Reads the witness JSON, fetches or takes the keys, verifies every
/// witness in it: a lease over several servers carries one per server,
/// and each must verify against the key of the server its part names.
async fn verify_witness(args: VerifyArgs, g: &Globals<'_>) -> anyhow::Result<ExitCode> {
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
