//! A worker process: lease cycles on random name sets, writing batches to
//! one of the stores under each lease, until its standard input closes.
//! Its leases come from the lease servers, or (`--lease-store`) from the
//! S3 lease backend, with no server at all.
//!
//! Every acknowledged message is printed as `ACK <store> <timestamp>
//! <payload>`, so the driver can check that each one is read back; a move
//! to new server lists as `MOVED <generation>` once no lease of the old
//! lists is held; the last line is `DONE <lease cycles> <acked> <failed writes> <refused
//! acquires>`.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use bagel_bags::store::faults::AppendsThrough;
use bagel_bags::{self as bag, BagConfig, BagStore, Writer};
use bagel_client::{AcquireBuilder, Client, Cluster, LeaseBackend, LeaseOptions, ServerSpec};
use bagel_client::{TimeOptions, TimeSource};
use bagel_proto::Signer;
use bagel_proto::clock::{Clock, OffsetClock, SystemClock};
use bagel_proto::signed_time::roughtime::{RoughtimeKey, RoughtimeServer};
use bagel_s3_lease::{LeaseStore, LeaseTime, S3LeaseBackend, S3LeaseConfig};
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use rand::{Rng as _, SeedableRng as _};

/// How one worker behaves.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// The lease servers, comma-separated: one is a plain client, several
    /// a cluster routing names over them.
    #[arg(long, required_unless_present = "lease_store")]
    server: Option<String>,
    /// Leases from this S3 lease store instead of servers (the client's
    /// clock checked against Roughtime, as `bagel --lease-store` does). Such
    /// a worker takes no part in a migration: it answers `MOVED` at once.
    #[arg(long, conflicts_with = "server")]
    lease_store: Option<String>,
    /// Store URLs, comma-separated; each cycle writes to one of them.
    #[arg(long, value_delimiter = ',')]
    stores: Vec<String>,
    #[arg(long)]
    log: String,
    /// Names are `n0` .. `n<names-1>`.
    #[arg(long)]
    names: usize,
    #[arg(long)]
    seed: u64,
    #[arg(long)]
    id: usize,
    /// The writer's clock runs this far off (the lease client's does not).
    #[arg(long, allow_hyphen_values = true, default_value_t = 0)]
    clock_offset_ms: i64,
    /// Delay some appends past the lease's deadline.
    #[arg(long)]
    delay_appends: bool,
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    ttl: Duration,
}

pub async fn run(a: WorkerArgs) -> anyhow::Result<()> {
    let mut rng = StdRng::seed_from_u64(a.seed);
    let stop = Arc::new(AtomicBool::new(false));
    // Standard input: `SERVERS <generation> <current> [<next>]` moves the
    // worker to other server lists (a migration step); its end means stop.
    let lists: Arc<std::sync::Mutex<Option<Move>>> = Arc::default();
    std::thread::spawn({
        let (stop, lists) = (Arc::clone(&stop), Arc::clone(&lists));
        move || {
            for line in std::io::stdin().lines() {
                let Ok(line) = line else { break };
                let f: Vec<&str> = line.split_whitespace().collect();
                if let ["SERVERS", generation, current, rest @ ..] = &f[..]
                    && let Ok(generation) = generation.parse()
                {
                    let next = rest.first().map(|n| (*n).to_string());
                    *lists.lock().expect("lists") = Some((generation, (*current).to_string(), next));
                }
            }
            stop.store(true, Ordering::SeqCst);
        }
    });
    let clock: Arc<dyn Clock> = Arc::new(OffsetClock {
        inner: SystemClock,
        offset_us: a.clock_offset_ms * 1000,
    });
    let addr = std::env::var("BAGEL_ROUGHTIME_ADDR").context("BAGEL_ROUGHTIME_ADDR")?;
    let key = RoughtimeKey::parse(&std::env::var("BAGEL_ROUGHTIME_KEY").context("BAGEL_ROUGHTIME_KEY")?)
        .map_err(anyhow::Error::msg)?;
    let time = Arc::new(TimeSource::roughtime(
        vec![RoughtimeServer::new(addr, key)],
        TimeOptions::default().with_clock(Arc::clone(&clock)),
    ));
    let cfg = BagConfig::default();
    let mut stores = Vec::new();
    for url in &a.stores {
        let store = retry(&stop, || bag::open_store(url, &cfg)).await?;
        stores.push(if a.delay_appends {
            delayed(store, a.ttl * 2, a.seed)
        } else {
            store
        });
    }
    let mut client = match (&a.server, &a.lease_store) {
        (_, Some(url)) => retry(&stop, || Leases::s3(url, (*time).clone())).await?,
        (Some(list), None) => retry(&stop, || Leases::connect(list, None)).await?,
        (None, None) => anyhow::bail!("--server or --lease-store"),
    };
    let names: Vec<String> = (0..a.names).map(|i| format!("n{i}")).collect();
    let (mut cycles, mut acked, mut failed, mut refused) = (0u64, 0u64, 0u64, 0u64);
    let mut out = std::io::stdout();
    while !stop.load(Ordering::SeqCst) {
        // Between cycles (no lease held), move to new server lists.
        let moved = lists.lock().expect("lists").take();
        if let Some((generation, current, next)) = moved {
            if !matches!(client, Leases::S3(_)) {
                client = retry(&stop, || Leases::connect(&current, next.as_deref())).await?;
            }
            writeln!(out, "MOVED {generation}")?;
            out.flush()?;
        }
        let cycle_start = std::time::Instant::now();
        let k = rng.gen_range(1..=4.min(names.len()));
        let chosen: Vec<String> = names.choose_multiple(&mut rng, k).cloned().collect();
        let lease = match client
            .acquire(chosen)
            .ttl(a.ttl)
            .wait(Duration::from_millis(500))
            .owner(format!("chaos-w{}", a.id))
            .options(LeaseOptions::default().with_safety_margin(Duration::from_millis(200)))
            .send()
            .await
        {
            Ok(lease) => lease,
            Err(e) => {
                if refused == 0 {
                    // The first refusal's reason, for whoever reads the run.
                    eprintln!("worker {}: first acquire refused: {e}", a.id);
                }
                refused += 1;
                // Busy: try other names soon. Down or in its restart wait:
                // back off longer.
                let pause = if matches!(e, bagel_client::Error::Busy { .. }) {
                    20..100
                } else {
                    200..400
                };
                tokio::time::sleep(Duration::from_millis(rng.gen_range(pause))).await;
                continue;
            }
        };
        cycles += 1;
        let acquired = cycle_start.elapsed();
        if let Some(until) = lease.close_before_reading() {
            // Close on every store the name's holders may have written to;
            // if one fails (the store is down) they stay unsettled, and the
            // release says so for the next holder. Only on a clock that
            // signed time vouches for, as writers do before they write: a
            // closer whose clock is ahead closes bags before they are due,
            // under writers that finish before their safe point and so do
            // not look (the worker 20 s ahead did exactly that).
            // The stores at once: each close waits out the last bag's
            // close time and walks the lookback window, seconds per store
            // (one after another, a cycle took 10-16 s, and a stop or a
            // migration step that waits 60 s for every worker ran out).
            let vouched = time.check().await.is_ok();
            let closes = stores.iter().filter(|_| vouched).map(|store| {
                bag::close_logs_through(
                    store.as_ref(),
                    std::slice::from_ref(&a.log),
                    until,
                    &cfg,
                    time.as_ref(),
                )
            });
            let closed = vouched && futures::future::join_all(closes).await.iter().all(Result::is_ok);
            if closed {
                lease.settled_through(until);
            }
        }
        let closed_at = cycle_start.elapsed();
        let si = rng.gen_range(0..stores.len());
        let writer = Writer::new(
            Arc::clone(&stores[si]),
            &a.log,
            &format!("w{}", a.id),
            lease.rights(),
            Arc::clone(&clock),
            time.clone(),
            cfg.clone(),
        )?;
        for b in 0..rng.gen_range(1..=4) {
            let n = rng.gen_range(1..=10);
            let payloads: Vec<String> = (0..n).map(|i| format!("w{}-c{cycles}-b{b}-{i}", a.id)).collect();
            match writer
                .write_batch(payloads.iter().map(|p| Bytes::from(p.clone())).collect())
                .await
            {
                Ok(stamps) => {
                    for (t, p) in stamps.iter().zip(&payloads) {
                        writeln!(out, "ACK {si} {} {p}", t.as_micros())?;
                    }
                    acked += n as u64;
                }
                Err(_) => failed += 1,
            }
            if rng.gen_bool(0.3) {
                let _ = lease.renew().await;
            }
        }
        out.flush()?;
        let written_at = cycle_start.elapsed();
        if rng.gen_bool(0.8) {
            let _ = lease.release(None).await;
        }
        // Else walk away: the lease is broken at its deadline.
        // A cycle this long holds up a stop or a migration step (both
        // wait 60 s for every worker): say where its time went.
        if cycle_start.elapsed() > SLOW_CYCLE {
            eprintln!(
                "worker {}: slow cycle {}: acquired after {acquired:.1?}, closed by {closed_at:.1?}, wrote to \
                 store {si} by {written_at:.1?}, released by {:.1?}",
                a.id,
                cycles,
                cycle_start.elapsed()
            );
        }
    }
    writeln!(out, "DONE {cycles} {acked} {failed} {refused}")?;
    out.flush()?;
    Ok(())
}

/// A cycle longer than this is reported with its phases (see the loop).
const SLOW_CYCLE: Duration = Duration::from_secs(10);

/// A move to other server lists: (generation, current, next).
type Move = (u64, String, Option<String>);

/// Where the worker takes its leases: one server, a cluster of them, or
/// the S3 lease backend.
enum Leases {
    One(Box<Client>),
    Many(Cluster),
    S3(Arc<S3LeaseBackend>),
}

impl Leases {
    /// `list`, or while migrating, `list` and `next` (a grant needs both).
    async fn connect(list: &str, next: Option<&str>) -> anyhow::Result<Self> {
        let parse = |l: &str| ServerSpec::parse_list(l).map_err(anyhow::Error::msg);
        let specs = parse(list)?;
        Ok(match (&specs[..], next) {
            (_, Some(next)) => Leases::Many(Cluster::migrating(&specs, &parse(next)?).await?),
            ([one], None) => Leases::One(Box::new(Client::connect(one.url.clone()).await?)),
            (_, None) => Leases::Many(Cluster::connect(&specs).await?),
        })
    }

    /// The S3 lease store at `url`, this process's clock checked against
    /// `time` before every grant, renewal and release; a fresh witness key
    /// published under the store's prefix.
    async fn s3(url: &str, time: TimeSource) -> anyhow::Result<Self> {
        let cfg = S3LeaseConfig::default();
        let store = LeaseStore::from_url(url, cfg.op_timeout)?;
        let backend = S3LeaseBackend::open(store, Signer::generate(), LeaseTime::Signed(time), cfg).await?;
        Ok(Leases::S3(Arc::new(backend)))
    }

    fn acquire(&self, names: Vec<String>) -> AcquireBuilder {
        match self {
            Leases::One(c) => c.acquire(names),
            Leases::Many(c) => c.acquire(names),
            Leases::S3(b) => AcquireBuilder::new(Arc::clone(b) as Arc<dyn LeaseBackend>, names),
        }
    }
}

/// Tries `f` until it works or the worker is told to stop.
async fn retry<T, E: std::fmt::Display, F: Future<Output = Result<T, E>>>(
    stop: &AtomicBool,
    mut f: impl FnMut() -> F,
) -> anyhow::Result<T> {
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if stop.load(Ordering::SeqCst) => anyhow::bail!("stopped while retrying: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// A store whose appends sometimes (one in five) wait up to `max` before
/// they happen: long enough to land after the lease's deadline.
fn delayed(store: Arc<dyn BagStore>, max: Duration, seed: u64) -> Arc<dyn BagStore> {
    let rng = std::sync::Mutex::new(StdRng::seed_from_u64(seed ^ 0xde1a));
    Arc::new(AppendsThrough::new(store, move |inner, append| {
        let delay = {
            let mut rng = rng.lock().expect("rng");
            rng.gen_bool(0.2).then(|| max.mul_f64(rng.r#gen::<f64>()))
        };
        Box::pin(async move {
            if let Some(d) = delay {
                tokio::time::sleep(d).await;
            }
            append.to(&*inner).await
        })
    }))
}
