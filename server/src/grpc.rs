//! The lease service as gRPC serves it: the one place tonic's `Request`,
//! `Response` and `Status` meet the handlers.
//!
//! Every method is the same thin edge: take the message and the caller out
//! of the request, run `Service`'s handler, meter the outcome (latency by
//! method and code, conflicts by mode, the refusal's log line), and only
//! then turn the domain error into a `Status` (`Status::from`, last). The
//! handlers and the metering thus see `crate::error::Error` itself: a
//! conflict is logged from its fields, never decoded back out of the
//! status details it becomes.
//!
//! Operations inside `Batch` and `Session` are metered one by one where
//! they run (`Service::batch_ops`); a session is counted while open rather
//! than timed, and a watch only to its start.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bagel_proto::pb;
use pb::lease_service_server::LeaseService;
use tokio_stream::{Stream, StreamExt as _};
use tonic::{Code, Request, Response, Status};

use crate::error::Error;
use crate::meter::{Meters, Method};
use crate::refusal::{self, Subject};
use crate::service::Service;
use crate::transport::Caller;

/// The gRPC lease service over [`Service`]'s handlers (see the module docs).
#[derive(Clone, Debug)]
pub struct GrpcService(pub Service);

type Reply<T> = Result<Response<T>, Status>;

/// Who is calling: address (per-peer quotas) and, with mutual TLS, the
/// client certificate's subject (the owner).
fn caller<T>(request: &Request<T>) -> Caller {
    let mut caller = Caller::of(request.extensions());
    if caller.peer.is_none() {
        caller.peer = request.remote_addr().map(|a| a.ip());
    }
    caller.bearer = crate::acl::bearer(request.metadata());
    caller
}

impl GrpcService {
    fn meters(&self) -> &Meters {
        &self.0.inner.meters
    }

    /// Records a unary call's latency and outcome, logs a refusal, and
    /// only then makes the answer a gRPC one.
    fn finish<T>(
        &self,
        method: Method,
        start: Instant,
        subject: Subject<'_>,
        result: Result<T, Error>,
    ) -> Reply<T> {
        let code = result.as_ref().err().map_or(Code::Ok, Error::code);
        self.meters().rpc(method, code, start.elapsed());
        if let Err(e) = &result {
            refusal::log(method.name(), &subject, e);
        }
        result.map(Response::new).map_err(Status::from)
    }
}

#[tonic::async_trait]
impl LeaseService for GrpcService {
    async fn acquire(&self, request: Request<pb::AcquireRequest>) -> Reply<pb::AcquireResponse> {
        let start = Instant::now();
        let req = request.get_ref();
        let result = self.0.acquire(req, &caller(&request)).await;
        if let Err(Error::Conflict(_)) = &result {
            self.meters().conflict(req.mode);
        }
        self.finish(Method::Acquire, start, Subject::names(&req.names), result)
    }

    async fn upgrade(&self, request: Request<pb::UpgradeRequest>) -> Reply<pb::UpgradeResponse> {
        let start = Instant::now();
        let req = request.get_ref();
        let result = self.0.upgrade(req, &caller(&request)).await;
        self.finish(Method::Upgrade, start, Subject::lease(&req.lease_id), result)
    }

    async fn renew(&self, request: Request<pb::RenewRequest>) -> Reply<pb::RenewResponse> {
        let start = Instant::now();
        let req = request.get_ref();
        let result = self.0.renew(req, &caller(&request)).await;
        self.finish(Method::Renew, start, Subject::lease(&req.lease_id), result)
    }

    async fn release(&self, request: Request<pb::ReleaseRequest>) -> Reply<pb::ReleaseResponse> {
        let start = Instant::now();
        let req = request.get_ref();
        let result = self.0.release(req, &caller(&request));
        self.finish(Method::Release, start, Subject::lease(&req.lease_id), result)
    }

    async fn batch(&self, request: Request<pb::BatchRequest>) -> Reply<pb::BatchResponse> {
        let start = Instant::now();
        let result = self.0.batch(request.get_ref(), &caller(&request)).await;
        self.finish(Method::Batch, start, Subject::NONE, result)
    }

    type SessionStream = SessionAnswers;

    /// Sessions are long-lived, so they are counted while open rather than
    /// timed; their groups of operations are metered by `batch_ops`. A
    /// session refused at the start (`--max-sessions`) is neither.
    async fn session(
        &self,
        request: Request<tonic::Streaming<pb::BatchRequest>>,
    ) -> Reply<Self::SessionStream> {
        let caller = caller(&request);
        let answers = crate::session::open(&self.0, request.into_inner(), caller).map_err(Status::from)?;
        self.meters().session_opened();
        Ok(Response::new(SessionAnswers {
            answers,
            service: self.0.clone(),
        }))
    }

    async fn describe(&self, request: Request<pb::DescribeRequest>) -> Reply<pb::DescribeResponse> {
        let start = Instant::now();
        let result = self.0.describe(request.get_ref(), &caller(&request));
        self.finish(Method::Describe, start, Subject::NONE, result)
    }

    async fn history(&self, request: Request<pb::HistoryRequest>) -> Reply<pb::HistoryResponse> {
        let start = Instant::now();
        let req = request.get_ref();
        let result = self.0.history(req, &caller(&request));
        let name = std::slice::from_ref(&req.name);
        self.finish(Method::History, start, Subject::names(name), result)
    }

    async fn server_info(&self, request: Request<pb::ServerInfoRequest>) -> Reply<pb::ServerInfoResponse> {
        let start = Instant::now();
        let info = self.0.server_info(&caller(&request));
        self.finish(Method::ServerInfo, start, Subject::NONE, Ok(info))
    }

    async fn list(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Reply<bagel_proto::codec::EncodedListResponse> {
        let start = Instant::now();
        let result = self.0.list(request.get_ref(), &caller(&request)).await;
        self.finish(Method::List, start, Subject::NONE, result)
    }

    type WatchStream = WatchStream;

    /// Watches are long-lived: only their start is timed. An error that
    /// ends the stream later becomes its status here too.
    async fn watch(&self, request: Request<pb::WatchRequest>) -> Reply<Self::WatchStream> {
        let start = Instant::now();
        let result = self
            .0
            .watch(request.get_ref(), &caller(&request))
            .await
            .map(watch_stream);
        self.finish(Method::Watch, start, Subject::NONE, result)
    }

    async fn signed_now(&self, _request: Request<pb::SignedNowRequest>) -> Reply<pb::SignedNowResponse> {
        let start = Instant::now();
        let result = self.0.signed_now();
        self.finish(Method::SignedNow, start, Subject::NONE, result)
    }
}

/// What a Watch call answers: its events, ending with a status.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send + 'static>>;

/// A watch's events as the call answers them: the error that ends them
/// becomes the stream's last status.
fn watch_stream(events: impl Stream<Item = Result<pb::WatchEvent, Error>> + Send + 'static) -> WatchStream {
    Box::pin(events.map(|event| event.map_err(Status::from)))
}

/// A session's answers; counts the session as closed when dropped.
#[derive(Debug)]
pub struct SessionAnswers {
    answers: crate::session::Answers,
    service: Service,
}

impl Stream for SessionAnswers {
    type Item = Result<pb::BatchResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.answers).poll_next(cx)
    }
}

impl Drop for SessionAnswers {
    fn drop(&mut self) {
        self.service.inner.meters.session_closed();
    }
}
