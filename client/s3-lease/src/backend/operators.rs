//! `describe` and `history`: what operators read of a store. Nothing
//! here writes.
//!
//! Separate because these only read and report; they share the plausibility
//! check and the rules' view of who may take a name, not the write paths.

use bagel_lease_core::{History, Holder, Micros, Mode, NameState, Result};
use bagel_proto::clock::Clock;

use super::S3LeaseBackend;
use crate::object::PreviousRecord;
use crate::rules::Decision;
use crate::validate;

impl S3LeaseBackend {
    /// What the next holder of each name would find now, for operators.
    pub async fn describe(&self, names: &[String]) -> Result<Vec<NameState>> {
        validate::names(names, &self.cfg)?;
        let reads = futures::future::try_join_all(names.iter().map(|n| self.store.get(n))).await?;
        let now = self.time.clock().now();
        let bound = self
            .time
            .bound_hint(self.cfg.clock_margin / 2)
            .unwrap_or(self.cfg.clock_margin / 2);
        for (obj, _) in reads.iter().flatten() {
            self.plausible(obj, now, bound)?;
        }
        Ok(names
            .iter()
            .zip(reads)
            .map(|(name, read)| match read {
                None => NameState {
                    name: name.clone(),
                    holder: None,
                    previous: PreviousRecord::none().to_domain(),
                    fencing_token: 0,
                    known: false,
                },
                Some((obj, _)) => {
                    let live = obj
                        .holder
                        .as_ref()
                        .filter(|h| now < self.rules.free_from(h, bound));
                    let previous = match self.rules.decide(name, Some(&obj), Mode::Full, now, bound) {
                        Decision::Take { previous } => previous,
                        Decision::Busy { .. } => obj.previous.clone(),
                    };
                    NameState {
                        name: name.clone(),
                        holder: live.map(|h| Holder {
                            lease_id: h.lease_id.clone(),
                            owner: h.owner.clone(),
                            mode: h.mode.into(),
                            deadline: Micros::from_micros(h.deadline_us),
                            fencing_token: obj.fencing_token,
                            granted_at: Micros::from_micros(h.granted_at_us),
                        }),
                        previous: previous.to_domain(),
                        fencing_token: obj.fencing_token,
                        known: true,
                    }
                }
            })
            .collect())
    }

    /// A name's recent renewals (with metadata) and releases.
    pub async fn history(&self, name: &str) -> Result<History> {
        validate::names(&[name.to_owned()], &self.cfg)?;
        Ok(match self.store.get(name).await? {
            None => History::default(),
            Some((obj, _)) => History {
                entries: obj.history.iter().map(|h| h.to_domain()).collect(),
                truncated: obj.history_truncated,
            },
        })
    }
}
