//! The server-CPU floor of a unary lease cycle: bare unary calls that do
//! no lease work, driven in the same run, on the same kind of server, with
//! the same pinning and the same shape as the unary sweep (as many client
//! tasks over as many connections, two calls one after the other per
//! "cycle", closed loop, same warm-up and window), their server CPU read
//! from /proc the same way.
//!
//! Why: a unary lease cycle is two gRPC calls, and each call pays the
//! transport (an HTTP/2 stream, its headers and trailers, a task, tower's
//! layers, the message's encoding) before any lease work. Two bare calls
//! are what no unary cycle can cost less than on this server; a cycle's
//! server CPU over that floor is what its lease work (table, witness,
//! signature share, metering) adds. Measured in the same run as the cycles,
//! the ratio does not depend on the machine or on how busy it was.
//!
//! The bare call is the standard health check (`grpc.health.v1 Check`): it
//! is served by the same listener, connection limits and HTTP/2 stack as the
//! lease service, and its handler reads one flag under a lock and answers
//! two bytes. None of the lease service's own calls is as bare: `Describe`
//! needs a name and looks it up in the table, `SignedNow` reads the clock
//! and copies a signed reading, `ServerInfo` builds an answer of a few
//! hundred bytes.

use serde::Serialize;

use crate::driver::LoadResult;
use crate::report::{Row, Transport};

/// What the bare calls send.
pub const REQUEST: &str = "grpc.health.v1 Check";

/// Bare calls a "cycle" of the floor's load makes, as a lease cycle makes
/// two (acquire, release).
pub const CALLS_PER_CYCLE: u32 = 2;

/// One system's bare calls at one client count.
#[derive(Debug, Clone, Serialize)]
pub struct CpuFloorRow {
    pub system: String,
    /// What was sent (see [`REQUEST`]).
    pub request: String,
    /// Client tasks, each making its calls one after the other.
    pub concurrency: usize,
    pub calls_per_s: f64,
    /// Calls completed in the measured window.
    pub calls: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub duration_s: f64,
    /// Server CPU used, in cores.
    pub server_cpu_cores: Option<f64>,
    /// Server CPU microseconds per bare call (user + system time of the
    /// server process over the window, over the calls).
    pub server_us_per_call: Option<f64>,
    /// The load generator's CPU microseconds per bare call.
    pub client_us_per_call: Option<f64>,
    /// The floor of a unary lease cycle: `server_us_per_call` times the
    /// calls of a cycle ([`CALLS_PER_CYCLE`]).
    pub floor_us_per_cycle: Option<f64>,
    /// Rounds that measured this point; the row is the median round's (by
    /// `server_us_per_call`).
    pub rounds: usize,
    /// Which round measured this row (before the rounds are merged).
    #[serde(skip)]
    pub round: usize,
}

impl CpuFloorRow {
    /// The row of a load whose every cycle made [`CALLS_PER_CYCLE`] bare
    /// calls.
    pub fn from_load(system: &str, concurrency: usize, r: &LoadResult) -> Self {
        let secs = r.elapsed.as_secs_f64();
        let calls = r.cycles * u64::from(CALLS_PER_CYCLE);
        let per_call = |cpu_s: Option<f64>| cpu_s.filter(|_| calls > 0).map(|v| v * 1e6 / calls as f64);
        let server_us_per_call = per_call(r.server_cpu_s);
        CpuFloorRow {
            system: system.to_owned(),
            request: REQUEST.to_owned(),
            concurrency,
            calls_per_s: if secs > 0.0 { calls as f64 / secs } else { 0.0 },
            calls,
            errors: r.errors,
            first_error: r.first_error.clone(),
            duration_s: secs,
            server_cpu_cores: r.server_cpu_s.filter(|_| secs > 0.0).map(|v| v / secs),
            server_us_per_call,
            client_us_per_call: per_call(r.client_cpu_s),
            floor_us_per_cycle: server_us_per_call.map(|v| v * f64::from(CALLS_PER_CYCLE)),
            rounds: 1,
            round: 0,
        }
    }
}

/// Merges the rounds of each (system, concurrency) point into the median
/// round's row (by server CPU per call; the lower middle for an even count,
/// a round without a CPU figure last), keeping the order of first
/// appearance.
pub fn median_of_rounds(rows: Vec<CpuFloorRow>) -> Vec<CpuFloorRow> {
    let mut groups: Vec<Vec<CpuFloorRow>> = Vec::new();
    for row in rows {
        match groups
            .iter_mut()
            .find(|g| g[0].system == row.system && g[0].concurrency == row.concurrency)
        {
            Some(g) => g.push(row),
            None => groups.push(vec![row]),
        }
    }
    groups
        .into_iter()
        .map(|mut g| {
            g.sort_by(|a, b| {
                let key = |r: &CpuFloorRow| r.server_us_per_call.unwrap_or(f64::INFINITY);
                key(a).total_cmp(&key(b))
            });
            let rounds = g.len();
            let mut median = g.swap_remove((rounds - 1) / 2);
            median.rounds = rounds;
            median
        })
        .collect()
}

/// Fills `floor_us_per_cycle` and `server_over_floor` on the unary,
/// closed-loop rows of the floor's system at the floor's concurrency,
/// whatever their number of names (a cycle is two calls either way).
pub fn fill(rows: &mut [Row], floors: &[CpuFloorRow]) {
    for row in rows
        .iter_mut()
        .filter(|r| r.transport == Transport::Unary && !r.paced)
    {
        let floor = floors
            .iter()
            .find(|f| f.system == row.system && f.concurrency == row.concurrency)
            .and_then(|f| f.floor_us_per_cycle)
            .filter(|v| *v > 0.0);
        row.floor_us_per_cycle = floor;
        row.server_over_floor = floor.and_then(|f| row.server_us_per_cycle.map(|v| v / f));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::driver::new_histogram;

    fn load(cycles: u64, server_cpu_s: Option<f64>) -> LoadResult {
        let mut h = new_histogram();
        h.record(100).unwrap();
        LoadResult {
            cycles,
            conflicts: 0,
            errors: 0,
            first_error: None,
            elapsed: Duration::from_secs(4),
            cycle_us: h.clone(),
            acquire_us: h,
            start_lag_us: new_histogram(),
            server_cpu_s,
            client_cpu_s: Some(2.0),
        }
    }

    #[test]
    fn a_cycle_of_the_load_is_two_bare_calls() {
        // 50,000 cycles of two calls in 4 s, 1.6 s of server CPU.
        let row = CpuFloorRow::from_load("bagel", 256, &load(50_000, Some(1.6)));
        assert_eq!(row.calls, 100_000);
        assert_eq!(row.calls_per_s, 25_000.0);
        assert_eq!(row.server_cpu_cores, Some(0.4));
        assert_eq!(row.server_us_per_call, Some(16.0));
        assert_eq!(row.floor_us_per_cycle, Some(32.0));
        assert_eq!(row.client_us_per_call, Some(20.0));
        assert_eq!((row.request.as_str(), row.concurrency), (REQUEST, 256));
    }

    #[test]
    fn no_cpu_figure_or_no_call_makes_no_floor() {
        let row = CpuFloorRow::from_load("bagel", 16, &load(1000, None));
        assert_eq!((row.server_us_per_call, row.floor_us_per_cycle), (None, None));
        let row = CpuFloorRow::from_load("bagel", 16, &load(0, Some(1.0)));
        assert_eq!((row.server_us_per_call, row.floor_us_per_cycle), (None, None));
        assert_eq!(row.calls_per_s, 0.0);
    }

    #[test]
    fn unary_rows_get_their_ratio_to_the_floor_at_the_same_concurrency() {
        let cycle = |sys: &str, transport, names, conc, cycles| {
            let mut l = load(cycles, Some(2.0));
            l.elapsed = Duration::from_secs(2);
            Row::from_load(sys, transport, names, conc, 2, &l)
        };
        let mut rows = vec![
            // 2 s of server CPU over 50,000 cycles: 40 µs a cycle.
            cycle("bagel", Transport::Unary, 1, 256, 50_000),
            cycle("bagel", Transport::Unary, 4, 256, 40_000),
            cycle("bagel", Transport::Unary, 1, 16, 50_000),
            cycle("bagel", Transport::Session, 1, 256, 200_000),
            cycle("redis", Transport::Unary, 1, 256, 400_000),
            cycle("bagel", Transport::Unary, 1, 256, 50_000).paced_at(10.0, 0.5),
        ];
        let floors = [
            CpuFloorRow::from_load("bagel", 256, &load(50_000, Some(1.6))),
            CpuFloorRow::from_load("bagel", 64, &load(50_000, Some(1.0))),
        ];
        fill(&mut rows, &floors);
        assert_eq!(rows[0].floor_us_per_cycle, Some(32.0));
        assert_eq!(rows[0].server_over_floor, Some(40.0 / 32.0));
        assert_eq!(rows[1].server_over_floor, Some(50.0 / 32.0));
        // No floor at 16 clients; none for sessions, other systems, paced.
        for r in &rows[2..] {
            assert_eq!(
                (r.floor_us_per_cycle, r.server_over_floor),
                (None, None),
                "{}",
                r.workload
            );
        }
        let json = serde_json::to_value(&rows[0]).unwrap();
        assert_eq!(json["floor_us_per_cycle"], 32.0);
        assert_eq!(json["server_over_floor"], 1.25);
        assert!(serde_json::to_value(&rows[4]).unwrap()["server_over_floor"].is_null());
    }

    #[test]
    fn rounds_merge_into_the_median_by_cpu_per_call() {
        let round = |conc, cpu, n| {
            let mut r = CpuFloorRow::from_load("bagel", conc, &load(10_000, cpu));
            r.round = n;
            r
        };
        let merged = median_of_rounds(vec![
            round(256, Some(0.3), 0),
            round(16, Some(0.5), 0),
            round(256, Some(0.1), 1),
            round(16, None, 1),
            round(256, Some(0.2), 2),
        ]);
        assert_eq!(merged.len(), 2);
        assert_eq!(
            (merged[0].concurrency, merged[0].round, merged[0].rounds),
            (256, 2, 3)
        );
        assert_eq!(merged[0].server_us_per_call, Some(10.0));
        // Two rounds, one without a CPU figure: the lower middle is the one with it.
        assert_eq!(
            (merged[1].concurrency, merged[1].round, merged[1].rounds),
            (16, 0, 2)
        );
    }
}
