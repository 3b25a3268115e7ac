//! Retention as operators walk it (issue 37, item 3): summarize, retain,
//! then read with and without summaries, summarize again on a schedule,
//! and retain over a bad summary, with the real `bagel` CLI on a real
//! directory store (and on the test suite's S3 server). Every
//! acknowledged message is read back, or the read fails naming where the
//! messages are: never a silent gap. And a minute retention removed stays
//! closed to a writer, closer or reader that comes back to it late.
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
use bagel_tests::{Backend, HookStore, TestLease, TestLeases, bagel_bin, describe_output, unique};
use bytes::Bytes;
use serde_json::Value;

/// A log on a fresh directory, its minute `A` (even, so a 2-minute
/// summary starts there) half an hour back, and one writer's lease.
struct Journey {
    backend: Backend,
    url: String,
    log: String,
    leases: TestLeases,
    /// The one lease every writer of the journey writes under.
    lease: TestLease,
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
        Self::on(Backend::posix()).await
    }

    /// The journey on `backend` (a directory, or a prefix of the test
    /// suite's S3 server).
    async fn on(backend: Backend) -> Self {
        let url = backend.url();
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
            Arc::new(lease.clone()),
            Arc::new(clock.clone()),
            leases.time(Arc::new(clock.clone())),
            BagConfig::default(),
        )
        .unwrap();
        Journey {
            backend,
            url,
            log,
            leases,
            lease,
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
        cli_on(&self.url, &self.log, cmd, args)
    }

    /// `bagel retain` of every summarized stretch that ended over a second
    /// ago.
    fn retain(&self, extra: &[&str]) -> Output {
        let mut args = RETAIN.to_vec();
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

/// `bagel <cmd> --store URL --log LOG <args>` on this host's clock (from
/// a hook, which cannot borrow the journey).
fn cli_on(url: &str, log: &str, cmd: &str, args: &[&str]) -> Output {
    Command::new(bagel_bin())
        .args(["--unsafe-local-clock", cmd, "--store", url, "--log", log])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("bagel runs")
}

/// `bagel retain`'s flags in these journeys: every summarized stretch
/// that ended over a second ago.
const RETAIN: [&str; 4] = ["--keep-bags", "1s", "--unsafe-min-keep", "1s"];

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
    // says so and goes on rather than failing: every one of the four,
    // the empty minute A+2 too (no summary is built over a minute
    // retention removed).
    let from = ok(&j.cli("summarize", &["--from", &j.at(0), "--to", &j.at(4)]));
    assert!(
        from.contains(&format!("stretch {}: skipped", j.minute(0))) && from.contains("4 stretches"),
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
    let path = j.backend.local_root().unwrap().join(&j.log).join(name(corrupt));
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

// Issue 37, items 3d and 3e: a removed bag stays closed for every writer,
// closer and reader, however late it comes back to it.

impl Journey {
    /// Minute `minute` after `A`'s second `second` (a bag `w` wrote into
    /// when `second` is 5, 12 or 19).
    fn second(&self, minute: u64, second: u64) -> Bucket {
        Bucket::from_secs(self.a + 60 * minute + second)
    }

    /// `bagel audit` over minutes `[from, to)` after `A`: its violations,
    /// less what test leases always show (their witnesses carry no signed
    /// time of their own, the server's do), and the whole output.
    fn audit(&self, from: u64, to: u64) -> (Vec<String>, String) {
        let key = self.leases.key_hex();
        let (from, to) = (self.at(from), self.at(to));
        let out = self.cli("audit", &["--json", "--key", &key, "--from", &from, "--to", &to]);
        let v: Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe_output(&out)));
        let found = v["violations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| format!("{}: {}", v["kind"], v["detail"].as_str().unwrap()))
            .filter(|d| !d.ends_with("carries no signed time"))
            .collect();
        (found, describe_output(&out))
    }

    /// After retention removed minute `minute` and something came back to
    /// it (a late writer, a closer, a reader, a crash): every acknowledged
    /// message is read from its summary; a read without summaries fails
    /// naming it; the audit finds nothing; and the next retention exits 0
    /// and leaves no bag there.
    async fn assert_retained(&self, minute: u64) {
        let with = self.read(minute, minute + 1, &[]);
        assert_eq!(
            (with.code, &with.payloads),
            (Some(0), &self.acked_in(minute, minute + 1)),
            "{}",
            with.said
        );
        let without = self.read(minute, minute + 1, &["--no-summaries"]);
        assert_eq!(without.code, Some(4), "{}", without.said);
        assert!(without.payloads.is_empty(), "{}", without.said);
        let items: Vec<&str> = without
            .problems
            .iter()
            .map(|p| p["item"].as_str().unwrap())
            .collect();
        assert_eq!(items, [name(self.minute(minute))], "{}", without.said);
        let (violations, said) = self.audit(minute, minute + 1);
        assert!(violations.is_empty(), "{violations:?}\n{said}");
        let again = self.retain(&[]);
        assert_eq!(again.status.code(), Some(0), "{}", describe_output(&again));
        assert_eq!(self.bags_left(minute).await, 0, "{}", describe_output(&again));
        // And once more after the clean-up: still the same.
        let (violations, said) = self.audit(minute, minute + 1);
        assert!(violations.is_empty(), "{violations:?}\n{said}");
    }

    /// A writer of the journey's lease on its own clock, through `store`.
    fn late_writer(&self, store: Arc<dyn BagStore>, clock: &ManualClock) -> Writer {
        Writer::new(
            store,
            &self.log,
            "late",
            Arc::new(self.lease.clone()),
            Arc::new(clock.clone()),
            self.leases.time(Arc::new(clock.clone())),
            BagConfig::default(),
        )
        .unwrap()
    }
}

/// 3d: a writer held between its rights check and its append (here its
/// store call waits, as on a hung mount, while minute A is summarized and
/// retained) came back to a bag retention had removed. Its append made the
/// bag again, the seal's finish closed it with a lock listing only the
/// late record, and the write was acknowledged, although the summary
/// readers use does not hold it. It must be `LateRejected`, as it is when
/// the bag is still there.
async fn a_writer_paused_past_retention_is_late_rejected(backend: Backend) {
    let mut j = Journey::on(backend).await;
    j.write(0, 3).await;
    // In the second `w` wrote its first message into: the seal lists it.
    let clock = ManualClock::new(Micros::from_micros(j.second(0, 5).secs() * 1_000_000 + 500_000));
    let hooked = HookStore::new(Arc::clone(&j.store));
    let late = j.late_writer(hooked.store(), &clock);
    let (url, log, to, resumed) = (j.url.clone(), j.log.clone(), j.at(1), clock.clone());
    hooked.before_next_append(Box::new(move || {
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                ok(&cli_on(&url, &log, "summarize", &["--to", &to]));
                let retained = ok(&cli_on(&url, &log, "retain", &RETAIN));
                assert!(retained.contains("removed 3 bags"), "{retained}");
            })
            .await
            .unwrap();
            // It resumes half an hour on.
            resumed.set(Micros::now());
        })
    }));
    let err = late.write(Bytes::from("late")).await.unwrap_err();
    assert!(
        matches!(&err, bag::Error::LateRejected { bucket, .. } if *bucket == j.second(0, 5)),
        "{err:?}"
    );
    // Its append made the bag again; the next retention removes it.
    assert_eq!(j.bags_left(0).await, 1);
    let again = ok(&j.retain(&[]));
    assert!(
        again.contains("removed 1 bags made again in minutes already removed"),
        "{again}"
    );
    j.assert_retained(0).await;

    // Retained, a bag stays closed to any later writer as well.
    let clock = ManualClock::new(Micros::from_micros(j.second(0, 12).secs() * 1_000_000 + 250_000));
    let hooked = HookStore::new(Arc::clone(&j.store));
    let later = j.late_writer(hooked.store(), &clock);
    let resumed = clock.clone();
    hooked.before_next_append(Box::new(move || {
        Box::pin(async move { resumed.set(Micros::now()) })
    }));
    let err = later.write(Bytes::from("later")).await.unwrap_err();
    assert!(matches!(err, bag::Error::LateRejected { .. }), "{err:?}");
    j.assert_retained(0).await;
}

/// The other side of 3d: a writer whose record landed in time, and that
/// was held after its append (before it confirmed) while the minute was
/// summarized and retained. Its record is in the summary, so it is
/// acknowledged, although the lock it finds now is not the one it was
/// listed in: the minute's tombstone names the summary, which decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_held_after_its_append_past_retention_is_acknowledged_when_the_summary_holds_it() {
    let mut j = Journey::new().await;
    j.write(0, 3).await;
    let clock = ManualClock::new(Micros::from_micros(j.second(0, 5).secs() * 1_000_000 + 500_000));
    let (url, log, to, resumed) = (j.url.clone(), j.log.clone(), j.at(1), clock.clone());
    let store = bag::store::faults::AppendsThrough::new(Arc::clone(&j.store), move |inner, append| {
        let (url, log, to, resumed) = (url.clone(), log.clone(), to.clone(), resumed.clone());
        Box::pin(async move {
            let landed = append.to(&*inner).await;
            tokio::task::spawn_blocking(move || {
                ok(&cli_on(&url, &log, "summarize", &["--to", &to]));
                ok(&cli_on(&url, &log, "retain", &RETAIN));
            })
            .await
            .unwrap();
            resumed.set(Micros::now());
            landed
        })
    });
    let held = j.late_writer(Arc::new(store), &clock);
    held.write(Bytes::from("m0-held")).await.unwrap();
    j.acked.insert("m0-held".into());
    j.assert_retained(0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_paused_past_retention_is_late_rejected_on_a_directory() {
    a_writer_paused_past_retention_is_late_rejected(Backend::posix()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_paused_past_retention_is_late_rejected_on_s3() {
    a_writer_paused_past_retention_is_late_rejected(Backend::s3()).await;
}

/// Issue 51, holes 1 and 2, as a review reproduced them with the release
/// binaries. A writer took timestamps for its second record of a second
/// and stalled before appending (its lease record's fsync was delayed)
/// while minute A+1 was summarized and retained. Its append re-created
/// its data file at offset 0, and since the summary held a file of that
/// name at least as long, the write was acknowledged, in no summary. Its
/// close left a closed bag in the removed minute, a later `--span 2m`
/// summary (starting a minute earlier) was built from it, and readers
/// took the minute from that one: the acknowledged message gone, exit 0,
/// audit clean. The late record is refused, nothing summarizes the
/// removed minute again, and every acknowledged message is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_stalled_within_a_second_past_retention_loses_nothing() {
    let mut j = Journey::new().await;
    j.stall_within_a_second_past_retention().await;
    // A longer summary over the removed minute is not built: skipped.
    let two = ok(&j.cli(
        "summarize",
        &["--span", "2m", "--from", &j.at(0), "--to", &j.at(2)],
    ));
    assert!(
        two.contains("skipped") && two.contains("removed by retention"),
        "{two}"
    );
    assert_eq!(
        summary::list(j.store.as_ref(), &j.log).await.unwrap(),
        [j.minute(1)],
        "{two}"
    );
    let read = j.read(0, 2, &[]);
    assert_eq!((read.code, &read.payloads), (Some(0), &j.acked), "{}", read.said);
    assert!(read.problems.is_empty(), "{}", read.said);
    let (violations, said) = j.audit(0, 2);
    assert!(violations.is_empty(), "{violations:?}\n{said}");
    j.assert_retained(1).await;
}

/// Issue 51, hole 2, on a store where the longer summary exists anyway (a
/// summarizer from before the rule made it from the late bag): `bagel
/// read` reads the removed minute from the summary its tombstone names,
/// not from the one that starts earlier, and `bagel audit` names the two
/// summaries that disagree on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_made_over_a_removed_minute_is_read_around_and_flagged() {
    let mut j = Journey::new().await;
    j.stall_within_a_second_past_retention().await;
    let store = j.store.as_ref();
    seal::seal(store, &j.log, j.minute(0).first).await.unwrap();
    store.close(&j.log, j.second(1, 5)).await.unwrap();
    let removed = bag::tombstone::name(j.minute(1).first);
    store.remove_named(&j.log, &removed).await.unwrap();
    let longer = Stretch::new(j.minute(0).first, 2);
    summary::summarize(store, &j.log, longer).await.unwrap();
    bag::tombstone::put(store, &j.log, j.minute(1).first, j.minute(1))
        .await
        .unwrap();

    let read = j.read(0, 2, &[]);
    assert_eq!((read.code, &read.payloads), (Some(0), &j.acked), "{}", read.said);
    let (violations, said) = j.audit(0, 2);
    assert_eq!(violations.len(), 1, "{violations:?}\n{said}");
    assert!(
        violations[0].starts_with("\"summaries_disagree\"")
            && violations[0].contains(&name(longer))
            && violations[0].contains(&name(j.minute(1))),
        "{violations:?}"
    );
}

impl Journey {
    /// Issue 51, hole 1: writes a message in minute A, then a writer's
    /// first record of second A+1:05 (acknowledged), then its second
    /// record of that second, stalled before its append while minute A+1
    /// is summarized (`--span 1m`) and retained: refused `LateRejected`.
    async fn stall_within_a_second_past_retention(&mut self) {
        self.write(0, 1).await;
        let clock = ManualClock::new(Micros::from_micros(
            self.second(1, 5).secs() * 1_000_000 + 250_000,
        ));
        let hooked = HookStore::new(Arc::clone(&self.store));
        let w = self.late_writer(hooked.store(), &clock);
        let first = "m1-the first record of its second, acknowledged";
        w.write(Bytes::from(first)).await.unwrap();
        self.acked.insert(first.into());
        let (url, log, from, to) = (self.url.clone(), self.log.clone(), self.at(1), self.at(2));
        let resumed = clock.clone();
        hooked.before_next_append(Box::new(move || {
            Box::pin(async move {
                tokio::task::spawn_blocking(move || {
                    let span = ["--span", "1m", "--from", &from, "--to", &to];
                    ok(&cli_on(&url, &log, "summarize", &span));
                    let retained = ok(&cli_on(&url, &log, "retain", &RETAIN));
                    assert!(retained.contains("removed 1 bags"), "{retained}");
                })
                .await
                .unwrap();
                resumed.set(Micros::now());
            })
        }));
        // Shorter than the first, so it ends inside the summarized file.
        let err = w.write(Bytes::from("m1-late")).await.unwrap_err();
        assert!(
            matches!(&err, bag::Error::LateRejected { bucket, .. } if *bucket == self.second(1, 5)),
            "{err:?}"
        );
    }
}

/// 3e: a seal's finish listed minute A's bags, and retention removed them
/// before it closed them: it closed them again, empty. The audit then took
/// the honest summary for a forged one (its locks are not the ones
/// summarized), retention kept the bags forever (exit 1), and a read
/// without summaries read three empty bags and exited 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seal_finish_racing_retention_brings_no_bag_back() {
    let mut j = Journey::new().await;
    j.write(0, 3).await;
    ok(&j.cli("summarize", &["--to", &j.at(1)]));
    let hooked = Hooked::new(Arc::clone(&j.store));
    let (url, log) = (j.url.clone(), j.log.clone());
    hooked.before(Op::Close, j.second(0, 5), move || {
        ok(&cli_on(&url, &log, "retain", &RETAIN));
    });
    seal::seal(&hooked, &j.log, j.minute(0).first).await.unwrap();
    assert!(hooked.ran(), "the finish closed the bag it listed");
    assert_eq!(
        j.bags_left(0).await,
        3,
        "the finish made the removed bags again (the race of this test)"
    );
    j.assert_retained(0).await;
}

/// 3e: a reader without summaries listed minute A's bags, and retention
/// removed them before it opened them: it found them open and past due,
/// closed them empty, and read nothing, with no problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_racing_retention_fails_naming_the_summary() {
    let mut j = Journey::new().await;
    j.write(0, 3).await;
    ok(&j.cli("summarize", &["--to", &j.at(1)]));
    let hooked = Hooked::new(Arc::clone(&j.store));
    let (url, log) = (j.url.clone(), j.log.clone());
    hooked.before(Op::State, j.second(0, 5), move || {
        ok(&cli_on(&url, &log, "retain", &RETAIN));
    });
    let mut opts = bag::ReadOptions::default().with_keys(Some(j.leases.keys()));
    opts.from = Micros::from_micros(j.a * 1_000_000);
    opts.to = Micros::from_micros((j.a + 60) * 1_000_000);
    opts.use_summaries = false;
    let clock = bagel_proto::clock::AssumedExact(bagel_proto::clock::SystemClock);
    let report = bag::read(&hooked, &j.log, &opts, &BagConfig::default(), &clock)
        .await
        .unwrap();
    assert!(hooked.ran(), "the reader opened the bag it listed");
    let missing: Vec<&bag::Problem> = report
        .problems
        .iter()
        .filter(|p| p.kind == bag::ProblemKind::Missing)
        .collect();
    // Retention ran before it opened the first bag, so it read less than
    // the minute held: it must say so, naming the summary.
    assert!(
        missing.iter().any(|p| p.item == name(j.minute(0))),
        "{} of 3 messages, and no problem naming the summary: {:?}",
        report.messages.len(),
        report.problems
    );
    j.assert_retained(0).await;
}

/// 3e: retention killed after removing a bag's lock and before removing
/// its directory left an empty directory; the next closer (here a read
/// without summaries) locked it empty, the read lost its message with exit
/// 0, and the audit called the summary forged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_killed_before_a_bag_directory_went_leaves_it_closed() {
    let mut j = Journey::new().await;
    j.write(0, 3).await;
    ok(&j.cli("summarize", &["--to", &j.at(1)]));
    let root = j.backend.local_root().unwrap();
    let fs = NoRmdir {
        inner: Arc::new(bag::store::fsops::StdFs::new(root)),
        path: format!("{}/{}", j.log, j.second(0, 5).path()),
    };
    let store = bag::store::directory::DirectoryStore::new(Arc::new(fs), false);
    let second = Duration::from_secs(1);
    let err = bag::retain::retain_within(&store, &j.log, Micros::now(), second, None, second)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("killed before rmdir"), "{err}");
    j.assert_retained(0).await;
}

/// Which store call a [`Hooked`] store waits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Close,
    State,
}

type Blocking = Box<dyn FnOnce() + Send>;

/// A store that runs a blocking hook (a CLI command) once, inside the
/// first `Op` call on one bag, before the call itself: a closer or reader
/// that listed the bag and is held before it opens it.
#[derive(Debug)]
struct Hooked {
    inner: Arc<dyn BagStore>,
    hook: std::sync::Mutex<Option<(Op, Bucket, HookFn)>>,
    ran: std::sync::atomic::AtomicBool,
}

struct HookFn(Blocking);

impl std::fmt::Debug for HookFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HookFn")
    }
}

impl Hooked {
    fn new(inner: Arc<dyn BagStore>) -> Self {
        Hooked {
            inner,
            hook: std::sync::Mutex::new(None),
            ran: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn before(&self, op: Op, bucket: Bucket, hook: impl FnOnce() + Send + 'static) {
        *self.hook.lock().unwrap() = Some((op, bucket, HookFn(Box::new(hook))));
    }

    fn ran(&self) -> bool {
        self.ran.load(std::sync::atomic::Ordering::SeqCst)
    }

    async fn maybe(&self, op: Op, bucket: Bucket) {
        let hook = {
            let mut slot = self.hook.lock().unwrap();
            match slot.take() {
                Some((o, b, h)) if o == op && b == bucket => Some(h),
                other => {
                    *slot = other;
                    None
                }
            }
        };
        if let Some(HookFn(h)) = hook {
            tokio::task::spawn_blocking(h).await.unwrap();
            self.ran.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

#[async_trait::async_trait]
impl BagStore for Hooked {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn append(
        &self,
        log: &str,
        bucket: Bucket,
        writer_file: &str,
        sequence: u64,
        record: Bytes,
    ) -> bag::Result<bag::Receipt> {
        self.inner
            .append(log, bucket, writer_file, sequence, record)
            .await
    }
    async fn closing_started(&self, log: &str, bucket: Bucket) -> bag::Result<bool> {
        self.inner.closing_started(log, bucket).await
    }
    async fn close(&self, log: &str, bucket: Bucket) -> bag::Result<bag::Listing> {
        self.maybe(Op::Close, bucket).await;
        self.inner.close(log, bucket).await
    }
    async fn state(&self, log: &str, bucket: Bucket) -> bag::Result<bag::BagState> {
        self.maybe(Op::State, bucket).await;
        self.inner.state(log, bucket).await
    }
    async fn read_item(
        &self,
        log: &str,
        bucket: Bucket,
        item: &bag::ListedItem,
        limit: Option<u64>,
    ) -> bag::Result<Bytes> {
        self.inner.read_item(log, bucket, item, limit).await
    }
    async fn list_level(&self, log: &str, parts: &[String]) -> bag::Result<Vec<String>> {
        self.inner.list_level(log, parts).await
    }
    async fn log_start(&self, log: &str) -> bag::Result<Option<Bucket>> {
        self.inner.log_start(log).await
    }
    async fn mark_log_start(&self, log: &str, bucket: Bucket) -> bag::Result<()> {
        self.inner.mark_log_start(log, bucket).await
    }
    async fn put_first(&self, log: &str, name: &str, body: Bytes) -> bag::Result<Option<Bytes>> {
        self.inner.put_first(log, name, body).await
    }
    async fn get_named(&self, log: &str, name: &str, max: u64) -> bag::Result<Option<Bytes>> {
        self.inner.get_named(log, name, max).await
    }
    async fn remove_named(&self, log: &str, name: &str) -> bag::Result<()> {
        self.inner.remove_named(log, name).await
    }
    async fn list_named(&self, log: &str, dir: &str) -> bag::Result<Vec<String>> {
        self.inner.list_named(log, dir).await
    }
    async fn remove_bag(&self, log: &str, bucket: Bucket) -> bag::Result<()> {
        self.inner.remove_bag(log, bucket).await
    }
}

/// File operations of a process killed as it was about to remove the
/// directory `path` (everything before that went through).
#[derive(Debug)]
struct NoRmdir {
    inner: Arc<dyn bag::store::fsops::FsOps>,
    path: String,
}

#[async_trait::async_trait]
impl bag::store::fsops::FsOps for NoRmdir {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn list_dir(&self, dir: &str) -> std::io::Result<Vec<bag::store::fsops::DirEntry>> {
        self.inner.list_dir(dir).await
    }
    async fn create_dir_all(&self, dir: &str) -> std::io::Result<()> {
        self.inner.create_dir_all(dir).await
    }
    async fn create_exclusive(&self, path: &str, contents: &[u8], sync: bool) -> std::io::Result<bool> {
        self.inner.create_exclusive(path, contents, sync).await
    }
    async fn link(&self, from: &str, to: &str) -> std::io::Result<bool> {
        self.inner.link(from, to).await
    }
    async fn open_append(
        &self,
        path: &str,
    ) -> std::io::Result<(
        Box<dyn bag::store::fsops::AppendFile>,
        bag::store::fsops::FileStat,
    )> {
        self.inner.open_append(path).await
    }
    async fn stat(&self, path: &str) -> std::io::Result<bag::store::fsops::FileStat> {
        self.inner.stat(path).await
    }
    async fn read(&self, path: &str, limit: Option<u64>) -> std::io::Result<Bytes> {
        self.inner.read(path, limit).await
    }
    async fn chmod(&self, path: &str, mode: u32) -> std::io::Result<()> {
        self.inner.chmod(path, mode).await
    }
    async fn remove(&self, path: &str) -> std::io::Result<()> {
        self.inner.remove(path).await
    }
    async fn remove_dir(&self, path: &str) -> std::io::Result<()> {
        if path == self.path {
            return Err(std::io::Error::other("injected: killed before rmdir"));
        }
        self.inner.remove_dir(path).await
    }
}
