//! The turns among `List` pages (`--list-pages` of them read at once),
//! given to callers by identity in turn.
//!
//! Why: pages wait for a turn, and a semaphore serves its waiters first
//! come, first served: one tenant with 1,000 Lists outstanding made every
//! other tenant's List wait behind all of them (1.0–1.8 s instead of
//! ~1 ms). Here each identity waiting has its own queue (first come, first
//! served within it), and a freed turn goes to the identities waiting
//! round-robin: a flood from one identity costs another at most one page
//! of the flood per page of its own. An identity may have at most
//! `per_identity` calls queued (`--max-queued-lists-per-identity`); one
//! more is refused, `RESOURCE_EXHAUSTED` naming the flag.
//!
//! The identity is the caller's under the access policy (its token's or
//! its certificate's), or without one the client certificate's subject,
//! or else the client's address: on a server with no policy and no client
//! certificates, everything behind one address is one identity (see
//! `Service::list_identity`).
//!
//! What each identity has queued and its refusals are on `/metrics` as
//! the `queued_lists` pool of the shares' series, under the shares' rule:
//! the first [`crate::shares::METRIC_IDENTITIES`] identities by name, the rest as
//! `(other)`, so a flood of identities cannot grow the label set.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

use crate::error::Error;
use crate::shares::{Labels, Usage};

/// See the module docs.
#[derive(Debug)]
pub struct ListTurns {
    per_identity: usize,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Turns no page holds.
    free: usize,
    /// Calls waiting, by identity, oldest first.
    queues: HashMap<Arc<str>, VecDeque<Waiter>>,
    /// The identities with calls waiting, the next to be served first.
    ring: VecDeque<Arc<str>>,
    /// Calls waiting over all identities (for `/metrics`).
    waiting: usize,
    next_id: u64,
    /// The identities the metrics name (those that queued first), and
    /// the refusals at `per_identity`.
    labels: Labels,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    /// Told when the turn is its own.
    given: oneshot::Sender<()>,
}

/// One turn, held until dropped.
#[derive(Debug)]
pub struct Turn {
    turns: Arc<ListTurns>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.turns.give_back();
    }
}

impl ListTurns {
    /// `turns` read at once (at least 1), and at most `per_identity` calls
    /// of one identity waiting (at least 1).
    pub fn new(turns: usize, per_identity: usize) -> Arc<Self> {
        Arc::new(ListTurns {
            per_identity: per_identity.max(1),
            state: Mutex::new(State {
                free: turns.max(1),
                queues: HashMap::new(),
                ring: VecDeque::new(),
                waiting: 0,
                next_id: 0,
                labels: Labels::default(),
            }),
        })
    }

    /// Calls waiting for a turn now, over all identities.
    pub fn waiting(&self) -> usize {
        self.lock().waiting
    }

    /// What each identity has waiting and was refused, by metric label
    /// (the named identities, each even at zero, then `(other)` if any).
    pub fn usage(&self) -> Vec<Usage> {
        let state = self.lock();
        state.labels.usage(
            state
                .queues
                .iter()
                .map(|(identity, queue)| (identity, queue.len() as u64)),
        )
    }

    /// A turn for a call of `identity`: at once if one is free and no one
    /// waits, else after the identities waiting before it had theirs, in
    /// turn. Refused when `identity` has `per_identity` calls waiting.
    pub async fn turn(self: &Arc<Self>, identity: &Arc<str>) -> Result<Turn, Error> {
        let (given, id) = {
            let mut state = self.lock();
            if state.free > 0 && state.ring.is_empty() {
                state.free -= 1;
                return Ok(Turn {
                    turns: Arc::clone(self),
                });
            }
            state.labels.seen(identity);
            let queued = state.queues.get(identity).map_or(0, VecDeque::len);
            if queued >= self.per_identity {
                state.labels.refused(identity);
                return Err(Error::limit(
                    format!(
                        "List calls of identity {} waiting for a page turn",
                        crate::validate::echo(identity)
                    ),
                    self.per_identity,
                    "calls",
                    "max-queued-lists-per-identity",
                ));
            }
            let (tx, rx) = oneshot::channel();
            let id = state.next_id;
            state.next_id += 1;
            if queued == 0 {
                state.ring.push_back(Arc::clone(identity));
            }
            state
                .queues
                .entry(Arc::clone(identity))
                .or_default()
                .push_back(Waiter { id, given: tx });
            state.waiting += 1;
            (rx, id)
        };
        let mut waiting = Waiting {
            turns: Arc::clone(self),
            identity: Arc::clone(identity),
            id,
            given,
            done: false,
        };
        match (&mut waiting.given).await {
            Ok(()) => {
                waiting.done = true;
                Ok(Turn {
                    turns: Arc::clone(self),
                })
            }
            // The sender is dropped only with the turns themselves.
            Err(_) => {
                waiting.done = true;
                Err(Error::ShuttingDown)
            }
        }
    }

    /// A turn is free: it goes to the next identity in the ring, to its
    /// oldest call still waiting.
    fn give_back(&self) {
        let mut state = self.lock();
        while let Some(identity) = state.ring.pop_front() {
            let queue = state.queues.get_mut(&identity).expect("in the ring: queued");
            let waiter = queue.pop_front().expect("in the ring: not empty");
            if queue.is_empty() {
                state.queues.remove(&identity);
            } else {
                state.ring.push_back(identity);
            }
            state.waiting -= 1;
            // A waiter gone (its call dropped) removes itself; one that is
            // going right now gives the turn back as it goes (`Waiting`).
            if waiter.given.send(()).is_ok() {
                return;
            }
        }
        state.free += 1;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A call waiting for its turn; dropped before it got one (its client went
/// away), it leaves the queue, and a turn given to it meanwhile is given
/// on.
struct Waiting {
    turns: Arc<ListTurns>,
    identity: Arc<str>,
    id: u64,
    given: oneshot::Receiver<()>,
    done: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.given.close();
        if self.given.try_recv().is_ok() {
            // Given its turn as it went: give it on.
            self.turns.give_back();
            return;
        }
        let mut state = self.turns.lock();
        let Some(queue) = state.queues.get_mut(&self.identity) else {
            return;
        };
        let Some(at) = queue.iter().position(|w| w.id == self.id) else {
            return;
        };
        queue.remove(at);
        let empty = queue.is_empty();
        state.waiting -= 1;
        if empty {
            state.queues.remove(&self.identity);
            state.ring.retain(|i| *i != self.identity);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shares::{METRIC_IDENTITIES, OTHER};

    fn id(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    /// A future's output if it is ready now.
    fn ready<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        match std::pin::Pin::new(f).poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }

    #[tokio::test]
    async fn a_flood_from_one_identity_waits_its_turn_behind_another() {
        let turns = ListTurns::new(1, 100);
        let (a, b) = (id("a"), id("b"));
        let running = turns.turn(&b).await.unwrap();
        let mut flood: Vec<_> = (0..10).map(|_| Box::pin(turns.turn(&b))).collect();
        for f in &mut flood {
            assert!(ready(f).is_none());
        }
        let mut mine = Box::pin(turns.turn(&a));
        assert!(ready(&mut mine).is_none());
        assert_eq!(turns.waiting(), 11);
        drop(running);
        // The next turn is b's oldest (b was waiting first), the one after
        // it a's, whatever b has queued.
        let first = ready(&mut flood[0]).expect("b's oldest").unwrap();
        assert!(ready(&mut mine).is_none());
        drop(first);
        let _mine = ready(&mut mine).expect("a's, before b's other nine").unwrap();
        for f in &mut flood[1..] {
            assert!(ready(f).is_none());
        }
        assert_eq!(turns.waiting(), 9);
    }

    #[tokio::test]
    async fn an_identity_over_its_queue_is_refused_naming_the_flag() {
        let turns = ListTurns::new(1, 2);
        let b = id("b");
        let _running = turns.turn(&b).await.unwrap();
        let mut queued: Vec<_> = (0..2).map(|_| Box::pin(turns.turn(&b))).collect();
        for f in &mut queued {
            assert!(ready(f).is_none());
        }
        let refused = turns.turn(&b).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused.to_string().contains("--max-queued-lists-per-identity"),
            "{refused}"
        );
        // Another identity still queues.
        let a = id("a");
        let mut other = Box::pin(turns.turn(&a));
        assert!(ready(&mut other).is_none());
    }

    /// What waits, and the refusals, by identity: the first 64 identities
    /// named, the rest together as `(other)`.
    #[tokio::test]
    async fn usage_names_the_first_identities_and_counts_the_rest_together() {
        let turns = ListTurns::new(1, 1);
        let _running = turns.turn(&id("x")).await.unwrap();
        let ids: Vec<Arc<str>> = (0..METRIC_IDENTITIES + 6).map(|i| id(&format!("t{i}"))).collect();
        let mut queued: Vec<_> = ids.iter().map(|i| Box::pin(turns.turn(i))).collect();
        for f in &mut queued {
            assert!(ready(f).is_none());
        }
        assert!(turns.turn(&ids[0]).await.is_err());
        assert!(turns.turn(&ids[69]).await.is_err());
        let usage = turns.usage();
        assert_eq!(usage.len(), METRIC_IDENTITIES + 1);
        let of = |name: &str| {
            usage
                .iter()
                .find(|u| &*u.identity == name)
                .map(|u| (u.held, u.refused))
        };
        assert_eq!(of("t0"), Some((1, 1)));
        assert_eq!(of("t63"), Some((1, 0)));
        assert_eq!(of("t64"), None);
        assert_eq!(of(OTHER), Some((6, 1)));
        drop(queued);
        assert!(turns.usage().iter().all(|u| u.held == 0));
    }

    #[tokio::test]
    async fn a_call_that_goes_away_leaves_the_queue_and_its_turn_goes_on() {
        let turns = ListTurns::new(1, 8);
        let (a, b) = (id("a"), id("b"));
        let running = turns.turn(&a).await.unwrap();
        let mut gone = Box::pin(turns.turn(&b));
        assert!(ready(&mut gone).is_none());
        let mut next = Box::pin(turns.turn(&a));
        assert!(ready(&mut next).is_none());
        drop(gone);
        assert_eq!(turns.waiting(), 1);
        drop(running);
        let last = ready(&mut next).expect("the turn goes on").unwrap();
        drop(last);
        // Free again: taken at once.
        let _again = turns.turn(&b).await.unwrap();
    }
}
