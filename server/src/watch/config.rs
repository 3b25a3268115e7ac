//! The hub's settings ([`WatchConfig`]) and the bounds on the progress
//! interval a watch may ask for: what the server's `--watch-*` flags set.

use std::time::Duration;

#[derive(Clone, Copy, Debug)]
pub struct WatchConfig {
    /// Events buffered per watcher before it is dropped.
    pub buffer: usize,
    /// Events kept for watchers resuming from a revision.
    pub retain: usize,
    /// ... and at most this many bytes of them (see `event_bytes`): the
    /// ring is the only copy of an event, whatever the watchers.
    pub retain_bytes: usize,
    /// A watcher owed events that takes none for this long (its client
    /// reads nothing: an HTTP/2 window left at 0) is ended with
    /// [`WatchError::Stalled`](super::WatchError::Stalled) and its queue freed; zero: never.
    pub stall: Duration,
    /// Watchers at once.
    pub max_watchers: usize,
    /// ... and of one identity (see `crate::shares`; the service counts
    /// them, not the hub); `None`: a quarter of `max_watchers`.
    pub max_watchers_per_identity: Option<usize>,
    /// How long events are still recorded after the last watcher left (or
    /// the last List, when nobody watched).
    pub linger: Duration,
    /// How long a watch that asked for progress messages goes without a
    /// message before it is sent one, unless it asked for another interval.
    pub progress: Duration,
}

/// The shortest progress interval a watch may ask for: a progress message
/// costs a lock of the hub.
pub const MIN_PROGRESS: Duration = Duration::from_millis(10);

/// The longest progress interval a watch may ask for.
pub const MAX_PROGRESS: Duration = Duration::from_secs(3600);

impl WatchConfig {
    /// The watchers one identity may hold (`crate::shares::share_of`).
    pub fn watchers_share(&self) -> usize {
        crate::shares::share_of(self.max_watchers_per_identity, self.max_watchers)
    }
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            buffer: 1024,
            retain: 10_000,
            retain_bytes: 32 << 20,
            stall: Duration::from_secs(30),
            max_watchers: 1024,
            max_watchers_per_identity: None,
            linger: Duration::from_secs(60),
            progress: Duration::from_secs(5),
        }
    }
}
