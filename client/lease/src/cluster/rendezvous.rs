//! Rendezvous (highest random weight) hashing: which server owns a name.
//!
//! Every (server, name) pair gets a pseudo-random weight; a name belongs to
//! the server with the highest. Adding a server moves to it only the names
//! it now wins (about 1/n of them); removing one moves only its own names,
//! each to its runner-up. No ring, no virtual nodes, no state: any client
//! with the same server list routes every name the same way.
//!
//! The weight is the first 8 bytes (big-endian) of
//! SHA-256(`"bagel.v1 route\0"` ‖ server identity ‖ `0x00` ‖ name), so
//! clients in any language can route alike. A server's identity is what
//! the client's list says of it (the `ID` of `ID=URL`, else the URL as
//! written), never something the server reports: a restart, even with a
//! new key, cannot move a name.

use sha2::{Digest as _, Sha256};

const DOMAIN: &[u8] = b"bagel.v1 route\0";

/// The weight of `name` on the server with identity `server`.
pub fn weight(server: &str, name: &str) -> u64 {
    let digest = Sha256::new()
        .chain_update(DOMAIN)
        .chain_update(server.as_bytes())
        .chain_update([0])
        .chain_update(name.as_bytes())
        .finalize();
    let mut first = [0; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// The index in `servers` (identities) of the owner of `name`: the highest
/// weight, ties (never seen in practice) to the smaller id. `None` only
/// for an empty list.
pub fn owner<S: AsRef<str>>(servers: &[S], name: &str) -> Option<usize> {
    servers
        .iter()
        .enumerate()
        .max_by(|(_, a), (_, b)| {
            let (a, b) = (a.as_ref(), b.as_ref());
            weight(a, name).cmp(&weight(b, name)).then_with(|| b.cmp(a))
        })
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{:016x}", 0x1000 + i * 7919)).collect()
    }

    #[test]
    fn the_weight_is_the_documented_hash() {
        // Pinned so that a change of the rule (which would re-route every
        // name of every deployment) cannot pass unnoticed.
        let digest = Sha256::digest(b"bagel.v1 route\0abc\0tenant-7");
        let expected = u64::from_be_bytes(digest[..8].try_into().unwrap());
        assert_eq!(weight("abc", "tenant-7"), expected);
    }

    #[test]
    fn names_spread_evenly() {
        let servers = ids(3);
        let mut counts = [0usize; 3];
        for i in 0..30_000 {
            counts[owner(&servers, &format!("name-{i}")).unwrap()] += 1;
        }
        for c in counts {
            assert!(
                (9_000..=11_000).contains(&c),
                "{counts:?} is not within 10% of a third each"
            );
        }
    }

    #[test]
    fn adding_a_server_moves_only_the_names_it_wins() {
        let before = ids(3);
        let mut after = before.clone();
        after.push("ffffffffffff0001".into());
        let mut moved = 0;
        for i in 0..20_000 {
            let name = format!("name-{i}");
            let (a, b) = (owner(&before, &name).unwrap(), owner(&after, &name).unwrap());
            if a != b {
                assert_eq!(b, 3, "{name} moved between two old servers");
                moved += 1;
            }
        }
        // About a quarter moves, all of it to the new server.
        assert!((4_000..=6_000).contains(&moved), "{moved} of 20000 moved");
    }

    #[test]
    fn removing_a_server_moves_only_its_names() {
        let before = ids(4);
        let after = before[..3].to_vec();
        for i in 0..20_000 {
            let name = format!("name-{i}");
            let a = owner(&before, &name).unwrap();
            if a != 3 {
                assert_eq!(
                    owner(&after, &name),
                    Some(a),
                    "{name} moved off a remaining server"
                );
            }
        }
    }

    #[test]
    fn the_order_of_the_list_does_not_matter() {
        let servers = ids(5);
        let mut reversed = servers.clone();
        reversed.reverse();
        for i in 0..1_000 {
            let name = format!("n{i}");
            assert_eq!(
                servers[owner(&servers, &name).unwrap()],
                reversed[owner(&reversed, &name).unwrap()]
            );
        }
    }
}
