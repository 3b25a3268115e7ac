//! Issue 13, item 4: names held are capped in all, per owner and per peer,
//! with RESOURCE_EXHAUSTED naming the limit; a client churning through
//! names does not make the server forget other clients' idle records.

use bagel_client::Micros;
use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::ServerProcess;
use tonic::Code;
use tonic::transport::Channel;

const SEC: u64 = 1_000_000;

async fn raw(server: &ServerProcess) -> LeaseServiceClient<Channel> {
    LeaseServiceClient::connect(server.url.clone()).await.unwrap()
}

fn acquire(names: &[String], owner: &str) -> pb::AcquireRequest {
    pb::AcquireRequest {
        names: names.to_vec(),
        deadline_us: Micros::now().as_micros() + 9 * SEC,
        owner: owner.into(),
        mode: pb::Mode::Full.into(),
        wait_us: 0,
        ..Default::default()
    }
}

fn one(name: &str, owner: &str) -> pb::BatchOp {
    pb::BatchOp {
        op: Some(pb::batch_op::Op::Acquire(acquire(&[name.to_owned()], owner))),
    }
}

fn codes(r: &pb::BatchResponse) -> Vec<Option<Code>> {
    r.results
        .iter()
        .map(|r| match &r.result {
            Some(pb::batch_result::Result::Error(e)) => Some(Code::from(e.code)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn names_held_are_capped_per_owner_per_peer_and_in_all() {
    let server = ServerProcess::start_ready(&[
        "--max-held-names-per-owner",
        "3",
        "--max-held-names-per-peer",
        "5",
        "--max-held-names",
        "1000",
    ])
    .await;
    let mut c = raw(&server).await;
    let limits = c
        .server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner()
        .limits
        .unwrap();
    assert_eq!(
        (
            limits.max_held_names_per_owner,
            limits.max_held_names_per_peer,
            limits.max_held_names
        ),
        (3, 5, 1000)
    );

    let names = |p: &str, n: usize| (0..n).map(|i| format!("{p}{i}")).collect::<Vec<_>>();
    c.acquire(acquire(&names("a", 3), "alice")).await.unwrap();
    let refused = c.acquire(acquire(&["a3".into()], "alice")).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    for needle in ["owner \"alice\"", "limit of 3", "--max-held-names-per-owner"] {
        assert!(refused.message().contains(needle), "{refused:?} lacks {needle}");
    }
    // Another owner from the same address: bound by the address's quota.
    let batch = pb::BatchRequest {
        lean: false,
        ops: (0..3).map(|i| one(&format!("b{i}"), "bob")).collect(),
    };
    let got = c.batch(batch).await.unwrap().into_inner();
    assert_eq!(codes(&got), vec![None, None, Some(Code::ResourceExhausted)]);
    let Some(pb::batch_result::Result::Error(e)) = &got.results[2].result else {
        unreachable!()
    };
    for needle in ["127.0.0.1", "limit of 5", "--max-held-names-per-peer"] {
        assert!(e.message.contains(needle), "{e:?} lacks {needle}");
    }
}

/// A churning client (owner "churner") takes and releases thousands of
/// names, 200 at a time, on a server that keeps 1000 records: its own are
/// forgotten, not the keeper's idle one. On main the keeper's (the oldest)
/// went first and its name then inherited the raised floor.
#[tokio::test]
async fn churn_does_not_forget_other_clients_idle_records() {
    let server = ServerProcess::start_ready(&["--shards", "1", "--max-records", "1000"]).await;
    let mut c = raw(&server).await;
    let keep = c
        .acquire(acquire(&["keep".into()], "keeper"))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    let watermark = Micros::now().as_micros();
    c.release(pb::ReleaseRequest {
        lease_id: keep.lease_id.clone(),
        token: keep.token.clone(),
        watermark_us: watermark,
        ..Default::default()
    })
    .await
    .unwrap();

    let mut round = 0;
    // Churn until the server has forgotten some of it (its floor rises).
    loop {
        let batch = pb::BatchRequest {
            lean: false,
            ops: (0..200)
                .map(|i| one(&format!("churn-{round}-{i}"), "churner"))
                .collect(),
        };
        let grants = c.batch(batch).await.unwrap().into_inner();
        let releases = grants
            .results
            .into_iter()
            .map(|r| match r.result {
                Some(pb::batch_result::Result::Grant(g)) => pb::BatchOp {
                    op: Some(pb::batch_op::Op::Release(pb::ReleaseRequest {
                        lease_id: g.lease_id,
                        token: g.token,
                        // So that forgetting it raises the floor we watch.
                        watermark_us: Micros::now().as_micros(),
                        ..Default::default()
                    })),
                },
                other => panic!("churn acquire failed: {other:?}"),
            })
            .collect();
        c.batch(pb::BatchRequest {
            ops: releases,
            lean: false,
        })
        .await
        .unwrap();
        round += 1;
        let info = c
            .server_info(pb::ServerInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        if info.forgotten_floor_us > 0 {
            break;
        }
    }
    let view = c
        .describe(pb::DescribeRequest {
            names: vec!["keep".into()],
        })
        .await
        .unwrap()
        .into_inner()
        .names
        .remove(0);
    assert!(
        view.known,
        "the keeper's idle record was forgotten after {round} rounds"
    );
    let previous = view.previous.unwrap();
    assert_eq!(previous.lease_id, keep.lease_id);
    assert_eq!(previous.watermark_us, watermark);
}
