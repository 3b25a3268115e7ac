//! `bagel`: the command-line client. Each group of commands lives in its own
//! module (`lease_cmds`, `bag_cmds`, `run_cmd`); where leases live (a
//! server, several, or S3 with `--lease-store`) is decided once, in `target`; this
//! file only wires them to clap.
//!
//! Exit codes: 0 success; 1 error; 2 a name is held by someone else
//! (the message says who and until when); 3 `bagel run` fenced its child
//! (the lease could not be renewed in time: the child got SIGTERM, then
//! SIGKILL, before the deadline; the message says why); 75 (`EX_TEMPFAIL`)
//! a `bagel write` batch failed in a way that trying again may fix (the
//! store timed out, no signed time, the clock behind the lease's start).
//! `bagel run` otherwise exits with its child's status (128 + signal
//! number when the child was killed by a signal); 4 `bagel read` rejected a
//! message or found a closed bag damaged (what it could read was printed);
//! 64 (`EX_USAGE`) a command line clap refuses, or one that parses but
//! cannot work (see `failure`); 77 (`EX_NOPERM`) a server's access policy
//! refused the caller.

mod acl_cmd;
mod bag_cmds;
mod closer_clock;
mod failure;
mod globals;
mod human;
mod keys;
mod lease_cmds;
mod lease_file;
mod metronome_http;
mod names;
mod output;
use bagel_cli::owner;
mod process_tree;
mod progress;
mod run_cmd;
mod store;
mod target;
mod time_cmds;
mod watch_cmds;
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
    #[command(flatten)]
    target: target::TargetArgs,
    #[command(flatten)]
    roughtime: time_cmds::RoughtimeArgs,
    /// Print for people (text) or for scripts (json); errors then go to
    /// stderr as one JSON object.
    #[arg(long, short = 'o', global = true, help_heading = "Output", env = "BAGEL_OUTPUT", value_enum, default_value_t = output::Output::Text)]
    output: output::Output,
    /// The same as `--output json`.
    #[arg(long, global = true, help_heading = "Output")]
    json: bool,
    /// Log lines on stderr as text or as one JSON object per line.
    #[arg(long, global = true, help_heading = "Output", env = "BAGEL_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Lease(lease_cmds::LeaseCommand),
    #[command(flatten)]
    Follow(watch_cmds::FollowCommand),
    #[command(flatten)]
    Bag(bag_cmds::BagCommand),
    /// Hold a lease while a command runs: start it once the lease is held,
    /// renew in the background, fence it (SIGTERM, then SIGKILL, before the
    /// deadline) if renewal fails, release when it exits.
    ///
    /// Example: `bagel run --name leader --wait forever -- ./serve.sh`
    Run(run_cmd::RunArgs),
    /// Ask the time authority (Roughtime, else the lease server) once and
    /// say how far off this host's clock is; exit 1 if it is off.
    ///
    /// Example: `bagel time-check --roughtime 127.0.0.1:2002 --roughtime-key KEY`
    #[command(alias = "roughtime-check")]
    TimeCheck(time_cmds::TimeCheckArgs),
    /// A lease server's access policy (bagel-server --acl), offline: what
    /// an identity may do to a name, and the hash a bearer token is
    /// stored as.
    ///
    /// Example: `bagel acl check --acl acl.toml --identity 'CN=worker-1,O=team-b' --name team-b/jobs/7`
    Acl(acl_cmd::AclArgs),
    /// Print a shell completion script (bash, zsh, fish).
    ///
    /// Example: `bagel completions bash > /etc/bash_completion.d/bagel`
    Completions(CompletionsArgs),
    /// Write man pages (bagel.1 and one per subcommand, bagel-acquire.1,
    /// bagel-acl-check.1 and so on) into a directory, from the same
    /// definitions as --help.
    ///
    /// Example: `bagel man /usr/local/share/man/man1 && man bagel-acquire`
    Man(ManArgs),
}

#[derive(Debug, clap::Args)]
struct ManArgs {
    /// The directory to write the pages into (created if missing).
    dir: std::path::PathBuf,
}

#[derive(Debug, clap::Args)]
struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: Shell,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Logs on stderr (`RUST_LOG` filters, default `warn`): text, coloured only
/// on a terminal, or one JSON object per line with the event's fields at
/// the top level (as `bagel-server --log-format json`).
fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => logs.json().flatten_event(true).with_current_span(false).init(),
    }
}

/// A closed stdout (`bagel completions bash | head`, `bagel read … | head`)
/// ends the process quietly with status 141 (128 + SIGPIPE), as a shell
/// reports `cat` ended by it. The Rust runtime ignores SIGPIPE, so a print
/// to a closed pipe panics ("failed printing to stdout: Broken pipe"); the
/// workspace forbids the `unsafe` that restoring the signal would take, so
/// the panic hook recognises that one panic instead. A `bagel write` cut
/// off this way is a writer killed mid-run, which its lease record covers.
/// The status of a run whose stdout was closed: 128 + SIGPIPE.
const CLOSED_PIPE: u8 = 141;

fn stop_quietly_on_closed_pipes() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if text.starts_with("failed printing to stdout") && text.contains("Broken pipe") {
            std::process::exit(CLOSED_PIPE.into());
        }
        default(info)
    }));
}

/// How long the exit waits for storage calls still running on blocking
/// threads: a call the command gave up on (a hung NFS mount, a FIFO) must
/// not keep the process alive; its outcome was already reported unknown.
const EXIT_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

fn main() -> ExitCode {
    stop_quietly_on_closed_pipes();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bagel: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = rt.block_on(run());
    rt.shutdown_timeout(EXIT_GRACE);
    code
}

async fn run() -> ExitCode {
    let parsed = <Cli as clap::CommandFactory>::command()
        .try_get_matches()
        .and_then(|m| <Cli as clap::FromArgMatches>::from_arg_matches(&m).map(|cli| (cli, m)));
    let cli = match parsed {
        Ok((mut cli, matches)) => {
            cli.target.server_given = target::server_given(&matches);
            cli
        }
        Err(e) => return failure::clap_failure(&e),
    };
    output::init(cli.output, cli.json);
    init_logging(cli.log_format);
    if let Command::Completions(args) = &cli.command {
        if output::json() {
            // A completion script is shell text: there is no JSON of it.
            return failure::report(
                "usage",
                failure::EXIT_USAGE,
                "completions prints a shell script; --json does not apply to it",
            );
        }
        let shell = match args.shell {
            Shell::Bash => clap_complete::Shell::Bash,
            Shell::Zsh => clap_complete::Shell::Zsh,
            Shell::Fish => clap_complete::Shell::Fish,
        };
        let mut command = <Cli as clap::CommandFactory>::command();
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut command, "bagel", &mut script);
        return match std::io::Write::write_all(&mut std::io::stdout().lock(), &script) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::from(CLOSED_PIPE),
            Err(e) => failure::report("error", 1, &format!("cannot write the completion script: {e}")),
        };
    }
    if let Command::Man(args) = &cli.command {
        let command = <Cli as clap::CommandFactory>::command();
        return match write_man_pages(command, &args.dir) {
            Ok(written) if output::json() => {
                println!(
                    "{}",
                    serde_json::json!({ "dir": args.dir.display().to_string(), "pages": written })
                );
                ExitCode::SUCCESS
            }
            Ok(written) => {
                eprintln!("wrote {written} man pages into {}", args.dir.display());
                ExitCode::SUCCESS
            }
            Err(e) => failure::report("error", 1, &chain_text(&e)),
        };
    }
    let g = globals::Globals {
        target: &cli.target,
        roughtime: &cli.roughtime,
    };
    let result = match cli.command {
        Command::Lease(cmd) => lease_cmds::run(cmd, g).await,
        Command::Follow(cmd) => watch_cmds::run(cmd, g).await,
        Command::Run(args) => run_cmd::run(args, g).await,
        Command::Bag(cmd) => bag_cmds::run(cmd, g).await,
        Command::Completions(_) | Command::Man(_) => unreachable!("answered above"),
        Command::Acl(args) => acl_cmd::run(args),
        Command::TimeCheck(args) => match (cli.target.time_server(), cli.target.client_options()) {
            (Ok(server), Ok(options)) => time_cmds::time_check(args, &cli.roughtime, &server, &options).await,
            (Err(e), _) | (_, Err(e)) => Err(e),
        },
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let (kind, code) = failure::classify(&e);
            failure::report(kind, code, &chain_text(&e))
        }
    }
}

/// `bagel.1`, and `bagel-<sub>.1` for each subcommand, into `dir`; how
/// many were written.
fn write_man_pages(command: clap::Command, dir: &std::path::Path) -> anyhow::Result<usize> {
    use anyhow::Context as _;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut command = command;
    command.build();
    let mut written = 0;
    let mut pages = vec![("bagel".to_owned(), command.clone())];
    add_subcommand_pages(&command, "bagel", &mut pages);
    for (name, page) in pages {
        let mut roff = Vec::new();
        clap_mangen::Man::new(page)
            .render(&mut roff)
            .with_context(|| format!("rendering {name}.1"))?;
        let path = dir.join(format!("{name}.1"));
        std::fs::write(&path, roff).with_context(|| format!("cannot write {}", path.display()))?;
        written += 1;
    }
    Ok(written)
}

/// A page for each subcommand of `command`, at every depth, named by its
/// path (`bagel-acl-check`, as git names `git-remote-add`'s).
fn add_subcommand_pages(command: &clap::Command, prefix: &str, pages: &mut Vec<(String, clap::Command)>) {
    for sub in command.get_subcommands().filter(|s| s.get_name() != "help") {
        let name = format!("{prefix}-{}", sub.get_name());
        pages.push((name.clone(), sub.clone().display_name(name.clone())));
        add_subcommand_pages(sub, &name, pages);
    }
}

/// An error and its causes, `: `-separated like anyhow's `{:#}`, but each
/// step said once: a step whose text is the previous one's (a wrapper
/// that displays its source, e.g. "tcp connect error: tcp connect error")
/// or its tail (an error that prints its cause and also reports it as its
/// source) is left out. A timeout says which flag raises it.
fn chain_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for step in e.chain() {
        let text = step.to_string();
        if text.is_empty() || out == text || out.ends_with(&format!(": {text}")) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    if e.chain()
        .any(|s| matches!(s.downcast_ref(), Some(bagel_client::Error::Timeout { .. })))
    {
        out.push_str(" (--timeout / BAGEL_TIMEOUT)");
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn chains_say_each_step_once() {
        #[derive(Debug)]
        struct Wrap(std::io::Error);
        impl std::fmt::Display for Wrap {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }
        impl std::error::Error for Wrap {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let io = std::io::Error::other("tcp connect error");
        let e = anyhow::Error::new(Wrap(io)).context("cannot connect to x: tcp connect error");
        assert_eq!(super::chain_text(&e), "cannot connect to x: tcp connect error");
        let e = anyhow::anyhow!("root").context("middle").context("top");
        assert_eq!(super::chain_text(&e), "top: middle: root");
    }
}
