//! Roughtime (RFC 10049) proofs: keys, and verifying stored exchanges
//! offline (asking servers is [`crate::authority::querier`]).
//!
//! A [`pb::RoughtimeProof`] is the exact request bytes we sent, the exact
//! response bytes we received, and the server's long-term public key.
//! [`verify_roughtime`] re-parses both and checks the whole chain an auditor
//! needs, years later and without the network:
//!
//! 1. the public key is one the caller trusts;
//! 2. the delegation (CERT.DELE) is signed by that long-term key;
//! 3. the signed response (SREP) is signed by the delegated key;
//! 4. MIDP lies within the delegation's MINT..MAXT;
//! 5. the request is a leaf of the Merkle tree whose ROOT was signed (INDX
//!    and PATH), and the response echoes the request's nonce, so the
//!    signature covers *our* request and not someone else's;
//! 6. the response's version was one the request offered.
//!
//! # Why the protocol crate over a tokio socket
//!
//! We use `roughenough-protocol` 2.2 for the wire format and do the
//! cryptography with `ed25519-dalek` and `sha2`, which bagel already uses,
//! rather than `roughenough-client`'s blocking `query()`:
//! * no thread parked per query (we run a tokio UDP socket with our own
//!   timeout and retries), and no C build of aws-lc in every crate that
//!   only wants to *verify* a stored proof (auditors);
//! * we choose the nonce. `Querier` chains its requests as RFC 10049
//!   section 8.4.1 describes: `nonce = SHA-512(previous response ||
//!   blind)[0:32]`, with `blind` kept in the proof. A sequence of signed times
//!   from one process thus proves its own order ([`follows`]): each request
//!   was made after the previous answer was received.
//!
//! The RFC version has whole-second resolution ([`RESOLUTION`]) and the 2.2
//! server reports a fixed 5 s radius; callers that compare a timestamp with
//! a Roughtime midpoint must allow for both.

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use ed25519_dalek::{Signature, VerifyingKey};
use roughenough_protocol::cursor::ParseCursor;
use roughenough_protocol::header::find_value_range;
use roughenough_protocol::request::Request;
use roughenough_protocol::response::Response;
use roughenough_protocol::tag::Tag;
use roughenough_protocol::tags::SrvCommitment;
use roughenough_protocol::wire::{FRAME_OVERHEAD, FromFrame as _};
use sha2::{Digest as _, Sha512};

use super::reading::{TimeProofKind, TimeReading};
use crate::{Error, Micros, pb};

/// The resolution of an RFC Roughtime midpoint: whole seconds.
pub const RESOLUTION: Duration = Duration::from_secs(1);

/// A Roughtime server's long-term ed25519 public key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RoughtimeKey([u8; 32]);

impl RoughtimeKey {
    /// The key of 32 raw bytes. Any 32 bytes are accepted here; bytes
    /// that are no ed25519 point fail at verification, as
    /// [`Error::BadPublicKey`].
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        RoughtimeKey(bytes)
    }

    /// The key stored in a proof's `public_key` field.
    ///
    /// # Errors
    /// [`Error::BadPublicKey`] unless `raw` is exactly 32 bytes.
    pub fn from_slice(raw: &[u8]) -> Result<Self, Error> {
        let arr: [u8; 32] = raw.try_into().map_err(|_| Error::BadPublicKey {
            reason: format!("roughtime key: expected 32 bytes, got {}", raw.len()),
        })?;
        Ok(RoughtimeKey(arr))
    }

    /// Parses 64 hex digits or base64 (standard or URL-safe, padded or not),
    /// the two forms Roughtime server lists and `roughenough` print.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let text = text.trim();
        let bad = |reason: String| Error::BadPublicKey {
            reason: format!("roughtime key {text:?}: {reason}"),
        };
        let bytes = if let Ok(raw) = crate::hex::decode_array::<32>(text) {
            raw.to_vec()
        } else {
            use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
            [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
                .iter()
                .find_map(|engine| engine.decode(text).ok())
                .ok_or_else(|| bad("neither 64 hex digits nor base64".into()))?
        };
        Self::from_slice(&bytes).map_err(|_| bad(format!("decodes to {} bytes, not 32", bytes.len())))
    }

    /// The raw key, as stored in proofs.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// `H(0xff || key)[0:32]`, the SRV tag a request sends to say which key
    /// it expects (RFC 10049 5.1.4).
    pub(crate) fn srv_commitment(&self) -> [u8; 32] {
        let mut h = Sha512::new();
        h.update(SrvCommitment::HASH_PREFIX_SRV);
        h.update(self.0);
        h.finalize()[..32].try_into().expect("64-byte digest")
    }
}

impl fmt::Display for RoughtimeKey {
    /// Lowercase hex.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::hex::encode(&self.0))
    }
}

impl fmt::Debug for RoughtimeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RoughtimeKey({self})")
    }
}

/// One configured Roughtime server: where to ask and which key must sign.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoughtimeServer {
    /// `host:port`.
    pub addr: String,
    /// The long-term key its answers must verify with; an answer signed
    /// by any other key is refused, never used.
    pub key: RoughtimeKey,
}

impl RoughtimeServer {
    /// A server at `addr` (`host:port`, resolved at each query) trusted
    /// with `key`.
    pub fn new(addr: impl Into<String>, key: RoughtimeKey) -> Self {
        RoughtimeServer {
            addr: addr.into(),
            key,
        }
    }

    /// Pairs repeated `--roughtime ADDR` and `--roughtime-key KEY` flags, in
    /// order. The counts must match: a server without a key would be
    /// unauthenticated time, which we never use.
    pub fn pair(addrs: &[String], keys: &[String]) -> Result<Vec<RoughtimeServer>, String> {
        if addrs.len() != keys.len() {
            return Err(format!(
                "{} Roughtime server address(es) but {} key(s): give one --roughtime-key per --roughtime, in the same order",
                addrs.len(),
                keys.len()
            ));
        }
        addrs
            .iter()
            .zip(keys)
            .map(|(addr, key)| {
                if !addr.contains(':') {
                    return Err(format!("Roughtime server {addr:?}: expected HOST:PORT"));
                }
                let key = RoughtimeKey::parse(key).map_err(|e| e.to_string())?;
                Ok(RoughtimeServer::new(addr.clone(), key))
            })
            .collect()
    }
}

impl fmt::Display for RoughtimeServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "roughtime {}", self.addr)
    }
}

/// What a verified Roughtime exchange says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoughtimeExchange {
    /// MIDP, whole seconds, as microseconds.
    pub midpoint: Micros,
    /// RADI: the server vouches that true time was within `midpoint ± radius`
    /// when it signed.
    pub radius: Duration,
    /// NONC: the request's nonce, which the answer signs; chained from
    /// the previous answer, so a sequence of proofs shows their order.
    pub nonce: [u8; 32],
    /// The trusted long-term key that signed the delegation.
    pub key: RoughtimeKey,
}

impl RoughtimeExchange {
    /// The exchange as a [`TimeReading`] (midpoint and radius; 1 s
    /// resolution).
    pub fn reading(&self) -> TimeReading {
        TimeReading {
            time: self.midpoint,
            radius_us: crate::duration_micros(self.radius),
            source: TimeProofKind::Roughtime,
        }
    }
}

fn invalid(check: &'static str, reason: impl Into<String>) -> Error {
    Error::RoughtimeInvalid {
        check,
        reason: reason.into(),
    }
}

fn parse_request(bytes: &[u8]) -> Result<Request, Error> {
    let mut buf = bytes.to_vec();
    Request::from_frame(&mut ParseCursor::new(&mut buf)).map_err(|e| Error::Malformed {
        what: "roughtime request",
        reason: e.to_string(),
    })
}

fn parse_response(bytes: &[u8]) -> Result<Response, Error> {
    // Exactly one frame: bytes after it are covered by no signature, and
    // would let two different proofs verify as the same exchange (found
    // by the fuzz tests).
    let framed = bytes
        .get(8..FRAME_OVERHEAD)
        .map(|b| FRAME_OVERHEAD as u64 + u64::from(u32::from_le_bytes(b.try_into().expect("4 bytes"))));
    if let Some(framed) = framed
        && (bytes.len() as u64) > framed
    {
        return Err(Error::Malformed {
            what: "roughtime response",
            reason: format!("{} bytes after its frame", bytes.len() as u64 - framed),
        });
    }
    let mut buf = bytes.to_vec();
    Response::from_frame(&mut ParseCursor::new(&mut buf)).map_err(|e| Error::Malformed {
        what: "roughtime response",
        reason: e.to_string(),
    })
}

/// The value of nested tags `path` in a framed message, as received (the
/// signatures cover these exact bytes; re-encoding could differ).
fn received_value<'a>(frame: &'a [u8], path: &[Tag]) -> Result<&'a [u8], Error> {
    let malformed = |reason: String| Error::Malformed {
        what: "roughtime response",
        reason,
    };
    let len = frame
        .get(8..FRAME_OVERHEAD)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
        .ok_or_else(|| malformed("shorter than its frame header".into()))?;
    let msg = frame
        .get(FRAME_OVERHEAD..FRAME_OVERHEAD + len)
        .ok_or_else(|| malformed("shorter than its frame length".into()))?;
    let range = find_value_range(msg, path).map_err(|e| malformed(e.to_string()))?;
    Ok(&msg[range])
}

fn verify_ed25519(
    key: &VerifyingKey,
    what: &str,
    prefix: &[u8],
    bytes: &[u8],
    sig: &[u8],
) -> Result<(), Error> {
    let bad = || Error::BadSignature {
        key_id: what.to_owned(),
    };
    let sig: [u8; 64] = sig.try_into().map_err(|_| bad())?;
    let mut msg = Vec::with_capacity(prefix.len() + bytes.len());
    msg.extend_from_slice(prefix);
    msg.extend_from_slice(bytes);
    key.verify_strict(&msg, &Signature::from_bytes(&sig))
        .map_err(|_| bad())
}

/// First 32 bytes of SHA-512 over the parts (RFC 10049 5.3).
fn h32(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha512::new();
    for p in parts {
        h.update(p);
    }
    h.finalize()[..32].try_into().expect("64-byte digest")
}

/// Recomputes the Merkle root from the request (a leaf) and the response's
/// INDX and PATH. `None` if INDX has bits beyond the path (RFC 10049 5.3.1).
fn merkle_root(request: &[u8], mut index: u32, path: &[u8]) -> Option<[u8; 32]> {
    let mut hash = h32(&[&[0x00], request]);
    for sibling in path.chunks(32) {
        hash = if index & 1 == 0 {
            h32(&[&[0x01], &hash, sibling])
        } else {
            h32(&[&[0x01], sibling, &hash])
        };
        index >>= 1;
    }
    (index == 0).then_some(hash)
}

/// Verifies a stored Roughtime exchange against the trusted long-term keys
/// and returns what it vouches for. See the module doc for every check.
pub fn verify_roughtime(
    proof: &pb::RoughtimeProof,
    trusted: &[RoughtimeKey],
) -> Result<RoughtimeExchange, Error> {
    let key = RoughtimeKey::from_slice(&proof.public_key)?;
    if !trusted.contains(&key) {
        return Err(Error::UntrustedRoughtimeKey { key: key.to_string() });
    }
    let long_term = VerifyingKey::from_bytes(key.as_bytes()).map_err(|e| Error::BadPublicKey {
        reason: format!("roughtime key {key}: {e}"),
    })?;
    let request = parse_request(&proof.request)?;
    let response = parse_response(&proof.response)?;

    let version = *response.srep().ver();
    if !request.ver().versions().contains(&version) {
        return Err(invalid(
            "version",
            format!(
                "response version {:#x} was not offered by the request",
                version.as_u32()
            ),
        ));
    }
    if let Some(srv) = request.srv()
        && srv.as_ref() != key.srv_commitment()
    {
        return Err(invalid("SRV", "the request was addressed to a different key"));
    }

    let dele = received_value(&proof.response, &[Tag::CERT, Tag::DELE])?;
    verify_ed25519(
        &long_term,
        &format!("roughtime long-term key {key} (CERT.DELE)"),
        version.dele_prefix(),
        dele,
        response.cert().sig().as_ref(),
    )?;
    let delegated_raw = response.cert().dele().pubk();
    let delegated = VerifyingKey::from_bytes(
        delegated_raw
            .as_ref()
            .try_into()
            .map_err(|_| invalid("DELE.PUBK", "not 32 bytes"))?,
    )
    .map_err(|e| invalid("DELE.PUBK", e.to_string()))?;
    let srep = received_value(&proof.response, &[Tag::SREP])?;
    verify_ed25519(
        &delegated,
        "roughtime delegated key (SREP)",
        version.srep_prefix(),
        srep,
        response.sig().as_ref(),
    )?;

    let (midp, mint, maxt) = (
        response.srep().midp(),
        response.cert().dele().mint(),
        response.cert().dele().maxt(),
    );
    if midp < mint || midp > maxt {
        return Err(invalid(
            "MIDP",
            format!("midpoint {midp} s is outside the delegation's validity {mint}..={maxt} s"),
        ));
    }

    let root = merkle_root(&proof.request, response.indx(), response.path().paths())
        .ok_or_else(|| invalid("INDX", "index has bits beyond the Merkle path"))?;
    if root != *response.srep().root().as_ref() {
        return Err(invalid(
            "PATH",
            "the request is not a leaf of the signed Merkle tree: the signature is not for this request",
        ));
    }
    if response.nonc() != request.nonc() {
        return Err(invalid("NONC", "the response echoes a different nonce"));
    }

    let midpoint = midp
        .checked_mul(1_000_000)
        .map(Micros::from_micros)
        .ok_or_else(|| invalid("MIDP", format!("{midp} s does not fit in microseconds")))?;
    Ok(RoughtimeExchange {
        midpoint,
        radius: Duration::from_secs(u64::from(response.srep().radi())),
        nonce: (*request.nonc()).into(),
        key,
    })
}

/// `SHA-512(previous_response || blind)[0:32]`: the chained nonce of RFC
/// 10049 8.4.1. `previous_response` is empty for a querier's first request.
pub fn chained_nonce(previous_response: &[u8], blind: &[u8]) -> [u8; 32] {
    h32(&[previous_response, blind])
}

/// Whether `next` was requested after `previous` was received: `next`'s
/// nonce is the hash of `previous`'s response bytes and `next`'s blind.
/// Checks only the link; verify each proof with [`verify_roughtime`] too.
pub fn follows(previous: &pb::RoughtimeProof, next: &pb::RoughtimeProof) -> Result<bool, Error> {
    if next.blind.is_empty() {
        return Ok(false);
    }
    let request = parse_request(&next.request)?;
    Ok(request.nonc().as_ref() == chained_nonce(&previous.response, &next.blind))
}

#[cfg(test)]
#[path = "roughtime_tests.rs"]
mod tests;
