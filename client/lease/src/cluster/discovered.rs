//! [`DnsCluster`]: a [`Cluster`] whose members are found in DNS
//! (`dns+srv://NAME`, see [`super::dns`]) and whose routing follows what
//! the members themselves announce.
//!
//! # Why the members decide, not DNS
//!
//! A DNS answer can be wrong (a record pointing at another member), stale
//! (a cache, a slow secondary) or different for two clients that looked
//! at different moments. Routing by the answer alone would let a client
//! that saw the new set and one that saw the old set route a name to two
//! owners: two holders. So DNS supplies only *where* members are; *which
//! lists names are routed by* comes from the members' own `--members` and
//! `--next-members`, which every member announces:
//!
//! * every member reached must announce its lists (a `dns+srv://` list
//!   needs servers started with `--members`); the lists routed by are the
//!   ones they announce, current first: while they announce a next list,
//!   every name needs a grant from its owner in both, exactly as a client
//!   given `--servers` and `--next-servers`;
//! * the members DNS names must be exactly the members of those lists: a
//!   record for a server no list has (a wrong or early record) or a list
//!   member without a record (a stale answer) is refused, never routed
//!   around;
//! * each member is checked, as for a written list, to announce the ID its
//!   record gives and lists that agree with the client's (the cluster's
//!   identity and membership checks), and each server refuses names it
//!   does not own under its lists.
//!
//! So a changed answer is never a silent re-route: it is followed when
//! the members announce the change (the operator's migration), and until
//! then the client keeps the routing it has and says why it did not
//! follow. The lists are looked up again every
//! [`ClientOptions::dns_refresh`]: an operator moving members from one
//! list to the next waits that long, on top of the max TTL, before
//! dropping the old list (docs/operating.md).
//!
//! A lease taken before a change is renewed and released through the new
//! routing by its parts' member ids; a part on a member that left every
//! list can no longer be renewed, as if that member had stopped.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use bagel_proto::clock::Clock;
use bagel_proto::{KeyRing, Micros};
use futures::future::join_all;

use super::dns::{Lookup, SCHEME, srv_name};
use super::members::check_identity;
use super::{Cluster, ServerSpec};
use crate::acquire::AcquireBuilder;
use crate::backend::{
    AcquireSpec, BackendInfo, Call, LeaseBackend, Listing, NameRoute, Offer, WatchOptions, WatchStream,
};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::options::ClientOptions;
use crate::types::{Grant, History, LeaseRef, Metadata, NameState, ReleaseOptions, Renewal, WatchTarget};

/// Leases over the members a `dns+srv://` name lists, routed by the lists
/// the members announce (see the module docs). Cheap to clone; stops
/// looking up again when the last clone is dropped.
#[derive(Clone)]
pub struct DnsCluster {
    shared: Arc<Shared>,
}

struct Shared {
    lookup: Lookup,
    options: ClientOptions,
    state: RwLock<State>,
    /// One refresh at a time (the periodic one and a caller's).
    refreshing: tokio::sync::Mutex<()>,
}

#[derive(Clone)]
struct State {
    cluster: Cluster,
    /// What it was built from: the members found and the lists routed by.
    members: Vec<ServerSpec>,
    lists: Vec<Vec<String>>,
}

impl std::fmt::Debug for DnsCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsCluster")
            .field("name", &self.shared.lookup.name())
            .field("lists", &self.lists())
            .finish()
    }
}

impl DnsCluster {
    /// Looks up `list` (`dns+srv://NAME`), asks the members found for
    /// their lists, and opens the cluster they route by; then looks up
    /// again every [`ClientOptions::dns_refresh`]. Fails when DNS has no
    /// members, a member announces no lists (`--members`), the members
    /// disagree, or DNS and the members' lists do not name the same
    /// members.
    pub async fn open(list: &str, options: &ClientOptions) -> Result<Self> {
        let lookup = Lookup::new(srv_name(list)?, options)?;
        let state = settle(&lookup, options).await?;
        let shared = Arc::new(Shared {
            lookup,
            options: options.clone(),
            state: RwLock::new(state),
            refreshing: tokio::sync::Mutex::new(()),
        });
        tokio::spawn(refresh_every(Arc::downgrade(&shared), options.dns_refresh));
        Ok(DnsCluster { shared })
    }

    /// Looks up the members and their lists now. `Ok(true)` when the
    /// routing changed (the members announce other lists, or members
    /// moved), `Ok(false)` when it is as it was. On an error the routing
    /// is kept as it was.
    pub async fn refresh(&self) -> Result<bool> {
        self.shared.refresh().await
    }

    /// Starts an acquire of `names`, routed as the members announce now.
    pub fn acquire<I, S>(&self, names: I) -> AcquireBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        AcquireBuilder::new(Arc::new(self.clone()), names)
    }

    /// The routing in force now, as a [`Cluster`].
    pub fn cluster(&self) -> Cluster {
        self.state().cluster
    }

    /// The lists names are routed by now (member IDs, current first;
    /// two while the members announce a next list).
    pub fn lists(&self) -> Vec<Vec<String>> {
        self.state().lists
    }

    fn state(&self) -> State {
        self.shared.state.read().expect("not poisoned").clone()
    }
}

impl Shared {
    async fn refresh(&self) -> Result<bool> {
        let _one = self.refreshing.lock().await;
        let new = settle(&self.lookup, &self.options).await?;
        let mut state = self.state.write().expect("not poisoned");
        if state.members == new.members && state.lists == new.lists {
            return Ok(false);
        }
        tracing::info!(name = %self.lookup.name(), from = ?state.lists, to = ?new.lists,
            "the members announce new lists; routing by them");
        *state = new;
        Ok(true)
    }
}

async fn refresh_every(shared: Weak<Shared>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if let Err(e) = shared.refresh().await {
            tracing::warn!(name = %shared.lookup.name(), error = %e,
                "looking up the lease servers again failed; keeping the routing as it was");
        }
    }
}

/// The routing DNS and the members agree on now (see the module docs).
async fn settle(lookup: &Lookup, options: &ClientOptions) -> Result<State> {
    let found = lookup.members().await?;
    let each = announcements(&found, options).await?;
    let announced = lists_in_force(&each)?;
    // Every member reached must serve in every list that names it: one
    // that does not know the next list yet would grant under the current
    // list alone what the next list's owner grants too.
    for (id, its) in &each {
        for list in announced.iter().filter(|l| l.contains(id)) {
            if !bagel_proto::routing::list_agrees(list, its) {
                return Err(Error::Unavailable {
                    retry_after: None,
                    message: format!(
                        "{SCHEME}{}: the members disagree: {id} serves in {its:?}, others announce \
                         {list:?} too (a change half rolled out); names are routed again when they agree",
                        lookup.name()
                    ),
                });
            }
        }
    }
    let listed: BTreeSet<&str> = announced.iter().flatten().map(String::as_str).collect();
    let named: BTreeSet<&str> = found.iter().filter_map(|s| s.id.as_deref()).collect();
    let disagree = |message: String| Error::Unavailable {
        retry_after: None,
        message: format!("{SCHEME}{}: {message}", lookup.name()),
    };
    if let Some(extra) = named.difference(&listed).next() {
        return Err(disagree(format!(
            "DNS names member {extra}, which no member's list has (members announce {announced:?}): \
             a wrong or early record; names are not routed to it until the members list it \
             (--next-members)"
        )));
    }
    if let Some(missing) = listed.difference(&named).next() {
        return Err(disagree(format!(
            "member {missing} is in the lists the members announce ({announced:?}) but DNS has no \
             record for it (a stale answer, or a member not published yet)"
        )));
    }
    let specs_of = |list: &Vec<String>| -> Vec<ServerSpec> {
        list.iter()
            .filter_map(|id| found.iter().find(|s| s.id.as_deref() == Some(id.as_str())))
            .cloned()
            .collect()
    };
    let current = specs_of(&announced[0]);
    let next = announced.get(1).map(specs_of);
    let cluster = Cluster::open(&current, next.as_deref(), options.clone()).await?;
    Ok(State {
        cluster,
        members: found,
        lists: announced,
    })
}

/// What each member found announces (its ID, its lists), asking each for
/// at most [`ClientOptions::member_wait`]. Fails when none answers, one
/// announces another ID than its record gives, or one announces no lists.
async fn announcements(
    found: &[ServerSpec],
    options: &ClientOptions,
) -> Result<Vec<(String, Vec<Vec<String>>)>> {
    let asks = found.iter().map(|spec| async move {
        let connect = async {
            match spec.key {
                None => Client::connect_with(&spec.url, options).await,
                Some(key) => {
                    let mut ring = KeyRing::new();
                    ring.insert_bytes(&key)
                        .map_err(|e| Error::invalid("servers", e.to_string()))?;
                    Client::connect_pinned_with(&spec.url, ring, options).await
                }
            }
        };
        let answer = tokio::time::timeout(options.member_wait, connect).await;
        (spec, answer)
    });
    let mut each = Vec::new();
    let mut first_error = None;
    for (spec, answer) in join_all(asks).await {
        let id = spec.id.clone().unwrap_or_default();
        let client = match answer {
            Ok(Ok(client)) => client,
            Ok(Err(e)) if !e.is_retryable() => return Err(e.at_server(&spec.url)),
            Ok(Err(e)) => {
                first_error = first_error.or(Some(e.at_server(&spec.url)));
                continue;
            }
            Err(_) => continue,
        };
        check_identity(&id, &spec.url, client.server_id()).map_err(|e| e.at_server(&spec.url))?;
        if client.members().is_empty() {
            return Err(Error::Config {
                message: format!(
                    "server {id} ({}) announces no member lists: a dns+srv:// server list needs \
                     servers started with --members (BAGEL_MEMBERS), which decide the routing",
                    spec.url
                ),
            });
        }
        each.push((id, client.members().to_vec()));
    }
    if each.is_empty() {
        return Err(first_error.unwrap_or_else(|| Error::Unavailable {
            retry_after: None,
            message: format!(
                "none of the members DNS names answered within {:?}",
                options.member_wait
            ),
        }));
    }
    Ok(each)
}

/// The lists routed by: every list a member announces, each sorted, once,
/// current first. More than two is a change half rolled out.
fn lists_in_force(each: &[(String, Vec<Vec<String>>)]) -> Result<Vec<Vec<String>>> {
    let mut lists: Vec<(usize, Vec<String>)> = Vec::new();
    for (at, list) in each.iter().flat_map(|(_, its)| its.iter().enumerate()) {
        let mut list = list.clone();
        list.sort();
        match lists.iter_mut().find(|(_, l)| *l == list) {
            Some((pos, _)) => *pos = (*pos).min(at),
            None => lists.push((at, list)),
        }
    }
    lists.sort_by_key(|(at, _)| *at);
    if lists.len() > 2 {
        return Err(Error::Unavailable {
            retry_after: None,
            message: format!(
                "the members disagree: they announce {} different lists ({:?}), a change half \
                 rolled out; names are routed again when they agree",
                lists.len(),
                lists.iter().map(|(_, l)| l).collect::<Vec<_>>()
            ),
        });
    }
    Ok(lists.into_iter().map(|(_, l)| l).collect())
}

#[async_trait]
impl LeaseBackend for DnsCluster {
    fn location(&self) -> String {
        format!(
            "{SCHEME}{} ({})",
            self.shared.lookup.name(),
            self.cluster().location()
        )
    }
    fn single_location(&self) -> Option<String> {
        None
    }
    fn describe_self(&self) -> String {
        format!(
            "the lease servers found at {SCHEME}{} ({})",
            self.shared.lookup.name(),
            self.cluster().location()
        )
    }
    fn offers(&self, call: Call) -> Offer {
        self.cluster().offers(call)
    }
    async fn list_names(&self, prefix: &str, limit: usize) -> Result<Listing> {
        self.cluster().list_names(prefix, limit).await
    }
    async fn watch_names(&self, target: WatchTarget, options: WatchOptions) -> Result<Box<dyn WatchStream>> {
        self.cluster().watch_names(target, options).await
    }
    fn route_name(&self, name: &str) -> Result<NameRoute> {
        self.cluster().route_name(name)
    }
    async fn describe(&self, names: &[String]) -> Result<Vec<NameState>> {
        LeaseBackend::describe(&self.cluster(), names).await
    }
    async fn history(&self, name: &str) -> Result<History> {
        LeaseBackend::history(&self.cluster(), name).await
    }
    async fn trusted_keys(&self) -> Result<KeyRing> {
        self.cluster().trusted_keys().await
    }
    async fn info(&self) -> Result<BackendInfo> {
        self.cluster().info().await
    }
    fn clock(&self) -> Arc<dyn Clock> {
        self.cluster().clock()
    }
    fn max_ttl(&self) -> Duration {
        self.cluster().max_ttl()
    }
    fn max_wait(&self) -> Option<Duration> {
        self.cluster().max_wait()
    }
    async fn acquire_lease(&self, spec: AcquireSpec) -> Result<Grant> {
        self.cluster().acquire_lease(spec).await
    }
    async fn renew_lease(
        &self,
        lease: &LeaseRef,
        deadline: Micros,
        metadata: Option<Metadata>,
    ) -> Result<Renewal> {
        self.cluster().renew_lease(lease, deadline, metadata).await
    }
    async fn renew_lease_ttl(
        &self,
        lease: &LeaseRef,
        ttl: Duration,
        metadata: Option<Metadata>,
    ) -> Result<Renewal> {
        self.cluster().renew_lease_ttl(lease, ttl, metadata).await
    }
    async fn upgrade_lease(&self, lease: &LeaseRef) -> Result<Grant> {
        self.cluster().upgrade_lease(lease).await
    }
    async fn release_lease(&self, lease: &LeaseRef, options: ReleaseOptions) -> Result<Micros> {
        self.cluster().release_lease(lease, options).await
    }
}
