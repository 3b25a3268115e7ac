//! Property ("fuzz") tests of every decoder here that takes bytes from
//! outside: witness bodies and signatures, Merkle paths, local signed
//! times, Roughtime exchanges. Each input is answered (verified or
//! refused), never with a panic; the parsers copy at most their input, and
//! the inputs are bounded, so nothing allocates without bound. A few
//! hundred cases each in the suite; `BAGEL_FUZZ_CASES=100000` for longer.

use proptest::prelude::*;
use prost::Message as _;

use crate::merkle::{self, Hash};
use crate::signed_time::roughtime::{RoughtimeKey, follows, verify_roughtime};
use crate::{KeyRing, Signer, pb, sign_witness_batch, verify_signed_time, verify_witness};

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

fn witness() -> impl Strategy<Value = pb::Witness> {
    (
        bytes(512),
        bytes(80),
        ".{0,40}",
        any::<bool>(),
        any::<u32>(),
        proptest::collection::vec(bytes(40), 0..12),
    )
        .prop_map(
            |(body, signature, key_id, batched, leaf_index, merkle_path)| pb::Witness {
                body: body.into(),
                signature: signature.into(),
                key_id,
                batched,
                leaf_index,
                merkle_path: merkle_path.into_iter().map(Into::into).collect(),
            },
        )
}

/// The Roughtime exchange recorded from roughenough-server 2.2.
fn recorded() -> pb::RoughtimeProof {
    let text = include_str!("../testdata/roughenough-2.2-exchange.txt");
    let hex = |v: &str| -> Vec<u8> {
        (0..v.len() / 2)
            .map(|i| u8::from_str_radix(&v[2 * i..2 * i + 2], 16).unwrap())
            .collect()
    };
    let mut proof = pb::RoughtimeProof::default();
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
            _ => {}
        }
    }
    proof
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::fuzz_cases()))]

    /// Any path, any index: an answer, never a panic; only a path of
    /// 32-byte siblings with no index bits beyond it folds.
    #[test]
    fn any_merkle_path_folds_or_is_refused(
        leaf in any::<[u8; 32]>(),
        index in any::<u32>(),
        path in proptest::collection::vec(bytes(40), 0..40),
    ) {
        let got = merkle::root_from_path(leaf, index, &path);
        let well_formed = path.iter().all(|s| s.len() == 32)
            && (path.len() >= 32 || index >> path.len() == 0);
        prop_assert_eq!(got.is_some(), well_formed);
    }

    /// Every leaf of any tree folds to its root.
    #[test]
    fn every_leaf_of_any_tree_folds_to_its_root(
        bodies in proptest::collection::vec(bytes(64), 1..40),
        pick in any::<prop::sample::Index>(),
    ) {
        let leaves: Vec<Hash> = bodies.iter().map(|b| merkle::leaf_hash(b)).collect();
        let (root, paths) = merkle::build(&leaves);
        let i = pick.index(leaves.len());
        let path: Vec<Vec<u8>> = paths[i].iter().map(|h| h.to_vec()).collect();
        prop_assert_eq!(merkle::root_from_path(leaves[i], i as u32, &path), Some(root));
    }

    /// Any witness: refused, never a panic, also when it claims the
    /// trusted key's id; its body bytes decode or are refused.
    #[test]
    fn any_witness_is_refused_without_panic(w in witness()) {
        let signer = Signer::generate();
        let keys: KeyRing = [signer.verifying_key()].into_iter().collect();
        prop_assert!(verify_witness(&w, &keys).is_err());
        let w = pb::Witness { key_id: signer.key_id().to_owned(), ..w };
        prop_assert!(verify_witness(&w, &keys).is_err());
        let _ = pb::WitnessBody::decode(&w.body[..]);
    }

    /// A real batched witness with bytes changed anywhere (body,
    /// signature, path, index) is refused.
    #[test]
    fn a_tampered_witness_is_refused(
        n in 1usize..9,
        which in any::<prop::sample::Index>(),
        edits in proptest::collection::vec((0u8..4, any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let signer = Signer::generate();
        let keys: KeyRing = [signer.verifying_key()].into_iter().collect();
        let bodies: Vec<Vec<u8>> = (0..n)
            .map(|i| pb::WitnessBody { lease_id: format!("l{i}"), deadline_us: 7, ..Default::default() }.encode_to_vec())
            .collect();
        let original = sign_witness_batch(&signer, bodies)[which.index(n)].clone();
        let mut w = original.clone();
        for (field, at, value) in edits {
            let target = match field {
                0 => &mut w.body,
                1 => &mut w.signature,
                2 if !w.merkle_path.is_empty() => {
                    let i = at.index(w.merkle_path.len());
                    &mut w.merkle_path[i]
                }
                _ => {
                    w.leaf_index ^= u32::from(value) + 1;
                    continue;
                }
            };
            if !target.is_empty() {
                let i = at.index(target.len());
                *target = crate::tampered(target, i, |b| *b = value);
            }
        }
        // An unbatched witness (one body) signs its body alone: its index
        // and path mean nothing.
        let changed = w.body != original.body
            || w.signature != original.signature
            || (original.batched
                && (w.leaf_index != original.leaf_index || w.merkle_path != original.merkle_path));
        if changed {
            prop_assert!(verify_witness(&w, &keys).is_err());
        }
    }

    /// Any local signed time: refused, never a panic.
    #[test]
    fn any_local_time_is_refused_without_panic(body in bytes(256), signature in bytes(80), key_id in ".{0,40}") {
        let signer = Signer::generate();
        let keys: KeyRing = [signer.verifying_key()].into_iter().collect();
        let st = pb::SignedTime {
            proof: Some(pb::signed_time::Proof::Local(pb::LocalTimeProof { body, signature, key_id })),
        };
        prop_assert!(verify_signed_time(&st, &keys, &[]).is_err());
    }

    /// Any Roughtime request and response bytes under a trusted key:
    /// refused, never a panic.
    #[test]
    fn any_roughtime_exchange_is_refused_without_panic(request in bytes(1100), response in bytes(1100)) {
        let real = recorded();
        let key = RoughtimeKey::from_slice(&real.public_key).unwrap();
        let proof = pb::RoughtimeProof { request, response, ..real.clone() };
        prop_assert!(verify_roughtime(&proof, &[key]).is_err());
        let _ = follows(&real, &proof);
    }

    /// The recorded exchange with bytes replaced, cut or inserted: never a
    /// panic, and refused unless unchanged.
    #[test]
    fn a_mutated_roughtime_exchange_is_refused(
        edits in proptest::collection::vec(
            (any::<bool>(), 0u8..3, any::<prop::sample::Index>(), any::<u8>()),
            1..6,
        ),
    ) {
        let real = recorded();
        let key = RoughtimeKey::from_slice(&real.public_key).unwrap();
        let mut proof = real.clone();
        for (in_request, kind, at, value) in edits {
            let target = if in_request { &mut proof.request } else { &mut proof.response };
            let i = at.index(target.len() + 1);
            match kind {
                0 if i < target.len() => target[i] = value,
                1 => target.truncate(i),
                _ => target.insert(i, value),
            }
        }
        let verdict = verify_roughtime(&proof, &[key]);
        if proof != real {
            prop_assert!(verdict.is_err(), "a changed exchange verified");
        }
    }
}
