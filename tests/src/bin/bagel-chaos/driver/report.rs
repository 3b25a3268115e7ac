//! What `chaos.json` says ([`Report`] and the parts it is made of), and
//! the run's end: the summary printed, the file written, and whether the
//! run passed. The keys of `chaos.json` are a contract with the scripts
//! that read it, so they live in one place, apart from the phases that
//! fill them.

use std::collections::BTreeMap;

use serde::Serialize;

use super::Run;
use crate::cli_roles::RunFences;
use crate::leaders::FailoverReport;
use crate::partitions::PartitionReport;
use crate::spellings::SpellingReport;
use crate::watchers::WatchReport;

/// What `chaos.json` says.
#[derive(Debug, Default, Serialize)]
pub(super) struct Report {
    pub(super) seed: u64,
    pub(super) duration_s: f64,
    pub(super) stores: Vec<String>,
    pub(super) workers: usize,
    pub(super) cycles: u64,
    pub(super) acked_writes: u64,
    pub(super) read_back: u64,
    pub(super) failed_writes: u64,
    pub(super) refused_acquires: u64,
    pub(super) server_kills: u64,
    pub(super) store_kills: u64,
    pub(super) closer_kills: u64,
    /// Messages each store's first reader read.
    pub(super) messages_read: Vec<u64>,
    pub(super) readers_agree: bool,
    pub(super) violations: Vec<String>,
    /// Clock offsets (ms, libfaketime) each kind of process ran with, one
    /// entry a start: `metronome`, `reader`, `audit`, `writer`, `retain`.
    pub(super) clock_skews: BTreeMap<String, Vec<i64>>,
    /// Kills of one member of the lease cluster (`server_kills` counts them
    /// all), restarted with its key file or without it (a new key).
    pub(super) cluster_kills: ClusterKills,
    /// Moves of the workers from one server list to another.
    pub(super) migrations: u64,
    /// The workers leasing from the S3 lease backend (no server), on their
    /// own log.
    pub(super) s3_lease: S3LeaseReport,
    /// `bagel run` / `--hold` supervisors interrupted (see cli_roles.rs).
    pub(super) run_fences: RunFences,
    /// `bagel retain` runs on the stores (the metronomes summarize every
    /// sealed minute after [`SUMMARIZE_AFTER`](super::SUMMARIZE_AFTER)), some killed mid-way.
    pub(super) retention: RetentionReport,
    /// Processes stopped (SIGSTOP) for a while and continued: a process
    /// that sleeps past its lease's deadline, a server or a closer that
    /// freezes, as a long GC pause or a swapped-out host would.
    pub(super) pauses: PauseReport,
    /// Leader election: standby loops of `bagel run --wait forever` on
    /// shared names (see leaders.rs).
    pub(super) failovers: FailoverReport,
    /// Clients naming the cluster with differently written server lists
    /// (see spellings.rs).
    pub(super) config_spellings: SpellingReport,
    /// List-then-watch clients whose rebuilt held sets must equal a final
    /// List (see watchers.rs).
    pub(super) watch_checks: WatchReport,
    /// Network partitions between a leader and its lease server, by kind
    /// (see partitions.rs).
    pub(super) partitions: PartitionReport,
    /// Retention as operators run it, under faults (see retention.rs).
    pub(super) retention_journeys: crate::retention::RetentionReport,
    /// Workers under an access policy (see policy.rs).
    pub(super) policy: crate::policy::PolicyReport,
    /// Unread watch streams and greedy listers beside workers (see
    /// hostile.rs).
    pub(super) hostile_readers: crate::hostile::HostileReport,
}

/// The SIGSTOP pauses of the run: how many of each kind of process, and
/// the longest (ms).
#[derive(Debug, Default, Serialize)]
pub(super) struct PauseReport {
    pub(super) workers: u64,
    pub(super) servers: u64,
    pub(super) metronomes: u64,
    pub(super) longest_ms: u64,
}

/// What the retention runs did: every completed run's figures summed.
#[derive(Debug, Default, Serialize)]
pub(super) struct RetentionReport {
    pub(super) runs: u64,
    /// Runs killed with SIGKILL at a random point.
    pub(super) killed: u64,
    /// Summaries old enough whose bags were checked.
    pub(super) summaries_checked: u64,
    pub(super) bags_removed: u64,
    /// Runs that ended in an error: a store being killed, or a clock it
    /// could not vouch for.
    pub(super) failed: u64,
}

/// What the workers on the S3 lease backend did (their cycles and writes
/// are also in the run's totals).
#[derive(Debug, Default, Serialize)]
pub(super) struct S3LeaseReport {
    pub(super) workers: usize,
    pub(super) cycles: u64,
    pub(super) acked_writes: u64,
    pub(super) read_back: u64,
    pub(super) refused_acquires: u64,
}

#[derive(Debug, Default, Serialize)]
pub(super) struct ClusterKills {
    pub(super) with_key: u64,
    pub(super) without_key: u64,
}

impl Run<'_> {
    /// The end of the run: prints what the late phases found and the
    /// summary, writes `chaos.json`, and says whether the run passed (no
    /// violation, every acknowledged write read back, readers agree).
    pub(super) fn finish(&self) -> anyhow::Result<bool> {
        let (report, out, seed) = (&self.report, &self.out, self.seed);
        println!(
            "bagel-chaos: watchers: {} (events {}, relists {}, {} matched a final List); partitions: {} (longest {} ms)",
            report.watch_checks.watchers,
            report.watch_checks.events,
            report.watch_checks.relists,
            report.watch_checks.matched,
            if report.partitions.ran {
                report
                    .partitions
                    .kinds
                    .iter()
                    .map(|k| format!("{} takeover {} ms", k.kind, k.takeover_ms))
                    .collect::<Vec<_>>()
                    .join(", ")
            } else {
                format!(
                    "NOT RUN: {}",
                    report.partitions.not_run_because.as_deref().unwrap_or("?")
                )
            },
            report.partitions.longest_ms
        );
        let steps = |per: &crate::lists::PerStep| {
            crate::lists::STEPS
                .iter()
                .map(|s| format!("{s} {}", per.get(s).copied().unwrap_or(0)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "bagel-chaos: across {} migration(s): failovers {} ({} from a leader on one step's lists to one on \
             another's, {} waiting standbys restarted onto new lists); spelling grants {}; watch events {} \
             (watchers started {}, {} retired once their member left and drained); CLI runs {}",
            report.migrations,
            steps(&report.failovers.across_migration),
            report.failovers.between_steps,
            report.failovers.faults.migration_restarts,
            steps(&report.config_spellings.across_migration),
            steps(&report.watch_checks.across_migration),
            steps(&report.watch_checks.started_by_step),
            report.watch_checks.retired,
            steps(&report.run_fences.across_migration),
        );
        let ok =
            report.violations.is_empty() && report.read_back == report.acked_writes && report.readers_agree;
        std::fs::write(out.join("chaos.json"), serde_json::to_vec_pretty(&report)?)?;
        println!(
            "bagel-chaos: seed {seed}: {:.0} s, {} cycles, {} acked = {} read back ({} failed writes, {} refused acquires); \
             kills: {} lease server ({} without its key), {} S3 server, {} closers; CLI runs interrupted: {} fork, \
             {} SIGTERM, {} writer SIGKILL, {} --hold SIGINT; S3-lease workers: {} cycles, {} acked = {} read back; \
             skewed starts: {}; SIGSTOP pauses: {} (longest {} ms); leaders: {} failovers of {} leaders, longest gap \
             {} ms (bound {} ms; {} explained by an outage, longest {} ms), {} overlaps, {} stale steps after a freeze; \
             config spellings: {} grants over {} spellings, {} double grants, swapped IDs refused {} of {}; readers \
             agree: {}; {} violations; {}",
            report.duration_s,
            report.cycles,
            report.acked_writes,
            report.read_back,
            report.failed_writes,
            report.refused_acquires,
            report.server_kills,
            report.cluster_kills.without_key,
            report.store_kills,
            report.closer_kills,
            report.run_fences.fork,
            report.run_fences.sigterm,
            report.run_fences.sigkill_writer,
            report.run_fences.hold_interrupt,
            report.s3_lease.cycles,
            report.s3_lease.acked_writes,
            report.s3_lease.read_back,
            report.clock_skews.values().flatten().filter(|&&s| s != 0).count(),
            report.pauses.workers + report.pauses.servers + report.pauses.metronomes,
            report.pauses.longest_ms,
            report.failovers.count,
            report.failovers.leaders,
            report.failovers.longest_gap_ms,
            report.failovers.gap_bound_ms,
            report.failovers.explained_gaps,
            report.failovers.longest_explained_gap_ms,
            report.failovers.overlaps,
            report.failovers.stale_steps_after_freeze,
            report.config_spellings.grants,
            report.config_spellings.spellings.len(),
            report.config_spellings.double_grants,
            report.config_spellings.wrong_id_refused,
            report.config_spellings.wrong_id_tries,
            report.readers_agree,
            report.violations.len(),
            out.join("chaos.json").display()
        );
        for v in report.violations.iter().take(20) {
            println!("VIOLATION {v}");
        }
        Ok(ok)
    }
}
