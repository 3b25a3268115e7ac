//! Names as the operator's commands print them: `describe --json` (an
//! array of [`NameStateJson`]), `history --json` ([`HistoryJson`]), `list
//! --json` and `watch --json` (one [`ListedNameJson`] or
//! [`WatchEventJson`] per line; `watch --progress` adds
//! [`WatchProgressJson`] lines). Keys in alphabetical order; an absent
//! value is `null` (`revision` and `server` of a listed name excepted).

use bagel_client::{
    History, HistoryEntry, HistoryEvent, Holder, ListedName, Metadata, NameState, Previous, WatchEvent,
    WatchEventKind,
};
use bagel_proto::Micros;
use serde::{Deserialize, Serialize};

use super::lease::{EndedJson, ModeJson};

/// Who holds a name now, as `describe --json` prints it under `holder`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderJson {
    pub deadline_us: u64,
    pub fencing_token: u64,
    pub granted_at_us: u64,
    pub lease_id: String,
    pub mode: ModeJson,
    /// Who holds it (free text, or the client certificate's subject).
    pub owner: String,
}

impl From<&Holder> for HolderJson {
    fn from(h: &Holder) -> Self {
        HolderJson {
            deadline_us: h.deadline.as_micros(),
            fencing_token: h.fencing_token,
            granted_at_us: h.granted_at.as_micros(),
            lease_id: h.lease_id.clone(),
            mode: h.mode.into(),
            owner: h.owner.clone(),
        }
    }
}

/// What the next holder of a name would inherit, as `describe --json`
/// prints it under `previous`: the keys of the lease file's
/// [`super::PreviousJson`], in alphabetical order, `unsettled_until_us`
/// `null` when nothing is unsettled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InheritedJson {
    pub ended: EndedJson,
    pub ended_at_us: u64,
    /// The previous lease's id (empty when not known).
    pub lease_id: String,
    pub unsettled_until_us: Option<u64>,
    pub watermark_us: u64,
}

impl From<&Previous> for InheritedJson {
    fn from(p: &Previous) -> Self {
        InheritedJson {
            ended: p.ended.into(),
            ended_at_us: p.ended_at.as_micros(),
            lease_id: p.lease_id.clone().unwrap_or_default(),
            unsettled_until_us: p.unsettled_until.map(Micros::as_micros),
            watermark_us: p.watermark.as_micros(),
        }
    }
}

/// One name as `describe --json` prints it (the output is an array of
/// these, in the order the names were asked).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameStateJson {
    /// The last fencing token issued (0 when there is no record).
    pub fencing_token: u64,
    /// `null` when the name is free.
    pub holder: Option<HolderJson>,
    /// False when the server (or store) has no record of the name.
    pub known: bool,
    pub name: String,
    pub previous: InheritedJson,
}

impl From<&NameState> for NameStateJson {
    fn from(s: &NameState) -> Self {
        NameStateJson {
            fencing_token: s.fencing_token,
            holder: s.holder.as_ref().map(HolderJson::from),
            known: s.known,
            name: s.name.clone(),
            previous: InheritedJson::from(&s.previous),
        }
    }
}

/// A held name, one line of `list --json`: the keys of [`HolderJson`]
/// beside the name, and over several servers the server's URL.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedNameJson {
    pub deadline_us: u64,
    pub fencing_token: u64,
    pub granted_at_us: u64,
    pub lease_id: String,
    pub mode: ModeJson,
    pub name: String,
    pub owner: String,
    /// The watch revision the listing reflects (its server's first page's):
    /// `watch --from-revision` it to follow on without missing an event.
    /// Absent from a server before revisions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// The server that listed it (`--servers` only; absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

impl ListedNameJson {
    /// `n` as listed by `server` (none for a single server).
    pub fn new(n: &ListedName, server: Option<&str>) -> Self {
        let h = HolderJson::from(&n.holder);
        ListedNameJson {
            deadline_us: h.deadline_us,
            fencing_token: h.fencing_token,
            granted_at_us: h.granted_at_us,
            lease_id: h.lease_id,
            mode: h.mode,
            name: n.name.clone(),
            owner: h.owner,
            revision: None,
            server: server.map(str::to_owned),
        }
    }

    /// With the revision its listing reflects (0: none known).
    pub fn at_revision(self, revision: u64) -> Self {
        ListedNameJson {
            revision: (revision != 0).then_some(revision),
            ..self
        }
    }
}

/// What `history --json` prints: a name's recent renewals and releases.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryJson {
    /// Oldest first.
    pub entries: Vec<HistoryEntryJson>,
    /// Older entries were dropped (the server's history budget).
    pub truncated: bool,
}

impl From<&History> for HistoryJson {
    fn from(h: &History) -> Self {
        HistoryJson {
            entries: h.entries.iter().map(HistoryEntryJson::from).collect(),
            truncated: h.truncated,
        }
    }
}

/// One renewal or release of a name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntryJson {
    pub at_us: u64,
    pub event: HistoryEventJson,
    pub lease_id: String,
    /// What the holder said of where it stored its updates (`*`: could be
    /// anywhere; bytes that are not UTF-8 replaced); `null` when nothing.
    pub metadata: Option<String>,
    pub owner: String,
    pub watermark_us: u64,
}

impl From<&HistoryEntry> for HistoryEntryJson {
    fn from(e: &HistoryEntry) -> Self {
        HistoryEntryJson {
            at_us: e.at.as_micros(),
            event: e.event.into(),
            lease_id: e.lease_id.clone(),
            metadata: e.metadata.as_ref().map(metadata_text),
            owner: e.owner.clone(),
            watermark_us: e.watermark.as_micros(),
        }
    }
}

/// Metadata as text: `*` for the wildcard, the bytes as UTF-8 (invalid
/// sequences replaced) otherwise.
pub fn metadata_text(m: &Metadata) -> String {
    match m {
        Metadata::Wildcard => "*".into(),
        Metadata::Data(d) => String::from_utf8_lossy(d).into_owned(),
    }
}

/// `renewed` or `released`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HistoryEventJson {
    Renewed,
    Released,
}

impl HistoryEventJson {
    /// The JSON word.
    pub fn as_str(self) -> &'static str {
        match self {
            HistoryEventJson::Renewed => "renewed",
            HistoryEventJson::Released => "released",
        }
    }
}

impl From<HistoryEvent> for HistoryEventJson {
    fn from(e: HistoryEvent) -> Self {
        match e {
            HistoryEvent::Renewed => HistoryEventJson::Renewed,
            HistoryEvent::Released => HistoryEventJson::Released,
        }
    }
}

/// One event of `watch --json` (one per line).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEventJson {
    /// When it happened, on the server's clock.
    pub at_us: u64,
    /// The lease's deadline after the event.
    pub deadline_us: u64,
    pub kind: WatchEventKindJson,
    pub lease_id: String,
    pub mode: ModeJson,
    pub name: String,
    pub owner: String,
    /// Resume after it with `--from-revision`.
    pub revision: u64,
}

impl From<&WatchEvent> for WatchEventJson {
    fn from(e: &WatchEvent) -> Self {
        WatchEventJson {
            at_us: e.at.as_micros(),
            deadline_us: e.deadline.as_micros(),
            kind: e.kind.into(),
            lease_id: e.lease_id.clone(),
            mode: e.mode.into(),
            name: e.name.clone(),
            owner: e.owner.clone(),
            revision: e.revision,
        }
    }
}

/// A progress line of `watch --progress --json`: every event watched up to
/// `revision` has been printed; resume with `--from-revision` it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchProgressJson {
    /// Always `"progress"` (an event line's `kind` is never that).
    pub kind: String,
    pub revision: u64,
}

impl WatchProgressJson {
    pub fn new(revision: u64) -> Self {
        WatchProgressJson {
            kind: "progress".to_owned(),
            revision,
        }
    }
}

/// What happened to a name: the words of [`WatchEventKind::as_str`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WatchEventKindJson {
    Granted,
    Renewed,
    Upgraded,
    Released,
    Broken,
    Expired,
}

impl From<WatchEventKind> for WatchEventKindJson {
    fn from(k: WatchEventKind) -> Self {
        match k {
            WatchEventKind::Granted => WatchEventKindJson::Granted,
            WatchEventKind::Renewed => WatchEventKindJson::Renewed,
            WatchEventKind::Upgraded => WatchEventKindJson::Upgraded,
            WatchEventKind::Released => WatchEventKindJson::Released,
            WatchEventKind::Broken => WatchEventKindJson::Broken,
            WatchEventKind::Expired => WatchEventKindJson::Expired,
        }
    }
}

#[cfg(test)]
mod tests {
    use bagel_client::{Ended, Mode};

    use super::*;

    fn us(t: u64) -> Micros {
        Micros::from_micros(t)
    }

    fn holder() -> Holder {
        Holder {
            lease_id: "ab".into(),
            owner: "me".into(),
            mode: Mode::Full,
            deadline: us(30),
            fencing_token: 7,
            granted_at: us(10),
        }
    }

    // The exact lines these printed before they were typed (keys sorted,
    // absent values null): scripts parse them.
    #[test]
    fn names_print_as_before() {
        let previous = Previous {
            lease_id: Some("aa".into()),
            watermark: us(4),
            ended: Ended::Released,
            ended_at: us(5),
            unsettled_until: None,
            granted_at: None,
        };
        let held = NameState {
            name: "n".into(),
            holder: Some(holder()),
            previous: previous.clone(),
            fencing_token: 7,
            known: true,
        };
        assert_eq!(
            serde_json::to_string(&NameStateJson::from(&held)).unwrap(),
            r#"{"fencing_token":7,"holder":{"deadline_us":30,"fencing_token":7,"granted_at_us":10,"lease_id":"ab","mode":"full","owner":"me"},"known":true,"name":"n","previous":{"ended":"released","ended_at_us":5,"lease_id":"aa","unsettled_until_us":null,"watermark_us":4}}"#
        );
        let free = NameState {
            name: "f".into(),
            holder: None,
            previous: Previous {
                lease_id: None,
                ended: Ended::None,
                unsettled_until: Some(us(9)),
                ..previous
            },
            fencing_token: 0,
            known: false,
        };
        assert_eq!(
            serde_json::to_string(&NameStateJson::from(&free)).unwrap(),
            r#"{"fencing_token":0,"holder":null,"known":false,"name":"f","previous":{"ended":"none","ended_at_us":5,"lease_id":"","unsettled_until_us":9,"watermark_us":4}}"#
        );

        let listed = ListedName {
            name: "n".into(),
            holder: holder(),
        };
        assert_eq!(
            serde_json::to_string(&ListedNameJson::new(&listed, None)).unwrap(),
            r#"{"deadline_us":30,"fencing_token":7,"granted_at_us":10,"lease_id":"ab","mode":"full","name":"n","owner":"me"}"#
        );
        assert_eq!(
            serde_json::to_string(&ListedNameJson::new(&listed, Some("http://s"))).unwrap(),
            r#"{"deadline_us":30,"fencing_token":7,"granted_at_us":10,"lease_id":"ab","mode":"full","name":"n","owner":"me","server":"http://s"}"#
        );
        assert_eq!(
            serde_json::to_string(&ListedNameJson::new(&listed, None).at_revision(42)).unwrap(),
            r#"{"deadline_us":30,"fencing_token":7,"granted_at_us":10,"lease_id":"ab","mode":"full","name":"n","owner":"me","revision":42}"#
        );
        assert_eq!(
            serde_json::to_string(&WatchProgressJson::new(42)).unwrap(),
            r#"{"kind":"progress","revision":42}"#
        );

        let history = History {
            entries: vec![
                HistoryEntry {
                    lease_id: "ab".into(),
                    owner: "me".into(),
                    event: HistoryEvent::Renewed,
                    at: us(3),
                    watermark: us(0),
                    metadata: Some(Metadata::Data(b"where".to_vec())),
                },
                HistoryEntry {
                    lease_id: "ab".into(),
                    owner: "me".into(),
                    event: HistoryEvent::Released,
                    at: us(4),
                    watermark: us(2),
                    metadata: None,
                },
            ],
            truncated: true,
        };
        assert_eq!(
            serde_json::to_string(&HistoryJson::from(&history)).unwrap(),
            r#"{"entries":[{"at_us":3,"event":"renewed","lease_id":"ab","metadata":"where","owner":"me","watermark_us":0},{"at_us":4,"event":"released","lease_id":"ab","metadata":null,"owner":"me","watermark_us":2}],"truncated":true}"#
        );
        assert_eq!(metadata_text(&Metadata::Wildcard), "*");

        let event = WatchEvent {
            revision: 12,
            kind: WatchEventKind::Expired,
            name: "n".into(),
            lease_id: "ab".into(),
            owner: "me".into(),
            mode: Mode::Tentative,
            deadline: us(30),
            at: us(31),
        };
        assert_eq!(
            serde_json::to_string(&WatchEventJson::from(&event)).unwrap(),
            r#"{"at_us":31,"deadline_us":30,"kind":"expired","lease_id":"ab","mode":"tentative","name":"n","owner":"me","revision":12}"#
        );
    }

    #[test]
    fn event_words_are_the_clients() {
        for kind in [
            WatchEventKind::Granted,
            WatchEventKind::Renewed,
            WatchEventKind::Upgraded,
            WatchEventKind::Released,
            WatchEventKind::Broken,
            WatchEventKind::Expired,
        ] {
            let json = serde_json::to_string(&WatchEventKindJson::from(kind)).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
        }
    }
}
