//! [`LeaseLimits`]: the bounds a lease request is checked against, and the
//! rules that check it, written once for every side that judges requests
//! (the server at its edge, the S3 lease store, the in-memory test
//! backend). Names and owners follow [`bagel_proto::names`].
//!
//! A rule's refusal is a [`Refusal`]: the field and why, or the numbers of
//! a refusal a caller acts on (a wait over the max, a lifetime outside the
//! TTL range). Each side turns it into its own error type: the server into
//! the status it sends (with the numbers as structured details), a backend
//! of this crate into [`Error`] through `From`.

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use bagel_proto::names::{echo, name_problem, owner_problem};
use bagel_proto::{Micros, duration_micros};

use crate::error::Error;

/// What a lease request may ask for. The defaults are the server's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseLimits {
    /// A lease must last longer than this (a deadline later than
    /// `now + min_ttl`).
    pub min_ttl: Duration,
    /// A lease may last at most this (a deadline at most `now + max_ttl`).
    pub max_ttl: Duration,
    /// The longest wait one acquire may ask for.
    pub max_wait: Duration,
    /// The most names one request may name.
    pub max_names_per_request: usize,
    /// The longest name (or name prefix), in bytes.
    pub max_name_bytes: usize,
    /// The longest owner, in bytes.
    pub max_owner_bytes: usize,
    /// The most metadata one renew or release may carry, in bytes.
    pub max_metadata_bytes: usize,
}

impl Default for LeaseLimits {
    fn default() -> Self {
        LeaseLimits {
            min_ttl: Duration::from_millis(10),
            max_ttl: Duration::from_secs(10),
            max_wait: Duration::from_secs(10),
            max_names_per_request: 64,
            max_name_bytes: 256,
            max_owner_bytes: 256,
            max_metadata_bytes: 4096,
        }
    }
}

/// Why a rule of [`LeaseLimits`] refused a request value. The variants a
/// caller acts on carry their numbers, so that nobody reads them back out
/// of a message. Shown as `field: reason`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// A malformed `field` (`names`, `owner`, `metadata.data`), and why.
    Invalid {
        /// The request field at fault.
        field: &'static str,
        /// Why its value is malformed.
        reason: String,
    },
    /// A wait (`wait_us`) longer than the backend's max wait.
    WaitTooLong {
        /// The wait asked for.
        wait: Duration,
        /// The backend's max wait.
        max: Duration,
    },
    /// A relative TTL (`ttl_us`) outside `(min_ttl, max_ttl]`.
    TtlOutOfRange {
        /// The TTL asked for.
        ttl: Duration,
        /// The backend's min TTL (exclusive).
        min_ttl: Duration,
        /// The backend's max TTL (inclusive).
        max_ttl: Duration,
    },
    /// An absolute deadline (`deadline_us`) outside
    /// `(now + min_ttl, now + max_ttl]`.
    DeadlineOutOfRange {
        /// The deadline asked for (µs).
        deadline: Micros,
        /// When it was judged (µs, the backend's clock).
        now: Micros,
        /// The backend's min TTL (exclusive).
        min_ttl: Duration,
        /// The backend's max TTL (inclusive).
        max_ttl: Duration,
    },
}

impl Refusal {
    fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Refusal::Invalid {
            field,
            reason: reason.into(),
        }
    }

    /// The field refused.
    pub fn field(&self) -> &'static str {
        match self {
            Refusal::Invalid { field, .. } => field,
            Refusal::WaitTooLong { .. } => "wait_us",
            Refusal::TtlOutOfRange { .. } => "ttl_us",
            Refusal::DeadlineOutOfRange { .. } => "deadline_us",
        }
    }

    /// Why the field was refused, naming the limit it broke.
    pub fn reason(&self) -> String {
        match self {
            Refusal::Invalid { reason, .. } => reason.clone(),
            Refusal::WaitTooLong { wait, max } => format!(
                "{} exceeds this backend's max wait of {} us",
                duration_micros(*wait),
                duration_micros(*max)
            ),
            Refusal::TtlOutOfRange {
                ttl,
                min_ttl,
                max_ttl,
            } => format!(
                "{} us must lie in (min_ttl, max_ttl] = ({}, {}] us",
                duration_micros(*ttl),
                duration_micros(*min_ttl),
                duration_micros(*max_ttl)
            ),
            Refusal::DeadlineOutOfRange {
                deadline,
                now,
                min_ttl,
                max_ttl,
            } => format!(
                "{} ({deadline}) must lie in (now + min_ttl, now + max_ttl] = ({}, {}] (min_ttl \
                 {min_ttl:?}, max_ttl {max_ttl:?}, now {now})",
                deadline.as_micros(),
                now.saturating_add(*min_ttl).as_micros(),
                now.saturating_add(*max_ttl).as_micros()
            ),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field(), self.reason())
    }
}

impl std::error::Error for Refusal {}

impl LeaseLimits {
    /// Checks a lease's names (in `field`) and returns them sorted, the
    /// one order every acquirer takes them in. Duplicates are refused
    /// rather than merged: a caller listing a name twice has a bug worth
    /// seeing.
    pub fn check_names<'a>(&self, field: &'static str, raw: &'a [String]) -> Result<Vec<&'a str>, Refusal> {
        if raw.is_empty() {
            return Err(Refusal::invalid(field, "at least one name is required"));
        }
        if raw.len() > self.max_names_per_request {
            return Err(Refusal::invalid(
                field,
                format!(
                    "{} names exceed the limit of {} per request",
                    raw.len(),
                    self.max_names_per_request
                ),
            ));
        }
        let mut seen = HashSet::with_capacity(raw.len());
        for (i, name) in raw.iter().enumerate() {
            if let Some(why) = name_problem(name, self.max_name_bytes) {
                return Err(Refusal::invalid(field, format!("[{i}] {why}")));
            }
            if !seen.insert(name.as_str()) {
                return Err(Refusal::invalid(
                    field,
                    format!("[{i}] duplicate name {}", echo(name)),
                ));
            }
        }
        let mut sorted: Vec<&str> = raw.iter().map(String::as_str).collect();
        sorted.sort_unstable();
        Ok(sorted)
    }

    /// Checks one name (or a name prefix, a page token) given in `field`.
    pub fn check_name(&self, field: &'static str, name: &str) -> Result<(), Refusal> {
        match name_problem(name, self.max_name_bytes) {
            Some(why) => Err(Refusal::invalid(field, why)),
            None => Ok(()),
        }
    }

    /// Checks a lease's owner: at most `max_owner_bytes`, with no
    /// character a name may not hold.
    pub fn check_owner(&self, owner: &str) -> Result<(), Refusal> {
        match owner_problem(owner, self.max_owner_bytes) {
            Some(why) => Err(Refusal::invalid("owner", why)),
            None => Ok(()),
        }
    }

    /// Checks the size of a lease's metadata (`metadata.data`).
    pub fn check_metadata_bytes(&self, len: usize) -> Result<(), Refusal> {
        if len > self.max_metadata_bytes {
            return Err(Refusal::invalid(
                "metadata.data",
                format!(
                    "is {len} bytes, over the limit of {} bytes",
                    self.max_metadata_bytes
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a wait longer than [`LeaseLimits::max_wait`].
    pub fn check_wait(&self, wait: Duration) -> Result<(), Refusal> {
        if wait > self.max_wait {
            return Err(Refusal::WaitTooLong {
                wait,
                max: self.max_wait,
            });
        }
        Ok(())
    }

    /// Refuses a relative TTL outside `(min_ttl, max_ttl]`. Counted from
    /// the grant, it is in range whenever the grant is made.
    pub fn check_ttl(&self, ttl: Duration) -> Result<(), Refusal> {
        if ttl <= self.min_ttl || ttl > self.max_ttl {
            return Err(Refusal::TtlOutOfRange {
                ttl,
                min_ttl: self.min_ttl,
                max_ttl: self.max_ttl,
            });
        }
        Ok(())
    }

    /// Refuses a deadline outside `(now + min_ttl, now + max_ttl]`.
    pub fn check_deadline(&self, deadline: Micros, now: Micros) -> Result<(), Refusal> {
        if deadline <= now.saturating_add(self.min_ttl) || deadline > now.saturating_add(self.max_ttl) {
            return Err(Refusal::DeadlineOutOfRange {
                deadline,
                now,
                min_ttl: self.min_ttl,
                max_ttl: self.max_ttl,
            });
        }
        Ok(())
    }
}

/// A refusal as the lease core's error: each typed refusal keeps its
/// numbers, and its text is the refusal's.
impl From<Refusal> for Error {
    fn from(r: Refusal) -> Self {
        let field = r.field().to_owned();
        let reason = r.reason();
        match r {
            Refusal::Invalid { .. } => Error::Invalid {
                field: Some(field),
                reason,
            },
            Refusal::WaitTooLong { max, .. } => Error::WaitTooLong { max, reason },
            Refusal::TtlOutOfRange { min_ttl, max_ttl, .. }
            | Refusal::DeadlineOutOfRange { min_ttl, max_ttl, .. } => Error::TtlOutOfRange {
                field,
                min_ttl,
                max_ttl,
                reason,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    #[test]
    fn names_are_checked_and_sorted() {
        let l = LeaseLimits::default();
        let raw = s(&["b", "a/x"]);
        assert_eq!(l.check_names("names", &raw).unwrap(), vec!["a/x", "b"]);
        let cases: &[(&[&str], &str)] = &[
            (&[], "names: at least one name is required"),
            (&["a", ""], "names: [1] is empty"),
            (&["a", "b", "a"], "names: [2] duplicate name \"a\""),
            (&["a\n"], "control character"),
            (&["a\u{202e}b"], "U+202E (a bidirectional override)"),
            // Canonically equivalent to "Å" (U+00C5), a name of its own.
            (
                &["a", "\u{212B}"],
                "names: [1] \"\u{212B}\" is not in Unicode normalization form C: U+212B at character 0 is U+00C5",
            ),
        ];
        for (input, want) in cases {
            let err = l.check_names("names", &s(input)).unwrap_err();
            assert_eq!(err.field(), "names");
            assert!(err.to_string().contains(want), "{input:?}: {err}");
        }
        let long = s(&[&"x".repeat(257)]);
        let err = l.check_names("names", &long).unwrap_err().to_string();
        assert!(err.contains("257 bytes, over the limit of 256"), "{err}");
        assert!(l.check_names("names", &s(&["\u{C5}"])).is_ok());
        let err = l
            .check_name("prefix", "\u{304B}\u{3099}")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("U+304B U+3099 at character 0 is U+304C in NFC"),
            "{err}"
        );
        let many: Vec<String> = (0..65).map(|i| i.to_string()).collect();
        let err = l.check_names("names", &many).unwrap_err().to_string();
        assert_eq!(err, "names: 65 names exceed the limit of 64 per request");
    }

    #[test]
    fn owners_and_metadata_name_their_limit() {
        let l = LeaseLimits::default();
        assert!(l.check_owner("ops@host:12").is_ok());
        let err = l.check_owner("ops\u{202E}").unwrap_err().to_string();
        assert!(
            err.starts_with("owner: \"ops\\u{202e}\" contains U+202E"),
            "{err}"
        );
        assert!(l.check_metadata_bytes(4096).is_ok());
        assert_eq!(
            l.check_metadata_bytes(4097).unwrap_err().to_string(),
            "metadata.data: is 4097 bytes, over the limit of 4096 bytes"
        );
    }

    #[test]
    fn a_wait_over_the_max_carries_the_max() {
        let l = LeaseLimits {
            max_wait: Duration::from_secs(2),
            ..LeaseLimits::default()
        };
        assert!(l.check_wait(Duration::from_secs(2)).is_ok());
        let refusal = l.check_wait(Duration::from_secs(3)).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::WaitTooLong {
                wait: Duration::from_secs(3),
                max: Duration::from_secs(2)
            }
        );
        assert_eq!(refusal.field(), "wait_us");
        assert_eq!(
            refusal.to_string(),
            "wait_us: 3000000 exceeds this backend's max wait of 2000000 us"
        );
        let e = Error::from(refusal);
        assert!(
            matches!(&e, Error::WaitTooLong { max, .. } if *max == Duration::from_secs(2)),
            "{e:?}"
        );
        assert_eq!(e.field(), Some("wait_us"));
        assert_eq!(
            e.to_string(),
            "out of range: wait_us: 3000000 exceeds this backend's max wait of 2000000 us"
        );
        assert!(!e.is_retryable());
    }

    #[test]
    fn lifetimes_outside_the_ttl_range_carry_the_range() {
        let l = LeaseLimits {
            min_ttl: Duration::from_secs(1),
            max_ttl: Duration::from_secs(60),
            ..LeaseLimits::default()
        };
        assert!(l.check_ttl(Duration::from_secs(60)).is_ok());
        for bad in [Duration::from_secs(1), Duration::from_secs(61)] {
            assert!(matches!(
                l.check_ttl(bad),
                Err(Refusal::TtlOutOfRange { ttl, .. }) if ttl == bad
            ));
        }
        let now = Micros::from_micros(1_000_000_000);
        assert!(
            l.check_deadline(now.saturating_add(Duration::from_secs(5)), now)
                .is_ok()
        );
        for bad in [Duration::ZERO, Duration::from_secs(1), Duration::from_secs(61)] {
            let refusal = l.check_deadline(now.saturating_add(bad), now).unwrap_err();
            assert_eq!(refusal.field(), "deadline_us");
            let e = Error::from(refusal);
            assert!(
                matches!(&e, Error::TtlOutOfRange { field, max_ttl, .. }
                    if field == "deadline_us" && *max_ttl == Duration::from_secs(60)),
                "{e:?}"
            );
            assert!(e.to_string().contains("max_ttl 60s"), "{e}");
        }
    }
}
