//! Lease subcommands: acquire, renew, upgrade, release, describe, history,
//! server-info, verify-witness.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use bagel_client::json::{LeaseJson, WitnessJson, ended_word};
use bagel_client::{Client, Error, LeaseOptions, Micros, pb};
use bagel_proto::KeyRing;
use clap::{Args, Subcommand};
use serde_json::json;

/// Exit code of a refused acquire (name held by someone else).
const EXIT_BUSY: u8 = 2;

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
    /// Show the server's keys, limits, clock and readiness.
    ServerInfo(JsonFlag),
    /// Verify a witness (the JSON of `acquire --json`, or a bare witness).
    VerifyWitness(VerifyArgs),
}

#[derive(Debug, Args)]
pub struct AcquireArgs {
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
    /// Who is holding it (free text for operators).
    #[arg(long, default_value = "")]
    owner: String,
    /// Let the server wait up to this long for busy names.
    #[arg(long, value_parser = humantime::parse_duration)]
    wait: Option<Duration>,
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
    #[arg(long)]
    json: bool,
}

impl TokenArgs {
    /// The lease id and token, from the flags or from the lease file.
    fn resolve(&self) -> anyhow::Result<(String, String)> {
        let is_id = self.lease_id.len() == 32 && self.lease_id.bytes().all(|b| b.is_ascii_hexdigit());
        if is_id {
            let token = self
                .token
                .clone()
                .context("--token is required when --lease is a lease id (or give the lease file)")?;
            return Ok((self.lease_id.clone(), token));
        }
        let text = std::fs::read_to_string(&self.lease_id).with_context(|| {
            format!(
                "--lease is neither a lease id (32 hex digits) nor a readable lease file: {:?}",
                self.lease_id
            )
        })?;
        let lease: LeaseJson = serde_json::from_str(&text)
            .with_context(|| format!("parsing the lease file {:?}", self.lease_id))?;
        Ok((lease.lease_id, self.token.clone().unwrap_or(lease.token)))
    }
}

#[derive(Debug, Args)]
pub struct RenewArgs {
    #[command(flatten)]
    lease: TokenArgs,
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
    #[arg(required = true)]
    names: Vec<String>,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    name: String,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct JsonFlag {
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// File with the JSON, or `-` for stdin (the default).
    #[arg(default_value = "-")]
    file: PathBuf,
    /// Trust this ed25519 public key (64 hex digits) instead of asking the
    /// server. Repeatable.
    #[arg(long = "key")]
    keys: Vec<String>,
}

pub async fn run(cmd: LeaseCommand, server: &str) -> anyhow::Result<ExitCode> {
    match cmd {
        LeaseCommand::VerifyWitness(args) => verify_witness(args, server).await,
        cmd => {
            let client = Client::connect(server).await?;
            match run_with(cmd, &client).await {
                Err(e) => match e.downcast_ref::<Error>() {
                    Some(busy @ Error::Busy { .. }) => {
                        eprintln!("bagel: {}", busy_message(busy));
                        Ok(ExitCode::from(EXIT_BUSY))
                    }
                    _ => Err(e),
                },
                ok => ok,
            }
        }
    }
}

fn busy_message(e: &Error) -> String {
    match e {
        Error::Busy {
            conflict: Some(c), ..
        } => format!(
            "name {:?} is held by lease {} (owner {:?}) until {} ({} us)",
            c.name,
            c.holder_lease_id,
            c.holder_owner,
            Micros::from_micros(c.holder_deadline_us),
            c.holder_deadline_us
        ),
        other => other.to_string(),
    }
}

async fn run_with(cmd: LeaseCommand, client: &Client) -> anyhow::Result<ExitCode> {
    match cmd {
        LeaseCommand::Acquire(args) => acquire(args, client).await,
        LeaseCommand::Renew(args) => {
            let (lease_id, token) = args.lease.resolve()?;
            let deadline = client.clock().now().saturating_add(args.ttl);
            let resp = client
                .renew_raw(pb::RenewRequest {
                    lease_id,
                    token,
                    deadline_us: deadline.as_micros(),
                    metadata: args.metadata.as_deref().map(metadata),
                })
                .await?;
            let witness = resp.witness.as_ref().map(WitnessJson::from);
            if args.lease.json {
                println!(
                    "{}",
                    json!({ "deadline_us": resp.deadline_us, "witness": witness })
                );
            } else {
                println!(
                    "renewed until {} ({} us)",
                    Micros::from_micros(resp.deadline_us),
                    resp.deadline_us
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        LeaseCommand::Upgrade(args) => {
            let (lease_id, token) = args.resolve()?;
            let grant = client.upgrade_raw(pb::UpgradeRequest { lease_id, token }).await?;
            print_grant(&LeaseJson::from_grant(&grant, Some(client.url())), args.json);
            Ok(ExitCode::SUCCESS)
        }
        LeaseCommand::Release(args) => {
            let (lease_id, token) = args.lease.resolve()?;
            let written = crate::written::load(&lease_id)?;
            if let (Some(given), Some(up_to)) = (args.watermark, written.max_written)
                && given < up_to.as_micros()
            {
                bail!(
                    "--watermark {given} is below {}, the highest timestamp `bagel write` wrote under lease \
                     {lease_id}: the next holder could write below it. Release with at least that, or \
                     without --watermark",
                    up_to.as_micros()
                );
            }
            let watermark = args
                .watermark
                .unwrap_or(0)
                .max(written.max_written.map_or(0, Micros::as_micros));
            let resp = client
                .release_raw(pb::ReleaseRequest {
                    lease_id: lease_id.clone(),
                    token,
                    watermark_us: watermark,
                    signed_time: None,
                    metadata: args.metadata.as_deref().map(metadata),
                    unsettled: written.uncertain,
                    settled_through_us: 0,
                })
                .await?;
            crate::written::forget(&lease_id);
            if args.lease.json {
                println!("{}", json!({ "watermark_us": resp.watermark_us }));
            } else {
                println!(
                    "released; stored watermark {} ({} us)",
                    Micros::from_micros(resp.watermark_us),
                    resp.watermark_us
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        LeaseCommand::Describe(args) => {
            let states = client.describe(args.names).await?;
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
            let h = client.history(&args.name).await?;
            if args.json {
                let entries: Vec<_> = h
                    .entries
                    .iter()
                    .map(|e| {
                        json!({
                            "lease_id": e.lease_id,
                            "owner": e.owner,
                            "event": match e.event() {
                                pb::HistoryEvent::Renewed => "renewed",
                                _ => "released",
                            },
                            "at_us": e.at_us,
                            "watermark_us": e.watermark_us,
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
                        "{} {:?} lease {} owner {:?} watermark {} metadata {}",
                        Micros::from_micros(e.at_us),
                        e.event(),
                        e.lease_id,
                        e.owner,
                        e.watermark_us,
                        e.metadata.as_ref().map_or("-".into(), metadata_text)
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        LeaseCommand::ServerInfo(args) => {
            let info = client.server_info().await?;
            let clock = info.clock.clone().unwrap_or_default();
            let v = json!({
                "server_id": info.server_id,
                "version": info.version,
                "epoch_us": info.epoch_us,
                "ready": info.ready,
                "ready_at_us": info.ready_at_us,
                "now_us": info.now_us,
                "min_ttl_us": info.min_ttl_us,
                "max_ttl_us": info.max_ttl_us,
                "max_wait_us": info.max_wait_us,
                "forgotten_floor_us": info.forgotten_floor_us,
                "unsafe_skip_restart_wait": info.unsafe_skip_restart_wait,
                "keys": info.keys.iter().map(|k| json!({
                    "key_id": k.key_id, "ed25519_hex": hex(&k.ed25519)
                })).collect::<Vec<_>>(),
                "clock": {
                    "source": match clock.source() {
                        pb::TimeSource::Roughtime => "roughtime",
                        _ => "local",
                    },
                    "error_bound_us": clock.error_bound_us,
                    "healthy": clock.healthy,
                    "detail": clock.detail,
                },
                "limits": {
                    "max_names_per_request": info.max_names_per_request,
                    "max_name_bytes": info.max_name_bytes,
                    "max_owner_bytes": info.max_owner_bytes,
                    "max_metadata_bytes": info.max_metadata_bytes,
                    "timestamp_tolerance_us": info.timestamp_tolerance_us,
                },
            });
            if args.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("server {} (version {})", info.server_id, info.version);
                println!(
                    "ready: {} (at {}){}",
                    info.ready,
                    Micros::from_micros(info.ready_at_us),
                    if info.unsafe_skip_restart_wait {
                        " UNSAFE: restart wait skipped"
                    } else {
                        ""
                    }
                );
                println!(
                    "ttl: ({} us, {} us]; max wait {} us",
                    info.min_ttl_us, info.max_ttl_us, info.max_wait_us
                );
                for k in &info.keys {
                    println!("key {} ed25519 {}", k.key_id, hex(&k.ed25519));
                }
                println!(
                    "clock: {} (error bound {} us)",
                    clock.detail, clock.error_bound_us
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        LeaseCommand::VerifyWitness(_) => unreachable!("handled without a connection"),
    }
}

async fn acquire(args: AcquireArgs, client: &Client) -> anyhow::Result<ExitCode> {
    let mut builder = client.acquire(args.names).owner(args.owner);
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
    print_grant(&lease.to_json(), args.json);
    if !args.hold {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("holding lease {}; Ctrl-C to release", lease.id());
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C")?,
        reason = lease.lost() => bail!("lease lost while holding: {reason}"),
    }
    let wm = lease.release(None).await?;
    eprintln!("released; stored watermark {wm}");
    Ok(ExitCode::SUCCESS)
}

fn print_grant(l: &LeaseJson, as_json: bool) {
    if as_json {
        println!("{}", serde_json::to_string(l).expect("serializable"));
        return;
    }
    println!("lease     {} ({})", l.lease_id, l.mode);
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
            n.name,
            n.fencing_token,
            n.previous.ended,
            n.previous.lease_id,
            n.previous.watermark_us,
            n.previous.ended_at_us
        );
    }
}

fn metadata(text: &str) -> pb::Metadata {
    if text == "*" {
        pb::Metadata {
            data: Vec::new(),
            wildcard: true,
        }
    } else {
        pb::Metadata {
            data: text.as_bytes().to_vec(),
            wildcard: false,
        }
    }
}

fn metadata_text(m: &pb::Metadata) -> String {
    if m.wildcard {
        "*".into()
    } else {
        String::from_utf8_lossy(&m.data).into_owned()
    }
}

fn previous_json(p: Option<&pb::PreviousLease>) -> serde_json::Value {
    let p = p.cloned().unwrap_or_default();
    json!({
        "lease_id": p.lease_id,
        "watermark_us": p.watermark_us,
        "ended": ended_word(p.ended()),
        "ended_at_us": p.ended_at_us,
    })
}

fn name_state_json(s: &pb::NameState) -> serde_json::Value {
    json!({
        "name": s.name,
        "known": s.known,
        "fencing_token": s.fencing_token,
        "holder": s.holder.as_ref().map(|h| json!({
            "lease_id": h.lease_id,
            "owner": h.owner,
            "mode": if h.mode() == pb::Mode::Tentative { "tentative" } else { "full" },
            "deadline_us": h.deadline_us,
            "fencing_token": h.fencing_token,
            "granted_at_us": h.granted_at_us,
        })),
        "previous": previous_json(s.previous.as_ref()),
    })
}

fn print_name_state(s: &pb::NameState) {
    match &s.holder {
        Some(h) => println!(
            "{}: held by lease {} (owner {:?}, {:?}) until {}; fencing {}",
            s.name,
            h.lease_id,
            h.owner,
            h.mode(),
            Micros::from_micros(h.deadline_us),
            h.fencing_token
        ),
        None => println!("{}: free{}", s.name, if s.known { "" } else { " (no record)" }),
    }
    let p = s.previous.clone().unwrap_or_default();
    println!(
        "  previous: {} lease {:?} watermark {} ended at {}",
        ended_word(p.ended()),
        p.lease_id,
        p.watermark_us,
        p.ended_at_us
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex32(s: &str) -> anyhow::Result<Vec<u8>> {
    if s.len() != 64 {
        bail!("--key must be 64 hex digits, got {} characters", s.len());
    }
    (0..64)
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).with_context(|| format!("--key {s:?} is not hex")))
        .collect()
}

/// Reads the witness JSON, fetches or takes the keys, verifies.
async fn verify_witness(args: VerifyArgs, server: &str) -> anyhow::Result<ExitCode> {
    let text = if args.file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).context("reading stdin")?;
        s
    } else {
        std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file.display()))?
    };
    let value: serde_json::Value = serde_json::from_str(&text).context("input is not JSON")?;
    let witness_value = value.get("witness").cloned().unwrap_or(value);
    let witness: WitnessJson = serde_json::from_value(witness_value)
        .context("expected the JSON of `bagel acquire --json` or {body_b64, signature_b64, key_id}")?;
    let witness = witness.to_pb().map_err(anyhow::Error::msg)?;

    let mut keys = KeyRing::new();
    if args.keys.is_empty() {
        let client = Client::connect(server).await?;
        keys = client.keys().clone();
    } else {
        for k in &args.keys {
            keys.insert_bytes(&parse_hex32(k)?).map_err(anyhow::Error::msg)?;
        }
    }
    match bagel_proto::verify_witness(&witness, &keys) {
        Ok(body) => {
            println!(
                "witness OK: lease {} names {:?} deadline {} signed by key {} of server {}",
                body.lease_id,
                body.names.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
                Micros::from_micros(body.deadline_us),
                witness.key_id,
                body.server_id
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("bagel: witness does NOT verify: {e}");
            Ok(ExitCode::from(1))
        }
    }
}
