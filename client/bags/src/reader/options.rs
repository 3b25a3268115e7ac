//! What a read is asked for: [`ReadOptions`] and its progress callback.

use std::sync::Arc;

use bagel_proto::{KeyRing, Micros};

/// What to read.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ReadOptions {
    /// First timestamp included.
    pub from: Micros,
    /// First timestamp excluded.
    pub to: Micros,
    /// Also read bags that are not closed yet (each item up to its last
    /// whole record). Such messages may still be rejected by the close.
    pub include_open: bool,
    /// Close past-due bags found open before reading them, and seal the
    /// missing ones (default on). Without it, two readers of one range may
    /// disagree.
    pub close_past_due: bool,
    /// Read minutes that have a published summary from it rather than from
    /// their bags (default on); the messages are the same either way
    /// while the bags exist. Read without, the bags retention removed are
    /// [`ProblemKind::Missing`](super::ProblemKind::Missing) problems naming the summary that holds
    /// them.
    pub use_summaries: bool,
    /// Trusted witness/time keys. `None`: signatures are not checked and
    /// every message carries a note saying so.
    pub keys: Option<KeyRing>,
    /// Trusted Roughtime keys, for signed times that are Roughtime proofs.
    pub roughtime_keys: Vec<bagel_proto::signed_time::roughtime::RoughtimeKey>,
    /// Told (bags read, bags to read) as the read goes (a progress bar).
    pub progress: Option<Progress>,
    /// An item listed (or found, in an open bag) bigger than this is not
    /// read but reported as a problem: whoever can write to the store must
    /// not make a reader hold more than this per item.
    pub max_item_bytes: u64,
    /// Missing bags are sealed at most this far back from now; a read that
    /// would seal older ones is refused ([`crate::Error::SealTooFar`]), so
    /// a stray start mark cannot make a reader create bags back to 1970.
    pub max_seal_lookback: std::time::Duration,
    /// Summarizers whose attestations this read trusts
    /// ([`crate::summary::attest`]): a summary attested by one of these
    /// keys over exactly the bytes read has its batches' holder signatures
    /// and (local) signed times taken as the summarizer verified them, not
    /// verified again; every other check is made. `None`: every signature
    /// is checked, attestations are not looked at.
    pub trusted_summarizers: Option<KeyRing>,
}

/// [`ReadOptions::max_item_bytes`] by default: 1 GiB.
pub const DEFAULT_MAX_ITEM_BYTES: u64 = 1 << 30;
/// [`ReadOptions::max_seal_lookback`] by default: one hour.
pub const DEFAULT_MAX_SEAL_LOOKBACK: std::time::Duration = std::time::Duration::from_secs(3600);

/// A callback told `(done, total)` as long work advances.
#[derive(Clone)]
pub struct Progress(Arc<dyn Fn(u64, u64) + Send + Sync>);

impl Progress {
    /// Wrap `f`, called with `(done, total)` from the reading task: keep it quick.
    pub fn new(f: impl Fn(u64, u64) + Send + Sync + 'static) -> Self {
        Progress(Arc::new(f))
    }

    pub(super) fn report(&self, done: u64, total: u64) {
        (self.0)(done, total);
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress")
    }
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            from: Micros::ZERO,
            to: Micros::MAX,
            include_open: false,
            use_summaries: true,
            close_past_due: true,
            keys: None,
            roughtime_keys: Vec::new(),
            progress: None,
            max_item_bytes: DEFAULT_MAX_ITEM_BYTES,
            max_seal_lookback: DEFAULT_MAX_SEAL_LOOKBACK,
            trusted_summarizers: None,
        }
    }
}

impl ReadOptions {
    /// Set [`ReadOptions::progress`].
    #[must_use]
    pub fn with_progress(mut self, progress: Progress) -> Self {
        self.progress = Some(progress);
        self
    }

    /// Read the timestamps `[from, to)`.
    pub fn with_range(mut self, from: Micros, to: Micros) -> Self {
        self.from = from;
        self.to = to;
        self
    }
    /// Set [`ReadOptions::max_item_bytes`].
    #[must_use]
    pub fn with_max_item_bytes(mut self, bytes: u64) -> Self {
        self.max_item_bytes = bytes;
        self
    }
    /// Set [`ReadOptions::max_seal_lookback`].
    #[must_use]
    pub fn with_max_seal_lookback(mut self, d: std::time::Duration) -> Self {
        self.max_seal_lookback = d;
        self
    }
    /// Trust these summarizers' attestations (see
    /// [`ReadOptions::trusted_summarizers`]); an empty ring trusts none.
    #[must_use]
    pub fn with_trusted_summarizers(mut self, keys: KeyRing) -> Self {
        self.trusted_summarizers = (!keys.is_empty()).then_some(keys);
        self
    }
    /// Set [`ReadOptions::use_summaries`].
    #[must_use]
    pub fn with_summaries(mut self, yes: bool) -> Self {
        self.use_summaries = yes;
        self
    }

    /// Set [`ReadOptions::include_open`].
    pub fn with_include_open(mut self, yes: bool) -> Self {
        self.include_open = yes;
        self
    }
    /// Set [`ReadOptions::close_past_due`].
    #[must_use]
    pub fn with_close_past_due(mut self, yes: bool) -> Self {
        self.close_past_due = yes;
        self
    }
    /// Set [`ReadOptions::keys`]; `None` reads without checking signatures.
    #[must_use]
    pub fn with_keys(mut self, keys: Option<KeyRing>) -> Self {
        self.keys = keys;
        self
    }
    /// Set [`ReadOptions::roughtime_keys`].
    #[must_use]
    pub fn with_roughtime_keys(
        mut self,
        keys: Vec<bagel_proto::signed_time::roughtime::RoughtimeKey>,
    ) -> Self {
        self.roughtime_keys = keys;
        self
    }
}
