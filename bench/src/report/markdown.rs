//! `results.md`: the tables a person reads.

use std::fmt::Write as _;

use super::row::TRUSTED_LAG_P99_US;
use super::{Report, Row};

fn fmt_opt(x: Option<f64>, digits: usize) -> String {
    x.map_or_else(|| "–".to_string(), |v| format!("{v:.digits$}"))
}

/// `bagel (batched)` / `bagel (session)` for those workloads, else the system.
fn system_label(r: &Row) -> String {
    match r.transport.word() {
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
            "| system | names | clients | cycles/s | min–max of rounds | p50 µs | p99 µs | p99.9 µs | acquire p99 µs | RTT/cycle | server CPU (cores) | client CPU (cores) | server µs/cycle | client µs/cycle | conflicts | errors |"
        );
        let _ = writeln!(
            md,
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
        );
        for r in self.rows.iter().filter(|r| !r.paced) {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
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
                fmt_opt(r.server_us_per_cycle, 1),
                fmt_opt(r.client_us_per_cycle, 1),
                r.conflicts,
                r.errors
            );
        }
        let bagel: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| r.system == "bagel" && !r.paced)
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
                    r.transport.word().unwrap_or("unary"),
                    r.names_per_cycle,
                    r.concurrency,
                    fmt_rate(r.cycles_per_s),
                    fmt_opt(r.bagel_over_etcd, 1),
                    fmt_opt(r.bagel_over_redis, 2)
                );
            }
        }
        self.cpu_floor_markdown(&mut md);
        let paced: Vec<&Row> = self.rows.iter().filter(|r| r.paced).collect();
        if !paced.is_empty() {
            let _ = writeln!(md, "\n## Paced below the peak (open loop)\n");
            let _ = writeln!(
                md,
                "Cycles start on a fixed schedule at the offered rate; latencies count from each \
                 cycle's scheduled start (coordinated omission corrected). *Generator lag* is how \
                 late the load generator itself started them (actual − scheduled start); a point \
                 whose lag p99 exceeds {TRUSTED_LAG_P99_US} µs is marked **not trustworthy**: its \
                 tail is partly the generator's.\n"
            );
            let _ = writeln!(
                md,
                "| system | names | clients | of peak | offered/s | achieved/s | acquire p50 µs | acquire p99 µs | acquire p99.9 µs | cycle p99 µs | generator lag p50/p99/max µs | trustworthy |"
            );
            let _ = writeln!(md, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|");
            for r in paced {
                let lag = |v: Option<u64>| fmt_opt(v.map(|v| v as f64), 0);
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} / {} | {} |",
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
                    lag(r.start_lag_p50_us),
                    lag(r.start_lag_p99_us),
                    lag(r.start_lag_max_us),
                    match r.generator_lag_ok {
                        Some(true) => "yes",
                        Some(false) => "**no** (generator lag)",
                        None => "–",
                    }
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
        self.scaling_markdown(&mut md);
        crate::cluster::markdown(&self.cluster, &mut md);
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
        if !self.scaling.is_empty() {
            let _ = writeln!(md, "\n![peak cycles/s vs server cores](scaling.png)");
        }
        md
    }

    /// The unary cycles against two bare calls at the same client count.
    fn cpu_floor_markdown(&self, md: &mut String) {
        if self.cpu_floor.is_empty() {
            return;
        }
        let _ = writeln!(md, "\n## Unary cycles over their transport floor (server CPU)\n");
        let _ = writeln!(
            md,
            "Bare unary calls that do no lease work, on the same server right after the unary \
             sweep, in its shape: as many client tasks over as many connections, two calls one \
             after the other per cycle, the same warm-up and window. Floor = server CPU of two \
             bare calls; a unary cycle's server CPU over it is what its lease work adds.\n"
        );
        let _ = writeln!(
            md,
            "| system | request | clients | calls/s | server µs/call | floor µs/cycle | names | unary µs/cycle | ÷ floor | errors |"
        );
        let _ = writeln!(md, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|");
        for f in &self.cpu_floor {
            let unary: Vec<&Row> = self
                .rows
                .iter()
                .filter(|r| {
                    r.system == f.system
                        && r.transport == super::Transport::Unary
                        && !r.paced
                        && r.concurrency == f.concurrency
                })
                .collect();
            let head = format!(
                "| {} | {} | {} | {} | {} | {} |",
                f.system,
                f.request,
                f.concurrency,
                fmt_rate(f.calls_per_s),
                fmt_opt(f.server_us_per_call, 1),
                fmt_opt(f.floor_us_per_cycle, 1),
            );
            if unary.is_empty() {
                let _ = writeln!(md, "{head} – | – | – | {} |", f.errors);
            }
            for r in unary {
                let _ = writeln!(
                    md,
                    "{head} {} | {} | {} | {} |",
                    r.names_per_cycle,
                    fmt_opt(r.server_us_per_cycle, 1),
                    fmt_opt(r.server_over_floor, 2),
                    f.errors
                );
            }
        }
    }

    fn scaling_markdown(&self, md: &mut String) {
        if self.scaling.is_empty() && self.scaling_notes.is_empty() {
            return;
        }
        let _ = writeln!(md, "\n## Scaling: peak single-name cycles/s vs server cores\n");
        let _ = writeln!(
            md,
            "Each point a fresh server pinned to the first N CPUs, driven closed-loop at each \
             client count tried (the best is the peak), the load generator on a runtime of its \
             own pinned to the client CPUs (as many worker threads).\n"
        );
        for n in &self.scaling_notes {
            let _ = writeln!(md, "* {n}");
        }
        if self.scaling.iter().any(|r| r.clients_share_server_cpus) {
            let _ = writeln!(
                md,
                "* rows marked *shared*: no CPU was left for the clients, which ran on the server's CPUs"
            );
        }
        if self.scaling.is_empty() {
            return;
        }
        let _ = writeln!(
            md,
            "\n| system | server cores | server CPUs | client CPUs | clients | peak cycles/s | × fewest cores | p99 µs | server CPU (cores) | client CPU (cores) | tried (clients: cycles/s) | errors |"
        );
        let _ = writeln!(md, "|---|--:|---|---|--:|--:|--:|--:|--:|--:|---|--:|");
        for r in &self.scaling {
            let tried: Vec<String> = r
                .tried
                .iter()
                .map(|(c, v)| format!("{c}: {}", fmt_rate(*v)))
                .collect();
            let _ = writeln!(
                md,
                "| {} | {} | {} | {}{} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.label,
                r.server_cores,
                r.server_cpus,
                r.client_cpus,
                if r.clients_share_server_cpus {
                    " (shared)"
                } else {
                    ""
                },
                r.concurrency,
                fmt_rate(r.cycles_per_s),
                fmt_opt(r.over_fewest_cores, 2),
                r.p99_us,
                fmt_opt(r.server_cpu_cores, 2),
                fmt_opt(r.client_cpu_cores, 2),
                tried.join(", "),
                r.errors
            );
        }
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
}
