//! The safety promise under the races a review found, against the real
//! server: a witness is always cited with the deadline it states, what is
//! unsettled travels down a name's chain, a release publishes what was
//! written and ends the rights at once, and a write whose outcome is
//! unknown makes the next holder close before it reads.

use std::sync::Arc;
use std::time::Duration;

use bagel_bags::store::faults::AppendsThrough;
use bagel_bags::{self as bag, BagConfig, BagStore, ReadOptions, Writer};
use bagel_client::{Client, Ended, Error, Lease, LeaseOptions, Micros, TimeOptions, TimeSource};
use bagel_proto::clock::{AssumedExact, SystemClock};
use bagel_tests::{ServerProcess, unique};
use bytes::Bytes;
use tokio::sync::oneshot;

fn posix_store(dir: &std::path::Path) -> Arc<dyn BagStore> {
    Arc::new(bag::store::directory::DirectoryStore::local(dir, false))
}

fn writer(client: &Client, lease: &Lease, store: Arc<dyn BagStore>, log: &str, cfg: &BagConfig) -> Writer {
    let time = TimeSource::lease_server(client.clone(), TimeOptions::default());
    Writer::new(
        store,
        log,
        &unique("w"),
        lease.rights(),
        Arc::new(SystemClock),
        Arc::new(time),
        cfg.clone(),
    )
    .unwrap()
}

/// Renewals race each other and the writes; whatever lands last, every
/// acknowledged message cites a witness whose bounds hold it, so a reader
/// accepts every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_racing_writes_never_pair_a_witness_with_another_deadline() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = BagConfig::default()
        .with_grace(Duration::from_millis(200))
        .with_clock_tolerance(Duration::from_millis(100))
        .with_deadline_margin(Duration::from_millis(1));
    let lease = Arc::new(
        client
            .acquire(["race"])
            .ttl(Duration::from_millis(60))
            .options(
                LeaseOptions::default()
                    .with_renew_every(Duration::from_millis(3))
                    .with_safety_margin(Duration::from_millis(1)),
            )
            .send()
            .await
            .unwrap(),
    );
    let log = unique("log");
    let w = writer(&client, &lease, posix_store(dir.path()), &log, &cfg);
    // A second renewer beside the handle's own loop.
    let renewer = tokio::spawn({
        let lease = Arc::clone(&lease);
        async move {
            for _ in 0..300 {
                let _ = lease.renew().await;
            }
        }
    });
    let (mut acked, mut first_error) = (0, None);
    for i in 0..300 {
        match w.write(Bytes::from(format!("m{i}"))).await {
            Ok(_) => acked += 1,
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    renewer.await.unwrap();
    assert!(acked > 0, "nothing was written: {first_error:?}");
    let store = posix_store(dir.path());
    bag::close_through(
        store.as_ref(),
        &log,
        Micros::now(),
        &cfg,
        &AssumedExact(SystemClock),
    )
    .await
    .unwrap();
    let opts = ReadOptions::default().with_keys(Some((*client.keys()).clone()));
    let r = bag::read(store.as_ref(), &log, &opts, &cfg, &AssumedExact(SystemClock))
        .await
        .unwrap();
    assert!(
        r.rejected.is_empty(),
        "acknowledged, then rejected: {:?}",
        r.rejected[0]
    );
    assert_eq!(r.messages.len(), acked);
}

/// A broken, then B takes the name and releases without closing A's bags:
/// C, though its immediate predecessor released, must still close them.
/// Once a holder has closed them, the next one need not.
#[tokio::test]
async fn a_broken_lease_behind_a_released_one_still_unsettles_the_next_holder() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let no_renew = LeaseOptions::default().with_auto_renew(false);
    let a = client
        .acquire(["chain"])
        .ttl(Duration::from_millis(300))
        .options(no_renew.clone())
        .send()
        .await
        .unwrap();
    let a_deadline = a.deadline();
    drop(a); // walks away: broken at its deadline
    // The server wakes B when A's deadline passes.
    let b = client
        .acquire(["chain"])
        .wait(Duration::from_secs(5))
        .options(no_renew.clone())
        .send()
        .await
        .unwrap();
    let unsettled = Micros::from_micros(a_deadline.as_micros() + 1);
    assert_eq!(b.close_before_reading(), Some(unsettled));
    b.release(None).await.unwrap();
    let c = client
        .acquire(["chain"])
        .options(no_renew.clone())
        .send()
        .await
        .unwrap();
    let prev = c.names()[0].previous.clone();
    assert_eq!(prev.ended, Ended::Released);
    assert_eq!(
        c.close_before_reading(),
        Some(unsettled),
        "A's bags are still unsettled two holders on"
    );
    // C closes them, and says so in its release.
    let dir = tempfile::tempdir().unwrap();
    let cfg = BagConfig::default().with_grace(Duration::from_millis(100));
    let store = posix_store(dir.path());
    let until = c.close_before_reading().unwrap();
    bag::close_logs_through(
        store.as_ref(),
        &["l".to_owned()],
        until,
        &cfg,
        &AssumedExact(SystemClock),
    )
    .await
    .unwrap();
    c.settled_through(until);
    c.release(None).await.unwrap();
    let d = client.acquire(["chain"]).options(no_renew).send().await.unwrap();
    assert_eq!(d.close_before_reading(), None);
}

/// The rights a lease hands a writer end when its release begins, and the
/// release publishes at least what was written; a lower watermark is
/// refused.
#[tokio::test]
async fn a_release_publishes_what_was_written_and_ends_the_rights() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = BagConfig::default();
    let lease = client.acquire(["wm"]).send().await.unwrap();
    let rights = lease.rights();
    let w = writer(&client, &lease, posix_store(dir.path()), "log", &cfg);
    let stamps = w
        .write_batch(vec![Bytes::from("a"), Bytes::from("b")])
        .await
        .unwrap();
    let top = stamps[1];
    // Explicitly lower than what was written: refused.
    let err = lease
        .release(Some(top.saturating_sub(Duration::from_micros(10))))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::WatermarkBelowWritten { .. }), "{err:?}");

    // The refused release consumed the handle without releasing; the name
    // is still held. Take a fresh lease on another name for the rest.
    let lease = client.acquire(["wm2"]).send().await.unwrap();
    let rights2 = lease.rights();
    let w = writer(&client, &lease, posix_store(dir.path()), "log2", &cfg);
    let top = w.write(Bytes::from("c")).await.unwrap();
    assert!(rights2.snapshot().is_ok());
    // Released without a watermark: the server stores what was written.
    let stored = lease.release(None).await.unwrap();
    assert!(stored >= top, "stored {stored}, wrote {top}");
    assert!(rights2.snapshot().is_err(), "rights outlived the release");
    let err = w.write(Bytes::from("after")).await.unwrap_err();
    assert!(
        matches!(err, bag::Error::NoRights { .. } | bag::Error::WritesClosed),
        "{err:?}"
    );
    let next = client.acquire(["wm2"]).send().await.unwrap();
    assert!(next.min_timestamp() >= top);
    drop(rights);
}

/// A store whose one append lands only when the test says so, while the
/// writer is told it timed out: a PUT whose answer was lost, a write stuck
/// in a blocking call.
fn late_landing(
    inner: Arc<dyn BagStore>,
    land: oneshot::Receiver<()>,
    landed: oneshot::Sender<()>,
) -> Arc<dyn BagStore> {
    let once = std::sync::Mutex::new(Some((land, landed)));
    Arc::new(AppendsThrough::new(inner, move |inner, append| {
        let (go, done) = once.lock().unwrap().take().expect("one late append");
        tokio::spawn(async move {
            let _ = go.await;
            let _ = append.to(&*inner).await;
            let _ = done.send(());
        });
        Box::pin(async {
            Err(bag::Error::Timeout {
                op: "append".into(),
                after: Duration::ZERO,
            })
        })
    }))
}

/// A write that returned an error may still land after the release. The
/// release says its bags are unsettled, so the next holder closes them
/// before reading: whether the write made it in or not, every reader then
/// agrees, and the next holder writes above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_of_unknown_outcome_makes_the_next_holder_close_first() {
    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = BagConfig::default().with_grace(Duration::from_millis(200));
    let log = "ledger";
    let (go, land) = oneshot::channel();
    let (landed_tx, landed) = oneshot::channel();
    let late = late_landing(posix_store(dir.path()), land, landed_tx);
    let a = client.acquire(["acct"]).send().await.unwrap();
    let w = writer(&client, &a, late, log, &cfg);
    let err = w.write(Bytes::from("maybe")).await.unwrap_err();
    assert!(matches!(err, bag::Error::Timeout { .. }), "{err:?}");
    let maybe_ts = w.max_written().unwrap();
    assert!(a.written().uncertain);
    let stored = a.release(None).await.unwrap();
    assert!(stored >= maybe_ts, "the watermark covers the write in doubt");

    let b = client.acquire(["acct"]).send().await.unwrap();
    let until = b.close_before_reading().expect("the release was unsettled");
    assert!(until > maybe_ts);
    // The write lands now, after the release, before B closes.
    go.send(()).unwrap();
    landed.await.unwrap();
    let store = posix_store(dir.path());
    bag::close_logs_through(
        store.as_ref(),
        &[log.to_owned()],
        until,
        &cfg,
        &AssumedExact(SystemClock),
    )
    .await
    .unwrap();
    b.settled_through(until);
    let opts = ReadOptions::default().with_keys(Some((*client.keys()).clone()));
    let first = bag::read(store.as_ref(), log, &opts, &cfg, &AssumedExact(SystemClock))
        .await
        .unwrap();
    let second = bag::read(store.as_ref(), log, &opts, &cfg, &AssumedExact(SystemClock))
        .await
        .unwrap();
    assert_eq!(first.messages, second.messages);
    assert!(first.rejected.is_empty(), "{:?}", first.rejected);
    assert!(b.min_timestamp() >= maybe_ts);
}
