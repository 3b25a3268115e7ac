//! The dispatch index: which watchers want which names, so that a lease
//! event is offered only to the watchers that match it, not checked
//! against every watcher's filter.

use std::collections::HashMap;
use std::sync::Arc;

use super::Filter;
use super::watcher::Shared;

/// Which watchers want which names, so an event touches only those that
/// match: by name, by prefix (looked up once per distinct prefix length),
/// and the watchers of every name.
#[derive(Debug, Default)]
pub(super) struct Index {
    names: HashMap<Arc<str>, Vec<Arc<Shared>>>,
    prefixes: HashMap<Box<str>, Vec<Arc<Shared>>>,
    /// Distinct non-empty prefix lengths watched, and by how many watchers.
    prefix_lens: std::collections::BTreeMap<usize, usize>,
    all: Vec<Arc<Shared>>,
}

impl Index {
    pub(super) fn insert(&mut self, filter: &Filter, w: &Arc<Shared>) {
        match filter {
            Filter::Names(names) => {
                for n in names {
                    self.names.entry(Arc::clone(n)).or_default().push(Arc::clone(w));
                }
            }
            Filter::Prefix(p) if p.is_empty() => self.all.push(Arc::clone(w)),
            Filter::Prefix(p) => {
                self.prefixes
                    .entry(p.as_str().into())
                    .or_default()
                    .push(Arc::clone(w));
                *self.prefix_lens.entry(p.len()).or_default() += 1;
            }
        }
    }

    pub(super) fn remove(&mut self, filter: &Filter, id: u64) {
        match filter {
            Filter::Names(names) => {
                for n in names {
                    if let Some(v) = self.names.get_mut(&**n) {
                        v.retain(|w| w.id != id);
                        if v.is_empty() {
                            self.names.remove(&**n);
                        }
                    }
                }
            }
            Filter::Prefix(p) if p.is_empty() => self.all.retain(|w| w.id != id),
            Filter::Prefix(p) => {
                if let Some(v) = self.prefixes.get_mut(p.as_str()) {
                    v.retain(|w| w.id != id);
                    if v.is_empty() {
                        self.prefixes.remove(p.as_str());
                    }
                }
                if let Some(n) = self.prefix_lens.get_mut(&p.len()) {
                    *n -= 1;
                    if *n == 0 {
                        self.prefix_lens.remove(&p.len());
                    }
                }
            }
        }
    }

    /// Calls `f` with every watcher that wants `name`, once each.
    pub(super) fn for_each_match(&self, name: &str, mut f: impl FnMut(&Arc<Shared>)) {
        self.all.iter().for_each(&mut f);
        if let Some(v) = self.names.get(name) {
            v.iter().for_each(&mut f);
        }
        for &len in self.prefix_lens.keys() {
            if len > name.len() {
                break;
            }
            if !name.is_char_boundary(len) {
                continue;
            }
            if let Some(v) = self.prefixes.get(&name[..len]) {
                v.iter().for_each(&mut f);
            }
        }
    }
}
