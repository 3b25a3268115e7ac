//! A message's bytes are bound to the lease that allowed them and to where
//! they belong: over the real server and `bagel` CLI on a directory store,
//! a party with write access to the store forges a batch (another writer
//! and payload, the CRC fixed, listed in the lock), lists a data file twice
//! or copies it under another name, or copies it into another log's bag.
//! `bagel read` reports each and does not say verified; `bagel audit`
//! names each as a violation.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bagel_bags::{self as bag, BagConfig, ListedItem, Listing, frame};
use bagel_client::Micros;
use bagel_proto::clock::{AssumedExact, SystemClock};
use bagel_proto::pb;
use bagel_tests::{ServerProcess, describe_output, unique};
use bytes::Bytes;
use prost::Message as _;

const GRACE: &str = "200ms";

struct Setup {
    server: ServerProcess,
    dir: tempfile::TempDir,
    state: tempfile::TempDir,
    url: String,
    cfg: BagConfig,
}

impl Setup {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        Setup {
            server: ServerProcess::start_ready(&[]).await,
            dir,
            state: tempfile::tempdir().unwrap(),
            url,
            cfg: BagConfig::default().with_grace(Duration::from_millis(200)),
        }
    }

    fn bagel(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(bagel_tests::bin("bagel"))
            .args(["--server", &self.server.url])
            .args(args)
            .env("BAGEL_STATE_DIR", self.state.path())
            .output()
            .expect("bagel")
    }

    /// `bagel acquire` into a lease file, then `bagel write` of `messages`
    /// into `log` under it; closes the bags written.
    async fn write(&self, name: &str, log: &str, messages: &[&str]) {
        let out = self.bagel(&["acquire", name, "--ttl", "10s", "--json"]);
        assert!(out.status.success(), "{}", describe_output(&out));
        let lease: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            lease["holder_secret"].as_str().is_some_and(|s| s.len() == 64),
            "the lease file carries the lease's holder key: {lease}"
        );
        let file = self.state.path().join(format!("{name}.json"));
        std::fs::write(&file, &out.stdout).unwrap();
        let mut args = vec![
            "write",
            "--store",
            &self.url,
            "--log",
            log,
            "--grace",
            GRACE,
            "--lease",
            file.to_str().unwrap(),
        ];
        args.extend_from_slice(messages);
        let out = self.bagel(&args);
        assert!(out.status.success(), "{}", describe_output(&out));
        let store = bag::open_store(&self.url, &self.cfg).await.unwrap();
        let until = Micros::now().saturating_add(Duration::from_secs(1));
        bag::close_through(store.as_ref(), log, until, &self.cfg, &AssumedExact(SystemClock))
            .await
            .unwrap();
    }

    fn read(&self, log: &str) -> (std::process::Output, Vec<serde_json::Value>) {
        let out = self.bagel(&[
            "read",
            "--store",
            &self.url,
            "--log",
            log,
            "--grace",
            GRACE,
            "--json",
            "--key",
            &self.server.public_key_hex,
        ]);
        // 4: the read rejected messages or found damage (what these tests
        // make it find); anything else non-zero is a failure.
        assert!(
            matches!(out.status.code(), Some(0 | 4)),
            "{}",
            describe_output(&out)
        );
        let lines = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        (out, lines)
    }

    /// `bagel audit`: its exit code and the kinds of its violations.
    fn audit(&self, log: &str) -> (Option<i32>, Vec<String>, std::process::Output) {
        let out = self.bagel(&[
            "audit",
            "--store",
            &self.url,
            "--log",
            log,
            "--grace",
            GRACE,
            "--json",
            "--key",
            &self.server.public_key_hex,
        ]);
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe_output(&out)));
        let kinds = v["violations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["kind"].as_str().unwrap().to_owned())
            .collect();
        (out.status.code(), kinds, out)
    }

    /// The bag of `log` holding a data file, and that file's name.
    fn data_file(&self, log: &str) -> (PathBuf, String) {
        fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, found);
                } else if p.extension().is_some_and(|x| x == "log") && p.metadata().unwrap().len() > 0 {
                    found.push(p);
                }
            }
        }
        let mut found = Vec::new();
        walk(&self.dir.path().join(log), &mut found);
        found.sort();
        let file = found
            .first()
            .unwrap_or_else(|| panic!("no data file in log {log}"));
        (
            file.parent().unwrap().to_owned(),
            file.file_name().unwrap().to_str().unwrap().to_owned(),
        )
    }
}

/// Adds `name` (already in `bag`) to the bag's lock with its size, as a
/// party with write access to the store can.
fn list_in_lock(bag: &Path, name: &str) {
    let lock = bag.join("lock");
    let mut listing = Listing::decode(&std::fs::read(&lock).unwrap()).unwrap();
    listing.items.push(ListedItem {
        name: name.to_owned(),
        size: std::fs::metadata(bag.join(name)).unwrap().len(),
        etag: None,
    });
    std::fs::write(&lock, listing.encode()).unwrap();
}

fn of_kind<'a>(lines: &'a [serde_json::Value], kind: &str) -> Vec<&'a serde_json::Value> {
    lines.iter().filter(|l| l["kind"] == kind).collect()
}

#[tokio::test]
async fn a_forged_batch_is_rejected_by_read_and_a_violation_for_audit() {
    let s = Setup::new().await;
    let log = unique("ledger");
    s.write("acct", &log, &["deposit 10", "withdraw 3"]).await;
    let (out, lines) = s.read(&log);
    assert_eq!(of_kind(&lines, "message").len(), 2, "{}", describe_output(&out));
    assert!(
        lines.iter().all(|l| l["verified"] == true),
        "an honest history verifies: {}",
        describe_output(&out)
    );

    // Copy the stored batch, change its writer and payload, fix the CRC,
    // and list the copy in the bag's lock.
    let (bag, file) = s.data_file(&log);
    let bytes = Bytes::from(std::fs::read(bag.join(&file)).unwrap());
    let frame::Frame::Record { body, .. } = &frame::decode(&bytes)[0] else {
        panic!("no record in {file}");
    };
    let mut batch = pb::Batch::decode(body.clone()).unwrap();
    batch.writer_id = "mallory".into();
    batch.entries[0].payload = b"withdraw 1000000".to_vec();
    std::fs::write(bag.join("mallory.0.log"), frame::encode(&batch.encode_to_vec())).unwrap();
    list_in_lock(&bag, "mallory.0.log");

    let (out, lines) = s.read(&log);
    let rejected = of_kind(&lines, "rejected");
    assert!(
        rejected.iter().any(|r| r["payload"] == "withdraw 1000000"
            && r["verified"] == false
            && r["reason"].as_str().unwrap().contains("holder signature")),
        "{}",
        describe_output(&out)
    );
    assert!(
        !of_kind(&lines, "message")
            .iter()
            .any(|m| m["payload"] == "withdraw 1000000"),
        "{}",
        describe_output(&out)
    );
    let summary = of_kind(&lines, "summary")[0];
    assert_eq!(summary["verified"], false, "{}", describe_output(&out));

    let (code, kinds, out) = s.audit(&log);
    assert_eq!(code, Some(1), "{}", describe_output(&out));
    assert!(
        kinds.contains(&"not_signed_by_holder".to_owned()),
        "{}",
        describe_output(&out)
    );
}

#[tokio::test]
async fn a_data_file_listed_twice_or_copied_is_reported_as_a_duplicate() {
    let s = Setup::new().await;
    let log = unique("ledger");
    s.write("acct", &log, &["deposit 10", "withdraw 3"]).await;
    let (bag, file) = s.data_file(&log);
    // The same file listed a second time, and a copy under another name.
    list_in_lock(&bag, &file);
    std::fs::copy(bag.join(&file), bag.join("copy.0.log")).unwrap();
    list_in_lock(&bag, "copy.0.log");

    let (out, lines) = s.read(&log);
    let messages = of_kind(&lines, "message");
    assert_eq!(
        messages.len(),
        2,
        "each message is counted once: {}",
        describe_output(&out)
    );
    let problems = of_kind(&lines, "problem");
    assert_eq!(problems.len(), 2, "{}", describe_output(&out));
    assert!(
        problems
            .iter()
            .all(|p| p["what"].as_str().unwrap().starts_with("duplicate batch")),
        "{}",
        describe_output(&out)
    );
    assert_eq!(
        of_kind(&lines, "summary")[0]["verified"],
        false,
        "{}",
        describe_output(&out)
    );

    let (code, kinds, out) = s.audit(&log);
    assert_eq!(code, Some(1), "{}", describe_output(&out));
    assert_eq!(
        kinds,
        ["duplicate_batch", "duplicate_batch"],
        "{}",
        describe_output(&out)
    );
}

#[tokio::test]
async fn a_data_file_copied_into_another_logs_bag_is_reported_as_misplaced() {
    let s = Setup::new().await;
    let (log, other) = (unique("ledger"), unique("other"));
    s.write("acct", &log, &["deposit 10"]).await;
    let (bag, file) = s.data_file(&log);
    // The bag of the same second in another log, holding only the copy.
    let rel = bag.strip_prefix(s.dir.path().join(&log)).unwrap();
    let target = s.dir.path().join(&other).join(rel);
    std::fs::create_dir_all(&target).unwrap();
    std::fs::copy(bag.join(&file), target.join(&file)).unwrap();
    std::fs::write(target.join("prelock"), b"").unwrap();
    std::fs::write(target.join("lock"), Listing::default().encode()).unwrap();
    list_in_lock(&target, &file);

    let (out, lines) = s.read(&other);
    assert!(of_kind(&lines, "message").is_empty(), "{}", describe_output(&out));
    assert_eq!(of_kind(&lines, "rejected").len(), 1, "{}", describe_output(&out));
    let problems = of_kind(&lines, "problem");
    assert!(
        problems.len() == 1
            && problems[0]["what"]
                .as_str()
                .unwrap()
                .starts_with("misplaced batch"),
        "{}",
        describe_output(&out)
    );
    assert!(
        problems[0]["what"]
            .as_str()
            .unwrap()
            .contains(&format!("names log {log:?}")),
        "the problem names the log the batch belongs to: {}",
        describe_output(&out)
    );

    let (code, kinds, out) = s.audit(&other);
    assert_eq!(code, Some(1), "{}", describe_output(&out));
    assert!(
        kinds.contains(&"misplaced_batch".to_owned()),
        "{}",
        describe_output(&out)
    );
    // The original log still audits clean.
    let (code, kinds, out) = s.audit(&log);
    assert_eq!((code, kinds.len()), (Some(0), 0), "{}", describe_output(&out));
}
