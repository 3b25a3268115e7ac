//! `bagel release`: a lease ended, publishing its watermark (at least the
//! highest timestamp `bagel write` wrote under it on this machine).

use std::process::ExitCode;

use anyhow::bail;
use bagel_cli::contract::ReleasedJson;
use bagel_client::{LeaseBackend as _, Micros, ReleaseOptions};
use clap::Args;

use super::lease_arg::TokenArgs;
use crate::target::Target;

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

impl ReleaseArgs {
    /// Refuses what the backend would refuse, before connecting.
    pub fn check(&self) -> anyhow::Result<()> {
        self.lease.check()
    }
}

pub async fn run(args: ReleaseArgs, target: &Target) -> anyhow::Result<ExitCode> {
    let backend = target.backend();
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
    if let Some(m) = args.metadata.as_deref().map(super::metadata::parse) {
        options = options.with_metadata(m);
    }
    options.inherited = args.lease.inherited()?;
    let stored = backend.release_lease(&lease, options).await?;
    lock.released();
    if crate::output::json() {
        let released = ReleasedJson {
            watermark_us: stored.as_micros(),
        };
        println!("{}", serde_json::to_string(&released)?);
    } else {
        match stored.as_micros() {
            0 => println!("released; stored watermark 0 (nothing written under it)"),
            _ => println!("released; stored watermark {stored}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}
