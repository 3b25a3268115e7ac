//! Request values checked at the backend's edge, with the server's limits
//! and wording: every refusal names the field and the limit it broke, so a
//! caller moving between the server and S3 sees the same errors.

use std::collections::HashSet;
use std::time::Duration;

use bagel_lease_core::{Error, Metadata, Micros};
use bagel_proto::names;

use crate::config::S3LeaseConfig;

fn invalid(field: &str, reason: String) -> Error {
    Error::invalid(field, reason)
}

/// Checks and sorts a lease's names (the fixed order every acquirer takes
/// them in). Duplicates are refused rather than merged.
pub fn names(raw: &[String], cfg: &S3LeaseConfig) -> Result<Vec<String>, Error> {
    if raw.is_empty() {
        return Err(invalid("names", "at least one name is required".into()));
    }
    if raw.len() > cfg.max_names_per_request {
        return Err(invalid(
            "names",
            format!(
                "{} names exceed the limit of {} per request",
                raw.len(),
                cfg.max_names_per_request
            ),
        ));
    }
    let mut seen = HashSet::with_capacity(raw.len());
    for (i, name) in raw.iter().enumerate() {
        if let Some(why) = names::name_problem(name, cfg.max_name_bytes) {
            return Err(invalid("names", format!("[{i}] {why}")));
        }
        if !seen.insert(name.as_str()) {
            return Err(invalid(
                "names",
                format!("[{i}] duplicate name {}", names::echo(name)),
            ));
        }
    }
    let mut sorted = raw.to_vec();
    sorted.sort_unstable();
    Ok(sorted)
}

pub fn owner(raw: &str, cfg: &S3LeaseConfig) -> Result<(), Error> {
    match names::owner_problem(raw, cfg.max_owner_bytes) {
        Some(why) => Err(invalid("owner", why)),
        None => Ok(()),
    }
}

pub fn metadata(m: Option<&Metadata>, cfg: &S3LeaseConfig) -> Result<(), Error> {
    if let Some(Metadata::Data(d)) = m
        && d.len() > cfg.max_metadata_bytes
    {
        return Err(invalid(
            "metadata.data",
            format!(
                "is {} bytes, over the limit of {} bytes",
                d.len(),
                cfg.max_metadata_bytes
            ),
        ));
    }
    Ok(())
}

/// Refuses a deadline outside `(now + min_ttl, now + max_ttl]`.
pub fn deadline(deadline: Micros, now: Micros, cfg: &S3LeaseConfig) -> Result<(), Error> {
    let lo = now.saturating_add(cfg.min_ttl);
    let hi = now.saturating_add(cfg.max_ttl);
    if deadline <= lo || deadline > hi {
        return Err(Error::out_of_range(
            "deadline_us",
            format!(
                "{} ({deadline}) must lie in (now + min_ttl, now + max_ttl] = ({}, {}] (min_ttl \
                 {:?}, max_ttl {:?}, now {now})",
                deadline.as_micros(),
                lo.as_micros(),
                hi.as_micros(),
                cfg.min_ttl,
                cfg.max_ttl,
            ),
        ));
    }
    Ok(())
}

pub fn wait(wait: Duration, cfg: &S3LeaseConfig) -> Result<(), Error> {
    if wait > cfg.max_wait {
        return Err(Error::out_of_range(
            "wait_us",
            format!("{wait:?} is over the limit of {:?}", cfg.max_wait),
        ));
    }
    Ok(())
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

    /// The server's rules and words, from the one place both take them
    /// (the S3 store used to refuse only control characters in an owner,
    /// and to quote a refused name whole).
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
                err.field() == Some("deadline_us") && matches!(err, Error::OutOfRange { .. }),
                "{err:?}"
            );
        }
    }
}
