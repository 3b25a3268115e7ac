//! Watchers, as users write them: list, then watch from the List's
//! revision, rebuilding the set of held names from the events; when the
//! watch breaks (a server killed, restarted, frozen), list again and go on
//! from the new List's revision. At the end, with the run quiet, each
//! watcher's rebuilt set must equal what a fresh List says, name by name
//! and holder by holder: an event lost between a List and its watch, or
//! applied out of order, shows as a difference.
//!
//! **A watch is per server**: each server numbers its own events (a
//! revision of one means nothing to another), so a watcher of a cluster
//! is one list-then-watch per member, watching every name (prefix ""). A
//! migration changes which members hold names, so the watchers follow the
//! lists in force as a user's watcher must: when a member joins (the next
//! list, at step 2) it starts one on it, listing what is held there
//! already and watching from that List's revision; when a member leaves
//! (step 3) it goes on watching it until nothing is held there any more
//! (the last lease taken under the old lists released or expired), checks
//! that a List agrees, and only then stops. A member that left and still
//! holds names at the end was kept by a client on old lists: a violation.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bagel_client::{Client, WatchEventKind, WatchMessage, WatchTarget};
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::lists::{Lists, PerStep};
use crate::outages::Outages;

/// What the watchers saw, for `chaos.json`'s `watch_checks`.
#[derive(Debug, Default, Clone, Serialize)]
pub struct WatchReport {
    /// Watchers started (one a member of the lists in force, as they
    /// moved).
    pub watchers: usize,
    /// Events applied, all watchers.
    pub events: u64,
    /// Lists taken after a watch broke (or was refused a revision).
    pub relists: u64,
    /// Final comparisons that held (one a watcher still running).
    pub matched: usize,
    /// Names whose rebuilt holder differs from the final List's, with the
    /// server: each one a violation.
    pub mismatches: Vec<String>,
    /// Events applied under each step of the migration.
    pub across_migration: PerStep,
    /// Watchers started under each step (on the members of its lists).
    pub started_by_step: PerStep,
    /// Watchers of a member that left the lists, stopped once nothing was
    /// held there and a List agreed.
    pub retired: u64,
    /// Members that left the lists and still held names at the end (each
    /// a violation).
    pub not_drained: Vec<String>,
}

/// The held set one watcher rebuilt: name → lease id; and the revision it
/// has seen every event up to.
#[derive(Clone, Debug, Default)]
struct Rebuilt {
    held: BTreeMap<String, String>,
    revision: u64,
}

/// One member's watcher.
struct Watcher {
    member: String,
    task: JoinHandle<()>,
    rebuilt: watch::Receiver<Rebuilt>,
    /// The member left the lists: its retirement, under way.
    leaving: Option<JoinHandle<()>>,
}

/// What the watchers share with the task that follows the lists.
struct Shared {
    lists: Lists,
    outages: Outages,
    stop: watch::Receiver<bool>,
    events: AtomicU64,
    relists: AtomicU64,
    /// Watchers by URL, and what the retired ones found.
    running: Mutex<BTreeMap<String, Watcher>>,
    report: Mutex<WatchReport>,
    started: Instant,
}

impl Shared {
    fn at(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

/// The watchers, following the lists in force.
pub struct Watchers {
    shared: Arc<Shared>,
    lists: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl Watchers {
    /// Starts a watcher on each member of the lists in force, and follows
    /// them as the migration moves them.
    pub fn start(lists: Lists, outages: Outages, started: Instant) -> Watchers {
        let (stop, stopped) = watch::channel(false);
        let shared = Arc::new(Shared {
            lists,
            outages,
            stop: stopped,
            events: AtomicU64::new(0),
            relists: AtomicU64::new(0),
            running: Mutex::default(),
            report: Mutex::default(),
            started,
        });
        let lists = tokio::spawn(follow_lists(Arc::clone(&shared)));
        Watchers { shared, lists, stop }
    }

    /// Compares each running watcher's set with a fresh List of its server,
    /// once the watcher has seen every event up to that List's revision; a
    /// difference is retried with a newer List for a while (a List may
    /// reflect an event the watcher has not received yet), and reported
    /// if it stays. A watcher of a member that left the lists must find it
    /// empty. Then stops the watchers.
    pub async fn check(self) -> WatchReport {
        // No watcher starts or retires any more; the watchers themselves
        // go on until compared.
        self.lists.abort();
        let running: Vec<(String, Watcher)> =
            std::mem::take(&mut *self.shared.running.lock().expect("running"))
                .into_iter()
                .collect();
        let mut report = self.shared.report.lock().expect("report").clone();
        for (url, w) in running {
            if let Some(leaving) = &w.leaving {
                leaving.abort();
            }
            match compare(&url, w.rebuilt.clone()).await {
                Ok(held) if w.leaving.is_some() && !held.is_empty() => report.not_drained.push(format!(
                    "{url} ({}) left the lists and still holds {}",
                    w.member,
                    held.iter()
                        .map(|(name, lease)| format!("{name} (lease {lease})"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
                Ok(_) if w.leaving.is_some() => report.retired += 1,
                Ok(_) => report.matched += 1,
                Err(Compared::Differs(diff) | Compared::Unreachable(diff)) => {
                    report.mismatches.push(format!("{url}: {diff}"));
                }
            }
            w.task.abort();
        }
        let _ = self.stop.send(true);
        report.events = self.shared.events.load(Ordering::SeqCst);
        report.relists = self.shared.relists.load(Ordering::SeqCst);
        report
    }
}

/// Starts a watcher on every member of the lists in force as they move,
/// and retires those of members that left them.
async fn follow_lists(shared: Arc<Shared>) {
    let mut lists = shared.lists.subscribe();
    let mut stop = shared.stop.clone();
    loop {
        let in_force = lists.borrow_and_update().clone();
        let members = in_force.members();
        {
            let mut running = shared.running.lock().expect("running");
            for (member, url) in &members {
                if running.contains_key(url) {
                    continue;
                }
                let (state, rebuilt) = watch::channel(Rebuilt::default());
                let task = tokio::spawn(follow(url.clone(), state, Arc::clone(&shared)));
                running.insert(
                    url.clone(),
                    Watcher {
                        member: member.clone(),
                        task,
                        rebuilt,
                        leaving: None,
                    },
                );
                let mut r = shared.report.lock().expect("report");
                r.watchers += 1;
                *r.started_by_step.entry(in_force.step()).or_default() += 1;
                if in_force.generation > 0 {
                    println!(
                        "[{:>5.1}s] watchers: {member} joined the lists of {}: list, then watch {url}",
                        shared.at(),
                        in_force.step()
                    );
                }
            }
            for (url, w) in running.iter_mut() {
                if w.leaving.is_none() && !members.iter().any(|(_, u)| u == url) {
                    println!(
                        "[{:>5.1}s] watchers: {} left the lists of {}: watching {url} until nothing is held there",
                        shared.at(),
                        w.member,
                        in_force.step()
                    );
                    w.leaving = Some(tokio::spawn(retire(
                        url.clone(),
                        w.rebuilt.clone(),
                        Arc::clone(&shared),
                    )));
                }
            }
        }
        tokio::select! {
            moved = lists.changed() => if moved.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Retires the watcher of a member that left the lists: once its rebuilt
/// set is empty and a List agrees, it stops. A List that still shows
/// names (granted meanwhile) waits for the next drain; one that cannot be
/// compared because the member was restarted is asked again.
async fn retire(url: String, mut rebuilt: watch::Receiver<Rebuilt>, shared: Arc<Shared>) {
    let member = {
        let running = shared.running.lock().expect("running");
        running.get(&url).map(|w| w.member.clone()).unwrap_or_default()
    };
    loop {
        let drained = rebuilt.wait_for(|r| r.held.is_empty()).await.map(drop);
        if drained.is_err() {
            return;
        }
        let from = Instant::now();
        let compared = compare(&url, rebuilt.clone()).await;
        let restarted = shared.outages.killed_during(&member, from, Instant::now());
        let found = match compared {
            Ok(held) if held.is_empty() => None,
            // Granted again since it drained: wait for the next drain.
            Ok(_) => continue,
            Err(_) if restarted => continue,
            Err(Compared::Unreachable(_)) => {
                // Down, or frozen: ask again soon, not in a loop.
                let mut stop = shared.stop.clone();
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(200)) => continue,
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
            Err(Compared::Differs(diff)) => Some(diff),
        };
        let Some(w) = shared.running.lock().expect("running").remove(&url) else {
            return;
        };
        w.task.abort();
        let mut r = shared.report.lock().expect("report");
        match found {
            None => {
                r.retired += 1;
                println!(
                    "[{:>5.1}s] watchers: nothing held on {url} ({member}) any more, as a List agrees: its watch stops",
                    shared.at()
                );
            }
            Some(diff) => r
                .mismatches
                .push(format!("{url} ({member}, leaving the lists): {diff}")),
        }
        return;
    }
}

/// List, watch from its revision, apply; on any break, list again.
async fn follow(url: String, state: watch::Sender<Rebuilt>, shared: Arc<Shared>) {
    let mut stopped = shared.stop.clone();
    let mut first = true;
    while !*stopped.borrow() {
        if !first {
            shared.relists.fetch_add(1, Ordering::SeqCst);
            // A server being restarted: ask again soon, not in a loop.
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = stopped.changed() => return,
            }
        }
        first = false;
        let Ok(client) = Client::connect(url.clone()).await else {
            continue;
        };
        let Ok(page) = client.list_all("").await else {
            continue;
        };
        let mut rebuilt = Rebuilt {
            held: page
                .names
                .into_iter()
                .map(|n| (n.name, n.holder.lease_id))
                .collect(),
            revision: page.revision,
        };
        state.send_replace(rebuilt.clone());
        let Ok(mut w) = client
            .watch_with(
                WatchTarget::Prefix(String::new()),
                bagel_client::WatchOptions {
                    from_revision: Some(page.revision),
                    progress_interval: Some(Duration::from_millis(200)),
                },
            )
            .await
        else {
            continue;
        };
        loop {
            let message = tokio::select! {
                m = w.next_message() => m,
                _ = stopped.changed() => return,
            };
            match message {
                Ok(Some(WatchMessage::Event(e))) => {
                    shared.events.fetch_add(1, Ordering::SeqCst);
                    let step = shared.lists.now().step();
                    *shared
                        .report
                        .lock()
                        .expect("report")
                        .across_migration
                        .entry(step)
                        .or_default() += 1;
                    match e.kind {
                        WatchEventKind::Granted | WatchEventKind::Renewed | WatchEventKind::Upgraded => {
                            rebuilt.held.insert(e.name, e.lease_id);
                        }
                        // The holder named is gone; a grant that broke it
                        // comes as its own event.
                        WatchEventKind::Released | WatchEventKind::Broken | WatchEventKind::Expired => {
                            if rebuilt.held.get(&e.name) == Some(&e.lease_id) {
                                rebuilt.held.remove(&e.name);
                            }
                        }
                    }
                    rebuilt.revision = e.revision;
                    state.send_replace(rebuilt.clone());
                }
                Ok(Some(WatchMessage::Progress { revision })) => {
                    rebuilt.revision = revision;
                    state.send_replace(rebuilt.clone());
                }
                // Ended, broken, or refused a revision: list again.
                Ok(None) | Err(_) => break,
            }
        }
    }
}

/// Why a watcher and a List could not be found equal.
enum Compared {
    /// They differ (or the watcher never caught up): what differs.
    Differs(String),
    /// The server could not be asked.
    Unreachable(String),
}

/// One watcher against its server's List: equal once the watcher has
/// caught up with the List's revision, within a bounded number of tries.
/// Returns the held set they agree on.
async fn compare(
    url: &str,
    mut rebuilt: watch::Receiver<Rebuilt>,
) -> Result<BTreeMap<String, String>, Compared> {
    let client = Client::connect(url.to_owned())
        .await
        .map_err(|e| Compared::Unreachable(format!("cannot connect to compare: {e}")))?;
    let mut last_diff = String::from("never compared");
    for _ in 0..20 {
        let page = client
            .list_all("")
            .await
            .map_err(|e| Compared::Unreachable(format!("cannot list to compare: {e}")))?;
        let listed: BTreeMap<String, String> = page
            .names
            .into_iter()
            .map(|n| (n.name, n.holder.lease_id))
            .collect();
        let caught_up = tokio::time::timeout(Duration::from_secs(5), async {
            rebuilt
                .wait_for(|r| r.revision >= page.revision)
                .await
                .map(|state| state.held.clone())
        })
        .await;
        let held = match caught_up {
            Ok(Ok(held)) => held,
            _ => {
                last_diff = format!("the watcher never caught up with revision {}", page.revision);
                continue;
            }
        };
        if held == listed {
            return Ok(listed);
        }
        let differs: Vec<String> = listed
            .keys()
            .chain(held.keys())
            .filter(|n| listed.get(*n) != held.get(*n))
            .map(|n| format!("{n}: listed {:?}, rebuilt {:?}", listed.get(n), held.get(n)))
            .collect();
        last_diff = differs.join("; ");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(Compared::Differs(last_diff))
}
