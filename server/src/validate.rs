//! Request fields → domain values, at the edge. Every refusal names the
//! field and the limit it broke. The rules of names, owners, metadata,
//! TTLs and waits are every backend's ([`LeaseLimits`]); the words of a
//! refusal of a TTL or a wait are the server's (`crate::error`).

use std::sync::Arc;
use std::time::Duration;

use bagel_lease_core::LeaseLimits;
use bagel_proto::{Micros, pb};

use crate::config::Limits;
use crate::error::Error;
use crate::holder_keys::HolderKeys;
use crate::table::{LeaseId, Metadata, Mode, Token};

pub use bagel_proto::names::echo;

/// A holder's public key: none (an old client), or 32 bytes that are an
/// ed25519 point, which the witness then states (a key nobody can verify
/// with would make every batch of the lease unreadable). `known` answers
/// for keys checked before.
pub fn holder_key(raw: &[u8], known: &HolderKeys) -> Result<Option<Arc<[u8; 32]>>, Error> {
    if raw.is_empty() {
        return Ok(None);
    }
    let key: [u8; 32] = raw.try_into().map_err(|_| {
        Error::invalid(
            "holder_key",
            format!("{} bytes; an ed25519 public key is 32 (or send none)", raw.len()),
        )
    })?;
    known
        .check(&key)
        .map(Some)
        .ok_or_else(|| Error::invalid("holder_key", "32 bytes that are not an ed25519 public key"))
}

/// The rules of a request's sizes (names, owners, metadata). The TTL
/// range and the max wait are the [`crate::config::Config`]'s, checked
/// where they are given ([`lifetime`], [`wait`]).
fn sizes(limits: &Limits) -> LeaseLimits {
    limits.lease_limits(Duration::ZERO, Duration::MAX, Duration::MAX)
}

/// Checks and sorts a list of names. Duplicates are refused rather than
/// silently merged: a caller listing a name twice has a bug worth seeing.
pub fn names(field: &'static str, raw: &[String], limits: &Limits) -> Result<Vec<Arc<str>>, Error> {
    Ok(sizes(limits)
        .check_names(field, raw)?
        .into_iter()
        .map(Arc::from)
        .collect())
}

pub fn name(raw: &str, limits: &Limits) -> Result<Arc<str>, Error> {
    sizes(limits).check_name("name", raw)?;
    Ok(Arc::from(raw))
}

/// A name prefix (List, Watch) or page token: empty, or what a name may be.
pub fn prefix(field: &'static str, raw: &str, limits: &Limits) -> Result<String, Error> {
    if !raw.is_empty() {
        sizes(limits).check_name(field, raw)?;
    }
    Ok(raw.to_owned())
}

pub fn owner(raw: &str, limits: &Limits) -> Result<Arc<str>, Error> {
    sizes(limits).check_owner(raw)?;
    Ok(Arc::from(raw))
}

/// The owner a client certificate makes (its subject, with mutual TLS):
/// refused, naming the certificate, when it breaks the rule an owner sent
/// in a request obeys. A CA signs whatever subject it is asked to, and a
/// subject holding a bidirectional override or an invisible character
/// would show operators another owner than the one holding the lease.
pub fn certificate_owner(subject: Arc<str>, limits: &Limits) -> Result<Arc<str>, Error> {
    match sizes(limits).check_owner(&subject) {
        Ok(()) => Ok(subject),
        Err(refusal) => Err(Error::invalid(
            "owner",
            format!(
                "client certificate {} cannot own leases: its subject (the owner of its leases) {}; \
                 issue it a certificate whose subject obeys the owner rule",
                echo(&subject),
                refusal.reason()
            ),
        )),
    }
}

pub fn mode(raw: i32) -> Result<Mode, Error> {
    match pb::Mode::try_from(raw) {
        Ok(pb::Mode::Unspecified | pb::Mode::Full) => Ok(Mode::Full),
        Ok(pb::Mode::Tentative) => Ok(Mode::Tentative),
        Err(_) => Err(Error::invalid(
            "mode",
            format!("unknown value {raw}; use MODE_FULL (1) or MODE_TENTATIVE (2)"),
        )),
    }
}

/// How long an acquire asks to hold its names: until an instant, or for a
/// span counted from the server's clock at the grant (which no slow path
/// or wait can eat into).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifetime {
    Until(Micros),
    For(Duration),
}

impl Lifetime {
    /// The absolute deadline of a grant made at `now`.
    pub fn deadline_at(self, now: Micros) -> Micros {
        match self {
            Lifetime::Until(deadline) => deadline,
            Lifetime::For(ttl) => now.saturating_add(ttl),
        }
    }
}

/// `deadline_us` or `ttl_us`, exactly one. A relative TTL is checked
/// against the server's TTL bounds here, once: counted from the grant, it
/// is in range whenever the grant is made.
pub fn lifetime(
    deadline_us: u64,
    ttl_us: u64,
    min_ttl: Duration,
    max_ttl: Duration,
) -> Result<Lifetime, Error> {
    match (deadline_us, ttl_us) {
        (0, 0) => Err(Error::invalid(
            "deadline_us",
            "is required: an absolute deadline in Unix microseconds (or set ttl_us, a relative TTL)",
        )),
        (_, 0) => Ok(Lifetime::Until(Micros::from_micros(deadline_us))),
        (0, _) => {
            let ttl = Duration::from_micros(ttl_us);
            LeaseLimits {
                min_ttl,
                max_ttl,
                ..LeaseLimits::default()
            }
            .check_ttl(ttl)?;
            Ok(Lifetime::For(ttl))
        }
        (_, _) => Err(Error::invalid(
            "ttl_us",
            "set either deadline_us (absolute) or ttl_us (relative), not both",
        )),
    }
}

pub fn wait(raw_us: u64, max: Duration) -> Result<Duration, Error> {
    let wait = Duration::from_micros(raw_us);
    LeaseLimits {
        max_wait: max,
        ..LeaseLimits::default()
    }
    .check_wait(wait)?;
    Ok(wait)
}

pub fn lease_id(raw: &str) -> Result<LeaseId, Error> {
    LeaseId::parse(raw).ok_or_else(|| {
        Error::invalid(
            "lease_id",
            format!("{} is not a lease id (32 lowercase hex digits)", echo(raw)),
        )
    })
}

pub fn token(raw: &str) -> Result<Token, Error> {
    Token::parse(raw).ok_or_else(|| Error::invalid("token", "is not a token (32 lowercase hex digits)"))
}

pub fn metadata(raw: Option<&pb::Metadata>, limits: &Limits) -> Result<Option<Metadata>, Error> {
    let Some(m) = raw else { return Ok(None) };
    if m.wildcard {
        if !m.data.is_empty() {
            return Err(Error::invalid(
                "metadata",
                "set either data or wildcard, not both",
            ));
        }
        return Ok(Some(Metadata::Wildcard));
    }
    sizes(limits).check_metadata_bytes(m.data.len())?;
    Ok(Some(Metadata::Data(m.data.clone().into_boxed_slice())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn names_are_sorted_and_checked() {
        let l = Limits::default();
        let got = names("names", &s(&["b", "a"]), &l).unwrap();
        assert_eq!(got, vec![Arc::from("a"), Arc::from("b")]);
        let cases: &[(&[&str], &str)] = &[
            (&[], "at least one"),
            (&[""], "[0] is empty"),
            (&["a", "a"], "[1] duplicate"),
            (&["a\n"], "control"),
            (&["a\u{202e}b"], "U+202E (a bidirectional override)"),
            (
                &["x", "a\u{200b}"],
                "[1] \"a\\u{200b}\" contains U+200B (a zero-width character)",
            ),
        ];
        for (input, want) in cases {
            let err = names("names", &s(input), &l).unwrap_err().to_string();
            assert!(
                err.starts_with("names: ") && err.contains(want),
                "{input:?}: {err}"
            );
        }
        let long = "x".repeat(257);
        let err = names("names", &[long], &l).unwrap_err().to_string();
        assert!(err.contains("257 bytes, over the limit of 256"), "{err}");
        let many: Vec<String> = (0..65).map(|i| i.to_string()).collect();
        let err = names("names", &many, &l).unwrap_err().to_string();
        assert!(err.contains("65 names exceed the limit of 64"), "{err}");
    }

    #[test]
    fn a_certificate_subject_obeys_the_owner_rule() {
        let l = Limits::default();
        let ok = Arc::from("O=bagel tests,CN=worker-1");
        assert_eq!(certificate_owner(Arc::clone(&ok), &l).unwrap(), ok);
        let err = certificate_owner(Arc::from("O=x,CN=a\u{202e}b"), &l)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("owner: client certificate \"O=x,CN=a\\u{202e}b\" cannot own leases")
                && err.contains("U+202E (a bidirectional override) at character 8"),
            "{err}"
        );
        let long = Arc::from(format!("CN={}", "x".repeat(300)));
        let err = certificate_owner(long, &l).unwrap_err().to_string();
        assert!(err.contains("303 bytes, over the limit of 256 bytes"), "{err}");
    }

    #[test]
    fn echoes_are_short() {
        let huge = "x".repeat(4_000_000);
        let err = lease_id(&huge).unwrap_err().to_string();
        assert!(err.len() < 200, "{}", err.len());
        assert!(err.contains("(4000000 bytes)"), "{err}");
        // Escaping cannot blow it up either.
        let nasty = "\u{202e}".repeat(1_000_000);
        assert!(lease_id(&nasty).unwrap_err().to_string().len() < 600);
        assert_eq!(echo("abc"), "\"abc\"");
    }

    #[test]
    fn metadata_limits() {
        let l = Limits::default();
        let big = pb::Metadata {
            data: vec![0; 4097],
            wildcard: false,
        };
        let err = metadata(Some(&big), &l).unwrap_err().to_string();
        assert!(
            err.contains("metadata.data: is 4097 bytes, over the limit of 4096"),
            "{err}"
        );
        let both = pb::Metadata {
            data: vec![1],
            wildcard: true,
        };
        assert!(metadata(Some(&both), &l).is_err());
    }
}
