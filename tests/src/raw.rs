//! What hostile-client tests need: gRPC calls with bytes no protobuf
//! encoder would send, and the server's own memory and CPU from `/proc`.

use bytes::{Buf as _, BufMut as _, Bytes};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;

use crate::ServerProcess;

/// Bytes in, bytes out: lets a test send what no protobuf encoder would.
#[derive(Debug, Clone, Copy)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// Sends `body` as the whole request message of the lease service's
/// `method`, bypassing any protobuf encoding, and returns the status (or
/// the raw answer).
pub async fn raw_call(server: &ServerProcess, method: &str, body: Vec<u8>) -> Result<Bytes, tonic::Status> {
    let channel = Channel::from_shared(server.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = format!("/bagel.v1.LeaseService/{method}").parse().unwrap();
    grpc.unary(tonic::Request::new(Bytes::from(body)), path, RawCodec)
        .await
        .map(tonic::Response::into_inner)
}

/// The head of a call to the lease service's `method` on `server`, for
/// a raw HTTP/2 stream, with `authorization: Bearer <token>` when there is
/// a token (its message then follows as [`grpc_frame`]).
pub fn grpc_request(server: &ServerProcess, method: &str, token: Option<&str>) -> http::Request<()> {
    let mut request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{}/bagel.v1.LeaseService/{method}", server.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    request.body(()).unwrap()
}

/// A gRPC request message as it goes on a raw HTTP/2 stream: the 5-byte
/// prefix (not compressed, its length) and `msg` (for tests that drive
/// HTTP/2 themselves, to control windows and reads).
pub fn grpc_frame(msg: &impl prost::Message) -> Bytes {
    let body = msg.encode_to_vec();
    let mut b = Vec::with_capacity(5 + body.len());
    b.push(0);
    b.extend_from_slice(&(body.len() as u32).to_be_bytes());
    b.extend_from_slice(&body);
    Bytes::from(b)
}

impl ServerProcess {
    /// The server's resident set in bytes, from its own `/proc/<pid>/status`.
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("VmRSS");
        kib * 1024
    }

    /// User + system CPU time of the server so far, in clock ticks (1/100 s).
    pub fn cpu_ticks(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split_whitespace().collect();
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    }
}
