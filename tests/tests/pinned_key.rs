//! A server given with a pinned key (`URL#KEY`) that presents another key
//! is refused with one message that names the server once, the pinned key
//! id, the key the server presented, and what to do (issue 24 item 4).

use bagel_tests::{ServerProcess, describe_output};

#[tokio::test]
async fn a_pinned_key_mismatch_names_the_server_once_and_both_keys() {
    let server = ServerProcess::start_ready(&[]).await;
    let presented = server
        .client()
        .await
        .keys()
        .ids()
        .next()
        .expect("a key")
        .to_owned();
    let other = bagel_proto::Signer::generate();
    let pinned = other.key_id().to_owned();
    let spec = format!(
        "{}#{}",
        server.url,
        bagel_proto::hex::encode(other.verifying_key().as_bytes())
    );
    let out = bagel_tests::cli_no_server(&["--servers", &spec, "acquire", "x"]);
    assert!(!out.status.success(), "{}", describe_output(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches(server.url.as_str()).count(), 1, "{err}");
    assert!(err.contains(&format!("not the pinned key {pinned}")), "{err}");
    assert!(err.contains(&format!("presents key {presented}")), "{err}");
    assert!(err.contains("pin the new one"), "{err}");
}

/// The same through a cluster (`--servers a=A#KEY,B`): the member's error
/// is not wrapped in "server A: " once more per layer it passes.
#[tokio::test]
async fn a_pinned_key_mismatch_in_a_cluster_names_the_server_once() {
    // A has an ID in the list, so routing need not reach it (it would
    // refuse the pinned key at start).
    let a = ServerProcess::start_ready(&["--server-id", "a"]).await;
    let b = ServerProcess::start_ready(&[]).await;
    let other = bagel_proto::Signer::generate();
    let list = format!(
        "a={}#{},{}",
        a.url,
        bagel_proto::hex::encode(other.verifying_key().as_bytes()),
        b.url
    );
    // A name that server A owns.
    let name = (0..)
        .map(|i| format!("n{i}"))
        .find(|n| {
            let out = bagel_tests::cli_no_server(&["--servers", &list, "route", n, "--json"]);
            assert!(out.status.success(), "{}", describe_output(&out));
            let routes: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            routes[0]["server"] == a.url.as_str()
        })
        .unwrap();
    let out = bagel_tests::cli_no_server(&["--servers", &list, "acquire", &name]);
    assert!(!out.status.success(), "{}", describe_output(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches(a.url.as_str()).count(), 1, "{err}");
    assert!(
        err.contains(&format!("not the pinned key {}", other.key_id())),
        "{err}"
    );
}
