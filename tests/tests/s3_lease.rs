//! Leases with no server, on the real S3 server (moto behind one lock, as
//! `tests/run.sh` starts it): racing acquirer processes, a store that
//! ignores conditional writes, a store that stops (loss reported, and
//! `bagel run` fencing its command, before the deadline), the audit of a
//! chain of client-signed witnesses, `bagel run` end to end, and the CLI's
//! lease commands on `--lease-store`.

use std::io::Write as _;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bagel_bags::{self as bag, BagConfig, Writer};
use bagel_cli::contract::LeaseJson;
use bagel_client::{
    AcquireBuilder, Ended, Error, Lease, LeaseBackend as _, LeaseOptions, LossReason, Micros,
};
use bagel_proto::clock::{AssumedExact, SystemClock};
use bagel_proto::rights::{RightsSnapshot, WriteRights};
use bagel_proto::{Signer, pb, sign_witness};
use bagel_s3_lease::{LeaseStore, LeaseTime, S3LeaseBackend};
use bagel_tests::{
    Ignores, IgnoresConditions, PrivateS3, Roughtime, ServerProcess, bin, bin_dir, describe_output,
    roughtime_time, s3_backend_at, s3_bucket, s3_lease_url, s3_test_config, unique,
};
use bytes::Bytes;
use prost::Message as _;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

fn no_renew() -> LeaseOptions {
    LeaseOptions::default()
        .with_auto_renew(false)
        .with_safety_margin(Duration::from_millis(50))
}

/// One racer process (`bagel-s3-racer`) and its pipes.
struct Racer {
    _child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Racer {
    async fn start(url: &str) -> Racer {
        let mut child = Command::new(bin("bagel-s3-racer"))
            .arg(url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn bagel-s3-racer");
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = lines
            .next_line()
            .await
            .unwrap()
            .expect("racer exited before ready");
        assert!(ready.starts_with("ready "), "{ready}");
        Racer {
            _child: child,
            stdin,
            lines,
        }
    }

    async fn send(&mut self, line: &str) {
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
    }

    async fn answer(&mut self) -> String {
        self.lines.next_line().await.unwrap().expect("racer exited")
    }
}

/// Racing acquirer **processes** (each its own backend, key and cache),
/// released by the test at the same instant, hundreds of rounds: exactly
/// one wins each round. Most rounds race for one name that the last
/// winner just released (the `If-Match` takeover path, the chain checked:
/// each winner names the previous one, with a higher fencing token); every
/// third round races to create a fresh name (`If-None-Match: *`).
/// `BAGEL_S3_RACE_ROUNDS` runs longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_acquirer_processes_get_exactly_one_winner_per_round() {
    let rounds: usize = std::env::var("BAGEL_S3_RACE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let url = s3_lease_url(&unique("race"));
    let mut racers = Vec::new();
    for _ in 0..4 {
        racers.push(Racer::start(&url).await);
    }
    let mut last: Option<(String, u64)> = None;
    let mut contested = 0;
    for round in 0..rounds {
        let fresh = round % 3 == 0;
        let name = if fresh {
            format!("fresh-{round}")
        } else {
            "race".to_owned()
        };
        for r in &mut racers {
            r.send(&format!("acquire {name}")).await;
        }
        let mut winners = Vec::new();
        for (i, r) in racers.iter_mut().enumerate() {
            let answer = r.answer().await;
            match answer.split(' ').collect::<Vec<_>>().as_slice() {
                ["won", id, token, prev, ended] => winners.push((
                    i,
                    id.to_string(),
                    token.parse::<u64>().unwrap(),
                    prev.to_string(),
                    ended.to_string(),
                )),
                ["busy"] => contested += 1,
                _ => panic!("round {round}: racer {i} answered {answer:?}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round} on {name:?}: winners {winners:?}");
        let (i, id, token, prev, ended) = winners.pop().unwrap();
        if fresh {
            assert_eq!((prev.as_str(), ended.as_str()), ("-", "none"), "round {round}");
        } else {
            if let Some((last_id, last_token)) = &last {
                assert_eq!((&prev, ended.as_str()), (last_id, "released"), "round {round}");
                assert!(
                    token > *last_token,
                    "round {round}: fencing {token} after {last_token}"
                );
            }
            last = Some((id, token));
        }
        racers[i].send("release").await;
        let released = racers[i].answer().await;
        assert!(released.starts_with("released "), "round {round}: {released}");
    }
    println!("{rounds} rounds, 4 racing processes, one winner each; {contested} refused attempts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_ignores_conditional_writes_is_refused_at_start() {
    let real = bag::store::url::s3_from_env(&s3_bucket()).unwrap();
    for ignores in [Ignores::IfNoneMatch, Ignores::IfMatch] {
        let liar = IgnoresConditions {
            inner: real.clone(),
            ignores,
        };
        let cfg = s3_test_config();
        let store = LeaseStore::new(Arc::new(liar), &unique("liar"), "liar".into(), cfg.op_timeout);
        let err = S3LeaseBackend::open(
            store,
            Signer::generate(),
            LeaseTime::Signed(roughtime_time()),
            cfg,
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&err, Error::Store { message, retryable: false, .. } if message.contains("ignores conditional writes")),
            "{ignores:?}: {err:?}"
        );
    }
    // The honest store passes the same probes.
    let cfg = s3_test_config();
    let store = LeaseStore::new(real, &unique("honest"), "honest".into(), cfg.op_timeout);
    S3LeaseBackend::open(
        store,
        Signer::generate(),
        LeaseTime::Signed(roughtime_time()),
        cfg,
    )
    .await
    .unwrap();
}

/// The fault run's S3 server is killed (-9) and started again on its
/// journal; what it acknowledged before must still be there, overwrites
/// included. Each grant overwrites the name's lease object (If-Match), so
/// after a restart the next holder must name the last holder before it,
/// with its watermark: a chain broken here would be a store losing
/// acknowledged writes (as the hour-long fault run once saw: a replay that
/// dropped every overwrite handed grants a predecessor minutes old).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watermark_chain_survives_a_restart_of_the_journaled_s3_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut s3 = PrivateS3::start_journaled(&dir.path().join("journal.jsonl")).await;
    let open = |s3: &PrivateS3| {
        let store = LeaseStore::new(s3.store(), "p", s3.url("p"), s3_test_config().op_timeout);
        S3LeaseBackend::open(
            store,
            Signer::generate(),
            LeaseTime::Signed(roughtime_time()),
            s3_test_config(),
        )
    };
    let backend = Arc::new(open(&s3).await.unwrap());
    let mut last = None;
    for round in 1..=3u64 {
        let lease = AcquireBuilder::new(Arc::clone(&backend) as _, ["chain"])
            .options(no_renew())
            .send()
            .await
            .unwrap();
        assert_eq!(lease.names()[0].previous.lease_id, last, "round {round}");
        last = Some(lease.id().to_owned());
        lease
            .release(Some(Micros::from_micros(round * 1_000_000)))
            .await
            .unwrap();
    }

    // Twice: the first restart replays every request and compacts the
    // journal to the state it produced; the second replays that.
    let journal = dir.path().join("journal.jsonl");
    let lines = || std::fs::read_to_string(&journal).unwrap().lines().count();
    for restart in 1..=2u64 {
        let before = lines();
        s3.restart().await;
        assert!(
            lines() < before,
            "restart {restart}: the journal is compacted ({} lines, {before} before)",
            lines()
        );
        let backend = Arc::new(open(&s3).await.unwrap());
        let after = AcquireBuilder::new(Arc::clone(&backend) as _, ["chain"])
            .options(no_renew())
            .send()
            .await
            .unwrap();
        let previous = &after.names()[0].previous;
        assert_eq!(
            (previous.lease_id.clone(), previous.watermark, previous.ended),
            (
                last.clone(),
                Micros::from_micros(restart * 3_000_000),
                Ended::Released
            ),
            "after restart {restart} the next holder names the last one before it"
        );
        last = Some(after.id().to_owned());
        after
            .release(Some(Micros::from_micros((restart + 1) * 3_000_000)))
            .await
            .unwrap();
    }
}

/// A holder renews in the background; the S3 server stops: renewals fail,
/// and the handle reports the loss before the deadline it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_store_stops_reports_loss_before_its_deadline() {
    let mut s3 = PrivateS3::start().await;
    let cfg = s3_test_config().with_op_timeout(Duration::from_millis(500));
    let store = LeaseStore::new(s3.store(), "p", s3.url("p"), cfg.op_timeout);
    let backend = S3LeaseBackend::open(
        store,
        Signer::generate(),
        LeaseTime::Signed(roughtime_time()),
        cfg,
    )
    .await
    .unwrap();
    let lease = AcquireBuilder::new(Arc::new(backend), ["leader"])
        .ttl(Duration::from_secs(3))
        .options(LeaseOptions::default().with_safety_margin(Duration::from_millis(500)))
        .send()
        .await
        .unwrap();
    let mut state = lease.subscribe();
    state.changed().await.unwrap();
    assert!(lease.state().lost.is_none(), "one renewal landed");
    s3.kill();
    let reason = lease.lost().await;
    let noticed = Micros::now();
    let deadline = lease.deadline();
    assert!(
        noticed < deadline,
        "loss noticed at {noticed}, after the deadline {deadline}"
    );
    assert!(matches!(reason, LossReason::OutOfTime { .. }), "{reason}");
    assert!(!lease.is_valid());
}

fn roughtime_args() -> Vec<String> {
    Roughtime::from_env()
        .flags()
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// `bagel` with the S3 environment of `s3` (or the suite's) and Roughtime.
fn bagel(args: &[&str], envs: &[(&'static str, String)]) -> std::process::Command {
    let mut cmd = std::process::Command::new(bin("bagel"));
    cmd.args(roughtime_args()).args(args).env("RUST_LOG", "warn");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd
}

fn pid_alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

/// `bagel run` holds an S3 lease for a command that ignores SIGTERM; the S3
/// server stops: `bagel run` kills the command (SIGKILL after the grace)
/// before the lease's deadline, and exits 3 saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bagel_run_kills_its_command_before_the_deadline_when_the_store_stops() {
    let mut s3 = PrivateS3::start().await;
    let dir = tempfile::tempdir().unwrap();
    let lease_file = dir.path().join("lease.json");
    let state = dir.path().join("state");
    let mut envs = s3.env();
    envs.push(("BAGEL_STATE_DIR", state.display().to_string()));
    let url = s3.url("p");
    let mut child = tokio::process::Command::from(bagel(
        &[
            "--lease-store",
            &url,
            "--clock-margin",
            "14s",
            "run",
            "--name",
            "leader",
            "--ttl",
            "3s",
            "--fence-margin",
            "300ms",
            "--kill-grace",
            "300ms",
            "--lease-file",
            &lease_file.display().to_string(),
            "--",
            "sh",
            "-c",
            "trap '' TERM; echo started $$; exec sleep 1000",
        ],
        &envs,
    ));
    let mut run = child
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(run.stdout.take().unwrap()).lines();
    let started = out.next_line().await.unwrap().expect("the command started");
    let pid: i32 = started.strip_prefix("started ").unwrap().parse().unwrap();
    assert!(pid_alive(pid));
    s3.kill();
    let status = run.wait().await.unwrap();
    let ended = Micros::now();
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(run.stderr.as_mut().unwrap(), &mut stderr)
        .await
        .unwrap();
    let lease: LeaseJson = serde_json::from_slice(&std::fs::read(&lease_file).unwrap()).unwrap();
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("fenced"), "{stderr}");
    assert!(
        stderr.contains("killed by signal 9"),
        "SIGTERM was ignored, SIGKILL needed: {stderr}"
    );
    assert!(!pid_alive(pid), "the command outlived bagel run");
    assert!(
        ended.as_micros() < lease.deadline_us,
        "bagel run ended at {ended}, not before the deadline {}: {stderr}",
        Micros::from_micros(lease.deadline_us)
    );
}

/// Rights for a forged lease: its witness, a fixed range.
#[derive(Debug)]
struct Forged {
    witness: pb::Witness,
    min: Micros,
    deadline: Micros,
}

impl WriteRights for Forged {
    fn snapshot(&self) -> Result<RightsSnapshot, String> {
        Ok(RightsSnapshot {
            min_timestamp: self.min,
            deadline: self.deadline,
            witnesses: vec![self.witness.clone()],
            holder_keys: Vec::new(),
        })
    }
}

/// Writes `n` messages under `rights`, with Roughtime signed time.
async fn write(
    url: &str,
    log: &str,
    cfg: &BagConfig,
    writer_id: &str,
    rights: Arc<dyn WriteRights>,
    n: usize,
) -> Writer {
    let store = bag::open_store(url, cfg).await.unwrap();
    let w = Writer::new(
        store,
        log,
        writer_id,
        rights,
        Arc::new(SystemClock),
        Arc::new(roughtime_time()),
        cfg.clone(),
    )
    .unwrap();
    for i in 0..n {
        w.write(Bytes::from(format!("{writer_id}-{i}"))).await.unwrap();
    }
    w
}

fn audit(bags: &str, log: &str, lease_store: &str, extra: &[&str]) -> (std::process::Output, Vec<String>) {
    let mut args = vec![
        "--lease-store",
        lease_store,
        "audit",
        "--store",
        bags,
        "--log",
        log,
        "--grace",
        "200ms",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = bagel(&args, &[]).output().unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe_output(&out)));
    let kinds = v["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["kind"].as_str().unwrap().to_owned())
        .collect();
    (out, kinds)
}

/// Three clients (three keys) hand a name down a chain on S3: A releases,
/// B is broken at its deadline, C takes over and releases. `bagel audit`
/// with `--lease-store` (keys read from the store) finds nothing in that
/// range. After it, two forgeries write: a grant signed by a published key
/// that overlaps A without naming it, and one signed by a key never
/// published; the audit of everything names both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_accepts_an_s3_lease_chain_and_catches_forgeries() {
    let prefix = unique("audit");
    let lease_store = s3_lease_url(&prefix);
    let dir = tempfile::tempdir().unwrap();
    let bags = format!("file://{}", dir.path().display());
    let log = unique("log");
    // The default grace (longer than the clock tolerance), so that writers
    // never run ahead of the clock and every forged message below comes
    // after every honest one.
    let cfg = BagConfig::default().with_deadline_margin(Duration::from_millis(100));
    let (ka, kb, kc) = (
        s3_backend_at(&prefix, s3_test_config()).await,
        s3_backend_at(&prefix, s3_test_config()).await,
        s3_backend_at(&prefix, s3_test_config()).await,
    );
    let acquire =
        |b: &Arc<S3LeaseBackend>| AcquireBuilder::new(Arc::clone(b) as _, ["acct"]).options(no_renew());

    let a = acquire(&ka).ttl(Duration::from_secs(40)).send().await.unwrap();
    let wa = write(&bags, &log, &cfg, "writer-a", a.rights(), 4).await;
    let a_deadline = a.deadline();
    let a_witness = bagel_tests::wire(&a.witness());
    let a_fencing = a.fencing_token("acct").unwrap();
    a.release(Some(wa.watermark(Micros::ZERO))).await.unwrap();

    let b = acquire(&kb)
        .ttl(Duration::from_millis(1500))
        .send()
        .await
        .unwrap();
    write(&bags, &log, &cfg, "writer-b", b.rights(), 3).await;

    // B is broken 14 s (the clock margin) after its deadline.
    let c = acquire(&kc).wait(Duration::from_secs(30)).send().await.unwrap();
    assert_eq!(c.names()[0].previous.ended, Ended::Broken);
    let until = c
        .close_before_reading()
        .expect("a broken predecessor is unsettled");
    let store = bag::open_store(&bags, &cfg).await.unwrap();
    bag::close_logs_through(
        store.as_ref(),
        std::slice::from_ref(&log),
        until,
        &cfg,
        &AssumedExact(SystemClock),
    )
    .await
    .unwrap();
    c.settled_through(until);
    let wc = write(&bags, &log, &cfg, "writer-c", c.rights(), 2).await;
    let inherited = c.min_timestamp();
    c.release(Some(wc.watermark(inherited))).await.unwrap();
    // Every forged message below is written after this instant.
    let honest_until = Micros::now().max(wc.max_written().expect("C wrote").next());

    // Forgery 1: a published key (a fourth client's) states a grant of
    // "acct" inside A's lease that does not name A: two holders at once.
    let forger = Signer::generate();
    let fstore = LeaseStore::from_url(&lease_store, s3_test_config().op_timeout).unwrap();
    S3LeaseBackend::open(
        fstore,
        forger.clone(),
        LeaseTime::Signed(roughtime_time()),
        s3_test_config(),
    )
    .await
    .unwrap();
    let mut body = pb::WitnessBody::decode(a_witness.body.clone()).unwrap();
    // The forger states no holder key (it could state its own as well).
    body.holder_key.clear();
    body.lease_id = format!("{:032x}", 0xf0f0_u64);
    body.names[0].fencing_token = a_fencing + 1;
    body.names[0].previous = Some(pb::PreviousLease::default());
    body.owner = "forger".into();
    let overlapping = Forged {
        witness: sign_witness(&forger, &body),
        min: Micros::from_micros(body.min_timestamp_us),
        deadline: a_deadline,
    };
    // Forgery 2: a key nobody published signs a lease of its own.
    let mut body = pb::WitnessBody::decode(a_witness.body.clone()).unwrap();
    // The forger states no holder key (it could state its own as well).
    body.holder_key.clear();
    body.lease_id = format!("{:032x}", 0xabcd_u64);
    body.names[0].name = "other".into();
    let unpublished = Forged {
        witness: sign_witness(&Signer::generate(), &body),
        min: Micros::from_micros(body.min_timestamp_us),
        deadline: a_deadline,
    };
    // Both write inside A's deadline (40 s, A released early; C took over B 14 s after its deadline).
    write(&bags, &log, &cfg, "forger-1", Arc::new(overlapping), 1).await;
    write(&bags, &log, &cfg, "forger-2", Arc::new(unpublished), 1).await;
    close_all(&bags, &log, &cfg).await;

    let honest = honest_until.as_micros().to_string();
    let (out, kinds) = audit(&bags, &log, &lease_store, &["--to", &honest]);
    assert!(
        out.status.success() && kinds.is_empty(),
        "{}",
        describe_output(&out)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            v["messages"].as_u64(),
            v["leases"].as_u64(),
            v["longest_chain"].as_u64()
        ),
        (Some(9), Some(3), Some(3)),
        "{}",
        describe_output(&out)
    );
    let (out, kinds) = audit(&bags, &log, &lease_store, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    assert!(kinds.contains(&"overlapping_grants".to_owned()), "{kinds:?}");
    // The key nobody published is named once as untrusted (it may be a
    // forger's or a left-out server's), never as a forgery per message.
    assert!(kinds.contains(&"untrusted_key".to_owned()), "{kinds:?}");
}

async fn close_all(bags: &str, log: &str, cfg: &BagConfig) {
    let store = bag::open_store(bags, cfg).await.unwrap();
    let until = Micros::now().saturating_add(Duration::from_secs(1));
    bag::close_through(store.as_ref(), log, until, cfg, &AssumedExact(SystemClock))
        .await
        .unwrap();
}

/// Where `bagel run` takes its lease in the end-to-end test.
enum RunBackend {
    Server(ServerProcess),
    S3(String),
}

impl RunBackend {
    fn flags(&self) -> Vec<String> {
        match self {
            RunBackend::Server(s) => vec!["--server".into(), s.url.clone()],
            RunBackend::S3(url) => vec![
                "--lease-store".into(),
                url.clone(),
                "--clock-margin".into(),
                "14s".into(),
            ],
        }
    }
}

/// `bagel run` end to end: the command starts holding the lease and sees
/// it in its environment; `bagel write` under `$BAGEL_LEASE_FILE` works; a
/// second `bagel run` on the name is refused (exit 2) while it holds; its
/// exit status is bagel run's; the lease is released after, publishing
/// what was written.
async fn bagel_run_end_to_end(backend: RunBackend) {
    let dir = tempfile::tempdir().unwrap();
    // A store's root must exist (bagel creates only the logs inside).
    std::fs::create_dir(dir.path().join("bags")).unwrap();
    let bags = format!("file://{}", dir.path().join("bags").display());
    let state = dir.path().join("state");
    let flags = backend.flags();
    let flag_refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let script = format!(
        "echo \"env $BAGEL_LEASE_ID $BAGEL_FENCING_TOKEN $BAGEL_DEADLINE_US $BAGEL_LEASE_NAMES\"; \
         test -s \"$BAGEL_LEASE_FILE\" || exit 90; \
         printf 'm1\\nm2\\n' | bagel write --store {bags} --log runlog --lease \"$BAGEL_LEASE_FILE\" || exit 91; \
         bagel run --name leader -- true; echo \"inner $?\"; \
         exit 7"
    );
    let path = format!(
        "{}:{}",
        bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut args = flag_refs.clone();
    args.extend([
        "run", "--name", "leader", "--ttl", "5s", "--", "sh", "-c", &script,
    ]);
    let out = bagel(
        &args,
        &[("PATH", path), ("BAGEL_STATE_DIR", state.display().to_string())],
    )
    .output()
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(7), "{}", describe_output(&out));
    let env_line = text
        .lines()
        .find(|l| l.starts_with("env "))
        .expect("the command printed its env");
    let fields: Vec<&str> = env_line.split(' ').collect();
    let (id, token, deadline, names) = (fields[1], fields[2], fields[3], fields[4]);
    assert_eq!(id.len(), 32, "{env_line}");
    assert!(
        token.parse::<u64>().unwrap() > 0 && deadline.parse::<u64>().unwrap() > 0,
        "{env_line}"
    );
    assert_eq!(names, "leader");
    assert!(
        text.contains("inner 2"),
        "a second bagel run on the held name exits 2: {text}"
    );
    // `bagel write` printed `<µs> <time>` per message.
    let written: u64 = text
        .lines()
        .filter_map(|l| l.split(' ').next()?.parse::<u64>().ok())
        .max()
        .expect("bagel write printed its timestamps");
    // Released: the next holder names it, with at least what was written.
    let mut args = flag_refs.clone();
    args.extend(["acquire", "leader", "--json"]);
    let next = bagel(&args, &[("BAGEL_STATE_DIR", state.display().to_string())])
        .output()
        .unwrap();
    assert!(next.status.success(), "{}", describe_output(&next));
    let next: LeaseJson = serde_json::from_slice(&next.stdout).unwrap();
    let prev = &next.names[0].previous;
    assert_eq!((prev.lease_id.as_str(), prev.ended.as_str()), (id, "released"));
    assert!(
        prev.watermark_us >= written,
        "watermark {} below the written {written}",
        prev.watermark_us
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bagel_run_end_to_end_on_s3() {
    bagel_run_end_to_end(RunBackend::S3(s3_lease_url(&unique("run")))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bagel_run_end_to_end_on_a_server() {
    bagel_run_end_to_end(RunBackend::Server(ServerProcess::start_ready(&[]).await)).await;
}

/// The lease commands on `--lease-store`: acquire (JSON contract), busy
/// exit 2, renew and release by lease file, describe, history,
/// verify-witness with the store's published keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_commands_work_on_an_s3_lease_store() {
    let url = s3_lease_url(&unique("cli"));
    let dir = tempfile::tempdir().unwrap();
    let state = [("BAGEL_STATE_DIR", dir.path().display().to_string())];
    let run = |args: &[&str]| {
        let mut all = vec!["--lease-store", url.as_str(), "--clock-margin", "14s"];
        all.extend_from_slice(args);
        bagel(&all, &state).output().unwrap()
    };
    let out = run(&[
        "acquire", "tenant-7", "tenant-9", "--ttl", "5s", "--owner", "w-1", "--json",
    ]);
    assert!(out.status.success(), "{}", describe_output(&out));
    let lease: LeaseJson = serde_json::from_slice(&out.stdout).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "lease_id",
        "token",
        "deadline_us",
        "min_timestamp_us",
        "mode",
        "names",
        "witness",
        "server",
    ] {
        assert!(v.get(key).is_some(), "key {key} missing: {v}");
    }
    assert_eq!(lease.server.as_deref(), Some(url.as_str()));
    let file = dir.path().join("lease.json");
    std::fs::File::create(&file)
        .unwrap()
        .write_all(&out.stdout)
        .unwrap();
    let file = file.display().to_string();

    let busy = run(&["acquire", "tenant-7"]);
    assert_eq!(busy.status.code(), Some(2), "{}", describe_output(&busy));
    assert!(
        String::from_utf8_lossy(&busy.stderr).contains("w-1"),
        "{}",
        describe_output(&busy)
    );

    let verify = run(&["verify-witness", &file]);
    assert!(verify.status.success(), "{}", describe_output(&verify));

    let renewed = run(&[
        "renew",
        "--lease",
        &file,
        "--ttl",
        "8s",
        "--metadata",
        "s3://b/p/1",
        "--json",
    ]);
    assert!(renewed.status.success(), "{}", describe_output(&renewed));
    let r: serde_json::Value = serde_json::from_slice(&renewed.stdout).unwrap();
    assert!(r["deadline_us"].as_u64().unwrap() > lease.deadline_us);

    // By id, token and names, as a tool without the file would.
    let released = run(&[
        "release",
        "--lease",
        &lease.lease_id,
        "--token",
        &lease.token,
        "--name",
        "tenant-7",
        "--name",
        "tenant-9",
        "--json",
    ]);
    assert!(released.status.success(), "{}", describe_output(&released));

    let described = run(&["describe", "tenant-7", "--json"]);
    assert!(described.status.success(), "{}", describe_output(&described));
    let d: serde_json::Value = serde_json::from_slice(&described.stdout).unwrap();
    assert_eq!(d[0]["previous"]["lease_id"], lease.lease_id.as_str());
    assert_eq!(d[0]["previous"]["ended"], "released");
    assert!(d[0]["holder"].is_null());

    let history = run(&["history", "tenant-7", "--json"]);
    let h: serde_json::Value = serde_json::from_slice(&history.stdout).unwrap();
    let events: Vec<&str> = h["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(events, ["renewed", "released"]);

    // Without signed time, S3 leases are refused, naming the flag.
    let no_time = std::process::Command::new(bin("bagel"))
        .args(["--lease-store", &url, "acquire", "x"])
        .env_remove("BAGEL_ROUGHTIME")
        .env_remove("BAGEL_ROUGHTIME_KEYS")
        .output()
        .unwrap();
    assert_eq!(no_time.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&no_time.stderr).contains("--roughtime"),
        "{}",
        describe_output(&no_time)
    );
}

/// What an S3 lease costs, in requests: acquire `n` GET + `n` PUT; renew
/// and release `n` PUT each (the ETag of the last write is cached); a
/// renewal from a process holding only the lease file adds `n` GET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_operation() {
    use bagel_bags::store::faults::{KillSwitch, TestObjectStore};
    let real = bag::store::url::s3_from_env(&s3_bucket()).unwrap();
    let counted = TestObjectStore::new(real, KillSwitch::never());
    let counts = Arc::clone(&counted.counts);
    let counted: Arc<dyn object_store::ObjectStore> = Arc::new(counted);
    let cfg = s3_test_config();
    let prefix = unique("cost");
    let open = || async {
        let store = LeaseStore::new(
            Arc::clone(&counted),
            &prefix,
            s3_lease_url(&prefix),
            cfg.op_timeout,
        );
        Arc::new(
            S3LeaseBackend::open(
                store,
                Signer::generate(),
                LeaseTime::Signed(roughtime_time()),
                cfg.clone(),
            )
            .await
            .unwrap(),
        )
    };
    let backend = open().await;
    let other_process = open().await;
    let take = |c: &bagel_bags::store::faults::RequestCounts| {
        let got = (c.gets(), c.puts(), c.heads() + c.lists());
        c.reset();
        got
    };
    for n in [1usize, 4] {
        let names: Vec<String> = (0..n).map(|i| format!("n{n}-{i}")).collect();
        take(&counts);
        let lease = AcquireBuilder::new(Arc::clone(&backend) as _, names.clone())
            .ttl(Duration::from_secs(10))
            .options(no_renew())
            .send()
            .await
            .unwrap();
        let acquire = take(&counts);
        lease.renew().await.unwrap();
        let renew = take(&counts);
        let deadline = Micros::now().saturating_add(Duration::from_secs(10));
        other_process
            .renew_lease(lease.lease_ref(), deadline, None)
            .await
            .unwrap();
        let renew_elsewhere = take(&counts);
        // The first process's cached ETag is stale now: one lost race, one GET.
        lease.renew().await.unwrap();
        let renew_stale = take(&counts);
        lease.release(None).await.unwrap();
        let release = take(&counts);
        let n = n as u64;
        println!(
            "{n} names: acquire {acquire:?}, renew {renew:?}, renew from another process {renew_elsewhere:?}, \
             renew after that {renew_stale:?}, release {release:?} (GET, PUT, other)"
        );
        assert_eq!(acquire, (n, n, 0));
        assert_eq!(renew, (0, n, 0));
        assert_eq!(renew_elsewhere, (n, n, 0));
        assert_eq!(renew_stale, (n, 2 * n, 0));
        assert_eq!(release, (0, n, 0));
    }
}

/// A lease handle on S3 gives the bag writer rights like any other: a
/// writer under a lost lease is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_under_an_s3_lease_stops_when_it_is_released() {
    let backend = s3_backend_at(&unique("w"), s3_test_config()).await;
    let dir = tempfile::tempdir().unwrap();
    let bags = format!("file://{}", dir.path().display());
    let cfg = BagConfig::default();
    let lease: Lease = AcquireBuilder::new(backend as _, ["acct"])
        .options(no_renew())
        .ttl(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    let w = write(&bags, "l", &cfg, "w", lease.rights(), 2).await;
    let wm = lease.release(None).await.unwrap();
    assert_eq!(
        Some(wm),
        w.max_written(),
        "the release published what was written"
    );
    assert!(
        w.write(Bytes::from("late")).await.is_err(),
        "no writes after the release"
    );
}
