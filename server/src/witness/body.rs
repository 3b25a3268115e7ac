//! A grant's witness body, encoded straight from the table's grant.
//!
//! The body is what every grant pays to state: built as a `pb::WitnessBody`
//! first, it cost a `String` per id, name and owner, a clone of the signed
//! time (three more allocations) and of the previous holder's signed time,
//! then a second walk to encode it: ~0.7 µs a grant, about as much as its
//! share of a group's Merkle tree and signature. Here the same protobuf
//! bytes are written field by field into one buffer sized up front.
//!
//! The bytes must be exactly what `prost` makes of
//! [`WitnessSigner::body`](super::WitnessSigner::body): verifiers decode
//! them with the generated types, and a property test holds the two equal
//! for arbitrary grants. Field numbers are those of `witness.proto`.

use bagel_proto::{Micros, pb};
use prost::encoding::encoded_len_varint;

use crate::table::{Grant, LeaseId, NameGrant, Previous};
use crate::timekeeper::SignedReading;

/// Where encoded bytes go: a buffer, or a count of them (for the length
/// prefix of a nested message, which protobuf puts before its bytes).
trait Out {
    fn varint(&mut self, v: u64);
    fn bytes(&mut self, b: &[u8]);
    fn message(&mut self, m: &impl prost::Message);
    /// A lease id's 32 hex digits (worked out only when written).
    fn hex(&mut self, lease: LeaseId);
}

impl Out for Vec<u8> {
    /// Formed on the stack and appended at once: `prost`'s
    /// `encode_varint` puts a byte at a time through `BufMut`, which was a
    /// third of the body's time (its eight-byte microsecond times).
    fn varint(&mut self, mut v: u64) {
        let mut bytes = [0u8; 10];
        let mut n = 0;
        while v >= 0x80 {
            bytes[n] = v as u8 | 0x80;
            v >>= 7;
            n += 1;
        }
        bytes[n] = v as u8;
        self.extend_from_slice(&bytes[..=n]);
    }
    fn bytes(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
    fn message(&mut self, m: &impl prost::Message) {
        m.encode_raw(self);
    }
    fn hex(&mut self, lease: LeaseId) {
        self.extend_from_slice(&lease.hex());
    }
}

/// Counts the bytes it is given.
struct Len(usize);

impl Out for Len {
    fn varint(&mut self, v: u64) {
        self.0 += encoded_len_varint(v);
    }
    fn bytes(&mut self, b: &[u8]) {
        self.0 += b.len();
    }
    fn message(&mut self, m: &impl prost::Message) {
        self.0 += m.encoded_len();
    }
    fn hex(&mut self, _: LeaseId) {
        self.0 += 32;
    }
}

const VARINT: u64 = 0;
const LEN: u64 = 2;

fn key(out: &mut impl Out, field: u64, wire_type: u64) {
    out.varint((field << 3) | wire_type);
}

/// A proto3 scalar: left out when zero.
fn uint(out: &mut impl Out, field: u64, v: u64) {
    if v != 0 {
        key(out, field, VARINT);
        out.varint(v);
    }
}

/// A string or bytes field: left out when empty.
fn bytes(out: &mut impl Out, field: u64, b: &[u8]) {
    if !b.is_empty() {
        key(out, field, LEN);
        out.varint(b.len() as u64);
        out.bytes(b);
    }
}

/// A lease id, as its printed form.
fn lease_id(out: &mut impl Out, field: u64, lease: LeaseId) {
    key(out, field, LEN);
    out.varint(32);
    out.hex(lease);
}

/// Something written as a nested message.
trait Part {
    fn write(&self, out: &mut impl Out);
}

/// A set message field (present even when empty): its length, then it.
fn nested(out: &mut impl Out, field: u64, part: &impl Part) {
    let mut len = Len(0);
    part.write(&mut len);
    key(out, field, LEN);
    out.varint(len.0 as u64);
    part.write(out);
}

/// A message the generated types already encode (the signed times).
struct Proto<'a, M>(&'a M);

impl<M: prost::Message> Part for Proto<'_, M> {
    fn write(&self, out: &mut impl Out) {
        out.message(self.0);
    }
}

/// `pb::PreviousLease`, as `Previous::to_pb` states it.
impl Part for Previous {
    fn write(&self, out: &mut impl Out) {
        if let Some(lease) = self.lease {
            lease_id(out, 1, lease);
        }
        uint(out, 2, self.watermark.as_micros());
        if let Some(t) = &self.watermark_signed_time {
            nested(out, 3, &Proto(t.as_ref()));
        }
        uint(out, 4, pb::Ended::from(self.ended) as u64);
        uint(out, 5, self.ended_at.as_micros());
        uint(out, 6, self.unsettled_until().map_or(0, Micros::as_micros));
        uint(out, 7, self.lease.map_or(0, |l| l.granted_at().as_micros()));
    }
}

/// `pb::WitnessName`.
impl Part for NameGrant {
    fn write(&self, out: &mut impl Out) {
        bytes(out, 1, self.name.as_bytes());
        uint(out, 2, self.fencing);
        nested(out, 3, &self.previous);
    }
}

/// What a witness body states besides the grant.
pub(super) struct Statement<'a> {
    pub kind: pb::WitnessKind,
    pub now: Micros,
    pub time: &'a SignedReading,
    pub server_id: &'a str,
    pub epoch: Micros,
}

struct Body<'a>(&'a Grant, &'a Statement<'a>);

/// `pb::WitnessBody`, fields in number order as `prost` writes them.
impl Part for Body<'_> {
    fn write(&self, out: &mut impl Out) {
        let Body(grant, s) = self;
        lease_id(out, 1, grant.lease);
        for name in &grant.names {
            nested(out, 2, name);
        }
        bytes(out, 3, grant.owner.as_bytes());
        uint(out, 4, pb::Mode::from(grant.mode) as u64);
        uint(out, 5, s.kind as u64);
        uint(out, 6, grant.deadline.as_micros());
        uint(out, 7, grant.min_timestamp.as_micros());
        uint(out, 8, s.now.as_micros());
        nested(out, 9, &Proto(&s.time.signed));
        bytes(out, 10, s.server_id.as_bytes());
        uint(out, 11, s.epoch.as_micros());
        uint(
            out,
            12,
            u64::from(s.time.source == bagel_proto::TimeProofKind::Local),
        );
        bytes(out, 13, grant.holder_key.as_deref().map_or(&[][..], |k| &k[..]));
    }
}

/// The encoded witness body of `grant`.
pub(super) fn encode(grant: &Grant, statement: &Statement<'_>) -> Vec<u8> {
    let body = Body(grant, statement);
    let mut len = Len(0);
    body.write(&mut len);
    let mut buf = Vec::with_capacity(len.0);
    body.write(&mut buf);
    debug_assert_eq!(buf.len(), len.0);
    buf
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bagel_proto::{Micros, Signer, TimeProofKind, pb};
    use proptest::prelude::*;
    use prost::Message as _;

    use crate::table::{Ended, Grant, LeaseId, Mode, NameGrant, Previous, TokenKey};
    use crate::timekeeper::SignedReading;
    use crate::witness::WitnessSigner;

    /// Zero often: a zero field is left out of the encoding, so the
    /// encoder's omissions are what most needs exercising.
    fn micros() -> impl Strategy<Value = Micros> {
        prop_oneof![Just(0u64), 1..u64::MAX].prop_map(Micros::from_micros)
    }

    fn signed_time() -> impl Strategy<Value = pb::SignedTime> {
        let bytes = || proptest::collection::vec(any::<u8>(), 0..80);
        prop_oneof![
            (bytes(), bytes(), ".{0,16}").prop_map(|(body, signature, key_id)| pb::SignedTime {
                proof: Some(pb::signed_time::Proof::Local(pb::LocalTimeProof {
                    body,
                    signature,
                    key_id,
                })),
            }),
            (bytes(), bytes(), bytes(), bytes()).prop_map(|(request, response, public_key, blind)| {
                pb::SignedTime {
                    proof: Some(pb::signed_time::Proof::Roughtime(pb::RoughtimeProof {
                        request,
                        response,
                        public_key,
                        blind,
                    })),
                }
            }),
            Just(pb::SignedTime::default()),
        ]
    }

    fn lease_id() -> impl Strategy<Value = LeaseId> {
        (micros(), 0..crate::table::MAX_SHARDS, 0..crate::table::MAX_SLOTS)
            .prop_map(|(now, shard, slot)| LeaseId::new(now, shard, slot))
    }

    fn previous() -> impl Strategy<Value = Previous> {
        let ended = prop_oneof![
            Just(Ended::None),
            Just(Ended::Released),
            Just(Ended::Broken),
            Just(Ended::Unknown)
        ];
        (
            proptest::option::of(lease_id()),
            micros(),
            proptest::option::of(signed_time()),
            ended,
            any::<bool>(),
            micros(),
        )
            .prop_map(|(lease, watermark, time, ended, unsettled, ended_at)| Previous {
                lease,
                watermark,
                watermark_signed_time: time.map(Arc::new),
                ended,
                unsettled,
                ended_at,
            })
    }

    fn grant() -> impl Strategy<Value = Grant> {
        let name = (".{0,24}", prop_oneof![Just(0u64), any::<u64>()], previous()).prop_map(
            |(name, fencing, previous): (String, u64, Previous)| NameGrant {
                name: Arc::from(name),
                fencing,
                previous,
            },
        );
        (
            lease_id(),
            ".{0,20}",
            any::<bool>(),
            micros(),
            micros(),
            proptest::collection::vec(name, 0..4),
            proptest::option::of(any::<[u8; 32]>()),
        )
            .prop_map(
                |(lease, owner, tentative, deadline, min_timestamp, names, key)| Grant {
                    lease,
                    token: TokenKey::generate().token(lease, 1),
                    owner: Arc::from(owner),
                    mode: if tentative { Mode::Tentative } else { Mode::Full },
                    deadline,
                    min_timestamp,
                    names,
                    holder_key: key.map(Arc::new),
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The bytes verifiers decode are exactly `prost`'s encoding of
        /// the body the server means to state.
        #[test]
        fn written_body_is_prosts_encoding_of_the_stated_body(
            grant in grant(),
            kind in prop_oneof![
                Just(pb::WitnessKind::Acquire),
                Just(pb::WitnessKind::Upgrade),
                Just(pb::WitnessKind::Renew),
            ],
            now in micros(),
            time in signed_time(),
            local in any::<bool>(),
            server_id in ".{0,20}",
            epoch in micros(),
        ) {
            let ws = WitnessSigner::new(
                Signer::new(ed25519_dalek::SigningKey::from_bytes(&[3; 32])),
                server_id,
                epoch,
            );
            let time = SignedReading {
                time: now,
                radius_us: 1,
                signed: time,
                source: if local { TimeProofKind::Local } else { TimeProofKind::Roughtime },
            };
            let written = ws.encode_body(&grant, kind, now, &time);
            let stated = ws.body(&grant, kind, now, &time);
            prop_assert_eq!(&written, &stated.encode_to_vec());
            prop_assert_eq!(pb::WitnessBody::decode(written.as_slice()).unwrap(), stated);
        }
    }
}
