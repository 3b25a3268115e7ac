//! The phase's writer process: a library writer under a lease, printing
//! each batch's outcome and instants.

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use bagel_bags::{self as bag, BagConfig, Writer};
use bagel_client::{Client, TimeOptions, TimeSource};
use bagel_proto::clock::{Clock, SystemClock};
use bytes::Bytes;
use rand::Rng as _;

use super::now_us;
use crate::partitions::BOUND;

/// A library writer of the phase (`bagel-chaos store-writer`), run in the
/// writers' namespace.
#[derive(Debug, clap::Args)]
pub struct StoreWriterArgs {
    /// The lease server: its lease on the name `w<id>`, and its signed
    /// time.
    #[arg(long)]
    server: String,
    #[arg(long)]
    store: String,
    #[arg(long)]
    log: String,
    #[arg(long)]
    id: usize,
    /// Every storage call gives up after this.
    #[arg(long, value_parser = humantime::parse_duration)]
    op_timeout: Duration,
}

/// Writes batches of one to five messages, one every 100 ms, under a lease
/// renewed in the background, until standard input closes. Prints `READY`
/// once it holds its lease and its store is open, then one line a batch:
/// `OK <start µs> <end µs> <ts>:<payload>...` or `FAILED <start µs> <end
/// µs> <timeout|late|other> <payload>,... <error>`.
pub async fn writer(a: StoreWriterArgs) -> anyhow::Result<()> {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::spawn({
        let stop = Arc::clone(&stop);
        move || {
            for _ in std::io::stdin().lines() {}
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let cfg = BagConfig::default().with_op_timeout(a.op_timeout);
    // The S3 server says it listens just before it binds.
    let store = retry(|| bag::open_store(&a.store, &cfg)).await?;
    let client = retry(|| Client::connect(a.server.clone())).await?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let time = Arc::new(TimeSource::lease_server(
        client.clone(),
        TimeOptions::default().with_clock(Arc::clone(&clock)),
    ));
    let name = format!("w{}", a.id);
    let lease = client
        .acquire(vec![name.clone()])
        .ttl(Duration::from_secs(3))
        .wait(BOUND)
        .owner(format!("store-cuts-{name}"))
        .send()
        .await?;
    let writer = Writer::new(store, &a.log, &name, lease.rights(), clock, time, cfg)?;
    let mut out = std::io::stdout();
    writeln!(out, "READY")?;
    out.flush()?;
    let mut next = 0u64;
    let mut rng = rand::thread_rng();
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let n = rng.gen_range(1..=5u64);
        let payloads: Vec<String> = (next..next + n).map(|k| format!("{name}-{k}")).collect();
        next += n;
        let start = now_us();
        let result = writer
            .write_batch(payloads.iter().map(|p| Bytes::from(p.clone())).collect())
            .await;
        let end = now_us();
        match result {
            Ok(stamps) => {
                let msgs: Vec<String> = stamps
                    .iter()
                    .zip(&payloads)
                    .map(|(t, p)| format!("{}:{p}", t.as_micros()))
                    .collect();
                writeln!(out, "OK {start} {end} {}", msgs.join(" "))?;
            }
            Err(e) => {
                let why = match e {
                    bag::Error::Timeout { .. } => "timeout",
                    bag::Error::LateRejected { .. } | bag::Error::BagClosed { .. } => "late",
                    _ => "other",
                };
                let error = e.to_string().replace('\n', " ");
                writeln!(out, "FAILED {start} {end} {why} {} {error}", payloads.join(","))?;
            }
        }
        out.flush()?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lease.release(None).await?;
    Ok(())
}

/// Tries `f` until it works, for at most [`BOUND`].
async fn retry<T, E: std::fmt::Display, F: Future<Output = Result<T, E>>>(
    mut f: impl FnMut() -> F,
) -> anyhow::Result<T> {
    let started = tokio::time::Instant::now();
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if started.elapsed() > BOUND => bail!("for {BOUND:?}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}
