//! Attested summaries on a real store: what a reader who trusts the
//! summarizer gets, and everything it must not get.

use std::sync::Arc;
use std::time::Duration;

use bagel_proto::clock::{AssumedExact, ManualClock};
use bagel_proto::{KeyRing, Micros, Signer, pb};
use bytes::Bytes;
use prost::Message as _;

use super::attest::{self, Attested, Attester};
use super::{Stretch, summarize_attested};
use crate::frame::{self, Frame};
use crate::reader::{Message, ReadOptions, ReadReport, Vouched, read};
use crate::seal::Span;
use crate::store::directory::DirectoryStore;
use crate::{BagConfig, BagStore, Bucket, ProblemKind};

const LOG: &str = "log";

struct Fixture {
    dir: tempfile::TempDir,
    store: Arc<dyn BagStore>,
    leases: crate::testing::TestLeases,
    clock: ManualClock,
    cfg: BagConfig,
    t0: Micros,
    stretch: Stretch,
}

impl Fixture {
    /// 4 writers (each its own lease and holder key), 10 batches a second
    /// each for 5 s; the minute then past its close time, not yet sealed.
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn BagStore> = Arc::new(DirectoryStore::local(dir.path(), false));
        let cfg = BagConfig::default();
        let t0 = Micros::from_micros(1_800_000_000 * 1_000_000);
        let clock = ManualClock::new(t0);
        let leases = crate::testing::TestLeases::default();
        leases.write_busy_stretch(&store, LOG, 4, &clock, t0, &cfg).await;
        let span = Span::of(Bucket::of(t0));
        clock.set(span.close_time(cfg.grace));
        Fixture {
            dir,
            store,
            leases,
            clock,
            cfg,
            t0,
            stretch: Stretch::new(span, 1),
        }
    }

    fn attester(&self, seed: u8) -> Attester {
        Attester {
            signer: Signer::from_secret(&[seed; 32]),
            keys: self.leases.keys(),
            roughtime_keys: Vec::new(),
        }
    }

    async fn summarize(&self, attester: Option<&Attester>) -> super::Summarized {
        crate::seal::seal(self.store.as_ref(), LOG, self.stretch.first)
            .await
            .unwrap();
        summarize_attested(self.store.as_ref(), LOG, self.stretch, attester)
            .await
            .unwrap()
    }

    fn opts(&self) -> ReadOptions {
        ReadOptions::default()
            .with_range(self.t0, self.t0.saturating_add(Duration::from_secs(60)))
            .with_keys(Some(self.leases.keys()))
    }

    async fn read(&self, opts: &ReadOptions) -> ReadReport {
        read(
            self.store.as_ref(),
            LOG,
            opts,
            &self.cfg,
            &AssumedExact(self.clock.clone()),
        )
        .await
        .unwrap()
    }

    async fn read_bags(&self) -> ReadReport {
        self.read(&self.opts().with_summaries(false)).await
    }

    /// Replaces a published object (as someone with write access to the
    /// store could).
    async fn replace(&self, name: &str, bytes: Bytes) {
        self.store.remove_named(LOG, name).await.unwrap();
        assert_eq!(self.store.put_first(LOG, name, bytes).await.unwrap(), None);
    }
}

fn trusting(keys: &[&Attester]) -> KeyRing {
    keys.iter().map(|a| a.signer.verifying_key()).collect()
}

/// The messages with how they were vouched for left out.
fn plain(messages: &[Message]) -> Vec<Message> {
    messages
        .iter()
        .map(|m| Message {
            vouched: Vouched::Checked,
            ..m.clone()
        })
        .collect()
}

/// A summary a trusted summarizer attested reads as the same messages,
/// byte for byte, as its bags, every one marked with the summarizer's key
/// id; without trust, the same read checks everything as before.
#[tokio::test]
async fn a_trusted_attestation_gives_the_same_messages_as_the_bags() {
    let f = Fixture::new().await;
    let t = f.attester(1);
    let done = f.summarize(Some(&t)).await;
    let Some(Attested::Published {
        created: true,
        key_id,
        ..
    }) = &done.attestation
    else {
        panic!("{:?}", done.attestation);
    };
    assert_eq!(key_id, t.signer.key_id());

    let bags = f.read_bags().await;
    assert_eq!(bags.messages.len(), 200);
    assert!(bags.messages.iter().all(Message::verified));
    let trusted = f.read(&f.opts().with_trusted_summarizers(trusting(&[&t]))).await;
    assert_eq!((trusted.summaries_read, trusted.summaries_attested), (1, 1));
    assert!(trusted.problems.is_empty(), "{:?}", trusted.problems);
    assert!(trusted.rejected.is_empty());
    assert_eq!(plain(&trusted.messages), bags.messages);
    assert!(trusted.messages.iter().all(|m| m.verified()
        && m.vouched
            == Vouched::Attested {
                key_id: Arc::from(t.signer.key_id())
            }));
    // Trusting another key, or nobody: read from the summary, all checked.
    for opts in [
        f.opts().with_trusted_summarizers(trusting(&[&f.attester(2)])),
        f.opts(),
    ] {
        let r = f.read(&opts).await;
        assert_eq!((r.summaries_read, r.summaries_attested), (1, 0));
        assert_eq!(r.messages, bags.messages);
    }
}

/// A forged summary (well formed, one payload changed) attested by a key
/// the reader does not trust is read with every check: the changed batch
/// is rejected, as from the bags. Trusting the forger's key is trusting
/// it: its batches are not verified. The audit names the key that vouched
/// for a summary that does not match its bags, and retention does not take
/// the attestation for a check: the bags stay.
#[tokio::test]
async fn a_forged_summary_attested_by_an_untrusted_key_is_checked_in_full() {
    let f = Fixture::new().await;
    let honest = f.attester(1);
    f.summarize(Some(&honest)).await;
    let mut forged = super::build(f.store.as_ref(), LOG, f.stretch).await.unwrap();
    let batch = &mut forged.bags[2].items[0].batches[3];
    batch.payloads[0] = Bytes::from_static(b"deposit 99");
    let forged = Bytes::from(forged.encode_to_vec());
    f.replace(&f.stretch.name(), forged.clone()).await;
    let forger = f.attester(9);
    let att = attest::encode(&forger.signer, LOG, f.stretch, 2, &attest::digest(&forged));
    assert_eq!(
        f.store
            .put_first(LOG, &attest::name(f.stretch, forger.signer.key_id()), att)
            .await
            .unwrap(),
        None
    );

    let checked = f
        .read(&f.opts().with_trusted_summarizers(trusting(&[&honest])))
        .await;
    assert_eq!(checked.summaries_attested, 0);
    assert_eq!(checked.messages.len(), 199);
    let [rejected] = checked.rejected.as_slice() else {
        panic!("{:?}", checked.rejected);
    };
    assert_eq!(&rejected.message.payload[..], b"deposit 99");
    assert!(rejected.reason.contains("does not verify"), "{}", rejected.reason);
    // The honest key's attestation is not over these bytes: reported.
    let [problem] = checked.problems.as_slice() else {
        panic!("{:?}", checked.problems);
    };
    assert_eq!(problem.kind, ProblemKind::Attestation);
    assert!(problem.item.contains(honest.signer.key_id()), "{}", problem.item);

    let trusting_forger = f
        .read(&f.opts().with_trusted_summarizers(trusting(&[&forger])))
        .await;
    assert_eq!(trusting_forger.summaries_attested, 1);
    assert!(trusting_forger.rejected.is_empty());
    assert!(
        trusting_forger
            .messages
            .iter()
            .any(|m| &m.payload[..] == b"deposit 99")
    );

    let first = f.stretch.from();
    let audit = crate::audit::audit_summaries(f.store.as_ref(), LOG, first, f.stretch.last())
        .await
        .unwrap();
    assert_eq!(audit.attestations_checked, 2);
    let bad: Vec<&str> = audit
        .violations
        .iter()
        .filter(|v| v.kind == crate::audit::ViolationKind::BadAttestation)
        .map(|v| v.detail.as_str())
        .collect();
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(bad.iter().any(|d| d.contains(&format!(
        "key {} attests a summary that does not match its source bags",
        forger.signer.key_id()
    ))));
    assert!(
        bad.iter()
            .any(|d| d.contains(honest.signer.key_id()) && d.contains("SHA-256"))
    );
    assert!(
        audit
            .violations
            .iter()
            .any(|v| v.kind == crate::audit::ViolationKind::SummaryMismatch)
    );

    let now = f.stretch.last().end().saturating_add(Duration::from_secs(7200));
    let hour = Duration::from_secs(3600);
    let r = crate::retain::retain_within(f.store.as_ref(), LOG, now, hour, Some(hour), hour)
        .await
        .unwrap();
    assert_eq!((r.bags_removed, r.summaries_removed, r.kept.len()), (0, 0, 1));
    assert_eq!(attest::list(f.store.as_ref(), LOG).await.unwrap().len(), 2);
}

/// An attestation by a trusted key that is not over the summary's bytes,
/// or whose signature does not verify, is reported as a problem of the
/// read, and the summary is read with every check.
#[tokio::test]
async fn a_trusted_attestation_that_does_not_hold_is_reported_and_not_used() {
    let f = Fixture::new().await;
    let t = f.attester(1);
    f.summarize(Some(&t)).await;
    let bags = f.read_bags().await;
    let name = attest::name(f.stretch, t.signer.key_id());
    let good = f.store.get_named(LOG, &name, 1 << 16).await.unwrap().unwrap();
    let mut bad_sig = good.to_vec();
    *bad_sig.last_mut().unwrap() ^= 1;
    for (bad, says) in [
        (attest::encode(&t.signer, LOG, f.stretch, 2, &[0; 32]), "SHA-256"),
        (Bytes::from(bad_sig), "does not verify"),
    ] {
        f.replace(&name, bad).await;
        let r = f.read(&f.opts().with_trusted_summarizers(trusting(&[&t]))).await;
        assert_eq!((r.summaries_read, r.summaries_attested), (1, 0));
        let [problem] = r.problems.as_slice() else {
            panic!("{:?}", r.problems);
        };
        assert_eq!((problem.kind, &problem.item), (ProblemKind::Attestation, &name));
        assert!(problem.what.contains(says), "{}", problem.what);
        assert_eq!(r.messages, bags.messages);
        assert!(r.messages.iter().all(|m| m.vouched == Vouched::Checked));
    }
}

/// The same key over the same summary gives the same bytes: a second
/// summarizer with that key finds its attestation published and succeeds;
/// another key publishes its own beside it.
#[tokio::test]
async fn attestations_are_deterministic_and_create_only() {
    let f = Fixture::new().await;
    let t = f.attester(1);
    f.summarize(Some(&t)).await;
    let name = attest::name(f.stretch, t.signer.key_id());
    let first = f.store.get_named(LOG, &name, 1 << 16).await.unwrap().unwrap();
    let stored = super::stored_bytes(f.store.as_ref(), LOG, f.stretch)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        first,
        attest::encode(&t.signer, LOG, f.stretch, 2, &attest::digest(&stored))
    );
    let again = f.summarize(Some(&f.attester(1))).await;
    assert_eq!(
        again.attestation,
        Some(Attested::Published {
            name: name.clone(),
            key_id: t.signer.key_id().to_owned(),
            created: false
        })
    );
    assert!(!again.created);
    let other = f.summarize(Some(&f.attester(2))).await;
    assert!(matches!(
        other.attestation,
        Some(Attested::Published { created: true, .. })
    ));
    assert_eq!(attest::list(f.store.as_ref(), LOG).await.unwrap().len(), 2);
    assert_eq!(
        f.store.get_named(LOG, &name, 1 << 16).await.unwrap().unwrap(),
        first
    );
}

/// A summarizer attests nothing it could not verify: a bag with an
/// altered batch is summarized (readers reject that batch) but not
/// attested, and the refusal names the batch.
#[tokio::test]
async fn a_summary_with_a_bad_signature_is_not_attested() {
    let f = Fixture::new().await;
    let bag = Bucket::of(f.t0.saturating_add(Duration::from_secs(2)));
    let bag_dir = f.dir.path().join(LOG).join(bag.path());
    let file = std::fs::read_dir(&bag_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("w1.") && name.ends_with(".log")
        })
        .unwrap();
    let bytes = Bytes::from(std::fs::read(&file).unwrap());
    let mut out = Vec::new();
    for (i, fr) in frame::decode(&bytes).into_iter().enumerate() {
        let Frame::Record { body, .. } = fr else {
            panic!("not a whole record");
        };
        let mut batch = pb::Batch::decode(body).unwrap();
        if i == 5 {
            batch.entries[0].payload = b"deposit 99".to_vec();
        }
        out.extend_from_slice(&frame::encode(&batch.encode_to_vec()));
    }
    std::fs::write(&file, out).unwrap();
    let done = f.summarize(Some(&f.attester(1))).await;
    let Some(Attested::Refused { reason, .. }) = &done.attestation else {
        panic!("{:?}", done.attestation);
    };
    assert!(
        reason.contains(&format!("bag {bag} writer \"w1\"")) && reason.contains("does not verify"),
        "{reason}"
    );
    assert!(attest::list(f.store.as_ref(), LOG).await.unwrap().is_empty());
}

/// Retention removes an attestation only together with its summary:
/// removing the bags leaves both (and a trusted read still uses them).
#[tokio::test]
async fn retention_removes_attestations_only_with_their_summary() {
    let f = Fixture::new().await;
    let t = f.attester(1);
    f.summarize(Some(&t)).await;
    let bags = f.read_bags().await;
    let hour = Duration::from_secs(3600);
    let end = f.stretch.last().end();
    let r = crate::retain::retain_within(
        f.store.as_ref(),
        LOG,
        end.saturating_add(hour),
        hour,
        Some(2 * hour),
        hour,
    )
    .await
    .unwrap();
    assert_eq!(
        (r.bags_removed, r.summaries_removed, r.attestations_removed),
        (5, 0, 0)
    );
    assert_eq!(attest::list(f.store.as_ref(), LOG).await.unwrap().len(), 1);
    let trusted = f.read(&f.opts().with_trusted_summarizers(trusting(&[&t]))).await;
    assert_eq!(trusted.summaries_attested, 1);
    assert_eq!(plain(&trusted.messages), bags.messages);
    let r = crate::retain::retain_within(
        f.store.as_ref(),
        LOG,
        end.saturating_add(2 * hour),
        hour,
        Some(2 * hour),
        hour,
    )
    .await
    .unwrap();
    assert_eq!((r.summaries_removed, r.attestations_removed), (1, 1));
    assert!(attest::list(f.store.as_ref(), LOG).await.unwrap().is_empty());
    assert!(super::list(f.store.as_ref(), LOG).await.unwrap().is_empty());
}

/// The data file of `writer` in `bag` (its name in the bag).
fn data_file(f: &Fixture, bag: Bucket, writer: &str) -> String {
    std::fs::read_dir(f.dir.path().join(LOG).join(bag.path()))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with(&format!("{writer}.")) && n.ends_with(".log"))
        .unwrap()
}

/// Lists `name` (a file of the closed `bag`, copied there from `from`, or
/// already there) in its lock once more.
fn list_again(f: &Fixture, bag: Bucket, name: &str, from: Option<(Bucket, &str)>) {
    let dir = f.dir.path().join(LOG).join(bag.path());
    if let Some((src, src_name)) = from {
        let src = f.dir.path().join(LOG).join(src.path()).join(src_name);
        std::fs::copy(src, dir.join(name)).unwrap();
    }
    let lock = dir.join("lock");
    let mut listing = crate::Listing::decode(&std::fs::read(&lock).unwrap()).unwrap();
    listing.items.push(crate::ListedItem {
        name: name.to_owned(),
        size: std::fs::metadata(dir.join(name)).unwrap().len(),
        etag: None,
    });
    std::fs::write(&lock, listing.encode()).unwrap();
}

/// Read on a trusted summarizer's word, an attested summary's batches are
/// not rebuilt, yet copies and misplaced batches are found and reported
/// exactly as from the bags (the same problems, offsets and all, the same
/// messages and rejections): a data file listed twice, one copied under
/// another name, one copied into an earlier bag (misplaced there, and its
/// original then a copy), one copied into a bag of the next minute (not
/// summarized: a copy of a batch read from the summary), over the whole
/// range and over part of it; and the same with a damaged item (read as
/// a bag's item, vouched for).
#[tokio::test]
async fn a_trusted_read_finds_copies_and_misplaced_batches_as_the_bags_do() {
    for damaged in [false, true] {
        let f = Fixture::new().await;
        let at = |s: u64| Bucket::of(f.t0.saturating_add(Duration::from_secs(s)));
        for s in 0..5 {
            f.store.close(LOG, at(s)).await.unwrap();
        }
        let w0 = data_file(&f, at(1), "w0");
        list_again(&f, at(1), &w0, None);
        let w1 = data_file(&f, at(2), "w1");
        list_again(&f, at(2), "copy.0.log", Some((at(2), &w1)));
        let w3 = data_file(&f, at(4), "w3");
        list_again(&f, at(3), "moved.0.log", Some((at(4), &w3)));
        if damaged {
            let w2 = data_file(&f, at(0), "w2");
            let file = f.dir.path().join(LOG).join(at(0).path()).join(&w2);
            let mut bytes = std::fs::read(&file).unwrap();
            let n = bytes.len();
            bytes[n - 3] ^= 0xff;
            std::fs::write(&file, bytes).unwrap();
        }
        // A closed bag of the next minute (not summarized) holding a copy.
        let late = at(61);
        let dir = f.dir.path().join(LOG).join(late.path());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("prelock"), b"").unwrap();
        std::fs::write(dir.join("lock"), crate::Listing::default().encode()).unwrap();
        let w2 = data_file(&f, at(2), "w2");
        list_again(&f, late, "late.0.log", Some((at(2), &w2)));

        let t = f.attester(1);
        let done = f.summarize(Some(&t)).await;
        assert!(
            matches!(done.attestation, Some(Attested::Published { .. })),
            "{:?}",
            done.attestation
        );
        let until = f.t0.saturating_add(Duration::from_secs(62));
        let ranges = [
            (f.t0, until),
            (
                f.t0.saturating_add(Duration::from_millis(1_450)),
                f.t0.saturating_add(Duration::from_millis(3_650)),
            ),
        ];
        for (from, to) in ranges {
            let opts = f.opts().with_range(from, to);
            let bags = f.read(&opts.clone().with_summaries(false)).await;
            let checked = f.read(&opts).await;
            let before = crate::reader::VOUCHED_BAGS_READ.with(|n| n.get());
            let trusted = f
                .read(&opts.clone().with_trusted_summarizers(trusting(&[&t])))
                .await;
            let fast = crate::reader::VOUCHED_BAGS_READ.with(|n| n.get()) - before;
            assert_eq!(trusted.summaries_attested, 1);
            // Every summarized bag in range is read without rebuilding
            // (a damaged item is read as a bag's).
            let in_range = (Bucket::of(from).secs()..=Bucket::of(to).secs().min(at(4).secs()))
                .filter(|s| *s <= at(4).secs())
                .count() as u64;
            assert_eq!(fast, in_range, "{from}..{to}");
            let kinds: Vec<ProblemKind> = bags.problems.iter().map(|p| p.kind).collect();
            if from == f.t0 {
                let dups = kinds.iter().filter(|k| **k == ProblemKind::Duplicate).count();
                // w0 listed twice (10 batches), w1's copy (10), w3's
                // original after its copy (10), w2's late copy (10).
                assert_eq!(dups, 40, "{kinds:?}");
                assert_eq!(kinds.iter().filter(|k| **k == ProblemKind::Misplaced).count(), 10);
                assert_eq!(bags.rejected.len(), 10);
                assert_eq!(
                    kinds.iter().filter(|k| **k == ProblemKind::Damaged).count(),
                    usize::from(damaged)
                );
            }
            for r in [&checked, &trusted] {
                assert_eq!(r.problems, bags.problems);
                assert_eq!(plain(&r.messages), bags.messages);
                let rejected = |r: &ReadReport| {
                    r.rejected
                        .iter()
                        .map(|x| (plain(std::slice::from_ref(&x.message)), x.reason.clone()))
                        .collect::<Vec<_>>()
                };
                assert_eq!(rejected(r), rejected(&bags));
            }
            assert!(trusted.messages.iter().any(|m| m.vouched != Vouched::Checked));
        }
    }
}
