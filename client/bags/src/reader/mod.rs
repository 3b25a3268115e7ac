//! Ordered, checked reads of a time range of a log.
//!
//! Closed bags are read exactly as their lock lists them (each item up to
//! its listed size, nothing else); a past-due bag found open is closed
//! first; still-open bags are skipped, or read up to each item's last whole
//! record with [`ReadOptions::include_open`]. Messages come back ordered by
//! `(timestamp, writer, sequence)`.
//!
//! A past-due bag that does not exist yet, inside the log's life (from the
//! earliest writer start mark on), is *sealed*: closed empty, by its
//! minute's seal once the whole minute is past due ([`crate::seal`]), else
//! on its own. Otherwise a stalled writer could create it after this read
//! and a later reader would see messages this one did not; sealed, the
//! writer finds it closed and is refused. So any two readers of a past
//! range read the same messages. A minute's seal decides its seconds: a
//! bag made in a second it closed empty is never read.
//!
//! Every message is checked: the signatures of the witnesses it cites, that
//! its batch is signed by the holder key each of those witnesses names
//! ([`crate::holder_sig`]), that its timestamp lies strictly between each
//! lease's `min_timestamp` and `deadline`, and that it is near its batch's
//! signed time. A message that fails goes to [`ReadReport::rejected`] with
//! the reason; damaged records, a batch found in another log or bag than
//! it names, and a second copy of a batch already read (a file listed
//! twice, or copied under another name) go to [`ReadReport::problems`].
//! Nothing is dropped silently. Whatever could not be checked (no key ring,
//! a lease acquired without a holder key, a signed time without its key)
//! is in the message's notes: [`Message::verified`] means there are none.
//!
//! # Layout
//! * `options`, `report`: what a read is asked for and what it returns.
//! * `settle`: which bags of the range are read; closing past-due bags
//!   and sealing missing ones, within the lookback.
//! * `summaries`: the summaries minutes are read from instead of bags.
//! * `vouched`: a bag of a summary a trusted summarizer attested, read
//!   without rebuilding its batches.
//! * `items`: an item's bytes into records and batches; copies and
//!   misplaced batches.
//! * `check`: every batch's witnesses, holder signatures, signed time and
//!   bounds, and the messages they yield.
//! * `seen`: the read's state (batches met, verdicts so far, batches
//!   waiting for their signatures to be checked in rounds).
//! * `on_cores`: those checks spread over the machine's cores.

mod check;
mod items;
mod on_cores;
mod options;
mod report;
mod seen;
mod settle;
mod summaries;
#[cfg(test)]
mod tests;
mod vouched;

pub use options::{DEFAULT_MAX_ITEM_BYTES, DEFAULT_MAX_SEAL_LOOKBACK, Progress, ReadOptions};
pub use report::{Message, Problem, ProblemKind, ReadReport, Rejected, Vouched};
#[cfg(test)]
pub(crate) use vouched::VOUCHED_BAGS_READ;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use bagel_proto::Micros;
use bagel_proto::clock::CheckedClock;

use crate::{BagConfig, BagState, BagStore, Bucket, Result, list_buckets, validate_log};

use items::{Place, read_item};
use seen::{CHECK_ROUND, Seen};
use settle::{Range, meanwhile, missing_problems, settle};
use summaries::{Picked, pick_summaries, read_summarized, uncovered};
use vouched::{Vouching, read_vouched_bag};

/// Reads `[from, to)` of `log`; see the module docs.
pub async fn read(
    store: &dyn BagStore,
    log: &str,
    opts: &ReadOptions,
    cfg: &BagConfig,
    clock: &dyn CheckedClock,
) -> Result<ReadReport> {
    validate_log(log)?;
    let mut report = ReadReport::default();
    if opts.to <= opts.from {
        return Ok(report);
    }
    // Closing acts on the instant true time has surely reached, checked
    // once: a reader whose clock is ahead must not seal the next seconds.
    // Refused, it closes nothing and says why (see `crate::vouched`).
    let closer_now = if opts.close_past_due {
        match crate::closer_now(clock).await {
            Ok(now) => Some(now),
            Err(e @ crate::Error::ClockUnvouched { .. }) => {
                report.close_refused = Some(e.to_string());
                None
            }
            Err(e) => return Err(e),
        }
    } else {
        None
    };
    // Year 9999 is as far as the tree goes.
    let to = opts.to.min(Micros::from_micros(253_402_300_800_000_000));
    let first = Bucket::of(opts.from);
    let last = Bucket::of(to.saturating_sub_us(1));
    // Summaries cover whole minutes: the ones used are read from them, and
    // nothing of those minutes is listed, sealed or opened. Listed even
    // when not read from: they say where the messages of bags retention
    // removed are.
    let published = crate::summary::list(store, log).await?;
    // Seals first, then bags: a bag a seal lists existed when it was
    // sealed, so this listing sees it (unless retention removed it). The
    // same listing names the minutes retention removed (their
    // tombstones), which are read only from the summary a tombstone names.
    let (sealed_spans, removed_spans) = crate::seal::sealed_and_removed(store, log).await?;
    let Picked { summaries, owners } = match opts.use_summaries {
        true => {
            pick_summaries(
                store,
                log,
                (&published, &removed_spans),
                (first, last),
                opts,
                &mut report,
            )
            .await?
        }
        false => Picked {
            summaries: Vec::new(),
            owners: Default::default(),
        },
    };
    let summarized = |b: &Bucket| summaries.iter().any(|(window, _, _)| window.contains(*b));
    let mut existing = Vec::new();
    for (a, b) in uncovered(first, last, &summaries) {
        existing.extend(list_buckets(store, log, a, b).await?);
    }
    let life = match closer_now {
        Some(now) => store.log_start(log).await?.map(|start| (now, start)),
        None => None,
    };
    let range = Range {
        log,
        first,
        last,
        sealed: &sealed_spans,
        removed: &removed_spans,
        summarized: &summarized,
        published: &published,
    };
    let settled = settle(store, &range, existing, life, opts, cfg).await?;
    report.sealed = settled.sealed;
    report
        .problems
        .extend(missing_problems(&settled.missing, &published, &owners));
    let buckets = settled.buckets;
    let read_from_bags: BTreeSet<Bucket> = buckets.iter().copied().collect();
    let mut read_closed = BTreeSet::new();
    // Bags and summarized bags, in one ascending order: a batch found twice
    // is reported at the same second copy either way.
    let mut sources: Vec<(Bucket, Option<(usize, usize)>)> = buckets.into_iter().map(|b| (b, None)).collect();
    for (i, (window, s, _)) in summaries.iter().enumerate() {
        for (j, bag) in s.bags.iter().enumerate() {
            let b = Bucket::from_secs(bag.bucket_secs);
            if (first..=last).contains(&b) && window.contains(b) {
                sources.push((b, Some((i, j))));
            }
        }
    }
    sources.sort_by_key(|(b, _)| *b);
    report.summaries_read = summaries.len() as u64;
    report.summaries_attested = summaries.iter().filter(|(_, _, v)| v.is_some()).count() as u64;
    let total = sources.len() as u64;
    // Room for the batches and messages of the attested summaries' bags in
    // range, made in one go (not grown, and copied, step by step).
    let (batches, messages) = summaries
        .iter()
        .filter(|(_, _, v)| v.is_some())
        .flat_map(|(window, s, _)| s.bags.iter().map(move |b| (window, b)))
        .filter(|(window, b)| {
            let b = Bucket::from_secs(b.bucket_secs);
            (first..=last).contains(&b) && window.contains(b)
        })
        .map(|(_, b)| b)
        .flat_map(|b| &b.items)
        .flat_map(|i| &i.batches)
        .fold((0, 0), |(b, m), batch| (b + 1, m + batch.payloads.len()));
    report.messages.reserve(messages);
    let mut seen = Seen {
        summaries: &summaries,
        batches: HashMap::with_capacity(batches),
        ..Seen::default()
    };
    // The attested summary being read without rebuilding its batches (by
    // index; `None`: it is read as any summary).
    let mut vouching: Option<(usize, Option<Vouching>)> = None;
    for (done, (bucket, from_summary)) in sources.into_iter().enumerate() {
        if let Some(p) = &opts.progress {
            p.report(done as u64, total);
        }
        if let Some((i, j)) = from_summary {
            let (_, summary, vouched) = &summaries[i];
            if let Some(key_id) = vouched {
                if vouching.as_ref().is_none_or(|(k, _)| *k != i) {
                    vouching = Some((i, Vouching::new(summary, key_id, opts)));
                }
                if let Some((_, Some(v))) = &mut vouching {
                    // What was read before becomes messages first: the
                    // messages come in the order read, as from the bags.
                    seen.finish(&mut report, opts, cfg).await;
                    read_vouched_bag(&mut report, &mut seen, opts, cfg, &summaries, (i, j), v).await?;
                    report.closed_bags_read += 1;
                    continue;
                }
            }
            read_summarized(
                &mut report,
                &mut seen,
                opts,
                log,
                summary,
                &summary.bags[j],
                vouched,
            )?;
            report.closed_bags_read += 1;
            if seen.pending.len() >= CHECK_ROUND {
                seen.next_round(&mut report, opts, cfg).await;
            }
            continue;
        }
        let (items, open) = match store.state(log, bucket).await? {
            BagState::Closed(l) => (l.items, false),
            BagState::Open(_) if closer_now.is_some_and(|now| now >= bucket.close_time(cfg.grace)) => {
                (store.close(log, bucket).await?.items, false)
            }
            BagState::Open(items) if opts.include_open => (items, true),
            BagState::Open(_) => {
                report.skipped_open.push(bucket);
                continue;
            }
        };
        if !open {
            report.closed_bags_read += 1;
            read_closed.insert(bucket);
        }
        for item in items {
            let at = Place {
                log,
                bucket,
                name: Arc::from(item.name.as_str()),
                item: &item,
                open,
                vouched: None,
            };
            if let Some(p) = at.too_big(opts) {
                report.problems.push(p);
                continue;
            }
            // An open item may have grown since it was listed: still bounded.
            let limit = if open { opts.max_item_bytes } else { item.size };
            match store.read_item(log, bucket, &item, Some(limit)).await {
                Ok(bytes) => read_item(&mut report, &mut seen, opts, &at, bytes),
                Err(e @ (crate::Error::ItemChanged { .. } | crate::Error::ItemRefused { .. })) => {
                    report.problems.push(at.damaged(None, e.to_string()))
                }
                // Retention removes a bag's items before its lock: one
                // removed under this read is missing, not a failed read.
                Err(e) if !open && e.is_not_found() => report.problems.push(Problem {
                    kind: ProblemKind::Missing,
                    what: format!(
                        "listed by the bag's lock, and gone{}",
                        match published.iter().find(|st| st.contains(bucket)) {
                            Some(st) => format!(
                                " (removed by retention): its messages are in summary {} ({st}); read \
                                 them with summaries",
                                st.name()
                            ),
                            None => ", and no published summary holds it".into(),
                        }
                    ),
                    ..at.damaged(None, String::new())
                }),
                Err(e) => return Err(e),
            }
        }
        if seen.pending.len() >= CHECK_ROUND {
            seen.next_round(&mut report, opts, cfg).await;
        }
    }
    seen.finish(&mut report, opts, cfg).await;
    let changed = meanwhile(store, &range, &read_from_bags).await?;
    report.problems.extend(changed.removed);
    if !changed.not_in_seal.is_empty() {
        let dropped = |b: &Bucket| changed.not_in_seal.contains(b);
        report.messages.retain(|m| !dropped(&m.bucket));
        report.rejected.retain(|r| !dropped(&r.message.bucket));
        report.problems.retain(|p| !dropped(&p.bucket));
        report.skipped_open.retain(|b| !dropped(b));
        report.closed_bags_read -= changed.not_in_seal.intersection(&read_closed).count() as u64;
    }
    if let Some(p) = &opts.progress {
        p.report(total, total);
    }
    // Stable: messages that compare equal stay in the order read. The
    // runs already in order (each attested bag's) are found, not moved.
    report.messages.sort_by(order);
    report.rejected.sort_by(|a, b| order(&a.message, &b.message));
    Ok(report)
}

/// The order of a read's messages: by `(timestamp, writer, sequence)`,
/// compared in place (no key is built or cloned per comparison).
pub(super) fn order(a: &Message, b: &Message) -> std::cmp::Ordering {
    (a.timestamp, &a.writer_id, a.sequence).cmp(&(b.timestamp, &b.writer_id, b.sequence))
}

trait SubUs {
    fn saturating_sub_us(self, us: u64) -> Micros;
}

impl SubUs for Micros {
    fn saturating_sub_us(self, us: u64) -> Micros {
        Micros::from_micros(self.as_micros().saturating_sub(us))
    }
}
