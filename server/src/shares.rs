//! Per-identity shares of the server's pooled slots: sessions, watchers,
//! waiting acquires and connections. Each pool has its global limit
//! (`--max-sessions`, `--max-watchers`, `--max-waiters`,
//! `--max-connections`) and, besides it, a share: the most of it one
//! identity may hold (`--max-*-per-identity`, by default a quarter of the
//! pool). A connection is the identity's whose call on it was identified
//! first (see `crate::transport::ConnState::identify`).
//!
//! Why a fixed share rather than one computed from who is active: slots
//! are held for as long as their client likes (an idle session, a watch,
//! a wait), and nothing takes one back. A share computed as the pool over
//! the identities active now would let the first identity take the whole
//! pool while it is alone, and the next one would then find nothing free:
//! the denial of service this is here to prevent. A fixed share keeps
//! room for the others by construction (with the default quarter, four
//! identities each at their share fill the pool). An operator with one
//! tenant sets the share to the pool.
//!
//! Who an identity is: under an access policy (`--acl`), the caller's
//! certificate subject or token identity, and a caller without one is
//! refused before it takes any slot (`UNAUTHENTICATED`, counted as the
//! policy counts every such refusal). With mutual TLS and no policy, the
//! certificate subject. Without either, every caller is the one anonymous
//! client: nothing tells callers apart (an address does not: everything
//! behind one NAT or proxy shares it, and `--max-connections-per-address`
//! already bounds one address), so it is alone and may use the whole
//! pool: shares are not counted for it.
//!
//! A refusal at the share is `RESOURCE_EXHAUSTED` naming the identity,
//! what it holds, the pool, its share and the flag. What each identity
//! holds, and its refusals, are on `/metrics` by identity: the first
//! [`METRIC_IDENTITIES`] identities that took a slot of a pool by name,
//! the rest together as `(other)`, so the label's cardinality is bounded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::error::Error;
use crate::service::Service;
use crate::transport::Caller;

/// Identities named in a pool's metrics; the rest are `(other)`.
pub const METRIC_IDENTITIES: usize = 64;

/// The label of the identities past [`METRIC_IDENTITIES`].
pub(crate) const OTHER: &str = "(other)";

/// One pool's per-identity share, and what each identity holds of it.
#[derive(Debug)]
pub struct Pool {
    /// The pool's metric label ("waiters").
    name: &'static str,
    /// What its slots are, in refusals ("waiting acquires"), and the unit
    /// of its share ("waiting acquires per identity").
    what: &'static str,
    unit: &'static str,
    /// The pool's global limit, and the flag of the share.
    size: usize,
    share: usize,
    flag: &'static str,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Slots held, by identity (an identity holding none is removed).
    held: HashMap<Arc<str>, usize>,
    labels: Labels,
}

/// Which identities a pool's metrics name, and the refusals at its share
/// by metric label: the bounded-cardinality rule every per-identity pool
/// shares (the shares here, the `List` page turns).
#[derive(Debug, Default)]
pub struct Labels {
    /// The identities named, in the order they were first seen (at most
    /// [`METRIC_IDENTITIES`]).
    named: Vec<Arc<str>>,
    /// Refusals, by metric label.
    refused: HashMap<Arc<str>, u64>,
}

impl Labels {
    /// Names `identity` in the metrics if it is not named and there is
    /// room.
    pub fn seen(&mut self, identity: &Arc<str>) {
        if !self.named.iter().any(|n| n == identity) && self.named.len() < METRIC_IDENTITIES {
            self.named.push(Arc::clone(identity));
        }
    }

    /// Counts a refusal of `identity` at its share.
    pub fn refused(&mut self, identity: &Arc<str>) {
        let label = self.label(identity);
        *self.refused.entry(label).or_default() += 1;
    }

    fn label(&self, identity: &Arc<str>) -> Arc<str> {
        match self.named.iter().find(|n| *n == identity) {
            Some(n) => Arc::clone(n),
            None => Arc::from(OTHER),
        }
    }

    /// What each identity holds (`held`, by identity) and was refused, by
    /// metric label: the named identities, each even at zero, then
    /// `(other)` if any.
    pub fn usage<'a>(&self, held: impl Iterator<Item = (&'a Arc<str>, u64)>) -> Vec<Usage> {
        let mut by_label: HashMap<Arc<str>, (u64, u64)> =
            self.named.iter().map(|n| (Arc::clone(n), (0, 0))).collect();
        for (identity, n) in held {
            by_label.entry(self.label(identity)).or_default().0 += n;
        }
        for (label, n) in &self.refused {
            by_label.entry(Arc::clone(label)).or_default().1 += n;
        }
        let mut out: Vec<Usage> = by_label
            .into_iter()
            .map(|(identity, (held, refused))| Usage {
                identity,
                held,
                refused,
            })
            .collect();
        out.sort();
        out
    }
}

/// One identity's use of one pool, for the metrics.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Usage {
    pub identity: Arc<str>,
    pub held: u64,
    pub refused: u64,
}

impl Pool {
    /// A pool of `size` slots of which one identity may hold `share`
    /// (set by `--{flag}`).
    pub fn new(
        [name, what, unit]: [&'static str; 3],
        size: usize,
        share: usize,
        flag: &'static str,
    ) -> Arc<Pool> {
        Arc::new(Pool {
            name,
            what,
            unit,
            size,
            share: share.max(1),
            flag,
            state: Mutex::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The pool's metric label ("sessions").
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Takes one of `identity`'s slots, or says it holds its share
    /// already. The anonymous client (`None`) is alone: it takes no share
    /// (only the pool's own limit bounds it).
    pub fn take(self: &Arc<Self>, identity: Option<&Arc<str>>) -> Result<Share, Error> {
        let Some(identity) = identity else {
            return Ok(Share(None));
        };
        let mut state = self.lock();
        state.labels.seen(identity);
        let held = state.held.get(identity).copied().unwrap_or(0);
        if held >= self.share {
            state.labels.refused(identity);
            return Err(Error::limit(
                format!(
                    "identity {} holds {held} of the {} {} of this server, its share",
                    crate::validate::echo(identity),
                    self.size,
                    self.what,
                ),
                self.share,
                self.unit,
                self.flag,
            ));
        }
        *state.held.entry(Arc::clone(identity)).or_default() += 1;
        Ok(Share(Some((Arc::clone(self), Arc::clone(identity)))))
    }

    fn give_back(&self, identity: &Arc<str>) {
        let mut state = self.lock();
        if let Some(n) = state.held.get_mut(identity) {
            *n -= 1;
            if *n == 0 {
                state.held.remove(identity);
            }
        }
    }

    /// What each identity holds and was refused, by metric label (the
    /// named identities, each even at zero, then `(other)` if any).
    pub fn usage(&self) -> Vec<Usage> {
        let state = self.lock();
        state
            .labels
            .usage(state.held.iter().map(|(identity, n)| (identity, *n as u64)))
    }
}

/// One slot of an identity's share, given back on drop (nothing for the
/// anonymous client).
#[derive(Debug)]
#[must_use = "the slot is given back when dropped"]
pub struct Share(Option<(Arc<Pool>, Arc<str>)>);

impl Drop for Share {
    fn drop(&mut self) {
        if let Some((pool, identity)) = &self.0 {
            pool.give_back(identity);
        }
    }
}

/// The pools with shares: one per pooled resource.
#[derive(Debug)]
pub struct Shares {
    pub sessions: Arc<Pool>,
    pub watchers: Arc<Pool>,
    pub waiters: Arc<Pool>,
    pub connections: Arc<Pool>,
}

impl Shares {
    /// The shares `cfg` sets.
    pub fn new(cfg: &crate::Config) -> Shares {
        let l = &cfg.limits;
        Shares {
            sessions: Pool::new(
                ["sessions", "sessions", "sessions per identity"],
                l.max_sessions,
                l.sessions_share(),
                "max-sessions-per-identity",
            ),
            watchers: Pool::new(
                ["watchers", "watchers", "watchers per identity"],
                cfg.watch.max_watchers,
                cfg.watch.watchers_share(),
                "max-watchers-per-identity",
            ),
            waiters: Pool::new(
                ["waiters", "waiting acquires", "waiting acquires per identity"],
                l.max_waiters,
                l.waiters_share(),
                "max-waiters-per-identity",
            ),
            connections: Pool::new(
                ["connections", "connections", "connections per identity"],
                l.max_connections,
                l.connections_share(),
                "max-connections-per-identity",
            ),
        }
    }

    pub fn all(&self) -> [&Arc<Pool>; 4] {
        [&self.sessions, &self.watchers, &self.waiters, &self.connections]
    }
}

/// Each identity's use of each pool, for `/metrics`: what it holds now
/// and its refusals at the share, labelled by pool and identity (the
/// first [`METRIC_IDENTITIES`] of each pool, then `(other)`). The
/// anonymous client has no share and no series. `others` are the pools
/// kept elsewhere (`List` calls queued for a page turn, bytes of unread
/// answers), by pool label.
pub(crate) fn encode_metrics(
    shares: &Shares,
    others: Vec<(&'static str, Vec<Usage>)>,
    e: &mut prometheus_client::encoding::DescriptorEncoder<'_>,
) -> std::fmt::Result {
    use prometheus_client::encoding::EncodeMetric as _;
    use prometheus_client::metrics::MetricType;
    use prometheus_client::metrics::counter::ConstCounter;
    use prometheus_client::metrics::gauge::ConstGauge;
    let mut usage: Vec<(&'static str, Vec<Usage>)> =
        shares.all().iter().map(|p| (p.name(), p.usage())).collect();
    usage.extend(others);
    let mut m = e.encode_descriptor(
        "bagel_share_held",
        "Sessions, watchers, waiting acquires, connections, List calls queued for a page turn, \
         and bytes of unread answers held now, by pool and identity ((other): past the first 64 identities \
         of the pool); each identity may hold its share (--max-*-per-identity, \
         --max-queued-lists-per-identity, --max-unread-answer-bytes-per-identity).",
        None,
        MetricType::Gauge,
    )?;
    for (pool, usage) in &usage {
        for u in usage {
            let labels = [("pool", *pool), ("identity", &*u.identity)];
            ConstGauge::new(i64::try_from(u.held).unwrap_or(i64::MAX)).encode(m.encode_family(&labels)?)?;
        }
    }
    let mut m = e.encode_descriptor(
        "bagel_share_refusals",
        "Sessions, watches, waiting acquires, connections, queued List calls and answers refused \
         because their identity held its share of the pool, by pool and identity ((other): past the \
         first 64 identities of the pool).",
        None,
        MetricType::Counter,
    )?;
    for (pool, usage) in &usage {
        for u in usage {
            let labels = [("pool", *pool), ("identity", &*u.identity)];
            ConstCounter::new(u.refused).encode(m.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// The share a `--max-*-per-identity` flag sets for a pool of `size`:
/// what it says, at most the pool (0: the whole pool, no share); unset, a
/// quarter of the pool (at least one slot).
pub fn share_of(flag: Option<usize>, size: usize) -> usize {
    match flag {
        Some(0) => size,
        Some(n) => n.min(size),
        None => size / 4,
    }
    .max(1)
}

impl Service {
    /// Who the caller's slots count against: its identity under the
    /// access policy (refused, and counted, when it has none: checked
    /// before any slot is taken), or with mutual TLS its certificate
    /// subject; `None` for the anonymous client of a server with neither.
    pub(crate) fn tenant(&self, caller: &Caller) -> Result<Option<Arc<str>>, Error> {
        let policy = self.inner.acl.is_some();
        if policy {
            // The policy's own check of who the caller is (as on every
            // call it checks): refuses and counts a caller without an
            // identity. No names: nothing else is judged.
            self.permit(caller, bagel_proto::acl::Permission::Lease, &[])?;
        }
        match self.identity(caller)? {
            Some(identity) => Ok(Some(identity)),
            // A policy reloaded between the two looks: refused all the same.
            None if policy => Err(Error::Unauthenticated {
                reason: "no identity the access policy knows: this server serves no anonymous caller",
            }),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SESSIONS: [&str; 3] = ["sessions", "sessions", "sessions per identity"];

    fn id(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    #[test]
    fn an_identity_holds_at_most_its_share_and_others_still_get_theirs() {
        let pool = Pool::new(SESSIONS, 8, 2, "max-sessions-per-identity");
        let (a, b) = (id("team-a"), id("team-b"));
        let held: Vec<Share> = (0..2).map(|_| pool.take(Some(&b)).unwrap()).collect();
        let e = pool.take(Some(&b)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        let m = e.to_string();
        for needle in [
            "identity \"team-b\" holds 2 of the 8 sessions",
            "its share",
            "2 sessions per identity",
            "--max-sessions-per-identity",
        ] {
            assert!(m.contains(needle), "{m:?} lacks {needle:?}");
        }
        let _a = pool.take(Some(&a)).unwrap();
        drop(held);
        let _b = pool.take(Some(&b)).unwrap();
        let usage = pool.usage();
        let of = |who: &str| {
            usage
                .iter()
                .find(|u| &*u.identity == who)
                .map(|u| (u.held, u.refused))
        };
        assert_eq!(of("team-a"), Some((1, 0)));
        assert_eq!(of("team-b"), Some((1, 1)));
    }

    #[test]
    fn the_anonymous_client_takes_no_share() {
        let pool = Pool::new(SESSIONS, 4, 1, "max-sessions-per-identity");
        let held: Vec<Share> = (0..10).map(|_| pool.take(None).unwrap()).collect();
        assert_eq!(held.len(), 10);
        assert!(pool.usage().is_empty());
    }

    #[test]
    fn identities_past_the_first_64_are_counted_as_other() {
        let pool = Pool::new(SESSIONS, 1000, 10, "max-sessions-per-identity");
        let held: Vec<Share> = (0..100)
            .map(|i| pool.take(Some(&id(&format!("t{i}")))).unwrap())
            .collect();
        let usage = pool.usage();
        assert_eq!(usage.len(), METRIC_IDENTITIES + 1);
        let other = usage.iter().find(|u| &*u.identity == OTHER).unwrap();
        assert_eq!(other.held, 100 - METRIC_IDENTITIES as u64);
        drop(held);
        assert!(pool.usage().iter().all(|u| u.held == 0));
    }

    #[test]
    fn a_share_flag_is_at_most_the_pool_and_by_default_a_quarter() {
        assert_eq!(share_of(None, 1024), 256);
        assert_eq!(share_of(None, 2), 1);
        assert_eq!(share_of(Some(5000), 1024), 1024);
        assert_eq!(share_of(Some(0), 1024), 1024);
        assert_eq!(share_of(Some(10), 1024), 10);
    }
}
