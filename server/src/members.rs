//! The member lists this server serves in, as the grant path reads them:
//! fixed by `--members` / `--next-members`, or read from
//! `--members-file` and read again on SIGHUP and when the file changes.
//!
//! Why a file that reloads: a change of lists (adding a member is a
//! migration: the next list first, then the switch) otherwise restarts
//! every member twice, each restart waiting out the max TTL. A reload
//! keeps the table, so it is safer than the restart it replaces: nothing
//! a member granted is forgotten, and only which new names it grants
//! changes. What the lists mean is unchanged (see
//! `bagel_proto::routing::Membership`).
//!
//! A reload that cannot be used (the file does not read or parse, or
//! names this server in none of its lists) keeps the lists in effect and
//! says why in the log; the server never goes on with no lists at all.
//!
//! # The file
//!
//! ```text
//! # The member list in force: IDs, or the clients' ID=URL#KEY list.
//! members = bagel-0,bagel-1,bagel-2
//! # While migrating, the next list (remove the line to finish).
//! next-members = bagel-0,bagel-1,bagel-2,bagel-3
//! ```

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use bagel_proto::routing::{Membership, parse_member_list};

use crate::reload::{SIGHUP, Stamp};

/// The member lists of a `--members-file`: the one in force and, while
/// migrating, the next.
pub fn parse_file(text: &str) -> Result<Vec<Vec<String>>, String> {
    let (mut members, mut next) = (None, None);
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |e: String| format!("line {}: {e}", i + 1);
        let Some((key, value)) = line.split_once('=') else {
            return Err(at("expected `members = LIST` or `next-members = LIST`".into()));
        };
        let slot = match key.trim() {
            "members" => &mut members,
            "next-members" => &mut next,
            other => {
                return Err(at(format!(
                    "unknown key {other:?}; expected `members` or `next-members`"
                )));
            }
        };
        if slot.is_some() {
            return Err(at(format!("{} given twice", key.trim())));
        }
        *slot = Some(parse_member_list(value.trim()).map_err(|e| at(e.to_string()))?);
    }
    let Some(members) = members else {
        return Err("no `members = LIST` line".into());
    };
    Ok(std::iter::once(members).chain(next).collect())
}

/// Where the lists came from, and what was read last.
#[derive(Debug)]
struct Source {
    path: PathBuf,
    seen: Mutex<Option<Stamp>>,
}

/// The member lists in effect (none: every name is granted).
#[derive(Debug)]
pub struct Members {
    me: String,
    current: RwLock<Option<Arc<Membership>>>,
    file: Option<Source>,
}

impl Members {
    /// Fixed lists (`--members`), or none.
    pub fn fixed(membership: Option<Membership>) -> Members {
        Members {
            me: membership.as_ref().map(|m| m.me().to_owned()).unwrap_or_default(),
            current: RwLock::new(membership.map(Arc::new)),
            file: None,
        }
    }

    /// The lists of `path` for server `me`: the server does not start
    /// with a file it cannot use.
    pub fn from_file(me: &str, path: &Path) -> Result<Members, String> {
        let stamp = Stamp::of(path);
        let membership = read(me, path)?;
        tracing::info!(
            path = %path.display(),
            lists = ?membership.lists(),
            "member lists in effect (--members-file; read again on SIGHUP and when it changes)"
        );
        Ok(Members {
            me: me.to_owned(),
            current: RwLock::new(Some(Arc::new(membership))),
            file: Some(Source {
                path: path.to_owned(),
                seen: Mutex::new(stamp),
            }),
        })
    }

    /// The lists in effect now.
    pub fn get(&self) -> Option<Arc<Membership>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether the lists come from a file that reloads.
    pub fn reloads(&self) -> bool {
        self.file.is_some()
    }
}

fn read(me: &str, path: &Path) -> Result<Membership, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let lists = parse_file(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Membership::new(me, lists).map_err(|e| format!("{}: {e}", path.display()))
}

impl crate::reload::Reloadable for Members {
    fn look(&self) -> crate::reload::Look {
        match &self.file {
            Some(f) => {
                crate::reload::Look::at(&f.path, *f.seen.lock().unwrap_or_else(PoisonError::into_inner))
            }
            None => crate::reload::Look::Unchanged,
        }
    }

    fn reload(&self, why: &str) {
        let Some(file) = &self.file else { return };
        let Some((read, stamp)) =
            crate::reload::read_whole(&file.path, "member lists", why, |p| read(&self.me, p))
        else {
            return;
        };
        *file.seen.lock().unwrap_or_else(PoisonError::into_inner) = stamp;
        let old = self.get();
        match read {
            Ok(new) => {
                if old.as_deref() == Some(&new) {
                    if why == SIGHUP {
                        tracing::info!(
                            path = %file.path.display(),
                            "member lists read again on SIGHUP: unchanged"
                        );
                    }
                    return;
                }
                tracing::info!(
                    path = %file.path.display(),
                    lists = ?new.lists(),
                    was = ?old.as_ref().map(|m| m.lists().to_vec()),
                    why,
                    "member lists reloaded: new grants follow them; leases held stay"
                );
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(new));
            }
            Err(e) => tracing::warn!(
                error = %e,
                why,
                "member lists not reloaded: kept the lists in effect"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_gives_the_list_in_force_and_the_next() {
        let text = "# now\nmembers = a,b\n\nnext-members = a=http://h:1,b=http://h:2,c=http://h:3\n";
        assert_eq!(
            parse_file(text).unwrap(),
            vec![
                vec!["a".to_owned(), "b".to_owned()],
                vec!["a".into(), "b".into(), "c".into()]
            ]
        );
        assert_eq!(parse_file("members = a").unwrap(), vec![vec!["a".to_owned()]]);
    }

    #[test]
    fn a_file_that_cannot_be_used_says_which_line() {
        for (text, says) in [
            ("", "no `members = LIST` line"),
            ("next-members = a", "no `members = LIST` line"),
            ("members = a\nmembers = b", "line 2: members given twice"),
            ("servers = a", "line 1: unknown key \"servers\""),
            ("members a,b", "line 1: expected `members = LIST`"),
        ] {
            let e = parse_file(text).unwrap_err();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }
}
