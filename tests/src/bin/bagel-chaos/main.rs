//! `bagel-chaos`: a randomized fault run against real processes.
//!
//! Worker processes take leases on random sets of names from a cluster of
//! lease servers and write batches under them to a directory, to S3 (moto)
//! and to NFS (nfs-ganesha) at once, while CLI roles run `bagel run`,
//! `bagel write` and `bagel acquire --hold` and interrupt them (see
//! `cli_roles.rs`). At random times drawn from a printed seed, the driver
//! kill -9s and restarts a lease server (with or without its key file),
//! the S3 server and the metronomes (closers), restarts metronomes on
//! skewed clocks (libfaketime), runs operators' reads and audits on skewed
//! clocks, freezes a worker, a server or a metronome (SIGSTOP, then
//! SIGCONT), and once migrates every client to another server list. Two
//! workers run 300 ms ahead and behind (they must work), one writer 20 s
//! ahead (every write must be refused), and one delays appends past its
//! leases' deadlines. Three more workers take their leases from the S3
//! lease backend (no server) on a log of their own: two 300 ms off, one
//! 4 s ahead whose every acquire must be refused. Beside the faults, two
//! journeys walk what users do: standby loops of `bagel run --wait
//! forever` on shared leader names, killed, frozen and skewed (at most one
//! leader at a time, and a new one within the TTL and a margin: see
//! `leaders.rs`), and clients that write the one cluster's server list
//! differently (no name with two holders, and a list with swapped IDs
//! refused: see `spellings.rs`). The journeys, the CLI roles and the
//! list-then-watch clients follow the migration as an operator rolls it
//! out (see `lists.rs`). At the end two independent readers read
//! every log and must agree, every acknowledged write must be read back,
//! and `bagel audit` must find no violation.
//!
//! ```text
//! bagel-chaos --duration 60s --seed N --out DIR
//! ```
//! writes `DIR/chaos.json` and exits 0 only when all of that holds. It
//! needs the services `tests/run.sh` starts (S3 server command, NFS server,
//! Roughtime server), from the environment it exports.

mod cli_roles;
mod driver;
mod hostile;
mod leaders;
mod lists;
mod outages;
mod partitions;
mod policy;
mod retention;
mod services;
mod spellings;
mod store_partitions;
mod watchers;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "bagel-chaos",
    about = "Randomized fault run: real servers, real stores, kill -9s"
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// One worker process (started by the driver).
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
    /// A leader's command under `bagel run` (started by the standbys).
    #[command(hide = true)]
    Leader(leaders::LeaderArgs),
    /// A writer of the store partitions (started in their namespace).
    #[command(hide = true)]
    StoreWriter(store_partitions::StoreWriterArgs),
    /// Only the hostile readers phase (see hostile.rs), on its own.
    Hostile,
    /// Only the policy phase (see policy.rs), on its own.
    Policy {
        /// The seed of its random choices.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Where its files go.
        #[arg(long, default_value = "chaos-out")]
        out: PathBuf,
    },
    /// Only the network partitions (see partitions.rs and
    /// store_partitions/), on their own; they need root.
    Partitions {
        /// The seed of its random choices.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Where its files go.
        #[arg(long, default_value = "chaos-out")]
        out: PathBuf,
    },
    /// Only the retention phase (see retention.rs), on its own, to rerun
    /// what a run's `retention_journeys` found.
    Retention {
        /// The seed of its random choices.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Where its files go.
        #[arg(long, default_value = "chaos-out")]
        out: PathBuf,
    },
}

/// What the driver runs.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// How long the faults go on (the final checks come after).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub duration: Duration,
    /// Seed of every random choice (printed; random when not given).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Where `chaos.json` and the run's files go.
    #[arg(long, default_value = "chaos-out")]
    pub out: PathBuf,
    /// Worker processes (at least 5: the first five have roles).
    #[arg(long, default_value_t = 5)]
    pub workers: usize,
    /// Names the workers lease.
    #[arg(long, default_value_t = 8)]
    pub names: usize,
    /// Lease servers in the cluster the workers route names over.
    #[arg(long, default_value_t = 3)]
    pub servers: usize,
    /// Workers leasing from the S3 lease backend instead of the servers
    /// (at most 3: 300 ms ahead, 300 ms behind, and one 4 s ahead that must
    /// be refused every lease).
    #[arg(long, default_value_t = 3)]
    pub s3_lease_workers: usize,
    /// The lease servers' max TTL (their restart wait).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    pub max_ttl: Duration,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Some(Cmd::Worker(w)) => worker::run(w).await.map(|()| true),
        Some(Cmd::Leader(l)) => leaders::leader(l).await.map(|()| true),
        Some(Cmd::StoreWriter(w)) => store_partitions::writer(w).await.map(|()| true),
        Some(Cmd::Partitions { seed, out }) => partitions::run_alone(seed, &out).await,
        Some(Cmd::Retention { seed, out }) => retention::run_alone(seed, &out).await,
        Some(Cmd::Policy { seed, out }) => policy::run_alone(seed, &out).await,
        Some(Cmd::Hostile) => hostile::run().await.map(|(report, violations)| {
            println!("{}", serde_json::to_string_pretty(&report).expect("serializable"));
            for v in &violations {
                println!("VIOLATION {v}");
            }
            violations.is_empty()
        }),
        None => driver::run(cli.run).await,
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("bagel-chaos: {e:#}");
            ExitCode::from(2)
        }
    }
}
