//! A lease over several servers is a set of parts, one lease per server
//! (named by its server's member id: see [`super::ServerSpec::member_id`]).
//! This module turns parts into the one
//! [`Grant`] or [`Renewal`] the handle holds, and back.
//!
//! The combined lease is as strong as its weakest part: its deadline is the
//! earliest, it is full only if every part is, and a writer must stay above
//! the highest `min_timestamp` (the watermark is the max). Every part's
//! witness is kept: a message cites them all, and a reader or the audit
//! checks each against its own server's key.
//!
//! The combined id and token list the parts in ascending member-id order:
//! `MEMBERID:LEASEID,MEMBERID:LEASEID` and `TOKEN,TOKEN`. Member ids are 16
//! hex digits, server lease ids 32 and tokens hex, so none contains `:` or
//! `,`.

use bagel_proto::Micros;

use crate::error::{Error, Result};
use crate::types::{Grant, LeaseRef, Mode, NameGrant, Previous, Renewal, ServerPart};

/// One server's lease of a combined lease.
#[derive(Clone, Debug)]
pub(crate) struct Part {
    /// The member id of the server that holds it.
    pub member_id: String,
    pub lease: LeaseRef,
}

fn bad_ref(lease: &LeaseRef, why: &str) -> Error {
    Error::invalid(
        "lease_id",
        format!(
            "{:?} is not a lease over several servers ({why}); expected MEMBERID:LEASEID,... as \
             the cluster client wrote it",
            lease.id
        ),
    )
}

/// The parts of a combined lease, as [`join`] wrote them.
pub(crate) fn split(lease: &LeaseRef) -> Result<Vec<Part>> {
    let ids: Vec<&str> = lease.id.split(',').collect();
    let tokens: Vec<&str> = lease.token.split(',').collect();
    if ids.len() != tokens.len() {
        return Err(bad_ref(lease, "its token has another number of parts"));
    }
    ids.into_iter()
        .zip(tokens)
        .map(|(id, token)| {
            let (member_id, lease_id) = id
                .split_once(':')
                .ok_or_else(|| bad_ref(lease, "a part has no member id"))?;
            if member_id.is_empty() || lease_id.is_empty() {
                return Err(bad_ref(lease, "a part is empty"));
            }
            Ok(Part {
                member_id: member_id.to_owned(),
                lease: LeaseRef::new(lease_id, token).with_names(lease.names.iter().cloned()),
            })
        })
        .collect()
}

/// The combined id and token of `parts` (in the order given: ascending member
/// id).
pub(crate) fn join<'a>(parts: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>) -> (String, String) {
    let (ids, tokens): (Vec<String>, Vec<&str>) = parts
        .into_iter()
        .map(|(member_id, lease_id, token)| (format!("{member_id}:{lease_id}"), token))
        .unzip();
    (ids.join(","), tokens.join(","))
}

/// The combined grant of per-server grants (`(member id, url, grant)`, in
/// ascending member-id order), for the names asked, in the order asked.
pub(crate) fn combine_grants(names: &[String], parts: &[(String, String, Grant)]) -> Grant {
    let (lease_id, token) = join(
        parts
            .iter()
            .map(|(member_id, _, g)| (member_id.as_str(), g.lease_id.as_str(), g.token.as_str())),
    );
    let grants = || parts.iter().map(|(_, _, g)| g);
    let names = names
        .iter()
        .map(|name| {
            let mine: Vec<&NameGrant> = grants()
                .flat_map(|g| g.names.iter().filter(|n| n.name == *name))
                .collect();
            combine_name(name, &mine)
        })
        .collect();
    Grant {
        lease_id,
        token,
        deadline: grants().map(|g| g.deadline).min().unwrap_or(Micros::ZERO),
        min_timestamp: grants().map(|g| g.min_timestamp).max().unwrap_or(Micros::ZERO),
        names,
        mode: weakest(grants().map(|g| g.mode)),
        witnesses: grants().flat_map(|g| g.witnesses.iter().cloned()).collect(),
        servers: parts
            .iter()
            .map(|(_, url, g)| ServerPart {
                server: url.clone(),
                key_id: g.witness().key_id().to_owned(),
                lease_id: g.lease_id.clone(),
                names: g.names.iter().map(|n| n.name.clone()).collect(),
            })
            .collect(),
    }
}

/// One name granted by one or two servers (two while migrating): the
/// higher fencing token (they are microsecond timestamps at least, so they
/// order grants across servers whose clocks agree), and what the later
/// predecessor handed on: the highest watermark, the latest unsettled
/// bound.
fn combine_name(name: &str, grants: &[&NameGrant]) -> NameGrant {
    let Some(first) = grants.first() else {
        return NameGrant {
            name: name.to_owned(),
            fencing_token: 0,
            previous: Previous {
                lease_id: None,
                watermark: Micros::ZERO,
                ended: crate::types::Ended::None,
                ended_at: Micros::ZERO,
                unsettled_until: None,
                granted_at: None,
            },
        };
    };
    let top = grants
        .iter()
        .max_by_key(|g| g.previous.watermark)
        .expect("not empty");
    NameGrant {
        name: name.to_owned(),
        fencing_token: grants
            .iter()
            .map(|g| g.fencing_token)
            .max()
            .unwrap_or(first.fencing_token),
        previous: Previous {
            unsettled_until: grants.iter().filter_map(|g| g.previous.unsettled_until).max(),
            ..top.previous.clone()
        },
    }
}

/// Per-server renewals (in part order) as one.
pub(crate) fn combine_renewals(renewals: Vec<Renewal>) -> Renewal {
    Renewal {
        deadline: renewals.iter().map(|r| r.deadline).min().unwrap_or(Micros::ZERO),
        mode: weakest(renewals.iter().map(|r| r.mode)),
        witnesses: renewals.into_iter().flat_map(|r| r.witnesses).collect(),
    }
}

fn weakest(modes: impl IntoIterator<Item = Mode>) -> Mode {
    if modes.into_iter().all(|m| m == Mode::Full) {
        Mode::Full
    } else {
        Mode::Tentative
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_combined_ref_splits_back_into_its_parts() {
        let (id, token) = join([("k1", "id1", "t1"), ("k2", "id2", "t2")]);
        assert_eq!((id.as_str(), token.as_str()), ("k1:id1,k2:id2", "t1,t2"));
        let parts = split(&LeaseRef::new(id, token).with_names(["a"])).unwrap();
        let got: Vec<_> = parts
            .iter()
            .map(|p| (p.member_id.as_str(), p.lease.id.as_str(), p.lease.token.as_str()))
            .collect();
        assert_eq!(got, [("k1", "id1", "t1"), ("k2", "id2", "t2")]);
    }

    #[test]
    fn a_plain_or_mangled_ref_is_refused_precisely() {
        for (id, token) in [
            ("0123abcd", "t"),
            ("k1:id1,k2:id2", "t1"),
            (":id", "t"),
            ("k:", "t"),
        ] {
            let e = split(&LeaseRef::new(id, token)).unwrap_err();
            assert!(e.to_string().contains("lease_id"), "{e}");
        }
    }
}
