//! [`Cluster`]: leases over several bagel servers that know nothing of
//! each other.
//!
//! Names are independent, so the name space is split over servers with no
//! consensus and no state transfer: each name belongs to one server by
//! [`rendezvous`] hashing over the servers' key ids, and every client with
//! the same server list routes it the same way. A lease on names that one
//! server owns is today's single call; a lease on names spread over several
//! servers is taken tentatively on each, in ascending key-id order (so two
//! acquirers of overlapping sets meet at the same first server instead of
//! each holding half), then upgraded on each; any failure releases what was
//! taken. The result is one [`crate::Lease`] handle (see [`parts`] for how
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
//!    every lease taken under step 1 has ended;
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
//! Longer than most files: routing, the tentative-then-upgrade acquire,
//! its unwinding and the migration rule are one protocol; `parts` (how
//! the per-server leases combine) and `rendezvous` (the hash) stand
//! apart.

pub mod parts;
pub mod rendezvous;

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bagel_proto::clock::{Clock, SystemClock};
use bagel_proto::{KeyRing, Micros};
use futures::future::join_all;
use tokio::sync::OnceCell;

use crate::acquire::AcquireBuilder;
use crate::backend::{AcquireSpec, LeaseBackend};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::options::ClientOptions;
use crate::types::{Grant, History, LeaseRef, Metadata, Mode, NameState, ReleaseOptions, Renewal};
use parts::Part;

/// One server of a list: its URL, and optionally the public key it must
/// sign with. Written `URL` or `URL#KEY` (KEY: 64 hex digits, the raw
/// ed25519 public key `bagel-server` prints at start).
///
/// A pinned key is trusted without asking the server, and lets a client
/// route names while that server is down (names are routed by key id).
#[derive(Clone, PartialEq, Eq)]
pub struct ServerSpec {
    pub url: String,
    pub key: Option<[u8; 32]>,
}

impl fmt::Debug for ServerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url)?;
        if let Some(key) = &self.key {
            write!(f, "#{}", bagel_proto::hex::encode(key))?;
        }
        Ok(())
    }
}

impl FromStr for ServerSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (url, key) = match s.split_once('#') {
            None => (s, None),
            Some((url, key)) => {
                let key = bagel_proto::hex::decode_array::<32>(key).map_err(|e| {
                    format!("server {s:?}: the part after '#' is not a public key (64 hex digits): {e}")
                })?;
                (url, Some(key))
            }
        };
        if url.is_empty() {
            return Err(format!("server {s:?}: no URL"));
        }
        crate::options::check_server_url(url).map_err(|e| format!("server {e}"))?;
        Ok(ServerSpec {
            url: url.to_owned(),
            key,
        })
    }
}

impl ServerSpec {
    /// A comma-separated list (`--servers`).
    pub fn parse_list(list: &str) -> Result<Vec<ServerSpec>, String> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::parse)
            .collect()
    }
}

/// One server of the cluster. Connected at start unless its key is pinned,
/// then on first use (so a pinned server may be down at start).
#[derive(Debug)]
struct Member {
    url: String,
    key_id: String,
    pinned: Option<KeyRing>,
    client: OnceCell<Client>,
    options: Arc<ClientOptions>,
}

impl Member {
    async fn client(&self) -> Result<&Client> {
        self.client
            .get_or_try_init(|| async {
                let pinned = self
                    .pinned
                    .clone()
                    .expect("an unpinned member is connected at start");
                let client = Client::connect_pinned_with(&self.url, pinned, &self.options).await?;
                let info = client.server_info().await?;
                if !info.keys.iter().any(|(id, _)| *id == self.key_id) {
                    let has: Vec<&str> = info.keys.iter().map(|(id, _)| id.as_str()).collect();
                    return Err(Error::Rejected {
                        code: tonic::Code::FailedPrecondition,
                        message: format!(
                            "server {} signs with key {has:?}, not the pinned key {}",
                            self.url, self.key_id
                        ),
                    });
                }
                Ok(client)
            })
            .await
            .map_err(|e| e.at_server(&self.url))
    }
}

/// Who owns a name, now and (while migrating) next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub name: String,
    /// The owner in the current list: (URL, key id).
    pub current: (String, String),
    /// The owner in the next list, while migrating.
    pub next: Option<(String, String)>,
}

/// Leases over several servers. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Cluster {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Every server of both lists, by key id.
    members: BTreeMap<String, Arc<Member>>,
    /// Key ids of the current list, and of the next one while migrating.
    current: Vec<String>,
    next: Option<Vec<String>>,
    clock: Arc<dyn Clock>,
    max_ttl: Duration,
}

impl Cluster {
    /// Connects to every server of `servers` (those with a pinned key on
    /// first use) and learns their keys.
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

    async fn open(
        current: &[ServerSpec],
        next: Option<&[ServerSpec]>,
        options: ClientOptions,
    ) -> Result<Self> {
        let options = Arc::new(options);
        let mut members = BTreeMap::new();
        let current_ids = Self::join(current, "servers", &options, &mut members).await?;
        let next_ids = match next {
            Some(next) => Some(Self::join(next, "next servers", &options, &mut members).await?),
            None => None,
        };
        let max_ttl = members
            .values()
            .filter_map(|m| m.client.get().map(Client::max_ttl))
            .min()
            .unwrap_or(Duration::from_secs(10));
        Ok(Cluster {
            inner: Arc::new(Inner {
                members,
                current: current_ids,
                next: next_ids,
                clock: Arc::new(SystemClock),
                max_ttl,
            }),
        })
    }

    /// Connects the servers of one list (each once, whichever lists name
    /// it) and returns their key ids.
    async fn join(
        list: &[ServerSpec],
        what: &str,
        options: &Arc<ClientOptions>,
        members: &mut BTreeMap<String, Arc<Member>>,
    ) -> Result<Vec<String>> {
        let refuse = |message: String| Error::Rejected {
            code: tonic::Code::InvalidArgument,
            message,
        };
        if list.is_empty() {
            return Err(refuse(format!("{what}: the list is empty")));
        }
        let connected = join_all(list.iter().map(|spec| async move {
            match spec.key {
                Some(key) => {
                    let mut ring = KeyRing::new();
                    let id = ring
                        .insert_bytes(&key)
                        .map_err(|e| refuse(format!("{what}: {spec:?}: {e}")))?;
                    Ok((id, Some(ring), None))
                }
                None => {
                    let client = Client::connect_with(&spec.url, options)
                        .await
                        .map_err(|e| e.at_server(&spec.url))?;
                    let info = client.server_info().await.map_err(|e| e.at_server(&spec.url))?;
                    let (id, _) = info.keys.first().cloned().ok_or_else(|| Error::Witness {
                        reason: format!("server {} publishes no key", spec.url),
                    })?;
                    Ok::<_, Error>((id, None, Some(client)))
                }
            }
        }))
        .await;
        let mut ids = Vec::with_capacity(list.len());
        for (spec, c) in list.iter().zip(connected) {
            let (key_id, pinned, client) = c?;
            if ids.contains(&key_id) {
                return Err(refuse(format!(
                    "{what}: {} names server {key_id} a second time",
                    spec.url
                )));
            }
            if let Some(m) = members.get(&key_id) {
                if m.url != spec.url {
                    return Err(refuse(format!(
                        "{what}: server {key_id} is given as both {} and {}",
                        m.url, spec.url
                    )));
                }
            } else {
                let cell = OnceCell::new();
                if let Some(client) = client {
                    cell.set(client).expect("a new cell");
                }
                members.insert(
                    key_id.clone(),
                    Arc::new(Member {
                        url: spec.url.clone(),
                        key_id: key_id.clone(),
                        pinned,
                        client: cell,
                        options: Arc::clone(options),
                    }),
                );
            }
            ids.push(key_id);
        }
        Ok(ids)
    }

    /// Uses `clock` for TTL arithmetic and local validity checks.
    #[must_use]
    pub fn with_clock(self, clock: Arc<dyn Clock>) -> Self {
        let inner = Inner {
            members: self.inner.members.clone(),
            current: self.inner.current.clone(),
            next: self.inner.next.clone(),
            clock,
            max_ttl: self.inner.max_ttl,
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

    /// Who owns each name.
    pub fn route(&self, name: &str) -> Route {
        let at = |id: &String| (self.inner.members[id].url.clone(), id.clone());
        Route {
            name: name.to_owned(),
            current: at(owner_in(&self.inner.current, name)),
            next: self.inner.next.as_ref().map(|next| at(owner_in(next, name))),
        }
    }

    /// The keys of every server (those not reached yet: their pinned keys):
    /// what a reader or the audit of this cluster's bags trusts.
    pub fn keys(&self) -> KeyRing {
        let mut ring = KeyRing::new();
        for m in self.inner.members.values() {
            match (m.client.get(), &m.pinned) {
                (Some(c), _) => ring.merge(c.keys()),
                (None, Some(pinned)) => ring.merge(pinned),
                (None, None) => {}
            }
        }
        ring
    }

    /// Every server of both lists: (URL, key id), by key id.
    pub fn servers(&self) -> Vec<(String, String)> {
        self.inner
            .members
            .values()
            .map(|m| (m.url.clone(), m.key_id.clone()))
            .collect()
    }

    /// A connection to the server with key id `key_id`.
    pub async fn client_of(&self, key_id: &str) -> Result<&Client> {
        self.member(key_id)?.client().await
    }

    /// A connection to the current owner of `name` (for describe, history).
    pub async fn owner_client(&self, name: &str) -> Result<&Client> {
        let id = owner_in(&self.inner.current, name);
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
                .entry(owner_in(&self.inner.current, n))
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
        let m = &self.inner.members[owner_in(&self.inner.current, &name)];
        m.client()
            .await?
            .history(name)
            .await
            .map_err(|e| e.at_server(&m.url))
    }

    /// The servers each name needs a grant from: its owner in the current
    /// list and, while migrating, in the next; by key id, ascending.
    fn plan(&self, names: &[String]) -> BTreeMap<&str, Vec<String>> {
        let mut plan: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for name in names {
            let mut owners = vec![owner_in(&self.inner.current, name)];
            if let Some(next) = &self.inner.next {
                owners.push(owner_in(next, name));
            }
            owners.dedup();
            for id in owners {
                plan.entry(id.as_str()).or_default().push(name.clone());
            }
        }
        plan
    }

    fn member(&self, key_id: &str) -> Result<&Arc<Member>> {
        self.inner.members.get(key_id).ok_or_else(|| Error::Rejected {
            code: tonic::Code::InvalidArgument,
            message: format!(
                "lease_id: a part of this lease is held on server {key_id}, which is in neither server list"
            ),
        })
    }

    /// Releases parts taken by a failed acquire. Best effort: a part that
    /// cannot be released expires at its deadline; the caller gets the
    /// error that made the acquire fail.
    async fn abandon(&self, taken: &[(String, String, Grant)]) {
        join_all(taken.iter().map(|(key_id, url, g)| async move {
            let released = async {
                let client = self.member(key_id)?.client().await?;
                client
                    .release_lease(&g.lease_ref(), ReleaseOptions::default())
                    .await
            };
            if let Err(e) = released.await {
                tracing::warn!(server = %url, lease = %g.lease_id, error = %e,
                    "could not release a part of a failed acquire; it expires at its deadline");
            }
        }))
        .await;
    }
}

fn owner_in<'a>(ids: &'a [String], name: &str) -> &'a String {
    &ids[rendezvous::owner(ids, name).expect("server lists are never empty")]
}

#[async_trait]
impl LeaseBackend for Cluster {
    fn location(&self) -> String {
        let urls = |ids: &[String]| {
            ids.iter()
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

    fn max_ttl(&self) -> Duration {
        self.inner.max_ttl
    }

    async fn acquire_lease(&self, spec: AcquireSpec) -> Result<Grant> {
        let plan = self.plan(&spec.names);
        let single = plan.len() == 1;
        let mut taken: Vec<(String, String, Grant)> = Vec::with_capacity(plan.len());
        // One server at a time, in key-id order: tentatively when there are
        // several, so that holding some parts never breaks anyone's writes.
        for (key_id, names) in &plan {
            let m = self.member(key_id)?;
            let part = AcquireSpec {
                names: names.clone(),
                mode: if single { spec.mode } else { Mode::Tentative },
                ..spec.clone()
            };
            let got = async { m.client().await?.acquire_lease(part).await }.await;
            match got {
                Ok(g) => taken.push(((*key_id).to_owned(), m.url.clone(), g)),
                Err(e) => {
                    self.abandon(&taken).await;
                    return Err(e.at_server(&m.url));
                }
            }
        }
        if !single && spec.mode == Mode::Full {
            let upgraded = join_all(taken.iter().map(|(key_id, url, g)| async move {
                let client = self.member(key_id)?.client().await?;
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

    async fn upgrade_lease(&self, lease: &LeaseRef) -> Result<Grant> {
        let split = parts::split(lease)?;
        let grants = self
            .each_part(lease, |client, part| async move {
                client.upgrade_lease(&part.lease).await
            })
            .await?;
        let taken: Vec<(String, String, Grant)> = split
            .into_iter()
            .zip(grants)
            .map(|(p, g)| {
                let url = self.inner.members[&p.key_id].url.clone();
                (p.key_id, url, g)
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
        let stored = self
            .each_part(lease, |client, part| {
                let options = options.clone();
                async move { client.release_lease(&part.lease, options).await }
            })
            .await?;
        Ok(stored.into_iter().max().unwrap_or(Micros::ZERO))
    }
}

impl Cluster {
    /// Runs `op` on every part of `lease` at once; all answers in part
    /// order, or the first refusal (a refusal outranks a retryable error:
    /// one server refusing means the lease is gone there).
    async fn each_part<'a, T, F, Fut>(&'a self, lease: &LeaseRef, op: F) -> Result<Vec<T>>
    where
        F: Fn(&'a Client, Part) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let split = parts::split(lease)?;
        let mut calls = Vec::with_capacity(split.len());
        for part in split {
            let m = self.member(&part.key_id)?;
            let op = &op;
            calls.push(async move {
                let client = m.client().await?;
                op(client, part).await.map_err(|e| e.at_server(&m.url))
            });
        }
        let mut answers = Vec::with_capacity(calls.len());
        let mut retryable = None;
        for a in join_all(calls).await {
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
}
