//! `bagel run --name NAME [--ttl 10s] -- COMMAND ...`: leader election for
//! the processes users run (seed 004's recipe), on either backend.
//!
//! 1. Acquire the lease (waiting with `--wait`); the command starts only
//!    once it is held.
//! 2. Start COMMAND in its own process group, with `BAGEL_LEASE_ID`,
//!    `BAGEL_FENCING_TOKEN` (of the first name; `BAGEL_FENCING_TOKENS` has
//!    `name=token` for each), `BAGEL_DEADLINE_US` (the first deadline),
//!    `BAGEL_LEASE_NAMES` and `BAGEL_LEASE_FILE`: the lease file for
//!    `bagel write --lease`, rewritten (atomically, off the supervising
//!    loop) after every renewal.
//! 3. Renew every third of the TTL. **Self-fencing**: if the lease is lost,
//!    or no renewal has landed by `deadline - fence margin - kill grace`,
//!    `bagel run` exits 3 with the reason. The lease is not released then:
//!    it ends broken at its deadline, which is what the next holder must
//!    be told (the command was cut off mid-work).
//! 4. SIGTERM, SIGINT and SIGHUP sent to `bagel run` are passed to every
//!    process of the command's tree; SIGKILL follows after the kill grace.
//!    When the command exits, the lease is released, publishing at least
//!    what `bagel write` wrote under it, and `bagel run` exits with the
//!    command's status (128 + signal if it was killed).
//!
//! On every way out (the command exited, fenced, an error here) the whole
//! process tree ([`ProcessTree`]: `bagel run` is a child subreaper, so a
//! background child or a `setsid` grandchild stays below it) gets SIGTERM,
//! then SIGKILL after the grace and no later than `deadline - fence
//! margin`, and is reaped before the lease is released or left to expire.
//!
//! Limits: a `bagel run` killed with SIGKILL cannot fence its command, and
//! no supervisor can recall a request already sent; run it where its tree
//! is killed with it (a systemd unit, a container), and let storage check
//! the fencing token. A long-running `bagel write` reads the lease file
//! once; start one per batch of work, or re-read.

use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use anyhow::Context as _;
use bagel_cli::contract::LeaseJson;
use bagel_client::{AcquireBuilder, Error, Lease, LeaseOptions, Micros, ReleaseOptions};
use clap::Args;
use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::lease_cmds::{EXIT_BUSY, Globals, busy_message, holder_json};
use crate::process_tree::ProcessTree;

/// Exit code when the command was fenced (lease lost or not renewed in
/// time).
pub const EXIT_FENCED: u8 = 3;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// A name to hold while the command runs (repeatable; all or none).
    #[arg(long = "name", required = true)]
    names: Vec<String>,
    /// Lease length; renewed every third of it.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Who holds it (free text for operators; default `host:pid`).
    #[arg(long, env = "BAGEL_OWNER")]
    owner: Option<String>,
    /// Wait up to this long for busy names, or `forever` (the server
    /// waits, re-asked in rounds of its max wait and through its restarts;
    /// on S3, polls with backoff and jitter). Without it a held name exits
    /// 2 at once.
    #[arg(long, value_parser = crate::names::parse_wait)]
    wait: Option<Duration>,
    /// The command must be gone this long before the deadline when the
    /// lease cannot be renewed (room for clock error and for the kill to
    /// land).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    fence_margin: Duration,
    /// Between SIGTERM and SIGKILL when fencing.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    kill_grace: Duration,
    /// Where to keep the lease file the command reads (default
    /// `<state dir>/run/<lease id>.json`, removed at exit). Holds the
    /// lease's token: mode 0600.
    #[arg(long)]
    lease_file: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// How supervising the command ended.
enum Outcome {
    Exited(ExitStatus),
    Fenced { reason: String },
}

pub async fn run(args: RunArgs, g: Globals<'_>) -> anyhow::Result<ExitCode> {
    let fence_at = args.fence_margin + args.kill_grace;
    if fence_at >= args.ttl * 2 / 3 {
        // Flags that cannot work together: a usage error, as a typo is.
        let fmt = humantime::format_duration;
        return Err(crate::failure::usage(format!(
            "--ttl {} is too short for --fence-margin {} + --kill-grace {}: they must be under two thirds \
             of --ttl, so that a renewal is tried before fencing starts (give --ttl over {}, or smaller \
             margins)",
            fmt(args.ttl),
            fmt(args.fence_margin),
            fmt(args.kill_grace),
            fmt(fence_at * 3 / 2)
        )));
    }
    crate::names::check("--name", &args.names)?;
    // Where the lease file goes is checked before anything is acquired:
    // a directory that must be refused costs no lease.
    let run_dir = match &args.lease_file {
        Some(f) => crate::lease_file::directory(f)?.path().to_owned(),
        None => crate::written::state_subdir("run")?.path().to_owned(),
    };
    let target = g.target.connect(g.roughtime).await?;
    let backend = target.backend();
    let mut acquire = AcquireBuilder::new(backend, args.names.clone())
        .ttl(args.ttl)
        .owner(crate::owner::owner_or_default(args.owner.as_deref()))
        // Its key goes into the lease file the command reads.
        .own_holder_key()
        // The lease says "lost" exactly when fencing starts.
        .options(LeaseOptions::default().with_safety_margin(fence_at));
    if let Some(w) = args.wait {
        acquire = acquire.wait(w);
    }
    let lease = match acquire.send().await {
        Ok(l) => l,
        Err(e @ Error::Busy { .. }) if crate::output::json() => {
            return Ok(crate::failure::report_with(
                "held",
                EXIT_BUSY,
                &busy_message(&e),
                holder_json(&e),
            ));
        }
        Err(e @ Error::Busy { .. }) => {
            eprintln!("bagel run: {}", busy_message(&e));
            return Ok(ExitCode::from(EXIT_BUSY));
        }
        Err(e) => return Err(e.into()),
    };
    let location = target.single_location();
    let own_file = args.lease_file.is_none();
    let file = match &args.lease_file {
        Some(f) => f.clone(),
        None => run_dir.join(format!("{}.json", lease.id())),
    };
    crate::lease_file::write(&file, &LeaseJson::from_lease(&lease, location.as_deref()))?;

    let mut tree = ProcessTree::spawn(command(&args, &lease, &file, &g))
        .with_context(|| format!("starting {:?}", args.command[0]))?;
    let outcome = supervise(&lease, &mut tree, &args, &file, location.as_deref()).await;
    // On every way out (the command exited, fenced, a supervisor error),
    // nothing of the command runs on: the whole tree is stopped and
    // reaped before the lease is released or left to expire.
    tree.stop(
        args.kill_grace
            .min(lease.time_left().saturating_sub(args.fence_margin)),
    )
    .await;
    let status = tree.main_status();
    if own_file {
        let _ = std::fs::remove_file(&file);
    }
    match outcome? {
        Outcome::Fenced { reason } => {
            eprintln!(
                "bagel run: fenced: {reason}; the command was stopped ({}) before the deadline {}; the lease \
                 is left to expire (the next holder sees it broken)",
                status.map_or("could not be reaped".to_owned(), describe_status),
                lease.deadline()
            );
            Ok(ExitCode::from(EXIT_FENCED))
        }
        Outcome::Exited(status) => {
            let code = exit_code(status);
            let released = release(lease).await;
            match released {
                Ok(wm) => {
                    let watermark = match wm.as_micros() {
                        0 => "no watermark (nothing written under it)".to_owned(),
                        _ => format!("watermark {wm}"),
                    };
                    eprintln!(
                        "bagel run: command {}; released, {watermark}",
                        describe_status(status)
                    );
                    Ok(ExitCode::from(code))
                }
                Err(e) => {
                    eprintln!(
                        "bagel run: command {}; release failed: {e:#}",
                        describe_status(status)
                    );
                    Ok(ExitCode::from(if code == 0 { 1 } else { code }))
                }
            }
        }
    }
}

/// The command, with the lease in its environment.
fn command(args: &RunArgs, lease: &Lease, file: &Path, g: &Globals<'_>) -> std::process::Command {
    let first = &lease.names()[0];
    let tokens: Vec<String> = lease
        .names()
        .iter()
        .map(|n| format!("{}={}", n.name, n.fencing_token))
        .collect();
    let mut cmd = std::process::Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("BAGEL_LEASE_ID", lease.id())
        .env("BAGEL_FENCING_TOKEN", first.fencing_token.to_string())
        .env("BAGEL_FENCING_TOKENS", tokens.join(","))
        .env("BAGEL_DEADLINE_US", lease.deadline().as_micros().to_string())
        .env(
            "BAGEL_LEASE_NAMES",
            lease
                .names()
                .iter()
                .map(|n| n.name.as_str())
                .collect::<Vec<_>>()
                .join(","),
        )
        .env("BAGEL_LEASE_FILE", file)
        // So that `bagel write` in the command finds the same time and
        // leases as this run, whether they came from flags or the
        // environment.
        .env("BAGEL_SERVER", g.target.server_url())
        // Its own group, so that a terminal's Ctrl-C reaches it only
        // through `bagel run` (which forwards it to the whole tree).
        .process_group(0);
    if let Some(servers) = &g.target.servers {
        cmd.env("BAGEL_SERVERS", servers);
    }
    if let Some(next) = &g.target.next_servers {
        cmd.env("BAGEL_NEXT_SERVERS", next);
    }
    if let Some(store) = &g.target.store.lease_store {
        cmd.env("BAGEL_LEASE_STORE", store);
    }
    if !g.roughtime.roughtime.is_empty() {
        cmd.env("BAGEL_ROUGHTIME", g.roughtime.roughtime.join(","))
            .env("BAGEL_ROUGHTIME_KEYS", g.roughtime.roughtime_key.join(","));
    }
    cmd
}

/// Waits for the command to exit, fencing it if the lease is lost or not
/// renewed in time, passing on signals to the whole tree, and keeping the
/// lease file fresh. Returns with the tree still to be stopped.
///
/// Nothing here waits on blocking I/O: the lease file is rewritten (with
/// its fsync) on a blocking thread, so the fencing timers always fire.
async fn supervise(
    lease: &Lease,
    tree: &mut ProcessTree,
    args: &RunArgs,
    file: &Path,
    location: Option<&str>,
) -> anyhow::Result<Outcome> {
    let mut state = lease.subscribe();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let margin = args.fence_margin + args.kill_grace;
    // A signal was passed on: SIGKILL to the tree once the grace is over.
    let mut kill_at: Option<Instant> = None;
    let mut rewriting: Option<JoinHandle<anyhow::Result<()>>> = None;
    let mut stale = false;
    loop {
        if let Some(status) = tree.main_status() {
            return Ok(Outcome::Exited(status));
        }
        let deadline = lease.deadline();
        let term_at = deadline.saturating_sub(margin);
        // Measured conservatively: the lease handle's time left (monotonic
        // time since the grant's request was sent, never past the wall
        // clock's view), so a clock running behind cannot stretch it.
        let term_in = lease.time_left().saturating_sub(margin);
        let forward = tokio::select! {
            () = tree.changed() => continue,
            reason = lease.lost() => return Ok(Outcome::Fenced { reason: format!("lease lost: {reason}") }),
            () = tokio::time::sleep(term_in) => {
                if lease.deadline() > deadline {
                    continue;
                }
                let reason = format!("no renewal landed by {term_at} (deadline {deadline} minus {margin:?})");
                return Ok(Outcome::Fenced { reason });
            }
            changed = state.changed() => {
                if changed.is_ok() && lease.is_valid() {
                    if rewriting.is_some() {
                        stale = true;
                    } else {
                        rewriting = Some(rewrite(file, lease, location));
                    }
                }
                continue;
            }
            done = async { rewriting.as_mut().expect("guarded").await }, if rewriting.is_some() => {
                rewriting = None;
                done.context("rewriting the lease file")??;
                if std::mem::take(&mut stale) && lease.is_valid() {
                    rewriting = Some(rewrite(file, lease, location));
                }
                continue;
            }
            () = sleep_until_or_never(kill_at), if kill_at.is_some() => {
                tracing::warn!(grace = ?args.kill_grace, "the command outlived the grace after a signal: SIGKILL");
                tree.signal_all(Signal::SIGKILL, &[]);
                kill_at = None;
                continue;
            }
            _ = term.recv() => Signal::SIGTERM,
            _ = int.recv() => Signal::SIGINT,
            _ = hup.recv() => Signal::SIGHUP,
        };
        tree.signal_all(forward, &[]);
        kill_at.get_or_insert_with(|| Instant::now() + args.kill_grace);
    }
}

/// Rewrites the lease file on a blocking thread.
fn rewrite(file: &Path, lease: &Lease, location: Option<&str>) -> JoinHandle<anyhow::Result<()>> {
    let json = LeaseJson::from_lease(lease, location);
    let file = file.to_owned();
    tokio::task::spawn_blocking(move || crate::lease_file::write(&file, &json))
}

async fn sleep_until_or_never(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Releases a lease handle, publishing at least what `bagel write`
/// recorded under the lease on this machine, once no `bagel write` of it
/// runs (waiting for them, and saying so).
async fn release(lease: Lease) -> anyhow::Result<Micros> {
    let lock = crate::written::lock_for_release(lease.id()).await?;
    release_locked(lease, lock).await
}

/// Releases a lease handle whose writers are known to be done (`lock`),
/// publishing at least what they recorded. Also `bagel acquire --hold`'s
/// release.
pub async fn release_locked(lease: Lease, lock: crate::written::ReleaseLock) -> anyhow::Result<Micros> {
    let written = lock.written()?;
    let mut options = ReleaseOptions::default().with_unsettled(written.uncertain);
    if let Some(wm) = written.max_written {
        options = options.with_watermark(wm);
    }
    let wm = lease.release_with(options).await?;
    lock.released();
    Ok(wm)
}

fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
        _ => 1,
    }
}

fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with {c}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => "ended".into(),
    }
}
