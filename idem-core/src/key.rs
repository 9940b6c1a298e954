//! Idempotency keys and argument fingerprints (specified in `docs/key-spec.md`).
//!
//! key = SHA-256 over a framed, versioned byte string: every field is preceded by its length as a
//! big-endian u64, so `("a:b", "c")` and `("a", "b:c")` never meet. Shown as 64 lowercase hex
//! digits.

use std::fmt;

use sha2::{Digest, Sha256};

pub use crate::canonical::{KeyError, canonicalize, to_canonical_string};

/// Domain tag of keys derived from the canonical arguments.
pub const KEY_TAG: &[u8] = b"idem-key/v1";
/// Domain tag of keys derived from a caller-supplied idempotency key.
pub const CALLER_KEY_TAG: &[u8] = b"idem-caller-key/v1";
/// Domain tag of argument fingerprints.
pub const FINGERPRINT_TAG: &[u8] = b"idem-fingerprint/v1";

/// 64 lowercase hex digits of a SHA-256 digest.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Hex64([u8; 64]);

impl std::hash::Hash for Hex64 {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // A digest is uniformly distributed: its first 16 hex digits (64 bits) identify it well
        // enough for a hash table, at a quarter of the hashing cost. Equal values hash equally.
        state.write(&self.0[..16]);
    }
}

impl Hex64 {
    fn from_digest(digest: &[u8; 32]) -> Self {
        // Four bytes at a time, as eight digits in the bytes of a u64 (the first digit in the low
        // byte), without a table: the inverse of `digest` below.
        const LOW: u64 = 0x000f_000f_000f_000f;
        const ONES: u64 = 0x0101_0101_0101_0101;
        let mut out = [0u8; 64];
        for (eight, four) in out.chunks_exact_mut(8).zip(digest.chunks_exact(4)) {
            let mut word = [0u8; 4];
            word.copy_from_slice(four);
            // Byte i of the four in the low byte of the u64's 16-bit lane i.
            let x = u64::from(u32::from_le_bytes(word));
            let x = (x | (x << 16)) & 0x0000_ffff_0000_ffff;
            let x = (x | (x << 8)) & 0x00ff_00ff_00ff_00ff;
            // Its high nibble becomes digit 2i, its low nibble digit 2i+1: one value per byte.
            let values = ((x >> 4) & LOW) | ((x & LOW) << 8);
            // '0' + value, and 'a' - '0' - 10 = 39 more for a value of 10 or more (no carries:
            // every byte stays below 103).
            let letters = ((values + 6 * ONES) >> 4) & ONES;
            let digits = values + 0x30 * ONES + 39 * letters;
            eight.copy_from_slice(&digits.to_le_bytes());
        }
        Hex64(out)
    }
    fn parse(s: &str) -> Option<Self> {
        let bytes = s.as_bytes();
        if bytes.len() != 64 || !bytes.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        let mut out = [0u8; 64];
        out.copy_from_slice(bytes);
        Some(Hex64(out))
    }
    fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever stored.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
    /// The 32 bytes the digits spell.
    fn digest(&self) -> [u8; 32] {
        // Only lowercase hex digits are ever stored: '0'..='9' is 0x30..=0x39, 'a'..='f' is
        // 0x61..=0x66, so a digit's value is its low nibble, plus 9 for a letter (bit 6 set).
        // Eight digits at a time, as the bytes of a u64 (the first digit in the low byte).
        const LOW: u64 = 0x0f0f_0f0f_0f0f_0f0f;
        const ONES: u64 = 0x0101_0101_0101_0101;
        let mut out = [0u8; 32];
        for (four, eight) in out.chunks_exact_mut(4).zip(self.0.chunks_exact(8)) {
            let mut word = [0u8; 8];
            word.copy_from_slice(eight);
            let digits = u64::from_le_bytes(word);
            let values = (digits & LOW) + 9 * ((digits >> 6) & ONES);
            // Byte 2i becomes (value 2i << 4) | value 2i+1; the odd bytes are dropped.
            let pairs = ((values << 4) | (values >> 8)) & 0x00ff_00ff_00ff_00ff;
            let pairs = (pairs | (pairs >> 8)) & 0x0000_ffff_0000_ffff;
            let pairs = (pairs | (pairs >> 16)) & 0xffff_ffff;
            four.copy_from_slice(&pairs.to_le_bytes()[..4]);
        }
        out
    }
}

/// An idempotency key: the identity of one intent (scope, tool, arguments). It is forwarded to
/// providers as their `Idempotency-Key` (IETF draft-ietf-httpapi-idempotency-key-header).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Hex64);

impl Key {
    /// The key as 64 lowercase hex digits.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
    /// Parses 64 lowercase hex digits (as stored); `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        Hex64::parse(s).map(Key)
    }
    /// The SHA-256 digest the key's digits spell (half their size, for the in-memory store).
    pub(crate) fn digest(&self) -> [u8; 32] {
        self.0.digest()
    }
    /// The key whose digits spell `digest`.
    pub(crate) fn from_digest(digest: &[u8; 32]) -> Self {
        Key(Hex64::from_digest(digest))
    }
}

/// What identifies the arguments of a record: stored with every record so that a caller-supplied
/// key reused with other arguments is refused ([`crate::Error::KeyReuseMismatch`]).
///
/// For a caller-supplied key it is [`fingerprint`] of the canonical arguments. For a key derived
/// from the arguments it is the key itself ([`Fingerprint::of_derived_key`]): that key already
/// commits to the arguments, so a second hash would prove nothing.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(Hex64);

impl Fingerprint {
    /// The fingerprint as 64 lowercase hex digits.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
    /// Parses 64 lowercase hex digits (as stored); `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        Hex64::parse(s).map(Fingerprint)
    }
    /// The fingerprint stored with a key from [`derive_key`]: the key's own digits. Derived and
    /// caller-supplied keys are hashed under different domain tags, so they never share a record.
    pub fn of_derived_key(key: &Key) -> Self {
        Fingerprint(key.0)
    }
}

macro_rules! hex_fmt {
    ($t:ty) => {
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($t), self.as_str())
            }
        }
    };
}
hex_fmt!(Key);
hex_fmt!(Fingerprint);

/// Who an intent belongs to: the same arguments in another run or tenant are another intent.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Scope {
    tenant: String,
    run: String,
}

impl Scope {
    /// A scope for one agent run (a conversation, a job, an MCP session).
    pub fn run(run: impl Into<String>) -> Self {
        Scope { tenant: String::new(), run: run.into() }
    }
    /// Sets the tenant (empty by default).
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = tenant.into();
        self
    }
    /// The tenant; empty when none was set.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }
    /// The run id.
    pub fn run_id(&self) -> &str {
        &self.run
    }
}

fn frame(h: &mut Sha256, field: &[u8]) {
    h.update((field.len() as u64).to_be_bytes());
    h.update(field);
}

fn framed(tag: &[u8], fields: &[&[u8]]) -> Hex64 {
    Hex64::from_digest(&framed_digest(tag, fields))
}

fn framed_digest(tag: &[u8], fields: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    frame(&mut h, tag);
    for field in fields {
        frame(&mut h, field);
    }
    h.finalize().into()
}

/// [`derive_key`] or [`caller_key`] (`caller_key`: the caller's own key, else the canonical
/// arguments name the intent), with the digest its digits spell: the in-memory store's records
/// are keyed by the digest, which need not be decoded from the digits then.
pub(crate) fn key_and_digest(
    scope: &Scope,
    tool: &str,
    canonical_args: &[u8],
    caller_key: Option<&str>,
) -> (Key, [u8; 32]) {
    let (tag, last) = match caller_key {
        Some(k) => (CALLER_KEY_TAG, k.as_bytes()),
        None => (KEY_TAG, canonical_args),
    };
    let digest =
        framed_digest(tag, &[scope.tenant.as_bytes(), scope.run.as_bytes(), tool.as_bytes(), last]);
    (Key(Hex64::from_digest(&digest)), digest)
}

/// The key of an intent: `SHA-256(frame("idem-key/v1") ‖ frame(tenant) ‖ frame(run) ‖
/// frame(tool) ‖ frame(canonical_args))`, where `frame(x) = u64_be(len(x)) ‖ x`.
/// `canonical_args` is the canonical text (JCS (RFC 8785) with exact integers) from
/// [`canonicalize`]; `tool` is the stable name.
pub fn derive_key(scope: &Scope, tool: &str, canonical_args: &[u8]) -> Key {
    Key(framed(
        KEY_TAG,
        &[scope.tenant.as_bytes(), scope.run.as_bytes(), tool.as_bytes(), canonical_args],
    ))
}

/// The key of an intent named by the caller's own idempotency key (seed 002, IETF draft):
/// `SHA-256(frame("idem-caller-key/v1") ‖ frame(tenant) ‖ frame(run) ‖ frame(tool) ‖
/// frame(caller_key))`. Pair it with [`fingerprint`] so reuse with other arguments is refused.
pub fn caller_key(scope: &Scope, tool: &str, caller_key: &str) -> Key {
    Key(framed(
        CALLER_KEY_TAG,
        &[scope.tenant.as_bytes(), scope.run.as_bytes(), tool.as_bytes(), caller_key.as_bytes()],
    ))
}

/// The fingerprint of canonical arguments: `SHA-256(frame("idem-fingerprint/v1") ‖
/// frame(canonical_args))`.
pub fn fingerprint(canonical_args: &[u8]) -> Fingerprint {
    Fingerprint(framed(FINGERPRINT_TAG, &[canonical_args]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_digest_spells_its_digits() {
        for n in 0..64u64 {
            let key = derive_key(&Scope::run("r"), "t", &n.to_be_bytes());
            let digest = key.digest();
            assert_eq!(hex::encode(digest), key.as_str());
            assert_eq!(Key::from_digest(&digest), key);
        }
        let every_digit = "0123456789abcdef".repeat(4);
        // The executor's key and digest at once are the public functions' key and its digest.
        let scope = Scope::run("r").with_tenant("t");
        for args in [&b"{}"[..], b"{\"a\":1}"] {
            let (key, digest) = key_and_digest(&scope, "tool", args, None);
            assert_eq!(key, derive_key(&scope, "tool", args));
            assert_eq!(digest, key.digest());
            let (key, digest) = key_and_digest(&scope, "tool", args, Some("k-1"));
            assert_eq!(key, caller_key(&scope, "tool", "k-1"));
            assert_eq!(digest, key.digest());
        }
        let key = Key::parse(&every_digit).expect("hex");
        assert_eq!(hex::encode(key.digest()), every_digit);
        for b in 0..=255u8 {
            let digest: [u8; 32] =
                std::array::from_fn(|i| b.wrapping_add((i as u8).wrapping_mul(37)));
            assert_eq!(Key::from_digest(&digest).as_str(), hex::encode(digest));
        }
    }
}
