//! Lease ids and holder tokens.

use std::fmt;

use bagel_proto::Micros;
use rand::RngCore as _;
use subtle::ConstantTimeEq as _;

/// A lease's correlation id: the grant time in the high 64 bits (so ids sort
/// by grant time and an operator can read when a lease was made) and 64
/// random bits in the low half (so ids from different servers or restarts
/// do not collide). Printed as 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(u128);

impl LeaseId {
    pub fn generate(now: Micros) -> Self {
        let random = rand::thread_rng().next_u64();
        LeaseId((u128::from(now.as_micros()) << 64) | u128::from(random))
    }

    pub fn granted_at(self) -> Micros {
        Micros::from_micros((self.0 >> 64) as u64)
    }

    /// Parses the 32-hex-digit form.
    pub fn parse(s: &str) -> Option<Self> {
        parse_hex128(s).map(LeaseId)
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseId({self})")
    }
}

/// The secret a holder proves on renew, upgrade and release: 128 random
/// bits. Compared in constant time.
#[derive(Clone, Copy)]
pub struct Token([u8; 16]);

impl Token {
    pub fn generate() -> Self {
        let mut bytes = [0u8; 16];
        rand::thread_rng().fill_bytes(&mut bytes);
        Token(bytes)
    }

    pub fn parse(s: &str) -> Option<Self> {
        parse_hex128(s).map(|v| Token(v.to_be_bytes()))
    }

    pub fn matches(&self, other: &Token) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", u128::from_be_bytes(self.0))
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A token is a secret: never log it.
        f.write_str("Token(..)")
    }
}

fn parse_hex128(s: &str) -> Option<u128> {
    if s.len() != 32
        || !s
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    u128::from_str_radix(s, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_carry_their_grant_time() {
        let now = Micros::from_micros(1_700_000_000_000_001);
        let id = LeaseId::generate(now);
        assert_eq!(LeaseId::parse(&id.to_string()), Some(id));
        assert_eq!(id.granted_at(), now);
        let token = Token::generate();
        assert!(Token::parse(&token.to_string()).unwrap().matches(&token));
    }

    #[test]
    fn malformed_ids_are_refused() {
        for bad in ["", "abc", &"g".repeat(32), &"A".repeat(32), &"0".repeat(33)] {
            assert_eq!(LeaseId::parse(bad), None, "{bad:?}");
        }
    }
}
