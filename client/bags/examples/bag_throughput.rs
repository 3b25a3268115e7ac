//! Messages per second from one POSIX writer, 100-byte payloads, batched.
//!
//! `cargo run --release -p bagel-client --example bag_throughput -- [DIR] [BATCH] [SECONDS]`
//! (DIR defaults to a temp directory; run it on the file system you care about).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bagel_bags::store::directory::DirectoryStore;
use bagel_bags::testing::TestLeases;
use bagel_bags::{BagConfig, Writer};
use bagel_proto::clock::SystemClock;
use bytes::Bytes;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let tmp = tempfile::tempdir()?;
    let dir = match args.first().filter(|d| !d.is_empty()) {
        Some(d) => d.into(),
        None => tmp.path().to_owned(),
    };
    let batch: usize = args.get(1).map_or(Ok(1000), |s| s.parse())?;
    let secs: u64 = args.get(2).map_or(Ok(3), |s| s.parse())?;
    println!("dir {}  batch {batch}  payload 100 B", dir.display());
    for sync in [true, false] {
        let store = Arc::new(DirectoryStore::local(&dir, sync));
        let leases = TestLeases::default();
        let w = Writer::new(
            store,
            &format!("bench-{}", if sync { "sync" } else { "nosync" }),
            "w1",
            Arc::new(leases.lease_for_an_hour("bench")),
            Arc::new(SystemClock),
            leases.time(Arc::new(SystemClock)),
            BagConfig::default(),
        )?;
        let payload = Bytes::from(vec![b'x'; 100]);
        let start = Instant::now();
        let mut n = 0u64;
        let mut batches = 0u64;
        while start.elapsed() < Duration::from_secs(secs) {
            w.write_batch(vec![payload.clone(); batch]).await?;
            n += batch as u64;
            batches += 1;
        }
        let el = start.elapsed().as_secs_f64();
        println!(
            "fsync {:5}: {:>10.0} messages/s  ({batches} batches, {:.2} ms/batch)",
            sync,
            n as f64 / el,
            el * 1000.0 / batches as f64
        );
    }
    Ok(())
}
