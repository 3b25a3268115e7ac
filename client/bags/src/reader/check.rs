//! The checks every batch goes through: witnesses, holder signatures,
//! signed times, bounds; and the messages they yield.

use std::collections::HashMap;
use std::sync::Arc;

use bagel_proto::{KeyRing, Micros, pb};
use bytes::Bytes;
use prost::Message as _;

use crate::{BagConfig, Bucket};

use super::items::{Place, misplaced};
use super::options::ReadOptions;
use super::report::{Message, ReadReport, Rejected, Vouched};
use super::seen::{Pending, Seen, TimeCheck};

/// The verdict on a batch's witnesses: per lease, its bounds.
pub(super) struct Lease {
    pub(super) id: String,
    pub(super) min: Micros,
    pub(super) deadline: Micros,
}

/// What a batch's witnesses decide (each checked once per read): the
/// first reason its messages are rejected, if any (no witness, a witness
/// that does not verify or is tentative), each lease's bounds, and the
/// holders they name when every witness could be read.
pub(super) struct Witnessed {
    pub(super) error: Option<String>,
    pub(super) leases: Vec<Lease>,
    pub(super) holders: Option<Vec<crate::holder_sig::Holder>>,
}

pub(super) fn witnessed<'w>(
    seen: &mut Seen<'_>,
    opts: &ReadOptions,
    witnesses: impl ExactSizeIterator<Item = &'w pb::Witness>,
) -> Witnessed {
    let n = witnesses.len();
    let mut error: Option<String> = None;
    let mut leases = Vec::with_capacity(n);
    let mut holders = Vec::with_capacity(n);
    if n == 0 {
        error = Some("cites no lease witness".into());
    }
    for w in witnesses {
        match &*seen.witness(w, opts.keys.as_ref()) {
            Ok(b) if !b.full => {
                error.get_or_insert_with(|| {
                    format!(
                        "cites the witness of lease {}, which is tentative: no right to write",
                        b.lease_id
                    )
                });
            }
            Ok(b) => {
                leases.push(Lease {
                    id: b.lease_id.clone(),
                    min: b.min,
                    deadline: b.deadline,
                });
                holders.push(b.holder.clone());
            }
            Err(e) => {
                error.get_or_insert_with(|| e.clone());
            }
        }
    }
    // The holder's signature: checked against the key inside each witness,
    // so it needs no trusted key of its own (the witness's does).
    let holders = (holders.len() == n && !holders.is_empty()).then_some(holders);
    Witnessed {
        error,
        leases,
        holders,
    }
}

/// Why a batch naming `log` and `bucket_secs`, found in `at_log`'s bag
/// `bucket`, is misplaced, if it is: its messages are rejected for it.
pub(super) fn misplaced_error(at_log: &str, bucket: Bucket, log: &str, bucket_secs: u64) -> Option<String> {
    misplaced(at_log, bucket, log, bucket_secs).then(|| {
        format!(
            "its batch names log {log:?} bag {}, not log {at_log:?} bag {bucket} where it was found (moved or copied)",
            Bucket::from_secs(bucket_secs),
        )
    })
}

/// What is done with a signed time `st` of a batch read `vouched` (or not).
pub(super) fn time_check(st: Option<&pb::SignedTime>, vouched: bool, opts: &ReadOptions) -> TimeCheck {
    // A local proof with the same keys, a Roughtime proof with the
    // Roughtime keys (plus its one-second resolution).
    let is_roughtime = matches!(
        st.and_then(|t| t.proof.as_ref()),
        Some(pb::signed_time::Proof::Roughtime(_))
    );
    // A trusted summarizer vouches for a local proof's signature, not for
    // whom it trusts: the signer must be one of this reader's own keys, as
    // for any batch read from the bags. Without keys, or with a signer
    // this reader does not know, the time is treated as unvouched.
    let vouched_time = match (vouched, st, &opts.keys) {
        (true, Some(st), Some(keys)) if local_signer_known(st, keys) => {
            crate::summary::attest::vouched_time(st)
        }
        _ => None,
    };
    match (st, &opts.keys) {
        (None, _) => TimeCheck::Note("no signed time"),
        (Some(_), _) if vouched_time.is_some() => {
            TimeCheck::Vouched(vouched_time.expect("checked just above"))
        }
        (Some(_), _) if is_roughtime && opts.roughtime_keys.is_empty() => {
            TimeCheck::Note("Roughtime signed time NOT verified (no Roughtime key given)")
        }
        (Some(_), None) if !is_roughtime => TimeCheck::Note("signed time NOT verified (no key given)"),
        (Some(st), _) => TimeCheck::Verify(st.encode_to_vec()),
    }
}

/// Whether `st` is a local proof signed by a key of `keys` (by key id).
pub(super) fn local_signer_known(st: &pb::SignedTime, keys: &KeyRing) -> bool {
    match &st.proof {
        Some(pb::signed_time::Proof::Local(local)) => keys.get(&local.key_id).is_some(),
        _ => false,
    }
}

/// The note on every message when witness signatures are not checked.
pub(super) const NO_KEY_NOTE: &str = "witness signatures NOT verified (no key given)";

/// Checks what a batch's witnesses decide now (once per distinct witness)
/// and leaves its holder signatures and signed time to [`Seen::next_round`].
pub(super) fn check_batch(
    seen: &mut Seen<'_>,
    opts: &ReadOptions,
    at: &Place<'_>,
    batch: pb::Batch,
    witnesses: Arc<[pb::Witness]>,
) {
    let Witnessed {
        error,
        leases,
        holders,
    } = witnessed(seen, opts, witnesses.iter());
    // Misplaced comes first, then what the witnesses say.
    let error = misplaced_error(at.log, at.bucket, &batch.log, batch.bucket_secs).or(error);
    let mut notes = Vec::new();
    if opts.keys.is_none() {
        notes.push(NO_KEY_NOTE.to_owned());
    }
    let time = time_check(batch.signed_time.as_ref(), at.vouched.is_some(), opts);
    seen.pending.push(Pending {
        batch,
        witnesses,
        bucket: at.bucket,
        open: at.open,
        error,
        notes,
        leases,
        holders,
        time,
        holder: None,
        vouched: at.vouched.clone(),
    });
}

/// Turns a checked batch into messages: accepted, or rejected with the
/// first reason that applies.
pub(super) fn finish_batch(
    report: &mut ReadReport,
    times: &HashMap<Vec<u8>, std::result::Result<bagel_proto::TimeReading, String>>,
    opts: &ReadOptions,
    cfg: &BagConfig,
    p: Pending,
) {
    let Pending {
        batch,
        witnesses,
        bucket,
        open,
        mut error,
        mut notes,
        leases,
        holder,
        time,
        vouched,
        ..
    } = p;
    let holder = holder.unwrap_or_else(not_all_witnesses_read);
    holder_verdict(&holder, &mut error, &mut notes);
    let time_ref = match &time {
        TimeCheck::Verify(key) => match times.get(key) {
            Some(verdict) => time_verdict(verdict, &mut error),
            None => unreachable!("every pending signed time is verified before its batch is finished"),
        },
        TimeCheck::Note(note) => {
            notes.push((*note).to_owned());
            None
        }
        TimeCheck::Vouched(verdict) => time_verdict(verdict, &mut error),
    };
    let vouched = match vouched {
        Some(key_id) => Vouched::Attested { key_id },
        None => Vouched::Checked,
    };
    let lease_ids: Vec<String> = leases.iter().map(|l| l.id.clone()).collect();
    let batch_at = BatchAt {
        bucket,
        open,
        writer_id: &batch.writer_id,
        first_sequence: batch.first_sequence,
        lease_ids: &lease_ids,
        leases: &leases,
        notes: &notes,
        witnesses,
        signed_time: batch.signed_time.map(Arc::new),
        holder: &holder,
        vouched: &vouched,
        error: &error,
        time_ref,
    };
    batch_at.push_messages(
        report,
        opts,
        cfg,
        batch
            .entries
            .into_iter()
            .map(|e| (e.timestamp_us, Bytes::from(e.payload))),
    );
}

/// The holder verdict of a batch whose witnesses could not all be read.
pub(super) fn not_all_witnesses_read() -> crate::holder_sig::HolderCheck {
    crate::holder_sig::HolderCheck::Bad {
        reason: "its witnesses could not all be read, so its holder signatures were not checked".into(),
    }
}

/// What a batch's holder verdict adds to its notes or error.
pub(super) fn holder_verdict(
    holder: &crate::holder_sig::HolderCheck,
    error: &mut Option<String>,
    notes: &mut Vec<String>,
) {
    match holder {
        crate::holder_sig::HolderCheck::Bound => {}
        crate::holder_sig::HolderCheck::Unbound { lease_ids } => notes.push(format!(
            "NOT bound to its writer: lease(s) {} were acquired without a holder key, so anyone with a \
             copy of their witness could have written this batch",
            lease_ids.join(", ")
        )),
        crate::holder_sig::HolderCheck::Bad { reason } => {
            error.get_or_insert_with(|| reason.clone());
        }
    }
}

/// A batch's signed time as verified (its reading), or why not (its error).
pub(super) fn time_verdict(
    verdict: &std::result::Result<bagel_proto::TimeReading, String>,
    error: &mut Option<String>,
) -> Option<bagel_proto::TimeReading> {
    match verdict {
        Ok(r) => Some(*r),
        Err(e) => {
            error.get_or_insert_with(|| format!("signed time: {e}"));
            None
        }
    }
}

/// A checked batch, all its messages share.
pub(super) struct BatchAt<'a> {
    pub(super) bucket: Bucket,
    pub(super) open: bool,
    pub(super) writer_id: &'a str,
    pub(super) first_sequence: u64,
    pub(super) lease_ids: &'a [String],
    pub(super) leases: &'a [Lease],
    pub(super) notes: &'a [String],
    pub(super) witnesses: Arc<[pb::Witness]>,
    pub(super) signed_time: Option<Arc<pb::SignedTime>>,
    pub(super) holder: &'a crate::holder_sig::HolderCheck,
    pub(super) vouched: &'a Vouched,
    /// Why all its messages are rejected, if they are.
    pub(super) error: &'a Option<String>,
    pub(super) time_ref: Option<bagel_proto::TimeReading>,
}

impl BatchAt<'_> {
    /// Its messages (timestamp, payload), in order, each accepted or
    /// rejected with the first reason that applies; those outside the
    /// read's range left out.
    pub(super) fn push_messages(
        &self,
        report: &mut ReadReport,
        opts: &ReadOptions,
        cfg: &BagConfig,
        entries: impl Iterator<Item = (u64, Bytes)>,
    ) {
        let bucket = self.bucket;
        for (i, (ts, payload)) in entries.enumerate() {
            let ts = Micros::from_micros(ts);
            if ts < opts.from || ts >= opts.to {
                continue;
            }
            let message = Message {
                timestamp: ts,
                writer_id: self.writer_id.to_owned(),
                sequence: self.first_sequence + i as u64,
                payload,
                bucket,
                lease_ids: self.lease_ids.to_vec(),
                from_open_bag: self.open,
                notes: self.notes.to_vec(),
                witnesses: Arc::clone(&self.witnesses),
                signed_time: self.signed_time.clone(),
                holder: self.holder.clone(),
                vouched: self.vouched.clone(),
            };
            let reason = self.error.clone().or_else(|| {
                if Bucket::of(ts) != bucket {
                    return Some(format!("timestamp {ts} does not belong in bag {bucket}"));
                }
                for l in self.leases {
                    if ts <= l.min {
                        return Some(format!(
                            "timestamp {ts} is not after lease {}'s min_timestamp {}",
                            l.id, l.min
                        ));
                    }
                    if ts >= l.deadline {
                        return Some(format!(
                            "timestamp {ts} is at or after lease {}'s deadline {}",
                            l.id, l.deadline
                        ));
                    }
                }
                if let Some(r) = self.time_ref
                    && let Err((diff, limit)) = r.congruent(ts, cfg.signed_time_tolerance)
                {
                    return Some(format!(
                        "timestamp {ts} is {diff} us away from its signed time {} (limit {limit} us)",
                        r.time
                    ));
                }
                None
            });
            match reason {
                Some(reason) => report.rejected.push(Rejected { message, reason }),
                None => report.messages.push(message),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use bagel_proto::{KeyRing, Micros};

    use super::super::options::ReadOptions;
    use super::super::seen::TimeCheck;
    use super::time_check;

    /// A local signed time in a trusted summary is taken as vouched only
    /// when its signer is one of the reader's keys, not the summarizer's:
    /// a reader with no keys, or other keys, verifies it itself or notes it
    /// as not verified.
    #[test]
    fn a_vouched_local_time_needs_the_readers_key() {
        let signer = bagel_proto::Signer::generate();
        let st = bagel_proto::sign_local_time(&signer, "t", Micros::from_micros(1_800_000_000_000_000), 0);
        let mine: KeyRing = [signer.verifying_key()].into_iter().collect();
        let other: KeyRing = [bagel_proto::Signer::generate().verifying_key()]
            .into_iter()
            .collect();
        let with = |keys: Option<KeyRing>| ReadOptions::default().with_keys(keys);
        assert!(matches!(
            time_check(Some(&st), true, &with(Some(mine))),
            TimeCheck::Vouched(Ok(_))
        ));
        assert!(matches!(
            time_check(Some(&st), true, &with(Some(other))),
            TimeCheck::Verify(_)
        ));
        assert!(matches!(
            time_check(Some(&st), true, &with(None)),
            TimeCheck::Note(_)
        ));
    }
}
