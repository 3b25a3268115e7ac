//! The audit's rules, each broken on purpose in a history built here.

use bagel_proto::{Signer, sign_local_time, sign_witness};

use super::*;

const S: u64 = 1_000_000;
const T0: u64 = 1_800_000_000 * S;

struct World {
    signer: Signer,
    cfg: AuditConfig,
}

impl World {
    fn new() -> Self {
        let signer = Signer::generate();
        let cfg = AuditConfig::new([signer.verifying_key()].into_iter().collect());
        World { signer, cfg }
    }

    #[allow(clippy::too_many_arguments)]
    fn grant(
        &self,
        id: &str,
        name: &str,
        fencing: u64,
        issued: u64,
        deadline: u64,
        min_ts: u64,
        prev: Option<(&str, u64, pb::Ended)>,
    ) -> pb::Witness {
        let previous = prev.map(|(l, wm, ended)| pb::PreviousLease {
            lease_id: l.into(),
            watermark_us: wm,
            ended: ended.into(),
            // The test's lease ids name no time: say the predecessor
            // was granted just before its successor.
            granted_at_us: issued - 1,
            ..Default::default()
        });
        let body = pb::WitnessBody {
            lease_id: id.into(),
            names: vec![pb::WitnessName {
                name: name.into(),
                fencing_token: fencing,
                previous,
            }],
            deadline_us: deadline,
            min_timestamp_us: min_ts,
            issued_at_us: issued,
            signed_time: Some(self.time(issued)),
            ..Default::default()
        };
        sign_witness(&self.signer, &body)
    }

    fn time(&self, t: u64) -> pb::SignedTime {
        sign_local_time(&self.signer, "s", Micros::from_micros(t), 0)
    }

    fn msg(&self, ts: u64, w: &pb::Witness) -> AuditMessage {
        AuditMessage {
            timestamp: Micros::from_micros(ts),
            writer: "w".into(),
            sequence: ts,
            location: "test".into(),
            witnesses: Arc::from(vec![w.clone()]),
            signed_time: Some(Arc::new(self.time(ts))),
            bucket: Bucket::of(Micros::from_micros(ts)),
            rejected: None,
        }
    }

    /// A witness signed over `body` as given (for bodies the helpers
    /// above do not make).
    fn sign(&self, body: &pb::WitnessBody) -> pb::Witness {
        sign_witness(&self.signer, body)
    }
}

fn kinds(r: &AuditReport) -> Vec<ViolationKind> {
    r.violations.iter().map(|v| v.kind).collect()
}

#[test]
fn a_clean_chain_passes() {
    let w = World::new();
    let a = w.grant("A", "n", 1, T0, T0 + 5 * S, 0, None);
    let b = w.grant(
        "B",
        "n",
        2,
        T0 + 2 * S,
        T0 + 7 * S,
        T0 + S,
        Some(("A", T0 + S, pb::Ended::Released)),
    );
    let c = w.grant(
        "C",
        "n",
        3,
        T0 + 7 * S,
        T0 + 9 * S,
        T0 + 7 * S,
        Some(("B", T0 + 7 * S, pb::Ended::Broken)),
    );
    let msgs = vec![
        w.msg(T0 + 10, &a),
        w.msg(T0 + S, &a),
        w.msg(T0 + S + 1, &b),
        w.msg(T0 + 6 * S, &b),
        w.msg(T0 + 7 * S + 1, &c),
    ];
    let r = audit(&msgs, &w.cfg);
    assert!(r.is_clean(), "{:?}", r.violations);
    assert_eq!((r.messages, r.leases, r.names, r.longest_chain), (5, 3, 1, 3));
}

#[test]
fn each_injected_fault_is_named() {
    let w = World::new();
    let a = w.grant("A", "n", 1, T0, T0 + 5 * S, T0, None);
    // Back-dated, past deadline.
    let r = audit(&[w.msg(T0, &a), w.msg(T0 + 5 * S, &a)], &w.cfg);
    assert_eq!(
        kinds(&r),
        [
            ViolationKind::BeforeMinTimestamp,
            ViolationKind::AtOrAfterDeadline
        ]
    );
    // Flipped witness byte.
    let mut bad = a.clone();
    bad.body[3] ^= 1;
    let r = audit(&[w.msg(T0 + 1, &bad)], &w.cfg);
    assert_eq!(kinds(&r), [ViolationKind::BadWitnessSignature]);
    // Signed time from an unknown key, and a timestamp far ahead.
    let mut m = w.msg(T0 + 1, &a);
    m.signed_time = Some(Arc::new(sign_local_time(
        &Signer::generate(),
        "x",
        Micros::from_micros(T0),
        0,
    )));
    let mut far = w.msg(T0 + 4 * S, &a);
    far.signed_time = Some(Arc::new(w.time(T0 + S)));
    let r = audit(&[m, far], &w.cfg);
    assert_eq!(
        kinds(&r),
        [ViolationKind::BadSignedTime, ViolationKind::AheadOfSignedTime]
    );
    // Two grants of one name that overlap (two servers, or a restart
    // without the wait): B does not name A and starts before A ends.
    let b = w.grant(
        "B",
        "n",
        2,
        T0 + S,
        T0 + 6 * S,
        T0 + S,
        Some(("", T0, pb::Ended::Unknown)),
    );
    let r = audit(&[w.msg(T0 + 1, &a), w.msg(T0 + S + 1, &b)], &w.cfg);
    assert_eq!(kinds(&r), [ViolationKind::OverlappingGrants]);
    // A watermark below a message written under the lease.
    let c = w.grant(
        "C",
        "n",
        2,
        T0 + 3 * S,
        T0 + 8 * S,
        T0 + 2 * S,
        Some(("A", T0 + 2 * S, pb::Ended::Released)),
    );
    let r = audit(&[w.msg(T0 + 2 * S + 5, &a), w.msg(T0 + 3 * S, &c)], &w.cfg);
    assert_eq!(kinds(&r), [ViolationKind::WatermarkBelowMessage]);
}

#[test]
fn released_then_silent_then_next_is_not_an_overlap() {
    // A released early; C took the name, wrote nothing (so is not in
    // the bags) and released; B names C. B's grant is before A's
    // deadline, and that is fine: C was granted after A, by the same
    // server, so A had ended.
    let w = World::new();
    let a = w.grant("A", "n", 1, T0, T0 + 5 * S, 0, None);
    let b = w.grant(
        "B",
        "n",
        3,
        T0 + 2 * S,
        T0 + 7 * S,
        T0 + S,
        Some(("C", T0 + S, pb::Ended::Released)),
    );
    let r = audit(&[w.msg(T0 + S, &a), w.msg(T0 + S + 1, &b)], &w.cfg);
    assert!(r.is_clean(), "{:?}", r.violations);
    assert_eq!(r.chain_gaps, 1);
    // The same gap with C granted *before* A: C cannot have followed A.
    let mut body = pb::WitnessBody::decode(b.body.as_slice()).unwrap();
    body.names[0].previous.as_mut().unwrap().granted_at_us = T0 - 1;
    let b = w.sign(&body);
    let r = audit(&[w.msg(T0 + S, &a), w.msg(T0 + S + 1, &b)], &w.cfg);
    assert_eq!(kinds(&r), [ViolationKind::OverlappingGrants]);
}

#[test]
fn a_broken_link_must_hand_on_the_deadline() {
    let w = World::new();
    let a = w.grant("A", "n", 1, T0, T0 + 5 * S, 0, None);
    // B breaks A after its deadline but inherits less than it.
    let b = w.grant(
        "B",
        "n",
        2,
        T0 + 6 * S,
        T0 + 9 * S,
        T0 + 2 * S,
        Some(("A", T0 + 2 * S, pb::Ended::Broken)),
    );
    let r = audit(&[w.msg(T0 + S, &a), w.msg(T0 + 6 * S + 1, &b)], &w.cfg);
    assert_eq!(kinds(&r), [ViolationKind::ChainBroken]);
}

#[test]
fn back_dated_misfiled_tentative_and_rejected_messages_are_named() {
    let w = World::new();
    let a = w.grant("A", "n", 1, T0, T0 + 9 * S, T0, None);
    // Back-dated: its signed time is 3 s later.
    let mut m = w.msg(T0 + S, &a);
    m.signed_time = Some(Arc::new(w.time(T0 + 4 * S)));
    assert_eq!(kinds(&audit(&[m], &w.cfg)), [ViolationKind::BehindSignedTime]);
    // In the bag of another second.
    let mut m = w.msg(T0 + S, &a);
    m.bucket = m.bucket.next();
    assert_eq!(kinds(&audit(&[m], &w.cfg)), [ViolationKind::WrongBag]);
    // Under a tentative lease.
    let mut body = pb::WitnessBody::decode(a.body.as_slice()).unwrap();
    body.mode = pb::Mode::Tentative.into();
    let t = w.sign(&body);
    assert_eq!(
        kinds(&audit(&[w.msg(T0 + S, &t)], &w.cfg)),
        [ViolationKind::TentativeWitness]
    );
    // A witness whose issued_at is a minute off its own signed time.
    let mut body = pb::WitnessBody::decode(a.body.as_slice()).unwrap();
    body.issued_at_us = T0 + 60 * S;
    let off = w.sign(&body);
    assert_eq!(
        kinds(&audit(&[w.msg(T0 + S, &off)], &w.cfg)),
        [ViolationKind::IssuedOffSignedTime]
    );
    // What a reader rejected is reported, with its reason.
    let mut m = w.msg(T0 + S, &a);
    m.rejected = Some("because".into());
    let r = audit(&[m], &w.cfg);
    assert_eq!(kinds(&r), [ViolationKind::RejectedByReader]);
    assert!(r.violations[0].detail.contains("because"));
}

#[test]
fn a_forged_witness_cannot_borrow_a_verified_ones_cache_entry() {
    let w = World::new();
    let a = w.grant("A", "n", 1, T0, T0 + 5 * S, 0, None);
    // Signature and body split elsewhere: the same bytes end to end.
    let mut forged = a.clone();
    let last = forged.signature.pop().unwrap();
    forged.body.insert(0, last);
    let r = audit(&[w.msg(T0 + 1, &a), w.msg(T0 + 2, &forged)], &w.cfg);
    assert_eq!(kinds(&r), [ViolationKind::BadWitnessSignature]);
}
