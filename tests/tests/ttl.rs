//! TTLs over slow paths and skewed clocks (issue 24 item 3, issue 28
//! item 8), against the real server and CLI:
//!
//! * a TTL is sent relative (`ttl_us`) and counted from the grant, so a
//!   wait, a slow path or a client clock behind the server's takes nothing
//!   off it;
//! * an absolute deadline that comes back short is warned about, naming
//!   what was asked and what is left; one already past on the server's
//!   clock is refused naming the server's time and this host's;
//! * TTLs out of the server's range are refused in human units naming the
//!   server's `--max-ttl` / `--min-ttl`.

use std::process::Output;
use std::time::Duration;

use bagel_client::{LeaseOptions, Micros};
use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::{ServerProcess, bagel_skewed, describe_output};
use prost::Message as _;

const SEC: u64 = 1_000_000;

fn no_renew() -> LeaseOptions {
    LeaseOptions::default().with_auto_renew(false)
}

fn body(w: &bagel_client::Witness) -> pb::WitnessBody {
    pb::WitnessBody::decode(w.body()).expect("a witness body")
}

/// The witness body of `bagel acquire --json` output.
fn cli_witness(out: &Output) -> pb::WitnessBody {
    let lease: bagel_cli::contract::LeaseJson = serde_json::from_slice(&out.stdout).expect("lease JSON");
    let w = lease.witness.to_pb().expect("a witness");
    pb::WitnessBody::decode(w.body.clone()).expect("a witness body")
}

#[tokio::test]
async fn ttls_out_of_range_are_refused_in_human_units_naming_the_servers_flags() {
    let server = ServerProcess::start_ready(&["--max-ttl", "60s", "--min-ttl", "100ms"]).await;
    let out = server.cli(&["acquire", "over", "--ttl", "2h"]);
    assert!(!out.status.success(), "{}", describe_output(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ttl 2h is over the server's --max-ttl of 1m"),
        "{err}"
    );
    assert!(!err.contains("must lie in"), "{err}");

    let out = server.cli(&["acquire", "under", "--ttl", "50ms"]);
    assert!(!out.status.success(), "{}", describe_output(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ttl 50ms is not over the server's --min-ttl of 100ms"),
        "{err}"
    );

    // An absolute deadline too far off says so in the same terms.
    let far = Micros::now().as_micros() + 3600 * SEC;
    let out = server.cli(&["acquire", "far", "--deadline", &far.to_string()]);
    assert!(!out.status.success(), "{}", describe_output(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("over the server's --max-ttl of 1m"), "{err}");
    assert!(!err.contains("must lie in"), "{err}");

    // The wire: a deadline and a TTL at once is refused, naming both.
    let mut raw = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    let both = raw
        .acquire(pb::AcquireRequest {
            names: vec!["both".into()],
            deadline_us: Micros::now().as_micros() + 5 * SEC,
            ttl_us: 5 * SEC,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(both.code(), tonic::Code::InvalidArgument, "{both:?}");
    assert!(
        both.message().contains("deadline_us") && both.message().contains("ttl_us"),
        "{both:?}"
    );
}

/// An acquire that waits for a busy name gets its whole TTL from the
/// moment it is granted: the deadline is the grant time (no earlier than
/// the holder's release) plus the TTL, not the time the request was sent
/// plus the TTL.
#[tokio::test]
async fn a_ttl_counts_from_the_grant_not_from_the_request() {
    let server = ServerProcess::start_ready(&["--max-ttl", "20s"]).await;
    let client = server.client().await;
    let holder = client
        .acquire(["n"])
        .ttl(Duration::from_secs(15))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    let ttl = Duration::from_secs(5);
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .acquire(["n"])
                .ttl(ttl)
                .wait(Duration::from_secs(9))
                .options(no_renew())
                .send()
                .await
        })
    };
    // Released only once the server has the waiter queued.
    let mut raw = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    let describe = pb::DescribeRequest {
        names: vec!["n".into()],
    };
    while raw.describe(describe.clone()).await.unwrap().into_inner().names[0].waiters != 1 {
        tokio::task::yield_now().await;
    }
    holder.release(None).await.unwrap();
    let released_at = client
        .history("n")
        .await
        .unwrap()
        .entries
        .last()
        .expect("the release")
        .at;

    let lease = waiter.await.unwrap().expect("granted after the release");
    let w = body(&lease.state().witnesses[0]);
    let ttl_us = ttl.as_micros() as u64;
    assert!(
        w.deadline_us >= released_at.as_micros() + ttl_us,
        "deadline {} is not the release ({}) plus the TTL: the wait was taken off the lease",
        w.deadline_us,
        released_at.as_micros()
    );
    assert!(
        w.deadline_us <= w.issued_at_us + ttl_us,
        "deadline {} is past the witness's issue time {} plus the TTL",
        w.deadline_us,
        w.issued_at_us
    );
}

/// `bagel acquire --ttl 10s` on a host whose clock is 8 s behind the
/// server's gets a lease of 10 s by the server's clock, with no warning;
/// before, it got 2 s and no word about it.
#[tokio::test]
async fn a_ttl_from_a_host_whose_clock_is_behind_is_not_shortened() {
    let server = ServerProcess::start_ready(&["--max-ttl", "20s"]).await;
    let out = bagel_skewed(
        "-8s",
        &server.url,
        &["acquire", "behind", "--ttl", "10s", "--json"],
    );
    assert!(out.status.success(), "{}", describe_output(&out));
    let w = cli_witness(&out);
    let left = w.deadline_us - w.issued_at_us;
    // The server counted the 10 s from its grant: what is left when the
    // witness was issued is 10 s less the signing, nowhere near the 2 s
    // an absolute deadline from this clock would leave.
    assert!(left > 5 * SEC && left <= 10 * SEC, "left {left} us");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("asked for"), "{err}");
}

/// With an absolute deadline from a host whose clock is 15 s behind: a
/// deadline 20 s ahead by that clock (5 s by the server's) is granted
/// with a warning naming what was asked and what is left; one already
/// past by the server's clock is refused naming the server's time and
/// this host's.
#[tokio::test]
async fn an_absolute_deadline_that_comes_back_short_or_past_says_so() {
    let server = ServerProcess::start_ready(&["--max-ttl", "20s"]).await;
    let soon = Micros::now().as_micros() + 5 * SEC;
    let out = bagel_skewed(
        "-15s",
        &server.url,
        &["acquire", "short", "--deadline", &soon.to_string(), "--json"],
    );
    assert!(out.status.success(), "{}", describe_output(&out));
    let lease: bagel_cli::contract::LeaseJson = serde_json::from_slice(&out.stdout).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("lease {}: asked for ", lease.lease_id)),
        "{err}"
    );
    assert!(err.contains("but the server's grant leaves "), "{err}");
    assert!(err.contains("this host's clock is behind the server's"), "{err}");

    let past = Micros::now().as_micros() - SEC;
    let out = bagel_skewed(
        "-8s",
        &server.url,
        &["acquire", "past", "--deadline", &past.to_string()],
    );
    assert!(!out.status.success(), "{}", describe_output(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("already past on the server's clock (server now"),
        "{err}"
    );
    assert!(err.contains("this host's clock read"), "{err}");
}

/// `RenewRequest.ttl_us`, as `AcquireRequest.ttl_us`: the new deadline is
/// the server's clock at the renewal plus the TTL; exactly one of
/// `deadline_us` and `ttl_us`; a TTL out of range refused naming the
/// server's flag.
#[tokio::test]
async fn a_renewal_may_ask_for_a_ttl_counted_from_the_servers_clock() {
    let server = ServerProcess::start_ready(&["--max-ttl", "20s"]).await;
    let mut raw = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    let granted = raw
        .acquire(pb::AcquireRequest {
            names: vec!["renewed-by-ttl".into()],
            ttl_us: 2 * SEC,
            owner: "ttl-test".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .grant
        .expect("a grant");
    let renew = |deadline_us: u64, ttl_us: u64| pb::RenewRequest {
        lease_id: granted.lease_id.clone(),
        token: granted.token.clone(),
        deadline_us,
        ttl_us,
        metadata: None,
    };
    let asked_at = Micros::now().as_micros();
    let renewed = raw.renew(renew(0, 15 * SEC)).await.unwrap().into_inner();
    let w = pb::WitnessBody::decode(renewed.witness.expect("a witness").body.clone()).unwrap();
    assert_eq!(renewed.deadline_us, w.deadline_us);
    // Counted from the server's clock during the call (this host's: the
    // same machine), at or before the witness was signed.
    assert!(
        w.deadline_us >= asked_at + 15 * SEC && w.deadline_us <= w.issued_at_us + 15 * SEC,
        "deadline {} is not the renewal's time (asked at {asked_at}, signed at {}) plus the TTL",
        w.deadline_us,
        w.issued_at_us
    );

    let both = raw
        .renew(renew(Micros::now().as_micros() + 5 * SEC, 5 * SEC))
        .await
        .unwrap_err();
    assert_eq!(both.code(), tonic::Code::InvalidArgument, "{both:?}");
    assert!(
        both.message().contains("ttl_us") && both.message().contains("not both"),
        "{both:?}"
    );
    let neither = raw.renew(renew(0, 0)).await.unwrap_err();
    assert_eq!(neither.code(), tonic::Code::InvalidArgument, "{neither:?}");
    assert!(neither.message().contains("deadline_us"), "{neither:?}");
    let over = raw.renew(renew(0, 60 * SEC)).await.unwrap_err();
    assert_eq!(over.code(), tonic::Code::OutOfRange, "{over:?}");
    assert!(over.message().contains("--max-ttl of 20s"), "{over:?}");
}
