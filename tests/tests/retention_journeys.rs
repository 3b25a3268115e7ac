//! Retention as operators walk it (issue 37, item 3): summarize, retain,
//! then read with and without summaries, summarize again on a schedule,
//! and retain over a bad summary, with the real `bagel` CLI on a real
//! directory store. Every acknowledged message is read back, or the read
//! fails naming where the messages are: never a silent gap.
//!
//! The messages are written by the real bag writer under test leases on a
//! clock set half an hour back, so their minutes are long past for the
//! CLI's own clock: the commands close and seal on it
//! (`--unsafe-local-clock`, so no lease server is needed for time), and
//! retention runs with a short `--unsafe-min-keep` instead of waiting ten
//! minutes.

use std::collections::BTreeSet;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bagel_bags::seal::{self, Span};
use bagel_bags::summary::{self, Stretch};
use bagel_bags::{self as bag, BagConfig, BagStore, Bucket, Writer};
use bagel_proto::Micros;
use bagel_proto::clock::ManualClock;
use bagel_tests::{TestLeases, bagel_bin, describe_output, unique};
use bytes::Bytes;
use serde_json::Value;

/// A log on a fresh directory, its minute `A` (even, so a 2-minute
/// summary starts there) half an hour back, and one writer's lease.
struct Journey {
    _dir: tempfile::TempDir,
    url: String,
    log: String,
    leases: TestLeases,
    clock: ManualClock,
    store: Arc<dyn BagStore>,
    writer: Writer,
    /// The first second of minute `A`.
    a: u64,
    /// What the writer was told was written, by payload.
    acked: BTreeSet<String>,
}

impl Journey {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        let now = Micros::now().as_micros() / 1_000_000;
        let a = (now - 30 * 60) / 120 * 120;
        let clock = ManualClock::new(Micros::from_micros(a * 1_000_000));
        let store = bag::open_store(&url, &BagConfig::default()).await.unwrap();
        let log = unique("journey");
        let leases = TestLeases::default();
        let start = Micros::from_micros(a * 1_000_000);
        // One lease over the whole journey: one holder, a clean chain.
        let lease = leases.lease(
            "lease-journey",
            start.saturating_sub(Duration::from_secs(60)),
            start.saturating_add(Duration::from_secs(3600)),
        );
        let writer = Writer::new(
            Arc::clone(&store),
            &log,
            "w",
            Arc::new(lease),
            Arc::new(clock.clone()),
            leases.time(Arc::new(clock.clone())),
            BagConfig::default(),
        )
        .unwrap();
        Journey {
            _dir: dir,
            url,
            log,
            leases,
            clock,
            store,
            writer,
            a,
            acked: BTreeSet::new(),
        }
    }

    /// Unix microseconds of `minute` minutes after `A` (as `--from`/`--to`).
    fn at(&self, minute: u64) -> String {
        ((self.a + 60 * minute) * 1_000_000).to_string()
    }

    /// Minute `minute` after `A` as a one-minute stretch.
    fn minute(&self, minute: u64) -> Stretch {
        Stretch::new(Span::of(Bucket::from_secs(self.a + 60 * minute)), 1)
    }

    /// Writes `n` messages, one batch each, a few seconds apart, in minute
    /// `minute` after `A`.
    async fn write(&mut self, minute: u64, n: u64) {
        for k in 0..n {
            let t = (self.a + 60 * minute + 5 + 7 * k) * 1_000_000;
            self.clock.set(Micros::from_micros(t));
            let payload = format!("m{minute}-{k}");
            self.writer
                .write_batch(vec![Bytes::from(payload.clone())])
                .await
                .unwrap();
            self.acked.insert(payload);
        }
    }

    /// The messages written in minutes `[from, to)` after `A`.
    fn acked_in(&self, from: u64, to: u64) -> BTreeSet<String> {
        self.acked
            .iter()
            .filter(|p| {
                let m: u64 = p[1..p.find('-').unwrap()].parse().unwrap();
                (from..to).contains(&m)
            })
            .cloned()
            .collect()
    }

    /// `bagel <cmd> --store … --log … <args>` on this host's clock.
    fn cli(&self, cmd: &str, args: &[&str]) -> Output {
        Command::new(bagel_bin())
            .args([
                "--unsafe-local-clock",
                cmd,
                "--store",
                &self.url,
                "--log",
                &self.log,
            ])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("bagel runs")
    }

    /// `bagel retain` of every summarized stretch that ended over a second
    /// ago.
    fn retain(&self, extra: &[&str]) -> Output {
        let mut args = vec!["--keep-bags", "1s", "--unsafe-min-keep", "1s"];
        args.extend(extra);
        self.cli("retain", &args)
    }

    /// `bagel read --json` of minutes `[from, to)` after `A`, with the
    /// leases' key: (exit code, messages' payloads, problem lines, the
    /// output).
    fn read(&self, from: u64, to: u64, extra: &[&str]) -> Read {
        let key = self.leases.key_hex();
        let (from, to) = (self.at(from), self.at(to));
        let mut args = vec!["--json", "--key", &key, "--from", &from, "--to", &to];
        args.extend(extra);
        let out = self.cli("read", &args);
        let mut read = Read {
            code: out.status.code(),
            payloads: BTreeSet::new(),
            problems: Vec::new(),
            said: describe_output(&out),
        };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
            match v["kind"].as_str() {
                Some("message") => {
                    read.payloads.insert(v["payload"].as_str().unwrap().to_owned());
                }
                Some("problem") => read.problems.push(v),
                _ => {}
            }
        }
        read
    }

    /// The bags still there in minute `minute` after `A`.
    async fn bags_left(&self, minute: u64) -> usize {
        seal::bags_of(self.store.as_ref(), &self.log, self.minute(minute).first)
            .await
            .unwrap()
            .len()
    }
}

struct Read {
    code: Option<i32>,
    payloads: BTreeSet<String>,
    problems: Vec<Value>,
    said: String,
}

/// A summary's object name in its log, as the store holds it (and as
/// every line about it names it).
fn name(st: Stretch) -> String {
    format!("_summary/{}.{}", st.from().secs(), u64::from(st.minutes) * 60)
}

fn ok(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(0), "{}", describe_output(out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A read without summaries of minutes whose bags retention removed
/// printed "0 messages, 0 problems" and exited 0: the minutes looked
/// empty. It must fail (exit 4, as for any problem) with a line per
/// summary naming it and saying to read with summaries; with summaries,
/// everything is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_without_summaries_of_retained_bags_fails_naming_their_summary() {
    let mut j = Journey::new().await;
    j.write(0, 3).await;
    j.write(1, 2).await;
    ok(&j.cli("summarize", &["--to", &j.at(2)]));
    // While the bags are there, both kinds of reader read everything.
    let before = j.read(0, 2, &["--no-summaries"]);
    assert_eq!(
        (before.code, &before.payloads),
        (Some(0), &j.acked),
        "{}",
        before.said
    );
    let retained = ok(&j.retain(&[]));
    // A bag a second: one batch each, seconds apart.
    assert!(retained.contains("removed 5 bags"), "{retained}");
    assert_eq!((j.bags_left(0).await, j.bags_left(1).await), (0, 0));

    let with = j.read(0, 2, &[]);
    assert_eq!((with.code, &with.payloads), (Some(0), &j.acked), "{}", with.said);
    assert!(with.problems.is_empty(), "{}", with.said);

    let without = j.read(0, 2, &["--no-summaries"]);
    assert_eq!(without.code, Some(4), "{}", without.said);
    assert!(without.payloads.is_empty(), "{}", without.said);
    let items: Vec<&str> = without
        .problems
        .iter()
        .map(|p| p["item"].as_str().unwrap())
        .collect();
    assert_eq!(
        items,
        [name(j.minute(0)), name(j.minute(1))],
        "one problem per summary, naming it: {}",
        without.said
    );
    for p in &without.problems {
        let what = p["what"].as_str().unwrap();
        assert!(
            what.contains("removed by retention") && what.contains("read them with summaries"),
            "{what}"
        );
    }
    assert!(
        without.said.contains("read without --no-summaries"),
        "{}",
        without.said
    );

    // Part of a retained minute, and a range with a minute still in bags.
    j.write(2, 1).await;
    ok(&j.cli("summarize", &["--from", &j.at(2), "--to", &j.at(3)]));
    let part = j.read(1, 3, &["--no-summaries"]);
    assert_eq!(part.code, Some(4), "{}", part.said);
    assert_eq!(part.payloads, j.acked_in(2, 3), "{}", part.said);
    assert_eq!(part.problems.len(), 1, "{}", part.said);
    assert_eq!(part.problems[0]["item"], name(j.minute(1)).as_str());
}

/// `bagel summarize` without `--from` went back to the log's start every
/// run and failed at the first retained stretch (`bag … is not closed
/// yet`), so scheduled summarizing, and the retention behind it, stopped
/// for good. It resumes at the oldest stretch not summarized yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summarize_resumes_after_retention_at_the_oldest_stretch_not_summarized() {
    let mut j = Journey::new().await;
    j.write(0, 2).await;
    j.write(1, 2).await;
    ok(&j.cli("summarize", &["--to", &j.at(2)]));
    ok(&j.retain(&[]));
    assert_eq!((j.bags_left(0).await, j.bags_left(1).await), (0, 0));
    // Written later, into a minute nobody has sealed yet.
    j.write(3, 3).await;

    let out = ok(&j.cli("summarize", &[]));
    assert!(
        !out.contains(&name(j.minute(0))) && !out.contains(&name(j.minute(1))),
        "the summarized stretches are not built again: {out}"
    );
    let published = summary::list(j.store.as_ref(), &j.log).await.unwrap();
    for m in [2, 3] {
        assert!(
            published.contains(&j.minute(m)),
            "minute {m}: {published:?}\n{out}"
        );
    }
    assert!(
        out.contains(&format!(
            "summary {} ({}): 3 bags, 3 messages",
            name(j.minute(3)),
            j.minute(3)
        )),
        "{out}"
    );
    // Run again, as a schedule does: no failure, and nothing built again
    // (only a minute that closed since, if the clock crossed one).
    let again = ok(&j.cli("summarize", &[]));
    assert!(
        !again.contains("already published") && !again.contains("skipped"),
        "{again}"
    );

    // So retention goes on, and every message is still read.
    ok(&j.retain(&[]));
    assert_eq!(j.bags_left(3).await, 0);
    let read = j.read(0, 4, &[]);
    assert_eq!((read.code, &read.payloads), (Some(0), &j.acked), "{}", read.said);

    // Asked from a stretch already summarized and retained (--from), it
    // says so and goes on rather than failing.
    let from = ok(&j.cli("summarize", &["--from", &j.at(0), "--to", &j.at(4)]));
    assert!(
        from.contains(&format!("stretch {}: skipped", j.minute(0))) && from.contains("3 stretches"),
        "{from}"
    );
}

/// `bagel retain` stopped at the first corrupt summary (exit 1) and never
/// reached the later ones. It keeps the bags of a corrupt or forged
/// summary with a `KEPT` line naming it and why, retains the rest, and
/// then exits 1, so a scheduled run still signals the finding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retain_keeps_the_bags_of_a_bad_summary_and_goes_on_with_the_others() {
    let mut j = Journey::new().await;
    for m in 0..3 {
        j.write(m, 2).await;
    }
    ok(&j.cli("summarize", &["--to", &j.at(3)]));
    // Minute A's summary corrupted in place; minute A+1's replaced by a
    // forged one that leaves its bag out.
    let (corrupt, forged) = (j.minute(0), j.minute(1));
    let path = j._dir.path().join(&j.log).join(name(corrupt));
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, b"not a summary").unwrap();
    let mut fake = summary::build(j.store.as_ref(), &j.log, forged).await.unwrap();
    fake.bags.clear();
    summary::remove(j.store.as_ref(), &j.log, forged).await.unwrap();
    summary::publish(j.store.as_ref(), &j.log, forged, &fake)
        .await
        .unwrap();

    let out = j.retain(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let kept: Vec<&str> = stdout.lines().filter(|l| l.starts_with("KEPT ")).collect();
    assert_eq!(kept.len(), 2, "{}", describe_output(&out));
    assert!(
        kept[0].contains(&name(corrupt)) && kept[0].contains("corrupt"),
        "{}",
        kept[0]
    );
    assert!(
        kept[1].contains(&name(forged)) && kept[1].contains("left out of the summary"),
        "{}",
        kept[1]
    );
    assert!(stdout.contains("checked 3 summaries; removed 2 bags"), "{stdout}");
    assert_eq!(
        (j.bags_left(0).await, j.bags_left(1).await, j.bags_left(2).await),
        (2, 2, 0),
        "the bad summaries' bags stay, the good one's go"
    );
    // The JSON says the same, and exits the same.
    let json = j.retain(&["--json"]);
    assert_eq!(json.status.code(), Some(1), "{}", describe_output(&json));
    let v: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["kept"].as_array().map(Vec::len), Some(2), "{v}");

    // Nothing acknowledged is lost: minute A+2 from its summary, the
    // others from their bags.
    let read = j.read(2, 3, &[]);
    assert_eq!(
        (read.code, &read.payloads),
        (Some(0), &j.acked_in(2, 3)),
        "{}",
        read.said
    );
    let read = j.read(0, 2, &["--no-summaries"]);
    assert_eq!(
        (read.code, &read.payloads),
        (Some(0), &j.acked_in(0, 2)),
        "{}",
        read.said
    );
}

/// Minute A summarized with `--span 1m`, minutes A..A+1 with `--span 2m`,
/// then retention: the reader took the 1-minute summary, skipped the
/// overlapping 2-minute one whole, and read minute A+1 from bags
/// retention had removed (2 of 5 messages, exit 0). Each minute is read
/// from the first summary that holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_summaries_of_different_spans_lose_no_second() {
    let mut j = Journey::new().await;
    j.write(0, 2).await;
    j.write(1, 3).await;
    ok(&j.cli(
        "summarize",
        &["--span", "1m", "--from", &j.at(0), "--to", &j.at(1)],
    ));
    ok(&j.cli(
        "summarize",
        &["--span", "2m", "--from", &j.at(0), "--to", &j.at(2)],
    ));
    let published = summary::list(j.store.as_ref(), &j.log).await.unwrap();
    assert_eq!(
        published,
        [j.minute(0), Stretch::new(j.minute(0).first, 2)],
        "the two overlapping summaries"
    );
    ok(&j.retain(&[]));
    assert_eq!((j.bags_left(0).await, j.bags_left(1).await), (0, 0));

    let read = j.read(0, 2, &[]);
    assert_eq!((read.code, &read.payloads), (Some(0), &j.acked), "{}", read.said);
    let second = j.read(1, 2, &[]);
    assert_eq!(
        (second.code, &second.payloads),
        (Some(0), &j.acked_in(1, 2)),
        "{}",
        second.said
    );
    // The audit reads the same way: every message, none missing.
    let key = j.leases.key_hex();
    let (from, to) = (j.at(0), j.at(2));
    let audit = j.cli("audit", &["--json", "--key", &key, "--from", &from, "--to", &to]);
    let v: Value =
        serde_json::from_slice(&audit.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe_output(&audit)));
    assert_eq!(v["messages"], 5, "{}", describe_output(&audit));
    // Test leases' witnesses carry no signed time of their own (the
    // server's do): that is all the audit may find.
    let others: Vec<&Value> = v["violations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| !v["detail"].as_str().unwrap().ends_with("carries no signed time"))
        .collect();
    assert!(others.is_empty(), "{}", describe_output(&audit));
}
