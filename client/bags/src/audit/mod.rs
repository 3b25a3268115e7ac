//! The audit: from stored messages and the witnesses they carry, and
//! nothing else, check that no two writers of one name ever overlapped.
//!
//! What is checked (each failure is a [`Violation`] naming what broke):
//! * every witness signature, against the lease servers' keys, and that
//!   every cited witness is of a full lease (a tentative one gives no right
//!   to write);
//! * every signed time (a message's, a witness's), against the keys; a
//!   witness's `issued_at` agrees with its signed time;
//! * each message lies strictly inside `(min_timestamp, deadline)` of every
//!   witness it cites, in the bag of its own second, and within the
//!   tolerance of its signed time (neither ahead nor back-dated);
//! * per name, the chain of grants ordered by fencing token: each grant's
//!   `previous` names the grant before it, and a broken predecessor hands
//!   on at least its deadline; if the chain has a gap (a lease that wrote
//!   nothing is not in the bags), the later grant must come after the
//!   earlier one's deadline, unless the lease it names as predecessor was
//!   granted by the same server after the earlier one (so followed it);
//! * a released lease's watermark (stated by its successor's witness) is at
//!   least every timestamp written under it;
//! * and every message a reader rejected is reported with its reason.
//!
//! The input is plain data, so the same audit runs on any store.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bagel_proto::{KeyRing, Micros, TimeReading, pb, verify_witness};
use prost::Message as _;
use serde::Serialize;

use crate::Bucket;

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
    /// The bag it was read from.
    pub bucket: Bucket,
    /// Why the reader rejected it, if it did.
    pub rejected: Option<String>,
}

/// Verifies a signed time: what it proves, or why not.
pub type TimeVerifier = Arc<dyn Fn(&pb::SignedTime) -> Result<TimeReading, String> + Send + Sync>;

impl AuditMessage {
    /// Every stored message of a read, accepted or rejected by the reader:
    /// the audit judges each one itself.
    pub fn from_report(report: &crate::reader::ReadReport, log: &str) -> Vec<AuditMessage> {
        report
            .messages
            .iter()
            .map(|m| (m, None))
            .chain(
                report
                    .rejected
                    .iter()
                    .map(|r| (&r.message, Some(r.reason.clone()))),
            )
            .map(|(m, rejected)| AuditMessage {
                timestamp: m.timestamp,
                writer: m.writer_id.clone(),
                sequence: m.sequence,
                location: format!("{log}/{}", m.bucket.path()),
                witnesses: Arc::clone(&m.witnesses),
                signed_time: m.signed_time.clone(),
                bucket: m.bucket,
                rejected,
            })
            .collect()
    }
}

/// What the audit trusts and tolerates.
#[derive(Clone)]
pub struct AuditConfig {
    /// Lease servers' public keys.
    pub keys: KeyRing,
    /// How far a timestamp may be from its signed time (plus the signed
    /// time's radius and resolution), either way.
    pub tolerance: Duration,
    /// How old the signed time a server puts in a witness may be when it
    /// issues the witness (its Roughtime answers are refreshed every second
    /// and used for at most 10 s by default).
    pub witness_time_max_age: Duration,
    /// Verifies a signed time; returns its reading or why not. The default
    /// verifies local-time-agent proofs against `keys`.
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
            witness_time_max_age: Duration::from_secs(11),
            verify_time: Arc::new(move |st| {
                bagel_proto::verify_local_time(st, &ring).map_err(|e| e.to_string())
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
    /// Back-dated: further behind its signed time than the tolerance.
    BehindSignedTime,
    /// Stored in the bag of another second than its timestamp's.
    WrongBag,
    /// Cites the witness of a tentative lease, which gives no right to
    /// write.
    TentativeWitness,
    /// A witness's `issued_at` disagrees with its own signed time.
    IssuedOffSignedTime,
    /// A reader rejected it (the detail says why).
    RejectedByReader,
    ChainBroken,
    OverlappingGrants,
    WatermarkBelowMessage,
    /// A record in a closed bag failed its checksum or was cut short.
    CorruptRecord,
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
        if let Some(reason) = &m.rejected {
            v(
                ViolationKind::RejectedByReader,
                format!("{at} was rejected by the reader: {reason}"),
            );
        }
        if m.witnesses.is_empty() {
            v(ViolationKind::NoWitness, format!("{at} cites no lease witness"));
        }
        if Bucket::of(m.timestamp) != m.bucket {
            v(
                ViolationKind::WrongBag,
                format!("{at} is stored in bag {}, not its own second's", m.bucket),
            );
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
                Ok(reading) => {
                    if let Err((diff, limit)) = reading.congruent(m.timestamp, cfg.tolerance) {
                        let (kind, side) = if m.timestamp > reading.time {
                            (ViolationKind::AheadOfSignedTime, "ahead of")
                        } else {
                            (ViolationKind::BehindSignedTime, "behind")
                        };
                        v(
                            kind,
                            format!(
                                "{at} is {diff} us {side} its signed time {} (limit {limit} us: tolerance \
                                 {:?} + radius + resolution)",
                                reading.time.as_micros(),
                                cfg.tolerance
                            ),
                        );
                    }
                }
            },
        }
        for w in m.witnesses.iter() {
            // Keyed by the whole encoded witness (body, signature, key id,
            // Merkle path): no two different witnesses share a key.
            let body = verified
                .entry(w.encode_to_vec())
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
            if body.mode().normalized() != pb::Mode::Full {
                v(
                    ViolationKind::TentativeWitness,
                    format!(
                        "{at} cites the witness of lease {}, which is tentative",
                        body.lease_id
                    ),
                );
            }
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
            match body.signed_time.as_ref().map(|st| (cfg.verify_time)(st)) {
                None => v(
                    ViolationKind::BadSignedTime,
                    format!("witness of lease {} carries no signed time", body.lease_id),
                ),
                Some(Err(e)) => v(
                    ViolationKind::BadSignedTime,
                    format!(
                        "witness of lease {}: signed time does not verify: {e}",
                        body.lease_id
                    ),
                ),
                Some(Ok(reading)) => {
                    // Issued after its signed time was taken (up to its
                    // maximum age), never before it.
                    let issued = Micros::from_micros(body.issued_at_us);
                    let slack =
                        cfg.tolerance + Duration::from_micros(reading.radius_us + reading.resolution_us());
                    let earliest = reading.time.saturating_sub(slack);
                    let latest = reading.time.saturating_add(slack + cfg.witness_time_max_age);
                    if issued < earliest || issued > latest {
                        v(
                            ViolationKind::IssuedOffSignedTime,
                            format!(
                                "witness of lease {} says it was issued at {} but its signed time is {} \
                                 (allowed {}..={})",
                                body.lease_id,
                                body.issued_at_us,
                                reading.time.as_micros(),
                                earliest.as_micros(),
                                latest.as_micros()
                            ),
                        );
                    }
                }
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
                } else if ended == pb::Ended::Broken {
                    if b.first.issued_at_us < a.deadline {
                        v(
                            ViolationKind::OverlappingGrants,
                            format!(
                                "{name}: lease {b_id} broke {a_id} at {} before its deadline {}",
                                b.first.issued_at_us, a.deadline
                            ),
                        );
                    }
                    if prev.watermark_us < a.deadline {
                        v(
                            ViolationKind::ChainBroken,
                            format!(
                                "{name}: lease {b_id} inherits watermark {} from broken lease {a_id}, \
                                 below its deadline {}",
                                prev.watermark_us, a.deadline
                            ),
                        );
                    }
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
                // later was granted, and its writes be below the later's. A
                // predecessor the same server granted after the earlier
                // lease followed it (one holder at a time per name), so the
                // earlier one had ended by then.
                let followed = !prev.lease_id.is_empty()
                    && prev.granted_at_us >= a.first.issued_at_us
                    && b.first.server_id == a.first.server_id
                    && b.first.epoch_us == a.first.epoch_us;
                if b.first.issued_at_us < a.deadline && !followed {
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
mod tests;
