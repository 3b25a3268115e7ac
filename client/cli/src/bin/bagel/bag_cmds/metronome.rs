//! `bagel metronome`: close every past bag of the given logs.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bagel_bags::{self as bag, Metronome};
use bagel_cli::contract::MetronomeRoundJson;
use bagel_proto::clock::{Clock, SystemClock};
use tokio_util::sync::CancellationToken;

use crate::metronome_http::MetronomeStatus;
use crate::progress::Bar;

use super::Globals;
use super::args::{BagStoreArgs, TimingArgs, parse_minutes};
use super::summarize::attester;

#[derive(clap::Args, Debug)]
pub struct MetronomeArgs {
    #[command(flatten)]
    store: BagStoreArgs,
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

pub(super) async fn run(a: MetronomeArgs, g: &Globals<'_>) -> anyhow::Result<ExitCode> {
    let json = crate::output::json();
    if json && !a.once {
        // A metronome that runs until stopped has no one answer to print.
        return Err(crate::failure::usage(
            "--json needs --once: a running metronome prints lines for people (its /metrics, with --http, \
             are for programs)",
        ));
    }
    let cfg = a.timing.config().with_lookback(a.lookback);
    // Closes on a clock signed time vouches for, never the host's alone.
    let checked = crate::closer_clock::closer_clock(g.target, g.roughtime, cfg.clock_tolerance)?;
    // Only for the status page's display of uptime and lag.
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = a.store.open(&cfg).await?;
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
            a.store.url(),
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
    let store_name = a.store.url().to_owned();
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
        if json {
            println!("{}", serde_json::to_string(&round_json(&r?))?);
        } else {
            print(&r);
            r?;
        }
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

/// One round as `metronome --once --json` prints it.
fn round_json(r: &bag::CloseReport) -> MetronomeRoundJson {
    MetronomeRoundJson {
        closed: r.closed,
        max_lag_ms: r
            .max_lag
            .map(|l| u64::try_from(l.as_millis()).unwrap_or(u64::MAX)),
        missing_logs: r.missing_logs.clone(),
        sealed: r.sealed,
        summaries: r.summarized.iter().map(|s| s.name.clone()).collect(),
        through: r.through.map(|b| b.to_string()),
    }
}
