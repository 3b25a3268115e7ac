//! `bagel read`: a time range of a log in timestamp order, every message
//! checked.

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use bagel_bags as bag;
use bagel_bags::reader::Message;
use bagel_cli::contract::{ProblemJson, ReadItemKind, ReadMessageJson, ReadSummaryJson};
use bagel_proto::clock::{CheckedClock, Unvouched};

use crate::progress::Bar;

use super::Globals;
use super::args::{LogRange, TimingArgs};

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

pub(super) async fn run(a: ReadArgs, g: &Globals<'_>) -> anyhow::Result<ExitCode> {
    let cfg = a.timing.config();
    let keys = if a.keys.is_empty() && !g.target.store.has_lease_store() {
        None
    } else {
        Some(g.target.witness_keys(&a.keys).await?)
    };
    let keys_given = keys.is_some();
    let store = a.range.store.open(&cfg).await?;
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
pub(super) fn say_close_refused(report: &bag::ReadReport) {
    if let Some(why) = &report.close_refused {
        eprintln!(
            "bagel: closed nothing ({} open bags skipped; they wait for a closer whose clock signed time \
             vouches for): {why}",
            report.skipped_open.len()
        );
    }
}

/// A read's error, with the flags that change the outcome where some do.
pub(super) fn read_error(e: bag::Error) -> anyhow::Error {
    let hint = matches!(e, bag::Error::SealTooFar { .. })
        .then_some(" (give a later --from, or --max-seal-lookback to allow it)");
    let e = anyhow::Error::new(e);
    match hint {
        Some(h) => anyhow::anyhow!("{e}{h}"),
        None => e,
    }
}
