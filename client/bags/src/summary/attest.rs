//! Summarizer attestations: a summarizer's signed word that a published
//! summary is what its source bags hold and that every signature in it
//! verifies, so that a reader who trusts that summarizer need not verify
//! each batch again.
//!
//! ```text
//! <log>/_summary/<first second>.<seconds>                      the summary
//! <log>/_summary/<first second>.<seconds>.<key id>.attestation  one per summarizer key
//! ```
//!
//! # What an attestation says
//! A summarizer holding an attestation key ([`Attester`]) signs only after
//! it has itself built the summary from the stretch's sealed minutes and
//! closed bags ([`super::build`]), found it published byte for byte
//! ([`super::publish`]), and verified every signature in it under its own
//! trusted keys: each cited witness's server signature, each batch's holder
//! signatures ([`crate::holder_sig`]), each signed time. A summary with any
//! signature that does not verify (or cannot be verified: a Roughtime proof
//! without Roughtime keys) is not attested ([`Attested::Refused`]) and
//! readers check it in full.
//!
//! A reader that trusts the key ([`crate::ReadOptions::with_trusted_summarizers`])
//! then skips the holder signatures and signed-time proofs of that
//! summary's batches (the per-batch ed25519 verifications, nearly all of a
//! read's time) and still makes every other check: witness signatures
//! (once per lease), bounds, signed-time congruence, copies, placement.
//!
//! # The bytes
//! Fixed layout (integers big-endian, `lp(x)` = `u32(len(x)) ‖ x`):
//!
//! ```text
//! "bagel summary attestation v1\0"
//! lp(log) ‖ u64(first second) ‖ u32(minutes) ‖ u32(summary format)
//! ‖ SHA-256 of the summary's stored bytes (32) ‖ lp(key id) ‖ public key (32)
//! ‖ ed25519 signature over all of the above (64)
//! ```
//!
//! Ed25519 signatures are deterministic, so the same key over the same
//! summary always gives the same bytes: publication is create-only like the
//! summary's, and a second summarizer with the same key finds its own
//! attestation already there.

use std::collections::HashMap;
use std::sync::Arc;

use bagel_proto::signed_time::roughtime::RoughtimeKey;
use bagel_proto::{KeyRing, Signer, pb};
use bytes::Bytes;
use ed25519_dalek::{Signature, Signer as _, VerifyingKey};
use prost::Message as _;
use sha2::{Digest as _, Sha256};

use super::{MAX_SUMMARY_BYTES, Records, SUMMARY_DIR, Stretch, Summary};
use crate::frame::{self, Frame};
use crate::{BagStore, Bucket, Error, Result};

/// The prefix of every attestation: nothing else a key signs can pass for
/// one.
pub const DOMAIN: &[u8] = b"bagel summary attestation v1\0";
/// How an attestation's name ends.
pub const SUFFIX: &str = ".attestation";
/// No attestation is bigger (its log name is at most a few hundred bytes).
const MAX_BYTES: u64 = 64 << 10;

/// An attestation, parsed and its signature checked against the key it
/// names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attestation {
    /// The log of the summary it attests.
    pub log: String,
    /// The stretch of the summary it attests.
    pub stretch: Stretch,
    /// The format of the summary it attests (1 or 2).
    pub format: u32,
    /// SHA-256 of the summary's stored bytes.
    pub summary_sha256: [u8; 32],
    /// The id of the summarizer's key; readers trust it by this id.
    pub key_id: String,
    /// The key its signature verified with.
    pub key: VerifyingKey,
}

fn put_lp(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).expect("a log name or key id fits in u32");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
}

/// What the signature covers (everything but the signature).
fn body(
    log: &str,
    stretch: Stretch,
    format: u32,
    digest: &[u8; 32],
    key_id: &str,
    key: &VerifyingKey,
) -> Vec<u8> {
    let mut m = Vec::with_capacity(DOMAIN.len() + log.len() + key_id.len() + 96);
    m.extend_from_slice(DOMAIN);
    put_lp(&mut m, log.as_bytes());
    m.extend_from_slice(&stretch.from().secs().to_be_bytes());
    m.extend_from_slice(&stretch.minutes.to_be_bytes());
    m.extend_from_slice(&format.to_be_bytes());
    m.extend_from_slice(digest);
    put_lp(&mut m, key_id.as_bytes());
    m.extend_from_slice(key.as_bytes());
    m
}

/// The attestation's bytes: the same for the same key and summary.
pub fn encode(signer: &Signer, log: &str, stretch: Stretch, format: u32, digest: &[u8; 32]) -> Bytes {
    let mut m = body(
        log,
        stretch,
        format,
        digest,
        signer.key_id(),
        &signer.verifying_key(),
    );
    let sig = signer.signing_key().sign(&m);
    m.extend_from_slice(&sig.to_bytes());
    Bytes::from(m)
}

/// Parses an attestation and checks its signature against the key it
/// names (and that the key id is that key's). Says nothing of whether the
/// key is trusted or the summary is the one attested.
pub fn decode(bytes: &[u8]) -> std::result::Result<Attestation, String> {
    let mut at = bytes
        .strip_prefix(DOMAIN)
        .ok_or("not an attestation (wrong prefix)")?;
    fn take<'a>(at: &mut &'a [u8], n: usize) -> std::result::Result<&'a [u8], String> {
        if at.len() < n {
            return Err("cut short".into());
        }
        let (head, tail) = at.split_at(n);
        *at = tail;
        Ok(head)
    }
    fn lp<'a>(at: &mut &'a [u8]) -> std::result::Result<&'a [u8], String> {
        let len = u32::from_be_bytes(take(at, 4)?.try_into().expect("4 bytes"));
        take(at, len as usize)
    }
    let log = String::from_utf8(lp(&mut at)?.to_vec()).map_err(|_| "its log is not UTF-8")?;
    let from = u64::from_be_bytes(take(&mut at, 8)?.try_into().expect("8 bytes"));
    let minutes = u32::from_be_bytes(take(&mut at, 4)?.try_into().expect("4 bytes"));
    let format = u32::from_be_bytes(take(&mut at, 4)?.try_into().expect("4 bytes"));
    let digest: [u8; 32] = take(&mut at, 32)?.try_into().expect("32 bytes");
    let key_id = String::from_utf8(lp(&mut at)?.to_vec()).map_err(|_| "its key id is not UTF-8")?;
    let raw: [u8; 32] = take(&mut at, 32)?.try_into().expect("32 bytes");
    let sig = take(&mut at, 64)?;
    if !at.is_empty() {
        return Err(format!("{} bytes after its signature", at.len()));
    }
    let key = VerifyingKey::from_bytes(&raw).map_err(|_| "its public key is not an ed25519 key")?;
    if bagel_proto::key_id(&key) != key_id {
        return Err(format!("key id {key_id} is not the id of its public key"));
    }
    if from % crate::seal::SPAN_SECS != 0 || minutes == 0 {
        return Err(format!("{from}+{minutes}m is not a stretch of whole minutes"));
    }
    let stretch = Stretch::new(crate::seal::Span::of(Bucket::from_secs(from)), minutes);
    let signed = &bytes[..bytes.len() - 64];
    let sig = Signature::from_slice(sig).map_err(|_| "its signature is malformed")?;
    key.verify_strict(signed, &sig)
        .map_err(|_| format!("its signature by key {key_id} does not verify"))?;
    Ok(Attestation {
        log,
        stretch,
        format,
        summary_sha256: digest,
        key_id,
        key,
    })
}

/// Where the attestation of `stretch` by `key_id` is published.
pub fn name(stretch: Stretch, key_id: &str) -> String {
    format!("{}.{key_id}{SUFFIX}", stretch.name())
}

/// The stretch and key id an attestation's name (under `_summary/`) says.
fn parse_name(name: &str) -> Option<(Stretch, String)> {
    let rest = name.strip_suffix(SUFFIX)?;
    let (summary, key_id) = rest.rsplit_once('.')?;
    if key_id.is_empty() || !key_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some((Stretch::parse(summary)?, key_id.to_owned()))
}

/// Every attestation published beside the summaries of `log`: (stretch,
/// key id), in order (one listing).
pub async fn list(store: &dyn BagStore, log: &str) -> Result<Vec<(Stretch, String)>> {
    let mut out: Vec<(Stretch, String)> = store
        .list_named(log, SUMMARY_DIR)
        .await?
        .iter()
        .filter_map(|n| parse_name(n))
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// The format of a summary's stored bytes (1 has no format field).
fn stored_format(bytes: &Bytes) -> u32 {
    match Summary::decode(bytes.clone()) {
        Ok(s) if s.format != 0 => s.format,
        _ => 1,
    }
}

/// The SHA-256 of a summary's stored bytes.
pub fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Checks the attestation of `stretch` by `key_id` against the summary's
/// stored bytes (their SHA-256, `digest`): it parses, is signed by the key
/// it names, is for this log and stretch, and is over exactly these bytes.
/// With `trusted`, the key must also be the one trusted under that id.
/// `Ok(None)`: there is none. `Ok(Some(Err(why)))`: there is one and it
/// fails (never to be ignored).
pub async fn check(
    store: &dyn BagStore,
    log: &str,
    stretch: Stretch,
    key_id: &str,
    trusted: Option<&KeyRing>,
    digest: &[u8; 32],
) -> Result<Option<std::result::Result<Attestation, String>>> {
    let Some(bytes) = store.get_named(log, &name(stretch, key_id), MAX_BYTES).await? else {
        return Ok(None);
    };
    Ok(Some(judge(&bytes, log, stretch, key_id, trusted, digest)))
}

fn judge(
    bytes: &[u8],
    log: &str,
    stretch: Stretch,
    key_id: &str,
    trusted: Option<&KeyRing>,
    digest: &[u8; 32],
) -> std::result::Result<Attestation, String> {
    let a = decode(bytes)?;
    if a.key_id != key_id {
        return Err(format!(
            "it is signed by key {}, not the {key_id} its name says",
            a.key_id
        ));
    }
    if let Some(ring) = trusted
        && ring.get(key_id) != Some(&a.key)
    {
        return Err(format!("key {key_id} is not the trusted key of that id"));
    }
    if a.log != log || a.stretch != stretch {
        return Err(format!(
            "it attests log {:?} stretch {}, not what its name says",
            a.log, a.stretch
        ));
    }
    if a.summary_sha256 != *digest {
        return Err(format!(
            "key {key_id} attests a summary with SHA-256 {}, but the published summary's is {}",
            bagel_proto::hex::encode(&a.summary_sha256),
            bagel_proto::hex::encode(digest)
        ));
    }
    Ok(a)
}

/// A summarizer's attestation key and the keys it verifies summaries with.
#[derive(Clone, Debug)]
pub struct Attester {
    /// The summarizer's own key, that signs its attestations.
    pub signer: Signer,
    /// The lease servers' keys (witnesses and local signed times).
    pub keys: KeyRing,
    /// Trusted Roughtime keys, for signed times that are Roughtime proofs.
    pub roughtime_keys: Vec<RoughtimeKey>,
}

/// What [`attest`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attested {
    /// Published (`created`) or found already published, byte for byte.
    Published {
        /// The attestation's object name in the log.
        name: String,
        /// The id of the key that signed it.
        key_id: String,
        /// This call published it.
        created: bool,
    },
    /// Not attested: a signature in the summary does not verify (or
    /// cannot be verified with the summarizer's keys). Readers check it
    /// in full.
    Refused {
        /// The id of the summarizer's key.
        key_id: String,
        /// Which signature failed and why, for people.
        reason: String,
    },
}

/// Attests the published summary of `stretch`, which the caller has just
/// built from its bags as `built` and published ([`super::publish`]):
/// verifies every signature in it, then publishes the attestation
/// create-only. One already there with other bytes is refused
/// ([`Error::SummaryMismatch`]): the same key over the same summary gives
/// the same bytes.
pub async fn attest(
    store: &dyn BagStore,
    log: &str,
    stretch: Stretch,
    built: Summary,
    attester: &Attester,
) -> Result<Attested> {
    let key_id = attester.signer.key_id().to_owned();
    let summary_name = stretch.name();
    // What readers will read: the stored bytes (publish has compared them
    // with `built`; one found in format 1 holds the same records).
    let stored = store
        .get_named(log, &summary_name, MAX_SUMMARY_BYTES)
        .await?
        .ok_or_else(|| Error::SummaryMismatch {
            log: log.to_owned(),
            name: summary_name.clone(),
            reason: "published a moment ago, and now gone".into(),
        })?;
    let same =
        stored == built.encode_to_vec() || super::packed::decode(stored.clone()).is_ok_and(|s| s == built);
    if !same {
        return Err(Error::SummaryMismatch {
            log: log.to_owned(),
            name: summary_name,
            reason: "the published summary is not the one its bags give: not attested".into(),
        });
    }
    let keys = (attester.keys.clone(), attester.roughtime_keys.clone());
    let built = Arc::new(built);
    let verdict = tokio::task::spawn_blocking(move || verify_signatures(&built, &keys.0, &keys.1))
        .await
        .map_err(|e| Error::Io {
            op: "verify",
            path: summary_name.clone(),
            source: std::io::Error::other(e.to_string()),
        })?;
    if let Err(reason) = verdict {
        return Ok(Attested::Refused { key_id, reason });
    }
    let bytes = encode(
        &attester.signer,
        log,
        stretch,
        stored_format(&stored),
        &digest(&stored),
    );
    let name = name(stretch, &key_id);
    let theirs = match store.get_named(log, &name, MAX_BYTES).await? {
        Some(theirs) => Some(theirs),
        None => store.put_first(log, &name, bytes.clone()).await?,
    };
    match theirs {
        None => Ok(Attested::Published {
            name,
            key_id,
            created: true,
        }),
        Some(theirs) if theirs == bytes => Ok(Attested::Published {
            name,
            key_id,
            created: false,
        }),
        Some(_) => Err(Error::SummaryMismatch {
            log: log.to_owned(),
            name,
            reason: "an attestation with other bytes is already published under this key's name".into(),
        }),
    }
}

/// Verifies every signature in `summary`: each distinct witness against
/// `keys`, each batch's holder signatures against the holder keys its
/// witnesses name, each distinct signed time. The holder signatures are
/// spread over the machine's cores. `Err` names the first that fails.
pub fn verify_signatures(
    summary: &Summary,
    keys: &KeyRing,
    roughtime_keys: &[RoughtimeKey],
) -> std::result::Result<u64, String> {
    let mut batches: Vec<(Bucket, pb::Batch)> = Vec::new();
    for bag in &summary.bags {
        let bucket = Bucket::from_secs(bag.bucket_secs);
        for item in &bag.items {
            match super::rebuild_item(summary, bag, item)
                .map_err(|e| e.to_string())?
                .records
            {
                Records::Batches(b) => batches.extend(b.into_iter().map(|r| (bucket, r.batch))),
                Records::Raw(raw) => {
                    for f in frame::decode(&raw) {
                        // Damage and records that are not batches hold no
                        // signature: every reader reports them alike.
                        if let Frame::Record { body, .. } = f
                            && let Ok(b) = pb::Batch::decode(body)
                        {
                            batches.push((bucket, b));
                        }
                    }
                }
            }
        }
    }
    let mut witnesses: HashMap<Vec<u8>, crate::holder_sig::Holder> = HashMap::new();
    let mut times: std::collections::HashSet<Vec<u8>> = std::collections::HashSet::new();
    let mut cache = crate::holder_sig::KeyCache::default();
    let mut work: Vec<(usize, Vec<crate::holder_sig::Holder>)> = Vec::with_capacity(batches.len());
    let name = |(bucket, b): &(Bucket, pb::Batch)| {
        format!(
            "bag {bucket} writer {:?} sequence {}",
            b.writer_id, b.first_sequence
        )
    };
    for (i, entry) in batches.iter().enumerate() {
        let b = &entry.1;
        let mut holders = Vec::with_capacity(b.witnesses.len());
        for w in &b.witnesses {
            let k = w.encode_to_vec();
            if let Some(h) = witnesses.get(&k) {
                holders.push(h.clone());
                continue;
            }
            let body = bagel_proto::verify_witness(w, keys)
                .map_err(|e| format!("{}: witness {}: {e}", name(entry), w.key_id))?;
            let h = cache.holder(&body);
            witnesses.insert(k, h.clone());
            holders.push(h);
        }
        if let Some(st) = &b.signed_time {
            let k = st.encode_to_vec();
            if !times.contains(&k) {
                bagel_proto::verify_signed_time(st, keys, roughtime_keys)
                    .map_err(|e| format!("{}: signed time: {e}", name(entry)))?;
                times.insert(k);
            }
        }
        work.push((i, holders));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = work.len().div_ceil(cores).max(1);
    let failed: Option<String> = std::thread::scope(|s| {
        let handles: Vec<_> = work
            .chunks(per)
            .map(|chunk| {
                let batches = &batches;
                s.spawn(move || {
                    chunk.iter().find_map(|(i, holders)| {
                        match crate::holder_sig::check_holders(&batches[*i].1, holders) {
                            crate::holder_sig::HolderCheck::Bad { reason } => Some((*i, reason)),
                            _ => None,
                        }
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().expect("a signature check panicked"))
            .min_by_key(|(i, _)| *i)
            .map(|(i, reason)| format!("{}: {reason}", name(&batches[i])))
    });
    match failed {
        Some(why) => Err(why),
        None => Ok(batches.len() as u64),
    }
}

/// The signed time of a batch in an attested summary, read without
/// verifying its proof (the summarizer did): `None` for a Roughtime proof,
/// which the reader still verifies.
pub(crate) fn vouched_time(
    st: &pb::SignedTime,
) -> Option<std::result::Result<bagel_proto::TimeReading, String>> {
    match &st.proof {
        Some(pb::signed_time::Proof::Local(local)) => Some(
            pb::LocalTimeBody::decode(local.body.as_slice())
                .map(|b| bagel_proto::TimeReading {
                    time: bagel_proto::Micros::from_micros(b.time_us),
                    radius_us: b.radius_us,
                    source: bagel_proto::TimeProofKind::Local,
                })
                .map_err(|e| format!("local time body does not decode: {e}")),
        ),
        _ => None,
    }
}

/// What an auditor finds of the attestations of `stretch`, given the
/// summary's stored bytes and whether the summary checked against its bags
/// (`None`: its bags are gone, or it was not checked): each attestation
/// that fails or attests a summary that does not match its bags, named by
/// its key.
pub async fn audit(
    store: &dyn BagStore,
    log: &str,
    stretch: Stretch,
    key_ids: &[String],
    summary_bytes: Option<&[u8]>,
    matches_bags: Option<bool>,
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for key_id in key_ids {
        let Some(bytes) = store.get_named(log, &name(stretch, key_id), MAX_BYTES).await? else {
            continue;
        };
        let Some(summary) = summary_bytes else {
            out.push(format!(
                "attestation by key {key_id} of {stretch}: there is no summary to attest"
            ));
            continue;
        };
        match judge(&bytes, log, stretch, key_id, None, &digest(summary)) {
            Err(why) => out.push(format!("attestation by key {key_id} of {stretch}: {why}")),
            Ok(_) if matches_bags == Some(false) => out.push(format!(
                "attestation by key {key_id} of {stretch}: key {key_id} attests a summary that does not \
                 match its source bags"
            )),
            Ok(_) => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::Span;

    fn stretch() -> Stretch {
        Stretch::new(Span::of(Bucket::from_secs(1_800_000_000)), 1)
    }

    #[test]
    fn the_bytes_are_the_documented_layout_and_deterministic() {
        let signer = Signer::from_secret(&[7; 32]);
        let d = [9u8; 32];
        let a = encode(&signer, "ledger", stretch(), 2, &d);
        assert_eq!(a, encode(&signer, "ledger", stretch(), 2, &d));
        let mut want = b"bagel summary attestation v1\0".to_vec();
        want.extend_from_slice(&6u32.to_be_bytes());
        want.extend_from_slice(b"ledger");
        want.extend_from_slice(&stretch().from().secs().to_be_bytes());
        want.extend_from_slice(&1u32.to_be_bytes());
        want.extend_from_slice(&2u32.to_be_bytes());
        want.extend_from_slice(&d);
        want.extend_from_slice(&16u32.to_be_bytes());
        want.extend_from_slice(signer.key_id().as_bytes());
        want.extend_from_slice(signer.verifying_key().as_bytes());
        assert_eq!(&a[..a.len() - 64], &want[..]);
        let parsed = decode(&a).unwrap();
        assert_eq!(
            (
                parsed.log.as_str(),
                parsed.stretch,
                parsed.format,
                parsed.summary_sha256
            ),
            ("ledger", stretch(), 2, d)
        );
        assert_eq!(parsed.key_id, signer.key_id());
    }

    #[test]
    fn any_changed_byte_or_a_trailing_one_is_refused() {
        let signer = Signer::from_secret(&[7; 32]);
        let a = encode(&signer, "ledger", stretch(), 2, &[9; 32]);
        for i in 0..a.len() {
            let mut b = a.to_vec();
            b[i] ^= 1;
            assert!(decode(&b).is_err(), "byte {i} changed and still accepted");
        }
        let mut longer = a.to_vec();
        longer.push(0);
        assert!(decode(&longer).is_err());
        assert!(decode(&a[..a.len() - 1]).is_err());
    }

    #[test]
    fn names_round_trip_and_are_not_summary_names() {
        let n = name(stretch(), "00112233aabbccdd");
        let under = n.strip_prefix("_summary/").unwrap();
        assert_eq!(
            parse_name(under),
            Some((stretch(), "00112233aabbccdd".to_owned()))
        );
        assert_eq!(Stretch::parse(under), None);
        assert_eq!(
            parse_name(stretch().name().strip_prefix("_summary/").unwrap()),
            None
        );
    }
}
