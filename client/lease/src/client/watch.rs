//! A watch on one lease server: its events in revision order, with the
//! revision to resume from kept as they arrive (so a dropped watch says
//! where to start again).

use async_trait::async_trait;
use bagel_proto::pb;

use crate::backend::WatchStream;
use crate::error::{Error, Result};
use crate::grpc_error::from_status;
use crate::types::WatchEvent;

/// How [`Client::watch_with`](super::Client::watch_with) starts a watch, and what it receives: the
/// same for every backend that watches.
pub use bagel_lease_core::backend::{WatchMessage, WatchOptions};

/// The events of [`Client::watch`](super::Client::watch), in revision order.
#[derive(Debug)]
pub struct Watch {
    pub(super) events: tonic::Streaming<pb::WatchEvent>,
    pub(super) last_revision: Option<u64>,
}

impl Watch {
    /// The next event; `Ok(None)` when the server ended the watch without
    /// an error. Progress messages are taken in (they move
    /// [`Watch::last_revision`]) and not returned. A watcher that fell
    /// behind ends with [`Error::WatchDropped`]; one whose revisions the
    /// server can no longer follow with [`Error::WatchRevision`].
    pub async fn next(&mut self) -> Result<Option<WatchEvent>> {
        loop {
            match self.next_message().await? {
                Some(WatchMessage::Event(e)) => return Ok(Some(e)),
                Some(WatchMessage::Progress { .. }) => {}
                None => return Ok(None),
            }
        }
    }

    /// The next event or progress message; otherwise as [`Watch::next`].
    pub async fn next_message(&mut self) -> Result<Option<WatchMessage>> {
        loop {
            match self.events.message().await {
                Ok(Some(e)) => {
                    self.last_revision = Some(e.revision);
                    if e.kind() == pb::WatchEventKind::Progress {
                        return Ok(Some(WatchMessage::Progress { revision: e.revision }));
                    }
                    if let Some(e) = WatchEvent::from_pb(e) {
                        return Ok(Some(WatchMessage::Event(e)));
                    }
                }
                Ok(None) => return Ok(None),
                // The last revision received is where to watch again from
                // (the server's says what it sent, which is the same).
                Err(s) => {
                    return Err(match from_status(s) {
                        Error::WatchDropped {
                            message,
                            last_revision,
                        } => Error::WatchDropped {
                            message,
                            last_revision: self.last_revision.or(last_revision),
                        },
                        other => other,
                    });
                }
            }
        }
    }

    /// The revision to resume from: of the last event or progress message
    /// received (or the one resumed from, before any).
    pub fn last_revision(&self) -> Option<u64> {
        self.last_revision
    }

    /// The events as a [`futures::Stream`].
    pub fn into_stream(self) -> impl futures::Stream<Item = Result<WatchEvent>> + Send {
        futures::stream::unfold(Some(self), |w| async move {
            let mut w = w?;
            match w.next().await {
                Ok(Some(e)) => Some((Ok(e), Some(w))),
                Ok(None) => None,
                Err(e) => Some((Err(e), None)),
            }
        })
    }
}

#[async_trait]
impl WatchStream for Watch {
    async fn next_message(&mut self) -> Result<Option<WatchMessage>> {
        Watch::next_message(self).await
    }

    fn last_revision(&self) -> Option<u64> {
        Watch::last_revision(self)
    }
}
