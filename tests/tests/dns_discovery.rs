//! Members found by DNS (issue 54): a `dns+srv://NAME` server list against
//! a real dnsmasq on 127.0.0.1 whose records each test rewrites, and real
//! `bagel-server` processes started with `--members`. Each case checks the
//! routing safety property directly: two clients that looked DNS up at
//! different moments, or under different answers, never both hold a name.
//!
//! dnsmasq reads `srv-host`/`txt-record` lines only at start, so a change
//! of records is a restart on the same port (what a client sees is what a
//! changed zone looks like).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bagel_client::{AcquireBuilder, ClientOptions, DnsCluster, Error, Lease, LeaseOptions};
use bagel_tests::{ServerProcess, describe_output};

const SRV: &str = "_bagel._tcp.bagel.test";

fn list() -> String {
    format!("dns+srv://{SRV}")
}

/// One member's records: an SRV record at [`SRV`] whose target is
/// `<id>.bagel.test`, an A record for it, and (when `key` is given) a TXT
/// `bagel-key=` pinning its key.
#[derive(Clone, Debug)]
struct Record {
    id: String,
    port: u16,
    key: Option<String>,
}

/// A dnsmasq answering only for `bagel.test`, on a port of its own.
struct Dns {
    child: Option<Child>,
    port: u16,
    conf: PathBuf,
    _dir: tempfile::TempDir,
}

/// Where dnsmasq is (Debian puts it in /usr/sbin, often not on a test
/// runner's PATH). tests/run.sh installs it; a missing one fails loudly.
fn dnsmasq() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join("dnsmasq"))
        .find(|p| p.exists())
        .expect("dnsmasq not found: tests/run.sh installs it (apt-get install dnsmasq)")
}

/// A port for dnsmasq, which binds it for UDP and TCP and is restarted on
/// it whenever the records change: one below the kernel's ephemeral range
/// (from 32768 by default, read from `ip_local_port_range`), so that no
/// server another test binds to port 0 can take it between a restart's
/// kill and its bind (that race failed a run: "Address already in use"),
/// and free for both protocols when chosen.
fn quiet_port() -> u16 {
    let ephemeral_from: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let from = ephemeral_from.saturating_sub(12_000).max(1024);
    for _ in 0..1000 {
        let port = rand::Rng::gen_range(&mut rand::thread_rng(), from..ephemeral_from);
        let udp = std::net::UdpSocket::bind(("127.0.0.1", port));
        let tcp = std::net::TcpListener::bind(("127.0.0.1", port));
        if udp.is_ok() && tcp.is_ok() {
            return port;
        }
    }
    panic!("no free port below {ephemeral_from} for dnsmasq");
}

impl Dns {
    async fn start(records: &[Record]) -> Dns {
        let port = quiet_port();
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("dnsmasq.conf");
        let mut dns = Dns {
            child: None,
            port,
            conf,
            _dir: dir,
        };
        dns.set(records).await;
        dns
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Client options that ask this resolver.
    fn options(&self) -> ClientOptions {
        ClientOptions::default().with_dns_server(self.addr())
    }

    /// Publishes `records` (and nothing else): rewrites the configuration
    /// and restarts dnsmasq on the same port, returning once it answers.
    async fn set(&mut self, records: &[Record]) {
        let mut conf = format!(
            "port={}\nlisten-address=127.0.0.1\nbind-interfaces\nno-resolv\nno-hosts\n\
             local=/bagel.test/\nlocal-ttl=0\n",
            self.port
        );
        for r in records {
            let host = format!("{}.bagel.test", r.id);
            conf += &format!("srv-host={SRV},{host},{}\nhost-record={host},127.0.0.1\n", r.port);
            if let Some(key) = &r.key {
                conf += &format!("txt-record={host},\"bagel-key={key}\"\n");
            }
        }
        std::fs::write(&self.conf, conf).unwrap();
        self.stop();
        let mut child = Command::new(dnsmasq())
            .arg("--keep-in-foreground")
            .arg(format!("--conf-file={}", self.conf.display()))
            .args(["--log-facility=-", "--pid-file="])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dnsmasq");
        let stderr = child.stderr.take().unwrap();
        // dnsmasq logs "started" once its sockets are bound.
        let started = tokio::task::spawn_blocking(move || {
            use std::io::BufRead as _;
            let mut lines = std::io::BufReader::new(stderr).lines();
            let mut seen = Vec::new();
            for line in lines.by_ref() {
                let line = line.unwrap_or_default();
                if line.contains("started, version") {
                    std::thread::spawn(move || for _ in lines {});
                    return Ok(());
                }
                seen.push(line);
            }
            Err(seen.join("\n"))
        })
        .await
        .unwrap();
        if let Err(log) = started {
            panic!("dnsmasq did not start:\n{log}");
        }
        self.child = Some(child);
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A member: a server with a key file (its key survives a restart, as on
/// a StatefulSet volume) at a fixed address, restarted with new lists as
/// an operator rolls them out.
struct Member {
    id: String,
    key_file: PathBuf,
    server: ServerProcess,
}

impl Member {
    async fn start(dir: &std::path::Path, id: &str, lists: &[&str]) -> Member {
        let key_file = dir.join(format!("{id}.key"));
        let server = Member::run("127.0.0.1:0", id, &key_file, lists).await;
        Member {
            id: id.to_owned(),
            key_file,
            server,
        }
    }

    /// `lists`: the flags after the ID, e.g. `["--members", "a,b"]`.
    async fn run(listen: &str, id: &str, key_file: &std::path::Path, lists: &[&str]) -> ServerProcess {
        let key = key_file.to_str().unwrap();
        let mut args = vec!["--unsafe-skip-restart-wait", "--server-id", id, "--key", key];
        args.extend_from_slice(lists);
        let server = ServerProcess::start_at(listen, &args).await;
        server.wait_ready().await;
        server
    }

    /// Restarts it at its address with other lists.
    async fn restart(&mut self, lists: &[&str]) {
        let at = self.server.addr.to_string();
        self.server.kill();
        self.server = Member::run(&at, &self.id, &self.key_file, lists).await;
    }

    fn record(&self, pinned: bool) -> Record {
        Record {
            id: self.id.clone(),
            port: self.server.addr.port(),
            key: pinned.then(|| self.server.public_key_hex.clone()),
        }
    }
}

fn names() -> Vec<String> {
    (0..24).map(|i| format!("dns-name-{i}")).collect()
}

/// Takes `name` for 10 s, without renewal, without waiting.
async fn take(acquire: AcquireBuilder) -> Result<Lease, Error> {
    let options = LeaseOptions::default().with_auto_renew(false);
    acquire.ttl(Duration::from_secs(10)).options(options).send().await
}

/// `first` takes every name, then `second` tries each while `first` holds
/// it: the names both got (must be none), and how many `first` got. All
/// of `first`'s leases are released after.
async fn held_twice(first: &DnsCluster, second: &DnsCluster) -> (Vec<String>, usize) {
    let mut held = Vec::new();
    for name in names() {
        if let Ok(lease) = take(first.acquire([name.clone()])).await {
            held.push((name, lease));
        }
    }
    let mut twice = Vec::new();
    for (name, _) in &held {
        match take(second.acquire([name.clone()])).await {
            Ok(lease) => {
                twice.push(name.clone());
                lease.release(None).await.unwrap();
            }
            Err(e) => assert!(
                matches!(e, Error::Busy { .. } | Error::Config { .. }),
                "{name}: {e:?}"
            ),
        }
    }
    let got = held.len();
    for (_, lease) in held {
        lease.release(None).await.unwrap();
    }
    (twice, got)
}

/// Both ways round: neither client takes a name the other holds.
async fn assert_never_twice(a: &DnsCluster, b: &DnsCluster) {
    let (twice, got) = held_twice(a, b).await;
    assert!(twice.is_empty(), "held twice: {twice:?}");
    assert_eq!(got, names().len(), "the first client got every name");
    let (twice, got) = held_twice(b, a).await;
    assert!(twice.is_empty(), "held twice: {twice:?}");
    assert_eq!(got, names().len(), "the first client got every name");
}

fn lists(dns: &DnsCluster) -> Vec<Vec<String>> {
    dns.lists()
}

fn ids(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test]
async fn two_members_found_in_dns_grant_leases_to_the_library_and_the_cli_alike() {
    let dir = tempfile::tempdir().unwrap();
    let members = ["--members", "bagel-0,bagel-1"];
    let (b0, b1) = tokio::join!(
        Member::start(dir.path(), "bagel-0", &members),
        Member::start(dir.path(), "bagel-1", &members)
    );
    // bagel-0's key pinned by TXT, bagel-1's learned at first contact.
    let dns = Dns::start(&[b0.record(true), b1.record(false)]).await;
    let a = DnsCluster::open(&list(), &dns.options()).await.unwrap();
    let b = DnsCluster::open(&list(), &dns.options()).await.unwrap();
    assert_eq!(lists(&a), [ids(&["bagel-0", "bagel-1"])]);
    assert_never_twice(&a, &b).await;
    // Looked up again with nothing changed: the routing stays as it was.
    assert!(!a.refresh().await.unwrap());

    // The CLI takes the same list, its resolver from BAGEL_DNS_SERVER.
    let out = Command::new(bagel_tests::bin("bagel"))
        .args([
            "--servers",
            &list(),
            "acquire",
            "cli-held",
            "--ttl",
            "10s",
            "--json",
        ])
        .env("BAGEL_DNS_SERVER", dns.addr().to_string())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe_output(&out));
    let e = take(a.acquire(["cli-held"])).await.unwrap_err();
    assert!(matches!(e, Error::Busy { .. }), "{e:?}");
    // A second list beside it is refused: the members announce theirs.
    let out = Command::new(bagel_tests::bin("bagel"))
        .args([
            "--servers",
            &list(),
            "--next-servers",
            "bagel-0=http://127.0.0.1:1",
        ])
        .args(["acquire", "cli-other", "--json"])
        .env("BAGEL_DNS_SERVER", dns.addr().to_string())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", describe_output(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--next-servers is not taken"),
        "{}",
        describe_output(&out)
    );
}

#[tokio::test]
async fn servers_without_members_are_refused_for_a_dns_list() {
    let dir = tempfile::tempdir().unwrap();
    let b0 = Member::start(dir.path(), "bagel-0", &[]).await;
    let dns = Dns::start(&[b0.record(false)]).await;
    let e = DnsCluster::open(&list(), &dns.options()).await.unwrap_err();
    assert!(e.to_string().contains("--members"), "{e}");
    assert!(!e.is_retryable(), "{e:?}");
}

/// Scaling out from two members to three, as the operator's steps do it:
/// the third member's record alone moves nothing; the client follows only
/// what the members announce, first both lists (a migration), then the
/// new one. At every step a client that looked up before the step and one
/// that looked up after never both hold a name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_out_is_a_migration_that_the_members_announce() {
    let dir = tempfile::tempdir().unwrap();
    let two = ["--members", "bagel-0,bagel-1"];
    let (mut b0, mut b1) = tokio::join!(
        Member::start(dir.path(), "bagel-0", &two),
        Member::start(dir.path(), "bagel-1", &two)
    );
    let mut dns = Dns::start(&[b0.record(true), b1.record(true)]).await;
    let before = DnsCluster::open(&list(), &dns.options()).await.unwrap();
    assert_eq!(lists(&before), [ids(&["bagel-0", "bagel-1"])]);

    // Step 1: bagel-2 starts knowing the next list, and gets its record;
    // bagel-0 and bagel-1 do not announce it yet. A client looking up now
    // is refused (the members disagree), and one that looked up before
    // keeps its routing.
    let migrating = [
        "--members",
        "bagel-0,bagel-1",
        "--next-members",
        "bagel-0,bagel-1,bagel-2",
    ];
    let mut b2 = Member::start(dir.path(), "bagel-2", &migrating).await;
    dns.set(&[b0.record(true), b1.record(true), b2.record(true)])
        .await;
    let e = DnsCluster::open(&list(), &dns.options()).await.unwrap_err();
    assert!(e.to_string().contains("disagree"), "{e}");
    assert!(before.refresh().await.is_err());
    assert_eq!(lists(&before), [ids(&["bagel-0", "bagel-1"])]);

    // Step 2: bagel-0 and bagel-1 roll to both lists. A client looking up
    // now routes by both; the one that looked up before (not refreshed:
    // a stale view) still by the old list. They share each name's owner
    // in the old list, so never hold a name twice.
    b0.restart(&migrating).await;
    b1.restart(&migrating).await;
    let after = DnsCluster::open(&list(), &dns.options()).await.unwrap();
    let both = [
        ids(&["bagel-0", "bagel-1"]),
        ids(&["bagel-0", "bagel-1", "bagel-2"]),
    ];
    assert_eq!(lists(&after), both);
    assert_never_twice(&before, &after).await;
    assert!(before.refresh().await.unwrap());
    assert_eq!(lists(&before), both);

    // Step 3 (after the max TTL and a refresh interval): every member on
    // the new list alone. A client looking up now routes by it; one still
    // on both lists shares each name's new owner.
    let three = ["--members", "bagel-0,bagel-1,bagel-2"];
    b0.restart(&three).await;
    b1.restart(&three).await;
    b2.restart(&three).await;
    let last = DnsCluster::open(&list(), &dns.options()).await.unwrap();
    assert_eq!(lists(&last), [ids(&["bagel-0", "bagel-1", "bagel-2"])]);
    let (twice, _) = held_twice(&last, &after).await;
    assert!(twice.is_empty(), "held twice: {twice:?}");
    assert!(after.refresh().await.unwrap());
    assert_never_twice(&after, &last).await;
}

/// Scaling in from three members to two, as deploy/README.md's steps do
/// it: every member announces the shorter list as the next one (a
/// migration, rolled one member at a time: while they disagree a client
/// looking up is refused); then, after the max TTL, bagel-0 and bagel-1
/// take the new list alone, bagel-2 stops and its record goes. At every
/// step a client that looked up before and one that looked up after
/// never both hold a name, the stale one included: it cannot get
/// bagel-2's old names at all (their old owner is gone), and shares every
/// other name's owner with the new list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_in_is_a_migration_that_the_members_announce() {
    let dir = tempfile::tempdir().unwrap();
    let three = ["--members", "bagel-0,bagel-1,bagel-2"];
    let (mut b0, mut b1, mut b2) = tokio::join!(
        Member::start(dir.path(), "bagel-0", &three),
        Member::start(dir.path(), "bagel-1", &three),
        Member::start(dir.path(), "bagel-2", &three)
    );
    let mut dns = Dns::start(&[b0.record(true), b1.record(true), b2.record(true)]).await;
    let before = DnsCluster::open(&list(), &dns.options()).await.unwrap();
    assert_eq!(lists(&before), [ids(&["bagel-0", "bagel-1", "bagel-2"])]);

    // Step 1: the next list, one member at a time.
    let migrating = [
        "--members",
        "bagel-0,bagel-1,bagel-2",
        "--next-members",
        "bagel-0,bagel-1",
    ];
    b0.restart(&migrating).await;
    let e = DnsCluster::open(&list(), &dns.options()).await.unwrap_err();
    assert!(e.to_string().contains("disagree"), "{e}");
    b1.restart(&migrating).await;
    b2.restart(&migrating).await;
    let after = DnsCluster::open(&list(), &dns.options()).await.unwrap();
    let both = [
        ids(&["bagel-0", "bagel-1", "bagel-2"]),
        ids(&["bagel-0", "bagel-1"]),
    ];
    assert_eq!(lists(&after), both);
    assert_never_twice(&before, &after).await;
    assert!(before.refresh().await.unwrap());
    assert_eq!(lists(&before), both);

    // Step 2: bagel-0 and bagel-1 on the new list alone; bagel-2 leaves,
    // then its record.
    let two = ["--members", "bagel-0,bagel-1"];
    b0.restart(&two).await;
    b1.restart(&two).await;
    b2.server.kill();
    dns.set(&[b0.record(true), b1.record(true)]).await;
    let last = DnsCluster::open(&list(), &dns.options()).await.unwrap();
    assert_eq!(lists(&last), [ids(&["bagel-0", "bagel-1"])]);
    // The client still on both lists (not refreshed) while `last` holds
    // every name: it gets none of them.
    let mut held = Vec::new();
    for name in names() {
        held.push((name.clone(), take(last.acquire([name])).await.unwrap()));
    }
    for (name, _) in &held {
        match take(after.acquire([name.clone()])).await {
            Ok(_) => panic!("{name}: held twice"),
            Err(e) => assert!(
                matches!(
                    e,
                    Error::Busy { .. }
                        | Error::Config { .. }
                        | Error::Unavailable { .. }
                        | Error::Connect { .. }
                ),
                "{name}: {e:?}"
            ),
        }
    }
    for (_, lease) in held {
        lease.release(None).await.unwrap();
    }
    assert!(after.refresh().await.unwrap());
    assert_eq!(lists(&after), [ids(&["bagel-0", "bagel-1"])]);
    assert_never_twice(&after, &last).await;
}

/// A record that points at another member (bagel-1's name, bagel-0's
/// address): the member there announces its own ID, so the list is
/// refused, never routed by; a client that looked up before the bad
/// record keeps its routing, and no name is held twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_pointing_at_the_wrong_member_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let members = ["--members", "bagel-0,bagel-1"];
    let (b0, b1) = tokio::join!(
        Member::start(dir.path(), "bagel-0", &members),
        Member::start(dir.path(), "bagel-1", &members)
    );
    let mut dns = Dns::start(&[b0.record(false), b1.record(false)]).await;
    let right = DnsCluster::open(&list(), &dns.options()).await.unwrap();
    let other = DnsCluster::open(&list(), &dns.options()).await.unwrap();

    let wrong = Record {
        port: b0.server.addr.port(),
        ..b1.record(false)
    };
    dns.set(&[b0.record(false), wrong.clone()]).await;
    let e = DnsCluster::open(&list(), &dns.options()).await.unwrap_err();
    assert!(e.to_string().contains("announces server id \"bagel-0\""), "{e}");
    assert!(!e.is_retryable(), "{e:?}");
    assert!(right.refresh().await.is_err());
    assert_eq!(lists(&right), [ids(&["bagel-0", "bagel-1"])]);
    assert_never_twice(&right, &other).await;

    // Pinned to bagel-1's key but pointing at bagel-0: refused as well
    // (bagel-0 does not present that key).
    let pinned_wrong = Record {
        key: Some(b1.server.public_key_hex.clone()),
        ..wrong
    };
    dns.set(&[b0.record(false), pinned_wrong]).await;
    assert!(DnsCluster::open(&list(), &dns.options()).await.is_err());
}

/// A stale answer: DNS still names two members while the members already
/// announce a third in their next list. The client refuses to route
/// without the third member's record rather than route by the old list
/// alone; a client that looked up before and one after the record appears
/// never hold a name twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_answer_is_refused_not_routed_around() {
    let dir = tempfile::tempdir().unwrap();
    let two = ["--members", "bagel-0,bagel-1"];
    let (mut b0, mut b1) = tokio::join!(
        Member::start(dir.path(), "bagel-0", &two),
        Member::start(dir.path(), "bagel-1", &two)
    );
    let mut dns = Dns::start(&[b0.record(false), b1.record(false)]).await;
    let early = DnsCluster::open(&list(), &dns.options()).await.unwrap();

    let migrating = [
        "--members",
        "bagel-0,bagel-1",
        "--next-members",
        "bagel-0,bagel-1,bagel-2",
    ];
    b0.restart(&migrating).await;
    b1.restart(&migrating).await;
    let b2 = Member::start(dir.path(), "bagel-2", &migrating).await;
    // The answer is stale: no record for bagel-2 yet.
    let e = DnsCluster::open(&list(), &dns.options()).await.unwrap_err();
    assert!(e.to_string().contains("DNS has no record for it"), "{e}");
    assert!(e.is_retryable(), "{e:?}");
    assert!(early.refresh().await.is_err());
    assert_eq!(lists(&early), [ids(&["bagel-0", "bagel-1"])]);

    dns.set(&[b0.record(false), b1.record(false), b2.record(false)])
        .await;
    let late = DnsCluster::open(&list(), &dns.options()).await.unwrap();
    assert_eq!(
        lists(&late),
        [
            ids(&["bagel-0", "bagel-1"]),
            ids(&["bagel-0", "bagel-1", "bagel-2"])
        ]
    );
    // `early` still routes by the old list alone: it and `late` share
    // each name's old owner.
    assert_never_twice(&early, &late).await;
}
