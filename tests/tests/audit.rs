//! `bagel audit` over real bags written under real leases from the real
//! server: a clean history audits with no violation, and each fault
//! injected on purpose is caught and named.

use std::sync::Arc;
use std::time::Duration;

use bagel_bags::audit::{AuditConfig, AuditMessage, ViolationKind, audit};
use bagel_bags::{self as bag, BagConfig, Writer};
use bagel_client::{Client, Lease, LeaseBackend as _, LeaseOptions, Micros, ReleaseOptions};
use bagel_client::{Ended, TimeOptions, TimeSource};
use bagel_proto::clock::{AssumedExact, Clock, SystemClock};
use bagel_proto::{KeyRing, Signer, sign_local_time};
use bagel_tests::{ServerProcess, describe_output, unique};
use bytes::Bytes;

struct Setup {
    _dir: tempfile::TempDir,
    url: String,
    log: String,
    cfg: BagConfig,
}

impl Setup {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        // A short grace keeps the closing waits short.
        let cfg = BagConfig::default().with_grace(Duration::from_millis(200));
        Setup {
            _dir: dir,
            url,
            log: unique("audit"),
            cfg,
        }
    }

    /// Writes `n` messages under `lease`, with signed time from its server.
    async fn write(&self, client: &Client, lease: &Lease, writer_id: &str, n: usize) -> Writer {
        let store = bag::open_store(&self.url, &self.cfg).await.unwrap();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let time = TimeSource::lease_server(client.clone(), TimeOptions::default());
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
        }
        writer
    }

    /// Closes every bag up to now, so the audit reads closed bags only.
    async fn close_all(&self) {
        let store = bag::open_store(&self.url, &self.cfg).await.unwrap();
        // Writers may run up to `max_ahead` ahead of the clock (further
        // for a first write with this short grace: see the writer).
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
    }

    fn audit_cli(&self, server: &ServerProcess, extra_keys: &[&str]) -> std::process::Output {
        let mut args = vec![
            "audit", "--store", &self.url, "--log", &self.log, "--grace", "200ms", "--json",
        ];
        let mut keys = vec![server.public_key_hex.as_str()];
        keys.extend_from_slice(extra_keys);
        for k in &keys {
            args.push("--key");
            args.push(k);
        }
        server.cli(&args)
    }

    /// The stored messages, as the audit library reads them.
    async fn stored(&self, keys: &KeyRing) -> Vec<AuditMessage> {
        let store = bag::open_store(&self.url, &self.cfg).await.unwrap();
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
        AuditMessage::from_report(&report, &self.log)
    }
}

fn violations(out: &std::process::Output) -> Vec<String> {
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe_output(out)));
    v["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["kind"].as_str().unwrap().to_owned())
        .collect()
}

fn no_renew() -> LeaseOptions {
    LeaseOptions::default()
        .with_auto_renew(false)
        .with_safety_margin(Duration::from_millis(50))
}

#[tokio::test]
async fn a_clean_history_with_released_and_broken_leases_audits_clean() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let s = Setup::new();

    // A writes and releases with its watermark.
    let a = client.acquire(["acct"]).options(no_renew()).send().await.unwrap();
    let wa = s.write(&client, &a, "writer-a", 5).await;
    a.release(Some(wa.watermark(Micros::ZERO))).await.unwrap();
    // B writes and is abandoned: broken at its deadline. Its TTL leaves
    // room for a new writer's first write, which may wait up to its clock
    // margin (a second) for the first bag it may open, before the 500 ms
    // deadline margin.
    let b = client
        .acquire(["acct"])
        .ttl(Duration::from_secs(2))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    s.write(&client, &b, "writer-b", 3).await;
    // C takes it once B expired (the server waits), closes B's bags first
    // (its predecessor was broken: its writes may still land), writes and
    // releases.
    let c = client
        .acquire(["acct"])
        .wait(Duration::from_secs(5))
        .options(no_renew())
        .send()
        .await
        .unwrap();
    assert_eq!(c.names()[0].previous.ended, Ended::Broken);
    let until = c
        .close_before_reading()
        .expect("a broken predecessor is unsettled");
    let store = bag::open_store(&s.url, &s.cfg).await.unwrap();
    bag::close_logs_through(
        store.as_ref(),
        std::slice::from_ref(&s.log),
        until,
        &s.cfg,
        &AssumedExact(SystemClock),
    )
    .await
    .unwrap();
    c.settled_through(until);
    let wc = s.write(&client, &c, "writer-c", 4).await;
    let inherited = c.min_timestamp();
    c.release(Some(wc.watermark(inherited))).await.unwrap();
    s.close_all().await;

    let out = s.audit_cli(&server, &[]);
    assert!(out.status.success(), "{}", describe_output(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["messages"], 12);
    assert_eq!(v["leases"], 3);
    assert_eq!(v["longest_chain"], 3);
    assert!(violations(&out).is_empty());
}

/// Leases taken, renewed and released through a `Session` coalescer, whose
/// answers come in the lean form: the witnesses the client derived from
/// them are cited by the bags it writes, and `bagel audit` (the CLI, with
/// nothing but the stored bytes and the server's key) finds the chain
/// clean, each witness verifying as the full form would have carried it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bags_written_under_leases_from_lean_answers_audit_clean() {
    use bagel_client::{CoalesceOptions, Coalescer, Transport};
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let coalescer = Coalescer::new(
        client.clone(),
        CoalesceOptions::default().with_transport(Transport::Session),
    );
    let s = Setup::new();
    let mut written = 0;
    for (i, n) in [3, 4].into_iter().enumerate() {
        let lease = client
            .acquire(["lean-acct"])
            .options(no_renew())
            .via(&coalescer)
            .send()
            .await
            .unwrap();
        // The derived witness verifies offline and states the lease.
        let body = bagel_proto::verify_witness(&lease.witness().to_pb(), &client.keys()).unwrap();
        assert_eq!(
            (body.lease_id.as_str(), body.names[0].name.as_str()),
            (lease.id(), "lean-acct")
        );
        let writer = s.write(&client, &lease, &format!("lean-{i}"), n).await;
        // A renewal's witness, derived the same way, is what later batches cite.
        lease.renew().await.unwrap();
        writer
            .write(Bytes::from(format!("lean-{i}-renewed")))
            .await
            .unwrap();
        written += n + 1;
        let inherited = lease.min_timestamp();
        lease.release(Some(writer.watermark(inherited))).await.unwrap();
    }
    s.close_all().await;

    let out = s.audit_cli(&server, &[]);
    assert!(out.status.success(), "{}", describe_output(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["messages"], written);
    assert_eq!(v["leases"], 2);
    assert!(violations(&out).is_empty(), "{}", describe_output(&out));
}

#[tokio::test]
async fn two_servers_granting_one_name_are_caught() {
    let one = ServerProcess::start_ready(&[]).await;
    let two = ServerProcess::start_ready(&[]).await;
    let (c1, c2) = (one.client().await, two.client().await);
    let s = Setup::new();
    let l1 = c1.acquire(["acct"]).options(no_renew()).send().await.unwrap();
    let l2 = c2.acquire(["acct"]).options(no_renew()).send().await.unwrap();
    s.write(&c1, &l1, "writer-1", 2).await;
    s.write(&c2, &l2, "writer-2", 2).await;
    s.close_all().await;
    let out = s.audit_cli(&one, &[&two.public_key_hex]);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    assert!(
        violations(&out).contains(&"overlapping_grants".to_owned()),
        "{}",
        describe_output(&out)
    );
}

#[tokio::test]
async fn a_watermark_below_a_written_message_is_caught() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let s = Setup::new();
    let a = client.acquire(["acct"]).options(no_renew()).send().await.unwrap();
    let w = s.write(&client, &a, "writer-a", 3).await;
    // A buggy holder publishes a watermark below what it wrote (the lease
    // handle refuses to, so it goes around it).
    let low = w.max_written().unwrap().saturating_sub(Duration::from_micros(10));
    client
        .release_lease(a.lease_ref(), ReleaseOptions::default().with_watermark(low))
        .await
        .unwrap();
    drop(a);
    let b = client.acquire(["acct"]).options(no_renew()).send().await.unwrap();
    s.write(&client, &b, "writer-b", 1).await;
    s.close_all().await;
    let out = s.audit_cli(&server, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    assert_eq!(
        violations(&out),
        ["watermark_below_message"],
        "{}",
        describe_output(&out)
    );
}

#[tokio::test]
async fn tampered_witnesses_out_of_lease_timestamps_and_bad_signed_times_are_named() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let s = Setup::new();
    let a = client.acquire(["acct"]).options(no_renew()).send().await.unwrap();
    s.write(&client, &a, "writer-a", 1).await;
    s.close_all().await;
    let cfg = AuditConfig::new((*client.keys()).clone());
    let stored = s.stored(&client.keys()).await;
    assert_eq!(stored.len(), 1);
    assert!(audit(&stored, &cfg).is_clean());
    let real = &stored[0];

    let kinds = |m: AuditMessage| -> Vec<ViolationKind> {
        audit(&[m], &cfg).violations.iter().map(|v| v.kind).collect()
    };
    // One flipped byte in the stored witness.
    let mut flipped = real.clone();
    let mut w = flipped.witnesses[0].clone();
    let mut body = w.body.to_vec();
    body[7] ^= 0x01;
    w.body = body.into();
    flipped.witnesses = Arc::from(vec![w]);
    assert_eq!(kinds(flipped), [ViolationKind::BadWitnessSignature]);
    // Back-dated below the lease's min_timestamp (here 0, the first
    // lease of a name on a server that skipped its restart wait): also in
    // the wrong bag and far behind its signed time.
    let mut early = real.clone();
    early.timestamp = a.min_timestamp();
    assert_eq!(
        kinds(early),
        [
            ViolationKind::WrongBag,
            ViolationKind::BehindSignedTime,
            ViolationKind::BeforeMinTimestamp
        ]
    );
    // Dated at the lease's deadline (with a signed time to match, so only
    // the deadline rule fires).
    let mut late = real.clone();
    late.timestamp = a.deadline();
    assert!(kinds(late).contains(&ViolationKind::AtOrAfterDeadline));
    // A signed time that does not verify (another key).
    let mut forged = real.clone();
    forged.signed_time = Some(Arc::new(sign_local_time(
        &Signer::generate(),
        "x",
        real.timestamp,
        0,
    )));
    assert_eq!(kinds(forged), [ViolationKind::BadSignedTime]);
}
