//! Names as the CLI takes and shows them: refused before anything is sent
//! when they hold characters that change or hide how text is displayed
//! (the rule every server and lease store applies, see
//! `bagel_proto::names`), and shown escaped wherever they come back from a
//! server or a store.

use anyhow::bail;

/// Refuses the first name holding a character the shared rule refuses
/// (control, invisible or bidirectional, a space other than U+0020, a
/// script-neutral combining mark), naming the code point (the name itself
/// is quoted escaped), and the first not in Unicode NFC (naming the form
/// to send instead).
pub fn check<'a>(what: &str, names: impl IntoIterator<Item = &'a String>) -> anyhow::Result<()> {
    for name in names {
        if let Some(bad) = bagel_proto::names::forbidden_char(name) {
            bail!(
                "{what} {name:?} contains {bad}; names may not hold control, invisible (default-ignorable) \
                 or bidirectional characters, spaces other than U+0020, or combining marks that make \
                 two names look alike"
            );
        }
        // The server takes only the NFC form of a name (canonically
        // equivalent names would be two leases that read the same): said
        // here, before anything is sent, with the form to send instead.
        if let Some(not) = bagel_proto::names::not_nfc(name) {
            bail!("{what} {name:?} {not}");
        }
    }
    Ok(())
}

/// A name from a server or a store, for a line of text: control,
/// bidirectional and zero-width characters escaped (`\u{202e}`), the rest
/// as it is.
pub fn shown(name: &str) -> String {
    name.escape_debug().to_string()
}

/// Refuses a path flag given the content of a lease file instead of its
/// path, without echoing it (it holds the lease's token).
pub fn path_not_json(flag: &str, value: &str) -> anyhow::Result<()> {
    let trimmed = value.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') || value.contains('\n') {
        bail!(
            "{flag} expects a lease id or the path of a lease file; it was given what looks like JSON text \
             ({} bytes, not shown: it may hold the lease's token). Save it to a file and give its path",
            value.len()
        );
    }
    Ok(())
}

/// A `--wait`: a duration (`10s`, `5m`) or `forever`.
pub fn parse_wait(text: &str) -> Result<std::time::Duration, String> {
    if text == "forever" {
        return Ok(bagel_client::long_wait::FOREVER);
    }
    humantime::parse_duration(text).map_err(|e| format!("{e} (a duration such as 5m, or `forever`)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_names_are_named_escaped() {
        let e = check("name", &["ok".to_owned(), "a\u{202e}b".to_owned()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("U+202E") && e.contains("\"a\\u{202e}b\""), "{e}");
        assert!(!e.contains('\u{202e}'), "{e}");
        assert_eq!(shown("tenant-7"), "tenant-7");
        assert_eq!(shown("x\u{200b}"), "x\\u{200b}");
    }

    #[test]
    fn json_text_is_never_echoed() {
        let secret = r#"{"lease_id":"ab","token":"s3cr3t"}"#;
        let e = path_not_json("--lease", secret).unwrap_err().to_string();
        assert!(!e.contains("s3cr3t") && e.contains("path"), "{e}");
        assert!(path_not_json("--lease", "leases/lease.json").is_ok());
    }
}
