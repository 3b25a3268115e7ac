//! `bagel summarize`: turn closed stretches of a log into summaries,
//! attested with `--attest-key`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use bagel_bags as bag;
use bagel_cli::contract::{AttestationJson, SummaryMadeJson};
use bagel_proto::Micros;

use super::Globals;
use super::args::{BagStoreArgs, TimingArgs, parse_minutes, parse_time};

#[derive(clap::Args, Debug)]
pub struct SummarizeArgs {
    #[command(flatten)]
    store: BagStoreArgs,
    /// The log to summarize.
    #[arg(long)]
    log: String,
    /// From the stretch holding this timestamp (relative as `-1h`, Unix
    /// microseconds or RFC 3339); default: the oldest stretch from the
    /// log's start that published summaries do not cover yet.
    #[arg(long, value_parser = parse_time, allow_hyphen_values = true)]
    from: Option<Micros>,
    /// Up to the stretches that start before this (as --from); default:
    /// every stretch already past its close time.
    #[arg(long, value_parser = parse_time, allow_hyphen_values = true)]
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

pub(super) async fn run(a: SummarizeArgs, g: &Globals<'_>) -> anyhow::Result<ExitCode> {
    use bagel_bags::summary::{self, Stretch};
    let cfg = a.timing.config();
    let store = a.store.open(&cfg).await?;
    // It seals past-due minutes, so it is a closer: a vouched clock only.
    let clock = crate::closer_clock::closer_clock(g.target, g.roughtime, cfg.clock_tolerance)?;
    let now = bag::closer_now(clock.as_ref()).await?;
    let Some(start) = store.log_start(&a.log).await? else {
        anyhow::bail!(
            "log {:?} not found on {}: no writer has started it (a log is created by its first write)",
            a.log,
            a.store.url()
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

/// The attester of `--attest-key FILE` (the key created when missing, as
/// the server's `--key`), verifying with the lease servers' keys.
pub(super) async fn attester(
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
