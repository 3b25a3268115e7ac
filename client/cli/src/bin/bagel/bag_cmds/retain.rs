//! `bagel retain`: remove old bags a checked summary holds.

use std::process::ExitCode;
use std::time::Duration;

use bagel_bags as bag;
use bagel_cli::contract::RetainJson;

use super::Globals;
use super::args::{BagStoreArgs, TimingArgs};

#[derive(clap::Args, Debug)]
pub struct RetainArgs {
    #[command(flatten)]
    store: BagStoreArgs,
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

pub(super) async fn run(a: RetainArgs, g: &Globals<'_>) -> anyhow::Result<ExitCode> {
    let cfg = a.timing.config();
    let store = a.store.open(&cfg).await?;
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
