use std::time::Duration;

use bagel_proto::clock::ManualClock;
use bagel_proto::{Micros, pb};
use bytes::Bytes;
use prost::Message as _;

use std::sync::Arc;

use super::{Message, ReadOptions, ReadReport, read};
use crate::frame::{self, Frame};
use crate::seal::Span;
use crate::store::directory::DirectoryStore;
use crate::{BagConfig, BagStore, Bucket};

fn secs(s: u64) -> Micros {
    Micros::from_micros(s * 1_000_000)
}

/// A read can be spawned: it holds nothing that is not `Send` across
/// its awaits.
#[test]
fn a_read_is_send() {
    fn send<T: Send>(_: &T) {}
    let dir = tempfile::tempdir().unwrap();
    let store = DirectoryStore::local(dir.path(), false);
    let clock = bagel_proto::clock::AssumedExact(ManualClock::new(secs(1)));
    let (opts, cfg) = (ReadOptions::default(), BagConfig::default());
    send(&read(&store, "log", &opts, &cfg, &clock));
}

#[tokio::test]
async fn sealing_reaches_back_only_as_far_as_the_lookback() {
    let dir = tempfile::tempdir().unwrap();
    let store = DirectoryStore::local(dir.path(), false);
    let cfg = BagConfig::default();
    // 20 s into a minute: the minute before is past due (its last
    // second closed at -18 s), this one is not.
    let now = 2_000_000_000;
    assert_eq!(now % 60, 20);
    let clock = bagel_proto::clock::AssumedExact(ManualClock::new(secs(now)));
    store
        .mark_log_start("log", Bucket::from_secs(now - 100))
        .await
        .unwrap();
    let opts = ReadOptions::default().with_max_seal_lookback(Duration::from_secs(60));
    // -100 s ..= -81 s of the minute from -140 s are beyond the 60 s
    // lookback: refused, nothing sealed.
    let err = read(&store, "log", &opts, &cfg, &clock).await.unwrap_err();
    match err {
        crate::Error::SealTooFar { first, missing, .. } => {
            assert_eq!((first, missing), (Bucket::from_secs(now - 100), 20));
        }
        e => panic!("{e}"),
    }
    let old = Span::of(Bucket::from_secs(now - 100));
    assert_eq!(crate::seal::seal_of(&store, "log", old).await.unwrap(), None);
    // From within the lookback: the minute before is sealed by one
    // object (39 of its seconds are in range), and the past-due seconds
    // of this minute (-20 s ..= -3 s) are closed one by one.
    let later = opts.clone().with_range(secs(now - 59), Micros::MAX);
    let r = read(&store, "log", &later, &cfg, &clock).await.unwrap();
    assert_eq!(r.sealed, 39 + 18);
    let before = Span::of(Bucket::from_secs(now - 59));
    let seal = crate::seal::seal_of(&store, "log", before)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seal.empty_seconds(), 60);
    assert!(!dir.path().join("log").join(before.first().path()).exists());
    // A longer lookback seals the old minute too.
    let wide = opts.with_max_seal_lookback(Duration::from_secs(200));
    let r = read(&store, "log", &wide, &cfg, &clock).await.unwrap();
    assert_eq!(r.sealed, 20);
    assert!(crate::seal::seal_of(&store, "log", old).await.unwrap().is_some());
    // Sealed once, read again: nothing more to seal.
    assert_eq!(read(&store, "log", &wide, &cfg, &clock).await.unwrap().sealed, 0);
}

/// Holder keys are decompressed once per read and rebuilt batches are
/// not decoded again, yet every batch is still checked on its own: one
/// altered among many of several writers (each with its own lease and
/// holder key) is the one rejected, named by its writer, sequence and
/// bag, whether read from the bags or from a summary of them.
#[tokio::test]
async fn a_tampered_batch_among_many_is_named_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn BagStore> = Arc::new(DirectoryStore::local(dir.path(), false));
    let cfg = BagConfig::default();
    let t0 = secs(1_800_000_000);
    let clock = ManualClock::new(t0);
    let leases = crate::testing::TestLeases::default();
    leases
        .write_busy_stretch(&store, "log", 4, &clock, t0, &cfg)
        .await;
    // Alter the 4th batch w2 wrote in the third second: same length,
    // a valid frame, the holder signature left as it was.
    let bag = Bucket::of(t0.saturating_add(Duration::from_secs(2)));
    let bag_dir = dir.path().join("log").join(bag.path());
    let file = std::fs::read_dir(&bag_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("w2.") && name.ends_with(".log")
        })
        .unwrap();
    let bytes = Bytes::from(std::fs::read(&file).unwrap());
    let mut out = Vec::new();
    let mut forged_sequence = None;
    for (i, f) in frame::decode(&bytes).into_iter().enumerate() {
        let Frame::Record { body, .. } = f else {
            panic!("not a whole record");
        };
        let mut batch = pb::Batch::decode(body).unwrap();
        if i == 3 {
            batch.entries[0].payload = b"deposit 99".to_vec();
            forged_sequence = Some(batch.first_sequence);
        }
        out.extend_from_slice(&frame::encode(&batch.encode_to_vec()));
    }
    assert_eq!(out.len(), bytes.len());
    std::fs::write(&file, out).unwrap();
    let forged_sequence = forged_sequence.expect("w2 wrote 10 batches in that second");

    let span = Span::of(Bucket::of(t0));
    clock.set(span.close_time(cfg.grace));
    let checked = bagel_proto::clock::AssumedExact(clock.clone());
    let opts = ReadOptions::default()
        .with_range(t0, t0.saturating_add(Duration::from_secs(60)))
        .with_keys(Some(leases.keys()));
    let check = |r: &ReadReport| {
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert_eq!(r.messages.len(), 199);
        assert!(r.messages.iter().all(Message::verified));
        let [rejected] = r.rejected.as_slice() else {
            panic!("{:?}", r.rejected);
        };
        let m = &rejected.message;
        assert_eq!(
            (m.writer_id.as_str(), m.sequence, m.bucket, &m.payload[..]),
            ("w2", forged_sequence, bag, &b"deposit 99"[..])
        );
        assert!(
            rejected
                .reason
                .contains("holder signature for lease lease-2 does not verify"),
            "{}",
            rejected.reason
        );
    };
    let from_bags = read(
        store.as_ref(),
        "log",
        &opts.clone().with_summaries(false),
        &cfg,
        &checked,
    )
    .await
    .unwrap();
    check(&from_bags);
    crate::summary::summarize(store.as_ref(), "log", crate::summary::Stretch::new(span, 1))
        .await
        .unwrap();
    let from_summary = read(store.as_ref(), "log", &opts, &cfg, &checked).await.unwrap();
    assert_eq!(from_summary.summaries_read, 1);
    check(&from_summary);
    assert_eq!(from_summary.messages, from_bags.messages);
    assert_eq!(from_summary.rejected, from_bags.rejected);
}
