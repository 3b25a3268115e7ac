//! The benchmark's command line, the systems it compares, and the
//! settings a run derives from them.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::cpus::Cpus;
use crate::report;

#[derive(Debug, Parser)]
#[command(
    name = "bagel-bench",
    about = "Lease benchmark: bagel vs etcd, Redis and S3 conditional writes"
)]
pub struct Args {
    /// Where results.md, results.json, summary.json and the plots go.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// A short run (well under 3 minutes): shorter points, 10^5 held leases
    /// only, one restart measurement.
    #[arg(long)]
    pub quick: bool,
    /// Systems to run, in order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "bagel,bagel-batched,bagel-session,etcd,redis,s3,bagel-s3"
    )]
    pub systems: Vec<System>,
    /// Concurrent clients per point.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    pub concurrency: Vec<usize>,
    /// Names per lease cycle (the `s3` peer takes only 1).
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub names: Vec<usize>,
    /// Measured time per point [default: 10s, --quick 2s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Unmeasured time before each point [default: 2s, --quick 0.5s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub warmup: Option<Duration>,
    /// Names are drawn uniformly from this many.
    #[arg(long, default_value_t = 100_000)]
    pub keyspace: u64,
    /// Lease TTL of every cycle (bagel's deadline is now + ttl).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub ttl: Duration,
    /// Client connections per system (worker i uses connection i % N).
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Upper bound on measured cycles per point.
    #[arg(long, default_value_t = 20_000_000)]
    pub max_cycles: u64,
    /// Held-lease memory: numbers of concurrently held leases, each measured
    /// on a fresh bagel-server and a fresh Redis in the same run (RSS
    /// before, RSS filled, bytes per lease = difference / N)
    /// [default: 100000,1000000, --quick 100000]; 0 to skip.
    #[arg(long, value_delimiter = ',', visible_alias = "memory-leases")]
    pub held: Option<Vec<u64>>,
    /// Restart-to-ready: max TTLs to start bagel-server with
    /// [default: 2s,5s,10s, --quick 2s].
    #[arg(long, value_delimiter = ',', value_parser = humantime::parse_duration)]
    pub restart_ttls: Option<Vec<Duration>>,
    /// The paced (open-loop) point runs at this fraction of each bagel
    /// variant's peak single-name rate (the goal is stated at half).
    #[arg(long, default_value_t = 0.5)]
    pub paced_fraction: f64,
    /// Times the whole lease sweep (every system, one after the other) is
    /// repeated; each point reports its median round, with the min-max
    /// spread [default: 3, --quick 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=99))]
    pub rounds: Option<u32>,
    /// Skip the memory and restart measurements.
    #[arg(long)]
    pub no_extras: bool,
    /// Skip the unary CPU floor: after bagel's unary sweep, on its server,
    /// bare `grpc.health.v1 Check` calls at each `--concurrency`, two per
    /// cycle over the same connections, for the same warm-up and duration,
    /// whose server CPU per two calls is what a unary cycle is compared
    /// with (`floor_us_per_cycle`, `server_over_floor`).
    #[arg(long)]
    pub no_cpu_floor: bool,
    /// Skip the bag measurements (POSIX writes/s, S3 PUTs per batch,
    /// metronome lag).
    #[arg(long)]
    pub no_bags: bool,
    /// Run only the bag-path-at-scale measurement (an idle log over a day,
    /// an hour of 10 writers read back from bags, from summaries and as
    /// plain files), on a directory under --out, with an injected clock;
    /// writes bag-scale.md and bag-scale.json there.
    #[arg(long)]
    pub bag_scale: bool,
    /// Run only the bag-path measurements (concurrent writers on each
    /// store, a metronome over many logs) and write bag-path.md and
    /// bag-path.json into --out. They also run with the other bag
    /// measurements (unless --no-bags), into results.md and summary.json.
    #[arg(long)]
    pub bag_path: bool,
    /// Run only the noisy-neighbour measurement: tenant A's cycles and
    /// Lists alone, then while tenant B floods every pooled surface of one
    /// server with an access policy; writes noisy-neighbour.md and .json
    /// into --out.
    #[arg(long)]
    pub noisy_neighbour: bool,
    /// Noisy neighbour: seconds of each phase.
    #[arg(long, default_value_t = 10)]
    pub noisy_seconds: u64,
    /// Noisy neighbour: a flag passed to bagel-server (repeat it; e.g.
    /// `--noisy-server-arg=--max-sessions-per-identity=1024` to switch a
    /// share off and see what it buys).
    #[arg(long, allow_hyphen_values = true)]
    pub noisy_server_arg: Vec<String>,
    /// Bag path: concurrent writers per point (each its own Writer and
    /// writer id, all on one log).
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    pub bag_writers: Vec<usize>,
    /// Bag path: messages (of 100 bytes) per batch of each writer.
    #[arg(long, default_value_t = 10)]
    pub bag_writer_batch: usize,
    /// Bag path: the process rows spread the writers over at most this
    /// many child processes; 0 skips the process rows.
    #[arg(long, default_value_t = 8)]
    pub bag_writer_procs: usize,
    /// Bag path: measured time per writers point [default: 2s, --quick 1s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub bag_writers_duration: Option<Duration>,
    /// Bag path: stores of the writers points: tmpfs, disk (a directory
    /// under the bench's work dir), s3 (moto), nfs (--nfs-url).
    #[arg(long, value_delimiter = ',', default_value = "tmpfs,disk,s3,nfs")]
    pub bag_stores: Vec<String>,
    /// Bag path: log counts of the metronome points (on tmpfs and S3).
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000")]
    pub bag_logs: Vec<usize>,
    /// Bag path: measured time per metronome point [default: 5s, --quick 3s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub bag_logs_duration: Option<Duration>,
    /// Bag path: the NFS store URL of the nfs rows (tests/support/nfs.sh's
    /// `nfs_start` exports it); without it the nfs rows are skipped, loudly.
    #[arg(long, env = "BAGEL_NFS_URL_V3")]
    pub nfs_url: Option<String>,
    /// Internal: run as a child of the bag-path writers points (a JSON spec).
    #[arg(long, hide = true)]
    pub bag_writer_child: Option<String>,
    /// Skip the many-servers measurement (cycles/s through the cluster
    /// client against 1, 2 and 4 servers).
    #[arg(long)]
    pub no_cluster: bool,
    /// Server counts of the many-servers measurement.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub cluster_servers: Vec<usize>,
    /// Client tasks of the many-servers measurement.
    #[arg(long, default_value_t = 64)]
    pub cluster_clients: usize,
    /// Measured time per bag write point and metronome run
    /// [default: 3s and 10s, --quick 1s and 3s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub bag_duration: Option<Duration>,
    /// Pin every server the harness starts (bagel-server, redis-server,
    /// etcd, moto) to these CPUs, e.g. `0-7` or `0,2,4`; a pinned
    /// bagel-server runs as many tokio workers as CPUs. Default: unpinned.
    #[arg(long, value_parser = Cpus::parse)]
    pub server_cpus: Option<Cpus>,
    /// Pin the load generator (this process: its tokio workers, which it
    /// then sizes to this many) to these CPUs. Default: unpinned.
    #[arg(long, value_parser = Cpus::parse)]
    pub client_cpus: Option<Cpus>,
    /// Scaling sweep: server core counts, e.g. `1,2,4,8`. For each count N
    /// and each selected system (not s3/bagel-s3), a fresh server pinned to
    /// the first N CPUs (of --server-cpus, else of the machine) and the peak
    /// single-name cycles/s over --scaling-concurrency; the clients run on
    /// the CPUs left (or --client-cpus), sharing the server's when none are
    /// left. Counts above the CPUs available are skipped with a note.
    /// Writes scaling.png and the `scaling` table/key. Default: no sweep.
    #[arg(long, value_delimiter = ',')]
    pub scaling: Vec<usize>,
    /// Client counts tried at each scaling point; the best is the peak.
    #[arg(long, value_delimiter = ',', default_value = "256,1024")]
    pub scaling_concurrency: Vec<usize>,
    /// Measured time per scaling point [default: 5s, --quick 1s]; each has
    /// a warm-up of a fifth of it.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub scaling_duration: Option<Duration>,
    /// bagel-batched / bagel-session: the `Coalescer`'s batches in flight
    /// (per stream for sessions) [default: the library's].
    #[arg(long)]
    pub coalesce_in_flight: Option<usize>,
    /// bagel-session: the `Coalescer`'s `Session` streams [default: the
    /// library's].
    #[arg(long)]
    pub coalesce_streams: Option<usize>,
    /// bagel-session: the HTTP/2 connections the `Coalescer` spreads its
    /// streams over [default: the library's].
    #[arg(long)]
    pub coalesce_connections: Option<usize>,
    /// bagel-batched / bagel-session: ask for answers in the full form, each
    /// grant with its own witness, as clients before the lean form did
    /// (to measure the one against the other).
    #[arg(long)]
    pub coalesce_full_answers: bool,
    /// Lease sweep: start the bagel, bagel-batched and bagel-session
    /// servers with an access policy (`--acl`, a file in the work dir)
    /// granting one bearer token `lease` and `read` on every name, and send
    /// that token on every call, to measure what the policy costs. The
    /// report notes it. The other measurements run without a policy.
    #[arg(long)]
    pub bagel_acl: bool,
    /// The bagel-server binary [default: next to this binary].
    #[arg(long)]
    pub bagel_server: Option<PathBuf>,
    #[arg(long, default_value = "etcd")]
    pub etcd_bin: String,
    #[arg(long, default_value = "redis-server")]
    pub redis_bin: String,
    /// Python of a venv with `moto[server]` [default: the one tests/support/s3.sh installs].
    #[arg(long, env = "BAGEL_MOTO_PYTHON")]
    pub moto_python: Option<PathBuf>,
    /// The serialized moto server script.
    #[arg(long, default_value = "tests/support/s3_server.py")]
    pub s3_script: PathBuf,
    /// TTF font for plot text [default: DejaVu Sans from fonts-dejavu-core].
    #[arg(long)]
    pub font: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum System {
    /// bagel, one unary RPC per operation.
    Bagel,
    /// bagel through bagel-client's Coalescer (Batch RPCs).
    BagelBatched,
    /// bagel through bagel-client's Coalescer over one Session stream.
    BagelSession,
    Etcd,
    Redis,
    /// Redis with `io-threads 4` (reads too): Redis's best multi-core
    /// configuration, a peer for the scaling goals.
    RedisIo,
    S3,
    /// bagel's own S3 lease backend (`bagel-s3-lease`), on the same S3
    /// server as the `s3` peer, in the same run.
    BagelS3,
}

impl System {
    /// The `system` column of the results.
    pub fn name(self) -> &'static str {
        match self {
            System::Bagel | System::BagelBatched | System::BagelSession => "bagel",
            System::Etcd => "etcd",
            System::Redis => "redis",
            System::RedisIo => "redis-io",
            System::S3 => "s3",
            System::BagelS3 => "bagel-s3",
        }
    }

    /// The command-line name.
    pub fn label(self) -> &'static str {
        match self {
            System::BagelBatched => "bagel-batched",
            System::BagelSession => "bagel-session",
            other => other.name(),
        }
    }

    /// How its cycles reach the server.
    pub fn transport(self) -> report::Transport {
        match self {
            System::BagelBatched => report::Transport::Batched,
            System::BagelSession => report::Transport::Session,
            _ => report::Transport::Unary,
        }
    }

    /// Round trips of one successful cycle of `names` names (a batched one
    /// shares its two with the other operations of the same batches).
    /// bagel-s3: the GETs of an acquire go out together, its PUTs one after
    /// the other in name order, the release PUTs together.
    pub fn requests_per_cycle(self, names: usize) -> u32 {
        match self {
            System::Bagel | System::BagelBatched | System::BagelSession | System::Redis | System::RedisIo => {
                2
            }
            System::Etcd | System::S3 => 3,
            System::BagelS3 => 2 + u32::try_from(names).unwrap_or(u32::MAX),
        }
    }
}

pub struct Settings {
    pub rounds: usize,
    pub duration: Duration,
    pub warmup: Duration,
    pub held: Vec<u64>,
    pub restart_ttls: Vec<Duration>,
    /// Per bag write point.
    pub bag_writes: Duration,
    /// Per metronome run.
    pub bag_metronome: Duration,
    /// Per bag-path writers point.
    pub bag_writers: Duration,
    /// Per bag-path metronome-over-many-logs point.
    pub bag_logs: Duration,
}

impl Args {
    /// The `Coalescer` options of the bagel-batched and bagel-session
    /// drivers: the library's defaults, with `--coalesce-*` applied.
    pub fn coalesce(&self, transport: bagel_client::Transport) -> bagel_client::CoalesceOptions {
        let mut o = bagel_client::CoalesceOptions::default().with_transport(transport);
        if let Some(n) = self.coalesce_in_flight {
            o = o.with_in_flight(n);
        }
        if let Some(n) = self.coalesce_streams {
            o = o.with_streams(n);
        }
        if let Some(n) = self.coalesce_connections {
            o = o.with_connections(n);
        }
        o.with_lean_answers(!self.coalesce_full_answers)
    }

    pub fn settings(&self) -> Settings {
        let (duration, warmup, held, restart) = if self.quick {
            (
                Duration::from_secs(2),
                Duration::from_millis(500),
                vec![100_000],
                vec![Duration::from_secs(2)],
            )
        } else {
            (
                Duration::from_secs(10),
                Duration::from_secs(2),
                vec![100_000, 1_000_000],
                vec![
                    Duration::from_secs(2),
                    Duration::from_secs(5),
                    Duration::from_secs(10),
                ],
            )
        };
        Settings {
            rounds: self.rounds.map_or(if self.quick { 1 } else { 3 }, |n| n as usize),
            duration: self.duration.unwrap_or(duration),
            warmup: self.warmup.unwrap_or(warmup),
            held: self
                .held
                .clone()
                .unwrap_or(held)
                .into_iter()
                .filter(|&n| n > 0)
                .collect(),
            restart_ttls: self.restart_ttls.clone().unwrap_or(restart),
            bag_writes: self.bag_duration.unwrap_or(if self.quick {
                Duration::from_secs(1)
            } else {
                Duration::from_secs(3)
            }),
            bag_metronome: self.bag_duration.map_or(
                if self.quick {
                    Duration::from_secs(3)
                } else {
                    Duration::from_secs(10)
                },
                |d| d * 3,
            ),
            bag_writers: self.bag_writers_duration.unwrap_or(if self.quick {
                Duration::from_secs(1)
            } else {
                Duration::from_secs(2)
            }),
            bag_logs: self.bag_logs_duration.unwrap_or(if self.quick {
                Duration::from_secs(3)
            } else {
                Duration::from_secs(5)
            }),
        }
    }

    pub fn bagel_server(&self) -> PathBuf {
        self.bagel_server.clone().unwrap_or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|p| p.parent().map(|d| d.join("bagel-server")))
                .unwrap_or_else(|| PathBuf::from("bagel-server"))
        })
    }

    pub fn moto_python(&self) -> PathBuf {
        if let Some(p) = &self.moto_python {
            return p.clone();
        }
        // Same place as tests/support/common.sh + s3.sh.
        let tools = std::env::var_os("BAGEL_TOOLS")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|c| PathBuf::from(c).join("bagel-tools")))
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/bagel-tools")))
            .unwrap_or_else(|| PathBuf::from(".cache/bagel-tools"));
        tools.join("venv-moto-5.2.5/bin/python")
    }

    pub fn font(&self) -> Option<PathBuf> {
        if let Some(f) = &self.font {
            return Some(f.clone());
        }
        [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        ]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
    }
}
