//! Property ("fuzz") tests of what the server takes from outside before
//! the lease table sees it: the gRPC message framing (`transport::layer`)
//! and the request fields (`validate`). Any input is answered, never with
//! a panic; error messages stay short whatever the input; buffered bytes
//! stay within their budget and are all given back. A few hundred cases
//! each in the suite; `BAGEL_FUZZ_CASES=100000` for a longer run.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bagel_proto::pb;
use bytes::Bytes;
use http_body::{Body as _, Frame};
use proptest::prelude::*;
use tonic::Code;

use crate::config::Limits;
use crate::error::MAX_MESSAGE_BYTES;
use crate::transport::ConnState;
use crate::transport::layer::{FrameLimits, Framed, Scan};
use crate::validate;

fn cases() -> u32 {
    std::env::var("BAGEL_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// A request body handing out the given chunks.
struct Chunks(VecDeque<Bytes>);

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

/// One message of a request stream: its prefix says `announced` bytes,
/// `body` follows (fewer bytes than announced: the stream ends inside it).
#[derive(Clone, Debug)]
struct Message {
    announced: u32,
    body: Vec<u8>,
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        // Well formed.
        8 => proptest::collection::vec(any::<u8>(), 0..3000)
            .prop_map(|body| Message { announced: body.len() as u32, body }),
        // Announcing more than it has, or more than the limit.
        1 => (any::<u32>(), proptest::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(announced, body)| Message { announced, body }),
    ]
}

fn wire(messages: &[Message]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in messages {
        out.push(0);
        out.extend_from_slice(&m.announced.to_be_bytes());
        out.extend_from_slice(&m.body);
    }
    out
}

/// `bytes` cut at the given (sorted, deduplicated) offsets.
fn chunked(bytes: &[u8], mut cuts: Vec<usize>) -> VecDeque<Bytes> {
    cuts.retain(|&c| c > 0 && c < bytes.len());
    cuts.sort_unstable();
    cuts.dedup();
    let mut out = VecDeque::new();
    let mut at = 0;
    for c in cuts.into_iter().chain([bytes.len()]) {
        out.push_back(Bytes::copy_from_slice(&bytes[at..c]));
        at = c;
    }
    out
}

/// Everything `Framed` hands on, or the status it ends with.
fn drain(framed: &mut Framed) -> (Vec<u8>, Option<tonic::Status>) {
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = Vec::new();
    loop {
        match Pin::new(&mut *framed).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    out.extend_from_slice(&data);
                }
            }
            Poll::Ready(Some(Err(status))) => return (out, Some(status)),
            Poll::Ready(None) => return (out, None),
            Poll::Pending => unreachable!("the test body is always ready"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Any request stream, cut anywhere: well-formed messages within the
    /// limits pass through byte for byte; anything else ends the stream
    /// with RESOURCE_EXHAUSTED or INVALID_ARGUMENT. Partly received bytes
    /// never exceed the connection's budget (plus one growth step) and are
    /// all given back.
    #[test]
    fn any_request_stream_is_framed_or_refused(
        messages in proptest::collection::vec(message(), 0..6),
        cuts in proptest::collection::vec(0usize..20_000, 0..12),
        max_message in 0usize..4000,
        per_connection in 0usize..40_000,
    ) {
        let bytes = wire(&messages);
        let limits = Arc::new(FrameLimits::new(max_message, per_connection, usize::MAX, 64, 1024));
        let conn = Arc::new(ConnState::new());
        let body = tonic::body::Body::new(Chunks(chunked(&bytes, cuts)));
        let mut framed = Framed::new(body, Arc::clone(&limits), Some(Arc::clone(&conn)), Scan::for_path("/x"));
        let (out, status) = drain(&mut framed);
        let clean = messages
            .iter()
            .all(|m| m.announced as usize == m.body.len() && m.body.len() <= max_message);
        match status {
            None => prop_assert_eq!(&out, &bytes),
            Some(status) => {
                // A clean stream is refused only for a message that does
                // not fit the connection's budget.
                prop_assert!(
                    !clean || messages.iter().any(|m| m.body.len() > per_connection),
                    "a clean stream was refused: {:?}", status
                );
                prop_assert!(
                    matches!(status.code(), Code::ResourceExhausted | Code::InvalidArgument),
                    "{:?}", status
                );
                prop_assert!(status.message().len() <= MAX_MESSAGE_BYTES);
                // What came through is a prefix of what was sent.
                prop_assert!(bytes.starts_with(&out));
            }
        }
        drop(framed);
        prop_assert_eq!(limits.buffered(), 0);
        prop_assert_eq!(conn.inflight.load(std::sync::atomic::Ordering::Acquire), 0);
    }

    /// Any names, owners, ids, tokens, metadata, modes: a domain value or a
    /// short error naming the field, never a panic.
    #[test]
    fn any_request_fields_are_validated(
        names in proptest::collection::vec(".{0,300}", 0..80),
        owner in ".{0,300}",
        raw_id in ".{0,80}",
        metadata in proptest::option::of((proptest::collection::vec(any::<u8>(), 0..5000), any::<bool>())),
        mode in any::<i32>(),
        wait_us in any::<u64>(),
    ) {
        let limits = Limits::default();
        let short = |e: crate::error::Error| {
            let text = e.to_string();
            text.len() <= MAX_MESSAGE_BYTES && text.contains(':')
        };
        match validate::names("names", &names, &limits) {
            Ok(got) => {
                prop_assert!(got.windows(2).all(|w| w[0] < w[1]));
                prop_assert!(got.iter().all(|n| !n.is_empty() && n.len() <= limits.max_name_bytes));
            }
            Err(e) => prop_assert!(short(e)),
        }
        if let Err(e) = validate::owner(&owner, &limits) { prop_assert!(short(e)); }
        if let Err(e) = validate::lease_id(&raw_id) { prop_assert!(short(e)); }
        if let Err(e) = validate::token(&raw_id) { prop_assert!(short(e)); }
        let metadata = metadata.map(|(data, wildcard)| pb::Metadata { data, wildcard });
        if let Err(e) = validate::metadata(metadata.as_ref(), &limits) { prop_assert!(short(e)); }
        if let Err(e) = validate::mode(mode) { prop_assert!(short(e)); }
        if let Err(e) = validate::wait(wait_us, std::time::Duration::from_secs(10)) { prop_assert!(short(e)); }
    }
}
