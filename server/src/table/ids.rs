//! Lease ids and holder tokens.

use std::fmt;
use std::num::NonZeroU64;

use bagel_proto::Micros;
use rand::RngCore as _;
use subtle::ConstantTimeEq as _;

/// A lease's correlation id, 128 bits, printed as 32 lowercase hex digits:
///
/// * high 64 bits: the grant time in microseconds, so ids sort by grant
///   time and an operator can read when a lease was made;
/// * then 24 random bits, so ids from different servers or restarts do not
///   collide;
/// * then the shard (16 bits) and slot (24 bits) of the lease's first name
///   in the table, so renew and release find the lease without an index.
///
/// The server checks the whole id against the holder it finds at that slot,
/// so a stale or forged id never reaches another lease.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId {
    hi: NonZeroU64,
    lo: u64,
}

const SLOT_BITS: u32 = 24;
const SHARD_BITS: u32 = 16;
/// Slots a shard can address.
pub const MAX_SLOTS: usize = 1 << SLOT_BITS;
/// Shards a table can address.
pub const MAX_SHARDS: usize = 1 << SHARD_BITS;

impl LeaseId {
    pub fn new(now: Micros, shard: usize, slot: usize) -> Self {
        debug_assert!(shard < MAX_SHARDS && slot < MAX_SLOTS);
        let random = rand::thread_rng().next_u32() as u64 & 0xff_ffff;
        let lo = (random << (SHARD_BITS + SLOT_BITS)) | ((shard as u64) << SLOT_BITS) | slot as u64;
        LeaseId {
            hi: NonZeroU64::new(now.as_micros()).unwrap_or(NonZeroU64::MIN),
            lo,
        }
    }

    pub fn granted_at(self) -> Micros {
        Micros::from_micros(self.hi.get())
    }

    pub(crate) fn shard(self) -> usize {
        ((self.lo >> SLOT_BITS) & ((1 << SHARD_BITS) - 1)) as usize
    }

    pub(crate) fn slot(self) -> usize {
        (self.lo & ((1 << SLOT_BITS) - 1)) as usize
    }

    /// The 32 lowercase hex digits of its printed form, without a
    /// `String` (witness bodies are written straight into their buffer).
    pub fn hex(self) -> [u8; 32] {
        let mut buf = [0; 32];
        hex128(&mut buf, self.as_u128());
        buf
    }

    fn as_u128(self) -> u128 {
        (u128::from(self.hi.get()) << 64) | u128::from(self.lo)
    }

    /// Parses the 32-hex-digit form.
    pub fn parse(s: &str) -> Option<Self> {
        let v = parse_hex128(s)?;
        Some(LeaseId {
            hi: NonZeroU64::new((v >> 64) as u64)?,
            lo: v as u64,
        })
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(hex128(&mut [0; 32], self.as_u128()))
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseId({self})")
    }
}

/// The secret a holder proves on renew, upgrade and release: 128 bits no
/// one else can compute ([`TokenKey::token`]). Compared in constant time.
#[derive(Clone, Copy)]
pub struct Token([u8; 16]);

/// What a lease's token is made from: a random key of the table's, never
/// shown. A token is derived, not stored: a held lease costs 16 bytes less
/// (of about 200), and the token is checked by deriving it again from the
/// lease id and the first name's fencing token: one block of SHA-256.
///
/// The derivation's input never repeats within a table: the lease id holds
/// the first name's shard and slot, and a slot's fencing tokens only rise
/// (across the records it ever holds too, through the fencing floor), so
/// two grants never share a token, even one whose id repeats (same
/// microsecond, slot and 24 random bits). A restarted server has a new key;
/// no lease survives a restart anyway.
pub struct TokenKey([u8; 24]);

impl TokenKey {
    pub fn generate() -> Self {
        let mut key = [0u8; 24];
        rand::thread_rng().fill_bytes(&mut key);
        TokenKey(key)
    }

    /// The token of the lease `lease` whose first name's fencing token is
    /// `fencing`: the first 16 bytes of SHA-256 over the key, the id and the
    /// fencing token. 48 bytes of input, so one SHA-256 block; a prefix
    /// MAC is sound here because every input has the same length, and the
    /// key serves nothing else.
    pub fn token(&self, lease: LeaseId, fencing: u64) -> Token {
        use sha2::Digest as _;
        let digest = sha2::Sha256::new()
            .chain_update(self.0)
            .chain_update(lease.hi.get().to_be_bytes())
            .chain_update(lease.lo.to_be_bytes())
            .chain_update(fencing.to_be_bytes())
            .finalize();
        let mut token = [0u8; 16];
        token.copy_from_slice(&digest[..16]);
        Token(token)
    }
}

impl fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

impl Token {
    pub fn parse(s: &str) -> Option<Self> {
        parse_hex128(s).map(|v| Token(v.to_be_bytes()))
    }

    pub fn matches(&self, other: &Token) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}

impl PartialEq for Token {
    fn eq(&self, other: &Token) -> bool {
        self.matches(other)
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(hex128(&mut [0; 32], u128::from_be_bytes(self.0)))
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A token is a secret: never log it.
        f.write_str("Token(..)")
    }
}

/// `v` as 32 lowercase hex digits, written into `buf`. Ids and tokens are
/// printed into every answer (a grant's, its previous lease's): through
/// `fmt`'s padding machinery that was ~5% of a session server's CPU.
fn hex128(buf: &mut [u8; 32], v: u128) -> &str {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in buf.iter_mut().enumerate() {
        *b = DIGITS[((v >> (124 - 4 * i)) & 0xf) as usize];
    }
    std::str::from_utf8(buf).expect("hex digits are ASCII")
}

/// Exactly 32 lowercase hex digits.
fn parse_hex128(s: &str) -> Option<u128> {
    let bytes: &[u8; 32] = s.as_bytes().try_into().ok()?;
    bytes.iter().try_fold(0u128, |v, &b| {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        Some((v << 4) | u128::from(digit))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_carry_their_grant_time() {
        let now = Micros::from_micros(1_700_000_000_000_001);
        let id = LeaseId::new(now, 300, 70_000);
        assert_eq!(LeaseId::parse(&id.to_string()), Some(id));
        assert_eq!((id.granted_at(), id.shard(), id.slot()), (now, 300, 70_000));
        let token = TokenKey::generate().token(id, 1);
        assert!(Token::parse(&token.to_string()).unwrap().matches(&token));
    }

    #[test]
    fn tokens_differ_by_key_lease_and_fencing_and_repeat_only_for_the_same_three() {
        let key = TokenKey::generate();
        let id = LeaseId::new(Micros::from_micros(1_700_000_000_000_001), 3, 7);
        let other = LeaseId::new(Micros::from_micros(1_700_000_000_000_002), 3, 7);
        let t = key.token(id, 10);
        assert!(key.token(id, 10).matches(&t));
        assert!(!key.token(id, 11).matches(&t));
        assert!(!key.token(other, 10).matches(&t));
        assert!(!TokenKey::generate().token(id, 10).matches(&t));
    }

    #[test]
    fn ids_and_tokens_print_as_32_lowercase_hex_digits() {
        for (hi, lo) in [(1u64, 0u64), (0x0123_4567_89ab_cdef, u64::MAX), (u64::MAX, 0x10)] {
            let id = LeaseId {
                hi: NonZeroU64::new(hi).unwrap(),
                lo,
            };
            assert_eq!(id.to_string(), format!("{hi:016x}{lo:016x}"));
            assert_eq!(LeaseId::parse(&id.to_string()), Some(id));
            let token = Token(((u128::from(hi) << 64) | u128::from(lo)).to_be_bytes());
            assert_eq!(token.to_string(), format!("{hi:016x}{lo:016x}"));
        }
    }

    #[test]
    fn malformed_ids_are_refused() {
        for bad in [
            "",
            "abc",
            &"g".repeat(32),
            &"A".repeat(32),
            &"0".repeat(33),
            &"0".repeat(32),
            &format!("{}G", "0".repeat(31)),
            &format!("+{}", "1".repeat(31)),
            &format!("{}é", "0".repeat(30)),
        ] {
            assert_eq!(LeaseId::parse(bad), None, "{bad:?}");
        }
    }
}
