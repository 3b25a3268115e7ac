//! Request values checked at the backend's edge by the rules the server
//! checks them by (`bagel_lease_core::LeaseLimits`): every refusal names
//! the field and the limit it broke, and the refusals a caller acts on (a
//! wait over the max, a lifetime out of range) carry their numbers, so a
//! caller moving between the server and S3 sees the same errors.

use std::time::Duration;

use bagel_lease_core::{Error, Metadata, Micros};

use crate::config::S3LeaseConfig;

/// Checks and sorts a lease's names (the fixed order every acquirer takes
/// them in). Duplicates are refused rather than merged.
pub fn names(raw: &[String], cfg: &S3LeaseConfig) -> Result<Vec<String>, Error> {
    Ok(cfg
        .limits
        .check_names("names", raw)?
        .into_iter()
        .map(str::to_owned)
        .collect())
}

pub fn owner(raw: &str, cfg: &S3LeaseConfig) -> Result<(), Error> {
    Ok(cfg.limits.check_owner(raw)?)
}

pub fn metadata(m: Option<&Metadata>, cfg: &S3LeaseConfig) -> Result<(), Error> {
    match m {
        Some(Metadata::Data(d)) => Ok(cfg.limits.check_metadata_bytes(d.len())?),
        _ => Ok(()),
    }
}

/// Refuses a deadline outside `(now + min_ttl, now + max_ttl]`.
pub fn deadline(deadline: Micros, now: Micros, cfg: &S3LeaseConfig) -> Result<(), Error> {
    Ok(cfg.limits.check_deadline(deadline, now)?)
}

/// Refuses a wait over `max_wait`, as an [`Error::WaitTooLong`] that
/// carries it (a longer wait goes on in rounds of it).
pub fn wait(wait: Duration, cfg: &S3LeaseConfig) -> Result<(), Error> {
    Ok(cfg.limits.check_wait(wait)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bad_name_is_named_with_its_limit() {
        let cfg = S3LeaseConfig::default();
        let e = |raw: &[&str]| {
            names(&raw.iter().map(|s| s.to_string()).collect::<Vec<_>>(), &cfg)
                .unwrap_err()
                .to_string()
        };
        assert!(e(&[]).contains("at least one name"));
        assert!(e(&["a", ""]).contains("[1] is empty"));
        assert!(e(&[&"x".repeat(257)]).contains("over the limit of 256 bytes"));
        assert!(e(&["a\n"]).contains("control character"));
        assert!(e(&["a", "b", "a"]).contains("[2] duplicate name \"a\""));
        let many: Vec<String> = (0..65).map(|i| i.to_string()).collect();
        assert!(
            names(&many, &cfg)
                .unwrap_err()
                .to_string()
                .contains("limit of 64 per request")
        );
        assert_eq!(
            names(&["b".into(), "a/x".into()], &cfg).unwrap(),
            vec!["a/x".to_string(), "b".into()]
        );
    }

    /// The server's rules and words, from the one place both take them:
    /// every forbidden character in an owner is refused, not only control
    /// characters, and a refused name is quoted cut short, not whole.
    #[test]
    fn names_and_owners_follow_the_servers_rules() {
        let cfg = S3LeaseConfig::default();
        let long_bad = format!("{}\u{202E}", "n".repeat(200));
        let err = names(&[long_bad], &cfg).unwrap_err().to_string();
        assert!(err.contains("U+202E (a bidirectional override)"), "{err}");
        assert!(err.contains("(203 bytes)") && err.len() < 200, "{err}");
        let err = owner("ops\u{202E}", &cfg).unwrap_err().to_string();
        assert!(err.contains("owner: \"ops\\u{202e}\" contains U+202E"), "{err}");
        assert!(owner("ops@host:12", &cfg).is_ok());
    }

    #[test]
    fn deadlines_outside_the_ttl_range_are_refused() {
        let cfg = S3LeaseConfig::default();
        let now = Micros::from_micros(1_000_000_000);
        assert!(deadline(now.saturating_add(Duration::from_secs(5)), now, &cfg).is_ok());
        for bad in [Duration::ZERO, Duration::from_secs(1), Duration::from_secs(61)] {
            let err = deadline(now.saturating_add(bad), now, &cfg).unwrap_err();
            assert!(
                err.field() == Some("deadline_us")
                    && matches!(err, Error::TtlOutOfRange { max_ttl, .. } if max_ttl == Duration::from_secs(60)),
                "{err:?}"
            );
        }
    }

    #[test]
    fn a_wait_over_the_max_carries_the_max() {
        let cfg = S3LeaseConfig::default().with_max_wait(Duration::from_secs(5));
        assert!(wait(Duration::from_secs(5), &cfg).is_ok());
        let err = wait(Duration::from_secs(6), &cfg).unwrap_err();
        assert!(
            matches!(&err, Error::WaitTooLong { max, .. } if *max == Duration::from_secs(5)),
            "{err:?}"
        );
        assert_eq!(err.field(), Some("wait_us"));
    }
}
