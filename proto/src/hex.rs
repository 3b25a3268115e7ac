//! Hex, the one way keys, ids and tokens are printed and read back.

/// Lowercase hex of `bytes`.
pub fn encode(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Exactly `N` bytes from `2N` hex digits (either case), or why not.
pub fn decode_array<const N: usize>(text: &str) -> Result<[u8; N], String> {
    let text = text.trim();
    if text.len() != 2 * N || !text.is_ascii() {
        return Err(format!(
            "expected {} hex digits, got {} characters",
            2 * N,
            text.chars().count()
        ));
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("{:?} is not hex", &text[2 * i..2 * i + 2]))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_the_wrong_length_or_digits() {
        let key = [0xab_u8; 32];
        assert_eq!(decode_array::<32>(&encode(&key)), Ok(key));
        assert_eq!(decode_array::<2>("ABcd"), Ok([0xab, 0xcd]));
        assert!(decode_array::<32>("ab").is_err());
        assert!(decode_array::<2>("zzzz").is_err());
        assert!(decode_array::<2>("éé").is_err());
    }
}
