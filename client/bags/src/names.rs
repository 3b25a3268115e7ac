//! Log names and writer ids: path-safe, and never colliding with the
//! names the protocol itself uses (`_start`, `prelock`, `.lock.*`).

use crate::error::{Error, Result};
/// Checks a log name: path-safe segments of `[A-Za-z0-9._-]` separated by
/// `/`, none starting with `.` or `_` (those are ours).
pub fn validate_log(log: &str) -> Result<()> {
    if log.is_empty() || log.len() > 200 {
        return Err(Error::invalid("log name", log, "must be 1 to 200 bytes"));
    }
    for seg in log.split('/') {
        validate_segment("log name", log, seg)?;
        if seg.len() == 4 && seg.bytes().all(|b| b.is_ascii_digit()) {
            // Harmless, but keep logs and the time tree visibly apart.
            return Err(Error::invalid(
                "log name",
                log,
                "a segment may not be a 4-digit year",
            ));
        }
    }
    Ok(())
}

/// Checks a writer id: `[A-Za-z0-9._-]`, 1 to 64 bytes, not starting with
/// `.` or `_`.
pub fn validate_writer_id(id: &str) -> Result<()> {
    if id.len() > 64 {
        return Err(Error::invalid("writer id", id, "at most 64 bytes"));
    }
    validate_segment("writer id", id, id)
}

fn validate_segment(what: &'static str, whole: &str, seg: &str) -> Result<()> {
    if seg.is_empty() {
        return Err(Error::invalid(what, whole, "empty path segment"));
    }
    if seg.starts_with('.') || seg.starts_with('_') {
        return Err(Error::invalid(what, whole, "may not start with '.' or '_'"));
    }
    if let Some(c) = seg
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(Error::invalid(
            what,
            whole,
            format!("character {c:?} not allowed"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(validate_log("tenants/acme").is_ok());
        assert!(validate_log("../x").is_err());
        assert!(validate_log("a//b").is_err());
        assert!(validate_log("_x").is_err());
        assert!(validate_writer_id("host-1.pid-7").is_ok());
        assert!(validate_writer_id("a/b").is_err());
    }
}
