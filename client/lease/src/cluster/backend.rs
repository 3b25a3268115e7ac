//! The lease protocol over a [`Cluster`]'s members, as [`LeaseBackend`]:
//! the tentative-then-upgrade acquire and its unwinding, and renew,
//! upgrade and release run on every part of a lease, with the helpers that
//! reach each part and fold the parts' answers into one.
//!
//! Separate from routing (`super`) and start-up (`members`): this is what a
//! lease handle calls, once routing has said which servers a name needs.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bagel_proto::clock::Clock;
use bagel_proto::{KeyRing, Micros};
use futures::future::join_all;

use super::members::{check_identity, witnessed_server_id};
use super::parts::{self, Part};
use super::{Cluster, List};
use crate::backend::{
    AcquireSpec, BackendInfo, Call, LeaseBackend, Listed, ListedAt, Listing, NameRoute, Offer,
};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::types::{Grant, History, LeaseRef, Metadata, Mode, NameState, ReleaseOptions, Renewal};

#[async_trait]
impl LeaseBackend for Cluster {
    /// None: each part of a grant names its own server.
    fn single_location(&self) -> Option<String> {
        None
    }

    fn describe_self(&self) -> String {
        format!("the lease servers {}", self.location())
    }

    /// Lists over every server; watches only on one server at a time.
    fn offers(&self, call: Call) -> Offer {
        match call {
            Call::List => Offer::Yes,
            Call::Watch => Offer::EachServer {
                why: "revisions are per server".into(),
            },
        }
    }

    /// Asks each server (by member id) for up to `limit` names and merges
    /// them in name order, each saying its server: each name lives on one
    /// server, but during a migration both owners may list it. The first
    /// server that fails fails it, naming the server.
    async fn list_names(&self, prefix: &str, limit: usize) -> Result<Listing> {
        let mut all = Listing::default();
        for (url, member_id) in self.servers() {
            let one = async { self.client_of(&member_id).await?.list_names(prefix, limit).await }
                .await
                .map_err(|e| e.at_server(&url))?;
            let here = || Some(url.clone());
            all.names
                .extend(one.names.into_iter().map(|n| Listed { server: here(), ..n }));
            all.revisions.extend(
                one.revisions
                    .into_iter()
                    .map(|r| ListedAt { server: here(), ..r }),
            );
        }
        all.names
            .sort_by(|a, b| (a.name.name.cmp(&b.name.name)).then_with(|| a.server.cmp(&b.server)));
        all.names.truncate(limit);
        Ok(all)
    }

    fn route_name(&self, name: &str) -> Result<NameRoute> {
        Ok(NameRoute::Servers(self.route(name)))
    }

    async fn describe(&self, names: &[String]) -> Result<Vec<NameState>> {
        Cluster::describe(self, names.iter().cloned()).await
    }

    async fn history(&self, name: &str) -> Result<History> {
        Cluster::history(self, name).await
    }

    async fn trusted_keys(&self) -> Result<KeyRing> {
        Ok(self.keys())
    }

    /// Each server's info, asked one after another; the first that fails
    /// fails it, naming the server.
    async fn info(&self) -> Result<BackendInfo> {
        let mut infos = Vec::new();
        for (url, member_id) in self.servers() {
            let info = async { self.client_of(&member_id).await?.server_info().await }
                .await
                .map_err(|e| e.at_server(&url))?;
            infos.push((url, info));
        }
        Ok(BackendInfo::Servers(infos))
    }

    fn location(&self) -> String {
        let urls = |list: &List| {
            list.ids
                .iter()
                .map(|id| self.inner.members[id].url.as_str())
                .collect::<Vec<_>>()
                .join(",")
        };
        match &self.inner.next {
            None => urls(&self.inner.current),
            Some(next) => format!("{} -> {}", urls(&self.inner.current), urls(next)),
        }
    }

    fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.inner.clock)
    }

    /// The smallest max TTL of the servers reached so far (10 s before
    /// any is).
    fn max_ttl(&self) -> Duration {
        self.inner
            .members
            .values()
            .filter_map(|m| m.client.get().map(Client::max_ttl))
            .min()
            .unwrap_or(Duration::from_secs(10))
    }

    /// The smallest max wait of the servers reached so far (unknown
    /// before any is).
    fn max_wait(&self) -> Option<Duration> {
        self.inner
            .members
            .values()
            .filter_map(|m| m.client.get().and_then(LeaseBackend::max_wait))
            .min()
    }

    async fn acquire_lease(&self, spec: AcquireSpec) -> Result<Grant> {
        // No server would be asked: refused here as each server refuses it.
        if spec.names.is_empty() {
            return Err(Error::invalid("names", "at least one name is required"));
        }
        let plan = self.plan(&spec.names);
        let single = plan.len() == 1;
        let mut taken: Vec<(String, String, Grant)> = Vec::with_capacity(plan.len());
        // One server at a time, in member-id order: tentatively when there are
        // several, so that holding some parts never breaks anyone's writes.
        for (member_id, names) in &plan {
            let m = self.member(member_id)?;
            let part = AcquireSpec {
                names: names.clone(),
                mode: if single { spec.mode } else { Mode::Tentative },
                ..spec.clone()
            };
            let got = async { m.client().await?.acquire_lease(part).await }.await;
            match got {
                Ok(g) => {
                    // The member may have restarted under another identity
                    // since this client connected (a new key file, another
                    // --server-id): its names are no longer where this
                    // client routes them.
                    let witnessed = witnessed_server_id(&g);
                    taken.push(((*member_id).to_owned(), m.url.clone(), g));
                    if let Some(announced) = witnessed
                        && let Err(e) = check_identity(&m.identity, &m.url, &announced)
                    {
                        self.abandon(&taken).await;
                        return Err(e.at_server(&m.url));
                    }
                }
                Err(e) => {
                    self.abandon(&taken).await;
                    return Err(e.at_server(&m.url));
                }
            }
        }
        if !single && spec.mode == Mode::Full {
            let upgraded = join_all(taken.iter().map(|(member_id, url, g)| async move {
                let client = self.member(member_id)?.client().await?;
                client
                    .upgrade_lease(&g.lease_ref())
                    .await
                    .map_err(|e| e.at_server(url))
            }))
            .await;
            let mut failed = None;
            for ((_, url, g), u) in taken.iter_mut().zip(upgraded) {
                match u {
                    Ok(full) => *g = full,
                    // A full acquire broke the tentative part meanwhile:
                    // the names are busy, as if refused at the start.
                    Err(Error::NotHeld { message, .. }) => {
                        failed = failed.or(Some(Error::Busy {
                            message: format!(
                                "{message}: a name of lease {} was taken while it was held tentatively \
                                 (before the upgrade on {url})",
                                g.lease_id
                            ),
                            conflict: None,
                        }));
                    }
                    Err(e) => failed = failed.or(Some(e)),
                }
            }
            if let Some(e) = failed {
                self.abandon(&taken).await;
                return Err(e);
            }
        }
        Ok(parts::combine_grants(&spec.names, &taken))
    }

    async fn renew_lease(
        &self,
        lease: &LeaseRef,
        deadline: Micros,
        metadata: Option<Metadata>,
    ) -> Result<Renewal> {
        let renewals = self
            .each_part(lease, |client, part| {
                let metadata = metadata.clone();
                async move { client.renew_lease(&part.lease, deadline, metadata).await }
            })
            .await?;
        Ok(parts::combine_renewals(renewals))
    }

    /// Each part's server counts `ttl` from its own clock.
    async fn renew_lease_ttl(
        &self,
        lease: &LeaseRef,
        ttl: Duration,
        metadata: Option<Metadata>,
    ) -> Result<Renewal> {
        let renewals = self
            .each_part(lease, |client, part| {
                let metadata = metadata.clone();
                async move { client.renew_lease_ttl(&part.lease, ttl, metadata).await }
            })
            .await?;
        Ok(parts::combine_renewals(renewals))
    }

    /// Upgrades every part. A part refused (a full acquire broke it while
    /// it was tentative) makes the whole lease unusable: every other part,
    /// upgraded or not, is released before the refusal is returned, so a
    /// failed upgrade never leaves names held full (or reserved) on the
    /// servers that did upgrade until their deadline.
    async fn upgrade_lease(&self, lease: &LeaseRef) -> Result<Grant> {
        let split = parts::split(lease)?;
        let answers = self
            .all_parts(lease, |client, part| async move {
                client.upgrade_lease(&part.lease).await
            })
            .await?;
        let refused = |a: &Result<Grant>| a.as_ref().is_err_and(|e| !e.is_retryable());
        if answers.iter().any(|(_, a)| refused(a)) {
            let (refusals, rest): (Vec<_>, Vec<_>) = answers.into_iter().partition(|(_, a)| refused(a));
            let rest: Vec<&Part> = rest.iter().map(|(p, _)| p).collect();
            self.release_parts(&rest, "a failed upgrade").await;
            let (_, refusal) = refusals.into_iter().next().expect("one was refused");
            return Err(not_upgraded(refusal.expect_err("refused")));
        }
        let mut grants = Vec::with_capacity(answers.len());
        for (_, a) in answers {
            grants.push(a?);
        }
        let taken: Vec<(String, String, Grant)> = split
            .into_iter()
            .zip(grants)
            .map(|(p, g)| {
                let url = self.inner.members[&p.member_id].url.clone();
                (p.member_id, url, g)
            })
            .collect();
        let names: Vec<String> = if lease.names.is_empty() {
            let mut all: Vec<String> = taken
                .iter()
                .flat_map(|(_, _, g)| g.names.iter().map(|n| n.name.clone()))
                .collect();
            all.sort();
            all.dedup();
            all
        } else {
            lease.names.clone()
        };
        Ok(parts::combine_grants(&names, &taken))
    }

    async fn release_lease(&self, lease: &LeaseRef, options: ReleaseOptions) -> Result<Micros> {
        // Every part carries on what any part inherited: while migrating,
        // the next list's owner of a name never heard of a predecessor
        // on the current list's owner.
        let options = options.carrying_inherited();
        let answers = self
            .all_parts(lease, |client, part| {
                let options = options.clone();
                async move { client.release_lease(&part.lease, options).await }
            })
            .await?;
        released(answers)
    }
}

/// A part's refusal of an upgrade, saying that the lease's other parts
/// were released.
fn not_upgraded(e: Error) -> Error {
    match e {
        Error::NotHeld { reason, message } => Error::NotHeld {
            reason,
            message: format!("{message}; the lease's other parts were released"),
        },
        Error::PermissionDenied { message } => Error::PermissionDenied {
            message: format!("{message}; the lease's other parts were released"),
        },
        e => e,
    }
}

/// The outcome of releasing every part: the highest watermark stored when
/// each part was released or already gone (a part that expired, or that a
/// failed upgrade let go, has nothing left to release: the names' next
/// holders see it ended), with a warning naming the parts already gone. A
/// part that could not be reached fails the release (it may still be held);
/// so does a lease none of whose parts was still held, as one server's
/// release of a gone lease does.
fn released(answers: Vec<(Part, Result<Micros>)>) -> Result<Micros> {
    let mut stored = None;
    let mut gone = Vec::new();
    let mut failed = None;
    for (part, answer) in answers {
        match answer {
            Ok(wm) => stored = stored.max(Some(wm)),
            Err(e @ Error::NotHeld { .. }) => gone.push((part, e)),
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    match stored {
        None => Err(gone
            .into_iter()
            .next()
            .map(|(_, e)| e)
            .unwrap_or_else(|| Error::invalid("lease_id", "a lease with no parts"))),
        Some(wm) => {
            for (part, e) in &gone {
                tracing::warn!(server = %part.member_id, lease = %part.lease.id, error = %e,
                    "released the lease's other parts; this part was already gone");
            }
            Ok(wm)
        }
    }
}

impl Cluster {
    /// Runs `op` on every part of `lease` at once, whatever each answers:
    /// for the operations that must reach every part even when one refuses
    /// (an upgrade unwinds the others, a release frees what is left).
    async fn all_parts<'a, T, F, Fut>(&'a self, lease: &LeaseRef, op: F) -> Result<Vec<(Part, Result<T>)>>
    where
        F: Fn(&'a Client, Part) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let split = parts::split(lease)?;
        let mut calls = Vec::with_capacity(split.len());
        for part in split {
            let m = self.member(&part.member_id)?;
            let op = &op;
            calls.push(async move {
                // `Member::client` names the server already.
                let answer = match m.client().await {
                    Ok(client) => op(client, part.clone()).await.map_err(|e| e.at_server(&m.url)),
                    Err(e) => Err(e),
                };
                (part, answer)
            });
        }
        Ok(join_all(calls).await)
    }

    /// Releases `parts` (of a lease being given up), best effort: a part
    /// that cannot be released expires at its deadline.
    async fn release_parts(&self, parts: &[&Part], why: &str) {
        join_all(parts.iter().map(|part| async move {
            let released = async {
                let client = self.member(&part.member_id)?.client().await?;
                client.release_lease(&part.lease, ReleaseOptions::default()).await
            };
            if let Err(e) = released.await {
                tracing::warn!(server = %part.member_id, lease = %part.lease.id, error = %e,
                    "could not release a part after {why}; it expires at its deadline");
            }
        }))
        .await;
    }

    /// Runs `op` on every part of `lease` at once; all answers in part
    /// order, or the first refusal (a refusal outranks a retryable error:
    /// one server refusing means the lease is gone there).
    async fn each_part<'a, T, F, Fut>(&'a self, lease: &LeaseRef, op: F) -> Result<Vec<T>>
    where
        F: Fn(&'a Client, Part) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut answers = Vec::new();
        let mut retryable = None;
        for (_, a) in self.all_parts(lease, op).await? {
            match a {
                Ok(v) => answers.push(v),
                Err(e) if e.is_retryable() => retryable = retryable.or(Some(e)),
                Err(e) => return Err(e),
            }
        }
        match retryable {
            Some(e) => Err(e),
            None => Ok(answers),
        }
    }

    /// Releases parts taken by a failed acquire. Best effort: a part that
    /// cannot be released expires at its deadline; the caller gets the
    /// error that made the acquire fail.
    async fn abandon(&self, taken: &[(String, String, Grant)]) {
        let parts: Vec<Part> = taken
            .iter()
            .map(|(member_id, _, g)| Part {
                member_id: member_id.clone(),
                lease: g.lease_ref(),
            })
            .collect();
        self.release_parts(&parts.iter().collect::<Vec<_>>(), "a failed acquire")
            .await;
    }
}
