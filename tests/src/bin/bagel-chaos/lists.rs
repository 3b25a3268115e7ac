//! The server lists in force, as an operator rolls a migration out
//! (docs/operating.md, "Migration"): step 1 every client on the current
//! list, step 2 on the current and the next (`--next-servers`), step 3 on
//! the next alone. The driver moves [`Lists`] from one step to the next;
//! every client that takes leases from the servers (the workers, the CLI
//! roles, the standby loops, the spelling clients) reads the lists when it
//! starts a lease cycle and says, through its [`Mover`], which generation
//! that cycle runs on. A step is over once every mover runs on it: no
//! lease taken under the lists before is still held by a client that
//! renews it (a lease left to expire outlives its holder by at most the
//! TTL, which the driver waits out before step 3).
//!
//! The watchers follow the lists too, but take no lease: they are not
//! movers (see `watchers.rs`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bagel_client::ServerSpec;
use bagel_client::cluster::rendezvous;
use tokio::sync::{Notify, watch};

/// The lists one generation of the migration puts in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InForce {
    /// 0 before the migration; one more at each step.
    pub generation: u64,
    /// `--servers`.
    pub current: String,
    /// `--next-servers`, while both lists are in force.
    pub next: Option<String>,
}

impl InForce {
    /// The recipe's step these lists are, as `chaos.json` names it.
    pub fn step(&self) -> &'static str {
        match (self.generation, &self.next) {
            (0, _) => STEPS[0],
            (_, Some(_)) => STEPS[1],
            (_, None) => STEPS[2],
        }
    }

    /// The identities of the members of both lists.
    pub fn members(&self) -> Vec<(String, String)> {
        let mut all = members(&self.current);
        for m in self.next.as_deref().map(members).unwrap_or_default() {
            if !all.contains(&m) {
                all.push(m);
            }
        }
        all
    }

    /// Who owns `name` under these lists: its owner in the current list,
    /// and in the next one when that is another member.
    pub fn owners(&self, name: &str) -> Vec<String> {
        let mut owners = vec![owner(&self.current, name)];
        if let Some(next) = &self.next {
            let o = owner(next, name);
            if o != owners[0] {
                owners.push(o);
            }
        }
        owners
    }
}

/// The recipe's steps, as `chaos.json` counts each journey's operations
/// under them.
pub const STEPS: [&str; 3] = ["step1_current", "step2_current_and_next", "step3_next"];

/// Operations counted per step of the migration they ran under.
pub type PerStep = BTreeMap<&'static str, u64>;

/// The members of a list that names each one's identity (`ID=URL`, as the
/// run writes its lists): (identity, URL).
pub fn members(list: &str) -> Vec<(String, String)> {
    ServerSpec::parse_list(list)
        .unwrap_or_default()
        .into_iter()
        .map(|s| (s.identity().to_owned(), s.url))
        .collect()
}

/// The identity of `name`'s owner in `list` (rendezvous hashing over the
/// identities the list states: what every client of the list routes by).
pub fn owner(list: &str, name: &str) -> String {
    let ids: Vec<String> = members(list).into_iter().map(|m| m.0).collect();
    rendezvous::owner(&ids, name)
        .map(|i| ids[i].clone())
        .unwrap_or_default()
}

/// The lists in force and the clients that follow them, shared by the
/// driver (which moves them) and every client.
#[derive(Debug, Clone)]
pub struct Lists {
    in_force: Arc<watch::Sender<InForce>>,
    /// Each mover's name and the generation its current cycle runs on.
    movers: Arc<Mutex<Vec<(String, u64)>>>,
    /// Woken whenever a mover moves.
    moved: Arc<Notify>,
}

/// One client's say in the migration: the generation its current lease
/// cycle runs on.
#[derive(Debug)]
pub struct Mover {
    lists: Lists,
    index: usize,
}

impl Mover {
    /// This client's current cycle runs on `generation`'s lists (so every
    /// cycle before it, on older lists, has ended).
    pub fn on(&self, generation: u64) {
        let mut movers = self.lists.movers.lock().expect("movers");
        let at = &mut movers[self.index].1;
        *at = (*at).max(generation);
        drop(movers);
        self.lists.moved.notify_waiters();
    }
}

impl Lists {
    pub fn new(current: String) -> Lists {
        Lists {
            in_force: Arc::new(watch::Sender::new(InForce {
                generation: 0,
                current,
                next: None,
            })),
            movers: Arc::default(),
            moved: Arc::default(),
        }
    }

    /// The lists in force now.
    pub fn now(&self) -> InForce {
        self.in_force.borrow().clone()
    }

    /// The lists, from now on, as they move.
    pub fn subscribe(&self) -> watch::Receiver<InForce> {
        self.in_force.subscribe()
    }

    /// A client that follows the lists, on the lists in force now.
    pub fn mover(&self, who: String) -> Mover {
        let mut movers = self.movers.lock().expect("movers");
        movers.push((who, self.now().generation));
        Mover {
            lists: self.clone(),
            index: movers.len() - 1,
        }
    }

    /// Puts the next generation's lists in force.
    pub fn set(&self, current: String, next: Option<String>) -> InForce {
        let generation = self.now().generation + 1;
        let in_force = InForce {
            generation,
            current,
            next,
        };
        self.in_force.send_replace(in_force.clone());
        in_force
    }

    /// Waits until every mover runs on `generation` or later; after
    /// `within`, returns those that do not.
    pub async fn all_moved(&self, generation: u64, within: Duration) -> Result<(), Vec<String>> {
        let behind = || -> Vec<String> {
            self.movers
                .lock()
                .expect("movers")
                .iter()
                .filter(|(_, g)| *g < generation)
                .map(|(who, g)| format!("{who} (on generation {g})"))
                .collect()
        };
        let waited = tokio::time::timeout(within, async {
            loop {
                let woken = self.moved.notified();
                tokio::pin!(woken);
                woken.as_mut().enable();
                if behind().is_empty() {
                    return;
                }
                woken.await;
            }
        })
        .await;
        match waited {
            Ok(()) => Ok(()),
            Err(_) => Err(behind()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "member-0=http://127.0.0.1:1,member-1=http://127.0.0.1:2,member-2=http://127.0.0.1:3";
    const NEW: &str = "member-0=http://127.0.0.1:1,member-1=http://127.0.0.1:2,member-3=http://127.0.0.1:4";

    #[test]
    fn a_name_has_its_owner_in_each_list_while_both_are_in_force() {
        let lists = Lists::new(OLD.into());
        // A name the migration moves: owned by the member that leaves.
        let moved = (0..100)
            .map(|i| format!("n{i}"))
            .find(|n| owner(OLD, n) == "member-2")
            .expect("some name is member-2's");
        assert_eq!(lists.now().owners(&moved), ["member-2"]);
        let both = lists.set(OLD.into(), Some(NEW.into()));
        assert_eq!(both.step(), STEPS[1]);
        assert_eq!(
            both.owners(&moved),
            vec!["member-2".to_owned(), owner(NEW, &moved)]
        );
        assert_eq!(both.members().len(), 4);
        let next = lists.set(NEW.into(), None);
        assert_eq!((next.generation, next.step()), (2, STEPS[2]));
        assert_eq!(next.owners(&moved), [owner(NEW, &moved)]);
    }

    #[tokio::test]
    async fn a_step_waits_for_every_mover_and_names_those_behind() {
        let lists = Lists::new(OLD.into());
        let (a, b) = (lists.mover("a".into()), lists.mover("b".into()));
        let g = lists.set(OLD.into(), Some(NEW.into())).generation;
        a.on(g);
        assert_eq!(
            lists.all_moved(g, Duration::from_millis(50)).await,
            Err(vec!["b (on generation 0)".to_owned()])
        );
        let waiting = tokio::spawn({
            let lists = lists.clone();
            async move { lists.all_moved(g, Duration::from_secs(30)).await }
        });
        b.on(g);
        assert_eq!(waiting.await.expect("joined"), Ok(()));
    }
}
