//! The bytes of a `List` answer, bounded before the page is read: a call
//! reserves `envelope + page size × entry` from the unread-answer budgets
//! when it is admitted (see `crate::transport::answers`), before it waits
//! for its page turn, and its page is then cut to what was reserved. A
//! client holding answers it does not read thus gets shorter pages, then
//! refusals, and never makes the server hold more than its share.

use bagel_proto::pb;
use prost::Message as _;

use crate::config::Limits;

/// The gRPC message prefix (compression flag, length).
const PREFIX: usize = 5;

/// The most one listed name encodes to, in the answer: the name, the lease
/// id (32 hex digits), the owner, and the holder's numbers, with their
/// tags and lengths.
pub(crate) fn entry(limits: &Limits) -> usize {
    limits.max_name_bytes + limits.max_owner_bytes + 96
}

/// The most an answer encodes to besides its names: the page token (a
/// name), the revision and the page size, and the message prefix.
pub(crate) fn envelope(limits: &Limits) -> usize {
    PREFIX + limits.max_name_bytes + 64
}

/// The bytes to reserve for a page of `limit` names: (all of it, at least
/// one name).
pub(crate) fn reservation(limits: &Limits, limit: usize) -> (usize, usize) {
    let one = envelope(limits) + entry(limits);
    let all = envelope(limits).saturating_add(limit.saturating_mul(entry(limits)));
    (all, one)
}

/// Cuts `page` so that its answer encodes to at most `bytes` (its first
/// name is always kept, so that paging goes on); a page cut short resumes
/// after the last name kept, which the caller may read (it was listed).
pub(crate) fn cut(page: &mut pb::ListResponse, bytes: usize) {
    if PREFIX + page.encoded_len() <= bytes {
        return;
    }
    // The token after the cut is one of the names; the other fields stay.
    let longest = page.names.iter().map(|n| n.name.len()).max().unwrap_or(0);
    let fixed = PREFIX
        + pb::ListResponse {
            names: Vec::new(),
            next_page_token: "x".repeat(longest),
            max_page_size: page.max_page_size,
            revision: page.revision,
        }
        .encoded_len();
    let mut used = fixed;
    let mut keep = 0;
    for name in &page.names {
        let cost = prost::encoding::message::encoded_len(1, name);
        if keep > 0 && used + cost > bytes {
            break;
        }
        used += cost;
        keep += 1;
    }
    if keep < page.names.len() {
        page.names.truncate(keep);
        if let Some(last) = page.names.last() {
            page.next_page_token = last.name.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(n: usize) -> pb::ListResponse {
        pb::ListResponse {
            names: (0..n)
                .map(|i| pb::ListedName {
                    name: format!("cut/{i:05}"),
                    holder: Some(pb::Holder {
                        lease_id: "0".repeat(32),
                        owner: "o".repeat(40),
                        mode: 1,
                        deadline_us: u64::MAX,
                        fencing_token: u64::MAX,
                        granted_at_us: u64::MAX,
                    }),
                })
                .collect(),
            next_page_token: String::new(),
            max_page_size: 1000,
            revision: u64::MAX,
        }
    }

    #[test]
    fn a_page_over_its_reservation_is_cut_and_resumes_after_its_last_name() {
        let mut p = page(100);
        let whole = PREFIX + p.encoded_len();
        cut(&mut p, whole / 2);
        assert!(PREFIX + p.encoded_len() <= whole / 2);
        assert!(p.names.len() >= 40 && p.names.len() < 50, "{}", p.names.len());
        assert_eq!(p.next_page_token, p.names.last().unwrap().name);
    }

    #[test]
    fn a_page_within_it_is_left_whole_and_one_name_is_always_kept() {
        let mut p = page(10);
        cut(&mut p, 1 << 20);
        assert_eq!((p.names.len(), p.next_page_token.as_str()), (10, ""));
        cut(&mut p, 1);
        assert_eq!(p.names.len(), 1);
        assert_eq!(p.next_page_token, "cut/00000");
    }

    #[test]
    fn the_bound_of_one_name_covers_the_largest_name_the_limits_allow() {
        let limits = Limits::default();
        let mut p = page(1);
        p.names[0].name = "n".repeat(limits.max_name_bytes);
        p.names[0].holder.as_mut().unwrap().owner = "o".repeat(limits.max_owner_bytes);
        p.next_page_token = "n".repeat(limits.max_name_bytes);
        let (_, one) = reservation(&limits, 1000);
        assert!(
            PREFIX + p.encoded_len() <= one,
            "{} > {one}",
            PREFIX + p.encoded_len()
        );
    }
}
