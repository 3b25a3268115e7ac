//! Time: the global Roughtime flags every command that timestamps shares,
//! and `bagel time-check`, which asks the time authority once and says how
//! far off this host's clock is.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use bagel_cli::contract::{ProofJson, TimeCheckJson};
use bagel_client::{Client, ClientOptions, TimeOptions, TimeSource};
use bagel_proto::signed_time::roughtime::RoughtimeServer;
use clap::Args;

/// `--roughtime HOST:PORT --roughtime-key KEY`, global and repeatable.
#[derive(Debug, Args)]
#[command(next_help_heading = "Signed time")]
pub struct RoughtimeArgs {
    /// A Roughtime server (HOST:PORT) to take signed time from; repeatable,
    /// tried in order, each with a --roughtime-key in the same order.
    /// Without it, signed time comes from the lease server.
    #[arg(
        long = "roughtime",
        global = true,
        value_name = "HOST:PORT",
        env = "BAGEL_ROUGHTIME",
        value_delimiter = ','
    )]
    pub roughtime: Vec<String>,
    /// The long-term public key (hex or base64) of the Roughtime server at
    /// the same position.
    #[arg(
        long = "roughtime-key",
        global = true,
        value_name = "KEY",
        env = "BAGEL_ROUGHTIME_KEYS",
        value_delimiter = ','
    )]
    pub roughtime_key: Vec<String>,
}

impl RoughtimeArgs {
    pub fn servers(&self) -> anyhow::Result<Vec<RoughtimeServer>> {
        RoughtimeServer::pair(&self.roughtime, &self.roughtime_key).map_err(anyhow::Error::msg)
    }

    /// The writer's time source: Roughtime if configured, else the lease
    /// server at `server_url`.
    pub async fn time_source(
        &self,
        server_url: &str,
        client_options: &ClientOptions,
        opts: TimeOptions,
    ) -> anyhow::Result<TimeSource> {
        let servers = self.servers()?;
        let client = if servers.is_empty() {
            Some(Client::connect_with(server_url.to_owned(), client_options).await?)
        } else {
            None
        };
        Ok(TimeSource::from_config(servers, client, opts)?)
    }
}

#[derive(Debug, Args)]
pub struct TimeCheckArgs {
    /// How far this host's clock may be off beyond the authority's radius
    /// and half the round trip.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    clock_tolerance: Duration,
}

/// Exit 0 when the clock is within tolerance; 1 (with the reason) when it
/// is off or no signed time could be had.
pub async fn time_check(
    args: TimeCheckArgs,
    rt: &RoughtimeArgs,
    server_url: &str,
    client_options: &ClientOptions,
) -> anyhow::Result<ExitCode> {
    let opts = TimeOptions::default().with_tolerance(args.clock_tolerance);
    let time = rt.time_source(server_url, client_options, opts).await?;
    let signed = time.check().await?;
    let m = time.latest().context("checked, so measured")?;
    let v = time.verdict();
    if crate::output::json() {
        let out = TimeCheckJson {
            detail: v.to_string(),
            error_bound_us: v.error_bound().map(bagel_proto::duration_micros),
            healthy: v.is_healthy(),
            offset_us: v.offset_us(),
            proof: signed.signed.proof.as_ref().map(ProofJson::of),
            radius_us: m.reading.radius_us,
            resolution_us: bagel_proto::duration_micros(m.resolution),
            rtt_us: bagel_proto::duration_micros(m.rtt),
            signed_time_us: m.reading.time.as_micros(),
            source: m.source.clone(),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("{v}");
    }
    Ok(ExitCode::SUCCESS)
}
