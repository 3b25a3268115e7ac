//! `bagel describe`: who holds names, and what a new holder would inherit.

use std::process::ExitCode;

use bagel_cli::contract::NameStateJson;
use bagel_client::{LeaseBackend as _, NameState};
use clap::Args;

use crate::target::Target;

#[derive(Debug, Args)]
pub struct DescribeArgs {
    /// The names (all or none).
    #[arg(required = true)]
    names: Vec<String>,
    /// Print JSON (a lease file for lease commands); errors then go to stderr as one JSON object.
    #[arg(long)]
    json: bool,
}

impl DescribeArgs {
    /// Refuses names the servers would refuse, before connecting.
    pub fn check(&self) -> anyhow::Result<()> {
        crate::names::check("name", &self.names)
    }
}

pub async fn run(args: DescribeArgs, target: &Target) -> anyhow::Result<ExitCode> {
    let backend = target.backend();
    let states = backend.describe(&args.names).await?;
    if args.json {
        let states: Vec<_> = states.iter().map(NameStateJson::from).collect();
        println!("{}", serde_json::to_string_pretty(&states)?);
    } else {
        for s in &states {
            print_name_state(s);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A name's state as text: its holder (or free), then what it inherits.
fn print_name_state(s: &NameState) {
    match &s.holder {
        Some(h) => println!(
            "{}: held by lease {} (owner {:?}, {}) until {}; fencing {}",
            crate::names::shown(&s.name),
            h.lease_id,
            h.owner,
            h.mode.as_str(),
            h.deadline,
            h.fencing_token
        ),
        None => println!(
            "{}: free{}",
            crate::names::shown(&s.name),
            if s.known { "" } else { " (no record)" }
        ),
    }
    let p = &s.previous;
    println!(
        "  previous: {} lease {:?} watermark {} ended at {}",
        p.ended.as_str(),
        p.lease_id.as_deref().unwrap_or(""),
        p.watermark.as_micros(),
        p.ended_at.as_micros()
    );
}
