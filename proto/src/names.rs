//! Characters a lease name or owner may not contain, one rule for every
//! side (the server, the S3 lease backend, the test double, the CLI
//! before it sends anything), and how a name is shown escaped.
//!
//! Names and owners are shown to operators (`describe`, conflicts, the
//! status page, witnesses read by auditors) and compared byte for byte.
//! Two that differ must not look the same, and none may change how the
//! text around it is displayed. The policy is to refuse, never to
//! normalize (a server that rewrote a name would grant something else
//! than what was asked, and a witness would name what nobody sent):
//!
//! * control characters (`Cc`) and the line and paragraph separators
//!   U+2028, U+2029;
//! * every `Default_Ignorable_Code_Point` (invisible: soft hyphen,
//!   zero-width characters, bidirectional marks, embeddings, overrides and
//!   isolates, Hangul fillers, variation selectors, tag characters), so
//!   `"a\u{AD}b"` is not a second `"ab"`;
//! * spaces other than U+0020 (no-break and typographic spaces look like
//!   it);
//! * the script-neutral combining diacritical marks (U+0300–U+036F,
//!   U+1AB0–U+1AFF, U+1DC0–U+1DFF, U+20D0–U+20FF, U+FE20–U+FE2F): they
//!   compose onto any letter, so `"e\u{301}"` would be a second `"é"`.
//!   Marks that belong to a script (Devanagari, Thai, Hebrew points…) are
//!   allowed: those scripts cannot be written without them.
//!
//! * text not in Unicode normalization form C (NFC): two canonically
//!   equivalent texts (`か` + U+3099 and `が`, U+212B ANGSTROM SIGN and
//!   `Å`, U+212A KELVIN SIGN and `K`) are by definition the same text to
//!   a reader, so only the NFC form is taken. The refusal names the code
//!   points that differ and the NFC form to send instead ([`NotNfc`]).
//!
//! Not refused: look-alike letters of different scripts (Latin `a`,
//! Cyrillic `а`) and compatibility characters (the ligature `ﬁ` and `fi`,
//! fullwidth `Ａ` and `A`). Telling those apart needs the confusables
//! tables of Unicode TS #39, which is more than a name check should carry;
//! where people must tell names apart, keep them ASCII.

use std::fmt;
use std::fmt::Write as _;

/// The first character of a name that is not allowed, with what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForbiddenChar {
    /// The character itself. Print it as its code point, as `Display`
    /// does: it may be invisible or reorder the text around it.
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

/// Unicode's `Default_Ignorable_Code_Point`, as DerivedCoreProperties.txt
/// of Unicode 16.0.0 lists it (<https://www.unicode.org/Public/16.0.0/ucd/DerivedCoreProperties.txt>),
/// ranges inclusive. The property is stable in practice: its reserved
/// ranges (U+2065, U+FFF0–U+FFF8, U+E0000–U+E0FFF) were set aside so that
/// characters assigned there later are default-ignorable already.
const DEFAULT_IGNORABLE: &[(u32, u32)] = &[
    (0x00AD, 0x00AD),   // SOFT HYPHEN
    (0x034F, 0x034F),   // COMBINING GRAPHEME JOINER
    (0x061C, 0x061C),   // ARABIC LETTER MARK
    (0x115F, 0x1160),   // HANGUL CHOSEONG FILLER..HANGUL JUNGSEONG FILLER
    (0x17B4, 0x17B5),   // KHMER VOWEL INHERENT AQ..AA
    (0x180B, 0x180F),   // MONGOLIAN FREE VARIATION SELECTORS, VOWEL SEPARATOR
    (0x200B, 0x200F),   // ZERO WIDTH SPACE..RIGHT-TO-LEFT MARK
    (0x202A, 0x202E),   // LEFT-TO-RIGHT EMBEDDING..RIGHT-TO-LEFT OVERRIDE
    (0x2060, 0x206F),   // WORD JOINER..NOMINAL DIGIT SHAPES (isolates included)
    (0x3164, 0x3164),   // HANGUL FILLER
    (0xFE00, 0xFE0F),   // VARIATION SELECTOR-1..16
    (0xFEFF, 0xFEFF),   // ZERO WIDTH NO-BREAK SPACE
    (0xFFA0, 0xFFA0),   // HALFWIDTH HANGUL FILLER
    (0xFFF0, 0xFFF8),   // reserved
    (0x1BCA0, 0x1BCA3), // SHORTHAND FORMAT LETTER OVERLAP..UP STEP
    (0x1D173, 0x1D17A), // MUSICAL SYMBOL BEGIN BEAM..END PHRASE
    (0xE0000, 0xE0FFF), // tags, VARIATION SELECTOR-17..256, reserved
];

/// The script-neutral combining diacritical blocks (Unicode's Blocks.txt):
/// Combining Diacritical Marks, ... Extended, ... Supplement, ... for
/// Symbols, Combining Half Marks.
const COMBINING_DIACRITICS: &[(u32, u32)] = &[
    (0x0300, 0x036F),
    (0x1AB0, 0x1AFF),
    (0x1DC0, 0x1DFF),
    (0x20D0, 0x20FF),
    (0xFE20, 0xFE2F),
];

fn in_ranges(c: char, ranges: &[(u32, u32)]) -> bool {
    let c = u32::from(c);
    ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&c))
}

/// What `c` is, when a name or owner may not contain it (the policy of
/// this module's documentation).
pub fn forbidden_kind(c: char) -> Option<&'static str> {
    Some(match c {
        c if c.is_control() => "a control character",
        '\u{2028}' | '\u{2029}' => "a line or paragraph separator",
        '\u{202A}' | '\u{202B}' | '\u{202D}' => "a bidirectional embedding or override",
        '\u{202E}' => "a bidirectional override",
        '\u{202C}' => "a bidirectional pop",
        '\u{2066}'..='\u{2069}' => "a bidirectional isolate",
        '\u{200E}' | '\u{200F}' | '\u{061C}' => "a bidirectional mark",
        '\u{200B}' | '\u{200C}' | '\u{200D}' | '\u{2060}' | '\u{FEFF}' => "a zero-width character",
        '\u{00AD}' => "a soft hyphen (invisible)",
        '\u{115F}' | '\u{1160}' | '\u{3164}' | '\u{FFA0}' => "a Hangul filler (blank)",
        '\u{E0020}'..='\u{E007F}' | '\u{E0001}' => "a tag character (invisible)",
        '\u{FE00}'..='\u{FE0F}' | '\u{E0100}'..='\u{E01EF}' | '\u{180B}'..='\u{180D}' | '\u{180F}' => {
            "a variation selector (invisible)"
        }
        c if in_ranges(c, DEFAULT_IGNORABLE) => "a default-ignorable character (invisible)",
        '\u{00A0}' | '\u{1680}' | '\u{2000}'..='\u{200A}' | '\u{202F}' | '\u{205F}' | '\u{3000}' => {
            "a space other than U+0020 (looks like one)"
        }
        c if in_ranges(c, COMBINING_DIACRITICS) => {
            "a combining diacritical mark (a letter plus a mark looks like another letter)"
        }
        _ => return None,
    })
}

/// `text` with every character [`forbidden_kind`] refuses written as an
/// escape (`\u{202e}`), the rest as it is: how a name, an owner or a
/// query is shown where a person reads it (the status page), so that
/// nothing reaching it can hide or reorder the text around it.
pub fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    if forbidden_char(text).is_none() {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if forbidden_kind(c).is_some() {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The first character `name` may not contain, if any.
///
/// Most names are ASCII, where the only characters refused are the
/// controls: those are checked byte by byte, without the Unicode tables
/// (it was 4 % of the server's CPU per acquire).
pub fn forbidden_char(name: &str) -> Option<ForbiddenChar> {
    if name.is_ascii() {
        let index = name.bytes().position(|b| b.is_ascii_control())?;
        let ch = char::from(name.as_bytes()[index]);
        let kind = forbidden_kind(ch)?;
        return Some(ForbiddenChar { ch, index, kind });
    }
    name.chars()
        .enumerate()
        .find_map(|(index, ch)| forbidden_kind(ch).map(|kind| ForbiddenChar { ch, index, kind }))
}

/// A text that is not in Unicode normalization form C: the characters
/// that differ from its NFC form, and that form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotNfc {
    /// The text in NFC: what to send instead.
    pub nfc: String,
    /// Position in characters (not bytes), from 0, of the first character
    /// that differs.
    pub index: usize,
    /// The characters that differ, as sent.
    pub sent: Vec<char>,
    /// What they are in NFC.
    pub canonical: Vec<char>,
}

/// At most this many code points of a difference are listed.
const NOT_NFC_CHARS: usize = 8;

fn code_points(f: &mut fmt::Formatter<'_>, chars: &[char]) -> fmt::Result {
    for (i, c) in chars.iter().take(NOT_NFC_CHARS).enumerate() {
        let sep = if i == 0 { "" } else { " " };
        write!(f, "{sep}U+{:04X}", u32::from(*c))?;
    }
    if chars.len() > NOT_NFC_CHARS {
        write!(f, " …")?;
    }
    Ok(())
}

impl fmt::Display for NotNfc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Worded to follow the quoted text, as `name_problem`'s are.
        write!(f, "is not in Unicode normalization form C: ")?;
        code_points(f, &self.sent)?;
        write!(f, " at character {} is ", self.index)?;
        code_points(f, &self.canonical)?;
        write!(
            f,
            " in NFC; send {} instead (canonically equivalent texts read the same, so only the NFC form is taken)",
            echo(&self.nfc)
        )
    }
}

/// How `text` differs from its NFC form, when it is not in NFC.
pub fn not_nfc(text: &str) -> Option<NotNfc> {
    use unicode_normalization::{IsNormalized, UnicodeNormalization, is_nfc_quick};
    if text.is_ascii() || is_nfc_quick(text.chars()) == IsNormalized::Yes {
        return None;
    }
    let nfc: String = text.nfc().collect();
    if nfc == text {
        return None;
    }
    let sent: Vec<char> = text.chars().collect();
    let canonical: Vec<char> = nfc.chars().collect();
    let head = sent.iter().zip(&canonical).take_while(|(a, b)| a == b).count();
    let tail = sent[head..]
        .iter()
        .rev()
        .zip(canonical[head..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    Some(NotNfc {
        index: head,
        sent: sent[head..sent.len() - tail].to_vec(),
        canonical: canonical[head..canonical.len() - tail].to_vec(),
        nfc,
    })
}

/// Why `text` may not be a name, an owner or part of one, beyond its
/// length: the first character [`forbidden_char`] refuses, else its
/// difference from NFC ([`not_nfc`]); worded to follow the quoted text.
pub fn text_problem(text: &str) -> Option<String> {
    if let Some(bad) = forbidden_char(text) {
        return Some(format!("{} contains {bad}", echo(text)));
    }
    not_nfc(text).map(|not| format!("{} {not}", echo(text)))
}

/// At most this many characters of a caller's value are quoted back in an
/// error: enough to recognise it, never enough to turn a 4 MB field into a
/// 4 MB (or, escaped, 30 MB) answer.
pub const ECHO_CHARS: usize = 48;

/// `raw`, quoted and escaped, cut to [`ECHO_CHARS`] characters (with its
/// full length when cut): how every side quotes a caller's value back.
/// Escaped as Rust's `{:?}` does, and so is every character the rule
/// refuses ([`shown`]): a refusal never carries the invisible or blank
/// character it refuses.
pub fn echo(raw: &str) -> String {
    let mut chars = raw.char_indices();
    let quoted = match chars.nth(ECHO_CHARS) {
        None => format!("{raw:?}"),
        Some((end, _)) => format!("{:?}… ({} bytes)", &raw[..end], raw.len()),
    };
    // `{:?}` escaped every backslash, so an escape added here is the
    // only reading of what it shows.
    shown(&quoted).into_owned()
}

/// Why `name` cannot name a lease (empty, over `max_bytes`, holding a
/// character [`forbidden_char`] refuses, or not in NFC), worded for an
/// error that follows the field's name; `None` when it can. The one rule
/// the server and the S3 lease store both apply.
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
    text_problem(name)
}

/// Why `owner` cannot be a lease's owner: over `max_bytes`, holding a
/// character a name may not hold, or not in NFC (owners are shown where names are:
/// conflicts, describe, the status page, witnesses). The same rule for an
/// owner a client sends and one taken from its certificate's subject.
pub fn owner_problem(owner: &str, max_bytes: usize) -> Option<String> {
    if owner.len() > max_bytes {
        return Some(format!(
            "is {} bytes, over the limit of {max_bytes} bytes",
            owner.len()
        ));
    }
    text_problem(owner)
}

#[cfg(test)]
mod tests {
    /// The ASCII path agrees with the character tables on every ASCII
    /// character, at every position of every two-character name.
    #[test]
    fn ascii_names_are_judged_as_the_tables_judge_them() {
        let slow = |name: &str| {
            name.chars()
                .enumerate()
                .find_map(|(index, ch)| forbidden_kind(ch).map(|kind| ForbiddenChar { ch, index, kind }))
        };
        for a in 0u8..128 {
            for b in 0u8..128 {
                let name: String = [char::from(a), char::from(b)].into_iter().collect();
                assert_eq!(forbidden_char(&name), slow(&name), "{name:?}");
            }
        }
    }

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
        assert_eq!(echo("a\u{3164}\u{a0}b"), "\"a\\u{3164}\\u{a0}b\"");
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

    /// Two names that differ must not look alike: each of these would
    /// pass for the plain name beside it.
    #[test]
    fn invisible_blank_and_combining_look_alikes_are_refused() {
        let cases = [
            ("ab", "a\u{AD}b", '\u{AD}', "soft hyphen"),
            ("ab", "ab\u{E0041}", '\u{E0041}', "tag character"),
            ("ab", "a\u{E0001}b", '\u{E0001}', "tag character"),
            ("a b", "a\u{3164}b", '\u{3164}', "Hangul filler"),
            ("a b", "a\u{115F}b", '\u{115F}', "Hangul filler"),
            ("a b", "a\u{A0}b", '\u{A0}', "space other than U+0020"),
            ("a b", "a\u{3000}b", '\u{3000}', "space other than U+0020"),
            ("a b", "a\u{2028}b", '\u{2028}', "line or paragraph separator"),
            ("\u{E9}", "e\u{301}", '\u{301}', "combining diacritical mark"),
            ("a", "a\u{20DD}", '\u{20DD}', "combining diacritical mark"),
            ("a", "a\u{FE0F}", '\u{FE0F}', "variation selector"),
            ("a", "a\u{E0100}", '\u{E0100}', "variation selector"),
            ("ab", "a\u{34F}b", '\u{34F}', "default-ignorable"),
            ("ab", "a\u{2064}b", '\u{2064}', "default-ignorable"),
            ("ab", "a\u{1D173}b", '\u{1D173}', "default-ignorable"),
            ("ab", "a\u{E0FFF}b", '\u{E0FFF}', "default-ignorable"),
        ];
        for (plain, lookalike, ch, kind) in cases {
            assert_eq!(forbidden_char(plain), None, "{plain:?}");
            let bad = forbidden_char(lookalike).unwrap_or_else(|| panic!("{lookalike:?} accepted"));
            assert_eq!(bad.ch, ch, "{lookalike:?}");
            assert!(bad.kind.contains(kind), "{lookalike:?}: {}", bad.kind);
            assert!(
                owner_problem(lookalike, 64).is_some(),
                "owner {lookalike:?} accepted"
            );
        }
        // Every range of the table is refused at both ends.
        for &(lo, hi) in DEFAULT_IGNORABLE.iter().chain(COMBINING_DIACRITICS) {
            for c in [lo, hi] {
                let c = char::from_u32(c).unwrap();
                assert!(forbidden_kind(c).is_some(), "U+{:04X} accepted", u32::from(c));
            }
        }
        // Scripts that need their own marks, and ordinary punctuation.
        for ok in [
            "\u{939}\u{93f}\u{928}\u{94d}\u{926}\u{940}", // Hindi: vowel signs and a virama
            "\u{e20}\u{e32}\u{e29}\u{e32}\u{e44}\u{e17}\u{e22}", // Thai
            "\u{5e9}\u{5c1}\u{5b8}\u{5dc}\u{5d5}\u{5b9}\u{5dd}", // Hebrew with points
            "caf\u{e9} \u{65e5}\u{672c}/O=acme,CN=worker-1 +x_y.z~",
        ] {
            assert_eq!(forbidden_char(ok), None, "{ok:?}");
        }
    }

    /// Canonically equivalent names read the same: only the NFC form is a
    /// name, and the refusal says which code points differ and what to
    /// send.
    #[test]
    fn names_not_in_nfc_are_refused_with_their_nfc_form() {
        let cases = [
            (
                "\u{304B}\u{3099}",
                "\u{304C}",
                0,
                "U+304B U+3099 at character 0 is U+304C in NFC",
            ),
            (
                "x\u{212B}y",
                "x\u{C5}y",
                1,
                "U+212B at character 1 is U+00C5 in NFC",
            ),
            ("\u{212A}", "K", 0, "U+212A at character 0 is U+004B in NFC"),
            // Marks in another order than the canonical one.
            (
                "\u{5e9}\u{5c1}\u{5b8}",
                "\u{5e9}\u{5b8}\u{5c1}",
                1,
                "U+05C1 U+05B8 at character 1 is U+05B8 U+05C1 in NFC",
            ),
            // Hangul jamo compose into a syllable.
            (
                "\u{1100}\u{1161}",
                "\u{AC00}",
                0,
                "U+1100 U+1161 at character 0 is U+AC00 in NFC",
            ),
        ];
        for (sent, nfc, index, why) in cases {
            let not = not_nfc(sent).unwrap_or_else(|| panic!("{sent:?} taken as NFC"));
            assert_eq!((not.nfc.as_str(), not.index), (nfc, index), "{sent:?}");
            let m = name_problem(sent, 64).unwrap();
            assert!(m.contains(why), "{sent:?}: {m}");
            assert!(m.contains(&format!("send {nfc:?} instead")), "{sent:?}: {m}");
            assert!(owner_problem(sent, 64).unwrap().contains(why), "{sent:?}");
            assert_eq!(name_problem(nfc, 64), None, "{nfc:?}");
        }
        // A refused character is named first, as before (e + U+0301 is
        // not NFC either).
        assert!(
            name_problem("e\u{301}", 64)
                .unwrap()
                .contains("combining diacritical mark")
        );
        // NFC text of any script, and compatibility characters (NFC keeps
        // them), pass.
        for ok in [
            "tenant-7",
            "caf\u{e9} \u{65e5}\u{672c}",
            "\u{939}\u{93f}\u{928}\u{94d}\u{926}\u{940}",
            "\u{5e9}\u{5b8}\u{5c1}\u{5dc}\u{5d5}\u{5b9}\u{5dd}",
            "\u{FB01}le \u{FF21}",
        ] {
            assert_eq!(not_nfc(ok), None, "{ok:?}");
        }
        // The difference listed is bounded whatever is sent.
        let long = "\u{212B}".repeat(1000);
        let m = name_problem(&long, usize::MAX).unwrap();
        assert!(
            m.len() < 600 && m.contains("U+212B U+212B") && m.contains('…'),
            "{m}"
        );
    }

    #[test]
    fn shown_escapes_exactly_what_is_refused() {
        assert!(matches!(
            shown("tenant-7 caf\u{e9}"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(
            shown("CN=a\u{202E}b\u{AD}c\u{E0041}\n\u{e9}"),
            "CN=a\\u{202e}b\\u{ad}c\\u{e0041}\\u{a}\u{e9}"
        );
    }
}
