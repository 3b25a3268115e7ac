//! What one write and one close cost on a POSIX-bag backend, counted as
//! `FsOps` calls, and messages per second with 100-byte payloads, batched.
//!
//! `cargo run --release -p bagel-client --example fs_ops -- URL [BATCH] [SECONDS]`
//! with URL `file:///abs/dir` or `nfs://host[:port]/export/dir?version=3|4...`.
//! The numbers go into `client/bags/src/store/NFS.md`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bagel_bags::store::counting::CountingFs;
use bagel_bags::store::directory::DirectoryStore;
use bagel_bags::store::fsops::{FsOps, StdFs};
use bagel_bags::store::nfs::NfsFs;
use bagel_bags::testing::TestLeases;
use bagel_bags::{BagConfig, BagStore as _, Bucket, Writer};
use bagel_proto::Micros;
use bagel_proto::clock::SystemClock;
use bytes::Bytes;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = args.first().context("usage: fs_ops URL [BATCH] [SECONDS]")?;
    let batch: usize = args.get(1).map_or(Ok(100), |s| s.parse())?;
    let secs: u64 = args.get(2).map_or(Ok(3), |s| s.parse())?;
    let timeout = Duration::from_secs(10);
    let inner: Arc<dyn FsOps> = if let Some(dir) = url.strip_prefix("file://") {
        std::fs::create_dir_all(dir)?;
        Arc::new(StdFs::new(dir))
    } else {
        Arc::new(NfsFs::open(url, timeout).await?)
    };
    let fs = Arc::new(CountingFs::new(inner));
    let counts = fs.counts.clone();
    let store = Arc::new(DirectoryStore::new(fs, true));
    let log = format!("fs-ops-{}", std::process::id());
    let leases = TestLeases::default();
    let w = Writer::new(
        store.clone(),
        &log,
        "w1",
        Arc::new(leases.lease_for_an_hour("fs-ops")),
        Arc::new(SystemClock),
        leases.time(Arc::new(SystemClock)),
        BagConfig::default(),
    )?;
    let payload = Bytes::from(vec![b'x'; 100]);
    println!("store {url}  batch {batch}  payload 100 B  sync on");

    // One write into a new bag, then one more into the same bag.
    let (first, second) = loop {
        counts.reset();
        let t1 = w.write(payload.clone()).await?;
        let first = counts.to_string();
        counts.reset();
        let t2 = w.write(payload.clone()).await?;
        if Bucket::of(t1) == Bucket::of(t2) {
            break (first, counts.to_string());
        }
    };
    println!("first write to a bag:  {first}");
    println!("next write to the bag: {second}");
    let bucket = Bucket::of(w.max_written().context("wrote")?);
    counts.reset();
    let listing = store.close(&log, bucket).await?;
    println!(
        "close (1 data file):   {}  -> {} item(s)",
        counts,
        listing.items.len()
    );
    counts.reset();
    store.close(&log, bucket).await?;
    println!("close again (closed):  {counts}");
    // The writer goes on in a later bag: this one is closed.
    tokio::time::sleep(bucket.end().duration_since(Micros::now()) + Duration::from_millis(10)).await;

    counts.reset();
    let start = Instant::now();
    let (mut msgs, mut batches) = (0u64, 0u64);
    while start.elapsed() < Duration::from_secs(secs) {
        w.write_batch(vec![payload.clone(); batch]).await?;
        msgs += batch as u64;
        batches += 1;
    }
    let el = start.elapsed().as_secs_f64();
    println!(
        "throughput: {msgs} messages in {batches} batches in {el:.2} s = {:.0} msg/s, {:.1} batches/s, {:.1} FsOps calls per batch",
        msgs as f64 / el,
        batches as f64 / el,
        counts.total() as f64 / batches as f64
    );
    Ok(())
}
