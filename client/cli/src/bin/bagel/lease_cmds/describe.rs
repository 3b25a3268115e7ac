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
    if crate::output::json() {
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
            crate::human::at(h.deadline),
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
        "  previous: {}",
        crate::human::previous(p.ended.as_str(), p.lease_id.as_deref(), p.watermark, p.ended_at)
    );
}
