//! Who holds what: names held and records kept, counted per owner and per
//! peer, so that no one client can take the whole server.
//!
//! Why: without accounts one client can hold millions of names in a
//! minute (gigabytes), and its churn makes the server forget *other*
//! clients' idle records (the oldest first, whoever they were). So every
//! name record is charged to the account (owner, peer) of its last holder;
//! names held are capped in total, per owner and per peer; and when
//! records must be forgotten, the heaviest peer's, then the heaviest
//! owner's go first.
//!
//! Without mutual TLS an owner is whatever the client says, so the per-peer
//! count is what binds a hostile client; with mutual TLS the owner is the
//! certificate's subject. All clients behind one address (a NAT, a proxy,
//! 127.0.0.1) share the per-peer count.
//!
//! The counters are [`DashMap`]s keyed by owner and by peer: one entry per
//! key, looked up once per acquire, with no order between keys needed (the
//! lease table itself must lock several names at once in a global order,
//! which is why it is a shard array instead).

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;

/// How much one owner or one peer uses.
#[derive(Debug, Default)]
pub struct Usage {
    /// Names held (live holders not yet released, broken or swept).
    held: AtomicUsize,
    /// Name records charged to it (held or idle).
    records: AtomicUsize,
}

impl Usage {
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    pub fn records(&self) -> usize {
        self.records.load(Ordering::Acquire)
    }
}

/// Who a name record is charged to: its last holder's owner and address.
/// One per (owner, peer), shared by all its records: 8 bytes per record.
#[derive(Debug)]
pub struct Account {
    pub owner: Arc<str>,
    pub peer: Option<IpAddr>,
    owner_use: Arc<Usage>,
    peer_use: Option<Arc<Usage>>,
}

impl Account {
    fn usages(&self) -> impl Iterator<Item = &Usage> {
        std::iter::once(&*self.owner_use).chain(self.peer_use.as_deref())
    }

    pub(super) fn add_held(&self, n: usize) {
        for u in self.usages() {
            u.held.fetch_add(n, Ordering::AcqRel);
        }
    }

    pub(super) fn sub_held(&self, n: usize) {
        for u in self.usages() {
            u.held.fetch_sub(n, Ordering::AcqRel);
        }
    }

    pub(super) fn add_record(&self) {
        for u in self.usages() {
            u.records.fetch_add(1, Ordering::AcqRel);
        }
    }

    pub(super) fn sub_record(&self) {
        for u in self.usages() {
            u.records.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Records charged to its peer and to its owner: who has the most
    /// loses records first when some must be forgotten.
    pub(super) fn weight(&self) -> (usize, usize) {
        (
            self.peer_use.as_ref().map_or(0, |u| u.records()),
            self.owner_use.records(),
        )
    }
}

/// Limits on names held; see the `--max-held-names*` flags.
#[derive(Clone, Copy, Debug)]
pub struct HeldLimits {
    pub total: usize,
    pub per_owner: usize,
    pub per_peer: usize,
}

impl Default for HeldLimits {
    fn default() -> Self {
        HeldLimits {
            total: usize::MAX,
            per_owner: usize::MAX,
            per_peer: usize::MAX,
        }
    }
}

/// Every account, and the totals.
#[derive(Debug, Default)]
pub struct Accounts {
    owners: DashMap<Arc<str>, Arc<Usage>>,
    peers: DashMap<IpAddr, Arc<Usage>>,
    accounts: DashMap<(Arc<str>, Option<IpAddr>), Arc<Account>>,
    held: AtomicUsize,
}

impl Accounts {
    /// The account of `owner` at `peer`, made on first use.
    pub fn get(&self, owner: &Arc<str>, peer: Option<IpAddr>) -> Arc<Account> {
        let key = (Arc::clone(owner), peer);
        if let Some(a) = self.accounts.get(&key) {
            return Arc::clone(&a);
        }
        let owner_use = Arc::clone(&self.owners.entry(Arc::clone(owner)).or_default());
        let peer_use = peer.map(|p| Arc::clone(&self.peers.entry(p).or_default()));
        let account = self.accounts.entry(key).or_insert_with(|| {
            Arc::new(Account {
                owner: Arc::clone(owner),
                peer,
                owner_use,
                peer_use,
            })
        });
        Arc::clone(&account)
    }

    /// Reserves `n` more held names for `account`, or says which limit it
    /// would pass. The caller gives them back with [`Accounts::unhold`] if
    /// the grant does not happen.
    pub fn hold(&self, account: &Account, n: usize, limits: &HeldLimits) -> Result<(), crate::error::Error> {
        use crate::error::Error;
        let total = self.held.fetch_add(n, Ordering::AcqRel) + n;
        account.add_held(n);
        let refusal = if total > limits.total {
            Some(Error::limit(
                "names held on this server",
                limits.total,
                "names",
                "max-held-names",
            ))
        } else if account.owner_use.held() > limits.per_owner {
            Some(Error::limit(
                format!("names held by owner {}", crate::validate::echo(&account.owner)),
                limits.per_owner,
                "names",
                "max-held-names-per-owner",
            ))
        } else if account
            .peer_use
            .as_ref()
            .is_some_and(|u| u.held() > limits.per_peer)
        {
            Some(Error::limit(
                format!(
                    "names held from address {}",
                    account.peer.map_or_else(|| "?".to_owned(), |p| p.to_string())
                ),
                limits.per_peer,
                "names",
                "max-held-names-per-peer",
            ))
        } else {
            None
        };
        match refusal {
            Some(e) => {
                self.unhold(account, n);
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// Gives back `n` held names of `account`.
    pub fn unhold(&self, account: &Account, n: usize) {
        self.held.fetch_sub(n, Ordering::AcqRel);
        account.sub_held(n);
    }

    /// Names held in all.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// What `owner` uses, if it ever held anything still remembered.
    pub fn owner_usage(&self, owner: &str) -> Option<Arc<Usage>> {
        self.owners.get(owner).map(|u| Arc::clone(&u))
    }

    /// Drops accounts no record refers to any more, then owners and peers
    /// no account refers to.
    pub fn sweep(&self) {
        self.accounts.retain(|_, a| Arc::strong_count(a) > 1);
        self.owners.retain(|_, u| Arc::strong_count(u) > 1);
        self.peers.retain(|_, u| Arc::strong_count(u) > 1);
    }
}
