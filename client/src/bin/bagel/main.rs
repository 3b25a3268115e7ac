//! `bagel`: the command-line client. Each group of commands lives in its own
//! module; this file only wires them to clap.

use std::process::ExitCode;

use clap::Parser as _;

mod bag_cmds;

#[derive(clap::Parser, Debug)]
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
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    #[command(flatten)]
    Bag(bag_cmds::BagCommand),
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let _ = &cli.server;
    let result = match cli.command {
        Command::Bag(cmd) => bag_cmds::run(cmd).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("bagel: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
