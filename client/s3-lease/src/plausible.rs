//! Whether a lease object read from the store is one an honest client
//! could have written.
//!
//! Anyone who may write the prefix may write a lease object, and a value
//! taken on trust turns into a wedge: a deadline of `u64::MAX` holds the
//! name forever, a grant time of `u64::MAX` makes every later grant "too
//! early", a watermark above any deadline hands every next holder a
//! `min_timestamp` it can never write after. So every time in an object is
//! bounded by what the store's rules allow, judged on the reader's checked
//! clock: nothing was granted later than now (plus the clock slack), no
//! deadline or watermark lies further ahead than the max TTL (plus slack),
//! a watermark is below the deadline of the lease holding the name, a
//! holder's clock bound is not absurd. What fails is a precise error
//! naming the field, its value and the rule (the backend adds the object's
//! path); never a silent clamp.

use std::time::Duration;

use bagel_lease_core::Micros;

use crate::object::LeaseObject;

/// The largest clock error bound an object may state for its holder. An
/// honest bound is at most half the clock margin its holder runs with;
/// beyond this the object would stall takeovers for no reason a clock can
/// have.
pub const MAX_CLOCK_BOUND: Duration = Duration::from_secs(600);

/// What the reader judges an object against.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The reader's checked clock.
    pub now: Micros,
    /// The longest lease any client of the store grants.
    pub max_ttl: Duration,
    /// How far another honest client's clock may be ahead of the reader's
    /// (the clock margin plus the reader's own error bound).
    pub slack: Duration,
}

fn field(name: &str, value: u64, rule: String) -> String {
    format!("{name} = {value} ({}): {rule}", Micros::from_micros(value))
}

/// `Ok` if `obj` keeps the store's rules as seen at `l.now`; else which
/// field breaks which rule.
pub fn check(obj: &LeaseObject, l: &Limits) -> Result<(), String> {
    let latest_grant = l.now.saturating_add(l.slack);
    let furthest = latest_grant.saturating_add(l.max_ttl);
    if obj.last_granted_at_us > latest_grant.as_micros() {
        return Err(field(
            "last_granted_at_us",
            obj.last_granted_at_us,
            format!(
                "later than any grant can have been made (now {} + slack {:?})",
                l.now, l.slack
            ),
        ));
    }
    let prev = &obj.previous;
    if prev.granted_at_us > obj.last_granted_at_us {
        return Err(field(
            "previous.granted_at_us",
            prev.granted_at_us,
            format!("after the last grant of the name ({})", obj.last_granted_at_us),
        ));
    }
    if prev.watermark_us > furthest.as_micros() {
        return Err(field(
            "previous.watermark_us",
            prev.watermark_us,
            format!(
                "further ahead than any lease deadline can be (now {} + max TTL {:?} + slack {:?})",
                l.now, l.max_ttl, l.slack
            ),
        ));
    }
    if let Some(h) = &obj.holder {
        if h.deadline_us > furthest.as_micros() {
            return Err(field(
                "holder.deadline_us",
                h.deadline_us,
                format!(
                    "further ahead than a lease may run (now {} + max TTL {:?} + slack {:?})",
                    l.now, l.max_ttl, l.slack
                ),
            ));
        }
        if h.granted_at_us > obj.last_granted_at_us {
            return Err(field(
                "holder.granted_at_us",
                h.granted_at_us,
                format!("after the last grant of the name ({})", obj.last_granted_at_us),
            ));
        }
        if prev.watermark_us >= h.deadline_us {
            return Err(field(
                "previous.watermark_us",
                prev.watermark_us,
                format!(
                    "not below the holder's deadline {}: the holder could write nothing",
                    h.deadline_us
                ),
            ));
        }
        if let Some(b) = h.clock_bound_us
            && b > bagel_proto::duration_micros(MAX_CLOCK_BOUND)
        {
            return Err(format!(
                "holder.clock_bound_us = {b}: over the largest plausible clock error bound {MAX_CLOCK_BOUND:?}"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::{FORMAT_VERSION, HolderRecord, ModeRecord, PreviousRecord};

    const SEC: u64 = 1_000_000;
    const NOW: u64 = 1_800_000_000 * SEC;

    fn limits() -> Limits {
        Limits {
            now: Micros::from_micros(NOW),
            max_ttl: Duration::from_secs(60),
            slack: Duration::from_secs(2),
        }
    }

    fn honest() -> LeaseObject {
        LeaseObject {
            version: FORMAT_VERSION,
            name: "n".into(),
            fencing_token: NOW,
            last_granted_at_us: NOW + SEC,
            holder: Some(HolderRecord {
                lease_id: "l".into(),
                token_sha256: String::new(),
                owner: String::new(),
                mode: ModeRecord::Full,
                deadline_us: NOW + 61 * SEC,
                granted_at_us: NOW + SEC,
                names: vec!["n".into()],
                key_id: "k".into(),
                clock_bound_us: Some(5 * SEC),
                holder_key: String::new(),
            }),
            previous: PreviousRecord {
                watermark_us: NOW - SEC,
                granted_at_us: NOW - 5 * SEC,
                ..PreviousRecord::none()
            },
            history: Vec::new(),
            history_truncated: false,
        }
    }

    fn refused(change: impl FnOnce(&mut LeaseObject)) -> String {
        let mut obj = honest();
        change(&mut obj);
        check(&obj, &limits()).unwrap_err()
    }

    #[test]
    fn an_honest_object_at_the_edges_passes_and_each_hostile_value_is_named() {
        check(&honest(), &limits()).unwrap();
        let mut edge = honest();
        edge.last_granted_at_us = NOW + 2 * SEC;
        edge.holder.as_mut().unwrap().deadline_us = NOW + 62 * SEC;
        check(&edge, &limits()).unwrap();

        let e = refused(|o| o.last_granted_at_us = u64::MAX);
        assert!(e.starts_with("last_granted_at_us = 18446744073709551615"), "{e}");
        let e = refused(|o| o.holder.as_mut().unwrap().deadline_us = NOW + 62 * SEC + 1);
        assert!(e.starts_with("holder.deadline_us"), "{e}");
        let e = refused(|o| o.previous.watermark_us = u64::MAX - 1);
        assert!(e.starts_with("previous.watermark_us"), "{e}");
        assert!(e.contains("max TTL 60s"), "{e}");
        // Within the max TTL, but not below the holder's deadline.
        let e = refused(|o| o.previous.watermark_us = NOW + 61 * SEC);
        assert!(e.contains("not below the holder's deadline"), "{e}");
        let e = refused(|o| o.holder.as_mut().unwrap().granted_at_us = NOW + 2 * SEC);
        assert!(e.starts_with("holder.granted_at_us"), "{e}");
        let e = refused(|o| o.previous.granted_at_us = NOW + 2 * SEC);
        assert!(e.starts_with("previous.granted_at_us"), "{e}");
        let e = refused(|o| o.holder.as_mut().unwrap().clock_bound_us = Some(u64::MAX));
        assert!(e.starts_with("holder.clock_bound_us"), "{e}");
    }
}
