//! Failover after a wait: a standby that waited for a busy name holds it,
//! once granted, for the whole TTL the grant's own signed times state,
//! however long it waited — on one server, on a cluster of three, and on
//! the S3 lease store — and `bagel run --wait forever` as a standby runs
//! its command without being fenced after it takes over.
//!
//! The lease's local validity is counted from the send of the request
//! that was answered; for a waited request that send is long before the
//! grant, so a standby that waited half a TTL used to count half a TTL
//! left and be fenced a second after taking over (and on S3 the grant's
//! deadline itself was fixed when the wait began).
//!
//! How long the previous holder holds is the scenario (a sleep of the
//! holder, not a synchronisation); every wait on the standby is for an
//! event.

use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bagel_client::{Lease, LeaseBackend, LeaseOptions};
use bagel_tests::{LeaseEnv, ServerProcess, describe_output};

/// The TTL of every lease here.
const TTL: Duration = Duration::from_secs(4);

/// How the previous holder lets go.
#[derive(Clone, Copy, Debug)]
enum Ends {
    /// It renews through the wait, then releases.
    Releases,
    /// It stops renewing at once; the lease runs to its deadline.
    Expires,
}

/// A holder takes `leader`, a standby asks for it with a long wait, the
/// holder lets go after `hold`: the standby's lease, once granted, is
/// valid and counts (nearly) the whole TTL left, not the TTL less the
/// wait.
async fn standby_takes_over(env: LeaseEnv, hold: Duration, ends: Ends) {
    let backend = env.backend();
    let options = match ends {
        Ends::Releases => LeaseOptions::default(),
        Ends::Expires => LeaseOptions::default().with_auto_renew(false),
    };
    let holder = env
        .acquire(["leader"])
        .ttl(match ends {
            Ends::Releases => TTL,
            // Expires after `hold`.
            Ends::Expires => hold.max(Duration::from_secs(1)),
        })
        .options(options)
        .send()
        .await
        .expect("the holder's grant");
    let standby = tokio::spawn(standby(Arc::clone(&backend)));
    tokio::time::sleep(hold).await;
    match ends {
        Ends::Releases => {
            holder.release(None).await.expect("release");
        }
        Ends::Expires => drop(holder),
    }
    let lease = tokio::time::timeout(env.takeover_wait() + hold + TTL, standby)
        .await
        .expect("the standby was granted the name in time")
        .expect("the standby's task");
    assert!(
        lease.is_valid(),
        "the standby's lease is not valid once granted: {:?}",
        lease.state()
    );
    // The grant states TTL; what the standby counts is that, less the
    // round trip of the renewal that re-counts it (a few ms). Before the
    // fix it was TTL less the whole wait.
    let left = lease.time_left();
    assert!(
        left > TTL / 2,
        "after waiting {hold:?} ({ends:?}) the standby counts only {left:?} of its {TTL:?} lease"
    );
    lease.release(None).await.expect("the standby's release");
}

async fn standby(backend: Arc<dyn LeaseBackend>) -> Lease {
    bagel_client::AcquireBuilder::new(backend, ["leader"])
        .ttl(TTL)
        .wait_forever()
        .send()
        .await
        .expect("the standby's grant")
}

macro_rules! family {
    ($($name:ident: $env:ident, $hold:expr, $ends:ident;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                standby_takes_over(LeaseEnv::$env().await, $hold, Ends::$ends).await
            }
        )*
    };
}

family! {
    server_no_wait: server, Duration::ZERO, Releases;
    server_half_ttl_released: server, TTL / 2, Releases;
    server_twice_ttl_released: server, TTL * 2, Releases;
    server_ten_ttls_released: server, TTL * 10, Releases;
    server_half_ttl_expired: server, TTL / 2, Expires;
    cluster_half_ttl_released: cluster, TTL / 2, Releases;
    cluster_twice_ttl_released: cluster, TTL * 2, Releases;
    s3_half_ttl_released: s3, TTL / 2, Releases;
    s3_twice_ttl_released: s3, TTL * 2, Releases;
}

/// `bagel` against `server` with its own state directory.
fn bagel(server: &ServerProcess, state: &std::path::Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(bagel_tests::bin("bagel"));
    cmd.args(["--server", &server.url])
        .args(args)
        .env("BAGEL_STATE_DIR", state)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Waits (bounded) for `child` to end and returns its output.
fn finish(child: std::process::Child, bound: Duration) -> Output {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    rx.recv_timeout(bound)
        .expect("bagel run did not end in time")
        .expect("bagel run's output")
}

/// Waits (bounded) for `path` to exist.
fn await_file(path: &std::path::Path) {
    let started = std::time::Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How the leader's `bagel run` ends.
#[derive(Clone, Copy, Debug)]
enum LeaderEnds {
    /// Its command exits after a while: `bagel run` releases.
    CommandExits,
    /// `bagel run` itself is SIGKILLed: the lease expires at its deadline.
    Killed,
}

/// The README's standby: `bagel run --wait forever` waits while the leader
/// runs, then runs its own command, which lives longer than a renewal
/// period. Before the fix it was fenced (exit 3) about a second after it
/// took over.
fn bagel_run_standby_leads_after_its_wait(ends: LeaderEnds) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The server's default max wait (10 s) covers the standby's whole wait
    // in one request: the request answered was sent when the wait began.
    let server = rt.block_on(ServerProcess::start_ready(&[]));
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("leader-started");
    let ttl = "6s";
    let leader_script = format!("touch {}; sleep 3", started.display());
    let mut leader = bagel(
        &server,
        &dir.path().join("a"),
        &[
            "run",
            "--name",
            "leader",
            "--owner",
            "A",
            "--ttl",
            ttl,
            "--",
            "sh",
            "-c",
            &leader_script,
        ],
    )
    .spawn()
    .unwrap();
    await_file(&started);
    let standby = bagel(
        &server,
        &dir.path().join("b"),
        &[
            "run",
            "--name",
            "leader",
            "--owner",
            "B",
            "--ttl",
            ttl,
            "--wait",
            "forever",
            "--",
            "sh",
            "-c",
            // Longer than a renewal period (2 s) and than the fence
            // margins (3 s): it must be renewed to finish.
            "echo leading; sleep 5; echo done",
        ],
    )
    .spawn()
    .unwrap();
    // Killed once the standby is started: the lease then runs the rest of
    // its TTL out (most of 6 s) while the standby waits in one request.
    if let LeaderEnds::Killed = ends {
        leader.kill().unwrap();
    }
    let _ = leader.wait();
    let out = finish(standby, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "the standby did not lead to the end ({ends:?}): {}",
        describe_output(&out)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "leading\ndone\n",
        "{}",
        describe_output(&out)
    );
}

#[test]
fn bagel_run_standby_leads_after_the_leader_exits() {
    bagel_run_standby_leads_after_its_wait(LeaderEnds::CommandExits);
}

#[test]
fn bagel_run_standby_leads_after_the_leader_is_killed() {
    bagel_run_standby_leads_after_its_wait(LeaderEnds::Killed);
}

/// Asks `server` for `name` for `ttl` from a client whose clock is 3 s
/// ahead: the grant must be refused as `ClockOff`, the refusal saying
/// `why` and that the name was released, and the name must be free.
async fn given_back_by_a_client_3s_ahead(server: &ServerProcess, name: &str, ttl: Duration, why: &str) {
    let ahead: Arc<dyn bagel_proto::clock::Clock> = Arc::new(bagel_proto::clock::OffsetClock {
        inner: bagel_proto::clock::SystemClock,
        offset_us: 3_000_000,
    });
    let client = server.client().await.with_clock(ahead);
    let e = client
        .acquire([name])
        .ttl(ttl)
        .send()
        .await
        .expect_err("a grant this host cannot use");
    assert!(
        matches!(e, bagel_client::Error::ClockOff { .. })
            && e.to_string().contains(why)
            && e.to_string().contains("released"),
        "{e}"
    );
    let on_time = server.client().await;
    let states = on_time.describe([name]).await.unwrap();
    assert!(states[0].holder.is_none(), "still held: {:?}", states[0].holder);
}

/// A client whose clock is ahead of the server's by more than its TTL is
/// granted a lease it counts as over at once: it gives the name back and
/// says why, rather than hold it, useless, until the deadline (in the
/// fault run, a standby 2.5 s ahead kept its name leaderless for a TTL
/// after each grant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_this_hosts_clock_counts_as_over_is_given_back() {
    let server = ServerProcess::start_ready(&[]).await;
    given_back_by_a_client_3s_ahead(&server, "ahead", Duration::from_secs(2), "already passed").await;
}

/// A host whose clock is ahead of the server's by less than the TTL but
/// more than the safety margin gets a grant it counts as inside the margin
/// from the start: no writer would use it and `bagel run` would fence at
/// once. It is given back, and the refusal says by about how much the
/// clock is ahead; the same TTL from a host on time is a usable lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_this_hosts_clock_puts_inside_the_safety_margin_is_given_back() {
    let server = ServerProcess::start_ready(&[]).await;
    let ttl = Duration::from_millis(3_300);
    given_back_by_a_client_3s_ahead(&server, "nearly-over", ttl, "inside the safety margin").await;
    let on_time = server.client().await;
    let lease = on_time.acquire(["nearly-over"]).ttl(ttl).send().await.unwrap();
    assert!(lease.is_valid());
}
