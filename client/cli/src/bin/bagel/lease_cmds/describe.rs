//! `bagel describe`: who holds names, and what a new holder would inherit.

use std::process::ExitCode;

use bagel_client::{LeaseBackend as _, Micros, NameState, Previous};
use clap::Args;
use serde_json::json;

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
    pub fn check(&self) -> anyhow::Result<()> {
        crate::names::check("name", &self.names)
    }
}

pub async fn run(args: DescribeArgs, target: &Target) -> anyhow::Result<ExitCode> {
    let backend = target.backend();
    let states = backend.describe(&args.names).await?;
    if args.json {
        let v: Vec<_> = states.iter().map(name_state_json).collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for s in &states {
            print_name_state(s);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn previous_json(p: &Previous) -> serde_json::Value {
    json!({
        "lease_id": p.lease_id.clone().unwrap_or_default(),
        "watermark_us": p.watermark.as_micros(),
        "ended": p.ended.as_str(),
        "ended_at_us": p.ended_at.as_micros(),
        "unsettled_until_us": p.unsettled_until.map(Micros::as_micros),
    })
}

/// A holder as `describe --json` and `list --json` print it.
pub(crate) fn holder_json(h: &bagel_client::Holder) -> serde_json::Value {
    json!({
        "lease_id": h.lease_id,
        "owner": h.owner,
        "mode": h.mode.as_str(),
        "deadline_us": h.deadline.as_micros(),
        "fencing_token": h.fencing_token,
        "granted_at_us": h.granted_at.as_micros(),
    })
}

fn name_state_json(s: &NameState) -> serde_json::Value {
    json!({
        "name": s.name,
        "known": s.known,
        "fencing_token": s.fencing_token,
        "holder": s.holder.as_ref().map(holder_json),
        "previous": previous_json(&s.previous),
    })
}

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
