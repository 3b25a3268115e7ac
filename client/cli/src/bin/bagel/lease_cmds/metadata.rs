//! `--metadata` (renew, release): where the holder stored its updates, as
//! free text; `*` is "could be anywhere". `history` prints it back with
//! `bagel_cli::contract::metadata_text`.

use bagel_client::Metadata;

/// The `--metadata` text as the backend takes it.
pub fn parse(text: &str) -> Metadata {
    if text == "*" {
        Metadata::Wildcard
    } else {
        Metadata::Data(text.as_bytes().to_vec())
    }
}
