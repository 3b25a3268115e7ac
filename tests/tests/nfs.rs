//! The userspace NFS backend against the real NFS server (nfs-ganesha) that
//! `tests/run.sh` starts, over NFSv3 and NFSv4.2: the `FsOps` semantics the
//! bag protocol relies on, and a whole write / close / read cycle through
//! an `nfs://` store URL.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bagel_bags::store::fsops::FsOps;
use bagel_bags::store::nfs::NfsFs;
use bagel_bags::testing::TestLeases;
use bagel_bags::{self as bag, BagConfig, BagState, Bucket, Writer};
use bagel_proto::clock::{AssumedExact, SystemClock};
use bagel_tests::{nfs_url, payloads, read_clean, sub_url, unique};
use bytes::Bytes;

async fn fs_at(version: u8) -> NfsFs {
    let url = sub_url(&nfs_url(version), &unique("fsops"));
    NfsFs::open(&url, Duration::from_secs(10)).await.unwrap()
}

async fn fsops_semantics(version: u8) {
    let fs = fs_at(version).await;
    let other = NfsFs::open(&fs.target().to_string(), Duration::from_secs(10))
        .await
        .unwrap();
    fs.create_dir_all("b/1").await.unwrap();
    fs.create_dir_all("b/1").await.unwrap(); // existing is fine

    // Create-exclusive is decided by the server, for every client.
    assert!(fs.create_exclusive("b/1/prelock", b"", true).await.unwrap());
    assert!(!fs.create_exclusive("b/1/prelock", b"", true).await.unwrap());
    assert!(!other.create_exclusive("b/1/prelock", b"x", true).await.unwrap());
    assert_eq!(fs.stat("b/1/prelock").await.unwrap().len, 0);

    // Append at the size seen at open; another client sees it at once.
    let (f, st) = fs.open_append("b/1/w.0.log").await.unwrap();
    assert_eq!((st.len, st.read_only(), st.is_dir), (0, false, false));
    f.append_and_close(Bytes::from_static(b"hello "), true)
        .await
        .unwrap();
    let (f, st) = other.open_append("b/1/w.0.log").await.unwrap();
    assert_eq!(st.len, 6);
    f.append_and_close(Bytes::from_static(b"world"), true)
        .await
        .unwrap();
    assert_eq!(fs.stat("b/1/w.0.log").await.unwrap().len, 11);
    assert_eq!(&fs.read("b/1/w.0.log", None).await.unwrap()[..], b"hello world");
    assert_eq!(&other.read("b/1/w.0.log", Some(5)).await.unwrap()[..], b"hello");

    // chmod is a signal every client reads; it does not stop a WRITE (v3
    // has no open; root and owners write anyway): the protocol never relies
    // on a write failing.
    fs.chmod("b/1/w.0.log", 0o444).await.unwrap();
    let (f, st) = other.open_append("b/1/w.0.log").await.unwrap();
    assert!(st.read_only(), "{st:?}");
    f.append_and_close(Bytes::from_static(b"!"), true).await.unwrap();
    assert_eq!(fs.stat("b/1/w.0.log").await.unwrap().len, 12);

    // LINK publishes a prepared file; the second link of the name fails.
    assert!(
        fs.create_exclusive("b/1/.lock.a", b"listing a", true)
            .await
            .unwrap()
    );
    assert!(
        other
            .create_exclusive("b/1/.lock.b", b"listing b", true)
            .await
            .unwrap()
    );
    assert!(fs.link("b/1/.lock.a", "b/1/lock").await.unwrap());
    assert!(!other.link("b/1/.lock.b", "b/1/lock").await.unwrap());
    fs.remove("b/1/.lock.a").await.unwrap();
    other.remove("b/1/.lock.b").await.unwrap();
    assert_eq!(&other.read("b/1/lock", None).await.unwrap()[..], b"listing a");

    // Listings, with directories told apart.
    let mut names: Vec<(String, bool)> = other
        .list_dir("b/1")
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.is_dir))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [("lock", false), ("prelock", false), ("w.0.log", false)].map(|(n, d)| (n.to_owned(), d))
    );
    assert_eq!(fs.list_dir("b").await.unwrap()[0].name, "1");
    assert!(fs.list_dir("b").await.unwrap()[0].is_dir);
    fs.chmod("b/1", 0o555).await.unwrap();
    assert!(other.stat("b/1").await.unwrap().read_only());
    assert!(other.stat("b/1").await.unwrap().is_dir);

    // Missing things are NotFound, as the protocol expects.
    for e in [
        fs.stat("b/nope").await.unwrap_err(),
        fs.list_dir("b/nope").await.unwrap_err(),
        fs.read("b/nope", None).await.unwrap_err(),
    ] {
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v3_fsops_semantics() {
    fsops_semantics(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v4_fsops_semantics() {
    fsops_semantics(4).await;
}

/// Writers and a closer on separate clients of one store URL; every
/// acknowledged message is read back from the closed bags.
async fn store_round_trip(version: u8) {
    let url = sub_url(&nfs_url(version), &unique("store"));
    let cfg = BagConfig::default().with_grace(Duration::ZERO);
    let leases = TestLeases::default();
    let log = "tenants/acme";
    let mut want = BTreeSet::new();
    let mut tasks = Vec::new();
    let mut last_written = bagel_proto::Micros::ZERO;
    for id in ["w1", "w2"] {
        let store = bag::open_store(&url, &cfg).await.unwrap();
        let w = Writer::new(
            store,
            log,
            id,
            Arc::new(leases.lease_for_an_hour(&format!("lease-{id}"))),
            Arc::new(SystemClock),
            leases.time(Arc::new(SystemClock)),
            cfg.clone(),
        )
        .unwrap();
        for i in 0..5 {
            let batch: Vec<Bytes> = (0..10).map(|j| Bytes::from(format!("{id}-{i}-{j}"))).collect();
            want.extend(batch.iter().map(|b| String::from_utf8(b.to_vec()).unwrap()));
            tasks.push(batch);
        }
        for batch in tasks.drain(..) {
            let stamps = w.write_batch(batch).await.unwrap();
            last_written = last_written.max(*stamps.last().expect("a batch has messages"));
        }
    }
    let closer = bag::open_store(&url, &cfg).await.unwrap();
    // Close every bag up to the last write; close_through itself waits
    // until that bag's close time has passed.
    let r = bag::close_through(
        closer.as_ref(),
        log,
        last_written.next(),
        &cfg.clone().with_lookback(Duration::from_secs(30)),
        &AssumedExact(SystemClock),
    )
    .await
    .unwrap();
    assert!(r.closed >= 1, "{r:?}");
    let last = r.through.unwrap();
    assert!(matches!(
        closer.state(log, last).await.unwrap(),
        BagState::Closed(_)
    ));
    assert!(
        matches!(closer.state(log, Bucket::from_secs(last.secs() + 100)).await.unwrap(), BagState::Open(v) if v.is_empty())
    );
    let reader = bag::open_store(&url, &cfg).await.unwrap();
    let report = read_clean(reader.as_ref(), log, &leases, &cfg, &SystemClock).await;
    let got: BTreeSet<String> = payloads(&report).into_iter().collect();
    assert_eq!(got, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v3_store_round_trip() {
    store_round_trip(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v4_store_round_trip() {
    store_round_trip(4).await;
}

#[tokio::test]
async fn a_url_that_is_no_export_is_refused_clearly() {
    let url = nfs_url(3);
    let (base, query) = url.split_once('?').unwrap();
    let bad = format!("{base}?{query}&export=/not-an-export");
    let bad = bad.replace("/bagel?", "/not-an-export/x?");
    let err = NfsFs::open(&bad, Duration::from_secs(5)).await.unwrap_err();
    assert!(err.to_string().contains("not-an-export"), "{err}");
}

/// Over NFS as on a directory: a symbolic link, a FIFO or a socket where
/// a file or directory is expected is refused by name (the LOOKUP hands
/// back the link's own handle; it is never followed), and a read takes no
/// more than the file holds.
async fn links_and_special_files_are_refused(version: u8) {
    let sub = unique("hostile");
    let fs = NfsFs::open(&sub_url(&nfs_url(version), &sub), Duration::from_secs(10))
        .await
        .unwrap();
    fs.create_dir_all("bag").await.unwrap();
    let export = std::path::PathBuf::from(bagel_tests::need_env(
        "BAGEL_NFS_EXPORT_DIR",
        "the directory nfs-ganesha exports (tests/support/nfs.sh)",
    ));
    let bag = export.join(&sub).join("bag");
    std::fs::write(export.join(&sub).join("secret"), b"withdraw 1000000").unwrap();
    std::os::unix::fs::symlink("../secret", bag.join("lock")).unwrap();
    std::os::unix::fs::symlink("/etc", export.join(&sub).join("dirlink")).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(bag.join("fifo"))
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo");
    let _socket = std::os::unix::net::UnixListener::bind(bag.join("sock")).unwrap();

    for (path, what) in [
        ("bag/lock", "symbolic link"),
        ("bag/fifo", "FIFO"),
        ("bag/sock", "socket"),
    ] {
        let e = fs.read(path, Some(1 << 20)).await.unwrap_err();
        assert!(
            bagel_bags::store::fsops::is_not_plain(&e) && e.to_string().contains(what),
            "v{version} read {path}: {e}"
        );
        let e = fs.stat(path).await.unwrap_err();
        assert!(
            bagel_bags::store::fsops::is_not_plain(&e) && e.to_string().contains(what),
            "v{version} stat {path}: {e}"
        );
        let e = fs.chmod(path, 0o444).await.unwrap_err();
        assert!(
            bagel_bags::store::fsops::is_not_plain(&e),
            "v{version} chmod {path}: {e}"
        );
    }
    let e = fs.stat("dirlink").await.unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "v{version}: {e}");
    assert!(
        fs.read("dirlink/passwd", None).await.is_err(),
        "v{version}: read through a link"
    );
    // Reads are bounded by the file's size and the caller's limit.
    std::fs::write(bag.join("data"), b"0123456789").unwrap();
    assert_eq!(&fs.read("bag/data", Some(4)).await.unwrap()[..], b"0123");
    assert_eq!(&fs.read("bag/data", None).await.unwrap()[..], b"0123456789");
}

#[tokio::test]
async fn v3_links_and_special_files_are_refused() {
    links_and_special_files_are_refused(3).await;
}

#[tokio::test]
async fn v4_links_and_special_files_are_refused() {
    links_and_special_files_are_refused(4).await;
}
