//! Retention as operators run it, under faults: writers keep writing while
//! a maintenance loop summarizes and retains the minutes they just left,
//! some writers frozen (SIGSTOP) across a retention of the minute they were
//! writing, some retention runs killed half way. Then the log is summarized
//! again with another span (overlapping summaries), retained, and read with
//! and without summaries.
//!
//! The property: every acknowledged message is read back by a reader with
//! summaries; a reader without summaries reads it too or fails (exit 4)
//! naming the summary that holds it, never exit 0 with it missing; the
//! audit is clean; retention never keeps a bag for a summary that does not
//! check (no `KEPT` line in a run without attacks).
//!
//! Time: the whole phase runs half an hour back (its lease server, `bagel
//! run … bagel write` and the maintenance commands under libfaketime, the
//! latter closing on that clock with `--unsafe-local-clock` since no
//! Roughtime server vouches for it), with an offset picked so that the
//! clock starts 40 s into a minute: one phase of 80 s crosses a minute
//! boundary and retains both minutes while the writers go on into the
//! next. Retention keeps bags 1 s (`--unsafe-min-keep`) instead of ten
//! minutes. Every clock is the same one: a closer whose clock is ahead of
//! the writers' loses acknowledged writes by design (the writers trust
//! closers to within the clock tolerance), which is not what this checks.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use bagel_tests::{ServerOptions, ServerProcess};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::Command;

/// How far back the writers' world runs.
const WRITERS_BACK_S: i64 = 1800;
/// How long the writers write: from 40 s into a minute, through the next
/// minute and a little into the one after.
const WRITING: Duration = Duration::from_secs(85);
const WRITERS: usize = 3;
const LOG: &str = "retained";

/// What the phase did, for `chaos.json` (`retention_journeys`).
#[derive(Debug, Default, Serialize)]
pub struct RetentionReport {
    pub ran: bool,
    /// Messages sent, acknowledged, and refused (late: their minute was
    /// closed, or the writer's batch failed).
    pub sent: u64,
    pub acked: u64,
    pub refused: u64,
    /// Why, by the error's words (digits left out), with counts.
    pub refusals: BTreeMap<String, u64>,
    /// Writers frozen (SIGSTOP) and for how long at most, ms.
    pub pauses: u32,
    pub longest_pause_ms: u64,
    /// Maintenance rounds, and retention runs killed half way.
    pub rounds: u32,
    pub retain_kills: u32,
    /// Summaries in the log at the end, and bags retention removed.
    pub summaries: usize,
    pub bags_removed: u64,
    /// The final reads: with summaries (messages), without (exit code,
    /// messages, problems naming a summary).
    pub read_with: u64,
    pub read_without_exit: Option<i32>,
    pub read_without: u64,
    pub read_without_problems: usize,
    pub audit_exit: Option<i32>,
}

/// One writer's messages: sent and not yet answered, in order; and what
/// each answer said.
#[derive(Default)]
struct Ledger {
    pending: VecDeque<String>,
    acked: BTreeMap<String, u64>,
    refused: u64,
    reasons: BTreeMap<String, u64>,
}

/// Runs the phase: `Err` for a setup failure; property violations go in
/// the returned list.
pub async fn run(bagel: &Path, dir: &Path, seed: u64) -> anyhow::Result<(RetentionReport, Vec<String>)> {
    STOP.store(false, std::sync::atomic::Ordering::SeqCst);
    let mut report = RetentionReport::default();
    let mut violations = Vec::new();
    let mut rng = StdRng::seed_from_u64(seed ^ 0x7265_7461_696e);
    let store_dir = dir.join("retention-store");
    std::fs::create_dir_all(&store_dir)?;
    let store = format!("file://{}", store_dir.display());

    // The writers' clock: half an hour back, 40 s into a minute.
    let now_s = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() as i64;
    let back = WRITERS_BACK_S + (now_s - WRITERS_BACK_S - 40).rem_euclid(60);
    let writers_offset = format!("-{back}s");
    let ahead = |s: i64| format!("-{}s", back - s);
    let server = ServerProcess::start_with(
        &["--max-ttl", "10s", "--unsafe-skip-restart-wait"],
        ServerOptions {
            env: bagel_tests::skewed_env(&writers_offset).into(),
            ..ServerOptions::default()
        },
    )
    .await;
    let key = server.public_key_hex.clone();

    // Writers, each a `bagel run` holding its own name with `bagel write`
    // under it, reading messages from our pipe.
    let ledgers: Vec<Arc<Mutex<Ledger>>> = (0..WRITERS).map(|_| Arc::default()).collect();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (w, ledger) in ledgers.iter().enumerate() {
        let (bagel, store, url, offset, ledger) = (
            bagel.to_path_buf(),
            store.clone(),
            server.url.clone(),
            writers_offset.clone(),
            Arc::clone(ledger),
        );
        let state = dir.join(format!("retention-writer-{w}"));
        let mut rng = StdRng::seed_from_u64(seed.wrapping_add(w as u64));
        tasks.push(tokio::spawn(async move {
            writer(&bagel, &store, &url, &offset, &state, w, ledger, &mut rng).await
        }));
    }

    // The log exists once a first message is acknowledged.
    let first = tokio::time::timeout(Duration::from_secs(30), FIRST_ACK.notified()).await;
    if first.is_err() {
        STOP.store(true, std::sync::atomic::Ordering::SeqCst);
        anyhow::bail!("no writer got a message acknowledged within 30 s");
    }
    // Maintenance while they write; a writer frozen now and then across it.
    let maintenance_clock = writers_offset.clone();
    while started.elapsed() < WRITING {
        report.rounds += 1;
        let mut summarize = cli(
            bagel,
            &maintenance_clock,
            &store,
            "summarize",
            &["--span", "1m", "--key", &key],
        );
        let pause = rng.gen_bool(0.4).then(|| rng.gen_range(0..WRITERS));
        let frozen = match pause {
            Some(w) => freeze_writer(dir, w).await,
            None => None,
        };
        let out = summarize.output().await?;
        check_exit("summarize", &out, &[0], &mut violations);
        let mut retain = cli(
            bagel,
            &maintenance_clock,
            &store,
            "retain",
            &["--keep-bags", "1s", "--unsafe-min-keep", "1s"],
        );
        if rng.gen_bool(0.25) {
            // Killed half way: the next round finishes what it left.
            let mut child = retain.stdout(Stdio::null()).stderr(Stdio::null()).spawn()?;
            tokio::time::sleep(Duration::from_millis(rng.gen_range(5..120))).await;
            let _ = child.start_kill();
            let _ = child.wait().await;
            report.retain_kills += 1;
        } else {
            let out = retain.output().await?;
            check_exit("retain", &out, &[0], &mut violations);
            report.bags_removed += removed(&out);
        }
        if let Some((pid, at)) = frozen {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(100..1500))).await;
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
            report.pauses += 1;
            report.longest_pause_ms = report.longest_pause_ms.max(at.elapsed().as_millis() as u64);
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1200))).await;
    }
    // Writers end (their input closes); every answer is in.
    STOP.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in tasks {
        if let Err(e) = t.await? {
            violations.push(format!("retention: writer: {e:#}"));
        }
    }

    // After: ten minutes on, every minute is over. Summaries of 1 and 2
    // minutes (overlapping), retention, then the reads and the audit.
    let later = ahead(600);
    let start = now_s - back;
    let first_minute = start - start.rem_euclid(60);
    let from = first_minute - first_minute.rem_euclid(120);
    let from_us = (from * 1_000_000).to_string();
    let to_us = ((start + 240) * 1_000_000).to_string();
    for args in [
        &["--span", "1m", "--key", key.as_str()][..],
        &["--span", "2m", "--from", from_us.as_str(), "--key", key.as_str()][..],
    ] {
        let out = cli(bagel, &later, &store, "summarize", args).output().await?;
        check_exit("summarize (after)", &out, &[0], &mut violations);
    }
    let out = cli(
        bagel,
        &later,
        &store,
        "retain",
        &["--keep-bags", "1s", "--unsafe-min-keep", "1s"],
    )
    .output()
    .await?;
    check_exit("retain (after)", &out, &[0], &mut violations);
    report.bags_removed += removed(&out);

    let acked: BTreeSet<String> = ledgers
        .iter()
        .flat_map(|l| {
            l.lock()
                .expect("ledger")
                .acked
                .keys()
                .cloned()
                .collect::<Vec<_>>()
        })
        .collect();
    for l in &ledgers {
        let l = l.lock().expect("ledger");
        report.acked += l.acked.len() as u64;
        report.refused += l.refused;
        for (why, n) in &l.reasons {
            *report.refusals.entry(why.clone()).or_default() += n;
        }
        report.sent += (l.acked.len() + l.pending.len()) as u64 + l.refused;
    }
    let range = [
        "--from",
        from_us.as_str(),
        "--to",
        to_us.as_str(),
        "--key",
        key.as_str(),
        "--json",
    ];
    let with = read(bagel, &later, &store, &range, &[]).await?;
    report.read_with = with.payloads.len() as u64;
    if with.code != Some(0) || !with.problems.is_empty() {
        violations.push(format!(
            "retention: a read with summaries exited {:?} with {} problems: {}",
            with.code,
            with.problems.len(),
            with.problems.join("; ")
        ));
    }
    let lost: Vec<&String> = acked.difference(&with.payloads).collect();
    if !lost.is_empty() {
        let stamps: BTreeMap<&String, u64> = ledgers
            .iter()
            .flat_map(|l| l.lock().expect("ledger").acked.clone())
            .filter(|(p, _)| lost.contains(&p))
            .map(|(p, t)| (lost[lost.binary_search(&&p).expect("lost")], t))
            .collect();
        violations.push(format!(
            "retention: {} acknowledged messages not read with summaries, e.g. {:?}",
            lost.len(),
            stamps.iter().take(8).collect::<Vec<_>>()
        ));
    }
    let without = read(bagel, &later, &store, &range, &["--no-summaries"]).await?;
    report.read_without_exit = without.code;
    report.read_without = without.payloads.len() as u64;
    report.read_without_problems = without.problems.len();
    let missing = acked.difference(&without.payloads).count();
    match without.code {
        Some(0) if missing > 0 => violations.push(format!(
            "retention: a read without summaries exited 0 missing {missing} acknowledged messages (a silent gap)"
        )),
        Some(0) => {}
        Some(4) if !without.problems.iter().all(|p| p.contains("_summary/")) => violations.push(format!(
            "retention: a read without summaries failed with problems that name no summary: {}",
            without.problems.join("; ")
        )),
        Some(4) => {}
        other => violations.push(format!("retention: a read without summaries exited {other:?}")),
    }
    let audit = cli(bagel, &later, &store, "audit", &range[..range.len() - 1])
        .output()
        .await?;
    report.audit_exit = audit.status.code();
    check_exit("audit", &audit, &[0], &mut violations);
    report.summaries = std::fs::read_dir(store_dir.join(LOG).join("_summary"))
        .map(|d| d.filter_map(Result::ok).count())
        .unwrap_or(0);
    report.ran = true;
    println!(
        "retention: {} sent, {} acked, {} refused; {} rounds, {} retain runs killed, {} pauses (longest {} ms); \
         {} summaries, {} bags removed; read with summaries {}, without {} (exit {:?}, {} problems); audit exit {:?}",
        report.sent,
        report.acked,
        report.refused,
        report.rounds,
        report.retain_kills,
        report.pauses,
        report.longest_pause_ms,
        report.summaries,
        report.bags_removed,
        report.read_with,
        report.read_without,
        report.read_without_exit,
        report.read_without_problems,
        report.audit_exit
    );
    drop(server);
    Ok((report, violations))
}

/// The phase alone (`bagel-chaos retention`): its report in
/// `OUT/retention.json`; whether it found nothing wrong.
pub async fn run_alone(seed: u64, out: &Path) -> anyhow::Result<bool> {
    std::fs::create_dir_all(out)?;
    let out = out.canonicalize()?;
    let bagel = crate::services::sibling("bagel")?;
    let (report, violations) = run(&bagel, &out, seed).await?;
    std::fs::write(out.join("retention.json"), serde_json::to_vec_pretty(&report)?)?;
    for v in &violations {
        println!("VIOLATION {v}");
    }
    Ok(violations.is_empty())
}

/// Told of the phase's first acknowledgement (a permit, so one that comes
/// before the wait starts is not lost).
static FIRST_ACK: std::sync::LazyLock<tokio::sync::Notify> =
    std::sync::LazyLock::new(tokio::sync::Notify::new);

/// Set when the writers are to stop.
static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// One writer until [`STOP`]: `bagel run` over `bagel write`, both on the
/// writers' clock; restarted when it ends (fenced, say).
#[allow(clippy::too_many_arguments)]
async fn writer(
    bagel: &Path,
    store: &str,
    url: &str,
    offset: &str,
    state: &Path,
    w: usize,
    ledger: Arc<Mutex<Ledger>>,
    rng: &mut StdRng,
) -> anyhow::Result<()> {
    let mut seq = 0u64;
    while !STOP.load(std::sync::atomic::Ordering::SeqCst) {
        let script = format!(
            "echo $$ > {pid}; exec {bagel} write --store {store} --log {LOG} --lease \"$BAGEL_LEASE_FILE\" \
             --keep-going --linger 30ms",
            pid = state.with_extension("pid").display(),
            bagel = bagel.display(),
        );
        let mut child = Command::new(bagel)
            .args([
                "--server",
                url,
                "run",
                "--name",
                &format!("retention-writer-{w}"),
                "--ttl",
                "8s",
            ])
            .args(["--wait", "30s", "--", "sh", "-c", &script])
            .envs(bagel_tests::skewed_env(offset))
            .env("BAGEL_STATE_DIR", state)
            .env("RUST_LOG", "error")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(
                std::fs::File::options()
                    .create(true)
                    .append(true)
                    .open(state.with_extension("log"))?,
            )
            .kill_on_drop(true)
            .spawn()
            .context("starting a writer")?;
        let mut input = child.stdin.take().expect("piped");
        let mut answers = BufReader::new(child.stdout.take().expect("piped")).lines();
        let answered = {
            let ledger = Arc::clone(&ledger);
            tokio::spawn(async move {
                while let Ok(Some(line)) = answers.next_line().await {
                    let mut l = ledger.lock().expect("ledger");
                    if let Some(rest) = line.strip_prefix("FAILED ") {
                        let (n, why) = rest.split_once(' ').unwrap_or((rest, ""));
                        let n: usize = n.parse().unwrap_or(1);
                        let why: String = why.chars().filter(|c| !c.is_ascii_digit()).take(100).collect();
                        *l.reasons.entry(why).or_default() += n as u64;
                        for _ in 0..n {
                            l.pending.pop_front();
                            l.refused += 1;
                        }
                    } else if let Some(t) = line.split_whitespace().next().and_then(|t| t.parse().ok())
                        && let Some(payload) = l.pending.pop_front()
                    {
                        l.acked.insert(payload, t);
                        FIRST_ACK.notify_one();
                    }
                }
            })
        };
        loop {
            if STOP.load(std::sync::atomic::Ordering::SeqCst) {
                break;
            }
            let payload = format!("rw{w}-{seq}");
            seq += 1;
            ledger.lock().expect("ledger").pending.push_back(payload.clone());
            if input.write_all(format!("{payload}\n").as_bytes()).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(rng.gen_range(10..60))).await;
        }
        drop(input);
        let _ = child.wait().await;
        let _ = answered.await;
        // What got no answer has an unknown outcome: not counted either way.
        let mut l = ledger.lock().expect("ledger");
        l.pending.clear();
    }
    Ok(())
}

/// Freezes writer `w`'s `bagel write` (SIGSTOP), if it runs.
async fn freeze_writer(dir: &Path, w: usize) -> Option<(nix::unistd::Pid, Instant)> {
    let pid_file = dir.join(format!("retention-writer-{w}.pid"));
    let pid: i32 = std::fs::read_to_string(pid_file).ok()?.trim().parse().ok()?;
    let pid = nix::unistd::Pid::from_raw(pid);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).ok()?;
    Some((pid, Instant::now()))
}

/// `bagel --unsafe-local-clock CMD --store STORE --log LOG ARGS` on a clock
/// `offset` off.
fn cli(bagel: &Path, offset: &str, store: &str, cmd: &str, args: &[&str]) -> Command {
    let mut c = Command::new(bagel);
    c.args(["--unsafe-local-clock", cmd, "--store", store, "--log", LOG])
        .args(args)
        .envs(bagel_tests::skewed_env(offset))
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    c
}

fn check_exit(what: &str, out: &std::process::Output, expected: &[i32], violations: &mut Vec<String>) {
    let code = out.status.code();
    if !code.is_some_and(|c| expected.contains(&c)) {
        violations.push(format!(
            "retention: {what} exited {code:?}: {} {}",
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .take(5)
                .collect::<Vec<_>>()
                .join(" | "),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .take(5)
                .collect::<Vec<_>>()
                .join(" | ")
        ));
    }
}

/// Bags removed, from `bagel retain`'s "removed N bags".
fn removed(out: &std::process::Output) -> u64 {
    String::from_utf8_lossy(&out.stdout)
        .split("removed ")
        .skip(1)
        .filter_map(|rest| {
            let (n, tail) = rest.split_once(' ')?;
            tail.starts_with("bag").then(|| n.parse::<u64>().ok()).flatten()
        })
        .sum()
}

struct Read {
    code: Option<i32>,
    payloads: BTreeSet<String>,
    problems: Vec<String>,
}

async fn read(
    bagel: &Path,
    offset: &str,
    store: &str,
    range: &[&str],
    extra: &[&str],
) -> anyhow::Result<Read> {
    let out = cli(bagel, offset, store, "read", &[range, extra].concat())
        .output()
        .await?;
    let mut read = Read {
        code: out.status.code(),
        payloads: BTreeSet::new(),
        problems: Vec::new(),
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        match v["kind"].as_str() {
            Some("message") => {
                read.payloads
                    .insert(v["payload"].as_str().unwrap_or("").to_owned());
            }
            Some("problem") => read.problems.push(format!("{} {}", v["item"], v["what"])),
            _ => {}
        }
    }
    Ok(read)
}
