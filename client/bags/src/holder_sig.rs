//! The batch signature: a batch's bytes bound to the leases that allowed
//! them and to where they belong.
//!
//! A witness alone is transferable: anyone who copies it from a bag could
//! cite it for bytes of their own. So each lease has its own key: the
//! holder makes a fresh ed25519 key per lease, the lease server signs its
//! public key into the witness (`WitnessBody.holder_key`), and the writer
//! signs every batch with the secret key. A reader checks that signature
//! against the key *inside* the witness the batch cites, so a batch verifies
//! only if the holder of that very lease wrote exactly these bytes, for this
//! log, this bag, this writer and these sequence numbers.
//!
//! # The signing message
//! What each signature covers, byte for byte (integers big-endian,
//! `lp(x)` = `u32(len(x)) ‖ x`, `H` = SHA-256):
//!
//! ```text
//! "bagel.v1 holder batch\0"
//! lp(log) ‖ u64(bucket_secs) ‖ lp(writer_id) ‖ u64(first_sequence)
//! ‖ u32(#witnesses) ‖ H(witness.body) for each cited witness, in order
//! ‖ u32(#entries)   ‖ u64(timestamp_us) ‖ H(payload) for each entry, in order
//! ```
//!
//! The prefix keeps the signature from ever passing as another kind of
//! statement; the length prefixes and counts make the encoding injective
//! (no two batches share a message). A cited witness is named by the hash
//! of its exact body bytes, which holds the lease id, kind and deadline, so
//! a signature cannot be moved to another grant or renewal of the lease.
//! Not covered: the batch's signed time (it is signed by its own authority
//! and checked against the timestamps) and the witnesses' server
//! signatures (checked on their own).

use bagel_proto::{Signer, pb};
use ed25519_dalek::{Signature, Signer as _, VerifyingKey};
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;

/// The prefix of every batch signing message.
pub const DOMAIN: &[u8] = b"bagel.v1 holder batch\0";

fn put_lp(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).expect("a field of a framed record fits in u32");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
}

fn put_count(out: &mut Vec<u8>, n: usize) {
    let n = u32::try_from(n).expect("a count of a framed record fits in u32");
    out.extend_from_slice(&n.to_be_bytes());
}

/// The exact bytes a batch's holder signatures are over (see the module
/// docs). Reads every field but `signed_time` and `holder_signatures`.
pub fn signing_message(batch: &pb::Batch) -> Vec<u8> {
    signing_message_with(batch, &batch.witnesses)
}

/// [`signing_message`] of `batch` as if it cited `witnesses` (a reader
/// that keeps a batch's witnesses apart, shared with other batches).
pub fn signing_message_with(batch: &pb::Batch, witnesses: &[pb::Witness]) -> Vec<u8> {
    let mut m = Vec::with_capacity(
        DOMAIN.len()
            + 64
            + batch.log.len()
            + batch.writer_id.len()
            + 32 * witnesses.len()
            + 40 * batch.entries.len(),
    );
    m.extend_from_slice(DOMAIN);
    put_lp(&mut m, batch.log.as_bytes());
    m.extend_from_slice(&batch.bucket_secs.to_be_bytes());
    put_lp(&mut m, batch.writer_id.as_bytes());
    m.extend_from_slice(&batch.first_sequence.to_be_bytes());
    put_count(&mut m, witnesses.len());
    for w in witnesses {
        m.extend_from_slice(&Sha256::digest(&w.body));
    }
    put_count(&mut m, batch.entries.len());
    for e in &batch.entries {
        m.extend_from_slice(&e.timestamp_us.to_be_bytes());
        m.extend_from_slice(&Sha256::digest(&e.payload));
    }
    m
}

/// Fills `batch.holder_signatures`: for each cited witness whose body
/// names a holder key, the signature by the matching key of `holders`;
/// empty for a witness without one. Fails if a witness names a key none of
/// `holders` has (the writer does not hold that lease's key: it must not
/// write under it), or does not decode.
pub fn sign(batch: &mut pb::Batch, holders: &[Signer]) -> Result<(), String> {
    let message = signing_message(batch);
    let mut made: Vec<([u8; 32], Vec<u8>)> = Vec::new();
    let mut sigs = Vec::with_capacity(batch.witnesses.len());
    for w in &batch.witnesses {
        let body = bagel_proto::witness::decode_unverified(w)?;
        if body.holder_key.is_empty() {
            sigs.push(Vec::new());
            continue;
        }
        let signer = holders
            .iter()
            .find(|s| s.verifying_key().as_bytes().as_slice() == body.holder_key.as_slice())
            .ok_or_else(|| {
                format!(
                    "lease {}'s witness names a holder key this writer does not have: only the process \
                     that acquired the lease (or one given its lease file) can sign batches under it",
                    body.lease_id
                )
            })?;
        let key = signer.verifying_key().to_bytes();
        // One signature per distinct key (a lease over several servers
        // has one key in all of its witnesses).
        let sig = match made.iter().find(|(k, _)| *k == key) {
            Some((_, sig)) => sig.clone(),
            None => {
                let sig = signer.signing_key().sign(&message).to_bytes().to_vec();
                made.push((key, sig.clone()));
                sig
            }
        };
        sigs.push(sig);
    }
    batch.holder_signatures = sigs;
    Ok(())
}

/// What the holder signatures of a batch show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HolderCheck {
    /// Every cited witness names a holder key and its signature verifies.
    Bound,
    /// These leases were acquired without a holder key: their witnesses
    /// cannot vouch for the batch (anyone holding a copy of the witness
    /// could have written it). The other witnesses' signatures verify.
    Unbound {
        /// The leases whose witnesses carry no holder key.
        lease_ids: Vec<String>,
    },
    /// A signature is missing or does not verify: the batch is not what the
    /// holder of that lease wrote (forged, altered, or moved).
    Bad {
        /// Which signature and why it fails, for people.
        reason: String,
    },
}

/// Holder keys already decompressed, by their bytes: one lease's key
/// signs every batch written under it, and turning its 32 bytes into a
/// curve point (`VerifyingKey::from_bytes`, a square root in the field)
/// costs about a third of a verification. A key that does not decompress
/// is remembered as such. Keep one per read ([`check_cached`]).
///
/// # Why each signature is still verified on its own
/// Batch verification (`ed25519_dalek::verify_batch`) would be about twice
/// as fast on many small batches, but it does not decide what
/// [`VerifyingKey::verify_strict`] decides, so it is not used:
/// * in ed25519-dalek 2.2 it checks the cofactorless equation on a random
///   linear combination (128-bit coefficients): a signature whose `R`
///   differs from the recomputed one by a small-order point passes when
///   its coefficient kills that point, with probability up to 1/2, where
///   `verify_strict` always refuses it;
/// * it refuses neither a small-order `R` or key nor a non-canonical
///   encoding of `R`, which `verify_strict` does.
///
/// Only the holder of the lease's secret key can make such a signature
/// (anyone else would need a valid signature over that very `R`), but a
/// holder who did would have a batch that readers accept or refuse at
/// random, and falling back to one-by-one verification only after a batch
/// fails does not help: what passes the batch is never looked at again.
/// Readers must agree (a range read from bags, from summaries, or twice,
/// gives the same messages), so the checks that would close the gap come
/// first: the key is checked once per key here, but `R` would need a
/// torsion check (a full scalar multiplication) per signature, which costs
/// what batching saves. What a reader does instead is spread the
/// one-by-one verifications over its cores ([`check_holders`] needs no
/// shared state).
#[derive(Debug, Default)]
pub struct KeyCache(HashMap<[u8; 32], Option<VerifyingKey>>);

impl KeyCache {
    /// The verifying key for these bytes, `None` if they are not one.
    fn get(&mut self, raw: [u8; 32]) -> Option<VerifyingKey> {
        *self
            .0
            .entry(raw)
            .or_insert_with(|| VerifyingKey::from_bytes(&raw).ok())
    }

    /// The holder key a witness body names, resolved (decompressed once
    /// per key), for [`check_holders`].
    pub fn holder(&mut self, body: &pb::WitnessBody) -> Holder {
        let key = if body.holder_key.is_empty() {
            HolderKey::None
        } else {
            match <[u8; 32]>::try_from(body.holder_key.as_slice()) {
                Err(_) => HolderKey::NotThirtyTwoBytes,
                Ok(raw) => self.get(raw).map_or(HolderKey::Invalid, HolderKey::Key),
            }
        };
        Holder {
            lease_id: body.lease_id.clone(),
            key,
        }
    }
}

/// What a cited witness says of its lease's holder, resolved once
/// ([`KeyCache::holder`]): its lease id and the key it names.
#[derive(Clone, Debug)]
pub struct Holder {
    lease_id: String,
    key: HolderKey,
}

#[derive(Clone, Copy, Debug)]
enum HolderKey {
    /// Acquired without a holder key.
    None,
    NotThirtyTwoBytes,
    /// 32 bytes that are not an ed25519 key.
    Invalid,
    Key(VerifyingKey),
}

/// Checks `batch`'s holder signatures against the holder keys in
/// `bodies`, the decoded bodies of its witnesses in order (their server
/// signatures are checked apart from this).
pub fn check(batch: &pb::Batch, bodies: &[pb::WitnessBody]) -> HolderCheck {
    check_cached(batch, bodies, &mut KeyCache::default())
}

/// [`check`], with the holder keys met so far in `keys`: the same verdict,
/// each key decompressed once.
pub fn check_cached(batch: &pb::Batch, bodies: &[pb::WitnessBody], keys: &mut KeyCache) -> HolderCheck {
    let holders: Vec<Holder> = bodies.iter().map(|b| keys.holder(b)).collect();
    check_holders(batch, &holders)
}

/// [`check`], given the holders its witnesses name, in order, as
/// [`KeyCache::holder`] resolved them: the same verdict, and no shared
/// state, so that a reader can check many batches at once on several
/// threads.
pub fn check_holders(batch: &pb::Batch, holders: &[Holder]) -> HolderCheck {
    check_holders_with(batch, &batch.witnesses, holders)
}

/// [`check_holders`] of `batch` as if it cited `witnesses` (see
/// [`signing_message_with`]).
pub fn check_holders_with(batch: &pb::Batch, witnesses: &[pb::Witness], holders: &[Holder]) -> HolderCheck {
    let message = signing_message_with(batch, witnesses);
    let mut unbound = Vec::new();
    for (i, holder) in holders.iter().enumerate() {
        let bad = |why: &str| HolderCheck::Bad {
            reason: format!(
                "holder signature for lease {} {why}: the batch is not what that lease's holder wrote \
                 (forged, altered, or moved from another log or bag)",
                holder.lease_id
            ),
        };
        let key = match holder.key {
            HolderKey::None => {
                unbound.push(holder.lease_id.clone());
                continue;
            }
            HolderKey::NotThirtyTwoBytes => {
                return bad("cannot be checked (the witness's holder key is not 32 bytes)");
            }
            HolderKey::Invalid => {
                return bad("cannot be checked (the witness's holder key is not a valid ed25519 key)");
            }
            HolderKey::Key(key) => key,
        };
        let Some(sig) = batch.holder_signatures.get(i).filter(|s| !s.is_empty()) else {
            return bad("is missing");
        };
        let Ok(sig) = Signature::from_slice(sig) else {
            return bad("is malformed");
        };
        if key.verify_strict(&message, &sig).is_err() {
            return bad("does not verify");
        }
    }
    if unbound.is_empty() {
        HolderCheck::Bound
    } else {
        HolderCheck::Unbound { lease_ids: unbound }
    }
}

/// What [`check_holders`] says of a batch whose signatures a trusted
/// summarizer verified ([`crate::summary::attest`]): the same verdict but
/// for the signatures themselves, taken as verifying (no curve arithmetic).
pub fn assume_signed(holders: &[Holder]) -> HolderCheck {
    let mut unbound = Vec::new();
    for holder in holders {
        let why = match holder.key {
            HolderKey::None => {
                unbound.push(holder.lease_id.clone());
                continue;
            }
            HolderKey::Key(_) => continue,
            HolderKey::NotThirtyTwoBytes => "the witness's holder key is not 32 bytes",
            HolderKey::Invalid => "the witness's holder key is not a valid ed25519 key",
        };
        return HolderCheck::Bad {
            reason: format!(
                "holder signature for lease {} cannot be checked ({why}): the batch is not what that \
                 lease's holder wrote (forged, altered, or moved from another log or bag)",
                holder.lease_id
            ),
        };
    }
    if unbound.is_empty() {
        HolderCheck::Bound
    } else {
        HolderCheck::Unbound { lease_ids: unbound }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    fn witness(lease_id: &str, holder: Option<&Signer>) -> pb::Witness {
        let body = pb::WitnessBody {
            lease_id: lease_id.into(),
            holder_key: holder.map_or_else(Vec::new, |h| h.verifying_key().to_bytes().to_vec()),
            ..Default::default()
        };
        pb::Witness {
            body: body.encode_to_vec().into(),
            ..Default::default()
        }
    }

    fn batch(witnesses: Vec<pb::Witness>) -> pb::Batch {
        pb::Batch {
            writer_id: "w1".into(),
            first_sequence: 7,
            witnesses,
            entries: vec![
                pb::Entry {
                    timestamp_us: 1_700_000_000_000_001,
                    payload: b"deposit 10".to_vec(),
                },
                pb::Entry {
                    timestamp_us: 1_700_000_000_000_002,
                    payload: b"withdraw 3".to_vec(),
                },
            ],
            log: "ledger".into(),
            bucket_secs: 1_700_000_000,
            ..Default::default()
        }
    }

    fn bodies(b: &pb::Batch) -> Vec<pb::WitnessBody> {
        b.witnesses
            .iter()
            .map(|w| bagel_proto::witness::decode_unverified(w).unwrap())
            .collect()
    }

    #[test]
    fn the_signing_message_is_the_documented_encoding() {
        let w = witness("l1", None);
        let b = batch(vec![w.clone()]);
        let mut want = b"bagel.v1 holder batch\0".to_vec();
        want.extend_from_slice(&6u32.to_be_bytes());
        want.extend_from_slice(b"ledger");
        want.extend_from_slice(&1_700_000_000u64.to_be_bytes());
        want.extend_from_slice(&2u32.to_be_bytes());
        want.extend_from_slice(b"w1");
        want.extend_from_slice(&7u64.to_be_bytes());
        want.extend_from_slice(&1u32.to_be_bytes());
        want.extend_from_slice(&Sha256::digest(&w.body));
        want.extend_from_slice(&2u32.to_be_bytes());
        want.extend_from_slice(&1_700_000_000_000_001u64.to_be_bytes());
        want.extend_from_slice(&Sha256::digest(b"deposit 10"));
        want.extend_from_slice(&1_700_000_000_000_002u64.to_be_bytes());
        want.extend_from_slice(&Sha256::digest(b"withdraw 3"));
        assert_eq!(signing_message(&b), want);
    }

    #[test]
    fn every_covered_field_changes_the_message() {
        let base = batch(vec![witness("l1", None), witness("l2", None)]);
        let m = signing_message(&base);
        type Change = Box<dyn Fn(&mut pb::Batch)>;
        let changes: Vec<(&str, Change)> = vec![
            ("log", Box::new(|b| b.log = "ledger2".into())),
            ("bucket", Box::new(|b| b.bucket_secs += 1)),
            ("writer", Box::new(|b| b.writer_id = "w2".into())),
            ("sequence", Box::new(|b| b.first_sequence += 1)),
            (
                "payload",
                Box::new(|b| b.entries[1].payload = b"withdraw 1000000".to_vec()),
            ),
            ("timestamp", Box::new(|b| b.entries[0].timestamp_us += 1)),
            ("entry dropped", Box::new(|b| drop(b.entries.pop()))),
            ("witness", Box::new(|b| b.witnesses[1] = witness("l3", None))),
            ("witness order", Box::new(|b| b.witnesses.swap(0, 1))),
            // Length prefixes: moving a byte between log and writer.
            (
                "field boundary",
                Box::new(|b| {
                    b.log = "ledgerw".into();
                    b.writer_id = "1".into();
                }),
            ),
        ];
        for (what, change) in changes {
            let mut b = base.clone();
            change(&mut b);
            assert_ne!(signing_message(&b), m, "{what} is not covered");
        }
        // The signed time and the signatures themselves are not covered.
        let mut b = base.clone();
        b.holder_signatures = vec![vec![1; 64]];
        b.signed_time = Some(pb::SignedTime::default());
        assert_eq!(signing_message(&b), m);
    }

    #[test]
    fn a_signed_batch_verifies_and_any_change_does_not() {
        let holder = Signer::generate();
        let mut b = batch(vec![witness("l1", Some(&holder)), witness("l2", Some(&holder))]);
        sign(&mut b, std::slice::from_ref(&holder)).unwrap();
        assert_eq!(b.holder_signatures.len(), 2);
        assert_eq!(check(&b, &bodies(&b)), HolderCheck::Bound);

        let mut forged = b.clone();
        forged.entries[1].payload = b"withdraw 1000000".to_vec();
        assert!(matches!(
            check(&forged, &bodies(&forged)),
            HolderCheck::Bad { .. }
        ));
        let mut moved = b.clone();
        moved.log = "other".into();
        assert!(matches!(check(&moved, &bodies(&moved)), HolderCheck::Bad { .. }));
        let mut renamed = b.clone();
        renamed.writer_id = "mallory".into();
        assert!(matches!(
            check(&renamed, &bodies(&renamed)),
            HolderCheck::Bad { .. }
        ));
        let mut stripped = b.clone();
        stripped.holder_signatures.clear();
        match check(&stripped, &bodies(&stripped)) {
            HolderCheck::Bad { reason } => assert!(reason.contains("is missing"), "{reason}"),
            other => panic!("{other:?}"),
        }
        // Re-signed with another key: the witness names the holder's.
        let thief = Signer::generate();
        let mut resigned = forged.clone();
        let err = sign(&mut resigned, std::slice::from_ref(&thief)).unwrap_err();
        assert!(err.contains("does not have"), "{err}");
        resigned.holder_signatures = vec![
            thief
                .signing_key()
                .sign(&signing_message(&forged))
                .to_bytes()
                .to_vec();
            2
        ];
        assert!(matches!(
            check(&resigned, &bodies(&resigned)),
            HolderCheck::Bad { .. }
        ));
    }

    /// Leases of one process share a holder key for a second
    /// (`bagel_client::holder_key`): what binds a batch to its lease is
    /// the witness digest in the signed message, so a batch signed under
    /// one lease does not verify under another lease with the same key.
    #[test]
    fn a_batch_moved_to_another_lease_with_the_same_key_does_not_verify() {
        let shared = Signer::generate();
        let mut b = batch(vec![witness("lease-a", Some(&shared))]);
        sign(&mut b, std::slice::from_ref(&shared)).unwrap();
        assert_eq!(check(&b, &bodies(&b)), HolderCheck::Bound);
        let mut moved = b.clone();
        moved.witnesses = vec![witness("lease-b", Some(&shared))];
        assert!(matches!(check(&moved, &bodies(&moved)), HolderCheck::Bad { .. }));
    }

    #[test]
    fn a_witness_without_a_holder_key_is_unbound_not_bad() {
        let holder = Signer::generate();
        let mut b = batch(vec![witness("old", None), witness("new", Some(&holder))]);
        sign(&mut b, std::slice::from_ref(&holder)).unwrap();
        assert!(b.holder_signatures[0].is_empty());
        assert_eq!(
            check(&b, &bodies(&b)),
            HolderCheck::Unbound {
                lease_ids: vec!["old".into()]
            }
        );
    }
}
