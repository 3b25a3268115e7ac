//! `bagel-bench`: bagel side by side with what its users would pick instead
//! (etcd, Redis, S3 conditional-write leases), on one machine, in one run.
//!
//! # Layout
//! * [`args`]: the command line, the systems compared, the settings.
//! * [`driver`]: the [`driver::LeaseDriver`] trait and the load loop (the same
//!   lease cycle for every system, hdrhistogram latencies).
//! * [`bagel`], [`etcd`], [`redis`], [`s3`]: one module per system: how to
//!   start its server and its client side of a lease cycle.
//! * [`procs`]: processes on 127.0.0.1, tmpfs data dirs, readiness probes,
//!   CPU and RSS from /proc.
//! * [`rss`]: memory with many concurrently held leases.
//! * [`noisy`]: one tenant's cycles and Lists alone and under another's
//!   flood of every pooled surface (`--noisy-neighbour`).
//! * [`cluster`]: the cluster client against 1, 2 and 4 servers.
//! * [`cpu_floor`]: the server CPU of bare unary calls in the shape of the
//!   unary sweep, the floor a unary cycle is compared with.
//! * [`cpus`]: `--server-cpus` / `--client-cpus` pinning (sched_setaffinity).
//! * [`scaling`]: peak cycles/s against server cores (`--scaling`).
//! * [`bags`]: bagel-client's bag writer (POSIX writes/s, S3 PUTs per
//!   batch) and metronome (close lag); the bag path at scale (`--bag-path`:
//!   concurrent writers as tasks and processes on tmpfs, disk, S3 and NFS;
//!   a metronome over 1 to 1,000 logs).
//! * [`report`]: `results.md`, `results.json`, `summary.json`, PNG plots.
//! * [`bench`](mod@bench): the run's state ([`bench::Bench`]) and its bookkeeping;
//!   the measurements it runs, one `impl Bench` a file: [`lease_sweep`]
//!   (every system's lease cycles, paced point, round-trip floor, CPU
//!   floor),
//!   [`extras`] (memory with held leases, restart to ready, the cluster
//!   client), [`bag_runs`] (the bag measurements and `--bag-path`).
//! * this file: the command line applied, and the order of the run.
//!
//! Every run stops by itself: each point is bounded in time and in count,
//! every request has a timeout, and every server is killed at the end.

mod args;
mod bag_runs;
mod bag_scale;
mod bagel;
mod bags;
mod bench;
mod cluster;
mod cpu_floor;
mod cpus;
mod driver;
mod etcd;
mod extras;
mod floor;
mod lease_sweep;
mod noisy;
mod procs;
mod redis;
mod report;
mod rss;
mod s3;
mod scaling;

use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;

use crate::args::{Args, System};
use crate::bag_runs::bag_path_only;
use crate::bench::Bench;
use crate::cpus::Cpus;
use crate::procs::WorkDir;
use crate::report::Report;

/// The same allocator as bagel-server, for every system's client side alike.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Parses the arguments, checks and applies `--client-cpus` to this thread
/// *before* the runtime exists (so every worker inherits the mask and the
/// runtime has as many workers as client CPUs), then runs the benchmark.
fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(spec) = &args.bag_writer_child {
        return bags::writers::child_main(spec);
    }
    let machine = cpus::allowed().context("reading this process's CPUs")?;
    for (flag, list) in [
        ("--server-cpus", &args.server_cpus),
        ("--client-cpus", &args.client_cpus),
    ] {
        if let Some(list) = list {
            list.check_within(&machine, flag)?;
        }
    }
    if let Some(c) = &args.client_cpus {
        cpus::pin_thread(c)?;
    }
    let threads = args.client_cpus.as_ref().map_or(machine.len(), Cpus::len).max(1);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .context("building the runtime")?
        .block_on(run(args, machine, threads))
}

async fn run(args: Args, machine: Cpus, client_threads: usize) -> Result<()> {
    if args.bag_scale {
        std::fs::create_dir_all(&args.out)?;
        let s = bag_scale::run(&args.out).await?;
        let md = bag_scale::markdown(&s);
        print!("{md}");
        std::fs::write(args.out.join("bag-scale.md"), &md)?;
        std::fs::write(args.out.join("bag-scale.json"), serde_json::to_string_pretty(&s)?)?;
        return Ok(());
    }
    if args.bag_path {
        return bag_path_only(args, &machine).await;
    }
    if args.noisy_neighbour {
        let binary = args.bagel_server();
        let (seconds, cpus) = (args.noisy_seconds, args.server_cpus.clone());
        noisy::run(&binary, &args.out, seconds, &args.noisy_server_arg, cpus).await?;
        return Ok(());
    }
    let settings = args.settings();
    anyhow::ensure!(
        !args.concurrency.is_empty() && !args.names.is_empty(),
        "nothing to run"
    );
    anyhow::ensure!(
        args.concurrency.iter().all(|&c| (1..=4096).contains(&c)),
        "--concurrency must be within 1..=4096"
    );
    let command = command_line();
    let started = Instant::now();
    let report = Report {
        command,
        started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        machine: report::Machine::detect(machine.len()),
        settings: serde_json::json!({
            "quick": args.quick,
            "duration_s": settings.duration.as_secs_f64(),
            "warmup_s": settings.warmup.as_secs_f64(),
            "keyspace": args.keyspace,
            "ttl_s": args.ttl.as_secs_f64(),
            "connections_per_system": args.connections,
            "concurrency": args.concurrency,
            "names_per_cycle": args.names,
            "rounds": settings.rounds,
            "scaling": args.scaling,
            "scaling_concurrency": args.scaling_concurrency,
        }),
        pinning: report::Pinning {
            server_cpus: args.server_cpus.as_ref().map(ToString::to_string),
            client_cpus: args.client_cpus.as_ref().map(ToString::to_string),
            client_threads,
        },
        ..Default::default()
    };
    let work = WorkDir::new()?;
    work.set_server_cpus(args.server_cpus.clone());
    let mut bench = Bench {
        work,
        args,
        settings,
        round: 0,
        report,
    };

    let rounds = bench.settings.rounds;
    for round in 0..rounds {
        bench.round = round;
        for system in bench.args.systems.clone() {
            eprintln!("== {} (round {} of {rounds})", system.label(), round + 1);
            if let Err(e) = bench.run_system(system).await {
                bench.missing(format!("{} lease cycles", system.label()), format!("{e:#}"));
            }
            bench.checkpoint(false);
        }
    }
    bench.report.merge_rounds();
    bench.checkpoint(true);

    if !bench.args.scaling.is_empty() {
        let (work, args) = (&bench.work, &bench.args);
        let s = tokio::task::block_in_place(|| scaling::run(work, args, &machine));
        bench.report.scaling = s.rows;
        bench.report.scaling_notes = s.notes;
        for (what, why) in s.failed {
            bench.missing(what, why);
        }
        bench.checkpoint(true);
    }

    if !bench.args.no_extras {
        for n in bench.settings.held.clone() {
            eprintln!("== memory with {n} held leases");
            bench.memory(n).await?;
        }
        if bench.args.systems.contains(&System::Bagel) {
            for ttl in bench.settings.restart_ttls.clone() {
                eprintln!(
                    "== bagel restart to ready, max TTL {}",
                    humantime::format_duration(ttl)
                );
                match bench.restart(ttl).await {
                    Ok(row) => {
                        eprintln!("  first grant after {:.2} s", row.ready_after_s);
                        bench.report.restart.push(row);
                    }
                    Err(e) => bench.missing(
                        format!("restart to ready (max TTL {})", humantime::format_duration(ttl)),
                        format!("{e:#}"),
                    ),
                }
            }
        }
    }
    bench.checkpoint(true);
    if !bench.args.no_cluster && bench.args.systems.contains(&System::Bagel) {
        bench.cluster().await;
    }
    if !bench.args.no_bags {
        bench.bags().await;
    }

    let written = bench
        .report
        .write(&bench.args.out, bench.args.font().as_deref())
        .context("writing the report")?;
    let path_md = bench.report.bags.path_markdown();
    if !path_md.is_empty() {
        // The bag-path sections go after the report's own tables.
        let md = bench.args.out.join("results.md");
        let mut all = std::fs::read_to_string(&md).unwrap_or_default();
        all.push_str(&path_md);
        std::fs::write(&md, all).with_context(|| format!("writing {}", md.display()))?;
    }
    eprintln!(
        "done in {:.0} s; wrote {}",
        started.elapsed().as_secs_f64(),
        written
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    print!("{}{path_md}", bench.report.markdown());
    Ok(())
}

/// The command as given (or as `bench/run.sh` passes it on).
fn command_line() -> String {
    std::env::var("BAGEL_BENCH_COMMAND").unwrap_or_else(|_| {
        std::env::args()
            .map(|a| if a.contains(' ') { format!("'{a}'") } else { a })
            .collect::<Vec<_>>()
            .join(" ")
    })
}
