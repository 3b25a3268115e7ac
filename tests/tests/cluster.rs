//! Many servers: real `bagel-server` processes on 127.0.0.1, names routed
//! over them by the cluster client; leases across servers; a server down,
//! killed, restarted, frozen; migration from two servers to three.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bagel_bags::audit::{AuditConfig, AuditMessage, ViolationKind, audit};
use bagel_bags::{self as bag, BagConfig, Writer};
use bagel_client::{
    Client, Cluster, CoalesceOptions, Coalescer, Ended, Error, Lease, LeaseOptions, LossReason, Micros,
    ServerSpec, TimeOptions, TimeSource, Transport,
};
use bagel_proto::clock::{AssumedExact, Clock, SystemClock};
use bagel_proto::{KeyRing, verify_witness};
use bagel_tests::{ServerProcess, cli_servers, describe_output, unique, wire};
use bytes::Bytes;

fn spec(s: &ServerProcess) -> ServerSpec {
    ServerSpec::url(s.url.clone())
}

fn specs(servers: &[&ServerProcess]) -> Vec<ServerSpec> {
    servers.iter().map(|s| spec(s)).collect()
}

async fn start_ready(n: usize, args: &[&str]) -> Vec<ServerProcess> {
    futures::future::join_all((0..n).map(|_| ServerProcess::start_ready(args))).await
}

/// `per` names owned by each server (in the order of `servers`), found by
/// asking the cluster's routing.
fn names_on(cluster: &Cluster, servers: &[&ServerProcess], per: usize) -> Vec<Vec<String>> {
    let mut out = vec![Vec::new(); servers.len()];
    for i in 0.. {
        if out.iter().all(|v: &Vec<String>| v.len() >= per) {
            break;
        }
        let name = format!("name-{i}");
        let owner = cluster.route(&name).current.0;
        let k = servers
            .iter()
            .position(|s| s.url == owner)
            .expect("routed to a listed server");
        if out[k].len() < per {
            out[k].push(name);
        }
    }
    out
}

/// The servers in the order a multi-server acquire visits them.
fn by_key_order<'a>(cluster: &Cluster, servers: &[&'a ServerProcess]) -> Vec<&'a ServerProcess> {
    let order: Vec<String> = cluster.servers().into_iter().map(|(url, _)| url).collect();
    let mut sorted = servers.to_vec();
    sorted.sort_by_key(|s| order.iter().position(|u| *u == s.url));
    sorted
}

async fn holder(client: &Client, name: &str) -> Option<String> {
    let states = client.describe([name]).await.unwrap();
    states[0].holder.as_ref().map(|h| h.lease_id.clone())
}

fn no_renew() -> LeaseOptions {
    LeaseOptions::default().with_auto_renew(false)
}

#[tokio::test]
async fn names_spread_evenly_over_three_servers() {
    let servers = start_ready(3, &[]).await;
    let refs: Vec<&ServerProcess> = servers.iter().collect();
    let cluster = Cluster::connect(&specs(&refs)).await.unwrap();
    let mut counts: HashMap<String, usize> = HashMap::new();
    for i in 0..10_000 {
        *counts
            .entry(cluster.route(&format!("tenant-{i}")).current.0)
            .or_default() += 1;
    }
    assert_eq!(counts.len(), 3);
    for (url, c) in &counts {
        assert!(
            (3_000..=3_667).contains(c),
            "{url} owns {c} of 10000 names, not within 10% of a third: {counts:?}"
        );
    }
}

#[tokio::test]
async fn a_lease_across_three_servers_has_a_witness_from_each_and_conflicts_name_the_server() {
    let servers = start_ready(3, &[]).await;
    let refs: Vec<&ServerProcess> = servers.iter().collect();
    let cluster = Cluster::connect(&specs(&refs)).await.unwrap();
    let ordered = by_key_order(&cluster, &refs);
    let names = names_on(&cluster, &ordered, 3);
    // Two names on each server; the third of each stays free.
    let held: Vec<String> = names.iter().flat_map(|n| n[..2].to_vec()).collect();
    let lease = cluster
        .acquire(held.clone())
        .ttl(Duration::from_secs(10))
        .options(no_renew())
        .send()
        .await
        .unwrap();

    assert_eq!(lease.names().len(), 6);
    let witnesses = lease.witnesses();
    assert_eq!(witnesses.len(), 3, "one witness per server");
    assert_eq!(lease.servers().len(), 3);
    for (server, part) in ordered.iter().zip(lease.servers()) {
        let client = server.client().await;
        assert_eq!(part.server, server.url);
        let w = witnesses
            .iter()
            .find(|w| w.key_id() == part.key_id)
            .expect("a witness signed by each server's key");
        let body = verify_witness(&wire(w), &client.keys()).expect("verifies against its own server's key");
        assert_eq!(body.lease_id, part.lease_id);
        assert!(
            body.deadline_us >= lease.deadline().as_micros(),
            "the handle's deadline is the earliest"
        );
        for name in &part.names {
            assert_eq!(
                holder(&client, name).await.as_deref(),
                Some(part.lease_id.as_str())
            );
        }
    }

    // Another client wants a free name on the first server and a held one
    // on the last: refused, naming the last server and the holder, and
    // nothing stays held on the first.
    let other = Cluster::connect(&specs(&refs)).await.unwrap();
    let (first, last) = (ordered[0], ordered[2]);
    let err = other
        .acquire([names[0][2].clone(), names[2][0].clone()])
        .send()
        .await
        .unwrap_err();
    let Error::Busy {
        conflict: Some(c),
        message,
    } = &err
    else {
        panic!("expected a conflict, got {err:?}")
    };
    assert_eq!(c.name, names[2][0]);
    assert_eq!(c.server.as_deref(), Some(last.url.as_str()));
    assert_eq!(c.holder_lease_id, lease.servers()[2].lease_id);
    assert!(message.contains(&last.url), "{message}");
    assert_eq!(holder(&first.client().await, &names[0][2]).await, None);

    // Released everywhere with one watermark.
    let wm = lease.release(None).await.unwrap();
    for (server, names) in ordered.iter().zip(&names) {
        let client = server.client().await;
        let states = client.describe(names[..2].to_vec()).await.unwrap();
        for s in states {
            assert!(s.holder.is_none(), "{} still held", s.name);
            assert_eq!(s.previous.ended, Ended::Released);
            assert!(s.previous.watermark <= wm);
        }
    }
}

#[tokio::test]
async fn a_server_down_fails_only_its_names_and_leaves_nothing_held() {
    let mut servers = start_ready(3, &[]).await;
    let cluster = {
        let refs: Vec<&ServerProcess> = servers.iter().collect();
        Cluster::connect(&specs(&refs)).await.unwrap()
    };
    let (names, down_url, first_url) = {
        let refs: Vec<&ServerProcess> = servers.iter().collect();
        let ordered = by_key_order(&cluster, &refs);
        (
            names_on(&cluster, &ordered, 2),
            ordered[2].url.clone(),
            ordered[0].url.clone(),
        )
    };
    let all_urls: Vec<(String, String)> = servers
        .iter()
        .map(|s| (s.url.clone(), s.public_key_hex.clone()))
        .collect();
    let down = servers.iter_mut().find(|s| s.url == down_url).unwrap();
    down.kill();

    let err = cluster.acquire([names[2][0].clone()]).send().await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(
        err.to_string().contains(&down_url),
        "the error names the server: {err}"
    );

    // A lease spanning the first server and the dead one: refused, and the
    // part taken on the first server is given back.
    let err = cluster
        .acquire([names[0][0].clone(), names[2][1].clone()])
        .send()
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&down_url), "{err}");
    let first = Client::connect(first_url.clone()).await.unwrap();
    assert_eq!(holder(&first, &names[0][0]).await, None, "nothing stays held");

    // Names on the other servers keep working.
    let lease = cluster
        .acquire([names[0][0].clone(), names[1][0].clone()])
        .options(no_renew())
        .send()
        .await
        .unwrap();
    assert_eq!(lease.witnesses().len(), 2);
    lease.release(None).await.unwrap();

    // A client starting now without IDs cannot learn the dead member's
    // identity, which routes names: it refuses, retryably, naming it.
    let bare: Vec<ServerSpec> = all_urls
        .iter()
        .map(|(url, _)| ServerSpec::url(url.clone()))
        .collect();
    let refused = Cluster::connect(&bare)
        .await
        .expect_err("the dead member's identity is unknown");
    assert!(refused.is_retryable(), "{refused:?}");
    assert!(refused.to_string().contains(&down_url), "{refused}");
    // With each member's ID (what the first client learned), it starts and
    // routes as the first one (by identities, not by keys it cannot learn
    // from the dead server): the live servers' names work, the dead one's
    // fail naming it.
    let identity = |url: &str| {
        let n = names
            .concat()
            .into_iter()
            .find(|n| cluster.route(n).current.0 == url)
            .unwrap();
        cluster.route(&n).current_identity
    };
    let with_ids: Vec<String> = all_urls
        .iter()
        .map(|(url, _)| format!("{}={url}", identity(url)))
        .collect();
    let late = Cluster::connect(&ServerSpec::parse_list(&with_ids.join(",")).unwrap())
        .await
        .expect("a client with IDs starts while one server is down");
    for n in names.concat() {
        assert_eq!(late.route(&n).current.0, cluster.route(&n).current.0, "{n}");
    }
    let lease = late
        .acquire([names[0][1].clone(), names[1][1].clone()])
        .options(no_renew())
        .send()
        .await
        .expect("the live servers' names work");
    lease.release(None).await.unwrap();
    let err = late.acquire([names[2][0].clone()]).send().await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(err.to_string().contains(&down_url), "{err}");
    // With the keys pinned (`ID=URL#KEY`) too.
    let pinned: Vec<String> = all_urls
        .iter()
        .map(|(url, key)| format!("{}={url}#{key}", identity(url)))
        .collect();
    let out = bagel_tests::cli_no_server(&["--servers", &pinned.join(","), "route", &names[2][0], "--json"]);
    assert!(out.status.success(), "{}", describe_output(&out));
    let routes: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(routes[0]["server"], down_url.as_str());
    let out =
        bagel_tests::cli_no_server(&["--servers", &pinned.join(","), "acquire", &names[1][1], "--json"]);
    assert!(out.status.success(), "{}", describe_output(&out));
}

/// A member that is frozen (it accepts connections and answers nothing, as
/// in a long GC pause, a VM suspend or a hung host) holds up only its own
/// names: a client starting meanwhile, with each member's ID, goes on
/// without it after `ClientOptions::member_wait`, as it would for a member
/// that is down, and its names wait for it to thaw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_member_holds_up_only_its_own_names_at_start() {
    let servers = start_ready(3, &[]).await;
    let refs: Vec<&ServerProcess> = servers.iter().collect();
    let cluster = Cluster::connect(&specs(&refs)).await.unwrap();
    let names = names_on(&cluster, &refs, 1);
    let with_ids: Vec<String> = refs
        .iter()
        .zip(&names)
        .map(|(s, n)| format!("{}={}", cluster.route(&n[0]).current_identity, s.url))
        .collect();
    let list = with_ids.join(",");
    // Bounds a hang, not a speed: the start must not wait for the thaw,
    // which comes only after everything below has returned.
    let guard = Duration::from_secs(60);
    refs[2].pause();

    let late = tokio::time::timeout(guard, Cluster::connect(&ServerSpec::parse_list(&list).unwrap()))
        .await
        .expect("the start does not wait for the frozen member")
        .expect("a client with IDs starts while one member is frozen");
    let lease = tokio::time::timeout(
        guard,
        late.acquire([names[0][0].clone(), names[1][0].clone()])
            .options(no_renew())
            .send(),
    )
    .await
    .expect("the live members' names do not wait for the frozen one")
    .unwrap();
    lease.release(None).await.unwrap();

    // The CLI, as a `bagel run` standby or a cron job starts it: with a
    // call bound far past the guard, so only not waiting passes.
    let cli = {
        let list = list.clone();
        let name = names[1][0].clone();
        tokio::task::spawn_blocking(move || {
            bagel_tests::cli_no_server(&["--servers", &list, "--timeout", "10m", "acquire", &name, "--json"])
        })
    };
    let out = tokio::time::timeout(guard, cli)
        .await
        .expect("the CLI does not wait for the frozen member")
        .unwrap();
    assert!(out.status.success(), "{}", describe_output(&out));

    // The frozen member's own names wait for it, and are granted (by the
    // member its ID names) once it thaws.
    let waiting = {
        let late = late.clone();
        let name = names[2][0].clone();
        tokio::spawn(async move { late.acquire([name]).options(no_renew()).send().await })
    };
    refs[2].resume();
    let lease = tokio::time::timeout(guard, waiting)
        .await
        .expect("granted once the member thaws")
        .unwrap()
        .expect("the frozen member's name is granted after the thaw");
    assert_eq!(lease.witnesses().len(), 1);
    lease.release(None).await.unwrap();
}

#[tokio::test]
async fn after_kill_9_only_the_killed_servers_names_wait_out_the_ttl() {
    let keys = tempfile::tempdir().unwrap();
    let key_files: Vec<String> = (0..3)
        .map(|i| keys.path().join(format!("k{i}")).display().to_string())
        .collect();
    let mut servers = Vec::new();
    for k in &key_files {
        servers.push(
            ServerProcess::start_ready(&["--key", k, "--max-ttl", "1500ms", "--clock-tolerance", "100ms"])
                .await,
        );
    }
    let refs: Vec<&ServerProcess> = servers.iter().collect();
    let cluster = Cluster::connect(&specs(&refs)).await.unwrap();
    let names = names_on(&cluster, &refs, 2);
    let held = cluster
        .acquire(names.iter().map(|n| n[0].clone()).collect::<Vec<_>>())
        .ttl(Duration::from_secs(1))
        .options(no_renew())
        .send()
        .await
        .unwrap();

    // kill -9 the second server; it comes back at the same address with
    // the same key, and waits out its max TTL.
    let addr = servers[1].addr.to_string();
    servers[1].kill();
    servers[1] = ServerProcess::start_at(
        &addr,
        &[
            "--key",
            &key_files[1],
            "--max-ttl",
            "1500ms",
            "--clock-tolerance",
            "100ms",
        ],
    )
    .await;

    let err = cluster.acquire([names[1][1].clone()]).send().await.unwrap_err();
    let Error::Unavailable { message, .. } = &err else {
        panic!("expected the restart wait, got {err:?}")
    };
    assert!(message.contains("refuses grants until"), "{message}");
    assert!(message.contains(&servers[1].url), "{message}");
    // The other servers grant at once.
    for k in [0, 2] {
        let l = cluster
            .acquire([names[k][1].clone()])
            .options(no_renew())
            .send()
            .await
            .unwrap();
        l.release(None).await.unwrap();
    }
    // Once its wait is over, the restarted server grants, saying it does
    // not know how the previous lease ended.
    servers[1].wait_ready().await;
    let l = cluster
        .acquire([names[1][0].clone()])
        .options(no_renew())
        .send()
        .await
        .unwrap();
    assert_eq!(l.names()[0].previous.ended, Ended::Unknown);
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_is_survived_until_the_deadline_then_the_lease_is_lost() {
    let servers = start_ready(3, &[]).await;
    let refs: Vec<&ServerProcess> = servers.iter().collect();
    let cluster = Cluster::connect(&specs(&refs)).await.unwrap();
    let names = names_on(&cluster, &refs, 1);
    let lease = cluster
        .acquire(names.concat())
        .ttl(Duration::from_secs(3))
        .options(
            LeaseOptions::default()
                .with_renew_every(Duration::from_millis(300))
                .with_safety_margin(Duration::from_millis(300)),
        )
        .send()
        .await
        .unwrap();

    // Frozen for a second (shorter than the TTL): renewals wait, the lease
    // stays valid, and once the server thaws the deadline moves on again.
    let before = lease.deadline();
    refs[1].pause();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(lease.is_valid(), "valid while the deadline is ahead");
    refs[1].resume();
    let mut rx = lease.subscribe();
    tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|s| s.deadline > before))
        .await
        .expect("a renewal lands once the server thaws")
        .unwrap();
    assert!(lease.is_valid());

    // Frozen for good: lost before its deadline, never after.
    refs[1].pause();
    let reason = lease.lost().await;
    let now = SystemClock.now();
    let deadline = lease.deadline();
    refs[1].resume();
    assert!(matches!(reason, LossReason::OutOfTime { .. }), "{reason:?}");
    assert!(now < deadline, "lost at {now}, after its deadline {deadline}");
    assert!(!lease.is_valid());
}

/// Writers under leases from a cluster, into one log.
struct Bags {
    _dir: tempfile::TempDir,
    url: String,
    log: String,
    cfg: BagConfig,
    /// Signed time for the writers.
    time: Client,
    acked: AtomicUsize,
}

impl Bags {
    async fn new(time: Client) -> Arc<Self> {
        let dir = tempfile::tempdir().unwrap();
        Arc::new(Bags {
            url: format!("file://{}", dir.path().display()),
            _dir: dir,
            log: unique("cluster"),
            cfg: BagConfig::default().with_grace(Duration::from_millis(200)),
            time,
            acked: AtomicUsize::new(0),
        })
    }

    async fn write(&self, lease: &Lease, writer_id: &str, n: usize) {
        let store = bag::open_store(&self.url, &self.cfg).await.unwrap();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let time = TimeSource::lease_server(self.time.clone(), TimeOptions::default());
        let writer = Writer::new(
            store,
            &self.log,
            writer_id,
            lease.rights(),
            clock,
            Arc::new(time),
            self.cfg.clone(),
        )
        .unwrap();
        for i in 0..n {
            writer
                .write(Bytes::from(format!("{writer_id}-{i}")))
                .await
                .unwrap();
            self.acked.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Closes every bag and audits what was stored.
    async fn audit(&self, keys: &KeyRing) -> (usize, bagel_bags::audit::AuditReport) {
        let store = bag::open_store(&self.url, &self.cfg).await.unwrap();
        let until = Micros::now().saturating_add(Duration::from_secs(1));
        bag::close_through(
            store.as_ref(),
            &self.log,
            until,
            &self.cfg,
            &AssumedExact(SystemClock),
        )
        .await
        .unwrap();
        let opts = bag::reader::ReadOptions::default().with_keys(Some(keys.clone()));
        let report = bag::read(
            store.as_ref(),
            &self.log,
            &opts,
            &self.cfg,
            &AssumedExact(SystemClock),
        )
        .await
        .unwrap();
        assert!(report.rejected.is_empty(), "{:?}", report.rejected);
        let messages = AuditMessage::from_report(&report, &self.log);
        (
            report.messages.len(),
            audit(&messages, &AuditConfig::new(keys.clone())),
        )
    }
}

const MIGRATION_NAMES: [&str; 8] = ["m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7"];

/// One client's work: `rounds` leases on one or two names, each writing a
/// few messages and released; busy names are retried later. Returns the
/// latest deadline any of its leases had.
async fn worker(cluster: Cluster, bags: Arc<Bags>, id: String, rounds: usize) -> Micros {
    let mut latest = Micros::ZERO;
    let mut done = 0;
    let mut i = id.len();
    while done < rounds {
        i += 1;
        let mut names = vec![MIGRATION_NAMES[i % 8], MIGRATION_NAMES[(i * 3 + 1) % 8]];
        names.sort_unstable();
        names.dedup();
        let lease = match cluster
            .acquire(names)
            .ttl(Duration::from_secs(2))
            .wait(Duration::from_millis(500))
            .send()
            .await
        {
            Ok(l) => l,
            Err(e) if e.is_retryable() => continue,
            Err(e) => panic!("{id}: {e}"),
        };
        latest = latest.max(lease.deadline());
        bags.write(&lease, &format!("{id}-{done}"), 3).await;
        lease.release(None).await.unwrap();
        done += 1;
    }
    latest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_from_two_servers_to_three_with_clients_at_every_step_audits_clean() {
    // Fixed member identities: names are routed by them, not by the
    // servers' random ports, so which names move is the same every run
    // (by URL, none of the 8 moved in about one run in 25: (2/3)^8).
    let servers = futures::future::join_all((0..3).map(|i| async move {
        ServerProcess::start_ready(&["--max-ttl", "2s", "--server-id", &format!("member-{i}")]).await
    }))
    .await;
    let member = |i: usize| ServerSpec {
        id: Some(format!("member-{i}")),
        ..spec(&servers[i])
    };
    let current = vec![member(0), member(1)];
    let next = vec![member(0), member(1), member(2)];
    let step1 = Cluster::connect(&current).await.unwrap();
    let step2 = Cluster::migrating(&current, &next).await.unwrap();
    let step3 = Cluster::connect(&next).await.unwrap();
    let moving = MIGRATION_NAMES
        .iter()
        .filter(|n| step2.route(n).next.as_ref().map(|r| &r.0) == Some(&servers[2].url))
        .count();
    let bags = Bags::new(servers[0].client().await).await;
    let spawn = |c: &Cluster, id: &str, rounds| {
        tokio::spawn(worker(c.clone(), Arc::clone(&bags), id.to_owned(), rounds))
    };

    // Steps 1 and 2 side by side: some clients moved on, some not yet.
    let s1 = [spawn(&step1, "s1a", 12), spawn(&step1, "s1b", 12)];
    let s2a = spawn(&step2, "s2a", 12);
    let mut step1_latest = Micros::ZERO;
    for t in s1 {
        step1_latest = step1_latest.max(t.await.unwrap());
    }
    // Every client is on step 2 now. The recipe's wait: every lease taken
    // under step 1 has ended (its deadline passed) before step 3 starts.
    let wait = step1_latest.duration_since(SystemClock.now());
    tokio::time::sleep(wait).await;
    assert!(
        SystemClock.now() >= step1_latest,
        "every step-1 deadline has passed"
    );
    // Steps 2 and 3 side by side.
    let s2b = spawn(&step2, "s2b", 12);
    let s3 = [spawn(&step3, "s3a", 12), spawn(&step3, "s3b", 12)];
    s2a.await.unwrap();
    s2b.await.unwrap();
    for t in s3 {
        t.await.unwrap();
    }

    let (read, report) = bags.audit(&step3.keys()).await;
    assert_eq!(
        read,
        bags.acked.load(Ordering::SeqCst),
        "every acknowledged message is read back"
    );
    assert_eq!(read, 6 * 12 * 3);
    assert!(report.is_clean(), "{:?}", report.violations);
    assert!(moving > 0, "some names move to the new server");
    assert!(report.leases > 6 * 12, "leases over two servers count each part");
}

#[tokio::test]
async fn a_step_1_and_a_step_2_client_never_share_a_name_and_skipping_the_wait_is_caught() {
    let servers = start_ready(3, &[]).await;
    let current = specs(&[&servers[0], &servers[1]]);
    let next = specs(&[&servers[0], &servers[1], &servers[2]]);
    let step1 = Cluster::connect(&current).await.unwrap();
    let step2 = Cluster::migrating(&current, &next).await.unwrap();
    let step3 = Cluster::connect(&next).await.unwrap();
    // Names that move: their next owner is the new server.
    let moving: Vec<String> = (0..)
        .map(|i| format!("mv-{i}"))
        .filter(|n| step2.route(n).next.map(|r| r.0) == Some(servers[2].url.clone()))
        .take(2)
        .collect();
    let (n, m) = (&moving[0], &moving[1]);

    // Step 1 holds n: a step-2 client is refused by n's current owner.
    let one = step1
        .acquire([n.clone()])
        .ttl(Duration::from_secs(10))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    let err = step2.acquire([n.clone()]).send().await.unwrap_err();
    let current_owner = step1.route(n).current.0;
    assert!(
        matches!(&err, Error::Busy { conflict: Some(c), .. } if c.server.as_deref() == Some(current_owner.as_str())),
        "{err:?}"
    );
    // Step 2 holds m: a step-1 client is refused by m's current owner, a
    // step-3 client by m's next owner.
    let two = step2
        .acquire([m.clone()])
        .ttl(Duration::from_secs(10))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    assert_eq!(two.witnesses().len(), 2, "a moving name needs both owners");
    assert!(matches!(
        step1.acquire([m.clone()]).send().await,
        Err(Error::Busy { .. })
    ));
    assert!(matches!(
        step3.acquire([m.clone()]).send().await,
        Err(Error::Busy { .. })
    ));

    // Skipping the wait: a step-3 client asks only n's next owner, which
    // never heard of the step-1 holder. Both hold n at once...
    let three = step3
        .acquire([n.clone()])
        .ttl(Duration::from_secs(10))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    assert!(
        one.is_valid() && three.is_valid(),
        "two holders of {n}: what the wait prevents"
    );
    // ...and the audit of what they wrote says so.
    let bags = Bags::new(servers[0].client().await).await;
    bags.write(&one, "step1", 1).await;
    bags.write(&three, "step3", 1).await;
    let (_, report) = bags.audit(&step2.keys()).await;
    let kinds: Vec<ViolationKind> = report.violations.iter().map(|v| v.kind).collect();
    assert_eq!(
        kinds,
        [ViolationKind::OverlappingGrants],
        "{:?}",
        report.violations
    );
}

/// Three servers, a name owned by each, and `bagel acquire --json` of
/// all three names: a lease over every server.
async fn cli_lease_over_three() -> (Vec<ServerProcess>, Vec<String>, serde_json::Value) {
    let servers = start_ready(3, &[]).await;
    let refs: Vec<&ServerProcess> = servers.iter().collect();
    let cluster = Cluster::connect(&specs(&refs)).await.unwrap();
    let names: Vec<String> = names_on(&cluster, &refs, 1).concat();
    let mut args = vec!["acquire", "--ttl", "10s", "--json"];
    args.extend(names.iter().map(String::as_str));
    let lease = json(&cli_servers(&refs, &args));
    (servers, names, lease)
}

fn json(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", describe_output(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe_output(out)))
}

#[tokio::test]
async fn the_cli_takes_writes_audits_and_releases_a_lease_over_three_servers() {
    let (servers, names, lease) = cli_lease_over_three().await;
    let refs: Vec<&ServerProcess> = servers.iter().collect();

    // Today's contract, plus `servers` and `witnesses`.
    for key in [
        "lease_id",
        "token",
        "deadline_us",
        "min_timestamp_us",
        "mode",
        "names",
        "witness",
    ] {
        assert!(lease.get(key).is_some(), "missing {key}: {lease}");
    }
    let witnesses = lease["witnesses"].as_array().unwrap();
    assert_eq!(witnesses.len(), 3);
    assert_eq!(lease["witness"], witnesses[0]);
    let by_name: BTreeMap<&str, &str> = lease["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap(), s["server"].as_str().unwrap()))
        .collect();
    assert_eq!(by_name.len(), 3);
    let mut route_args = vec!["route", "--json"];
    route_args.extend(names.iter().map(String::as_str));
    for r in json(&cli_servers(&refs, &route_args)).as_array().unwrap() {
        assert_eq!(
            by_name[r["name"].as_str().unwrap()],
            r["server"].as_str().unwrap()
        );
    }
    // describe asks each name's owner.
    let mut describe = vec!["describe", "--json"];
    describe.extend(names.iter().map(String::as_str));
    for s in json(&cli_servers(&refs, &describe)).as_array().unwrap() {
        assert!(s["holder"].is_object(), "{s}");
    }

    // Write under it, audit with every server's key, release.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lease.json");
    std::fs::write(&file, lease.to_string()).unwrap();
    // A store's root must exist (bagel creates only the logs inside).
    std::fs::create_dir(dir.path().join("bags")).unwrap();
    let store = format!("file://{}", dir.path().join("bags").display());
    let file = file.display().to_string();
    let log = unique("cli-cluster");
    let out = cli_servers(
        &refs,
        &[
            "write", "--store", &store, "--log", &log, "--lease", &file, "--grace", "200ms", "one", "two",
        ],
    );
    assert!(out.status.success(), "{}", describe_output(&out));
    let released = json(&cli_servers(&refs, &["release", "--lease", &file, "--json"]));
    assert!(released["watermark_us"].as_u64().unwrap() > 0);
    // Close the bags written (the writer is done), so the audit reads them.
    let cfg = BagConfig::default().with_grace(Duration::from_millis(200));
    let bags = bag::open_store(&store, &cfg).await.unwrap();
    let until = Micros::now().saturating_add(Duration::from_secs(1));
    bag::close_through(bags.as_ref(), &log, until, &cfg, &AssumedExact(SystemClock))
        .await
        .unwrap();
    let audit = cli_servers(
        &refs,
        &[
            "audit", "--store", &store, "--log", &log, "--grace", "200ms", "--json",
        ],
    );
    let report = json(&audit);
    assert_eq!(report["messages"], 2);
    assert_eq!(report["violations"].as_array().unwrap().len(), 0, "{report}");
}

#[tokio::test]
async fn one_url_in_servers_is_exactly_one_server() {
    let server = ServerProcess::start_ready(&[]).await;
    let via_servers = json(&cli_servers(&[&server], &["acquire", "solo-a", "--json"]));
    let via_server = json(&server.cli(&["acquire", "solo-b", "--json"]));
    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&via_servers), keys(&via_server));
    assert_eq!(via_servers["server"], server.url.as_str());
    assert!(via_servers.get("servers").is_none() && via_servers.get("witnesses").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_restarted_with_a_new_key_moves_no_name() {
    let args = ["--max-ttl", "1500ms", "--clock-tolerance", "100ms"];
    let keys = tempfile::tempdir().unwrap();
    let key_file = keys.path().join("k").display().to_string();
    let mut keyed_args = vec!["--key", key_file.as_str()];
    keyed_args.extend(args);
    let keyed = ServerProcess::start_ready(&keyed_args).await;
    let mut keyless = ServerProcess::start_ready(&args).await;
    let list = specs(&[&keyed, &keyless]);
    let first = Cluster::connect(&list).await.unwrap();
    let names: Vec<String> = (0..18).map(|i| format!("held-{i}")).collect();
    let mut held = Vec::new();
    for n in &names {
        held.push(first.acquire([n.clone()]).send().await.unwrap());
    }
    let on_keyed: Vec<&String> = names
        .iter()
        .filter(|n| first.route(n).current.0 == keyed.url)
        .collect();
    assert!(
        !on_keyed.is_empty() && on_keyed.len() < names.len(),
        "names on both servers"
    );

    // The keyless member restarts at its address with a new key, and
    // waits out its max TTL: every lease it granted has ended.
    let addr = keyless.addr.to_string();
    let old_key = keyless.public_key_hex.clone();
    keyless.kill();
    let keyless = ServerProcess::start_at(&addr, &args).await;
    assert_ne!(keyless.public_key_hex, old_key, "a new key");
    keyless.wait_ready().await;

    // A client started now routes every name as the first one does, so
    // it gets none of the names the first still holds on the keyed
    // member.
    let second = Cluster::connect(&list).await.unwrap();
    for (n, lease) in names.iter().zip(&held) {
        assert_eq!(second.route(n).current.0, first.route(n).current.0, "{n}");
        match second.acquire([n.clone()]).options(no_renew()).send().await {
            Ok(l) => {
                assert!(
                    !lease.is_valid(),
                    "{n} granted to a second client while the first holds it"
                );
                assert_eq!(second.route(n).current.0, keyless.url, "{n}");
                l.release(None).await.unwrap();
            }
            Err(Error::Busy { .. }) => assert!(on_keyed.contains(&n), "{n}"),
            Err(e) => panic!("{n}: {e}"),
        }
    }
}

/// A client that learned a member's key (trust on first use) keeps working
/// when the member restarts without its key file: the first witness under
/// the new key makes it learn the member's keys again, on every path (the
/// cluster, a unary client, a session). A client that pinned the old key
/// refuses the new one.
#[tokio::test]
async fn a_long_running_client_learns_the_new_key_of_a_member_restarted_without_one() {
    let args = ["--max-ttl", "1500ms", "--clock-tolerance", "100ms"];
    let mut keyless = ServerProcess::start_ready(&args).await;
    let other = ServerProcess::start_ready(&args).await;
    let list = specs(&[&keyless, &other]);
    let cluster = Cluster::connect(&list).await.unwrap();
    let unary = Client::connect(keyless.url.clone()).await.unwrap();
    let session = Coalescer::new(
        unary.clone(),
        CoalesceOptions::default().with_transport(Transport::Session),
    );
    let pinned_ring = KeyRing::clone(&unary.keys());
    let pinned = Client::connect_pinned(keyless.url.clone(), pinned_ring)
        .await
        .unwrap();
    let name = (0..)
        .map(|i| format!("relearn-{i}"))
        .find(|n| cluster.route(n).current.0 == keyless.url)
        .unwrap();
    let one = |lease: Lease| async move { lease.release(None).await.unwrap() };
    one(cluster
        .acquire([name.clone()])
        .options(no_renew())
        .send()
        .await
        .unwrap())
    .await;
    let via_session = || unary.acquire([name.clone()]).options(no_renew()).via(&session);
    one(via_session().send().await.unwrap()).await;

    let addr = keyless.addr.to_string();
    let old_key = keyless.public_key_hex.clone();
    keyless.kill();
    let keyless = ServerProcess::start_at(&addr, &args).await;
    assert_ne!(keyless.public_key_hex, old_key, "a new key");
    keyless.wait_ready().await;

    // Each witness verifies against the key the restarted member prints.
    let mut new_key = KeyRing::new();
    new_key
        .insert_bytes(&bagel_proto::hex::decode_array::<32>(&keyless.public_key_hex).unwrap())
        .unwrap();
    for path in ["cluster", "unary client", "session"] {
        let got = match path {
            "cluster" => cluster.acquire([name.clone()]).options(no_renew()).send().await,
            "unary client" => unary.acquire([name.clone()]).options(no_renew()).send().await,
            _ => via_session().send().await,
        };
        let lease = got.unwrap_or_else(|e| panic!("{path}: {e}"));
        verify_witness(&wire(&lease.witness()), &new_key).unwrap_or_else(|e| panic!("{path}: {e}"));
        lease.release(None).await.unwrap();
    }
    match pinned.acquire([name.clone()]).options(no_renew()).send().await {
        Err(Error::Witness { reason }) => assert!(reason.contains("key"), "{reason}"),
        other => panic!("a pinned client trusted a key it was not given: {other:?}"),
    }
}

#[tokio::test]
async fn what_a_broken_step_1_holder_left_unsettled_reaches_step_3() {
    let servers = start_ready(3, &[]).await;
    let current = specs(&[&servers[0], &servers[1]]);
    let next = specs(&[&servers[0], &servers[1], &servers[2]]);
    let step1 = Cluster::connect(&current).await.unwrap();
    let step2 = Cluster::migrating(&current, &next).await.unwrap();
    let step3 = Cluster::connect(&next).await.unwrap();
    let n = (0..)
        .map(|i| format!("mv-{i}"))
        .find(|n| step2.route(n).next.map(|r| r.0) == Some(servers[2].url.clone()))
        .unwrap();

    // Step 1 holds n and breaks (never released).
    let one = step1
        .acquire([n.clone()])
        .ttl(Duration::from_secs(1))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    let broken_deadline = one.deadline();
    drop(one);
    // Step 2 waits for it on n's current owner, which says it broke.
    let two = step2
        .acquire([n.clone()])
        .wait(Duration::from_secs(5))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    let unsettled = Micros::from_micros(broken_deadline.as_micros() + 1);
    assert_eq!(two.close_before_reading(), Some(unsettled));
    assert!(two.min_timestamp() >= broken_deadline);
    // It releases without closing the step-1 holder's bags.
    two.release(None).await.unwrap();

    // Step 3 asks n's next owner only, which never saw step 1.
    let three = step3
        .acquire([n.clone()])
        .options(no_renew())
        .send()
        .await
        .unwrap();
    assert!(
        three.close_before_reading() >= Some(unsettled),
        "step 3 must close through the broken step-1 deadline: {:?}",
        three.names()
    );
    assert!(
        three.min_timestamp() >= broken_deadline,
        "step 3 writes above the broken step-1 holder's deadline: {} < {broken_deadline}",
        three.min_timestamp()
    );
}

#[tokio::test]
async fn verify_witness_checks_every_witness_of_a_lease_over_several_servers() {
    let (servers, _, lease) = cli_lease_over_three().await;
    let refs: Vec<&ServerProcess> = servers.iter().collect();
    let dir = tempfile::tempdir().unwrap();
    let verify = |v: &serde_json::Value| {
        let file = dir.path().join("lease.json");
        std::fs::write(&file, v.to_string()).unwrap();
        cli_servers(&refs, &["verify-witness", file.to_str().unwrap()])
    };

    let ok = verify(&lease);
    assert!(ok.status.success(), "{}", describe_output(&ok));
    let said = String::from_utf8_lossy(&ok.stdout);
    assert_eq!(said.matches("witness OK").count(), 3, "{said}");

    // The second witness's body altered (its signature no longer covers it).
    let mut forged = lease.clone();
    let body = forged["witnesses"][1]["body_b64"].as_str().unwrap().to_owned();
    let flipped = if body.starts_with('A') { "B" } else { "A" };
    forged["witnesses"][1]["body_b64"] = serde_json::Value::String(format!("{flipped}{}", &body[1..]));
    let bad = verify(&forged);
    assert_eq!(bad.status.code(), Some(1), "{}", describe_output(&bad));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("witness 1"),
        "{}",
        describe_output(&bad)
    );

    // The second witness replaced by the first (valid, but another
    // server's part): the second server's part has no witness.
    let mut swapped = lease.clone();
    swapped["witnesses"][1] = swapped["witnesses"][0].clone();
    let bad = verify(&swapped);
    assert_eq!(bad.status.code(), Some(1), "{}", describe_output(&bad));
    let second = lease["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["lease_id"].as_str().unwrap())
        .find(|id| *id != lease["servers"][0]["lease_id"].as_str().unwrap())
        .unwrap()
        .to_owned();
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains(&second),
        "{}",
        describe_output(&bad)
    );
}
