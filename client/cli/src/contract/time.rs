//! `time-check --json`: the one reading the time authority gave, how far
//! off this host's clock is, and the proof. Keys in alphabetical order; an
//! absent value is `null`.

use bagel_proto::hex::encode as hex;
use bagel_proto::pb;
use serde::{Deserialize, Serialize};

/// What `time-check --json` prints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeCheckJson {
    /// The verdict in words.
    pub detail: String,
    /// `|offset| + uncertainty`: how far this host's clock may be from
    /// true time (`null` without a measurement).
    pub error_bound_us: Option<u64>,
    pub healthy: bool,
    /// Local minus the authority (`null` when not measured or stale).
    pub offset_us: Option<i64>,
    /// The signed reading (`null` when the answer carried none).
    pub proof: Option<ProofJson>,
    /// The signer's error bound on the reading.
    pub radius_us: u64,
    /// The granularity of the reading (1 s for RFC Roughtime).
    pub resolution_us: u64,
    pub rtt_us: u64,
    pub signed_time_us: u64,
    /// Who vouched (`roughtime HOST:PORT`, `lease server URL`).
    pub source: String,
}

/// A signed reading: a Roughtime exchange, or a lease server's own
/// signature on its clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ProofJson {
    Roughtime(RoughtimeProofJson),
    Local(LocalProofJson),
}

impl ProofJson {
    /// The proof of a signed time, in hex.
    pub fn of(proof: &pb::signed_time::Proof) -> Self {
        match proof {
            pb::signed_time::Proof::Roughtime(p) => ProofJson::Roughtime(RoughtimeProofJson {
                blind_hex: hex(&p.blind),
                kind: RoughtimeKind::Roughtime,
                public_key_hex: hex(&p.public_key),
                request_hex: hex(&p.request),
                response_hex: hex(&p.response),
            }),
            pb::signed_time::Proof::Local(p) => ProofJson::Local(LocalProofJson {
                body_hex: hex(&p.body),
                key_id: p.key_id.clone(),
                kind: LocalKind::Local,
                signature_hex: hex(&p.signature),
            }),
        }
    }
}

/// A Roughtime request and the server's signed response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoughtimeProofJson {
    pub blind_hex: String,
    /// Always `roughtime`.
    pub kind: RoughtimeKind,
    pub public_key_hex: String,
    pub request_hex: String,
    pub response_hex: String,
}

/// A lease server's signature on its own clock reading.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalProofJson {
    pub body_hex: String,
    pub key_id: String,
    /// Always `local`.
    pub kind: LocalKind,
    pub signature_hex: String,
}

/// The `kind` of a [`RoughtimeProofJson`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoughtimeKind {
    Roughtime,
}

/// The `kind` of a [`LocalProofJson`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LocalKind {
    Local,
}

#[cfg(test)]
mod tests {
    use super::*;

    // The exact JSON `time-check --json` printed before it was typed.
    #[test]
    fn time_check_prints_as_before() {
        let mut out = TimeCheckJson {
            detail: "ok".into(),
            error_bound_us: None,
            healthy: true,
            offset_us: Some(-3),
            proof: None,
            radius_us: 1,
            resolution_us: 2,
            rtt_us: 3,
            signed_time_us: 4,
            source: "lease server x".into(),
        };
        assert_eq!(
            serde_json::to_string(&out).unwrap(),
            r#"{"detail":"ok","error_bound_us":null,"healthy":true,"offset_us":-3,"proof":null,"radius_us":1,"resolution_us":2,"rtt_us":3,"signed_time_us":4,"source":"lease server x"}"#
        );
        out.proof = Some(ProofJson::of(&pb::signed_time::Proof::Local(
            pb::LocalTimeProof {
                body: vec![1],
                signature: vec![2],
                key_id: "k".into(),
            },
        )));
        assert!(
            serde_json::to_string(&out)
                .unwrap()
                .contains(r#""proof":{"body_hex":"01","key_id":"k","kind":"local","signature_hex":"02"},"#)
        );
        out.proof = Some(ProofJson::of(&pb::signed_time::Proof::Roughtime(
            pb::RoughtimeProof {
                request: vec![1],
                response: vec![2],
                public_key: vec![3],
                blind: vec![4],
            },
        )));
        assert!(serde_json::to_string(&out).unwrap().contains(
            r#""proof":{"blind_hex":"04","kind":"roughtime","public_key_hex":"03","request_hex":"01","response_hex":"02"},"#
        ));
    }
}
