//! What users do with a lease over several servers, beyond the paths the
//! cluster suite walks: a two-phase (tentative, then upgraded) lease one of
//! whose names is broken before the upgrade, and the release of a lease
//! some of whose parts are already gone. Real `bagel-server`s on
//! 127.0.0.1.

use std::time::Duration;

use bagel_client::{Client, Cluster, Error, LeaseOptions, ServerSpec};
use bagel_tests::ServerProcess;

async fn three() -> Vec<ServerProcess> {
    futures::future::join_all((0..3).map(|_| ServerProcess::start_ready(&[]))).await
}

async fn cluster_of(servers: &[ServerProcess]) -> Cluster {
    let specs: Vec<ServerSpec> = servers.iter().map(|s| ServerSpec::url(s.url.clone())).collect();
    Cluster::connect(&specs).await.expect("connect to the cluster")
}

/// One name owned by each server, in the order of `servers`.
fn one_name_each(cluster: &Cluster, servers: &[ServerProcess]) -> Vec<String> {
    let mut out: Vec<Option<String>> = vec![None; servers.len()];
    for i in 0.. {
        if out.iter().all(Option::is_some) {
            break;
        }
        let name = format!("job-{i}");
        let owner = cluster.route(&name).current.0;
        let k = servers
            .iter()
            .position(|s| s.url == owner)
            .expect("routed to a listed server");
        out[k].get_or_insert(name);
    }
    out.into_iter().map(Option::unwrap).collect()
}

/// Who holds `name` on its own server (its lease id), if anyone.
async fn holder_on(server: &ServerProcess, name: &str) -> Option<String> {
    let client: Client = server.client().await;
    let states = client.describe([name]).await.expect("describe");
    states[0].holder.as_ref().map(|h| h.lease_id.clone())
}

/// A tentative lease over three servers, one of whose names another
/// client takes in full (which breaks a tentative holder).
async fn tentative_then_broken() -> (Vec<ServerProcess>, Vec<String>, bagel_client::Lease) {
    let servers = three().await;
    let cluster = cluster_of(&servers).await;
    let names = one_name_each(&cluster, &servers);
    let lease = cluster
        .acquire(names.clone())
        .ttl(Duration::from_secs(10))
        .tentative()
        .options(LeaseOptions::default().with_auto_renew(false))
        .send()
        .await
        .expect("the tentative lease");
    let breaker: Client = servers[1].client().await;
    let full = breaker
        .acquire([names[1].clone()])
        .ttl(Duration::from_secs(10))
        .options(LeaseOptions::default().with_auto_renew(false))
        .send()
        .await
        .expect("a full acquire breaks a tentative holder");
    drop(full);
    (servers, names, lease)
}

/// Before: `upgrade` failed "lease not held" while the names on the two
/// other servers stayed held *full* until their deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_upgrade_leaves_no_part_held() {
    let (servers, names, lease) = tentative_then_broken().await;
    let e = lease.upgrade().await.expect_err("a part was broken");
    assert!(matches!(e, Error::NotHeld { .. }), "{e}");
    assert!(e.to_string().contains("other parts were released"), "{e}");
    for k in [0, 2] {
        assert_eq!(
            holder_on(&servers[k], &names[k]).await,
            None,
            "{} is still held on its server after the failed upgrade",
            names[k]
        );
    }
}

/// Before: the release stopped at the part that was gone (exit 1), though
/// it had freed the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_a_lease_with_a_part_gone_releases_the_rest() {
    let (servers, names, lease) = tentative_then_broken().await;
    lease
        .release(None)
        .await
        .expect("the parts still held are released; the gone one is named in a warning");
    for k in [0, 2] {
        assert_eq!(holder_on(&servers[k], &names[k]).await, None, "{}", names[k]);
    }
}

/// `URL` spelled another way that reaches the same server: the host
/// name for the address, a trailing slash.
fn respelled(url: &str) -> String {
    format!("{}/", url.replace("127.0.0.1", "localhost"))
}

/// Before: routing hashed the URL as written, so a client that wrote
/// `http://localhost:P/` was granted names another client held through
/// `http://127.0.0.1:P` (17 of 24 in the report).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_spellings_of_one_server_list_route_every_name_alike() {
    let servers = three().await;
    let x = cluster_of(&servers).await;
    let specs: Vec<ServerSpec> = servers
        .iter()
        .map(|s| ServerSpec::url(respelled(&s.url)))
        .collect();
    let y = Cluster::connect(&specs)
        .await
        .expect("the second spelling connects");
    let names: Vec<String> = (0..24).map(|i| format!("spelled-{i}")).collect();
    let mut held = Vec::new();
    for n in &names {
        assert_eq!(x.route(n).current_identity, y.route(n).current_identity, "{n}");
        held.push(
            x.acquire([n.clone()])
                .ttl(Duration::from_secs(10))
                .options(LeaseOptions::default().with_auto_renew(false))
                .send()
                .await
                .expect("x's grant"),
        );
    }
    for n in &names {
        match y.acquire([n.clone()]).ttl(Duration::from_secs(10)).send().await {
            Err(Error::Busy { .. }) => {}
            Ok(_) => panic!("{n} was granted to y while x holds it"),
            Err(e) => panic!("{n}: {e}"),
        }
    }
}

/// A list that names a member by an ID the server does not announce is
/// refused at connect, naming both: it would route that member's names
/// elsewhere than every other client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_naming_a_member_by_a_wrong_id_is_refused_naming_both() {
    let a = ServerProcess::start_ready(&["--server-id", "member-a"]).await;
    let b = ServerProcess::start_ready(&["--server-id", "member-b"]).await;
    // Swapped.
    let list = format!("member-b={},member-a={}", a.url, b.url);
    let specs = ServerSpec::parse_list(&list).unwrap();
    let e = Cluster::connect(&specs).await.expect_err("a wrong identity");
    let e = e.to_string();
    assert!(e.contains("member-a") && e.contains("member-b"), "{e}");
    // One wrong, one right: still refused (not "only its names fail").
    let list = format!("member-a={},member-c={}", a.url, b.url);
    let e = Cluster::connect(&ServerSpec::parse_list(&list).unwrap())
        .await
        .expect_err("one wrong identity");
    let e = e.to_string();
    assert!(e.contains("member-b") && e.contains("member-c"), "{e}");
    // Right: connects and routes by the IDs.
    let list = format!("member-a={},member-b={}", a.url, b.url);
    let ok = Cluster::connect(&ServerSpec::parse_list(&list).unwrap()).await;
    assert!(ok.is_ok(), "{:?}", ok.err());
}

/// A member without an ID that is down when the client starts: the
/// client cannot know which names are that member's, so it refuses,
/// saying to give IDs; with IDs it starts and only that member's names
/// fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_down_at_start_needs_an_id() {
    let a = ServerProcess::start_ready(&["--server-id", "member-a"]).await;
    let mut b = ServerProcess::start_ready(&["--server-id", "member-b"]).await;
    let b_url = b.url.clone();
    b.kill();
    let bare = [ServerSpec::url(a.url.clone()), ServerSpec::url(b_url.clone())];
    let e = Cluster::connect(&bare)
        .await
        .expect_err("b's identity is unknown");
    assert!(e.is_retryable(), "{e:?}");
    let e = e.to_string();
    assert!(e.contains(&b_url) && e.contains("ID=URL"), "{e}");
    let list = format!("member-a={},member-b={b_url}", a.url);
    let cluster = Cluster::connect(&ServerSpec::parse_list(&list).unwrap())
        .await
        .expect("with IDs the client starts");
    let on_a = (0..)
        .map(|i| format!("up-{i}"))
        .find(|n| cluster.route(n).current_identity == "member-a")
        .unwrap();
    cluster
        .acquire([on_a])
        .send()
        .await
        .expect("a name of the member that is up")
        .release(None)
        .await
        .unwrap();
}
