//! What a closed bag holds: the lock listing (items and sizes) and its
//! text form in lock files and objects, and the receipt a write gets.
/// Where one appended record ended up: enough to find it in a lock listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    /// File name (POSIX) or object name (S3) within the bag.
    pub item: String,
    /// End offset of the record in the file (POSIX) or object size (S3).
    pub end: u64,
    /// The object's ETag, when the store gives one.
    pub etag: Option<String>,
}

/// One item (data file or batch object) of a bag and its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedItem {
    /// File name (POSIX) or object name (S3) within the bag.
    pub name: String,
    /// Bytes of it that are in the bag; a file may have grown past this
    /// after the close, and the rest is not in the bag.
    pub size: u64,
    /// The object's ETag at the close, when the store gives one: a read
    /// that finds another gets [`crate::Error::ItemChanged`].
    pub etag: Option<String>,
}

/// The content of a bag's lock: every item and size that is in the bag.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// The bag's items; empty for a bag closed with nothing in it.
    pub items: Vec<ListedItem>,
}

impl Listing {
    /// Whether the record behind `receipt` is inside the bag.
    pub fn covers(&self, receipt: &Receipt) -> bool {
        self.items.iter().any(|i| {
            i.name == receipt.item
                && i.size >= receipt.end
                && match (&i.etag, &receipt.etag) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                }
        })
    }

    /// The text form stored in lock files/objects: a header, one
    /// `name size etag|-` line per item, and a CRC-32C of the lines before.
    pub fn encode(&self) -> Vec<u8> {
        let mut s = String::from("bagel-lock v1\n");
        for i in &self.items {
            s.push_str(&format!(
                "{} {} {}\n",
                i.name,
                i.size,
                i.etag.as_deref().unwrap_or("-")
            ));
        }
        let crc = crc32c::crc32c(s.as_bytes());
        s.push_str(&format!("crc32c {crc:08x}\n"));
        s.into_bytes()
    }

    /// Parse [`Listing::encode`]'s text form; the error says why a torn,
    /// foreign or altered lock does not parse.
    pub fn decode(bytes: &[u8]) -> Result<Listing, String> {
        let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
        let body_end = text
            .rfind("crc32c ")
            .ok_or_else(|| "no crc32c line (torn or foreign file)".to_owned())?;
        let (body, tail) = text.split_at(body_end);
        let want = u32::from_str_radix(tail.trim_start_matches("crc32c ").trim(), 16)
            .map_err(|e| format!("bad crc32c line: {e}"))?;
        if crc32c::crc32c(body.as_bytes()) != want {
            return Err("crc32c mismatch".into());
        }
        let mut lines = body.lines();
        if lines.next() != Some("bagel-lock v1") {
            return Err("missing header `bagel-lock v1`".into());
        }
        let mut items = Vec::new();
        for line in lines {
            let mut f = line.split(' ');
            let (Some(name), Some(size), Some(etag), None) = (f.next(), f.next(), f.next(), f.next()) else {
                return Err(format!("bad line {line:?}"));
            };
            let size = size.parse().map_err(|e| format!("bad size in {line:?}: {e}"))?;
            items.push(ListedItem {
                name: name.to_owned(),
                size,
                etag: (etag != "-").then(|| etag.to_owned()),
            });
        }
        Ok(Listing { items })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_round_trips_and_detects_damage() {
        let l = Listing {
            items: vec![
                ListedItem {
                    name: "w1.0.log".into(),
                    size: 42,
                    etag: None,
                },
                ListedItem {
                    name: "w2.00000000000000000007".into(),
                    size: 7,
                    etag: Some("\"abc\"".into()),
                },
            ],
        };
        let bytes = l.encode();
        assert_eq!(Listing::decode(&bytes).unwrap(), l);
        let mut bad = bytes.clone();
        bad[20] ^= 1;
        assert!(Listing::decode(&bad).is_err());
        assert!(Listing::decode(&bytes[..bytes.len() - 3]).is_err());
        assert_eq!(
            Listing::decode(&Listing::default().encode()).unwrap(),
            Listing::default()
        );
    }

    #[test]
    fn covers_needs_name_size_and_etag() {
        let l = Listing {
            items: vec![ListedItem {
                name: "a".into(),
                size: 10,
                etag: Some("e".into()),
            }],
        };
        let r = |item: &str, end, etag: Option<&str>| Receipt {
            item: item.into(),
            end,
            etag: etag.map(str::to_owned),
        };
        assert!(l.covers(&r("a", 10, None)));
        assert!(l.covers(&r("a", 10, Some("e"))));
        assert!(!l.covers(&r("a", 11, None)));
        assert!(!l.covers(&r("b", 1, None)));
        assert!(!l.covers(&r("a", 5, Some("f"))));
    }
}
