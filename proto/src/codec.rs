//! The codec of the generated *server* code (`build.rs` points the server
//! stubs at it; the client stubs keep `tonic_prost::ProstCodec`).
//!
//! Why not tonic-prost's codec on the server: it answers a request that is
//! not valid protobuf (or has a string field that is not UTF-8) with
//! INTERNAL, which tells the caller the server is broken. It is the caller's
//! bytes that are wrong, so the answer is INVALID_ARGUMENT, naming the
//! message type and prost's reason (which names the field).

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

/// [`tonic_prost::ProstCodec`] with INVALID_ARGUMENT for undecodable requests.
#[derive(Debug, Clone)]
pub struct RequestCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for RequestCodec<T, U> {
    fn default() -> Self {
        RequestCodec { _pd: PhantomData }
    }
}

impl<T, U> Codec for RequestCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = RequestDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder { _pd: PhantomData }
    }
}

/// Decodes `U` with prost; a failure is the caller's: INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct RequestDecoder<U> {
    _pd: PhantomData<U>,
}

impl<U: Message + Default> Decoder for RequestDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(|e| decode_error::<U>(&e))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

/// The status of a request that is not a valid `U`.
pub fn decode_error<U>(e: &prost::DecodeError) -> Status {
    let name = std::any::type_name::<U>();
    let name = name.rsplit("::").next().unwrap_or(name);
    Status::invalid_argument(format!("request is not a valid bagel.v1.{name} message: {e}"))
}
