//! The audit: from stored messages and the witnesses they carry, and
//! nothing else, check that no two writers of one name ever overlapped.
//!
//! What is checked (each failure is a [`Violation`] naming what broke):
//! * every witness signature, against the lease servers' keys;
//! * every signed time (a message's, a witness's), against the keys;
//! * each message lies strictly inside `(min_timestamp, deadline)` of every
//!   witness it cites, and is not ahead of its signed time by more than the
//!   tolerance;
//! * per name, the chain of grants ordered by fencing token: each grant's
//!   `previous` names the grant before it; if the chain has a gap (a lease
//!   that wrote nothing is not in the bags), the later grant must come after
//!   the earlier one's deadline, unless it names it as released;
//!   a grant may not start before its predecessor ended;
//! * a released lease's watermark (stated by its successor's witness) is at
//!   least every timestamp written under it.
//!
//! The input is plain data, so the same audit runs on any store.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bagel_proto::{KeyRing, Micros, pb, verify_witness};
use serde::Serialize;

/// One stored message, as read back from a bag.
#[derive(Clone, Debug)]
pub struct AuditMessage {
    pub timestamp: Micros,
    pub writer: String,
    pub sequence: u64,
    /// Where it was read from (bag and file/object), for reports.
    pub location: String,
    /// The witnesses it was written under (shared by a batch).
    pub witnesses: Arc<[pb::Witness]>,
    pub signed_time: Option<Arc<pb::SignedTime>>,
}

/// Verifies a signed time: (time, radius in µs), or why not.
pub type TimeVerifier = Arc<dyn Fn(&pb::SignedTime) -> Result<(Micros, u64), String> + Send + Sync>;

/// What the audit trusts and tolerates.
#[derive(Clone)]
pub struct AuditConfig {
    /// Lease servers' public keys.
    pub keys: KeyRing,
    /// How far a timestamp may be ahead of its signed time (plus the
    /// signed time's own radius).
    pub tolerance: Duration,
    /// Verifies a signed time; returns (time, radius) or why not. The
    /// default verifies local-time-agent proofs against `keys`.
    pub verify_time: TimeVerifier,
}

impl fmt::Debug for AuditConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuditConfig")
            .field("keys", &self.keys)
            .field("tolerance", &self.tolerance)
            .finish_non_exhaustive()
    }
}

impl AuditConfig {
    pub fn new(keys: KeyRing) -> Self {
        let ring = keys.clone();
        AuditConfig {
            keys,
            tolerance: Duration::from_secs(1),
            verify_time: Arc::new(move |st| {
                bagel_proto::verify_local_time(st, &ring)
                    .map(|r| (r.time, r.radius_us))
                    .map_err(|e| e.to_string())
            }),
        }
    }
}

/// The kinds of violation, for filtering and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ViolationKind {
    BadWitnessSignature,
    BadSignedTime,
    NoWitness,
    BeforeMinTimestamp,
    AtOrAfterDeadline,
    AheadOfSignedTime,
    ChainBroken,
    OverlappingGrants,
    WatermarkBelowMessage,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub kind: ViolationKind,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.detail)
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct AuditReport {
    pub messages: usize,
    pub leases: usize,
    pub names: usize,
    /// The longest chain of grants of one name seen.
    pub longest_chain: usize,
    /// Grants whose predecessor is not in the data (it wrote nothing, or
    /// lies outside the range read): not violations, but the chain is
    /// checked by time there.
    pub chain_gaps: usize,
    pub violations: Vec<Violation>,
}

impl AuditReport {
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }
}

/// What the audit knows of one lease, merged over all its witnesses
/// (acquire, upgrade, renewals).
#[derive(Debug)]
struct LeaseFacts {
    /// The grant witness (the one with the earliest issue time).
    first: pb::WitnessBody,
    deadline: u64,
    max_message_ts: Option<u64>,
}

pub fn audit(messages: &[AuditMessage], cfg: &AuditConfig) -> AuditReport {
    let mut report = AuditReport {
        messages: messages.len(),
        ..Default::default()
    };
    let mut v = |kind, detail: String| report.violations.push(Violation { kind, detail });
    let mut leases: HashMap<String, LeaseFacts> = HashMap::new();
    // Each distinct witness is verified once.
    let mut verified: HashMap<Vec<u8>, Option<pb::WitnessBody>> = HashMap::new();

    for m in messages {
        let at = format!(
            "message {}#{} at {} ({})",
            m.writer,
            m.sequence,
            m.timestamp.as_micros(),
            m.location
        );
        if m.witnesses.is_empty() {
            v(ViolationKind::NoWitness, format!("{at} cites no lease witness"));
        }
        match &m.signed_time {
            None => v(
                ViolationKind::BadSignedTime,
                format!("{at} carries no signed time"),
            ),
            Some(st) => match (cfg.verify_time)(st) {
                Err(e) => v(
                    ViolationKind::BadSignedTime,
                    format!("{at}: signed time does not verify: {e}"),
                ),
                Ok((time, radius)) => {
                    let limit = time
                        .saturating_add(cfg.tolerance)
                        .saturating_add(Duration::from_micros(radius));
                    if m.timestamp > limit {
                        v(
                            ViolationKind::AheadOfSignedTime,
                            format!(
                                "{at} is {} us ahead of its signed time {} (tolerance {:?} + radius {radius} us)",
                                m.timestamp.as_micros() - time.as_micros(),
                                time.as_micros(),
                                cfg.tolerance
                            ),
                        );
                    }
                }
            },
        }
        for w in m.witnesses.iter() {
            let body = verified
                .entry(w.signature.iter().chain(&w.body).copied().collect())
                .or_insert_with(|| verify_witness(w, &cfg.keys).ok())
                .clone();
            let Some(body) = body else {
                v(
                    ViolationKind::BadWitnessSignature,
                    format!(
                        "{at} cites a witness (key {}) whose signature does not verify",
                        w.key_id
                    ),
                );
                continue;
            };
            let ts = m.timestamp.as_micros();
            if ts <= body.min_timestamp_us {
                v(
                    ViolationKind::BeforeMinTimestamp,
                    format!(
                        "{at} is not after min_timestamp {} of lease {}",
                        body.min_timestamp_us, body.lease_id
                    ),
                );
            }
            if ts >= body.deadline_us {
                v(
                    ViolationKind::AtOrAfterDeadline,
                    format!(
                        "{at} is not before deadline {} of lease {}",
                        body.deadline_us, body.lease_id
                    ),
                );
            }
            let facts = leases.entry(body.lease_id.clone()).or_insert_with(|| LeaseFacts {
                first: body.clone(),
                deadline: body.deadline_us,
                max_message_ts: None,
            });
            facts.deadline = facts.deadline.max(body.deadline_us);
            if body.issued_at_us < facts.first.issued_at_us {
                facts.first = body.clone();
            }
            facts.max_message_ts = facts.max_message_ts.max(Some(ts));
            if let Some(st) = &body.signed_time
                && let Err(e) = (cfg.verify_time)(st)
            {
                v(
                    ViolationKind::BadSignedTime,
                    format!(
                        "witness of lease {}: signed time does not verify: {e}",
                        body.lease_id
                    ),
                );
            }
        }
    }

    // Per name: grants ordered by fencing token.
    let mut by_name: BTreeMap<String, Vec<(u64, &LeaseFacts, pb::PreviousLease)>> = BTreeMap::new();
    for facts in leases.values() {
        for n in &facts.first.names {
            by_name.entry(n.name.clone()).or_default().push((
                n.fencing_token,
                facts,
                n.previous.clone().unwrap_or_default(),
            ));
        }
    }
    report.leases = leases.len();
    report.names = by_name.len();
    for (name, mut grants) in by_name {
        grants.sort_by_key(|g| g.0);
        let mut chain = 1;
        for pair in grants.windows(2) {
            let (f0, a, _) = &pair[0];
            let (f1, b, prev) = &pair[1];
            let (a_id, b_id) = (&a.first.lease_id, &b.first.lease_id);
            if f0 == f1 {
                v(
                    ViolationKind::OverlappingGrants,
                    format!("{name}: leases {a_id} and {b_id} carry the same fencing token {f0}"),
                );
                continue;
            }
            if prev.lease_id == *a_id {
                chain += 1;
                let ended = prev.ended();
                if ended == pb::Ended::Released {
                    if let Some(max) = a.max_message_ts
                        && prev.watermark_us < max
                    {
                        v(
                            ViolationKind::WatermarkBelowMessage,
                            format!(
                                "{name}: lease {a_id} released with watermark {} but wrote at {max}",
                                prev.watermark_us
                            ),
                        );
                    }
                } else if ended == pb::Ended::Broken && b.first.issued_at_us < a.deadline {
                    v(
                        ViolationKind::OverlappingGrants,
                        format!(
                            "{name}: lease {b_id} broke {a_id} at {} before its deadline {}",
                            b.first.issued_at_us, a.deadline
                        ),
                    );
                }
                if b.first.min_timestamp_us < prev.watermark_us {
                    v(
                        ViolationKind::ChainBroken,
                        format!(
                            "{name}: lease {b_id} may write from {} but its predecessor's watermark is {}",
                            b.first.min_timestamp_us, prev.watermark_us
                        ),
                    );
                }
            } else {
                report.chain_gaps += 1;
                chain = 1;
                // Not linked: the earlier lease must have ended before the
                // later was granted, and its writes be below the later's.
                if b.first.issued_at_us < a.deadline {
                    v(
                        ViolationKind::OverlappingGrants,
                        format!(
                            "{name}: lease {b_id} (granted at {}, previous {:?}) overlaps lease {a_id} \
                             (deadline {}), and does not name it as released",
                            b.first.issued_at_us, prev.lease_id, a.deadline
                        ),
                    );
                } else if let Some(max) = a.max_message_ts
                    && b.first.min_timestamp_us < max
                {
                    v(
                        ViolationKind::ChainBroken,
                        format!(
                            "{name}: lease {b_id} may write from {} but lease {a_id} wrote at {max}",
                            b.first.min_timestamp_us
                        ),
                    );
                }
            }
            report.longest_chain = report.longest_chain.max(chain);
        }
        report.longest_chain = report.longest_chain.max(chain);
    }
    report
}

#[cfg(test)]
mod tests {
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
            }
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
}
