//! POSIX-only damage: a torn tail, and a full disk (a 1 MiB tmpfs).

use std::collections::BTreeSet;
use std::io::Write as _;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bagel_client::bag::posix::PosixStore;
use bagel_client::bag::{self, BagConfig, BagStore, Bucket, Error, ReadOptions, Writer, frame};
use bagel_client::clock::ManualClock;
use bagel_tests::{TestLeases, t0};
use bytes::Bytes;

fn writer(store: Arc<dyn BagStore>, clock: &ManualClock, leases: &TestLeases) -> Writer {
    let lease = leases.lease(
        "l1",
        t0().saturating_sub(Duration::from_secs(1)),
        t0().saturating_add(Duration::from_secs(3600)),
    );
    Writer::new(
        store,
        "log",
        "w1",
        Arc::new(lease),
        Arc::new(clock.clone()),
        BagConfig::default(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_tail_is_reported_in_open_and_closed_bags() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn BagStore> = Arc::new(PosixStore::local(dir.path(), true, Duration::from_secs(10)));
    let clock = ManualClock::new(t0());
    let leases = TestLeases::default();
    let w = writer(store.clone(), &clock, &leases);
    w.write(Bytes::from("whole")).await.unwrap();
    // A torn append: half of a record at the tail of the data file.
    let b = Bucket::of(t0());
    let path = dir.path().join("log").join(b.path()).join("w1.0.log");
    let rec = frame::encode(b"a record that never finished");
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(&rec[..rec.len() / 2])
        .unwrap();
    let keys = Some(leases.keys());
    let open = bag::read(
        store.as_ref(),
        "log",
        &ReadOptions::default()
            .with_include_open(true)
            .with_keys(keys.clone()),
        &BagConfig::default(),
        &clock,
    )
    .await
    .unwrap();
    assert_eq!(open.messages.len(), 1);
    assert_eq!(open.problems.len(), 1);
    assert!(open.problems[0].in_open_bag && open.problems[0].what.contains("incomplete"));
    // Closed with the torn bytes inside the listed size: still one message, and reported.
    clock.advance(Duration::from_secs(5));
    let closed = bag::read(
        store.as_ref(),
        "log",
        &ReadOptions::default().with_keys(keys),
        &BagConfig::default(),
        &clock,
    )
    .await
    .unwrap();
    assert_eq!(closed.messages.len(), 1);
    assert_eq!(closed.problems.len(), 1, "{:?}", closed.problems);
    assert!(closed.problems[0].what.contains("torn"), "{:?}", closed.problems);
}

/// Unmounts on drop, also when the test fails.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &std::path::Path, size: &str) -> Self {
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("running mount");
        assert!(
            st.success(),
            "mount -t tmpfs failed: this test needs root (tests run as root)"
        );
        Tmpfs(dir.to_owned())
    }

    fn resize(&self, size: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(st.success());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disk_fails_the_write_clearly_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Tmpfs::mount(dir.path(), "1m");
    let store: Arc<dyn BagStore> = Arc::new(PosixStore::local(dir.path(), true, Duration::from_secs(10)));
    let clock = ManualClock::new(t0());
    let leases = TestLeases::default();
    let w = writer(store.clone(), &clock, &leases);
    let mut acked = BTreeSet::new();
    let mut err = None;
    for i in 0..1000 {
        let batch: Vec<Bytes> = (0..50)
            .map(|j| Bytes::from(format!("{i:04}-{j:03}-{}", "x".repeat(90))))
            .collect();
        match w.write_batch(batch.clone()).await {
            Ok(_) => acked.extend(batch),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
        clock.advance(Duration::from_micros(100));
    }
    let err = err.expect("a 1 MiB file system never filled up");
    assert!(
        matches!(&err, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::StorageFull),
        "{err:?}"
    );
    assert!(err.to_string().contains("No space left"), "{err}");
    assert!(!acked.is_empty());
    // The operator frees space; the bag is closed and read: every
    // acknowledged message is there, the failed batch is not.
    fs.resize("4m");
    clock.advance(Duration::from_secs(5));
    let r = bag::read(
        store.as_ref(),
        "log",
        &ReadOptions::default().with_keys(Some(leases.keys())),
        &BagConfig::default(),
        &clock,
    )
    .await
    .unwrap();
    let got: BTreeSet<Bytes> = r.messages.iter().map(|m| m.payload.clone()).collect();
    assert_eq!(got.len(), r.messages.len());
    assert_eq!(got, acked);
    assert!(r.rejected.is_empty());
    // A torn record of the failed batch may sit inside the listed size; it is reported, not read.
    assert!(
        r.problems.iter().all(|p| p.what.contains("torn")),
        "{:?}",
        r.problems
    );
    drop(fs);
}
