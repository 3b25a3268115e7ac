//! Issue 28, item 7: `List` (paginated, bounded, by prefix) and `Watch`
//! (grants, renewals, releases, expiries, by name or prefix; resumable
//! from a revision; a slow watcher dropped naming the limit), over a real
//! `bagel-server`, through the client library, the raw protocol and the
//! `bagel` CLI.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};

use bagel_client::{Error, Micros, Mode, WatchEvent, WatchEventKind, WatchTarget};
use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::ServerProcess;
use tonic::Code;
use tonic::transport::Channel;

const SEC: u64 = 1_000_000;

async fn raw(server: &ServerProcess) -> LeaseServiceClient<Channel> {
    LeaseServiceClient::connect(server.url.clone()).await.unwrap()
}

fn acquire_req(names: &[&str], owner: &str, ttl_us: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        names: names.iter().map(|n| (*n).to_owned()).collect(),
        owner: owner.into(),
        mode: pb::Mode::Full.into(),
        ttl_us,
        ..Default::default()
    }
}

async fn acquire(
    c: &mut LeaseServiceClient<Channel>,
    names: &[&str],
    owner: &str,
    ttl_us: u64,
) -> pb::LeaseGrant {
    c.acquire(acquire_req(names, owner, ttl_us))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap()
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

async fn watchers(c: &mut LeaseServiceClient<Channel>) -> u64 {
    let info = c
        .server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    info.load.unwrap().watchers
}

async fn next(w: &mut bagel_client::Watch) -> WatchEvent {
    w.next().await.unwrap().expect("the watch goes on")
}

fn kinds(events: &[WatchEvent]) -> Vec<(WatchEventKind, &str)> {
    events.iter().map(|e| (e.kind, e.name.as_str())).collect()
}

/// Held names come back in name order, a bounded page at a time, only
/// those under the prefix, and a released name is not listed.
#[tokio::test]
async fn list_pages_through_held_names_by_prefix() {
    let server = ServerProcess::start_ready(&["--max-ttl", "2m", "--list-max-page", "3"]).await;
    let mut c = raw(&server).await;
    let mut grants = Vec::new();
    for n in [
        "app/g", "app/b", "app/a", "app/d", "app/c", "app/f", "app/e", "other/x",
    ] {
        grants.push((n, acquire(&mut c, &[n], &format!("owner-{n}"), 60 * SEC).await));
    }
    let (_, c_grant) = grants.iter().find(|(n, _)| *n == "app/c").unwrap();
    release(&mut c, c_grant).await;
    // A multi-name lease: each name listed, same lease.
    let multi = acquire(&mut c, &["app/m1", "app/m2"], "multi", 60 * SEC).await;

    let client = server.client().await;
    let mut listed = Vec::new();
    let mut page = None;
    let mut pages = 0;
    loop {
        // Asking for more than the server's max page: cut to it.
        let p = client.list("app/", page.as_deref(), 50).await.unwrap();
        assert_eq!(p.max_page_size, 3);
        assert!(p.names.len() <= 3, "{p:?}");
        pages += 1;
        listed.extend(p.names);
        match p.next_page {
            Some(next) => page = Some(next),
            None => break,
        }
    }
    let names: Vec<&str> = listed.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "app/a", "app/b", "app/d", "app/e", "app/f", "app/g", "app/m1", "app/m2"
        ]
    );
    assert_eq!(pages, 3);
    let a = &listed[0];
    let a_grant = &grants.iter().find(|(n, _)| *n == "app/a").unwrap().1;
    assert_eq!(a.holder.lease_id, a_grant.lease_id);
    assert_eq!(a.holder.owner, "owner-app/a");
    assert_eq!(a.holder.mode, Mode::Full);
    assert_eq!(a.holder.deadline.as_micros(), a_grant.deadline_us);
    assert_eq!(listed[6].holder.lease_id, multi.lease_id);
    assert_eq!(listed[7].holder.lease_id, multi.lease_id);

    // A smaller page size is honoured; everything without a prefix.
    let p = client.list("", None, 2).await.unwrap();
    assert_eq!(p.names.len(), 2);
    assert_eq!(p.next_page.as_deref(), Some("app/b"));
    let p = client.list("other/", None, 0).await.unwrap();
    assert_eq!(p.names.len(), 1);
    assert_eq!(p.next_page, None);
    let p = client.list("nothing/", None, 0).await.unwrap();
    assert!(p.names.is_empty() && p.next_page.is_none());
}

/// A watcher of a name sees its grant, renewal, release and expiry, and
/// nothing of other names; a watcher of a prefix sees every name under it.
#[tokio::test]
async fn watch_sees_grant_renew_release_and_expiry_by_name_and_by_prefix() {
    let server = ServerProcess::start_ready(&["--max-ttl", "2m"]).await;
    let client = server.client().await;
    let mut by_name = client
        .watch(WatchTarget::Names(vec!["w/1".into()]), None)
        .await
        .unwrap();
    let mut by_prefix = client
        .watch(WatchTarget::Prefix("w/".into()), None)
        .await
        .unwrap();
    let mut c = raw(&server).await;

    let g = acquire(&mut c, &["w/1"], "alice", 60 * SEC).await;
    let other = acquire(&mut c, &["w/2"], "bob", 60 * SEC).await;
    acquire(&mut c, &["x/1"], "carol", 60 * SEC).await;
    let renewed = c
        .renew(pb::RenewRequest {
            lease_id: g.lease_id.clone(),
            token: g.token.clone(),
            deadline_us: Micros::now().as_micros() + 30 * SEC,
            ttl_us: 0,
            metadata: None,
        })
        .await
        .unwrap()
        .into_inner();
    release(&mut c, &g).await;
    release(&mut c, &other).await;
    // A short lease nobody releases: its expiry is reported.
    let short = acquire(&mut c, &["w/1"], "dave", 300_000).await;

    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.push(next(&mut by_name).await);
    }
    assert_eq!(
        kinds(&seen),
        [
            (WatchEventKind::Granted, "w/1"),
            (WatchEventKind::Renewed, "w/1"),
            (WatchEventKind::Released, "w/1"),
            (WatchEventKind::Granted, "w/1"),
            (WatchEventKind::Expired, "w/1"),
        ]
    );
    assert!(seen.windows(2).all(|w| w[0].revision < w[1].revision), "{seen:?}");
    assert_eq!(seen[0].lease_id, g.lease_id);
    assert_eq!(seen[0].owner, "alice");
    assert_eq!(seen[0].mode, Mode::Full);
    assert_eq!(seen[0].deadline.as_micros(), g.deadline_us);
    assert_eq!(seen[1].deadline.as_micros(), renewed.deadline_us);
    assert_eq!(seen[4].lease_id, short.lease_id);
    assert_eq!(seen[4].owner, "dave");
    assert!(seen[4].at.as_micros() >= short.deadline_us, "{:?}", seen[4]);

    let mut seen = Vec::new();
    for _ in 0..7 {
        seen.push(next(&mut by_prefix).await);
    }
    assert_eq!(
        kinds(&seen),
        [
            (WatchEventKind::Granted, "w/1"),
            (WatchEventKind::Granted, "w/2"),
            (WatchEventKind::Renewed, "w/1"),
            (WatchEventKind::Released, "w/1"),
            (WatchEventKind::Released, "w/2"),
            (WatchEventKind::Granted, "w/1"),
            (WatchEventKind::Expired, "w/1"),
        ]
    );

    // The next holder breaks nothing: the expired holder was reported, and
    // taking the name over says so once more, as a break.
    let after = acquire(&mut c, &["w/1"], "erin", 60 * SEC).await;
    let broken = next(&mut by_name).await;
    assert_eq!(
        (broken.kind, broken.lease_id.as_str()),
        (WatchEventKind::Broken, short.lease_id.as_str())
    );
    let granted = next(&mut by_name).await;
    assert_eq!(
        (granted.kind, granted.lease_id.as_str()),
        (WatchEventKind::Granted, after.lease_id.as_str())
    );
}

/// A watcher resuming from a revision it saw gets exactly the events after
/// it; a revision the server no longer keeps is refused naming the oldest
/// one it can resume from.
#[tokio::test]
async fn a_watcher_resumes_after_a_revision_and_an_old_one_is_refused() {
    let server = ServerProcess::start_ready(&["--max-ttl", "2m", "--watch-retain", "3"]).await;
    let client = server.client().await;
    let mut first = client
        .watch(WatchTarget::Prefix("r/".into()), None)
        .await
        .unwrap();
    let mut c = raw(&server).await;
    for n in ["r/1", "r/2", "r/3"] {
        acquire(&mut c, &[n], "o", 60 * SEC).await;
    }
    let seen = [
        next(&mut first).await,
        next(&mut first).await,
        next(&mut first).await,
    ];
    let r1 = seen[0].revision;

    let mut resumed = client
        .watch(WatchTarget::Prefix("r/".into()), Some(r1))
        .await
        .unwrap();
    assert_eq!(next(&mut resumed).await, seen[1]);
    assert_eq!(next(&mut resumed).await, seen[2]);
    acquire(&mut c, &["r/4"], "o", 60 * SEC).await;
    let r4 = next(&mut resumed).await;
    assert_eq!((r4.kind, r4.name.as_str()), (WatchEventKind::Granted, "r/4"));
    assert_eq!(next(&mut first).await, r4);

    // Four events, three kept: the first is gone, so resuming from just
    // before it is refused; from it (seen) works.
    let err = client
        .watch(WatchTarget::Prefix("r/".into()), Some(r1 - 1))
        .await
        .unwrap_err();
    match &err {
        Error::WatchRevision { message, .. } => {
            assert!(
                message.contains(&format!("oldest revision to resume from is {r1}")),
                "{message}"
            );
        }
        other => panic!("expected a refused revision, got {other:?}"),
    }
    let mut again = client
        .watch(WatchTarget::Prefix("r/".into()), Some(r1))
        .await
        .unwrap();
    assert_eq!(next(&mut again).await, seen[1]);
    // A revision ahead of the server's is refused too.
    let err = client
        .watch(WatchTarget::Names(vec!["r/1".into()]), Some(r4.revision + 10))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::WatchRevision {
                refusal: bagel_client::RevisionRefusal::Ahead { .. },
                ..
            }
        ),
        "{err:?}"
    );
}

/// A watcher that does not read is dropped once its buffer (4 events,
/// `--watch-buffer 4`) is full: it gets what was buffered, then
/// RESOURCE_EXHAUSTED naming the limit and the last revision it was sent,
/// which it can resume from.
#[tokio::test]
async fn a_slow_watcher_is_dropped_naming_the_limit_and_can_resume() {
    let server = ServerProcess::start_ready(&[
        "--max-ttl",
        "2m",
        "--watch-buffer",
        "4",
        "--watch-retain",
        "100000",
    ])
    .await;
    // Its own connection: an unread stream holds its connection's window.
    let slow_client = server.client().await;
    let mut slow = slow_client
        .watch(WatchTarget::Prefix(String::new()), None)
        .await
        .unwrap();
    let mut c = raw(&server).await;
    assert_eq!(watchers(&mut c).await, 1);
    // Events of ~600 bytes (long names and owner), until the server has
    // dropped the watcher: the HTTP/2 windows and buffers between it and
    // us fill first, then its buffer of 4.
    let owner = "o".repeat(250);
    let names: Vec<String> = (0..64).map(|i| format!("{i:02}{}", "n".repeat(240))).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut rounds = 0;
    while watchers(&mut c).await > 0 {
        let g = acquire(&mut c, &names, &owner, 60 * SEC).await;
        release(&mut c, &g).await;
        rounds += 1;
        assert!(rounds < 10_000, "the watcher was never dropped");
    }
    let mut received = 0u64;
    let mut last = None;
    let err = loop {
        match slow.next().await {
            Ok(Some(e)) => {
                received += 1;
                last = Some(e.revision);
            }
            Ok(None) => panic!("the watch ended without an error"),
            Err(e) => break e,
        }
    };
    assert!(received > 0);
    match &err {
        Error::WatchDropped {
            message,
            last_revision,
        } => {
            assert_eq!(*last_revision, last);
            assert!(message.contains("more than 4 events"), "{message}");
            assert!(message.contains("--watch-buffer"), "{message}");
            let last = last.unwrap();
            assert!(
                message.contains(&format!("last revision sent {last}")),
                "{message}"
            );
        }
        other => panic!("expected a dropped watch, got {other:?}"),
    }
    // Resuming from the last revision received picks up where it stopped.
    let mut resumed = slow_client
        .watch(WatchTarget::Prefix(String::new()), last)
        .await
        .unwrap();
    let e = next(&mut resumed).await;
    assert_eq!(e.revision, last.unwrap() + 1);

    // Over the raw protocol: the status code is RESOURCE_EXHAUSTED.
    drop(resumed);
    while watchers(&mut c).await > 0 {
        tokio::task::yield_now().await;
    }
    let mut raw_watch = raw(&server)
        .await
        .watch(pb::WatchRequest {
            prefix: "zz".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let names: Vec<String> = (0..64).map(|i| format!("zz{i:02}{}", "n".repeat(240))).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    while watchers(&mut c).await > 0 {
        let g = acquire(&mut c, &names, &owner, 60 * SEC).await;
        release(&mut c, &g).await;
    }
    let status = loop {
        match raw_watch.message().await {
            Ok(Some(_)) => {}
            Ok(None) => panic!("ended without a status"),
            Err(s) => break s,
        }
    };
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
}

/// `bagel list --json` prints one object per held name, in name order.
#[tokio::test]
async fn cli_list_json() {
    let server = ServerProcess::start_ready(&["--max-ttl", "2m", "--list-max-page", "2"]).await;
    let mut c = raw(&server).await;
    for n in ["cli/c", "cli/a", "cli/b", "zzz"] {
        acquire(&mut c, &[n], "cli-owner", 60 * SEC).await;
    }
    let out = server.cli(&["list", "--prefix", "cli/", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = lines.iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["cli/a", "cli/b", "cli/c"]);
    assert_eq!(lines[0]["owner"], "cli-owner");
    assert_eq!(lines[0]["mode"], "full");
    assert!(lines[0]["deadline_us"].as_u64().unwrap() > Micros::now().as_micros());
    assert_eq!(lines[0]["lease_id"].as_str().unwrap().len(), 32);
    let out = server.cli(&["list", "--limit", "1", "--json"]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap().lines().count(), 1);
}

/// `bagel watch --prefix P --json` prints one object per event as it
/// happens.
#[tokio::test]
async fn cli_watch_json() {
    let server = ServerProcess::start_ready(&["--max-ttl", "2m"]).await;
    let mut c = raw(&server).await;
    let mut child = Command::new(bagel_tests::bin("bagel"))
        .args(["--server", &server.url, "watch", "--prefix", "cw/", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let lines = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .take(2)
            .map(|l| serde_json::from_str::<serde_json::Value>(&l.unwrap()).unwrap())
            .collect::<Vec<_>>()
    });
    while watchers(&mut c).await == 0 {
        tokio::task::yield_now().await;
    }
    acquire(&mut c, &["other"], "o", 60 * SEC).await;
    let g = acquire(&mut c, &["cw/1"], "cli-watch", 60 * SEC).await;
    release(&mut c, &g).await;
    let lines = tokio::task::spawn_blocking(move || lines.join().unwrap())
        .await
        .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(lines[0]["kind"], "granted");
    assert_eq!(lines[0]["name"], "cw/1");
    assert_eq!(lines[0]["owner"], "cli-watch");
    assert_eq!(lines[0]["lease_id"], g.lease_id.as_str());
    assert_eq!(lines[1]["kind"], "released");
    assert!(lines[1]["revision"].as_u64() > lines[0]["revision"].as_u64());
}

/// Watch refuses names and a prefix together, and a client that is not
/// a server (the S3 backend) is covered by the CLI's message (see the
/// README); here the server's side.
#[tokio::test]
async fn watch_refuses_names_and_prefix_together() {
    let server = ServerProcess::start_ready(&[]).await;
    let status = raw(&server)
        .await
        .watch(pb::WatchRequest {
            names: vec!["a".into()],
            prefix: "b".into(),
            from_revision: 0,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
}

/// The side port answers "who holds X?": `/holders?prefix=P` as JSON (the
/// List core, bounded the same), and the status page's search
/// (`/?holder=P`) as a table, with the conflicts/s card beside it.
#[tokio::test]
async fn the_side_port_says_who_holds_a_name_or_prefix() {
    let server =
        ServerProcess::start_ready(&["--max-ttl", "2m", "--http", "127.0.0.1:0", "--list-max-page", "2"])
            .await;
    let http = server.http.expect("side port");
    let mut c = raw(&server).await;
    for (n, owner) in [
        ("team a/x", "ann"),
        ("team a/y", "bo"),
        ("team a/z", "cy"),
        ("team b/x", "di"),
    ] {
        acquire(&mut c, &[n], owner, 60 * SEC).await;
    }
    // A conflict, counted for the rate.
    let refused = c
        .acquire(acquire_req(&["team a/x"], "eve", 60 * SEC))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Aborted);

    let get = |path: String| async move {
        let r = reqwest::get(format!("http://{http}{path}")).await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    let (status, body) = get("/holders?prefix=team+a%2F&limit=5".into()).await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> = v["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["team a/x", "team a/y"], "cut to --list-max-page 2");
    assert_eq!(v["names"][0]["owner"], "ann");
    assert_eq!(v["next_page_token"], "team a/y");
    let (_, body) = get("/holders?prefix=team+a%2F&page_token=team+a%2Fy".into()).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["names"][0]["name"], "team a/z");
    assert_eq!(v["next_page_token"], "");
    let (status, _) = get("/holders?prefix=%E2%80%AE".into()).await;
    assert_eq!(status, 400, "a bidirectional control is refused as in names");

    let (status, page) = get("/?holder=team+b".into()).await;
    assert_eq!(status, 200);
    assert!(page.contains(r#"id="holder-query" value="team b""#), "{page}");
    assert!(
        page.contains("<td>team b/x</td><td>di</td><td>full</td>"),
        "{page}"
    );
    assert!(page.contains(r#"id="conflict-rate""#), "{page}");
    let (_, page) = get("/?holder=nobody".into()).await;
    assert!(page.contains(r#"id="holders-none""#), "{page}");
}

/// `--max-watchers` bounds the watches a server keeps: one over it is
/// refused with RESOURCE_EXHAUSTED (the client's `LimitExceeded`) naming
/// the flag, and a watch that ends frees its place.
#[tokio::test]
async fn watches_over_max_watchers_are_refused_until_one_ends() {
    let server = ServerProcess::start_ready(&["--max-ttl", "2m", "--max-watchers", "2"]).await;
    let client = server.client().await;
    let mut c = raw(&server).await;
    let first = client
        .watch(WatchTarget::Prefix("mw/".into()), None)
        .await
        .unwrap();
    let _second = client
        .watch(WatchTarget::Prefix("mw/".into()), None)
        .await
        .unwrap();
    assert_eq!(watchers(&mut c).await, 2);
    let err = client
        .watch(WatchTarget::Prefix("mw/".into()), None)
        .await
        .unwrap_err();
    match &err {
        Error::LimitExceeded { message } => {
            assert!(message.contains("--max-watchers"), "{message}");
        }
        other => panic!("expected a refusal over --max-watchers, got {other:?}"),
    }
    // The first ends; the server finds its stream gone when it next has an
    // event for it, and its place is free.
    drop(first);
    while watchers(&mut c).await > 1 {
        let g = acquire(&mut c, &["mw/x"], "mw-owner", 60 * SEC).await;
        release(&mut c, &g).await;
    }
    let mut third = client
        .watch(WatchTarget::Prefix("mw/".into()), None)
        .await
        .unwrap();
    let g = acquire(&mut c, &["mw/y"], "mw-owner", 60 * SEC).await;
    let e = next(&mut third).await;
    assert_eq!((e.kind, e.name.as_str()), (WatchEventKind::Granted, "mw/y"));
    release(&mut c, &g).await;
}
