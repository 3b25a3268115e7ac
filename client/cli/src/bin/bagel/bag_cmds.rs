//! `bagel write`, `bagel read`, `bagel metronome`: the bag commands.

use std::io::{BufRead as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::metronome_http::MetronomeStatus;
use crate::progress::Bar;
use crate::time_cmds::RoughtimeArgs;
use anyhow::Context as _;
use bagel_bags::audit::{AuditConfig, AuditMessage};
use bagel_bags::reader::{Message, ReadOptions};
use bagel_bags::{self as bag, BagConfig, Metronome, Writer};
use bagel_cli::contract::{
    AttestationJson, LeaseJson, ProblemJson, ReadItemKind, ReadMessageJson, ReadSummaryJson, RetainJson,
    SummaryMadeJson,
};
use bagel_proto::Micros;
use bagel_proto::clock::{CheckedClock, Clock, OffsetClock, SystemClock, Unvouched};
use bagel_proto::rights::{RightsSnapshot, WriteLedger, WriteRights};
use bytes::Bytes;
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[derive(clap::Subcommand, Debug)]
pub enum BagCommand {
    /// Write messages under a lease; prints each message's timestamp once
    /// its batch is committed.
    ///
    /// Example: `printf 'a\nb\n' | bagel write --store file:///srv/bags --log orders --lease lease.json`
    Write(WriteArgs),
    /// Read a time range of a log in timestamp order, checking every message.
    ///
    /// Example: `bagel read --store file:///srv/bags --log orders --from 2026-11-27T17:00:00Z`
    Read(ReadArgs),
    /// Close every past bag of the given logs, continuously or once.
    ///
    /// Example: `bagel metronome --store file:///srv/bags --log orders`
    Metronome(MetronomeArgs),
    /// Check a time range of a log from the stored messages and witnesses
    /// alone: signatures, chains of grants, overlaps, out-of-lease
    /// timestamps, watermarks, signed times. Exits 1 on any violation.
    ///
    /// Example: `bagel audit --store file:///srv/bags --log orders --from 2026-11-27T17:00:00Z`
    Audit(AuditArgs),
    /// Turn closed stretches of a log into one summary object each (whole
    /// minutes), sealing past-due minutes first. Idempotent: any number may
    /// run at once; readers then read those minutes from the summary.
    /// Without --from, resumes at the oldest stretch not yet summarized.
    ///
    /// Example: `bagel summarize --store file:///srv/bags --log orders`
    Summarize(SummarizeArgs),
    /// Remove old bags that a summary holds, once the summary checks
    /// against them (and, optionally, old summaries). Never removes what
    /// no summary holds. A summary that does not check, or is corrupt,
    /// keeps its bags (a KEPT line) and the run goes on with the others,
    /// then exits 1.
    ///
    /// Example: `bagel retain --store file:///srv/bags --log orders --keep-bags 1d`
    Retain(RetainArgs),
}

#[derive(clap::Args, Debug)]
pub struct RetainArgs {
    /// `file:///abs/dir`, `s3://bucket/prefix` or `nfs://host/dir`.
    #[arg(long, env = "BAGEL_STORE")]
    store: String,
    /// The log.
    #[arg(long)]
    log: String,
    /// Keep bags this long after their stretch ended (at least 10m).
    #[arg(long, value_parser = humantime::parse_duration)]
    keep_bags: Duration,
    /// Also remove summaries this long after their stretch ended (at least
    /// --keep-bags); without it, summaries are kept forever.
    #[arg(long, value_parser = humantime::parse_duration)]
    keep_summaries: Option<Duration>,
    /// Lower the 10-minute floor on --keep-bags and --keep-summaries to
    /// this, for fault runs that cannot wait. Unsafe unless it is longer
    /// than every metronome's --lookback and every lease's TTL: a bag
    /// removed while a writer or closer still works on it is lost to
    /// readers that do not read its summary.
    #[arg(long, value_parser = humantime::parse_duration)]
    unsafe_min_keep: Option<Duration>,
    #[command(flatten)]
    timing: TimingArgs,
}

#[derive(clap::Args, Debug)]
pub struct SummarizeArgs {
    /// `file:///abs/dir`, `s3://bucket/prefix` or `nfs://host/dir`.
    #[arg(long, env = "BAGEL_STORE")]
    store: String,
    /// The log to summarize.
    #[arg(long)]
    log: String,
    /// From the stretch holding this timestamp (Unix microseconds or RFC
    /// 3339); default: the oldest stretch from the log's start that
    /// published summaries do not cover yet.
    #[arg(long, value_parser = parse_time)]
    from: Option<Micros>,
    /// Up to the stretches that start before this; default: every stretch
    /// already past its close time.
    #[arg(long, value_parser = parse_time)]
    to: Option<Micros>,
    /// The length of one summary: whole minutes (every summarizer of a log
    /// should use the same, or their summaries overlap).
    #[arg(long, default_value = "1m", value_parser = parse_minutes)]
    span: u32,
    /// Attest each summary with the ed25519 key in this file (64 hex
    /// digits; created when missing, as the server's --key is): after
    /// verifying every witness, holder signature and signed time in it,
    /// publish a signed attestation beside it. Readers that trust the key
    /// (`bagel read --trust-summarizer`) then skip those verifications.
    #[arg(long)]
    attest_key: Option<PathBuf>,
    /// With --attest-key: a lease server's ed25519 public key (64 hex
    /// digits; repeatable) to verify witnesses and signed times with.
    /// Without any, the keys of the servers given by --server or --servers
    /// are used; with --lease-store, the keys published in the store are
    /// added.
    #[arg(long = "key")]
    keys: Vec<String>,
    #[command(flatten)]
    timing: TimingArgs,
}

/// A duration of whole minutes, as a count of minutes.
fn parse_minutes(s: &str) -> Result<u32, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e}"))?;
    let secs = d.as_secs();
    if d.subsec_nanos() != 0 || secs == 0 || secs % 60 != 0 || secs / 60 > 7 * 24 * 60 {
        return Err(format!("{s:?} is not a whole number of minutes from 1m to 7d"));
    }
    Ok((secs / 60) as u32)
}

/// Which log to read, and which part of it (`read` and `audit`).
#[derive(clap::Args, Debug)]
pub struct LogRange {
    /// `file:///abs/dir` or `s3://bucket/prefix`.
    #[arg(long, env = "BAGEL_STORE")]
    store: String,
    /// The log (a stream of bags) in the store.
    #[arg(long)]
    log: String,
    /// First timestamp included: Unix microseconds or RFC 3339.
    #[arg(long, value_parser = parse_time)]
    from: Option<Micros>,
    /// First timestamp excluded: Unix microseconds or RFC 3339.
    #[arg(long, value_parser = parse_time)]
    to: Option<Micros>,
    /// Items (data files, batch objects) listed bigger than this are not
    /// read but reported as a problem (bytes, or with KiB, MiB, GiB).
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    max_item_bytes: u64,
    /// A read closes missing past bags empty (so later readers agree) at
    /// most this far back from now; one that would reach further back is
    /// refused (a stray start mark, or --from long before the log began).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    max_seal_lookback: Duration,
}

impl LogRange {
    /// Read options covering this range.
    fn read_options(&self) -> ReadOptions {
        ReadOptions::default()
            .with_range(self.from.unwrap_or(Micros::ZERO), self.to.unwrap_or(Micros::MAX))
            .with_max_item_bytes(self.max_item_bytes)
            .with_max_seal_lookback(self.max_seal_lookback)
    }
}

/// A read's error, with the flags that change the outcome where some do.
fn read_error(e: bag::Error) -> anyhow::Error {
    let hint = matches!(e, bag::Error::SealTooFar { .. })
        .then_some(" (give a later --from, or --max-seal-lookback to allow it)");
    let e = anyhow::Error::new(e);
    match hint {
        Some(h) => anyhow::anyhow!("{e}{h}"),
        None => e,
    }
}

/// Bytes: a number, optionally followed by KiB, MiB or GiB (or K, M, G).
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count (e.g. 1048576, 512MiB, 1GiB)"))?;
    let mul: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        u => return Err(format!("{s:?}: unknown unit {u:?} (use KiB, MiB or GiB)")),
    };
    n.checked_mul(mul).ok_or_else(|| format!("{s:?} is too large"))
}

#[derive(clap::Args, Debug)]
pub struct AuditArgs {
    #[command(flatten)]
    range: LogRange,
    /// A lease server's ed25519 public key (64 hex digits); repeatable.
    /// Without any, the keys of the servers given by --server or --servers
    /// are used; with --lease-store, the keys published in the store are
    /// added.
    #[arg(long = "key")]
    keys: Vec<String>,
    /// How far a timestamp may be ahead of its signed time.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    tolerance: Duration,
    /// A lease server's access policy (bagel-server --acl): also report
    /// writes under leases whose owner it gives no lease permission on
    /// one of their names (NOT GRANTED; exit 1).
    #[arg(long, value_name = "FILE")]
    acl: Option<std::path::PathBuf>,
    #[command(flatten)]
    timing: TimingArgs,
}

/// Timing shared by writers and closers; must agree across processes.
#[derive(clap::Args, Debug, Clone)]
pub struct TimingArgs {
    /// A bag [s, s+1) closes at s + 1 + grace. Every writer, metronome and
    /// reader of a store must use the same grace: closing earlier than the
    /// writers expect would drop writes they acknowledged.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// Bound on clock differences between writers and closers.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    clock_tolerance: Duration,
}

impl TimingArgs {
    fn config(&self) -> BagConfig {
        BagConfig::default()
            .with_grace(self.grace)
            .with_clock_tolerance(self.clock_tolerance)
    }
}

#[derive(clap::Args, Debug)]
pub struct WriteArgs {
    /// `file:///abs/dir` or `s3://bucket/prefix`.
    #[arg(long, env = "BAGEL_STORE")]
    store: String,
    /// The log (a stream of bags) in the store.
    #[arg(long)]
    log: String,
    /// The lease as printed by `bagel acquire --json`.
    #[arg(long)]
    lease: PathBuf,
    /// Messages; without any, one message per line of standard input.
    messages: Vec<String>,
    /// Defaults to `<host>-<pid>-<random>`; must be unique per process.
    #[arg(long)]
    writer_id: Option<String>,
    /// Messages per batch when reading standard input: a batch is written
    /// when this many lines have arrived or --linger has passed since its
    /// first line, whichever comes first. A batch whose timestamps would
    /// fall at or past the lease's deadline minus --deadline-margin (the
    /// lease expired or was lost) is refused whole, nothing of it stored:
    /// the run stops (exit 1, or 75 when trying again may help) unless
    /// --keep-going.
    #[arg(long, default_value_t = 1000)]
    batch: usize,
    /// Longest a line read from standard input waits for its batch to
    /// fill before the batch is written anyway (as Kafka's `linger.ms`), so
    /// a slow producer's lines are stored and acknowledged as they come,
    /// not at end of input.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    linger: Duration,
    /// Refuse timestamps at or past the deadline minus this.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    deadline_margin: Duration,
    /// Skip fsync (faster; an acknowledged write may be lost on power loss).
    #[arg(long)]
    no_sync: bool,
    /// After a failed batch, print `FAILED <count> <error>` and go on with
    /// the next one instead of stopping.
    #[arg(long)]
    keep_going: bool,
    /// Testing: run with a clock this many ms off (negative = behind).
    #[arg(long, hide = true, allow_hyphen_values = true, default_value_t = 0)]
    clock_offset_ms: i64,
    #[command(flatten)]
    timing: TimingArgs,
}

#[derive(clap::Args, Debug)]
pub struct ReadArgs {
    #[command(flatten)]
    range: LogRange,
    /// Also read bags that are not closed yet.
    #[arg(long)]
    include_open: bool,
    /// Do not close past-due bags found open (skip them instead).
    #[arg(long)]
    no_close: bool,
    /// Read every minute from its bags, even where a summary exists (the
    /// messages are the same while the bags exist; bags retention removed
    /// are PROBLEM lines naming the summary that holds them, exit 4).
    #[arg(long)]
    no_summaries: bool,
    /// Trusted witness key (64 hex digits, repeatable). With
    /// --lease-store, the keys published in the store are trusted too.
    /// Without either, signatures are not checked and every message says
    /// so.
    #[arg(long = "key")]
    keys: Vec<String>,
    /// Trust this summarizer's attestations (its ed25519 public key, 64
    /// hex digits, as --key; repeatable): a summary it attested over the
    /// very bytes read is read without verifying each batch's holder
    /// signature and signed time again (every other check is made, and
    /// `--json` names the summarizer in `vouched_by`). An attestation by
    /// such a key that does not hold is reported as a problem and the
    /// summary is checked in full.
    #[arg(long = "trust-summarizer")]
    trust_summarizers: Vec<String>,
    #[command(flatten)]
    timing: TimingArgs,
}

#[derive(clap::Args, Debug)]
pub struct MetronomeArgs {
    /// `file:///abs/dir` or `s3://bucket/prefix`.
    #[arg(long, env = "BAGEL_STORE")]
    store: String,
    /// Logs to close (repeatable, or several after one --log).
    #[arg(long, required = true, num_args = 1..)]
    log: Vec<String>,
    /// Start closing at now minus this.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    lookback: Duration,
    /// Close what is due now, then exit.
    #[arg(long)]
    once: bool,
    /// Longest pause between listings of an idle log's current minute:
    /// each listing that finds no bag to close doubles it from 1 s; 0 lists
    /// every second. Seals are never delayed by it.
    #[arg(long, env = "BAGEL_METRONOME_MAX_IDLE_LISTING", default_value = "8s", value_parser = humantime::parse_duration)]
    max_idle_listing: Duration,
    /// Also summarize each sealed stretch (see `bagel summarize`) this long
    /// after its close time.
    #[arg(long, value_parser = humantime::parse_duration)]
    summarize_after: Option<Duration>,
    /// With --summarize-after: the length of one summary (whole minutes).
    #[arg(long, default_value = "1m", value_parser = parse_minutes)]
    summary_span: u32,
    /// With --summarize-after: attest each summary with the ed25519 key in
    /// this file (see `bagel summarize --attest-key`).
    #[arg(long, requires = "summarize_after")]
    attest_key: Option<PathBuf>,
    /// With --attest-key: a lease server's ed25519 public key to verify
    /// witnesses and signed times with (as `bagel summarize --key`).
    #[arg(long = "key")]
    keys: Vec<String>,
    /// Serve /metrics (Prometheus), a status page, /healthz and /readyz
    /// on this address (e.g. 127.0.0.1:7422); prints `http on ADDR` first.
    #[arg(long, env = "BAGEL_METRONOME_HTTP")]
    http: Option<String>,
    #[command(flatten)]
    timing: TimingArgs,
}

/// What the bag commands need from the global flags.
#[derive(Debug)]
pub struct Globals<'a> {
    pub target: &'a crate::target::TargetArgs,
    pub roughtime: &'a RoughtimeArgs,
}

pub async fn run(cmd: BagCommand, g: Globals<'_>) -> anyhow::Result<ExitCode> {
    match cmd {
        BagCommand::Write(a) => write(a, &g).await,
        BagCommand::Read(a) => read(a, &g).await,
        BagCommand::Metronome(a) => metronome(a, &g).await,
        BagCommand::Audit(a) => audit(a, &g).await,
        BagCommand::Summarize(a) => summarize(a, &g).await,
        BagCommand::Retain(a) => retain(a, &g).await,
    }
}

async fn retain(a: RetainArgs, g: &Globals<'_>) -> anyhow::Result<ExitCode> {
    let cfg = a.timing.config();
    let store = bag::open_store(&a.store, &cfg).await?;
    // What is old enough is judged on a vouched clock, as closing is.
    let clock = crate::closer_clock::closer_clock(g.target, g.roughtime, cfg.clock_tolerance)?;
    let now = bag::closer_now(clock.as_ref()).await?;
    let min_keep = a.unsafe_min_keep.unwrap_or(bagel_bags::retain::MIN_KEEP);
    let r = bagel_bags::retain::retain_within(
        store.as_ref(),
        &a.log,
        now,
        a.keep_bags,
        a.keep_summaries,
        min_keep,
    )
    .await?;
    if crate::output::json() {
        let out = RetainJson {
            attestations_removed: r.attestations_removed,
            bags_removed: r.bags_removed,
            kept: r.kept.clone(),
            summaries_checked: r.summaries_checked,
            summaries_removed: r.summaries_removed,
        };
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!(
            "checked {} summaries; removed {} bags and {} summaries{}{}",
            r.summaries_checked,
            r.bags_removed,
            r.summaries_removed,
            match r.attestations_removed {
                0 => String::new(),
                n => format!(" (with {n} attestations)"),
            },
            // Said only when there were some: a late writer or closer came
            // back to a minute already removed (its tombstone kept it
            // closed; what it made there was no data).
            match r.leftovers_removed {
                0 => String::new(),
                n => format!("; removed {n} bags made again in minutes already removed"),
            }
        );
        for k in &r.kept {
            println!("KEPT {k}");
        }
    }
    // Every stretch was gone through; a summary that does not check (or
    // is corrupt) is still a finding a scheduled run must not pass over
    // as success, as `bagel audit` exits 1 on a violation.
    if r.kept.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "bagel retain: kept the bags of {} stretches whose summaries do not check (the KEPT lines say \
             why); every other stretch was retained",
            r.kept.len()
        );
        Ok(ExitCode::from(1))
    }
}

/// The attester of `--attest-key FILE` (the key created when missing, as
/// the server's `--key`), verifying with the lease servers' keys.
async fn attester(
    path: &std::path::Path,
    keys: &[String],
    g: &Globals<'_>,
    cmd: &str,
) -> anyhow::Result<bagel_bags::summary::attest::Attester> {
    let (signer, created) = bagel_proto::key_file::load_or_create(path)
        .with_context(|| format!("--attest-key {}", path.display()))?;
    if created {
        eprintln!(
            "bagel {cmd}: created attestation key {} in {} (public key {})",
            signer.key_id(),
            path.display(),
            bagel_proto::hex::encode(signer.verifying_key().as_bytes())
        );
    }
    Ok(bagel_bags::summary::attest::Attester {
        signer,
        keys: g.target.witness_keys(keys).await?,
        roughtime_keys: g.roughtime.servers()?.into_iter().map(|s| s.key).collect(),
    })
}

async fn summarize(a: SummarizeArgs, g: &Globals<'_>) -> anyhow::Result<ExitCode> {
    use bagel_bags::summary::{self, Stretch};
    let cfg = a.timing.config();
    let store = bag::open_store(&a.store, &cfg).await?;
    // It seals past-due minutes, so it is a closer: a vouched clock only.
    let clock = crate::closer_clock::closer_clock(g.target, g.roughtime, cfg.clock_tolerance)?;
    let now = bag::closer_now(clock.as_ref()).await?;
    let Some(start) = store.log_start(&a.log).await? else {
        anyhow::bail!(
            "log {:?} not found on {}: no writer has started it (a log is created by its first write)",
            a.log,
            a.store
        );
    };
    let from = a.from.map_or(start, bag::Bucket::of).max(start);
    let to = a.to.map_or(now, |t| t.min(now));
    let attester = match &a.attest_key {
        Some(path) => Some(attester(path, &a.keys, g, "summarize").await?),
        None => None,
    };
    // The minutes published summaries hold: retention may have removed
    // their bags, so they cannot be built again.
    let published = summary::list(store.as_ref(), &a.log).await?;
    let held: std::collections::BTreeSet<bagel_bags::seal::Span> =
        published.iter().flat_map(|st| st.spans()).collect();
    let mut stretch = Stretch::aligned(from, a.span);
    // Scheduled runs resume where summarizing stopped, rather than
    // building (and reading every bag of) the whole log again.
    if a.from.is_none() {
        while stretch.spans().all(|s| held.contains(&s)) && stretch.close_time(cfg.grace) <= now {
            stretch = stretch.next();
        }
    }
    let mut made = 0u64;
    let mut skipped = 0u64;
    let mut corrupt = 0u64;
    while stretch.close_time(cfg.grace) <= now && stretch.from().start() < to {
        for span in stretch.spans() {
            bagel_bags::seal::seal(store.as_ref(), &a.log, span).await?;
        }
        let done = match summary::summarize_attested(store.as_ref(), &a.log, stretch, attester.as_ref()).await
        {
            Ok(done) => done,
            // Summarized before, and its bags are (partly) gone since:
            // retention removed them, as it does once a summary holds
            // them. Not an error: later stretches still get summarized.
            Err(e) if stretch.spans().any(|s| held.contains(&s)) && bags_gone(&e) => {
                let by: Vec<String> = published
                    .iter()
                    .filter(|p| stretch.spans().any(|s| p.contains(s.first())))
                    .map(|p| p.name())
                    .collect();
                let note = format!(
                    "stretch {stretch}: skipped: published summaries hold its minutes ({}) and its bags are \
                     no longer all there to build it again (retention removed them): {e}",
                    by.join(", ")
                );
                match crate::output::json() {
                    true => eprintln!("bagel summarize: {note}"),
                    false => println!("{note}"),
                }
                skipped += 1;
                stretch = stretch.next();
                continue;
            }
            // A corrupt object under the stretch's name (publication is
            // create-only, so it stays until someone removes it): named,
            // and the later stretches still get summarized; the run then
            // exits 1, so a scheduled run does not pass over it.
            Err(e @ bag::Error::CorruptSummary { .. }) => {
                eprintln!("bagel summarize: stretch {stretch}: NOT summarized: {e}");
                corrupt += 1;
                stretch = stretch.next();
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        made += u64::from(done.created);
        let attestation = done.attestation.as_ref().map(|at| match at {
            summary::attest::Attested::Published {
                name,
                key_id,
                created,
            } => AttestationJson {
                created: *created,
                key_id: key_id.clone(),
                name: Some(name.clone()),
                refused: None,
            },
            summary::attest::Attested::Refused { key_id, reason } => AttestationJson {
                created: false,
                key_id: key_id.clone(),
                name: None,
                refused: Some(reason.clone()),
            },
        });
        if let Some(AttestationJson {
            refused: Some(why), ..
        }) = &attestation
        {
            eprintln!("bagel summarize: summary {} NOT attested: {why}", done.name);
        }
        if crate::output::json() {
            let out = SummaryMadeJson {
                attestation,
                bags: done.bags,
                bytes: done.bytes,
                created: done.created,
                from: stretch.from().start().as_micros(),
                messages: done.messages,
                name: done.name.clone(),
                to: stretch.last().end().as_micros(),
            };
            println!("{}", serde_json::to_string(&out)?);
        } else {
            println!(
                "summary {} ({stretch}): {} bags, {} messages, {} bytes{}",
                done.name,
                done.bags,
                done.messages,
                done.bytes,
                if done.created { "" } else { " (already published)" }
            );
            if let Some(AttestationJson {
                name: Some(name),
                created,
                ..
            }) = &attestation
            {
                println!(
                    "attestation {name}{}",
                    if *created { "" } else { " (already published)" }
                );
            }
        }
        stretch = stretch.next();
    }
    if !crate::output::json() {
        println!(
            "{made} summaries published{}; the next stretch ({stretch}) closes at {}",
            match skipped {
                0 => String::new(),
                n => format!(" ({n} stretches already summarized and retained skipped)"),
            },
            stretch.close_time(cfg.grace)
        );
    }
    if corrupt > 0 {
        eprintln!(
            "bagel summarize: {corrupt} stretches NOT summarized: a corrupt summary is published under \
             their names (the lines above name them; remove them to summarize those stretches)"
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether building a stretch failed for want of bags it had: one its
/// minute's seal lists is no longer closed (removed whole), or an item a
/// lock lists is no longer there (removed part way).
fn bags_gone(e: &bag::Error) -> bool {
    matches!(e, bag::Error::NotSummarizable { .. }) || e.is_not_found()
}

async fn audit(a: AuditArgs, g: &Globals<'_>) -> anyhow::Result<ExitCode> {
    let cfg = a.timing.config();
    let keys = g.target.witness_keys(&a.keys).await?;
    let roughtime_keys: Vec<_> = g.roughtime.servers()?.into_iter().map(|s| s.key).collect();
    let store = bag::open_store(&a.range.store, &cfg).await?;
    let bar = Bar::new("audit: reading", "bags", crate::output::json());
    let opts = a
        .range
        .read_options()
        .with_keys(Some(keys.clone()))
        .with_roughtime_keys(roughtime_keys.clone())
        .with_progress(bar.for_reader());
    let log = &a.range.log;
    let clock = crate::closer_clock::closer_clock(g.target, g.roughtime, cfg.clock_tolerance)?;
    let report = bag::read(store.as_ref(), log, &opts, &cfg, clock.as_ref()).await;
    bar.finish();
    let report = report.map_err(read_error)?;
    say_close_refused(&report);
    let messages = AuditMessage::from_report(&report, log);
    let mut acfg = AuditConfig::new(keys.clone());
    acfg.tolerance = a.tolerance;
    let local = keys.clone();
    acfg.verify_time = Arc::new(move |st| {
        bagel_proto::verify_signed_time(st, &local, &roughtime_keys).map_err(|e| e.to_string())
    });
    let mut result = bagel_bags::audit::audit(&messages, &acfg);
    result
        .violations
        .extend(bagel_bags::audit::problem_violations(&report.problems, log));
    // Every summary of the range, against its source bags while they exist.
    let (first, last) = (
        bag::Bucket::of(a.range.from.unwrap_or(Micros::ZERO)),
        bag::Bucket::of(
            a.range
                .to
                .unwrap_or(Micros::MAX)
                .saturating_sub(Duration::from_micros(1)),
        ),
    );
    // Every summary of the range, against its source bags while they
    // exist, and every attestation of them.
    let summaries = bagel_bags::audit::audit_summaries(store.as_ref(), log, first, last).await?;
    result.violations.extend(summaries.violations);
    let unchecked = summaries.unchecked;
    let not_granted = match &a.acl {
        Some(path) => crate::acl_cmd::not_granted(path, &messages, &keys)?,
        None => Vec::new(),
    };
    if crate::output::json() {
        let mut out = serde_json::to_value(&result)?;
        if a.acl.is_some() {
            out["not_granted"] = json!(not_granted);
        }
        out["unchecked_summaries"] = json!(unchecked);
        out["attestations_checked"] = json!(summaries.attestations_checked);
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "audited {} messages, {} leases, {} names; longest chain {}; {} chain gaps; {} violations",
            result.messages,
            result.leases,
            result.names,
            result.longest_chain,
            result.chain_gaps,
            result.violations.len()
        );
        if result.unbound_messages > 0 {
            println!(
                "UNBOUND {} messages cite leases acquired without a holder key: their witnesses verify, but \
                 nothing binds their bytes to the lease's holder",
                result.unbound_messages
            );
        }
        for v in &result.violations {
            println!("VIOLATION {v}");
        }
        for u in &unchecked {
            println!("UNCHECKED {u}");
        }
        for n in &not_granted {
            println!("NOT GRANTED {n}");
        }
    }
    Ok(if result.is_clean() && not_granted.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Unix microseconds or RFC 3339.
fn parse_time(s: &str) -> Result<Micros, String> {
    if let Ok(us) = s.parse::<u64>() {
        return Ok(Micros::from_micros(us));
    }
    humantime::parse_rfc3339_weak(s)
        .map(Micros::from_system_time)
        .map_err(|e| format!("{s:?} is neither Unix microseconds nor RFC 3339: {e}"))
}

async fn write(a: WriteArgs, g: &Globals<'_>) -> anyhow::Result<ExitCode> {
    crate::names::path_not_json("--lease", &a.lease.to_string_lossy())?;
    let text =
        std::fs::read_to_string(&a.lease).with_context(|| format!("reading lease {}", a.lease.display()))?;
    let lease: LeaseJson =
        serde_json::from_str(&text).with_context(|| format!("parsing lease {}", a.lease.display()))?;
    // Refuse at once what every batch would be refused for (a tentative
    // lease, a witness that does not decode), before opening the store.
    lease
        .snapshot()
        .map_err(|e| anyhow::anyhow!("lease {}: {e}", a.lease.display()))?;
    // Held until this run ends: a release of the lease waits for it.
    let record = Arc::new(crate::written::WriteRecord::open(&lease.lease_id, !a.no_sync)?);
    let cfg = a
        .timing
        .config()
        .with_deadline_margin(a.deadline_margin)
        .with_sync(!a.no_sync);
    let store = bag::open_store(&a.store, &cfg).await?;
    let clock: Arc<dyn Clock> = if a.clock_offset_ms == 0 {
        Arc::new(SystemClock)
    } else {
        Arc::new(OffsetClock {
            inner: SystemClock,
            offset_us: a.clock_offset_ms * 1000,
        })
    };
    // Every batch carries a recent signed time (Roughtime, else the lease
    // server's); a clock that is off refuses to write.
    let time = g.target.writer_time(g.roughtime, Arc::clone(&clock)).await?;
    let writer_id = a.writer_id.clone().unwrap_or_else(Writer::default_writer_id);
    let rights = Arc::new(FileRights {
        path: a.lease.clone(),
        lease: std::sync::Mutex::new(Followed {
            stamp: file_stamp(&a.lease),
            lease,
        }),
        ledger: Arc::default(),
        record: Arc::clone(&record),
    });
    let writer = Writer::new(
        store,
        &a.log,
        &writer_id,
        Arc::clone(&rights) as _,
        clock,
        time,
        cfg,
    )?;
    let result = write_all(&a, &writer).await;
    // Whatever happened, the release must publish what was written (each
    // batch was recorded before it went to the store; this says how the
    // run ended).
    record.finish(rights.ledger.summary())?;
    result
}

/// A lease file's rights, with a ledger of what this run wrote and its
/// durable record for the release.
///
/// The file is followed: whoever renews the lease rewrites it (`bagel
/// renew --lease FILE`, `bagel run`'s `$BAGEL_LEASE_FILE`, by rename), and
/// a long-running `bagel write` (a pipe) must see the new deadline, or
/// every batch after the first TTL is refused while the lease is alive.
/// Each batch's snapshot looks at the file's identity and mtime (one
/// `stat`) and reads it again when it changed. The file may only go on
/// naming the same lease; a file that is gone or cannot be read keeps the
/// last rights read, which run out at their deadline.
struct FileRights {
    path: PathBuf,
    lease: std::sync::Mutex<Followed>,
    ledger: Arc<WriteLedger>,
    record: Arc<crate::written::WriteRecord>,
}

/// The lease file as last read, and which version of it that was.
struct Followed {
    lease: LeaseJson,
    stamp: Option<FileStamp>,
}

/// What tells one version of a file from the next: a rename gives it a new
/// inode; an in-place write a new mtime or length.
type FileStamp = (u64, std::time::SystemTime, u64);

fn file_stamp(path: &std::path::Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.ino(), meta.modified().ok()?, meta.len()))
}

impl FileRights {
    /// The rights now: the file again if it changed since last read.
    fn current(&self) -> Result<LeaseJson, String> {
        let mut followed = self
            .lease
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let stamp = file_stamp(&self.path);
        if stamp.is_some() && stamp != followed.stamp {
            let newer = std::fs::read_to_string(&self.path)
                .ok()
                .and_then(|text| serde_json::from_str::<LeaseJson>(&text).ok());
            if let Some(newer) = newer {
                if newer.lease_id != followed.lease.lease_id {
                    return Err(format!(
                        "lease file {} now holds lease {}, not the lease {} this run writes under",
                        self.path.display(),
                        newer.lease_id,
                        followed.lease.lease_id
                    ));
                }
                followed.lease = newer;
                followed.stamp = stamp;
            }
        }
        Ok(followed.lease.clone())
    }
}

impl WriteRights for FileRights {
    fn snapshot(&self) -> Result<RightsSnapshot, String> {
        self.current()?.snapshot()
    }

    fn ledger(&self) -> Option<Arc<WriteLedger>> {
        Some(Arc::clone(&self.ledger))
    }

    fn before_write(&self, up_to: Micros) -> Result<(), String> {
        self.record.before_write(up_to).map_err(|e| format!("{e:#}"))
    }
}

async fn write_all(a: &WriteArgs, writer: &Writer) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    let mut batches = if a.messages.is_empty() {
        Batches::Stdin(StdinBatches::start(a.batch.max(1), a.linger))
    } else {
        Batches::Given(Some(a.messages.clone()))
    };
    while let Some(batch) = batches.next().await {
        let batch = batch.context("reading standard input")?;
        let n = batch.len();
        let stamps = writer
            .write_batch(batch.into_iter().map(Bytes::from).collect())
            .await;
        match stamps {
            Ok(stamps) => {
                for t in stamps {
                    writeln!(out, "{} {t}", t.as_micros())?;
                }
                out.flush()?;
            }
            Err(e) if a.keep_going => {
                writeln!(out, "FAILED {n} {e}")?;
                out.flush()?;
            }
            Err(e) => {
                out.flush()?;
                let wm = writer
                    .max_written()
                    .map_or("none".to_owned(), |m| m.as_micros().to_string());
                eprintln!("bagel: write failed (largest timestamp written: {wm}): {e}");
                return Ok(ExitCode::from(if e.is_retryable() { 75 } else { 1 }));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The batches `bagel write` writes: the messages given on the command
/// line, or standard input's lines as they arrive.
enum Batches {
    Given(Option<Vec<String>>),
    Stdin(StdinBatches),
}

impl Batches {
    async fn next(&mut self) -> Option<std::io::Result<Vec<String>>> {
        match self {
            Batches::Given(messages) => messages.take().map(Ok),
            Batches::Stdin(lines) => lines.next().await,
        }
    }
}

/// Standard input's lines in batches of at most `batch`, each ended by
/// its size or by `linger` after its first line. A thread reads the lines
/// (stdin is blocking) into a bounded channel: while a batch is being
/// written the next one fills, and a producer faster than the store is
/// held back by the channel, not buffered without bound.
struct StdinBatches {
    lines: tokio::sync::mpsc::Receiver<std::io::Result<String>>,
    batch: usize,
    linger: Duration,
}

impl StdinBatches {
    fn start(batch: usize, linger: Duration) -> Self {
        let (tx, rx) = tokio::sync::mpsc::channel(batch);
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let failed = line.is_err();
                if tx.blocking_send(line).is_err() || failed {
                    return;
                }
            }
        });
        StdinBatches {
            lines: rx,
            batch,
            linger,
        }
    }

    async fn next(&mut self) -> Option<std::io::Result<Vec<String>>> {
        let first = match self.lines.recv().await? {
            Ok(line) => line,
            Err(e) => return Some(Err(e)),
        };
        let until = tokio::time::Instant::now() + self.linger;
        let mut batch = vec![first];
        while batch.len() < self.batch {
            match tokio::time::timeout_at(until, self.lines.recv()).await {
                Ok(Some(Ok(line))) => batch.push(line),
                Ok(Some(Err(e))) => return Some(Err(e)),
                // End of input, or the linger passed: write what came.
                Ok(None) | Err(_) => break,
            }
        }
        Some(Ok(batch))
    }
}

/// A message as a line of `read --json` (`kind` `message`); `verified`:
/// every check of [`Message::verified`] was made and held (never without
/// keys).
fn message_json(m: &Message, keys_given: bool) -> ReadMessageJson {
    ReadMessageJson {
        bag: m.bucket.to_string(),
        from_open_bag: m.from_open_bag,
        kind: ReadItemKind::Message,
        lease_ids: m.lease_ids.clone(),
        notes: m.notes.clone(),
        payload: String::from_utf8_lossy(&m.payload).into_owned(),
        reason: None,
        sequence: m.sequence,
        time: m.timestamp.to_string(),
        timestamp_us: m.timestamp.as_micros(),
        verified: keys_given && m.verified(),
        vouched_by: match &m.vouched {
            bag::Vouched::Checked => None,
            bag::Vouched::Attested { key_id } => Some(key_id.to_string()),
        },
        writer_id: m.writer_id.clone(),
    }
}

async fn read(a: ReadArgs, g: &Globals<'_>) -> anyhow::Result<ExitCode> {
    let cfg = a.timing.config();
    let keys = if a.keys.is_empty() && !g.target.store.has_lease_store() {
        None
    } else {
        Some(g.target.witness_keys(&a.keys).await?)
    };
    let keys_given = keys.is_some();
    let store = bag::open_store(&a.range.store, &cfg).await?;
    // A log nobody ever wrote or closed has no entry at all (a mistyped
    // --log or --store); an empty one has its start mark or closed bags.
    // Asked before reading, which may close (create) past bags.
    let log = &a.range.log;
    bag::validate_log(log)?;
    if store.list_level(log, &[]).await?.is_empty() {
        anyhow::bail!(
            "log {log:?} does not exist in {}: nothing was ever written or closed there (check --log and \
             --store)",
            store.describe()
        );
    }
    let opts = a
        .range
        .read_options()
        .with_include_open(a.include_open)
        .with_close_past_due(!a.no_close)
        .with_summaries(!a.no_summaries)
        .with_keys(keys)
        .with_roughtime_keys(g.roughtime.servers()?.into_iter().map(|s| s.key).collect())
        .with_trusted_summarizers(crate::keys::key_ring(&a.trust_summarizers).context("--trust-summarizer")?);
    let trusting = !a.trust_summarizers.is_empty();
    let bar = Bar::new("read", "bags", crate::output::json());
    let opts = opts.with_progress(bar.for_reader());
    let clock: Arc<dyn CheckedClock> = if a.no_close {
        Arc::new(Unvouched("--no-close".into()))
    } else {
        crate::closer_clock::closer_clock(g.target, g.roughtime, cfg.clock_tolerance)?
    };
    let report = bag::read(store.as_ref(), &a.range.log, &opts, &cfg, clock.as_ref()).await;
    bar.finish();
    let report = report.map_err(read_error)?;
    say_close_refused(&report);
    let mut out = std::io::stdout().lock();
    // Verified: keys were given, and every accepted message passed every
    // check (witness, holder and time signatures, bounds), and nothing in
    // the bags was rejected, damaged, duplicated or misplaced.
    let verified = keys_given
        && report.messages.iter().all(Message::verified)
        && report.rejected.is_empty()
        && report
            .problems
            .iter()
            .all(|p| p.in_open_bag && p.kind == bag::ProblemKind::Damaged);
    if !keys_given && !crate::output::json() {
        writeln!(
            out,
            "# UNVERIFIED: no --key given; witness and time signatures were not checked"
        )?;
    }
    for m in &report.messages {
        if crate::output::json() {
            writeln!(out, "{}", serde_json::to_string(&message_json(m, keys_given))?)?;
        } else {
            writeln!(
                out,
                "{} {} {} {} {}{}{}",
                m.timestamp.as_micros(),
                m.timestamp,
                m.writer_id,
                m.sequence,
                String::from_utf8_lossy(&m.payload),
                if m.from_open_bag { "  [open bag]" } else { "" },
                if keys_given && !m.verified() {
                    format!("  [not verified: {}]", m.notes.join("; "))
                } else {
                    String::new()
                }
            )?;
        }
    }
    for r in &report.rejected {
        if crate::output::json() {
            let line = ReadMessageJson {
                kind: ReadItemKind::Rejected,
                verified: false,
                reason: Some(r.reason.clone()),
                ..message_json(&r.message, keys_given)
            };
            writeln!(out, "{}", serde_json::to_string(&line)?)?;
        } else {
            writeln!(
                out,
                "REJECTED {} {} {} {}: {}",
                r.message.timestamp.as_micros(),
                r.message.writer_id,
                r.message.sequence,
                String::from_utf8_lossy(&r.message.payload),
                r.reason
            )?;
        }
    }
    for p in &report.problems {
        if crate::output::json() {
            let line = ProblemJson {
                bag: p.bucket.to_string(),
                in_open_bag: p.in_open_bag,
                item: p.item.clone(),
                kind: ReadItemKind::Problem,
                offset: p.offset,
                what: p.what.clone(),
            };
            writeln!(out, "{}", serde_json::to_string(&line)?)?;
        } else {
            writeln!(
                out,
                "PROBLEM bag {} item {} offset {}: {}",
                p.bucket,
                p.item,
                p.offset.map_or("-".to_owned(), |o| o.to_string()),
                p.what
            )?;
        }
    }
    if crate::output::json() {
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        let summary = ReadSummaryJson {
            close_refused: report.close_refused.clone(),
            closed_bags_read: report.closed_bags_read,
            kind: ReadItemKind::Summary,
            messages: count(report.messages.len()),
            open_bags_skipped: count(report.skipped_open.len()),
            problems: count(report.problems.len()),
            rejected: count(report.rejected.len()),
            summaries_attested: trusting.then_some(report.summaries_attested),
            verified,
        };
        writeln!(out, "{}", serde_json::to_string(&summary)?)?;
    } else {
        eprintln!(
            "bagel: {} messages, {} rejected, {} problems, {} closed bags read, {} open bags skipped{}{}",
            report.messages.len(),
            report.rejected.len(),
            report.problems.len(),
            report.closed_bags_read,
            report.skipped_open.len(),
            if keys_given { "" } else { " (UNVERIFIED: no --key)" },
            if keys_given && !verified {
                " (NOT verified: see the lines above)"
            } else {
                ""
            }
        );
    }
    // Missing bags a summary holds: retention's, readable with summaries.
    let retained = report
        .problems
        .iter()
        .any(|p| p.kind == bag::ProblemKind::Missing && p.item.starts_with(bagel_bags::summary::SUMMARY_DIR));
    if a.no_summaries && retained {
        eprintln!(
            "bagel: bags retention removed were not read (the PROBLEM lines name their summaries): read \
             without --no-summaries to read them from their summaries"
        );
    }
    // A script must not take a read with rejected messages, damaged closed
    // bags or bags gone for a clean one. (A torn tail in an open bag is a
    // write in progress, not damage.)
    let damaged = report.problems.iter().any(|p| !p.in_open_bag);
    Ok(if report.rejected.is_empty() && !damaged {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_NOT_CLEAN)
    })
}

/// `bagel read`'s exit code when a message was rejected or a closed bag
/// has a problem (everything readable was still printed).
const EXIT_NOT_CLEAN: u8 = 4;

/// A read that was asked to close past-due bags but could not vouch for
/// its clock says so on stderr: which bags it left open, and what they
/// wait for.
fn say_close_refused(report: &bag::ReadReport) {
    if let Some(why) = &report.close_refused {
        eprintln!(
            "bagel: closed nothing ({} open bags skipped; they wait for a closer whose clock signed time \
             vouches for): {why}",
            report.skipped_open.len()
        );
    }
}

async fn metronome(a: MetronomeArgs, g: &Globals<'_>) -> anyhow::Result<ExitCode> {
    let cfg = a.timing.config().with_lookback(a.lookback);
    // Closes on a clock signed time vouches for, never the host's alone.
    let checked = crate::closer_clock::closer_clock(g.target, g.roughtime, cfg.clock_tolerance)?;
    // Only for the status page's display of uptime and lag.
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = bag::open_store(&a.store, &cfg).await?;
    let mut m =
        Metronome::new(store, a.log.clone(), cfg.clone(), checked)?.with_max_idle_listing(a.max_idle_listing);
    if let Some(after) = a.summarize_after {
        m = m.with_summaries(after, a.summary_span);
    }
    if let Some(path) = &a.attest_key {
        m = m.with_attester(attester(path, &a.keys, g, "metronome").await?);
    }
    let shutdown = CancellationToken::new();
    if let Some(addr) = &a.http {
        let status = Arc::new(MetronomeStatus::new(
            &a.log,
            &a.store,
            cfg.grace,
            a.lookback,
            Arc::clone(&clock),
        ));
        let bound = crate::metronome_http::serve(addr, Arc::clone(&status), shutdown.clone()).await?;
        println!("http on {bound}");
        let _ = std::io::stdout().flush();
        m = m.with_observer(status);
    }
    // A refusal repeats at every tick until the clock is vouched for:
    // said once, and again when it changes.
    let mut last_refusal: Option<String> = None;
    // A log nobody has written is said once, not at every tick.
    let mut said_missing = std::collections::BTreeSet::new();
    let store_name = a.store.clone();
    let mut print = move |r: &bag::Result<bag::CloseReport>| match r {
        Ok(r) if !r.missing_logs.is_empty() || r.closed > 0 || !r.summarized.is_empty() => {
            for done in &r.summarized {
                println!(
                    "summary {}: {} bags, {} messages, {} bytes{}",
                    done.name,
                    done.bags,
                    done.messages,
                    done.bytes,
                    if done.created { "" } else { " (already published)" }
                );
                match &done.attestation {
                    Some(bagel_bags::summary::attest::Attested::Published { name, created, .. }) => println!(
                        "attestation {name}{}",
                        if *created { "" } else { " (already published)" }
                    ),
                    Some(bagel_bags::summary::attest::Attested::Refused { reason, .. }) => {
                        eprintln!("bagel metronome: summary {} NOT attested: {reason}", done.name)
                    }
                    None => {}
                }
            }
            for log in &r.missing_logs {
                if said_missing.insert(log.clone()) {
                    eprintln!(
                        "bagel metronome: log {log:?} not found on {store_name}: no writer has started it \
                         (a log is created by its first write); closing nothing of it until one does"
                    );
                }
            }
            if r.closed > 0 {
                last_refusal = None;
                let sealed = match r.sealed {
                    0 => String::new(),
                    n => format!("; {n} empty seconds sealed by their minute"),
                };
                println!(
                    "closed {} bags through {}; lag {} ms{sealed}",
                    r.closed,
                    r.through.map_or("-".to_owned(), |b| b.to_string()),
                    r.max_lag.unwrap_or_default().as_millis()
                );
            }
        }
        Err(e @ bag::Error::ClockUnvouched { .. }) => {
            let text = e.to_string();
            if last_refusal.as_ref() != Some(&text) {
                eprintln!("bagel metronome: {text}");
                last_refusal = Some(text);
            }
        }
        Ok(_) => last_refusal = None,
        Err(e) => eprintln!("bagel metronome: {e}"),
    };
    if a.once {
        // Catching up (a long lookback) shows progress on a terminal.
        let bar = Bar::new("metronome: closing", "bags", false);
        let bar_for = bar.clone();
        struct Ticks(Bar);
        impl bag::CloseObserver for Ticks {
            fn closed(&self, _: &str, _: bag::Bucket, _: Duration, _: usize) {
                self.0.inc();
            }
            fn failed(&self, _: &str, _: bag::Bucket, _: &bag::Error) {}
            fn sealed(&self, _: &str, _: bag::Bucket, _: Duration, empty: u64) {
                for _ in 0..empty {
                    self.0.inc();
                }
            }
        }
        if a.http.is_none() {
            m = m.with_observer(Arc::new(Ticks(bar_for)));
        }
        let r = match m.check_clock().await {
            Ok(_) => {
                m.find_logs().await?;
                bar.set(0, m.due());
                m.tick().await
            }
            Err(e) => Err(e),
        };
        bar.finish();
        print(&r);
        r?;
        return Ok(ExitCode::SUCCESS);
    }
    let s = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        s.cancel();
    });
    m.run(shutdown, |r| {
        print(r);
        let _ = std::io::stdout().flush();
    })
    .await;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::parse_minutes;

    #[test]
    fn summary_spans_are_whole_minutes_from_one_minute_to_a_week() {
        assert_eq!(parse_minutes("1m"), Ok(1));
        assert_eq!(parse_minutes("1h"), Ok(60));
        assert_eq!(parse_minutes("7d"), Ok(7 * 24 * 60));
        for bad in ["0s", "30s", "90s", "1m 500ms", "8d", "soon"] {
            let err = parse_minutes(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
        assert_eq!(
            parse_minutes("8d").unwrap_err(),
            "\"8d\" is not a whole number of minutes from 1m to 7d"
        );
    }
}
