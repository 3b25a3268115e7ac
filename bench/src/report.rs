//! What a run writes to `--out DIR`: `results.md` (the tables),
//! `results.json` (one row per system, workload and concurrency),
//! `summary.json` (ratios, memory, restart, bags, machine, command) and the PNG
//! plots `throughput.png` and `latency_cdf.png`.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use plotters::prelude::*;
use serde::Serialize;

use crate::bags::BagResults;
use crate::driver::LoadResult;
use crate::floor::FloorRow;
use crate::rss::MemRow;

/// One measured point.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub system: String,
    pub workload: String,
    pub names_per_cycle: usize,
    pub concurrency: usize,
    pub cycles_per_s: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    pub acquire_p50_us: u64,
    pub acquire_p99_us: u64,
    pub acquire_p999_us: u64,
    /// Round trips a successful cycle costs this system's client.
    pub requests_per_cycle: u32,
    pub cycles: u64,
    pub conflicts: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub duration_s: f64,
    /// Server CPU used, in cores (CPU seconds per second).
    pub server_cpu_cores: Option<f64>,
    /// CPU used by the load generator (this process), in cores.
    pub client_cpu_cores: Option<f64>,
    /// On bagel rows: bagel cycles/s over etcd's at the same names and
    /// concurrency, from this run.
    pub bagel_over_etcd: Option<f64>,
    pub bagel_over_redis: Option<f64>,
    /// Open-loop rows only: the offered rate (cycles/s); latencies count from
    /// each cycle's scheduled start.
    pub target_per_s: Option<f64>,
    /// Open-loop rows only: the offered rate as a fraction of the variant's
    /// closed-loop peak (0.5 for the "half of peak" goal).
    pub fraction_of_peak: Option<f64>,
    /// Open-loop rows only: p50 and p99 of how late the load generator
    /// picked cycles up after their scheduled start (already inside the
    /// latencies above; the part that is not the system's).
    pub start_lag_p50_us: Option<u64>,
    pub start_lag_p99_us: Option<u64>,
    /// How many rounds measured this point (`--rounds`); the row is the
    /// median round's (see `median_of_rounds`).
    pub rounds: usize,
    /// Lowest and highest cycles/s over those rounds: the spread a reader
    /// should expect between runs on this machine.
    pub cycles_per_s_min: f64,
    pub cycles_per_s_max: f64,
    /// Which round measured this row (before the rounds are merged).
    #[serde(skip)]
    pub round: usize,
    /// (latency µs, fraction of cycles at or below it): for the CDF plot.
    #[serde(skip)]
    pub cdf: Vec<(f64, f64)>,
}

pub fn workload_name(names: usize) -> String {
    format!(
        "acquire-release-{names}-name{}",
        if names == 1 { "" } else { "s" }
    )
}

fn cdf_points(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    if h.is_empty() {
        return Vec::new();
    }
    let mut qs: Vec<f64> = (0..=98).map(|i| f64::from(i) / 100.0).collect();
    qs.extend([0.99, 0.995, 0.999, 0.9995, 0.9999, 1.0]);
    qs.into_iter()
        .map(|q| (h.value_at_quantile(q) as f64, q))
        .collect()
}

impl Row {
    pub fn from_load(
        system: &str,
        names: usize,
        concurrency: usize,
        requests_per_cycle: u32,
        r: &LoadResult,
    ) -> Self {
        let secs = r.elapsed.as_secs_f64();
        let per_s = |x: Option<f64>| x.filter(|_| secs > 0.0).map(|v| v / secs);
        let cycles_per_s = if secs > 0.0 { r.cycles as f64 / secs } else { 0.0 };
        Row {
            system: system.to_string(),
            workload: workload_name(names),
            names_per_cycle: names,
            concurrency,
            cycles_per_s,
            p50_us: r.cycle_us.value_at_quantile(0.5),
            p99_us: r.cycle_us.value_at_quantile(0.99),
            p999_us: r.cycle_us.value_at_quantile(0.999),
            max_us: r.cycle_us.max(),
            acquire_p50_us: r.acquire_us.value_at_quantile(0.5),
            acquire_p99_us: r.acquire_us.value_at_quantile(0.99),
            acquire_p999_us: r.acquire_us.value_at_quantile(0.999),
            requests_per_cycle,
            cycles: r.cycles,
            conflicts: r.conflicts,
            errors: r.errors,
            first_error: r.first_error.clone(),
            duration_s: secs,
            server_cpu_cores: per_s(r.server_cpu_s),
            client_cpu_cores: per_s(r.client_cpu_s),
            bagel_over_etcd: None,
            bagel_over_redis: None,
            target_per_s: None,
            fraction_of_peak: None,
            start_lag_p50_us: (!r.start_lag_us.is_empty()).then(|| r.start_lag_us.value_at_quantile(0.5)),
            start_lag_p99_us: (!r.start_lag_us.is_empty()).then(|| r.start_lag_us.value_at_quantile(0.99)),
            rounds: 1,
            cycles_per_s_min: cycles_per_s,
            cycles_per_s_max: cycles_per_s,
            round: 0,
            cdf: cdf_points(&r.cycle_us),
        }
    }
}

/// Merges the rounds of each point into one row: the median round's
/// (by cycles/s for closed-loop points, by acquire p99 for paced ones),
/// with the spread of cycles/s over all rounds. The order of first
/// appearance is kept.
///
/// Why rounds at all: on a shared 2-core machine one point can land
/// 10-30 % off its neighbour run's; repeating the whole sweep, one system
/// after the other each round, spreads slow phases of the machine over
/// every system instead of charging them to whichever ran then.
pub fn median_of_rounds(rows: Vec<Row>) -> Vec<Row> {
    // A paced point runs with as many clients as reached its round's peak,
    // which may differ between rounds: it is one point whatever the count.
    let key = |r: &Row| {
        (
            r.system.clone(),
            r.workload.clone(),
            r.names_per_cycle,
            r.target_per_s.is_none().then_some(r.concurrency),
        )
    };
    let mut groups: Vec<Vec<Row>> = Vec::new();
    for row in rows {
        match groups.iter_mut().find(|g| key(&g[0]) == key(&row)) {
            Some(g) => g.push(row),
            None => groups.push(vec![row]),
        }
    }
    groups
        .into_iter()
        .map(|mut g| {
            if g[0].target_per_s.is_some() {
                g.sort_by_key(|r| r.acquire_p99_us);
            } else {
                g.sort_by(|a, b| a.cycles_per_s.total_cmp(&b.cycles_per_s));
            }
            let min = g.iter().map(|r| r.cycles_per_s).fold(f64::INFINITY, f64::min);
            let max = g.iter().map(|r| r.cycles_per_s).fold(0.0, f64::max);
            let rounds = g.len();
            // The lower middle for an even count: no invented averages.
            let mut median = g.swap_remove((rounds - 1) / 2);
            median.rounds = rounds;
            median.cycles_per_s_min = min;
            median.cycles_per_s_max = max;
            median
        })
        .collect()
}

/// Fills `bagel_over_etcd` / `bagel_over_redis` on bagel rows from the
/// other systems' rows of the same run.
pub fn fill_ratios(rows: &mut [Row]) {
    let find = |rows: &[Row], sys: &str, n: usize, c: usize| {
        rows.iter()
            .find(|r| {
                r.system == sys && r.names_per_cycle == n && r.concurrency == c && r.target_per_s.is_none()
            })
            .map(|r| r.cycles_per_s)
    };
    let snapshot = rows.to_vec();
    for row in rows
        .iter_mut()
        .filter(|r| r.system == "bagel" && r.target_per_s.is_none())
    {
        let ratio = |other: Option<f64>| other.filter(|v| *v > 0.0).map(|v| row.cycles_per_s / v);
        row.bagel_over_etcd = ratio(find(&snapshot, "etcd", row.names_per_cycle, row.concurrency));
        row.bagel_over_redis = ratio(find(&snapshot, "redis", row.names_per_cycle, row.concurrency));
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RestartRow {
    pub max_ttl_s: f64,
    /// From spawning the process to its first granted lease.
    pub ready_after_s: f64,
    pub ready_over_max_ttl: f64,
}

/// Something the run could not measure, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Missing {
    pub what: String,
    pub why: String,
}

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub command: String,
    pub started_at: String,
    pub machine: Machine,
    pub settings: serde_json::Value,
    pub rows: Vec<Row>,
    pub memory: Vec<MemRow>,
    pub restart: Vec<RestartRow>,
    /// One client's no-op round trip per system (bagel, Redis).
    pub floor: Vec<FloorRow>,
    /// POSIX bag writes/s, S3 PUTs per batch, metronome lag.
    pub bags: BagResults,
    pub missing: Vec<Missing>,
    /// System → how its server ran (version, data on tmpfs or not).
    pub servers: Vec<(String, String)>,
}

#[derive(Debug, Default, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu: String,
    pub kernel: String,
    pub mem_total: String,
    /// /proc/loadavg when the run started: other work on the machine skews
    /// every number.
    pub loadavg_at_start: String,
}

impl Machine {
    pub fn detect() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let field = |text: &str, key: &str| {
            text.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default()
        };
        Machine {
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu: field(&cpuinfo, "model name"),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            mem_total: field(&meminfo, "MemTotal"),
            loadavg_at_start: std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

fn fmt_opt(x: Option<f64>, digits: usize) -> String {
    x.map_or_else(|| "–".to_string(), |v| format!("{v:.digits$}"))
}

/// How a bagel workload reached the server: `batched` (Coalescer over
/// `Batch` calls), `session` (Coalescer over a `Session` stream), or
/// `None` for one unary RPC per operation (and for the other systems).
fn variant(workload: &str) -> Option<&'static str> {
    let workload = workload.split("-paced").next().unwrap_or(workload);
    ["batched", "session"]
        .into_iter()
        .find(|v| workload.ends_with(&format!("-{v}")))
}

/// `bagel (batched)` / `bagel (session)` for those workloads, else the system.
fn system_label(r: &Row) -> String {
    match variant(&r.workload) {
        Some(v) => format!("{} ({v})", r.system),
        None => r.system.clone(),
    }
}

/// "min–max (n)" of a point's cycles/s over its rounds; "–" for one round.
fn fmt_spread(r: &Row) -> String {
    if r.rounds <= 1 {
        return "–".into();
    }
    format!(
        "{}–{} ({})",
        fmt_rate(r.cycles_per_s_min),
        fmt_rate(r.cycles_per_s_max),
        r.rounds
    )
}

fn fmt_rate(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

impl Report {
    pub fn markdown(&self) -> String {
        let mut md = String::new();
        let m = &self.machine;
        let _ = writeln!(md, "# bagel benchmark results\n");
        let _ = writeln!(
            md,
            "Run {} on {} cores ({}), {} RAM, Linux {}; clients and servers share the machine \
             (load average at start: {}).\n",
            self.started_at, m.cores, m.cpu, m.mem_total, m.kernel, m.loadavg_at_start
        );
        let _ = writeln!(md, "Command: `{}`\n", self.command);
        for (sys, how) in &self.servers {
            let _ = writeln!(md, "* {sys}: {how}");
        }
        let _ = writeln!(md, "\n## Lease cycles (acquire + release)\n");
        let _ = writeln!(
            md,
            "| system | names | clients | cycles/s | min–max of rounds | p50 µs | p99 µs | p99.9 µs | acquire p99 µs | RTT/cycle | server CPU (cores) | client CPU (cores) | conflicts | errors |"
        );
        let _ = writeln!(md, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
        for r in self.rows.iter().filter(|r| r.target_per_s.is_none()) {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                system_label(r),
                r.names_per_cycle,
                r.concurrency,
                fmt_rate(r.cycles_per_s),
                fmt_spread(r),
                r.p50_us,
                r.p99_us,
                r.p999_us,
                r.acquire_p99_us,
                r.requests_per_cycle,
                fmt_opt(r.server_cpu_cores, 2),
                fmt_opt(r.client_cpu_cores, 2),
                r.conflicts,
                r.errors
            );
        }
        let bagel: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| r.system == "bagel" && r.target_per_s.is_none())
            .collect();
        if !bagel.is_empty() {
            let _ = writeln!(md, "\n## bagel over the others (same run, same concurrency)\n");
            let _ = writeln!(
                md,
                "| bagel | names | clients | bagel cycles/s | ÷ etcd | ÷ Redis |"
            );
            let _ = writeln!(md, "|---|--:|--:|--:|--:|--:|");
            for r in bagel {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} |",
                    variant(&r.workload).unwrap_or("unary"),
                    r.names_per_cycle,
                    r.concurrency,
                    fmt_rate(r.cycles_per_s),
                    fmt_opt(r.bagel_over_etcd, 1),
                    fmt_opt(r.bagel_over_redis, 2)
                );
            }
        }
        let paced: Vec<&Row> = self.rows.iter().filter(|r| r.target_per_s.is_some()).collect();
        if !paced.is_empty() {
            let _ = writeln!(md, "\n## Paced below the peak (open loop)\n");
            let _ = writeln!(
                md,
                "| system | names | clients | of peak | offered/s | achieved/s | acquire p50 µs | acquire p99 µs | acquire p99.9 µs | cycle p99 µs | start lag p50/p99 µs |"
            );
            let _ = writeln!(md, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
            for r in paced {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} |",
                    system_label(r),
                    r.names_per_cycle,
                    r.concurrency,
                    fmt_opt(r.fraction_of_peak, 2),
                    fmt_rate(r.target_per_s.unwrap_or_default()),
                    fmt_rate(r.cycles_per_s),
                    r.acquire_p50_us,
                    r.acquire_p99_us,
                    r.acquire_p999_us,
                    r.p99_us,
                    fmt_opt(r.start_lag_p50_us.map(|v| v as f64), 0),
                    fmt_opt(r.start_lag_p99_us.map(|v| v as f64), 0)
                );
            }
        }
        if !self.floor.is_empty() {
            let _ = writeln!(
                md,
                "\n## Round-trip floor (one client, a no-op request, back to back)\n"
            );
            let _ = writeln!(md, "| system | request | calls | p50 µs | p99 µs |");
            let _ = writeln!(md, "|---|---|--:|--:|--:|");
            for f in &self.floor {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} |",
                    f.system, f.request, f.calls, f.p50_us, f.p99_us
                );
            }
        }
        if !self.memory.is_empty() {
            let _ = writeln!(md, "\n## Memory with concurrently held leases\n");
            let _ = writeln!(
                md,
                "| system | leases held | RSS before MiB | RSS after MiB | bytes/lease | fill time s |"
            );
            let _ = writeln!(md, "|---|--:|--:|--:|--:|--:|");
            for r in &self.memory {
                let _ = writeln!(
                    md,
                    "| {} | {} | {:.1} | {:.1} | {:.0} | {:.1} |",
                    r.system,
                    r.leases,
                    r.rss_before_bytes as f64 / 1048576.0,
                    r.rss_after_mib(),
                    r.bytes_per_lease,
                    r.fill_s
                );
            }
        }
        if !self.restart.is_empty() {
            let _ = writeln!(md, "\n## bagel restart to ready\n");
            let _ = writeln!(md, "| max TTL s | first grant after s | ÷ max TTL |");
            let _ = writeln!(md, "|--:|--:|--:|");
            for r in &self.restart {
                let _ = writeln!(
                    md,
                    "| {:.1} | {:.2} | {:.2} |",
                    r.max_ttl_s, r.ready_after_s, r.ready_over_max_ttl
                );
            }
        }
        self.bags_markdown(&mut md);
        if !self.missing.is_empty() {
            let _ = writeln!(md, "\n## Not measured in this run\n");
            for x in &self.missing {
                let _ = writeln!(md, "* **{}**: {}", x.what, x.why);
            }
        }
        let _ = writeln!(md, "\n## Plots\n");
        let _ = writeln!(md, "![throughput vs clients](throughput.png)\n");
        let _ = writeln!(md, "![latency CDF](latency_cdf.png)");
        md
    }

    fn bags_markdown(&self, md: &mut String) {
        let b = &self.bags;
        if !b.writes.is_empty() {
            let _ = writeln!(md, "\n## Bag writes, one writer, 100-byte payloads\n");
            let _ = writeln!(
                md,
                "| store | directory on | fsync | batch | msgs/s | batch p50 µs | batch p99 µs | batches | errors |"
            );
            let _ = writeln!(md, "|---|---|---|--:|--:|--:|--:|--:|--:|");
            for r in &b.writes {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {:.0} | {} | {} | {} | {} |",
                    r.store,
                    r.medium,
                    if r.sync { "on" } else { "off" },
                    r.batch,
                    r.messages_per_s,
                    r.batch_p50_us,
                    r.batch_p99_us,
                    r.batches,
                    r.errors
                );
            }
        }
        if !b.s3_puts.is_empty() {
            let _ = writeln!(md, "\n## S3 requests per bag batch (moto, happy path)\n");
            let _ = writeln!(
                md,
                "| batch | batches | PUTs | PUTs/batch | batches over two seconds | GETs | HEADs | LISTs | msgs/s | batch p50 µs | errors |"
            );
            let _ = writeln!(md, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
            for r in &b.s3_puts {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {:.3} | {} | {} | {} | {} | {:.0} | {} | {} |",
                    r.batch,
                    r.batches,
                    r.puts,
                    r.puts_per_batch,
                    r.straddling_batches,
                    r.gets,
                    r.heads,
                    r.lists,
                    r.messages_per_s,
                    r.batch_p50_us,
                    r.errors
                );
            }
        }
        if !b.metronome.is_empty() {
            let _ = writeln!(md, "\n## Metronome lag (close done − bag close time)\n");
            let _ = writeln!(
                md,
                "| store | grace ms | ticks | bags closed | lag p50 ms | lag max ms | run s | errors |"
            );
            let _ = writeln!(md, "|---|--:|--:|--:|--:|--:|--:|--:|");
            for r in &b.metronome {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {} |",
                    r.store,
                    r.grace_ms,
                    r.ticks,
                    r.bags_closed,
                    r.lag_p50_ms,
                    r.lag_max_ms,
                    r.duration_s,
                    r.errors
                );
            }
        }
    }

    /// Writes every output file into `dir`; a plot that cannot be drawn is
    /// reported, not fatal.
    pub fn write(&self, dir: &Path, font: Option<&Path>) -> Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut written = Vec::new();
        let md = dir.join("results.md");
        std::fs::write(&md, self.markdown())?;
        written.push(md);
        let json = dir.join("results.json");
        std::fs::write(&json, serde_json::to_string_pretty(&self.rows)?)?;
        written.push(json);
        let summary = dir.join("summary.json");
        std::fs::write(&summary, serde_json::to_string_pretty(self)?)?;
        written.push(summary);
        match font.map(load_font).transpose() {
            Ok(Some(())) => {
                for (name, draw) in [
                    (
                        "throughput.png",
                        plot_throughput as fn(&[Row], &Path) -> Result<()>,
                    ),
                    ("latency_cdf.png", plot_cdf),
                ] {
                    let path = dir.join(name);
                    match draw(&self.rows, &path) {
                        Ok(()) => written.push(path),
                        Err(e) => eprintln!("warning: could not draw {name}: {e:#}"),
                    }
                }
            }
            Ok(None) => eprintln!("warning: no font file found; plots skipped (install fonts-dejavu-core)"),
            Err(e) => eprintln!("warning: plots skipped: {e:#}"),
        }
        Ok(written)
    }
}

fn load_font(path: &Path) -> Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    // plotters keeps fonts for the life of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow::anyhow!("{} is not a usable font", path.display()))
}

fn color(system: &str) -> RGBColor {
    match system {
        "bagel" => RGBColor(214, 39, 40),
        "etcd" => RGBColor(31, 119, 180),
        "redis" => RGBColor(44, 160, 44),
        "s3" => RGBColor(148, 103, 189),
        _ => RGBColor(90, 90, 90),
    }
}

/// (system, names, workload) series in a stable order.
fn series(rows: &[Row]) -> Vec<(String, usize, String)> {
    let set: BTreeSet<(String, usize, String)> = rows
        .iter()
        .filter(|r| r.target_per_s.is_none())
        .map(|r| (r.system.clone(), r.names_per_cycle, r.workload.clone()))
        .collect();
    set.into_iter().collect()
}

fn label(system: &str, names: usize, workload: &str) -> String {
    format!(
        "{system}{}, {names} name{}",
        variant(workload).map_or(String::new(), |v| format!(" {v}")),
        if names == 1 { "" } else { "s" }
    )
}

/// Batched series are drawn in a lighter shade of their system's color,
/// session series in a darker one.
fn series_color(system: &str, workload: &str) -> RGBColor {
    let c = color(system);
    match variant(workload) {
        Some("batched") => RGBColor(c.0 / 2 + 127, c.1 / 2 + 127, c.2 / 2 + 127),
        Some(_) => RGBColor(c.0 / 2, c.1 / 2, c.2 / 2),
        None => c,
    }
}

fn plot_throughput(rows: &[Row], path: &Path) -> Result<()> {
    let pts: Vec<&Row> = rows
        .iter()
        .filter(|r| r.cycles_per_s > 0.0 && r.target_per_s.is_none())
        .collect();
    anyhow::ensure!(!pts.is_empty(), "no data");
    let cmax = pts.iter().map(|r| r.concurrency).max().unwrap_or(1) as f64;
    let ymax = pts.iter().map(|r| r.cycles_per_s).fold(1.0, f64::max);
    let ymin = pts.iter().map(|r| r.cycles_per_s).fold(f64::MAX, f64::min);
    let root = BitMapBackend::new(path, (1000, 650)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Lease cycles per second vs concurrent clients",
            ("sans-serif", 24),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(75)
        .build_cartesian_2d(
            (0.8f64..cmax * 1.25).log_scale(),
            // Headroom above the highest series for the legend.
            (ymin / 2.0..ymax * 12.0).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("concurrent clients")
        .y_desc("cycles/s")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(("sans-serif", 15))
        .draw()?;
    for (sys, names, workload) in series(rows) {
        let mut line: Vec<(f64, f64)> = pts
            .iter()
            .filter(|r| r.system == sys && r.workload == workload)
            .map(|r| (r.concurrency as f64, r.cycles_per_s))
            .collect();
        line.sort_by(|a, b| a.0.total_cmp(&b.0));
        let c = series_color(&sys, &workload);
        let width = if names == 1 { 3 } else { 1 };
        chart
            .draw_series(LineSeries::new(line.clone(), c.stroke_width(width)))?
            .label(label(&sys, names, &workload))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(width)));
        chart.draw_series(line.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

fn plot_cdf(rows: &[Row], path: &Path) -> Result<()> {
    let concurrencies: Vec<usize> = rows
        .iter()
        .filter(|r| !r.cdf.is_empty())
        .map(|r| r.concurrency)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    anyhow::ensure!(!concurrencies.is_empty(), "no data");
    let cols = concurrencies.len().min(2);
    let nrows = concurrencies.len().div_ceil(cols);
    let root = BitMapBackend::new(path, (600 * cols as u32, 420 * nrows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let xmin = rows
        .iter()
        .flat_map(|r| r.cdf.iter().map(|p| p.0))
        .fold(f64::MAX, f64::min)
        .max(1.0);
    let xmax = rows
        .iter()
        .flat_map(|r| r.cdf.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    for (panel, &conc) in root.split_evenly((nrows, cols)).iter().zip(&concurrencies) {
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!(
                    "Cycle latency CDF, {conc} client{}",
                    if conc == 1 { "" } else { "s" }
                ),
                ("sans-serif", 20),
            )
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d((xmin / 1.5..xmax * 1.5).log_scale(), 0f64..1f64)?;
        chart
            .configure_mesh()
            .x_desc("latency µs (log)")
            .y_desc("fraction of cycles")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .label_style(("sans-serif", 13))
            .draw()?;
        for (sys, names, workload) in series(rows) {
            let Some(r) = rows.iter().find(|r| {
                r.system == sys && r.workload == workload && r.concurrency == conc && r.target_per_s.is_none()
            }) else {
                continue;
            };
            if r.cdf.is_empty() {
                continue;
            }
            let c = series_color(&sys, &workload);
            let width = if names == 1 { 2 } else { 1 };
            chart
                .draw_series(LineSeries::new(r.cdf.clone(), c.stroke_width(width)))?
                .label(label(&sys, names, &workload))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(width)));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 12))
            .position(SeriesLabelPosition::LowerRight)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::new_histogram;
    use std::time::Duration;

    fn load(cycles: u64) -> LoadResult {
        let mut h = new_histogram();
        for v in 1..=cycles {
            h.record(v).unwrap();
        }
        LoadResult {
            cycles,
            conflicts: 0,
            errors: 0,
            first_error: None,
            elapsed: Duration::from_secs(2),
            cycle_us: h.clone(),
            acquire_us: h,
            start_lag_us: new_histogram(),
            server_cpu_s: Some(1.0),
            client_cpu_s: None,
        }
    }

    #[test]
    fn json_rows_have_the_documented_keys_and_ratios() {
        let mut rows = vec![
            Row::from_load("etcd", 1, 16, 3, &load(1000)),
            Row::from_load("redis", 1, 16, 2, &load(4000)),
            Row::from_load("bagel", 1, 16, 2, &load(10000)),
        ];
        fill_ratios(&mut rows);
        let v = serde_json::to_value(&rows).unwrap();
        let arr = v.as_array().unwrap();
        assert_eq!(arr.len(), 3);
        for row in arr {
            for key in [
                "system",
                "workload",
                "names_per_cycle",
                "concurrency",
                "cycles_per_s",
                "p50_us",
                "p99_us",
                "p999_us",
            ] {
                assert!(row.get(key).is_some(), "missing {key}");
            }
            assert!(row.get("cdf").is_none());
        }
        let bagel = &arr[2];
        assert_eq!(bagel["cycles_per_s"], 5000.0);
        assert_eq!(bagel["bagel_over_etcd"], 10.0);
        assert_eq!(bagel["bagel_over_redis"], 2.5);
        // hdrhistogram keeps 3 significant digits.
        let p50 = bagel["p50_us"].as_u64().unwrap();
        assert!((4990..=5010).contains(&p50), "{p50}");
        assert_eq!(arr[0]["server_cpu_cores"], 0.5);
    }

    #[test]
    fn markdown_lists_rows_and_missing_parts() {
        let mut report = Report {
            command: "bench/run.sh --quick".into(),
            ..Default::default()
        };
        report.rows.push(Row::from_load("redis", 4, 64, 2, &load(100)));
        report.floor.push(FloorRow {
            system: "redis".into(),
            request: "PING".into(),
            calls: 1000,
            p50_us: 140,
            p99_us: 300,
        });
        report.missing.push(Missing {
            what: "metronome lag".into(),
            why: "needs the client library".into(),
        });
        let md = report.markdown();
        assert!(md.contains("| redis | 4 | 64 | 50.0 |"), "{md}");
        assert!(md.contains("| redis | PING | 1000 | 140 | 300 |"), "{md}");
        assert!(md.contains("`bench/run.sh --quick`"));
        assert!(md.contains("**metronome lag**"));
    }

    #[test]
    fn rounds_merge_into_the_median_round_with_the_spread() {
        let point = |sys: &str, conc, cycles, round| {
            let mut r = Row::from_load(sys, 1, conc, 2, &load(cycles));
            r.round = round;
            r
        };
        let paced = |p99, round| {
            // The round's peak, and so the paced point's clients, may differ.
            let mut r = point("bagel", if round == 1 { 64 } else { 256 }, 1000, round);
            r.workload.push_str("-paced");
            r.target_per_s = Some(500.0);
            r.acquire_p99_us = p99;
            r
        };
        let rows = vec![
            point("bagel", 16, 3000, 0),
            point("redis", 16, 800, 0),
            paced(900, 0),
            point("bagel", 16, 1000, 1),
            point("redis", 16, 1200, 1),
            paced(5000, 1),
            point("bagel", 16, 2000, 2),
            paced(700, 2),
        ];
        let merged = median_of_rounds(rows);
        assert_eq!(merged.len(), 3, "one row per point");
        let (bagel, redis, paced) = (&merged[0], &merged[1], &merged[2]);
        assert_eq!((bagel.system.as_str(), bagel.round), ("bagel", 2));
        assert_eq!(bagel.cycles_per_s, 1000.0);
        assert_eq!((bagel.cycles_per_s_min, bagel.cycles_per_s_max), (500.0, 1500.0));
        assert_eq!(bagel.rounds, 3);
        // Two rounds: the lower one, not an average.
        assert_eq!((redis.cycles_per_s, redis.rounds), (400.0, 2));
        // Paced points: the median tail.
        assert_eq!((paced.acquire_p99_us, paced.round, paced.rounds), (900, 0, 3));
        let md = Report {
            rows: merged.clone(),
            ..Default::default()
        }
        .markdown();
        assert!(md.contains("| bagel | 1 | 16 | 1000 | 500–1500 (3) |"), "{md}");
    }

    #[test]
    fn paced_rows_show_the_generators_lag_and_stay_out_of_the_ratios() {
        let closed = |sys: &str, cycles| Row::from_load(sys, 1, 256, 2, &load(cycles));
        let paced = |sys: &str, cycles, lag_us: u64| {
            let mut r = load(cycles);
            r.start_lag_us.record_n(100, 95).unwrap();
            r.start_lag_us.record_n(lag_us, 5).unwrap();
            let mut row = Row::from_load(sys, 1, 256, 2, &r);
            row.workload.push_str("-paced");
            row.target_per_s = Some(cycles as f64 / 2.0);
            row.fraction_of_peak = Some(0.5);
            row
        };
        let mut report = Report {
            rows: vec![
                closed("bagel", 2000),
                closed("redis", 1000),
                paced("bagel", 1000, 900),
                paced("redis", 500, 1000),
            ],
            ..Default::default()
        };
        fill_ratios(&mut report.rows);
        // Only the closed-loop rows are compared.
        assert_eq!(report.rows[0].bagel_over_redis, Some(2.0));
        assert_eq!(report.rows[2].bagel_over_redis, None);
        assert_eq!(report.rows[3].start_lag_p50_us, Some(100));
        assert_eq!(report.rows[3].start_lag_p99_us, Some(1000));
        assert_eq!(report.rows[0].start_lag_p50_us, None);
        let md = report.markdown();
        let section = md
            .split("## Paced below the peak")
            .nth(1)
            .expect("a paced section");
        assert!(
            section.contains("| bagel | 1 | 256 | 0.50 | 500 | 500 |"),
            "{section}"
        );
        assert!(
            section.contains("| redis | 1 | 256 | 0.50 | 250 | 250 |"),
            "{section}"
        );
        assert!(section.contains("| 100 / 900 |"), "{section}");
        assert!(section.contains("| 100 / 1000 |"), "{section}");
    }

    #[test]
    fn writes_files_without_a_font() {
        let dir = tempfile::tempdir().unwrap();
        let report = Report {
            rows: vec![Row::from_load("s3", 1, 1, 3, &load(10))],
            ..Default::default()
        };
        let written = report.write(dir.path(), None).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["results.md", "results.json", "summary.json"]);
    }
}
