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
//! names. Keys are learned (or pinned) to check witnesses; they play no
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
use crate::backend::{
    AcquireSpec, BackendInfo, Call, LeaseBackend, Listed, ListedAt, Listing, NameRoute, Offer,
};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::options::ClientOptions;
use crate::types::{Grant, History, LeaseRef, Metadata, Mode, NameState, ReleaseOptions, Renewal};
use parts::Part;

/// One server of a list: optionally an identity, its URL, and optionally
/// the public key it must sign with. Written `[ID=]URL[#KEY]` (ID:
/// letters, digits, `.`, `_`, `-`, `:`; KEY: 64 hex digits, the raw ed25519
/// public key `bagel-server` prints at start).
///
/// Names are routed by the server's identity: the ID when given (the
/// server must announce it: its `--server-id`), else what the server
/// announces when first reached, at start. Give IDs so that clients can
/// start while a member is down, and to catch a list that names the wrong
/// server. A pinned key is trusted without asking the server; an unpinned
/// one is learned when the server is first reached.
#[derive(Clone, PartialEq, Eq)]
pub struct ServerSpec {
    /// The identity names are routed by, when not the URL.
    pub id: Option<String>,
    pub url: String,
    pub key: Option<[u8; 32]>,
}

impl fmt::Debug for ServerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(id) = &self.id {
            write!(f, "{id}=")?;
        }
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
        // `ID=` only before the URL's scheme: an `=` later is the URL's.
        let (id, rest) = match s.split_once('=') {
            Some((id, rest)) if !id.contains("://") => (Some(id), rest),
            _ => (None, s),
        };
        if let Some(id) = id {
            let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':');
            if id.is_empty() || id.len() > 64 || !id.chars().all(ok) {
                return Err(format!(
                    "server {s:?}: the identity before '=' must be 1 to 64 letters, digits, '.', '_', \
                     '-' or ':' (the server's --server-id, as `bagel server-info` shows it)"
                ));
            }
        }
        let (url, key) = match rest.split_once('#') {
            None => (rest, None),
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
            id: id.map(str::to_owned),
            url: url.to_owned(),
            key,
        })
    }
}

impl ServerSpec {
    /// A server known by its URL alone.
    pub fn url(url: impl Into<String>) -> Self {
        ServerSpec {
            id: None,
            url: url.into(),
            key: None,
        }
    }

    /// What names are routed by: the ID (given, or learned from the server
    /// by [`Cluster::connect`]), else the URL as written (only until the
    /// cluster has learned the ID).
    pub fn identity(&self) -> &str {
        self.id.as_deref().unwrap_or(&self.url)
    }

    /// The member id that names this server in lease ids over several
    /// servers (`MEMBERID:LEASEID,...`): 16 hex digits of
    /// SHA-256(`"bagel.v1 member\0"` ‖ identity), so it contains neither
    /// `:` nor `,` whatever the identity.
    pub fn member_id(&self) -> String {
        use sha2::{Digest as _, Sha256};
        let digest = Sha256::new()
            .chain_update(b"bagel.v1 member\0")
            .chain_update(self.identity().as_bytes())
            .finalize();
        bagel_proto::hex::encode(&digest[..8])
    }

    /// A comma-separated list (`--servers`).
    pub fn parse_list(list: &str) -> Result<Vec<ServerSpec>, String> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::parse)
            .collect()
    }
}

/// One server of the cluster. Tried at start unless its key is pinned;
/// connected on first use if that failed or was not tried, so a member
/// that is down fails only its own names.
#[derive(Debug)]
struct Member {
    /// What names are routed by (see [`ServerSpec::identity`]).
    identity: String,
    url: String,
    /// The pinned key, and its id.
    pinned: Option<(KeyRing, String)>,
    client: OnceCell<Client>,
    options: Arc<ClientOptions>,
}

impl Member {
    async fn client(&self) -> Result<&Client> {
        self.client
            .get_or_try_init(|| self.connect())
            .await
            .map_err(|e| e.at_server(&self.url))
    }

    /// Connects, trusting the pinned key (the client checks the server
    /// presents it), else the keys the server publishes, and checks that
    /// the server is the one names are routed to: it announces the
    /// member's identity.
    async fn connect(&self) -> Result<Client> {
        let client = match &self.pinned {
            None => Client::connect_with(&self.url, &self.options).await?,
            Some((ring, _)) => Client::connect_pinned_with(&self.url, ring.clone(), &self.options).await?,
        };
        check_identity(&self.identity, &self.url, client.server_id())?;
        Ok(client)
    }

    /// The id of the key it signs with, when known (pinned, or learned).
    fn key_id(&self) -> Option<String> {
        match (&self.pinned, self.client.get()) {
            (Some((_, id)), _) => Some(id.clone()),
            (None, Some(c)) => c.signing_key_id(),
            (None, None) => None,
        }
    }
}

/// Refuses a server that announces another identity than the one the
/// list routes names to it by: two clients whose lists disagree on which
/// server is which would route one name to two servers.
fn check_identity(identity: &str, url: &str, announced: &str) -> Result<()> {
    if identity == announced {
        return Ok(());
    }
    Err(Error::Invalid {
        field: None,
        reason: format!(
            "it announces server id {announced:?}, but the server list names it {identity:?}: \
             names are routed by the server's own id, so this list would send them to the wrong \
             server; write {announced}={url} (or start that server with --server-id {identity})"
        ),
    })
}

/// The server id a grant's witness states (field 10 of `WitnessBody`,
/// decoded alone: the client has verified the whole body already).
fn witnessed_server_id(grant: &Grant) -> Option<String> {
    #[derive(Clone, PartialEq, prost::Message)]
    struct ServerId {
        #[prost(string, tag = "10")]
        server_id: String,
    }
    let w = grant.witnesses.first()?;
    prost::Message::decode(w.body())
        .ok()
        .map(|b: ServerId| b.server_id)
        .filter(|id| !id.is_empty())
}

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

    async fn open(
        current: &[ServerSpec],
        next: Option<&[ServerSpec]>,
        options: ClientOptions,
    ) -> Result<Self> {
        let options = Arc::new(options);
        // Members without an ID are asked for theirs first: it routes names.
        let mut reached = BTreeMap::new();
        let current = Self::identify(current, "--servers", &options, &mut reached).await?;
        let next = match next {
            Some(next) => Some(Self::identify(next, "--next-servers", &options, &mut reached).await?),
            None => None,
        };
        let mut members = BTreeMap::new();
        let current = Self::join(&current, "servers", &options, &mut members)?;
        let next = match next {
            Some(next) => Some(Self::join(&next, "next servers", &options, &mut members)?),
            None => None,
        };
        for m in members.values() {
            if let Some(client) = reached.remove(&m.url) {
                check_identity(&m.identity, &m.url, client.server_id()).map_err(|e| e.at_server(&m.url))?;
                let _ = m.client.set(client);
            }
        }
        // Reach every other unpinned member now, to learn its keys and max
        // TTL; one that is down is tried again when one of its names is used.
        let tried = join_all(
            members
                .values()
                .filter(|m| m.pinned.is_none() && m.client.get().is_none())
                .map(|m| async move { (m, m.client().await.map(|_| ())) }),
        )
        .await;
        let mut first_error = None;
        for (m, outcome) in tried {
            match outcome {
                Ok(()) => {}
                // Not a server that is down for now (a wrong ID, a pinned
                // key or TLS set up wrong): the list is wrong, and using it
                // would route names elsewhere than other clients do.
                Err(e) if !e.is_retryable() => return Err(e),
                Err(e) => {
                    tracing::warn!(server = %m.url, error = %e,
                        "lease server unreachable; only its names fail until it answers");
                    first_error = first_error.or(Some(e));
                }
            }
        }
        let reached = members
            .values()
            .any(|m| m.pinned.is_some() || m.client.get().is_some());
        if let (false, Some(e)) = (reached, first_error) {
            return Err(e);
        }
        Ok(Cluster {
            inner: Arc::new(Inner {
                members,
                current,
                next,
                clock: Arc::new(SystemClock),
            }),
        })
    }

    /// `list` with every member's identity: as given (`ID=`), else as the
    /// server announces it, asked now (`reached` keeps the connections,
    /// by URL). A member without an ID that cannot be reached is refused:
    /// its identity decides which names are its.
    async fn identify(
        list: &[ServerSpec],
        flag: &str,
        options: &Arc<ClientOptions>,
        reached: &mut BTreeMap<String, Client>,
    ) -> Result<Vec<ServerSpec>> {
        let ask: Vec<&ServerSpec> = list
            .iter()
            .filter(|s| s.id.is_none() && !reached.contains_key(&s.url))
            .collect();
        let answers = join_all(ask.iter().map(|spec| async move {
            let client = match spec.key {
                None => Client::connect_with(&spec.url, options).await,
                Some(key) => {
                    let mut ring = KeyRing::new();
                    ring.insert_bytes(&key)
                        .map_err(|e| Error::invalid("servers", e.to_string()))?;
                    Client::connect_pinned_with(&spec.url, ring, options).await
                }
            };
            // A refusal (a pinned key the server does not present, TLS
            // set up wrong) says what it says; only a server that cannot be
            // reached is told apart.
            client.map_err(|e| {
                if !e.is_retryable() {
                    return e.at_server(&spec.url);
                }
                Error::Unavailable {
                    retry_after: None,
                    message: format!(
                        "{flag}: {} has no ID and cannot be reached to learn its server id, which \
                         decides which names are its ({e}); give each member as ID=URL (its \
                         --server-id, as `bagel server-info` shows it) to start while a member is down",
                        spec.url
                    ),
                }
            })
        }))
        .await;
        for (spec, answer) in ask.into_iter().zip(answers) {
            reached.insert(spec.url.clone(), answer?);
        }
        Ok(list
            .iter()
            .map(|spec| ServerSpec {
                id: spec
                    .id
                    .clone()
                    .or_else(|| reached.get(&spec.url).map(|c| c.server_id().to_owned())),
                ..spec.clone()
            })
            .collect())
    }

    /// The members of one list (each once, whichever lists name it).
    /// Nothing is asked of the servers: a list is checked by what it says.
    fn join(
        list: &[ServerSpec],
        what: &str,
        options: &Arc<ClientOptions>,
        members: &mut BTreeMap<String, Arc<Member>>,
    ) -> Result<List> {
        let refuse = |message: String| Error::Invalid {
            field: None,
            reason: message,
        };
        if list.is_empty() {
            return Err(refuse(format!("{what}: the list is empty")));
        }
        let mut out = List {
            identities: Vec::with_capacity(list.len()),
            ids: Vec::with_capacity(list.len()),
        };
        for spec in list {
            let identity = spec.identity().to_owned();
            if out.identities.contains(&identity) {
                return Err(refuse(format!(
                    "{what}: {spec:?} names server {identity} a second time"
                )));
            }
            let id = spec.member_id();
            let pinned = match spec.key {
                Some(key) => {
                    let mut ring = KeyRing::new();
                    let key_id = ring
                        .insert_bytes(&key)
                        .map_err(|e| refuse(format!("{what}: {spec:?}: {e}")))?;
                    Some((ring, key_id))
                }
                None => None,
            };
            // One server, one member: the same URL under two identities
            // would own names twice.
            if let Some(m) = members
                .values()
                .find(|m| m.url == spec.url && m.identity != identity)
            {
                return Err(refuse(format!(
                    "{what}: {} is given both as {} and as {identity}",
                    spec.url, m.identity
                )));
            }
            match members.get(&id) {
                Some(m) if m.url != spec.url => {
                    return Err(refuse(format!(
                        "{what}: server {identity} is given as both {} and {}",
                        m.url, spec.url
                    )));
                }
                Some(m) if pinned.as_ref().map(|p| &p.1) != m.pinned.as_ref().map(|p| &p.1) => {
                    return Err(refuse(format!(
                        "{what}: server {identity} is given with two different keys (or pinned in one list only)"
                    )));
                }
                Some(_) => {}
                None => {
                    members.insert(
                        id.clone(),
                        Arc::new(Member {
                            identity: identity.clone(),
                            url: spec.url.clone(),
                            pinned,
                            client: OnceCell::new(),
                            options: Arc::clone(options),
                        }),
                    );
                }
            }
            out.identities.push(identity);
            out.ids.push(id);
        }
        Ok(out)
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
}

#[cfg(test)]
mod tests {
    use super::ServerSpec;

    #[test]
    fn a_server_entry_may_name_its_identity_with_or_without_a_key() {
        let plain: ServerSpec = "bagel-1=http://127.0.0.1:7000".parse().unwrap();
        assert_eq!(
            (plain.id.as_deref(), plain.url.as_str(), plain.key),
            (Some("bagel-1"), "http://127.0.0.1:7000", None)
        );
        let key = "ab".repeat(32);
        let pinned: ServerSpec = format!("bagel-2=http://127.0.0.1:7001#{key}").parse().unwrap();
        assert_eq!(
            (pinned.id.as_deref(), pinned.url.as_str(), pinned.key),
            (Some("bagel-2"), "http://127.0.0.1:7001", Some([0xab; 32]))
        );
        let bare: ServerSpec = "http://127.0.0.1:7002".parse().unwrap();
        assert_eq!((bare.id, bare.url.as_str()), (None, "http://127.0.0.1:7002"));
        assert!("=http://127.0.0.1:7002".parse::<ServerSpec>().is_err());
    }
}
