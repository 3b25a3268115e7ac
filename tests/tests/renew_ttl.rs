//! `bagel renew --ttl` sends the TTL (`RenewRequest.ttl_us`), so the
//! server counts it from its own clock at the renewal: a host whose clock
//! is off gets the lease it asked for, neither shortened nor lengthened.

use std::process::Output;
use std::time::Duration;

use bagel_cli::contract::LeaseJson;
use bagel_proto::pb;
use bagel_tests::{ServerProcess, bagel_skewed, describe_output};
use prost::Message as _;

/// What a renewal's witness says was left when the server issued it.
fn left_at_issue(out: &Output) -> Duration {
    let lease: LeaseJson = serde_json::from_slice(&out.stdout).expect("lease JSON");
    let w = lease.witness.to_pb().expect("a witness");
    let body = pb::WitnessBody::decode(w.body.clone()).expect("a witness body");
    Duration::from_micros(body.deadline_us - body.issued_at_us)
}

/// From a host 8 s behind the server and from one 5 s ahead, `renew
/// --ttl 9s` leaves 9 s by the server's clock (less the moment between
/// the renewal and its witness's signature). A deadline computed on the
/// host's clock would leave 1 s (behind; the lease's 3 s would be kept)
/// or 14 s (ahead).
#[tokio::test]
async fn renew_ttl_counts_on_the_servers_clock_whatever_the_hosts_clock() {
    let server = ServerProcess::start_ready(&["--max-ttl", "20s"]).await;
    for (offset, name) in [("-8s", "behind"), ("+5s", "ahead")] {
        let acquired = server.cli(&["acquire", name, "--ttl", "3s", "--json"]);
        assert!(acquired.status.success(), "{}", describe_output(&acquired));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lease.json");
        std::fs::write(&file, &acquired.stdout).unwrap();

        let renewed = bagel_skewed(
            offset,
            &server.url,
            &[
                "renew",
                "--lease",
                file.to_str().unwrap(),
                "--ttl",
                "9s",
                "--json",
            ],
        );
        assert!(
            renewed.status.success(),
            "{offset}: {}",
            describe_output(&renewed)
        );
        let left = left_at_issue(&renewed);
        assert!(
            left <= Duration::from_secs(9) && left > Duration::from_secs(5),
            "{offset}: {left:?} left, not the 9 s the server counts from its own clock"
        );
    }
}
