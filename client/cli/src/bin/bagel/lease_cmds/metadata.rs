//! `--metadata`: where a holder stored its updates, as free text (`*`:
//! could be anywhere), both ways.

use bagel_client::Metadata;

/// The `--metadata` text as the backend takes it.
pub fn metadata(text: &str) -> Metadata {
    if text == "*" {
        Metadata::Wildcard
    } else {
        Metadata::Data(text.as_bytes().to_vec())
    }
}

/// Metadata as text, as `history` prints it.
pub fn metadata_text(m: &Metadata) -> String {
    match m {
        Metadata::Wildcard => "*".into(),
        Metadata::Data(d) => String::from_utf8_lossy(d).into_owned(),
    }
}
