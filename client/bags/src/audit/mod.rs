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
//! * per name, the chain of holders ordered by fencing token: each
//!   holder's grant names the grant before it on its server, and a broken
//!   predecessor hands on at least its deadline; a grant comes after its
//!   predecessor ended, by what its own witness states (a broken one's
//!   watermark, a released one's `ended_at`), not only by the deadlines
//!   the bags happen to show; if the chain has a gap (a
//!   lease that wrote nothing is not in the bags), the later grant must
//!   come after the earlier one's deadline, unless the lease it names as
//!   predecessor was granted by the same server after the earlier one (so
//!   followed it). A holder is one lease, or the leases one message cites
//!   together (a lease over several servers: one per server); so two
//!   servers that both granted a name to different holders at once (a
//!   client routing differently) are found as an overlap like any other;
//! * a released lease's watermark (stated by its successor's witness) is at
//!   least every timestamp written under it;
//! * every batch is signed by the holder key each witness it cites names
//!   ([`crate::holder_sig`]): a copied witness cannot vouch for other
//!   bytes. Messages of leases acquired without a holder key are counted
//!   ([`AuditReport::unbound_messages`]): nothing binds them to a writer;
//! * a batch found twice, or in another log or bag than it names, is a
//!   violation ([`problem_violations`], from the reader's problems);
//! * and every message a reader rejected is reported with its reason.
//!
//! The input is plain data, so the same audit runs on any store.
//!
//! Longer than most files: the checks above share one pass over the
//! messages and one index of witnesses, and split apart they would each
//! need both; the tests are in `tests.rs`.

use std::collections::{BTreeMap, HashMap, HashSet};
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
    /// Its timestamp, µs since the Unix epoch, as its writer gave it.
    pub timestamp: Micros,
    /// The writer id it carries.
    pub writer: String,
    /// Its number in its writer's sequence.
    pub sequence: u64,
    /// Where it was read from (bag and file/object), for reports.
    pub location: String,
    /// The witnesses it was written under (shared by a batch).
    pub witnesses: Arc<[pb::Witness]>,
    /// Its batch's signed time; `None` is a [`ViolationKind::BadSignedTime`].
    pub signed_time: Option<Arc<pb::SignedTime>>,
    /// The bag it was read from.
    pub bucket: Bucket,
    /// Why the reader rejected it, if it did.
    pub rejected: Option<String>,
    /// What its batch's holder signatures show.
    pub holder: crate::holder_sig::HolderCheck,
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
                holder: m.holder.clone(),
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
    /// Trust `keys`, with a tolerance of 1 s and witness times up to 11 s
    /// old; signed times are verified as local-time-agent proofs.
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
    /// A witness whose signature does not verify against the keys.
    BadWitnessSignature,
    /// A signed time (a message's or a witness's) missing or not verifying.
    BadSignedTime,
    /// A message that cites no witness.
    NoWitness,
    /// A timestamp at or before a cited lease's `min_timestamp`.
    BeforeMinTimestamp,
    /// A timestamp at or past a cited lease's deadline.
    AtOrAfterDeadline,
    /// Further ahead of its signed time than the tolerance.
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
    /// A grant that does not follow from its predecessor: it may write
    /// below the watermark handed on, or below what the lease before
    /// wrote, or a broken lease handed on less than its deadline.
    ChainBroken,
    /// Two holders of one name at once: a grant before its predecessor
    /// was released, broken or past its deadline, or two with one fencing token.
    OverlappingGrants,
    /// A released lease wrote above the watermark its release stated.
    WatermarkBelowMessage,
    /// A record in a closed bag failed its checksum or was cut short.
    CorruptRecord,
    /// Its batch is not signed by the holder key of a lease it cites:
    /// forged, altered, or moved (a stolen witness vouches for nothing).
    NotSignedByHolder,
    /// A batch found a second time (an item listed twice, a copied file).
    DuplicateBatch,
    /// A batch found in another log or bag than the one it names.
    MisplacedBatch,
    /// A published summary that is not what its source bags hold (a
    /// forged or corrupted summary, or bag).
    SummaryMismatch,
    /// A summarizer's attestation that does not hold (bad signature, not
    /// over the published summary's bytes), or that vouches for a summary
    /// that does not match its source bags; the detail names the key.
    BadAttestation,
    /// Messages cite witnesses signed by a key the audit was not given to
    /// trust: none of them can be checked (the key may be a lease
    /// server's that was left out, or a forger's). Reported once per key
    /// id, with how many messages cite it and how to trust it, never as a
    /// bad signature per message.
    UntrustedKey,
    /// Bags a minute's seal lists (or items a lock lists) that are gone
    /// and that no summary the read used holds: messages that exist and
    /// that the audit could not check (the detail says where they are,
    /// if anywhere).
    MissingBag,
    /// Two published summaries that hold one minute and disagree on it
    /// (the detail names both, the minute, and how): at most one of them
    /// holds what the minute's bags held, and readers that take the
    /// minute from the other read other messages.
    SummariesDisagree,
}

/// One failed check, and what failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Which check.
    pub kind: ViolationKind,
    /// The message, lease or name and why, for people.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.detail)
    }
}

/// What [`audit`] found: what it looked at, and every violation.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AuditReport {
    /// Messages audited, rejected by the reader or not.
    pub messages: usize,
    /// Distinct leases their witnesses name.
    pub leases: usize,
    /// Distinct names those leases were granted for.
    pub names: usize,
    /// The longest chain of grants of one name seen.
    pub longest_chain: usize,
    /// Grants whose predecessor is not in the data (it wrote nothing, or
    /// lies outside the range read): not violations, but the chain is
    /// checked by time there.
    pub chain_gaps: usize,
    /// Messages citing a lease acquired without a holder key: their
    /// witnesses are checked, but nothing binds their bytes to the lease's
    /// holder (anyone with a copy of the witness could have written them).
    pub unbound_messages: usize,
    /// Every failed check; empty when the log is clean.
    pub violations: Vec<Violation>,
}

impl AuditReport {
    /// No violation: no two writers of a name overlapped, by every check.
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
    min_message_ts: Option<u64>,
    max_message_ts: Option<u64>,
}

/// Audit `messages` (every stored message of a log, or of one range of
/// it; see [`AuditMessage::from_report`]) with what `cfg` trusts.
pub fn audit(messages: &[AuditMessage], cfg: &AuditConfig) -> AuditReport {
    let mut report = AuditReport {
        messages: messages.len(),
        ..Default::default()
    };
    let mut unbound = 0;
    let mut v = |kind, detail: String| report.violations.push(Violation { kind, detail });
    let mut leases: HashMap<String, LeaseFacts> = HashMap::new();
    // Each distinct witness is verified once.
    let mut verified: HashMap<Vec<u8>, Option<pb::WitnessBody>> = HashMap::new();
    // Pairs of leases some message cites together.
    let mut cited_together: HashSet<(String, String)> = HashSet::new();

    // Messages citing a witness by a key not trusted, per key id: left
    // unchecked (every check would fail for the same one reason).
    let mut untrusted: BTreeMap<String, usize> = BTreeMap::new();

    for m in messages {
        if let Some(w) = m.witnesses.iter().find(|w| cfg.keys.get(&w.key_id).is_none()) {
            *untrusted.entry(w.key_id.clone()).or_default() += 1;
            continue;
        }
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
        match &m.holder {
            crate::holder_sig::HolderCheck::Bound => {}
            crate::holder_sig::HolderCheck::Unbound { .. } => unbound += 1,
            crate::holder_sig::HolderCheck::Bad { reason } => {
                v(ViolationKind::NotSignedByHolder, format!("{at}: {reason}"))
            }
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
        let mut cited: Vec<String> = Vec::new();
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
            if !cited.contains(&body.lease_id) {
                cited.push(body.lease_id.clone());
            }
            let facts = leases.entry(body.lease_id.clone()).or_insert_with(|| LeaseFacts {
                first: body.clone(),
                deadline: body.deadline_us,
                min_message_ts: None,
                max_message_ts: None,
            });
            facts.deadline = facts.deadline.max(body.deadline_us);
            if body.issued_at_us < facts.first.issued_at_us {
                facts.first = body.clone();
            }
            facts.max_message_ts = facts.max_message_ts.max(Some(ts));
            facts.min_message_ts = Some(facts.min_message_ts.map_or(ts, |m| m.min(ts)));
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
        if let Some((first, rest)) = cited.split_first() {
            for other in rest {
                cited_together.insert((first.clone(), other.clone()));
            }
        }
    }

    for (key_id, messages) in untrusted {
        v(
            ViolationKind::UntrustedKey,
            format!(
                "{messages} messages cite witnesses signed by key {key_id}, which is not trusted: \
                 none of them was checked; if it is a lease server's key, trust it (`bagel audit --key \
                 <its public key>`, which `bagel server-info` prints)"
            ),
        );
    }

    // Leases one message cites together are one holder's parts (a lease
    // over several servers, or taken on both lists while migrating).
    let cited_together: Vec<(String, String)> = cited_together.into_iter().collect();
    let holder_of = holders(&cited_together, leases.keys());

    // Per name: holders ordered by fencing token.
    let mut by_name: BTreeMap<String, BTreeMap<usize, Holder<'_>>> = BTreeMap::new();
    for (id, facts) in &leases {
        for n in &facts.first.names {
            let h = by_name
                .entry(n.name.clone())
                .or_default()
                .entry(holder_of[id.as_str()])
                .or_default();
            h.fencing = h.fencing.max(n.fencing_token);
            h.parts.push((facts, n.previous.clone().unwrap_or_default()));
        }
    }
    report.unbound_messages = unbound;
    report.leases = leases.len();
    report.names = by_name.len();
    for (name, holders) in by_name {
        let mut grants: Vec<Holder<'_>> = holders.into_values().collect();
        grants.sort_by_key(|g| g.fencing);
        let mut chain = 1;
        for pair in grants.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            let (a_id, b_id) = (a.ids(), b.ids());
            if a.fencing == b.fencing {
                v(
                    ViolationKind::OverlappingGrants,
                    format!(
                        "{name}: leases {a_id} and {b_id} carry the same fencing token {}",
                        a.fencing
                    ),
                );
                continue;
            }
            // Each part of `b` whose predecessor on its server is a part of `a`.
            let links: Vec<(&LeaseFacts, &LeaseFacts, &pb::PreviousLease)> = b
                .parts
                .iter()
                .filter_map(|(bf, prev)| {
                    a.parts
                        .iter()
                        .find(|(af, _)| af.first.lease_id == prev.lease_id)
                        .map(|(af, _)| (*af, *bf, prev))
                })
                .collect();
            if !links.is_empty() {
                chain += 1;
                for (a, b, prev) in links {
                    check_link(&name, a, b, prev, &mut v);
                }
                continue;
            }
            report.chain_gaps += 1;
            chain = 1;
            // Not linked: the earlier holder must have ended before the
            // later was granted, and its writes be below the later's. A
            // predecessor the same server granted after the earlier lease
            // followed it (one holder at a time per name on a server), so
            // the earlier one had ended by then.
            let followed = b.parts.iter().any(|(bf, prev)| {
                !prev.lease_id.is_empty()
                    && a.parts.iter().any(|(af, _)| {
                        prev.granted_at_us >= af.first.issued_at_us
                            && bf.first.server_id == af.first.server_id
                            && bf.first.epoch_us == af.first.epoch_us
                    })
            });
            let prevs: Vec<&str> = b.parts.iter().map(|(_, p)| p.lease_id.as_str()).collect();
            if b.issued() < a.deadline() && !followed {
                v(
                    ViolationKind::OverlappingGrants,
                    format!(
                        "{name}: lease {b_id} (granted at {}, previous {prevs:?}) overlaps lease {a_id} \
                         (deadline {}), and does not name it as released",
                        b.issued(),
                        a.deadline()
                    ),
                );
            } else if let Some(max) = a.max_message_ts() {
                // On a server they share, the watermark carries on, so the
                // later may not even be allowed below the earlier's
                // writes. Holders on disjoint servers (the two ends of a
                // migration) are kept apart by time alone: the later's
                // writes must be above the earlier's.
                let shared_server = a.parts.iter().any(|(af, _)| {
                    b.parts
                        .iter()
                        .any(|(bf, _)| bf.first.server_id == af.first.server_id)
                });
                if shared_server && b.min_timestamp() < max {
                    v(
                        ViolationKind::ChainBroken,
                        format!(
                            "{name}: lease {b_id} may write from {} but lease {a_id} wrote at {max}",
                            b.min_timestamp()
                        ),
                    );
                } else if let Some(min) = b.min_message_ts()
                    && !shared_server
                    && min <= max
                {
                    v(
                        ViolationKind::ChainBroken,
                        format!(
                            "{name}: lease {b_id} wrote at {min}, not above {max} written under lease \
                             {a_id} (granted by other servers)"
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

/// What [`audit_summaries`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SummaryAudit {
    /// Summaries that do not match their bags ([`ViolationKind::SummaryMismatch`]),
    /// attestations that fail or vouch for such a summary
    /// ([`ViolationKind::BadAttestation`], naming the key).
    pub violations: Vec<Violation>,
    /// Summaries some of whose source bags are gone.
    pub unchecked: Vec<String>,
    /// Attestations looked at.
    pub attestations_checked: u64,
}

/// Checks every summary of `log` overlapping `[first, last]` against its
/// source bags while they exist ([`crate::summary::check`]), and every
/// attestation of those stretches: its signature, that it is over the
/// published summary's bytes, and that the summary it vouches for matches
/// its bags. An attestation with no summary beside it is a finding too.
///
/// And every two of those summaries that hold one minute are compared on
/// it ([`crate::summary::disagreement`]): once retention removed the
/// minute's bags, a summary made from something else than those bags
/// (a bag made again since) checks against what it was made from, and
/// only the other summary of the minute still tells.
pub async fn audit_summaries(
    store: &dyn crate::BagStore,
    log: &str,
    first: Bucket,
    last: Bucket,
) -> crate::Result<SummaryAudit> {
    use crate::summary::{self, attest};
    let mut out = SummaryAudit::default();
    let in_range = |st: &summary::Stretch| st.last() >= first && st.from() <= last;
    let attestations = attest::list(store, log).await?;
    let stretches = summary::list(store, log).await?;
    for &stretch in stretches.iter().filter(|st| in_range(st)) {
        let matches = match summary::check(store, log, stretch).await {
            Ok(check) => {
                for m in &check.mismatched {
                    out.violations.push(Violation {
                        kind: ViolationKind::SummaryMismatch,
                        detail: format!("summary of {log} {stretch}: {m}"),
                    });
                }
                if check.bags_gone > 0 {
                    out.unchecked.push(format!(
                        "summary of {log} {stretch}: {} of its source bags are gone, so whether it left \
                         messages of them out cannot be checked (what it holds was checked like any bag)",
                        check.bags_gone
                    ));
                }
                check.mismatched.is_empty()
            }
            Err(e) => {
                out.violations.push(Violation {
                    kind: ViolationKind::SummaryMismatch,
                    detail: format!("summary of {log} {stretch}: {e}"),
                });
                false
            }
        };
        let keys: Vec<String> = attestations
            .iter()
            .filter(|(st, _)| *st == stretch)
            .map(|(_, k)| k.clone())
            .collect();
        if keys.is_empty() {
            continue;
        }
        let bytes = summary::stored_bytes(store, log, stretch).await?;
        out.attestations_checked += keys.len() as u64;
        for finding in attest::audit(store, log, stretch, &keys, bytes.as_deref(), Some(matches)).await? {
            out.violations.push(Violation {
                kind: ViolationKind::BadAttestation,
                detail: format!("{log}: {finding}"),
            });
        }
    }
    out.violations
        .extend(disagreeing_summaries(store, log, &stretches, in_range).await?);
    for (stretch, key_id) in &attestations {
        if in_range(stretch) && !stretches.contains(stretch) {
            out.attestations_checked += 1;
            for finding in
                attest::audit(store, log, *stretch, std::slice::from_ref(key_id), None, None).await?
            {
                out.violations.push(Violation {
                    kind: ViolationKind::BadAttestation,
                    detail: format!("{log}: {finding}"),
                });
            }
        }
    }
    Ok(out)
}

/// A [`ViolationKind::SummariesDisagree`] for every minute that two of
/// the summaries (those `in_range`) both hold and disagree on. Only the
/// summaries that overlap another are read; a corrupt or vanished one is
/// left to the check against its bags, which names it.
async fn disagreeing_summaries(
    store: &dyn crate::BagStore,
    log: &str,
    stretches: &[crate::summary::Stretch],
    in_range: impl Fn(&crate::summary::Stretch) -> bool,
) -> crate::Result<Vec<Violation>> {
    use crate::summary;
    let mine: Vec<summary::Stretch> = stretches.iter().copied().filter(|s| in_range(s)).collect();
    let overlap = |a: &summary::Stretch, b: &summary::Stretch| a.from() <= b.last() && b.from() <= a.last();
    let mut loaded: BTreeMap<summary::Stretch, Option<summary::Summary>> = BTreeMap::new();
    let mut out = Vec::new();
    for (i, a) in mine.iter().enumerate() {
        // Sorted by first minute: the ones after `a` that start within it.
        for b in mine[i + 1..]
            .iter()
            .take_while(|b| b.from() <= a.last())
            .filter(|b| overlap(a, b))
        {
            for st in [a, b] {
                if !loaded.contains_key(st) {
                    let s = match summary::load(store, log, *st).await {
                        Ok(s) => Some(s),
                        Err(crate::Error::CorruptSummary { .. }) => None,
                        Err(e) => return Err(e),
                    };
                    loaded.insert(*st, s);
                }
            }
            let (Some(Some(x)), Some(Some(y))) = (loaded.get(a), loaded.get(b)) else {
                continue;
            };
            // The minutes of both that either holds a bag of (two empty
            // ones agree): never minute by minute over a long stretch.
            let spans: std::collections::BTreeSet<crate::seal::Span> = x
                .bags
                .iter()
                .chain(&y.bags)
                .map(|bag| Bucket::from_secs(bag.bucket_secs))
                .filter(|&bag| a.contains(bag) && b.contains(bag))
                .map(crate::seal::Span::of)
                .collect();
            for span in spans {
                let found = match summary::disagreement(x, y, span) {
                    Ok(found) => found,
                    Err(e) => Some(e.to_string()),
                };
                if let Some(how) = found {
                    out.push(Violation {
                        kind: ViolationKind::SummariesDisagree,
                        detail: format!(
                            "summaries {} and {} of {log} disagree on the minute {span}: {how}",
                            a.name(),
                            b.name()
                        ),
                    });
                }
            }
        }
    }
    Ok(out)
}

/// The reader's problems that are violations: damage in a closed bag
/// (a torn tail in an open bag may be a write in progress), a bag gone
/// that no summary read holds, and wherever it is found, a duplicated or
/// misplaced batch.
pub fn problem_violations(problems: &[crate::Problem], log: &str) -> Vec<Violation> {
    problems
        .iter()
        .filter_map(|p| {
            let kind = match p.kind {
                crate::ProblemKind::Damaged if p.in_open_bag => return None,
                crate::ProblemKind::Damaged => ViolationKind::CorruptRecord,
                crate::ProblemKind::Duplicate => ViolationKind::DuplicateBatch,
                crate::ProblemKind::Misplaced => ViolationKind::MisplacedBatch,
                crate::ProblemKind::Attestation => ViolationKind::BadAttestation,
                crate::ProblemKind::Missing => ViolationKind::MissingBag,
            };
            Some(Violation {
                kind,
                detail: format!("{log}/{} {}: {}", p.bucket.path(), p.item, p.what),
            })
        })
        .collect()
}

/// One holder of a name: its leases on the name (one per server it holds
/// the name on), each with the predecessor its server named.
#[derive(Default)]
struct Holder<'a> {
    fencing: u64,
    parts: Vec<(&'a LeaseFacts, pb::PreviousLease)>,
}

impl Holder<'_> {
    fn ids(&self) -> String {
        let ids: Vec<&str> = self
            .parts
            .iter()
            .map(|(f, _)| f.first.lease_id.as_str())
            .collect();
        ids.join("+")
    }
    fn issued(&self) -> u64 {
        self.parts
            .iter()
            .map(|(f, _)| f.first.issued_at_us)
            .min()
            .unwrap_or(0)
    }
    /// The latest deadline of any part: until then some server holds the
    /// name for this holder.
    fn deadline(&self) -> u64 {
        self.parts.iter().map(|(f, _)| f.deadline).max().unwrap_or(0)
    }
    /// The holder writes above every part's `min_timestamp`.
    fn min_timestamp(&self) -> u64 {
        self.parts
            .iter()
            .map(|(f, _)| f.first.min_timestamp_us)
            .max()
            .unwrap_or(0)
    }
    fn max_message_ts(&self) -> Option<u64> {
        self.parts.iter().filter_map(|(f, _)| f.max_message_ts).max()
    }
    fn min_message_ts(&self) -> Option<u64> {
        self.parts.iter().filter_map(|(f, _)| f.min_message_ts).min()
    }
}

/// Checks the link from lease `a` to its successor `b` on one server: how
/// `a` ended, as `b`'s witness says, against what `a` wrote and when `b`
/// was granted.
fn check_link(
    name: &str,
    a: &LeaseFacts,
    b: &LeaseFacts,
    prev: &pb::PreviousLease,
    v: &mut impl FnMut(ViolationKind, String),
) {
    let (a_id, b_id) = (&a.first.lease_id, &b.first.lease_id);
    let ended = prev.ended();
    let issued = b.first.issued_at_us;
    if ended == pb::Ended::Released {
        // The release time `b`'s own witness states: `b` was granted
        // while `a` still held the name if it came first.
        if issued < prev.ended_at_us {
            v(
                ViolationKind::OverlappingGrants,
                format!(
                    "{name}: lease {b_id} was granted at {issued}, before lease {a_id} was released at {}",
                    prev.ended_at_us
                ),
            );
        }
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
        // A broken lease's watermark is its last deadline, as `b`'s
        // server knew it; the deadlines the bags show may be earlier (a
        // renewal under which `a` wrote nothing is cited by no message).
        let deadline = a.deadline.max(prev.watermark_us);
        if issued < deadline {
            v(
                ViolationKind::OverlappingGrants,
                format!("{name}: lease {b_id} broke {a_id} at {issued} before its deadline {deadline}"),
            );
        }
        if prev.watermark_us < a.deadline {
            v(
                ViolationKind::ChainBroken,
                format!(
                    "{name}: lease {b_id} inherits watermark {} from broken lease {a_id}, below its deadline {}",
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
}

/// Groups lease ids into holders: leases cited together by one message
/// belong to one holder (union-find over the pairs). Returns each lease's
/// holder number.
fn holders<'a>(
    cited_together: &[(String, String)],
    ids: impl Iterator<Item = &'a String>,
) -> HashMap<&'a str, usize> {
    let ids: Vec<&'a String> = ids.collect();
    let index: HashMap<&str, usize> = ids.iter().enumerate().map(|(i, id)| (id.as_str(), i)).collect();
    let mut parent: Vec<usize> = (0..ids.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    for (x, y) in cited_together {
        if let (Some(&x), Some(&y)) = (index.get(x.as_str()), index.get(y.as_str())) {
            let (rx, ry) = (root(&mut parent, x), root(&mut parent, y));
            parent[rx.max(ry)] = rx.min(ry);
        }
    }
    ids.iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), root(&mut parent, i)))
        .collect()
}

#[cfg(test)]
mod tests;
