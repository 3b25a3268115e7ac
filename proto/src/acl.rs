//! Who may do what to which names: the access policy of a lease server
//! (`bagel-server --acl FILE`), as pure functions shared by the server and
//! the CLI (`bagel acl check` tests a policy offline with the same code).
//!
//! # The file
//!
//! TOML, so that a policy can carry comments saying why a grant exists:
//!
//! ```toml
//! # Team A's scheduler: every name under team-a/.
//! [[grant]]
//! identity = "CN=scheduler,O=team-a"
//! prefixes = ["team-a/"]
//! permissions = ["lease", "read"]
//!
//! # Any of team B's workers (a pattern over the subject's components).
//! [[grant]]
//! subject = { O = "team-b", CN = "worker-*" }
//! prefixes = ["team-b/jobs/"]
//! permissions = ["lease"]
//!
//! # A client without a certificate: a bearer token, stored hashed.
//! [[token]]
//! identity = "ci-deployer"
//! sha256 = "…64 hex digits: bagel acl hash-token…"
//! ```
//!
//! * An identity is a client certificate's subject (RFC 4514 text, as
//!   `bagel server-info` shows it) or a token's `identity`. A token's
//!   identity may not contain `=`, so no token can pass for a certificate.
//! * A grant names its identity exactly (`identity`) or by a pattern over
//!   the subject's attributes (`subject`): every attribute listed must be
//!   in the subject, and every one of its values must match its pattern
//!   (a subject with `O=team-x,O=team-b` is not team B's), where `*`
//!   stands for any run of characters (attribute names compare
//!   case-insensitively).
//! * `prefixes` are plain byte prefixes of names (`""` is every name):
//!   end one with a separator, or `team-a` also grants `team-ab/…`.
//! * `lease` covers acquire (waiting included), renew, upgrade and release;
//!   `read` covers describe, history, list and watch.
//! * Grants only add: with a policy, whatever no grant allows is denied.
//!
//! Why a file of hashes rather than tokens: the policy is read by
//! operators, kept in repositories and shown in diffs; a SHA-256 of a
//! random token lets the server recognise it without the file being a
//! secret. Tokens are compared in constant time (every stored hash is
//! compared in full, whichever matches).

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use sha2::{Digest as _, Sha256};

/// What a grant allows on the names under its prefixes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    /// Acquire (waiting included), renew, upgrade, release.
    Lease,
    /// Describe, history, list, watch.
    Read,
}

impl Permission {
    /// Every permission, in the order `server-info` lists them.
    pub const ALL: [Permission; 2] = [Permission::Lease, Permission::Read];

    /// The word the policy file and `bagel acl check` use for it.
    pub fn name(self) -> &'static str {
        match self {
            Permission::Lease => "lease",
            Permission::Read => "read",
        }
    }

    fn bit(self) -> u8 {
        match self {
            Permission::Lease => 1,
            Permission::Read => 2,
        }
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Permission {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lease" => Ok(Permission::Lease),
            "read" => Ok(Permission::Read),
            other => Err(format!("unknown permission {other:?}: expected lease or read")),
        }
    }
}

/// Why a policy file was refused: where (line, and which grant or token,
/// counted from 1 in file order) and what.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", where_text(*.line, .entry.as_ref()))]
pub struct PolicyError {
    /// The line of the policy file (from 1), when the TOML parser or the
    /// entry can say.
    pub line: Option<usize>,
    /// e.g. `("grant", 2)`.
    pub entry: Option<(&'static str, usize)>,
    /// What is wrong, for the operator who wrote the file.
    pub message: String,
}

fn where_text(line: Option<usize>, entry: Option<&(&'static str, usize)>) -> String {
    match (line, entry) {
        (Some(l), Some((kind, n))) => format!("line {l} ({kind} {n}): "),
        (Some(l), None) => format!("line {l}: "),
        (None, Some((kind, n))) => format!("{kind} {n}: "),
        (None, None) => String::new(),
    }
}

/// Who a grant is for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Who {
    Exact(String),
    /// Attribute (lower case) and pattern, every one of which must match.
    Subject(Vec<(String, String)>),
}

impl Who {
    fn matches(&self, identity: &str, subject: Option<&[(String, String)]>) -> bool {
        match self {
            Who::Exact(exact) => exact == identity,
            // Every value of a listed attribute must match, not any one:
            // a CA may sign `O=team-x,O=team-b`, which must not pass for
            // team B's (nor `CN=auditor,CN=worker-5` for a worker).
            Who::Subject(patterns) => subject.is_some_and(|avas| {
                patterns.iter().all(|(attr, pattern)| {
                    let mut values = avas
                        .iter()
                        .filter(|(a, _)| a.eq_ignore_ascii_case(attr))
                        .peekable();
                    values.peek().is_some() && values.all(|(_, v)| glob(pattern, v))
                })
            }),
        }
    }
}

/// One `[[grant]]` of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Grant {
    /// 1-based, in file order, and its line: how a verdict says why.
    number: usize,
    line: usize,
    who: Who,
    permissions: u8,
    prefixes: Vec<String>,
}

/// One `[[token]]`: an identity and the SHA-256 of its bearer token.
#[derive(Clone, PartialEq, Eq)]
struct Token {
    identity: String,
    sha256: [u8; 32],
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// A parsed policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    grants: Vec<Grant>,
    tokens: Vec<Token>,
    /// SHA-256 of the file's bytes: which file a server runs with.
    sha256: [u8; 32],
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToml {
    #[serde(default)]
    grant: Vec<toml::Spanned<GrantToml>>,
    #[serde(default)]
    token: Vec<toml::Spanned<TokenToml>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantToml {
    identity: Option<String>,
    subject: Option<BTreeMap<String, String>>,
    prefixes: Vec<String>,
    permissions: Vec<Permission>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenToml {
    identity: String,
    sha256: String,
}

/// The 1-based line of byte `offset` of `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

impl Policy {
    /// Parses a policy file, refusing anything it does not understand
    /// (unknown keys, permissions, malformed hashes) rather than granting
    /// less or more than its author meant.
    pub fn parse(text: &str) -> Result<Policy, PolicyError> {
        let file: FileToml = toml::from_str(text).map_err(|e| PolicyError {
            line: e.span().map(|s| line_of(text, s.start)),
            entry: None,
            message: e.message().trim_end().to_owned(),
        })?;
        let mut grants = Vec::with_capacity(file.grant.len());
        for (i, spanned) in file.grant.into_iter().enumerate() {
            let line = line_of(text, spanned.span().start);
            let fail = |message: String| PolicyError {
                line: Some(line),
                entry: Some(("grant", i + 1)),
                message,
            };
            let g = spanned.into_inner();
            let who = match (g.identity, g.subject) {
                (Some(identity), None) => {
                    check_text("identity", &identity).map_err(&fail)?;
                    Who::Exact(identity)
                }
                (None, Some(subject)) => {
                    if subject.is_empty() {
                        return Err(fail(
                            "subject names no attribute; to grant every certificate, write \
                             subject = { CN = \"*\" }"
                                .into(),
                        ));
                    }
                    let mut patterns = Vec::with_capacity(subject.len());
                    for (attr, pattern) in subject {
                        if attr.is_empty() || !attr.chars().all(|c| c.is_ascii_alphanumeric() || c == '.') {
                            return Err(fail(format!(
                                "subject attribute {attr:?} is not an attribute name (CN, O, OU, \
                                 or a dotted OID)"
                            )));
                        }
                        if pattern.is_empty() {
                            return Err(fail(format!("subject {attr} is empty; use \"*\" for any value")));
                        }
                        check_text("subject", &pattern).map_err(&fail)?;
                        patterns.push((attr.to_ascii_lowercase(), pattern));
                    }
                    Who::Subject(patterns)
                }
                (Some(_), Some(_)) => {
                    return Err(fail(
                        "has both identity and subject: give one (identity exact, subject a pattern)".into(),
                    ));
                }
                (None, None) => {
                    return Err(fail(
                        "names nobody: give identity (exact) or subject (a pattern)".into(),
                    ));
                }
            };
            if g.prefixes.is_empty() {
                return Err(fail(
                    "prefixes is empty: list the name prefixes it covers (\"\" for every name)".into(),
                ));
            }
            for prefix in &g.prefixes {
                if let Some(bad) = crate::names::forbidden_char(prefix) {
                    return Err(fail(format!(
                        "prefix {} contains {bad}, which no name may contain",
                        crate::names::echo(prefix)
                    )));
                }
                if let Some(not) = crate::names::not_nfc(prefix) {
                    return Err(fail(format!(
                        "prefix {} {not}: names must be in NFC, so no name could start with it",
                        crate::names::echo(prefix)
                    )));
                }
            }
            if g.permissions.is_empty() {
                return Err(fail("permissions is empty: list lease, read or both".into()));
            }
            grants.push(Grant {
                number: i + 1,
                line,
                who,
                permissions: g.permissions.iter().fold(0, |acc, p| acc | p.bit()),
                prefixes: g.prefixes,
            });
        }
        let mut tokens: Vec<Token> = Vec::with_capacity(file.token.len());
        for (i, spanned) in file.token.into_iter().enumerate() {
            let line = line_of(text, spanned.span().start);
            let fail = |message: String| PolicyError {
                line: Some(line),
                entry: Some(("token", i + 1)),
                message,
            };
            let t = spanned.into_inner();
            check_text("identity", &t.identity).map_err(&fail)?;
            if t.identity.contains('=') {
                return Err(fail(format!(
                    "identity {} contains '=': a token's identity may not look like a \
                     certificate subject",
                    crate::names::echo(&t.identity)
                )));
            }
            let sha256 = crate::hex::decode_array::<32>(&t.sha256).map_err(|_| {
                fail(
                    "sha256 is not 64 hex digits (the SHA-256 of the token: bagel acl hash-token); \
                     never put the token itself in the policy"
                        .into(),
                )
            })?;
            if let Some(other) = tokens.iter().position(|o| o.sha256 == sha256) {
                return Err(fail(format!(
                    "has the same sha256 as token {}: one token, one identity",
                    other + 1
                )));
            }
            tokens.push(Token {
                identity: t.identity,
                sha256,
            });
        }
        Ok(Policy {
            grants,
            tokens,
            sha256: Sha256::digest(text.as_bytes()).into(),
        })
    }

    /// The SHA-256 of the file this policy was parsed from, in hex.
    pub fn sha256_hex(&self) -> String {
        crate::hex::encode(&self.sha256)
    }

    /// How many `[[grant]]` entries the file has (logged when it loads).
    pub fn grant_count(&self) -> usize {
        self.grants.len()
    }

    /// How many `[[token]]` entries the file has (logged when it loads).
    pub fn token_count(&self) -> usize {
        self.tokens.len()
    }

    /// The identity of the token whose SHA-256 is `digest`, if any. Every
    /// stored hash is compared in full (no early exit on a byte, nor on a
    /// match), so the time taken says nothing about how close a guess was.
    pub fn token_identity(&self, digest: &[u8; 32]) -> Option<&str> {
        let mut found = None;
        for token in &self.tokens {
            let diff = token
                .sha256
                .iter()
                .zip(digest)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if diff == 0 {
                found = Some(token.identity.as_str());
            }
        }
        found
    }

    /// What `identity` is granted: the grants that name it, resolved once
    /// (the server keeps them per identity, so a request checks prefixes
    /// only).
    pub fn grants_for(&self, identity: &str) -> Grants {
        let subject = parse_subject(identity);
        let mut entries = Vec::new();
        for g in &self.grants {
            if g.who.matches(identity, subject.as_deref()) {
                for prefix in &g.prefixes {
                    entries.push(Entry {
                        permissions: g.permissions,
                        prefix: prefix.clone(),
                        grant: g.number,
                        line: g.line,
                    });
                }
            }
        }
        Grants { entries }
    }
}

/// Refuses an identity or pattern that is empty or holds a character no
/// name or owner may hold (it could never match, or would show operators
/// something else than it is).
fn check_text(what: &str, text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Err(format!("{what} is empty"));
    }
    match crate::names::forbidden_char(text) {
        Some(bad) => Err(format!("{what} {} contains {bad}", crate::names::echo(text))),
        None => Ok(()),
    }
}

/// The SHA-256 of a bearer token: what the policy stores and what the
/// server compares.
pub fn hash_token(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Something risky about a policy file that is taken all the same: said
/// loudly by the server at start and at every reload that brings it, and
/// by `bagel acl check`, never refused. An empty policy is a legitimate
/// deny-all (a server being set up), and a Kubernetes ConfigMap is
/// mounted through symbolic links; but each can also be a mistake or a
/// door left open, which an operator must hear about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyWarning {
    /// Any local user may write the file (permission bits `mode`), and so
    /// grant themselves every name.
    WorldWritable {
        /// The file's permission bits (`0o666`).
        mode: u32,
    },
    /// The path given is a symbolic link (to `target`): whoever may change
    /// the link, or the directory it is in, chooses the policy.
    Symlink {
        /// What the link holds, as `readlink` shows it.
        target: String,
    },
    /// No `[[grant]]`: every call of every caller is refused. `tokens`
    /// identify callers that may then do nothing.
    DenyAll {
        /// How many `[[token]]` entries the file has.
        tokens: usize,
    },
}

impl fmt::Display for PolicyWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyWarning::WorldWritable { mode } => write!(
                f,
                "the policy file is world-writable (mode {mode:04o}): any local user can grant \
                 themselves every name; chmod o-w it"
            ),
            PolicyWarning::Symlink { target } => write!(
                f,
                "the policy path is a symbolic link (to {target:?}): whoever can change the link \
                 chooses the policy (expected where a Kubernetes ConfigMap mounts it)"
            ),
            PolicyWarning::DenyAll { tokens } => {
                write!(
                    f,
                    "the policy grants nothing: every call of every caller is refused (deny-all)"
                )?;
                if *tokens > 0 {
                    write!(f, "; its {tokens} token(s) identify callers that may do nothing")?;
                }
                Ok(())
            }
        }
    }
}

/// What is known of a policy file beyond its text: the permission bits
/// of the file read, and where the path links to when it is a symbolic
/// link.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileFacts {
    /// The permission bits of the file read (through any link).
    pub mode: Option<u32>,
    /// What the path links to, when it is a symbolic link.
    pub link_target: Option<String>,
}

impl FileFacts {
    /// The facts of the file at `path`, as far as they can be read (a
    /// fact that cannot be read is left out: the read of the policy
    /// itself is what fails loudly).
    pub fn of(path: &std::path::Path) -> FileFacts {
        use std::os::unix::fs::PermissionsExt as _;
        let link_target = std::fs::symlink_metadata(path)
            .ok()
            .filter(|m| m.file_type().is_symlink())
            .map(|_| match std::fs::read_link(path) {
                Ok(target) => target.display().to_string(),
                Err(_) => "?".to_owned(),
            });
        let mode = std::fs::metadata(path)
            .ok()
            .map(|m| m.permissions().mode() & 0o7777);
        FileFacts { mode, link_target }
    }
}

impl Policy {
    /// What is risky about this policy, read from a file with `facts`, in
    /// the order [`PolicyWarning`] lists them.
    pub fn warnings(&self, facts: &FileFacts) -> Vec<PolicyWarning> {
        let mut out = Vec::new();
        if let Some(mode) = facts.mode.filter(|m| m & 0o002 != 0) {
            out.push(PolicyWarning::WorldWritable { mode });
        }
        if let Some(target) = &facts.link_target {
            out.push(PolicyWarning::Symlink {
                target: target.clone(),
            });
        }
        if self.grants.is_empty() {
            out.push(PolicyWarning::DenyAll {
                tokens: self.tokens.len(),
            });
        }
        out
    }
}

/// One prefix an identity holds permissions on, and the grant it is from.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    permissions: u8,
    prefix: String,
    grant: usize,
    line: usize,
}

/// What one identity is granted (see [`Policy::grants_for`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants {
    entries: Vec<Entry>,
}

/// How much of a prefix (a `List` or `Watch`) an identity may read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every name under it.
    All,
    /// Only the names under these narrower prefixes: answers are filtered.
    Within(Vec<String>),
    /// None of it: refused.
    Denied,
}

impl Grants {
    /// Whether `permission` on `name` is granted.
    pub fn allows(&self, permission: Permission, name: &str) -> bool {
        self.why(permission, name).is_some()
    }

    /// The grant (number, line) that allows `permission` on `name`, if any.
    pub fn why(&self, permission: Permission, name: &str) -> Option<(usize, usize)> {
        let bit = permission.bit();
        self.entries
            .iter()
            .find(|e| e.permissions & bit != 0 && name.starts_with(e.prefix.as_str()))
            .map(|e| (e.grant, e.line))
    }

    /// How much under `prefix` may be had with `permission`: all of it
    /// (a grant's prefix covers it), the parts under narrower granted
    /// prefixes, or nothing.
    pub fn scope(&self, permission: Permission, prefix: &str) -> Scope {
        let bit = permission.bit();
        let held = self.entries.iter().filter(|e| e.permissions & bit != 0);
        if held.clone().any(|e| prefix.starts_with(e.prefix.as_str())) {
            return Scope::All;
        }
        let mut within: Vec<String> = held
            .filter(|e| e.prefix.starts_with(prefix))
            .map(|e| e.prefix.clone())
            .collect();
        within.sort();
        within.dedup();
        if within.is_empty() {
            Scope::Denied
        } else {
            Scope::Within(within)
        }
    }

    /// Each granted prefix with its permissions, merged over grants, in
    /// prefix order: what `server-info` shows a caller.
    pub fn summary(&self) -> Vec<(String, Vec<Permission>)> {
        let mut by_prefix: BTreeMap<&str, u8> = BTreeMap::new();
        for e in &self.entries {
            *by_prefix.entry(e.prefix.as_str()).or_default() |= e.permissions;
        }
        by_prefix
            .into_iter()
            .map(|(prefix, bits)| {
                let perms = Permission::ALL
                    .into_iter()
                    .filter(|p| bits & p.bit() != 0)
                    .collect();
                (prefix.to_owned(), perms)
            })
            .collect()
    }

    /// Whether the identity is granted nothing: every lease and read
    /// call of it is refused.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// `*` matches any run of characters (none included); everything else
/// itself.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// The attributes of an RFC 4514 subject (`CN=worker-1,O=acme`), as
/// (name, value) with escapes undone (`\,`, `\+`, `\2C`); `None` when it
/// is not one (a token's identity). Multi-valued RDNs (`+`) give one pair
/// each.
pub fn parse_subject(text: &str) -> Option<Vec<(String, String)>> {
    if !text.contains('=') {
        return None;
    }
    let mut out = Vec::new();
    let mut attr = String::new();
    let mut value: Vec<u8> = Vec::new();
    let mut in_value = false;
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut finish = |attr: &mut String, value: &mut Vec<u8>, in_value: &mut bool| -> Option<()> {
        if !*in_value || attr.trim().is_empty() {
            return None;
        }
        out.push((
            attr.trim().to_owned(),
            String::from_utf8(std::mem::take(value)).ok()?,
        ));
        attr.clear();
        *in_value = false;
        Some(())
    };
    while i < bytes.len() {
        let b = bytes[i];
        if !in_value {
            if b == b'=' {
                in_value = true;
            } else {
                attr.push(b as char);
            }
            i += 1;
            continue;
        }
        match b {
            b'\\' => {
                let next = *bytes.get(i + 1)?;
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(byte) if next.is_ascii_hexdigit() => {
                        value.push(byte);
                        i += 3;
                    }
                    _ => {
                        value.push(next);
                        i += 2;
                    }
                }
            }
            b',' | b'+' => {
                finish(&mut attr, &mut value, &mut in_value)?;
                i += 1;
            }
            _ => {
                value.push(b);
                i += 1;
            }
        }
    }
    finish(&mut attr, &mut value, &mut in_value)?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const THREE_TEAMS: &str = r#"
# Team A's scheduler holds and reads everything of team A.
[[grant]]
identity = "CN=scheduler,O=team-a"
prefixes = ["team-a/"]
permissions = ["lease", "read"]

# Team B's workers: leases on jobs, reads of all of team B.
[[grant]]
subject = { O = "team-b", CN = "worker-*" }
prefixes = ["team-b/jobs/"]
permissions = ["lease"]

[[grant]]
subject = { o = "team-b" }
prefixes = ["team-b/"]
permissions = ["read"]

# Team C's CI has no certificate: a token.
[[token]]
identity = "ci-c"
sha256 = "SHA"

[[grant]]
identity = "ci-c"
prefixes = ["team-c/deploy", "shared/"]
permissions = ["lease", "read"]
"#;

    fn three_teams() -> Policy {
        let sha = crate::hex::encode(&hash_token("s3cret-token"));
        Policy::parse(&THREE_TEAMS.replace("SHA", &sha)).unwrap()
    }

    #[test]
    fn grants_by_exact_identity_subject_pattern_and_token() {
        let p = three_teams();
        let a = p.grants_for("CN=scheduler,O=team-a");
        assert!(a.allows(Permission::Lease, "team-a/x"));
        assert!(a.allows(Permission::Read, "team-a/"));
        assert!(!a.allows(Permission::Lease, "team-b/jobs/1"));
        assert!(
            !a.allows(Permission::Lease, "team-a"),
            "a prefix is a byte prefix"
        );
        // Another subject in team A is no one special.
        assert!(p.grants_for("CN=scheduler2,O=team-a").is_empty());

        let w = p.grants_for("CN=worker-7,O=team-b");
        assert!(w.allows(Permission::Lease, "team-b/jobs/7"));
        assert!(!w.allows(Permission::Lease, "team-b/config"));
        assert!(w.allows(Permission::Read, "team-b/config"));
        assert_eq!(w.why(Permission::Read, "team-b/config"), Some((3, 14)));
        // Both attributes must match.
        let stranger = p.grants_for("CN=worker-7,O=team-x");
        assert!(!stranger.allows(Permission::Lease, "team-b/jobs/7"));
        // A repeated attribute matches only when every value does.
        let repeated = p.grants_for("CN=worker-9,O=team-x,O=team-b");
        assert!(!repeated.allows(Permission::Lease, "team-b/jobs/9"));
        assert!(!repeated.allows(Permission::Read, "team-b/jobs/9"));
        let two_cns = p.grants_for("CN=auditor,CN=worker-5,O=team-b");
        assert!(!two_cns.allows(Permission::Lease, "team-b/jobs/5"));
        let both_workers = p.grants_for("CN=worker-5,CN=worker-6,O=team-b");
        assert!(both_workers.allows(Permission::Lease, "team-b/jobs/5"));
        let reader = p.grants_for("CN=auditor,O=team-b");
        assert!(!reader.allows(Permission::Lease, "team-b/jobs/7"));
        assert!(reader.allows(Permission::Read, "team-b/jobs/7"));

        let who = p.token_identity(&hash_token("s3cret-token")).unwrap();
        assert_eq!(who, "ci-c");
        assert_eq!(p.token_identity(&hash_token("s3cret-tokeN")), None);
        let c = p.grants_for(who);
        assert!(c.allows(Permission::Lease, "team-c/deploy-prod"));
        assert!(!c.allows(Permission::Lease, "team-c/other"));
        assert!(c.allows(Permission::Read, "shared/x"));
        assert_eq!(
            c.summary(),
            vec![
                ("shared/".to_owned(), vec![Permission::Lease, Permission::Read]),
                (
                    "team-c/deploy".to_owned(),
                    vec![Permission::Lease, Permission::Read]
                ),
            ]
        );
    }

    #[test]
    fn list_and_watch_scopes() {
        let p = three_teams();
        let w = p.grants_for("CN=worker-7,O=team-b");
        assert_eq!(w.scope(Permission::Read, "team-b/jobs/"), Scope::All);
        assert_eq!(w.scope(Permission::Read, "team-b/"), Scope::All);
        assert_eq!(
            w.scope(Permission::Read, ""),
            Scope::Within(vec!["team-b/".to_owned()])
        );
        assert_eq!(w.scope(Permission::Read, "team-a/"), Scope::Denied);
        assert_eq!(
            w.scope(Permission::Lease, "team-b/"),
            Scope::Within(vec!["team-b/jobs/".to_owned()])
        );
        assert_eq!(Grants::default().scope(Permission::Read, ""), Scope::Denied);
    }

    #[test]
    fn errors_name_the_line_and_the_entry() {
        let cases = [
            (
                "[[grant]]\nidentity = \"a\"\nprefixes = [\"x/\"]\npermissions = [\"write\"]\n",
                "line 4",
                "unknown variant `write`",
            ),
            (
                "[[grant]]\nidentity = \"a\"\nprefixes = [\"x/\"]\npermissions = [\"read\"]\n\n\
                 [[grant]]\nprefixes = [\"x/\"]\npermissions = [\"read\"]\n",
                "(grant 2)",
                "names nobody",
            ),
            (
                "[[grant]]\nidentity = \"a\"\nsubject = { CN = \"a\" }\nprefixes = [\"x/\"]\npermissions = [\"read\"]\n",
                "line 1 (grant 1)",
                "both identity and subject",
            ),
            (
                "[[grant]]\nsubject = {}\nprefixes = [\"x/\"]\npermissions = [\"read\"]\n",
                "(grant 1)",
                "names no attribute",
            ),
            (
                "[[grant]]\nidentity = \"a\"\nprefixes = []\npermissions = [\"read\"]\n",
                "(grant 1)",
                "prefixes is empty",
            ),
            (
                "[[grant]]\nidentity = \"a\"\nprefixes = [\"x\u{202E}\"]\npermissions = [\"read\"]\n",
                "(grant 1)",
                "bidirectional override",
            ),
            (
                "[[grant]]\nidentity = \"a\"\nprefixes = [\"x/\"]\npermissions = [\"read\"]\ncolour = 1\n",
                "line 5",
                "unknown field `colour`",
            ),
            (
                "[[token]]\nidentity = \"bot\"\nsha256 = \"not-a-hash\"\n",
                "(token 1)",
                "not 64 hex digits",
            ),
            (
                "[[token]]\nidentity = \"CN=admin\"\nsha256 = \"00\"\n",
                "(token 1)",
                "may not look like a certificate subject",
            ),
            ("[[grant]\n", "line 1", ""),
        ];
        for (text, place, what) in cases {
            let e = Policy::parse(text).expect_err(text);
            let shown = e.to_string();
            assert!(shown.contains(place), "{shown:?} lacks {place:?}");
            assert!(shown.contains(what), "{shown:?} lacks {what:?}");
        }
        // The same hash twice.
        let h = crate::hex::encode(&hash_token("t"));
        let twice = format!(
            "[[token]]\nidentity = \"a\"\nsha256 = \"{h}\"\n[[token]]\nidentity = \"b\"\nsha256 = \"{h}\"\n"
        );
        let e = Policy::parse(&twice).unwrap_err().to_string();
        assert!(e.contains("line 4 (token 2)") && e.contains("token 1"), "{e}");
    }

    /// A prefix not in NFC could never start a name (names must be in
    /// NFC), so a policy holding one is refused rather than granting
    /// nothing without a word.
    #[test]
    fn a_prefix_not_in_nfc_is_refused() {
        let text = "[[grant]]\nidentity = \"a\"\nprefixes = [\"\u{212B}/\"]\npermissions = [\"lease\"]\n";
        let e = Policy::parse(text).unwrap_err().to_string();
        assert!(
            e.contains("line 1 (grant 1)")
                && e.contains("U+212B at character 0 is U+00C5 in NFC")
                && e.contains("no name could start with it"),
            "{e}"
        );
        assert!(Policy::parse(&text.replace('\u{212B}', "\u{C5}")).is_ok());
    }

    #[test]
    fn an_empty_policy_denies_everything() {
        let p = Policy::parse("# nobody yet\n").unwrap();
        assert!(p.grants_for("CN=anyone").is_empty());
        assert!(!p.grants_for("CN=anyone").allows(Permission::Read, ""));
    }

    /// A world-writable file, a symbolic link and a policy granting
    /// nothing are each said; a private file granting something is not.
    #[test]
    fn risky_policy_files_are_warned_of() {
        let empty = Policy::parse("# nobody yet\n").unwrap();
        let facts = FileFacts {
            mode: Some(0o666),
            link_target: Some("..data/acl.toml".into()),
        };
        let warned = empty.warnings(&facts);
        assert_eq!(
            warned,
            vec![
                PolicyWarning::WorldWritable { mode: 0o666 },
                PolicyWarning::Symlink {
                    target: "..data/acl.toml".into()
                },
                PolicyWarning::DenyAll { tokens: 0 },
            ]
        );
        let said: Vec<String> = warned.iter().map(ToString::to_string).collect();
        assert!(said[0].contains("world-writable (mode 0666)"), "{said:?}");
        assert!(
            said[1].contains("is a symbolic link (to \"..data/acl.toml\")"),
            "{said:?}"
        );
        assert!(
            said[2].contains("grants nothing") && said[2].contains("deny-all"),
            "{said:?}"
        );
        let tokens_only = format!(
            "[[token]]\nidentity = \"ci\"\nsha256 = \"{}\"\n",
            crate::hex::encode(&hash_token("t"))
        );
        let warned = Policy::parse(&tokens_only)
            .unwrap()
            .warnings(&FileFacts::default());
        assert_eq!(warned, vec![PolicyWarning::DenyAll { tokens: 1 }]);
        assert!(warned[0].to_string().contains("1 token(s)"));
        let private = FileFacts {
            mode: Some(0o664),
            link_target: None,
        };
        assert_eq!(three_teams().warnings(&private), vec![]);
    }

    /// The facts are read from the file system: the mode of the file the
    /// link leads to, and the link itself (modes set here, not EACCES:
    /// root ignores them).
    #[test]
    fn file_facts_are_read_through_the_link() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("policy.toml");
        std::fs::write(&file, "").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o602)).unwrap();
        let link = dir.path().join("acl.toml");
        std::os::unix::fs::symlink("policy.toml", &link).unwrap();
        assert_eq!(
            FileFacts::of(&link),
            FileFacts {
                mode: Some(0o602),
                link_target: Some("policy.toml".into())
            }
        );
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            FileFacts::of(&file),
            FileFacts {
                mode: Some(0o600),
                link_target: None
            }
        );
        assert_eq!(FileFacts::of(&dir.path().join("absent")), FileFacts::default());
    }

    #[test]
    fn subjects_are_read_as_rfc_4514() {
        assert_eq!(
            parse_subject("CN=worker\\, the first+UID=7,O=bagel tests").unwrap(),
            vec![
                ("CN".to_owned(), "worker, the first".to_owned()),
                ("UID".to_owned(), "7".to_owned()),
                ("O".to_owned(), "bagel tests".to_owned()),
            ]
        );
        assert_eq!(
            parse_subject("CN=a\\2Cb").unwrap(),
            vec![("CN".to_owned(), "a,b".to_owned())]
        );
        assert_eq!(parse_subject("ci-bot"), None);
        assert_eq!(parse_subject("CN=a,,"), None);
        // An escaped comma cannot smuggle a second attribute in.
        let p = Policy::parse(
            "[[grant]]\nsubject = { O = \"team-a\" }\nprefixes = [\"a/\"]\npermissions = [\"lease\"]\n",
        )
        .unwrap();
        assert!(
            !p.grants_for("CN=x\\,O=team-a,O=evil")
                .allows(Permission::Lease, "a/1")
        );
        assert!(p.grants_for("CN=x,O=team-a").allows(Permission::Lease, "a/1"));
    }

    #[test]
    fn globs() {
        for (p, t, want) in [
            ("*", "", true),
            ("worker-*", "worker-1", true),
            ("worker-*", "worker", false),
            ("*-prod", "db-prod", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbY", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ] {
            assert_eq!(glob(p, t), want, "{p:?} {t:?}");
        }
    }
}
