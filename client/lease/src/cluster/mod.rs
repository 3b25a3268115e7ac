//! [`Cluster`]: leases over several bagel servers that know nothing of
//! each other.
//!
//! Names are independent, so the name space is split over servers with no
//! consensus and no state transfer: each name belongs to one server by
//! [`rendezvous`] hashing over the members' identities, and every client
//! with the same servers routes it the same way, however it spells their
//! URLs. A member's identity is the one the *server* holds and announces
//! (ServerInfo's `server_id`: its `--server-id`, else derived from its
//! durable key, else its host name and port), never the URL as written:
//! two clients that wrote `http://localhost:P` and `http://127.0.0.1:P/`
//! route alike. A list may state it (`ID=URL`); the client then checks at
//! connect that the member announces that identity, and refuses naming
//! both if not. A member given without an ID must be reached at start to
//! learn it (a client that cannot know a member's identity cannot know
//! which names are its), so a list whose members may be down when clients
//! start gives every ID; with IDs, a member that is down fails only its own
//! names, and one that is frozen (it accepts and never answers) is waited
//! for at start only [`crate::ClientOptions::member_wait`], then holds up
//! only its own names. Keys are learned (or pinned) to check witnesses; they play no
//! part in routing. A lease on names that one
//! server owns is today's single call; a lease on names spread over several
//! servers is taken tentatively on each, in ascending member-id order (so
//! two acquirers of overlapping sets meet at the same first server instead
//! of each holding half), then upgraded on each; any failure releases what
//! was taken. The result is one [`crate::Lease`] handle (see [`parts`] for how
//! the per-server leases combine).
//!
//! # Migration
//!
//! A cluster may carry a *next* server list ([`Cluster::migrating`]).
//! While it does, every name needs a grant from its owner in the current
//! list **and** its owner in the next list (one grant when they are the
//! same server). The operator's recipe to move from `current` to `next`:
//!
//! 1. all clients on `current`;
//! 2. all clients on `current` + `next`; then wait the max TTL, so that
//!    every lease taken under step 1 has ended (a long-running holder
//!    started under step 1 keeps its list until it releases or is
//!    restarted: count step 2 from when the last of them was restarted);
//! 3. all clients on `next`.
//!
//! A step-1 and a step-2 client never both hold a name: both need its
//! `current` owner, which grants one holder at a time. A step-2 and a
//! step-3 client both need its `next` owner. Only step 1 and step 3 share
//! no server, and the wait keeps them apart in time. Skipping the wait lets
//! a step-3 client take a name from its `next` owner while a step-1 holder
//! still writes under its `current` owner's grant: two writers, and the
//! audit reports the overlap.
//!
//! What a step-1 holder left unsettled (it was broken, or released with
//! writes of unknown outcome) is known to the `current` owner only. A
//! step-2 lease inherits it from there, and its release carries it to
//! every part ([`ReleaseOptions::inherited`]), so the `next` owner hands
//! it on to step 3.
//!
//! # Parts
//!
//! * this file: [`Cluster`] itself: its lists, routing (who owns a name,
//!   which servers an acquire visits) and the calls asked of a name's
//!   owner (describe, history);
//! * `spec`: [`ServerSpec`], one `[ID=]URL[#KEY]` entry of a server list
//!   and its parsing, which needs no connection;
//! * `members`: one server of the cluster, connected on first use, and how
//!   the lists become members at start (learning each identity, refusing a
//!   list that names a server twice or under another identity);
//! * `backend`: the lease protocol over the members (the
//!   tentative-then-upgrade acquire, its unwinding, renew, upgrade and
//!   release over a lease's parts), as [`LeaseBackend`];
//! * [`parts`]: how the per-server leases combine into one handle;
//! * [`rendezvous`]: the hash that picks a name's owner;
//! * [`dns`]: a `dns+srv://NAME` list looked up in DNS, and
//!   `discovered`: [`DnsCluster`], the cluster it opens, routed by the
//!   lists its members announce and looked up again as they change.

mod backend;
mod discovered;
pub mod dns;
mod members;
pub mod parts;
pub mod rendezvous;
mod spec;

use std::collections::BTreeMap;
use std::sync::Arc;

use bagel_proto::KeyRing;
use bagel_proto::clock::Clock;
use futures::future::join_all;

use crate::acquire::AcquireBuilder;
use crate::client::Client;
use crate::error::{Error, Result};
use crate::options::ClientOptions;
use crate::types::{History, NameState};
#[cfg(doc)]
use crate::{backend::LeaseBackend, types::ReleaseOptions};
pub use discovered::DnsCluster;
use members::Member;
pub use spec::ServerSpec;

/// Who owns a name, now and (while migrating) next.
pub use crate::backend::Route;

/// Leases over several servers. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Cluster {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Every server of both lists, by member id.
    members: BTreeMap<String, Arc<Member>>,
    /// The current list and, while migrating, the next one: each as the
    /// members' identities (what the hash ranks) and member ids, in the
    /// same order.
    current: List,
    next: Option<List>,
    clock: Arc<dyn Clock>,
}

#[derive(Clone, Debug)]
struct List {
    identities: Vec<String>,
    ids: Vec<String>,
}

impl List {
    /// The member id of `name`'s owner.
    fn owner(&self, name: &str) -> &String {
        &self.ids[rendezvous::owner(&self.identities, name).expect("server lists are never empty")]
    }
}

impl Cluster {
    /// Connects to every server of `servers`, learning the identity of
    /// each given without `ID=` (which routes its names) and the keys of
    /// each not pinned (those given with an ID that cannot be reached now:
    /// on first use). Fails for a bad list, a member that announces another
    /// identity than its `ID=`, a member without an ID that cannot be
    /// reached, or when no server can be reached and none is pinned.
    pub async fn connect(servers: &[ServerSpec]) -> Result<Self> {
        Self::open(servers, None, ClientOptions::default()).await
    }

    /// A cluster moving from `current` to `next`: every name needs a grant
    /// from its owner in each (see the module docs for the recipe).
    pub async fn migrating(current: &[ServerSpec], next: &[ServerSpec]) -> Result<Self> {
        Self::open(current, Some(next), ClientOptions::default()).await
    }

    /// [`Cluster::connect`], each server connected with `options` (TLS,
    /// time bounds).
    pub async fn connect_with(servers: &[ServerSpec], options: &ClientOptions) -> Result<Self> {
        Self::open(servers, None, options.clone()).await
    }

    /// [`Cluster::migrating`], each server connected with `options`.
    pub async fn migrating_with(
        current: &[ServerSpec],
        next: &[ServerSpec],
        options: &ClientOptions,
    ) -> Result<Self> {
        Self::open(current, Some(next), options.clone()).await
    }

    /// Uses `clock` for TTL arithmetic and local validity checks.
    #[must_use]
    pub fn with_clock(self, clock: Arc<dyn Clock>) -> Self {
        let inner = Inner {
            members: self.inner.members.clone(),
            current: self.inner.current.clone(),
            next: self.inner.next.clone(),
            clock,
        };
        Cluster {
            inner: Arc::new(inner),
        }
    }

    /// Starts an acquire of `names` (on one server or several).
    pub fn acquire<I, S>(&self, names: I) -> AcquireBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        AcquireBuilder::new(Arc::new(self.clone()), names)
    }

    /// The lists names are routed by: the members' identities, the
    /// current list first, then the next one while migrating.
    pub fn lists(&self) -> Vec<Vec<String>> {
        std::iter::once(&self.inner.current)
            .chain(self.inner.next.as_ref())
            .map(|l| l.identities.clone())
            .collect()
    }

    /// Who owns each name.
    pub fn route(&self, name: &str) -> Route {
        let member = |list: &List| &self.inner.members[list.owner(name)];
        let at = |m: &Member| (m.url.clone(), m.key_id().unwrap_or_default());
        let current = member(&self.inner.current);
        let next = self.inner.next.as_ref().map(member);
        Route {
            name: name.to_owned(),
            current: at(current),
            next: next.map(|m| at(m)),
            current_identity: current.identity.clone(),
            next_identity: next.map(|m| m.identity.clone()),
        }
    }

    /// The keys of every server (those not reached yet: their pinned keys):
    /// what a reader or the audit of this cluster's bags trusts.
    pub fn keys(&self) -> KeyRing {
        let mut ring = KeyRing::new();
        for m in self.inner.members.values() {
            match (m.client.get(), &m.pinned) {
                (Some(c), _) => ring.merge(&c.keys()),
                (None, Some((pinned, _))) => ring.merge(pinned),
                (None, None) => {}
            }
        }
        ring
    }

    /// Every server of both lists: (URL, member id), by member id (the
    /// order a multi-server acquire visits them).
    pub fn servers(&self) -> Vec<(String, String)> {
        self.inner
            .members
            .iter()
            .map(|(id, m)| (m.url.clone(), id.clone()))
            .collect()
    }

    /// A connection to the server with member id `member_id`.
    pub async fn client_of(&self, member_id: &str) -> Result<&Client> {
        self.member(member_id)?.client().await
    }

    /// A connection to the current owner of `name` (for describe, history).
    pub async fn owner_client(&self, name: &str) -> Result<&Client> {
        let id = self.inner.current.owner(name);
        self.inner.members[id].client().await
    }

    /// Every name's state, asked of its current owner.
    pub async fn describe<I, S>(&self, names: I) -> Result<Vec<NameState>>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let names: Vec<String> = names.into_iter().map(Into::into).collect();
        let mut by_owner: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for n in &names {
            by_owner
                .entry(self.inner.current.owner(n))
                .or_default()
                .push(n.clone());
        }
        let answers = join_all(by_owner.into_iter().map(|(id, names)| async move {
            let m = &self.inner.members[id];
            m.client()
                .await?
                .describe(names)
                .await
                .map_err(|e| e.at_server(&m.url))
        }))
        .await;
        let mut states: Vec<NameState> = Vec::with_capacity(names.len());
        for a in answers {
            states.extend(a?);
        }
        // In the order asked.
        states.sort_by_key(|s| names.iter().position(|n| *n == s.name));
        Ok(states)
    }

    /// A name's history, asked of its current owner.
    pub async fn history(&self, name: impl Into<String>) -> Result<History> {
        let name = name.into();
        let m = &self.inner.members[self.inner.current.owner(&name)];
        m.client()
            .await?
            .history(name)
            .await
            .map_err(|e| e.at_server(&m.url))
    }

    /// The servers each name needs a grant from: its owner in the current
    /// list and, while migrating, in the next; by member id, ascending.
    fn plan(&self, names: &[String]) -> BTreeMap<&str, Vec<String>> {
        let mut plan: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for name in names {
            let mut owners = vec![self.inner.current.owner(name)];
            if let Some(next) = &self.inner.next {
                owners.push(next.owner(name));
            }
            owners.dedup();
            for id in owners {
                plan.entry(id.as_str()).or_default().push(name.clone());
            }
        }
        plan
    }

    fn member(&self, member_id: &str) -> Result<&Arc<Member>> {
        self.inner.members.get(member_id).ok_or_else(|| {
            Error::invalid(
                "lease_id",
                format!(
                    "a part of this lease is held on server {member_id} (a member id), which is in \
                     neither server list"
                ),
            )
        })
    }
}
