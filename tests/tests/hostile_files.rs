//! The real `bagel` over a directory store that someone with write access
//! to it has tampered with (issue 24, items 2, 4, 5 and 7): a lock naming a
//! file outside the store, data files and locks that are symbolic links,
//! FIFOs or huge, a start mark at the epoch, a stuck log beside good ones.
//! Each must be refused by name, at once, and without holding more memory
//! than the limits say.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bagel_bags::store::directory::DirectoryStore;
use bagel_bags::{BagConfig, BagStore, Bucket, ListedItem, Listing, Writer};
use bagel_proto::clock::{Clock as _, ManualClock, SystemClock};
use bagel_tests::{TestLeases, bin, describe_output, unique};
use bytes::Bytes;

/// Far above what any of these commands needs when it behaves; a command
/// still running then is the failure (it is killed and its output shown).
const GENEROUS: Duration = Duration::from_secs(60);

/// Runs `bagel args` (through `sh` when `shell_prefix` is given, e.g. a
/// `ulimit`), failing the test if it has not exited within [`GENEROUS`].
fn bagel_bounded_with(shell_prefix: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = match shell_prefix {
        Some(prefix) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!("{prefix}; exec \"$0\" \"$@\""))
                .arg(bin("bagel"))
                .args(args);
            c
        }
        None => {
            let mut c = Command::new(bin("bagel"));
            c.args(args);
            c
        }
    };
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bagel");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(GENEROUS) {
        Ok(out) => out.expect("bagel output"),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            let out = rx.recv().expect("output after kill").expect("bagel output");
            panic!(
                "bagel {args:?} still running after {GENEROUS:?}: {}",
                describe_output(&out)
            );
        }
    }
}

fn bagel_bounded(args: &[&str]) -> Output {
    bagel_bounded_with(None, args)
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn url(root: &Path) -> String {
    format!("file://{}", root.display())
}

/// A store with one real, closed bag of `log` holding `payload`, written
/// half an hour ago under a test lease; returns the bag and its data file
/// (relative to the store root).
async fn store_with_message(root: &Path, log: &str, payload: &str, leases: &TestLeases) -> (Bucket, String) {
    std::fs::create_dir_all(root).unwrap();
    let store: Arc<dyn BagStore> = Arc::new(DirectoryStore::local(root, false));
    let t = SystemClock.now().saturating_sub(Duration::from_secs(1800));
    let clock = ManualClock::new(t);
    let lease = leases.lease(
        "l1",
        t.saturating_sub(Duration::from_secs(1)),
        t.saturating_add(Duration::from_secs(60)),
    );
    let w = Writer::new(
        Arc::clone(&store),
        log,
        "w1",
        Arc::new(lease),
        Arc::new(clock.clone()),
        leases.time(Arc::new(clock.clone())),
        BagConfig::default().with_sync(false),
    )
    .unwrap();
    let stamps = w
        .write_batch(vec![Bytes::from(payload.to_owned())])
        .await
        .unwrap();
    let bucket = Bucket::of(stamps[0]);
    store.close(log, bucket).await.unwrap();
    let dir = root.join(log).join(bucket.path());
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .find(|n| n.ends_with(".log"))
        .expect("a data file");
    (bucket, format!("{log}/{}/{file}", bucket.path()))
}

/// Makes `root/log/<bucket>` a closed bag whose lock lists `items`.
fn forged_bag(root: &Path, log: &str, bucket: Bucket, items: &[(&str, u64)]) -> PathBuf {
    let dir = root.join(log).join(bucket.path());
    std::fs::create_dir_all(&dir).unwrap();
    let listing = Listing {
        items: items
            .iter()
            .map(|(name, size)| ListedItem {
                name: (*name).to_owned(),
                size: *size,
                etag: None,
            })
            .collect(),
    };
    std::fs::write(dir.join("lock"), listing.encode()).unwrap();
    dir
}

/// A read that may close past-due bags on this host's clock: what these
/// tests are about is the store's files, not the closer's clock.
fn read_args<'a>(store: &'a str, log: &'a str) -> Vec<&'a str> {
    vec!["read", "--store", store, "--log", log, "--unsafe-local-clock"]
}

#[tokio::test]
async fn a_lock_naming_a_file_outside_the_store_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let leases = TestLeases::default();
    let (bucket, outside_file) =
        store_with_message(&dir.path().join("outside"), "log", "withdraw 1000000", &leases).await;
    let size = std::fs::metadata(dir.path().join("outside").join(&outside_file))
        .unwrap()
        .len();
    // From <root>/log/YYYY/MM/DD/hh/mm/ss, eight `..` reach the directory
    // that holds both the store and `outside`.
    let escape = format!("{}outside/{outside_file}", "../".repeat(8));
    let root = dir.path().join("store");
    forged_bag(&root, "log", bucket, &[(&escape, size)]);
    let store = url(&root);

    let out = bagel_bounded(&read_args(&store, "log"));
    let all = text(&out);
    assert!(!all.contains("withdraw"), "read a file outside the store: {all}");
    assert!(
        all.contains("PROBLEM") && all.contains(&escape) && all.contains(&bucket.to_string()),
        "{all}"
    );
    assert!(all.contains("refused"), "{all}");
    assert_eq!(out.status.code(), Some(4), "{}", describe_output(&out));

    let key = leases.key_hex();
    let out = bagel_bounded(&["audit", "--store", &store, "--log", "log", "--key", &key]);
    let all = text(&out);
    assert!(all.contains("VIOLATION") && all.contains(&escape), "{all}");
    assert!(all.contains("audited 0 messages"), "{all}");
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
}

#[tokio::test]
async fn a_data_file_that_is_a_symbolic_link_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let leases = TestLeases::default();
    let outside = dir.path().join("outside");
    let (bucket, outside_file) = store_with_message(&outside, "log", "withdraw 1000000", &leases).await;
    let target = outside.join(&outside_file);
    let size = std::fs::metadata(&target).unwrap().len();
    let root = dir.path().join("store");
    let name = "w1.00000000.0.log";
    let bag = forged_bag(&root, "log", bucket, &[(name, size)]);
    std::os::unix::fs::symlink(&target, bag.join(name)).unwrap();

    let out = bagel_bounded(&read_args(&url(&root), "log"));
    let all = text(&out);
    assert!(!all.contains("withdraw"), "followed a symbolic link: {all}");
    assert!(
        all.contains("PROBLEM") && all.contains(name) && all.contains("symbolic link"),
        "{all}"
    );
    assert_eq!(out.status.code(), Some(4), "{}", describe_output(&out));
}

/// A bag directory replaced by a symbolic link to a real, closed bag
/// outside the store: `bagel read` and `bagel audit` take nothing from it
/// and name the bag as a problem; a writer whose log directory is a link
/// out of the store writes nothing there.
#[tokio::test]
async fn a_bag_directory_that_is_a_symbolic_link_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let leases = TestLeases::default();
    let outside = dir.path().join("outside");
    let (bucket, _) = store_with_message(&outside, "log", "withdraw 1000000", &leases).await;
    let root = dir.path().join("store");
    let bag = root.join("log").join(bucket.path());
    std::fs::create_dir_all(bag.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(outside.join("log").join(bucket.path()), &bag).unwrap();
    let store = url(&root);

    let out = bagel_bounded(&read_args(&store, "log"));
    let all = text(&out);
    assert!(!all.contains("withdraw"), "followed a symbolic link: {all}");
    assert!(
        all.contains(&bucket.to_string()) && all.contains("bag directory") && all.contains("symbolic link"),
        "{all}"
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));

    let key = leases.key_hex();
    let out = bagel_bounded(&["audit", "--store", &store, "--log", "log", "--key", &key]);
    let all = text(&out);
    assert!(
        !all.contains("audited 1 message"),
        "audited a bag outside the store: {all}"
    );
    assert!(
        all.contains(&bucket.to_string()) && all.contains("symbolic link"),
        "{all}"
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));

    // A log directory that is a link out of the store: the writer fails,
    // and nothing appears outside.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, root.join("wlog")).unwrap();
    let store: Arc<dyn BagStore> = Arc::new(DirectoryStore::local(&root, false));
    let w = Writer::new(
        store,
        "wlog",
        "w1",
        Arc::new(leases.lease_for_an_hour("l2")),
        Arc::new(SystemClock),
        leases.time(Arc::new(SystemClock)),
        BagConfig::default().with_sync(false),
    )
    .unwrap();
    let err = w
        .write_batch(vec![Bytes::from_static(b"x")])
        .await
        .expect_err("a write through a symbolic link");
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "wrote outside the store"
    );
}

/// A memory bound for the reader process (KiB of address space): a reader
/// that follows a lock to `/dev/zero` or reads a listed 1.5 GB whole fails
/// to allocate instead of taking the test machine's memory.
const ULIMIT: &str = "ulimit -v 1200000";

#[test]
fn a_lock_that_is_a_symbolic_link_or_huge_is_refused_without_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let bucket = Bucket::of(SystemClock.now().saturating_sub(Duration::from_secs(600)));
    let bag = root.join("log").join(bucket.path());
    std::fs::create_dir_all(&bag).unwrap();
    std::os::unix::fs::symlink("/dev/zero", bag.join("lock")).unwrap();
    let store = url(&root);

    let out = bagel_bounded_with(Some(ULIMIT), &read_args(&store, "log"));
    let all = text(&out);
    assert!(
        all.contains(&bucket.to_string()) && all.contains("`lock` is a symbolic link"),
        "{}",
        describe_output(&out)
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));

    // A regular but huge (sparse) lock is not read whole either.
    std::fs::remove_file(bag.join("lock")).unwrap();
    let lock = std::fs::File::create(bag.join("lock")).unwrap();
    lock.set_len(1_500_000_000).unwrap();
    let out = bagel_bounded_with(Some(ULIMIT), &read_args(&store, "log"));
    let all = text(&out);
    assert!(
        all.contains(&bucket.to_string()) && all.contains("over 8388608 bytes"),
        "{}",
        describe_output(&out)
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
}

#[test]
fn a_listed_size_over_the_item_limit_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let bucket = Bucket::of(SystemClock.now().saturating_sub(Duration::from_secs(600)));
    let name = "w1.00000000.0.log";
    let size = 1_500_000_000;
    let bag = forged_bag(&root, "log", bucket, &[(name, size)]);
    std::fs::File::create(bag.join(name))
        .unwrap()
        .set_len(size)
        .unwrap();
    let store = url(&root);

    // The default limit (1 GiB), under a memory bound the whole item
    // would not fit in.
    let out = bagel_bounded_with(Some(ULIMIT), &read_args(&store, "log"));
    let all = text(&out);
    assert!(
        all.contains("PROBLEM")
            && all.contains(name)
            && all.contains("over the per-item limit of 1073741824 bytes"),
        "{}",
        describe_output(&out)
    );
    assert_eq!(out.status.code(), Some(4), "{}", describe_output(&out));

    // The flag lowers it.
    let small = bag.join("w2.00000000.0.log");
    std::fs::File::create(&small).unwrap().set_len(3 << 20).unwrap();
    forged_bag(&root, "log", bucket, &[("w2.00000000.0.log", 3 << 20)]);
    let mut args = read_args(&store, "log");
    args.extend(["--max-item-bytes", "2MiB"]);
    let out = bagel_bounded(&args);
    let all = text(&out);
    assert!(
        all.contains("w2.00000000.0.log") && all.contains("over the per-item limit of 2097152 bytes"),
        "{}",
        describe_output(&out)
    );
    assert_eq!(out.status.code(), Some(4), "{}", describe_output(&out));
}

/// FIFOs at `paths` (the `mkfifo` command, all at once).
fn mkfifo(paths: &[PathBuf]) {
    let st = Command::new("mkfifo").args(paths).status().expect("run mkfifo");
    assert!(st.success(), "mkfifo failed");
}

#[test]
fn a_fifo_in_place_of_a_lock_fails_the_read_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let bucket = Bucket::of(SystemClock.now().saturating_sub(Duration::from_secs(600)));
    let bag = root.join("log").join(bucket.path());
    std::fs::create_dir_all(&bag).unwrap();
    mkfifo(&[bag.join("lock")]);

    let out = bagel_bounded(&read_args(&url(&root), "log"));
    let all = text(&out);
    assert!(
        all.contains(&bucket.to_string()) && all.contains("`lock` is a FIFO"),
        "{}",
        describe_output(&out)
    );
    assert!(!all.contains("timed out"), "{all}");
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
}

#[test]
fn sealing_back_to_a_start_mark_at_the_epoch_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    std::fs::create_dir_all(root.join("log/_start")).unwrap();
    std::fs::write(root.join("log/_start/0"), b"").unwrap();
    let store = url(&root);

    let mut args = read_args(&store, "log");
    args.extend(["--from", "0"]);
    let out = bagel_bounded(&args);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    assert!(
        all.contains("would seal") && all.contains("1970-01-01") && all.contains("--max-seal-lookback"),
        "{all}"
    );
    assert!(!root.join("log/1970").exists(), "sealed bags before refusing");

    // From ten minutes ago, within the default hour: read, sealing those.
    let from = SystemClock
        .now()
        .saturating_sub(Duration::from_secs(600))
        .as_micros()
        .to_string();
    let mut args = read_args(&store, "log");
    args.extend(["--from", &from, "--json"]);
    let out = bagel_bounded(&args);
    assert!(out.status.success(), "{}", describe_output(&out));
    assert!(!root.join("log/1970").exists());
}

/// A running `bagel metronome --http`, killed on drop.
struct Metronome {
    child: Child,
    http: String,
}

impl Metronome {
    fn start(root: &Path, logs: &[&str]) -> Metronome {
        let mut cmd = Command::new(bin("bagel"));
        cmd.args([
            "metronome",
            "--unsafe-local-clock",
            "--store",
            &url(root),
            "--grace",
            "200ms",
            "--lookback",
            "3s",
        ])
        .args(["--http", "127.0.0.1:0", "--log"])
        .args(logs);
        let (child, http) = bagel_tests::spawn_with_side_port(cmd.stderr(Stdio::null()));
        Metronome { child, http }
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        reqwest::get(format!("{}{path}", self.http))
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }
}

impl Drop for Metronome {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_stuck_log_does_not_stop_the_metronome_closing_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let (stuck1, good, stuck2) = (unique("stuck"), unique("good"), unique("stuck"));
    // Every bag the metronome will reach in the two stuck logs has a FIFO
    // for its lock: opening one for reading waits for a writer forever.
    let now = Bucket::of(SystemClock.now());
    let mut fifos = Vec::new();
    for log in [&stuck1, &good, &stuck2] {
        // Every log has been started by a writer (a metronome closes only
        // logs that exist), and has a bag every second, as a busy log does.
        let start = root.join(log).join("_start");
        std::fs::create_dir_all(&start).unwrap();
        std::fs::write(start.join((now.secs() - 10).to_string()), b"").unwrap();
        for s in now.secs() - 10..now.secs() + 300 {
            let bag = root.join(log).join(Bucket::from_secs(s).path());
            std::fs::create_dir_all(&bag).unwrap();
            if log != &good {
                fifos.push(bag.join("lock"));
            }
        }
    }
    mkfifo(&fifos);
    let m = Metronome::start(&root, &[&stuck1, &good, &stuck2]);
    // The good log is closed, now and from then on.
    let want = Bucket::of(SystemClock.now().saturating_add(Duration::from_secs(2)));
    let lock = root.join(&good).join(want.path()).join("lock");
    let give_up = Instant::now() + Duration::from_secs(30);
    while !lock.exists() {
        assert!(
            Instant::now() < give_up,
            "bag {want} of the good log was never closed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Readiness names every stuck log, and says why.
    let r = m.get("/readyz").await;
    assert_eq!(r.status().as_u16(), 503);
    let why = r.text().await.unwrap();
    assert!(
        why.contains(&stuck1) && why.contains(&stuck2) && why.contains("FIFO") && !why.contains(&good),
        "{why}"
    );
}

#[tokio::test]
async fn the_metronome_page_forbids_scripts_and_sniffing() {
    let dir = tempfile::tempdir().unwrap();
    let m = Metronome::start(dir.path(), &[&unique("log")]);
    for path in ["/", "/readyz", "/metrics", "/metronome.css"] {
        let r = m.get(path).await;
        let h = r.headers();
        assert_eq!(
            h.get("x-content-type-options").map(|v| v.to_str().unwrap()),
            Some("nosniff"),
            "{path}: {h:?}"
        );
        let csp = h
            .get("content-security-policy")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        assert!(
            csp.contains("default-src 'none'") && !csp.contains("script-src"),
            "{path}: {csp:?}"
        );
    }
    let page = m.get("/").await.text().await.unwrap();
    assert!(
        page.contains("metronome.css") && !page.contains("<style"),
        "{page}"
    );
    let css = m.get("/metronome.css").await;
    assert_eq!(css.status().as_u16(), 200);
    assert!(css.text().await.unwrap().contains("border-collapse"));
}

#[test]
fn a_clean_read_still_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let bucket = Bucket::of(SystemClock.now().saturating_sub(Duration::from_secs(600)));
    forged_bag(&root, "log", bucket, &[]);
    let out = bagel_bounded(&read_args(&url(&root), "log"));
    assert!(out.status.success(), "{}", describe_output(&out));
}

/// A private bindfs (FUSE) view of a directory whose daemon can be stopped:
/// every call into the view then blocks, as on a hung NFS mount.
struct StoppableMount {
    daemon: Child,
    mnt: PathBuf,
    stopped: bool,
}

impl StoppableMount {
    fn start(src: &Path, mnt: &Path) -> StoppableMount {
        std::fs::create_dir_all(mnt).unwrap();
        let daemon = Command::new("bindfs")
            .arg("-f")
            .arg(src)
            .arg(mnt)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("bindfs (FUSE) is needed: apt-get install bindfs");
        let m = StoppableMount {
            daemon,
            mnt: mnt.to_owned(),
            stopped: false,
        };
        let give_up = Instant::now() + Duration::from_secs(20);
        while !Command::new("mountpoint")
            .arg("-q")
            .arg(mnt)
            .status()
            .unwrap()
            .success()
        {
            assert!(Instant::now() < give_up, "bindfs never mounted {}", mnt.display());
            std::thread::sleep(Duration::from_millis(50));
        }
        m
    }

    fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args([sig, &self.daemon.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    }

    fn stop(&mut self) {
        self.signal("-STOP");
        self.stopped = true;
    }
}

impl Drop for StoppableMount {
    fn drop(&mut self) {
        if self.stopped {
            self.signal("-CONT");
        }
        let _ = Command::new("fusermount").arg("-u").arg(&self.mnt).status();
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

#[test]
fn a_storage_call_that_never_returns_does_not_keep_bagel_from_exiting() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("log/_start")).unwrap();
    let mnt = dir.path().join("mnt");
    let mut mount = StoppableMount::start(&src, &mnt);
    mount.stop();

    // Every storage call hangs; the storage timeout (10 s) gives up on
    // it, and the command exits with that error rather than waiting for
    // the call it gave up on.
    let out = bagel_bounded(&read_args(&url(&mnt), "log"));
    let all = text(&out);
    assert!(all.contains("timed out after 10s"), "{}", describe_output(&out));
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    drop(mount);
}
