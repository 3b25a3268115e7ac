//! The storage trait every backend implements, and what is written once
//! over it: walking a log's calendar tree, and its start marks.

pub(crate) mod beneath;
pub mod counting;
pub mod directory;
#[cfg(any(test, feature = "testing"))]
pub mod faults;
pub mod fsops;
#[cfg(any(test, feature = "testing"))]
pub mod memory;
pub mod nfs;
pub mod object;
pub mod timeout;
pub mod url;

use std::fmt;

use async_trait::async_trait;
use bytes::Bytes;

use crate::bucket::Bucket;
use crate::error::Result;
use crate::listing::{ListedItem, Listing, Receipt};

/// Whether a bag is closed, and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BagState {
    /// Its lock exists: the bag is exactly this.
    Closed(Listing),
    /// Not (yet) closed; these items exist now.
    Open(Vec<ListedItem>),
}

/// A storage backend holding bags. One implementation per kind of storage;
/// the writer, metronome and reader are written once over this trait.
///
/// Every method is idempotent and safe to run concurrently from any number
/// of processes, except that one `writer_file` is appended to by one writer
/// at a time (the [`Writer`](crate::Writer) serialises its batches).
#[async_trait]
pub trait BagStore: Send + Sync + fmt::Debug {
    /// A short description for messages, e.g. the store URL.
    fn describe(&self) -> String;

    /// Appends one framed record (see [`frame`](crate::frame)) for writer `writer_file` to
    /// the bag. Fails with [`Error::BagClosed`](crate::Error::BagClosed) when the bag is visibly
    /// closed already. `sequence` is the record's first sequence number
    /// (backends that store one object per record name it with it).
    async fn append(
        &self,
        log: &str,
        bucket: Bucket,
        writer_file: &str,
        sequence: u64,
        record: Bytes,
    ) -> Result<Receipt>;

    /// Whether some process has started closing the bag.
    async fn closing_started(&self, log: &str, bucket: Bucket) -> Result<bool>;

    /// Closes the bag (or finishes someone else's close) and returns the
    /// lock listing, which is the same for every caller.
    async fn close(&self, log: &str, bucket: Bucket) -> Result<Listing>;

    /// Closes every bag of `buckets` (as [`BagStore::close`]) and returns
    /// their listings in the same order, stopping at the first error. A
    /// store whose close waits between its steps (S3: see
    /// [`crate::store::object`]) waits once for them all.
    async fn close_all(&self, log: &str, buckets: &[Bucket]) -> Result<Vec<Listing>> {
        let mut listings = Vec::with_capacity(buckets.len());
        for &b in buckets {
            listings.push(self.close(log, b).await?);
        }
        Ok(listings)
    }

    /// The bag's current state, without changing anything.
    async fn state(&self, log: &str, bucket: Bucket) -> Result<BagState>;

    /// Reads one item: at most `limit` bytes (the listed size) when given,
    /// else all of it.
    async fn read_item(
        &self,
        log: &str,
        bucket: Bucket,
        item: &ListedItem,
        limit: Option<u64>,
    ) -> Result<Bytes>;

    /// Lists the child "directories" of `<log>/<parts...>/` (one tree level).
    async fn list_level(&self, log: &str, parts: &[String]) -> Result<Vec<String>>;

    /// The earliest bag any writer of `log` declared it may write
    /// ([`BagStore::mark_log_start`]); `None` when none did. Readers seal
    /// the missing past bags from there on.
    async fn log_start(&self, log: &str) -> Result<Option<Bucket>>;

    /// Declares that writers may write `log` from `bucket` on. Create-only
    /// and idempotent; the earliest mark wins.
    async fn mark_log_start(&self, log: &str, bucket: Bucket) -> Result<()>;

    /// Creates the protocol object `<log>/<name>` holding `body` unless it
    /// exists: `None` when this call created it, else the bytes of whoever
    /// created it first. Create-only (on a directory a private
    /// file linked into place, on S3 a PUT with `If-None-Match: *`), so
    /// every caller gets the same bytes. `name` is one of the protocol's
    /// own (its first segment starts with `_`, which no log segment may).
    async fn put_first(&self, log: &str, name: &str, body: Bytes) -> Result<Option<Bytes>>;

    /// Reads the protocol object `<log>/<name>`: `None` when it does not
    /// exist; refused ([`crate::Error::Invalid`]) when it is over `max`
    /// bytes, which no object the protocol writes is.
    async fn get_named(&self, log: &str, name: &str, max: u64) -> Result<Option<Bytes>>;

    /// Removes the protocol object `<log>/<name>`; one that does not exist
    /// is fine.
    async fn remove_named(&self, log: &str, name: &str) -> Result<()>;

    /// The names of the protocol objects directly under `<log>/<dir>/`
    /// (not their contents; nothing when the directory does not exist).
    async fn list_named(&self, log: &str, dir: &str) -> Result<Vec<String>>;

    /// Deletes a bag whole (its items, markers, lock and directory); one
    /// that does not exist is fine. Only retention calls it, and only for
    /// bags a checked summary holds ([`crate::retain`]), once their
    /// minute's tombstone exists ([`crate::tombstone`]), which keeps the
    /// bag closed once it is gone. Its lock goes last, so a bag half
    /// removed still reads as closed on its own too.
    async fn remove_bag(&self, log: &str, bucket: Bucket) -> Result<()>;
}

/// Where a log keeps its start marks (`<log>/_start/<unix seconds>`): a
/// name no log segment or bag path can take.
pub(crate) const START_DIR: &str = "_start";

/// The earliest of a log's start marks, from their names.
pub(crate) fn earliest_start<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<Bucket> {
    names
        .into_iter()
        .filter_map(|n| n.parse::<u64>().ok())
        .min()
        .map(Bucket::from_secs)
}

/// Every bucket of `log` that exists in `store` within `[from, to]`,
/// ascending, found by walking the `YYYY/MM/DD/hh/mm/ss` tree and pruning
/// subtrees outside the range.
pub async fn list_buckets(store: &dyn BagStore, log: &str, from: Bucket, to: Bucket) -> Result<Vec<Bucket>> {
    let lo = from.parts();
    let hi = to.parts();
    let mut out = Vec::new();
    // Depth-first over (prefix parts, tight_lo, tight_hi).
    let mut stack: Vec<(Vec<u64>, bool, bool)> = vec![(Vec::new(), true, true)];
    while let Some((prefix, tight_lo, tight_hi)) = stack.pop() {
        let depth = prefix.len();
        if depth == 6 {
            let p: [u64; 6] = prefix.clone().try_into().expect("six parts");
            if let Some(b) = Bucket::from_parts(p)
                && b >= from
                && b <= to
            {
                out.push(b);
            }
            continue;
        }
        let names: Vec<String> = prefix
            .iter()
            .enumerate()
            .map(|(i, v)| {
                if i == 0 {
                    format!("{v:04}")
                } else {
                    format!("{v:02}")
                }
            })
            .collect();
        let mut children: Vec<u64> = store
            .list_level(log, &names)
            .await?
            .iter()
            .filter(|n| n.len() == if depth == 0 { 4 } else { 2 })
            .filter_map(|n| n.parse().ok())
            .filter(|v| (!tight_lo || *v >= lo[depth]) && (!tight_hi || *v <= hi[depth]))
            .collect();
        children.sort_unstable();
        for v in children.into_iter().rev() {
            let mut p = prefix.clone();
            p.push(v);
            stack.push((p, tight_lo && v == lo[depth], tight_hi && v == hi[depth]));
        }
    }
    Ok(out)
}
