//! Characters a lease name may not contain, one rule for every side (the
//! server, the S3 lease backend, the CLI before it sends anything).
//!
//! Names are shown to operators (`describe`, conflicts, the status page,
//! witnesses read by auditors). Besides control characters, a name may not
//! hold characters that change how the text around them is displayed while
//! being invisible themselves: bidirectional overrides, embeddings and
//! isolates (`"tenant-\u{202E}7-tnanet"` would display as another name),
//! bidirectional marks, and zero-width characters (two names that look
//! the same but are not).

use std::fmt;

/// The first character of a name that is not allowed, with what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForbiddenChar {
    pub ch: char,
    /// Position in characters (not bytes), from 0.
    pub index: usize,
    /// e.g. "a bidirectional override".
    pub kind: &'static str,
}

impl fmt::Display for ForbiddenChar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "U+{:04X} ({}) at character {}",
            u32::from(self.ch),
            self.kind,
            self.index
        )
    }
}

/// What `c` is, when a name may not contain it.
pub fn forbidden_kind(c: char) -> Option<&'static str> {
    Some(match c {
        c if c.is_control() => "a control character",
        '\u{202A}' | '\u{202B}' | '\u{202D}' => "a bidirectional embedding or override",
        '\u{202E}' => "a bidirectional override",
        '\u{202C}' => "a bidirectional pop",
        '\u{2066}'..='\u{2069}' => "a bidirectional isolate",
        '\u{200E}' | '\u{200F}' | '\u{061C}' => "a bidirectional mark",
        '\u{200B}' | '\u{200C}' | '\u{200D}' | '\u{2060}' | '\u{FEFF}' => "a zero-width character",
        _ => return None,
    })
}

/// The first character `name` may not contain, if any.
pub fn forbidden_char(name: &str) -> Option<ForbiddenChar> {
    name.chars()
        .enumerate()
        .find_map(|(index, ch)| forbidden_kind(ch).map(|kind| ForbiddenChar { ch, index, kind }))
}

/// At most this many characters of a caller's value are quoted back in an
/// error: enough to recognise it, never enough to turn a 4 MB field into a
/// 4 MB (or, escaped, 30 MB) answer.
pub const ECHO_CHARS: usize = 48;

/// `raw`, quoted and escaped, cut to [`ECHO_CHARS`] characters (with its
/// full length when cut): how every side quotes a caller's value back.
pub fn echo(raw: &str) -> String {
    let mut chars = raw.char_indices();
    match chars.nth(ECHO_CHARS) {
        None => format!("{raw:?}"),
        Some((end, _)) => format!("{:?}… ({} bytes)", &raw[..end], raw.len()),
    }
}

/// Why `name` cannot name a lease (empty, over `max_bytes`, or holding a
/// character [`forbidden_char`] refuses), worded for an error that
/// follows the field's name; `None` when it can. The one rule the server
/// and the S3 lease store both apply.
pub fn name_problem(name: &str, max_bytes: usize) -> Option<String> {
    if name.is_empty() {
        return Some("is empty; names must be 1 or more bytes".into());
    }
    if name.len() > max_bytes {
        return Some(format!(
            "is {} bytes, over the limit of {max_bytes} bytes",
            name.len()
        ));
    }
    forbidden_char(name).map(|bad| format!("{} contains {bad}", echo(name)))
}

/// Why `owner` cannot be a lease's owner: over `max_bytes`, or holding a
/// character a name may not hold (owners are shown where names are:
/// conflicts, describe, the status page, witnesses).
pub fn owner_problem(owner: &str, max_bytes: usize) -> Option<String> {
    if owner.len() > max_bytes {
        return Some(format!(
            "is {} bytes, over the limit of {max_bytes} bytes",
            owner.len()
        ));
    }
    forbidden_char(owner).map(|bad| format!("{} contains {bad}", echo(owner)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_are_worded_once_and_echo_short() {
        assert_eq!(name_problem("a", 4), None);
        assert_eq!(
            name_problem("", 4).unwrap(),
            "is empty; names must be 1 or more bytes"
        );
        assert_eq!(
            name_problem("abcde", 4).unwrap(),
            "is 5 bytes, over the limit of 4 bytes"
        );
        let huge = "x\u{202E}".repeat(1_000_000);
        let why = name_problem(&huge, usize::MAX).unwrap();
        assert!(why.len() < 400, "{}", why.len());
        assert!(why.contains("(4000000 bytes)") && why.contains("U+202E"), "{why}");
        assert_eq!(owner_problem("ops", 8), None);
        assert!(owner_problem("a\u{200B}b", 8).unwrap().contains("zero-width"));
        assert!(
            owner_problem("123456789", 8)
                .unwrap()
                .contains("over the limit of 8 bytes")
        );
        assert_eq!(echo("abc"), "\"abc\"");
    }

    #[test]
    fn display_changing_and_invisible_characters_are_named() {
        assert_eq!(forbidden_char("tenant-7"), None);
        assert_eq!(forbidden_char("caf\u{e9}/\u{65e5}\u{672c}"), None);
        let cases = [
            ("a\nb", '\n', 1, "control"),
            ("ab\u{202E}c", '\u{202E}', 2, "override"),
            ("\u{202A}", '\u{202A}', 0, "embedding"),
            ("x\u{2066}", '\u{2066}', 1, "isolate"),
            ("x\u{2069}", '\u{2069}', 1, "isolate"),
            ("x\u{200B}y", '\u{200B}', 1, "zero-width"),
            ("x\u{200D}", '\u{200D}', 1, "zero-width"),
            ("\u{2060}", '\u{2060}', 0, "zero-width"),
            ("\u{FEFF}x", '\u{FEFF}', 0, "zero-width"),
            ("\u{e9}\u{200F}", '\u{200F}', 1, "mark"),
        ];
        for (name, ch, index, kind) in cases {
            let bad = forbidden_char(name).unwrap_or_else(|| panic!("{name:?} accepted"));
            assert_eq!((bad.ch, bad.index), (ch, index), "{name:?}");
            assert!(bad.kind.contains(kind), "{name:?}: {}", bad.kind);
        }
        assert_eq!(
            forbidden_char("ab\u{202E}c").unwrap().to_string(),
            "U+202E (a bidirectional override) at character 2"
        );
    }
}
