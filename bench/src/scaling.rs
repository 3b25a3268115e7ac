//! The scaling sweep (`--scaling 1,2,4,8`): peak single-name cycles/s of
//! each system against the number of CPUs its server may use.
//!
//! For each core count N, each selected system gets a fresh server pinned
//! to the first N CPUs of the server pool (`--server-cpus`, else every CPU
//! this process may use) and is driven closed-loop at each of
//! `--scaling-concurrency` client counts; the best is its peak. The load
//! generator runs on a tokio runtime of its own for that core count, pinned
//! to the CPUs left over (or `--client-cpus`) and sized to them; when no
//! CPU is left, clients and server share the server's CPUs and the row says
//! so. The S3 peers are left out: moto serves one request at a time.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bagel_client::Transport as ClientTransport;
use serde::Serialize;

use crate::args::{Args, System};
use crate::cpus::{self, Cpus};
use crate::driver::{LeaseDriver, LoadResult, LoadSpec, run_load};
use crate::procs::{Server, WorkDir};
use crate::report::Transport;
use crate::{bagel, etcd, redis};

/// One system at one server core count.
#[derive(Debug, Clone, Serialize)]
pub struct ScalingRow {
    /// `bagel`, `etcd`, `redis` (with `transport` for bagel's variants).
    pub system: String,
    pub transport: Transport,
    /// The command-line name: `bagel-batched`, `bagel-session`, ...
    pub label: String,
    pub server_cores: usize,
    /// The CPUs the server was pinned to, read back from the process.
    pub server_cpus: String,
    /// The CPUs of the load generator's runtime (as many worker threads).
    pub client_cpus: String,
    /// True when no CPU was left for the clients: they ran on the server's.
    pub clients_share_server_cpus: bool,
    /// Client tasks at the peak, and the peak.
    pub concurrency: usize,
    pub cycles_per_s: f64,
    /// This peak over the same system's peak at the smallest core count.
    pub over_fewest_cores: Option<f64>,
    pub p50_us: u64,
    pub p99_us: u64,
    pub server_cpu_cores: Option<f64>,
    pub client_cpu_cores: Option<f64>,
    pub errors: u64,
    /// Every client count tried: (clients, cycles/s).
    pub tried: Vec<(usize, f64)>,
}

/// What the sweep measured, what it skipped and what failed.
#[derive(Debug, Default)]
pub struct Scaling {
    pub rows: Vec<ScalingRow>,
    pub notes: Vec<String>,
    pub failed: Vec<(String, String)>,
}

/// Runs the sweep; blocks the calling thread (each core count runs on a
/// runtime of its own, on a thread pinned to its client CPUs).
pub fn run(work: &WorkDir, args: &Args, machine: &Cpus) -> Scaling {
    let mut out = Scaling::default();
    let pool = args.server_cpus.clone().unwrap_or_else(|| machine.clone());
    let systems: Vec<System> = args
        .systems
        .iter()
        .copied()
        .filter(|s| !matches!(s, System::S3 | System::BagelS3))
        .collect();
    if systems.len() < args.systems.len() {
        out.notes.push(
            "s3 and bagel-s3 are left out of the scaling sweep: moto serves one request at a time".into(),
        );
    }
    let duration = args.scaling_duration.unwrap_or(if args.quick {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(5)
    });
    let mut counts = args.scaling.clone();
    counts.sort_unstable();
    counts.dedup();
    for n in counts {
        if n == 0 || n > pool.len() {
            out.notes.push(format!(
                "{n} server core{} skipped: {} CPU{} available ({pool})",
                if n == 1 { "" } else { "s" },
                pool.len(),
                if pool.len() == 1 { " is" } else { "s are" }
            ));
            continue;
        }
        let server = pool.first(n);
        let (client, shared) = match &args.client_cpus {
            Some(c) => (c.clone(), c.0.iter().any(|x| server.0.contains(x))),
            None => {
                let rest = machine.without(&server);
                if rest.is_empty() {
                    (server.clone(), true)
                } else {
                    (rest, false)
                }
            }
        };
        eprintln!(
            "== scaling: server on {n} core(s) (CPUs {server}), clients on CPUs {client}{}",
            if shared { " (shared with the server)" } else { "" }
        );
        work.set_server_cpus(Some(server.clone()));
        let r = std::thread::scope(|s| {
            s.spawn(|| {
                cpus::pin_thread(&client)?;
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(client.len())
                    .enable_all()
                    .build()
                    .context("building the client runtime")?;
                anyhow::Ok(rt.block_on(at_core_count(work, args, &systems, n, &client, shared, duration)))
            })
            .join()
        });
        match r {
            Ok(Ok(results)) => {
                for (label, r) in results {
                    match r {
                        Ok(row) => out.rows.push(row),
                        Err(e) => out
                            .failed
                            .push((format!("scaling: {label} on {n} core(s)"), format!("{e:#}"))),
                    }
                }
            }
            Ok(Err(e)) => out
                .failed
                .push((format!("scaling on {n} core(s)"), format!("{e:#}"))),
            Err(_) => out.failed.push((
                format!("scaling on {n} core(s)"),
                "the client thread panicked".into(),
            )),
        }
    }
    work.set_server_cpus(args.server_cpus.clone());
    fill_over_fewest(&mut out.rows);
    out
}

/// Fills `over_fewest_cores`: each peak over the same system's peak at its
/// smallest measured core count.
fn fill_over_fewest(rows: &mut [ScalingRow]) {
    let snapshot = rows.to_vec();
    for row in rows.iter_mut() {
        let base = snapshot
            .iter()
            .filter(|r| r.label == row.label)
            .min_by_key(|r| r.server_cores)
            .map(|r| r.cycles_per_s)
            .filter(|&v| v > 0.0);
        row.over_fewest_cores = base.map(|b| row.cycles_per_s / b);
    }
}

type SystemResult = (String, Result<ScalingRow>);

/// Every system at one core count (the work dir pins the servers).
async fn at_core_count(
    work: &WorkDir,
    args: &Args,
    systems: &[System],
    n: usize,
    client: &Cpus,
    shared: bool,
    duration: Duration,
) -> Vec<SystemResult> {
    let mut results = Vec::new();
    for &system in systems {
        let spec = LoadSpec {
            concurrency: 1,
            names_per_cycle: 1,
            keyspace: args.keyspace,
            ttl: args.ttl,
            warmup: duration / 5,
            duration,
            max_cycles: args.max_cycles,
            prefix: format!("scaling-{}-{n}-", system.label()),
            op_timeout: Duration::from_secs(10),
            max_errors: 1000,
            rate: None,
        };
        let r = one_system(work, args, system, &spec)
            .await
            .map(|(server_cpus, tried)| {
                let (concurrency, best) = tried
                    .iter()
                    .max_by(|a, b| rate(&a.1).total_cmp(&rate(&b.1)))
                    .expect("at least one client count");
                let secs = best.elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
                let row = ScalingRow {
                    system: system.name().into(),
                    transport: system.transport(),
                    label: system.label().into(),
                    server_cores: n,
                    server_cpus,
                    client_cpus: client.to_string(),
                    clients_share_server_cpus: shared,
                    concurrency: *concurrency,
                    cycles_per_s: rate(best),
                    over_fewest_cores: None,
                    p50_us: best.cycle_us.value_at_quantile(0.5),
                    p99_us: best.cycle_us.value_at_quantile(0.99),
                    server_cpu_cores: best.server_cpu_s.map(|v| v / secs),
                    client_cpu_cores: best.client_cpu_s.map(|v| v / secs),
                    errors: tried.iter().map(|t| t.1.errors).sum(),
                    tried: tried.iter().map(|(c, r)| (*c, rate(r))).collect(),
                };
                eprintln!(
                    "  {:13} {n} core(s): peak {:.0} cycles/s at {} clients, server CPU {}",
                    system.label(),
                    row.cycles_per_s,
                    row.concurrency,
                    row.server_cpu_cores.map_or("?".into(), |v| format!("{v:.2}"))
                );
                row
            });
        if let Err(e) = &r {
            eprintln!("  {} on {n} core(s) not measured: {e:#}", system.label());
        }
        results.push((system.label().to_string(), r));
    }
    results
}

fn rate(r: &LoadResult) -> f64 {
    let secs = r.elapsed.as_secs_f64();
    if secs > 0.0 { r.cycles as f64 / secs } else { 0.0 }
}

/// Starts `system`'s server, runs each client count, stops it. Returns the
/// server's CPUs as read back and (clients, result) per count.
async fn one_system(
    work: &WorkDir,
    args: &Args,
    system: System,
    spec: &LoadSpec,
) -> Result<(String, Vec<(usize, LoadResult)>)> {
    let pool = args.connections;
    let concs = &args.scaling_concurrency;
    match system {
        System::Bagel | System::BagelBatched | System::BagelSession => {
            let opts = bagel::ServerOpts {
                max_ttl: Duration::from_secs(10).max(args.ttl * 2),
                skip_restart_wait: true,
                acl: None,
            };
            let mut server = bagel::start(work, &args.bagel_server(), &opts).await?;
            let r = match system {
                System::Bagel => match bagel::BagelDriver::connect(server.addr, pool).await {
                    Ok(d) => sweep(Arc::new(d), &mut server, spec, concs).await,
                    Err(e) => Err(e),
                },
                _ => {
                    let transport = if system == System::BagelSession {
                        ClientTransport::Session
                    } else {
                        ClientTransport::Batch
                    };
                    match bagel::BagelBatchedDriver::connect_with(server.addr, args.coalesce(transport)).await
                    {
                        Ok(d) => sweep(Arc::new(d), &mut server, spec, concs).await,
                        Err(e) => Err(e),
                    }
                }
            };
            server.stop().await;
            r
        }
        System::Etcd => {
            let mut server = etcd::start(work, &args.etcd_bin).await?;
            let r = match etcd::EtcdDriver::connect(server.addr, pool).await {
                Ok(d) => sweep(Arc::new(d), &mut server, spec, concs).await,
                Err(e) => Err(e),
            };
            server.stop().await;
            r
        }
        System::Redis | System::RedisIo => {
            let io_threads = if system == System::RedisIo {
                redis::IO_THREADS
            } else {
                1
            };
            let mut server = redis::start(work, &args.redis_bin, io_threads).await?;
            let r = match redis::RedisDriver::connect(server.addr, pool).await {
                Ok(d) => sweep(Arc::new(d), &mut server, spec, concs).await,
                Err(e) => Err(e),
            };
            server.stop().await;
            r
        }
        System::S3 | System::BagelS3 => anyhow::bail!("not part of the scaling sweep"),
    }
}

async fn sweep<D: LeaseDriver>(
    driver: Arc<D>,
    server: &mut Server,
    spec: &LoadSpec,
    concs: &[usize],
) -> Result<(String, Vec<(usize, LoadResult)>)> {
    let cpus = server
        .cpus
        .as_ref()
        .map_or_else(|| "unpinned".into(), ToString::to_string);
    let mut tried = Vec::new();
    for &c in concs {
        server.check_alive()?;
        let mut spec = spec.clone();
        spec.concurrency = c;
        spec.prefix = format!("{}c{c}-", spec.prefix);
        tried.push((c, run_load(driver.clone(), &spec, Some(server.pid)).await));
    }
    anyhow::ensure!(!tried.is_empty(), "no client counts (--scaling-concurrency)");
    Ok((cpus, tried))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(label: &str, cores: usize, rate: f64) -> ScalingRow {
        ScalingRow {
            system: "bagel".into(),
            transport: Transport::Unary,
            label: label.into(),
            server_cores: cores,
            server_cpus: String::new(),
            client_cpus: String::new(),
            clients_share_server_cpus: false,
            concurrency: 256,
            cycles_per_s: rate,
            over_fewest_cores: None,
            p50_us: 0,
            p99_us: 0,
            server_cpu_cores: None,
            client_cpu_cores: None,
            errors: 0,
            tried: vec![],
        }
    }

    #[test]
    fn ratios_are_over_the_fewest_cores_of_the_same_system() {
        let mut rows = vec![
            row("bagel", 2, 300.0),
            row("redis", 1, 50.0),
            row("bagel", 1, 100.0),
        ];
        fill_over_fewest(&mut rows);
        assert_eq!(rows[0].over_fewest_cores, Some(3.0));
        assert_eq!(rows[1].over_fewest_cores, Some(1.0));
        assert_eq!(rows[2].over_fewest_cores, Some(1.0));
    }
}
