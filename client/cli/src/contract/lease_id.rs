//! Lease ids as the command line takes them (`--lease ID --token TOKEN`),
//! told apart from the path of a lease file once, by their form: one
//! server's (or an S3 lease store's) lease id is 32 hex digits; a lease
//! over several servers joins one `MEMBERID:LEASEID` part per server with
//! commas, as the cluster client writes it (`bagel_client::Cluster`).
//! The backend checks the digits; this type only says which form it is.

use std::fmt;
use std::str::FromStr;

/// A lease id, by its form.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LeaseId {
    /// One server's lease, or an S3 lease store's: 32 hex digits.
    Single(String),
    /// A lease over several servers: one part per server, in the order
    /// the id lists them (ascending member id).
    Combined(Vec<LeaseIdPart>),
}

/// One server's part of a lease over several servers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeaseIdPart {
    /// The member id of the server holding it (hex).
    pub member_id: String,
    /// The lease id on that server (hex).
    pub lease_id: String,
}

impl LeaseId {
    /// `text` as a lease id: 32 hex digits, or `MEMBERID:LEASEID` parts
    /// joined by commas, each side hex and not empty. `None` when it is
    /// neither (the CLI then takes it for a lease file's path).
    pub fn parse(text: &str) -> Option<LeaseId> {
        let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
        if text.len() == 32 && hex(text) {
            return Some(LeaseId::Single(text.to_owned()));
        }
        if !text.contains(':') {
            return None;
        }
        let parts = text
            .split(',')
            .map(|part| {
                let (member_id, lease_id) = part.split_once(':')?;
                (hex(member_id) && hex(lease_id)).then(|| LeaseIdPart {
                    member_id: member_id.to_owned(),
                    lease_id: lease_id.to_owned(),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(LeaseId::Combined(parts))
    }

    /// The parts of a lease over several servers (none for one server's).
    pub fn parts(&self) -> &[LeaseIdPart] {
        match self {
            LeaseId::Single(_) => &[],
            LeaseId::Combined(parts) => parts,
        }
    }
}

/// The id as written: 32 hex digits, or `MEMBERID:LEASEID,...`.
impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseId::Single(id) => f.write_str(id),
            LeaseId::Combined(parts) => {
                for (i, p) in parts.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{}:{}", p.member_id, p.lease_id)?;
                }
                Ok(())
            }
        }
    }
}

/// Why a text is not a lease id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotALeaseId(pub String);

impl fmt::Display for NotALeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a lease id (32 hex digits, or MEMBERID:LEASEID,... for a lease over several servers)",
            self.0
        )
    }
}

impl std::error::Error for NotALeaseId {}

impl FromStr for LeaseId {
    type Err = NotALeaseId;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        LeaseId::parse(text).ok_or_else(|| NotALeaseId(text.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_are_told_apart_and_written_back_as_given() {
        let one = "0123456789abcdefABCDEF0123456789";
        assert_eq!(LeaseId::parse(one), Some(LeaseId::Single(one.to_owned())));
        let combined = "00aa:0123456789abcdef0123456789abcdef,ff01:fedcba9876543210fedcba9876543210";
        let id = LeaseId::parse(combined).expect("combined");
        assert_eq!(id.parts().len(), 2);
        assert_eq!(id.parts()[1].member_id, "ff01");
        assert_eq!(id.to_string(), combined);
        assert_eq!(
            LeaseId::parse("abc:def").map(|i| i.to_string()).as_deref(),
            Some("abc:def")
        );
        for path in [
            "lease.json",
            "0123456789abcdef",
            "0123456789abcdef0123456789abcdeg",
            "./0123456789abcdef0123456789abcdef",
            "a:",
            ":a",
            "a:b,",
            "a:b:c",
            "",
        ] {
            assert_eq!(LeaseId::parse(path), None, "{path:?}");
        }
        assert!("lease.json".parse::<LeaseId>().is_err());
    }
}
