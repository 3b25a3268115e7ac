//! A store that drops conditional headers, as some S3 look-alikes do
//! (Garage 2.5 ignores `If-None-Match`): the test double the start-up
//! probes of bags and S3 leases must refuse.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMode,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// Which conditional header the store ignores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ignores {
    /// `If-None-Match: *` (create-only PUTs overwrite).
    IfNoneMatch,
    /// `If-Match` (conditional updates overwrite whatever is there).
    IfMatch,
}

/// `inner`, with the conditional header `ignores` dropped from every PUT.
#[derive(Debug)]
pub struct IgnoresConditions {
    pub inner: Arc<dyn ObjectStore>,
    pub ignores: Ignores,
}

impl fmt::Display for IgnoresConditions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ignores-{:?}({})", self.ignores, self.inner)
    }
}

#[async_trait]
impl ObjectStore for IgnoresConditions {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        mut opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let drop_it = matches!(
            (&opts.mode, self.ignores),
            (PutMode::Create, Ignores::IfNoneMatch) | (PutMode::Update(_), Ignores::IfMatch)
        );
        if drop_it {
            opts.mode = PutMode::Overwrite;
        }
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }
    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
