//! Which server owns a name, and who may say so: the routing rules every
//! side runs alike (the client's cluster routes by them, the server's
//! membership check refuses by them, the model checker explores them).
//!
//! # Rendezvous hashing
//! Every (server, name) pair gets a pseudo-random weight; a name belongs to
//! the server with the highest. Adding a server moves to it only the names
//! it now wins (about 1/n of them); removing one moves only its own names,
//! each to its runner-up. No ring, no virtual nodes, no state: any client
//! with the same member identities routes every name the same way.
//!
//! The weight is the first 8 bytes (big-endian) of
//! SHA-256(`"bagel.v1 route\0"` ‖ server identity ‖ `0x00` ‖ name), so
//! clients in any language can route alike. A server's identity is the
//! one it holds and announces (its `--server-id`), never a URL: a restart,
//! even with a new key, cannot move a name.
//!
//! # Why servers check too
//! A client's list can be wrong in a way no client can see: a member
//! written under another member's ID, or a wrong ID for a member that is
//! down (or pinned, and so never asked) when the client starts. A wrong
//! identity moves the ranks of names owned by *other* members, whose own
//! answers are all correct, so the client sends those names to a server
//! that is not their owner while clients with the right list send them to
//! the owner: two holders. Only a server that knows the membership can
//! refuse such a name, whichever members are up: [`Membership`] is that
//! knowledge (the server's own identity and the lists in force), and
//! [`Membership::owns`] the one check.

use std::fmt;

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
/// weight, ties (never seen in practice) to the smaller identity. `None`
/// only for an empty list.
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

/// Whether an identity may name a member: 1 to 64 bytes of letters,
/// digits, `.`, `_`, `-`, `:` (what a server list's `ID=` takes, so every
/// member of a membership can be written in a list).
pub fn valid_identity(id: &str) -> bool {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':');
    !id.is_empty() && id.len() <= 64 && id.chars().all(ok)
}

/// Whether a member that announces `announced` is the one a list routes
/// names to under `listed`. The client's check at connect: a list that
/// names a server under another identity would route names elsewhere than
/// every other client does.
pub fn identity_matches(listed: &str, announced: &str) -> bool {
    listed == announced
}

/// Whether `list` (a client's member identities) is, as a set, one of the
/// lists `membership` is in force for. A client compares its list with
/// what a member announces; order and spelling of URLs play no part.
pub fn same_members<S: AsRef<str>, T: AsRef<str>>(list: &[S], announced: &[T]) -> bool {
    let mut a: Vec<&str> = list.iter().map(AsRef::as_ref).collect();
    let mut b: Vec<&str> = announced.iter().map(AsRef::as_ref).collect();
    a.sort_unstable();
    a.dedup();
    b.sort_unstable();
    b.dedup();
    a == b
}

/// Whether a client's `list` (member identities) agrees with what a
/// member announced: it announced no membership (it grants every name),
/// or `list` is, as a set, one of the lists it serves in.
pub fn list_agrees<S: AsRef<str>>(list: &[S], announced: &[Vec<String>]) -> bool {
    announced.is_empty() || announced.iter().any(|a| same_members(list, a))
}

/// The member ids of a list as an operator writes it for a server
/// (`--members`): comma-separated entries, each an `ID` or a whole client
/// list entry `ID=URL[#KEY]` (so the one `BAGEL_SERVERS` value can be
/// given to servers and clients alike). An entry without an ID is refused:
/// a server cannot know which member a bare URL is.
pub fn parse_member_list(text: &str) -> Result<Vec<String>, MembershipError> {
    let mut ids = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let id = match entry.split_once('=') {
            Some((id, _)) if !id.contains("://") => id,
            _ if entry.contains("://") => {
                return Err(MembershipError(format!(
                    "{entry:?} has no ID: write each member as ID or ID=URL, with the ID its server \
                     announces (its --server-id)"
                )));
            }
            _ => entry,
        };
        if !valid_identity(id) {
            return Err(MembershipError(format!(
                "{id:?} is not a server id (1 to 64 of letters, digits, '.', '_', '-', ':')"
            )));
        }
        ids.push(id.to_owned());
    }
    if ids.is_empty() {
        return Err(MembershipError("the member list is empty".into()));
    }
    Ok(ids)
}

/// What a server knows of the cluster it serves in: its own identity and
/// the member lists in force (the current one, and while migrating the
/// next one). A name is this server's to grant when it owns the name
/// under at least one of them: during a migration a name may need grants
/// from its owner in each list (the client asks both), and each owner
/// grants one holder at a time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Membership {
    me: String,
    lists: Vec<Vec<String>>,
}

/// A membership that cannot be: said when a server is configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipError(pub String);

impl fmt::Display for MembershipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MembershipError {}

/// A name this server does not own under any list in force, and who does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotOwned {
    /// The owner of the name under each list in force, in order (current,
    /// then next).
    pub owners: Vec<String>,
}

impl Membership {
    /// The membership of the server `me` in `lists` (current first). Each
    /// list is one or more valid, distinct identities, and `me` is in at
    /// least one of them: a server that is in no list owns nothing, which
    /// is a configuration mistake to refuse at start, not a server that
    /// refuses every name.
    pub fn new(me: &str, lists: Vec<Vec<String>>) -> Result<Self, MembershipError> {
        if lists.is_empty() {
            return Err(MembershipError(
                "a membership needs at least one member list".into(),
            ));
        }
        for list in &lists {
            if list.is_empty() {
                return Err(MembershipError("a member list is empty".into()));
            }
            for (i, id) in list.iter().enumerate() {
                if !valid_identity(id) {
                    return Err(MembershipError(format!(
                        "member {id:?} is not a server id (1 to 64 of letters, digits, '.', '_', '-', ':')"
                    )));
                }
                if list[..i].contains(id) {
                    return Err(MembershipError(format!("member {id:?} is listed twice")));
                }
            }
        }
        if !lists.iter().any(|l| l.iter().any(|id| id == me)) {
            return Err(MembershipError(format!(
                "this server's id {me:?} is in none of the member lists {lists:?}: it would own no name \
                 (start it with --server-id set to its id in the list)"
            )));
        }
        Ok(Membership {
            me: me.to_owned(),
            lists,
        })
    }

    /// The lists in force, current first.
    pub fn lists(&self) -> &[Vec<String>] {
        &self.lists
    }

    /// This server's identity.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// `Ok` when this server owns `name` under some list in force; else
    /// who does, under each.
    pub fn owns(&self, name: &str) -> Result<(), NotOwned> {
        if self.lists.iter().any(|list| owner_in(list, name) == self.me) {
            return Ok(());
        }
        // Only a refusal pays for the owners' names.
        Err(NotOwned {
            owners: self
                .lists
                .iter()
                .map(|list| owner_in(list, name).to_owned())
                .collect(),
        })
    }
}

/// The identity that owns `name` in `list` (never empty: [`Membership::new`]).
fn owner_in<'a>(list: &'a [String], name: &str) -> &'a str {
    &list[owner(list, name).expect("lists are never empty")]
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

    fn list(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_member_owns_exactly_the_names_the_list_routes_to_it() {
        let members = list(&["a", "b", "c"]);
        let each: Vec<Membership> = members
            .iter()
            .map(|me| Membership::new(me, vec![members.clone()]).unwrap())
            .collect();
        for i in 0..2_000 {
            let name = format!("n{i}");
            let owners: Vec<&Membership> = each.iter().filter(|m| m.owns(&name).is_ok()).collect();
            assert_eq!(owners.len(), 1, "{name}");
            assert_eq!(owners[0].me(), members[owner(&members, &name).unwrap()]);
        }
    }

    #[test]
    fn a_name_routed_by_a_list_with_a_wrong_id_is_refused_by_the_member_it_reaches() {
        // The client wrote b's id as "x": some of b's names rank to a.
        let right = list(&["a", "b"]);
        let wrong = list(&["a", "x"]);
        let a = Membership::new("a", vec![right.clone()]).unwrap();
        let mut misrouted = 0;
        for i in 0..1_000 {
            let name = format!("n{i}");
            let by_wrong = &wrong[owner(&wrong, &name).unwrap()];
            let by_right = &right[owner(&right, &name).unwrap()];
            if by_wrong == "a" && by_right == "b" {
                misrouted += 1;
                assert_eq!(
                    a.owns(&name),
                    Err(NotOwned {
                        owners: vec!["b".into()]
                    })
                );
            }
        }
        assert!(misrouted > 100, "{misrouted}");
    }

    #[test]
    fn while_migrating_a_member_owns_its_names_under_either_list() {
        let current = list(&["a", "b"]);
        let next = list(&["a", "b", "c"]);
        let c = Membership::new("c", vec![current.clone(), next.clone()]).unwrap();
        let b = Membership::new("b", vec![current.clone(), next.clone()]).unwrap();
        for i in 0..1_000 {
            let name = format!("n{i}");
            let in_current = current[owner(&current, &name).unwrap()].as_str();
            let in_next = next[owner(&next, &name).unwrap()].as_str();
            assert_eq!(c.owns(&name).is_ok(), in_next == "c", "{name}");
            assert_eq!(
                b.owns(&name).is_ok(),
                in_current == "b" || in_next == "b",
                "{name}"
            );
        }
    }

    #[test]
    fn a_membership_without_this_server_or_with_a_bad_list_is_refused() {
        assert!(Membership::new("z", vec![list(&["a", "b"])]).is_err());
        assert!(Membership::new("a", vec![list(&["a", "a"])]).is_err());
        assert!(Membership::new("a", vec![list(&["a", "b c"])]).is_err());
        assert!(Membership::new("a", vec![vec![]]).is_err());
        assert!(Membership::new("a", vec![]).is_err());
        // In the next list only: a member that joins.
        assert!(Membership::new("c", vec![list(&["a", "b"]), list(&["a", "b", "c"])]).is_ok());
    }

    #[test]
    fn a_member_list_takes_ids_or_whole_client_entries() {
        assert_eq!(parse_member_list("a, b").unwrap(), list(&["a", "b"]));
        assert_eq!(
            parse_member_list("a=http://h:1#00ff,b=https://h:2").unwrap(),
            list(&["a", "b"])
        );
        assert!(parse_member_list("http://h:1").is_err());
        assert!(parse_member_list("a b").is_err());
        assert!(parse_member_list(" , ").is_err());
    }

    #[test]
    fn two_lists_are_the_same_members_whatever_their_order() {
        assert!(same_members(&["b", "a"], &["a", "b"]));
        assert!(!same_members(&["a", "x"], &["a", "b"]));
        assert!(!same_members(&["a"], &["a", "b"]));
        let announced = vec![list(&["a", "b"]), list(&["a", "b", "c"])];
        assert!(list_agrees(&["b", "a"], &announced));
        assert!(list_agrees(&["c", "b", "a"], &announced));
        assert!(!list_agrees(&["a", "x"], &announced));
        assert!(list_agrees(&["a", "x"], &[]));
    }
}
