//! The JSON forms the CLI prints and reads back, one struct per shape. The
//! key names are a contract with scripts: add keys freely, never rename
//! one.
//!
//! * [`lease`]: a lease as `bagel acquire --json` prints it (the lease
//!   file `--lease FILE` reads back: renew, upgrade, release, `bagel
//!   write`, `bagel run`, `verify-witness`), and `release --json`'s answer.
//! * [`names`]: names as `describe`, `history`, `list` and `watch` print
//!   them.
//! * [`servers`]: `server-info` and `route`.
//! * [`time`]: `time-check --json`.
//! * [`bags`]: `read`, `retain`, `summarize`, `write`, `metronome --once`
//!   and `verify-witness` with `--json`.
//! * [`lease_id`]: lease ids as the command line takes them.
//!
//! Key order: the lease file prints its keys in the order of its fields,
//! and leaves an absent value out. Every other shape prints its keys in
//! alphabetical order, with an absent value as `null` (unless its field
//! says otherwise), as the JSON maps it was first built from did: its
//! struct declares its fields in that order, and a new key goes in its
//! alphabetical place.

pub mod bags;
pub mod lease;
pub mod lease_id;
pub mod names;
pub mod servers;
pub mod time;

pub use bags::{
    AttestationJson, MetronomeRoundJson, ProblemJson, ReadItemKind, ReadMessageJson, ReadSummaryJson,
    RetainJson, SummaryMadeJson, UncoveredPartJson, VerifiedJson, WitnessCheckJson, WriteFailedJson,
    WriteItemKind, WrittenJson,
};
pub use lease::{
    EndedJson, LeaseJson, MerkleJson, ModeJson, NameJson, PreviousJson, ReleasedJson, ServerNameJson,
    WitnessJson,
};
pub use lease_id::{LeaseId, LeaseIdPart, NotALeaseId};
pub use names::{
    HistoryEntryJson, HistoryEventJson, HistoryJson, HolderJson, InheritedJson, ListedNameJson,
    NameStateJson, WatchEventJson, WatchEventKindJson, WatchProgressJson, metadata_text,
};
pub use servers::{
    ClockJson, ClockSourceJson, KeyJson, LimitsJson, NextOwnerJson, RouteJson, ServerInfoJson,
    ServerRouteJson, ServersRouteJson, StoreInfoJson, StoreRouteJson,
};
pub use time::{LocalKind, LocalProofJson, ProofJson, RoughtimeKind, RoughtimeProofJson, TimeCheckJson};
