//! What a run writes to `--out DIR`: `results.md` (the tables),
//! `results.json` (one row per system, workload and concurrency),
//! `summary.json` (ratios, memory, restart, bags, machine, command) and the PNG
//! plots `throughput.png` and `latency_cdf.png`.

mod machine;
mod markdown;
mod plots;
mod row;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

pub use machine::Machine;
pub use row::{Row, Transport, fill_ratios, median_of_rounds};

use crate::bags::BagResults;
use crate::cpu_floor::{self, CpuFloorRow};
use crate::floor::FloorRow;
use crate::rss::MemRow;

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

/// Where the main sweep's servers and load generator ran.
#[derive(Debug, Default, Serialize)]
pub struct Pinning {
    pub server_cpus: Option<String>,
    pub client_cpus: Option<String>,
    /// Worker threads of the load generator's runtime.
    pub client_threads: usize,
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
    /// Server CPU of bare unary calls at each client count of the unary
    /// sweep: the floor of a unary cycle (see `cpu_floor`).
    pub cpu_floor: Vec<CpuFloorRow>,
    /// POSIX bag writes/s, S3 PUTs per batch, metronome lag.
    pub bags: BagResults,
    /// Cycles/s through the cluster client against several servers.
    pub cluster: Vec<crate::cluster::ClusterRow>,
    /// Peak single-name cycles/s per system against server cores
    /// (`--scaling`); empty without the sweep.
    pub scaling: Vec<crate::scaling::ScalingRow>,
    /// What the scaling sweep skipped, and where clients shared CPUs.
    pub scaling_notes: Vec<String>,
    /// `--server-cpus` / `--client-cpus` of the main sweep (`null`:
    /// unpinned).
    pub pinning: Pinning,
    pub missing: Vec<Missing>,
    /// System → how its server ran (version, data on tmpfs or not).
    pub servers: Vec<(String, String)>,
}

impl Report {
    /// Merges the rounds of the lease rows and of the CPU floor into one
    /// row per point, then fills the ratios between them.
    pub fn merge_rounds(&mut self) {
        self.rows = median_of_rounds(std::mem::take(&mut self.rows));
        self.cpu_floor = cpu_floor::median_of_rounds(std::mem::take(&mut self.cpu_floor));
        fill_ratios(&mut self.rows);
        cpu_floor::fill(&mut self.rows, &self.cpu_floor);
    }

    /// Writes `results.md`, `results.json` and `summary.json` into `dir`.
    pub fn write_tables(&self, dir: &Path) -> Result<Vec<PathBuf>> {
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
        Ok(written)
    }

    /// Writes every output file into `dir`; a plot that cannot be drawn is
    /// reported, not fatal.
    pub fn write(&self, dir: &Path, font: Option<&Path>) -> Result<Vec<PathBuf>> {
        let mut written = self.write_tables(dir)?;
        match font.map(plots::load_font).transpose() {
            Ok(Some(())) => {
                for (name, draw) in [
                    (
                        "throughput.png",
                        plots::plot_throughput as fn(&Report, &Path) -> Result<()>,
                    ),
                    ("latency_cdf.png", plots::plot_cdf),
                ] {
                    let path = dir.join(name);
                    match draw(self, &path) {
                        Ok(()) => written.push(path),
                        Err(e) => eprintln!("warning: could not draw {name}: {e:#}"),
                    }
                }
                if !self.scaling.is_empty() {
                    let path = dir.join("scaling.png");
                    match plots::plot_scaling(self, &path) {
                        Ok(()) => written.push(path),
                        Err(e) => eprintln!("warning: could not draw scaling.png: {e:#}"),
                    }
                }
            }
            Ok(None) => eprintln!("warning: no font file found; plots skipped (install fonts-dejavu-core)"),
            Err(e) => eprintln!("warning: plots skipped: {e:#}"),
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{LoadResult, new_histogram};
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
            Row::from_load("etcd", Transport::Unary, 1, 16, 3, &load(1000)),
            Row::from_load("redis", Transport::Unary, 1, 16, 2, &load(4000)),
            Row::from_load("bagel", Transport::Unary, 1, 16, 2, &load(10000)),
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
        // 1 s of server CPU over 1000 cycles; no client figure, no ratio.
        assert_eq!(arr[0]["server_us_per_cycle"], 1000.0);
        assert_eq!(arr[2]["server_us_per_cycle"], 100.0);
        assert!(arr[0]["client_us_per_cycle"].is_null());
    }

    #[test]
    fn markdown_lists_rows_and_missing_parts() {
        let mut report = Report {
            command: "bench/run.sh --quick".into(),
            ..Default::default()
        };
        report
            .rows
            .push(Row::from_load("redis", Transport::Unary, 4, 64, 2, &load(100)));
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
        // CPU per cycle: 1 s of server CPU over 100 cycles.
        assert!(md.contains("| 0.50 | – | 10000.0 | – | 0 | 0 |"), "{md}");
        assert!(md.contains("| redis | PING | 1000 | 140 | 300 |"), "{md}");
        assert!(md.contains("`bench/run.sh --quick`"));
        assert!(md.contains("**metronome lag**"));
    }

    #[test]
    fn rounds_merge_into_the_median_round_with_the_spread() {
        let point = |sys: &str, conc, cycles, round| {
            let mut r = Row::from_load(sys, Transport::Unary, 1, conc, 2, &load(cycles));
            r.round = round;
            r
        };
        let paced = |p99, round| {
            // The round's peak, and so the paced point's clients, may differ.
            let mut r = point("bagel", if round == 1 { 64 } else { 256 }, 1000, round).paced_at(500.0, 0.5);
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
        let closed = |sys: &str, cycles| Row::from_load(sys, Transport::Unary, 1, 256, 2, &load(cycles));
        let paced = |sys: &str, cycles, lag_us: u64| {
            let mut r = load(cycles);
            r.start_lag_us.record_n(100, 95).unwrap();
            r.start_lag_us.record_n(lag_us, 5).unwrap();
            Row::from_load(sys, Transport::Unary, 1, 256, 2, &r).paced_at(cycles as f64 / 2.0, 0.5)
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
        // p50 / p99 / max of the generator's lag, and the flag: p99 above
        // 100 µs makes the point untrustworthy.
        assert!(
            section.contains("| 100 / 900 / 900 | **no** (generator lag) |"),
            "{section}"
        );
        assert!(
            section.contains("| 100 / 1000 / 1000 | **no** (generator lag) |"),
            "{section}"
        );
        assert_eq!(report.rows[3].generator_lag_ok, Some(false));
        assert_eq!(report.rows[0].generator_lag_ok, None);
        let mut calm = load(100);
        calm.start_lag_us.record_n(20, 99).unwrap();
        calm.start_lag_us.record(300).unwrap();
        let calm = Row::from_load("redis", Transport::Unary, 1, 8, 2, &calm).paced_at(50.0, 0.5);
        assert_eq!(
            (calm.start_lag_p99_us, calm.start_lag_max_us),
            (Some(20), Some(300))
        );
        assert_eq!(calm.generator_lag_ok, Some(true));
    }

    #[test]
    fn the_cpu_floor_merges_and_shows_beside_the_unary_cycles() {
        let floor = |cpu_s, round| {
            let mut l = load(50_000);
            l.server_cpu_s = Some(cpu_s);
            let mut f = CpuFloorRow::from_load("bagel", 256, &l);
            f.round = round;
            f
        };
        let mut report = Report {
            // 1 s of server CPU over 20,000 cycles: 50 µs a cycle.
            rows: vec![
                Row::from_load("bagel", Transport::Unary, 1, 256, 2, &load(20_000)),
                Row::from_load("redis", Transport::Unary, 1, 256, 2, &load(20_000)),
            ],
            // Two rounds: 20 and 10 µs a call; the lower middle is 10.
            cpu_floor: vec![floor(2.0, 0), floor(1.0, 1)],
            ..Default::default()
        };
        report.merge_rounds();
        assert_eq!(report.cpu_floor.len(), 1);
        assert_eq!(report.cpu_floor[0].rounds, 2);
        assert_eq!(report.rows[0].floor_us_per_cycle, Some(20.0));
        assert_eq!(report.rows[0].server_over_floor, Some(2.5));
        assert_eq!(report.rows[1].server_over_floor, None);
        let md = report.markdown();
        let section = md
            .split("## Unary cycles over their transport floor")
            .nth(1)
            .expect("a floor section");
        assert!(
            section.contains(
                "| bagel | grpc.health.v1 Check | 256 | 50000 | 10.0 | 20.0 | 1 | 50.0 | 2.50 | 0 |"
            ),
            "{section}"
        );
        let summary = serde_json::to_value(&report).unwrap();
        assert_eq!(summary["cpu_floor"][0]["floor_us_per_cycle"], 20.0);
    }

    #[test]
    fn writes_files_without_a_font() {
        let dir = tempfile::tempdir().unwrap();
        let report = Report {
            rows: vec![Row::from_load("s3", Transport::Unary, 1, 1, 3, &load(10))],
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
