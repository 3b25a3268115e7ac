//! Many tasks race for overlapping name sets. Afterwards, from the signed
//! witnesses alone, no two grants of one name overlapped in time: each
//! grant's predecessor (by fencing token) is the lease its witness names as
//! previous, and that lease ended (released or broken) before the grant.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bagel_client::{LeaseOptions, Micros};
use bagel_proto::pb;
use bagel_proto::verify_witness;
use bagel_tests::{ServerProcess, wire};
use tokio::sync::Mutex;

const NAMES: [&str; 6] = ["n0", "n1", "n2", "n3", "n4", "n5"];
const TASKS: usize = 24;
const ROUNDS: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_acquires_never_overlap() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let witnesses = Arc::new(Mutex::new(Vec::<pb::Witness>::new()));

    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let client = client.clone();
        let witnesses = Arc::clone(&witnesses);
        tasks.push(tokio::spawn(async move {
            let mut granted = 0;
            for r in 0..ROUNDS {
                // Overlapping sets of 1 to 3 names, varying by task and round.
                let k = 1 + (t + r) % 3;
                let names: Vec<&str> = (0..k)
                    .map(|i| NAMES[(t * 7 + r * 3 + i * 2) % NAMES.len()])
                    .collect();
                let mut names = names;
                names.sort();
                names.dedup();
                // Some leases are left to expire (broken), most are released.
                let abandon = (t + r) % 11 == 0;
                let ttl = if abandon {
                    Duration::from_millis(300)
                } else {
                    Duration::from_secs(2)
                };
                let lease = match client
                    .acquire(names.clone())
                    .ttl(ttl)
                    .wait(Duration::from_secs(2))
                    .options(LeaseOptions::default().with_auto_renew(false))
                    .send()
                    .await
                {
                    Ok(l) => l,
                    Err(e) if e.is_retryable() => continue,
                    Err(e) => panic!("acquire {names:?}: {e}"),
                };
                granted += 1;
                witnesses.lock().await.push(wire(&lease.witness()));
                if abandon {
                    drop(lease);
                    continue;
                }
                let wm = Micros::now().max(lease.min_timestamp().next());
                if wm < lease.deadline() {
                    lease.release(Some(wm)).await.unwrap();
                }
            }
            granted
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert!(total > TASKS, "too few grants to mean anything: {total}");

    // Audit from the witnesses only.
    let witnesses = witnesses.lock().await;
    let mut by_name: HashMap<String, Vec<(u64, pb::WitnessBody, pb::PreviousLease)>> = HashMap::new();
    let mut deadline_of: HashMap<String, u64> = HashMap::new();
    for w in witnesses.iter() {
        let body = verify_witness(w, &client.keys()).expect("every witness verifies");
        deadline_of.insert(body.lease_id.clone(), body.deadline_us);
        for n in &body.names {
            by_name.entry(n.name.clone()).or_default().push((
                n.fencing_token,
                body.clone(),
                n.previous.clone().unwrap(),
            ));
        }
    }
    for (name, mut grants) in by_name {
        grants.sort_by_key(|g| g.0);
        for pair in grants.windows(2) {
            let (f0, g0, _) = &pair[0];
            let (f1, g1, prev1) = &pair[1];
            assert!(f1 > f0, "{name}: fencing tokens must strictly increase");
            assert_eq!(
                prev1.lease_id, g0.lease_id,
                "{name}: the chain must link each grant to the one before"
            );
            match prev1.ended() {
                pb::Ended::Released => assert!(
                    prev1.ended_at_us <= g1.issued_at_us && prev1.ended_at_us < g0.deadline_us,
                    "{name}: released after the next grant, or after its own deadline"
                ),
                pb::Ended::Broken => {
                    assert!(
                        g1.issued_at_us >= g0.deadline_us,
                        "{name}: broken before its deadline"
                    );
                    assert_eq!(prev1.watermark_us.max(g0.deadline_us), prev1.watermark_us);
                }
                other => panic!("{name}: unexpected previous state {other:?}"),
            }
            assert!(
                g1.min_timestamp_us >= prev1.watermark_us,
                "{name}: min_timestamp below the watermark"
            );
            assert!(g1.issued_at_us >= g0.issued_at_us);
        }
    }
}
