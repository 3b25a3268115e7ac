//! A wrong server list fails safe (issue 51, hole 3): servers started
//! with `--members` grant only the names they own under the member lists,
//! so a client whose list names a member by the wrong ID — pinned and
//! never asked, or down when the client starts — is refused the names it
//! misroutes instead of taking them beside the right list's holder.
//! Real `bagel-server` processes on 127.0.0.1, the real cluster client.

use std::time::Duration;

use bagel_client::{AcquireBuilder, Cluster, Error, Lease, LeaseOptions, ServerSpec};
use bagel_proto::routing::owner;
use bagel_tests::ServerProcess;

/// Two members `a` and `b` that know their membership.
async fn pair(extra: &[&str]) -> (ServerProcess, ServerProcess) {
    let start = |id: &'static str| {
        let mut args = vec!["--server-id", id, "--members", "a,b"];
        args.extend_from_slice(extra);
        async move { ServerProcess::start_ready(&args).await }
    };
    tokio::join!(start("a"), start("b"))
}

fn entry(id: &str, server: &ServerProcess, pinned: bool) -> ServerSpec {
    let text = if pinned {
        format!("{id}={}#{}", server.url, server.public_key_hex)
    } else {
        format!("{id}={}", server.url)
    };
    text.parse().unwrap()
}

/// A name `b` owns under the right list `[a, b]` that the wrong list
/// `[a, x]` routes to `a`.
fn misrouted_name() -> String {
    (0..)
        .map(|i| format!("tenant-{i}"))
        .find(|n| owner(&["a", "b"], n) == Some(1) && owner(&["a", "x"], n) == Some(0))
        .unwrap()
}

/// Sends `acquire` (of a cluster or a one-server client) for 10 s,
/// without background renewal.
async fn take(acquire: AcquireBuilder) -> Result<Lease, Error> {
    let options = LeaseOptions::default().with_auto_renew(false);
    acquire.ttl(Duration::from_secs(10)).options(options).send().await
}

/// A wrong list is a configuration error, never retried: the client
/// refuses the member whose announced membership disagrees with its list
/// (at connect), or the member refuses the name (a client that skipped
/// that check).
#[track_caller]
fn assert_wrong_list(e: &Error) {
    assert!(matches!(e, Error::Config { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("the two disagree on which server owns which name")
            || text.contains("belongs to server"),
        "{text}"
    );
    assert!(!e.is_retryable(), "{e:?}");
}

#[tokio::test]
async fn a_member_refuses_a_name_it_does_not_own_naming_its_owner() {
    let (a, _b) = pair(&[]).await;
    // One server's client: no list to compare, so the server decides.
    let client = a.client().await;
    let e = take(client.acquire([misrouted_name()]))
        .await
        .expect_err("a does not own it");
    assert!(matches!(e, Error::Config { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("belongs to server b "), "{text}");
    assert!(text.contains("this is \"a\""), "{text}");
    let own = (0..)
        .map(|i| format!("own-{i}"))
        .find(|n| owner(&["a", "b"], n) == Some(0))
        .unwrap();
    take(client.acquire([own]))
        .await
        .unwrap()
        .release(None)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_pinned_member_under_a_wrong_id_gets_no_name_its_owner_granted() {
    let (a, b) = pair(&[]).await;
    let right = Cluster::connect(&[entry("a", &a, true), entry("b", &b, true)])
        .await
        .unwrap();
    // b's ID written wrong, its key pinned: the client never asks b.
    let wrong = Cluster::connect(&[entry("a", &a, true), entry("x", &b, true)])
        .await
        .unwrap();
    let name = misrouted_name();
    let held = take(right.acquire([name.clone()])).await.unwrap();
    let e = take(wrong.acquire([name.clone()]))
        .await
        .expect_err("a, which does not own the name, must refuse it");
    assert_wrong_list(&e);
    // Refused before and after the rightful holder lets go alike: the
    // answer is the list's, not the name's.
    held.release(None).await.unwrap();
    let e = take(wrong.acquire([name])).await.unwrap_err();
    assert_wrong_list(&e);
}

#[tokio::test]
async fn a_wrong_id_for_a_member_down_at_start_gets_no_name_either() {
    let (a, mut b) = pair(&[]).await;
    let b_url = b.url.clone();
    b.kill();
    // Unpinned and down: the client cannot check x's identity at start.
    let x: ServerSpec = format!("x={b_url}").parse().unwrap();
    // a answers at start: its membership refuses the list at once.
    let e = Cluster::connect(&[entry("a", &a, false), x.clone()])
        .await
        .expect_err("a announces a, b; the list says a, x");
    assert_wrong_list(&e);
    // a pinned too (nobody asked at start): refused at a's first use,
    // for every name, the misrouted one included.
    let wrong = Cluster::connect(&[entry("a", &a, true), x]).await.unwrap();
    let own = (0..)
        .map(|i| format!("own-{i}"))
        .find(|n| owner(&["a", "b"], n) == Some(0) && owner(&["a", "x"], n) == Some(0))
        .unwrap();
    for name in [misrouted_name(), own] {
        let e = take(wrong.acquire([name])).await.unwrap_err();
        assert_wrong_list(&e);
    }
}

#[tokio::test]
async fn server_info_announces_the_members_and_a_server_outside_them_will_not_start() {
    let (a, _b) = pair(&[]).await;
    let info = a.cli(&["server-info", "--json"]);
    assert!(info.status.success(), "{info:?}");
    let text = String::from_utf8_lossy(&info.stdout);
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["members"], serde_json::json!([["a", "b"]]), "{text}");
    let human = a.cli(&["server-info"]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains("members: a, b (grants only the names it owns)"),
        "{text}"
    );

    let out = std::process::Command::new(bagel_tests::bin("bagel-server"))
        .args(["--listen", "127.0.0.1:0", "--server-id", "c", "--members", "a,b"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("\"c\" is in none of the member lists"),
        "{stderr}"
    );
}

#[tokio::test]
async fn while_migrating_each_member_grants_its_names_under_either_list() {
    // a and b learn of c first (`--next-members`); c serves the next list.
    let (a, b) = pair(&["--next-members", "a,b,c"]).await;
    let c = ServerProcess::start_ready(&["--server-id", "c", "--members", "a,b", "--next-members", "a,b,c"])
        .await;
    let current = [entry("a", &a, true), entry("b", &b, true)];
    let next = [entry("a", &a, true), entry("b", &b, true), entry("c", &c, true)];
    let step2 = Cluster::migrating(&current, &next).await.unwrap();
    let step3 = Cluster::connect(&next).await.unwrap();
    // A name that moves to c: a step-2 client takes it from its owner in
    // each list, a step-3 client then waits on c.
    let moving = (0..)
        .map(|i| format!("moving-{i}"))
        .find(|n| owner(&["a", "b", "c"], n) == Some(2))
        .unwrap();
    let lease = take(step2.acquire([moving.clone()])).await.unwrap();
    let e = take(step3.acquire([moving])).await.unwrap_err();
    assert!(matches!(e, Error::Busy { .. }), "{e:?}");
    lease.release(None).await.unwrap();
}

/// Members from `--members-file` (issue 54): the lists are read again
/// when the file changes, so a change of lists needs no restart (and no
/// restart wait); a file that would leave this server in no list is not
/// taken, and the lists in effect stay.
#[tokio::test]
async fn a_members_file_is_read_again_when_it_changes() {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("members");
    let write = |text: &str| {
        let new = dir.path().join("members.new");
        std::fs::write(&new, text).unwrap();
        std::fs::rename(&new, &file).unwrap();
    };
    write("# a and b\nmembers = a,b\n");
    let options = bagel_tests::ServerOptions {
        rust_log: "info".into(),
        capture_stderr: true,
        ..Default::default()
    };
    let path = file.to_str().unwrap();
    let args = [
        "--unsafe-skip-restart-wait",
        "--server-id",
        "a",
        "--members-file",
        path,
    ];
    let mut a = ServerProcess::spawn_with(&args, options).await;
    a.wait_ready().await;
    let stderr = a.take_stderr().unwrap();
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    let logged = async |lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>, what: &str| {
        // A guard against a server that never says it, not a timing.
        tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let line = lines.recv().await.expect("server log");
                if line.contains(what) {
                    return line;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the server did not log {what:?}"))
    };
    let client = a.client().await;
    let name = misrouted_name();
    let e = take(client.acquire([name.clone()])).await.expect_err("b's name");
    assert!(e.to_string().contains("belongs to server b "), "{e}");

    // b leaves: a alone owns every name, from the reload on.
    write("members = a\n");
    let said = logged(&mut lines, "member lists reloaded").await;
    assert!(said.contains("the file changed"), "{said}");
    assert_eq!(
        client.server_info().await.unwrap().members,
        vec![vec!["a".to_owned()]]
    );
    take(client.acquire([name])).await.unwrap();

    // A list without a: refused, the lists in effect stay.
    write("members = b,c\n");
    let said = logged(&mut lines, "member lists not reloaded").await;
    assert!(said.contains("none of the member lists"), "{said}");
    assert_eq!(
        client.server_info().await.unwrap().members,
        vec![vec!["a".to_owned()]]
    );

    // --members and --members-file together: refused at start.
    let out = std::process::Command::new(bagel_tests::bin("bagel-server"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--server-id",
            "a",
            "--members",
            "a",
            "--members-file",
            path,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot be used with"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
