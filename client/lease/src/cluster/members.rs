//! One server of a [`Cluster`] (a [`Member`], connected on first use) and
//! how the server lists become members at start: each member's identity
//! learned when the list does not give it, each checked against what the
//! server announces, and a list refused when it names one server twice or
//! under two identities.
//!
//! Separate from routing and the lease protocol: this is what happens once,
//! when a cluster is opened (and again for a member first reached later);
//! nothing here is asked per lease.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bagel_proto::KeyRing;
use bagel_proto::clock::SystemClock;
use futures::StreamExt;
use futures::future::join_all;
use futures::stream::FuturesUnordered;
use tokio::sync::OnceCell;

use super::{Cluster, Inner, List, ServerSpec};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::options::ClientOptions;
use crate::types::Grant;

/// One server of the cluster. Tried at start unless its key is pinned;
/// connected on first use if that failed or was not tried, so a member
/// that is down fails only its own names.
#[derive(Debug)]
pub(super) struct Member {
    /// What names are routed by (see [`ServerSpec::identity`]).
    pub(super) identity: String,
    pub(super) url: String,
    /// The pinned key, and its id.
    pub(super) pinned: Option<(KeyRing, String)>,
    pub(super) client: OnceCell<Client>,
    options: Arc<ClientOptions>,
    /// The client's lists that name this member (current, next), as
    /// identities: checked against the membership it announces.
    pub(super) lists: std::sync::OnceLock<Vec<Vec<String>>>,
}

impl Member {
    pub(super) async fn client(&self) -> Result<&Client> {
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
        self.check_membership(&client)?;
        Ok(client)
    }

    /// Refuses a member whose announced membership (`--members`) is not
    /// the list this client routes it by: the lists disagree on who owns
    /// which name, and the member would refuse the names it does not own
    /// under its lists anyway; better said once, at connect, than name
    /// by name.
    pub(super) fn check_membership(&self, client: &Client) -> Result<()> {
        let announced = client.members();
        for list in self.lists.get().into_iter().flatten() {
            if !bagel_proto::routing::list_agrees(list, announced) {
                return Err(Error::Config {
                    message: format!(
                        "server {} serves in the member lists {announced:?} (its --members), but this \
                         client's list names the members {list:?}: the two disagree on which server \
                         owns which name; fix the list (or the servers' --members)",
                        self.identity
                    ),
                });
            }
        }
        Ok(())
    }

    /// The id of the key it signs with, when known (pinned, or learned).
    pub(super) fn key_id(&self) -> Option<String> {
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
pub(super) fn check_identity(identity: &str, url: &str, announced: &str) -> Result<()> {
    if bagel_proto::routing::identity_matches(identity, announced) {
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

/// Tries to reach each of `members`, for at most `wait`: the outcomes of
/// those that answered or failed by then. The others' connects are
/// dropped, and start again when one of their names is used.
async fn reach_within<'a>(
    members: impl Iterator<Item = &'a Arc<Member>>,
    wait: Duration,
) -> Vec<(&'a Arc<Member>, Result<()>)> {
    let mut pending: FuturesUnordered<_> = members
        .map(|m| async move { (m, m.client().await.map(|_| ())) })
        .collect();
    let mut done = Vec::with_capacity(pending.len());
    let deadline = tokio::time::sleep(wait);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            next = pending.next() => match next {
                Some(outcome) => done.push(outcome),
                None => break,
            },
            () = &mut deadline => break,
        }
    }
    done
}

/// The server id a grant's witness states (field 10 of `WitnessBody`,
/// decoded alone: the client has verified the whole body already).
pub(super) fn witnessed_server_id(grant: &Grant) -> Option<String> {
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

impl Cluster {
    pub(super) async fn open(
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
            let lists = std::iter::once(&current)
                .chain(next.as_ref())
                .filter(|l| l.identities.contains(&m.identity))
                .map(|l| l.identities.clone())
                .collect();
            let _ = m.lists.set(lists);
        }
        for m in members.values() {
            if let Some(client) = reached.remove(&m.url) {
                check_identity(&m.identity, &m.url, client.server_id()).map_err(|e| e.at_server(&m.url))?;
                m.check_membership(&client).map_err(|e| e.at_server(&m.url))?;
                let _ = m.client.set(client);
            }
        }
        // Reach every other unpinned member now, to learn its keys and max
        // TTL and check its ID; one that is down, or silent for
        // `member_wait`, is tried again when one of its names is used.
        let tried = reach_within(
            members
                .values()
                .filter(|m| m.pinned.is_none() && m.client.get().is_none()),
            options.member_wait,
        )
        .await;
        for m in members
            .values()
            .filter(|m| m.pinned.is_none() && m.client.get().is_none())
            .filter(|m| !tried.iter().any(|(t, _)| Arc::ptr_eq(t, m)))
        {
            tracing::warn!(server = %m.url, waited = ?options.member_wait,
                "lease server silent; going on without it, only its names wait for it");
        }
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
                            lists: std::sync::OnceLock::new(),
                        }),
                    );
                }
            }
            out.identities.push(identity);
            out.ids.push(id);
        }
        Ok(out)
    }
}
