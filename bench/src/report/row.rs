//! One measured point of the lease-cycle sweep, and how the rounds of a
//! point become one row.

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::driver::LoadResult;

/// One measured point.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub system: String,
    /// `acquire-release-<n>-name(s)`, then `-batched`/`-session` for
    /// bagel's batching transports and `-paced` for open-loop points: the
    /// name scripts key on. Made from the typed fields below, never parsed.
    pub workload: String,
    /// How the cycle reached the server.
    pub transport: Transport,
    /// An open-loop point (see `target_per_s`).
    pub paced: bool,
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
    /// Server CPU microseconds per measured cycle: the server process's
    /// user + system time over the measured window (/proc/PID/stat) divided
    /// by the cycles completed in it. Unlike cycles/s this does not depend
    /// on how fast the machine is or on how busy the other core was, so it
    /// is the figure to compare systems by (issue 25).
    pub server_us_per_cycle: Option<f64>,
    /// The same for the load generator (this process: the driver tasks and
    /// each system's client library), from its own CPU accounting.
    pub client_us_per_cycle: Option<f64>,
    /// On bagel rows: bagel cycles/s over etcd's at the same names and
    /// concurrency, from this run.
    pub bagel_over_etcd: Option<f64>,
    pub bagel_over_redis: Option<f64>,
    /// Unary closed-loop rows with a CPU floor in the run (see
    /// `cpu_floor`): the server CPU of two bare calls at the same
    /// concurrency, and `server_us_per_cycle` over it.
    pub floor_us_per_cycle: Option<f64>,
    pub server_over_floor: Option<f64>,
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
    pub start_lag_max_us: Option<u64>,
    /// Open-loop rows only: whether the generator kept its schedule well
    /// enough for the latencies to be the system's: start lag p99 at most
    /// [`TRUSTED_LAG_P99_US`]. A `false` point is flagged in the table.
    pub generator_lag_ok: Option<bool>,
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
    /// `cdf` of every round of this point, the median's included (filled
    /// by `median_of_rounds`): the latency plot's spread between rounds.
    #[serde(skip)]
    pub cdf_rounds: Vec<Vec<(f64, f64)>>,
}

/// The largest generator start-lag p99 (µs) at which a paced point's
/// latencies are taken as the system's, not the load generator's.
pub const TRUSTED_LAG_P99_US: u64 = 100;

/// How a lease cycle reaches the server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// One RPC (or request) per operation: what every system's plain
    /// client does.
    #[default]
    Unary,
    /// bagel's Coalescer over `Batch` calls.
    Batched,
    /// bagel's Coalescer over `Session` streams.
    Session,
}

impl Transport {
    /// The word in workload names and labels; `None` for unary.
    pub fn word(self) -> Option<&'static str> {
        match self {
            Transport::Unary => None,
            Transport::Batched => Some("batched"),
            Transport::Session => Some("session"),
        }
    }
}

/// The workload name scripts read (see [`Row::workload`]).
pub fn workload_name(names: usize, transport: Transport, paced: bool) -> String {
    format!(
        "acquire-release-{names}-name{}{}{}",
        if names == 1 { "" } else { "s" },
        transport.word().map_or(String::new(), |w| format!("-{w}")),
        if paced { "-paced" } else { "" }
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
        transport: Transport,
        names: usize,
        concurrency: usize,
        requests_per_cycle: u32,
        r: &LoadResult,
    ) -> Self {
        let secs = r.elapsed.as_secs_f64();
        let per_s = |x: Option<f64>| x.filter(|_| secs > 0.0).map(|v| v / secs);
        let cycles_per_s = if secs > 0.0 { r.cycles as f64 / secs } else { 0.0 };
        let per_cycle =
            |cpu_s: Option<f64>| cpu_s.filter(|_| r.cycles > 0).map(|v| v * 1e6 / r.cycles as f64);
        Row {
            system: system.to_string(),
            workload: workload_name(names, transport, false),
            transport,
            paced: false,
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
            server_us_per_cycle: per_cycle(r.server_cpu_s),
            client_us_per_cycle: per_cycle(r.client_cpu_s),
            bagel_over_etcd: None,
            bagel_over_redis: None,
            floor_us_per_cycle: None,
            server_over_floor: None,
            target_per_s: None,
            fraction_of_peak: None,
            start_lag_p50_us: (!r.start_lag_us.is_empty()).then(|| r.start_lag_us.value_at_quantile(0.5)),
            start_lag_p99_us: (!r.start_lag_us.is_empty()).then(|| r.start_lag_us.value_at_quantile(0.99)),
            start_lag_max_us: (!r.start_lag_us.is_empty()).then(|| r.start_lag_us.max()),
            generator_lag_ok: None,
            rounds: 1,
            cycles_per_s_min: cycles_per_s,
            cycles_per_s_max: cycles_per_s,
            round: 0,
            cdf: cdf_points(&r.cycle_us),
            cdf_rounds: Vec::new(),
        }
    }
}

impl Row {
    /// Marks the row as an open-loop point offered `target` cycles/s,
    /// `fraction` of its variant's peak.
    #[must_use]
    pub fn paced_at(mut self, target: f64, fraction: f64) -> Self {
        self.paced = true;
        self.workload = workload_name(self.names_per_cycle, self.transport, true);
        self.target_per_s = Some(target);
        self.fraction_of_peak = Some(fraction);
        // No lag recorded at all (no slot in the window) is no evidence.
        self.generator_lag_ok = Some(self.start_lag_p99_us.is_some_and(|p99| p99 <= TRUSTED_LAG_P99_US));
        self
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
            r.transport,
            r.paced,
            r.names_per_cycle,
            (!r.paced).then_some(r.concurrency),
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
            let cdf_rounds = g.iter().map(|r| r.cdf.clone()).collect();
            // The lower middle for an even count: no invented averages.
            let mut median = g.swap_remove((rounds - 1) / 2);
            median.rounds = rounds;
            median.cycles_per_s_min = min;
            median.cycles_per_s_max = max;
            median.cdf_rounds = cdf_rounds;
            median
        })
        .collect()
}

/// Fills `bagel_over_etcd` / `bagel_over_redis` on bagel rows from the
/// other systems' rows of the same run.
pub fn fill_ratios(rows: &mut [Row]) {
    let find = |rows: &[Row], sys: &str, n: usize, c: usize| {
        rows.iter()
            .find(|r| r.system == sys && r.names_per_cycle == n && r.concurrency == c && !r.paced)
            .map(|r| r.cycles_per_s)
    };
    let snapshot = rows.to_vec();
    for row in rows.iter_mut().filter(|r| r.system == "bagel" && !r.paced) {
        let ratio = |other: Option<f64>| other.filter(|v| *v > 0.0).map(|v| row.cycles_per_s / v);
        row.bagel_over_etcd = ratio(find(&snapshot, "etcd", row.names_per_cycle, row.concurrency));
        row.bagel_over_redis = ratio(find(&snapshot, "redis", row.names_per_cycle, row.concurrency));
    }
}
