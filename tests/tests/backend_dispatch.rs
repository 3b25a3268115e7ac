//! List, watch and routing through the `LeaseBackend` trait: each backend
//! answers them or refuses them itself, naming itself, and states
//! beforehand which it answers. Nothing here asks which backend it holds:
//! every backend is an `Arc<dyn LeaseBackend>`. The in-memory backend (a
//! backend the CLI does not know), one real `bagel-server`, and two
//! servers as one cluster.

use std::sync::Arc;
use std::time::Duration;

use bagel_cli::{LeaseBackendOptions, open_lease_backend};
use bagel_client::backend::{Call, NameRoute, Offer, WatchMessage, WatchOptions};
use bagel_client::{AcquireBuilder, Error, LeaseBackend, LeaseOptions, WatchEventKind, WatchTarget};
use bagel_proto::clock::SystemClock;
use bagel_tests::{
    MemoryLeaseBackend, Roughtime, ServerProcess, bin, cli_servers, describe_output, s3_lease_url, unique,
};

/// Takes `names` (one lease each) and keeps them for the test.
async fn hold(backend: &Arc<dyn LeaseBackend>, names: &[&str]) -> Vec<bagel_client::Lease> {
    let mut leases = Vec::new();
    for name in names {
        let lease = AcquireBuilder::new(Arc::clone(backend), [*name])
            .ttl(Duration::from_secs(10))
            .owner("dispatch")
            .options(LeaseOptions::default().with_auto_renew(false))
            .send()
            .await
            .unwrap();
        leases.push(lease);
    }
    leases
}

fn listed(listing: &bagel_client::backend::Listing) -> Vec<(Option<&str>, &str)> {
    listing
        .names
        .iter()
        .map(|l| (l.server.as_deref(), l.name.name.as_str()))
        .collect()
}

#[tokio::test]
async fn the_in_memory_backend_lists_and_routes_and_refuses_watch_in_its_own_name() {
    let backend: Arc<dyn LeaseBackend> = Arc::new(MemoryLeaseBackend::new(Arc::new(SystemClock)));
    let location = backend.location();
    let _held = hold(&backend, &["jobs/b", "jobs/a", "other/c"]).await;

    assert_eq!(backend.offers(Call::List), Offer::Yes);
    let listing = backend.list_names("jobs/", 10).await.unwrap();
    assert_eq!(listed(&listing), [(None, "jobs/a"), (None, "jobs/b")]);
    assert_eq!(listing.names[0].name.holder.owner, "dispatch");
    let one = backend.list_names("", 1).await.unwrap();
    assert_eq!(listed(&one), [(None, "jobs/a")]);

    assert_eq!(
        backend.route_name("jobs/a").unwrap(),
        NameRoute::Store(location.clone())
    );

    let named = backend.describe_self();
    assert!(
        named.contains("in-memory") && named.contains(&location),
        "{named}"
    );
    match backend.offers(Call::Watch) {
        Offer::No { why: Some(why) } => assert!(!why.contains("S3"), "{why}"),
        other => panic!("the in-memory backend does not watch, yet offers {other:?}"),
    }
    let refused = backend
        .watch_names(WatchTarget::Prefix("jobs/".into()), WatchOptions::default())
        .await
        .unwrap_err();
    let text = refused.to_string();
    assert!(matches!(refused, Error::Unsupported { .. }), "{refused:?}");
    assert!(
        text.contains("watch") && text.contains(&location) && !text.contains("S3"),
        "{text}"
    );
}

#[tokio::test]
async fn one_server_lists_watches_and_routes_through_the_trait() {
    let server = ServerProcess::start_ready(&[]).await;
    let backend = open_lease_backend(&server.url, &LeaseBackendOptions::default())
        .await
        .unwrap();
    assert_eq!(backend.offers(Call::List), Offer::Yes);
    assert_eq!(backend.offers(Call::Watch), Offer::Yes);
    assert!(backend.describe_self().contains(&server.url));
    assert_eq!(
        backend.route_name("x").unwrap(),
        NameRoute::Server(server.url.clone())
    );

    let _held = hold(&backend, &["w/1"]).await;
    let listing = backend.list_names("w/", 10).await.unwrap();
    assert_eq!(listed(&listing), [(None, "w/1")]);
    let revision = listing.revisions[0].revision;
    assert!(revision > 0, "{listing:?}");

    // From the listing's revision: the next grant, nothing before it.
    let options = WatchOptions {
        from_revision: Some(revision),
        progress_interval: None,
    };
    let mut watch = backend
        .watch_names(WatchTarget::Prefix("w/".into()), options)
        .await
        .unwrap();
    let _more = hold(&backend, &["w/2"]).await;
    let event = loop {
        match watch.next_message().await.unwrap().expect("the watch goes on") {
            WatchMessage::Event(e) => break e,
            WatchMessage::Progress { .. } => {}
        }
    };
    assert_eq!(
        (event.kind, event.name.as_str()),
        (WatchEventKind::Granted, "w/2")
    );
    assert_eq!(watch.last_revision(), Some(event.revision));
}

#[tokio::test]
async fn a_cluster_lists_each_server_and_watches_none_whole() {
    let servers = futures::future::join_all((0..2).map(|_| ServerProcess::start_ready(&[]))).await;
    let list = format!("{},{}", servers[0].url, servers[1].url);
    let backend = open_lease_backend(&list, &LeaseBackendOptions::default())
        .await
        .unwrap();
    let names: Vec<String> = (0..6).map(|i| format!("c/{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let _held = hold(&backend, &refs).await;

    let listing = backend.list_names("c/", 100).await.unwrap();
    let got: Vec<&str> = listing.names.iter().map(|l| l.name.name.as_str()).collect();
    assert_eq!(got, refs, "every name, in name order");
    for l in &listing.names {
        let NameRoute::Servers(route) = backend.route_name(&l.name.name).unwrap() else {
            panic!("a cluster routes among its servers");
        };
        assert_eq!(
            l.server.as_deref(),
            Some(route.current.0.as_str()),
            "listed by its owner"
        );
    }
    assert_eq!(listing.revisions.len(), 2, "{listing:?}");

    assert!(matches!(backend.offers(Call::Watch), Offer::EachServer { .. }));
    assert!(matches!(
        backend
            .watch_names(WatchTarget::Prefix(String::new()), WatchOptions::default())
            .await,
        Err(Error::Unsupported { .. })
    ));
}

fn stderr(out: &std::process::Output) -> String {
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(out));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The CLI words a refusal from what the backend states: several servers
/// watch only one at a time.
#[tokio::test]
async fn the_cli_says_a_cluster_watches_one_server_at_a_time() {
    let servers = futures::future::join_all((0..2).map(|_| ServerProcess::start_ready(&[]))).await;
    let refs: Vec<&ServerProcess> = servers.iter().collect();
    assert_eq!(
        stderr(&cli_servers(&refs, &["watch", "x"])),
        "bagel: watch follows one server (revisions are per server): give it with --server URL, \
         once per server to watch several\n"
    );
    assert_eq!(
        stderr(&cli_servers(&refs, &["list", "--watch"])),
        "bagel: list --watch follows one server (revisions are per server): give it with --server URL\n"
    );
}

/// ...and the S3 lease store neither lists nor watches, saying why; it
/// routes every name to itself.
#[tokio::test]
async fn the_cli_says_the_s3_lease_store_neither_lists_nor_watches() {
    let url = s3_lease_url(&unique("dispatch"));
    let dir = tempfile::tempdir().unwrap();
    let roughtime = Roughtime::from_env();
    let run = |args: &[&str]| {
        std::process::Command::new(bin("bagel"))
            .args(roughtime.flags())
            .args(["--lease-store", &url])
            .args(args)
            .env("BAGEL_STATE_DIR", dir.path())
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    };
    assert_eq!(
        stderr(&run(&["list"])),
        "bagel: list is not supported on the S3 lease backend (--lease-store): it would have to read \
         every lease object of the store; ask for names with `bagel describe NAME...`\n"
    );
    assert_eq!(
        stderr(&run(&["watch", "x"])),
        "bagel: watch is not supported on the S3 lease backend (--lease-store): S3 has no change \
         notifications; poll `bagel describe NAME...` instead\n"
    );
    let route = run(&["route", "x", "--json"]);
    assert!(route.status.success(), "{}", describe_output(&route));
    let json: serde_json::Value = serde_json::from_slice(&route.stdout).unwrap();
    assert_eq!(json, serde_json::json!([{ "lease_store": url, "name": "x" }]));
}
