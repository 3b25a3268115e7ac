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

/// A `ListResponse` encoded where its page was read, which the server's
/// `List` stub sends as it is (`build.rs` maps the server's
/// `bagel.v1.ListResponse` to it; clients decode the same bytes as
/// [`crate::pb::ListResponse`]).
///
/// Why: the server reads pages on reader threads at a lower CPU priority
/// than grants, and a page of thousands of names is as much CPU to encode
/// as to read. Encoded by tonic on the runtime's threads, one tenant's
/// `List` flood spent a sixth of a pinned core there, at the priority of
/// every other tenant's renewals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EncodedListResponse(pub prost::bytes::Bytes);

impl EncodedListResponse {
    /// `page`, encoded now.
    pub fn new(page: &crate::pb::ListResponse) -> Self {
        EncodedListResponse(page.encode_to_vec().into())
    }

    /// The page back (for tests and tools; the server only sends it).
    pub fn decode(&self) -> Result<crate::pb::ListResponse, prost::DecodeError> {
        crate::pb::ListResponse::decode(&self.0[..])
    }
}

impl Message for EncodedListResponse {
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        buf.put_slice(&self.0);
    }

    /// Merges a field as a `ListResponse` would, by decoding what is held
    /// and encoding it again: correct, and slow, since the server never
    /// decodes one.
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl prost::bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        let mut page = self.decode()?;
        page.merge_field(tag, wire_type, buf, ctx)?;
        *self = EncodedListResponse::new(&page);
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

#[cfg(test)]
mod encoded_tests {
    use super::*;
    use crate::pb;

    /// The bytes sent are exactly the page's encoding, and decode (as a
    /// client does, and through `merge`) to the page.
    #[test]
    fn an_encoded_page_is_the_pages_bytes() {
        let page = pb::ListResponse {
            names: vec![pb::ListedName {
                name: "a/1".into(),
                holder: Some(pb::Holder {
                    lease_id: "00ab".into(),
                    ..Default::default()
                }),
            }],
            next_page_token: "a/1".into(),
            max_page_size: 5000,
            revision: 7,
        };
        let encoded = EncodedListResponse::new(&page);
        assert_eq!(encoded.encode_to_vec(), page.encode_to_vec());
        assert_eq!(encoded.encoded_len(), page.encoded_len());
        assert_eq!(
            pb::ListResponse::decode(&encoded.encode_to_vec()[..]).unwrap(),
            page
        );
        let merged = EncodedListResponse::decode_from(&page.encode_to_vec());
        assert_eq!(merged.decode().unwrap(), page);
    }

    impl EncodedListResponse {
        fn decode_from(bytes: &[u8]) -> Self {
            <EncodedListResponse as Message>::decode(bytes).unwrap()
        }
    }
}
