//! The `Session` RPC: `Batch` over one long-lived bidirectional stream.
//!
//! Why a stream as well as `Batch`: a unary call costs an HTTP/2 stream of
//! its own (headers, trailers, a task per request), and a client waiting
//! for one batch's answer before sending the next keeps both sides idle for
//! a round trip. On a session the client pipelines batches as its callers
//! produce operations, and the server runs whatever requests have arrived
//! together as one batch, with one signature for all their grants.
//!
//! Answers go out one per request, in the order the requests came.

use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bagel_proto::pb;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Status, Streaming};

use crate::service::Service;

/// Answers buffered towards a slow reader before the session stops reading
/// requests (backpressure instead of unbounded memory).
const ANSWERS_BUFFERED: usize = 64;

/// Runs one session until the client closes its side, the stream fails, or
/// a request is refused as a whole.
pub(crate) async fn run(
    service: Service,
    mut requests: Streaming<pb::BatchRequest>,
    answers: mpsc::Sender<Answer>,
    peer: Option<std::net::IpAddr>,
) {
    let max_ops = service.inner.cfg.limits.max_batch_ops;
    // A request read ahead that did not fit in the previous group.
    let mut carried = None;
    loop {
        let first = match carried.take() {
            Some(request) => request,
            None => match requests.message().await {
                Ok(Some(request)) => request,
                Ok(None) => return,
                Err(status) => {
                    let _ = answers.send(Err(status)).await;
                    return;
                }
            },
        };
        let (group, ended) = take_ready(&mut requests, first, max_ops, &mut carried);
        let sizes: Vec<usize> = group.iter().map(|r| r.ops.len()).collect();
        let ops: Vec<pb::BatchOp> = group.into_iter().flat_map(|r| r.ops).collect();
        let covered = service.inner.cover(crate::service::batch_deadline(&ops)).await;
        let mut results = match covered.and_then(|()| service.batch_ops(&ops, peer)) {
            Ok(results) => results.into_iter(),
            Err(e) => {
                let _ = answers.send(Err(e.into())).await;
                return;
            }
        };
        for n in sizes {
            let response = pb::BatchResponse {
                results: results.by_ref().take(n).collect(),
            };
            if answers.send(Ok(response)).await.is_err() {
                return; // the client went away
            }
        }
        match ended {
            Ended::No => {}
            Ended::Closed => return,
            Ended::Failed(status) => {
                let _ = answers.send(Err(status)).await;
                return;
            }
        }
    }
}

/// One answer of a session, or the status that ends it.
type Answer = Result<pb::BatchResponse, Status>;

/// The response stream of a session.
pub(crate) type Answers = tokio_stream::wrappers::ReceiverStream<Answer>;

/// The channel a session's answers go through, as the response stream.
pub(crate) fn channel() -> (mpsc::Sender<Answer>, Answers) {
    let (tx, rx) = mpsc::channel(ANSWERS_BUFFERED);
    (tx, tokio_stream::wrappers::ReceiverStream::new(rx))
}

enum Ended {
    No,
    Closed,
    Failed(Status),
}

/// `first` and the requests that have already arrived behind it, as long
/// as together they stay within `max_ops` operations. The request that
/// would overflow the group goes to `carried`, to start the next one (a
/// request over the limit on its own is refused by `batch_ops`).
fn take_ready(
    requests: &mut Streaming<pb::BatchRequest>,
    first: pb::BatchRequest,
    max_ops: usize,
    carried: &mut Option<pb::BatchRequest>,
) -> (Vec<pb::BatchRequest>, Ended) {
    let mut total = first.ops.len();
    let mut group = vec![first];
    if total >= max_ops {
        return (group, Ended::No);
    }
    // Poll without waiting: a request that is not fully here yet waits for
    // the next round (the next `message().await` registers the real waker).
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        match Pin::new(&mut *requests).poll_next(&mut cx) {
            Poll::Ready(Some(Ok(request))) => {
                total += request.ops.len();
                if total > max_ops {
                    *carried = Some(request);
                    return (group, Ended::No);
                }
                group.push(request);
            }
            Poll::Ready(Some(Err(status))) => return (group, Ended::Failed(status)),
            Poll::Ready(None) => return (group, Ended::Closed),
            Poll::Pending => return (group, Ended::No),
        }
    }
}
