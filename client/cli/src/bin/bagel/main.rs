//! `bagel`: the command-line client. Each group of commands lives in its own
//! module (`lease_cmds`, `bag_cmds`, `run_cmd`); where leases live (a
//! server, or S3 with `--lease-store`) is decided once, in `store`; this
//! file only wires them to clap.
//!
//! Exit codes: 0 success; 1 error; 2 a name is held by someone else
//! (the message says who and until when); 3 `bagel run` fenced its child
//! (the lease could not be renewed in time: the child got SIGTERM, then
//! SIGKILL, before the deadline; the message says why); 75 (`EX_TEMPFAIL`)
//! a `bagel write` batch failed in a way that trying again may fix (the
//! store timed out, no signed time, the clock behind the lease's start).
//! `bagel run` otherwise exits with its child's status (128 + signal
//! number when the child was killed by a signal).

mod bag_cmds;
mod keys;
mod lease_cmds;
mod run_cmd;
mod store;
mod time_cmds;
mod written;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "bagel",
    version,
    about = "Leases with absolute deadlines, and closable bags of messages"
)]
struct Cli {
    /// The lease server.
    #[arg(
        long,
        global = true,
        env = "BAGEL_SERVER",
        default_value = "http://127.0.0.1:7420"
    )]
    server: String,
    #[command(flatten)]
    store: store::StoreArgs,
    #[command(flatten)]
    roughtime: time_cmds::RoughtimeArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Lease(lease_cmds::LeaseCommand),
    #[command(flatten)]
    Bag(bag_cmds::BagCommand),
    /// Hold a lease while a command runs: start it once the lease is held,
    /// renew in the background, fence it (SIGTERM, then SIGKILL, before the
    /// deadline) if renewal fails, release when it exits.
    Run(run_cmd::RunArgs),
    /// Ask the time authority (Roughtime, else the lease server) once and
    /// say how far off this host's clock is; exit 1 if it is off.
    #[command(alias = "roughtime-check")]
    TimeCheck(time_cmds::TimeCheckArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let Cli {
        server,
        store,
        roughtime,
        command,
    } = Cli::parse();
    let g = lease_cmds::Globals {
        server: &server,
        store: &store,
        roughtime: &roughtime,
    };
    let result = match command {
        Command::Lease(cmd) => lease_cmds::run(cmd, g).await,
        Command::Run(args) => run_cmd::run(args, g).await,
        Command::Bag(cmd) => {
            let g = bag_cmds::Globals {
                server: &server,
                roughtime: &roughtime,
                store: &store,
            };
            bag_cmds::run(cmd, g).await
        }
        Command::TimeCheck(args) => time_cmds::time_check(args, &roughtime, &server).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("bagel: {e:#}");
            ExitCode::from(1)
        }
    }
}
