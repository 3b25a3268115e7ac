//! The lease and routing protocol as a `stateright` model: lease servers
//! with IDs that crash and restart, clients with server lists (right,
//! naming a member by a wrong ID, pinned or not, migrating over two
//! lists), acquires, renewals, writes, releases and expiry, in every
//! interleaving up to a horizon of true time.
//!
//! Every decision a transition makes is the project's own function:
//! * which member owns a name: [`routing::owner`] over the list's IDs;
//! * whether a client takes a member for the one its list names:
//!   [`routing::identity_matches`] (at start for unpinned members that
//!   answer, as `Cluster::open` does; on first contact otherwise, as
//!   `Member::connect` does);
//! * whether a server grants a name it may not own: [`Membership::owns`];
//! * whether a name's holder lets a grant through, what the new holder
//!   inherits, its fencing token, and when a restarted server grants
//!   again: [`chain::admit`], [`chain::handoff`], [`chain::next_fencing`],
//!   [`chain::restart_ready_at`] (the server's table decides by them).
//!
//! What it abstracts, and why that is sound for these properties:
//! * time is true time in ticks, and every clock is exact: clock error is
//!   a separate argument (the restart wait's tolerance, the writer's
//!   margin), checked by its own tests;
//! * a request and its answer are one atomic step, and a lease over two
//!   servers (a migration) is granted on both at once or on neither: the
//!   tentative-then-upgrade protocol that makes it so is not modelled;
//! * leases are full leases (a tentative holder is the rule's other
//!   branch, unit-tested in `bagel_lease_core::chain`);
//! * a crashed server forgets everything and restarts with no
//!   granted-until mark (the longest wait: the mark only lengthens it).
//!
//! The properties, on true time (numbered in docs/invariants.md):
//! * **one holder** (L-1; with L-4's restarts, L-5's lists, L-6's
//!   migration steps): at most one client holds an unexpired lease on a
//!   name;
//! * **fencing** (L-2): every server grants each name strictly rising
//!   fencing tokens, also across its restarts;
//! * **watermark** (L-3): every new holder's `min_timestamp` is at or
//!   above every timestamp any earlier holder of the name wrote.

use std::fmt::Write as _;

use bagel_lease_core::chain::{self, HolderView};
use bagel_lease_core::types::Mode;
use bagel_proto::Micros;
use bagel_proto::routing::{self, Membership};
use stateright::{Model, Path, Property};

/// One entry of a client's server list: the ID it writes for the member,
/// the server actually at that URL, and whether its key is pinned (a
/// pinned member is not asked at start).
#[derive(Clone, Debug)]
pub struct Entry {
    pub id: &'static str,
    pub server: usize,
    pub pinned: bool,
}

impl Entry {
    pub fn new(id: &'static str, server: usize) -> Entry {
        Entry {
            id,
            server,
            pinned: false,
        }
    }

    pub fn pinned(id: &'static str, server: usize) -> Entry {
        Entry {
            id,
            server,
            pinned: true,
        }
    }
}

/// A client: what its lists say.
#[derive(Clone, Debug)]
pub struct ClientSetup {
    pub label: &'static str,
    pub current: Vec<Entry>,
    /// While migrating, the next list: a name then needs its owner in both.
    pub next: Option<Vec<Entry>>,
}

/// One tick of true time: a second, so that the few grants of a name a
/// tick can hold stay far below one per microsecond, the rate the fencing
/// rule assumes (`chain::next_fencing`).
pub const TICK_US: u64 = 1_000_000;

/// The most grants (of any name, by any server) in one tick.
pub const GRANTS_PER_TICK: u8 = 2;

/// The world the checker explores.
#[derive(Clone, Debug)]
pub struct RoutingModel {
    /// Each server's true ID (what it announces and signs with).
    pub servers: Vec<&'static str>,
    /// The member lists the servers are started with (`--members`, then
    /// `--next-members`); `None`: servers that do not know the membership
    /// and grant every name.
    pub membership: Option<Vec<Vec<&'static str>>>,
    pub clients: Vec<ClientSetup>,
    pub names: Vec<String>,
    /// Every lease's TTL, and the servers' max TTL, in ticks.
    pub ttl: u64,
    /// The last tick explored.
    pub horizon: u64,
    /// How many server crashes the exploration may include.
    pub crashes: u8,
}

/// A name's state on one server: its holder (client and deadline), the
/// watermark the chain carries, the last fencing token. Times in µs.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Slot {
    pub holder: Option<(u8, u64)>,
    pub watermark: u64,
    pub fencing: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Server {
    pub up: bool,
    pub ready_at: u64,
    pub names: Vec<Slot>,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Phase {
    NotStarted,
    Running,
    /// Refused its list at start (a member answered with another ID).
    Refused,
}

/// A lease a client holds on one name.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Held {
    pub deadline: u64,
    pub min_timestamp: u64,
    pub wrote: Option<u64>,
    /// The servers that granted it.
    pub servers: Vec<u8>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Client {
    pub phase: Phase,
    pub held: Vec<Option<Held>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State {
    pub now: u64,
    pub crashes: u8,
    pub servers: Vec<Server>,
    pub clients: Vec<Client>,
    /// History for the properties: per name, the highest timestamp any
    /// holder wrote; per server and name, the highest fencing token it
    /// ever granted (across restarts).
    pub written: Vec<u64>,
    pub tokens: Vec<Vec<u64>>,
    /// A grant that broke the fencing or the watermark property.
    pub fencing_broken: bool,
    pub watermark_broken: bool,
    /// Grants made in the current tick: at most [`GRANTS_PER_TICK`], or
    /// acquire-release loops within one instant would never end.
    pub grants_this_tick: u8,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Action {
    Tick,
    Start(u8),
    Acquire(u8, u8),
    Renew(u8, u8),
    Write(u8, u8),
    Release(u8, u8),
    Crash(u8),
    Restart(u8),
}

impl RoutingModel {
    fn membership_of(&self, server: usize) -> Option<Membership> {
        let lists = self.membership.as_ref()?;
        let lists = lists
            .iter()
            .map(|l| l.iter().map(|s| (*s).to_owned()).collect())
            .collect();
        Some(Membership::new(self.servers[server], lists).expect("a valid membership"))
    }

    /// The servers a client sends `name` to: its owner under each of the
    /// client's lists (by the IDs the list writes), with the entry that
    /// sent it there.
    fn targets<'a>(&self, client: &'a ClientSetup, name: &str) -> Vec<&'a Entry> {
        let mut out: Vec<&Entry> = Vec::new();
        for list in std::iter::once(&client.current).chain(client.next.as_ref()) {
            let ids: Vec<&str> = list.iter().map(|e| e.id).collect();
            let entry = &list[routing::owner(&ids, name).expect("lists are never empty")];
            if !out.iter().any(|e| e.server == entry.server) {
                out.push(entry);
            }
        }
        out
    }

    fn live(&self, held: &Option<Held>, now: u64) -> bool {
        held.as_ref().is_some_and(|h| now < h.deadline)
    }

    fn holder_view(slot: &Slot) -> Option<HolderView> {
        slot.holder.map(|(_, deadline)| HolderView {
            mode: Mode::Full,
            deadline: Micros::from_micros(deadline),
            expired: false,
        })
    }

    fn fresh_slots(&self, floor: u64) -> Vec<Slot> {
        vec![
            Slot {
                holder: None,
                watermark: floor,
                fencing: 0,
            };
            self.names.len()
        ]
    }

    /// Clients that hold an unexpired lease on name `n`.
    pub fn holders(&self, state: &State, n: usize) -> usize {
        state
            .clients
            .iter()
            .filter(|c| self.live(&c.held[n], state.now))
            .count()
    }

    /// Whether `state` breaks one of the safety properties.
    pub fn broken(&self, state: &State) -> bool {
        state.fencing_broken
            || state.watermark_broken
            || (0..self.names.len()).any(|n| self.holders(state, n) > 1)
    }

    /// A counterexample as a person reads it: each step, and what it did,
    /// up to the first state that breaks a property.
    pub fn describe(&self, path: &Path<State, Action>) -> String {
        let mut out = String::new();
        let steps = path.clone().into_vec();
        for (i, (state, action)) in steps.iter().enumerate() {
            if self.broken(state) {
                let _ = writeln!(out, "  t={}s: broken here", state.now / TICK_US);
                break;
            }
            let Some(action) = action else { continue };
            let after = &steps.get(i + 1).map(|(s, _)| s).unwrap_or(state);
            let name = |n: &u8| self.names[*n as usize].as_str();
            let client = |c: &u8| self.clients[*c as usize].label;
            let server = |s: &u8| self.servers[*s as usize];
            let line = match action {
                Action::Tick => "a second passes".to_owned(),
                Action::Start(c) => format!(
                    "client {:?} opens its server list: {:?}",
                    client(c),
                    after.clients[*c as usize].phase
                ),
                Action::Acquire(c, n) => {
                    let held = after.clients[*c as usize].held[*n as usize]
                        .as_ref()
                        .expect("granted");
                    let by: Vec<&str> = held.servers.iter().map(server).collect();
                    format!(
                        "client {:?} acquires {:?}: granted by {by:?} until t={}s (min_timestamp {} us)",
                        client(c),
                        name(n),
                        held.deadline / TICK_US,
                        held.min_timestamp
                    )
                }
                Action::Renew(c, n) => format!("client {:?} renews {:?}", client(c), name(n)),
                Action::Write(c, n) => format!(
                    "client {:?} writes to {:?} at {} us",
                    client(c),
                    name(n),
                    after.clients[*c as usize].held[*n as usize]
                        .as_ref()
                        .and_then(|h| h.wrote)
                        .unwrap_or(0)
                ),
                Action::Release(c, n) => format!("client {:?} releases {:?}", client(c), name(n)),
                Action::Crash(s) => format!("server {:?} crashes", server(s)),
                Action::Restart(s) => format!(
                    "server {:?} restarts, grants from t={}s",
                    server(s),
                    after.servers[*s as usize].ready_at / TICK_US
                ),
            };
            let _ = writeln!(out, "  t={}s {line}", state.now / TICK_US);
        }
        out
    }
}

impl Model for RoutingModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            crashes: 0,
            servers: (0..self.servers.len())
                .map(|_| Server {
                    up: true,
                    ready_at: 0,
                    names: self.fresh_slots(0),
                })
                .collect(),
            clients: self
                .clients
                .iter()
                .map(|_| Client {
                    phase: Phase::NotStarted,
                    held: vec![None; self.names.len()],
                })
                .collect(),
            written: vec![0; self.names.len()],
            tokens: vec![vec![0; self.names.len()]; self.servers.len()],
            fencing_broken: false,
            watermark_broken: false,
            grants_this_tick: 0,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.now < self.horizon * TICK_US {
            actions.push(Action::Tick);
        }
        for (c, client) in state.clients.iter().enumerate() {
            let c = c as u8;
            match client.phase {
                Phase::NotStarted => actions.push(Action::Start(c)),
                Phase::Refused => {}
                Phase::Running => {
                    for (n, held) in client.held.iter().enumerate() {
                        let n = n as u8;
                        if let Some(h) = held.as_ref().filter(|h| state.now < h.deadline) {
                            actions.extend([Action::Renew(c, n), Action::Release(c, n)]);
                            // One write a tick: timestamps a microsecond
                            // apart would only multiply the states.
                            if h.wrote.is_none_or(|w| w < state.now) {
                                actions.push(Action::Write(c, n));
                            }
                        } else if state.grants_this_tick < GRANTS_PER_TICK {
                            actions.push(Action::Acquire(c, n));
                        }
                    }
                }
            }
        }
        for (s, server) in state.servers.iter().enumerate() {
            if server.up && state.crashes < self.crashes {
                actions.push(Action::Crash(s as u8));
            }
            if !server.up {
                actions.push(Action::Restart(s as u8));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        let now = state.now;
        match action {
            Action::Tick => {
                state.now += TICK_US;
                state.grants_this_tick = 0;
            }
            Action::Start(c) => {
                // Cluster::open: every unpinned member that answers is
                // checked; one announcing another ID refuses the list.
                let setup = &self.clients[c as usize];
                let entries = setup.current.iter().chain(setup.next.iter().flatten());
                let wrong = entries
                    .filter(|e| !e.pinned && state.servers[e.server].up)
                    .any(|e| !routing::identity_matches(e.id, self.servers[e.server]));
                state.clients[c as usize].phase = if wrong { Phase::Refused } else { Phase::Running };
            }
            Action::Acquire(c, n) => {
                let setup = &self.clients[c as usize];
                let name = &self.names[n as usize];
                let targets = self.targets(setup, name);
                for entry in &targets {
                    let server = &state.servers[entry.server];
                    // Member::connect checks the ID on first contact.
                    let reached =
                        server.up && routing::identity_matches(entry.id, self.servers[entry.server]);
                    let owns = self
                        .membership_of(entry.server)
                        .is_none_or(|m| m.owns(name).is_ok());
                    let slot = &server.names[n as usize];
                    let admitted =
                        chain::admit(Self::holder_view(slot), Mode::Full, Micros::from_micros(now)).grants();
                    if !(reached && now >= server.ready_at && owns && admitted) {
                        return None;
                    }
                }
                let deadline = now + self.ttl * TICK_US;
                let mut min_timestamp = 0;
                let mut servers = Vec::new();
                for entry in targets {
                    let s = entry.server;
                    let slot = &mut state.servers[s].names[n as usize];
                    let handoff =
                        chain::handoff(Micros::from_micros(slot.watermark), Self::holder_view(slot));
                    let fencing = chain::next_fencing(slot.fencing, Micros::from_micros(now));
                    if fencing <= state.tokens[s][n as usize] {
                        state.fencing_broken = true;
                    }
                    state.tokens[s][n as usize] = fencing;
                    *slot = Slot {
                        holder: Some((c, deadline)),
                        watermark: handoff.watermark.as_micros(),
                        fencing,
                    };
                    min_timestamp = min_timestamp.max(handoff.watermark.as_micros());
                    servers.push(s as u8);
                }
                state.grants_this_tick += 1;
                if min_timestamp < state.written[n as usize] {
                    state.watermark_broken = true;
                }
                state.clients[c as usize].held[n as usize] = Some(Held {
                    deadline,
                    min_timestamp,
                    wrote: None,
                    servers,
                });
            }
            Action::Renew(c, n) => {
                let held = state.clients[c as usize].held[n as usize].clone()?;
                let deadline = now + self.ttl * TICK_US;
                for &s in &held.servers {
                    let server = &state.servers[s as usize];
                    let slot = &server.names[n as usize];
                    if !server.up || slot.holder != Some((c, held.deadline)) {
                        return None;
                    }
                }
                for &s in &held.servers {
                    state.servers[s as usize].names[n as usize].holder = Some((c, deadline));
                }
                state.clients[c as usize].held[n as usize].as_mut()?.deadline = deadline;
            }
            Action::Write(c, n) => {
                let held = state.clients[c as usize].held[n as usize].as_mut()?;
                // The writer's rule: strictly above the inherited watermark
                // and its own last write, strictly below the deadline.
                let ts = now
                    .max(held.min_timestamp + 1)
                    .max(held.wrote.map_or(0, |w| w + 1));
                debug_assert!(held.wrote.is_none_or(|w| w < now));
                if ts >= held.deadline {
                    return None;
                }
                held.wrote = Some(ts);
                state.written[n as usize] = state.written[n as usize].max(ts);
            }
            Action::Release(c, n) => {
                let held = state.clients[c as usize].held[n as usize].take()?;
                for s in held.servers {
                    let server = &mut state.servers[s as usize];
                    let slot = &mut server.names[n as usize];
                    if server.up && slot.holder == Some((c, held.deadline)) && now < held.deadline {
                        slot.holder = None;
                        slot.watermark = slot.watermark.max(held.wrote.unwrap_or(0));
                    }
                }
            }
            Action::Crash(s) => {
                let server = &mut state.servers[s as usize];
                server.up = false;
                server.names = self.fresh_slots(0);
                state.crashes += 1;
            }
            Action::Restart(s) => {
                let ready_at = chain::restart_ready_at(
                    Micros::from_micros(now),
                    Micros::ZERO,
                    std::time::Duration::from_micros(self.ttl * TICK_US),
                    std::time::Duration::ZERO,
                )
                .as_micros();
                let server = &mut state.servers[s as usize];
                server.up = true;
                server.ready_at = ready_at;
                // Every first grant after a restart follows an unknown
                // predecessor with the restart's floor as its watermark.
                server.names = self.fresh_slots(ready_at);
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("one holder", |m: &RoutingModel, s: &State| {
                (0..m.names.len()).all(|n| m.holders(s, n) <= 1)
            }),
            Property::always("fencing", |_, s: &State| !s.fencing_broken),
            Property::always("watermark", |_, s: &State| !s.watermark_broken),
            // Not vacuous: some run grants a name.
            Property::sometimes("a grant", |_, s: &State| {
                s.clients.iter().any(|c| c.held.iter().any(Option::is_some))
            }),
        ]
    }
}

/// A name that the list `[a, x]` (member `b` written as `x`) routes to
/// `a`, while `b` owns it under the right list `[a, b]`.
pub fn misrouted_name() -> String {
    (0..)
        .map(|i| format!("tenant-{i}"))
        .find(|n| routing::owner(&["a", "b"], n) == Some(1) && routing::owner(&["a", "x"], n) == Some(0))
        .expect("such a name exists")
}

/// A name that moves from its owner under `[a, b]` to `c` under
/// `[a, b, c]`.
pub fn moving_name() -> String {
    (0..)
        .map(|i| format!("tenant-{i}"))
        .find(|n| routing::owner(&["a", "b", "c"], n) == Some(2))
        .expect("such a name exists")
}
