//! Network partitions, Jepsen's main fault: a lease server and its
//! clients in network namespaces of their own, joined by a veth pair, and
//! one direction or both cut with a blackhole route (`tc netem` is not
//! needed: a route that drops everything to one address is a partition).
//!
//! Each kind runs the same check. A leader (`bagel run` with a command
//! that records when it starts and when it is stopped) holds a name from
//! the client namespace; a standby (`bagel run --wait`) waits for it from
//! the server's namespace, which the cut never separates from the server.
//! Then the link is cut:
//!
//! * `both`: client ↔ server, nothing gets through;
//! * `client_to_server`: requests are lost, the server hears nothing;
//! * `server_to_client`: requests arrive and are served (renewals land on
//!   the server) but every answer is lost.
//!
//! In every kind the leader must fence itself (`bagel run` exits 3) and
//! its command must have stopped before the standby's command starts: at
//! most one leader at any instant, whatever the server applied that the
//! leader never heard of. The standby must take over within the TTL and a
//! margin after the leader's last known deadline. Both commands record
//! their instants on this host's clock (one clock: the namespaces share
//! it), so the comparison is exact.
//!
//! Then the cuts between the bag store and its writers and closer (see
//! `store_partitions/`), reported beside these under `store`, and every
//! kind's count and longest cut under `by_kind`.
//!
//! Needs root and iproute2 (`ip netns`, veth pairs). The namespaces'
//! addresses are private ones inside namespaces this run makes and
//! removes; no traffic leaves them.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use rand::SeedableRng as _;
use rand::rngs::StdRng;
use serde::Serialize;
use tokio::process::{Child, Command};

use crate::store_partitions::{self, StorePhase};

/// The lease's TTL, and `bagel run`'s margins (fencing starts at
/// deadline − 600 ms).
const TTL: &str = "3s";
const FENCE_MARGIN: &str = "300ms";
const KILL_GRACE: &str = "300ms";

/// The longest any step may take before the run fails (a leader that is
/// never fenced, a standby that never takes over).
pub(crate) const BOUND: Duration = Duration::from_secs(30);

/// How long a standby may lead late after the leader's command stopped:
/// the leader stops no later than its known deadline − the fence margin;
/// a renewal the server applied but whose answer was lost extends the
/// server's deadline by at most a TTL; the standby's wait wakes at the
/// deadline. TTL + 2 s covers both with room for a loaded machine.
const TAKEOVER_BOUND: Duration = Duration::from_secs(5);

/// The partitions of one run, by kind.
#[derive(Debug, Default, Serialize)]
pub struct PartitionReport {
    /// Whether they ran (they need root and iproute2), and if not, why.
    pub ran: bool,
    pub not_run_because: Option<String>,
    /// One entry a partition.
    pub kinds: Vec<PartitionOutcome>,
    /// The longest partition, ms.
    pub longest_ms: u64,
    /// The cuts between the bag store and its clients.
    pub store: StorePhase,
    /// Every kind of cut (these and the store's): how many, the longest.
    pub by_kind: BTreeMap<&'static str, KindCount>,
}

/// How often one kind of cut ran, and its longest, ms.
#[derive(Debug, Default, Serialize)]
pub struct KindCount {
    pub count: u64,
    pub longest_ms: u64,
}

impl PartitionReport {
    fn count(&mut self, kind: &'static str, length_ms: u64) {
        let k = self.by_kind.entry(kind).or_default();
        k.count += 1;
        k.longest_ms = k.longest_ms.max(length_ms);
        self.longest_ms = self.longest_ms.max(length_ms);
    }
}

/// What one partition did.
#[derive(Debug, Serialize)]
pub struct PartitionOutcome {
    pub kind: &'static str,
    /// The partition's length, ms (from the cut to the heal).
    pub length_ms: u64,
    /// `bagel run`'s exit status for the leader (3: fenced).
    pub leader_exit: Option<i32>,
    /// The leader's command stopped before the standby's started.
    pub one_leader: bool,
    /// From the leader's command stopping to the standby's starting, ms.
    pub takeover_ms: u64,
}

/// The cut kinds, in the order they run.
const KINDS: [&str; 3] = ["both", "client_to_server", "server_to_client"];

/// Runs every kind of partition once, the store's cuts drawn from `seed`.
/// `Err` only for a failed check or a setup that fails as root; without
/// root the report says why it did not run.
pub async fn run(bagel: &Path, server: &Path, dir: &Path, seed: u64) -> anyhow::Result<PartitionReport> {
    let mut report = PartitionReport::default();
    // `/proc/self` belongs to this process's effective uid.
    let root = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self")?) == 0;
    if !root {
        report.not_run_because = Some("network partitions need root (network namespaces)".into());
        println!("partitions: NOT RUN: network partitions need root (network namespaces)");
        return Ok(report);
    }
    let net = Net::create(std::process::id()).await?;
    let outcome = async {
        let mut server_proc = net
            .exec(&net.server_ns, server)
            .args([
                "--listen",
                &format!("{}:7420", net.server_ip),
                "--max-ttl",
                TTL,
                "--clock-tolerance",
                "100ms",
                // A fresh server with no predecessor: its restart wait is
                // not what this checks.
                "--unsafe-skip-restart-wait",
            ])
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting bagel-server in its namespace")?;
        await_line(&mut server_proc, " listening on ").await?;
        for kind in KINDS {
            let outcome = one(&net, bagel, dir, kind).await?;
            println!(
                "partitions: {kind}: leader exit {:?}, one leader {}, takeover {} ms, cut {} ms",
                outcome.leader_exit, outcome.one_leader, outcome.takeover_ms, outcome.length_ms
            );
            report.count(kind, outcome.length_ms);
            report.kinds.push(outcome);
        }
        anyhow::Ok(())
    }
    .await;
    net.remove().await;
    outcome?;
    report.ran = true;
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5707e);
    let (store, store_violations) = store_partitions::run(bagel, server, dir, &mut rng).await?;
    for cut in &store.cuts {
        report.count(cut.kind, cut.length_ms);
    }
    println!(
        "partitions: store: {} acked = {} read back ({} read unacknowledged; failed batches: {} timed out, {} \
         late, {} other; longest batch by writer {:?} ms, bounds {:?} ms); readers agree: {}; {} violations",
        store.acked,
        store.read_back,
        store.read_unacknowledged,
        store.failed_timeout,
        store.failed_late,
        store.failed_other,
        store.longest_batch_ms,
        store.batch_bound_ms,
        store.readers_agree,
        store_violations.len()
    );
    report.store = store;
    let mut bad: Vec<String> = report
        .kinds
        .iter()
        .filter(|o| {
            !o.one_leader || o.leader_exit != Some(3) || o.takeover_ms > TAKEOVER_BOUND.as_millis() as u64
        })
        .map(|o| format!("{o:?}"))
        .collect();
    bad.extend(store_violations.into_iter().map(|v| format!("store: {v}")));
    if !bad.is_empty() {
        bail!("partitions: {}", bad.join("; "));
    }
    Ok(report)
}

/// One partition of `kind`: a leader in the client namespace, a standby
/// beside the server, the cut, the checks, the heal.
async fn one(net: &Net, bagel: &Path, dir: &Path, kind: &'static str) -> anyhow::Result<PartitionOutcome> {
    let name = format!("partition-{kind}");
    let url = format!("http://{}:7420", net.server_ip);
    let leader_log = dir.join(format!("partition-{kind}-leader"));
    let standby_log = dir.join(format!("partition-{kind}-standby"));
    let state = dir.join(format!("partition-{kind}-state"));
    // The command notes its start, and its stop when told to stop.
    let leader_script = format!(
        "echo start $(date +%s%6N) >> {log}; trap 'echo end $(date +%s%6N) >> {log}; exit 0' TERM; \
         while :; do sleep 0.05; done",
        log = leader_log.display()
    );
    let mut leader = bagel_run(
        net,
        &net.client_ns,
        bagel,
        &url,
        &name,
        None,
        &state.join("leader"),
        &leader_script,
    )
    .context("starting the leader")?;
    await_file_line(&leader_log, "start").await?;
    let standby_script = format!("echo start $(date +%s%6N) >> {}", standby_log.display());
    let mut standby = bagel_run(
        net,
        &net.server_ns,
        bagel,
        &url,
        &name,
        Some("30s"),
        &state.join("standby"),
        &standby_script,
    )
    .context("starting the standby")?;

    let cut = Instant::now();
    net.cut(kind).await?;
    let leader_status = tokio::time::timeout(BOUND, leader.wait())
        .await
        .with_context(|| format!("{kind}: the partitioned leader was not fenced within {BOUND:?}"))??;
    let standby_status = tokio::time::timeout(BOUND, standby.wait())
        .await
        .with_context(|| format!("{kind}: the standby did not take over within {BOUND:?}"))??;
    let length = cut.elapsed();
    net.heal(kind).await?;
    if !standby_status.success() {
        bail!("{kind}: the standby's bagel run failed: {standby_status}");
    }
    let leader_end = instant_in(&leader_log, "end")?;
    let standby_start = instant_in(&standby_log, "start")?;
    Ok(PartitionOutcome {
        kind,
        length_ms: u64::try_from(length.as_millis()).unwrap_or(u64::MAX),
        leader_exit: leader_status.code(),
        one_leader: leader_end < standby_start,
        takeover_ms: standby_start.saturating_sub(leader_end) / 1000,
    })
}

/// `bagel run` of `sh -c SCRIPT` on `name` in namespace `ns`, waiting
/// `wait` for it when given, with this module's TTL and margins.
#[allow(clippy::too_many_arguments)]
fn bagel_run(
    net: &Net,
    ns: &str,
    bagel: &Path,
    url: &str,
    name: &str,
    wait: Option<&str>,
    state: &Path,
    script: &str,
) -> std::io::Result<Child> {
    let mut cmd = net.exec(ns, bagel);
    cmd.args(["--server", url, "run", "--name", name, "--ttl", TTL])
        .args(["--fence-margin", FENCE_MARGIN, "--kill-grace", KILL_GRACE]);
    if let Some(wait) = wait {
        cmd.args(["--wait", wait]);
    }
    cmd.args(["--", "sh", "-c", script])
        .env("BAGEL_STATE_DIR", state)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
}

/// The two namespaces and the veth pair between them.
struct Net {
    server_ns: String,
    client_ns: String,
    server_ip: String,
    client_ip: String,
}

impl Net {
    /// Makes the namespaces (named after `tag`, this run's pid) and the
    /// link, with addresses from a /30 of its own.
    async fn create(tag: u32) -> anyhow::Result<Net> {
        let tag = tag % 100_000;
        let net = Net {
            server_ns: format!("bagel-ps-{tag}"),
            client_ns: format!("bagel-pc-{tag}"),
            // 10.231.x.y/30 inside the namespaces only.
            server_ip: format!("10.231.{}.{}", (tag / 64) % 256, (tag % 64) * 4 + 1),
            client_ip: format!("10.231.{}.{}", (tag / 64) % 256, (tag % 64) * 4 + 2),
        };
        let (s_if, c_if) = (format!("bps{tag}"), format!("bpc{tag}"));
        let steps: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), net.server_ns.clone()],
            vec!["netns".into(), "add".into(), net.client_ns.clone()],
            vec![
                "link".into(),
                "add".into(),
                s_if.clone(),
                "netns".into(),
                net.server_ns.clone(),
                "type".into(),
                "veth".into(),
                "peer".into(),
                "name".into(),
                c_if.clone(),
                "netns".into(),
                net.client_ns.clone(),
            ],
            net.in_ns(
                &net.server_ns,
                &["addr", "add", &format!("{}/30", net.server_ip), "dev", &s_if],
            ),
            net.in_ns(
                &net.client_ns,
                &["addr", "add", &format!("{}/30", net.client_ip), "dev", &c_if],
            ),
            net.in_ns(&net.server_ns, &["link", "set", &s_if, "up"]),
            net.in_ns(&net.client_ns, &["link", "set", &c_if, "up"]),
            net.in_ns(&net.server_ns, &["link", "set", "lo", "up"]),
            net.in_ns(&net.client_ns, &["link", "set", "lo", "up"]),
        ];
        for step in steps {
            if let Err(e) = ip(&step).await {
                net.remove().await;
                return Err(e.context("setting up the partition namespaces (needs iproute2 and root)"));
            }
        }
        Ok(net)
    }

    /// `ip -n NS ARGS...`.
    fn in_ns(&self, ns: &str, args: &[&str]) -> Vec<String> {
        ["-n", ns].iter().chain(args).map(|s| (*s).to_owned()).collect()
    }

    /// A command run inside namespace `ns`.
    fn exec(&self, ns: &str, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(program);
        cmd
    }

    /// The blackhole routes of `kind`: in the client namespace to the
    /// server (requests lost), in the server's to the client (answers lost).
    fn routes(&self, kind: &str) -> Vec<(String, String)> {
        let to_server = (self.client_ns.clone(), format!("{}/32", self.server_ip));
        let to_client = (self.server_ns.clone(), format!("{}/32", self.client_ip));
        match kind {
            "both" => vec![to_server, to_client],
            "client_to_server" => vec![to_server],
            _ => vec![to_client],
        }
    }

    async fn cut(&self, kind: &str) -> anyhow::Result<()> {
        for (ns, dst) in self.routes(kind) {
            ip(&self.in_ns(&ns, &["route", "add", "blackhole", &dst])).await?;
        }
        Ok(())
    }

    async fn heal(&self, kind: &str) -> anyhow::Result<()> {
        for (ns, dst) in self.routes(kind) {
            ip(&self.in_ns(&ns, &["route", "del", "blackhole", &dst])).await?;
        }
        Ok(())
    }

    /// Removes both namespaces (the veth pair goes with them).
    async fn remove(&self) {
        for ns in [&self.server_ns, &self.client_ns] {
            let _ = ip(&["netns".into(), "del".into(), ns.clone()]).await;
        }
    }
}

/// Runs `ip ARGS...`, failing with its error output.
pub(crate) async fn ip(args: &[String]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Waits (bounded) for `child`'s standard output to print a line holding
/// `marker`.
async fn await_line(child: &mut Child, marker: &str) -> anyhow::Result<()> {
    use tokio::io::AsyncBufReadExt as _;
    let out = child.stdout.take().context("stdout piped")?;
    let mut lines = tokio::io::BufReader::new(out).lines();
    tokio::time::timeout(BOUND, async {
        while let Some(line) = lines.next_line().await? {
            if line.contains(marker) {
                return anyhow::Ok(());
            }
        }
        bail!("the process ended before printing {marker:?}")
    })
    .await
    .with_context(|| format!("no {marker:?} within {BOUND:?}"))?
}

/// Waits (bounded) for `file` to hold a line starting with `what`.
async fn await_file_line(file: &Path, what: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    while instant_in(file, what).is_err() {
        if started.elapsed() > BOUND {
            bail!("{} never recorded {what}", file.display());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The instant (Unix µs) of the line `WHAT <µs>` in `file`.
fn instant_in(file: &Path, what: &str) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix(what)?.trim().parse().ok())
        .with_context(|| format!("{} has no {what} line", file.display()))
}

/// Only the partitions (`bagel-chaos partitions`): the report goes to
/// `OUT/partitions.json`, each failed check is printed as a `VIOLATION`
/// line.
pub async fn run_alone(seed: u64, out: &Path) -> anyhow::Result<bool> {
    std::fs::create_dir_all(out)?;
    let out = out.canonicalize()?;
    let server = crate::services::sibling("bagel-server")?;
    let bagel = crate::services::sibling("bagel")?;
    let (report, violations) = match run(&bagel, &server, &out, seed).await {
        Ok(report) => (report, Vec::new()),
        Err(e) => (PartitionReport::default(), vec![format!("{e:#}")]),
    };
    std::fs::write(out.join("partitions.json"), serde_json::to_vec_pretty(&report)?)?;
    for v in &violations {
        println!("VIOLATION {v}");
    }
    Ok(violations.is_empty())
}
