//! `bagel-chaos leader`: the command each leader runs under `bagel run`,
//! writing `START`, `STEP` and `END` lines with its fencing token to its
//! name's pipe.
//!
//! Separate from the driver's side: this runs in its own process, one per
//! leader, and shares nothing with the driver but the pipe.

use std::io::Write as _;
use std::time::Duration;

use anyhow::Context as _;

use super::STEP;

/// `bagel-chaos leader`: the command each leader runs (see the module
/// docs).
#[derive(Debug, clap::Args)]
pub struct LeaderArgs {
    /// Which `bagel run` this is (the driver's number for it).
    #[arg(long)]
    unit: u64,
    /// How long to work before exiting.
    #[arg(long)]
    work_ms: u64,
}

/// The leader's command: its lines on standard output (the name's pipe).
pub async fn leader(a: LeaderArgs) -> anyhow::Result<()> {
    let token: u64 = std::env::var("BAGEL_FENCING_TOKEN")
        .context("BAGEL_FENCING_TOKEN is not set: run under `bagel run`")?
        .parse()
        .context("BAGEL_FENCING_TOKEN")?;
    // Before START: a SIGTERM from then on ends the work with an END line.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let line = |kind: &str| -> std::io::Result<()> {
        // One write(2) per line (short lines, flushed at once): atomic in
        // the pipe, never interleaved with another leader's.
        let line = format!("{kind} {} {token} {}\n", a.unit, std::process::id());
        let mut out = std::io::stdout().lock();
        out.write_all(line.as_bytes())?;
        out.flush()
    };
    line("START")?;
    let until = tokio::time::Instant::now() + Duration::from_millis(a.work_ms);
    loop {
        let next = (tokio::time::Instant::now() + STEP).min(until);
        tokio::select! {
            _ = term.recv() => break,
            () = tokio::time::sleep_until(next) => {}
        }
        if tokio::time::Instant::now() >= until {
            break;
        }
        line("STEP")?;
    }
    line("END")?;
    Ok(())
}
