//! The real `bagel` over a directory store in which someone with write
//! access has published a small hostile summary (issue 38, item 1): a
//! 51 KB object whose first batch cites one 50 KB witness 1,000 times,
//! then nine "same as the previous" batches (500 MB of records rebuilt;
//! a read held ~970 MB), and 4 MB of empty batches (313 MB to decode).
//! Each command must name the object as corrupt, go on with the rest of
//! the log, and stay under [`PEAK_RSS_KIB`] of memory. And one within the
//! bound (`MAX_SUMMARY_EXPANSION`), read as a summary, whose cited
//! witnesses must be held once, not once per citation.
//!
//! Peak memory is the kernel's: `getrusage(RUSAGE_CHILDREN)`'s `ru_maxrss`,
//! the largest peak resident set of any child this process has reaped. It
//! only grows, so read after a command it bounds that command's peak (and
//! every one before it); a number over the bound may name an earlier
//! child, never hide this one. A child shares this process's memory until
//! it execs (`posix_spawn`), and Linux counts this process's own peak into
//! the child's: so these tests never hold more than a few MB themselves
//! (the 4 MB flood is encoded as bytes, never as 2 million structs).

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use bagel_bags::seal::Span;
use bagel_bags::store::directory::DirectoryStore;
use bagel_bags::summary::attest::digest;
use bagel_bags::summary::{Stretch, Summary, SummaryBag, SummaryBatch, SummaryItem, packed};
use bagel_bags::{BagConfig, BagState, BagStore, Bucket, Writer};
use bagel_proto::Micros;
use bagel_proto::clock::{Clock as _, ManualClock, SystemClock};
use bagel_proto::pb;
use bagel_tests::{TestLeases, bin, describe_output};
use bytes::Bytes;
use nix::sys::resource::{UsageWho, getrusage};
use prost::Message as _;

/// The most any `bagel` here may hold at its peak: a normal read of these
/// logs takes about 12 MB.
const PEAK_RSS_KIB: i64 = 200 * 1024;

/// Far above what any of these commands needs when it behaves; a command
/// still running then is the failure (it is killed and its output shown).
const GENEROUS: Duration = Duration::from_secs(120);

const LOG: &str = "ledger";

/// Runs `bagel --unsafe-local-clock args` (the closer's clock is not what
/// these tests are about) and returns its output and the peak resident
/// set, in KiB, of the largest child reaped so far (see the module docs).
fn bagel(args: &[&str]) -> (Output, i64) {
    let child = Command::new(bin("bagel"))
        .arg("--unsafe-local-clock")
        .args(args)
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
    let out = match rx.recv_timeout(GENEROUS) {
        Ok(out) => out.expect("bagel output"),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            let out = rx.recv().expect("output after kill").expect("bagel output");
            panic!(
                "bagel {args:?} still running after {GENEROUS:?}: {}",
                describe_output(&out)
            );
        }
    };
    let peak = getrusage(UsageWho::RUSAGE_CHILDREN).expect("getrusage").max_rss();
    eprintln!(
        "bagel {}: exit {:?}, peak RSS of children so far {} KiB",
        args[0],
        out.status.code(),
        peak
    );
    (out, peak)
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Asserts the command stayed under [`PEAK_RSS_KIB`].
fn bounded(what: &str, (out, peak): (Output, i64)) -> Output {
    assert!(
        peak < PEAK_RSS_KIB,
        "{what}: peak RSS {peak} KiB, over {PEAK_RSS_KIB} KiB: {}",
        describe_output(&out)
    );
    out
}

/// A directory store whose log holds one closed bag in each of three
/// consecutive minutes (half an hour ago), with `deposit 0`, `deposit 1`
/// and `deposit 2`; returns the three bags.
async fn three_minutes(root: &Path, leases: &TestLeases) -> [Bucket; 3] {
    std::fs::create_dir_all(root).unwrap();
    let store: Arc<dyn BagStore> = Arc::new(DirectoryStore::local(root, false));
    let now = SystemClock.now().saturating_sub(Duration::from_secs(1800));
    let minute = now.as_micros() / 60_000_000 * 60_000_000;
    let t = Micros::from_micros(minute + 10_000_000);
    let clock = ManualClock::new(t);
    let lease = leases.lease(
        "l1",
        t.saturating_sub(Duration::from_secs(1)),
        t.saturating_add(Duration::from_secs(300)),
    );
    let w = Writer::new(
        Arc::clone(&store),
        LOG,
        "w1",
        Arc::new(lease),
        Arc::new(clock.clone()),
        leases.time(Arc::new(clock.clone())),
        BagConfig::default().with_sync(false),
    )
    .unwrap();
    let mut bags = Vec::new();
    for i in 0..3u64 {
        clock.set(t.saturating_add(Duration::from_secs(60 * i)));
        let stamps = w
            .write_batch(vec![Bytes::from(format!("deposit {i}"))])
            .await
            .unwrap();
        bags.push(Bucket::of(stamps[0]));
    }
    for b in &bags {
        store.close(LOG, *b).await.unwrap();
    }
    bags.try_into().unwrap()
}

/// The one-minute stretch holding `bag`.
fn stretch_of(bag: Bucket) -> Stretch {
    Stretch::new(Span::of(bag), 1)
}

/// A format 2 summary of `bag`'s minute, as a summarizer would name and
/// shape it, whose one item is `batches` and then `empty` more batches
/// that are "same as the previous" and hold no message (2 bytes each,
/// appended as bytes), with one witness of `witness_bytes` bytes of body
/// (it need not verify: it never gets that far).
fn hostile(bag: Bucket, batches: Vec<SummaryBatch>, empty: usize, witness_bytes: usize) -> Bytes {
    hostile_with_lock(bag, batches, empty, witness_bytes, vec![0; 32])
}

/// [`hostile`], saying its bag's lock has the SHA-256 `lock`.
fn hostile_with_lock(
    bag: Bucket,
    batches: Vec<SummaryBatch>,
    empty: usize,
    witness_bytes: usize,
    lock: Vec<u8>,
) -> Bytes {
    use prost::encoding::{WireType, encode_key, encode_varint};
    // A message's fields may come in any order, and a repeated field's
    // elements in any number of runs: each part is appended as a field of
    // its own.
    let field = |out: &mut Vec<u8>, tag: u32, body: &[u8]| {
        encode_key(tag, WireType::LengthDelimited, out);
        encode_varint(body.len() as u64, out);
        out.extend_from_slice(body);
    };
    let mut item = SummaryItem {
        batches,
        ..Default::default()
    }
    .encode_to_vec();
    item.reserve(2 * empty);
    for _ in 0..empty {
        field(&mut item, 3, &[]);
    }
    let mut bag_bytes = SummaryBag {
        bucket_secs: bag.secs(),
        lock_sha256: lock,
        items: Vec::new(),
    }
    .encode_to_vec();
    field(&mut bag_bytes, 3, &item);
    drop(item);
    let st = stretch_of(bag);
    let s = Summary {
        format: packed::FORMAT,
        log: LOG.into(),
        from_secs: st.from().secs(),
        to_secs: st.last().secs() + 1,
        witnesses: vec![pb::Witness {
            body: vec![7; witness_bytes].into(),
            signature: vec![1; 64].into(),
            key_id: "k".into(),
            ..Default::default()
        }],
        writer_ids: vec!["w1".into()],
        item_names: vec!["w1.00000000.0.log".into()],
        ..Default::default()
    };
    let mut out = s.encode_to_vec();
    field(&mut out, 25, &bag_bytes);
    Bytes::from(out)
}

/// Publishes `bytes` under the name of `bag`'s minute's summary.
async fn publish(root: &Path, bag: Bucket, bytes: Bytes) -> String {
    let store = DirectoryStore::local(root, false);
    let name = stretch_of(bag).name();
    assert!(store.put_first(LOG, &name, bytes).await.unwrap().is_none());
    name
}

/// Reads the whole log: the hostile summary is named as corrupt, its
/// minute read from its bag, and the other minutes as ever (exit 4).
fn read_goes_on(url: &str, name: &str) {
    let out = bounded("read", bagel(&["read", "--store", url, "--log", LOG]));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(4), "{}", describe_output(&out));
    assert!(
        all.contains("PROBLEM") && all.contains(name) && all.contains("corrupt"),
        "{all}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    for i in 0..3 {
        assert!(stdout.contains(&format!("deposit {i}")), "deposit {i}: {all}");
    }
}

/// Audits the whole log: every message audited, the summary a violation
/// naming it (exit 1).
fn audit_names_it(url: &str, name: &str, key: &str) {
    let out = bounded(
        "audit",
        bagel(&["audit", "--store", url, "--log", LOG, "--key", key]),
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    assert!(
        all.contains("VIOLATION") && all.contains(name) && all.contains("corrupt"),
        "{all}"
    );
    assert!(all.contains("audited 3 messages"), "{all}");
}

/// The 51 KB object, published as the summary of the middle
/// minute: `read` and `audit` name it and read the rest; `summarize`
/// names it and summarizes the minutes around it; `retain` keeps its
/// minute's bags (a KEPT line naming it) and removes the others'; a read
/// after all that still finds every message.
#[tokio::test]
async fn a_summary_citing_one_large_witness_over_and_over_is_named_and_read_around() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let leases = TestLeases::default();
    let bags = three_minutes(&root, &leases).await;
    let batches = vec![SummaryBatch {
        writer: 1,
        witnesses: vec![1; 1000],
        ..Default::default()
    }];
    let bytes = hostile(bags[1], batches, 9, 50_000);
    assert!(bytes.len() < 52_000, "{}", bytes.len());
    let name = publish(&root, bags[1], bytes).await;
    let url = format!("file://{}", root.display());

    read_goes_on(&url, &name);
    audit_names_it(&url, &name, &leases.key_hex());

    // Summarizing reaches the hostile object under the middle minute's
    // name: it names it and goes on to the last minute.
    let to = (stretch_of(bags[2]).last().secs() + 1).to_string() + "000000";
    let out = bounded(
        "summarize",
        bagel(&["summarize", "--store", &url, "--log", LOG, "--to", &to]),
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&name) && stderr.contains("corrupt"), "{all}");
    for b in [bags[0], bags[2]] {
        let made = root.join(LOG).join(stretch_of(b).name());
        assert!(made.is_file(), "{} not published: {all}", made.display());
    }

    // Retention keeps the hostile minute's bag, naming the object, and
    // removes the others'.
    let out = bounded(
        "retain",
        bagel(&["retain", "--store", &url, "--log", LOG, "--keep-bags", "10m"]),
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    assert!(
        all.lines()
            .any(|l| l.starts_with("KEPT") && l.contains(&name) && l.contains("corrupt")),
        "{all}"
    );
    assert!(all.contains("removed 2 bags"), "{all}");
    assert!(root.join(LOG).join(bags[1].path()).is_dir(), "{all}");

    // Minutes 0 and 2 from their summaries, minute 1 from its bag.
    read_goes_on(&url, &name);
}

/// The 4 MB of empty batches (2 bytes each stored), published as
/// the summary of the middle minute: refused before it is decoded, named,
/// and read around.
#[tokio::test]
async fn a_summary_of_millions_of_empty_batches_is_named_and_read_around() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let leases = TestLeases::default();
    let bags = three_minutes(&root, &leases).await;
    let batches = vec![SummaryBatch {
        writer: 1,
        ..Default::default()
    }];
    let bytes = hostile(bags[1], batches, 2_000_000, 100);
    assert!(bytes.len() < 4_100_000, "{}", bytes.len());
    let name = publish(&root, bags[1], bytes).await;
    let url = format!("file://{}", root.display());

    read_goes_on(&url, &name);
    audit_names_it(&url, &name, &leases.key_hex());
}

/// Within the bound, what a summary cites is held once, not once per
/// citation: one 25 KB witness cited 1,000 times by each of ten batches
/// (250 MB of records, under `MAX_SUMMARY_EXPANSION`), published with the
/// real bag's lock digest so that the audit's comparison with the bag
/// rebuilds it too. `read` takes it for the minute's summary (its copies
/// of one batch are problems, exit 4) and `audit` finds it does not match
/// its bag (exit 1), each holding the witness list once: `read` peaked
/// at 506 MB when each batch got its own copy of the list and of its
/// record.
#[tokio::test]
async fn within_the_bound_a_witness_cited_over_and_over_is_held_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let leases = TestLeases::default();
    let bags = three_minutes(&root, &leases).await;
    let batches = vec![SummaryBatch {
        writer: 1,
        witnesses: vec![1; 1000],
        timestamps: vec![1],
        payloads: vec![Bytes::from_static(b"withdraw 1")],
        ..Default::default()
    }];
    let store = DirectoryStore::local(&root, false);
    let BagState::Closed(listing) = store.state(LOG, bags[1]).await.unwrap() else {
        panic!("bag {} is closed", bags[1]);
    };
    let lock = digest(&listing.encode()).to_vec();
    // Sealed, as a summarized minute is: the audit then compares the
    // summary with the bag its seal lists.
    bagel_bags::seal::seal(&store, LOG, Span::of(bags[1]))
        .await
        .unwrap();
    let bytes = hostile_with_lock(bags[1], batches, 9, 25_000, lock);
    assert!(bytes.len() < 27_000, "{}", bytes.len());
    let name = publish(&root, bags[1], bytes).await;
    let url = format!("file://{}", root.display());

    let out = bounded("read", bagel(&["read", "--store", &url, "--log", LOG]));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(4), "{}", describe_output(&out));
    assert!(all.contains("duplicate batch"), "{all}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for i in [0, 2] {
        assert!(stdout.contains(&format!("deposit {i}")), "deposit {i}: {all}");
    }

    let key = leases.key_hex();
    let out = bounded(
        "audit",
        bagel(&["audit", "--store", &url, "--log", LOG, "--key", &key]),
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    let stretch = stretch_of(bags[1]).to_string();
    assert!(
        all.lines().any(|l| l.starts_with("VIOLATION")
            && l.contains(&stretch)
            && l.contains("records are not the ones summarized")),
        "{name}: {all}"
    );
}
