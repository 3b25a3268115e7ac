//! Watchers, as users write them: list, then watch from the List's
//! revision, rebuilding the set of held names from the events; when the
//! watch breaks (a server killed, restarted, frozen), list again and go on
//! from the new List's revision. At the end, with the run quiet, each
//! watcher's rebuilt set must equal what a fresh List says, name by name
//! and holder by holder: an event lost between a List and its watch, or
//! applied out of order, shows as a difference.
//!
//! One watcher per lease server (each server numbers its own events),
//! watching every name (prefix "").

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bagel_client::{Client, WatchEventKind, WatchMessage, WatchTarget};
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the watchers saw, for `chaos.json`'s `watch_checks`.
#[derive(Debug, Default, Serialize)]
pub struct WatchReport {
    pub watchers: usize,
    /// Events applied, all watchers.
    pub events: u64,
    /// Lists taken after a watch broke (or was refused a revision).
    pub relists: u64,
    /// Final comparisons that held (one a watcher).
    pub matched: usize,
    /// Names whose rebuilt holder differs from the final List's, with the
    /// server: each one a violation.
    pub mismatches: Vec<String>,
}

/// The held set one watcher rebuilt: name → lease id; and the revision it
/// has seen every event up to.
#[derive(Clone, Debug, Default)]
struct Rebuilt {
    held: BTreeMap<String, String>,
    revision: u64,
}

/// Watchers running, one a server.
pub struct Watchers {
    tasks: Vec<(String, JoinHandle<()>, watch::Receiver<Rebuilt>)>,
    stop: watch::Sender<bool>,
    events: Arc<AtomicU64>,
    relists: Arc<AtomicU64>,
}

impl Watchers {
    /// Starts a watcher on each server of `urls`.
    pub fn start(urls: &[String]) -> Watchers {
        let (stop, stopped) = watch::channel(false);
        let events = Arc::new(AtomicU64::new(0));
        let relists = Arc::new(AtomicU64::new(0));
        let tasks = urls
            .iter()
            .map(|url| {
                let (state, rebuilt) = watch::channel(Rebuilt::default());
                let task = tokio::spawn(follow(
                    url.clone(),
                    state,
                    stopped.clone(),
                    Arc::clone(&events),
                    Arc::clone(&relists),
                ));
                (url.clone(), task, rebuilt)
            })
            .collect();
        Watchers {
            tasks,
            stop,
            events,
            relists,
        }
    }

    /// Compares each watcher's set with a fresh List of its server, once
    /// the watcher has seen every event up to that List's revision; a
    /// difference is retried with a newer List for a while (a List may
    /// reflect an event the watcher has not received yet), and reported
    /// if it stays. Then stops the watchers.
    pub async fn check(self) -> WatchReport {
        let mut report = WatchReport {
            watchers: self.tasks.len(),
            ..WatchReport::default()
        };
        for (url, _, rebuilt) in &self.tasks {
            match compare(url, rebuilt.clone()).await {
                Ok(()) => report.matched += 1,
                Err(diff) => report.mismatches.push(format!("{url}: {diff}")),
            }
        }
        let _ = self.stop.send(true);
        for (_, task, _) in self.tasks {
            task.abort();
        }
        report.events = self.events.load(Ordering::SeqCst);
        report.relists = self.relists.load(Ordering::SeqCst);
        report
    }
}

/// List, watch from its revision, apply; on any break, list again.
async fn follow(
    url: String,
    state: watch::Sender<Rebuilt>,
    mut stopped: watch::Receiver<bool>,
    events: Arc<AtomicU64>,
    relists: Arc<AtomicU64>,
) {
    let mut first = true;
    while !*stopped.borrow() {
        if !first {
            relists.fetch_add(1, Ordering::SeqCst);
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
                    events.fetch_add(1, Ordering::SeqCst);
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

/// One watcher against its server's List: equal once the watcher has
/// caught up with the List's revision, within a bounded number of tries.
async fn compare(url: &str, mut rebuilt: watch::Receiver<Rebuilt>) -> Result<(), String> {
    let client = Client::connect(url.to_owned())
        .await
        .map_err(|e| format!("cannot connect to compare: {e}"))?;
    let mut last_diff = String::from("never compared");
    for _ in 0..20 {
        let page = client
            .list_all("")
            .await
            .map_err(|e| format!("cannot list to compare: {e}"))?;
        let listed: BTreeMap<String, String> = page
            .names
            .into_iter()
            .map(|n| (n.name, n.holder.lease_id))
            .collect();
        let caught_up = tokio::time::timeout(
            Duration::from_secs(5),
            rebuilt.wait_for(|r| r.revision >= page.revision),
        )
        .await;
        let Ok(Ok(state)) = caught_up else {
            last_diff = format!("the watcher never caught up with revision {}", page.revision);
            continue;
        };
        if state.held == listed {
            return Ok(());
        }
        let differs: Vec<String> = listed
            .keys()
            .chain(state.held.keys())
            .filter(|n| listed.get(*n) != state.held.get(*n))
            .map(|n| format!("{n}: listed {:?}, rebuilt {:?}", listed.get(n), state.held.get(n)))
            .collect();
        drop(state);
        last_diff = differs.join("; ");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(last_diff)
}
