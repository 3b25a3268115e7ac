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
        self.grant_on("s1", id, name, fencing, issued, deadline, min_ts, prev)
    }

    /// A grant by server `server` (its id in the witness).
    #[allow(clippy::too_many_arguments)]
    fn grant_on(
        &self,
        server: &str,
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
            server_id: server.into(),
            ..Default::default()
        };
        sign_witness(&self.signer, &body)
    }

    /// A message written under a lease over several servers: it cites
    /// every part's witness.
    fn msg_many(&self, ts: u64, ws: &[&pb::Witness]) -> AuditMessage {
        AuditMessage {
            witnesses: ws.iter().map(|w| (*w).clone()).collect::<Vec<_>>().into(),
            ..self.msg(ts, ws[0])
        }
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
            holder: crate::holder_sig::HolderCheck::Bound,
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
    let mut body = bad.body.to_vec();
    body[3] ^= 1;
    bad.body = body.into();
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
    let mut body = pb::WitnessBody::decode(&b.body[..]).unwrap();
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
    let mut body = pb::WitnessBody::decode(&a.body[..]).unwrap();
    body.mode = pb::Mode::Tentative.into();
    let t = w.sign(&body);
    assert_eq!(
        kinds(&audit(&[w.msg(T0 + S, &t)], &w.cfg)),
        [ViolationKind::TentativeWitness]
    );
    // A witness whose issued_at is a minute off its own signed time.
    let mut body = pb::WitnessBody::decode(&a.body[..]).unwrap();
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
    let (mut signature, mut body) = (forged.signature.to_vec(), forged.body.to_vec());
    let last = signature.pop().unwrap();
    body.insert(0, last);
    (forged.signature, forged.body) = (signature.into(), body.into());
    let r = audit(&[w.msg(T0 + 1, &a), w.msg(T0 + 2, &forged)], &w.cfg);
    assert_eq!(kinds(&r), [ViolationKind::BadWitnessSignature]);
}

#[test]
fn a_holder_over_two_servers_chains_on_each() {
    // Migration: H1 on server a only; H2 on a and b (one message cites
    // both parts); H3 on b only. Each server's chain links; nothing
    // overlaps.
    let w = World::new();
    let h1 = w.grant_on("a", "H1", "n", T0, T0, T0 + 5 * S, 0, None);
    let h2a = w.grant_on(
        "a",
        "H2a",
        "n",
        T0 + 2 * S,
        T0 + 2 * S,
        T0 + 6 * S,
        T0 + S,
        Some(("H1", T0 + S, pb::Ended::Released)),
    );
    let h2b = w.grant_on("b", "H2b", "n", T0 + 2 * S + 5, T0 + 2 * S, T0 + 6 * S, 0, None);
    let h3 = w.grant_on(
        "b",
        "H3",
        "n",
        T0 + 4 * S,
        T0 + 4 * S,
        T0 + 9 * S,
        T0 + 3 * S,
        Some(("H2b", T0 + 3 * S, pb::Ended::Released)),
    );
    let msgs = vec![
        w.msg(T0 + S, &h1),
        w.msg_many(T0 + 3 * S, &[&h2a, &h2b]),
        w.msg(T0 + 5 * S, &h3),
    ];
    let r = audit(&msgs, &w.cfg);
    assert!(r.is_clean(), "{:?}", r.violations);
    assert_eq!((r.leases, r.names, r.longest_chain), (4, 1, 3));
}

#[test]
fn two_servers_granting_one_name_to_two_holders_at_once_is_an_overlap() {
    // A client routing differently took `n` on server b while a holder on
    // server a still had it: each server's own chain looks fine.
    let w = World::new();
    let on_a = w.grant_on("a", "A1", "n", T0, T0, T0 + 5 * S, 0, None);
    let on_b = w.grant_on("b", "B1", "n", T0 + S, T0 + S, T0 + 6 * S, 0, None);
    let msgs = vec![w.msg(T0 + 2 * S, &on_a), w.msg(T0 + 3 * S, &on_b)];
    let r = audit(&msgs, &w.cfg);
    assert_eq!(
        kinds(&r),
        [ViolationKind::OverlappingGrants],
        "{:?}",
        r.violations
    );
    assert!(r.violations[0].detail.contains("A1") && r.violations[0].detail.contains("B1"));
}

#[test]
fn skipping_the_migration_wait_shows_as_an_overlap() {
    // Step 1 holder on a (current owner) still holds `n` when a step-3
    // client takes it on b (next owner): no server saw both.
    let w = World::new();
    let step1 = w.grant_on("a", "S1", "n", T0, T0, T0 + 10 * S, 0, None);
    let step3 = w.grant_on("b", "S3", "n", T0 + 3 * S, T0 + 3 * S, T0 + 8 * S, 0, None);
    let msgs = vec![w.msg(T0 + 4 * S, &step1), w.msg(T0 + 5 * S, &step3)];
    let r = audit(&msgs, &w.cfg);
    assert_eq!(
        kinds(&r),
        [ViolationKind::OverlappingGrants],
        "{:?}",
        r.violations
    );
}

#[test]
fn the_two_ends_of_a_migration_are_ordered_by_what_they_wrote() {
    // A step-1 holder on server a only, then (after the wait) a step-3
    // holder on server b only: b never saw a's watermark, so b's own
    // inherited watermark is lower; what matters is that b wrote above a.
    let w = World::new();
    let step1 = w.grant_on("a", "S1", "n", T0 + 5, T0, T0 + 2 * S, T0, None);
    let step3 = w.grant_on("b", "S3", "n", T0 + 3 * S, T0 + 3 * S, T0 + 6 * S, T0 - S, None);
    let clean = audit(&[w.msg(T0 + S, &step1), w.msg(T0 + 4 * S, &step3)], &w.cfg);
    assert!(clean.is_clean(), "{:?}", clean.violations);
    // The same two holders, the later writing below the earlier: broken.
    let late = w.grant_on("a", "S1b", "n", T0 + 6, T0, T0 + 2 * S, T0, None);
    let early = w.grant_on("b", "S3b", "n", T0 + 3 * S, T0 + 3 * S, T0 + 6 * S, T0 - S, None);
    let bad = audit(&[w.msg(T0 + S, &late), w.msg(T0 + S - 1, &early)], &w.cfg);
    assert!(
        kinds(&bad).contains(&ViolationKind::ChainBroken),
        "{:?}",
        bad.violations
    );
}

/// B's witness, naming `prev` as its predecessor on "n" with `watermark`,
/// ended `ended` at `ended_at`.
fn successor(
    w: &World,
    issued: u64,
    prev: &str,
    watermark: u64,
    ended: pb::Ended,
    ended_at: u64,
) -> pb::Witness {
    let mut body = pb::WitnessBody::decode(
        w.grant(
            "B",
            "n",
            2,
            issued,
            issued + 5 * S,
            watermark,
            Some((prev, watermark, ended)),
        )
        .body,
    )
    .unwrap();
    body.names[0].previous.as_mut().unwrap().ended_at_us = ended_at;
    w.sign(&body)
}

#[test]
fn breaking_a_predecessor_before_the_deadline_its_successor_states_is_an_overlap() {
    // A was renewed (to T0 + 8 s) but wrote nothing under the renewal,
    // so the bags show only its first deadline, T0 + 5 s. B's own
    // witness says A was broken with watermark (= deadline) T0 + 8 s,
    // yet B was granted at T0 + 6 s: B took the name while A held it.
    let w = World::new();
    let a = w.grant("A", "n", 1, T0, T0 + 5 * S, 0, None);
    let b = successor(&w, T0 + 6 * S, "A", T0 + 8 * S, pb::Ended::Broken, T0 + 6 * S);
    let r = audit(&[w.msg(T0 + S, &a), w.msg(T0 + 8 * S + 1, &b)], &w.cfg);
    assert_eq!(
        kinds(&r),
        [ViolationKind::OverlappingGrants],
        "{:?}",
        r.violations
    );
    // Granted after the deadline it states: clean.
    let b = successor(&w, T0 + 8 * S, "A", T0 + 8 * S, pb::Ended::Broken, T0 + 8 * S);
    let r = audit(&[w.msg(T0 + S, &a), w.msg(T0 + 8 * S + 1, &b)], &w.cfg);
    assert!(r.is_clean(), "{:?}", r.violations);
}

#[test]
fn a_grant_before_its_predecessor_was_released_is_an_overlap() {
    // B's witness says A was released at T0 + 3 s, but B was granted at
    // T0 + 2 s: both held the name for a second.
    let w = World::new();
    let a = w.grant("A", "n", 1, T0, T0 + 5 * S, 0, None);
    let b = successor(&w, T0 + 2 * S, "A", T0 + S, pb::Ended::Released, T0 + 3 * S);
    let r = audit(&[w.msg(T0 + S, &a), w.msg(T0 + 2 * S + 1, &b)], &w.cfg);
    assert_eq!(
        kinds(&r),
        [ViolationKind::OverlappingGrants],
        "{:?}",
        r.violations
    );
    // Granted after the release: clean.
    let b = successor(&w, T0 + 3 * S, "A", T0 + S, pb::Ended::Released, T0 + 3 * S);
    let r = audit(&[w.msg(T0 + S, &a), w.msg(T0 + 3 * S + 1, &b)], &w.cfg);
    assert!(r.is_clean(), "{:?}", r.violations);
}

#[test]
fn witnesses_by_a_key_not_trusted_are_one_violation_per_key_not_forgeries() {
    let w = World::new();
    let a = w.grant("A", "n", 1, T0, T0 + 5 * S, T0, None);
    let msgs: Vec<AuditMessage> = (1..=5).map(|i| w.msg(T0 + i, &a)).collect();
    // Trusting another server's key only: every message cites a key the
    // audit was not given, so nothing is checked and that is said once.
    let other = AuditConfig::new([Signer::generate().verifying_key()].into_iter().collect());
    let r = audit(&msgs, &other);
    assert_eq!(kinds(&r), [ViolationKind::UntrustedKey]);
    let detail = &r.violations[0].detail;
    assert!(
        detail.starts_with("5 messages cite witnesses signed by key ") && detail.contains(w.signer.key_id()),
        "{detail}"
    );
    assert!(!r.is_clean());
    // A trusted key whose signature does not hold is still a forgery.
    let mut bad = a.clone();
    let mut body = bad.body.to_vec();
    body[3] ^= 1;
    bad.body = body.into();
    let r = audit(&[w.msg(T0 + 1, &bad)], &w.cfg);
    assert_eq!(kinds(&r), [ViolationKind::BadWitnessSignature]);
}
