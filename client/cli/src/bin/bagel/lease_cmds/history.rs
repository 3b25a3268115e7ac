//! `bagel history`: a name's recent renewals and releases, with their
//! metadata.

use std::process::ExitCode;

use bagel_client::{HistoryEvent, LeaseBackend as _};
use clap::Args;
use serde_json::json;

use super::metadata::metadata_text;
use crate::target::Target;

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// The name.
    name: String,
    /// Print JSON (a lease file for lease commands); errors then go to stderr as one JSON object.
    #[arg(long)]
    json: bool,
}

impl HistoryArgs {
    pub fn check(&self) -> anyhow::Result<()> {
        crate::names::check("name", [&self.name])
    }
}

pub async fn run(args: HistoryArgs, target: &Target) -> anyhow::Result<ExitCode> {
    let backend = target.backend();
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
