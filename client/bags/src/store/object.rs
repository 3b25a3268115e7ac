//! A maildir-style bag on an object-store prefix, through `object_store`:
//! S3 today, and any store that honours create-only PUTs (`PutMode::Create`).
//!
//! ```text
//! <prefix>/<log>/2026/11/21/05/51/52/   one key prefix per bag (UTC second)
//!     <writer>.<instance>.<gen>.<sequence:020>   one object per batch
//!     _prelock                          "a close has started"
//!     _lock                             the bag: `key size etag` per object
//! <prefix>/<log>/_start/<unix seconds>  writers' start marks (see the writer)
//! <prefix>/<log>/_seal/<minute start>   minute seals (see `crate::seal`), and
//!                                       `.removed` tombstones (`crate::tombstone`)
//! ```
//!
//! Write: exactly one PUT per batch, create-only (`If-None-Match: *`), so
//! an acknowledged batch can never be replaced, not even by a writer given
//! the same id. Close: GET `_lock` (done if present); PUT `_prelock`; wait
//! [`CLOSE_SETTLE`]; LIST the prefix; PUT `_lock` with `If-None-Match: *`
//! listing every valid object. A precondition failure means another closer
//! won: read theirs. Readers take exactly the listed objects, each pinned
//! to its listed ETag (`If-Match`).
//!
//! Why the wait: it lets one look serve many batches. After its PUT a
//! writer asks whether a close has started ([`BagStore::closing_started`]);
//! "no" must mean every closer's listing will hold the batch. A HEAD of
//! `_prelock` that found nothing, *started* at `h`, answers that for every
//! batch whose PUT completed before `h + LOOK_TRUSTED_FOR`: the prelock
//! was created after `h` (the HEAD did not see it), and its closer lists
//! only [`CLOSE_SETTLE`] after its PUT of the prelock returned, so later
//! than `h + CLOSE_SETTLE`, after the batch landed. The store therefore
//! keeps its latest such look per bag and answers from it for
//! [`LOOK_TRUSTED_FOR`] (less than the settle, for clock-rate error),
//! measured from before the HEAD was sent with a [`Stopwatch`] that also
//! counts a suspended host's time. A writer then HEADs about five times a
//! second per bag, not once per batch; a close costs the settle once, and
//! [`BagStore::close_all`] pays it once for many bags. A look that found
//! the prelock is not kept: the lock decides those batches.
//!
//! Every closer and writer of a bucket must run this rule: a closer that
//! lists without the wait (bagel before this rule) can miss a batch that a
//! writer with the rule acknowledged. Upgrade closers (metronome, readers,
//! new holders) before writers.
//!
//! Because closing depends on the create-only PUT being honoured, a store is
//! probed before use ([`ObjectBagStore::probe_conditional_put`]): some
//! "S3-compatible" servers silently ignore `If-None-Match`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::TryStreamExt as _;
use object_store::path::Path;
use object_store::{GetOptions, ObjectStore, ObjectStoreExt as _, PutMode, PutOptions, PutPayload};

use crate::pace::{self, Stopwatch};
use crate::store::{START_DIR, earliest_start};
use crate::{BagState, BagStore, Bucket, Error, ListedItem, Listing, Receipt, Result};

/// The object whose existence says a close of the bag has started.
pub const PRELOCK: &str = "_prelock";
/// The object listing what the closed bag holds ([`Listing`]).
pub const LOCK: &str = "_lock";

/// How long a closer waits between writing `_prelock` and listing the
/// bag; see the module docs. A protocol constant: writers rely on it.
pub const CLOSE_SETTLE: Duration = Duration::from_millis(250);

/// How long a look that found no `_prelock` answers "no close has
/// started" for batches that completed since it was sent. Less than
/// [`CLOSE_SETTLE`] by a fifth: clocks of two hosts may run at slightly
/// different rates (by parts per million; a fifth is far more).
pub const LOOK_TRUSTED_FOR: Duration = Duration::from_millis(200);

/// Looks kept at most, one per bag (a writer writes one or two bags at a
/// time; a process with many logs keeps their latest).
const LOOKS_KEPT: usize = 256;

/// The latest look per bag that found no `_prelock`, each with the
/// stopwatch started before its HEAD was sent.
#[derive(Debug, Default)]
struct Looks {
    absent: Vec<(String, Bucket, Stopwatch)>,
}

impl Looks {
    /// Whether a look at the bag, still trusted, found no prelock.
    fn trusted(&self, log: &str, bucket: Bucket) -> bool {
        self.absent
            .iter()
            .any(|(l, b, w)| *b == bucket && l == log && w.elapsed() < LOOK_TRUSTED_FOR)
    }

    /// Keeps a look that found no prelock, and drops the ones no longer
    /// trusted (and, past [`LOOKS_KEPT`], the oldest).
    fn found_absent(&mut self, log: &str, bucket: Bucket, sent: Stopwatch) {
        self.absent
            .retain(|(l, b, w)| w.elapsed() < LOOK_TRUSTED_FOR && !(*b == bucket && l == log));
        if self.absent.len() >= LOOKS_KEPT {
            self.absent.remove(0);
        }
        self.absent.push((log.to_owned(), bucket, sent));
    }
}

/// The bag store over any `object_store` implementation that honours
/// `PutMode::Create` (S3, or a GCS or Azure store from the same crate).
#[derive(Clone, Debug)]
pub struct ObjectBagStore {
    store: Arc<dyn ObjectStore>,
    /// Key prefix without leading/trailing `/`; may be empty.
    prefix: String,
    describe: String,
    /// Looks for a close, kept for [`LOOK_TRUSTED_FOR`] (module docs).
    looks: Arc<Mutex<Looks>>,
}

impl ObjectBagStore {
    /// Wraps `store`; call [`ObjectBagStore::probe_conditional_put`] before use
    /// unless the store is known to honour conditional writes.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str, describe: String) -> Self {
        ObjectBagStore {
            store,
            prefix: prefix.trim_matches('/').to_owned(),
            describe,
            looks: Arc::default(),
        }
    }

    fn key(&self, rel: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(rel)
        } else {
            Path::from(format!("{}/{rel}", self.prefix))
        }
    }

    fn bag(log: &str, bucket: Bucket) -> String {
        format!("{log}/{}", bucket.path())
    }

    fn store_err(op: &'static str, path: &Path, source: object_store::Error) -> Error {
        Error::Store {
            op,
            path: path.to_string(),
            source,
        }
    }

    /// Checks that a second create-only PUT of one key is refused. Refuses
    /// to run (with [`Error::ConditionalWritesIgnored`]) on a store that
    /// accepts it, because bags could then have two different locks. See
    /// [`bagel_object::probe`].
    pub async fn probe_conditional_put(&self) -> Result<()> {
        Ok(bagel_object::probe_conditional_put(&*self.store, &self.prefix, &self.describe).await?)
    }

    /// Checks that a PUT with `If-Match` on an ETag the object does not
    /// have is refused. Bags never need it (they only create), but leases
    /// on S3 renew and take over with `If-Match`; a store that ignores it
    /// would let two holders both "win" (refused with
    /// [`Error::ConditionalWritesIgnored`]).
    pub async fn probe_conditional_update(&self) -> Result<()> {
        Ok(bagel_object::probe_conditional_update(&*self.store, &self.prefix, &self.describe).await?)
    }

    async fn get_lock(&self, log: &str, bucket: Bucket) -> Result<Option<Listing>> {
        let key = self.key(&format!("{}/{LOCK}", Self::bag(log, bucket)));
        match self.store.get_opts(&key, GetOptions::default()).await {
            Ok(r) => {
                let bytes = r.bytes().await.map_err(|e| Self::store_err("get", &key, e))?;
                Listing::decode(&bytes)
                    .map(Some)
                    .map_err(|reason| Error::CorruptLock {
                        log: log.to_owned(),
                        bucket,
                        reason,
                    })
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Self::store_err("get", &key, e)),
        }
    }

    /// Every object under `prefix`.
    async fn list_all(&self, prefix: &Path) -> Result<Vec<object_store::ObjectMeta>> {
        self.store
            .list(Some(prefix))
            .try_collect()
            .await
            .map_err(|e| Self::store_err("list", prefix, e))
    }

    async fn list_objects(&self, log: &str, bucket: Bucket) -> Result<Vec<ListedItem>> {
        let prefix = self.key(&Self::bag(log, bucket));
        let metas = self.list_all(&prefix).await?;
        let mut items: Vec<ListedItem> = metas
            .into_iter()
            .filter(|m| m.location.parts_count() == prefix.parts_count() + 1)
            .filter_map(|m| {
                let name = m.location.filename()?.to_owned();
                is_batch_object(&name).then(|| ListedItem {
                    name,
                    size: m.size,
                    etag: m.e_tag.as_deref().map(normalize_etag),
                })
            })
            .collect();
        items.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(items)
    }

    fn looks(&self) -> std::sync::MutexGuard<'_, Looks> {
        self.looks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The first half of a close: the bag's lock if it is closed already,
    /// else `None` once `_prelock` is written. The listing may be taken
    /// only [`CLOSE_SETTLE`] after this returns ([`Self::finish_close`]).
    async fn begin_close(&self, log: &str, bucket: Bucket) -> Result<Option<Listing>> {
        if let Some(l) = self.get_lock(log, bucket).await? {
            return Ok(Some(l));
        }
        let prelock = self.key(&format!("{}/{PRELOCK}", Self::bag(log, bucket)));
        self.store
            .put_opts(&prelock, PutPayload::from_static(b""), PutOptions::default())
            .await
            .map_err(|e| Self::store_err("put", &prelock, e))?;
        Ok(None)
    }

    /// The second half of a close, [`CLOSE_SETTLE`] after its
    /// [`Self::begin_close`]: the listing, made the lock (or the lock
    /// another closer made first).
    async fn finish_close(&self, log: &str, bucket: Bucket) -> Result<Listing> {
        let listing = Listing {
            items: self.list_objects(log, bucket).await?,
        };
        let lock = self.key(&format!("{}/{LOCK}", Self::bag(log, bucket)));
        match self
            .store
            .put_opts(
                &lock,
                PutPayload::from(listing.encode()),
                PutOptions::from(PutMode::Create),
            )
            .await
        {
            Ok(_) => Ok(listing),
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => self
                .get_lock(log, bucket)
                .await?
                .ok_or_else(|| Error::CorruptLock {
                    log: log.to_owned(),
                    bucket,
                    reason: "lock PUT was refused as existing, but it cannot be read".into(),
                }),
            Err(e) => Err(Self::store_err("put", &lock, e)),
        }
    }
}

/// `<anything>.<20 digits>`: the objects writers create.
fn is_batch_object(name: &str) -> bool {
    match name.rsplit_once('.') {
        Some((w, seq)) => !w.is_empty() && seq.len() == 20 && seq.bytes().all(|b| b.is_ascii_digit()),
        None => false,
    }
}

/// Why `name` cannot be an object of a bag (the same rule as the
/// directory store's data file names: no separators, no `..`, nothing
/// absolute), or `None`.
fn batch_object_name_problem(name: &str) -> Option<&'static str> {
    if name.contains(['/', '\\']) {
        return Some("contains a path separator: an item is a name inside its bag");
    }
    if name.contains("..") {
        return Some("contains \"..\": an item is a name inside its bag");
    }
    if !is_batch_object(name) {
        return Some("not a batch object name (<writer>.<20-digit sequence>)");
    }
    None
}

/// ETags come quoted from some calls and not others; compare them bare.
fn normalize_etag(e: &str) -> String {
    e.trim_matches('"').to_owned()
}

#[async_trait]
impl BagStore for ObjectBagStore {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    async fn append(
        &self,
        log: &str,
        bucket: Bucket,
        writer_file: &str,
        sequence: u64,
        record: Bytes,
    ) -> Result<Receipt> {
        let name = format!("{writer_file}.{sequence:020}");
        let key = self.key(&format!("{}/{name}", Self::bag(log, bucket)));
        let end = record.len() as u64;
        let put = self
            .store
            .put_opts(
                &key,
                PutPayload::from(record.clone()),
                PutOptions::from(PutMode::Create),
            )
            .await;
        let etag = match put {
            Ok(r) => r.e_tag,
            // The key exists. object_store retries a PUT whose answer
            // was lost, and the retry finds our own first attempt; any
            // other content is someone else's batch, never replaced.
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => {
                let got = self
                    .store
                    .get_opts(&key, GetOptions::default())
                    .await
                    .map_err(|e| Self::store_err("get", &key, e))?;
                let etag = got.meta.e_tag.clone();
                let bytes = got.bytes().await.map_err(|e| Self::store_err("get", &key, e))?;
                if bytes != record {
                    return Err(Error::Invalid {
                        what: "batch object",
                        value: key.to_string(),
                        reason: "exists with other content: two writers share a writer id and instance"
                            .into(),
                    });
                }
                etag
            }
            Err(e) => return Err(Self::store_err("put", &key, e)),
        };
        Ok(Receipt {
            item: name.clone(),
            end,
            etag: etag.as_deref().map(normalize_etag),
        })
    }

    /// A HEAD of `_prelock`, or a look that found none sent less than
    /// [`LOOK_TRUSTED_FOR`] ago (see the module docs for why that answers
    /// for every batch that completed since).
    async fn closing_started(&self, log: &str, bucket: Bucket) -> Result<bool> {
        if self.looks().trusted(log, bucket) {
            return Ok(false);
        }
        let key = self.key(&format!("{}/{PRELOCK}", Self::bag(log, bucket)));
        let head = GetOptions {
            head: true,
            ..Default::default()
        };
        let sent = Stopwatch::start();
        match self.store.get_opts(&key, head).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => {
                self.looks().found_absent(log, bucket, sent);
                Ok(false)
            }
            Err(e) => Err(Self::store_err("head", &key, e)),
        }
    }

    async fn close(&self, log: &str, bucket: Bucket) -> Result<Listing> {
        match self.begin_close(log, bucket).await? {
            Some(closed) => Ok(closed),
            None => {
                pace::sleep(CLOSE_SETTLE).await;
                self.finish_close(log, bucket).await
            }
        }
    }

    /// Every prelock first, one settle, then the listings: closing a
    /// minute's sixty bags waits [`CLOSE_SETTLE`] once, not sixty times.
    async fn close_all(&self, log: &str, buckets: &[Bucket]) -> Result<Vec<Listing>> {
        let mut closed = Vec::with_capacity(buckets.len());
        for &b in buckets {
            closed.push(self.begin_close(log, b).await?);
        }
        if closed.iter().any(Option::is_none) {
            pace::sleep(CLOSE_SETTLE).await;
        }
        let mut listings = Vec::with_capacity(buckets.len());
        for (&b, found) in buckets.iter().zip(closed) {
            listings.push(match found {
                Some(l) => l,
                None => self.finish_close(log, b).await?,
            });
        }
        Ok(listings)
    }

    async fn state(&self, log: &str, bucket: Bucket) -> Result<BagState> {
        if let Some(l) = self.get_lock(log, bucket).await? {
            return Ok(BagState::Closed(l));
        }
        Ok(BagState::Open(self.list_objects(log, bucket).await?))
    }

    async fn read_item(
        &self,
        log: &str,
        bucket: Bucket,
        item: &ListedItem,
        limit: Option<u64>,
    ) -> Result<Bytes> {
        // A lock can be forged by whoever can write to the bucket: an item
        // it lists is read only if it could be one of this bag's objects.
        if let Some(why) = batch_object_name_problem(&item.name) {
            return Err(Error::ItemRefused {
                log: log.to_owned(),
                bucket,
                item: item.name.clone(),
                reason: why.to_owned(),
            });
        }
        let key = self.key(&format!("{}/{}", Self::bag(log, bucket), item.name));
        // A closed bag's item is read as its lock lists it: that ETag, or
        // nothing.
        let opts = GetOptions {
            if_match: limit.and(item.etag.as_ref()).map(|e| format!("\"{e}\"")),
            ..Default::default()
        };
        let r = self.store.get_opts(&key, opts).await.map_err(|e| match e {
            object_store::Error::Precondition { .. } | object_store::Error::NotModified { .. } => {
                Error::ItemChanged {
                    bucket,
                    item: item.name.clone(),
                }
            }
            e => Self::store_err("get", &key, e),
        })?;
        let mut bytes = r.bytes().await.map_err(|e| Self::store_err("get", &key, e))?;
        if let Some(n) = limit {
            bytes.truncate(usize::try_from(n).unwrap_or(usize::MAX));
        }
        Ok(bytes)
    }

    async fn log_start(&self, log: &str) -> Result<Option<Bucket>> {
        let prefix = self.key(&format!("{log}/{START_DIR}"));
        let metas = self.list_all(&prefix).await?;
        Ok(earliest_start(metas.iter().filter_map(|m| m.location.filename())))
    }

    async fn mark_log_start(&self, log: &str, bucket: Bucket) -> Result<()> {
        let key = self.key(&format!("{log}/{START_DIR}/{}", bucket.secs()));
        match self
            .store
            .put_opts(
                &key,
                PutPayload::from_static(b""),
                PutOptions::from(PutMode::Create),
            )
            .await
        {
            Ok(_)
            | Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => {
                Ok(())
            }
            Err(e) => Err(Self::store_err("put", &key, e)),
        }
    }

    async fn put_first(&self, log: &str, name: &str, body: Bytes) -> Result<Option<Bytes>> {
        let key = self.key(&format!("{log}/{name}"));
        match self
            .store
            .put_opts(
                &key,
                PutPayload::from(body.clone()),
                PutOptions::from(PutMode::Create),
            )
            .await
        {
            Ok(_) => Ok(None),
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => self
                .get_named(
                    log,
                    name,
                    (body.len() as u64).max(crate::store::directory::MAX_LOCK_BYTES),
                )
                .await?
                .map(Some)
                .ok_or_else(|| Error::Invalid {
                    what: "protocol object",
                    value: key.to_string(),
                    reason: "its create-only PUT was refused as existing, but it cannot be read".into(),
                }),
            Err(e) => Err(Self::store_err("put", &key, e)),
        }
    }

    async fn get_named(&self, log: &str, name: &str, max: u64) -> Result<Option<Bytes>> {
        let key = self.key(&format!("{log}/{name}"));
        let r = match self.store.get_opts(&key, GetOptions::default()).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(Self::store_err("get", &key, e)),
        };
        if r.meta.size > max {
            return Err(Error::Invalid {
                what: "protocol object",
                value: key.to_string(),
                reason: format!("over {max} bytes: not one the protocol wrote"),
            });
        }
        Ok(Some(
            r.bytes().await.map_err(|e| Self::store_err("get", &key, e))?,
        ))
    }

    async fn remove_named(&self, log: &str, name: &str) -> Result<()> {
        let key = self.key(&format!("{log}/{name}"));
        match self.store.delete(&key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Self::store_err("delete", &key, e)),
        }
    }

    async fn remove_bag(&self, log: &str, bucket: Bucket) -> Result<()> {
        let prefix = self.key(&Self::bag(log, bucket));
        let mut keys: Vec<Path> = self
            .list_all(&prefix)
            .await?
            .into_iter()
            .map(|m| m.location)
            .collect();
        // The lock last: a bag half removed still reads as closed.
        keys.sort_by_key(|k| k.filename() == Some(LOCK));
        for key in keys {
            match self.store.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Self::store_err("delete", &key, e)),
            }
        }
        Ok(())
    }

    async fn list_named(&self, log: &str, dir: &str) -> Result<Vec<String>> {
        let prefix = self.key(&format!("{log}/{dir}"));
        let metas = self.list_all(&prefix).await?;
        Ok(metas
            .iter()
            .filter(|m| m.location.parts_count() == prefix.parts_count() + 1)
            .filter_map(|m| m.location.filename().map(str::to_owned))
            .collect())
    }

    async fn list_level(&self, log: &str, parts: &[String]) -> Result<Vec<String>> {
        let rel = if parts.is_empty() {
            log.to_owned()
        } else {
            format!("{log}/{}", parts.join("/"))
        };
        let prefix = self.key(&rel);
        let r = self
            .store
            .list_with_delimiter(Some(&prefix))
            .await
            .map_err(|e| Self::store_err("list", &prefix, e))?;
        Ok(r.common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_owned))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_object_names() {
        assert!(is_batch_object("host-1.0.00000000000000000001"));
        assert!(!is_batch_object("_lock"));
        assert!(!is_batch_object("_prelock"));
        assert!(!is_batch_object(".00000000000000000001"));
        assert!(!is_batch_object("w.0.123"));
    }

    /// Item names from a lock (which anyone with write access can forge)
    /// are refused by name before anything is fetched.
    #[tokio::test]
    async fn items_outside_the_bag_are_refused_by_name() {
        let store = ObjectBagStore::new(Arc::new(object_store::memory::InMemory::new()), "p", "mem".into());
        let bucket = Bucket::of(bagel_proto::Micros::from_micros(1_700_000_000_000_000));
        for name in [
            "../../other/w.00000000000000000001",
            "/etc/w.00000000000000000001",
            "a\\b.00000000000000000001",
            "w..00000000000000000001",
            "lock",
        ] {
            let item = ListedItem {
                name: name.to_owned(),
                size: 1,
                etag: None,
            };
            let err = store.read_item("log", bucket, &item, Some(1)).await.unwrap_err();
            assert!(matches!(err, Error::ItemRefused { .. }), "{name}: {err}");
        }
    }

    #[cfg(feature = "testing")]
    fn two_processes() -> (ObjectBagStore, ObjectBagStore, Bucket) {
        let mem = Arc::new(object_store::memory::InMemory::new());
        let of = |who: &str| ObjectBagStore::new(Arc::clone(&mem) as Arc<dyn ObjectStore>, "p", who.into());
        let bucket = Bucket::of(bagel_proto::Micros::from_micros(1_700_000_000_000_000));
        (of("writer"), of("closer"), bucket)
    }

    /// The rule that lets a writer skip the HEAD after most batches, on
    /// the simulated clock: a look that found no close answers "none
    /// started" for [`LOOK_TRUSTED_FOR`], even once a closer has written
    /// its prelock (so the writer sent no request), and the promise that
    /// answer makes holds: the closer, which lists only [`CLOSE_SETTLE`]
    /// after its prelock, lists the batch that landed just before the
    /// trust ran out. Past the trust, the writer looks again and finds
    /// the close.
    #[cfg(feature = "testing")]
    #[tokio::test(start_paused = true)]
    async fn a_look_that_found_no_close_answers_until_any_closer_would_list_the_batch() {
        let (writer, closer, bucket) = two_processes();
        assert!(!writer.closing_started("log", bucket).await.unwrap());
        let close = tokio::spawn(async move { closer.close("log", bucket).await });
        let prelock = Path::from(format!("p/{}/{PRELOCK}", ObjectBagStore::bag("log", bucket)));
        while writer.store.head(&prelock).await.is_err() {
            tokio::task::yield_now().await;
        }
        tokio::time::advance(LOOK_TRUSTED_FOR - Duration::from_millis(1)).await;
        let record = Bytes::from_static(b"late batch");
        let receipt = writer.append("log", bucket, "w.0.0", 1, record).await.unwrap();
        assert!(
            !writer.closing_started("log", bucket).await.unwrap(),
            "still trusted: no request, though the prelock exists"
        );
        let listing = close.await.unwrap().unwrap();
        assert!(listing.covers(&receipt), "the closer lists it: {listing:?}");
        tokio::time::advance(LOOK_TRUSTED_FOR).await;
        assert!(writer.closing_started("log", bucket).await.unwrap());
    }

    /// The looks kept are bounded: a process looking at more bags than
    /// [`LOOKS_KEPT`] within the trust keeps the latest, and a dropped
    /// look only costs a HEAD.
    #[cfg(feature = "testing")]
    #[tokio::test(start_paused = true)]
    async fn the_looks_kept_are_bounded() {
        let (writer, _, first) = two_processes();
        let bags: Vec<Bucket> = std::iter::successors(Some(first), |b| Some(b.next()))
            .take(LOOKS_KEPT + 44)
            .collect();
        for b in &bags {
            assert!(!writer.closing_started("log", *b).await.unwrap());
        }
        let looks = writer.looks();
        assert_eq!(looks.absent.len(), LOOKS_KEPT);
        assert!(looks.trusted("log", *bags.last().unwrap()));
        assert!(!looks.trusted("log", bags[0]), "the oldest look was dropped");
    }

    /// A close waits [`CLOSE_SETTLE`] between its prelock and its listing;
    /// closing a minute's bags together waits it once, and closing bags
    /// already closed not at all.
    #[cfg(feature = "testing")]
    #[tokio::test(start_paused = true)]
    async fn closing_many_bags_settles_once() {
        let (writer, closer, first) = two_processes();
        let bags: Vec<Bucket> = std::iter::successors(Some(first), |b| Some(b.next()))
            .take(60)
            .collect();
        for (i, b) in bags.iter().enumerate() {
            writer
                .append("log", *b, "w.0.0", i as u64, Bytes::from_static(b"x"))
                .await
                .unwrap();
        }
        let started = tokio::time::Instant::now();
        closer.close("log", bags[0]).await.unwrap();
        assert_eq!(started.elapsed(), CLOSE_SETTLE);
        let started = tokio::time::Instant::now();
        closer.close_all("log", &bags).await.unwrap();
        assert_eq!(started.elapsed(), CLOSE_SETTLE);
        for b in &bags {
            assert!(
                matches!(closer.state("log", *b).await.unwrap(), BagState::Closed(l) if l.items.len() == 1)
            );
        }
        let started = tokio::time::Instant::now();
        closer.close_all("log", &bags).await.unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}
