//! Issue 37, item 5: List then Watch loses no event (etcd's contract),
//! over a real `bagel-server`, through the raw protocol, the client
//! library and the `bagel` CLI.
//!
//! * List says the revision it reflects, and a Watch from it gets every
//!   later event, also when nobody was watching at the List;
//! * or a clear refusal: OUT_OF_RANGE with a google.rpc.ErrorInfo whose
//!   reason is stable (REVISION_COMPACTED, REVISION_OF_OTHER_INCARNATION),
//!   so clients need not read the message;
//! * a revision of an earlier incarnation (or of another server) is
//!   refused as such;
//! * quiet watches carry progress revisions, so a filtered watch broken
//!   before its first event can resume without a gap.
//!
//! One lease's events in causal order (an expiry decided by the table,
//! under the name's lock) needs an exact interleaving of a renewal and the
//! expiry tick, which only injected time gives: see
//! `an_expiry_is_decided_by_the_table_in_order_with_the_lease_s_other_events`
//! in the server's table tests.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bagel_client::{
    Error, Micros, RevisionRefusal, WatchEvent, WatchEventKind, WatchMessage, WatchOptions, WatchTarget,
};
use bagel_proto::details;
use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::ServerProcess;
use tonic::Code;
use tonic::transport::Channel;

const SEC: u64 = 1_000_000;
/// Bits of a revision that count events (the rest are the incarnation).
const COUNT_BITS: u32 = 40;

/// A bound on waits that should end at once, so a regression fails rather
/// than hangs. Not a timing assertion: every wait below awaits an event.
const NO_HANG: Duration = Duration::from_secs(60);

async fn raw(server: &ServerProcess) -> LeaseServiceClient<Channel> {
    LeaseServiceClient::connect(server.url.clone()).await.unwrap()
}

async fn acquire(c: &mut LeaseServiceClient<Channel>, names: &[&str], owner: &str) -> pb::LeaseGrant {
    let req = pb::AcquireRequest {
        names: names.iter().map(|n| (*n).to_owned()).collect(),
        owner: owner.into(),
        mode: pb::Mode::Full.into(),
        ttl_us: 60 * SEC,
        ..Default::default()
    };
    c.acquire(req).await.unwrap().into_inner().grant.unwrap()
}

async fn release(c: &mut LeaseServiceClient<Channel>, g: &pb::LeaseGrant) {
    c.release(pb::ReleaseRequest {
        lease_id: g.lease_id.clone(),
        token: g.token.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
}

async fn renew(c: &mut LeaseServiceClient<Channel>, g: &pb::LeaseGrant) -> u64 {
    let deadline_us = Micros::now().as_micros() + 90 * SEC;
    c.renew(pb::RenewRequest {
        lease_id: g.lease_id.clone(),
        token: g.token.clone(),
        deadline_us,
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .deadline_us
}

async fn watchers(c: &mut LeaseServiceClient<Channel>) -> u64 {
    let info = c
        .server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    info.load.unwrap().watchers
}

/// The events of a watch up to its first progress message (the one it
/// sends once the events it resumed are sent), and that progress revision.
async fn until_progress(w: &mut bagel_client::Watch) -> (Vec<WatchEvent>, u64) {
    let mut events = Vec::new();
    let read = async {
        loop {
            match w.next_message().await.unwrap().expect("the watch goes on") {
                WatchMessage::Event(e) => events.push(e),
                WatchMessage::Progress { revision } => return revision,
            }
        }
    };
    let progress = tokio::time::timeout(NO_HANG, read)
        .await
        .expect("a progress message");
    (events, progress)
}

/// Who holds each name, as a client rebuilds it: the listing, then each
/// event applied (an event carries the name's state after it).
fn apply(held: &mut BTreeMap<String, (String, u64)>, e: &WatchEvent) {
    match e.kind {
        WatchEventKind::Granted | WatchEventKind::Renewed | WatchEventKind::Upgraded => {
            held.insert(e.name.clone(), (e.lease_id.clone(), e.deadline.as_micros()));
        }
        WatchEventKind::Released | WatchEventKind::Broken | WatchEventKind::Expired => {
            if held.get(&e.name).is_some_and(|(l, _)| *l == e.lease_id) {
                held.remove(&e.name);
            }
        }
    }
}

fn held_of(names: &[bagel_client::ListedName]) -> BTreeMap<String, (String, u64)> {
    names
        .iter()
        .map(|n| {
            let h = &n.holder;
            (n.name.clone(), (h.lease_id.clone(), h.deadline.as_micros()))
        })
        .collect()
}

/// The journey of the issue: a client lists, then watches. What happens
/// between the two (while nobody watches the server at all) reaches the
/// watch, in order, and the set rebuilt from the listing and the events is
/// what a List says at the end. Before: ListResponse had no revision and a
/// watch from 0 began "now", after those changes.
#[tokio::test]
async fn a_watch_from_the_list_s_revision_gets_what_happened_in_between() {
    let server = ServerProcess::start_ready(&["--max-ttl", "2m", "--list-max-page", "2"]).await;
    let mut c = raw(&server).await;
    let a = acquire(&mut c, &["lw/a"], "o").await;
    let b = acquire(&mut c, &["lw/b"], "o").await;
    acquire(&mut c, &["lw/c"], "o").await;
    assert_eq!(watchers(&mut c).await, 0, "nobody watches");

    let client = server.client().await;
    let listed = client.list_all("lw/").await.unwrap();
    assert_ne!(listed.revision, 0, "a List says its revision");
    let names: Vec<&str> = listed.names.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["lw/a", "lw/b", "lw/c"], "over two pages");

    // Between the List and the Watch, with no watcher.
    release(&mut c, &a).await;
    let d = acquire(&mut c, &["lw/d"], "o2").await;
    let renewed_to = renew(&mut c, &b).await;
    acquire(&mut c, &["elsewhere"], "o").await;

    let mut w = client
        .watch(WatchTarget::Prefix("lw/".into()), Some(listed.revision))
        .await
        .unwrap();
    let (events, progress) = until_progress(&mut w).await;
    let got: Vec<(WatchEventKind, &str, &str)> = events
        .iter()
        .map(|e| (e.kind, e.name.as_str(), e.lease_id.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (WatchEventKind::Released, "lw/a", a.lease_id.as_str()),
            (WatchEventKind::Granted, "lw/d", d.lease_id.as_str()),
            (WatchEventKind::Renewed, "lw/b", b.lease_id.as_str()),
        ]
    );
    assert_eq!(events[2].deadline.as_micros(), renewed_to);
    assert!(events[0].revision > listed.revision, "{events:?}");
    assert!(events.windows(2).all(|p| p[0].revision < p[1].revision));
    assert!(progress > events[2].revision, "the other name's event counts too");
    assert_eq!(w.last_revision(), Some(progress));

    // What goes on after the watch started arrives too.
    let e = acquire(&mut c, &["lw/e"], "o").await;
    let next = w.next().await.unwrap().unwrap();
    assert_eq!(
        (next.kind, next.lease_id.as_str()),
        (WatchEventKind::Granted, e.lease_id.as_str())
    );

    let mut held = held_of(&listed.names);
    for e in events.iter().chain([&next]) {
        apply(&mut held, e);
    }
    assert_eq!(held, held_of(&client.list_all("lw/").await.unwrap().names));
}

/// A List's revision the server no longer keeps (three events since, two
/// kept) is refused with OUT_OF_RANGE and the stable reason
/// REVISION_COMPACTED naming the oldest revision to start from; the client
/// library makes it `Error::WatchRevision`; listing again and watching
/// from the new revision works. Before: the status had no details, and
/// the client an `OutOfRange` to tell apart by its words.
#[tokio::test]
async fn a_revision_no_longer_kept_is_refused_with_a_stable_reason() {
    let server = ServerProcess::start_ready(&["--max-ttl", "2m", "--watch-retain", "2"]).await;
    let mut c = raw(&server).await;
    let client = server.client().await;
    let listed = client.list("tk/", None, 0).await.unwrap();
    for n in ["tk/1", "tk/2", "tk/3"] {
        acquire(&mut c, &[n], "o").await;
    }

    let status = c
        .watch(pb::WatchRequest {
            prefix: "tk/".into(),
            from_revision: listed.revision,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    let (reason, meta) = details::error_info_of(status.details()).expect("an ErrorInfo");
    assert_eq!(reason, details::REASON_REVISION_COMPACTED);
    assert_eq!(meta["from_revision"], listed.revision.to_string());
    let oldest: u64 = meta["oldest_revision"].parse().unwrap();
    assert!(oldest > listed.revision);
    assert_eq!(meta["retain"], "2");

    let err = client
        .watch(WatchTarget::Prefix("tk/".into()), Some(listed.revision))
        .await
        .unwrap_err();
    match &err {
        Error::WatchRevision {
            refusal: RevisionRefusal::Compacted { from, oldest: o },
            message,
        } => {
            assert_eq!((*from, *o), (listed.revision, oldest));
            assert!(message.contains("list the names again"), "{message}");
        }
        other => panic!("expected a compacted revision, got {other:?}"),
    }

    let again = client.list_all("tk/").await.unwrap();
    assert_eq!(again.names.len(), 3);
    let mut w = client
        .watch(WatchTarget::Prefix("tk/".into()), Some(again.revision))
        .await
        .unwrap();
    let (events, progress) = until_progress(&mut w).await;
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(progress, again.revision);
}

/// A revision given out before a restart is refused as one of another
/// incarnation, though the server keeps the same id and address; so is a
/// revision of another server. Before, revisions were the start time in
/// microseconds plus a count, so an earlier incarnation's (with a clock
/// stepped back, or a busy earlier life) or another server's could fall
/// among the current ones and be served from: the refusal, if any, said
/// only "too old" or "ahead". (That a revision of another incarnation is
/// refused whatever its count is the hub's unit test
/// `a_revision_of_another_incarnation_is_refused_whatever_its_count`.)
#[tokio::test]
async fn a_revision_of_an_earlier_incarnation_or_another_server_is_refused() {
    let args = [
        "--unsafe-skip-restart-wait",
        "--max-ttl",
        "2m",
        "--server-id",
        "inc-1",
    ];
    let mut first = ServerProcess::start(&args).await;
    first.wait_ready().await;
    let mut c = raw(&first).await;
    acquire(&mut c, &["inc/a"], "o").await;
    let old = first.client().await.list("inc/", None, 0).await.unwrap().revision;
    let addr = first.addr.to_string();
    first.kill();

    let second = ServerProcess::start_at(&addr, &args).await;
    second.wait_ready().await;
    let client = second.client().await;
    let now = client.list("inc/", None, 0).await.unwrap().revision;
    assert_ne!(
        old >> COUNT_BITS,
        now >> COUNT_BITS,
        "the incarnation is in the revision"
    );

    let status = raw(&second)
        .await
        .watch(pb::WatchRequest {
            prefix: "inc/".into(),
            from_revision: old,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    let (reason, meta) = details::error_info_of(status.details()).expect("an ErrorInfo");
    assert_eq!(reason, details::REASON_REVISION_OF_OTHER_INCARNATION);
    assert_eq!(meta["from_revision"], old.to_string());
    assert_eq!(meta["incarnation"], (old >> COUNT_BITS).to_string());
    assert_eq!(meta["server_incarnation"], (now >> COUNT_BITS).to_string());
    assert!(status.message().contains("restarted"), "{}", status.message());

    let err = client
        .watch(WatchTarget::Prefix("inc/".into()), Some(old))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::WatchRevision {
                refusal: RevisionRefusal::OtherIncarnation { from },
                ..
            } if from == old
        ),
        "{err:?}"
    );

    // Another server's revision.
    let other = ServerProcess::start_ready(&["--max-ttl", "2m"]).await;
    let theirs = other.client().await.list("", None, 0).await.unwrap().revision;
    let err = client
        .watch(WatchTarget::Prefix(String::new()), Some(theirs))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::WatchRevision {
                refusal: RevisionRefusal::OtherIncarnation { .. },
                ..
            }
        ),
        "{err:?}"
    );
}

/// A watch of one quiet name says, as it starts and then while quiet, the
/// revision it has been sent everything up to, and that revision moves
/// with the events of other names. So a watch broken before its first
/// event resumes from it and misses nothing. Before: no message until an
/// event of its own, so no revision to resume from.
#[tokio::test]
async fn a_quiet_filtered_watch_carries_progress_to_resume_from() {
    let server = ServerProcess::start_ready(&["--max-ttl", "2m"]).await;
    let mut c = raw(&server).await;
    let client = server.client().await;
    let options = WatchOptions {
        from_revision: None,
        progress_interval: Some(Duration::from_millis(20)),
    };
    let mut w = client
        .watch_with(WatchTarget::Names(vec!["q/quiet".into()]), options)
        .await
        .unwrap();
    let (events, start) = until_progress(&mut w).await;
    assert!(events.is_empty());
    assert_eq!(w.last_revision(), Some(start), "a revision before any event");

    for n in ["q/1", "q/2", "q/3"] {
        acquire(&mut c, &[n], "o").await;
    }
    let moved = client.list("", None, 1).await.unwrap().revision;
    assert!(moved >= start + 3);
    let caught_up = async {
        loop {
            match w.next_message().await.unwrap().unwrap() {
                WatchMessage::Progress { revision } if revision >= moved => return revision,
                WatchMessage::Progress { .. } => {}
                WatchMessage::Event(e) => panic!("not watched: {e:?}"),
            }
        }
    };
    let resume = tokio::time::timeout(NO_HANG, caught_up).await.expect("progress");
    assert_eq!(w.last_revision(), Some(resume));
    drop(w);
    while watchers(&mut c).await > 0 {
        tokio::task::yield_now().await;
    }

    // What happens while it is away comes when it resumes.
    let g = acquire(&mut c, &["q/quiet"], "o").await;
    let mut w = client
        .watch(WatchTarget::Names(vec!["q/quiet".into()]), Some(resume))
        .await
        .unwrap();
    let e = w.next().await.unwrap().unwrap();
    assert_eq!(
        (e.kind, e.lease_id.as_str()),
        (WatchEventKind::Granted, g.lease_id.as_str())
    );
    assert!(e.revision > resume);
}

/// Progress is asked for (etcd's progress_notify): a watch without it
/// gets events only, as before; an interval outside [10 ms, 1 h] is
/// refused naming the field.
#[tokio::test]
async fn progress_is_opt_in_and_its_interval_bounded() {
    let server = ServerProcess::start_ready(&["--max-ttl", "2m"]).await;
    let mut c = raw(&server).await;
    let mut plain = raw(&server)
        .await
        .watch(pb::WatchRequest {
            prefix: "p/".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    while watchers(&mut c).await == 0 {
        tokio::task::yield_now().await;
    }
    acquire(&mut c, &["p/1"], "o").await;
    let first = plain.message().await.unwrap().unwrap();
    assert_eq!(first.kind(), pb::WatchEventKind::Granted);

    let mut with = raw(&server)
        .await
        .watch(pb::WatchRequest {
            prefix: "p/".into(),
            progress_notify: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let first = with.message().await.unwrap().unwrap();
    assert_eq!(first.kind(), pb::WatchEventKind::Progress);
    assert!(first.name.is_empty() && first.lease_id.is_empty());

    for us in [1, 9_999, 3_600_000_001] {
        let status = raw(&server)
            .await
            .watch(pb::WatchRequest {
                progress_notify: true,
                progress_interval_us: us,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
        assert!(
            status.message().starts_with("progress_interval_us: "),
            "{}",
            status.message()
        );
    }
}

/// A running `bagel` whose stdout lines are read as JSON, one by one.
struct Lines {
    child: Child,
    rx: std::sync::mpsc::Receiver<serde_json::Value>,
}

impl Lines {
    fn spawn(server: &ServerProcess, args: &[&str]) -> Lines {
        let mut child = Command::new(bagel_tests::bin("bagel"))
            .args(["--server", &server.url])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(serde_json::from_str(&line).unwrap()).is_err() {
                    return;
                }
            }
        });
        Lines { child, rx }
    }

    /// The next line (the command goes on running).
    async fn next(&mut self) -> serde_json::Value {
        let rx = &self.rx;
        tokio::task::block_in_place(|| rx.recv_timeout(NO_HANG)).expect("a line from bagel")
    }

    /// Lines up to the next progress line, and its revision.
    async fn until_progress(&mut self) -> (Vec<serde_json::Value>, u64) {
        let mut lines = Vec::new();
        loop {
            let line = self.next().await;
            if line["kind"] == "progress" {
                return (lines, line["revision"].as_u64().unwrap());
            }
            lines.push(line);
        }
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The CLI walks the journey: `bagel list --json` says the revision on
/// every line, `bagel watch --from-revision` it prints what happened since
/// (and `--progress` lines), `bagel list --watch` does both in one, and a
/// revision the server cannot start from fails saying to list again.
#[tokio::test(flavor = "multi_thread")]
async fn the_cli_lists_then_watches_without_a_gap() {
    let server = ServerProcess::start_ready(&["--max-ttl", "2m", "--list-max-page", "1"]).await;
    let mut c = raw(&server).await;
    let a = acquire(&mut c, &["cl/a"], "o").await;
    acquire(&mut c, &["cl/b"], "o").await;

    let out = server.cli(&["list", "--prefix", "cl/", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    let revision = lines[0]["revision"].as_u64().expect("a revision");
    assert_eq!(
        lines[1]["revision"].as_u64(),
        Some(revision),
        "the first page's, on every line"
    );

    let out = server.cli(&["list", "--prefix", "cl/"]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bagel watch --from-revision"), "{stderr}");

    release(&mut c, &a).await;
    let z = acquire(&mut c, &["cl/z"], "o").await;

    let from = revision.to_string();
    let mut watch = Lines::spawn(
        &server,
        &[
            "watch",
            "--prefix",
            "cl/",
            "--from-revision",
            &from,
            "--json",
            "--progress",
        ],
    );
    let (events, progress) = watch.until_progress().await;
    let got: Vec<(&str, &str)> = events
        .iter()
        .map(|e| (e["kind"].as_str().unwrap(), e["name"].as_str().unwrap()))
        .collect();
    assert_eq!(got, [("released", "cl/a"), ("granted", "cl/z")]);
    assert!(progress >= events[1]["revision"].as_u64().unwrap());
    drop(watch);

    let mut both = Lines::spawn(
        &server,
        &["list", "--watch", "--prefix", "cl/", "--json", "--progress"],
    );
    let (listed, _) = both.until_progress().await;
    let names: Vec<&str> = listed.iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["cl/b", "cl/z"]);
    release(&mut c, &z).await;
    let line = both.next().await;
    assert_eq!(
        (line["kind"].as_str(), line["name"].as_str()),
        (Some("released"), Some("cl/z"))
    );
    drop(both);

    // Of another incarnation (the top bits flipped): refused, saying what to do.
    let bogus = (revision ^ (1 << 63)).to_string();
    let out = server.cli(&["watch", "--prefix", "cl/", "--from-revision", &bogus]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bagel list --watch"), "{stderr}");
    assert!(stderr.contains("another incarnation"), "{stderr}");
}
