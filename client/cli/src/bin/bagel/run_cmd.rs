//! `bagel run --name NAME [--ttl 10s] -- COMMAND ...`: leader election for
//! the processes users run (seed 004's recipe), on either backend.
//!
//! 1. Acquire the lease (waiting with `--wait`); the command starts only
//!    once it is held.
//! 2. Start COMMAND in its own process group, with `BAGEL_LEASE_ID`,
//!    `BAGEL_FENCING_TOKEN` (of the first name; `BAGEL_FENCING_TOKENS` has
//!    `name=token` for each), `BAGEL_DEADLINE_US` (the first deadline),
//!    `BAGEL_LEASE_NAMES` and `BAGEL_LEASE_FILE`: the lease file for
//!    `bagel write --lease`, rewritten (atomically) after every renewal.
//! 3. Renew every third of the TTL. **Self-fencing**: if the lease is lost,
//!    or no renewal has landed by `deadline - fence margin - kill grace`,
//!    the command's group gets SIGTERM, and SIGKILL at `deadline - fence
//!    margin` if still alive, so nothing of it runs once the lease can be
//!    taken over; `bagel run` then exits 3 with the reason. The lease is
//!    not released then: it ends broken at its deadline, which is what the
//!    next holder must be told (the command was cut off mid-work).
//! 4. SIGTERM, SIGINT and SIGHUP sent to `bagel run` are passed to the
//!    command's group. When the command exits, the lease is released,
//!    publishing at least what `bagel write` wrote under it, and `bagel
//!    run` exits with the command's status (128 + signal if it was
//!    killed).
//!
//! Limits: a `bagel run` killed with SIGKILL cannot fence its command;
//! run it where its group is killed with it (a systemd unit, a container)
//! and the next holder still waits out the deadline. A long-running
//! `bagel write` reads the lease file once; start one per batch of work,
//! or re-read.

use std::os::unix::fs::OpenOptionsExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use anyhow::{Context as _, bail};
use bagel_cli::contract::LeaseJson;
use bagel_client::{AcquireBuilder, Error, Lease, LeaseOptions, Micros, ReleaseOptions};
use bagel_proto::clock::Clock;
use clap::Args;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

use crate::lease_cmds::{EXIT_BUSY, Globals, busy_message};

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
    /// Who holds it (free text for operators).
    #[arg(long, default_value = "")]
    owner: String,
    /// Wait up to this long for busy names (the server waits; on S3, polls
    /// with backoff and jitter). Without it a held name exits 2 at once.
    #[arg(long, value_parser = humantime::parse_duration)]
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
    Fenced {
        reason: String,
        status: Option<ExitStatus>,
    },
}

pub async fn run(args: RunArgs, g: Globals<'_>) -> anyhow::Result<ExitCode> {
    let fence_at = args.fence_margin + args.kill_grace;
    if fence_at >= args.ttl * 2 / 3 {
        bail!(
            "--fence-margin + --kill-grace ({fence_at:?}) must be under two thirds of --ttl ({:?}), so that a \
             renewal is tried before fencing starts",
            args.ttl
        );
    }
    crate::names::check("--name", &args.names)?;
    let target = g.target.connect(g.roughtime).await?;
    let backend = target.backend();
    let clock = backend.clock();
    let mut acquire = AcquireBuilder::new(backend, args.names.clone())
        .ttl(args.ttl)
        .owner(args.owner.clone())
        // The lease says "lost" exactly when fencing starts.
        .options(LeaseOptions::default().with_safety_margin(fence_at));
    if let Some(w) = args.wait {
        acquire = acquire.wait(w);
    }
    let lease = match acquire.send().await {
        Ok(l) => l,
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
        None => crate::written::state_dir()
            .join("run")
            .join(format!("{}.json", lease.id())),
    };
    write_lease_file(&file, &LeaseJson::from_lease(&lease, location.as_deref()))?;

    let mut child = spawn(&args, &lease, &file, &g)?;
    let outcome = supervise(
        &lease,
        &mut child,
        &args,
        &file,
        location.as_deref(),
        clock.as_ref(),
    )
    .await;
    if own_file {
        let _ = std::fs::remove_file(&file);
    }
    match outcome? {
        Outcome::Fenced { reason, status } => {
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
                    eprintln!(
                        "bagel run: command {}; released, watermark {wm} ({} us)",
                        describe_status(status),
                        wm.as_micros()
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

fn spawn(args: &RunArgs, lease: &Lease, file: &Path, g: &Globals<'_>) -> anyhow::Result<Child> {
    let first = &lease.names()[0];
    let tokens: Vec<String> = lease
        .names()
        .iter()
        .map(|n| format!("{}={}", n.name, n.fencing_token))
        .collect();
    let mut cmd = Command::new(&args.command[0]);
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
        .env("BAGEL_SERVER", &g.target.server)
        // Its own group, so fencing reaches everything it started.
        .process_group(0)
        .kill_on_drop(true);
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
    cmd.spawn()
        .with_context(|| format!("starting {:?}", args.command[0]))
}

/// Waits for the command to exit, fencing it if the lease is lost or not
/// renewed in time, passing on signals, and keeping the lease file fresh.
async fn supervise(
    lease: &Lease,
    child: &mut Child,
    args: &RunArgs,
    file: &Path,
    location: Option<&str>,
    clock: &dyn Clock,
) -> anyhow::Result<Outcome> {
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw)
        .context("the command has no process id")?;
    let mut state = lease.subscribe();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let margin = args.fence_margin + args.kill_grace;
    loop {
        let deadline = lease.deadline();
        let term_at = deadline.saturating_sub(margin);
        let term_in = term_at.duration_since(clock.now());
        let forward = tokio::select! {
            status = child.wait() => return Ok(Outcome::Exited(status.context("waiting for the command")?)),
            reason = lease.lost() => {
                return Ok(fence(child, group, format!("lease lost: {reason}"), deadline, args, clock).await);
            }
            () = tokio::time::sleep(term_in) => {
                if lease.deadline() > deadline {
                    continue;
                }
                let reason = format!("no renewal landed by {term_at} (deadline {deadline} minus {margin:?})");
                return Ok(fence(child, group, reason, deadline, args, clock).await);
            }
            changed = state.changed() => {
                if changed.is_ok() && lease.is_valid() {
                    write_lease_file(file, &LeaseJson::from_lease(lease, location))?;
                }
                continue;
            }
            _ = term.recv() => Signal::SIGTERM,
            _ = int.recv() => Signal::SIGINT,
            _ = hup.recv() => Signal::SIGHUP,
        };
        let _ = killpg(group, forward);
    }
}

/// SIGTERM to the command's group; SIGKILL after the grace or at the
/// deadline minus the fence margin, whichever comes first; then SIGKILL to
/// whatever is left of the group.
async fn fence(
    child: &mut Child,
    group: Pid,
    reason: String,
    deadline: Micros,
    args: &RunArgs,
    clock: &dyn Clock,
) -> Outcome {
    tracing::warn!(%reason, "fencing the command");
    let kill_at = deadline.saturating_sub(args.fence_margin);
    let _ = killpg(group, Signal::SIGTERM);
    let grace = args.kill_grace.min(kill_at.duration_since(clock.now()));
    let status = match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status.ok(),
        Err(_) => {
            let _ = killpg(group, Signal::SIGKILL);
            child.wait().await.ok()
        }
    };
    let _ = killpg(group, Signal::SIGKILL);
    Outcome::Fenced { reason, status }
}

/// Releases, publishing at least what `bagel write` recorded under the
/// lease on this machine.
async fn release(lease: Lease) -> anyhow::Result<Micros> {
    let id = lease.id().to_owned();
    let written = crate::written::load(&id)?;
    let mut options = ReleaseOptions::default().with_unsettled(written.uncertain);
    if let Some(wm) = written.max_written {
        options = options.with_watermark(wm);
    }
    let wm = lease.release_with(options).await?;
    crate::written::forget(&id);
    Ok(wm)
}

/// Writes the lease file atomically (a reader never sees half of it), mode
/// 0600: it holds the token.
fn write_lease_file(path: &Path, lease: &LeaseJson) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    serde_json::to_writer(&mut f, lease)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
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
