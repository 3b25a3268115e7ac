//! Verification of stored Roughtime exchanges: a real one recorded from a
//! `roughenough-server` 2.2 (interoperability), and synthetic ones built
//! here with the protocol crate's types (Merkle trees with several leaves,
//! out-of-range midpoints).

use ed25519_dalek::{Signer as _, SigningKey};
use roughenough_protocol::ToWire as _;
use roughenough_protocol::tags::{
    Certificate, Delegation, MerklePath, MerkleRoot, Nonce, ProtocolVersion, PublicKey, SignedResponse,
    SupportedVersions,
};
use roughenough_protocol::wire::ToFrame as _;

use super::*;
use crate::KeyRing;

/// One exchange with `roughenough-server` 2.2 (RFC version), recorded by
/// `bagel time-check --json` against a server started by tests/run.sh.
struct Recorded {
    proof: pb::RoughtimeProof,
    midpoint_s: u64,
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len() / 2)
        .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

fn recorded() -> Recorded {
    let text = include_str!("../../testdata/roughenough-2.2-exchange.txt");
    let mut proof = pb::RoughtimeProof::default();
    let mut midpoint_s = 0;
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let (k, v) = line.split_once(' ').unwrap();
        match k {
            "request" => proof.request = hex(v),
            "response" => proof.response = hex(v),
            "public_key" => proof.public_key = hex(v),
            "blind" => proof.blind = hex(v),
            "midpoint_s" => midpoint_s = v.parse().unwrap(),
            other => panic!("unknown fixture field {other}"),
        }
    }
    Recorded { proof, midpoint_s }
}

fn key_of(proof: &pb::RoughtimeProof) -> RoughtimeKey {
    RoughtimeKey::from_slice(&proof.public_key).unwrap()
}

#[test]
fn a_recorded_exchange_verifies_offline() {
    let r = recorded();
    let key = key_of(&r.proof);
    let x = verify_roughtime(&r.proof, &[key]).unwrap();
    assert_eq!(x.midpoint, Micros::from_micros(r.midpoint_s * 1_000_000));
    assert_eq!(x.radius, Duration::from_secs(5), "roughenough 2.2's fixed radius");
    assert_eq!(x.key, key);
    // Through the one entry point auditors use, too.
    let signed = pb::SignedTime {
        proof: Some(pb::signed_time::Proof::Roughtime(r.proof.clone())),
    };
    let reading = crate::verify_signed_time(&signed, &KeyRing::new(), &[key]).unwrap();
    assert_eq!(reading.time, x.midpoint);
    assert_eq!(reading.radius_us, 5_000_000);
    assert_eq!(reading.source, TimeProofKind::Roughtime);
    assert_eq!(reading.resolution_us(), 1_000_000);
    // Its nonce commits to the blind (first query of its querier: no
    // previous response).
    assert_eq!(x.nonce, chained_nonce(&[], &r.proof.blind));
}

#[test]
fn every_flipped_byte_of_the_recorded_exchange_is_caught() {
    let r = recorded();
    let key = key_of(&r.proof);
    for i in 0..r.proof.request.len() {
        let mut bad = r.proof.clone();
        bad.request[i] ^= 0x01;
        assert!(
            verify_roughtime(&bad, &[key]).is_err(),
            "flip at request byte {i} went unnoticed"
        );
    }
    for i in 0..r.proof.response.len() {
        let mut bad = r.proof.clone();
        bad.response[i] ^= 0x01;
        assert!(
            verify_roughtime(&bad, &[key]).is_err(),
            "flip at response byte {i} went unnoticed"
        );
    }
}

/// Found by the fuzz tests: bytes after the response's frame are signed by
/// nobody, and would let two different proofs verify as one exchange.
#[test]
fn bytes_after_the_response_frame_are_refused() {
    let r = recorded();
    let key = key_of(&r.proof);
    let mut padded = r.proof.clone();
    padded.response.push(0);
    let err = verify_roughtime(&padded, &[key]).unwrap_err();
    assert!(err.to_string().contains("1 bytes after its frame"), "{err}");
}

#[test]
fn another_key_is_refused() {
    let r = recorded();
    let other = RoughtimeKey::from_bytes(SigningKey::from_bytes(&[7; 32]).verifying_key().to_bytes());
    // Not trusted at all.
    assert!(matches!(
        verify_roughtime(&r.proof, &[other]),
        Err(Error::UntrustedRoughtimeKey { .. })
    ));
    // Trusted, and claimed by the proof, but it did not sign.
    let mut claimed = r.proof.clone();
    claimed.public_key = other.as_bytes().to_vec();
    let err = verify_roughtime(&claimed, &[other, key_of(&r.proof)]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::RoughtimeInvalid { check: "SRV", .. } | Error::BadSignature { .. }
        ),
        "{err}"
    );
    // No trusted keys: nothing verifies.
    assert!(verify_roughtime(&r.proof, &[]).is_err());
}

/// A response to `request` from a server with long-term key `long_term`,
/// the request being leaf `index` of a tree of `leaves`.
fn synthetic(long_term: &SigningKey, leaves: usize, index: usize, midp: u64) -> pb::RoughtimeProof {
    let key = RoughtimeKey::from_bytes(long_term.verifying_key().to_bytes());
    let blind = [9u8; 32];
    let nonce = Nonce::from(chained_nonce(&[], &blind));
    let request = Request::new_with_server(&nonce, &SrvCommitment::from(key.srv_commitment()))
        .as_frame_bytes()
        .unwrap();

    // The Merkle tree over every request of the batch.
    let mut level: Vec<[u8; 32]> = (0..leaves)
        .map(|i| {
            if i == index {
                h32(&[&[0x00], &request])
            } else {
                h32(&[&[0x00], &[i as u8; 1024]])
            }
        })
        .collect();
    let mut path = MerklePath::default();
    let mut i = index;
    while level.len() > 1 {
        if level.len() % 2 == 1 {
            level.push([0; 32]);
        }
        path.push_element(&level[i ^ 1]);
        level = level.chunks(2).map(|p| h32(&[&[0x01], &p[0], &p[1]])).collect();
        i /= 2;
    }
    let root = level[0];

    let delegated = SigningKey::from_bytes(&[3; 32]);
    let dele = Delegation::new(
        PublicKey::from(delegated.verifying_key().to_bytes()),
        1_700_000_000,
        Duration::from_secs(86_400),
    );
    let mut to_sign = ProtocolVersion::RFC.dele_prefix().to_vec();
    to_sign.extend(dele.as_bytes().unwrap());
    let cert = Certificate::new(long_term.sign(&to_sign).to_bytes().into(), dele);

    let mut srep = SignedResponse::default();
    srep.set_ver(ProtocolVersion::RFC);
    srep.set_radi(5);
    srep.set_midp(midp);
    srep.set_vers(&SupportedVersions::new(&[ProtocolVersion::RFC]));
    srep.set_root(&MerkleRoot::from(root));
    let mut to_sign = ProtocolVersion::RFC.srep_prefix().to_vec();
    to_sign.extend(srep.as_bytes().unwrap());
    let sig = delegated.sign(&to_sign).to_bytes();

    let mut response = Response::default();
    response.set_sig(sig.into());
    response.set_nonc(nonce);
    response.set_cert(cert);
    response.set_indx(index as u32);
    response.set_path(path);
    response.set_srep(srep);
    pb::RoughtimeProof {
        request,
        response: response.as_frame_bytes().unwrap(),
        public_key: key.as_bytes().to_vec(),
        blind: blind.to_vec(),
    }
}

#[test]
fn merkle_paths_of_every_leaf_verify_and_a_wrong_index_does_not() {
    let lt = SigningKey::from_bytes(&[1; 32]);
    let key = RoughtimeKey::from_bytes(lt.verifying_key().to_bytes());
    for leaves in [1, 2, 3, 5, 8] {
        for index in 0..leaves {
            let proof = synthetic(&lt, leaves, index, 1_700_000_100);
            let x = verify_roughtime(&proof, &[key])
                .unwrap_or_else(|e| panic!("{leaves} leaves, index {index}: {e}"));
            assert_eq!(x.midpoint, Micros::from_micros(1_700_000_100_000_000));
        }
    }
    // The same response claiming another leaf: the path no longer leads to
    // the signed root. (INDX is the last 4 bytes of the response.)
    let mut proof = synthetic(&lt, 4, 1, 1_700_000_100);
    let n = proof.response.len();
    proof.response[n - 4] = 2;
    let err = verify_roughtime(&proof, &[key]).unwrap_err();
    assert!(
        matches!(err, Error::RoughtimeInvalid { check: "PATH", .. }),
        "{err}"
    );
}

#[test]
fn a_midpoint_outside_the_delegation_is_refused() {
    let lt = SigningKey::from_bytes(&[1; 32]);
    let key = RoughtimeKey::from_bytes(lt.verifying_key().to_bytes());
    let proof = synthetic(&lt, 1, 0, 1_600_000_000);
    let err = verify_roughtime(&proof, &[key]).unwrap_err();
    assert!(
        matches!(err, Error::RoughtimeInvalid { check: "MIDP", .. }),
        "{err}"
    );
}

#[test]
fn chaining_proves_order() {
    let lt = SigningKey::from_bytes(&[1; 32]);
    let first = synthetic(&lt, 1, 0, 1_700_000_100);
    let blind = [5u8; 32];
    let mut second = first.clone();
    let nonce = Nonce::from(chained_nonce(&first.response, &blind));
    let key = key_of(&first);
    second.request = Request::new_with_server(&nonce, &SrvCommitment::from(key.srv_commitment()))
        .as_frame_bytes()
        .unwrap();
    second.blind = blind.to_vec();
    assert!(follows(&first, &second).unwrap());
    assert!(!follows(&second, &first).unwrap());
    let mut unchained = second.clone();
    unchained.blind.clear();
    assert!(!follows(&first, &unchained).unwrap());
}

#[test]
fn keys_parse_from_hex_and_base64() {
    let raw = [0xabu8; 32];
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let b64 = base64::engine::general_purpose::STANDARD.encode(raw);
    let b64url = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
    for text in [hex.as_str(), &hex.to_uppercase(), &b64, &b64url] {
        assert_eq!(RoughtimeKey::parse(text).unwrap().as_bytes(), &raw, "{text}");
    }
    assert_eq!(RoughtimeKey::parse(&hex).unwrap().to_string(), hex);
    for bad in ["", "zz", &hex[..62], "AAAA"] {
        assert!(RoughtimeKey::parse(bad).is_err(), "{bad:?}");
    }
    let servers = RoughtimeServer::pair(&["127.0.0.1:2002".into()], std::slice::from_ref(&hex)).unwrap();
    assert_eq!(servers[0].addr, "127.0.0.1:2002");
    assert!(RoughtimeServer::pair(&["127.0.0.1:2002".into()], &[]).is_err());
    assert!(RoughtimeServer::pair(&["no-port".into()], &[hex]).is_err());
}
