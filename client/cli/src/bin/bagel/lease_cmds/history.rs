//! `bagel history`: a name's recent renewals and releases, with their
//! metadata.

use std::process::ExitCode;

use bagel_cli::contract::{HistoryEventJson, HistoryJson, metadata_text};
use bagel_client::{History, LeaseBackend as _};
use clap::Args;

use crate::target::Target;

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// The name.
    name: String,
}

impl HistoryArgs {
    /// Refuses a name the servers would refuse, before connecting.
    pub fn check(&self) -> anyhow::Result<()> {
        crate::names::check("name", [&self.name])
    }
}

pub async fn run(args: HistoryArgs, target: &Target) -> anyhow::Result<ExitCode> {
    let h = target.backend().history(&args.name).await?;
    if crate::output::json() {
        println!("{}", serde_json::to_string_pretty(&HistoryJson::from(&h))?);
    } else {
        print_history(&h);
    }
    Ok(ExitCode::SUCCESS)
}

/// A name's history as text, one line per entry, oldest first.
fn print_history(h: &History) {
    if h.truncated {
        println!("(older entries dropped)");
    }
    for e in &h.entries {
        println!(
            "{} {} lease {} owner {:?} watermark {} metadata {}",
            crate::human::at(e.at),
            HistoryEventJson::from(e.event).as_str(),
            e.lease_id,
            e.owner,
            match e.watermark.as_micros() {
                0 => "none".to_owned(),
                _ => e.watermark.to_string(),
            },
            e.metadata
                .as_ref()
                .map_or("-".into(), |m| crate::names::shown(&metadata_text(m)))
        );
    }
}
