//! The `Batch` and `Session` RPCs and the client-side coalescer: every
//! operation gets its own result, grants of one batch share one signature
//! over a Merkle root, and each witness still verifies on its own (also
//! through the CLI).

use bagel_cli::contract::WitnessJson;
use bagel_client::{CoalesceOptions, Coalescer, Error, LeaseOptions, Micros, Transport};
use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_proto::verify_witness;
use bagel_tests::{ServerProcess, describe_output, wire};
use pb::batch_op::Op;
use pb::batch_result::Result as R;

fn acquire(name: &str, wait_us: u64) -> pb::BatchOp {
    pb::BatchOp {
        op: Some(Op::Acquire(pb::AcquireRequest {
            names: vec![name.to_owned()],
            deadline_us: Micros::now().as_micros() + 5_000_000,
            owner: "batch".into(),
            mode: pb::Mode::Full.into(),
            wait_us,
            ..Default::default()
        })),
    }
}

/// The server's gRPC interface itself, as any-language clients see it.
async fn raw(server: &ServerProcess) -> LeaseServiceClient<tonic::transport::Channel> {
    LeaseServiceClient::new(
        tonic::transport::Channel::from_shared(server.url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap(),
    )
}

/// A raw `Session` stream: where to send requests, and its answers.
async fn session(
    server: &ServerProcess,
) -> (
    tokio::sync::mpsc::Sender<pb::BatchRequest>,
    tonic::Streaming<pb::BatchResponse>,
) {
    let (requests, outgoing) = tokio::sync::mpsc::channel(8);
    let answers = raw(server)
        .await
        .session(tokio_stream::wrappers::ReceiverStream::new(outgoing))
        .await
        .unwrap()
        .into_inner();
    (requests, answers)
}

async fn batch(
    rpc: &mut LeaseServiceClient<tonic::transport::Channel>,
    ops: Vec<pb::BatchOp>,
) -> Vec<pb::BatchResult> {
    rpc.batch(pb::BatchRequest { ops, lean: false })
        .await
        .unwrap()
        .into_inner()
        .results
}

#[tokio::test]
async fn a_batch_answers_every_operation_in_order() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let mut rpc = raw(&server).await;
    let results = batch(
        &mut rpc,
        vec![
            acquire("a", 0),
            acquire("b", 0),
            acquire("a", 0),
            acquire("c", 1_000),
            pb::BatchOp { op: None },
        ],
    )
    .await;
    assert_eq!(results.len(), 5);
    let grant = |i: usize| match &results[i].result {
        Some(R::Grant(g)) => g.clone(),
        other => panic!("result {i}: expected a grant, got {other:?}"),
    };
    let (a, b) = (grant(0), grant(1));
    let error = |i: usize| match &results[i].result {
        Some(R::Error(e)) => e.clone(),
        other => panic!("result {i}: expected an error, got {other:?}"),
    };
    let conflict = error(2);
    assert_eq!(conflict.code, tonic::Code::Aborted as i32);
    assert_eq!(conflict.conflict.as_ref().unwrap().holder_lease_id, a.lease_id);
    let no_wait = error(3);
    assert_eq!(no_wait.code, tonic::Code::InvalidArgument as i32);
    assert!(no_wait.message.contains("wait_us"), "{}", no_wait.message);
    assert!(error(4).message.contains("ops.op"));

    // Both grants share one signature over their batch's Merkle root, and
    // each verifies alone; a flipped byte does not.
    let (wa, wb) = (a.witness.clone().unwrap(), b.witness.clone().unwrap());
    assert!(wa.batched && wb.batched);
    assert_eq!(wa.signature, wb.signature);
    assert_ne!(wa.leaf_index, wb.leaf_index);
    assert_eq!(verify_witness(&wa, &client.keys()).unwrap().lease_id, a.lease_id);
    assert_eq!(verify_witness(&wb, &client.keys()).unwrap().lease_id, b.lease_id);
    let mut bad = wb.clone();
    let mut body = bad.body.to_vec();
    body[5] ^= 0x01;
    bad.body = body.into();
    assert!(verify_witness(&bad, &client.keys()).is_err());

    // The CLI verifies a batched witness from its JSON form.
    let json = serde_json::json!({ "witness": WitnessJson {
        body_b64: base64_encode(&wa.body),
        signature_b64: base64_encode(&wa.signature),
        key_id: wa.key_id.clone(),
        merkle: Some(bagel_cli::contract::MerkleJson {
            leaf_index: wa.leaf_index,
            path_b64: wa.merkle_path.iter().map(|h| base64_encode(h)).collect(),
        }),
    } });
    let out = server.cli_stdin(&["verify-witness"], &json.to_string());
    assert!(out.status.success(), "{}", describe_output(&out));

    // Renew and release in a second batch.
    let results = batch(
        &mut rpc,
        vec![
            pb::BatchOp {
                op: Some(Op::Renew(pb::RenewRequest {
                    lease_id: a.lease_id.clone(),
                    token: a.token.clone(),
                    deadline_us: Micros::now().as_micros() + 8_000_000,
                    ttl_us: 0,
                    metadata: None,
                })),
            },
            pb::BatchOp {
                op: Some(Op::Release(pb::ReleaseRequest {
                    lease_id: b.lease_id.clone(),
                    token: b.token.clone(),
                    watermark_us: Micros::now().as_micros(),
                    ..Default::default()
                })),
            },
        ],
    )
    .await;
    assert!(matches!(&results[0].result, Some(R::Renewed(r)) if r.witness.is_some()));
    assert!(matches!(&results[1].result, Some(R::Released(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_cycles_from_many_tasks_all_verify() {
    coalesced_cycles_all_verify(Transport::Batch, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_cycles_over_session_streams_all_verify() {
    coalesced_cycles_all_verify(Transport::Session, true).await;
}

/// The same cycles with answers in the full form (as clients that predate
/// the lean form ask for them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_cycles_with_full_answers_all_verify() {
    coalesced_cycles_all_verify(Transport::Batch, false).await;
    coalesced_cycles_all_verify(Transport::Session, false).await;
}

/// Session streams spread over connections of their own (issue 25: one
/// connection keeps a server's work on about one core): three streams over
/// three connections show on the server as three sessions on three
/// connections besides the watcher's, and every cycle through them verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_streams_spread_over_connections() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let coalescer = Coalescer::new(
        client.clone(),
        CoalesceOptions::default()
            .with_transport(Transport::Session)
            .with_streams(3)
            .with_connections(3),
    );
    let mut tasks = Vec::new();
    for t in 0..24 {
        let (client, coalescer) = (client.clone(), coalescer.clone());
        tasks.push(tokio::spawn(async move {
            for r in 0..10 {
                let lease = client
                    .acquire([format!("spread-{t}-{r}")])
                    .options(LeaseOptions::default().with_auto_renew(false))
                    .via(&coalescer)
                    .send()
                    .await
                    .unwrap();
                verify_witness(&wire(&lease.witness()), &client.keys()).unwrap();
                lease.release(None).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // A connection of its own, so that it counts as one apart from the
    // coalescer's.
    let mut watcher = raw(&server).await;
    let load = watcher
        .server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner()
        .load
        .expect("ServerInfo.load");
    // Streams open on first use; with 24 callers every stream was used.
    assert_eq!(load.sessions, 3, "{load:?}");
    assert!(
        load.connections >= 4,
        "three coalescer connections and the watcher's: {load:?}"
    );
}

/// 48 tasks × 20 acquire/release cycles of lease handles through one
/// coalescer: every grant verifies alone and every release answers; then a
/// held name is refused like the unary call refuses it.
async fn coalesced_cycles_all_verify(transport: Transport, lean: bool) {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let coalescer = Coalescer::new(
        client.clone(),
        CoalesceOptions::default()
            .with_max_batch(64)
            .with_in_flight(2)
            .with_transport(transport)
            .with_lean_answers(lean),
    );
    let no_renew = LeaseOptions::default().with_auto_renew(false);
    let mut tasks = Vec::new();
    for t in 0..48 {
        let (client, coalescer, no_renew) = (client.clone(), coalescer.clone(), no_renew.clone());
        tasks.push(tokio::spawn(async move {
            for r in 0..20 {
                let name = format!("task-{t}-round-{r}");
                let lease = client
                    .acquire([name.clone()])
                    .owner(format!("t{t}"))
                    .options(no_renew.clone())
                    .via(&coalescer)
                    .send()
                    .await
                    .unwrap();
                assert!(lease.is_valid());
                let body = verify_witness(&wire(&lease.witness()), &client.keys()).unwrap();
                assert_eq!(body.names[0].name, name);
                assert_eq!(body.lease_id, lease.id());
                if r % 5 == 0 {
                    // A renewal through the coalescer: its witness too.
                    let deadline = lease.renew().await.unwrap();
                    let body = verify_witness(&wire(&lease.witness()), &client.keys()).unwrap();
                    assert_eq!(
                        (body.lease_id.as_str(), body.deadline_us),
                        (lease.id(), deadline.as_micros())
                    );
                    assert_eq!(body.kind(), pb::WitnessKind::Renew);
                }
                let inherited = lease.min_timestamp();
                assert_eq!(lease.release(None).await.unwrap(), inherited);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }

    // A coalesced acquire of a held name fails like the unary call.
    let held = client.acquire(["held"]).via(&coalescer).send().await.unwrap();
    let err = client.acquire(["held"]).via(&coalescer).send().await.unwrap_err();
    assert!(
        matches!(&err, Error::Busy { conflict: Some(c), .. } if c.holder_lease_id == held.id()),
        "{err:?}"
    );
    assert_eq!(err.retry_after(), Some(held.deadline()));
    // What is not batched goes through the coalescer's client, so code
    // holding it as a LeaseBackend can still ask who holds a name.
    let states = bagel_client::LeaseBackend::describe(&coalescer, &["held".to_owned()])
        .await
        .unwrap();
    assert_eq!(
        states[0].holder.as_ref().map(|h| h.lease_id.as_str()),
        Some(held.id())
    );
}

/// Concurrent unary acquires are signed in groups (whoever finds the signer
/// busy waits for the next, shared signature): every grant's witness still
/// verifies on its own and states its own lease, batched or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_unary_grants_each_verify_alone() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let mut tasks = Vec::new();
    for t in 0..64 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut witnesses = Vec::new();
            for r in 0..10 {
                let name = format!("unary-{t}-{r}");
                // `acquire` checks the witness against the server's keys.
                let lease = client.acquire([name.clone()]).send().await.unwrap();
                witnesses.push((name, lease.id().to_owned(), lease.witness()));
                lease.release(None).await.unwrap();
            }
            witnesses
        }));
    }
    let keys = client.keys().clone();
    let mut shared = 0;
    for t in tasks {
        for (name, lease_id, witness) in t.await.unwrap() {
            let body = verify_witness(&wire(&witness), &keys).unwrap();
            assert_eq!(body.names[0].name, name);
            assert_eq!(body.lease_id, lease_id);
            shared += usize::from(witness.merkle().is_some());
        }
    }
    // How many shared a signature depends on timing; none may be broken.
    eprintln!("{shared} of 640 unary witnesses were signed in a group");
}

/// A `Session` stream answers pipelined batches one for one, in the order
/// sent, with `Batch`'s semantics; a request over the operation limit ends
/// the stream with a status naming the field and the limit.
#[tokio::test]
async fn a_session_answers_pipelined_batches_in_order() {
    let server = ServerProcess::start_ready(&[]).await;
    let (requests, mut answers) = session(&server).await;
    // Three requests sent before any answer is read.
    let batch = |ops: Vec<pb::BatchOp>| pb::BatchRequest { ops, lean: false };
    requests.send(batch(vec![acquire("s-a", 0)])).await.unwrap();
    requests
        .send(batch(vec![acquire("s-b", 0), acquire("s-a", 0)]))
        .await
        .unwrap();
    requests.send(batch(vec![acquire("s-c", 0)])).await.unwrap();

    let first = answers.message().await.unwrap().unwrap().results;
    let Some(R::Grant(a)) = &first[0].result else {
        panic!("{first:?}")
    };
    let second = answers.message().await.unwrap().unwrap().results;
    assert_eq!(second.len(), 2);
    assert!(matches!(&second[0].result, Some(R::Grant(g)) if g.names[0].name == "s-b"));
    match &second[1].result {
        Some(R::Error(e)) => {
            assert_eq!(e.code, tonic::Code::Aborted as i32);
            assert_eq!(e.conflict.as_ref().unwrap().holder_lease_id, a.lease_id);
        }
        other => panic!("expected the conflict on s-a, got {other:?}"),
    }
    let third = answers.message().await.unwrap().unwrap().results;
    let Some(R::Grant(c)) = &third[0].result else {
        panic!("{third:?}")
    };
    let keys = server.client().await.keys().clone();
    for grant in [a, c] {
        let body = verify_witness(grant.witness.as_ref().unwrap(), &keys).unwrap();
        assert_eq!(body.lease_id, grant.lease_id);
    }

    let too_many = vec![acquire("s-d", 0); 1025];
    requests.send(batch(too_many)).await.unwrap();
    let status = answers.message().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("ops") && status.message().contains("1024"),
        "{}",
        status.message()
    );
}

/// The lean form as any-language clients see it: a Session whose
/// requests ask for it, pipelined with one that does not, answers each in
/// its own form. A lean answer's grants and renewals carry their bodies
/// and the answer one signed range; the witness derived from it verifies
/// on its own and, where the server signed a full-form answer in the same
/// group, shares its signature. Its token renews and releases the lease.
/// An answer with nothing signed carries no range.
#[tokio::test]
async fn a_lean_session_answer_derives_witnesses_that_verify_alone() {
    use bagel_proto::signed_range::FoldedRange;
    let server = ServerProcess::start_ready(&[]).await;
    let keys = server.client().await.keys().clone();
    let (requests, mut answers) = session(&server).await;
    let lean = |ops: Vec<pb::BatchOp>| pb::BatchRequest { ops, lean: true };
    let full = |ops: Vec<pb::BatchOp>| pb::BatchRequest { ops, lean: false };
    requests
        .send(lean((0..5).map(|i| acquire(&format!("lean-{i}"), 0)).collect()))
        .await
        .unwrap();
    requests.send(full(vec![acquire("full-0", 0)])).await.unwrap();
    requests
        .send(lean(vec![acquire("lean-0", 0), acquire("lean-5", 0)]))
        .await
        .unwrap();

    let derive = |answer: &pb::BatchResponse| -> Vec<pb::Witness> {
        let bodies = bagel_proto::signed_range::lean_bodies(answer);
        let folded = FoldedRange::fold(answer.signed.as_ref().expect("a signed range"), bodies).unwrap();
        folded.verify(&keys).unwrap();
        (0..folded.len()).map(|k| folded.witness(k)).collect()
    };
    let first = answers.message().await.unwrap().unwrap();
    let witnesses = derive(&first);
    assert_eq!(witnesses.len(), 5);
    let mut tokens = Vec::new();
    for (i, (w, r)) in witnesses.iter().zip(&first.results).enumerate() {
        let body = verify_witness(w, &keys).unwrap();
        assert_eq!(body.names[0].name, format!("lean-{i}"));
        let Some(R::LeanGrant(g)) = &r.result else {
            panic!("{r:?}")
        };
        assert!(!g.token.is_empty());
        tokens.push((body.lease_id, g.token.clone()));
    }
    let second = answers.message().await.unwrap().unwrap();
    assert!(second.signed.is_none(), "the full form carries no range");
    let Some(R::Grant(g)) = &second.results[0].result else {
        panic!("{second:?}")
    };
    let w = g.witness.as_ref().unwrap();
    verify_witness(w, &keys).unwrap();
    if w.signature == witnesses[0].signature {
        // Run in one group: the full form's leaf follows the lean run's.
        assert_eq!(w.leaf_index, 5);
    }
    let third = answers.message().await.unwrap().unwrap();
    assert!(matches!(&third.results[0].result, Some(R::Error(e)) if e.code == tonic::Code::Aborted as i32));
    let lean_5 = derive(&third);
    assert_eq!(lean_5.len(), 1);
    assert_eq!(verify_witness(&lean_5[0], &keys).unwrap().names[0].name, "lean-5");

    // A renewal and a release by the lean grant's token; the release alone
    // is signed by nothing.
    let (lease_id, token) = tokens[0].clone();
    let renew = pb::BatchOp {
        op: Some(Op::Renew(pb::RenewRequest {
            lease_id: lease_id.clone(),
            token: token.clone(),
            ttl_us: 4_000_000,
            ..Default::default()
        })),
    };
    requests.send(lean(vec![renew])).await.unwrap();
    let renewed = answers.message().await.unwrap().unwrap();
    let w = derive(&renewed);
    let body = verify_witness(&w[0], &keys).unwrap();
    assert_eq!(
        (body.lease_id.as_str(), body.kind()),
        (lease_id.as_str(), pb::WitnessKind::Renew)
    );
    let release = pb::BatchOp {
        op: Some(Op::Release(pb::ReleaseRequest {
            lease_id,
            token,
            ..Default::default()
        })),
    };
    requests.send(lean(vec![release])).await.unwrap();
    let released = answers.message().await.unwrap().unwrap();
    assert!(
        matches!(&released.results[0].result, Some(R::Released(_))),
        "{released:?}"
    );
    assert!(released.signed.is_none());
}

/// When the server goes away under a session, the coalescer answers every
/// waiting caller with a retryable error instead of leaving it hanging, and
/// later calls open a new stream (and fail the same way while the server
/// is down).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_fails_its_callers_retryably() {
    let mut server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let coalescer = Coalescer::new(
        client.clone(),
        CoalesceOptions::default().with_transport(Transport::Session),
    );
    let acquire = |name: &'static str| client.acquire([name]).via(&coalescer).send();
    acquire("before").await.unwrap();
    server.kill();
    for name in ["after-1", "after-2"] {
        let err = tokio::time::timeout(std::time::Duration::from_secs(30), acquire(name))
            .await
            .expect("a caller of a lost session is answered")
            .unwrap_err();
        assert!(err.is_retryable(), "{err:?}");
    }
}

fn base64_encode(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}
