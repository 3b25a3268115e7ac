//! The access policy (`--acl FILE`) as the server applies it: who the
//! caller is, whether it may lease or read each name it names, and the
//! file reloaded on SIGHUP and when it changes.
//!
//! The rules themselves are `bagel_proto::acl`'s (pure, shared with
//! `bagel acl check`); this module holds the policy in effect, swaps it
//! atomically on reload (a call sees the old policy or the new, whole),
//! resolves each identity's grants once per policy version, and counts
//! refusals by identity and permission.
//!
//! Identity: with mutual TLS the client certificate's subject (as
//! before); without, the identity of the bearer token the request
//! carries in `authorization: Bearer <token>`, which the policy stores as
//! a SHA-256. The token itself goes no further than [`bearer`], which
//! hashes it: it is in no log line, error or metric.
//!
//! Without a policy nothing here refuses anything: clients are anonymous,
//! and the server says so when it starts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use bagel_proto::acl::{FileFacts, Grants, Permission, Policy, PolicyWarning, Scope};
use bagel_proto::pb;
use dashmap::DashMap;

mod failures;

use crate::error::Error;
use crate::reload::{SIGHUP, Stamp};
use crate::service::Service;
use crate::transport::Caller;

/// The SHA-256 of the bearer token a request carried (or that its
/// `authorization` value was not a bearer token). Never the token.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Bearer {
    Token([u8; 32]),
    Malformed,
}

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not even the hash: a log line has no use for it.
        match self {
            Bearer::Token(_) => f.write_str("Bearer(..)"),
            Bearer::Malformed => f.write_str("Bearer(malformed)"),
        }
    }
}

/// The request's bearer token, hashed, if it has an `authorization`
/// value.
pub fn bearer(metadata: &tonic::metadata::MetadataMap) -> Option<Bearer> {
    let value = metadata.get("authorization")?;
    let Some(token) = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|t| !t.is_empty())
    else {
        return Some(Bearer::Malformed);
    };
    Some(Bearer::Token(bagel_proto::acl::hash_token(token)))
}

/// A policy in effect, its version, and the grants of each identity seen
/// under it (dropped with it on reload).
#[derive(Debug)]
struct Loaded {
    policy: Policy,
    version: u64,
    resolved: DashMap<Arc<str>, Arc<Grants>>,
}

/// Identities whose grants are kept resolved at once; past it the memo
/// starts again (a CA may sign any number of subjects).
const RESOLVED_MAX: usize = 4096;

/// Distinct identities counted in the refusal metric; the rest are
/// counted as `(other)`, so the label's cardinality stays bounded.
const METRIC_IDENTITIES: usize = 64;

impl Loaded {
    fn grants(&self, identity: &Arc<str>) -> Arc<Grants> {
        if let Some(g) = self.resolved.get(identity) {
            return Arc::clone(&g);
        }
        let grants = Arc::new(self.policy.grants_for(identity));
        if self.resolved.len() >= RESOLVED_MAX {
            self.resolved.clear();
        }
        self.resolved.insert(Arc::clone(identity), Arc::clone(&grants));
        grants
    }
}

/// The server's access policy: the file, the policy in effect, and what
/// its refusals and reloads counted.
#[derive(Debug)]
pub struct Acl {
    path: PathBuf,
    current: RwLock<Arc<Loaded>>,
    /// What the file looked like when last read (see [`Stamp`]).
    seen: Mutex<Option<Stamp>>,
    /// The warnings last logged (a reload of the same policy repeats them
    /// only when they changed).
    warned: Mutex<Vec<PolicyWarning>>,
    refusals: Mutex<HashMap<(Arc<str>, Permission), u64>>,
    /// Callers refused for having no identity, by `Unauthenticated`.
    unauthenticated: [AtomicU64; 4],
    /// Failed bearer tokens by address: past a budget, an address's
    /// token checks are refused for a while (see [`failures`]).
    failures: Mutex<failures::Failures>,
    reload_failures: AtomicU64,
}

/// Why a policy file could not be used: unreadable, or refused by the
/// parser (which names the line and the grant).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read the access policy {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("access policy {path}: {source}")]
    Parse {
        path: String,
        #[source]
        source: bagel_proto::acl::PolicyError,
    },
}

fn read_policy(path: &Path) -> Result<Policy, LoadError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: shown.clone(),
        source,
    })?;
    Policy::parse(&text).map_err(|source| LoadError::Parse { path: shown, source })
}

/// Logs each of `warnings` (a world-writable, linked or deny-all policy)
/// at WARN: the policy is taken, but the operator must hear of it.
fn log_warnings(path: &Path, warnings: &[PolicyWarning]) {
    for warning in warnings {
        tracing::warn!(path = %path.display(), "{warning}");
    }
}

impl Acl {
    /// Reads and parses the policy at `path`: the server does not start
    /// with a policy it cannot read.
    pub fn load(path: &Path) -> Result<Acl, LoadError> {
        let stamp = Stamp::of(path);
        let policy = read_policy(path)?;
        let warnings = policy.warnings(&FileFacts::of(path));
        log_warnings(path, &warnings);
        tracing::info!(
            path = %path.display(),
            grants = policy.grant_count(),
            tokens = policy.token_count(),
            sha256 = %policy.sha256_hex(),
            "access policy in effect (version 1): callers are identified by client certificate \
             or bearer token, and may do only what it grants"
        );
        Ok(Acl {
            path: path.to_owned(),
            current: RwLock::new(Arc::new(Loaded {
                policy,
                version: 1,
                resolved: DashMap::new(),
            })),
            seen: Mutex::new(stamp),
            warned: Mutex::new(warnings),
            refusals: Mutex::new(HashMap::new()),
            unauthenticated: Default::default(),
            failures: Mutex::new(failures::Failures::default()),
            reload_failures: AtomicU64::new(0),
        })
    }

    fn loaded(&self) -> Arc<Loaded> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Reads the file again and puts it in effect if it parses and differs
    /// from the policy in effect; otherwise the policy in effect stays and
    /// the log says why. `why` is what prompted it (for the log line).
    /// The warnings of a policy put in effect are logged before it (and
    /// those of the same policy when they changed).
    fn reload_policy(&self, why: &str) {
        let old = self.loaded();
        // A truncated file parses as a policy granting nothing: one read
        // while it was written is not put in effect.
        let Some((read, stamp)) = crate::reload::read_whole(&self.path, "access policy", why, read_policy)
        else {
            return;
        };
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner) = stamp;
        match read {
            Ok(policy) => {
                let warnings = policy.warnings(&FileFacts::of(&self.path));
                {
                    let mut warned = self.warned.lock().unwrap_or_else(PoisonError::into_inner);
                    if policy != old.policy || *warned != warnings {
                        log_warnings(&self.path, &warnings);
                        *warned = warnings;
                    }
                }
                if policy == old.policy {
                    // An operator who sent SIGHUP hears that it was read.
                    if why == SIGHUP {
                        tracing::info!(
                            path = %self.path.display(),
                            version = old.version,
                            "access policy read again on SIGHUP: unchanged, the policy in effect stays"
                        );
                    }
                    return;
                }
                let version = old.version + 1;
                tracing::info!(
                    path = %self.path.display(),
                    version,
                    grants = policy.grant_count(),
                    tokens = policy.token_count(),
                    sha256 = %policy.sha256_hex(),
                    why,
                    "access policy reloaded: new calls are checked against it; leases held stay"
                );
                let new = Arc::new(Loaded {
                    policy,
                    version,
                    resolved: DashMap::new(),
                });
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = new;
            }
            Err(e) => {
                self.reload_failures.fetch_add(1, Relaxed);
                tracing::warn!(
                    error = %e,
                    version = old.version,
                    why,
                    "access policy not reloaded: kept the policy in effect"
                );
            }
        }
    }

    /// Whether the file is another, or changed, since it was last read
    /// (see [`Stamp`]), and its stamp now.
    fn file_look(&self) -> crate::reload::Look {
        crate::reload::Look::at(
            &self.path,
            *self.seen.lock().unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// Refuses a token check from `peer` while it is past its budget of
    /// failed tokens.
    fn check_failures(&self, peer: Option<std::net::IpAddr>) -> Result<(), Error> {
        let failures = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        failures
            .check(peer, std::time::Instant::now())
            .map_err(|blocked| Error::TokenGuessing {
                peer: peer.map_or_else(|| "(no address)".to_owned(), |p| p.to_string()),
                failures: blocked.failures,
                window: failures::WINDOW,
                retry_after: blocked.retry_after,
            })
    }

    /// Counts a failed token from `peer`, and says so in the log when it
    /// takes the address past its budget (once per window).
    fn record_failure(&self, peer: Option<std::net::IpAddr>) {
        let recorded = self
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(peer, std::time::Instant::now());
        if recorded == failures::Recorded::NowBlocked {
            tracing::warn!(
                peer = %peer.map_or_else(|| "(no address)".to_owned(), |p| p.to_string()),
                failures = failures::BUDGET,
                window_s = failures::WINDOW.as_secs(),
                "bearer tokens refused from this address for the rest of the window: it sent \
                 {} that the access policy does not know (guessing?)",
                failures::BUDGET
            );
        }
    }

    fn count_unauthenticated(&self, why: Unauthenticated) {
        self.unauthenticated[why as usize].fetch_add(1, Relaxed);
    }

    fn count_refusal(&self, identity: &str, permission: Permission) {
        let mut counts = self.refusals.lock().unwrap_or_else(PoisonError::into_inner);
        let known = counts.keys().any(|(i, _)| &**i == identity);
        let distinct = || {
            let mut ids: Vec<&Arc<str>> = counts.keys().map(|(i, _)| i).collect();
            ids.sort();
            ids.dedup();
            ids.len()
        };
        let label: Arc<str> = if known || distinct() < METRIC_IDENTITIES {
            Arc::from(identity)
        } else {
            Arc::from("(other)")
        };
        *counts.entry((label, permission)).or_default() += 1;
    }

    /// Refusals so far, by identity and permission (for `/metrics`).
    pub fn refusal_counts(&self) -> Vec<(Arc<str>, Permission, u64)> {
        let counts = self.refusals.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<_> = counts.iter().map(|((i, p), n)| (Arc::clone(i), *p, *n)).collect();
        out.sort();
        out
    }
}

impl crate::reload::Reloadable for Acl {
    fn look(&self) -> crate::reload::Look {
        self.file_look()
    }

    fn reload(&self, why: &str) {
        self.reload_policy(why);
    }
}

/// The policy's numbers for `/metrics`: refusals by identity (at most
/// [`METRIC_IDENTITIES`] of them, then `(other)`) and permission, the
/// version in effect, and reloads that kept the old policy.
pub(crate) fn encode_metrics(
    acl: &Acl,
    e: &mut prometheus_client::encoding::DescriptorEncoder<'_>,
) -> std::fmt::Result {
    use prometheus_client::encoding::EncodeMetric as _;
    use prometheus_client::metrics::MetricType;
    use prometheus_client::metrics::counter::ConstCounter;
    use prometheus_client::metrics::gauge::ConstGauge;
    let mut m = e.encode_descriptor(
        "bagel_acl_refusals",
        "Calls and operations the access policy refused, by the caller's identity ((other): past \
         the 64 identities counted) and the permission it lacked.",
        None,
        MetricType::Counter,
    )?;
    for (identity, permission, n) in acl.refusal_counts() {
        let labels = [("identity", &*identity), ("permission", permission.name())];
        ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
    }
    let mut m = e.encode_descriptor(
        "bagel_acl_unauthenticated",
        "Calls and operations refused for want of an identity the access policy knows, by why: \
         no certificate nor token, a token it does not know, an authorization value that is no \
         bearer token, a token not looked at because its address sent too many of those.",
        None,
        MetricType::Counter,
    )?;
    for why in Unauthenticated::ALL {
        let n = acl.unauthenticated[why as usize].load(Relaxed);
        ConstCounter::new(n).encode(m.encode_family(&[("reason", why.label())])?)?;
    }
    ConstGauge::new(i64::try_from(acl.loaded().version).unwrap_or(i64::MAX)).encode(e.encode_descriptor(
        "bagel_acl_policy_version",
        "Loads of the access policy that took effect since start (1: the one read at start).",
        None,
        MetricType::Gauge,
    )?)?;
    ConstCounter::new(acl.reload_failures.load(Relaxed)).encode(e.encode_descriptor(
        "bagel_acl_reload_failures",
        "Reloads of the access policy that kept the policy in effect (the file did not read or parse).",
        None,
        MetricType::Counter,
    )?)
}

/// The server's policy from `path`, or `None` (anonymous access) without
/// one; either way the log says which, once, at start.
pub fn start(path: Option<&Path>) -> Result<Option<Arc<Acl>>, Error> {
    let Some(path) = path else {
        tracing::info!(
            "no access policy (--acl): callers are anonymous and any client may acquire, hold, \
             list and watch any name"
        );
        return Ok(None);
    };
    Acl::load(path)
        .map(|acl| Some(Arc::new(acl)))
        .map_err(|e| Error::invalid("acl", e.to_string()))
}

/// Why a caller has no identity under the policy (a label of
/// `bagel_acl_unauthenticated`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unauthenticated {
    NoIdentity,
    UnknownToken,
    Malformed,
    /// A token check refused unread: its address failed too many.
    TooManyFailures,
}

impl Unauthenticated {
    const ALL: [Unauthenticated; 4] = [
        Unauthenticated::NoIdentity,
        Unauthenticated::UnknownToken,
        Unauthenticated::Malformed,
        Unauthenticated::TooManyFailures,
    ];

    fn label(self) -> &'static str {
        match self {
            Unauthenticated::NoIdentity => "no_identity",
            Unauthenticated::UnknownToken => "unknown_token",
            Unauthenticated::Malformed => "malformed_authorization",
            Unauthenticated::TooManyFailures => "too_many_failures",
        }
    }
}

/// The identity of the caller's bearer token under `acl`'s policy, or
/// why it has none. A token that fails counts against the caller's
/// address; past its budget, the address's tokens are not looked at
/// until its window ends (see [`failures`]).
fn token_identity_of(acl: &Acl, caller: &Caller) -> Result<Option<Arc<str>>, (Unauthenticated, Error)> {
    let Some(bearer) = caller.bearer else {
        return Ok(None);
    };
    acl.check_failures(caller.peer)
        .map_err(|e| (Unauthenticated::TooManyFailures, e))?;
    let refused = match bearer {
        Bearer::Malformed => (
            Unauthenticated::Malformed,
            Error::Unauthenticated {
                reason: "the authorization value is not \"Bearer <token>\"",
            },
        ),
        Bearer::Token(digest) => match acl.loaded().policy.token_identity(&digest) {
            Some(identity) => return Ok(Some(Arc::from(identity))),
            None => (
                Unauthenticated::UnknownToken,
                Error::Unauthenticated {
                    reason: "the bearer token is not one the access policy knows",
                },
            ),
        },
    };
    acl.record_failure(caller.peer);
    Err(refused)
}

/// The policy a call is checked against, and the caller's identity.
type Checked = (Arc<Loaded>, Arc<str>);

/// The part of a name or prefix a refusal quotes: cut as names are
/// quoted in every other error.
fn quoted(name: &str) -> String {
    bagel_proto::names::echo(name)
}

impl Service {
    /// The policy in effect and the caller's identity under it; `None`
    /// without a policy (nothing is checked).
    fn access(&self, caller: &Caller) -> Result<Option<Checked>, Error> {
        let Some(acl) = self.inner.acl.as_deref() else {
            return Ok(None);
        };
        let identity = match self.identity(caller) {
            Ok(Some(identity)) => identity,
            Ok(None) => {
                acl.count_unauthenticated(Unauthenticated::NoIdentity);
                return Err(Error::Unauthenticated {
                    reason: if self.inner.client_auth() {
                        "this server identifies callers by client certificate"
                    } else {
                        "no bearer token (authorization: Bearer <token>): this server has an \
                         access policy and serves no anonymous caller"
                    },
                });
            }
            // Counted where the token was refused (`token_identity`).
            Err(e) => return Err(e),
        };
        Ok(Some((acl.loaded(), identity)))
    }

    fn denied(&self, identity: Arc<str>, permission: Permission, on: &'static str, name: &str) -> Error {
        if let Some(acl) = self.inner.acl.as_deref() {
            acl.count_refusal(&identity, permission);
        }
        Error::PermissionDenied {
            identity,
            permission: permission.name(),
            on,
            name: quoted(name),
        }
    }

    /// Without mutual TLS, the identity of the caller's bearer token under
    /// the policy (`None` without a policy or a token); a token the policy
    /// does not know, or an `authorization` value that is no bearer
    /// token, is refused.
    /// Each refusal is counted (`bagel_acl_unauthenticated`).
    pub(crate) fn token_identity(&self, caller: &Caller) -> Result<Option<Arc<str>>, Error> {
        let Some(acl) = self.inner.acl.as_deref() else {
            return Ok(None);
        };
        token_identity_of(acl, caller).map_err(|(why, e)| {
            acl.count_unauthenticated(why);
            e
        })
    }

    /// Refuses the call unless the caller has `permission` on every one
    /// of `names` (a multi-name acquire needs `lease` on each).
    pub(crate) fn permit(
        &self,
        caller: &Caller,
        permission: Permission,
        names: &[Arc<str>],
    ) -> Result<(), Error> {
        let Some((loaded, identity)) = self.access(caller)? else {
            return Ok(());
        };
        let grants = loaded.grants(&identity);
        match names.iter().find(|n| !grants.allows(permission, n)) {
            Some(name) => Err(self.denied(identity, permission, "name", name)),
            None => Ok(()),
        }
    }

    /// Refuses a renewal, upgrade or release unless the caller has `lease`
    /// on every name of the lease (a lease no longer held falls through to
    /// the operation, which says why). Runs before anything else is said
    /// of the lease (whose it is, whether its token matches).
    pub(crate) fn permit_lease(&self, caller: &Caller, lease: crate::table::LeaseId) -> Result<(), Error> {
        let permission = Permission::Lease;
        let Some((loaded, identity)) = self.access(caller)? else {
            return Ok(());
        };
        let grants = loaded.grants(&identity);
        let refused = self.inner.table.refuse_lease_name(lease, |name| {
            (!grants.allows(permission, name)).then(|| name.to_owned())
        });
        let Some(name) = refused else {
            return Ok(());
        };
        // The refused name is said only to the identity the lease was
        // granted to: anyone else learns nothing of another's lease, not
        // even which name its id holds.
        if self
            .inner
            .table
            .lease_owner(lease)
            .is_some_and(|owner| owner == identity)
        {
            Err(self.denied(identity, permission, "name", &name))
        } else {
            Err(self.denied(identity, permission, "lease", &lease.to_string()))
        }
    }

    /// What of `prefix` the caller may read (a `List` or prefix `Watch`):
    /// all of it, only narrower granted prefixes (the answer is then
    /// filtered), or nothing (refused: a prefix it may not read is never
    /// answered with an empty list that would look like nothing held).
    pub(crate) fn read_scope(&self, caller: &Caller, prefix: &str) -> Result<Scope, Error> {
        let permission = Permission::Read;
        let Some((loaded, identity)) = self.access(caller)? else {
            return Ok(Scope::All);
        };
        match loaded.grants(&identity).scope(permission, prefix) {
            Scope::Denied => Err(self.denied(identity, permission, "prefix", prefix)),
            scope => Ok(scope),
        }
    }

    /// The policy and the caller under it, for `ServerInfo`; `None`
    /// without a policy.
    pub(crate) fn access_info(&self, caller: &Caller) -> Option<pb::AccessInfo> {
        let acl = self.inner.acl.as_deref()?;
        let loaded = acl.loaded();
        let mut info = pb::AccessInfo {
            policy_version: loaded.version,
            policy_sha256: loaded.policy.sha256_hex(),
            ..Default::default()
        };
        // A token is checked as for any call, and a failed one counted
        // (ServerInfo is no way to test guesses for free); a caller with
        // no identity is no refused call, so that is not counted.
        let identity = if self.inner.client_auth() {
            self.identity(caller)
        } else {
            self.token_identity(caller)
        };
        match identity {
            Ok(Some(identity)) => {
                info.grants = loaded
                    .grants(&identity)
                    .summary()
                    .into_iter()
                    .map(|(prefix, perms)| pb::AccessGrant {
                        prefix,
                        permissions: perms.iter().map(|p| p.name().to_owned()).collect(),
                    })
                    .collect();
                info.identity = identity.to_string();
            }
            Ok(None) => info.identity_problem = "no client certificate nor bearer token".to_owned(),
            Err(e) => info.identity_problem = crate::error::bounded(e.to_string()),
        }
        Some(info)
    }
}

/// One `List` page of the names under `prefix` the caller may read. With
/// [`Scope::Within`] the granted prefixes under it are listed one after
/// another, each with the table's own paging, so every name and every
/// page token is one the caller may read (a token taken from an unfiltered
/// page would be the last name scanned: possibly one it may not read). A
/// page may end early at a prefix's end; its token then resumes there.
pub(crate) fn list_scoped(
    inner: &crate::service::Inner,
    scope: &Scope,
    prefix: &str,
    after: &str,
    page_size: usize,
) -> pb::ListResponse {
    let Scope::Within(within) = scope else {
        return inner.list_page(prefix, after, page_size);
    };
    // A prefix under another granted one would list its names twice.
    let roots = within
        .iter()
        .filter(|w| !within.iter().any(|o| o != *w && w.starts_with(o.as_str())));
    let limit = if page_size == 0 { 100 } else { page_size }.min(inner.cfg.list_max_page);
    let mut out = pb::ListResponse {
        max_page_size: inner.cfg.list_max_page as u32,
        ..Default::default()
    };
    for root in roots {
        // Every name under `root` sorts before `after` when `root` does
        // and is not a prefix of it: skip it.
        let from = if after.starts_with(root.as_str()) {
            after
        } else if !after.is_empty() && root.as_str() < after {
            continue;
        } else {
            ""
        };
        let page = inner.list_page(root, from, limit - out.names.len());
        out.max_page_size = page.max_page_size;
        out.names.extend(page.names);
        if out.names.len() >= limit {
            break;
        }
    }
    if out.names.len() >= limit
        && let Some(last) = out.names.last()
    {
        out.next_page_token = last.name.clone();
    }
    out
}

/// A watch's events, less those on names the scope does not let the
/// caller read (progress messages pass: they carry only a revision).
pub(crate) fn scoped<S, E>(
    events: S,
    scope: Scope,
) -> impl tokio_stream::Stream<Item = Result<pb::WatchEvent, E>>
where
    S: tokio_stream::Stream<Item = Result<pb::WatchEvent, E>>,
{
    use tokio_stream::StreamExt as _;
    events.filter(move |e| match (&scope, e) {
        (Scope::Within(prefixes), Ok(ev)) if !ev.name.is_empty() => {
            prefixes.iter().any(|p| ev.name.starts_with(p.as_str()))
        }
        _ => true,
    })
}
