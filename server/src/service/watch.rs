//! List and Watch, the pair a client uses to follow names: a page of held
//! names with the revision it reflects, then the events after it, as a
//! stream with progress messages, bounded bursts and the access policy's
//! scope.

use std::sync::Arc;
use std::time::Duration;

use bagel_proto::acl::Scope;
use bagel_proto::pb;
use tokio_stream::Stream;

use super::Service;
use crate::error::Error;
use crate::transport::Caller;
use crate::validate;
use bagel_proto::codec::EncodedListResponse;

impl Service {
    /// A page of held names and the watch revision it reflects, read
    /// before the page (see `LeaseTable::list_revision`). At most
    /// `list_pages` pages are read at once, each on a reader thread at a
    /// lower CPU priority (more wait for a turn, given by identity in
    /// turn): pages of 1,000 names in a loop would otherwise hold the
    /// async workers, and the CPU, that renewals need. The answer's bytes are reserved before the call
    /// waits, and the page cut to them (see `list_size`). The page is
    /// encoded on the reader thread too, at its priority
    /// ([`EncodedListResponse`]).
    pub(crate) async fn list(
        &self,
        req: &pb::ListRequest,
        caller: &Caller,
    ) -> Result<EncodedListResponse, Error> {
        let limits = &self.inner.cfg.limits;
        let prefix = validate::prefix("prefix", &req.prefix, limits)?;
        let scope = self.read_scope(caller, &prefix)?;
        let after = validate::prefix("page_token", &req.page_token, limits)?;
        let page_size = req.page_size as usize;
        let limit = if page_size == 0 { 100 } else { page_size }.min(self.inner.cfg.list_max_page);
        // Refused as any call of the caller's would be (a certificate no
        // `--client-ca` issued, an identity at its share of connections).
        let identity = self.identity(caller)?;
        let cap = match &caller.answer {
            Some(slot) => {
                if let Some(identity) = &identity {
                    slot.identify(identity)?;
                }
                let (all, one) = super::list_size::reservation(limits, limit);
                Some(slot.reserve(all, one)?)
            }
            None => None,
        };
        let identity = list_turn(identity, caller);
        let inner = Arc::clone(&self.inner);
        inner
            .off_workers(identity, move |inner| {
                let revision = inner.table.list_revision(inner.time.now());
                let page = crate::acl::list_scoped(inner, &scope, &prefix, &after, page_size);
                let mut page = pb::ListResponse { revision, ..page };
                if let Some(cap) = cap {
                    super::list_size::cut(&mut page, cap);
                }
                EncodedListResponse::new(&page)
            })
            .await
    }

    /// The watch's events, ending with the error that ends it (a watcher
    /// that fell behind, or the server shutting down). With
    /// `progress_notify`, a progress message once the events resumed are
    /// sent, and whenever nothing was sent for the interval.
    pub(crate) async fn watch(
        &self,
        req: &pb::WatchRequest,
        caller: &Caller,
    ) -> Result<impl Stream<Item = Result<pb::WatchEvent, Error>> + Send + 'static, Error> {
        let progress = if req.progress_notify {
            Some(self.progress_interval(req.progress_interval_us)?)
        } else {
            None
        };
        let limits = &self.inner.cfg.limits;
        let (filter, scope) = if req.names.is_empty() {
            let prefix = validate::prefix("prefix", &req.prefix, limits)?;
            let scope = self.read_scope(caller, &prefix)?;
            (crate::watch::Filter::Prefix(prefix), scope)
        } else {
            if !req.prefix.is_empty() {
                return Err(Error::invalid("prefix", "give names or a prefix, not both"));
            }
            let names = validate::names("names", &req.names, limits)?;
            self.permit(caller, bagel_proto::acl::Permission::Read, &names)?;
            (
                crate::watch::Filter::Names(names.into_iter().collect()),
                Scope::All,
            )
        };
        // One of the caller's share of the watchers, before the hub's own
        // limit: held as long as the stream.
        let share = self.inner.shares.watchers.take(self.tenant(caller)?.as_ref())?;
        let from = (req.from_revision != 0).then_some(req.from_revision);
        // The first watcher wakes the hub, which reads every live lease
        // (~2 s at 10^6): on a blocking thread, so no async worker's other
        // requests wait for that. Later ones subscribe inline (a blocking
        // thread each would cost more than the subscribing).
        let now = self.now();
        let sub = if self.inner.table.watch_hub().active() {
            self.inner.table.watch(filter, from, now)?
        } else {
            let inner = Arc::clone(&self.inner);
            tokio::task::spawn_blocking(move || inner.table.watch(filter, from, now))
                .await
                .map_err(|_| Error::ShuttingDown)??
        };
        let state = WatchState {
            announce: progress.map(|_| sub.start_revision()),
            sub,
            stopping: self.inner.stopping.clone(),
            progress,
            burst: 0,
            _share: share,
        };
        let stream = futures::stream::unfold(Some(state), |state| async move {
            let mut state = state?;
            let next = state.next().await;
            match next? {
                Ok(item) => Some((Ok(watch_item_pb(item)), Some(state))),
                Err(e) => Some((Err(e), None)),
            }
        });
        Ok(crate::acl::scoped(stream, scope))
    }

    /// The progress interval a watch asked for (0: the server's).
    fn progress_interval(&self, us: u64) -> Result<Duration, Error> {
        use crate::watch::{MAX_PROGRESS, MIN_PROGRESS};
        if us == 0 {
            return Ok(self.inner.cfg.watch.progress);
        }
        let asked = Duration::from_micros(us);
        if !(MIN_PROGRESS..=MAX_PROGRESS).contains(&asked) {
            return Err(Error::out_of_range(
                "progress_interval_us",
                format!(
                    "{us} is outside [{}, {}] (10 ms to 1 h; 0 for the server's default)",
                    MIN_PROGRESS.as_micros(),
                    MAX_PROGRESS.as_micros()
                ),
            ));
        }
        Ok(asked)
    }
}

fn watch_item_pb(item: crate::watch::Item) -> pb::WatchEvent {
    match item {
        crate::watch::Item::Event(e) => watch_event_pb(&e),
        crate::watch::Item::Progress(revision) => pb::WatchEvent {
            revision,
            kind: pb::WatchEventKind::Progress.into(),
            ..Default::default()
        },
    }
}

fn watch_event_pb(e: &crate::watch::Event) -> pb::WatchEvent {
    use crate::watch::EventKind;
    let kind = match e.event.kind {
        EventKind::Granted => pb::WatchEventKind::Granted,
        EventKind::Renewed => pb::WatchEventKind::Renewed,
        EventKind::Upgraded => pb::WatchEventKind::Upgraded,
        EventKind::Released => pb::WatchEventKind::Released,
        EventKind::Broken => pb::WatchEventKind::Broken,
        EventKind::Expired => pb::WatchEventKind::Expired,
    };
    pb::WatchEvent {
        revision: e.revision,
        kind: kind.into(),
        name: e.event.name.to_string(),
        lease_id: e.event.lease.to_string(),
        owner: e.event.owner.to_string(),
        mode: pb::Mode::from(e.event.mode).into(),
        deadline_us: e.event.deadline.as_micros(),
        at_us: e.event.at.as_micros(),
    }
}

/// A watch as its stream goes: the subscription, and what progress it
/// asked for.
struct WatchState {
    sub: crate::watch::Subscription,
    stopping: tokio_util::sync::CancellationToken,
    /// The interval of progress messages, if it asked for them.
    progress: Option<Duration>,
    /// The progress message due once the events resumed are sent: the
    /// revision it subscribed at.
    announce: Option<u64>,
    /// Events handed out since the stream last let go (see [`WATCH_BURST`]).
    burst: usize,
    /// The watcher's slot of its identity's share (`--max-watchers-per-identity`).
    _share: crate::shares::Share,
}

/// Events a watch stream hands tonic before it lets go once: tonic encodes
/// into one chunk for as long as the stream is ready (up to 32 KiB), and
/// a client that reads nothing leaves that chunk held by the server. A
/// burst of 64 events (~5 KiB) keeps what an unread watch holds small.
const WATCH_BURST: usize = 64;

impl WatchState {
    /// What to send next: an event, or a progress message when one is due
    /// (after the resumed events; then after the interval without a
    /// message); `None` never while the server runs.
    async fn next(&mut self) -> Option<Result<crate::watch::Item, Error>> {
        self.burst += 1;
        if self.burst > WATCH_BURST {
            self.burst = 0;
            tokio::task::yield_now().await;
        }
        if !self.sub.has_backlog()
            && let Some(revision) = self.announce.take()
        {
            return Some(Ok(crate::watch::Item::Progress(revision)));
        }
        let every = self.progress;
        let quiet = async move {
            match every {
                Some(every) => tokio::time::sleep(every).await,
                None => std::future::pending().await,
            }
        };
        let next = tokio::select! {
            next = self.sub.next() => next.map(|r| r.map(crate::watch::Item::Event)),
            () = quiet => self.sub.progress(),
            () = self.stopping.cancelled() => return Some(Err(Error::ShuttingDown)),
        };
        next.map(|r| r.map_err(Error::Watch))
    }
}

/// Whose turn among `List` pages a call waits for: the caller's
/// `identity` (its token's under the access policy, or its client
/// certificate's subject), or, with neither, its address (everything
/// behind one address is then one identity).
fn list_turn(identity: Option<Arc<str>>, caller: &Caller) -> Arc<str> {
    identity.unwrap_or_else(|| match caller.peer {
        Some(ip) => Arc::from(format!("address {ip}")),
        None => Arc::from("address unknown"),
    })
}
